"""`grouped_matmul(x, w, offs)`: a mixture-of-experts layer's expert GEMMs in one launch.

    out[offs[e-1] : offs[e]] = x[offs[e-1] : offs[e]] @ w[e]      for every expert e (offs[-1] = 0)

x [S, K] holds the tokens grouped by expert, w the experts' weights as the [E, K, N] transpose
view of a contiguous [E, N, K] tensor (`w_nk.transpose(1, 2)`, the layout transformers passes),
offs the int32 [E] cumulative ends of the experts' token ranges on the GPU, as
`torch._grouped_mm` takes them. The kernel (one persistent launch over the output tiles of the
experts that have rows, found on the device from the offsets) reads the offsets on the device,
so a call does no host synchronisation and can be captured in a CUDA graph, with other offsets
in the same buffer at each replay. Which kernel runs is the `grouped-auto` mode's choice by S
(`grouped_auto.py`, known on the host): up to `grouped_auto.DECODE_ROWS` token-slots the swap-AB
kernel (`kernels/grouped_swapab.py`: 64 weight rows by a few tokens a tile, for decoding), above
them 128-row tiles (`kernels/grouped.py`). Hopper (sm_90); on Blackwell (sm_100) the 128-row
tiles' tcgen05 version (`kernels/grouped_tcgen05.py`, compile-checked, not run) at every S. At
most `kernels.grouped.MAX_EXPERTS` (512) experts.

Status: the 128-row kernel passes tests/test_grouped_gpu.py on an H100; kernel-only with uniform
routing it ran at 0.84-1.19x torch._grouped_mm (geomean 1.02x) on four models' expert shapes at
16, 512 and 4096 tokens (docs/perf-notes.md, entry 56; results/experiments/h100-grouped-sched).
What grouped_matmul ran there: 1.166x torch._grouped_mm geomean in bf16 (the swap-AB kernel up
to 512 token-slots; results/h100-moe-auto, entry 58) and 1.223x torch._scaled_grouped_mm in
fp8-row (the same choice; results/h100-moe-fp8-swapab, entry 63) over `--shapes moe`.

Every argument is checked before the GPU, each with an error that names the fix, except what only
the offsets' values can say: that would need a host sync. The kernel clamps each offset to
[0, S] and treats an expert whose end is below its start (a decreasing pair) as empty; rows at or
past offs[-1] are not written. `check_offsets(offs, rows)` checks the values (it syncs), for
debugging. Where offs is on the CPU, `grouped_matmul` checks offs[-1] against S before it
refuses the CPU tensor, since that costs nothing there.

fp8 e4m3 operands take row-wise scales, as `torch._scaled_grouped_mm` does and in its shapes:

    out[rows of e] = (x[rows of e] @ w[e]) * scale_x[rows of e, None] * scale_w[e]

scale_x fp32 [S] (one per token, i.e. per row of x), scale_w fp32 [E, N] (one per expert and
output channel), both contiguous on x's GPU; the kernel applies them to its fp32 accumulator
before the store, and writes `out_dtype` (bf16 by default, or fp16, as `gluon_survey.matmul`'s
fp8 products; torch._scaled_grouped_mm writes bf16 only). [S, 1] or [E, 1, N] scales are refused
with the reshape that fixes them, as torch._scaled_grouped_mm refuses them; so are per-tensor
scales (one element each), with the expand that makes them row-wise. K must be a multiple of 16
there (TMA's 16-byte rows of 1-byte elements). Scales are for fp8 operands only, and fp8
operands need both.

A call's launch is planned once per problem: the kernel, grid, constexprs and TMA descriptors of
x's [S, K], w's [E, K, N] and the dtypes (`kernels.plan.GroupedPlan`, kept in a cache keyed on
those, with the choice's switches; `clear_plans` empties it). Later calls of the same problem,
every layer of a model and every routing, run the plan's launch: the compiled kernel's C launcher
with each descriptor encoded once per base address. The checks run on a call's first arguments of
each kind (shapes, strides, dtypes, devices, 16-byte alignment of the bases: `_call_key`); a later
call whose arguments match them in all of that passes the same checks, and launches at once.
(Before the cache, each call built its launch anew, about 0.4 ms of host time under a profiler:
results/experiments/h100-moe-model-host.)

`prepare(mode, x, w, offs, out, scale_x=, scale_w=, out_dtype=)` is what the benchmark driver
times: the same checks, then the launch of any grouped mode of the registry (`grouped-auto`, what
grouped_matmul runs; the two kernels alone, `grouped` and `grouped-swapab`; `grouped_mm`,
torch._grouped_mm; `scaled_grouped_mm`, torch._scaled_grouped_mm, fp8 only; `cublas-loop`, cuBLAS
per expert) on those tensors, built but not yet called.
"""

