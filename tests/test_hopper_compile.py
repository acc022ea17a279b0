"""Every Hopper rung compiles for sm_90a on a machine with no GPU (with triton 3.6.0, every config;
through `make test`, with 3.9.0, one config per kernel design: tests/kernel_reports.py), and its
machine code is what the rung claims: wgmma (HGMMA), TMA loads and stores (UTMALDG/UTMASTG), no
local-memory spills, the shared memory its config computes, and, for warpspec, the producer giving
registers to the MMA warpgroups (USETMAXREG). (slab multiplies with mma.sync and gemv with FMAs by
design: their machine code is tests/test_slab_compile.py's and tests/test_gemv_compile.py's.)"""

from __future__ import annotations

from dataclasses import replace

import pytest

from factories import INSPECT_JSON_KEYS
from gluon_survey import registry
from gluon_survey.driver import inspect as gs_inspect
from gluon_survey.kernels import common, persistent, warpspec
from kernel_reports import compiled_report, config_marks

pytestmark = pytest.mark.compile

RUNGS = [m for m in registry.MODES if m.kind == "gluon" and not m.grouped]  # grouped: its own file
SPECS = [
    pytest.param(
        mode.name,
        dtype,
        i,
        id=f"{spec.kernel.replace(' ', '-')}-{dtype}",
        marks=config_marks(mode.name, "sm_90a", dtype, i),
    )
    for mode in RUNGS
    for dtype in ("float16", "bfloat16")
    for i, spec in enumerate(mode.provider((9, 0)).compile_specs((9, 0), dtype))
]


def test_every_rung_has_hopper_specs_for_both_b_layouts():
    for mode in RUNGS:
        labels = [s.kernel for s in mode.provider((9, 0)).compile_specs((9, 0), "float16")]
        assert any(label.endswith("B=row") for label in labels), (mode.name, labels)
        assert any(label.endswith("B=t") for label in labels), (mode.name, labels)


# slab multiplies with mma.sync (HMMA) and gemv with FMAs, by design: their own tests check them.
NOT_WGMMA = ("slab", "gemv")


@pytest.mark.parametrize(("mode", "dtype", "index"), [p for p in SPECS if p.values[0] not in NOT_WGMMA])
def test_rung_machine_code(mode, dtype, index):
    spec, r = compiled_report(mode, "sm_90a", dtype, index)
    assert r.error is None, r.error
    assert r.count("HGMMA") > 0, f"no wgmma in {spec.kernel}: {r.sass}"
    assert r.count("HMMA") == 0 and r.count("UTCHMMA") == 0
    assert r.count("UTMALDG") > 0 and r.count("UTMASTG") > 0, "TMA loads and stores expected"
    assert r.count("LDL") == 0 and r.count("STL") == 0, "local-memory traffic (spills)"
    assert r.spill_bytes == 0 and r.stack_bytes == 0
    assert 0 < r.shared_bytes <= common.SMEM_LIMIT


@pytest.mark.parametrize(("mode", "dtype", "index"), [p for p in SPECS if p.values[0] != "gemv"])
def test_config_computes_the_compilers_shared_memory(mode, dtype, index):
    """GemmConfig.smem_bytes() is the compiled kernel's shared memory but for its mbarriers (8 B each)."""
    spec, r = compiled_report(mode, "sm_90a", dtype, index)
    barriers = r.shared_bytes - spec.config.smem_bytes()
    assert 0 <= barriers < 512, (spec.kernel, r.shared_bytes, spec.config.smem_bytes())


@pytest.mark.parametrize(("mode", "dtype", "index"), [p for p in SPECS if p.values[0] == "warpspec"])
def test_warpspec_reallocates_registers(mode, dtype, index):
    spec, r = compiled_report(mode, "sm_90a", dtype, index)
    assert r.count("USETMAXREG") > 0, r.sass
    assert r.setmaxnreg.get("dec"), "the producer warpgroup must give registers back"
    assert max(r.setmaxnreg.get("inc", [0])) >= spec.config.CONSUMER_REGS, "the MMA warpgroups must grow"


def test_inspect_json_lists_every_rung(capsys):
    import json

    rc = gs_inspect.main(["Blocked,warpspec", "--arch", "sm_90a", "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert {r["mode"] for r in rows} == {"Blocked", "warpspec"}
    for row in rows:
        assert row.keys() >= INSPECT_JSON_KEYS


def test_pingpong_consumers_multiply_three_row_boxes():
    """The 192-row ping-pong tile is three 64-row accumulators per consumer: per K step each of the
    two consumers issues one m64 wgmma per box and per 16 of BLOCK_K (128x128 tiles would be 2)."""
    cfg = warpspec.PINGPONG
    assert (cfg.BOXES, cfg.BLOCK_M, cfg.a_rows) == (3, 64, 192)
    index = next(i for i, s in enumerate(warpspec.compile_specs((9, 0))) if "ping-pong" in s.kernel)
    _, r = compiled_report("warpspec", "sm_90a", "float16", index)
    assert r.count("HGMMA") == 2 * cfg.BOXES * cfg.BLOCK_K // 16


def test_warpspec_chooses_its_design_by_k():
    assert warpspec.config_for((9, 0), warpspec.COOPERATIVE_FROM_K - 1) is warpspec.PINGPONG
    assert warpspec.config_for((9, 0), warpspec.COOPERATIVE_FROM_K) is warpspec.COOPERATIVE


def test_configs_reject_what_does_not_fit():
    with pytest.raises(ValueError, match="BOXES is 1 to 3"):
        replace(warpspec.PINGPONG, BOXES=4)
    with pytest.raises(ValueError, match="ping-pong"):
        replace(warpspec.PINGPONG, EPILOGUE="deferred")
    # 4 stages of 48 KB and a 64 KB C tile beside them: 256 KB, over the 227 KB a block may have.
    with pytest.raises(ValueError, match="shared memory"):
        replace(persistent.CONFIGS[9], STAGES=4)
    with pytest.raises(ValueError, match="EPILOGUE_N"):
        replace(persistent.CONFIGS[9], EPILOGUE_N=96)
    with pytest.raises(ValueError, match="EPILOGUE is one of"):
        replace(persistent.CONFIGS[9], EPILOGUE="whole")


def test_shared_memory_arithmetic():
    """The three epilogues: C after the ring (reusing its memory), sliced or deferred beside it."""
    blocked = common.GemmConfig(BLOCK_M=64, BLOCK_N=256, BLOCK_K=128, STAGES=1, num_warps=4)
    assert blocked.smem_bytes() == max((64 + 256) * 128 * 2, 64 * 256 * 2)
    assert persistent.CONFIGS[9].smem_bytes() == 3 * (128 + 256) * 64 * 2 + 4 * 128 * 64 * 2
    assert warpspec.PINGPONG.smem_bytes() == 5 * (192 + 128) * 64 * 2 + 2 * 64 * 64 * 2
    # fp8: the same bytes per stage with twice the K; C stays 16-bit.
    assert persistent.FP8_CONFIGS[9].smem_bytes() == 3 * (128 + 256) * 128 + 4 * 128 * 64 * 2
    one_byte = replace(persistent.CONFIGS[9], ELEM_BYTES=1)
    assert one_byte.smem_bytes() == 3 * (128 + 256) * 64 + 4 * 128 * 64 * 2
