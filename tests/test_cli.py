import re
import shlex
import subprocess
import sys
import types

import pytest
import torch

import fakes
from factories import results, results_file, row
from gluon_survey import api, registry
from gluon_survey.driver.cli import main
from gluon_survey.driver.results import ResultsWriter, load
from gluon_survey.driver.settings import DEFAULTS


@pytest.fixture
def no_cuda(monkeypatch):
    """This machine, as the CLI sees it, has no CUDA GPU (also when the tests run on one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(api, "capability", lambda: None)


def test_help_works_without_a_gpu(no_cuda, capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "usage: gluon-survey [MODES] [options] | "
        "gluon-survey {list,compare,report,inspect,memcpy,overhead,tune,model}"
    )
    for text in (
        "--dtype",
        "--shapes llm|llm-dense|llm-train|holdout|moe|FILE.csv",
        "--b-layout",
        "--a-layout",
        "--peak-tflops",
        "compare OLD NEW",
    ):
        assert text in out
    for sub in ("list", "compare", "report", "inspect", "memcpy", "overhead", "tune", "model"):
        assert main([sub, "--help"]) == 0


def test_python_dash_m_entry_point():
    done = subprocess.run([sys.executable, "-m", "gluon_survey", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "usage: gluon-survey" in done.stdout


def test_no_gpu_is_one_clear_message_and_exit_2(no_cuda, capsys):
    assert main(["Blocked,torch"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert "timing needs a CUDA GPU that torch can use (torch.cuda.is_available())" in line
    assert f"found torch {torch.__version__}" in line and "CUDA not available" in line
    assert "`gluon-survey list` and `gluon-survey inspect` work without a GPU" in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["Blocked,nope"], "unknown mode 'nope'; valid modes: Blocked, Pipelined, persistent, warpspec"),
        (["--dtype", "fp32"], "--dtype: expected a comma list of fp16, bf16"),
        (["--b-layout", "col"], "--b-layout: expected a comma list of row, t"),
        (["--k", "1:2:3:4"], "--k '1:2:3:4': expected a size, a start:stop (doubling) or a start:stop:step"),
        (["--shapes", "llm", "--m", "1"], "use either --shapes or --m/--n/--k"),
        (["--interleave", "--no-paired"], "drop --no-paired or --interleave"),
        (["--interleave", "--gpu-time"], "--gpu-time back to back on the GPU: choose one of them"),
    ],
)
def test_usage_errors_exit_2_before_touching_the_gpu(no_cuda, capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_unknown_option_exits_2(capsys):
    assert main(["--bogus"]) == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_existing_results_file_is_refused(no_cuda, tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text("")
    assert main(["torch", "--results", str(path)]) == 2
    assert "exists" in capsys.readouterr().err


def test_list_without_gpu(no_cuda, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "300")  # one table line per mode
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in registry.names():
        assert name in out
    assert out.count("no: no CUDA GPU") == len(registry.MODES)


def test_list_asks_each_mode_about_this_gpu(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setattr(api, "capability", lambda: (9, 0))

    def unsupported_reason(self, capability):
        assert capability == (9, 0)
        return "needs sm_100" if self.name == "Blocked" else None

    monkeypatch.setattr(registry.Mode, "unsupported_reason", unsupported_reason)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "no: needs sm_100" in out and out.count("yes") == len(registry.MODES) - 1


def test_inspect_is_handed_its_arguments(monkeypatch):
    seen = []
    fake = types.SimpleNamespace(main=lambda argv: seen.append(list(argv)) or 7)
    monkeypatch.setitem(sys.modules, "gluon_survey.driver.inspect", fake)
    monkeypatch.setattr("gluon_survey.driver.inspect", fake, raising=False)
    assert main(["inspect", "triton", "--arch", "sm_90a"]) == 7
    assert seen == [["triton", "--arch", "sm_90a"]]


def test_report_subcommand_rerenders_aresults_file(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    sample = results([row("Blocked", ms=0.1), row("torch", ms=0.08)])
    with ResultsWriter(path, sample.header) as writer:
        for r in sample.rows:
            writer.append(r)
    assert main(["report", str(path), "--format", "csv"]) == 0
    assert "Blocked,8192,8192,512,fp16,row,OK" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2


def test_report_plots_a_shapes_run_per_weight_on_request(tmp_path, monkeypatch, capsys):
    from gluon_survey.driver import report

    sample = results([row(mode, M=m, ms=ms) for m in (1, 16) for mode, ms in (("auto", 0.1), ("torch", 0.2))])
    sample.header["settings"] = {**sample.settings, "shapes": "--shapes llm-dense"}
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path, sample.header) as writer:
        for r in sample.rows:
            writer.append(r)
    drawn = []
    for name in ("plot_by_m", "plot_by_weight"):
        monkeypatch.setattr(report, name, lambda results, plot, name=name: drawn.append(name) or 1)
    assert main(["report", str(path), "--plot", str(tmp_path / "p.png")]) == 0
    assert main(["report", str(path), "--plot", str(tmp_path / "p.png"), "--plot-by", "weight"]) == 0
    assert drawn == ["plot_by_m", "plot_by_weight"]
    assert main(["report", str(path), "--plot", str(tmp_path / "p.png"), "--plot-by", "shape"]) == 2
    assert "--plot-by: invalid choice: 'shape'" in capsys.readouterr().err


@pytest.fixture
def fake_modes(monkeypatch):
    """The CLI in this process with the fake modes of `fakes.py` (CPU, crash, hang) installed."""
    fakes.install(monkeypatch.setattr)


@pytest.mark.timeout(120)
def test_a_timing_run_end_to_end_on_cpu(tmp_path, fake_modes, capsys):
    path, plot = tmp_path / "r.jsonl", tmp_path / "r.png"
    argv = shlex.split("_OK_CPU --m 32 --n 40 --k 64:128:64 --dtype bf16 --b-layout t --seed 3")
    argv += shlex.split("--warmup-ms 2 --min-ms 5 --format legacy --peak-tflops 1000")
    argv += ["--results", str(path), "--plot", str(plot)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[:2] == [
        "Mode: _ok_cpu (bf16, B t, M=32, N=40)",
        "K, BLOCK_M, BLOCK_N, BLOCK_K, ms, TFLOPs/sec",
    ]
    assert all(re.fullmatch(r"(64|128), 16, 32, 64, \d+\.\d{4}, \d+\.\d{2}", line) for line in lines[2:4])
    assert lines[4:] == [""]
    assert captured.err.splitlines()[-1] == f"gluon-survey: results in {path}"
    saved = load(path)
    assert saved.settings["seed"] == 3
    assert saved.settings["paired"] is True and saved.settings["timer"] == "host wall clock"
    assert saved.settings["queued"] is False and all(r.starved is None for r in saved.rows)
    # paired by default: `rounds`, and more, up to `noisy_rounds`, where the wall clock spread
    rounds = (saved.settings["rounds"], saved.settings["noisy_rounds"])
    assert rounds == (DEFAULTS.rounds, DEFAULTS.noisy_rounds)
    assert all(rounds[0] <= len(r.x_rounds) <= rounds[1] for r in saved.rows)
    # interleaved or alternating by each cell's call length, and each row says which
    assert saved.settings["interleave"] is None and all(isinstance(r.interleaved, bool) for r in saved.rows)
    assert saved.settings["peaks"]["bf16"] == {"tflops": 1000.0, "source": "--peak-tflops"}
    assert saved.env["command"] == shlex.join(["gluon-survey", *argv])
    assert saved.env["torch"] == torch.__version__
    assert [(r.K, r.status) for r in saved.rows] == [(64, "OK"), (128, "OK")]
    assert {(r.dtype, r.b_layout) for r in saved.rows} == {("bf16", "t")}
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(120)
def test_gpu_time_flows_from_the_command_line_to_the_timer_the_header_and_the_report(
    tmp_path, fake_modes, capsys
):
    path = tmp_path / "r.jsonl"
    argv = shlex.split("_ok_cpu --m 32 --n 40 --k 64 --warmup-ms 2 --min-ms 5 --gpu-time --format markdown")
    assert main([*argv, "--results", str(path)]) == 0
    saved = load(path)
    assert saved.settings["queued"] is True
    assert saved.settings["timer"].startswith("host wall clock; GPU time (queued): a sleep kernel")
    (r,) = saved.rows
    # the worker timed it queued (on the wall clock, with no queue to keep ahead, every call counts)
    assert r.starved == r.n_iters and r.cublas_starved > 0
    assert r.interleaved is False  # queued timing keeps alternating windows, whatever the call's length
    assert r.gbps == pytest.approx((32 * 64 + 64 * 40 + 32 * 40) * 2 / (r.ms_median * 1e-3) / 1e9)
    out = capsys.readouterr().out
    assert "#### fp16, B row, GPU time (queued)" in out and f"{r.gbps:.0f} GB/s" in out
    assert (
        f"_ok_cpu on 32x40x64: the host fell behind the GPU in {r.starved} of its {r.n_iters} timed calls"
        in out
    )


@pytest.mark.timeout(120)
def test_a_failing_mode_exits_1_and_still_names_theresults_file(tmp_path, fake_modes, capsys):
    path = tmp_path / "r.jsonl"
    argv = ["_crash", "--m", "32", "--n", "40", "--k", "64", "--results", str(path), "--format", "csv"]
    assert main(argv) == 1
    (crashed,) = load(path).rows
    assert crashed.status == "ERROR" and "SIGABRT" in crashed.error
    assert capsys.readouterr().err.splitlines()[-1] == f"gluon-survey: results in {path}"


# ------------------------------------------------------------------------------------------------
# CLI defects (each of these failed before the fix)


def test_the_readme_k_range_doubles(sweeps, tmp_path, capsys):
    assert main(["torch", "--k", "512:16384", "--results", str(tmp_path / "r.jsonl")]) == 0
    ((modes, tasks, *_), _) = sweeps[0]
    assert modes == ["torch"]
    assert [t.shape.K for t in tasks] == [512, 1024, 2048, 4096, 8192, 16384]
    assert f"results in {tmp_path / 'r.jsonl'}" in capsys.readouterr().err


def test_the_default_k_sweep_is_written_as_a_doubling_range(sweeps, tmp_path):
    path = tmp_path / "r.jsonl"
    assert main(["torch", "--results", str(path)]) == 0
    ((_, tasks, *_), _) = sweeps[0]
    assert [t.shape.K for t in tasks] == [512, 1024, 2048, 4096, 8192, 16384]
    assert load(path).settings["shapes"] == "--m 8192 --n 8192 --k 512:16384"


def test_a_doubling_range_must_end_on_a_power_of_two_multiple(no_cuda, capsys):
    assert main(["--k", "512:1000"]) == 2
    assert "--k '512:1000': 1000 is not 512 times a power of 2" in capsys.readouterr().err


def test_version(capsys):
    import gluon_survey

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"gluon-survey {gluon_survey.__version__}\n"


def test_no_gpu_message_says_which_gpus_run_which_modes(no_cuda, capsys):
    assert main(["Blocked"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert registry.supported_summary() in line


@pytest.mark.parametrize(
    ("option", "name", "message"),
    [
        ("--plot", "plot.txt", "--plot {}: expected a .png, .svg or .pdf file"),
        ("--plot", "missing/plot.png", "--plot {}: directory {} does not exist"),
        ("--output", "missing/table.md", "--output {}: directory {} does not exist"),
        ("--output", ".", "--output {}: is a directory"),
    ],
)
def test_bad_output_paths_are_usage_errors_before_any_worker_runs(
    sweeps, tmp_path, capsys, option, name, message
):
    path = tmp_path / name
    argv = ["torch", option, str(path), "--results", str(tmp_path / "r.jsonl")]
    assert main(argv) == 2
    assert sweeps == [] and not (tmp_path / "r.jsonl").exists()
    (line,) = capsys.readouterr().err.splitlines()
    assert message.format(path, path.parent) in line


@pytest.mark.parametrize(
    ("option", "name"), [("--output", "missing/table.md"), ("--plot", "plot.jpeg"), ("--output", ".")]
)
def test_report_answers_a_bad_path_in_one_line(tmp_path, capsys, option, name):
    path = results_file(tmp_path, [row("Blocked", ms=0.1)])
    assert main(["report", str(path), option, str(tmp_path / name)]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith(f"gluon-survey: error: {option} ") and captured.out == ""


def test_report_says_when_a_write_fails(tmp_path, monkeypatch, capsys):
    from gluon_survey.driver import report

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "render", full_disk)
    path = results_file(tmp_path, [row("Blocked", ms=0.1)])
    assert main(["report", str(path), "--output", str(tmp_path / "t.md")]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert "cannot write the report" in line and "No space left on device" in line


def test_a_timing_run_names_its_results_file_when_the_report_cannot_be_written(
    sweeps, tmp_path, monkeypatch, capsys
):
    from gluon_survey.driver import report

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "render", full_disk)
    path = tmp_path / "r.jsonl"
    assert main(["torch", "--results", str(path), "--output", str(tmp_path / "t.md")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert f"gluon-survey: error: cannot write the report {tmp_path / 't.md'}: No space left on device" in err
    assert err[-1] == f"gluon-survey: results in {path}"


def test_a_timing_run_names_its_results_file_when_the_sweep_breaks(tmp_path, monkeypatch, capsys):
    from gluon_survey.driver import cli, runner

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the driver")

    monkeypatch.setattr(cli, "_cuda_available", lambda: True)
    monkeypatch.setattr(runner, "run_sweep", broken)
    path = tmp_path / "r.jsonl"
    with pytest.raises(RuntimeError, match="a bug in the driver"):
        main(["torch", "--results", str(path)])
    assert capsys.readouterr().err.splitlines()[-1] == f"gluon-survey: results in {path}"


def test_report_on_a_file_without_rows_says_so(tmp_path, capsys):
    path = results_file(tmp_path, [])
    assert main(["report", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"gluon-survey: {path} has no rows" in captured.err


def test_report_warns_about_a_truncated_last_line(tmp_path, capsys):
    path = results_file(tmp_path, [row("Blocked", ms=0.1)])
    with path.open("a") as f:
        f.write('{"record": "row", "mode": "Bl')  # the writer was killed mid-line
    assert main(["report", str(path), "--format", "csv"]) == 0
    captured = capsys.readouterr()
    assert f"gluon-survey: warning: {path}:3: skipped a truncated last line" in captured.err
    assert "Blocked,8192,8192,512,fp16,row,OK" in captured.out


def test_compare_fails_when_the_new_run_lacks_results_of_the_old(tmp_path, capsys):
    old = results_file(tmp_path, [row(ms=0.1), row(K=1024, ms=0.2)], "old.jsonl")
    new = results_file(tmp_path, [row(ms=0.1)], "new.jsonl")
    empty = results_file(tmp_path, [], "empty.jsonl")  # a run that crashed before its first row
    assert main(["compare", str(old), str(new), "--fail-on-regression", "5"]) == 1
    err = capsys.readouterr().err
    assert "regression: Blocked 8192x8192x1024 fp16 B=row: missing from NEW" in err
    assert "8192x8192x512" not in err
    assert main(["compare", str(old), str(empty), "--fail-on-regression", "5"]) == 1
    (line,) = capsys.readouterr().err.splitlines()  # nothing in common: one line, not one per row
    assert f"{old} and {empty} share no result" in line and "NEW no rows" in line
    assert main(["compare", str(old), str(new)]) == 0  # without the flag: reported, not failed
    assert "missing from NEW" in capsys.readouterr().out


def test_compare_rejects_a_negative_threshold(tmp_path, capsys):
    old = results_file(tmp_path, [row(ms=0.1)], "old.jsonl")
    assert main(["compare", str(old), str(old), "--fail-on-regression", "-5"]) == 2
    assert "expected a number >= 0" in capsys.readouterr().err


def _wide_comparison():
    old = [row("torch.compile", K=16384, ms=4.0), row("Pipelined", K=16384, status="FAILED", error="x")]
    new = [row("torch.compile", K=16384, ms=4.4), row("Pipelined", K=16384, ms=4.0)]
    old += [row("warpspec", K=16384, ms=4.0)]
    new += [row("warpspec", K=16384, status="TIMEOUT", error="no result within 600 s")]
    return results(old), results(new)


def _assert_shapes_intact(text, n_rows):
    lines = [line for line in text.splitlines() if "8192x" in line]
    assert len(lines) == n_rows, text
    assert all("8192x8192x16384" in line for line in lines), text
    assert max(map(len, text.splitlines())) <= 80


@pytest.mark.parametrize("width", [80, None], ids=["80-columns", "not-a-terminal"])
def test_compare_keeps_the_shape_column_readable(monkeypatch, width):
    import io

    from rich.console import Console

    from gluon_survey.driver import report
    from gluon_survey.driver import results as results_module

    monkeypatch.delenv("COLUMNS", raising=False)
    old, new = _wide_comparison()
    buf = io.StringIO()
    console = Console(file=buf, width=width)
    assert not console.is_terminal
    report.print_comparison(old, new, results_module.compare(old.rows, new.rows), console)
    _assert_shapes_intact(buf.getvalue(), 3)


def test_compare_piped_keeps_the_shape_column_readable(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("COLUMNS", raising=False)
    old, new = _wide_comparison()
    paths = []
    for name, sample in (("old.jsonl", old), ("new.jsonl", new)):
        paths.append(results_file(tmp_path, sample.rows, name))
    assert main(["compare", *map(str, paths)]) == 0
    _assert_shapes_intact(capsys.readouterr().out, 3)


# ------------------------------------------------------------------------------------------------
# --dtype fp8 and fp8-row


def _tasks_of(sweeps):
    ((_, tasks, *_), _) = sweeps[-1]
    return [(t.dtype, t.b_layout, t.shape.K) for t in tasks]


def test_fp8_dtypes_default_to_the_t_layout_and_fp16_keeps_row(sweeps, tmp_path):
    path = tmp_path / "r.jsonl"
    argv = ["torch", "--dtype", "fp16,FP8,fp8-row", "--k", "512,1024", "--results", str(path)]
    assert main(argv) == 0
    assert _tasks_of(sweeps) == [
        ("fp16", "row", 512),
        ("fp16", "row", 1024),
        ("fp8", "t", 512),
        ("fp8", "t", 1024),
        ("fp8-row", "t", 512),
        ("fp8-row", "t", 1024),
    ]
    settings = load(path).settings
    assert settings["dtypes"] == ["fp16", "fp8", "fp8-row"] and settings["b_layouts"] == ["row", "t"]
    assert "fp8" in settings["tolerance"] and "bf16" in settings["tolerance"]


def test_an_explicit_t_layout_runs_every_dtype_in_it(sweeps, tmp_path):
    argv = ["torch", "--dtype", "bf16,fp8", "--k", "512", "--b-layout", "t"]
    assert main([*argv, "--results", str(tmp_path / "r.jsonl")]) == 0
    assert _tasks_of(sweeps) == [("bf16", "t", 512), ("fp8", "t", 512)]


@pytest.mark.parametrize(
    ("dtype", "layout"), [("fp8", "row"), ("fp8-row", "row"), ("fp16,fp8", "row,t"), ("fp8-row", "t,row")]
)
def test_fp8_with_the_row_layout_is_a_usage_error_that_names_the_fix(sweeps, tmp_path, capsys, dtype, layout):
    path = tmp_path / "r.jsonl"
    assert main(["torch", "--dtype", dtype, "--b-layout", layout, "--results", str(path)]) == 2
    assert sweeps == [] and not path.exists()
    err = capsys.readouterr().err
    assert err.startswith("usage: gluon-survey")  # argparse's error: usage, then the message
    (line,) = [x for x in err.splitlines() if "error:" in x]
    assert "gluon-survey: error: argument --b-layout: --dtype fp8" in line
    assert "runs with B layout t only" in line and "not row" in line
    assert "pass --b-layout t, or leave --b-layout out" in line


def test_fp16_with_the_row_layout_is_still_fine(sweeps, tmp_path):
    argv = ["torch", "--dtype", "fp16", "--k", "512", "--b-layout", "row"]
    assert main([*argv, "--results", str(tmp_path / "r.jsonl")]) == 0
    assert _tasks_of(sweeps) == [("fp16", "row", 512)]


def test_help_names_the_fp8_dtypes(capsys):
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "fp8 (e4m3 operands with per-tensor fp32 scales, bf16 out)" in out
    assert "fp8-row (e4m3 with row-wise scales" in out
    assert "t for fp8 and fp8-row" in out


def test_fp8_peaks_come_from_the_fp8_column(sweeps, tmp_path, monkeypatch):
    from gluon_survey.driver import hardware

    monkeypatch.setattr(hardware, "gpu_info", lambda command: {"name": "NVIDIA H100 80GB HBM3"})
    path = tmp_path / "r.jsonl"
    assert main(["torch", "--dtype", "bf16,fp8-row", "--k", "512", "--results", str(path)]) == 0
    peaks = load(path).settings["peaks"]
    assert peaks["bf16"]["tflops"] == 989.4 and peaks["fp8-row"]["tflops"] == 1979.0
    ((_, _, _, _, dtype_peaks, _), _) = sweeps[0]
    assert dtype_peaks == {"bf16": 989.4, "fp8-row": 1979.0}  # what the runner divides by


@pytest.mark.timeout(120)
def test_an_fp8_timing_run_end_to_end_on_cpu(tmp_path, fake_modes, capsys):
    path = tmp_path / "r.jsonl"
    argv = shlex.split("_ok_cpu,_fp16_cpu --m 32 --n 48 --k 64 --dtype fp16,fp8,fp8-row --seed 2")
    argv += shlex.split(
        "--warmup-ms 2 --min-ms 5 --rounds 2 --noisy-rounds 2 --format csv --peak-tflops 1000"
    )
    assert main([*argv, "--results", str(path)]) == 0  # SKIPPED is not a failure
    saved = load(path)
    got = {(r.mode, r.dtype, r.b_layout): r for r in saved.rows}
    assert list(got) == [
        ("_ok_cpu", "fp16", "row"),
        ("_ok_cpu", "fp8", "t"),
        ("_ok_cpu", "fp8-row", "t"),
        ("_fp16_cpu", "fp16", "row"),
        ("_fp16_cpu", "fp8", "t"),
        ("_fp16_cpu", "fp8-row", "t"),
    ]
    for dtype in ("fp8", "fp8-row"):
        r = got[("_ok_cpu", dtype, "t")]
        assert r.status == "OK" and r.rel_err <= r.tol and r.cublas_err > 0
        assert r.tol == pytest.approx(2 * r.cublas_err + 0.25 * 2**-8)  # bf16's roundoff
        assert len(r.x_rounds) == 2 and r.tflops > 0 and r.pct_peak == pytest.approx(r.tflops / 10)
        skipped = got[("_fp16_cpu", dtype, "t")]
        assert skipped.status == "SKIPPED" and "no fp8 kernel" in skipped.error
    assert got[("_fp16_cpu", "fp16", "row")].status == "OK"
    out = capsys.readouterr().out
    assert "_ok_cpu,32,48,64,fp8-row,t,OK" in out and "_fp16_cpu,32,48,64,fp8,t,SKIPPED" in out


# ------------------------------------------------------------------------------------------------
# Grouped GEMMs: --shapes moe and CSVs of grouped shapes


def test_moe_runs_the_grouped_modes_in_bf16_with_b_t(sweeps, tmp_path):
    path = tmp_path / "r.jsonl"
    assert main(["--shapes", "moe", "--dtype", "bf16", "--results", str(path)]) == 0
    ((modes, tasks, *_), _) = sweeps[0]
    grouped = ["grouped", "grouped-swapab", "grouped-gemv", "grouped-auto", "grouped_mm", "cublas-loop"]
    grouped += ["scaled_grouped_mm"]
    assert modes == grouped == [m.name for m in registry.MODES if m.grouped]
    assert len(tasks) == 144 and {(t.dtype, t.b_layout) for t in tasks} == {("bf16", "t")}
    first = {"M": 2, "N": 28672, "K": 4096, "E": 8, "topk": 2, "routing": "uniform"}  # Mixtral gate_up, T = 1
    assert tasks[0].to_json() == first | {"dtype": "bf16", "b_layout": "t"}
    settings = load(path).settings
    assert settings["shapes"] == "--shapes moe" and settings["b_layouts"] == ["t"]


def test_named_modes_of_either_kind_run_on_grouped_shapes_and_dense_sweeps_default_to_dense_modes(
    sweeps, tmp_path
):
    assert main(["grouped,torch", "--shapes", "moe", "--results", str(tmp_path / "a.jsonl")]) == 0
    assert sweeps[0][0][0] == ["grouped", "torch"]  # torch's grouped rows are SKIPPED by its worker
    assert main(["--k", "512", "--results", str(tmp_path / "b.jsonl")]) == 0
    assert sweeps[1][0][0] == [m.name for m in registry.MODES if not m.grouped]


def test_moe_runs_in_fp8_row_against_scaled_grouped_mm(sweeps, tmp_path):
    assert main(["--shapes", "moe", "--dtype", "bf16,fp8-row", "--results", str(tmp_path / "r.jsonl")]) == 0
    ((modes, tasks, *_), _) = sweeps[0]
    assert "scaled_grouped_mm" in modes and "grouped" in modes
    assert {(t.dtype, t.b_layout) for t in tasks} == {("bf16", "t"), ("fp8-row", "t")} and len(tasks) == 288


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dtype", "bf16,fp8"], "--dtype fp8: grouped GEMMs run in fp8 with row-wise scales only"),
        (["--b-layout", "row"], "--b-layout row: grouped shapes run with B layout t only"),
    ],
)
def test_grouped_shapes_refuse_per_tensor_fp8_and_the_row_layout_before_the_gpu(
    sweeps, tmp_path, capsys, argv, message
):
    path = tmp_path / "r.jsonl"
    assert main(["grouped", "--shapes", "moe", *argv, "--results", str(path)]) == 2
    assert sweeps == [] and not path.exists()
    assert f"gluon-survey: error: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["grouped_mm,grouped", "--dtype", "fp8-row"],
            "--dtype fp8-row: mode 'grouped_mm' has no fp8 kernel; fp8 operands run in: grouped, "
            "grouped-swapab, grouped-auto, cublas-loop, scaled_grouped_mm",
        ),
        (
            ["scaled_grouped_mm", "--dtype", "bf16,fp16"],
            "--dtype bf16,fp16: mode 'scaled_grouped_mm' takes fp8 e4m3 operands only; fp16 and bf16 "
            "operands run in: grouped, grouped-swapab, grouped-gemv, grouped-auto, grouped_mm, cublas-loop",
        ),
    ],
)
def test_named_grouped_modes_that_would_measure_nothing_are_a_usage_error(
    sweeps, tmp_path, capsys, argv, message
):
    assert main([*argv, "--shapes", "moe", "--results", str(tmp_path / "r.jsonl")]) == 2
    assert sweeps == [] and f"gluon-survey: error: {message}" in capsys.readouterr().err
    # with the other kind of dtype as well, the mode's cells of the one it lacks are SKIPPED instead
    assert main([*argv[:2], "bf16,fp8-row", "--shapes", "moe", "--results", str(tmp_path / "s.jsonl")]) == 0


def test_a_grouped_csv_in_fp8_row_needs_n_and_k_multiples_of_16(sweeps, tmp_path, capsys):
    shapes = tmp_path / "moe.csv"
    shapes.write_text("T,N,K,E,topk,routing\n16,72,64,4,2,zipf\n")
    assert main(["--shapes", str(shapes), "--dtype", "bf16", "--results", str(tmp_path / "a.jsonl")]) == 0
    assert main(["--shapes", str(shapes), "--dtype", "fp8-row", "--results", str(tmp_path / "b.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "grouped shape 72x64 E=4 top-2 T=16 zipf: N and K must be multiples of 16 (fp8-row:" in err


def test_a_grouped_csv_needs_n_and_k_multiples_of_8(sweeps, tmp_path, capsys):
    shapes = tmp_path / "moe.csv"
    shapes.write_text("T,N,K,E,topk,routing\n16,100,64,4,2,zipf\n")
    assert main(["--shapes", str(shapes), "--results", str(tmp_path / "r.jsonl")]) == 2
    assert (
        "grouped shape 100x64 E=4 top-2 T=16 zipf: N and K must be multiples of 8" in capsys.readouterr().err
    )


def test_list_says_which_modes_compute_grouped_gemms(no_cuda, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "--shapes moe" in out
    assert re.search(r"grouped_mm\s*│\s*baseline\s*│\s*grouped", out) and re.search(
        r"Blocked\s*│\s*gluon\s*│\s*dense", out
    )


@pytest.mark.timeout(180)
def test_a_grouped_timing_run_end_to_end_on_cpu(tmp_path, fake_modes, capsys):
    """A grouped mode and a dense one over a CSV of grouped shapes: the grouped rows carry E, topk,
    routing and the counts, their x cuBLAS is against torch._grouped_mm (paired), the dense mode's
    rows are SKIPPED saying why, and every report format renders them."""
    shapes, path = tmp_path / "moe.csv", tmp_path / "r.jsonl"
    shapes.write_text("T,N,K,E,topk,routing\n16,48,64,4,2,half\n64,48,64,4,2,zipf\n")
    argv = shlex.split(
        f"_grouped_cpu,_ok_cpu --shapes {shapes} --dtype bf16 --warmup-ms 2 --min-ms 5 "
        "--rounds 2 --noisy-rounds 2"
    )
    assert (
        main([*argv, "--format", "markdown", "--results", str(path), "--plot", str(tmp_path / "p.png")]) == 0
    )
    out = capsys.readouterr().out
    rows = {(r.mode, r.M): r for r in load(path).rows}
    assert list(rows) == [("_grouped_cpu", 32), ("_grouped_cpu", 128), ("_ok_cpu", 32), ("_ok_cpu", 128)]
    ok = rows[("_grouped_cpu", 32)]
    assert ok.status == "OK" and (ok.E, ok.topk, ok.routing, ok.b_layout) == (4, 2, "half", "t")
    assert sum(ok.counts) == 32 and max(ok.counts) == 16 and ok.rel_err <= ok.tol
    assert len(ok.x_rounds) == 2 and ok.cublas_ms > 0  # torch._grouped_mm, timed alongside
    assert ok.tflops == pytest.approx(2 * 32 * 48 * 64 / (ok.ms_median * 1e-3) / 1e12)
    skipped = rows[("_ok_cpu", 128)]
    assert (
        skipped.status == "SKIPPED"
        and "computes dense GEMMs; grouped (mixture-of-experts) problems run in" in skipped.error
    )
    assert "| N x K, experts E, top-k, tokens T, routing | _grouped_cpu | _ok_cpu |" in out
    assert (
        "| 48x64 E=4 top-2 T=64 zipf | " in out
        and "x torch._grouped_mm (against torch._grouped_mm timed" in out
    )
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["report", str(path), "--format", "csv"]) == 0
    csv_out = capsys.readouterr().out
    assert ",4,2,half," in csv_out and "_grouped_cpu,32,48,64,bf16,t,OK" in csv_out


@pytest.mark.timeout(180)
def test_a_grouped_fp8_row_run_end_to_end_on_cpu(tmp_path, fake_modes, capsys):
    """fp8-row grouped tasks beside bf16 ones: e4m3 operands with their token and channel scales,
    checked against the dequantized product, and the legend names each kind's reference."""
    shapes, path = tmp_path / "moe.csv", tmp_path / "r.jsonl"
    shapes.write_text("T,N,K,E,topk,routing\n16,48,64,4,2,half\n")
    argv = shlex.split(
        f"_grouped_cpu --shapes {shapes} --dtype bf16,fp8-row --warmup-ms 2 --min-ms 5 "
        "--rounds 2 --noisy-rounds 2"
    )
    assert main([*argv, "--format", "markdown", "--results", str(path)]) == 0
    out = capsys.readouterr().out
    rows = {r.dtype: r for r in load(path).rows}
    assert list(rows) == ["bf16", "fp8-row"]
    fp8 = rows["fp8-row"]
    assert fp8.status == "OK" and fp8.rel_err <= fp8.tol and fp8.b_layout == "t" and len(fp8.x_rounds) == 2
    assert fp8.counts == rows["bf16"].counts  # one routing for both dtypes
    assert "x torch._grouped_mm or, in grouped fp8 rows, x torch._scaled_grouped_mm" in out


