"""The slab rung without a GPU: it compiles for sm_90a and sm_100a (both B layouts; fp8: B=t with
row-wise scales) and its SASS is what its docstring claims: mma.sync (HMMA.16816) as narrow as the
token tile and no wgmma or tcgen05 MMA, TMA loads, one TMA store of C, no atomics (nothing is
reduced across programs), no spills, the shared memory of its config. Every config `tune` may
pick compiles without spills too. On the host: the ring depth follows the grid's residency, the
token tile follows M, and what it refuses it refuses with the reason."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gluon_survey import api
from gluon_survey.driver import inspect as gs_inspect
from gluon_survey.kernels import common, slab
from gluon_survey.launch import Target
from kernel_reports import compiled_report, config_marks, specs
from recording import Launched, Recorder

pytestmark = pytest.mark.compile

FP8 = "float8_e4m3fn"
CASES = [
    pytest.param(
        arch,
        dtype,
        i,
        id=f"{arch}-{dtype}-{spec.kernel.replace(' ', '-')}",
        marks=config_marks("slab", arch, dtype, i),
    )
    for arch in ("sm_90a", "sm_100a")
    for dtype in ("float16", "bfloat16", FP8)
    for i, spec in enumerate(specs("slab", arch, dtype))
]
OTHER_MMAS = ("HGMMA", "QGMMA", "UTCHMMA", "UTCQMMA")


@pytest.mark.parametrize(("arch", "dtype", "index"), CASES)
def test_slab_machine_code(arch, dtype, index):
    spec, r = compiled_report("slab", arch, dtype, index)
    cfg = spec.config
    assert r.error is None, r.error
    # One K step of a warp: its 16 weight rows by the token tile, in m16n8k16 instructions (fp8
    # operands are widened to fp16 in registers and multiplied the same way).
    assert r.count("HMMA") == (cfg.BLOCK_K // 16) * (cfg.BLOCK_M // 8), r.sass
    suffix = ".BF16" if dtype == "bfloat16" else ""
    assert r.count(f"HMMA.16816.F32{suffix}") == r.count("HMMA")
    assert all(r.count(op) == 0 for op in OTHER_MMAS), "mma.sync only"
    assert r.count("ATOMG") == 0 and r.count("RED") == 0, "nothing is summed across programs"
    assert r.count("UTMALDG") > 0 and r.count("UTMASTG") == 1
    assert r.count("LDSM") > 0, "operands reach registers through ldmatrix"
    assert r.spill_bytes == 0 and r.count("LDL") == 0 and r.count("STL") == 0
    assert 0 <= r.shared_bytes - cfg.smem_bytes() < 512
    assert r.shared_bytes <= common.SMEM_LIMIT


@pytest.mark.exhaustive  # every config of one design: the triton-3.9 pass compiles one (CASES)
@pytest.mark.parametrize("dtype", ["bfloat16", FP8])
def test_every_tune_candidate_compiles_without_spills(dtype):
    """The slabs `tune` tries (16, 32 and 64 rows by every token width), with every ring a launch
    can give them (the powers of two up to the deepest), B=t (the layout of nn.Linear), sm_90a."""
    configs = [
        dataclasses.replace(c, BLOCK_M=t, STAGES=stages)
        for c in slab.candidates((9, 0), dtype == FP8).values()
        for t in slab.TOKENS
        for stages in (2, 4, 8, 16)
        if stages <= slab.stages_for(dataclasses.replace(c, BLOCK_M=t), 1, 1)
    ]
    for spec in slab.RUNG.compile_specs((9, 0), dtype, configs):
        if not spec.kernel.endswith(("B=t", "scales=row")):
            continue
        r = gs_inspect.inspect_spec(spec, "sm_90a")
        assert r.error is None, (spec.kernel, r.error)
        assert r.spill_bytes == 0 and r.count("LDL") == 0, (spec.kernel, r.spill_bytes)


def test_ring_depth_follows_the_grids_residency():
    cfg = dataclasses.replace(slab.CONFIGS[9], BLOCK_M=16, BLOCK_K=64)  # 16 tokens, 32 weight rows
    assert cfg.stage_bytes() == (16 + 32) * 64 * 2
    assert slab.stages_for(cfg, programs=128, sm_count=132) == slab.MAX_STAGES  # one per SM
    assert slab.stages_for(cfg, programs=192, sm_count=132) == slab.MAX_STAGES  # two: 113 KB each
    assert (common.SMEM_PER_SM // 5 - 1024) // 6144 == 7  # five per SM: 7 stages fit, 4 taken
    assert slab.stages_for(cfg, programs=132 * 5, sm_count=132) == 4
    assert slab.stages_for(cfg, programs=132 * 100, sm_count=132) == 2  # never fewer
    for programs in (1, 128, 256, 384, 640, 1792, 3584):
        stages = slab.stages_for(cfg, programs, 132)
        resident = min(slab.MAX_RESIDENT, -(-programs // 132))
        assert dataclasses.replace(cfg, STAGES=stages).smem_bytes() <= common.SMEM_LIMIT
        assert stages == 2 or resident * (stages * cfg.stage_bytes() + 1024) <= common.SMEM_PER_SM
        assert stages & (stages - 1) == 0  # a power of two


def test_configs_refuse_what_the_kernel_cannot_be():
    with pytest.raises(ValueError, match="16 weight rows per warp"):
        dataclasses.replace(slab.CONFIGS[9], BLOCK_N=48)
    with pytest.raises(ValueError, match="BLOCK_M \\(tokens\\) is one of"):
        dataclasses.replace(slab.CONFIGS[9], BLOCK_M=24)
    assert slab.CONFIGS[9].BLOCK_M == 0 and slab.CONFIGS[9].label.startswith("TautoxW32x256")
    with pytest.raises(ValueError, match="no ring depth yet"):
        slab.constexprs(slab.CONFIGS[9], (9, 0), "t")
    assert slab.unsupported_reason((12, 0)) is not None and slab.compile_specs((12, 0)) == []


def test_candidates_are_every_slab_with_the_token_tile_chosen_per_m():
    cands = slab.candidates((9, 0))
    assert {(c.BLOCK_M, c.BLOCK_N, c.num_warps, c.BLOCK_K) for c in cands.values()} == {
        *((0, w, w // 16, 256) for w in slab.SLABS),
        (0, 32, 2, 128),
    }
    assert slab.config_for((9, 0), 4096).label in cands
    assert all(c.ELEM_BYTES == 1 for c in slab.candidates((9, 0), fp8=True).values())


@pytest.fixture
def fake_hopper(monkeypatch):
    log: list[Launched] = []
    monkeypatch.setattr(slab, "RUNG", dataclasses.replace(slab.RUNG, kernel=Recorder("slab_kernel", log)))
    monkeypatch.setattr(api, "target_of", lambda device: Target((9, 0), 132, "NVIDIA H100 80GB HBM3"))
    api.clear_plans()
    with FakeTensorMode(allow_non_fake_inputs=True):
        yield log
    api.clear_plans()


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
@pytest.mark.parametrize(("M", "tokens"), [(1, 8), (7, 8), (16, 16), (17, 32), (64, 64), (65, 64)])
def test_a_launch_takes_the_token_tile_that_holds_m_and_one_program_per_tile(fake_hopper, M, tokens):
    N, K = 4096, 4096
    a = torch.empty(M, K, dtype=torch.bfloat16, device="cuda")
    w = torch.empty(N, K, dtype=torch.bfloat16, device="cuda")
    launch = api.prepare("slab", a, w.t())
    launch.fn()
    (launched,) = fake_hopper
    programs = (N // 32) * -(-M // tokens)
    assert launched.grid == (programs,) and launch.config["grid"] == programs
    assert launch.config["BLOCK_M"] == tokens and launch.config["BLOCK_N"] == 32
    x_desc, w_desc, c_desc = launched.descriptors
    assert list(x_desc.block_shape) == [tokens, 256] and list(w_desc.block_shape) == [32, 256]
    assert list(c_desc.block_shape) == [tokens, 32]
    assert launched.kwargs["W_KMAJOR"] is True
    cfg = dataclasses.replace(slab.CONFIGS[9], BLOCK_M=tokens)
    assert launched.kwargs["STAGES"] == slab.stages_for(cfg, programs, 132) == launch.config["stages"]
    assert launched.rest == (None, None, None) and launched.kwargs["SCALING"] == 0  # scales, bias: none


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_a_row_major_b_is_read_through_transposed_boxes(fake_hopper):
    a = torch.empty(16, 1024, dtype=torch.float16, device="cuda")
    b = torch.empty(1024, 520, dtype=torch.float16, device="cuda")
    api.matmul(a, b, kernel="slab")
    (launched,) = fake_hopper
    assert list(launched.descriptors[1].block_shape) == [256, 32] and launched.kwargs["W_KMAJOR"] is False
