"""`gluon-survey model` end to end on a real GPU: a 2-layer Llama-3-8B-shaped model with random
weights, stock against patched, every step (static decode included) with tiny step lists; and tiny
2-layer Mixtral- and Qwen3-MoE-shaped models (a config.json written here), their experts on
"gluon_survey" against transformers' "grouped_mm" and "eager" (Hopper: the grouped kernel), with
static decode and --patch-linear against "grouped_mm". Checks the results file, not the speed:
every row measured, x_stock finite, and our model's logits and gradients as close to the fp32 copy
as the stock (baseline) model's. Run on the GPU machine: pytest -m gpu tests/test_model_gpu.py."""

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
    _assert_measured_and_agreeing(rows)
    assert all(r["ours_tok_s"] > 0 for r in rows if r["what"] == "decode")


TINY = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_experts_per_tok": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
}
TINY_MOE = {
    "mixtral": {"model_type": "mixtral", **TINY, "num_local_experts": 8},
    "qwen3-moe": {
        "model_type": "qwen3_moe",
        **TINY,
        "num_experts": 8,
        "moe_intermediate_size": 64,
        "norm_topk_prob": True,
    },
}


def _moe_run(tmp_path, capsys, name, *options):
    """The rows of a tiny MoE model's run (the header checked for 2 experts modules)."""
    pytest.importorskip("transformers")
    config, path = tmp_path / "config.json", tmp_path / "model.jsonl"
    config.write_text(json.dumps(TINY_MOE[name]))
    argv = ["model", "--config", str(config), "--layers", "2", "--prefill-tokens", "128"]
    argv += ["--decode-batch", "1,4", "--decode-tokens", "4", "--train-batch", "1x128"]
    argv += ["--repeats", "3", "--warmup", "1", "--results", str(path), *options]
    assert main(argv) == 0, capsys.readouterr().err
    header, *rows = (json.loads(line) for line in path.read_text().splitlines())
    assert header["settings"]["experts"] == 2, header["settings"]
    return header, rows


def _assert_measured_and_agreeing(rows):
    for r in rows:
        assert r["status"] == "OK" and r["error"] == "", r
        assert math.isfinite(r["x_stock"]) and r["x_stock"] > 0 and r["stock_ms"] > 0 and r["ours_ms"] > 0
        assert r["agreement"] == ("grads" if r["what"] == "train" else "logits")
        assert 0 < r["stock_err"] < 0.05, r
        assert r["ours_err"] <= 2 * r["stock_err"] + 1e-3, r


@pytest.mark.usefixtures("hopper_only")
@pytest.mark.parametrize("name", list(TINY_MOE))
def test_a_tiny_moe_model_against_grouped_mm_and_eager(tmp_path, capsys, name):
    header, rows = _moe_run(tmp_path, capsys, name)
    assert header["settings"]["baselines"] == ["grouped_mm", "eager"]
    assert header["settings"]["swapped"] == 0  # only the experts differ
    assert [(r["what"], r["batch"], r["mode"], r["baseline"]) for r in rows] == [
        (what, batch, "eager", base)
        for what, batch in (("prefill", 1), ("decode", 1), ("decode", 4), ("train", 1))
        for base in ("grouped_mm", "eager")
    ]
    _assert_measured_and_agreeing(rows)


@pytest.mark.usefixtures("hopper_only")
@pytest.mark.parametrize("name", list(TINY_MOE))
def test_a_tiny_moe_model_static_decode_with_its_linear_patched(tmp_path, capsys, name):
    options = ("--steps", "decode", "--compile", "static", "--moe-baseline", "grouped_mm", "--patch-linear")
    header, rows = _moe_run(tmp_path, capsys, name, *options)
    assert header["settings"]["swapped"] == 2 * 4 + 1  # q, k, v, o per layer; lm_head (routers: no Linear)
    assert [(r["batch"], r["mode"], r["baseline"]) for r in rows] == [
        (1, "static", "grouped_mm"),
        (4, "static", "grouped_mm"),
    ]
    _assert_measured_and_agreeing(rows)
