"""The grouped rung on Blackwell (sm_100a), as tcgen05 shapes it: out[rows of expert e] = x[rows of
e] @ w[e] with the MMA in tensor memory.

The idea and the schedule are kernels/grouped.py's, imported rather than copied: one persistent
launch walks a compact list of the output tiles of the experts with rows, built on the device from
the offsets (`_schedule`: every warp holds the experts' tile counts and their prefix sum; `_tile_of`
maps a tile to its expert, rows and grouped position); the K loop is its flat ring, whose producer
runs STAGES - 1 (tile, K step) loads ahead across tile boundaries (`_next_load`); the epilogue is its
masked register store into the expert's rows (`_store_rows`), with the fp8 row-wise scales on the
fp32 values first (`_scale_rows`, `_scale_columns`). Same arguments, same grid (`tile_bound`), same
host checks (`grouped.check_operand_kind`, `grouped.plan_of`).

What tcgen05 changes, and why:

* The accumulator lives in tensor memory (one 128-lane block of BLOCK_N fp32 columns), not in the
  issuing warps' registers, and one thread issues each MMA for the whole CTA. So a 128x256 tile
  needs 4 warps, not Hopper's 8: the accumulator only passes through registers in the epilogue,
  which reads it from TMEM in EPILOGUE_N-column slices (64 registers a thread for a 64-wide slice,
  one row a thread), each slice scaled, converted and stored before the next is read.
* MMAs complete asynchronously on mbarriers, as in warpspec_tcgen05.py's MMA warp: each MMA
  arrives, when done, on its stage's `empty` barrier, and the producer waits there before it
  refills the stage (the stage it refills after MMA k is the one MMA k - 1 read, so one MMA runs
  while the next is issued, as Hopper's `wait(1)`). At the end of a tile one `tcgen05_commit`
  arrives on `acc_bar` once all of its MMAs are done; the tile's destination is looked up while
  they finish. There is no warp specialization: a single loop, readable beside the Hopper kernel.
  (The next step would be warpspec_tcgen05's: a double-buffered accumulator whose epilogue runs
  in its own warps while the next tile accumulates.)
* The next tile's first MMA (`use_acc=False`) overwrites the accumulator, so every warp must have
  read it first: the last slice's layout conversion in `_store_rows` goes through shared memory
  with a CTA barrier, which every warp reaches only after its TMEM loads, and the MMA is issued
  after it.

fp8 e4m3 with row-wise scales (SCALING 2) is the same kernel with BLOCK_K 128 (tcgen05's f8f6f4
kind, on both operands K-major, as x and the [E, N, K] weight are), the scales applied per
slice.

Status: compile-checked for sm_100a with triton 3.6 and 3.9 on a machine without a GPU
(tests/test_blackwell_compile.py: tcgen05 MMAs, TMEM loads, no wgmma, no spills); not run.
"""

from __future__ import annotations

from dataclasses import replace

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..compat import allocate_tensor_memory, tcgen05_commit, tcgen05_mma, tmem_load
from ..launch import CompileSpec, Launch, Scales, Target
from .blackwell import TMEM_COLUMNS, acc_tmem_layout
from .common import Ring, init_barriers, invalidate_barriers, mbarrier
from .grouped import (
    MAX_EXPERTS,
    WIDE_N,
    GroupedConfig,
    _load_coords,
    _next_load,
    _scale_columns,
    _scale_rows,
    _schedule,
    _store_rows,
    _tile_of,
    check_operand_kind,
    experts_pad,
    plan_of,
    spec_of,
)
from .plan import FP8, GroupedPlan

__all__ = [
    "CONFIGS",
    "FP8_CONFIGS",
    "FP8_WIDE_CONFIGS",
    "WIDE_CONFIGS",
    "compile_specs",
    "config_for",
    "grouped_tcgen05_kernel",
    "plan",
    "prepare",
    "unsupported_reason",
]

_DTYPES = ("float16", "bfloat16", FP8)

