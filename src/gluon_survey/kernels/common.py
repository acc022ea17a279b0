"""The device building blocks every rung shares, and the config they are built from.

`GemmConfig` (a rung's tile and launch shape, with its shared-memory arithmetic), the ring of
shared-memory stages (`Ring`), and the small `@gluon.jit` functions the rung kernels call: TMA
loads of an A/B step (`load_step`, `load_b`), the grouped tile order (`grouped_tile`), the
producer partition of the warp-specialized kernels (`load_partition`), the epilogues (`store_tile`,
the sliced `store_slice` / `store_boxes_sliced`, the deferred `stage_tile` / `store_staged_*`),
the fp8 scales (`scale_tile` and its helpers), the bias (`add_bias`: after the scales, before the
output dtype) and the barriers. Nothing here depends on the GPU
architecture: the MMA is a constexpr argument of every rung kernel (`kernels/arch.py` picks it on
the host).

What the host does to launch these kernels (descriptors, `Rung`, `Plan`, `Launcher`) is in
`kernels/plan.py`; this module never imports it, nor torch: it is device code and the config
that sizes it.
(No `from __future__ import annotations` here: aggregates check field types at run time.)
"""

from dataclasses import dataclass

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from ..compat import aggregate, tma_load, tma_store

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
def load_step(
    a_desc,
    b_desc,
    off_m,
    off_n,
    off_k,
    bar,
    a_buf,
    b_buf,
    B_KMAJOR: gl.constexpr,
    pred=True,
    A_KMAJOR: gl.constexpr = True,
):
    """TMA-load one K step of A and B into shared memory, completing on `bar`.
    A is a [BM, BK] tile of a row-major [M, K] matrix, or (A_KMAJOR False) a [BK, BM] tile of the
    [K, M] matrix behind a transposed view (`load_a`). B is a [BK, BN] tile of a row-major [K, N]
    matrix, or (B_KMAJOR) a [BN, BK] tile of a [N, K] weight. Out-of-bounds rows/columns (ragged
    M, N and the K tail) arrive as zeros."""
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred)
    load_a(a_desc, off_m, off_k, bar, a_buf, A_KMAJOR, pred)
    load_b(b_desc, off_n, off_k, bar, b_buf, B_KMAJOR, pred)


