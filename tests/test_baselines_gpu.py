"""Every baseline (`torch`, `triton`, `torch.compile`) against the fp32 reference, with the survey's
tolerance rule, on ragged shapes, both dtypes and both B layouts, into NaN-poisoned outputs; and
the two fp8 baselines (`torch`: `torch._scaled_mm`, `triton`) in fp8 e4m3 with per-tensor and
row-wise scales.

Run on the GPU machine: `pytest -m gpu tests/test_baselines_gpu.py`.
"""

import math

import pytest
import torch

from gluon_survey import api
from gluon_survey.driver.check import check, make_inputs, reference, rel_error
from gluon_survey.driver.shapes import Shape

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# Tiny, odd (not a multiple of any tile; 127 rows), wide-and-short-K, square, and single-token decode.
SHAPES = [
    Shape(1, 8, 8),
    Shape(127, 264, 72),
    Shape(3000, 5000, 264),
    Shape(4096, 4096, 4096),
    Shape(1, 4096, 4096),
]
DTYPES = ["fp16", "bf16"]
LAYOUTS = ["row", "t"]

CASES = [
    pytest.param(mode, shape, dtype, layout, id=f"{mode}-{shape.label}-{dtype}-{layout}")
    for mode in ("torch", "triton")
    for shape in SHAPES
    for dtype in DTYPES
    for layout in LAYOUTS
]
# torch.compile autotunes for each new shape (minutes): a few cases that still cover both dtypes,
# both layouts, a ragged shape and decode.
CASES += [
    pytest.param("torch.compile", shape, dtype, layout, id=f"torch.compile-{shape.label}-{dtype}-{layout}")
    for shape, dtype, layout in ((SHAPES[1], "fp16", "row"), (SHAPES[4], "bf16", "t"))
]


def _verdict(out, a, b, dtype):
    ref = reference(a, b)
    return check(out, ref, rel_error(torch.matmul(a, b), ref), dtype)


@pytest.mark.parametrize(("mode", "shape", "dtype", "layout"), CASES)
def test_prepare_writes_a_correct_product_into_out(mode, shape, dtype, layout):
    """The call the survey times must produce the product: written into `out`, or returned (the
    registry's contract for torch.compile)."""
    a, b = make_inputs(shape, dtype, layout, seed=0, device="cuda")
    out = torch.full((shape.M, shape.N), math.nan, dtype=a.dtype, device="cuda")
    launch = api.prepare(mode, a, b, out)
    launch.fn()  # first call: compiles / autotunes
    out.fill_(math.nan)
    result = launch.fn()
    torch.cuda.synchronize()
    verdict = _verdict(result if isinstance(result, torch.Tensor) else out, a, b, dtype)
    assert verdict.ok, verdict.describe()


@pytest.mark.parametrize(("mode", "shape", "dtype", "layout"), [c for c in CASES if c.values[1] == SHAPES[1]])
def test_matmul_matches_the_reference(mode, shape, dtype, layout):
    a, b = make_inputs(shape, dtype, layout, seed=1, device="cuda")
    out = torch.full((shape.M, shape.N), math.nan, dtype=a.dtype, device="cuda")
    result = api.matmul(a, b, kernel=mode, out=out)
    torch.cuda.synchronize()
    assert result is out
    verdict = _verdict(out, a, b, dtype)
    assert verdict.ok, verdict.describe()


