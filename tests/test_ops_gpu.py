"""`matmul` as a call that costs nothing, on a real GPU: cached plans on new data, CUDA-graph capture
(also of the aligned-copy path), the `gluon_survey::matmul` operator under torch.compile(fullgraph)
and autograd, and `gluon_survey.Linear` against torch.nn.functional.linear. Every result is checked
against the fp32 product of the same inputs with the driver's rule (`driver.check.tolerance`), on
fresh random inputs and NaN-poisoned outputs. Also: a transposed A and a bias replayed in CUDA
graphs; a cached plan that runs cuBLAS calling torch.mm / torch.addmm directly (`out` given or
not, a bias or none); the operator's gradients on every rung in all four A and B layouts, with
and without a bias, against fp32; and `Linear`'s three paths: eager inference (`F.linear` from a
layout's second call where matmul runs cuBLAS, bit for bit the first call's result), eager
training (`_EagerMatmul`: no operand copied, grad^T read in place by cuBLAS, the whole step
captured in a CUDA graph) and torch.compile(fullgraph=True) training (the operator, also in
reduce-overhead's CUDA-graph trees). Run on the GPU machine: pytest -m gpu."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
import triton
from triton import knobs

import gluon_survey
from bad_inputs import BAD_INPUTS
from gluon_survey import api, ops, registry
from gluon_survey.driver.check import reference, rel_error, tolerance
from gluon_survey.kernels.plan import ENCODED_PER_SLOT

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("hopper_or_blackwell")]

RUNGS = [m.name for m in registry.MODES if m.kind == "gluon" and not m.grouped]  # dense rungs
KERNELS = [*RUNGS, "torch", None]  # None: matmul's default
DTYPES = [torch.float16, torch.bfloat16]


def _randn(*shape, dtype=torch.float16, generator=None):
    return torch.randn(*shape, device="cuda", generator=generator).to(dtype)


def _nan(*shape, dtype=torch.float16):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


def _assert_product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    """out is a @ b within the driver's tolerance of the fp32 product (cuBLAS's own error as the
    yardstick), and no element was left unwritten (NaN)."""
    torch.cuda.synchronize()
    ref = reference(a, b)
    cublas_err = rel_error(torch.matmul(a, b), ref)
    err = rel_error(out, ref)
    assert not torch.isnan(out).any(), f"{what}: NaN in the output: some tile was never written"
    assert err <= tolerance(cublas_err, a.dtype), f"{what}: rel error {err:.3e} vs cuBLAS {cublas_err:.3e}"


def _assert_close(out: torch.Tensor, ref: torch.Tensor, cublas: torch.Tensor, dtype, what: str = "") -> None:
    """out within the tolerance of the fp32 `ref`, measured against cuBLAS's result `cublas`."""
    torch.cuda.synchronize()
    cublas_err = rel_error(cublas, ref)
    err = rel_error(out, ref)
    assert err <= tolerance(cublas_err, dtype), f"{what}: rel error {err:.3e} vs cuBLAS {cublas_err:.3e}"


def _operands(M, N, K, dtype, layout, g=None):
    a = _randn(M, K, dtype=dtype, generator=g)
    b = (
        _randn(N, K, dtype=dtype, generator=g).t()
        if layout == "t"
        else _randn(K, N, dtype=dtype, generator=g)
    )
    return a, b


# --------------------------------------------------------------------------------------------------
# The plan cache on new data


@pytest.mark.parametrize("layout", ["row", "t"])
@pytest.mark.parametrize("kernel", KERNELS, ids=str)
def test_a_cached_plan_computes_each_calls_new_data(kernel, layout):
    """New tensors of one key, and the same tensors with new values: every answer is the new one."""
    g = torch.Generator(device="cuda").manual_seed(1)
    M, N, K = 300, 520, 264
    before = len(api._PLANS)
    for _ in range(3):  # new tensors, same key
        a, b = _operands(M, N, K, torch.float16, layout, g)
        out = _nan(M, N)
        assert api.matmul(a, b, kernel=kernel, out=out) is out
        _assert_product(out, a, b, f"{kernel} new tensors")
    for _ in range(2):  # the same tensors, new values
        a.copy_(_randn(M, K, generator=g))
        b.copy_(_randn(*b.shape, generator=g))
        out.fill_(float("nan"))
        api.matmul(a, b, kernel=kernel, out=out)
        _assert_product(out, a, b, f"{kernel} new values")
    y = api.matmul(a, b, kernel=kernel)  # no out: a plan of its own, a new result each call
    assert y is not api.matmul(a, b, kernel=kernel)
    _assert_product(y, a, b, f"{kernel} no out")
    assert len(api._PLANS) - before <= 2  # one plan with out, one without (if not there already)


