"""Rung 1, Blocked: one output tile per program, one K step at a time.

The idea: the plainest kernel that uses the tensor cores the way Hopper wants. Each program owns
one BLOCK_M x BLOCK_N tile of C; per K step it TMA-loads an A and a B tile into shared memory,
waits on an mbarrier for both, runs the MMA synchronously, and only then asks for the next step.
The copy engine and the tensor cores never work at the same time inside a program; the only
overlap comes from a second program on the same SM (occupancy 2), which is why the tile is small.
Its speed, flat in K, is the baseline every later rung is measured against (perf-notes entry 1).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch import is_a_kmajor, is_kmajor
from .arch import select_mma, unsupported_reason
from .common import (
    GemmConfig,
    a_operand,
    b_operand,
    grouped_tile,
    load_step,
    mbarrier,
    store_biased_tile,
    store_tile,
    tma,
)
from .plan import Rung, provider_functions, reads_transposed_a

CONFIGS = {
    # Hopper: the best blocked kernel of Triton's wgmma tutorial, 64x256x128 with 4 warps and two
    # programs per SM (80 KB of operands each; C reuses them).
    9: GemmConfig(BLOCK_M=64, BLOCK_N=256, BLOCK_K=128, STAGES=1, num_warps=4, GROUP_M=8),
    # Blackwell: Triton's tcgen05 tutorial found 128x128x128 with 4 warps fastest for the
    # synchronous kernel; 64 KB of operands and 128 TMEM columns, so two programs fit on an SM.
    10: GemmConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, STAGES=1, num_warps=4, GROUP_M=8),
}

__all__ = [
    "CONFIGS",
    "blocked_kernel",
    "compile_specs",
    "config_for",
    "prepare",
    "reads_transposed_a",
    "unsupported_reason",
]


@gluon.jit(do_not_specialize_on_alignment=["bias"])
def blocked_kernel(
    a_desc,
    b_desc,
    c_desc,
    bias,
    MMA: gl.constexpr,
    B_KMAJOR: gl.constexpr,
    A_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    HAS_BIAS: gl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] tile of C = A @ B (+ bias[N] with HAS_BIAS; None and False without).
    A_KMAJOR False: A is read through the [K, M] matrix behind a transposed view."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1] if A_KMAJOR else a_desc.block_type.shape[0]
    dtype: gl.constexpr = a_desc.dtype
    M = c_desc.shape[0]
    N = c_desc.shape[1]
    K = a_desc.shape[1] if A_KMAJOR else a_desc.shape[0]

    pid_m, pid_n = grouped_tile(gl.program_id(0), gl.cdiv(M, BLOCK_M), gl.cdiv(N, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N

    a_buf = gl.allocate_shared_memory(dtype, a_desc.block_type.shape, a_desc.layout)
    b_buf = gl.allocate_shared_memory(dtype, b_desc.block_type.shape, b_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)

    mma = MMA.initialize(dtype, BLOCK_M, BLOCK_N, gl.num_warps())
    phase = 0
    for k in range(0, K, BLOCK_K):
        load_step(a_desc, b_desc, off_m, off_n, k, bar, a_buf, b_buf, B_KMAJOR, A_KMAJOR=A_KMAJOR)
        mbarrier.wait(bar, phase)
        phase ^= 1
        mma = mma.issue(a_operand(a_buf, A_KMAJOR), b_operand(b_buf, B_KMAJOR))
        mma = mma.wait(0)  # synchronous: a_buf/b_buf are free for the next step
    mbarrier.invalidate(bar)

    c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
    if HAS_BIAS:  # the accumulator taken in column slices, each with its bias
        store_biased_tile(c_desc, c_smem, mma, off_m, off_n, None, None, 0, bias)
    else:
        acc, mma = mma.take_result()
        store_tile(c_desc, c_smem, acc, off_m, off_n)
    tma.store_wait(0)


def _constexprs(
    cfg: GemmConfig, capability: tuple[int, int], layout: str, a_layout: str = "row"
) -> dict[str, object]:
    return {
        "MMA": select_mma(capability),
        "B_KMAJOR": is_kmajor(layout),
        "A_KMAJOR": is_a_kmajor(a_layout),
        "GROUP_M": cfg.GROUP_M,
    }


RUNG = Rung("Blocked", blocked_kernel, _constexprs, configs=CONFIGS, transposed_a=True)


# The provider contract (gluon_survey/registry.py), answered by the Rung.
config_for, candidates, prepare, compile_specs = provider_functions(lambda: RUNG)
