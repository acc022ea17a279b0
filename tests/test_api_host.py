"""`matmul`'s host side without a GPU: plans cached per key, rebuilt when the key changes, the
per-call Python cost, the unchanged errors; and `gluon_survey.ops` (the custom operator's fake
implementation, torch.compile(fullgraph=True) tracing, `Linear`).

The GPU is faked as in tests/test_blackwell_compile.py: `api.target_of` answers an H100, tensors
are FakeTensors on "cuda" (shapes, strides, dtypes, no storage) and the rung kernels are replaced
by recorders, so a launch is a Python call that records its arguments. The same on a real GPU, with
numbers: tests/test_ops_gpu.py.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import gluon_survey
from bad_inputs import BAD_INPUTS
from gluon_survey import api, ops
from gluon_survey.baselines import torch_ops
from gluon_survey.driver import cli, overhead
from gluon_survey.kernels import blocked, persistent, pipelined, slab, splitk, swapab, warpspec
from gluon_survey.kernels.plan import Plan
from gluon_survey.launch import Launch, Scales, Target, a_layout, is_a_kmajor
from recording import Launched, Recorder

pytestmark = pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")

H100 = Target((9, 0), 132, "NVIDIA H100 80GB HBM3")
RUNG_MODULES = (blocked, pipelined, persistent, warpspec, slab)


@dataclass
class Host:
    launches: list[Launched]
    builds: list[tuple]  # the (kernel, a, b, out) of every plan built


def _fake_gpu(monkeypatch, log: list[Launched] | None) -> list[tuple]:
    """Fake an H100 for `api`, record the rung launches in `log`, count plan builds; an empty plan
    cache for the test, the previous one restored after it."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    monkeypatch.setattr(api, "target_of", lambda device: H100)
    monkeypatch.setattr(api, "_PLANS", {})
    for module in RUNG_MODULES:
        rung = module.RUNG
        monkeypatch.setattr(
            module, "RUNG", dataclasses.replace(rung, kernel=Recorder(rung.kernel.__name__, log))
        )
    monkeypatch.setattr(swapab, "swapab_kernel", Recorder("swapab_kernel", log))  # the rule's few tokens
    builds: list[tuple] = []
    build = api._build_plan

    def counting_build(kernel, a, b, out, *fp8):
        builds.append((kernel, a, b, out))
        return build(kernel, a, b, out, *fp8)

    monkeypatch.setattr(api, "_build_plan", counting_build)
    return builds


@pytest.fixture
def host(monkeypatch) -> Host:
    log: list[Launched] = []
    builds = _fake_gpu(monkeypatch, log)
    with FakeTensorMode():
        yield Host(log, builds)


def _operands(M: int, N: int, K: int, layout: str = "t", dtype=torch.bfloat16):
    a = torch.empty(M, K, dtype=dtype, device="cuda")
    b = (
        torch.empty(N, K, dtype=dtype, device="cuda").t()
        if layout == "t"
        else torch.empty(K, N, dtype=dtype, device="cuda")
    )
    return a, b, torch.empty(M, N, dtype=dtype, device="cuda")


# --------------------------------------------------------------------------------------------------
# Plans: built once per key


@pytest.mark.parametrize("kernel", ["Blocked", "Pipelined", "persistent", "warpspec", None])
def test_a_repeated_call_reuses_its_plan_on_the_new_tensors(host, kernel):
    M = 3000 if kernel else 16  # kernel=None: the rule's whole-K swapab (cuBLAS above 16 tokens)
    first = _operands(M, 520, 264)
    second = _operands(M, 520, 264)
    assert api.matmul(*first[:2], kernel=kernel, out=first[2]) is first[2]
    assert api.matmul(*second[:2], kernel=kernel, out=second[2]) is second[2]
    assert len(host.builds) == 1, "the second call of the same key built a plan again"
    one, two = host.launches
    assert (one.kernel, one.grid, one.kwargs) == (two.kernel, two.grid, two.kwargs)
    assert two.rest[:3] in ((None,), (None, None, None))  # no bias (Blocked), nor fp8 scales
    assert two.kwargs["HAS_BIAS"] is False
    for desc, tensor in zip(two.descriptors, (second[0], second[1], second[2]), strict=True):
        assert desc.base is tensor  # this call's tensors, not the first call's
    for d1, d2 in zip(one.descriptors, two.descriptors, strict=True):
        assert (d1.shape, d1.strides, d1.block_shape, d1.layout) == (
            d2.shape,
            d2.strides,
            d2.block_shape,
            d2.layout,
        )


def test_an_allocated_output_is_new_contiguous_and_launched_on(host):
    a, b, _ = _operands(300, 520, 264)
    c1 = api.matmul(a, b, kernel="warpspec")
    c2 = api.matmul(a, b, kernel="warpspec")
    for c in (c1, c2):
        assert (c.shape, c.stride(), c.dtype, c.device.type) == ((300, 520), (520, 1), a.dtype, "cuda")
    assert c1 is not c2 and len(host.builds) == 1
    bases = [launch.descriptors[2].base for launch in host.launches]
    assert len(bases) == 2 and bases[0] is c1 and bases[1] is c2


@pytest.mark.parametrize("rung", ["Blocked", "persistent", "warpspec"])
def test_matmul_launches_what_prepare_launches(host, rung):
    a, b, out = _operands(1000, 3000, 520, "row")
    api.prepare(rung, a, b, out).fn()
    api.matmul(a, b, kernel=rung, out=out)
    api.matmul(a, b, kernel=rung, out=out)  # from the cached plan
    prepared, *planned = host.launches
    for launched in planned:
        assert (launched.kernel, launched.grid, launched.kwargs) == (
            prepared.kernel,
            prepared.grid,
            prepared.kwargs,
        )
        for d1, d2 in zip(prepared.descriptors, launched.descriptors, strict=True):
            assert d1.base is d2.base or d1.base.data_ptr() == d2.base.data_ptr()
            assert {f.name: getattr(d1, f.name) for f in dataclasses.fields(d1) if f.name != "base"} == {
                f.name: getattr(d2, f.name) for f in dataclasses.fields(d2) if f.name != "base"
            }


def _variants():
    """(name, make the arguments of a call) that must each get a plan of their own."""

    def strided(rows: int, cols: int, row_stride: int, dtype=torch.bfloat16):
        return torch.empty_strided((rows, cols), (row_stride, 1), dtype=dtype, device="cuda")

    def base():
        return _operands(64, 256, 128, "t")

    def padded_a():  # another row stride, still TMA-describable (272 bytes)
        _, b, out = base()
        return strided(64, 128, 136), b, out

    def misaligned_a():  # a row stride TMA cannot describe (258 bytes): an aligned copy
        _, b, out = base()
        return strided(64, 128, 129), b, out

    def fp16():
        return _operands(64, 256, 128, "t", torch.float16)

    def row_b():
        return _operands(64, 256, 128, "row")

    def padded_out():
        a, b, _ = base()
        return a, b, strided(64, 256, 264)

    def no_out():
        a, b, _ = base()
        return a, b, None

    return {
        "base": base,
        "a-stride": padded_a,
        "a-misaligned": misaligned_a,
        "dtype": fp16,
        "b-layout": row_b,
        "out-stride": padded_out,
        "no-out": no_out,
    }


