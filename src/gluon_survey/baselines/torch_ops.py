"""The `torch` mode: `torch.matmul(a, b, out=out)`, i.e. cuBLAS (cuBLASLt), the reference every ratio is
taken against.

Nothing is prepared: PyTorch picks the cuBLAS algorithm per call (its heuristics, cached by cuBLASLt),
and a transposed-view `b` or a padded `out` row stride are passed to cuBLAS as leading dimensions, so
the operands are used in place exactly as the Gluon rungs use them.
"""

from __future__ import annotations

import torch

from gluon_survey.launch import Launch, Target


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """cuBLAS runs on every CUDA GPU PyTorch supports."""
    return None


def prepare(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, target: Target | None = None) -> Launch:
    """out = a @ b through `torch.matmul(..., out=out)`; the call allocates nothing."""
    return Launch(lambda: torch.matmul(a, b, out=out), {"impl": "cuBLAS"})
