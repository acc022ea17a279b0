"""A transposed A read in place, on a Hopper GPU: with `api.TRANSPOSED_A_IN_PLACE` on (each test
turns it on), `matmul` hands an A in layout "t" (the view x.t() of a row-major [K, M] matrix) to
the rungs that read it in place (Blocked, Pipelined, persistent, warpspec's two designs, splitk)
without copying it. Every rung, all four layout combinations (A row or t, B row or t), fp16 and
bf16, ragged M (1, 7, 65, 300), N and K tails, a deep K that splitk cuts into slices and a shape
with several tiles per persistent program, into NaN-poisoned outputs checked against the fp32
reference (as tests/test_ladder_gpu.py does); and for every A "t" call, that A was read in place
(`prepare`'s config and `explain`), with no copy. Every other mode on A "t" too (gemv, slab and
swapab copy it to row-major, cuBLAS reads it in place, `auto` as the mode it picks), and every
mode with a bias on A "t", `explain` saying how A was read.

Run them with `pytest -m gpu tests/test_alayout_gpu.py` on an H100 (the kernels' compile checks
are tests/test_alayout_compile.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gluon_survey import api, ops
from gluon_survey.driver.check import reference, rel_error, tolerance
from gluon_survey.kernels import splitk, warpspec
from gluon_survey.launch import a_layout as layout_of
from gpu_checks import assert_close_to_reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("hopper")]

RUNGS = ["Blocked", "Pipelined", "persistent", "warpspec", "splitk"]
DTYPES = [torch.float16, torch.bfloat16]
LAYOUTS = [("row", "row"), ("row", "t"), ("t", "row"), ("t", "t")]  # (A, B)
# Ragged M with N and K tails (264 and 200 are no multiple of any tile); a K of 64 steps, which
# splitk cuts into slices; and enough tiles that a persistent program owns several.
SHAPES = [(1, 264, 200), (7, 264, 200), (65, 264, 200), (300, 264, 200), (65, 264, 4096), (1000, 5000, 264)]


@pytest.fixture
def hopper(monkeypatch):
    """A Hopper GPU, and the switch on for the test (a plan made with it off is never reused:
    the switch is part of the plan key)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("a transposed A is read in place on Hopper (sm_90) only")
    monkeypatch.setattr(api, "TRANSPOSED_A_IN_PLACE", True)


def _inputs(M, N, K, dtype, a_layout, b_layout, seed=0):
    """a [M, K]: row-major, or ("t") the view x.t() of a [K, M] matrix whose rows are padded to a
    multiple of 8 elements (so that TMA can describe it: 16-byte rows); b as in test_ladder_gpu."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    if a_layout == "t":
        ld = -(-M // 8) * 8
        x = torch.full((K, ld), float("nan"), device="cuda").to(dtype)  # the padding is never read
        x[:, :M] = torch.randn(K, M, generator=g, device="cuda").to(dtype)
        a = x[:, :M].t()
    else:
        a = torch.randn(M, K, generator=g, device="cuda").to(dtype)
    if b_layout == "t":
        b = torch.randn(N, K, generator=g, device="cuda").to(dtype).t()
    else:
        b = torch.randn(K, N, generator=g, device="cuda").to(dtype)
    return a, b


def _assert_read_in_place(rung, a, b, out):
    config = api.prepare(rung, a, b, out).config
    assert config.get("a_layout") == "t" and "a" not in config.get("aligned_copy", ""), config
    assert "A: t (transpose view of a [K,M] matrix), read in place" in api.explain(a, b, rung)


@pytest.mark.parametrize(("a_layout", "b_layout"), LAYOUTS, ids=lambda layout: layout)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("rung", RUNGS)
def test_rung_matches_reference_in_every_layout(rung, shape, dtype, a_layout, b_layout):
    a, b = _inputs(*shape, dtype, a_layout, b_layout, seed=hash((rung, shape)) % 1000)
    assert layout_of(a) == a_layout
    out = torch.full(shape[:2], float("nan"), dtype=dtype, device="cuda")
    assert api.matmul(a, b, kernel=rung, out=out) is out
    torch.cuda.synchronize()
    assert_close_to_reference(out, a, b)
    if a_layout == "t":
        _assert_read_in_place(rung, a, b, out)
        out.fill_(float("nan"))  # the driver's path: prepare, then the launch alone
        api.prepare(rung, a, b, out).fn()
        torch.cuda.synchronize()
        assert_close_to_reference(out, a, b)


@pytest.mark.parametrize(
    "cfg",
    [warpspec.PINGPONG, warpspec.COOPERATIVE, warpspec.PINGPONG_MID],
    ids=["pingpong", "cooperative", "pingpong-mid"],
)
@pytest.mark.parametrize("b_layout", ["row", "t"])
@pytest.mark.parametrize("shape", [(300, 264, 200), (1000, 5000, 264), (100, 5000, 264)], ids=str)
def test_warpspec_designs_read_a_transposed_a(cfg, b_layout, shape):
    """Both designs whatever K (matmul picks cooperative from K = 8192 only), on the [K, M] matrix
    itself: the descriptor's base is A, no copy can be made."""
    a, b = _inputs(*shape, torch.bfloat16, "t", b_layout, seed=5)
    out = torch.full(shape[:2], float("nan"), dtype=torch.bfloat16, device="cuda")
    warpspec.prepare(a, b, out, api.target_of(a.device), cfg).fn()
    torch.cuda.synchronize()
    assert_close_to_reference(out, a, b)


