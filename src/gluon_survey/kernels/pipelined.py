"""Rung 2, Pipelined: Blocked + a ring of shared-memory stages.

The idea: never let the tensor cores wait for memory. A ring of STAGES A/B buffers, one mbarrier
per stage ("this stage's data has landed"). The prologue starts the TMA loads of the first
STAGES-1 K steps; in the steady state the MMA of step k is issued asynchronously, the MMA of step
k-1 is retired (`wait(1)`: exactly one MMA in flight), and the freed stage is refilled with step
k+STAGES-1. So STAGES-1 loads are in flight behind every MMA. Stage and phase of K step k come
from `Ring(k, STAGES)`. What is left is per tile: each program fills the ring from empty and
stores its C while the tensor cores wait (perf-notes entry 2), which the next rung removes.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch import is_a_kmajor, is_kmajor
from .arch import select_mma, unsupported_reason
from .common import (
    GemmConfig,
    Ring,
    a_operand,
    b_operand,
    grouped_tile,
    init_barriers,
    invalidate_barriers,
    load_step,
    mbarrier,
    release_next_grid,
    scale_tile,
    store_biased_tile,
    store_tile,
    tma,
    wait_for_previous_grid,
)
from .plan import Rung, provider_functions, reads_transposed_a

CONFIGS = {
    # Hopper: the tutorials' 128x256x64 with 8 warps (two warpgroups, 128 accumulator registers per
    # thread), 3 stages of 48 KB; C reuses the ring's memory. GROUP_M 16: perf-notes entry 13.
    9: GemmConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, STAGES=3, num_warps=8, GROUP_M=16),
    # Blackwell: the accumulator is in TMEM, so 4 warps suffice, and Triton's tutorial found 4
    # stages better than 3 there.
    10: GemmConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, STAGES=4, num_warps=4, GROUP_M=8),
}
# fp8 (e4m3): the same tiles with 128-wide K steps, so a stage holds the same bytes (128-byte rows,
# the 128-byte swizzle) and each MMA does twice the work of a 16-bit step at twice the rate. The
# C tile (bf16) still reuses the ring; 4 stages, 192 KB. Blackwell's takes 8 warps: the scaled
# 128x256 fp32 tile loaded from TMEM by 4 warps is 256 registers a thread and spills (384 B).
FP8_CONFIGS = {
    9: GemmConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, STAGES=4, num_warps=8, GROUP_M=16, ELEM_BYTES=1),
    10: GemmConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, STAGES=4, num_warps=8, GROUP_M=8, ELEM_BYTES=1),
}

__all__ = [
    "CONFIGS",
    "FP8_CONFIGS",
    "compile_specs",
    "config_for",
    "constexprs",
    "pipelined_kernel",
    "prepare",
    "reads_transposed_a",
    "unsupported_reason",
]


@gluon.jit
def operands(a_buf, b_buf, B_KMAJOR: gl.constexpr):
    """C += A @ B: the MMA takes A's [BM, BK] tile as it is and B's as [BK, BN]."""
    return a_buf, b_operand(b_buf, B_KMAJOR)


@gluon.jit
def ring_mma(
    a_desc,
    b_desc,
    off_m,
    off_n,
    first,
    steps,
    mma,
    STAGES: gl.constexpr,
    B_KMAJOR: gl.constexpr,
    OPERANDS: gl.constexpr,
    TAKE: gl.constexpr = True,
    A_KMAJOR: gl.constexpr = True,
):
    """The rung's idea: K steps first .. first + steps - 1 of one tile through a ring of STAGES
    shared-memory stages, STAGES - 1 loads in flight behind the one MMA in flight; returns the fp32
    accumulator (TAKE False: the MMA, whose accumulator is then taken in slices, `result_slice`).
    `OPERANDS(a_buf, b_buf, B_KMAJOR)` says how a stage feeds the MMA (`operands`; the swap-AB
    rung passes its own); with A_KMAJOR False the A stages hold [BK, BM] tiles of the [K, M]
    matrix behind a transposed A, and `a_buf` is their transposed view (`a_operand`). Later rungs
    reuse this loop."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1] if A_KMAJOR else a_desc.block_type.shape[0]
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)
    # Launched as a programmatic dependent (splitk's and swapab's launch, `plan.PDL`), a program
    # gets this far while the kernel before it finishes, then waits; launched plainly, both no-ops.
    release_next_grid()
    wait_for_previous_grid()

    # Prologue: loads for steps 0 .. STAGES-2 (predicated off past the last K step).
    for s in gl.static_range(STAGES - 1):
        load_step(
            a_desc,
            b_desc,
            off_m,
            off_n,
            (first + s) * BLOCK_K,
            ready.index(s),
            a_bufs.index(s),
            b_bufs.index(s),
            B_KMAJOR,
            pred=s < steps,
            A_KMAJOR=A_KMAJOR,
        )

    for k in range(steps):
        ring = Ring(k, STAGES)
        ring.wait_filled(ready)
        lhs, rhs = OPERANDS(
            a_operand(a_bufs.index(ring.slot()), A_KMAJOR), b_bufs.index(ring.slot()), B_KMAJOR
        )
        mma = mma.issue(lhs, rhs)
        mma = mma.wait(1)  # retires MMA k-1, whose stage is the one refilled next
        nxt = k + STAGES - 1
        refill = Ring(nxt, STAGES).slot()
        load_step(
            a_desc,
            b_desc,
            off_m,
            off_n,
            (first + nxt) * BLOCK_K,
            ready.index(refill),
            a_bufs.index(refill),
            b_bufs.index(refill),
            B_KMAJOR,
            pred=nxt < steps,
            A_KMAJOR=A_KMAJOR,
        )
    if TAKE:
        acc, mma = mma.take_result()
        invalidate_barriers(ready, STAGES)
        result = acc
    else:
        invalidate_barriers(ready, STAGES)
        result = mma
    return result


