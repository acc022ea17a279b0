"""Host and GPU time per call of `gluon_survey.Linear` against `torch.nn.Linear` on the same weight,
at a whole model's layer shapes (Llama-3-8B's projections) and token counts (decode at batch 1, 16
and 64, a 512-token prefill), under torch.no_grad as a model's forward runs them, input 3-D
[batch, tokens, features] as transformers passes it. Written to find where a model step that runs
cuBLAS in both models loses time in ours.

Each way runs `--calls` calls back to back, timed on the host (`time.perf_counter_ns` around the
enqueue, no synchronize inside) and on the GPU (CUDA events around the same calls), in `--repeats`
rounds that alternate the ways; reported: medians of the rounds, µs per call.

    PYTHONPATH=src python3 scripts/linear_host_probe.py --output out/linear-host.csv
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import torch

import gluon_survey

sys.path.insert(0, str(Path(__file__).parent))
from kernel_time import write_csv

WEIGHTS = {
    "q_proj": (4096, 4096),
    "k_proj": (1024, 4096),
    "gate_proj": (14336, 4096),
    "down_proj": (4096, 14336),
}
INPUTS = {"decode b1": (1, 1), "decode b16": (16, 1), "decode b64": (64, 1), "prefill 512": (1, 512)}


def timed(fn, calls: int) -> tuple[float, float]:
    """(host µs, GPU µs) per call of `calls` back-to-back calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    host = (time.perf_counter_ns() - t0) / 1e3 / calls
    end.record()
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) * 1e3 / calls


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    with torch.no_grad():
        for wname, (n, k) in WEIGHTS.items():
            stock = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
            ours = gluon_survey.Linear.from_linear(stock)
            for iname, (batch, tokens) in INPUTS.items():
                x = torch.randn(batch, tokens, k, device="cuda", dtype=torch.bfloat16)
                ways = {
                    "nn.Linear": functools.partial(stock, x),
                    "gluon_survey.Linear": functools.partial(ours, x),
                }
                for fn in ways.values():  # warm: plans, cuBLAS heuristics
                    fn()
                samples = {w: [] for w in ways}
                for _ in range(args.repeats):
                    for w, fn in ways.items():
                        samples[w].append(timed(fn, args.calls))
                line = f"{wname:10s} {iname:12s}"
                for w, s in samples.items():
                    host = statistics.median(h for h, _ in s)
                    gpu = statistics.median(g for _, g in s)
                    rows.append({"weight": wname, "input": iname, "way": w, "host_us": host, "gpu_us": gpu})
                    line += f" | {w} host {host:6.1f} gpu {gpu:7.1f}"
                print(line, flush=True)
    write_csv(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
