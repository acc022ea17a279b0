"""Rung streamk: swapab's whole-K tile + stream-K, so that every SM streams the same share.

The idea: swapab's whole-K tile (one 64-row tile of the weight per program over all of K, no
partial sums) makes as many programs as the weight has 64-row tiles, which is the wrong count
for most weights: 64 programs on a 4096-wide weight leave 68 of 132 SMs idle, and 160 on a
10240-wide one run as a full wave and then a second of 28 with the rest of the GPU idle. Stream-K
deals out the work instead of the tiles: the flat sequence of (tile, K step) iterations, T of
them, is cut into one equal share per program, one program per SM; program p runs iterations
p * T // P to (p + 1) * T // P - 1, crossing from one tile to the next with its ring still full
(the next tile's first loads are in flight while the last MMAs of the previous one run, as in
persistent). A tile that lies wholly inside one share is stored as swapab stores it; a tile cut
between shares is summed as splitk sums its slices (`split_reduce`): each piece's fp32 partial
goes to a slot of the tile, and the last piece to arrive adds them in order and stores C, so
nothing waits for another program and the sum does not depend on who arrives last.

The tiles are swapab's whole-K ones (`swapab.WHOLE_K`: 64 weight rows by 16, 32 or 64 tokens),
fp8 the same with K steps twice as wide.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..compat import cta_barrier
from ..launch import CompileSpec, Launch, Scales, Target, b_layout, is_kmajor
from .arch import select_mma, unsupported_reason
from .common import FP8, Ring, init_barriers, invalidate_barriers, load_step, make_descriptors, mbarrier
from .splitk import (
    add_slots,
    check_operands,
    slot_offsets,
    split_reduce,
    splitk_specs,
    store_sum,
    workspace_launch,
)
from .swapab import WHOLE_K, SwapABConfig, swapped_operands, whole_k
from .swapab import _blocks as swapab_blocks

__all__ = [
    "StreamKConfig",
    "candidates",
    "compile_specs",
    "config_for",
    "pieces_bound",
    "prepare",
    "streamk_kernel",
    "unsupported_reason",
]


@dataclass(frozen=True)
class StreamKConfig(SwapABConfig):
    """swapab's whole-K tile (BLOCK_M weight rows, BLOCK_N tokens), dealt out by stream-K over
    PROGRAMS shares (0: one per program an SM holds). HEAD_SUMS 1: a cut tile is summed by the
    program holding its first K step, which waits for the other pieces (`head_sum`); 0: by whichever
    piece arrives last (`split_reduce`)."""

    PROGRAMS: int = 0
    HEAD_SUMS: int = 1

    @property
    def label(self) -> str:
        fp8 = " fp8" if self.ELEM_BYTES == 1 else ""
        return f"W{self.BLOCK_M}xT{self.BLOCK_N}x{self.BLOCK_K}{fp8} s{self.STAGES} w{self.num_warps} streamk"

    def table(self) -> dict[str, object]:
        return super().table() | {"split_k": "stream"}


@gluon.jit
def _owner(i, total, programs):
    """The program whose share holds iteration i: the largest p with p * total // programs <= i."""
    return ((i + 1) * programs - 1) // total


@gluon.jit
def pieces_bound_of(k_steps, total, programs):
    """At most how many shares one tile's K steps fall into (`pieces_bound`, on the GPU)."""
    share = total // programs  # the shortest share
    return (k_steps - 1 + share - 1) // share + 1


def pieces_bound(k_steps: int, total: int, programs: int) -> int:
    """At most how many shares one tile's k_steps iterations fall into when `total` iterations are
    dealt to `programs` shares: the partial slots each tile needs."""
    share = total // programs
    return (k_steps - 1 + share - 1) // share + 1