from __future__ import annotations

import math

import torch

from . import api, grouped_auto, registry
from .kernels import grouped as kernel_128  # the 128-row kernel, which has the fused gate
from .kernels.grouped import MAX_EXPERTS
from .kernels.plan import GroupedPlan
from .launch import Launch, Scales

DTYPES = (torch.float16, torch.bfloat16)
MODE = "grouped-auto"  # what grouped_matmul runs: the 128-row or the swap-AB kernel, by S (grouped_auto.py)
FP8 = api.FP8  # fp8 operands: e4m3, with row-wise scales
TMA_K = 8  # K a multiple of 8: TMA needs rows of 16-byte multiples (fp16/bf16)
FP8_TMA_K = 16  # the same for 1-byte fp8 elements

__all__ = ["check_offsets", "clear_plans", "grouped_matmul", "grouped_swiglu", "prepare"]


def grouped_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    offs: torch.Tensor,
    *,
    scale_x: torch.Tensor | None = None,
    scale_w: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """out [S, N] with out[rows of expert e] = x[rows of e] @ w[e] (the module docstring), for fp8
    operands times scale_x[row] * scale_w[e, column].

    x: [S, K] fp16/bf16 or float8_e4m3fn, row-major; w: [E, K, N], the transpose view of a
    contiguous [E, N, K] weight, x's dtype; offs: int32 [E], cumulative ends; scale_x, scale_w:
    fp32 [S] and [E, N], contiguous, for fp8 operands only (and then required); out_dtype: for
    fp8, bf16 (the default) or fp16; out: optional [S, N] row-major, x's dtype (fp8: out_dtype).
    K must be a multiple of 8 (fp8: 16). All on one CUDA device, a Hopper GPU (or
    Blackwell, sm_100: compile-checked only)."""
    key = _call_key(x, w, offs, out, scale_x, scale_w, out_dtype)
    call = _CALLS.get(key) if key is not None else None
    if call is not None:  # this call's arguments passed every check before: launch
        return _launch_call(call, x, w, offs, out, _scales(x, scale_x, scale_w))
    S, N = _check(x, w, offs, out, scale_x, scale_w, out_dtype)
    if out is None:
        out = torch.empty(S, N, dtype=_result_dtype(x, out_dtype), device=x.device)
    if S == 0 or N == 0:
        return out
    if x.shape[1] == 0:  # an empty sum: every expert's rows are zero (and the others too)
        return out.zero_()
    scales = _scales(x, scale_x, scale_w)
    _check_aligned(x, w, out)
    plan = _plan(x, w, offs, out, scales)
    _remember(key, plan, S, N, out.dtype)
    plan.launch(x, w, offs, out, scales)
    return out


