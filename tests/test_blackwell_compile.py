"""The Blackwell ladder without a Blackwell GPU.

1. Every rung compiles for sm_100a, with both B layouts, and its SASS is what the design says:
   tcgen05 MMAs (UTCHMMA), TMEM loads (LDTM), TMA loads and stores (UTMALDG / UTMASTG), no local
   memory (LDL / STL, spills), the shared memory its config computes, tensor memory within 512
   columns, and register reallocation (USETMAXREG) in the warp-specialized kernel. Blocked,
   Pipelined and persistent are the Hopper rung kernels with `MMAv5` and their sm_100 configs;
   warpspec is `kernels/warpspec_tcgen05.py`, which the registry picks for sm_100. Compiled and
   parsed through `gluon-survey inspect`'s engine (tests/kernel_reports.py).
2. With the device faked as sm_100 (148 SMs) and the kernel launches recorded, `api.prepare` /
   `api.matmul` pick the Blackwell kernels, build their TMA descriptors with the right block shapes
   and launch the right grid; bad inputs get the same errors as on Hopper.

CPU only: `pytest -m compile tests/test_blackwell_compile.py`; passes with triton 3.6 and 3.9 (the
triton-3.9 pass of `make test` leaves out the configs marked `exhaustive`: tests/kernel_reports.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
from torch._subclasses.fake_tensor import FakeTensorMode  # CUDA-device tensors without a GPU

from bad_inputs import BAD_INPUTS
from gluon_survey import api, registry
from gluon_survey.kernels import (
    arch,
    blackwell,
    blocked,
    common,
    gemv,
    hopper,
    persistent,
    pipelined,
    slab,
    splitk,
    swapab,
    warpspec,
    warpspec_tcgen05,
)
from gluon_survey.launch import Target
from kernel_reports import compiled_report, specs
from recording import Launched, Recorder

pytestmark = pytest.mark.compile

SM_COUNT = 148  # B200
RUNG_MODULES = {"Blocked": blocked, "Pipelined": pipelined, "persistent": persistent}
RUNGS = [*RUNG_MODULES, "warpspec"]
LAYOUTS = ["row", "t"]  # B as a row-major [K, N] matrix, or the transpose view of a [N, K] weight


def _config(rung: str):
    return warpspec_tcgen05.CONFIG if rung == "warpspec" else RUNG_MODULES[rung].CONFIGS[10]


def _tmem_columns(rung: str) -> int:
    """Columns of the fp32 accumulator(s): one BLOCK_N-wide tile; two of them in warpspec."""
    return _config(rung).BLOCK_N * (2 if rung == "warpspec" else 1)


# --------------------------------------------------------------------------------------------------
# 1. Compiling for sm_100a.


def _report(rung: str, layout: str):
    index = next(i for i, s in enumerate(specs(rung, "sm_100a")) if s.kernel.endswith(f"B={layout}"))
    return compiled_report(rung, "sm_100a", "float16", index)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rung", RUNGS)
def test_rung_uses_tcgen05_tmem_and_tma(rung, layout):
    spec, r = _report(rung, layout)
    assert r.error is None, r.error
    assert r.count("UTCHMMA") > 0, f"{spec.kernel}: no UTCHMMA (fp16 tcgen05)"
    assert r.count("HGMMA") == 0, f"{spec.kernel}: Hopper wgmma in an sm_100a kernel"
    assert r.count("LDTM") > 0, f"{spec.kernel}: the accumulator never leaves tensor memory"
    assert r.count("UTMALDG") > 0 and r.count("UTMASTG") > 0, f"{spec.kernel}: no TMA load/store"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rung", RUNGS)
def test_rung_does_not_spill(rung, layout):
    spec, r = _report(rung, layout)
    assert r.count("LDL") == 0 and r.count("STL") == 0, f"{spec.kernel}: local memory traffic (spills)"
    assert r.spill_bytes == 0 and r.stack_bytes == 0 and r.local_bytes == 0


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rung", RUNGS)
def test_rung_fits_shared_and_tensor_memory(rung, layout):
    spec, r = _report(rung, layout)
    assert 0 <= r.shared_bytes - spec.config.smem_bytes() < 512, f"{spec.kernel}: {r.shared_bytes} B"
    assert r.shared_bytes <= common.SMEM_LIMIT
    assert r.tmem_cols == _tmem_columns(rung) <= blackwell.TMEM_COLUMNS.value, spec.kernel


@pytest.mark.parametrize("layout", LAYOUTS)
def test_warpspec_reallocates_registers(layout):
    """The 1-warp TMA and MMA workers share one warpgroup, which gives registers away
    (setmaxnreg.dec); the epilogue warpgroup takes them (setmaxnreg.inc)."""
    spec, r = _report("warpspec", layout)
    assert r.count("USETMAXREG") > 0, spec.kernel
    worker_regs = max(warpspec_tcgen05.LOAD_REGS, warpspec_tcgen05.MMA_REGS)
    assert r.setmaxnreg.get("dec") == [worker_regs], "worker warpgroup not shrunk"
    assert r.setmaxnreg.get("inc"), "epilogue warpgroup never grows"


@pytest.mark.parametrize("rung", RUNGS)
def test_rung_compiles_the_blackwell_config(rung):
    for spec in specs(rung, "sm_100a"):
        assert spec.config == _config(rung) and spec.config.label in spec.kernel
        assert spec.options["num_warps"] == spec.config.num_warps
        if rung != "warpspec":
            assert spec.constexprs["MMA"] is blackwell.MMAv5


def test_architecture_is_chosen_once_on_the_host():
    assert arch.select_mma((10, 0)) is blackwell.MMAv5
    assert arch.select_mma((9, 0)) is hopper.WGMMA
    with pytest.raises(RuntimeError, match="sm_120"):
        arch.select_mma((12, 0))
    mode = registry.get("warpspec")
    assert mode.provider((10, 0)) is warpspec_tcgen05 and mode.provider((9, 0)) is warpspec
    assert warpspec.unsupported_reason((10, 0)) and warpspec_tcgen05.unsupported_reason((9, 0))


# --------------------------------------------------------------------------------------------------
# 2. The host side on a faked sm_100.


@pytest.fixture
def sm100(monkeypatch) -> list[Launched]:
    """A B200 as far as the host code can tell; returns the list that launches are recorded in.
    Tensors are FakeTensors on "cuda" (shapes, strides and dtypes, no storage); TMA descriptors
    are the real host-side ones, built from them."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (10, 0))
    monkeypatch.setattr(api, "target_of", lambda device: Target((10, 0), SM_COUNT))
    log: list[Launched] = []
    for module in (blocked, pipelined, persistent, warpspec, warpspec_tcgen05, slab):
        rung = module.RUNG
        monkeypatch.setattr(
            module, "RUNG", dataclasses.replace(rung, kernel=Recorder(rung.kernel.__name__, log))
        )
    monkeypatch.setattr(splitk, "splitk_kernel", Recorder("splitk_kernel", log))
    monkeypatch.setattr(swapab, "swapab_kernel", Recorder("swapab_kernel", log))
    monkeypatch.setattr(gemv, "gemv_kernel", Recorder("gemv_kernel", log))
    api.clear_plans()
    with FakeTensorMode():
        yield log
    api.clear_plans()


