"""Rung 4, warpspec on Blackwell (sm_100a): persistent + warp specialization, as tcgen05 shapes it.

The idea is the Hopper rung's (`warpspec.py`): separate the TMA loads, the MMAs and the epilogue
into partitions so that none waits for the others' latency. What tcgen05 changes is who holds
the accumulator: a single thread issues an MMA for the whole CTA and the accumulator lives in
tensor memory, not in the issuing warps' registers. So

* one TMA warp fills a ring of STAGES operand stages (`load_partition`, `ready` / `empty`);
* one MMA warp issues every tcgen05 MMA; each MMA's completion frees its operand stage, and one
  commit per tile marks that tile's accumulator complete;
* the default partition (4 warps) is the epilogue: TMEM -> registers -> output dtype -> smem ->
  TMA store.

The accumulator is double-buffered in TMEM (2 x 128x256 fp32 = all 512 columns) with `acc_ready`
/ `acc_empty` barriers, so the epilogue of tile i runs while the MMA warp already accumulates tile
i+1: the tensor cores wait for an epilogue only if it takes longer than a whole tile's main loop.
The epilogue moves the accumulator out in 128x64 column slices through two small smem buffers, so
it needs 64 fp32 registers per thread and 32 KB of smem, which leaves room for 4 stages of 48 KB.

Compiled and instruction-checked for sm_100a by this project; not run by it (docs/blackwell.md).
"""

from __future__ import annotations

from dataclasses import replace

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..compat import allocate_tensor_memory, tcgen05_commit, tcgen05_mma, tmem_load
from ..launch import is_kmajor
from .blackwell import TMEM_COLUMNS, acc_tmem_layout
from .common import (
    GemmConfig,
    Ring,
    b_operand,
    grouped_tile,
    init_barriers,
    load_partition,
    mbarrier,
    store_slice,
    tma,
)
from .plan import Rung, provider_functions

# Triton's Blackwell warp-specialization tutorial: 128x256x64, 4 stages, 4 epilogue warps, GROUP_M 8,
# the epilogue in 128x64 slices (64 registers per thread) through two buffers.
CONFIG = GemmConfig(
    BLOCK_M=128,
    BLOCK_N=256,
    BLOCK_K=64,
    STAGES=4,
    num_warps=4,
    GROUP_M=8,
    EPILOGUE="sliced",
    EPILOGUE_N=64,
    EPILOGUE_BUFFERS=2,
)
# fp8 (e4m3): 128-wide K steps, so a stage holds the same 48 KB (tcgen05's f8f6f4 kind).
FP8_CONFIG = replace(CONFIG, BLOCK_K=128, ELEM_BYTES=1)
# Registers per thread requested for the TMA warp and the MMA warp. setmaxnreg acts on whole
# warpgroups and the two 1-warp workers share one, so both run with the larger value (SASS:
# USETMAXREG.DEALLOC 0x28); the epilogue warpgroup grows into what they give up.
LOAD_REGS = 40  # addresses, grouped-order coordinates, counters
MMA_REGS = 24  # barrier waits and one MMA per K step

__all__ = [
    "CONFIG",
    "FP8_CONFIG",
    "compile_specs",
    "prepare",
    "unsupported_reason",
    "warpspec_tcgen05_kernel",
]


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    if capability[0] == 10:
        return None
    return (
        f"this warp-specialized design is Blackwell's (sm_100); this GPU is sm_{capability[0]}{capability[1]}"
    )


@gluon.jit
def _mma_partition(
    a_bufs, b_bufs, acc_bufs, ready, empty, acc_ready, acc_empty, my_tiles, k_steps, B_KMAJOR: gl.constexpr
):
    """MMA warp: per tile, take a free accumulator buffer, issue one MMA per K step (each one frees
    its operand stage when it completes), then commit: `acc_ready` fires when the tile is done."""
    STAGES: gl.constexpr = a_bufs.shape[0]
    ring = Ring.start(STAGES)
    for n in range(my_tiles):
        acc_ring = Ring(n, 2)  # the two accumulator buffers
        acc_ring.wait_free(acc_empty)  # use u of a buffer needs use u-1 drained by the epilogue
        acc = acc_bufs.index(acc_ring.slot())
        for k in range(k_steps):
            ring.wait_filled(ready)
            slot = ring.slot()
            tcgen05_mma(
                a_bufs.index(slot),
                b_operand(b_bufs.index(slot), B_KMAJOR),
                acc,
                use_acc=k > 0,
                mbarriers=[empty.index(slot)],
            )
            ring = ring.next()
        tcgen05_commit(acc_ready.index(acc_ring.slot()))  # arrives once every MMA issued so far is done


