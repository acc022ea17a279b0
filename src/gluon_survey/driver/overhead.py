"""`gluon-survey overhead`: what one GEMM call costs the host. For a small product whose kernel is
short (default M=16, N=K=4096, bf16, B the transpose view of a weight: a decode step's linear
layer), the host time per call of the ways to launch it, side by side:

    torch.matmul      torch.matmul(a, b): cuBLAS, the yardstick (allocates its result)
    bare launch       api.prepare(mode, a, b, out).fn(): the kernel call alone, what the driver times
    matmul(out=)      gluon_survey.matmul(a, b, kernel=mode, out=out): a cached plan, then the launch
    matmul()          the same without `out`: the result is allocated per call
    ops.matmul        gluon_survey.ops.matmul(a, b, mode): the custom operator (dispatcher + matmul())
    nn.Linear         torch.nn.Linear(K, N, bias=False) on w = b.t(), frozen (requires_grad False,
                      as in an inference model): the module a model calls, cuBLAS
    Linear            gluon_survey.Linear on the same w, frozen, no bias: the drop-in's eager call
    graph replay      a CUDA graph of matmul(out=), replayed: one graph launch per call

and "over bare": each row's host time minus the bare launch's; for matmul(out=) that is what
`matmul` adds to the launch (the plan key and its lookup; a rung's TMA descriptors looked up by
the call's addresses), and for matmul() also the output's allocation.

    gluon-survey overhead                                # the default mode of this GPU
    gluon-survey overhead --mode persistent --m 1 --n 8192 --k 8192 --format json
    gluon-survey overhead --results results/overhead/h100.json

How: every way's result is checked first (NaN-poisoned output, the survey's tolerance against the
fp32 product). Then, in each repeat, the GPU is kept busy by a sleep kernel while the host enqueues
--calls calls of a way (a few hundred, well within the launch queue, so enqueueing never waits for
the GPU), timed with `time.perf_counter_ns`: host us/call. The calls then run back to back on the
GPU, timed with CUDA events from the sleep's end to the last call's end: GPU us/call. A repeat
whose enqueueing outlasted the sleep (the GPU ran dry, so its GPU time includes idle gaps) counts
as `starved` and is left out of the GPU median; each sleep is sized from that way's previous
repeat, and a first, discarded round sizes them. The ways take turns within each repeat, so a
drift of the host's speed (clock, neighbours) touches all of them alike, and "over bare" is the
median of each repeat's difference to the bare launch of the same repeat. Reported: medians over
--repeats, and p20-p80 of the host time.

`--results FILE.json` writes {env, settings, rows, added_over_bare_us}. Exit status: 0, 1 when a
way FAILED its check or a file cannot be written, 2 for a usage error or a machine without a CUDA
GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gluon_survey.driver import args as argtypes
from gluon_survey.driver.timing import sleep_cycles_per_us
from gluon_survey.launch import B_LAYOUTS

PROG = "gluon-survey overhead"
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
FORMATS = ("table", "json")
BARE = "bare launch"
MATMUL = "matmul(out=)"


@dataclass(frozen=True)
class Way:
    """One way to launch the product: its name in the table and the code it times."""

    name: str
    code: str


WAYS = (
    Way("torch.matmul", "torch.matmul(a, b)  [cuBLAS]"),
    Way(BARE, "api.prepare(mode, a, b, out).fn()"),
    Way(MATMUL, "gluon_survey.matmul(a, b, kernel=mode, out=out)"),
    Way("matmul()", "gluon_survey.matmul(a, b, kernel=mode)"),
    Way("ops.matmul", "gluon_survey.ops.matmul(a, b, mode)"),
    Way("nn.Linear", "torch.nn.Linear(w frozen)(a)  [cuBLAS]"),
    Way("Linear", "gluon_survey.Linear(w frozen, kernel=mode)(a)"),
    Way("graph replay", "torch.cuda.CUDAGraph.replay() of matmul(out=)"),
)


@dataclass
class Row:
    """One way, measured (or FAILED its check, with `error`)."""

    name: str
    code: str
    status: str = "OK"
    host_us: float | None = None  # median over repeats of (enqueue time of --calls calls) / calls
    host_p20_us: float | None = None
    host_p80_us: float | None = None
    gpu_us: float | None = None  # median over the repeats that kept the GPU busy of GPU time / calls
    starved: int | None = None  # repeats in which the GPU ran dry (all of them: gpu_us has gaps)
    over_bare_us: float | None = None  # median over repeats of host_us - the bare launch's
    error: str | None = None


# ------------------------------------------------------------------------------------------------
# Arguments


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Host time per call of matmul, its bare launch, the custom operator, a CUDA-graph "
        "replay and cuBLAS, for one small product (see the module docstring for the method).",
    )
    parser.add_argument("--mode", help="the survey mode to launch (default: matmul's default on this GPU)")
    parser.add_argument(
        "--m", type=argtypes.positive_int, default=16, help="rows of a (default: %(default)s)"
    )
    parser.add_argument(
        "--n", type=argtypes.positive_int, default=4096, help="columns of b (default: %(default)s)"
    )
    parser.add_argument(
        "--k", type=argtypes.positive_int, default=4096, help="the reduction (default: %(default)s)"
    )
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16", help="(default: %(default)s)")
    parser.add_argument("--b-layout", choices=B_LAYOUTS, default="t", help="(default: %(default)s)")
    parser.add_argument(
        "--calls",
        type=argtypes.positive_int,
        default=200,
        help="calls enqueued per repeat (default: %(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=argtypes.positive_int,
        default=21,
        help="medians over this many repeats (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="of the random inputs (default: %(default)s)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="(default: %(default)s)")
    parser.add_argument("--results", type=Path, metavar="FILE.json", help="also write the results as JSON")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The arguments, with the mode checked against the registry (argparse exits 2 otherwise)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.mode is not None:
        from gluon_survey import registry

        try:
            args.mode = registry.get(args.mode).name
        except KeyError as exc:
            parser.error(str(exc.args[0]))
    if args.results is not None and not args.results.parent.is_dir():
        parser.error(f"--results {args.results}: no directory {args.results.parent}")
    return args


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "mode": args.mode,
        "M": args.m,
        "N": args.n,
        "K": args.k,
        "dtype": args.dtype,
        "b_layout": args.b_layout,
        "calls": args.calls,
        "repeats": args.repeats,
        "seed": args.seed,
        "host_timer": "time.perf_counter_ns around the enqueueing of `calls` calls behind a sleep kernel",
        "gpu_timer": "CUDA events from the sleep's end to the last call's end",
    }


# ------------------------------------------------------------------------------------------------
# Measurement (needs a CUDA GPU)


def _check(name: str, result: Any, a: Any, b: Any) -> str | None:
    """Why `result` is not a @ b within the survey's tolerance (None when it is)."""
    import torch

    from gluon_survey.driver.check import reference, rel_error, tolerance

    torch.cuda.synchronize()
    ref = reference(a, b)
    err = rel_error(result, ref)
    tol = tolerance(rel_error(torch.matmul(a, b), ref), a.dtype)
    return None if err <= tol else f"{name}: rel_err {err:.3g} > tol {tol:.3g}"


