"""Rung 4, warpspec (Hopper): persistent + warp specialization.

The idea: in `persistent` the same warps issue the TMA loads, the MMAs and the epilogue, so every
load waits behind an MMA wait and the tensor cores wait for every epilogue. Here the roles are
separate partitions of one program (`gl.warp_specialize`):

* a producer warp issues every TMA load into a ring of STAGES stages (`load_partition`), waiting
  on each stage's `empty` barrier before refilling it; it needs few registers, so it gives them
  away (`worker_num_regs`, i.e. `setmaxnreg`) to the MMA warpgroups;
* consumer warpgroups wait on `ready`, issue the MMAs, release each stage on `empty`, and store C.

Two consumers in ping-pong (below K = 8192): each owns alternate tiles of the program and they
take turns on the tensor cores (the `turns` barriers): consumer c issues its tile's MMAs, hands the
tensor cores to the other, and only then runs its epilogue, so one consumer's epilogue overlaps the
other's main loop. The turn hand-off also keeps the ring's phases safe: a consumer waits on
`ready` barriers only once the other has waited on all of its own, so no barrier is ever two
fills behind the phase a consumer waits for. A consumer's tile is three 64-row A boxes, each
multiplied into an accumulator of its own (tensor shapes are powers of two, a tile need not be):
192x128 tiles quantize better onto 132 SMs than 128x128 (perf-notes entry 17).

One cooperative consumer (from K = 8192): both warpgroups work on one 128x256 tile, persistent's
loop fed by the producer, with persistent's deferred C store; there the epilogue is a small share
of a tile and 128x256 tiles read the fewest shared-memory bytes per FLOP (entries 6, 15 and 17).

This design keeps its accumulators in the consumers' registers, so it is Hopper's; the Blackwell
warp-specialized rung is `warpspec_tcgen05.py` (the registry picks it on sm_100).

(No `from __future__ import annotations` here: aggregates check field types at run time.)
"""

from dataclasses import dataclass, replace

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..compat import aggregate
from ..launch import CompileSpec, Launch, Scales, Target, is_a_kmajor, is_kmajor
from .common import (
    GemmConfig,
    Ring,
    a_operand,
    b_operand,
    boxes_bias,
    boxes_scales,
    deferred_store_spacing,
    grouped_tile,
    init_barriers,
    load_partition,
    mbarrier,
    stage_tile,
    store_boxes_sliced,
    store_staged_rest,
    store_staged_slice,
    tma,
)
from .hopper import WGMMA, wgmma_layout
from .plan import FP8, Rung, reads_transposed_a


@dataclass(frozen=True)
class WarpSpecConfig(GemmConfig):
    CONSUMERS: int = 2  # 2: ping-pong, 4 warps each; 1: cooperative, num_warps on one tile
    BOXES: int = 1  # A boxes of BLOCK_M rows per tile, an accumulator each: a tile is BOXES * BLOCK_M tall
    # setmaxnreg: registers per thread of the second consumer warpgroup (the first gets the rest) and
    # of the TMA warp, which needs only addresses and counters. 2 x 128 x 232 + 128 x 40 <= 64 K.
    CONSUMER_REGS: int = 232
    PRODUCER_REGS: int = 40

    def __post_init__(self):
        if not 1 <= self.BOXES <= 3:
            raise ValueError("BOXES is 1 to 3: a consumer holds at most three accumulators")
        if (self.CONSUMERS, self.EPILOGUE) not in ((2, "sliced"), (1, "deferred")):
            raise ValueError("ping-pong (CONSUMERS=2) stores C sliced, cooperative (1) deferred")
        super().__post_init__()

    @property
    def design(self) -> str:
        return "ping-pong" if self.CONSUMERS == 2 else "cooperative"

    @property
    def a_rows(self) -> int:
        return self.BLOCK_M * self.BOXES

    @property
    def c_copies(self) -> int:
        return self.CONSUMERS

    @property
    def label(self) -> str:
        return f"{super().label} {self.design}"

    def table(self) -> dict[str, object]:
        return super().table() | {"design": self.design}


