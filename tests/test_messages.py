"""The messages a user meets first, on a machine without a GPU: every argument is checked before
the GPU, and a missing GPU is named in one wording (the torch build: `api.describe_torch_cuda`);
and the commands around the timing run say what went wrong where it went wrong (the plot, the
dump directory, a memcpy file), keep every table cell whole in a file, and suggest what was meant.
Each test failed before its message was fixed."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from factories import results_file, row
from gluon_survey import api, ops, registry
from gluon_survey.driver import inspect as gi
from gluon_survey.driver import memcpy, report
from gluon_survey.driver.cli import main
from gluon_survey.launch import CompileSpec

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}


@pytest.fixture
def no_cuda(monkeypatch):
    """A machine whose torch sees no CUDA GPU (also when the tests run on one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(api, "capability", lambda: None)


def _half(*shape):
    return torch.empty(*shape, dtype=torch.float16)


# ------------------------------------------------------------------------------------------------
# The library: arguments first, then the device, and no GPU named as the CLI names it


@pytest.mark.parametrize(
    "call",
    [
        lambda: api.matmul(_half(8, 16), _half(16, 8)),
        lambda: api.matmul(_half(8, 16), _half(16, 8), kernel="Pipelined"),
        lambda: api.explain(_half(8, 16), _half(16, 8)),
        lambda: ops.matmul(_half(8, 16), _half(16, 8)),
        lambda: ops.Linear(16, 8, dtype=torch.float16)(_half(3, 16)),
    ],
    ids=["matmul", "matmul-kernel", "explain", "ops.matmul", "Linear.forward"],
)
def test_cpu_tensors_without_a_gpu_are_told_there_is_none_naming_the_torch_build(no_cuda, call):
    with pytest.raises(ValueError) as caught:
        call()
    message = str(caught.value)
    assert message == (
        f"a is on cpu, but the survey's kernels run on a CUDA GPU and there is none here: "
        f"{api.describe_torch_cuda()}"
    )
    assert f"torch {torch.__version__}" in message and "CUDA not available" in message
    assert ".cuda()" not in message  # it would fail inside torch


def test_cpu_tensors_with_a_gpu_are_told_to_move(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match=re.escape("a is on cpu; move it to the GPU with a.cuda()")):
        api.matmul(_half(8, 16), _half(16, 8))


def _fp8(*shape):
    return torch.empty(*shape, dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: api.matmul(_half(8, 16), _half(16, 8), kernel="bogus"), KeyError, "unknown mode 'bogus'"),
        (lambda: api.explain(_half(8, 16), _half(16, 8), "bogus"), KeyError, "unknown mode 'bogus'"),
        (lambda: ops.matmul(_half(8, 16), _half(16, 8), "bogus"), KeyError, "unknown mode 'bogus'"),
        (
            lambda: api.matmul(_half(8, 16), _half(16, 8), out=_half(8, 9)),
            ValueError,
            re.escape("out has shape (8, 9), expected (8, 8)"),
        ),
        (lambda: api.matmul(_half(8, 16), _half(8, 16)), ValueError, "do not match"),
        (
            lambda: api.matmul(
                _fp8(8, 16),
                _fp8(8, 16).t(),
                kernel="Blocked",
                scale_a=torch.ones(1),
                scale_b=torch.ones(1),
            ),
            TypeError,
            "mode 'Blocked' has no fp8 kernel",
        ),
        (
            lambda: api.matmul(_fp8(8, 16), _fp8(8, 16).t(), scale_a=torch.ones(3), scale_b=torch.ones(1)),
            ValueError,
            "fp8 operands need dequantization scales",
        ),
    ],
    ids=["kernel", "explain-kernel", "operator-kernel", "out-shape", "shapes", "fp8-mode", "fp8-scales"],
)
def test_arguments_are_checked_before_the_device(no_cuda, call, error, message):
    """CPU tensors on a machine without a GPU: the argument's own error, not the missing GPU."""
    with pytest.raises(error, match=message):
        call()


# ------------------------------------------------------------------------------------------------
# The timing command: every option before the GPU


