"""grouped_swiglu on a Hopper GPU: the 128-row grouped kernel with SwiGLU fused into its epilogue
(GLU 1; not yet run on a GPU). Every expert's rows against the fp32 reference, silu(h[:, :I]) *
h[:, I:] of the fp32 product h = x[rows] @ w[e] (gate = the first I channels, up = the last I, as
transformers splits gate_up_proj), with the driver's rule (`driver.check.tolerance`) and as
yardstick the same gate on cuBLAS's 16-bit h; on NaN-poisoned outputs, so a row left unwritten
shows, and the rows at or past offs[-1] must stay NaN. Cases: empty experts, S = 1, ragged S, I
and K (I not a multiple of the tile's 64 or 128 output columns: the gate box's last rows run into
the up rows and the up box's into the next expert's gate rows, columns the epilogue does not
store), both GLU tiles (2I below and from WIDE_N on) each alone on the same problems, fp16 and
bf16, far more tiles than SMs with a skew, a CUDA graph replayed with other offsets, gates large
enough to saturate silu both ways, and the errors of bad arguments.
Run on the GPU machine: pytest -m gpu tests/test_grouped_swiglu_gpu.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gluon_survey import api
from gluon_survey import grouped as gg
from gluon_survey.kernels import grouped as gk
from gpu_checks import assert_each_expert

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("hopper_only")]

DTYPES = [torch.float16, torch.bfloat16]


def _problem(counts, K, I, dtype, S=None, seed=0, scale=None):
    """x [S, K], w the [E, K, 2I] transpose view of a contiguous [E, 2I, K] gate_up weight (scaled
    by `scale`, K ** -0.5 by default, so the gates sit where silu bends), offs on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    S = sum(counts) if S is None else S
    x = torch.randn(S, K, device="cuda", generator=g).to(dtype)
    w = torch.randn(len(counts), 2 * I, K, device="cuda", generator=g) * (K**-0.5 if scale is None else scale)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    return x, w.to(dtype).transpose(1, 2), offs


def _gate(h: torch.Tensor) -> torch.Tensor:
    I = h.shape[1] // 2
    return F.silu(h[:, :I].float()) * h[:, I:].float()


def _assert_swiglu(out, x, w, counts, what=""):
    """Each expert's rows within tolerance of the gate of its fp32 product, the unfused path's
    (cuBLAS, then the gate, rounded to x's dtype) error the yardstick; rows past offs[-1] NaN."""

    def expected(e, start, end):
        a, b = x[start:end], w[e]
        return _gate(a.float() @ b.float()), _gate(a @ b).to(x.dtype)

    assert_each_expert(out, counts, x.dtype, expected, what)


def _zipf_counts(E, S):
    weights = [0.0 if e % 9 == 4 else (e + 1) ** -1.1 for e in range(E)]
    counts = [int(S * w / sum(weights)) for w in weights]
    counts[0] += S - sum(counts)
    return counts


CASES = [
    pytest.param([0, 100, 0, 37, 0, 0, 250, 0], 256, 192, id="empty-experts"),
    pytest.param([0, 1, 0, 0], 64, 64, id="S1"),
    pytest.param([517], 200, 150, id="E1-ragged"),  # I = 150: a partial tile of 22 (or 86) columns
    pytest.param([3, 0, 129, 17, 40, 0, 2, 300], 520, 300, id="E8-ragged-long-k"),
    pytest.param([1000, 3, 24], 1024, 136, id="long-k-many-row-tiles"),
    pytest.param([0, 0, 0], 64, 64, id="all-empty"),
    pytest.param(_zipf_counts(128, 8192), 512, 1060, id="E128-zipf-wide"),  # 2I = 2120 >= WIDE_N
    pytest.param(_zipf_counts(64, 4096), 256, 768, id="E64-zipf-narrow"),  # Qwen3-30B-A3B's I
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("counts", "K", "I"), CASES)
def test_every_expert_matches_the_fp32_gate_of_its_product(counts, K, I, dtype):
    S = sum(counts) + 5  # rows past offs[-1]: never written
    x, w, offs = _problem(counts, K, I, dtype, S=S)
    out = torch.full((S, I), float("nan"), device="cuda", dtype=dtype)
    assert gg.grouped_swiglu(x, w, offs, out=out) is out
    _assert_swiglu(out, x, w, counts, f"{counts} K={K} I={I}")


