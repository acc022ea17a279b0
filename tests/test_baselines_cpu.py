"""The baselines' host logic, without a GPU: layout detection, the autotuning space and its prune
(fp16/bf16 and fp8), `unsupported_reason`, the torch.compile cache and result contract, the fp8
`torch._scaled_mm` call (PyTorch's CPU kernel stands in for cuBLAS), and the plain-Triton kernel's
arithmetic run by Triton's CPU interpreter (tile order, persistence, both B layouts, ragged edges,
the fp8 scales' epilogue and the autotuning key that keeps fp8 apart from fp16).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gluon_survey.baselines import torch_compile, torch_ops, triton_gemm
from gluon_survey.launch import Scales

H100_SMEM = 232448  # opt-in shared memory per block on sm_90 / sm_100 (227 KB)
SM120_SMEM = 101376  # sm_120 (99 KB)


# ----------------------------------------------------------------------------------------------
# triton
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capability", "supported"),
    [((8, 0), False), ((8, 9), False), ((9, 0), True), ((10, 0), True), ((12, 0), True)],
)
def test_triton_needs_tma(capability: tuple[int, int], supported: bool) -> None:
    reason = triton_gemm.unsupported_reason(capability)
    assert (reason is None) == supported
    if not supported:
        assert "TMA" in reason
    assert (triton_gemm.compile_specs(capability, "float16") != []) == supported


def _f16(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.float16)


def test_single_row_descriptor_gets_a_legal_stride() -> None:
    a = _f16(1, 100)  # row stride 200 bytes is not a multiple of 16, but it is never used
    desc = triton_gemm._descriptor(a, [128, 64])
    assert desc.shape == [1, 100] and (desc.strides[0] * 2) % 16 == 0


def _describe(cs: list) -> set[tuple[int, int, int]]:
    return {(c.kwargs["BLOCK_N"], c.num_stages, c.num_warps) for c in cs}


def test_autotune_space_and_prune() -> None:
    configs = triton_gemm._autotune_configs()
    assert len(configs) == 16 and all(c.pre_hook is triton_gemm._set_block_shapes for c in configs)
    # 8 per operand size: BLOCK_K is 128 bytes of K, 64 fp16/bf16 elements or 128 fp8 ones
    assert sorted(c.kwargs["BLOCK_K"] for c in configs) == [64] * 8 + [128] * 8
    for bk in (64, 128):
        assert _describe(c for c in configs if c.kwargs["BLOCK_K"] == bk) == {
            (bn, s, w) for bn in (128, 256) for s in (3, 4) for w in (4, 8)
        }
    assert all(c.kwargs["BLOCK_K"] == 64 for c in triton_gemm.prune_configs(configs, H100_SMEM, 2))

    # 128x256: 4 stages do not fit 227 KB with the C tile; 4 warps would need 256 acc regs/thread
    assert _describe(triton_gemm.prune_configs(configs, H100_SMEM, 2)) == {
        (128, 3, 4),
        (128, 3, 8),
        (128, 4, 4),
        (128, 4, 8),
        (256, 3, 8),
    }
    # Blackwell accumulates in tensor memory: 128x256 on 4 warps stays
    assert _describe(triton_gemm.prune_configs(configs, H100_SMEM, 2, acc_in_tmem=True)) == {
        (128, 3, 4),
        (128, 3, 8),
        (128, 4, 4),
        (128, 4, 8),
        (256, 3, 4),
        (256, 3, 8),
    }
    # nothing fits 99 KB: fall back to the small tile with as many stages as fit
    (fallback,) = triton_gemm.prune_configs(configs, SM120_SMEM, 2)
    assert _describe([fallback]) == {(128, 2, 4)}
    assert triton_gemm.smem_bytes(fallback, 2) <= SM120_SMEM


def test_fp8_autotune_space_and_prune() -> None:
    """fp8 operands (1 byte) with a bf16 or fp16 output (2 bytes): BLOCK_K = 128, and the same
    configs survive as for fp16/bf16, since a K step moves the same bytes."""
    configs = triton_gemm._autotune_configs()
    kept = triton_gemm.prune_configs(configs, H100_SMEM, 1, out_bytes=2)
    assert all(c.kwargs["BLOCK_K"] == 128 for c in kept)
    assert _describe(kept) == {(128, 3, 4), (128, 3, 8), (128, 4, 4), (128, 4, 8), (256, 3, 8)}
    # the C tile's size counts: an fp8 C (1 byte) would leave room for 128x256 with 4 stages
    kept = triton_gemm.prune_configs(configs, H100_SMEM, 1)
    assert (256, 4, 8) in _describe(kept)
    kept = triton_gemm.prune_configs(configs, H100_SMEM, 1, acc_in_tmem=True, out_bytes=2)
    assert _describe(kept) == {(128, 3, 4), (128, 3, 8), (128, 4, 4), (128, 4, 8), (256, 3, 4), (256, 3, 8)}
    (fallback,) = triton_gemm.prune_configs(configs, SM120_SMEM, 1, out_bytes=2)
    assert _describe([fallback]) == {(128, 2, 4)} and fallback.kwargs["BLOCK_K"] == 128
    assert triton_gemm.smem_bytes(fallback, 1, 2) <= SM120_SMEM


def test_smem_model() -> None:
    assert triton_gemm.smem_bytes(triton_gemm._config(256, 3, 8), 2) == 3 * 48 * 1024 + 64 * 1024
    assert triton_gemm.smem_bytes(triton_gemm._config(256, 4, 8), 2) > H100_SMEM
    # fp8: 1-byte operand tiles (128x128 + 256x128 per stage), a 2-byte (bf16) C tile
    fp8 = triton_gemm._config(256, 3, 8, elem_bytes=1)
    assert fp8.kwargs["BLOCK_K"] == 128 and triton_gemm.block_k(1) == 128 and triton_gemm.block_k(2) == 64
    assert triton_gemm.smem_bytes(fp8, 1, 2) == 3 * 48 * 1024 + 64 * 1024 == 212992
    assert triton_gemm.smem_bytes(fp8, 1) == 3 * 48 * 1024 + 32 * 1024  # an fp8 C tile
    assert triton_gemm.smem_bytes(triton_gemm._config(256, 4, 8, 1), 1, 2) == 256 * 1024 > H100_SMEM
    assert triton_gemm.smem_bytes(triton_gemm._config(128, 4, 4, 1), 1, 2) == 4 * 32 * 1024 + 32 * 1024


@pytest.mark.parametrize(("kmajor", "elem_bytes"), [(False, 2), (True, 2), (True, 1)])
def test_pre_hook_sets_descriptor_blocks(kmajor: bool, elem_bytes: int) -> None:
    a = triton_gemm._descriptor(_f16(256, 128), [1, 1])
    b = triton_gemm._descriptor(_f16(256, 128), [1, 1])
    c = triton_gemm._descriptor(_f16(256, 256), [1, 1])
    nargs = {
        "a_desc": a,
        "b_desc": b,
        "c_desc": c,
        "B_KMAJOR": kmajor,
        **triton_gemm._config(256, 3, 8, elem_bytes).kwargs,
    }
    triton_gemm._set_block_shapes(nargs)
    bk = 128 // elem_bytes
    assert a.block_shape == [128, bk] and c.block_shape == [128, 256]
    assert b.block_shape == ([256, bk] if kmajor else [bk, 256])


def test_compile_specs_signatures() -> None:
    specs = triton_gemm.compile_specs((9, 0), "bfloat16")
    assert len({s.kernel for s in specs}) == len(specs) and not any(s.gluon for s in specs)
    for s in specs:
        assert s.signature["a_desc"] == "tensordesc<bf16[128, 64]>"
        assert list(s.signature) == triton_gemm.persistent_matmul_kernel.arg_names
        assert {k for k, v in s.signature.items() if v == "constexpr"} == set(s.constexprs)
        bn = s.constexprs["BLOCK_N"]
        b_block = [bn, 64] if s.constexprs["B_KMAJOR"] else [64, bn]
        assert s.signature["b_desc"] == f"tensordesc<bf16[{b_block[0]}, {b_block[1]}]>"
        # no scales: None constexprs and SCALING 0, the kernel fp16/bf16 always compiled
        assert s.constexprs["scale_a"] is None and s.constexprs["scale_b"] is None
        assert s.constexprs["SCALING"] == 0
    assert triton_gemm.compile_specs((9, 0), "fp16")[0].signature["c_desc"] == "tensordesc<fp16[128, 256]>"


def test_fp8_compile_specs_signatures() -> None:
    """fp8 specs: e4m3 operand descriptors with BLOCK_K = 128, B K-major, a bf16 C, fp32 scale
    pointers and the row-wise epilogue."""
    specs = triton_gemm.compile_specs((9, 0), "float8_e4m3fn")
    assert [s.kernel for s in specs] == [
        "persistent_matmul_kernel 128x256x128 s3 w8 B=t scales=row",
        "persistent_matmul_kernel 128x128x128 s4 w4 B=t scales=row",
    ]
    for s in specs:
        bn = s.constexprs["BLOCK_N"]
        assert list(s.signature) == triton_gemm.persistent_matmul_kernel.arg_names
        assert {k for k, v in s.signature.items() if v == "constexpr"} == set(s.constexprs)
        assert s.signature["a_desc"] == "tensordesc<fp8e4nv[128, 128]>"
        assert s.signature["b_desc"] == f"tensordesc<fp8e4nv[{bn}, 128]>"
        assert s.signature["c_desc"] == f"tensordesc<bf16[128, {bn}]>"
        assert s.signature["scale_a"] == s.signature["scale_b"] == "*fp32"
        assert s.constexprs["B_KMAJOR"] is True and s.constexprs["BLOCK_K"] == 128
        assert s.constexprs["SCALING"] == Scales(None, None, "row").code == 2
    assert [s.kernel for s in triton_gemm.compile_specs((10, 0), "fp8")] == [s.kernel for s in specs]
    assert triton_gemm.compile_specs((8, 9), "float8_e4m3fn") == []


_INTERPRETER_PREAMBLE = textwrap.dedent(
    """
    import numpy as np
    import torch
    import triton.runtime.interpreter as interpreter

    # triton's interpreter calls int() on 1-element arrays, which numpy >= 2.3 refuses
    _patch = interpreter._patch_lang_tensor
    def _patch_index(tensor, scope):
        _patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))
    interpreter._patch_lang_tensor = _patch_index

    from gluon_survey.baselines import triton_gemm as tg

    from gluon_survey.launch import Target
    target = Target((9, 0), 3)  # 3 programs, so each walks several tiles
    tg._smem_limit = lambda index: 232448
    tg._capability = lambda index: (9, 0)
    calls = []
    def fake_bench(fn, quantiles=None, **kwargs):  # run each config once; the 128x256 one "wins"
        fn()
        calls.append(1)
        return [1.0 - 0.01 * ((len(calls) - 1) % 5)] * 3
    tg._autotuned_matmul.__dict__["do_bench"] = fake_bench

    torch.manual_seed(0)
    """
)

_INTERPRETER_SCRIPT = _INTERPRETER_PREAMBLE + textwrap.dedent(
    """
    for M, N, K, kmajor, pad in [(300, 200, 104, False, 8), (1100, 136, 72, True, 0)]:
        a = torch.randn(M, K, dtype=torch.float16)
        w = torch.randn(N, K, dtype=torch.float16)
        b = w.T if kmajor else w.T.contiguous()
        out = torch.full((M, N + pad), float("nan"), dtype=torch.float16)[:, :N]
        launch = tg.prepare(a, b, out, target)
        assert "BLOCK_N" not in launch.config
        ref = a.float() @ b.float()
        for _ in range(2):  # first call: autotuner; second: the direct launch of the chosen config
            out.fill_(float("nan"))
            launch.fn()
            err = (out.float() - ref).abs().max().item()
            assert err < 0.05, (M, N, K, kmajor, err)
        cfg = launch.config
        chosen = (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["stages"], cfg["warps"])
        assert chosen == (128, 256, 64, 3, 8)
        assert cfg["grid"] == 3
    assert len(calls) == 10  # 5 configs survive the prune, once per shape
    print("ok")
    """
)


_FP8_INTERPRETER_SCRIPT = _INTERPRETER_PREAMBLE + textwrap.dedent(
    """
    from gluon_survey.driver.check import check, rel_error
    from gluon_survey.launch import Scales

    def quantize(x, kind):  # per-tensor: amax / 448; row-wise: per row of x
        amax = x.abs().amax(dim=1, keepdim=True) if kind == "row" else x.abs().amax().reshape(1, 1)
        scale = amax / 448
        return (x / scale).to(torch.float8_e4m3fn), scale

    def chosen(config):
        return (config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["stages"], config["warps"])

    # fp16 first, then fp8 of the very same M, N, K and B layout: the key's SCALING must make the
    # fp8 runs tune again (else they would launch the fp16 config, BLOCK_K = 64)
    M, N, K = 65, 200, 272
    a16, w16 = torch.randn(M, K, dtype=torch.float16), torch.randn(N, K, dtype=torch.float16)
    out16 = torch.empty(M, N, dtype=torch.float16)
    launch = tg.prepare(a16, w16.T, out16, target)
    launch.fn()
    assert chosen(launch.config) == (128, 256, 64, 3, 8), launch.config
    assert len(calls) == 5

    # (M, N, K, scaling): the shared shape in both scalings, then a ragged one (M not a multiple
    # of 128, N of 8, K 1 tile + a 16-element tail) on several programs
    for M, N, K, kind in [(65, 200, 272, "tensor"), (65, 200, 272, "row"), (300, 136, 144, "row")]:
        a, sa = quantize(torch.randn(M, K), kind)
        w, sw = quantize(torch.randn(N, K) * 3, kind)
        sa, sw = sa.reshape(-1).contiguous(), sw.reshape(-1).contiguous()
        ref = (a.float() @ w.float().T) * (sa[:, None] if kind == "row" else sa) * sw
        out = torch.full((M, N + 8), float("nan"), dtype=torch.bfloat16)[:, :N]  # padded row stride
        launch = tg.prepare(a, w.T, out, target, scales=Scales(sa, sw, kind))
        scales = Scales(sa, sw, kind)
        cublas = torch._scaled_mm(  # PyTorch's CPU kernel stands in for cuBLAS
            a, w.T, scale_a=scales.torch_a, scale_b=scales.torch_b, out_dtype=torch.bfloat16
        )
        for _ in range(2):  # first call: autotuner; second: the direct launch of the chosen config
            out.fill_(float("nan"))
            launch.fn()
            verdict = check(out, ref, rel_error(cublas, ref), torch.bfloat16)
            assert verdict.ok, (M, N, K, kind, verdict.describe())
        assert chosen(launch.config) == (128, 256, 128, 3, 8), launch.config
    assert len(calls) == 20, len(calls)  # tuned again for each scaling: 3 more times 5 configs
    print("ok")
    """
)


def _run_interpreted(script: str) -> None:
    """Run `script` under Triton's CPU interpreter (TRITON_INTERPRET must be set before the kernel
    module is imported: a subprocess); it prints "ok" when its assertions pass."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_triton_kernel_in_the_interpreter() -> None:
    """The kernel's arithmetic and the prepare/first-call/direct-launch flow, run by Triton's CPU
    interpreter."""
    _run_interpreted(_INTERPRETER_SCRIPT)


