"""Rung grouped-swapab: the grouped rung plus swap-AB, for the few rows an expert of decoding.

The idea: the grouped kernel's 128-row tile is a tile of tokens. In decoding each expert gets one
to a few of them (Qwen3-30B-A3B at 16 tokens: 128 token-slots over ~84 experts), so that tile's
MMA multiplies mostly padding and, worse, its 128 x 256 weight box makes few tiles where few
experts have rows (Mixtral down at one token: 2 experts x 16 column tiles = 32 programs for 132
SMs). Compute each expert's transpose instead, as the dense swapab rung does (kernels/swapab.py):
C^T[BLOCK_W, BLOCK_T] = W_e[rows, :] @ X_e^T, the weight's rows the wgmma's tall side (BLOCK_W =
64, one warpgroup's M) and the expert's tokens its narrow side (BLOCK_T = 16, 32 or 64). Every
stage of the ring is then a [64, BLOCK_K] weight slab and a sliver of tokens, the MMA does no
work on padding beyond BLOCK_T, and a tile covers 64 of the N columns instead of 256.

Why: at these sizes the product is a read of the touched experts' weights. Its floor is their
bytes (plus the tokens' and the output's) over rung 0's 3.0 TB/s (results/h100-memcpy), and what
reaches it is every SM streaming weight with enough bytes in flight: many tiles, deep rings.

Status: passes tests/test_grouped_gpu.py on an H100 (commit 280c632). On the 72 decode cells of
`--shapes moe` (T <= 64) it ran at 1.06-1.56x torch._grouped_mm, geomean 1.23x, a median 0.98 of
rung 0's bandwidth (results/h100-moe-decode; docs/perf-notes.md, entry 58: the floor, the
prediction and the result). `gluon_survey.grouped_matmul` runs it up to
`grouped_auto.DECODE_ROWS` token-slots, in 16-bit and in fp8. The fp8 path (below) passed
its GPU tests on an H100 (commit ecfd14d) and ran the same 72 cells in fp8-row at 1.254x
torch._scaled_grouped_mm geomean, none below 1.00x (results/h100-moe-fp8-swapab; entries 61 and
63: the prediction and the result).

Everything but the MMA's operands and the epilogue is the grouped kernel's (kernels/grouped.py),
imported from there, not copied:

* The schedule. A tile is (expert e, chunk c of BLOCK_T of its rows, weight block of BLOCK_W
  rows of w[e]); the compact list holds cdiv(count_e, BLOCK_T) * cdiv(N, BLOCK_W) tiles for each
  expert with rows, which is exactly grouped's list with BLOCK_M = BLOCK_T and BLOCK_N =
  BLOCK_W, so `_schedule` (each program's prefix scan over the experts' tile counts, from the
  device-side offsets: no host sync, CUDA-graph capturable) and `_tile_of` (tile -> expert, its
  rows, chunk, weight block) serve unchanged. An expert with more rows than BLOCK_T is several
  chunk tiles rather than a loop over chunks inside one tile: any routing is handled the same,
  the chunks of a big expert run on several SMs at once instead of one after another on one,
  and the tile order (grouped, GROUP_M = 16 chunks fastest) puts the chunks of one weight block
  side by side in time, so the block comes from HBM once and from L2 for the others.
* The flat TMA ring (`_next_load`): the loads run STAGES - 1 (tile, K step) ahead of the MMAs
  across tile boundaries, so the next tile's weight is in flight during a tile's last MMAs and its
  epilogue. That is what keeps HBM busy when tiles are short (Qwen3 down: K = 768, three K steps a
  tile).
* The epilogue (`_store_rows`): the accumulator, transposed in registers to [BLOCK_T, BLOCK_W],
  is stored with a mask (rows < the expert's count, columns < N); a token box that runs into the
  next expert's rows, or a weight box past N into the next expert's weight, only adds to rows or
  columns that are not written.

The rings are the dense swapab's whole-K rings, measured there for one program per SM streaming
a 64-row weight slab (kernels/swapab.py, WHOLE_K): BLOCK_K 256 and 4 stages at 16 and 32 tokens,
128 and 6 at 64; 160-192 KB in all, 96-128 KB of weight in flight per SM.

fp8 e4m3 with row-wise scales (SCALING 2; `FP8_CONFIGS`), for the decode cells where the 128-row
kernel's fp8 missed torch._scaled_grouped_mm (Mixtral down at one token: 32 programs of 128x256).
The same kernel: fp8 wgmma reads both operands K-major, and both are here (the weight slab, the
MMA's A, is a K-major box of the [E * N, K] weight; the tokens' [BLOCK_T, BLOCK_K] box is K-major,
permuted into the B operand), so only the element type changes, and the dequantization is the
128-row kernel's (`_scale_rows`, `_scale_columns`), on C's fp32 tile after the transpose: rows
are tokens (scale_x[row]), columns the expert's output channels, the weight's rows
(scale_w[e, column]). The rings keep the 16-bit rings' bytes, 160-192 KB, in K steps of 256
elements: at 16 and 32 tokens a stage is half as many bytes, so 8 stages where 16-bit has 4 (7/8
of the ring in flight against 3/4, and the surveyed models' K cut into the same steps as in
16-bit: Qwen3 down's 768 in three); at 64 tokens 256-wide steps at the 16-bit ring's 6 stages (it
has 128-wide ones, since 256 did not fit in 2-byte elements). Registers (triton 3.6, N unknown):
54, 64 and 123 at 16, 32 and 64 tokens, no spills.

BLOCK_W = 64 and the grid. A 64-row weight block is the smallest tile a warpgroup's wgmma can
take, so it makes the most tiles. The fewest come at one token, where at most top-k experts have
rows: top-k x N / 64 tiles, Mixtral down (N 4096) 2 x 64 = 128 for 132 SMs, Qwen3 gate_up
(N 1536) 8 x 24 = 192, GPT-OSS down (N 2880) 4 x 45 = 180, every other surveyed projection more.
So no split along K is needed to fill the GPU for these models; a model with one expert a token
and N up to 4096 would leave SMs idle at one token (N / 64 tiles), and a split of K over programs
(the splitk rung's partial sums) is then the lever. BLOCK_W = 128 would halve the token bytes
read per weight byte (from L2: tokens are few) but also the tiles, leaving Mixtral down at 64
programs. The grid is min(SMs, `tile_bound`), one program per SM (the ring takes most of its
shared memory).

BLOCK_T (`config_for`): the narrowest of 16, 32, 64 that holds the rows an expert gets when the
S token-slots spread over as many experts as they can reach, ceil(S / min(E, S)): 16 for every
decode cell of the surveyed models (at most 16 rows an expert on average), wider for few experts
(E = 1: all S rows). Experts above the average are several chunk tiles (above). wgmma's N is the
token tile, so 16 is a 64x16x16 instruction: at 1-2 real rows an expert the MMA does 8-16x the
work it needs, which is still far under the weight's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch import CompileSpec, Launch, Scales, Target
from .arch import select_mma
from .common import Ring, init_barriers, invalidate_barriers, mbarrier
from .grouped import (
    _POINTER_TYPES,
    MAX_EXPERTS,
    GroupedConfig,
    _load_coords,
    _next_load,
    _scale_columns,
    _scale_rows,
    _schedule,
    _store_rows,
    _tile_of,
    check_operand_kind,
    experts_pad,
    plan_of,
    spec_of,
    unsupported_reason,
)
from .plan import FP8, GroupedPlan

__all__ = [
    "CONFIGS",
    "FP8_CONFIGS",
    "TOKENS",
    "WGMMA_M",
    "GroupedSwapABConfig",
    "compile_specs",
    "config_for",
    "constexprs",
    "grouped_swapab_kernel",
    "plan",
    "prepare",
    "rows_per_expert",
    "unsupported_reason",
]

WGMMA_M = 64  # rows of the weight one warpgroup's wgmma takes


@dataclass(frozen=True)
class GroupedSwapABConfig(GroupedConfig):
    """The grouped config in C's terms, as every mode's table shows it: BLOCK_M is the token tile
    (BLOCK_T, the wgmma's N), BLOCK_N the weight rows a tile covers (BLOCK_W, its M). The epilogue
    stores the whole tile at once (EPILOGUE_N = BLOCK_N)."""

    BLOCK_M: int = 16
    BLOCK_N: int = WGMMA_M
    BLOCK_K: int = 256
    STAGES: int = 4
    num_warps: int = 4
    EPILOGUE_N: int = WGMMA_M

    def __post_init__(self):
        if self.BLOCK_N % WGMMA_M:
            raise ValueError(
                f"BLOCK_N ({self.BLOCK_N}, the weight rows of a tile) must be a multiple of {WGMMA_M}, "
                "the rows of one warpgroup's wgmma"
            )
        if self.BLOCK_M % 8 or not 8 <= self.BLOCK_M <= 256:
            raise ValueError(
                f"BLOCK_M ({self.BLOCK_M}, the token tile: the wgmma's N) must be a multiple of 8 "
                "from 8 to 256"
            )
        super().__post_init__()

    @property
    def BLOCK_T(self) -> int:
        return self.BLOCK_M

    @property
    def BLOCK_W(self) -> int:
        return self.BLOCK_N

    @property
    def label(self) -> str:
        fp8 = " fp8" if self.ELEM_BYTES == 1 else ""
        return f"W{self.BLOCK_W}xT{self.BLOCK_T}x{self.BLOCK_K}{fp8} s{self.STAGES} w{self.num_warps}"

    def table(self) -> dict[str, object]:
        return super().table() | {"swap_ab": True}


TOKENS = (16, 32, 64)  # the token tiles, narrowest first
# Hopper: the dense swapab's whole-K rings (its WHOLE_K: (BLOCK_K, STAGES) by token width), one
# program per SM.
CONFIGS = {
    9: {
        16: GroupedSwapABConfig(BLOCK_M=16, BLOCK_K=256, STAGES=4),
        32: GroupedSwapABConfig(BLOCK_M=32, BLOCK_K=256, STAGES=4),
        64: GroupedSwapABConfig(BLOCK_M=64, BLOCK_K=128, STAGES=6),
    }
}
# fp8 e4m3 (row-wise scales): the same ring bytes a program, 160-192 KB, in 1-byte elements, with
# K steps of 256 at every token tile (fp8 wgmma takes 32 of K an instruction: 8 a step). At 16 and
# 32 tokens that halves a stage's bytes, so the ring holds twice the stages (8): more of it in
# flight (7/8 against 3/4) and the same K steps as in 16-bit, so the surveyed models' K split as
# they do there (768 and 2048 in whole steps; 512-wide steps at 4 stages, the dense fp8 rung's
# `fp8_of` rule, would run Qwen3 down's K = 768 as a full step and a half-empty one). At 64 tokens
# the 16-bit ring's 128-wide steps widen to 256 at the same 6 stages (in 16-bit 256 did not fit).
FP8_CONFIGS = {
    9: {
        16: replace(CONFIGS[9][16], STAGES=8, ELEM_BYTES=1),
        32: replace(CONFIGS[9][32], STAGES=8, ELEM_BYTES=1),
        64: replace(CONFIGS[9][64], BLOCK_K=256, ELEM_BYTES=1),
    }
}


def rows_per_expert(S: int, E: int) -> int:
    """The rows each expert gets when S token-slots spread over as many of the E experts as they
    can reach: ceil(S / min(E, S)) (0 for S = 0)."""
    return -(-S // min(E, S)) if S else 0


def config_for(capability: tuple[int, int], S: int, E: int, fp8: bool = False) -> GroupedSwapABConfig:
    """The config for S token-slots over E experts: the narrowest token tile that holds
    `rows_per_expert(S, E)` (the widest beyond); with `fp8` operands, the fp8 config of that tile."""
    rows = rows_per_expert(S, E)
    width = next((t for t in TOKENS if t >= rows), TOKENS[-1])
    return (FP8_CONFIGS if fp8 else CONFIGS)[capability[0]][width]


@gluon.jit
def grouped_swapab_kernel(
    x_desc,
    w_desc,
    out,
    offs,
    scale_x,
    scale_w,
    S,
    N,
    E,
    MMA: gl.constexpr,
    STAGES: gl.constexpr,
    GROUP_M: gl.constexpr,
    EXPERTS_PAD: gl.constexpr,
    SCALING: gl.constexpr,
):
    """x_desc: the tokens x [S, K], block [BLOCK_T, BLOCK_K]; w_desc: the weight as [E * N, K],
    block [BLOCK_W, BLOCK_K]; out: row-major [S, N]; offs: int32 [E], cumulative ends of the
    experts' rows; EXPERTS_PAD: a power of two >= E, at least 32. The grouped kernel's loop
    with the operands swapped: C^T += W @ X^T, then C's [BLOCK_T, BLOCK_W] tile stored. fp8 e4m3
    operands (SCALING 2, row-wise) come with the grouped kernel's fp32 scales, scale_x [S] and
    scale_w [E, N], applied to C's fp32 tile after the transpose: out = (x @ w[e]) * scale_x[row]
    * scale_w[e, column]. SCALING 0: fp16/bf16, and scale_x, scale_w are None."""
    BLOCK_T: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_W: gl.constexpr = w_desc.block_type.shape[0]
    dtype: gl.constexpr = x_desc.dtype
    k_steps = gl.cdiv(x_desc.shape[1], x_desc.block_type.shape[1])
    tiles_w = gl.cdiv(N, BLOCK_W)
    prefix, total = _schedule(offs, S, E, tiles_w, BLOCK_T, EXPERTS_PAD)

    x_bufs = gl.allocate_shared_memory(dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)

    # Producer state: the next load is K step p[1] of tile p[0] (token row p[3], weight row p[4])
    # into ring position p[2].
    t_row, w_row = _load_coords(gl.program_id(0), prefix, offs, S, N, E, tiles_w, BLOCK_T, BLOCK_W, GROUP_M)
    p = (gl.program_id(0), 0, Ring.start(STAGES), t_row, w_row)
    for _ in gl.static_range(STAGES - 1):
        p = _next_load(
            x_desc, w_desc, p, total, prefix, offs, S, N, E, tiles_w, k_steps, x_bufs, w_bufs, ready, GROUP_M
        )

    mma = MMA.initialize(dtype, BLOCK_W, BLOCK_T, gl.num_warps())
    ring = Ring.start(STAGES)  # the consumer's position, over all of this program's K steps
    for t in range(gl.program_id(0), total, gl.num_programs(0)):
        for _k in range(k_steps):
            ring.wait_filled(ready)
            slot = ring.slot()
            # Swapped: the weight slab [BLOCK_W, BLOCK_K] is the MMA's A (K-major), the tokens'
            # [BLOCK_T, BLOCK_K], transposed, its B.
            mma = mma.issue(w_bufs.index(slot), x_bufs.index(slot).permute((1, 0)))
            mma = mma.wait(1)  # retires MMA k-1, whose stage is the one refilled next
            p = _next_load(
                x_desc, w_desc, p, total, prefix, offs, S, N,
                E, tiles_w, k_steps, x_bufs, w_bufs, ready, GROUP_M,
            )  # fmt: skip
            ring = ring.next()
        # Where this tile goes, found while its last MMA runs: chunk `chunk` of expert e's rows,
        # weight block `block` (C's columns).
        e, start, count, chunk, block = _tile_of(t, prefix, offs, S, E, tiles_w, BLOCK_T, GROUP_M)
        acc, mma = mma.take_result()
        # C's [BLOCK_T, BLOCK_W] tile; fp8: its rows are tokens (scale_x), its columns the expert's
        # output channels, the weight rows (scale_w[e])
        c_tile = acc.permute((1, 0))
        c_tile = _scale_rows(c_tile, scale_x, start, count, chunk * BLOCK_T, SCALING)
        c_tile = _scale_columns(c_tile, scale_w, e, block * BLOCK_W, N, SCALING)
        _store_rows(out, c_tile, start, count, chunk * BLOCK_T, block * BLOCK_W, N)
    invalidate_barriers(ready, STAGES)


def constexprs(
    cfg: GroupedSwapABConfig, capability: tuple[int, int], E: int, scaling: int = 0
) -> dict[str, object]:
    """The kernel's constexprs, for its launch and its compile specs alike; `scaling` is the SCALING
    code (0 without scales, 2 row-wise)."""
    return {
        "MMA": select_mma(capability),
        "STAGES": cfg.STAGES,
        "GROUP_M": cfg.GROUP_M,
        "EXPERTS_PAD": experts_pad(E),
        "SCALING": scaling,
    }


def plan(
    x, w, target: Target, cfg: GroupedSwapABConfig | None = None, scales: Scales | None = None
) -> GroupedPlan:
    """The plan of out[rows of e] = x[rows of e] @ w[e] for every expert e, on the operands
    `kernels.grouped.plan` takes (checked by `gluon_survey.grouped`), fp8 e4m3 ones with their
    row-wise `scales` ([S] and [E, N]) and a bf16 or fp16 `out`. `cfg`: the config to run
    (`config_for`'s by default); one of the other kind of operands is a ValueError. The x box is
    [BLOCK_T, BLOCK_K], the weight box [BLOCK_W, BLOCK_K]: the 128-row kernel's, in C's terms."""
    reason = unsupported_reason(target.capability)
    if reason:
        raise RuntimeError(reason)
    fp8 = scales is not None
    cfg = cfg or config_for(target.capability, x.shape[0], w.shape[0], fp8)
    check_operand_kind("grouped-swapab", cfg, x, scales)
    values = constexprs(cfg, target.capability, w.shape[0], scales.code if fp8 else 0)
    return plan_of(grouped_swapab_kernel, values, x, w, target, cfg, scales)


def prepare(
    x, w, offs, out, target: Target, cfg: GroupedSwapABConfig | None = None, scales: Scales | None = None
) -> Launch:
    """A ready launch of `plan`'s plan on these tensors (what the driver times)."""
    return plan(x, w, target, cfg, scales).bind(x, w, offs, out, scales)


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    """The specs of the token tiles this architecture runs (16, 32, 64), for a compile without a
    GPU (none where the kernel does not run, or for other dtypes), each for the most experts
    (MAX_EXPERTS) and with S, N, E plain int32 arguments (scalar stores), out and offs 16-byte
    aligned: as `kernels.grouped.compile_specs`. fp8 ("float8_e4m3fn") compiles the fp8 configs
    with row-wise scales and a bf16 output, as the 128-row kernel's fp8 specs do."""
    if unsupported_reason(capability) or dtype not in (*_POINTER_TYPES, FP8):
        return []
    fp8, mode = dtype == FP8, "grouped-swapab"
    scaling = 2 if fp8 else 0
    return [
        spec_of(grouped_swapab_kernel, cfg, constexprs(cfg, capability, MAX_EXPERTS, scaling), dtype, mode)
        for cfg in (FP8_CONFIGS if fp8 else CONFIGS)[capability[0]].values()
    ]
