"""Correctness: inputs every provider shares, the fp32 reference, and the pass/fail rule.

Every mode is checked on the same inputs (`make_inputs` is deterministic in the seed, so each
provider's subprocess rebuilds the very same tensors) against `reference`, the fp32 product of
those low-precision inputs. A result passes when its relative Frobenius error is within
`tolerance(cublas_err, dtype)`, a bound relative to cuBLAS's own error on the same inputs.

The survey's dtypes are named in `DTYPE_SPECS`, the one table of what each one means:

    fp16, bf16  operands and result in that dtype, no scales; B "row" (default) or "t".
    fp8         float8_e4m3fn operands with per-tensor fp32 scales (one each for a and b), the
                result (a @ b) * scale_a * scale_b written as bf16; B "t" only (fp8 MMAs read both
                operands K-major).
    fp8-row     the same with row-wise scales: scale_a [M, 1] (one per row of A) and scale_b
                [1, N] (one per row of the [N, K] weight, i.e. per column of B).

A runs in A layout "row" (a row-major [M, K] matrix, every dtype) or, for fp16/bf16, "t" (the
transpose view of a [K, M] matrix, as in a weight's gradient grad^T @ x; `make_inputs`): fp8
runs with A row only (`A_T_FP8`).

Grouped shapes (`shapes.GroupedShape`, a mixture-of-experts layer's expert GEMMs) take
`make_grouped_inputs` and `grouped_reference`: x [S, K], the [E, K, N] transpose view of an
[E, N, K] weight and int32 offsets [E] whose per-expert counts are the routing's; the reference is
the fp32 product of each expert's rows with its weight, and the tolerance's yardstick is cuBLAS
called per expert (`gluon_survey.baselines.expert_loop`) on the same inputs. In fp8-row, x and
each expert's [N, K] weight are quantized row-wise as the dense fp8-row operands are: scale_x [S]
(one per token) and scale_w [E, N] (one per expert and output channel), torch._scaled_grouped_mm's
shapes; the reference is the dequantized product and the yardstick torch._scaled_mm per expert.
Per-tensor fp8 has no grouped form (`GROUPED_FP8`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from gluon_survey.baselines.expert_loop import expert_spans
from gluon_survey.driver.shapes import GroupedShape, Shape
from gluon_survey.launch import A_LAYOUTS, ALIGN, B_LAYOUTS

FP8 = torch.float8_e4m3fn  # the fp8 operands' type (gluon_survey.api.FP8)
FP8_MAX = torch.finfo(FP8).max  # 448: the largest e4m3 magnitude, what a tensor's (or row's) amax maps to


@dataclass(frozen=True)
class DtypeSpec:
    """What one `--dtype` name means for the driver."""

    name: str
    operand: torch.dtype  # a and b
    output: torch.dtype  # out; the tolerance's unit roundoff is this dtype's
    scaling: str | None = None  # fp8: "tensor" or "row" (`launch.SCALINGS`); None: no scales
    b_layouts: tuple[str, ...] = B_LAYOUTS  # the B layouts it runs in; the first is the default
    peak: str = ""  # the column of `hardware`'s peak table: which tensor-core rate bounds it
    a_layouts: tuple[str, ...] = A_LAYOUTS  # the A layouts it runs in

    @property
    def default_b_layout(self) -> str:
        return self.b_layouts[0]


DTYPE_SPECS: dict[str, DtypeSpec] = {
    s.name: s
    for s in (
        DtypeSpec("fp16", torch.float16, torch.float16, peak="fp16"),
        DtypeSpec("bf16", torch.bfloat16, torch.bfloat16, peak="bf16"),
        DtypeSpec("fp8", FP8, torch.bfloat16, "tensor", ("t",), peak="fp8", a_layouts=("row",)),
        DtypeSpec("fp8-row", FP8, torch.bfloat16, "row", ("t",), peak="fp8", a_layouts=("row",)),
    )
}

# Why an fp8 task has no A layout "t", one wording for `make_inputs`'s error and the worker's SKIPPED.
A_T_FP8 = (
    "fp8 runs with A layout row only: fp8 MMAs read A K-major, so every mode (cuBLAS fp8 too) would "
    "multiply a row-major copy of a transposed A; measure fp8 with --a-layout row"
)

# dtype name -> operand dtype (the names `--dtype` takes)
DTYPES: dict[str, torch.dtype] = {name: s.operand for name, s in DTYPE_SPECS.items()}

# Unit roundoff u = 2**-(mantissa bits + 1) of an OUTPUT dtype: the largest relative error of
# rounding to it (fp8's results are bf16, so its tolerance takes bf16's u).
UNIT_ROUNDOFF: dict[torch.dtype, float] = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}

TOLERANCE_RULE = (
    "rel_err <= 2 * cublas_err + unit_roundoff / 4, u of the output dtype (fp16 u = 2**-11, bf16 u = 2**-8; "
    "fp8 and fp8-row write bf16), cublas_err that of cuBLAS (torch._scaled_mm for fp8)"
)


def dtype_spec(dtype: str | torch.dtype) -> DtypeSpec:
    """The spec of a dtype name ('fp16', 'fp8-row', ...) or torch dtype (float8_e4m3fn is 'fp8',
    per-tensor scales); ValueError for anything else."""
    if isinstance(dtype, torch.dtype):
        for spec in DTYPE_SPECS.values():
            if spec.operand == dtype:
                return spec
        raise ValueError(f"unsupported dtype {dtype}; use one of {', '.join(DTYPES)}")
    try:
        return DTYPE_SPECS[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}") from None


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """'fp16' / 'bf16' / 'fp8' / 'fp8-row' (or a torch dtype) -> the operands' torch dtype;
    ValueError for anything else."""
    return dtype_spec(dtype).operand


def output_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The dtype of the product: the operands' for fp16/bf16, bf16 for fp8 (`api.result_dtype`)."""
    return dtype_spec(dtype).output


