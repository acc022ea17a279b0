"""Turning results into tables, files and plots.

Formats: `table` (rich tables, one per dtype and layouts (B's, and A's where it is not row-major,
`Row.layouts`): shapes as rows, modes as columns, each
cell TFLOP/s, x cuBLAS and the chosen BLOCK_MxNxK, a geometric-mean row), `legacy` (exactly the
lines of the original survey script), `csv` (one row per result, `#` environment comments on top),
`json` and `markdown`. Every format but `legacy` starts with the environment.

GB/s (bytes of A, B and C / the median time, `results.bytes_moved`) is in every row of csv and
json; the tables show it in the cells of a run timed in GPU time (`--gpu-time`, settings `queued`),
and then say so in their titles and legend: timed per call, a kernel shorter than its launch would
show the host's launch rate instead.

A row counts as a measurement only when it is correct, timed and not above the dense peak (a
TFLOP/s figure above the datasheet peak is a measurement error, shown as such, never as a record);
geometric means and x cuBLAS use measurements only. x cuBLAS is the median of the row's paired
rounds (`x_rounds`: cuBLAS timed on the same inputs in windows alternating with the row's, or
for short calls in the same windows, the calls taken in turn: `interleaved`), or,
for a run without pairing (`--no-paired`), the ratio to the `torch` row of the same shape, dtype
and layouts.

Grouped rows (mixture-of-experts expert GEMMs, `--shapes moe`) render the same way: their shape
label names N x K, the experts E, top-k, the tokens T and the routing; their x cuBLAS column is
against torch._grouped_mm (the `grouped_mm` mode, `registry.GROUPED_BASELINE`), in fp8-row against
torch._scaled_grouped_mm (`scaled_grouped_mm`, `registry.GROUPED_FP8_BASELINE`), and the legend
says so; summaries and plots go by tokens T instead of M.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from gluon_survey.driver.results import NOISY, Delta, Results, Row
from gluon_survey.driver.shapes import GroupedShape, Shape
from gluon_survey.driver.timing import round_ratio
from gluon_survey.registry import BASELINE, GROUPED_BASELINE, GROUPED_FP8_BASELINE, baseline_of

FORMATS = ("table", "legacy", "csv", "json", "markdown")
PLOT_SUFFIXES = (".png", ".svg", ".pdf")  # the plot formats `--plot` accepts (all matplotlib's)
LEGACY_HEADER = "K, BLOCK_M, BLOCK_N, BLOCK_K, ms, TFLOPs/sec"
REASON_CHARS = 28  # how much of a failure reason fits in a table cell; the notes below give it all
# The width of a report written anywhere but a terminal (a pipe, a file): wide enough that rich
# never cuts, wraps or ellipsizes a table cell to fit, however many modes are columns.
FILE_WIDTH = 1000


def console(file: Any = None) -> Any:
    """The rich Console a report prints to: stdout at the terminal's width in a terminal;
    otherwise (`report X > table.txt`, or `file`) FILE_WIDTH wide and without colour codes, so
    that every cell stays whole."""
    from rich.console import Console

    if file is None:
        here = Console()
        if here.is_terminal:
            return here
    return Console(file=file, width=FILE_WIDTH, color_system=None)


def attach_x_cublas(rows: Iterable[Row]) -> list[Row]:
    """The rows with `x_cublas`, the speed relative to cuBLAS: the median of the row's per-round
    ratios (`x_rounds`: cuBLAS's windows either side / the row's window, timed on the same inputs
    in alternating windows, or cuBLAS's calls / the row's in one window where `interleaved`) when
    it has them; else against the cuBLAS (`torch`) row of the same shape, dtype and layout, where
    both are measurements. A grouped row's reference is torch._grouped_mm, in fp8
    torch._scaled_grouped_mm (its paired rounds, or the `grouped_mm` or `scaled_grouped_mm` row of
    the same shape)."""
    rows = list(rows)
    base = {r.problem: r.tflops for r in rows if is_baseline(r) and r.measured}

    def ratio(r: Row) -> float | None:
        if not r.measured:
            return None
        if r.x_rounds:
            return round_ratio(r.x_rounds)
        return r.tflops / base[r.problem] if r.problem in base else None  # type: ignore[operator]

    return [replace(r, x_cublas=ratio(r)) for r in rows]


def baseline_mode(r: Row) -> str:
    """The mode whose row is `r`'s reference (`registry.baseline_of`): by its kind and dtype."""
    return baseline_of(r.grouped, r.dtype.startswith("fp8"))


def is_baseline(r: Row) -> bool:
    """Whether `r` is its own reference's row (cuBLAS's, torch._grouped_mm's, ...)."""
    return r.mode == baseline_mode(r)


