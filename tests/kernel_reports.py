"""The survey's kernels compiled once per test session, through `gluon-survey inspect`'s engine
(`gluon_survey.driver.inspect.inspect_spec`), so compile tests share one parser of cuobjdump."""

from __future__ import annotations

import functools

from gluon_survey import registry
from gluon_survey.driver import inspect as gs_inspect
from gluon_survey.launch import CompileSpec


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