def test_each_change_of_the_key_builds_a_plan(host, copies):
    variants = _variants()
    for name, make in variants.items():
        for _ in range(2):
            a, b, out = make()
            result = api.matmul(a, b, kernel="persistent", out=out)
            assert result.shape == (a.shape[0], b.shape[1]), name
    assert [b[1].dtype for b in host.builds] == [v()[0].dtype for v in variants.values()]
    assert len(host.builds) == len(variants) == len(api._PLANS)
    assert len(host.launches) == 2 * len(variants)
    api.matmul(*variants["base"]()[:2], kernel="warpspec", out=variants["base"]()[2])  # another kernel
    assert len(host.builds) == len(variants) + 1


def test_the_key_holds_the_kernel_out_and_the_gpu_but_no_address(monkeypatch):
    """Two views of the same shape and strides, one 16-byte aligned, one 2 bytes off, have the same
    key (the plan under it checks the bases: the next tests); two GPUs have different keys."""
    monkeypatch.setattr(api, "target_of", lambda device: H100)
    big = torch.empty(64 * 128 + 8, dtype=torch.float16)
    aligned, off = big[: 64 * 128].view(64, 128), big[1 : 1 + 64 * 128].view(64, 128)
    b = torch.empty(128, 32, dtype=torch.float16)
    assert (aligned.shape, aligned.stride()) == (off.shape, off.stride())
    assert api._plan_key(None, aligned, b, None) == api._plan_key(None, off, b, None)
    assert api._alignment(aligned, b, None) == api._ALIGNED != api._alignment(off, b, None)
    assert api._plan_key(None, aligned, b, None) == api._plan_key(None, aligned.clone(), b.clone(), None)
    assert api._plan_key(None, aligned, b, None) != api._plan_key("warpspec", aligned, b, None)
    assert api._plan_key(None, aligned, b, None) != api._plan_key(
        None, aligned, b, torch.empty(64, 32).half()
    )
    monkeypatch.setattr(api, "target_of", lambda device: dataclasses.replace(H100, sm_count=114))
    other_gpu = api._plan_key(None, aligned, b, None)
    monkeypatch.setattr(api, "target_of", lambda device: H100)
    assert other_gpu != api._plan_key(None, aligned, b, None)


@pytest.fixture
def addresses(monkeypatch):
    """FakeTensors' base address is 0: give each its storage offset in bytes past a 1 MiB-aligned
    base instead, so that a view 2 bytes in is misaligned."""
    monkeypatch.setattr(torch.Tensor, "data_ptr", lambda t: (1 << 20) + t.storage_offset() * t.element_size())


def _aligned_and_off(M: int, K: int):
    flat = torch.empty(M * K + 1, dtype=torch.bfloat16, device="cuda")
    return flat.narrow(0, 0, M * K).view(M, K), flat.narrow(0, 1, M * K).view(M, K)


@pytest.mark.parametrize("kernel", ["Pipelined", "warpspec"])
@pytest.mark.parametrize("with_out", [False, True], ids=["allocated", "out"])
def test_a_misaligned_base_runs_the_plan_for_its_alignment(host, copies, addresses, kernel, with_out):
    """A base 2 bytes off under the key of an aligned plan: the rung's launch (which checks the
    bases) refuses it before launching, and the call runs a second plan, keyed with the
    alignment, that copies A; aligned calls keep the first plan and its launch on their own
    tensors."""
    aligned, off = _aligned_and_off(300, 264)
    b = torch.empty(520, 264, dtype=torch.bfloat16, device="cuda").t()
    out = torch.empty(300, 520, dtype=torch.bfloat16, device="cuda") if with_out else None
    for a in (aligned, off, aligned, off):
        api.matmul(a, b, kernel=kernel, out=out)
    assert [build[1] is off for build in host.builds] == [False, True]
    assert len(api._PLANS) == 2
    copied = [src for _, src in copies if src is off or src is aligned]
    assert copied == [off, off], "the misaligned A is copied, once per call; the aligned one never"
    bases = [launched.descriptors[0].base for launched in host.launches]
    assert bases[0] is aligned and bases[2] is aligned
    assert all(base is not off and base.storage_offset() == 0 for base in bases[1::2])


@pytest.mark.parametrize("with_out", [False, True], ids=["allocated", "out"])
def test_cublas_takes_a_misaligned_base_as_it_is(host, copies, addresses, monkeypatch, with_out):
    """cuBLAS needs no aligned bases: a cached 16-bit plan that runs it calls `torch.mm` on the
    call's own tensors whatever their alignment (one plan, no copy)."""
    seen = []
    monkeypatch.setattr(torch, "mm", lambda a, b, out=None: seen.append(a) or (a @ b if out is None else out))
    aligned, off = _aligned_and_off(300, 264)
    b = torch.empty(520, 264, dtype=torch.bfloat16, device="cuda").t()
    out = torch.empty(300, 520, dtype=torch.bfloat16, device="cuda") if with_out else None
    for a in (aligned, off, aligned, off):
        result = api.matmul(a, b, kernel="torch", out=out)
        assert result is out if with_out else result.shape == (300, 520)
    assert len(host.builds) == 1 and len(api._PLANS) == 1
    assert [src for _, src in copies if src is off or src is aligned] == []
    assert seen == [aligned, off, aligned, off]


def test_a_plan_for_misaligned_bases_is_not_run_on_aligned_ones(host, copies, addresses):
    """The first call of a key misaligned: its plan is keyed with the alignment, so an aligned call
    of the same shapes gets a plan of its own (no copy), not the copying one."""
    aligned, off = _aligned_and_off(300, 264)
    b = torch.empty(520, 264, dtype=torch.bfloat16, device="cuda").t()
    for a in (off, aligned, aligned):
        api.matmul(a, b, kernel="Pipelined")
    assert [build[1] is off for build in host.builds] == [True, False]
    assert [src for _, src in copies if src is off or src is aligned] == [off]
    assert [launched.descriptors[0].base is aligned for launched in host.launches] == [False, True, True]


@pytest.fixture
def copies(monkeypatch) -> list[tuple]:
    """FakeTensors on "cuda" cannot run `copy_` on a CPU-only build: record (dst, src) instead."""
    log: list[tuple] = []

    def copy_(self, src, non_blocking=False):
        log.append((self, src))
        return self

    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    return log


def test_aligned_copies_are_made_per_call_and_launched(host, copies):
    def strided(rows, cols, row_stride):
        return torch.empty_strided((rows, cols), (row_stride, 1), dtype=torch.float16, device="cuda")

    a = strided(300, 199, 201)  # row stride 402 B: TMA cannot describe it
    b = torch.empty(199, 96, dtype=torch.float16, device="cuda")
    out = strided(300, 96, 97)  # row stride 194 B
    for _ in range(2):
        assert api.matmul(a, b, kernel="Pipelined", out=out) is out
    plan = next(iter(api._PLANS.values())).plan
    assert (plan.copy_a, plan.copy_b, plan.copy_out) == (True, False, True)
    for launched in host.launches:
        a_desc, b_desc, c_desc = launched.descriptors
        assert a_desc.base is not a and tuple(a_desc.base.shape) == (300, 199) and api._tma_ok(a_desc.base)
        assert b_desc.base is b
        assert c_desc.base is not out and api._tma_ok(c_desc.base)
    first, second = host.launches
    assert first.args[0].base is not second.args[0].base  # a fresh copy per call
    # per call: a into its aligned buffer, then the product back into out
    assert copies == [
        (first.args[0].base, a),
        (out, first.args[2].base),
        (second.args[0].base, a),
        (out, second.args[2].base),
    ]
    assert api.prepare("Pipelined", a, b, out).config["aligned_copy"] == "a,out"


