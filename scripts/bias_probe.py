"""Kernel-only GPU time of a product with a bias, fused against a separate add: `matmul(a, b,
bias=bias)` (the bias added to the fp32 accumulator in the epilogue of whatever `auto` runs)
against `matmul(a, b)` then `out.add_(bias)` (a second kernel: one more pass over C), and cuBLAS
both ways (`kernel="torch"` with the bias, which is torch.addmm or torch._scaled_mm(bias=), and
without it plus the add), on the `--shapes llm` weights at M = 1, 16, 128, 1024, 8192 (`--m`), per
--dtype (fp16, bf16, fp8 per-tensor, fp8-row). Each way's output is checked first, NaN-poisoned,
against the fp32 product plus the bias. The clock is kernel_time.py's: each call after a read of
2x L2, a call's kernels summed, the median of --reps calls.

Rows: one per (shape, dtype, way); `x_separate`, on each separate way's row, is its median over
the fused way's (> 1: fusing pays), for ours and for cuBLAS.

    PYTHONPATH=src python3 scripts/bias_probe.py --dtype bf16,fp16,fp8,fp8-row --output out/bias-probe.csv
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_time import check_close, flush_buffers, probe_parser, record, timed, write_csv

from gluon_survey import matmul
from gluon_survey.driver.check import make_inputs, reference
from gluon_survey.driver.shapes import LLM_TOKENS, Shape, llm_shapes

DTYPES = ("fp16", "bf16", "fp8", "fp8-row")


def ways(inputs, out: torch.Tensor) -> dict[str, object]:
    """The four calls, each writing `out` (the separate ways add in place after the product)."""
    a, b, bias, scales = inputs.a, inputs.b, inputs.bias, inputs.scales

    def fused(kernel):
        return lambda: matmul(a, b, kernel=kernel, out=out, bias=bias, **scales)

    def separate(kernel):
        return lambda: matmul(a, b, kernel=kernel, out=out, **scales).add_(bias)

    return {
        "ours fused": fused(None),
        "ours separate": separate(None),
        "cublas fused": fused("torch"),
        "cublas separate": separate("torch"),
    }


def main(argv=None) -> int:
    parser = probe_parser(__doc__)
    parser.add_argument("--dtype", default="bf16", help=f"comma-separated: {', '.join(DTYPES)}")
    parser.add_argument("--m", default=",".join(map(str, LLM_TOKENS)), help="token counts, comma-separated")
    args = parser.parse_args(argv)
    dtypes = args.dtype.split(",")
    if unknown := [d for d in dtypes if d not in DTYPES]:
        parser.error(f"unknown --dtype {', '.join(unknown)}; use {', '.join(DTYPES)}")
    tokens = [int(m) for m in args.m.split(",")]
    weights = list(dict.fromkeys((s.N, s.K) for s in llm_shapes()))
    flush, sink = flush_buffers()
    rows: list[dict] = []
    for dtype in dtypes:
        for n, k in weights:
            for m in tokens:
                shape = Shape(m, n, k)
                inputs = make_inputs(shape, dtype, "t", 0, "cuda", bias=True)
                ref = reference(inputs.a, inputs.b, **inputs.extras)
                out = torch.empty(m, n, device="cuda", dtype=inputs.bias.dtype)
                medians: dict[str, float] = {}
                for way, fn in ways(inputs, out).items():
                    try:
                        out.fill_(float("nan"))
                        fn()
                        check_close(f"{shape.label} {dtype} {way}", out, ref, 0.02)
                        med, times = timed(fn, args.reps, flush, sink)
                    except Exception as exc:  # a finding, not a crash
                        what = f"{type(exc).__name__}: {str(exc)[:200]}"
                        print(f"{shape.label} {dtype} {way}: {what}", flush=True)
                        continue
                    medians[way] = med
                    who = way.split()[0]
                    separate = medians.get(f"{who} separate")
                    row = {
                        "M": m, "N": n, "K": k, "dtype": dtype, "way": way, **times,
                        "x_separate": round(separate / medians[f"{who} fused"], 3)
                        if separate and f"{who} fused" in medians else "",
                    }  # fmt: skip
                    record(rows, row)
                del inputs, ref, out
    write_csv(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