def test_a_timed_row_carries_its_paired_cublas_time_and_the_clock():
    """What the driver records per cell on a GPU: the mode's time, cuBLAS's on the same inputs
    around it, and NVML's clock and power over each side's windows (when NVML can be read)."""
    from gluon_survey.driver import worker

    provider = worker.cuda_provider("Pipelined")
    assert provider.baseline is not None and worker.cuda_provider("torch").baseline is None
    task = {"M": 2048, "N": 2048, "K": 1024, "dtype": "fp16", "b_layout": "row"}
    settings = {"seed": 0, "warmup_ms": 10.0, "min_ms": 30.0, "min_iters": 20, "max_iters": 2000}
    settings["paired"] = True
    row = worker.measure(provider, task, settings, lambda _: None)
    assert row["status"] == "OK", row.get("error")
    assert 0.2 < row["cublas_ms"] / row["ms_median"] < 5 and abs(row["cublas_drift"]) < 0.5
    try:
        import pynvml  # noqa: F401
    except ImportError:
        pytest.skip("no pynvml here: rows carry no clock")
    assert 100 < row["sm_clock_mhz"] < 3000 and row["power_w"] > 0
    # each side over its own windows, which settling makes 200 ms or more: NVML's 20 ms samples land
    assert 100 < row["cublas_sm_clock_mhz"] < 3000 and row["cublas_power_w"] > 0


# ----------------------------------------------------------------------------------------------
# fp8 e4m3: out = (a @ w.t()) * scale_a * scale_b in bf16
# ----------------------------------------------------------------------------------------------

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest e4m3fn magnitude
# Ragged M (decode, one partial tile, several), N a multiple of 16 (torch._scaled_mm's rule) but not
# of 128, K a multiple of 16 with a tail past the 128-wide K tiles; the last one has many tiles
# per program (persistence) and a K of 2064 (17 K steps).
FP8_SHAPES = [Shape(1, 272, 144), Shape(65, 400, 1040), Shape(300, 1040, 272), Shape(1000, 2064, 2064)]
FP8_SCALINGS = ["tensor", "row"]
FP8_CASES = [
    pytest.param(mode, shape, scaling, id=f"{mode}-fp8-{scaling}-{shape.label}")
    for mode in ("torch", "triton")
    for shape in FP8_SHAPES
    for scaling in FP8_SCALINGS
]
# triton only: K = 100 and N = 200 are no multiples of 16, which torch._scaled_mm refuses; the
# api gives the kernel 16-byte-aligned copies of a and the weight.
FP8_CASES += [
    pytest.param("triton", Shape(65, 200, 100), scaling, id=f"triton-fp8-{scaling}-65x200x100-aligned-copy")
    for scaling in FP8_SCALINGS
]


def _quantize(x: torch.Tensor, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 x [R, C] -> (e4m3 q, fp32 scale) with x ~ q * scale: scale = amax / 448 of the whole
    tensor (shape ()) or of each row (shape [R, 1])."""
    amax = x.abs().amax(dim=1, keepdim=True) if rowwise else x.abs().amax()
    scale = amax / FP8_MAX
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def _fp8_inputs(shape: Shape, scaling: str, seed: int):
    """a [M, K] e4m3, b = w.t() of an e4m3 [N, K] weight, and the scales as `matmul` takes them:
    () and () per-tensor; [M, 1] (per row of a) and [1, N] (per row of w) row-wise."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape.M, shape.K, generator=gen, device="cuda")
    w = torch.randn(shape.N, shape.K, generator=gen, device="cuda") * 0.05  # a weight's scale
    rowwise = scaling == "row"
    a, scale_a = _quantize(x, rowwise)
    wq, scale_w = _quantize(w, rowwise)
    scale_b = scale_w.reshape(1, shape.N) if rowwise else scale_w
    return a, wq.t(), scale_a, scale_b


def _fp8_reference(a, b, scale_a, scale_b) -> torch.Tensor:
    """The fp32 product of the upcast e4m3 operands, times the scales (they broadcast)."""
    return reference(a, b) * scale_a * scale_b


def _fp8_verdict(out, a, b, scale_a, scale_b):
    """The survey's rule for an fp8 product: rel_err <= 2 * (torch._scaled_mm's error on the same
    inputs) + u / 4 of the output dtype. Where _scaled_mm cannot run (K or N not a multiple of 16;
    row-wise scales into fp16, which PyTorch's CUTLASS fallback refuses) the exactly rounded
    reference stands in for it."""
    ref = _fp8_reference(a, b, scale_a, scale_b)
    M, K, N = a.shape[0], a.shape[1], b.shape[1]
    rowwise = scale_b.numel() > 1 or scale_a.numel() > 1
    if K % 16 or N % 16 or (rowwise and out.dtype != torch.bfloat16):
        cublas = ref.to(out.dtype)
    else:
        cublas = torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out.dtype)
    assert cublas.shape == (M, N)
    return check(out, ref, rel_error(cublas, ref), out.dtype)


