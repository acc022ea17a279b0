"""Kernel-only GPU time of each mode on a list of shapes, from CUPTI (torch.profiler): an
independent check of the survey's `--gpu-time` clock, which times each call between two CUDA
events and so also counts the gap between an event and the kernel.

Each timed call is preceded by a write of 2x L2 (a `fill_` kernel), so its operands come from
HBM; the kernels a call launches between two fills are summed (cuBLAS may launch two). Reported
per (shape, mode): the median and p20/p80 of the summed durations over --reps calls, the GB/s of
A, B and C over the median, and the same for `Tensor.copy_` of a buffer of as many bytes (read
plus written) as the GEMM moves: the copy rate at this size.

    PYTHONPATH=src python3 scripts/kernel_time.py --shapes results/h100-decode-gputime/shapes.csv \
        --modes torch,swapab,splitk --dtype bf16 --output out/kernel-time.csv
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys

import torch
from torch.autograd import DeviceType

from gluon_survey import matmul
from gluon_survey.driver.shapes import read_csv

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
FILL = "FillFunctor"


def operands(M: int, N: int, K: int, dtype: str, scaling: str):
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(M, K, device="cuda", generator=g)
    w = torch.randn(N, K, device="cuda", generator=g)
    if dtype != "fp8":
        return a.to(DTYPES[dtype]), w.to(DTYPES[dtype]).t(), {}
    if scaling == "row":
        scales = {
            "scale_a": torch.rand(M, 1, device="cuda") + 0.5,
            "scale_b": torch.rand(1, N, device="cuda") + 0.5,
        }
    else:
        scales = {"scale_a": torch.tensor(0.5, device="cuda"), "scale_b": torch.tensor(0.75, device="cuda")}
    return a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t(), scales


def call_of(mode: str, a, b, scales):
    if mode == "copy":
        nbytes = a.numel() * a.element_size() + b.numel() * b.element_size()
        half = max(1, nbytes // 2 // 2)
        src = torch.randn(half, device="cuda", dtype=torch.float16)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src), 2 * half * 2
    return lambda: matmul(a, b, kernel=mode, **scales), None


def kernel_times(fn, reps: int, flush: torch.Tensor) -> list[float]:
    fn()  # compile, plan, cuBLAS heuristics
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            flush.fill_(i)
            fn()
        torch.cuda.synchronize()
    kernels = sorted(
        (e for e in prof.events() if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start
    )
    groups: list[float] = []
    for e in kernels:
        if FILL in e.name:
            groups.append(0.0)
        elif groups:
            groups[-1] += e.time_range.elapsed_us()
    if len(groups) != reps or not all(groups):
        raise RuntimeError(
            f"expected {reps} calls between fills, got {len(groups)}: {[e.name for e in kernels[:6]]}"
        )
    return groups


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", required=True, help="CSV of M,N,K")
    p.add_argument("--modes", default="torch,swapab,splitk")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--scaling", default="tensor", choices=("tensor", "row"), help="fp8 scales")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--output", required=True)
    args = p.parse_args(argv)
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, device="cuda")
    rows = []
    for shape in read_csv(args.shapes):
        a, b, scales = operands(shape.M, shape.N, shape.K, args.dtype, args.scaling)
        moved = a.numel() * a.element_size() + b.numel() * b.element_size() + shape.M * shape.N * 2
        for mode in ["copy", *args.modes.split(",")]:
            fn, copy_bytes = call_of(mode, a, b, scales)
            times = kernel_times(fn, args.reps, flush)
            q = statistics.quantiles(times, n=5)
            med = statistics.median(times)
            nbytes = copy_bytes or moved
            row = {
                "M": shape.M, "N": shape.N, "K": shape.K, "dtype": args.dtype, "scaling": args.scaling,
                "mode": mode, "us_median": round(med, 2), "us_p20": round(q[0], 2), "us_p80": round(q[-1], 2),
                "bytes": nbytes, "gbps": round(nbytes / med / 1e3, 1),
            }  # fmt: skip
            rows.append(row)
            print(",".join(str(v) for v in row.values()), flush=True)
    with open(args.output, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
