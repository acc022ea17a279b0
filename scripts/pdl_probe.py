"""Back-to-back calls on the GPU's own timeline: how long each call's kernel runs, how far apart
the calls start, and whether a call's kernel starts before the previous one has ended (a kernel
launched as a programmatic dependent, PDL, may start during its predecessor's tail).

For each shape and way (`torch`: cuBLAS as the survey's reference calls it; `auto`: `matmul`), the
host is put well ahead with a sleep kernel, then --calls calls are enqueued back to back, each on
the next of enough copies of the weight that none is in L2 when its call comes. CUPTI
(torch.profiler) gives every kernel's start and end. Reported per (shape, way), µs: `period`, the
median of start-to-start over the calls (what a call costs the GPU when the host keeps up),
`kernel`, the median of one call's kernel durations summed, `gap` = period - kernel (negative
where calls overlap), and `overlapped`, how many calls' first kernel started before the previous
call's last kernel ended.

Run it once per setting to compare, e.g. with and without `GLUON_SURVEY_PDL=1`:

    PYTHONPATH=src python3 scripts/pdl_probe.py --shapes S.csv --dtype fp8 --output out/pdl.csv
"""

from __future__ import annotations

import argparse
import csv
import functools
import itertools
import os
import statistics
import sys

import torch
from torch.autograd import DeviceType

from gluon_survey import matmul
from gluon_survey.driver.check import make_inputs
from gluon_survey.driver.shapes import read_csv
from gluon_survey.driver.timing import copies_for_cold_l2

WAYS = ("torch", "auto")


def weights(b: torch.Tensor) -> list[torch.Tensor]:
    """Copies of B (the transpose view of an [N, K] weight) that together span as much of the L2
    as the survey's timer rotates over (`copies_for_cold_l2`), at least two, so that each call of
    a back-to-back run reads its weight from HBM."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    count = max(2, copies_for_cold_l2(b.numel() * b.element_size(), l2))
    return [b] + [b.t().clone().t() for _ in range(count - 1)]


def call(a, bs, scales, way: str, i: int):
    return matmul(a, bs[i % len(bs)], kernel=way, **scales)


def timeline(fn, calls: int) -> list[list[tuple[float, float]]]:
    """(start, end) µs of each kernel of each of `calls` back-to-back calls of fn(i)."""
    for i in range(3):
        fn(i)  # compile, plan, cuBLAS heuristics
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(50_000_000)  # ~25 ms: the host enqueues every call before the first runs
        for i in range(calls):
            fn(i)
        torch.cuda.synchronize()
    kernels = sorted(
        (
            e
            for e in prof.events()
            if e.device_type == DeviceType.CUDA and "spin_kernel" not in e.name and "sleep" not in e.name
        ),
        key=lambda e: e.time_range.start,
    )
    per_call = max(1, len(kernels) // calls)
    if len(kernels) != per_call * calls:
        raise RuntimeError(f"{len(kernels)} kernels for {calls} calls: {[e.name for e in kernels[:6]]}")
    spans = [(e.time_range.start, e.time_range.end) for e in kernels]
    return [spans[i * per_call : (i + 1) * per_call] for i in range(calls)]


def summary(groups: list[list[tuple[float, float]]]) -> dict[str, object]:
    starts = [g[0][0] for g in groups]
    ends = [g[-1][1] for g in groups]
    kernel = [sum(e - s for s, e in g) for g in groups]
    period = [b - a for a, b in itertools.pairwise(starts)]
    return {
        "period_us": round(statistics.median(period), 2),
        "kernel_us": round(statistics.median(kernel), 2),
        "gap_us": round(statistics.median(period) - statistics.median(kernel), 2),
        "overlapped": sum(s < e for s, e in zip(starts[1:], ends[:-1], strict=True)),
        "kernels_per_call": len(groups[0]),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", required=True, help="CSV of M,N,K")
    p.add_argument("--dtype", default="fp8", choices=("fp16", "bf16", "fp8", "fp8-row"))
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--output", required=True)
    args = p.parse_args(argv)
    pdl = os.environ.get("GLUON_SURVEY_PDL", "0")
    rows = []
    for shape in read_csv(args.shapes):
        inputs = make_inputs(shape, args.dtype, "t", 0, "cuda")
        a, scales = inputs.a, inputs.scales
        bs = weights(inputs.b)
        for way in WAYS:
            fn = functools.partial(call, a, bs, scales, way)
            row = {"M": shape.M, "N": shape.N, "K": shape.K, "dtype": args.dtype, "way": way, "pdl": pdl}
            row |= summary(timeline(fn, args.calls))
            rows.append(row)
            print(",".join(str(v) for v in row.values()), flush=True)
    with open(args.output, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
