"""The bias epilogue on a GPU: `matmul(a, b, bias=...)` against the fp32 product plus the bias,
for every rung `auto` can choose (gemv, slab, swapab with split-K and whole K, splitk with and
without a split, persistent, warpspec's two designs), Blocked and Pipelined, and cuBLAS
(torch.addmm, torch._scaled_mm(bias=)); fp16, bf16 and fp8 (per-tensor and row-wise scales);
ragged M, N and K tails; NaN-poisoned outputs; and the autograd of `Linear` with a bias against
fp32. The tolerance is the driver's rule (`driver.check.tolerance`), cuBLAS's own error the
yardstick. Run on the GPU machine: pytest -m gpu tests/test_bias_gpu.py."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from gluon_survey import api, ops
from gluon_survey.driver.check import quantize, rel_error, tolerance
from gluon_survey.kernels import splitk, swapab, warpspec
from gluon_survey.launch import Scales

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("hopper_or_blackwell")]

AUTO_RUNGS = ["gemv", "slab", "swapab", "splitk", "persistent", "warpspec", "torch", None]
KERNELS = [*AUTO_RUNGS, "Blocked", "Pipelined"]
SHAPES = [(1, 264, 520), (7, 264, 520), (65, 200, 136), (300, 520, 264)]  # N, K tails of 8 and 64


def _inputs(M, N, K, dtype, layout="t", seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", generator=g).to(dtype)
    w = torch.randn(N, K, device="cuda", generator=g).to(dtype)
    b = w.t() if layout == "t" else w.t().contiguous()
    bias = torch.randn(N, device="cuda", generator=g).to(dtype)
    return a, b, bias


def _check(out, ref, cublas, dtype, what):
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), f"{what}: NaN in the output: some tile was never written"
    err, cublas_err = rel_error(out, ref), rel_error(cublas, ref)
    assert err <= tolerance(cublas_err, dtype), f"{what}: rel error {err:.3e} vs cuBLAS {cublas_err:.3e}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["t", "row"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kernel", KERNELS, ids=str)
def test_matmul_adds_the_bias(kernel, shape, layout, dtype):
    M, N, K = shape
    if kernel == "gemv" and M > 1:
        pytest.skip("gemv runs one token (more run correct but slow: its own tests)")
    a, b, bias = _inputs(M, N, K, dtype, layout)
    ref = a.float() @ b.float() + bias.float()
    cublas = torch.addmm(bias, a, b)
    for _ in range(2):  # the first call builds the plan, the second reuses it
        out = torch.full((M, N), math.nan, device="cuda", dtype=dtype)
        assert api.matmul(a, b, kernel=kernel, out=out, bias=bias) is out
        _check(out, ref, cublas, dtype, f"{kernel} {shape} B={layout}")
    plain = api.matmul(a, b, kernel=kernel)  # the key without a bias: its own plan, no bias
    _check(plain, a.float() @ b.float(), torch.matmul(a, b), dtype, f"{kernel} without a bias")


def test_a_new_bias_at_a_new_address_is_the_one_added():
    a, b, bias = _inputs(16, 520, 264, torch.bfloat16)
    for kernel in ("swapab", "warpspec", "torch"):
        for shift in (0.0, 5.0):
            other = (bias.float() + shift).to(bias.dtype)
            out = api.matmul(a, b, kernel=kernel, bias=other)
            _check(out, a.float() @ b.float() + other.float(), torch.addmm(other, a, b), a.dtype, kernel)
    big = torch.randn(521, device="cuda").to(torch.bfloat16)
    odd = big[1:]  # a bias 2 bytes off 16-byte alignment: the kernels take any address
    for kernel in ("gemv", "slab", "swapab", "splitk", "persistent", "warpspec"):
        a1 = a[:1] if kernel == "gemv" else a
        out = api.matmul(a1, b, kernel=kernel, bias=odd)
        _check(out, a1.float() @ b.float() + odd.float(), torch.addmm(odd, a1, b), a.dtype, f"{kernel} odd")


def _target():
    return api.target_of(torch.device("cuda"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_every_variant_of_the_small_m_rungs_adds_the_bias_once(dtype):
    """swapab's split-K and whole-K tiles (every ring), splitk with and without a split: the bias
    is added to the summed tile only, whatever SPLIT_K."""
    target = _target()
    cap = target.capability
    M, N, K = 16, 1000, 4104
    a, b, bias = _inputs(M, N, K, dtype)
    ref = a.float() @ b.float() + bias.float()
    cublas = torch.addmm(bias, a, b)
    configs = [("swapab", c) for c in swapab.candidates(cap).values()]
    base = splitk.config_for(cap, K)
    configs += [("splitk", replace(base, SPLIT_K=s)) for s in (1, 4)]
    for mode, cfg in configs:
        provider = splitk if mode == "splitk" else swapab
        out = torch.full((M, N), math.nan, device="cuda", dtype=dtype)
        launch = provider.prepare(a, b, out, target, cfg, bias=bias)
        launch.fn()
        launch.fn()  # twice: the counters are back at zero, the bias not added twice
        _check(out, ref, cublas, dtype, f"{mode} {cfg.label}")


@pytest.mark.parametrize("design", ["ping-pong", "cooperative"])
def test_both_warpspec_designs_add_the_bias(design):
    target = _target()
    if target.capability[0] != 9:
        pytest.skip("the two designs are Hopper's warpspec")
    cfg = warpspec.PINGPONG if design == "ping-pong" else warpspec.COOPERATIVE
    M, N, K = 300, 520, 264
    a, b, bias = _inputs(M, N, K, torch.bfloat16)
    out = torch.full((M, N), math.nan, device="cuda", dtype=torch.bfloat16)
    warpspec.prepare(a, b, out, target, cfg, bias=bias).fn()
    _check(out, a.float() @ b.float() + bias.float(), torch.addmm(bias, a, b), a.dtype, design)


FP8_KERNELS = ["gemv", "slab", "swapab", "splitk", "persistent", "warpspec", "Pipelined", "torch", None]


@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("shape", [(1, 512, 1024), (7, 512, 1024), (65, 528, 512), (300, 512, 256)])
@pytest.mark.parametrize("kernel", FP8_KERNELS, ids=str)
def test_fp8_scales_first_then_the_bias(kernel, shape, scaling):
    M, N, K = shape
    if kernel == "gemv" and M > 1:
        pytest.skip("gemv runs one token")
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(M, K, device="cuda", generator=g)
    w = torch.randn(N, K, device="cuda", generator=g)
    a, scale_a = quantize(x, rowwise=scaling == "row")
    wq, scale_w = quantize(w, rowwise=scaling == "row")
    b, scale_b = wq.t(), scale_w if scaling == "tensor" else scale_w.reshape(1, N)
    bias = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16)
    ref = (a.float() @ b.float()) * scale_a * scale_b + bias.float()
    cublas = torch._scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=torch.bfloat16)
    out = torch.full((M, N), math.nan, device="cuda", dtype=torch.bfloat16)
    api.matmul(a, b, kernel=kernel, scale_a=scale_a, scale_b=scale_b, out=out, bias=bias)
    _check(out, ref, cublas, "fp8" if scaling == "tensor" else "fp8-row", f"{kernel} fp8 {scaling}")
    if kernel == "warpspec" and scaling == "row" and _target().capability[0] == 9:
        flat = Scales(scale_a.reshape(-1), scale_b.reshape(-1), "row")
        launch = warpspec.prepare(a, b, out, _target(), warpspec.PINGPONG_FP8, flat, bias=bias)
        assert launch.config["design"] == "cooperative", "row-wise scales and a bias run cooperative"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kernel", [None, "warpspec", "swapab"], ids=str)
def test_linear_with_bias_autograd_matches_fp32(kernel, dtype):
    torch.manual_seed(0)
    ref = torch.nn.Linear(264, 520, dtype=dtype, device="cuda")
    lin = ops.Linear.from_linear(ref, kernel=kernel)
    x = torch.randn(3, 5, 264, dtype=dtype, device="cuda", requires_grad=True)
    y = lin(x)
    grad = torch.randn_like(y)
    y.backward(grad)
    x32 = x.detach().float().requires_grad_()
    w32 = ref.weight.detach().float().requires_grad_()
    b32 = ref.bias.detach().float().requires_grad_()
    y32 = torch.nn.functional.linear(x32, w32, b32)
    y32.backward(grad.float())
    for got, want, name in (
        (y, y32, "y"),
        (x.grad, x32.grad, "grad x"),
        (ref.weight.grad, w32.grad, "grad weight"),
        (ref.bias.grad, b32.grad, "grad bias"),
    ):
        assert got.dtype == dtype, name
        err = rel_error(got, want.detach())
        assert err <= 2e-2, f"{name}: rel error {err:.3e}"
