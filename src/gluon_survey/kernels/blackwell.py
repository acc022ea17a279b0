"""The Blackwell (sm_100a) side of the ladder: tcgen05 MMAs with the accumulator in tensor memory.

Two things live here.

`MMAv5` is the Blackwell implementation of the MMA interface in `common.py`, so Blocked, Pipelined
and persistent run unchanged on sm_100: the fp32 accumulator lives in tensor memory (TMEM) instead
of registers, one thread issues each MMA for the whole CTA, and completion is signalled on an
mbarrier instead of being waited for with a warpgroup fence. The accumulator only passes through
registers in the epilogue, which is why the Blackwell configs use 4 warps for a 128x256 tile where
Hopper needs 8.

`warpspec_tcgen05_kernel` is the Blackwell warp-specialized rung. Its shape follows from what
tcgen05 changes: a single thread issues an MMA for the whole CTA and the accumulator does not
occupy the issuing warps, so

* one TMA warp fills a ring of STAGES operand stages (`ready` / `empty` barriers);
* one MMA warp issues every tcgen05 MMA; each MMA's completion frees its operand stage, and one
  commit per tile marks that tile's accumulator complete;
* the default partition (4 warps) is the epilogue: TMEM -> registers -> fp16 -> smem -> TMA store.

The accumulator is double-buffered in TMEM (2 x 128x256 fp32 = all 512 columns) with `acc_ready` /
`acc_empty` barriers, so the epilogue of tile i runs while the MMA warp already accumulates tile
i+1: the tensor cores wait for an epilogue only if it takes longer than a whole tile's main loop.
The epilogue is subtiled: it moves the
accumulator out in 128xEPILOGUE_N column slices through two small smem buffers, so it needs only
EPILOGUE_N fp32 registers per thread and 2 x 16 KB of smem, which leaves room for 4 stages of
48 KB (a whole 64 KB C tile would not fit beside them).

Compiled and instruction-checked for sm_100a by this project; not run by it (see docs/blackwell.md).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..compat import (
    TensorMemoryLayout,
    aggregate,
    allocate_tensor_memory,
    tcgen05_commit,
    tcgen05_mma,
    tensor_memory_descriptor,
    tmem_load,
)
from ..registry import CompileSpec, Launch
from .common import (
    GL_DTYPES,
    GemmConfig,
    b_is_kmajor,
    b_operand,
    desc_signature,
    grouped_tile,
    init_barriers,
    load_partition,
    mbarrier,
    num_tiles,
    smem_layout,
    store_slice,
    tma,
)

TMEM_COLUMNS = gl.constexpr(512)  # 32-bit columns of tensor memory per SM (128 lanes each)

# --------------------------------------------------------------------------------------------------
# sm_100 configs of the rungs that run through `MMAv5` (warpspec's is beside its kernel below).
# Triton's Blackwell tutorials (06, 07, 08; numbers in docs/blackwell.md) found 128x256x64 with 4
# warps best for the pipelined designs: the accumulator is in TMEM, so 4 warps are enough.

BLACKWELL_CONFIGS: dict[str, GemmConfig] = {
    # 06-tcgen05: the synchronous kernel was fastest at 128x128x128, 4 warps. 64 KB of operands +
    # a 32 KB C tile and 128 TMEM columns per program: two programs fit on an SM.
    "Blocked": GemmConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, STAGES=1, num_warps=4, GROUP_M=8),
    # 07-persistence: 4 stages of 48 KB beat 3 on Blackwell. The C tile is allocated after the
    # ring's last use and reuses its shared memory, so 4 stages fit.
    "Pipelined": GemmConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, STAGES=4, num_warps=4, GROUP_M=8),
    # As on Hopper, the persistent rung's C leaves in 128x64 slices through two 16 KB buffers that
    # stay allocated beside the ring (tile i's store overlaps tile i+1's loop), so 4 stages fit.
    "persistent": GemmConfig(
        BLOCK_M=128,
        BLOCK_N=256,
        BLOCK_K=64,
        STAGES=4,
        num_warps=4,
        GROUP_M=8,
        EPILOGUE_N=64,
        EPILOGUE_BUFFERS=2,
    ),
}


@gluon.constexpr_function
def acc_tmem_layout(BLOCK_M, BLOCK_N):
    """fp32 accumulator in TMEM: one row per lane (BLOCK_M = 128 uses all lanes), one 32-bit column
    per element (`col_stride=1`), so a BLOCK_N-wide tile takes BLOCK_N of the 512 columns."""
    return TensorMemoryLayout(block=(int(BLOCK_M), int(BLOCK_N)), col_stride=1)


# --------------------------------------------------------------------------------------------------
# MMAv5: the MMA interface on tcgen05.


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


# --------------------------------------------------------------------------------------------------
# Warp-specialized rung: TMA warp, MMA warp, epilogue warps.

# 08-warp-specialization: 128x256x64, 4 stages, epilogue subtiled by 4, 4 epilogue warps, GROUP_M=8.
WARPSPEC_CONFIG = GemmConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, STAGES=4, num_warps=4, GROUP_M=8)
EPILOGUE_N = 64  # columns per epilogue slice: 128x64 fp32 = 64 registers per thread
EPILOGUE_BUFFERS = 2  # smem slices in flight: slice i is written while slice i-1 is being stored
# Registers per thread requested for the TMA warp and the MMA warp. setmaxnreg acts on whole
# warpgroups and the two 1-warp workers share one, so both run with the larger value (SASS:
# USETMAXREG.DEALLOC 0x28); the epilogue warpgroup grows into what they give up.
LOAD_REGS = 40  # addresses, grouped-order coordinates, counters
MMA_REGS = 24  # barrier waits and one MMA per K step
BLACKWELL_CONFIGS["warpspec"] = WARPSPEC_CONFIG


@gluon.jit
def _mma_partition(
    a_bufs, b_bufs, acc_bufs, ready, empty, acc_ready, acc_empty, my_tiles, k_steps, B_KMAJOR: gl.constexpr
):
    """MMA warp: per tile, take a free accumulator buffer, issue one MMA per K step (each one frees
    its operand stage when it completes), then commit: `acc_ready` fires when the tile is done."""
    STAGES: gl.constexpr = a_bufs.shape[0]
    it = 0
    for n in range(my_tiles):
        buf = n % 2
        # Use u of a buffer needs use u-1 drained by the epilogue; a fresh barrier passes parity 1.
        mbarrier.wait(acc_empty.index(buf), ((n // 2) & 1) ^ 1)
        acc = acc_bufs.index(buf)
        for k in range(k_steps):
            slot = it % STAGES
            mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
            tcgen05_mma(
                a_bufs.index(slot),
                b_operand(b_bufs.index(slot), B_KMAJOR),
                acc,
                use_acc=k > 0,
                mbarriers=[empty.index(slot)],
            )
            it += 1
        tcgen05_commit(acc_ready.index(buf))  # arrives once every MMA issued so far has completed


@gluon.jit
def _epilogue_partition(
    c_desc, c_bufs, acc_bufs, acc_ready, acc_empty, num_pid_m, num_pid_n, my_tiles, GROUP_M: gl.constexpr
):
    """Epilogue warps: per tile, wait for its accumulator, move it out slice by slice (TMEM ->
    registers -> output dtype -> smem -> TMA store), and hand the buffer back to the MMA warp as
    soon as the last slice is in registers."""
    BLOCK_M: gl.constexpr = acc_bufs.shape[1]
    BLOCK_N: gl.constexpr = acc_bufs.shape[2]
    SLICE_N: gl.constexpr = c_desc.block_type.shape[1]
    SLICES: gl.constexpr = BLOCK_N // SLICE_N
    BUFFERS: gl.constexpr = c_bufs.shape[0]
    for n in range(my_tiles):
        tile = gl.program_id(0) + n * gl.num_programs(0)
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        buf = n % 2
        mbarrier.wait(acc_ready.index(buf), (n // 2) & 1)
        acc = acc_bufs.index(buf)
        for i in gl.static_range(SLICES):
            part = tmem_load(acc.slice(i * SLICE_N, SLICE_N)).to(c_desc.dtype)
            if i == SLICES - 1:
                mbarrier.arrive(acc_empty.index(buf))  # the MMA warp may overwrite this buffer
            off_n = pid_n * BLOCK_N + i * SLICE_N
            store_slice(c_desc, c_bufs.index(i % BUFFERS), part, pid_m * BLOCK_M, off_n, BUFFERS - 1)
    tma.store_wait(0)


@gluon.jit
def warpspec_tcgen05_kernel(
    a_desc,
    b_desc,
    c_desc,
    B_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    EPILOGUE_BUFFERS: gl.constexpr,
    LOAD_REGS: gl.constexpr,
    MMA_REGS: gl.constexpr,
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
    c_bufs = gl.allocate_shared_memory(dtype, c_shape, c_desc.layout)
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
                (c_desc, c_bufs, acc_bufs, acc_ready, acc_empty, num_pid_m, num_pid_n, my_tiles, GROUP_M),
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


# --------------------------------------------------------------------------------------------------
# Host side.


def _warpspec_constexprs(kmajor: bool) -> dict[str, object]:
    return {
        "B_KMAJOR": kmajor,
        "GROUP_M": WARPSPEC_CONFIG.GROUP_M,
        "STAGES": WARPSPEC_CONFIG.STAGES,
        "EPILOGUE_BUFFERS": EPILOGUE_BUFFERS,
        "LOAD_REGS": LOAD_REGS,
        "MMA_REGS": MMA_REGS,
    }


def _warpspec_blocks(kmajor: bool) -> tuple[list[int], list[int], list[int]]:
    """TMA block shapes of A, B and C; C is one epilogue slice, not the whole tile."""
    cfg = WARPSPEC_CONFIG
    BM, BN, BK = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
    return [BM, BK], ([BN, BK] if kmajor else [BK, BN]), [BM, EPILOGUE_N]


def prepare_warpspec(a, b, out) -> Launch:
    """The sm_100 `warpspec` launch: one program per SM (or per tile, if fewer), persistent."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ..api import sm_count

    cfg = WARPSPEC_CONFIG
    gdt = GL_DTYPES[str(a.dtype).removeprefix("torch.")]
    kmajor = b_is_kmajor(b)
    a_block, b_block, c_block = _warpspec_blocks(kmajor)
    a_desc = TensorDescriptor.from_tensor(a, a_block, smem_layout(a_block, gdt))
    b_desc = TensorDescriptor.from_tensor(b.t() if kmajor else b, b_block, smem_layout(b_block, gdt))
    c_desc = TensorDescriptor.from_tensor(out, c_block, smem_layout(c_block, gdt))
    M, N = out.shape
    grid = (min(sm_count(a.device), num_tiles(M, N, cfg)),)
    kw = _warpspec_constexprs(kmajor)

    def fn():
        warpspec_tcgen05_kernel[grid](a_desc, b_desc, c_desc, **kw, num_warps=cfg.num_warps)

    return Launch(fn, cfg.table() | {"design": "tcgen05 load/MMA/epilogue warps", "epilogue_n": EPILOGUE_N})


