"""Rung routed: the gemv rung that routes itself, for a mixture-of-experts layer's decode step.

The idea: in a decode step a token's k experts are k handfuls of weight rows, a read and a few
FMAs (kernels/gemv.py). The sorted grouped path spends more on getting there than on the read:
sorting the (token, expert) pairs by expert, the offsets, gathering the tokens and scattering
back take a dozen small launches and a few copies a layer around its two GEMMs, and in decode the
host's launches are the step's time (docs/perf-notes.md, entry 67: a 4-layer Qwen3-MoE-shaped
model's generate makes ~300 launches a token, and the experts' share decided the row). So move
the routing into the kernels: each program reads its pair's expert id straight from the
router's top_k_index and streams that expert's rows, as gemv streams a weight row:

* `routed_gate_up_kernel`, program (pair s, row n of the intermediate size I): h[s, n] =
  silu(x[s // k] . W[e, n]) * (x[s // k] . W[e, I + n]) for e = top_k_index[s]: the gate and up
  rows of transformers' [E, 2I, H] gate_up_proj and the SwiGLU, with the token read by index.
* `routed_down_kernel`, program (token t, row n of H): out[t, n] = sum over j < k of
  top_k_weights[t, j] * (h[t k + j] . D[e_j, n]) for D = the [E, H, I] down_proj: the routing
  weights and the sum over a token's experts, which the sorted path does with three more
  launches, in the kernel's fp32 accumulator.

Two launches a layer, no sort, no copy, and nothing read to the host (CUDA-graph capturable).
Pairs whose id is at or past E (expert parallelism's experts held elsewhere) read nothing and add
zero.

The pairs of one row run side by side (the pair is the grid's fastest axis), so where two of
them share an expert the row comes from HBM once and from L2 for the other: the bytes are the
touched experts' rows. The cost is the FMAs and the L2 reads, once per pair: with many pairs per
expert the sorted path's tiles (one weight read for all of an expert's tokens, on tensor cores)
win, so `gluon_survey.experts` runs this one only for at most `experts.ROUTED_PAIRS_PER_EXPERT`
pairs per expert on average, and only where both projections' K fits one chunk (what the
surveyed models' H and I do).

Its layout and loads are gemv's one-chunk row (`gemv.one_chunk`): one weight row a program in a
single chunk of K, two 16-byte loads a thread, as many warps side by side along K as that takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch import CompileSpec
from . import gemv
from .plan import Launcher

__all__ = [
    "RoutedPlan",
    "compile_specs",
    "max_k",
    "plan",
    "routed_down_kernel",
    "routed_gate_up_kernel",
    "unsupported_reason",
]

_VECTOR_BITS = gl.constexpr(8 * gemv.VECTOR_BYTES)


def max_k(elem_bytes: int = 2) -> int:
    """The deepest K (H for the gate and up rows, I for the down rows) one program takes."""
    return gemv.one_chunk_max_k(elem_bytes)


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """Plain loads and FMAs, as gemv: Hopper and Blackwell."""
    return gemv.unsupported_reason(capability)


@gluon.jit
def _row_dot(v_ptr, w_ptr, cols, K, valid):
    """[BLOCK_K] fp32 partial products of the vector at v_ptr and the weight row at w_ptr, zero
    past K and where not `valid` (then nothing is read)."""
    mask = (cols < K) & valid
    v = gl.load(v_ptr + cols, mask=mask, other=0.0).to(gl.float32)
    w = gl.load(w_ptr + cols, mask=mask, other=0.0).to(gl.float32)
    return v * w


@gluon.jit
def routed_gate_up_kernel(
    x_ptr,
    w_ptr,
    ids_ptr,
    h_ptr,
    E,
    I,
    K,
    TOPK,
    stride_x,
    stride_we,
    stride_h,
    BLOCK_K: gl.constexpr,
):
    """h[s, n] = silu(x[t] . w[e, n]) * (x[t] . w[e, I + n]), s = program_id(0), t = s // TOPK,
    e = ids[s], n = program_id(1); w [E, 2I, K] with rows of K contiguous elements (row stride
    K), expert stride stride_we; 0 where e >= E."""
    VEC: gl.constexpr = _VECTOR_BITS // w_ptr.dtype.element_ty.primitive_bitwidth
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [gl.num_warps()], [0])
    s = gl.program_id(0)
    n = gl.program_id(1)
    e = gl.load(ids_ptr + s)
    valid = (e >= 0) & (e < E)
    cols = gl.arange(0, BLOCK_K, layout=layout)
    x_row = x_ptr + (s // TOPK).to(gl.int64) * stride_x
    expert = w_ptr + e.to(gl.int64) * stride_we
    gate = gl.sum(_row_dot(x_row, expert + n.to(gl.int64) * K, cols, K, valid), axis=0)
    up = gl.sum(_row_dot(x_row, expert + (I + n).to(gl.int64) * K, cols, K, valid), axis=0)
    out = gate / (1.0 + gl.exp(-gate)) * up
    gl.store(h_ptr + s.to(gl.int64) * stride_h + n, out.to(h_ptr.dtype.element_ty))


@gluon.jit
def routed_down_kernel(
    h_ptr,
    w_ptr,
    ids_ptr,
    rw_ptr,
    out_ptr,
    E,
    K,
    TOPK,
    stride_h,
    stride_we,
    stride_out,
    BLOCK_K: gl.constexpr,
):
    """out[t, n] = sum_{j < TOPK} rw[t TOPK + j] * (h[t TOPK + j] . w[e_j, n]), t = program_id(0),
    n = program_id(1), e_j = ids[t TOPK + j]; w [E, N, K] with rows of K contiguous elements,
    expert stride stride_we; pairs with e_j >= E add 0."""
    VEC: gl.constexpr = _VECTOR_BITS // w_ptr.dtype.element_ty.primitive_bitwidth
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [gl.num_warps()], [0])
    t = gl.program_id(0)
    n = gl.program_id(1)
    cols = gl.arange(0, BLOCK_K, layout=layout)
    acc = gl.zeros([BLOCK_K], gl.float32, layout)
    for j in range(TOPK):
        s = t * TOPK + j
        e = gl.load(ids_ptr + s)
        valid = (e >= 0) & (e < E)
        weight = gl.load(rw_ptr + s).to(gl.float32)
        row = w_ptr + e.to(gl.int64) * stride_we + n.to(gl.int64) * K
        acc += _row_dot(h_ptr + s.to(gl.int64) * stride_h, row, cols, K, valid) * weight
    out = gl.sum(acc, axis=0)
    gl.store(out_ptr + t.to(gl.int64) * stride_out + n, out.to(out_ptr.dtype.element_ty))


@dataclass(frozen=True)
class RoutedPlan:
    """The two launches of one experts layer's call for one set of shapes, strides, dtypes and
    16-byte alignments (what Triton specialized the kernels on): `gluon_survey.moe` keeps one per
    such key. `launch` takes the tensors and allocates nothing but the outputs."""

    gate_up: Launcher
    down: Launcher
    gate_up_args: tuple[int, ...]
    down_args: tuple[int, ...]
    T: int
    S: int
    I: int
    H: int

    def launch(self, x, w_gate_up, w_down, ids, rw) -> torch.Tensor:
        h = torch.empty(self.S, self.I, dtype=x.dtype, device=x.device)
        out = torch.empty(self.T, self.H, dtype=x.dtype, device=x.device)
        self.gate_up(x, w_gate_up, ids, h, *self.gate_up_args)
        self.down(h, w_down, ids, rw, out, *self.down_args)
        return out


def _tile(K: int, elem_bytes: int) -> tuple[int, int]:
    """(BLOCK_K, num_warps): gemv's one-chunk row for K."""
    cfg = gemv.one_chunk(K, elem_bytes)
    return cfg.BLOCK_K, cfg.num_warps


