import itertools
import re

import numpy as np
import pytest

from gluon_survey.driver import timing
from gluon_survey.driver.timing import COPIES_BUDGET_BYTES, Timing, copies_for_cold_l2, time_fn, time_paired

MiB = 1 << 20


@pytest.mark.parametrize(
    ("set_bytes", "l2_bytes", "copies"),
    [
        (10 * MiB, 50 * MiB, 15),  # 15 x 10 MiB = 150 MiB = 3x L2
        (11 * MiB, 50 * MiB, 14),  # rounded up: 14 x 11 >= 150
        (150 * MiB, 50 * MiB, 1),  # one set already spans 3x L2
        (400 * MiB, 50 * MiB, 1),
        (10 * MiB, 0, 1),  # no L2 (CPU): one set
    ],
)
def test_copies_span_three_times_l2(set_bytes, l2_bytes, copies):
    assert copies_for_cold_l2(set_bytes, l2_bytes) == copies
    assert copies * set_bytes >= min(3 * l2_bytes, COPIES_BUDGET_BYTES) or copies == 1


def test_copies_are_capped_by_the_memory_budget():
    assert copies_for_cold_l2(10 * MiB, 50 * MiB, budget_bytes=40 * MiB) == 4
    assert copies_for_cold_l2(10 * MiB, 50 * MiB, budget_bytes=5 * MiB) == 1


def test_copies_need_a_positive_set_size():
    with pytest.raises(ValueError):
        copies_for_cold_l2(0, 50 * MiB)


def test_timing_statistics_use_numpy_percentiles():
    samples = [float(x) for x in range(1, 11)]
    t = Timing.from_samples(samples)
    p20, p50, p80 = np.percentile(samples, [20, 50, 80])
    assert (t.p20_ms, t.median_ms, t.p80_ms, t.min_ms, t.n) == (p20, p50, p80, 1.0, 10)
    assert t.spread == pytest.approx((p80 - p20) / p50)
    assert t.noisy


def test_noisy_threshold_is_five_percent():
    assert not Timing(1.0, 0.98, 1.02, 0.9, 20).noisy  # spread 4 %
    assert Timing(1.0, 0.97, 1.03, 0.9, 20).noisy  # spread 6 %
    with pytest.raises(ValueError):
        Timing.from_samples([])


class FakeClock:
    """Time advances only when a fake run executes; records synchronisations."""

    name = "fake"
    power_limited = True  # its windows are settled, as a GPU's are

    def __init__(self):
        self.now = 0.0
        self.syncs = 0

    def mark(self):
        return self.now

    def elapsed_ms(self, start, end):
        return end - start

    def synchronize(self):
        self.syncs += 1


def _runs(clock, durations, log):
    def make_run(i):
        def run():
            log.append(i)
            clock.now += durations[i]

        return run

    return make_run


def test_time_fn_rotates_sets_and_syncs_only_outside_the_loop():
    clock, log = FakeClock(), []
    durations = [1.0, 2.0, 3.0]
    t = time_fn(_runs(clock, durations, log), 3, warmup_ms=10, min_ms=30, min_iters=5, clock=clock)
    # one untimed pass; warm-up chunks of whole passes: 6 ms, then ceil(4 / 6) = 1 more pass
    # (12 ms >= 10); estimate 2 ms per call, so ceil(30 / 2) = 15 timed iterations in rotation.
    assert log == [0, 1, 2] * 3 + [i % 3 for i in range(15)]
    assert t.n == 15 and t.min_ms == 1.0 and t.median_ms == 2.0
    assert clock.syncs == 4  # after the first pass, after each warm-up chunk, after the timed loop


def test_slow_first_call_does_not_shorten_the_warm_up():
    """A first call that takes far longer than the rest (a library's lazy set-up) must neither cut
    the warm-up short nor size the timed loop: both follow the steady per-call time."""
    clock, log, first = FakeClock(), [], [True]

    def make_run(i):
        def run():
            log.append(i)
            clock.now += 500.0 if first[0] else 1.0
            first[0] = False

        return run

    t = time_fn(make_run, 2, warmup_ms=100, min_ms=40, min_iters=5, clock=clock)
    warm_calls = len(log) - 2 - t.n
    assert warm_calls >= 100  # >= 100 ms of 1 ms calls, not the single call a 250 ms estimate allows
    assert warm_calls <= 100 + 2  # and at most one pass more than asked
    assert t.n == 40 and t.median_ms == 1.0


