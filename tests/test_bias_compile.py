"""The bias epilogue without a GPU: every kernel design of every Gluon rung compiles with a bias
(`kernels.plan.with_bias`: `bias` a pointer, HAS_BIAS True) for sm_90a and sm_100a, 16-bit and
fp8 (row-wise scales, then the bias), with the MMA of its design, no spills, and a load more than
the same kernel without a bias (the bias is read). One bias variant per design, the B and A
layouts aside (they change the operand loads, not the epilogue; gemv's row-major B is a design of
its own, its bias is loaded in another layout), plus the whole-K path (SPLIT_K 1) of splitk and swapab,
whose bias meets the MMA's (swapab: transposed) accumulator instead of the split reduction's
layout. The no-bias kernels are the suite's other compile tests; that they are unchanged by the
bias is what `gluon-survey inspect` shows (registers, SASS).

triton 3.6 and 3.9 (`make test` runs these in both: they carry no `exhaustive` mark)."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from gluon_survey import registry
from gluon_survey.driver import inspect as gs_inspect
from gluon_survey.kernels.plan import with_bias
from gluon_survey.launch import CompileSpec
from kernel_reports import ARCHS, SIZES, specs

pytestmark = pytest.mark.compile

FP8 = "float8_e4m3fn"
RUNGS = [m.name for m in registry.MODES if m.kind == "gluon" and not m.grouped]  # dense rungs
LAYOUT_CHOICES = ("B_KMAJOR", "W_KMAJOR", "A_KMAJOR")  # not a design of the epilogue (but gemv's: see above)


def _epilogue_design(spec: CompileSpec, arch: str) -> tuple:
    skip = SIZES | (frozenset() if spec.mode == "gemv" else frozenset(LAYOUT_CHOICES))
    choices = tuple(sorted((k, repr(v)) for k, v in spec.constexprs.items() if k not in skip))
    return (spec.mode, spec.fn.__name__, arch, choices)


def _whole_k(spec: CompileSpec) -> CompileSpec:
    """A split-K spec (compiled with 4 slices) with SPLIT_K 1: no reduction, C stored from the MMA's
    accumulator."""
    return dataclasses.replace(spec, kernel=f"{spec.kernel} k1", constexprs=spec.constexprs | {"SPLIT_K": 1})


@functools.cache
def _cases() -> list[tuple[str, str, str, int, bool]]:
    """(mode, arch, dtype, spec index, whole K) of the first spec of every epilogue design."""
    seen, cases = set(), []
    for mode in RUNGS:
        for arch in ARCHS:
            for dtype in ("float16", FP8):
                for index, spec in enumerate(specs(mode, arch, dtype)):
                    key = _epilogue_design(spec, arch)
                    if key not in seen:
                        seen.add(key)
                        cases.append((mode, arch, dtype, index, False))
                        if "SPLIT_K" in spec.constexprs and dtype == "float16":
                            cases.append((mode, arch, dtype, index, True))
    return cases


@functools.cache
def _reports(mode: str, arch: str, dtype: str, index: int, whole_k: bool):
    spec = specs(mode, arch, dtype)[index]
    if whole_k:
        spec = _whole_k(spec)
    if spec.constexprs.get("CONSUMERS") == 2 and dtype == FP8:
        # warpspec runs row-wise scales with a bias cooperative (its `prepare`): ping-pong with a
        # bias takes per-tensor scales
        spec = gs_inspect.with_scaling(spec, "tensor")
    biased = with_bias(spec)
    return biased, gs_inspect.inspect_spec(biased, arch), gs_inspect.inspect_spec(spec, arch)


# The MMA each design issues: (16-bit, fp8) opcodes per architecture; slab multiplies with
# mma.sync (16-bit, its fp8 operands converted to fp16) and gemv with FMAs.
def _mma(mode: str, arch: str, fp8: bool) -> str | None:
    if mode == "gemv":
        return None
    if mode == "slab":
        return "HMMA"
    if arch == "sm_90a":
        return "QGMMA" if fp8 else "HGMMA"
    return "UTCQMMA" if fp8 else "UTCHMMA"


@pytest.mark.parametrize(
    ("mode", "arch", "dtype", "index", "whole_k"),
    [
        pytest.param(*case, id=f"{case[0]}-{case[1]}-{case[2]}-{case[3]}{'-k1' * case[4]}")
        for case in _cases()
    ],
)
def test_bias_variant_compiles_without_spills(mode, arch, dtype, index, whole_k):
    spec, r, plain = _reports(mode, arch, dtype, index, whole_k)
    assert r.error is None, r.error
    assert plain.error is None, plain.error
    assert spec.constexprs["HAS_BIAS"] is True and spec.signature["bias"].startswith("*")
    mma = _mma(mode, arch, dtype == FP8)
    if mma is not None:
        assert r.count(mma) > 0, f"no {mma} in {spec.kernel}"
    assert r.spill_bytes == 0 and r.stack_bytes == 0, f"{spec.kernel}: {r.spill_bytes} B of spills"
    assert r.count("LDL") == 0 and r.count("STL") == 0, "local-memory traffic (spills)"
    assert r.count("LDG") > plain.count("LDG"), "the bias variant loads nothing more: no bias read"


def test_with_bias_makes_the_bias_a_pointer_of_the_output_dtype():
    plain = specs("Pipelined", "sm_90a", "bfloat16")[0]
    assert plain.constexprs["bias"] is None and plain.constexprs["HAS_BIAS"] is False
    biased = with_bias(plain)
    assert biased.signature["bias"] == "*bf16" and "bias" not in biased.constexprs
    assert list(biased.signature) == list(plain.fn.arg_names)  # the kernel's own order
    assert biased.kernel.endswith(" bias") and biased.constexprs["HAS_BIAS"] is True
    fp8 = with_bias(specs("swapab", "sm_90a", FP8)[0])
    assert fp8.signature["bias"] == "*bf16"  # an fp8 product is written (and biased) in bf16
    gemv = with_bias(specs("gemv", "sm_90a", "float16")[0])
    assert gemv.signature["bias"] == "*fp16"


def test_every_rung_spec_takes_a_bias():
    for mode in RUNGS:
        for arch in ARCHS:
            for spec in specs(mode, arch, "float16"):
                assert "HAS_BIAS" in spec.constexprs, spec.kernel
                assert "bias" in spec.fn.arg_names, spec.kernel
