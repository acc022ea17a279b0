"""grouped_matmul's host side without a GPU: every argument check (on CPU tensors, which each check
meets before the device check), the device checks, the empty cases, the choice between the
128-row and the swap-AB kernel by S, and the launches they prepare on a faked H100 (FakeTensors,
the kernels swapped for recorders); the kernel configs' arithmetic. fp8 e4m3 operands with
row-wise scales likewise: the scales' checks and the fixes they name, the fp8 launches of both
kernels (the scales after the offsets, SCALING 2; BLOCK_K 128 in the 128-row kernel, 256 in the
swap-AB one), the choice by S for fp8, and `prepare`'s refusals of modes without fp8 (or with fp8
only)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import gluon_survey
from gluon_survey import api, grouped_auto, registry
from gluon_survey import grouped as gg
from gluon_survey.kernels import common
from gluon_survey.kernels import grouped as gk
from gluon_survey.kernels import grouped_gemv as gv
from gluon_survey.kernels import grouped_swapab as gs
from gluon_survey.launch import Scales, Target
from recording import Launched, Recorder

pytestmark = pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")

H100 = Target((9, 0), 132, "NVIDIA H100 80GB HBM3")
A100 = Target((8, 0), 108, "NVIDIA A100")
BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
F32 = torch.float32


def _weights(E, K, N, dtype=BF16, device="cpu"):
    """The [E, K, N] transpose view of a contiguous [E, N, K] weight (transformers' layout)."""
    return torch.empty(E, N, K, dtype=dtype, device=device).transpose(1, 2)


def _operands(S=32, K=64, N=48, E=4, dtype=BF16, device="cpu"):
    x = torch.empty(S, K, dtype=dtype, device=device)
    offs = torch.tensor([S * (e + 1) // E for e in range(E)], dtype=torch.int32, device=device)
    return x, _weights(E, K, N, dtype, device), offs


def _args(**changes):
    x, w, offs = _operands()
    args = {"x": x, "w": w, "offs": offs, "out": None} | changes
    return args["x"], args["w"], args["offs"], args["out"]


BAD = [
    pytest.param(_args(x=[[1.0]]), TypeError, r"x must be a torch\.Tensor", id="x-not-a-tensor"),
    pytest.param(_args(w=None), TypeError, r"w must be a torch\.Tensor", id="w-not-a-tensor"),
    pytest.param(_args(offs=[8, 16, 24, 32]), TypeError, r"offs must be a torch\.Tensor", id="offs-list"),
    pytest.param(_args(x=torch.empty(2, 32, 64, dtype=BF16)), ValueError, "x must be 2-D", id="x-3d"),
    pytest.param(_args(x=torch.empty(32, 64)), TypeError, r"float32.*x\.bfloat16\(\)", id="x-fp32"),
    pytest.param(
        _args(w=torch.empty(64, 48, dtype=BF16)), ValueError, r"w must be 3-D \[E, K, N\]", id="w-2d"
    ),
    pytest.param(_args(w=_weights(4, 64, 48, torch.float16)), TypeError, "same dtype", id="mixed-dtype"),
    pytest.param(_args(w=_weights(4, 32, 48)), ValueError, r"K=64 .* w\.shape\[1\] must equal K", id="k"),
    pytest.param(
        _args(w=_weights(0, 64, 48), offs=torch.empty(0, dtype=torch.int32)),
        ValueError,
        "no experts",
        id="e0",
    ),
    pytest.param(
        _args(w=_weights(513, 64, 48), offs=torch.zeros(513, dtype=torch.int32)),
        ValueError,
        "w has 513 experts; grouped_matmul takes at most 512.*once per group",
        id="too-many-experts",
    ),
    pytest.param(
        _args(x=torch.empty(32, 60, dtype=BF16), w=_weights(4, 60, 48)),
        ValueError,
        "not a multiple of 8.*pad x and w",
        id="k-tma",
    ),
    pytest.param(
        _args(w=torch.empty(4, 64, 48, dtype=BF16)),
        ValueError,
        r"contiguous \[E, K, N\].*w\.transpose\(1, 2\)\.contiguous\(\)",
        id="w-kn-contiguous",
    ),
    pytest.param(
        _args(w=torch.empty(4, 96, 64, dtype=BF16)[:, ::2].transpose(1, 2)),
        ValueError,
        "transpose view of a contiguous",
        id="w-strided",
    ),
    pytest.param(
        _args(x=torch.empty(64, 32, dtype=BF16).t()),
        ValueError,
        r"row-major: pass x\.contiguous\(\)",
        id="x-t",
    ),
    pytest.param(
        _args(offs=torch.tensor([8, 16, 24, 32])),
        TypeError,
        r"int64.*offs\.to\(torch\.int32\)",
        id="offs-int64",
    ),
    pytest.param(
        _args(offs=torch.zeros(2, 2, dtype=torch.int32)), ValueError, "offs must be 1-D", id="offs-2d"
    ),
    pytest.param(
        _args(offs=torch.tensor([16, 32], dtype=torch.int32)),
        ValueError,
        "offs has 2 entries but w has 4 experts",
        id="offs-length",
    ),
    pytest.param(
        _args(offs=torch.tensor([8, 16, 24, 33], dtype=torch.int32)),
        ValueError,
        r"offs\[-1\] is 33 but x has 32 rows",
        id="offs-past-s",
    ),
    pytest.param(_args(out="nope"), TypeError, r"out must be a torch\.Tensor", id="out-not-a-tensor"),
    pytest.param(
        _args(out=torch.empty(32, 47, dtype=BF16)), ValueError, r"out has shape \(32, 47\)", id="out-shape"
    ),
    pytest.param(
        _args(out=torch.empty(32, 48, dtype=torch.float16)), TypeError, "out is torch.float16", id="out-dt"
    ),
    pytest.param(
        _args(out=torch.empty(48, 32, dtype=BF16).t()), ValueError, "out .* must be row-major", id="out-t"
    ),
    pytest.param(_args(), ValueError, "(?i)cuda", id="cpu"),
]


@pytest.mark.parametrize(("args", "error", "match"), BAD)
def test_bad_arguments_are_refused_with_the_fix(args, error, match):
    x, w, offs, out = args
    with pytest.raises(error, match=match):
        gg.grouped_matmul(x, w, offs, out=out)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without a CUDA GPU")
def test_cpu_tensors_on_a_cpu_only_torch_name_the_build():
    x, w, offs = _operands()
    with pytest.raises(ValueError, match=r"there is none here: torch .*CUDA not available"):
        gg.grouped_matmul(x, w, offs)


# --------------------------------------------------------------------------------------------------
# On a faked H100: FakeTensors on "cuda", the kernel a recorder.


def _record_kernels(monkeypatch, log: list[Launched] | None) -> None:
    """The grouped kernels swapped for recorders into one log (their names tell them apart)."""
    monkeypatch.setattr(gk, "grouped_kernel", Recorder("grouped_kernel", log))
    monkeypatch.setattr(gs, "grouped_swapab_kernel", Recorder("grouped_swapab_kernel", log))
    monkeypatch.setattr(gv, "grouped_gemv_kernel", Recorder("grouped_gemv_kernel", log))


@pytest.fixture
def fake_h100(monkeypatch) -> list[Launched]:
    log: list[Launched] = []
    monkeypatch.setattr(api, "target_of", lambda device: H100)
    _record_kernels(monkeypatch, log)
    with FakeTensorMode():
        yield log


def test_the_launch_is_one_persistent_program_per_sm_over_every_experts_tiles(fake_h100):
    x, w, offs = _operands(S=1000, K=256, N=300, E=8, device="cuda")
    out = gg.grouped_matmul(x, w, offs)
    assert (out.shape, out.dtype, out.device.type) == ((1000, 300), BF16, "cuda")
    (launch,) = fake_h100
    assert launch.kernel == "grouped_kernel"  # S = 1000 > DECODE_ROWS: the 128-row tiles
    cfg = gk.CONFIGS[9]  # N < WIDE_N: the 128-wide tile
    a_desc, b_desc, c, o, scale_x, scale_w, S, N, E = launch.args
    assert (c, o, scale_x, scale_w, S, N, E) == (out, offs, None, None, 1000, 300, 8)
    assert launch.kwargs["SCALING"] == 0  # fp16/bf16: no scales, None constexprs
    # at most 1000 // 128 full row tiles + one partial per expert, x 3 column tiles: 45 < 132 SMs
    assert launch.grid == (45,)
    assert launch.kwargs["STAGES"] == cfg.STAGES and launch.kwargs["num_warps"] == cfg.num_warps
    assert launch.kwargs["GROUP_M"] == cfg.GROUP_M and launch.kwargs["EPILOGUE_N"] == cfg.EPILOGUE_N
    assert launch.kwargs["EXPERTS_PAD"] == 32  # the table is a warp wide at least
    assert launch.kwargs["MMA"].__name__ == "WGMMA"
    assert list(a_desc.shape) == [1000, 256] and list(a_desc.block_shape) == [cfg.BLOCK_M, cfg.BLOCK_K]
    # the weight as its [E * N, K] reshape, read K-major
    assert list(b_desc.shape) == [8 * 300, 256] and list(b_desc.block_shape) == [cfg.BLOCK_N, cfg.BLOCK_K]


def test_the_gemv_launch_is_a_program_per_token_slot_and_four_weight_rows(fake_h100):
    """Qwen3-30B-A3B's down projection at one token: 8 token-slots over 128 experts, N 2048, K 768
    in one chunk (gemv's one-chunk row: 1024 columns on two warps), the offsets read on the GPU."""
    x, w, offs = _operands(S=8, K=768, N=2050, E=128, device="cuda")
    out = torch.empty(8, 2050, dtype=BF16, device="cuda")
    launch = gg.prepare("grouped-gemv", x, w, offs, out)
    assert launch.config["BLOCK_N"] == 4 and launch.config["mma"] == "none (FMA)"
    launch.fn()
    (launched,) = fake_h100
    assert launched.kernel == "grouped_gemv_kernel"
    assert launched.grid == (8, 513)  # cdiv(2050, 4): the last program's rows past N are masked
    assert launched.args[:4] == (x, w, offs, out) and launched.args[4:] == (8, 2050, 768, 128, 2050 * 768)
    assert launched.kwargs == {"ROWS": 4, "BLOCK_K": 1024, "EXPERTS_PAD": 128, "num_warps": 2}


def test_the_gemv_mode_refuses_what_it_cannot_take(fake_h100):
    x, w, offs = _operands(S=2, K=16392, N=64, E=4, device="cuda")
    with pytest.raises(ValueError, match=r"grouped-gemv reads K in one chunk, at most 16384 \(K is 16392\)"):
        gg.prepare("grouped-gemv", x, w, offs)
    x, w, offs, scale_x, scale_w = _fp8_operands(S=2, K=256, N=64, E=4, device="cuda")
    with pytest.raises(TypeError, match="mode 'grouped-gemv' has no fp8 kernel"):
        gg.prepare("grouped-gemv", x, w, offs, scale_x=scale_x, scale_w=scale_w)
    assert fake_h100 == []
    with pytest.raises(ValueError, match="ROWS"):
        gv.GroupedGemvConfig(ROWS=3)


def test_a_problem_is_planned_once_and_each_call_launches_on_its_own_tensors(fake_h100, monkeypatch):
    planned = []
    original = grouped_auto.plan
    monkeypatch.setattr(
        grouped_auto, "plan", lambda x, *a, **k: planned.append(x.shape[0]) or original(x, *a, **k)
    )
    x1, w, offs1 = _operands(S=1000, K=256, N=300, E=8, device="cuda")
    x2, _, offs2 = _operands(S=1000, K=256, N=300, E=8, device="cuda")
    out1, out2 = gg.grouped_matmul(x1, w, offs1), gg.grouped_matmul(x2, w, offs2)
    assert planned == [1000]  # the second call of the problem runs the first call's plan
    first, second = fake_h100
    assert second.args[0].base is x2 and second.args[2:4] == (out2, offs2)
    assert first.args[0].base is x1 and first.args[2:4] == (out1, offs1)
    assert first.grid == second.grid and first.kwargs == second.kwargs
    gg.grouped_matmul(*_operands(S=999, K=256, N=300, E=8, device="cuda"))  # another problem
    assert planned == [1000, 999]
    monkeypatch.setattr(grouped_auto, "DECODE_ROWS", 1000)  # the choice's switch: planned again
    gg.grouped_matmul(x1, w, offs1)
    assert planned == [1000, 999, 1000] and fake_h100[-1].kernel == "grouped_swapab_kernel"
    gg.clear_plans()
    gg.grouped_matmul(x1, w, offs1)
    assert planned == [1000, 999, 1000, 1000]


def test_a_call_like_an_earlier_one_launches_without_the_checks(fake_h100, monkeypatch):
    """The checks run on a call's first arguments of each kind; a later call whose tensors match
    them in shape, strides, dtype, device and alignment launches at once, on its own tensors (a
    fresh output each), and any other argument is checked again, with the check's own error."""
    checked = []
    original = gg._check
    monkeypatch.setattr(gg, "_check", lambda *a, **k: checked.append(a[0].shape[0]) or original(*a, **k))
    x1, w, offs1 = _operands(S=1000, K=256, N=300, E=8, device="cuda")
    x2, _, offs2 = _operands(S=1000, K=256, N=300, E=8, device="cuda")
    out1, out2 = gg.grouped_matmul(x1, w, offs1), gg.grouped_matmul(x2, w, offs2)
    assert checked == [1000] and out1 is not out2 and out2.shape == (1000, 300)
    assert fake_h100[1].args[0].base is x2 and fake_h100[1].args[2:4] == (out2, offs2)
    given = torch.empty(1000, 300, dtype=BF16, device="cuda")
    assert gg.grouped_matmul(x2, w, offs2, out=given) is given  # an output given: another kind
    assert gg.grouped_matmul(x1, w, offs1, out=given) is given
    assert checked == [1000, 1000]
    with pytest.raises(ValueError, match="w is a contiguous"):  # other strides: checked again
        gg.grouped_matmul(x1, torch.empty(8, 256, 300, dtype=BF16, device="cuda"), offs1)
    with pytest.raises(TypeError, match=r"offs is torch\.int64"):
        gg.grouped_matmul(x1, w, torch.empty(8, dtype=torch.int64, device="cuda"))
    with pytest.raises(TypeError, match=r"offs must be a torch\.Tensor"):
        gg.grouped_matmul(x1, w, [1000] * 8)
    assert checked == [1000, 1000, 1000, 1000, 1000]
    gg.clear_plans()
    gg.grouped_matmul(x1, w, offs1)
    assert checked[-1] == 1000 and len(checked) == 6
    h1, h2 = gg.grouped_swiglu(x1, w, offs1), gg.grouped_swiglu(x2, w, offs2)  # the fused gate: the same
    assert len(checked) == 7 and h1.shape == h2.shape == (1000, 150) and h1 is not h2
    assert fake_h100[-1].kernel == "grouped_kernel" and fake_h100[-1].kwargs["GLU"] == 1


def test_wide_outputs_take_the_wide_tile_and_the_grid_never_exceeds_the_sms(fake_h100):
    x, w, offs = _operands(S=4096, K=128, N=gk.WIDE_N, E=200, device="cuda")
    gg.grouped_matmul(x, w, offs)
    (launch,) = fake_h100
    cfg = gk.WIDE_CONFIGS[9]
    assert (cfg.BLOCK_M, cfg.BLOCK_N) == (128, 256)
    assert list(launch.args[1].block_shape) == [cfg.BLOCK_N, cfg.BLOCK_K]
    assert launch.kwargs["EXPERTS_PAD"] == 256 and launch.kwargs["STAGES"] == cfg.STAGES
    assert launch.grid == (132,)


def test_few_tiles_get_one_program_each(fake_h100):
    x, w, offs = _operands(S=5, K=64, N=64, E=2, device="cuda")
    out = torch.empty(5, 64, dtype=BF16, device="cuda")
    assert gg.grouped_matmul(x, w, offs, out=out) is out
    (launch,) = fake_h100
    assert launch.kernel == "grouped_swapab_kernel"  # S = 5: decode
    assert launch.grid == (2,)  # 2 experts x 1 chunk of tokens x 1 block of 64 weight rows


@pytest.mark.parametrize(
    ("S", "E", "row_tiles"),
    [(1000, 8, 7 + 8), (1000, 512, 7 + 512), (300, 512, 300), (128, 1, 2), (5, 2, 2), (4096, 200, 232)],
)
def test_the_grid_bound_holds_for_every_routing(S, E, row_tiles):
    """The grid is sized without the offsets: S // BLOCK_M full row tiles plus at most one partial
    one per expert, never more row tiles than rows. Random routings, and the worst one (every
    expert one row past a multiple of BLOCK_M where the rows allow), stay within it."""
    cfg = gk.CONFIGS[9]
    assert gk.tile_bound(S, 300, E, cfg) == row_tiles * 3  # 3 column tiles of 128
    g = torch.Generator().manual_seed(0)
    routings = []
    for _ in range(20):
        cuts = torch.sort(torch.randint(0, S + 1, (E - 1,), generator=g)).values.tolist()
        routings.append([b - a for a, b in zip([0, *cuts], [*cuts, S], strict=True)])
    worst = [min(1 + cfg.BLOCK_M * (S // cfg.BLOCK_M // E), S // E)] * E
    routings.append(worst[:-1] + [S - sum(worst[:-1])])
    for counts in routings:
        assert sum(-(-c // cfg.BLOCK_M) for c in counts) <= row_tiles


@pytest.mark.parametrize(
    ("E", "pad"), [(1, 32), (8, 32), (32, 32), (33, 64), (128, 128), (256, 256), (384, 512)]
)
def test_the_offsets_table_is_a_power_of_two_a_warp_wide_at_least(E, pad):
    assert gk.experts_pad(E) == pad


def test_more_experts_than_the_table_holds_are_refused():
    with pytest.raises(ValueError, match="at most 512 experts, got 513"):
        gk.experts_pad(513)


@pytest.mark.parametrize(("S", "N"), [(0, 64), (16, 0), (0, 0)])
def test_empty_outputs_launch_nothing(fake_h100, S, N):
    x, w, offs = _operands(S=S, K=64, N=N, E=4, device="cuda")
    out = gg.grouped_matmul(x, w, offs)
    assert tuple(out.shape) == (S, N) and fake_h100 == []


def test_k_zero_gives_zeros_without_a_launch(monkeypatch):
    zeroed = []
    monkeypatch.setattr(torch.Tensor, "zero_", lambda t: zeroed.append(tuple(t.shape)) or t)
    monkeypatch.setattr(api, "target_of", lambda device: H100)
    _record_kernels(monkeypatch, log := [])
    with FakeTensorMode():
        x, w, offs = _operands(S=16, K=0, N=32, E=2, device="cuda")
        gg.grouped_matmul(x, w, offs)
    assert zeroed == [(16, 32)] and log == []


def test_only_hopper_and_blackwell_run_it(monkeypatch):
    monkeypatch.setattr(api, "target_of", lambda device: A100)
    _record_kernels(monkeypatch, log := [])
    with FakeTensorMode():
        x, w, offs = _operands(device="cuda")
        with pytest.raises(
            RuntimeError, match=r"NVIDIA A100.*Hopper \(sm_90\) and Blackwell \(sm_100\); this GPU is sm_80"
        ):
            gg.grouped_matmul(x, w, offs)
        for mode in ("grouped", "grouped-swapab", "grouped-auto"):
            with pytest.raises(RuntimeError, match=rf"mode '{mode}' cannot run on this GPU.*sm_80"):
                gg.prepare(mode, x, w, offs)
    assert log == []


def test_operands_on_two_gpus_or_the_cpu_are_refused(fake_h100):
    x, w, offs = _operands(device="cuda")
    with pytest.raises(ValueError, match=r"x is on cuda:0 but offs is on cuda:1"):
        gg.grouped_matmul(x.to("cuda:0"), w.to("cuda:0"), offs.to("cuda:1"))
    with pytest.raises(ValueError, match=r"w is on cpu"):
        gg.grouped_matmul(x, _weights(4, 64, 48), offs)
    assert fake_h100 == []


def test_the_package_exports_grouped_matmul_lazily():
    assert gluon_survey.grouped_matmul is gg.grouped_matmul
    assert "grouped_matmul" in gluon_survey.__all__


# --------------------------------------------------------------------------------------------------
# fp8 e4m3 operands with row-wise scales


def _fp8_operands(S=32, K=64, N=48, E=4, device="cpu"):
    """x, w, offs in e4m3 and the scales in torch._scaled_grouped_mm's shapes: [S] and [E, N]."""
    x, w, offs = _operands(S, K, N, E, FP8, device)
    return x, w, offs, torch.empty(S, dtype=F32, device=device), torch.empty(E, N, dtype=F32, device=device)


def _fp8_args(**changes):
    x, w, offs, scale_x, scale_w = _fp8_operands()
    return {"x": x, "w": w, "offs": offs, "scale_x": scale_x, "scale_w": scale_w} | changes


FP8_BAD = [
    pytest.param(
        _fp8_args(scale_x=None, scale_w=None),
        TypeError,
        r"fp8 operands need row-wise .*scale_x \[S\].*scale_w \[E, N\].*"
        r"got scale_x=NoneType, scale_w=NoneType",
        id="no-scales",
    ),
    pytest.param(
        _fp8_args(scale_w=None),
        TypeError,
        r"got scale_x=a tensor of shape \(32,\), scale_w=NoneType",
        id="one",
    ),
    pytest.param(
        _fp8_args(scale_x=[1.0] * 32), TypeError, r"scale_x must be a torch\.Tensor", id="scale-list"
    ),
    pytest.param(
        _fp8_args(scale_w=torch.empty(4, 48, dtype=BF16)),
        TypeError,
        r"scale_w is torch\.bfloat16; scales are float32 \(use scale_w\.float\(\)\)",
        id="scale-bf16",
    ),
    pytest.param(
        _fp8_args(scale_x=torch.empty(32, 1)),
        ValueError,
        r"scale_x has shape \(32, 1\); grouped_matmul takes it as \(32\), torch\._scaled_grouped_mm's shape: "
        r"pass scale_x\.reshape\(32\)",
        id="scale-x-column",
    ),
    pytest.param(
        _fp8_args(scale_w=torch.empty(4, 1, 48)),
        ValueError,
        r"pass scale_w\.reshape\(4, 48\)",
        id="scale-w-3d",
    ),
    pytest.param(
        _fp8_args(scale_x=torch.empty(()), scale_w=torch.empty(1)),
        ValueError,
        r"one scale each \(per-tensor\).*scale_x\.reshape\(1\)\.expand\(32\)\.contiguous\(\).*"
        r"scale_w\.reshape\(1, 1\)\.expand\(4, 48\)\.contiguous\(\)",
        id="per-tensor",
    ),
    pytest.param(
        _fp8_args(scale_w=torch.empty(4, 47)),
        ValueError,
        r"got scale_w \(4, 47\) for S=32, E=4, N=48",
        id="size",
    ),
    pytest.param(
        _fp8_args(scale_w=torch.empty(48, 4).t()),
        ValueError,
        r"scale_w \(strides \(1, 4\)\) must be contiguous.*pass scale_w\.contiguous\(\)",
        id="scale-w-strided",
    ),
    pytest.param(
        _fp8_args(out_dtype=F32),
        TypeError,
        r"out_dtype torch\.float32: an fp8 product is written as torch\.bfloat16 or float16",
        id="out-dtype-fp32",
    ),
    pytest.param(
        _fp8_args(out=torch.empty(32, 48, dtype=torch.float16)),
        TypeError,
        r"out is torch\.float16, expected torch\.bfloat16",  # out_dtype's default
        id="out-not-out-dtype",
    ),
    pytest.param(
        _fp8_args(x=torch.empty(32, 40, dtype=FP8), w=_weights(4, 40, 48, FP8)),
        ValueError,
        r"K=40 is not a multiple of 16: TMA reads rows of 16-byte multiples",
        id="k-16",
    ),
    pytest.param(
        _fp8_args(x=torch.empty(32, 64, dtype=torch.float8_e5m2), w=_weights(4, 64, 48, torch.float8_e5m2)),
        TypeError,
        r"float8_e5m2; grouped_matmul's fp8 kernel takes float8_e4m3fn",
        id="e5m2",
    ),
    pytest.param(_fp8_args(w=_weights(4, 64, 48)), TypeError, "same dtype", id="fp8-x-bf16-w"),
    pytest.param(_fp8_args(), ValueError, "(?i)cuda", id="fp8-cpu"),
    pytest.param(
        _fp8_args(out_dtype=torch.float16, out=torch.empty(32, 48, dtype=torch.float16)),
        ValueError,
        "(?i)cuda",  # fp16 out: every check passes, the device is the last
        id="fp8-fp16-out-cpu",
    ),
    # fp16/bf16 operands take no scales and write their own dtype
    pytest.param(
        {**dict(zip(("x", "w", "offs"), _operands(), strict=True)), "scale_x": torch.empty(32)},
        TypeError,
        r"scale_x / scale_w apply to float8_e4m3fn operands only; x is torch\.bfloat16",
        id="bf16-with-scales",
    ),
    pytest.param(
        {**dict(zip(("x", "w", "offs"), _operands(), strict=True)), "out_dtype": torch.float16},
        TypeError,
        r"out_dtype torch\.float16 differs from the inputs' torch\.bfloat16; it is for fp8 inputs",
        id="bf16-out-dtype",
    ),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), FP8_BAD)
def test_bad_fp8_arguments_are_refused_with_the_fix(kwargs, error, match):
    with pytest.raises(error, match=match):
        gg.grouped_matmul(**kwargs)


def test_an_fp8_launch_passes_the_callers_scales_after_the_offsets(fake_h100):
    x, w, offs, scale_x, scale_w = _fp8_operands(S=1000, K=256, N=300, E=8, device="cuda")
    out = gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w)
    assert (out.shape, out.dtype) == ((1000, 300), BF16)  # out_dtype's default
    (launch,) = fake_h100
    cfg = gk.FP8_CONFIGS[9]
    a_desc, b_desc, c, o, sx, sw, S, N, E = launch.args
    # the caller's buffers, not copies: a CUDA graph replays with the values they hold then
    assert c is out and o is offs and sx is scale_x and sw is scale_w and (S, N, E) == (1000, 300, 8)
    assert launch.kwargs["SCALING"] == 2 and launch.kwargs["STAGES"] == cfg.STAGES
    assert launch.grid == (45,)  # the same tiles as 16-bit: 15 row tiles x 3 column tiles
    assert list(a_desc.block_shape) == [128, 128] and list(b_desc.block_shape) == [cfg.BLOCK_N, 128]
    assert a_desc.base.dtype == FP8 and b_desc.base.dtype == FP8
    half = gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w, out_dtype=torch.float16)
    assert half.dtype == torch.float16 and fake_h100[1].args[2] is half


def test_an_fp8_decode_launch_is_the_swap_ab_kernel_with_the_callers_scales(fake_h100, monkeypatch):
    monkeypatch.setattr(grouped_auto, "FP8_SWAPAB", True)
    """grouped-auto sends fp8 operands at decode sizes to the swap-AB kernel, as it does 16-bit
    ones: Mixtral-8x7B's down projection at one token (S = 2), 2 experts x 4096 / 64 weight blocks
    = 128 programs, on the fp8 ring (K steps of 256 e4m3 elements, 8 stages at 16 tokens)."""
    x, w, offs, scale_x, scale_w = _fp8_operands(S=2, K=14336, N=4096, E=8, device="cuda")
    out = gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w)
    assert out.dtype == BF16
    (launch,) = fake_h100
    cfg = gs.FP8_CONFIGS[9][16]
    assert launch.kernel == "grouped_swapab_kernel" and launch.kwargs["SCALING"] == 2
    x_desc, w_desc, o, o_offs, sx, sw, S, N, E = launch.args
    # the caller's buffers, not copies: a CUDA graph replays with the values they hold then
    assert o is out and o_offs is offs and sx is scale_x and sw is scale_w and (S, N, E) == (2, 4096, 8)
    assert launch.grid == (128,)
    assert list(x_desc.block_shape) == [16, 256] and list(w_desc.block_shape) == [64, 256]
    assert x_desc.base.dtype == FP8 and w_desc.base.dtype == FP8
    assert (launch.kwargs["STAGES"], launch.kwargs["num_warps"]) == (cfg.STAGES, 4) == (8, 4)
    config = gg.prepare("grouped-auto", x, w, offs, scale_x=scale_x, scale_w=scale_w).config
    assert config["mode"] == "grouped-swapab" and config["swap_ab"] and config["scales"] == "row"
    assert "S = 2 <= 512" in config["why"] and config["BLOCK_K"] == 256 and config["stages"] == 8
    half = gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w, out_dtype=torch.float16)
    assert half.dtype == torch.float16 and fake_h100[1].args[2] is half


@pytest.mark.parametrize(
    ("S", "kernel"),
    [(1, "grouped_swapab_kernel"), (grouped_auto.DECODE_ROWS, "grouped_swapab_kernel")]
    + [(grouped_auto.DECODE_ROWS + 1, "grouped_kernel")],
)
def test_fp8_runs_the_swap_ab_kernel_up_to_decode_rows(fake_h100, monkeypatch, S, kernel):
    monkeypatch.setattr(grouped_auto, "FP8_SWAPAB", True)
    x, w, offs, scale_x, scale_w = _fp8_operands(S=S, K=128, N=256, E=8, device="cuda")
    gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w)
    (launch,) = fake_h100
    assert launch.kernel == kernel and launch.kwargs["SCALING"] == 2
    assert launch.args[4] is scale_x and launch.args[5] is scale_w
    assert launch.args[0].base.dtype == FP8 and list(launch.args[0].block_shape)[1] == (
        256 if kernel == "grouped_swapab_kernel" else 128
    )


def test_a_wide_fp8_output_takes_the_wide_fp8_tile(fake_h100):
    x, w, offs, scale_x, scale_w = _fp8_operands(S=4096, K=128, N=gk.WIDE_N, E=200, device="cuda")
    gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w)
    (launch,) = fake_h100
    cfg = gk.FP8_WIDE_CONFIGS[9]
    assert (
        list(launch.args[1].block_shape) == [256, 128] and launch.kwargs["EPILOGUE_N"] == cfg.EPILOGUE_N == 64
    )


def test_fp8_scales_on_another_device_are_refused(fake_h100):
    x, w, offs, scale_x, scale_w = _fp8_operands(device="cuda")
    with pytest.raises(ValueError, match=r"x is on cuda:0 but scale_x is on cuda:1"):
        gg.grouped_matmul(
            x.to("cuda:0"), w.to("cuda:0"), offs.to("cuda:0"), scale_x=scale_x.to("cuda:1"), scale_w=scale_w
        )
    with pytest.raises(ValueError, match=r"scale_w is on cpu"):
        gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=torch.empty(4, 48, device="cpu"))
    assert fake_h100 == []


