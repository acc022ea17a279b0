"""The launch path of a cached plan without a GPU (`kernels.plan.Plan`, `Launcher`): on triton 3.6
the plan hands the C launcher descriptors it encoded once per operand address (`compat.raw_launch`),
and falls back to Triton's launcher while a launch hook is set or where that launcher is not
found. The C launcher is faked here by a recorder of its arguments and the encoding by a tuple
naming the address; on the GPU, tests/test_ops_gpu.py checks the products."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from triton import knobs

from gluon_survey import compat
from gluon_survey.kernels import pipelined
from gluon_survey.kernels.plan import ENCODED_PER_SLOT, Launcher, Plan, make_descriptors, templates_of
from gluon_survey.launch import Unaligned
from recording import Launched, Recorder

CONSTEXPRS = {"BLOCK": 64, "FLAG": True}


class FakeRaw:
    """Stands for `compat.RawLaunch`: records each launch and each encoding."""

    descriptors = (0, 1, 2)
    head = ("function", False, False)

    def __init__(self):
        self.launches: list[tuple] = []
        self.encoded: list[tuple[int, int]] = []  # (descriptor number, address)

    def launch(self, *args):
        self.launches.append(args)

    def encode(self, descriptor, i):
        self.encoded.append((i, descriptor.base.data_ptr()))
        return (("map", i, descriptor.base.data_ptr()), *descriptor.shape, *descriptor.strides)


def _tensors(M=64, N=256, K=128):
    a = torch.randn(M, K).half()
    w = torch.randn(N, K).half()
    return a, w.t(), torch.empty(M, N, dtype=torch.float16)


@pytest.fixture
def plan():
    """A pipelined plan for 64 x 256 x 128, its launcher's C launcher faked, its kernel recorded."""
    a, b, out = _tensors()
    cfg = pipelined.RUNG.configs[9]
    templates = templates_of(make_descriptors(a, b, out, cfg, "t"))
    log: list[Launched] = []
    launcher = Launcher(Recorder("pipelined_kernel", log), (4,), CONSTEXPRS, 4)
    launcher.raw = FakeRaw()
    launcher.stream = (lambda device: 7, lambda: 0)  # (get_stream, get_device)
    return SimpleNamespace(plan=Plan(launcher, templates, cfg), raw=launcher.raw, log=log)


def _expected(raw: FakeRaw, *tensors) -> tuple:
    args = []
    for i, t in enumerate(tensors):
        described = t.t() if i == 1 else t  # B: the [N, K] weight behind the view
        args += [("map", i, t.data_ptr()), *described.shape, *described.stride()]
    return (4, 1, 1, 7, *raw.head, *args, *CONSTEXPRS.values())


def test_a_repeated_launch_encodes_nothing_new(plan):
    a, b, out = _tensors()
    for _ in range(4):
        plan.plan.launch(a, b, out)
    assert len(plan.log) == 1  # the first call: Triton's launcher (it compiles)
    assert plan.raw.encoded == [(0, a.data_ptr()), (1, b.data_ptr()), (2, out.data_ptr())]
    assert plan.raw.launches == [_expected(plan.raw, a, b, out)] * 3


def test_a_new_address_is_encoded_once_and_the_others_kept(plan):
    a, b, out = _tensors()
    a2 = torch.randn_like(a)
    plan.plan.launch(a, b, out)
    plan.plan.launch(a, b, out)
    plan.plan.launch(a2, b, out)
    plan.plan.launch(a2, b, out)
    assert plan.raw.encoded[3:] == [(0, a2.data_ptr())]
    assert plan.raw.launches[-1] == _expected(plan.raw, a2, b, out)


def test_the_encodings_kept_per_operand_are_bounded(plan):
    _, b, out = _tensors()
    inputs = [torch.randn(64, 128).half() for _ in range(ENCODED_PER_SLOT + 3)]
    plan.plan.launch(inputs[0], b, out)  # compiles
    for a in inputs:
        plan.plan.launch(a, b, out)
        assert plan.raw.launches[-1] == _expected(plan.raw, a, b, out)
    assert len(plan.plan.encoded[0]) <= ENCODED_PER_SLOT
    assert len(plan.plan.encoded[1]) == len(plan.plan.encoded[2]) == 1


