"""The fp8 rungs on a real GPU: e4m3 operands with per-tensor and row-wise scales, ragged shapes,
NaN-poisoned outputs, against the fp32 product of the upcast operands times the scales, with the
tolerance taken from cuBLAS fp8's own error (`torch._scaled_mm`) on the same inputs; the small-M
rungs' split-K reduction (forced uneven splits, replays, CUDA graphs); every fp8 config `tune`
may pick on ragged M (1 to 3000); and every bad fp8 input getting its error. Run on the GPU
machine: pytest -m gpu."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gluon_survey import api, registry
from gluon_survey.driver.check import rel_error
from gluon_survey.kernels import gemv, persistent, pipelined, slab, splitk, swapab, warpspec
from gluon_survey.launch import Scales
from gpu_checks import cublas_fp8

pytestmark = pytest.mark.gpu

FP8 = torch.float8_e4m3fn
# torch.compile autotunes each shape for tens of seconds: its own test below takes a few shapes.
DENSE_FP8 = [m.name for m in registry.MODES if m.fp8 and m.kind != "choice" and not m.grouped]
FP8_MODES = [m for m in DENSE_FP8 if m != "torch.compile"] + ["auto"]
# Tile-aligned, ragged in M and N, one token, K tails (K a multiple of 16: fp8 rows of 16 bytes),
# deep K (the cooperative design from K = 8192); decode shapes whose few tiles splitk and swapab
# cut into K slices summed by the reduction (16 x 8192 x 8192: 64 or 128 tiles; 7 x 520: 5 ragged
# weight tiles).
SHAPES = [
    (256, 512, 256),
    (1, 4096, 4096),
    (65, 520, 528),
    (300, 1000, 272),
    (1000, 3000, 8192),
    (127, 264, 16),
    (16, 8192, 8192),
    (7, 520, 4096),
    (64, 1000, 2048),
]
SPLIT_K_MODES = ["splitk", "swapab"]


@pytest.fixture(autouse=True)
def _needs_hopper():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if torch.cuda.get_device_capability()[0] not in (9, 10):
        pytest.skip("the fp8 rungs need sm_90 or sm_100")


def quantize(x: torch.Tensor, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x (fp32) -> (e4m3 values, fp32 scale) with x ~ values * scale: amax / 448 per tensor or per row."""
    amax = x.abs().amax(dim=1, keepdim=True) if rowwise else x.abs().amax()
    scale = (amax / 448.0).clamp(min=1e-12).float()
    return (x / scale).to(FP8), scale