def test_prepare_refuses_fp8_for_a_mode_without_fp8_and_16_bit_for_an_fp8_only_mode(fake_h100):
    x, w, offs, scale_x, scale_w = _fp8_operands(device="cuda")
    scales = {"scale_x": scale_x, "scale_w": scale_w}
    with pytest.raises(
        TypeError,
        match=r"mode 'grouped_mm' has no fp8 kernel; fp8 operands run in: grouped, grouped-swapab, "
        "grouped-auto, ",
    ):
        gg.prepare("grouped_mm", x, w, offs, **scales)
    with pytest.raises(
        TypeError, match=r"mode 'scaled_grouped_mm' takes fp8 e4m3 operands only; fp16 and bf16"
    ):
        gg.prepare("scaled_grouped_mm", *_operands(device="cuda"))
    launch = gg.prepare("scaled_grouped_mm", x, w, offs, **scales)
    assert launch.config["impl"].startswith("torch._scaled_grouped_mm")
    launch = gg.prepare("grouped", x, w, offs, **scales)
    assert launch.config["scales"] == "row" and launch.config["BLOCK_K"] == 128
    launch = gg.prepare("grouped-swapab", x, w, offs, **scales)
    assert launch.config["scales"] == "row" and launch.config["BLOCK_K"] == 256 and launch.config["swap_ab"]
    assert fake_h100 == []  # prepared, not launched


