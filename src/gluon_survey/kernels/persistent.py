"""Rung 3, persistent: Pipelined + one program per SM that walks its tiles in grouped order.

The idea: a Pipelined program drains its ring at the end of every tile, stores, exits, and the
next program refills from scratch; with 2048 tiles on 132 SMs that happens 15.5 times per SM.
Here each SM runs one program for its whole life. The ring runs over one flat sequence of
(tile, K step) iterations, so while the last MMAs of tile i finish, the TMA loads of tile i+1's
first steps are already in flight; and tile i's TMA store is only waited for just before tile
i+1's epilogue overwrites its buffer, so the store overlaps tile i+1's main loop. Because the C
staging memory now stays allocated beside the ring, C leaves in 128x64 slices through two 16 KB
buffers (`store_tile_sliced`) instead of one 64 KB tile, which leaves room for a 4th stage.

Programs take tiles pid, pid + P, pid + 2P, ... (P = number of SMs) mapped through the grouped
order, so the P tiles in flight at once share A rows and B columns in L2.

From K = 1024 (`config_for`) the C store is deferred instead: the whole tile is staged in shared
memory (3 stages then fit, not 4) and its four slices are TMA-stored one every 4 K steps of the
next tile. Timed in SM clocks inside the kernel, the main loop already ran at the tensor cores'
full rate, and the synchronous store of C was the whole per-tile loss (~2000 clocks for 64 KB);
spread over the next tile, it overlaps the MMAs (docs/perf-notes.md, entry 15).

Measured on H100 80GB HBM3 (results/h100-ladder/ and -run2/, commit c63b779, steady-state clocks,
x cuBLAS timed alongside in alternating windows, fp16 / bf16, two runs): 0.98-0.99 at K = 512,
0.97-0.998 at 1024, 1.007-1.05 from K = 2048; geomean 1.01 / 1.01. The last wave (2048 tiles on
132 SMs) costs it and cuBLAS alike ~3 %; a stream-K schedule for it lost (docs/perf-notes.md,
entry 16).
"""

from __future__ import annotations

from dataclasses import replace

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..registry import CompileSpec, Launch
from .common import (
    GemmConfig,
    b_operand,
    deferred_store_spacing,
    gemm_signature,
    grouped_tile,
    init_barriers,
    invalidate_barriers,
    load_step,
    make_descriptors,
    mbarrier,
    num_tiles,
    rung_config,
    select_mma,
    stage_tile,
    store_staged_rest,
    store_staged_slice,
    store_tile_sliced,
    tma,
    unsupported_reason,
)

# The C tile must stay allocated beside the ring (its store overlaps the next tile), and a whole
# 64 KB tile leaves room for only 3 stages of 48 KB. Below K = 1024, C leaves in four 128x64 slices
# through two 16 KB buffers instead, so a 4th stage fits: 4 x 48 KB + 32 KB = 224 KB (with 8 K steps
# per tile the 4th stage matters most). GROUP_M = 16 makes the 132 tiles in flight 2048 rows x 2112
# columns instead of 1024 x 4224: steady-state pairs on H100 gave +2-9 % over 8 at K = 1024-2048 and
# about +1 % from 4096; 32 was no better than 16 (docs/perf-notes.md, entry 13).
CONFIG = GemmConfig(
    BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, STAGES=4, num_warps=8, GROUP_M=16, EPILOGUE_N=64, EPILOGUE_BUFFERS=2
)
# From K = 1024 the whole C tile is staged (3 x 48 KB + 64 KB = 208 KB) and its four slices are
# stored during the next tile's first K steps (`DEFER_STORE`): steady-state pairs on H100, x cuBLAS,
# 3 stages deferred vs 4 stages sliced: K = 512 0.95-0.96 vs 0.97-1.01; K = 1024 0.98-0.995 vs
# 0.97-0.98; K = 2048 1.03-1.06 vs 1.00-1.02; K = 4096-8192 1.01-1.03 vs 1.00-1.02 (entry 15).
DEFERRED = replace(CONFIG, STAGES=3, EPILOGUE_BUFFERS=4, DEFER_STORE=True)
DEFERRED_FROM_K = 1024


def config_for(K: int) -> GemmConfig:
    """The documented rule: a 4th stage while tiles are short, the deferred epilogue from K = 1024."""
    return DEFERRED if K >= DEFERRED_FROM_K else CONFIG


__all__ = [
    "CONFIG",
    "DEFERRED",
    "compile_specs",
    "config_for",
    "persistent_kernel",
    "prepare",
    "unsupported_reason",
]


@gluon.jit
def _tile_offsets(
    tile, num_pid_m, num_pid_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr
):
    pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@gluon.jit
