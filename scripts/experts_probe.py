"""One experts layer's call, "gluon_survey" against transformers' "grouped_mm", outside the model:
where a mixture-of-experts decode step's host time goes. For each token count, on the first
experts module of a `gluon-survey model` model (same --config), alternating the two:

    async_us   wall µs a call in a loop of --calls calls with one sync at the end (the host's
               cost a call where the host is slower than the GPU, as in decode)
    synced_us  wall µs a call with a sync after each (host + GPU latency)
    gpu_us     kernel µs a call (torch.profiler's device events)
    syncs      cudaStreamSynchronize / cudaDeviceSynchronize / cudaMemcpy* calls a forward makes
    launches   kernel launches a forward makes

and, for ours, the same wall times of `moe.route` alone and of the two grouped products alone.
With --cprofile, the top of a cProfile of ours at the first token count. With --routed-rows R,..
(the routed kernels' rows a program, kernels/routed.py), also ours with the routed path off
("ours: sorted", the grouped kernels) and the routed plan alone at each R ("routed R<r>", its two
launches without `moe.routed_experts`' cache lookup): where the routed path should stop, and how
many rows its programs should take.

    PYTHONPATH=src python3 scripts/experts_probe.py --config qwen3-30b-a3b --tokens 1,16,64,512 \
        --output out/experts-probe.csv [--cprofile] [--routed-rows 1,2,4,8]
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import functools
import io
import pstats
import statistics
import time
from pathlib import Path

import torch

from gluon_survey import experts as experts_impl
from gluon_survey import moe
from gluon_survey.driver import model as cmd
from gluon_survey.experts import experts_modules
from gluon_survey.kernels import routed


def _async_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def _synced_us(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _counts(fn, calls: int = 5) -> tuple[float, float, float]:
    """(kernel µs, syncing runtime calls, launches) a call, from torch.profiler."""
    fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    gpu = syncs = launches = 0.0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            gpu += event.device_time
        elif "Synchronize" in event.name or event.name.startswith(("cudaMemcpy", "cuMemcpy")):
            syncs += 1
        elif "LaunchKernel" in event.name:
            launches += 1
    return gpu / calls, syncs / calls, launches / calls


def _sorted(ours, x, index, weights):
    """Ours with the routed path switched off: the sorted path's grouped kernels at any size."""
    experts_impl.ROUTED = False
    try:
        return ours(x, index, weights)
    finally:
        experts_impl.ROUTED = True


def _calls(stock, ours, x, index, weights, experts: int, routed_rows: list[int]) -> dict:
    """The calls timed at one token count: the two layers, and ours' route and two products; with
    routed_rows, ours sorted and the routed plan at each rows a program."""
    k = index.shape[-1]
    gate_up, down = ours.gate_up_proj.transpose(1, 2), ours.down_proj.transpose(1, 2)
    _, perm, offs = moe.route(index, experts)
    xs = x[perm // k]
    h = moe.grouped_mm(xs, gate_up, offs)[:, : down.shape[1]].contiguous()
    calls = {
        "grouped_mm": lambda: stock(x, index, weights),
        "gluon_survey": lambda: ours(x, index, weights),
        "ours: route": lambda: moe.route(index, experts),
        "ours: gate_up": lambda: moe.grouped_mm(xs, gate_up, offs),
        "ours: down": lambda: moe.grouped_mm(h, down, offs),
    }
    if routed_rows:
        calls["ours: sorted"] = lambda: _sorted(ours, x, index, weights)
        w_gate_up, w_down = ours.gate_up_proj, ours.down_proj
        for rows in routed_rows:
            plan = routed.plan(x, w_gate_up, w_down, index, routed.RoutedConfig(rows, rows))
            calls[f"routed R{rows}"] = functools.partial(plan.launch, x, w_gate_up, w_down, index, weights)
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="qwen3-30b-a3b")
    parser.add_argument("--tokens", type=cmd.int_list, default=[1, 16, 64, 512])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--routed-rows", type=cmd.int_list, default=[])
    parser.add_argument("--output", type=Path, required=True)
    opts = parser.parse_args()
    transformers = cmd.import_transformers()
    args = cmd.parse_args(["--config", opts.config, "--layers", "1", "--moe-baseline", "grouped_mm"])
    models = cmd.build_models(transformers, args)
    (_, stock), (_, ours) = next(experts_modules(models.stock)), next(experts_modules(models.ours))
    cfg = models.stock.config
    hidden, k = cfg.hidden_size, cfg.num_experts_per_tok
    experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
    rows = []
    with torch.no_grad():
        for tokens in opts.tokens:
            gen = torch.Generator(device="cuda").manual_seed(tokens)
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
            logits = torch.randn(tokens, experts, device="cuda", generator=gen)
            weights, index = torch.topk(logits.softmax(-1), k, dim=-1)
            weights = weights.to(torch.bfloat16)
            calls = _calls(stock, ours, x, index, weights, experts, opts.routed_rows)
            for fn in calls.values():
                fn()
            samples: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
            for r in range(opts.rounds):
                order = list(calls) if r % 2 == 0 else list(reversed(calls))
                for name in order:
                    samples[name].append((_async_us(calls[name], opts.calls), _synced_us(calls[name], 50)))
            for name, fn in calls.items():
                gpu, syncs, launches = _counts(fn)
                row = {
                    "config": opts.config,
                    "tokens": tokens,
                    "call": name,
                    "async_us": round(statistics.median(a for a, _ in samples[name]), 2),
                    "synced_us": round(statistics.median(s for _, s in samples[name]), 2),
                    "gpu_us": round(gpu, 2),
                    "syncs": syncs,
                    "launches": launches,
                }
                rows.append(row)
                print(", ".join(f"{key}={value}" for key, value in row.items()), flush=True)
            if opts.cprofile and tokens == opts.tokens[0]:
                for name in ("gluon_survey", "grouped_mm"):
                    profiler = cProfile.Profile()
                    profiler.enable()
                    for _ in range(opts.calls):
                        calls[name]()
                    profiler.disable()
                    torch.cuda.synchronize()
                    text = io.StringIO()
                    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
                    print(f"== cProfile, {name}, {opts.calls} calls at {tokens} tokens\n{text.getvalue()}")
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    with opts.output.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