# ------------------------------------------------------------------------------------------------
# --a-layout and --shapes llm-train


def test_a_layout_row_and_t_runs_every_shape_in_both(sweeps, tmp_path):
    path = tmp_path / "r.jsonl"
    assert (
        main(["torch", "--dtype", "bf16", "--k", "512", "--a-layout", "t,ROW", "--results", str(path)]) == 0
    )
    ((_, tasks, *_), _) = sweeps[0]
    assert [(t.a_layout, t.b_layout) for t in tasks] == [("t", "row"), ("row", "row")]
    assert load(path).settings["a_layouts"] == ["t", "row"]
    assert main(["torch", "--k", "512", "--results", str(tmp_path / "d.jsonl")]) == 0
    assert {t.a_layout for t in sweeps[1][0][1]} == {"row"}  # the default


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--a-layout", "col"], "--a-layout: expected a comma list of row, t, got 'col'"),
        (
            ["--shapes", "moe", "--a-layout", "t"],
            "--a-layout t: grouped shapes run with A layout row only",
        ),
        (
            ["--shapes", "llm-train", "--a-layout", "row"],
            "--a-layout: --shapes llm-train fixes each shape's A and B layouts (those of the product it "
            "stands for); leave --a-layout out",
        ),
        (
            ["--shapes", "llm-train", "--b-layout", "t", "--a-layout", "t"],
            "--a-layout and --b-layout: --shapes llm-train fixes",
        ),
        (
            ["--shapes", "llm-train", "--dtype", "bf16,fp8-row"],
            "--dtype fp8-row: --shapes llm-train has products in A layout row, B layout row "
            "(1024x4096x6144), and fp8-row runs with A layout row and B layout t only; measure fp16 or bf16",
        ),
    ],
)
def test_layouts_that_cannot_run_are_a_usage_error_before_the_gpu(sweeps, tmp_path, capsys, argv, message):
    path = tmp_path / "r.jsonl"
    assert main([*argv, "--results", str(path)]) == 2
    assert sweeps == [] and not path.exists()
    assert f"gluon-survey: error: {message}" in capsys.readouterr().err


