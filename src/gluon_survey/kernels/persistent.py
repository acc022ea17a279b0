"""Rung 3, persistent: Pipelined + one program per SM that outlives its tiles.

The idea: a Pipelined program pays two fixed costs per tile with the tensor cores idle, filling
its ring from empty and storing its C; with 2048 tiles on 132 SMs that happens 15.5 times per SM.
A persistent program walks its tiles (pid, pid + P, pid + 2P, ..., P = the number of SMs, in
grouped order so that the P tiles in flight share A rows and B columns in L2), so each tile's
fixed costs can overlap its neighbours' main loops:

* the ring runs over one flat sequence of (tile, K step) iterations, so the TMA loads of tile
  i+1's first steps are in flight while tile i's last MMAs run;
* tile i's C is staged in shared memory when its K loop ends and leaves during tile i+1's first
  K steps, one 128x64 slice every few steps (`stage_tile`, `store_staged_slice`), so the store
  overlaps MMAs instead of delaying them.

Timed in SM clocks inside the kernel, the main loop runs at the tensor cores' full rate and the
C store was the whole per-tile loss until it was spread over the next tile (perf-notes entry 15).
The producer's tile-order divisions run once per tile, not per K step: per-step integer divisions
made the first version slower than Pipelined (entry 3).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from . import pipelined
from .arch import unsupported_reason
from .common import (
    GemmConfig,
    Ring,
    a_operand,
    b_operand,
    deferred_store_spacing,
    grouped_tile,
    init_barriers,
    invalidate_barriers,
    load_step,
    mbarrier,
    stage_tile,
    store_staged_rest,
    store_staged_slice,
    tma,
)
from .plan import Rung, provider_functions, reads_transposed_a

CONFIGS = {
    # Hopper: Pipelined's tile; the C tile is staged whole beside the ring, so 3 stages of 48 KB +
    # 64 KB. GROUP_M 16: the 132 tiles in flight span 2048 x 2112 of C (perf-notes entry 13).
    9: GemmConfig(
        BLOCK_M=128,
        BLOCK_N=256,
        BLOCK_K=64,
        STAGES=3,
        num_warps=8,
        GROUP_M=16,
        EPILOGUE="deferred",
        EPILOGUE_N=64,
    ),
    # Blackwell: the epilogue stages C from registers, and with 4 warps a 128x256 fp32 accumulator
    # loaded from TMEM takes 256 registers per thread (inspect: 312-320 B of spills), while with 8
    # the TMEM register layout splits N across warpgroups, which the slicing cannot. So 128x128
    # tiles (128 registers per thread), 4 stages as in Pipelined.
    10: GemmConfig(
        BLOCK_M=128,
        BLOCK_N=128,
        BLOCK_K=64,
        STAGES=4,
        num_warps=4,
        GROUP_M=8,
        EPILOGUE="deferred",
        EPILOGUE_N=64,
    ),
}

# fp8 (e4m3): the same tiles with 128-wide K steps (same bytes per stage, twice the MMA work per
# step); Hopper's 3 stages of 48 KB + the bf16 C tile, 208 KB. Blackwell 4 x 32 KB + 32 KB.
FP8_CONFIGS = {
    9: GemmConfig(
        BLOCK_M=128,
        BLOCK_N=256,
        BLOCK_K=128,
        STAGES=3,
        num_warps=8,
        GROUP_M=16,
        EPILOGUE="deferred",
        EPILOGUE_N=64,
        ELEM_BYTES=1,
    ),
    10: GemmConfig(
        BLOCK_M=128,
        BLOCK_N=128,
        BLOCK_K=128,
        STAGES=4,
        num_warps=4,
        GROUP_M=8,
        EPILOGUE="deferred",
        EPILOGUE_N=64,
        ELEM_BYTES=1,
    ),
}

__all__ = [
    "CONFIGS",
    "FP8_CONFIGS",
    "MID_M",
    "compile_specs",
    "config_for",
    "next_load",
    "persistent_kernel",
    "prepare",
    "reads_transposed_a",
    "tile_offsets",
    "unsupported_reason",
]


@gluon.jit
def tile_offsets(
    tile, num_pid_m, num_pid_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr
):
    """Tile id -> the row and column offsets of its C tile, in grouped order (`grouped_tile`)."""
    pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@gluon.jit
def next_load(
    a_desc,
    b_desc,
    p,
    num_pid_m,
    num_pid_n,
    k_steps,
    a_bufs,
    b_bufs,
    ready,
    B_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    A_KMAJOR: gl.constexpr = True,
):
    """Issue the producer's next load and advance the producer state
    p = (tile, K step, ring position, tile's row offset, tile's column offset) past it. At the end of a
    tile the producer moves on to this program's next tile, so loads run ahead across tile
    boundaries; the tile-order divisions run once per tile, not once per K step."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0] if A_KMAJOR else a_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1] if A_KMAJOR else a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0] if B_KMAJOR else b_desc.block_type.shape[1]
    tile, k, ring, off_m, off_n = p
    slot = ring.slot()
    load_step(
        a_desc,
        b_desc,
        off_m,
        off_n,
        k * BLOCK_K,
        ready.index(slot),
        a_bufs.index(slot),
        b_bufs.index(slot),
        B_KMAJOR,
        pred=tile < num_pid_m * num_pid_n,
        A_KMAJOR=A_KMAJOR,
    )
    k += 1
    if k == k_steps:
        k = 0
        tile += gl.num_programs(0)
        off_m, off_n = tile_offsets(tile, num_pid_m, num_pid_n, BLOCK_M, BLOCK_N, GROUP_M)
    return tile, k, ring.next(), off_m, off_n