def test_fp8_with_k_zero_or_no_rows_launches_nothing(monkeypatch):
    zeroed = []
    monkeypatch.setattr(torch.Tensor, "zero_", lambda t: zeroed.append(tuple(t.shape)) or t)
    monkeypatch.setattr(api, "target_of", lambda device: H100)
    _record_kernels(monkeypatch, log := [])
    with FakeTensorMode():
        x, w, offs, scale_x, scale_w = _fp8_operands(S=16, K=0, N=32, E=2, device="cuda")
        assert gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w).dtype == BF16
        x, w, offs, scale_x, scale_w = _fp8_operands(S=0, K=64, N=32, E=2, device="cuda")
        assert gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w).shape == (0, 32)
    assert zeroed == [(16, 32)] and log == []


# --------------------------------------------------------------------------------------------------
# check_offsets: the values, read on the host


def test_check_offsets_accepts_cumulative_ends():
    gg.check_offsets(torch.tensor([0, 3, 3, 10], dtype=torch.int32), rows=10)
    gg.check_offsets(torch.tensor([], dtype=torch.int32), rows=0)


@pytest.mark.parametrize(
    ("values", "rows", "match"),
    [
        ([4, 2, 6], None, r"offs\[1\] is 2 but offs\[0\] is 4.*expert 1 as empty"),
        ([-1, 2], None, r"offs\[0\] is -1.*never negative"),
        ([2, 5], 4, r"offs\[-1\] is 5 but x has 4 rows"),
    ],
)
def test_check_offsets_names_the_first_bad_entry(values, rows, match):
    with pytest.raises(ValueError, match=match):
        gg.check_offsets(torch.tensor(values, dtype=torch.int32), rows)