def test_unaligned_operands_and_output_through_a_cached_plan():
    g = torch.Generator(device="cuda").manual_seed(2)
    for _ in range(2):
        big = _randn(300, 301, generator=g)
        a = big[:, 1:200]  # base 2 bytes off, row stride 602 bytes: copied per call
        b = _randn(199, 96, generator=g)
        out_buf = _nan(300, 97)
        out = out_buf[:, :96]  # row stride 194 bytes: computed aside, copied back
        for rung in RUNGS:
            out.fill_(float("nan"))
            assert api.matmul(a, b, kernel=rung, out=out) is out
            _assert_product(out, a, b, rung)
        assert torch.isnan(out_buf[:, 96]).all(), "the padding column was written"


def _aligned_and_off(rows: int, cols: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Two [rows, cols] views of one buffer with the same strides: one 16-byte aligned, one 2 bytes off."""
    flat = _randn(rows * cols + 1, generator=generator)
    return flat[: rows * cols].view(rows, cols), flat[1:].view(rows, cols)


@pytest.mark.parametrize("operand", ["a", "b", "out"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_misaligned_base_under_a_cached_key_gets_its_own_plan(kernel, operand):
    """Same shapes and strides, one base 2 bytes off: both have one key (it holds no address).
    The aligned plan's launch refuses the base before launching (a rung's where it reads the
    address, the others' in `matmul`), and the call runs the plan that copies that operand;
    misaligned first or aligned first, with the output allocated or given."""
    g = torch.Generator(device="cuda").manual_seed(3)
    M, N, K = (8, 264, 200) if kernel == "gemv" else (72, 264, 200)
    shapes = {"a": (M, K), "b": (N, K), "out": (M, N)}
    aligned, off = _aligned_and_off(*shapes[operand], g)
    tensors = {"a": _randn(M, K, generator=g), "b": _randn(N, K, generator=g).t(), "out": _nan(M, N)}
    for give_out in (operand == "out", True):
        for choice in (off, aligned, aligned, off):
            given = tensors | {operand: choice.t() if operand == "b" else choice}
            given["out"].fill_(float("nan"))
            out = given["out"] if give_out else None
            result = api.matmul(given["a"], given["b"], kernel=kernel, out=out)
            assert out is None or result is out
            base = "off" if choice is off else "aligned"
            what = f"{kernel}, {operand} {base}, out {'given' if give_out else 'new'}"
            _assert_product(result, given["a"], given["b"], what)


TMA_RUNGS = [r for r in RUNGS if r != "gemv"]  # the rungs whose plans launch TMA descriptors


def _rung_plan(kernel, a, b, out):
    """The `kernels.plan.Plan` that `matmul(a, b, kernel=kernel, out=out)` launches."""
    call = api._PLANS[api._plan_key(kernel, a, b, out)]
    return call.plan.run.plan  # MatmulPlan.run is the rung plan's `launch`


@pytest.mark.parametrize("kernel", TMA_RUNGS)
def test_descriptors_encoded_per_address_stay_right_past_the_cache(kernel):
    """On triton 3.6 a plan keeps each operand's encoded descriptor per base address
    (`kernels.plan.Plan.encoded`): many live buffers (more than it keeps: the cache starts over), rows
    of one buffer at different offsets, and addresses reused by other data all get their product."""
    g = torch.Generator(device="cuda").manual_seed(4)
    M, N, K = 72, 264, 200
    b = _randn(N, K, generator=g).t()
    count = ENCODED_PER_SLOT + 6
    rows = _randn(M + count * 8, K, generator=g)
    inputs = [rows[8 * i : 8 * i + M] for i in range(count)]  # 16-byte-aligned bases, one stride
    outs = [_nan(M, N) for _ in range(count)]
    for _ in range(2):
        for a, out in zip(inputs, outs, strict=True):
            out.fill_(float("nan"))
            assert api.matmul(a, b, kernel=kernel, out=out) is out
            _assert_product(out, a, b, f"{kernel} at offset {a.data_ptr() - rows.data_ptr()}")
    plan = _rung_plan(kernel, inputs[0], b, outs[0])
    if triton.__version__.startswith("3.6."):
        assert plan.launcher.raw is not None, "triton 3.6 launches through the encoded path"
    assert plan.launcher.stream[1]() == torch.cuda.current_device()
    assert all(len(cache) <= ENCODED_PER_SLOT for cache in plan.encoded)
    for _ in range(3):  # results freed and allocated again: addresses reused by new data
        a = _randn(M, K, generator=g)
        _assert_product(api.matmul(a, b, kernel=kernel), a, b, f"{kernel} allocated")


@pytest.mark.parametrize("bare", [False, True], ids=["matmul", "bare"])
def test_a_launch_hook_sees_every_launch(bare):
    """With a launch hook set (a profiler's), launches take Triton's own path, which calls it."""
    g = torch.Generator(device="cuda").manual_seed(5)
    a, b = _operands(64, 256, 128, torch.float16, "t", g)
    out = _nan(64, 256)
    launch = (
        api.prepare("warpspec", a, b, out).fn
        if bare
        else lambda: api.matmul(a, b, kernel="warpspec", out=out)
    )
    launch()  # compiled, and the fast path set up
    seen = []
    hook = knobs.runtime.launch_enter_hook  # triton 3.6: an empty chain of hooks
    knobs.runtime.launch_enter_hook = lambda metadata: seen.append(metadata)
    try:
        out.fill_(float("nan"))
        launch()
    finally:
        knobs.runtime.launch_enter_hook = hook
    assert len(seen) == 1
    _assert_product(out, a, b, "hooked")


# --------------------------------------------------------------------------------------------------
# CUDA graphs


def _capture(fn):
    """fn() captured in a CUDA graph, after a warm-up call on a side stream (compiles the kernel,
    builds the plan), as torch.cuda.graphs' documentation prescribes."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


@pytest.mark.parametrize("layout", ["row", "t"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("kernel", KERNELS, ids=str)
def test_matmul_replays_in_a_cuda_graph_on_fresh_inputs(kernel, dtype, layout):
    g = torch.Generator(device="cuda").manual_seed(4)
    M, N, K = 257, 384, 520
    a, b = _operands(M, N, K, dtype, layout, g)
    out = _nan(M, N, dtype=dtype)
    graph, result = _capture(lambda: api.matmul(a, b, kernel=kernel, out=out))
    assert result is out
    graph_y, y = _capture(lambda: api.matmul(a, b, kernel=kernel))  # out allocated inside the capture
    for _ in range(3):
        a.copy_(_randn(M, K, dtype=dtype, generator=g))
        b.copy_(_randn(*b.shape, dtype=dtype, generator=g))
        out.fill_(float("nan"))
        y.fill_(float("nan"))
        graph.replay()
        graph_y.replay()
        _assert_product(out, a, b, f"{kernel} graph, out given")
        _assert_product(y, a, b, f"{kernel} graph, out allocated")


@pytest.mark.parametrize("kernel", [*RUNGS, None], ids=str)
def test_the_aligned_copy_path_replays_in_a_cuda_graph(kernel):
    g = torch.Generator(device="cuda").manual_seed(5)
    big = _randn(300, 301, generator=g)
    a = big[:, 1:200]  # copied into an aligned buffer inside the graph
    w_big = _randn(97, 200, generator=g)
    b = w_big[:, :199].t()  # a "t" view whose weight rows are 400 bytes: describable as it is
    out = _nan(300, 97)  # row stride 194 bytes: computed aside and copied back inside the graph
    graph, _ = _capture(lambda: api.matmul(a, b, kernel=kernel, out=out))
    for _ in range(3):
        big.copy_(_randn(300, 301, generator=g))
        w_big.copy_(_randn(97, 200, generator=g))
        out.fill_(float("nan"))
        graph.replay()
        _assert_product(out, a, b, f"{kernel} aligned copy in a graph")


def test_the_operator_replays_in_a_cuda_graph():
    g = torch.Generator(device="cuda").manual_seed(6)
    a, b = _operands(65, 4096, 512, torch.bfloat16, "t", g)
    graph, y = _capture(lambda: ops.matmul(a, b))
    for _ in range(2):
        a.copy_(_randn(65, 512, dtype=torch.bfloat16, generator=g))
        y.fill_(float("nan"))
        graph.replay()
        _assert_product(y, a, b, "ops.matmul in a graph")


def _transposed(M: int, K: int, dtype, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(buf, a): a [M, K] in A layout "t", the view x.t() of the [K, M] columns of `buf`, a [K, M']
    matrix whose rows are padded to 16 bytes (M' a multiple of 8) with NaN, never read."""
    buf = _nan(K, -(-M // 8) * 8, dtype=dtype)
    buf[:, :M] = _randn(K, M, dtype=dtype, generator=generator)
    return buf, buf[:, :M].t()


@pytest.mark.parametrize("kernel", [None, "torch", "persistent", "warpspec", "splitk", "swapab"], ids=str)
def test_a_transposed_a_and_a_bias_replay_in_a_cuda_graph(kernel):
    """A in layout "t" (read in place by cuBLAS and the Hopper rungs, copied inside the graph by
    swapab) and a bias, captured once; each replay reads the new A, B and bias values."""
    g = torch.Generator(device="cuda").manual_seed(12)
    M, N, K = 65, 264, 1032
    buf, a = _transposed(M, K, torch.bfloat16, g)
    b = _randn(N, K, dtype=torch.bfloat16, generator=g).t()
    bias = _randn(N, dtype=torch.bfloat16, generator=g)
    out = _nan(M, N, dtype=torch.bfloat16)
    graph, result = _capture(lambda: api.matmul(a, b, kernel=kernel, out=out, bias=bias))
    assert result is out
    for round_ in range(3):
        buf[:, :M] = _randn(K, M, dtype=torch.bfloat16, generator=g)
        b.copy_(_randn(K, N, dtype=torch.bfloat16, generator=g))
        bias.copy_(_randn(N, dtype=torch.bfloat16, generator=g))
        out.fill_(float("nan"))
        graph.replay()
        ref = reference(a, b, bias=bias)
        assert not torch.isnan(out).any(), f"{kernel} replay {round_}: NaN"
        _assert_close(out, ref, torch.addmm(bias, a, b), torch.bfloat16, f"{kernel} replay {round_}")


# --------------------------------------------------------------------------------------------------
# cuBLAS's direct plan: torch.mm / torch.addmm on the call's own tensors


@pytest.mark.parametrize("a_layout", ["row", "t"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("kernel", ["torch", None], ids=str)
def test_a_cached_cublas_plan_calls_cublas_directly_with_out_and_bias(kernel, bias, a_layout):
    """A key whose plan runs cuBLAS with nothing to copy (`MatmulPlan.direct`): its repeated calls
    are torch.mm / torch.addmm themselves, with `out` given (contiguous, or a view with padded rows
    whose padding stays NaN) or allocated, with a bias or none, A row or "t" (cuBLAS takes a
    transposed A as it is); every result the fp32 product (plus the bias)."""
    g = torch.Generator(device="cuda").manual_seed(13)
    M, N, K = 65, 520, 264  # no table entry for this weight: auto's rule runs cuBLAS above 16 tokens
    a = _transposed(M, K, torch.bfloat16, g)[1] if a_layout == "t" else _randn(M, K, dtype=torch.bfloat16)
    b = _randn(N, K, dtype=torch.bfloat16, generator=g).t()
    c = _randn(N, dtype=torch.bfloat16, generator=g) if bias else None
    if kernel is None:
        assert "runs: torch " in api.explain(a, b, bias=c), api.explain(a, b, bias=c)
    ref = reference(a, b, bias=c)
    cublas = torch.matmul(a, b) if c is None else torch.addmm(c, a, b)
    padded = _nan(M, N + 8, dtype=torch.bfloat16)
    for out in (None, _nan(M, N, dtype=torch.bfloat16), padded[:, :N]):
        for call in range(3):  # the first builds the plan, the others run it
            if out is not None:
                out.fill_(float("nan"))
            y = api.matmul(a, b, kernel=kernel, out=out, bias=c)
            assert out is None or y is out
            _assert_close(y, ref, cublas, torch.bfloat16, f"{kernel} out={out is not None} call {call}")
        cached = api._PLANS[api._plan_key(kernel, a, b, out, bias=c)]
        assert cached.plan.direct is not None and cached.func is cached.plan.direct, cached.plan
        assert not (cached.plan.copy_a or cached.plan.copy_b or cached.plan.copy_out), cached.plan
    assert torch.isnan(padded[:, N:]).all(), "the padding of out's rows was written"
    assert api.runs_cublas(a, b, kernel, c)


# --------------------------------------------------------------------------------------------------
# The operator: eager, torch.compile, autograd


@pytest.mark.parametrize("kernel", [None, "warpspec", "persistent"], ids=str)
def test_the_operator_in_eager_mode(kernel):
    g = torch.Generator(device="cuda").manual_seed(7)
    for M in (1, 65):
        a, b = _operands(M, 320, 256, torch.bfloat16, "t", g)
        _assert_product(ops.matmul(a, b, kernel), a, b, f"ops.matmul {kernel}")
        _assert_product(torch.ops.gluon_survey.matmul(a, b, kernel or ""), a, b, "torch.ops")


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_torch_compile_fullgraph_over_the_operator(mode):
    """Inductor compiles around the opaque operator (the scaling by 2 is exact); reduce-overhead
    also captures the operator in its CUDA graphs. Fresh inputs on every call."""
    torch._dynamo.reset()

    def f(x, w):
        return ops.matmul(x, w.t(), "warpspec") * 2

    compiled = torch.compile(f, fullgraph=True, mode=mode)
    g = torch.Generator(device="cuda").manual_seed(8)
    for _ in range(4):
        x, w = (
            _randn(63, 256, dtype=torch.bfloat16, generator=g),
            _randn(384, 256, dtype=torch.bfloat16, generator=g),
        )
        y = compiled(x, w)
        _assert_product(y / 2, x, w.t(), f"torch.compile {mode}")


def test_the_operators_gradients():
    g = torch.Generator(device="cuda").manual_seed(9)
    for layout in ("row", "t"):
        a, b = _operands(65, 200, 136, torch.bfloat16, layout, g)
        a.requires_grad_(True)
        b.requires_grad_(True)
        y = ops.matmul(a, b)
        grad = _randn(*y.shape, dtype=torch.bfloat16, generator=g)
        y.backward(grad)
        ad, bd = a.detach(), b.detach()
        _assert_close(a.grad, reference(grad, bd.t()), grad @ bd.t(), torch.bfloat16, f"grad a, {layout}")
        _assert_close(b.grad, reference(ad.t(), grad), ad.t() @ grad, torch.bfloat16, f"grad b, {layout}")


# --------------------------------------------------------------------------------------------------
# Linear


@pytest.mark.parametrize("features", [(256, 384), (264, 100)], ids=["aligned", "N=100"])
@pytest.mark.parametrize("lead", [(), (3,)], ids=["2d", "3d"])
@pytest.mark.parametrize("M", [1, 7, 63, 65])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_linear_matches_torch_linear(dtype, bias, M, lead, features):
    K, N = features
    torch.manual_seed(M * 7 + K)
    lin = gluon_survey.Linear(K, N, bias=bias, device="cuda", dtype=dtype)
    with torch.no_grad():
        lin.weight.normal_()  # weights of unit size, so the product is not all rounding
        if bias:
            lin.bias.normal_()
    x = torch.randn(*lead, M, K, device="cuda").to(dtype)
    y = lin(x)
    assert y.shape == (*lead, M, N) and y.dtype == dtype
    w, b = lin.weight.detach(), None if lin.bias is None else lin.bias.detach()
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    _assert_close(y.detach(), ref, F.linear(x, w, b), dtype, f"Linear M={M} lead={lead}")


def test_linear_from_linear_in_a_model_and_its_gradients():
    torch.manual_seed(10)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 128))
    model = model.to("cuda", torch.bfloat16)
    swapped = torch.nn.Sequential(
        gluon_survey.Linear.from_linear(model[0]), model[1], gluon_survey.Linear.from_linear(model[2])
    )
    x = torch.randn(4, 33, 256, device="cuda").to(torch.bfloat16)
    y = swapped(x)
    w0, b0, w2, b2 = (
        p.detach().float() for p in (model[0].weight, model[0].bias, model[2].weight, model[2].bias)
    )
    ref = F.linear(F.linear(x.float(), w0, b0).relu(), w2, b2)
    _assert_close(y.detach(), ref, model(x).detach(), torch.bfloat16, "swapped model")
    y.float().square().mean().backward()
    assert model[0].weight.grad is not None and model[0].weight.grad.shape == (512, 256)
    assert torch.isfinite(model[0].weight.grad).all() and model[2].bias.grad.shape == (128,)


@pytest.mark.parametrize("how", ["no_grad", "inference_mode", "frozen", "training", "compiled"])
def test_linear_skips_the_operator_only_where_nothing_records_or_traces(monkeypatch, how):
    """In eager mode (grad disabled, inference mode, a frozen module, or training) `Linear` calls
    `gluon_survey.matmul` itself (in training through `_EagerMatmul`, which has the operator's
    backward); torch.compile(fullgraph=True) of a frozen module under no_grad traces the operator
    (a direct call would break the graph). The products and the gradients are the same."""
    calls = []
    operator = ops._OP
    monkeypatch.setattr(ops, "_OP", lambda *args: calls.append(args) or operator(*args))
    torch.manual_seed(11)
    lin = gluon_survey.Linear(264, 100, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.normal_()
        lin.bias.normal_()
    x = torch.randn(3, 7, 264, device="cuda").to(torch.bfloat16)
    if how in ("frozen", "compiled"):
        lin.requires_grad_(False)
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "compiled": torch.no_grad}
    with context.get(how, contextlib.nullcontext)():
        if how == "compiled":
            torch._dynamo.reset()
            y = torch.compile(lin, fullgraph=True)(x)
        else:
            y = lin(x)
    if how != "compiled":  # (fullgraph=True already says the compiled forward is the operator's)
        assert calls == []
    assert y.requires_grad == (how == "training")
    w, b = lin.weight.detach(), lin.bias.detach()
    ref = F.linear(x.float(), w.float(), b.float())
    _assert_close(y.detach(), ref, F.linear(x, w, b), torch.bfloat16, f"Linear, {how}")
    if how == "training":
        grad = torch.randn_like(y)
        y.backward(grad)
        assert calls == []
        g = grad.float().reshape(-1, 100)
        ref_w = g.t() @ x.float().reshape(-1, 264)
        stock_w = grad.reshape(-1, 100).t() @ x.reshape(-1, 264)
        _assert_close(lin.weight.grad, ref_w, stock_w, torch.bfloat16, "Linear's weight gradient")
        torch.testing.assert_close(lin.bias.grad.float(), g.sum(0), rtol=2e-2, atol=2e-2)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(True)


@pytest.mark.parametrize(("a_layout", "b_layout"), [("row", "row"), ("row", "t"), ("t", "row"), ("t", "t")])
@pytest.mark.parametrize("kernel", KERNELS, ids=str)
def test_the_operators_gradients_in_every_layout_per_rung(kernel, a_layout, b_layout):
    """gradcheck against fp32: y = a @ b (+ bias) through the operator on one rung, and its
    gradients (grad @ b^T and a^T @ grad on the same rung: between them the other layout pairs,
    grad^T a transposed A read in place where the rung can), for every A and B layout, M = 1, 7,
    65, 300 (fp16 and bf16 in turn), N and K tails, with a bias and without. Each product within
    the driver's tolerance of its fp32 value (cuBLAS's error the yardstick); the bias's gradient,
    an fp32 sum of grad's rows, within bf16/fp16 rounding."""
    g = torch.Generator(device="cuda").manual_seed(14)
    N, K = 264, 200
    for i, M in enumerate((1, 7, 65, 300)):
        dtype = DTYPES[i % 2]
        for with_bias in (False, True):
            if a_layout == "t":
                buf, _ = _transposed(M, K, dtype, g)
                leaf_a = _leaf(buf)
                a = leaf_a[:, :M].t()
            else:
                leaf_a = a = _leaf(_randn(M, K, dtype=dtype, generator=g))
            if b_layout == "t":
                leaf_b = _leaf(_randn(N, K, dtype=dtype, generator=g))
                b = leaf_b.t()
            else:
                leaf_b = b = _leaf(_randn(K, N, dtype=dtype, generator=g))
            bias = _leaf(_randn(N, dtype=dtype, generator=g)) if with_bias else None
            y = ops.matmul(a, b, kernel, bias)
            grad = _randn(M, N, dtype=dtype, generator=g)
            y.backward(grad)
            grad_a = leaf_a.grad[:, :M].t() if a_layout == "t" else leaf_a.grad
            grad_b = leaf_b.grad.t() if b_layout == "t" else leaf_b.grad
            ad, bd, cd = a.detach(), b.detach(), None if bias is None else bias.detach()
            what = f"{kernel} M={M} A={a_layout} B={b_layout} bias={with_bias}"
            cublas_y = torch.matmul(ad, bd) if cd is None else torch.addmm(cd, ad, bd)
            _assert_close(y.detach(), reference(ad, bd, bias=cd), cublas_y, dtype, f"{what}: y")
            _assert_close(grad_a, reference(grad, bd.t()), grad @ bd.t(), dtype, f"{what}: grad a")
            _assert_close(grad_b, reference(ad.t(), grad), ad.t() @ grad, dtype, f"{what}: grad b")
            if a_layout == "t":
                assert torch.isnan(buf[:, M:]).all() and not leaf_a.grad[:, M:].any(), what
            if bias is not None:
                assert bias.grad.dtype == dtype
                torch.testing.assert_close(bias.grad.float(), grad.float().sum(0), rtol=1e-2, atol=1e-2)


def _products_of_linear(x, w, bias, grad):
    """The three products of a Linear's step as `matmul` is called for them (forward, grad_x,
    grad_w as (grad^T @ x)^T), by (name, a, b, bias)."""
    return [("forward", x, w.t(), bias), ("grad x", grad, w, None), ("grad w", grad.t(), x, None)]


@pytest.mark.parametrize("M", [7, 65, 300])
def test_linear_training_copies_no_operand_and_cublas_reads_grad_t_in_place(M):
    """`Linear` (matmul's default) in eager training on a contiguous activation and weight: the
    weight's gradient grad^T @ x, which auto runs on cuBLAS, reads grad^T (a transposed A) in place;
    none of the step's three products copies an operand (their cached plans and `explain` say so);
    the output and the three gradients match fp32."""
    torch.manual_seed(15)
    lin = gluon_survey.Linear(264, 520, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.normal_()
        lin.bias.normal_()
    x = torch.randn(M, 264, device="cuda").to(torch.bfloat16).requires_grad_(True)
    y = lin(x)
    grad = torch.randn_like(y)
    y.backward(grad)
    xd, w, b = x.detach(), lin.weight.detach(), lin.bias.detach()
    _assert_close(y.detach(), reference(xd, w.t(), bias=b), F.linear(xd, w, b), torch.bfloat16, "y")
    _assert_close(x.grad, reference(grad, w), grad @ w, torch.bfloat16, "grad x")
    _assert_close(lin.weight.grad, reference(grad.t(), xd), grad.t() @ xd, torch.bfloat16, "grad w")
    torch.testing.assert_close(lin.bias.grad.float(), grad.float().sum(0), rtol=1e-2, atol=1e-2)
    text = api.explain(grad.t(), xd)
    assert "runs: torch " in text and "A: t (transpose view of a [K,M] matrix), read in place" in text, text
    for name, a, b_, bias in _products_of_linear(xd, w, b, grad):
        text = api.explain(a, b_, bias=bias)
        assert "aligned copy" not in text and "copied to row-major" not in text, f"{name}: {text}"
        plan = api._PLANS[api._plan_key(None, a, b_, None, bias=bias)].plan
        assert not (plan.copy_a or plan.copy_b or plan.copy_out), f"{name}: {plan}"


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_linear_in_eager_inference_calls_f_linear_where_matmul_runs_cublas(monkeypatch, bias):
    """In eager inference a layout's first call is `matmul`; where its plan calls cuBLAS itself
    (65 tokens: auto's rule), the later calls are `F.linear` with the same result, bit for bit (the
    same torch.addmm / torch.mm); where matmul runs a Gluon kernel (7 tokens: slab; any M with
    kernel="warpspec"), every call stays `matmul`."""
    calls = []
    matmul, linear = api.matmul, F.linear
    monkeypatch.setattr(api, "matmul", lambda *a, **k: calls.append("matmul") or matmul(*a, **k))
    monkeypatch.setattr(F, "linear", lambda *a, **k: calls.append("F.linear") or linear(*a, **k))
    torch.manual_seed(16)
    for kernel, M, stock in ((None, 65, True), (None, 7, False), ("warpspec", 65, False), ("torch", 7, True)):
        lin = gluon_survey.Linear(264, 520, bias=bias, device="cuda", dtype=torch.bfloat16, kernel=kernel)
        with torch.no_grad():
            lin.weight.normal_()
        w, b = lin.weight.detach(), None if lin.bias is None else lin.bias.detach()
        x = torch.randn(M, 264, device="cuda").to(torch.bfloat16)
        runs = api.explain(x, w.t(), kernel, bias=b)
        assert ("runs: torch " in runs or kernel == "torch") == stock, runs
        calls.clear()
        with torch.no_grad():
            results = [lin(x) for _ in range(3)]
        want = ["matmul", "F.linear", "F.linear"] if stock else ["matmul"] * 3
        assert calls == want, (kernel, M, calls)
        assert api.runs_cublas(x, w.t(), kernel, b) == stock
        for y in results[1:]:
            if stock:
                assert torch.equal(y, results[0]), (kernel, M)
        for y in results:
            ref = reference(x, w.t(), bias=b)
            _assert_close(y, ref, linear(x, w, b), torch.bfloat16, f"Linear {kernel} M={M}")


def test_linear_in_eager_training_calls_f_linear_once_every_product_ran_cublas(monkeypatch):
    """A training layout's first step is three `matmul` calls; where matmul ran cuBLAS itself for
    all three (65 tokens: auto's rule for the forward, no table entry for the backward's layouts),
    the later steps are `F.linear` with autograd's own backward; with kernel="warpspec" every step
    stays on matmul. Outputs and gradients match fp32 in every step."""
    calls = []
    matmul, linear = api.matmul, F.linear
    monkeypatch.setattr(api, "matmul", lambda *a, **k: calls.append("matmul") or matmul(*a, **k))
    monkeypatch.setattr(F, "linear", lambda *a, **k: calls.append("F.linear") or linear(*a, **k))
    torch.manual_seed(18)
    for kernel, stock in ((None, True), ("warpspec", False)):
        lin = gluon_survey.Linear(264, 520, device="cuda", dtype=torch.bfloat16, kernel=kernel)
        with torch.no_grad():
            lin.weight.normal_()
            lin.bias.normal_()
        per_step = []
        for step in range(3):
            lin.zero_grad(set_to_none=True)
            x = torch.randn(65, 264, device="cuda").to(torch.bfloat16).requires_grad_(True)
            grad = torch.randn(65, 520, device="cuda").to(torch.bfloat16)
            calls.clear()
            y = lin(x)
            y.backward(grad)
            per_step.append(list(calls))
            xd, w, b = x.detach(), lin.weight.detach(), lin.bias.detach()
            what = f"{kernel} step {step}"
            _assert_close(y.detach(), reference(xd, w.t(), bias=b), linear(xd, w, b), torch.bfloat16, what)
            _assert_close(x.grad, reference(grad, w), grad @ w, torch.bfloat16, f"{what}: grad x")
            grad_w = lin.weight.grad
            _assert_close(grad_w, reference(grad.t(), xd), grad.t() @ xd, torch.bfloat16, f"{what}: grad w")
            torch.testing.assert_close(lin.bias.grad.float(), grad.float().sum(0), rtol=1e-2, atol=1e-2)
        later = [["F.linear"]] * 2 if stock else [["matmul"] * 3] * 2
        assert per_step == [["matmul"] * 3, *later], (kernel, per_step)


@pytest.mark.parametrize("kernel", [None, "warpspec", "splitk"], ids=str)
def test_eager_training_of_linear_replays_in_a_cuda_graph(monkeypatch, kernel):
    """A training step of `Linear` in eager mode (`_EagerMatmul`: the forward and both backward
    products as `matmul` calls, no operator) captured whole, forward and backward, in a CUDA graph
    after warm-up steps on a side stream (torch.cuda.graphs' whole-network recipe); each replay on
    new inputs, gradients and weights gives the new output and gradients."""
    calls = []
    operator = ops._OP
    monkeypatch.setattr(ops, "_OP", lambda *args: calls.append(args) or operator(*args))
    g = torch.Generator(device="cuda").manual_seed(17)
    lin = gluon_survey.Linear(264, 520, device="cuda", dtype=torch.bfloat16, kernel=kernel)
    x = _randn(65, 264, dtype=torch.bfloat16, generator=g).requires_grad_(True)
    grad = _randn(65, 520, dtype=torch.bfloat16, generator=g)

    def step():
        y = lin(x)
        y.backward(grad)
        return y

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    lin.zero_grad(set_to_none=True)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = step()
    assert calls == [], "eager training ran the operator, not _EagerMatmul"
    for round_ in range(3):
        with torch.no_grad():
            x.copy_(_randn(65, 264, dtype=torch.bfloat16, generator=g))
            lin.weight.copy_(_randn(520, 264, dtype=torch.bfloat16, generator=g))
            lin.bias.copy_(_randn(520, dtype=torch.bfloat16, generator=g))
        grad.copy_(_randn(65, 520, dtype=torch.bfloat16, generator=g))
        graph.replay()
        xd, w, b = x.detach(), lin.weight.detach(), lin.bias.detach()
        what = f"{kernel} replay {round_}"
        _assert_close(y.detach(), reference(xd, w.t(), bias=b), F.linear(xd, w, b), torch.bfloat16, what)
        _assert_close(x.grad, reference(grad, w), grad @ w, torch.bfloat16, f"{what}: grad x")
        grad_w = lin.weight.grad
        _assert_close(grad_w, reference(grad.t(), xd), grad.t() @ xd, torch.bfloat16, f"{what}: grad w")
        torch.testing.assert_close(lin.bias.grad.float(), grad.float().sum(0), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.parametrize("kernel", [None, "warpspec"], ids=str)
def test_a_compiled_training_step_of_linear(kernel, mode):
    """torch.compile(fullgraph=True) of a training step through `Linear` with a bias: traced, it
    takes the operator (never `_EagerMatmul`, which would break the graph), forward and backward;
    reduce-overhead runs both in CUDA-graph trees. Fresh inputs each step; the output and the
    gradients of the input, weight and bias against fp32."""
    torch._dynamo.reset()
    torch.manual_seed(18)
    lin = gluon_survey.Linear(264, 520, device="cuda", dtype=torch.bfloat16, kernel=kernel)
    with torch.no_grad():
        lin.weight.normal_()
        lin.bias.normal_()

    def f(x):
        return lin(x) * 2  # exact: the reference scales by 2 too

    compiled = torch.compile(f, fullgraph=True, mode=mode)
    w32 = lin.weight.detach().float()
    b32 = lin.bias.detach().float()
    for step in range(3):
        lin.zero_grad(set_to_none=True)
        x = torch.randn(5, 13, 264, device="cuda").to(torch.bfloat16).requires_grad_(True)
        y = compiled(x)
        grad = torch.randn_like(y)
        y.backward(grad)
        x32 = x.detach().float().requires_grad_(True)
        w_ref, b_ref = w32.clone().requires_grad_(True), b32.clone().requires_grad_(True)
        y32 = F.linear(x32, w_ref, b_ref) * 2
        y32.backward(grad.float())
        for got, want, name in (
            (y, y32, "y"),
            (x.grad, x32.grad, "grad x"),
            (lin.weight.grad, w_ref.grad, "grad weight"),
            (lin.bias.grad, b_ref.grad, "grad bias"),
        ):
            assert got is not None and got.dtype == torch.bfloat16, f"{mode} step {step}: {name}"
            err = rel_error(got.detach(), want.detach())
            assert err <= 2e-2, f"{kernel} {mode} step {step}: {name}: rel error {err:.3e}"


# --------------------------------------------------------------------------------------------------
# Bad inputs


@pytest.mark.parametrize(("make", "error", "match"), BAD_INPUTS)
def test_bad_inputs_still_raise_after_good_calls(make, error, match):
    good = torch.randn(8, 8, device="cuda").half()
    api.matmul(good, good)
    ops.matmul(good, good)
    a, b = make()
    for _ in range(2):
        with pytest.raises(error, match=match):
            api.matmul(a, b)
        with pytest.raises(error, match=match):
            ops.matmul(a, b)
    with pytest.raises(TypeError, match="float16"):
        gluon_survey.Linear(8, 8, device="cuda")(torch.randn(2, 8, device="cuda"))  # fp32 weights
