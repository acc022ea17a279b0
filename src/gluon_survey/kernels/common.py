"""What every rung shares: the config dataclass, the ring bookkeeping, the small device functions
(TMA loads of an A/B step, the grouped tile order, the producer partition, the epilogue stores)
and the host side (descriptors, compile specs). Nothing here depends on the GPU architecture: the
MMA is a constexpr argument of every rung kernel (`kernels/arch.py` picks it on the host).
(No `from __future__ import annotations` here: aggregates check field types at run time.)
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import triton
from triton import knobs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.runtime.driver import driver

from ..compat import RawLaunch, aggregate, raw_launch, tma_load, tma_store
from ..launch import ALIGN, B_LAYOUTS, CompileSpec, Launch, Scales, Target, Unaligned, b_layout, is_kmajor

GL_DTYPES = {"float16": gl.float16, "bfloat16": gl.bfloat16, "float8_e4m3fn": gl.float8e4nv}
FP8 = "float8_e4m3fn"
# Signature type names, and the output dtype `inspect` compiles an fp8 kernel with.
_SIGNATURE_TYPES = {"float16": "fp16", "bfloat16": "bf16", FP8: "fp8e4nv"}
FP8_OUT = "bfloat16"
OUT_BYTES = 2  # C is fp16 or bf16 (an fp8 product is written as bf16 or fp16 too)
SMEM_LIMIT = 227 * 1024  # dynamic shared memory per block on Hopper and B200
SMEM_PER_SM = 228 * 1024  # shared memory per SM, of which each resident block also takes 1 KB

# How a rung's C tile leaves: "after" (staged whole once the ring is dead, so the compiler gives
# it the ring's memory), "sliced" (slices through EPILOGUE_BUFFERS small buffers that live beside
# the ring), "deferred" (staged whole beside the ring and stored during the next tile's K loop).
EPILOGUES = ("after", "sliced", "deferred")


@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and launch shape of one rung on one architecture; each rung reads the fields it
    needs. Building one that does not fit in shared memory raises ValueError."""

    BLOCK_M: int = 128
    BLOCK_N: int = 256
    BLOCK_K: int = 64
    STAGES: int = 3  # shared-memory ring depth (Blocked: 1)
    num_warps: int = 8
    GROUP_M: int = 8  # grouped tile order: GROUP_M tile rows sweep N together (L2 reuse)
    EPILOGUE: str = "after"
    EPILOGUE_N: int = 0  # columns of a C slice (0: the whole BLOCK_N)
    EPILOGUE_BUFFERS: int = 1  # "sliced": buffers the slices cycle through
    ELEM_BYTES: int = 2  # bytes of an A or B element: 2 for fp16/bf16, 1 for an fp8 config

    def __post_init__(self):
        if self.EPILOGUE not in EPILOGUES:
            raise ValueError(f"EPILOGUE is one of {', '.join(EPILOGUES)}, got {self.EPILOGUE!r}")
        if self.BLOCK_N % self.epilogue_n:
            raise ValueError(f"EPILOGUE_N ({self.EPILOGUE_N}) must divide BLOCK_N ({self.BLOCK_N})")
        if self.smem_bytes() > SMEM_LIMIT:
            raise ValueError(
                f"{self.label} needs {self.smem_bytes()} B of shared memory; a block has {SMEM_LIMIT}"
            )

    @property
    def epilogue_n(self) -> int:
        return self.EPILOGUE_N or self.BLOCK_N

    @property
    def c_buffers(self) -> int:
        """[BLOCK_M, epilogue_n] staging buffers for C: a deferred tile is staged whole."""
        return self.BLOCK_N // self.epilogue_n if self.EPILOGUE == "deferred" else self.EPILOGUE_BUFFERS

    def smem_bytes(self) -> int:
        """Shared memory of the operand ring and the C staging (the barriers' few bytes aside)."""
        ring = self.STAGES * (self.a_rows * self.BLOCK_K + self.BLOCK_N * self.BLOCK_K) * self.ELEM_BYTES
        staging = self.c_copies * self.c_buffers * self.BLOCK_M * self.epilogue_n * OUT_BYTES
        return max(ring, staging) if self.EPILOGUE == "after" else ring + staging

    def blocks_per_sm(self) -> int:
        """How many programs of this config share an SM, as far as shared memory goes."""
        return max(1, SMEM_PER_SM // (self.smem_bytes() + 1024))

    @property
    def a_rows(self) -> int:
        """Rows of A a stage holds (a tile's height)."""
        return self.BLOCK_M

    @property
    def c_copies(self) -> int:
        """Independent sets of C staging buffers (one per MMA consumer)."""
        return 1

    @property
    def label(self) -> str:
        epilogue = {
            "after": "",
            "sliced": f" C{self.BLOCK_M}x{self.epilogue_n}x{self.c_buffers}",
            "deferred": f" C{self.BLOCK_M}x{self.epilogue_n}x{self.c_buffers} deferred",
        }[self.EPILOGUE]
        fp8 = " fp8" if self.ELEM_BYTES == 1 else ""
        return f"{self.a_rows}x{self.BLOCK_N}x{self.BLOCK_K}{fp8} s{self.STAGES} w{self.num_warps}{epilogue}"

    def table(self) -> dict[str, object]:
        """What a results row records of the config."""
        table: dict[str, object] = {
            "BLOCK_M": self.a_rows,
            "BLOCK_N": self.BLOCK_N,
            "BLOCK_K": self.BLOCK_K,
            "stages": self.STAGES,
            "warps": self.num_warps,
            "group_m": self.GROUP_M,
        }
        if self.EPILOGUE != "after":
            table["epilogue"] = self.EPILOGUE
            table["epilogue_n"] = self.epilogue_n
        return table


# --------------------------------------------------------------------------------------------------
# Device building blocks shared by the rungs.


@aggregate
class Ring:
    """A position in a ring of STAGES shared-memory stages, counted over every fill (or use) of the
    ring: fill c goes to stage c % STAGES, and its mbarrier completes phase (c // STAGES) & 1. A
    fresh mbarrier is in phase 0 and reads as if phase 1 had just completed, so the producer's
    first wait on a never-used stage (`wait_free`) passes at once."""

    count: gl.tensor
    STAGES: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, count, STAGES):
        self.count = count
        self.STAGES = gl.constexpr(STAGES)

    @gluon.jit
    def start(STAGES: gl.constexpr):
        return Ring(gl.to_tensor(0), STAGES)

    @gluon.jit
    def slot(self):
        return self.count % self.STAGES

    @gluon.jit
    def phase(self):
        return (self.count // self.STAGES) & 1

    @gluon.jit
    def next(self):
        return Ring(self.count + 1, self.STAGES)

    @gluon.jit
    def previous_slot(self):
        """The stage of the fill before this one ((count - 1) mod STAGES, never of a negative)."""
        return (self.count + self.STAGES - 1) % self.STAGES

    @gluon.jit
    def wait_filled(self, bars):
        """Wait until this fill has landed in its stage (`bars`: one per stage)."""
        mbarrier.wait(bars.index(self.slot()), self.phase())

    @gluon.jit
    def wait_free(self, bars):
        """Wait until whoever read this stage's previous fill has released it."""
        mbarrier.wait(bars.index(self.slot()), self.phase() ^ 1)


@gluon.jit
def load_step(a_desc, b_desc, off_m, off_n, off_k, bar, a_buf, b_buf, B_KMAJOR: gl.constexpr, pred=True):
    """TMA-load one K step of A ([BM, BK]) and B into shared memory, completing on `bar`.
    B is a [BK, BN] tile of a row-major [K, N] matrix, or (B_KMAJOR) a [BN, BK] tile of a [N, K]
    weight. Out-of-bounds rows/columns (ragged M, N and the K tail) arrive as zeros."""
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred)
    tma_load(a_desc, [off_m, off_k], bar, a_buf, pred)
    load_b(b_desc, off_n, off_k, bar, b_buf, B_KMAJOR, pred)


