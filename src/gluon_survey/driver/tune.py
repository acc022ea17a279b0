"""`gluon-survey tune`: measure the candidate modes and configs on each shape and write the table
`matmul(kernel=None)` reads (gluon_survey/choice.py). Anyone can rerun it on their GPU:

    gluon-survey tune --shapes llm --dtype fp16,bf16 --b-layout t --name h100 --match H100 \\
        --output src/gluon_survey/tables/h100.json

`matmul` runs a Gluon candidate between two measured M only where it beat cuBLAS at both, and
cuBLAS beyond the largest or below the smallest; `--shapes llm-dense` measures the same weights at
every power of two from 1 to 16384 and the midpoints 3 * 2**k between them (shapes.DENSE_M).

`--update` measures only the given shapes and merges them into the table already at --output: an
entry of the same (M, N, K, dtype, B layout, A layout) is replaced, the others are kept, and the
run is recorded in the table's `updates` (its env and the keys it wrote; its entries carry
`update`, the 1-based index), so each entry still names the run that measured it.

`--dtype fp8,fp8-row` measures fp8 entries (e4m3 operands with per-tensor or row-wise scales,
B the transpose view of an [N, K] weight, A row-major): each mode's fp8 candidates against
torch._scaled_mm, checked against the dequantized fp32 reference; `matmul` then answers fp8 calls
on those weights from them as it does 16-bit ones (first run: results/experiments/h100-fp8-tune-smoke).

`--shapes llm-train` measures a training step's backward products in their own layouts (grad_x
A row, grad_W^T A t; shapes.llm_train_shapes), `--a-layout t` any shapes with A the transpose
view of a [K, M] matrix: their entries carry `a_layout` "t", which `matmul` uses for such an A
only. With A t the candidates are the modes that read it in place (the Hopper rungs, cuBLAS).

`--confirm` times nothing new from scratch: for each given shape's entry already in the table at
--output, it re-times the candidates that beat cuBLAS by MARGIN there (the best `--confirm-top`
of them, by their ratio to the entry's cuBLAS time), each against cuBLAS in alternating windows
on the same inputs (`timing.time_paired`, the driver's paired method), records the ratios as the
entry's `paired`, times those that held again in GPU time with the host kept ahead (`paired_gpu`),
and re-picks the entry's choice from them (choice.py: only a paired ratio of at least 1 + MARGIN
that is not slower than cuBLAS in GPU time counts). Separate short timings ranked cuBLAS's
per-call time on small weights by up to 45 % differently from one run to the next
(docs/perf-notes.md, entry 55); per-call winners on them were slower than cuBLAS kernel-only
(entry 65).

Per (shape, dtype, B layout, A layout): inputs from the seed (rotated copies for a cold L2, as the
survey times), cuBLAS's time and error, then every candidate (each provider's
`candidates(capability)`, narrowed to the ones that make sense at this M: `candidates_for`) is
prepared, checked against the fp32 reference on a NaN-poisoned output with the survey's tolerance,
and timed with `timing.time_fn`; the fastest correct one is the entry if it beats cuBLAS by
choice.MARGIN, else cuBLAS, with every candidate's time as evidence. The timing is shorter than
the survey's (`--warmup-ms`, `--min-ms`), so close calls may be ranked by noise; the survey's own
run of the `auto` mode (`gluon-survey auto --shapes llm --b-layout t`) is the measurement that
counts.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from gluon_survey import registry
from gluon_survey.choice import CUBLAS, MARGIN
from gluon_survey.driver import shapes
from gluon_survey.driver.results import layouts_label
from gluon_survey.driver.settings import DEFAULTS
from gluon_survey.launch import A_LAYOUTS, B_LAYOUTS

PROG = "gluon-survey tune"
MODES = ("slab", "swapab", "splitk", "persistent", "warpspec", "torch")


def choose(times: dict[str, float | str], margin: float = MARGIN) -> str:
    """The candidate an entry records: the fastest measured, unless it beats cuBLAS by less than
    `margin`, then cuBLAS."""
    measured = {k: v for k, v in times.items() if isinstance(v, float)}
    best = min(measured, key=measured.get)
    return best if measured[best] * (1 + margin) <= measured[CUBLAS] else CUBLAS


def candidates_for(
    mode: str, M: int, capability: tuple[int, int], fp8: bool = False
) -> dict[str, object | None]:
    """The configs of `mode` worth timing at M tokens, by label (cuBLAS: one, without a config);
    with `fp8`, the mode's fp8 configs (none for a mode without fp8)."""
    if mode == registry.BASELINE:
        return {"cuBLAS": None}
    if fp8 and registry.no_fp8_reason(registry.get(mode)):
        return {}
    if registry.too_many_tokens_reason(registry.get(mode), M):  # a few-token mode past its tokens
        return {}
    configs = _provider(mode, capability).candidates(capability, fp8)
    if mode == "swapab":
        width = min(128, max(16, 1 << (M - 1).bit_length()))  # the narrowest tile that holds M
        return {k: c for k, c in configs.items() if width == c.BLOCK_N}
    return dict(configs)


