"""Probe: is `matmul`'s fp8 cuBLAS path (the `torch` mode, and `auto` where it picks cuBLAS) as fast
as `torch._scaled_mm` called directly? Per shape, on the same inputs (rotated over enough copies
to leave L2), each way's time a call as a user makes it (CUDA events over 100 back-to-back calls,
median of 15 repeats) and its host time a call (100 calls enqueued behind a sleep kernel, median
of 7):

    auto          gluon_survey.matmul(a, w.t(), scale_a=, scale_b=, out=)   (`explain` column: what it runs)
    torch         the same with kernel="torch"
    bare          api.prepare("torch", ...).fn(): the torch mode's launch alone, as the driver times it
    direct        torch._scaled_mm(a, w.t(), sa, sb, out_dtype=bf16, use_fast_accum=True, out=out)
                  (what the torch mode calls)

    PYTHONPATH=src python scripts/fp8_path_probe.py --scaling row --output fp8-path-row.csv
"""

import argparse
import csv
import functools
import statistics
import sys
import time

import torch

import gluon_survey
from gluon_survey import api

WEIGHTS = ((4096, 4096), (4608, 3584), (14336, 4096))  # [N, K]
TOKENS = (16, 96, 128, 256, 512, 768, 2048)
COLD_BYTES = 150e6  # the sets together span this many bytes: several times a Hopper L2


def gpu_us(calls, reps=15, n=100):
    """Time a call as made back to back: events around n calls cycling through `calls`."""
    for c in calls:
        c()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(n):
            calls[i % len(calls)]()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / n)
    return statistics.median(times)


def host_us(calls, reps=7, n=100):
    """Host time a call: n calls enqueued while a sleep kernel keeps the GPU busy."""
    times = []
    for _ in range(reps):
        torch.cuda._sleep(20_000_000)
        t0 = time.perf_counter_ns()
        for i in range(n):
            calls[i % len(calls)]()
        times.append((time.perf_counter_ns() - t0) / n / 1e3)
        torch.cuda.synchronize()
    return statistics.median(times)


def inputs(M, N, K, scaling):
    a = (torch.randn(M, K, device="cuda") / 2).to(torch.float8_e4m3fn)
    w = (torch.randn(N, K, device="cuda") / 2).to(torch.float8_e4m3fn)
    shape_a, shape_b = ((M, 1), (1, N)) if scaling == "row" else ((), ())
    sa = torch.rand(shape_a, device="cuda") + 0.5
    sb = torch.rand(shape_b, device="cuda") + 0.5
    return a, w.t(), sa, sb, torch.empty(M, N, device="cuda", dtype=torch.bfloat16)


def ways(a, b, sa, sb, out):
    mm = functools.partial(gluon_survey.matmul, a, b, scale_a=sa, scale_b=sb, out=out)
    return {
        "auto": mm,
        "torch": functools.partial(mm, kernel="torch"),
        "bare": api.prepare("torch", a, b, out, scale_a=sa, scale_b=sb).fn,
        "direct": functools.partial(
            torch._scaled_mm, a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True, out=out
        ),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default="fp8-path.csv")
    p.add_argument("--scaling", default="row", choices=("row", "tensor"))
    args = p.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    for N, K in WEIGHTS:
        for M in TOKENS:
            sets = [inputs(M, N, K, args.scaling) for _ in range(int(COLD_BYTES // (N * K + M * K)) + 2)]
            a, b, sa, sb, out = sets[0]
            ref = (a.float() @ b.float()) * sa * sb
            per_set = [ways(*s) for s in sets]
            row = {"M": M, "N": N, "K": K, "scaling": args.scaling}
            for name in per_set[0]:
                out.fill_(float("nan"))
                per_set[0][name]()
                err = ((out.float() - ref).norm() / ref.norm()).item()
                if not err < 2e-2:
                    sys.exit(f"{name} wrong at {M}x{N}x{K}: rel err {err}")
                calls = [w[name] for w in per_set]
                row[f"{name}_us"] = round(gpu_us(calls), 2)
                row[f"{name}_host_us"] = round(host_us(calls), 2)
            why = api.explain(a, b, scale_a=sa, scale_b=sb)
            row["auto_runs"] = next(line for line in why.splitlines() if line.startswith("runs:")).split()[1]
            rows.append(row)
            print(", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    with open(args.output, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
