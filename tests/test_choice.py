"""The shape-aware default: `choice.choose` reads a table of measured entries (same N, K, dtype
and layout): an entry's choice at a measured M; between two measured M a Gluon candidate only
where it beat cuBLAS by the margin at both; cuBLAS beyond them (no extrapolation); the documented
rule for weights without entries. `auto` prepares the chosen mode's launch with the chosen
config; `tune` narrows candidates by M and picks an entry's winner with the same margin."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gluon_survey import api, auto, choice, registry
from gluon_survey.driver import tune
from gluon_survey.kernels import persistent, slab, splitk, swapab, warpspec
from gluon_survey.launch import Target
from recording import Recorder

H100 = "NVIDIA H100 80GB HBM3"
CUBLAS = choice.CUBLAS
SWAPAB = f"swapab {next(iter(swapab.candidates((9, 0))))}"  # W128xT16x64 s8 w4 kauto
SLAB = f"slab {next(iter(slab.candidates((9, 0))))}"
SPLITK = f"splitk {next(iter(splitk.candidates((9, 0))))}"
PERSISTENT = f"persistent {next(iter(persistent.candidates((9, 0))))}"
WARPSPEC = f"warpspec {next(iter(warpspec.candidates((9, 0))))}"


def _entry(M, candidates, N=4096, K=14336, dtype="bf16", layout="t"):
    """An entry as tune writes it: `candidates` maps "mode label" to ms (cuBLAS under CUBLAS, a
    failed candidate to its message); the winner by tune's own rule."""
    best = tune.choose(candidates)
    mode, config = (best.partition(" ")[0], best.partition(" ")[2]) if best != CUBLAS else ("torch", None)
    return {
        "M": M, "N": N, "K": K, "dtype": dtype, "b_layout": layout, "mode": mode, "config": config,
        "ms": candidates[best], "cublas_ms": candidates[CUBLAS], "candidates": candidates,
    }  # fmt: skip


# One weight (4096 x 14336 bf16, K-major) measured at six M; each entry's ratios to cuBLAS:
# M = 4: slab 1.10x (winner), swapab 1.048x     M = 16: swapab 1.12x (winner), slab 1.07x
# M = 64: slab 1.17x (winner), persistent 1.13x  M = 128: splitk 1.20x (winner), persistent 1.11x, slab 0.91x
# M = 1024: warpspec 1.05x (winner), persistent 1.012x, splitk failed  M = 8192: cuBLAS, warpspec 0.993x
ENTRIES = [
    _entry(4, {SLAB: 0.040, SWAPAB: 0.042, CUBLAS: 0.044}),
    _entry(16, {SWAPAB: 0.041, SLAB: 0.043, CUBLAS: 0.046}),
    _entry(64, {SLAB: 0.060, PERSISTENT: 0.062, CUBLAS: 0.070}),
    _entry(128, {SPLITK: 0.050, PERSISTENT: 0.054, SLAB: 0.066, CUBLAS: 0.060}),
    _entry(1024, {WARPSPEC: 0.40, PERSISTENT: 0.415, SPLITK: "FAILED: rel_err", CUBLAS: 0.42}),
    _entry(8192, {WARPSPEC: 3.02, CUBLAS: 3.0}),
]


def _install(tmp_path, monkeypatch, entries, name="h100", match="H100"):
    (tmp_path / f"{name}.json").write_text(json.dumps({"name": name, "match": match, "entries": entries}))
    monkeypatch.setattr(choice, "TABLES", tmp_path)
    choice._tables.cache_clear()


@pytest.fixture
def table(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, ENTRIES)
    yield ENTRIES
    choice._tables.cache_clear()


def _choose(M, N=4096, K=14336, dtype="bf16", layout="t", gpu=H100):
    return choice.choose(M, N, K, dtype, layout, (9, 0), gpu)


def _key(c: choice.Choice) -> str:
    return CUBLAS if c.mode == "torch" else f"{c.mode} {c.config}"


def test_the_synthetic_entries_are_what_their_comments_say():
    assert [_key(choice.Choice(e["mode"], e["config"], "")) for e in ENTRIES] == [
        SLAB, SWAPAB, SLAB, SPLITK, WARPSPEC, CUBLAS,
    ]  # fmt: skip


def test_a_measured_m_gets_its_entry(table):
    c = _choose(16)
    assert (c.mode, c.config) == ("swapab", table[1]["config"])
    assert c.why == (
        f"table h100: measured at M=16: {SWAPAB} 41.0 us, 1.12x cuBLAS (46.0 us), GPU time not compared"
    )
    c = _choose(8192)
    assert (c.mode, c.config) == ("torch", None)
    assert c.why == (
        f"table h100: measured at M=8192: cuBLAS 3000.0 us; the fastest Gluon candidate, {WARPSPEC}, "
        "0.99x: not 3 % faster"
    )


@pytest.mark.parametrize(
    ("M", "key"),
    [(1, CUBLAS), (3, CUBLAS),  # below the smallest measured M
     (5, SLAB), (15, SLAB),  # both held at 4 and 16: slab's worse ratio 1.07x beats swapab's 1.048x
     (17, SLAB), (63, SLAB),  # slab held at 16 (not its winner) and 64
     (65, PERSISTENT), (127, PERSISTENT),  # neither neighbour's winner, but it held at both
     (129, CUBLAS), (1023, CUBLAS),  # 128 and 1024 are 8x apart: no candidate runs across the gap
     (1025, CUBLAS), (8191, CUBLAS),  # 8x apart again (and warpspec held at 1024 only)
     (8193, CUBLAS), (16384, CUBLAS), (1 << 20, CUBLAS)],  # beyond the largest measured M
)  # fmt: skip
def test_between_two_entries_a_candidate_runs_only_where_it_held_at_both(table, M, key):
    c = _choose(M)
    assert _key(c) == key
    if key != CUBLAS:  # what auto.prepare looks the config up with
        assert c.config in registry.get(c.mode).provider((9, 0)).candidates((9, 0))


