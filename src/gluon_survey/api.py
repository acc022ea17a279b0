"""`matmul(a, b)` for every mode of the survey, and the input checks they all share.

TMA can only describe a 2-D tensor whose inner stride is 1, whose other stride is a multiple of 16
bytes and whose base address is 16-byte aligned. `prepare` makes every input satisfy that before a
kernel sees it: an operand that does not is copied once into a buffer whose rows are padded to a
multiple of 16 bytes (the padding is never read: the descriptor keeps the logical shape, and TMA
fills the K tail with zeros), and an output that does not is computed into such a buffer and
copied back. The copy is reported in the config (`aligned_copy`), so a timed row shows it.
Everything else that is wrong (CPU tensors, fp32, mismatched shapes or dtypes, a kernel this GPU
cannot run) raises a TypeError / ValueError / RuntimeError that says what to do.
"""

from __future__ import annotations

import functools

import torch

from . import registry
from .launch import Launch, Target, b_layout

DTYPES = (torch.float16, torch.bfloat16)
_ALIGN = 16  # bytes: TMA base and stride alignment

# Fastest correct mode per architecture, from the committed benchmarks (results/, README).
_DEFAULT_MODE = {9: "warpspec", 10: "warpspec"}


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def capability_of(device: torch.device) -> tuple[int, int]:
    return target_of(device).capability


def capability() -> tuple[int, int] | None:
    """Compute capability of the current CUDA device, or None without one."""
    if not torch.cuda.is_available():
        return None
    return _capability(torch.cuda.current_device())


@functools.cache
def _target(index: int) -> Target:
    return Target(_capability(index), torch.cuda.get_device_properties(index).multi_processor_count)


def target_of(device: torch.device) -> Target:
    """The GPU a launch on `device` is prepared for: capability and SM count, read once per device."""
    return _target(device.index if device.index is not None else torch.cuda.current_device())


# --------------------------------------------------------------------------------------------------
# Validation and alignment


def _check_operands(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(
                f"{name} is {t.dtype}; the survey's kernels take float16 or bfloat16 "
                f"(convert with {name}.half() or {name}.bfloat16())"
            )
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}; move it to the GPU with {name}.cuda()")
    if a.dtype != b.dtype:
        raise TypeError(f"a is {a.dtype} but b is {b.dtype}; give both the same dtype")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}; put both on one GPU")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"shapes {tuple(a.shape)} @ {tuple(b.shape)} do not match: a.shape[1] must equal b.shape[0]"
        )
    if out is not None:
        M, N = a.shape[0], b.shape[1]
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != (M, N):
            raise ValueError(f"out has shape {tuple(out.shape)}, expected ({M}, {N})")
        if out.dtype != a.dtype:
            raise TypeError(f"out is {out.dtype}, expected {a.dtype} (the inputs' dtype)")
        if out.device != a.device:
            raise ValueError(f"out is on {out.device}, expected {a.device}")


def _tma_ok(t: torch.Tensor) -> bool:
    """A row-major 2-D view TMA can describe: unit inner stride, 16-byte row stride and base."""
    es = t.element_size()
    return t.stride(1) == 1 and (t.stride(0) * es) % _ALIGN == 0 and t.data_ptr() % _ALIGN == 0


