"""Hopper's MMA (sm_90a): the asynchronous warpgroup MMA, wgmma, with the fp32 accumulator in the
registers of the warps that issue it. `WGMMA` implements the MMA interface every rung kernel
calls (`kernels/arch.py` says which one a GPU gets):

    mma = MMA.initialize(dtype, BLOCK_M, BLOCK_N, num_warps)   # fresh accumulator, use_acc=False
                                                                # (dtype: the operands')
    mma = mma.issue(a_smem, b_smem)                             # async C += A @ B
    mma = mma.wait(num_outstanding)                             # at most that many MMAs in flight
    acc, mma = mma.take_result()                                # fp32 registers; accumulator reset
    part = mma.result_slice(J, SLICE_N)                         # of the finished accumulator: its
                                                                # columns [J * SLICE_N, +SLICE_N)

(No `from __future__ import annotations` here: aggregates check field types at run time.)
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    warpgroup_mma,
    warpgroup_mma_accumulator,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from ..compat import aggregate
from .common import column_slice


@gluon.constexpr_function
def wgmma_layout(BLOCK_M, BLOCK_N, num_warps, operand_bits=16):
    """The wgmma accumulator layout: warps tile M in steps of 16 rows (a warpgroup covers 64), the
    rest go along N; the instruction's n is the largest multiple of 8 (<= 256) that divides the
    per-warp N extent, because a wider wgmma does more work per instruction issued. Its k is 32
    bytes of operands: 16 fp16/bf16 elements, 32 fp8 ones."""
    warps_m, warps_n = 4, 1
    while warps_m * warps_n < num_warps:
        if 16 * warps_m < BLOCK_M:
            warps_m *= 2
        else:
            warps_n *= 2
    n_per_warp = BLOCK_N // warps_n
    instr_n = max(n for n in range(8, min(256, n_per_warp) + 1, 8) if n_per_warp % n == 0)
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps_m, warps_n], instr_shape=[16, instr_n, 256 // operand_bits]
    )


@aggregate
class WGMMA:
    """Hopper's asynchronous warpgroup MMA. `use_acc=False` on the first issue zeroes the
    accumulator for free, so a tile never spends instructions clearing 128 registers."""

    acc: warpgroup_mma_accumulator
    use_acc: gl.tensor

    @gluon.constexpr_function
    def __init__(self, acc, use_acc):
        self.acc = acc
        self.use_acc = use_acc

    @gluon.jit
    def initialize(
        dtype: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, num_warps: gl.constexpr
    ):
        layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps, dtype.primitive_bitwidth)
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout)
        return WGMMA(warpgroup_mma_init(acc), gl.to_tensor(False))

    @gluon.jit
    def issue(self, a, b):
        acc = warpgroup_mma(a, b, self.acc, use_acc=self.use_acc, is_async=True)
        return WGMMA(acc, gl.to_tensor(True))

    @gluon.jit
    def wait(self, num_outstanding: gl.constexpr):
        acc = warpgroup_mma_wait(num_outstanding, deps=(self.acc,))
        return WGMMA(warpgroup_mma_init(acc), self.use_acc)

    @gluon.jit
    def take_result(self):
        acc = warpgroup_mma_wait(0, deps=(self.acc,))
        return acc, WGMMA(warpgroup_mma_init(acc), gl.to_tensor(False))

    @gluon.jit
    def result_slice(self, J: gl.constexpr, SLICE_N: gl.constexpr):
        """Columns [J * SLICE_N, (J + 1) * SLICE_N) of the finished accumulator (the registers
        split, no data moved); the accumulator is left as it is."""
        acc = warpgroup_mma_wait(0, deps=(self.acc,))
        return column_slice(acc, J, SLICE_N)
