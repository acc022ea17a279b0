"""Grouped GEMM for mixture-of-experts layers (Hopper): out[rows of expert e] = x[rows of e] @ w[e].

The idea: persistent over a compact tile list. One persistent launch walks the output tiles of
every expert that has rows, and nothing else; each expert's token range comes from device-side
offsets (`offs`, int32 [E], cumulative ends, as `torch._grouped_mm` and transformers take them),
so there is no host sync and the launch is CUDA-graph capturable with other offsets at each
replay. Second version (docs/perf-notes.md, entry 56): the first walked E * cdiv(S, BLOCK_M) *
tiles_n tile slots, every expert sized as if it had all S tokens, and skipped the empty ones at
two loads of `offs` each (524k slots at E = 128, S = 32768: about 4,000 a program, where the
real tiles were 31); it ordered an expert's tiles n fastest, so the 132 tiles in flight on a big
expert spanned one row strip and 132 weight column blocks and streamed the weight from HBM once
per strip; and its epilogue ran with the ring empty.

Status: passes tests/test_grouped_gpu.py on an H100 (16-bit and fp8, commit 280c632). Over the
whole `--shapes moe` preset, as `grouped_matmul` runs it (T >= 512 in 16-bit, every size in fp8),
results/h100-moe-auto; the first version ran at 0.21-0.76x torch._grouped_mm at 4096 tokens
(results/experiments/h100-grouped-first), this one at 1.09-1.15x geomean from 512 tokens up.

How the tiles are laid out. x [S, K] holds the tokens grouped by expert (expert e's rows are
offs[e-1] .. offs[e] - 1, offs[-1] taken as 0), w is the [E, N, K] weight (transformers passes
its [E, K, N] transpose view) read K-major through one 2-D TMA descriptor over its [E * N, K]
reshape.

The schedule. Each program loads the E offsets once, as a vector of EXPERTS_PAD (a power of two
>= E, at least 32, a constexpr the host picks) held whole by every warp (32 lanes, EXPERTS_PAD /
32 entries each, the warps holding copies): each expert's row count, clamped to [0, S] (a
decreasing pair reads as empty), its tile count cdiv(count, BLOCK_M) * tiles_n, and their
inclusive prefix sum (`prefix`, a scan); the last is the number of real tiles. The persistent
loop runs t = pid, pid + P, ... below that number only. Tile t is expert e = the number of
prefix entries <= t (a compare and a sum, inside one warp since every warp holds the whole
vector: shuffles and warp reductions, no shared memory, no barrier), its first tile the largest
such entry, its rows two scalar loads of `offs`. The grid is min(SMs, an upper bound of the
tile count from S, E and N alone: `tile_bound`), so it never depends on the offsets' values.

Tile order inside an expert: grouped (`grouped_tile`, GROUP_M = 16 row tiles sweep the columns
together), so that the tiles in flight share weight columns. With GROUP_M row tiles or fewer
(up to 2048 tokens an expert) that is m fastest: the tiles of one weight column block run at
the same time and the weight is read from HBM once; the expert's rows, which are fewer bytes
than its weight, are what L2 keeps between column blocks. Past 16 row tiles (one expert with
most of a large batch) the groups bound the A rows in flight the same way, which m fastest
would not (132 row tiles over one column block: A streamed once per column block).

Tiles: 128x128 (8 warps), or from N = WIDE_N on persistent's 128x256 (two warpgroups of 64 x
256), which reads each A box once for 256 columns instead of 128 and has half as many tiles; but
the narrow tile where the wide one's few tiles would leave the SMs idle (`narrow_reason`).

Reads and writes of other experts' rows: an A box starting at offs[e-1] + pid_m * BLOCK_M may run
past offs[e] into the next expert's rows, and a B box of the last column tile runs past N into the
next expert's weight rows; both only add to output rows or columns that the epilogue does not
write. So the epilogue is a masked register store (rows < the expert's count, columns < N), not a
TMA store, in slices of EPILOGUE_N columns (each through a layout conversion of its own, whose
shared-memory scratch now sits beside the ring). K tails are zero-filled by TMA (past K) and so
add nothing. Rows at or past offs[-1] are not written; checking that the offsets never decrease
would need a host sync (`gluon_survey.grouped.check_offsets` does it, for debugging).

fp8 e4m3 operands with row-wise scales (SCALING 2; `FP8_CONFIGS`, `FP8_WIDE_CONFIGS`): the same
kernel with BLOCK_K 128 (fp8 wgmma reads both operands K-major, as x and the [E, N, K] weight
are), and the dense rungs' dequantization in the epilogue, on the fp32 accumulator before the
output dtype: each row times its token's scale scale_x[row] ([S], loaded in the accumulator's row
layout), each column of a slice times the expert's channel scale scale_w[e, column] ([E, N],
loaded one per thread and redistributed). Rows and columns the epilogue does not write get scale 0.
Measured (H100): 1.145x torch._scaled_grouped_mm geomean over `--shapes moe`, the misses at
decode sizes (docs/perf-notes.md, entry 59), which `grouped_matmul` now runs on the swap-AB
kernel's fp8 path, as in 16-bit (kernels/grouped_swapab.py; entry 61).

The K loop is persistent's flat ring: the producer runs STAGES - 1 (tile, K step) loads ahead of
the MMAs across tile boundaries, so the next tile's first loads are in flight during a tile's
last MMAs and its epilogue; the ring position is counted over the program's whole tile list so
the mbarrier phases stay right. The producer finds its next tile while an MMA runs, and the
consumer finds the tile it stores while its last MMA runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch import CompileSpec, Launch, Scales, Target
from .arch import select_mma
from .common import (
    SMEM_LIMIT,
    Ring,
    column_scales,
    column_slice,
    grouped_tile,
    init_barriers,
    invalidate_barriers,
    load_a,
    load_b,
    load_step,
    mbarrier,
    scale_rows,
)
from .plan import (
    FP8,
    FP8_OUT,
    GL_DTYPES,
    GroupedPlan,
    Launcher,
    desc_signature,
    smem_layout,
    templates_of,
)

__all__ = [
    "CONFIGS",
    "FP8_CONFIGS",
    "FP8_WIDE_CONFIGS",
    "GLUS",
    "GLU_CONFIGS",
    "GLU_WIDE_CONFIGS",
    "MAX_EXPERTS",
    "NARROW_ROWS",
    "NARROW_WAVES",
    "WIDE_CONFIGS",
    "WIDE_N",
    "GroupedConfig",
    "check_operand_kind",
    "compile_specs",
    "config_for",
    "experts_pad",
    "grouped_kernel",
    "narrow_reason",
    "plan",
    "plan_of",
    "prepare",
    "spec_of",
    "tile_bound",
    "unsupported_reason",
]

_POINTER_TYPES = {"float16": "*fp16", "bfloat16": "*bf16"}  # of the output
OUT_BYTES = 2  # fp16 / bf16 output (an fp8 product is written as bf16 or fp16 too)

# The GLU constexpr's codes: the epilogue's gated activation (GroupedConfig.GLU).
GLUS = {0: "none", 1: "swiglu"}

# Each warp holds the offsets' table whole, EXPERTS_PAD / 32 int32 a lane for each vector kept
# live through the loop (the prefix ends): 16 registers at 512 experts.
MAX_EXPERTS = 512


@dataclass(frozen=True)
class GroupedConfig:
    """Tile and launch shape of the grouped kernel. Building one whose ring and epilogue scratch
    do not fit in a block's shared memory raises ValueError."""

    BLOCK_M: int = 128
    BLOCK_N: int = 128
    BLOCK_K: int = 64
    STAGES: int = 4
    num_warps: int = 8
    GROUP_M: int = 16  # row tiles of one expert that sweep its columns together
    EPILOGUE_N: int = 128  # columns stored at a time (one layout conversion each)
    ELEM_BYTES: int = 2  # bytes of an x or w element: 2 for fp16/bf16, 1 for an fp8 config
    # 0: out = x @ w[e]; 1 (SwiGLU): out = silu(gate) * up, the MMA's BLOCK_N columns half gate
    # rows, half up rows of the [E, 2I, K] weight, and the output tile BLOCK_N // 2 wide (`out_n`)
    GLU: int = 0

    def __post_init__(self):
        if self.STAGES < 2:
            raise ValueError(f"STAGES must be at least 2 (loads in flight behind the MMA), got {self.STAGES}")
        if self.GLU not in GLUS:
            raise ValueError(f"GLU is one of {sorted(GLUS)} ({', '.join(GLUS.values())}), got {self.GLU!r}")
        if self.GLU and self.ELEM_BYTES == 1:
            raise ValueError("the fused SwiGLU epilogue (GLU 1) is for 16-bit operands, not fp8")
        if self.out_n % self.EPILOGUE_N:
            raise ValueError(
                f"EPILOGUE_N ({self.EPILOGUE_N}) must divide the output tile's {self.out_n} columns"
            )
        need = self.smem_bytes() + self.epilogue_bytes()
        if need > SMEM_LIMIT:
            raise ValueError(
                f"{self.label} needs {need} B of shared memory (ring and epilogue scratch); a block has "
                f"{SMEM_LIMIT}"
            )

    def smem_bytes(self) -> int:
        """Shared memory of the operand ring."""
        return self.STAGES * (self.BLOCK_M + self.BLOCK_N) * self.BLOCK_K * self.ELEM_BYTES

    def epilogue_bytes(self) -> int:
        """At most what an epilogue slice's layout conversion takes, beside the ring: the ring is
        live then (the next tile's loads are in flight), so the two cannot share memory."""
        return self.BLOCK_M * self.EPILOGUE_N * OUT_BYTES

    @property
    def out_n(self) -> int:
        """Output columns of a tile: BLOCK_N, or with GLU half of it (the MMA's columns are gate and
        up channels in two halves, and their product is one column each)."""
        return self.BLOCK_N // 2 if self.GLU else self.BLOCK_N

    @property
    def label(self) -> str:
        fp8 = " fp8" if self.ELEM_BYTES == 1 else ""
        glu = f" {GLUS[self.GLU]}" if self.GLU else ""
        return f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K}{fp8}{glu} s{self.STAGES} w{self.num_warps}"

    def table(self) -> dict[str, object]:
        return {
            "BLOCK_M": self.BLOCK_M,
            "BLOCK_N": self.BLOCK_N,
            "BLOCK_K": self.BLOCK_K,
            "stages": self.STAGES,
            "warps": self.num_warps,
            "group_m": self.GROUP_M,
            "epilogue_n": self.EPILOGUE_N,
        } | ({"glu": GLUS[self.GLU]} if self.GLU else {})