def test_llm_train_runs_each_backward_product_in_its_own_layouts(sweeps, tmp_path):
    path = tmp_path / "r.jsonl"
    assert main(["torch", "--shapes", "llm-train", "--dtype", "bf16", "--results", str(path)]) == 0
    ((_, tasks, *_), _) = sweeps[0]
    assert len(tasks) == 64
    # Llama-3-8B's qkv weight [6144, 4096] at 1024 tokens: grad_x, then grad_W^T
    assert [t.to_json() for t in tasks[:2]] == [
        {"M": 1024, "N": 4096, "K": 6144, "dtype": "bf16", "b_layout": "row"},
        {"M": 6144, "N": 4096, "K": 1024, "dtype": "bf16", "b_layout": "row", "a_layout": "t"},
    ]
    assert {(t.a_layout, t.b_layout) for t in tasks} == {("row", "row"), ("t", "row")}
    settings = load(path).settings
    assert settings["a_layouts"] == ["row", "t"] and settings["b_layouts"] == ["row"]


@pytest.mark.timeout(120)
def test_an_a_layout_run_end_to_end_on_cpu(tmp_path, fake_modes, capsys):
    from gluon_survey.driver.check import A_T_FP8

    path = tmp_path / "r.jsonl"
    argv = shlex.split("_ok_cpu --m 32 --n 48 --k 64 --dtype bf16,fp8 --a-layout row,t --seed 2")
    argv += shlex.split("--warmup-ms 2 --min-ms 5 --rounds 2 --noisy-rounds 2 --peak-tflops 1000")
    assert main([*argv, "--results", str(path)]) == 0  # SKIPPED is not a failure
    got = {(r.dtype, r.a_layout, r.b_layout): r for r in load(path).rows}
    assert list(got) == [("bf16", "row", "row"), ("bf16", "t", "row"), ("fp8", "row", "t"), ("fp8", "t", "t")]
    for key in list(got)[:3]:
        assert got[key].status == "OK" and got[key].rel_err <= got[key].tol and len(got[key].x_rounds) == 2
    assert got[("fp8", "t", "t")].status == "SKIPPED" and got[("fp8", "t", "t")].error == A_T_FP8
    out = capsys.readouterr().out
    for title in ("bf16, B row", "bf16, A t, B row", "fp8, B t", "fp8, A t, B t"):
        assert re.search(rf"^\s*{re.escape(title)}\s*$", out, flags=re.M), title
    assert main(["report", str(path), "--format", "legacy"]) == 0
    legacy = capsys.readouterr().out
    assert "Mode: _ok_cpu (bf16, B row, M=32, N=48)" in legacy  # unchanged for A row
    assert "Mode: _ok_cpu (bf16, A t, B row, M=32, N=48)" in legacy


