"""The mixture-of-experts kernels that stream weights on the CUDA cores, without a GPU: the routed
decode kernels (kernels/routed.py) and the grouped one-token kernel (kernels/grouped_gemv.py).
Each compiles for sm_90a and sm_100a in fp16 and bf16 at the surveyed models' H and I (the routed
ones with one row a program and with the most rows each program's warps hold; the grouped one for
the most experts), and their SASS is what the docstrings claim: 16-byte loads straight into
registers, CUDA-core FMAs, no MMA, no TMA, no shared-memory ring, no spills. The triton-3.9 pass
compiles the first spec of each kernel and architecture."""

from __future__ import annotations

import functools

import pytest

from gluon_survey import registry
from gluon_survey.driver import inspect as gs_inspect
from gluon_survey.kernels import gemv, routed
from gluon_survey.kernels import grouped_gemv as gv
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
    return list(specs.values()) + gv.compile_specs(capability, dtype)


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
def test_streaming_machine_code(arch, dtype, index):
    spec, r = _report(arch, dtype, index)
    assert_streams_into_registers(spec, r)


def test_both_kernels_are_compiled_at_every_surveyed_width():
    labels = {s.kernel.split(" ")[0] + " " + s.kernel.split(" ")[1] for s in _specs("sm_90a", "bfloat16")}
    for kernel in ("routed_gate_up_kernel", "routed_down_kernel"):
        for K in (768, 2048, 4096, 7168, 14336, routed.max_k()):
            assert f"{kernel} K={K}" in labels


def test_the_grouped_kernel_is_compiled_at_every_surveyed_width_in_16_bit_only():
    labels = [s.kernel for s in _specs("sm_90a", "bfloat16")]
    for K in (768, 2048, 2880, 4096, 14336, gemv.one_chunk_max_k(2)):
        assert any(label.startswith(f"grouped_gemv_kernel K={K} ROWS=4 ") for label in labels), labels
    assert gv.compile_specs((9, 0), "float8_e4m3fn") == [] and gv.compile_specs((8, 0), "float16") == []
    assert registry.get("grouped-gemv").provider((9, 0)) is gv