@gluon.jit(do_not_specialize_on_alignment=["bias"])
def pipelined_kernel(
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
    """One [BLOCK_M, BLOCK_N] tile of C = A @ B; for fp8 operands C = (A @ B) * scales
    (`scale_tile`, SCALING 1 or 2; None scales and SCALING 0 for fp16/bf16); then + bias[N]
    (`add_bias`, HAS_BIAS; None and False without). A_KMAJOR False: A is read through the [K, M]
    matrix behind a transposed view (16-bit operands only)."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1] if A_KMAJOR else a_desc.block_type.shape[0]
    dtype: gl.constexpr = a_desc.dtype
    pid_m, pid_n = grouped_tile(
        gl.program_id(0), gl.cdiv(c_desc.shape[0], BLOCK_M), gl.cdiv(c_desc.shape[1], BLOCK_N), GROUP_M
    )
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N

    mma = MMA.initialize(dtype, BLOCK_M, BLOCK_N, gl.num_warps())
    k_steps = gl.cdiv(a_desc.shape[1] if A_KMAJOR else a_desc.shape[0], BLOCK_K)
    if HAS_BIAS:  # the accumulator taken in column slices, each with its scales and bias
        mma = ring_mma(
            a_desc, b_desc, off_m, off_n, 0, k_steps, mma, STAGES, B_KMAJOR, operands, False, A_KMAJOR
        )
        c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
        store_biased_tile(c_desc, c_smem, mma, off_m, off_n, scale_a, scale_b, SCALING, bias)
    else:
        acc = ring_mma(
            a_desc, b_desc, off_m, off_n, 0, k_steps, mma, STAGES, B_KMAJOR, operands, True, A_KMAJOR
        )
        acc = scale_tile(acc, scale_a, scale_b, off_m, off_n, c_desc.shape[0], c_desc.shape[1], SCALING)
        c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
        store_tile(c_desc, c_smem, acc, off_m, off_n)
    tma.store_wait(0)


def constexprs(
    cfg: GemmConfig, capability: tuple[int, int], layout: str, a_layout: str = "row"
) -> dict[str, object]:
    """The kernel's constexprs, for its launch and its compile specs alike (persistent's too)."""
    return {
        "MMA": select_mma(capability),
        "B_KMAJOR": is_kmajor(layout),
        "A_KMAJOR": is_a_kmajor(a_layout),
        "GROUP_M": cfg.GROUP_M,
        "STAGES": cfg.STAGES,
    }


RUNG = Rung(
    "Pipelined",
    pipelined_kernel,
    constexprs,
    configs=CONFIGS,
    fp8_configs=FP8_CONFIGS,
    scaled=True,
    transposed_a=True,
)


# The provider contract (gluon_survey/registry.py), answered by the Rung.
config_for, candidates, prepare, compile_specs = provider_functions(lambda: RUNG)
