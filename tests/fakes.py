"""Fake modes for testing the sweep's isolation machinery without a GPU: providers that crash the
worker, hang it, or multiply on the CPU, and the hooks that put them in place of the real ones.

    _crash   the first call aborts the worker process (SIGABRT)
    _hang    the first call never returns
    _ok_cpu  torch.matmul on CPU tensors (torch._scaled_mm for fp8 and fp8-row), timed by the
             host's wall clock; paired with a CPU "cuBLAS" (the same again), so paired timing
             runs too
    _fp16_cpu  _ok_cpu without fp8 kernels (`registry.Mode.fp8` False): its fp8 tasks are SKIPPED
    _grouped_cpu  a grouped mode (`registry.Mode.grouped`): torch.mm per expert on the CPU
             (fp8-row: torch._scaled_mm per expert), paired with torch._grouped_mm on the CPU
             (fp8-row: the per-expert loop again, torch._scaled_grouped_mm being CUDA-only); its
             dense tasks are SKIPPED, as the dense fakes' grouped ones are

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
from gluon_survey.driver.worker import (
    Provider,
    _grouped_baseline_launch,
    cublas_product,
    grouped_cublas_product,
)
from gluon_survey.launch import Launch

HERE = Path(__file__).resolve().parent
WORKER_COMMAND = (sys.executable, str(HERE / "fake_worker.py"))
CLI_COMMAND = (sys.executable, str(HERE / "fake_cli.py"))
CONFIG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64}  # what the _ok_cpu rows say they ran
MODES = tuple(
    registry.Mode(name, summary, "test", ("cpu",), __name__, fp8=fp8, grouped=grouped)
    for name, summary, fp8, grouped in (
        ("_crash", "aborts the worker process", False, False),
        ("_hang", "never returns", False, False),
        ("_ok_cpu", "torch.matmul (fp8: torch._scaled_mm) on the CPU, wall-clock timer", True, False),
        ("_fp16_cpu", "torch.matmul on the CPU, wall-clock timer, no fp8", False, False),
        ("_grouped_cpu", "torch.mm per expert on the CPU, wall-clock timer", True, True),
    )
)
GROUPED_CONFIG = {"impl": "torch.mm per expert (a fake)"}  # what the _grouped_cpu rows say they ran


def unsupported_reason(capability: tuple[int, int] | None) -> str | None:
    """The provider-module hook of `registry.Mode` (`gluon-survey list`): the fakes run anywhere."""
    return None


def fake_provider(mode_name: str) -> Provider:
    """The provider of a fake mode: CPU tensors, a wall-clock timer, no L2 rotation."""
    torch.set_num_threads(1)  # steadier wall-clock times on a shared CI machine

    def prepare(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, **scales: torch.Tensor) -> Launch:
        if mode_name == "_crash":
            return Launch(os.abort)
        if mode_name == "_hang":
            return Launch(threading.Event().wait)
        if mode_name in ("_ok_cpu", "_fp16_cpu"):
            return Launch(lambda: cublas_product(a, b, out, **scales), dict(CONFIG))
        raise KeyError(f"not a fake mode: {mode_name!r}")

    def baseline(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, **scales: torch.Tensor) -> Launch:
        return Launch(lambda: cublas_product(a, b, out, **scales))

    def prepare_grouped(
        x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, out: torch.Tensor, **scales: torch.Tensor
    ) -> Launch:
        return Launch(lambda: grouped_cublas_product(x, w, offs, out, **scales), dict(GROUPED_CONFIG))

    mode = next((m for m in MODES if m.name == mode_name), None)
    if mode is None:
        raise KeyError(f"not a fake mode: {mode_name!r}")
    kind = {
        "no_fp8": None if mode.fp8 else f"mode {mode_name!r} has no fp8 kernel (a fake)",
        "grouped": mode.grouped,
        "wrong_shape": registry.wrong_shape_reason(mode, not mode.grouped),
    }
    if mode.grouped:
        return Provider(
            "cpu",
            prepare_grouped,
            WallClock(),
            None,
            0,
            lambda: 1 << 30,
            baseline=grouped_cpu_baseline,
            **kind,
        )
    return Provider("cpu", prepare, WallClock(), None, 0, lambda: 1 << 30, baseline=baseline, **kind)


def grouped_cpu_baseline(
    x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, out: torch.Tensor, **scales: torch.Tensor
) -> Launch:
    """The grouped fakes' paired baseline: the worker's (torch._grouped_mm) for fp16/bf16, which
    runs on the CPU; for fp8-row, whose torch._scaled_grouped_mm does not, the per-expert loop."""
    if not scales:
        return _grouped_baseline_launch(x, w, offs, out)
    return Launch(lambda: grouped_cublas_product(x, w, offs, out, **scales))


def install(setattr: Callable[[object, str, object], None]) -> None:
    """Make this process's CLI time the fake modes (as well as the real ones) on the CPU: the
    registry knows them (so `registry.get` validates their names), the runner starts the fake
    worker, and the CLI neither asks for a CUDA GPU nor calls its timer CUDA events."""
    setattr(registry, "MODES", registry.MODES + MODES)
    setattr(runner, "WORKER_COMMAND", WORKER_COMMAND)
    setattr(cli, "_cuda_available", lambda: True)
    setattr(cli, "TIMER", "host wall clock")