# Hopper, N < WIDE_N: Pipelined's 128-wide N with a deeper ring, 4 stages of 32 KB.
CONFIGS = {9: GroupedConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=4, num_warps=8)}
# Hopper, N >= WIDE_N: persistent's 128x256 tile (two warpgroups of 64 x 256), which reads each A
# box once for 256 columns instead of 128: half the A traffic from L2. 4 stages of 48 KB and the
# epilogue's 32 KB of scratch (two 128-column slices) fit in 227 KB.
WIDE_CONFIGS = {9: GroupedConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, STAGES=4, num_warps=8, EPILOGUE_N=128)}
WIDE_N = 2048  # from this N on, the wide tile: 2048 columns make 8 column tiles an expert
# ... except where the wide tile leaves the GPU mostly idle (16-bit, unfused): an expert's rows fit
# one row block on average (S / E <= NARROW_ROWS), so either tile reads each weight once and the
# call is bound by those bytes, and the wide tiles of one row block an expert, E * cdiv(N, 256),
# fit NARROW_WAVES wave of the SMs, so much of the GPU waits on them. There the narrow tile's twice
# as many tiles fill the SMs. Measured kernel-only on an H100 at 256-1024 tokens over four models'
# experts (results/experiments/h100-grouped-tiles-mid): on Mixtral-8x7B's down projection (N 4096,
# K 14336, 8 experts: 128 wide tiles a row block) the narrow tile took 0.93-0.97x the wide one's
# time at 384 tokens and 0.93-1.02x at 512, and 1.21-1.27x at 768 (192 rows an expert, near the
# compute roof, where the narrow tile's MMAs are the slower); where the wide tiles fill several
# waves (Mixtral's gate_up, 896 tiles) it took 1.04-1.11x at 512 tokens. Up to two waves of wide
# tiles, the line first drawn, did not hold on an H200 on other models' experts
# (results/experiments/h200-grouped-tiles-holdout): on Mixtral-8x22B's and Phi-3.5-MoE's down
# projections (192 and 256 wide tiles) the narrow tile was the slower in 25 of the rule's 28 cells
# at 320-1024 tokens, taking up to 1.22x the wide one's time; on Mixtral-8x7B's the faster in 7 of
# 12.
# docs/perf-notes.md, entries 71, 80 and 82.
NARROW_ROWS = 128
NARROW_WAVES = 1
# fp8 e4m3 operands (row-wise scales): the same tiles and stage bytes with K twice as deep, 128
# elements (128-byte rows, as the dense fp8 rungs): a stage holds as many bytes and as many MMA
# clocks (fp8 wgmma runs at twice the 16-bit rate), so the ring's balance is the 16-bit one. The
# wide tile stores 64 columns at a time: with 128 the column scales beside the 128-register
# accumulator spilled (254 registers and 8 B of spills compiled with N unknown; 64: 255, none;
# 218 where N is a multiple of 16, as every model's is).
FP8_CONFIGS = {major: replace(cfg, BLOCK_K=128, ELEM_BYTES=1) for major, cfg in CONFIGS.items()}
FP8_WIDE_CONFIGS = {
    major: replace(cfg, BLOCK_K=128, ELEM_BYTES=1, EPILOGUE_N=64) for major, cfg in WIDE_CONFIGS.items()
}

