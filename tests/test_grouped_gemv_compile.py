"""The grouped gemv kernel (kernels/grouped_gemv.py) without a GPU: it compiles for sm_90a and
sm_100a in fp16 and bf16 at the surveyed models' K and the deepest one chunk takes, for the most
experts, and its SASS is what the docstring claims: 16-byte loads straight into registers, CUDA-core
FMAs, no MMA, no TMA, no shared-memory ring, no spills. The triton-3.9 pass compiles the first spec
of each architecture (one design: only K differs)."""

from __future__ import annotations

import functools

import pytest

from gluon_survey import registry
from gluon_survey.driver import inspect as gs_inspect
from gluon_survey.kernels import gemv
from gluon_survey.kernels import grouped_gemv as gv
from kernel_reports import assert_streams_into_registers

pytestmark = pytest.mark.compile


@functools.cache
def _specs(arch: str, dtype: str):
    return gv.compile_specs(gs_inspect.parse_arch(arch)[1], dtype)


CASES = [
    pytest.param(
        arch,
        dtype,
        i,
        id=f"{arch}-{dtype}-{spec.kernel.replace(' ', '-')}",
        marks=() if (i, dtype) == (0, "float16") else (pytest.mark.exhaustive,),
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
def test_grouped_gemv_machine_code(arch, dtype, index):
    spec, r = _report(arch, dtype, index)
    assert_streams_into_registers(spec, r)


def test_specs_cover_the_surveyed_widths_and_the_deepest_chunk_only_in_16_bit():
    labels = [s.kernel for s in _specs("sm_90a", "bfloat16")]
    for K in (768, 2048, 2880, 4096, 14336, gemv.one_chunk_max_k(2)):
        assert any(label.startswith(f"grouped_gemv_kernel K={K} ROWS=4 ") for label in labels), labels
    assert gv.compile_specs((9, 0), "float8_e4m3fn") == [] and gv.compile_specs((8, 0), "float16") == []
    assert registry.get("grouped-gemv").provider((9, 0)) is gv
