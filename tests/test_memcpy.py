"""Rung 0, the copy ladder (`kernels/memcpy.py`) and `gluon-survey memcpy` (`driver/memcpy.py`).

compile (no GPU; triton 3.6.0 and, through `make test`, 3.9.0): every config of every step
compiles for sm_90a and sm_100a, with no spills, and its global accesses are as wide as the step
claims: 16-bit only for step 1, 128-bit ones (one per REPS) for steps 2 and 3 beside the masked
tail's 16-bit ones. CPU: the configs, the CLI's checks and messages, the rendering, floor_gbps, the
datasheet table. gpu: every config copies exactly and writes nothing past the end; the command runs
end to end and writes its results file.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from dataclasses import asdict

import pytest
import torch

from gluon_survey.driver import hardware
from gluon_survey.driver import inspect as gs_inspect
from gluon_survey.driver import memcpy as driver
from gluon_survey.driver.cli import main
from gluon_survey.kernels import memcpy
from gluon_survey.launch import Target

DTYPES = ("float16", "bfloat16")
ARCHS = ("sm_90a", "sm_100a")
SPECS = [
    pytest.param(arch, dtype, i, id=f"{arch}-{dtype}-{spec.kernel.replace(' ', '-')}")
    for arch in ARCHS
    for dtype in DTYPES
    for i, spec in enumerate(memcpy.compile_specs((9, 0), dtype))
]

# A global load or store and its modifiers: "LDG.E.128", "STG.E.U16", "LDG.E" (32-bit), ...
_GLOBAL_ACCESS = re.compile(r"\b(?:LDG|STG)(?:\.[A-Z0-9_]+)*")
_WIDTHS = {".128": 128, ".64": 64, ".U16": 16, ".S16": 16, ".U8": 8, ".S8": 8}


def access_widths(sass: str) -> dict[str, Counter[int]]:
    """{"LDG": Counter(bits), "STG": ...} over the SASS's global loads and stores (32 bits when
    the opcode names no width)."""
    found: dict[str, Counter[int]] = {"LDG": Counter(), "STG": Counter()}
    for m in _GLOBAL_ACCESS.finditer(sass):
        op = m.group(0)
        modifiers = re.findall(r"\.[A-Z0-9_]+", op)
        bits = next((_WIDTHS[mod] for mod in modifiers if mod in _WIDTHS), 32)
        found[op.split(".", 1)[0]][bits] += 1
    return found


@functools.cache
def compiled(arch: str, dtype: str, index: int):
    """(spec, inspect report, access widths) of one spec, compiled once per session through the
    inspect engine (`compile_spec`, `report_compiled`, `disassemble`)."""
    spec = memcpy.compile_specs((9, 0), dtype)[index]
    kernel = gs_inspect.compile_spec(spec, arch)
    return spec, gs_inspect.report_compiled(kernel), access_widths(gs_inspect.disassemble(kernel.cubin))


def test_access_widths_reads_the_opcodes():
    sass = """
        /*0100*/  @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0110*/  @P1 LDG.E.U16 R9, desc[UR4][R6.64] ;
        /*0120*/  STG.E.128 desc[UR4][R10.64], R4 ;
        /*0130*/  STG.E desc[UR4][R10.64], R4 ;
    """
    widths = access_widths(sass)
    assert widths["LDG"] == Counter({128: 1, 16: 1}) and widths["STG"] == Counter({128: 1, 32: 1})


# ------------------------------------------------------------------------------------------------
# compile: the SASS of every step


@pytest.mark.compile
@pytest.mark.parametrize(("arch", "dtype", "index"), SPECS)
def test_no_spills(arch, dtype, index):
    spec, r, _ = compiled(arch, dtype, index)
    assert r.error is None, r.error
    assert r.count("LDL") == 0 and r.count("STL") == 0, f"local-memory traffic (spills) in {spec.kernel}"
    assert r.spill_bytes == 0 and r.stack_bytes == 0
    assert r.num_warps == spec.config.num_warps


@pytest.mark.compile
@pytest.mark.parametrize(("arch", "dtype", "index"), [p for p in SPECS if p.values[2] == 0])
def test_step_1_moves_one_16_bit_element_per_instruction(arch, dtype, index):
    spec, _, widths = compiled(arch, dtype, index)
    assert spec.kernel.startswith("1 scalar"), spec.kernel
    for op in ("LDG", "STG"):
        assert set(widths[op]) == {16}, f"{op} widths of {spec.kernel}: {widths[op]}"


@pytest.mark.compile
@pytest.mark.parametrize(("arch", "dtype", "index"), [p for p in SPECS if p.values[2] > 0])
def test_steps_2_and_3_move_128_bit_vectors(arch, dtype, index):
    """One 128-bit load and store per REPS in the unmasked path; the only other accesses are the
    masked tail's, one element each (this compile does not know that n is a multiple of 16)."""
    spec, _, widths = compiled(arch, dtype, index)
    for op in ("LDG", "STG"):
        assert widths[op][128] == spec.config.reps, f"{op} widths of {spec.kernel}: {widths[op]}"
        assert set(widths[op]) <= {128, 16}, f"{op} widths of {spec.kernel}: {widths[op]}"


