"""The `torch` mode: `torch.matmul(a, b, out=out)`, i.e. cuBLAS (cuBLASLt), the reference every ratio is
taken against.

Nothing is prepared: PyTorch picks the cuBLAS algorithm per call (its heuristics, cached by cuBLASLt),
and a transposed-view `b` or a padded `out` row stride are passed to cuBLAS as leading dimensions, so
the operands are used in place exactly as the Gluon rungs use them.

**fp8**: with `scales` (`launch.Scales`), `torch._scaled_mm(a, b, scale_a, scale_b,
out_dtype=out.dtype, out=out)`, cuBLASLt's fp8 GEMM: e4m3 operands, `a` row-major and `b` the
transpose view of an [N, K] weight (the column-major operand `_scaled_mm` requires), the scales
in its shapes (`Scales.torch_a` / `torch_b`: () per-tensor, [M, 1] and [1, N] row-wise). It runs
with `use_fast_accum=True`: Hopper's fp8 wgmma accumulates in the tensor cores' reduced-precision
adder, and the Gluon rungs and the plain-Triton kernel chain their MMAs over the whole K loop
as cuBLAS's fast mode does, so this is the same arithmetic; `_scaled_mm`'s default (False)
promotes partial sums to fp32 every few K steps and is up to 18 % slower with row-wise scales
(H100 probe, perf-notes entry 21), so comparing against it would flatter us. The tolerance
(driver/check.py) still takes cuBLAS's precise mode as its yardstick. Row-wise
scaling goes to cuBLASLt's outer-vector scaling where PyTorch was built with cuBLAS >= 12.9, and
to PyTorch's CUTLASS kernel otherwise (bf16 output only there). `_scaled_mm` takes K and N only as
multiples of 16: other shapes raise a ValueError here rather than deep inside PyTorch.

**A transposed A** (the view x.t() of a row-major [K, M] matrix, as in a weight's gradient): cuBLAS
takes it as a transposed operand, so `reads_transposed_a` says yes for 16-bit operands and
`gluon_survey.matmul` hands it on without a copy; `_scaled_mm` needs a row-major fp8 A.

**bias**: `torch.addmm(bias, a, b, out=out)` for fp16/bf16, whose bias cuBLASLt adds in its
epilogue (PyTorch's Lt path: a contiguous `out`, a contiguous 1-D bias, M, N and K > 1; otherwise
PyTorch copies the bias into `out` and runs the GEMM with beta = 1), and for fp8
`torch._scaled_mm(..., bias=bias)` (the bias in the output's dtype).
"""

from __future__ import annotations

import torch

from gluon_survey.launch import Launch, Scales, Target

FP8_ALIGN = 16  # torch._scaled_mm: K and N (mat1.size(1), mat2's sizes) must be multiples of 16


def check_fp8_shape(b: torch.Tensor, what: str) -> None:
    """`torch._scaled_mm` takes K and N (b's sizes) only as multiples of FP8_ALIGN: say so before
    the call rather than deep inside PyTorch. `what` names the caller's call."""
    k, n = b.shape
    if k % FP8_ALIGN or n % FP8_ALIGN:
        raise ValueError(f"{what} needs K and N to be multiples of {FP8_ALIGN}; got K={k}, N={n}")


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """cuBLAS runs on every CUDA GPU PyTorch supports (fp8 needs sm_89+; `_scaled_mm` says so)."""
    return None


def reads_transposed_a(a, b, target: Target, fp8: bool = False) -> bool:
    """The provider contract's `reads_transposed_a`: cuBLAS reads a transposed 16-bit A in place
    (module docstring), as torch.matmul does for autograd's own weight gradients."""
    return not fp8


def _scaled_mm(a, b, out, scale_a, scale_b, bias=None) -> torch.Tensor:
    return torch._scaled_mm(
        a, b, scale_a, scale_b, bias=bias, out_dtype=out.dtype, out=out, use_fast_accum=True
    )


BIAS = "cublasLt epilogue"  # the config's "bias" entry: how this mode adds one


class _Cublas:
    """The launch on other tensors of a problem `prepare` checked: `fn.plan`, what
    `gluon_survey.matmul`'s plan cache runs on each later call (so a cached `matmul` that chose
    cuBLAS costs the call, not a `prepare` with its checks)."""

    @staticmethod
    def launch(a, b, out, scales: Scales | None = None, bias=None) -> torch.Tensor:
        if scales is None:
            return _Cublas.direct(a, b, out, bias=bias)
        return _scaled_mm(a, b, out, scales.torch_a, scales.torch_b, bias)

    @staticmethod
    def direct(a, b, out=None, scale_a=None, scale_b=None, bias=None) -> torch.Tensor:
        """`gluon_survey.matmul`'s whole per-call path for a cached 16-bit plan that runs cuBLAS
        (`MatmulPlan.direct`): `torch.mm` / `torch.addmm` themselves, which allocate the output
        when there is no `out` and take any strides, with no `torch.matmul` dispatch, output
        allocation or alignment check of ours in front (results/h100-overhead-cublas measures
        what that saves)."""
        if bias is None:
            return torch.mm(a, b) if out is None else torch.mm(a, b, out=out)
        return torch.addmm(bias, a, b) if out is None else torch.addmm(bias, a, b, out=out)

    # fp8 with the caller's own scale tensors, already in `_scaled_mm`'s shapes: no flattening and
    # no views per call. At the few-µs kernels of fp8 decode and small prefill the call is
    # host-bound, and those steps cost `matmul` ~10 µs a call over `_scaled_mm` itself (H200 probe,
    # results/h200-fp8-cublas-path).
    launch_scaled = staticmethod(_scaled_mm)


CUBLAS = _Cublas()


def prepare(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    target: Target | None = None,
    scales: Scales | None = None,
    bias: torch.Tensor | None = None,
) -> Launch:
    """out = a @ b through `torch.matmul(..., out=out)`, or for fp8 operands out = (a @ b) * scales
    through `torch._scaled_mm(..., out=out)`; with a bias, + bias through `torch.addmm` or
    `_scaled_mm(bias=)` (module docstring); the call allocates nothing. `fn` has everything bound
    (what the driver times); `fn.plan` launches on other tensors of the same problem."""
    fused = {} if bias is None else {"bias": BIAS}
    if scales is None and bias is not None:
        fn = lambda: torch.addmm(bias, a, b, out=out)  # noqa: E731 (a function with an attribute)
        impl = "cuBLAS (torch.addmm)"
    elif scales is None:
        fn = lambda: torch.matmul(a, b, out=out)  # noqa: E731 (a function with an attribute)
        impl = "cuBLAS"
    else:
        check_fp8_shape(b, "torch._scaled_mm (cuBLAS fp8)")
        scale_a, scale_b = scales.torch_a, scales.torch_b
        fn = lambda: _scaled_mm(a, b, out, scale_a, scale_b, bias)  # noqa: E731
        impl = "cuBLAS fp8 (torch._scaled_mm, fast accumulation)"
    fn.plan = CUBLAS
    return Launch(fn, {"impl": impl} | fused)
