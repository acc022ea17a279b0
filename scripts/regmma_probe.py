"""Does gemv's register stream, multiplied on tensor cores (rung regmma), beat the TMA-ring designs
at a few tokens? (docs/perf-notes.md, entry 31.)

Kernel-only (CUPTI, cold L2: scripts/kernel_time.py's clock) at M = 4, 16 and 64 on the decode
weights in bf16: regmma's candidates and a few more configs, against the read of the same bytes,
cuBLAS and `auto` (the committed table's choice). Every config is first checked against an fp32
reference on the shape it is timed on and on ragged shapes, its output poisoned with NaN.

Not part of the package: an experiment, run on the GPU with

    PYTHONPATH=src python3 scripts/regmma_probe.py --output $OUT/regmma-probe.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernel_time import call_of, flush_buffers, kernel_times, operands, spread, write_csv

from gluon_survey.api import target_of
from gluon_survey.driver.shapes import Shape
from gluon_survey.kernels import regmma

WEIGHTS = [(4096, 4096), (6144, 4096), (4096, 14336), (8192, 8192), (10240, 8192), (28672, 4096),
           (8192, 28672), (57344, 8192)]  # fmt: skip
TOKENS = (4, 16, 64)
EXTRA = [
    regmma.RegmmaConfig(BLOCK_T=t, KC=kc, num_warps=w)
    for t, kc, w in [(16, 128, 4), (8, 64, 8), (16, 32, 8), (32, 32, 8), (64, 32, 4)]
]
RAGGED = [(1, 100, 1000), (7, 33, 77), (63, 4096, 520), (65, 200, 4096), (16, 48, 0)]


def regmma_call(a, b, cfg):
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), device=a.device, dtype=a.dtype)
    launch = regmma.prepare(a, b, out, target_of(a.device), cfg)

    def fn():
        launch.fn()
        return out

    return fn


def check(fn, a, b, what: str) -> None:
    got = fn().float()
    ref = a.float() @ b.float()
    err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item() if ref.numel() else 0.0
    if not err <= 1e-2:  # NaN (an unwritten element) fails too
        raise RuntimeError(f"{what}: relative error {err:.3g}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--output", required=True)
    args = p.parse_args(argv)
    configs = list(regmma.candidates((9, 0)).values()) + EXTRA
    for M, N, K in RAGGED:
        for layout in ("t", "row"):
            a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
            b = w.t() if layout == "t" else w.t().contiguous()
            for cfg in configs:
                check(regmma_call(a, b, cfg), a, b, f"{cfg.label} at {M}x{N}x{K} B={layout}")
    print("ragged shapes: all configs correct", flush=True)
    flush, sink = flush_buffers()
    rows = []
    for M in TOKENS:
        for N, K in WEIGHTS:
            a, b, _ = operands(Shape(M, N, K), "bf16", "tensor")
            moved = (M * K + K * N + M * N) * 2
            variants = {m: call_of(m, a, b, {}, moved)[0] for m in ("read", "torch", "auto")}
            for cfg in configs:
                if 2 * max(M, 8) >= cfg.BLOCK_T:
                    fn = regmma_call(a, b, cfg)
                    check(fn, a, b, f"{cfg.label} at {M}x{N}x{K}")
                    variants[f"regmma {cfg.label}"] = fn
            for name, fn in variants.items():
                med, p20, p80 = spread(kernel_times(fn, args.reps, flush, sink))
                row = {"M": M, "N": N, "K": K, "dtype": "bf16", "variant": name, "us_median": round(med, 2),
                       "us_p20": round(p20, 2), "us_p80": round(p80, 2), "gbps": round(moved / med / 1e3, 1),
                       "of_rung0": round(moved / med / 1e3 / 3015.0, 3)}  # fmt: skip
                rows.append(row)
                print(",".join(str(v) for v in row.values()), flush=True)
    write_csv(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