def test_empty_products_launch_nothing(host):
    a, b, _ = _operands(0, 64, 32, "row", torch.float16)
    assert api.matmul(a, b, kernel="warpspec").shape == (0, 64)
    a, b, out = _operands(16, 64, 0, "row", torch.float16)
    assert api.matmul(a, b, kernel="warpspec", out=out) is out
    assert host.launches == []


def test_cublas_is_prepared_once_and_then_launched_per_call(host, monkeypatch):
    """The torch mode's launch carries a plan (`torch_ops.CUBLAS`): later calls of the key launch
    cuBLAS on their own tensors without preparing again, through the plan's direct call
    (`CUBLAS.direct`: torch.mm itself)."""
    prepared, launched = [], []
    real_prepare, real_launch = torch_ops.prepare, torch_ops.CUBLAS.launch

    def counting(a, b, out, target=None):
        prepared.append(out)
        return real_prepare(a, b, out, target)

    monkeypatch.setattr(torch_ops, "prepare", counting)
    monkeypatch.setattr(
        torch_ops.CUBLAS, "direct", lambda a, b, out, *rest: launched.append(out) or real_launch(a, b, out)
    )
    outs = [_operands(64, 256, 128, "t")[2] for _ in range(3)]
    a, b, _ = _operands(64, 256, 128, "t")
    for out in outs:
        assert api.matmul(a, b, kernel="torch", out=out) is out
    assert len(host.builds) == 1 and len(prepared) == 1, "prepared for the plan only"
    assert len(launched) == 3 and all(x is y for x, y in zip(launched, outs, strict=True))


def test_a_provider_without_a_plan_is_prepared_per_call(host, monkeypatch):
    prepared: list = []
    real = torch_ops.prepare

    def planless(a, b, out, target=None):
        prepared.append(out)
        launch = real(a, b, out, target)
        return Launch(lambda: launch.fn(), launch.config)

    monkeypatch.setattr(torch_ops, "prepare", planless)
    a, b, out = _operands(64, 256, 128, "t")
    for _ in range(3):
        assert api.matmul(a, b, kernel="torch", out=out) is out
    assert len(host.builds) == 1 and len(prepared) == 1 + 3  # the plan's own, then one per call
    assert all(p is out for p in prepared[1:])


def test_prepare_returns_the_bare_launch_and_its_plan(host):
    a, b, out = _operands(300, 520, 264)
    launch = api.prepare("persistent", a, b, out)
    assert isinstance(launch.fn.plan, Plan)
    launch.fn()
    launch.fn()
    assert len(host.launches) == 2 and host.launches[0].args == host.launches[1].args  # same descriptors
    assert host.builds == []  # prepare caches nothing


@pytest.mark.parametrize(("make", "error", "match"), BAD_INPUTS)
def test_bad_inputs_raise_every_time_and_cache_nothing(host, make, error, match):
    a, b = make()
    for _ in range(2):
        for kernel in ("Pipelined", "warpspec", None):
            with pytest.raises(error, match=match):
                api.matmul(a, b, kernel=kernel)
    assert host.launches == [] and api._PLANS == {}


def test_bad_out_unknown_kernel_and_unsupported_gpu(host, monkeypatch):
    a = torch.empty(8, 8, device="cuda", dtype=torch.float16)
    api.matmul(a, a, kernel="Pipelined")  # a good call first: its plan must not answer the bad ones
    with pytest.raises(ValueError, match="shape"):
        api.matmul(a, a, kernel="Pipelined", out=torch.empty(8, 9, device="cuda", dtype=torch.float16))
    with pytest.raises(TypeError, match="out is"):
        api.matmul(a, a, kernel="Pipelined", out=torch.empty(8, 8, device="cuda"))
    with pytest.raises(TypeError, match=r"out must be a torch\.Tensor"):
        api.matmul(a, a, kernel="Pipelined", out="nope")
    with pytest.raises(KeyError, match="valid modes"):
        api.matmul(a, a, kernel="nope")
    monkeypatch.setattr(api, "target_of", lambda device: Target((8, 0), 108, "NVIDIA A100"))
    with pytest.raises(RuntimeError, match="cannot run on this GPU"):
        api.matmul(a, a, kernel="Pipelined")  # the same arguments, another GPU: not the cached plan
    assert len(api._PLANS) == 1


# --------------------------------------------------------------------------------------------------
# The per-call cost


def _median_us(fn, calls: int = 2000, repeats: int = 9) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter_ns() - start) / calls / 1e3)
    return statistics.median(times)


@pytest.mark.benchmark
def test_a_cached_call_costs_little_python(monkeypatch):
    """matmul(out=...) on a repeated key, minus the bare launch (`prepare(...).fn()`, the kernel
    call alone), with a kernel that does nothing: the Python `matmul` adds per call. A wall-time
    bound, so a benchmark, not part of the suite (a loaded CPU fails it): `pytest -m benchmark -s`
    runs it and prints the figure. The bound is generous (FakeTensors' `device` is a Python
    property)."""
    _fake_gpu(monkeypatch, None)
    with FakeTensorMode():
        a, b, out = _operands(16, 4096, 4096, "t")
        bare = api.prepare("warpspec", a, b, out).fn
        added = _median_us(lambda: api.matmul(a, b, kernel="warpspec", out=out)) - _median_us(bare)
        print(f"\nmatmul's Python per cached call, over the bare launch: {added:.1f} us")
    assert len(api._PLANS) == 1
    assert added < 50.0


# --------------------------------------------------------------------------------------------------
# gluon_survey.ops: the custom operator and Linear


def test_package_exports_linear_and_ops_lazily():
    assert gluon_survey.Linear is ops.Linear and gluon_survey.ops is ops
    assert issubclass(gluon_survey.Linear, torch.nn.Linear)
    with pytest.raises(AttributeError):
        gluon_survey.nope  # noqa: B018


def test_the_fake_implementation_gives_shape_dtype_and_device():
    with FakeTensorMode():
        for dtype in (torch.float16, torch.bfloat16):
            a = torch.empty(7, 64, dtype=dtype, device="cuda")
            w = torch.empty(96, 64, dtype=dtype, device="cuda")
            for b in (w.t(), torch.empty(64, 96, dtype=dtype, device="cuda")):
                y = ops.matmul(a, b, "warpspec")
                assert (tuple(y.shape), y.dtype, y.device) == ((7, 96), dtype, a.device)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (
            lambda: (torch.empty(8, 8, dtype=torch.float16), torch.empty(8, 8, dtype=torch.float16), ""),
            ValueError,
            "(?i)cuda",
        ),
        (
            lambda: (torch.empty(8, 8, device="cuda"), torch.empty(8, 8, device="cuda"), ""),
            TypeError,
            "float16",
        ),
        (
            lambda: (torch.empty(8, 16, device="cuda").half(), torch.empty(8, 8, device="cuda").half(), ""),
            ValueError,
            "match",
        ),
        (
            lambda: (
                torch.empty(8, 8, device="cuda").half(),
                torch.empty(8, 8, device="cuda").half(),
                "nope",
            ),
            KeyError,
            "valid modes",
        ),
    ],
    ids=["cpu", "fp32", "shape-mismatch", "unknown-kernel"],
)
def test_the_fake_implementation_raises_matmuls_errors(make, error, match):
    """Tracing (FakeTensors, as torch.compile does) fails with the error the call would raise."""
    with FakeTensorMode():
        a, b, kernel = make()
        with pytest.raises(error, match=match):
            ops.matmul(a, b, kernel)