def test_triton_fp8_kernel_in_the_interpreter() -> None:
    """fp8 e4m3 operands through the same flow: both scalings' epilogues (masked row-wise scale
    loads on ragged M and N) against the fp32 reference with the survey's tolerance rule, and the
    autotuning key that separates fp8 from fp16 and per-tensor from row-wise. (The interpreter
    rounds fp32 to bf16 toward zero, about twice the error of round-to-nearest: within the rule.)"""
    _run_interpreted(_FP8_INTERPRETER_SCRIPT)


# ----------------------------------------------------------------------------------------------
# torch, torch.compile
# ----------------------------------------------------------------------------------------------


def test_library_modes_run_anywhere() -> None:
    for capability in ((7, 0), (9, 0), (10, 0)):
        assert torch_ops.unsupported_reason(capability) is None
        assert torch_compile.unsupported_reason(capability) is None


@pytest.mark.parametrize("kind", ["tensor", "row"])
def test_torch_ops_fp8_calls_scaled_mm_into_out(kind: str) -> None:
    """fp8: `torch._scaled_mm` with the scales in its shapes, writing `out` (padded row stride) in
    place; PyTorch's CPU kernel stands in for cuBLAS."""
    M, N, K = 5, 48, 64
    a = torch.randn(M, K).to(torch.float8_e4m3fn)
    w = torch.randn(N, K).to(torch.float8_e4m3fn)
    n_a, n_b = (1, 1) if kind == "tensor" else (M, N)
    scales = Scales(torch.rand(n_a) + 0.5, torch.rand(n_b) + 0.5, kind)
    out = torch.full((M, N + 8), float("nan"), dtype=torch.bfloat16)[:, :N]
    launch = torch_ops.prepare(a, w.T, out, scales=scales)
    assert launch.config == {"impl": "cuBLAS fp8 (torch._scaled_mm, fast accumulation)"}
    assert launch.fn() is out
    ref = (a.float() @ w.float().T) * scales.torch_a * scales.torch_b
    torch.testing.assert_close(out.float(), ref, rtol=2**-8, atol=1e-5)


