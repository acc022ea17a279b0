"""The `auto` mode: what `matmul(kernel=None)` runs. For each shape it asks `choice.choose` (the
committed table of measured results for this GPU, or the documented rule) for a mode and config,
and prepares that mode's launch; the config records the choice and why, so a results row says
what ran. As a mode of the registry it is measured by the driver like any other."""

from __future__ import annotations

import torch

from . import registry
from .choice import Choice, choose
from .launch import Launch, Scales, Target, a_layout, b_layout

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_FP8_NAMES = {"tensor": "fp8", "row": "fp8-row"}  # the driver's dtype names of the two scalings


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    return None  # on a GPU without Gluon rungs the rule picks cuBLAS


def _choice(a, b, target: Target, scaling: str | None) -> Choice:
    """What `choose` picks for these operands (`scaling`: the fp8 scales' kind, None for 16-bit), by
    their B and A layouts: an A in layout "t" takes the table's A-t entries (or the rule)."""
    M, K = a.shape
    dtype = _DTYPE_NAMES[a.dtype] if scaling is None else _FP8_NAMES[scaling]
    choice = choose(
        M, b.shape[1], K, dtype, b_layout(b), target.capability, target.name, target.sm_count, a_layout(a)
    )
    if scaling is not None and choice.mode == "torch" and (b.shape[1] % 16 or K % 16):
        choice = Choice("warpspec", None, f"{choice.why}; but cuBLAS fp8 needs N and K multiples of 16")
    return choice


def reads_transposed_a(a, b, target: Target, fp8: bool = False) -> bool:
    """Whether the mode `choose` picks for 16-bit operands like these (A's layout "t" included: the
    table's A-t entries) reads a transposed A in place (the provider contract:
    gluon_survey/registry.py); fp8 operands never do (fp8 MMAs read A K-major). Where it does not,
    `matmul` copies A to row-major and `prepare` chooses for the row-major copy."""
    if fp8:
        return False
    provider = registry.get(_choice(a, b, target, None).mode).provider(target.capability)
    reads = getattr(provider, "reads_transposed_a", None)
    return reads is not None and reads(a, b, target)


def prepare(a, b, out, target: Target, scales: Scales | None = None, bias=None) -> Launch:
    choice = _choice(a, b, target, None if scales is None else scales.kind)
    provider = registry.get(choice.mode).provider(target.capability)
    fp8 = {} if scales is None else {"scales": scales}
    extra = fp8 if bias is None else fp8 | {"bias": bias}  # every mode `choose` picks takes a bias
    if choice.config is None:
        launch = provider.prepare(a, b, out, target, **extra)
    else:
        cfg = provider.candidates(target.capability, **({"fp8": True} if fp8 else {}))[choice.config]
        launch = provider.prepare(a, b, out, target, cfg, **extra)
    return Launch(launch.fn, {"mode": choice.mode, **launch.config, "why": choice.why})