# SwiGLU fused into the epilogue (GLU 1): the unfused product's MMA tile at the same weight rows
# N = 2I (128x128 below WIDE_N, 128x256 from it on), now half gate and half up rows, so a tile
# stores 64 or 128 columns of the [S, I] result; each K step loads two weight boxes into one
# stage, gate rows j and up rows I + j, and the ring's bytes are the unfused tile's.
GLU_CONFIGS = {major: replace(cfg, GLU=1, EPILOGUE_N=64) for major, cfg in CONFIGS.items()}
GLU_WIDE_CONFIGS = {major: replace(cfg, GLU=1, EPILOGUE_N=128) for major, cfg in WIDE_CONFIGS.items()}


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """This kernel multiplies with wgmma: sm_90 only. (Blackwell runs its tcgen05 version,
    kernels/grouped_tcgen05.py, which the registry's `grouped` mode picks on sm_100.)"""
    if capability[0] in CONFIGS:
        return None
    gpu = f"sm_{capability[0]}{capability[1]}"
    if capability[0] == 10:
        return f"this wgmma kernel is Hopper's (sm_90); on {gpu} the grouped mode runs grouped_tcgen05.py"
    return f"the grouped kernel runs on Hopper (sm_90) and Blackwell (sm_100); this GPU is {gpu}"