# --------------------------------------------------------------------------------------------------
# The kernel's config and specs


def test_the_hopper_configs_fit_and_bigger_rings_are_refused():
    cfg, wide = gk.CONFIGS[9], gk.WIDE_CONFIGS[9]
    assert cfg.smem_bytes() == 4 * (128 + 128) * 64 * 2
    assert wide.smem_bytes() == 4 * (128 + 256) * 64 * 2
    # the ring stays live through the epilogue (the next tile's loads), so its scratch is extra
    assert wide.smem_bytes() + wide.epilogue_bytes() <= common.SMEM_LIMIT
    with pytest.raises(ValueError, match="shared memory"):
        replace(cfg, STAGES=7)
    with pytest.raises(ValueError, match="shared memory"):
        replace(wide, EPILOGUE_N=256)  # 192 KB of ring + 64 KB of scratch
    with pytest.raises(ValueError, match="STAGES must be at least 2"):
        replace(cfg, STAGES=1)
    with pytest.raises(ValueError, match="EPILOGUE_N"):
        replace(wide, EPILOGUE_N=96)


def test_the_wide_tile_from_wide_n_on():
    assert gk.config_for((9, 0), gk.WIDE_N - 1) is gk.CONFIGS[9]
    assert gk.config_for((9, 0), gk.WIDE_N) is gk.WIDE_CONFIGS[9]


