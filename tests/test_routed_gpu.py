"""The routed decode path (`gluon_survey.moe.routed_experts`, kernels/routed.py) on a Hopper GPU.

* `routed_experts` against each pair's fp32 products (gate and up rows, SwiGLU, down rows, the
  routing weights, the sum over a token's experts), with outputs left in NaN-poisoned memory, on
  ragged sizes (H and I not multiples of a chunk, one token to 16, top-2 to top-8, experts held
  elsewhere): the error against fp32 no worse than twice that of the same layer computed in the
  tokens' dtype by torch (transformers' way), plus a little.
* The routed plan with several weight rows a program (`RoutedConfig`), each rows count the plan
  takes where the rows divide, against the same fp32 products.
* A tiny Qwen3-MoE model's experts module on "gluon_survey" at a decode call: the routed kernels
  run (and the sorted path does not), and the result agrees with transformers' "grouped_mm" and
  with the sorted path; a CUDA-graph capture of that call replayed with other routings.
* Bad arguments get errors naming the fix, before any launch.

Run on the GPU machine: pytest -m gpu tests/test_routed_gpu.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gluon_survey import experts, grouped, moe
from gluon_survey.driver.check import rel_error
from gluon_survey.kernels import routed
from gpu_checks import captured
from test_moe_gpu import _models

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("hopper_only")]


def _poison():
    """Fill the caching allocator's free blocks with NaN, so that an output the kernels leave
    unwritten shows."""
    torch.full((1 << 24,), float("nan"), device="cuda")  # freed at once, its memory reused


def _layer(T, k, E, H, I, dtype, seed=0, elsewhere=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, H, device="cuda", generator=g).to(dtype)
    w_gate_up = (torch.randn(E, 2 * I, H, device="cuda", generator=g) / H**0.5).to(dtype)
    w_down = (torch.randn(E, H, I, device="cuda", generator=g) / I**0.5).to(dtype)
    index = torch.stack([torch.randperm(E, device="cuda", generator=g)[:k] for _ in range(T)])
    if elsewhere:
        index[::2, 0] = E + 3  # held on another device: adds nothing
    weights = torch.softmax(torch.randn(T, k, device="cuda", generator=g), -1).to(dtype)
    return x, w_gate_up, w_down, index, weights


def _reference(x, w_gate_up, w_down, index, weights, dtype=torch.float32):
    """Pair by pair in `dtype` (fp32: the reference; the tokens' dtype: torch's own error)."""
    E, I = w_gate_up.shape[0], w_gate_up.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for t in range(x.shape[0]):
        for j in range(index.shape[1]):
            e = int(index[t, j])
            if e >= E:
                continue
            h = F.linear(x[t].to(dtype), w_gate_up[e].to(dtype))
            h = F.silu(h[:I]) * h[I:]
            out[t] += (F.linear(h, w_down[e].to(dtype)) * weights[t, j].to(dtype)).float()
    return out


CASES = [
    pytest.param(1, 8, 16, 256, 96, torch.bfloat16, False, id="T1-top8-bf16"),
    pytest.param(5, 2, 8, 200, 72, torch.float16, False, id="T5-top2-fp16-ragged"),
    pytest.param(3, 4, 32, 2048, 768, torch.bfloat16, True, id="T3-top4-qwen3-rows-elsewhere"),
    pytest.param(16, 8, 128, 512, 64, torch.bfloat16, False, id="T16-top8-E128"),
    pytest.param(2, 2, 8, 1024, 3584, torch.bfloat16, False, id="T2-top2-deep-I"),
]


@pytest.mark.parametrize(("T", "k", "E", "H", "I", "dtype", "elsewhere"), CASES)
def test_routed_experts_match_each_pairs_fp32_products(T, k, E, H, I, dtype, elsewhere):
    x, w_gate_up, w_down, index, weights = _layer(T, k, E, H, I, dtype, elsewhere=elsewhere)
    want = _reference(x, w_gate_up, w_down, index, weights)
    yardstick = rel_error(_reference(x, w_gate_up, w_down, index, weights, dtype), want)
    _poison()
    got = moe.routed_experts(x, w_gate_up, w_down, index, weights)
    assert got.shape == x.shape and got.dtype == dtype
    assert not got.isnan().any(), "an output the kernels left unwritten"
    err = rel_error(got, want)
    assert err <= 2 * yardstick + 1e-3, (err, yardstick)
    if elsewhere:  # a token whose every pair is elsewhere would be 0; here each has others
        assert got[0].abs().sum() > 0


ROWS_CASES = [
    pytest.param(3, 4, 16, 200, 72, torch.bfloat16, id="T3-top4-H200-I72"),
    pytest.param(2, 2, 8, 4096, 100, torch.float16, id="T2-top2-I100-fp16"),
    pytest.param(4, 8, 32, 2048, 768, torch.bfloat16, id="T4-top8-qwen3-rows"),
    pytest.param(2, 2, 4, 1024, 14336, torch.bfloat16, id="T2-top2-I14336-32-warps"),
]


@pytest.mark.parametrize("rows", [2, 4, 8])
@pytest.mark.parametrize(("T", "k", "E", "H", "I", "dtype"), ROWS_CASES)
def test_several_rows_a_program_match_each_pairs_fp32_products(T, k, E, H, I, dtype, rows):
    x, w_gate_up, w_down, index, weights = _layer(T, k, E, H, I, dtype, seed=rows, elsewhere=True)
    want = _reference(x, w_gate_up, w_down, index, weights)
    yardstick = rel_error(_reference(x, w_gate_up, w_down, index, weights, dtype), want)
    plan = routed.plan(x, w_gate_up, w_down, index, routed.RoutedConfig(rows, rows))
    assert plan.gate_up.constexprs["ROWS"] > 1 and plan.down.constexprs["ROWS"] > 1
    _poison()
    got = plan.launch(x, w_gate_up, w_down, index, weights)
    assert not got.isnan().any(), "an output the kernels left unwritten"
    err = rel_error(got, want)
    assert err <= 2 * yardstick + 1e-3, (err, yardstick)


def test_a_second_call_reuses_the_plan_and_reads_the_new_routing():
    x, w_gate_up, w_down, index, weights = _layer(4, 2, 8, 256, 64, torch.bfloat16)
    first = moe.routed_experts(x, w_gate_up, w_down, index, weights)
    plans = len(moe._ROUTED_PLANS)
    other = index.flip(0).contiguous()
    second = moe.routed_experts(x, w_gate_up, w_down, other, weights)
    assert len(moe._ROUTED_PLANS) == plans
    want = _reference(x, w_gate_up, w_down, other, weights)
    assert rel_error(second, want) < 1e-2 and not torch.equal(first, second)


@pytest.fixture
def counted(monkeypatch):
    """Calls of the routed path and of grouped_matmul (the sorted path's products)."""
    calls = {"routed": 0, "grouped": 0}
    real_routed, real_grouped = moe.routed_experts, grouped.grouped_matmul

    def routed(*args):
        calls["routed"] += 1
        return real_routed(*args)

    def grouped_matmul(*args, **kwargs):
        calls["grouped"] += 1
        return real_grouped(*args, **kwargs)

    monkeypatch.setattr(moe, "routed_experts", routed)
    monkeypatch.setattr(grouped, "grouped_matmul", grouped_matmul)
    return calls


def _decode_call(stock, T=4, seed=3):
    g = torch.Generator(device="cuda").manual_seed(seed)
    E = stock.model.layers[0].mlp.experts.gate_up_proj.shape[0]
    hidden = torch.randn(T, stock.config.hidden_size, device="cuda", generator=g).to(torch.bfloat16)
    index = torch.stack([torch.randperm(E, device="cuda", generator=g)[:2] for _ in range(T)])
    weights = torch.softmax(torch.randn(T, 2, device="cuda", generator=g), -1).to(torch.bfloat16)
    return hidden, index, weights


@pytest.mark.parametrize("name", ["qwen3-moe", "mixtral"])
def test_a_decode_call_runs_routed_and_agrees_with_grouped_mm_and_the_sorted_path(counted, monkeypatch, name):
    stock, ours, _ = _models(name)
    ours_experts, stock_experts = ours.model.layers[0].mlp.experts, stock.model.layers[0].mlp.experts
    hidden, index, weights = _decode_call(stock)  # 4 tokens x top-2 = 8 pairs over 8 experts
    with torch.no_grad():
        want = stock_experts(hidden, index, weights)
        got = ours_experts(hidden, index, weights)
        assert counted == {"routed": 1, "grouped": 0}
        monkeypatch.setattr(experts, "ROUTED", False)
        sorted_path = ours_experts(hidden, index, weights)
        assert counted == {"routed": 1, "grouped": 2}
    assert rel_error(got, want.float()) < 1e-2
    assert rel_error(got, sorted_path.float()) < 1e-2


def test_a_routed_call_replays_in_a_cuda_graph_for_any_routing():
    stock, ours, _ = _models("qwen3-moe")
    ours_experts, stock_experts = ours.model.layers[0].mlp.experts, stock.model.layers[0].mlp.experts
    hidden, index, weights = _decode_call(stock)
    E = ours_experts.gate_up_proj.shape[0]
    graph, out = captured(lambda: ours_experts(hidden, index, weights))
    with torch.no_grad():
        g = torch.Generator(device="cuda").manual_seed(11)
        for seed in range(3):
            routing = torch.stack([torch.randperm(E, device="cuda", generator=g)[:2] for _ in range(4)])
            routing[:, 0] = seed  # one expert in every token
            index.copy_(routing)
            graph.replay()
            want = stock_experts(hidden, index, weights)
            assert rel_error(out, want.float()) < 1e-2, seed


BAD = [
    pytest.param(lambda a: {**a, "x": a["x"].float()}, TypeError, "fp16 or bf16", id="fp32-x"),
    pytest.param(lambda a: {**a, "w_down": a["w_down"][:, :, :32]}, ValueError, "do not fit", id="wrong-I"),
    pytest.param(lambda a: {**a, "x": a["x"][:, :128]}, ValueError, "do not fit", id="wrong-H"),
    pytest.param(
        lambda a: {**a, "top_k_index": a["top_k_index"].float()}, TypeError, "integers", id="float-ids"
    ),
    pytest.param(
        lambda a: {**a, "top_k_weights": a["top_k_weights"][:1]}, ValueError, r"\[T, k\]", id="weights"
    ),
    pytest.param(
        lambda a: {**a, "top_k_index": a["top_k_index"].t()}, ValueError, r"\[T, k\]", id="ids-shape"
    ),
    pytest.param(
        lambda a: {**a, "w_gate_up": a["w_gate_up"].transpose(1, 2).contiguous().transpose(1, 2)},
        ValueError,
        "contiguous",
        id="strided-weight",
    ),
    pytest.param(lambda a: {**a, "top_k_index": a["top_k_index"].cpu()}, ValueError, "cpu", id="cpu-ids"),
]


@pytest.mark.parametrize(("change", "error", "match"), BAD)
def test_bad_arguments_are_refused_with_the_fix(change, error, match):
    x, w_gate_up, w_down, index, weights = _layer(3, 2, 8, 256, 64, torch.bfloat16)
    args = {"x": x, "w_gate_up": w_gate_up, "w_down": w_down, "top_k_index": index, "top_k_weights": weights}
    with pytest.raises(error, match=match):
        moe.routed_experts(**change(args))


def test_rows_deeper_than_a_chunk_are_refused():
    deep = moe.routed_max_k(2) + 8
    x, w_gate_up, w_down, index, weights = _layer(1, 2, 4, 64, deep, torch.bfloat16)
    with pytest.raises(ValueError, match="one chunk"):
        moe.routed_experts(x, w_gate_up, w_down, index, weights)
