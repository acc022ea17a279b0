"""The one timer every provider is measured with.

Method
------
* **Cold L2 by rotation, not by flushing.** The timed loop cycles through independent input sets
  (A, B, C): iteration i runs set i mod n, with n chosen by `copies_for_cold_l2` so that the sets
  together span at least 3x the L2 cache (one set when a single set already does; at most 8 GiB
  of copies). Each GEMM therefore starts with its operands out of L2, as in a model where the
  previous layer touched other data, and no flush kernel runs inside or next to the timed window.
* **Warm-up to the power-limited steady state, by measured time.** One untimed call per set
  absorbs first-call costs (a library's handle and workspace set-up can take longer than the
  whole warm-up); then calls run in timed chunks of whole passes over the sets until `warmup_ms`
  of GPU time has passed, and the last chunk's mean, taken at the steady clock, sizes the timed
  loop (sizing it from the first calls instead once let a slow first call cut the warm-up to
  milliseconds: perf-notes entry 13). A large GEMM drives an H100 SXM to its power limit: its SM
  clock falls from the idle boost within a fraction of a second and keeps sinking for seconds as
  the chip warms, so a short warm-up measures the boost transient and favours whatever ran after
  an idle gap (perf-notes entry 11 has the clocks and the errors that caused). JIT compilation and
  autotuning happened even earlier, in the first call, reported as `compile_s`.
* **Per-iteration CUDA events.** Each timed iteration records a start event, launches, records an
  end event; there is no synchronisation inside the loop, one at the end. The iteration count
  covers at least `min_ms` of GPU time, between `min_iters` and `max_iters`, and at least one
  pass over the sets. Host launch overhead counts only when the GPU waits for it, i.e. for
  kernels of a few microseconds.
* **Queued: GPU time for host-bound kernels** (`queued`, the CLI's `--gpu-time`; off by default).
  A kernel shorter than its launch (a decode GEMM: ~10 us on the GPU, 10-25 us to launch) leaves
  the GPU waiting for the host between iterations, and each iteration's events then time the
  launch. Queued, the warm-up chunks and the timed windows enqueue a sleep kernel (`Clock.hold`)
  before every `BURST` calls, long enough for the host to get ahead: HOLD_FACTOR x calls x (the
  host's time to enqueue a call - the call's GPU time) + HOLD_MARGIN_US, both measured in the
  previous window of the same calls (the host's on its first burst, which fits in the launch
  queue; later a full queue only blocks the host while the GPU has work). The events then time
  the calls back to back on the GPU. A call not yet enqueued when the GPU reached its start event
  (host time since the window's first event > GPU time to that start event: a conservative test)
  may include idle GPU time; it stays in the samples and is counted (`Timing.starved`, a row's
  `starved`), and from then on the holds cover the host's whole enqueue time, not the difference.
* **A distribution, not one number.** The median is the reported time; p20, p80 and the minimum
  are kept; spread = (p80 - p20) / median, and a measurement whose spread exceeds 5 % is flagged
  NOISY. TFLOP/s are computed from the median.
* **A baseline timed alongside, in alternating windows** (`time_paired`): after the baseline's
  warm-up and a short one of the kernel's, baseline and kernel take turns in windows of min_ms
  each, the baseline first and last (`rounds` windows of the kernel, rounds + 1 of the baseline).
  Each round's ratio divides the mean of the baseline's window medians either side by the kernel's
  window median, which cancels the clock's slow drift; the reported ratio is the median over the
  rounds, and their range shows how much is left. (A ratio of medians pooled over all windows
  can fall outside the rounds' range: the samples sit at a few discrete clock levels, and a
  pooled median jumps between them.) A cell whose samples, its own or the baseline's, are still
  NOISY after `rounds` takes more rounds, one window of each at a time, up to `noisy_rounds` in
  all: where a call is about as long as its launch, single rounds of the same cuBLAS call against
  itself ranged 0.75-1.21 on an H200, and three of them put identical calls at 0.81x (nine:
  0.99-1.02x; results/experiments/h200-noisy-rounds). The choice to go on looks only at the
  spread, never at the ratio, so it cannot favour either side.
* **Settled windows.** At the power limit (every large GEMM on an H100 or H200) the SM clock
  follows the power draw, and the power-management loop carries its state from one window into the
  next. Back to back, the second window starts at the clock the first one's calls left, so the
  side that draws more power borrows the other's headroom: on an H200, `auto` (warpspec) against
  cuBLAS fp8 over 48 cells of 3072-16384 tokens read 1.065x in bare alternating windows of 50 ms
  and 1.015x where each window followed 200 ms of its own side's calls, with cuBLAS against itself
  at 1.002x and 0.999x (results/experiments/h200-fp8-power). So each alternating window follows
  `settle_ms` of its own side's calls, untimed, ending on the set before the window's first (so
  the window's first call still finds its set out of L2). Queued windows are not settled (each
  opens on a hold that idles the GPU), nor is work on a clock that is not power-limited
  (`Clock.power_limited`: the CPU's wall clock). Whether less than 200 ms settles the clock is not
  measured.
* **Interleaved pairing** (`interleave`, the CLI's `--interleave`): by default where both sides'
  calls are shorter than `interleave_below_ms` (their warm-ups' estimates; 60 µs), and not with
  `queued`. Where a call is host-bound, its time a call is the host's launch time, and a virtual
  machine's host changes speed from one 50 ms window to the next: nine alternating rounds of cuBLAS's fp8
  call against itself still read 0.78-1.12 (results/h100-dense-sweep, fp8-row-f0a3e59).
  Interleaved, each window takes the kernel's calls and the baseline's in turn, spread evenly over
  it (the side behind its share of the window's calls goes next), so both sides sample the same
  stretch of the host's and the clock's history, and a round's ratio is the baseline's window
  median over the kernel's. The baseline's rotation over the input sets starts half-way round, so
  neither side finds the other's last set in L2. Measured (results/experiments/interleave-aa):
  `auto` running cuBLAS against cuBLAS on 19 fp8-row cells of 30-60 µs read 0.981-1.080
  alternating and 0.986-1.005 interleaved on an H100, 0.993-1.005 on an H200. Longer calls keep
  alternating windows: there the GPU, not the host, sets the time, the alternating rounds already
  agree (p20-p80 under 1 % from 60 µs up), and at the power limit a compute-bound kernel's clock
  follows its own power draw, which interleaving averages with the baseline's (docs/perf-notes.md,
  entry 8: ping-pong read 1.03-1.06x interleaved where sustained windows read 0.95-1.01x).

The defaults of `warmup_ms`, `rewarm_ms`, `settle_ms`, `min_ms`, `rounds`, `noisy_rounds`,
`min_iters`, `max_iters`, `queued`, `interleave` and `interleave_below_ms` are those of
`gluon_survey.driver.settings.Settings`, the one place they are written.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Protocol

import numpy as np

from gluon_survey.driver.settings import DEFAULTS

NOISY_SPREAD = 0.05
L2_FACTOR = 3
COPIES_BUDGET_BYTES = 8 << 30
WARMUP_CHUNK_MS = 250.0  # warm-up runs in chunks of about this much GPU time, each one timed
# Queued timing (module docstring): a hold before every BURST calls, whose launches and events fit
# the launch queue (about a thousand entries), sized HOLD_FACTOR x the host's lead + the margin.
BURST = 100
HOLD_FACTOR = 1.5
HOLD_MARGIN_US = 100.0
HOST_GUESS_MS = 0.1  # a call's host enqueue time, until the first window measures it


def copies_for_cold_l2(bytes_per_set: int, l2_bytes: int, budget_bytes: int = COPIES_BUDGET_BYTES) -> int:
    """How many input sets make the rotation span at least 3x L2, capped by `budget_bytes` (min 1)."""
    if bytes_per_set <= 0:
        raise ValueError(f"bytes_per_set must be positive, got {bytes_per_set}")
    wanted = max(1, math.ceil(L2_FACTOR * l2_bytes / bytes_per_set))
    affordable = max(1, budget_bytes // bytes_per_set)
    return min(wanted, affordable)


@dataclass(frozen=True)
class Timing:
    """Summary of the per-iteration times of one measurement, in milliseconds."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    n: int
    starved: int = 0  # queued: samples the host may have delayed (module docstring); 0 otherwise

    @classmethod
    def from_samples(cls, samples_ms: list[float], starved: int = 0) -> Timing:
        if not samples_ms:
            raise ValueError("no samples")
        p20, median, p80 = np.percentile(np.asarray(samples_ms, dtype=np.float64), [20, 50, 80])
        return cls(float(median), float(p20), float(p80), float(min(samples_ms)), len(samples_ms), starved)

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the relative width of the middle 60 % of samples."""
        return (self.p80_ms - self.p20_ms) / self.median_ms if self.median_ms > 0 else math.inf

    @property
    def noisy(self) -> bool:
        return self.spread > NOISY_SPREAD


class Clock(Protocol):
    """Marks points on the timeline the work runs on, and measures between them."""

    name: str
    # whether the work runs on a GPU whose clock follows its power draw: only then are alternating
    # windows settled (module docstring, "Settled windows")
    power_limited: bool

    def mark(self) -> object: ...

    def elapsed_ms(self, start: object, end: object) -> float: ...

    def synchronize(self) -> None: ...

    def hold(self, us: float) -> None:
        """Keep the work's timeline busy for about `us` microseconds (queued timing)."""