@dataclass
class Samples:
    """One way's repeats: host and GPU microseconds per call, and whether the GPU stayed busy."""

    enqueue_us: float  # the last repeat's enqueue time (a guess before the first): sizes the next sleep
    host: list[float] = field(default_factory=list)
    gpu: list[float] = field(default_factory=list)
    fed: list[bool] = field(default_factory=list)  # the GPU stayed busy until the last call was enqueued

    def summary(self) -> dict[str, Any]:
        p20, p80 = _quantiles(self.host)
        busy = [g for g, fed in zip(self.gpu, self.fed, strict=True) if fed] or self.gpu
        return {
            "host_us": statistics.median(self.host),
            "host_p20_us": p20,
            "host_p80_us": p80,
            "gpu_us": statistics.median(busy),
            "starved": self.fed.count(False),
        }


def _repeat(fn: Callable[[], object], calls: int, samples: Samples, cycles_per_us: float, keep: bool) -> None:
    """One repeat of `fn` behind a sleep kernel (module docstring); recorded in `samples` if `keep`."""
    import torch

    lead, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    sleep_us = 2.0 * samples.enqueue_us + 200.0
    t_sleep = time.perf_counter_ns()
    lead.record()
    torch.cuda._sleep(int(sleep_us * cycles_per_us))
    start.record()
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter_ns()
    end.record()
    end.synchronize()
    samples.enqueue_us = (t1 - t0) / 1e3
    if keep:
        samples.host.append(samples.enqueue_us / calls)
        samples.gpu.append(start.elapsed_time(end) * 1e3 / calls)
        samples.fed.append((t1 - t_sleep) / 1e3 < lead.elapsed_time(start) * 1e3)


