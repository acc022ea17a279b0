"""Probe: is `matmul`'s fp8 cuBLAS path (the `torch` mode, and `auto` where it picks cuBLAS) as fast
as `torch._scaled_mm` called directly? Per shape, on the same inputs (rotated over enough copies
to leave L2), the ways below are timed in turn within each repeat (their order rotating from one
repeat to the next), so that all of them sample the same stretch of a host whose speed changes:
per repeat each way's time a call as a user makes it (CUDA events around back-to-back calls, about
2 ms of them) and, for calls under 200 µs, its host time a call (calls enqueued behind a sleep
kernel). Reported: each way's median over the repeats (host time: with its p20-p80) and, against
`direct`, the median of the per-repeat ratios (way / direct: > 1 is slower than the direct call)
and their p20-p80:

    auto          gluon_survey.matmul(a, w.t(), scale_a=, scale_b=, out=)   (`explain` column: what it runs)
    torch         the same with kernel="torch"
    bare          api.prepare("torch", ...).fn(): the torch mode's launch alone, as the driver times it
    direct        torch._scaled_mm(a, w.t(), sa, sb, out_dtype=bf16, use_fast_accum=True, out=out)
                  (what the torch mode calls)
    direct-bias-none  the same passing bias=None                             (only where --ways names it)
    lambda        `lambda: torch._scaled_mm(...)` with direct's arguments spelled out: what one
                  Python frame that only forwards the call costs         (only where --ways names it)

    PYTHONPATH=src python scripts/fp8_path_probe.py --scaling row --output fp8-path-row.csv
    PYTHONPATH=src python scripts/fp8_path_probe.py --shapes llm-dense --ways torch,direct ...

The first repeat takes the ways in the order --ways names them (direct last where it is not
named). What one Python call costs on a host-bound product is this run, with a longer sleep and
200 calls a host sample; results/experiments/fp8-torch-mode-path/h200-ed66724/hostvar.log came
from scripts/wrapper_cost.py, the same code before it was folded in here as the ways `lambda` and
`direct-bias-none`:

    PYTHONPATH=src python scripts/fp8_path_probe.py --shapes 96x4096x4096 --scaling tensor \
        --ways direct,direct-bias-none,torch,lambda --reps 31 --host-calls 200 \
        --host-sleep 40000000 --output wrapper-cost.csv

Its `*_host_us` columns are what hostvar.log lists (its torch_mode is the way `torch`). Otherwise
it differs from that script: each way's GPU time is also taken within a repeat (before its host
time), the calls rotate over input copies, the scales are random rather than ones, and p20-p80
are numpy's percentiles (the script's were `statistics.quantiles(n=5)`).
"""

import argparse
import csv
import functools
import re
import statistics
import sys
import time

import numpy as np
import torch

import gluon_survey
from gluon_survey import api
from gluon_survey.driver.shapes import Shape, llm_dense_shapes, read_csv

WEIGHTS = ((4096, 4096), (4608, 3584), (14336, 4096))  # [N, K]
TOKENS = (16, 96, 128, 256, 512, 768, 2048)
COLD_BYTES = 150e6  # the sets together span this many bytes: several times a Hopper L2
WAYS = ("auto", "torch", "bare", "direct", "direct-bias-none", "lambda")
DEFAULT_WAYS = WAYS[:4]
REPEAT_MS = 2.0  # GPU time of one way's calls in a repeat
HOST_BELOW_US = 200.0  # host time is measured for calls shorter than this
HOST_CALLS = 50  # calls a host sample
HOST_SLEEP = 20_000_000  # cycles of the sleep kernel the calls of a host sample queue behind


def gpu_us(calls, n: int) -> float:
    """Time a call as made back to back: events around n calls cycling through `calls`."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(n):
        calls[i % len(calls)]()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def host_us(calls, n: int = HOST_CALLS, sleep: int = HOST_SLEEP) -> float:
    """Host time a call: n calls enqueued while a sleep kernel of `sleep` cycles keeps the GPU busy
    (so the GPU never holds the host back)."""
    torch.cuda._sleep(sleep)
    t0 = time.perf_counter_ns()
    for i in range(n):
        calls[i % len(calls)]()
    host = (time.perf_counter_ns() - t0) / n / 1e3
    torch.cuda.synchronize()
    return host


def interleaved(
    calls: dict, reps: int, host_calls: int = HOST_CALLS, host_sleep: int = HOST_SLEEP
) -> dict[str, dict[str, list[float]]]:
    """Every way's GPU (and, for short calls, host) time a call in each of `reps` repeats, the ways
    taken in turn within a repeat, their order rotated by one from each repeat to the next."""
    names = list(calls)
    for c in calls.values():  # first calls: plans, cuBLAS heuristics
        gpu_us(c, len(c))
    estimate = max(gpu_us(c, 2 * len(c)) for c in calls.values())
    n = max(2, round(REPEAT_MS * 1e3 / estimate))
    times: dict[str, dict[str, list[float]]] = {name: {"gpu": [], "host": []} for name in names}
    for r in range(reps):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name]["gpu"].append(gpu_us(calls[name], n))
            if estimate < HOST_BELOW_US:
                times[name]["host"].append(host_us(calls[name], host_calls, host_sleep))
    return times


def shapes_of(spec: str | None) -> list[Shape]:
    """`--shapes`: none for the probe's own 21 shapes, `llm-dense`, one MxNxK, or a CSV of M,N,K."""
    if spec is None:
        return [Shape(M, N, K) for N, K in WEIGHTS for M in TOKENS]
    if re.fullmatch(r"\d+x\d+x\d+", spec):
        return [Shape(*map(int, spec.split("x")))]
    return llm_dense_shapes() if spec == "llm-dense" else read_csv(spec)


