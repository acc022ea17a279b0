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


class Recorder:
    def __init__(self, name: str, log: list[Launched] | None):
        self.name, self.log = name, log

    def __getitem__(self, grid):
        if self.log is None:  # for timing the host path: a launch that does nothing
            return _no_launch
        return lambda *args, **kwargs: self.log.append(Launched(self.name, tuple(grid), args, kwargs))


def _no_launch(*args, **kwargs):
    pass