def time_ways(
    fns: dict[str, Callable[[], object]], calls: int, repeats: int, cycles_per_us: float
) -> dict[str, Samples]:
    """Host and GPU time per call of each of `fns`, the ways taking turns in every repeat, after a
    warm-up call each and one discarded round that sizes the sleeps."""
    import torch

    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    samples = {name: Samples(enqueue_us=100.0 * calls) for name in fns}  # guess 100 us per call
    for repeat in range(repeats + 1):
        for name, fn in fns.items():
            _repeat(fn, calls, samples[name], cycles_per_us, keep=repeat > 0)
    return samples


def _quantiles(values: list[float]) -> tuple[float, float]:
    if len(values) == 1:
        return values[0], values[0]
    q = statistics.quantiles(values, n=5, method="inclusive")
    return q[0], q[3]


def measure(args: argparse.Namespace, log: Callable[[str], None] = lambda s: None) -> list[Row]:
    """Every way of `WAYS`, checked then timed, on the current CUDA device. `args.mode` None is
    resolved to matmul's default for this GPU (and written back)."""
    import torch

    import gluon_survey
    from gluon_survey import api, ops
    from gluon_survey.driver.check import make_inputs, torch_dtype
    from gluon_survey.driver.shapes import Shape

    dtype = torch_dtype(args.dtype)
    a, b = make_inputs(Shape(args.m, args.n, args.k), dtype, args.b_layout, args.seed, "cuda")
    if args.mode is None:
        args.mode = api.default_mode(a)
    mode = args.mode
    out = torch.full((args.m, args.n), math.nan, dtype=dtype, device="cuda")
    bare = api.prepare(mode, a, b, out).fn
    w = b.t()  # the [N, K] weight of a "t" B (of a row-major B: its transpose view)
    linear = gluon_survey.Linear(args.k, args.n, bias=False, device="meta", dtype=dtype, kernel=mode)
    torch_linear = torch.nn.Linear(args.k, args.n, bias=False, device="meta", dtype=dtype)
    linear.weight = torch_linear.weight = torch.nn.Parameter(w, requires_grad=False)

    def poisoned(fn: Callable[[], object]) -> Callable[[], Any]:
        def run():
            out.fill_(math.nan)
            fn()
            return out

        return run

    graph = torch.cuda.CUDAGraph()
    ways: dict[str, tuple[Callable[[], object], Callable[[], Any]]] = {
        "torch.matmul": (lambda: torch.matmul(a, b),) * 2,
        BARE: (bare, poisoned(bare)),
        MATMUL: (
            lambda: gluon_survey.matmul(a, b, kernel=mode, out=out),
            poisoned(lambda: gluon_survey.matmul(a, b, kernel=mode, out=out)),
        ),
        "matmul()": (lambda: gluon_survey.matmul(a, b, kernel=mode),) * 2,
        "ops.matmul": (lambda: ops.matmul(a, b, mode),) * 2,
        "nn.Linear": (lambda: torch_linear(a),) * 2,
        "Linear": (lambda: linear(a),) * 2,
        "graph replay": (graph.replay, poisoned(graph.replay)),
    }
    rows: dict[str, Row] = {}
    timed: dict[str, Callable[[], object]] = {}
    for way in WAYS:
        log(f"{way.name}: {way.code}")
        row = rows[way.name] = Row(way.name, way.code)
        try:
            if way.name == "graph replay":
                _capture(graph, lambda: gluon_survey.matmul(a, b, kernel=mode, out=out))
            fn, checked = ways[way.name]
            row.error = _check(way.name, checked(), a, b)
        except Exception as exc:  # a way that cannot run is a result, not a crash
            row.error = f"{type(exc).__name__}: {str(exc).strip()}"
        if row.error is None:
            timed[way.name] = fn
        else:
            row.status = "FAILED"
    log(f"timing {len(timed)} ways: {args.repeats} repeats of {args.calls} calls each, taking turns")
    samples = time_ways(timed, args.calls, args.repeats, sleep_cycles_per_us())
    over = over_bare(samples)
    for name, way_samples in samples.items():
        for key, value in way_samples.summary().items():
            setattr(rows[name], key, value)
        rows[name].over_bare_us = over.get(name)
    return list(rows.values())


