"""The `auto` mode: what `matmul(kernel=None)` runs. For each shape it asks `choice.choose` (the
committed table of measured results for this GPU, or the documented rule) for a mode and config,
and prepares that mode's launch; the config records the choice and why, so a results row says
what ran. As a mode of the registry it is measured by the driver like any other."""

from __future__ import annotations

import torch

from . import registry
from .choice import choose
from .launch import Launch, Target, b_layout

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    return None  # on a GPU without Gluon rungs the rule picks cuBLAS


def prepare(a, b, out, target: Target) -> Launch:
    M, K = a.shape
    choice = choose(M, b.shape[1], K, _DTYPE_NAMES[a.dtype], b_layout(b), target.capability, target.name)
    provider = registry.get(choice.mode).provider(target.capability)
    if choice.config is None:
        launch = provider.prepare(a, b, out, target)
    else:
        launch = provider.prepare(a, b, out, target, provider.candidates(target.capability)[choice.config])
    return Launch(launch.fn, {"mode": choice.mode, **launch.config, "why": choice.why})
