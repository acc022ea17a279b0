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
3. The grouped rung as tcgen05 shapes it (`kernels/grouped_tcgen05.py`, the registry's `grouped`
   kernel on sm_100): fp16, bf16 and fp8 (row-wise scales) compile for sm_100a with tcgen05 MMAs
   and no wgmma, a TMEM load per epilogue slice, TMA loads, masked register stores and no spills;
   on a faked sm_100 `grouped_matmul` (the `grouped-auto` mode) runs it at every S, decode sizes
   too, since the swap-AB kernel is Hopper's.

CPU only: `pytest -m compile tests/test_blackwell_compile.py`; passes with triton 3.6 and 3.9 (the
triton-3.9 pass of `make test` leaves out the configs marked `exhaustive`: tests/kernel_reports.py).
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import triton
from torch._subclasses.fake_tensor import FakeTensorMode  # CUDA-device tensors without a GPU

from bad_inputs import BAD_INPUTS
from gluon_survey import api, grouped_auto, registry
from gluon_survey import grouped as gg
from gluon_survey.driver import inspect as gs_inspect
from gluon_survey.kernels import (
    arch,
    blackwell,
    blocked,
    common,
    gemv,
    grouped,
    grouped_swapab,
    grouped_tcgen05,
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
from kernel_reports import compiled_report, design, specs
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
    [(4096, None), (128, None), (17, None), (16, "swapab_kernel"), (1, "gemv_kernel")],
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


# --------------------------------------------------------------------------------------------------
# 3. The grouped rung on sm_100a: kernels/grouped_tcgen05.py.

FP8 = "float8_e4m3fn"
GROUPED_DTYPES = ("float16", "bfloat16", FP8)  # the first of a design is its representative
# dtype -> (the tcgen05 MMA's SASS opcode, the K one instruction covers)
TCGEN05 = {"float16": ("UTCHMMA", 16), "bfloat16": ("UTCHMMA", 16), FP8: ("UTCQMMA", 32)}


@functools.cache
def _grouped_report(dtype: str, index: int):
    spec = specs("grouped", "sm_100a", dtype)[index]
    return spec, gs_inspect.inspect_spec(spec, "sm_100a")


def _grouped_params():
    """Two tiles per dtype; the triton-3.9 pass (`not exhaustive`) compiles the first of each
    design and epilogue split, as tests/test_grouped_compile.py does for sm_90a."""
    seen, params = set(), []
    for dtype in GROUPED_DTYPES:
        for index, spec in enumerate(specs("grouped", "sm_100a", dtype)):
            key = (design(spec, "sm_100a"), spec.config.BLOCK_N // spec.config.EPILOGUE_N)
            marks = () if key not in seen else (pytest.mark.exhaustive,)
            seen.add(key)
            params.append(
                pytest.param(dtype, index, id=f"{spec.kernel.replace(' ', '-')}-{dtype}", marks=marks)
            )
    return params


GROUPED_PARAMS = _grouped_params()


def test_grouped_mode_compiles_the_tcgen05_kernel_for_sm100():
    mode = registry.get("grouped")
    assert mode.provider((10, 0)) is grouped_tcgen05 and mode.provider((9, 0)) is grouped
    assert [p.id for p in GROUPED_PARAMS if not p.marks] == [
        "grouped_tcgen05_kernel-128x128x64-s4-w4-E<=512-B=t-float16",
        "grouped_tcgen05_kernel-128x256x64-s4-w4-E<=512-B=t-float16",
        f"grouped_tcgen05_kernel-128x128x128-fp8-s4-w4-E<=512-B=t-scales=row-{FP8}",
        f"grouped_tcgen05_kernel-128x256x128-fp8-s4-w4-E<=512-B=t-scales=row-{FP8}",
    ]
    for dtype in GROUPED_DTYPES:
        configs = [spec.config for spec in specs("grouped", "sm_100a", dtype)]
        fp8 = dtype == FP8
        assert configs == [
            grouped_tcgen05.config_for((10, 0), n, fp8) for n in (grouped.WIDE_N - 1, grouped.WIDE_N)
        ]
        assert all(cfg.num_warps == 4 for cfg in configs)  # one warpgroup: a thread per TMEM lane
    # each kernel compiles for its own architecture only
    assert grouped.compile_specs((10, 0)) == [] and grouped_tcgen05.compile_specs((9, 0)) == []
    assert grouped_swapab.compile_specs((10, 0)) == []


@pytest.mark.parametrize(("dtype", "index"), GROUPED_PARAMS)
def test_grouped_tcgen05_machine_code(dtype, index):
    spec, r = _grouped_report(dtype, index)
    assert r.error is None, r.error
    cfg = spec.config
    mma, k_per_mma = TCGEN05[dtype]
    assert r.count(mma) == cfg.BLOCK_K // k_per_mma, (
        f"one tcgen05 MMA per {k_per_mma} of K per K step: {r.sass}"
    )
    other = "UTCQMMA" if mma == "UTCHMMA" else "UTCHMMA"
    assert r.count(other) == 0
    assert r.count("HGMMA") == 0 and r.count("QGMMA") == 0 and r.count("HMMA") == 0, (
        "no Hopper MMA on sm_100a"
    )
    # the accumulator leaves tensor memory one EPILOGUE_N-column slice at a time
    assert r.count("LDTM") == cfg.BLOCK_N // cfg.EPILOGUE_N
    assert r.tmem_cols == cfg.BLOCK_N <= blackwell.TMEM_COLUMNS.value
    # the fp8 scales' multiplies on the fp32 values (sm_100 pairs them: FMUL2); none for 16 bits
    assert (r.count("FMUL") + r.count("FMUL2") > 0) == (dtype == FP8)
    assert r.count("UTMALDG") > 0, "TMA loads expected"
    assert r.count("UTMASTG") == 0 and r.count("STG") > 0, "a masked register store, not a TMA store"
    assert r.count("LDL") == 0 and r.count("STL") == 0, "local-memory traffic (spills)"
    assert r.spill_bytes == 0 and r.stack_bytes == 0
    assert r.num_warps == 4
    assert cfg.smem_bytes() < r.shared_bytes <= common.SMEM_LIMIT


@pytest.fixture
def grouped_sm100(monkeypatch) -> list[Launched]:
    """A B200 for `grouped_matmul`, the three grouped kernels swapped for recorders."""
    monkeypatch.setattr(api, "target_of", lambda device: Target((10, 0), SM_COUNT, "NVIDIA B200"))
    log: list[Launched] = []
    monkeypatch.setattr(grouped, "grouped_kernel", Recorder("grouped_kernel", log))
    monkeypatch.setattr(grouped_swapab, "grouped_swapab_kernel", Recorder("grouped_swapab_kernel", log))
    monkeypatch.setattr(grouped_tcgen05, "grouped_tcgen05_kernel", Recorder("grouped_tcgen05_kernel", log))
    with FakeTensorMode():
        yield log


def _grouped_operands(S: int, K: int, N: int, E: int, dtype=torch.bfloat16):
    """x [S, K], the [E, K, N] transpose view of an [E, N, K] weight, offs (even split), on "cuda"."""
    x = torch.empty(S, K, dtype=dtype, device="cuda")
    w = torch.empty(E, N, K, dtype=dtype, device="cuda").transpose(1, 2)
    offs = torch.tensor([S * (e + 1) // E for e in range(E)], dtype=torch.int32, device="cuda")
    return x, w, offs


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
@pytest.mark.parametrize("S", [1, grouped_auto.DECODE_ROWS, 4096])
@pytest.mark.parametrize("N", [1536, grouped.WIDE_N])
def test_grouped_matmul_runs_the_tcgen05_kernel_at_every_size_on_sm100(grouped_sm100, S, N):
    """Decode sizes too: the swap-AB kernel, which grouped_matmul runs up to DECODE_ROWS on Hopper,
    is wgmma's."""
    x, w, offs = _grouped_operands(S, 256, N, 8)
    out = gg.grouped_matmul(x, w, offs)
    (launch,) = grouped_sm100
    cfg = grouped_tcgen05.config_for((10, 0), N)
    assert launch.kernel == "grouped_tcgen05_kernel"
    a_desc, b_desc, o, o_offs, scale_x, scale_w, *sizes = launch.args
    assert (o, o_offs, scale_x, scale_w, sizes) == (out, offs, None, None, [S, N, 8])
    assert list(a_desc.block_shape) == [cfg.BLOCK_M, cfg.BLOCK_K]
    assert list(b_desc.shape) == [8 * N, 256] and list(b_desc.block_shape) == [cfg.BLOCK_N, cfg.BLOCK_K]
    assert launch.grid == (min(SM_COUNT, grouped.tile_bound(S, N, 8, cfg)),)
    assert launch.kwargs["num_warps"] == 4 and "MMA" not in launch.kwargs  # tcgen05 is the kernel's own
    assert (launch.kwargs["STAGES"], launch.kwargs["EPILOGUE_N"]) == (cfg.STAGES, cfg.EPILOGUE_N)
    assert launch.kwargs["SCALING"] == 0 and launch.kwargs["EXPERTS_PAD"] == 32
    config = gg.prepare("grouped-auto", x, w, offs).config
    assert config["mode"] == "grouped" and "sm_100" in config["why"] and config["warps"] == 4


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_grouped_fp8_runs_the_tcgen05_kernel_with_the_scales_on_sm100(grouped_sm100):
    x, w, offs = _grouped_operands(3, 256, 300, 8, torch.float8_e4m3fn)
    scale_x = torch.empty(3, dtype=torch.float32, device="cuda")
    scale_w = torch.empty(8, 300, dtype=torch.float32, device="cuda")
    out = gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w)
    (launch,) = grouped_sm100
    assert launch.kernel == "grouped_tcgen05_kernel" and out.dtype == torch.bfloat16
    assert launch.args[2] is out and launch.args[4] is scale_x and launch.args[5] is scale_w
    assert launch.kwargs["SCALING"] == 2
    cfg = grouped_tcgen05.FP8_CONFIGS[10]
    assert list(launch.args[0].block_shape) == [cfg.BLOCK_M, 128] and launch.args[0].base.dtype == x.dtype


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_the_grouped_modes_on_sm100(grouped_sm100):
    """`grouped` is the tcgen05 kernel there; `grouped-swapab` is refused with the reason, and the
    wgmma kernel itself names the one that runs."""
    x, w, offs = _grouped_operands(64, 128, 256, 4)
    gg.prepare("grouped", x, w, offs).fn()
    assert [launch.kernel for launch in grouped_sm100] == ["grouped_tcgen05_kernel"]
    with pytest.raises(
        RuntimeError, match=r"mode 'grouped-swapab' cannot run on this GPU \(NVIDIA B200\).*sm_100"
    ):
        gg.prepare("grouped-swapab", x, w, offs)
    with pytest.raises(RuntimeError, match=r"grouped_tcgen05\.py"):
        grouped.prepare(
            x, w, offs, torch.empty(64, 256, dtype=torch.bfloat16, device="cuda"), api.target_of(None)
        )
    assert len(grouped_sm100) == 1
    # and Hopper keeps both kernels: the choice by S is unchanged there
    assert grouped_auto.choose(1, torch.bfloat16, (9, 0))[0] == "grouped-swapab"
    assert grouped_auto.choose(1, torch.bfloat16, (10, 0))[0] == "grouped"
    assert "sm_90" in grouped_tcgen05.unsupported_reason((9, 0))