def test_a_launch_hook_takes_tritons_launcher(plan, monkeypatch):
    a, b, out = _tensors()
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    plan.plan.launch(a, b, out)
    fn = plan.plan.bind(a, b, out)
    fn()
    fn()
    assert plan.raw.launches == [] and len(plan.log) == 3
    for launched in plan.log:
        assert [d.base for d in launched.descriptors] == [a, b, out]
        assert launched.kwargs == CONSTEXPRS | {"num_warps": 4}


@pytest.mark.parametrize("hooked", [False, True], ids=["encoded", "tritons"])
@pytest.mark.parametrize("operand", [0, 1, 2], ids=["a", "b", "out"])
def test_a_misaligned_base_is_refused_before_anything_is_launched(plan, monkeypatch, hooked, operand):
    """TMA's rule, checked where the launch first meets an address (on the encoded path: an
    address that misses the cache; on Triton's: every call); an aligned address seen before is
    not read again for it."""
    tensors = list(_tensors())
    plan.plan.launch(*tensors)  # compiles
    plan.plan.launch(*tensors)
    if hooked:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    shape, dtype = tensors[operand].shape, tensors[operand].dtype
    if operand == 1:  # the [N, K] weight behind the view
        shape = shape[::-1]
    flat = torch.empty(shape.numel() + 1, dtype=dtype)
    off = flat[1:].view(shape)
    tensors[operand] = off.t() if operand == 1 else off
    launches, log = list(plan.raw.launches), list(plan.log)
    with pytest.raises(Unaligned, match=f"{'ABC'[operand]}'s base address is not 16-byte aligned"):
        plan.plan.launch(*tensors)
    assert (plan.raw.launches, plan.log) == (launches, log)
    assert all(address % 16 == 0 for cache in plan.plan.encoded for address in cache)


def test_the_bare_launch_encodes_once_after_its_first_call(plan):
    a, b, out = _tensors()
    fn = plan.plan.bind(a, b, out)
    for _ in range(3):
        fn()
    assert len(plan.log) == 1  # the first call: Triton's launcher (it compiles)
    assert len(plan.raw.encoded) == 3
    assert plan.raw.launches == [_expected(plan.raw, a, b, out)] * 2


def test_without_the_c_launcher_each_call_takes_tritons(plan):
    a, b, out = _tensors()
    plan.plan.launcher.raw = None
    plan.plan.launch(a, b, out)
    plan.plan.launch(a, b, out)
    assert len(plan.log) == 2 and plan.plan.encoded == ({}, {}, {})


def test_raw_launch_is_none_for_a_launcher_it_does_not_know():
    compiled = SimpleNamespace(run=lambda *args: None, src=None, metadata=None)
    assert compat.raw_launch(compiled) is None


def test_a_kernel_without_descriptors_passes_its_arguments_as_they_are():
    """gemv's launch: pointers and integers straight to the C launcher, once compiled."""
    log: list[Launched] = []
    launcher = Launcher(Recorder("gemv_kernel", log), (3,), CONSTEXPRS, 4)
    launcher(1, 2)  # the first call: Triton's launcher
    raw = FakeRaw()
    raw.descriptors = ()
    launcher.compiled, launcher.raw, launcher.stream = object(), raw, (lambda device: 7, lambda: 0)
    launcher(1, 2)
    assert len(log) == 1 and raw.launches == [(3, 1, 1, 7, *raw.head, 1, 2, *CONSTEXPRS.values())]


@pytest.mark.parametrize("pdl", [False, True])
def test_a_dependent_launch_is_a_compile_option_of_the_first_call(pdl):
    """`pdl` asks Triton for a programmatic dependent launch (`launch_pdl`, which the compiled
    kernel's launcher then sets on every launch); without it the option is not passed at all."""
    log: list[Launched] = []
    Launcher(Recorder("swapab_kernel", log), (3,), CONSTEXPRS, 4, pdl=pdl)(1, 2)
    (launched,) = log
    expected = {"num_warps": 4} | ({"launch_pdl": True} if pdl else {})
    assert launched.kwargs == CONSTEXPRS | expected
