"""`matmul(a, b)` for every mode of the survey, and the input checks they all share.

TMA can only describe a 2-D tensor whose inner stride is 1, whose other stride is a multiple of 16
bytes and whose base address is 16-byte aligned. `prepare` makes every input satisfy that before a
kernel sees it: an operand that does not is copied once into a buffer whose rows are padded to a
multiple of 16 bytes (the padding is never read: the descriptor keeps the logical shape, and TMA
fills the K tail with zeros), and an output that does not is computed into such a buffer and
copied back. The copy is reported in the config (`aligned_copy`), so a timed row shows it.
Everything else that is wrong (CPU tensors, fp32, mismatched shapes or dtypes, a kernel this GPU
cannot run) raises a TypeError / ValueError / RuntimeError that says what to do.

**Plans.** `matmul` is called in loops (a model's layers, every step), so everything it works out
from the arguments' metadata is worked out once per *plan key* and cached: the checks' verdict,
the mode, the provider's config, grid and constexprs, the TMA descriptors' block shapes and
layouts, which operands need an aligned copy. A repeated call computes its key, allocates `out`
when none is given and launches through one function (`MatmulPlan.caller`); a rung's launch finds
its operands' TMA descriptors already encoded where their addresses were seen before
(`kernels.plan.Plan`), which a weight's always is. The key (`_plan_key`) is everything that
verdict and those choices read but the base addresses: the kernel asked for, the switch
`TRANSPOSED_A_IN_PLACE`, and per tensor (a, b, out or its absence) shape, strides, dtype and
device (which decides the GPU). (Strides decide the A and B layouts, "row" or "t", and whether
TMA can describe a tensor as it is.)

The bases' 16-byte alignment decides that too, but reading three addresses for the key costs a
call 0.5-1 µs on a slow host (docs/perf-notes.md, entry 49), and a rung's launch reads them
anyway, to find the encoded descriptors. So the plan under a key is the one for aligned bases,
and a base that is not aligned is found where the address is read: a rung's launch checks an
address the first time it meets it (an address seen before was checked then), and where the
launch does not (gemv's, the baselines') the plan's call checks the three first
(`MatmulPlan.check_bases`). Either raises `launch.Unaligned` before anything is launched, and
the call goes on with the plan for its alignment, keyed with it (`_call_new`), which copies the
misaligned operands. `prepare` makes no plan: it is what the driver times, once per measured
cell.

A provider takes part through its `Launch`: when `Launch.fn` carries a `plan` attribute with a
`launch(a, b, out)` method (the rungs' `kernels.plan.Plan`), calls of the same key launch that
plan on their own tensors; otherwise (the baselines) they call the provider's `prepare` each time
and launch its `fn`, which for cuBLAS is a lambda. Everything a call does per call can be
captured in a CUDA graph: no host synchronisation, and its only allocations (`out`, aligned
copies) come from PyTorch's caching allocator, which serves a capture from the graph's pool.

**CUDA graphs and the first call of a key.** A plan may be built where every allocation goes to
a CUDA graph's private pool: inside `torch.cuda.graph` capture, or in the warm-up run of
torch.compile's CUDA-graph trees (`mode="reduce-overhead"`, e.g. transformers' static-cache
`generate`), which sends the thread's allocations to the graph's pool. The rule: a plan keeps no
tensor that a call allocated. What it builds on stand-ins (the placeholder `out`, the aligned
buffers' layouts) is dropped before the call returns; the tensors that outlive it, the 1x1 tensor
its outputs are allocated like (one per dtype and device) and split-K's workspace, come from
`memory.persistent`, a pool of the package's own that no graph owns. A tensor kept from a
graph's pool would be memory the graph may hand out again, and CUDA-graph trees refuse it
("tensor(s) in the cudagraph pool not tracked as outputs"). One thing a capture cannot give:
zeroed memory (a fill is recorded, not run), so split-K's counters cannot be created or grown
inside a capture; that call raises a RuntimeError that asks for one call of the shape before the
capture, the usual CUDA-graph warm-up. CUDA-graph trees always warm up outside a capture.

TMA descriptors are encoded through the CUDA driver API, which needs a context current on the
calling thread: on a thread that has done no CUDA work yet (autograd's backward threads, say),
call `torch.cuda.set_device` first; the operator `gluon_survey.ops.matmul` does.

**Bias.** `matmul(a, b, bias=...)` adds a [N] bias, in the output's dtype, to the fp32
accumulator in the kernel's epilogue (after the fp8 scales, before the store): no separate add.
Whether there is a bias, and its shape, strides, dtype and device, join the plan key; its address
does not: it is an argument of each launch, and the kernels take it at any address (they load it
an element a thread, and are compiled without assuming its alignment). cuBLAS (the torch mode, and
where `auto` chooses it) runs `torch.addmm(bias, a, b)`, whose bias cuBLASLt adds in its epilogue
(PyTorch takes that path for a contiguous output and M, N, K > 1; otherwise it copies the bias
into the output first), and for fp8 `torch._scaled_mm(..., bias=)`.

**The torch mode's fp8 call.** `matmul(..., kernel="torch")` with fp8 operands on a GPU calls
`torch._scaled_mm` directly, with no plan key: that call is host-bound up to a few hundred tokens,
where the cached plan's path (key, lookup, closure: 2.6 µs on a 2-core CPU, the key 1.7 of them)
took 11.8 µs of host time over `_scaled_mm`'s own 17-31 µs on an H100 lease, median over 21 shapes
(results/experiments/h100-fp8-cublas-path-8094464). `_scaled_mm` checks its arguments before it
launches; a call it refuses goes through the plan's path, whose checks raise the survey's error.
It is the same call the plan makes (the caller's scales, fast accumulation, the output dtype
bf16 unless given).

**A transposed A.** An `a` in A layout "t" (`launch.a_layout`: the view x.t() of a row-major
[K, M] matrix, as in a weight's gradient grad^T @ x) is read in place where the mode that runs
can (the provider's `reads_transposed_a`), and copied to row-major otherwise. Hopper's wgmma
reads 16-bit operands of either major order from shared memory, so the Hopper rungs (Blocked,
Pipelined, persistent, warpspec and splitk) load [BLOCK_K, BLOCK_M] boxes of the [K, M] matrix
and multiply their transposed view, as they read a K-major B (tests/test_alayout_gpu.py checks
all four layout pairs on an H100); cuBLAS (`torch`) takes the view as a transposed operand.
swapab, slab and gemv (the few-token modes), the other baselines and fp8 operands (fp8 MMAs
read A K-major) get a row-major copy, as does a [K, M] matrix whose row stride or base TMA
cannot describe. `explain` says which. `TRANSPOSED_A_IN_PLACE` (below) switches reading in
place off, for comparison.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from . import memory, registry
from .launch import ALIGN, Launch, Scales, Target, Unaligned, a_layout, b_layout

DTYPES = (torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn  # fp8 operands: e4m3, fp32 accumulation, dequantized in the epilogue
FP8_OUT_DTYPES = (torch.bfloat16, torch.float16)  # what an fp8 product may be written as

# Whether `matmul` reads an A in layout "t" (the transpose view of a row-major [K, M] matrix) in
# place where the mode that runs can (module docstring), instead of copying it to row-major. On by
# default; GLUON_SURVEY_A_IN_PLACE=0 in the environment (read at import) or setting it here turns
# it off. It is part of the plan key, so changing it takes effect at once.
TRANSPOSED_A_IN_PLACE = os.environ.get("GLUON_SURVEY_A_IN_PLACE", "1") != "0"


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


def describe_torch_cuda() -> str:
    """One line on what torch sees, e.g. 'torch 2.13.0+cpu (a CPU-only build), CUDA not available':
    the words every "no CUDA GPU" message of the package and its CLI uses."""
    built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    if torch.cuda.is_available():
        return f"torch {torch.__version__} ({built}), {torch.cuda.device_count()} CUDA device(s)"
    return f"torch {torch.__version__} ({built}), CUDA not available"


@functools.cache
def _target(index: int) -> Target:
    props = torch.cuda.get_device_properties(index)
    return Target(_capability(index), props.multi_processor_count, props.name)


def target_of(device: torch.device) -> Target:
    """The GPU a launch on `device` is prepared for: capability and SM count, read once per device."""
    return _target(device.index if device.index is not None else torch.cuda.current_device())


def untraced_cuda(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a call on x and a weight may run its launch itself rather than through its PyTorch
    operator, whose dispatch costs more host time in eager mode (`gluon-survey overhead`): nothing
    traces the call (no torch.compile, no dispatch mode such as FakeTensorMode or a FLOP counter),
    the weight is a plain tensor or Parameter, and x is a plain CUDA tensor on the current device
    (an operator makes its device current; a launch uses the current one)."""
    return (
        not torch.compiler.is_compiling()
        and type(x) is torch.Tensor
        and type(weight) in (torch.Tensor, torch.nn.Parameter)
        and x.is_cuda
        and not is_in_torch_dispatch_mode()
        and x.get_device() == torch.cuda.current_device()
    )