@dataclass(frozen=True)
class Inputs:
    """One input set: a [M, K], b [K, N], for fp8 the fp32 scales the kernel is given, and a bias
    [N] in the output's dtype where one is asked for (`make_inputs(bias=True)`).

    It unpacks as the operands, `a, b = make_inputs(...)`, as fp16/bf16 callers always have; an
    fp8 caller passes `**inputs.scales` on as well (to `api.prepare`, `reference`, ...), and a
    caller that may have a bias `**inputs.extras` (the scales and the bias)."""

    a: torch.Tensor
    b: torch.Tensor
    scale_a: torch.Tensor | None = None  # fp32: () per-tensor, [M, 1] row-wise
    scale_b: torch.Tensor | None = None  # fp32: () per-tensor, [1, N] row-wise
    bias: torch.Tensor | None = None  # [N], the output's dtype

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter((self.a, self.b))

    @property
    def scales(self) -> dict[str, torch.Tensor]:
        """{'scale_a': ..., 'scale_b': ...} for fp8, {} otherwise: keyword arguments to pass on."""
        if self.scale_a is None or self.scale_b is None:
            return {}
        return {"scale_a": self.scale_a, "scale_b": self.scale_b}

    @property
    def extras(self) -> dict[str, torch.Tensor]:
        """`scales`, and {'bias': ...} where the set has one: keyword arguments to pass on."""
        return self.scales if self.bias is None else self.scales | {"bias": self.bias}

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor of the set (for its size in bytes)."""
        return (self.a, self.b, *self.extras.values())

    @property
    def touched_bytes(self) -> int:
        """What one product reads: every tensor of the set."""
        return sum(_nbytes(t) for t in self.tensors)


def make_inputs(
    shape: Shape,
    dtype: str | torch.dtype,
    b_layout: str,
    seed: int,
    device: str | torch.device,
    bias: bool = False,
    a_layout: str = "row",
) -> Inputs:
    """a [M, K] and b [K, N]: standard normal values rounded to `dtype`, reproducible from `seed`.

    b_layout (`gluon_survey.launch.B_LAYOUTS`) "row" gives a contiguous [K, N] b; "t" gives the
    transpose view of a contiguous [N, K] weight, as `x @ w.t()` in a linear layer. Values are
    drawn in fp32 by a generator on `device` (a first, then b, or the weight) and then rounded, so
    the same (seed, device type) always yields the same tensors.

    fp8 / fp8-row (`quantize`): the same fp32 draws, quantized to e4m3 with the scale
    amax / 448 of the whole tensor (fp8) or of each row of A and of the [N, K] weight (fp8-row);
    B layout "t" only.

    bias: also a bias [N], standard normal values rounded to the output's dtype, drawn after the
    operands (which are the same with or without it).

    a_layout (`gluon_survey.launch.A_LAYOUTS`) "row" gives a contiguous [M, K] a; "t" gives the
    transpose view of a [K, M] matrix holding the same values, whose rows are padded to a multiple
    of 16 bytes (`transposed_a`) so that TMA can describe it, as in a weight's gradient grad^T @ x;
    fp16/bf16 only (`A_T_FP8`).
    """
    if b_layout not in B_LAYOUTS:
        raise ValueError(f"unknown B layout {b_layout!r}; use one of {', '.join(B_LAYOUTS)}")
    if a_layout not in A_LAYOUTS:
        raise ValueError(f"unknown A layout {a_layout!r}; use one of {', '.join(A_LAYOUTS)}")
    spec = dtype_spec(dtype)
    if a_layout not in spec.a_layouts:
        raise ValueError(A_T_FP8)
    if b_layout not in spec.b_layouts:
        raise ValueError(
            f"{spec.name} runs with B layout {' or '.join(spec.b_layouts)} only, not {b_layout!r} "
            "(fp8 MMAs read B K-major: the transpose view of an [N, K] weight)"
        )
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device, dtype=torch.float32)

    a = randn(shape.M, shape.K)
    w = randn(shape.K, shape.N) if b_layout == "row" else randn(shape.N, shape.K)  # b = w or w.t()
    extra = {"bias": randn(shape.N).to(output_dtype(dtype))} if bias else {}
    if spec.scaling is None:
        a, w = a.to(spec.operand), w.to(spec.operand)
        a = transposed_a(a) if a_layout == "t" else a
        return Inputs(a, w if b_layout == "row" else w.t(), **extra)
    a, scale_a = quantize(a, rowwise=spec.scaling == "row")
    w, scale_w = quantize(w, rowwise=spec.scaling == "row")
    scale_b = scale_w if spec.scaling == "tensor" else scale_w.reshape(1, shape.N)
    return Inputs(a, w.t(), scale_a, scale_b, **extra)


def transposed_a(a: torch.Tensor) -> torch.Tensor:
    """`a` [M, K] in A layout "t": the transpose view of a [K, M] copy whose row stride is padded to
    a multiple of 16 bytes (TMA's rule for a row stride; the padding is never read)."""
    M, K = a.shape
    per = ALIGN // a.element_size()
    buf = torch.empty(K, -(-M // per) * per, dtype=a.dtype, device=a.device).narrow(1, 0, M)
    buf.copy_(a.t())
    return buf.t()


# Why a grouped shape has no per-tensor fp8 task, one wording for the CLI's usage error and the
# worker's SKIPPED.
GROUPED_FP8 = (
    "grouped GEMMs run in fp8 with row-wise scales only (--dtype fp8-row: one scale per token and one "
    "per expert and output channel, as torch._scaled_grouped_mm, their baseline, takes them), not with "
    "per-tensor scales (fp8)"
)


@dataclass(frozen=True)
class GroupedInputs:
    """One input set of a grouped shape: x [S, K] (the tokens grouped by expert), w the [E, K, N]
    transpose view of a contiguous [E, N, K] weight, offs int32 [E] (cumulative ends, on x's
    device) and the per-expert row counts they come from; for fp8-row the fp32 scales scale_x [S]
    and scale_w [E, N]. It unpacks as the operands, `x, w, offs = inputs`, what a grouped mode's
    `prepare` takes before `out`; an fp8 caller passes `**inputs.scales` on as well (the keywords
    of `gluon_survey.grouped.prepare`)."""

    x: torch.Tensor
    w: torch.Tensor
    offs: torch.Tensor
    counts: tuple[int, ...]
    scale_x: torch.Tensor | None = None  # fp32 [S], one per token (fp8-row)
    scale_w: torch.Tensor | None = None  # fp32 [E, N], one per expert and output channel (fp8-row)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter((self.x, self.w, self.offs))

    @property
    def scales(self) -> dict[str, torch.Tensor]:
        """{'scale_x': ..., 'scale_w': ...} for fp8-row, {} otherwise: keyword arguments to pass on."""
        if self.scale_x is None or self.scale_w is None:
            return {}
        return {"scale_x": self.scale_x, "scale_w": self.scale_w}

    @property
    def extras(self) -> dict[str, torch.Tensor]:
        return self.scales  # no bias for grouped shapes

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor of the set (for its size in bytes)."""
        return (self.x, self.w, self.offs, *self.scales.values())

    @property
    def touched_bytes(self) -> int:
        """What one product reads: x, the offsets, the token scales and the weights (and channel
        scales) of the experts with rows (an expert without rows is never read, so it does not
        count towards the cold-L2 rotation)."""
        active = sum(1 for c in self.counts if c)
        E, K, N = self.w.shape
        per_expert = K * N * self.w.element_size()
        if self.scale_w is not None:
            per_expert += _nbytes(self.scale_w) // E
        read = (self.x, self.offs) + ((self.scale_x,) if self.scale_x is not None else ())
        return sum(_nbytes(t) for t in read) + active * per_expert


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def make_grouped_inputs(
    shape: GroupedShape, counts: list[int], dtype: str | torch.dtype, seed: int, device: str | torch.device
) -> GroupedInputs:
    """x [S, K] and the [E, N, K] weight: standard normal values rounded to `dtype`, reproducible
    from `seed` (x first, then each expert's [N, K] in turn, drawn in fp32 on `device` as
    `make_inputs` draws); offs the cumulative sums of `counts` (`shapes.routing_counts`), int32 on
    `device`. fp8-row: the same draws quantized to e4m3 row-wise (`quantize`), each row of x with
    its token's scale (scale_x [S]) and each row of an expert's [N, K] weight with its channel's
    (scale_w [E, N]). Per-tensor fp8 is a ValueError naming why (`GROUPED_FP8`)."""
    spec = dtype_spec(dtype)
    if spec.scaling == "tensor":
        raise ValueError(GROUPED_FP8)
    if len(counts) != shape.E or sum(counts) != shape.M or min(counts) < 0:
        raise ValueError(
            f"counts {counts} are not {shape.E} non-negative row counts summing to S = {shape.M}"
        )
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device, dtype=torch.float32)

    ends = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    w = torch.empty(shape.E, shape.N, shape.K, dtype=spec.operand, device=device)
    if spec.scaling is None:
        x = randn(shape.M, shape.K).to(spec.operand)
        for e in range(shape.E):  # one expert at a time: an fp32 draw of all of w would be twice its size
            w[e] = randn(shape.N, shape.K)
        return GroupedInputs(x, w.transpose(1, 2), ends.to(device), tuple(counts))
    x32 = randn(shape.M, shape.K)
    x = torch.empty(shape.M, shape.K, dtype=spec.operand, device=device)
    scale_x = torch.empty(shape.M, dtype=torch.float32, device=device)
    for start in range(0, shape.M, QUANTIZE_ROWS):  # in blocks: quantize's temporaries are x-sized
        rows = slice(start, start + QUANTIZE_ROWS)
        q, scale = quantize(x32[rows], rowwise=True)
        x[rows], scale_x[rows] = q, scale.view(-1)
    del x32
    scale_w = torch.empty(shape.E, shape.N, dtype=torch.float32, device=device)
    for e in range(shape.E):
        w[e], scale = quantize(randn(shape.N, shape.K), rowwise=True)
        scale_w[e] = scale.view(-1)
    return GroupedInputs(x, w.transpose(1, 2), ends.to(device), tuple(counts), scale_x, scale_w)


QUANTIZE_ROWS = 8192  # rows of x quantized at a time (`make_grouped_inputs`)


def grouped_reference(
    x: torch.Tensor,
    w: torch.Tensor,
    offs: torch.Tensor,
    scale_x: torch.Tensor | None = None,
    scale_w: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fp32 products of each expert's rows of x with its weight w[e] (TF32 off), in one [S, N]
    tensor; rows no expert owns (past offs[-1]) are 0. With fp8 scales (`GroupedInputs.scales`),
    each expert's product of the upcast e4m3 operands times its rows' scale_x and its scale_w[e],
    as the kernel dequantizes its fp32 accumulator. Reads offs to the host."""
    out = torch.zeros(x.shape[0], w.shape[2], dtype=torch.float32, device=x.device)
    with _no_tf32():
        for e, start, end in expert_spans(offs.tolist(), x.shape[0]):
            product = x[start:end].float() @ w[e].float()
            if scale_x is not None and scale_w is not None:
                product = product * scale_x[start:end, None] * scale_w[e]
            out[start:end] = product
    return out


def quantize(x: torch.Tensor, rowwise: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 `x` [R, C] as e4m3 and the fp32 scale that dequantizes it, x ~ q * scale.

    scale = amax / 448, of the whole tensor (shape ()) or per row (shape [R, 1]), so that the
    largest magnitude lands on e4m3's largest value; q = (x / scale).to(float8_e4m3fn), clamped to
    +-448 first (a quotient that rounds a hair above 448 stays finite). A row or tensor of zeros
    gets scale 1, never 0.
    """
    amax = x.abs().amax(dim=1, keepdim=True) if rowwise else x.abs().amax()
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


@contextmanager
def _no_tf32() -> Iterator[None]:
    """fp32 matmuls in full fp32 (no TF32 tensor cores) inside the block, restored after."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def reference(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fp32 product of the low-precision inputs: what an exact kernel would compute before
    rounding its result to the output dtype. With fp8 scales (`Inputs.scales`), the product of the
    upcast e4m3 operands times scale_a and scale_b, as the kernels dequantize their fp32
    accumulator (the scales broadcast: () per-tensor, [M, 1] and [1, N] row-wise); then + bias."""
    with _no_tf32():
        product = a.float() @ b.float()
    if scale_a is not None:
        product = product * scale_a
    if scale_b is not None:
        product = product * scale_b
    if bias is not None:
        product = product + bias.float()
    return product


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in fp64; inf when `out` holds a NaN or an infinity."""
    if not bool(torch.isfinite(out).all()):
        return math.inf
    diff = torch.linalg.vector_norm(out.double() - ref.double()).item()
    norm = torch.linalg.vector_norm(ref, dtype=torch.float64).item()
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def tolerance(cublas_err: float, dtype: str | torch.dtype) -> float:
    """The largest relative error a correct kernel may have: 2 * cublas_err + unit_roundoff / 4.

    cuBLAS's error on these inputs is dominated by rounding the fp32 accumulator to the output
    dtype, which every correct kernel pays too; the factor 2 leaves room for another
    accumulation order or a split-K reduction. The floor of a quarter of the output dtype's unit
    roundoff (fp16 2**-11, bf16 2**-8; fp8's output is bf16) covers shapes where cuBLAS is
    (nearly) exact, e.g. a tiny K, so a kernel is not failed for one last-bit difference. A
    skipped tile or a wrong operand gives an error of order 1, far above the bound.
    """
    return 2.0 * cublas_err + 0.25 * UNIT_ROUNDOFF[output_dtype(dtype)]


@dataclass(frozen=True)
class Check:
    """The verdict on one output: its error, the bound, and how many values were NaN or inf."""

    err: float
    tol: float
    ok: bool
    nan_count: int

    def describe(self) -> str:
        """One line for a FAILED row."""
        text = f"rel_err {self.err:.3g} > tol {self.tol:.3g}"
        if self.nan_count:
            text += f" ({self.nan_count} NaN/inf values in the output)"
        return text


def check(out: torch.Tensor, ref: torch.Tensor, cublas_err: float, dtype: str | torch.dtype) -> Check:
    """Judge `out` against the fp32 `ref` with the tolerance rule."""
    nan_count = int((~torch.isfinite(out)).sum().item())
    err = math.inf if nan_count else rel_error(out, ref)
    tol = tolerance(cublas_err, dtype)
    return Check(err=err, tol=tol, ok=err <= tol, nan_count=nan_count)