def test_warm_up_runs_in_bounded_chunks():
    clock = FakeClock()
    time_fn(_runs(clock, [1.0], []), 1, warmup_ms=1000, min_ms=1, min_iters=1, clock=clock)
    # 1 first call + chunks of 1, 250, 250, 250, 249 calls + the timed call, a sync after each
    assert clock.syncs == 1 + 5 + 1


@pytest.mark.parametrize(
    ("min_ms", "min_iters", "max_iters", "n"),
    [(1.0, 20, 2000, 20), (1e6, 20, 50, 50), (1.0, 1, 2000, 4)],  # last: at least one pass over 4 sets
)
def test_time_fn_iteration_bounds(min_ms, min_iters, max_iters, n):
    clock = FakeClock()
    bounds = {"min_ms": min_ms, "min_iters": min_iters, "max_iters": max_iters}
    t = time_fn(_runs(clock, [1.0] * 4, []), 4, warmup_ms=0, clock=clock, **bounds)
    assert t.n == n


@pytest.mark.parametrize("settle", [0, 5])
def test_paired_windows_alternate_and_the_ratio_cancels_a_drifting_clock(settle):
    """Kernel runs take 1 ms and the baseline 1.1 ms, both stretched by a clock that slows by 1 %
    per window. Order: first calls, the baseline's warm-up, the kernel's, then windows B K B K B,
    each after `settle` ms of its own side's untimed calls (5 of either here), with no
    synchronisation between those and the window, and none of them among the samples."""
    clock, log = FakeClock(), []
    slow = [1.0]

    def make(name, ms):
        def make_run(i):
            def run():
                log.append(name)
                clock.now += ms * slow[0]

            return run

        return make_run

    syncs = []
    original = clock.synchronize

    def synchronize():  # every window ends in a synchronisation: the clock slows between windows
        syncs.append(len(log))
        slow[0] *= 1.01
        original()

    clock.synchronize = synchronize
    pair = time_paired(
        make("K", 1.0),
        make("B", 1.1),
        2,
        warmup_ms=4,
        rewarm_ms=2,
        min_ms=20,
        rounds=2,
        min_iters=2,
        settle_ms=settle,
        clock=clock,
    )
    windows = "".join(log[2 * 2 :])  # after the first calls of both
    nb = pair.baseline.n // 3  # 20 ms of 1.1 ms calls (slowed by the warm-ups' drift) per window
    s = 5 if settle else 0
    b, k = nb + s, 20 + s
    assert nb in (18, 19) and re.fullmatch(f"B+K+(B{{{b}}}K{{{k}}}){{2}}B{{{b}}}", windows)
    sides = [side for side, _, _ in pair.spans]
    assert sides == ["baseline", "kernel"] * 2 + ["baseline"]
    assert all(a <= b <= c for (_, a, b), (_, c, _) in itertools.pairwise(pair.spans))
    # one synchronisation a window, at its end: none between a window and its settling calls
    ends = list(itertools.accumulate([b, k, b, k, b]))
    assert syncs[-6:] == [len(log) - ends[-1]] + [len(log) - ends[-1] + e for e in ends]
    assert pair.timing.n == 40 and pair.baseline.n == 3 * nb
    # Each round's baseline is the mean of the windows either side, so a steady drift cancels.
    assert pair.rounds == pytest.approx((1.1, 1.1), rel=1e-4)
    assert pair.drift == pytest.approx(1.01**4 - 1)
    assert pair.ratio == pytest.approx(1.1, rel=0.02)


def _calls(clock, pattern, log, name):
    """A launch per set whose calls take the durations of `pattern` in turn (one cycle shared by
    every set), each call logged under `name`."""
    times = itertools.cycle(pattern)

    def make_run(i):
        def run():
            log.append(name)
            clock.now += next(times)

        return run

    return make_run


def _sets_logged(clock, log):
    """make(name): a launch per set whose 1 ms calls are logged as (name, set)."""

    def make(name):
        def make_run(i):
            def run():
                log.append((name, i))
                clock.now += 1.0

            return run

        return make_run

    return make


