"""Failure isolation of the sweep, on CPU: the fake modes of `fakes.py` crash, hang, or multiply on
the CPU, in the real runner and the real worker loop (`fake_worker.py`)."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

import fakes
from gluon_survey.driver import runner
from gluon_survey.driver.results import ResultsWriter, load, make_header
from gluon_survey.driver.settings import Settings
from gluon_survey.driver.shapes import Shape

FAST = Settings(warmup_ms=2.0, min_ms=5.0, timeout_s=60.0, paired=False)
SHAPES = [Shape(32, 48, 64), Shape(17, 33, 65)]  # the second is ragged on purpose


def test_production_code_knows_no_test_modes():
    import gluon_survey

    src = Path(gluon_survey.__file__).parent
    for path in src.rglob("*.py"):
        text = path.read_text()
        for word in ("_ok_cpu", "GLUON_SURVEY_TEST", "TEST_MODES", "fake_provider"):
            assert word not in text, f"{path} mentions {word}"
    assert (sys.executable, "-m", "gluon_survey.driver.worker") == runner.WORKER_COMMAND


def test_make_tasks_groups_by_dtype_then_layout():
    tasks = runner.make_tasks(SHAPES, ["fp16", "bf16"], ["row", "t"])
    assert [(t.dtype, t.b_layout, t.shape) for t in tasks[:3]] == [
        ("fp16", "row", SHAPES[0]),
        ("fp16", "row", SHAPES[1]),
        ("fp16", "t", SHAPES[0]),
    ]
    assert len(tasks) == 8
    assert tasks[0].to_json() == {"M": 32, "N": 48, "K": 64, "dtype": "fp16", "b_layout": "row"}


def test_make_tasks_groups_by_dtype_then_a_layout_then_b_layout():
    tasks = runner.make_tasks(SHAPES[:1], ["bf16"], ["row", "t"], ["row", "t"])
    assert [(t.a_layout, t.b_layout) for t in tasks] == [
        ("row", "row"),
        ("row", "t"),
        ("t", "row"),
        ("t", "t"),
    ]
    assert [t.label() for t in tasks[1:3]] == ["32x48x64 bf16 B=t", "32x48x64 bf16 A=t B=row"]
    # A row says nothing of A (the worker's protocol and old files without A layouts); A t says so
    assert "a_layout" not in tasks[0].to_json()
    assert tasks[2].to_json() == {
        "M": 32,
        "N": 48,
        "K": 64,
        "dtype": "bf16",
        "b_layout": "row",
        "a_layout": "t",
    }


def test_shapes_that_fix_their_layouts_keep_them_whatever_the_sweep_asks():
    fixed = [Shape(64, 32, 48, "row", "row"), Shape(48, 32, 64, "t", "row")]
    tasks = runner.make_tasks(fixed, ["fp16", "bf16"], ["t"], ["row", "t"])
    assert [(t.dtype, t.shape.M, t.a_layout, t.b_layout) for t in tasks] == [
        ("fp16", 64, "row", "row"),
        ("fp16", 48, "t", "row"),
        ("bf16", 64, "row", "row"),
        ("bf16", 48, "t", "row"),
    ]


@pytest.mark.timeout(120)
def test_cpu_rows_in_a_layout_t_carry_it_and_are_correct(tmp_path):
    tasks = runner.make_tasks(SHAPES[1:], ["fp16"], ["t"], ["row", "t"])
    rows = _sweep(tmp_path, ["_ok_cpu"], tasks)
    assert [(r.a_layout, r.b_layout) for r in rows] == [("row", "t"), ("t", "t")]
    _assert_correct_cpu_rows(rows, SHAPES[1:] * 2)
    assert rows[0].key != rows[1].key and rows[1].layouts == "A t, B t"


def _sweep(tmp_path, modes, tasks, settings=FAST, worker_command=fakes.WORKER_COMMAND):
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path, make_header("run", {}, {})) as writer:
        peaks = {"fp16": None, "bf16": None}
        rows = runner.run_sweep(modes, tasks, settings, writer, peaks, worker_command=worker_command)
    assert load(path).rows == rows  # everything returned is on disk
    return rows


@pytest.mark.timeout(180)
def test_crash_and_hang_cost_one_row_each_and_the_sweep_goes_on(tmp_path):
    tasks = runner.make_tasks(SHAPES, ["fp16"], ["row"])
    rows = _sweep(tmp_path, ["_crash", "_hang", "_ok_cpu"], tasks, replace(FAST, timeout_s=3.0))
    by_mode = {m: [r for r in rows if r.mode == m] for m in ("_crash", "_hang", "_ok_cpu")}
    for r in by_mode["_crash"]:  # a fresh worker per shape: both shapes get their own row
        assert r.status == "ERROR"
        assert r.error.startswith("worker killed by SIGABRT while compiling/autotuning")
    for r in by_mode["_hang"]:
        assert r.status == "TIMEOUT"
        assert r.error.startswith("no result within 3 s (while compiling/autotuning)")
    assert [r.shape for r in by_mode["_crash"]] == [r.shape for r in by_mode["_hang"]] == SHAPES
    _assert_correct_cpu_rows(by_mode["_ok_cpu"], SHAPES)


def _assert_correct_cpu_rows(rows, shapes):
    assert [r.shape for r in rows] == shapes
    for r in rows:
        assert r.status == "OK", r.error
        assert r.rel_err <= r.tol and r.cublas_err is not None
        assert r.timer == "wall-clock" and r.n_iters >= 20 and r.l2_copies == 1
        assert r.ms_p20 <= r.ms_median <= r.ms_p80 and r.tflops > 0
        assert r.config == fakes.CONFIG
        assert r.compile_s >= 0


@pytest.mark.timeout(120)
def test_cpu_rows_cover_dtypes_and_layouts(tmp_path):
    tasks = runner.make_tasks(SHAPES[1:], ["fp16", "bf16"], ["row", "t"])
    rows = _sweep(tmp_path, ["_ok_cpu"], tasks)
    assert [(r.dtype, r.b_layout) for r in rows] == [
        (d, lay) for d in ("fp16", "bf16") for lay in ("row", "t")
    ]
    _assert_correct_cpu_rows(rows, SHAPES[1:] * 4)


@pytest.mark.timeout(120)
def test_paired_settings_reach_the_worker(tmp_path):
    tasks = runner.make_tasks(SHAPES[:1], ["fp16"], ["row"])
    (paired,) = _sweep(tmp_path, ["_ok_cpu"], tasks, replace(FAST, paired=True, rounds=2, noisy_rounds=2))
    assert paired.status == "OK", paired.error
    assert paired.cublas_ms > 0 and paired.cublas_drift is not None and len(paired.x_rounds) == 2
    (tmp_path / "plain").mkdir()
    (plain,) = _sweep(tmp_path / "plain", ["_ok_cpu"], tasks)
    assert plain.cublas_ms is None and plain.x_rounds is None
    (tmp_path / "interleaved").mkdir()
    settings = replace(FAST, paired=True, rounds=2, noisy_rounds=3, interleave=True)
    (mixed,) = _sweep(tmp_path / "interleaved", ["_ok_cpu"], tasks, settings)
    assert mixed.status == "OK", mixed.error
    assert mixed.cublas_ms > 0 and 2 <= len(mixed.x_rounds) <= 3


@pytest.mark.timeout(120)
def test_real_modes_without_cuda_are_skipped_with_the_reason(tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    tasks = runner.make_tasks(SHAPES[:1], ["fp16"], ["row"])
    rows = _sweep(tmp_path, ["torch"], tasks, worker_command=None)  # the real worker
    assert [(r.status, r.error) for r in rows] == [("SKIPPED", "no CUDA GPU")]


# ------------------------------------------------------------------------------------------------
# Killing the driver midway


def _workers_tagged(tag):
    """Live worker processes (`fake_worker.py`) whose environment carries `tag`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"TEST_TAG={tag}".encode() in environ and b"fake_worker.py" in cmdline:
            pids.append(int(proc.name))
    return pids


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def _ok_rows(path):
    try:
        return [r for r in load(path).rows if r.mode == "_ok_cpu"]
    except (OSError, ValueError):
        return []


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_killing_the_driver_keeps_finished_rows_and_ends_its_worker(tmp_path, sig):
    tag = uuid.uuid4().hex
    path = tmp_path / "results.jsonl"
    env = dict(os.environ, TEST_TAG=tag)
    cmd = [*fakes.CLI_COMMAND, "_ok_cpu,_hang", "--results", str(path), "--no-paired"]
    cmd += shlex.split("--m 32 --n 48 --k 64,65 --warmup-ms 2 --min-ms 5 --timeout 300 --format legacy")
    driver = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: len(_ok_rows(path)) == 2 and _workers_tagged(tag), 60, "the _hang worker")
        driver.send_signal(sig)
        out, err = driver.communicate(timeout=30)
    finally:
        driver.kill()
    if sig == signal.SIGINT:
        assert driver.returncode == 130, err
        header = "Mode: _ok_cpu (fp16, B row, M=32, N=48)\nK, BLOCK_M, BLOCK_N, BLOCK_K, ms, TFLOPs/sec\n"
        assert out.startswith(header + "64, 16, 32, 64, ")
        assert "interrupted" in err
        assert err.splitlines()[-1] == f"gluon-survey: results in {path}"
    _assert_correct_cpu_rows(_ok_rows(path), [Shape(32, 48, 64), Shape(32, 48, 65)])
    assert all(json.loads(line) for line in path.read_text().splitlines())  # no torn line
    _wait_for(lambda: not _workers_tagged(tag), 30, "the orphaned worker to exit")
