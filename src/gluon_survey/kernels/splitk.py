"""Rung splitk: Pipelined + split-K, for GEMMs whose output has too few tiles to fill the GPU.

The idea: at small M (a language model's decode step: M = 1 to a few hundred tokens) the output
C [M, N] is a handful of tiles while K is deep, so one program per tile leaves most SMs idle and
the weight streams through the few that work. Cut each tile's K loop into SPLIT_K slices computed
by different programs: SPLIT_K times more programs stream the same bytes. Each program runs
Pipelined's ring over its slice and ends with an fp32 partial tile; the partials are summed in
the same launch:

* every program writes its partial to a slot of its own in an fp32 workspace and then arrives on
  the tile's counter (an atomic add with acquire-release semantics at GPU scope, after a CTA
  barrier, so the whole partial is visible before the arrival);
* the program whose arrival completes the count adds the other partials to its own, in split
  order (the sum does not depend on who arrives last), writes C and resets the counter to 0, so
  the workspace needs no clearing between launches and the launch can be replayed in a CUDA graph.

Tiles are 64 rows tall (the smallest wgmma M) so that a decode step wastes the least tensor work,
and the host picks SPLIT_K so that the programs fill the GPU (`split_for`); the floor of these
shapes is the weight's bytes over the memory bandwidth (docs/perf-notes.md, entry 19).

fp8 (e4m3) operands take 128-wide K steps (a stage holds the same bytes) and both K-major (B the
transpose view of an [N, K] weight); the partials stay unscaled fp32, and the dequantization
scales multiply the summed tile once, right before C is stored (`store_sum`).

A bias (HAS_BIAS) is added to the summed tile too, after the scales (`store_sum`): never to a
partial, so it is added once whatever SPLIT_K is.

With `GLUON_SURVEY_PDL=1` (`plan.PDL`) this launch (and swapab's, which is this one) starts its
kernel as a programmatic dependent: Pipelined's ring waits for the kernel before it at its top
(`ring_mma`), so a call of ours can start while the one before it drains. Off by default: the
survey's timer cannot see it, and it lost at one shape (docs/perf-notes.md, entry 90).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .. import memory
from ..compat import cta_barrier
from ..launch import (
    B_LAYOUTS,
    CompileSpec,
    Launch,
    Scales,
    Target,
    a_layout,
    b_layout,
    is_a_kmajor,
    is_kmajor,
)
from .arch import select_mma, unsupported_reason
from .common import GemmConfig, add_bias, grouped_tile, scale_tile, store_tile, tma
from .pipelined import operands, ring_mma
from .plan import (
    FP8,
    FP8_OUT,
    PDL,
    Launcher,
    Plan,
    bias_table,
    block_shapes,
    check_a_layout,
    check_config_kind,
    desc_signature,
    make_descriptors,
    reads_transposed_a,
    scaling_code,
    templates_of,
)


@dataclass(frozen=True)
class SplitKConfig(GemmConfig):
    """A Pipelined tile and ring; SPLIT_K slices of K per tile (0: chosen per shape by `split_for`)."""

    SPLIT_K: int = 0
    MIN_STEPS: int = 4  # the fewest K steps a slice may have (a ring needs some depth to fill)

    @property
    def label(self) -> str:
        return f"{super().label} k{self.SPLIT_K or 'auto'}"

    def table(self) -> dict[str, object]:
        return super().table() | {"split_k": self.SPLIT_K or "auto"}


def split_for(tiles: int, k_steps: int, slots: int, min_steps: int) -> int:
    """How many K slices per tile: as many as fill the GPU's `slots` (SMs x programs per SM) in
    one wave without a partial second one (a wave 18 % full cost the first version a quarter of
    its time: perf-notes entry 20), each slice at least `min_steps` K steps long; then the fewest
    slices that keep the slice length, so that no slice is empty."""
    if tiles >= slots:
        return 1
    split = max(1, min(slots // tiles, k_steps // min_steps))
    steps = -(-k_steps // split)
    return -(-k_steps // steps)


# Hopper: 64-row tiles (one warpgroup's wgmma), 128 columns, 4 warps; 4 stages of 24 KB, so two
# programs share an SM (finer waves, and each one's reduction hides behind the other's loads).
CONFIGS = {
    9: SplitKConfig(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, STAGES=4, num_warps=4, GROUP_M=8),
    # Blackwell: tcgen05's smallest M is 64 as well (a 64-lane TMEM block).
    10: SplitKConfig(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, STAGES=4, num_warps=4, GROUP_M=8),
}


# More tiles `tune` times on Hopper for the token counts between decode and large prefill (M = 24 to
# 4096), where a 64x128 tile reads each operand from L2 too often (A once per 128 weight columns,
# the weight once per 64 tokens) and a 128x256 tile leaves the GPU part-empty without a K split:
# 128x128 and 128x256 tiles on two warpgroups, 64x256 on one; each a program an SM, split so that
# the programs fill the GPU (docs/perf-notes.md, entry 55).
MID_M = {
    9: (
        SplitKConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=4, num_warps=8, GROUP_M=8),
        SplitKConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, STAGES=3, num_warps=8, GROUP_M=8),
        SplitKConfig(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64, STAGES=4, num_warps=4, GROUP_M=8),
    ),
}


def fp8_of(cfg: SplitKConfig) -> SplitKConfig:
    """The fp8 (e4m3) config of a 16-bit one: K steps twice as wide, so a stage holds the same bytes
    (128-byte rows, the 128-byte swizzle) and as many programs share an SM."""
    return replace(cfg, BLOCK_K=2 * cfg.BLOCK_K, ELEM_BYTES=1)


FP8_CONFIGS = {major: fp8_of(cfg) for major, cfg in CONFIGS.items()}

__all__ = [
    "CONFIGS",
    "FP8_CONFIGS",
    "MID_M",
    "SplitKConfig",
    "candidates",
    "compile_specs",
    "config_for",
    "prepare",
    "reads_transposed_a",
    "split_for",
    "split_reduce",
    "splitk_kernel",
    "store_sum",
]


@gluon.jit
def store_sum(
    c_desc, total, off_m, off_n, scale_a, scale_b, SCALING: gl.constexpr, bias, HAS_BIAS: gl.constexpr
):
    """C's tile at (off_m, off_n) from `total`, the fp32 sum over all of K: times the fp8 scales
    (`scale_tile`; SCALING 0, fp16/bf16, leaves it), plus the bias along C's columns (`add_bias`;
    HAS_BIAS False leaves it), to C's dtype, TMA store."""
    total = scale_tile(total, scale_a, scale_b, off_m, off_n, c_desc.shape[0], c_desc.shape[1], SCALING)
    total = add_bias(total, bias, off_n, c_desc.shape[1], HAS_BIAS)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    store_tile(c_desc, c_smem, total, off_m, off_n)
    tma.store_wait(0)


