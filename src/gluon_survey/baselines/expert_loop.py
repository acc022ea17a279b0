"""The `cublas-loop` mode: a grouped GEMM as one cuBLAS call per expert, `torch.mm(x[rows of e],
w[e], out=out[rows of e])`, the way a mixture-of-experts layer is written without a grouped kernel.

The offsets are read to the host once, in `prepare` (a device-to-host sync), and the per-expert
slices are fixed there: fine for a baseline whose offsets never change between the timed calls,
though a model's layer, whose routing changes every step, would pay that sync on every call (and
could not be captured in a CUDA graph). Experts without rows launch nothing. The driver also takes
this loop's error against the fp32 reference as the yardstick of its tolerance on grouped shapes,
as it takes cuBLAS's on dense ones.

fp8 e4m3 operands with row-wise scales (`scales`: `a` the [S] token scales, `b` the [E, N]
expert-channel scales) run `torch._scaled_mm` per expert instead, as the `torch` mode runs fp8
(baselines/torch_ops.py: the expert's rows' scales as [rows, 1], its channel scales as [1, N],
`use_fast_accum=True`, the output's dtype), which takes K and N only as multiples of 16. Each
expert's scales are copied once, in `prepare`, into buffers of their own (a row slice of the
token scales starts at any 4-byte offset, and the fp8 GEMM's scale reads are not promised to take
that): the launch keeps the scale values it was prepared with.
"""

from __future__ import annotations

import torch

from gluon_survey.launch import Launch, Scales, Target

FP8_ALIGN = 16  # torch._scaled_mm: K and N must be multiples of 16


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """cuBLAS runs on every CUDA GPU PyTorch supports."""
    return None


def expert_spans(ends: list[int], rows: int) -> list[tuple[int, int, int]]:
    """(expert, first row, end row) of every expert with rows, from the cumulative `ends` (offs),
    with the grouped kernel's reading of them: each end clamped to [0, rows], an expert whose end
    is not past the previous one's empty."""
    spans, start = [], 0
    for e, end in enumerate(ends):
        end = min(max(end, 0), rows)
        if end > start:
            spans.append((e, start, end))
        start = max(start, end)
    return spans


def prepare(
    x: torch.Tensor,
    w: torch.Tensor,
    offs: torch.Tensor,
    out: torch.Tensor,
    target: Target | None = None,
    scales: Scales | None = None,
) -> Launch:
    """out[rows of e] = x[rows of e] @ w[e] for every expert with rows: one `torch.mm` each (fp8:
    `torch._scaled_mm` with the expert's scales), into row slices of `out`; w[e] is the transpose
    view of an [N, K] weight, which cuBLAS reads as it is. Reads offs to the host here, once."""
    spans = expert_spans(offs.tolist(), x.shape[0])
    if scales is None:
        calls = [(x[s:t], w[e], out[s:t]) for e, s, t in spans]

        def fn() -> None:
            for a, b, c in calls:
                torch.mm(a, b, out=c)

        return Launch(fn, {"impl": "torch.mm per expert (cuBLAS)", "launches": len(calls)})
    K, N = x.shape[1], w.shape[2]
    if K % FP8_ALIGN or N % FP8_ALIGN:
        raise ValueError(
            f"torch._scaled_mm takes K and N as multiples of {FP8_ALIGN}; got K={K}, N={N} "
            f"(pad x and w with zeros along K, w along N)"
        )
    token_scales, channel_scales = scales.a, scales.b.view(w.shape[0], N)
    scaled = [
        (x[s:t], w[e], token_scales[s:t].clone().view(-1, 1), channel_scales[e].clone().view(1, N), out[s:t])
        for e, s, t in spans
    ]

    def fn_fp8() -> None:
        for a, b, scale_a, scale_b, c in scaled:
            torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=c.dtype, out=c, use_fast_accum=True)

    return Launch(fn_fp8, {"impl": "torch._scaled_mm per expert (fp8, row-wise)", "launches": len(scaled)})
