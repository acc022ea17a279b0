"""What every rung shares: the config dataclass, host-side descriptors and grid, and the small
device functions (TMA loads of an A/B step, the grouped tile order, the epilogue store).

The architecture is chosen once, on the host, by `select_mma(capability)`: it returns the MMA
aggregate class (Hopper `WGMMA` here, Blackwell `MMAv5` in `kernels/blackwell.py`) that the rung
kernels receive as a constexpr and call through one interface:

    mma = MMA.initialize(dtype, BLOCK_M, BLOCK_N, num_warps)   # fresh accumulator, use_acc=False
    mma = mma.issue(a_smem, b_smem)                             # async C += A @ B
    mma = mma.wait(num_outstanding)                              # at most that many MMAs in flight
    acc, mma = mma.take_result()                                 # fp32 registers; accumulator reset

so the rest of a rung (TMA, barriers, loop structure, epilogue) is the same code on both.
(No `from __future__ import annotations` here: aggregates check field types at run time.)
"""

from dataclasses import dataclass

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_accumulator,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from ..compat import aggregate, tma_load, tma_store

GL_DTYPES = {"float16": gl.float16, "bfloat16": gl.bfloat16}
SMEM_LIMIT = 227 * 1024  # dynamic shared memory per block on Hopper and B200


@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and launch shape of one rung. Every rung reads only the fields it needs."""

    BLOCK_M: int = 128
    BLOCK_N: int = 256
    BLOCK_K: int = 64
    STAGES: int = 3  # shared-memory ring depth (Blocked: 1)
    num_warps: int = 8
    GROUP_M: int = 8  # grouped tile order: GROUP_M tile rows sweep N together (L2 reuse)
    # Epilogue staging: C leaves through shared memory in [BLOCK_M, EPILOGUE_N] column slices
    # (0: the whole tile at once), cycling through EPILOGUE_BUFFERS buffers of that size.
    EPILOGUE_N: int = 0
    EPILOGUE_BUFFERS: int = 1
    # Deferred epilogue (persistent kernels): the whole C tile is staged in shared memory, one buffer
    # per slice, and its slices' TMA stores are issued during the next tile's first K steps.
    DEFER_STORE: bool = False

    def __post_init__(self):
        if self.DEFER_STORE and self.EPILOGUE_BUFFERS * self.epilogue_n != self.BLOCK_N:
            raise ValueError("DEFER_STORE stages whole tiles: EPILOGUE_BUFFERS * EPILOGUE_N must be BLOCK_N")

    @property
    def epilogue_n(self) -> int:
        return self.EPILOGUE_N or self.BLOCK_N

    @property
    def label(self) -> str:
        sliced = f" C{self.BLOCK_M}x{self.epilogue_n}x{self.EPILOGUE_BUFFERS}" if self.EPILOGUE_N else ""
        sliced += " deferred" if self.DEFER_STORE else ""
        return f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K} s{self.STAGES} w{self.num_warps}{sliced}"

    def table(self) -> dict[str, object]:
        table: dict[str, object] = {
            "BLOCK_M": self.BLOCK_M,
            "BLOCK_N": self.BLOCK_N,
            "BLOCK_K": self.BLOCK_K,
            "stages": self.STAGES,
            "warps": self.num_warps,
            "group_m": self.GROUP_M,
        }
        if self.EPILOGUE_N:
            table["epilogue_n"] = self.EPILOGUE_N
        if self.DEFER_STORE:
            table["epilogue"] = "deferred"
        return table


# --------------------------------------------------------------------------------------------------
# Hopper MMA: wgmma with the fp32 accumulator in registers.


@gluon.constexpr_function
def wgmma_layout(BLOCK_M, BLOCK_N, num_warps):
    """The wgmma accumulator layout: warps tile M in steps of 16 rows (a warpgroup covers 64), the
    rest go along N; the instruction's n is the largest multiple of 8 (<= 256) that divides the
    per-warp N extent, because a wider wgmma does more work per instruction issued."""
    warps_m, warps_n = 4, 1
    while warps_m * warps_n < num_warps:
        if 16 * warps_m < BLOCK_M:
            warps_m *= 2
        else:
            warps_n *= 2
    n_per_warp = BLOCK_N // warps_n
    instr_n = max(n for n in range(8, min(256, n_per_warp) + 1, 8) if n_per_warp % n == 0)
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps_m, warps_n], instr_shape=[16, instr_n, 16]
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
        layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps)
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


def select_mma(capability: tuple[int, int]):
    """The MMA implementation for a GPU: the one place where Hopper and Blackwell part ways."""
    if capability[0] == 9:
        return WGMMA
    if capability[0] == 10:
        from .blackwell import MMAv5

        return MMAv5
    raise RuntimeError(
        f"the Gluon rungs need a Hopper (sm_90) or datacenter Blackwell (sm_100) GPU; "
        f"this one is sm_{capability[0]}{capability[1]}"
    )


def rung_config(rung: str, capability: tuple[int, int], default: GemmConfig) -> GemmConfig:
    """A rung's config for this GPU: its own (Hopper) `default`, or the sm_100 one from blackwell.py."""
    if capability[0] == 10:
        from .blackwell import BLACKWELL_CONFIGS

        return BLACKWELL_CONFIGS.get(rung, default)
    return default


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """Shared by the rung modules: wgmma needs sm_90a, tcgen05 needs sm_100a (not sm_120)."""
    if capability[0] in (9, 10):
        return None
    if capability[0] == 12:
        return "sm_120 (consumer Blackwell) has no tcgen05/tensor memory and no wgmma"
    return f"needs sm_90 (wgmma) or sm_100 (tcgen05); this GPU is sm_{capability[0]}{capability[1]}"


