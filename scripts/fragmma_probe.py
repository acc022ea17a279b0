"""Does gemv's register stream on tensor cores, its loads landing as mma.sync's fragments (rung
fragmma), beat `auto` at a few tokens? (docs/perf-notes.md, entry 33.)

Kernel-only (CUPTI, cold L2: scripts/kernel_time.py's clock) at M = 4 and 16 on the decode
weights: fragmma's candidates and a few more configs, against the read of the same bytes, cuBLAS
and `auto` (the committed table's choice), in bf16 (fp16 on the two smallest weights). Every
config is first checked against an fp32 reference on the shape it is timed on and on ragged
shapes, its output poisoned with NaN.

Not part of the package: an experiment, run on the GPU with

    PYTHONPATH=src python3 scripts/fragmma_probe.py --output $OUT/fragmma-probe.csv
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
from gluon_survey.kernels import fragmma

WEIGHTS = [(4096, 4096), (6144, 4096), (4096, 14336), (8192, 8192), (10240, 8192), (28672, 4096),
           (8192, 28672), (57344, 8192)]  # fmt: skip
TOKENS = (4, 16)
EXTRA = [
    fragmma.FragmmaConfig(ROWS=r, BLOCK_T=t, KC=kc, num_warps=w)
    for r, t, kc, w in [(16, 8, 64, 8), (16, 16, 128, 4), (16, 16, 64, 4), (16, 8, 128, 4), (16, 16, 32, 8)]
]  # fmt: skip
RAGGED = [(1, 100, 1000), (7, 33, 77), (63, 4096, 520), (65, 200, 4096), (16, 48, 0), (3, 17, 4104)]


def fragmma_call(a, b, cfg):
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), device=a.device, dtype=a.dtype)
    launch = fragmma.prepare(a, b, out, target_of(a.device), cfg)

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
    configs = list(fragmma.candidates((9, 0)).values()) + EXTRA
    for M, N, K in RAGGED:
        for dtype in (torch.bfloat16, torch.float16):
            a = torch.randn(M, K, device="cuda", dtype=dtype)
            b = torch.randn(N, K, device="cuda", dtype=dtype).t()
            for cfg in configs:
                check(fragmma_call(a, b, cfg), a, b, f"{cfg.label} at {M}x{N}x{K} {dtype}")
    print("ragged shapes: all configs correct", flush=True)
    flush, sink = flush_buffers()
    rows = []
    cells = [("bf16", M, w) for M in TOKENS for w in WEIGHTS]
    cells += [("fp16", M, w) for M in TOKENS for w in WEIGHTS[:2]]  # the two that miss in both
    for dtype, M, (N, K) in cells:
        a, b, _ = operands(Shape(M, N, K), dtype, "tensor")
        moved = (M * K + K * N + M * N) * 2
        variants = {m: call_of(m, a, b, {}, moved)[0] for m in ("read", "torch", "auto")}
        for cfg in configs:
            if cfg.BLOCK_T <= 16:
                fn = fragmma_call(a, b, cfg)
                check(fn, a, b, f"{cfg.label} at {M}x{N}x{K} {dtype}")
                variants[f"fragmma {cfg.label}"] = fn
        for name, fn in variants.items():
            med, p20, p80 = spread(kernel_times(fn, args.reps, flush, sink))
            row = {"M": M, "N": N, "K": K, "dtype": dtype, "variant": name, "us_median": round(med, 2),
                   "us_p20": round(p20, 2), "us_p80": round(p80, 2), "gbps": round(moved / med / 1e3, 1),
                   "of_rung0": round(moved / med / 1e3 / 3015.0, 3)}  # fmt: skip
            rows.append(row)
            print(",".join(str(v) for v in row.values()), flush=True)
    write_csv(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