def fp8_inputs(M, N, K, scaling, seed=0):
    """a [M, K], b = w.t() of an [N, K] weight, and their scales in `torch._scaled_mm`'s shapes."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a32 = torch.randn(M, K, generator=g, device="cuda")
    w32 = torch.randn(N, K, generator=g, device="cuda") * 0.5
    a, sa = quantize(a32, scaling == "row")
    w, sw = quantize(w32, scaling == "row")
    if scaling == "row":
        return a, w.t(), sa, sw.t().contiguous()  # [M, 1] and [1, N]
    return a, w.t(), sa, sw


def fp8_reference(a, b, sa, sb) -> torch.Tensor:
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return (a.float() @ b.float()) * sa * sb
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def assert_close(out, a, b, sa, sb):
    ref = fp8_reference(a, b, sa, sb)
    cublas = cublas_fp8(a, b, sa, sb)
    cublas_err = rel_error(cublas, ref)
    err = rel_error(out, ref)
    assert not torch.isnan(out).any(), "output has NaN: some tile was never written"
    assert err <= 2 * cublas_err + 2.0**-8 / 4, f"rel error {err:.3e} vs cuBLAS fp8 {cublas_err:.3e}"


@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", FP8_MODES)
def test_fp8_matches_reference(mode, shape, scaling):
    M, N, K = shape
    if mode == "torch" and (N % 16 or K % 16):
        pytest.skip("cuBLAS fp8 takes N and K in multiples of 16 only")
    a, b, sa, sb = fp8_inputs(M, N, K, scaling, seed=hash((mode, shape)) % 1000)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    result = api.matmul(a, b, kernel=mode, out=out, scale_a=sa, scale_b=sb)
    torch.cuda.synchronize()
    assert result is out
    assert_close(out, a, b, sa, sb)


@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("shape", [(300, 1008, 272), (1, 4096, 4096)], ids=lambda s: "x".join(map(str, s)))
def test_fp8_torch_compile_matches_reference(shape, scaling):
    """The torch.compile baseline's compiled `torch._scaled_mm`: ragged M, one token, both scalings;
    its product comes back as a new tensor and `out` is filled from it."""
    M, N, K = shape
    a, b, sa, sb = fp8_inputs(M, N, K, scaling, seed=7)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    result = api.matmul(a, b, kernel="torch.compile", out=out, scale_a=sa, scale_b=sb)
    torch.cuda.synchronize()
    assert result is out
    assert_close(out, a, b, sa, sb)


@pytest.mark.parametrize("mode", ["Pipelined", "persistent", "warpspec", *SPLIT_K_MODES])
def test_fp8_repeated_calls_use_the_new_scales(mode):
    """A cached plan takes each call's scales (and tensors): a second call with other values gives
    the other answer; fp16 output too."""
    a, b, sa, sb = fp8_inputs(300, 520, 1024, "row", seed=3)
    first = api.matmul(a, b, kernel=mode, scale_a=sa, scale_b=sb)
    a2, b2, sa2, sb2 = fp8_inputs(300, 520, 1024, "row", seed=4)
    second = api.matmul(a2, b2, kernel=mode, scale_a=sa2 * 2, scale_b=sb2)
    half = api.matmul(a, b, kernel=mode, scale_a=sa, scale_b=sb, out_dtype=torch.float16)
    torch.cuda.synchronize()
    assert first.dtype == torch.bfloat16 and half.dtype == torch.float16
    assert_close(first, a, b, sa, sb)
    assert_close(second, a2, b2, sa2 * 2, sb2)
    assert rel_error(half.float(), fp8_reference(a, b, sa, sb)) < 2e-3


@pytest.mark.parametrize("mode", ["warpspec", *SPLIT_K_MODES])
def test_fp8_in_a_cuda_graph(mode):
    """splitk and swapab split K here (32 and 128 tiles): each replay finds its counters at 0."""
    a, b, sa, sb = fp8_inputs(64, 4096, 4096, "tensor", seed=5)
    out = torch.empty(64, 4096, dtype=torch.bfloat16, device="cuda")
    api.matmul(a, b, kernel=mode, out=out, scale_a=sa, scale_b=sb)  # plan and compile first
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        api.matmul(a, b, kernel=mode, out=out, scale_a=sa, scale_b=sb)
    out.fill_(float("nan"))
    sa.mul_(3.0)  # the graph reads the scale tensors at replay
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, a, b, sa, sb)


@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("split", [1, 3, 5])
@pytest.mark.parametrize("module", [splitk, swapab], ids=SPLIT_K_MODES)
def test_fp8_forced_splits_scale_the_sum_and_reset_their_counters(module, split, scaling):
    """fp8 through both epilogues, SPLIT_K 1 (no reduction) and uneven slices (23 K steps of 128,
    the last partial: 8,8,7 or 5,5,5,5,3); the same launch three times on fresh operands and
    scales, each finding every tile counter back at 0 and reading the scales anew."""
    M, N, K = 40, 1000, 128 * 22 + 48
    a, b, sa, sb = fp8_inputs(M, N, K, scaling, seed=split)
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    cfg = dataclasses.replace(
        module.FP8_CONFIGS[torch.cuda.get_device_capability()[0]], SPLIT_K=split, MIN_STEPS=1
    )
    scales = Scales(sa.view(-1), sb.view(-1), scaling)
    launch = module.prepare(a, b, out, api.target_of(a.device), cfg, scales=scales)
    assert launch.config["split_k"] == split and launch.config["BLOCK_K"] == 128
    for i in range(3):
        new_a, _, new_sa, _ = fp8_inputs(M, N, K, scaling, seed=10 * split + i)
        a.copy_(new_a)
        sa.copy_(new_sa * (i + 1))
        out.fill_(float("nan"))
        launch.fn()
        torch.cuda.synchronize()
        assert_close(out, a, b, sa, sb)


@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("rows", slab.SLABS)
def test_fp8_slabs_scale_every_token_tile(rows, scaling):
    """Each slab height at each token tile (M = 1, 9, 17, 63, 65), a ragged N, K steps of 128 with
    a tail: the operands widened to fp16 for mma.sync, the scales applied once to C's tile."""
    cfg = dataclasses.replace(
        slab.FP8_CONFIGS[torch.cuda.get_device_capability()[0]], BLOCK_N=rows, num_warps=rows // 16
    )
    for M in (1, 9, 17, 63, 65):
        a, b, sa, sb = fp8_inputs(M, 1000, 128 * 9 + 48, scaling, seed=M + rows)
        out = torch.full((M, 1000), float("nan"), dtype=torch.bfloat16, device="cuda")
        scales = Scales(sa.view(-1), sb.view(-1), scaling)
        slab.prepare(a, b, out, api.target_of(a.device), cfg, scales=scales).fn()
        torch.cuda.synchronize()
        assert_close(out, a, b, sa, sb)