# The reference each baseline mode stands for, as the legends and plots name it.
REFERENCE_NAMES = {
    BASELINE: "cuBLAS",
    GROUPED_BASELINE: "torch._grouped_mm",
    GROUPED_FP8_BASELINE: "torch._scaled_grouped_mm",
}


def geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def peaks(results: Results) -> dict[str, float | None]:
    """dtype -> the peak TFLOP/s the run used."""
    return {dtype: p.get("tflops") for dtype, p in results.settings.get("peaks", {}).items()}


# ------------------------------------------------------------------------------------------------
# Environment lines (the head of every format)


def _mib(n: object) -> str:
    return f"{n / 2**20:.0f} MiB" if isinstance(n, (int, float)) else "?"


_NVML_FIELDS = (
    ("SM clock", "sm_clock_mhz", "MHz"),
    ("max SM clock", "sm_clock_max_mhz", "MHz"),
    ("memory clock", "mem_clock_mhz", "MHz"),
    ("power", "power_w", "W"),
    ("power limit", "power_limit_w", "W"),
    ("temperature", "temperature_c", "C"),
)


def env_lines(results: Results) -> list[str]:
    """What ran where and how: GPU, clocks, software, checkout, command, timing, check, peaks."""
    return _machine_lines(results.env) + _run_lines(results) + _settings_lines(results.settings)


def _machine_lines(env: dict[str, Any]) -> list[str]:
    if not env.get("name"):
        return ["GPU: none (CUDA not available)"]
    major, minor = env.get("capability") or ("?", "?")
    lines = [
        f"GPU: {env['name']} (sm_{major}{minor}, {env.get('sm_count')} SMs, "
        f"L2 {_mib(env.get('l2_bytes'))}, {_mib(env.get('memory_bytes'))})"
    ]
    state = [f"{label} {env[key]:g} {unit}" for label, key, unit in _NVML_FIELDS if _is_number(env.get(key))]
    if env.get("pstate"):
        state.append(str(env["pstate"]))
    if state:
        lines.append("At start: " + ", ".join(state))
    return lines


def _run_lines(results: Results) -> list[str]:
    env = results.env
    git = env.get("git") or {}
    commit = git.get("commit", "unknown")[:12] + (" (dirty)" if git.get("dirty") else "")
    return [
        f"Software: driver {env.get('driver', '?')}, CUDA {env.get('cuda')}, torch {env.get('torch')}, "
        f"triton {env.get('triton')}, Python {env.get('python')}",
        f"Run: {results.header.get('run_id')} on {env.get('date')}, host {env.get('host')}, commit {commit}",
        f"Command: {env.get('command')}",
    ]


def _settings_lines(s: dict[str, Any]) -> list[str]:
    if not s:
        return []
    lines = [
        f"Timing: {s.get('timer')}; median over >= {s.get('min_ms')} ms and {s.get('min_iters')} to "
        f"{s.get('max_iters')} iterations after {s.get('warmup_ms')} ms of warm-up; L2: {s.get('l2')}; "
        f"seed {s.get('seed')}",
        f"Check: {s.get('tolerance')}, against the fp32 product of the same inputs",
    ]
    if s.get("paired") and s.get("rounds"):
        more = s.get("noisy_rounds", 0) > s["rounds"]
        if s.get("interleave"):
            line = (
                f"Paired, interleaved: each cell in {s['rounds']} windows of that length, its calls taken in "
                "turn with cuBLAS's on the same inputs"
            )
            line += f", up to {s['noisy_rounds']} windows" if more else ""
        elif "interleave" in s and s["interleave"] is None:  # by call length (an older header lacks it)
            below = s.get("interleave_below_ms", 0) * 1e3
            line = (
                f"Paired: each cell in {s['rounds']} rounds on cuBLAS's inputs: where both calls take under "
                f"{below:.0f} µs, a window of that length of its calls and cuBLAS's in turn, otherwise "
                f"a window alternating with {s['rounds'] + 1} of cuBLAS's"
            )
            line += f", up to {s['noisy_rounds']} rounds" if more else ""
        else:
            line = (
                f"Paired: each cell in {s['rounds']} windows of that length, alternating with "
                f"{s['rounds'] + 1} of cuBLAS's on the same inputs"
            )
            line += f", up to {s['noisy_rounds']} of each" if more else ""
        lines.insert(1, line + (" while either side's samples spread over 5 %" if more else ""))
    if s.get("bias"):
        lines.append(
            "Bias: every product adds a bias [N], each mode in its epilogue, cuBLAS through "
            "torch.addmm (fp8: torch._scaled_mm(bias=))"
        )
    for dtype, peak in s.get("peaks", {}).items():
        value = f"{peak['tflops']:g} TFLOP/s" if peak.get("tflops") else "unknown"
        lines.append(f"Peak {dtype}: {value} ({peak.get('source')})")
    return lines


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ------------------------------------------------------------------------------------------------
# The pivot: shapes x modes per (dtype, layout), shared by the rich table and markdown


