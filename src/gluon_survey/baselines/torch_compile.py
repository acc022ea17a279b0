"""The `torch.compile` mode: `torch.matmul` compiled by Inductor with
`mode="max-autotune-no-cudagraphs", dynamic=False`; for fp8 operands `torch._scaled_mm` compiled
the same way.

`max-autotune` lets Inductor benchmark its Triton GEMM templates against cuBLAS and keep the fastest;
`-no-cudagraphs` keeps CUDA graphs out, so this mode is launched and timed like every other one.
`dynamic=False` specializes the graph on the exact shape, dtype and strides, as a user benchmarking
one shape would.

**Result contract (differs from the other modes): `Launch.fn()` returns the product as a new tensor
and does not write `out`.** The driver must check the returned tensor when `fn()` returns one.
The alternatives were measured (torch 2.13, Inductor's generated code) and rejected as dishonest:

* compiling `torch.matmul(a, b, out=out)`: Inductor functionalizes the `out=` write, so the compiled
  code computes the product into a fresh buffer and then runs a separate copy kernel into `out`,
  adding a full read and write of C to every timed call;
* `out.copy_(compiled(a, b))` in the launch: the same extra copy, outside the compiled code.

Returning a fresh tensor is what a torch.compile user gets: its only extra cost is a caching-
allocator allocation on the host, no GPU work. Consequently a padded `out` row stride is not
reproduced (the result is contiguous).

**One compiled function per (shape, dtype, strides, device).** Dynamo caches compiled graphs on the
Python code object and, after `torch._dynamo.config.recompile_limit` (8) recompiles of one code
object, silently runs it eagerly, i.e. plain cuBLAS, for every further shape, and with many cached
graphs each call walks their guards. So each key gets its own code object (a copy of `_matmul`'s under a
unique name) and its own `torch.compile` wrapper, holding exactly one graph. The first call of
`Launch.fn` compiles and autotunes (the driver records that as compile time); later `prepare` calls
for the same key reuse the compiled function.

**fp8**: with `scales`, the compiled function is `torch._scaled_mm(a, b, scale_a, scale_b,
out_dtype=out.dtype, use_fast_accum=True)` on the scales in its shapes, the call the `torch` mode
makes (baselines/torch_ops.py), so that Inductor's max-autotune weighs its Triton scaled-mm
templates against that same cuBLAS call. The key adds the scales' shapes (per tensor or row-wise)
and the output's dtype; K and N must be multiples of 16, as for `_scaled_mm` itself.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch

from gluon_survey.baselines.torch_ops import check_fp8_shape
from gluon_survey.launch import Launch, Scales, Target

COMPILE_MODE = "max-autotune-no-cudagraphs"

_CacheKey = tuple[object, ...]
_COMPILED: dict[_CacheKey, Callable[..., torch.Tensor]] = {}


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


def _scaled_mm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype, use_fast_accum=True)


def cache_key(a: torch.Tensor, b: torch.Tensor, *more: object) -> _CacheKey:
    """What a dynamic=False graph is specialized on: shapes, strides, dtype and device (and for fp8
    `more`: the scales' shapes and the output's dtype)."""
    return (tuple(a.shape), a.stride(), tuple(b.shape), b.stride(), a.dtype, str(a.device), *more)


def _fresh(fn: Callable[..., torch.Tensor], tag: int) -> Callable[..., torch.Tensor]:
    """`fn` with a code object of its own, so Dynamo gives it its own cache (module docstring)."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name)


def _compiled(fn: Callable[..., torch.Tensor], key: _CacheKey) -> Callable[..., torch.Tensor]:
    """The compiled copy of `fn` for this key, created (lazily compiled on first call) if new."""
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = torch.compile(_fresh(fn, len(_COMPILED)), mode=COMPILE_MODE, dynamic=False)
        _COMPILED[key] = compiled
    return compiled


def compiled_matmul(a: torch.Tensor, b: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The compiled `a @ b` for this key."""
    return _compiled(_matmul, cache_key(a, b))


def compiled_scaled_mm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype
) -> Callable[..., torch.Tensor]:
    """The compiled `torch._scaled_mm` for this key (the scales' shapes and `out_dtype` in it)."""
    key = cache_key(a, b, tuple(scale_a.shape), tuple(scale_b.shape), out_dtype)
    return _compiled(_scaled_mm, key)


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """Inductor falls back to cuBLAS where its Triton templates do not apply, so any CUDA GPU works."""
    return None


def prepare(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    target: Target | None = None,
    scales: Scales | None = None,
) -> Launch:
    """A launch whose `fn()` returns `a @ b` (fp8: `(a @ b) * scales` in `out`'s dtype) as a new
    tensor and leaves `out` untouched (see above)."""
    if scales is None:
        fn = compiled_matmul(a, b)
        return Launch(lambda: fn(a, b), {"impl": f"torch.compile({COMPILE_MODE})", "result": "returned"})
    check_fp8_shape(b, "torch.compile of torch._scaled_mm")
    scale_a, scale_b, dtype = scales.torch_a, scales.torch_b, out.dtype
    scaled = compiled_scaled_mm(a, b, scale_a, scale_b, dtype)
    impl = f"torch.compile({COMPILE_MODE}) of torch._scaled_mm, fast accumulation"
    return Launch(lambda: scaled(a, b, scale_a, scale_b, dtype), {"impl": impl, "result": "returned"})
