"""The `scaled_grouped_mm` mode: `torch._scaled_grouped_mm`, PyTorch's fp8 grouped GEMM with
row-wise scales, the reference every grouped fp8 row's ratio is taken against (as
torch._grouped_mm is for fp16/bf16 grouped rows).

    torch._scaled_grouped_mm(x, w, scale_x, scale_w, offs=offs, out_dtype=torch.bfloat16,
                             use_fast_accum=True)

x [S, K] fp8 e4m3 row-major, w the [E, K, N] transpose view of a contiguous [E, N, K] e4m3 weight
(the column-major operand it requires), scale_x the fp32 [S] token scales, scale_w the fp32
[E, N] scales of each expert's output channels (these shapes only: a 2-D x takes a 1-D scale, a
3-D weight a 2-D one), offs int32 [E] cumulative ends on the GPU. It returns a new bf16 [S, N]
tensor (no `out=`, no other output dtype), needs K and N multiples of 16, and runs on sm_90 and
sm_100 only (its CUTLASS kernel, which reads the offsets on the device). It runs with
`use_fast_accum=True`, as the `torch` mode's `_scaled_mm` does and for the same reason
(baselines/torch_ops.py): the survey's fp8 kernels chain their wgmmas over the whole K loop,
which is the fast mode's arithmetic.
"""

from __future__ import annotations

import torch

from gluon_survey.launch import Launch, Scales, Target

ALIGN = 16  # torch._scaled_grouped_mm: K and N must be multiples of 16


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    if not hasattr(torch, "_scaled_grouped_mm"):
        return f"torch {torch.__version__} has no torch._scaled_grouped_mm"
    if capability[0] not in (9, 10):
        return (
            "torch._scaled_grouped_mm runs on sm_90 and sm_100 only; this GPU is "
            f"sm_{capability[0]}{capability[1]}"
        )
    return None


def prepare(
    x: torch.Tensor,
    w: torch.Tensor,
    offs: torch.Tensor,
    out: torch.Tensor,
    target: Target | None = None,
    scales: Scales | None = None,
) -> Launch:
    """A launch returning `torch._scaled_grouped_mm(x, w, scale_x, scale_w, offs=offs, ...)` (a new
    tensor each call: `out` is not written; the driver judges the tensor returned, as for
    torch._grouped_mm). `scales` (kind "row": `a` [S], `b` [E, N]) is required; `out` fixes only
    the output dtype, which must be bf16. ValueError for what torch would refuse deep inside."""
    if scales is None or scales.kind != "row":
        raise TypeError(
            "scaled_grouped_mm takes fp8 e4m3 operands with row-wise scales (scale_x [S], scale_w [E, N])"
        )
    if out.dtype != torch.bfloat16:
        raise ValueError(
            f"torch._scaled_grouped_mm writes bfloat16 only, not {out.dtype}: pass out_dtype=torch.bfloat16"
        )
    K, N = x.shape[1], w.shape[2]
    if K % ALIGN or N % ALIGN:
        raise ValueError(
            f"torch._scaled_grouped_mm takes K and N as multiples of {ALIGN}; got K={K}, N={N} "
            f"(pad x and w with zeros along K, w along N)"
        )
    scale_x, scale_w = scales.a, scales.b
    return Launch(
        lambda: torch._scaled_grouped_mm(
            x, w, scale_x, scale_w, offs=offs, out_dtype=torch.bfloat16, use_fast_accum=True
        ),
        {"impl": "torch._scaled_grouped_mm: CUTLASS fp8 grouped GEMM, row-wise scales, fast accumulation"},
    )
