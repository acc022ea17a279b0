"""`gluon-survey memcpy`: the memory roofline, measured. The copy ladder of `kernels/memcpy.py`
(one element per thread, a 16-byte vector per thread, the best of a small search) and
`Tensor.copy_` copy one buffer, and each is reported in GB/s = (bytes read + bytes written) /
median time, as a fraction of `Tensor.copy_` and of the GPU's datasheet bandwidth.

    gluon-survey memcpy                               # 1 GiB of fp16 per copy, every variant
    gluon-survey memcpy --mib 64 --dtype bf16 --format markdown --results results/memcpy.json

How: the survey's timer (`timing.time_fn`: CUDA events around each call, warm-up to the steady
clock, median over at least --min-ms) on rotating source/destination pairs, as many as make the
rotation span 3x L2 (`timing.copies_for_cold_l2`), so every copy reads from HBM. Before a variant
is timed, each destination is filled with NaN and its copy must equal the source exactly
(`torch.equal`); a variant that does not is reported FAILED and not timed; the last copies are
checked again after timing. Step 3 measures every config of its search (a second table) and
reports the best. Everything runs in this process, one variant after another.

`--results FILE.json` writes {env, settings, rows}; `floor_gbps(FILE or rows)` is the best GB/s
of any variant (Tensor.copy_ included): the bandwidth floor the survey holds memory-bound GEMMs
to. Exit status: 0, 1 when a variant FAILED or a file cannot be written, 2 for a usage error or
a machine without a CUDA GPU, 130 when interrupted (what was measured is still reported).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gluon_survey.driver import args as argtypes
from gluon_survey.driver.settings import DEFAULTS, Settings

PROG = "gluon-survey memcpy"
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
ELEMENT_SIZES = {"fp16": 2, "bf16": 2}
FORMATS = ("table", "markdown", "json")
REFERENCE = "Tensor.copy_"
TIMER = "CUDA events around each call"
GBPS = "(bytes read + bytes written) / median time, 1 GB = 1e9 bytes"
CHECK = "torch.equal to the source, the destination filled with NaN first; again after timing"
MiB = 1 << 20
EXIT_INTERRUPTED = 130


@dataclass
class CopyRow:
    """One measured copy: a variant's config, or the reference. `best` marks the row that stands
    for its variant in the main table (step 3: its fastest config; the others have one row)."""

    variant: str  # "scalar", "vector", "search" or REFERENCE
    step: int  # 1..3; 0 for the reference
    config: str  # CopyConfig.label, "" for the reference
    params: dict[str, Any] = field(default_factory=dict)  # CopyConfig.as_dict() and the grid
    status: str = "OK"  # OK or FAILED
    best: bool = False
    gbps: float | None = None
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    min_ms: float | None = None
    iters: int | None = None
    spread: float | None = None  # (p80 - p20) / median
    x_copy: float | None = None  # gbps / Tensor.copy_'s gbps
    of_datasheet: float | None = None  # gbps / the datasheet bandwidth
    error: str | None = None


# ------------------------------------------------------------------------------------------------
# Results


def floor_gbps(source: str | Path | Sequence[CopyRow | dict[str, Any]]) -> float:
    """The best GB/s of any measured row (Tensor.copy_ included) of a results file written by
    `--results`, or of its rows: the bandwidth floor memory-bound GEMMs are held to. ValueError
    when nothing was measured."""
    rows = load(source)["rows"] if isinstance(source, (str, Path)) else source
    measured = [
        r["gbps"]
        for r in (asdict(r) if isinstance(r, CopyRow) else r for r in rows)
        if r.get("status") == "OK" and r.get("gbps") is not None
    ]
    if not measured:
        raise ValueError(f"no measured copy in {source if isinstance(source, (str, Path)) else 'the rows'}")
    return max(measured)


def load(path: str | Path) -> dict[str, Any]:
    """A results document written by `--results`: {env, settings, rows}."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError(f"{path}: not a `{PROG} --results` file (no rows)")
    return doc


def mark_best(rows: list[CopyRow]) -> None:
    """Set `best` on each variant's fastest OK row."""
    for row in rows:
        row.best = False
    for variant in dict.fromkeys(r.variant for r in rows):
        ok = [r for r in rows if r.variant == variant and r.status == "OK" and r.gbps is not None]
        if ok:
            max(ok, key=lambda r: r.gbps).best = True


