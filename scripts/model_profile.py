"""Where a whole model's time goes, stock against patched: the `gluon-survey model` models (same
arguments), each step profiled with torch.profiler after a warm-up, GPU time summed per kernel
name, and for the patched model every distinct matmul call (shapes, strides, bias) with what
`explain` says it runs. Written to find which products make a model row slower than stock.

    PYTHONPATH=src python3 scripts/model_profile.py --config llama3-8b --layers 4 \
        --steps prefill,decode,train --prefill-tokens 512 --decode-batch 64 --output out/profile [--host]
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

import torch

from gluon_survey import api
from gluon_survey.driver import model as cmd


def _kernel_times(prof) -> dict[str, tuple[float, int]]:
    """GPU µs and count per kernel name (device events only)."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals[event.name]
            entry[0] += event.device_time
            entry[1] += 1
    return {k: (v[0], v[1]) for k, v in totals.items()}


def _profile(fn, iters: int) -> tuple[dict[str, tuple[float, int]], float]:
    fn()
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
    return _kernel_times(prof), start.elapsed_time(end) * 1000 / iters


WAITS = ("Synchronize", "cudaMemcpy", "cudaStreamWait", "item", "_local_scalar")


def _host(fn, label: str, out: Path) -> None:
    """The host side of one run of fn: the ops with the most self CPU time, and every CUDA runtime
    call that waits for the GPU (a synchronize, a blocking copy)."""
    fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70)
    (out / f"host-{label}.txt").write_text(table)
    waits = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if any(w in event.name for w in WAITS):
            waits[event.name][0] += 1
            waits[event.name][1] += event.cpu_time_total
    print(f"  host {label}: " + "; ".join(f"{k} x{n} {us:.0f} us" for k, (n, us) in waits.items()))
    print("    " + "\n    ".join(table.splitlines()[:16]))


def _calls(fn) -> dict[tuple, int]:
    """Every distinct `api.matmul` call of one run of fn: (a shape, a stride, b shape, b stride,
    dtype, bias) -> count."""
    seen: dict[tuple, int] = defaultdict(int)
    original = api.matmul

    def logged(a, b, **kwargs):
        bias = kwargs.get("bias")
        seen[(tuple(a.shape), a.stride(), tuple(b.shape), b.stride(), a.dtype, bias is not None)] += 1
        return original(a, b, **kwargs)

    api.matmul = logged
    try:
        fn()
        torch.cuda.synchronize()
    finally:
        api.matmul = original
    return seen


def _like(shape, stride, dtype):
    return torch.empty_strided(shape, stride, dtype=dtype, device="cuda").normal_()


def main(argv: list[str]) -> int:
    extra = argv.index("--output") if "--output" in argv else None
    out = Path(argv[extra + 1]) if extra is not None else Path("out/profile")
    argv = argv[:extra] + argv[extra + 2 :] if extra is not None else argv
    host = "--host" in argv  # also the host side of each step (self CPU time, GPU waits)
    argv = [a for a in argv if a != "--host"]
    args = cmd.parse_args(argv)
    out.mkdir(parents=True, exist_ok=True)
    transformers = cmd.import_transformers()
    models = cmd.build_models(transformers, args)
    rows = []
    for row in cmd.plan(args):
        label = f"{row.what}-b{row.batch}-t{row.tokens}-{row.mode}"
        stock, ours = cmd.step_fns(models, row, args, "cuda")
        iters = 3 if row.what != "decode" else 1
        s_kernels, s_ms = _profile(stock, iters)
        o_kernels, o_ms = _profile(ours, iters)
        s_total = sum(t for t, _ in s_kernels.values()) / iters
        o_total = sum(t for t, _ in o_kernels.values()) / iters
        print(
            f"== {label}: wall stock {s_ms:.0f} us, ours {o_ms:.0f} us; "
            f"GPU busy stock {s_total:.0f} us, ours {o_total:.0f} us"
        )
        for who, kernels in (("stock", s_kernels), ("ours", o_kernels)):
            for name, (us, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
                rows.append([label, who, name[:160], round(us / iters, 1), n // iters])
            top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:14]
            print(f"  {who} top kernels (us/iter, calls/iter):")
            for name, (us, n) in top:
                print(f"    {us / iters:9.1f} {n // iters:5d}  {name[:110]}")
        if host:
            _host(stock, f"{label}-stock", out)
            _host(ours, f"{label}-ours", out)
        calls = _calls(ours)
        print(f"  ours: {len(calls)} distinct matmul calls")
        for (ash, ast, bsh, bst, dtype, bias), n in sorted(calls.items(), key=lambda kv: kv[0][0]):
            a, b = _like(ash, ast, dtype), _like(bsh, bst, dtype)
            why = api.explain(a, b, bias=torch.zeros(bsh[1], dtype=dtype, device="cuda") if bias else None)
            short = " | ".join(line for line in why.splitlines() if not line.startswith("mode:"))
            print(f"    x{n:3d} a{ash}{ast} b{bsh}{bst}{' +bias' if bias else ''}: {short}")
    with open(out / "kernels.csv", "w", newline="") as f:
        csv.writer(f).writerows([["step", "model", "kernel", "us_per_iter", "calls_per_iter"], *rows])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