def test_the_narrow_tile_where_the_wide_ones_few_tiles_leave_the_sms_idle():
    """Mixtral-8x7B's down projection (N 4096, 8 experts: 8 x 16 = 128 wide tiles at one row block
    an expert) on 132 SMs takes the narrow tile up to 128 rows an expert, and the wide one past
    them; its gate_up (N 28672: 896 wide tiles) keeps the wide tile."""
    h100 = {"E": 8, "sm_count": 132}
    assert gk.config_for((9, 0), 4096, S=1024, **h100) is gk.CONFIGS[9]
    assert gk.config_for((9, 0), 4096, S=1025, **h100) is gk.WIDE_CONFIGS[9]  # 129 rows an expert
    assert gk.config_for((9, 0), 28672, S=1024, **h100) is gk.WIDE_CONFIGS[9]
    # the wave line: 8 experts x 16 column tiles = 128 <= 132 SMs; 9 experts make 144, one wave of
    # 148 SMs. Mixtral-8x22B's down (N 6144: 8 x 24 = 192) and Phi-3.5-MoE's (16 x 16 = 256) keep
    # the wide tile, which was the faster there on an H200
    assert gk.config_for((9, 0), 4096, S=9 * 128, E=9, sm_count=132) is gk.WIDE_CONFIGS[9]
    assert gk.config_for((9, 0), 4096, S=9 * 128, E=9, sm_count=148) is gk.CONFIGS[9]
    assert gk.config_for((9, 0), 6144, S=640, **h100) is gk.WIDE_CONFIGS[9]
    assert gk.config_for((9, 0), 4096, S=640, E=16, sm_count=132) is gk.WIDE_CONFIGS[9]
    # fp8 and the fused SwiGLU keep the line by N (the rule was measured on 16-bit products)
    assert gk.config_for((9, 0), 4096, fp8=True, S=1024, **h100) is gk.FP8_WIDE_CONFIGS[9]
    assert gk.config_for((9, 0), 4096, glu=True, S=1024, **h100) is gk.GLU_WIDE_CONFIGS[9]
    why = gk.narrow_reason(1024, 4096, 8, 132)
    assert "128 rows an expert" in why and "128 wide tiles" in why and "132 SMs" in why
    assert gk.narrow_reason(1024, gk.WIDE_N - 1, 8, 132) is None  # narrow by N, not by this rule


@pytest.mark.parametrize(("S", "block_n"), [(1024, 128), (1032, 256)])
def test_the_launch_says_why_it_runs_the_narrow_tile(fake_h100, S, block_n):
    x, w, offs = _operands(S=S, K=128, N=4096, E=8, device="cuda")
    config = gg.prepare("grouped-auto", x, w, offs).config
    assert config["mode"] == "grouped" and config["BLOCK_N"] == block_n
    assert ("wide tiles" in config.get("tile", "")) == (block_n == 128)
    gg.grouped_matmul(x, w, offs)
    (launch,) = fake_h100
    assert list(launch.args[1].block_shape) == [block_n, 64]


def test_specs_only_for_hopper_16_bit_and_fp8_row_wise():
    assert [s.kernel for s in gk.compile_specs((9, 0), "bfloat16")] == [
        "grouped_kernel 128x128x64 s4 w8 E<=512 B=t",
        "grouped_kernel 128x256x64 s4 w8 E<=512 B=t",
    ]
    fp8 = gk.compile_specs((9, 0), "float8_e4m3fn")
    assert [s.kernel for s in fp8] == [
        "grouped_kernel 128x128x128 fp8 s4 w8 E<=512 B=t scales=row",
        "grouped_kernel 128x256x128 fp8 s4 w8 E<=512 B=t scales=row",
    ]
    for spec in fp8:  # the scales are pointers after the offsets; the output bf16
        assert spec.constexprs["SCALING"] == 2 and spec.signature["out"] == "*bf16"
        assert [spec.signature[k] for k in ("offs", "scale_x", "scale_w", "S")] == [
            "*i32",
            "*fp32",
            "*fp32",
            "i32",
        ]
    sixteen = gk.compile_specs((9, 0), "float16")[0]
    assert sixteen.constexprs["scale_x"] is None and sixteen.signature["scale_x"] == "constexpr"
    assert gk.compile_specs((10, 0), "float16") == [] and gk.compile_specs((10, 0), "float8_e4m3fn") == []
    assert gk.compile_specs((9, 0), "float32") == []
    assert gk.unsupported_reason((9, 0)) is None and "grouped_tcgen05.py" in gk.unsupported_reason((10, 0))


# --------------------------------------------------------------------------------------------------
# The choice by S (grouped-auto, what grouped_matmul runs) and the swap-AB kernel's launch


@pytest.mark.parametrize(
    ("S", "kernel"),
    [(1, "grouped_swapab_kernel"), (grouped_auto.DECODE_ROWS, "grouped_swapab_kernel")]
    + [(grouped_auto.DECODE_ROWS + 1, "grouped_kernel")],
)
@pytest.mark.parametrize("dtype", [torch.float16, BF16], ids=str)
def test_grouped_matmul_runs_the_swap_ab_kernel_up_to_decode_rows(fake_h100, S, kernel, dtype):
    x, w, offs = _operands(S=S, K=128, N=256, E=8, dtype=dtype, device="cuda")
    gg.grouped_matmul(x, w, offs)
    assert [launch.kernel for launch in fake_h100] == [kernel]