@pytest.mark.parametrize(("noisy_side", "rounds"), [(None, 2), ("K", 5), ("B", 5)])
def test_a_noisy_pair_takes_more_rounds_up_to_noisy_rounds(noisy_side, rounds):
    """Steady calls on both sides keep `rounds` windows each; calls that alternate 1 and 2 ms (a
    p20-p80 spread of 100 %) on either side keep adding a window of each, up to `noisy_rounds`, in
    the same alternation, baseline first and last."""
    clock, log = FakeClock(), []
    noisy, steady = (1.0, 2.0), (1.5,)
    pair = time_paired(
        _calls(clock, noisy if noisy_side == "K" else steady, log, "K"),
        _calls(clock, noisy if noisy_side == "B" else steady, log, "B"),
        1,
        warmup_ms=0,
        rewarm_ms=0,
        min_ms=10,
        rounds=2,
        noisy_rounds=5,
        min_iters=2,
        clock=clock,
    )
    assert len(pair.rounds) == rounds
    windows = re.sub(
        r"(.)\1*", r"\1", "".join(log[2 + 2 :])
    )  # runs of one side, after first calls and warm-ups
    assert windows == "B" + "KB" * rounds
    assert (pair.timing.noisy, pair.baseline.noisy) == (noisy_side == "K", noisy_side == "B")


def test_extra_rounds_never_shrink_below_rounds():
    """noisy_rounds below rounds: the cell still gets its `rounds` (the CLI passes the larger)."""
    clock = FakeClock()
    steady = _calls(clock, (1.0,), [], "K")
    pair = time_paired(
        steady, steady, 1, warmup_ms=0, rewarm_ms=0, min_ms=5, rounds=3, noisy_rounds=1, clock=clock
    )
    assert len(pair.rounds) == 3


def test_interleaved_windows_spread_both_sides_evenly_over_each_window():
    """With `interleave`, after the warm-ups each round is one window of both sides' calls in turn:
    the kernel (1 ms calls) and the baseline (2 ms) each get about min_ms of calls, and at every
    point of a window each side has done its share of that window's calls, to within one call."""
    clock, log = FakeClock(), []
    pair = time_paired(
        _calls(clock, (1.0,), log, "K"),
        _calls(clock, (2.0,), log, "B"),
        1,
        warmup_ms=0,
        rewarm_ms=0,
        min_ms=20,
        rounds=2,
        min_iters=2,
        clock=clock,
        interleave=True,
    )
    windows = "".join(log[2 + 2 :])  # after the first calls and the one-call warm-ups
    assert len(windows) == 2 * (20 + 10) and pair.timing.n == 40 and pair.baseline.n == 20
    for window in (windows[:30], windows[30:]):
        for end in range(1, 31):
            k, b = window[:end].count("K"), window[:end].count("B")
            assert abs(k / 20 - b / 10) <= 1 / 10
    assert pair.rounds == pytest.approx((2.0, 2.0)) and pair.drift == pytest.approx(0.0)
    assert [side for side, _, _ in pair.spans] == ["both", "both"]  # telemetry counts for either side


def test_interleaved_sides_never_read_the_set_the_other_side_just_read():
    """Both sides rotate over the same input sets; interleaved, the baseline starts half-way round,
    so a call never reads a set that one of the few calls before it read (which would find it in
    L2): every set a call reads was last read at least n_copies / 2 calls earlier."""
    clock, log = FakeClock(), []
    make = _sets_logged(clock, log)
    time_paired(
        make("K"), make("B"), 8, warmup_ms=0, rewarm_ms=0, min_ms=40, rounds=2, min_iters=2,
        clock=clock, interleave=True,
    )  # fmt: skip
    windows = log[3 * 8 :]  # after the first calls (16) and the one-round warm-ups (8)
    assert {name for name, _ in windows} == {"K", "B"} and len(windows) >= 80
    last: dict[int, int] = {}
    for n, (_, i) in enumerate(windows):
        assert n - last.get(i, -8) >= 4, f"set {i} read again {n - last[i]} calls after the last read"
        last[i] = n