# Ping-pong: per consumer warpgroup a 192x128 tile as three 64x128 fp32 accumulators (192 of its
# 232 registers); 5 stages of 40 KB + one 8 KB C slice buffer per consumer (its epilogue runs during
# the other's main loop, so it can afford to wait between slices). Entry 17.
PINGPONG = WarpSpecConfig(
    BLOCK_M=64,
    BOXES=3,
    BLOCK_N=128,
    BLOCK_K=64,
    STAGES=5,
    num_warps=4,
    GROUP_M=8,
    EPILOGUE="sliced",
    EPILOGUE_N=64,
    CONSUMERS=2,
)
# Cooperative: persistent's 128x256 tile and deferred epilogue, 3 x 48 KB + 64 KB. GROUP_M stays 8
# for both designs: 16, which persistent gains from, cost ping-pong and gave cooperative nothing
# (entries 13 and 17).
COOPERATIVE = WarpSpecConfig(
    BLOCK_M=128,
    BLOCK_N=256,
    BLOCK_K=64,
    STAGES=3,
    num_warps=8,
    GROUP_M=8,
    EPILOGUE="deferred",
    EPILOGUE_N=64,
    CONSUMERS=1,
)
# fp8 (e4m3): the same designs with 128-wide K steps: a stage holds the same bytes (128-byte rows)
# and each MMA step does twice the work at twice the rate. Ping-pong 5 x 40 KB + 2 x 8 KB,
# cooperative 3 x 48 KB + 64 KB (C stays bf16).
# Ping-pong's row-wise scales cost a consumer a few registers more than 232 with triton 3.9 (8 B
# of spills), so its TMA warp gives up 16 more: 240 and 24 (no spills with 3.6 and 3.9).
PINGPONG_FP8 = replace(PINGPONG, BLOCK_K=128, ELEM_BYTES=1, CONSUMER_REGS=240, PRODUCER_REGS=24)
COOPERATIVE_FP8 = replace(COOPERATIVE, BLOCK_K=128, ELEM_BYTES=1)
COOPERATIVE_FROM_K = 8192  # the measured crossover (entry 17)
# One more ping-pong tile `tune` times for M = 24 to 4096 (16-bit): two 64-row boxes, 128x128 a
# consumer, 6 stages of 32 KB. At 1024 tokens on a 4096-wide weight that is 256 tiles, about two a
# program for 132 programs, where 192x128 tiles leave some programs one tile and others two
# (docs/perf-notes.md, entry 55).
PINGPONG_MID = replace(PINGPONG, BOXES=2, STAGES=6)
# The same tile for fp8 (6 stages of 32 KB). fp8's ping-pong tile is 192 rows; where M leaves its
# last wave mostly empty (M = 2048 and 4096 on a 4096-wide weight: 2.67 and 5.33 waves on 132 SMs)
# the 128-row tile fills more of it: `fp8_config` picks the one whose waves of tile rows finish
# first, a 128-row tile counted at MID_FP8_RATE of the 192-row tile's rate per row (kernel-only
# on the H100 over the llm weights at M = 2048 to 16384, the rate that best matched which tile
# won: docs/perf-notes.md, entry 70).
PINGPONG_FP8_MID = replace(PINGPONG_MID, BLOCK_K=128, ELEM_BYTES=1, CONSUMER_REGS=240, PRODUCER_REGS=24)
MID_FP8_RATE = 0.97

__all__ = [
    "COOPERATIVE",
    "COOPERATIVE_FP8",
    "PINGPONG",
    "PINGPONG_FP8",
    "PINGPONG_FP8_MID",
    "PINGPONG_MID",
    "compile_specs",
    "config_for",
    "fp8_config",
    "prepare",
    "reads_transposed_a",
    "unsupported_reason",
]


