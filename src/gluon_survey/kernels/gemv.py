"""Rung gemv: rung 0's read plus a multiply, for one token.

The idea: at M = 1 the GEMM is a matrix-vector product, 2 N K FLOPs over N K weight elements, a
couple of percent of what the CUDA cores do while the bytes stream (34 MFLOP at 4096 x 4096 in
the ~11 µs its 33 MB take at 3 TB/s). So it needs no tensor core, no shared memory and no TMA
ring: each program takes ROWS rows of the weight and streams them as rung 0's copy streams a
buffer, with 16-byte loads straight into registers, many small programs resident on every SM
(with fewer rows than warps, the warps share a row's K: one 8 KB row on four warps is a program
the size and shape of the fastest read measured, entries 31 and 32);
it multiplies each chunk by the token's chunk (from L2: every program reads the same K elements),
keeps a [ROWS, BLOCK_K] fp32 partial in registers and sums it once at the end. The one thing the
loop adds to a read is the prefetch: chunk i + 1 is loaded before chunk i is multiplied, so a
warp's loads stay in flight while it multiplies (without it each chunk's loads waited for the
previous chunk's FMAs, and the rung ran 3-8 % slower on the 4096- to 10240-wide weights). Where K
fits one chunk there is nothing to prefetch, and the kernel is specialized without the loop
(ONE_CHUNK): the prefetch's registers are what limits how many programs an SM holds (sm_90a, one
8 KB row on four warps: 114 registers a thread with the loop, 40 without, so the register file
holds 12 programs instead of 4). Measured on the H100 (entry 35): 12.67 -> 12.30 µs at bf16
1 x 4096 x 4096 with the same config, and 12.1 with the one-chunk default, one row with two
16-byte loads a thread (8 warps there), 0.92 of rung 0's bandwidth.

Why it beats the tensor-core designs here: swapab's whole-K tile and slab move the weight through
a TMA ring into shared memory, one program per 64-row tile or per slab, and the ring alone stays
0.4-1.2 µs over a read of the same bytes at 4096- and 6144-wide weights (docs/perf-notes.md,
entries 29 and 30). Kernel-only on the H100 at M = 1 in bf16, its first version ran 1-7 % faster
than `auto` (then the whole-K tile or cuBLAS) on all eight decode weights.

Where it does not apply: several tokens multiply the FMAs (16 tokens at 4096 x 4096 would keep the
CUDA cores busy for ~8 of the ~12 µs), so M > 1 runs the same loop once per token, correct but
re-reading the weight from L2 each time; `matmul(kernel=None)` runs gemv at one token only
(the table's choice on every llm weight; the rule elsewhere, entry 44). fp8 operands (e4m3,
with their scales) run in one chunk only: with the loop the prefetch spilled in fp8 and ran
1.3-2x slower (entry 30); in one chunk (32-36 registers,
two 16-byte loads a thread, K <= 32768) gemv took 0.89-0.97x the whole-K tile's time at M = 1 on
the weights with K <= 16384, so the fp8 rule runs it there (entry 36). A row-major B ([K, N],
unit stride along N) is streamed along N instead: a program takes BLOCK_N columns and walks K
four rows a warp at a time. It measured 0.09-0.95x cuBLAS at M = 1 on the holdout weights (0.09
at K = 18944, where that walk is longest; why, not measured: results/h100-holdout-row-m1), so
the rule runs slab there.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch import CompileSpec, Launch, Scales, Target, b_layout, is_kmajor
from .plan import FP8, Launcher, bias_table, check_config_kind, scale_args, scaling_code

__all__ = [
    "CONFIGS",
    "GemvConfig",
    "candidates",
    "compile_specs",
    "config_for",
    "gemv_kernel",
    "prepare",
    "unsupported_reason",
]

VECTOR_BYTES = 16  # one LDG.E.128 a thread
_VECTOR_BITS = gl.constexpr(8 * VECTOR_BYTES)


@dataclass(frozen=True)
class GemvConfig:
    """ROWS weight rows a program (for a row-major B: columns, in steps of a warp's 16-byte vectors),
    K in chunks of BLOCK_K elements, num_warps warps: ROWS / num_warps rows a warp, or, with fewer
    rows than warps, num_warps / ROWS warps side by side along each row's K."""

    ROWS: int = 1
    BLOCK_K: int = 4096
    num_warps: int = 4
    ELEM_BYTES: int = 2

    def __post_init__(self):
        if self.ROWS % self.num_warps and self.num_warps % self.ROWS:
            raise ValueError(
                f"ROWS ({self.ROWS}) and num_warps ({self.num_warps}): one must be a multiple of the other"
            )
        width = 32 * VECTOR_BYTES // self.ELEM_BYTES * max(1, self.num_warps // self.ROWS)
        if self.BLOCK_K % width:
            raise ValueError(f"BLOCK_K ({self.BLOCK_K}) must be a multiple of a row's vectors ({width})")

    @property
    def label(self) -> str:
        return f"R{self.ROWS}xK{self.BLOCK_K} w{self.num_warps}" + (" fp8" if self.ELEM_BYTES == 1 else "")

    def table(self) -> dict[str, object]:
        return {"BLOCK_M": 1, "BLOCK_N": self.ROWS, "BLOCK_K": self.BLOCK_K, "num_warps": self.num_warps,
                "mma": "none (FMA)"}  # fmt: skip


# Where K is deeper than one chunk: one 8 KB row chunk a program on four warps side by side (a
# program shaped like the fastest read of entry 31), the loop prefetching the next chunk:
# kernel-only at 1 x N x K on the H100, the fastest or within 1 % of it on six of the eight decode
# weights in bf16 and fp16, 1-4 % faster than two rows on two warps (entry 32,
# results/experiments/h100-gemv/gemv-warps-along-k-*.csv).
CONFIGS = {major: GemvConfig() for major in (9, 10)}

# Where K fits one chunk: one row a program, no loop, two 16-byte loads a thread and as many
# warps side by side as that takes (16-bit: 8 at K = 4096, 16 at 8192, 32 at 16384, the most a
# program has; fp8, 16 elements a load: half as many). Kernel-only at M = 1 on the H100, the
# fastest config tried at every 16-bit decode weight with K <= 16384 (docs/perf-notes.md, entry
# 35; results/experiments/h100-gemv/one-chunk).
ONE_CHUNK_LOADS = 2
MAX_WARPS = 32


def _one_chunk_per_warp(elem_bytes: int) -> int:
    """The elements of K one warp takes in one chunk: 32 lanes, ONE_CHUNK_LOADS vectors each."""
    return 32 * ONE_CHUNK_LOADS * VECTOR_BYTES // elem_bytes


def one_chunk_max_k(elem_bytes: int = 2) -> int:
    """The deepest K one program takes in one chunk: 16384 in fp16/bf16, 32768 in fp8."""
    return MAX_WARPS * _one_chunk_per_warp(elem_bytes)


def one_chunk(K: int, elem_bytes: int = 2) -> GemvConfig:
    """One weight row a program in a single chunk of K (rounded up to a power of two), two 16-byte
    loads a thread."""
    per_warp = _one_chunk_per_warp(elem_bytes)
    block_k = max(per_warp, triton.next_power_of_2(K))
    return GemvConfig(ROWS=1, BLOCK_K=block_k, num_warps=block_k // per_warp, ELEM_BYTES=elem_bytes)


def candidates(capability: tuple[int, int], fp8: bool = False) -> dict[str, GemvConfig]:
    """The configs `gluon-survey tune` may pick, by label (fp8: the one-chunk rows only)."""
    if fp8:
        return {c.label: c for c in (one_chunk(K, 1) for K in (4096, 8192, 16384, 32768))}
    # The loop's default, one row of 2 KB chunks on two warps and two rows a warp each (the first
    # default); 8 rows of 1024 on 4 warps, within 0.5 % of that, spilled under triton 3.9. Then
    # the one-chunk rows of the llm weights' K (4096, 8192, 14336); with four loads a thread
    # instead of two they measured up to 2 % slower (entry 35).
    tiles = [
        CONFIGS[capability[0]],
        GemvConfig(ROWS=1, BLOCK_K=2048, num_warps=2),
        GemvConfig(ROWS=2, BLOCK_K=2048, num_warps=2),
        *(one_chunk(K) for K in (4096, 8192, 16384)),
    ]
    return {c.label: c for c in tiles}


def config_for(capability: tuple[int, int], K: int, fp8: bool = False) -> GemvConfig:
    """The one-chunk row where K fits one (K <= one_chunk_max_k), else the loop's config; fp8
    runs in one chunk only."""
    if fp8:
        if one_chunk_max_k(1) < K:
            raise ValueError(_fp8_too_deep(K))
        return one_chunk(K, 1)
    if one_chunk_max_k() >= K:
        return one_chunk(K)
    return CONFIGS[capability[0]]


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """Plain loads and FMAs: any GPU the ladder runs on (its configs are per architecture)."""
    if capability[0] in CONFIGS:
        return None
    return f"gemv has configs for sm_90 and sm_100; this GPU is sm_{capability[0]}{capability[1]}"


def _fp8_too_deep(K: int) -> str:
    return (
        f"gemv runs fp8 in one chunk of K, at most {one_chunk_max_k(1)} (K is {K}): its loop's prefetch "
        "spilled in fp8 (docs/perf-notes.md, entry 30); use kernel='swapab' or kernel=None"
    )


@gluon.jit
def _chunk(a_row, w_ptr, offs_n, offs_k, N, K, stride_w, W_KMAJOR: gl.constexpr):
    """The token's elements at offs_k and the weight's at (offs_n, offs_k), 0 past N and K, as a
    [ROWS, BLOCK_K] tile (W_KMAJOR) or a [BLOCK_K, ROWS] one."""
    x = gl.load(a_row + offs_k, mask=offs_k < K, other=0.0)
    if W_KMAJOR:  # w[n, k] at n * stride_w + k
        ptrs = gl.expand_dims(offs_n.to(gl.int64) * stride_w, 1) + gl.expand_dims(offs_k, 0)
        mask = gl.expand_dims(offs_n < N, 1) & gl.expand_dims(offs_k < K, 0)
    else:  # b[k, n] at k * stride_w + n
        ptrs = gl.expand_dims(offs_k.to(gl.int64) * stride_w, 1) + gl.expand_dims(offs_n, 0)
        mask = gl.expand_dims(offs_k < K, 1) & gl.expand_dims(offs_n < N, 0)
    return x, gl.load(w_ptr + ptrs, mask=mask, other=0.0)


@gluon.jit(do_not_specialize_on_alignment=["bias"])
def gemv_kernel(
    a_ptr,
    w_ptr,
    c_ptr,
    scale_a,
    scale_b,
    bias,
    M,
    N,
    K,
    stride_am,
    stride_w,
    stride_cm,
    ROWS: gl.constexpr,
    BLOCK_K: gl.constexpr,
    W_KMAJOR: gl.constexpr,
    ONE_CHUNK: gl.constexpr,
    SCALING: gl.constexpr,
    HAS_BIAS: gl.constexpr,
):
    """c[m, n] = sum_k a[m, k] w[n, k] for ROWS rows n of the weight and every token m (a loop):
    W_KMAJOR, w is the [N, K] weight (row stride stride_w); else b = [K, N] (row stride stride_w).
    The loads are 16 bytes wide where the launch specializes the bases, the row strides and the
    extent along the unit stride as multiples of 16 (as it does on every llm weight). ONE_CHUNK:
    K fits one chunk, so there is no loop and nothing to prefetch. fp8 operands (e4m3) come with
    fp32 scales: SCALING 1 per tensor (one element each), 2 row-wise (scale_a per token, scale_b
    per weight row); 0 for fp16/bf16 (None, None). HAS_BIAS: + bias[n] (fp16/bf16, C's dtype), after
    the scales; None and False without."""
    VEC: gl.constexpr = _VECTOR_BITS // w_ptr.dtype.element_ty.primitive_bitwidth
    # A warp's 32 vectors run along the unit stride (K of the weight, or N of a row-major B), the
    # warps down the other dimension; with fewer weight rows than warps, the rest side by side
    # along K.
    NW: gl.constexpr = gl.num_warps()
    WARPS_DOWN: gl.constexpr = ROWS if W_KMAJOR and ROWS < NW else NW
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [WARPS_DOWN, NW // WARPS_DOWN], [1, 0])
    if W_KMAJOR:
        offs_n = gl.program_id(0) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
        acc_shape: gl.constexpr = [ROWS, BLOCK_K]
        SUM_AXIS: gl.constexpr = 1
    else:  # ROWS columns (a warp's vectors), K down the warps
        offs_n = gl.program_id(0) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(0, layout))
        cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(1, layout))
        acc_shape: gl.constexpr = [BLOCK_K, ROWS]
        SUM_AXIS: gl.constexpr = 0
    # The scales are loaded before the stream, so their latency hides under it.
    if SCALING == 1:
        scale = gl.load(scale_a) * gl.load(scale_b)
    elif SCALING == 2:
        row_scales = gl.load(scale_b + offs_n, mask=offs_n < N, other=0.0)
    if HAS_BIAS:  # likewise
        row_bias = gl.load(bias + offs_n, mask=offs_n < N, other=0.0).to(gl.float32)
    for m in range(M):
        a_row = a_ptr + m * stride_am
        if SCALING == 2:
            token_scale = gl.load(scale_a + m)
        x_next, w_next = _chunk(a_row, w_ptr, offs_n, cols, N, K, stride_w, W_KMAJOR)
        if ONE_CHUNK:  # the read and one multiply: the registers of a single chunk
            acc = w_next.to(gl.float32) * gl.expand_dims(x_next.to(gl.float32), 1 - SUM_AXIS)
        else:
            acc = gl.zeros(acc_shape, gl.float32, layout)
            for k in range(0, K, BLOCK_K):
                x, w = x_next, w_next
                # The next chunk's loads go out before this one's FMAs (none past K: masked off).
                x_next, w_next = _chunk(a_row, w_ptr, offs_n, k + BLOCK_K + cols, N, K, stride_w, W_KMAJOR)
                acc += w.to(gl.float32) * gl.expand_dims(x.to(gl.float32), 1 - SUM_AXIS)
        out = gl.sum(acc, axis=SUM_AXIS)
        if SCALING == 1:
            out = out * scale
        elif SCALING == 2:
            out = out * row_scales * token_scale
        if HAS_BIAS:
            out = out + row_bias
        gl.store(c_ptr + m * stride_cm + offs_n, out.to(c_ptr.dtype.element_ty), mask=offs_n < N)


class GemvPlan:
    """The launch on other tensors of the problem `prepare` checked (`gluon_survey.api`'s plan
    cache keys them on shapes, strides and dtypes, and checks that their bases are 16-byte
    aligned, as they were when Triton compiled the kernel): the kernel's scalar arguments are the
    same for all of them, so a call only passes the three tensors."""

    def __init__(self, launcher: Launcher, scalars: tuple[int, ...]):
        self.launcher, self.scalars = launcher, scalars

    def launch(self, a, b, out, scales: Scales | None = None, bias=None) -> None:
        self.launcher(a, b, out, *scale_args(scales), bias, *self.scalars)


# A row-major B's program is a warp's 32 vectors of columns by four K rows a warp: past 16 warps
# the register cap (64 a thread at 32 warps) spills its loop.
ROW_MAJOR_MAX_WARPS = 16


def _warps(cfg: GemvConfig, kmajor: bool) -> int:
    return cfg.num_warps if kmajor else min(cfg.num_warps, ROW_MAJOR_MAX_WARPS)


def _constexprs(
    cfg: GemvConfig, kmajor: bool, K: int, scaling: int = 0, has_bias: bool = False
) -> dict[str, object]:
    """The kernel's tile: the config's for the [N, K] weight; for a row-major B, one warp's
    16-byte vectors of columns (32 of them) by four K rows a warp. Where K fits one chunk the
    kernel is specialized without its loop (ONE_CHUNK). SCALING: `Scales.code`, 0 without;
    HAS_BIAS: whether a bias is added."""
    if kmajor:
        tile = {"ROWS": cfg.ROWS, "BLOCK_K": cfg.BLOCK_K, "W_KMAJOR": True}
    else:
        tile = {
            "ROWS": 32 * VECTOR_BYTES // cfg.ELEM_BYTES,
            "BLOCK_K": 4 * _warps(cfg, False),
            "W_KMAJOR": False,
        }
    return tile | {"ONE_CHUNK": tile["BLOCK_K"] >= K, "SCALING": scaling, "HAS_BIAS": has_bias}


def prepare(
    a, b, out, target: Target, cfg: GemvConfig | None = None, scales: Scales | None = None, bias=None
) -> Launch:
    """out = a @ b (times the fp8 `scales`, + `bias`), one program per ROWS rows (columns) of the
    weight."""
    fp8 = a.element_size() == 1
    (M, K), N = a.shape, b.shape[1]
    cfg = cfg or config_for(target.capability, K, fp8)
    check_config_kind("gemv", cfg, scales)
    kmajor = is_kmajor(b_layout(b))
    if fp8 and not kmajor:
        raise ValueError(
            "gemv's fp8 kernel reads the weight K-major: pass b as the transpose view of an [N, K] weight"
        )
    if fp8 and K > cfg.BLOCK_K:
        raise ValueError(_fp8_too_deep(K) + f"; config {cfg.label} takes K <= {cfg.BLOCK_K}")
    stride_w = b.stride(1) if kmajor else b.stride(0)
    constexprs = _constexprs(cfg, kmajor, K, scaling_code(scales), bias is not None)
    grid = (triton.cdiv(N, constexprs["ROWS"]),)
    plan = GemvPlan(
        Launcher(gemv_kernel, grid, constexprs, _warps(cfg, kmajor)),
        (M, N, K, a.stride(0), stride_w, out.stride(0)),
    )

    def fn():
        plan.launch(a, b, out, scales, bias)

    fn.plan = plan
    chunks = triton.cdiv(K, constexprs["BLOCK_K"])
    table = {"num_warps": _warps(cfg, kmajor), "grid": grid[0], "k_chunks": chunks} | bias_table(bias)
    return Launch(fn, cfg.table() | table)


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    """Every candidate, both B layouts (the [N, K] weight both with K in one chunk and deeper), with
    the pointers and integers a launch on the llm weights specializes as multiples of 16
    (`divisible`), so the SASS shows the loads such a launch runs."""
    if unsupported_reason(capability) or dtype not in ("float16", "bfloat16", FP8):
        return []
    fp8 = dtype == FP8
    ty = {"float16": "*fp16", "bfloat16": "*bf16", FP8: "*fp8e4nv"}[dtype]
    # fp8: one chunk, K-major, row-wise scales (the epilogue that loads the most); fp16/bf16: the
    # loop on both layouts and one chunk on the weight, no scales.
    shapes = [("t", 1, " one chunk")] if fp8 else [("row", 0, ""), ("t", 0, ""), ("t", 1, " one chunk")]
    specs = []
    for cfg in candidates(capability, fp8).values():
        for layout, one, suffix in shapes:
            K = 1 if one else 2 * cfg.BLOCK_K
            constexprs = _constexprs(cfg, is_kmajor(layout), K, 2 if fp8 else 0)
            signature = {"a_ptr": ty, "w_ptr": ty, "c_ptr": "*bf16" if fp8 else ty}
            scales = {"scale_a": "*fp32", "scale_b": "*fp32"} if fp8 else {}
            none = {"bias": None}  # no bias (`plan.with_bias` adds one), after the scales
            constexprs = ({} if fp8 else {"scale_a": None, "scale_b": None}) | none | constexprs
            signature |= scales | {"bias": "constexpr", "M": "i32", "N": "i32", "K": "i32"}
            signature |= {"stride_am": "i32", "stride_w": "i32", "stride_cm": "i32"}
            specs.append(
                CompileSpec(
                    "gemv",
                    f"gemv_kernel {cfg.label}{suffix} B={layout}" + (" scales=row" if fp8 else ""),
                    gemv_kernel,
                    signature | dict.fromkeys(constexprs, "constexpr"),
                    constexprs,
                    {"num_warps": _warps(cfg, is_kmajor(layout))},
                    config=cfg,
                    divisible=("a_ptr", "w_ptr", "c_ptr", "N", "K", "stride_am", "stride_w", "stride_cm"),
                )
            )
    return specs