def test_interleaving_cancels_a_host_that_changes_speed_between_windows():
    """The same call on both sides (an A/A pair) on a host whose speed changes at every
    synchronisation (one window to the next, 0.8x to 1.3x its call time): alternating windows put
    the change into each round's ratio, interleaved windows put it on both sides of every round."""

    def a_a(interleave):
        clock, speeds = FakeClock(), itertools.cycle((1.0, 1.3, 0.8, 1.2, 0.9))
        speed = [1.0]
        original = clock.synchronize

        def synchronize():
            speed[0] = next(speeds)
            original()

        clock.synchronize = synchronize

        def make_run(i):
            def run():
                clock.now += 0.02 * speed[0]

            return run

        return time_paired(
            make_run, make_run, 1, warmup_ms=1, rewarm_ms=1, min_ms=2, rounds=5, noisy_rounds=5,
            min_iters=2, clock=clock, interleave=interleave,
        )  # fmt: skip

    alternating, interleaved = a_a(False), a_a(True)
    assert max(abs(r - 1) for r in alternating.rounds) > 0.1
    assert interleaved.rounds == pytest.approx((1.0,) * 5)


@pytest.mark.parametrize(
    ("run_ms", "base_ms", "interleaved"),
    [
        (0.02, 0.03, True),  # both host-bound: interleaved
        (0.02, 0.2, False),  # one side's calls are long: alternating
        (0.2, 0.02, False),
        (0.059, 0.059, True),
        (0.061, 0.02, False),
    ],
)
def test_pairing_interleaves_by_default_where_both_calls_are_short(run_ms, base_ms, interleaved):
    """`interleave` None (the default) interleaves where both warm-ups' estimates are under
    `interleave_below_ms` (60 µs); queued timing never does (the starved-window test below)."""
    clock, log = FakeClock(), []
    pair = time_paired(
        _calls(clock, (run_ms,), log, "K"), _calls(clock, (base_ms,), log, "B"), 1, warmup_ms=1,
        rewarm_ms=1, min_ms=2, rounds=2, noisy_rounds=2, min_iters=2, clock=clock,
    )  # fmt: skip
    assert timing.DEFAULTS.interleave is None and timing.DEFAULTS.interleave_below_ms == 0.06
    assert pair.interleaved is interleaved
    # after the kernel's warm-up (its last run of calls), the rounds: alternating, they end in a
    # window of the baseline's calls; interleaved, neither side takes three calls in a row
    rounds = "".join(log).rsplit("KKK", 1)[-1]
    assert ("BBB" not in rounds) is interleaved and (len(rounds) > 50 or not interleaved)


def test_interleaving_does_not_combine_with_queued_timing():
    clock = FakeClock()
    steady = _calls(clock, (1.0,), [], "K")
    with pytest.raises(ValueError, match="does not combine with queued"):
        time_paired(
            steady, steady, 1, warmup_ms=0, rewarm_ms=0, min_ms=5, clock=clock, queued=True, interleave=True
        )


# ------------------------------------------------------------------------------------------------
# Queued timing (`queued`, the CLI's --gpu-time): GPU time for kernels shorter than their launch


class QueueClock:
    """A GPU behind a launch queue, in ms on two timelines: the host's (`host`), which each call
    advances by its launch time before the call is enqueued, and the GPU's, which runs each item
    once it is enqueued and the GPU is free (`free`: when it will be). A mark is stamped with the
    time the GPU reaches it; `hold(us)` enqueues a sleep. `events` logs the calls (by name) and the
    holds (their microseconds) in enqueue order. `perf_counter` is the host's clock, in seconds.
    With a `depth`, the host blocks while that many items wait in the queue."""

    name = "queue"
    power_limited = True

    def __init__(self, depth=None):
        self.host = self.free = 0.0
        self.events = []
        self.depth, self.starts, self.blocked = depth, [], 0

    def _enqueue(self, ms):
        if self.depth:
            waiting = [s for s in self.starts[-self.depth :] if s > self.host]
            if len(waiting) >= self.depth:  # full: the host waits for the GPU to take the oldest
                self.host, self.blocked = waiting[0], self.blocked + 1
        start = max(self.free, self.host)
        self.free = start + ms
        self.starts.append(start)
        return start

    def mark(self):
        return self._enqueue(0.0)

    def elapsed_ms(self, start, end):
        return end - start

    def synchronize(self):
        self.host = max(self.host, self.free)

    def hold(self, us):
        self.events.append(us)
        self._enqueue(us / 1e3)

    def perf_counter(self):
        return self.host / 1e3

    def launcher(self, name, launch_ms, gpu_ms, stall_at=None, stall_ms=0.0):
        """make_run for a kernel of `gpu_ms` that takes the host `launch_ms` to launch (its call
        number `stall_at` stalls the host for `stall_ms` first: a page fault, a context switch)."""
        calls = []

        def run():
            if len(calls) == stall_at:
                self.host += stall_ms
            calls.append(name)
            self.events.append(name)
            self.host += launch_ms
            self._enqueue(gpu_ms)

        return lambda i: run