# --------------------------------------------------------------------------------------------------
# Device building blocks shared by the rungs.


@gluon.jit
def load_step(a_desc, b_desc, off_m, off_n, off_k, bar, a_buf, b_buf, B_KMAJOR: gl.constexpr, pred=True):
    """TMA-load one K step of A ([BM, BK]) and B into shared memory, completing on `bar`.
    B is a [BK, BN] tile of a row-major [K, N] matrix, or (B_KMAJOR) a [BN, BK] tile of a [N, K]
    weight. Out-of-bounds rows/columns (ragged M, N and the K tail) arrive as zeros."""
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred)
    tma_load(a_desc, [off_m, off_k], bar, a_buf, pred)
    if B_KMAJOR:
        tma_load(b_desc, [off_n, off_k], bar, b_buf, pred)
    else:
        tma_load(b_desc, [off_k, off_n], bar, b_buf, pred)


@gluon.jit
def b_operand(b_buf, B_KMAJOR: gl.constexpr):
    """B as the MMA wants it, [BK, BN]: a K-major weight tile is just a transposed view."""
    if B_KMAJOR:
        b = b_buf.permute((1, 0))
    else:
        b = b_buf
    return b


@gluon.jit
def grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """Tile id -> (pid_m, pid_n) so that GROUP_M consecutive tile rows walk N together: the
    programs running at one time share A rows and B columns in L2."""
    tiles_per_group = GROUP_M * num_pid_n
    group = tile_id // tiles_per_group
    first_m = group * GROUP_M
    group_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % tiles_per_group) % group_m
    pid_n = (tile_id % tiles_per_group) // group_m
    return pid_m, pid_n