# --------------------------------------------------------------------------------------------------
# Validation and alignment


def require_tensor(name: str, t: object) -> None:
    """TypeError naming the argument unless `t` is a tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _check_operands(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    mode: str | None = None,
    bias: torch.Tensor | None = None,
) -> str | None:
    """Every check of matmul's arguments, the devices last: a wrong argument is named as such
    also on a machine without a GPU. `mode` (a mode name; None: not checked) must exist, compute
    dense GEMMs and, for fp8 operands or a bias, take them. Returns the fp8 scaling ("tensor" or
    "row"), None for fp16/bf16."""
    for name, t in (("a", a), ("b", b)):
        require_tensor(name, t)
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype in (torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz):
            raise TypeError(
                f"{name} is {t.dtype}; the survey's fp8 kernels take float8_e4m3fn (e4m3) for both "
                f"operands (quantize with {name}.to(torch.float8_e4m3fn) and a scale)"
            )
        if t.dtype not in DTYPES and t.dtype != FP8:
            raise TypeError(
                f"{name} is {t.dtype}; the survey's kernels take float16, bfloat16 or float8_e4m3fn "
                f"(convert with {name}.half() or {name}.bfloat16())"
            )
    if a.dtype != b.dtype:
        raise TypeError(f"a is {a.dtype} but b is {b.dtype}; give both the same dtype")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"shapes {tuple(a.shape)} @ {tuple(b.shape)} do not match: a.shape[1] must equal b.shape[0]"
        )
    M, N = a.shape[0], b.shape[1]
    scaling = _check_fp8(a, b, scale_a, scale_b, out_dtype) if a.dtype == FP8 else None
    if scaling is None:
        if scale_a is not None or scale_b is not None:
            raise TypeError(f"scale_a / scale_b apply to float8_e4m3fn operands only; a is {a.dtype}")
        if out_dtype is not None and out_dtype != a.dtype:
            raise TypeError(f"out_dtype {out_dtype} differs from the inputs' {a.dtype}; it is for fp8 inputs")
    if out is not None:
        require_tensor("out", out)
        expected = result_dtype(a, out_dtype)
        if tuple(out.shape) != (M, N):
            raise ValueError(f"out has shape {tuple(out.shape)}, expected ({M}, {N})")
        if out.dtype != expected:
            raise TypeError(f"out is {out.dtype}, expected {expected}")
    if bias is not None:
        _check_bias(bias, N, result_dtype(a, out_dtype))
    if mode is not None:
        m = registry.get(mode)  # KeyError naming the valid modes
        if reason := registry.wrong_shape_reason(m, grouped=False):
            raise TypeError(f"{reason}; a grouped GEMM is gluon_survey.grouped_matmul(x, w, offs)")
        if scaling is not None and (reason := registry.no_fp8_reason(m)):
            raise TypeError(reason)
        if bias is not None and (reason := registry.no_bias_reason(m)):
            raise TypeError(reason)
    _check_devices(a, b, out, scale_a if scaling else None, scale_b if scaling else None, bias)
    return scaling


def _check_bias(bias: torch.Tensor, N: int, dtype: torch.dtype) -> None:
    """A bias is a contiguous [N] tensor of the output's dtype (its device: `_check_devices`)."""
    require_tensor("bias", bias)
    if tuple(bias.shape) != (N,):
        raise ValueError(
            f"bias has shape {tuple(bias.shape)}; it is one value per output column, shape ({N},)"
            + (" (flatten it with bias.view(-1))" if bias.numel() == N else "")
        )
    if bias.dtype != dtype:
        raise TypeError(
            f"bias is {bias.dtype}; it must have the output's dtype, {dtype} (use bias.to({dtype}))"
        )
    if N > 1 and bias.stride(0) != 1:
        raise ValueError(f"bias is not contiguous (stride {bias.stride(0)}); pass bias.contiguous()")


