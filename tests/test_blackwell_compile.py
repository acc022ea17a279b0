"""The Blackwell ladder without a Blackwell GPU.

1. Every rung compiles for sm_100a, with both B layouts, and its SASS is what the design says:
   tcgen05 MMAs (UTCHMMA), TMEM loads (LDTM), TMA loads and stores (UTMALDG / UTMASTG), no local
   memory (LDL / STL, spills), shared memory within the 227 KB a block may use, tensor memory
   within 512 columns, and register reallocation (USETMAXREG) in the warp-specialized kernel.
   Blocked, Pipelined and persistent are the Hopper rung kernels with `MMAv5` and the sm_100
   configs of `blackwell.BLACKWELL_CONFIGS`; warpspec is `blackwell.warpspec_tcgen05_kernel`.
2. With the device faked as sm_100 (148 SMs) and the kernel launches recorded, `api.prepare` /
   `api.matmul` pick the Blackwell kernels, build their TMA descriptors with the right block shapes
   and launch the right grid; bad inputs get the same errors as on Hopper.

CPU only: `pytest -m compile tests/test_blackwell_compile.py`; passes with triton 3.6 and 3.9.
"""

from __future__ import annotations

import collections
import functools
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import pytest
import torch
import triton
from torch._subclasses.fake_tensor import FakeTensorMode  # CUDA-device tensors without a GPU
from triton.backends.compiler import GPUTarget

from gluon_survey import api
from gluon_survey.compat import GluonASTSource
from gluon_survey.kernels import blackwell, blocked, common, persistent, pipelined, warpspec

pytestmark = pytest.mark.compile

SM100 = GPUTarget("cuda", 100, 32)
SM_COUNT = 148  # B200
RUNG_MODULES = {"Blocked": blocked, "Pipelined": pipelined, "persistent": persistent}
RUNGS = [*RUNG_MODULES, "warpspec"]
LAYOUTS = ["row", "t"]  # B as a row-major [K, N] matrix, or the transpose view of a [N, K] weight
# Columns of the fp32 accumulator(s): one BLOCK_N-wide tile, two of them in warpspec.
TMEM_COLUMNS = {"Blocked": 128, "Pipelined": 256, "persistent": 256, "warpspec": 512}


# --------------------------------------------------------------------------------------------------
# 1. Compiling for sm_100a.


def _specs(rung: str):
    """The rung's compile specs for sm_100 with its Blackwell config. Until each rung picks its
    config by capability itself, its module-level CONFIG is swapped for the Blackwell one while the
    specs are built (afterwards the swap changes nothing)."""
    if rung == "warpspec":
        return warpspec.compile_specs((10, 0), "float16")
    module = RUNG_MODULES[rung]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "CONFIG", blackwell.BLACKWELL_CONFIGS[rung])
        return module.compile_specs((10, 0), "float16")


@dataclass(frozen=True)
class Compiled:
    label: str
    shared: int
    tmem: int  # 32-bit TMEM columns allocated
    ops: collections.Counter  # SASS opcode, up to its first '.', -> count
    sass: str
    resources: str  # cuobjdump --dump-resource-usage


def _cuobjdump(flag: str, cubin: bytes) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout


