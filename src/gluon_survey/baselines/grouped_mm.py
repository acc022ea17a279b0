"""The `grouped_mm` mode: `torch._grouped_mm(x, w, offs=offs)`, PyTorch's grouped GEMM, the
reference every grouped row's ratio is taken against (as cuBLAS is for dense rows).

`torch._grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None)` with mat_a [S, K]
row-major, mat_b [E, K, N] the transpose view of a contiguous [E, N, K] weight (the layout it
takes without a copy: mat_b "transposed", K-major), offs int32 [E] cumulative ends on the GPU; it
returns a new [S, N] tensor (there is no `out=`), rows past offs[-1] unwritten, and needs
16-byte-aligned bases and row strides (N and K multiples of 8 in 16-bit types). In torch 2.11 bf16
on sm_90 and sm_100 runs its CUTLASS grouped kernel, which reads the offsets on the device (no
host sync); other dtypes (fp16) and GPUs run its fallback, one matmul per group after reading the
offsets to the host on every call. The `impl` of the row's config says which.
"""

from __future__ import annotations

import torch

from gluon_survey.launch import Launch, Target


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    return None


def prepare(
    x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, out: torch.Tensor, target: Target | None = None
) -> Launch:
    """A launch returning `torch._grouped_mm(x, w, offs=offs)` (a new tensor each call: `out` is
    not written; the driver judges the tensor returned, as for torch.compile)."""
    cutlass = x.dtype == torch.bfloat16 and target is not None and target.capability[0] in (9, 10)
    impl = (
        "torch._grouped_mm: CUTLASS grouped GEMM" if cutlass else "torch._grouped_mm: its per-group fallback"
    )
    return Launch(lambda: torch._grouped_mm(x, w, offs=offs), {"impl": impl})
