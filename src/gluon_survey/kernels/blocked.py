"""Rung 1, Blocked: one output tile per program, one K step at a time.

The idea: the plainest kernel that uses the tensor cores the way Hopper wants. Each program owns
one BLOCK_M x BLOCK_N tile of C; per K step it TMA-loads an A and a B tile into shared memory,
waits on an mbarrier for both, runs the MMA synchronously, and only then asks for the next step.
The copy engine and the tensor cores never work at the same time inside a program; the only
overlap comes from a second program on the same SM (occupancy 2), which is why the tile is small.

Measured on H100 80GB HBM3 (results/h100-ladder/ and -run2/, commit c63b779, steady-state clocks,
x cuBLAS timed alongside in alternating windows, fp16 / bf16): 0.81-0.83 / 0.81 at K = 512
falling to 0.63-0.64 / 0.62-0.64 at K = 16384, 421-489 TFLOP/s at every K; geomean 0.73-0.74 /
0.72-0.73 over two runs.
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
    load_step,
    make_descriptors,
    mbarrier,
    rung_config,
    select_mma,
    store_tile,
    tma,
    unsupported_reason,
)

# 64x256x128 with 4 warps and two programs per SM was the best blocked kernel of Triton's wgmma
# tutorial on Hopper; 2 x (64 + 256) x 128 x 2 B of operands + a 32 KB C tile = 112 KB per program.
CONFIG = GemmConfig(BLOCK_M=64, BLOCK_N=256, BLOCK_K=128, STAGES=1, num_warps=4, GROUP_M=8)

__all__ = ["CONFIG", "blocked_kernel", "compile_specs", "prepare", "unsupported_reason"]


@gluon.jit
def blocked_kernel(a_desc, b_desc, c_desc, MMA: gl.constexpr, B_KMAJOR: gl.constexpr, GROUP_M: gl.constexpr):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    M = c_desc.shape[0]
    N = c_desc.shape[1]
    K = a_desc.shape[1]

    pid_m, pid_n = grouped_tile(gl.program_id(0), gl.cdiv(M, BLOCK_M), gl.cdiv(N, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N

    a_buf = gl.allocate_shared_memory(dtype, a_desc.block_type.shape, a_desc.layout)
    b_buf = gl.allocate_shared_memory(dtype, b_desc.block_type.shape, b_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)

    mma = MMA.initialize(dtype, BLOCK_M, BLOCK_N, gl.num_warps())
    phase = 0
    for k in range(0, K, BLOCK_K):
        load_step(a_desc, b_desc, off_m, off_n, k, bar, a_buf, b_buf, B_KMAJOR)
        mbarrier.wait(bar, phase)
        phase ^= 1
        mma = mma.issue(a_buf, b_operand(b_buf, B_KMAJOR))
        mma = mma.wait(0)  # synchronous: a_buf/b_buf are free for the next step
    mbarrier.invalidate(bar)

    acc, mma = mma.take_result()
    c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
    store_tile(c_desc, c_smem, acc, off_m, off_n)
    tma.store_wait(0)


def prepare(a, b, out, cfg: GemmConfig | None = None) -> Launch:
    from ..api import capability_of

    cap = capability_of(a.device)
    mma = select_mma(cap)
    cfg = cfg or rung_config("Blocked", cap, CONFIG)
    a_desc, b_desc, c_desc, kmajor = make_descriptors(a, b, out, cfg)
    M, N = out.shape
    grid = (triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N),)

    def fn():
        blocked_kernel[grid](a_desc, b_desc, c_desc, mma, kmajor, cfg.GROUP_M, num_warps=cfg.num_warps)

    return Launch(fn, cfg.table())


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    if unsupported_reason(capability):
        return []
    mma = select_mma(capability)
    cfg = rung_config("Blocked", capability, CONFIG)
    return [
        CompileSpec(
            "Blocked",
            f"blocked_kernel {cfg.label} B{'t' if kmajor else 'row'}",
            blocked_kernel,
            gemm_signature(cfg, dtype, kmajor)
            | {"MMA": "constexpr", "B_KMAJOR": "constexpr", "GROUP_M": "constexpr"},
            {"MMA": mma, "B_KMAJOR": kmajor, "GROUP_M": cfg.GROUP_M},
            {"num_warps": cfg.num_warps},
        )
        for kmajor in (False, True)
    ]
