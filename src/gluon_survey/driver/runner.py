"""The sweep: modes x shapes x dtypes x A and B layouts, each mode in worker subprocesses.

Each mode runs in a fresh worker process (`WORKER_COMMAND`: `python -m gluon_survey.driver.worker`;
`run_sweep` takes another command, e.g. the tests' worker with CPU providers) that measures its
tasks one after the other and reports each as a JSON line. The parent gives every task
`timeout_s`, counted from the worker's "start" of it (a worker's start-up before its first task
gets at least `STARTUP_TIMEOUT_S`), and appends each row to the results file the moment it
arrives. When a
worker crashes or runs out of time, the parent records an ERROR or TIMEOUT row for the task in
flight, with the tail of the worker's stderr, kills the worker's whole process group (autotuners
and torch.compile start processes of their own) and starts a fresh worker for the tasks that
remain.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

from gluon_survey.driver.results import Key, ResultsWriter, Row, layouts_label
from gluon_survey.driver.settings import Settings
from gluon_survey.driver.shapes import GroupedShape, Shape

STDERR_TAIL_LINES = 20
STARTUP_TIMEOUT_S = 120.0  # a worker's start-up (imports, CUDA init) gets at least this long
# The worker process `run_sweep` starts per mode unless it is given another command.
WORKER_COMMAND = (sys.executable, "-m", "gluon_survey.driver.worker")


@dataclass(frozen=True)
class Task:
    shape: Shape | GroupedShape
    dtype: str
    b_layout: str
    a_layout: str = "row"

    def label(self) -> str:
        return f"{self.shape.label} {self.dtype} {layouts_label(self.a_layout, self.b_layout)}"

    def to_json(self) -> dict[str, Any]:
        """The shape's fields (M, N, K; a grouped shape's E, topk and routing too), dtype, layouts
        (A's only where it is "t": a task without one is A row, as tasks were before A layouts)."""
        a = {"a_layout": self.a_layout} if self.a_layout != "row" else {}
        return {**self.shape.to_json(), "dtype": self.dtype, "b_layout": self.b_layout, **a}

    def key(self, mode: str) -> Key:
        """The key (`Row.key`) of the row `mode` records for this task."""
        return Row(run_id="", mode=mode, status="", **self.to_json()).key


def make_tasks(
    shapes: Iterable[Shape | GroupedShape],
    dtypes: Iterable[str],
    b_layouts: Iterable[str],
    a_layouts: Iterable[str] = ("row",),
) -> list[Task]:
    """Every combination, grouped by dtype, then A layout, then B layout, shapes varying fastest. A
    shape that fixes its layouts (`Shape.fixed_layouts`: the `llm-train` preset) is one task per
    dtype in them, in its place among the shapes, whatever `b_layouts` and `a_layouts` say."""
    shapes = list(shapes)
    b_layouts, a_layouts = list(b_layouts), list(a_layouts)
    if any(s.fixed_layouts for s in shapes):
        return [Task(s, d, s.b_layout or "row", s.a_layout or "row") for d in dtypes for s in shapes]
    return [Task(s, d, b, a) for d in dtypes for a in a_layouts for b in b_layouts for s in shapes]


class Progress(Protocol):
    """What the sweep reports while it runs (see `RichProgress`)."""

    def describe(self, text: str) -> None: ...

    def advance(self) -> None: ...


class _Silent:
    def describe(self, text: str) -> None:
        pass

    def advance(self) -> None:
        pass


class RichProgress:
    """A rich progress bar on stderr over all tasks of all modes, naming what runs right now."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task = self._bar.add_task("starting", total=total)

    def describe(self, text: str) -> None:
        self._bar.update(self._task, description=text)

    def advance(self) -> None:
        self._bar.advance(self._task)

    def __enter__(self) -> RichProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()


class _Worker:
    """One worker subprocess: its event stream (a queue fed by a reader thread) and stderr tail."""

    def __init__(self, command: Sequence[str], mode: str, tasks: Sequence[Task], settings: Settings) -> None:
        self.proc = subprocess.Popen(
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # Ctrl-C goes to the driver only; killpg reaches the worker's children
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._readers = [
            threading.Thread(target=self._read_events, args=(self.proc.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(self.proc.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        job = {"mode": mode, "tasks": [t.to_json() for t in tasks], "settings": settings.worker_json()}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()  # stdin stays open: its EOF tells the worker the driver is gone

    def _read_events(self, stream: IO[str]) -> None:
        for line in stream:
            try:
                self.events.put(json.loads(line))
            except json.JSONDecodeError:
                self.stderr_tail.append(line.rstrip())
        self.events.put(None)

    def _read_stderr(self, stream: IO[str]) -> None:
        for line in stream:
            if line.strip():
                self.stderr_tail.append(line.rstrip())

    def next_event(self, timeout: float) -> dict[str, Any] | None:
        """The next event; None once the worker has exited; queue.Empty after `timeout` s."""
        return self.events.get(timeout=max(timeout, 0.0))

    def stop(self) -> None:
        """Kill the worker and everything it started; wait until its output is drained."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for reader in self._readers:
            reader.join(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):  # stdin of a dead worker: nothing left to flush
                stream.close()  # type: ignore[union-attr]

    def exit_reason(self, grace_s: float = 10.0) -> str:
        """How the worker ended, once its output has closed (killed if it lingers past `grace_s`)."""
        try:
            code = self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.stop()
            code = self.proc.returncode
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with status {code}"

    def tail(self) -> str:
        return "\n".join(self.stderr_tail)


def run_sweep(
    modes: Sequence[str],
    tasks: Sequence[Task],
    settings: Settings,
    writer: ResultsWriter,
    peaks: dict[str, float | None],
    progress: Progress | None = None,
    worker_command: Sequence[str] | None = None,
    skip: Collection[Key] = frozenset(),
) -> list[Row]:
    """Measure every task of every mode, but those whose row's key is in `skip` (measured by an
    earlier run this one continues); each row is appended to `writer` as it arrives.

    `peaks` maps dtype -> dense peak TFLOP/s (None: unknown), for % of peak and the ABOVE_PEAK
    flag. `worker_command` starts a worker (default `WORKER_COMMAND`); it must speak the protocol
    of `gluon_survey.driver.worker`. On KeyboardInterrupt the worker is killed and the interrupt
    propagates; rows already written stay in the file.
    """
    progress = progress or _Silent()
    command = tuple(worker_command or WORKER_COMMAND)
    rows: list[Row] = []

    def record(mode: str, task: Task, fields: dict[str, Any]) -> None:
        row = Row.from_json({"run_id": writer.run_id, "mode": mode, **task.to_json(), **fields})
        row = row.with_metrics(peaks.get(task.dtype))
        writer.append(row)
        rows.append(row)
        progress.advance()

    for mode in modes:
        pending = [task for task in tasks if task.key(mode) not in skip]
        while pending:
            done = _run_worker(command, mode, pending, settings, record, progress)
            pending = pending[done:]
    return rows


def _run_worker(
    command: Sequence[str],
    mode: str,
    tasks: Sequence[Task],
    settings: Settings,
    record: Callable[[str, Task, dict[str, Any]], None],
    progress: Progress,
) -> int:
    """Run `tasks` in one worker until it finishes, dies or times out; how many tasks are done.

    A worker that dies or hangs during a task costs that task an ERROR or TIMEOUT row. One that
    stops between tasks (after a lost CUDA context) costs nothing: the rest go to a new worker.
    """
    proc = _Worker(command, mode, tasks, settings)
    current, phase, in_flight = 0, "starting", False
    limit = max(settings.timeout_s, STARTUP_TIMEOUT_S)  # until the first task starts: imports, CUDA init
    deadline = time.monotonic() + limit
    progress.describe(f"{mode}: starting worker")
    try:
        while True:
            try:
                event = proc.next_event(deadline - time.monotonic())
            except queue.Empty:
                proc.stop()
                status, error = "TIMEOUT", f"no result within {limit:g} s (while {phase})"
                break
            if event is None:
                status, error = "ERROR", f"worker {proc.exit_reason()} while {phase}"
                break
            kind = event.get("event")
            if kind == "start":
                current, phase, limit, in_flight = event["task"], "starting", settings.timeout_s, True
                deadline = time.monotonic() + limit
            elif kind == "phase":
                phase = event["phase"]
            elif kind == "row":
                record(mode, tasks[event["task"]], event["row"])
                current, in_flight = event["task"] + 1, False
            elif kind == "done":
                return current
            if in_flight:
                progress.describe(f"{mode} {tasks[current].label()}: {phase}")
        if current >= len(tasks) or (current > 0 and not in_flight):
            return current
        record(mode, tasks[current], {"status": status, "error": _with_tail(error, proc.tail())})
        return current + 1
    finally:
        proc.stop()


def _with_tail(headline: str, tail: str) -> str:
    return f"{headline}\n{tail}" if tail else headline
