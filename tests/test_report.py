import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from factories import results, row
from gluon_survey.driver import report
from gluon_survey.driver.cli import main
from gluon_survey.driver.results import ResultsWriter

BLOCKS = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "stages": 3, "warps": 8}


@pytest.fixture
def sample():
    """Blocked (2 measured, 1 FAILED), torch (3 measured, no blocks), persistent (1 above peak)."""
    return results(
        [
            row("Blocked", K=512, ms=0.1, config=BLOCKS),  # 687.19 TFLOP/s
            row("Blocked", K=1024, ms=0.2, config=BLOCKS),  # 687.19
            row("Blocked", K=2048, status="FAILED", error="rel_err 0.5 > tol 0.001", config=BLOCKS),
            row("torch", K=512, ms=0.08),  # 858.99
            row("torch", K=1024, ms=0.16),  # 858.99
            row("torch", K=2048, ms=0.5),  # 549.76
            row("persistent", K=512, ms=0.05, config=BLOCKS),  # 1374 > 989.4 peak
        ]
    )


LEGACY = """\
Mode: Blocked (fp16, B row, M=8192, N=8192)
K, BLOCK_M, BLOCK_N, BLOCK_K, ms, TFLOPs/sec
512, 128, 256, 64, 0.1000, 687.19
1024, 128, 256, 64, 0.2000, 687.19

Mode: torch (fp16, B row, M=8192, N=8192)
K, BLOCK_M, BLOCK_N, BLOCK_K, ms, TFLOPs/sec
512, 0, 0, 0, 0.0800, 858.99
1024, 0, 0, 0, 0.1600, 858.99
2048, 0, 0, 0, 0.5000, 549.76

Mode: persistent (fp16, B row, M=8192, N=8192)
K, BLOCK_M, BLOCK_N, BLOCK_K, ms, TFLOPs/sec

"""


def test_legacy_lines_byte_for_byte(sample):
    assert report.format_legacy(sample.rows) == LEGACY


def test_legacy_headers_tell_dtypes_layouts_and_sizes_apart():
    rows = [row("Blocked", ms=0.1), replace(row("Blocked", ms=0.1), dtype="bf16")]
    rows += [replace(row("Blocked", M=4096, ms=0.05), b_layout="t")]
    headers = [line for line in report.format_legacy(rows).splitlines() if line.startswith("Mode: ")]
    assert headers == [
        "Mode: Blocked (fp16, B row, M=8192, N=8192)",
        "Mode: Blocked (bf16, B row, M=8192, N=8192)",
        "Mode: Blocked (fp16, B t, M=4096, N=8192)",
    ]


def test_legacy_on_stdout_is_nothing_but_the_lines(sample, tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path, sample.header) as writer:
        for r in sample.rows:
            writer.append(r)
    assert main(["report", str(path), "--format", "legacy"]) == 0
    captured = capsys.readouterr()
    assert captured.out == LEGACY
    assert "Blocked 8192x8192x2048: FAILED" in captured.err
    assert "persistent 8192x8192x512: ABOVE PEAK" in captured.err


def test_x_cublas_and_geomean(sample):
    rows = {(r.mode, r.K): r for r in report.attach_x_cublas(sample.rows)}
    assert rows["Blocked", 512].x_cublas == pytest.approx(0.8)
    assert rows["torch", 512].x_cublas == pytest.approx(1.0)
    assert rows["Blocked", 2048].x_cublas is None  # FAILED
    assert rows["persistent", 512].x_cublas is None  # above peak: not a measurement
    assert report.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert report.geomean([]) is None


def test_pivot_cells_geomean_and_notes(sample):
    (pivot,) = report.pivots(sample)
    assert pivot.title == "fp16, B row"
    assert pivot.modes == ["Blocked", "torch", "persistent"]
    assert [s.K for s in pivot.shapes] == [512, 1024, 2048]
    blocked = pivot.cells[(pivot.shapes[0], "Blocked")]
    assert blocked.lines == ["687.2", "0.80x", "128x256x64"] and not blocked.best
    assert pivot.cells[(pivot.shapes[0], "torch")].best
    assert pivot.cells[(pivot.shapes[0], "persistent")].lines == ["ABOVE PEAK", "1374?"]
    assert pivot.cells[(pivot.shapes[2], "Blocked")].lines[0] == "FAILED"
    assert pivot.geomean["Blocked"].lines == ["687.2", "0.80x", "69% peak", "(2/3 shapes)"]
    assert pivot.geomean["persistent"].lines == ["-"]  # the above-peak row is not a record
    assert "Blocked FAILED on 8192x8192x2048: rel_err 0.5 > tol 0.001" in pivot.notes
    assert any(n.startswith("persistent ABOVE PEAK") for n in pivot.notes)