def test_no_extrapolation_beyond_or_below_the_measured_m(table, tmp_path, monkeypatch):
    c = _choose(9000)
    assert c == choice.Choice(
        "torch",
        None,
        "table h100: beyond the table's largest measured M=8192 for this weight: cuBLAS (no extrapolation)",
    )
    # a weight measured from M = 16 only: one token is below it, and runs cuBLAS, not the rule's gemv
    two = [_entry(16, {SLAB: 0.04, CUBLAS: 0.05}), _entry(64, {SLAB: 0.04, CUBLAS: 0.05})]
    _install(tmp_path, monkeypatch, two)
    c = _choose(1)
    assert c == choice.Choice(
        "torch",
        None,
        "table h100: below the table's smallest measured M=16 for this weight: cuBLAS (no extrapolation)",
    )
    assert _key(_choose(32)) == SLAB and _key(_choose(65)) == CUBLAS


def test_why_names_both_neighbours_and_their_numbers(table):
    assert _choose(100).why == (
        f"table h100: between M=64 (cuBLAS 70.0 us; {SLAB} 1.17x) and M=128 (cuBLAS 60.0 us; "
        f"{SPLITK} 1.20x): {PERSISTENT} held at both (1.13x at M=64, 1.11x at M=128)"
    )
    assert _choose(500).why == (
        "table h100: between M=128 and M=1024, more than 4x apart: cuBLAS (a crossover can hide there)"
    )


def test_a_gap_wider_than_max_gap_runs_cublas_even_where_a_candidate_held_at_both(tmp_path, monkeypatch):
    """Two measured M more than MAX_GAP apart say nothing about the M between them (persistent held
    at 1024 and 8192 and ran 0.76x at 1536: results/h100-offgrid-auto); at most MAX_GAP apart the
    candidate that held at both runs, and where none held the why says so."""
    assert choice.MAX_GAP == 4
    wide = [_entry(1024, {PERSISTENT: 0.40, CUBLAS: 0.44}), _entry(8192, {PERSISTENT: 3.0, CUBLAS: 3.3})]
    _install(tmp_path, monkeypatch, wide)
    assert _key(_choose(1536)) == CUBLAS and "more than 4x apart" in _choose(1536).why
    narrow = [_entry(1024, {PERSISTENT: 0.40, CUBLAS: 0.44}), _entry(4096, {PERSISTENT: 1.5, CUBLAS: 1.65})]
    _install(tmp_path, monkeypatch, narrow)
    assert _key(_choose(1536)) == PERSISTENT and _key(_choose(4097)) == CUBLAS
    none = [_entry(1024, {PERSISTENT: 0.40, CUBLAS: 0.44}), _entry(4096, {PERSISTENT: 1.7, CUBLAS: 1.65})]
    _install(tmp_path, monkeypatch, none)
    assert _choose(2048).why == (
        f"table h100: between M=1024 (cuBLAS 440.0 us; {PERSISTENT} 1.10x) and M=4096 (cuBLAS 1650.0 us; "
        f"{PERSISTENT} 0.97x): no candidate beat cuBLAS by 3 % at both: cuBLAS"
    )


def test_the_margin_is_tunes_and_holds_at_both_neighbours(tmp_path, monkeypatch):
    """A candidate 3 % faster than cuBLAS holds (t * 1.03 <= cuBLAS); 2.9 % does not; at both."""
    assert tune.MARGIN is choice.MARGIN and tune.CUBLAS == choice.CUBLAS
    assert f"{registry.BASELINE} {next(iter(tune.candidates_for(registry.BASELINE, 1, (9, 0))))}" == CUBLAS
    _install(
        tmp_path,
        monkeypatch,
        [
            _entry(4, {SLAB: 1.0, SWAPAB: 0.9, CUBLAS: 1.03}),  # 3 % and 14 %
            _entry(16, {SLAB: 1.0, SWAPAB: 1.03 / 1.029, CUBLAS: 1.03}),  # 3 % and 2.9 %
            _entry(64, {SLAB: 1.0 / 1.029, CUBLAS: 1.0}),  # 2.9 %
        ],
    )
    assert _key(_choose(8)) == SLAB  # swapab, faster at M = 4, is 2.9 % faster at M = 16
    assert _key(_choose(32)) == CUBLAS  # slab is 2.9 % faster at M = 64


def test_ties_go_to_the_better_other_ratio_then_the_label(tmp_path, monkeypatch):
    a, b, c = f"slab {'A'}", f"slab {'B'}", f"persistent {'C'}"
    entries = [  # worse-of-two ratio 1.2 / 1.1 for all three; other 1.2 (a) or 1.2 / 0.9 (b, c)
        _entry(4, {a: 1.0, b: 1.1, CUBLAS: 1.2}),
        _entry(16, {a: 1.1, b: 0.9, CUBLAS: 1.2}),
        _entry(4, {a: 1.1, b: 1.1, c: 1.1, CUBLAS: 1.2}, N=8192),
        _entry(16, {a: 0.9, b: 0.9, c: 0.9, CUBLAS: 1.2}, N=8192),
    ]
    _install(tmp_path, monkeypatch, entries)
    assert _key(_choose(8)) == b  # the better other ratio
    assert _key(_choose(8, N=8192)) == c  # all equal: the first label, "persistent C"
    assert (_choose(8, N=8192).mode, _choose(8, N=8192).config) == ("persistent", "C")
    # the worse-of-two ratio first: a candidate 1.5x at one neighbour, 1.04x at the other loses
    _install(
        tmp_path,
        monkeypatch,
        [_entry(4, {a: 0.8, b: 1.1, CUBLAS: 1.2}), _entry(16, {a: 1.15, b: 1.1, CUBLAS: 1.2})],
    )
    assert _key(_choose(8)) == b


def test_other_shapes_dtypes_layouts_and_gpus_fall_back_to_the_rule(table):
    whole_k = swapab.whole_k((9, 0), 16).label
    for args, mode, config in [
        ((16, 4096, 4096, "bf16", "t"), "swapab", whole_k),
        ((16, 4096, 14336, "fp16", "t"), "swapab", whole_k),
        ((16, 4096, 14336, "bf16", "row"), "slab", None),
    ]:
        c = choice.choose(*args, (9, 0), H100)
        assert c == choice.Choice(mode, config, c.why) and "has no entry for this weight" in c.why
    c = choice.choose(32, 4096, 14336, "bf16", "t", (9, 0), "NVIDIA H200")
    assert c.mode == "torch" and "no table for NVIDIA H200" in c.why
    assert choice.choose(1, 4096, 4096, "bf16", "t", (9, 0), H100).mode == "gemv"
    assert choice.choose(1, 4096, 4096, "bf16", "row", (9, 0), H100).mode == "slab"  # gemv is K-major only
    h200 = choice.choose(16, 4096, 14336, "bf16", "t", (9, 0), "NVIDIA H200", 132)
    assert (h200.mode, h200.config) == ("swapab", whole_k) and "no table for NVIDIA H200" in h200.why
    assert choice.choose(4096, 4096, 4096, "bf16", "t", (9, 0), H100).mode == "torch"


