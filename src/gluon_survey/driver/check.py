"""Correctness: inputs every provider shares, the fp32 reference, and the pass/fail rule.

Every mode is checked on the same inputs (`make_inputs` is deterministic in the seed, so each
provider's subprocess rebuilds the very same tensors) against `reference`, the fp32 product of
those low-precision inputs. A result passes when its relative Frobenius error is within
`tolerance(cublas_err, dtype)`, a bound relative to cuBLAS's own error on the same inputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from gluon_survey.driver.shapes import Shape
from gluon_survey.launch import B_LAYOUTS

DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "bf16": torch.bfloat16}

# Unit roundoff u = 2**-(mantissa bits + 1): the largest relative error of rounding to the dtype.
UNIT_ROUNDOFF: dict[torch.dtype, float] = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}

TOLERANCE_RULE = "rel_err <= 2 * cublas_err + unit_roundoff / 4 (fp16 u = 2**-11, bf16 u = 2**-8)"


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """'fp16' / 'bf16' (or a torch dtype) -> the torch dtype; ValueError for anything else."""
    if isinstance(dtype, torch.dtype):
        if dtype not in UNIT_ROUNDOFF:
            raise ValueError(f"unsupported dtype {dtype}; use one of {', '.join(DTYPES)}")
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}") from None


def make_inputs(
    shape: Shape, dtype: str | torch.dtype, b_layout: str, seed: int, device: str | torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """a [M, K] and b [K, N]: standard normal values rounded to `dtype`, reproducible from `seed`.

    b_layout (`gluon_survey.launch.B_LAYOUTS`) "row" gives a contiguous [K, N] b; "t" gives the
    transpose view of a contiguous [N, K] weight, as `x @ w.t()` in a linear layer. Values are
    drawn in fp32 by a generator on `device` and then rounded, so the same (seed, device type)
    always yields the same tensors.
    """
    if b_layout not in B_LAYOUTS:
        raise ValueError(f"unknown B layout {b_layout!r}; use one of {', '.join(B_LAYOUTS)}")
    dtype = torch_dtype(dtype)
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device, dtype=torch.float32).to(dtype)

    a = randn(shape.M, shape.K)
    b = randn(shape.K, shape.N) if b_layout == "row" else randn(shape.N, shape.K).t()
    return a, b


@contextmanager
def _no_tf32() -> Iterator[None]:
    """fp32 matmuls in full fp32 (no TF32 tensor cores) inside the block, restored after."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The fp32 product of the low-precision inputs: what an exact kernel would compute before
    rounding its result to the output dtype."""
    with _no_tf32():
        return a.float() @ b.float()


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
    accumulation order or a split-K reduction. The floor of a quarter of the dtype's unit
    roundoff (fp16 2**-11, bf16 2**-8) covers shapes where cuBLAS is (nearly) exact, e.g. a tiny
    K, so a kernel is not failed for one last-bit difference. A skipped tile or a wrong operand
    gives an error of order 1, far above the bound.
    """
    return 2.0 * cublas_err + 0.25 * UNIT_ROUNDOFF[torch_dtype(dtype)]


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