@dataclass
class Cell:
    lines: list[str]
    style: str = ""  # rich style
    best: bool = False


QUEUED = "GPU time (queued)"  # how the titles name the clock of a run timed with --gpu-time


@dataclass
class Pivot:
    dtype: str
    b_layout: str
    modes: list[str]
    shapes: list[Shape]
    cells: dict[tuple[Shape, str], Cell]
    geomean: dict[str, Cell]
    notes: list[str] = field(default_factory=list)
    queued: bool = False  # timed in GPU time (settings `queued`): the cells show GB/s
    a_layout: str = "row"

    @property
    def title(self) -> str:
        layouts = f"B {self.b_layout}" if self.a_layout == "row" else f"A {self.a_layout}, B {self.b_layout}"
        return f"{self.dtype}, {layouts}" + (f", {QUEUED}" if self.queued else "")

    @property
    def shape_header(self) -> str:
        """The heading of the shape column: what its labels say."""
        return shape_header(self.shapes)

    def cells_of(self, shape: Shape) -> list[Cell]:
        """The row of `shape`, one cell per mode ("-" where a mode has no row for it)."""
        return [self.cells.get((shape, m), Cell(["-"])) for m in self.modes]


GROUPED_HEADER = "N x K, experts E, top-k, tokens T, routing"


def shape_header(shapes: Iterable[Shape | GroupedShape]) -> str:
    """The heading of a column of shape labels: M x N x K, or a grouped shape's fields."""
    shapes = list(shapes)
    grouped = [isinstance(s, GroupedShape) for s in shapes]
    if all(grouped) and shapes:
        return GROUPED_HEADER
    return f"M x N x K / {GROUPED_HEADER}" if any(grouped) else "M x N x K"


def _headline(error: str) -> str:
    return error.splitlines()[0] if error else ""


def _cell(row: Row, queued: bool = False) -> Cell:
    if row.measured:
        lines = [f"{row.tflops:.1f}" + (" ~" if NOISY in row.flags else "")]
        if row.x_cublas is not None:
            lines.append(f"{row.x_cublas:.2f}x")
        if queued and row.gbps is not None:
            lines.append(f"{row.gbps:.0f} GB/s")
        if all(k in row.config for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")):
            lines.append(f"{row.config['BLOCK_M']}x{row.config['BLOCK_N']}x{row.config['BLOCK_K']}")
        return Cell(lines)
    if row.status == "OK":  # timed, but above the peak
        return Cell([row.outcome, f"{row.tflops:.0f}?"], style="bold red")
    reason = _headline(row.error)
    short = reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 1] + "…"
    return Cell([row.status, short], style="yellow" if row.status == "SKIPPED" else "red")


def _geomean_cell(rows: Sequence[Row], peak: float | None) -> Cell:
    measured = [r for r in rows if r.measured]
    gm = geomean(r.tflops for r in measured)  # type: ignore[misc]
    if gm is None:
        return Cell(["-"])
    lines = [f"{gm:.1f}"]
    gx = geomean(r.x_cublas for r in measured if r.x_cublas is not None)
    if gx is not None:
        lines.append(f"{gx:.2f}x")
    if peak:
        lines.append(f"{100 * gm / peak:.0f}% peak")
    if len(measured) < len(rows):
        lines.append(f"({len(measured)}/{len(rows)} shapes)")
    return Cell(lines, style="bold")


def _notes(rows: Iterable[Row]) -> list[str]:
    """One line per distinct (mode, outcome, reason) of the rows that are not measurements."""
    shapes_by: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        if not r.measured:
            reason = (
                "TFLOP/s above the dense peak: measurement error" if r.status == "OK" else _headline(r.error)
            )
            shapes_by.setdefault((r.mode, r.outcome, reason), []).append(r.shape.label)
    notes = [
        f"{mode} {outcome} on {labels[0] if len(labels) == 1 else f'{len(labels)} shapes'}: {reason}"
        for (mode, outcome, reason), labels in shapes_by.items()
    ]
    for r in rows:  # queued timing: calls whose times may include the GPU waiting for the host
        counts = [f"{r.starved} of its {r.n_iters} timed calls"] if r.starved else []
        counts += [f"{r.cublas_starved} of cuBLAS's alongside"] if r.cublas_starved else []
        if r.measured and counts:
            behind = " and ".join(counts)
            notes.append(
                f"{r.mode} on {r.shape.label}: the host fell behind the GPU in {behind} "
                "(their times may include the GPU waiting for it)"
            )
    return notes