def _aligned_empty(rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
    """A [rows, cols] view of a buffer whose row stride is padded to a multiple of 16 bytes."""
    per = _ALIGN // like.element_size()
    padded = -(-cols // per) * per
    return torch.empty((rows, padded), dtype=like.dtype, device=like.device)[:, :cols]


def _aligned(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """t itself if TMA can describe it, else an aligned copy (and True)."""
    if _tma_ok(t):
        return t, False
    buf = _aligned_empty(*t.shape, like=t)
    buf.copy_(t)
    return buf, True


def _aligned_b(b: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """B as row-major [K, N] or as the transpose view of a [N, K] weight, whichever it is."""
    if b_layout(b) == "t":  # w.t(): describe the [N, K] weight instead
        w, copied = _aligned(b.t())
        return w.t(), copied
    return _aligned(b)


def prepare(mode: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> Launch:
    """A ready launch of `mode` computing out = a @ b (validated, aligned, compiled lazily).

    This is what the driver times: when an operand needs an aligned copy, that copy is made here,
    once, and is not part of `Launch.fn`; an output that needs one is copied back inside `fn`.
    """
    _check_operands(a, b, out)
    m = registry.get(mode)
    target = target_of(a.device)
    reason = m.unsupported_reason(target.capability)
    if reason:
        raise RuntimeError(f"mode {m.name!r} cannot run on this GPU: {reason}")
    M, N = a.shape[0], b.shape[1]
    if out is None:
        out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if M == 0 or N == 0 or a.shape[1] == 0:
        return Launch(lambda: out.zero_(), {"impl": "empty or K=0: zeros"})

    a2, copied_a = _aligned(a)
    b2, copied_b = _aligned_b(b)
    c2 = out if _tma_ok(out) else _aligned_empty(M, N, out)
    launch = m.provider(target.capability).prepare(a2, b2, c2, target)
    config = launch.config  # the provider's own dict: autotuned modes fill it in on the first call
    copies = [n for n, c in (("a", copied_a), ("b", copied_b), ("out", c2 is not out)) if c]
    if copies:
        config["aligned_copy"] = ",".join(copies)
    if c2 is out:
        return Launch(launch.fn, config)

    def fn():
        result = launch.fn()
        out.copy_(result if isinstance(result, torch.Tensor) else c2)

    return Launch(fn, config)


def default_mode(a: torch.Tensor) -> str:
    """The mode `matmul(kernel=None)` runs: the fastest correct one measured for this GPU."""
    return _DEFAULT_MODE.get(capability_of(a.device)[0], registry.BASELINE)


def matmul(a: torch.Tensor, b: torch.Tensor, *, kernel: str | None = None, out: torch.Tensor | None = None):
    """a @ b with one of the survey's kernels (`kernel` = a mode name; None = fastest for this GPU).

    a: [M, K]; b: [K, N] row-major or the transpose view of a contiguous [N, K] weight (`w.t()`,
    no copy); fp16 or bf16 CUDA tensors; fp32 accumulation, result in the inputs' dtype.
    """
    _check_operands(a, b, out)
    mode = kernel if kernel is not None else default_mode(a)
    M, N = a.shape[0], b.shape[1]
    if out is None:
        out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    launch = prepare(mode, a, b, out)
    result = launch.fn()
    if isinstance(result, torch.Tensor) and result is not out:  # providers that return a new tensor
        out.copy_(result)
    return out


def explain(a: torch.Tensor, b: torch.Tensor, kernel: str | None = None) -> str:
    """Which kernel and config `matmul(a, b, kernel=kernel)` would run, and why. Nothing is launched
    (an operand TMA cannot describe is copied, as `matmul` would)."""
    _check_operands(a, b, None)
    cap = capability_of(a.device)
    mode = registry.get(kernel if kernel is not None else default_mode(a))
    why = (
        f"asked for {mode.name!r}"
        if kernel is not None
        else f"{mode.name!r} is the fastest correct mode measured on sm_{cap[0]}{cap[1]}"
    )
    reason = mode.unsupported_reason(cap)
    if reason:
        return f"{mode.name}: cannot run here ({reason})"
    layout = {"t": "t (transpose view of a [N,K] weight)", "row": "row"}[b_layout(b)]
    lines = [
        f"mode: {mode.name} - {mode.summary}",
        f"why: {why}",
        f"problem: M={a.shape[0]} N={b.shape[1]} K={a.shape[1]}"
        f" {str(a.dtype).removeprefix('torch.')} B={layout}",
    ]
    config = prepare(mode.name, a, b).config  # descriptors and config only: nothing is launched
    lines.append("config: " + ", ".join(f"{k}={v}" for k, v in config.items()))
    if "aligned_copy" in config:
        lines.append("aligned copy: a row stride or base address is not a multiple of 16 bytes")
    return "\n".join(lines)