@gluon.constexpr_function
def partial_layout(BM, BN, num_warps):
    """The layout partial tiles travel in: 4 consecutive fp32 columns a thread (16-byte accesses),
    a warp's threads along a row first, warps down the rows."""
    cols = max(1, min(32, BN // 4))
    return gl.BlockedLayout([1, 4], [32 // cols, cols], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def reduce_batch(BM, BN, num_warps, registers=64):
    """How many partial tiles the last program loads at once: as many as fit in `registers` fp32
    registers a thread, so that their L2 round trips overlap instead of following one another."""
    return max(1, registers // max(1, BM * BN // (32 * num_warps)))


@gluon.jit
def split_reduce(
    c_desc,
    acc,
    partials,
    counters,
    tile,
    split,
    SPLIT_K: gl.constexpr,
    off_m,
    off_n,
    scale_a,
    scale_b,
    SCALING: gl.constexpr,
    bias,
    HAS_BIAS: gl.constexpr,
):
    """Sum the SPLIT_K partial tiles of `tile` and store C: every program writes its fp32 partial
    `acc` to its slot, the last to arrive on the tile's counter adds all of them (in split order,
    so the sum does not depend on who arrives last), writes C at (off_m, off_n) (`store_sum`: the
    fp8 scales and the bias apply to the sum, never to a partial) and resets the counter. `acc` may be any
    [BM, BN] fp32 tensor (the MMA's layout); the partials are [BM, BN] slots of `partials`,
    SPLIT_K per tile, written and read as 16-byte vectors (`partial_layout`). The last program
    loads them BATCH at a time, each batch's loads issued together, so the tail of the tile waits
    for about SPLIT_K / BATCH L2 round trips instead of SPLIT_K (SPLIT_K is 4-12 at 4096-wide
    weights, on kernels of 15-60 µs; the gain was not measured on its own: docs/perf-notes.md,
    entry 23)."""
    BM: gl.constexpr = acc.shape[0]
    BN: gl.constexpr = acc.shape[1]
    layout: gl.constexpr = partial_layout(BM, BN, gl.num_warps())
    BATCH: gl.constexpr = reduce_batch(BM, BN, gl.num_warps())
    rows = gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
    offs = gl.expand_dims(rows, 1) * BN + gl.expand_dims(cols, 0)
    first = partials + tile * (SPLIT_K * BM * BN)
    gl.store(first + split * (BM * BN) + offs, gl.convert_layout(acc, layout))
    cta_barrier()  # every thread's part of the partial is written before the arrival
    arrived = gl.atomic_add(counters + tile, 1, sem="acq_rel", scope="gpu")
    if arrived == SPLIT_K - 1:  # the last: every partial is visible (acquire)
        total = gl.zeros([BM, BN], gl.float32, layout)
        for base in range(0, SPLIT_K, BATCH):
            for j in gl.static_range(BATCH):
                s = base + j
                total += gl.load(
                    first + s * (BM * BN) + offs, mask=s < SPLIT_K, other=0.0, cache_modifier=".cg"
                )
        gl.store(counters + tile, 0)  # ready for the next launch
        store_sum(c_desc, total, off_m, off_n, scale_a, scale_b, SCALING, bias, HAS_BIAS)


@gluon.jit(do_not_specialize_on_alignment=["bias"])
def splitk_kernel(
    a_desc,
    b_desc,
    c_desc,
    scale_a,
    scale_b,
    bias,
    partials,
    counters,
    MMA: gl.constexpr,
    B_KMAJOR: gl.constexpr,
    A_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    SPLIT_K: gl.constexpr,
    SCALING: gl.constexpr,
    HAS_BIAS: gl.constexpr,
):
    """Slice `split` of K of one [BLOCK_M, BLOCK_N] tile of C = A @ B (for fp8 operands times the
    scales, SCALING 1 or 2; None scales and SCALING 0 for fp16/bf16; then + bias[N] with
    HAS_BIAS, None and False without). A_KMAJOR False: A is read through the [K, M] matrix behind
    a transposed view (16-bit only)."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1] if A_KMAJOR else a_desc.block_type.shape[0]
    k_steps = gl.cdiv(a_desc.shape[1] if A_KMAJOR else a_desc.shape[0], BLOCK_K)
    per_split = gl.cdiv(k_steps, SPLIT_K)

    tile = gl.program_id(0) // SPLIT_K  # the programs of one tile are neighbours in launch order
    split = gl.program_id(0) % SPLIT_K
    num_pid_m = gl.cdiv(c_desc.shape[0], BLOCK_M)
    pid_m, pid_n = grouped_tile(tile, num_pid_m, gl.cdiv(c_desc.shape[1], BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    first = split * per_split  # this program's K steps: first .. first + steps - 1 (never none)
    steps = gl.minimum(per_split, k_steps - first)

    mma = MMA.initialize(a_desc.dtype, BLOCK_M, BLOCK_N, gl.num_warps())
    acc = ring_mma(
        a_desc, b_desc, off_m, off_n, first, steps, mma, STAGES, B_KMAJOR, operands, True, A_KMAJOR
    )
    if SPLIT_K == 1:
        store_sum(c_desc, acc, off_m, off_n, scale_a, scale_b, SCALING, bias, HAS_BIAS)
    else:
        split_reduce(
            c_desc,
            acc,
            partials,
            counters,
            tile,
            split,
            SPLIT_K,
            off_m,
            off_n,
            scale_a,
            scale_b,
            SCALING,
            bias,
            HAS_BIAS,
        )


# --------------------------------------------------------------------------------------------------
# Host side.


class Workspace:
    """fp32 partial slots and zeroed tile counters for split-K launches on one device, grown on
    demand and reused: the kernels leave every counter at 0, so nothing is cleared between calls.
    (One stream at a time: two concurrent split-K launches must not share it.)

    The buffers come from `memory.persistent`, never a CUDA graph's pool (a plan built in
    CUDA-graph trees' warm-up keeps them), and are never freed: a captured graph launches on
    their addresses, so buffers replaced by larger ones are kept too (`retired`; each growth at
    least doubles). The first buffers hold at least `least_floats` partials (a full wave's slots),
    so that later shapes seldom grow them. Creating or growing them needs counters zeroed now,
    which a stream capture cannot do (the fill would be recorded, not run): inside one, `get`
    raises a RuntimeError that asks for one call of the shape before the capture."""

    def __init__(self) -> None:
        self._buffers: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self.retired: list[tuple[torch.Tensor, torch.Tensor]] = []

    def get(
        self, device: torch.device, partial_floats: int, tiles: int, least_floats: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        partials, counters = self._buffers.get(device, (None, None))
        if partials is not None and partials.numel() >= partial_floats and counters.numel() >= tiles:
            return partials, counters
        if memory.capturing():
            raise RuntimeError(
                f"split-K needs a workspace of {partial_floats} fp32 partials and {tiles} zeroed tile "
                "counters, which cannot be made inside a CUDA graph capture (zeroing is recorded, not "
                "run): call matmul (or the model) once with this shape before capturing, as CUDA-graph "
                "warm-up does"
            )
        floats, count = max(partial_floats, least_floats, 1), max(tiles, 1)
        if partials is not None:
            self.retired.append((partials, counters))
            floats, count = max(floats, 2 * partials.numel()), max(count, 2 * counters.numel())
        with memory.persistent(device):
            partials = torch.empty(floats, dtype=torch.float32, device=device)
            counters = torch.zeros(count, dtype=torch.int32, device=device)
        self._buffers[device] = (partials, counters)
        return partials, counters


WORKSPACE = Workspace()


def plan_split(cfg: SplitKConfig, tiles: int, K: int, sm_count: int) -> int:
    """SPLIT_K for `tiles` output tiles: the config's, or `split_for`'s; never an empty slice."""
    k_steps = max(1, triton.cdiv(K, cfg.BLOCK_K))
    split = cfg.SPLIT_K or split_for(tiles, k_steps, sm_count * cfg.blocks_per_sm(), cfg.MIN_STEPS)
    return triton.cdiv(k_steps, triton.cdiv(k_steps, split))


def _constexprs(
    cfg: SplitKConfig, capability: tuple[int, int], layout: str, split: int, a_layout: str = "row"
) -> dict[str, object]:
    return {
        "MMA": select_mma(capability),
        "B_KMAJOR": is_kmajor(layout),
        "A_KMAJOR": is_a_kmajor(a_layout),
        "GROUP_M": cfg.GROUP_M,
        "STAGES": cfg.STAGES,
        "SPLIT_K": split,
    }


def check_operands(mode: str, cfg: SplitKConfig, layout: str, scales: Scales | None) -> None:
    """What a split-K provider refuses: a config for the other kind of operands (fp8 configs take
    scales, 16-bit ones none), and fp8 with a row-major B (fp8 MMAs read both operands K-major)."""
    check_config_kind(mode, cfg, scales)
    if scales is not None and not is_kmajor(layout):
        raise ValueError(
            f"{mode}: fp8 MMAs read both operands K-major: B must be the transpose view w.t() of a "
            "row-major [N, K] weight, not a row-major [K, N] matrix"
        )


def launch(
    kernel,
    tiles: int,
    a,
    b,
    out,
    target: Target,
    cfg: SplitKConfig,
    descs,
    constexprs,
    scales=None,
    bias=None,
    programs: int | None = None,
) -> Launch:
    """The split-K launch of `kernel` (this rung's or swapab's) over `tiles` output tiles: SPLIT_K,
    grid, workspace, as a `Plan` (so `matmul` reuses it) whose kernel takes the fp8 `scales` (None
    for fp16/bf16) and the `bias` (None without) after the descriptors; `constexprs(split)` gives
    the kernel's, SCALING and HAS_BIAS aside. `programs`: a persistent kernel's grid, which walks
    the tiles whole (SPLIT_K 1) instead of one program a tile slice."""
    split = 1 if programs else plan_split(cfg, tiles, a.shape[1], target.sm_count)
    tile_floats = cfg.BLOCK_M * cfg.BLOCK_N
    wave = target.sm_count * cfg.blocks_per_sm() * tile_floats  # the most a split launch asks for
    if split > 1:
        partials, counters = WORKSPACE.get(a.device, tiles * split * tile_floats, tiles, wave)
    else:  # SPLIT_K 1 reads neither: stand-ins of their dtypes, which need no zeroing
        partials = memory.one_element(torch.float32, a.device)
        counters = memory.one_element(torch.int32, a.device)
    grid = (programs or tiles * split,)
    kw = constexprs(split) | {"SCALING": scaling_code(scales), "HAS_BIAS": bias is not None}
    plan = Plan(
        Launcher(kernel, grid, kw, cfg.num_warps, pdl=PDL),
        templates_of(descs),
        cfg,
        (partials, counters),
        scaled=True,
        biased=True,
    )
    table = cfg.table() | {"split_k": split, "grid": grid[0]} | bias_table(bias)
    return Launch(plan.bind(a, b, out, scales, bias), table)


def configs_of(fp8: bool) -> dict[int, SplitKConfig]:
    return FP8_CONFIGS if fp8 else CONFIGS


def candidates(capability: tuple[int, int], fp8: bool = False) -> dict[str, object]:
    """The configs `gluon-survey tune` may pick, by label: the default and the mid-M tiles (fp16
    and bf16)."""
    cfg = configs_of(fp8)[capability[0]]
    more = () if fp8 else MID_M.get(capability[0], ())
    return {c.label: c for c in (cfg, *more)}


def config_for(capability: tuple[int, int], K: int, fp8: bool = False) -> SplitKConfig:
    return configs_of(fp8)[capability[0]]


def prepare(
    a, b, out, target: Target, cfg: SplitKConfig | None = None, scales: Scales | None = None, bias=None
) -> Launch:
    cfg = cfg or config_for(target.capability, a.shape[1], scales is not None)
    layout, alayout = b_layout(b), a_layout(a)
    check_operands("splitk", cfg, layout, scales)
    check_a_layout("splitk", alayout, target.capability, scales is not None)
    descs = make_descriptors(a, b, out, cfg, layout, a_layout=alayout)
    tiles = triton.cdiv(out.shape[0], cfg.BLOCK_M) * triton.cdiv(out.shape[1], cfg.BLOCK_N)
    return launch(
        splitk_kernel,
        tiles,
        a,
        b,
        out,
        target,
        cfg,
        descs,
        lambda split: _constexprs(cfg, target.capability, layout, split, alayout),
        scales,
        bias,
    )


def splitk_specs(
    mode, kernel, cfg, dtype: str, desc_args, blocks, constexprs, a_layout: str = "row"
) -> list[CompileSpec]:
    """Compile specs of a split-K kernel (this rung's or swapab's) with 4 K slices, so that the
    reduction is compiled in: one per B layout for fp16/bf16, for fp8 (`dtype` FP8) one for layout
    "t" with row-wise scales (the epilogue that loads the most) and a bf16 C. The arguments:
    descriptors `desc_args` of the block shapes `blocks(layout)`, the scales (None constexprs for
    fp16/bf16), no bias (a None constexpr; `plan.with_bias` adds one), the fp32 partials and the
    int32 counters, then `constexprs(layout)`, SCALING and HAS_BIAS. `a_layout` "t" (which
    `blocks` and `constexprs` must have been given too) adds " A=t" to the labels."""
    fp8 = dtype == FP8
    specs = []
    for layout in ("t",) if fp8 else B_LAYOUTS:
        dtypes = (dtype, dtype, FP8_OUT if fp8 else dtype)
        signature = {
            arg: desc_signature(block, dt)
            for arg, block, dt in zip(desc_args, blocks(layout), dtypes, strict=True)
        }
        signature |= dict.fromkeys(("scale_a", "scale_b"), "*fp32" if fp8 else "constexpr")
        signature |= {"bias": "constexpr"}
        constants = constexprs(layout) | {"SCALING": 2 if fp8 else 0, "HAS_BIAS": False}
        signature |= {"partials": "*fp32", "counters": "*i32"} | dict.fromkeys(constants, "constexpr")
        values = ({} if fp8 else {"scale_a": None, "scale_b": None}) | {"bias": None} | constants
        transposed = " A=t" if a_layout == "t" else ""
        label = f"{kernel.__name__} {cfg.label}{transposed} B={layout}" + (" scales=row" if fp8 else "")
        specs.append(
            CompileSpec(mode, label, kernel, signature, values, {"num_warps": cfg.num_warps}, config=cfg)
        )
    return specs


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    if unsupported_reason(capability):
        return []
    specs = []
    for cfg in candidates(capability, dtype == FP8).values():
        specs += splitk_specs(
            "splitk",
            splitk_kernel,
            cfg,
            dtype,
            ("a_desc", "b_desc", "c_desc"),
            lambda layout, cfg=cfg: block_shapes(cfg, layout),
            lambda layout, cfg=cfg: _constexprs(cfg, capability, layout, 4),
        )
    if capability[0] == 9 and dtype != FP8:  # the default config reading a transposed A in place
        cfg = config_for(capability, 0)
        specs += splitk_specs(
            "splitk",
            splitk_kernel,
            cfg,
            dtype,
            ("a_desc", "b_desc", "c_desc"),
            lambda layout: block_shapes(cfg, layout, "t"),
            lambda layout: _constexprs(cfg, capability, layout, 4, "t"),
            "t",
        )
    return specs
