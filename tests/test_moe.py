"""The mixture-of-experts operator and the transformers experts implementation without a GPU.

* `gluon_survey::grouped_mm` (gluon_survey.moe): bad arguments reach grouped_matmul's checks, in
  eager calls and in the fake implementation (FakeTensors on "cuda"); the fake output's shape,
  dtype and device; a trace holds one operator node; the gradients' limits (checked when autograd
  records the call) and the backward's products on CPU tensors (torch._grouped_mm runs there)
  against per-expert fp32 products, the weight's gradient in the weight's layout.
* `moe.route`: the sort by expert and the offsets against a plain count.
* `experts_forward` (gluon_survey.experts) with torch._grouped_mm in place of the operator (its
  seam `_grouped`), against a per-token loop: routing, weights, experts held elsewhere, biases,
  the model's gate, experts without a gate.
* `register` / `patch_experts` against a stand-in for transformers' experts interface, and the
  error that names `pip install -e .[models]` without transformers.

On a GPU, with the real kernel and transformers models: tests/test_moe_gpu.py."""

from __future__ import annotations

import importlib
import sys
import types
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import gluon_survey
from gluon_survey import experts, grouped_auto, moe
from gluon_survey.kernels import routed
from test_grouped import BAD

BF16 = torch.bfloat16


def _weights(E, K, N, dtype=BF16, device="cpu"):
    """The [E, K, N] transpose view of a contiguous [E, N, K] weight."""
    return torch.empty(E, N, K, dtype=dtype, device=device).transpose(1, 2)


def _offsets(counts, device="cpu"):
    return torch.tensor(counts, device=device).cumsum(0).to(torch.int32)


# --------------------------------------------------------------------------------------------------
# The operator's argument checks are grouped_matmul's


@pytest.mark.parametrize(("args", "error", "match"), [p for p in BAD if p.values[0][3] is None])
def test_bad_arguments_get_grouped_matmuls_errors(args, error, match):
    x, w, offs, _ = args
    with pytest.raises(error, match=match):
        moe.grouped_mm(x, w, offs)


def test_the_operator_itself_checks_too():
    x = torch.empty(32, 64, dtype=BF16)
    with pytest.raises(ValueError, match="w must be 3-D"):
        torch.ops.gluon_survey.grouped_mm(x, torch.empty(64, 48, dtype=BF16), _offsets([32]))


FAKE_BAD = [
    pytest.param({"x": (32, 60)}, ValueError, r"w\.shape\[1\] must equal K", id="k"),
    pytest.param({"dtype": torch.float32}, TypeError, r"float32.*x\.bfloat16\(\)", id="fp32"),
    pytest.param({"w_contiguous": True}, ValueError, r"contiguous \[E, K, N\]", id="w-kn"),
    pytest.param({"offs": 3}, ValueError, "offs has 3 entries but w has 4 experts", id="offs-length"),
    pytest.param({"offs_dtype": torch.int64}, TypeError, r"offs\.to\(torch\.int32\)", id="offs-int64"),
    pytest.param({"device": "cpu"}, ValueError, "offs is on cpu", id="cpu"),
    pytest.param({"w_device": "cuda:1"}, ValueError, "x is on cuda:0 but w is on cuda:1", id="two-gpus"),
]


def _fake_operands(x=(32, 64), dtype=BF16, w_contiguous=False, offs=4, offs_dtype=torch.int32, **where):
    """Inside FakeTensorMode: x, w (E=4, N=48) and offs as `grouped_mm` would be traced with."""
    device = where.get("device", "cuda:0")
    w = torch.empty(4, 64, 48, dtype=dtype, device=where.get("w_device", device))
    if not w_contiguous:
        w = torch.empty(4, 48, 64, dtype=dtype, device=where.get("w_device", device)).transpose(1, 2)
    return (
        torch.empty(*x, dtype=dtype, device=device),
        w,
        torch.empty(offs, dtype=offs_dtype, device=device),
    )


@pytest.mark.parametrize(("changes", "error", "match"), FAKE_BAD)
def test_the_fake_implementation_runs_the_checks(changes, error, match):
    with FakeTensorMode():
        x, w, offs = _fake_operands(**changes)
        with pytest.raises(error, match=match):
            moe.grouped_mm(x, w, offs)


@pytest.mark.parametrize("dtype", [torch.float16, BF16], ids=str)
def test_the_fake_output_is_s_by_n_in_xs_dtype_on_its_device(dtype):
    with FakeTensorMode():
        x = torch.empty(1000, 256, dtype=dtype, device="cuda")
        out = moe.grouped_mm(
            x, _weights(8, 256, 300, dtype, "cuda"), torch.empty(8, dtype=torch.int32, device="cuda")
        )
        assert (tuple(out.shape), out.dtype, out.device.type) == ((1000, 300), dtype, "cuda")
        assert out.is_contiguous()


