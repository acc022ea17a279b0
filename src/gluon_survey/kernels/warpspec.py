"""Rung 4, warpspec: persistent + warp specialization, two MMA warpgroups in "ping-pong".

The idea: in `persistent` the same warps issue the TMA loads, the MMAs and the epilogue, so the
tensor cores sit idle while a finished tile is converted and written to shared memory, and that
idle time is a large share of a tile when K is small. Here the roles are separate partitions of
one program (`gl.warp_specialize`):

* a producer warp issues every TMA load into a ring of STAGES stages, waiting on each stage's
  `empty` barrier before refilling it; it needs few registers, so it gives them away
  (`worker_num_regs`, i.e. `setmaxnreg`), and the MMA warpgroups take them;
* two consumer warpgroups each own a whole output tile (alternate tiles of the program) and
  take turns on the tensor cores: consumer c issues its tile's MMAs, hands the tensor cores to
  the other consumer (the `turn` barriers) and only then runs its epilogue. So one consumer's
  epilogue overlaps the other's main loop, and the tensor cores are not left waiting for it.
  Since that epilogue is off the critical path, each consumer stages its C in small slices
  through one buffer, and the shared memory saved goes to the ring.

A consumer's tile is 192x128: three 64-row A boxes, each multiplied into an accumulator of its
own (a Triton tensor's shape is a power of two; a tile need not be). At M = N = 8192 that makes
2752 tiles, 20.85 per SM, where 128x128 tiles make 31.03 and the 4 left over cost a whole 32nd
round (3 %); and a K step brings 40 KB into shared memory for 3.1 MFLOP, not 32 KB for 2.1.

From K = 8192 (`config_for`) one cooperative 8-warp consumer on 128x256 tiles replaces the pair:
there the epilogue is a small share of a tile, and 128x256 tiles read the fewest bytes of shared
memory per FLOP. What is left of its epilogue is hidden another way: the C tile is staged whole
in shared memory and its four slices are stored during the next tile's first K steps
(`DEFER_STORE`, shared with `persistent`), not all at once.

This design is Hopper's (accumulators in registers, one per consumer warpgroup), so the kernel
uses `WGMMA` directly; on sm_100 `prepare` hands over to the Blackwell design in `blackwell.py`
(a single-warp tcgen05 issuer and a double-buffered tensor-memory accumulator).

The turn hand-off is also what makes the ring's phase bookkeeping safe: a consumer starts waiting
on `ready` barriers only once the other one has waited on all of its own, so a barrier is never
two fills behind the phase a consumer waits for.

A third design, split, stays selectable (`SPLIT`): the two consumers own the two 128-row halves of
one 256x128 tile and read the same B stage (cuBLAS's tile shape without its cluster multicast). It
led at K = 2048-4096 until the cooperative design's deferred epilogue overtook it there, and
192-row ping-pong overtook both (docs/perf-notes.md, entry 17).

Measured on H100 80GB HBM3 (results/h100-ladder/ and -run2/, commit c63b779, steady-state clocks,
x cuBLAS timed alongside in alternating windows, fp16 / bf16, two runs): 1.09-1.10 at K = 512
(best of the ladder), 1.02-1.04 at 1024, 1.05-1.075 at 2048, 1.03-1.05 at 4096, 1.01-1.04 from
8192; geomean 1.04-1.05. The 128x128 ping-pong it replaced: 1.04-1.05 at K = 512, 0.989-1.02 at
1024 (docs/perf-notes.md, entry 17).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..registry import CompileSpec, Launch
from .common import (
    WGMMA,
    GemmConfig,
    b_operand,
    deferred_store_spacing,
    gemm_signature,
    grouped_tile,
    init_barriers,
    load_partition,
    make_descriptors,
    mbarrier,
    stage_tile,
    store_staged_rest,
    store_staged_slice,
    store_tile_sliced,
    tma,
    unsupported_reason,
)


@dataclass(frozen=True)
class WarpSpecConfig(GemmConfig):
    CONSUMERS: int = 2  # 2: ping-pong (or split), 4 warps each; 1: cooperative, 8 warps per tile
    # A tile is BOXES A boxes of BLOCK_M rows (a TMA load and a wgmma accumulator each), so it can be
    # 192 rows tall although every tensor shape is a power of two.
    BOXES: int = 1
    # SPLIT (two consumers, two boxes): consumer c multiplies box c of every tile; they share every B
    # stage and never wait for each other's turn.
    SPLIT: bool = False

    def __post_init__(self):
        super().__post_init__()
        if not 1 <= self.BOXES <= 3 or (self.SPLIT and (self.BOXES, self.CONSUMERS) != (2, 2)):
            raise ValueError(
                "BOXES is 1 to 3 (a consumer has at most three accumulators); SPLIT needs two of each"
            )

    @property
    def design(self) -> str:
        return "split" if self.SPLIT else ("ping-pong" if self.CONSUMERS == 2 else "cooperative")

    @property
    def tile_m(self) -> int:
        return self.BLOCK_M * self.BOXES

    @property
    def label(self) -> str:
        rest = super().label.split(" ", 1)[1]
        return f"{self.tile_m}x{self.BLOCK_N}x{self.BLOCK_K} {rest} {self.design}"

    def table(self) -> dict[str, object]:
        return super().table() | {"BLOCK_M": self.tile_m, "design": self.design}


# Ping-pong: each consumer warpgroup owns a 192x128 tile as three 64x128 fp32 accumulators (192
# registers per thread of its 232). 192 rows, not 128, for two reasons: 8192 / 192 gives 43 x 64 =
# 2752 tiles, 20.85 per SM where 128x128 tiles give 31.03 (the 4 extra tiles of a 32nd wave cost 3 %),
# and a K step brings 40 KB for 3.1 MFLOP instead of 32 KB for 2.1. 5 stages x 40 KB + one 8 KB
# 64x64 C buffer per consumer = 216 KB (its epilogue runs during the other consumer's main loop, so
# it can afford to wait between slices). H100, steady-state pairs, x cuBLAS: K = 512 1.09-1.10
# against 1.04-1.06 for 128x128 tiles (6 stages), K = 1024 1.03-1.05 against 1.00-1.03; 4 stages
# with 16 KB C slices lost 3-10 % to 5 (docs/perf-notes.md, entry 17).
PINGPONG = WarpSpecConfig(
    BLOCK_M=64, BOXES=3, BLOCK_N=128, BLOCK_K=64, STAGES=5, num_warps=4, GROUP_M=8, EPILOGUE_N=64, CONSUMERS=2
)
# Split: a 256x128 tile, each consumer warpgroup owns a 128x128 half (its A box) and both read the
# same B stage, so a K step brings 48 KB from L2 for 4.2 MFLOP; their epilogues are not staggered by
# design, but a consumer that finishes first runs on into the next tile's stages while the other
# stores. 4 x 48 KB + 2 x 16 KB = 224 KB.
SPLIT = WarpSpecConfig(
    BLOCK_M=128,
    BOXES=2,
    BLOCK_N=128,
    BLOCK_K=64,
    STAGES=4,
    num_warps=4,
    EPILOGUE_N=64,
    CONSUMERS=2,
    SPLIT=True,
)
# Cooperative: two warpgroups split one 128x256 tile, as in `persistent`; 3 x 48 KB + 64 KB = 208 KB.
# Its C is staged whole and leaves in 128x64 slices during the next tile's first K steps
# (`DEFER_STORE`): steady-state pairs on H100 gave 1.007-1.034 x cuBLAS at K = 4096-8192 against
# 0.985-1.028 with the whole tile stored at once (docs/perf-notes.md, entry 15).
COOPERATIVE = WarpSpecConfig(
    BLOCK_M=128,
    BLOCK_N=256,
    BLOCK_K=64,
    STAGES=3,
    num_warps=8,
    GROUP_M=8,
    EPILOGUE_N=64,
    EPILOGUE_BUFFERS=4,
    DEFER_STORE=True,
    CONSUMERS=1,
)
# GROUP_M stays 8 here: 16, which persistent gains from, cost 128x128 ping-pong 3-18 % and gave the
# cooperative design nothing; 4 cost cooperative 1.5-3.5 % and 192-row ping-pong 0-2 % (H100,
# docs/perf-notes.md, entries 13 and 17).
CONFIG = PINGPONG
# The rule, from steady-state paired measurements on H100 (docs/perf-notes.md, entry 17; x cuBLAS,
# fp16 / bf16, two rounds): 192-row ping-pong leads up to K = 4096 (there 1.024-1.041 against the
# cooperative design's 0.995-1.040); from K = 8192, where the epilogue is a small share of a tile, the
# cooperative design's 128x256 tiles (fewest shared-memory reads per FLOP) lead: 1.021-1.027 against
# 1.006-1.032.
COOPERATIVE_FROM_K = 8192
CONSUMER_REGS = 232  # registers per thread of the second consumer warpgroup (the first gets the rest)
PRODUCER_REGS = 40  # the TMA warp needs only addresses and counters


def config_for(K: int) -> WarpSpecConfig:
    """The documented rule: 192-row ping-pong while the epilogue is worth hiding completely,
    cooperative 128x256 tiles with the deferred epilogue from K = 8192."""
    return COOPERATIVE if K >= COOPERATIVE_FROM_K else PINGPONG


__all__ = ["CONFIG", "compile_specs", "config_for", "prepare", "unsupported_reason", "warpspec_kernel"]


@gluon.jit
def _consumer(
    c_desc,
    a_bufs,
    b_bufs,
    c_bufs,
    ready,
    empty,
    turns,
    B_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    K,
    ME: gl.constexpr,
    CONSUMERS: gl.constexpr,
    SPLIT: gl.constexpr,
    DEFER_STORE: gl.constexpr = False,
):
    """Consumer ME of CONSUMERS: takes every CONSUMERS-th tile of this program and multiplies each
    of its A boxes (BOXES per ring stage) into an accumulator of its own. With two, they alternate
    on the tensor cores through the `turns` barriers; alone, it never waits for a turn.
    SPLIT: every tile, only its box ME, no turns.
    DEFER_STORE (one consumer): a tile's C is staged whole and stored during the next tile's loop."""
    BOX_M: gl.constexpr = a_bufs.shape[1]
    BLOCK_N: gl.constexpr = b_bufs.shape[1] if B_KMAJOR else b_bufs.shape[2]
    BLOCK_K: gl.constexpr = a_bufs.shape[2]
    STAGES: gl.constexpr = b_bufs.shape[0]
    BOXES: gl.constexpr = a_bufs.shape[0] // STAGES  # A boxes per stage: a tile's rows / BOX_M
    PINGPONG: gl.constexpr = CONSUMERS == 2 and not SPLIT
    MINE: gl.constexpr = 1 if SPLIT else BOXES  # boxes (accumulators) this consumer multiplies
    BOX0: gl.constexpr = ME if SPLIT else 0  # its first box
    FIRST: gl.constexpr = 0 if SPLIT else ME
    STEP: gl.constexpr = 1 if SPLIT else CONSUMERS
    num_pid_m = gl.cdiv(c_desc.shape[0], BOX_M * BOXES)
    num_pid_n = gl.cdiv(c_desc.shape[1], BLOCK_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    my_turn = turns.index(ME)
    their_turn = turns.index((ME + 1) % CONSUMERS)
    EPILOGUE_BUFFERS: gl.constexpr = c_bufs.shape[0] // CONSUMERS  # this consumer's: from ME * that
    SLICES: gl.constexpr = BLOCK_N // c_desc.block_type.shape[1]  # C slices per box

    # One accumulator per box (the 2nd and 3rd are used only when MINE says so).
    mma0 = WGMMA.initialize(c_desc.dtype, BOX_M, BLOCK_N, gl.num_warps())
    mma1 = mma0
    mma2 = mma0
    spacing = deferred_store_spacing(k_steps)
    prev_m = gl.program_id(0) * 0  # DEFER_STORE: where the staged tile goes (none before the first)
    prev_n = prev_m
    for t in range(FIRST, gl.cdiv(num_pid_m * num_pid_n - gl.program_id(0), gl.num_programs(0)), STEP):
        if PINGPONG:
            # Consumer 0 goes first (a fresh barrier passes the parity-1 wait), then they alternate.
            n = t // CONSUMERS  # tiles this consumer has done before this one
            mbarrier.wait(my_turn, (n & 1) ^ (1 - ME))
        it = t * k_steps
        for k in range(k_steps):
            slot = it % STAGES
            mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
            b = b_operand(b_bufs.index(slot), B_KMAJOR)
            mma0 = mma0.issue(a_bufs.index(slot * BOXES + BOX0), b)
            if MINE > 1:
                mma1 = mma1.issue(a_bufs.index(slot * BOXES + 1), b)
            if MINE > 2:
                mma2 = mma2.issue(a_bufs.index(slot * BOXES + 2), b)
            if DEFER_STORE:  # the previous tile's C leaves while this tile's MMAs run
                store_staged_slice(c_desc, c_bufs, prev_m, prev_n, k, spacing, t > FIRST)
            # Only this step's MMAs may still run: step it-1's are retired, its stage can be refilled.
            mma0 = mma0.wait(MINE)
            if MINE > 1:
                mma1 = mma1.wait(MINE)
            if MINE > 2:
                mma2 = mma2.wait(MINE)
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k > 0)
            it += 1
        if PINGPONG:
            mbarrier.arrive(their_turn)  # this tile's MMAs are all issued: the other consumer may go
        acc0, mma0 = mma0.take_result()
        if MINE > 1:
            acc1, mma1 = mma1.take_result()
        if MINE > 2:
            acc2, mma2 = mma2.take_result()
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))

        tile = gl.program_id(0) + t * gl.num_programs(0)
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = (pid_m * BOXES + BOX0) * BOX_M
        off_n = pid_n * BLOCK_N
        if DEFER_STORE:
            stage_tile(c_desc, c_bufs, acc0, prev_m, prev_n, k_steps, spacing, t > FIRST)
            prev_m = off_m
            prev_n = off_n
        else:
            BASE: gl.constexpr = ME * EPILOGUE_BUFFERS
            store_tile_sliced(c_desc, c_bufs, acc0, off_m, off_n, EPILOGUE_BUFFERS, BASE)
            if MINE > 1:
                store_tile_sliced(c_desc, c_bufs, acc1, off_m + BOX_M, off_n, EPILOGUE_BUFFERS, BASE, SLICES)
            if MINE > 2:
                store_tile_sliced(
                    c_desc, c_bufs, acc2, off_m + 2 * BOX_M, off_n, EPILOGUE_BUFFERS, BASE, 2 * SLICES
                )
    if DEFER_STORE:
        store_staged_rest(c_desc, c_bufs, prev_m, prev_n, 0, spacing, True)
    tma.store_wait(0)


@gluon.jit
def warpspec_kernel(
    a_desc,
    b_desc,
    c_desc,
    B_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    CONSUMERS: gl.constexpr,
    EPILOGUE_BUFFERS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    BOXES: gl.constexpr = 1,
    SPLIT: gl.constexpr = False,
    DEFER_STORE: gl.constexpr = False,
):
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES * BOXES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_shape: gl.constexpr = [CONSUMERS * EPILOGUE_BUFFERS] + c_desc.block_type.shape
    c_bufs = gl.allocate_shared_memory(dtype, c_shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)
    init_barriers(empty, STAGES, 2 if SPLIT else 1)  # SPLIT: a stage is free once both consumers are done
    init_barriers(turns, CONSUMERS)

    K = a_desc.shape[1]
    # (Partition arguments are written out in place: a tuple stored in a variable loses constexprs.)
    if CONSUMERS == 2:  # ping-pong or split: consumer 0 is the default partition, consumer 1 a 4-warp worker
        gl.warp_specialize(
            [
                (
                    _consumer,
                    (c_desc, a_bufs, b_bufs, c_bufs, ready, empty, turns, B_KMAJOR, GROUP_M, K, 0, 2, SPLIT),
                ),
                (
                    _consumer,
                    (c_desc, a_bufs, b_bufs, c_bufs, ready, empty, turns, B_KMAJOR, GROUP_M, K, 1, 2, SPLIT),
                ),
                (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, B_KMAJOR, GROUP_M)),
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
                        a_bufs,
                        b_bufs,
                        c_bufs,
                        ready,
                        empty,
                        turns,
                        B_KMAJOR,
                        GROUP_M,
                        K,
                        0,
                        1,
                        False,
                        DEFER_STORE,
                    ),
                ),
                (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, B_KMAJOR, GROUP_M)),
            ],
            [1],
            [PRODUCER_REGS],
        )


def _constexprs(kmajor: bool, cfg: WarpSpecConfig) -> dict[str, object]:
    return {
        "B_KMAJOR": kmajor,
        "GROUP_M": cfg.GROUP_M,
        "STAGES": cfg.STAGES,
        "CONSUMERS": cfg.CONSUMERS,
        "EPILOGUE_BUFFERS": cfg.EPILOGUE_BUFFERS,
        "CONSUMER_REGS": CONSUMER_REGS,
        "PRODUCER_REGS": PRODUCER_REGS,
        "BOXES": cfg.BOXES,
        "SPLIT": cfg.SPLIT,
        "DEFER_STORE": cfg.DEFER_STORE,
    }


def prepare(a, b, out, cfg: WarpSpecConfig | None = None) -> Launch:
    from ..api import capability_of, sm_count

    cap = capability_of(a.device)
    if cap[0] == 10:
        from .blackwell import prepare_warpspec

        return prepare_warpspec(a, b, out)
    cfg = cfg or config_for(a.shape[1])
    a_desc, b_desc, c_desc, kmajor = make_descriptors(a, b, out, cfg)
    M, N = out.shape
    grid = (min(sm_count(a.device), triton.cdiv(M, cfg.tile_m) * triton.cdiv(N, cfg.BLOCK_N)),)
    kw = _constexprs(kmajor, cfg)

    def fn():
        warpspec_kernel[grid](a_desc, b_desc, c_desc, **kw, num_warps=cfg.num_warps)

    return Launch(fn, cfg.table())


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    if unsupported_reason(capability):
        return []
    if capability[0] == 10:
        from .blackwell import warpspec_compile_specs

        return warpspec_compile_specs(dtype)
    return [
        CompileSpec(
            "warpspec",
            f"warpspec_kernel {cfg.label} B{'t' if kmajor else 'row'}",
            warpspec_kernel,
            gemm_signature(cfg, dtype, kmajor) | dict.fromkeys(_constexprs(kmajor, cfg), "constexpr"),
            _constexprs(kmajor, cfg),
            {"num_warps": cfg.num_warps},
        )
        for cfg in (PINGPONG, SPLIT, COOPERATIVE)
        for kmajor in (False, True)
    ]