# ------------------------------------------------------------------------------------------------
# --continue-from: a sweep stopped short, finished by another run


@pytest.mark.timeout(120)
def test_continue_from_times_only_the_cells_the_earlier_runs_lack_and_report_merges_them(
    tmp_path, fake_modes, capsys
):
    """A sweep stopped after two of its four cells is finished by a run that times only the other
    two; `report` merges the two files into the whole sweep, and a third run finds nothing left."""
    from gluon_survey.driver.results import merge

    first, second, third = (tmp_path / f"{name}.jsonl" for name in "abc")
    common = shlex.split("_ok_cpu --m 32 --n 40 --dtype bf16 --b-layout t --warmup-ms 2 --min-ms 5")
    common += ["--format", "csv"]
    assert main([*common, "--k", "64,128", "--results", str(first)]) == 0
    assert main([*common, "--k", "64:256:64", "--results", str(second), "--continue-from", str(first)]) == 0
    assert [(r.K, r.status) for r in load(second).rows] == [(192, "OK"), (256, "OK")]
    whole = merge([load(first), load(second)], ["a", "b"])
    assert sorted(r.K for r in whole.rows) == [64, 128, 192, 256]
    capsys.readouterr()
    both = ["--continue-from", str(first), "--continue-from", str(second)]
    assert main([*common, "--k", "64:256:64", "--results", str(third), *both]) == 0
    assert not third.exists()
    assert "nothing to measure" in capsys.readouterr().err