def require_cuda(name: str, t: torch.Tensor) -> None:
    """A ValueError unless `t` is on a CUDA device: where torch sees no GPU, one that says so and
    names the torch build (moving the tensor would fail too); else how to move it."""
    if t.device.type == "cuda":
        return
    if not torch.cuda.is_available():
        raise ValueError(
            f"{name} is on {t.device}, but the survey's kernels run on a CUDA GPU and there is none "
            f"here: {describe_torch_cuda()}"
        )
    raise ValueError(f"{name} is on {t.device}; move it to the GPU with {name}.cuda()")


def _check_devices(a, b, out, scale_a, scale_b, bias=None) -> None:
    """The operands on one CUDA device, and `out`, the fp8 scales and the bias with them: the last
    checks."""
    require_cuda("a", a)
    require_cuda("b", b)
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}; put both on one GPU")
    if out is not None and out.device != a.device:
        raise ValueError(f"out is on {out.device}, expected {a.device}")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b), ("bias", bias)):
        if t is not None and t.device != a.device:
            raise ValueError(f"{name} is on {t.device}, expected {a.device} (the operands' GPU)")


def result_dtype(a: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.dtype:
    """The dtype of a @ b: the inputs' for fp16/bf16; `out_dtype` (default bf16) for fp8."""
    if a.dtype == FP8:
        return out_dtype or torch.bfloat16
    return a.dtype


_SCALES_HELP = (
    "fp8 operands need dequantization scales, fp32 CUDA tensors: per-tensor (scale_a and scale_b "
    "of one element each) or row-wise (scale_a [M, 1], one per row of a; scale_b [1, N], one per "
    "column of b)"
)


def _check_fp8(a, b, scale_a, scale_b, out_dtype) -> str:
    """The fp8-only rules: scales (returns their kind), output dtype, K-major B."""
    if scale_a is None or scale_b is None:
        raise TypeError(f"{_SCALES_HELP}; got scale_a={_describe(scale_a)}, scale_b={_describe(scale_b)}")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        require_tensor(name, t)
        if t.dtype != torch.float32:
            raise TypeError(f"{name} is {t.dtype}; scales are float32 (use {name}.float())")
    M, N = a.shape[0], b.shape[1]
    if scale_a.numel() == 1 and scale_b.numel() == 1 and scale_a.dim() <= 2 and scale_b.dim() <= 2:
        scaling = "tensor"
    elif tuple(scale_a.shape) == (M, 1) and tuple(scale_b.shape) == (1, N):
        scaling = "row"
    else:
        raise ValueError(
            f"{_SCALES_HELP}; got scale_a {tuple(scale_a.shape)} and scale_b {tuple(scale_b.shape)} "
            f"for M={M}, N={N}"
        )
    if out_dtype is not None and out_dtype not in FP8_OUT_DTYPES:
        raise TypeError(f"out_dtype {out_dtype}: an fp8 product is written as torch.bfloat16 or float16")
    if b_layout(b) != "t":
        raise ValueError(
            "fp8 MMAs read both operands K-major: pass b as the transpose view of a row-major "
            "[N, K] weight (b = w.t(); from a [K, N] matrix: b.t().contiguous().t())"
        )
    return scaling


def _describe(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"a tensor of shape {tuple(t.shape)}"
    return type(t).__name__


def _flat_scales(scale_a: torch.Tensor, scale_b: torch.Tensor, kind: str) -> Scales:
    """The scales as the providers take them (`launch.Scales`): flat, contiguous fp32."""
    return Scales(scale_a.contiguous().view(-1), scale_b.contiguous().view(-1), kind)


def _provider_prepare(
    provider, a, b, out, target: Target, scales: Scales | None, bias: torch.Tensor | None = None
) -> Launch:
    """`provider.prepare`, with `scales=` only for fp8 and `bias=` only with a bias (providers
    without fp8 or bias take no such keyword)."""
    kwargs = {}
    if scales is not None:
        kwargs["scales"] = scales
    if bias is not None:
        kwargs["bias"] = bias
    return provider.prepare(a, b, out, target, **kwargs)


def _tma_ok(t: torch.Tensor) -> bool:
    """A row-major 2-D view TMA can describe: unit inner stride, 16-byte row stride and base."""
    es = t.element_size()
    return t.stride(1) == 1 and (t.stride(0) * es) % ALIGN == 0 and t.data_ptr() % ALIGN == 0


def _aligned_empty(rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
    """A [rows, cols] view of a buffer whose row stride is padded to a multiple of 16 bytes."""
    per = ALIGN // like.element_size()
    padded = -(-cols // per) * per
    return torch.empty((rows, padded), dtype=like.dtype, device=like.device).narrow(1, 0, cols)


def _aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """t copied into a buffer TMA can describe (`_aligned_empty`)."""
    buf = _aligned_empty(*t.shape, like=t)
    buf.copy_(t)
    return buf


def _aligned(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """t itself if TMA can describe it, else an aligned copy (and True)."""
    return (t, False) if _tma_ok(t) else (_aligned_copy(t), True)


def _aligned_b(b: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """B as row-major [K, N] or as the transpose view of a [N, K] weight, whichever it is."""
    if b_layout(b) == "t":  # w.t(): describe the [N, K] weight instead
        w, copied = _aligned(b.t())
        return w.t(), copied
    return _aligned(b)


def _aligned_copy_b(b: torch.Tensor) -> torch.Tensor:
    """`_aligned_b`'s copy, for a B that TMA cannot describe as it is."""
    return _aligned_copy(b.t()).t() if b_layout(b) == "t" else _aligned_copy(b)


def _b_tma_ok(b: torch.Tensor) -> bool:
    return _tma_ok(b.t() if b_layout(b) == "t" else b)


def _transposed_a(provider, a, b, target: Target, fp8: bool) -> tuple[bool, str]:
    """For an `a` in A layout "t": whether the provider reads it in place (else it is copied to
    row-major), and why, in `explain`'s words (module docstring)."""
    if not TRANSPOSED_A_IN_PLACE:
        return (
            False,
            "copied to row-major (reading it in place is off: gluon_survey.api.TRANSPOSED_A_IN_PLACE)",
        )
    if fp8:
        return False, "copied to row-major (fp8 MMAs read A K-major)"
    reads = getattr(provider, "reads_transposed_a", None)
    if reads is None or not reads(a, b, target, False):
        return False, (
            "copied to row-major (the mode that runs reads A row-major only here; Blocked, Pipelined, "
            "persistent, warpspec, splitk on Hopper and cuBLAS read a transposed 16-bit A in place)"
        )
    if not _tma_ok(a.t()):
        return False, (
            "copied to row-major (TMA cannot describe the [K, M] matrix behind it: its row stride or "
            "base address is not a multiple of 16 bytes)"
        )
    return True, "read in place, no copy (of the [K, M] matrix behind the view)"


def _reads_a_in_place(provider, a, b, target: Target, fp8: bool) -> bool:
    """`_transposed_a`'s verdict, False at once for an A that is not in layout "t"."""
    return a_layout(a) == "t" and _transposed_a(provider, a, b, target, fp8)[0]


def _runnable(mode: str, device: torch.device, fp8: bool = False) -> tuple[registry.Mode, Target]:
    """The mode called `mode` and the GPU of `device`; RuntimeError when it cannot run there,
    TypeError when it has no fp8 kernel and the operands are fp8."""
    m = registry.get(mode)
    if fp8 and (reason := registry.no_fp8_reason(m)):
        raise TypeError(reason)
    target = target_of(device)
    reason = m.unsupported_reason(target.capability)
    if reason:
        raise RuntimeError(f"mode {m.name!r} cannot run on this GPU: {reason}")
    return m, target


def prepare(
    mode: str,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
) -> Launch:
    """A ready launch of `mode` computing out = a @ b (validated, aligned, compiled lazily); for
    fp8 operands out = (a @ b) * scale_a * scale_b; with a bias, + bias.

    This is what the driver times: when an operand needs an aligned copy, that copy is made here,
    once, and is not part of `Launch.fn`; an output that needs one is copied back inside `fn`.
    """
    scaling = _check_operands(a, b, out, scale_a, scale_b, out_dtype, mode, bias)
    m, target = _runnable(mode, a.device, scaling is not None)
    M, N = a.shape[0], b.shape[1]
    if out is None:
        out = torch.empty((M, N), dtype=result_dtype(a, out_dtype), device=a.device)
    if M == 0 or N == 0 or a.shape[1] == 0:
        if bias is not None:
            return Launch(lambda: out.copy_(bias.expand(M, N)), {"impl": "empty or K=0: the bias"})
        return Launch(lambda: out.zero_(), {"impl": "empty or K=0: zeros"})

    provider = m.provider(target.capability)
    in_place_a = _reads_a_in_place(provider, a, b, target, scaling is not None)
    a2, copied_a = (a, False) if in_place_a else _aligned(a)
    b2, copied_b = _aligned_b(b)
    c2 = out if _tma_ok(out) else _aligned_empty(M, N, out)
    scales = None if scaling is None else _flat_scales(scale_a, scale_b, scaling)
    launch = _provider_prepare(provider, a2, b2, c2, target, scales, bias)
    config = launch.config  # the provider's own dict: autotuned modes fill it in on the first call
    if scaling is not None:
        config["scales"] = scaling
    if in_place_a:
        config["a_layout"] = "t"  # read in place (a row-major A, or a copied one, says nothing)
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
    """The mode `matmul(kernel=None)` runs: `auto`, which picks per shape from the table measured
    on this GPU (gluon_survey/choice.py), or by the documented rule, cuBLAS on GPUs without Gluon
    rungs."""
    return "auto"


# --------------------------------------------------------------------------------------------------
# Plans: what `matmul` works out once per key (module docstring)


@dataclass(frozen=True, slots=True)
class MatmulPlan:
    """What `matmul` worked out for one plan key; `plan(a, b, out)` does the per-call rest for
    tensors of that key: allocate `out` if None, copy the operands TMA cannot describe, launch,
    copy the result back where the output could not be written in place.

    `run(a, b, out, scales)` launches on TMA-describable tensors (`scales` None for fp16/bf16): a
    rung's `Plan.launch`, or for providers without a plan their `prepare(...).fn()`; it writes
    `out` or returns the product (torch.compile). None when M, N or K is 0: the result is zeros
    and nothing is launched. `scaling` is the fp8 scales' kind ("tensor" or "row"), None for fp16/bf16."""

    mode: str
    shape: tuple[int, int]  # (M, N): the output
    dtype: torch.dtype  # the output's
    device: torch.device
    run: Callable[..., object] | None
    copy_a: bool = False  # a needs an aligned copy
    copy_b: bool = False
    copy_out: bool = False  # out is computed into an aligned buffer and copied back
    scaling: str | None = None
    in_place: bool = False  # `run` writes `out` (and returns nothing, or `out` itself)
    # `run(a, b, out, scale_a, scale_b)` takes the caller's scales as they are (cuBLAS fp8 with
    # scales already in `torch._scaled_mm`'s shapes), not flattened into a `launch.Scales`
    raw_scales: bool = False
    # A 1x1 tensor of the output's dtype on its device, expanded to (M, N): `torch.empty_like` of it
    # is a contiguous (M, N) output, allocated without parsing a shape, dtype and device per call
    # (about half of `torch.empty`'s Python cost, measured on the CPU). One 1x1 tensor per dtype
    # and device for all plans, allocated outside CUDA graphs' pools (`memory.one_element`).
    like: torch.Tensor | None = None
    # A plan for aligned bases whose `run` does not check them itself: the call checks them first
    # and raises `Unaligned` (module docstring). A rung's `run` checks them where it reads them.
    check_bases: bool = False
    # The key has a bias: `run` takes it last, and adds it in the epilogue (module docstring).
    biased: bool = False
    # A provider's whole per-call path for 16-bit operands, with matmul's call arguments (a, b,
    # out, scale_a, scale_b, bias): cuBLAS's `torch.mm` / `torch.addmm`, which allocate the output
    # themselves and need no aligned bases (baselines/torch_ops.py). Used where nothing is copied.
    direct: Callable[..., torch.Tensor] | None = None

    def __call__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        out: torch.Tensor | None = None,
        scale_a: torch.Tensor | None = None,
        scale_b: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.check_bases and _alignment(a, b, out) != _ALIGNED:
            raise Unaligned(_UNALIGNED)
        if out is None:
            out = torch.empty_like(self.like)
        if self.run is None:  # M, N or K is 0
            return out.zero_() if bias is None else out.copy_(bias.expand(*self.shape))
        a2 = _aligned_copy(a) if self.copy_a else a
        b2 = _aligned_copy_b(b) if self.copy_b else b
        c2 = _aligned_empty(*self.shape, like=out) if self.copy_out else out
        tail = (bias,) if self.biased else ()
        if self.raw_scales:
            result = self.run(a2, b2, c2, scale_a, scale_b, *tail)
        else:
            scales = None if self.scaling is None else _flat_scales(scale_a, scale_b, self.scaling)
            result = self.run(a2, b2, c2, scales, *tail)
        if not isinstance(result, torch.Tensor):  # the product is in c2
            result = c2
        if result is not out:
            out.copy_(result)
        return out

    def caller(self) -> Callable[..., torch.Tensor]:
        """What `matmul` calls for this plan's key, with the same arguments as the plan: for a launch
        that writes `out` in place on the call's own tensors (`in_place`; every provider's but
        torch.compile's), a function that does only that per call; otherwise the plan's
        `__call__`. `caller().plan` is the plan."""
        if self.run is None or not self.in_place or self.copy_a or self.copy_b or self.copy_out:
            call = functools.partial(MatmulPlan.__call__, self)
        elif self.direct is not None:
            call = functools.partial(self.direct)  # a new object: the attribute below is this plan's
        elif self.biased:
            call = _launch_biased(self.run, self.like, self.scaling, self.check_bases, self.raw_scales)
        else:
            call = _launch_in_place(self.run, self.like, self.scaling, self.check_bases, self.raw_scales)
        call.plan = self
        return call


def _launch_in_place(
    run: Callable[..., object], like: torch.Tensor, scaling: str | None, check_bases: bool, raw_scales: bool
):
    """`MatmulPlan.__call__` for a plan whose launch needs no copies and writes `out` itself,
    without reading the plan's fields on every call (this is the whole per-call path). The two
    closures differ only in what `run` takes of the scales; written out, not branched per call."""
    empty_like = torch.empty_like

    if raw_scales:

        def call_raw(a, b, out=None, scale_a=None, scale_b=None, bias=None):
            if check_bases and (a.data_ptr() | b.data_ptr() | (0 if out is None else out.data_ptr())) % ALIGN:
                raise Unaligned(_UNALIGNED)
            if out is None:
                out = empty_like(like)
            run(a, b, out, scale_a, scale_b)
            return out

        return call_raw

    def call(a, b, out=None, scale_a=None, scale_b=None, bias=None):
        if check_bases and (a.data_ptr() | b.data_ptr() | (0 if out is None else out.data_ptr())) % ALIGN:
            raise Unaligned(_UNALIGNED)
        if out is None:
            out = empty_like(like)
        run(a, b, out, None if scaling is None else _flat_scales(scale_a, scale_b, scaling))
        return out

    return call


def _launch_biased(
    run: Callable[..., object], like: torch.Tensor, scaling: str | None, check_bases: bool, raw_scales: bool
):
    """`_launch_in_place` for a key with a bias: the same, with the call's bias passed to `run`
    last (the no-bias closures stay as they were)."""
    empty_like = torch.empty_like

    if raw_scales:

        def call_raw(a, b, out=None, scale_a=None, scale_b=None, bias=None):
            if check_bases and (a.data_ptr() | b.data_ptr() | (0 if out is None else out.data_ptr())) % ALIGN:
                raise Unaligned(_UNALIGNED)
            if out is None:
                out = empty_like(like)
            run(a, b, out, scale_a, scale_b, bias)
            return out

        return call_raw

    def call(a, b, out=None, scale_a=None, scale_b=None, bias=None):
        if check_bases and (a.data_ptr() | b.data_ptr() | (0 if out is None else out.data_ptr())) % ALIGN:
            raise Unaligned(_UNALIGNED)
        if out is None:
            out = empty_like(like)
        run(a, b, out, None if scaling is None else _flat_scales(scale_a, scale_b, scaling), bias)
        return out

    return call


_PLANS: dict[tuple, Callable[..., torch.Tensor]] = {}  # plan key -> `MatmulPlan.caller()`
_MAX_PLANS = 1024  # past this many keys the cache starts again from empty (simple and thread-safe)


def _plan_key(
    kernel: str | None,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
) -> tuple:
    """Everything `_build_plan` reads of its arguments but the base addresses (module docstring);
    a key without `out`'s part is shorter, so it never equals one with it, and fp8's scales and
    output dtype add a part of their own, as a bias does (its shape, strides, dtype and device:
    never its address, which each launch passes, but whether that is 16-byte aligned, as for the
    scales: Triton compiles a kernel for its pointer arguments' alignment, and a bias or scale
    that is a view into a larger tensor may not be). It also holds `target_of`, the function (not its
    answer, which the device decides): tests that fake a GPU replace that function, and so never
    meet a plan made for another GPU."""
    key = (
        kernel,
        target_of,
        TRANSPOSED_A_IN_PLACE,
        a.shape,
        a.stride(),
        a.dtype,
        a.device,
        b.shape,
        b.stride(),
        b.dtype,
        b.device,
    )
    if scale_a is not None or scale_b is not None or out_dtype is not None:
        key = (*key, "fp8", out_dtype, *_scale_key(scale_a), *_scale_key(scale_b))
    if bias is not None:
        key = (*key, "bias", *tensor_key(bias))
    if out is None:
        return key
    return (*key, out.shape, out.stride(), out.dtype, out.device)


def tensor_key(t: torch.Tensor) -> tuple:
    """What a plan cache keys a tensor argument on: its shape, strides, dtype and device and whether
    its base is ALIGN-byte aligned (Triton compiles a kernel for its pointers' alignment), never its
    address, which each launch passes."""
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % ALIGN == 0)


def _scale_key(t: torch.Tensor | None) -> tuple:
    return (None,) if t is None else tensor_key(t)


def _build_plan(
    kernel: str | None,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
) -> MatmulPlan:
    """The plan of a call's key, or the error the call raises. The provider's `prepare` sees
    stand-ins where copies will be made (empty buffers of the copies' layout), so nothing is
    computed here."""
    mode = kernel if kernel is not None else default_mode(a)
    scaling = _check_operands(a, b, out, scale_a, scale_b, out_dtype, mode, bias)
    m, target = _runnable(mode, a.device, scaling is not None)
    M, K, N = a.shape[0], a.shape[1], b.shape[1]
    dtype = result_dtype(a, out_dtype)
    like = memory.one_element(dtype, a.device).expand(M, N)  # no allocation of the plan's own
    biased = bias is not None
    plan = functools.partial(MatmulPlan, m.name, (M, N), dtype, a.device, like=like, biased=biased)
    if M == 0 or N == 0 or K == 0:
        return plan(None, scaling=scaling)
    aligned = _alignment(a, b, out) == _ALIGNED  # else `_call_new` keys the plan with the alignment
    if out is None:  # what the plan will allocate
        out = torch.empty((M, N), dtype=dtype, device=a.device)
    provider = m.provider(target.capability)
    # an A in layout "t" that the provider reads in place (`TRANSPOSED_A_IN_PLACE`) is not copied
    in_place_a = _reads_a_in_place(provider, a, b, target, scaling is not None)
    copy_a, copy_b, copy_out = not in_place_a and not _tma_ok(a), not _b_tma_ok(b), not _tma_ok(out)
    a2 = _aligned_empty(M, K, a) if copy_a else a
    b2 = (_aligned_empty(N, K, b).t() if b_layout(b) == "t" else _aligned_empty(K, N, b)) if copy_b else b
    c2 = _aligned_empty(M, N, out) if copy_out else out
    scales = None if scaling is None else _flat_scales(scale_a, scale_b, scaling)
    reusable = getattr(_provider_prepare(provider, a2, b2, c2, target, scales, bias).fn, "plan", None)
    check_bases = aligned and not getattr(reusable, "checks_bases", False)
    plan = functools.partial(
        plan, copy_a=copy_a, copy_b=copy_b, copy_out=copy_out, scaling=scaling, check_bases=check_bases
    )
    if reusable is not None:
        direct = getattr(reusable, "launch_scaled", None)
        if direct is not None and scaling is not None and scale_a.is_contiguous() and scale_b.is_contiguous():
            return plan(direct, in_place=True, raw_scales=True)  # the key holds the scales' strides
        direct = getattr(reusable, "direct", None) if scaling is None else None
        return plan(reusable.launch, in_place=True, direct=direct)

    def run(a2, b2, c2, scales, bias=None):
        return _provider_prepare(provider, a2, b2, c2, target, scales, bias).fn()

    return plan(run)


def clear_plans() -> None:
    """Forget every cached plan (after replacing a provider's kernel, e.g. in a test)."""
    global PLANS_CLEARED
    _PLANS.clear()
    PLANS_CLEARED += 1


PLANS_CLEARED = 0  # how many times `clear_plans` ran: what remembers a plan's verdict keys on it


def runs_cublas(a, b, kernel: str | None = None, bias: torch.Tensor | None = None) -> bool:
    """Whether `matmul(a, b, kernel=kernel, bias=bias)`'s cached plan calls cuBLAS itself
    (`MatmulPlan.direct`: nothing copied, `torch.mm` / `torch.addmm` on the call's tensors);
    False where no plan is cached for these operands yet. `Linear` asks once per input layout,
    after a call, and then calls `F.linear`, the stock module's own path, for such inputs."""
    call = _PLANS.get(_plan_key(kernel, a, b, None, bias=bias))
    plan = getattr(call, "plan", None)
    return plan is not None and plan.direct is not None and getattr(call, "func", None) is plan.direct


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    kernel: str | None = None,
    out: torch.Tensor | None = None,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
):
    """a @ b with one of the survey's kernels (`kernel` = a mode name; None = fastest for this GPU).

    a: [M, K]; b: [K, N] row-major or the transpose view of a contiguous [N, K] weight (`w.t()`,
    no copy); fp16 or bf16 CUDA tensors; fp32 accumulation, result in the inputs' dtype.

    fp8: a and b float8_e4m3fn, b the transpose view of an [N, K] weight, and fp32 scales, the
    result (a @ b) * scale_a * scale_b in `out_dtype` (bf16, the default, or fp16): per-tensor
    (scale_a, scale_b of one element) or row-wise (scale_a [M, 1], scale_b [1, N]), as
    `torch._scaled_mm` takes them.

    bias: [N], contiguous, in the output's dtype (fp8: `out_dtype`), on the operands' GPU: added
    to the fp32 accumulator in the kernel's epilogue, after the fp8 scales (a @ b + bias; no
    separate add; module docstring). The modes without a fused bias (triton, torch.compile)
    refuse one.

    The first call of a plan key does the checks and choices; repeated calls only launch (module
    docstring). Capturable in a CUDA graph, also where the first call of a key is captured or
    in CUDA-graph trees' warm-up (module docstring: split-K's first call needs one outside).
    """
    if kernel == "torch" and scale_a is not None:
        # fp8 through cuBLAS: `torch._scaled_mm` itself, which checks its arguments before it
        # launches; what it refuses goes on to the plan's path, whose checks say why (module
        # docstring, "The torch mode's fp8 call"). Every step here is host time on a host-bound
        # call: the checks are attribute reads.
        try:
            fp8 = a.dtype is FP8 and b.dtype is FP8 and out_dtype in _SCALED_MM_OUT
            if fp8 and a.is_cuda and scale_a.is_cuda and scale_b.is_cuda:
                return torch._scaled_mm(
                    a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype or _FP8_OUT, out=out,
                    use_fast_accum=True,
                )  # fmt: skip
        except (RuntimeError, TypeError, ValueError, AttributeError):
            pass
    try:
        key = _plan_key(kernel, a, b, out, scale_a, scale_b, out_dtype, bias)
    except Exception:
        # not tensors: say which and why
        _check_operands(a, b, out, scale_a, scale_b, out_dtype, kernel, bias)
        raise
    call = _PLANS.get(key)
    if call is not None:
        try:
            return call(a, b, out, scale_a, scale_b, bias)
        except Unaligned:  # raised before anything was launched: the plan for this alignment
            pass
    return _call_new(key, kernel, a, b, out, scale_a, scale_b, out_dtype, bias)


def _call_new(key: tuple, kernel, a, b, out, scale_a, scale_b, out_dtype, bias=None) -> torch.Tensor:
    """`matmul` where the key has no plan yet or a base is not aligned: the plan for the call's
    alignment, built if new (under `key` for aligned bases, else under `key` and the alignment)."""
    alignment = _alignment(a, b, out)
    if alignment != _ALIGNED:
        key = (*key, alignment)
    call = _PLANS.get(key)
    if call is None:
        call = _build_plan(kernel, a, b, out, scale_a, scale_b, out_dtype, bias).caller()
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = call
    return call(a, b, out, scale_a, scale_b, bias)


_FP8_OUT = FP8_OUT_DTYPES[0]  # an fp8 product's dtype where out_dtype is not given
_SCALED_MM_OUT = (None, *FP8_OUT_DTYPES)  # the output dtypes `matmul` writes fp8 products in
_ALIGNED = (True, True, True)
_UNALIGNED = f"a base address is not {ALIGN}-byte aligned"


def _alignment(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> tuple[bool, bool, bool]:
    """Whether each base address is 16-byte aligned (an `out` to be allocated will be)."""
    return a.data_ptr() % ALIGN == 0, b.data_ptr() % ALIGN == 0, out is None or out.data_ptr() % ALIGN == 0


def explain(
    a: torch.Tensor,
    b: torch.Tensor,
    kernel: str | None = None,
    *,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
) -> str:
    """Which kernel and config `matmul(a, b, kernel=kernel, ...)` would run, and why. Nothing is
    launched (an operand TMA cannot describe is copied, as `matmul` would). The problem line names
    the layout pair (A and B: "row" or "t"; `auto` chooses by both, gluon_survey/choice.py). For
    an A in layout "t" (the transpose view of a [K, M] matrix), a line says whether it is read in
    place or copied to row-major, and why (module docstring)."""
    fp8 = {"scale_a": scale_a, "scale_b": scale_b, "out_dtype": out_dtype}
    mode = registry.get(kernel if kernel is not None else default_mode(a))
    _check_operands(a, b, None, **fp8, mode=mode.name, bias=bias)
    cap = capability_of(a.device)
    reason = mode.unsupported_reason(cap)
    if reason:
        return f"{mode.name}: cannot run here ({reason})"
    layout = {"t": "t (transpose view of a [N,K] weight)", "row": "row"}[b_layout(b)]
    # descriptors and config only: nothing is launched
    config = dict(prepare(mode.name, a, b, **fp8, bias=bias).config)
    fused = config.pop("bias", None)  # how the provider adds the bias
    config.pop("a_layout", None)  # the A line's
    chosen = config.pop("mode", None)  # `auto` says what it chose, and why
    lines = [f"mode: {mode.name} - {mode.summary}"]
    if chosen is not None:
        chosen_mode = registry.get(chosen)
        lines.append(f"runs: {chosen_mode.name} - {chosen_mode.summary}")
        lines.append(f"why: {config.pop('why')}")
    else:
        lines.append("why: asked for" if kernel is not None else "why: the default")
    lines += [
        f"problem: M={a.shape[0]} N={b.shape[1]} K={a.shape[1]} {str(a.dtype).removeprefix('torch.')}"
        f" A={a_layout(a)} B={layout}",
        "config: " + ", ".join(f"{k}={v}" for k, v in config.items()),
    ]
    if bias is not None:
        lines.append(f"bias: {_BIAS_WAYS.get(fused, fused)}")
    if a_layout(a) == "t":
        _, how = _transposed_a(mode.provider(cap), a, b, target_of(a.device), scale_a is not None)
        lines.append(f"A: t (transpose view of a [K,M] matrix), {how}")
    copied = config.get("aligned_copy", "").split(",")
    if a_layout(a) == "t":  # a transposed A's copy is the A line's
        copied = [c for c in copied if c != "a"]
    if any(copied):
        lines.append(
            f"aligned copy ({', '.join(copied)}): a row stride or base address is not a multiple of 16 bytes"
        )
    return "\n".join(lines)


# How a provider's config says it adds a bias (its "bias" entry), as `explain` words it.
_BIAS_WAYS = {
    "fused": "fused: added to the fp32 accumulator in the kernel's epilogue, after any fp8 scales, "
    "before the store",
    "cublasLt epilogue": "fused: torch.addmm / torch._scaled_mm(bias=), cuBLASLt's bias epilogue "
    "(for 16-bit operands PyTorch takes it where out is contiguous and M, N, K > 1; else the bias "
    "is copied into out before the GEMM)",
    None: "the product of an empty or K=0 problem is the bias alone",
}
