"""The `auto` mode: what `matmul(kernel=None)` runs. For each shape it asks `choice.choose` (the
committed table of measured results for this GPU, or the documented rule) for a mode and config,
and prepares that mode's launch; the config records the choice and why, so a results row says
what ran. As a mode of the registry it is measured by the driver like any other."""

from __future__ import annotations

import torch

from . import registry
from .choice import Choice, choose
from .launch import Launch, Scales, Target, b_layout

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_FP8_NAMES = {"tensor": "fp8", "row": "fp8-row"}  # the driver's dtype names of the two scalings


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    return None  # on a GPU without Gluon rungs the rule picks cuBLAS


def prepare(a, b, out, target: Target, scales: Scales | None = None, bias=None) -> Launch:
    M, K = a.shape
    dtype = _DTYPE_NAMES[a.dtype] if scales is None else _FP8_NAMES[scales.kind]
    choice = choose(M, b.shape[1], K, dtype, b_layout(b), target.capability, target.name, target.sm_count)
    if scales is not None and choice.mode == "torch" and (b.shape[1] % 16 or K % 16):
        choice = Choice("warpspec", None, f"{choice.why}; but cuBLAS fp8 needs N and K multiples of 16")
    provider = registry.get(choice.mode).provider(target.capability)
    fp8 = {} if scales is None else {"scales": scales}
    extra = fp8 if bias is None else fp8 | {"bias": bias}  # every mode `choose` picks takes a bias
    if choice.config is None:
        launch = provider.prepare(a, b, out, target, **extra)
    else:
        cfg = provider.candidates(target.capability, **({"fp8": True} if fp8 else {}))[choice.config]
        launch = provider.prepare(a, b, out, target, cfg, **extra)
    return Launch(launch.fn, {"mode": choice.mode, **launch.config, "why": choice.why})