def _next_load(
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
):
    """Issue the producer's next load and advance the producer state
    p = (tile, K step, load count, tile's row offset, tile's column offset) past it. At the end of a
    tile the producer moves on to this program's next tile, so loads run ahead across tile
    boundaries; the tile-order divisions run once per tile, not once per K step."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0] if B_KMAJOR else b_desc.block_type.shape[1]
    STAGES: gl.constexpr = a_bufs.shape[0]
    tile, k, count, off_m, off_n = p
    slot = count % STAGES
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
    )
    k += 1
    if k == k_steps:
        k = 0
        tile += gl.num_programs(0)
        off_m, off_n = _tile_offsets(tile, num_pid_m, num_pid_n, BLOCK_M, BLOCK_N, GROUP_M)
    return tile, k, count + 1, off_m, off_n


@gluon.jit
def persistent_kernel(
    a_desc,
    b_desc,
    c_desc,
    MMA: gl.constexpr,
    B_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    EPILOGUE_BUFFERS: gl.constexpr,
    DEFER_STORE: gl.constexpr = False,
):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0] if B_KMAJOR else b_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    num_pid_m = gl.cdiv(c_desc.shape[0], BLOCK_M)
    num_pid_n = gl.cdiv(c_desc.shape[1], BLOCK_N)
    k_steps = gl.cdiv(a_desc.shape[1], a_desc.block_type.shape[1])

    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_bufs = gl.allocate_shared_memory(dtype, [EPILOGUE_BUFFERS] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)

    # Producer state: the next load is K step p[1] of tile p[0], this program's p[2]-th load.
    off_m, off_n = _tile_offsets(gl.program_id(0), num_pid_m, num_pid_n, BLOCK_M, BLOCK_N, GROUP_M)
    p = (gl.program_id(0), 0, 0, off_m, off_n)
    for _ in gl.static_range(STAGES - 1):
        p = _next_load(
            a_desc, b_desc, p, num_pid_m, num_pid_n, k_steps, a_bufs, b_bufs, ready, B_KMAJOR, GROUP_M
        )

    mma = MMA.initialize(dtype, BLOCK_M, BLOCK_N, gl.num_warps())
    it = 0  # consumer counter, over all of this program's K steps
    spacing = deferred_store_spacing(k_steps)
    prev_m, prev_n = off_m, off_n  # DEFER_STORE: where the staged tile goes (none before the first)
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        for k in range(k_steps):
            slot = it % STAGES
            mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
            mma = mma.issue(a_bufs.index(slot), b_operand(b_bufs.index(slot), B_KMAJOR))
            if DEFER_STORE:  # the previous tile's C leaves while this tile's MMAs run
                store_staged_slice(c_desc, c_bufs, prev_m, prev_n, k, spacing, tile != gl.program_id(0))
            mma = mma.wait(1)
            # The freed slot gets the producer's next load, which may already be the next tile's.
            p = _next_load(
                a_desc, b_desc, p, num_pid_m, num_pid_n, k_steps, a_bufs, b_bufs, ready, B_KMAJOR, GROUP_M
            )
            it += 1
        acc, mma = mma.take_result()
        off_m, off_n = _tile_offsets(tile, num_pid_m, num_pid_n, BLOCK_M, BLOCK_N, GROUP_M)
        if DEFER_STORE:
            stage_tile(c_desc, c_bufs, acc, prev_m, prev_n, k_steps, spacing, tile != gl.program_id(0))
            prev_m, prev_n = off_m, off_n
        else:
            store_tile_sliced(c_desc, c_bufs, acc, off_m, off_n, EPILOGUE_BUFFERS)
    if DEFER_STORE:
        store_staged_rest(c_desc, c_bufs, prev_m, prev_n, 0, spacing, True)
    tma.store_wait(0)
    invalidate_barriers(ready, STAGES)


def prepare(a, b, out, cfg: GemmConfig | None = None) -> Launch:
    from ..api import capability_of, sm_count

    cap = capability_of(a.device)
    mma = select_mma(cap)
    cfg = cfg or rung_config("persistent", cap, config_for(a.shape[1]))
    a_desc, b_desc, c_desc, kmajor = make_descriptors(a, b, out, cfg)
    M, N = out.shape
    grid = (min(sm_count(a.device), num_tiles(M, N, cfg)),)

    def fn():
        persistent_kernel[grid](
            a_desc,
            b_desc,
            c_desc,
            mma,
            kmajor,
            cfg.GROUP_M,
            cfg.STAGES,
            cfg.EPILOGUE_BUFFERS,
            cfg.DEFER_STORE,
            num_warps=cfg.num_warps,
        )

    return Launch(fn, cfg.table())


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    if unsupported_reason(capability):
        return []
    mma = select_mma(capability)
    configs = dict.fromkeys(rung_config("persistent", capability, c) for c in (CONFIG, DEFERRED))
    names = ("MMA", "B_KMAJOR", "GROUP_M", "STAGES", "EPILOGUE_BUFFERS", "DEFER_STORE")
    return [
        CompileSpec(
            "persistent",
            f"persistent_kernel {cfg.label} B{'t' if kmajor else 'row'}",
            persistent_kernel,
            gemm_signature(cfg, dtype, kmajor) | dict.fromkeys(names, "constexpr"),
            dict(
                zip(
                    names,
                    (mma, kmajor, cfg.GROUP_M, cfg.STAGES, cfg.EPILOGUE_BUFFERS, cfg.DEFER_STORE),
                    strict=True,
                )
            ),
            {"num_warps": cfg.num_warps},
        )
        for cfg in configs
        for kmajor in (False, True)
    ]
