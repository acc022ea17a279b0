"""GPU time a call of each mode in three power regimes, with the SM clock and board power each ran at:
whether a ratio to cuBLAS depends on how hot the workload keeps the GPU.

At its power limit a Hopper's SM clock follows the running kernel's own power draw, so two kernels
that tie at full clock can part by several per cent once the board is at its limit, and the other
way round. The survey's paired timing (`driver/timing.py`) times sustained windows after a warm-up;
`kernel_time.py` times bursts of 30 calls after a pause, each behind an L2 flush. Per (shape,
regime), the modes take turns, one window each, `--rounds` times:

- `sustained`: calls back to back for `--window-ms` after `--warmup-ms` of the same calls (the
  driver's windows);
- `gap`: each call followed by an idle sleep kernel as long as the call (half the duty: a model's
  step, where other work sits between GEMMs, is somewhere between this and `sustained`);
- `burst`: `--burst` calls back to back after `--rest-s` of idle GPU (kernel_time.py's regime).

A row: the median GPU time of the mode's calls over its windows (CUDA events around each call), and
the mean SM clock and power NVML sampled during them (`driver/hardware.Telemetry`). Inputs are one
set (`check.make_inputs`, seed 0); pick shapes whose operands exceed L2, as the GEMMs that reach the
power limit do.

    PYTHONPATH=src python3 scripts/power_probe.py --shapes results/experiments/h200-fp8-power/shapes.csv \
        --modes torch,warpspec --dtype fp8 --output out/power-probe.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from kernel_time import DTYPES, call_of, operands, record, write_csv

from gluon_survey.driver.hardware import telemetry_for_current_device
from gluon_survey.driver.shapes import read_csv
from gluon_survey.driver.timing import sleep_cycles_per_us

REGIMES = ("sustained", "gap", "burst")


def calls_for(ms: float, call_ms: float) -> int:
    """Calls of `call_ms` each that fill `ms` (at least 3)."""
    return max(3, round(ms / call_ms))


def mean_of(teles: list[dict], key: str) -> float | str:
    """The mean of `key` over the windows' telemetry that has it ("" where none does)."""
    values = [t[key] for t in teles if key in t]
    return round(statistics.fmean(values), 1) if values else ""


def window(fn, n: int, gap_cycles: int) -> list[float]:
    """`n` calls of `fn`, each between two events (and followed by a sleep of `gap_cycles` when
    non-zero): their GPU times in ms."""
    marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in marks:
        start.record()
        fn()
        end.record()
        if gap_cycles:
            torch.cuda._sleep(gap_cycles)
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in marks]


def one_window(regime: str, fn, call_ms: float, cycles_per_ms: float, args) -> tuple[list[float], dict]:
    """One window of `fn` in `regime`, with the telemetry sampled while it ran."""
    gap = int(call_ms * cycles_per_ms) if regime == "gap" else 0
    if regime == "burst":
        torch.cuda.synchronize()
        time.sleep(args.rest_s)
    else:  # a warm-up in the window's own regime: half the calls where each is followed by a gap
        window(fn, calls_for(args.warmup_ms / (2 if gap else 1), call_ms), gap)
    n = args.burst if regime == "burst" else calls_for(args.window_ms / (2 if gap else 1), call_ms)
    with telemetry_for_current_device() as tele:
        times = window(fn, n, gap)
    return times, tele.result()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", required=True)
    p.add_argument("--shapes", required=True, help="CSV of M,N,K")
    p.add_argument("--modes", default="torch,warpspec")
    p.add_argument("--dtype", default="fp8", choices=DTYPES)
    p.add_argument("--scaling", default="tensor", choices=("tensor", "row"), help="fp8 scales")
    p.add_argument("--regimes", default=",".join(REGIMES))
    p.add_argument("--rounds", type=int, default=3, help="windows of each mode per regime, in turn")
    p.add_argument("--warmup-ms", type=float, default=200.0)
    p.add_argument("--window-ms", type=float, default=100.0)
    p.add_argument("--burst", type=int, default=10, help="calls in a burst window")
    p.add_argument("--rest-s", type=float, default=0.5, help="idle time before a burst")
    args = p.parse_args(argv)
    regimes = args.regimes.split(",")
    if bad := sorted(set(regimes) - set(REGIMES)):
        p.error(f"--regimes: unknown {bad}; choose from {','.join(REGIMES)}")
    cycles_per_ms = 1e3 * sleep_cycles_per_us()
    rows = []
    for shape in read_csv(args.shapes):
        a, b, scales = operands(shape, args.dtype, args.scaling)
        modes = args.modes.split(",")
        fns = {m: call_of(m, a, b, scales, 0)[0] for m in modes}
        call_ms = {m: statistics.median(window(fns[m], 5, 0)) for m in modes}
        for regime in regimes:
            got: dict[str, tuple[list[float], list[dict]]] = {m: ([], []) for m in modes}
            for _ in range(args.rounds):
                for m in modes:
                    times, tele = one_window(regime, fns[m], call_ms[m], cycles_per_ms, args)
                    got[m][0].extend(times)
                    got[m][1].append(tele)
            for m in modes:
                times, teles = got[m]
                record(rows, {
                    "M": shape.M, "N": shape.N, "K": shape.K, "dtype": args.dtype, "scaling": args.scaling,
                    "regime": regime, "mode": m, "calls": len(times),
                    "us_median": round(1e3 * statistics.median(times), 2),
                    "sm_clock_mhz": mean_of(teles, "sm_clock_mhz"), "power_w": mean_of(teles, "power_w"),
                })  # fmt: skip
    write_csv(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
