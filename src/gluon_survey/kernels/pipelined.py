"""Rung 2, Pipelined: Blocked + a ring of shared-memory stages.

The idea: never let the tensor cores wait for memory. A ring of STAGES A/B buffers, one mbarrier
per stage ("this stage's data has landed"). The prologue starts the TMA loads of the first
STAGES-1 K steps; in the steady state the MMA of step k is issued asynchronously, the MMA of step
k-1 is retired (`wait(1)`: exactly one MMA in flight), and the freed stage is refilled with step
k+STAGES-1. So STAGES-1 loads are in flight behind every MMA.

Slot and phase come from one counter: slot = k % STAGES, phase = (k // STAGES) & 1 (a fresh
mbarrier is in phase 0, and each completed fill flips it).

Measured on H100 80GB HBM3 (results/h100-ladder/ and -run2/, commit c63b779, steady-state clocks,
x cuBLAS timed alongside in alternating windows, fp16 / bf16): 0.85-0.86 / 0.83-0.84 at K = 512,
0.91 at 1024, 0.97-1.03 from K = 2048; geomean 0.96 / 0.95 in both of two runs.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..registry import CompileSpec, Launch
from .common import (
    GemmConfig,
    b_operand,
    gemm_signature,
    grouped_tile,
    init_barriers,
    invalidate_barriers,
    load_step,
    make_descriptors,
    mbarrier,
    rung_config,
    select_mma,
    store_tile,
    tma,
    unsupported_reason,
)

# Triton's Hopper tutorials: 128x256x64, 8 warps (two warpgroups, 128 fp32 accumulator registers
# per thread), 3 stages of 48 KB + a 64 KB C tile = 208 KB; a 4th stage did not help there.
# GROUP_M = 16: the 132 programs resident at once cover 16 x 8.25 tiles (2048 rows x 2112 columns)
# instead of 8 x 16.5; steady-state pairs on H100 gave +1-3 % over 8 at K = 1024 and 4096
# (docs/perf-notes.md, entry 13).
CONFIG = GemmConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, STAGES=3, num_warps=8, GROUP_M=16)

__all__ = ["CONFIG", "compile_specs", "pipelined_kernel", "prepare", "unsupported_reason"]


@gluon.jit
def pipelined_kernel(
    a_desc,
    b_desc,
    c_desc,
    MMA: gl.constexpr,
    B_KMAJOR: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    M = c_desc.shape[0]
    N = c_desc.shape[1]
    k_steps = gl.cdiv(a_desc.shape[1], BLOCK_K)

    pid_m, pid_n = grouped_tile(gl.program_id(0), gl.cdiv(M, BLOCK_M), gl.cdiv(N, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N

    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)

    # Prologue: loads for steps 0 .. STAGES-2 (predicated off past the last K step).
    for s in gl.static_range(STAGES - 1):
        load_step(
            a_desc,
            b_desc,
            off_m,
            off_n,
            s * BLOCK_K,
            ready.index(s),
            a_bufs.index(s),
            b_bufs.index(s),
            B_KMAJOR,
            pred=s < k_steps,
        )

    mma = MMA.initialize(dtype, BLOCK_M, BLOCK_N, gl.num_warps())
    for k in range(k_steps):
        slot = k % STAGES
        mbarrier.wait(ready.index(slot), (k // STAGES) & 1)
        mma = mma.issue(a_bufs.index(slot), b_operand(b_bufs.index(slot), B_KMAJOR))
        mma = mma.wait(1)  # retires MMA k-1, whose stage is the one refilled next
        nxt = k + STAGES - 1
        load_step(
            a_desc,
            b_desc,
            off_m,
            off_n,
            nxt * BLOCK_K,
            ready.index(nxt % STAGES),
            a_bufs.index(nxt % STAGES),
            b_bufs.index(nxt % STAGES),
            B_KMAJOR,
            pred=nxt < k_steps,
        )
    acc, mma = mma.take_result()
    invalidate_barriers(ready, STAGES)

    c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
    store_tile(c_desc, c_smem, acc, off_m, off_n)
    tma.store_wait(0)


def prepare(a, b, out, cfg: GemmConfig | None = None) -> Launch:
    from ..api import capability_of

    cap = capability_of(a.device)
    mma = select_mma(cap)
    cfg = cfg or rung_config("Pipelined", cap, CONFIG)
    a_desc, b_desc, c_desc, kmajor = make_descriptors(a, b, out, cfg)
    M, N = out.shape
    grid = (triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N),)

    def fn():
        pipelined_kernel[grid](
            a_desc, b_desc, c_desc, mma, kmajor, cfg.GROUP_M, cfg.STAGES, num_warps=cfg.num_warps
        )

    return Launch(fn, cfg.table())


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    if unsupported_reason(capability):
        return []
    mma = select_mma(capability)
    cfg = rung_config("Pipelined", capability, CONFIG)
    names = ("MMA", "B_KMAJOR", "GROUP_M", "STAGES")
    return [
        CompileSpec(
            "Pipelined",
            f"pipelined_kernel {cfg.label} B{'t' if kmajor else 'row'}",
            pipelined_kernel,
            gemm_signature(cfg, dtype, kmajor) | dict.fromkeys(names, "constexpr"),
            dict(zip(names, (mma, kmajor, cfg.GROUP_M, cfg.STAGES), strict=True)),
            {"num_warps": cfg.num_warps},
        )
        for kmajor in (False, True)
    ]
