import math

import pytest
import torch

from gluon_survey.driver.check import (
    UNIT_ROUNDOFF,
    check,
    make_inputs,
    reference,
    rel_error,
    tolerance,
    torch_dtype,
)
from gluon_survey.driver.shapes import Shape

SHAPE = Shape(33, 40, 72)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_make_inputs_shapes_and_dtype(dtype):
    a, b = make_inputs(SHAPE, dtype, "row", seed=0, device="cpu")
    assert a.shape == (33, 72) and b.shape == (72, 40)
    assert a.dtype == b.dtype == torch_dtype(dtype)
    assert a.is_contiguous() and b.is_contiguous()
    assert a.float().std() > 0.5 and b.float().std() > 0.5  # standard normal, not zeros


def test_make_inputs_t_layout_is_the_transpose_view_of_a_weight():
    _, b = make_inputs(SHAPE, "fp16", "t", seed=0, device="cpu")
    assert b.shape == (72, 40)
    assert not b.is_contiguous() and b.t().is_contiguous()


def test_make_inputs_is_deterministic_in_the_seed():
    a0, b0 = make_inputs(SHAPE, "bf16", "t", seed=7, device="cpu")
    a1, b1 = make_inputs(SHAPE, "bf16", "t", seed=7, device="cpu")
    a2, _ = make_inputs(SHAPE, "bf16", "t", seed=8, device="cpu")
    assert torch.equal(a0, a1) and torch.equal(b0, b1)
    assert not torch.equal(a0, a2)


def test_make_inputs_rejects_unknown_layout_and_dtype():
    with pytest.raises(ValueError, match="B layout"):
        make_inputs(SHAPE, "fp16", "col", seed=0, device="cpu")
    with pytest.raises(ValueError, match="unknown dtype 'fp32'"):
        make_inputs(SHAPE, "fp32", "row", seed=0, device="cpu")


def test_reference_is_fp32_and_restores_tf32_setting():
    a, b = make_inputs(SHAPE, "fp16", "row", seed=0, device="cpu")
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        ref = reference(a, b)
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert ref.dtype == torch.float32
    assert torch.allclose(ref, a.double().matmul(b.double()).float(), rtol=1e-5, atol=1e-5)


def test_rel_error():
    ref = torch.tensor([[3.0, 4.0]])
    assert rel_error(ref.clone(), ref) == 0.0
    assert rel_error(torch.tensor([[3.0, 4.5]]), ref) == pytest.approx(0.5 / 5.0)
    assert rel_error(torch.tensor([[math.nan, 4.0]]), ref) == math.inf
    assert rel_error(torch.tensor([[math.inf, 4.0]]), ref) == math.inf
    assert rel_error(torch.zeros(1, 2), torch.zeros(1, 2)) == 0.0
    assert rel_error(torch.ones(1, 2), torch.zeros(1, 2)) == math.inf


def test_tolerance_rule():
    assert tolerance(1e-3, "fp16") == pytest.approx(2e-3 + 0.25 * 2**-11)
    assert tolerance(0.0, torch.bfloat16) == pytest.approx(0.25 * 2**-8)
    assert UNIT_ROUNDOFF[torch.float16] == 2**-11
    with pytest.raises(ValueError):
        tolerance(0.0, torch.float32)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_check_passes_the_same_dtype_matmul_and_fails_a_skipped_tile(dtype):
    a, b = make_inputs(Shape(64, 64, 256), dtype, "row", seed=0, device="cpu")
    ref = reference(a, b)
    out = torch.matmul(a, b)
    cublas_err = rel_error(out, ref)
    assert 0 < cublas_err < UNIT_ROUNDOFF[torch_dtype(dtype)]
    good = check(out, ref, cublas_err, dtype)
    assert good.ok and good.nan_count == 0 and good.err == cublas_err
    out[:16, :16] = 0  # one unwritten tile
    bad = check(out, ref, cublas_err, dtype)
    assert not bad.ok and bad.err > 0.05
    assert bad.describe().startswith(f"rel_err {bad.err:.3g} > tol")


def test_check_counts_nan_outputs():
    ref = torch.ones(4, 4)
    out = torch.full((4, 4), math.nan, dtype=torch.float16)
    out[0] = 1
    verdict = check(out, ref, 0.0, "fp16")
    assert not verdict.ok and verdict.err == math.inf and verdict.nan_count == 12
    assert "12 NaN/inf values" in verdict.describe()
