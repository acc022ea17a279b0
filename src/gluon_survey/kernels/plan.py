"""The host side of the rungs' launches, in one module: what a provider's `prepare` builds once,
and what every later launch of it runs. (The device code the kernels share is in
`kernels/common.py`, which never imports this module; the API's cache of plans per call key is in
`api.py`, which this module never imports: tests/test_layering.py.)

First launch of a rung: `Rung.prepare` -> `Rung.launch` -> `Rung.plan` makes the three TMA
descriptors once and keeps them as templates without a base (`make_descriptors`, `templates_of`),
with grid and constexprs, in a `Plan` around a `Launcher` for the kernel. The first `Plan.launch`
(the function `_plan_launch` makes) calls `Launcher.__call__`, that is `kernel[grid](...)`:
Triton compiles, and `compat.raw_launch` finds the C launcher under the compiled kernel.

Every later launch is `Plan.launch` alone: that C launcher, with each operand's CUtensorMap
encoded once per base address (`Plan.encode`, kept in `Plan.encoded`, at most `ENCODED_PER_SLOT`
per operand). Where there is no such C launcher (other triton releases) or a launch hook is set,
it calls `Launcher.__call__` again, which calls the compiled kernel without Triton's dispatch.

The same `Rung` gives `gluon-survey inspect` its compile specs (`Rung.compile_specs`,
`desc_signature`) from the same constexprs, so what is compiled is what is launched. Rungs with a
host side of their own use the parts: splitk (and swapab through it) builds its `Plan`, gemv
calls a `Launcher`.
"""

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch
import triton
from triton import knobs
from triton.experimental.gluon import language as gl
from triton.runtime.driver import driver

from ..compat import RawLaunch, raw_launch
from ..launch import (
    ALIGN,
    B_LAYOUTS,
    CompileSpec,
    Launch,
    Scales,
    Target,
    Unaligned,
    a_layout,
    b_layout,
    is_a_kmajor,
    is_kmajor,
)
from .common import GemmConfig

GL_DTYPES = {"float16": gl.float16, "bfloat16": gl.bfloat16, "float8_e4m3fn": gl.float8e4nv}
FP8 = "float8_e4m3fn"
# Signature type names, and the output dtype `inspect` compiles an fp8 kernel with.
_SIGNATURE_TYPES = {"float16": "fp16", "bfloat16": "bf16", FP8: "fp8e4nv"}
FP8_OUT = "bfloat16"

# --------------------------------------------------------------------------------------------------
# Descriptors and grids for launches, signatures for GPU-less compiles.


def smem_layout(block_shape, gl_dtype):
    return gl.NVMMASharedLayout.get_default_for(list(block_shape), gl_dtype)


def block_shapes(
    cfg: GemmConfig, layout: str, a_layout: str = "row"
) -> tuple[list[int], list[int], list[int]]:
    """TMA block shapes of A, B and C: A one box of BLOCK_M rows ([BK, BM] of the [K, M] matrix
    for A layout "t"), B K-major for layout "t", C one epilogue slice (the whole tile where the
    epilogue is not sliced)."""
    BM, BN, BK = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
    a_block = [BM, BK] if is_a_kmajor(a_layout) else [BK, BM]
    return a_block, ([BN, BK] if is_kmajor(layout) else [BK, BN]), [BM, cfg.epilogue_n]