def over_bare(samples: dict[str, Samples]) -> dict[str, float]:
    """Per way, the median over repeats of its host time minus the bare launch's in the same
    repeat (empty without a bare launch)."""
    bare = samples.get(BARE)
    if bare is None:
        return {}
    return {
        name: statistics.median(h - h0 for h, h0 in zip(s.host, bare.host, strict=True))
        for name, s in samples.items()
    }


def _capture(graph: Any, fn: Callable[[], object]) -> None:
    """fn() captured into `graph`, after a warm-up call on a side stream (plan, compile)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        fn()


def added_over_bare(rows: Sequence[Row]) -> float | None:
    """What matmul(out=) adds per call to its bare launch, in us (None when either is missing)."""
    return next((r.over_bare_us for r in rows if r.name == MATMUL), None)


# ------------------------------------------------------------------------------------------------
# Rendering (any rows: fabricated, loaded or just measured)


def document(rows: Sequence[Row], settings: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """The JSON document of a run: {env, settings, rows, added_over_bare_us}."""
    return {
        "env": env,
        "settings": settings,
        "rows": [asdict(r) for r in rows],
        "added_over_bare_us": added_over_bare(rows),
    }


def _us(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1f}" if signed else f"{value:.1f}"


def render_table(doc: dict[str, Any]) -> str:
    """The run as a plain-text table, with a header line saying what was measured and where."""
    s, env = doc["settings"], doc.get("env") or {}
    gpu = env.get("name") or "unknown GPU"
    lines = [
        f"{PROG}: M={s['M']} N={s['N']} K={s['K']} {s['dtype']} B={s['b_layout']}, mode {s['mode']}, "
        f"{s['calls']} calls x {s['repeats']} repeats (medians); {gpu}, "
        f"torch {env.get('torch', '?')}, triton {env.get('triton', '?')}",
    ]
    header = ("call", "host us/call", "p20-p80", "GPU us/call", "over bare", "code")
    table = [header]
    for r in doc["rows"]:
        if r["status"] != "OK":
            table.append((r["name"], "FAILED", "", "", "", r.get("error") or ""))
            continue
        spread = f"{_us(r['host_p20_us'])}-{_us(r['host_p80_us'])}"
        gpu_us = _us(r["gpu_us"]) + (" (gaps)" if r["starved"] == doc["settings"]["repeats"] else "")
        table.append((r["name"], _us(r["host_us"]), spread, gpu_us, _us(r["over_bare_us"], True), r["code"]))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        cells = [row[0].ljust(widths[0])]
        cells += [row[i].rjust(widths[i]) for i in range(1, len(header) - 1)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    added = doc.get("added_over_bare_us")
    if added is not None:
        lines.append(f"matmul adds {added:.1f} us per call to its bare launch (matmul(out=) - bare launch).")
    if any(r["status"] == "OK" and r["starved"] == doc["settings"]["repeats"] for r in doc["rows"]):
        lines.append("(gaps): the GPU ran dry in every repeat, so its GPU time includes idle time.")
    return "\n".join(lines)


def render_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2)


# ------------------------------------------------------------------------------------------------
# The command


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _environment(argv: Sequence[str]) -> dict[str, Any]:
    from gluon_survey.driver import hardware

    return hardware.gpu_info(shlex.join(["gluon-survey", "overhead", *argv]))


def main(argv: Sequence[str]) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    if not _cuda_available():
        from gluon_survey.api import describe_torch_cuda

        print(
            f"{PROG}: error: needs a CUDA GPU (torch.cuda.is_available() is False); found "
            f"{describe_torch_cuda()}",
            file=sys.stderr,
        )
        return 2
    rows = measure(args, log=lambda line: print(line, file=sys.stderr))
    doc = document(rows, settings_of(args), _environment(argv))
    print(render_table(doc) if args.format == "table" else render_json(doc))
    status = 1 if any(r.status != "OK" for r in rows) else 0
    if args.results is not None:
        try:
            args.results.write_text(render_json(doc) + "\n")
        except OSError as exc:
            print(f"{PROG}: error: cannot write {args.results}: {exc}", file=sys.stderr)
            return 1
        print(f"{PROG}: results in {args.results}", file=sys.stderr)
    return status
