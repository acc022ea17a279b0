"""Rung grouped-gemv: the grouped GEMM at one token, as gemv reads a weight.

The idea: at one token a mixture-of-experts layer's S = top-k token-slots each go to an expert of
their own, so the grouped GEMM is S matrix-vector products, a read of the touched experts' rows
and a few FMAs. The swap-AB kernel (kernels/grouped_swapab.py) reads them as 64-row weight slabs,
one persistent program an SM: Qwen3-30B-A3B's gate_up at one token is 8 experts x 24 slabs = 192
tiles of 256 KB for 132 SMs, and its down projection 256 tiles of 96 KB (K = 768: three K steps a
tile). Those one-token cells ran at 0.41-0.72 of rung 0's bandwidth (GPT-OSS-20B's 0.63-0.79;
docs/perf-notes.md, entry 69), where the same weight bytes read as many programs of a few KB each
reach 0.93-0.97 of it (results/experiments/h100-read-floor, entry 31). So read them that way:
program (slot s, ROWS weight rows) finds slot s's expert from the device-side offsets, reads
those rows of the expert's weight in one chunk of K, as gemv's one-chunk row (kernels/gemv.py)
does, and multiplies them by x[s], held in registers for all ROWS rows.

* The expert of a slot: each program loads the E offsets once as a vector (EXPERTS_PAD entries, a
  lane's few), clamped to [0, S] by the grouped kernel's own `_expert_ranges`, and takes the first expert
  e with offs[e-1] <= s < offs[e]: a compare and a min reduction, no host sync, so a capture
  replays with other offsets. A slot no expert owns (at or past offs[-1]) reads and writes
  nothing; with decreasing offsets a slot two experts claim goes to the first.
* Slots of one expert read its rows once each: the slot is the grid's fastest axis, so the
  programs that read the same rows run side by side and all but the first find them in L2. That
  is the cost of this design past one slot an expert (many slots of one expert re-read its rows
  from L2 once per slot, and multiply on the FMA units): it is for decode's one to a few rows an
  expert, and the swap-AB kernel's tiles are the path above.
* Rows past N and columns past K are masked (no read, no write), so any N and K take it; K is
  one chunk (`gemv.one_chunk`: at most 16384 in fp16/bf16, which every surveyed model's H and I
  are within).

ROWS = 4 a program, as the routed kernels (kernels/routed.py) measured best for the same loads
(docs/perf-notes.md, entry 68: four rows 0.91-0.97x one row's time at Qwen3's 2-24 tokens).

Status, measured (an H200, GPU time, bf16, the 72 decode cells of results/h100-moe-decode/
shapes.csv; results/h200-moe-decode, docs/perf-notes.md entries 81 and 83): correct on every
16-bit case of the grouped GPU tests, and slower than the swap-AB kernel at one token on 17 of
24 cells (0.62-0.97x its speed: 0.70x on Mixtral-8x7B's down, K = 14336, where one chunk of K
per program leaves few loads in flight), within 1.5 % on 5 and faster on 2 (Qwen3-30B-A3B's
gate_up, 1.04-1.07x). On Qwen3's one-token cells both kernels reach only 0.30-0.67 of rung 0: a
fixed cost of 6-7 µs against 6-12 µs of bytes, which no way of reading the bytes removes.
`grouped_matmul` does not choose it; it stays on the ladder as the measured answer to "read the
experts as gemv reads a weight". 16-bit operands only.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch import CompileSpec, Launch, Scales, Target
from . import gemv
from .gemv import _VECTOR_BITS
from .grouped import _POINTER_TYPES, MAX_EXPERTS, _expert_ranges, experts_pad
from .plan import Launcher

__all__ = [
    "CONFIG",
    "GroupedGemvConfig",
    "GroupedGemvPlan",
    "compile_specs",
    "grouped_gemv_kernel",
    "plan",
    "prepare",
    "unsupported_reason",
]


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """Plain loads and FMAs, as gemv: Hopper and Blackwell."""
    return gemv.unsupported_reason(capability)


@gluon.jit
def _expert_of(offs, s, S, E, EXPERTS_PAD: gl.constexpr):
    """The first expert e whose clamped rows offs[e-1] .. offs[e] - 1 hold slot s; E if none."""
    e, starts, ends = _expert_ranges(offs, S, E, EXPERTS_PAD)
    owner = (starts <= s) & (s < ends) & (e < E)
    return gl.min(gl.where(owner, e, E), axis=0)


@gluon.jit
def grouped_gemv_kernel(
    x_ptr,
    w_ptr,
    offs,
    out_ptr,
    S,
    N,
    K,
    E,
    stride_we,
    ROWS: gl.constexpr,
    BLOCK_K: gl.constexpr,
    EXPERTS_PAD: gl.constexpr,
):
    """out[s, n] = x[s] . w[e, n] for the ROWS rows n of program_id(1), s = program_id(0), e the
    expert whose rows of x hold s (`_expert_of`); x [S, K] and out [S, N] row-major, w [E, N, K]
    with rows of K contiguous elements and expert stride stride_we. Nothing for a slot no expert
    owns, nor for rows n >= N."""
    VEC: gl.constexpr = _VECTOR_BITS // w_ptr.dtype.element_ty.primitive_bitwidth
    # [ROWS, BLOCK_K]: a warp's 32 vectors and the warps side by side along K, each thread holding
    # its columns of all ROWS rows, so the token's chunk in its registers serves every row.
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [1, gl.num_warps()], [1, 0])
    s = gl.program_id(0)
    e = _expert_of(offs, s, S, E, EXPERTS_PAD)
    valid = e < E
    rows = gl.program_id(1) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
    in_k = cols < K
    x = gl.load(x_ptr + s.to(gl.int64) * K + cols, mask=in_k & valid, other=0.0).to(gl.float32)
    live = (rows < N) & valid
    offsets = gl.expand_dims(rows.to(gl.int64) * K, 1) + gl.expand_dims(cols, 0)
    mask = gl.expand_dims(live, 1) & gl.expand_dims(in_k, 0)
    w = gl.load(w_ptr + e.to(gl.int64) * stride_we + offsets, mask=mask, other=0.0).to(gl.float32)
    out = gl.sum(w * gl.expand_dims(x, 0), axis=1)
    gl.store(out_ptr + s.to(gl.int64) * N + rows, out.to(out_ptr.dtype.element_ty), mask=live)


@dataclass(frozen=True)
class GroupedGemvConfig:
    """Weight rows a program (a power of two; the token's chunk in registers serves them all).
    BLOCK_K and the warps are gemv's one-chunk row for K."""

    ROWS: int = 4

    def __post_init__(self):
        if self.ROWS < 1 or self.ROWS & (self.ROWS - 1):
            raise ValueError(f"ROWS ({self.ROWS}) must be a power of two")


CONFIG = GroupedGemvConfig()


@dataclass(frozen=True)
class GroupedGemvPlan:
    """The launch of one problem (x's [S, K], the weight's [E, K, N] view, the dtypes), as
    `kernels.plan.GroupedPlan` for the tile kernels: `launch(x, w, offs, out)` on these tensors'
    like, any offsets; `config` is what a results row records."""

    launcher: Launcher
    args: tuple[int, int, int, int, int]  # S, N, K, E, the weight's expert stride
    config: dict

    def launch(self, x, w, offs, out, scales: Scales | None = None) -> None:
        self.launcher(x, w, offs, out, *self.args)

    def bind(self, x, w, offs, out, scales: Scales | None = None) -> Launch:
        return Launch(lambda: self.launch(x, w, offs, out), self.config)


def _tile(K: int) -> gemv.GemvConfig:
    """gemv's one-chunk row for K, or a ValueError where K is deeper than one chunk takes."""
    most = gemv.one_chunk_max_k(2)
    if most < K:
        raise ValueError(
            f"grouped-gemv reads K in one chunk, at most {most} (K is {K}); "
            "use grouped_matmul (grouped-auto) or the grouped-swapab mode"
        )
    return gemv.one_chunk(K, 2)


def plan(
    x, w, target: Target, cfg: GroupedGemvConfig | None = None, scales: Scales | None = None
) -> GroupedGemvPlan:
    """The plan of out[rows of e] = x[rows of e] @ w[e] on the operands `gluon_survey.grouped`
    checked (x [S, K] row-major, w the [E, K, N] transpose view of a contiguous [E, N, K] weight,
    16-bit: the registry's mode takes no fp8), grid (S, cdiv(N, ROWS)). K deeper than one chunk
    is a ValueError naming the modes that take it."""
    reason = unsupported_reason(target.capability)
    if reason:
        raise RuntimeError(reason)
    if scales is not None:
        raise ValueError("grouped-gemv takes fp16 and bf16 operands, not fp8")
    cfg = cfg or CONFIG
    S, K = x.shape
    E, _, N = w.shape
    tile = _tile(K)
    values = {"ROWS": cfg.ROWS, "BLOCK_K": tile.BLOCK_K, "EXPERTS_PAD": experts_pad(E)}
    launcher = Launcher(grouped_gemv_kernel, (S, triton.cdiv(N, cfg.ROWS)), values, tile.num_warps)
    config = {"BLOCK_M": 1, "BLOCK_N": cfg.ROWS, "BLOCK_K": tile.BLOCK_K, "num_warps": tile.num_warps}
    return GroupedGemvPlan(launcher, (S, N, K, E, w.stride(0)), config | {"mma": "none (FMA)"})


def prepare(
    x, w, offs, out, target: Target, cfg: GroupedGemvConfig | None = None, scales: Scales | None = None
) -> Launch:
    """A ready launch of `plan`'s plan on these tensors (what the driver times)."""
    return plan(x, w, target, cfg, scales).bind(x, w, offs, out)


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    """The kernel at the surveyed models' H and I (Qwen3-30B-A3B 2048 and 768, GPT-OSS-20B 2880,
    Mixtral-8x7B 4096 and 14336) and the deepest one chunk takes, for the most experts
    (MAX_EXPERTS), with the integers a launch specializes as multiples of 16 (`divisible`): none
    where the kernel does not run, or for other dtypes."""
    if unsupported_reason(capability) or dtype not in _POINTER_TYPES:
        return []
    ty = _POINTER_TYPES[dtype]
    signature = {"x_ptr": ty, "w_ptr": ty, "offs": "*i32", "out_ptr": ty}
    signature |= dict.fromkeys(("S", "N", "K", "E", "stride_we"), "i32")
    specs = []
    for K in (768, 2048, 2880, 4096, 14336, gemv.one_chunk_max_k(2)):
        tile = _tile(K)
        values = {"ROWS": CONFIG.ROWS, "BLOCK_K": tile.BLOCK_K, "EXPERTS_PAD": MAX_EXPERTS}
        specs.append(
            CompileSpec(
                "grouped-gemv",
                f"grouped_gemv_kernel K={K} ROWS={CONFIG.ROWS} BLOCK_K={tile.BLOCK_K} w{tile.num_warps}",
                grouped_gemv_kernel,
                signature | dict.fromkeys(values, "constexpr"),
                values,
                {"num_warps": tile.num_warps},
                divisible=("x_ptr", "w_ptr", "offs", "out_ptr", "K", "stride_we"),
            )
        )
    return specs