# Blackwell, N < WIDE_N: 128x128, 4 warps (one warpgroup: a thread per TMEM lane, i.e. per row);
# 4 stages of 32 KB and the 16 KB scratch of a 64-column epilogue slice.
CONFIGS = {10: GroupedConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=4, num_warps=4, EPILOGUE_N=64)}
# N >= WIDE_N: 128x256 (256 of the 512 TMEM columns), still 4 warps: the tile leaves TMEM in four
# 64-column slices. 4 stages of 48 KB and 16 KB of scratch: 208 KB.
WIDE_CONFIGS = {10: GroupedConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, STAGES=4, num_warps=4, EPILOGUE_N=64)}
# fp8 e4m3: K twice as deep, the same stage bytes (as the Hopper fp8 configs and warpspec_tcgen05's).
FP8_CONFIGS = {major: replace(cfg, BLOCK_K=128, ELEM_BYTES=1) for major, cfg in CONFIGS.items()}
FP8_WIDE_CONFIGS = {major: replace(cfg, BLOCK_K=128, ELEM_BYTES=1) for major, cfg in WIDE_CONFIGS.items()}


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """tcgen05 and tensor memory: datacenter Blackwell (sm_100) only."""
    if capability[0] in CONFIGS:
        return None
    gpu = f"sm_{capability[0]}{capability[1]}"
    if capability[0] == 9:
        return f"this tcgen05 kernel is Blackwell's (sm_100); on {gpu} the grouped mode runs grouped.py"
    return f"the grouped kernel runs on Hopper (sm_90) and Blackwell (sm_100); this GPU is {gpu}"


def config_for(capability: tuple[int, int], N: int, fp8: bool = False) -> GroupedConfig:
    """The config a product with N output columns runs: the wide tile from N = WIDE_N on (as on
    Hopper); with `fp8` operands, the fp8 config of that tile."""
    if fp8:
        return (FP8_WIDE_CONFIGS if N >= WIDE_N else FP8_CONFIGS)[capability[0]]
    return (WIDE_CONFIGS if N >= WIDE_N else CONFIGS)[capability[0]]


