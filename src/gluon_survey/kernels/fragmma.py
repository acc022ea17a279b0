"""Rung fragmma: gemv's register stream on tensor cores, the loads landing as the MMA's fragments.

The idea: a dot product does not care in which order it walks K, as long as both operands walk it
in the same order. Ampere's `mma.sync` (m16n8k16, which Hopper and Blackwell still run) wants
each thread of a quad (lanes 4g .. 4g + 3) to hold, per 16 of K, the pairs at k = 2c, 2c + 1 and
2c + 8, 2c + 9 of its row g; a 16-byte load gives a thread 8 *contiguous* elements. So this rung
relabels K: thread c of a quad loads the 8 contiguous physical columns 32 v + 8 c + e of its rows
with one 16-byte load for each v (a warp's load is 64 contiguous bytes of each of 8 rows), and the
kernel declares them (a reshape and a permute, which move no data) to be the logical columns
32 v + 16 e2 + 8 e1 + 2 c + e0 of the MMA. The tokens are loaded the same way
and relabelled the same way, so the sum is the same; the layout conversion the compiler emits is
a renaming of registers: no shared memory, no shuffles, no ldmatrix between the loads and the
HMMA (regmma, measured before this rung and dropped, converted through shared memory; slab and
swapab go through a TMA ring, 0.4-1.2 µs over a read at the 4096- and 6144-wide weights:
docs/perf-notes.md, entries 29-31).

Swap-AB as in swapab: ROWS weight rows a program are the MMA's M (16 an instruction), BLOCK_T
tokens its N (8 an instruction). The warps split K (a batched MMA, warp w taking columns
[w KC, (w + 1) KC) of every BLOCK_K = num_warps KC step) and sum their partial tiles once at the
end. The loads of the next two steps are in flight while a step's MMAs run.

`matmul(kernel=None)` runs it only where `tune` measured it fastest. It streams an [N, K] weight
(b = w.t(), nn.Linear's layout): a row-major B, whose K is not contiguous, gets a clear error, as
do fp8 operands (mma.sync has no e4m3 on sm_90; converting per element is what lost in entry 30).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from ..launch import CompileSpec, Launch, Scales, Target
from .common import Launcher

__all__ = [
    "CONFIGS",
    "FragmmaConfig",
    "candidates",
    "compile_specs",
    "config_for",
    "fragmma_kernel",
    "prepare",
    "unsupported_reason",
]

MMA_ROWS = 16  # an mma.sync's M
_MMA_ROWS = gl.constexpr(MMA_ROWS)
_MMA_K = gl.constexpr(16)  # an mma.sync's K (16-bit operands)


@dataclass(frozen=True)
class FragmmaConfig:
    """ROWS weight rows and BLOCK_T tokens a program; num_warps warps each take KC columns of every
    BLOCK_K = num_warps * KC step of K (KC / 32 16-byte loads a thread and row)."""

    ROWS: int = 16
    BLOCK_T: int = 16
    KC: int = 64
    num_warps: int = 8

    def __post_init__(self):
        if self.ROWS % MMA_ROWS or not 16 <= self.ROWS <= 64:
            raise ValueError(f"ROWS ({self.ROWS}) is 16, 32, 48 or 64 weight rows (mma.sync's M is 16)")
        if self.BLOCK_T not in (8, 16, 32, 64):
            raise ValueError(f"BLOCK_T ({self.BLOCK_T}) is 8, 16, 32 or 64 tokens")
        if self.KC not in (32, 64, 128):
            raise ValueError(f"KC ({self.KC}) is 32, 64 or 128: a quad's 16-byte loads cover 32 columns")

    @property
    def BLOCK_K(self) -> int:
        return self.KC * self.num_warps

    @property
    def label(self) -> str:
        return f"W{self.ROWS}xT{self.BLOCK_T}xK{self.KC} w{self.num_warps}"

    def table(self) -> dict[str, object]:
        return {"BLOCK_M": self.BLOCK_T, "BLOCK_N": self.ROWS, "BLOCK_K": self.BLOCK_K,
                "num_warps": self.num_warps, "mma": "mma.sync (registers)", "swap_ab": True}  # fmt: skip


CONFIGS = {major: FragmmaConfig() for major in (9, 10)}


def candidates(capability: tuple[int, int], fp8: bool = False) -> dict[str, FragmmaConfig]:
    """The configs `gluon-survey tune` may pick, by label (none for fp8 operands)."""
    if fp8:
        return {}
    tiles = [
        config_for(capability, 0),
        FragmmaConfig(ROWS=32, BLOCK_T=16, KC=64, num_warps=8),
    ]
    return {c.label: c for c in tiles}


def config_for(capability: tuple[int, int], K: int, fp8: bool = False) -> FragmmaConfig:
    if fp8:
        raise ValueError(_FP8)
    return CONFIGS[capability[0]]


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """mma.sync from registers: any GPU the ladder runs on (its configs are per architecture)."""
    if capability[0] in CONFIGS:
        return None
    return f"fragmma has configs for sm_90 and sm_100; this GPU is sm_{capability[0]}{capability[1]}"


_FP8 = "fragmma takes fp16/bf16 operands only; for fp8 use kernel='swapab' or kernel=None"
_ROW_MAJOR = (
    "fragmma streams an [N, K] weight with K contiguous (pass b = w.t(), nn.Linear's layout); "
    "for a row-major B use kernel='gemv', kernel='swapab' or kernel=None"
)


@gluon.jit
def _as_fragments(t, KC: gl.constexpr):
    """[B, R, KC] loaded with thread c of each quad holding the 8 contiguous columns 32 v + 8 c + e
    (e < 8, one 16-byte load for each v: a warp's load is 64 contiguous bytes of each of 8 rows),
    relabelled along K so that the thread holds the columns mma.sync wants from it: physical column
    32 v + 8 c + 4 e2 + 2 e1 + e0 becomes logical column 32 v + 16 e2 + 8 e1 + 2 c + e0. A reshape
    and a permute: no data moves."""
    B: gl.constexpr = t.shape[0]
    R: gl.constexpr = t.shape[1]
    t = gl.reshape(t, [B, R, KC // 32, 4, 2, 2, 2])
    t = gl.permute(t, [0, 1, 2, 4, 5, 3, 6])
    return gl.reshape(t, [B, R, KC])


@gluon.jit
def _step(a_ptr, w_ptr, w_offs, w_mask, x_offs, x_mask, col, K):
    """One step's weight piece [num_warps, ROWS, KC] and token piece [num_warps, BLOCK_T, KC] at the
    columns `col`, 0 past N, M and K."""
    w = gl.load(w_ptr + w_offs + col, mask=w_mask & (col < K), other=0.0)
    x = gl.load(a_ptr + x_offs + col, mask=x_mask & (col < K), other=0.0)
    return w, x


@gluon.jit
def fragmma_kernel(
    a_ptr,
    w_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_w,
    stride_cm,
    ROWS: gl.constexpr,
    BLOCK_T: gl.constexpr,
    KC: gl.constexpr,
):
    """c[m, n] = sum_k a[m, k] w[n, k] for ROWS rows n of the [N, K] weight w (row stride
    stride_w) and BLOCK_T tokens m; the token tiles of one row block are neighbouring programs, so
    their weight reads meet in L2. Every tensor is [warp, ...]: warp w holds the columns
    [w KC, (w + 1) KC) of each step."""
    KW: gl.constexpr = gl.num_warps()
    BLOCK_K: gl.constexpr = KW * KC
    # A quad's four threads side by side along K (8 contiguous elements each, repeated every 32),
    # eight quads down the rows (tokens): the rows (tokens) an mma.sync fragment gives lane 4 g + c.
    ld: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 8, 4], [KW, 1, 1], [2, 1, 0])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[KW, 1, 1],
                                                  instr_shape=[1, _MMA_ROWS, 8])  # fmt: skip
    w_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    x_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)

    token_tiles = gl.cdiv(M, BLOCK_T)
    n0 = gl.program_id(0) // token_tiles * ROWS
    t0 = gl.program_id(0) % token_tiles * BLOCK_T
    rows: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, ld))
    n = gl.expand_dims(gl.expand_dims(n0 + gl.arange(0, ROWS, layout=rows), 0), 2)  # [1, ROWS, 1]
    t = gl.expand_dims(gl.expand_dims(t0 + gl.arange(0, BLOCK_T, layout=rows), 0), 2)  # [1, BLOCK_T, 1]
    warp = gl.arange(0, KW, layout=gl.SliceLayout(1, gl.SliceLayout(2, ld)))
    col = gl.arange(0, KC, layout=gl.SliceLayout(0, gl.SliceLayout(1, ld)))
    col = gl.expand_dims(gl.expand_dims(warp * KC, 1), 2) + gl.expand_dims(gl.expand_dims(col, 0), 1)
    w_offs = n.to(gl.int64) * stride_w
    x_offs = t.to(gl.int64) * stride_am

    acc = gl.zeros([KW, ROWS, BLOCK_T], gl.float32, mma)
    w_1, x_1 = _step(a_ptr, w_ptr, w_offs, n < N, x_offs, t < M, col, K)
    w_2, x_2 = _step(a_ptr, w_ptr, w_offs, n < N, x_offs, t < M, col + BLOCK_K, K)
    for k in range(0, K, BLOCK_K):
        w, x = w_1, x_1
        w_1, x_1 = w_2, x_2
        # The loads of two steps ahead go out before this step's MMAs (none past K: masked off):
        # ptxas issues them after the MMAs that need this step's data, so one step ahead would
        # leave each step waiting for its own loads' round trip.
        w_2, x_2 = _step(a_ptr, w_ptr, w_offs, n < N, x_offs, t < M, col + (k + 2 * BLOCK_K), K)
        a_frag = gl.convert_layout(_as_fragments(w, KC), w_op)
        b_frag = gl.convert_layout(gl.permute(_as_fragments(x, KC), [0, 2, 1]), x_op)
        acc = mma_v2(a_frag, b_frag, acc)

    out = gl.sum(acc, axis=0)  # the warps' partial tiles, [ROWS, BLOCK_T]
    out_layout: gl.constexpr = gl.SliceLayout(0, mma)
    cn = n0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, out_layout))
    ct = t0 + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, out_layout))
    ptrs = c_ptr + gl.expand_dims(ct.to(gl.int64) * stride_cm, 0) + gl.expand_dims(cn, 1)
    mask = gl.expand_dims(ct < M, 0) & gl.expand_dims(cn < N, 1)
    gl.store(ptrs, out.to(c_ptr.dtype.element_ty), mask=mask)


class FragmmaPlan:
    """The launch on other tensors of the problem `prepare` checked (`gluon_survey.api`'s plan
    cache keys them on shapes, strides, dtypes and 16-byte alignment): the kernel's scalar
    arguments are the same for all of them, so a call only passes the three tensors."""

    def __init__(self, launcher: Launcher, scalars: tuple[int, ...]):
        self.launcher, self.scalars = launcher, scalars

    def launch(self, a, b, out, scales: Scales | None = None) -> None:
        self.launcher(a, b, out, *self.scalars)


def _constexprs(cfg: FragmmaConfig) -> dict[str, object]:
    return {"ROWS": cfg.ROWS, "BLOCK_T": cfg.BLOCK_T, "KC": cfg.KC}


def prepare(
    a, b, out, target: Target, cfg: FragmmaConfig | None = None, scales: Scales | None = None
) -> Launch:
    """out = a @ b, one program per ROWS weight rows and BLOCK_T tokens."""
    if scales is not None or a.element_size() == 1:
        raise ValueError(_FP8)
    if b.stride(0) != 1 and b.shape[0] > 1:  # K not contiguous (a K of 0 or 1 has no stride to ask)
        raise ValueError(_ROW_MAJOR)
    cfg = cfg or config_for(target.capability, a.shape[1])
    (M, K), N = a.shape, b.shape[1]
    grid = (triton.cdiv(N, cfg.ROWS) * triton.cdiv(M, cfg.BLOCK_T),)
    plan = FragmmaPlan(
        Launcher(fragmma_kernel, grid, _constexprs(cfg), cfg.num_warps),
        (M, N, K, a.stride(0), b.stride(1), out.stride(0)),
    )

    def fn():
        plan.launch(a, b, out)

    fn.plan = plan
    return Launch(fn, cfg.table() | {"grid": grid[0]})


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    """Every candidate, with the pointers and integers a launch on the llm weights specializes as
    multiples of 16 (`divisible`), so the SASS shows the loads such a launch runs."""
    if unsupported_reason(capability) or dtype not in ("float16", "bfloat16"):
        return []
    ty = {"float16": "*fp16", "bfloat16": "*bf16"}[dtype]
    specs = []
    for cfg in candidates(capability).values():
        constexprs = _constexprs(cfg)
        signature = {"a_ptr": ty, "w_ptr": ty, "c_ptr": ty, "M": "i32", "N": "i32", "K": "i32"}
        signature |= {"stride_am": "i32", "stride_w": "i32", "stride_cm": "i32"}
        specs.append(
            CompileSpec(
                "fragmma",
                f"fragmma_kernel {cfg.label}",
                fragmma_kernel,
                signature | dict.fromkeys(constexprs, "constexpr"),
                constexprs,
                {"num_warps": cfg.num_warps},
                config=cfg,
                divisible=("a_ptr", "w_ptr", "c_ptr", "N", "K", "stride_am", "stride_w", "stride_cm"),
            )
        )
    return specs
