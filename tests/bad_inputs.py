"""The bad inputs every entry point must refuse with a clear error, and the error each gets: one
list for the GPU tests and for the CPU tests that fake a GPU (the tensors are made when a test
calls `make`, so inside a FakeTensorMode they are fake)."""

import pytest
import torch


def _cuda(*shape, dtype=torch.float16):
    return torch.empty(*shape, device="cuda", dtype=dtype)


BAD_INPUTS = [
    pytest.param(
        lambda: (torch.empty(8, 8, dtype=torch.float16), torch.empty(8, 8, dtype=torch.float16)),
        ValueError,
        "(?i)cuda",  # no CUDA GPU here (named with the torch build), or: move it with a.cuda()
        id="cpu",
    ),
    pytest.param(
        lambda: (_cuda(8, 8, dtype=torch.float32), _cuda(8, 8, dtype=torch.float32)),
        TypeError,
        "float16",
        id="fp32",
    ),
    pytest.param(
        lambda: (_cuda(8, 8), _cuda(8, 8, dtype=torch.bfloat16)), TypeError, "same dtype", id="mixed-dtype"
    ),
    pytest.param(lambda: (_cuda(8, 16), _cuda(8, 8)), ValueError, "match", id="shape-mismatch"),
    pytest.param(lambda: (_cuda(2, 8, 8), _cuda(8, 8)), ValueError, "2-D", id="3d"),
    pytest.param(lambda: ([[1.0]], _cuda(8, 8)), TypeError, "torch.Tensor", id="not-a-tensor"),
]