def config_for(capability: tuple[int, int], K: int, fp8: bool = False) -> WarpSpecConfig:
    """16-bit: ping-pong while the epilogue is worth hiding completely, cooperative from K = 8192.
    fp8: ping-pong at every K (measured 1.07x cuBLAS fp8 against cooperative's 0.97x at K = 8192,
    and no worse at 16384: perf-notes entry 21)."""
    if fp8:
        return PINGPONG_FP8
    return COOPERATIVE if K >= COOPERATIVE_FROM_K else PINGPONG


def _tiles(cfg: WarpSpecConfig, M: int, N: int) -> int:
    """The output tiles of `cfg` (BOXES boxes of BLOCK_M rows by BLOCK_N) on an M x N output."""
    return -(-M // cfg.a_rows) * -(-N // cfg.BLOCK_N)


def _waves(cfg: WarpSpecConfig, M: int, N: int, sm_count: int) -> int:
    """The waves `cfg`'s tiles take on `sm_count` SMs (0: unknown, counted as one), the last one
    counted whole however few tiles it holds."""
    return -(-_tiles(cfg, M, N) // max(1, sm_count))


def fp8_config(M: int, N: int, sm_count: int) -> WarpSpecConfig:
    """fp8's ping-pong tile for an M x N output on `sm_count` SMs: the 192-row tile, or the 128-row
    one where its waves of tiles (each counted by its rows over its rate) finish sooner."""

    def waves_of_rows(cfg: WarpSpecConfig, rate: float) -> float:
        return _waves(cfg, M, N, sm_count) * cfg.a_rows / rate

    mid = waves_of_rows(PINGPONG_FP8_MID, MID_FP8_RATE)
    return PINGPONG_FP8_MID if mid < waves_of_rows(PINGPONG_FP8, 1.0) else PINGPONG_FP8


def fp8_useful_fill(M: int, N: int, sm_count: int) -> float:
    """The share of the MMA work of `fp8_config`'s waves on an M x N output that lands in C: the
    output's elements over (waves x SMs x the tile's elements). It counts both what the last wave
    leaves idle and the rows of the last tile row that lie past M (a tile row of 8 rows costs as
    much as a full one); 1.0 when every wave is full and the tiles divide M and N."""
    cfg = fp8_config(M, N, sm_count)
    return M * N / (_waves(cfg, M, N, sm_count) * max(1, sm_count) * cfg.a_rows * cfg.BLOCK_N)


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    if capability[0] == 9:
        return None
    return f"this warp-specialized design is Hopper's (sm_90); this GPU is sm_{capability[0]}{capability[1]}"


@aggregate
class Shared:
    """What every partition of the kernel shares: the operand ring (`a_bufs` holds BOXES A boxes
    per stage of `b_bufs`), the C staging buffers, and the barriers: `ready` (a stage has landed),
    `empty` (a stage's MMAs are done with it) and the consumers' `turns`."""

    a_bufs: gl.shared_memory_descriptor
    b_bufs: gl.shared_memory_descriptor
    c_bufs: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    turns: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, a_bufs, b_bufs, c_bufs, ready, empty, turns):
        self.a_bufs = a_bufs
        self.b_bufs = b_bufs
        self.c_bufs = c_bufs
        self.ready = ready
        self.empty = empty
        self.turns = turns


# A consumer's accumulators: a tuple of one WGMMA per A box, handled by constexpr loops.


@gluon.jit
def _boxes_init(BOXES: gl.constexpr, dtype: gl.constexpr, BOX_M: gl.constexpr, BLOCK_N: gl.constexpr):
    mmas = ()
    for _ in gl.static_range(BOXES):
        mmas = mmas + (WGMMA.initialize(dtype, BOX_M, BLOCK_N, gl.num_warps()),)
    return mmas


@gluon.jit
def _boxes_issue(mmas, a_bufs, first, b, A_KMAJOR: gl.constexpr = True):
    """Box i's MMA multiplies A box a_bufs[first + i] (its transposed view with A_KMAJOR False:
    `a_operand`) into accumulator i."""
    out = ()
    for i in gl.static_range(len(mmas)):
        out = out + (mmas[i].issue(a_operand(a_bufs.index(first + i), A_KMAJOR), b),)
    return out


@gluon.jit
def _boxes_wait(mmas):
    """Retire every box's MMA but those of the last step (one per box)."""
    out = ()
    for i in gl.static_range(len(mmas)):
        out = out + (mmas[i].wait(len(mmas)),)
    return out


@gluon.jit
def _boxes_take(mmas):
    accs = ()
    out = ()
    for i in gl.static_range(len(mmas)):
        acc, mma = mmas[i].take_result()
        accs = accs + (acc,)
        out = out + (mma,)
    return accs, out


@gluon.jit
def _consumer(
    c_desc,
    scale_a,
    scale_b,
    bias,
    s,
    K,
    B_KMAJOR: gl.constexpr,
    A_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    ME: gl.constexpr,
    CONSUMERS: gl.constexpr,
    SCALING: gl.constexpr,
    HAS_BIAS: gl.constexpr,
):
    """Consumer ME of CONSUMERS: takes every CONSUMERS-th tile of this program and multiplies each
    of its A boxes into an accumulator of its own. Two consumers alternate on the tensor cores
    through the `turns` barriers and store C in slices; one alone never waits for a turn and
    defers its C store into the next tile's K loop. fp8 scales, then the bias, are applied as C
    is stored (`store_boxes_sliced`, `stage_tile`). With A_KMAJOR False an A box is [BLOCK_K,
    BOX_M], of the [K, M] matrix behind a transposed A, and multiplied as its transposed view."""
    PINGPONG: gl.constexpr = CONSUMERS == 2
    BOX_M: gl.constexpr = s.a_bufs.shape[1] if A_KMAJOR else s.a_bufs.shape[2]
    BLOCK_N: gl.constexpr = s.b_bufs.shape[1] if B_KMAJOR else s.b_bufs.shape[2]
    BLOCK_K: gl.constexpr = s.a_bufs.shape[2] if A_KMAJOR else s.a_bufs.shape[1]
    STAGES: gl.constexpr = s.b_bufs.shape[0]
    BOXES: gl.constexpr = s.a_bufs.shape[0] // STAGES
    EPILOGUE_BUFFERS: gl.constexpr = s.c_bufs.shape[0] // CONSUMERS  # this consumer's: from ME * that
    SLICE_N: gl.constexpr = c_desc.block_type.shape[1]
    SLICES: gl.constexpr = BLOCK_N // SLICE_N  # C slices per box
    num_pid_m = gl.cdiv(c_desc.shape[0], BOX_M * BOXES)
    num_pid_n = gl.cdiv(c_desc.shape[1], BLOCK_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    my_turn = s.turns.index(ME)
    their_turn = s.turns.index((ME + 1) % CONSUMERS)

    mmas = _boxes_init(BOXES, s.a_bufs.dtype, BOX_M, BLOCK_N)
    spacing = deferred_store_spacing(k_steps)
    prev_m = gl.program_id(0) * 0  # cooperative: where the staged tile goes (none before the first)
    prev_n = prev_m
    for t in range(ME, gl.cdiv(num_pid_m * num_pid_n - gl.program_id(0), gl.num_programs(0)), CONSUMERS):
        tile = gl.program_id(0) + t * gl.num_programs(0)
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BOXES * BOX_M
        off_n = pid_n * BLOCK_N
        if PINGPONG:
            # The tile's fp8 scales are loaded while this consumer waits for its turn.
            scales = boxes_scales(
                scale_a,
                scale_b,
                off_m,
                off_n,
                c_desc.shape[0],
                c_desc.shape[1],
                BOXES,
                BOX_M,
                SLICES,
                SLICE_N,
                wgmma_layout(BOX_M, BLOCK_N, gl.num_warps(), s.a_bufs.dtype.primitive_bitwidth),
                SCALING,
            )
            # Consumer 0 goes first (a fresh barrier passes the parity-1 wait), then they alternate.
            n = t // CONSUMERS  # tiles this consumer has done before this one
            mbarrier.wait(my_turn, (n & 1) ^ (1 - ME))
        ring = Ring(t * k_steps, STAGES)
        for k in range(k_steps):
            ring.wait_filled(s.ready)
            b = b_operand(s.b_bufs.index(ring.slot()), B_KMAJOR)
            mmas = _boxes_issue(mmas, s.a_bufs, ring.slot() * BOXES, b, A_KMAJOR)
            if not PINGPONG:  # the previous tile's C leaves while this tile's MMAs run
                store_staged_slice(c_desc, s.c_bufs, prev_m, prev_n, k, spacing, t > ME)
            # Only this step's MMAs may still run: the previous step's are retired, its stage is free.
            mmas = _boxes_wait(mmas)
            mbarrier.arrive(s.empty.index(ring.previous_slot()), pred=k > 0)
            ring = ring.next()
        if PINGPONG:
            mbarrier.arrive(their_turn)  # this tile's MMAs are all issued: the other consumer may go
        accs, mmas = _boxes_take(mmas)
        mbarrier.arrive(s.empty.index(ring.previous_slot()))
        if PINGPONG:
            biases = boxes_bias(bias, off_n, c_desc.shape[1], SLICES, SLICE_N, HAS_BIAS)
            store_boxes_sliced(
                c_desc,
                s.c_bufs,
                accs,
                off_m,
                off_n,
                EPILOGUE_BUFFERS,
                ME * EPILOGUE_BUFFERS,
                scales,
                SCALING,
                biases,
                HAS_BIAS,
            )
        else:
            stage_tile(
                c_desc,
                s.c_bufs,
                accs[0],
                prev_m,
                prev_n,
                k_steps,
                spacing,
                t > ME,
                off_m,
                off_n,
                scale_a,
                scale_b,
                SCALING,
                bias,
                HAS_BIAS,
            )
            prev_m = off_m
            prev_n = off_n
    if not PINGPONG:
        store_staged_rest(c_desc, s.c_bufs, prev_m, prev_n, 0, spacing, True)
    tma.store_wait(0)


@gluon.jit(do_not_specialize_on_alignment=["bias"])
def warpspec_kernel(
    a_desc,
    b_desc,
    c_desc,
    scale_a,
    scale_b,
    bias,
    B_KMAJOR: gl.constexpr,
    A_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    BOXES: gl.constexpr,
    CONSUMERS: gl.constexpr,
    C_BUFFERS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    SCALING: gl.constexpr,
    HAS_BIAS: gl.constexpr,
):
    """C = A @ B (times the fp8 scales, SCALING; + bias[N], HAS_BIAS) over this program's tiles.
    A_KMAJOR False: A is read through the [K, M] matrix behind a transposed view (16-bit only)."""
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES * BOXES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_bufs = gl.allocate_shared_memory(
        c_desc.dtype, [CONSUMERS * C_BUFFERS] + c_desc.block_type.shape, c_desc.layout
    )
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)
    init_barriers(empty, STAGES)
    init_barriers(turns, CONSUMERS)
    s = Shared(a_bufs, b_bufs, c_bufs, ready, empty, turns)

    K = a_desc.shape[1] if A_KMAJOR else a_desc.shape[0]
    # (Partition tuples are written in place: a tuple stored in a variable loses its constexprs.)
    if CONSUMERS == 2:  # ping-pong: consumer 0 is the default partition, consumer 1 a 4-warp worker
        gl.warp_specialize(
            [
                (
                    _consumer,
                    (
                        c_desc,
                        scale_a,
                        scale_b,
                        bias,
                        s,
                        K,
                        B_KMAJOR,
                        A_KMAJOR,
                        GROUP_M,
                        0,
                        2,
                        SCALING,
                        HAS_BIAS,
                    ),
                ),
                (
                    _consumer,
                    (
                        c_desc,
                        scale_a,
                        scale_b,
                        bias,
                        s,
                        K,
                        B_KMAJOR,
                        A_KMAJOR,
                        GROUP_M,
                        1,
                        2,
                        SCALING,
                        HAS_BIAS,
                    ),
                ),
                (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, B_KMAJOR, GROUP_M, A_KMAJOR)),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )
    else:  # cooperative: both warpgroups of the default partition share one tile
        gl.warp_specialize(
            [
                (
                    _consumer,
                    (
                        c_desc,
                        scale_a,
                        scale_b,
                        bias,
                        s,
                        K,
                        B_KMAJOR,
                        A_KMAJOR,
                        GROUP_M,
                        0,
                        1,
                        SCALING,
                        HAS_BIAS,
                    ),
                ),
                (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, B_KMAJOR, GROUP_M, A_KMAJOR)),
            ],
            [1],
            [PRODUCER_REGS],
        )