def test_torch_ops_fp8_needs_multiples_of_16() -> None:
    a = torch.zeros(4, 40, dtype=torch.float8_e4m3fn)  # K = 40
    w = torch.zeros(24, 40, dtype=torch.float8_e4m3fn)
    one = torch.ones(1)
    with pytest.raises(ValueError, match=r"multiples of 16; got K=40, N=24"):
        torch_ops.prepare(a, w.T, torch.empty(4, 24, dtype=torch.bfloat16), scales=Scales(one, one, "tensor"))


def test_torch_ops_writes_out_in_place() -> None:
    a = torch.randn(8, 16)
    w = torch.randn(10, 16)
    out = torch.full((8, 24), float("nan"))[:, :10]  # padded row stride
    launch = torch_ops.prepare(a, w.T, out)
    assert launch.config == {"impl": "cuBLAS"}
    launch.fn()
    torch.testing.assert_close(out, a @ w.T)


def test_torch_compile_caches_one_function_per_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_compile, "_COMPILED", {})
    a, b = torch.randn(8, 16), torch.randn(16, 12)
    f = torch_compile.compiled_matmul(a, b)  # nothing compiles until the first call
    assert torch_compile.compiled_matmul(a.clone(), b.clone()) is f
    assert torch_compile.compiled_matmul(a, torch.randn(12, 16).T) is not f  # other strides
    assert torch_compile.compiled_matmul(a.half(), b.half()) is not f  # other dtype
    assert len(torch_compile._COMPILED) == 3
    # each compiled function gets a code object of its own, hence its own Dynamo cache
    first, second = (
        torch_compile._fresh(torch_compile._matmul, 0),
        torch_compile._fresh(torch_compile._matmul, 1),
    )
    assert first.__code__ is not second.__code__ and second.__name__ == "_matmul_1"
    torch.testing.assert_close(first(a, b), a @ b)


