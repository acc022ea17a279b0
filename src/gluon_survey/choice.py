"""Which mode and config `matmul(kernel=None)` runs for a shape: a table of measured results per
GPU, committed in the package (`gluon_survey/tables/*.json`, written by `gluon-survey tune`), or a
documented rule for weights the table has never seen. A user's call never measures anything:
`choose` is a dictionary lookup.

**The table.** Each entry is one measured shape (M, N, K, dtype, B layout, and `a_layout` "t"
where A is the transpose view of a [K, M] matrix, as in a weight's gradient grad^T @ x; an entry
without `a_layout` is A row) with the candidate that was fastest and correct there (`mode`,
`config`: a label from the mode's `candidates`), the time of every candidate and of cuBLAS
(`candidates`, keyed "mode label"). A weight (N, K, dtype, B layout, A layout) with entries is
answered from them alone, and never beyond what they measured (an A-t product never from A-row
entries, nor the reverse):
- at a measured M: that entry's choice (a Gluon candidate only where it beat cuBLAS by MARGIN);
- between two adjacent measured M (lo < M < hi) at most MAX_GAP apart: a Gluon candidate only
  where it held at both, i.e. beat that entry's cuBLAS time by MARGIN at lo and at hi; of several,
  the best worse-of-the-two ratio to cuBLAS (then the better other ratio, then the label);
  otherwise cuBLAS. The winners at lo and hi need not be it: each was measured at its own M only;
- between two measured M further apart than MAX_GAP: cuBLAS (a crossover can hide in between);
- below the smallest or above the largest measured M: cuBLAS (no extrapolation).
An entry confirmed by `gluon-survey tune --confirm` carries `paired`: each candidate that beat
cuBLAS in tune's short separate timings, re-timed against cuBLAS in alternating windows on the
same inputs (the driver's paired method); then only those with a paired ratio of at least
1 + MARGIN count as having beaten it, at that M and as neighbours. (cuBLAS's per-call time on the
4096- and 6144-wide weights moved by up to 45 % between two separate timings of the same cell,
which made unpaired wins there up to 0.85x in the paired sweep: docs/perf-notes.md, entry 55.)
A confirmation also times each candidate that held per call in GPU time, the host kept ahead
(`paired_gpu`), and it holds only where it is not slower than cuBLAS there either
(GPU_TIME_FLOOR): a kernel that wins a lone call by its cheaper launch but loses kernel-only would
be slower in a CUDA graph or any step whose stream runs ahead of the GPU. Entries confirmed before
that have no `paired_gpu` and count as before; `explain` says "GPU time not compared" for them.
So where a Gluon kernel runs comes from measured crossovers, and a denser M grid
(`gluon-survey tune --shapes llm-dense`) narrows the gaps. `explain` prints the neighbours and
their numbers.

**The rule**, for a weight without entries (or a GPU without a table), whatever A's layout (`matmul`
reads a transposed A in place where the mode can, and copies it otherwise): on sm_90 and sm_100, one
token and a K-major weight (`w.t()`): `gemv` (the weight streamed a row a program, CUDA-core
FMAs); M <= 16: `swapab`'s whole-K tile (`swapab.whole_k`: 64 weight rows a program over all of
K, the tokens the MMA's narrow side, no partials) for a K-major weight whose 64-row tiles fit one
wave on the GPU's SMs, `slab` (mma.sync's 16-row slabs of the weight, no K split) for a wider one
and for a row-major one; above: cuBLAS (`torch`). Each threshold is measured (the constants below
give the counts): the H100 table across its weights, the `holdout` preset on weights the table was
not tuned on (results/h100-holdout, results/h100-holdout-wholek, results/h200-few-token-rule) and
the H200's dense sweeps: no Gluon kernel beat cuBLAS by MARGIN across weights at any M above 16.

fp8 (dtype "fp8", per-tensor scales, or "fp8-row"; a table's fp8 entries, which `tune --dtype
fp8,fp8-row` measures, answer for their weights as 16-bit ones do; the H100 table has none yet):
with per-tensor scales `warpspec` from M = 2049 (its ping-pong tile of 192 or 128 rows by the waves
each leaves on the GPU, `warpspec.fp8_config`), on sm_90 where at least FP8_MIN_FILL of the
work of that tile's waves lands in C (cuBLAS fp8 where the last wave, or the rows of the last tile
row past M, leave more of it idle), and
not in a band of M around 5000 on a weight with K > 4096 (FP8_BAND_M, each GPU's own: cuBLAS fp8
won at 5000 and warpspec at the nearest M measured on each side), and on sm_90 not where K is more
than FP8_MAX_K_PER_N times N (cuBLAS fp8 was the faster at its own clock there);
with row-wise scales cuBLAS's row-wise fp8 there; at M = 1 with K <= 16384, `gemv` (the
weight streamed in one chunk a row, CUDA-core FMAs); swapab's whole-K tile (one 64-row tile per
program over all of K) with row-wise scales at M <= 64 and with per-tensor scales at M <= 16, on its
shared ring (two programs an SM) where the weight has more 64-row tiles than the GPU has SMs, but at
most four times as many (at 33-64 tokens there a tile of 128 weight rows, one program an SM,
instead), and at M <= 16 walked by persistent programs, one a ring slot, where its tiles overflow
the slots; cuBLAS fp8 otherwise (warpspec lost to it at M = 1024 on the H100, and the whole-K tile at
M = 64 with per-tensor scales).

Other GPUs: cuBLAS (`torch`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

TABLES = Path(__file__).resolve().parent / "tables"
# A Gluon candidate runs instead of cuBLAS only where it measured this much faster (`gluon-survey
# tune` picks an entry's winner with it, `choose` a candidate between two entries): tune's short
# timing ranks near-ties by noise (a 1.00x tie picked at 16x4096x4096 fp16 measured 0.85x in the
# survey's paired run: docs/perf-notes.md entry 20).
MARGIN = 0.03
CUBLAS = "torch cuBLAS"  # cuBLAS's key in an entry's `candidates`
# Two measured M further apart than this say nothing about the M between them: persistent held at
# M = 1024 (1.08x) and 8192 (1.03x) on the 4096 x 14336 bf16 weight and ran 0.76x cuBLAS at
# M = 1536 (results/h100-offgrid-auto). The dense grid (`--shapes llm-dense`) steps by 2x or less.
MAX_GAP = 4
# A Gluon candidate that wins per call must not lose in GPU time: where the stream runs ahead of
# the GPU (CUDA graphs, torch.compile, a GPU-bound step) only the kernel's time counts. At M = 128
# on the 4096- and 6144-wide weights the table's per-call winners (1.05-1.58x, paired) took
# 0.62-0.83x cuBLAS's kernel time (results/h100-bias-probe; docs/perf-notes.md, entry 65): cuBLAS's
# per-call time there is mostly torch.mm's launch latency. `tune --confirm` times each candidate
# that held per call against cuBLAS in GPU time too (`paired_gpu`), and it holds only at or above
# this ratio.
GPU_TIME_FLOOR = 1.0
# fp8: warpspec measured 1.01-1.03x cuBLAS fp8 at M = 8192 and 0.87-0.88x at M = 1024 over the
# llm shapes (results/h100-fp8-llm). So the rule keeps cuBLAS fp8 up to this M and runs warpspec
# above it, with per-tensor scales only: against torch's row-wise fp8 kernel (5-10 % faster than
# its per-tensor one at large M) warpspec with row-wise scales only tied above M = 2048, geomean
# 0.999-1.015x in three H100 runs and 0.993x on the H200 over 48 cells each, down to 0.953-0.954x
# (results/h100-dense-sweep, results/h200-dense-sweep; docs/perf-notes.md, entry 75). On the H200
# per-tensor warpspec led at 1280-1792 tokens on nine of eleven weights but lost 5-8 % on 22016 x
# 4096 (results/experiments/h200-fp8-mid; entry 91), so the line stays here.
FP8_GLUON_FROM_M = 2048
# ... where at least this share of the MMA work of warpspec's fp8 tile (`warpspec.fp8_config`) over
# its waves lands in C (`warpspec.fp8_useful_fill`). The share counts the SM slots the last wave
# leaves idle and the rows of the last tile row past M. Off the dense grid (results/h100-fp8-offgrid)
# the two per-tensor cells that left the fourth of four waves 39 % full (3000 x 3584 x 3584 and x
# 18944) ran 0.913x and 0.846x cuBLAS fp8. A first guard counted tiles only (a share of 0.9 of the
# slots), and M = 8 past a multiple of 1024 got through it: at 2056 and 3080 tokens a last tile
# row of 8 rows cost warpspec 6-8 % of its rate while cuBLAS fp8 held its own, and 8 of the 27
# cells there that it let through ran 0.867-0.951x on the H200 (results/experiments/
# h200-fp8-m-alignment). A line at 0.92, set on the H200's 305 per-tensor warpspec cells above M =
# 2048 outside its band (17 of the 18 below 0.90 read below 0.97x), still let five of 180 cells at
# new token counts through at shares of 0.921-0.943 (0.941-0.968x; results/experiments/
# h200-fp8-fill-judge). This line, 0.945, was then judged on 14 weights and 19 token counts none of
# those runs had measured, warpspec forced at shares of 0.90-0.975 (results/experiments/
# h200-fp8-line-judge): the 115 cells from 0.945 up read 1.056x, lowest 0.976x; the 33 at
# 0.92-0.945 read 1.003x, 6 below 0.97x (lowest 0.933x) and 5 at 1.03x or more. A waste of 6-8 %
# is more than warpspec's lead on the K-heavy weights (1.04-1.07x at full waves). cuBLAS fp8 does
# not pay it: its tiles are multiples of 8 tokens high (256 x 152 at 4996 and 5000 tokens: 1056
# tiles fill 8 waves exactly on 8192 x 28672), where a Gluon tensor's shape is a power of two. No
# cell of the dense grid or of the holdout weights falls between the two lines (docs/perf-notes.md,
# entries 94 and 95).
FP8_MIN_FILL = 0.945
# ... and outside a band of M on a weight with K above FP8_BAND_K, the band each GPU's own
# measurements leave open. At M = 5000 warpspec ran 0.931-1.003x cuBLAS fp8 on 11 of the 12 such
# weights of the llm and holdout presets on the H200 (7168 x 5120: 1.059x) and 0.917-1.008x on the
# H100's five (results/h200-dense-auto, results/experiments/h200-fp8-holdout-above,
# results/h100-fp8-offgrid; docs/perf-notes.md, entries 84 and 92), where cuBLAS fp8 ran faster than
# at 4096 on them. Its nearest measured neighbours on each side, where it held on every such weight
# the guard above lets through: on the H200 M = 4608 and 5504 (1.000-1.158x on the twelve,
# results/experiments/h200-fp8-band; entry 93), on the H100 M = 4096 (1.023-1.127x on the five of
# the llm preset and seven others, results/h100-dense-sweep/fp8-94122fb, results/h100-fp8-offgrid)
# and 6000 (0.998-1.085x on the seven; 1.020-1.086x at 6144 on the five). Between them neither
# neighbour vouches for warpspec, and cuBLAS fp8 runs; a GPU with no measurements of its own takes
# the widest band, between the dense grid's M = 4096 and 6144. The first key found in the GPU's
# name picks its band; the weights with K <= 4096 held 1.003-1.166x at 5000.
FP8_BAND_M = {"NVIDIA H200": (4608, 5504), "NVIDIA H100": (4096, 6000), "": (4096, 6144)}  # exclusive
FP8_BAND_K = 4096  # above
# ... and, on sm_90, only where K is at most this many times N. On weights whose K is several times
# N both kernels are MMA-bound for most of each tile, and at its own clock warpspec is the slower.
# Kernel-only, it read 0.936x cuBLAS fp8 on four such weights at 2345-13000 tokens (0.858-1.023x,
# K = 2.9-8 N) and 0.957x on 8192 x 28672 and 4096 x 14336 (results/experiments/h200-fp8-deepk).
# With each window settled by 200 ms of its own calls on the latter two, it read 0.953-1.024x at
# 3072-16384 tokens. Weights with K <= N read 0.958-1.063x there (results/experiments/
# h200-fp8-power). Its per-call leads on them (1.00-1.07x) came from bare alternating windows, which
# favour the kernel that draws more power. The weights measured have K <= N or K >= 2.5 N, and the
# line sits between those.
FP8_MAX_K_PER_N = 2.0
# fp8 at M = 1, 16, 64 over the llm weights, kernel-only (results/h100-fp8-wholek): swapab's
# whole-K tile ran 1.00-1.76x cuBLAS fp8's speed with row-wise scales at all 24 shapes (split
# swapab, the rule before: 1.03-1.60x at M <= 16 only); with per-tensor scales 1.00-1.10x at M <= 16
# on 14 of the 16 (0.97-0.98x on 10240 x 8192) and 0.93-1.04x at M = 64. Up to these M, the rule
# runs it.
FP8_WHOLE_K_M = {"fp8-row": 64, "fp8": 16}  # at most
# ... and on its shared ring (two programs an SM, swapab.WHOLE_K_SHARED) where the weight has more
# 64-row tiles than the GPU has SMs, up to this many waves of them. Kernel-only on the H100
# (docs/perf-notes.md, entry 28): 1-5 % faster than the one-program-per-SM ring at 160 and 448
# tiles (10240 x 8192, 28672 x 4096), 0.4-3.5 % slower at 896 (57344 x 8192). At 64 tokens the
# tile of 128 weight rows (swapab.WHOLE_K_TALL, one program an SM) runs there instead: 1-4 %
# faster than the shared ring with row-wise scales at M = 64 (entry 37).
FP8_SHARED_WAVES = 4
# ... walked by persistent programs, one a slot of that ring (swapab.PERSISTENT_RINGS), where its
# tiles overflow the slots (more than a wave: 896 tiles at 57344 x 8192 on the one ring, 448 at
# 28672 x 4096 on the shared one), so that each program starts once and its ring runs on across
# tiles. Kernel-only on the H200 at 1-16 tokens (results/experiments/h200-fp8-persistent;
# docs/perf-notes.md, entry 90): 0.6-3.8 µs faster there in both scalings; at or under a wave
# (160 and 128 tiles) the persistent walk bought nothing, so the rule keeps it to overflowing
# weights, and to the 16-token tile it was measured with.
FP8_PERSISTENT_M = 16  # at most
# fp8 at M = 1, kernel-only (docs/perf-notes.md, entry 36; results/experiments/h100-gemv/fp8):
# gemv in one chunk ran 0.89-0.97x the whole-K tile's time on the seven weights with K <= 16384
# in both scalings, 1.01-1.02x at 8192 x 28672 (a row of 28672 on 32 warps).
FP8_GEMV_M = 1  # at most
FP8_GEMV_MAX_K = 16384
# fp16/bf16: where the H100 table (tables/h100.json: the llm preset's 8 weights, GPU time a call,
# every candidate against cuBLAS) puts each M, per dtype:
# - M = 1: gemv on all 8 weights, 1.07-1.22x cuBLAS (the one-chunk row where K <= 16384); on the
#   holdout weights, outside the table, 1.11-1.62x (results/h100-holdout). With a row-major B (a
#   [K, N] weight, never in the table) gemv measured 0.09-0.95x cuBLAS at M = 1 on the holdout
#   weights, slab 0.87-1.15x (results/h100-holdout-row-m1). So only a K-major weight takes gemv.
GEMV_M = 1  # at most
# - M = 4 and 16: slab or swapab's whole-K tile on 6 of the 8 (1.03-1.11x); cuBLAS on 8192 x
#   8192 and 28672 x 4096, where slab measured 0.99-1.03x, inside MARGIN. For a weight without
#   entries the rule runs the one candidate that never lost to cuBLAS there: swapab's whole-K tile
#   of 16 tokens (`swapab.whole_k`, W64xT16x256), per call 1.001-1.10x cuBLAS over the table's 32
#   entries at M = 4 and 16 (geomean 1.047x), where the 32-row slab, the rule before, ran
#   0.985-1.08x (1.027x); on the H200 (results/experiments/h200-slab-tiles, 26 cells at M = 2-16)
#   0.996-1.22x (1.060x) against the slab's 0.931-1.15x, which lost on 8192 x 8192, a weight cuBLAS
#   streams there at 3.7 TB/s. Judged on the H100's held-out weights (results/h100-holdout-wholek,
#   16 weights at M = 3, 8 and 16 in fp16 and bf16, paired): 1.266x cuBLAS, lowest 1.012x, against
#   the slab's 1.231x, lowest 0.963x, in the same run (docs/perf-notes.md, entry 75).
WHOLE_K_M = 16  # at most
# ... where its programs fit one wave: at most one 64-row tile an SM (ceil(N / 64) <= the GPU's SM
# count; the SM count unknown, it runs). Beyond that it runs its tiles in waves of one program an
# SM, and the 32-row slab's many small programs balance better: on the H200 the whole-K tile took
# 48.3 us on 10240 x 8192 (160 tiles) against the slab's 42.8-44.2 and ran 0.956-0.964x cuBLAS on
# 28672 x 4096 (448 tiles) at M = 2-16, where the slab held (results/h200-dense-sweep, bf16 and
# bf16-wholek), while on 8192 x 8192 (128 tiles) the slab lost (0.93-0.95x) and the whole-K tile
# matched cuBLAS. On the H100's held-out weights (results/h100-holdout-wholek, both in one run) the
# wave line picks the faster-or-equal of the two on the whole: 1.248x / 1.284x cuBLAS (fp16 / bf16),
# lowest 1.016x, against the whole-K tile everywhere 1.245x / 1.283x (lowest 1.012x) and the slab
# everywhere 1.247x / 1.215x (lowest 0.963x). Judged on the H200 (results/h200-few-token-rule, the
# llm weights at M = 2-16 with 5, 10 and 13 off the grid, and the 16 holdout weights at M = 3, 8,
# 12, 16): 1.153x / 1.136x and 1.295x / 1.318x cuBLAS, the whole-K tile's cells lowest 0.979x, the
# slab's 0.947x (three bf16 cells below 0.97x, its 16-token tile at 10-12 tokens on 28672 x 4096 and
# 27648 x 5120, 2-5 % slower than at 16; docs/perf-notes.md, entry 76). A row-major weight keeps
# the slab: the whole-K tile was never timed on one.
# - Above 16 the rule runs cuBLAS: no Gluon kernel beat it by MARGIN across weights at any M there.
#   M = 64: cuBLAS on 5 of the 8 (the Gluon modes' own configs 0.60-1.02x, the whole-K tile
#   0.94-1.06x); M = 128: cuBLAS on 7-8 of 8; M = 1024: cuBLAS on 4-7 of 8 (warpspec's
#   cooperative tile 0.88-1.12x in bf16); M = 8192: a Gluon rung on 4-5 of 8 (warpspec's
#   cooperative tile 0.92-1.11x in bf16). On the holdout weights warpspec, the rule's choice above
#   M = 2048 before, measured 0.90-1.07x cuBLAS at M = 4096 (geomean 1.01x in fp16, 1.00x in
#   bf16), beating it by MARGIN on 13 of the 32 cells (results/h100-holdout).


@dataclass(frozen=True)
class Choice:
    mode: str
    config: str | None  # a label of the mode's `candidates(capability)`; None: the mode's own choice
    why: str  # one line for `explain`


def table_for(gpu_name: str) -> dict | None:
    """The committed table whose `match` is a substring of the GPU's name, or None."""
    for table in _tables():
        if table["match"].lower() in gpu_name.lower():
            return table
    return None