def test_continue_from_another_commit_is_a_usage_error_before_the_gpu(no_cuda, tmp_path, capsys):
    path = results_file(tmp_path, [row(mode="torch", M=8, N=8, K=8, ms=0.01)])  # commit 0123456789abcdef
    assert main(["torch", "--m", "8", "--n", "8", "--k", "8", "--continue-from", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--continue-from {path} ran at commit 0123456789abcdef, this checkout is at" in err
    assert "merges the runs of one commit only" in err


def test_continue_from_a_file_that_is_not_a_results_file_names_it(no_cuda, tmp_path, capsys):
    path = tmp_path / "notes.jsonl"
    path.write_text("not json\nat all\n")
    assert main(["torch", "--continue-from", str(path)]) == 2
    assert f"--continue-from {path}: " in capsys.readouterr().err


def test_continue_from_another_gpu_is_an_error_before_any_cell_runs(sweeps, tmp_path, monkeypatch, capsys):
    from factories import ENV, SETTINGS
    from gluon_survey.driver import hardware
    from gluon_survey.driver.results import make_header

    earlier = tmp_path / "h100.jsonl"
    with ResultsWriter(earlier, make_header("run", {**ENV, "git": hardware.git_commit()}, SETTINGS)):
        pass
    monkeypatch.setattr(hardware, "gpu_info", lambda command: {"name": "NVIDIA H200", "command": command})
    out = tmp_path / "r.jsonl"
    argv = shlex.split("torch --m 8 --n 8 --k 8") + ["--continue-from", str(earlier), "--results", str(out)]
    assert main(argv) == 2
    assert f"--continue-from {earlier} ran on NVIDIA H100 80GB HBM3, this GPU is NVIDIA H200" in (
        capsys.readouterr().err
    )
    assert sweeps == [] and not out.exists()
