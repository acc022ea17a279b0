"""The worker's check-then-time sequence, in process, with CPU providers that misbehave on purpose."""

import math
from dataclasses import replace

import pytest
import torch

from gluon_survey.driver.settings import Settings
from gluon_survey.driver.timing import WallClock
from gluon_survey.driver.worker import Provider, measure, run_task
from gluon_survey.launch import Launch

TASK = {"M": 48, "N": 40, "K": 72, "dtype": "fp16", "b_layout": "t"}
SETTINGS = Settings(warmup_ms=1.0, min_ms=2.0, min_iters=5, max_iters=50, paired=False)
PAIRED = replace(SETTINGS, paired=True)


def cpu(prepare, unsupported=None, l2_bytes=0, **fields):
    return Provider("cpu", prepare, WallClock(), unsupported, l2_bytes, lambda: 1 << 30, **fields)


def matmul(a, b, out):
    return Launch(lambda: torch.matmul(a, b, out=out))


def _measure(prepare):
    phases = []
    row = measure(cpu(prepare), TASK, SETTINGS, phases.append)
    assert phases[0] == "compiling/autotuning"
    return row, phases


def test_a_correct_launch_is_checked_then_timed():
    row, phases = _measure(lambda a, b, out: Launch(lambda: torch.matmul(a, b, out=out), {"BLOCK_M": 64}))
    assert row["status"] == "OK" and phases == ["compiling/autotuning", "checking", "timing"]
    assert row["rel_err"] <= row["tol"] and row["config"] == {"BLOCK_M": 64}
    assert row["n_iters"] >= 5 and row["ms_p20"] <= row["ms_median"] <= row["ms_p80"]


def test_a_launch_that_returns_its_product_is_judged_on_it():
    row, _ = _measure(lambda a, b, out: Launch(lambda: a @ b))  # leaves `out` alone, as torch.compile does
    assert row["status"] == "OK"


def test_a_wrong_result_is_failed_and_not_timed():
    def prepare(a, b, out):
        return Launch(lambda: out.copy_(a @ b).mul_(1.01))  # 1 % off

    row, phases = _measure(prepare)
    assert row["status"] == "FAILED" and row["error"].startswith("rel_err 0.01 > tol")
    assert "timing" not in phases and "ms_median" not in row


def test_an_unwritten_tile_is_caught_by_the_nan_poisoned_output():
    def prepare(a, b, out):
        return Launch(lambda: out[:, :32].copy_(a @ b[:, :32]))  # skips the last 8 columns

    row, _ = _measure(prepare)
    assert row["status"] == "FAILED" and "NaN/inf values in the output" in row["error"]


def test_a_launch_that_only_works_once_fails_after_timing():
    def prepare(a, b, out):
        calls = []

        def fn():
            if not calls:
                torch.matmul(a, b, out=out)
            calls.append(1)

        return Launch(fn)

    row, _ = _measure(prepare)  # the check's call is its second: already a no-op
    assert row["status"] == "FAILED"

    def prepare_twice(a, b, out):  # correct for the first call and the check, then a no-op
        calls = []

        def fn():
            if len(calls) < 2:
                torch.matmul(a, b, out=out)
            calls.append(1)

        return Launch(fn)

    row, _ = _measure(prepare_twice)
    assert row["status"] == "FAILED" and row["error"].startswith("wrong after timing: rel_err inf")


def test_run_task_turns_exceptions_into_error_rows_and_skips_unsupported(capsys):
    def prepare(a, b, out):
        raise ValueError("no TMA descriptor for this stride")

    assert run_task(cpu(prepare), TASK, SETTINGS, lambda _: None) == {
        "status": "ERROR",
        "error": "ValueError: no TMA descriptor for this stride",
    }
    assert "Traceback" in capsys.readouterr().err
    skipped = run_task(cpu(prepare, unsupported="needs sm_90"), TASK, SETTINGS, lambda _: None)
    assert skipped == {"status": "SKIPPED", "error": "needs sm_90"}


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_results_fail(value):
    row, _ = _measure(lambda a, b, out: Launch(lambda: torch.matmul(a, b, out=out).fill_(value)))
    assert row["status"] == "FAILED" and row["rel_err"] == math.inf


