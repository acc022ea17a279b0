"""`gluon-survey model` end to end on a real GPU: a 2-layer Llama-3-8B-shaped model with random
weights, stock against patched, every step (static decode included) with tiny step lists. Checks
the results file, not the speed: every row measured, x_stock finite, and the patched model's
logits and gradients as close to the fp32 copy as the stock model's. Run on the GPU machine:
pytest -m gpu tests/test_model_gpu.py."""

from __future__ import annotations

import json
import math

import pytest

from gluon_survey.driver.cli import main

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("hopper_or_blackwell")]


def test_a_two_layer_llama_end_to_end(tmp_path, capsys):
    pytest.importorskip("transformers")
    path = tmp_path / "model.jsonl"
    argv = ["model", "--config", "llama3-8b", "--layers", "2", "--prefill-tokens", "128"]
    argv += ["--decode-batch", "1,4", "--decode-tokens", "4", "--train-batch", "1x128"]
    argv += ["--compile", "eager,static", "--repeats", "3", "--warmup", "1", "--results", str(path)]
    assert main(argv) == 0, capsys.readouterr().err
    header, *rows = (json.loads(line) for line in path.read_text().splitlines())
    assert header["settings"]["swapped"] == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer; lm_head
    assert [(r["what"], r["batch"], r["mode"]) for r in rows] == [
        ("prefill", 1, "eager"),
        ("decode", 1, "eager"),
        ("decode", 4, "eager"),
        ("decode", 1, "static"),
        ("decode", 4, "static"),
        ("train", 1, "eager"),
    ]
    for r in rows:
        assert r["status"] == "OK" and r["error"] == "", r
        assert math.isfinite(r["x_stock"]) and r["x_stock"] > 0 and r["stock_ms"] > 0 and r["ours_ms"] > 0
        assert r["agreement"] == ("grads" if r["what"] == "train" else "logits")
        assert 0 < r["stock_err"] < 0.05, r
        assert r["ours_err"] <= 2 * r["stock_err"] + 1e-3, r
    assert all(r["ours_tok_s"] > 0 for r in rows if r["what"] == "decode")
