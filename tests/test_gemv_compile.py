"""The gemv rung without a GPU: it compiles for sm_90a and sm_100a (both B layouts, every config
`tune` may pick, fp16, bf16 and fp8) and its SASS is what its docstring claims: 16-byte loads
straight into registers (LDG.E.128), CUDA-core FMAs, no MMA of any kind, no TMA, no shared-memory
ring, no spills. On the host: where K fits one chunk the loop is dropped; fp8 runs in one chunk,
K-major, with its scales, and what it cannot run is refused with the reason."""

from __future__ import annotations

import pytest
import torch

from gluon_survey.kernels import gemv
from gluon_survey.launch import Scales, Target
from kernel_reports import assert_streams_into_registers, compiled_report, config_marks, specs

pytestmark = pytest.mark.compile

CASES = [
    pytest.param(
        arch,
        dtype,
        i,
        id=f"{arch}-{dtype}-{spec.kernel.replace(' ', '-')}",
        marks=config_marks("gemv", arch, dtype, i),
    )
    for arch in ("sm_90a", "sm_100a")
    for dtype in ("float16", "bfloat16", "float8_e4m3fn")
    for i, spec in enumerate(specs("gemv", arch, dtype))
]


@pytest.mark.parametrize(("arch", "dtype", "index"), CASES)
def test_gemv_machine_code(arch, dtype, index):
    spec, r = compiled_report("gemv", arch, dtype, index)
    assert_streams_into_registers(spec, r)


def test_every_candidate_is_compiled_for_both_layouts():
    labels = {s.kernel for s in specs("gemv", "sm_90a")}
    for cfg in gemv.candidates((9, 0)).values():
        want = {f"gemv_kernel {cfg.label} B=row", f"gemv_kernel {cfg.label} B=t"}
        assert want | {f"gemv_kernel {cfg.label} one chunk B=t"} <= labels
    fp8 = {s.kernel for s in specs("gemv", "sm_90a", "float8_e4m3fn")}
    assert fp8 == {
        f"gemv_kernel {label} one chunk B=t scales=row" for label in gemv.candidates((9, 0), fp8=True)
    }


@pytest.mark.parametrize("K", [1, 4095, 4096, 4097, 14336])
@pytest.mark.parametrize("label", sorted(gemv.candidates((9, 0))))
def test_the_loop_is_dropped_exactly_where_k_fits_one_chunk(K, label):
    cfg = gemv.candidates((9, 0))[label]
    a = torch.empty(1, K, dtype=torch.bfloat16)
    b = torch.empty(4096, K, dtype=torch.bfloat16).t()
    launch = gemv.prepare(a, b, torch.empty(1, 4096, dtype=torch.bfloat16), Target((9, 0), 132), cfg)
    assert launch.fn.plan.launcher.constexprs["ONE_CHUNK"] == (cfg.BLOCK_K >= K)
    assert launch.config["k_chunks"] == -(-K // cfg.BLOCK_K)


@pytest.mark.parametrize(("K", "label"), [(1, "R1xK512 w1"), (4096, "R1xK4096 w8"), (4097, "R1xK8192 w16"),
                                          (16384, "R1xK16384 w32"), (16385, "R1xK4096 w4")])  # fmt: skip
def test_the_default_is_one_chunk_of_two_loads_a_thread_up_to_16384(K, label):
    assert gemv.config_for((9, 0), K).label == label


def test_one_chunk_takes_fewer_registers_than_the_loop():
    """The point of ONE_CHUNK: without the prefetched chunk a program needs far fewer registers,
    so more programs (and more bytes in flight) fit an SM."""
    by_label = {s.kernel: i for i, s in enumerate(specs("gemv", "sm_90a", "bfloat16"))}
    label = f"gemv_kernel {gemv.CONFIGS[9].label} B=t"
    _, loop = compiled_report("gemv", "sm_90a", "bfloat16", by_label[label])
    _, one = compiled_report("gemv", "sm_90a", "bfloat16", by_label[label.replace(" B=t", " one chunk B=t")])
    assert one.registers * 2 <= loop.registers, (one.registers, loop.registers)


def _fp8(M, N, K, scaling="tensor"):
    a = torch.empty(M, K, dtype=torch.float8_e4m3fn)
    b = torch.empty(N, K, dtype=torch.float8_e4m3fn).t()
    sa, sb = (torch.ones(1), torch.ones(1)) if scaling == "tensor" else (torch.ones(M), torch.ones(N))
    return a, b, Scales(sa, sb, scaling)


@pytest.mark.parametrize(("K", "label"), [(4096, "R1xK4096 w4 fp8"), (14336, "R1xK16384 w16 fp8"),
                                          (28672, "R1xK32768 w32 fp8")])  # fmt: skip
def test_fp8_runs_one_chunk_of_two_loads_a_thread(K, label):
    cfg = gemv.config_for((9, 0), K, fp8=True)
    assert cfg.label == label and cfg.ELEM_BYTES == 1 and label in gemv.candidates((9, 0), fp8=True)
    a, b, scales = _fp8(1, 4096, K, "row")
    launch = gemv.prepare(a, b, torch.empty(1, 4096, dtype=torch.bfloat16), Target((9, 0), 132), None, scales)
    constexprs = launch.fn.plan.launcher.constexprs
    assert constexprs["ONE_CHUNK"] and constexprs["SCALING"] == 2
    assert list(constexprs)[-2:] == ["SCALING", "HAS_BIAS"]
    assert launch.config["k_chunks"] == 1


def test_fp8_refuses_what_it_cannot_run_with_the_reason():
    with pytest.raises(ValueError, match="one chunk of K, at most 32768"):
        gemv.config_for((9, 0), 32769, fp8=True)
    target, out = Target((9, 0), 132), torch.empty(1, 512, dtype=torch.bfloat16)
    a, b, scales = _fp8(1, 512, 8192)
    with pytest.raises(ValueError, match="config R1xK4096 w4 fp8 takes K <= 4096"):
        gemv.prepare(a, b, out, target, gemv.one_chunk(4096, 1), scales)
    with pytest.raises(ValueError, match="K-major"):
        gemv.prepare(a, b.t().contiguous(), out, target, None, scales)
    with pytest.raises(ValueError, match="is for fp8 operands"):
        gemv.prepare(a, b, out, target, gemv.one_chunk(8192, 1))
    with pytest.raises(ValueError, match="is for 16-bit operands"):
        gemv.prepare(a, b, out, target, gemv.one_chunk(8192), scales)


def test_fp16_launches_pass_no_scales():
    a, b = torch.empty(1, 4096, dtype=torch.float16), torch.empty(512, 4096, dtype=torch.float16).t()
    launch = gemv.prepare(a, b, torch.empty(1, 512, dtype=torch.float16), Target((9, 0), 132))
    assert launch.fn.plan.launcher.constexprs["SCALING"] == 0


def test_config_refuses_tiles_that_do_not_divide():
    with pytest.raises(ValueError, match="multiple of a row's vectors"):
        gemv.GemvConfig(BLOCK_K=1000)
    with pytest.raises(ValueError, match="multiple of a row's vectors \\(1024\\)"):
        gemv.GemvConfig(ROWS=1, BLOCK_K=512, num_warps=4)  # four warps along K take 1024 a step
    with pytest.raises(ValueError, match="one must be a multiple of the other"):
        gemv.GemvConfig(ROWS=3, num_warps=2)
