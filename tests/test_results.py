import json
import math
from dataclasses import replace

import pytest

from factories import ENV, SETTINGS, row
from gluon_survey.driver.cli import main
from gluon_survey.driver.results import (
    ABOVE_PEAK,
    NOISY,
    ResultsWriter,
    compare,
    load,
    make_header,
    missing,
    regressions,
)


def test_with_metrics_derives_tflops_peak_share_and_flags():
    r = row(ms=0.1, spread=0.01)  # 2*8192*8192*512 flop in 0.1 ms = 687.19 TFLOP/s
    assert r.tflops == pytest.approx(687.19476736)
    assert r.pct_peak == pytest.approx(100 * 687.19476736 / 989.4)
    assert r.flags == [] and r.measured
    noisy = row(ms=0.1, spread=0.08)
    assert noisy.flags == [NOISY] and noisy.measured
    impossible = row(ms=0.05)  # 1374 TFLOP/s > 989.4
    assert ABOVE_PEAK in impossible.flags and not impossible.measured
    assert impossible.outcome == "ABOVE PEAK"
    assert row(status="FAILED", error="rel_err 1 > tol 0.001").tflops is None


def _write(path, rows):
    with ResultsWriter(path, make_header("run", ENV, SETTINGS)) as writer:
        for r in rows:
            writer.append(r)


def test_rows_are_on_disk_as_soon_as_appended(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path, make_header("run", ENV, SETTINGS)) as writer:
        first = row(ms=0.1, config={"BLOCK_M": 128})
        writer.append(first)
        loaded = load(path)  # while the writer is still open
        assert loaded.rows == [first]
        assert loaded.env == ENV and loaded.settings == SETTINGS
        writer.append(row(K=1024, status="FAILED", error="rel_err inf > tol 0.001", rel_err=math.inf))
    rows = load(path).rows
    assert [r.status for r in rows] == ["OK", "FAILED"]
    assert rows[1].rel_err is None  # non-finite floats are stored as null: strict JSON
    for line in path.read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def test_a_results_file_holds_one_run(tmp_path):
    path = tmp_path / "r.jsonl"
    _write(path, [])
    with pytest.raises(FileExistsError):
        ResultsWriter(path, make_header("other", ENV, SETTINGS))
    path.write_text(path.read_text() * 2)
    with pytest.raises(ValueError, match="second header"):
        load(path)


def test_runs_of_one_gpu_and_commit_merge_and_report_as_one(tmp_path, capsys):
    """A sweep split over device calls: `merge` joins runs of one GPU and commit, refusing runs of
    another GPU or commit and a cell measured twice; `report A B` renders them as one, and a
    README block may name both, joined by a comma."""
    from gluon_survey.driver.report import embed_reports
    from gluon_survey.driver.results import merge

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(a, [row(ms=0.1), row(mode="torch", ms=0.2)])
    _write(b, [row(K=1024, ms=0.3)])
    merged = merge([load(a), load(b)], ["a", "b"])
    assert [(r.mode, r.K) for r in merged.rows] == [("Blocked", 512), ("torch", 512), ("Blocked", 1024)]
    assert merged.header["run_id"] == load(a).header["run_id"] and merged.env["command"] == ENV["command"]
    with pytest.raises(ValueError, match="both measured"):
        merge([load(a), load(a)], ["a", "a2"])
    other = tmp_path / "other.jsonl"
    with ResultsWriter(other, make_header("run", ENV | {"name": "NVIDIA H200"}, SETTINGS)) as writer:
        writer.append(row(K=2048, ms=0.1))
    with pytest.raises(ValueError, match="one GPU and one commit"):
        merge([load(a), load(other)], ["a", "other"])
    assert main(["report", str(a), str(b), "--format", "csv"]) == 0
    data = [line for line in capsys.readouterr().out.splitlines() if line and not line.startswith("#")]
    assert len(data) == 1 + 3  # the CSV's header and the three rows
    assert main(["report", str(a), str(other)]) == 2
    assert "one GPU and one commit" in capsys.readouterr().err
    block = "<!-- report a.jsonl,b.jsonl summary -->\n<!-- end report -->"
    assert "Blocked" in embed_reports(block, tmp_path)


def test_load_skips_a_cut_last_line_saying_so_and_rejects_other_damage(tmp_path):
    path = tmp_path / "r.jsonl"
    _write(path, [row(ms=0.1)])
    assert load(path).warnings == []
    with path.open("a") as f:
        f.write('{"record": "row", "mode": "Bl')  # killed mid-write
    loaded = load(path)
    assert len(loaded.rows) == 1
    assert loaded.warnings == [f"{path}:3: skipped a truncated last line (its writer was stopped)"]
    path.write_text('{"record": "row"}\n')
    with pytest.raises(ValueError, match="not a gluon-survey results file"):
        load(path)
    path.write_text("garbage\n" + json.dumps(make_header("run", ENV, SETTINGS)) + "\n")
    with pytest.raises(ValueError, match=":1: not a JSON line"):
        load(path)