@gluon.jit
def _epilogue_partition(
    c_desc,
    scale_a,
    scale_b,
    bias,
    c_bufs,
    acc_bufs,
    acc_ready,
    acc_empty,
    num_pid_m,
    num_pid_n,
    my_tiles,
    GROUP_M: gl.constexpr,
    SCALING: gl.constexpr,
    HAS_BIAS: gl.constexpr,
):
    """Epilogue warps: per tile, wait for its accumulator, move it out slice by slice (TMEM ->
    registers -> fp8 scales -> bias -> output dtype -> smem -> TMA store), and hand the buffer back to the
    MMA warp as soon as the last slice is in registers."""
    BLOCK_M: gl.constexpr = acc_bufs.shape[1]
    BLOCK_N: gl.constexpr = acc_bufs.shape[2]
    SLICE_N: gl.constexpr = c_desc.block_type.shape[1]
    SLICES: gl.constexpr = BLOCK_N // SLICE_N
    BUFFERS: gl.constexpr = c_bufs.shape[0]
    for n in range(my_tiles):
        tile = gl.program_id(0) + n * gl.num_programs(0)
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc_ring = Ring(n, 2)
        acc_ring.wait_filled(acc_ready)
        acc = acc_bufs.index(acc_ring.slot())
        for i in gl.static_range(SLICES):
            part = tmem_load(acc.slice(i * SLICE_N, SLICE_N))
            if i == SLICES - 1:
                mbarrier.arrive(acc_empty.index(acc_ring.slot()))  # the MMA warp may overwrite it
            off_n = pid_n * BLOCK_N + i * SLICE_N
            buf = c_bufs.index(i % BUFFERS)
            store_slice(
                c_desc,
                buf,
                part,
                pid_m * BLOCK_M,
                off_n,
                BUFFERS - 1,
                scale_a,
                scale_b,
                SCALING,
                bias,
                HAS_BIAS,
            )
    tma.store_wait(0)


@gluon.jit(do_not_specialize_on_alignment=["bias"])
def warpspec_tcgen05_kernel(
    a_desc,
    b_desc,
    c_desc,
    scale_a,
    scale_b,
    bias,
    B_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    EPILOGUE_BUFFERS: gl.constexpr,
    LOAD_REGS: gl.constexpr,
    MMA_REGS: gl.constexpr,
    SCALING: gl.constexpr,
    HAS_BIAS: gl.constexpr,
):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0] if B_KMAJOR else b_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    gl.static_assert(2 * BLOCK_N <= TMEM_COLUMNS, "two fp32 accumulators must fit in tensor memory")
    num_pid_m = gl.cdiv(c_desc.shape[0], BLOCK_M)
    num_pid_n = gl.cdiv(c_desc.shape[1], BLOCK_N)
    k_steps = gl.cdiv(a_desc.shape[1], a_desc.block_type.shape[1])
    my_tiles = gl.cdiv(num_pid_m * num_pid_n - gl.program_id(0), gl.num_programs(0))

    # (Gluon's JIT has no starred expressions: the ring shapes are list concatenations.)
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_shape: gl.constexpr = [EPILOGUE_BUFFERS] + c_desc.block_type.shape
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, c_shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    acc_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    acc_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)
    init_barriers(empty, STAGES)
    init_barriers(acc_ready, 2)
    init_barriers(acc_empty, 2)
    acc_bufs = allocate_tensor_memory(gl.float32, [2, BLOCK_M, BLOCK_N], acc_tmem_layout(BLOCK_M, BLOCK_N))

    gl.warp_specialize(
        [
            (
                _epilogue_partition,
                (
                    c_desc,
                    scale_a,
                    scale_b,
                    bias,
                    c_bufs,
                    acc_bufs,
                    acc_ready,
                    acc_empty,
                    num_pid_m,
                    num_pid_n,
                    my_tiles,
                    GROUP_M,
                    SCALING,
                    HAS_BIAS,
                ),
            ),
            (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, B_KMAJOR, GROUP_M)),
            (
                _mma_partition,
                (a_bufs, b_bufs, acc_bufs, ready, empty, acc_ready, acc_empty, my_tiles, k_steps, B_KMAJOR),
            ),
        ],
        [1, 1],
        [LOAD_REGS, MMA_REGS],
    )


def _constexprs(cfg: GemmConfig, capability: tuple[int, int], layout: str) -> dict[str, object]:
    return {
        "B_KMAJOR": is_kmajor(layout),
        "GROUP_M": cfg.GROUP_M,
        "STAGES": cfg.STAGES,
        "EPILOGUE_BUFFERS": cfg.EPILOGUE_BUFFERS,
        "LOAD_REGS": LOAD_REGS,
        "MMA_REGS": MMA_REGS,
    }


RUNG = Rung(
    "warpspec",
    warpspec_tcgen05_kernel,
    _constexprs,
    persistent=True,
    configs={10: CONFIG},
    fp8_configs={10: FP8_CONFIG},
    scaled=True,
)


# The provider contract (gluon_survey/registry.py), answered by the Rung.
config_for, candidates, prepare, compile_specs = provider_functions(lambda: RUNG)