def test_a_named_mode_without_fp8_kernels_is_refused_before_the_gpu(no_cuda, capsys):
    assert main(["Blocked", "--dtype", "fp8"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "gluon-survey: error: --dtype fp8: mode 'Blocked' has no fp8 kernel; fp8 operands run in: "
        + ", ".join(registry.fp8_names())
    )


def test_a_named_mode_without_fp8_still_runs_its_fp16_tasks(sweeps, tmp_path):
    """With fp16 asked as well the mode measures something: its fp8 rows are SKIPPED, as before."""
    assert main(["Blocked", "--dtype", "fp16,fp8", "--results", str(tmp_path / "r.jsonl")]) == 0
    assert len(sweeps) == 1


@pytest.mark.parametrize("kind", ["a file above", "not writable"])
def test_the_results_path_is_checked_with_output_and_plot_before_the_gpu(
    no_cuda, tmp_path, monkeypatch, capsys, kind
):
    if kind == "a file above":
        (tmp_path / "file").write_text("")
        path = tmp_path / "file" / "r.jsonl"
        message = f"--results {path}: {tmp_path / 'file'} is not a directory"
    else:  # what a user without write access to / meets with --results /nodir/r.jsonl
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path else real(p, mode))
        path = tmp_path / "nodir" / "r.jsonl"
        message = f"--results {path}: directory {tmp_path} (to make {tmp_path / 'nodir'} in) is not writable"
    assert main(["torch", "--results", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"gluon-survey: error: {message}"


@pytest.mark.parametrize("option", ["--m", "--n", "--k", "--shapes"])
def test_an_empty_size_option_is_a_usage_error_not_the_default_sweep(no_cuda, capsys, option):
    assert main([option, ""]) == 2
    err = capsys.readouterr().err
    assert f"gluon-survey: error: argument {option}: expected a value, got an empty string" in err
    assert "CUDA" not in err


@pytest.mark.parametrize(
    ("typed", "suggestion"),
    [
        ("lsit", "did you mean `gluon-survey list`?"),
        ("reprot", "did you mean `gluon-survey report`?"),
        ("Pipelind", "did you mean mode Pipelined?"),
        ("torch,warpsepc", "did you mean mode warpspec?"),
    ],
)
def test_an_unknown_mode_suggests_the_closest_subcommand_or_mode(no_cuda, capsys, typed, suggestion):
    assert main([typed]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("gluon-survey: error: unknown mode") and line.endswith(suggestion)


def test_tune_help_shows_its_example_and_update(capsys):
    assert main(["tune", "--help"]) == 0
    out = capsys.readouterr().out
    assert "    gluon-survey tune --shapes llm --dtype fp16,bf16 --b-layout t --name h100 --match H100" in out
    assert "--output src/gluon_survey/tables/h100.json" in out
    assert "`--update` measures only the given shapes and merges them into the table" in out


# ------------------------------------------------------------------------------------------------
# report and compare


def test_a_plot_that_cannot_be_written_is_named_as_the_plot(tmp_path, monkeypatch, capsys):
    path = results_file(tmp_path, [row("Blocked", ms=0.1, config=BLOCKS)])
    plot = tmp_path / "plot.png"

    def denied(results, where, by="mode"):
        raise PermissionError(13, "Permission denied", str(where))

    monkeypatch.setattr(report, "plot", denied)
    assert main(["report", str(path), "--format", "csv", "--plot", str(plot)]) == 1
    err = capsys.readouterr().err
    assert f"gluon-survey: error: cannot write the plot {plot}: Permission denied" in err
    assert "cannot write the report" not in err


def _wide_run(tmp_path):
    """One shape, every Gluon mode a column: far wider than 80 columns."""
    modes = [m.name for m in registry.MODES if m.kind == "gluon"] + ["torch"]
    rows = [row(m, ms=0.1, config=dict(BLOCKS)) for m in modes[:-1]] + [row("torch", ms=0.1)]
    return results_file(tmp_path, rows), modes


def test_report_to_a_file_keeps_every_cell_whole(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")  # what a pipe gets
    path, modes = _wide_run(tmp_path)
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    header = next(line for line in out.splitlines() if "M x N x K" in line)
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")] == ["M x N x K", *modes]
    assert out.count("128x256x64") == len(modes) - 1  # every cell's blocks whole (torch has none)


def test_list_to_a_file_keeps_every_cell_whole(no_cuda, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    for mode in registry.MODES:
        assert mode.summary in out, mode.name


def test_legacy_lines_print_no_zero_blocks_for_an_auto_row_that_ran_cublas(capsys):
    auto = row("auto", K=4096, ms=2.0, config={"mode": "torch", "why": "the rule: cuBLAS"})
    lines = report.format_legacy([auto, row("torch", K=4096, ms=2.0)]).splitlines()
    assert lines[2].startswith("4096, -, -, -, 2.0000, ")
    assert lines[6].startswith("4096, 0, 0, 0, 2.0000, ")  # torch's row, as the original printed it


@pytest.mark.parametrize("flag", [[], ["--fail-on-regression", "5"]])
def test_compare_of_files_with_nothing_in_common_says_so_in_one_line(tmp_path, capsys, flag):
    old = results_file(tmp_path, [row("Blocked", K=k, ms=0.1) for k in (512, 1024, 2048)], "old.jsonl")
    new = results_file(tmp_path, [row("auto", M=16, ms=0.1)], "new.jsonl")
    assert main(["compare", str(old), str(new), *flag]) == 1
    captured = capsys.readouterr()
    assert "missing from NEW" not in captured.out + captured.err
    (line,) = captured.err.splitlines()
    assert line == (
        f"gluon-survey: error: {old} and {new} share no result (no mode, shape, dtype and B layout in "
        "both): OLD has 3 rows (Blocked; fp16 B row; M 8192), NEW 1 rows (auto; fp16 B row; M 16); "
        "nothing to compare"
    )


def _memcpy_file(tmp_path, command="gluon-survey memcpy --dtype bf16 --results memcpy.json"):
    doc = {
        "env": {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "l2_bytes": 50 << 20, "command": command},
        "settings": {"dtype": "bf16", "mib": 8, "datasheet": {"gbps": 3350.0, "source": "datasheet"}},
        "rows": [
            {
                "variant": memcpy.REFERENCE,
                "step": 0,
                "config": "",
                "status": "OK",
                "gbps": 3000.0,
                "best": True,
            },
            {
                "variant": "vector",
                "step": 2,
                "config": "16B x1 w4 per-block",
                "status": "OK",
                "gbps": 3015.0,
                "best": True,
            },
        ],
    }
    path = tmp_path / "memcpy-bf16.json"
    path.write_text(memcpy.format_json(doc))
    return path


@pytest.mark.parametrize("command", ["gluon-survey memcpy --dtype bf16", None])
def test_report_renders_a_memcpy_result(tmp_path, capsys, command):
    path = _memcpy_file(tmp_path, command)
    assert main(["report", str(path), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| 2 | vector | 16B x1 w4 per-block | 3,015 |" in out
    assert main(["report", str(path), "--format", "csv"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"gluon-survey: error: {path} is a `gluon-survey memcpy` result: report renders it with --format "
        "table, markdown, json, without --plot"
    )


def test_compare_names_a_memcpy_result_and_how_to_view_it(tmp_path, capsys):
    path = _memcpy_file(tmp_path)
    assert main(["compare", str(path), str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"gluon-survey: error: {path} is a `gluon-survey memcpy` result, not the JSON Lines of a timing "
        f"run; `gluon-survey report {path}` renders it (--format table, markdown or json)"
    )


def test_report_names_another_commands_json_document(tmp_path, capsys):
    path = tmp_path / "overhead.json"
    path.write_text(json.dumps({"env": {"command": "gluon-survey overhead --m 1"}, "rows": []}, indent=2))
    assert main(["report", str(path)]) == 2
    assert f"{path} is a `gluon-survey overhead` result, not the JSON Lines" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# memcpy: progress on the terminal only


def test_committed_memcpy_reports_hold_no_progress_lines():
    reports = sorted((ROOT / "results" / "h100-memcpy").glob("*.md"))
    assert reports
    for path in reports:
        text = path.read_text()
        assert text.startswith("- GPU: "), path
        assert "gluon-survey memcpy: [" not in text, path


def test_memcpy_progress_stays_out_of_a_redirected_stream(monkeypatch, capsys):
    from gluon_survey.driver import hardware

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hardware, "gpu_info", lambda command: {"name": "NVIDIA H100", "command": command})
    monkeypatch.setattr(memcpy, "setup", lambda dtype, mib, seed: memcpy.Setup(None, None, mib * 512, 1))

    def measure(where, settings, log):
        for n, variant in enumerate(("scalar", "vector"), 1):
            log(f"[{n}/2] {n} {variant}")
            yield memcpy.CopyRow(variant, n, f"config {n}", gbps=1000.0 * n)

    monkeypatch.setattr(memcpy, "measure", measure)
    assert main(["memcpy", "--mib", "8", "--format", "markdown"]) == 0
    out, err = capsys.readouterr()
    assert "| 2 | vector | config 2 | 2,000 |" in out
    assert "[1/2]" not in out + err and "[2/2]" not in out + err


# ------------------------------------------------------------------------------------------------
# inspect: the dump directory, and the fp8 dtypes as the timing command means them


@pytest.fixture
def compiled(monkeypatch) -> list[CompileSpec]:
    """inspect's engine without compiling: every spec 'compiles' to a fixed report; the specs seen."""
    seen: list[CompileSpec] = []

    def compile_spec(spec, arch):
        seen.append(spec)
        return spec

    def report_compiled(spec):
        return gi.KernelReport(spec.mode, "sm_90a", spec.kernel, num_warps=8, registers=168, spill_bytes=0)

    monkeypatch.setattr(gi, "compile_spec", compile_spec)
    monkeypatch.setattr(gi, "report_compiled", report_compiled)
    return seen


def test_a_dump_directory_that_cannot_be_written_is_refused_before_compiling(
    compiled, tmp_path, monkeypatch, capsys
):
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(gi.tempfile, "TemporaryFile", denied)
    assert gi.main(["triton", "--arch", "sm_90a", "--dump", str(tmp_path)]) == 2
    assert compiled == []
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"gluon-survey inspect: --dump {tmp_path}: cannot write in {tmp_path} (Permission denied); "
        "nothing was compiled"
    )


def test_dump_files_that_cannot_be_written_are_not_compile_failures(compiled, tmp_path, monkeypatch, capsys):
    def denied(c, directory):
        raise PermissionError(13, "Permission denied", str(directory / "x.ttgir"))

    monkeypatch.setattr(gi, "dump", denied)
    assert gi.main(["triton", "--arch", "sm_90a", "--format", "json", "--dump", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "error" not in captured.out  # no kernel row made an error, and no "0 kernels"
    assert captured.err.splitlines()[-1] == (
        f"gluon-survey inspect: error: cannot write the files of --dump {tmp_path}: Permission denied "
        f"({tmp_path / 'x.ttgir'}); the kernels compiled, their files were not written"
    )


@pytest.mark.parametrize(("dtype", "scaling", "code"), [("fp8", "tensor", 1), ("fp8-row", "row", 2)])
def test_inspect_fp8_dtypes_mean_what_the_timing_command_means(compiled, capsys, dtype, scaling, code):
    assert gi.main(["Pipelined,triton", "--arch", "sm_90a", "--dtype", dtype, "--format", "json"]) == 0
    assert {spec.mode for spec in compiled} == {"Pipelined", "triton"}
    for spec in compiled:
        assert spec.constexprs["SCALING"] == code, spec.kernel
        assert spec.kernel.endswith(f" scales={scaling}"), spec.kernel
    kernels = [r["kernel"] for r in json.loads(capsys.readouterr().out)]
    assert kernels == [spec.kernel for spec in compiled]
