"""Rung 3, persistent: Pipelined + one program per SM that walks its tiles in grouped order.

The idea: a Pipelined program drains its ring at the end of every tile, stores, exits, and the
next program refills from scratch; with 2048 tiles on 132 SMs that happens 15.5 times per SM.
Here each SM runs one program for its whole life. The ring runs over one flat sequence of
(tile, K step) iterations, so while the last MMAs of tile i finish, the TMA loads of tile i+1's
first steps are already in flight; and tile i's TMA store is only waited for just before tile
i+1's epilogue overwrites the C buffer, so the store overlaps tile i+1's main loop.

Programs take tiles pid, pid + P, pid + 2P, ... (P = number of SMs) mapped through the grouped
order, so the P tiles in flight at once share A rows and B columns in L2.

Measured on H100 (see README / results/): filled in from the committed benchmark.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..registry import CompileSpec, Launch
from .common import (
    GemmConfig,
    b_operand,
    gemm_signature,
    grouped_tile,
    init_barriers,
    invalidate_barriers,
    load_step,
    make_descriptors,
    mbarrier,
    num_tiles,
    select_mma,
    store_tile,
    tma,
    unsupported_reason,
)

CONFIG = GemmConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, STAGES=3, num_warps=8, GROUP_M=8)

__all__ = ["CONFIG", "compile_specs", "persistent_kernel", "prepare", "unsupported_reason"]


@gluon.jit
def _load_iteration(a_desc, b_desc, it, k_steps, num_pid_m, num_pid_n, a_bufs, b_bufs, ready, pred,
                    B_KMAJOR: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    """Issue the loads of flat iteration `it` = (this program's tile it // k_steps, K step it % k_steps)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0] if B_KMAJOR else b_desc.block_type.shape[1]
    tile = gl.program_id(0) + (it // k_steps) * gl.num_programs(0)
    pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
    slot = it % STAGES
    load_step(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, (it % k_steps) * BLOCK_K, ready.index(slot),
              a_bufs.index(slot), b_bufs.index(slot), B_KMAJOR, pred=pred)


@gluon.jit
def persistent_kernel(
    a_desc, b_desc, c_desc, MMA: gl.constexpr, B_KMAJOR: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr
):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    num_pid_m = gl.cdiv(c_desc.shape[0], BLOCK_M)
    num_pid_n = gl.cdiv(c_desc.shape[1], BLOCK_N)
    k_steps = gl.cdiv(a_desc.shape[1], a_desc.block_type.shape[1])
    my_tiles = gl.cdiv(num_pid_m * num_pid_n - gl.program_id(0), gl.num_programs(0))
    total = my_tiles * k_steps

    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)

    for s in gl.static_range(STAGES - 1):
        _load_iteration(a_desc, b_desc, s, k_steps, num_pid_m, num_pid_n, a_bufs, b_bufs, ready, s < total,
                        B_KMAJOR, GROUP_M, STAGES)

    mma = MMA.initialize(dtype, BLOCK_M, BLOCK_N, gl.num_warps())
    for it in range(total):
        slot = it % STAGES
        mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
        mma = mma.issue(a_bufs.index(slot), b_operand(b_bufs.index(slot), B_KMAJOR))
        mma = mma.wait(1)
        nxt = it + STAGES - 1  # may belong to the next tile: its loads start before this tile ends
        _load_iteration(a_desc, b_desc, nxt, k_steps, num_pid_m, num_pid_n, a_bufs, b_bufs, ready, nxt < total,
                        B_KMAJOR, GROUP_M, STAGES)
        if it % k_steps == k_steps - 1:
            acc, mma = mma.take_result()
            tile = gl.program_id(0) + (it // k_steps) * gl.num_programs(0)
            pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
            tma.store_wait(0)  # the previous tile's store has finished reading c_smem
            store_tile(c_desc, c_smem, acc, pid_m * BLOCK_M, pid_n * BLOCK_N)
    tma.store_wait(0)
    invalidate_barriers(ready, STAGES)


def prepare(a, b, out, cfg: GemmConfig = CONFIG) -> Launch:
    from ..api import capability_of, sm_count

    mma = select_mma(capability_of(a.device))
    a_desc, b_desc, c_desc, kmajor = make_descriptors(a, b, out, cfg)
    M, N = out.shape
    grid = (min(sm_count(a.device), num_tiles(M, N, cfg)),)

    def fn():
        persistent_kernel[grid](a_desc, b_desc, c_desc, mma, kmajor, cfg.GROUP_M, cfg.STAGES, num_warps=cfg.num_warps)

    return Launch(fn, cfg.table())


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    if unsupported_reason(capability):
        return []
    mma = select_mma(capability)
    names = ("MMA", "B_KMAJOR", "GROUP_M", "STAGES")
    return [
        CompileSpec(
            "persistent",
            f"persistent_kernel {CONFIG.label} B{'t' if kmajor else 'row'}",
            persistent_kernel,
            gemm_signature(CONFIG, dtype, kmajor) | dict.fromkeys(names, "constexpr"),
            dict(zip(names, (mma, kmajor, CONFIG.GROUP_M, CONFIG.STAGES))),
            {"num_warps": CONFIG.num_warps},
        )
        for kmajor in (False, True)
    ]
