"""Probe: what one Python call costs on a host-bound fp8 product. Host µs a call of
`torch._scaled_mm` called directly, the same with `bias=None` passed, a bare `lambda` around the
direct call, and `gluon_survey.matmul(kernel="torch")`, on one 96 x 4096 x 4096 product with
per-tensor scales: each way's 200 calls enqueued behind a sleep kernel (so the GPU never holds the
host back), the ways taken in turn within each of 31 repeats (their order rotating), and the
median and p20/p80 over the repeats.

    PYTHONPATH=src python3 scripts/wrapper_cost.py
"""

import functools
import statistics
import time

import torch

import gluon_survey

M, N, K = 96, 4096, 4096
REPS, CALLS = 31, 200


def main():
    a = (torch.randn(M, K, device="cuda") / 2).to(torch.float8_e4m3fn)
    b = (torch.randn(N, K, device="cuda") / 2).to(torch.float8_e4m3fn).t()
    sa, sb = torch.ones((), device="cuda"), torch.ones((), device="cuda")
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    kw = {"out_dtype": torch.bfloat16, "use_fast_accum": True, "out": out}
    ways = {
        "direct": functools.partial(torch._scaled_mm, a, b, sa, sb, **kw),
        "direct_bias_none": functools.partial(torch._scaled_mm, a, b, sa, sb, bias=None, **kw),
        "torch_mode": functools.partial(
            gluon_survey.matmul, a, b, kernel="torch", scale_a=sa, scale_b=sb, out=out
        ),
        "lambda_direct": lambda: torch._scaled_mm(
            a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True, out=out
        ),
    }
    for way in ways.values():
        way()
    torch.cuda.synchronize()
    names, host = list(ways), {name: [] for name in ways}
    for r in range(REPS):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            torch.cuda._sleep(40_000_000)
            t0 = time.perf_counter_ns()
            for _ in range(CALLS):
                ways[name]()
            host[name].append((time.perf_counter_ns() - t0) / CALLS / 1e3)
            torch.cuda.synchronize()
    for name, times in host.items():
        q = statistics.quantiles(times, n=5)
        print(f"{name} host us median {statistics.median(times):.2f} p20 {q[0]:.2f} p80 {q[3]:.2f}")


if __name__ == "__main__":
    main()