@gluon.jit
def load_partition(
    a_desc,
    b_desc,
    a_bufs,
    b_bufs,
    ready,
    empty,
    B_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
):
    """The TMA-load partition of the warp-specialized kernels (Hopper and Blackwell): fill the ring
    for every (tile, K step) of this program in grouped order, each fill once whoever read the
    stage's previous contents has released it on `empty`. A tile is BOXES A boxes tall (a_bufs has
    BOXES buffers per stage of b_bufs), and stage s holds them in a_bufs[s * BOXES + i]."""
    STAGES: gl.constexpr = b_bufs.shape[0]
    BOXES: gl.constexpr = a_bufs.shape[0] // STAGES
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0] * BOXES
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0] if B_KMAJOR else b_desc.block_type.shape[1]
    num_pid_m = gl.cdiv(a_desc.shape[0], BLOCK_M)
    num_pid_n = gl.cdiv(b_desc.shape[0] if B_KMAJOR else b_desc.shape[1], BLOCK_N)
    k_steps = gl.cdiv(a_desc.shape[1], BLOCK_K)
    it = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        for k in range(k_steps):
            slot = it % STAGES
            # Fill f of a slot needs fill f-1 consumed; a fresh barrier passes the parity-1 wait.
            mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
            if BOXES == 1:
                load_step(
                    a_desc,
                    b_desc,
                    pid_m * BLOCK_M,
                    pid_n * BLOCK_N,
                    k * BLOCK_K,
                    ready.index(slot),
                    a_bufs.index(slot),
                    b_bufs.index(slot),
                    B_KMAJOR,
                )
            else:
                bar = ready.index(slot)
                mbarrier.expect(bar, BOXES * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
                for i in gl.static_range(BOXES):
                    off_m = pid_m * BLOCK_M + i * a_desc.block_type.shape[0]
                    tma_load(a_desc, [off_m, k * BLOCK_K], bar, a_bufs.index(slot * BOXES + i))
                if B_KMAJOR:
                    tma_load(b_desc, [pid_n * BLOCK_N, k * BLOCK_K], bar, b_bufs.index(slot))
                else:
                    tma_load(b_desc, [k * BLOCK_K, pid_n * BLOCK_N], bar, b_bufs.index(slot))
            it += 1


@gluon.jit
def store_tile(c_desc, c_smem, acc, off_m, off_n):
    """Epilogue: fp32 registers -> output dtype -> shared memory -> TMA store (clipped at M, N).
    The fence orders the generic-proxy smem writes before the async-proxy TMA read."""
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma_store(c_desc, [off_m, off_n], c_smem)


@gluon.jit
def store_slice(c_desc, c_smem, part, off_m, off_n, PENDING: gl.constexpr):
    """One slice of a sliced epilogue: wait until at most PENDING earlier TMA stores are still in
    flight (so the one that last read `c_smem` has finished), then registers -> output dtype ->
    `c_smem` -> TMA store at (off_m, off_n)."""
    tma.store_wait(PENDING)
    c_smem.store(part.to(c_desc.dtype))
    fence_async_shared()
    tma_store(c_desc, [off_m, off_n], c_smem)


@gluon.jit
def store_tile_sliced(
    c_desc, c_bufs, c, off_m, off_n, BUFFERS: gl.constexpr, BASE: gl.constexpr = 0, FIRST: gl.constexpr = 0
):
    """Epilogue in column slices: c [BM, BN] leaves as BN / SN slices of [BM, SN] (SN = the C
    descriptor's block width), slice i through buffer BASE + i % BUFFERS of `c_bufs`. A buffer is
    rewritten only once its previous TMA store has read it (`store_wait` leaves the other buffers'
    stores in flight). Halving c along N is a register renaming, no data moves; recursion ends at SN."""
    BLOCK_M: gl.constexpr = c.shape[0]
    WIDTH: gl.constexpr = c.shape[1]
    SLICE_N: gl.constexpr = c_desc.block_type.shape[1]
    if WIDTH == SLICE_N:
        store_slice(c_desc, c_bufs.index(BASE + FIRST % BUFFERS), c, off_m, off_n, BUFFERS - 1)
    else:
        left, right = c.reshape([BLOCK_M, 2, WIDTH // 2]).permute(0, 2, 1).split()
        HALF: gl.constexpr = WIDTH // 2
        store_tile_sliced(c_desc, c_bufs, left, off_m, off_n, BUFFERS, BASE, FIRST)
        store_tile_sliced(c_desc, c_bufs, right, off_m, off_n + HALF, BUFFERS, BASE, FIRST + HALF // SLICE_N)


# Deferred epilogue. A synchronous C store costs a persistent program ~2000 clocks per 128x256 tile on
# H100 (64 KB leave the SM at ~32 B/clock) with the tensor cores idle; one 64 KB TMA store issued at
# the start of the next tile instead stretches that tile's first K steps as much, because it competes
# with the ring's loads. Staged whole and stored one 16 KB slice every few K steps, it overlaps the
# MMAs (docs/perf-notes.md, entry 15).


@gluon.jit
def _write_slices(c_bufs, c, FIRST: gl.constexpr = 0):
    """c [BM, BN] -> output dtype -> shared memory, column slice i (c_bufs' width) into
    c_bufs[FIRST + i]."""
    BLOCK_M: gl.constexpr = c.shape[0]
    WIDTH: gl.constexpr = c.shape[1]
    SLICE_N: gl.constexpr = c_bufs.shape[2]
    if WIDTH == SLICE_N:
        c_bufs.index(FIRST).store(c.to(c_bufs.dtype))
    else:
        left, right = c.reshape([BLOCK_M, 2, WIDTH // 2]).permute(0, 2, 1).split()
        _write_slices(c_bufs, left, FIRST)
        _write_slices(c_bufs, right, FIRST + WIDTH // 2 // SLICE_N)


@gluon.jit
def stage_tile(c_desc, c_bufs, c, prev_m, prev_n, k_steps, spacing, pending):
    """Deferred epilogue, at the end of a tile: store what the K loop left of the previous tile
    (at prev_m, prev_n; `pending`: there is one), wait until it has left the staging buffers, then
    stage c there slice by slice, fenced for the TMA stores of the next tile's loop."""
    store_staged_rest(c_desc, c_bufs, prev_m, prev_n, k_steps, spacing, pending)
    tma.store_wait(0)
    _write_slices(c_bufs, c)
    fence_async_shared()


@gluon.jit
def deferred_store_spacing(k_steps):
    """log2 of the K steps between two deferred slice stores: 4 steps apart when a tile has 16 or
    more (measured best on H100 at K = 4096: 1 step apart stretches the loop more), 2 or 1 below."""
    return (k_steps >= 16).to(gl.int32) + (k_steps >= 8).to(gl.int32)


@gluon.jit
def store_staged_slice(c_desc, c_bufs, off_m, off_n, k, spacing, pending):
    """Called at K step k of a tile: every 2**spacing steps, TMA-store the next staged slice of the
    previous tile (at off_m, off_n), while there is one (`pending`: a previous tile exists)."""
    SLICE_N: gl.constexpr = c_desc.block_type.shape[1]
    SLICES: gl.constexpr = c_bufs.shape[0]
    s = k >> spacing
    if pending & (s < SLICES) & ((s << spacing) == k):
        tma_store(c_desc, [off_m, off_n + s * SLICE_N], c_bufs.index(s))


@gluon.jit
def store_staged_rest(c_desc, c_bufs, off_m, off_n, k_steps, spacing, pending):
    """Store the staged slices that a K loop of k_steps steps did not reach: after a short tile, or
    (k_steps = 0) all of the program's last tile."""
    SLICE_N: gl.constexpr = c_desc.block_type.shape[1]
    SLICES: gl.constexpr = c_bufs.shape[0]
    for i in gl.static_range(SLICES):
        if pending & ((gl.to_tensor(i) << spacing) >= k_steps):
            tma_store(c_desc, [off_m, off_n + i * SLICE_N], c_bufs.index(i))


@gluon.jit
def init_barriers(bars, COUNT: gl.constexpr, ARRIVALS: gl.constexpr = 1):
    for i in gl.static_range(COUNT):
        mbarrier.init(bars.index(i), count=ARRIVALS)


@gluon.jit
def invalidate_barriers(bars, COUNT: gl.constexpr):
    for i in gl.static_range(COUNT):
        mbarrier.invalidate(bars.index(i))


# --------------------------------------------------------------------------------------------------
# Host side: descriptors, for launches and for GPU-less compiles.


def b_is_kmajor(b) -> bool:
    """True when b is the transpose view of a contiguous [N, K] weight (the nn.Linear case)."""
    return b.stride(1) != 1


def smem_layout(block_shape, gl_dtype):
    return gl.NVMMASharedLayout.get_default_for(list(block_shape), gl_dtype)


def make_descriptors(a, b, c, cfg: GemmConfig):
    """Host TMA descriptors for A [M,K], B ([K,N] or the view of [N,K]) and C [M,N]."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    gdt = GL_DTYPES[str(a.dtype).removeprefix("torch.")]
    BM, BN, BK = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
    kmajor = b_is_kmajor(b)
    b_src, b_block = (b.t(), [BN, BK]) if kmajor else (b, [BK, BN])
    a_desc = TensorDescriptor.from_tensor(a, [BM, BK], smem_layout([BM, BK], gdt))
    b_desc = TensorDescriptor.from_tensor(b_src, b_block, smem_layout(b_block, gdt))
    c_block = [BM, cfg.epilogue_n]
    c_desc = TensorDescriptor.from_tensor(c, c_block, smem_layout(c_block, gdt))
    return a_desc, b_desc, c_desc, kmajor


def desc_signature(block_shape, dtype: str) -> str:
    """The signature string of a tensor-descriptor argument, for GPU-less compiles."""
    gdt = GL_DTYPES[dtype]
    ty = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    return f"tensordesc<{ty}[{block_shape[0]}, {block_shape[1]}],{smem_layout(block_shape, gdt)!r}>"


def gemm_signature(cfg: GemmConfig, dtype: str, kmajor: bool) -> dict[str, str]:
    BM, BN, BK = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
    return {
        "a_desc": desc_signature([BM, BK], dtype),
        "b_desc": desc_signature([BN, BK] if kmajor else [BK, BN], dtype),
        "c_desc": desc_signature([BM, cfg.epilogue_n], dtype),
    }


def num_tiles(M: int, N: int, cfg: GemmConfig) -> int:
    return triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)


__all__ = [
    "SMEM_LIMIT",
    "WGMMA",
    "GemmConfig",
    "b_is_kmajor",
    "b_operand",
    "deferred_store_spacing",
    "desc_signature",
    "fence_async_shared",
    "gemm_signature",
    "grouped_tile",
    "init_barriers",
    "invalidate_barriers",
    "load_partition",
    "load_step",
    "make_descriptors",
    "mbarrier",
    "num_tiles",
    "rung_config",
    "select_mma",
    "stage_tile",
    "store_slice",
    "store_staged_rest",
    "store_staged_slice",
    "store_tile",
    "store_tile_sliced",
    "tma",
    "unsupported_reason",
]