WHOLE_K_TILES = [(ring, t) for ring, (_, widths) in swapab.RINGS.items() for t in sorted(widths)]


@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize(("ring", "tokens"), WHOLE_K_TILES, ids=[f"{r}-{t}" for r, t in WHOLE_K_TILES])
def test_fp8_whole_k_swapab_tiles_scale_the_tile(ring, tokens, scaling):
    """swapab's whole-K fp8 candidates (K steps of 128 to 512 bytes, no split), on every ring (64-
    and 128-row tiles): M up to the tile and one token past it, a ragged N, a K tail; the scales
    applied once to C's tile."""
    cfg = swapab.whole_k(torch.cuda.get_device_capability(), tokens, fp8=True, ring=ring)
    assert (1, tokens, 1, swapab.RINGS[ring][0]) == (cfg.SPLIT_K, cfg.BLOCK_N, cfg.ELEM_BYTES, cfg.BLOCK_M)
    for M in (1, tokens + 1):
        a, b, sa, sb = fp8_inputs(M, 1000, 512 * 4 + 48, scaling, seed=M + tokens)
        out = torch.full((M, 1000), float("nan"), dtype=torch.bfloat16, device="cuda")
        scales = Scales(sa.view(-1), sb.view(-1), scaling)
        launch = swapab.prepare(a, b, out, api.target_of(a.device), cfg, scales=scales)
        assert launch.config["split_k"] == 1
        launch.fn()
        torch.cuda.synchronize()
        assert_close(out, a, b, sa, sb)


PERSISTENT_TILES = [c for c in swapab.candidates((9, 0), fp8=True).values() if c.PERSISTENT]


@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("cfg", PERSISTENT_TILES, ids=[c.label for c in PERSISTENT_TILES])
def test_fp8_persistent_whole_k_tiles_scale_every_tile(cfg, scaling):
    """swapab's persistent whole-K fp8 candidates on a weight of 301 64-row tiles (each program
    walks several): M = 1 and one token past the tile, a ragged N, a K tail; each tile's scales
    applied once, to the tile they belong to."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the candidates are sm_90's")
    N = 64 * 300 + 40
    for M in (1, cfg.BLOCK_N + 1):
        a, b, sa, sb = fp8_inputs(M, N, 512 * 4 + 48, scaling, seed=M)
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        target = api.target_of(a.device)
        launch = swapab.prepare(a, b, out, target, cfg, scales=Scales(sa.view(-1), sb.view(-1), scaling))
        assert launch.config["grid"] < -(-N // cfg.BLOCK_M) * -(-M // cfg.BLOCK_N)
        launch.fn()
        torch.cuda.synchronize()
        assert_close(out, a, b, sa, sb)


# Every fp8 config `tune` may pick (each fp8 mode's `candidates(..., fp8=True)`) but those the
# tests above run on every token tile already: slab's slab heights and swapab's whole-K tiles.
FP8_CANDIDATES = [
    pytest.param(module, cfg, id=f"{module.__name__.rsplit('.', 1)[1]} {cfg.label}")
    for module in (gemv, slab, swapab, splitk, persistent, warpspec, pipelined)
    for cfg in module.candidates((9, 0), fp8=True).values()
    if not (module is swapab and cfg.SPLIT_K == 1)
    and not (module is slab and cfg.BLOCK_K == slab.FP8_CONFIGS[9].BLOCK_K)
]
# The acceptance token counts, each kernel on its ground: gemv a few tokens, slab and swapab up to
# a few hundred, the others all.
FP8_MOST_M = {gemv: 7, slab: 300, swapab: 300}


@pytest.mark.parametrize(("module", "cfg"), FP8_CANDIDATES)
def test_every_fp8_candidate_on_ragged_shapes(module, cfg):
    """M = 1, 7, 63, 65, 300, 3000 (up to FP8_MOST_M), a ragged N (1000: no multiple of any tile)
    and a K tail (1040: 8 K steps of 128 and 16 more), per-tensor and row-wise scales in turn, into
    NaN-poisoned bf16 outputs, against the dequantized fp32 product."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the candidates are sm_90's")
    most = FP8_MOST_M.get(module, 3000)
    for i, M in enumerate(m for m in (1, 7, 63, 65, 300, 3000) if m <= most):
        scaling = ("tensor", "row")[i % 2]
        a, b, sa, sb = fp8_inputs(M, 1000, 1040, scaling, seed=M)
        out = torch.full((M, 1000), float("nan"), dtype=torch.bfloat16, device="cuda")
        scales = Scales(sa.reshape(-1), sb.reshape(-1), scaling)
        module.prepare(a, b, out, api.target_of(a.device), cfg, scales=scales).fn()
        torch.cuda.synchronize()
        assert_close(out, a, b, sa, sb)


