"""Every baseline (`torch`, `triton`, `torch.compile`) against the fp32 reference, with the survey's
tolerance rule, on ragged shapes, both dtypes and both B layouts, into NaN-poisoned outputs.

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
    around it, and NVML's clock and power over the timed window (when NVML can be read)."""
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
