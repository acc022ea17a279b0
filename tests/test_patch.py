"""`gluon_survey.patch` / `unpatch` without a GPU: which modules are swapped and why others are not,
the Parameters shared (the same objects), idempotence, nested and shared modules. CUDA modules are
FakeTensors on "cuda" (tests/test_api_host.py does the same): shapes, dtypes and devices, no
storage. On a real GPU, with numbers and CUDA graphs: tests/test_patch_gpu.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import gluon_survey
from gluon_survey import PatchReport, patch, unpatch
from gluon_survey.ops import Linear


@pytest.fixture
def fake_cuda():
    with FakeTensorMode():
        yield


def _cuda_linear(i: int, o: int, bias: bool = True, dtype=torch.bfloat16, cls=nn.Linear) -> nn.Linear:
    """An nn.Linear (or `cls`) whose Parameters are CUDA tensors (FakeTensors: no initialisation)."""
    lin = cls(i, o, bias=bias, device="meta", dtype=dtype)
    lin.weight = nn.Parameter(torch.empty(o, i, device="cuda", dtype=dtype))
    if bias:
        lin.bias = nn.Parameter(torch.empty(o, device="cuda", dtype=dtype))
    return lin


def _params(model: nn.Module) -> dict[str, int]:
    return {name: id(p) for name, p in model.named_parameters()}


def test_every_cuda_half_linear_is_swapped_on_its_own_parameters(fake_cuda):
    model = nn.Sequential(
        _cuda_linear(16, 32), nn.ReLU(), _cuda_linear(32, 8, bias=False, dtype=torch.float16)
    )
    before = _params(model)
    weights = [model[0].weight, model[0].bias, model[2].weight]
    report = patch(model, kernel="splitk")
    assert isinstance(report, PatchReport)
    assert report.swapped == ("0", "2") and report.skipped == {}
    assert int(report) == len(report) == 2
    assert type(model[0]) is Linear and type(model[2]) is Linear and type(model[1]) is nn.ReLU
    assert model[0].kernel == "splitk" and model[2].bias is None
    assert [model[0].weight, model[0].bias, model[2].weight] == weights  # the same objects
    assert all(
        a is b for a, b in zip([model[0].weight, model[0].bias, model[2].weight], weights, strict=True)
    )
    assert _params(model) == before  # same names, same Parameters: state_dict and optimizers hold
    assert list(model.state_dict()) == ["0.weight", "0.bias", "2.weight"]


def test_modules_the_kernels_cannot_take_are_left_alone_with_the_reason(fake_cuda):
    model = nn.ModuleDict(
        {
            "fp32": _cuda_linear(8, 8, dtype=torch.float32),
            "ok": _cuda_linear(8, 8),
        }
    )
    report = patch(model)
    assert report.swapped == ("ok",)
    assert set(report.skipped) == {"fp32"}
    assert "float32" in report.skipped["fp32"] and "bfloat16" in report.skipped["fp32"]
    assert type(model["fp32"]) is nn.Linear


def test_cpu_modules_and_odd_biases_are_skipped():
    model = nn.ModuleDict({"on_cpu": nn.Linear(8, 8).bfloat16(), "fp32": nn.Linear(8, 8)})
    report = patch(model)
    assert report.swapped == () and int(report) == 0
    assert "on cpu" in report.skipped["on_cpu"] and "model.cuda()" in report.skipped["on_cpu"]
    assert "float32" in report.skipped["fp32"]
    assert all(type(m) is nn.Linear for m in model.values())


def test_a_bias_of_another_dtype_is_skipped(fake_cuda):
    lin = _cuda_linear(8, 8)
    lin.bias = nn.Parameter(torch.zeros(8, device="cuda", dtype=torch.float32))
    model = nn.Sequential(lin)
    report = patch(model)
    assert report.swapped == () and "bias is torch.float32" in report.skipped["0"]


def test_subclasses_of_linear_are_skipped(fake_cuda):
    class Lora(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    model = nn.Sequential(_cuda_linear(8, 8, cls=Lora))
    report = patch(model)
    assert report.swapped == () and "subclass" in report.skipped["0"]


def test_filter_keeps_only_what_it_accepts(fake_cuda):
    model = nn.ModuleDict({"q": _cuda_linear(8, 8), "k": _cuda_linear(8, 8), "lm_head": _cuda_linear(8, 4)})
    seen = []

    def keep(name, module):
        seen.append((name, type(module)))
        return name != "lm_head"

    report = patch(model, filter=keep)
    assert sorted(report.swapped) == ["k", "q"] and report.skipped == {}
    assert type(model["lm_head"]) is nn.Linear
    assert {n for n, _ in seen} == {"q", "k", "lm_head"} and all(t is nn.Linear for _, t in seen)


def test_patching_twice_changes_nothing(fake_cuda):
    model = nn.Sequential(_cuda_linear(8, 8), _cuda_linear(8, 8))
    patch(model)
    swapped = [model[0], model[1]]
    again = patch(model)
    assert int(again) == 0 and again.skipped == {
        "0": "already a gluon_survey.Linear",
        "1": "already a gluon_survey.Linear",
    }
    assert [model[0], model[1]] == swapped
    assert isinstance(model[0].weight, nn.Parameter)  # not a Linear wrapped in a Linear


def test_nested_containers_and_a_shared_module(fake_cuda):
    shared = _cuda_linear(8, 8)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = shared
            self.mlp = nn.Sequential(_cuda_linear(8, 16), nn.GELU(), _cuda_linear(16, 8))

    model = nn.Module()
    model.layers = nn.ModuleList([Block(), Block()])
    model.heads = nn.ModuleDict({"a": _cuda_linear(8, 2), "tied": shared})
    report = patch(model)
    assert sorted(report.swapped) == sorted(
        ["heads.a", "layers.0.mlp.0", "layers.0.mlp.2", "layers.0.proj", "layers.1.mlp.0", "layers.1.mlp.2"]
    ) or sorted(report.swapped) == sorted(
        ["heads.a", "heads.tied", "layers.0.mlp.0", "layers.0.mlp.2", "layers.1.mlp.0", "layers.1.mlp.2"]
    )
    assert len(report) == 6  # the shared module once
    new = model.layers[0].proj
    assert type(new) is Linear and new is model.layers[1].proj and new is model.heads["tied"]
    assert new.weight is shared.weight
    assert not any(type(m) is nn.Linear for m in model.modules())


def test_unpatch_restores_nn_linear_on_the_same_parameters(fake_cuda):
    model = nn.Sequential(_cuda_linear(8, 8), nn.Sequential(_cuda_linear(8, 4, bias=False)))
    model.eval()
    params = _params(model)
    assert int(patch(model)) == 2
    assert unpatch(model) == 2
    assert type(model[0]) is nn.Linear and type(model[1][0]) is nn.Linear
    assert _params(model) == params and model[1][0].bias is None
    assert not model[0].training  # the mode carries over both ways
    assert unpatch(model) == 0


def test_a_model_without_linear_and_bad_arguments():
    model = nn.Sequential(nn.ReLU(), nn.Conv1d(2, 2, 1))
    assert patch(model) == PatchReport() and unpatch(model) == 0
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        patch(torch.zeros(2))
    with pytest.raises(KeyError, match="splitk"):
        patch(model, kernel="no-such-kernel")
    with pytest.raises(TypeError, match="filter"):
        patch(model, filter="lm_head")
    lone = nn.Linear(2, 2)
    assert "from_linear" in patch(lone).skipped[""]


def test_patch_is_exported_lazily():
    assert gluon_survey.patch is patch and gluon_survey.unpatch is unpatch
    assert {"patch", "unpatch", "PatchReport"} <= set(gluon_survey.__all__)