@gluon.jit(do_not_specialize_on_alignment=["bias"])
def persistent_kernel(
    a_desc,
    b_desc,
    c_desc,
    scale_a,
    scale_b,
    bias,
    MMA: gl.constexpr,
    B_KMAJOR: gl.constexpr,
    A_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    SCALING: gl.constexpr,
    HAS_BIAS: gl.constexpr,
):
    """C = A @ B (times the fp8 scales, SCALING; + bias[N], HAS_BIAS) over this program's tiles.
    A_KMAJOR False: A is read through the [K, M] matrix behind a transposed view (16-bit only)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0] if A_KMAJOR else a_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1] if A_KMAJOR else a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0] if B_KMAJOR else b_desc.block_type.shape[1]
    SLICES: gl.constexpr = BLOCK_N // c_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    num_pid_m = gl.cdiv(c_desc.shape[0], BLOCK_M)
    num_pid_n = gl.cdiv(c_desc.shape[1], BLOCK_N)
    k_steps = gl.cdiv(a_desc.shape[1] if A_KMAJOR else a_desc.shape[0], BLOCK_K)

    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [SLICES] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)

    # Producer state: the next load is K step p[1] of tile p[0], into ring position p[2].
    off_m, off_n = tile_offsets(gl.program_id(0), num_pid_m, num_pid_n, BLOCK_M, BLOCK_N, GROUP_M)
    p = (gl.program_id(0), 0, Ring.start(STAGES), off_m, off_n)
    for _ in gl.static_range(STAGES - 1):
        p = next_load(
            a_desc,
            b_desc,
            p,
            num_pid_m,
            num_pid_n,
            k_steps,
            a_bufs,
            b_bufs,
            ready,
            B_KMAJOR,
            GROUP_M,
            A_KMAJOR,
        )

    mma = MMA.initialize(dtype, BLOCK_M, BLOCK_N, gl.num_warps())
    ring = Ring.start(STAGES)  # the consumer's position, over all of this program's K steps
    spacing = deferred_store_spacing(k_steps)
    prev_m, prev_n = off_m, off_n  # where the staged tile goes (none before the first)
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        for k in range(k_steps):
            ring.wait_filled(ready)
            slot = ring.slot()
            mma = mma.issue(a_operand(a_bufs.index(slot), A_KMAJOR), b_operand(b_bufs.index(slot), B_KMAJOR))
            # The previous tile's C leaves while this tile's MMAs run.
            store_staged_slice(c_desc, c_bufs, prev_m, prev_n, k, spacing, tile != gl.program_id(0))
            mma = mma.wait(1)
            # The freed slot gets the producer's next load, which may already be the next tile's.
            p = next_load(
                a_desc,
                b_desc,
                p,
                num_pid_m,
                num_pid_n,
                k_steps,
                a_bufs,
                b_bufs,
                ready,
                B_KMAJOR,
                GROUP_M,
                A_KMAJOR,
            )
            ring = ring.next()
        acc, mma = mma.take_result()
        off_m, off_n = tile_offsets(tile, num_pid_m, num_pid_n, BLOCK_M, BLOCK_N, GROUP_M)
        pending = tile != gl.program_id(0)
        stage_tile(
            c_desc,
            c_bufs,
            acc,
            prev_m,
            prev_n,
            k_steps,
            spacing,
            pending,
            off_m,
            off_n,
            scale_a,
            scale_b,
            SCALING,
            bias,
            HAS_BIAS,
        )
        prev_m, prev_n = off_m, off_n
    store_staged_rest(c_desc, c_bufs, prev_m, prev_n, 0, spacing, True)
    tma.store_wait(0)
    invalidate_barriers(ready, STAGES)


# More tiles `tune` times on Hopper for M = 24 to 4096 (16-bit): 128x128 tiles make twice as many
# tiles as 128x256, so a 512-token product on a 4096-wide weight fills 128 of 132 SMs instead of 64
# (docs/perf-notes.md, entry 55).
MID_M = {
    9: (
        GemmConfig(
            BLOCK_M=128,
            BLOCK_N=128,
            BLOCK_K=64,
            STAGES=4,
            num_warps=8,
            GROUP_M=8,
            EPILOGUE="deferred",
            EPILOGUE_N=64,
        ),
    ),
}

# Its constexprs are Pipelined's: the same ring, now walked by a persistent program.
RUNG = Rung(
    "persistent",
    persistent_kernel,
    pipelined.constexprs,
    persistent=True,
    configs=CONFIGS,
    fp8_configs=FP8_CONFIGS,
    more=MID_M,
    scaled=True,
    transposed_a=True,
)


# The provider contract (gluon_survey/registry.py), answered by the Rung.
config_for, candidates, prepare, compile_specs = provider_functions(lambda: RUNG)
