"""`gluon-survey inspect` on the CPU: GPU-less compilation for sm_90a / sm_100a and the SASS facts it
reports, the JSON contract, and that a kernel that fails to compile becomes an error row.

The `compile` tests compile real kernels (about 1-3 s each on two cores; Triton's on-disk cache
makes reruns faster). The parser tests use fixed SASS / PTX / cuobjdump snippets.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import types
from collections import Counter

import pytest
import triton
import triton.language as tl

from factories import INSPECT_JSON_KEYS as JSON_KEYS
from gluon_survey import registry
from gluon_survey.baselines import triton_gemm
from gluon_survey.driver import inspect as gi
from gluon_survey.launch import CompileSpec
from gluon_survey.registry import Mode


@triton.jit
def _broken_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.dot(offs, offs))  # tl.dot needs 2-D operands: a compile error


BROKEN = CompileSpec(
    mode="fake",
    kernel="broken_kernel",
    fn=_broken_kernel,
    signature={"x_ptr": "*fp16", "BLOCK": "constexpr"},
    constexprs={"BLOCK": 16},
    options={"num_warps": 4},
    gluon=False,
)


def _triton_spec(capability: tuple[int, int], index: int = 0) -> CompileSpec:
    return triton_gemm.compile_specs(capability, "float16")[index]


def _fp8_spec(capability: tuple[int, int], index: int = 0, scaling: int | None = None) -> CompileSpec:
    """The triton baseline's fp8 spec (e4m3 operands, bf16 C, row-wise scales unless `scaling`)."""
    spec = triton_gemm.compile_specs(capability, "float8_e4m3fn")[index]
    if scaling is not None:
        spec = dataclasses.replace(spec, constexprs={**spec.constexprs, "SCALING": scaling})
    return spec


@pytest.fixture(scope="module")
def hopper_triton() -> gi.Compiled:
    """The triton baseline's 128x256x64 / 3 stages / 8 warps config, compiled for sm_90a."""
    return gi.compile_spec(_triton_spec((9, 0)), "sm_90a")


# ----------------------------------------------------------------------------------------------
# Compiling real kernels
# ----------------------------------------------------------------------------------------------


@pytest.mark.compile
def test_triton_baseline_hopper_uses_wgmma_and_tma_without_spills(hopper_triton: gi.Compiled) -> None:
    sass = gi.sass_counts(hopper_triton.cubin)
    assert sass["HGMMA"] > 0
    assert sass["HGMMA.64x256x16.F32"] == sass["HGMMA"]  # instruction n = the full 256-wide tile
    assert sass["UTMALDG"] > 0 and sass["UTMASTG"] > 0  # TMA loads and the TMA store
    assert sass["LDL"] == 0 and sass["STL"] == 0
    # no fp8 scales (None, SCALING 0): no scale loads, no multiply in the epilogue
    assert sass["LDG"] == 0 and sass["FMUL"] == 0 and sass["QGMMA"] == 0
    usage = gi.resource_usage(hopper_triton.cubin)
    assert usage.spill_bytes == 0
    assert 0 < usage.registers <= 255
    assert hopper_triton.num_warps == 8
    # The prune's shared-memory model matches the compiler's allocation up to the mbarriers.
    cfg = triton_gemm._config(256, 3, 8)
    assert 0 <= hopper_triton.shared_bytes - triton_gemm.smem_bytes(cfg, 2) < 1024