def attach_fractions(rows: list[CopyRow], datasheet_gbps: float | None) -> None:
    """Fill `x_copy` (against the reference row) and `of_datasheet` of every measured row."""
    reference = next((r.gbps for r in rows if r.variant == REFERENCE and r.gbps), None)
    for row in rows:
        if row.gbps is None:
            continue
        row.x_copy = row.gbps / reference if reference else None
        row.of_datasheet = row.gbps / datasheet_gbps if datasheet_gbps else None


# ------------------------------------------------------------------------------------------------
# Measurement (needs a CUDA GPU)


@dataclass
class Buffers:
    """The rotating (source, destination) pairs every variant copies: source i is random normal
    from seed + i, so a copy that reads the wrong pair, or none, fails the check."""

    sources: list[Any]
    destinations: list[Any]

    @classmethod
    def make(cls, numel: int, dtype: Any, copies: int, seed: int) -> Buffers:
        import torch

        sources, destinations = [], []
        for i in range(copies):
            gen = torch.Generator(device="cuda").manual_seed(seed + i)
            sources.append(torch.randn(numel, generator=gen, device="cuda", dtype=dtype))
            destinations.append(torch.empty_like(sources[-1]))
        return cls(sources, destinations)

    def mismatch(self, i: int) -> str | None:
        """Why destination i is not exactly source i (None when it is)."""
        import torch

        src, dst = self.sources[i], self.destinations[i]
        if torch.equal(src, dst):
            return None
        differs = src != dst  # NaN, the poison, differs from everything
        first = int(differs.nonzero()[0, 0])
        return f"copy {i} differs from its source at {int(differs.sum())} elements, the first at {first}"


def check(runs: list[Callable[[], object]], buffers: Buffers) -> str | None:
    """Poison every destination with NaN, copy, compare: None when every copy is exact."""
    import torch

    for i, run in enumerate(runs):
        buffers.destinations[i].fill_(math.nan)
        run()
        torch.cuda.synchronize()
        if problem := buffers.mismatch(i):
            return problem
    return None


def measure_one(
    row: CopyRow, runs: list[Callable[[], object]], buffers: Buffers, settings: Settings
) -> CopyRow:
    """Check `runs` (one per buffer pair), then time them in rotation; the row, measured or FAILED."""
    from gluon_survey.driver.timing import time_fn

    try:
        problem = check(runs, buffers)
        if problem is None:
            t = time_fn(
                lambda i: runs[i],
                len(runs),
                warmup_ms=settings.warmup_ms,
                min_ms=settings.min_ms,
                min_iters=settings.min_iters,
                max_iters=settings.max_iters,
            )
            problem = next((p for i in range(len(runs)) if (p := buffers.mismatch(i))), None)
            problem = f"after timing: {problem}" if problem else None
    except Exception as exc:  # a kernel that does not compile or launch is a result, not a crash
        problem = f"{type(exc).__name__}: {str(exc).strip()}"
    if problem is not None:
        row.status, row.error = "FAILED", problem
        return row
    moved = 2 * buffers.sources[0].numel() * buffers.sources[0].element_size()
    row.gbps = moved / (t.median_ms * 1e-3) / 1e9
    row.median_ms, row.p20_ms, row.p80_ms, row.min_ms = t.median_ms, t.p20_ms, t.p80_ms, t.min_ms
    row.iters, row.spread = t.n, t.spread
    return row


@dataclass
class Setup:
    """Where the copies run: the buffer pairs and the GPU's facts the launches need."""

    buffers: Buffers
    target: Any  # launch.Target
    elements: int
    copies: int


def setup(dtype: str, mib: int, seed: int) -> Setup:
    """Allocate the rotating pairs on the current CUDA device: `mib` MiB of `dtype` each, as many
    pairs as make the rotation span 3x L2."""
    import torch

    from gluon_survey.driver.timing import copies_for_cold_l2
    from gluon_survey.launch import Target

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    elements = mib * MiB // ELEMENT_SIZES[dtype]
    copies = copies_for_cold_l2(2 * mib * MiB, props.L2_cache_size)
    buffers = Buffers.make(elements, getattr(torch, DTYPES[dtype]), copies, seed)
    return Setup(buffers, Target((props.major, props.minor), props.multi_processor_count), elements, copies)