def _provider(mode: str, capability: tuple[int, int]):
    return registry.get(mode).provider(capability)


def reads_in_place(mode: str, a, b, target) -> bool:
    """Whether `mode`'s provider reads this `a` (A layout "t") in place: tune times the others on
    row-major A only (`matmul` would copy such an A for them each call)."""
    reads = getattr(_provider(mode, target.capability), "reads_transposed_a", None)
    return reads is not None and reads(a, b, target)


class InputSet(NamedTuple):
    """One set of a shape's inputs: a, b, the output buffer (in the dtype's output dtype) and, for
    fp8, the scales as `make_inputs` gives them ({"scale_a": ..., "scale_b": ...}; {} otherwise)
    and their kind (`check.dtype_spec(dtype).scaling`: "tensor", "row", or None)."""

    a: Any
    b: Any
    out: Any
    scales: dict
    scaling: str | None

    def prepare(self, provider, target, cfg=None, out=None):
        """`provider.prepare` on this set (into `out`, else the set's own buffer), with the fp8
        scales flat as the providers take them (`launch.Scales`) where there are any."""
        from gluon_survey.api import _flat_scales

        extra = {}
        if self.scaling is not None:
            extra["scales"] = _flat_scales(self.scales["scale_a"], self.scales["scale_b"], self.scaling)
        args = (self.a, self.b, self.out if out is None else out, target)
        return provider.prepare(*args, **extra) if cfg is None else provider.prepare(*args, cfg, **extra)


def input_sets(shape, dtype: str, layout: str, seed: int, a_layout: str = "row") -> list[InputSet]:
    """Input sets from `seed` on, as many as span a cold L2 (`timing.copies_for_cold_l2`), as the
    survey times; a in `a_layout` (`check.make_inputs`); fp8 with its scales."""
    import torch

    from gluon_survey.driver.check import dtype_spec, make_inputs, output_dtype
    from gluon_survey.driver.timing import copies_for_cold_l2

    def one(i: int) -> InputSet:
        inputs = make_inputs(shape, dtype, layout, seed + i, "cuda", a_layout=a_layout)
        out = torch.empty(shape.M, shape.N, dtype=output_dtype(dtype), device="cuda")
        return InputSet(inputs.a, inputs.b, out, inputs.scales, dtype_spec(dtype).scaling)

    first = one(0)
    per_set = sum(t.numel() * t.element_size() for t in (first.a, first.b, first.out))
    free = torch.cuda.mem_get_info()[0] // 2
    l2 = torch.cuda.get_device_properties(first.a.device).L2_cache_size
    return [first, *(one(i) for i in range(1, copies_for_cold_l2(per_set, l2, free)))]