def _constexprs(
    cfg: WarpSpecConfig, capability: tuple[int, int], layout: str, a_layout: str = "row"
) -> dict[str, object]:
    return {
        "B_KMAJOR": is_kmajor(layout),
        "A_KMAJOR": is_a_kmajor(a_layout),
        "GROUP_M": cfg.GROUP_M,
        "STAGES": cfg.STAGES,
        "BOXES": cfg.BOXES,
        "CONSUMERS": cfg.CONSUMERS,
        "C_BUFFERS": cfg.c_buffers,
        "CONSUMER_REGS": cfg.CONSUMER_REGS,
        "PRODUCER_REGS": cfg.PRODUCER_REGS,
    }


RUNG = Rung("warpspec", warpspec_kernel, _constexprs, persistent=True, scaled=True, transposed_a=True)


def _designs(fp8: bool) -> tuple[WarpSpecConfig, WarpSpecConfig]:
    return (PINGPONG_FP8, COOPERATIVE_FP8) if fp8 else (PINGPONG, COOPERATIVE)


def candidates(capability: tuple[int, int], fp8: bool = False) -> dict[str, WarpSpecConfig]:
    """The configs `gluon-survey tune` may pick, by label: both designs at any K, and the 128-row
    ping-pong tile."""
    return {cfg.label: cfg for cfg in (*_designs(fp8), PINGPONG_FP8_MID if fp8 else PINGPONG_MID)}


def prepare(
    a, b, out, target: Target, cfg: WarpSpecConfig | None = None, scales: Scales | None = None, bias=None
) -> Launch:
    """The design `config_for` picks (fp8: the tile `fp8_config` picks), or `cfg`; but with
    row-wise fp8 scales and a bias, the cooperative design: a ping-pong consumer holding its three
    accumulators, a slice's column scales and its bias spills (136 B, `gluon-survey inspect`;
    tests/test_bias_compile.py)."""
    if cfg is None and scales is not None:
        cfg = fp8_config(a.shape[0], b.shape[1], target.sm_count)
    cfg = cfg or config_for(target.capability, a.shape[1], scales is not None)
    if bias is not None and scales is not None and scales.kind == "row" and cfg.CONSUMERS == 2:
        cfg = replace(COOPERATIVE_FP8, BLOCK_K=cfg.BLOCK_K)
    return RUNG.launch(a, b, out, target, cfg, scales, bias)


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    if unsupported_reason(capability):
        return []
    # and each design reading a transposed A in place (16-bit: `Rung.compile_specs`)
    return RUNG.compile_specs(
        capability, dtype, list(candidates(capability, dtype == FP8).values()), (PINGPONG, COOPERATIVE)
    )
