"""The timing defaults are written once, in `driver.settings`: the CLI, the runner, the worker and
the timer all take them from there."""

import inspect
from dataclasses import asdict, replace

import pytest

from gluon_survey.driver import cli, runner, timing
from gluon_survey.driver.settings import DEFAULTS, Settings


def test_the_defaults():
    assert Settings() == DEFAULTS
    assert DEFAULTS.paired  # the CLI's default, and now the runner's too
    assert not DEFAULTS.queued  # each call timed as a user calls it, unless --gpu-time
    with pytest.raises(AttributeError):
        DEFAULTS.min_ms = 1.0  # type: ignore[misc]  # frozen


def test_the_cli_defaults_are_the_settings_defaults():
    args = cli.build_parser().parse_args([])
    assert (args.warmup_ms, args.min_ms, args.timeout) == (
        DEFAULTS.warmup_ms,
        DEFAULTS.min_ms,
        DEFAULTS.timeout_s,
    )
    assert (args.seed, args.paired, args.rounds) == (DEFAULTS.seed, DEFAULTS.paired, DEFAULTS.rounds)
    assert args.gpu_time == DEFAULTS.queued
    assert args.settle_ms == DEFAULTS.settle_ms
    assert cli.build_parser().parse_args(["--gpu-time"]).gpu_time is True


@pytest.mark.parametrize("fn", [timing.time_fn, timing.time_paired])
def test_the_timer_defaults_are_the_settings_defaults(fn):
    params = inspect.signature(fn).parameters
    names = [n for n in params if n in asdict(DEFAULTS)]
    assert names and all(params[n].default == getattr(DEFAULTS, n) for n in names)


def test_the_cli_defaults_follow_the_settings(monkeypatch):
    monkeypatch.setattr(cli, "DEFAULTS", replace(DEFAULTS, min_ms=7.0, paired=False, rounds=5, queued=True))
    args = cli.build_parser().parse_args([])
    assert (args.min_ms, args.paired, args.rounds, args.gpu_time) == (7.0, False, 5, True)
    assert cli.build_parser().parse_args(["--no-gpu-time"]).gpu_time is False


def test_workers_get_everything_but_the_time_limit_and_rebuild_it():
    settings = Settings(seed=3, warmup_ms=5.0, paired=False, rounds=2, timeout_s=9.0, queued=True)
    job = settings.worker_json()
    assert "timeout_s" not in job
    assert Settings.from_json(job) == replace(settings, timeout_s=DEFAULTS.timeout_s)
    assert Settings.from_json({**asdict(settings), "timer": "CUDA events"}) == settings  # a header's


def test_the_runner_uses_the_settings_type():
    assert runner.Settings is Settings