def test_rich_table_has_environment_cells_and_geomean(sample):
    buf = io.StringIO()
    report.print_table(sample, Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert "GPU: NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, L2 50 MiB, 81920 MiB)" in text
    assert "commit 0123456789ab" in text and "Peak fp16: 989.4 TFLOP/s" in text
    for expected in ("geomean", "687.2", "0.80x", "128x256x64", "ABOVE PEAK", "FAILED", "859.0"):
        assert expected in text


def test_csv_parses_back(sample):
    text = report.format_csv(sample)
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert comments[0].startswith("# GPU: NVIDIA H100 80GB HBM3")
    assert any("Command: gluon-survey Blocked,torch" in c for c in comments)
    reader = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    assert reader.fieldnames == report.CSV_COLUMNS
    rows = list(reader)
    assert len(rows) == len(sample.rows)
    first = rows[0]
    assert (first["mode"], first["K"], first["BLOCK_M"], first["status"]) == ("Blocked", "512", "128", "OK")
    assert float(first["x_cublas"]) == pytest.approx(0.8)
    assert json.loads(first["config"]) == BLOCKS
    assert "ABOVE_PEAK" in rows[-1]["flags"]
    assert rows[2]["error"] == "rel_err 0.5 > tol 0.001"


def test_json_parses_back(sample):
    data = json.loads(report.format_json(sample))
    assert data["schema"] == 1 and data["env"]["sm_count"] == 132
    assert data["settings"]["peaks"]["fp16"]["tflops"] == 989.4
    assert [r["mode"] for r in data["rows"]] == [r.mode for r in sample.rows]
    assert data["rows"][0]["x_cublas"] == pytest.approx(0.8)
    assert data["rows"][-1]["flags"] == ["ABOVE_PEAK: measurement error"]


def test_markdown_parses_back(sample):
    lines = report.format_markdown(sample).splitlines()
    assert "- GPU: NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, L2 50 MiB, 81920 MiB)" in lines
    table = [line for line in lines if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    assert cells[0] == ["M x N x K", "Blocked", "torch", "persistent"]
    assert cells[2] == [
        "8192x8192x512",
        "687.2<br>0.80x<br>128x256x64",
        "**859.0**<br>1.00x",
        "ABOVE PEAK<br>1374?",
    ]
    assert cells[-1][0] == "geomean" and cells[-1][1].startswith("687.2<br>0.80x")
    assert len(table) == 2 + 3 + 1  # header, rule, 3 shapes, geomean


@pytest.mark.parametrize("fmt", ["csv", "json", "markdown", "table"])
def test_render_to_file(sample, tmp_path, fmt):
    path = tmp_path / f"report.{fmt}"
    report.render(sample, fmt, path)
    assert "NVIDIA H100" in path.read_text()


def test_plot_writes_a_png(sample, tmp_path):
    path = tmp_path / "plot.png"
    assert report.plot(sample, path) == 1
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    nothing = results([row(status="SKIPPED", error="needs sm_90")])
    assert report.plot(nothing, tmp_path / "none.png") == 0
    assert not (tmp_path / "none.png").exists()


def test_a_shapes_run_plots_x_cublas_against_m(tmp_path, monkeypatch):
    """`--shapes` runs: a panel per (dtype, layout, mode) but cuBLAS, x cuBLAS per weight against
    M, the geomean over the weights at each M."""
    rows = [
        row(mode, M=m, N=n, K=k, ms=ms)
        for n, k in ((4096, 4096), (4096, 14336))
        for m in (1, 16, 128)
        for mode, ms in (("torch", 0.2), ("auto", 0.1), ("swapab", 0.4))  # under the dense peak
    ]
    shapes = results(rows)
    shapes.header["settings"] = {**shapes.settings, "shapes": "--shapes llm"}
    drawn = []
    monkeypatch.setattr(report, "geomean", lambda values: drawn.append(list(values)) or 1.0)
    path = tmp_path / "by-m.png"
    assert report.plot(shapes, path) == 2  # auto and swapab, fp16, row
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn == [[2.0, 2.0]] * 3 + [[0.5, 0.5]] * 3  # two weights at each M, per panel
    only_cublas = results([row("torch", M=1, ms=0.02)])
    only_cublas.header["settings"] = shapes.settings
    assert report.plot(only_cublas, tmp_path / "none.png") == 0
    assert not (tmp_path / "none.png").exists()


def test_a_shapes_run_plots_each_weight_with_a_line_per_mode(tmp_path, monkeypatch):
    """`by="weight"`: a panel per (dtype, layout, weight), a line per mode but cuBLAS at the
    weight's token counts with its x cuBLAS, each mode in one colour across the panels."""
    rows = [
        row(mode, M=m, N=n, K=k, ms=ms)
        for n, k in ((4096, 4096), (4096, 14336))
        for m in (1, 16, 128)
        for mode, ms in (("torch", 0.2), ("auto", 0.1), ("swapab", 0.4))
    ]
    rows.append(row("splitk", M=16, N=4096, K=14336, ms=0.8))  # a mode on one weight only
    shapes = results(rows)
    shapes.header["settings"] = {**shapes.settings, "shapes": "--shapes llm-dense"}
    drawn = {}
    monkeypatch.setattr(report, "_save", lambda fig, axes, *_, **__: drawn.update(fig=fig))
    assert report.plot(shapes, tmp_path / "w.png", by="weight") == 2
    panels = [ax for ax in drawn["fig"].axes if ax.get_visible()]
    lines = {ax.get_title(): {ln.get_label(): ln for ln in ax.get_lines()} for ax in panels}
    assert sorted(lines) == [
        "4096x14336 fp16 B=row: a line per mode",
        "4096x4096 fp16 B=row: a line per mode",
    ]
    wide = lines["4096x14336 fp16 B=row: a line per mode"]
    assert [label for label in wide if not label.startswith("_")] == ["auto", "swapab", "splitk", "cuBLAS"]
    assert list(wide["auto"].get_xdata()) == [1, 16, 128] and list(wide["auto"].get_ydata()) == [2.0] * 3
    assert list(wide["splitk"].get_xdata()) == [16] and list(wide["splitk"].get_ydata()) == [0.25]
    square = lines["4096x4096 fp16 B=row: a line per mode"]
    assert "splitk" not in square and square["swapab"].get_color() == wide["swapab"].get_color()
    with pytest.raises(ValueError, match="plot by one of mode, weight"):
        report.plot(shapes, tmp_path / "x.png", by="shape")


def test_paired_rounds_are_preferred_and_named_in_the_legend(sample):
    paired = results(
        [
            row("Blocked", K=512, ms=0.1, cublas_ms=0.09, x_rounds=[1.3, 0.9, 1.1], config=BLOCKS),
            row("Blocked", K=1024, ms=0.2, config=BLOCKS),  # no rounds: the torch row
            row("Blocked", K=2048, ms=0.4, cublas_ms=0.3, config=BLOCKS),  # cuBLAS's median alone
            row("torch", K=512, ms=0.08),
            row("torch", K=1024, ms=0.16),
            row("torch", K=2048, ms=0.32),
        ]
    )
    rows = {(r.mode, r.K): r for r in report.attach_x_cublas(paired.rows)}
    # the median of the per-round ratios, whatever the pooled medians (0.09 / 0.1) say
    assert rows["Blocked", 512].x_cublas == pytest.approx(1.1)
    assert rows["Blocked", 1024].x_cublas == pytest.approx(0.8)
    assert rows["Blocked", 2048].x_cublas == pytest.approx(0.8)  # not 0.3 / 0.4: no rounds, no pairing
    assert rows["Blocked", 2048].cublas_ms == 0.3  # kept as recorded
    legend = "in windows alternating with each cell's, median over 3 rounds"
    assert legend in report.legend(paired.rows) and legend in report.format_markdown(paired)
    assert "the torch row of the same shape" in report.legend(sample.rows)
    unpaired = [replace(r, x_rounds=None) for r in paired.rows]  # cublas_ms alone does not pair a run
    assert "the torch row of the same shape" in report.legend(unpaired)
    # cells that took extra rounds (the timer's `noisy_rounds`): the legend gives the range
    (three,) = [r for r in paired.rows if r.x_rounds]
    assert len(three.x_rounds) == 3
    assert "median over 3-9 rounds" in report.legend([three, replace(three, K=4096, x_rounds=[1.1] * 9)])


@pytest.mark.parametrize(("noisy_rounds", "extra"), [(9, True), (3, False), (None, False)])
def test_the_settings_line_says_how_many_rounds_a_noisy_cell_may_take(noisy_rounds, extra):
    settings = {"paired": True, "rounds": 3}
    if noisy_rounds is not None:  # results files written before the timer's extra rounds lack it
        settings["noisy_rounds"] = noisy_rounds
    (paired,) = [line for line in report._settings_lines(settings) if line.startswith("Paired: ")]
    assert paired.startswith("Paired: each cell in 3 windows of that length, alternating with 4 of cuBLAS's")
    assert ("up to 9 of each while either side's samples spread over 5 %" in paired) == extra


def test_the_settings_line_says_when_the_calls_were_interleaved():
    settings = {"paired": True, "rounds": 3, "noisy_rounds": 9, "interleave": True}
    (paired,) = [line for line in report._settings_lines(settings) if line.startswith("Paired")]
    assert paired.startswith("Paired, interleaved: each cell in 3 windows of that length, its calls taken")
    assert "up to 9 windows while either side's samples spread over 5 %" in paired


def test_the_settings_line_says_the_pairing_goes_by_call_length():
    settings = {"paired": True, "rounds": 3, "noisy_rounds": 9, "interleave": None}
    settings["interleave_below_ms"] = 0.06
    (paired,) = [line for line in report._settings_lines(settings) if line.startswith("Paired")]
    assert "under 60 µs, a window of that length of its calls and cuBLAS's in turn" in paired
    assert "otherwise a window alternating with 4 of cuBLAS's, up to 9 rounds" in paired
    del settings["interleave"]  # a header from before the choice: alternating throughout
    (paired,) = [line for line in report._settings_lines(settings) if line.startswith("Paired")]
    assert paired.startswith("Paired: each cell in 3 windows of that length, alternating with 4")


RESULTS = Path(__file__).resolve().parent.parent / "results"


@pytest.mark.parametrize("run", sorted(p.parent.name for p in RESULTS.glob("*/results.jsonl")))
def test_committed_tables_regenerate_identically(run):
    """Every committed run's table.md is its results file rendered by `report --format markdown`."""
    from gluon_survey.driver.results import load

    folder = RESULTS / run
    assert report.format_markdown(load(folder / "results.jsonl")) == (folder / "table.md").read_text()


def _fp8(r, dtype, peak=1979.0):
    """`r` as an fp8 / fp8-row row (B layout t), its metrics against the fp8 peak."""
    return replace(r, dtype=dtype, b_layout="t").with_metrics(peak)


def test_fp8_rows_get_tables_of_their_own_against_the_fp8_peak():
    fp8_peak = {"tflops": 1979.0, "source": "NVIDIA H100 SXM datasheet, dense (fp8)"}
    sample = results(
        [
            row("Pipelined", ms=0.1),  # fp16, B row: 687.19 TFLOP/s
            row("torch", ms=0.08),
            _fp8(row("Pipelined", ms=0.05), "fp8"),  # 1374.39 TFLOP/s: above the fp16 peak, not fp8's
            _fp8(row("torch", ms=0.04), "fp8"),  # 1717.99
            _fp8(row("Pipelined", ms=0.0625), "fp8-row"),  # 1099.51
            _fp8(row("torch", ms=0.05), "fp8-row"),
        ]
    )
    sample.settings["peaks"] = {**sample.settings["peaks"], "fp8": fp8_peak, "fp8-row": fp8_peak}
    pivots = report.pivots(sample)
    assert [p.title for p in pivots] == ["fp16, B row", "fp8, B t", "fp8-row, B t"]
    fp8, fp8_row = pivots[1], pivots[2]
    assert fp8.geomean["Pipelined"].lines == ["1374.4", "0.80x", f"{100 * 1374.39 / 1979:.0f}% peak"]
    assert fp8_row.geomean["Pipelined"].lines == ["1099.5", "0.80x", f"{100 * 1099.51 / 1979:.0f}% peak"]
    assert all(r.measured for r in sample.rows)  # not ABOVE PEAK: fp8 has its own peak
    text = report.format_markdown(sample)
    assert "#### fp8, B t" in text and "#### fp8-row, B t" in text
    headers = [line for line in report.format_legacy(sample.rows).splitlines() if line.startswith("Mode: ")]
    assert headers[2:4] == [
        "Mode: Pipelined (fp8, B t, M=8192, N=8192)",
        "Mode: torch (fp8, B t, M=8192, N=8192)",
    ]
    buf = io.StringIO()
    report.print_table(sample, Console(file=buf, width=200, color_system=None))
    assert "Peak fp8-row: 1979 TFLOP/s (NVIDIA H100 SXM datasheet, dense (fp8))" in buf.getvalue()


# ------------------------------------------------------------------------------------------------
# GB/s, and runs timed in GPU time (--gpu-time: settings `queued`)


@pytest.mark.parametrize(("dtype", "operand_bytes"), [("fp16", 2), ("bf16", 2), ("fp8", 1), ("fp8-row", 1)])
def test_gbps_counts_the_bytes_of_a_b_and_c(dtype, operand_bytes):
    r = replace(row(M=16, N=4096, K=4096, ms=0.011), dtype=dtype).with_metrics(None)
    moved = (16 * 4096 + 4096 * 4096) * operand_bytes + 16 * 4096 * 2  # C is 16-bit in every dtype
    assert r.gbps == pytest.approx(moved / 0.011e-3 / 1e9)
    assert replace(r, dtype="fp64").with_metrics(None).gbps is None  # an unknown dtype: no figure


def _queued(rows):
    from factories import ENV, SETTINGS
    from gluon_survey.driver.results import Results, make_header

    return Results(make_header("run", ENV, {**SETTINGS, "queued": True}), list(rows))


def test_a_run_timed_in_gpu_time_shows_gb_s_and_says_so():
    decode = [
        row("Blocked", M=16, N=4096, K=4096, ms=0.011, config=BLOCKS),
        row("torch", M=16, N=4096, K=4096, ms=0.012),
    ]
    (pivot,) = report.pivots(_queued(decode))
    assert pivot.title == "fp16, B row, GPU time (queued)"
    blocked = pivot.cells[(decode[0].shape, "Blocked")]
    assert blocked.lines == [
        "48.8",
        "1.09x",
        "3074 GB/s",
        "128x256x64",
    ]  # (16 + 4096) x 4096 x 2 + 16 x 4096 x 2 B
    text = report.format_markdown(_queued(decode))
    assert "#### fp16, B row, GPU time (queued)" in text and "<br>3074 GB/s<br>" in text
    assert "GB/s of A, B and C over the median GPU time (queued)" in text
    # timed per call, the same rows show no GB/s (a launch-bound call would show the host's rate)
    (per_call,) = report.pivots(results(decode))
    assert per_call.title == "fp16, B row" and not any(
        "GB/s" in line for c in per_call.cells.values() for line in c.lines
    )
    assert "GB/s" not in report.format_markdown(results(decode))


def test_calls_the_host_fell_behind_on_are_noted():
    rows = [
        row("Blocked", M=16, N=4096, K=4096, ms=0.011, starved=3, n_iters=2000, cublas_starved=0),
        row("Pipelined", M=16, N=4096, K=4096, ms=0.011, starved=0, n_iters=2000, cublas_starved=7),
        row("persistent", M=16, N=4096, K=4096, ms=0.011, starved=0, n_iters=2000, cublas_starved=0),
    ]
    (pivot,) = report.pivots(_queued(rows))
    behind = [n for n in pivot.notes if "fell behind" in n]
    assert behind == [
        "Blocked on 16x4096x4096: the host fell behind the GPU in 3 of its 2000 timed calls "
        "(their times may include the GPU waiting for it)",
        "Pipelined on 16x4096x4096: the host fell behind the GPU in 7 of cuBLAS's alongside "
        "(their times may include the GPU waiting for it)",
    ]


def test_summary_is_one_table_of_geomeans_per_dtype_and_mode():
    """`format_summary`: a row per (dtype, layout, mode) but cuBLAS's own, geomean TFLOP/s and x
    cuBLAS over the measured shapes, x cuBLAS per M where the run has several, the lowest cell."""
    rows = [
        row("auto", M=1, ms=0.01),
        row("torch", M=1, ms=0.02),  # auto 2.0x
        row("auto", M=16, ms=0.04),
        row("torch", M=16, ms=0.02),  # auto 0.5x
        row("auto", M=16, K=1024, status="FAILED", error="rel_err"),
        row("torch", M=16, K=1024, ms=0.02),
    ]
    lines = report.format_summary(results(rows)).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert cells[0] == ["dtype, B", "mode", "TFLOP/s", "x cuBLAS", "M = 1", "M = 16", "lowest x cuBLAS"]
    assert len(cells) == 3  # header, rule, auto: torch's row and the FAILED cell are not in it
    assert cells[2][:2] == ["fp16, B row", "auto"]
    assert cells[2][3:] == ["**1.000x**", "2.00x", "0.50x", "0.50x (16x8192x512)"]


def test_a_summary_block_embeds_the_summary(tmp_path):
    import shutil

    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "results/h100-ladder/results.jsonl", tmp_path / "r.jsonl")
    doc = "<!-- report r.jsonl summary -->\nold\n<!-- end report -->\n"
    out = report.embed_reports(doc, tmp_path)
    assert "| fp16, B row | warpspec |" in out and "####" not in out and "old" not in out
    assert report.embed_reports(out, tmp_path) == out


# ------------------------------------------------------------------------------------------------
# Grouped rows (--shapes moe): labels with E, top-k, T and routing; torch._grouped_mm the reference


def grouped_row(mode, T, ms, routing="zipf", **fields):
    """A grouped row of a Qwen3-30B-A3B down projection (E 128, top-8) at T tokens."""
    return replace(
        row(mode, M=T * 8, N=2048, K=768, ms=ms, E=128, topk=8, routing=routing, **fields), b_layout="t"
    )


@pytest.fixture
def grouped_sample():
    return results(
        [
            grouped_row("grouped", 16, 0.01),
            grouped_row("grouped_mm", 16, 0.02),  # grouped 2.0x
            grouped_row("grouped", 512, 0.04),
            grouped_row("grouped_mm", 512, 0.02),  # grouped 0.5x
            grouped_row("grouped", 4096, None, status="FAILED", error="rel_err 0.9 > tol 0.01"),
            grouped_row("torch", 16, 0.001, status="SKIPPED", error="mode 'torch' computes dense GEMMs"),
        ]
    )


def test_grouped_rows_are_measured_against_grouped_mm_not_cublas(grouped_sample):
    got = {(r.mode, r.shape.tokens): r.x_cublas for r in report.attach_x_cublas(grouped_sample.rows)}
    assert got[("grouped", 16)] == pytest.approx(2.0) and got[("grouped", 512)] == pytest.approx(0.5)
    assert got[("grouped_mm", 16)] == pytest.approx(1.0) and got[("grouped", 4096)] is None
    dense_torch_alone = results(
        [row("torch", M=128, N=2048, K=768, ms=0.001), grouped_row("grouped", 16, 0.01)]
    )
    assert [r.x_cublas for r in report.attach_x_cublas(dense_torch_alone.rows)] == [1.0, None]


def test_grouped_tables_label_shapes_with_experts_top_k_tokens_and_routing(grouped_sample):
    (pivot,) = report.pivots(grouped_sample)
    assert pivot.shape_header == "N x K, experts E, top-k, tokens T, routing"
    assert [s.label for s in pivot.shapes] == [f"2048x768 E=128 top-8 T={t} zipf" for t in (16, 512, 4096)]
    md = report.format_markdown(grouped_sample)
    assert "| N x K, experts E, top-k, tokens T, routing | grouped | grouped_mm | torch |" in md
    assert (
        "| 2048x768 E=128 top-8 T=16 zipf | **40.3**<br>2.00x | 20.1<br>1.00x | SKIPPED<br>mode 'torch'" in md
    )
    assert "x torch._grouped_mm (the grouped_mm row of the same shape)" in md
    assert "grouped FAILED on 2048x768 E=128 top-8 T=4096 zipf: rel_err 0.9 > tol 0.01" in md
    buf = io.StringIO()
    report.print_table(grouped_sample, Console(file=buf, width=200))
    assert "N x K, experts E, top-k, tokens T, routing" in buf.getvalue()


def test_grouped_summary_goes_by_tokens_and_legacy_blocks_keep_routings_apart(grouped_sample):
    cells = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in report.format_summary(grouped_sample).splitlines()
    ]
    assert cells[0] == [
        "dtype, B",
        "mode",
        "TFLOP/s",
        "x cuBLAS",
        "T = 16",
        "T = 512",
        "T = 4096",
        "lowest x cuBLAS",
    ]
    assert [c[1] for c in cells[2:]] == ["grouped"]  # grouped_mm, the reference, is left out as cuBLAS is
    assert cells[2][4:] == ["2.00x", "0.50x", "-", "0.50x (2048x768 E=128 top-8 T=512 zipf)"]
    uniform = results([grouped_row("grouped", 16, 0.01, routing="uniform"), grouped_row("grouped", 16, 0.03)])
    legacy = report.format_legacy(uniform.rows).splitlines()
    assert [line for line in legacy if line.startswith("Mode:")] == [
        "Mode: grouped (fp16, B t, M=128, N=2048, E=128, top-8, uniform)",
        "Mode: grouped (fp16, B t, M=128, N=2048, E=128, top-8, zipf)",
    ]


