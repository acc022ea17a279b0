"""The grouped kernel (kernels/grouped.py) compiles for sm_90a on a machine with no GPU, and its
machine code is what its docstring claims: wgmma (HGMMA, one per 16 of BLOCK_K per K step), TMA
loads (UTMALDG) and no TMA store (the epilogue is a masked register store, STG), no local-memory
spills, and the shared memory of its ring (plus the epilogue's layout-conversion scratch).

It is the registry's `grouped` mode, which the dense rungs' compile tests leave out (a grouped
mode's kernel is no rung of the dense ladder), so its specs are compiled here rather than through
tests/kernel_reports.py's `compiled_report`; the same rule holds: the triton-3.9 pass
(`-m "compile and not exhaustive"`) compiles the first spec of each design (`design`), and the
others are marked `exhaustive`."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from gluon_survey.driver import inspect as gs_inspect
from gluon_survey.kernels import common
from gluon_survey.kernels import grouped as gk
from kernel_reports import design

pytestmark = pytest.mark.compile

ARCH = "sm_90a"
DTYPES = ("float16", "bfloat16")  # the first of a design is its representative


@functools.cache
def compiled(dtype: str, index: int):
    spec = gk.compile_specs((9, 0), dtype)[index]
    return spec, gs_inspect.inspect_spec(spec, ARCH)


def _params():
    seen, params = set(), []
    for dtype in DTYPES:
        for index, spec in enumerate(gk.compile_specs((9, 0), dtype)):
            key = design(spec, ARCH)
            marks = () if key not in seen else (pytest.mark.exhaustive,)
            seen.add(key)
            params.append(
                pytest.param(dtype, index, id=f"{spec.kernel.replace(' ', '-')}-{dtype}", marks=marks)
            )
    return params


PARAMS = _params()


def test_one_spec_per_dtype_and_one_compiled_by_the_triton_39_pass():
    assert len(PARAMS) == len(DTYPES)
    assert sum(not p.marks for p in PARAMS) == 1


@pytest.mark.parametrize(("dtype", "index"), PARAMS)
def test_grouped_machine_code(dtype, index):
    spec, r = compiled(dtype, index)
    assert r.error is None, r.error
    cfg = spec.config
    assert r.count("HGMMA") == cfg.BLOCK_K // 16, f"one wgmma per 16 of K per K step: {r.sass}"
    assert r.count("HMMA") == 0 and r.count("UTCHMMA") == 0
    assert r.count("UTMALDG") > 0, "TMA loads expected"
    assert r.count("UTMASTG") == 0 and r.count("STG") > 0, "a masked register store, not a TMA store"
    assert r.count("LDL") == 0 and r.count("STL") == 0, "local-memory traffic (spills)"
    assert r.spill_bytes == 0 and r.stack_bytes == 0
    assert cfg.smem_bytes() <= r.shared_bytes <= common.SMEM_LIMIT


def test_sizes_of_one_compile_as_constexprs():
    """Triton specializes an int argument equal to 1 as a constexpr: a launch with S = 1 (one
    token), N = 1 or E = 1 traces the kernel with constants in their place."""
    spec = gk.compile_specs((9, 0), "bfloat16")[0]
    ones = {"S": 1, "N": 1, "E": 1}
    spec = dataclasses.replace(
        spec,
        signature=spec.signature | dict.fromkeys(ones, "constexpr"),
        constexprs=spec.constexprs | ones,
    )
    r = gs_inspect.inspect_spec(spec, ARCH)
    assert r.error is None, r.error
    assert r.count("HGMMA") > 0 and r.spill_bytes == 0
