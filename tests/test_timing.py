import re

import numpy as np
import pytest

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


def test_paired_windows_alternate_and_the_ratio_cancels_a_drifting_clock():
    """Kernel runs take 1 ms and the baseline 1.1 ms, both stretched by a clock that slows by 1 %
    per window. Order: first calls, the baseline's warm-up, the kernel's, then windows B K B K B."""
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
        clock=clock,
    )
    windows = "".join(log[2 * 2 :])  # after the first calls of both
    nb = pair.baseline.n // 3  # 20 ms of 1.1 ms calls (slowed by the warm-ups' drift) per window
    assert nb in (18, 19) and re.fullmatch(f"B+K+(B{{{nb}}}K{{20}}){{2}}B{{{nb}}}", windows)
    assert pair.timing.n == 40 and pair.baseline.n == 3 * nb
    # Each round's baseline is the mean of the windows either side, so a steady drift cancels.
    assert pair.rounds == pytest.approx((1.1, 1.1), rel=1e-4)
    assert pair.drift == pytest.approx(1.01**4 - 1)
    assert pair.ratio == pytest.approx(1.1, rel=0.02)