@pytest.fixture
def gpu(monkeypatch):
    """A QueueClock whose host timeline is the one the timer reads."""
    from gluon_survey.driver import timing

    clock = QueueClock()
    monkeypatch.setattr(timing, "perf_counter", clock.perf_counter)
    return clock


DECODE = ("K", 0.020, 0.011)  # a decode GEMM: 11 us on the GPU, 20 us to launch (host-bound)
FIXED = {"warmup_ms": 0, "min_ms": 1e-3, "min_iters": 250, "max_iters": 250}  # one window of 250


def _holds(events):
    """(microseconds, calls enqueued behind it before the next hold) of every hold in `events`."""
    starts = [i for i, e in enumerate(events) if isinstance(e, float)]
    return [(events[i], (starts + [len(events)])[k + 1] - i - 1) for k, i in enumerate(starts)]


def _holds_before(events, name):
    """The microseconds of the holds in `events` that calls named `name` follow."""
    return [e for e, after in itertools.pairwise(events) if isinstance(e, float) and after == name]


def test_per_call_timing_of_a_host_bound_kernel_measures_its_launch(gpu):
    t = time_fn(gpu.launcher(*DECODE), 2, clock=gpu, **FIXED)
    assert t.median_ms == pytest.approx(0.020)  # the host's pace, not the kernel's 11 us
    assert not _holds(gpu.events) and t.starved == 0


def test_queued_timing_measures_the_kernel_back_to_back_on_the_gpu(gpu):
    t = time_fn(gpu.launcher(*DECODE), 2, clock=gpu, queued=True, **FIXED)
    assert t.median_ms == pytest.approx(0.011) and t.p80_ms == pytest.approx(0.011)
    assert t.n == 250 and t.starved == 0


def test_a_hold_precedes_every_burst_sized_from_the_host_estimate(gpu):
    time_fn(gpu.launcher(*DECODE), 2, clock=gpu, queued=True, **FIXED)
    holds = _holds(gpu.events)
    # 2 first calls (no hold), the warm-up's one pass (before anything is measured: the guess of
    # 0.1 ms per call, all of it), then the timed window of 250 calls in bursts of 100, 100, 50
    # with holds of 1.5 x calls x (20 - 11 us) + 100 us
    assert gpu.events[:2] == ["K", "K"]
    assert holds[0] == (pytest.approx(1.5 * 2 * 100 + 100), 2)
    assert holds[1:] == [
        (pytest.approx(1.5 * calls * 9 + 100), calls) for calls in (timing.BURST, timing.BURST, 50)
    ]


def test_a_gpu_bound_kernel_gets_only_the_margin(gpu):
    t = time_fn(gpu.launcher("K", 0.005, 0.050), 1, clock=gpu, queued=True, **FIXED)
    assert [us for us, _ in _holds(gpu.events)[1:]] == [pytest.approx(timing.HOLD_MARGIN_US)] * 3
    assert t.median_ms == pytest.approx(0.050) and t.starved == 0


def test_a_host_stall_longer_than_the_hold_is_counted_as_starved(gpu):
    # call 52 is the 50th of the timed window (after 1 first call and 1 warm-up call): the GPU runs
    # dry there, and the host, slower than the kernel, stays behind for the rest of the burst
    t = time_fn(gpu.launcher(*DECODE, stall_at=52, stall_ms=5.0), 1, clock=gpu, queued=True, **FIXED)
    assert t.starved == timing.BURST - 50
    assert t.median_ms == pytest.approx(0.011)  # most calls still back to back