@pytest.mark.parametrize(
    ("M", "capability", "mode"),
    [(1, (9, 0), "gemv"), (1, (10, 0), "gemv"), (2, (9, 0), "swapab"), (16, (10, 0), "swapab"),
     (17, (9, 0), "torch"), (64, (9, 0), "torch"), (256, (10, 0), "torch"), (2048, (9, 0), "torch"),
     (2049, (9, 0), "torch"), (4096, (9, 0), "torch"), (8192, (10, 0), "torch"), (1, (8, 0), "torch"),
     (16, (8, 0), "torch"), (16, (12, 0), "torch")],
)  # fmt: skip
def test_the_rule(M, capability, mode):
    """fp16/bf16 without a table entry: gemv for one token of a K-major weight, swapab's whole-K
    tile of 16 tokens to 16, cuBLAS above (no warpspec for prefill sizes); a row-major weight takes
    the slab where a K-major one takes gemv or the whole-K tile."""
    whole_k = swapab.whole_k(capability, 16).label if capability[0] in (9, 10) else None
    for dtype in ("fp16", "bf16"):
        c = choice.rule(M, capability, dtype)
        assert (c.mode, c.config) == (mode, whole_k if mode == "swapab" else None)
        row = choice.rule(M, capability, dtype, layout="row")
        assert (row.mode, row.config) == (("slab" if mode in ("gemv", "swapab") else mode), None)
    cfg = swapab.candidates(capability)[whole_k] if whole_k else None
    assert cfg is None or (cfg.BLOCK_M, cfg.BLOCK_N, cfg.SPLIT_K) == (64, 16, 1)


@pytest.mark.parametrize(
    ("N", "sm_count", "mode"),
    [(4096, 132, "swapab"), (8192, 132, "swapab"), (8448, 132, "swapab"), (8449, 132, "slab"),
     (10240, 132, "slab"), (28672, 132, "slab"), (10240, 0, "swapab"), (9472, 148, "swapab"),
     (9473, 148, "slab"), (4096, 60, "slab")],
)  # fmt: skip
def test_the_few_token_rule_keeps_the_whole_k_tile_to_one_wave(N, sm_count, mode):
    """At 2-16 tokens a K-major weight takes swap-AB's whole-K tile while its ceil(N / 64) programs
    fit one wave on the GPU's SMs (an unknown SM count, 0, counts as fitting), the slab beyond."""
    for M in (2, 16):
        c = choice.rule(M, (9, 0), "bf16", N, sm_count, 4096)
        assert c.mode == mode
        assert c.config == (swapab.whole_k((9, 0), M).label if mode == "swapab" else None)
        assert mode == "swapab" or f"{-(-N // 64)} 64-row tiles on {sm_count} SMs" in c.why
    assert choice.rule(17, (9, 0), "bf16", N, sm_count, 4096).mode == "torch"


@pytest.mark.parametrize(
    ("M", "N", "rows"),
    [(4096, 4096, 128), (2048, 8192, 128), (3072, 4096, 192), (6144, 4096, 192),
     (12288, 28672, 192), (16384, 4096, 192), (8192, 4096, 128), (2049, 4096, 192)],
)  # fmt: skip
def test_fp8_warpspec_takes_the_tile_whose_waves_finish_first(M, N, rows):
    """fp8's ping-pong tile: 192 rows, or 128 where the 192-row tiles leave the last of their waves
    on 132 SMs mostly empty (M = 4096 on a 4096-wide weight: 704 tiles, 5.33 waves; 128-row
    tiles 1,024, 7.76 waves), each wave's rows counted at the 128-row tile's measured rate."""
    cfg = warpspec.fp8_config(M, N, 132)
    assert rows == cfg.BLOCK_M * cfg.BOXES and cfg.ELEM_BYTES == 1
    assert cfg in warpspec.candidates((9, 0), fp8=True).values()


