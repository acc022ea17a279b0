"""The mixture-of-experts operator and the "gluon_survey" experts implementation on a Hopper GPU.

* `gluon_survey::grouped_mm` forward and gradients against each expert's fp32 products, on ragged
  routing with empty experts and rows no expert owns, each within the driver's tolerance
  (`driver.check.tolerance`, cuBLAS's error on the same expert as the yardstick); the weight's
  gradient in the weight's layout; S = 1 and S = 0 (zero gradients, nothing launched);
  torch.compile(fullgraph=True) of a function of the operator, forward and backward, against
  eager.
* Tiny Mixtral and Qwen3-MoE models (config built here, 2 layers, random weights, bf16) switched
  to "gluon_survey" with `patch_experts`, against their twin on transformers' "grouped_mm": the
  logits' and one training step's gradients' error against an fp32 copy (on transformers' "eager"
  experts) no worse than the stock bf16 model's, and the grouped kernel seen to run; the same for
  torch.compile(fullgraph=True) of each whole model; one experts forward captured in a CUDA graph
  and replayed with other routings, against transformers' "grouped_mm"; with the fused gate
  (`experts.FUSED_SWIGLU`) in inference, eager and compiled, the same bound.

Skips without transformers (pip install -e .[models]) or off sm_90. Run on the GPU machine:
pytest -m gpu tests/test_moe_gpu.py."""

from __future__ import annotations

import copy

import pytest
import torch

from gluon_survey import grouped, moe
from gluon_survey.driver.check import rel_error, tolerance
from gluon_survey.driver.model import _grads, _grads_error, _train_step
from gpu_checks import captured

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("hopper_only")]

BF16 = torch.bfloat16


def _counted(monkeypatch, name: str) -> list[tuple]:
    """The shapes of x in each call of `gluon_survey.grouped.<name>` from now on (the operators'
    forwards call it through the module)."""
    calls = []
    real = getattr(grouped, name)

    def counted(*args, **kwargs):
        calls.append(tuple(args[0].shape))
        return real(*args, **kwargs)

    monkeypatch.setattr(grouped, name, counted)
    return calls


@pytest.fixture
def launches(monkeypatch):
    """Counts grouped_matmul's calls."""
    return _counted(monkeypatch, "grouped_matmul")


def _problem(counts, K, N, S=None, dtype=BF16, seed=0):
    """x [S, K] and the contiguous [E, N, K] weight w_nk, both leaves requiring gradients, and the
    int32 offsets on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    S = sum(counts) if S is None else S
    x = torch.randn(S, K, device="cuda", generator=g).to(dtype).requires_grad_()
    w_nk = torch.randn(len(counts), N, K, device="cuda", generator=g).to(dtype).requires_grad_()
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    return x, w_nk, offs


def _close(got, a, b, what):
    """got against the fp32 product a @ b, within the tolerance cuBLAS's own error sets."""
    ref = a.float() @ b.float()
    err, cublas_err = rel_error(got, ref), rel_error(a @ b, ref)
    assert err <= tolerance(cublas_err, a.dtype), f"{what}: {err:.3e} vs cuBLAS {cublas_err:.3e}"


@pytest.mark.parametrize(
    ("counts", "K", "N"),
    [
        pytest.param([0, 100, 37, 0, 250, 3, 0, 16], 256, 192, id="ragged-empty-experts"),
        pytest.param([1000, 0, 24], 1024, 136, id="long-k"),
        pytest.param([64], 64, 64, id="E1"),
    ],
)
def test_forward_and_gradients_match_each_experts_fp32_products(launches, counts, K, N):
    S = sum(counts) + 5  # 5 rows no expert owns: no output, zero gradient
    x, w_nk, offs = _problem(counts, K, N, S=S)
    out = moe.grouped_mm(x, w_nk.transpose(1, 2), offs)
    grad = torch.randn(S, N, device="cuda").to(BF16)
    out.backward(grad)
    torch.cuda.synchronize()
    assert len(launches) == 1  # the forward on the grouped kernel; the backward on torch._grouped_mm
    assert w_nk.grad.shape == w_nk.shape and w_nk.grad.is_contiguous(), w_nk.grad.stride()
    start = 0
    for e, count in enumerate(counts):
        rows = slice(start, start + count)
        start += count
        if not count:
            assert not w_nk.grad[e].any(), f"expert {e} has no tokens but a gradient"
            continue
        w = w_nk[e].detach().t()  # [K, N]
        xe, ge = x[rows].detach(), grad[rows]
        _close(out[rows], xe, w, f"expert {e} out")
        _close(x.grad[rows], ge, w.t(), f"expert {e} grad_x")
        _close(w_nk.grad[e], ge.t(), xe, f"expert {e} grad_w")  # [N, K], the weight's own layout
    assert not x.grad[start:].any(), "rows no expert owns got a gradient"