@pytest.mark.parametrize("configs", [gk.GLU_CONFIGS, gk.GLU_WIDE_CONFIGS], ids=["128x128", "128x256"])
@pytest.mark.parametrize(("counts", "K", "I"), [CASES[2], CASES[3], CASES[7]])
def test_each_glu_tile_on_the_same_problems(counts, K, I, configs):
    S = sum(counts) + 3
    x, w, offs = _problem(counts, K, I, torch.bfloat16, S=S, seed=1)
    out = torch.full((S, I), float("nan"), device="cuda", dtype=x.dtype)
    gk.prepare(x, w, offs, out, api.target_of(x.device), configs[9], glu=True).fn()
    _assert_swiglu(out, x, w, counts, f"{configs[9].label} {counts}")


def test_saturated_gates_both_ways():
    """Weights 32x larger: gates of a hundred either way, where silu is 0 (past -88 exp(-gate)
    overflows to inf in the kernel's gate * up / (1 + exp(-gate))) or the gate itself."""
    counts = [64, 200, 0, 33]
    x, w, offs = _problem(counts, 256, 192, torch.bfloat16, S=sum(counts), scale=32 * 256**-0.5)
    out = torch.full((sum(counts), 192), float("nan"), device="cuda", dtype=x.dtype)
    gg.grouped_swiglu(x, w, offs, out=out)
    _assert_swiglu(out, x, w, counts, "saturated")


def test_an_allocated_output_and_an_empty_one():
    counts = [64, 0, 129]
    x, w, offs = _problem(counts, 128, 96, torch.float16)
    out = gg.grouped_swiglu(x, w, offs)
    assert out.shape == (193, 96) and out.dtype == torch.float16 and out.is_contiguous()
    _assert_swiglu(out, x, w, counts)
    x, w, offs = _problem([0, 0], 64, 48, torch.bfloat16)
    assert gg.grouped_swiglu(x, w, offs).shape == (0, 48)


def test_a_cuda_graph_replays_with_other_offsets():
    E, S, K, I = 64, 2048, 256, 384
    routings = [_zipf_counts(E, S), _zipf_counts(E, S)[::-1], [S] + [0] * (E - 1), [S // E] * E]
    x, w, offs = _problem(routings[0], K, I, torch.bfloat16)
    out = torch.full((S, I), float("nan"), device="cuda", dtype=x.dtype)
    gg.grouped_swiglu(x, w, offs, out=out)  # warm-up: compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gg.grouped_swiglu(x, w, offs, out=out)
    for counts in routings:
        offs.copy_(torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        _assert_swiglu(out, x, w, counts, f"replay {counts[:4]}")


def test_bad_arguments_on_the_gpu():
    x, w, offs = _problem([8, 8], 64, 32, torch.float16)
    with pytest.raises(ValueError, match=r"out has shape \(16, 64\), expected \(16, 32\)"):
        gg.grouped_swiglu(x, w, offs, out=torch.empty(16, 64, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="odd"):
        gg.grouped_swiglu(x, torch.empty(2, 63, 64, device="cuda", dtype=torch.float16).transpose(1, 2), offs)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        gg.grouped_swiglu(x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn), offs)
    unaligned = torch.empty(16 * 64 + 1, device="cuda", dtype=torch.float16)[1:].view(16, 64)
    with pytest.raises(ValueError, match="16-byte aligned"):
        gg.grouped_swiglu(unaligned, w, offs)