@pytest.mark.parametrize(("mode", "shape", "scaling"), FP8_CASES)
def test_fp8_prepare_writes_a_correct_product_into_out(mode, shape, scaling):
    a, b, scale_a, scale_b = _fp8_inputs(shape, scaling, seed=0)
    out = torch.full((shape.M, shape.N), math.nan, dtype=torch.bfloat16, device="cuda")
    launch = api.prepare(mode, a, b, out, scale_a=scale_a, scale_b=scale_b)
    assert launch.config["scales"] == scaling
    launch.fn()  # first call: compiles / autotunes
    out.fill_(math.nan)
    launch.fn()
    torch.cuda.synchronize()
    if mode == "torch":
        assert launch.config["impl"] == "cuBLAS fp8 (torch._scaled_mm, fast accumulation)"
    else:  # the fp8 half of the autotuning space: 128-byte K rows
        assert launch.config["BLOCK_K"] == 128 and launch.config["BLOCK_M"] == 128
    verdict = _fp8_verdict(out, a, b, scale_a, scale_b)
    assert verdict.ok, verdict.describe()


@pytest.mark.parametrize("scaling", FP8_SCALINGS)
@pytest.mark.parametrize("mode", ["torch", "triton"])
def test_fp8_matmul_matches_the_reference(mode, scaling):
    """`matmul` (plans) in fp8: bf16 by default, twice with the same key (the second call reuses
    the plan), then fp16 through out_dtype."""
    shape = FP8_SHAPES[2]
    a, b, scale_a, scale_b = _fp8_inputs(shape, scaling, seed=1)
    for _ in range(2):
        out = torch.full((shape.M, shape.N), math.nan, dtype=torch.bfloat16, device="cuda")
        result = api.matmul(a, b, kernel=mode, out=out, scale_a=scale_a, scale_b=scale_b)
        torch.cuda.synchronize()
        assert result is out
        verdict = _fp8_verdict(out, a, b, scale_a, scale_b)
        assert verdict.ok, verdict.describe()
    if mode == "torch" and scaling == "row":
        return  # row-wise fp16 output: PyTorch's CUTLASS fallback (cuBLAS < 12.9) takes bf16 only
    result = api.matmul(a, b, kernel=mode, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.float16)
    torch.cuda.synchronize()
    assert result.dtype == torch.float16 and result.shape == (shape.M, shape.N)
    verdict = _fp8_verdict(result, a, b, scale_a, scale_b)
    assert verdict.ok, verdict.describe()


@pytest.mark.parametrize("scaling", FP8_SCALINGS)
def test_fp8_triton_deep_k(scaling):
    """K = 4096, the survey's square shapes' depth. The plain-Triton kernel uses Triton's Hopper
    default for fp8 dots, the tensor cores' fast (reduced-precision) accumulation over the whole
    K loop, while torch._scaled_mm promotes partial sums to fp32 (use_fast_accum=False): a
    failure here says that fast accumulation's error outgrows the survey's tolerance at this
    depth, not that a tile or a scale is wrong (those give errors of order 1)."""
    shape = Shape(256, 4096, 4096)
    a, b, scale_a, scale_b = _fp8_inputs(shape, scaling, seed=2)
    out = torch.full((shape.M, shape.N), math.nan, dtype=torch.bfloat16, device="cuda")
    launch = api.prepare("triton", a, b, out, scale_a=scale_a, scale_b=scale_b)
    launch.fn()
    torch.cuda.synchronize()
    verdict = _fp8_verdict(out, a, b, scale_a, scale_b)
    assert verdict.err < 0.02, verdict.describe()  # whatever the accumulation, nothing is broken
    assert verdict.ok, f"{verdict.describe()} (fast fp8 accumulation over K = {shape.K}, see the docstring)"