@pytest.mark.compile
@pytest.mark.parametrize(
    ("index", "scaling"),
    [(0, 2), pytest.param(1, 2, marks=pytest.mark.exhaustive), (0, 1)],  # 128-row: another size
    ids=["256-row", "128-row", "256-tensor"],
)
def test_triton_baseline_fp8_hopper_uses_qgmma_without_spills(index: int, scaling: int) -> None:
    """fp8 e4m3 on sm_90a: `tl.dot` of e4m3 tiles is QGMMA (wgmma .e4m3, fp32 accumulator), one
    instruction per 64 rows a warpgroup owns per 32 of the 128-wide K step, as wide as the tile;
    the scales' epilogue keeps every value in registers."""
    spec = _fp8_spec((9, 0), index, scaling)
    compiled = gi.compile_spec(spec, "sm_90a")
    text = gi.disassemble(compiled.cubin)
    sass = gi.count_opcodes(text)
    bn, warps = spec.constexprs["BLOCK_N"], spec.options["num_warps"]
    assert sass["HGMMA"] == 0
    rows_per_warpgroup = 128 // (warps // 4)
    assert sass["QGMMA"] == (rows_per_warpgroup // 64) * (128 // 32)  # 4 (8 warps) or 8 (4 warps)
    assert Counter(re.findall(r"\bQGMMA\.[\w.]+", text)) == {f"QGMMA.64x{bn}x32.F32.E4M3.E4M3": sass["QGMMA"]}
    assert sass["UTMALDG"] > 0 and sass["UTMASTG"] > 0
    assert sass["LDL"] == 0 and sass["STL"] == 0
    assert sass["FMUL"] >= 128  # the scales applied to the 128 accumulator values a thread holds
    usage = gi.resource_usage(compiled.cubin)
    assert usage.spill_bytes == 0 and 0 < usage.registers <= 255
    assert compiled.num_warps == warps
    # shared memory: the model (1-byte operand stages, a bf16 C tile) up to the mbarriers and, for
    # row-wise scales, the BLOCK_N fp32 column scales moved into the accumulator's layout
    cfg = triton_gemm._config(bn, spec.options["num_stages"], warps, elem_bytes=1)
    scratch = bn * 4 if scaling == 2 else 0
    assert 0 <= compiled.shared_bytes - triton_gemm.smem_bytes(cfg, 1, 2) - scratch < 1024


@pytest.mark.compile
def test_triton_baseline_fp8_blackwell_uses_tcgen05() -> None:
    compiled = gi.compile_spec(_fp8_spec((10, 0)), "sm_100a")
    sass = gi.sass_counts(compiled.cubin)
    assert sass["UTCQMMA"] > 0 and sass["QGMMA"] == 0 and sass["HGMMA"] == 0
    assert sass["UTMALDG"] > 0 and sass["LDL"] == 0 and sass["STL"] == 0
    assert gi.resource_usage(compiled.cubin).spill_bytes == 0


@pytest.mark.compile
def test_triton_baseline_blackwell_uses_tcgen05() -> None:
    compiled = gi.compile_spec(_triton_spec((10, 0)), "sm_100a")
    sass = gi.sass_counts(compiled.cubin)
    assert sass["UTCHMMA"] > 0 and sass["LDTM"] > 0 and sass["UTCBAR"] > 0
    assert sass["HGMMA"] == 0
    assert sass["UTMALDG"] > 0
    assert compiled.tmem_cols is not None and compiled.tmem_cols > 0
    assert gi.resource_usage(compiled.cubin).spill_bytes == 0


@pytest.mark.compile
def test_spilling_config_is_detected() -> None:
    """128x256 on 4 warps needs 256 accumulator registers per thread on Hopper: the reason the
    autotuner prunes it there, and a check that inspect sees spills when there are some."""
    spec = dataclasses.replace(_triton_spec((9, 0)), options={"num_warps": 4, "num_stages": 3})
    row = gi.inspect_spec(spec, "sm_90a")
    assert row.error is None
    assert row.spill_bytes is not None and row.spill_bytes > 0
    assert row.count("LDL") + row.count("STL") > 0
    assert triton_gemm.acc_regs_per_thread(triton_gemm._config(256, 3, 4)) > triton_gemm.ACC_REGS_MAX
    # tcgen05 accumulates in tensor memory: the same config does not spill on Blackwell
    spec = dataclasses.replace(_triton_spec((10, 0)), options={"num_warps": 4, "num_stages": 3})
    row = gi.inspect_spec(spec, "sm_100a")
    assert row.error is None and row.spill_bytes == 0


@pytest.mark.compile
def test_inspect_json_and_dump(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    rc = gi.main(["triton", "--arch", "sm_90a", "--format", "json", "--dump", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    rows = json.loads(out)
    specs = triton_gemm.compile_specs((9, 0), "float16")
    assert [r["kernel"] for r in rows] == [s.kernel for s in specs]
    for r in rows:
        assert r.keys() >= JSON_KEYS
        assert (r["mode"], r["arch"], r["error"]) == ("triton", "sm_90a", None)
        assert r["sass"]["HGMMA"] > 0 and r["sass"]["UTMALDG"] > 0
        assert r["spill_bytes"] == 0 and r["registers"] > 0 and r["shared_bytes"] > 0
        assert r["num_warps"] in (4, 8)
    dumped = sorted(p.suffix for p in tmp_path.iterdir())
    assert dumped == sorted([".ptx", ".sass", ".ttgir"] * len(specs))
    sass_text = next(tmp_path.glob("*.sass")).read_text()
    assert "HGMMA" in sass_text


@pytest.mark.compile
def test_broken_kernel_is_an_error_row_not_an_exception() -> None:
    row = gi.inspect_spec(BROKEN, "sm_90a")
    assert row.error is not None and "CompilationError" in row.error
    assert (row.mode, row.arch, row.kernel, row.registers) == ("fake", "sm_90a", "broken_kernel", None)


@pytest.mark.compile
def test_collect_reports_every_provider_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def compile_specs(capability: tuple[int, int], dtype: str) -> list[CompileSpec]:
        if capability == (10, 0):
            raise RuntimeError("no Blackwell variant yet")
        return [BROKEN]

    provider = types.ModuleType("fake_provider")
    provider.compile_specs = compile_specs  # type: ignore[attr-defined]
    provider.unsupported_reason = lambda capability: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_provider", provider)
    modes = [
        Mode("fake", "a provider with a broken kernel", "gluon", ("sm_90",), "fake_provider"),
        Mode("missing", "a provider that does not import", "gluon", ("sm_90",), "fake_provider_missing"),
        registry.get("torch"),
    ]
    rows, notes = gi.collect(modes, ["sm_90a", "sm_100a"], explicit=True)
    assert [(r.mode, r.arch, r.kernel) for r in rows] == [
        ("fake", "sm_90a", "broken_kernel"),
        ("fake", "sm_100a", "(compile_specs)"),
        ("missing", "sm_90a", "(import)"),
        ("missing", "sm_100a", "(import)"),
    ]
    assert all(r.error for r in rows)
    assert "no Blackwell variant yet" in rows[1].error
    assert notes == [f"torch: no kernel of ours to compile ({registry.get('torch').summary})"]
    gi.render_table(rows, notes)  # error rows render, with the errors listed below the table
    printed = capsys.readouterr().out
    assert "error fake sm_90a broken_kernel: CompilationError" in printed
    assert "no kernel of ours" in printed


# ----------------------------------------------------------------------------------------------
# No compilation
# ----------------------------------------------------------------------------------------------


def test_library_modes_are_skipped_quietly_unless_named() -> None:
    modes = registry.parse_modes("torch,torch.compile")
    assert gi.collect(modes, ["sm_90a"]) == ([], [])
    rows, notes = gi.collect(modes, ["sm_90a"], explicit=True)
    assert rows == [] and len(notes) == 2


def test_unknown_mode_or_arch_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert gi.main(["no-such-mode"]) == 2
    assert gi.main(["triton", "--arch", "volta"]) == 2
    assert "unknown" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sm_90a", ("sm_90a", (9, 0))),
        ("sm_90", ("sm_90a", (9, 0))),
        ("SM_100A", ("sm_100a", (10, 0))),
        ("120", ("sm_120a", (12, 0))),
    ],
)
def test_parse_arch(text: str, expected: tuple[str, tuple[int, int]]) -> None:
    assert gi.parse_arch(text) == expected


SASS_SNIPPET = """
        /*0a40*/                   WARPGROUP.ARRIVE ;                              /* 0x00000000000079c5 */
        /*0a50*/                   HGMMA.64x256x16.F32 R24, gdesc[UR8].tnspB, R24 ;  /* 0x43e00000081879f0 */
                                                                                     /* 0x000fe20008000818 */
        /*0a60*/              @!UP0 HGMMA.64x256x16.F32 R24, gdesc[UR12], R24, gsb0 ; /* 0x43e000000c1879f0 */
        /*0a70*/               @P6 SYNCS.ARRIVE.TRANS64 RZ, [UR54+0x34000], R8 ;  /* 0x03400008ffff69a7 */
        /*0a80*/                   @UP3 UTMALDG.2D [UR16], [UR4] ;                /* 0x00000010040035b4 */
        /*0a90*/                   UTCHMMA gdesc[UR6], gdesc[UR10], tmem[UR35], tmem[UR36], idesc[UR37], UPT ;
        /*0aa0*/                   LDTM.x128 R4, tmem[UR7] ;                       /* 0x00000007000479ee */
        /*0ab0*/                   STL [R1+0x4], RZ ;                              /* 0x000004ff01007387 */
        /*0ac0*/                   IMAD.MOV.U32 R2, RZ, RZ, R3 ;                   /* 0x000000ffff027224 */
        /*0ad0*/                   @!PT LDS RZ, [RZ] ;                             /* 0x00000000fffff984 */
"""


def test_count_opcodes_keeps_base_and_full_forms() -> None:
    counts = gi.count_opcodes(SASS_SNIPPET)
    assert counts["HGMMA"] == 2 and counts["HGMMA.64x256x16.F32"] == 2
    assert counts["WARPGROUP"] == 1 and counts["WARPGROUP.ARRIVE"] == 1
    assert counts["SYNCS.ARRIVE.TRANS64"] == 1 and counts["UTMALDG.2D"] == 1
    assert counts["UTCHMMA"] == 1 and counts["LDTM"] == 1 and counts["LDTM.x128"] == 1
    assert counts["STL"] == 1 and counts["LDS"] == 1
    assert counts["IMAD"] == 1 and "IMAD.MOV.U32" not in counts  # full forms only for the families
    row = gi.KernelReport("m", "sm_90a", "k", sass=dict(counts))
    assert gi.mma_forms(row) == [("HGMMA.64x256x16.F32", 2), ("UTCHMMA", 1)]


RESOURCE_SNIPPET = """
Resource usage:
 Common:
  GLOBAL:0
 Function persistent_matmul_kernel:
  REG:255 STACK:1024 SHARED:1024 LOCAL:8 CONSTANT[0]:1144 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_parse_resource_usage() -> None:
    usage = gi.parse_resource_usage(RESOURCE_SNIPPET)
    assert usage == gi.ResourceUsage("persistent_matmul_kernel", 255, 1024, 8, 1024)
    assert usage.spill_bytes == 1032


def test_ptx_register_hints() -> None:
    ptx = """
.visible .entry warpspec_kernel(
)
.reqntid 384, 1, 1
.maxnreg 168
{
    setmaxnreg.dec.sync.aligned.u32 24;
    setmaxnreg.inc.sync.aligned.u32 240;
    setmaxnreg.dec.sync.aligned.u32 24;
}
"""
    assert gi.ptx_register_hints(ptx) == (168, {"dec": [24], "inc": [240]}, 384)
    assert gi.ptx_register_hints(".reqntid 256\n") == (None, {}, 256)


# ----------------------------------------------------------------------------------------------
# The command line (no compilation: `inspect_spec` is replaced where a kernel would be compiled)
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def no_compiling(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """`inspect_spec` that compiles nothing: a row per spec, (kernel, arch) recorded."""
    seen: list[tuple[str, str]] = []

    def fake(spec: CompileSpec, arch: str, dump_dir=None) -> gi.KernelReport:
        seen.append((spec.kernel, arch))
        return gi.KernelReport(spec.mode, arch, spec.kernel, num_warps=8, registers=168, spill_bytes=0)

    monkeypatch.setattr(gi, "inspect_spec", fake)
    return seen


@pytest.mark.parametrize("arch", ["sm_80", "", "sm_90a,sm_75"])
def test_an_arch_no_survey_kernel_targets_is_a_usage_error(
    no_compiling: list, capsys: pytest.CaptureFixture[str], arch: str
) -> None:
    assert gi.main(["--arch", arch]) == 2
    assert no_compiling == []
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("gluon-survey inspect: --arch")
    assert "the survey's kernels target sm_90a (Blocked, Pipelined, persistent, warpspec" in line
    # the grouped modes: the swap-AB kernel on sm_90 only, the 128-row one (its tcgen05 version) on sm_100 too
    sm_90 = "gemv, grouped, grouped-swapab, grouped-gemv, grouped-auto, triton); sm_100a (Blocked, Pipelined"
    assert sm_90 in line
    assert "slab, gemv, grouped, grouped-gemv, grouped-auto, triton); sm_120a (triton)" in line
    if arch:
        assert f"no survey kernel targets {'sm_80a' if arch == 'sm_80' else 'sm_75a'};" in line
    else:
        assert "no architecture given" in line


@pytest.mark.parametrize("kind", ["a file", "no parent"])
def test_dump_path_is_checked_before_compiling(
    no_compiling: list, tmp_path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    if kind == "a file":
        path = tmp_path / "asm"
        path.write_text("")
    else:
        path = tmp_path / "missing" / "asm"
    assert gi.main(["triton", "--arch", "sm_90a", "--dump", str(path)]) == 2
    assert no_compiling == []
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"gluon-survey inspect: --dump {path}: ")


def test_inspect_shows_progress_and_where_it_dumped(
    no_compiling: list, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    specs = triton_gemm.compile_specs((9, 0), "float16")
    assert gi.main(["triton", "--arch", "sm_90a", "--format", "json", "--dump", str(tmp_path / "asm")]) == 0
    captured = capsys.readouterr()
    assert [r["kernel"] for r in json.loads(captured.out)] == [s.kernel for s in specs]
    err = captured.err.splitlines()
    for i, spec in enumerate(specs, start=1):
        assert f"gluon-survey inspect: [{i}/{len(specs)}] compiling triton sm_90a {spec.kernel}" in err
    where = tmp_path / "asm"
    assert err[-1] == f"gluon-survey inspect: ttgir, ptx and sass of {len(specs)} kernels in {where}"
