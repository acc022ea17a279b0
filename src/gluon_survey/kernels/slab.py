"""Rung slab: swapab without split-K, for decode GEMMs whose weight is too narrow to fill the GPU.

The idea: swapab makes the weight's rows the MMA's tall side, but a wgmma (and a tcgen05 MMA) is
64 rows tall, so a 4096-wide weight is only 32 tiles of 128 rows, and 132 SMs get work only if K
is cut into slices. Every slice costs a fixed price after the weight has streamed: its fp32
partial written, an arrival on the tile's counter, and the last program reading the partials back
and storing C, a chain of L2 round trips the weight's bytes cannot hide (at 16 x 4096 x 4096,
about 4.3 µs over the bytes' 11.1 µs, against a plain read's 1.2: docs/perf-notes.md, entry 23).
Ampere's mma.sync (`mma_v2`, still on Hopper and Blackwell) is 16 rows tall. A warp multiplies a
16-row slab of the weight: a 4096-wide weight is 256 slabs, 128 programs of two warps, and every
program streams its slab's whole K through a ring of TMA stages and stores its tile of C from
its own registers. No partials, no counters, nothing read back: the kernel's fixed cost is a
read's (the ring's first fill) plus one small store.

What it gives up is tensor-core rate. The MMA work is small (at 16 tokens 0.5 GFLOP on a
4096 x 4096 weight, 2.1 at 64), but a warp issues it as a chain of operand loads and mma.sync
instructions that is only ~1.4x as fast as one SM's share of HBM at 8 tokens, so the warps, not the
bytes, set slab's pace (docs/perf-notes.md, entry 26); swapab's whole-K tile, whose wgmma runs
asynchronously from shared memory, streams the 4096-wide weights faster. Every program loads the
tokens' [BLOCK_T, BLOCK_K] tile of each K step from L2 (the weight's 16-row slabs share it there),
so a wider slab (more warps) reads the tokens fewer times; `tune` tries 16-, 32- and 64-row slabs.

The ring is as deep as the resident programs' shared memory allows (`stages_for`): the grid is
sized so that every program is resident at once (one wave, the busiest SM with one program more
than the idlest), and the bytes in flight per SM, not the programs, keep HBM busy.

fp8 (e4m3) operands: mma.sync has no e4m3 form that Triton emits on sm_90, so each K step's
operands are converted to fp16 in registers (exactly: e4m3 is a subset of fp16) and multiplied
in fp16 with fp32 accumulation; the weight still streams at one byte an element, which is what
bounds these shapes. The scales multiply C's tile once, as in swapab (`store_sum`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from ..compat import cta_barrier
from ..launch import CompileSpec, Launch, Scales, Target, b_layout, is_kmajor
from .arch import unsupported_reason
from .common import SMEM_PER_SM, GemmConfig, Ring, init_barriers, invalidate_barriers, load_step
from .plan import FP8, Rung
from .splitk import check_operands, store_sum
from .swapab import swapped_operands

__all__ = [
    "CONFIGS",
    "FP8_CONFIGS",
    "RUNG",
    "SlabConfig",
    "candidates",
    "compile_specs",
    "config_for",
    "prepare",
    "slab_kernel",
    "stages_for",
    "unsupported_reason",
]

ROWS_PER_WARP = 16  # mma.sync's M
TOKENS = (8, 16, 32, 64)  # token tile widths: mma.sync's N is 8; M up to 8, 16, 32, 64 in one tile
SLABS = (16, 32, 64)  # weight rows per program (one warp per 16), the widths `tune` tries
MAX_STAGES = 16  # a deeper ring has more in flight than one SM's share of HBM needs (entry 25)
MAX_RESIDENT = 32  # programs an SM holds at most (Hopper and Blackwell)


@dataclass(frozen=True)
class SlabConfig(GemmConfig):
    """A tile of C in C's terms: BLOCK_M tokens (the MMA's N) by BLOCK_N weight rows (the MMA's M,
    ROWS_PER_WARP per warp). Chosen per launch where 0: BLOCK_M, the narrowest of TOKENS that holds
    M (`tokens_for`); STAGES, the ring the grid's residency leaves room for (`stages_for`)."""

    BLOCK_M: int = 0
    BLOCK_N: int = 32
    BLOCK_K: int = 256
    STAGES: int = 0
    num_warps: int = 2
    GROUP_M: int = 1

    def __post_init__(self):
        super().__post_init__()
        if ROWS_PER_WARP * self.num_warps != self.BLOCK_N:
            raise ValueError(
                f"a slab is {ROWS_PER_WARP} weight rows per warp: BLOCK_N {self.BLOCK_N} with "
                f"{self.num_warps} warps"
            )
        if self.BLOCK_M not in (0, *TOKENS):
            raise ValueError(f"BLOCK_M (tokens) is one of {TOKENS} (0: chosen per M), got {self.BLOCK_M}")

    @property
    def label(self) -> str:
        fp8 = " fp8" if self.ELEM_BYTES == 1 else ""
        tokens = self.BLOCK_M or "auto"
        return f"T{tokens}xW{self.BLOCK_N}x{self.BLOCK_K}{fp8} s{self.STAGES or 'auto'} w{self.num_warps}"

    def table(self) -> dict[str, object]:
        return super().table() | {
            "BLOCK_M": self.BLOCK_M or "auto",
            "stages": self.STAGES or "auto",
            "mma": "mma.sync",
        }

    def stage_bytes(self) -> int:
        return (self.BLOCK_M + self.BLOCK_N) * self.BLOCK_K * self.ELEM_BYTES