def _reference_and_cublas_err(first: InputSet) -> tuple:
    """The fp32 reference of the first set and cuBLAS's error against it (torch._scaled_mm for fp8:
    the survey's yardstick, `worker.cublas_product`)."""
    import torch

    from gluon_survey.driver.check import reference, rel_error
    from gluon_survey.driver.worker import cublas_product

    ref = reference(first.a, first.b, **first.scales)
    return ref, rel_error(cublas_product(first.a, first.b, torch.empty_like(first.out), **first.scales), ref)


def tune_shape(
    shape, dtype: str, layout: str, modes: Sequence[str], target, settings, a_layout: str = "row"
) -> dict:
    """One table entry: every candidate's time (or failure) on this shape, and the fastest. With A
    layout "t", the modes that read it in place only (`reads_in_place`); the entry says `a_layout`."""
    from gluon_survey.driver.check import check
    from gluon_survey.driver.timing import time_fn

    sets = input_sets(shape, dtype, layout, settings.seed, a_layout)
    a, b = sets[0].a, sets[0].b
    ref, cublas_err = _reference_and_cublas_err(sets[0])
    fp8 = sets[0].scaling is not None

    times: dict[str, float | str] = {}
    for mode in modes:
        if a_layout == "t" and not reads_in_place(mode, a, b, target):
            continue
        provider = _provider(mode, target.capability)
        for label, cfg in candidates_for(mode, shape.M, target.capability, fp8).items():
            key = f"{mode} {label}"
            try:
                launches = [one.prepare(provider, target, cfg).fn for one in sets]
                sets[0].out.fill_(math.nan)
                launches[0]()
                verdict = check(sets[0].out, ref, cublas_err, dtype)
                if not verdict.ok:
                    times[key] = f"FAILED: {verdict.describe()}"
                    continue
                timing = time_fn(
                    lambda i, launches=launches: launches[i],
                    len(sets),
                    warmup_ms=settings.warmup_ms,
                    min_ms=settings.min_ms,
                    queued=settings.queued,
                )
                times[key] = timing.median_ms
            except Exception as exc:  # a candidate that cannot run here is evidence, not a crash
                times[key] = f"ERROR: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    best = choose(times)
    mode, _, label = best.partition(" ")
    return {
        "M": shape.M,
        "N": shape.N,
        "K": shape.K,
        "dtype": dtype,
        "b_layout": layout,
        **({"a_layout": a_layout} if a_layout != "row" else {}),  # none: A row, as entries always were
        "mode": mode,
        "config": None if mode == registry.BASELINE else label,
        "ms": times[best],
        "cublas_ms": times[CUBLAS],
        "candidates": times,
    }


