"""Blackwell's MMA (sm_100a): tcgen05, with the fp32 accumulator in tensor memory (TMEM).

`MMAv5` implements the MMA interface of `kernels/hopper.py` on tcgen05, so Blocked, Pipelined and
persistent run unchanged on sm_100: the accumulator lives in TMEM instead of registers, one thread
issues each MMA for the whole CTA, and completion is signalled on an mbarrier instead of being
waited for with a warpgroup fence. The accumulator only passes through registers in the epilogue,
which is why the Blackwell configs use 4 warps for a 128x256 tile where Hopper needs 8.

Compiled and instruction-checked for sm_100a by this project; not run by it (docs/blackwell.md).
(No `from __future__ import annotations` here: aggregates check field types at run time.)
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from ..compat import (
    TensorMemoryLayout,
    aggregate,
    allocate_tensor_memory,
    tcgen05_mma,
    tensor_memory_descriptor,
    tmem_load,
)
from .common import init_barriers

TMEM_COLUMNS = gl.constexpr(512)  # 32-bit columns of tensor memory per SM (128 lanes each)


@gluon.constexpr_function
def acc_tmem_layout(BLOCK_M, BLOCK_N):
    """fp32 accumulator in TMEM: one row per lane (BLOCK_M = 128 uses all lanes), one 32-bit column
    per element (`col_stride=1`), so a BLOCK_N-wide tile takes BLOCK_N of the 512 columns."""
    return TensorMemoryLayout(block=(int(BLOCK_M), int(BLOCK_N)), col_stride=1)


@gluon.jit
def _wait_mma(bars, j):
    """Wait until MMA number j (0, 1, 2, ... in issue order) has completed; no-op for j < 0.
    MMA j arrives on commit barrier j % 2, as that barrier's (j // 2)-th completion."""
    mbarrier.wait(bars.index(j & 1), (j >> 1) & 1, pred=j >= 0)


@aggregate
class MMAv5:
    """tcgen05 with the fp32 accumulator in tensor memory.

    Every MMA commits to one of two barriers of its own, alternately (never to a TMA barrier); a
    commit arrives once its MMA and every earlier one have completed. So "at most 1 outstanding"
    is "the commit of MMA issued-2 has arrived", on the other barrier than the MMA just issued,
    and `wait(1)` lets that one run on. Barrier and phase follow from the count of MMAs issued.
    `use_acc=False` on a tile's first MMA overwrites the stale accumulator: TMEM is never cleared.
    """

    acc: tensor_memory_descriptor
    bars: gl.shared_memory_descriptor
    issued: gl.tensor
    use_acc: gl.tensor

    @gluon.constexpr_function
    def __init__(self, acc, bars, issued, use_acc):
        self.acc = acc
        self.bars = bars
        self.issued = issued
        self.use_acc = use_acc

    @gluon.jit
    def initialize(
        dtype: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, num_warps: gl.constexpr
    ):
        acc = allocate_tensor_memory(gl.float32, [BLOCK_M, BLOCK_N], acc_tmem_layout(BLOCK_M, BLOCK_N))
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        init_barriers(bars, 2)
        return MMAv5(acc, bars, gl.to_tensor(0), gl.to_tensor(False))

    @gluon.jit
    def issue(self, a, b):
        tcgen05_mma(a, b, self.acc, use_acc=self.use_acc, mbarriers=[self.bars.index(self.issued & 1)])
        return MMAv5(self.acc, self.bars, self.issued + 1, gl.to_tensor(True))

    @gluon.jit
    def wait(self, num_outstanding: gl.constexpr):
        gl.static_assert(num_outstanding == 0 or num_outstanding == 1, "MMAv5.wait: 0 or 1 outstanding")
        _wait_mma(self.bars, self.issued - 1 - num_outstanding)
        return self

    @gluon.jit
    def take_result(self):
        _wait_mma(self.bars, self.issued - 1)
        acc = tmem_load(self.acc)
        return acc, MMAv5(self.acc, self.bars, self.issued, gl.to_tensor(False))

    @gluon.jit
    def result_slice(self, J: gl.constexpr, SLICE_N: gl.constexpr):
        """Columns [J * SLICE_N, (J + 1) * SLICE_N) of the finished accumulator, loaded from tensor
        memory alone (a thread holds a row of the slice, not of the tile)."""
        _wait_mma(self.bars, self.issued - 1)
        return tmem_load(self.acc.slice(J * SLICE_N, SLICE_N))
