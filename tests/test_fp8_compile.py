"""The fp8 rungs compile for sm_90a and sm_100a on a machine with no GPU (with triton 3.6.0, every
config; through `make test`, with 3.9.0, one config per kernel design: tests/kernel_reports.py),
and their machine code is fp8: wgmma with e4m3 operands (QGMMA) on Hopper, tcgen05's f8f6f4 kind
(UTCQMMA) on Blackwell, and no 16-bit MMA left; no spills with the row-wise scales' epilogue (the
one that loads the most); the shared memory of the fp8 config (the same bytes per stage as 16-bit,
K twice as deep, C in bf16), plus the mbarriers and the scratch that redistributes the loaded
scales. The small-M rungs (splitk, swapab, slab) too: their fp8
launch passes the scales after the descriptors (splitk and swapab: the fp32 split-K workspace
after them), and their providers refuse a row-major B and a config of the other kind themselves.
(slab's fp8 MMA is mma.sync on operands widened to fp16: its machine code is
tests/test_slab_compile.py's.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gluon_survey import api, registry
from gluon_survey.kernels import (
    common,
    persistent,
    pipelined,
    slab,
    splitk,
    swapab,
    warpspec,
    warpspec_tcgen05,
)
from gluon_survey.launch import Scales, Target
from kernel_reports import compiled_report, config_marks, specs
from recording import Launched, Recorder

pytestmark = pytest.mark.compile

FP8 = "float8_e4m3fn"
# the dense rungs (the grouped kernel's fp8 specs are compiled by tests/test_grouped_compile.py)
FP8_RUNGS = [m.name for m in registry.MODES if m.kind == "gluon" and m.fp8 and not m.grouped]
MMA = {"sm_90a": "QGMMA", "sm_100a": "UTCQMMA"}
SIXTEEN_BIT_MMA = ("HGMMA", "UTCHMMA", "HMMA")
# (16-bit, fp8) K steps of a mode's default config where they are not (64, 128): slab streams
# 256 elements of a weight row a stage in both (its fp8 stage holds half the bytes).
K_STEPS = {"slab": (256, 256)}
SPECS = [
    pytest.param(
        mode, arch, i, id=f"{arch}-{spec.kernel.replace(' ', '-')}", marks=config_marks(mode, arch, FP8, i)
    )
    for arch in MMA
    for mode in FP8_RUNGS
    # slab: mma.sync with fp8 widened to fp16, tests/test_slab_compile.py; gemv: FMAs,
    # tests/test_gemv_compile.py
    if mode not in ("slab", "gemv")
    for i, spec in enumerate(specs(mode, arch, FP8))
]


def test_the_fp8_rungs_are_the_ladder():
    assert FP8_RUNGS == ["Pipelined", "persistent", "warpspec", "splitk", "swapab", "slab", "gemv"]
    for arch in MMA:
        for mode in FP8_RUNGS:
            labels = [s.kernel for s in specs(mode, arch, FP8)]
            assert labels and all("fp8" in label and label.endswith("B=t scales=row") for label in labels)


@pytest.mark.parametrize(("mode", "arch", "index"), SPECS)
def test_fp8_machine_code(mode, arch, index):
    spec, r = compiled_report(mode, arch, FP8, index)
    assert r.error is None, r.error
    assert r.count(MMA[arch]) > 0, f"no {MMA[arch]} in {spec.kernel}"
    assert all(r.count(op) == 0 for op in SIXTEEN_BIT_MMA), spec.kernel
    assert r.count("UTMALDG") > 0 and r.count("UTMASTG") > 0
    assert r.count("LDL") == 0 and r.count("STL") == 0, f"{spec.kernel}: local-memory traffic (spills)"
    assert r.spill_bytes == 0 and r.stack_bytes == 0
    assert r.count("LDG") > 0, "the row-wise scales are loaded"
    if mode == "warpspec" and arch == "sm_90a":
        assert max(r.setmaxnreg.get("inc", [0])) >= spec.config.CONSUMER_REGS, "the MMA warpgroups grow"


@pytest.mark.parametrize(("mode", "arch", "index"), SPECS)
def test_fp8_config_computes_the_shared_memory(mode, arch, index):
    spec, r = compiled_report(mode, arch, FP8, index)
    assert spec.config.ELEM_BYTES == 1 and spec.config.BLOCK_K % 128 == 0  # 128-byte rows or more
    expected = spec.config.smem_bytes()
    assert 0 <= r.shared_bytes - expected < 1024, (spec.kernel, r.shared_bytes, expected)
    assert r.shared_bytes <= common.SMEM_LIMIT


def test_fp8_configs_keep_the_16_bit_stage_bytes():
    pairs = [
        (pipelined.CONFIGS[9], pipelined.FP8_CONFIGS[9]),
        (persistent.CONFIGS[9], persistent.FP8_CONFIGS[9]),
        (warpspec.PINGPONG, warpspec.PINGPONG_FP8),
        (warpspec.COOPERATIVE, warpspec.COOPERATIVE_FP8),
        (warpspec.PINGPONG_MID, warpspec.PINGPONG_FP8_MID),
        (warpspec_tcgen05.CONFIG, warpspec_tcgen05.FP8_CONFIG),
        *((splitk.CONFIGS[major], splitk.FP8_CONFIGS[major]) for major in (9, 10)),
        *(
            pair
            for major in (9, 10)
            for pair in zip(
                swapab.candidates((major, 0)).values(),
                swapab.candidates((major, 0), fp8=True).values(),
                strict=True,
            )
        ),
    ]
    for sixteen, fp8 in pairs:
        assert fp8.BLOCK_K == 2 * sixteen.BLOCK_K
        assert fp8.smem_bytes() <= common.SMEM_LIMIT
        stage16 = (sixteen.a_rows + sixteen.BLOCK_N) * sixteen.BLOCK_K * 2
        stage8 = (fp8.a_rows + fp8.BLOCK_N) * fp8.BLOCK_K * 1
        assert stage16 == stage8


def test_a_16_bit_config_refuses_scales_and_an_fp8_config_needs_them():
    rung = pipelined.RUNG
    with pytest.raises(ValueError, match="is for 16-bit operands"):
        rung.launch(None, None, None, Target((9, 0), 132), pipelined.CONFIGS[9], Scales(None, None, "tensor"))
    with pytest.raises(ValueError, match="is for fp8 operands"):
        rung.launch(None, None, None, Target((9, 0), 132), pipelined.FP8_CONFIGS[9])


SMALL_M_PROVIDERS = pytest.mark.parametrize(
    "provider", [splitk, swapab, slab], ids=["splitk", "swapab", "slab"]
)


@SMALL_M_PROVIDERS
def test_small_m_providers_refuse_a_config_of_the_other_kind(provider):
    with FakeTensorMode(allow_non_fake_inputs=True):
        a, b, sa, sb = _fp8_operands(16, 512, 1024, "tensor")
        out = torch.empty(16, 512, dtype=torch.bfloat16, device="cuda")
        target = Target((9, 0), 132)
        with pytest.raises(ValueError, match="is for 16-bit operands"):
            provider.prepare(a, b, out, target, provider.CONFIGS[9], scales=Scales(sa, sb, "tensor"))
        with pytest.raises(ValueError, match="is for fp8 operands"):
            provider.prepare(a, b, out, target, provider.FP8_CONFIGS[9])


@SMALL_M_PROVIDERS
def test_small_m_providers_refuse_a_row_major_fp8_b(provider):
    """fp8 MMAs read both operands K-major: the provider says so itself (as `api` does first)."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        a, _, sa, sb = _fp8_operands(16, 512, 1024, "tensor")
        b = torch.empty(1024, 512, dtype=torch.float8_e4m3fn, device="cuda")  # row-major [K, N]
        out = torch.empty(16, 512, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(ValueError, match="K-major"):
            provider.prepare(a, b, out, Target((9, 0), 132), scales=Scales(sa, sb, "tensor"))


@pytest.mark.parametrize("major", [9, 10])
@SMALL_M_PROVIDERS
def test_small_m_fp8_configs_are_what_the_provider_picks(provider, major):
    fp8 = provider.config_for((major, 0), 4096, fp8=True)
    assert fp8 is provider.FP8_CONFIGS[major] and fp8.ELEM_BYTES == 1 and "fp8" in fp8.label
    assert fp8.label in provider.candidates((major, 0), fp8=True)
    assert fp8.blocks_per_sm() == provider.CONFIGS[major].blocks_per_sm(), "as many programs per SM"
    assert all(c.ELEM_BYTES == 1 for c in provider.candidates((major, 0), fp8=True).values())
    assert all(c.ELEM_BYTES == 2 for c in provider.candidates((major, 0)).values())


# --------------------------------------------------------------------------------------------------
# The host side with the GPU faked (as tests/test_api_host.py does): what an fp8 launch passes.


@pytest.fixture
def fake_hopper(monkeypatch):
    log: list[Launched] = []
    for module, name in (
        (pipelined, "pipelined_kernel"),
        (persistent, "persistent_kernel"),
        (warpspec, "warpspec_kernel"),
        (slab, "slab_kernel"),
    ):
        monkeypatch.setattr(module, "RUNG", dataclasses.replace(module.RUNG, kernel=Recorder(name, log)))
    monkeypatch.setattr(splitk, "splitk_kernel", Recorder("splitk_kernel", log))
    monkeypatch.setattr(swapab, "swapab_kernel", Recorder("swapab_kernel", log))
    monkeypatch.setattr(api, "target_of", lambda device: Target((9, 0), 132, "NVIDIA H100 80GB HBM3"))
    api.clear_plans()
    with FakeTensorMode(allow_non_fake_inputs=True):
        yield log
    api.clear_plans()


def _fp8_operands(M, N, K, scaling):
    a = torch.empty(M, K, dtype=torch.float8_e4m3fn, device="cuda")
    w = torch.empty(N, K, dtype=torch.float8_e4m3fn, device="cuda")
    if scaling == "tensor":
        sa, sb = torch.empty((), device="cuda"), torch.empty((), device="cuda")
    else:
        sa, sb = torch.empty(M, 1, device="cuda"), torch.empty(1, N, device="cuda")
    return a, w.t(), sa, sb


@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("mode", [m for m in FP8_RUNGS if m != "gemv"])  # gemv: test_gemv_compile.py
def test_an_fp8_launch_passes_its_scales_and_the_fp8_config(fake_hopper, mode, scaling):
    a, b, sa, sb = _fp8_operands(300, 520, 1024, scaling)
    out = api.matmul(a, b, kernel=mode, scale_a=sa, scale_b=sb)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (300, 520)
    (launched,) = fake_hopper
    a_desc, b_desc, c_desc = launched.descriptors
    scale_a, scale_b, bias, *workspace = launched.rest  # no bias: None in its place
    assert bias is None
    # SCALING, then HAS_BIAS (the bias epilogue's switch), are the last constexprs
    assert list(launched.kwargs)[-3:] == ["SCALING", "HAS_BIAS", "num_warps"]
    assert launched.kwargs["HAS_BIAS"] is False
    assert launched.kwargs["SCALING"] == (1 if scaling == "tensor" else 2)
    assert scale_a.dtype == scale_b.dtype == torch.float32
    assert (scale_a.numel(), scale_b.numel()) == ((1, 1) if scaling == "tensor" else (300, 520))
    k_step = K_STEPS.get(mode, (64, 128))[1]  # K steps of 128 fp8 bytes (slab: 256)
    assert a_desc.block_shape[1] == k_step and b_desc.block_shape[1] == k_step
    assert c_desc.base.dtype == torch.bfloat16
    assert launched.kwargs["W_KMAJOR" if mode in ("swapab", "slab") else "B_KMAJOR"] is True
    if mode in ("splitk", "swapab"):  # the split-K workspace follows the scales, fp32 as for 16-bit
        partials, counters = workspace
        assert partials.dtype == torch.float32 and counters.dtype == torch.int32
    else:
        assert workspace == []
    assert api.prepare(mode, a, b, scale_a=sa, scale_b=sb).config["BLOCK_K"] == k_step  # the fp8 config


@pytest.mark.parametrize("mode", ["warpspec", "splitk", "swapab", "slab"])
def test_fp16_launches_pass_no_scales(fake_hopper, mode):
    a = torch.empty(300, 1024, dtype=torch.float16, device="cuda")
    b = torch.empty(520, 1024, dtype=torch.float16, device="cuda").t()
    api.matmul(a, b, kernel=mode)
    (launched,) = fake_hopper
    assert launched.rest[:2] == (None, None) and launched.kwargs["SCALING"] == 0
    assert api.prepare(mode, a, b).config["BLOCK_K"] == K_STEPS.get(mode, (64, 128))[0]  # 16-bit