def test_a_grouped_run_plots_x_grouped_mm_against_tokens(grouped_sample, tmp_path):
    grouped_sample.header["settings"] = {**grouped_sample.settings, "shapes": "--shapes moe"}
    assert report.plot(grouped_sample, tmp_path / "moe.png") == 1  # the grouped mode's panel
    assert (tmp_path / "moe.png").read_bytes()[:4] == b"\x89PNG"


def test_grouped_rows_round_trip_and_compare_by_routing(tmp_path):
    from factories import results_file
    from gluon_survey.driver.results import compare, load

    rows = [
        grouped_row("grouped", 16, 0.01, counts=[1] * 128),
        grouped_row("grouped", 16, 0.02, routing="half"),
    ]
    loaded = load(results_file(tmp_path, rows)).rows
    assert loaded == rows and loaded[0].counts == [1] * 128 and loaded[0].shape.routing == "zipf"
    assert [d.verdict for d in compare(loaded, loaded[::-1])] == ["same", "same"]  # matched by routing


def test_a_t_rows_get_tables_of_their_own_named_by_the_layout_pair():
    """Rows in A layout "t" pivot apart from A-row rows of the same shape: their titles, the
    summary's first column (then headed "dtype, layouts"), x cuBLAS against the cuBLAS row of the
    same layouts; an A-row run renders as it always has."""
    plain = [row("auto", M=16, ms=0.01), row("torch", M=16, ms=0.02)]
    t = [replace(r, a_layout="t") for r in (row("auto", M=16, ms=0.04), row("torch", M=16, ms=0.02))]
    run = results(plain + t)
    pivots = report.pivots(run)
    assert [p.title for p in pivots] == ["fp16, B row", "fp16, A t, B row"]
    x = {(r.a_layout, r.mode): r.x_cublas for r in report.attach_x_cublas(run.rows)}
    assert x[("row", "auto")] == pytest.approx(2.0) and x[("t", "auto")] == pytest.approx(0.5)
    cells = [
        [c.strip() for c in line.strip("|").split("|")] for line in report.format_summary(run).splitlines()
    ]
    assert cells[0][0] == "dtype, layouts"
    assert [c[:2] for c in cells[2:]] == [["fp16, B row", "auto"], ["fp16, A t, B row", "auto"]]
    assert report.format_summary(results(plain)).startswith("| dtype, B |")
    assert "#### fp16, A t, B row" in report.format_markdown(run)
