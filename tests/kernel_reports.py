"""The survey's kernels compiled once per test session, through `gluon-survey inspect`'s engine
(`gluon_survey.driver.inspect.inspect_spec`), so compile tests share one parser of cuobjdump.

Every config of every rung is compiled by the triton-3.6 suite. The triton-3.9 pass of `make test`
(`-m "compile and not exhaustive"`) compiles one config per kernel design instead: the compile
tests mark the other configs' parameters `exhaustive` (`config_marks`). What differs between the
two releases is the Gluon API (renamed calls, moved classes: `gluon_survey/compat.py`), and a
renamed call fails whichever config traces it. A design is what decides which calls a kernel
traces: the kernel function, the architecture, 16-bit or fp8 operands (fp8 traces the scales'
epilogue), the B layout (K-major B is read through a transposed view) and every constexpr that
picks a branch (SCALING, ONE_CHUNK, warpspec's ping-pong or cooperative consumers, ...). What is
left out only changes the numbers fed to the same calls: the tile sizes and warp counts, the
ring's depth, the swizzle group, the split, the register budgets, and fp16 beside bf16 (the
same constexprs, another element type).
"""

from __future__ import annotations

import functools

import pytest

from gluon_survey import registry
from gluon_survey.driver import inspect as gs_inspect
from gluon_survey.launch import CompileSpec

ARCHS = ("sm_90a", "sm_100a")
DTYPES = ("float16", "bfloat16", "float8_e4m3fn")  # the first of a design is its representative
# Constexprs that size a kernel rather than choose its code (`design`): numbers fed to the same calls.
SIZES = frozenset(
    {"GROUP_M", "STAGES", "SPLIT_K", "ROWS", "BLOCK_K", "C_BUFFERS", "EPILOGUE_BUFFERS"}
    | {"CONSUMER_REGS", "PRODUCER_REGS", "LOAD_REGS", "MMA_REGS"}
)


def specs(mode: str, arch: str, dtype: str = "float16") -> list[CompileSpec]:
    """The compile specs a mode's provider module gives for this arch (its own for sm_100 warpspec)."""
    _, capability = gs_inspect.parse_arch(arch)
    return registry.get(mode).provider(capability).compile_specs(capability, dtype)


@functools.cache
def compiled_report(
    mode: str, arch: str, dtype: str, index: int
) -> tuple[CompileSpec, gs_inspect.KernelReport]:
    """Spec number `index` of `specs(mode, arch, dtype)` and its inspect report (compiled once)."""
    spec = specs(mode, arch, dtype)[index]
    return spec, gs_inspect.inspect_spec(spec, arch)


def design(spec: CompileSpec, arch: str) -> tuple:
    """What decides which Gluon calls `spec` traces (the module docstring): specs with the same
    design differ only in numbers."""
    choices = tuple(sorted((k, repr(v)) for k, v in spec.constexprs.items() if k not in SIZES))
    return (spec.mode, getattr(spec.fn, "__name__", repr(spec.fn)), arch, choices)


@functools.cache
def _representatives() -> frozenset[tuple[str, str, str, int]]:
    """(mode, arch, dtype, index) of the first spec of every design, over every Gluon rung."""
    seen, firsts = set(), set()
    for mode in (m.name for m in registry.MODES if m.kind == "gluon" and not m.grouped):
        for arch in ARCHS:
            for dtype in DTYPES:
                for index, spec in enumerate(specs(mode, arch, dtype)):
                    key = design(spec, arch)
                    if key not in seen:
                        seen.add(key)
                        firsts.add((mode, arch, dtype, index))
    return frozenset(firsts)


def config_marks(mode: str, arch: str, dtype: str, index: int) -> tuple:
    """The marks of a compile test's parameter: `exhaustive` unless the spec is the first of its
    design (the one the triton-3.9 pass compiles)."""
    return () if (mode, arch, dtype, index) in _representatives() else (pytest.mark.exhaustive,)


MMAS = ("HMMA", "HGMMA", "QGMMA", "UTCHMMA", "UTCQMMA")


def assert_streams_into_registers(spec: CompileSpec, r: gs_inspect.KernelReport) -> None:
    """What a CUDA-core streaming kernel's SASS must show (gemv, the routed kernels): it compiled,
    16-byte loads straight into registers, FMAs, no MMA of any kind, no TMA, no shared-memory
    ring, no spills."""
    assert r.error is None, r.error
    wide = sum(n for op, n in r.sass.items() if op.startswith("LDG.") and op.endswith(".128"))
    assert wide > 0, f"no 16-byte loads in {spec.kernel}: {r.sass}"
    assert r.count("FFMA") + r.count("FFMA2") > 0, f"no FMAs in {spec.kernel}: {r.sass}"
    assert all(r.count(m) == 0 for m in MMAS), f"an MMA in {spec.kernel}: {r.sass}"
    assert r.count("UTMALDG") == 0 and r.count("LDSM") == 0
    assert r.count("LDL") == 0 and r.count("STL") == 0, "local-memory traffic (spills)"
    assert r.spill_bytes == 0 and r.stack_bytes == 0