@pytest.mark.parametrize("split", [1, 4])
@pytest.mark.parametrize("b_layout", ["row", "t"])
def test_splitk_reduces_slices_of_a_transposed_a(split, b_layout):
    a, b = _inputs(65, 264, 4096, torch.float16, "t", b_layout, seed=3)
    out = torch.full((65, 264), float("nan"), dtype=torch.float16, device="cuda")
    cfg = dataclasses.replace(splitk.CONFIGS[9], SPLIT_K=split)
    launch = splitk.prepare(a, b, out, api.target_of(a.device), cfg)
    assert launch.config["split_k"] == split
    launch.fn()
    torch.cuda.synchronize()
    assert_close_to_reference(out, a, b)


@pytest.mark.parametrize("rung", RUNGS)
def test_a_repeated_call_reads_the_new_transposed_a(rung):
    """The plan of a key, made on the first call, reads the next call's A (no stale descriptor)."""
    M, N, K = 300, 520, 640
    a, b = _inputs(M, N, K, torch.float16, "t", "t", seed=1)
    out = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")
    api.matmul(a, b, kernel=rung, out=out)
    a2, _ = _inputs(M, N, K, torch.float16, "t", "t", seed=2)
    out.fill_(float("nan"))
    api.matmul(a2, b, kernel=rung, out=out)
    torch.cuda.synchronize()
    assert_close_to_reference(out, a2, b)


def test_the_weight_gradient_reads_the_transposed_activations():
    """grad_w = (grad^T @ x)^T through the operator: grad^T is a transposed A, read in place."""
    x = torch.randn(300, 264, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(520, 264, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = ops.matmul(x, w.t(), "persistent")
    grad = torch.randn_like(y)
    y.backward(grad)
    assert layout_of(grad.t()) == "t"
    assert "read in place" in api.explain(grad.t(), x.detach(), "persistent")
    torch.testing.assert_close(w.grad.float(), grad.float().t() @ x.detach().float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(x.grad.float(), grad.float() @ w.detach().float(), rtol=2e-2, atol=2e-2)


# The modes that copy a transposed A to row-major (the few-token ones), cuBLAS (reads it in
# place: a transposed operand) and `auto` (None: whichever it picks), beside the rungs above.
OTHER_MODES = ["gemv", "slab", "swapab", "torch", None]
IN_PLACE = {*RUNGS, "torch"}  # on Hopper, for 16-bit operands


@pytest.mark.parametrize("mode", [*RUNGS, *OTHER_MODES], ids=str)
def test_a_transposed_a_with_and_without_a_bias(mode):
    """Every mode on A "t", both B layouts, M = 1, 7, 65, 300 with N and K tails, with a bias
    (added in the epilogue, or cuBLAS's torch.addmm) and without (the rungs above without one are
    the main test's); NaN-poisoned outputs against the fp32 product plus the bias. `explain` says
    how A was read: in place by the rungs and cuBLAS (then with no aligned copy: the [K, M] matrix
    has 16-byte rows), copied to row-major by the few-token modes; for auto, as the mode it runs."""
    biases = [True] if mode in RUNGS else [True, False]
    dtypes = [torch.float16, torch.bfloat16]
    for i, M in enumerate((1, 7, 65, 300)):
        if mode == "gemv" and M > 7:
            continue  # one token is its ground (more run correct, slowly: test_ladder_gpu.py)
        dtype = dtypes[i % 2]
        for b_layout in ("row", "t"):
            a, b = _inputs(M, 264, 200, dtype, "t", b_layout, seed=M)
            assert layout_of(a) == "t"
            for with_bias in biases:
                bias = torch.randn(264, device="cuda").to(dtype) if with_bias else None
                out = torch.full((M, 264), float("nan"), dtype=dtype, device="cuda")
                assert api.matmul(a, b, kernel=mode, out=out, bias=bias) is out
                torch.cuda.synchronize()
                what = f"{mode} M={M} B={b_layout} bias={with_bias}"
                ref = reference(a, b, bias=bias)
                cublas = torch.matmul(a, b) if bias is None else torch.addmm(bias, a, b)
                assert not torch.isnan(out).any(), f"{what}: NaN, a tile was never written"
                err, cublas_err = rel_error(out, ref), rel_error(cublas, ref)
                assert err <= tolerance(cublas_err, dtype), f"{what}: {err:.3e} vs cuBLAS {cublas_err:.3e}"
            text = api.explain(a, b, mode, bias=bias)
            runs = mode
            if mode is None:  # what auto chose: its "runs:" line
                runs = next(line.split()[1] for line in text.splitlines() if line.startswith("runs: "))
            how = "read in place" if runs in IN_PLACE else "copied to row-major"
            assert f"A: t (transpose view of a [K,M] matrix), {how}" in text, text
            if runs in IN_PLACE:
                assert "aligned copy" not in text, text
