"""Rung regmma: gemv's register stream, multiplied on tensor cores, for a handful of tokens.

The idea: gemv streams the weight with 16-byte loads straight into registers and multiplies on the
CUDA cores; that holds at one token, but 16 tokens at 4096 x 4096 are 16 times its FMAs, as long
as the bytes take to arrive. The tensor core's `mma.sync` (Ampere's MMA, which Hopper and
Blackwell still run) takes both operands from registers, so the stream can stay gemv's: each warp
loads its piece of the weight with 16-byte loads, converts it to the MMA's operand layout (through
a few KB of shared memory, no TMA, no ring, no barrier between programs) and multiplies it by the
same K slice of up to BLOCK_T tokens (from L2). The weight rows are the MMA's M (16 an
instruction), the tokens its N (8 an instruction): swap-AB, as in swapab, without its TMA ring.

A program has 16 weight rows, too few for a warp each: its warps split K instead (a batched MMA,
warp w taking columns [w KC, (w + 1) KC) of every BLOCK_K = num_warps KC step) and sum their
partial tiles once at the end. As in gemv, the next step's loads go out before this step's MMAs.

Measured against gemv, swapab's whole-K tile and slab at M = 2..64 in docs/perf-notes.md (entry
31); `matmul(kernel=None)` runs it only where `tune` measured it fastest. fp8 operands are
refused. A row-major B ([K, N], unit stride along N) is loaded with its vectors along N: correct,
a layout no table picks.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from ..launch import CompileSpec, Launch, Scales, Target, b_layout, is_kmajor
from .common import Launcher

__all__ = [
    "CONFIGS",
    "RegmmaConfig",
    "candidates",
    "compile_specs",
    "config_for",
    "prepare",
    "regmma_kernel",
    "unsupported_reason",
]

VECTOR_BYTES = 16  # one LDG.E.128 a thread
_VECTOR_BITS = gl.constexpr(8 * VECTOR_BYTES)
MMA_ROWS = 16  # an mma.sync's M: weight rows a program


@dataclass(frozen=True)
class RegmmaConfig:
    """BLOCK_T tokens and 16 weight rows a program; num_warps warps each take KC of every
    BLOCK_K = num_warps * KC step of K."""

    BLOCK_T: int = 16
    KC: int = 64
    num_warps: int = 8
    ELEM_BYTES: int = 2

    def __post_init__(self):
        if self.BLOCK_T not in (8, 16, 32, 64):
            raise ValueError(f"BLOCK_T ({self.BLOCK_T}) is 8, 16, 32 or 64 tokens")
        vector = VECTOR_BYTES // self.ELEM_BYTES
        if self.KC % (2 * vector) or 32 * vector < self.KC:
            raise ValueError(f"KC ({self.KC}) must be a multiple of {2 * vector} up to {32 * vector}")

    @property
    def BLOCK_K(self) -> int:
        return self.KC * self.num_warps

    @property
    def label(self) -> str:
        return f"W16xT{self.BLOCK_T}xK{self.KC} w{self.num_warps}"

    def table(self) -> dict[str, object]:
        return {"BLOCK_M": self.BLOCK_T, "BLOCK_N": MMA_ROWS, "BLOCK_K": self.BLOCK_K,
                "num_warps": self.num_warps, "mma": "mma.sync (registers)", "swap_ab": True}  # fmt: skip


CONFIGS = {major: RegmmaConfig() for major in (9, 10)}


def candidates(capability: tuple[int, int], fp8: bool = False) -> dict[str, RegmmaConfig]:
    """The configs `gluon-survey tune` may pick, by label (none for fp8 operands)."""
    if fp8:
        return {}
    tiles = [
        RegmmaConfig(BLOCK_T=16, KC=64, num_warps=8),
        RegmmaConfig(BLOCK_T=16, KC=64, num_warps=4),
        RegmmaConfig(BLOCK_T=32, KC=64, num_warps=8),
        RegmmaConfig(BLOCK_T=64, KC=32, num_warps=8),
    ]
    return {c.label: c for c in tiles}


def config_for(capability: tuple[int, int], K: int, fp8: bool = False) -> RegmmaConfig:
    if fp8:
        raise ValueError(_FP8)
    return CONFIGS[capability[0]]


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """mma.sync from registers: any GPU the ladder runs on (its configs are per architecture)."""
    if capability[0] in CONFIGS:
        return None
    return f"regmma has configs for sm_90 and sm_100; this GPU is sm_{capability[0]}{capability[1]}"


_FP8 = "regmma takes fp16/bf16 operands only; for fp8 use kernel='swapab' or kernel=None"


@gluon.jit
def _step(a_ptr, w_ptr, wn, wk, xk, xt, M, N, K, stride_am, stride_w, W_KMAJOR: gl.constexpr):
    """One step's weight piece [num_warps, 16, KC] (rows wn, columns wk) and token piece
    [num_warps, KC, BLOCK_T] (columns xk, tokens xt), 0 past N, K and M."""
    if W_KMAJOR:  # w[n, k] at n * stride_w + k
        w_offs = wn.to(gl.int64) * stride_w + wk
    else:  # b[k, n] at k * stride_w + n
        w_offs = wk.to(gl.int64) * stride_w + wn
    w = gl.load(w_ptr + w_offs, mask=(wn < N) & (wk < K), other=0.0)
    x = gl.load(a_ptr + xt.to(gl.int64) * stride_am + xk, mask=(xt < M) & (xk < K), other=0.0)
    return w, x


@gluon.jit
def regmma_kernel(
    a_ptr,
    w_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_w,
    stride_cm,
    BLOCK_T: gl.constexpr,
    KC: gl.constexpr,
    W_KMAJOR: gl.constexpr,
):
    """c[m, n] = sum_k a[m, k] w[n, k] for 16 rows n of the weight (program_id 0) and BLOCK_T
    tokens m (program_id 1): W_KMAJOR, w is the [N, K] weight (row stride stride_w); else
    b = [K, N] (row stride stride_w). Every tensor is [warp, ...]: warp w holds the columns
    [w KC, (w + 1) KC) of each step."""
    BLOCK_N: gl.constexpr = 16
    VEC: gl.constexpr = _VECTOR_BITS // w_ptr.dtype.element_ty.primitive_bitwidth
    KW: gl.constexpr = gl.num_warps()
    BLOCK_K: gl.constexpr = KW * KC
    # Each warp loads its [16, KC] piece with 16-byte vectors along the unit stride, and its
    # [KC, BLOCK_T] token piece with vectors along K.
    TPW_K: gl.constexpr = KC // VEC
    if W_KMAJOR:
        w_layout: gl.constexpr = gl.BlockedLayout([1, 1, VEC], [1, 32 // TPW_K, TPW_K], [KW, 1, 1], [2, 1, 0])
    else:
        w_layout: gl.constexpr = gl.BlockedLayout([1, VEC, 1], [1, BLOCK_N // VEC, 32 * VEC // BLOCK_N],
                                                  [KW, 1, 1], [1, 2, 0])  # fmt: skip
    x_layout: gl.constexpr = gl.BlockedLayout([1, VEC, 1], [1, TPW_K, 32 // TPW_K], [KW, 1, 1], [1, 2, 0])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[KW, 1, 1],
                                                  instr_shape=[1, 16, 8])  # fmt: skip
    w_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    x_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)

    n0 = gl.program_id(0) * BLOCK_N
    t0 = gl.program_id(1) * BLOCK_T
    # [1, 16, 1] rows, [KW, 1, KC] columns of the weight piece
    wn = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, gl.SliceLayout(2, w_layout)))
    wn = gl.expand_dims(gl.expand_dims(wn, 0), 2)
    warp = gl.arange(0, KW, layout=gl.SliceLayout(1, gl.SliceLayout(2, w_layout)))
    col = gl.arange(0, KC, layout=gl.SliceLayout(0, gl.SliceLayout(1, w_layout)))
    wk = gl.expand_dims(gl.expand_dims(warp * KC, 1), 2) + gl.expand_dims(gl.expand_dims(col, 0), 1)
    # [KW, KC, 1] columns, [1, 1, BLOCK_T] tokens of the token piece
    warp = gl.arange(0, KW, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_layout)))
    col = gl.arange(0, KC, layout=gl.SliceLayout(0, gl.SliceLayout(2, x_layout)))
    xk = gl.expand_dims(gl.expand_dims(warp * KC, 1), 2) + gl.expand_dims(gl.expand_dims(col, 0), 2)
    xt = t0 + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_layout)))
    xt = gl.expand_dims(gl.expand_dims(xt, 0), 1)

    acc = gl.zeros([KW, BLOCK_N, BLOCK_T], gl.float32, mma)
    w_next, x_next = _step(a_ptr, w_ptr, wn, wk, xk, xt, M, N, K, stride_am, stride_w, W_KMAJOR)
    for k in range(0, K, BLOCK_K):
        w, x = w_next, x_next
        # The next step's loads go out before this step's MMAs (none past K: masked off).
        nk = k + BLOCK_K
        w_next, x_next = _step(a_ptr, w_ptr, wn, wk + nk, xk + nk, xt, M, N, K, stride_am, stride_w, W_KMAJOR)
        acc = mma_v2(gl.convert_layout(w, w_op), gl.convert_layout(x, x_op), acc)

    out = gl.sum(acc, axis=0)  # the warps' partial tiles, [16, BLOCK_T]
    out_layout: gl.constexpr = gl.SliceLayout(0, mma)
    cn = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_layout))
    ct = t0 + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, out_layout))
    ptrs = c_ptr + gl.expand_dims(ct.to(gl.int64) * stride_cm, 0) + gl.expand_dims(cn, 1)
    mask = gl.expand_dims(ct < M, 0) & gl.expand_dims(cn < N, 1)
    gl.store(ptrs, out.to(c_ptr.dtype.element_ty), mask=mask)


class RegmmaPlan:
    """The launch on other tensors of the problem `prepare` checked (`gluon_survey.api`'s plan
    cache keys them on shapes, strides, dtypes and 16-byte alignment): the kernel's scalar
    arguments are the same for all of them, so a call only passes the three tensors."""

    def __init__(self, launcher: Launcher, scalars: tuple[int, ...]):
        self.launcher, self.scalars = launcher, scalars

    def launch(self, a, b, out, scales: Scales | None = None) -> None:
        self.launcher(a, b, out, *self.scalars)


def _constexprs(cfg: RegmmaConfig, kmajor: bool) -> dict[str, object]:
    return {"BLOCK_T": cfg.BLOCK_T, "KC": cfg.KC, "W_KMAJOR": kmajor}


def prepare(
    a, b, out, target: Target, cfg: RegmmaConfig | None = None, scales: Scales | None = None
) -> Launch:
    """out = a @ b, one program per 16 weight rows and BLOCK_T tokens."""
    if scales is not None or a.element_size() == 1:
        raise ValueError(_FP8)
    cfg = cfg or config_for(target.capability, a.shape[1])
    (M, K), N = a.shape, b.shape[1]
    kmajor = is_kmajor(b_layout(b))
    stride_w = b.stride(1) if kmajor else b.stride(0)
    grid = (triton.cdiv(N, MMA_ROWS), triton.cdiv(M, cfg.BLOCK_T))
    plan = RegmmaPlan(
        Launcher(regmma_kernel, grid, _constexprs(cfg, kmajor), cfg.num_warps),
        (M, N, K, a.stride(0), stride_w, out.stride(0)),
    )

    def fn():
        plan.launch(a, b, out)

    fn.plan = plan
    return Launch(fn, cfg.table() | {"grid": grid[0] * grid[1]})


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    """Every candidate, both B layouts, with the pointers and integers a launch on the llm weights
    specializes as multiples of 16 (`divisible`), so the SASS shows the loads such a launch runs."""
    if unsupported_reason(capability) or dtype not in ("float16", "bfloat16"):
        return []
    ty = {"float16": "*fp16", "bfloat16": "*bf16"}[dtype]
    specs = []
    for cfg in candidates(capability).values():
        for layout in ("row", "t"):
            constexprs = _constexprs(cfg, is_kmajor(layout))
            signature = {"a_ptr": ty, "w_ptr": ty, "c_ptr": ty, "M": "i32", "N": "i32", "K": "i32"}
            signature |= {"stride_am": "i32", "stride_w": "i32", "stride_cm": "i32"}
            specs.append(
                CompileSpec(
                    "regmma",
                    f"regmma_kernel {cfg.label} B={layout}",
                    regmma_kernel,
                    signature | dict.fromkeys(constexprs, "constexpr"),
                    constexprs,
                    {"num_warps": cfg.num_warps},
                    config=cfg,
                    divisible=("a_ptr", "w_ptr", "c_ptr", "N", "K", "stride_am", "stride_w", "stride_cm"),
                )
            )
    return specs
