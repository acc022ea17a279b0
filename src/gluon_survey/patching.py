"""`patch(model)`: every `torch.nn.Linear` of a model swapped for `gluon_survey.Linear`, in one call;
`unpatch(model)` swaps them back.

The swap keeps the module's own weight and bias Parameters (`Linear.from_linear`: the very same
objects, not copies), so an optimizer built before, `state_dict()` keys and values, and weight
tying stay as they were; the module keeps its training mode. A module the survey's kernels cannot
take is left alone and named in the report with the reason: a weight that is not on a CUDA device
or not float16 / bfloat16 (fp32, fp8, ...), a bias of another dtype or device than the weight, or
a subclass of `nn.Linear` (its `forward` may not be `x @ weight.T + bias`). These are decided from
the module alone, without a GPU: move and convert the model first (`model.to("cuda",
torch.bfloat16)`), then patch. Inputs must then have the weight's dtype: `gluon_survey.Linear`
does not autocast (an fp32 input is a TypeError that says so). No shape is refused: a weight whose
rows TMA cannot describe (in_features * 2 bytes not a multiple of 16) is copied to an aligned
buffer on every call (`gluon_survey.explain` shows `aligned_copy`).

Patching twice changes nothing (modules already swapped are reported as such); a module reachable
under several names (shared) is swapped once and replaced under every name. The forward hooks and
`__dict__` extras of a swapped `nn.Linear` do not carry over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from . import registry
from .api import DTYPES
from .ops import Linear


@dataclass(frozen=True)
class PatchReport:
    """What `patch` did: `swapped`, the names (as `model.named_modules()` gives them) of the modules
    now `gluon_survey.Linear`; `skipped`, name -> why, for the `nn.Linear` modules left alone and
    those already patched. `int(report)` and `len(report)` are the number swapped."""

    swapped: tuple[str, ...] = ()
    skipped: dict[str, str] = field(default_factory=dict)

    def __int__(self) -> int:
        return len(self.swapped)

    def __len__(self) -> int:
        return len(self.swapped)


def skip_reason(module: nn.Linear) -> str | None:
    """Why `patch` leaves this nn.Linear alone, or None if the survey's kernels can run it."""
    if isinstance(module, Linear):
        return "already a gluon_survey.Linear"
    if type(module) is not nn.Linear:
        return f"a subclass of nn.Linear ({type(module).__qualname__}) whose forward may differ"
    weight, bias = module.weight, module.bias
    if weight.dtype not in DTYPES:
        return f"weight is {weight.dtype}; the kernels take float16 or bfloat16 (model.to(torch.bfloat16))"
    if weight.device.type != "cuda":
        return f"weight is on {weight.device}; the kernels run on a CUDA GPU (model.cuda())"
    if bias is not None and (bias.dtype != weight.dtype or bias.device != weight.device):
        return f"bias is {bias.dtype} on {bias.device}, weight {weight.dtype} on {weight.device}"
    return None


def _children(model: nn.Module, prefix: str = ""):
    """(parent, attribute, child, name) for every child slot under `model`, each module's children
    visited once (a shared module's slots are all listed, its subtree once)."""
    seen: set[int] = set()
    stack = [(model, prefix)]
    while stack:
        parent, name = stack.pop()
        if id(parent) in seen:
            continue
        seen.add(id(parent))
        for attr, child in list(parent._modules.items()):
            if child is None:
                continue
            full = f"{name}.{attr}" if name else attr
            yield parent, attr, child, full
            stack.append((child, full))


def _replace(model: nn.Module, select: Callable[[str, nn.Module], nn.Module | None]) -> list[str]:
    """Put `select(name, child)` (when not None) in place of each child, the same replacement for
    every slot that holds one module; the names replaced, first name of each module, in order."""
    made: dict[int, nn.Module | None] = {}
    names: list[str] = []
    for parent, attr, child, name in list(_children(model)):
        if id(child) not in made:
            made[id(child)] = select(name, child)
            if made[id(child)] is not None:
                names.append(name)
        new = made[id(child)]
        if new is not None:
            setattr(parent, attr, new)
    return names


def patch(
    model: nn.Module,
    *,
    kernel: str | None = None,
    filter: Callable[[str, nn.Module], bool] | None = None,
) -> PatchReport:
    """Swap every `nn.Linear` under `model` (those `filter(name, module)` keeps) for a
    `gluon_survey.Linear` on the same Parameters, running `kernel` (a mode name; None: matmul's
    default). Modules the kernels cannot take are left alone (module docstring). Returns a
    `PatchReport`: `int(report)` is how many were swapped, `report.skipped` says why others were
    not. A model that is itself an nn.Linear cannot be swapped in place: use
    `gluon_survey.Linear.from_linear(model)`."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if kernel is not None:
        registry.get(kernel)  # KeyError naming the valid modes, before anything is swapped
    if filter is not None and not callable(filter):
        raise TypeError(f"filter must be a function (name, module) -> bool, got {type(filter).__name__}")
    skipped: dict[str, str] = {}
    if isinstance(model, nn.Linear):
        skipped[""] = "the model itself is an nn.Linear: use gluon_survey.Linear.from_linear(model)"

    def select(name: str, child: nn.Module) -> nn.Module | None:
        if not isinstance(child, nn.Linear) or (filter is not None and not filter(name, child)):
            return None
        reason = skip_reason(child)
        if reason is not None:
            skipped[name] = reason
            return None
        new = Linear.from_linear(child, kernel=kernel)
        new.train(child.training)
        return new

    swapped = _replace(model, select)
    return PatchReport(tuple(swapped), skipped)


def unpatch(model: nn.Module) -> int:
    """Swap every `gluon_survey.Linear` under `model` back for a `torch.nn.Linear` on the same
    Parameters; returns how many were swapped back."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")

    def select(name: str, child: nn.Module) -> nn.Module | None:
        if not isinstance(child, Linear):
            return None
        new = nn.Linear(
            child.in_features,
            child.out_features,
            bias=child.bias is not None,
            device="meta",  # placeholders, replaced below: nothing is allocated or initialised
            dtype=child.weight.dtype,
        )
        new.weight = child.weight
        new.bias = child.bias
        new.train(child.training)
        return new

    return len(_replace(model, select))
