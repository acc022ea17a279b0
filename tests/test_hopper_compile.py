"""Every Hopper rung compiles for sm_90a on a machine with no GPU (with triton 3.6.0 and, through
`make test`, 3.9.0), and its machine code is what the rung claims: wgmma (HGMMA), TMA loads and
stores (UTMALDG/UTMASTG), no local-memory spills, shared memory within the 227 KB a block may
have, and, for warpspec, the producer giving registers to the MMA warpgroups (USETMAXREG)."""

from __future__ import annotations

import pytest

from factories import INSPECT_JSON_KEYS
from gluon_survey.driver import inspect as gs_inspect
from gluon_survey import registry

pytestmark = pytest.mark.compile

RUNGS = [m for m in registry.MODES if m.kind == "gluon"]
SPECS = [
    pytest.param(spec, id=spec.kernel.replace(" ", "-"))
    for mode in RUNGS
    for dtype in ("float16", "bfloat16")
    for spec in mode.load().compile_specs((9, 0), dtype)
]


@pytest.fixture(scope="module")
def reports():
    cache: dict[int, gs_inspect.KernelReport] = {}

    def get(spec):
        if id(spec) not in cache:
            cache[id(spec)] = gs_inspect.inspect_spec(spec, "sm_90a")
        return cache[id(spec)]

    return get


def test_every_rung_has_hopper_specs_for_both_b_layouts():
    for mode in RUNGS:
        labels = [s.kernel for s in mode.load().compile_specs((9, 0), "float16")]
        assert any(label.endswith("Brow") for label in labels), (mode.name, labels)
        assert any(label.endswith("Bt") for label in labels), (mode.name, labels)


@pytest.mark.parametrize("spec", SPECS)
def test_rung_machine_code(spec, reports):
    r = reports(spec)
    assert r.error is None, r.error
    assert r.count("HGMMA") > 0, f"no wgmma in {spec.kernel}: {r.sass}"
    assert r.count("HMMA") == 0 and r.count("UTCHMMA") == 0
    assert r.count("UTMALDG") > 0 and r.count("UTMASTG") > 0, "TMA loads and stores expected"
    assert r.count("LDL") == 0 and r.count("STL") == 0, "local-memory traffic (spills)"
    assert r.spill_bytes == 0 and r.stack_bytes == 0
    assert 0 < r.shared_bytes <= 227 * 1024


@pytest.mark.parametrize("spec", [p for p in SPECS if p.values[0].mode == "warpspec"])
def test_warpspec_reallocates_registers(spec, reports):
    r = reports(spec)
    assert r.count("USETMAXREG") > 0, r.sass
    assert r.setmaxnreg.get("dec"), "the producer warpgroup must give registers back"
    assert max(r.setmaxnreg.get("inc", [0])) >= 232, "the MMA warpgroups must grow"


def test_inspect_json_lists_every_rung(capsys):
    import json

    rc = gs_inspect.main(["Blocked,warpspec", "--arch", "sm_90a", "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert {r["mode"] for r in rows} == {"Blocked", "warpspec"}
    for row in rows:
        assert row.keys() >= INSPECT_JSON_KEYS


def test_pingpong_consumers_multiply_three_row_boxes(reports):
    """The 192-row ping-pong tile is three 64-row accumulators per consumer: per K step each of the
    two consumers issues one m64 wgmma per box and per 16 of BLOCK_K (128x128 tiles would be 2)."""
    from gluon_survey.kernels import warpspec

    cfg = warpspec.PINGPONG
    assert (cfg.BOXES, cfg.BLOCK_M, cfg.tile_m) == (3, 64, 192)
    spec = next(s for s in warpspec.compile_specs((9, 0)) if "ping-pong" in s.kernel)
    assert reports(spec).count("HGMMA") == 2 * cfg.BOXES * cfg.BLOCK_K // 16


def test_warpspec_config_rejects_tiles_the_consumer_cannot_hold():
    from dataclasses import replace

    from gluon_survey.kernels import warpspec

    with pytest.raises(ValueError, match="BOXES is 1 to 3"):
        replace(warpspec.PINGPONG, BOXES=4)
    with pytest.raises(ValueError, match="SPLIT needs two"):
        replace(warpspec.PINGPONG, SPLIT=True)