def confirm_entry(entry: dict, target, settings, top: int) -> dict:
    """`entry` with `paired`: the paired ratio to cuBLAS of its best `top` candidates that beat
    cuBLAS by MARGIN (module docstring), checked against the fp32 reference first (a failure
    counts as 0); `paired_gpu`: the same in GPU time (the queued clock) for those whose paired
    ratio is at least 1 + MARGIN; and its choice re-picked from them (`choice._held`: at least
    1 + MARGIN per call and GPU_TIME_FLOOR in GPU time, the best per-call ratio), else cuBLAS."""
    import torch

    from gluon_survey.choice import _held, _measured, _mode_config
    from gluon_survey.driver.check import check
    from gluon_survey.driver.timing import time_paired

    unpaired = {k: v for k, v in entry.items() if k not in ("paired", "paired_gpu")}
    ratios = _measured(unpaired)
    held = sorted(_held(unpaired), key=lambda k: (-ratios[k], k))
    if not held:
        return entry
    shape = shapes.Shape(entry["M"], entry["N"], entry["K"])
    sets = input_sets(shape, entry["dtype"], entry["b_layout"], settings.seed, entry.get("a_layout", "row"))
    ref, cublas_err = _reference_and_cublas_err(sets[0])
    fp8 = sets[0].scaling is not None
    cublas = _provider(registry.BASELINE, target.capability)
    base = [one.prepare(cublas, target, out=torch.empty_like(one.out)).fn for one in sets]
    paired: dict[str, float] = {}
    paired_gpu: dict[str, float] = {}  # GPU time, the host kept ahead: for those that held per call
    for key in held[:top]:
        mode, label = _mode_config(key)
        cfg = candidates_for(mode, shape.M, target.capability, fp8)[label]
        provider = _provider(mode, target.capability)
        launches = [one.prepare(provider, target, cfg).fn for one in sets]
        sets[0].out.fill_(math.nan)
        launches[0]()
        if not check(sets[0].out, ref, cublas_err, entry["dtype"]).ok:
            paired[key] = 0.0
            continue
        for queued, ratios_of in ((False, paired), (True, paired_gpu)):
            if queued and paired[key] < 1 + MARGIN:
                break  # lost per call already: no GPU-time verdict needed
            timing = time_paired(
                lambda i, launches=launches: launches[i],
                lambda i: base[i],
                len(sets),
                warmup_ms=settings.warmup_ms,
                rewarm_ms=settings.rewarm_ms,
                settle_ms=settings.settle_ms,
                min_ms=settings.min_ms,
                rounds=settings.rounds,
                queued=queued,
            )
            ratios_of[key] = round(timing.ratio, 4)
    return repicked(entry, paired, paired_gpu)


def repicked(entry: dict, paired: dict[str, float], paired_gpu: dict[str, float]) -> dict:
    """`entry` with a confirmation's ratios (`paired` per call, `paired_gpu` in GPU time) and its
    choice picked again from them: of the candidates that hold (`choice._held`: 1 + MARGIN per
    call, GPU_TIME_FLOOR in GPU time), the best per-call ratio; else cuBLAS."""
    from gluon_survey.choice import _held, _mode_config

    confirmed = entry | {"paired": paired, "paired_gpu": paired_gpu}
    best = max(_held(confirmed), key=lambda k: (paired[k], k), default=CUBLAS)
    mode, label = _mode_config(best)
    ms = entry["cublas_ms"] if best == CUBLAS else entry["candidates"][best]
    return confirmed | {"mode": mode, "config": label, "ms": ms}


def entry_key(entry: dict) -> tuple:
    """(M, N, K, dtype, B layout), and "t" last where the entry's A is in layout "t" (an entry
    without `a_layout` is A row: the keys of tables written before A layouts stay as they were)."""
    return task_key(
        entry["M"], entry["N"], entry["K"], entry["dtype"], entry["b_layout"], entry.get("a_layout")
    )


def task_key(M: int, N: int, K: int, dtype: str, b_layout: str, a_layout: str | None = "row") -> tuple:
    """`entry_key` of the entry a shape, dtype and layouts would have."""
    key = (M, N, K, dtype, b_layout)
    return key if a_layout in (None, "row") else (*key, a_layout)