# ------------------------------------------------------------------------------------------------
# CPU: configs and variants


def test_the_ladder_has_three_steps_and_a_small_search():
    assert [(v.step, v.name) for v in memcpy.VARIANTS] == [(1, "scalar"), (2, "vector"), (3, "search")]
    search = memcpy.search_configs(2)
    assert len(search) == 12 == len(set(search))
    assert search[0] == memcpy.VARIANTS[1].configs(2)[0], "the search starts from step 2's config"
    assert {c.size_per_thread for c in search} == {8}
    assert {(c.reps, c.num_warps, c.persistent) for c in search} == {
        (r, w, p) for r in (1, 2, 4) for w in (4, 8) for p in (False, True)
    }


@pytest.mark.parametrize(("size", "vector"), [(1, 16), (2, 8), (4, 4), (8, 2), (16, 1)])
def test_a_vector_is_16_bytes(size, vector):
    assert memcpy.vector_elements(size) == vector
    assert memcpy.VARIANTS[0].configs(size)[0].size_per_thread == 1
    assert memcpy.VARIANTS[1].configs(size)[0].size_per_thread == vector


def test_config_block_grid_and_label():
    scalar = memcpy.CopyConfig(1)
    assert scalar.block == 128 and scalar.label(2) == "2B x1 w4 per-block"
    assert scalar.grid(1000, 132) == 8  # ceil(1000 / 128): one program per block
    wide = memcpy.CopyConfig(8, reps=4, num_warps=8, persistent=True)
    assert wide.block == 8 * 32 * 8 * 4 and wide.label(2) == "16B x4 w8 persistent"
    assert wide.grid(1 << 30, 132) == 132 * 8  # a wave: 64 warp slots / 8 warps per program per SM
    assert wide.grid(1000, 132) == 1  # never more programs than blocks
    assert wide.kernel is memcpy.copy_persistent_kernel and scalar.kernel is memcpy.copy_kernel


def test_compile_specs_cover_every_config_of_every_step():
    specs = memcpy.compile_specs((9, 0), "bfloat16")
    assert len(specs) == 1 + 1 + 12
    assert [s.kernel.split()[0] for s in specs] == ["1", "2"] + ["3"] * 12
    assert all(s.signature["src"] == "*bf16" and s.options["num_warps"] == s.config.num_warps for s in specs)


def test_prepare_refuses_buffers_it_cannot_copy():
    a, b = torch.zeros(16, dtype=torch.float16), torch.zeros(8, dtype=torch.float16)
    with pytest.raises(ValueError, match="differ"):
        memcpy.check_buffers(a, b)
    with pytest.raises(ValueError, match="CUDA"):
        memcpy.prepare(a, a.clone(), memcpy.CopyConfig(8), Target((9, 0), 132))


# ------------------------------------------------------------------------------------------------
# CPU: the datasheet table