def config_for(
    capability: tuple[int, int],
    N: int,
    fp8: bool = False,
    glu: bool = False,
    *,
    S: int | None = None,
    E: int | None = None,
    sm_count: int | None = None,
) -> GroupedConfig:
    """The config a product with N output columns runs: the wide tile from N = WIDE_N on; with
    `fp8` operands, the fp8 config of that tile; with `glu` (16-bit only), the fused SwiGLU config
    of that tile, N then being the weight's 2I rows an expert. Given S token-slots over E experts
    on `sm_count` SMs, 16-bit unfused products take the narrow tile at N >= WIDE_N too where
    `narrow_reason` says the wide one leaves the GPU mostly idle."""
    if glu:
        return (GLU_WIDE_CONFIGS if N >= WIDE_N else GLU_CONFIGS)[capability[0]]
    if fp8:
        return (FP8_WIDE_CONFIGS if N >= WIDE_N else FP8_CONFIGS)[capability[0]]
    narrow = N < WIDE_N or (S is not None and narrow_reason(S, N, E, sm_count) is not None)
    return (CONFIGS if narrow else WIDE_CONFIGS)[capability[0]]


def narrow_reason(S: int, N: int, E: int, sm_count: int) -> str | None:
    """Why a 16-bit unfused product with N >= WIDE_N output columns runs the narrow tile, or None
    where the wide one runs (`NARROW_ROWS`, `NARROW_WAVES`): what the host knows, S, N, E and the
    SMs, without reading the offsets."""
    rows = triton.cdiv(S, E)
    wide = E * triton.cdiv(N, WIDE_CONFIGS[9].BLOCK_N)
    if N < WIDE_N or rows > NARROW_ROWS or wide > NARROW_WAVES * sm_count:
        return None
    return (
        f"{rows} rows an expert (<= {NARROW_ROWS}) and {wide} wide tiles at one row block an expert "
        f"(<= {NARROW_WAVES} wave of {sm_count} SMs): the 128-wide tile fills the SMs"
    )