# 32-row slabs, K steps of 256 (512 bytes of each weight row a stage, four 128-byte TMA boxes):
# kernel-only at M <= 16, 2-8 % faster than steps of 128 on the 4096- and 6144-wide weights and
# within 2 % on the rest (results/h100-slab); steps of 64 ran at cuBLAS's time (docs/perf-notes.md
# entry 25).
CONFIGS = {major: SlabConfig() for major in (9, 10)}
# fp8: the same 256-wide K steps (256 bytes of a row a stage): 0-12 % faster than 128 at M <= 16
# (results/h100-slab).
FP8_CONFIGS = {major: replace(cfg, ELEM_BYTES=1) for major, cfg in CONFIGS.items()}


@gluon.constexpr_function
def slab_layout(num_warps):
    """mma.sync's accumulator layout: m16n8 instructions, the warps stacked along the weight rows."""
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])


@gluon.constexpr_function
def k_width(dtype):
    """Operand elements a thread holds consecutively along K: one 32-bit register's worth."""
    return 32 // dtype.primitive_bitwidth


@gluon.jit(do_not_specialize_on_alignment=["bias"])
def slab_kernel(
    x_desc,
    w_desc,
    c_desc,
    scale_a,
    scale_b,
    bias,
    W_KMAJOR: gl.constexpr,
    STAGES: gl.constexpr,
    SCALING: gl.constexpr,
    HAS_BIAS: gl.constexpr,
):
    """C's [BLOCK_T, BLOCK_W] tile: BLOCK_T tokens times a BLOCK_W-row slab of the weight over the
    whole of K (for fp8 operands times the scales, SCALING 1 or 2; None and 0 for fp16/bf16), plus
    the bias of its columns (the slab's weight rows) with HAS_BIAS."""
    BLOCK_T: gl.constexpr = c_desc.block_type.shape[0]  # tokens: rows of C, the MMA's N
    BLOCK_W: gl.constexpr = c_desc.block_type.shape[1]  # weight rows: columns of C, the MMA's M
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    k_steps = gl.cdiv(x_desc.shape[1], BLOCK_K)
    num_pid_t = gl.cdiv(c_desc.shape[0], BLOCK_T)
    off_w = (gl.program_id(0) // num_pid_t) * BLOCK_W  # a slab's token tiles are neighbours
    off_t = (gl.program_id(0) % num_pid_t) * BLOCK_T

    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)
    for i in gl.static_range(STAGES):  # the first fill: K steps 0 .. STAGES - 1, those that exist
        load_step(
            x_desc, w_desc, off_t, off_w, i * BLOCK_K, ready.index(i), x_bufs.index(i), w_bufs.index(i),
            W_KMAJOR, i < k_steps,
        )  # fmt: skip

    layout: gl.constexpr = slab_layout(gl.num_warps())
    KW: gl.constexpr = k_width(x_desc.dtype)
    SUB_K: gl.constexpr = 256 // x_desc.dtype.primitive_bitwidth  # 32 bytes of K a sub-step
    acc = gl.zeros([BLOCK_W, BLOCK_T], gl.float32, layout)
    ring = Ring.start(STAGES)
    for k in range(k_steps):
        slot = ring.slot()
        ring.wait_filled(ready)
        w_view, xt_view = swapped_operands(x_bufs.index(slot), w_bufs.index(slot), W_KMAJOR)
        # A sub-step's operands at a time: loading a whole 64-token step's at once spilled (8 B).
        # One accumulator: four, the sub-steps dealt out among them, measured -2 to +1 %
        # (docs/perf-notes.md, entry 26); the loads' latency, not the MMAs', sets the pace.
        for j in gl.static_range(BLOCK_K // SUB_K):
            w = w_view.slice(j * SUB_K, SUB_K, dim=1).load(gl.DotOperandLayout(0, layout, KW))
            xt = xt_view.slice(j * SUB_K, SUB_K, dim=0).load(gl.DotOperandLayout(1, layout, KW))
            acc = mma_v2(w, xt, acc)
        # Every warp has read the stage (the barrier), the reads are ordered before the async
        # proxy's writes (the fence): TMA refills it with step k + STAGES.
        cta_barrier()
        fence_async_shared()
        load_step(
            x_desc, w_desc, off_t, off_w, (k + STAGES) * BLOCK_K, ready.index(slot), x_bufs.index(slot),
            w_bufs.index(slot), W_KMAJOR, k + STAGES < k_steps,
        )  # fmt: skip
        ring = ring.next()
    invalidate_barriers(ready, STAGES)
    store_sum(c_desc, gl.permute(acc, (1, 0)), off_t, off_w, scale_a, scale_b, SCALING, bias, HAS_BIAS)


def constexprs(cfg: SlabConfig, capability: tuple[int, int], layout: str) -> dict[str, object]:
    if not cfg.STAGES:
        raise ValueError(f"slab: {cfg.label} has no ring depth yet (prepare chooses it: stages_for)")
    return {"W_KMAJOR": is_kmajor(layout), "STAGES": cfg.STAGES}


RUNG = Rung(
    "slab",
    slab_kernel,
    constexprs,
    configs=CONFIGS,
    fp8_configs=FP8_CONFIGS,
    scaled=True,
    desc_args=("x_desc", "w_desc", "c_desc"),
)


def tokens_for(M: int) -> int:
    """The narrowest token tile that holds M tokens (the widest, 64, beyond)."""
    return next((t for t in TOKENS if t >= M), TOKENS[-1])


def stages_for(cfg: SlabConfig, programs: int, sm_count: int) -> int:
    """The ring depth: as many stages as the shared memory of the busiest SM holds when all of the
    grid's programs are resident at once (an SM holds at most MAX_RESIDENT), rounded down to a power
    of two, at least 2, at most MAX_STAGES. A power of two makes a fill's slot and phase a mask and a
    shift instead of a division; rings of 6 and 9 stages also spilled 8 bytes under triton 3.9."""
    resident = min(MAX_RESIDENT, max(1, -(-programs // sm_count)))
    fit = (SMEM_PER_SM // resident - 1024) // cfg.stage_bytes()
    return max(2, min(MAX_STAGES, 1 << (max(fit, 1).bit_length() - 1)))


def programs_for(cfg: SlabConfig, M: int, N: int) -> int:
    return triton.cdiv(N, cfg.BLOCK_N) * triton.cdiv(M, cfg.BLOCK_M)


def config_for(capability: tuple[int, int], K: int, fp8: bool = False) -> SlabConfig:
    return RUNG.config_for(capability, K, fp8)


def candidates(capability: tuple[int, int], fp8: bool = False) -> dict[str, SlabConfig]:
    """The configs `gluon-survey tune` may pick, by label: every slab height of SLABS, the token
    tile chosen per M; and the default slab with K steps half as wide (at 64 tokens a stage of
    256 holds 48 KB and the ring is short: 128 was the faster there)."""
    base = config_for(capability, 0, fp8)
    tiles = [replace(base, BLOCK_N=w, num_warps=w // ROWS_PER_WARP) for w in SLABS]
    tiles.append(replace(base, BLOCK_K=base.BLOCK_K // 2))
    return {c.label: c for c in tiles}


def prepare(
    a, b, out, target: Target, cfg: SlabConfig | None = None, scales: Scales | None = None, bias=None
) -> Launch:
    """The slab launch of the config (by default the 32-row slab), with the token tile and the
    ring depth chosen for this M and this grid where the config leaves them at 0."""
    M, N = out.shape
    cfg = cfg or config_for(target.capability, a.shape[1], scales is not None)
    check_operands("slab", cfg, b_layout(b), scales)
    if not cfg.BLOCK_M:
        cfg = replace(cfg, BLOCK_M=tokens_for(M))
    if not cfg.STAGES:
        cfg = replace(cfg, STAGES=stages_for(cfg, programs_for(cfg, M, N), target.sm_count))
    launch = RUNG.launch(a, b, out, target, cfg, scales, bias)
    return Launch(launch.fn, launch.config | {"grid": programs_for(cfg, M, N)})


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    """The default slab at every token width, with the ring one resident program per SM gets
    (the deepest a launch chooses), both B layouts (fp8: "t", row-wise scales)."""
    if unsupported_reason(capability):
        return []
    base = config_for(capability, 0, dtype == FP8)
    configs = [replace(base, BLOCK_M=t) for t in TOKENS]
    configs = [replace(c, STAGES=stages_for(c, 1, 1)) for c in configs]
    return RUNG.compile_specs(capability, dtype, configs)