def test_torch_compile_returns_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """The contract: `fn()` returns a @ b as a new tensor and leaves `out` alone. Compiled on the
    CPU in Inductor's default mode (max-autotune would spend minutes benchmarking CPU kernels)."""
    monkeypatch.setattr(torch_compile, "COMPILE_MODE", "default")
    monkeypatch.setattr(torch_compile, "_COMPILED", {})
    a, w = torch.randn(24, 16), torch.randn(8, 16)
    out = torch.full((24, 8), float("nan"))
    launch = torch_compile.prepare(a, w.T, out)
    result = launch.fn()
    assert isinstance(result, torch.Tensor) and result.data_ptr() != out.data_ptr()
    torch.testing.assert_close(result, a @ w.T)
    assert out.isnan().all()
    assert launch.config["result"] == "returned"


@pytest.mark.parametrize("kind", ["tensor", "row"])
def test_torch_compile_fp8_returns_scaled_mm_of_the_scales(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """fp8: the compiled `torch._scaled_mm` returns (a @ b) * scales in `out`'s dtype as a new
    tensor, the same as the torch mode's call writes; compiled on the CPU in Inductor's default
    mode, PyTorch's CPU kernel standing in for cuBLAS."""
    monkeypatch.setattr(torch_compile, "COMPILE_MODE", "default")
    monkeypatch.setattr(torch_compile, "_COMPILED", {})
    M, N, K = 24, 32, 48
    a = torch.randn(M, K).to(torch.float8_e4m3fn)
    w = torch.randn(N, K).to(torch.float8_e4m3fn)
    n_a, n_b = (1, 1) if kind == "tensor" else (M, N)
    scales = Scales(torch.rand(n_a) + 0.5, torch.rand(n_b) + 0.5, kind)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    launch = torch_compile.prepare(a, w.T, out, scales=scales)
    assert launch.config["impl"].endswith("of torch._scaled_mm, fast accumulation")
    result = launch.fn()
    assert result.dtype == torch.bfloat16 and result.data_ptr() != out.data_ptr() and out.isnan().all()
    expected = torch.empty_like(out)
    torch_ops.prepare(a, w.T, expected, scales=scales).fn()
    torch.testing.assert_close(result, expected, rtol=0, atol=0)


def test_torch_compile_fp8_keys_hold_the_scales_and_the_output_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_compile, "_COMPILED", {})
    a = torch.zeros(8, 32, dtype=torch.float8_e4m3fn)
    b = torch.zeros(16, 32, dtype=torch.float8_e4m3fn).T
    one = torch.ones(())
    f = torch_compile.compiled_scaled_mm(a, b, one, one, torch.bfloat16)
    assert torch_compile.compiled_scaled_mm(a, b, one.clone(), one.clone(), torch.bfloat16) is f
    assert (
        torch_compile.compiled_scaled_mm(a, b, torch.ones(8, 1), torch.ones(1, 16), torch.bfloat16) is not f
    )
    assert torch_compile.compiled_scaled_mm(a, b, one, one, torch.float16) is not f
    assert torch_compile.compiled_matmul(a, b) is not f  # the 16-bit function is another key
    assert len(torch_compile._COMPILED) == 4