def experts_pad(E: int) -> int:
    """EXPERTS_PAD for E experts: the next power of two, at least 32 (a warp's lanes)."""
    if E > MAX_EXPERTS:
        raise ValueError(f"the grouped kernel takes at most {MAX_EXPERTS} experts, got {E}")
    return max(32, triton.next_power_of_2(E))


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _expert_ranges(offs, S, E, EXPERTS_PAD: gl.constexpr):
    """(e, starts, ends), EXPERTS_PAD entries each: the experts' indices and their rows offs[e-1]
    (0 for e = 0) to offs[e], both clamped to [0, S] (0 past E), in a layout where every warp holds
    the whole vector, so reductions over it stay inside a warp."""
    layout: gl.constexpr = gl.BlockedLayout([EXPERTS_PAD // 32], [32], [gl.num_warps()], [0])
    e = gl.arange(0, EXPERTS_PAD, layout=layout)
    ends = gl.load(offs + e, mask=e < E, other=0)
    starts = gl.load(offs + e - 1, mask=(e > 0) & (e < E), other=0)
    ends = gl.minimum(gl.maximum(ends, 0), S)
    starts = gl.minimum(gl.maximum(starts, 0), S)
    return e, starts, ends


@gluon.jit
def _schedule(offs, S, E, tiles_n, BLOCK_M: gl.constexpr, EXPERTS_PAD: gl.constexpr):
    """The inclusive prefix sum of the experts' tile counts (EXPERTS_PAD entries, the padding
    repeating the total) and the total, the number of real tiles. Every warp holds the whole
    vector (`_expert_ranges`), so later reductions over it stay inside a warp."""
    _, starts, ends = _expert_ranges(offs, S, E, EXPERTS_PAD)
    counts = gl.maximum(ends - starts, 0)
    tiles = (counts + (BLOCK_M - 1)) // BLOCK_M * tiles_n
    prefix = gl.associative_scan(tiles, 0, _add)
    return prefix, gl.max(prefix, 0)


@gluon.jit
def _expert_rows(offs, e, S):
    """(first row, row count) of expert e: offs[e-1] (0 for e = 0) to offs[e], clamped to [0, S];
    decreasing offsets read as an empty expert (count 0), as in `_schedule`."""
    prev = gl.load(offs + gl.maximum(e - 1, 0))
    start = prev * (e > 0).to(gl.int32)
    end = gl.load(offs + e)
    start = gl.minimum(gl.maximum(start, 0), S)
    end = gl.minimum(gl.maximum(end, 0), S)
    return start, gl.maximum(end - start, 0)


@gluon.jit
def _tile_of(t, prefix, offs, S, E, tiles_n, BLOCK_M: gl.constexpr, GROUP_M: gl.constexpr):
    """Tile t of the compact list -> (expert's first row, its row count, row tile, column tile).
    For t past the list (a producer that has run off its last tile) the values are of the last
    expert and unused: its loads are predicated off."""
    before = prefix <= t
    e = gl.minimum(gl.sum(before.to(gl.int32), 0), E - 1)
    first = gl.max(gl.where(before, prefix, 0), 0)  # the tile list's index of e's first tile
    start, count = _expert_rows(offs, e, S)
    row_tiles = gl.maximum(gl.cdiv(count, BLOCK_M), 1)
    pid_m, pid_n = grouped_tile(t - first, row_tiles, tiles_n, GROUP_M)
    return e, start, count, pid_m, pid_n


@gluon.constexpr_function
def weight_boxes(GLU):
    """Weight boxes a K step loads: one, or with a GLU two (gate rows and up rows)."""
    return 2 if GLU else 1


@gluon.jit
def _load_coords(
    t,
    prefix,
    offs,
    S,
    N,
    E,
    tiles_n,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    GROUP_M: gl.constexpr,
    GLU: gl.constexpr = 0,
):
    """Tile t -> (A row, weight row) of its first box: rows of x, rows of the [E * N, K] weight
    (with a GLU, of the [E * 2N, K] weight: N output columns, 2N weight rows an expert, the gate
    box's; the up box's row is N further on)."""
    e, start, _count, pid_m, pid_n = _tile_of(t, prefix, offs, S, E, tiles_n, BLOCK_M, GROUP_M)
    return start + pid_m * BLOCK_M, e * (weight_boxes(GLU) * N) + pid_n * BLOCK_N


@gluon.jit
def _next_load(
    a_desc,
    b_desc,
    p,
    total,
    prefix,
    offs,
    S,
    N,
    E,
    tiles_n,
    k_steps,
    a_bufs,
    b_bufs,
    ready,
    GROUP_M: gl.constexpr,
    GLU: gl.constexpr = 0,
):
    """Issue the producer's next load and advance its state p = (tile, K step, ring position, A
    row, weight row) past it; at the end of a tile it moves to this program's next tile (found
    once per tile, not per K step), so loads run ahead across tile boundaries. Past the program's
    last tile the loads are predicated off. With a GLU a stage's weight buffer is two boxes tall:
    the gate rows (w_row) above, the up rows (w_row + N) below, on one barrier with the A box."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    tile, k, ring, a_row, w_row = p
    slot = ring.slot()
    if GLU:
        bar = ready.index(slot)
        pred = tile < total
        b_buf = b_bufs.index(slot)
        mbarrier.expect(bar, a_desc.block_type.nbytes + 2 * b_desc.block_type.nbytes, pred)
        load_a(a_desc, a_row, k * BLOCK_K, bar, a_bufs.index(slot), True, pred)
        load_b(b_desc, w_row, k * BLOCK_K, bar, b_buf.slice(0, BLOCK_N), True, pred)
        load_b(b_desc, w_row + N, k * BLOCK_K, bar, b_buf.slice(BLOCK_N, BLOCK_N), True, pred)
    else:
        load_step(
            a_desc,
            b_desc,
            a_row,
            w_row,
            k * BLOCK_K,
            ready.index(slot),
            a_bufs.index(slot),
            b_bufs.index(slot),
            True,
            pred=tile < total,
        )
    k += 1
    if k == k_steps:
        k = 0
        tile += gl.num_programs(0)
        a_row, w_row = _load_coords(tile, prefix, offs, S, N, E, tiles_n, BLOCK_M, BLOCK_N, GROUP_M, GLU)
    return tile, k, ring.next(), a_row, w_row


@gluon.jit
def _gated(acc, GLU: gl.constexpr):
    """The fused gate on a finished fp32 tile: GLU 1, the tile's left half (gate channels j) and
    right half (up channels I + j, the same j: a register renaming, the same thread holds both) ->
    silu(gate) * up = gate * up / (1 + exp(-gate)), in fp32 (the division the fast one, within 2
    ulp), half as wide; GLU 0 leaves it."""
    if GLU == 1:
        HALF: gl.constexpr = acc.shape[1] // 2
        gate = column_slice(acc, 0, HALF)
        up = column_slice(acc, 1, HALF)
        acc = gl.fdiv(gate * up, 1.0 + gl.exp2(gate * -1.4426950408889634), ieee_rounding=False)
    return acc


@gluon.jit
def _scale_rows(acc, scale_x, start, count, row0, SCALING: gl.constexpr):
    """fp8 dequantization, the token side, on a finished fp32 tile whose rows are row0 .. of the
    expert whose rows start at `start`: SCALING 2 multiplies row r by its token's scale
    scale_x[start + row0 + r] (0 for rows at or past `count`, which are not stored), 1 by the one
    per-tensor scale *scale_x, 0 (fp16/bf16) leaves it."""
    if SCALING == 2:
        acc = scale_rows(acc, scale_x + start, row0, count)
    elif SCALING == 1:
        acc = acc * gl.load(scale_x)
    return acc


@gluon.jit
def _scale_columns(part, scale_w, e, off_n, N, SCALING: gl.constexpr):
    """fp8 dequantization, the weight side, on an epilogue slice at column off_n of expert e's
    output: SCALING 2 multiplies column c by the expert's channel scale scale_w[e * N + off_n + c]
    (the [E, N] scales, row-major; 0 past N), 1 by the per-tensor *scale_w, 0 leaves it. Per
    slice, as the dense rungs do: a thread holds a scale for each of its columns."""
    if SCALING == 2:
        part = part * gl.expand_dims(column_scales(scale_w + e * N, off_n, N, part), 0)
    elif SCALING == 1:
        part = part * gl.load(scale_w)
    return part


@gluon.jit
def _store_rows(out, acc, start, count, row0, off_n, N):
    """Rows row0 .. row0 + BLOCK_M - 1 of the expert whose rows start at `start` (only those below
    `count`), columns off_n .. (only those below N): acc -> output dtype -> a coalesced layout ->
    masked stores into the row-major [S, N] output."""
    BLOCK_M: gl.constexpr = acc.shape[0]
    BLOCK_N: gl.constexpr = acc.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    c = gl.convert_layout(acc.to(out.dtype.element_ty), layout)
    rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    mask = gl.expand_dims(rows < count, 1) & gl.expand_dims(cols < N, 0)
    offsets = gl.expand_dims((start + rows).to(gl.int64) * N, 1) + gl.expand_dims(cols, 0)
    gl.store(out + offsets, c, mask=mask)


@gluon.jit
def grouped_kernel(
    a_desc,
    b_desc,
    out,
    offs,
    scale_x,
    scale_w,
    S,
    N,
    E,
    MMA: gl.constexpr,
    STAGES: gl.constexpr,
    GROUP_M: gl.constexpr,
    EPILOGUE_N: gl.constexpr,
    EXPERTS_PAD: gl.constexpr,
    SCALING: gl.constexpr,
    GLU: gl.constexpr = 0,
):
    """a_desc: x [S, K], block [BLOCK_M, BLOCK_K]; b_desc: the weight as [E * N, K], block
    [BLOCK_N, BLOCK_K]; out: row-major [S, N]; offs: int32 [E], cumulative ends of the experts' rows;
    GLU 1 (SwiGLU, 16-bit only): b_desc is the [E * 2N, K] gate_up weight (each expert's N gate
    rows, then its N up rows), out [S, N] gets silu(x @ gate^T) * (x @ up^T), and an MMA tile is
    two boxes wide (2 * BLOCK_N columns: gate rows j, up rows N + j) for BLOCK_N output columns;
    EXPERTS_PAD: a power of two >= E, at least 32. fp8 e4m3 operands (SCALING 2, row-wise) come
    with fp32 scales, scale_x [S] (one per token) and scale_w [E, N] (one per expert and output
    channel, row-major), applied to the fp32 accumulator before the store: out = (x @ w[e]) *
    scale_x[row] * scale_w[e, column]. SCALING 0: fp16/bf16, and scale_x, scale_w are None.
    (SCALING 1, one per-tensor scale each, is compiled by `gluon-survey inspect --dtype fp8`;
    `grouped_matmul` takes row-wise scales only.)"""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]  # output columns of a tile
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    MMA_N: gl.constexpr = weight_boxes(GLU) * BLOCK_N  # the MMA's columns: weight rows a stage holds
    dtype: gl.constexpr = a_desc.dtype
    k_steps = gl.cdiv(a_desc.shape[1], BLOCK_K)
    tiles_n = gl.cdiv(N, BLOCK_N)
    prefix, total = _schedule(offs, S, E, tiles_n, BLOCK_M, EXPERTS_PAD)

    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES, MMA_N, BLOCK_K], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)

    # Producer state: the next load is K step p[1] of tile p[0], into ring position p[2].
    a_row, w_row = _load_coords(
        gl.program_id(0), prefix, offs, S, N, E, tiles_n, BLOCK_M, BLOCK_N, GROUP_M, GLU
    )
    p = (gl.program_id(0), 0, Ring.start(STAGES), a_row, w_row)
    for _ in gl.static_range(STAGES - 1):
        p = _next_load(
            a_desc, b_desc, p, total, prefix, offs, S, N,
            E, tiles_n, k_steps, a_bufs, b_bufs, ready, GROUP_M, GLU,
        )  # fmt: skip

    mma = MMA.initialize(dtype, BLOCK_M, MMA_N, gl.num_warps())
    ring = Ring.start(STAGES)  # the consumer's position, over all of this program's K steps
    for t in range(gl.program_id(0), total, gl.num_programs(0)):
        for _k in range(k_steps):
            ring.wait_filled(ready)
            slot = ring.slot()
            mma = mma.issue(a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)))
            mma = mma.wait(1)  # retires MMA k-1, whose stage is the one refilled next
            # The freed stage gets the producer's next load, which may already be the next tile's.
            p = _next_load(
                a_desc, b_desc, p, total, prefix, offs, S, N,
                E, tiles_n, k_steps, a_bufs, b_bufs, ready, GROUP_M, GLU,
            )  # fmt: skip
            ring = ring.next()
        # Where this tile goes, found while its last MMA runs.
        e, start, count, pid_m, pid_n = _tile_of(t, prefix, offs, S, E, tiles_n, BLOCK_M, GROUP_M)
        acc, mma = mma.take_result()
        acc = _scale_rows(acc, scale_x, start, count, pid_m * BLOCK_M, SCALING)
        acc = _gated(acc, GLU)  # [BLOCK_M, BLOCK_N] of the output
        for j in gl.static_range(BLOCK_N // EPILOGUE_N):
            off_n = pid_n * BLOCK_N + j * EPILOGUE_N
            part = _scale_columns(column_slice(acc, j, EPILOGUE_N), scale_w, e, off_n, N, SCALING)
            _store_rows(out, part, start, count, pid_m * BLOCK_M, off_n, N)
    invalidate_barriers(ready, STAGES)


def constexprs(
    cfg: GroupedConfig, capability: tuple[int, int], E: int, scaling: int = 0
) -> dict[str, object]:
    """The kernel's constexprs, for its launch and its compile specs alike; `scaling` is the SCALING
    code (`launch.Scales.code`: 0 without scales, 2 row-wise)."""
    return {
        "MMA": select_mma(capability),
        "STAGES": cfg.STAGES,
        "GROUP_M": cfg.GROUP_M,
        "EPILOGUE_N": cfg.EPILOGUE_N,
        "EXPERTS_PAD": experts_pad(E),
        "SCALING": scaling,
        "GLU": cfg.GLU,
    }


def tile_bound(S: int, N: int, E: int, cfg: GroupedConfig) -> int:
    """The most tiles offsets that never decrease can make, what the grid is sized by: S //
    BLOCK_M full row tiles plus at most one partial one per expert, and no more row tiles than
    rows, times the column tiles of the N output columns. (Decreasing offsets may make more; the
    programs then loop over them all the same.)"""
    return min(S // cfg.BLOCK_M + E, S) * triton.cdiv(N, cfg.out_n)


def _dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def plan(
    x, w, target: Target, cfg: GroupedConfig | None = None, scales: Scales | None = None, glu: bool = False
) -> GroupedPlan:
    """The plan of out[rows of e] = x[rows of e] @ w[e] for every expert e (`GroupedPlan`: launched
    on these operands' like, any offsets). x [S, K] row-major, w the [E, K, N] transpose view of a
    contiguous [E, N, K] weight, offs int32 [E] on the GPU, out row-major [S, N]; S, N, K > 0, K a
    multiple of 8 (16 for fp8: TMA's 16-byte row stride) and E at most MAX_EXPERTS. fp8 e4m3
    operands come with `scales` (kind "row": `a` the [S] token scales, `b` the [E, N]
    expert-channel scales, contiguous fp32) and a bf16 or fp16 `out`.
    `gluon_survey.grouped.grouped_matmul` checks all of that first. `cfg`: the config to run
    (`config_for`'s by default); one of the other kind of operands is a ValueError. `glu`: the
    fused SwiGLU (16-bit only): w is the [E, K, 2I] view of the [E, 2I, K] gate_up weight (gate
    rows first), out [S, I] gets silu(x @ gate) * (x @ up) per expert, and `cfg` a GLU config
    (`GLU_CONFIGS`, `GLU_WIDE_CONFIGS`); `gluon_survey.grouped.grouped_swiglu` checks it."""
    reason = unsupported_reason(target.capability)
    if reason:
        raise RuntimeError(reason)
    S, E, N = x.shape[0], w.shape[0], w.shape[2]
    narrow = None  # why the narrow tile runs at N >= WIDE_N, where config_for's rule says so
    if cfg is None:
        cfg = config_for(target.capability, N, scales is not None, glu, S=S, E=E, sm_count=target.sm_count)
        if cfg is CONFIGS[target.capability[0]]:
            narrow = narrow_reason(S, N, E, target.sm_count)
    check_operand_kind("grouped", cfg, x, scales)
    if bool(cfg.GLU) != glu:
        raise ValueError(
            f"grouped: config {cfg.label} is {'a' if cfg.GLU else 'no'} fused-SwiGLU config; "
            f"this launch is {'' if glu else 'not '}one (glu={glu})"
        )
    values = constexprs(cfg, target.capability, w.shape[0], scales.code if scales else 0)
    chosen = plan_of(grouped_kernel, values, x, w, target, cfg, scales)
    return replace(chosen, config={**chosen.config, "tile": narrow}) if narrow else chosen


def prepare(
    x, w, offs, out, target: Target, cfg: GroupedConfig | None = None, scales: Scales | None = None, glu=False
) -> Launch:
    """A ready launch of `plan`'s plan on these tensors (what the driver times)."""
    return plan(x, w, target, cfg, scales, glu).bind(x, w, offs, out, scales)


def check_operand_kind(who: str, cfg: GroupedConfig, x, scales: Scales | None) -> None:
    """ValueError unless `cfg` is for the kind of operands x is (fp8, which come with `scales`, or
    16-bit) and fp8 scales are row-wise: the check every grouped kernel's `prepare` makes (this
    module's, kernels/grouped_swapab.py's and kernels/grouped_tcgen05.py's)."""
    fp8 = scales is not None
    if fp8 != (cfg.ELEM_BYTES == 1):
        kind = "fp8" if cfg.ELEM_BYTES == 1 else "16-bit"
        raise ValueError(f"{who}: config {cfg.label} is for {kind} operands; these are {_dtype_name(x)}")
    if fp8 and scales.kind != "row":
        raise ValueError(f"{who}: fp8 scales are row-wise ([S] and [E, N]), not {scales.kind!r}")


def plan_of(
    kernel,
    values: dict[str, object],
    x,
    w,
    target: Target,
    cfg,
    scales,
    blocks: tuple[list[int], list[int]] | None = None,
) -> GroupedPlan:
    """The plan of a grouped kernel with this module's arguments (`grouped_kernel`, the tcgen05 one
    of kernels/grouped_tcgen05.py, the swap-AB one of kernels/grouped_swapab.py): the x and weight
    descriptors of `cfg`'s boxes (or the (x, weight) `blocks` given), the grid (`tile_bound`), the
    constexprs `values`; checked operands and config (`plan`)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    S, K = x.shape
    E, _, N = w.shape
    weight = w.transpose(1, 2).reshape(E * N, K)  # a view of the contiguous [E, N, K] weight
    if cfg.GLU:
        N //= 2  # the output's columns: the weight holds a gate and an up row for each
    gdt = GL_DTYPES[_dtype_name(x)]
    a_block, b_block = blocks or ([cfg.BLOCK_M, cfg.BLOCK_K], [cfg.out_n, cfg.BLOCK_K])
    a_desc = TensorDescriptor.from_tensor(x, a_block, smem_layout(a_block, gdt))
    b_desc = TensorDescriptor.from_tensor(weight, b_block, smem_layout(b_block, gdt))
    grid = (max(1, min(target.sm_count, tile_bound(S, N, E, cfg))),)
    launcher = Launcher(kernel, grid, values, cfg.num_warps)
    config = cfg.table() | ({"scales": "row"} if scales is not None else {})
    return GroupedPlan(launcher, templates_of((a_desc, b_desc)), (S, N, E), config)


def compile_specs(
    capability: tuple[int, int], dtype: str = "float16", glu: bool = False
) -> list[CompileSpec]:
    """The specs of the configs this architecture runs (narrow N, then wide), for a compile
    without a GPU (none where the kernel does not run, or for other dtypes), each for the most
    experts (MAX_EXPERTS: the largest table a lane holds). S, N, E are plain int32 arguments, so
    N is not known to be a multiple of 8 and the stores stay scalar (a launch with such an N, as
    every model's is, specializes it and vectorizes them: fewer registers); out and offs are
    compiled as 16-byte aligned, as torch allocates them. fp8 ("float8_e4m3fn") compiles the fp8
    configs with row-wise scales and a bf16 output, as the dense fp8 rungs' specs do. `glu`: the
    fused SwiGLU configs instead (16-bit only: none for fp8)."""
    if unsupported_reason(capability) or dtype not in (*_POINTER_TYPES, FP8) or (glu and dtype == FP8):
        return []
    major = capability[0]
    if glu:
        configs = (GLU_CONFIGS[major], GLU_WIDE_CONFIGS[major])
    elif dtype == FP8:
        configs = (FP8_CONFIGS[major], FP8_WIDE_CONFIGS[major])
    else:
        configs = (CONFIGS[major], WIDE_CONFIGS[major])
    return [
        spec_of(
            grouped_kernel, cfg, constexprs(cfg, capability, MAX_EXPERTS, 2 if dtype == FP8 else 0), dtype
        )
        for cfg in configs
    ]


def spec_of(
    kernel, cfg: GroupedConfig, values: dict[str, object], dtype: str, mode: str = "grouped"
) -> CompileSpec:
    """The compile spec of a grouped kernel (this module's arguments, `compile_specs`; the
    tcgen05 and swap-AB kernels' too, whose descriptors have names of their own) with the
    constexprs `values` (SCALING 2 for fp8 operands, 0 otherwise) and MAX_EXPERTS' table, for the
    registry's `mode`."""
    fp8 = dtype == FP8
    scales = dict.fromkeys(("scale_x", "scale_w"), "*fp32" if fp8 else "constexpr")
    x_desc, w_desc = kernel.arg_names[:2]
    signature = (
        {
            x_desc: desc_signature([cfg.BLOCK_M, cfg.BLOCK_K], dtype),
            w_desc: desc_signature([cfg.out_n, cfg.BLOCK_K], dtype),
            "out": _POINTER_TYPES[FP8_OUT if fp8 else dtype],
            "offs": "*i32",
        }
        | scales
        | {"S": "i32", "N": "i32", "E": "i32"}
        | dict.fromkeys(values, "constexpr")
    )
    if not fp8:  # no scales: None constexprs, as the 16-bit launch passes them
        values = dict.fromkeys(scales) | values
    return CompileSpec(
        mode,
        f"{kernel.__name__} {cfg.label} E<={values['EXPERTS_PAD']} B=t" + (" scales=row" if fp8 else ""),
        kernel,
        signature,
        values,
        {"num_warps": cfg.num_warps},
        config=cfg,
        divisible=("out", "offs", *(scales if fp8 else ())),
    )