def test_s_1_and_s_0_forward_and_gradients():
    """One token (in one of three experts) and none at all: the forward's row against fp32, the
    gradients of x and of that expert's weight against fp32, the other experts' zero; with S = 0
    an empty output and zero gradients of the right shapes and layout (nothing launched)."""
    x, w_nk, offs = _problem([0, 1, 0], 64, 64)
    out = moe.grouped_mm(x, w_nk.transpose(1, 2), offs)
    grad = torch.randn(1, 64, device="cuda").to(BF16)
    out.backward(grad)
    torch.cuda.synchronize()
    w = w_nk[1].detach().t()
    _close(out, x.detach(), w, "S=1 out")
    _close(x.grad, grad, w.t(), "S=1 grad_x")
    _close(w_nk.grad[1], grad.t(), x.detach(), "S=1 grad_w")
    assert not w_nk.grad[0].any() and not w_nk.grad[2].any(), "experts without tokens got a gradient"

    x, w_nk, offs = _problem([0, 0, 0], 64, 64)
    assert x.shape == (0, 64)
    out = moe.grouped_mm(x, w_nk.transpose(1, 2), offs)
    assert out.shape == (0, 64) and out.dtype == BF16
    out.backward(torch.empty(0, 64, device="cuda", dtype=BF16))
    assert x.grad.shape == (0, 64)
    assert w_nk.grad.shape == w_nk.shape and w_nk.grad.is_contiguous() and not w_nk.grad.any()


def test_torch_compile_fullgraph_forward_and_backward_match_eager():
    counts = [40, 0, 100, 8]
    x, w_nk, offs = _problem(counts, 128, 96)

    def loss(x, w_nk, offs):
        return moe.grouped_mm(x, w_nk.transpose(1, 2), offs).float().square().mean()

    want = loss(x, w_nk, offs)
    want.backward()
    want_grads = (x.grad.clone(), w_nk.grad.clone())
    x.grad = w_nk.grad = None
    torch._dynamo.reset()
    got = torch.compile(loss, fullgraph=True)(x, w_nk, offs)
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(x.grad, want_grads[0])
    torch.testing.assert_close(w_nk.grad, want_grads[1])


def test_fp16_inputs_run_forward_but_refuse_gradients():
    x, w_nk, offs = _problem([16, 16], 64, 64, dtype=torch.float16)
    with torch.no_grad():
        out = moe.grouped_mm(x, w_nk.transpose(1, 2), offs)
    _close(out[:16], x[:16].detach(), w_nk[0].detach().t(), "fp16 expert 0")
    with pytest.raises(TypeError, match="bfloat16"):
        moe.grouped_mm(x, w_nk.transpose(1, 2), offs)


# --------------------------------------------------------------------------------------------------
# Tiny transformers models, stock ("grouped_mm") against patch_experts ("gluon_survey")

SMALL = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 256,
    "num_experts_per_tok": 2,
}
CONFIGS = {
    "mixtral": ("MixtralConfig", {**SMALL, "num_local_experts": 8}),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        {
            **SMALL,
            "num_experts": 8,
            "moe_intermediate_size": 64,
            "decoder_sparse_step": 1,
            "norm_topk_prob": True,
        },
    ),
}


def _models(name):
    """(stock on "grouped_mm", ours on "gluon_survey" sharing stock's Parameters, an fp32 copy on
    "eager")."""
    transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e .[models]")
    from gluon_survey import patch_experts

    class_name, fields = CONFIGS[name]
    config = getattr(transformers, class_name)(**fields)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(BF16)
    try:
        with torch.device("cuda"):
            stock = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    stock.config._experts_implementation = "grouped_mm"
    stock.eval()
    shared = {id(t): t for t in (*stock.parameters(), *stock.buffers())}
    ours = copy.deepcopy(stock, memo=shared)  # the modules and config copied, every tensor shared
    assert len(patch_experts(ours)) == fields["num_hidden_layers"]
    assert ours.config._experts_implementation == "gluon_survey"
    assert stock.config._experts_implementation == "grouped_mm"
    ref = copy.deepcopy(stock).float()
    ref.config._experts_implementation = "eager"
    return stock, ours, ref