@gluon.jit
def _tile_offsets(tile, num_t, BLOCK_W: gl.constexpr, BLOCK_T: gl.constexpr):
    """A tile's (weight row, token) offsets; the token tiles of one weight tile are neighbours, so
    the weight rows a tile loads were read for the one before it (M > BLOCK_T only)."""
    return (tile // num_t) * BLOCK_W, (tile % num_t) * BLOCK_T


@gluon.jit
def _next_load(x_desc, w_desc, p, end, k_steps, num_t, x_bufs, w_bufs, ready, W_KMAJOR: gl.constexpr):
    """Issue the producer's next load and advance its state p = (iteration, K step, ring position,
    weight row offset, token offset) past it, on into the next tile at a tile's last K step;
    predicated off past the share's end. The tile's offsets are divided out once per tile."""
    BLOCK_T: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_W: gl.constexpr = w_desc.block_type.shape[0] if W_KMAJOR else w_desc.block_type.shape[1]
    it, k, ring, off_w, off_t = p
    slot = ring.slot()
    load_step(
        x_desc,
        w_desc,
        off_t,
        off_w,
        k * BLOCK_K,
        ready.index(slot),
        x_bufs.index(slot),
        w_bufs.index(slot),
        W_KMAJOR,
        pred=it < end,
    )
    k += 1
    if k == k_steps:
        k = 0
        off_w, off_t = _tile_offsets((it + 1) // k_steps, num_t, BLOCK_W, BLOCK_T)
    return it + 1, k, ring.next(), off_w, off_t


@gluon.jit
def publish(acc, partials, counters, tile, piece, slots):
    """A piece of a cut tile other than its head: its fp32 partial to slot `piece` of the tile, then
    one arrival on the tile's counter, released after the partial (nothing waits for it here)."""
    BM: gl.constexpr = acc.shape[0]
    BN: gl.constexpr = acc.shape[1]
    offs = slot_offsets(BM, BN)
    gl.store(partials + (tile * slots + piece) * (BM * BN) + offs, gl.convert_layout(acc, offs.type.layout))
    cta_barrier()  # every thread's part of the partial is written before the arrival
    gl.atomic_add(counters + tile, 1, sem="release", scope="gpu")


@gluon.jit
def head_sum(c_desc, acc, partials, counters, tile, pieces, slots, off_m, off_n, scale_a, scale_b, SCALING):
    """The head piece of a cut tile (its first K steps, the end of this program's share): wait until
    the other pieces - 1 have arrived (they are the first steps of later shares, so they are
    usually long done), add their partials to this one's accumulator in piece order, reset the
    counter for the next launch and store C. The waits point only at later programs, which start
    no later than this one, so the wait ends whenever the GPU runs at least two of them at once."""
    BM: gl.constexpr = acc.shape[0]
    BN: gl.constexpr = acc.shape[1]
    offs = slot_offsets(BM, BN)
    arrived = gl.atomic_add(counters + tile, 0, sem="acquire", scope="gpu")
    while arrived < pieces - 1:
        arrived = gl.atomic_add(counters + tile, 0, sem="acquire", scope="gpu")
    total = gl.convert_layout(acc, offs.type.layout)
    total = add_slots(total, partials + tile * slots * (BM * BN), 1, pieces, offs)
    gl.store(counters + tile, 0)
    store_sum(c_desc, total, off_m, off_n, scale_a, scale_b, SCALING)


@gluon.jit
def streamk_kernel(
    x_desc,
    w_desc,
    c_desc,
    scale_a,
    scale_b,
    partials,
    counters,
    MMA: gl.constexpr,
    W_KMAJOR: gl.constexpr,
    STAGES: gl.constexpr,
    HEAD_SUMS: gl.constexpr,
    SCALING: gl.constexpr,
):
    """This program's share of the (tile, K step) iterations of C^T = W X^T, stored as C (times
    the fp8 scales of its tokens and columns, SCALING 1 or 2; None scales and SCALING 0 for
    fp16/bf16). The grid is at most the iteration count, so no share is empty."""
    BLOCK_T: gl.constexpr = c_desc.block_type.shape[0]  # tokens: rows of C, the MMA's N
    BLOCK_W: gl.constexpr = c_desc.block_type.shape[1]  # weight rows: columns of C, the MMA's M
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    dtype: gl.constexpr = x_desc.dtype
    k_steps = gl.cdiv(x_desc.shape[1], BLOCK_K)
    num_t = gl.cdiv(c_desc.shape[0], BLOCK_T)
    total = gl.cdiv(c_desc.shape[1], BLOCK_W) * num_t * k_steps
    programs = gl.num_programs(0)
    pid = gl.program_id(0)
    start = pid * total // programs
    end = (pid + 1) * total // programs
    slots = pieces_bound_of(k_steps, total, programs)

    x_bufs = gl.allocate_shared_memory(dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)

    first_tile = start // k_steps
    off_w, off_t = _tile_offsets(first_tile, num_t, BLOCK_W, BLOCK_T)
    p = (start, start - first_tile * k_steps, Ring.start(STAGES), off_w, off_t)
    for _s in gl.static_range(STAGES - 1):
        p = _next_load(x_desc, w_desc, p, end, k_steps, num_t, x_bufs, w_bufs, ready, W_KMAJOR)

    mma = MMA.initialize(dtype, BLOCK_W, BLOCK_T, gl.num_warps())
    ring = Ring.start(STAGES)  # the consumer's position over the share
    for tile in range(first_tile, gl.cdiv(end, k_steps)):
        tile_start = tile * k_steps
        lo = gl.maximum(start, tile_start)
        hi = gl.minimum(end, tile_start + k_steps)
        for _it in range(lo, hi):
            ring.wait_filled(ready)
            lhs, rhs = swapped_operands(x_bufs.index(ring.slot()), w_bufs.index(ring.slot()), W_KMAJOR)
            mma = mma.issue(lhs, rhs)
            mma = mma.wait(1)  # retires the MMA before, whose stage is the one refilled next
            p = _next_load(x_desc, w_desc, p, end, k_steps, num_t, x_bufs, w_bufs, ready, W_KMAJOR)
            ring = ring.next()
        acc, mma = mma.take_result()
        c_tile = acc.permute((1, 0))  # [BLOCK_T, BLOCK_W]: C's tile
        off_w, off_t = _tile_offsets(tile, num_t, BLOCK_W, BLOCK_T)
        if hi - lo == k_steps:
            store_sum(c_desc, c_tile, off_t, off_w, scale_a, scale_b, SCALING)
        else:
            # The tile's pieces belong to programs first .. last, in K order; this is piece pid - first.
            first = _owner(tile_start, total, programs)
            pieces = _owner(tile_start + k_steps - 1, total, programs) - first + 1
            if HEAD_SUMS:
                if pid == first:
                    head_sum(
                        c_desc,
                        c_tile,
                        partials,
                        counters,
                        tile,
                        pieces,
                        slots,
                        off_t,
                        off_w,
                        scale_a,
                        scale_b,
                        SCALING,
                    )
                else:
                    publish(c_tile, partials, counters, tile, pid - first, slots)
            else:
                split_reduce(
                    c_desc,
                    c_tile,
                    partials,
                    counters,
                    tile,
                    pid - first,
                    pieces,
                    slots,
                    off_t,
                    off_w,
                    scale_a,
                    scale_b,
                    SCALING,
                )
    invalidate_barriers(ready, STAGES)


# --------------------------------------------------------------------------------------------------
# Host side.


def candidates(capability: tuple[int, int], fp8: bool = False) -> dict[str, StreamKConfig]:
    """The configs `gluon-survey tune` may pick, by label: swapab's whole-K tiles (16, 32 and 64
    tokens)."""
    tiles = [StreamKConfig(**asdict(whole_k(capability, t, fp8))) for t in sorted(WHOLE_K)]
    return {c.label: c for c in tiles}


def tile_for(capability: tuple[int, int], M: int, fp8: bool = False) -> StreamKConfig:
    """The narrowest token tile that holds M (the widest beyond)."""
    width = whole_k(capability, M, fp8).BLOCK_N
    return next(c for c in candidates(capability, fp8).values() if width == c.BLOCK_N)


def config_for(capability: tuple[int, int], K: int, fp8: bool = False) -> StreamKConfig:
    """The 16-token tile (`prepare` picks the tile by M)."""
    return tile_for(capability, 1, fp8)


def _constexprs(cfg: StreamKConfig, capability: tuple[int, int], layout: str) -> dict[str, object]:
    return {
        "MMA": select_mma(capability),
        "W_KMAJOR": is_kmajor(layout),
        "STAGES": cfg.STAGES,
        "HEAD_SUMS": bool(cfg.HEAD_SUMS),
    }


def prepare(
    a, b, out, target: Target, cfg: StreamKConfig | None = None, scales: Scales | None = None
) -> Launch:
    cfg = cfg or tile_for(target.capability, a.shape[0], scales is not None)
    layout = b_layout(b)
    check_operands("streamk", cfg, layout, scales)
    M, K = a.shape
    tiles = triton.cdiv(out.shape[1], cfg.BLOCK_M) * triton.cdiv(M, cfg.BLOCK_N)
    k_steps = triton.cdiv(K, cfg.BLOCK_K)
    total = tiles * k_steps
    programs = min(cfg.PROGRAMS or target.sm_count * cfg.blocks_per_sm(), total)  # no empty share
    if (total + 1) * programs >= 2**31:
        raise ValueError(
            f"streamk: {tiles} tiles x {k_steps} K steps is too many iterations to deal out in int32; "
            "use swapab or warpspec for this shape"
        )
    slots = tiles * pieces_bound(k_steps, total, programs)
    descs = make_descriptors(a, b, out, cfg, layout, swapab_blocks(cfg, layout))
    return workspace_launch(
        streamk_kernel,
        programs,
        slots,
        tiles,
        a,
        b,
        out,
        cfg,
        descs,
        _constexprs(cfg, target.capability, layout),
        scales,
        {"iterations": total},
    )


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    """Every tile `tune` may pick (`candidates`), both B layouts (fp8: "t")."""
    if unsupported_reason(capability):
        return []
    specs = []
    for cfg in candidates(capability, dtype == FP8).values():
        specs += splitk_specs(
            "streamk",
            streamk_kernel,
            cfg,
            dtype,
            ("x_desc", "w_desc", "c_desc"),
            lambda layout, cfg=cfg: swapab_blocks(cfg, layout),
            lambda layout, cfg=cfg: _constexprs(cfg, capability, layout),
        )
    return specs