def test_paired_baseline_is_timed_around_the_mode_on_the_same_inputs():
    seen = []

    def baseline(a, b, out):
        seen.append((a, b, out))
        return Launch(lambda: torch.matmul(a, b, out=out))

    launches = []

    def prepare(a, b, out):
        launches.append((a, b, out))
        return Launch(lambda: torch.matmul(a, b, out=out))

    provider = cpu(prepare, baseline=baseline)
    row = measure(provider, TASK, PAIRED, lambda _: None)
    assert row["status"] == "OK" and row["cublas_ms"] > 0 and math.isfinite(row["cublas_drift"])
    # the same A and B as the mode's timed sets, but outputs of its own: the mode's stay poisoned
    assert [(a, b) for a, b, _ in seen] == [(a, b) for a, b, _ in launches]
    assert all(o is not out for (_, _, o), (_, _, out) in zip(seen, launches, strict=True))

    unpaired = measure(provider, TASK, SETTINGS, lambda _: None)
    assert "cublas_ms" not in unpaired and "cublas_drift" not in unpaired


def test_paired_baseline_cannot_hide_an_unwritten_output():
    def prepare(a, b, out):  # right on the first input set only
        first = not hasattr(prepare, "done")
        prepare.done = True
        return Launch(lambda: torch.matmul(a, b, out=out) if first else None)

    # a large L2 makes the worker rotate several input sets
    provider = cpu(prepare, l2_bytes=10 << 20, baseline=matmul)
    row = measure(provider, TASK, PAIRED, lambda _: None)
    assert row["status"] == "FAILED" and "NaN/inf values in rotated outputs" in row["error"]


def test_telemetry_result_goes_into_the_row():
    class Fake:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def result(self):
            return {"sm_clock_mhz": 1500.0, "power_w": 650.0}

    provider = cpu(matmul, telemetry=Fake)
    row = measure(provider, TASK, SETTINGS, lambda _: None)
    assert row["sm_clock_mhz"] == 1500.0 and row["power_w"] == 650.0


def test_paired_timing_gets_the_long_warm_up_once_and_the_rounds_asked_for(monkeypatch):
    from gluon_survey.driver import timing

    calls = []
    real = timing.time_paired

    def spy(make_run, make_baseline, n_copies, warmup_ms, rewarm_ms, rounds, **kw):
        calls.append((warmup_ms, rewarm_ms, rounds))
        return real(make_run, make_baseline, n_copies, warmup_ms=0, rewarm_ms=0, rounds=rounds, **kw)

    monkeypatch.setattr(timing, "time_paired", spy)
    provider = cpu(matmul, baseline=matmul)
    settings = replace(PAIRED, warmup_ms=1000.0, rewarm_ms=200.0, rounds=3)
    row = measure(provider, TASK, settings, lambda _: None)
    assert row["status"] == "OK"
    assert calls == [(1000.0, 200.0, 3)]  # cuBLAS's warm-up, then the mode's short one
    assert len(row["x_rounds"]) == 3 and all(r > 0 for r in row["x_rounds"])


def test_settings_may_come_as_json_with_the_defaults_for_what_is_missing(monkeypatch):
    from gluon_survey.driver import timing

    seen = {}
    real = timing.time_paired

    def spy(make_run, make_baseline, n_copies, **kw):
        seen.update(kw)
        return real(make_run, make_baseline, n_copies, **kw | {"warmup_ms": 0, "rewarm_ms": 0, "min_ms": 1})

    monkeypatch.setattr(timing, "time_paired", spy)
    row = measure(cpu(matmul, baseline=matmul), TASK, {"seed": 1, "max_iters": 50}, lambda _: None)
    defaults = Settings()
    assert row["status"] == "OK" and len(row["x_rounds"]) == defaults.rounds  # paired by default
    assert (seen["warmup_ms"], seen["rewarm_ms"]) == (defaults.warmup_ms, defaults.rewarm_ms)
    assert seen["max_iters"] == 50