def test_torch_compile_fp8_needs_multiples_of_16() -> None:
    a = torch.zeros(4, 40, dtype=torch.float8_e4m3fn)  # K = 40
    w = torch.zeros(24, 40, dtype=torch.float8_e4m3fn)
    one = torch.ones(1)
    out = torch.empty(4, 24, dtype=torch.bfloat16)
    with pytest.raises(
        ValueError, match=r"torch.compile of torch._scaled_mm needs K and N to be multiples of 16"
    ):
        torch_compile.prepare(a, w.T, out, scales=Scales(one, one, "tensor"))


# ----------------------------------------------------------------------------------------------
# grouped fp8: cublas-loop's torch._scaled_mm per expert, scaled_grouped_mm's checks
# ----------------------------------------------------------------------------------------------


def _grouped_fp8(counts=(3, 0, 5), K=32, N=16):
    """x [S, K] and the [E, K, N] transpose view of an [E, N, K] weight in e4m3, scales [S] and
    [E, N], offs: what `gluon_survey.grouped.prepare` hands an fp8 grouped provider."""
    g = torch.Generator().manual_seed(0)
    S, E = sum(counts), len(counts)
    x = torch.randn(S, K, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(E, N, K, generator=g).to(torch.float8_e4m3fn).transpose(1, 2)
    scales = Scales(torch.rand(S, generator=g) + 0.5, torch.rand(E, N, generator=g) + 0.5, "row")
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    return x, w, offs, scales


def test_the_expert_loop_in_fp8_scales_each_experts_rows_and_channels() -> None:
    from gluon_survey.baselines import expert_loop

    x, w, offs, scales = _grouped_fp8()
    out = torch.full((8, 16), float("nan"), dtype=torch.bfloat16)
    launch = expert_loop.prepare(x, w, offs, out, scales=scales)
    assert launch.config["launches"] == 2  # expert 1 has no rows
    launch.fn()
    start = 0
    for e, end in enumerate(offs.tolist()):
        expected = (x[start:end].float() @ w[e].float()) * scales.a[start:end, None] * scales.b[e]
        assert torch.allclose(out[start:end].float(), expected, rtol=2**-7, atol=1e-3), e
        start = end


def test_the_expert_loop_in_fp8_needs_multiples_of_16() -> None:
    from gluon_survey.baselines import expert_loop

    x, w, offs, scales = _grouped_fp8(N=24)
    with pytest.raises(ValueError, match=r"multiples of 16; got K=32, N=24"):
        expert_loop.prepare(x, w, offs, torch.empty(8, 24, dtype=torch.bfloat16), scales=scales)


def test_scaled_grouped_mm_refuses_what_torch_would_refuse_deep_inside() -> None:
    from gluon_survey.baselines import scaled_grouped_mm

    x, w, offs, scales = _grouped_fp8()
    with pytest.raises(ValueError, match=r"bfloat16 only, not torch\.float16"):
        scaled_grouped_mm.prepare(x, w, offs, torch.empty(8, 16, dtype=torch.float16), scales=scales)
    x, w, offs, scales = _grouped_fp8(K=40)
    with pytest.raises(ValueError, match=r"multiples of 16; got K=40, N=16"):
        scaled_grouped_mm.prepare(x, w, offs, torch.empty(8, 16, dtype=torch.bfloat16), scales=scales)
    with pytest.raises(TypeError, match="row-wise scales"):
        scaled_grouped_mm.prepare(x, w, offs, torch.empty(8, 16, dtype=torch.bfloat16))


def test_scaled_grouped_mm_is_called_with_torchs_shapes_and_fast_accumulation(monkeypatch) -> None:
    from gluon_survey.baselines import scaled_grouped_mm

    calls = []
    monkeypatch.setattr(torch, "_scaled_grouped_mm", lambda *a, **kw: calls.append((a, kw)), raising=False)
    x, w, offs, scales = _grouped_fp8()
    scaled_grouped_mm.prepare(x, w, offs, torch.empty(8, 16, dtype=torch.bfloat16), scales=scales).fn()
    ((args, kwargs),) = calls
    assert args[0] is x and args[1] is w and args[2] is scales.a and args[3] is scales.b
    assert kwargs == {"offs": offs, "out_dtype": torch.bfloat16, "use_fast_accum": True}
    assert scaled_grouped_mm.unsupported_reason((9, 0)) is None
    assert "sm_90 and sm_100 only; this GPU is sm_89" in scaled_grouped_mm.unsupported_reason((8, 9))