def test_a_trace_holds_one_operator_node():
    with FakeTensorMode():
        x = torch.empty(32, 64, dtype=BF16, device="cuda")
        w = _weights(4, 64, 48, device="cuda")
        offs = torch.empty(4, dtype=torch.int32, device="cuda")
        graph = make_fx(lambda x, w, offs: moe.grouped_mm(x, w, offs).relu())(x, w, offs)
    calls = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert torch.ops.gluon_survey.grouped_mm.default in calls
    assert calls.count(torch.ops.gluon_survey.grouped_mm.default) == 1


# --------------------------------------------------------------------------------------------------
# Gradients: the limits checked where autograd records the call, the backward's products


class _Ctx(SimpleNamespace):
    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def test_gradients_need_bf16():
    x, w = torch.empty(8, 64, dtype=torch.float16), _weights(2, 64, 48, torch.float16)
    with pytest.raises(TypeError, match=r"torch\._grouped_mm.*bfloat16.*torch\.no_grad\(\)"):
        moe._setup_context(_Ctx(), (x, w, _offsets([4, 4])), None)


def test_gradients_need_n_a_multiple_of_8():
    x, w = torch.empty(8, 64, dtype=BF16), _weights(2, 64, 44)
    with pytest.raises(ValueError, match=r"N \(w\.shape\[2\] = 44\) a multiple of 8.*pad N"):
        moe._setup_context(_Ctx(), (x, w, _offsets([4, 4])), None)


def test_setup_saves_the_inputs():
    x, w, offs = torch.empty(8, 64, dtype=BF16), _weights(2, 64, 48), _offsets([4, 4])
    ctx = _Ctx()
    moe._setup_context(ctx, (x, w, offs), None)
    assert all(a is b for a, b in zip(ctx.saved_tensors, (x, w, offs), strict=True))


