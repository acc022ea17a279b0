"""The `cublas-loop` mode: a grouped GEMM as one cuBLAS call per expert, `torch.mm(x[rows of e],
w[e], out=out[rows of e])`, the way a mixture-of-experts layer is written without a grouped kernel.

The offsets are read to the host once, in `prepare` (a device-to-host sync), and the per-expert
slices are fixed there: fine for a baseline whose offsets never change between the timed calls,
though a model's layer, whose routing changes every step, would pay that sync on every call (and
could not be captured in a CUDA graph). Experts without rows launch nothing. The driver also takes
this loop's error against the fp32 reference as the yardstick of its tolerance on grouped shapes,
as it takes cuBLAS's on dense ones.
"""

from __future__ import annotations

import torch

from gluon_survey.launch import Launch, Target


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
    x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, out: torch.Tensor, target: Target | None = None
) -> Launch:
    """out[rows of e] = x[rows of e] @ w[e] for every expert with rows: one `torch.mm` each, into
    row slices of `out`; w[e] is the transpose view of an [N, K] weight, which cuBLAS reads as it
    is. Reads offs to the host here, once."""
    calls = [(x[s:t], w[e], out[s:t]) for e, s, t in expert_spans(offs.tolist(), x.shape[0])]

    def fn() -> None:
        for a, b, c in calls:
            torch.mm(a, b, out=c)

    return Launch(fn, {"impl": "torch.mm per expert (cuBLAS)", "launches": len(calls)})
