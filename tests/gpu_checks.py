"""Checks the GPU tests share: the dense ones' reference check, the grouped ones' check of each
expert's rows, cuBLAS fp8 on any shape (the yardstick of the fp8 tests, dense and grouped), and a
call captured in a CUDA graph after a warm-up outside the capture."""

from __future__ import annotations

import torch

from gluon_survey.driver.check import reference, rel_error, tolerance


def assert_close_to_reference(out, a, b):
    """`out` has no NaN (every tile written) and is within the driver's tolerance of the fp32
    product a @ b, cuBLAS's error on the same inputs the yardstick."""
    ref = reference(a, b)
    cublas_err = rel_error(torch.matmul(a, b), ref)
    err = rel_error(out, ref)
    assert not torch.isnan(out).any(), "output has NaN: some tile was never written"
    assert err <= tolerance(cublas_err, a.dtype), f"rel error {err:.3e} vs cuBLAS {cublas_err:.3e}"


def assert_each_expert(out, counts, precision, expected, what=""):
    """A grouped output, expert by expert: `expected(e, start, end)` gives expert e's fp32 reference
    for its rows out[start:end] and the yardstick's result on them (cuBLAS's, or the unfused path's);
    each expert with rows has no NaN and is within the driver's tolerance (`precision`: a dtype, or
    "fp8-row") of its reference, the yardstick's error the bound's base; the rows past the last
    expert's end are still NaN (the output was poisoned with NaN, and no expert owns them)."""
    torch.cuda.synchronize()
    start = 0
    for e, count in enumerate(counts):
        end = start + count
        if count:
            rows = out[start:end]
            ref, yardstick = expected(e, start, end)
            cublas_err = rel_error(yardstick, ref)
            assert not torch.isnan(rows).any(), f"{what} expert {e}: NaN, rows left unwritten"
            err = rel_error(rows, ref)
            bound = tolerance(cublas_err, precision)
            assert err <= bound, f"{what} expert {e}: {err:.3e} vs {cublas_err:.3e}"
        start = end
    assert torch.isnan(out[start:]).all(), f"{what}: rows past offs[-1] were written"


def _pad16(x: torch.Tensor, dim: int, fill: float = 0.0) -> torch.Tensor:
    extra = -x.shape[dim] % 16
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    pad = torch.full(shape, fill, dtype=torch.float32, device=x.device).to(x.dtype)
    return torch.cat([x, pad], dim=dim)


def cublas_fp8(a, b, sa, sb) -> torch.Tensor:
    """cuBLAS fp8 (`torch._scaled_mm`) on a problem padded with zeros to multiples of 16 in N and K
    (cuBLASLt's fp8 rule), cropped back: the same product, for shapes it refuses as they are."""
    M, N = a.shape[0], b.shape[1]
    a16 = _pad16(a, 1)
    w16 = _pad16(_pad16(b.t(), 1), 0)  # the [N, K] weight, padded
    sb16 = sb if sb.numel() == 1 else _pad16(sb, 1, 1.0)
    out = torch._scaled_mm(a16, w16.t(), scale_a=sa, scale_b=sb16, out_dtype=torch.bfloat16)
    return out[:M, :N]


def captured(fn):
    """(graph, out): fn() captured in a CUDA graph, after one untimed call on a side stream (the
    kernels' compile and plan, which a capture must not do), under torch.no_grad()."""
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
    return graph, out
