"""The shape-aware default: `choice.choose` reads a table of measured entries (nearest M in log
scale within a factor of 4, same N, K, dtype and layout) and falls back to the documented rule;
`auto` prepares the chosen mode's launch with the chosen config; `tune` narrows candidates by M."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gluon_survey import api, auto, choice
from gluon_survey.driver import tune
from gluon_survey.kernels import slab, splitk, swapab, warpspec
from gluon_survey.launch import Target
from recording import Recorder

H100 = "NVIDIA H100 80GB HBM3"


def _entry(M, mode, config, ms, cublas_ms, N=4096, K=14336, dtype="bf16", layout="t"):
    return {
        "M": M, "N": N, "K": K, "dtype": dtype, "b_layout": layout, "mode": mode, "config": config,
        "ms": ms, "cublas_ms": cublas_ms, "candidates": {},
    }  # fmt: skip


@pytest.fixture
def table(tmp_path, monkeypatch):
    label = next(iter(swapab.candidates((9, 0))))
    entries = [
        _entry(1, "swapab", label, 0.040, 0.044),
        _entry(16, "swapab", label, 0.041, 0.045),
        _entry(128, "splitk", next(iter(splitk.candidates((9, 0)))), 0.050, 0.052),
        _entry(8192, "torch", None, 3.0, 3.0),
    ]
    (tmp_path / "h100.json").write_text(json.dumps({"name": "h100", "match": "H100", "entries": entries}))
    monkeypatch.setattr(choice, "TABLES", tmp_path)
    choice._tables.cache_clear()
    yield entries
    choice._tables.cache_clear()


def test_a_measured_shape_gets_its_measured_choice(table):
    c = choice.choose(16, 4096, 14336, "bf16", "t", (9, 0), H100)
    assert (c.mode, c.config) == ("swapab", table[1]["config"])
    assert "measured at M=16" in c.why and "1.10x cuBLAS" in c.why and "M 5..45" in c.why


def test_nearby_m_shares_the_bucket_far_m_does_not(table):
    assert choice.choose(40, 4096, 14336, "bf16", "t", (9, 0), H100).mode == "swapab"  # nearer 16 than 128
    assert choice.choose(100, 4096, 14336, "bf16", "t", (9, 0), H100).mode == "splitk"
    assert choice.choose(9000, 4096, 14336, "bf16", "t", (9, 0), H100).mode == "torch"
    far = choice.choose(2048, 4096, 14336, "bf16", "t", (9, 0), H100)  # 16x from 128 and 4x from 8192
    assert far.mode == "torch" and "M >= 1025" in far.why


def test_other_shapes_dtypes_layouts_and_gpus_fall_back_to_the_rule(table):
    for args in [
        (16, 4096, 4096, "bf16", "t"),
        (16, 4096, 14336, "fp16", "t"),
        (16, 4096, 14336, "bf16", "row"),
    ]:
        c = choice.choose(*args, (9, 0), H100)
        assert c == choice.Choice("slab", None, c.why) and "has no entry near it" in c.why
    c = choice.choose(32, 4096, 14336, "bf16", "t", (9, 0), "NVIDIA H200")
    assert c.mode == "torch" and "no table for NVIDIA H200" in c.why
    assert choice.choose(1, 4096, 4096, "bf16", "t", (9, 0), H100).mode == "gemv"
    assert choice.choose(1, 4096, 4096, "bf16", "row", (9, 0), H100).mode == "slab"  # gemv is K-major only


@pytest.mark.parametrize(
    ("M", "capability", "mode"),
    [(1, (9, 0), "gemv"), (1, (10, 0), "gemv"), (2, (9, 0), "slab"), (16, (10, 0), "slab"),
     (17, (9, 0), "torch"), (64, (9, 0), "torch"), (256, (10, 0), "torch"), (2048, (9, 0), "torch"),
     (2049, (9, 0), "warpspec"), (8192, (10, 0), "warpspec"), (1, (8, 0), "torch"),
     (16, (8, 0), "torch"), (16, (12, 0), "torch")],
)  # fmt: skip
def test_the_rule(M, capability, mode):
    """fp16/bf16 without a table entry: gemv for one token (of a K-major weight: a row-major one
    takes slab), slab to 16, cuBLAS to 2048, warpspec."""
    for dtype in ("fp16", "bf16"):
        c = choice.rule(M, capability, dtype)
        assert (c.mode, c.config) == (mode, None)
        row = choice.rule(M, capability, dtype, layout="row")
        assert row.mode == ("slab" if mode == "gemv" else mode)


@pytest.mark.parametrize(
    ("M", "N", "K", "dtype", "mode", "tokens"),
    [(1, 57344, 28672, "fp8-row", "swapab", 16), (16, 28672, 4096, "fp8-row", "swapab", 16),
     (17, 28672, 4096, "fp8-row", "swapab", 32), (64, 4096, 4096, "fp8-row", "swapab", 64),
     (65, 4096, 4096, "fp8-row", "torch", None), (1, 57344, 28672, "fp8", "swapab", 16),
     (16, 4096, 4096, "fp8", "swapab", 16), (17, 4096, 4096, "fp8", "torch", None),
     (2048, 8192, 4096, "fp8-row", "torch", None), (2049, 8192, 4096, "fp8", "warpspec", None),
     (2049, 8192, 4096, "fp8-row", "warpspec", None), (1, 4096, 16384, "fp8", "gemv", None),
     (1, 57344, 8192, "fp8-row", "gemv", None), (2, 4096, 4096, "fp8-row", "swapab", 16),
     (64, 28672, 4096, "fp8-row", "swapab", 64), (33, 10240, 8192, "fp8-row", "swapab", 64),
     (64, 57344, 8192, "fp8-row", "swapab", 64)],
)  # fmt: skip
def test_the_fp8_rule(M, N, K, dtype, mode, tokens):
    """fp8 has no table: the rule, the same on a GPU with a table. One token with K <= 16384 runs
    gemv; otherwise swapab runs its whole-K tile of the narrowest token width that holds M, named
    by a label its fp8 candidates have, on the ring two programs share where the weight has more
    64-row tiles than the GPU has SMs (132 here) but at most four times as many, or at 64 tokens
    there on the 128-row tile."""
    c = choice.rule(M, (9, 0), dtype, N, 132, K)
    assert c.mode == mode
    chosen = choice.choose(M, N, K, dtype, "t", (9, 0), "NVIDIA H100 80GB HBM3", 132)
    assert (chosen.mode, chosen.config) == (c.mode, c.config)
    assert choice.rule(M, (8, 0), dtype, N, 132).mode == "torch"
    if tokens:
        cfg = swapab.candidates((9, 0), fp8=True)[c.config]
        assert (1, tokens, 1) == (cfg.SPLIT_K, cfg.BLOCK_N, cfg.ELEM_BYTES)
        ring = "one"
        if 64 * 132 < N <= 4 * 64 * 132:
            ring = "tall" if tokens == 64 else "shared"
        assert cfg == swapab.whole_k((9, 0), M, fp8=True, ring=ring)
        assert (128 if ring == "tall" else 64) == cfg.BLOCK_M
        assert 2 * swapab.RINGS[ring][1][tokens][0] == cfg.BLOCK_K
        # With the SM count unknown: the one-program-per-SM ring.
        unknown = swapab.candidates((9, 0), fp8=True)[choice.rule(M, (9, 0), dtype, N, 0, K).config]
        assert 2 * swapab.WHOLE_K[tokens][0] == unknown.BLOCK_K
    else:
        assert c.config is None


@pytest.mark.parametrize(
    ("N", "sm_count", "shared"),
    [(8192, 132, False), (8448, 132, False), (8449, 132, True), (10240, 132, True), (10240, 160, False),
     (28672, 132, True), (33792, 132, True), (33856, 132, False), (57344, 132, False)],
)  # fmt: skip
def test_the_fp8_rule_shares_sms_between_one_and_four_waves_of_tiles(N, sm_count, shared):
    cfg = swapab.candidates((9, 0), fp8=True)[choice.rule(1, (9, 0), "fp8-row", N, sm_count).config]
    assert cfg == swapab.whole_k((9, 0), 1, fp8=True, ring="shared" if shared else "one")
    # at 64 tokens the same weights take the 128-row tile instead of the shared ring
    cfg = swapab.candidates((9, 0), fp8=True)[choice.rule(64, (9, 0), "fp8-row", N, sm_count).config]
    assert cfg == swapab.whole_k((9, 0), 64, fp8=True, ring="tall" if shared else "one")


def test_the_committed_tables_name_real_candidates():
    """Every entry of every committed table names a mode and a config its provider still has."""
    from gluon_survey import registry

    choice._tables.cache_clear()
    for table in choice._tables():
        for e in table["entries"]:
            provider = registry.get(e["mode"]).provider((9, 0))
            assert e["config"] is None or e["config"] in provider.candidates((9, 0)), (table["name"], e)
            assert (
                e["ms"] <= e["cublas_ms"] * 1.0001
                or e["mode"] == "torch"
                or e["ms"] == min(v for v in e["candidates"].values() if isinstance(v, float))
            )


def test_tune_narrows_candidates_by_m():
    tiles = {
        M: [
            (c.BLOCK_M, c.BLOCK_N, c.SPLIT_K, c.BLOCK_K)
            for c in tune.candidates_for("swapab", M, (9, 0)).values()
        ]
        for M in (1, 16, 17, 64)
    }
    # the split tile (SPLIT_K chosen per shape: 0) and the whole-K ones (SPLIT_K 1) of each width:
    # on one program's ring per SM, on rings of half the K step that two programs share, and at 64
    # tokens the 128-row tile
    assert tiles == {
        1: [(128, 16, 0, 64), (64, 16, 1, 256), (64, 16, 1, 128)],
        16: [(128, 16, 0, 64), (64, 16, 1, 256), (64, 16, 1, 128)],
        17: [(128, 32, 0, 64), (64, 32, 1, 256), (64, 32, 1, 128)],
        64: [(128, 64, 0, 64), (64, 64, 1, 128), (64, 64, 1, 64), (128, 64, 1, 128)],
    }
    assert swapab.whole_k((9, 0), 64, ring="tall").blocks_per_sm() == 1
    for cfg in (swapab.whole_k((9, 0), M, ring="shared") for M in (1, 17, 64)):
        assert (
            cfg.blocks_per_sm() == 2
            and dataclasses.replace(cfg, BLOCK_K=2 * cfg.BLOCK_K).blocks_per_sm() == 1
        )
    assert [c.BLOCK_N for c in tune.candidates_for("swapab", 128, (9, 0)).values()] == [128]
    assert tune.candidates_for("swapab", 1024, (9, 0)) == {}
    assert tune.candidates_for("splitk", 1024, (9, 0)) == {}
    assert set(tune.candidates_for("warpspec", 16, (9, 0))) == set(warpspec.candidates((9, 0)))
    assert tune.candidates_for("torch", 16, (9, 0)) == {"cuBLAS": None}
    assert set(tune.candidates_for("slab", 64, (9, 0))) == set(slab.candidates((9, 0)))
    assert tune.candidates_for("slab", 65, (9, 0)) == {}
    assert "slab" in tune.MODES


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_auto_prepares_the_chosen_mode_with_the_chosen_config(table, monkeypatch):
    log: list = []
    target = Target((9, 0), 132, H100)
    monkeypatch.setattr(api, "target_of", lambda device: target)
    monkeypatch.setattr(swapab, "swapab_kernel", Recorder("swapab_kernel", log))
    with FakeTensorMode():
        a = torch.empty(16, 14336, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(4096, 14336, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(16, 4096, dtype=torch.bfloat16, device="cuda")
        launch = api.prepare("auto", a, w.t(), out)
        launch.fn()
    assert launch.config["mode"] == "swapab" and "measured at M=16" in launch.config["why"]
    assert launch.config["BLOCK_M"] == 16 and launch.config["swap_ab"] is True
    (launched,) = log
    ((grid,), kwargs) = launched.grid, launched.kwargs
    tiles = 4096 // 128
    slots = 132 * swapab.CONFIGS[9].blocks_per_sm()
    assert grid == tiles * kwargs["SPLIT_K"] and kwargs["SPLIT_K"] == splitk.split_for(tiles, 224, slots, 4)
    assert kwargs["W_KMAJOR"] is True


def test_split_for_fills_one_wave_without_empty_slices():
    assert splitk.split_for(tiles=32, k_steps=224, slots=132, min_steps=4) == 4  # 128 programs
    assert splitk.split_for(tiles=32, k_steps=224, slots=396, min_steps=4) == 12  # 3 per SM: 384
    assert splitk.split_for(tiles=448, k_steps=128, slots=132, min_steps=4) == 1
    assert splitk.split_for(tiles=1, k_steps=3, slots=132, min_steps=4) == 1
    for tiles, k_steps in [(1, 1000), (7, 13), (32, 64), (5, 17), (48, 64)]:
        split = splitk.split_for(tiles, k_steps, 132, 4)
        per = -(-k_steps // split)
        assert (split - 1) * per < k_steps and per >= min(4, k_steps), (tiles, k_steps, split)
        assert tiles * split <= 132, "never a partial second wave"


def test_programs_per_sm_follow_shared_memory():
    assert swapab.CONFIGS[9].blocks_per_sm() == 1  # 8 stages of 18 KB: one program per SM
    assert dataclasses.replace(swapab.CONFIGS[9], STAGES=4).blocks_per_sm() == 3  # 4 stages of 18 KB
    assert splitk.CONFIGS[9].blocks_per_sm() == 2  # 4 stages of 24 KB
    from gluon_survey.kernels import persistent

    assert persistent.CONFIGS[9].blocks_per_sm() == 1


def test_swapab_reports_its_tile_in_cs_terms():
    cfg = dataclasses.replace(swapab.CONFIGS[9], BLOCK_N=32)
    assert (cfg.table()["BLOCK_M"], cfg.table()["BLOCK_N"]) == (32, 128)
    assert cfg.label.startswith("W128xT32x64")


def test_auto_is_the_default_on_gluon_gpus(monkeypatch):
    monkeypatch.setattr(api, "target_of", lambda device: Target((9, 0), 132, H100))
    assert api.default_mode(torch.empty(2, 2)) == "auto"
    monkeypatch.setattr(api, "target_of", lambda device: Target((8, 0), 108, "NVIDIA A100"))
    assert api.default_mode(torch.empty(2, 2)) in ("auto", "torch")
    assert auto.unsupported_reason((8, 0)) is None


def _keyed(M, mode, dtype="bf16"):
    return {"M": M, "N": 4096, "K": 4096, "dtype": dtype, "b_layout": "t", "mode": mode, "ms": 1.0}


def test_tune_update_replaces_same_keys_and_keeps_the_rest():
    table = {
        "name": "h100",
        "match": "H100",
        "env": {"date": "first"},
        "entries": [_keyed(16, "torch"), _keyed(128, "swapab"), _keyed(128, "torch", "fp16")],
    }
    update = {
        "env": {"date": "second"},
        "settings": {"min_ms": 1},
        "entries": [_keyed(128, "torch"), _keyed(64, "splitk")],
    }
    merged = tune.merge(table, update)
    assert [(e["M"], e["dtype"], e["mode"], e.get("update")) for e in merged["entries"]] == [
        (16, "bf16", "torch", None),
        (128, "bf16", "torch", 1),  # replaced in place
        (128, "fp16", "torch", None),
        (64, "bf16", "splitk", 1),  # added
    ]
    assert merged["env"] == {"date": "first"}
    assert merged["updates"] == [
        {
            "env": {"date": "second"},
            "settings": {"min_ms": 1},
            "entries": [[128, 4096, 4096, "bf16", "t"], [64, 4096, 4096, "bf16", "t"]],
        }
    ]
    assert table["entries"][1]["mode"] == "swapab"  # the input is not modified
    again = tune.merge(merged, {"env": {}, "settings": {}, "entries": [_keyed(64, "torch")]})
    assert [e.get("update") for e in again["entries"]] == [None, 1, None, 2]
