"""Fake modes for testing the sweep's isolation machinery without a GPU: providers that crash the
worker, hang it, or multiply on the CPU, and the hooks that put them in place of the real ones.

    _crash   the first call aborts the worker process (SIGABRT)
    _hang    the first call never returns
    _ok_cpu  torch.matmul on CPU tensors, timed by the host's wall clock; paired with a CPU
             "cuBLAS" (torch.matmul again), so paired timing runs too

`WORKER_COMMAND` starts `fake_worker.py`, a worker whose providers are these (hand it to
`runner.run_sweep(..., worker_command=...)`); `install(setattr)` makes the CLI of this process use
them (`fake_cli.py` does that in a process of its own; a test passes `monkeypatch.setattr`).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from gluon_survey import registry
from gluon_survey.driver import cli, runner
from gluon_survey.driver.timing import WallClock
from gluon_survey.driver.worker import Provider
from gluon_survey.launch import Launch

HERE = Path(__file__).resolve().parent
WORKER_COMMAND = (sys.executable, str(HERE / "fake_worker.py"))
CLI_COMMAND = (sys.executable, str(HERE / "fake_cli.py"))
CONFIG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64}  # what the _ok_cpu rows say they ran
MODES = tuple(
    registry.Mode(name, summary, "test", ("cpu",), __name__)
    for name, summary in (
        ("_crash", "aborts the worker process"),
        ("_hang", "never returns"),
        ("_ok_cpu", "torch.matmul on the CPU, wall-clock timer"),
    )
)


def unsupported_reason(capability: tuple[int, int] | None) -> str | None:
    """The provider-module hook of `registry.Mode` (`gluon-survey list`): the fakes run anywhere."""
    return None


def fake_provider(mode_name: str) -> Provider:
    """The provider of a fake mode: CPU tensors, a wall-clock timer, no L2 rotation."""
    torch.set_num_threads(1)  # steadier wall-clock times on a shared CI machine

    def prepare(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> Launch:
        if mode_name == "_crash":
            return Launch(os.abort)
        if mode_name == "_hang":
            return Launch(threading.Event().wait)
        if mode_name == "_ok_cpu":
            return Launch(lambda: torch.matmul(a, b, out=out), dict(CONFIG))
        raise KeyError(f"not a fake mode: {mode_name!r}")

    def baseline(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> Launch:
        return Launch(lambda: torch.matmul(a, b, out=out))

    return Provider("cpu", prepare, WallClock(), None, 0, lambda: 1 << 30, baseline=baseline)


def install(setattr: Callable[[object, str, object], None]) -> None:
    """Make this process's CLI time the fake modes (as well as the real ones) on the CPU: the
    registry knows them (so `registry.get` validates their names), the runner starts the fake
    worker, and the CLI neither asks for a CUDA GPU nor calls its timer CUDA events."""
    setattr(registry, "MODES", registry.MODES + MODES)
    setattr(runner, "WORKER_COMMAND", WORKER_COMMAND)
    setattr(cli, "_cuda_available", lambda: True)
    setattr(cli, "TIMER", "host wall clock")