@pytest.mark.parametrize(
    ("S", "mode", "tile"),
    [(512, "grouped-swapab", (16, 64, 256)), (513, "grouped", (128, 128, 64))],
)
def test_the_choice_says_which_kernel_and_tile_and_why(fake_h100, S, mode, tile):
    x, w, offs = _operands(S=S, K=128, N=256, E=128, device="cuda")
    config = gg.prepare("grouped-auto", x, w, offs).config
    assert config["mode"] == mode and str(S) in config["why"]
    assert (config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]) == tile
    assert config.get("swap_ab", False) == (mode == "grouped-swapab")
    assert fake_h100 == []  # prepared, not launched


@pytest.mark.parametrize("dtype", [torch.float16, BF16, FP8], ids=str)
def test_the_choice_is_by_s_alone_for_every_dtype_grouped_matmul_takes(dtype, monkeypatch):
    monkeypatch.setattr(grouped_auto, "FP8_SWAPAB", True)
    assert grouped_auto.choose(1, dtype, (9, 0))[0] == "grouped-swapab"
    assert grouped_auto.choose(grouped_auto.DECODE_ROWS, dtype, (9, 0))[0] == "grouped-swapab"
    assert grouped_auto.choose(grouped_auto.DECODE_ROWS + 1, dtype, (9, 0))[0] == "grouped"


def test_fp8_takes_the_swap_ab_kernel_by_default_unless_the_environment_turns_it_off():
    assert grouped_auto.fp8_swapab_from({}) is True
    assert grouped_auto.fp8_swapab_from({"GLUON_SURVEY_FP8_SWAPAB": "1"}) is True
    assert grouped_auto.fp8_swapab_from({"GLUON_SURVEY_FP8_SWAPAB": "0"}) is False


def test_fp8_stays_on_the_128_row_kernel_when_its_swap_ab_path_is_switched_off(monkeypatch):
    monkeypatch.setattr(grouped_auto, "FP8_SWAPAB", False)
    mode, why = grouped_auto.choose(1, FP8, (9, 0))
    assert mode == "grouped" and "FP8_SWAPAB" in why
    assert grouped_auto.choose(1, BF16, (9, 0))[0] == "grouped-swapab"


def test_a_dtype_the_swap_ab_kernel_has_no_config_for_goes_to_the_128_row_kernel():
    mode, why = grouped_auto.choose(1, torch.float8_e5m2, (9, 0))
    assert mode == "grouped" and "fp16, bf16 and e4m3 ones only" in why


@pytest.mark.parametrize(
    ("mode", "kernel"), [("grouped", "grouped_kernel"), ("grouped-swapab", "grouped_swapab_kernel")]
)
@pytest.mark.parametrize("S", [1, 4096])
def test_each_kernel_mode_runs_its_kernel_at_every_size(fake_h100, mode, kernel, S):
    """The rungs' modes are the kernels alone, what the driver and the probe compare at every S."""
    x, w, offs = _operands(S=S, K=64, N=128, E=4, device="cuda")
    out = torch.empty(S, 128, dtype=BF16, device="cuda")
    gg.prepare(mode, x, w, offs, out).fn()
    assert [launch.kernel for launch in fake_h100] == [kernel]


def test_the_grouped_modes_of_the_registry():
    grouped = [m for m in registry.MODES if m.grouped]
    assert [m.name for m in grouped] == [
        "grouped",
        "grouped-swapab",
        "grouped-gemv",
        "grouped-auto",
        "grouped_mm",
        "cublas-loop",
        "scaled_grouped_mm",
    ]
    assert [m.kind for m in grouped[:4]] == ["gluon", "gluon", "gluon", "choice"]
    assert gg.MODE == "grouped-auto"
    assert registry.get("grouped-swapab").provider() is gs
    assert registry.get("grouped-gemv").provider() is gv
    # the decoding mode is timed up to two token-slots an expert on average
    gemv = registry.get("grouped-gemv")
    assert registry.too_many_rows_reason(gemv, 256, 128) is None
    assert "at most 2 token-slots an expert" in registry.too_many_rows_reason(gemv, 257, 128)
    assert all(registry.too_many_rows_reason(m, 10**6, 1) is None for m in grouped if m is not gemv)
    assert registry.get("grouped-auto").provider() is grouped_auto


def test_the_swap_ab_launch_is_the_transpose_on_64_row_weight_blocks(fake_h100):
    """Mixtral-8x7B's down projection at one token (S = 2 token-slots): 2 experts x 4096 / 64
    weight blocks = 128 programs, the fewest tiles a surveyed decode cell makes (the 128-row
    kernel's 256-wide tiles made 32)."""
    x, w, offs = _operands(S=2, K=14336, N=4096, E=8, device="cuda")
    out = gg.grouped_matmul(x, w, offs)
    (launch,) = fake_h100
    cfg = gs.CONFIGS[9][16]
    x_desc, w_desc, o, o_offs, scale_x, scale_w, S, N, E = launch.args
    assert (o, o_offs, scale_x, scale_w, S, N, E) == (out, offs, None, None, 2, 4096, 8)
    assert launch.kwargs["SCALING"] == 0  # fp16/bf16: no scales, None constexprs
    assert launch.grid == (128,)
    assert list(x_desc.shape) == [2, 14336] and list(x_desc.block_shape) == [16, cfg.BLOCK_K]
    assert list(w_desc.shape) == [8 * 4096, 14336] and list(w_desc.block_shape) == [64, cfg.BLOCK_K]
    assert launch.kwargs["MMA"].__name__ == "WGMMA" and launch.kwargs["num_warps"] == 4
    assert (launch.kwargs["STAGES"], launch.kwargs["GROUP_M"]) == (cfg.STAGES, cfg.GROUP_M)
    assert launch.kwargs["EXPERTS_PAD"] == 32


def test_the_swap_ab_grid_never_exceeds_the_sms_or_the_tiles(fake_h100):
    x, w, offs = _operands(S=128, K=2048, N=1536, E=128, device="cuda")  # Qwen3-30B gate_up, T = 16
    gg.grouped_matmul(x, w, offs)
    x, w, offs = _operands(S=3, K=64, N=200, E=2, device="cuda")
    gg.grouped_matmul(x, w, offs)
    big, small = fake_h100
    assert big.grid == (132,) and big.kwargs["EXPERTS_PAD"] == 128
    assert small.grid == (2 * 4,)  # 2 experts (3 rows: at most 2 with rows) x 4 blocks of 64 of N = 200


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize(
    ("S", "E", "rows", "width"),
    [
        (1, 8, 1, 16),  # Mixtral at one token
        (128, 8, 16, 16),  # Mixtral at 64 tokens
        (256, 8, 32, 32),
        (512, 8, 64, 64),
        (128, 128, 1, 16),  # Qwen3-30B at 16 tokens
        (512, 256, 2, 16),  # DeepSeek-V3 at 64 tokens
        (17, 1, 17, 32),  # one expert: every row
        (512, 1, 512, 64),  # more rows than the widest tile: chunks of 64
        (0, 4, 0, 16),
    ],
)
def test_the_token_tile_holds_the_rows_an_expert_gets(S, E, rows, width, fp8):
    assert gs.rows_per_expert(S, E) == rows
    cfg = gs.config_for((9, 0), S, E, fp8)
    assert cfg.BLOCK_T == cfg.BLOCK_M == width and cfg is (gs.FP8_CONFIGS if fp8 else gs.CONFIGS)[9][width]


def test_the_swap_ab_configs_fit_and_say_their_tile_in_cs_terms():
    for width, cfg in gs.CONFIGS[9].items():
        assert (cfg.BLOCK_T, cfg.BLOCK_W, cfg.num_warps) == (width, 64, 4)
        assert cfg.smem_bytes() == cfg.STAGES * (width + 64) * cfg.BLOCK_K * 2
        assert cfg.smem_bytes() + cfg.epilogue_bytes() <= common.SMEM_LIMIT
    cfg = gs.CONFIGS[9][16]
    assert cfg.label == "W64xT16x256 s4 w4"
    assert cfg.table() == {
        "BLOCK_M": 16,  # tokens: C's rows
        "BLOCK_N": 64,  # weight rows: C's columns
        "BLOCK_K": 256,
        "stages": 4,
        "warps": 4,
        "group_m": 16,
        "epilogue_n": 64,
        "swap_ab": True,
    }


