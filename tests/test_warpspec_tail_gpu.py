"""warpspec's tail split on a GPU: the ping-pong tiles (192 and 128 rows) with TAIL on, launched
on fewer programs than the GPU has SMs (7 and 16) so that small ragged problems have several whole
waves and a partial one, with TAIL_MIN_STEPS 1 so that their tail tiles are cut into many slices
(uneven ones: K tails), against the fp32 reference: fp16, bf16, fp8 per tensor and row-wise, with
and without a bias, into NaN-poisoned outputs; the same launch three times on fresh operands (every
tile counter back at 0) and replayed in a CUDA graph. Run on the GPU machine: pytest -m gpu."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gluon_survey import api
from gluon_survey.kernels import warpspec
from gluon_survey.launch import Scales
from gpu_checks import assert_close_to_reference, captured
from test_fp8_gpu import assert_close, fp8_inputs

pytestmark = pytest.mark.gpu

# M, N, K: ragged in all three (16-bit K = 1000: 15 steps of 64 and 40 more; fp8 K = 1040: 8 of
# 128 and 16 more), one tile row of M, and a problem with fewer tiles than programs.
SHAPES = [(300, 1000, 1000), (1000, 3000, 1040), (65, 520, 528), (1, 264, 2064)]
PROGRAMS = [7, 16]


@pytest.fixture(autouse=True)
def _needs_hopper(monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("warpspec's ping-pong is sm_90's")
    monkeypatch.setattr(warpspec, "TAIL_MIN_STEPS", 1)


def _configs(fp8: bool):
    if fp8:
        return [
            dataclasses.replace(cfg, TAIL=True) for cfg in (warpspec.PINGPONG_FP8, warpspec.PINGPONG_FP8_MID)
        ]
    return [dataclasses.replace(cfg, TAIL=True) for cfg in (warpspec.PINGPONG, warpspec.PINGPONG_MID)]


def _target(a, programs):
    return dataclasses.replace(api.target_of(a.device), sm_count=programs)


@pytest.mark.parametrize("programs", PROGRAMS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_tail_slices_sum_to_the_product(dtype, shape, programs):
    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(M + N + programs)
    for cfg in _configs(fp8=False):
        a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
        b = torch.randn(N, K, device="cuda", dtype=dtype, generator=g).t()
        out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
        launch = warpspec.prepare(a, b, out, _target(a, programs), cfg)
        tiles = -(-M // cfg.a_rows) * -(-N // cfg.BLOCK_N)
        split = launch.config.get("tail_split", 1)
        assert (split > 1) == (tiles % programs > 0 and programs // (tiles % programs) > 1), launch.config
        for _ in range(3):
            a.copy_(torch.randn(M, K, device="cuda", dtype=dtype, generator=g))
            out.fill_(float("nan"))
            launch.fn()
            torch.cuda.synchronize()
            assert_close_to_reference(out, a, b)
        graph, _ = captured(launch.fn)
        a.mul_(-0.5)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_reference(out, a, b)


@pytest.mark.parametrize("programs", PROGRAMS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_fp8_tail_slices_scale_the_sum(scaling, shape, programs):
    M, N, K = shape
    K = -(-K // 16) * 16  # fp8 rows of 16 bytes
    for j, cfg in enumerate(_configs(fp8=True)):
        a, b, sa, sb = fp8_inputs(M, N, K, scaling, seed=M + programs + j)
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        scales = Scales(sa.reshape(-1), sb.reshape(-1), scaling)
        launch = warpspec.prepare(a, b, out, _target(a, programs), cfg, scales=scales)
        for i in range(3):
            new_a, _, new_sa, _ = fp8_inputs(M, N, K, scaling, seed=100 * i + j)
            a.copy_(new_a)
            sa.copy_(new_sa * (i + 1))  # the sum is scaled with the scales of this launch
            out.fill_(float("nan"))
            launch.fn()
            torch.cuda.synchronize()
            assert_close(out, a, b, sa, sb)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_tail_tile_adds_the_bias_once(dtype):
    """The bias is added to a tail tile's sum, never to a slice's partial."""
    M, N, K = 1000, 3000, 1000
    g = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(N, K, device="cuda", dtype=dtype, generator=g).t()
    bias = torch.randn(N, device="cuda", dtype=dtype, generator=g)
    for cfg in _configs(fp8=False):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
        launch = warpspec.prepare(a, b, out, _target(a, 16), cfg, bias=bias)
        assert launch.config["tail_split"] > 1
        launch.fn()
        torch.cuda.synchronize()
        ref = a.float() @ b.float() + bias.float()
        err = (out.float() - ref).norm() / ref.norm()
        cublas = (torch.addmm(bias, a, b).float() - ref).norm() / ref.norm()
        assert not torch.isnan(out).any() and err <= 2 * cublas + 2.0**-10, (err, cublas)
