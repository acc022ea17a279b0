"""How every cell is measured: the one place the timing defaults are written.

The CLI's option defaults read `DEFAULTS`, the runner hands a `Settings` to each worker (as JSON,
`worker_json` / `from_json`), the worker's `measure` reads it, and `timing.time_fn` /
`timing.time_paired` take their keyword defaults from `DEFAULTS`. The results header records every
field (`dataclasses.asdict`). This module imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Settings:
    """How each task is measured; recorded in the results header."""

    seed: int = 0  # input seed: input set i of a task is drawn from seed + i
    warmup_ms: float = 2000.0  # before a cell's first timing: long enough to reach the power limit
    min_ms: float = 1000.0  # timed GPU time per window (a paired cell has `rounds` of them)
    min_iters: int = 20  # bounds on the timed iterations of a cell (all of its windows together)
    max_iters: int = 20000
    rewarm_ms: float = 200.0  # paired: the cell's own warm-up, after cuBLAS's, the GPU already hot
    # paired, alternating windows: untimed calls of a window's own side before it, so that at the
    # power limit each side runs at the clock its own power draw sets, not one inherited from the
    # other side's window (timing.py, "Settled windows"; results/experiments/h200-fp8-power)
    settle_ms: float = 200.0
    timeout_s: float = 600.0  # per task, compilation and autotuning included (the runner's limit)
    paired: bool = True  # time cuBLAS alongside every task of the other modes (worker.measure)
    rounds: int = 3  # paired: the task's timed windows of min_ms, alternating with cuBLAS's
    # paired: a cell whose samples (its own or cuBLAS's) spread more than timing.NOISY_SPREAD after
    # `rounds` takes more rounds, up to this many in all (timing.time_paired)
    noisy_rounds: int = 9
    queued: bool = False  # GPU time: sleep kernels keep the host ahead (timing.py); off: time per call
    # paired: the cell's calls and cuBLAS's taken in turn within each window instead of in
    # alternating windows (timing.py, "Interleaved pairing"); None: where both sides' calls are
    # shorter than interleave_below_ms (host-bound), and not with `queued`
    interleave: bool | None = None
    # The call length under which `interleave` None interleaves: alternating rounds scattered below
    # it (p20-p80 of the rounds 12-14 % at 20-40 µs, 2-3 % at 40-60 µs on an H100 lease) and
    # agreed within 1 % above it (timing.py, "Interleaved pairing")
    interleave_below_ms: float = 0.06
    bias: bool = False  # every product adds a bias [N] (matmul's bias=; cuBLAS: torch.addmm)

    def worker_json(self) -> dict[str, Any]:
        """What a worker needs (everything but the runner's time limit), as JSON."""
        return {k: v for k, v in asdict(self).items() if k != "timeout_s"}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Settings:
        """The settings in `data` (a job's or a results header's); fields it lacks keep their defaults."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


DEFAULTS = Settings()