@pytest.mark.parametrize(
    ("name", "gbps"),
    [
        ("NVIDIA H100 80GB HBM3", 3350.0),
        ("NVIDIA H100 PCIe", 2000.0),
        ("NVIDIA H200", 4800.0),
        ("NVIDIA B200", 8000.0),
        ("NVIDIA GB200", 8000.0),
        ("NVIDIA A100-SXM4-80GB", 2039.0),
        ("NVIDIA A100 80GB PCIe", 1935.0),
    ],
)
def test_datasheet_bandwidths(name, gbps):
    value, source = hardware.memory_bandwidth_gbps(name)
    assert value == gbps and "datasheet" in source


@pytest.mark.parametrize("name", [None, "", "NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-40GB"])
def test_unknown_gpus_have_no_datasheet_bandwidth(name):
    value, source = hardware.memory_bandwidth_gbps(name)
    assert value is None and ("unknown GPU" in source or "no GPU" in source)


# ------------------------------------------------------------------------------------------------
# CPU: the command without a GPU


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_help(capsys):
    assert main(["memcpy", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gluon-survey memcpy")
    for text in (
        "--mib",
        "--dtype {fp16,bf16}",
        "--warmup-ms",
        "--min-ms",
        "--format",
        "--results",
        "floor_gbps",
    ):
        assert text in out


def test_without_a_gpu_it_says_so_and_exits_2(no_cuda, capsys):
    assert main(["memcpy", "--mib", "64"]) == 2
    err = capsys.readouterr().err
    assert "gluon-survey memcpy: needs a CUDA GPU" in err and "torch.cuda.is_available()" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mib", "0"], "expected a whole number > 0"),
        (["--mib", "lots"], "expected a whole number > 0"),
        (["--mib", "5000"], "more than the kernels'"),
        (["--dtype", "fp32"], "invalid choice"),
        (["--format", "csv"], "invalid choice"),
        (["--min-ms", "0"], "expected a number > 0"),
        (["--warmup-ms", "-1"], "expected a number >= 0"),
        (["--output", "/no/such/dir/report.md"], "does not exist"),
        (["--results", "/no/such/dir/memcpy.json"], "does not exist"),
    ],
)
def test_usage_errors_exit_2_before_the_gpu_is_asked(no_cuda, capsys, argv, message):
    assert main(["memcpy", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "needs a CUDA GPU" not in err


def test_an_existing_results_file_is_refused(no_cuda, tmp_path, capsys):
    path = tmp_path / "memcpy.json"
    path.write_text("{}")
    assert main(["memcpy", "--results", str(path)]) == 2
    assert "exists" in capsys.readouterr().err and path.read_text() == "{}"


# ------------------------------------------------------------------------------------------------
# CPU: rendering and the floor, on fabricated rows


def fabricated_rows(failed_vector: bool = False) -> list[driver.CopyRow]:
    rows = [
        driver.CopyRow(driver.REFERENCE, 0, "", gbps=3000.0, spread=0.01),
        driver.CopyRow("scalar", 1, "2B x1 w4 per-block", gbps=1500.0, spread=0.08),
        driver.CopyRow("vector", 2, "16B x1 w4 per-block", gbps=2700.0, spread=0.01),
        driver.CopyRow("search", 3, "16B x1 w4 per-block", gbps=2700.0, spread=0.01),
        driver.CopyRow("search", 3, "16B x4 w8 persistent", gbps=3100.0, spread=0.02),
        driver.CopyRow("search", 3, "16B x2 w8 per-block", status="FAILED", error="copy 0 differs"),
    ]
    if failed_vector:
        rows[2] = driver.CopyRow("vector", 2, "16B x1 w4 per-block", status="FAILED", error="boom")
    return rows


def fabricated_doc(gpu: str = "NVIDIA H100 80GB HBM3", rows=None) -> dict:
    rows = fabricated_rows() if rows is None else rows
    gbps, source = hardware.memory_bandwidth_gbps(gpu)
    driver.mark_best(rows)
    driver.attach_fractions(rows, gbps)
    return {
        "env": {
            "name": gpu,
            "sm_count": 132,
            "l2_bytes": 50 << 20,
            "torch": "t",
            "triton": "3.6.0",
            "cuda": "13",
        },
        "settings": {
            "dtype": "fp16",
            "mib": 1024,
            "elements": 1 << 29,
            "timer": driver.TIMER,
            "min_ms": 1000.0,
            "warmup_ms": 2000.0,
            "l2": "cold",
            "check": driver.CHECK,
            "datasheet": {"gbps": gbps, "source": source},
        },
        "rows": [asdict(r) for r in rows],
    }


def test_best_and_fractions():
    rows = fabricated_rows()
    driver.mark_best(rows)
    driver.attach_fractions(rows, 3350.0)
    assert [r.config for r in rows if r.best] == [
        "",
        "2B x1 w4 per-block",
        "16B x1 w4 per-block",
        "16B x4 w8 persistent",
    ]
    best = rows[4]
    assert best.x_copy == pytest.approx(3100 / 3000) and best.of_datasheet == pytest.approx(3100 / 3350)
    assert rows[5].x_copy is None and rows[5].of_datasheet is None


def test_fractions_without_a_reference_or_a_datasheet():
    rows = fabricated_rows()[1:]
    driver.attach_fractions(rows, None)
    assert all(r.x_copy is None and r.of_datasheet is None for r in rows)


def test_markdown_shows_the_ladder_the_search_and_the_failures():
    text = driver.format_markdown(fabricated_doc())
    ladder = text.split("| step |")[1].split("\n\n")[0]
    assert "| 1 | scalar | 2B x1 w4 per-block | 1,500 | 0.50x | 45% | 8.0% ~ |" in ladder
    assert "| 3 | search | 16B x4 w8 persistent (best of 3) | 3,100 | 1.03x | 93% | 2.0% |" in ladder
    assert "| - | Tensor.copy_ | - | 3,000 | 1.00x | 90% | 1.0% |" in ladder
    assert "| * 16B x4 w8 persistent | 3,100 |" in text
    assert "| 16B x2 w8 per-block | FAILED | - | - | - |" in text
    assert "- FAILED search 16B x2 w8 per-block: copy 0 differs" in text
    assert "- Datasheet: 3,350 GB/s (NVIDIA H100 SXM datasheet, 3.35 TB/s)" in text


def test_a_failed_step_is_shown_failed_not_timed():
    text = driver.format_markdown(fabricated_doc(rows=fabricated_rows(failed_vector=True)))
    assert "| 2 | vector | 16B x1 w4 per-block | FAILED | - | - | - |" in text


def test_an_unknown_gpu_is_said_and_leaves_the_datasheet_column_empty():
    text = driver.format_markdown(fabricated_doc("NVIDIA GeForce RTX 4090"))
    assert "Datasheet: unknown GPU 'NVIDIA GeForce RTX 4090': no datasheet bandwidth" in text
    assert "| 3 | search | 16B x4 w8 persistent (best of 3) | 3,100 | 1.03x | - | 2.0% |" in text


def test_table_and_json_rendering(tmp_path, capsys):
    doc = fabricated_doc()
    driver.render(doc, "table", tmp_path / "table.txt")
    table = (tmp_path / "table.txt").read_text()
    for text in ("memory roofline: fp16, 1024 MiB per copy", "16B x4 w8 persistent (best of 3)", "3,100"):
        assert text in table
    assert "FAILED search 16B x2 w8 per-block: copy 0 differs" in table
    driver.render(doc, "json")
    assert json.loads(capsys.readouterr().out) == doc
    with pytest.raises(ValueError, match="unknown format"):
        driver.render(doc, "csv")


def test_floor_gbps_is_the_best_measured_copy(tmp_path):
    rows = fabricated_rows()
    assert driver.floor_gbps(rows) == 3100.0
    assert driver.floor_gbps([asdict(r) for r in rows]) == 3100.0
    path = tmp_path / "memcpy.json"
    path.write_text(driver.format_json(fabricated_doc()))
    assert driver.floor_gbps(path) == driver.floor_gbps(str(path)) == 3100.0
    faster_reference = [driver.CopyRow(driver.REFERENCE, 0, "", gbps=3200.0), *rows[1:]]
    assert driver.floor_gbps(faster_reference) == 3200.0, "Tensor.copy_ counts too"
    with pytest.raises(ValueError, match="no measured copy"):
        driver.floor_gbps([r for r in rows if r.status == "FAILED"])
    (tmp_path / "other.json").write_text("[]")
    with pytest.raises(ValueError, match="not a"):
        driver.floor_gbps(tmp_path / "other.json")


def test_a_mismatch_names_where_the_copy_differs():
    src = torch.arange(8, dtype=torch.float16)
    dst = src.clone()
    buffers = driver.Buffers([src], [dst])
    assert buffers.mismatch(0) is None
    dst[5:] = float("nan")
    assert buffers.mismatch(0) == "copy 0 differs from its source at 3 elements, the first at 5"


def test_the_command_end_to_end_with_a_fake_measurement(monkeypatch, tmp_path, capsys):
    """The plumbing around the GPU: report, results file, exit status 1 for a FAILED row."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hardware, "gpu_info", lambda command: {"name": "NVIDIA H200", "command": command})
    monkeypatch.setattr(driver, "setup", lambda dtype, mib, seed: driver.Setup(None, None, mib * 512, 1))
    monkeypatch.setattr(driver, "measure", lambda where, settings, log: iter(fabricated_rows()))
    path = tmp_path / "memcpy.json"
    argv = ["memcpy", "--mib", "8", "--min-ms", "50", "--format", "markdown", "--results", str(path)]
    assert main(argv) == 1  # one config of the search FAILED
    out, err = capsys.readouterr()
    assert "| 3 | search | 16B x4 w8 persistent (best of 3) | 3,100 | 1.03x | 65% |" in out
    doc = json.loads(path.read_text())
    assert doc["env"][
        "command"
    ] == "gluon-survey memcpy --mib 8 --min-ms 50 --format markdown --results " + str(path)
    assert doc["settings"]["datasheet"]["gbps"] == 4800.0 and doc["settings"]["min_ms"] == 50.0
    assert doc["settings"]["elements"] == 8 * 512 and doc["settings"]["bytes_per_call"] == 2 * 8 << 20
    assert driver.floor_gbps(path) == 3100.0 and f"results in {path}" in err


# ------------------------------------------------------------------------------------------------
# gpu


def _all_configs(element_size: int):
    return [(v, cfg) for v in memcpy.VARIANTS for cfg in v.configs(element_size)]


@pytest.fixture(scope="module")
def target():
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return Target((props.major, props.minor), props.multi_processor_count)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("numel", [1, 1000, 2**20 + 3])
def test_every_config_copies_exactly(target, dtype, numel):
    """Into a NaN-poisoned destination that is followed by a NaN guard the copy must not touch."""
    guard = 4096
    src = torch.randn(numel, device="cuda", dtype=dtype)
    for variant, cfg in _all_configs(src.element_size()):
        out = torch.full((numel + guard,), float("nan"), device="cuda", dtype=dtype)
        memcpy.prepare(src, out[:numel], cfg, target).fn()
        torch.cuda.synchronize()
        where = f"{variant.step} {variant.name} {cfg.label(src.element_size())}"
        assert torch.equal(out[:numel], src), where
        assert out[numel:].isnan().all(), f"{where} wrote past the end"


@pytest.mark.gpu
def test_a_misaligned_buffer_is_refused(target):
    src = torch.randn(1025, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="16-byte boundary"):
        memcpy.prepare(src[1:], torch.empty_like(src[1:]), memcpy.CopyConfig(8), target)


@pytest.mark.gpu
def test_the_command_runs_end_to_end(tmp_path, capsys):
    path = tmp_path / "memcpy.json"
    argv = ["memcpy", "--mib", "64", "--min-ms", "50", "--warmup-ms", "50", "--results", str(path)]
    assert main(argv) == 0, capsys.readouterr().err
    doc = driver.load(path)
    rows = doc["rows"]
    assert [r["step"] for r in rows] == [0, 1, 2] + [3] * 12
    assert all(r["status"] == "OK" and r["gbps"] > 0 for r in rows)
    assert sum(r["best"] for r in rows if r["step"] == 3) == 1
    assert doc["env"]["name"] and doc["settings"]["mib"] == 64
    floor = driver.floor_gbps(path)
    assert floor == max(r["gbps"] for r in rows)
    peak = doc["settings"]["datasheet"]["gbps"]
    assert peak is None or floor < 1.05 * peak, "faster than the datasheet: a timing error"