def make_descriptors(a, b, c, cfg: GemmConfig, layout: str, blocks=None, a_layout: str = "row"):
    """Host TMA descriptors for A ([M,K], or the [K,M] matrix behind an A layout "t" view), B ([K,N],
    or the [N,K] weight behind a "t" view) and C [M,N], with the config's block shapes
    (`block_shapes`) or the (A, B, C) `blocks` given."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    a_block, b_block, c_block = blocks or block_shapes(cfg, layout, a_layout)
    a_src = a if is_a_kmajor(a_layout) else a.t()
    b_src = b.t() if is_kmajor(layout) else b
    return tuple(
        TensorDescriptor.from_tensor(t, block, smem_layout(block, gl_dtype(t)))
        for t, block in ((a_src, a_block), (b_src, b_block), (c, c_block))
    )


def check_a_layout(mode: str, layout: str, capability: tuple[int, int], fp8: bool) -> None:
    """What a rung refuses of an A in layout "t" (the transpose view of a row-major [K, M] matrix),
    which `gluon_survey.matmul` hands on only where `reads_transposed_a` says it may: fp8 operands
    (fp8 wgmma reads A K-major) and a GPU other than Hopper (the tcgen05 kernels read A K-major
    only; none of them is compiled with an M-major A)."""
    if is_a_kmajor(layout):
        return
    if fp8:
        raise ValueError(
            f"{mode}: fp8 MMAs read both operands K-major: A must be a row-major [M, K] matrix, not "
            "the transpose view of a [K, M] one (pass a.contiguous())"
        )
    if capability[0] != 9:
        raise ValueError(
            f"{mode}: a transposed A (the view x.t() of a row-major [K, M] matrix) is read in place "
            f"on Hopper (sm_90) only; this GPU is sm_{capability[0]}{capability[1]} (pass a.contiguous())"
        )


def reads_transposed_a(a, b, target: Target, fp8: bool = False) -> bool:
    """The provider contract's `reads_transposed_a` (gluon_survey/registry.py) of a rung that reads
    A through `make_descriptors`: on Hopper, for 16-bit operands (`check_a_layout`)."""
    return target.capability[0] == 9 and not fp8


def gl_dtype(t):
    """The Gluon dtype of a torch tensor."""
    return GL_DTYPES[str(t.dtype).removeprefix("torch.")]


def _rebased(template, base):
    """A copy of a descriptor with another base tensor, made without the constructor's checks.

    Only for a template that the constructor has checked with a tensor of the same shape, strides
    and dtype as `base` and a base as aligned (`Plan` says who guarantees that). The copy takes
    every field of the template, so fields that newer triton versions add come along. Copying the
    fields costs a fraction of `TensorDescriptor(...)`, whose checks run on every construction."""
    fields = template.__dict__.copy()
    fields["base"] = base
    desc = object.__new__(type(template))
    desc.__dict__ = fields
    return desc


def templates_of(descriptors) -> tuple[object, ...]:
    """Descriptors without their bases, for a `Plan` (it rebases them per call)."""
    return tuple(_rebased(d, None) for d in descriptors)


def desc_signature(block_shape, dtype: str) -> str:
    """The signature string of a tensor-descriptor argument, for GPU-less compiles."""
    gdt = GL_DTYPES[dtype]
    ty = _SIGNATURE_TYPES[dtype]
    return f"tensordesc<{ty}[{block_shape[0]}, {block_shape[1]}],{smem_layout(block_shape, gdt)!r}>"


DESC_ARGS = ("a_desc", "b_desc", "c_desc")

# Programmatic dependent launch of the split-K family (splitk, swapab: the kernels that wait for
# the kernel before them, `common.wait_for_previous_grid`), read once at import from the
# environment: GLUON_SURVEY_PDL=1. Off by default. On the H200, calls of ours back to back with
# nothing between them ran 1.4-2.4 µs (2-18 %) faster a call at 2-16 tokens, and one shape, a
# single wave of two programs an SM (8 x 10240 x 8192), 6 µs slower: the next kernel's programs take
# the SM slots the previous one leaves free, two to an SM. The survey's timer records an event
# between calls, which a dependent launch cannot overlap, so no sweep measures it
# (docs/perf-notes.md, entry 90; scripts/pdl_probe.py times calls with nothing between them).
PDL = os.environ.get("GLUON_SURVEY_PDL", "0") == "1"


# --------------------------------------------------------------------------------------------------
# The launch: the compiled kernel called directly (`Launcher`), and a launch with everything
# decided but the addresses (`Plan`), whose `launch` is what a repeated `matmul` call runs.


class Launcher:
    """`kernel[grid](*args, **constexprs, num_warps=...)` without Triton's per-call dispatch.

    A `@gluon.jit` launch binds every argument, recomputes its specialization key and looks up the
    compiled kernel on every call: tens of microseconds of Python, longer than a decode-step GEMM.
    The first call goes that way and keeps the `CompiledKernel` it returns; later calls hand the
    same arguments to its launcher directly, or on triton 3.6 to the C launcher under it
    (`compat.raw_launch`: `raw`, None elsewhere), which also takes tensor descriptors already
    encoded (`direct`). Only for arguments that specialize alike (the plans that own a Launcher
    are keyed on shapes, strides and dtypes, and the bases' 16-byte alignment is checked before
    a launch: by `Plan` where it reads an address, by `gluon_survey.api` for the others), and
    while no launch hook is set (a profiler's hooks get the full path). `pdl`: compiled for a
    programmatic dependent launch (Triton's `launch_pdl`), for kernels that wait for the kernel
    before them before they touch memory."""

    def __init__(
        self, kernel, grid: tuple[int, ...], constexprs: dict[str, object], num_warps: int, pdl: bool = False
    ):
        self.kernel, self.grid, self.constexprs, self.num_warps = kernel, grid, constexprs, num_warps
        self.options = {"num_warps": num_warps} | ({"launch_pdl": True} if pdl else {})
        self.grid3 = (*grid, 1, 1)[:3]
        self.values = tuple(constexprs.values())  # positionally, after the arguments
        self.compiled = None
        self.raw: RawLaunch | None = None
        self.stream: tuple[Callable, Callable] | None = None  # Triton's current-stream functions

    def __call__(self, *args) -> None:
        compiled = self.compiled
        if compiled is None or _hooked():
            self.compiled = self.kernel[self.grid](*args, **self.constexprs, **self.options)
            if self.compiled is not None and self.raw is None:
                # looked up once here rather than through the driver's lazy proxy on every call
                self.stream = (driver.active.get_current_stream, _current_device_fn())
                raw = raw_launch(self.compiled)
                # `direct` takes the descriptors first, as every kernel with a Plan does
                if raw is not None and raw.descriptors == tuple(range(len(raw.descriptors))):
                    self.raw = raw
            return
        g0, g1, g2 = self.grid3
        get_stream, get_device = self.stream
        raw = self.raw
        if raw is not None and not raw.descriptors:
            raw.launch(g0, g1, g2, get_stream(get_device()), *raw.head, *args, *self.values)
            return
        compiled.run(
            g0,
            g1,
            g2,
            get_stream(get_device()),
            compiled.function,
            compiled.packed_metadata,
            None,
            None,
            None,
            *args,
            *self.values,
        )

    def direct(self) -> tuple | None:
        """Once `raw` is known: (C launcher, gx, gy, gz, get_stream, get_device, head, constexpr
        values), to be called as `launch(gx, gy, gz, get_stream(get_device()), *head, *args,
        *values)` with every tensor descriptor in `args` as `raw.encode` expands it, while no
        launch hook is set. None before."""
        raw = self.raw
        if raw is None:
            return None
        return (raw.launch, *self.grid3, *self.stream, raw.head, self.values)


def _current_device_fn() -> Callable[[], int]:
    """Triton's current-device function; where that is `torch.cuda.current_device`, the C function
    under it, without its check that CUDA is initialized (three Python calls a launch), because
    a Launcher asks only after a first launch, which initialized it."""
    get_device = driver.active.get_current_device
    if get_device is torch.cuda.current_device and hasattr(torch._C, "_cuda_getDevice"):
        return torch._C._cuda_getDevice
    return get_device


def _aligned_base(t, i: int):
    """t, whose base address TMA can take; else `Unaligned` (i: 0, 1, 2 for A, B, C)."""
    if t.data_ptr() % ALIGN:
        raise Unaligned(f"{'ABC'[i]}'s base address is not {ALIGN}-byte aligned: TMA cannot describe it")
    return t


def _hooked() -> bool:
    """Whether a launch hook (a profiler's) is registered: its calls need Triton's own launch."""
    hooks = knobs.runtime.launch_enter_hook
    return hooks is not None and bool(getattr(hooks, "calls", True))


# Addresses a Plan keeps encoded descriptors for, per operand (then it starts over). One plan serves
# every layer of a model with its shape, so its weight slot sees one address per layer: 80 in
# Llama-3-70B. Past the limit a cycle of addresses would miss on every call. An encoding is ~0.3 KB.
ENCODED_PER_SLOT = 256


@dataclass(frozen=True)
class Plan:
    """One rung launch with everything decided but the tensors' addresses: kernel, grid,
    constexprs, warps and the three TMA descriptors as templates (shape, strides, block shape and
    shared layout set and checked once; no base, so the plan keeps no tensor alive), and the
    arguments that follow them (`extra`: a split-K workspace).

    `launch(a, b, out, scales=None)` launches on these tensors; nothing is chosen again. So it is
    only for tensors of the problem the plan was made for: the same shapes, strides, dtype and B
    layout (`gluon_survey.api` keys its plan cache on exactly these). The one thing it checks is
    TMA's rule for a base address, 16-byte alignment, where it first meets the address: a base
    that breaks it raises `Unaligned` before anything is launched (`checks_bases`). Where the
    launcher takes encoded descriptors (`Launcher.direct`), each operand's encoded CUtensorMap is
    kept per base address (`encoded`: address -> CUtensorMap, shape and strides, at most
    `ENCODED_PER_SLOT` each, no tensor), so a call with an operand at an address seen before
    encodes nothing and checks nothing; a weight is always such an operand. Elsewhere (the first
    call, a launch hook, other triton releases) each call copies the templates with the new
    tensors as bases (`_rebased`) and Triton encodes them. The B descriptor describes the [N, K]
    weight behind a "t" view; its base is `b` itself, because a descriptor reads only its base's
    address and dtype, which a view and its transpose share."""

    launcher: Launcher
    templates: tuple[object, object, object]  # A, B, C descriptors without a base
    cfg: GemmConfig
    extra: tuple[object, ...] = ()
    scaled: bool = False  # the kernel takes (scale_a, scale_b) after the descriptors (`scale_args`)
    # the kernel takes a `bias` after those (None without one: a constexpr, as the scales' None)
    biased: bool = False
    encoded: tuple[dict, dict, dict] = field(default_factory=lambda: ({}, {}, {}), compare=False, repr=False)
    launch: Callable[..., None] = field(init=False, compare=False, repr=False)
    # `launch` refuses a base it cannot take (`Unaligned`), so its caller need not read the bases.
    checks_bases: ClassVar[bool] = True

    def __post_init__(self):
        object.__setattr__(self, "launch", _plan_launch(self))

    def descriptors(self, a, b, out) -> tuple[object, object, object]:
        """The templates on these tensors; `Unaligned` if a base is not 16-byte aligned."""
        ta, tb, tc = self.templates
        return (
            _rebased(ta, _aligned_base(a, 0)),
            _rebased(tb, _aligned_base(b, 1)),
            _rebased(tc, _aligned_base(out, 2)),
        )

    def rest(self, scales: Scales | None, bias=None) -> tuple[object, ...]:
        """The kernel arguments after the three descriptors."""
        biased = (bias,) if self.biased else ()
        return (*scale_args(scales), *biased, *self.extra) if self.scaled else (*biased, *self.extra)

    def encode(self, i: int, t) -> tuple:
        """Descriptor i's encoding for tensor t, kept for t's address."""
        cache = self.encoded[i]
        if len(cache) >= ENCODED_PER_SLOT:
            cache.clear()
        enc = cache[t.data_ptr()] = self.launcher.raw.encode(
            _rebased(self.templates[i], _aligned_base(t, i)), i
        )
        return enc

    def bind(self, a, b, out, scales: Scales | None = None, bias=None) -> Callable[[], None]:
        """The bare launch on these tensors: the descriptors are made now (and encoded once, after
        the first launch, where the launcher takes them encoded), so `fn()` only launches the
        kernel (what the driver times). `fn.plan` is this plan, for callers that launch it again on
        other tensors of the same problem (`gluon_survey.api`'s plan cache)."""
        rest = self.rest(scales, bias)
        args = (*self.descriptors(a, b, out), *rest)
        launcher = self.launcher
        direct = encoded = None

        def fn():
            nonlocal direct, encoded
            if direct is None or _hooked():
                launcher(*args)
                direct = launcher.direct()
                if direct is not None and encoded is None:
                    encode = launcher.raw.encode
                    encoded = (*(e for i in range(3) for e in encode(args[i], i)), *rest)
                return
            c_launch, g0, g1, g2, get_stream, get_device, head, values = direct
            c_launch(g0, g1, g2, get_stream(get_device()), *head, *encoded, *values)

        fn.plan = self
        return fn


def _plan_launch(plan: Plan) -> Callable[..., None]:
    """`plan.launch`: one function over the plan's parts, bound once, because it is the whole of a
    cached `matmul` call's launch (`plan.launch.plan` is the plan)."""
    launcher, encode, scaled, extra, biased = plan.launcher, plan.encode, plan.scaled, plan.extra, plan.biased
    ea, eb, ec = plan.encoded
    runtime = knobs.runtime
    # `launcher.direct()`, bound at the first launch; `tail`: what follows the scales
    c_launch = g0 = g1 = g2 = get_stream = get_device = head = tail = None

    def launch(a, b, out, scales: Scales | None = None, bias=None) -> None:
        """out = a @ b (times fp8 `scales`, + `bias`) on these tensors."""
        nonlocal c_launch, g0, g1, g2, get_stream, get_device, head, tail
        hooks = runtime.launch_enter_hook  # `_hooked()`, written out
        if c_launch is None or (hooks is not None and getattr(hooks, "calls", True)):
            launcher(*plan.descriptors(a, b, out), *plan.rest(scales, bias))
            direct = launcher.direct()
            if direct is not None:
                c_launch, g0, g1, g2, get_stream, get_device, head, values = direct
                tail = (*extra, *values)
            return
        c_launch(
            g0,
            g1,
            g2,
            get_stream(get_device()),
            *head,
            *(ea.get(a.data_ptr()) or encode(0, a)),
            *(eb.get(b.data_ptr()) or encode(1, b)),
            *(ec.get(out.data_ptr()) or encode(2, out)),
            *(scale_args(scales) if scaled else ()),  # `Plan.rest`, written out with `tail`
            *((bias,) if biased else ()),
            *tail,
        )

    launch.plan = plan
    return launch


@dataclass(frozen=True)
class GroupedPlan:
    """`Plan` for the grouped kernels (kernels/grouped.py and the rungs built on it), whose
    arguments are x's and the weight's TMA descriptors, then (out, offs, scale_x, scale_w, S, N, E):
    kernel, grid and constexprs decided once for one problem (x's [S, K], the weight's [E, K, N]
    view and strides, the dtypes, the scales' kind), the two descriptors kept as templates without
    a base. `launch(x, w, offs, out, scales)` launches on these tensors, the offsets read on the
    device as ever, so one plan serves every routing; with `Launcher.direct`, each descriptor's
    CUtensorMap is encoded once per base address (`encoded`, as `Plan.encoded`): a model's
    expert weights are always such bases. A plan is only for tensors of the problem it was made
    for, checked (and their bases' 16-byte alignment) by `gluon_survey.grouped`, which keys its
    cache of plans on exactly these. `config`: what a results row records of the launch."""

    launcher: Launcher
    templates: tuple[object, object]  # x's [S, K] and the weight's [E * N, K] descriptors, no base
    args: tuple[int, int, int]  # the kernel's S, N, E (N: the output's columns)
    config: dict = field(compare=False)
    encoded: tuple[dict, dict] = field(default_factory=lambda: ({}, {}), compare=False, repr=False)

    def descriptors(self, x, w) -> tuple[object, object]:
        """The templates on x and on the [E * N, K] view of w's weight."""
        E, K, N = w.shape
        tx, tw = self.templates
        return _rebased(tx, x), _rebased(tw, w.transpose(1, 2).reshape(E * N, K))

    def encode(self, i: int, t) -> tuple:
        """Descriptor i's encoding with t's address as its base (a descriptor's encoding reads its
        base's address alone, so the weight's is w itself), kept for that address."""
        cache = self.encoded[i]
        if len(cache) >= ENCODED_PER_SLOT:
            cache.clear()
        enc = cache[t.data_ptr()] = self.launcher.raw.encode(_rebased(self.templates[i], t), i)
        return enc

    def launch(self, x, w, offs, out, scales: Scales | None = None) -> None:
        """out[rows of e] = x[rows of e] @ w[e] (times fp8 `scales`) on these tensors."""
        rest = (out, offs, *scale_args(scales), *self.args)
        launcher = self.launcher
        direct = None if _hooked() else launcher.direct()
        if direct is None:  # the first launch (Triton compiles), a launch hook, other releases
            launcher(*self.descriptors(x, w), *rest)
            return
        c_launch, g0, g1, g2, get_stream, get_device, head, values = direct
        ex, ew = self.encoded
        c_launch(
            g0,
            g1,
            g2,
            get_stream(get_device()),
            *head,
            *(ex.get(x.data_ptr()) or self.encode(0, x)),
            *(ew.get(w.data_ptr()) or self.encode(1, w)),
            *rest,
            *values,
        )

    def bind(self, x, w, offs, out, scales: Scales | None = None) -> Launch:
        """The launch on these tensors as a `Launch` (what a provider's `prepare` returns)."""
        return Launch(lambda: self.launch(x, w, offs, out, scales), self.config)


# --------------------------------------------------------------------------------------------------
# A rung's provider functions (`Rung`): config, plan, compile specs; and the fp8 scale arguments.


def check_config_kind(mode: str, cfg: GemmConfig, scales: Scales | None) -> None:
    """Refuse a config for the other kind of operands: fp8 configs take scales, 16-bit ones none."""
    if (scales is not None) != (cfg.ELEM_BYTES == 1):
        kind = "fp8" if cfg.ELEM_BYTES == 1 else "16-bit"
        raise ValueError(f"{mode}: config {cfg.label} is for {kind} operands")


def bias_table(bias) -> dict[str, object]:
    """What a results row records of a bias: that it is added in the kernel's epilogue."""
    return {} if bias is None else {"bias": "fused"}


def scale_args(scales: Scales | None) -> tuple[object, object]:
    """The (scale_a, scale_b) kernel arguments: the flat fp32 scales, or None, None without (a
    None argument is a constexpr to Triton, so the fp16/bf16 kernels compile as if they had no
    such arguments)."""
    return (None, None) if scales is None else (scales.a, scales.b)


def scaling_code(scales: Scales | None) -> int:
    """The SCALING constexpr of `scale_tile`: 0 without scales."""
    return 0 if scales is None else scales.code


def _out_type(spec: CompileSpec) -> str:
    """The Triton element type of a spec's output ("fp16", "bf16"): its C descriptor's or pointer's."""
    for name in ("c_desc", "c_ptr"):
        sig = spec.signature.get(name)
        if sig is not None:
            return sig.removeprefix("tensordesc<").removeprefix("*").split("[")[0]
    raise ValueError(f"{spec.kernel}: no c_desc or c_ptr in its signature")


def with_bias(spec: CompileSpec) -> CompileSpec:
    """A rung kernel's compile spec (made without a bias: `bias` a None constexpr, HAS_BIAS False)
    with a bias of the output's dtype: `bias` a pointer, HAS_BIAS True, the label's " bias"."""
    if "HAS_BIAS" not in spec.constexprs:
        raise ValueError(f"{spec.kernel}: the kernel takes no bias")
    signature = spec.signature | {"bias": "*" + _out_type(spec)}
    signature = {name: signature[name] for name in spec.fn.arg_names}  # the kernel's order
    constexprs = {k: v for k, v in spec.constexprs.items() if k != "bias"} | {"HAS_BIAS": True}
    return replace(spec, kernel=f"{spec.kernel} bias", signature=signature, constexprs=constexprs)


@dataclass(frozen=True)
class Rung:
    """The host side of a rung kernel that takes (a_desc, b_desc, c_desc, bias, **constexprs,
    HAS_BIAS), or with `scaled` (a_desc, b_desc, c_desc, scale_a, scale_b, bias, **constexprs,
    SCALING, HAS_BIAS): its launch and its compile specs, built from the same `constexprs(cfg,
    capability, layout)`, so that what `inspect` compiles is what `prepare` launches. Persistent
    kernels get one program per SM (or per tile, when there are fewer tiles), the others one per
    tile."""

    mode: str
    kernel: object
    constexprs: Callable[[GemmConfig, tuple[int, int], str], dict[str, object]]
    persistent: bool = False
    # One config per compute-capability major, for a rung whose provider functions are the Rung's
    # (`config_for`, `candidates`, `prepare`, `specs`); warpspec chooses its own.
    configs: Mapping[int, GemmConfig] = field(default_factory=dict)
    # The same for fp8 operands (ELEM_BYTES 1), for a rung that takes scales (`scaled`).
    fp8_configs: Mapping[int, GemmConfig] = field(default_factory=dict)
    # More 16-bit configs per major that `tune` times beside the default (`candidates`, `specs`).
    more: Mapping[int, tuple[GemmConfig, ...]] = field(default_factory=dict)
    scaled: bool = False
    desc_args: tuple[str, str, str] = DESC_ARGS  # the kernel's names of the A, B and C descriptors
    # The kernel takes A_KMAJOR (right after B_KMAJOR), and `constexprs` an A layout: it reads a
    # transposed A in place on Hopper (16-bit operands), and its compile specs include one.
    transposed_a: bool = False

    def configs_of(self, fp8: bool) -> Mapping[int, GemmConfig]:
        return self.fp8_configs if fp8 else self.configs

    # The provider contract (gluon_survey/registry.py), for a rung with one config per architecture.

    def config_for(self, capability: tuple[int, int], K: int, fp8: bool = False) -> GemmConfig:
        return self.configs_of(fp8)[capability[0]]

    def candidates(self, capability: tuple[int, int], fp8: bool = False) -> dict[str, GemmConfig]:
        """The configs `gluon-survey tune` may pick, by label: the default and, for 16-bit
        operands, `more`."""
        cfg = self.configs_of(fp8)[capability[0]]
        extra = () if fp8 else self.more.get(capability[0], ())
        return {c.label: c for c in (cfg, *extra)}

    def prepare(
        self,
        a,
        b,
        out,
        target: Target,
        cfg: GemmConfig | None = None,
        scales: Scales | None = None,
        bias=None,
    ) -> Launch:
        cfg = cfg or self.config_for(target.capability, a.shape[1], scales is not None)
        return self.launch(a, b, out, target, cfg, scales, bias)

    def specs(self, capability: tuple[int, int], dtype: str) -> list[CompileSpec]:
        """Compile specs of the configs this architecture may run (`candidates`; none where it runs
        none)."""
        if capability[0] not in self.configs_of(dtype == FP8):
            return []
        fp8 = dtype == FP8
        transposed = [self.config_for(capability, 0, fp8)] if self.transposed_a else []
        return self.compile_specs(
            capability, dtype, list(self.candidates(capability, fp8).values()), transposed
        )

    def plan(
        self, a, b, out, target: Target, cfg: GemmConfig, scales: Scales | None = None, has_bias: bool = False
    ) -> Plan:
        """The launch plan for tensors like these (only their shapes, strides and dtype are read;
        bases must be 16-byte aligned): descriptors' block shapes and layouts, grid, constexprs
        (HAS_BIAS: `has_bias`; the bias itself is an argument of each launch)."""
        layout, alayout = b_layout(b), a_layout(a)
        check_a_layout(self.mode, alayout, target.capability, scales is not None)
        kw = self.kernel_constexprs(cfg, target.capability, layout, scaling_code(scales), has_bias, alayout)
        templates = templates_of(make_descriptors(a, b, out, cfg, layout, a_layout=alayout))
        tiles = num_tiles(*out.shape, cfg)
        grid = (min(target.sm_count, tiles) if self.persistent else tiles,)
        launcher = Launcher(self.kernel, grid, kw, cfg.num_warps)
        return Plan(launcher, templates, cfg, scaled=self.scaled, biased=True)

    def kernel_constexprs(
        self, cfg, capability, layout: str, scaling: int, has_bias: bool = False, a_layout: str = "row"
    ) -> dict[str, object]:
        """`constexprs`, then SCALING for a scaled kernel and HAS_BIAS (its last parameters). A kernel
        that takes A_KMAJOR (`transposed_a`) gets it from `a_layout`; the others only "row"."""
        if self.transposed_a:
            kw = self.constexprs(cfg, capability, layout, a_layout)
        else:
            if not is_a_kmajor(a_layout):
                raise ValueError(f"{self.mode}: reads A row-major only (pass a.contiguous())")
            kw = self.constexprs(cfg, capability, layout)
        if self.scaled:
            kw = kw | {"SCALING": scaling}
        return kw | {"HAS_BIAS": has_bias}

    def launch(
        self, a, b, out, target: Target, cfg: GemmConfig, scales: Scales | None = None, bias=None
    ) -> Launch:
        """A ready launch of out = a @ b (+ bias); `Launch.fn.plan` launches the same on other
        tensors."""
        check_config_kind(self.mode, cfg, scales)
        plan = self.plan(a, b, out, target, cfg, scales, bias is not None)
        return Launch(plan.bind(a, b, out, scales, bias), cfg.table() | bias_table(bias))

    def compile_specs(
        self, capability: tuple[int, int], dtype: str, configs, transposed=()
    ) -> list[CompileSpec]:
        """One spec per config and B layout, for `gluon-survey inspect`; fp8 (K-major B only)
        with row-wise scales, the epilogue that does the most; no bias (`with_bias` adds one).
        Then, on Hopper for 16-bit operands, one per config of `transposed` (a rung's default
        config per design) and B layout with A in layout "t" (label " A=t"), the kernel that
        reads a transposed A in place."""
        specs = []
        fp8 = dtype == FP8
        variants = [(cfg, "row") for cfg in configs]
        if capability[0] == 9 and not fp8:
            variants += [(cfg, "t") for cfg in transposed]
        for cfg, alayout in variants:
            for layout in ("t",) if fp8 else B_LAYOUTS:
                values = self.kernel_constexprs(cfg, capability, layout, 2 if fp8 else 0, a_layout=alayout)
                blocks = block_shapes(cfg, layout, alayout)
                dtypes = (dtype, dtype, FP8_OUT if fp8 else dtype)
                signature = {
                    arg: desc_signature(block, dt)
                    for arg, block, dt in zip(self.desc_args, blocks, dtypes, strict=True)
                }
                none = {"bias": None}  # no bias: a None constexpr, as the 16-bit kernels' scales
                if self.scaled:
                    signature |= {"scale_a": "*fp32", "scale_b": "*fp32"} if fp8 else {}
                    none = ({} if fp8 else {"scale_a": None, "scale_b": None}) | none
                values = none | values  # the kernel's order: scales, bias, then the constexprs
                specs.append(
                    CompileSpec(
                        self.mode,
                        f"{self.kernel.__name__} {cfg.label}{' A=t' if alayout == 't' else ''} B={layout}"
                        + (" scales=row" if fp8 else ""),
                        self.kernel,
                        signature | dict.fromkeys(values, "constexpr"),
                        values,
                        {"num_warps": cfg.num_warps},
                        config=cfg,
                    )
                )
        return specs


def provider_functions(rung: Callable[[], Rung]):
    """The provider contract (gluon_survey/registry.py) of a rung module whose Rung answers it:
    (config_for, candidates, prepare, compile_specs), each asking `rung()` on every call, so that
    a test may swap the module's RUNG (its kernel for a recorder)."""

    def config_for(capability: tuple[int, int], K: int, fp8: bool = False) -> GemmConfig:
        return rung().config_for(capability, K, fp8)

    def candidates(capability: tuple[int, int], fp8: bool = False) -> dict[str, GemmConfig]:
        return rung().candidates(capability, fp8)

    def prepare(
        a, b, out, target: Target, cfg: GemmConfig | None = None, scales: Scales | None = None, bias=None
    ) -> Launch:
        return rung().prepare(a, b, out, target, cfg, scales, bias)

    def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
        return rung().specs(capability, dtype)

    return config_for, candidates, prepare, compile_specs


def num_tiles(M: int, N: int, cfg: GemmConfig) -> int:
    return triton.cdiv(M, cfg.a_rows) * triton.cdiv(N, cfg.BLOCK_N)