def plan(x, w_gate_up, w_down, ids) -> RoutedPlan:
    """The plan for x [T, H], w_gate_up [E, 2I, H] and w_down [E, H, I] (contiguous) and ids
    [T, k] (contiguous), already checked by the caller (`gluon_survey.moe.routed_experts`)."""
    T, H = x.shape
    E, two_i, _ = w_gate_up.shape
    I = two_i // 2
    S, topk = ids.numel(), ids.shape[-1]
    elem = x.element_size()
    block_h, warps_h = _tile(H, elem)
    block_i, warps_i = _tile(I, elem)
    gate_up = Launcher(routed_gate_up_kernel, (S, I), {"BLOCK_K": block_h}, warps_h)
    down = Launcher(routed_down_kernel, (T, H), {"BLOCK_K": block_i}, warps_i)
    return RoutedPlan(
        gate_up,
        down,
        (E, I, H, topk, x.stride(0), w_gate_up.stride(0), I),
        (E, I, topk, I, w_down.stride(0), H),
        T,
        S,
        I,
        H,
    )


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    """Both kernels at the surveyed models' H and I (Qwen3-30B-A3B 2048 and 768, Mixtral-8x7B 4096
    and 14336, DeepSeek-V3 7168 and 2048) and the deepest one chunk takes, with the integers a
    launch specializes as multiples of 16 (`divisible`)."""
    if unsupported_reason(capability) or dtype not in ("float16", "bfloat16"):
        return []
    ty = {"float16": "*fp16", "bfloat16": "*bf16"}[dtype]
    specs = []
    for K in (768, 2048, 4096, 7168, 14336, max_k()):
        block_k, warps = _tile(K, 2)
        gate_up = {"x_ptr": ty, "w_ptr": ty, "ids_ptr": "*i64", "h_ptr": ty}
        gate_up |= dict.fromkeys(("E", "I", "K", "TOPK", "stride_x", "stride_we", "stride_h"), "i32")
        down = {"h_ptr": ty, "w_ptr": ty, "ids_ptr": "*i64", "rw_ptr": ty, "out_ptr": ty}
        down |= dict.fromkeys(("E", "K", "TOPK", "stride_h", "stride_we", "stride_out"), "i32")
        for name, kernel, signature in (
            ("routed_gate_up_kernel", routed_gate_up_kernel, gate_up),
            ("routed_down_kernel", routed_down_kernel, down),
        ):
            specs.append(
                CompileSpec(
                    "routed",
                    f"{name} K={K} BLOCK_K={block_k} w{warps}",
                    kernel,
                    signature | {"BLOCK_K": "constexpr"},
                    {"BLOCK_K": block_k},
                    {"num_warps": warps},
                    divisible=tuple(k for k in signature if k not in ("E", "I", "TOPK")),
                )
            )
    return specs
