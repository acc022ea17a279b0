"""Failure isolation of the sweep, on CPU: the hidden test modes crash, hang, or multiply on the CPU."""

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

from gluon_survey import registry
from gluon_survey.driver import runner, worker
from gluon_survey.driver.results import ResultsWriter, load, make_header
from gluon_survey.driver.shapes import Shape

FAST = runner.Settings(warmup_ms=2.0, min_ms=5.0, timeout_s=60.0)
SHAPES = [Shape(32, 48, 64), Shape(17, 33, 65)]  # the second is ragged on purpose


@pytest.fixture
def test_modes(monkeypatch):
    monkeypatch.setenv(worker.TEST_PROVIDERS_ENV, "1")


def test_resolve_modes(monkeypatch):
    monkeypatch.delenv(worker.TEST_PROVIDERS_ENV, raising=False)
    assert runner.resolve_modes("blocked,TORCH, Blocked") == ["Blocked", "torch"]
    assert runner.resolve_modes(None) == registry.names()
    with pytest.raises(KeyError, match="valid modes: Blocked"):
        runner.resolve_modes("_ok_cpu")  # hidden unless the test switch is on
    monkeypatch.setenv(worker.TEST_PROVIDERS_ENV, "1")
    assert runner.resolve_modes("torch,_crash,_crash") == ["torch", "_crash"]
    assert runner.needs_cuda(["_ok_cpu", "torch"]) and not runner.needs_cuda(["_ok_cpu", "_hang"])


def test_make_tasks_groups_by_dtype_then_layout():
    tasks = runner.make_tasks(SHAPES, ["fp16", "bf16"], ["row", "t"])
    assert [(t.dtype, t.b_layout, t.shape) for t in tasks[:3]] == [
        ("fp16", "row", SHAPES[0]),
        ("fp16", "row", SHAPES[1]),
        ("fp16", "t", SHAPES[0]),
    ]
    assert len(tasks) == 8
    assert tasks[0].to_json() == {"M": 32, "N": 48, "K": 64, "dtype": "fp16", "b_layout": "row"}


def _sweep(tmp_path, modes, tasks, settings=FAST):
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path, make_header("run", {}, {})) as writer:
        rows = runner.run_sweep(modes, tasks, settings, writer, {"fp16": None, "bf16": None})
    assert load(path).rows == rows  # everything returned is on disk
    return rows


@pytest.mark.timeout(180)
def test_crash_and_hang_cost_one_row_each_and_the_sweep_goes_on(tmp_path, test_modes):
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
        assert r.config == {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64}
        assert r.compile_s >= 0


@pytest.mark.timeout(120)
def test_cpu_rows_cover_dtypes_and_layouts(tmp_path, test_modes):
    tasks = runner.make_tasks(SHAPES[1:], ["fp16", "bf16"], ["row", "t"])
    rows = _sweep(tmp_path, ["_ok_cpu"], tasks)
    assert [(r.dtype, r.b_layout) for r in rows] == [
        (d, lay) for d in ("fp16", "bf16") for lay in ("row", "t")
    ]
    _assert_correct_cpu_rows(rows, SHAPES[1:] * 4)


@pytest.mark.timeout(120)
def test_paired_settings_reach_the_worker(tmp_path, test_modes):
    tasks = runner.make_tasks(SHAPES[:1], ["fp16"], ["row"])
    (paired,) = _sweep(tmp_path, ["_ok_cpu"], tasks, replace(FAST, paired=True))
    assert paired.cublas_ms > 0 and paired.cublas_drift is not None
    (tmp_path / "plain").mkdir()
    (plain,) = _sweep(tmp_path / "plain", ["_ok_cpu"], tasks)
    assert plain.cublas_ms is None


@pytest.mark.timeout(120)
def test_real_modes_without_cuda_are_skipped_with_the_reason(tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    rows = _sweep(tmp_path, ["torch"], runner.make_tasks(SHAPES[:1], ["fp16"], ["row"]))
    assert [(r.status, r.error) for r in rows] == [("SKIPPED", "no CUDA GPU")]


# ------------------------------------------------------------------------------------------------
# Killing the driver midway


def _workers_tagged(tag):
    """Live `gluon_survey.driver.worker` processes whose environment carries `tag`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"GLUON_SURVEY_TEST_TAG={tag}".encode() in environ and b"gluon_survey.driver.worker" in cmdline:
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
    env = dict(os.environ, GLUON_SURVEY_TEST_PROVIDERS="1", GLUON_SURVEY_TEST_TAG=tag)
    cmd = [sys.executable, "-m", "gluon_survey", "_ok_cpu,_hang", "--results", str(path)]
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
        assert out.startswith("Mode: _ok_cpu\nK, BLOCK_M, BLOCK_N, BLOCK_K, ms, TFLOPs/sec\n64, 16, 32, 64, ")
        assert "interrupted" in err
    _assert_correct_cpu_rows(_ok_rows(path), [Shape(32, 48, 64), Shape(32, 48, 65)])
    assert all(json.loads(line) for line in path.read_text().splitlines())  # no torn line
    _wait_for(lambda: not _workers_tagged(tag), 30, "the orphaned worker to exit")
