"""The routed decode kernels (kernels/routed.py) without a GPU: both compile for sm_90a and sm_100a
in fp16 and bf16 at the surveyed models' H and I, with one row a program and with the most rows
each program's warps hold, and their SASS is what the docstring claims:
16-byte loads straight into registers, CUDA-core FMAs, no MMA, no TMA, no shared-memory ring, no
spills. The triton-3.9 pass compiles the first spec of each kernel and architecture."""

from __future__ import annotations

import functools

import pytest

from gluon_survey.driver import inspect as gs_inspect
from gluon_survey.kernels import routed
from kernel_reports import assert_streams_into_registers

pytestmark = pytest.mark.compile


# The default rows a program, then the most each program's warps hold (`routed.MOST_ROWS`).
CONFIGS = (routed.CONFIG, routed.RoutedConfig(GATE_UP_ROWS=8, DOWN_ROWS=8))


@functools.cache
def _specs(arch: str, dtype: str):
    capability = gs_inspect.parse_arch(arch)[1]
    specs = {}
    for config in CONFIGS:
        for spec in routed.compile_specs(capability, dtype, config):
            specs.setdefault(spec.kernel, spec)
    return list(specs.values())


def _marks(arch: str, dtype: str, index: int) -> tuple:
    """`exhaustive` for all but the first spec of each kernel (one design each: only sizes differ)."""
    spec = _specs(arch, dtype)[index]
    first = next(s for s in _specs(arch, "float16") if s.fn is spec.fn)
    return (
        ()
        if spec is first or (dtype == "float16" and spec.kernel == first.kernel)
        else (pytest.mark.exhaustive,)
    )


CASES = [
    pytest.param(
        arch, dtype, i, id=f"{arch}-{dtype}-{spec.kernel.replace(' ', '-')}", marks=_marks(arch, dtype, i)
    )
    for arch in ("sm_90a", "sm_100a")
    for dtype in ("float16", "bfloat16")
    for i, spec in enumerate(_specs(arch, dtype))
]


@functools.cache
def _report(arch: str, dtype: str, index: int):
    spec = _specs(arch, dtype)[index]
    return spec, gs_inspect.inspect_spec(spec, arch)


@pytest.mark.parametrize(("arch", "dtype", "index"), CASES)
def test_routed_machine_code(arch, dtype, index):
    spec, r = _report(arch, dtype, index)
    assert_streams_into_registers(spec, r)


def test_both_kernels_are_compiled_at_every_surveyed_width():
    labels = {s.kernel.split(" ")[0] + " " + s.kernel.split(" ")[1] for s in _specs("sm_90a", "bfloat16")}
    for kernel in ("routed_gate_up_kernel", "routed_down_kernel"):
        for K in (768, 2048, 4096, 7168, 14336, routed.max_k()):
            assert f"{kernel} K={K}" in labels
