"""Results files and the comparison of two runs.

A results file is JSON Lines: a header line (``"record": "header"``: run id, environment from
`hardware.gpu_info`, command line, settings: timer, warm-up, L2 mode, seed, tolerance rule, peaks)
and then one line per measured row (``"record": "row"``), appended and fsync'ed as soon as the
row exists, so a crash or Ctrl-C loses nothing already measured. Non-finite floats are stored as
null so that any JSON reader can load the file.

A grouped row (a mixture-of-experts layer's expert GEMMs, `shapes.GroupedShape`) carries E, topk
and routing as well (None in a dense row), M is its S = T * topk rows, `counts` the rows each
expert got, and its reference is torch._grouped_mm, not cuBLAS: `x_cublas`, `cublas_ms`,
`x_rounds` and `cublas_drift` are against the paired torch._grouped_mm (the `grouped_mm` mode;
in fp8-row torch._scaled_grouped_mm, the `scaled_grouped_mm` mode), while `cublas_err`, the
tolerance's yardstick, is cuBLAS's called per expert (fp8-row: torch._scaled_mm per expert).

A row's `a_layout` is A's layout ("row", or "t": the transpose view of a [K, M] matrix,
`--a-layout`); a row of a file written before A layouts were measured has none and is A row.

`compare(old, new)` matches rows by (mode, M, N, K, dtype, B layout, A layout, E, topk,
routing). Two measurements are "same" when their p20-p80 time intervals overlap, i.e. the
difference is inside the measured noise; otherwise "faster" or "slower". A row that was measured
and now is not (FAILED, ERROR, TIMEOUT, or flagged above peak) is "broken", the reverse "fixed".
`missing(old, new)` lists the rows of the old run that the new one lacks (a run that crashed or
was stopped early).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import secrets
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import IO, Any

from gluon_survey.driver.shapes import GroupedShape, Shape, shape_of
from gluon_survey.driver.timing import NOISY_SPREAD

SCHEMA_VERSION = 1
STATUSES = ("OK", "FAILED", "ERROR", "SKIPPED", "TIMEOUT")
ABOVE_PEAK = "ABOVE_PEAK: measurement error"
NOISY = "NOISY"

Key = tuple[str, int, int, int, str, str, str, int | None, int | None, str | None]


@dataclass
class Row:
    """One (mode, shape, dtype, B layout, A layout) outcome.

    status: OK, FAILED (wrong result; `error` says how wrong), ERROR (an exception; its message),
    SKIPPED (this GPU cannot run the mode, or the mode does not take this kind of problem; why),
    TIMEOUT (no result within the time limit).

    A grouped row (E set) measures a grouped GEMM of S = M rows: its `cublas_*` and `x_*` fields
    are against torch._grouped_mm, in fp8-row torch._scaled_grouped_mm (module docstring).
    """

    run_id: str
    mode: str
    M: int
    N: int
    K: int
    dtype: str
    b_layout: str
    status: str
    error: str = ""
    a_layout: str = "row"  # "t": A is the transpose view of a [K, M] matrix (module docstring)
    config: dict[str, Any] = field(default_factory=dict)
    compile_s: float | None = None
    ms_median: float | None = None
    ms_p20: float | None = None
    ms_p80: float | None = None
    ms_min: float | None = None
    spread: float | None = None
    n_iters: int | None = None
    l2_copies: int | None = None
    timer: str | None = None
    tflops: float | None = None
    gbps: float | None = None  # bytes of A, B and C / the median time (`bytes_moved`), 1 GB = 1e9 bytes
    pct_peak: float | None = None
    x_cublas: float | None = None
    cublas_ms: float | None = None  # paired baseline: cuBLAS's median, timed alongside this row
    cublas_drift: float | None = None  # cuBLAS's last window / its first - 1: how much the GPU changed
    x_rounds: list[float] | None = None  # paired: cuBLAS / this row in each round (timing.time_paired)
    interleaved: bool | None = None  # paired: calls taken in turn with cuBLAS's (False: alternating windows)
    starved: int | None = None  # queued timing: timed calls the host fell behind on (0: GPU time throughout)
    cublas_starved: int | None = None  # the same for the paired cuBLAS
    sm_clock_mhz: float | None = None  # NVML, mean over the timed windows (paired: this row's own)
    power_w: float | None = None
    # paired: the same over cuBLAS's windows (each side's windows include the calls that settled
    # them; interleaved windows count for both sides)
    cublas_sm_clock_mhz: float | None = None
    cublas_power_w: float | None = None
    rel_err: float | None = None
    tol: float | None = None
    cublas_err: float | None = None
    flags: list[str] = field(default_factory=list)
    # Grouped rows only (None for dense ones): experts, experts per token, the routing
    # (`shapes.ROUTINGS`) and the rows each expert got (`shapes.routing_counts`, summing to M).
    E: int | None = None
    topk: int | None = None
    routing: str | None = None
    counts: list[int] | None = None

    @property
    def shape(self) -> Shape | GroupedShape:
        return shape_of(self.M, self.N, self.K, self.E, self.topk, self.routing)

    @property
    def grouped(self) -> bool:
        return self.E is not None

    @property
    def key(self) -> Key:
        return (self.mode, *self.problem)

    @property
    def problem(self) -> tuple[int, int, int, str, str, str, int | None, int | None, str | None]:
        """What was measured, whatever the mode: the key without the mode."""
        return (
            self.M,
            self.N,
            self.K,
            self.dtype,
            self.b_layout,
            self.a_layout,
            self.E,
            self.topk,
            self.routing,
        )

    @property
    def layouts(self) -> str:
        """The layouts in a title's words: 'B t', or 'A t, B row' where A is not row-major (so a
        run without A layouts reads as it always has)."""
        return f"B {self.b_layout}" if self.a_layout == "row" else f"A {self.a_layout}, B {self.b_layout}"

    @property
    def layouts_label(self) -> str:
        """The layouts in a label's words (`layouts_label`): 'B=t', or 'A=t B=row'."""
        return layouts_label(self.a_layout, self.b_layout)

    @property
    def measured(self) -> bool:
        """A valid measurement: correct, timed, and not above the dense peak."""
        return self.status == "OK" and self.tflops is not None and ABOVE_PEAK not in self.flags

    @property
    def outcome(self) -> str:
        """The status, except "ABOVE PEAK" for a timed row whose TFLOP/s exceed the dense peak."""
        return "ABOVE PEAK" if self.status == "OK" and ABOVE_PEAK in self.flags else self.status

    def tflops_at(self, ms: float | None) -> float | None:
        return None if ms is None else self.shape.tflops(ms)

    def with_metrics(self, peak_tflops: float | None) -> Row:
        """This row with TFLOP/s and GB/s (from the median), % of peak and the NOISY / ABOVE_PEAK
        flags."""
        if self.ms_median is None:
            return self
        tflops = self.shape.tflops(self.ms_median)
        moved = bytes_moved(self.shape, self.dtype, self.counts)
        gbps = None if moved is None else moved / (self.ms_median * 1e-3) / 1e9
        flags = [f for f in self.flags if f not in (NOISY, ABOVE_PEAK)]
        if self.spread is not None and self.spread > NOISY_SPREAD:
            flags.append(NOISY)
        if peak_tflops and tflops > peak_tflops:
            flags.append(ABOVE_PEAK)
        pct = 100.0 * tflops / peak_tflops if peak_tflops else None
        return replace(self, tflops=tflops, gbps=gbps, pct_peak=pct, flags=flags)

    def to_json(self) -> dict[str, Any]:
        return {"record": "row", **{k: _finite(v) for k, v in asdict(self).items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def layouts_label(a_layout: str, b_layout: str) -> str:
    """'B=t', or 'A=t B=row' where A is not row-major: how labels and messages name the layouts."""
    return f"B={b_layout}" if a_layout == "row" else f"A={a_layout} B={b_layout}"


def bytes_moved(shape: Shape | GroupedShape, dtype: str, counts: list[int] | None = None) -> int | None:
    """The bytes of A, B and C of one product: the operands' element size (fp16 and bf16 2, fp8 1)
    and the output's (2); None for an unknown dtype. A grouped product reads the weights of the
    experts with rows only (`counts`; without them, of min(E, S) experts, as many as could have
    rows)."""
    from gluon_survey.driver.check import dtype_spec

    try:
        spec = dtype_spec(dtype)
    except ValueError:
        return None
    weights = 1
    if isinstance(shape, GroupedShape):
        weights = sum(1 for c in counts if c) if counts else min(shape.E, shape.M)
    operands = (shape.M + weights * shape.N) * shape.K * spec.operand.itemsize
    return operands + shape.M * shape.N * spec.output.itemsize


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def new_run_id() -> str:
    """Sortable and unique enough: local time plus 4 random hex digits."""
    return f"{_dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def make_header(run_id: str, env: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    return {"record": "header", "schema": SCHEMA_VERSION, "run_id": run_id, "env": env, "settings": settings}


class ResultsWriter:
    """Appends rows to a new results file, each flushed and fsync'ed before `append` returns."""

    def __init__(self, path: str | Path, header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.run_id: str = header["run_id"]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = self.path.open("x")  # never mix two runs in one file
        self._write(header)

    def append(self, row: Row) -> None:
        self._write(row.to_json())

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Results:
    header: dict[str, Any]
    rows: list[Row]
    # What `load` skipped, one line each ("FILE:LINE: ..."), for the CLI to warn about.
    warnings: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, Any]:
        return self.header.get("env", {})

    @property
    def settings(self) -> dict[str, Any]:
        return self.header.get("settings", {})


class OneDocument(ValueError):
    """`load`'s error for a file that is one JSON document, as `gluon-survey memcpy`, `overhead`
    and `tune` write, not a timing run's JSON Lines. `doc` is the document, `command` the
    subcommand that wrote it ("memcpy"), as its `env.command` says, or for a memcpy result that
    does not say, its settings (`mib` and `datasheet`); "" when unknown."""

    def __init__(self, path: Path, doc: dict[str, Any]) -> None:
        env, settings = (doc.get(k) if isinstance(doc.get(k), dict) else {} for k in ("env", "settings"))
        words = str(env.get("command") or "").split()
        self.doc = doc
        if len(words) > 1 and words[0] == "gluon-survey":
            self.command = words[1]
        else:
            self.command = "memcpy" if {"mib", "datasheet"} <= settings.keys() else ""
        what = f"a `gluon-survey {self.command}` result" if self.command else "one JSON document"
        message = f"{path} is {what}, not the JSON Lines of a timing run"
        if self.command == "memcpy":
            message += f"; `gluon-survey report {path}` renders it (--format table, markdown or json)"
        super().__init__(message)


def _one_document(path: Path, text: str) -> OneDocument | None:
    """The error for a file that is one JSON object but not a results file's line, or None."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(doc, dict) and "record" not in doc:
        return OneDocument(path, doc)
    return None


def load(path: str | Path) -> Results:
    """A results file's header and rows. A last line cut short (the writer was killed while
    writing it) is skipped and named in `Results.warnings`; a file that is one JSON document (a
    memcpy result, say) raises `OneDocument`, naming what it is; anything else malformed raises
    ValueError."""
    path = Path(path)
    text = path.read_text()
    lines = text.splitlines()
    header: dict[str, Any] | None = None
    rows: list[Row] = []
    warnings: list[str] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if header is None and (other := _one_document(path, text)):
                raise other from None
            if lineno == len(lines):
                warnings.append(f"{path}:{lineno}: skipped a truncated last line (its writer was stopped)")
                break
            raise ValueError(f"{path}:{lineno}: not a JSON line") from None
        kind = record.get("record") if isinstance(record, dict) else None
        if kind is None and header is None and (other := _one_document(path, text)):
            raise other
        if kind == "header":
            if header is not None:
                raise ValueError(f"{path}:{lineno}: a second header; one file holds one run")
            header = record
        elif kind == "row":
            if header is None:
                raise ValueError(f"{path}:{lineno}: a row before the header; not a gluon-survey results file")
            try:
                rows.append(Row.from_json(record))
            except TypeError as exc:
                raise ValueError(f"{path}:{lineno}: not a result row ({exc})") from None
        else:
            raise ValueError(f"{path}:{lineno}: unknown record {kind!r}")
    if header is None:
        raise ValueError(f"{path}: no header line; not a gluon-survey results file")
    return Results(header, rows, warnings)


def merge(runs: list[Results], names: list[str]) -> Results:
    """Several runs of one commit on one GPU as one (`gluon-survey report A B ...`): a sweep split
    over device calls. Every row is against the cuBLAS timed beside it in its own run, so rows of
    runs on different GPUs or commits are not merged (ValueError naming the two), nor two rows of
    one (mode, shape, dtype, layouts). The header is the first run's, its command every run's in
    turn (joined by " ; "), so the report says how each part was measured; `warnings` gathers the
    runs'."""
    first = runs[0]

    def origin(run: Results) -> tuple[object, object]:
        return run.env.get("name"), (run.env.get("git") or {}).get("commit")

    rows: list[Row] = []
    seen: dict[tuple, str] = {}
    for run, name in zip(runs, names, strict=True):
        if origin(run) != origin(first):
            gpu, commit = origin(run)
            raise ValueError(
                f"{name} ran on {gpu} at commit {commit}, {names[0]} on {origin(first)[0]} at commit "
                f"{origin(first)[1]}: report merges runs of one GPU and one commit only"
            )
        for row in run.rows:
            if row.key in seen:
                raise ValueError(f"{name} and {seen[row.key]} both measured {row.key}: which one to report?")
            seen[row.key] = name
            rows.append(row)
    commands = " ; ".join(dict.fromkeys(str(run.env.get("command", "")) for run in runs))
    header = first.header | {"env": first.env | {"command": commands}}
    return Results(header, rows, [w for run in runs for w in run.warnings])


@dataclass(frozen=True)
class Delta:
    """How one (mode, shape, dtype, layout) changed between two runs."""

    old: Row
    new: Row
    verdict: str  # same | faster | slower | broken | fixed | not measured

    @property
    def ratio(self) -> float | None:
        """new / old TFLOP/s, when both were measured."""
        if self.old.measured and self.new.measured:
            return self.new.tflops / self.old.tflops  # type: ignore[operator]
        return None

    def regression_pct(self) -> float:
        """How much slower new is than old, in %, when the verdict is "slower"; else 0."""
        ratio = self.ratio
        return 100.0 * (1.0 - ratio) if self.verdict == "slower" and ratio is not None else 0.0


def _verdict(old: Row, new: Row) -> str:
    if old.measured and new.measured:
        overlap = new.ms_p20 <= old.ms_p80 and old.ms_p20 <= new.ms_p80  # type: ignore[operator]
        if overlap:
            return "same"
        return "faster" if new.ms_median < old.ms_median else "slower"  # type: ignore[operator]
    if old.measured:
        return "broken"
    return "fixed" if new.measured else "not measured"


def compare(old: Iterable[Row], new: Iterable[Row]) -> list[Delta]:
    """Deltas for every key present in both runs, in the new run's order."""
    old_by_key = {row.key: row for row in old}
    return [
        Delta(old_by_key[row.key], row, _verdict(old_by_key[row.key], row))
        for row in new
        if row.key in old_by_key
    ]


def missing(old: Iterable[Row], new: Iterable[Row]) -> list[Row]:
    """The rows of the old run whose key the new run has no row for, in the old run's order."""
    new_keys = {row.key for row in new}
    return [row for row in old if row.key not in new_keys]


def regressions(deltas: Iterable[Delta], pct: float) -> list[Delta]:
    """Rows more than `pct` % slower beyond the noise, and rows that stopped producing a measurement."""
    return [d for d in deltas if d.verdict == "broken" or d.regression_pct() > pct]
