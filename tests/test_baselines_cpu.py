"""The baselines' host logic, without a GPU: layout detection, the autotuning space and its prune,
`unsupported_reason`, the torch.compile cache and result contract, and the plain-Triton kernel's
arithmetic run by Triton's CPU interpreter (tile order, persistence, both B layouts, ragged edges).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gluon_survey.baselines import torch_compile, torch_ops, triton_gemm

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


def test_autotune_space_and_prune() -> None:
    configs = triton_gemm._autotune_configs()
    assert len(configs) == 8 and all(c.pre_hook is triton_gemm._set_block_shapes for c in configs)

    def describe(cs: list) -> set[tuple[int, int, int]]:
        return {(c.kwargs["BLOCK_N"], c.num_stages, c.num_warps) for c in cs}

    # 128x256: 4 stages do not fit 227 KB with the C tile; 4 warps would need 256 acc regs/thread
    assert describe(triton_gemm.prune_configs(configs, H100_SMEM, 2)) == {
        (128, 3, 4),
        (128, 3, 8),
        (128, 4, 4),
        (128, 4, 8),
        (256, 3, 8),
    }
    # Blackwell accumulates in tensor memory: 128x256 on 4 warps stays
    assert describe(triton_gemm.prune_configs(configs, H100_SMEM, 2, acc_in_tmem=True)) == {
        (128, 3, 4),
        (128, 3, 8),
        (128, 4, 4),
        (128, 4, 8),
        (256, 3, 4),
        (256, 3, 8),
    }
    # nothing fits 99 KB: fall back to the small tile with as many stages as fit
    (fallback,) = triton_gemm.prune_configs(configs, SM120_SMEM, 2)
    assert describe([fallback]) == {(128, 2, 4)}
    assert triton_gemm.smem_bytes(fallback, 2) <= SM120_SMEM


def test_smem_model() -> None:
    assert triton_gemm.smem_bytes(triton_gemm._config(256, 3, 8), 2) == 3 * 48 * 1024 + 64 * 1024
    assert triton_gemm.smem_bytes(triton_gemm._config(256, 4, 8), 2) > H100_SMEM


@pytest.mark.parametrize("kmajor", [False, True])
def test_pre_hook_sets_descriptor_blocks(kmajor: bool) -> None:
    a = triton_gemm._descriptor(_f16(256, 128), [1, 1])
    b = triton_gemm._descriptor(_f16(256, 128), [1, 1])
    c = triton_gemm._descriptor(_f16(256, 256), [1, 1])
    nargs = {
        "a_desc": a,
        "b_desc": b,
        "c_desc": c,
        "B_KMAJOR": kmajor,
        **triton_gemm._config(256, 3, 8).kwargs,
    }
    triton_gemm._set_block_shapes(nargs)
    assert a.block_shape == [128, 64] and c.block_shape == [128, 256]
    assert b.block_shape == ([256, 64] if kmajor else [64, 256])


def test_compile_specs_signatures() -> None:
    specs = triton_gemm.compile_specs((9, 0), "bfloat16")
    assert len({s.kernel for s in specs}) == len(specs) and not any(s.gluon for s in specs)
    for s in specs:
        assert s.signature["a_desc"] == "tensordesc<bf16[128, 64]>"
        assert set(s.signature) == set(triton_gemm.persistent_matmul_kernel.arg_names)
        assert {k for k, v in s.signature.items() if v == "constexpr"} == set(s.constexprs)
        bn = s.constexprs["BLOCK_N"]
        b_block = [bn, 64] if s.constexprs["B_KMAJOR"] else [64, bn]
        assert s.signature["b_desc"] == f"tensordesc<bf16[{b_block[0]}, {b_block[1]}]>"
    assert triton_gemm.compile_specs((9, 0), "fp16")[0].signature["c_desc"] == "tensordesc<fp16[128, 256]>"


_INTERPRETER_SCRIPT = textwrap.dedent(
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


def test_triton_kernel_in_the_interpreter() -> None:
    """The kernel's arithmetic and the prepare/first-call/direct-launch flow, run by Triton's CPU
    interpreter (TRITON_INTERPRET must be set before the kernel module is imported: a subprocess)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _INTERPRETER_SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# ----------------------------------------------------------------------------------------------
# torch, torch.compile
# ----------------------------------------------------------------------------------------------


def test_library_modes_run_anywhere() -> None:
    for capability in ((7, 0), (9, 0), (10, 0)):
        assert torch_ops.unsupported_reason(capability) is None
        assert torch_compile.unsupported_reason(capability) is None


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
    first, second = torch_compile._fresh_matmul(0), torch_compile._fresh_matmul(1)
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
