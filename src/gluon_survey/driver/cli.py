"""`gluon-survey`: time the survey's GEMM modes, and the commands around it.

    gluon-survey [MODES] [options]      time MODES (comma-separated, case-insensitive; default: every
                                        mode that computes the sweep's kind of GEMM, dense or grouped)
    gluon-survey list                   every mode, what it is, and whether this machine can run it
    gluon-survey compare OLD NEW        two results files side by side [--fail-on-regression PCT]
    gluon-survey report RESULTS ...     re-render results files (of one GPU and commit) [--format, --plot]
    gluon-survey inspect ...            compile the kernels for sm_90a / sm_100a, no GPU needed
    gluon-survey memcpy ...             rung 0: the copy ladder, this GPU's bandwidth floor
    gluon-survey overhead ...           host time per call: matmul against its bare launch and cuBLAS
    gluon-survey tune ...               measure candidates per shape, write matmul's choice table
    gluon-survey model ...              a transformers model, stock against ours (patch; MoE: patch_experts)

The timing command writes every row to a JSON Lines results file as it is measured (default
out/results-<run id>.jsonl), then prints the report, and ends by naming the results file (also
when interrupted or when the report cannot be written). Exit status: 0 when every row is OK or
SKIPPED, 1 when any is FAILED, ERROR or TIMEOUT or the report or plot cannot be written, 2 for a
usage error (checked before the GPU is asked for: modes, dtypes and A and B layouts, a named mode
without fp8 kernels for fp8 dtypes only (or an fp8-only one for fp16/bf16 only), per-tensor fp8,
B layout row or A layout t for grouped shapes, layouts or fp8 for shapes that fix their layouts
(`--shapes llm-train`), sizes, --output, --plot
and --results paths) or a machine without a CUDA GPU, 130 when interrupted (the rows measured so
far are kept and reported). `report` exits 1 for a results file without rows, `compare` 1 for two
files that share no result and, with --fail-on-regression, for a regression or a result missing
from NEW.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from gluon_survey import __version__, registry
from gluon_survey.driver import args as argtypes
from gluon_survey.driver import shapes
from gluon_survey.driver.settings import DEFAULTS, Settings
from gluon_survey.launch import A_LAYOUTS, B_LAYOUTS

if TYPE_CHECKING:
    from gluon_survey.driver.results import Results, Row
    from gluon_survey.driver.runner import Task

PROG = "gluon-survey"
_DIMS = (("m", shapes.DEFAULT_M), ("n", shapes.DEFAULT_N), ("k", shapes.DEFAULT_K))
BAD_STATUSES = ("FAILED", "ERROR", "TIMEOUT")
EXIT_INTERRUPTED = 130
TIMER = "CUDA events around each iteration"  # how the workers time, for the results header


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch on the first argument: a subcommand, or else the timing command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _SUBCOMMANDS.get(argv[0]) if argv else None
    try:
        return command(argv[1:]) if command else run(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2


# ------------------------------------------------------------------------------------------------
# The timing command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [MODES] [options] | {PROG} {{{','.join(_SUBCOMMANDS)}}} ...",
        description="Time GEMM modes on this GPU, check each against an fp32 reference, and report "
        "TFLOP/s and x cuBLAS.",
        epilog=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument(
        "modes",
        nargs="?",
        metavar="MODES",
        help="comma-separated, case-insensitive (default: every mode that computes the sweep's GEMMs: "
        f"the dense modes, or for grouped shapes the grouped ones): {', '.join(registry.names())}",
    )
    what = parser.add_argument_group("what to measure")
    what.add_argument(
        "--dtype",
        default="fp16",
        help="comma-separated: fp16, bf16, fp8 (e4m3 operands with per-tensor fp32 scales, bf16 out), "
        "fp8-row (e4m3 with row-wise scales: one per row of A and per column of B, bf16 out) "
        "(default: %(default)s)",
    )
    for dim, default in _DIMS:
        what.add_argument(
            f"--{dim}",
            type=argtypes.non_empty,
            help=f"{dim.upper()} sizes: a comma list of sizes, start:stop ranges (doubling: start, "
            f"2*start, ..., stop) and start:stop:step ranges, stops inclusive (default: {default})"
            if dim == "k"
            else f"{dim.upper()} sizes, written as for --k (default: {default})",
        )
    what.add_argument(
        "--shapes",
        type=argtypes.non_empty,
        metavar="llm|llm-dense|llm-train|holdout|moe|FILE.csv",
        help="'llm': the linear layers of Llama-3-8B/70B at 1..8192 tokens; 'llm-dense': the same "
        "weights at 28 token counts from 1 to 16384 (powers of two and 3 * 2**k); 'llm-train': their "
        "backward products at 1024..8192 tokens, grad_x = grad @ W (A row, B row) and grad_W^T = "
        "grad^T @ x (A t, B row), each shape in its own layouts; 'holdout': those of "
        "Llama-3.2-1B/3B and Qwen2.5-7B/14B at 1..4096 tokens (weights the H100 table has no entry "
        "for); 'moe': grouped GEMMs, the expert gate_up and down projections of Mixtral-8x7B, "
        "Qwen3-30B-A3B, DeepSeek-V3 and GPT-OSS-20B at T = 1..16384 tokens, routed uniform, zipf or "
        "half (one expert takes half the token-slots), with B t: fp16/bf16 against torch._grouped_mm, "
        "fp8-row (a scale per token and per expert channel) against torch._scaled_grouped_mm; "
        "or a CSV of M,N,K rows, or of grouped T,N,K,E,topk,routing rows",
    )
    what.add_argument(
        "--b-layout",
        help="comma-separated: row (B is [K, N]), t (B is w.t() of a [N, K] weight) (default: row for "
        "fp16 and bf16; t for fp8 and fp8-row, which run with t only)",
    )
    what.add_argument(
        "--a-layout",
        help="comma-separated: row (A is [M, K]), t (A is x.t() of a [K, M] matrix, as in a weight's "
        "gradient grad^T @ x: modes that cannot read it in place copy it each call, as matmul does; "
        "fp8 runs with row only, its t rows SKIPPED) (default: row)",
    )
    how = parser.add_argument_group("how to measure")
    how.add_argument(
        "--warmup-ms",
        type=float,
        default=DEFAULTS.warmup_ms,
        help="warm-up before each cell, to the GPU's power-limited clock (default: %(default)g)",
    )
    how.add_argument(
        "--min-ms",
        type=argtypes.positive,
        default=DEFAULTS.min_ms,
        help="timed GPU time per window; a paired cell has --rounds of them (default: %(default)g)",
    )
    how.add_argument(
        "--timeout",
        type=argtypes.positive,
        default=DEFAULTS.timeout_s,
        metavar="S",
        help="seconds per shape, compilation and autotuning included (default: %(default)g)",
    )
    how.add_argument("--seed", type=int, default=DEFAULTS.seed, help="input seed (default: %(default)s)")
    how.add_argument(
        "--paired",
        action=argparse.BooleanOptionalAction,
        default=DEFAULTS.paired,
        help="time cuBLAS on the same inputs in windows alternating with every cell's and divide by "
        "that, so that the ratios do not move with the GPU's clock over the run "
        f"(default: {'on' if DEFAULTS.paired else 'off'})",
    )
    how.add_argument(
        "--rounds",
        type=argtypes.positive_int,
        default=DEFAULTS.rounds,
        help="paired timing: timed windows of min-ms of the cell, each between two of cuBLAS's "
        "(default: %(default)s)",
    )
    how.add_argument(
        "--settle-ms",
        type=argtypes.non_negative,
        default=DEFAULTS.settle_ms,
        help="paired timing, alternating windows: untimed calls of a window's own side before it, so "
        "that at the power limit each side runs at the clock its own power draw sets (0: none, the "
        "timing before this option) (default: %(default)g)",
    )
    how.add_argument(
        "--noisy-rounds",
        type=argtypes.positive_int,
        default=DEFAULTS.noisy_rounds,
        help="paired timing: a cell whose samples (or cuBLAS's) still spread over 5 %% after --rounds "
        "takes more rounds, up to this many in all; the choice looks only at the spread, never at "
        "the ratio (default: %(default)s)",
    )
    how.add_argument(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        default=DEFAULTS.interleave,
        help="paired timing: take the cell's calls and cuBLAS's in turn within each window instead "
        "of in alternating windows, so that both sample the same stretch of a host-bound call's "
        "launch times; not with --gpu-time (default: where both calls take under "
        f"{DEFAULTS.interleave_below_ms * 1e3:.0f} µs and without --gpu-time)",
    )
    how.add_argument(
        "--gpu-time",
        action=argparse.BooleanOptionalAction,
        default=DEFAULTS.queued,
        help="time GPU time, for kernels shorter than their launch: a sleep kernel enqueued before "
        "each burst of iterations keeps the host ahead, so the per-iteration events time the calls "
        "back to back on the GPU; calls the host fell behind on are counted in the row's `starved` "
        f"(default: {'on' if DEFAULTS.queued else 'off'}: each call timed as a user calls it, its "
        "launch included when the GPU waits for it)",
    )
    how.add_argument(
        "--bias",
        action=argparse.BooleanOptionalAction,
        default=DEFAULTS.bias,
        help="add a bias [N] to every product: each mode in its epilogue (matmul's bias=), cuBLAS "
        "through torch.addmm (fp8: torch._scaled_mm(bias=)), so the ratios compare fused bias "
        "with fused bias; modes that add none are SKIPPED "
        f"(default: {'on' if DEFAULTS.bias else 'off'})",
    )
    how.add_argument(
        "--peak-tflops",
        type=argtypes.positive,
        metavar="TFLOPS",
        help="dense peak to report %% of peak against (default: datasheet value for this GPU)",
    )
    out = parser.add_argument_group("output")
    _add_output_options(out)
    out.add_argument(
        "--results",
        type=Path,
        metavar="FILE.jsonl",
        help="results file (default: out/results-<run id>.jsonl)",
    )
    out.add_argument(
        "--continue-from",
        type=Path,
        action="append",
        default=[],
        metavar="FILE.jsonl",
        help="an earlier run of this sweep that stopped short (a device call's time limit, say), at "
        "this commit and on this GPU; repeatable: time only the mode-cells none of them has a row "
        "for, into this run's own results file, which `report` merges with theirs",
    )
    return parser


def _add_output_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    from gluon_survey.driver.report import FORMATS, PLOT_BY, PLOT_SUFFIXES

    parser.add_argument("--format", choices=FORMATS, default="table", help="report format (default: table)")
    parser.add_argument(
        "--output", type=Path, metavar="FILE", help="write the report to FILE, in an existing directory"
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also plot into FILE: TFLOP/s vs K per mode for a --m/--n/--k grid, x cuBLAS vs M per "
        f"weight for --shapes ({_plot_suffixes(PLOT_SUFFIXES)})",
    )
    parser.add_argument(
        "--plot-by",
        choices=PLOT_BY,
        default=PLOT_BY[0],
        help="a --shapes run's plot: a panel per mode with a line per weight, or a panel per weight "
        "with a line per mode, the rungs side by side (default: %(default)s)",
    )


def _plot_suffixes(suffixes: Sequence[str]) -> str:
    return f"{', '.join(suffixes[:-1])} or {suffixes[-1]}"


def _output_path_error(args: argparse.Namespace, results: Path | None = None) -> str | None:
    """Why --output, --plot or the timing command's --results (`results`) cannot be written (None
    when all can), so that a bad path is a usage error before anything runs (or the GPU is asked
    for), not an exception after the sweep. --results may name directories still to be made (the
    default, out/, is one)."""
    from gluon_survey.driver.report import PLOT_SUFFIXES

    for option, path in (("--output", args.output), ("--plot", args.plot)):
        if path is None:
            continue
        if path.is_dir():
            return f"{option} {path}: is a directory"
        if not path.parent.is_dir():
            return f"{option} {path}: directory {path.parent} does not exist"
        if not os.access(path.parent, os.W_OK):
            return f"{option} {path}: directory {path.parent} is not writable"
        if option == "--plot" and path.suffix.lower() not in PLOT_SUFFIXES:
            return f"{option} {path}: expected a {_plot_suffixes(PLOT_SUFFIXES)} file"
    if results is None:
        return None
    if results.exists():
        return f"--results {results} exists; a results file holds one run"
    ancestor = results.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"--results {results}: {ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK):
        made = "" if ancestor == results.parent else f" (to make {results.parent} in)"
        return f"--results {results}: directory {ancestor}{made} is not writable"
    return None


def _no_fp8_error(modes: Sequence[str], dtypes: Sequence[str]) -> str | None:
    """Why the modes named on the command line would measure nothing: every --dtype asked is fp8
    and a named mode has no fp8 kernel, or every one is fp16/bf16 and a named mode takes fp8 only
    (with the other kind as well, those rows are SKIPPED)."""
    fp8 = [d.startswith("fp8") for d in dtypes]
    if not all(fp8) and any(fp8):
        return None
    for name in modes:
        mode = registry.get(name)
        reason = registry.no_fp8_reason(mode) if all(fp8) else registry.no_16bit_reason(mode)
        if reason:
            return f"--dtype {','.join(dtypes)}: {reason}"
    return None


GROUPED_B_LAYOUT = "t"  # a grouped GEMM's B: the [E, K, N] transpose view of an [E, N, K] weight
GROUPED_ALIGN = 8  # N and K of a grouped shape: TMA's and torch._grouped_mm's 16-byte rows (16-bit types)
# fp8-row: K a multiple of 16 for TMA's 16-byte rows of 1-byte elements, N too for the baselines
# (torch._scaled_grouped_mm and torch._scaled_mm take N and K only as multiples of 16)
GROUPED_FP8_ALIGN = 16


def _grouped_error(
    sweep: Sequence[shapes.GroupedShape],
    dtypes: Sequence[str],
    layouts: Sequence[str] | None,
    a_layouts: Sequence[str] | None = None,
) -> str | None:
    """Why a sweep of grouped shapes cannot run as asked: per-tensor fp8 (grouped GEMMs run fp8
    with row-wise scales only), B layout row (the experts' weights are [E, N, K], read through
    their transpose view), A layout t (x is the tokens' row-major [S, K]), or N or K not a
    multiple of 8 (16 in fp8-row)."""
    from gluon_survey.driver.check import GROUPED_FP8, dtype_spec

    per_tensor = [d for d in dtypes if dtype_spec(d).scaling == "tensor"]
    if per_tensor:
        return f"--dtype {','.join(per_tensor)}: {GROUPED_FP8}"
    if a_layouts is not None and a_layouts != ["row"]:
        return (
            f"--a-layout {','.join(a_layouts)}: grouped shapes run with A layout row only (x is the "
            "tokens' row-major [S, K], grouped by expert); leave --a-layout out"
        )
    if layouts is not None and layouts != [GROUPED_B_LAYOUT]:
        return (
            f"--b-layout {','.join(layouts)}: grouped shapes run with B layout {GROUPED_B_LAYOUT} only (each "
            f"expert's weight is the transpose view of its [N, K] slice of the [E, N, K] weight, as "
            f"transformers and torch._grouped_mm take it); pass --b-layout {GROUPED_B_LAYOUT} or leave it out"
        )
    fp8 = any(dtype_spec(d).scaling is not None for d in dtypes)
    align = GROUPED_FP8_ALIGN if fp8 else GROUPED_ALIGN
    for shape in sweep:
        if shape.N % align or shape.K % align:
            why = (
                "fp8-row: TMA reads rows of 16-byte multiples, and torch._scaled_grouped_mm takes N and "
                "K only as multiples of 16"
                if fp8
                else "TMA and torch._grouped_mm read rows of 16-byte multiples"
            )
            return f"--shapes: grouped shape {shape.label}: N and K must be multiples of {align} ({why})"
    return None


def _fixed_layouts_error(
    spec: str, sweep: Sequence[shapes.Shape], dtypes: Sequence[str], args: argparse.Namespace
) -> str | None:
    """Why a sweep whose shapes fix their layouts (`--shapes llm-train`) cannot run as asked:
    --a-layout or --b-layout given (each shape says its own), or a dtype that cannot run in a
    layout the shapes have (fp8: B t and A row only)."""
    from gluon_survey.driver.check import DTYPE_SPECS

    given = [opt for opt, value in (("--a-layout", args.a_layout), ("--b-layout", args.b_layout)) if value]
    if given:
        return (
            f"{' and '.join(given)}: --shapes {spec} fixes each shape's A and B layouts (those of the "
            f"product it stands for); leave {' and '.join(given)} out"
        )
    for dtype in dtypes:
        spec_ = DTYPE_SPECS[dtype]
        for shape in sweep:
            a, b = shape.a_layout or "row", shape.b_layout or "row"
            if a not in spec_.a_layouts or b not in spec_.b_layouts:
                return (
                    f"--dtype {dtype}: --shapes {spec} has products in A layout {a}, B layout {b} "
                    f"({shape.label}), and {dtype} runs with A layout {', '.join(spec_.a_layouts)} and B "
                    f"layout {', '.join(spec_.b_layouts)} only; measure fp16 or bf16"
                )
    return None


def _unknown_mode_error(spec: str, message: str) -> str:
    """`registry.parse_modes`'s KeyError `message`, and the closest name to the first unknown one:
    a mode, or a subcommand when it stands alone (`gluon-survey lsit` is a misspelt `list`)."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    unknown = next((p for p in parts if p.lower() not in {n.lower() for n in registry.names()}), None)
    if unknown is None:
        return message
    candidates = {name.lower(): f"mode {name}" for name in registry.names()}
    if len(parts) == 1:
        candidates |= {name: f"`{PROG} {name}`" for name in _SUBCOMMANDS}
    closest = difflib.get_close_matches(unknown.lower(), list(candidates), n=1, cutoff=0.6)
    return f"{message}; did you mean {candidates[closest[0]]}?" if closest else message


def run(argv: Sequence[str]) -> int:
    """The timing command (see `build_parser`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from gluon_survey.driver import runner
    from gluon_survey.driver.check import DTYPES

    try:
        named = registry.parse_modes(args.modes) if args.modes else None
    except KeyError as exc:
        return _usage_error(_unknown_mode_error(args.modes, exc.args[0]))
    try:
        dtypes = _pick(args.dtype, DTYPES, "--dtype")
        layouts = _pick(args.b_layout, B_LAYOUTS, "--b-layout") if args.b_layout is not None else None
        a_layouts = _pick(args.a_layout, A_LAYOUTS, "--a-layout") if args.a_layout is not None else None
        sweep = shapes.resolve(args.shapes, args.m, args.n, args.k)
    except (KeyError, ValueError) as exc:
        return _usage_error(exc.args[0] if exc.args else str(exc))
    grouped = shapes.is_grouped(sweep)
    modes = [mode.name for mode in (named or registry.modes_of(grouped))]
    if grouped:
        problem = _grouped_error(sweep, dtypes, layouts, a_layouts)
        layouts_of = {d: [GROUPED_B_LAYOUT] for d in dtypes}
    elif shapes.fixed_layouts(sweep):
        problem = _fixed_layouts_error(args.shapes, sweep, dtypes, args)
        layouts_of = {d: [] for d in dtypes}  # each shape's own (`runner.make_tasks`)
    else:
        try:
            layouts_of = layouts_per_dtype(dtypes, layouts)
        except ValueError as exc:
            parser.error(str(exc))
        problem = None
    problem = problem or (_no_fp8_error(modes, dtypes) if args.modes else None)
    problem = problem or _output_path_error(args, args.results) or _interleave_error(args)
    if problem:
        return _usage_error(problem)
    try:
        earlier = _earlier_runs(args.continue_from)
    except ValueError as exc:
        return _usage_error(str(exc))
    if not _cuda_available():
        from gluon_survey.api import describe_torch_cuda

        print(
            f"{PROG}: timing needs a CUDA GPU that torch can use (torch.cuda.is_available()); found "
            f"{describe_torch_cuda()}. The modes run on: {registry.supported_summary()}. "
            f"`{PROG} list` and `{PROG} inspect` work without a GPU.",
            file=sys.stderr,
        )
        return 2
    command = shlex.join([PROG, *argv])  # recorded as typed, to reproduce the run
    tasks = [
        task for d in dtypes for task in runner.make_tasks(sweep, [d], layouts_of[d], a_layouts or ["row"])
    ]
    return _sweep(args, modes, tasks, command, earlier)


def _earlier_runs(paths: Sequence[Path]) -> list[tuple[Path, Results]]:
    """The runs --continue-from names, each checked to come from this checkout's commit (`report`
    merges one commit's runs only); ValueError naming the file and the fix otherwise."""
    from gluon_survey.driver import hardware

    runs = []
    ours = (hardware.git_commit() or {}).get("commit")
    for path in paths:
        try:
            run = _load(path)  # a run stopped mid-line: its last line skipped, and said
        except (OSError, ValueError) as exc:
            raise ValueError(f"--continue-from {path}: {getattr(exc, 'strerror', None) or exc}") from None
        theirs = (run.env.get("git") or {}).get("commit")
        if theirs != ours:
            raise ValueError(
                f"--continue-from {path} ran at commit {theirs}, this checkout is at {ours}: `report` "
                f"merges the runs of one commit only; continue it from a checkout of {theirs}, or run "
                "the whole sweep again here"
            )
        runs.append((path, run))
    return runs


def _interleave_error(args: argparse.Namespace) -> str | None:
    """--interleave (given; the default decides per cell) pairs each call with cuBLAS's as it is
    made: it needs --paired, and it does not combine with --gpu-time, which keeps the host ahead of
    the calls instead."""
    if args.interleave and not args.paired:
        return "--interleave takes the cell's calls in turn with cuBLAS's: drop --no-paired or --interleave"
    if args.interleave and args.gpu_time:
        return (
            "--interleave times each call as it is made, --gpu-time back to back on the GPU: "
            "choose one of them"
        )
    return None


def layouts_per_dtype(dtypes: Sequence[str], layouts: Sequence[str] | None) -> dict[str, list[str]]:
    """The B layouts each dtype runs in: `layouts` (from --b-layout) for every dtype, or without it
    each dtype's default (`check.DtypeSpec.default_b_layout`: row for fp16/bf16, t for fp8).
    ValueError, naming the fix, when a dtype cannot run in a layout asked for (fp8 with row)."""
    from gluon_survey.driver.check import DTYPE_SPECS

    out: dict[str, list[str]] = {}
    for dtype in dtypes:
        spec = DTYPE_SPECS[dtype]
        if layouts is None:
            out[dtype] = [spec.default_b_layout]
            continue
        bad = [lay for lay in layouts if lay not in spec.b_layouts]
        if bad:
            raise ValueError(
                f"argument --b-layout: --dtype {dtype} runs with B layout {', '.join(spec.b_layouts)} only "
                f"(fp8 MMAs read B K-major, the transpose view of an [N, K] weight), not "
                f"{', '.join(bad)}; pass --b-layout t, or leave --b-layout out (then fp16/bf16 run "
                f"with row and fp8 with t), or run the fp8 dtypes in a separate command"
            )
        out[dtype] = list(layouts)
    return out


def _sweep(
    args: argparse.Namespace,
    modes: list[str],
    tasks: list[Task],
    command: str,
    earlier: Sequence[tuple[Path, Results]] = (),
) -> int:
    from gluon_survey.driver import hardware, results, runner

    settings = Settings(
        seed=args.seed,
        warmup_ms=args.warmup_ms,
        min_ms=args.min_ms,
        timeout_s=args.timeout,
        paired=args.paired,
        rounds=args.rounds,
        settle_ms=args.settle_ms,
        noisy_rounds=max(args.rounds, args.noisy_rounds),
        queued=args.gpu_time,
        interleave=args.interleave,
        bias=args.bias,
    )
    env = hardware.gpu_info(command)
    for path, run in earlier:
        if run.env.get("name") != env.get("name"):
            return _usage_error(
                f"--continue-from {path} ran on {run.env.get('name')}, this GPU is {env.get('name')}: "
                "`report` merges the runs of one GPU only; continue it on that GPU, or run the whole "
                "sweep again here"
            )
    done = {row.key for _, run in earlier for row in run.rows}
    cells = sum(task.key(mode) not in done for mode in modes for task in tasks)
    if earlier and not cells:
        names = ", ".join(str(path) for path, _ in earlier)
        print(f"{PROG}: nothing to measure: {names} hold a row for every cell of this sweep", file=sys.stderr)
        return 0
    dtypes = list(dict.fromkeys(t.dtype for t in tasks))
    peaks = {
        d: (args.peak_tflops, "--peak-tflops")
        if args.peak_tflops
        else hardware.peak_tflops(env.get("name"), d)
        for d in dtypes
    }
    run_id = results.new_run_id()
    path = args.results or Path("out") / f"results-{run_id}.jsonl"
    header = results.make_header(run_id, env, _settings_record(settings, modes, tasks, args, peaks))
    try:
        writer = results.ResultsWriter(path, header)
    except OSError as exc:
        return _usage_error(f"--results {path}: {exc.strerror or exc}")
    interrupted = unwritten = False
    try:  # from here on, whatever happens, the last line names the results file
        with writer:
            try:
                with runner.RichProgress(cells) as progress:
                    dtype_peaks = {d: p for d, (p, _) in peaks.items()}
                    runner.run_sweep(modes, tasks, settings, writer, dtype_peaks, progress, skip=done)
            except KeyboardInterrupt:
                interrupted = True
        measured = _load(path)
        try:
            unwritten = not _emit(measured, args)
        except KeyboardInterrupt:
            interrupted = True
        if interrupted:
            print(f"{PROG}: interrupted; the report covers the rows measured so far", file=sys.stderr)
            return EXIT_INTERRUPTED
        return 1 if unwritten or any(r.status in BAD_STATUSES for r in measured.rows) else 0
    finally:
        print(f"{PROG}: results in {path}", file=sys.stderr)


def _settings_record(
    settings: Settings,
    modes: list[str],
    tasks: list[Task],
    args: argparse.Namespace,
    peaks: dict[str, tuple[float | None, str]],
) -> dict[str, object]:
    """The header's `settings`: how this run measured, in the words the report prints."""
    from gluon_survey.driver.check import TOLERANCE_RULE
    from gluon_survey.driver.timing import BURST, COPIES_BUDGET_BYTES, L2_FACTOR

    queued = f"; GPU time (queued): a sleep kernel keeps the host ahead, one per {BURST} iterations"
    dims = " ".join(f"--{dim} {getattr(args, dim) or default}" for dim, default in _DIMS)
    budget_gib = COPIES_BUDGET_BYTES >> 30
    return {
        **asdict(settings),
        "timer": TIMER + (queued if settings.queued else ""),
        "l2": f"cold, rotating input sets spanning >= {L2_FACTOR}x L2 (at most {budget_gib} GiB)",
        "tolerance": TOLERANCE_RULE,
        "modes": modes,
        "dtypes": list(peaks),
        "b_layouts": list(dict.fromkeys(t.b_layout for t in tasks)),
        "a_layouts": list(dict.fromkeys(t.a_layout for t in tasks)),
        "shapes": f"--shapes {args.shapes}" if args.shapes else dims,
        "peaks": {d: {"tflops": p, "source": src} for d, (p, src) in peaks.items()},
    }


def _load(path: Path) -> Results:
    """`results.load`, with what it skipped (a truncated last line) said on stderr."""
    from gluon_survey.driver import results

    loaded = results.load(path)
    for warning in loaded.warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    return loaded


def _emit(measured: Results, args: argparse.Namespace) -> bool:
    """Print or write the report, the plot when asked; for `legacy`, say on stderr what it omits.
    False, having said on stderr which file (the report or the plot) could not be written, when
    one could not."""
    from gluon_survey.driver import report

    try:
        report.render(measured, args.format, args.output)
    except OSError as exc:
        where = f" {args.output}" if args.output is not None else ""
        print(f"{PROG}: error: cannot write the report{where}: {exc.strerror or exc}", file=sys.stderr)
        return False
    if args.format == "legacy":
        for row in measured.rows:
            if not row.measured:
                print(
                    f"{PROG}: not in the legacy lines: {row.mode} {row.shape.label}: {row.outcome}",
                    file=sys.stderr,
                )
    if args.plot is None:
        return True
    try:
        panels = report.plot(measured, args.plot, by=args.plot_by)
    except OSError as exc:
        print(f"{PROG}: error: cannot write the plot {args.plot}: {exc.strerror or exc}", file=sys.stderr)
        return False
    if panels == 0:
        print(f"{PROG}: nothing measured, no plot written", file=sys.stderr)
    return True


def _pick(spec: str, allowed: Sequence[str], option: str) -> list[str]:
    """'fp16,BF16' -> ['fp16', 'bf16'], each checked against `allowed`."""
    picked = list(dict.fromkeys(p.strip().lower() for p in spec.split(",") if p.strip()))
    unknown = [p for p in picked if p not in allowed]
    if unknown or not picked:
        raise ValueError(f"{option}: expected a comma list of {', '.join(allowed)}, got {spec!r}")
    return picked


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _usage_error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


# ------------------------------------------------------------------------------------------------
# Subcommands


def list_modes(argv: Sequence[str]) -> int:
    """`gluon-survey list`: the modes in ladder order and whether this machine can run each."""
    argparse.ArgumentParser(prog=f"{PROG} list", description=list_modes.__doc__).parse_args(argv)
    from rich.table import Table
    from rich.text import Text

    from gluon_survey import api
    from gluon_survey.driver.report import console

    cap = api.capability()
    here = api.describe_torch_cuda() + (f", sm_{cap[0]}{cap[1]}" if cap else "")
    table = Table(
        title=f"gluon-survey modes; this machine: {here}",
        caption="dense GEMMs: --m/--n/--k, --shapes llm|llm-dense|holdout or a CSV of M,N,K rows; grouped "
        "GEMMs (a mixture-of-experts layer's experts): --shapes moe or a CSV of T,N,K,E,topk,routing rows",
    )
    for name in ("mode", "kind", "GEMM", "what it is", "architectures", "runs here"):
        table.add_column(name, no_wrap=name in ("mode", "kind", "GEMM"))
    for mode in registry.MODES:
        try:
            reason = mode.unsupported_reason(cap)
        except Exception as exc:  # a provider that cannot even be imported
            reason = f"cannot load {mode.module_for(cap)}: {type(exc).__name__}: {exc}"
        verdict = Text("yes", style="green") if reason is None else Text(f"no: {reason}", style="red")
        gemm = "grouped" if mode.grouped else "dense"
        table.add_row(mode.name, mode.kind, gemm, mode.summary, ", ".join(mode.archs), verdict)
    console().print(table)
    return 0


def compare_runs(argv: Sequence[str]) -> int:
    """`gluon-survey compare OLD NEW`: per result, new/old TFLOP/s and whether it is beyond noise."""
    parser = argparse.ArgumentParser(prog=f"{PROG} compare", description=compare_runs.__doc__)
    parser.add_argument("old", type=Path, help="results file (.jsonl) of the baseline run")
    parser.add_argument("new", type=Path, help="results file (.jsonl) of the run to judge")
    parser.add_argument(
        "--fail-on-regression",
        type=argtypes.non_negative,
        metavar="PCT",
        help="exit 1 when a result got more than PCT %% slower beyond the noise, stopped being measured, "
        "or is missing from NEW (PCT >= 0)",
    )
    args = parser.parse_args(argv)
    from rich.console import Console

    from gluon_survey.driver import report, results

    try:
        old, new = _load(args.old), _load(args.new)
    except (OSError, ValueError) as exc:
        return _usage_error(str(exc))
    deltas = results.compare(old.rows, new.rows)
    if not deltas:
        print(
            f"{PROG}: error: {args.old} and {args.new} share no result (no mode, shape, dtype and B layout "
            f"in both): OLD has {_holds(old.rows)}, NEW {_holds(new.rows)}; nothing to compare",
            file=sys.stderr,
        )
        return 1
    gone = results.missing(old.rows, new.rows)
    report.print_comparison(old, new, deltas, Console(), gone)  # its tables fit 80 columns, cells whole
    if args.fail_on_regression is None:
        return 0
    bad = results.regressions(deltas, args.fail_on_regression)
    for d in bad:
        change = f"{d.regression_pct():.1f} % slower" if d.verdict == "slower" else f"now {d.new.outcome}"
        print(f"{PROG}: regression: {_where(d.new)}: {change}", file=sys.stderr)
    for row in gone:
        print(f"{PROG}: regression: {_where(row)}: missing from NEW", file=sys.stderr)
    return 1 if bad or gone else 0


def _holds(rows: Sequence[Row]) -> str:
    """'72 rows: Blocked, torch; fp16 B row; M 8192': what a results file measured, in one line."""
    if not rows:
        return "no rows"
    modes = ", ".join(dict.fromkeys(r.mode for r in rows))
    kinds = ", ".join(dict.fromkeys(f"{r.dtype} {r.layouts}" for r in rows))
    ms = sorted({r.M for r in rows})
    m = f"M {ms[0]}" if len(ms) == 1 else f"M {ms[0]}..{ms[-1]}"
    if any(r.grouped for r in rows):
        m += ", grouped"
    return f"{len(rows)} rows ({modes}; {kinds}; {m})"


def _where(row: Row) -> str:
    return f"{row.mode} {row.shape.label} {row.dtype} {row.layouts_label}"


def report_run(argv: Sequence[str]) -> int:
    """`gluon-survey report RESULTS.jsonl [MORE.jsonl ...]`: render a finished (or interrupted) run
    again; several files of one GPU and one commit (a sweep split over calls) as one. Exit status
    0, or 1 when the files have no rows or the report cannot be written, 2 for a usage error (a bad
    path, a file that is not a results file, runs that cannot be merged)."""
    parser = argparse.ArgumentParser(prog=f"{PROG} report", description=report_run.__doc__)
    parser.add_argument(
        "results",
        type=Path,
        help="results file (.jsonl) written by a timing run, or the .json of `gluon-survey memcpy --results`",
    )
    parser.add_argument(
        "more",
        type=Path,
        nargs="*",
        help="more results files of the same GPU and commit, reported with the first as one run",
    )
    _add_output_options(parser)
    args = parser.parse_args(argv)
    bad_path = _output_path_error(args)
    if bad_path:
        return _usage_error(bad_path)
    from gluon_survey.driver.results import OneDocument, merge

    try:
        loaded = _load(args.results)
        if args.more:
            paths = [args.results, *args.more]
            loaded = merge([loaded, *(_load(p) for p in args.more)], [str(p) for p in paths])
    except OneDocument as exc:
        if exc.command == "memcpy" and not args.more:
            return _report_memcpy(exc.doc, args)
        return _usage_error(str(exc))
    except (OSError, ValueError) as exc:
        return _usage_error(str(exc))
    if not loaded.rows:
        print(f"{PROG}: {args.results} has no rows: its run measured nothing to report", file=sys.stderr)
        return 1
    return 0 if _emit(loaded, args) else 1


def _report_memcpy(doc: dict, args: argparse.Namespace) -> int:
    """`report` of a `gluon-survey memcpy --results` file: its own report, as memcpy prints it."""
    from gluon_survey.driver import memcpy

    if args.plot is not None or args.format not in memcpy.FORMATS:
        return _usage_error(
            f"{args.results} is a `gluon-survey memcpy` result: report renders it with --format "
            f"{', '.join(memcpy.FORMATS)}, without --plot"
        )
    try:
        memcpy.render(doc, args.format, args.output)
    except OSError as exc:
        print(f"{PROG}: error: cannot write the report {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _delegate(module: str) -> Callable[[Sequence[str]], int]:
    """A subcommand whose whole CLI is `gluon_survey.driver.<module>.main` (imported when used)."""

    def command(argv: Sequence[str]) -> int:
        return importlib.import_module(f"gluon_survey.driver.{module}").main(argv)

    command.__doc__ = f"`gluon-survey {module} ...`: see `gluon_survey.driver.{module}`."
    return command


_SUBCOMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "list": list_modes,
    "compare": compare_runs,
    "report": report_run,
    "inspect": _delegate("inspect"),
    "memcpy": _delegate("memcpy"),
    "overhead": _delegate("overhead"),
    "tune": _delegate("tune"),
    "model": _delegate("model"),
}