def inputs(M, N, K, scaling):
    a = (torch.randn(M, K, device="cuda") / 2).to(torch.float8_e4m3fn)
    w = (torch.randn(N, K, device="cuda") / 2).to(torch.float8_e4m3fn)
    shape_a, shape_b = ((M, 1), (1, N)) if scaling == "row" else ((), ())
    sa = torch.rand(shape_a, device="cuda") + 0.5
    sb = torch.rand(shape_b, device="cuda") + 0.5
    return a, w.t(), sa, sb, torch.empty(M, N, device="cuda", dtype=torch.bfloat16)


def ways(a, b, sa, sb, out):
    mm = functools.partial(gluon_survey.matmul, a, b, scale_a=sa, scale_b=sb, out=out)
    kw = {"out_dtype": torch.bfloat16, "use_fast_accum": True, "out": out}
    return {
        "auto": mm,
        "torch": functools.partial(mm, kernel="torch"),
        "bare": api.prepare("torch", a, b, out, scale_a=sa, scale_b=sb).fn,
        "direct": functools.partial(torch._scaled_mm, a, b, sa, sb, **kw),
        "direct-bias-none": functools.partial(torch._scaled_mm, a, b, sa, sb, bias=None, **kw),
        # the keywords spelled out, as a caller writes them: a **kw would add a dict unpacking
        "lambda": lambda: torch._scaled_mm(
            a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True, out=out
        ),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default="fp8-path.csv")
    p.add_argument("--scaling", default="row", choices=("row", "tensor"))
    p.add_argument(
        "--shapes", help="llm-dense, one MxNxK, or a CSV of M,N,K (default: the probe's 21 shapes)"
    )
    p.add_argument(
        "--ways",
        default=",".join(DEFAULT_WAYS),
        help=f"some of {','.join(WAYS)}, taken in this order; direct is always timed (default: %(default)s)",
    )
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--host-calls", type=int, default=HOST_CALLS, help="calls a host-time sample")
    p.add_argument(
        "--host-sleep",
        type=int,
        default=HOST_SLEEP,
        help="cycles of the sleep kernel a host sample queues behind",
    )
    args = p.parse_args(argv)
    chosen = list(dict.fromkeys(args.ways.split(",") + ["direct"]))
    if unknown := [w for w in chosen if w not in WAYS]:
        p.error(f"--ways: unknown {','.join(unknown)} (some of {','.join(WAYS)})")
    torch.manual_seed(0)
    rows = []
    for shape in shapes_of(args.shapes):
        M, N, K = shape.M, shape.N, shape.K
        sets = [inputs(M, N, K, args.scaling) for _ in range(int(COLD_BYTES // (N * K + M * K)) + 2)]
        a, b, sa, sb, out = sets[0]
        ref = (a.float() @ b.float()) * sa * sb
        per_set = [ways(*s) for s in sets]
        for name in chosen:
            out.fill_(float("nan"))
            per_set[0][name]()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            if not err < 2e-2:
                sys.exit(f"{name} wrong at {M}x{N}x{K}: rel err {err}")
        del ref
        calls = {name: [w[name] for w in per_set] for name in chosen}
        times = interleaved(calls, args.reps, args.host_calls, args.host_sleep)
        row = {"M": M, "N": N, "K": K, "scaling": args.scaling}
        for name in chosen:
            gpu, host = times[name]["gpu"], times[name]["host"]
            row[f"{name}_us"] = round(statistics.median(gpu), 2)
            row[f"{name}_host_us"] = round(statistics.median(host), 2) if host else ""
            row[f"{name}_host_us_p20_p80"] = (
                "{:.2f}-{:.2f}".format(*np.percentile(host, [20, 80])) if host else ""
            )
            if name != "direct":
                ratios = np.array(gpu) / np.array(times["direct"]["gpu"])
                p20, p50, p80 = np.percentile(ratios, [20, 50, 80])
                row[f"{name}_x_direct"] = round(float(p50), 4)
                row[f"{name}_x_direct_p20_p80"] = f"{p20:.3f}-{p80:.3f}"
        why = api.explain(a, b, scale_a=sa, scale_b=sb)
        row["auto_runs"] = next(line for line in why.splitlines() if line.startswith("runs:")).split()[1]
        rows.append(row)
        print(", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        del sets, per_set
    with open(args.output, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