def grouped_swiglu(
    x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """A mixture-of-experts layer's gate-and-up projection and its SwiGLU in one launch: out [S, I]
    with, for every expert e and its rows,

        h = x[rows of e] @ w[e]                      # [rows, 2I]: what grouped_matmul(x, w, offs) gives
        out[rows of e] = silu(h[:, :I]) * h[:, I:]   # gate = the first I channels, up = the last I

    transformers' split of `gate_up_proj` ([E, 2I, H]: w is its [E, H, 2I] transpose view) for
    SiLU-gated experts (Mixtral, Qwen3-MoE, DeepSeek-V3). The 128-row grouped kernel with the
    gate in its epilogue (`kernels/grouped.py`, GLU 1): the [S, 2I] product is never written and
    read back. Arguments as grouped_matmul's, 16-bit only (fp16/bf16, no scales), w's N = 2I even;
    out: optional [S, I] row-major, x's dtype. The silu and the product are computed in fp32 on
    the accumulator, then rounded once to x's dtype (the unfused path rounds h first). Hopper
    (sm_90) only, every S (no swap-AB version for decoding yet). Forward only: no gradients (the
    `gluon_survey.experts` path uses it in inference above `grouped_auto.DECODE_ROWS` token-slots,
    `experts.FUSED_SWIGLU`). Passes tests/test_grouped_swiglu_gpu.py on an H100; kernel-only,
    1.01-1.44x the unfused path from 512 tokens up, 0.81-0.95x at 1 and 16 (docs/perf-notes.md,
    entry 63)."""
    key = _call_key(x, w, offs, out, glu=True)
    call = _CALLS.get(key) if key is not None else None
    if call is not None:  # as grouped_matmul's
        return _launch_call(call, x, w, offs, out, None)
    S, I = _check(x, w, offs, out, glu=True)
    if out is None:
        out = torch.empty(S, I, dtype=x.dtype, device=x.device)
    if S == 0 or I == 0:
        return out
    if x.shape[1] == 0:  # h = 0 everywhere, and silu(0) * 0 = 0
        return out.zero_()
    target = api.target_of(x.device)
    if target.capability[0] not in kernel_128.GLU_CONFIGS:
        name = f" ({target.name})" if target.name else ""
        gpu = f"sm_{target.capability[0]}{target.capability[1]}"
        raise RuntimeError(
            f"grouped_swiglu cannot run on this GPU{name}: its fused kernel is Hopper's (sm_90), this "
            f"GPU is {gpu}; run grouped_matmul(x, w, offs) and the gate apart"
        )
    _check_aligned(x, w, out)
    plan = _plan(x, w, offs, out, None, glu=True)
    _remember(key, plan, S, I, out.dtype)
    plan.launch(x, w, offs, out)
    return out


_PLANS: dict[tuple, GroupedPlan] = {}  # problem key -> plan
_MAX_PLANS = 1024  # past this many keys the cache starts again from empty (as gluon_survey.api's)


def _plan(x, w, offs, out, scales: Scales | None, glu: bool = False) -> GroupedPlan:
    """The plan of grouped_matmul's launch (`glu`: grouped_swiglu's) on checked operands of this
    problem, made on the first call of it and kept: keyed on all the plan depends on, the shapes
    (w's strides follow from its shape, x and out are row-major), the dtypes, the GPU, the kind of
    operands and the choice's switches (`grouped_auto.DECODE_ROWS`, `FP8_SWAPAB`), and whether
    the pointer arguments that are not checked for it are 16-byte aligned (offs and the scales:
    Triton compiles a kernel for its pointers' alignment; x, w and out always are)."""
    aligned = tuple(t.data_ptr() % 16 == 0 for t in (offs, *((scales.a, scales.b) if scales else ())))
    key = (
        glu,
        x.dtype,
        out.dtype,
        *x.shape,
        *w.shape,
        x.device.index,
        grouped_auto.DECODE_ROWS,
        grouped_auto.FP8_SWAPAB,
        aligned,
    )
    plan = _PLANS.get(key)
    if plan is None:
        target = api.target_of(x.device)
        if glu:
            plan = kernel_128.plan(x, w, target, glu=True)
        else:
            plan = _provider(registry.get(MODE), target, "grouped_matmul").plan(x, w, target, scales)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


# A call whose arguments passed every check goes here under `_call_key`, with its plan and its
# output's shape and dtype: a later call with the same key passes the same checks (they read
# nothing the key leaves out), so it launches at once, without them. The dense `matmul`'s plan
# cache does the same (gluon_survey.api).
_CALLS: dict[tuple, tuple[GroupedPlan, int, int, torch.dtype]] = {}


def _call_key(x, w, offs, out, scale_x=None, scale_w=None, out_dtype=None, glu: bool = False) -> tuple | None:
    """Everything grouped_matmul's (`glu`: grouped_swiglu's) checks and plan read of its arguments
    but the base addresses: each tensor's shape, strides, dtype and device and whether its base is
    16-byte aligned, the output dtype, the GPU's description (`api.target_of`, the function: tests
    replace it) and the choice's switches. None where an argument is not a tensor (the checks say
    so)."""
    parts: list = [glu, out_dtype, api.target_of, grouped_auto.DECODE_ROWS, grouped_auto.FP8_SWAPAB]
    for i, t in enumerate((x, w, offs, out, scale_x, scale_w)):
        if t is None and i > 2:
            parts.append(None)
        elif isinstance(t, torch.Tensor):
            parts.append(api.tensor_key(t))
        else:
            return None
    return tuple(parts)


def _remember(key: tuple | None, plan: GroupedPlan, rows: int, cols: int, dtype: torch.dtype) -> None:
    if key is None:
        return
    if len(_CALLS) >= _MAX_PLANS:
        _CALLS.clear()
    _CALLS[key] = (plan, rows, cols, dtype)


def _launch_call(call, x, w, offs, out, scales: Scales | None) -> torch.Tensor:
    """A remembered call's launch on these tensors (`_CALLS`): out allocated where None."""
    plan, rows, cols, dtype = call
    if out is None:
        out = torch.empty(rows, cols, dtype=dtype, device=x.device)
    plan.launch(x, w, offs, out, scales)
    return out


def clear_plans() -> None:
    """Forget every plan and every remembered call (the next call of each problem is checked and
    planned again)."""
    _PLANS.clear()
    _CALLS.clear()


def prepare(
    mode: str,
    x: torch.Tensor,
    w: torch.Tensor,
    offs: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    scale_x: torch.Tensor | None = None,
    scale_w: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> Launch:
    """A ready launch of the grouped mode `mode` (a name of the registry: `grouped-auto`, `grouped`,
    `grouped-swapab`, `grouped_mm`, `scaled_grouped_mm`, `cublas-loop`) on these tensors, checked as
    `grouped_matmul` checks them: what the driver times. `Launch.fn()` writes `out` (allocated here
    when None) or, for `grouped_mm` and `scaled_grouped_mm`, returns the product. A dense mode is a
    TypeError naming the grouped ones; so are fp8 operands for a mode without fp8 and fp16/bf16
    ones for an fp8-only mode."""
    S, N = _check(x, w, offs, out, scale_x, scale_w, out_dtype)
    m = registry.get(mode)  # KeyError naming the valid modes
    if reason := registry.wrong_shape_reason(m, grouped=True):
        raise TypeError(reason)
    fp8 = x.dtype == FP8
    if reason := (registry.no_fp8_reason(m) if fp8 else registry.no_16bit_reason(m)):
        raise TypeError(reason)
    if out is None:
        out = torch.empty(S, N, dtype=_result_dtype(x, out_dtype), device=x.device)
    if S == 0 or N == 0 or x.shape[1] == 0:
        return Launch(lambda: out.zero_(), {"impl": "empty or K=0: zeros"})
    return _launch(m, x, w, offs, out, f"mode {m.name!r}", _scales(x, scale_x, scale_w))


def _launch(mode: registry.Mode, x, w, offs, out, who: str, scales: Scales | None = None) -> Launch:
    """The launch of a grouped mode on checked, non-empty arguments, once the GPU can run it and
    every base is 16-byte aligned (TMA's, and torch._grouped_mm's, requirement). fp8 `scales` go to
    the provider as its `scales` keyword (registry docstring); 16-bit launches pass none."""
    target = api.target_of(x.device)
    provider = _provider(mode, target, who)
    _check_aligned(x, w, out)
    extra = {} if scales is None else {"scales": scales}
    return provider.prepare(x, w, offs, out, target, **extra)


def _provider(mode: registry.Mode, target, who: str):
    """The mode's provider for this GPU; RuntimeError naming `who` and why where it cannot run."""
    if reason := mode.unsupported_reason(target.capability):
        name = f" ({target.name})" if target.name else ""
        raise RuntimeError(f"{who} cannot run on this GPU{name}: {reason}")
    return mode.provider(target.capability)


def _check_aligned(x, w, out) -> None:
    """Every base 16-byte aligned: TMA's (and torch._grouped_mm's) requirement."""
    for arg, t in (("x", x), ("w", w), ("out", out)):
        if t.data_ptr() % 16:
            raise ValueError(
                f"{arg}'s base address is not 16-byte aligned, which TMA needs: pass {arg}.clone()"
            )


def check_offsets(offs: torch.Tensor, rows: int | None = None) -> None:
    """Check the offsets' values, which `grouped_matmul` cannot without a host sync: none below 0,
    none decreasing, and (given `rows`, x's S) the last at most `rows`. Reads offs to the host
    (a sync), so it is for debugging, not for a CUDA-graph capture. ValueError naming the first
    offending entry."""
    api.require_tensor("offs", offs)
    if offs.dim() != 1:
        raise ValueError(f"offs must be 1-D, got shape {tuple(offs.shape)}")
    values = offs.tolist()
    for e, value in enumerate(values):
        if value < 0:
            raise ValueError(f"offs[{e}] is {value}; offsets are token counts, never negative")
        if e and value < values[e - 1]:
            raise ValueError(
                f"offs[{e}] is {value} but offs[{e - 1}] is {values[e - 1]}: offsets are cumulative ends "
                f"and never decrease (the kernel would run expert {e} as empty)"
            )
    if rows is not None and values and values[-1] > rows:
        raise ValueError(f"offs[-1] is {values[-1]} but x has {rows} rows")


def _check(x, w, offs, out, scale_x=None, scale_w=None, out_dtype=None, glu=False) -> tuple[int, int]:
    """Every check of grouped_matmul's arguments, the devices last; returns (S, N), the output's
    shape. `glu`: grouped_swiglu's instead (16-bit, N = 2I even, out [S, I]): returns (S, I)."""
    for name, t in (("x", x), ("w", w), ("offs", offs)):
        api.require_tensor(name, t)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [S, K] (tokens grouped by expert), got shape {tuple(x.shape)}")
    if x.dtype in (torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz):
        raise TypeError(
            f"x is {x.dtype}; grouped_matmul's fp8 kernel takes float8_e4m3fn (e4m3) for x and w "
            "(quantize with .to(torch.float8_e4m3fn) and row-wise scales)"
        )
    if x.dtype not in DTYPES and x.dtype != FP8:
        raise TypeError(
            f"x is {x.dtype}; grouped_matmul takes float16, bfloat16 or float8_e4m3fn (convert with "
            "x.bfloat16())"
        )
    if glu and x.dtype not in DTYPES:
        raise TypeError(
            f"x is {x.dtype}; grouped_swiglu's fused kernel takes float16 or bfloat16: for fp8 run "
            "grouped_matmul (with its scales) and the gate apart"
        )
    if w.dim() != 3:
        raise ValueError(f"w must be 3-D [E, K, N] (one weight per expert), got shape {tuple(w.shape)}")
    if w.dtype != x.dtype:
        raise TypeError(f"x is {x.dtype} but w is {w.dtype}; give both the same dtype")
    S, K = x.shape
    E, wk, N = w.shape
    if wk != K:
        raise ValueError(
            f"x has K={K} columns but w is [E, K, N] = {tuple(w.shape)}: w.shape[1] must equal K"
        )
    if E == 0:
        raise ValueError("w has no experts (its shape is [0, K, N]); give at least one")
    if E > MAX_EXPERTS:
        raise ValueError(
            f"w has {E} experts; grouped_matmul takes at most {MAX_EXPERTS} (each warp of the kernel "
            "holds every expert's offsets in registers): call it once per group of at most "
            f"{MAX_EXPERTS} experts, with that group's rows and offsets"
        )
    row_k = FP8_TMA_K if x.dtype == FP8 else TMA_K
    if K % row_k:
        raise ValueError(
            f"K={K} is not a multiple of {row_k}: TMA reads rows of 16-byte multiples; pad x and w "
            f"along K with zeros to a multiple of {row_k}"
        )
    if not w.transpose(1, 2).is_contiguous():
        if w.is_contiguous():
            raise ValueError(
                "w is a contiguous [E, K, N]; the kernel reads the [E, N, K] weight behind a transpose "
                "view: store it once as w_nk = w.transpose(1, 2).contiguous() and pass w_nk.transpose(1, 2)"
            )
        raise ValueError(
            f"w (strides {w.stride()}) must be the [E, K, N] transpose view of a contiguous [E, N, K] "
            "weight: pass w_nk.transpose(1, 2) for a contiguous w_nk"
        )
    if not x.is_contiguous():
        raise ValueError(f"x (strides {x.stride()}) must be row-major: pass x.contiguous()")
    if offs.dtype != torch.int32:
        raise TypeError(f"offs is {offs.dtype}; the kernel reads int32 offsets: pass offs.to(torch.int32)")
    if offs.dim() != 1:
        raise ValueError(f"offs must be 1-D [E] (cumulative ends), got shape {tuple(offs.shape)}")
    if offs.shape[0] != E:
        raise ValueError(f"offs has {offs.shape[0]} entries but w has {E} experts: give one end per expert")
    if offs.device.type == "cpu" and offs.numel() and (last := int(offs[-1])) > S:
        raise ValueError(f"offs[-1] is {last} but x has {S} rows")
    if glu:
        if N % 2:
            raise ValueError(
                f"w has N={N} output channels, an odd number; grouped_swiglu's w is the gate_up weight, "
                "[E, K, 2I]: I gate channels, then I up channels"
            )
        N //= 2
    if x.dtype == FP8:
        _check_scales(scale_x, scale_w, S, E, N)
        if out_dtype is not None and out_dtype not in api.FP8_OUT_DTYPES:
            raise TypeError(f"out_dtype {out_dtype}: an fp8 product is written as torch.bfloat16 or float16")
    else:
        if scale_x is not None or scale_w is not None:
            raise TypeError(f"scale_x / scale_w apply to float8_e4m3fn operands only; x is {x.dtype}")
        if out_dtype is not None and out_dtype != x.dtype:
            raise TypeError(f"out_dtype {out_dtype} differs from the inputs' {x.dtype}; it is for fp8 inputs")
    if out is not None:
        api.require_tensor("out", out)
        expected = _result_dtype(x, out_dtype)
        if tuple(out.shape) != (S, N):
            raise ValueError(f"out has shape {tuple(out.shape)}, expected ({S}, {N})")
        if out.dtype != expected:
            raise TypeError(f"out is {out.dtype}, expected {expected}")
        if not out.is_contiguous():
            raise ValueError(f"out (strides {out.stride()}) must be row-major: pass a contiguous out")
    _check_devices(x, w, offs, out, scale_x, scale_w)
    return S, N


_SCALES_HELP = (
    "fp8 operands need row-wise dequantization scales, fp32 and contiguous, in "
    "torch._scaled_grouped_mm's shapes: scale_x [S] (one per token, i.e. per row of x) and "
    "scale_w [E, N] (one per expert and output channel)"
)


def _check_scales(scale_x, scale_w, S: int, E: int, N: int) -> None:
    """The fp8 scales: both given, fp32, shapes [S] and [E, N], contiguous; each error names the fix."""
    if scale_x is None or scale_w is None:
        raise TypeError(f"{_SCALES_HELP}; got scale_x={_describe(scale_x)}, scale_w={_describe(scale_w)}")
    for name, t in (("scale_x", scale_x), ("scale_w", scale_w)):
        api.require_tensor(name, t)
        if t.dtype != torch.float32:
            raise TypeError(f"{name} is {t.dtype}; scales are float32 (use {name}.float())")
    wanted = (("scale_x", scale_x, (S,)), ("scale_w", scale_w, (E, N)))
    if scale_x.numel() == 1 and scale_w.numel() == 1 and (S, E * N) != (1, 1):
        raise ValueError(
            f"{_SCALES_HELP}; got one scale each (per-tensor), which grouped_matmul does not take: "
            f"pass scale_x.reshape(1).expand({S}).contiguous() and "
            f"scale_w.reshape(1, 1).expand({E}, {N}).contiguous()"
        )
    for name, t, shape in wanted:
        if tuple(t.shape) == shape:
            continue
        text = ", ".join(map(str, shape))
        if t.numel() == math.prod(shape):
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}; grouped_matmul takes it as ({text}), "
                f"torch._scaled_grouped_mm's shape: pass {name}.reshape({text})"
            )
        raise ValueError(f"{_SCALES_HELP}; got {name} {tuple(t.shape)} for S={S}, E={E}, N={N}")
    for name, t, _ in wanted:
        if not t.is_contiguous():
            raise ValueError(
                f"{name} (strides {t.stride()}) must be contiguous, as the kernel reads it: "
                f"pass {name}.contiguous()"
            )


def _describe(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"a tensor of shape {tuple(t.shape)}"
    return type(t).__name__


def _result_dtype(x: torch.Tensor, out_dtype: torch.dtype | None) -> torch.dtype:
    """The output's dtype: x's for fp16/bf16; `out_dtype` (default bf16) for fp8 (`api.result_dtype`)."""
    return api.result_dtype(x, out_dtype)


def _scales(x: torch.Tensor, scale_x, scale_w) -> Scales | None:
    """The checked fp8 scales as the providers take them (registry docstring), None for fp16/bf16."""
    return Scales(scale_x, scale_w, "row") if x.dtype == FP8 else None


def _check_devices(x, w, offs, out, scale_x=None, scale_w=None) -> None:
    """All on one CUDA device: the last check."""
    named = (("x", x), ("w", w), ("offs", offs)) + tuple(
        (name, t) for name, t in (("out", out), ("scale_x", scale_x), ("scale_w", scale_w)) if t is not None
    )
    for name, t in named:
        api.require_cuda(name, t)
    for name, t in named[1:]:
        if t.device != x.device:
            raise ValueError(f"x is on {x.device} but {name} is on {t.device}; put them on one GPU")