@pytest.mark.parametrize(
    ("M", "N", "K", "dtype", "mode", "tokens"),
    [(1, 57344, 28672, "fp8-row", "swapab", 16), (16, 28672, 4096, "fp8-row", "swapab", 16),
     (17, 28672, 4096, "fp8-row", "swapab", 32), (64, 4096, 4096, "fp8-row", "swapab", 64),
     (65, 4096, 4096, "fp8-row", "torch", None), (1, 57344, 28672, "fp8", "swapab", 16),
     (16, 4096, 4096, "fp8", "swapab", 16), (17, 4096, 4096, "fp8", "torch", None),
     (2048, 8192, 4096, "fp8-row", "torch", None), (2049, 28672, 4096, "fp8", "warpspec", None),
     (2049, 28672, 4096, "fp8-row", "torch", None), (1, 4096, 16384, "fp8", "gemv", None),
     (16384, 57344, 8192, "fp8-row", "torch", None), (16384, 57344, 8192, "fp8", "warpspec", None),
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
        # walked by persistent programs where the 16-token tile's 64-row tiles overflow the slots
        slots = 132 * (2 if ring == "shared" else 1)
        persistent = tokens == 16 and ring != "tall" and slots < -(-N // 64)
        assert cfg == swapab.whole_k((9, 0), M, fp8=True, ring=ring, persistent=persistent)
        assert ("persistent" in c.why) == persistent
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
    assert dataclasses.replace(cfg, PERSISTENT=0, GROUP_M=1) == swapab.whole_k(
        (9, 0), 1, fp8=True, ring="shared" if shared else "one"
    )
    # at 64 tokens the same weights take the 128-row tile instead of the shared ring
    cfg = swapab.candidates((9, 0), fp8=True)[choice.rule(64, (9, 0), "fp8-row", N, sm_count).config]
    assert cfg == swapab.whole_k((9, 0), 64, fp8=True, ring="tall" if shared else "one")


@pytest.mark.parametrize(
    ("M", "N", "sm_count", "dtype", "persistent"),
    [(2, 8448, 132, "fp8-row", False),  # 132 tiles on the one ring's 132 slots: a wave
     (2, 8512, 132, "fp8", False),  # 133 tiles: the shared ring's 264 slots
     (2, 16896, 132, "fp8", False), (2, 16960, 132, "fp8", True),  # 264 and 265 tiles on 264 slots
     (16, 28672, 132, "fp8-row", True), (16, 33856, 132, "fp8", True),  # 529 tiles: the one ring
     (17, 28672, 132, "fp8-row", False), (17, 57344, 132, "fp8-row", False),  # not at 32 tokens
     (2, 57344, 0, "fp8", False),  # SM count unknown
     (2, 57344, 528, "fp8", False)],  # 896 tiles on a GPU of 528 SMs: the shared ring, a wave
)  # fmt: skip
def test_the_fp8_rule_walks_tiles_persistently_only_past_a_wave(M, N, sm_count, dtype, persistent):
    """The 16-token whole-K tile runs on persistent programs, one a slot of its ring, exactly where
    its 64-row tiles number more than the ring's slots (SMs x programs an SM); never at wider token
    tiles, never with the SM count unknown, and the 128-row ring has no persistent form."""
    c = choice.rule(M, (9, 0), dtype, N, sm_count, 4096)
    cfg = swapab.candidates((9, 0), fp8=True)[c.config]
    assert c.mode == "swapab" and bool(cfg.PERSISTENT) == persistent
    assert ("persistent programs" in c.why) == persistent
    if persistent:
        slots = sm_count * cfg.blocks_per_sm()
        assert slots < -(-N // cfg.BLOCK_M) and f"walked by {slots} persistent programs" in c.why
    with pytest.raises(ValueError, match="no persistent whole-K tile on the 'tall' ring"):
        swapab.whole_k((9, 0), 64, fp8=True, ring="tall", persistent=True)


@pytest.mark.parametrize(
    ("M", "N", "used", "mode"),
    [(3000, 3584, 3000 * 3584 / (4 * 132 * 192 * 128), "torch"),  # 4 waves, the last 39 % full
     (3080, 5120, 3080 * 5120 / (8 * 132 * 128 * 128), "torch"),  # 1000 tiles fill 0.95 of 8 waves, but a
     (2056, 3584, 2056 * 3584 / (4 * 132 * 128 * 128), "torch"),  # last tile row of 8 rows costs a whole one
     (3500, 5120, 3500 * 5120 / (6 * 132 * 192 * 128), "torch"),  # 0.921 and 0.934: the K-heavy weights
     (7400, 4096, 7400 * 4096 / (10 * 132 * 192 * 128), "torch"),  # lost 3-7 % there
     (3500, 12288, 3500 * 12288 / (14 * 132 * 192 * 128), "warpspec"),  # 0.947
     (2600, 11008, 2600 * 11008 / (14 * 132 * 128 * 128), "warpspec"),  # 0.9453, just above the line
     (4096, 4096, 4096 * 4096 / (8 * 132 * 128 * 128), "warpspec"),
     (16384, 28672, 16384 * 28672 / (146 * 132 * 192 * 128), "warpspec")],
)  # fmt: skip
def test_the_fp8_rule_leaves_warpspec_where_its_tiles_waves_waste_work(M, N, used, mode):
    """Above M = 2048 warpspec runs where at least FP8_MIN_FILL of the MMA work of its fp8 tile's
    (`fp8_config`) waves lands in C, cuBLAS fp8 where the last wave's idle slots or the rows of the
    last tile row past M waste more; `explain`'s line says which. Unknown N or SM count, or a GPU
    other than sm_90: warpspec. fp8-row runs cuBLAS's row-wise kernel there whatever the fill."""
    assert warpspec.fp8_useful_fill(M, N, 132) == pytest.approx(used)
    c = choice.rule(M, (9, 0), "fp8", N, 132, 4096)
    assert c.mode == mode and (f"only {used:.1%} of the work" in c.why) == (mode == "torch")
    assert choice.choose(M, N, 4096, "fp8", "t", (9, 0), "NVIDIA H200", 132).mode == mode
    assert choice.rule(M, (9, 0), "fp8", N, 0, 4096).mode == "warpspec"
    assert choice.rule(M, (10, 0), "fp8", N, 148, 4096).mode == "warpspec"
    for capability, sm_count in (((9, 0), 132), ((9, 0), 0), ((10, 0), 148)):
        row = choice.rule(M, capability, "fp8-row", N, sm_count, 4096)
        assert row.mode == "torch" and "row-wise" in row.why
    # more SMs fill the same tiles' waves differently: 448 tiles on 112 SMs are exactly 4 waves
    assert warpspec.fp8_useful_fill(3000, 3584, 112) == pytest.approx(3000 / 3072)
    assert choice.rule(3000, (9, 0), "fp8", 3584, 112, 4096).mode == "warpspec"


@pytest.mark.parametrize(
    ("gpu", "M", "N", "K", "mode"),
    [("NVIDIA H200", 5000, 8192, 28672, "torch"), ("NVIDIA H200", 4609, 5120, 5120, "torch"),
     ("NVIDIA H200", 5503, 3584, 18944, "torch"),  # inside the H200's band, K > 4096: cuBLAS fp8
     ("NVIDIA H200", 4608, 10240, 8192, "warpspec"), ("NVIDIA H200", 5504, 10240, 8192, "warpspec"),
     ("NVIDIA H200", 4097, 5120, 8192, "warpspec"), ("NVIDIA H200", 6000, 7168, 8192, "warpspec"),
     ("NVIDIA H100 80GB HBM3", 4097, 5120, 8192, "torch"),
     ("NVIDIA H100 80GB HBM3", 5999, 8192, 8192, "torch"),
     ("NVIDIA H100 80GB HBM3", 6000, 10240, 8192, "warpspec"),  # the H100's own band and edge
     ("NVIDIA GH200 480GB", 6143, 8192, 28672, "torch"), ("", 4097, 8192, 28672, "torch"),  # unmeasured
     ("NVIDIA H200", 5000, 4096, 4096, "warpspec"),
     ("NVIDIA H200", 5000, 37888, 3584, "warpspec"),  # K <= 4096
     ("NVIDIA H200", 5000, 8192, 0, "warpspec")],  # K unknown
)  # fmt: skip
def test_the_fp8_rule_runs_cublas_in_its_gpus_band_around_5000_tokens_on_k_heavy_weights(gpu, M, N, K, mode):
    """Per-tensor fp8 strictly inside the GPU's band (H200 4608-5504, H100 4096-6000, any other GPU
    4096-6144) on a weight with K > 4096 runs cuBLAS fp8, where warpspec lost between two M at which
    it held; at the band's edges, on K <= 4096 and with K unknown the rule is as before. The line
    names the band; fp8-row runs cuBLAS there anyway."""
    for capability, sm_count in (((9, 0), 132), ((9, 0), 0), ((10, 0), 148)):
        c = choice.rule(M, capability, "fp8", N, sm_count, K, gpu_name=gpu)
        assert c.mode == mode and (" < M < " in c.why) == (mode == "torch"), c.why
    if gpu:
        assert choice.choose(M, N, K or 4096, "fp8", "t", (9, 0), gpu, 132).mode == mode
    assert choice.rule(M, (9, 0), "fp8-row", N, 132, K, gpu_name=gpu).mode == "torch"


@pytest.mark.parametrize(
    ("M", "N", "K", "mode"),
    [(8192, 4096, 14336, "torch"), (12288, 8192, 28672, "torch"),  # K = 3.5 N: cuBLAS fp8
     (7100, 4608, 36864, "torch"), (3456, 7168, 20480, "torch"),
     (8192, 4096, 8192, "warpspec"), (8192, 8192, 16384, "warpspec"),  # K = 2 N: still warpspec
     (8192, 4096, 8193, "torch"),  # just past 2 N
     (8192, 28672, 4096, "warpspec"), (8192, 10240, 8192, "warpspec")],
)  # fmt: skip
def test_the_fp8_rule_runs_cublas_where_k_is_more_than_twice_n(M, N, K, mode):
    """Per-tensor fp8 above M = 2048 on sm_90 runs cuBLAS fp8 where K > FP8_MAX_K_PER_N (2) x N,
    outside the band and whatever the fill, and says so; with N unknown, and on sm_100 (whose
    tcgen05 warpspec was never timed against it), the rule is as before."""
    assert choice.FP8_MAX_K_PER_N == 2.0
    assert warpspec.fp8_useful_fill(M, N, 132) >= choice.FP8_MIN_FILL  # the fill guard passes
    c = choice.rule(M, (9, 0), "fp8", N, 132, K, gpu_name="NVIDIA H200")
    assert c.mode == mode and ("K > 2 N" in c.why) == (mode == "torch"), c.why
    assert choice.choose(M, N, K, "fp8", "t", (9, 0), "NVIDIA H200", 132).mode == mode
    assert choice.rule(M, (9, 0), "fp8", 0, 132, K, gpu_name="NVIDIA H200").mode == "warpspec"
    assert choice.rule(M, (10, 0), "fp8", N, 148, K, gpu_name="NVIDIA H200").mode == "warpspec"


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


def test_tune_times_the_fp8_configs_for_fp8():
    """fp8 tasks time each mode's fp8 candidates (e4m3, one byte an element), none of a mode without
    an fp8 kernel, and cuBLAS (torch._scaled_mm) as the baseline."""
    fp8 = tune.candidates_for("warpspec", 4096, (9, 0), fp8=True)
    assert fp8 and set(fp8) == set(warpspec.candidates((9, 0), fp8=True))
    assert all(cfg.ELEM_BYTES == 1 for cfg in fp8.values())
    assert all(cfg.ELEM_BYTES == 1 for cfg in tune.candidates_for("swapab", 16, (9, 0), fp8=True).values())
    assert tune.candidates_for("torch", 16, (9, 0), fp8=True) == {"cuBLAS": None}
    no_fp8 = next(m.name for m in registry.MODES if m.kind == "gluon" and not m.fp8 and not m.grouped)
    assert tune.candidates_for(no_fp8, 4096, (9, 0), fp8=True) == {}


def test_fp8_entries_in_a_table_answer_fp8_calls_and_the_rule_the_rest(tmp_path, monkeypatch):
    """A table with fp8 entries (tune --dtype fp8-row) answers fp8-row calls on that weight from
    them, as it answers 16-bit ones: at a measured M, between two, and cuBLAS beyond; per-tensor
    fp8 and other weights keep the rule."""
    mid = f"warpspec {next(iter(warpspec.candidates((9, 0), fp8=True)))}"
    entries = [
        _entry(4096, {mid: 0.90, CUBLAS: 1.0}, N=4096, K=4096, dtype="fp8-row"),
        _entry(6144, {mid: 1.30, CUBLAS: 1.5}, N=4096, K=4096, dtype="fp8-row"),
    ]
    _install(tmp_path, monkeypatch, entries)
    at = choice.choose(4096, 4096, 4096, "fp8-row", "t", (9, 0), H100, 132)
    assert (at.mode, at.config) == ("warpspec", mid.partition(" ")[2]) and "table h100" in at.why
    between = choice.choose(5000, 4096, 4096, "fp8-row", "t", (9, 0), H100, 132)
    assert (between.mode, between.config) == ("warpspec", mid.partition(" ")[2])
    beyond = choice.choose(8192, 4096, 4096, "fp8-row", "t", (9, 0), H100, 132)
    assert beyond.mode == "torch" and "no extrapolation" in beyond.why
    rule = choice.rule(5000, (9, 0), "fp8", 4096, 132, 4096)
    assert choice.choose(5000, 4096, 4096, "fp8", "t", (9, 0), H100, 132).mode == rule.mode == "warpspec"
    choice._tables.cache_clear()


def test_tune_narrows_candidates_by_m():
    tiles = {
        M: [
            (c.BLOCK_M, c.BLOCK_N, c.SPLIT_K, c.BLOCK_K, c.PERSISTENT)
            for c in tune.candidates_for("swapab", M, (9, 0)).values()
        ]
        for M in (1, 16, 17, 64)
    }
    # the split tile (SPLIT_K chosen per shape: 0) and the whole-K ones (SPLIT_K 1) of each width:
    # on one program's ring per SM, on rings of half the K step that two programs share, at 64
    # tokens the 128-row tile; then the first two again, walked by persistent programs

    def narrow(t):
        return [(128, t, 0, 64, 0)] + [(64, t, 1, k, persistent) for persistent in (0, 1) for k in (256, 128)]

    wide = [(128, 64, 0, 64, 0), (64, 64, 1, 128, 0), (64, 64, 1, 64, 0), (128, 64, 1, 128, 0)]
    assert tiles == {
        1: narrow(16),
        16: narrow(16),
        17: narrow(32),
        64: wide + [(64, 64, 1, 128, 1), (64, 64, 1, 64, 1)],
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


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_auto_prepares_a_candidate_chosen_between_two_entries(table, monkeypatch):
    """Between M = 64 and 128 the table holds persistent's candidate: its label (with spaces) is
    looked up in the mode's candidates and launched as measured."""
    log: list = []
    monkeypatch.setattr(api, "target_of", lambda device: Target((9, 0), 132, H100))
    recorder = Recorder("persistent_kernel", log)
    monkeypatch.setattr(persistent, "RUNG", dataclasses.replace(persistent.RUNG, kernel=recorder))
    with FakeTensorMode():
        a = torch.empty(100, 14336, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(4096, 14336, dtype=torch.bfloat16, device="cuda")
        launch = api.prepare("auto", a, w.t(), torch.empty(100, 4096, dtype=torch.bfloat16, device="cuda"))
        launch.fn()
    assert launch.config["mode"] == "persistent" and "held at both" in launch.config["why"]
    cfg = persistent.candidates((9, 0))[PERSISTENT.partition(" ")[2]]
    assert {k: launch.config[k] for k in cfg.table()} == cfg.table()
    assert [launched.kernel for launched in log] == ["persistent_kernel"]


def _gaps(table: dict):
    """Per weight of a table: its entries by M, and each pair of adjacent measured M."""
    weights: dict[tuple, dict[int, dict]] = {}
    for e in table["entries"]:
        weights.setdefault((e["N"], e["K"], e["dtype"], e["b_layout"]), {})[e["M"]] = e
    for weight, entries in weights.items():
        yield weight, entries, list(itertools.pairwise(sorted(entries)))


def test_the_committed_table_runs_gluon_between_entries_only_where_it_held_at_both():
    """Over tables/h100.json: at every M strictly between two measured M of a weight, a Gluon
    choice beat cuBLAS by the margin at both neighbours (and names a config its mode still has);
    cuBLAS only where no candidate did; cuBLAS beyond the largest measured M."""
    choice._tables.cache_clear()
    table = choice.table_for(H100)
    assert table is not None and table["name"] == "h100"
    gluon = 0
    for (N, K, dtype, layout), entries, gaps in _gaps(table):
        for lo, hi in gaps:
            if hi > choice.MAX_GAP * lo:
                for M in (lo + 1, hi - 1):
                    c = choice.choose(M, N, K, dtype, layout, (9, 0), H100)
                    assert c.mode == "torch" and f"between M={lo} and M={hi}, more than" in c.why
                continue
            held = _beat(entries[lo]) & _beat(entries[hi])
            for M in sorted({lo + 1, math.isqrt(lo * hi), hi - 1} - {lo, hi}):
                c = choice.choose(M, N, K, dtype, layout, (9, 0), H100)
                assert (_key(c) in held) if held else c.mode == "torch", (N, K, dtype, M, c)
                assert f"between M={lo} " in c.why and f" and M={hi} " in c.why
                if c.mode != "torch":
                    assert c.config in registry.get(c.mode).provider((9, 0)).candidates((9, 0))
            gluon += bool(held)
        c = choice.choose(2 * max(entries), N, K, dtype, layout, (9, 0), H100)
        assert c.mode == "torch" and "no extrapolation" in c.why
    assert gluon > 0  # the property is not vacuous: some gaps run a Gluon candidate


def _beat(entry: dict) -> set[str]:
    """The candidates that beat cuBLAS by the margin at an entry: by their paired ratios where the
    entry was confirmed, else by their times."""
    if "paired" in entry:
        gpu = entry.get("paired_gpu")
        return {
            k
            for k, r in entry["paired"].items()
            if r >= 1 + choice.MARGIN and (gpu is None or gpu.get(k, 0.0) >= choice.GPU_TIME_FLOOR)
        }
    return {
        key
        for key, t in entry["candidates"].items()
        if key != CUBLAS and isinstance(t, float) and t * (1 + choice.MARGIN) <= entry["cublas_ms"]
    }


def test_a_confirmed_entry_counts_only_its_paired_wins(tmp_path, monkeypatch):
    """`tune --confirm` re-timed two winners against cuBLAS in alternating windows: at M = 64 slab
    held (1.08x paired) and persistent did not (1.01x); at M = 128 neither did. So M = 64 runs slab,
    M = 128 cuBLAS, and between them nothing held at both: cuBLAS, whatever the unpaired times said."""
    lo = _entry(64, {SLAB: 0.060, PERSISTENT: 0.062, CUBLAS: 0.070})
    lo |= {"paired": {SLAB: 1.08, PERSISTENT: 1.01}}
    hi = _entry(128, {SPLITK: 0.050, PERSISTENT: 0.054, CUBLAS: 0.060})
    hi |= {"paired": {SPLITK: 0.97, PERSISTENT: 1.02}, "mode": "torch", "config": None, "ms": 0.060}
    _install(tmp_path, monkeypatch, [lo, hi])
    at_lo = choice.choose(64, 4096, 14336, "bf16", "t", (9, 0), H100)
    assert (at_lo.mode, at_lo.config) == tuple(SLAB.split(" ", 1)) and "1.08x paired" in at_lo.why
    assert choice.choose(128, 4096, 14336, "bf16", "t", (9, 0), H100).mode == "torch"
    between = choice.choose(96, 4096, 14336, "bf16", "t", (9, 0), H100)
    assert between.mode == "torch" and "no candidate beat cuBLAS" in between.why
    # Unpaired, persistent beat cuBLAS by the margin at both neighbours and would have run here.
    unpaired = [{k: v for k, v in e.items() if k != "paired"} for e in (lo, hi)]
    _install(tmp_path, monkeypatch, unpaired)
    assert _key(choice.choose(96, 4096, 14336, "bf16", "t", (9, 0), H100)) == PERSISTENT


def test_a_per_call_win_that_loses_in_gpu_time_does_not_hold(tmp_path, monkeypatch):
    """`tune --confirm` also times the per-call winners in GPU time (`paired_gpu`): at M = 64 slab
    held per call (1.08x paired) but took longer than cuBLAS kernel-only (0.90x), so the entry runs
    cuBLAS and `explain` says why; at M = 128 it held both ways (1.10x, 1.02x) and runs; between
    them it held at one neighbour only: cuBLAS. A candidate that held per call but has no GPU-time
    ratio in a confirmed entry does not hold either."""
    lo = _entry(64, {SLAB: 0.060, CUBLAS: 0.070})
    lo |= {"paired": {SLAB: 1.08}, "paired_gpu": {SLAB: 0.90}, "mode": "torch", "config": None, "ms": 0.070}
    hi = _entry(128, {SLAB: 0.050, CUBLAS: 0.060})
    hi |= {
        "paired": {SLAB: 1.10},
        "paired_gpu": {SLAB: 1.02},
        "mode": "slab",
        "config": SLAB.split(" ", 1)[1],
    }
    assert choice._held(lo) == set() and choice._held(hi) == {SLAB}
    assert choice._held(hi | {"paired_gpu": {}}) == set()
    _install(tmp_path, monkeypatch, [lo, hi])
    at_lo = _choose(64)
    assert at_lo.mode == "torch" and f"{SLAB}, 1.08x per call but 0.90x in GPU time" in at_lo.why
    at_hi = _choose(128)
    assert _key(at_hi) == SLAB and "1.10x paired, 1.02x in GPU time" in at_hi.why
    between = _choose(96)
    assert between.mode == "torch" and "no candidate beat cuBLAS" in between.why


def test_a_confirmation_repicks_from_what_held_per_call_and_in_gpu_time():
    """tune's re-pick after `--confirm`: the best per-call ratio among the candidates that held both
    ways; a faster per-call winner that lost in GPU time is passed over, and with none left the
    entry is cuBLAS again, its time cuBLAS's."""
    entry = _entry(128, {SLAB: 0.040, SPLITK: 0.045, CUBLAS: 0.060})
    assert (entry["mode"], entry["ms"]) == ("slab", 0.040)
    picked = tune.repicked(entry, {SLAB: 1.40, SPLITK: 1.20}, {SLAB: 0.70, SPLITK: 1.05})
    assert _key(choice.Choice(picked["mode"], picked["config"], "")) == SPLITK and picked["ms"] == 0.045
    assert picked["paired_gpu"] == {SLAB: 0.70, SPLITK: 1.05}
    none = tune.repicked(entry, {SLAB: 1.40, SPLITK: 1.01}, {SLAB: 0.70})
    assert (none["mode"], none["config"], none["ms"]) == ("torch", None, 0.060)


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


@pytest.mark.parametrize("fp8", [False, True], ids=["16-bit", "fp8"])
def test_swapab_persistent_tiles_are_the_whole_k_ones_walked_by_fewer_programs(fp8):
    """Each persistent candidate is a whole-K tile of the one-program or the shared ring with
    PERSISTENT 1 and GROUP_M 8, labelled and tabled as such, its C tile's staging counted beside
    the ring (so the shared ring still fits two an SM); `whole_k` gives one only when asked;
    a persistent config that splits K, or a PERSISTENT other than 0 and 1, is refused."""
    found = [c for c in swapab.candidates((9, 0), fp8).values() if c.PERSISTENT]
    plain = {
        dataclasses.replace(swapab.whole_k((9, 0), t, fp8, ring), PERSISTENT=1, GROUP_M=8)
        for ring in swapab.PERSISTENT_RINGS
        for t in sorted(swapab.RINGS[ring][1])
    }
    assert set(found) == plain and len(found) == len(plain) == 6
    for cfg in found:
        flat = dataclasses.replace(cfg, PERSISTENT=0)
        assert cfg.label == f"{flat.label} persistent" and cfg.table()["persistent"] is True
        assert cfg.smem_bytes() == flat.smem_bytes() + cfg.BLOCK_M * cfg.BLOCK_N * 2
        assert cfg.blocks_per_sm() == flat.blocks_per_sm()
    assert "persistent" not in swapab.whole_k((9, 0), 16, fp8).table()
    assert not any(
        swapab.whole_k((9, 0), M, fp8, ring).PERSISTENT for M in (1, 16, 64) for ring in swapab.RINGS
    )
    with pytest.raises(ValueError, match="SPLIT_K=1"):
        dataclasses.replace(found[0], SPLIT_K=4)
    with pytest.raises(ValueError, match="PERSISTENT is 0 or 1"):
        dataclasses.replace(found[0], PERSISTENT=2)


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


# ------------------------------------------------------------------------------------------------
# A layouts: entries measured with A "t" (the transpose view of a [K, M] matrix, a weight's gradient)


def _a_t(entry: dict) -> dict:
    return entry | {"a_layout": "t"}


# The same weight as ENTRIES (4096 x 14336 bf16, B t), measured with A t at M = 4096 and 8192:
# persistent 1.10x and 1.08x, the winner at both.
A_T_ENTRIES = [
    _a_t(_entry(4096, {PERSISTENT: 1.0, CUBLAS: 1.1})),
    _a_t(_entry(8192, {PERSISTENT: 2.0, CUBLAS: 2.16})),
]


@pytest.fixture
def both(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, ENTRIES + A_T_ENTRIES)
    yield
    choice._tables.cache_clear()


def _choose_a(M, a_layout, N=4096, K=14336):
    return choice.choose(M, N, K, "bf16", "t", (9, 0), H100, a_layout=a_layout)


def test_an_a_t_entry_answers_a_t_products_only_and_an_a_row_entry_a_row_ones(both):
    at = _choose_a(4096, "t")
    assert _key(at) == PERSISTENT and at.why.startswith("table h100 (A t, B t): measured at M=4096")
    # the same M with A row: the A-row entries (1024 and 8192, more than MAX_GAP apart): cuBLAS
    row = _choose_a(4096, "row")
    assert row.mode == "torch" and row.why.startswith("table h100: between M=1024 and M=8192, more than")
    assert _choose_a(4096, "row") == _choose(4096)  # "row" is the default
    # where only A-row entries were measured, an A-t product takes no neighbour of theirs
    below = _choose_a(16, "t")
    assert below.mode == "torch" and "below the table's smallest measured M=4096" in below.why
    assert _key(_choose_a(16, "row")) == SWAPAB


def test_a_t_neighbours_are_the_a_t_entries(both):
    between = _choose_a(6000, "t")
    assert _key(between) == PERSISTENT
    assert between.why.startswith("table h100 (A t, B t): between M=4096 (cuBLAS 1100.0 us; ")
    assert "held at both (1.10x at M=4096, 1.08x at M=8192)" in between.why
    beyond = _choose_a(9000, "t")
    assert beyond.mode == "torch" and "beyond the table's largest measured M=8192" in beyond.why


def test_without_a_t_entries_the_rule_answers_a_t_products_as_a_row_ones(table):
    """The weight of ENTRIES has A-row entries only, 8192 x 8192 none: an A-t product takes the
    rule (swapab's whole-K tile to 16 tokens, cuBLAS above: it reads a transposed A in place), the why
    naming the pair."""
    for N, K in [(4096, 14336), (8192, 8192)]:
        for M, mode in [(16, "swapab"), (4096, "torch")]:
            c = _choose_a(M, "t", N, K)
            assert c.mode == mode and c.why.endswith("(table h100 has no entry for this weight (A t, B t))")
    assert _key(_choose_a(16, "row")) == SWAPAB  # the A-row entry, for A row


def test_an_a_t_entry_never_answers_a_row_product(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, [_a_t(_entry(4096, {PERSISTENT: 1.0, CUBLAS: 1.1}, N=8192, K=8192))])
    assert _key(_choose_a(4096, "t", 8192, 8192)) == PERSISTENT
    row = _choose_a(4096, "row", 8192, 8192)
    assert row.mode == "torch" and "has no entry for this weight" in row.why and "(A t" not in row.why
    choice._tables.cache_clear()


def test_auto_chooses_by_the_layout_of_a(both):
    target = Target((9, 0), 132, H100)
    w = torch.empty(4096, 14336, dtype=torch.bfloat16)
    a_t = torch.empty(14336, 4096, dtype=torch.bfloat16).t()  # the transpose view of a [K, M] matrix
    assert _key(auto._choice(a_t, w.t(), target, None)) == PERSISTENT
    assert auto._choice(a_t.contiguous(), w.t(), target, None).mode == "torch"


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_auto_runs_the_a_t_entry_on_the_transposed_a_in_place(both, monkeypatch):
    log: list = []
    monkeypatch.setattr(api, "target_of", lambda device: Target((9, 0), 132, H100))
    recorder = Recorder("persistent_kernel", log)
    monkeypatch.setattr(persistent, "RUNG", dataclasses.replace(persistent.RUNG, kernel=recorder))
    with FakeTensorMode():
        x = torch.empty(14336, 4096, dtype=torch.bfloat16, device="cuda")  # [K, M]
        w = torch.empty(4096, 14336, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(4096, 4096, dtype=torch.bfloat16, device="cuda")
        launch = api.prepare("auto", x.t(), w.t(), out)
        launch.fn()
    assert launch.config["mode"] == "persistent" and launch.config["a_layout"] == "t"
    assert "(A t, B t): measured at M=4096" in launch.config["why"]
    assert "aligned_copy" not in launch.config
    (launched,) = log
    assert launched.kwargs["A_KMAJOR"] is False


def test_tune_keys_entries_by_a_layout_where_it_is_t():
    row, t = _keyed(4096, "torch"), _keyed(4096, "persistent") | {"a_layout": "t"}
    assert tune.entry_key(row) == (4096, 4096, 4096, "bf16", "t")  # as tables always had it
    assert tune.entry_key(t) == (4096, 4096, 4096, "bf16", "t", "t")
    assert tune.entry_key(row | {"a_layout": "row"}) == tune.entry_key(row)
    table = {"name": "h100", "match": "H100", "entries": [row]}
    merged = tune.merge(table, {"env": {}, "settings": {}, "entries": [t]})
    assert [(e["mode"], e.get("a_layout")) for e in merged["entries"]] == [
        ("torch", None),
        ("persistent", "t"),
    ]
    assert merged["updates"][0]["entries"] == [[4096, 4096, 4096, "bf16", "t", "t"]]
    again = tune.merge(merged, {"env": {}, "settings": {}, "entries": [t | {"mode": "warpspec"}]})
    assert [(e["mode"], e.get("update")) for e in again["entries"]] == [("torch", None), ("warpspec", 2)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shapes", "llm-train", "--a-layout", "t"], "--a-layout: --shapes llm-train fixes each shape's"),
        (["--shapes", "llm-train", "--b-layout", "t"], "--b-layout: --shapes llm-train fixes each shape's"),
        (["--a-layout", "col"], "unknown dtype or layout: col"),
        (["--dtype", "fp8", "--b-layout", "row"], "fp8: fp8 runs with A row-major and B the transpose view"),
        (["--dtype", "bf16,fp8-row", "--a-layout", "t"], "fp8-row: fp8 runs with A row-major"),
    ],
)
def test_tune_refuses_layouts_it_cannot_measure_before_the_gpu(tmp_path, capsys, argv, message):
    args = ["--name", "h100", "--match", "H100", "--output", str(tmp_path / "t.json")]
    assert tune.main([*argv, *args]) == 2
    assert message in capsys.readouterr().err


def test_tune_with_a_t_times_only_the_modes_that_read_it_in_place():
    target = Target((9, 0), 132, H100)
    a = torch.empty(4096, 4096, dtype=torch.bfloat16).t()
    b = torch.empty(4096, 4096, dtype=torch.bfloat16)
    reads = {mode: tune.reads_in_place(mode, a, b, target) for mode in tune.MODES}
    assert reads == {
        "slab": False, "swapab": False, "splitk": True, "persistent": True, "warpspec": True, "torch": True,
    }  # fmt: skip
    assert not tune.reads_in_place("persistent", a, b, Target((10, 0), 148, "NVIDIA B200"))