@pytest.mark.parametrize(
    ("old_ms", "new_ms", "verdict"),
    [
        (0.100, 0.1004, "same"),  # p20-p80 intervals (+-0.5 %) overlap
        (0.100, 0.090, "faster"),
        (0.100, 0.110, "slower"),
    ],
)
def test_compare_uses_the_measured_spread(old_ms, new_ms, verdict):
    (delta,) = compare([row(ms=old_ms)], [row(ms=new_ms)])
    assert delta.verdict == verdict
    assert delta.ratio == pytest.approx(old_ms / new_ms)


def test_compare_status_changes_and_unmatched_rows():
    old = [row(ms=0.1), row(K=1024, status="FAILED"), row(K=2048, ms=0.3)]
    new = [row(status="TIMEOUT"), row(K=1024, ms=0.2), row(K=4096, ms=0.4)]
    deltas = compare(old, new)
    assert [(d.new.K, d.verdict, d.ratio) for d in deltas] == [(512, "broken", None), (1024, "fixed", None)]


def test_missing_lists_old_rows_the_new_run_lacks():
    old = [row(ms=0.1), row(K=1024, ms=0.2), row(mode="torch", K=1024, ms=0.2)]
    new = [row(K=1024, status="TIMEOUT"), row(K=4096, ms=0.4)]
    assert [(r.mode, r.K) for r in missing(old, new)] == [("Blocked", 512), ("torch", 1024)]
    assert missing(old, []) == old and missing([], new) == []


def test_regressions_beyond_threshold():
    deltas = compare([row(ms=0.1), row(K=1024, ms=0.2)], [row(ms=0.11), row(K=1024, ms=0.26)])
    assert deltas[0].regression_pct() == pytest.approx(100 * (1 - 0.1 / 0.11))  # 9.1 % slower
    assert [d.new.K for d in regressions(deltas, 5)] == [512, 1024]
    assert [d.new.K for d in regressions(deltas, 10)] == [1024]  # 23 % slower
    assert regressions(deltas, 30) == []


def test_cli_compare_fail_on_regression_exit_code(tmp_path, capsys):
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    _write(old, [row(ms=0.1), row(mode="torch", ms=0.1)])
    _write(new, [row(ms=0.12), row(mode="torch", ms=0.1)])  # Blocked 16.7 % slower
    assert main(["compare", str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "slower" in out and "same" in out
    assert main(["compare", str(old), str(new), "--fail-on-regression", "10"]) == 1
    assert "regression: Blocked 8192x8192x512 fp16 B=row: 16.7 % slower" in capsys.readouterr().err
    assert main(["compare", str(old), str(new), "--fail-on-regression", "20"]) == 0
    assert main(["compare", str(old), str(tmp_path / "missing.jsonl")]) == 2


def test_fp8_and_fp8_row_results_are_kept_apart():
    def fp8(r, dtype):
        return replace(r, dtype=dtype, b_layout="t").with_metrics(1979.0)

    old = [fp8(row(ms=0.05), "fp8"), fp8(row(ms=0.05), "fp8-row"), row(ms=0.1)]
    new = [fp8(row(ms=0.05), "fp8"), fp8(row(ms=0.07), "fp8-row")]
    assert len({r.key for r in old}) == 3
    deltas = compare(old, new)
    assert [(d.new.dtype, d.verdict) for d in deltas] == [("fp8", "same"), ("fp8-row", "slower")]
    assert [(r.dtype, r.b_layout) for r in missing(old, new)] == [("fp16", "row")]
    assert old[0].pct_peak == pytest.approx(100 * old[0].tflops / 1979.0)


def test_a_layouts_are_kept_apart_and_old_rows_are_a_row(tmp_path):
    old = [row(ms=0.1), replace(row(ms=0.1), a_layout="t")]
    new = [replace(row(ms=0.2), a_layout="t")]
    assert len({r.key for r in old}) == 2 and [r.layouts for r in old] == ["B row", "A t, B row"]
    (delta,) = compare(old, new)
    assert delta.old.a_layout == "t" and delta.verdict == "slower"
    assert [r.a_layout for r in missing(old, new)] == ["row"]
    # a row written before A layouts were measured has no a_layout: it loads as A row
    path = tmp_path / "old.jsonl"
    record = row(ms=0.1).to_json()
    del record["a_layout"]
    header = {"record": "header", "schema": 1, "run_id": "run", "env": ENV, "settings": SETTINGS}
    path.write_text(json.dumps(header) + "\n" + json.dumps(record) + "\n")
    (loaded,) = load(path).rows
    assert loaded.a_layout == "row" and loaded.key == row(ms=0.1).key
