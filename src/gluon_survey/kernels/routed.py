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

Its loads are gemv's one-chunk row (`gemv.one_chunk`): a row in a single chunk of K, two 16-byte
loads a thread, as many warps side by side along K as that takes. A program takes ROWS rows of one
expert (`RoutedConfig`: four by default) and keeps its columns of the token's row (gate_up) or of
the pair's h row (down) in registers for all of them: with one row a program the token's bytes
came from L2 once per row, as many as the weight's, and Mixtral-8x7B's 4-token layer took
1.26-1.30x the sorted path's kernel time (1.13x with four rows; docs/perf-notes.md, entries 67
and 68).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch import CompileSpec
from . import gemv
from .plan import Launcher

__all__ = [
    "CONFIG",
    "MOST_ROWS",
    "RoutedConfig",
    "RoutedPlan",
    "compile_specs",
    "max_k",
    "plan",
    "routed_down_kernel",
    "routed_gate_up_kernel",
    "rows_for",
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
def _rows(w_rows, rows, cols, K, valid):
    """The [ROWS, BLOCK_K] fp32 tile of weight rows `rows` (row stride K) from w_rows: zero past K
    and where not `valid` (then nothing is read). The host picks ROWS to divide the row count."""
    offsets = gl.expand_dims(rows.to(gl.int64) * K, 1) + gl.expand_dims(cols, 0)
    mask = gl.expand_dims((cols < K) & valid, 0)
    return gl.load(w_rows + offsets, mask=mask, other=0.0).to(gl.float32)


@gluon.jit
def _vector(v_ptr, cols, K, valid):
    """[1, BLOCK_K] fp32: the vector at v_ptr, zero past K and where not `valid`."""
    v = gl.load(v_ptr + cols, mask=(cols < K) & valid, other=0.0).to(gl.float32)
    return gl.expand_dims(v, 0)


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
    ROWS: gl.constexpr,
    BLOCK_K: gl.constexpr,
):
    """h[s, n] = silu(x[t] . w[e, n]) * (x[t] . w[e, I + n]) for the ROWS rows n of program_id(1),
    s = program_id(0), t = s // TOPK, e = ids[s]; w [E, 2I, K] with rows of K contiguous elements
    (row stride K), expert stride stride_we; 0 where e >= E."""
    VEC: gl.constexpr = _VECTOR_BITS // w_ptr.dtype.element_ty.primitive_bitwidth
    # [ROWS, BLOCK_K]: a warp's 32 vectors and the warps side by side along K, each thread holding
    # its columns of all ROWS rows, so the token's chunk in its registers serves every row.
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [1, gl.num_warps()], [1, 0])
    s = gl.program_id(0)
    rows = gl.program_id(1) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
    e = gl.load(ids_ptr + s)
    valid = (e >= 0) & (e < E)
    x = _vector(x_ptr + (s // TOPK).to(gl.int64) * stride_x, cols, K, valid)
    expert = w_ptr + e.to(gl.int64) * stride_we
    gate = gl.sum(_rows(expert, rows, cols, K, valid) * x, axis=1)
    up = gl.sum(_rows(expert + I.to(gl.int64) * K, rows, cols, K, valid) * x, axis=1)
    out = gate / (1.0 + gl.exp(-gate)) * up
    gl.store(h_ptr + s.to(gl.int64) * stride_h + rows, out.to(h_ptr.dtype.element_ty))


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
    ROWS: gl.constexpr,
    BLOCK_K: gl.constexpr,
):
    """out[t, n] = sum_{j < TOPK} rw[t TOPK + j] * (h[t TOPK + j] . w[e_j, n]) for the ROWS rows n
    of program_id(1), t = program_id(0), e_j = ids[t TOPK + j]; w [E, N, K] with rows of K
    contiguous elements, expert stride stride_we; pairs with e_j >= E add 0."""
    VEC: gl.constexpr = _VECTOR_BITS // w_ptr.dtype.element_ty.primitive_bitwidth
    # [ROWS, BLOCK_K]: a warp's 32 vectors and the warps side by side along K, each thread holding
    # its columns of all ROWS rows, so the token's chunk in its registers serves every row.
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [1, gl.num_warps()], [1, 0])
    t = gl.program_id(0)
    rows = gl.program_id(1) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
    acc = gl.zeros([ROWS, BLOCK_K], gl.float32, layout)
    for j in range(TOPK):
        s = t * TOPK + j
        e = gl.load(ids_ptr + s)
        valid = (e >= 0) & (e < E)
        h = _vector(h_ptr + s.to(gl.int64) * stride_h, cols, K, valid) * gl.load(rw_ptr + s).to(gl.float32)
        acc += _rows(w_ptr + e.to(gl.int64) * stride_we, rows, cols, K, valid) * h
    out = gl.sum(acc, axis=1)
    gl.store(out_ptr + t.to(gl.int64) * stride_out + rows, out.to(out_ptr.dtype.element_ty))


@dataclass(frozen=True)
class RoutedConfig:
    """The most weight rows a program takes, for each kernel: the token's (or the pair's h) row is
    read once and multiplied into all of them. A plan takes fewer where the register file says so
    (`MOST_ROWS`) or where fewer divide the rows (`rows_for`). BLOCK_K and the warps are gemv's
    one-chunk row for K."""

    GATE_UP_ROWS: int = 4
    DOWN_ROWS: int = 4

    def __post_init__(self):
        for name in ("GATE_UP_ROWS", "DOWN_ROWS"):
            rows = getattr(self, name)
            if rows < 1 or rows & (rows - 1):
                raise ValueError(f"{name} ({rows}) must be a power of two")