def test_the_swap_ab_fp8_rings_hold_the_16_bit_rings_bytes_in_256_wide_k_steps():
    """1-byte elements: the same ring bytes a program as in 16-bit, in K steps of 256 (8 fp8
    wgmmas of 32), so twice the stages at 16 and 32 tokens and, at 64, 256-wide steps where 16-bit
    has 128."""
    for width, fp8 in gs.FP8_CONFIGS[9].items():
        sixteen = gs.CONFIGS[9][width]
        assert (fp8.BLOCK_T, fp8.BLOCK_W, fp8.num_warps, fp8.ELEM_BYTES) == (width, 64, 4, 1)
        assert fp8.BLOCK_K == 256 and fp8.smem_bytes() == sixteen.smem_bytes()
        assert fp8.smem_bytes() == fp8.STAGES * (width + 64) * 256
        assert fp8.smem_bytes() + fp8.epilogue_bytes() <= common.SMEM_LIMIT
    assert [cfg.STAGES for cfg in gs.FP8_CONFIGS[9].values()] == [8, 8, 6]
    assert gs.FP8_CONFIGS[9][64].label == "W64xT64x256 fp8 s6 w4"
    with pytest.raises(ValueError, match="shared memory"):  # ten 24 KB stages at 32 tokens
        replace(gs.FP8_CONFIGS[9][32], STAGES=10)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"BLOCK_N": 96}, "multiple of 64, the rows of one warpgroup's wgmma"),
        ({"BLOCK_M": 12}, r"token tile: the wgmma's N\) must be a multiple of 8"),
        ({"BLOCK_M": 512}, "from 8 to 256"),
        ({"STAGES": 6}, "shared memory"),  # 6 x 48 KB at 32 tokens by 256 of K
    ],
)
def test_bad_swap_ab_configs_are_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        replace(gs.CONFIGS[9][32], **changes)


def test_swap_ab_specs_only_for_hopper_16_bit_and_fp8_row_wise():
    assert [s.kernel for s in gs.compile_specs((9, 0), "bfloat16")] == [
        "grouped_swapab_kernel W64xT16x256 s4 w4 E<=512 B=t",
        "grouped_swapab_kernel W64xT32x256 s4 w4 E<=512 B=t",
        "grouped_swapab_kernel W64xT64x128 s6 w4 E<=512 B=t",
    ]
    fp8 = gs.compile_specs((9, 0), "float8_e4m3fn")
    assert [s.kernel for s in fp8] == [
        "grouped_swapab_kernel W64xT16x256 fp8 s8 w4 E<=512 B=t scales=row",
        "grouped_swapab_kernel W64xT32x256 fp8 s8 w4 E<=512 B=t scales=row",
        "grouped_swapab_kernel W64xT64x256 fp8 s6 w4 E<=512 B=t scales=row",
    ]
    for spec in fp8:  # the scales are pointers after the offsets, as the 128-row kernel's; the output bf16
        assert spec.constexprs["SCALING"] == 2 and spec.signature["out"] == "*bf16"
        assert [spec.signature[k] for k in ("offs", "scale_x", "scale_w", "S")] == [
            "*i32",
            "*fp32",
            "*fp32",
            "i32",
        ]
        assert spec.signature["x_desc"].startswith("tensordesc<fp8e4nv[")
    sixteen = gs.compile_specs((9, 0), "float16")[0]
    assert sixteen.constexprs["scale_x"] is None and sixteen.signature["scale_x"] == "constexpr"
    assert sixteen.constexprs["SCALING"] == 0
    assert gs.compile_specs((10, 0), "float16") == [] and gs.compile_specs((10, 0), "float8_e4m3fn") == []
    assert gs.compile_specs((9, 0), "float32") == []
    assert gs.unsupported_reason((9, 0)) is None and "sm_100" in gs.unsupported_reason((10, 0))
    # grouped-auto runs on both: Blackwell without the swap-AB kernel (tests/test_blackwell_compile.py)
    assert (
        grouped_auto.unsupported_reason((9, 0)) is None and grouped_auto.unsupported_reason((10, 0)) is None
    )
    assert "sm_120" in grouped_auto.unsupported_reason((12, 0))


def test_the_fp8_configs_keep_the_16_bit_stage_bytes_with_k_twice_as_deep():
    for sixteen, fp8 in ((gk.CONFIGS[9], gk.FP8_CONFIGS[9]), (gk.WIDE_CONFIGS[9], gk.FP8_WIDE_CONFIGS[9])):
        assert (fp8.BLOCK_M, fp8.BLOCK_N, fp8.STAGES) == (sixteen.BLOCK_M, sixteen.BLOCK_N, sixteen.STAGES)
        assert fp8.BLOCK_K == 128 == 2 * sixteen.BLOCK_K and fp8.ELEM_BYTES == 1
        assert fp8.smem_bytes() == sixteen.smem_bytes()
        assert fp8.smem_bytes() + fp8.epilogue_bytes() <= common.SMEM_LIMIT
    # the wide fp8 tile stores 64 columns at a time: a thread holds a column scale for each of its columns
    assert gk.FP8_WIDE_CONFIGS[9].EPILOGUE_N == 64
    assert gk.config_for((9, 0), 1536, fp8=True) is gk.FP8_CONFIGS[9]
    assert gk.config_for((9, 0), gk.WIDE_N, fp8=True) is gk.FP8_WIDE_CONFIGS[9]


def test_the_kernels_prepare_refuses_a_config_of_the_other_kind():
    with FakeTensorMode():
        x, w, offs = _operands(device="cuda")
        out = torch.empty(32, 48, dtype=BF16, device="cuda")
        with pytest.raises(ValueError, match="is for fp8 operands; these are bfloat16"):
            gk.prepare(x, w, offs, out, H100, gk.FP8_CONFIGS[9])
        with pytest.raises(ValueError, match=r"grouped-swapab: config W64xT16x256 fp8 s8 w4 is for fp8"):
            gs.prepare(x, w, offs, out, H100, gs.FP8_CONFIGS[9][16])
        x, w, offs, scale_x, scale_w = _fp8_operands(device="cuda")
        scales = Scales(scale_x, scale_w, "row")
        with pytest.raises(ValueError, match=r"grouped-swapab: config W64xT16x256 s4 w4 is for 16-bit"):
            gs.prepare(x, w, offs, out, H100, gs.CONFIGS[9][16], scales=scales)
        with pytest.raises(ValueError, match=r"grouped-swapab: fp8 scales are row-wise .* not 'tensor'"):
            gs.prepare(x, w, offs, out, H100, scales=Scales(scale_x, scale_w, "tensor"))


# --------------------------------------------------------------------------------------------------
# grouped_swiglu: the gate-and-up projection with SwiGLU fused into the 128-row kernel's epilogue


def _swiglu_bad(**changes):
    x, w, offs = _operands()  # N = 48: I = 24
    args = {"x": x, "w": w, "offs": offs, "out": None} | changes
    return args["x"], args["w"], args["offs"], args["out"]


SWIGLU_BAD = [
    # grouped_matmul's checks, where the fused call's shapes do not change them
    *[p for p in BAD if p.id not in ("out-shape", "out-dt", "out-t")],
    pytest.param(
        _swiglu_bad(x=torch.empty(32, 64, dtype=FP8), w=_weights(4, 64, 48, FP8)),
        TypeError,
        r"grouped_swiglu's fused kernel takes float16 or bfloat16: for fp8 run grouped_matmul",
        id="fp8",
    ),
    pytest.param(
        _swiglu_bad(w=_weights(4, 64, 47)), ValueError, r"N=47 .*odd.*I gate channels, then I up", id="odd-n"
    ),
    pytest.param(
        _swiglu_bad(out=torch.empty(32, 48, dtype=BF16)),
        ValueError,
        r"out has shape \(32, 48\), expected \(32, 24\)",
        id="out-is-s-by-i",
    ),
    pytest.param(
        _swiglu_bad(out=torch.empty(32, 24, dtype=torch.float16)),
        TypeError,
        "out is torch.float16",
        id="out-dt",
    ),
    pytest.param(
        _swiglu_bad(out=torch.empty(24, 32, dtype=BF16).t()),
        ValueError,
        "out .* must be row-major",
        id="out-t",
    ),
]


