"""The experts of a transformers mixture-of-experts model on the survey's grouped GEMM: the experts
implementation "gluon_survey", and `patch_experts(model)`, which switches a model to it.

transformers 5 keeps a mixture-of-experts layer's experts as 3-D Parameters (`gate_up_proj`
[E, 2 * I, H], `down_proj` [E, H, I]; Mixtral, Qwen3-MoE, ...) in a module whose forward
dispatches on `config._experts_implementation` to a function registered in
`transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS` ("eager", "grouped_mm", ...). `register()`
adds `experts_forward` under the name "gluon_survey"; `patch_experts(model)` registers it, checks
every experts module of the model (`experts_modules` lists them), and sets their configs'
`_experts_implementation` to it. transformers is imported only by these two, when called (it is
the optional extra `.[models]`).

    gluon_survey.patch_experts(model)                   # or, once registered:
    model.config._experts_implementation = "gluon_survey"
    model.config._experts_implementation = "grouped_mm"  # back to transformers' own

`experts_forward` computes what transformers' "grouped_mm" computes, step for step: the
(token, expert) pairs sorted by expert (`moe.route`), the gate-and-up projection, the model's own
gate (`module._apply_gate`: its activation and its gate/up split), the down projection, each pair
weighted by its routing weight, and each token's k pairs summed in the router's order. Only the
two projections differ: they run on the operator `gluon_survey::grouped_mm` (`gluon_survey.moe`:
the survey's grouped kernel forward, torch._grouped_mm for the gradients) instead of
torch._grouped_mm, and the offsets come from a sort and a searchsorted instead of histc and
cumsum (the same integers). Nothing reads routing to the host, so a forward can be captured in a
CUDA graph. Pairs routed to an expert id at or above the number of experts (expert parallelism's
marker for experts held elsewhere) contribute zero, as in transformers, which flags such modules
`_is_expert_parallel`: a module flagged False gets no mask for them.

What it takes (`experts_reason` says why a module cannot run on it): the weights stored as
transformers stores them by default ([E, N, K], `is_transposed` False: the kernel reads the
[E, K, N] transpose view without a copy), fp16 or bf16 on a CUDA device (Hopper; Blackwell's
tcgen05 version is compile-checked only), hidden and intermediate sizes multiples of 8 (TMA's
16-byte rows), and for training bf16 (the gradients' torch._grouped_mm). Biases (`has_bias`) and
experts without a gate (`has_gate` False: `up_proj` and the activation alone) are handled as
transformers handles them.

The fused gate. In inference above `grouped_auto.DECODE_ROWS` token-slots (prefill), the
gate-and-up projection and the gate run as one kernel (`moe.grouped_swiglu`: the 128-row grouped
kernel with silu(gate) * up in its epilogue, so h [S, 2I] is never written and read back) where
all of this holds, and as above otherwise: the module's gate is SwiGLU on transformers' standard
split (`swiglu_gate`: its `_apply_gate`, or its `act_fn` on the chunked halves, computes
silu(h[:, :I]) * h[:, I:], checked once on a test input: a clamped gate as gpt-oss's, or one
whose gate and up rows alternate, falls back), it has a gate and no gate_up bias, and no
gradient is wanted (grad mode off, or neither the tokens nor the weight requires one: training
keeps the unfused path). The fused kernel rounds once, from fp32, where the unfused path rounds h
first. Measured kernel-only on the four `--shapes moe` models' gate_up (H100, docs/perf-notes.md,
entry 63; results/experiments/h100-glu-probe): 1.01-1.15x the unfused path at 512 tokens,
1.08-1.39x at 4096 and 1.12-1.44x at 16384; but 0.81-0.95x at 1 and 16 tokens, where the unfused
path's GEMM is the swap-AB kernel, which has no fused gate. Hence the line at DECODE_ROWS, where
grouped_matmul itself leaves the swap-AB kernel (`FUSED_SWIGLU_ABOVE` moves it; `FUSED_SWIGLU =
False` turns the fused gate off).

The routed path. In decode the layer's kernels are small and its launches are the host's time
(a 4-layer Qwen3-MoE-shaped model's generate makes ~300 launches a token on an H100, and the
sorted path above takes ~16 a layer: docs/perf-notes.md, entry 67). Where a call has at most
`ROUTED_PAIRS_PER_EXPERT` (token, expert) pairs per expert on average (decode: Qwen3-30B-A3B up
to 16 tokens, Mixtral-8x7B at 1 to 4), in inference, in eager mode, with the fused gate's
conditions (a SwiGLU gate on transformers' split, no bias) and H and I within one chunk of
`moe.routed_max_k`, the whole layer runs as `moe.routed_experts`: two kernels that read each
pair's expert id from top_k_index themselves (kernels/routed.py), with no sort, no offsets, no
gather and no scatter. It reads each pair's expert rows once per pair (L2 serves a row that two
pairs share), which is why it stops at one pair per expert. `ROUTED = False` turns it off.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from . import api, grouped_auto, moe
from .grouped import DTYPES, TMA_K

NAME = "gluon_survey"
NEEDS_TRANSFORMERS = (
    "the gluon_survey experts implementation needs transformers 5 (its experts interface, "
    "transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS): pip install -e .[models]"
)

__all__ = [
    "FUSED_SWIGLU",
    "FUSED_SWIGLU_ABOVE",
    "NAME",
    "ROUTED",
    "ROUTED_PAIRS_PER_EXPERT",
    "experts_forward",
    "experts_modules",
    "experts_reason",
    "patch_experts",
    "register",
    "swiglu_gate",
]

# Run the gate-and-up projection and a SwiGLU gate as one kernel in inference (module docstring),
# for calls of more than FUSED_SWIGLU_ABOVE token-slots (None: grouped_auto.DECODE_ROWS).
FUSED_SWIGLU = True
FUSED_SWIGLU_ABOVE: int | None = None
# The routed kernels (module docstring, "The routed path") for calls of at most
# ROUTED_PAIRS_PER_EXPERT (token, expert) pairs per expert on average; ROUTED = False turns them off.
ROUTED = True
ROUTED_PAIRS_PER_EXPERT = 1
_SWIGLU_SEEN = "_gluon_survey_swiglu_gate"  # where `swiglu_gate` keeps its answer on a module


def _grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """The grouped product of one projection (a seam: the CPU tests put torch._grouped_mm here)."""
    return moe.grouped_mm(x, w, offs)


def _grouped_swiglu(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """The gate-and-up projection with its SwiGLU in one kernel (a seam, as `_grouped`)."""
    return moe.grouped_swiglu(x, w, offs)


def _routed(hidden, w_gate_up, w_down, top_k_index, top_k_weights) -> torch.Tensor:
    """The whole layer on the routed kernels (a seam, as `_grouped`)."""
    return moe.routed_experts(hidden, w_gate_up, w_down, top_k_index, top_k_weights)


def swiglu_gate(module: nn.Module) -> bool:
    """Whether the module's gate is silu(gate) * up with gate = the first I channels of gate_up and
    up = the last I (transformers' standard split), what the fused kernel computes: its
    `_apply_gate` (or, without one, its `act_fn` on the two halves) run once on a test input in
    fp32 on the CPU, values up to +-50 (beyond gpt-oss's clamp at 7), against F.silu. The answer
    is kept on the module. A gate that fails to run on the test input (or a check under a fake
    tensor mode, where the values are unknown) counts as another gate, unkept: checked again on
    the next call."""
    seen = module.__dict__.get(_SWIGLU_SEEN)
    if seen is not None:
        return seen
    weight = getattr(module, "gate_up_proj", None)
    ok = False
    if getattr(module, "has_gate", True) and isinstance(weight, torch.Tensor) and weight.dim() == 3:
        half = weight.shape[1] // 2
        h = torch.linspace(-50.0, 50.0, 4 * 2 * half).reshape(2 * half, 4).t().contiguous()  # [4, 2I]
        try:
            with torch.no_grad():
                if hasattr(module, "_apply_gate"):
                    got = module._apply_gate(h)
                else:
                    got = module.act_fn(h[:, :half]) * h[:, half:]
            expected = F.silu(h[:, :half]) * h[:, half:]
            ok = tuple(got.shape) == tuple(expected.shape) and torch.allclose(
                got, expected, rtol=1e-4, atol=1e-4
            )
        except Exception:  # a gate that cannot run on the test input: not the fused kernel's
            return False
    module.__dict__[_SWIGLU_SEEN] = ok
    return ok


def _fuse_gate(module: nn.Module, x: torch.Tensor, w: torch.Tensor, bias) -> bool:
    """Whether this call runs the fused gate: the switch, more token-slots than the line (x's rows
    above `FUSED_SWIGLU_ABOVE`, by default `grouped_auto.DECODE_ROWS`), a SwiGLU gate with no
    bias before it, and no gradient wanted (module docstring). Under torch.compile a module not
    yet checked stays unfused (the check runs in `patch_experts`, or in the first eager call)."""
    above = grouped_auto.DECODE_ROWS if FUSED_SWIGLU_ABOVE is None else FUSED_SWIGLU_ABOVE
    if not FUSED_SWIGLU or x.shape[0] <= above or bias is not None or not getattr(module, "has_gate", True):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return False
    if _SWIGLU_SEEN not in module.__dict__ and torch.compiler.is_compiling():
        return False
    return swiglu_gate(module)


def _routes_in_kernels(module: nn.Module, hidden, top_k_index, top_k_weights, num_experts: int) -> bool:
    """Whether this call runs the routed kernels (module docstring, "The routed path"): the switch,
    at most ROUTED_PAIRS_PER_EXPERT (token, expert) pairs per expert, inference in eager mode on a
    CUDA tensor, a SwiGLU gate with no bias, no post-expert norm, weights stored [E, N, K] and
    contiguous in the tokens' fp16/bf16, contiguous routing, and H and I within one chunk."""
    if not ROUTED or hidden.shape[0] * top_k_index.shape[-1] > ROUTED_PAIRS_PER_EXPERT * num_experts:
        return False
    if getattr(module, "has_bias", False) or not getattr(module, "has_gate", True):
        return False
    if getattr(module, "has_post_expert_norm", False) or getattr(module, "is_transposed", False):
        return False
    w, down = module.gate_up_proj, module.down_proj
    wanted = (hidden, w, down, top_k_weights)
    if torch.is_grad_enabled() and any(t.requires_grad for t in wanted):
        return False
    if not api.untraced_cuda(hidden, w) or hidden.dtype not in moe.ROUTED_DTYPES:
        return False
    if w.dtype != hidden.dtype or down.dtype != hidden.dtype or w.dim() != 3 or down.dim() != 3:
        return False
    if not all(t.is_contiguous() for t in (*wanted, top_k_index)):
        return False
    if max(hidden.shape[1], down.shape[2]) > moe.routed_max_k(hidden.element_size()):
        return False
    return swiglu_gate(module)


def _projection(module: nn.Module, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The [E, K, N] transpose view of the projection's [E, N, K] Parameter, and its bias or None."""
    weight = getattr(module, name)
    bias = getattr(module, f"{name}_bias", None) if getattr(module, "has_bias", False) else None
    return weight.transpose(-2, -1), bias


def experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The experts implementation "gluon_survey": transformers calls it as the experts module's
    forward (`self` the module) with hidden_states [T, H], top_k_index [T, k] (expert ids) and
    top_k_weights [T, k] (routing weights); returns [T, H] in hidden_states' dtype."""
    num_experts = getattr(self, "num_experts", None) or self.down_proj.shape[0]
    tokens, hidden = hidden_states.shape
    k = top_k_index.shape[-1]
    if top_k_weights.numel() != tokens * k:
        raise ValueError(
            f"top_k_weights has shape {tuple(top_k_weights.shape)}; the gluon_survey experts take one "
            f"routing weight per chosen expert, [T, k] = [{tokens}, {k}]"
        )
    if _routes_in_kernels(self, hidden_states, top_k_index, top_k_weights, num_experts):
        return _routed(hidden_states, self.gate_up_proj, self.down_proj, top_k_index, top_k_weights)
    expert_ids, perm, offs = moe.route(top_k_index, num_experts)
    weights = top_k_weights.reshape(-1)[perm]
    x = hidden_states[perm // k]  # the pairs' tokens, grouped by expert
    # Pairs of experts held elsewhere sort last, at or past offs[-1]: no expert owns their rows, so
    # the kernels neither read nor write them, and only their outputs are zeroed (below). Only
    # expert parallelism routes to such ids: transformers flags its modules `_is_expert_parallel`
    # (a module without the flag is taken to be one), and the others skip the mask's two kernels.
    parallel = getattr(self, "_is_expert_parallel", True)
    elsewhere = (expert_ids >= num_experts).unsqueeze(-1) if parallel else None

    has_gate = getattr(self, "has_gate", True)
    w, bias = _projection(self, "gate_up_proj" if has_gate else "up_proj")
    x = x.to(w.dtype)
    if _fuse_gate(self, x, w, bias):
        h = _grouped_swiglu(x, w, offs)  # [S, I]: silu(gate) * up in the kernel's epilogue
    else:
        h = _grouped(x, w, offs)  # [S, 2 * I] (or [S, I] without a gate)
        if bias is not None:
            h.add_(bias[expert_ids.clamp(max=num_experts - 1)])
        if not has_gate:
            h = self.act_fn(h)
        elif hasattr(self, "_apply_gate"):
            h = self._apply_gate(h)  # the model's activation and gate/up split
        else:  # transformers before the gate hook: gate and up concatenated
            gate, up = h.chunk(2, dim=-1)
            h = self.act_fn(gate) * up

    w, bias = _projection(self, "down_proj")
    y = _grouped(h.to(w.dtype), w, offs)  # [S, H]
    if bias is not None:
        y.add_(bias[expert_ids.clamp(max=num_experts - 1)])
    if elsewhere is not None:
        y.masked_fill_(elsewhere, 0.0)  # before the weights, so that their gradient there is 0, not NaN
    y = y * weights.unsqueeze(-1)

    out = torch.empty_like(y)  # back to (token, k) order: sorted pair i is pair perm[i]
    out.index_copy_(0, perm, y)
    return out.view(tokens, k, hidden).sum(dim=1).to(hidden_states.dtype)


def _experts_interface():
    """transformers' registry of experts implementations, or ImportError with the install line."""
    try:
        moe_module = importlib.import_module("transformers.integrations.moe")
    except ImportError:
        raise ImportError(NEEDS_TRANSFORMERS) from None
    interface = getattr(moe_module, "ALL_EXPERTS_FUNCTIONS", None)
    if interface is None:
        version = getattr(importlib.import_module("transformers"), "__version__", "?")
        raise ImportError(f"transformers {version} has no experts interface. {NEEDS_TRANSFORMERS}")
    return interface


def register() -> None:
    """Register `experts_forward` with transformers as the experts implementation "gluon_survey"
    (again: the same function, nothing changes). ImportError naming `pip install -e .[models]`
    without transformers 5."""
    _experts_interface().register(NAME, experts_forward)


def experts_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(name, module) for every module that dispatches on `config._experts_implementation` and holds
    3-D expert weights."""
    for name, module in model.named_modules():
        config = getattr(module, "config", None)
        down = getattr(module, "down_proj", None)
        if (
            config is not None
            and hasattr(config, "_experts_implementation")
            and isinstance(down, torch.Tensor)
            and down.dim() == 3
        ):
            yield name, module


def experts_reason(module: nn.Module) -> str | None:
    """Why `experts_forward` cannot run this experts module, or None if it can. Decided from the
    module alone, without a GPU."""
    if getattr(module, "is_transposed", False):
        return (
            "its weights are stored [E, K, N] (is_transposed); the grouped kernel reads [E, N, K] "
            "weights behind a transpose view"
        )
    names = ("gate_up_proj" if getattr(module, "has_gate", True) else "up_proj", "down_proj")
    for name in names:
        weight = getattr(module, name, None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 3:
            return f"it has no 3-D {name} Parameter"
        if weight.dtype not in DTYPES:
            return (
                f"{name} is {weight.dtype}; the kernel takes float16 or bfloat16 (model.to(torch.bfloat16))"
            )
        if weight.device.type != "cuda":
            return f"{name} is on {weight.device}; the kernel runs on a CUDA GPU (model.cuda())"
        if not weight.is_contiguous():
            return f"{name} (strides {weight.stride()}) is not contiguous [E, N, K]"
        if weight.shape[2] % TMA_K:
            return (
                f"{name} is {tuple(weight.shape)}: its K = {weight.shape[2]} is not a multiple of {TMA_K} "
                "(TMA's 16-byte rows)"
            )
    return None


def patch_experts(model: nn.Module) -> tuple[str, ...]:
    """Run every experts module of a transformers model on `experts_forward`: registers it (see
    `register`), checks every module (ValueError naming each module that cannot run on it and why,
    before anything changes), then sets each of their configs' `_experts_implementation` to
    "gluon_survey" (what the modules dispatch on; for Mixtral or Qwen3-MoE that is
    `model.config`). Returns the modules' names. Undo with `model.config._experts_implementation =
    "grouped_mm"` (or "eager"). A model with no experts module is a ValueError."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    register()
    found = list(experts_modules(model))
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no experts module (3-D down_proj weights behind "
            "config._experts_implementation): nothing to run on the grouped kernel"
        )
    refused = {name: reason for name, module in found if (reason := experts_reason(module))}
    if refused:
        listed = "; ".join(f"{name}: {reason}" for name, reason in refused.items())
        raise ValueError(f"these experts modules cannot run on gluon_survey's grouped kernel: {listed}")
    for _, module in found:
        swiglu_gate(module)  # checked once here, outside any torch.compile trace (FUSED_SWIGLU)
    for config in {id(m.config): m.config for _, m in found}.values():
        config._experts_implementation = NAME
    return tuple(name for name, _ in found)
