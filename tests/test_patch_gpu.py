"""`gluon_survey.patch` and CUDA graphs on a real GPU: a patched model under
torch.compile(mode="reduce-overhead") (CUDA-graph trees) whose first calls of every plan key run
inside the compiled path, in the trees' warm-up; a first-ever call captured by `torch.cuda.graph`
and replayed; split-K's refusal to create its workspace inside a capture; and, where transformers
is installed, a small random Llama patched, its logits and its static-cache `generate`. Each
result is compared with an fp32 copy of the stock model, within twice the stock bf16 model's own
error. Run on the GPU machine: pytest -m gpu tests/test_patch_gpu.py."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import gluon_survey
from gluon_survey import api, memory
from gluon_survey.driver.check import rel_error
from gluon_survey.kernels import splitk

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("hopper_or_blackwell")]


@pytest.fixture
def first_calls(monkeypatch):
    """No plan, no 1x1 output template and no split-K workspace yet: the next call of every key is
    its first, as in a fresh process (the previous state is restored after the test)."""
    monkeypatch.setattr(api, "_PLANS", {})
    monkeypatch.setattr(memory, "_LIKE", {})
    monkeypatch.setattr(splitk, "WORKSPACE", splitk.Workspace())
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp(dtype=torch.bfloat16) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 1024, bias=False), nn.ReLU(), nn.Linear(1024, 256)
    ).to("cuda", dtype)


def _in_pool(t: torch.Tensor, pool) -> bool:
    """Whether t's memory lies in a segment of the CUDA memory pool `pool` (an id pair)."""
    ptr = t.data_ptr()
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return tuple(seg.get("segment_pool_id", ())) == tuple(pool)
    return False


def _assert_like_stock(out: torch.Tensor, stock: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    err, stock_err = rel_error(out.float(), ref), rel_error(stock.float(), ref)
    assert not torch.isnan(out).any(), what
    assert err <= 2 * stock_err + 1e-3, f"{what}: rel error {err:.3e}, stock model's {stock_err:.3e}"


@pytest.mark.parametrize("kernel", [None, "splitk", "swapab"])
def test_reduce_overhead_with_first_calls_in_the_graph_trees(first_calls, monkeypatch, kernel):
    """The first call of every key happens in CUDA-graph trees' warm-up, which sends allocations to
    the graph's pool; with the pool check on (torch's default), a plan that kept one of them (the
    1x1 output template) failed with 'tensor(s) in the cudagraph pool not tracked as outputs'.
    `patch` reserves those before any graph; split-K's workspace needs one eager call of its
    shapes first (the explicit splitk and swapab cases), as a hand-made capture does."""
    monkeypatch.setattr(torch._inductor.config.triton, "slow_path_cudagraph_asserts", True)
    model = _mlp()
    ref_model = copy.deepcopy(model).float()
    stock = copy.deepcopy(model)
    report = gluon_survey.patch(model, kernel=kernel)
    assert len(report) == 3 and report.skipped == {}
    if kernel is not None:  # split-K's workspace (zeroed counters) is made by an eager call first
        with torch.no_grad():
            for M in (1, 16, 300):
                model(torch.randn(M, 256, device="cuda").bfloat16())
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    gen = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for M in (1, 16, 300):
            for step in range(4):  # warm-up, recording, then replays on new inputs
                x = torch.randn(M, 256, device="cuda", generator=gen).bfloat16()
                out = compiled(x).clone()  # the trees overwrite their outputs on the next replay
                _assert_like_stock(out, stock(x), ref_model(x.float()), f"M={M} step {step}")
    for key, t in memory._LIKE.items():
        assert t.untyped_storage().data_ptr() != 0, key


@pytest.mark.parametrize("kernel", [None, "pipelined", "splitk", "swapab"])
@pytest.mark.parametrize("M", [1, 16, 300])
def test_a_first_call_captured_by_cuda_graph_then_replayed(first_calls, kernel, M):
    """A plan key whose first call is captured: the plan is built inside the capture, and what it
    keeps is outside the graph's pool. Split-K's workspace (zeroed counters) cannot be made inside a
    capture: a call of the same shape under another plan key makes it first (next test)."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    a = torch.randn(M, 2048, device="cuda", generator=gen).bfloat16()
    w = torch.randn(1536, 2048, device="cuda", generator=gen).bfloat16()
    if kernel in (None, "splitk", "swapab"):  # the same shape under another key (out given) first
        gluon_survey.matmul(a, w.t(), kernel=kernel, out=torch.empty(M, 1536, device="cuda").bfloat16())
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        out = gluon_survey.matmul(a, w.t(), kernel=kernel)
    for like in memory._LIKE.values():
        assert not _in_pool(like, graph.pool()), "the 1x1 output template is in the graph's pool"
    for round_ in range(3):
        a.copy_(torch.randn(M, 2048, device="cuda", generator=gen).bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        ref = a.float() @ w.float().t()
        _assert_like_stock(out, a @ w.t(), ref, f"replay {round_}")
    eager = gluon_survey.matmul(a, w.t(), kernel=kernel)  # the plan made in the capture, run eagerly
    _assert_like_stock(eager, a @ w.t(), a.float() @ w.float().t(), "eager after the capture")


def test_split_k_asks_for_a_call_before_the_capture_that_would_create_its_workspace(first_calls):
    a = torch.randn(16, 8192, device="cuda").bfloat16()
    w = torch.randn(1024, 8192, device="cuda").bfloat16()  # 8 tiles: SPLIT_K > 1
    graph = torch.cuda.CUDAGraph()
    refused = pytest.raises(RuntimeError, match="once with this shape before capturing")
    with refused, torch.cuda.stream(torch.cuda.Stream()), torch.cuda.graph(graph):
        gluon_survey.matmul(a, w.t(), kernel="splitk")
    out = gluon_survey.matmul(a, w.t(), kernel="splitk")  # outside a capture it makes the workspace
    _assert_like_stock(out, a @ w.t(), a.float() @ w.float().t(), "eager")
    counters = splitk.WORKSPACE._buffers[a.device][1]
    assert int(counters.abs().sum()) == 0  # the kernel left its counters at zero


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()


def test_a_patched_llama_matches_the_stock_model(first_calls):
    stock = _tiny_llama()
    ref = copy.deepcopy(stock).float()
    patched = copy.deepcopy(stock)
    report = gluon_survey.patch(patched)
    assert len(report) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and lm_head
    ids = torch.randint(0, 1000, (2, 24), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    with torch.no_grad():
        expected = ref(ids).logits
        _assert_like_stock(patched(ids).logits, stock(ids).logits, expected, "logits")


def test_static_cache_generate_of_a_patched_llama(first_calls):
    """transformers' static-cache generate compiles the decoding step with CUDA-graph trees (the
    path where a kept pool tensor was refused); greedy tokens as the stock model's (the first two:
    later ones may part on bf16 ties)."""
    stock = _tiny_llama()
    patched = copy.deepcopy(stock)
    gluon_survey.patch(patched)
    ids = torch.randint(0, 1000, (1, 12), device="cuda", generator=torch.Generator("cuda").manual_seed(4))
    kw = {"max_new_tokens": 8, "do_sample": False, "cache_implementation": "static", "pad_token_id": 0}
    with torch.no_grad():
        want = stock.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        torch._dynamo.reset()
        got = patched.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    assert got.shape == want.shape
    assert torch.equal(got[:, : ids.shape[1] + 2], want[:, : ids.shape[1] + 2]), (got, want)