@gluon.jit
def load_b(b_desc, off_n, off_k, bar, b_buf, B_KMAJOR: gl.constexpr, pred=True):
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
    a_desc, b_desc, a_bufs, b_bufs, ready, empty, B_KMAJOR: gl.constexpr, GROUP_M: gl.constexpr
):
    """The TMA-load partition of the warp-specialized kernels (Hopper and Blackwell): fill the ring
    for every (tile, K step) of this program in grouped order, each fill once whoever read the
    stage's previous contents has released it on `empty`. A tile is BOXES A boxes tall (a_bufs has
    BOXES buffers per stage of b_bufs), and stage s holds them in a_bufs[s * BOXES + i]."""
    STAGES: gl.constexpr = b_bufs.shape[0]
    BOXES: gl.constexpr = a_bufs.shape[0] // STAGES
    BOX_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0] if B_KMAJOR else b_desc.block_type.shape[1]
    num_pid_m = gl.cdiv(a_desc.shape[0], BOX_M * BOXES)
    num_pid_n = gl.cdiv(b_desc.shape[0] if B_KMAJOR else b_desc.shape[1], BLOCK_N)
    k_steps = gl.cdiv(a_desc.shape[1], BLOCK_K)
    ring = Ring.start(STAGES)
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        for k in range(k_steps):
            ring.wait_free(empty)
            slot = ring.slot()
            bar = ready.index(slot)
            mbarrier.expect(bar, BOXES * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            for i in gl.static_range(BOXES):
                tma_load(
                    a_desc, [(pid_m * BOXES + i) * BOX_M, k * BLOCK_K], bar, a_bufs.index(slot * BOXES + i)
                )
            load_b(b_desc, pid_n * BLOCK_N, k * BLOCK_K, bar, b_bufs.index(slot), B_KMAJOR)
            ring = ring.next()


@gluon.jit
def store_tile(c_desc, c_smem, acc, off_m, off_n):
    """Epilogue: fp32 registers -> output dtype -> shared memory -> TMA store (clipped at M, N).
    The fence orders the generic-proxy smem writes before the async-proxy TMA read."""
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma_store(c_desc, [off_m, off_n], c_smem)


@gluon.jit
def scale_tile(acc, scale_a, scale_b, off_m, off_n, M, N, SCALING: gl.constexpr):
    """fp8 dequantization of an fp32 accumulator tile at (off_m, off_n) of the [M, N] output:
    SCALING 0 leaves it (fp16/bf16), 1 multiplies by the per-tensor scales *scale_a * *scale_b,
    2 by row-wise scales, scale_a[row] * scale_b[column] (masked at M and N). A thread holds a
    scale for each of its columns, so the epilogues call this per C slice, not per tile (a
    256-wide tile's column scales alone would take 64 registers per thread)."""
    if SCALING == 1:
        acc = acc * (gl.load(scale_a) * gl.load(scale_b))
    elif SCALING == 2:
        acc = scale_rows(acc, scale_a, off_m, M)
        acc = acc * gl.expand_dims(column_scales(scale_b, off_n, N, acc), 0)
    return acc


@gluon.jit
def row_scales(scale_a, off_m, M, SIZE: gl.constexpr, layout: gl.constexpr):
    """scale_a[off_m : off_m + SIZE] (0 past M) in the row layout of an accumulator of `layout`.
    An MMA accumulator gives a thread few rows (two per 64-row box on Hopper), so they are loaded
    straight into it."""
    rows = off_m + gl.arange(0, SIZE, layout=gl.SliceLayout(1, layout))
    return gl.load(scale_a + rows, mask=rows < M, other=0.0)


@gluon.jit
def scale_rows(acc, scale_a, off_m, M):
    """acc times its rows' scales scale_a[off_m + row] (`row_scales`)."""
    layout: gl.constexpr = acc.type.layout
    return acc * gl.expand_dims(row_scales(scale_a, off_m, M, acc.shape[0], layout), 1)


@gluon.jit
def flat_scales(scales, first, count, SIZE: gl.constexpr):
    """scales[first : first + SIZE] (0 past `count`), one element per thread."""
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    index = first + gl.arange(0, SIZE, layout=flat)
    return gl.load(scales + index, mask=index < count, other=0.0)


@gluon.jit
def as_columns(flat, acc):
    """`flat_scales` redistributed to the layout of acc's columns (through shared memory)."""
    return gl.convert_layout(flat, gl.SliceLayout(0, acc.type.layout))


@gluon.jit
def column_scales(scale_b, off_n, N, acc):
    """scale_b[off_n : off_n + acc's width] (0 past N) in the layout of acc's columns. Loaded one
    element per thread and then redistributed: a thread holds many columns (16 of a 64-wide Hopper
    slice), and loaded in that layout directly each would cost a 64-bit address, which spills a
    register-bound epilogue."""
    return as_columns(flat_scales(scale_b, off_n, N, acc.shape[1]), acc)


@gluon.jit
def store_slice(
    c_desc,
    c_smem,
    part,
    off_m,
    off_n,
    PENDING: gl.constexpr,
    scale_a=None,
    scale_b=None,
    SCALING: gl.constexpr = 0,
):
    """One slice of a sliced epilogue: wait until at most PENDING earlier TMA stores are still in
    flight (so the one that last read `c_smem` has finished), then registers -> fp8 scales
    (`scale_tile`) -> output dtype -> `c_smem` -> TMA store at (off_m, off_n)."""
    part = scale_tile(part, scale_a, scale_b, off_m, off_n, c_desc.shape[0], c_desc.shape[1], SCALING)
    tma.store_wait(PENDING)
    c_smem.store(part.to(c_desc.dtype))
    fence_async_shared()
    tma_store(c_desc, [off_m, off_n], c_smem)


@gluon.jit
def column_slice(c, J: gl.constexpr, SLICE_N: gl.constexpr):
    """Columns [J * SLICE_N, (J + 1) * SLICE_N) of c [BM, BN] (BN / SLICE_N a power of two).
    Halving c along N is a register renaming: no data moves."""
    WIDTH: gl.constexpr = c.shape[1]
    HALVES: gl.constexpr = WIDTH // 2 // SLICE_N  # slices per half
    if WIDTH == SLICE_N:
        part = c
    else:
        left, right = c.reshape([c.shape[0], 2, WIDTH // 2]).permute(0, 2, 1).split()
        if J < HALVES:
            part = column_slice(left, J, SLICE_N)
        else:
            part = column_slice(right, J - HALVES, SLICE_N)
    return part


@gluon.jit
def boxes_scales(
    scale_a,
    scale_b,
    off_m,
    off_n,
    M,
    N,
    BOXES: gl.constexpr,
    BOX_M: gl.constexpr,
    SLICES: gl.constexpr,
    SLICE_N: gl.constexpr,
    layout: gl.constexpr,
    SCALING: gl.constexpr,
):
    """The fp8 scales of a tile of BOXES accumulators [BOX_M, SLICES * SLICE_N] in `layout`, for
    `store_boxes_sliced`: loaded before the tile's K loop, so their latency is spent there, not in
    the epilogue. (product, rows, columns): SCALING 1 the product of the per-tensor scales; 2 each
    box's row scales in the accumulator's row layout and each column slice's one element per
    thread (8 registers a thread in all for a ping-pong tile); 0 nothing."""
    product = 1.0
    rows = ()
    columns = ()
    if SCALING == 1:
        product = gl.load(scale_a) * gl.load(scale_b)
    elif SCALING == 2:
        for i in gl.static_range(BOXES):
            rows = rows + (row_scales(scale_a, off_m + i * BOX_M, M, BOX_M, layout),)
        for j in gl.static_range(SLICES):
            columns = columns + (flat_scales(scale_b, off_n + j * SLICE_N, N, SLICE_N),)
    return product, rows, columns


@gluon.jit
def store_boxes_sliced(
    c_desc,
    c_bufs,
    boxes,
    off_m,
    off_n,
    BUFFERS: gl.constexpr,
    BASE: gl.constexpr,
    scales,
    SCALING: gl.constexpr = 0,
):
    """Sliced epilogue of a tile held as a tuple of accumulators stacked along M (`boxes`, each
    [BOX_M, BN]): it leaves in [BOX_M, SN] slices (SN: the C descriptor's block width), slice-major
    (column slice j of every box, then j + 1), the n-th through buffer BASE + n % BUFFERS of
    `c_bufs`; a buffer is rewritten only once its previous TMA store has read it (`store_slice`).
    fp8 `scales` (`boxes_scales`): each box is multiplied by its row scales once, and a slice's
    column scales are redistributed once for all the boxes (`as_columns`: a layout conversion
    through shared memory, with its barriers, which per box and slice was the row-wise epilogue's
    main cost: perf-notes entry 24)."""
    BOX_M: gl.constexpr = boxes[0].shape[0]
    SLICE_N: gl.constexpr = c_desc.block_type.shape[1]
    SLICES: gl.constexpr = boxes[0].shape[1] // SLICE_N
    BOXES: gl.constexpr = len(boxes)
    product, rows, columns = scales
    scaled = ()
    for i in gl.static_range(BOXES):
        box = boxes[i]
        if SCALING == 1:
            box = box * product
        elif SCALING == 2:
            box = box * gl.expand_dims(rows[i], 1)
        scaled = scaled + (box,)
    for j in gl.static_range(SLICES):
        if SCALING == 2:
            sb = gl.expand_dims(as_columns(columns[j], column_slice(scaled[0], j, SLICE_N)), 0)
        for i in gl.static_range(BOXES):
            part = column_slice(scaled[i], j, SLICE_N)
            if SCALING == 2:
                part = part * sb
            buf = c_bufs.index(BASE + (j * BOXES + i) % BUFFERS)
            store_slice(c_desc, buf, part, off_m + i * BOX_M, off_n + j * SLICE_N, BUFFERS - 1)


# Deferred epilogue (persistent, and warpspec's cooperative design): tile i's C is staged whole in
# shared memory when its K loop ends and leaves in slices during tile i+1's first K steps, one TMA
# store every 2**spacing steps, so the store overlaps MMAs instead of delaying them
# (docs/perf-notes.md, entry 15).


@gluon.jit
def _write_slices(
    c_desc, c_bufs, c, off_m, off_n, scale_a, scale_b, SCALING: gl.constexpr, FIRST: gl.constexpr = 0
):
    """c [BM, BN], the tile at (off_m, off_n) -> fp8 scales -> output dtype -> shared memory,
    column slice i (c_bufs' width) into c_bufs[FIRST + i]."""
    BLOCK_M: gl.constexpr = c.shape[0]
    WIDTH: gl.constexpr = c.shape[1]
    SLICE_N: gl.constexpr = c_bufs.shape[2]
    if WIDTH == SLICE_N:
        c = scale_tile(
            c, scale_a, scale_b, off_m, off_n + FIRST * SLICE_N, c_desc.shape[0], c_desc.shape[1], SCALING
        )
        c_bufs.index(FIRST).store(c.to(c_bufs.dtype))
    else:
        left, right = c.reshape([BLOCK_M, 2, WIDTH // 2]).permute(0, 2, 1).split()
        _write_slices(c_desc, c_bufs, left, off_m, off_n, scale_a, scale_b, SCALING, FIRST)
        _write_slices(
            c_desc, c_bufs, right, off_m, off_n, scale_a, scale_b, SCALING, FIRST + WIDTH // 2 // SLICE_N
        )


@gluon.jit
def stage_tile(
    c_desc,
    c_bufs,
    c,
    prev_m,
    prev_n,
    k_steps,
    spacing,
    pending,
    off_m=0,
    off_n=0,
    scale_a=None,
    scale_b=None,
    SCALING: gl.constexpr = 0,
):
    """Deferred epilogue, at the end of the tile at (off_m, off_n): store what the K loop left of
    the previous tile (at prev_m, prev_n; `pending`: there is one), wait until it has left the
    staging buffers, then stage c there slice by slice (fp8 scales applied per slice), fenced for
    the TMA stores of the next tile's loop."""
    store_staged_rest(c_desc, c_bufs, prev_m, prev_n, k_steps, spacing, pending)
    tma.store_wait(0)
    _write_slices(c_desc, c_bufs, c, off_m, off_n, scale_a, scale_b, SCALING)
    fence_async_shared()


@gluon.jit
def deferred_store_spacing(k_steps):
    """log2 of the K steps between two deferred slice stores: 4 steps apart when a tile has 16 or
    more, 2 or 1 below (perf-notes entry 15: one step apart stretches the loop more)."""
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
# Host side: descriptors and grids for launches, signatures for GPU-less compiles.


def smem_layout(block_shape, gl_dtype):
    return gl.NVMMASharedLayout.get_default_for(list(block_shape), gl_dtype)


def block_shapes(cfg: GemmConfig, layout: str) -> tuple[list[int], list[int], list[int]]:
    """TMA block shapes of A, B and C: A one box of BLOCK_M rows, B K-major for layout "t", C one
    epilogue slice (the whole tile where the epilogue is not sliced)."""
    BM, BN, BK = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
    return [BM, BK], ([BN, BK] if is_kmajor(layout) else [BK, BN]), [BM, cfg.epilogue_n]


def make_descriptors(a, b, c, cfg: GemmConfig, layout: str, blocks=None):
    """Host TMA descriptors for A [M,K], B ([K,N], or the [N,K] weight behind a "t" view) and C [M,N],
    with the config's block shapes (`block_shapes`) or the (A, B, C) `blocks` given."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    a_block, b_block, c_block = blocks or block_shapes(cfg, layout)
    b_src = b.t() if is_kmajor(layout) else b
    return tuple(
        TensorDescriptor.from_tensor(t, block, smem_layout(block, gl_dtype(t)))
        for t, block in ((a, a_block), (b_src, b_block), (c, c_block))
    )


def gl_dtype(t):
    """The Gluon dtype of a torch tensor."""
    return GL_DTYPES[str(t.dtype).removeprefix("torch.")]


def _rebased(template, base):
    """A copy of a descriptor with another base tensor, made without the constructor's checks.

    Only for a template that the constructor has checked with a tensor of the same shape, strides
    and dtype as `base` and a base as aligned (`Plan` says who guarantees that). The copy takes
    every field of the template, so fields that newer triton versions add come along. Copying the
    fields costs a fraction of `TensorDescriptor(...)`, whose checks run on every construction."""
    fields = template.__dict__.copy()
    fields["base"] = base
    desc = object.__new__(type(template))
    desc.__dict__ = fields
    return desc


def templates_of(descriptors) -> tuple[object, ...]:
    """Descriptors without their bases, for a `Plan` (it rebases them per call)."""
    return tuple(_rebased(d, None) for d in descriptors)


def desc_signature(block_shape, dtype: str) -> str:
    """The signature string of a tensor-descriptor argument, for GPU-less compiles."""
    gdt = GL_DTYPES[dtype]
    ty = _SIGNATURE_TYPES[dtype]
    return f"tensordesc<{ty}[{block_shape[0]}, {block_shape[1]}],{smem_layout(block_shape, gdt)!r}>"


DESC_ARGS = ("a_desc", "b_desc", "c_desc")


class Launcher:
    """`kernel[grid](*args, **constexprs, num_warps=...)` without Triton's per-call dispatch.

    A `@gluon.jit` launch binds every argument, recomputes its specialization key and looks up the
    compiled kernel on every call: tens of microseconds of Python, longer than a decode-step GEMM.
    The first call goes that way and keeps the `CompiledKernel` it returns; later calls hand the
    same arguments to its launcher directly, or on triton 3.6 to the C launcher under it
    (`compat.raw_launch`: `raw`, None elsewhere), which also takes tensor descriptors already
    encoded (`direct`). Only for arguments that specialize alike (the plans that own a Launcher
    are keyed on shapes, strides and dtypes, and the bases' 16-byte alignment is checked before
    a launch: by `Plan` where it reads an address, by `gluon_survey.api` for the others), and
    while no launch hook is set (a profiler's hooks get the full path)."""

    def __init__(self, kernel, grid: tuple[int, ...], constexprs: dict[str, object], num_warps: int):
        self.kernel, self.grid, self.constexprs, self.num_warps = kernel, grid, constexprs, num_warps
        self.grid3 = (*grid, 1, 1)[:3]
        self.values = tuple(constexprs.values())  # positionally, after the arguments
        self.compiled = None
        self.raw: RawLaunch | None = None
        self.stream: tuple[Callable, Callable] | None = None  # Triton's current-stream functions

    def __call__(self, *args) -> None:
        compiled = self.compiled
        if compiled is None or _hooked():
            self.compiled = self.kernel[self.grid](*args, **self.constexprs, num_warps=self.num_warps)
            if self.compiled is not None and self.raw is None:
                # looked up once here rather than through the driver's lazy proxy on every call
                self.stream = (driver.active.get_current_stream, _current_device_fn())
                raw = raw_launch(self.compiled)
                # `direct` takes the descriptors first, as every kernel with a Plan does
                if raw is not None and raw.descriptors == tuple(range(len(raw.descriptors))):
                    self.raw = raw
            return
        g0, g1, g2 = self.grid3
        get_stream, get_device = self.stream
        raw = self.raw
        if raw is not None and not raw.descriptors:
            raw.launch(g0, g1, g2, get_stream(get_device()), *raw.head, *args, *self.values)
            return
        compiled.run(
            g0,
            g1,
            g2,
            get_stream(get_device()),
            compiled.function,
            compiled.packed_metadata,
            None,
            None,
            None,
            *args,
            *self.values,
        )

    def direct(self) -> tuple | None:
        """Once `raw` is known: (C launcher, gx, gy, gz, get_stream, get_device, head, constexpr
        values), to be called as `launch(gx, gy, gz, get_stream(get_device()), *head, *args,
        *values)` with every tensor descriptor in `args` as `raw.encode` expands it, while no
        launch hook is set. None before."""
        raw = self.raw
        if raw is None:
            return None
        return (raw.launch, *self.grid3, *self.stream, raw.head, self.values)


def _current_device_fn() -> Callable[[], int]:
    """Triton's current-device function; where that is `torch.cuda.current_device`, the C function
    under it, without its check that CUDA is initialized (three Python calls a launch), because
    a Launcher asks only after a first launch, which initialized it."""
    get_device = driver.active.get_current_device
    if get_device is torch.cuda.current_device and hasattr(torch._C, "_cuda_getDevice"):
        return torch._C._cuda_getDevice
    return get_device


def _aligned_base(t, i: int):
    """t, whose base address TMA can take; else `Unaligned` (i: 0, 1, 2 for A, B, C)."""
    if t.data_ptr() % ALIGN:
        raise Unaligned(f"{'ABC'[i]}'s base address is not {ALIGN}-byte aligned: TMA cannot describe it")
    return t


def _hooked() -> bool:
    """Whether a launch hook (a profiler's) is registered: its calls need Triton's own launch."""
    hooks = knobs.runtime.launch_enter_hook
    return hooks is not None and bool(getattr(hooks, "calls", True))


# Addresses a Plan keeps encoded descriptors for, per operand (then it starts over). One plan serves
# every layer of a model with its shape, so its weight slot sees one address per layer: 80 in
# Llama-3-70B. Past the limit a cycle of addresses would miss on every call. An encoding is ~0.3 KB.
ENCODED_PER_SLOT = 256


@dataclass(frozen=True)
class Plan:
    """One rung launch with everything decided but the tensors' addresses: kernel, grid,
    constexprs, warps and the three TMA descriptors as templates (shape, strides, block shape and
    shared layout set and checked once; no base, so the plan keeps no tensor alive), and the
    arguments that follow them (`extra`: a split-K workspace).

    `launch(a, b, out, scales=None)` launches on these tensors; nothing is chosen again. So it is
    only for tensors of the problem the plan was made for: the same shapes, strides, dtype and B
    layout (`gluon_survey.api` keys its plan cache on exactly these). The one thing it checks is
    TMA's rule for a base address, 16-byte alignment, where it first meets the address: a base
    that breaks it raises `Unaligned` before anything is launched (`checks_bases`). Where the
    launcher takes encoded descriptors (`Launcher.direct`), each operand's encoded CUtensorMap is
    kept per base address (`encoded`: address -> CUtensorMap, shape and strides, at most
    `ENCODED_PER_SLOT` each, no tensor), so a call with an operand at an address seen before
    encodes nothing and checks nothing; a weight is always such an operand. Elsewhere (the first
    call, a launch hook, other triton releases) each call copies the templates with the new
    tensors as bases (`_rebased`) and Triton encodes them. The B descriptor describes the [N, K]
    weight behind a "t" view; its base is `b` itself, because a descriptor reads only its base's
    address and dtype, which a view and its transpose share."""

    launcher: Launcher
    templates: tuple[object, object, object]  # A, B, C descriptors without a base
    cfg: GemmConfig
    extra: tuple[object, ...] = ()
    scaled: bool = False  # the kernel takes (scale_a, scale_b) after the descriptors (`scale_args`)
    encoded: tuple[dict, dict, dict] = field(default_factory=lambda: ({}, {}, {}), compare=False, repr=False)
    launch: Callable[..., None] = field(init=False, compare=False, repr=False)
    # `launch` refuses a base it cannot take (`Unaligned`), so its caller need not read the bases.
    checks_bases: ClassVar[bool] = True

    def __post_init__(self):
        object.__setattr__(self, "launch", _plan_launch(self))

    def descriptors(self, a, b, out) -> tuple[object, object, object]:
        """The templates on these tensors; `Unaligned` if a base is not 16-byte aligned."""
        ta, tb, tc = self.templates
        return (
            _rebased(ta, _aligned_base(a, 0)),
            _rebased(tb, _aligned_base(b, 1)),
            _rebased(tc, _aligned_base(out, 2)),
        )

    def rest(self, scales: Scales | None) -> tuple[object, ...]:
        """The kernel arguments after the three descriptors."""
        return (*scale_args(scales), *self.extra) if self.scaled else self.extra

    def encode(self, i: int, t) -> tuple:
        """Descriptor i's encoding for tensor t, kept for t's address."""
        cache = self.encoded[i]
        if len(cache) >= ENCODED_PER_SLOT:
            cache.clear()
        enc = cache[t.data_ptr()] = self.launcher.raw.encode(
            _rebased(self.templates[i], _aligned_base(t, i)), i
        )
        return enc

    def bind(self, a, b, out, scales: Scales | None = None) -> Callable[[], None]:
        """The bare launch on these tensors: the descriptors are made now (and encoded once, after
        the first launch, where the launcher takes them encoded), so `fn()` only launches the
        kernel (what the driver times). `fn.plan` is this plan, for callers that launch it again on
        other tensors of the same problem (`gluon_survey.api`'s plan cache)."""
        rest = self.rest(scales)
        args = (*self.descriptors(a, b, out), *rest)
        launcher = self.launcher
        direct = encoded = None

        def fn():
            nonlocal direct, encoded
            if direct is None or _hooked():
                launcher(*args)
                direct = launcher.direct()
                if direct is not None and encoded is None:
                    encode = launcher.raw.encode
                    encoded = (*(e for i in range(3) for e in encode(args[i], i)), *rest)
                return
            c_launch, g0, g1, g2, get_stream, get_device, head, values = direct
            c_launch(g0, g1, g2, get_stream(get_device()), *head, *encoded, *values)

        fn.plan = self
        return fn


def _plan_launch(plan: Plan) -> Callable[..., None]:
    """`plan.launch`: one function over the plan's parts, bound once, because it is the whole of a
    cached `matmul` call's launch (`plan.launch.plan` is the plan)."""
    launcher, encode, scaled, extra = plan.launcher, plan.encode, plan.scaled, plan.extra
    ea, eb, ec = plan.encoded
    runtime = knobs.runtime
    # `launcher.direct()`, bound at the first launch; `tail`: what follows the scales
    c_launch = g0 = g1 = g2 = get_stream = get_device = head = tail = None

    def launch(a, b, out, scales: Scales | None = None) -> None:
        """out = a @ b (times fp8 `scales`) on these tensors."""
        nonlocal c_launch, g0, g1, g2, get_stream, get_device, head, tail
        hooks = runtime.launch_enter_hook  # `_hooked()`, written out
        if c_launch is None or (hooks is not None and getattr(hooks, "calls", True)):
            launcher(*plan.descriptors(a, b, out), *plan.rest(scales))
            direct = launcher.direct()
            if direct is not None:
                c_launch, g0, g1, g2, get_stream, get_device, head, values = direct
                tail = (*extra, *values)
            return
        c_launch(
            g0,
            g1,
            g2,
            get_stream(get_device()),
            *head,
            *(ea.get(a.data_ptr()) or encode(0, a)),
            *(eb.get(b.data_ptr()) or encode(1, b)),
            *(ec.get(out.data_ptr()) or encode(2, out)),
            *(scale_args(scales) if scaled else ()),  # `Plan.rest`, written out with `tail`
            *tail,
        )

    launch.plan = plan
    return launch


def check_config_kind(mode: str, cfg: GemmConfig, scales: Scales | None) -> None:
    """Refuse a config for the other kind of operands: fp8 configs take scales, 16-bit ones none."""
    if (scales is not None) != (cfg.ELEM_BYTES == 1):
        kind = "fp8" if cfg.ELEM_BYTES == 1 else "16-bit"
        raise ValueError(f"{mode}: config {cfg.label} is for {kind} operands")


def scale_args(scales: Scales | None) -> tuple[object, object]:
    """The (scale_a, scale_b) kernel arguments: the flat fp32 scales, or None, None without (a
    None argument is a constexpr to Triton, so the fp16/bf16 kernels compile as if they had no
    such arguments)."""
    return (None, None) if scales is None else (scales.a, scales.b)


def scaling_code(scales: Scales | None) -> int:
    """The SCALING constexpr of `scale_tile`: 0 without scales."""
    return 0 if scales is None else scales.code


@dataclass(frozen=True)
class Rung:
    """The host side of a rung kernel that takes (a_desc, b_desc, c_desc, **constexprs), or with
    `scaled` (a_desc, b_desc, c_desc, scale_a, scale_b, **constexprs, SCALING): its launch and its
    compile specs, built from the same `constexprs(cfg, capability, layout)`, so that what
    `inspect` compiles is what `prepare` launches. Persistent kernels get one program per SM (or
    per tile, when there are fewer tiles), the others one per tile."""

    mode: str
    kernel: object
    constexprs: Callable[[GemmConfig, tuple[int, int], str], dict[str, object]]
    persistent: bool = False
    # One config per compute-capability major, for a rung whose provider functions are the Rung's
    # (`config_for`, `candidates`, `prepare`, `specs`); warpspec chooses its own.
    configs: Mapping[int, GemmConfig] = field(default_factory=dict)
    # The same for fp8 operands (ELEM_BYTES 1), for a rung that takes scales (`scaled`).
    fp8_configs: Mapping[int, GemmConfig] = field(default_factory=dict)
    scaled: bool = False
    desc_args: tuple[str, str, str] = DESC_ARGS  # the kernel's names of the A, B and C descriptors

    def configs_of(self, fp8: bool) -> Mapping[int, GemmConfig]:
        return self.fp8_configs if fp8 else self.configs

    # The provider contract (gluon_survey/registry.py), for a rung with one config per architecture.

    def config_for(self, capability: tuple[int, int], K: int, fp8: bool = False) -> GemmConfig:
        return self.configs_of(fp8)[capability[0]]

    def candidates(self, capability: tuple[int, int], fp8: bool = False) -> dict[str, GemmConfig]:
        """The configs `gluon-survey tune` may pick, by label."""
        cfg = self.configs_of(fp8)[capability[0]]
        return {cfg.label: cfg}

    def prepare(
        self, a, b, out, target: Target, cfg: GemmConfig | None = None, scales: Scales | None = None
    ) -> Launch:
        cfg = cfg or self.config_for(target.capability, a.shape[1], scales is not None)
        return self.launch(a, b, out, target, cfg, scales)

    def specs(self, capability: tuple[int, int], dtype: str) -> list[CompileSpec]:
        """Compile specs of the config this architecture runs (none where it runs none)."""
        configs = self.configs_of(dtype == FP8)
        if capability[0] not in configs:
            return []
        return self.compile_specs(capability, dtype, [configs[capability[0]]])

    def plan(self, a, b, out, target: Target, cfg: GemmConfig, scales: Scales | None = None) -> Plan:
        """The launch plan for tensors like these (only their shapes, strides and dtype are read;
        bases must be 16-byte aligned): descriptors' block shapes and layouts, grid, constexprs."""
        layout = b_layout(b)
        templates = templates_of(make_descriptors(a, b, out, cfg, layout))
        tiles = num_tiles(*out.shape, cfg)
        grid = (min(target.sm_count, tiles) if self.persistent else tiles,)
        kw = self.kernel_constexprs(cfg, target.capability, layout, scaling_code(scales))
        return Plan(Launcher(self.kernel, grid, kw, cfg.num_warps), templates, cfg, scaled=self.scaled)

    def kernel_constexprs(self, cfg, capability, layout: str, scaling: int) -> dict[str, object]:
        """`constexprs`, and SCALING last for a scaled kernel (its last parameter)."""
        kw = self.constexprs(cfg, capability, layout)
        return kw | {"SCALING": scaling} if self.scaled else kw

    def launch(self, a, b, out, target: Target, cfg: GemmConfig, scales: Scales | None = None) -> Launch:
        """A ready launch of out = a @ b; `Launch.fn.plan` launches the same on other tensors."""
        check_config_kind(self.mode, cfg, scales)
        plan = self.plan(a, b, out, target, cfg, scales)
        return Launch(plan.bind(a, b, out, scales), cfg.table())

    def compile_specs(self, capability: tuple[int, int], dtype: str, configs) -> list[CompileSpec]:
        """One spec per config and B layout, for `gluon-survey inspect`; fp8 (K-major B only)
        with row-wise scales, the epilogue that does the most."""
        specs = []
        fp8 = dtype == FP8
        for cfg in configs:
            for layout in ("t",) if fp8 else B_LAYOUTS:
                values = self.kernel_constexprs(cfg, capability, layout, 2 if fp8 else 0)
                blocks = block_shapes(cfg, layout)
                dtypes = (dtype, dtype, FP8_OUT if fp8 else dtype)
                signature = {
                    arg: desc_signature(block, dt)
                    for arg, block, dt in zip(self.desc_args, blocks, dtypes, strict=True)
                }
                if self.scaled:
                    signature |= {"scale_a": "*fp32", "scale_b": "*fp32"} if fp8 else {}
                    values = ({} if fp8 else {"scale_a": None, "scale_b": None}) | values
                specs.append(
                    CompileSpec(
                        self.mode,
                        f"{self.kernel.__name__} {cfg.label} B={layout}" + (" scales=row" if fp8 else ""),
                        self.kernel,
                        signature | dict.fromkeys(values, "constexpr"),
                        values,
                        {"num_warps": cfg.num_warps},
                        config=cfg,
                    )
                )
        return specs


def provider_functions(rung: Callable[[], Rung]):
    """The provider contract (gluon_survey/registry.py) of a rung module whose Rung answers it:
    (config_for, candidates, prepare, compile_specs), each asking `rung()` on every call, so that
    a test may swap the module's RUNG (its kernel for a recorder)."""

    def config_for(capability: tuple[int, int], K: int, fp8: bool = False) -> GemmConfig:
        return rung().config_for(capability, K, fp8)

    def candidates(capability: tuple[int, int], fp8: bool = False) -> dict[str, GemmConfig]:
        return rung().candidates(capability, fp8)

    def prepare(
        a, b, out, target: Target, cfg: GemmConfig | None = None, scales: Scales | None = None
    ) -> Launch:
        return rung().prepare(a, b, out, target, cfg, scales)

    def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
        return rung().specs(capability, dtype)

    return config_for, candidates, prepare, compile_specs


def num_tiles(M: int, N: int, cfg: GemmConfig) -> int:
    return triton.cdiv(M, cfg.a_rows) * triton.cdiv(N, cfg.BLOCK_N)