def _ids(vocab, seed, shape=(2, 96)):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=g, device="cuda")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_model_logits_agree_with_fp32_as_well_as_grouped_mm(launches, name):
    stock, ours, ref = _models(name)
    ids = _ids(stock.config.vocab_size, 1)
    with torch.no_grad():
        want = ref(input_ids=ids, use_cache=False).logits
        got_stock = stock(input_ids=ids, use_cache=False).logits
        assert launches == []  # transformers' own grouped_mm: not our kernel
        got_ours = ours(input_ids=ids, use_cache=False).logits
    assert len(launches) == 2 * 2, launches  # gate_up and down in each of the 2 layers
    stock_err, ours_err = rel_error(got_stock, want), rel_error(got_ours, want)
    assert 0 < stock_err < 0.05, stock_err
    assert ours_err <= 2 * stock_err + 1e-3, (ours_err, stock_err)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_model_training_step_gradients_agree_with_fp32_as_well_as_grouped_mm(launches, name):
    stock, ours, ref = _models(name)
    vocab = stock.config.vocab_size
    ids, labels = _ids(vocab, 2), _ids(vocab, 3)
    errors = []  # stock's, then ours: the twins share their Parameters, so one at a time
    for model in (ref, stock, ours):
        model.train()
        _train_step(model, ids, labels)
        if model is not ref:
            errors.append(_grads_error(_grads(model), _grads(ref)))
    stock_err, ours_err = errors
    assert launches, "the patched model's experts never ran on the grouped kernel"
    expert_grads = [n for n in _grads(ours) if "experts" in n]
    assert len(expert_grads) == 2 * 2, expert_grads  # gate_up_proj and down_proj of each layer
    assert 0 < stock_err < 0.05, stock_err
    assert ours_err <= 2 * stock_err + 1e-3, (ours_err, stock_err)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_model_compiled_fullgraph_agrees_with_fp32_as_well_as_grouped_mm(launches, name):
    """torch.compile(fullgraph=True) of the whole model traces the experts through the operator."""
    stock, ours, ref = _models(name)
    ids = _ids(stock.config.vocab_size, 4)
    errors = []
    with torch.no_grad():
        want = ref(input_ids=ids, use_cache=False).logits
        for model in (stock, ours):
            torch._dynamo.reset()
            got = torch.compile(model, fullgraph=True)(input_ids=ids, use_cache=False).logits
            errors.append(rel_error(got, want))
    stock_err, ours_err = errors
    assert launches, "the compiled model's experts never ran on the grouped kernel"
    assert 0 < stock_err < 0.05, stock_err
    assert ours_err <= 2 * stock_err + 1e-3, (ours_err, stock_err)


@pytest.fixture
def fused(monkeypatch):
    """experts.FUSED_SWIGLU on at every size; counts grouped_swiglu's calls (the fused operator's forward)."""
    from gluon_survey import experts

    monkeypatch.setattr(experts, "FUSED_SWIGLU", True)
    monkeypatch.setattr(experts, "FUSED_SWIGLU_ABOVE", 0)  # at these few tokens too
    return _counted(monkeypatch, "grouped_swiglu")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled-fullgraph"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_fused_gate_in_inference_agrees_with_fp32_as_well_as_grouped_mm(launches, fused, name, compiled):
    """experts.FUSED_SWIGLU: each layer's gate_up and SiLU gate in one kernel (Mixtral's and
    Qwen3-MoE's gates are silu(gate) * up), the down projection on grouped_matmul."""
    stock, ours, ref = _models(name)
    ids = _ids(stock.config.vocab_size, 5)
    with torch.no_grad():
        want = ref(input_ids=ids, use_cache=False).logits
        errors = []
        for model in (stock, ours):
            torch._dynamo.reset()
            run = torch.compile(model, fullgraph=True) if compiled else model
            errors.append(rel_error(run(input_ids=ids, use_cache=False).logits, want))
    stock_err, ours_err = errors
    assert len(fused) == 2 and len(launches) == 2, (fused, launches)  # per layer: fused gate_up, down
    assert 0 < stock_err < 0.05, stock_err
    assert ours_err <= 2 * stock_err + 1e-3, (ours_err, stock_err)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_an_experts_forward_replays_in_a_cuda_graph_for_any_routing(name):
    """Nothing reads the routing to the host: one capture serves every routing of T tokens."""
    stock, ours, _ = _models(name)
    experts, stock_experts = ours.model.layers[0].mlp.experts, stock.model.layers[0].mlp.experts
    E, T = experts.gate_up_proj.shape[0], 64
    g = torch.Generator(device="cuda").manual_seed(5)
    hidden = torch.randn(T, stock.config.hidden_size, device="cuda", generator=g).to(BF16)
    index = torch.randint(0, E, (T, 2), device="cuda", generator=g)
    weights = torch.rand(T, 2, device="cuda", generator=g).to(BF16)
    graph, out = captured(lambda: experts(hidden, index, weights))
    with torch.no_grad():
        for seed in range(3):
            routing = torch.randint(0, E, (T, 2), device="cuda", generator=g.manual_seed(10 + seed))
            routing[: T // 2] = 0  # one expert crowded, others empty-ish
            index.copy_(routing)
            graph.replay()
            want = stock_experts(hidden, index, weights)
            assert rel_error(out, want.float()) < 1e-2, seed