def test_torch_compile_fullgraph_traces_the_operator_as_one_node():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(a, w):
        return ops.matmul(a, w.t(), "warpspec") * 2

    torch._dynamo.reset()
    with FakeTensorMode():
        a = torch.empty(16, 64, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(32, 64, dtype=torch.bfloat16, device="cuda")
        y = torch.compile(f, fullgraph=True, backend=backend)(a, w)
        assert tuple(y.shape) == (16, 32)
        y = torch.compile(f, fullgraph=True, backend="aot_eager")(a, w)  # functionalized, as Inductor sees it
        assert tuple(y.shape) == (16, 32)
    (gm,) = graphs
    ops_called = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.gluon_survey.matmul.default in ops_called


def _fake_linear(K: int, N: int, bias: bool, dtype=torch.bfloat16) -> ops.Linear:
    """A Linear with FakeTensor parameters on "cuda" (made on "meta", then given fake weights;
    without gradients: autograd cannot place fake CUDA tensors on a CPU-only build)."""
    lin = ops.Linear(K, N, bias=bias, device="meta", dtype=dtype)
    lin.weight = torch.nn.Parameter(torch.empty(N, K, dtype=dtype, device="cuda"), requires_grad=False)
    if bias:
        lin.bias = torch.nn.Parameter(torch.empty(N, dtype=dtype, device="cuda"), requires_grad=False)
    return lin


@pytest.mark.parametrize("bias", [True, False])
def test_linear_shapes_on_fake_tensors_eager_and_compiled(bias):
    torch._dynamo.reset()
    with FakeTensorMode():
        lin = _fake_linear(64, 48, bias)
        for shape in [(7, 64), (2, 5, 64), (64,), (0, 64)]:
            x = torch.empty(*shape, dtype=torch.bfloat16, device="cuda")
            assert tuple(lin(x).shape) == (*shape[:-1], 48)
        x = torch.empty(3, 4, 64, dtype=torch.bfloat16, device="cuda")
        y = torch.compile(lin, fullgraph=True, backend="aot_eager")(x)
        assert tuple(y.shape) == (3, 4, 48) and y.dtype == torch.bfloat16


def _cpu_matmul(a, b, *, kernel=None, out=None, bias=None):
    """`api.matmul` for the numerics tests on the CPU: the fp32 product (+ bias), rounded."""
    product = a.float() @ b.float()
    return (product if bias is None else product + bias.float()).to(a.dtype)


def test_linear_matches_torch_linear_on_the_cpu(monkeypatch):
    """The operator's eager path and its gradients, with `api.matmul` replaced by a CPU product:
    flattening, the bias add, the reshape back, and the gradients of x, weight and bias."""
    monkeypatch.setattr(api, "matmul", _cpu_matmul)
    torch.manual_seed(0)
    for bias in (True, False):
        ref = torch.nn.Linear(40, 24, bias=bias, dtype=torch.bfloat16)
        lin = ops.Linear.from_linear(ref, kernel="warpspec")
        for shape in [(1, 40), (7, 40), (3, 5, 40)]:
            x = torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True)
            y = lin(x)
            expected = F.linear(
                x.detach().float(),
                ref.weight.detach().float(),
                None if ref.bias is None else ref.bias.detach().float(),
            )
            torch.testing.assert_close(y.float(), expected, rtol=2e-2, atol=2e-2)
            grad = torch.randn_like(y)
            y.backward(grad)
            g = grad.reshape(-1, 24).float()
            torch.testing.assert_close(
                x.grad.float(), (grad.float() @ ref.weight.detach().float()), rtol=2e-2, atol=2e-2
            )
            torch.testing.assert_close(
                ref.weight.grad.float(), g.t() @ x.detach().reshape(-1, 40).float(), rtol=2e-2, atol=2e-2
            )
            assert ref.weight.grad.is_contiguous()  # the weight's gradient is row-major like the weight
            if bias:
                torch.testing.assert_close(ref.bias.grad.float(), g.sum(0), rtol=2e-2, atol=2e-2)
            ref.zero_grad(set_to_none=True)


def test_from_linear_shares_the_parameters():
    ref = torch.nn.Linear(16, 8, dtype=torch.float16)
    lin = gluon_survey.Linear.from_linear(ref, kernel="persistent")
    assert lin.weight is ref.weight and lin.bias is ref.bias
    assert (lin.in_features, lin.out_features, lin.kernel) == (16, 8, "persistent")
    assert [p for p in lin.parameters()] == [ref.weight, ref.bias]
    assert "kernel='persistent'" in repr(lin)
    no_bias = gluon_survey.Linear.from_linear(torch.nn.Linear(16, 8, bias=False))
    assert no_bias.bias is None and [n for n, _ in no_bias.named_parameters()] == ["weight"]
    with torch.no_grad():
        ref.weight.add_(1)  # one Parameter: the change shows in both
    assert lin.weight is ref.weight
    assert lin.state_dict().keys() == ref.state_dict().keys()


def test_linear_constructor_is_nn_linears():
    lin = gluon_survey.Linear(32, 16, bias=False, dtype=torch.bfloat16, kernel="warpspec")
    assert lin.weight.shape == (16, 32) and lin.weight.dtype == torch.bfloat16 and lin.bias is None
    assert gluon_survey.Linear(32, 16).bias.shape == (16,)


# --------------------------------------------------------------------------------------------------
# gluon-survey overhead: arguments and rendering (the measurement itself needs a GPU)


def _overhead_rows(failed: bool = False, gaps: bool = False) -> list[overhead.Row]:
    times = {
        "torch.matmul": (9.0, 12.0),
        overhead.BARE: (20.0, 11.0),
        overhead.MATMUL: (22.5, 11.0),
        "matmul()": (26.0, 11.2),
        "ops.matmul": (38.0, 11.3),
        "nn.Linear": (9.5, 12.0),
        "Linear": (27.0, 11.2),
        "graph replay": (4.0, 11.0),
    }
    rows = []
    for way in overhead.WAYS:
        host, gpu = times[way.name]
        over = host - times[overhead.BARE][0]
        rows.append(overhead.Row(way.name, way.code, "OK", host, host - 0.5, host + 0.5, gpu, 0, over))
    if gaps:
        rows[0].starved = 21
    if failed:
        rows[-1] = overhead.Row(
            rows[-1].name, rows[-1].code, "FAILED", error="graph replay: rel_err 1 > tol 0.01"
        )
    return rows


def _settings(mode="warpspec") -> dict:
    return overhead.settings_of(overhead.parse_args(["--mode", mode]))