def _q(*shape):
    return torch.randn(*shape, device="cuda").to(FP8)


def _one():
    return torch.ones((), device="cuda")


BAD_FP8 = [
    pytest.param(
        lambda: (_q(8, 32), _q(16, 32).t(), {}), TypeError, "need dequantization scales", id="no-scales"
    ),
    pytest.param(
        lambda: (_q(8, 32), _q(16, 32).t(), {"scale_a": _one()}), TypeError, "scale_b=None", id="one-scale"
    ),
    pytest.param(
        lambda: (_q(8, 32), _q(32, 16), {"scale_a": _one(), "scale_b": _one()}),
        ValueError,
        "K-major",
        id="row-major-b",
    ),
    pytest.param(
        lambda: (_q(8, 32), _q(16, 32).t(), {"scale_a": _one().half(), "scale_b": _one()}),
        TypeError,
        "float32",
        id="fp16-scale",
    ),
    pytest.param(
        lambda: (_q(8, 32), _q(16, 32).t(), {"scale_a": torch.ones(()), "scale_b": _one()}),
        ValueError,
        "scale_a is on cpu",
        id="cpu-scale",
    ),
    pytest.param(
        lambda: (
            _q(8, 32),
            _q(16, 32).t(),
            {"scale_a": torch.ones(8, 1, device="cuda"), "scale_b": _one()},
        ),
        ValueError,
        "row-wise",
        id="mixed-scalings",
    ),
    pytest.param(
        lambda: (
            _q(8, 32),
            _q(16, 32).t(),
            {"scale_a": torch.ones(8, 1, device="cuda"), "scale_b": torch.ones(16, 1, device="cuda")},
        ),
        ValueError,
        r"got scale_a \(8, 1\) and scale_b \(16, 1\)",
        id="wrong-scale-shape",
    ),
    pytest.param(
        lambda: (
            torch.randn(8, 32, device="cuda").to(torch.float8_e5m2),
            torch.randn(16, 32, device="cuda").to(torch.float8_e5m2).t(),
            {"scale_a": _one(), "scale_b": _one()},
        ),
        TypeError,
        "float8_e4m3fn",
        id="e5m2",
    ),
    pytest.param(
        lambda: (
            _q(8, 32),
            torch.randn(16, 32, device="cuda").to(torch.float8_e5m2).t(),
            {"scale_a": _one(), "scale_b": _one()},
        ),
        TypeError,
        "float8_e4m3fn",
        id="mixed-fp8",
    ),
    pytest.param(
        lambda: (
            torch.randn(8, 32, device="cuda").half(),
            torch.randn(16, 32, device="cuda").half().t(),
            {"scale_a": _one(), "scale_b": _one()},
        ),
        TypeError,
        "fp8 operands only|float8_e4m3fn operands only",
        id="scales-on-fp16",
    ),
    pytest.param(
        lambda: (
            _q(8, 32),
            _q(16, 32).t(),
            {"scale_a": _one(), "scale_b": _one(), "out_dtype": torch.float32},
        ),
        TypeError,
        "out_dtype",
        id="fp32-out",
    ),
]


