"""Suite-wide set-up.

* Tests marked `gpu` need a CUDA GPU; without one they are skipped, saying why (`pytest -rs` lists
  them; the closing line counts them).
* Shared fixtures: `hopper_or_blackwell` (GPU tests of the Gluon rungs skip elsewhere, saying
  why) and `sweeps` (the timing command with its sweep replaced).
* Every test plans its grouped launches anew (`gluon_survey.grouped.clear_plans`): a cached plan
  holds the kernel of the test that made it, which the CPU tests replace with a recorder.
* Tests marked `benchmark` assert on wall time, which a loaded CPU cannot promise: they are left
  out unless the -m expression names them (`pytest -m benchmark -s`).
* Quiet (-q) runs on pytest-xdist workers print dots, not the workers' start-up status lines
  (which xdist writes where the output is not a terminal, e.g. in CI's log).
* triton 3.9's libtriton reports nanobind reference "leaks" (a few hundred lines) at interpreter
  exit, after pytest has printed everything; no API turns the report off (triton silences it the
  same way in its own compile workers). With triton 3.9 or later, stderr goes to /dev/null at
  exit; the exit status is pytest's as before.
"""

import atexit
import os
import sys

import pytest
import torch
import triton


def _triton_version() -> tuple[int, ...]:
    return tuple(int(part) for part in triton.__version__.split(".")[:2] if part.isdigit())


def _quiet_exit() -> None:
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


if _triton_version() >= (3, 9):
    atexit.register(_quiet_exit)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminaldistreporter")  # xdist's, if running
    quiet = session.config.get_verbosity() < 0
    if quiet and reporter is not None and hasattr(reporter, "ensure_show_status"):
        reporter.ensure_show_status = lambda: None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "benchmark" not in (config.getoption("markexpr") or ""):
        benchmarks = [item for item in items if item.get_closest_marker("benchmark")]
        if benchmarks:
            config.hook.pytest_deselected(items=benchmarks)
            items[:] = [item for item in items if not item.get_closest_marker("benchmark")]
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_grouped_plans():
    from gluon_survey import grouped

    grouped.clear_plans()


@pytest.fixture
def hopper_or_blackwell():
    """The Gluon rungs run on sm_90 and sm_100 only: elsewhere their GPU tests skip, saying why."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if torch.cuda.get_device_capability()[0] not in (9, 10):
        pytest.skip("the Gluon rungs need sm_90 or sm_100")


@pytest.fixture
def hopper_only():
    """The grouped kernel (and what runs on it) is Hopper's: elsewhere its GPU tests skip, saying why."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the grouped kernel runs on sm_90 only")


@pytest.fixture
def sweeps(monkeypatch):
    """The timing command on a machine with a GPU whose sweep is replaced: the calls, no worker."""
    from gluon_survey.driver import cli, runner

    calls = []
    monkeypatch.setattr(cli, "_cuda_available", lambda: True)
    monkeypatch.setattr(runner, "run_sweep", lambda *args, **kwargs: calls.append((args, kwargs)) or [])
    return calls
