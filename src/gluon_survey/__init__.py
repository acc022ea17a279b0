"""gluon-survey: a ladder of Gluon GEMM kernels (Blocked -> Pipelined -> persistent -> warpspec, and
splitk -> swapab for few-token GEMMs) measured against cuBLAS, torch.compile and Triton.
`matmul(a, b, kernel=...)` runs any mode of the survey (by default, per shape, the one measured
fastest on this GPU); `explain(a, b)` says which kernel and config it would run and why.
`ops.matmul` is the same as a PyTorch operator (torch.compile, autograd) and `Linear` a drop-in
`torch.nn.Linear` on it; both live in `gluon_survey.ops`, imported (and the operator registered)
on first use. `patch(model)` swaps a model's `nn.Linear` modules for `Linear` on the same
Parameters and `unpatch(model)` swaps them back (`gluon_survey.patching`, imported on first use).
`grouped_matmul(x, w, offs)` runs a mixture-of-experts layer's expert GEMMs in one launch
(`gluon_survey.grouped`, imported on first use; Hopper), and `grouped_swiglu(x, w, offs)` the
gate-and-up projection with its SwiGLU fused into the epilogue;
`gluon_survey.moe` has it as a PyTorch operator (torch.compile, autograd), and
`patch_experts(model)` runs a transformers mixture-of-experts model's experts on it
(`gluon_survey.experts`, imported on first use)."""

import importlib

from .api import explain, matmul
from .registry import MODES

__version__ = "0.1.0"
__all__ = [
    "MODES",
    "Linear",
    "PatchReport",
    "__version__",
    "explain",
    "grouped_matmul",
    "grouped_swiglu",
    "matmul",
    "ops",
    "patch",
    "patch_experts",
    "unpatch",
]


def __getattr__(name: str):
    """`gluon_survey.Linear` and `gluon_survey.ops`, `patch`, `unpatch` and `PatchReport`
    (`gluon_survey.patching`), `grouped_matmul` and `grouped_swiglu` (`gluon_survey.grouped`) and
    `patch_experts` (`gluon_survey.experts`), imported when first asked for."""
    if name in ("Linear", "ops"):
        ops = importlib.import_module(f"{__name__}.ops")
        return ops if name == "ops" else ops.Linear
    if name in ("patch", "unpatch", "PatchReport"):
        return getattr(importlib.import_module(f"{__name__}.patching"), name)
    if name in ("grouped_matmul", "grouped_swiglu"):
        return getattr(importlib.import_module(f"{__name__}.grouped"), name)
    if name == "patch_experts":
        return importlib.import_module(f"{__name__}.experts").patch_experts
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