def merge(table: dict, update: dict) -> dict:
    """`table` with `update`'s entries merged in (module docstring): the same key replaced, new
    keys added, the rest kept in their order; `update`'s env and settings appended to `updates`."""
    runs = list(table.get("updates", ()))
    index = len(runs) + 1
    fresh = {entry_key(e): e | {"update": index} for e in update["entries"]}
    entries = [fresh.pop(entry_key(e)) if entry_key(e) in fresh else e for e in table["entries"]]
    entries += fresh.values()
    keys = [list(entry_key(e)) for e in update["entries"]]
    runs.append({"env": update["env"], "settings": update["settings"], "entries": keys})
    return table | {"entries": entries, "updates": runs}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        # what it does, the example, the M grid, --update, the A layouts
        description="\n\n".join(__doc__.split("\n\n")[:5]),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the example keeps its lines
    )
    parser.add_argument(
        "--shapes",
        default="llm",
        metavar="llm|llm-dense|llm-train|holdout|FILE.csv",
        help="shapes (default: llm); llm-train's fix their own A and B layouts",
    )
    parser.add_argument(
        "--dtype", default="fp16,bf16", help="comma list of fp16, bf16, fp8, fp8-row (default: %(default)s)"
    )
    parser.add_argument("--b-layout", help="comma list of row, t (default: t, the nn.Linear weight's)")
    parser.add_argument(
        "--a-layout",
        help="comma list of row, t (t: A is x.t() of a [K, M] matrix, as in a weight's gradient; "
        "default: row)",
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="candidate modes, cuBLAS always included (default: %(default)s)",
    )
    parser.add_argument("--name", required=True, help="the table's name, e.g. h100")
    parser.add_argument(
        "--match", required=True, help="substring of the GPU names the table is for, e.g. H100"
    )
    parser.add_argument("--output", type=Path, required=True, metavar="FILE.json", help="the table to write")
    parser.add_argument(
        "--gpu-time",
        action="store_true",
        help="rank candidates by GPU time, the host kept ahead (timing.py's queued clock): for shapes "
        "whose kernels are shorter than their launch, where a per-call time ranks host costs",
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="merge the measured shapes into the table at --output instead of replacing it",
    )
    parser.add_argument(
        "--confirm",
        action="store_true",
        help="re-time the entries' winners against cuBLAS in alternating windows and re-pick (module "
        "docstring); the table at --output must hold the shapes' entries",
    )
    parser.add_argument(
        "--confirm-top",
        type=int,
        default=2,
        metavar="N",
        help="--confirm: how many of an entry's candidates that beat cuBLAS to re-time "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="--confirm: paired rounds (default: %(default)s)"
    )
    parser.add_argument("--warmup-ms", type=float, default=300.0, help="per candidate (default: %(default)g)")
    parser.add_argument("--min-ms", type=float, default=100.0, help="per candidate (default: %(default)g)")
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    from dataclasses import replace

    from gluon_survey.driver.check import DTYPES
    from gluon_survey.driver.runner import make_tasks

    try:
        sweep = shapes.resolve(args.shapes, None, None, None)
        dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
        layouts = [x.strip() for x in (args.b_layout or "t").split(",") if x.strip()]
        a_layouts = [x.strip() for x in (args.a_layout or "row").split(",") if x.strip()]
        modes = [registry.get(m).name for m in args.modes.split(",") if m.strip()]
        if shapes.is_grouped(sweep):
            raise ValueError(
                f"--shapes {args.shapes}: grouped shapes; tune builds matmul's table of dense GEMMs "
                "(time grouped ones with `gluon-survey grouped,grouped_mm --shapes moe`)"
            )
        for name in modes:
            if reason := registry.wrong_shape_reason(registry.get(name), grouped=False):
                raise ValueError(f"--modes: {reason}")
        bad = [d for d in dtypes if d not in DTYPES] + [x for x in layouts if x not in B_LAYOUTS]
        bad += [x for x in a_layouts if x not in A_LAYOUTS]
        if bad:
            raise ValueError(f"unknown dtype or layout: {', '.join(bad)}")
        given = [o for o, v in (("--a-layout", args.a_layout), ("--b-layout", args.b_layout)) if v]
        if shapes.fixed_layouts(sweep) and given:
            raise ValueError(
                f"{' and '.join(given)}: --shapes {args.shapes} fixes each shape's A and B layouts; "
                f"leave {' and '.join(given)} out"
            )
        fp8 = [d for d in dtypes if d.startswith("fp8")]
        if fp8 and (set(layouts) - {"t"} or set(a_layouts) - {"row"}):
            raise ValueError(
                f"{', '.join(fp8)}: fp8 runs with A row-major and B the transpose view of an [N, K] "
                "weight only (--b-layout t, --a-layout row); tune the 16-bit layouts separately"
            )
    except (KeyError, ValueError) as exc:
        print(f"{PROG}: error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    if not args.output.parent.is_dir():
        print(f"{PROG}: error: --output {args.output}: no directory {args.output.parent}", file=sys.stderr)
        return 2
    base = None
    if args.update or args.confirm:
        try:
            base = json.loads(args.output.read_text())
            if (base["name"], base["match"]) != (args.name, args.match):
                raise ValueError(f"it is table {base['name']!r} for {base['match']!r}")
        except (OSError, ValueError, KeyError) as exc:
            flag = "--update" if args.update else "--confirm"
            print(f"{PROG}: error: {flag} {args.output}: {exc}", file=sys.stderr)
            return 2
    import torch

    from gluon_survey import api

    if not torch.cuda.is_available():
        print(
            f"{PROG}: needs a CUDA GPU: it measures the candidates; found {api.describe_torch_cuda()}",
            file=sys.stderr,
        )
        return 2
    from gluon_survey.driver import hardware

    target = api.target_of(torch.device("cuda"))
    if registry.BASELINE not in modes:
        modes.append(registry.BASELINE)
    settings = replace(
        DEFAULTS,
        warmup_ms=args.warmup_ms,
        min_ms=args.min_ms,
        queued=args.gpu_time,
        rounds=args.rounds,
        rewarm_ms=min(DEFAULTS.rewarm_ms, args.warmup_ms),
    )
    command = shlex.join(["gluon-survey", "tune", *argv])
    env = hardware.gpu_info(command)
    table = {
        "name": args.name,
        "match": args.match,
        "gpu": env.get("name"),
        "env": {k: env.get(k) for k in ("date", "command", "driver", "cuda", "torch", "triton", "git")},
        "settings": {
            "warmup_ms": settings.warmup_ms,
            "min_ms": settings.min_ms,
            "seed": settings.seed,
            "gpu_time": settings.queued,
        },
        "entries": [],
    }
    tasks = [
        (t.shape, t.dtype, t.b_layout, t.a_layout) for t in make_tasks(sweep, dtypes, layouts, a_layouts)
    ]
    existing = {entry_key(e): e for e in (base or {}).get("entries", ())}
    for i, (shape, dtype, layout, a_layout) in enumerate(tasks, 1):
        where = f"[{i}/{len(tasks)}] {shape.label} {dtype} {layouts_label(a_layout, layout)}"
        if args.confirm:
            old = existing.get(task_key(shape.M, shape.N, shape.K, dtype, layout, a_layout))
            if old is None:
                print(f"{where}: no entry to confirm", file=sys.stderr)
                continue
            entry = confirm_entry(old, target, settings, args.confirm_top)
            if "paired" not in entry:  # nothing beat cuBLAS there: nothing re-timed, the entry is kept
                continue
        else:
            entry = tune_shape(shape, dtype, layout, modes, target, settings, a_layout)
        table["entries"].append(entry)
        written = table if base is None else merge(base, table)
        args.output.write_text(json.dumps(written, indent=1) + "\n")  # a crash keeps what was measured
        ratio = entry["cublas_ms"] / entry["ms"]
        gpu = entry.get("paired_gpu", {})
        paired = ", ".join(
            f"{k} {v:.2f}x" + (f" ({gpu[k]:.2f}x GPU time)" if k in gpu else "")
            for k, v in entry.get("paired", {}).items()
        )
        paired = f"; paired: {paired}" if paired else ""
        print(
            f"{where}: {entry['mode']} {entry['config'] or ''} "
            f"{entry['ms'] * 1e3:.1f} us, {ratio:.2f}x cuBLAS{paired}",
            file=sys.stderr,
        )
    print(f"{PROG}: wrote {args.output}", file=sys.stderr)
    return 0
