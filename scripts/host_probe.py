"""Where a cached `matmul` call's host time goes (docs/perf-notes.md, entry 47).

`gluon-survey overhead` gives the totals: at 16 x 4096 x 4096 bf16 (slab) on the H100 of entry 46,
`matmul(out=)` 8.2 µs over the bare launch and `matmul()` 12.2, against a target of 10. This times
each step of the per-call path on its own, on the GPU machine's host, in the order a call takes
them: the plan key, the cache lookup, the output's allocation, the three TMA descriptors rebased
on the call's tensors, Triton's per-descriptor work in its launcher (`make_tensordesc_arg`: the
host-side encode of each CUtensorMap) and the launch, next to the totals. Since entry 48 a plan
keeps the encoded descriptors per address and skips the last two where it can; the row "a new
each call" times `matmul()` where it cannot, for A.

Each step runs `--calls` times in a row, timed with `time.perf_counter_ns`, in `--repeats` rounds
that take turns; reported: the median of the rounds' µs per call. Steps that launch a kernel run
at most --calls launches before a synchronize, well within the launch queue.

Not part of the package: an experiment, run on the GPU with

    PYTHONPATH=src python3 scripts/host_probe.py --output $OUT/host-probe.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from gluon_survey import api
from gluon_survey.kernels.plan import ENCODED_PER_SLOT, _rebased

sys.path.insert(0, str(Path(__file__).parent))
from kernel_time import write_csv


def per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls / 1e3


def steps_for(M: int, N: int, K: int, dtype: torch.dtype) -> tuple[str, dict[str, object]]:
    """What `auto` runs here (`explain`'s line), and the steps to time, by name."""
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    w = torch.randn(N, K, device="cuda", dtype=dtype)
    b = w.t()
    out = torch.empty(M, N, device="cuda", dtype=dtype)
    api.matmul(a, b, out=out)  # the plan, the compile
    api.matmul(a, b)
    key = api._plan_key(None, a, b, out)
    plan = api._PLANS[key].plan
    bare = api.prepare("auto", a, b, out).fn
    bare()
    steps = {
        "plan key": lambda: api._plan_key(None, a, b, out),
        "cache lookup": lambda: api._PLANS.get(key),
        "empty_like (the output)": lambda: torch.empty_like(plan.like),
        "bare launch": bare,
        "plan call, out given": lambda: api._PLANS[key](a, b, out),
        "matmul(out=)": lambda: api.matmul(a, b, out=out),
        "matmul()": lambda: api.matmul(a, b),
    }
    # The same with `a` at a new address on every call: more buffers than a plan keeps encoded
    # descriptors for (ENCODED_PER_SLOT), so each call encodes A's (a model whose
    # activations never come back to an address; the caching allocator usually brings them back).
    many = [torch.randn(M, K, device="cuda", dtype=dtype) for _ in range(2 * ENCODED_PER_SLOT + 1)]
    turn = iter(range(1 << 62))
    steps["matmul(), a new each call"] = lambda: api.matmul(many[next(turn) % len(many)], b)
    rung_plan = getattr(bare, "plan", None)
    if hasattr(rung_plan, "templates"):  # a TMA rung: its descriptors and Triton's work on them
        from triton.backends.nvidia.driver import make_tensordesc_arg

        ta, tb, tc = rung_plan.templates
        steps["rebase 3 descriptors"] = lambda: (
            _rebased(ta, a),
            _rebased(tb, b),
            _rebased(tc, out),
        )
        steps["Plan.launch"] = lambda: rung_plan.launch(a, b, out)
        meta = getattr(rung_plan.launcher.compiled.metadata, "tensordesc_meta", None) or [None] * 3
        descs = rung_plan.descriptors(a, b, out)
        steps["make_tensordesc_arg x 3"] = lambda: [
            make_tensordesc_arg(d, m) for d, m in zip(descs, meta, strict=True)
        ]
    return api.explain(a, b).splitlines()[1], steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    rows = []
    for M, N, K in [(16, 4096, 4096), (1, 4096, 4096)]:
        mode, steps = steps_for(M, N, K, torch.bfloat16)
        samples: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.repeats):
            for name, fn in steps.items():
                samples[name].append(per_call_us(fn, args.calls))
                torch.cuda.synchronize()
        for name, values in samples.items():
            q = statistics.quantiles(values, n=5)
            row = {
                "M": M,
                "N": N,
                "K": K,
                "runs": mode,
                "step": name,
                "us_median": round(statistics.median(values), 2),
                "us_p20": round(q[0], 2),
                "us_p80": round(q[-1], 2),
            }
            rows.append(row)
            print(f"{M:>3} {N} {K}  {name:28s} {row['us_median']:7.2f}  ({row['us_p20']}-{row['us_p80']})")
    if args.output:
        write_csv(args.output, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