def pivots(results: Results) -> list[Pivot]:
    """One pivot per (dtype, A layout, B layout), modes and shapes in the order the sweep ran them."""
    rows = attach_x_cublas(results.rows)
    peak_of = peaks(results)
    queued = _queued(results)
    out = []
    for dtype, a_layout, layout in dict.fromkeys((r.dtype, r.a_layout, r.b_layout) for r in rows):
        group = [r for r in rows if (r.dtype, r.a_layout, r.b_layout) == (dtype, a_layout, layout)]
        modes = list(dict.fromkeys(r.mode for r in group))
        cells = {(r.shape, r.mode): _cell(r, queued) for r in group}
        shapes = list(dict.fromkeys(r.shape for r in group))
        for shape in shapes:
            best = max(
                (r for r in group if r.shape == shape and r.measured), key=lambda r: r.tflops, default=None
            )
            if best is not None:
                cells[(shape, best.mode)].best = True
        gms = {m: _geomean_cell([r for r in group if r.mode == m], peak_of.get(dtype)) for m in modes}
        out.append(Pivot(dtype, layout, modes, shapes, cells, gms, _notes(group), queued, a_layout))
    return out


def legend(rows: Iterable[Row], queued: bool = False) -> str:
    """The line under each table; it says which cuBLAS time the ratios divide and, for a run timed
    in GPU time (`queued`), what the GB/s are."""
    rows = list(rows)
    counts = sorted({len(r.x_rounds) for r in rows if r.x_rounds})
    rounds = "" if not counts else str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    kinds = list(dict.fromkeys(baseline_mode(r) for r in rows)) or [BASELINE]  # in order of appearance
    kinds.sort(key=list(REFERENCE_NAMES).index)  # cuBLAS first, then the grouped references
    names = [REFERENCE_NAMES[k] for k in kinds]
    if len(kinds) == 1:
        reference, x_name = names[0], f"x {names[0]}"
        rows_of = f"the {kinds[0]} row"
    else:
        others = [f"{_rows_named(k)}: {REFERENCE_NAMES[k]}" for k in kinds[1:]]
        reference = "; ".join([names[0], *others])
        x_name = f"x {names[0]} or, in " + ", in ".join(
            f"{_rows_named(k)}, x {REFERENCE_NAMES[k]}" for k in kinds[1:]
        )
        rows_of = (
            f"the {kinds[0]} row (" + "; ".join(f"{_rows_named(k)}: the {k} row" for k in kinds[1:]) + ")"
        )
    if rounds:
        baseline = (
            f"against {reference} timed on the same inputs in windows alternating with each cell's, "
            f"median over {rounds} rounds"
        )
    else:
        baseline = f"{rows_of} of the same shape"
    gbps = f"GB/s of A, B and C over the median {QUEUED}, " if queued else ""
    return (
        f"Cells: TFLOP/s (~ = p20-p80 spread above 5 %), {x_name} ({baseline}), {gbps}"
        "BLOCK_MxNxK; best of each shape in bold; geomean over measured shapes."
    )


def _rows_named(baseline: str) -> str:
    """The rows a baseline mode is the reference of, in words."""
    return {GROUPED_BASELINE: "grouped rows", GROUPED_FP8_BASELINE: "grouped fp8 rows"}.get(baseline, "rows")


def _queued(results: Results) -> bool:
    """Whether the run was timed in GPU time (`--gpu-time`)."""
    return bool(results.settings.get("queued"))


def _legend(results: Results) -> str:
    return legend(results.rows, _queued(results))


def print_table(results: Results, console: Any) -> None:
    """The rich tables, environment first, then per (dtype, layout) a table and its notes."""
    from rich.table import Table
    from rich.text import Text

    for line in env_lines(results):
        console.print(Text(line, style="dim"))
    for pivot in pivots(results):
        table = Table(title=pivot.title, show_lines=True)
        table.add_column(pivot.shape_header, no_wrap=True)
        for mode in pivot.modes:
            table.add_column(mode, justify="right")
        for shape in pivot.shapes:
            table.add_row(shape.label, *(_rich(c) for c in pivot.cells_of(shape)))
        table.add_row("geomean", *(_rich(pivot.geomean[m]) for m in pivot.modes))
        console.print(table)
        console.print(Text(_legend(results), style="dim"))
        for note in pivot.notes:
            console.print(Text(note, style="yellow"))