@gluon.jit
def load_a(a_desc, off_m, off_k, bar, a_buf, A_KMAJOR: gl.constexpr = True, pred=True):
    if A_KMAJOR:
        tma_load(a_desc, [off_m, off_k], bar, a_buf, pred)
    else:
        tma_load(a_desc, [off_k, off_m], bar, a_buf, pred)


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
def a_operand(a_buf, A_KMAJOR: gl.constexpr = True):
    """A as the MMA wants it, [BM, BK]: an M-major tile ([BK, BM], of the [K, M] matrix behind a
    transposed A) is just a transposed view, which wgmma reads for 16-bit operands (fp8 wgmma
    reads A K-major only, so fp8 kernels never get one)."""
    if A_KMAJOR:
        a = a_buf
    else:
        a = a_buf.permute((1, 0))
    return a


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
    A_KMAJOR: gl.constexpr = True,
):
    """The TMA-load partition of the warp-specialized kernels (Hopper and Blackwell): fill the ring
    for every (tile, K step) of this program in grouped order, each fill once whoever read the
    stage's previous contents has released it on `empty`. A tile is BOXES A boxes tall (a_bufs has
    BOXES buffers per stage of b_bufs), and stage s holds them in a_bufs[s * BOXES + i]. An A box
    is [BOX_M, BLOCK_K], or with A_KMAJOR False [BLOCK_K, BOX_M] of the [K, M] matrix (`load_a`)."""
    STAGES: gl.constexpr = b_bufs.shape[0]
    BOXES: gl.constexpr = a_bufs.shape[0] // STAGES
    BOX_M: gl.constexpr = a_desc.block_type.shape[0] if A_KMAJOR else a_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1] if A_KMAJOR else a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0] if B_KMAJOR else b_desc.block_type.shape[1]
    num_pid_m = gl.cdiv(a_desc.shape[0] if A_KMAJOR else a_desc.shape[1], BOX_M * BOXES)
    num_pid_n = gl.cdiv(b_desc.shape[0] if B_KMAJOR else b_desc.shape[1], BLOCK_N)
    k_steps = gl.cdiv(a_desc.shape[1] if A_KMAJOR else a_desc.shape[0], BLOCK_K)
    ring = Ring.start(STAGES)
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        for k in range(k_steps):
            ring.wait_free(empty)
            slot = ring.slot()
            bar = ready.index(slot)
            mbarrier.expect(bar, BOXES * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            for i in gl.static_range(BOXES):
                load_a(
                    a_desc,
                    (pid_m * BOXES + i) * BOX_M,
                    k * BLOCK_K,
                    bar,
                    a_bufs.index(slot * BOXES + i),
                    A_KMAJOR,
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
def store_biased_tile(
    c_desc,
    c_smem,
    mma,
    off_m,
    off_n,
    scale_a,
    scale_b,
    SCALING: gl.constexpr,
    bias,
    SLICE_N: gl.constexpr = 64,
):
    """`store_tile` of a whole tile with fp8 scales (`scale_tile`) and a bias (`add_bias`): the
    finished accumulator taken from `mma` in column slices of SLICE_N (`result_slice`: on
    Blackwell straight from tensor memory), each written to its columns of `c_smem`, then one TMA
    store. A slice's bias is all a thread holds of it at a time: a tile loaded from tensor memory
    whole gives a thread a whole row, and the bias of 256 columns beside it spilled (304 B)."""
    BLOCK_N: gl.constexpr = c_smem.shape[1]
    for j in gl.static_range(BLOCK_N // SLICE_N):
        part = mma.result_slice(j, SLICE_N)
        part = scale_tile(
            part, scale_a, scale_b, off_m, off_n + j * SLICE_N, c_desc.shape[0], c_desc.shape[1], SCALING
        )
        part = add_bias(part, bias, off_n + j * SLICE_N, c_desc.shape[1], True)
        c_smem.slice(j * SLICE_N, SLICE_N, dim=1).store(part.to(c_desc.dtype))
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
def add_bias(acc, bias, off_n, N, HAS_BIAS: gl.constexpr):
    """acc + bias[off_n + column] (0 past N), in fp32, for an accumulator tile (or C slice) at
    column off_n of the [M, N] output; HAS_BIAS False leaves it (and `bias` is None). The last
    step on the fp32 values, after the fp8 scales (`scale_tile`), before the output dtype. The
    bias is loaded one element per thread and redistributed to acc's columns, as the column
    scales are (`column_scales`)."""
    if HAS_BIAS:
        acc = acc + gl.expand_dims(bias_columns(bias, off_n, N, acc), 0)
    return acc


@gluon.jit
def bias_columns(bias, off_n, N, acc):
    """bias[off_n : off_n + acc's width] (0 past N) as fp32, in the layout of acc's columns."""
    return as_columns(flat_scales(bias, off_n, N, acc.shape[1]).to(gl.float32), acc)


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
    """scales[first : first + SIZE] (0 past `count`), one element per thread (also a bias's)."""
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
    bias=None,
    HAS_BIAS: gl.constexpr = False,
):
    """One slice of a sliced epilogue: wait until at most PENDING earlier TMA stores are still in
    flight (so the one that last read `c_smem` has finished), then registers -> fp8 scales
    (`scale_tile`) -> bias (`add_bias`) -> output dtype -> `c_smem` -> TMA store at (off_m, off_n)."""
    part = scale_tile(part, scale_a, scale_b, off_m, off_n, c_desc.shape[0], c_desc.shape[1], SCALING)
    part = add_bias(part, bias, off_n, c_desc.shape[1], HAS_BIAS)
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
def boxes_bias(bias, off_n, N, SLICES: gl.constexpr, SLICE_N: gl.constexpr, HAS_BIAS: gl.constexpr):
    """The bias of a tile's SLICES column slices, each one element per thread (`flat_scales`), for
    `store_boxes_sliced`; an empty tuple without a bias. (Loaded when the tile's MMAs are done:
    before its K loop, as the fp8 scales are, it changed nothing of the consumer's registers.)"""
    biases = ()
    if HAS_BIAS:
        for j in gl.static_range(SLICES):
            biases = biases + (flat_scales(bias, off_n + j * SLICE_N, N, SLICE_N),)
    return biases


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
    biases=(),
    HAS_BIAS: gl.constexpr = False,
):
    """Sliced epilogue of a tile held as a tuple of accumulators stacked along M (`boxes`, each
    [BOX_M, BN]): it leaves in [BOX_M, SN] slices (SN: the C descriptor's block width), slice-major
    (column slice j of every box, then j + 1), the n-th through buffer BASE + n % BUFFERS of
    `c_bufs`; a buffer is rewritten only once its previous TMA store has read it (`store_slice`).
    fp8 `scales` (`boxes_scales`): each box is multiplied by its row scales once, and a slice's
    column scales are redistributed once for all the boxes (`as_columns`: a layout conversion
    through shared memory, with its barriers, which per box and slice was the row-wise epilogue's
    main cost: perf-notes entry 24). A bias (`biases`: `boxes_bias`) is added after the scales,
    each slice's redistributed once for all the boxes, as the column scales are."""
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
        if HAS_BIAS:  # (with row-wise scales too, a ping-pong consumer spills: warpspec.prepare)
            bb = gl.expand_dims(as_columns(biases[j].to(gl.float32), column_slice(scaled[0], j, SLICE_N)), 0)
        for i in gl.static_range(BOXES):
            part = column_slice(scaled[i], j, SLICE_N)
            if SCALING == 2:
                part = part * sb
            if HAS_BIAS:
                part = part + bb
            buf = c_bufs.index(BASE + (j * BOXES + i) % BUFFERS)
            store_slice(c_desc, buf, part, off_m + i * BOX_M, off_n + j * SLICE_N, BUFFERS - 1)


# Deferred epilogue (persistent, and warpspec's cooperative design): tile i's C is staged whole in
# shared memory when its K loop ends and leaves in slices during tile i+1's first K steps, one TMA
# store every 2**spacing steps, so the store overlaps MMAs instead of delaying them
# (docs/perf-notes.md, entry 15).


@gluon.jit
def _write_slices(
    c_desc,
    c_bufs,
    c,
    off_m,
    off_n,
    scale_a,
    scale_b,
    SCALING: gl.constexpr,
    bias,
    HAS_BIAS: gl.constexpr,
    FIRST: gl.constexpr = 0,
):
    """c [BM, BN], the tile at (off_m, off_n) -> fp8 scales -> bias -> output dtype -> shared
    memory, column slice i (c_bufs' width) into c_bufs[FIRST + i]."""
    BLOCK_M: gl.constexpr = c.shape[0]
    WIDTH: gl.constexpr = c.shape[1]
    SLICE_N: gl.constexpr = c_bufs.shape[2]
    if WIDTH == SLICE_N:
        c = scale_tile(
            c, scale_a, scale_b, off_m, off_n + FIRST * SLICE_N, c_desc.shape[0], c_desc.shape[1], SCALING
        )
        c = add_bias(c, bias, off_n + FIRST * SLICE_N, c_desc.shape[1], HAS_BIAS)
        c_bufs.index(FIRST).store(c.to(c_bufs.dtype))
    else:
        left, right = c.reshape([BLOCK_M, 2, WIDTH // 2]).permute(0, 2, 1).split()
        _write_slices(c_desc, c_bufs, left, off_m, off_n, scale_a, scale_b, SCALING, bias, HAS_BIAS, FIRST)
        _write_slices(
            c_desc,
            c_bufs,
            right,
            off_m,
            off_n,
            scale_a,
            scale_b,
            SCALING,
            bias,
            HAS_BIAS,
            FIRST + WIDTH // 2 // SLICE_N,
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
    bias=None,
    HAS_BIAS: gl.constexpr = False,
):
    """Deferred epilogue, at the end of the tile at (off_m, off_n): store what the K loop left of
    the previous tile (at prev_m, prev_n; `pending`: there is one), wait until it has left the
    staging buffers, then stage c there slice by slice (fp8 scales, then the bias, applied per
    slice), fenced for the TMA stores of the next tile's loop."""
    store_staged_rest(c_desc, c_bufs, prev_m, prev_n, k_steps, spacing, pending)
    tma.store_wait(0)
    _write_slices(c_desc, c_bufs, c, off_m, off_n, scale_a, scale_b, SCALING, bias, HAS_BIAS)
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


# Programmatic dependent launch (Hopper and later). A kernel launched with it (`Launcher`'s `pdl`)
# may start while the kernel before it on the stream is still finishing: its programs get their
# SMs, shared memory and barriers ready, then wait at `wait_for_previous_grid` until that kernel
# has finished and its writes are visible. Every global read and write of a rung comes after the
# wait (the weight too: the kernel before may be an optimizer step that wrote it). Both
# instructions do nothing in a kernel launched without it.


@gluon.jit
def wait_for_previous_grid():
    """Wait until the kernel before this one on the stream has finished and its memory is visible."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def release_next_grid():
    """Let the next kernel on the stream, if launched as a dependent, start its prologue now."""
    gl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )
