"""grouped_matmul and its two kernels on a Hopper GPU: the 128-row kernel (`grouped`: its first
version and its compact schedule passed these on an H100) and the swap-AB kernel
(`grouped-swapab`: its 16-bit cases passed on an H100), each case through each kernel alone and
through grouped_matmul (which picks one by S). Every expert's rows are checked against the fp32
product of its inputs with the driver's rule (`driver.check.tolerance`, cuBLAS's error on the
same expert as the yardstick), on NaN-poisoned outputs: a row of an expert left unwritten shows
as NaN, and the rows at or past offs[-1], which no expert owns, must still be NaN (nothing writes
outside its expert).
Cases: empty experts, one expert with every token, S = 1, ragged S/N/K tails, E = 1 to 300 (the
offsets' table padded to 32, 64, 128 and 512 entries), a Zipf-like skew over 128 experts with
empty ones and far more tiles than SMs on both tiles (128 and 256 wide: N >= 2048), one expert
whose 67 row tiles make five tile-order groups (the last partial), one-K-step tiles (the loads
run ahead across tiles), fp16 and bf16, CUDA-graph captures replayed with other offsets in the
same buffer (the tile count changes between replays), and the errors of bad arguments. For the
swap-AB kernel also: decode routings (one or two rows an expert over 128 experts, Mixtral down at
one token), an expert with many more rows than the token tile (several chunk tiles) beside
one-row experts, K and N tails on long K, and every token tile (16, 32, 64) on the same problems.
The gemv kernel for one token (`grouped-gemv`, 16-bit; passed on an H200 at 47cac1b) takes every
16-bit case, the captures and the bad offsets too: it is correct at any S, only slow at many.

fp8 e4m3 with row-wise scales (scale_x [S], scale_w [E, N]; the 128-row kernel's cases passed on
an H100, the swap-AB kernel's fp8 path is not yet run on a GPU): each expert's rows against the
fp32 product of the upcast operands times their scales, with cuBLAS fp8 (torch._scaled_mm per
expert, padded to its multiples of 16) as the yardstick, on NaN-poisoned outputs, through each
kernel alone and through grouped_matmul: empty experts, S = 1, ragged S and N (K a multiple of
16), both tiles of the 128-row kernel, E up to 300, the decode routings above (for the swap-AB
kernel: every token tile, an expert of many chunk tiles), bf16 and fp16 outputs, either side of
the choice by S, CUDA graphs (a prefill and a decode size) replayed with other offsets and other
scale values in the same buffers, and torch._scaled_grouped_mm on the same inputs within the same
bound.
Both kernels and grouped_matmul also at S = 0 (16-bit and fp8) and K = 0; and offsets whose
values are wrong (past S, decreasing, negative), which the kernels clamp: nothing read or written
past S or outside the experts the clamped offsets give, and `check_offsets` naming each.
Run on the GPU machine: pytest -m gpu tests/test_grouped_gpu.py."""

from __future__ import annotations

import pytest
import torch

from gluon_survey import api, grouped_auto
from gluon_survey import grouped as gg
from gluon_survey.driver.check import quantize, rel_error, tolerance
from gluon_survey.kernels import grouped_swapab as gs
from gluon_survey.launch import Scales
from gpu_checks import assert_each_expert, cublas_fp8

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("hopper_only")]

DTYPES = [torch.float16, torch.bfloat16]
# None: grouped_matmul (the 128-row or the swap-AB kernel, by S); else that kernel alone, at any S.
MODES = [None, "grouped", "grouped-swapab"]
# and the 16-bit-only kernel for one token (grouped-gemv), which takes any S all the same
SIXTEEN_BIT_MODES = [*MODES, "grouped-gemv"]


def _run(mode, x, w, offs, out):
    """out through grouped_matmul (mode None) or the grouped mode `mode`."""
    if mode is None:
        assert gg.grouped_matmul(x, w, offs, out=out) is out
    else:
        gg.prepare(mode, x, w, offs, out).fn()


def _problem(counts, K, N, dtype, seed=0, S=None):
    """x [S, K] (S = sum(counts) unless given larger), w the [E, K, N] transpose view of a
    contiguous [E, N, K], offs the int32 cumulative ends on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    S = sum(counts) if S is None else S
    x = torch.randn(S, K, device="cuda", generator=g).to(dtype)
    w = torch.randn(len(counts), N, K, device="cuda", generator=g).to(dtype).transpose(1, 2)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    return x, w, offs


def _nan(S, N, dtype):
    return torch.full((S, N), float("nan"), device="cuda", dtype=dtype)


def _assert_grouped(out, x, w, counts, what=""):
    """Each expert's rows within tolerance of its fp32 product, cuBLAS on the same rows the
    yardstick; the rows past the last expert's end still NaN."""

    def expected(e, start, end):
        a, b = x[start:end], w[e]
        return a.float() @ b.float(), a @ b

    assert_each_expert(out, counts, x.dtype, expected, what)


def _random_counts(E, S, seed):
    g = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randint(0, S + 1, (E - 1,), generator=g)).values.tolist()
    edges = [0, *cuts, S]
    return [edges[i + 1] - edges[i] for i in range(E)]


def _zipf_counts(E, S, empty_every=9):
    """A Zipf-like routing of S rows over E experts (expert e's share ~ 1 / (e + 1)^1.1, so expert 0
    has ~ a fifth of them), every `empty_every`-th expert from the 5th on empty."""
    weights = [0.0 if e % empty_every == 4 else (e + 1) ** -1.1 for e in range(E)]
    counts = [int(S * w / sum(weights)) for w in weights]
    counts[0] += S - sum(counts)
    return counts


CASES = [
    pytest.param([0, 100, 0, 37, 0, 0, 250, 0], 256, 384, id="empty-experts"),
    pytest.param([0, 0, 0, 300, 0, 0, 0, 0], 256, 256, id="one-expert-every-token"),
    pytest.param([0, 1, 0, 0], 64, 64, id="S1"),
    pytest.param([1], 64, 64, id="E1-S1"),
    pytest.param([517], 200, 300, id="E1-ragged"),
    pytest.param(_random_counts(8, 517, 1), 200, 300, id="E8-ragged"),
    pytest.param(_random_counts(64, 2048, 2), 512, 256, id="E64"),
    pytest.param([1000, 3, 24], 1024, 136, id="long-k-many-row-tiles"),  # 16 K steps: the ring wraps
    pytest.param([0, 0, 0], 64, 64, id="all-empty"),
    # Far more tiles than SMs, skewed: 1809 tiles of 128x256 (N >= 2048, ragged N, not a multiple of
    # 16: scalar stores), 603 of 128x128 (ragged K); expert 0 has 32 row tiles, two tile-order groups.
    pytest.param(_zipf_counts(128, 16384), 512, 2120, id="E128-zipf-wide-tile"),
    pytest.param(_zipf_counts(128, 16384), 200, 384, id="E128-zipf-narrow-tile"),
    pytest.param(_zipf_counts(128, 8192), 256, 2048, id="E128-zipf-wide-aligned-n"),
    pytest.param([0] * 5 + [8500] + [0] * 2, 256, 256, id="one-expert-67-row-tiles"),  # groups 16, .., 3
    pytest.param(_random_counts(16, 4096, 3), 64, 256, id="one-k-step-many-tiles"),
    pytest.param(_random_counts(300, 3000, 4), 128, 136, id="E300"),
    pytest.param(_random_counts(33, 1000, 5), 128, 136, id="E33"),
    # Decode: one or two rows an expert (Qwen3-30B-A3B gate_up at 16 tokens, 96 of 128 experts).
    pytest.param([1] * 64 + [2] * 32 + [0] * 32, 2048, 1536, id="E128-decode"),
    pytest.param([0, 0, 0, 1, 0, 0, 1, 0], 14336, 4096, id="mixtral-down-one-token"),  # 128 tiles of 64 rows
    # 150 rows in one expert beside one-row ones: a 16-row token tile (2 rows an expert on
    # average), so that expert is 10 chunk tiles a weight block, the last one partial.
    pytest.param([150] + [1] * 50 + [0] * 77, 256, 320, id="E128-one-big-expert"),
    pytest.param(_random_counts(16, 40, 6), 2056, 1544, id="decode-k-and-n-tails"),  # K: 8 steps + 8
]


@pytest.mark.parametrize("mode", SIXTEEN_BIT_MODES, ids=lambda m: m or "grouped_matmul")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("counts", "K", "N"), CASES)
def test_every_expert_matches_its_fp32_product(counts, K, N, dtype, mode):
    S = sum(counts) + 5  # 5 rows past offs[-1], owned by no expert: never written
    x, w, offs = _problem(counts, K, N, dtype, S=S)
    out = _nan(S, N, dtype)
    _run(mode, x, w, offs, out)
    _assert_grouped(out, x, w, counts, f"{mode} {counts} K={K} N={N}")


SWAPAB_CASES = [
    pytest.param([0, 1, 0, 0], 64, 64, id="S1"),
    pytest.param([3, 0, 100, 17, 0, 40], 520, 200, id="ragged"),
    pytest.param([150] + [1] * 50 + [0] * 77, 256, 320, id="E128-one-big-expert"),
    pytest.param([0, 0, 300, 0], 128, 136, id="one-expert-every-row"),
]


@pytest.mark.parametrize("width", gs.TOKENS)
@pytest.mark.parametrize(("counts", "K", "N"), SWAPAB_CASES)
def test_every_token_tile_of_the_swap_ab_kernel(counts, K, N, width):
    """Each config of the swap-AB kernel on the same problems, whatever the rows would pick."""
    S = sum(counts) + 3
    x, w, offs = _problem(counts, K, N, torch.bfloat16, S=S, seed=width)
    out = _nan(S, N, x.dtype)
    cfg = gs.CONFIGS[9][width]
    gs.prepare(x, w, offs, out, api.target_of(x.device), cfg).fn()
    _assert_grouped(out, x, w, counts, f"T{width} {counts} K={K} N={N}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("S", [grouped_auto.DECODE_ROWS, grouped_auto.DECODE_ROWS + 1])
def test_grouped_matmul_on_either_side_of_the_choice(S, dtype):
    counts = _random_counts(64, S, S)
    x, w, offs = _problem(counts, 256, 384, dtype)
    expected = "grouped-swapab" if S <= grouped_auto.DECODE_ROWS else "grouped"
    assert gg.prepare("grouped-auto", x, w, offs).config["mode"] == expected
    out = _nan(S, 384, dtype)
    _run(None, x, w, offs, out)
    _assert_grouped(out, x, w, counts, f"S={S}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_an_allocated_output(dtype):
    counts = [64, 0, 129]
    x, w, offs = _problem(counts, 128, 192, dtype)
    out = gg.grouped_matmul(x, w, offs)
    assert out.shape == (193, 192) and out.dtype == dtype and out.is_contiguous()
    _assert_grouped(out, x, w, counts)


def test_empty_x_gives_an_empty_output():
    x, w, offs = _problem([0, 0], 64, 96, torch.bfloat16)
    out = gg.grouped_matmul(x, w, offs)
    assert out.shape == (0, 96)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_s_0_and_k_0_in_every_grouped_kernel(fp8):
    """S = 0: an empty output, given or allocated, through grouped_matmul and each grouped mode's
    launch, 16-bit and fp8; K = 0 (bf16): every row of a NaN-poisoned output zero (the empty sum),
    rows no expert owns too."""
    if fp8:
        x, w, offs, scale_x, scale_w = _fp8_problem([0, 0], 64, 96)
        scales = {"scale_x": scale_x, "scale_w": scale_w}
    else:
        (x, w, offs), scales = _problem([0, 0], 64, 96, torch.bfloat16), {}
    given = torch.empty(0, 96, device="cuda", dtype=torch.bfloat16)
    assert gg.grouped_matmul(x, w, offs, out=given, **scales) is given
    assert gg.grouped_matmul(x, w, offs, **scales).shape == (0, 96)
    for mode in ("grouped", "grouped-swapab", "grouped-auto") + (() if fp8 else ("grouped-gemv",)):
        gg.prepare(mode, x, w, offs, given, **scales).fn()
    if not fp8:
        x = torch.empty(7, 0, device="cuda", dtype=torch.bfloat16)
        w = torch.empty(2, 96, 0, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        offs = torch.tensor([3, 5], device="cuda", dtype=torch.int32)
        out = _nan(7, 96, torch.bfloat16)
        assert gg.grouped_matmul(x, w, offs, out=out) is out
        assert torch.equal(out, torch.zeros_like(out))


# Offsets whose values are wrong, which grouped_matmul cannot check without a host sync: the
# kernels clamp each offset to [0, S] and take a decreasing pair for an empty expert (module
# docstring of gluon_survey/grouped.py); `check_offsets` names each. S = 8 rows. Each case: the
# offsets, (expert, first row, end) of the rows written, and check_offsets' complaint.
BAD_OFFSETS = [
    pytest.param([3, 100], [(0, 0, 3), (1, 3, 8)], r"offs\[-1\] is 100 but x has 8 rows", id="past-s"),
    pytest.param([5, 2, 2], [(0, 0, 5)], "never decrease", id="decreasing"),
    pytest.param([-4, 5, 5], [(1, 0, 5)], "never negative", id="negative"),
]


@pytest.mark.parametrize(
    ("mode", "fp8"),
    [(m, fp8) for m in ("grouped", "grouped-swapab") for fp8 in (False, True)] + [("grouped-gemv", False)],
    ids=lambda v: {False: "bf16", True: "fp8"}.get(v, v) if isinstance(v, bool) else v,
)
@pytest.mark.parametrize(("ends", "written", "complaint"), BAD_OFFSETS)
def test_offsets_out_of_range_are_clamped_and_write_nothing_outside(ends, written, complaint, mode, fp8):
    """x and out are the first 8 rows of larger buffers: the rows past them stay NaN (nothing is
    read or written past S), the experts the clamped offsets give get their products, and every
    other row of out stays NaN."""
    S, K, N, E = 8, 64, 96, len(ends)
    counts = [1] * E  # only for the operands' shapes; the offsets are `ends`
    if fp8:
        x_big, w, _, scale_big, scale_w = _fp8_problem(counts, K, N, S=S + 8)
        scale_x = scale_big[:S]
        scales = {"scale_x": scale_x, "scale_w": scale_w}
    else:
        x_big, w, _ = _problem(counts, K, N, torch.bfloat16, S=S + 8)
        scales = {}
    x = x_big[:S]
    offs = torch.tensor(ends, device="cuda", dtype=torch.int32)
    out_big = _nan(S + 8, N, torch.bfloat16)
    out = out_big[:S]
    gg.prepare(mode, x, w, offs, out, **scales).fn()
    torch.cuda.synchronize()
    owned = torch.zeros(S, dtype=torch.bool)
    for e, start, end in written:
        rows = out[start:end]
        if fp8:
            ref = _dequantized(x, w, scale_x, scale_w, e, start, end)
            sa, sb = scale_x[start:end].clone().view(-1, 1), scale_w[e].clone().view(1, -1)
            cublas = cublas_fp8(x[start:end], w[e], sa, sb)
            dtype = "fp8-row"
        else:
            ref = x[start:end].float() @ w[e].float()
            cublas, dtype = x[start:end] @ w[e], torch.bfloat16
        err, cublas_err = rel_error(rows, ref), rel_error(cublas, ref)
        assert err <= tolerance(cublas_err, dtype), f"{ends}: expert {e}: {err:.3e} vs {cublas_err:.3e}"
        owned[start:end] = True
    assert torch.isnan(out[~owned.cuda()]).all(), f"{ends}: rows of no clamped expert were written"
    assert torch.isnan(out_big[S:]).all(), f"{ends}: rows past S were written"
    with pytest.raises(ValueError, match=complaint):
        gg.check_offsets(offs, rows=S)


@pytest.mark.parametrize("mode", SIXTEEN_BIT_MODES, ids=lambda m: m or "grouped_matmul")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("S", "K", "N", "E"),
    [(384, 256, 320, 8), (4096, 128, 2048, 128), (128, 512, 1536, 128)],
    ids=["E8", "E128", "E128-decode"],
)
def test_a_cuda_graph_replays_with_other_offsets(S, K, N, E, dtype, mode):
    """The offsets are read on the device: one capture serves every routing of S tokens, though
    the number of tiles, and so each program's share, changes from one to the next (for the
    swap-AB kernel: one expert with every row is S / BLOCK_T chunk tiles a weight block)."""
    routings = [_random_counts(E, S, seed) for seed in range(4)] + [[S] + [0] * (E - 1), [0] * (E - 1) + [S]]
    routings += [_zipf_counts(E, S), _zipf_counts(E, S)[::-1]]
    x, w, offs = _problem(routings[0], K, N, dtype)
    out = _nan(S, N, dtype)
    _run(mode, x, w, offs, out)  # warm-up: compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run(mode, x, w, offs, out)
    for counts in routings:
        offs.copy_(torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        _assert_grouped(out, x, w, counts, f"{mode} replay {counts}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("S", [48, 1000], ids=["swap-ab", "128-row"])
def test_calls_of_one_problem_run_its_plan_on_each_calls_own_tensors(S, dtype):
    """grouped_matmul plans a problem once: later calls launch that plan on their own tokens,
    weights (another layer's), offsets and outputs, as a model's layers do, the descriptors
    encoded once per address (the first layer again: its encodings are reused)."""
    E, K, N = 8, 256, 320
    layers = []
    for seed in range(3):
        counts = _random_counts(E, S, seed)
        layers.append((counts, *_problem(counts, K, N, dtype, seed=seed)))
    for i, (counts, x, w, offs) in enumerate([*layers, layers[0]]):
        out = _nan(S, N, dtype)
        assert gg.grouped_matmul(x, w, offs, out=out) is out
        _assert_grouped(out, x, w, counts, f"call {i}")


@pytest.mark.parametrize("S", [48, 1000], ids=["swap-ab", "128-row"])
def test_offsets_off_a_16_byte_boundary_get_a_plan_of_their_own(S):
    """Triton compiles a kernel for its pointers' alignment: offsets that are a view 4 bytes into
    a buffer, after a call with aligned ones of the same problem, must not run the aligned plan."""
    E, K, N = 8, 256, 320
    counts = _random_counts(E, S, 7)
    x, w, offs = _problem(counts, K, N, torch.bfloat16, seed=7)
    buffer = torch.zeros(E + 1, dtype=torch.int32, device="cuda")
    buffer[1:] = offs
    shifted = buffer[1:]  # 4 bytes past a 16-byte boundary
    assert shifted.data_ptr() % 16 == 4
    for i, o in enumerate((offs, shifted, offs)):
        out = _nan(S, N, torch.bfloat16)
        gg.grouped_matmul(x, w, o, out=out)
        _assert_grouped(out, x, w, counts, f"call {i}")


def test_bad_arguments_on_the_gpu():
    x, w, offs = _problem([8, 8], 64, 32, torch.float16)
    with pytest.raises(ValueError, match="offs has 3 entries but w has 2 experts"):
        gg.grouped_matmul(x, w, torch.tensor([4, 8, 16], dtype=torch.int32, device="cuda"))
    with pytest.raises(TypeError, match="int32"):
        gg.grouped_matmul(x, w, offs.long())
    with pytest.raises(ValueError, match="contiguous"):
        gg.grouped_matmul(x, w.contiguous(), offs)
    with pytest.raises(ValueError, match="must equal K"):
        gg.grouped_matmul(x[:, :56].contiguous(), w, offs)
    with pytest.raises(TypeError, match="same dtype"):
        gg.grouped_matmul(x, w.bfloat16(), offs)
    with pytest.raises(ValueError, match="out has shape"):
        gg.grouped_matmul(x, w, offs, out=_nan(16, 33, torch.float16))
    with pytest.raises(ValueError, match="offs is on cpu"):
        gg.grouped_matmul(x, w, torch.tensor([8, 16], dtype=torch.int32))
    unaligned = torch.empty(16 * 64 + 1, device="cuda", dtype=torch.float16)[1:].view(16, 64)
    with pytest.raises(ValueError, match="16-byte aligned"):
        gg.grouped_matmul(unaligned, w, offs)


def test_check_offsets_reads_device_offsets():
    gg.check_offsets(torch.tensor([0, 4, 4, 9], dtype=torch.int32, device="cuda"), rows=9)
    with pytest.raises(ValueError, match="never decrease"):
        gg.check_offsets(torch.tensor([4, 2], dtype=torch.int32, device="cuda"))


# --------------------------------------------------------------------------------------------------
# fp8 e4m3 operands, row-wise scales

FP8 = torch.float8_e4m3fn


def _fp8_problem(counts, K, N, seed=0, S=None):
    """x [S, K] and the experts' [E, N, K] weights drawn in fp32 and quantized row-wise (the driver's
    `quantize`: each token and each expert's output channel its own scale), w the [E, K, N]
    transpose view, scale_x [S], scale_w [E, N], offs the int32 cumulative ends."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    S = sum(counts) if S is None else S
    x, scale_x = quantize(torch.randn(S, K, device="cuda", generator=g), rowwise=True)
    E = len(counts)
    w = torch.empty(E, N, K, dtype=FP8, device="cuda")
    scale_w = torch.empty(E, N, device="cuda")
    for e in range(E):
        w[e], scale = quantize(torch.randn(N, K, device="cuda", generator=g) * 0.5, rowwise=True)
        scale_w[e] = scale.view(-1)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    return x, w.transpose(1, 2), offs, scale_x.view(-1).contiguous(), scale_w


def _dequantized(x, w, scale_x, scale_w, e, start, end):
    """Expert e's exact product of its rows, fp32 (TF32 off), times its token and channel scales."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return (x[start:end].float() @ w[e].float()) * scale_x[start:end, None] * scale_w[e]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _assert_fp8_grouped(out, x, w, scale_x, scale_w, counts, what=""):
    """Each expert's rows within the driver's tolerance of its dequantized fp32 product, cuBLAS fp8
    on the same expert (scales copied into buffers of their own) the yardstick; the rows past the
    last expert's end still NaN."""

    def expected(e, start, end):
        sa = scale_x[start:end].clone().view(-1, 1)
        cublas = cublas_fp8(x[start:end], w[e], sa, scale_w[e].clone().view(1, -1))
        return _dequantized(x, w, scale_x, scale_w, e, start, end), cublas

    assert_each_expert(out, counts, "fp8-row", expected, what)


def _run_fp8(mode, x, w, offs, out, scale_x, scale_w):
    """out through grouped_matmul (mode None) or the grouped mode `mode`, fp8 with its scales."""
    scales = {"scale_x": scale_x, "scale_w": scale_w}
    if mode is None:
        assert gg.grouped_matmul(x, w, offs, out=out, **scales) is out
    else:
        gg.prepare(mode, x, w, offs, out, **scales).fn()


FP8_CASES = [
    pytest.param([0, 100, 0, 37, 0, 0, 250, 0], 256, 384, id="empty-experts"),
    pytest.param([0, 1, 0, 0], 64, 64, id="S1"),
    pytest.param([1], 64, 64, id="E1-S1"),
    pytest.param([517], 208, 300, id="E1-ragged"),  # ragged N (not a multiple of 16), K tail in the last step
    pytest.param(_random_counts(8, 517, 1), 208, 300, id="E8-ragged"),
    pytest.param([1000, 3, 24], 1024, 136, id="long-k-many-row-tiles"),  # 8 K steps of 128: the ring wraps
    pytest.param([0, 0, 0], 64, 64, id="all-empty"),
    pytest.param(_zipf_counts(128, 16384), 512, 2120, id="E128-zipf-wide-tile"),  # 128x256, 64-column slices
    pytest.param(_zipf_counts(128, 8192), 256, 2048, id="E128-zipf-wide-aligned-n"),
    pytest.param(_zipf_counts(128, 16384), 208, 384, id="E128-zipf-narrow-tile"),
    pytest.param([0] * 5 + [8500] + [0] * 2, 256, 256, id="one-expert-67-row-tiles"),
    pytest.param(_random_counts(16, 4096, 3), 128, 256, id="one-k-step-many-tiles"),
    pytest.param(_random_counts(300, 3000, 4), 128, 136, id="E300"),
    # Decode, as in 16-bit: one or two rows an expert over 128 experts (8 K steps of 256), Mixtral
    # down at one token (56 K steps, 128 tiles), one expert of 10 chunk tiles beside one-row ones,
    # and K and N tails (K: 8 steps of 256 + 16)
    pytest.param([1] * 64 + [2] * 32 + [0] * 32, 2048, 1536, id="E128-decode"),
    pytest.param([0, 0, 0, 1, 0, 0, 1, 0], 14336, 4096, id="mixtral-down-one-token"),
    pytest.param([150] + [1] * 50 + [0] * 77, 256, 320, id="E128-one-big-expert"),
    pytest.param(_random_counts(16, 40, 6), 2064, 1544, id="decode-k-and-n-tails"),
]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m or "grouped_matmul")
@pytest.mark.parametrize(("counts", "K", "N"), FP8_CASES)
def test_fp8_every_expert_matches_its_dequantized_fp32_product(counts, K, N, mode):
    S = sum(counts) + 5  # 5 rows past offs[-1], owned by no expert: never written
    x, w, offs, scale_x, scale_w = _fp8_problem(counts, K, N, S=S)
    out = _nan(S, N, torch.bfloat16)
    _run_fp8(mode, x, w, offs, out, scale_x, scale_w)
    _assert_fp8_grouped(out, x, w, scale_x, scale_w, counts, f"{mode} {counts} K={K} N={N}")


FP8_SWAPAB_CASES = [
    pytest.param([0, 1, 0, 0], 64, 64, id="S1"),
    pytest.param([3, 0, 100, 17, 0, 40], 528, 200, id="ragged"),  # K: 2 steps of 256 + 16
    pytest.param([150] + [1] * 50 + [0] * 77, 256, 320, id="E128-one-big-expert"),
    pytest.param([0, 0, 300, 0], 128, 136, id="one-expert-every-row"),
]


@pytest.mark.parametrize("width", gs.TOKENS)
@pytest.mark.parametrize(("counts", "K", "N"), FP8_SWAPAB_CASES)
def test_fp8_every_token_tile_of_the_swap_ab_kernel(counts, K, N, width):
    """Each fp8 config of the swap-AB kernel on the same problems, whatever the rows would pick:
    the token scales along C's rows and the channel scales along its columns, after the transpose."""
    S = sum(counts) + 3
    x, w, offs, scale_x, scale_w = _fp8_problem(counts, K, N, S=S, seed=width)
    out = _nan(S, N, torch.bfloat16)
    cfg = gs.FP8_CONFIGS[9][width]
    gs.prepare(x, w, offs, out, api.target_of(x.device), cfg, scales=Scales(scale_x, scale_w, "row")).fn()
    _assert_fp8_grouped(out, x, w, scale_x, scale_w, counts, f"fp8 T{width} {counts} K={K} N={N}")


@pytest.mark.parametrize("S", [grouped_auto.DECODE_ROWS, grouped_auto.DECODE_ROWS + 1])
def test_fp8_grouped_matmul_on_either_side_of_the_choice(S, monkeypatch):
    monkeypatch.setattr(grouped_auto, "FP8_SWAPAB", True)  # the switch's own test
    counts = _random_counts(64, S, S)
    x, w, offs, scale_x, scale_w = _fp8_problem(counts, 256, 384)
    expected = "grouped-swapab" if S <= grouped_auto.DECODE_ROWS else "grouped"
    assert gg.prepare("grouped-auto", x, w, offs, scale_x=scale_x, scale_w=scale_w).config["mode"] == expected
    out = _nan(S, 384, torch.bfloat16)
    _run_fp8(None, x, w, offs, out, scale_x, scale_w)
    _assert_fp8_grouped(out, x, w, scale_x, scale_w, counts, f"fp8 S={S}")


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, torch.float16], ids=str)
def test_fp8_allocates_its_output_in_out_dtype(out_dtype):
    counts = [64, 0, 129]
    x, w, offs, scale_x, scale_w = _fp8_problem(counts, 128, 192)
    out = gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w, out_dtype=out_dtype)
    assert out.shape == (193, 192) and out.dtype == (out_dtype or torch.bfloat16) and out.is_contiguous()
    _assert_fp8_grouped(out.bfloat16(), x, w, scale_x, scale_w, counts)


@pytest.mark.parametrize(
    ("S", "K", "N", "E", "mode"),
    [(4096, 256, 2048, 128, "grouped"), (128, 512, 1536, 128, "grouped-swapab")],
    ids=["prefill", "decode"],
)
def test_fp8_a_cuda_graph_replays_with_other_offsets_and_other_scales(S, K, N, E, mode, monkeypatch):
    """The offsets and the scales are read on the device, from the caller's buffers: one capture
    serves every routing, and new scale values written into the same buffers are the ones used
    (through grouped_matmul: the 128-row kernel at 4096 token-slots, the swap-AB one at 128)."""
    monkeypatch.setattr(grouped_auto, "FP8_SWAPAB", True)
    routings = [_random_counts(E, S, seed) for seed in range(3)] + [[S] + [0] * (E - 1), _zipf_counts(E, S)]
    x, w, offs, scale_x, scale_w = _fp8_problem(routings[0], K, N)
    assert gg.prepare("grouped-auto", x, w, offs, scale_x=scale_x, scale_w=scale_w).config["mode"] == mode
    out = _nan(S, N, torch.bfloat16)
    gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w, out=out)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w, out=out)
    g = torch.Generator(device="cuda").manual_seed(7)
    for counts in routings:
        offs.copy_(torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32))
        scale_x.copy_(torch.rand(S, device="cuda", generator=g) * 0.02 + 0.001)
        scale_w.copy_(torch.rand(E, N, device="cuda", generator=g) * 0.02 + 0.001)
        out.fill_(float("nan"))
        graph.replay()
        _assert_fp8_grouped(out, x, w, scale_x, scale_w, counts, f"replay {counts}")


def test_fp8_matches_torch_scaled_grouped_mm_within_the_same_bound():
    """Qwen3-30B-A3B's down projection (E 128, N 2048, K 768) at 512 tokens, top-8: ours and
    torch._scaled_grouped_mm on the same inputs, each within the tolerance of the dequantized product."""
    counts = _random_counts(128, 4096, 9)
    x, w, offs, scale_x, scale_w = _fp8_problem(counts, 768, 2048)
    ours = gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w)
    theirs = torch._scaled_grouped_mm(
        x, w, scale_x, scale_w, offs=offs, out_dtype=torch.bfloat16, use_fast_accum=True
    )
    _assert_fp8_grouped(ours, x, w, scale_x, scale_w, counts, "grouped_matmul")
    _assert_fp8_grouped(theirs, x, w, scale_x, scale_w, counts, "torch._scaled_grouped_mm")
    launch = gg.prepare("scaled_grouped_mm", x, w, offs, scale_x=scale_x, scale_w=scale_w)
    assert torch.equal(launch.fn(), theirs)  # the baseline mode is that call


def test_fp8_bad_arguments_on_the_gpu():
    x, w, offs, scale_x, scale_w = _fp8_problem([8, 8], 64, 32)
    with pytest.raises(TypeError, match="fp8 operands need row-wise"):
        gg.grouped_matmul(x, w, offs)
    with pytest.raises(ValueError, match=r"scale_x\.reshape\(16\)"):
        gg.grouped_matmul(x, w, offs, scale_x=scale_x.view(16, 1), scale_w=scale_w)
    with pytest.raises(ValueError, match=r"scale_w \(strides \(1, 2\)\) must be contiguous"):
        gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w.t().contiguous().t())
    with pytest.raises(ValueError, match="scale_w is on cpu"):
        gg.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w.cpu())
    with pytest.raises(TypeError, match="mode 'grouped_mm' has no fp8 kernel"):
        gg.prepare("grouped_mm", x, w, offs, scale_x=scale_x, scale_w=scale_w)