@functools.cache
def _compiled(rung: str, layout: str) -> Compiled:
    (spec,) = [s for s in _specs(rung) if s.constexprs["B_KMAJOR"] == (layout == "t")]
    src = GluonASTSource(spec.fn, spec.signature, spec.constexprs)
    kernel = triton.compile(src, target=SM100, options=spec.options)
    sass = _cuobjdump("--dump-sass", kernel.asm["cubin"])
    opcode = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", re.MULTILINE)
    return Compiled(
        label=spec.kernel,
        shared=kernel.metadata.shared,
        tmem=kernel.metadata.tmem_size,
        ops=collections.Counter(m.group(1) for m in opcode.finditer(sass)),
        sass=sass,
        resources=_cuobjdump("--dump-resource-usage", kernel.asm["cubin"]),
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rung", RUNGS)
def test_rung_uses_tcgen05_tmem_and_tma(rung, layout):
    c = _compiled(rung, layout)
    assert any(op.startswith("UTC") and op.endswith("MMA") for op in c.ops), f"{c.label}: no tcgen05 MMA"
    assert c.ops["UTCHMMA"] > 0, f"{c.label}: no UTCHMMA (fp16 tcgen05)"
    assert c.ops["HGMMA"] == 0, f"{c.label}: Hopper wgmma in an sm_100a kernel"
    assert c.ops["LDTM"] > 0, f"{c.label}: the accumulator never leaves tensor memory"
    assert c.ops["UTMALDG"] > 0 and c.ops["UTMASTG"] > 0, f"{c.label}: no TMA load/store"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rung", RUNGS)
def test_rung_does_not_spill(rung, layout):
    c = _compiled(rung, layout)
    assert c.ops["LDL"] == 0 and c.ops["STL"] == 0, f"{c.label}: local memory traffic (spills)"
    assert re.search(r"\bLOCAL:0\b", c.resources) and re.search(r"\bSTACK:0\b", c.resources), c.resources


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rung", RUNGS)
def test_rung_fits_shared_and_tensor_memory(rung, layout):
    c = _compiled(rung, layout)
    assert 0 < c.shared <= common.SMEM_LIMIT, f"{c.label}: {c.shared} B of shared memory"
    assert c.tmem == TMEM_COLUMNS[rung] <= blackwell.TMEM_COLUMNS.value, f"{c.label}: {c.tmem} TMEM columns"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_warpspec_reallocates_registers(layout):
    """The 1-warp TMA and MMA workers share one warpgroup, which gives registers away
    (setmaxnreg.dec); the epilogue warpgroup takes them (setmaxnreg.inc)."""
    c = _compiled("warpspec", layout)
    assert c.ops["USETMAXREG"] > 0, c.label
    worker_regs = max(blackwell.LOAD_REGS, blackwell.MMA_REGS)
    assert re.search(rf"USETMAXREG\.DEALLOC\S*\s+{worker_regs:#x}\b", c.sass), "worker warpgroup not shrunk"
    assert "USETMAXREG.TRY_ALLOC" in c.sass, "epilogue warpgroup never grows"


@pytest.mark.parametrize("rung", RUNGS)
def test_rung_compiles_the_blackwell_config(rung):
    cfg = blackwell.BLACKWELL_CONFIGS[rung]
    for spec in _specs(rung):
        assert cfg.label in spec.kernel
        assert spec.options["num_warps"] == cfg.num_warps
        if rung != "warpspec":
            assert spec.constexprs["MMA"] is blackwell.MMAv5


def test_select_mma_by_capability():
    assert common.select_mma((10, 0)) is blackwell.MMAv5
    assert common.select_mma((9, 0)) is common.WGMMA
    with pytest.raises(RuntimeError, match="sm_120"):
        common.select_mma((12, 0))


# --------------------------------------------------------------------------------------------------
# 2. The host side on a faked sm_100.


@dataclass
class Launched:
    kernel: str
    grid: tuple
    args: tuple
    kwargs: dict


class _Recorder:
    """Stands in for a @gluon.jit kernel: `kernel[grid](*args, **kwargs)` records the launch."""

    def __init__(self, name: str, log: list[Launched]):
        self.name, self.log = name, log

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.log.append(Launched(self.name, tuple(grid), args, kwargs))


@pytest.fixture
def sm100(monkeypatch) -> list[Launched]:
    """A B200 as far as the host code can tell; returns the list that launches are recorded in.
    Tensors are FakeTensors on "cuda" (shapes, strides and dtypes, no storage); TMA descriptors
    are the real host-side ones, built from them."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (10, 0))
    monkeypatch.setattr(api, "capability_of", lambda device: (10, 0))
    monkeypatch.setattr(api, "sm_count", lambda device: SM_COUNT)
    log: list[Launched] = []
    for module, name in [
        (blocked, "blocked_kernel"),
        (pipelined, "pipelined_kernel"),
        (persistent, "persistent_kernel"),
        (warpspec, "warpspec_kernel"),
        (blackwell, "warpspec_tcgen05_kernel"),
    ]:
        monkeypatch.setattr(module, name, _Recorder(name, log))
    with FakeTensorMode():
        yield log


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
# Blocked/Pipelined/persistent choose their config through the rung module; until the modules
# pick it by capability they run their Hopper CONFIG on sm_100 too, which this marks.


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_warpspec_prepare_on_sm100(sm100, shape, layout):
    M, N, K = shape
    a, b, out = _operands(M, N, K, layout)
    launch, launched = _launch("warpspec", sm100, a, b, out)
    cfg = blackwell.WARPSPEC_CONFIG
    assert launched.kernel == "warpspec_tcgen05_kernel"
    a_desc, b_desc, c_desc = launched.args
    assert a_desc.block_shape == [cfg.BLOCK_M, cfg.BLOCK_K]
    if layout == "t":  # the [N, K] weight itself, K-major tiles
        assert list(b_desc.shape) == [N, K] and b_desc.block_shape == [cfg.BLOCK_N, cfg.BLOCK_K]
    else:
        assert list(b_desc.shape) == [K, N] and b_desc.block_shape == [cfg.BLOCK_K, cfg.BLOCK_N]
    assert c_desc.base is out
    assert c_desc.block_shape == [cfg.BLOCK_M, blackwell.EPILOGUE_N]  # one epilogue slice, not the tile
    tiles = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)
    assert launched.grid == (min(SM_COUNT, tiles),)
    assert launched.kwargs["num_warps"] == cfg.num_warps
    assert launched.kwargs["B_KMAJOR"] == (layout == "t")
    assert launched.kwargs["STAGES"] == cfg.STAGES
    assert launch.config["BLOCK_N"] == cfg.BLOCK_N and launch.config["epilogue_n"] == blackwell.EPILOGUE_N


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
    a_desc, b_desc, c_desc, mma, kmajor = launched.args[:5]
    assert mma is blackwell.MMAv5
    assert kmajor == (layout == "t")
    assert a_desc.block_shape == [BM, BK]
    assert b_desc.block_shape == ([BN, BK] if kmajor else [BK, BN])
    assert c_desc.base is out and c_desc.block_shape == [BM, launch.config.get("epilogue_n", BN)]
    assert launched.kwargs["num_warps"] == launch.config["warps"]
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    assert launched.grid == ((min(SM_COUNT, tiles),) if rung == "persistent" else (tiles,))


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
@pytest.mark.parametrize("rung", [r for r in RUNG_MODULES])
def test_mma_rung_runs_its_blackwell_config_on_sm100(sm100, rung):
    a, b, out = _operands(1000, 3000, 520, "row")
    launch, _ = _launch(rung, sm100, a, b, out)
    cfg = blackwell.BLACKWELL_CONFIGS[rung]
    assert {k: launch.config[k] for k in cfg.table()} == cfg.table()


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_default_kernel_on_sm100_is_the_blackwell_warpspec(sm100):
    a, b, out = _operands(256, 512, 128, "t")
    assert api.matmul(a, b, out=out) is out
    assert [launched.kernel for launched in sm100] == ["warpspec_tcgen05_kernel"]


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
@pytest.mark.parametrize(
    "make, error, match",
    [
        (
            lambda: (torch.empty(8, 8, dtype=torch.float16), torch.empty(8, 8, dtype=torch.float16)),
            ValueError,
            "cuda",
        ),
        (lambda: (torch.empty(8, 8, device="cuda"), torch.empty(8, 8, device="cuda")), TypeError, "float16"),
        (
            lambda: (
                torch.empty(8, 8, device="cuda", dtype=torch.float16),
                torch.empty(8, 8, device="cuda", dtype=torch.bfloat16),
            ),
            TypeError,
            "same dtype",
        ),
        (
            lambda: (
                torch.empty(8, 16, device="cuda", dtype=torch.float16),
                torch.empty(8, 8, device="cuda", dtype=torch.float16),
            ),
            ValueError,
            "match",
        ),
        (
            lambda: (
                torch.empty(2, 8, 8, device="cuda", dtype=torch.float16),
                torch.empty(8, 8, device="cuda", dtype=torch.float16),
            ),
            ValueError,
            "2-D",
        ),
    ],
    ids=["cpu", "fp32", "mixed-dtype", "shape-mismatch", "3d"],
)
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
    monkeypatch.setattr(api, "capability_of", lambda device: (12, 0))  # sm_120: no tcgen05, no TMEM
    for rung in RUNGS:
        with pytest.raises(RuntimeError, match="sm_120"):
            api.prepare(rung, a, a)
    assert sm100 == []