@functools.cache
def _tables() -> tuple[dict, ...]:
    return tuple(json.loads(p.read_text()) for p in sorted(TABLES.glob("*.json")))


def rule(
    M: int,
    capability: tuple[int, int],
    dtype: str = "fp16",
    N: int = 0,
    sm_count: int = 0,
    K: int = 0,
    layout: str = "t",
    gpu_name: str = "",
) -> Choice:
    """The documented choice without a measured entry (module docstring); N and the GPU's SM count
    pick the fp8 whole-K tile's ring (0: unknown, the one-program-per-SM ring) and which 16-bit
    few-token kernel runs (0: unknown, the whole-K tile); K whether fp8 gemv takes a one-token
    product and whether per-tensor fp8 falls in the GPU's FP8_BAND_M band (0: unknown, neither); the
    B layout whether a 16-bit one-token product takes gemv; the GPU's name which band."""
    if dtype.startswith("fp8") and capability[0] in (9, 10):
        if M > FP8_GLUON_FROM_M and dtype == "fp8":
            from .kernels.warpspec import fp8_useful_fill

            gpu = next(key for key in FP8_BAND_M if key in gpu_name)
            lo, hi = FP8_BAND_M[gpu]
            if lo < M < hi and K > FP8_BAND_K:
                return Choice(
                    "torch",
                    None,
                    f"rule: fp8 with {lo} < M < {hi} and K > {FP8_BAND_K}: warpspec held at M = {lo} "
                    f"and {hi} on the {gpu or 'H100 and H200'} but lost between them: cuBLAS fp8",
                )
            if capability[0] == 9 and N > 0 and K > FP8_MAX_K_PER_N * N:
                return Choice(
                    "torch",
                    None,
                    f"rule: fp8 with M > {FP8_GLUON_FROM_M} and K > {FP8_MAX_K_PER_N:g} N: warpspec is "
                    "the slower at its own clock where K is several times N: cuBLAS fp8",
                )
            hopper = capability[0] == 9 and N > 0 and sm_count > 0  # the sm_90 tile's waves
            used = fp8_useful_fill(M, N, sm_count) if hopper else 1.0
            if used < FP8_MIN_FILL:
                return Choice(
                    "torch",
                    None,
                    f"rule: fp8 with M > {FP8_GLUON_FROM_M}, but only {used:.1%} of the work of warpspec's "
                    f"tile waves lands in C (< {FP8_MIN_FILL:.1%}): cuBLAS fp8",
                )
            return Choice(
                "warpspec", None, f"rule: fp8 with M > {FP8_GLUON_FROM_M}: the warp-specialized rung"
            )
        if FP8_GEMV_M >= M and 0 < K <= FP8_GEMV_MAX_K:
            return Choice(
                "gemv",
                None,
                f"rule: fp8, M = 1 and K <= {FP8_GEMV_MAX_K}: gemv streams the weight in one chunk a row",
            )
        most = FP8_WHOLE_K_M.get(dtype, 0)
        if most >= M:
            from .kernels.swapab import PERSISTENT_RINGS, WHOLE_K_TALL, whole_k

            tile = whole_k(capability, M, fp8=True)
            tiles = -(-N // tile.BLOCK_M)  # the whole-K tile's programs
            ring, why = "one", ""
            if sm_count > 0 and sm_count < tiles <= FP8_SHARED_WAVES * sm_count:
                if tile.BLOCK_N in WHOLE_K_TALL:
                    ring, why = "tall", f", 128 weight rows a tile ({tiles} 64-row tiles on {sm_count} SMs)"
                else:
                    ring, why = "shared", f", two programs an SM ({tiles} tiles on {sm_count} SMs)"
            slots = sm_count * whole_k(capability, M, fp8=True, ring=ring).blocks_per_sm()
            persistent = ring in PERSISTENT_RINGS and M <= FP8_PERSISTENT_M and 0 < slots < tiles
            if persistent:
                why += f", walked by {slots} persistent programs ({tiles} tiles: more than a wave)"
            return Choice(
                "swapab",
                whole_k(capability, M, fp8=True, ring=ring, persistent=persistent).label,
                f"rule: {dtype}, M <= {most}: swap-AB's whole-K tile streams the weight faster than "
                f"cuBLAS fp8{why}",
            )
        if M > FP8_GLUON_FROM_M:
            why = f"rule: {dtype} with M > {FP8_GLUON_FROM_M}: cuBLAS's row-wise fp8 (warpspec only tied it)"
            return Choice("torch", None, why)
        return Choice("torch", None, f"rule: {dtype} with M <= {FP8_GLUON_FROM_M}: cuBLAS fp8")
    if capability[0] not in (9, 10):
        return Choice("torch", None, f"rule: no Gluon rung runs on sm_{capability[0]}{capability[1]}")
    if M <= GEMV_M and layout == "t":
        return Choice("gemv", None, "rule: one token, a K-major weight: gemv streams it a row a program")
    if M <= WHOLE_K_M:
        from .kernels.swapab import whole_k

        tile = whole_k(capability, M)
        tiles = -(-N // tile.BLOCK_M)  # the whole-K tile's programs, one an SM
        if layout != "t" or 0 < sm_count < tiles:
            where = "a row-major weight" if layout != "t" else f"{tiles} 64-row tiles on {sm_count} SMs"
            why = f"rule: M <= {WHOLE_K_M}, {where}: mma.sync's 16-row slabs stream the weight unsplit"
            return Choice("slab", None, why)
        return Choice(
            "swapab",
            tile.label,
            f"rule: M <= {WHOLE_K_M}, a K-major weight in one wave: swap-AB's whole-K tile streams 64 "
            "weight rows a program over all of K",
        )
    return Choice(
        "torch",
        None,
        f"rule: M > {WHOLE_K_M}: cuBLAS (no Gluon kernel beat it by {MARGIN * 100:g} % across weights there)",
    )


def _entries(
    table: dict | None, N: int, K: int, dtype: str, layout: str, a_layout: str = "row"
) -> dict[int, dict]:
    """The table's entries for this weight and layouts, by M (a later entry of the same M wins, as
    tune's merge keeps one); an entry without `a_layout` is A row."""
    return {
        e["M"]: e
        for e in (table or {}).get("entries", ())
        if (e["N"], e["K"], e["dtype"], e["b_layout"], e.get("a_layout", "row"))
        == (N, K, dtype, layout, a_layout)
    }


def _measured(entry: dict) -> dict[str, float]:
    """The Gluon candidates of an entry that ran correctly there: key ("mode label") -> its speed
    relative to cuBLAS: the paired ratio where `tune --confirm` measured one (`paired`), else the
    entry's cuBLAS time over the candidate's."""
    ratios = {key: entry["cublas_ms"] / t for key, t in _times(entry).items()}
    return ratios | entry.get("paired", {})


def _held(entry: dict) -> set[str]:
    """The Gluon candidates of an entry that beat cuBLAS by MARGIN, as tune picks a winner: for a
    confirmed entry (`paired`), those whose paired ratio is at least 1 + MARGIN (the others did not
    hold when timed against cuBLAS in alternating windows), and where the confirmation also timed
    GPU time (`paired_gpu`), whose GPU-time ratio is at least GPU_TIME_FLOOR; else
    t * (1 + MARGIN) <= cuBLAS."""
    if "paired" in entry:
        held = {key for key, r in entry["paired"].items() if r >= 1 + MARGIN}
        if "paired_gpu" in entry:
            held = {key for key in held if entry["paired_gpu"].get(key, 0.0) >= GPU_TIME_FLOOR}
        return held
    return {key for key, t in _times(entry).items() if t * (1 + MARGIN) <= entry["cublas_ms"]}


def _times(entry: dict) -> dict[str, float]:
    """The measured times of an entry's Gluon candidates (a failed one's is a message: left out)."""
    return {
        key: t
        for key, t in entry.get("candidates", {}).items()
        if key != CUBLAS and isinstance(t, int | float) and t > 0
    }


def _mode_config(key: str) -> tuple[str, str | None]:
    """A `candidates` key split at its first space: (mode, config label); cuBLAS: ("torch", None)."""
    mode, _, label = key.partition(" ")
    return (mode, None) if key == CUBLAS else (mode, label)


def _neighbour(entry: dict) -> str:
    """One measured neighbour for `explain`: its M, cuBLAS's time and its fastest Gluon candidate."""
    text = f"M={entry['M']} (cuBLAS {entry['cublas_ms'] * 1e3:.1f} us"
    ratios = _measured(entry)
    if ratios:
        key = max(ratios, key=lambda k: (ratios[k], k))
        text += f"; {key} {ratios[key]:.2f}x"
    return text + ")"


def _between(lo: dict, hi: dict) -> tuple[str, str]:
    """The candidate key that held at both neighbours (module docstring), or cuBLAS; and why."""
    at_lo, at_hi = _measured(lo), _measured(hi)
    held = _held(lo) & _held(hi)
    span = f"between {_neighbour(lo)} and {_neighbour(hi)}"
    if not held:
        return CUBLAS, f"{span}: no candidate beat cuBLAS by {MARGIN * 100:g} % at both: cuBLAS"
    # the best worse-of-the-two ratio, then the better other ratio, then the label
    key = min(held, key=lambda k: (-min(at_lo[k], at_hi[k]), -max(at_lo[k], at_hi[k]), k))
    return key, (
        f"{span}: {key} held at both ({at_lo[key]:.2f}x at M={lo['M']}, {at_hi[key]:.2f}x at M={hi['M']})"
    )


def _at(entry: dict) -> str:
    """Why a measured M gets its entry's choice."""
    where = f"measured at M={entry['M']}"
    if entry["mode"] == "torch":
        ratios = _measured(entry)
        if not ratios:
            return f"{where}: cuBLAS {entry['cublas_ms'] * 1e3:.1f} us, no Gluon candidate ran"
        key = max(ratios, key=lambda k: (ratios[k], k))
        gpu = entry.get("paired_gpu", {}).get(key)
        if ratios[key] >= 1 + MARGIN and gpu is not None and gpu < GPU_TIME_FLOOR:
            return (
                f"{where}: cuBLAS {entry['cublas_ms'] * 1e3:.1f} us; the fastest Gluon candidate, {key}, "
                f"{ratios[key]:.2f}x per call but {gpu:.2f}x in GPU time: slower where the GPU runs behind"
            )
        return (
            f"{where}: cuBLAS {entry['cublas_ms'] * 1e3:.1f} us; the fastest Gluon candidate, {key}, "
            f"{ratios[key]:.2f}x: not {MARGIN * 100:g} % faster"
        )
    ratio = entry["cublas_ms"] / entry["ms"]
    text = (
        f"{where}: {entry['mode']} {entry['config'] or ''} {entry['ms'] * 1e3:.1f} us, {ratio:.2f}x cuBLAS "
        f"({entry['cublas_ms'] * 1e3:.1f} us)"
    )
    key = f"{entry['mode']} {entry['config']}"
    text += f", {entry['paired'][key]:.2f}x paired" if key in entry.get("paired", {}) else ""
    gpu = entry.get("paired_gpu", {}).get(key)
    return text + (f", {gpu:.2f}x in GPU time" if gpu is not None else ", GPU time not compared")


def choose(
    M: int,
    N: int,
    K: int,
    dtype: str,
    layout: str,
    capability: tuple[int, int],
    gpu_name: str,
    sm_count: int = 0,
    a_layout: str = "row",
) -> Choice:
    """The mode and config for this shape on this GPU (module docstring); `sm_count` for the rule;
    `layout` is B's layout, `a_layout` A's (`launch.a_layout`): a product with A "t" is answered
    from the entries measured with A "t" only, and the `why` names the layout pair."""
    table = table_for(gpu_name)
    entries = _entries(table, N, K, dtype, layout, a_layout)
    pair = "" if a_layout == "row" else f" (A {a_layout}, B {layout})"
    if entries:
        name = f"table {table['name']}{pair}"
        ms = sorted(entries)
        if M in entries:
            entry = entries[M]
            return Choice(entry["mode"], entry["config"], f"{name}: {_at(entry)}")
        if ms[0] > M:
            why = f"below the table's smallest measured M={ms[0]} for this weight: cuBLAS (no extrapolation)"
            return Choice("torch", None, f"{name}: {why}")
        if ms[-1] < M:
            why = f"beyond the table's largest measured M={ms[-1]} for this weight: cuBLAS (no extrapolation)"
            return Choice("torch", None, f"{name}: {why}")
        hi = next(m for m in ms if m > M)
        lo = ms[ms.index(hi) - 1]
        if hi > MAX_GAP * lo:
            why = (
                f"between M={lo} and M={hi}, more than {MAX_GAP}x apart: cuBLAS (a crossover can hide there)"
            )
            return Choice("torch", None, f"{name}: {why}")
        key, why = _between(entries[lo], entries[hi])
        return Choice(*_mode_config(key), f"{name}: {why}")
    choice = rule(M, capability, dtype, N, sm_count, K, layout, gpu_name)
    if table is None:
        return Choice(choice.mode, choice.config, f"{choice.why} (no table for {gpu_name})")
    why = f"{choice.why} (table {table['name']} has no entry for this weight{pair})"
    return Choice(choice.mode, choice.config, why)
