"""A stand-in for a @gluon.jit kernel in the CPU tests that fake a GPU: `kernel[grid](*args,
**kwargs)` records the launch instead of running it (or, with no log, does nothing at all)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Launched:
    kernel: str
    grid: tuple
    args: tuple
    kwargs: dict

    @property
    def descriptors(self) -> tuple:
        """The A, B and C descriptors: the first three arguments of every rung kernel."""
        return self.args[:3]

    @property
    def rest(self) -> tuple:
        """What follows the descriptors: (scale_a, scale_b) for the rungs that take fp8 scales,
        None and None for fp16/bf16 operands; then the bias, None without one."""
        return self.args[3:]


class Recorder:
    def __init__(self, name: str, log: list[Launched] | None):
        self.name, self.log = name, log

    def __getitem__(self, grid):
        if self.log is None:  # for timing the host path: a launch that does nothing
            return _no_launch
        return lambda *args, **kwargs: self.log.append(Launched(self.name, tuple(grid), args, kwargs))


def _no_launch(*args, **kwargs):
    pass
