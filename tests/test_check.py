import math

import pytest
import torch

from gluon_survey import api
from gluon_survey.driver.check import (
    DTYPE_SPECS,
    DTYPES,
    UNIT_ROUNDOFF,
    check,
    dtype_spec,
    make_inputs,
    output_dtype,
    quantize,
    reference,
    rel_error,
    tolerance,
    torch_dtype,
)
from gluon_survey.driver.shapes import Shape
from gluon_survey.launch import b_layout

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


# ------------------------------------------------------------------------------------------------
# fp8 (e4m3 operands, per-tensor or row-wise fp32 scales, bf16 out)

FP8_SHAPE = Shape(24, 40, 96)


def _fp32_draws(shape, seed):
    """The fp32 values make_inputs draws for B layout "t": a [M, K], then the weight [N, K]."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(shape.M, shape.K, generator=gen, dtype=torch.float32)
    return a, torch.randn(shape.N, shape.K, generator=gen, dtype=torch.float32)


def test_the_dtype_table():
    assert list(DTYPES) == ["fp16", "bf16", "fp8", "fp8-row"]
    assert torch_dtype("fp8") == torch_dtype("fp8-row") == torch.float8_e4m3fn
    assert output_dtype("fp8") == output_dtype("fp8-row") == torch.bfloat16
    assert output_dtype("fp16") == torch.float16
    assert [DTYPE_SPECS[d].scaling for d in DTYPES] == [None, None, "tensor", "row"]
    assert DTYPE_SPECS["fp8"].b_layouts == ("t",) and DTYPE_SPECS["fp16"].default_b_layout == "row"
    assert dtype_spec(torch.float8_e4m3fn).name == "fp8"  # a torch dtype: per-tensor scales
    # the driver allocates what the API says an fp8 product is
    a = torch.zeros(2, 2, dtype=torch.float8_e4m3fn)
    assert api.result_dtype(a) == output_dtype("fp8")


@pytest.mark.parametrize("dtype", ["fp8", "fp8-row"])
def test_fp8_inputs_are_the_fp32_draws_quantized_with_amax_over_448(dtype):
    inputs = make_inputs(FP8_SHAPE, dtype, "t", seed=5, device="cpu")
    a, b = inputs  # unpacks as the operands, as for fp16/bf16
    M, N, K = FP8_SHAPE.M, FP8_SHAPE.N, FP8_SHAPE.K
    assert a.dtype == b.dtype == torch.float8_e4m3fn
    assert a.shape == (M, K) and a.is_contiguous()
    assert b.shape == (K, N) and b_layout(b) == "t" and b.t().is_contiguous()  # w.t() of a [N, K] weight
    x, w = _fp32_draws(FP8_SHAPE, seed=5)
    if dtype == "fp8":
        scale_a, scale_w = x.abs().max() / 448, w.abs().max() / 448
        assert inputs.scale_a.shape == inputs.scale_b.shape == ()
        scale_b = scale_w
    else:
        scale_a = x.abs().amax(dim=1, keepdim=True) / 448  # one per row of A
        scale_w = w.abs().amax(dim=1, keepdim=True) / 448  # one per row of the weight
        assert inputs.scale_a.shape == (M, 1) and inputs.scale_b.shape == (1, N)
        scale_b = scale_w.t()  # one per column of B
    assert inputs.scale_a.dtype == inputs.scale_b.dtype == torch.float32
    assert torch.equal(inputs.scale_a, scale_a) and torch.equal(inputs.scale_b, scale_b)
    assert bool((inputs.scale_a > 0).all()) and bool((inputs.scale_b > 0).all())
    assert set(inputs.scales) == {"scale_a", "scale_b"} and inputs.scales["scale_b"] is inputs.scale_b
    # quantized = (x / scale).to(e4m3), bit for bit; the largest magnitude lands on 448
    assert torch.equal(a.view(torch.uint8), (x / scale_a).to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(b.t().view(torch.uint8), (w / scale_w).to(torch.float8_e4m3fn).view(torch.uint8))
    if dtype == "fp8":
        assert a.float().abs().max() == 448 and b.float().abs().max() == 448
    else:
        assert torch.equal(a.float().abs().amax(dim=1), torch.full((M,), 448.0))
        assert torch.equal(b.float().abs().amax(dim=0), torch.full((N,), 448.0))
    # dequantized, within e4m3's precision (3 mantissa bits: u = 2**-4; subnormals below 2**-6)
    deq = a.float() * inputs.scale_a
    assert bool(((deq - x).abs() <= 2**-4 * x.abs() + 2**-10 * scale_a).all())
    # what gluon_survey.api accepts as fp8 scales: per-tensor or [M, 1] / [1, N], B K-major
    assert api._check_fp8(a, b, inputs.scale_a, inputs.scale_b, None) == DTYPE_SPECS[dtype].scaling


@pytest.mark.parametrize("dtype", ["fp8", "fp8-row"])
def test_fp8_inputs_are_deterministic_in_the_seed(dtype):
    first = make_inputs(FP8_SHAPE, dtype, "t", seed=3, device="cpu")
    again = make_inputs(FP8_SHAPE, dtype, "t", seed=3, device="cpu")
    other = make_inputs(FP8_SHAPE, dtype, "t", seed=4, device="cpu")
    for name in ("a", "b", "scale_a", "scale_b"):
        x, y = getattr(first, name), getattr(again, name)
        assert torch.equal(x.float(), y.float()), name
    assert not torch.equal(first.a.float(), other.a.float())
    assert not torch.equal(first.scale_b, other.scale_b)


def test_fp8_needs_the_t_layout_and_fp16_has_no_scales():
    with pytest.raises(ValueError, match="fp8-row runs with B layout t only"):
        make_inputs(FP8_SHAPE, "fp8-row", "row", seed=0, device="cpu")
    inputs = make_inputs(FP8_SHAPE, "bf16", "t", seed=0, device="cpu")
    assert inputs.scale_a is None and inputs.scales == {} and len(inputs.tensors) == 2


def test_quantize_never_divides_by_a_zero_scale():
    x = torch.zeros(2, 3)
    x[1] = torch.tensor([1.0, -2.0, 0.5])
    q, scale = quantize(x, rowwise=True)
    assert torch.equal(scale, torch.tensor([[1.0], [2.0 / 448]]))
    assert q[0].float().tolist() == [0.0, 0.0, 0.0] and q[1].float().abs().max() == 448
    q, scale = quantize(torch.zeros(2, 3))
    assert scale.item() == 1.0 and not q.float().any()


@pytest.mark.parametrize("dtype", ["fp8", "fp8-row"])
def test_fp8_reference_is_the_upcast_product_times_the_scales(dtype):
    inputs = make_inputs(FP8_SHAPE, dtype, "t", seed=0, device="cpu")
    ref = reference(inputs.a, inputs.b, **inputs.scales)
    assert ref.dtype == torch.float32 and ref.shape == (FP8_SHAPE.M, FP8_SHAPE.N)
    a, b = inputs.a.double(), inputs.b.double()
    sa, sb = inputs.scale_a.double(), inputs.scale_b.double()
    expected = (a @ b) * sa * sb
    assert torch.allclose(ref.double(), expected, rtol=1e-6, atol=1e-6)
    i, j = 5, 7  # one element written out: sum_k a[i, k] b[k, j] * scale_a[i] * scale_b[j]
    row_scale = sa.reshape(-1)[i if dtype == "fp8-row" else 0]
    col_scale = sb.reshape(-1)[j if dtype == "fp8-row" else 0]
    assert ref[i, j].item() == pytest.approx((a[i] @ b[:, j] * row_scale * col_scale).item(), rel=1e-6)
    unscaled = reference(inputs.a, inputs.b)  # without scales: the bare e4m3 product, far off
    assert rel_error(unscaled, ref) > 1


def test_fp8_tolerance_takes_the_bf16_outputs_roundoff():
    assert tolerance(0.0, "fp8") == tolerance(0.0, "fp8-row") == 0.25 * 2**-8
    assert tolerance(1e-3, "fp8-row") == pytest.approx(2e-3 + 0.25 * 2**-8)
    assert tolerance(0.0, torch.float8_e4m3fn) == 0.25 * 2**-8
    assert tolerance(0.0, "fp8") != tolerance(0.0, "fp16")


@pytest.mark.parametrize("dtype", ["fp8", "fp8-row"])
def test_fp8_check_passes_scaled_mm_and_fails_a_forgotten_or_misplaced_scale(dtype):
    inputs = make_inputs(Shape(64, 48, 256), dtype, "t", seed=0, device="cpu")
    a, b, sa, sb = inputs.a, inputs.b, inputs.scale_a, inputs.scale_b
    ref = reference(a, b, **inputs.scales)
    out = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)  # cuBLAS's call, on the CPU
    cublas_err = rel_error(out, ref)
    assert 0 < cublas_err < UNIT_ROUNDOFF[torch.bfloat16]
    assert check(out, ref, cublas_err, dtype).ok
    forgot_b = (reference(a, b) * sa).to(torch.bfloat16)
    assert not check(forgot_b, ref, cublas_err, dtype).ok
    if dtype == "fp8-row":  # scale_a applied along N (its first N values) instead of along M
        misplaced = (reference(a, b) * sa.reshape(1, -1)[:, : b.shape[1]] * sb).to(torch.bfloat16)
        assert not check(misplaced, ref, cublas_err, dtype).ok
