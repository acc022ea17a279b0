"""A transposed A read in place, without a GPU: the Hopper rungs that `gluon_survey.matmul` lets
read an A in layout "t" (the view x.t() of a row-major [K, M] matrix, with
`api.TRANSPOSED_A_IN_PLACE` on) compile for sm_90a with that A: one spec per kernel design (the
rung's default config, each warpspec design) and B layout, compiled for fp16 and bf16 with triton
3.6 and, the fp16 one of each design, with 3.9 (`make test`: tests/kernel_reports.py). Each is a
wgmma kernel that reads A transposed from shared memory (`.tnspA` on every HGMMA) with no spills
and the shared memory of its row-major twin, which reads A as it is (no `.tnspA`).

The machine-code checks every rung spec gets (HGMMA, TMA, no spills, the config's shared
memory) run on these specs too, in tests/test_hopper_compile.py. That a row-major A compiles to
the code it had before the A layout existed is what `gluon-survey inspect` shows (registers,
spills, shared memory and SASS opcode counts, unchanged)."""

from __future__ import annotations

import functools

import pytest

from gluon_survey import registry
from gluon_survey.driver import inspect as gs_inspect
from kernel_reports import ARCHS, compiled_report, config_marks, design, specs

pytestmark = pytest.mark.compile

IN_PLACE = ("Blocked", "Pipelined", "persistent", "warpspec", "splitk")  # read a transposed A
DESIGNS = {"warpspec": 2}  # ping-pong and cooperative; one design each elsewhere
ARCH = "sm_90a"


def _transposed(mode: str, dtype: str = "float16", arch: str = ARCH) -> list[int]:
    """Indexes of a mode's specs that read A in layout "t"."""
    return [i for i, spec in enumerate(specs(mode, arch, dtype)) if " A=t " in spec.kernel]


def _twin(mode: str, dtype: str, index: int) -> int:
    """The index of the row-major-A spec of the same config and B layout."""
    label = specs(mode, ARCH, dtype)[index].kernel.replace(" A=t ", " ")
    return next(i for i, spec in enumerate(specs(mode, ARCH, dtype)) if spec.kernel == label)


@functools.cache
def _hgmma_lines(mode: str, dtype: str, index: int) -> tuple[str, ...]:
    """The HGMMA instructions of a spec's SASS (compiled again: Triton's cache has it)."""
    sass = gs_inspect.disassemble(gs_inspect.compile_spec(specs(mode, ARCH, dtype)[index], ARCH).cubin)
    return tuple(line for line in sass.splitlines() if "HGMMA" in line)


def test_each_rung_has_one_transposed_a_spec_per_design_and_b_layout():
    for mode in IN_PLACE:
        found = [specs(mode, ARCH)[i] for i in _transposed(mode)]
        assert len({design(spec, ARCH) for spec in found}) == len(found), "one spec per design"
        assert len(found) == 2 * DESIGNS.get(mode, 1), [s.kernel for s in found]
        assert sorted(s.kernel.rsplit(" B=", 1)[1] for s in found) == sorted(
            ["row", "t"] * DESIGNS.get(mode, 1)
        )
        for spec in found:
            assert spec.constexprs["A_KMAJOR"] is False
            block = f"[{spec.config.BLOCK_K}, {spec.config.BLOCK_M}]"  # [BK, BM] boxes of the [K, M] matrix
            assert block in spec.signature["a_desc"], (spec.kernel, spec.signature["a_desc"])
        row = [s for s in specs(mode, ARCH) if " A=t " not in s.kernel]
        assert row and all(s.constexprs["A_KMAJOR"] is True for s in row)
    # none for fp8 (wgmma reads an fp8 A K-major), none on Blackwell, none for the few-token modes
    gluon = [m.name for m in registry.MODES if m.kind == "gluon" and not m.grouped]
    for mode in gluon:
        assert not _transposed(mode, "float8_e4m3fn")
        assert not _transposed(mode, "float16", "sm_100a")
        assert bool(_transposed(mode)) == (mode in IN_PLACE), mode
    assert "sm_100a" in ARCHS


CASES = [
    pytest.param(
        mode, dtype, index, id=f"{mode}-{index}-{dtype}", marks=config_marks(mode, ARCH, dtype, index)
    )
    for mode in IN_PLACE
    for dtype in ("float16", "bfloat16")
    for index in _transposed(mode, dtype)
]


@pytest.mark.parametrize(("mode", "dtype", "index"), CASES)
def test_a_transposed_a_compiles_to_wgmma_reading_it_transposed(mode, dtype, index):
    spec, r = compiled_report(mode, ARCH, dtype, index)
    assert r.error is None, r.error
    assert r.count("HGMMA") > 0 and r.count("UTMALDG") > 0
    assert r.spill_bytes == 0 and r.stack_bytes == 0, f"{spec.kernel}: {r.spill_bytes} B of spills"
    assert r.count("LDL") == 0 and r.count("STL") == 0, "local-memory traffic (spills)"
    twin_spec, twin = compiled_report(mode, ARCH, dtype, _twin(mode, dtype, index))
    assert r.shared_bytes == twin.shared_bytes, (spec.kernel, r.shared_bytes, twin.shared_bytes)
    lines = _hgmma_lines(mode, dtype, index)
    assert lines and all(".tnspA" in line for line in lines), lines[:4]
    row_lines = _hgmma_lines(mode, dtype, _twin(mode, dtype, index))
    assert row_lines and not any(".tnspA" in line for line in row_lines), (twin_spec.kernel, row_lines[:4])
