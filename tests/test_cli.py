import re
import shlex
import subprocess
import sys
import types

import pytest
import torch

from factories import results, row
from gluon_survey import api, registry
from gluon_survey.driver import worker
from gluon_survey.driver.cli import main
from gluon_survey.driver.results import ResultsWriter, load


@pytest.fixture
def no_cuda(monkeypatch):
    """This machine, as the CLI sees it, has no CUDA GPU (also when the tests run on one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(api, "capability", lambda: None)


def test_help_works_without_a_gpu(no_cuda, capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "usage: gluon-survey [MODES] [options] | gluon-survey {list,compare,report,inspect}"
    )
    for text in ("--dtype", "--shapes llm|FILE.csv", "--b-layout", "--peak-tflops", "compare OLD NEW"):
        assert text in out
    for sub in ("list", "compare", "report"):
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
        (["--k", "512:1024"], "--k '512:1024': expected a size or a start:stop:step range"),
        (["--shapes", "llm", "--m", "1"], "use either --shapes or --m/--n/--k"),
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


def test_report_subcommand_rerenders_a_results_file(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    sample = results([row("Blocked", ms=0.1), row("torch", ms=0.08)])
    with ResultsWriter(path, sample.header) as writer:
        for r in sample.rows:
            writer.append(r)
    assert main(["report", str(path), "--format", "csv"]) == 0
    assert "Blocked,8192,8192,512,fp16,row,OK" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2


@pytest.mark.timeout(120)
def test_a_timing_run_end_to_end_on_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(worker.TEST_PROVIDERS_ENV, "1")
    path, plot = tmp_path / "r.jsonl", tmp_path / "r.png"
    argv = shlex.split("_OK_CPU --m 32 --n 40 --k 64:128:64 --dtype bf16 --b-layout t --seed 3")
    argv += shlex.split("--warmup-ms 2 --min-ms 5 --format legacy --peak-tflops 1000")
    argv += ["--results", str(path), "--plot", str(plot)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[:2] == ["Mode: _ok_cpu", "K, BLOCK_M, BLOCK_N, BLOCK_K, ms, TFLOPs/sec"]
    assert all(re.fullmatch(r"(64|128), 16, 32, 64, \d+\.\d{4}, \d+\.\d{2}", line) for line in lines[2:4])
    assert lines[4:] == [""]
    assert f"results in {path}" in captured.err
    saved = load(path)
    assert saved.settings["seed"] == 3
    assert saved.settings["peaks"]["bf16"] == {"tflops": 1000.0, "source": "--peak-tflops"}
    assert saved.env["command"] == shlex.join(["gluon-survey", *argv])
    assert saved.env["torch"] == torch.__version__
    assert [(r.K, r.status) for r in saved.rows] == [(64, "OK"), (128, "OK")]
    assert {(r.dtype, r.b_layout) for r in saved.rows} == {("bf16", "t")}
    assert plot.read_bytes()[:4] == b"\x89PNG"
