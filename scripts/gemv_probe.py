"""Can a GEMM at one token stream its weight as fast as a read does? (docs/perf-notes.md, entry 30.)

Every decode design so far moves the weight through a TMA ring into shared memory, one program
per 64-row tile (swapab's whole-K tile) or per 16-64-row slab, and stays 1-2 µs over a read of
the same bytes at 4096- and 6144-wide weights (entry 29). The read that sets the bar is
kernel_time's `read`: thousands of small programs, each loading 16 KB with 16-byte loads straight
into registers, many programs resident per SM. At M = 1 the product is a matrix-vector product:
2 N K FLOPs, a few percent of what the CUDA cores do while the bytes stream, so it needs no
tensor core, no shared memory and no ring. `gemv_kernel` is that read with a multiply: a
program takes ROWS rows of the weight, walks K in BLOCK_K chunks of 16-byte loads, multiplies by
the token's chunk (from L2: every program reads the same 8-28 KB), keeps a [ROWS, BLOCK_K] fp32
partial in registers and sums it once at the end.

Kernel-only (CUPTI, cold L2: scripts/kernel_time.py's clock) at M = 1 on the decode weights, bf16
and fp8 (per-tensor scales), over ROWS, BLOCK_K and warps, against the read, cuBLAS and `auto`.

Not part of the package: an experiment, run on the GPU with

    PYTHONPATH=src python3 scripts/gemv_probe.py --output $OUT/gemv-probe.csv
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

sys.path.insert(0, str(Path(__file__).parent))
from kernel_time import call_of, check_close, flush_buffers, operands, probe_parser, record, timed, write_csv

from gluon_survey.driver.shapes import Shape

WEIGHTS = [(4096, 4096), (4096, 14336), (6144, 4096), (8192, 8192), (8192, 28672), (10240, 8192),
           (28672, 4096), (57344, 8192)]  # fmt: skip
# (ROWS, BLOCK_K in bytes of a row, num_warps, PREFETCH); run 1 had the six without prefetch
CONFIGS = [(8, 2048, 4, False), (16, 1024, 8, False)] + [
    (r, kb, nw, True)
    for r, kb, nw in [(4, 2048, 4), (8, 2048, 4), (2, 2048, 2), (1, 2048, 1), (4, 1024, 4), (16, 1024, 8),
                      (2, 4096, 2), (8, 512, 4)]
]  # fmt: skip


@gluon.jit
def gemv_kernel(
    x_ptr,
    w_ptr,
    c_ptr,
    scale,
    N,
    K,
    ROWS: gl.constexpr,
    BLOCK_K: gl.constexpr,
    SCALED: gl.constexpr,
    EVEN_K: gl.constexpr,
    PREFETCH: gl.constexpr,
):
    """c[n] = sum_k w[n, k] x[k] for ROWS rows n of a contiguous [N, K] weight (times *scale).
    PREFETCH loads chunk i + 1 before multiplying chunk i (two chunks of registers a thread), so
    a warp keeps its loads in flight while it multiplies; without it each chunk's loads wait for
    the previous chunk's FMAs."""
    VEC: gl.constexpr = 128 // w_ptr.dtype.element_ty.primitive_bitwidth  # 16 bytes a load
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [gl.num_warps(), 1], [1, 0])
    rows = gl.program_id(0) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
    row_ok = gl.expand_dims(rows < N, 1)
    w_rows = w_ptr + gl.expand_dims(rows.to(gl.int64) * K, 1)
    acc = gl.zeros([ROWS, BLOCK_K], gl.float32, layout)
    if PREFETCH:
        x_next, w_next = _chunk(x_ptr, w_rows, row_ok, cols, K, False)
        for k in range(0, K, BLOCK_K):
            x, w = x_next, w_next
            x_next, w_next = _chunk(x_ptr, w_rows, row_ok, k + BLOCK_K + cols, K, False)  # none past K
            acc += w.to(gl.float32) * gl.expand_dims(x.to(gl.float32), 0)
    else:
        for k in range(0, K, BLOCK_K):
            x, w = _chunk(x_ptr, w_rows, row_ok, k + cols, K, EVEN_K)
            acc += w.to(gl.float32) * gl.expand_dims(x.to(gl.float32), 0)
    out = gl.sum(acc, axis=1)
    if SCALED:
        out = out * gl.load(scale)
    gl.store(c_ptr + rows, out.to(c_ptr.dtype.element_ty), mask=rows < N)


@gluon.jit
def _chunk(x_ptr, w_rows, row_ok, kk, K, EVEN_K: gl.constexpr):
    """The token's and the rows' elements at columns kk (masked past K unless EVEN_K)."""
    if EVEN_K:
        x = gl.load(x_ptr + kk)
        w = gl.load(w_rows + gl.expand_dims(kk, 0), mask=row_ok)
    else:
        x = gl.load(x_ptr + kk, mask=kk < K, other=0.0)
        w = gl.load(w_rows + gl.expand_dims(kk, 0), mask=row_ok & gl.expand_dims(kk < K, 0), other=0.0)
    return x, w


def gemv_call(a, w, scale, rows: int, block_bytes: int, warps: int, prefetch: bool):
    """The probe over one token a [1, K] and the [N, K] weight w; out [1, N] (bf16 for fp8)."""
    N, K = w.shape
    block_k = block_bytes // w.element_size()
    out = torch.full(
        (1, N), float("nan"), device=a.device, dtype=torch.bfloat16 if a.element_size() == 1 else a.dtype
    )
    grid = (triton.cdiv(N, rows),)
    s = scale if scale is not None else out
    flags = {"ROWS": rows, "BLOCK_K": block_k, "SCALED": scale is not None, "EVEN_K": K % block_k == 0}
    flags["PREFETCH"] = prefetch

    def fn():
        gemv_kernel[grid](a, w, out, s, N, K, **flags, num_warps=warps)
        return out

    return fn


def main(argv: list[str] | None = None) -> int:
    args = probe_parser(__doc__).parse_args(argv)
    flush, sink = flush_buffers()
    rows = []
    for dtype in ("bf16", "fp8"):
        for N, K in WEIGHTS:
            a, b, scales = operands(Shape(1, N, K), dtype, "tensor")
            w = b.t()  # the [N, K] weight, contiguous
            fp8 = dtype == "fp8"
            scale = (scales["scale_a"] * scales["scale_b"]).float().reshape(1) if fp8 else None
            moved = a.numel() * a.element_size() + w.numel() * w.element_size() + N * 2
            variants = {
                "read": call_of("read", a, b, {}, moved)[0],
                "torch": call_of("torch", a, b, scales, None)[0],
                "auto": call_of("auto", a, b, scales, None)[0],
            }
            for r, kb, nw, pre in CONFIGS:
                variants[f"gemv r{r} k{kb} w{nw}{' prefetch' if pre else ''}"] = gemv_call(
                    a, w, scale, r, kb, nw, pre
                )
            ref = (a.float() @ w.float().t()) * (scale.item() if fp8 else 1.0)
            for name, fn in variants.items():
                if name.startswith("gemv"):
                    check_close(f"{name} at 1x{N}x{K} {dtype}", fn(), ref, 1e-2)
                med, times = timed(fn, args.reps, flush, sink)
                row = {"M": 1, "N": N, "K": K, "dtype": dtype, "variant": name, **times}
                record(rows, row | {"gbps": round(moved / med / 1e3, 1)})
    write_csv(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