def _rich(cell: Cell) -> Any:
    from rich.text import Text

    return Text("\n".join(cell.lines), style=f"{cell.style} bold".strip() if cell.best else cell.style)


def format_markdown(results: Results) -> str:
    """The environment as a list, then a table per (dtype, layout) under a level-4 heading, so that
    the text nests in a larger document (the README embeds it: `embed_reports`)."""
    out = [f"- {line}" for line in env_lines(results)]
    for pivot in pivots(results):
        out += ["", f"#### {pivot.title}", ""]
        out.append(f"| {pivot.shape_header} | " + " | ".join(pivot.modes) + " |")
        out.append("|---|" + "---:|" * len(pivot.modes))
        for shape in pivot.shapes:
            out.append(f"| {shape.label} | " + " | ".join(_markdown(c) for c in pivot.cells_of(shape)) + " |")
        out.append("| geomean | " + " | ".join(_markdown(pivot.geomean[m]) for m in pivot.modes) + " |")
        out += ["", _legend(results)]
        out += [f"- {note}" for note in pivot.notes]
    return "\n".join(out) + "\n"


def format_summary(results: Results) -> str:
    """One markdown table for the whole run: per (dtype, layout) and mode, the geomean TFLOP/s and
    x cuBLAS over its measured shapes, the geomean x cuBLAS per M (where the run has several) and
    its lowest cell. A headline for a document that shows the full tables elsewhere: `embed_reports`
    writes it for `<!-- report PATH summary -->`. cuBLAS's own row (1.00x by construction) is left
    out; a mode with no measured shape is left out. Grouped rows go by tokens T (`--shapes moe`),
    torch._grouped_mm's own row left out as cuBLAS's is."""
    rows = [r for r in attach_x_cublas(results.rows) if not is_baseline(r)]
    tokens = "T" if any(r.grouped for r in rows) else "M"
    ms = sorted({r.shape.tokens for r in rows})
    by_m = ms if len(ms) > 1 else []
    layouts = "dtype, B" if all(r.a_layout == "row" for r in rows) else "dtype, layouts"
    out = [
        f"| {layouts} | mode | TFLOP/s | x cuBLAS | "
        + "".join(f"{tokens} = {m} | " for m in by_m)
        + "lowest x cuBLAS |",
        "|---|---|---:|---:|" + "---:|" * len(by_m) + "---|",
    ]
    pairs = list(dict.fromkeys((r.dtype, r.layouts) for r in rows))
    keys = sorted(dict.fromkeys((r.dtype, r.layouts, r.mode) for r in rows), key=lambda k: pairs.index(k[:2]))
    for dtype, layout, mode in keys:
        group = [r for r in rows if (r.dtype, r.layouts, r.mode) == (dtype, layout, mode) and r.measured]
        paired = [r for r in group if r.x_cublas is not None]
        if not group:
            continue
        gx = geomean(r.x_cublas for r in paired)  # type: ignore[misc]
        of_m: dict[int, list[float]] = {}
        for r in paired:
            of_m.setdefault(r.shape.tokens, []).append(r.x_cublas)  # type: ignore[arg-type]
        per_m = [geomean(of_m.get(m, [])) for m in by_m]
        low = min(paired, key=lambda r: r.x_cublas, default=None)  # type: ignore[arg-type,return-value]
        cells = [
            f"{dtype}, {layout}",
            mode,
            f"{geomean(r.tflops for r in group):.1f}",  # type: ignore[misc]
            "-" if gx is None else f"**{gx:.3f}x**",
            *("-" if x is None else f"{x:.2f}x" for x in per_m),
            "-" if low is None else f"{low.x_cublas:.2f}x ({low.shape.label})",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


REPORT_BLOCK = re.compile(
    r"(?P<open><!-- report (?P<path>\S+)(?: (?P<form>summary))? -->\n)"
    r"(?P<body>.*?)(?P<close><!-- end report -->)",
    re.DOTALL,
)


def embed_reports(text: str, root: Path) -> str:
    """`text` (a markdown document) with every block between `<!-- report PATH -->` and
    `<!-- end report -->` replaced by `format_markdown` of the results file PATH (relative to
    `root`): how the README's result tables are made, so that a rerun never edits them by hand.
    `<!-- report PATH summary -->` gets `format_summary` instead: one table of geomeans. PATH may
    be several files of one GPU and commit, joined by commas (`results.merge`)."""
    from gluon_survey.driver.results import load, merge

    def render(match: re.Match[str]) -> str:
        fmt = format_summary if match["form"] else format_markdown
        paths = match["path"].split(",")
        runs = [load(root / path) for path in paths]
        body = fmt(runs[0] if len(runs) == 1 else merge(runs, paths))
        return f"{match['open']}{body}{match['close']}"

    return REPORT_BLOCK.sub(render, text)


def _markdown(cell: Cell) -> str:
    lines = [line.replace("|", "\\|") for line in cell.lines]
    if cell.best:
        lines[0] = f"**{lines[0]}**"
    return "<br>".join(lines)


# ------------------------------------------------------------------------------------------------
# Flat formats


def format_legacy(rows: Iterable[Row]) -> str:
    """The original survey's lines: `Mode: X (DTYPE, B LAYOUT, M=.., N=..)`, the header,
    `K, BM, BN, BK, ms, TFLOP/s` per measured row, and a blank line. A row whose kernel has no
    block sizes prints 0 for them where it is torch's (as the original printed for torch) and `-`
    elsewhere (an `auto` row that ran cuBLAS: no block sizes of ours ran). The original swept K
    only, in one dtype; a sweep over more (dtype, layout, M, N) gets one such block per mode and
    combination, and the `Mode:` line names which (A's layout only where it is not row-major). Rows
    that are not measurements are left out."""
    blocks: dict[tuple[str, int, int, str, str, str], list[Row]] = {}
    for row in rows:
        grouping = f", E={row.E}, top-{row.topk}, {row.routing}" if row.grouped else ""
        blocks.setdefault((row.mode, row.M, row.N, row.dtype, row.layouts, grouping), []).append(row)
    out = []
    for (mode, m, n, dtype, layouts, grouping), block in blocks.items():
        out += [f"Mode: {mode} ({dtype}, {layouts}, M={m}, N={n}{grouping})", LEGACY_HEADER]
        for r in block:
            if r.measured:
                none = 0 if r.mode == BASELINE else "-"
                bm, bn, bk = (r.config.get(k, none) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
                out.append(f"{r.K}, {bm}, {bn}, {bk}, {r.ms_median:.4f}, {r.tflops:.2f}")
        out.append("")
    return "".join(f"{line}\n" for line in out)


_FLAT = [f.name for f in fields(Row) if f.name not in ("config", "flags", "error")]
CSV_COLUMNS = [*_FLAT, "BLOCK_M", "BLOCK_N", "BLOCK_K", "flags", "config", "error"]


def format_csv(results: Results) -> str:
    buf = io.StringIO()
    for line in env_lines(results):
        buf.write(f"# {line}\n")
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in attach_x_cublas(results.rows):
        record = {k: v for k, v in row.to_json().items() if k in _FLAT}
        record.update({k: row.config.get(k, "") for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")})
        record.update(
            flags="; ".join(row.flags), config=json.dumps(row.config, sort_keys=True), error=row.error
        )
        writer.writerow(record)
    return buf.getvalue()


def format_json(results: Results) -> str:
    header = {k: v for k, v in results.header.items() if k != "record"}
    rows = [{k: v for k, v in r.to_json().items() if k != "record"} for r in attach_x_cublas(results.rows)]
    return json.dumps({**header, "rows": rows}, indent=1, allow_nan=False) + "\n"


def render(results: Results, fmt: str, output: str | Path | None = None) -> None:
    """Write `results` in `fmt` to `output` (a path) or stdout."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt == "table":
        if output is None:
            print_table(results, console())
        else:
            with Path(output).open("w") as f:
                print_table(results, console(f))
        return
    text = {
        "legacy": lambda: format_legacy(results.rows),
        "csv": lambda: format_csv(results),
        "json": lambda: format_json(results),
        "markdown": lambda: format_markdown(results),
    }[fmt]()
    if output is None:
        print(text, end="")
    else:
        Path(output).write_text(text)


# ------------------------------------------------------------------------------------------------
# Plot


def _panels(count: int, most_cols: int, width: float, height: float) -> tuple[Any, Any]:
    """A figure of `count` panels, at most `most_cols` a row, each width x height inches; its axes
    as an iterator (what `_save` hides of them is what the caller did not draw on)."""
    from matplotlib.figure import Figure

    ncols = min(count, most_cols)
    nrows = math.ceil(count / ncols)
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False).flat


def _save(fig: Any, axes: Any, results: Results, path: str | Path, dpi: int) -> None:
    """Hide the panels left over in the last row, title the figure with the run's GPU and
    software, write it."""
    for ax in axes:
        ax.set_visible(False)
    env = results.env
    fig.suptitle(f"{env.get('name') or 'no GPU'} - torch {env.get('torch')}, triton {env.get('triton')}")
    fig.savefig(path, dpi=dpi)


PLOT_BY = ("mode", "weight")  # a --shapes run's panels: one per mode, or one per weight


def plot(results: Results, path: str | Path, by: str = "mode") -> int:
    """A grid (`--m/--n/--k`, the seed's K sweep): TFLOP/s vs K per mode, one panel per (dtype,
    layout, M, N): log2 K axis, a p20-p80 band, cuBLAS dashed, the dense peak as a dotted line.
    A list of shapes (`--shapes llm|llm-dense|holdout|FILE.csv`): x cuBLAS vs M, a panel per mode
    and a line per weight (`by` "mode", `plot_by_m`) or a panel per weight and a line per mode
    (`by` "weight", `plot_by_weight`: a ladder's rungs side by side). Returns the number of panels
    (0: nothing measured, no file written)."""
    if by not in PLOT_BY:
        raise ValueError(f"plot by one of {', '.join(PLOT_BY)}, got {by!r}")
    if str(results.settings.get("shapes", "")).startswith("--shapes"):
        return plot_by_weight(results, path) if by == "weight" else plot_by_m(results, path)
    groups: dict[tuple[str, str, int, int], list[Row]] = {}
    for r in results.rows:
        if r.measured:
            groups.setdefault((r.dtype, r.layouts_label, r.M, r.N), []).append(r)
    if not groups:
        return 0
    fig, axes = _panels(len(groups), 3, 6, 4.5)
    peak_of = peaks(results)
    for ((dtype, layout, m, n), group), ax in zip(groups.items(), axes, strict=False):
        for mode in dict.fromkeys(r.mode for r in group):
            pts = sorted((r for r in group if r.mode == mode), key=lambda r: r.K)
            ks = [r.K for r in pts]
            (line,) = ax.plot(
                ks, [r.tflops for r in pts], "--" if mode == BASELINE else "-", marker="o", label=mode
            )
            low = [r.tflops_at(r.ms_p80) for r in pts]
            high = [r.tflops_at(r.ms_p20) for r in pts]
            ax.fill_between(ks, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        if peak_of.get(dtype):
            ax.axhline(peak_of[dtype], color="gray", linestyle=":", label=f"dense peak {peak_of[dtype]:g}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"M={m} N={n} {dtype} {layout}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    _save(fig, axes, results, path, dpi=120)
    return len(groups)


def _x_cublas_rows(results: Results) -> list[Row]:
    """The rows a `--shapes` plot draws: those with an x cuBLAS, cuBLAS's own rows left out."""
    return [r for r in attach_x_cublas(results.rows) if r.x_cublas is not None and not is_baseline(r)]


def _x_cublas_line(ax: Any, pts: list[Row], label: str, i: int, **style: Any) -> None:
    """x cuBLAS vs tokens for `pts`, sorted by tokens: the i-th line's colour and dash, and the band
    of its paired rounds where every point has them."""
    pts = sorted(pts, key=lambda r: r.shape.tokens)
    ms = [r.shape.tokens for r in pts]
    (line,) = ax.plot(ms, [r.x_cublas for r in pts], marker="o", markersize=3, label=label,
                      color=f"C{i % 10}", linestyle=("-", "--", ":")[i // 10 % 3], **style)  # fmt: skip
    if all(r.x_rounds for r in pts):
        low = [min(r.x_rounds) for r in pts]  # type: ignore[arg-type]
        high = [max(r.x_rounds) for r in pts]  # type: ignore[arg-type]
        ax.fill_between(ms, low, high, color=line.get_color(), alpha=0.08, linewidth=0)


def _x_cublas_axes(ax: Any, group: list[Row], title: str) -> None:
    """A `--shapes` panel's reference line at 1.0, log2 token axis, labels, title and legend."""
    grouped = all(r.grouped for r in group)
    reference = REFERENCE_NAMES[baseline_mode(group[0])]  # a panel is one dtype and kind
    ax.axhline(1.0, color="gray", linestyle=":", label=reference)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("T (tokens; x has T * top-k rows)" if grouped else "M (tokens)")
    ax.set_ylabel(f"x {reference}")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", ncols=2)


def plot_by_m(results: Results, path: str | Path) -> int:
    """x cuBLAS vs M, one panel per (dtype, layout, mode) other than cuBLAS: a thin line per
    weight (N x K), the geomean over the weights measured at each M thick and black, the band of a
    weight's paired rounds where it has them, cuBLAS at 1.0 dotted. Returns the number of panels
    (0: no row has an x cuBLAS, no file written)."""
    panels: dict[tuple[str, str, str], list[Row]] = {}
    for r in _x_cublas_rows(results):
        panels.setdefault((r.dtype, r.layouts_label, r.mode), []).append(r)
    if not panels:
        return 0
    fig, axes = _panels(len(panels), 2, 8, 5.5)
    for ((dtype, layout, mode), group), ax in zip(panels.items(), axes, strict=False):
        weights: dict[str, list[Row]] = {}
        for r in group:
            weights.setdefault(r.shape.weight, []).append(r)
        for i, (weight, of_weight) in enumerate(weights.items()):
            _x_cublas_line(ax, of_weight, weight, i, linewidth=1, alpha=0.8)
        by_m: dict[int, list[float]] = {}
        for r in group:
            by_m.setdefault(r.shape.tokens, []).append(r.x_cublas)  # type: ignore[arg-type]
        ms = sorted(by_m)
        ax.plot(ms, [geomean(by_m[m]) for m in ms], color="black", linewidth=2.5, marker="s", label="geomean")
        per_line = "N x K, E, top-k, routing" if all(r.grouped for r in group) else "N x K"
        _x_cublas_axes(ax, group, f"{mode} {dtype} {layout}: {per_line} per line")
    _save(fig, axes, results, path, dpi=110)
    return len(panels)


def plot_by_weight(results: Results, path: str | Path) -> int:
    """x cuBLAS vs M, one panel per (dtype, layout, weight): a line per mode other than cuBLAS
    (one colour per mode across the panels), the band of its paired rounds where it has them,
    cuBLAS at 1.0 dotted: a ladder's rungs side by side on each weight. Returns the number of
    panels (0: no row has an x cuBLAS, no file written)."""
    rows = _x_cublas_rows(results)
    panels: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        panels.setdefault((r.dtype, r.layouts_label, r.shape.weight), []).append(r)
    if not panels:
        return 0
    modes = list(dict.fromkeys(r.mode for r in rows))
    fig, axes = _panels(len(panels), 2, 8, 5.5)
    for ((dtype, layout, weight), group), ax in zip(panels.items(), axes, strict=False):
        for mode in dict.fromkeys(r.mode for r in group):
            _x_cublas_line(ax, [r for r in group if r.mode == mode], mode, modes.index(mode), linewidth=1.5)
        _x_cublas_axes(ax, group, f"{weight} {dtype} {layout}: a line per mode")
    _save(fig, axes, results, path, dpi=110)
    return len(panels)


# ------------------------------------------------------------------------------------------------
# Comparison of two runs

_VERDICT_STYLE = {"faster": "green", "slower": "red", "broken": "bold red", "fixed": "green"}


def print_comparison(
    old: Results, new: Results, deltas: Sequence[Delta], console: Any, missing: Sequence[Row] = ()
) -> None:
    """Both runs' machines; per (dtype, layout) a table, a row per compared result; the results of
    the old run that the new one lacks (`missing`); the geomean new/old ratio per mode. The shape
    column never wraps: the tables fit 80 columns with it whole."""
    from rich.table import Table
    from rich.text import Text

    for label, results in (("old", old), ("new", new)):
        git = results.env.get("git") or {}
        console.print(
            Text(
                f"{label}: {results.header.get('run_id')}  {results.env.get('name') or 'no GPU'}  "
                f"commit {git.get('commit', 'unknown')[:12]}",
                style="dim",
            )
        )
    for dtype, layout in dict.fromkeys((d.new.dtype, d.new.layouts) for d in deltas):
        table = Table(title=f"new vs old, {dtype}, {layout} (same = p20-p80 intervals overlap)")
        table.add_column("mode", no_wrap=True)
        table.add_column("M x N x K", no_wrap=True)
        for name in ("old TFLOP/s", "new TFLOP/s", "new/old"):
            table.add_column(name, justify="right")
        table.add_column("verdict")
        for d in deltas:
            if (d.new.dtype, d.new.layouts) != (dtype, layout):
                continue
            table.add_row(
                d.new.mode,
                d.new.shape.label,
                _tflops_or_status(d.old),
                _tflops_or_status(d.new),
                f"{d.ratio:.3f}" if d.ratio is not None else "-",
                Text(d.verdict, style=_VERDICT_STYLE.get(d.verdict, "")),
            )
        console.print(table)
    for r in missing:
        console.print(
            Text(f"missing from NEW: {r.mode} {r.shape.label} {r.dtype} {r.layouts_label}", style="bold red")
        )
    for mode in dict.fromkeys(d.new.mode for d in deltas):
        gm = geomean(d.ratio for d in deltas if d.new.mode == mode and d.ratio is not None)
        if gm is not None:
            console.print(f"{mode}: geomean new/old {gm:.3f}")


def _tflops_or_status(row: Row) -> str:
    return f"{row.tflops:.1f}" if row.measured else row.outcome