@pytest.mark.parametrize(("make", "error", "match"), BAD_FP8)
def test_bad_fp8_inputs_get_clear_errors(make, error, match):
    a, b, kwargs = make()
    with pytest.raises(error, match=match):
        api.matmul(a, b, kernel="warpspec", **kwargs)
    with pytest.raises(error, match=match):
        api.prepare("warpspec", a, b, **kwargs)
    with pytest.raises(error, match=match):  # the torch mode hands what _scaled_mm refuses to the checks
        api.matmul(a, b, kernel="torch", **kwargs)


def test_the_torch_modes_fp8_call_is_scaled_mm_alone(monkeypatch):
    """`matmul(kernel="torch")` with fp8 operands calls `torch._scaled_mm` once, with the caller's
    tensors, and builds no plan (module docstring of gluon_survey.api: no key per call)."""
    a, b, sa, sb = fp8_inputs(48, 512, 256, "row", seed=5)
    calls = []
    real = torch._scaled_mm

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    api.clear_plans()
    nan = torch.full((48, 512), float("nan"), dtype=torch.float16, device="cuda")
    bias = torch.randn(512, device="cuda", dtype=torch.float16)
    for n, (out, with_bias) in enumerate(((None, False), (nan, False), (nan, True))):
        dtype = torch.bfloat16 if out is None else torch.float16
        extra = {"bias": bias} if with_bias else {}
        got = api.matmul(a, b, kernel="torch", out=out, scale_a=sa, scale_b=sb, out_dtype=dtype, **extra)
        want = real(a, b, sa, sb, out_dtype=dtype, use_fast_accum=True, **extra)
        assert got.dtype == dtype and torch.equal(got, want) and (out is None or got is out)
        args, kwargs = calls[-1]  # the matmul's (the reference calls `_scaled_mm` itself)
        assert args[0] is a and args[1] is b and args[2] is sa and args[3] is sb
        assert kwargs["out"] is out and kwargs["use_fast_accum"] and len(calls) == n + 1
        assert kwargs.get("bias") is (bias if with_bias else None)
    assert not api._PLANS


@pytest.mark.parametrize("mode", [m.name for m in registry.MODES if not m.fp8 and not m.grouped])
def test_modes_without_fp8_say_which_have_it(mode):
    a, b, sa, sb = fp8_inputs(16, 256, 256, "tensor")
    with pytest.raises(TypeError, match=r"no fp8 kernel.*warpspec"):
        api.matmul(a, b, kernel=mode, scale_a=sa, scale_b=sb)


@pytest.mark.parametrize(
    "scales",
    ["row", "row-strided", "tensor-0d", "tensor-1", "tensor-1x1"],
)
def test_fp8_cublas_calls_scaled_mm_with_the_callers_scales(scales, monkeypatch):
    """`matmul`'s cuBLAS fp8 call (the `torch` mode, and `auto` where it picks cuBLAS) is
    `torch._scaled_mm` on the caller's own scale tensors, as a user would call it: no flattened
    copy or view per call (each cost host time at host-bound sizes), and the same result bit for
    bit. Scales not in `_scaled_mm`'s layout (a strided column) take the general path, still
    right. How fast that is against `_scaled_mm` called directly: scripts/fp8_path_probe.py."""
    M, N, K = 96, 4096, 4096
    a, b, sa, sb = fp8_inputs(M, N, K, "row" if scales.startswith("row") else "tensor", seed=11)
    if scales == "row-strided":
        sa = torch.cat([sa, sa], dim=1)[:, :1]  # [M, 1] with row stride 2
        assert not sa.is_contiguous()
    elif scales == "tensor-1":
        sa, sb = sa.reshape(1), sb.reshape(1)
    elif scales == "tensor-1x1":
        sa, sb = sa.reshape(1, 1), sb.reshape(1, 1)
    direct = torch._scaled_mm(a, b, sa.contiguous(), sb, out_dtype=torch.bfloat16, use_fast_accum=True)
    seen = []
    real = torch._scaled_mm

    def spy(*args, **kwargs):
        seen.append(args[2:4])
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    for kernel in ("torch", "torch", None):  # the first call builds the plan; `auto` picks cuBLAS here
        if kernel is None and "runs: torch " not in api.explain(a, b, scale_a=sa, scale_b=sb):
            continue
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        api.matmul(a, b, kernel=kernel, out=out, scale_a=sa, scale_b=sb)
        torch.cuda.synchronize()
        assert torch.equal(out, direct)
        if scales != "row-strided":
            assert seen[-1][0] is sa and seen[-1][1] is sb