def _operands(M: int, N: int, K: int, layout: str, dtype=torch.float16):
    a = torch.empty(M, K, dtype=dtype, device="cuda")
    b = (
        torch.empty(N, K, dtype=dtype, device="cuda").t()
        if layout == "t"
        else torch.empty(K, N, dtype=dtype, device="cuda")
    )
    return a, b, torch.empty(M, N, dtype=dtype, device="cuda")


def _launch(rung: str, log: list[Launched], a, b, out):
    launch = api.prepare(rung, a, b, out)
    assert log == [], "prepare must not launch"
    launch.fn()
    (launched,) = log
    return launch, launched


# Ragged (fewer tiles than SMs) and large (more tiles than SMs); K not a multiple of BLOCK_K.
SHAPES = [(1000, 3000, 520), (8192, 8192, 1024)]


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_warpspec_prepare_on_sm100(sm100, shape, layout):
    M, N, K = shape
    a, b, out = _operands(M, N, K, layout)
    launch, launched = _launch("warpspec", sm100, a, b, out)
    cfg = warpspec_tcgen05.CONFIG
    assert launched.kernel == "warpspec_tcgen05_kernel"
    a_desc, b_desc, c_desc = launched.descriptors
    assert a_desc.block_shape == [cfg.BLOCK_M, cfg.BLOCK_K]
    if layout == "t":  # the [N, K] weight itself, K-major tiles
        assert list(b_desc.shape) == [N, K] and b_desc.block_shape == [cfg.BLOCK_N, cfg.BLOCK_K]
    else:
        assert list(b_desc.shape) == [K, N] and b_desc.block_shape == [cfg.BLOCK_K, cfg.BLOCK_N]
    assert c_desc.base is out
    assert c_desc.block_shape == [cfg.BLOCK_M, cfg.EPILOGUE_N]  # one epilogue slice, not the tile
    tiles = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)
    assert launched.grid == (min(SM_COUNT, tiles),)
    assert launched.kwargs["num_warps"] == cfg.num_warps
    assert launched.kwargs["B_KMAJOR"] == (layout == "t")
    assert launched.kwargs["STAGES"] == cfg.STAGES
    assert launch.config["BLOCK_N"] == cfg.BLOCK_N and launch.config["epilogue_n"] == cfg.EPILOGUE_N


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("rung", list(RUNG_MODULES))
def test_mma_rung_prepare_on_sm100(sm100, rung, shape, layout):
    """The rung kernel gets MMAv5, descriptors whose blocks are the config it reports, and the
    grid of its kind: one program per tile, or min(SMs, tiles) for the persistent one."""
    M, N, K = shape
    a, b, out = _operands(M, N, K, layout)
    launch, launched = _launch(rung, sm100, a, b, out)
    BM, BN, BK = (launch.config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    a_desc, b_desc, c_desc = launched.descriptors
    assert launched.kwargs["MMA"] is blackwell.MMAv5
    kmajor = launched.kwargs["B_KMAJOR"]
    assert kmajor == (layout == "t")
    assert a_desc.block_shape == [BM, BK]
    assert b_desc.block_shape == ([BN, BK] if kmajor else [BK, BN])
    assert c_desc.base is out and c_desc.block_shape == [BM, launch.config.get("epilogue_n", BN)]
    assert launched.kwargs["num_warps"] == launch.config["warps"]
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    assert launched.grid == ((min(SM_COUNT, tiles),) if rung == "persistent" else (tiles,))


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
@pytest.mark.parametrize("rung", list(RUNG_MODULES))
def test_mma_rung_runs_its_blackwell_config_on_sm100(sm100, rung):
    a, b, out = _operands(1000, 3000, 520, "row")
    launch, _ = _launch(rung, sm100, a, b, out)
    cfg = RUNG_MODULES[rung].CONFIGS[10]
    assert {k: launch.config[k] for k in cfg.table()} == cfg.table()


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
@pytest.mark.parametrize(
    ("M", "kernel"),
    [(4096, None), (128, None), (17, None), (16, "slab_kernel"), (1, "gemv_kernel")],
)
def test_default_kernel_on_sm100_follows_the_rule(sm100, M, kernel):
    """No table for this GPU: the documented rule (gluon_survey/choice.py) picks by M (None:
    cuBLAS above 16 tokens, no Gluon launch)."""
    a, b, out = _operands(M, 512, 128, "t")
    assert api.matmul(a, b, out=out) is out
    assert [launched.kernel for launched in sm100] == ([kernel] if kernel else [])


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
@pytest.mark.parametrize(("make", "error", "match"), BAD_INPUTS)
def test_bad_inputs_raise_the_hopper_errors_on_sm100(sm100, make, error, match):
    a, b = make()
    for rung in RUNGS:
        with pytest.raises(error, match=match):
            api.matmul(a, b, kernel=rung)
    assert sm100 == []


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_bad_out_unknown_kernel_and_consumer_blackwell_on_sm100(sm100, monkeypatch):
    a = torch.empty(8, 8, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="shape"):
        api.matmul(a, a, kernel="warpspec", out=torch.empty(8, 9, device="cuda", dtype=torch.float16))
    with pytest.raises(TypeError, match="out is"):
        api.matmul(a, a, kernel="Pipelined", out=torch.empty(8, 8, device="cuda"))
    with pytest.raises(KeyError, match="valid modes"):
        api.matmul(a, a, kernel="nope")
    monkeypatch.setattr(api, "target_of", lambda device: Target((12, 0), 48))  # sm_120: no tcgen05, no TMEM
    for rung in RUNGS:
        with pytest.raises(RuntimeError, match="sm_120"):
            api.prepare(rung, a, a)
    assert sm100 == []