def plan(where: Setup) -> list[tuple[CopyRow, list[Callable[[], object]]]]:
    """What to measure, in order: the reference, then every config of every step of the ladder;
    each with one launch per buffer pair."""
    from gluon_survey.kernels import memcpy

    pairs = list(zip(where.buffers.sources, where.buffers.destinations, strict=True))
    todo = [(CopyRow(REFERENCE, 0, ""), [(lambda s=s, d=d: d.copy_(s)) for s, d in pairs])]
    size = where.buffers.sources[0].element_size()
    for variant in memcpy.VARIANTS:
        for cfg in variant.configs(size):
            launches = [memcpy.prepare(s, d, cfg, where.target) for s, d in pairs]
            params = {k: v for k, v in launches[0].config.items() if k != "label"}
            row = CopyRow(variant.name, variant.step, cfg.label(size), params)
            todo.append((row, [launch.fn for launch in launches]))
    return todo


def measure(where: Setup, settings: Settings, log: Callable[[str], None]) -> Iterator[CopyRow]:
    """Each row of `plan`, checked and timed, as it is measured."""
    todo = plan(where)
    for n, (row, runs) in enumerate(todo, 1):
        log(f"[{n}/{len(todo)}] {row.step or '-'} {row.variant} {row.config}".rstrip())
        yield measure_one(row, runs, where.buffers, settings)


# ------------------------------------------------------------------------------------------------
# Rendering (works on any rows: fabricated, loaded or just measured)


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _spread(row: dict[str, Any]) -> str:
    from gluon_survey.driver.timing import NOISY_SPREAD

    if row.get("spread") is None:
        return "-"
    return f"{row['spread']:.1%}" + (" ~" if row["spread"] > NOISY_SPREAD else "")


def _cells(row: dict[str, Any]) -> list[str]:
    """GB/s, x copy_, of datasheet, spread; FAILED rows say so in the first cell."""
    if row.get("status") != "OK":
        return [str(row.get("status")), "-", "-", "-"]
    return [
        _number(row.get("gbps"), ",.0f"),
        _number(row.get("x_copy"), ".2f") + ("x" if row.get("x_copy") is not None else ""),
        _number(row.get("of_datasheet"), ".0%"),
        _spread(row),
    ]