def sleep_cycles_per_us() -> float:
    """GPU clock cycles per microsecond of `torch.cuda._sleep`, measured (the clock is whatever the
    GPU runs at now; the sleep only has to be long enough, and its users check that it was)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    for _ in range(2):  # the first wakes the clock up
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
    return cycles / (start.elapsed_time(end) * 1e3)


class CudaEventClock:
    """CUDA events on the current stream: GPU time, no host synchronisation per mark."""

    name = "cuda-events"
    power_limited = True

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._cycles_per_us: float | None = None  # of the sleep kernel, measured on the first hold

    def mark(self) -> object:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed_ms(self, start: object, end: object) -> float:
        return start.elapsed_time(end)  # type: ignore[attr-defined]

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def hold(self, us: float) -> None:
        """A sleep kernel of about `us` microseconds on the current stream."""
        if self._cycles_per_us is None:
            self._cycles_per_us = sleep_cycles_per_us()
        self._torch.cuda._sleep(int(us * self._cycles_per_us))


class WallClock:
    """Host wall-clock time, for work that runs synchronously on the CPU (the test providers)."""

    name = "wall-clock"
    power_limited = False  # CPU work: nothing to settle

    def mark(self) -> object:
        return perf_counter()

    def elapsed_ms(self, start: object, end: object) -> float:
        return (end - start) * 1e3  # type: ignore[operator]

    def synchronize(self) -> None:
        pass

    def hold(self, us: float) -> None:
        pass  # the work runs synchronously: there is no queue to keep ahead of


def _first_calls(runs: list[Callable[[], object]], clock: Clock) -> None:
    """One call of each: lazy set-up (a library's handle, a JIT compile), not timed and not used
    as an estimate."""
    for run in runs:
        run()
    clock.synchronize()


def _warm_up(
    runs: list[Callable[[], object]], clock: Clock, warmup_ms: float, queue: _Queue | None = None
) -> float:
    """Run timed chunks of whole passes over `runs` (at least one, which also gives the estimate)
    until `warmup_ms` of GPU time has passed, each chunk sized from the previous one's mean; the
    last chunk's mean time per call, at the clock the GPU has settled to. With a `queue`, each
    chunk is a queued window (whose calls' times add up to the chunk's), which also sizes the
    holds of the windows after it."""
    passes, warmed_ms, n_copies = 1, 0.0, len(runs)
    while True:
        if queue is None:
            start = clock.mark()
            for i in range(passes * n_copies):
                runs[i % n_copies]()
            end = clock.mark()
            clock.synchronize()
            chunk_ms = clock.elapsed_ms(start, end)
        else:
            chunk_ms = sum(_queued_window(runs, clock, passes * n_copies, queue)[0])
        warmed_ms += chunk_ms
        estimate_ms = max(chunk_ms / (passes * n_copies), 1e-6)
        if warmed_ms >= warmup_ms:
            return estimate_ms
        wanted_ms = min(warmup_ms - warmed_ms, WARMUP_CHUNK_MS)
        passes = max(1, math.ceil(wanted_ms / (estimate_ms * n_copies)))


def _iterations(min_ms: float, estimate_ms: float, min_iters: int, max_iters: int, n_copies: int) -> int:
    """Enough iterations to cover min_ms, within [min_iters, max_iters], and at least one pass."""
    return max(min(max(math.ceil(min_ms / estimate_ms), min_iters), max_iters), n_copies)


def _timed_window(runs: list[Callable[[], object]], clock: Clock, n_iters: int) -> list[float]:
    """n_iters calls in rotation, a start and an end mark around each, one synchronisation at the end."""
    marks = []
    for i in range(n_iters):
        begin = clock.mark()
        runs[i % len(runs)]()
        marks.append((begin, clock.mark()))
    clock.synchronize()
    return [clock.elapsed_ms(b, e) for b, e in marks]


@dataclass
class _Queue:
    """Queued timing of one set of calls: what the last window measured, which sizes the holds."""

    host_ms: float = HOST_GUESS_MS  # the host's time to enqueue one call and its two events
    gpu_ms: float = 0.0  # one call's GPU time
    starved: bool = False  # a window starved: from then on, hold for the host's whole enqueue time

    def hold_us(self, calls: int) -> float:
        """Long enough for the host to enqueue `calls` calls before the GPU has run out of them."""
        lead_ms = self.host_ms if self.starved else max(self.host_ms - self.gpu_ms, 0.0)
        return HOLD_FACTOR * calls * lead_ms * 1e3 + HOLD_MARGIN_US


def _queued_window(
    runs: list[Callable[[], object]], clock: Clock, n_iters: int, queue: _Queue
) -> tuple[list[float], int]:
    """`_timed_window` with a hold before every BURST calls (module docstring): the samples, and how
    many calls were starved, i.e. not yet enqueued when the GPU reached their start event. The GPU
    reached `lead` no earlier than the host's `t_lead`, so the test never misses a wait."""
    marks, enqueued = [], []
    t_lead = perf_counter()
    lead = clock.mark()
    for first in range(0, n_iters, BURST):
        calls = min(BURST, n_iters - first)
        clock.hold(queue.hold_us(calls))
        t_burst = perf_counter()
        for i in range(first, first + calls):
            begin = clock.mark()
            runs[i % len(runs)]()
            marks.append((begin, clock.mark()))
            enqueued.append(perf_counter())
        if first == 0:  # the first burst fits the launch queue: the host's own pace
            host_ms = (enqueued[-1] - t_burst) * 1e3 / calls
    clock.synchronize()
    samples = [clock.elapsed_ms(b, e) for b, e in marks]
    starved = sum(
        (t - t_lead) * 1e3 > clock.elapsed_ms(lead, b) for t, (b, _) in zip(enqueued, marks, strict=True)
    )
    queue.host_ms, queue.gpu_ms = host_ms, float(np.median(samples))
    queue.starved = queue.starved or starved > 0
    return samples, starved


def _interleaved_window(
    runs: list[Callable[[], object]],
    base: list[Callable[[], object]],
    clock: Clock,
    n_run: int,
    n_base: int,
) -> tuple[list[float], list[float]]:
    """n_run calls of `runs` and n_base of `base`, each side in rotation over its sets, taken in
    turn so that both spread evenly over the window: the side with the smaller share of its calls
    done goes next (the kernel on a tie). The baseline's rotation starts half-way round the sets,
    so that neither side reads a set the other has just pulled into L2. A start and an end mark
    around each call, one synchronisation at the end; the two sides' samples."""
    marks: tuple[list, list] = ([], [])
    sides = (runs, base)
    done = [0, 0]
    start = (0, len(base) // 2)
    while done[0] < n_run or done[1] < n_base:
        side = 0 if done[0] * n_base <= done[1] * n_run and done[0] < n_run else 1
        calls = sides[side]
        begin = clock.mark()
        calls[(start[side] + done[side]) % len(calls)]()
        marks[side].append((begin, clock.mark()))
        done[side] += 1
    clock.synchronize()
    return tuple([clock.elapsed_ms(b, e) for b, e in m] for m in marks)  # type: ignore[return-value]


def _settle(runs: list[Callable[[], object]], settle_ms: float, estimate_ms: float, max_iters: int) -> None:
    """About `settle_ms` of untimed calls of `runs` (at most max_iters), in rotation, ending on the
    last set so that the timed window after them starts on set 0, the one read longest ago; no
    synchronisation, so the window's calls follow them on the GPU without a pause."""
    n = min(math.ceil(settle_ms / max(estimate_ms, 1e-6)), max_iters) if settle_ms > 0 else 0
    for i in range(-n, 0):
        runs[i % len(runs)]()


def _window(
    runs: list[Callable[[], object]], clock: Clock, n_iters: int, queue: _Queue | None
) -> tuple[list[float], int]:
    """A timed window, queued when there is a `queue`: the samples and the starved count."""
    if queue is None:
        return _timed_window(runs, clock, n_iters), 0
    return _queued_window(runs, clock, n_iters, queue)


def time_fn(
    make_run: Callable[[int], Callable[[], object]],
    n_copies: int,
    warmup_ms: float = DEFAULTS.warmup_ms,
    min_ms: float = DEFAULTS.min_ms,
    min_iters: int = DEFAULTS.min_iters,
    max_iters: int = DEFAULTS.max_iters,
    queued: bool = DEFAULTS.queued,
    clock: Clock | None = None,
) -> Timing:
    """Time `make_run(i)()` for input sets i = 0..n_copies-1 in rotation (see the module docstring).

    `make_run(i)` returns the zero-argument launch for set i; it is called once per set, before
    any timing. `queued`: keep the host ahead with holds (GPU time). `clock` defaults to CUDA events.
    """
    clock = clock or CudaEventClock()
    runs = [make_run(i) for i in range(n_copies)]
    queue = _Queue() if queued else None
    _first_calls(runs, clock)
    estimate_ms = _warm_up(runs, clock, warmup_ms, queue)
    n_iters = _iterations(min_ms, estimate_ms, min_iters, max_iters, n_copies)
    return Timing.from_samples(*_window(runs, clock, n_iters, queue))


@dataclass(frozen=True)
class PairedTiming:
    """A kernel and its baseline timed on the same inputs, in alternating windows or interleaved."""

    timing: Timing  # the kernel: all of its windows' samples together
    baseline: Timing  # the baseline: all of its windows' samples together
    # Per kernel window: baseline / kernel, the baseline the mean of its windows either side
    # (interleaved: its calls in the same window).
    rounds: tuple[float, ...]
    drift: float  # the baseline's last window / its first - 1: how much the GPU changed meanwhile
    interleaved: bool = False  # each round one window of both sides' calls in turn
    # The host's perf_counter() at the start and end of each timed window, with the settling calls
    # before it: ("kernel" | "baseline" | "both" (interleaved), start, end). What ran on the GPU
    # then, to attribute telemetry to a side (`hardware.Telemetry.result`).
    spans: tuple[tuple[str, float, float], ...] = ()

    @property
    def ratio(self) -> float:
        """Baseline time / kernel time, as reported (`round_ratio`)."""
        return round_ratio(self.rounds)


def round_ratio(rounds: Sequence[float]) -> float:
    """The ratio reported for a paired cell, baseline time / kernel time (> 1: the kernel is
    faster): the median over its rounds (the report computes it from a row's `x_rounds`)."""
    return float(np.median(rounds))


def time_paired(
    make_run: Callable[[int], Callable[[], object]],
    make_baseline: Callable[[int], Callable[[], object]],
    n_copies: int,
    warmup_ms: float = DEFAULTS.warmup_ms,
    rewarm_ms: float = DEFAULTS.rewarm_ms,
    min_ms: float = DEFAULTS.min_ms,
    rounds: int = DEFAULTS.rounds,
    settle_ms: float = DEFAULTS.settle_ms,
    min_iters: int = DEFAULTS.min_iters,
    max_iters: int = DEFAULTS.max_iters,
    queued: bool = DEFAULTS.queued,
    clock: Clock | None = None,
    noisy_rounds: int = DEFAULTS.noisy_rounds,
    interleave: bool | None = DEFAULTS.interleave,
    interleave_below_ms: float = DEFAULTS.interleave_below_ms,
) -> PairedTiming:
    """Time a kernel against a baseline in alternating windows: baseline, kernel, baseline, ...,
    kernel, baseline (`rounds` kernel windows of about min_ms of GPU time each, between rounds + 1
    baseline windows of the same size).

    Why alternate: at its power limit an H100's clock steps between discrete levels and drifts for
    seconds as the chip warms, so one baseline window before and one after a kernel's can put a
    few per cent into a single ratio; alternating windows put both under the same clock history,
    and the per-round ratios show how much is left. Why not shorter windows: each starts off the
    steady clock (the pause at its synchronisation), and short windows scattered the rounds
    (docs/perf-notes.md, entry 16, has the measurements). Each window follows `settle_ms` of its
    own side's untimed calls, so that its clock is its own (module docstring, "Settled windows").
    The warm-up is the baseline's (`warmup_ms`), then a short one of the kernel's (`rewarm_ms`);
    min_iters and max_iters bound the samples of all of the kernel's windows together (of its
    first `rounds`: more rounds take windows of the same size). While the kernel's samples or the
    baseline's are NOISY, another round (a
    window of each) follows, up to `noisy_rounds` rounds in all (module docstring). `queued`: both
    keep the host ahead (holds of their own), as in `time_fn`. `interleave`: each round is one
    window of both sides' calls taken in turn (`_interleaved_window`; not with `queued`), and
    `drift` compares the baseline's first and last rounds; None: where both warm-ups' estimates
    are under `interleave_below_ms` and not `queued` (module docstring).
    """
    if interleave and queued:
        raise ValueError("interleaved pairing times each call as it is made: it does not combine with queued")
    clock = clock or CudaEventClock()
    runs = [make_run(i) for i in range(n_copies)]
    base = [make_baseline(i) for i in range(n_copies)]
    run_queue, base_queue = (_Queue(), _Queue()) if queued else (None, None)
    _first_calls(runs + base, clock)
    base_estimate = _warm_up(base, clock, warmup_ms, base_queue)
    run_estimate = _warm_up(runs, clock, rewarm_ms, run_queue)
    bounds = (math.ceil(min_iters / rounds), max(1, max_iters // rounds), n_copies)
    n_run = _iterations(min_ms, run_estimate, *bounds)
    n_base = _iterations(min_ms, base_estimate, *bounds)
    if interleave is None:
        interleave = not queued and max(run_estimate, base_estimate) < interleave_below_ms
    run_windows: list[tuple[list[float], int]] = []
    spans: list[tuple[str, float, float]] = []
    if interleave:
        base_windows: list[tuple[list[float], int]] = []
        while _another_round(run_windows, base_windows, rounds, noisy_rounds):
            start = perf_counter()
            run_samples, base_samples = _interleaved_window(runs, base, clock, n_run, n_base)
            spans.append(("both", start, perf_counter()))
            run_windows.append((run_samples, 0))
            base_windows.append((base_samples, 0))
    else:

        def settled(
            side: str, calls: list[Callable[[], object]], estimate: float, n: int, queue: _Queue | None
        ) -> tuple[list[float], int]:
            start = perf_counter()
            if queue is None and clock.power_limited:  # a queued window opens on an idling hold
                _settle(calls, settle_ms, estimate, max_iters)
            window = _window(calls, clock, n, queue)
            spans.append((side, start, perf_counter()))
            return window

        base_windows = [settled("baseline", base, base_estimate, n_base, base_queue)]
        while _another_round(run_windows, base_windows, rounds, noisy_rounds):
            run_windows.append(settled("kernel", runs, run_estimate, n_run, run_queue))
            base_windows.append(settled("baseline", base, base_estimate, n_base, base_queue))
    return _paired_timing(run_windows, base_windows, interleave, tuple(spans))


def _paired_timing(
    run_windows: list[tuple[list[float], int]],
    base_windows: list[tuple[list[float], int]],
    interleaved: bool,
    spans: tuple[tuple[str, float, float], ...] = (),
) -> PairedTiming:
    """The kernel's and the baseline's windows summed up. A round's ratio divides the baseline's
    window median by the kernel window's: alternating, the baseline has a window either side of
    each of the kernel's (one more than the kernel) and takes their mean, which cancels a steady
    drift; interleaved, it has the one window both shared."""
    base_medians = [float(np.median(w)) for w, _ in base_windows]
    if len(base_windows) > len(run_windows):
        base_medians = [(a + b) / 2 for a, b in itertools.pairwise(base_medians)]
    ratios = tuple(b / float(np.median(w)) for b, (w, _) in zip(base_medians, run_windows, strict=True))
    return PairedTiming(
        timing=_pooled(run_windows),
        baseline=_pooled(base_windows),
        rounds=ratios,
        drift=float(np.median(base_windows[-1][0])) / float(np.median(base_windows[0][0])) - 1,
        interleaved=interleaved,
        spans=spans,
    )


def _another_round(run_windows: list, base_windows: list, rounds: int, noisy_rounds: int) -> bool:
    """Whether a paired timing takes another round: until it has `rounds`, then while either
    side's samples are NOISY, up to `noisy_rounds` (module docstring)."""
    if len(run_windows) < rounds:
        return True
    return len(run_windows) < noisy_rounds and (_pooled(run_windows).noisy or _pooled(base_windows).noisy)


def _pooled(windows: list[tuple[list[float], int]]) -> Timing:
    """The samples and starved counts of all `windows` (from `_window`) together."""
    return Timing.from_samples([t for w, _ in windows for t in w], sum(n for _, n in windows))
