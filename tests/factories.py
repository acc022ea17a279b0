"""Rows and results files for the report, results and CLI tests (no GPU, no worker), and the
fields every `gluon-survey inspect --format json` row must have."""

from gluon_survey.driver.results import Results, ResultsWriter, Row, make_header
from gluon_survey.driver.shapes import Shape

ENV = {
    "name": "NVIDIA H100 80GB HBM3",
    "capability": [9, 0],
    "sm_count": 132,
    "l2_bytes": 50 << 20,
    "memory_bytes": 80 << 30,
    "sm_clock_mhz": 1980.0,
    "power_w": 120.5,
    "driver": "570.86.15",
    "cuda": "12.8",
    "torch": "2.9.0",
    "triton": "3.6.0",
    "python": "3.11.7",
    "git": {"commit": "0123456789abcdef", "dirty": False},
    "date": "2026-01-02T03:04:05+00:00",
    "host": "gpu-host",
    "command": "gluon-survey Blocked,torch",
}
SETTINGS = {
    "seed": 0,
    "warmup_ms": 100.0,
    "min_ms": 300.0,
    "min_iters": 20,
    "max_iters": 2000,
    "timer": "CUDA events around each iteration",
    "l2": "cold",
    "tolerance": "rel_err <= 2 * cublas_err + u / 4",
    "peaks": {"fp16": {"tflops": 989.4, "source": "NVIDIA H100 SXM datasheet, dense (fp16)"}},
}


def row(mode="Blocked", M=8192, N=8192, K=512, ms=None, status="OK", spread=0.01, **fields):
    """A row as the driver records it: `ms` sets a p20-p80 interval of +-spread/2 around it."""
    timing = {}
    if ms is not None:
        timing = dict(ms_median=ms, ms_p20=ms * (1 - spread / 2), ms_p80=ms * (1 + spread / 2), spread=spread)
    return Row(
        run_id="run",
        mode=mode,
        M=M,
        N=N,
        K=K,
        dtype="fp16",
        b_layout="row",
        status=status,
        **timing,
        **fields,
    ).with_metrics(989.4)


def results(rows):
    return Results(make_header("run", ENV, SETTINGS), list(rows))


def results_file(tmp_path, rows, name="r.jsonl"):
    """A results file in tmp_path holding `rows` under the factories' header, as a run writes it."""
    path = tmp_path / name
    sample = results(rows)
    with ResultsWriter(path, sample.header) as writer:
        for r in sample.rows:
            writer.append(r)
    return path


def tflops(M, N, K, ms):
    return Shape(M, N, K).tflops(ms)


# What `inspect --format json` promises for every row (the list plus our extras).
INSPECT_JSON_KEYS = {
    "mode",
    "arch",
    "kernel",
    "num_warps",
    "registers",
    "spill_bytes",
    "shared_bytes",
    "sass",
    "ptx_maxnreg",
    "setmaxnreg",
    "tmem_cols",
    "error",
}