# The most rows a program of this many warps holds without spilling on sm_90a (compiled, bf16:
# down keeps a [ROWS, BLOCK_K] fp32 sum across the pairs, 64 registers a thread at 2 rows on 32
# warps and 100 at 4 on 16; gate_up holds two tiles, 54 at 4 rows on 32 warps); 8 elsewhere.
MOST_ROWS = {"gate_up": {32: 4}, "down": {32: 2, 16: 4}}


def rows_for(kernel: str, most: int, rows: int, warps: int) -> int:
    """The rows a program of `kernel` takes: at most `most`, at most what `warps` warps hold, and
    a power of two dividing the `rows` it covers (so no program has a partial tile)."""
    take = min(most, MOST_ROWS[kernel].get(warps, 8))
    while rows % take:
        take //= 2
    return take


# Four rows a program (two in Mixtral-8x7B's down, on 32 warps). Both kernels' GPU time a layer call
# on the H100 against one row: 0.91-0.97 at Qwen3-30B-A3B's 2 to 24 tokens (1.01 at one), 0.84-0.95
# at Mixtral-8x7B's 1 to 8. Of 1, 2, 4 and 8 rows, four was the fastest at Qwen3's counts from 2 to
# 32 tokens; at Mixtral's, 2 or 8 rows ran 1-6 % faster than 4 (docs/perf-notes.md, entry 68;
# results/experiments/h100-routed-rows).
CONFIG = RoutedConfig()


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


def plan(x, w_gate_up, w_down, ids, config: RoutedConfig | None = None) -> RoutedPlan:
    """The plan for x [T, H], w_gate_up [E, 2I, H] and w_down [E, H, I] (contiguous) and ids
    [T, k] (contiguous), already checked by the caller (`gluon_survey.moe.routed_experts`);
    `config` defaults to CONFIG."""
    cfg = config or CONFIG
    T, H = x.shape
    E, two_i, _ = w_gate_up.shape
    I = two_i // 2
    S, topk = ids.numel(), ids.shape[-1]
    elem = x.element_size()
    block_h, warps_h = _tile(H, elem)
    block_i, warps_i = _tile(I, elem)
    rows_gu = rows_for("gate_up", cfg.GATE_UP_ROWS, I, warps_h)
    rows_d = rows_for("down", cfg.DOWN_ROWS, H, warps_i)
    gate_up = Launcher(
        routed_gate_up_kernel, (S, triton.cdiv(I, rows_gu)), {"ROWS": rows_gu, "BLOCK_K": block_h}, warps_h
    )
    down = Launcher(
        routed_down_kernel, (T, triton.cdiv(H, rows_d)), {"ROWS": rows_d, "BLOCK_K": block_i}, warps_i
    )
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


def compile_specs(
    capability: tuple[int, int], dtype: str = "float16", config: RoutedConfig | None = None
) -> list[CompileSpec]:
    """Both kernels at the surveyed models' H and I (Qwen3-30B-A3B 2048 and 768, Mixtral-8x7B 4096
    and 14336, DeepSeek-V3 7168 and 2048) and the deepest one chunk takes, with `config`'s rows
    (CONFIG's by default) and the integers a launch specializes as multiples of 16 (`divisible`)."""
    if unsupported_reason(capability) or dtype not in ("float16", "bfloat16"):
        return []
    cfg = config or CONFIG
    ty = {"float16": "*fp16", "bfloat16": "*bf16"}[dtype]
    specs = []
    for K in (768, 2048, 4096, 7168, 14336, max_k()):
        block_k, warps = _tile(K, 2)
        gate_up = {"x_ptr": ty, "w_ptr": ty, "ids_ptr": "*i64", "h_ptr": ty}
        gate_up |= dict.fromkeys(("E", "I", "K", "TOPK", "stride_x", "stride_we", "stride_h"), "i32")
        down = {"h_ptr": ty, "w_ptr": ty, "ids_ptr": "*i64", "rw_ptr": ty, "out_ptr": ty}
        down |= dict.fromkeys(("E", "K", "TOPK", "stride_h", "stride_we", "stride_out"), "i32")
        for name, kernel, signature, rows in (
            (
                "routed_gate_up_kernel",
                routed_gate_up_kernel,
                gate_up,
                rows_for("gate_up", cfg.GATE_UP_ROWS, 1024, warps),
            ),
            ("routed_down_kernel", routed_down_kernel, down, rows_for("down", cfg.DOWN_ROWS, 1024, warps)),
        ):
            specs.append(
                CompileSpec(
                    "routed",
                    f"{name} K={K} ROWS={rows} BLOCK_K={block_k} w{warps}",
                    kernel,
                    signature | {"ROWS": "constexpr", "BLOCK_K": "constexpr"},
                    {"ROWS": rows, "BLOCK_K": block_k},
                    {"num_warps": warps},
                    divisible=tuple(k for k in signature if k not in ("E", "I", "TOPK")),
                )
            )
    return specs