def test_overhead_arguments_and_usage_errors(tmp_path, capsys):
    args = overhead.parse_args([])
    assert (args.mode, args.m, args.n, args.k, args.dtype, args.b_layout) == (
        None,
        16,
        4096,
        4096,
        "bf16",
        "t",
    )
    assert (args.calls, args.repeats, args.format, args.results) == (200, 21, "table", None)
    args = overhead.parse_args(["--mode", "PERSISTENT", "--m", "1", "--b-layout", "row", "--format", "json"])
    assert (args.mode, args.m, args.b_layout, args.format) == ("persistent", 1, "row", "json")
    assert overhead.parse_args(["--results", str(tmp_path / "r.json")]).results == tmp_path / "r.json"
    bad = [
        ["--dtype", "fp32"],
        ["--b-layout", "col"],
        ["--m", "0"],
        ["--calls", "many"],
        ["--mode", "nope"],
        ["--format", "csv"],
        ["--results", str(tmp_path / "missing" / "r.json")],
    ]
    for argv in bad:
        assert cli.main(["overhead", *argv]) == 2, argv
    err = capsys.readouterr().err
    assert "valid modes" in err and "no directory" in err
    assert cli.main(["overhead", "--help"]) == 0


def test_overhead_without_a_gpu_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(overhead, "_cuda_available", lambda: False)
    assert cli.main(["overhead"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_overhead_table_says_what_matmul_adds():
    doc = overhead.document(
        _overhead_rows(gaps=True), _settings(), {"name": "NVIDIA H100 80GB HBM3", "torch": "2.11"}
    )
    text = overhead.render_table(doc)
    assert "M=16 N=4096 K=4096 bf16 B=t, mode warpspec, 200 calls x 21 repeats" in text
    assert "NVIDIA H100 80GB HBM3" in text
    lines = {
        line.split()[0]: line
        for line in text.splitlines()[2:]
        if line and not line.startswith(("matmul adds", "("))
    }
    assert set(lines) == {w.name.split()[0] for w in overhead.WAYS}
    assert "+2.5" in lines[overhead.MATMUL] and "+0.0" in lines["bare"] and "-16.0" in lines["graph"]
    assert "12.0 (gaps)" in lines["torch.matmul"] and "(gaps): the GPU ran dry in every repeat" in text
    assert "matmul adds 2.5 us per call to its bare launch" in text
    assert doc["added_over_bare_us"] == pytest.approx(2.5)


def test_overhead_failed_rows_and_json():
    rows = _overhead_rows(failed=True)
    doc = overhead.document(rows, _settings(), {})
    text = overhead.render_table(doc)
    assert "FAILED" in text and "rel_err 1 > tol 0.01" in text and "unknown GPU" in text
    back = json.loads(overhead.render_json(doc))
    assert back["rows"][-1]["status"] == "FAILED" and back["rows"][-1]["host_us"] is None
    assert [r["name"] for r in back["rows"]] == [w.name for w in overhead.WAYS]
    assert back["settings"]["mode"] == "warpspec" and back["added_over_bare_us"] == pytest.approx(2.5)


def test_overhead_pairs_each_repeat_with_the_bare_launch():
    """`over bare` is the median of per-repeat differences, so a drift of the host's speed that
    touches both ways in a repeat cancels; the GPU median leaves out repeats that ran dry."""
    bare = overhead.Samples(0.0, host=[20.0, 30.0, 40.0], gpu=[11.0, 11.0, 11.0], fed=[True, True, True])
    way = overhead.Samples(0.0, host=[22.0, 32.5, 42.0], gpu=[11.0, 50.0, 12.0], fed=[True, False, True])
    assert overhead.over_bare({overhead.BARE: bare, overhead.MATMUL: way}) == {
        overhead.BARE: 0.0,
        overhead.MATMUL: 2.0,
    }
    assert overhead.over_bare({overhead.MATMUL: way}) == {}
    summary = way.summary()
    assert summary["host_us"] == 32.5 and summary["starved"] == 1
    assert summary["gpu_us"] == 11.5  # the starved repeat's 50 left out
    dry = overhead.Samples(0.0, host=[5.0], gpu=[9.0], fed=[False]).summary()
    assert (dry["gpu_us"], dry["starved"], dry["host_p20_us"], dry["host_p80_us"]) == (9.0, 1, 5.0, 5.0)


@pytest.mark.parametrize("failed", [False, True])
def test_overhead_command_prints_and_writes_results(monkeypatch, tmp_path, capsys, failed):
    def measure(args, log=None):
        args.mode = args.mode or "warpspec"  # resolved on the GPU
        return _overhead_rows(failed=failed)

    monkeypatch.setattr(overhead, "_cuda_available", lambda: True)
    monkeypatch.setattr(overhead, "measure", measure)
    monkeypatch.setattr(overhead, "_environment", lambda argv: {"name": "NVIDIA H100 80GB HBM3"})
    path = tmp_path / "overhead.json"
    assert cli.main(["overhead", "--format", "json", "--results", str(path)]) == (1 if failed else 0)
    out = capsys.readouterr().out
    assert json.loads(out) == json.loads(path.read_text())
    assert json.loads(out)["settings"]["mode"] == "warpspec"
    assert cli.main(["overhead", "--m", "1"]) == (1 if failed else 0)
    assert "M=1 N=4096" in capsys.readouterr().out


def test_the_operator_refuses_a_non_tensor_as_matmul_does():
    from gluon_survey import ops

    b = torch.empty(8, 8, dtype=torch.float16)
    for call in (api.matmul, ops.matmul):
        with pytest.raises(TypeError, match=r"a must be a torch\.Tensor, got list"):
            call([[1.0]], b)


# --------------------------------------------------------------------------------------------------
# The bias: argument checks, the plan key, the launch's bias argument, the operator and Linear


def _bias(N: int, dtype=torch.bfloat16, **kw) -> torch.Tensor:
    return torch.empty(N, dtype=dtype, device=kw.pop("device", "cuda"), **kw)


@pytest.mark.parametrize(
    ("make_bias", "error", "match"),
    [
        (lambda: _bias(257), ValueError, r"bias has shape \(257,\).*\(256,\)"),
        (lambda: _bias(256).view(1, 256), ValueError, r"shape \(1, 256\).*bias\.view\(-1\)"),
        (lambda: _bias(256, torch.float16), TypeError, "output's dtype, torch.bfloat16"),
        (lambda: _bias(256, torch.float32), TypeError, r"bias\.to\(torch\.bfloat16\)"),
        (
            lambda: torch.empty_strided((256,), (2,), dtype=torch.bfloat16, device="cuda"),
            ValueError,
            r"not contiguous.*bias\.contiguous\(\)",
        ),
        (lambda: _bias(256, device="cpu"), ValueError, "bias is on cpu"),
        (lambda: "nope", TypeError, r"bias must be a torch\.Tensor"),
    ],
    ids=["length", "2-d", "fp16", "fp32", "strided", "cpu", "not-a-tensor"],
)
def test_bad_bias_raises_before_the_gpu_and_caches_nothing(host, make_bias, error, match):
    a, b, _ = _operands(64, 256, 128)
    for kernel in ("persistent", "swapab", None, "torch"):
        with pytest.raises(error, match=match):
            api.matmul(a, b, kernel=kernel, bias=make_bias())
    assert host.launches == [] and api._PLANS == {}


def test_a_mode_without_a_fused_bias_refuses_one(host):
    a, b, _ = _operands(64, 256, 128)
    for kernel in ("triton", "torch.compile"):
        with pytest.raises(TypeError, match=rf"mode '{kernel}' adds no bias.*warpspec"):
            api.matmul(a, b, kernel=kernel, bias=_bias(256))
    assert host.launches == []


def test_the_key_holds_whether_there_is_a_bias_and_its_dtype_and_alignment_but_no_address(monkeypatch):
    monkeypatch.setattr(api, "target_of", lambda device: H100)
    a, b = torch.empty(64, 128, dtype=torch.float16), torch.empty(128, 32, dtype=torch.float16)
    flat = torch.empty(128, dtype=torch.float16)
    assert flat.data_ptr() % 16 == 0
    one, other = flat[:32], flat[64:96]  # the same shape and strides, at two aligned addresses
    plain = api._plan_key(None, a, b, None)
    biased = api._plan_key(None, a, b, None, bias=one)
    assert biased != plain
    assert (
        biased
        == api._plan_key(None, a, b, None, bias=other)
        == api._plan_key(None, a, b, None, bias=one.clone())
    )
    assert biased != api._plan_key(None, a, b, None, bias=one.bfloat16())
    # 2 bytes off a 16-byte boundary: Triton would compile the kernel for it apart
    assert biased != api._plan_key(None, a, b, None, bias=flat[1:33])
    assert not any(isinstance(part, int) and part in (one.data_ptr(), other.data_ptr()) for part in biased)


@pytest.mark.parametrize("kernel", ["Blocked", "Pipelined", "persistent", "warpspec", "slab", None])
def test_the_bias_is_each_launchs_argument_and_a_constexpr_says_so(host, kernel):
    """One plan for the key with a bias, launched with each call's bias (its address is not part of
    the plan); HAS_BIAS True in its launches, and a key without a bias has a plan of its own."""
    M = 3000 if kernel else 16
    a, b, out = _operands(M, 520, 264)
    biases = [_bias(520) for _ in range(2)]
    for bias in biases:
        assert api.matmul(a, b, kernel=kernel, out=out, bias=bias) is out
    api.matmul(a, b, kernel=kernel, out=out)
    assert len(host.builds) == 2, "one plan with a bias, one without"
    first, second, plain = host.launches
    assert first.kwargs["HAS_BIAS"] is True and plain.kwargs["HAS_BIAS"] is False
    at = 2 if kernel is None else -1  # swapab's bias comes before its split-K workspace
    assert first.rest[at] is biases[0] and second.rest[at] is biases[1]
    assert plain.rest[at] is None
    launch = api.prepare(kernel or "auto", a, b, out, bias=biases[0])
    assert launch.config["bias"] == "fused"


def test_swapab_and_splitk_launch_the_bias_before_their_workspace(host, monkeypatch):

    log: list[Launched] = []
    for module, kernel in ((splitk, "splitk_kernel"), (swapab, "swapab_kernel")):
        monkeypatch.setattr(module, f"{kernel}", Recorder(kernel, log))
    a, b, out = _operands(16, 4096, 4096)
    bias = _bias(4096)
    for mode in ("splitk", "swapab"):
        api.prepare(mode, a, b, out, bias=bias).fn()
    for launched in log:
        scale_a, scale_b, passed, partials, counters = launched.rest
        assert (scale_a, scale_b, passed) == (None, None, bias)
        assert partials.dtype == torch.float32 and counters.dtype == torch.int32
        assert launched.kwargs["HAS_BIAS"] is True and launched.kwargs["SPLIT_K"] > 1


def test_cublas_fuses_the_bias_through_addmm(host, monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "addmm", lambda bias, a, b, out: calls.append((bias, a, b, out)) or out)
    a, b, out = _operands(64, 256, 128)
    bias = _bias(256)
    for _ in range(2):
        assert api.matmul(a, b, kernel="torch", out=out, bias=bias) is out
    assert calls == [(bias, a, b, out)] * 2
    assert api.prepare("torch", a, b, out, bias=bias).config["bias"] == torch_ops.BIAS


def test_k0_with_a_bias_is_the_bias(host, copies):
    a, b, out = _operands(16, 64, 0, "row")
    bias = _bias(64)
    assert api.matmul(a, b, kernel="warpspec", out=out, bias=bias) is out
    ((dst, src),) = copies
    assert dst is out and tuple(src.shape) == (16, 64) and src.stride() == (0, 1)
    assert host.launches == []


def test_explain_says_the_bias_is_fused(host):
    a, b, _ = _operands(3000, 520, 264)
    text = api.explain(a, b, "persistent", bias=_bias(520))
    assert "bias: fused: added to the fp32 accumulator in the kernel's epilogue" in text
    assert "bias=" not in text.split("config: ")[1]
    assert "cuBLASLt's bias epilogue" in api.explain(a, b, "torch", bias=_bias(520))
    assert "bias" not in api.explain(a, b, "persistent")


def test_the_fake_implementation_takes_a_bias():
    with FakeTensorMode():
        a = torch.empty(7, 64, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(96, 64, dtype=torch.bfloat16, device="cuda")
        y = ops.matmul(a, w.t(), "warpspec", _bias(96))
        assert (tuple(y.shape), y.dtype) == ((7, 96), torch.bfloat16)
        with pytest.raises(ValueError, match="bias has shape"):
            ops.matmul(a, w.t(), "warpspec", _bias(95))
        with pytest.raises(TypeError, match="adds no bias"):
            ops.matmul(a, w.t(), "triton", _bias(96))


def test_linear_passes_its_bias_to_matmul(monkeypatch):
    """No separate add: the bias goes to matmul (eager) or the operator (autograd), except with a
    kernel that fuses none, which gets the add."""
    seen = []

    def recording(a, b, *, kernel=None, out=None, bias=None):
        seen.append(bias)
        return _cpu_matmul(a, b, bias=bias)

    monkeypatch.setattr(api, "matmul", recording)
    monkeypatch.setattr(ops, "_eager", lambda x, weight: True)
    ref = torch.nn.Linear(40, 24, dtype=torch.bfloat16)
    x = torch.randn(5, 40, dtype=torch.bfloat16)
    expected = F.linear(x.float(), ref.weight.float(), ref.bias.float())
    for kernel in ("warpspec", None, "triton"):
        seen.clear()
        y = ops.Linear.from_linear(ref, kernel=kernel)(x)
        torch.testing.assert_close(y.float(), expected, rtol=2e-2, atol=2e-2)
        assert seen == [None] if kernel == "triton" else seen == [ref.bias]


def test_runs_cublas_says_whether_a_cached_plan_calls_cublas_itself(host):
    a, b, _ = _operands(300, 520, 264)
    assert not api.runs_cublas(a, b, "torch")  # no plan yet
    api.matmul(a, b, kernel="torch")
    api.matmul(a, b, kernel="Pipelined")
    assert api.runs_cublas(a, b, "torch") and not api.runs_cublas(a, b, "Pipelined")
    assert not api.runs_cublas(a, b, "torch", bias=torch.empty(520, dtype=torch.bfloat16, device="cuda"))
    api.clear_plans()
    assert not api.runs_cublas(a, b, "torch")


def test_linear_in_eager_inference_calls_f_linear_where_matmul_runs_cublas(monkeypatch):
    """The first call of an input layout goes through matmul; where its plan calls cuBLAS itself
    the next calls are F.linear (nn.Linear's own), until the weight, the bias, the kernel, the
    A-layout switch or the plan cache changes."""
    seen, cublas = [], [True]

    def recording(a, b, *, kernel=None, out=None, bias=None):
        seen.append(tuple(a.shape))
        return _cpu_matmul(a, b, bias=bias)

    monkeypatch.setattr(api, "matmul", recording)
    monkeypatch.setattr(api, "runs_cublas", lambda a, b, kernel, bias: cublas[0])
    monkeypatch.setattr(ops, "_eager", lambda x, weight: True)
    torch.manual_seed(4)
    lin = ops.Linear.from_linear(torch.nn.Linear(40, 24))
    x, x3 = torch.randn(5, 40), torch.randn(2, 3, 40)
    with torch.no_grad():
        expected = [F.linear(t, lin.weight, lin.bias) for t in (x, x3)]
        for _ in range(3):
            for t, ref in zip((x, x3), expected, strict=True):
                torch.testing.assert_close(lin(t), ref)
        assert seen == [(5, 40), (6, 40)]  # once per layout, then F.linear
        api.clear_plans()
        lin(x)
        lin.weight = torch.nn.Parameter(lin.weight.detach().clone())
        lin(x)
        lin(x)
        assert seen[2:] == [(5, 40), (5, 40)]
        cublas[0] = False
        lin.kernel = "Pipelined"
        for _ in range(2):
            lin(x)
        assert seen[4:] == [(5, 40), (5, 40)]  # not cuBLAS: matmul every time
    x.requires_grad_()
    lin.kernel = None
    cublas[0] = True
    lin(x)
    lin(x)
    assert len(seen) == 8  # training: no F.linear before a backward has shown its products


def test_linear_in_eager_training_calls_f_linear_once_every_product_ran_cublas(monkeypatch):
    """A training step's forward and backward go through matmul; where matmul ran cuBLAS itself
    for the forward and both backward products, the layout's next steps are F.linear, with
    F.linear's gradients. One product off cuBLAS keeps the layout on matmul, and so does a step
    in which another input needs a gradient (another key)."""
    seen, off_cublas = [], []

    def recording(a, b, *, kernel=None, out=None, bias=None):
        seen.append((a_layout(a), tuple(a.shape)))
        return _cpu_matmul(a, b, bias=bias)

    monkeypatch.setattr(api, "matmul", recording)
    monkeypatch.setattr(api, "runs_cublas", lambda a, b, kernel, bias: a_layout(a) not in off_cublas)
    monkeypatch.setattr(ops, "_eager", lambda x, weight: True)
    torch.manual_seed(5)
    ref = torch.nn.Linear(40, 24)
    lin = ops.Linear.from_linear(torch.nn.Linear(40, 24))
    with torch.no_grad():
        lin.weight.copy_(ref.weight)
        lin.bias.copy_(ref.bias)
    x, grad = torch.randn(2, 3, 40), torch.randn(2, 3, 24)

    def step(module, needs_x=True):
        module.zero_grad()
        xi = x.clone().requires_grad_(needs_x)
        module(xi).backward(grad)
        return xi.grad, module.weight.grad, module.bias.grad

    expected = step(ref)
    for i in range(3):
        for ours, theirs in zip(step(lin), expected, strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5, msg=f"step {i}")
    assert seen == [("row", (6, 40)), ("row", (6, 24)), ("t", (24, 6))]  # the first step only
    step(lin, needs_x=False)  # another key: the weight's gradient alone
    step(lin, needs_x=False)
    assert seen[3:] == [("row", (6, 40)), ("t", (24, 6))]
    lin.weight = torch.nn.Parameter(lin.weight.detach().clone())  # a new weight starts afresh
    off_cublas.append("t")  # the weight's gradient runs a Gluon kernel: matmul every step
    for _ in range(2):
        step(lin)
    assert seen[5:] == [("row", (6, 40)), ("row", (6, 24)), ("t", (24, 6))] * 2


def test_linear_trains_through_matmul_without_the_operator(monkeypatch):
    """Eager training: the forward and both backward products are `matmul` calls (the operator's
    dispatch skipped), the weight's gradient as (grad^T @ x)^T with grad^T a transposed A, and the
    gradients those of F.linear."""
    seen = []

    def recording(a, b, *, kernel=None, out=None, bias=None):
        seen.append((a_layout(a), kernel, bias is not None))
        return _cpu_matmul(a, b, bias=bias)

    monkeypatch.setattr(api, "matmul", recording)
    monkeypatch.setattr(ops, "_eager", lambda x, weight: True)
    monkeypatch.setattr(ops, "_OP", None)  # calling the operator would raise
    torch.manual_seed(3)
    ref = torch.nn.Linear(40, 24)
    lin = ops.Linear.from_linear(torch.nn.Linear(40, 24), kernel="persistent")
    with torch.no_grad():
        lin.weight.copy_(ref.weight)
        lin.bias.copy_(ref.bias)
    x = torch.randn(5, 3, 40)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    grad = torch.randn(5, 3, 24)
    lin(x1).backward(grad)
    ref(x2).backward(grad)
    assert seen == [("row", "persistent", True), ("row", "persistent", False), ("t", "persistent", False)]
    for ours, theirs in (
        (x1.grad, x2.grad),
        (lin.weight.grad, ref.weight.grad),
        (lin.bias.grad, ref.bias.grad),
    ):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# A transposed A (A layout "t", the view x.t() of a row-major [K, M] matrix): copied to row-major
# unless `api.TRANSPOSED_A_IN_PLACE` is on; then the Hopper rungs read it in place (16-bit only).
# The kernels themselves: tests/test_alayout_compile.py (compiled) and tests/test_alayout_gpu.py.

IN_PLACE_RUNGS = {"Blocked": blocked, "Pipelined": pipelined, "persistent": persistent, "warpspec": warpspec}


def _transposed_a(M: int, K: int, ld: int, dtype=torch.bfloat16) -> torch.Tensor:
    """x.t() of a row-major [K, M] matrix whose rows are `ld` elements apart."""
    return torch.empty_strided((M, K), (1, ld), dtype=dtype, device="cuda")


def test_a_layout_tells_a_transposed_view_from_a_row_major_a():
    assert a_layout(torch.empty(8, 16)) == "row"
    assert a_layout(torch.empty(8, 24)[:, :16]) == "row"  # a padded row stride
    assert a_layout(torch.empty(16, 8).t()) == "t"
    assert a_layout(torch.empty(16, 12)[:, :8].t()) == "t"  # the [K, M] matrix's rows padded
    assert a_layout(torch.empty(16, 1).t()) == "row"  # M = 1: both strides 1
    assert a_layout(torch.empty(16, 64)[::2, ::2]) == "row"  # neither: copied row-major as before
    assert is_a_kmajor("row") and not is_a_kmajor("t")
    with pytest.raises(ValueError, match="unknown A layout 'col'"):
        is_a_kmajor("col")


def test_the_plan_key_tells_a_layouts_and_the_switch_apart(monkeypatch):
    monkeypatch.setattr(api, "target_of", lambda device: H100)
    monkeypatch.setattr(api, "TRANSPOSED_A_IN_PLACE", False)
    with FakeTensorMode():
        row, b, _ = _operands(64, 256, 128)
        t = _transposed_a(64, 128, 64)
        assert (row.shape, row.dtype) == (t.shape, t.dtype)
        off = api._plan_key(None, t, b, None)
        assert api._plan_key(None, row, b, None) != off
        monkeypatch.setattr(api, "TRANSPOSED_A_IN_PLACE", True)
        assert api._plan_key(None, t, b, None) != off  # a plan made with the switch off is not reused
        assert api._plan_key(None, t, b, None) == api._plan_key(None, _transposed_a(64, 128, 64), b, None)


@pytest.mark.parametrize("kernel", [*IN_PLACE_RUNGS, "splitk"])
def test_a_transposed_a_is_copied_unless_the_switch_is_on(host, copies, monkeypatch, kernel):
    monkeypatch.setattr(splitk, "splitk_kernel", Recorder("splitk_kernel", host.launches))
    monkeypatch.setattr(api, "TRANSPOSED_A_IN_PLACE", False)
    M, K = 300, 264
    a = _transposed_a(M, K, 304)  # 608-byte rows: TMA can describe the [K, M] matrix
    _, b, out = _operands(M, 520, K)
    api.matmul(a, b, kernel=kernel, out=out)
    a_desc = host.launches[-1].descriptors[0]
    assert a_desc.base is not a and a_layout(a_desc.base) == "row" and tuple(a_desc.shape) == (M, K)
    assert host.launches[-1].kwargs["A_KMAJOR"] is True
    assert copies[0] == (a_desc.base, a)  # today's copy, per call
    assert "A: t (transpose view of a [K,M] matrix), copied to row-major (reading it in place is off" in (
        api.explain(a, b, kernel)
    )

    monkeypatch.setattr(api, "TRANSPOSED_A_IN_PLACE", True)
    copies.clear()
    for _ in range(2):  # the first call builds the plan (the switch is in the key), the second reuses it
        api.matmul(a, b, kernel=kernel, out=out)
        launched = host.launches[-1]
        a_desc = launched.descriptors[0]
        assert a_desc.base is a, "A was copied"
        assert (tuple(a_desc.shape), tuple(a_desc.strides)) == ((K, M), (304, 1))  # the [K, M] matrix
        cfg = (splitk if kernel == "splitk" else IN_PLACE_RUNGS[kernel]).config_for((9, 0), K)
        assert list(a_desc.block_shape) == [cfg.BLOCK_K, cfg.BLOCK_M]
        assert launched.kwargs["A_KMAJOR"] is False
    assert copies == [] and len(host.builds) == 2
    text = api.explain(a, b, kernel)
    assert "A: t (transpose view of a [K,M] matrix), read in place" in text and "aligned copy" not in text
    assert "problem: M=300 N=520 K=264 bfloat16 A=t B=" in text  # the layout pair
    assert "bfloat16 A=row B=" in api.explain(_operands(M, 520, K)[0], b, kernel)
    config = api.prepare(kernel, a, b, out).config
    assert config["a_layout"] == "t" and "aligned_copy" not in config


def test_a_transposed_a_that_tma_cannot_describe_is_still_copied(host, copies, monkeypatch):
    monkeypatch.setattr(api, "TRANSPOSED_A_IN_PLACE", True)
    a = _transposed_a(300, 264, 300)  # [K, M] rows of 600 bytes: not a multiple of 16
    _, b, out = _operands(300, 520, 264)
    api.matmul(a, b, kernel="persistent", out=out)
    a_desc = host.launches[-1].descriptors[0]
    assert a_desc.base is not a and a_layout(a_desc.base) == "row"
    assert host.launches[-1].kwargs["A_KMAJOR"] is True
    assert "copied to row-major (TMA cannot describe the [K, M] matrix" in api.explain(a, b, "persistent")


def test_modes_that_read_a_row_major_a_get_a_copy_with_the_switch_on(host, copies, monkeypatch):
    monkeypatch.setattr(api, "TRANSPOSED_A_IN_PLACE", True)
    a = _transposed_a(16, 264, 16)
    _, b, out = _operands(16, 520, 264)
    api.matmul(a, b, kernel="slab", out=out)  # the few-token modes keep the copy
    assert host.launches[-1].descriptors[0].base is not a
    text = api.explain(a, b, "slab")
    assert "the mode that runs reads A row-major only here" in text
    assert "aligned copy" not in text  # the A line gives the copy's reason, not alignment
    unaligned = torch.empty_strided((16, 264), (1, 18), dtype=torch.bfloat16, device="cuda")  # 36-byte rows
    assert "copied to row-major (TMA cannot describe" in api.explain(unaligned, b, "persistent")
    big = _transposed_a(3000, 264, 3000)
    _, b, _ = _operands(3000, 520, 264)
    assert "reads A row-major only here" in api.explain(big, b, "triton")  # plain Triton: a copy
    assert "read in place, no copy" in api.explain(big, b, "torch")  # cuBLAS: a transposed operand
    assert api._reads_a_in_place(torch_ops, big, b, H100, False)
    assert not api._reads_a_in_place(torch_ops, big, b, H100, True)  # _scaled_mm: a row-major fp8 A
    assert api._reads_a_in_place(warpspec, big, b, H100, False)
    assert not api._reads_a_in_place(warpspec, big, b, H100, True)  # fp8


def test_explain_names_which_operand_gets_an_aligned_copy(host, copies):
    a = torch.empty_strided((300, 128), (129, 1), dtype=torch.bfloat16, device="cuda")  # 258-byte rows
    _, b, _ = _operands(300, 520, 128)
    assert "aligned copy (a): a row stride" in api.explain(a, b, "Pipelined")


def test_an_fp8_transposed_a_is_copied_and_a_rung_refuses_one(host, copies, monkeypatch):
    monkeypatch.setattr(api, "TRANSPOSED_A_IN_PLACE", True)
    fp8 = torch.float8_e4m3fn
    a = _transposed_a(300, 256, 304, fp8)
    w = torch.empty(512, 256, dtype=fp8, device="cuda")
    one = torch.ones(1, device="cuda")
    api.matmul(a, w.t(), kernel="warpspec", scale_a=one, scale_b=one)
    launched = host.launches[-1]
    assert launched.descriptors[0].base is not a and launched.kwargs["A_KMAJOR"] is True
    text = api.explain(a, w.t(), "warpspec", scale_a=one, scale_b=one)
    assert "A: t (transpose view of a [K,M] matrix), copied to row-major (fp8 MMAs read A K-major)" in text
    out = torch.empty(300, 512, dtype=torch.bfloat16, device="cuda")
    scales = Scales(one, one, "tensor")
    for prepare in (warpspec.prepare, pipelined.prepare, splitk.prepare):
        with pytest.raises(ValueError, match="fp8 MMAs read both operands K-major: A must be a row-major"):
            prepare(a, w.t(), out, H100, scales=scales)


def test_blackwell_copies_a_transposed_a_and_its_rungs_refuse_one(host, copies, monkeypatch):
    b200 = Target((10, 0), 148, "NVIDIA B200")
    monkeypatch.setattr(api, "target_of", lambda device: b200)
    monkeypatch.setattr(api, "TRANSPOSED_A_IN_PLACE", True)
    a = _transposed_a(300, 264, 304)
    _, b, out = _operands(300, 520, 264)
    assert not api._reads_a_in_place(pipelined, a, b, b200, False)
    assert "reads A row-major only here" in api.explain(a, b, "Pipelined")
    with pytest.raises(ValueError, match=r"read in place on Hopper \(sm_90\) only; this GPU is sm_100"):
        pipelined.prepare(a, b, out, b200)