def warpspec_compile_specs(dtype: str = "float16") -> list[CompileSpec]:
    """The sm_100a `warpspec` kernels for `inspect`, one per B layout."""
    specs = []
    for kmajor in (False, True):
        layout = "t" if kmajor else "row"
        a_block, b_block, c_block = _warpspec_blocks(kmajor)
        constexprs = _warpspec_constexprs(kmajor)
        signature = {
            "a_desc": desc_signature(a_block, dtype),
            "b_desc": desc_signature(b_block, dtype),
            "c_desc": desc_signature(c_block, dtype),
        } | dict.fromkeys(constexprs, "constexpr")
        specs.append(
            CompileSpec(
                "warpspec",
                f"warpspec_tcgen05_kernel {WARPSPEC_CONFIG.label} epi{EPILOGUE_N} B{layout}",
                warpspec_tcgen05_kernel,
                signature,
                constexprs,
                {"num_warps": WARPSPEC_CONFIG.num_warps},
            )
        )
    return specs


__all__ = [
    "BLACKWELL_CONFIGS",
    "EPILOGUE_N",
    "TMEM_COLUMNS",
    "WARPSPEC_CONFIG",
    "MMAv5",
    "acc_tmem_layout",
    "prepare_warpspec",
    "warpspec_compile_specs",
    "warpspec_tcgen05_kernel",
]