def test_after_a_starved_window_the_holds_cover_the_hosts_whole_enqueue_time(gpu):
    """Paired, queued: the kernel's first window starves (a stall), so its second window's hold
    covers all of the host's enqueue time per call (its stall included), not the difference to
    the GPU's; the baseline keeps holds of its own, and its count."""
    kernel = gpu.launcher(*DECODE, stall_at=52, stall_ms=5.0)
    base = gpu.launcher("B", 0.020, 0.015)
    bounds = {"min_ms": 1e-3, "min_iters": 200, "max_iters": 200}  # 100 calls per window
    pair = time_paired(
        kernel, base, 1, warmup_ms=0, rewarm_ms=0, rounds=2, noisy_rounds=2, queued=True, clock=gpu, **bounds
    )
    assert (pair.timing.starved, pair.baseline.starved) == (50, 0)
    assert not pair.interleaved  # host-bound calls, but queued: alternating windows by default
    kernel_holds = _holds_before(gpu.events, "K")
    host_ms = (100 * 0.020 + 5.0) / 100  # the first window's first burst, with the stall in it
    assert kernel_holds[-2:] == [
        pytest.approx(1.5 * 100 * (20 - 11) + 100),  # sized by the warm-up: the difference
        pytest.approx(1.5 * 100 * host_ms * 1e3 + 100),  # after the starved window: all of it
    ]


def test_a_full_launch_queue_blocks_the_host_without_starving_the_gpu_or_growing_the_holds(monkeypatch):
    """With a launch queue of 4 x BURST items (the real one holds about a thousand), the holds of a
    host-bound kernel keep the host ahead until the queue is full and it blocks; the GPU has work
    throughout, and the host time that sizes the next window's holds is the first burst's, which
    fits the queue: taken from a later, blocked burst it would be the GPU's pace and grow them."""
    from gluon_survey.driver import timing

    gpu = QueueClock(depth=4 * timing.BURST)
    monkeypatch.setattr(timing, "perf_counter", gpu.perf_counter)
    bounds = {"min_ms": 1e-3, "min_iters": 2000, "max_iters": 2000}  # 10 bursts per window
    pair = time_paired(
        gpu.launcher(*DECODE),
        gpu.launcher("B", 0.020, 0.015),
        1,
        warmup_ms=0,
        rewarm_ms=0,
        rounds=2,
        queued=True,
        clock=gpu,
        **bounds,
    )
    assert gpu.blocked > 0  # the host did wait for the queue
    assert (pair.timing.starved, pair.baseline.starved) == (0, 0)
    assert pair.timing.median_ms == pytest.approx(0.011) and pair.baseline.median_ms == pytest.approx(0.015)
    kernel_holds = _holds_before(gpu.events, "K")
    assert kernel_holds[1:] == [pytest.approx(1.5 * timing.BURST * (20 - 11) + 100)] * 20


def test_settling_calls_end_on_the_last_set_and_are_bounded_by_max_iters():
    """Each alternating window follows ceil(settle_ms / the side's call) untimed calls in rotation
    over the sets, ending on the last one, so the window's first call reads set 0, the set read
    longest ago; the settling calls never number more than max_iters."""

    def sets_before_windows(settle_ms, max_iters, power_limited=True):
        clock, log = FakeClock(), []
        clock.power_limited = power_limited
        make = _sets_logged(clock, log)
        pair = time_paired(
            make("K"), make("B"), 4, warmup_ms=0, rewarm_ms=0, min_ms=8, rounds=1, noisy_rounds=1,
            min_iters=1, max_iters=max_iters, settle_ms=settle_ms, clock=clock, interleave=False,
        )  # fmt: skip
        kernel = [i for name, i in log[8 + 4 + 4 :] if name == "K"]  # after first calls, warm-ups
        return kernel, pair.timing.n

    kernel, n = sets_before_windows(6, 100)
    assert n == 8 and kernel == [2, 3, 0, 1, 2, 3] + [0, 1, 2, 3] * 2
    kernel, n = sets_before_windows(1000, 5)  # capped at max_iters
    assert kernel[: len(kernel) - n] == [3, 0, 1, 2, 3]
    kernel, n = sets_before_windows(6, 100, power_limited=False)  # CPU work: nothing to settle
    assert n == 8 and kernel == [0, 1, 2, 3] * 2