@pytest.mark.parametrize(("args", "error", "match"), SWIGLU_BAD)
def test_bad_swiglu_arguments_are_refused_with_the_fix(args, error, match):
    x, w, offs, out = args
    with pytest.raises(error, match=match):
        gg.grouped_swiglu(x, w, offs, out=out)


@pytest.mark.parametrize("S", [1, 5, 1000])
def test_swiglu_launches_the_128_row_kernel_with_the_gate_at_every_size(fake_h100, S):
    """One launch of the 128-row kernel with GLU 1 (no swap-AB version yet, so at decode sizes
    too): N is the output's I columns, the weight descriptor the [E * 2I, K] gate_up weight in
    boxes half as tall as the MMA (gate rows and up rows: two boxes a stage), the grid the tiles
    of the [S, I] output."""
    x, w, offs = _operands(S=S, K=256, N=600, E=8, device="cuda")  # 2I = 600 < WIDE_N: I = 300
    out = gg.grouped_swiglu(x, w, offs)
    assert (out.shape, out.dtype, out.device.type) == ((S, 300), BF16, "cuda")
    (launch,) = fake_h100
    assert launch.kernel == "grouped_kernel"
    cfg = gk.GLU_CONFIGS[9]
    assert (cfg.BLOCK_N, cfg.out_n, cfg.GLU) == (128, 64, 1)  # the unfused 128x128 MMA tile, 64 outputs
    a_desc, b_desc, c, o, scale_x, scale_w, s, n, e = launch.args
    assert (c, o, scale_x, scale_w, s, n, e) == (out, offs, None, None, S, 300, 8)
    assert launch.kwargs["GLU"] == 1 and launch.kwargs["SCALING"] == 0
    assert launch.kwargs["EPILOGUE_N"] == cfg.EPILOGUE_N == 64
    assert list(b_desc.shape) == [8 * 600, 256] and list(b_desc.block_shape) == [64, cfg.BLOCK_K]
    assert list(a_desc.block_shape) == [cfg.BLOCK_M, cfg.BLOCK_K]
    assert launch.grid == (min(132, gk.tile_bound(S, 300, 8, cfg)),)
    assert gk.tile_bound(1000, 300, 8, cfg) == (1000 // 128 + 8) * 5  # 5 column tiles of 64 outputs


def test_wide_gate_up_weights_take_the_wide_glu_tile(fake_h100):
    x, w, offs = _operands(S=4096, K=128, N=gk.WIDE_N, E=16, device="cuda")
    out = torch.empty(4096, gk.WIDE_N // 2, dtype=BF16, device="cuda")
    assert gg.grouped_swiglu(x, w, offs, out=out) is out
    (launch,) = fake_h100
    cfg = gk.GLU_WIDE_CONFIGS[9]
    assert (cfg.BLOCK_N, cfg.out_n, cfg.EPILOGUE_N) == (256, 128, 128)  # a 128x256 MMA, 128 outputs
    assert list(launch.args[1].block_shape) == [128, cfg.BLOCK_K]
    assert launch.args[7] == gk.WIDE_N // 2 and launch.kwargs["GLU"] == 1
    assert launch.grid == (132,)


@pytest.mark.parametrize(("S", "N"), [(0, 64), (16, 0)])
def test_empty_swiglu_outputs_launch_nothing(fake_h100, S, N):
    x, w, offs = _operands(S=S, K=64, N=N, E=4, device="cuda")
    assert tuple(gg.grouped_swiglu(x, w, offs).shape) == (S, N // 2) and fake_h100 == []


def test_swiglu_with_k_zero_gives_zeros_without_a_launch(monkeypatch):
    zeroed = []
    monkeypatch.setattr(torch.Tensor, "zero_", lambda t: zeroed.append(tuple(t.shape)) or t)
    monkeypatch.setattr(api, "target_of", lambda device: H100)
    _record_kernels(monkeypatch, log := [])
    with FakeTensorMode():
        x, w, offs = _operands(S=16, K=0, N=32, E=2, device="cuda")
        gg.grouped_swiglu(x, w, offs)
    assert zeroed == [(16, 16)] and log == []


@pytest.mark.parametrize(
    ("target", "gpu"), [(A100, "sm_80"), (Target((10, 0), 148, "NVIDIA B200"), "sm_100")]
)
def test_swiglu_runs_on_hopper_only(monkeypatch, target, gpu):
    monkeypatch.setattr(api, "target_of", lambda device: target)
    _record_kernels(monkeypatch, log := [])
    with FakeTensorMode():
        x, w, offs = _operands(device="cuda")
        with pytest.raises(RuntimeError, match=rf"Hopper's \(sm_90\), this GPU is {gpu}; run grouped_matmul"):
            gg.grouped_swiglu(x, w, offs)
    assert log == []


def test_the_glu_configs_keep_the_unfused_rings_and_bad_ones_are_refused():
    for glu, plain in ((gk.GLU_CONFIGS[9], gk.CONFIGS[9]), (gk.GLU_WIDE_CONFIGS[9], gk.WIDE_CONFIGS[9])):
        assert glu.smem_bytes() == plain.smem_bytes()  # a stage holds the gate box and the up box
        assert glu.out_n == plain.BLOCK_N // 2 and glu.out_n % glu.EPILOGUE_N == 0
        assert glu.smem_bytes() + glu.epilogue_bytes() <= common.SMEM_LIMIT
        assert glu.table()["glu"] == "swiglu" and "glu" not in plain.table()
    assert gk.config_for((9, 0), gk.WIDE_N - 2, glu=True) is gk.GLU_CONFIGS[9]
    assert gk.config_for((9, 0), gk.WIDE_N, glu=True) is gk.GLU_WIDE_CONFIGS[9]
    with pytest.raises(ValueError, match=r"EPILOGUE_N \(128\) must divide the output tile's 64 columns"):
        replace(gk.CONFIGS[9], GLU=1)
    with pytest.raises(ValueError, match="16-bit operands, not fp8"):
        replace(gk.FP8_CONFIGS[9], GLU=1, EPILOGUE_N=64)
    with pytest.raises(ValueError, match="GLU is one of"):
        replace(gk.CONFIGS[9], GLU=2)


def test_glu_specs_for_hopper_16_bit_only():
    specs = gk.compile_specs((9, 0), "bfloat16", glu=True)
    assert [s.kernel for s in specs] == [
        "grouped_kernel 128x128x64 swiglu s4 w8 E<=512 B=t",
        "grouped_kernel 128x256x64 swiglu s4 w8 E<=512 B=t",
    ]
    for spec in specs:
        assert spec.constexprs["GLU"] == 1 and spec.constexprs["SCALING"] == 0
        assert spec.signature["b_desc"] == gk.desc_signature([spec.config.out_n, 64], "bfloat16")
    assert all(s.constexprs["GLU"] == 0 for s in gk.compile_specs((9, 0), "bfloat16"))
    assert gk.compile_specs((9, 0), "float8_e4m3fn", glu=True) == []
    assert gk.compile_specs((10, 0), "bfloat16", glu=True) == []


def test_the_kernels_prepare_refuses_a_config_that_disagrees_with_glu():
    with FakeTensorMode():
        x, w, offs = _operands(device="cuda")
        with pytest.raises(ValueError, match="is a fused-SwiGLU config; this launch is not one"):
            gk.prepare(x, w, offs, torch.empty(32, 48, dtype=BF16, device="cuda"), H100, gk.GLU_CONFIGS[9])
        with pytest.raises(ValueError, match="is no fused-SwiGLU config; this launch is one"):
            gk.prepare(
                x, w, offs, torch.empty(32, 24, dtype=BF16, device="cuda"), H100, gk.CONFIGS[9], glu=True
            )


def test_the_package_exports_grouped_swiglu_lazily():
    assert gluon_survey.grouped_swiglu is gg.grouped_swiglu
    assert "grouped_swiglu" in gluon_survey.__all__