def _backward(counts, S, K=64, N=48, needs=(True, True, False), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(S, K, generator=g).to(BF16)
    w_nk = torch.randn(len(counts), N, K, generator=g).to(BF16)
    grad = torch.randn(S, N, generator=g).to(BF16)
    offs = _offsets(counts)
    ctx = _Ctx(needs_input_grad=needs, saved_tensors=(x, w_nk.transpose(1, 2), offs))
    return x, w_nk, grad, moe._backward(ctx, grad)


def test_the_backward_products_match_each_experts_fp32_products():
    counts = [5, 0, 16, 3]  # an empty expert; rows 24 and 25 belong to no expert
    x, w_nk, grad, (grad_x, grad_w, grad_offs) = _backward(counts, S=26)
    assert grad_offs is None
    assert grad_x.shape == x.shape and grad_x.dtype == BF16
    assert grad_w.shape == (4, 64, 48) and grad_w.stride() == w_nk.transpose(1, 2).stride()  # w's layout
    start = 0
    for e, count in enumerate(counts):
        rows = slice(start, start + count)
        want_x = grad[rows].float() @ w_nk[e].float()  # grad @ w[e]^T, w[e] = w_nk[e]^T
        want_w = x[rows].float().t() @ grad[rows].float()
        torch.testing.assert_close(grad_x[rows].float(), want_x, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(grad_w[e].float(), want_w, rtol=2e-2, atol=2e-2)
        start += count
    assert not grad_w[1].any(), "an expert with no tokens has a zero gradient"
    assert not grad_x[24:].any(), "rows no expert owns have a zero gradient"


def test_only_the_gradients_asked_for_are_computed():
    _, _, _, (grad_x, grad_w, _) = _backward([4, 4], S=8, needs=(False, True, False))
    assert grad_x is None and grad_w is not None
    _, _, _, (grad_x, grad_w, _) = _backward([4, 4], S=8, needs=(True, False, False))
    assert grad_x is not None and grad_w is None


def test_empty_products_give_zero_gradients():
    _, w_nk, _, (grad_x, grad_w, _) = _backward([0, 0], S=0)
    assert grad_x.shape == (0, 64)
    assert (
        grad_w.shape == (2, 64, 48) and not grad_w.any() and grad_w.stride() == w_nk.transpose(1, 2).stride()
    )


@pytest.fixture
def eager_on_cpu(monkeypatch):
    """moe's eager path on CPU tensors: `api.untraced_cuda` says yes and grouped_matmul is
    torch._grouped_mm (recorded)."""
    from gluon_survey import api, grouped

    calls = []
    monkeypatch.setattr(api, "untraced_cuda", lambda x, weight: True)
    monkeypatch.setattr(
        grouped,
        "grouped_matmul",
        lambda x, w, offs: calls.append(x.shape) or torch._grouped_mm(x, w, offs=offs),
    )
    return calls


def test_in_eager_mode_grouped_mm_calls_grouped_matmul_without_the_operator(eager_on_cpu):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(24, 64, generator=g).to(BF16)
    w = torch.randn(4, 48, 64, generator=g).to(BF16).transpose(1, 2)
    offs = _offsets([5, 0, 16, 3])
    with torch.no_grad():
        y = moe.grouped_mm(x, w, offs)
    assert eager_on_cpu == [(24, 64)] and y.grad_fn is None
    torch.testing.assert_close(y, torch._grouped_mm(x, w, offs=offs))


def test_in_eager_training_grouped_mm_has_the_operators_gradients(eager_on_cpu):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(26, 64, generator=g).to(BF16).requires_grad_()
    w_nk = torch.randn(4, 48, 64, generator=g).to(BF16).requires_grad_()
    offs = _offsets([5, 0, 16, 3])  # rows 24 and 25 belong to no expert
    y = moe.grouped_mm(x, w_nk.transpose(1, 2), offs)
    assert eager_on_cpu == [(26, 64)] and type(y.grad_fn).__name__ == "_EagerGroupedMMBackward"
    grad = torch.randn(26, 48, generator=g).to(BF16)
    y.backward(grad)
    ctx = SimpleNamespace(needs_input_grad=(True, True, False), saved_tensors=(x, w_nk.transpose(1, 2), offs))
    want_x, want_w, _ = moe._backward(ctx, grad)  # the operator's backward
    torch.testing.assert_close(x.grad, want_x)
    torch.testing.assert_close(w_nk.grad, want_w.transpose(1, 2))
    with pytest.raises(TypeError, match="train in bfloat16"):  # the operator's check, before the GPU
        moe.grouped_mm(x.detach().half().requires_grad_(), w_nk.detach().half().transpose(1, 2), offs)


# --------------------------------------------------------------------------------------------------
# route: the sort by expert and the offsets


def _count_ends(ids, num_experts):
    counts = [0] * num_experts
    for i in ids:
        if i < num_experts:
            counts[i] += 1
    ends, total = [], 0
    for c in counts:
        total += c
        ends.append(total)
    return ends


@pytest.mark.parametrize("seed", range(4))
def test_route_sorts_by_expert_and_ends_each_experts_rows(seed):
    g = torch.Generator().manual_seed(seed)
    E, T, k = 8, 37, 2
    index = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    index[index == 3] = 5  # expert 3 gets no tokens
    expert_ids, perm, offs = moe.route(index, E)
    flat = index.reshape(-1).tolist()
    assert offs.dtype == torch.int32 and offs.tolist() == _count_ends(flat, E)
    assert expert_ids.tolist() == sorted(flat) and expert_ids.tolist() == [flat[i] for i in perm.tolist()]
    for e in range(E):  # stable: each expert's pairs in token order
        pairs = perm[(expert_ids == e)].tolist()
        assert pairs == sorted(pairs)
    # the same integers as transformers' histc + cumsum
    histc = torch.histc(expert_ids.float(), bins=E, min=0, max=E - 1).cumsum(0).to(torch.int32)
    assert offs.tolist() == histc.tolist()


def test_route_puts_experts_held_elsewhere_past_the_last_end():
    expert_ids, perm, offs = moe.route(torch.tensor([[4, 1], [0, 9], [1, 4]]), 4)
    assert offs.tolist() == [1, 3, 3, 3] and expert_ids.tolist() == [0, 1, 1, 4, 4, 9]
    assert (perm // 2).tolist() == [1, 0, 2, 0, 2, 1]  # pair -> token


@pytest.mark.parametrize(
    ("index", "num_experts", "error", "match"),
    [
        ([[0, 1]], 2, TypeError, r"top_k_index must be a torch\.Tensor"),
        (torch.zeros(2, 2), 2, TypeError, "expert ids are integers"),
        (torch.zeros(2, 2, dtype=torch.int64), 0, ValueError, "num_experts must be a whole number >= 1"),
        (torch.zeros(2, 2, dtype=torch.int64), 2.0, ValueError, "num_experts must be a whole number"),
    ],
)
def test_route_refuses_bad_arguments(index, num_experts, error, match):
    with pytest.raises(error, match=match):
        moe.route(index, num_experts)


# --------------------------------------------------------------------------------------------------
# experts_forward on CPU, torch._grouped_mm in the operator's place


class _Experts(nn.Module):
    """What transformers' experts modules hold: gate_up_proj [E, 2I, H] (or up_proj [E, I, H]),
    down_proj [E, H, I], act_fn, num_experts, the decorator's flags."""

    def __init__(self, E=6, H=16, I=24, has_gate=True, has_bias=False, dtype=torch.float32, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.num_experts, self.has_gate, self.has_bias, self.is_transposed = E, has_gate, has_bias, False
        self.act_fn = nn.SiLU()
        first = (E, 2 * I if has_gate else I, H)
        setattr(
            self,
            "gate_up_proj" if has_gate else "up_proj",
            nn.Parameter(torch.randn(*first, generator=g).to(dtype)),
        )
        self.down_proj = nn.Parameter(torch.randn(E, H, I, generator=g).to(dtype))
        if has_bias:
            name = "gate_up_proj" if has_gate else "up_proj"
            setattr(self, f"{name}_bias", nn.Parameter(torch.randn(E, first[1], generator=g).to(dtype)))
            self.down_proj_bias = nn.Parameter(torch.randn(E, H, generator=g).to(dtype))
        self.config = SimpleNamespace(_experts_implementation="grouped_mm")

    def reference(self, hidden, index, weights):
        """Token by token, expert by expert, in the router's order."""
        out = torch.zeros_like(hidden)
        for t in range(hidden.shape[0]):
            for j in range(index.shape[1]):
                e = int(index[t, j])
                if e >= self.num_experts:
                    continue
                w = self.gate_up_proj[e] if self.has_gate else self.up_proj[e]
                h = w @ hidden[t]
                if self.has_bias:
                    h = h + (self.gate_up_proj_bias[e] if self.has_gate else self.up_proj_bias[e])
                h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
                y = self.down_proj[e] @ h
                if self.has_bias:
                    y = y + self.down_proj_bias[e]
                out[t] += y * weights[t, j]
        return out

    def _apply_gate(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class _InterleavedExperts(_Experts):
    """A model whose gate and up rows alternate (transformers' is_concatenated False)."""

    def _apply_gate(self, gate_up):
        return self.act_fn(gate_up[..., ::2]) * gate_up[..., 1::2]


@pytest.fixture
def grouped_on_cpu(monkeypatch):
    calls = []

    def grouped(x, w, offs):
        calls.append((tuple(x.shape), tuple(w.shape), w.stride()))
        # as the operator: the rows past offs[-1] (no expert's) are not written (NaN here), and
        # their gradient is zero (torch._grouped_mm's own backward leaves those rows unwritten)
        owned = (torch.arange(x.shape[0]) < offs[-1]).unsqueeze(-1)
        out = torch._grouped_mm(torch.where(owned, x, 0.0), w, offs=offs)
        return torch.where(owned, out, float("nan"))

    monkeypatch.setattr(experts, "_grouped", grouped)
    return calls


def _routing(T=11, k=2, E=6, seed=0, elsewhere=False):
    g = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    if elsewhere:
        index[::3, 0] = E + 2  # held on another device
    weights = torch.softmax(torch.randn(T, k, generator=g), dim=-1)
    return index, weights


@pytest.mark.parametrize(
    "module",
    [
        pytest.param(lambda: _Experts(), id="gate"),
        pytest.param(lambda: _InterleavedExperts(), id="interleaved-gate"),
        pytest.param(lambda: _Experts(has_gate=False), id="no-gate"),
        pytest.param(lambda: _Experts(has_bias=True), id="bias"),
    ],
)
@pytest.mark.parametrize("elsewhere", [False, True], ids=["local", "ep-sentinels"])
def test_experts_forward_is_the_per_token_computation(grouped_on_cpu, module, elsewhere):
    mod = module()
    hidden = torch.randn(11, 16, generator=torch.Generator().manual_seed(1))
    index, weights = _routing(elsewhere=elsewhere)
    got = experts.experts_forward(mod, hidden, index, weights)
    assert got.shape == hidden.shape and got.dtype == hidden.dtype
    torch.testing.assert_close(got, mod.reference(hidden, index, weights), rtol=1e-4, atol=1e-4)
    # two grouped products, each on the transpose view of the [E, N, K] Parameter (no copy)
    first = mod.gate_up_proj if mod.has_gate else mod.up_proj
    assert [c[1:] for c in grouped_on_cpu] == [
        (tuple(first.transpose(1, 2).shape), first.transpose(1, 2).stride()),
        (tuple(mod.down_proj.transpose(1, 2).shape), mod.down_proj.transpose(1, 2).stride()),
    ]


@pytest.mark.parametrize("elsewhere", [False, True], ids=["local", "ep-sentinels"])
def test_experts_forward_gradients_flow_to_the_parameters(grouped_on_cpu, elsewhere):
    mod = _Experts()
    hidden = torch.randn(11, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
    index, weights = _routing(elsewhere=elsewhere)
    weights.requires_grad_()  # the router's: its gradient too (0 for pairs held elsewhere, not NaN)
    experts.experts_forward(mod, hidden, index, weights).square().sum().backward()
    ref = _Experts()
    ref_hidden = hidden.detach().clone().requires_grad_()
    ref_weights = weights.detach().clone().requires_grad_()
    ref.reference(ref_hidden, index, ref_weights).square().sum().backward()
    for got, want in (
        (hidden, ref_hidden),
        (weights, ref_weights),
        (mod.gate_up_proj, ref.gate_up_proj),
        (mod.down_proj, ref.down_proj),
    ):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-3, atol=1e-3)


def test_a_module_flagged_not_expert_parallel_skips_the_mask(grouped_on_cpu, monkeypatch):
    """transformers' `_is_expert_parallel` False: no id at or past num_experts can come, and the
    experts layer runs no mask (no comparison, no masked_fill_), with the same output; True (or no
    flag) keeps it, and pairs held elsewhere contribute zero."""
    masked = []
    original = torch.Tensor.masked_fill_
    monkeypatch.setattr(torch.Tensor, "masked_fill_", lambda t, *a: masked.append(1) or original(t, *a))
    hidden = torch.randn(11, 16, generator=torch.Generator().manual_seed(1))
    for flag, elsewhere, masks in ((False, False, 0), (True, True, 1), (None, True, 1)):
        mod = _Experts()
        if flag is not None:
            mod._is_expert_parallel = flag
        index, weights = _routing(elsewhere=elsewhere)
        masked.clear()
        got = experts.experts_forward(mod, hidden, index, weights)
        assert len(masked) == masks, (flag, masked)
        torch.testing.assert_close(got, mod.reference(hidden, index, weights), rtol=1e-4, atol=1e-4)


def test_experts_forward_wants_one_weight_per_choice(grouped_on_cpu):
    index, _ = _routing()
    with pytest.raises(ValueError, match=r"one routing weight per chosen expert, \[T, k\] = \[11, 2\]"):
        experts.experts_forward(_Experts(), torch.randn(11, 16), index, torch.rand(11, 6))


# --------------------------------------------------------------------------------------------------
# The fused gate: gluon_survey::grouped_swiglu and experts_forward's opt-in (FUSED_SWIGLU)


def test_the_swiglu_operator_is_one_node_whose_fake_output_is_s_by_i():
    with FakeTensorMode():
        x = torch.empty(1000, 256, dtype=BF16, device="cuda")
        w = _weights(8, 256, 600, device="cuda")
        offs = torch.empty(8, dtype=torch.int32, device="cuda")
        out = moe.grouped_swiglu(x, w, offs)
        assert (tuple(out.shape), out.dtype, out.device.type) == ((1000, 300), BF16, "cuda")
        graph = make_fx(lambda x, w, offs: moe.grouped_swiglu(x, w, offs).relu())(x, w, offs)
    calls = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert calls.count(torch.ops.gluon_survey.grouped_swiglu.default) == 1


def test_the_swiglu_operator_runs_grouped_swiglus_checks_and_wants_no_gradient():
    with FakeTensorMode():
        x = torch.empty(32, 64, dtype=BF16, device="cuda")
        offs = torch.empty(4, dtype=torch.int32, device="cuda")
        with pytest.raises(ValueError, match="N=47 output channels, an odd number"):
            moe.grouped_swiglu(x, _weights(4, 64, 47, device="cuda"), offs)
        w = _weights(4, 64, 48, device="cuda").requires_grad_()
        with pytest.raises(RuntimeError, match=r"no gradients: run it under torch\.no_grad\(\)"):
            moe.grouped_swiglu(x, w, offs)
        with torch.no_grad():
            assert moe.grouped_swiglu(x, w, offs).shape == (32, 24)


class _ClampedExperts(_Experts):
    """gpt-oss's kind of gate: silu on clamped halves."""

    def _apply_gate(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate.clamp(max=7.0)) * up.clamp(-7.0, 7.0)


class _NoHookExperts(_Experts):
    """transformers before the gate hook: act_fn on the chunked halves."""

    def __getattribute__(self, name):
        if name == "_apply_gate":
            raise AttributeError(name)
        return super().__getattribute__(name)


class _GeluNoHookExperts(_NoHookExperts):
    def __init__(self):
        super().__init__()
        self.act_fn = nn.GELU()


@pytest.mark.parametrize(
    ("module", "swiglu"),
    [
        pytest.param(_Experts, True, id="silu-chunk"),
        pytest.param(_NoHookExperts, True, id="silu-no-hook"),
        pytest.param(_InterleavedExperts, False, id="interleaved"),
        pytest.param(_ClampedExperts, False, id="clamped"),
        pytest.param(_GeluNoHookExperts, False, id="gelu"),
        pytest.param(lambda: _Experts(has_gate=False), False, id="no-gate"),
    ],
)
def test_swiglu_gate_tells_the_fused_kernels_gate_from_others(module, swiglu):
    mod = module()
    assert experts.swiglu_gate(mod) is swiglu
    assert experts.swiglu_gate(mod) is swiglu  # kept on the module


def test_swiglu_gate_is_checked_once_a_module(monkeypatch):
    mod = _Experts()
    runs = []
    original = mod._apply_gate
    monkeypatch.setattr(mod, "_apply_gate", lambda h: runs.append(h.shape) or original(h))
    assert experts.swiglu_gate(mod) and experts.swiglu_gate(mod)
    assert runs == [(4, 48)]  # a [4, 2I] test input, once


@pytest.fixture
def fused_on_cpu(monkeypatch, grouped_on_cpu):
    """FUSED_SWIGLU on, the fused seam a CPU stand-in: torch._grouped_mm and silu * mul."""
    calls = []

    def fused(x, w, offs):
        calls.append((tuple(x.shape), tuple(w.shape)))
        h = torch._grouped_mm(x, w, offs=offs)
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up

    monkeypatch.setattr(experts, "FUSED_SWIGLU", True)
    monkeypatch.setattr(experts, "FUSED_SWIGLU_ABOVE", 0)  # every size: these calls have 22 slots
    monkeypatch.setattr(experts, "_grouped_swiglu", fused)
    return calls


@pytest.mark.parametrize("elsewhere", [False, True], ids=["local", "ep-sentinels"])
def test_the_fused_gate_runs_in_inference_and_is_the_per_token_computation(
    fused_on_cpu, grouped_on_cpu, elsewhere
):
    mod = _Experts()
    hidden = torch.randn(11, 16, generator=torch.Generator().manual_seed(1))
    index, weights = _routing(elsewhere=elsewhere)
    with torch.no_grad():
        got = experts.experts_forward(mod, hidden, index, weights)
        want = mod.reference(hidden, index, weights)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert fused_on_cpu == [((22, 16), (6, 16, 48))]  # gate_up, fused: [S, H] by [E, H, 2I]
    assert [c[1] for c in grouped_on_cpu] == [(6, 24, 16)]  # down alone unfused


@pytest.mark.parametrize(
    ("module", "grad"),
    [
        pytest.param(_Experts, True, id="training"),
        pytest.param(_InterleavedExperts, False, id="interleaved-gate"),
        pytest.param(_ClampedExperts, False, id="clamped-gate"),
        pytest.param(lambda: _Experts(has_bias=True), False, id="gate-up-bias"),
        pytest.param(lambda: _Experts(has_gate=False), False, id="no-gate"),
    ],
)
def test_the_fused_gate_stays_off_where_it_would_differ(fused_on_cpu, grouped_on_cpu, module, grad):
    mod = module()
    hidden = torch.randn(11, 16, generator=torch.Generator().manual_seed(1))
    index, weights = _routing()
    with torch.set_grad_enabled(grad):
        got = experts.experts_forward(mod, hidden, index, weights)
        want = mod.reference(hidden, index, weights)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert fused_on_cpu == [] and len(grouped_on_cpu) == 2


def test_the_fused_gate_is_on_by_default_with_the_line_at_the_swap_ab_kernels_rows():
    assert experts.FUSED_SWIGLU is True and experts.FUSED_SWIGLU_ABOVE is None


@pytest.mark.parametrize(("decode_rows", "fused"), [(21, True), (22, False)])
def test_by_default_the_fused_gate_runs_above_the_swap_ab_kernels_rows(
    fused_on_cpu, grouped_on_cpu, monkeypatch, decode_rows, fused
):
    """The default line (FUSED_SWIGLU_ABOVE None) is grouped_auto.DECODE_ROWS: 11 tokens x top-2
    are 22 token-slots, fused above a line of 21, not at a line of 22."""
    monkeypatch.setattr(experts, "FUSED_SWIGLU_ABOVE", None)
    monkeypatch.setattr(grouped_auto, "DECODE_ROWS", decode_rows)
    with torch.no_grad():
        experts.experts_forward(_Experts(), torch.randn(11, 16), *_routing())
    assert (len(fused_on_cpu), len(grouped_on_cpu)) == ((1, 1) if fused else (0, 2))


@pytest.fixture
def routed_on_cpu(monkeypatch, grouped_on_cpu):
    """The routed seam a CPU stand-in (the module's per-token reference) and every CPU call taken
    for an eager CUDA one, so that only the choice decides: the calls it got."""
    calls = []

    def routed(hidden, w_gate_up, w_down, top_k_index, top_k_weights):
        calls.append((tuple(hidden.shape), tuple(top_k_index.shape)))
        return torch.full_like(hidden, 7.0)  # a value no other path gives

    monkeypatch.setattr(experts.api, "untraced_cuda", lambda x, weight: True)
    monkeypatch.setattr(experts, "_routed", routed)
    return calls


def _bf16(module=_Experts, **kw):
    return module(dtype=torch.bfloat16, **kw) if module is _Experts else module().to(torch.bfloat16)


def test_the_routed_path_takes_a_decode_call_in_inference(routed_on_cpu, grouped_on_cpu):
    """3 tokens x top-2 = 6 pairs over 6 experts: one pair per expert, the default line."""
    hidden = torch.randn(3, 16).to(torch.bfloat16)
    index, weights = _routing(T=3)
    with torch.no_grad():
        got = experts.experts_forward(_bf16(), hidden, index, weights.to(torch.bfloat16))
    assert routed_on_cpu == [((3, 16), (3, 2))] and grouped_on_cpu == []
    assert bool((got == 7.0).all())


@pytest.mark.parametrize(
    ("case", "module"),
    [
        pytest.param("more pairs than experts", _bf16, id="pairs"),
        pytest.param("training", _bf16, id="training"),
        pytest.param("switched off", _bf16, id="off"),
        pytest.param("fp32", lambda: _Experts(), id="fp32"),
        pytest.param("rows deeper than a chunk", _bf16, id="deep"),
        pytest.param("traced", _bf16, id="traced"),
        pytest.param("strided tokens", _bf16, id="strided"),
        pytest.param("bias", lambda: _Experts(has_bias=True, dtype=torch.bfloat16), id="bias"),
        pytest.param("no gate", lambda: _Experts(has_gate=False, dtype=torch.bfloat16), id="no-gate"),
        pytest.param("interleaved gate", lambda: _bf16(_InterleavedExperts), id="interleaved"),
        pytest.param("clamped gate", lambda: _bf16(_ClampedExperts), id="clamped"),
    ],
)
def test_the_routed_path_stays_off_where_it_does_not_apply(
    routed_on_cpu, grouped_on_cpu, monkeypatch, case, module
):
    mod = module()
    T = 4 if case == "more pairs than experts" else 3  # 8 pairs over 6 experts, or 6
    hidden = torch.randn(T, 32 if case == "strided tokens" else 16).to(mod.down_proj.dtype)
    if case == "strided tokens":
        hidden = hidden[:, ::2]
    index, weights = _routing(T=T)
    if case == "switched off":
        monkeypatch.setattr(experts, "ROUTED", False)
    if case == "rows deeper than a chunk":
        monkeypatch.setattr(moe, "routed_max_k", lambda elem_bytes=2: 8)
    if case == "traced":
        monkeypatch.setattr(experts.api, "untraced_cuda", lambda x, weight: False)
    with torch.set_grad_enabled(case == "training"):
        experts.experts_forward(mod, hidden, index, weights.to(hidden.dtype))
    assert routed_on_cpu == [] and len(grouped_on_cpu) >= 1


def test_the_routed_path_is_on_by_default_up_to_one_pair_per_expert():
    assert experts.ROUTED is True and experts.ROUTED_PAIRS_PER_EXPERT == 1


@pytest.mark.parametrize(
    ("kernel", "most", "rows", "warps", "want"),
    [
        ("gate_up", 8, 768, 4, 8),  # Qwen3-30B-A3B's I on H = 2048's four warps
        ("gate_up", 8, 100, 8, 4),  # the largest power of two dividing the rows
        ("gate_up", 8, 14336, 32, 4),  # 32 warps hold four rows of gate and up
        ("down", 8, 4096, 32, 2),  # the fp32 sum across pairs: two rows on 32 warps
        ("down", 8, 7168, 16, 4),
        ("down", 2, 2048, 2, 2),  # never more than asked
        ("down", 8, 2881, 4, 1),  # odd rows: one a program
    ],
)
def test_routed_programs_take_the_rows_that_divide_and_fit(kernel, most, rows, warps, want):
    assert routed.rows_for(kernel, most, rows, warps) == want


def test_a_routed_config_takes_powers_of_two():
    with pytest.raises(ValueError, match=r"DOWN_ROWS \(3\) must be a power of two"):
        routed.RoutedConfig(GATE_UP_ROWS=4, DOWN_ROWS=3)


# --------------------------------------------------------------------------------------------------
# register / patch_experts, against a stand-in for transformers


class _Interface:
    mapping: ClassVar[dict] = {}

    @classmethod
    def register(cls, key, value):
        cls.mapping[key] = value


def _fake_transformers(monkeypatch, interface=True, version="5.17.0"):
    package = types.ModuleType("transformers")
    package.__version__ = version
    integrations = types.ModuleType("transformers.integrations")
    moe_module = types.ModuleType("transformers.integrations.moe")
    if interface:
        _Interface.mapping = {}
        moe_module.ALL_EXPERTS_FUNCTIONS = _Interface
    package.integrations, integrations.moe = integrations, moe_module
    for name, module in (
        ("transformers", package),
        ("transformers.integrations", integrations),
        ("transformers.integrations.moe", moe_module),
    ):
        monkeypatch.setitem(sys.modules, name, module)


def test_without_transformers_the_error_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # what an absent package looks like to import
    monkeypatch.delitem(sys.modules, "transformers.integrations", raising=False)
    monkeypatch.delitem(sys.modules, "transformers.integrations.moe", raising=False)
    with pytest.raises(ImportError, match=r"pip install -e \.\[models\]"):
        experts.register()
    with pytest.raises(ImportError, match=r"pip install -e \.\[models\]"):
        experts.patch_experts(nn.Linear(2, 2))


def test_a_transformers_without_the_experts_interface_is_named(monkeypatch):
    _fake_transformers(monkeypatch, interface=False, version="4.46.0")
    with pytest.raises(ImportError, match=r"transformers 4\.46\.0 has no experts interface.*\.\[models\]"):
        experts.register()


def test_the_module_imports_without_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    importlib.reload(experts)  # transformers is imported only when register() is called


def test_register_adds_gluon_survey(monkeypatch):
    _fake_transformers(monkeypatch)
    experts.register()
    assert _Interface.mapping == {"gluon_survey": experts.experts_forward}


def _fake_cuda_experts(dtype=BF16, H=16, I=24, **flags):
    mod = _Experts(H=H, I=I, dtype=dtype)
    for name in ("gate_up_proj", "down_proj"):
        p = getattr(mod, name)
        setattr(mod, name, nn.Parameter(torch.empty(p.shape, dtype=dtype, device="cuda")))
    for key, value in flags.items():
        setattr(mod, key, value)
    return mod


class _Layer(nn.Module):
    def __init__(self, experts_module):
        super().__init__()
        self.mlp = nn.Module()
        self.mlp.experts = experts_module


def test_patch_experts_switches_every_experts_module(monkeypatch):
    _fake_transformers(monkeypatch)
    with FakeTensorMode():
        model = nn.Sequential(_Layer(_fake_cuda_experts()), nn.Linear(2, 2), _Layer(_fake_cuda_experts()))
        shared = model[0].mlp.experts.config
        model[2].mlp.experts.config = shared  # one config for the whole model, as in Mixtral
        assert experts.patch_experts(model) == ("0.mlp.experts", "2.mlp.experts")
    assert shared._experts_implementation == "gluon_survey"
    assert _Interface.mapping == {"gluon_survey": experts.experts_forward}


def test_patch_experts_checks_each_modules_gate_outside_any_trace(monkeypatch):
    _fake_transformers(monkeypatch)
    checked = []
    monkeypatch.setattr(experts, "swiglu_gate", lambda module: checked.append(module) or True)
    with FakeTensorMode():
        model = nn.Sequential(_Layer(_fake_cuda_experts()), _Layer(_fake_cuda_experts()))
        experts.patch_experts(model)
    assert checked == [model[0].mlp.experts, model[1].mlp.experts]


def test_a_gate_that_cannot_run_on_the_test_input_is_not_the_fused_one_and_not_kept():
    mod = _Experts()
    mod.act_fn = None  # calling it fails
    assert experts.swiglu_gate(mod) is False and experts._SWIGLU_SEEN not in mod.__dict__
    mod.act_fn = nn.SiLU()
    assert experts.swiglu_gate(mod) is True


@pytest.mark.parametrize(
    ("module", "match"),
    [
        (lambda: _fake_cuda_experts(is_transposed=True), r"stored \[E, K, N\] \(is_transposed\)"),
        (lambda: _fake_cuda_experts(dtype=torch.float32), r"gate_up_proj is torch\.float32.*bfloat16"),
        (lambda: _Experts(dtype=BF16), r"gate_up_proj is on cpu.*model\.cuda\(\)"),
        (
            lambda: _fake_cuda_experts(H=20),
            r"gate_up_proj is \(6, 48, 20\): its K = 20 is not a multiple of 8",
        ),
        (lambda: _fake_cuda_experts(I=12), r"down_proj is \(6, 16, 12\): its K = 12"),
    ],
    ids=["transposed", "fp32", "cpu", "hidden-20", "intermediate-12"],
)
def test_patch_experts_refuses_modules_the_kernel_cannot_run_and_changes_nothing(monkeypatch, module, match):
    _fake_transformers(monkeypatch)
    with FakeTensorMode():
        model = nn.Sequential(_Layer(_fake_cuda_experts()), _Layer(module()))
        assert experts.experts_reason(model[0].mlp.experts) is None
        with pytest.raises(ValueError, match=rf"1\.mlp\.experts: .*{match}"):
            experts.patch_experts(model)
    assert [layer.mlp.experts.config._experts_implementation for layer in model] == ["grouped_mm"] * 2


def test_patch_experts_wants_a_model_with_experts(monkeypatch):
    _fake_transformers(monkeypatch)
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module"):
        experts.patch_experts("model")
    with pytest.raises(ValueError, match="Linear has no experts module"):
        experts.patch_experts(nn.Linear(2, 2))


def test_the_package_exports_patch_experts_lazily():
    assert gluon_survey.patch_experts is experts.patch_experts
    assert "patch_experts" in gluon_survey.__all__