def ladder_rows(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    """The main table: one line per step (step 3 its best config) and the reference, with the
    cells of `_cells`. A step none of whose configs ran shows its first row's status."""
    lines = []
    for step in (1, 2, 3, 0):
        mine = [r for r in rows if r.get("step") == step]
        if not mine:
            continue
        shown = next((r for r in mine if r.get("best")), mine[0])
        config = shown.get("config") or "-"
        if step == 3 and len(mine) > 1:
            config += f" (best of {len(mine)})"
        lines.append([str(step or "-"), str(shown.get("variant")), config, *_cells(shown)])
    return lines


def search_rows(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Step 3's search: one line per config, the best marked with '*'."""
    return [
        [("* " if r.get("best") else "") + str(r.get("config")), *_cells(r)]
        for r in rows
        if r.get("step") == 3
    ]


def failures(rows: Sequence[dict[str, Any]]) -> list[str]:
    return [
        f"FAILED {r.get('variant')} {r.get('config')}: {r.get('error')}"
        for r in rows
        if r.get("status") != "OK"
    ]


def header_lines(doc: dict[str, Any]) -> list[str]:
    """What ran where and how, one fact per line."""
    env, s = doc.get("env", {}), doc.get("settings", {})
    gpu = env.get("name") or "no GPU"
    if "sm_count" in env:
        gpu += f" ({env['sm_count']} SMs, L2 {env['l2_bytes'] // MiB} MiB)"
    lines = [
        f"GPU: {gpu}",
        f"Software: torch {env.get('torch')}, triton {env.get('triton')}, CUDA {env.get('cuda')}",
    ]
    if env.get("command"):
        lines.append(f"Command: {env['command']}")
    if s:
        lines.append(
            f"Copy: {s.get('dtype')}, {s.get('mib')} MiB per copy ({s.get('elements')} elements); "
            f"GB/s = {GBPS}"
        )
        lines.append(
            f"Timing: {s.get('timer')}; median over >= {s.get('min_ms')} ms after {s.get('warmup_ms')} ms "
            f"of warm-up; L2: {s.get('l2')}"
        )
        lines.append(f"Check: {s.get('check')}")
        sheet = s.get("datasheet", {})
        if sheet.get("gbps"):
            lines.append(f"Datasheet: {sheet['gbps']:,.0f} GB/s ({sheet.get('source')})")
        else:
            lines.append(f"Datasheet: {sheet.get('source', 'unknown')}; the 'of datasheet' column is empty")
    return lines


LADDER_HEADERS = ("step", "variant", "config", "GB/s", "x copy_", "of datasheet", "spread")
SEARCH_HEADERS = ("config (step 3)", "GB/s", "x copy_", "of datasheet", "spread")
LEGEND = "spread = (p80 - p20) / median, ~ above 5 %; * = the best config of the search"


def format_markdown(doc: dict[str, Any]) -> str:
    """The header as a list, the ladder table, the search table, the failures."""
    rows = doc["rows"]

    def table(headers: Sequence[str], lines: list[list[str]], left: int) -> list[str]:
        align = ["---"] * left + ["---:"] * (len(headers) - left)
        out = [f"| {' | '.join(headers)} |", f"|{'|'.join(align)}|"]
        return out + [f"| {' | '.join(c.replace('|', '/') for c in line)} |" for line in lines]

    out = [f"- {line}" for line in header_lines(doc)] + [""]
    out += table(LADDER_HEADERS, ladder_rows(rows), 3) + [""]
    if search_rows(rows):
        out += table(SEARCH_HEADERS, search_rows(rows), 1) + [""]
    out += [LEGEND] + [f"- {line}" for line in failures(rows)]
    return "\n".join(out) + "\n"


def print_table(doc: dict[str, Any], console: Any) -> None:
    """The same as `format_markdown`, as rich tables."""
    from rich.markup import escape
    from rich.table import Table

    rows = doc["rows"]
    s = doc.get("settings", {})
    for line in header_lines(doc):
        console.print(escape(line), style="dim")
    title = f"memory roofline: {s.get('dtype', '?')}, {s.get('mib', '?')} MiB per copy"
    for headers, lines, left in (
        (LADDER_HEADERS, ladder_rows(rows), 3),
        (SEARCH_HEADERS, search_rows(rows), 1),
    ):
        if not lines:
            continue
        table = Table(title=title)
        for i, header in enumerate(headers):
            table.add_column(header, justify="left" if i < left else "right", no_wrap=True)
        for line in lines:
            table.add_row(*(escape(c) for c in line))
        console.print(table)
        title = None
    console.print(LEGEND, style="dim")
    for line in failures(rows):
        console.print(escape(line), style="red")


def format_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"


def render(doc: dict[str, Any], fmt: str, output: Path | None = None) -> None:
    """Write the report in `fmt` to `output`, or to stdout. OSError when the file cannot be written."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt == "table":
        from rich.console import Console

        if output is not None:
            with output.open("w") as f:
                print_table(doc, Console(file=f, width=200, color_system=None))
            return
        console = Console()
        print_table(doc, console if console.is_terminal else Console(width=200))
        return
    text = format_markdown(doc) if fmt == "markdown" else format_json(doc)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)


# ------------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The memory roofline: time a Gluon copy ladder (one element per thread, a 16-byte "
        "vector per thread, the best of a small config search) and Tensor.copy_ on this GPU, each "
        "checked exact first, in GB/s = (bytes read + bytes written) / median time, against "
        "Tensor.copy_ and the datasheet bandwidth.",
        epilog="\n\n".join(__doc__.split("\n\n")[i] for i in (1, 3)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--mib",
        type=argtypes.positive_int,
        default=1024,
        help="MiB copied per call: the source buffer, read once and written once (default: %(default)s)",
    )
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp16", help="element type (default: fp16)")
    parser.add_argument(
        "--warmup-ms",
        type=argtypes.non_negative,
        default=DEFAULTS.warmup_ms,
        help="warm-up before each variant, to the GPU's steady clock (default: %(default)g)",
    )
    parser.add_argument(
        "--min-ms",
        type=argtypes.positive,
        default=DEFAULTS.min_ms,
        help="timed GPU time per variant (default: %(default)g)",
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULTS.seed, help="source data seed (default: %(default)s)"
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="report format (default: table)")
    parser.add_argument(
        "--output", type=Path, metavar="FILE", help="write the report to FILE instead of stdout"
    )
    parser.add_argument(
        "--results",
        type=Path,
        metavar="FILE.json",
        help="also write {env, settings, rows} to FILE (a new file)",
    )
    return parser


def usage_problem(args: argparse.Namespace) -> str | None:
    """Why the options cannot run (None when they can), found before anything touches the GPU."""
    from gluon_survey.kernels.memcpy import MAX_ELEMENTS

    if args.mib * MiB // ELEMENT_SIZES[args.dtype] > MAX_ELEMENTS:
        return f"--mib {args.mib}: more than the kernels' {MAX_ELEMENTS} elements of {args.dtype}"
    for option, path in (("--output", args.output), ("--results", args.results)):
        if path is None:
            continue
        if path.is_dir():
            return f"{option} {path}: is a directory"
        if not path.parent.is_dir():
            return f"{option} {path}: directory {path.parent} does not exist"
    if args.results is not None and args.results.exists():
        return f"--results {args.results} exists; a results file holds one run"
    return None


def settings_record(args: argparse.Namespace, settings: Settings, facts: dict[str, Any], env: dict) -> dict:
    """The results document's `settings`: how this run measured, in the words the report prints."""
    from gluon_survey.driver.hardware import memory_bandwidth_gbps
    from gluon_survey.driver.timing import COPIES_BUDGET_BYTES, L2_FACTOR
    from gluon_survey.kernels.memcpy import SEARCH

    gbps, source = memory_bandwidth_gbps(env.get("name"))
    return {
        "dtype": args.dtype,
        "mib": args.mib,
        **facts,
        "bytes_per_call": 2 * args.mib * MiB,
        "seed": settings.seed,
        "warmup_ms": settings.warmup_ms,
        "min_ms": settings.min_ms,
        "min_iters": settings.min_iters,
        "max_iters": settings.max_iters,
        "timer": TIMER,
        "l2": f"cold, rotating copies spanning >= {L2_FACTOR}x L2 (at most {COPIES_BUDGET_BYTES >> 30} GiB)",
        "gbps": GBPS,
        "check": CHECK,
        "datasheet": {"gbps": gbps, "source": source},
        "search": {k: list(v) for k, v in SEARCH.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `gluon-survey memcpy` (see the module docstring for the exit status)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if problem := usage_problem(args):
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    import torch
    from rich.console import Console

    from gluon_survey.driver import hardware

    if not torch.cuda.is_available():
        print(
            f"{PROG}: needs a CUDA GPU that torch can use (torch.cuda.is_available()); found "
            f"{hardware.describe_torch_cuda()}. `gluon-survey inspect` compiles kernels without one.",
            file=sys.stderr,
        )
        return 2
    settings = Settings(seed=args.seed, warmup_ms=args.warmup_ms, min_ms=args.min_ms)
    env = hardware.gpu_info(shlex.join(["gluon-survey", "memcpy", *argv]))
    rows: list[CopyRow] = []
    where: Setup | None = None
    interrupted = False
    try:
        # Which variant runs now, on a terminal only (a transient status line, gone when done): a
        # report saved from a redirected stdout and stderr holds no progress lines.
        with Console(stderr=True).status(f"{PROG}: setting up") as status:
            where = setup(args.dtype, args.mib, args.seed)
            for row in measure(where, settings, lambda line: status.update(f"{PROG}: {line}")):
                rows.append(row)
    except KeyboardInterrupt:
        interrupted = True
    mark_best(rows)
    facts = {"elements": where.elements, "copies": where.copies} if where else {}
    record = settings_record(args, settings, facts, env)
    attach_fractions(rows, record["datasheet"]["gbps"])
    doc = {"env": env, "settings": record, "rows": [asdict(r) for r in rows]}
    try:
        render(doc, args.format, args.output)
        if args.results is not None:
            args.results.write_text(format_json(doc))
            print(f"{PROG}: results in {args.results}", file=sys.stderr)
    except OSError as exc:
        print(f"{PROG}: error: cannot write: {exc}", file=sys.stderr)
        return 1
    if interrupted:
        print(f"{PROG}: interrupted; the report covers what was measured", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 1 if any(r.status != "OK" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
