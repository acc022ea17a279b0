"""Rung swapab: splitk + swap-AB, for the few-token GEMMs of decoding.

The idea: a wgmma (and a tcgen05 MMA) is at least 64 rows tall but as narrow as 8 columns. At
M = 1..64 tokens a 64-row tile of C is mostly padding, and the A tile it loads is mostly zeros.
Compute the transpose instead, C^T = W X^T: the weight's N rows fill the MMA's tall side
(BLOCK_W rows of W per tile) and the tokens become its narrow side (BLOCK_T = 8..64 columns), so
the MMA does no work on padding beyond rounding M up to a multiple of 8, every stage of the ring
holds a [BLOCK_W, BLOCK_K] slab of the weight and only a sliver of tokens, and more stages fit.
The accumulator is a [BLOCK_W, BLOCK_T] tile of C^T, transposed in registers for the epilogue
(or for `split_reduce`'s partials). Everything else is splitk's: Pipelined's ring over a slice of
K (`ring_mma`, with the operands swapped), the same partial sums, SPLIT_K chosen by `split_for`.

fp8 (e4m3) is splitk's too: 128-wide K steps, the weight K-major (the MMA's A) and the tokens
K-major (its B, transposed), and the scales multiply C's summed tile once, after the transpose,
so scale_a runs along the tokens (C's rows) and scale_b along the weight's rows (C's columns).
The bias is added after the transpose too: it runs along the weight's rows, the accumulator's
rows (the MMA's M), which are C's columns (`store_sum`).

The whole-K tiles (SPLIT_K 1, `WHOLE_K`) may also run persistent (`PERSISTENT`,
`swapab_persistent_kernel`): as many programs as the GPU has ring slots walk the 64-row tiles,
on one ring whose loads run on into a program's next tile (the persistent rung's `next_load`),
so that a weight with more tiles than slots pays a program's start-up once instead of once a
wave. Measured kernel-only in fp8 on an H200 (docs/perf-notes.md, entry 90): 0.6-3.8 µs faster at
2-16 tokens where the tiles overflow the slots, nothing at or under one wave; the fp8 rule runs it
there (`choice.FP8_PERSISTENT_M`).

Both kernels wait for the kernel before them before their first global access, and release the
next one, so that splitk's launch can start them as programmatic dependents (`plan.PDL`, off by
default).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch import CompileSpec, Launch, Scales, Target, b_layout, is_kmajor
from .arch import select_mma, unsupported_reason
from .common import (
    OUT_BYTES,
    Ring,
    b_operand,
    grouped_tile,
    init_barriers,
    invalidate_barriers,
    mbarrier,
    release_next_grid,
    wait_for_previous_grid,
)
from .persistent import next_load, tile_offsets
from .pipelined import ring_mma
from .plan import FP8, make_descriptors
from .splitk import SplitKConfig, check_operands, fp8_of, launch, split_reduce, splitk_specs, store_sum

__all__ = [
    "CONFIGS",
    "FP8_CONFIGS",
    "RINGS",
    "WHOLE_K",
    "WHOLE_K_SHARED",
    "WHOLE_K_TALL",
    "SwapABConfig",
    "candidates",
    "compile_specs",
    "config_for",
    "prepare",
    "swapab_kernel",
    "swapab_persistent_kernel",
    "unsupported_reason",
    "whole_k",
]


@dataclass(frozen=True)
class SwapABConfig(SplitKConfig):
    """BLOCK_M is BLOCK_W (rows of the weight, the MMA's tall side), BLOCK_N is BLOCK_T (tokens).
    PERSISTENT 1: the whole-K tile (SPLIT_K 1) walked by persistent programs
    (`swapab_persistent_kernel`)."""

    PERSISTENT: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.PERSISTENT not in (0, 1) or (self.PERSISTENT and self.SPLIT_K != 1):
            raise ValueError(
                f"PERSISTENT is 0 or 1, and a persistent tile takes all of K (SPLIT_K=1); got "
                f"PERSISTENT={self.PERSISTENT}, SPLIT_K={self.SPLIT_K}"
            )

    @property
    def label(self) -> str:
        split = self.SPLIT_K or "auto"
        fp8 = " fp8" if self.ELEM_BYTES == 1 else ""
        persistent = " persistent" if self.PERSISTENT else ""
        return (
            f"W{self.BLOCK_M}xT{self.BLOCK_N}x{self.BLOCK_K}{fp8} s{self.STAGES} w{self.num_warps} k{split}"
            f"{persistent}"
        )

    def smem_bytes(self) -> int:
        """The ring's; a persistent program also keeps C's [BLOCK_T, BLOCK_W] tile beside it, since
        the ring holds the next tile's loads while a tile is stored."""
        ring = super().smem_bytes()
        return ring + self.BLOCK_M * self.BLOCK_N * OUT_BYTES if self.PERSISTENT else ring

    def table(self) -> dict[str, object]:
        # In C's terms, as the tables show every mode: a tile is BLOCK_T tokens by BLOCK_W columns.
        swapped = {"BLOCK_M": self.BLOCK_N, "BLOCK_N": self.BLOCK_M, "swap_ab": True}
        return super().table() | swapped | ({"persistent": True} if self.PERSISTENT else {})


# 128 weight rows by 16 tokens (M <= 16, the common decode batch), 8 stages of 18 KB: one program
# per SM, each streaming a long slice of K through a deep ring. Measured against 4 stages (three
# programs per SM, K cut into three times as many slices), kernel-only, on 4096- to 10240-wide
# weights: 8 stages 3-19 % faster (docs/perf-notes.md, entry 23). The same tile on Blackwell
# (tcgen05 is as narrow as 8 columns at M = 128).
CONFIGS = {
    9: SwapABConfig(BLOCK_M=128, BLOCK_N=16, BLOCK_K=64, STAGES=8, num_warps=4, GROUP_M=1),
    10: SwapABConfig(BLOCK_M=128, BLOCK_N=16, BLOCK_K=64, STAGES=8, num_warps=4, GROUP_M=1),
}
# fp8: 128-wide K steps, the same 18 KB a stage (`fp8_of`).
FP8_CONFIGS = {major: fp8_of(cfg) for major, cfg in CONFIGS.items()}
TOKENS = (16, 32, 64, 128)  # tile widths `tune` tries: M up to 16, 32, 64, 128 in one tile


@gluon.jit
def swapped_operands(x_buf, w_buf, W_KMAJOR: gl.constexpr):
    """C^T += W @ X^T: the weight's [BW, BK] tile is the MMA's A, the tokens' [BT, BK] tile,
    transposed, its B."""
    return b_operand(w_buf, W_KMAJOR).permute((1, 0)), x_buf.permute((1, 0))


@gluon.jit(do_not_specialize_on_alignment=["bias"])
def swapab_kernel(
    x_desc,
    w_desc,
    c_desc,
    scale_a,
    scale_b,
    bias,
    partials,
    counters,
    MMA: gl.constexpr,
    W_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    SPLIT_K: gl.constexpr,
    SCALING: gl.constexpr,
    HAS_BIAS: gl.constexpr,
):
    """Slice `split` of K of C^T's [BLOCK_W, BLOCK_T] tile, stored as C's [BLOCK_T, BLOCK_W] tile
    (for fp8 operands times the scales of its tokens and columns, SCALING 1 or 2; None scales and
    SCALING 0 for fp16/bf16; then + the bias of its columns, the weight's rows, with HAS_BIAS)."""
    BLOCK_T: gl.constexpr = c_desc.block_type.shape[0]  # tokens: rows of C, the MMA's N
    BLOCK_W: gl.constexpr = c_desc.block_type.shape[1]  # weight rows: columns of C, the MMA's M
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    k_steps = gl.cdiv(x_desc.shape[1], BLOCK_K)
    per_split = gl.cdiv(k_steps, SPLIT_K)

    tile = gl.program_id(0) // SPLIT_K
    split = gl.program_id(0) % SPLIT_K
    num_pid_w = gl.cdiv(c_desc.shape[1], BLOCK_W)
    pid_w, pid_t = grouped_tile(tile, num_pid_w, gl.cdiv(c_desc.shape[0], BLOCK_T), GROUP_M)
    off_w = pid_w * BLOCK_W
    off_t = pid_t * BLOCK_T
    first = split * per_split
    steps = gl.minimum(per_split, k_steps - first)

    # The ring loads X as "A" and W as "B" tiles, as every rung does; only the MMA sees them swapped.
    mma = MMA.initialize(x_desc.dtype, BLOCK_W, BLOCK_T, gl.num_warps())
    acc = ring_mma(x_desc, w_desc, off_t, off_w, first, steps, mma, STAGES, W_KMAJOR, swapped_operands)
    c_tile = acc.permute((1, 0))  # [BLOCK_T, BLOCK_W]: C's tile at (off_t, off_w)
    if SPLIT_K == 1:
        store_sum(c_desc, c_tile, off_t, off_w, scale_a, scale_b, SCALING, bias, HAS_BIAS)
    else:
        split_reduce(
            c_desc,
            c_tile,
            partials,
            counters,
            tile,
            split,
            SPLIT_K,
            off_t,
            off_w,
            scale_a,
            scale_b,
            SCALING,
            bias,
            HAS_BIAS,
        )


@gluon.jit(do_not_specialize_on_alignment=["bias"])
def swapab_persistent_kernel(
    x_desc,
    w_desc,
    c_desc,
    scale_a,
    scale_b,
    bias,
    partials,
    counters,
    MMA: gl.constexpr,
    W_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    SPLIT_K: gl.constexpr,
    SCALING: gl.constexpr,
    HAS_BIAS: gl.constexpr,
):
    """The whole-K tile walked by a persistent program (`PERSISTENT`): tiles pid, pid + P, ... (P
    programs, `tile_offsets`' grouped order with the token tiles of one weight block side by
    side), all of K each, through one ring whose loads run STAGES - 1 steps ahead across tile
    boundaries (the persistent rung's `next_load`), so that a program's next tile is in flight
    while it stores this one. SPLIT_K is 1 (`partials` and `counters`, the split launch's
    arguments, are not read)."""
    gl.static_assert(SPLIT_K == 1, "a persistent tile takes all of K")
    BLOCK_T: gl.constexpr = c_desc.block_type.shape[0]  # tokens: rows of C, the MMA's N
    BLOCK_W: gl.constexpr = c_desc.block_type.shape[1]  # weight rows: columns of C, the MMA's M
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    dtype: gl.constexpr = x_desc.dtype
    num_pid_t = gl.cdiv(c_desc.shape[0], BLOCK_T)
    num_pid_w = gl.cdiv(c_desc.shape[1], BLOCK_W)
    k_steps = gl.cdiv(x_desc.shape[1], BLOCK_K)

    x_bufs = gl.allocate_shared_memory(dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)
    release_next_grid()
    wait_for_previous_grid()

    # Producer state (tile, K step, ring position, token offset, weight offset), as the persistent
    # rung's: X is its A, W its K-major B.
    off_t, off_w = tile_offsets(gl.program_id(0), num_pid_t, num_pid_w, BLOCK_T, BLOCK_W, GROUP_M)
    p = (gl.program_id(0), 0, Ring.start(STAGES), off_t, off_w)
    for _ in gl.static_range(STAGES - 1):
        p = next_load(
            x_desc, w_desc, p, num_pid_t, num_pid_w, k_steps, x_bufs, w_bufs, ready, W_KMAJOR, GROUP_M
        )

    mma = MMA.initialize(dtype, BLOCK_W, BLOCK_T, gl.num_warps())
    ring = Ring.start(STAGES)  # the consumer's position, over all of this program's K steps
    for tile in range(gl.program_id(0), num_pid_t * num_pid_w, gl.num_programs(0)):
        for _step in range(k_steps):
            ring.wait_filled(ready)
            slot = ring.slot()
            lhs, rhs = swapped_operands(x_bufs.index(slot), w_bufs.index(slot), W_KMAJOR)
            mma = mma.issue(lhs, rhs)
            mma = mma.wait(1)  # retires the previous MMA, whose stage the next load refills
            p = next_load(
                x_desc, w_desc, p, num_pid_t, num_pid_w, k_steps, x_bufs, w_bufs, ready, W_KMAJOR, GROUP_M
            )
            ring = ring.next()
        acc, mma = mma.take_result()
        off_t, off_w = tile_offsets(tile, num_pid_t, num_pid_w, BLOCK_T, BLOCK_W, GROUP_M)
        store_sum(c_desc, acc.permute((1, 0)), off_t, off_w, scale_a, scale_b, SCALING, bias, HAS_BIAS)
    invalidate_barriers(ready, STAGES)


def _blocks(cfg: SwapABConfig, layout: str) -> tuple[list[int], list[int], list[int]]:
    """TMA block shapes of X (the tokens, [BT, BK]), W ([BW, BK] of the [N, K] weight for layout
    "t", [BK, BW] of a row-major [K, N] B) and C ([BT, BW])."""
    BW, BT, BK = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
    return [BT, BK], ([BW, BK] if is_kmajor(layout) else [BK, BW]), [BT, BW]


def _constexprs(cfg: SwapABConfig, capability: tuple[int, int], layout: str, split: int) -> dict[str, object]:
    return {
        "MMA": select_mma(capability),
        "W_KMAJOR": is_kmajor(layout),
        "GROUP_M": cfg.GROUP_M,
        "STAGES": cfg.STAGES,
        "SPLIT_K": split,
    }


# Whole K, no split: one 64-row tile of the weight per program streams all of K (SPLIT_K 1), so no
# partial is written or summed, and a 4096-wide weight is 64 programs, each pulling twice an SM's
# share of HBM (which one SM can: docs/perf-notes.md, entry 26). Per token width: (BLOCK_K, STAGES),
# the ring one program per SM holds. Kernel-only on the H100 (results/experiments/h100-slab-probe):
# 13.5-13.6 µs at 1 and 16 x 4096 x 4096 against slab's 14.7 and cuBLAS's 15.3-15.6, and 43.7 µs at
# 64 x 4096 x 14336 against cuBLAS's 44.5.
WHOLE_K = {16: (256, 4), 32: (256, 4), 64: (128, 6)}
# The same tiles on rings half as deep in bytes (K steps half as wide), so that two programs share
# an SM: for weights with more 64-row tiles than the GPU has SMs, where one program per SM would
# leave a second, partial wave. fp8 on the H100, kernel-only (results/experiments/h100-fp8-rings):
# at 10240 x 8192 (160 tiles) and 28672 x 4096 (448) 1-5 % faster than the WHOLE_K rings, at
# 4096 x 14336 (64 tiles) 4-17 % slower.
WHOLE_K_SHARED = {t: (k // 2, stages) for t, (k, stages) in WHOLE_K.items()}
# A tile of 128 weight rows (the wgmma's 64 rows twice) at 64 tokens, on a ring of 192 KB, one
# program an SM: half the programs, and half the token bytes each 64-row tile reads from L2. fp8
# with row-wise scales on the H100, kernel-only at M = 64 (results/experiments/h100-tall-tile;
# docs/perf-notes.md, entry 37): 1-4 % faster than the shared ring at 10240 x 8192 and 28672 x
# 4096, where the 64-row tiles overflow the SMs; within 0.4 % of the package's ring at 57344 x
# 8192; 3-31 % slower where it leaves fewer programs than SMs, 8192 x 8192 included (the halved
# token bytes alone bought nothing).
WHOLE_K_TALL = {64: (128, 4)}
# name -> (weight rows a tile, {token width: (BLOCK_K in 16-bit elements, STAGES)})
RINGS = {"one": (64, WHOLE_K), "shared": (64, WHOLE_K_SHARED), "tall": (128, WHOLE_K_TALL)}
# The rings whose whole-K tiles `tune` may also run persistent (PERSISTENT 1): a program per ring
# slot of the GPU (one an SM on "one", two on "shared") walks the 64-row tiles, so that a weight
# with more of them than slots pays a program's start once, not once a wave (docs/perf-notes.md,
# entry 89: the prediction; entry 90: 0.6-3.8 µs faster kernel-only where the tiles overflow the
# slots, on the H200, which the fp8 rule now uses). GROUP_M 8 puts the token tiles of one weight
# block side by side in time, as GROUP_M 1 does in the one-tile-a-program kernel's transposed order.
PERSISTENT_RINGS = ("one", "shared")
PERSISTENT_GROUP_M = 8


def candidates(capability: tuple[int, int], fp8: bool = False) -> dict[str, SwapABConfig]:
    """The configs `gluon-survey tune` may pick, by label: the tile at each width of TOKENS, the
    whole-K tiles (RINGS) at 16, 32 and 64 tokens, and those of PERSISTENT_RINGS again, persistent."""
    base = config_for(capability, 0, fp8)
    # 128 tokens: a 128x128 fp32 accumulator on 4 warps would spill (inspect), so 8 warps and 3 stages.
    tiles = [
        replace(base, BLOCK_N=t) if t < 128 else replace(base, BLOCK_N=t, STAGES=3, num_warps=8)
        for t in TOKENS
    ]
    scale = 2 if fp8 else 1  # fp8: K steps twice as wide, the same bytes a stage (`fp8_of`)
    whole = {
        name: [
            replace(base, BLOCK_M=rows, BLOCK_N=t, BLOCK_K=k * scale, STAGES=stages, SPLIT_K=1)
            for t, (k, stages) in ring.items()
        ]
        for name, (rows, ring) in RINGS.items()
    }
    tiles += [c for ring in whole.values() for c in ring]
    tiles += [
        replace(c, PERSISTENT=1, GROUP_M=PERSISTENT_GROUP_M) for name in PERSISTENT_RINGS for c in whole[name]
    ]
    return {c.label: c for c in tiles}


def whole_k(
    capability: tuple[int, int], M: int, fp8: bool = False, ring: str = "one", persistent: bool = False
) -> SwapABConfig:
    """The whole-K candidate on `ring` (a key of RINGS) whose token tile is the narrowest of that
    ring's that holds M (the widest beyond); `persistent`: the same tile walked by persistent
    programs (a ring of PERSISTENT_RINGS only)."""
    if persistent and ring not in PERSISTENT_RINGS:
        raise ValueError(
            f"no persistent whole-K tile on the {ring!r} ring; rings: {', '.join(PERSISTENT_RINGS)}"
        )
    rows, widths = RINGS[ring]
    width = next((t for t in sorted(widths) if t >= M), max(widths))
    k = widths[width][0] * (2 if fp8 else 1)
    return next(
        c
        for c in candidates(capability, fp8).values()
        if c.SPLIT_K == 1
        and bool(c.PERSISTENT) == persistent
        and (rows, width, k) == (c.BLOCK_M, c.BLOCK_N, c.BLOCK_K)
    )


def config_for(capability: tuple[int, int], K: int, fp8: bool = False) -> SwapABConfig:
    return (FP8_CONFIGS if fp8 else CONFIGS)[capability[0]]


def prepare(
    a, b, out, target: Target, cfg: SwapABConfig | None = None, scales: Scales | None = None, bias=None
) -> Launch:
    cfg = cfg or config_for(target.capability, a.shape[1], scales is not None)
    layout = b_layout(b)
    check_operands("swapab", cfg, layout, scales)
    descs = make_descriptors(a, b, out, cfg, layout, _blocks(cfg, layout))
    tiles = triton.cdiv(out.shape[1], cfg.BLOCK_M) * triton.cdiv(out.shape[0], cfg.BLOCK_N)
    kernel, programs = swapab_kernel, None
    if cfg.PERSISTENT:  # a program per ring slot of the GPU, at most one a tile
        kernel, programs = (
            swapab_persistent_kernel,
            min(tiles, target.sm_count * cfg.blocks_per_sm()) or tiles,
        )
    return launch(
        kernel,
        tiles,
        a,
        b,
        out,
        target,
        cfg,
        descs,
        lambda split: _constexprs(cfg, target.capability, layout, split),
        scales,
        bias,
        programs,
    )


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    """Every config `tune` may pick (`candidates`), both B layouts (fp8: "t"), with the reduction
    compiled in (SPLIT_K 4), the persistent ones whole (SPLIT_K 1)."""
    if unsupported_reason(capability):
        return []
    specs = []
    for cfg in candidates(capability, dtype == FP8).values():
        kernel, split = (swapab_persistent_kernel, 1) if cfg.PERSISTENT else (swapab_kernel, 4)
        specs += splitk_specs(
            "swapab",
            kernel,
            cfg,
            dtype,
            ("x_desc", "w_desc", "c_desc"),
            lambda layout, cfg=cfg: _blocks(cfg, layout),
            lambda layout, cfg=cfg, split=split: _constexprs(cfg, capability, layout, split),
        )
    return specs
