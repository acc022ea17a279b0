"""The Gluon ladder on a real GPU: every rung, both dtypes, both B layouts, ragged and large shapes,
NaN-poisoned outputs, and every bad input getting its error. Run on the GPU machine: pytest -m gpu."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from bad_inputs import BAD_INPUTS
from gluon_survey import api, choice, registry
from gluon_survey.kernels import gemv, persistent, slab, splitk, swapab, warpspec
from gpu_checks import assert_close_to_reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("hopper_or_blackwell")]

RUNGS = [m.name for m in registry.MODES if m.kind == "gluon" and not m.grouped]  # dense rungs
DTYPES = [torch.float16, torch.bfloat16]

# Tile-aligned, ragged in every dimension, tiny, one-row, K tails, and K = 16384. The TMA-aligned
# ones run as they are; the unaligned ones (N or K not a multiple of 8 elements) go through the
# documented aligned copy.
SHAPES = [
    (256, 512, 128),
    (127, 264, 72),
    (1, 8, 8),
    (1, 4096, 4096),
    (3000, 5000, 264),
    (300, 520, 16384),
    (127, 257, 65),
    (1, 1, 1),
    (65, 33, 17),
]


def _inputs(M, N, K, dtype, b_layout, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, generator=g, device="cuda").to(dtype)
    if b_layout == "t":
        b = torch.randn(N, K, generator=g, device="cuda").to(dtype).t()  # nn.Linear weight view
    else:
        b = torch.randn(K, N, generator=g, device="cuda").to(dtype)
    return a, b


@pytest.mark.parametrize("b_layout", ["row", "t"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("rung", RUNGS)
def test_rung_matches_reference(rung, shape, dtype, b_layout):
    a, b = _inputs(*shape, dtype, b_layout, seed=hash((rung, shape)) % 1000)
    out = torch.full((shape[0], shape[1]), float("nan"), dtype=dtype, device="cuda")
    result = api.matmul(a, b, kernel=rung, out=out)
    torch.cuda.synchronize()
    assert result is out
    assert_close_to_reference(out, a, b)


@pytest.mark.parametrize("rung", RUNGS)
def test_rung_reuses_launch_on_fresh_inputs(rung):
    """The same launch on new data gives the new answer (no stale tiles, no cached results)."""
    M, N, K = 512, 768, 640
    a, b = _inputs(M, N, K, torch.float16, "row", seed=1)
    out = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")
    launch = api.prepare(rung, a, b, out)
    launch.fn()
    a.copy_(torch.randn_like(a))
    b.copy_(torch.randn_like(b))
    out.fill_(float("nan"))
    launch.fn()
    torch.cuda.synchronize()
    assert_close_to_reference(out, a, b)


# The persistent designs (warpspec's two are chosen per K on the host), each forced onto shapes where
# every program owns several tiles (so the hand-over between a program's tiles runs), including one K
# step per tile and a K tail.
DESIGNS = {
    "persistent": lambda: persistent.CONFIGS[9],
    "warpspec-pingpong": lambda: warpspec.PINGPONG,
    "warpspec-cooperative": lambda: warpspec.COOPERATIVE,
}


# (100, 5000, 264): fewer rows than one 192-row ping-pong tile, whose 2nd and 3rd A boxes are all out
# of bounds.
SHAPES = [(3000, 5000, 264), (1500, 2904, 40), (2048, 4096, 1000), (100, 5000, 264)]


@pytest.mark.parametrize("b_layout", ["row", "t"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("design", DESIGNS)
def test_design_hands_over_between_tiles(design, shape, b_layout):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("Hopper designs")
    module = persistent if design.startswith("persistent") else warpspec
    a, b = _inputs(*shape, torch.float16, b_layout, seed=7)
    out = torch.full(shape[:2], float("nan"), dtype=torch.float16, device="cuda")
    module.prepare(a, b, out, api.target_of(a.device), DESIGNS[design]()).fn()
    torch.cuda.synchronize()
    assert_close_to_reference(out, a, b)


def test_default_kernel_matches_reference():
    a, b = _inputs(1000, 1000, 1000, torch.bfloat16, "t")
    assert_close_to_reference(api.matmul(a, b), a, b)
    assert "mode:" in api.explain(a, b)


@pytest.mark.parametrize("rung", RUNGS)
def test_empty_and_zero_k(rung):
    a = torch.randn(0, 64, device="cuda", dtype=torch.float16)
    b = torch.randn(64, 32, device="cuda", dtype=torch.float16)
    assert api.matmul(a, b, kernel=rung).shape == (0, 32)
    a = torch.randn(16, 0, device="cuda", dtype=torch.float16)
    b = torch.randn(0, 32, device="cuda", dtype=torch.float16)
    out = torch.full((16, 32), float("nan"), device="cuda", dtype=torch.float16)
    assert torch.equal(api.matmul(a, b, kernel=rung, out=out), torch.zeros_like(out))


def test_unaligned_views_are_copied_not_misread():
    """A column slice with an odd row stride and an offset base: TMA cannot describe it."""
    big = torch.randn(300, 301, device="cuda", dtype=torch.float16)
    a = big[:, 1:200]  # base off by 2 bytes, row stride 602 bytes
    b = torch.randn(199, 96, device="cuda", dtype=torch.float16)
    for rung in RUNGS:
        out = api.matmul(a, b, kernel=rung)
        assert_close_to_reference(out, a, b)
    launch = api.prepare("Pipelined", a, b, torch.empty(300, 96, device="cuda", dtype=torch.float16))
    assert launch.config["aligned_copy"] == "a"


@pytest.mark.parametrize(("make", "error", "match"), BAD_INPUTS)
def test_bad_inputs_raise_clear_errors(make, error, match):
    a, b = make()
    for rung in RUNGS:
        with pytest.raises(error, match=match):
            api.matmul(a, b, kernel=rung)


def test_bad_out_and_unknown_kernel():
    a = torch.randn(8, 8, device="cuda").half()
    with pytest.raises(ValueError, match="shape"):
        api.matmul(a, a, kernel="Pipelined", out=torch.empty(8, 9, device="cuda").half())
    with pytest.raises(TypeError, match="out is"):
        api.matmul(a, a, kernel="Pipelined", out=torch.empty(8, 8, device="cuda"))
    with pytest.raises(KeyError, match="valid modes"):
        api.matmul(a, a, kernel="nope")


# The small-M rungs on their own ground: M = 1, 7, 63, 65 tokens; N and K ragged; K deep enough
# that split_for cuts it (1000 x 4104 at M = 1: 8 weight tiles, 64 K steps).
SMALL_M = [(1, 1000, 4104), (7, 520, 9000), (63, 3000, 520), (65, 264, 12296), (16, 4096, 14336)]


@pytest.mark.parametrize("b_layout", ["row", "t"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", SMALL_M, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", ["splitk", "swapab", "slab", "auto"])
def test_small_m_modes_match_reference(mode, shape, dtype, b_layout):
    a, b = _inputs(*shape, dtype, b_layout, seed=hash((mode, shape)) % 1000)
    out = torch.full(shape[:2], float("nan"), dtype=dtype, device="cuda")
    assert api.matmul(a, b, kernel=mode, out=out) is out
    torch.cuda.synchronize()
    assert_close_to_reference(out, a, b)


@pytest.mark.parametrize("split", [1, 3, 5])
@pytest.mark.parametrize("module", [splitk, swapab], ids=["splitk", "swapab"])
def test_forced_splits_sum_every_slice_and_reset_their_counters(module, split):
    """Uneven slices (K steps not a multiple of the split), and the same launch three times on
    fresh data: each launch finds every tile counter back at 0."""
    M, N, K = 40, 1000, 64 * 22 + 24  # 23 K steps, the last one partial: slices of 8,8,7 or 5,5,5,5,3
    a, b = _inputs(M, N, K, torch.bfloat16, "t", seed=split)
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    cfg = dataclasses.replace(module.CONFIGS[9], SPLIT_K=split, MIN_STEPS=1)
    launch = module.prepare(a, b, out, api.target_of(a.device), cfg)
    assert launch.config["split_k"] == split
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        out.fill_(float("nan"))
        launch.fn()
        torch.cuda.synchronize()
        assert_close_to_reference(out, a, b)


@pytest.mark.parametrize("b_layout", ["row", "t"])
@pytest.mark.parametrize("rows", slab.SLABS)
def test_every_slab_and_token_tile_matches_reference(rows, b_layout):
    """Each slab height `tune` may pick, at each token tile (M = 1, 9, 17, 63: tiles of 8, 16, 32
    and 64 tokens; 65: two 64-token tiles), a ragged N (the last slab partly past it) and a K tail;
    the same launch again on fresh tokens gives the new answer."""
    cfg = dataclasses.replace(slab.CONFIGS[9], BLOCK_N=rows, num_warps=rows // 16)
    for M in (1, 9, 17, 63, 65):
        a, b = _inputs(M, 1000, 2056, torch.bfloat16, b_layout, seed=M + rows)
        out = torch.full((M, 1000), float("nan"), dtype=torch.bfloat16, device="cuda")
        launch = slab.prepare(a, b, out, api.target_of(a.device), cfg)
        assert launch.config["BLOCK_M"] == slab.tokens_for(M) and launch.config["BLOCK_N"] == rows
        _assert_relaunches_match_reference(launch, out, a, b)


WHOLE_K_TILES = [(ring, t) for ring, (_, widths) in swapab.RINGS.items() for t in sorted(widths)]


@pytest.mark.parametrize("b_layout", ["row", "t"])
@pytest.mark.parametrize(("ring", "tokens"), WHOLE_K_TILES, ids=[f"{r}-{t}" for r, t in WHOLE_K_TILES])
def test_whole_k_swapab_tiles_match_reference(ring, tokens, b_layout):
    """swapab's whole-K candidates (one 64- or 128-row tile per program over all of K, no split),
    on every ring: M up to the tile, one token past it (two token tiles), a ragged N and a K tail;
    the same launch again on fresh tokens gives the new answer."""
    cfg = swapab.whole_k((9, 0), tokens, ring=ring)
    assert (1, tokens, swapab.RINGS[ring][0]) == (cfg.SPLIT_K, cfg.BLOCK_N, cfg.BLOCK_M)
    for M in (1, tokens - 1, tokens + 1):
        a, b = _inputs(M, 1000, 2056, torch.bfloat16, b_layout, seed=M + tokens)
        out = torch.full((M, 1000), float("nan"), dtype=torch.bfloat16, device="cuda")
        launch = swapab.prepare(a, b, out, api.target_of(a.device), cfg)
        assert launch.config["split_k"] == 1
        assert launch.config["grid"] == -(-1000 // cfg.BLOCK_M) * -(-M // tokens)
        _assert_relaunches_match_reference(launch, out, a, b)


PERSISTENT_TILES = [c for c in swapab.candidates((9, 0)).values() if c.PERSISTENT]


@pytest.mark.parametrize("b_layout", ["row", "t"])
@pytest.mark.parametrize("cfg", PERSISTENT_TILES, ids=[c.label for c in PERSISTENT_TILES])
def test_persistent_whole_k_tiles_match_reference(cfg, b_layout):
    """swapab's persistent whole-K candidates on a weight of 301 64-row tiles, more than the
    programs, so that each program walks several and its ring runs on across tiles: M = 1 and one
    token past the tile (two token tiles a weight block), a ragged N, a K tail, fp16 and bf16 in
    turn; the grid is a program per ring slot; relaunched on fresh tokens."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the candidates are sm_90's")
    N = 64 * 300 + 40
    for i, M in enumerate((1, cfg.BLOCK_N + 1)):
        a, b = _inputs(M, N, 2056, DTYPES[i], b_layout, seed=M)
        out = torch.full((M, N), float("nan"), dtype=DTYPES[i], device="cuda")
        target = api.target_of(a.device)
        launch = swapab.prepare(a, b, out, target, cfg)
        tiles = -(-N // cfg.BLOCK_M) * -(-M // cfg.BLOCK_N)
        assert launch.config["persistent"] and launch.config["split_k"] == 1
        assert launch.config["grid"] == min(tiles, target.sm_count * cfg.blocks_per_sm()) < tiles
        _assert_relaunches_match_reference(launch, out, a, b)


@pytest.mark.parametrize("b_layout", ["row", "t"])
@pytest.mark.parametrize("label", sorted(gemv.candidates((9, 0))))
def test_every_gemv_candidate_matches_reference_with_and_without_its_loop(label, b_layout):
    """Each gemv config `tune` may pick, with K in one chunk (the loop-free kernel) and with K a
    chunk and a tail deeper (the prefetching loop), at M = 1 and 7 (the loop over tokens) and a
    ragged N; the same launch again on fresh tokens gives the new answer."""
    cfg = gemv.candidates((9, 0))[label]
    for K in (cfg.BLOCK_K - 8, cfg.BLOCK_K + 24):
        for M in (1, 7):
            a, b = _inputs(M, 1000, K, torch.bfloat16, b_layout, seed=M + K)
            out = torch.full((M, 1000), float("nan"), dtype=torch.bfloat16, device="cuda")
            launch = gemv.prepare(a, b, out, api.target_of(a.device), cfg)
            if b_layout == "t":
                assert launch.config["k_chunks"] == (1 if K < cfg.BLOCK_K else 2)
            _assert_relaunches_match_reference(launch, out, a, b)


def _assert_relaunches_match_reference(launch, out, a, b):
    """The launch twice, the second time on fresh tokens into a poisoned `out`: both answers right."""
    for _ in range(2):
        launch.fn()
        torch.cuda.synchronize()
        assert_close_to_reference(out, a, b)
        a.copy_(torch.randn_like(a))
        out.fill_(float("nan"))


MID_M = [
    pytest.param(module, cfg, id=f"{module.__name__.rsplit('.', 1)[1]} {cfg.label}")
    for module in (splitk, persistent, warpspec)
    for cfg in module.candidates((9, 0)).values()
]
# Ragged token counts around the tiles (one row, odd, one either side of 64, mid, large) on N and
# K that are no multiple of the tiles and leave a K tail.
MID_M_SHAPES = [(1, 1000, 1000), (7, 520, 4104), (63, 1000, 2056), (65, 1000, 2056), (300, 2200, 1032)]
MID_M_SHAPES += [(3000, 1000, 776)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize(("module", "cfg"), MID_M)
def test_every_tune_candidate_matches_reference_on_ragged_shapes(module, cfg, dtype):
    """Each config `tune` may put in a table (the mid-M tiles among them), on ragged shapes, both B
    layouts; relaunched on fresh inputs."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the candidates are sm_90's")
    for M, N, K in MID_M_SHAPES:
        for b_layout in ("row", "t"):
            a, b = _inputs(M, N, K, dtype, b_layout, seed=M + N)
            out = torch.full((M, N), float("nan"), dtype=dtype, device="cuda")
            launch = module.prepare(a, b, out, api.target_of(a.device), cfg)
            _assert_relaunches_match_reference(launch, out, a, b)


# The small-M candidates `tune` may pick that the tests above leave out: swapab's split-K tiles at
# each token width (the whole-K ones: test_whole_k_swapab_tiles_match_reference) and slab's tile
# with K steps half as wide (its slab heights: test_every_slab_and_token_tile_matches_reference).
SMALL_M_CANDIDATES = [
    pytest.param(swapab, cfg, id=f"swapab {cfg.label}")
    for cfg in swapab.candidates((9, 0)).values()
    if cfg.SPLIT_K != 1
] + [
    pytest.param(slab, cfg, id=f"slab {cfg.label}")
    for cfg in slab.candidates((9, 0)).values()
    if cfg.BLOCK_K != slab.CONFIGS[9].BLOCK_K
]


@pytest.mark.parametrize(("module", "cfg"), SMALL_M_CANDIDATES)
def test_the_other_small_m_candidates_match_reference_on_ragged_shapes(module, cfg):
    """M = 1, 7, 63, 65, 300 (fp16 and bf16 in turn), a ragged N and a K tail, both B layouts;
    relaunched on fresh inputs."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the candidates are sm_90's")
    for i, M in enumerate((1, 7, 63, 65, 300)):
        for b_layout in ("row", "t"):
            dtype = DTYPES[i % 2]
            a, b = _inputs(M, 1000, 2056, dtype, b_layout, seed=M)
            out = torch.full((M, 1000), float("nan"), dtype=dtype, device="cuda")
            launch = module.prepare(a, b, out, api.target_of(a.device), cfg)
            _assert_relaunches_match_reference(launch, out, a, b)


@pytest.mark.parametrize("rung", ["Blocked", "Pipelined"])
def test_the_first_rungs_at_7_and_63_tokens(rung):
    """The token counts the shapes above give Blocked and Pipelined no case of (the other rungs
    have theirs in SMALL_M and MID_M_SHAPES): M = 7 and 63, N and K tails, both dtypes and B
    layouts."""
    for M, N, K in ((7, 264, 200), (63, 1000, 2056)):
        for dtype in DTYPES:
            for b_layout in ("row", "t"):
                a, b = _inputs(M, N, K, dtype, b_layout, seed=M)
                out = torch.full((M, N), float("nan"), dtype=dtype, device="cuda")
                assert api.matmul(a, b, kernel=rung, out=out) is out
                torch.cuda.synchronize()
                assert_close_to_reference(out, a, b)


H100 = "NVIDIA H100 80GB HBM3"


def _table_gaps() -> list[tuple]:
    """(M, N, K, dtype, mode) at the middle (in log scale) of each gap between two measured M of
    the committed H100 table where `choice.choose` runs a Gluon candidate: measured at the two
    neighbours only, so checked here at an M in between."""
    table = choice.table_for(H100)
    weights: dict[tuple, list[int]] = {}
    for e in table["entries"]:
        weights.setdefault((e["N"], e["K"], e["dtype"], e["b_layout"]), []).append(e["M"])
    gaps = []
    for (N, K, dtype, layout), ms in weights.items():
        for lo, hi in itertools.pairwise(sorted(ms)):
            M = max(lo + 1, math.isqrt(lo * hi))
            c = choice.choose(M, N, K, dtype, layout, (9, 0), H100)
            if hi > M and c.mode != "torch":
                gaps.append((M, N, K, dtype, c.mode))
    return gaps


@pytest.mark.parametrize(("M", "N", "K", "dtype", "mode"), _table_gaps(), ids=str)
def test_a_candidate_chosen_between_two_table_entries_is_right_there(monkeypatch, M, N, K, dtype, mode):
    """The default as it runs on an H100 (this GPU named one, so the table answers), at an M the
    table did not measure: the candidate that held at both neighbours, right at this M."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the H100 table's configs are sm_90's")
    real = api.target_of(torch.device("cuda"))
    monkeypatch.setattr(api, "target_of", lambda device: dataclasses.replace(real, name=H100))
    a, b = _inputs(M, N, K, {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype], "t", seed=M)
    out = torch.full((M, N), float("nan"), dtype=a.dtype, device="cuda")
    launch = api.prepare("auto", a, b, out)
    assert launch.config["mode"] == mode and "held at both" in launch.config["why"]
    _assert_relaunches_match_reference(launch, out, a, b)


def test_auto_says_what_it_chose():
    a, b = _inputs(16, 4096, 14336, torch.bfloat16, "t")
    launch = api.prepare("auto", a, b, torch.empty(16, 4096, dtype=torch.bfloat16, device="cuda"))
    assert launch.config["mode"] in registry.names() and launch.config["why"]


@pytest.mark.parametrize(
    "cfg",
    [swapab.whole_k((9, 0), 16), swapab.whole_k((9, 0), 16, ring="shared", persistent=True), None],
    ids=["swapab whole-K", "swapab persistent", "splitk"],
)
def test_dependent_launches_wait_for_the_kernel_before(cfg, monkeypatch):
    """With programmatic dependent launch on (`GLUON_SURVEY_PDL`), a chain of launches in which
    each reads what the kernel just before it wrote: tokens written by a torch kernel, then three
    products back to back, each one's output the next one's tokens, its weight fresh. A launch that
    read before its wait would see the previous kernel's output half written, or the NaN poison;
    each link must match its reference (computed afterwards from the inputs it saw)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the configs are sm_90's")
    monkeypatch.setattr(splitk, "PDL", True)
    module = swapab if cfg is not None else splitk
    cfg = cfg or splitk.config_for((9, 0), 0)
    target = api.target_of(torch.device("cuda"))
    M, sizes = 5, (2056, 4136, 1544, 2056)  # K of link i is sizes[i], N is sizes[i + 1]
    x, _ = _inputs(M, 8, sizes[0], torch.bfloat16, "t", seed=1)
    weights = [
        _inputs(1, n, k, torch.bfloat16, "t", seed=2 + i)[1]
        for i, (k, n) in enumerate(itertools.pairwise(sizes))
    ]
    outs = [torch.full((M, n), float("nan"), dtype=torch.bfloat16, device="cuda") for n in sizes[1:]]
    source = torch.randn_like(x)
    launches = [
        module.prepare(a, w, out, target, cfg)
        for a, w, out in zip([x, *outs[:-1]], weights, outs, strict=True)
    ]
    assert all(launch.config["split_k"] >= 1 for launch in launches)
    for _ in range(2):  # the second round after every launch has been compiled: no host gaps
        for out in outs:
            out.fill_(float("nan"))
        x.copy_(source)  # the torch kernel right before the first launch writes its tokens
        for launch in launches:
            launch.fn()
        torch.cuda.synchronize()
        for a, w, out in zip([x, *outs[:-1]], weights, outs, strict=True):
            assert_close_to_reference(out, a, w)
        source = torch.randn_like(x)