@gluon.jit
def grouped_tcgen05_kernel(
    a_desc,
    b_desc,
    out,
    offs,
    scale_x,
    scale_w,
    S,
    N,
    E,
    STAGES: gl.constexpr,
    GROUP_M: gl.constexpr,
    EPILOGUE_N: gl.constexpr,
    EXPERTS_PAD: gl.constexpr,
    SCALING: gl.constexpr,
):
    """kernels/grouped.py's `grouped_kernel` (the same arguments: x [S, K] and the [E * N, K]
    weight as descriptors, out [S, N], offs int32 [E] cumulative ends, the fp8 row-wise scales or
    None) with the MMA as tcgen05 into a tensor-memory accumulator."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    dtype: gl.constexpr = a_desc.dtype
    gl.static_assert(BLOCK_N <= TMEM_COLUMNS, "the fp32 accumulator must fit in tensor memory")
    k_steps = gl.cdiv(a_desc.shape[1], a_desc.block_type.shape[1])
    tiles_n = gl.cdiv(N, BLOCK_N)
    prefix, total = _schedule(offs, S, E, tiles_n, BLOCK_M, EXPERTS_PAD)

    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())  # TMA landed
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())  # MMA read it
    acc_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())  # tile's MMAs done
    init_barriers(ready, STAGES)
    init_barriers(empty, STAGES)
    init_barriers(acc_bar, 1)
    acc = allocate_tensor_memory(gl.float32, [BLOCK_M, BLOCK_N], acc_tmem_layout(BLOCK_M, BLOCK_N))

    # Producer state, as in grouped.py: the next load is K step p[1] of tile p[0], into ring
    # position p[2]. The first STAGES - 1 fills go to stages no MMA has read yet.
    a_row, w_row = _load_coords(gl.program_id(0), prefix, offs, S, N, E, tiles_n, BLOCK_M, BLOCK_N, GROUP_M)
    p = (gl.program_id(0), 0, Ring.start(STAGES), a_row, w_row)
    for _ in gl.static_range(STAGES - 1):
        p = _next_load(
            a_desc, b_desc, p, total, prefix, offs, S, N, E, tiles_n, k_steps, a_bufs, b_bufs, ready, GROUP_M
        )

    ring = Ring.start(STAGES)  # the consumer's position, over all of this program's K steps
    for t in range(gl.program_id(0), total, gl.num_programs(0)):
        for k in range(k_steps):
            ring.wait_filled(ready)
            slot = ring.slot()
            tcgen05_mma(
                a_bufs.index(slot),
                b_bufs.index(slot).permute((1, 0)),
                acc,
                use_acc=k > 0,
                mbarriers=[empty.index(slot)],  # arrives when this MMA has read its stage
            )
            # The producer's next fill goes to the stage MMA k - 1 read: wait until it has.
            p[2].wait_free(empty)
            p = _next_load(
                a_desc, b_desc, p, total, prefix, offs, S, N,
                E, tiles_n, k_steps, a_bufs, b_bufs, ready, GROUP_M,
            )  # fmt: skip
            ring = ring.next()
        tcgen05_commit(acc_bar.index(0))  # arrives once every MMA issued so far is done
        # Where this tile goes, found while its last MMAs run.
        e, start, count, pid_m, pid_n = _tile_of(t, prefix, offs, S, E, tiles_n, BLOCK_M, GROUP_M)
        mbarrier.wait(acc_bar.index(0), (t // gl.num_programs(0)) & 1)  # this program's tile count, mod 2
        for j in gl.static_range(BLOCK_N // EPILOGUE_N):
            off_n = pid_n * BLOCK_N + j * EPILOGUE_N
            part = tmem_load(acc.slice(j * EPILOGUE_N, EPILOGUE_N))  # a row of the slice a thread
            part = _scale_rows(part, scale_x, start, count, pid_m * BLOCK_M, SCALING)
            part = _scale_columns(part, scale_w, e, off_n, N, SCALING)
            _store_rows(out, part, start, count, pid_m * BLOCK_M, off_n, N)
    invalidate_barriers(ready, STAGES)
    invalidate_barriers(empty, STAGES)
    invalidate_barriers(acc_bar, 1)


def constexprs(cfg: GroupedConfig, E: int, scaling: int = 0) -> dict[str, object]:
    """The kernel's constexprs, for its launch and its compile specs alike (grouped.py's, less the
    MMA: this kernel's is tcgen05)."""
    return {
        "STAGES": cfg.STAGES,
        "GROUP_M": cfg.GROUP_M,
        "EPILOGUE_N": cfg.EPILOGUE_N,
        "EXPERTS_PAD": experts_pad(E),
        "SCALING": scaling,
    }


def plan(x, w, target: Target, cfg: GroupedConfig | None = None, scales: Scales | None = None) -> GroupedPlan:
    """kernels/grouped.py's `plan` (the same operands, checks and grid) for this kernel."""
    reason = unsupported_reason(target.capability)
    if reason:
        raise RuntimeError(reason)
    cfg = cfg or config_for(target.capability, w.shape[2], scales is not None)
    check_operand_kind("grouped", cfg, x, scales)
    values = constexprs(cfg, w.shape[0], scales.code if scales else 0)
    return plan_of(grouped_tcgen05_kernel, values, x, w, target, cfg, scales)


def prepare(
    x, w, offs, out, target: Target, cfg: GroupedConfig | None = None, scales: Scales | None = None
) -> Launch:
    """A ready launch of `plan`'s plan on these tensors (what the driver times)."""
    return plan(x, w, target, cfg, scales).bind(x, w, offs, out, scales)


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    """The specs of the configs sm_100 runs (narrow N, then wide) for fp16, bf16 or fp8 (row-wise
    scales, bf16 out), as kernels/grouped.py's `compile_specs` makes them; none elsewhere."""
    if unsupported_reason(capability) or dtype not in _DTYPES:
        return []
    fp8 = dtype == FP8
    major = capability[0]
    configs = (FP8_CONFIGS[major], FP8_WIDE_CONFIGS[major]) if fp8 else (CONFIGS[major], WIDE_CONFIGS[major])
    return [
        spec_of(grouped_tcgen05_kernel, cfg, constexprs(cfg, MAX_EXPERTS, 2 if fp8 else 0), dtype)
        for cfg in configs
    ]
