"""The timing command on grouped shapes, end to end on a GPU: a CSV of one model's expert GEMMs
(Qwen3-30B-A3B's gate_up and down, E 128, top-8, at T 16 and 512, uniform and half routing)
through real worker processes. torch._grouped_mm and the cuBLAS loop are measured on any GPU; the
grouped kernel on Hopper (SKIPPED elsewhere, saying why); the dense `torch` mode's cells are
SKIPPED. Short windows: this checks the path, not the numbers.
Run on the GPU machine: pytest -m gpu tests/test_moe_driver_gpu.py."""

from __future__ import annotations

import pytest
import torch

from gluon_survey import grouped_auto
from gluon_survey.driver.cli import main
from gluon_survey.driver.results import load
from gluon_survey.driver.shapes import GroupedShape, routing_counts

pytestmark = pytest.mark.gpu

SHAPES = [
    GroupedShape(t, n, k, 128, 8, routing)
    for n, k in ((1536, 2048), (2048, 768))  # gate_up (N = 2 * 768, K = 2048), down
    for routing in ("uniform", "half")
    for t in (16, 512)
]


def test_a_tiny_grouped_sweep_runs_end_to_end(tmp_path, capsys):
    csv, path = tmp_path / "moe.csv", tmp_path / "r.jsonl"
    lines = [f"{s.T},{s.N},{s.K},{s.E},{s.topk},{s.routing}" for s in SHAPES]
    csv.write_text("T,N,K,E,topk,routing\n" + "\n".join(lines) + "\n")
    argv = ["grouped,grouped_mm,cublas-loop,torch", "--shapes", str(csv), "--dtype", "bf16", "--seed", "5"]
    argv += ["--warmup-ms", "50", "--min-ms", "50", "--rounds", "2", "--format", "markdown"]
    status = main([*argv, "--results", str(path), "--plot", str(tmp_path / "moe.png")])
    out = capsys.readouterr().out
    rows = {(r.mode, r.shape): r for r in load(path).rows}
    assert len(rows) == 4 * len(SHAPES)
    hopper = torch.cuda.get_device_capability()[0] == 9
    for shape in SHAPES:
        counts = routing_counts(shape, seed=5)
        for mode in ("grouped", "grouped_mm", "cublas-loop"):
            r = rows[(mode, shape)]
            if mode == "grouped" and not hopper:
                assert r.status == "SKIPPED" and "sm_90" in r.error
                continue
            assert r.status == "OK", (mode, shape.label, r.error)
            assert r.counts == counts and (r.E, r.topk, r.routing, r.b_layout) == (128, 8, shape.routing, "t")
            assert r.rel_err <= r.tol and r.tflops > 0
            assert (mode == "grouped_mm") == (r.x_rounds is None)  # the reference is not paired with itself
        dense = rows[("torch", shape)]
        assert dense.status == "SKIPPED" and "computes dense GEMMs" in dense.error
    assert status == 0
    assert (
        "| N x K, experts E, top-k, tokens T, routing |" in out and "1536x2048 E=128 top-8 T=512 half" in out
    )
    assert (tmp_path / "moe.png").read_bytes()[:4] == b"\x89PNG"


def test_a_tiny_grouped_fp8_row_sweep_runs_against_scaled_grouped_mm(tmp_path, capsys, monkeypatch):
    """The same shapes in fp8-row: e4m3 operands with a scale per token and per expert channel,
    torch._scaled_grouped_mm the reference (unpaired, as the reference is), the grouped kernel,
    what grouped_matmul runs and the cuBLAS loop (torch._scaled_mm per expert) paired with it.
    (Naming torch._grouped_mm too, which has no fp8, is a usage error: tests/test_cli.py.)"""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the grouped kernel runs on sm_90 only, and its fp8 baseline on sm_90 and sm_100")
    csv, path = tmp_path / "moe.csv", tmp_path / "r.jsonl"
    lines = [f"{s.T},{s.N},{s.K},{s.E},{s.topk},{s.routing}" for s in SHAPES]
    csv.write_text("T,N,K,E,topk,routing\n" + "\n".join(lines) + "\n")
    monkeypatch.setenv("GLUON_SURVEY_FP8_SWAPAB", "1")  # the workers' grouped-auto: fp8 on swap-AB too
    argv = ["grouped,grouped-auto,scaled_grouped_mm,cublas-loop", "--shapes", str(csv), "--dtype", "fp8-row"]
    argv += ["--seed", "5", "--warmup-ms", "50", "--min-ms", "50", "--rounds", "2", "--format", "markdown"]
    status = main([*argv, "--results", str(path)])
    out = capsys.readouterr().out
    rows = {(r.mode, r.shape): r for r in load(path).rows}
    assert len(rows) == 4 * len(SHAPES)
    for shape in SHAPES:
        for mode in ("grouped", "grouped-auto", "scaled_grouped_mm", "cublas-loop"):
            r = rows[(mode, shape)]
            assert r.status == "OK", (mode, shape.label, r.error)
            assert r.dtype == "fp8-row" and r.rel_err <= r.tol and r.tflops > 0
            # the reference is not paired with itself
            assert (mode == "scaled_grouped_mm") == (r.x_rounds is None)
        # fp8 as 16-bit: the swap-AB kernel up to DECODE_ROWS token-slots (T = 16: 128), the 128-row one above
        expected = "grouped-swapab" if shape.T * shape.topk <= grouped_auto.DECODE_ROWS else "grouped"
        assert rows[("grouped-auto", shape)].config["mode"] == expected
    assert status == 0
    assert "x torch._scaled_grouped_mm" in out
