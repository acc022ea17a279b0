"""`gluon-survey model` without a GPU or transformers: its arguments and every error before the
model is built, the named architectures, and the rows' arithmetic and results file with a fake
timer and fake models (nothing real is timed)."""

from __future__ import annotations

import json
import math
import sys
import types

import pytest
import torch

from gluon_survey.driver import model
from gluon_survey.driver.cli import main

BASE = ["--config", "llama3-8b", "--layers", "2"]


@pytest.fixture
def fake_transformers(monkeypatch):
    """An importable `transformers` (the real one is not needed before the GPU check)."""
    monkeypatch.setitem(sys.modules, "transformers", types.ModuleType("transformers"))


def test_defaults_and_lists_parse():
    args = model.parse_args(BASE)
    assert (args.layers, args.dtype, args.kernel, args.seed) == (2, "bf16", None, 0)
    assert args.steps == ["prefill", "decode", "train"]
    assert (args.prefill_tokens, args.decode_batch, args.decode_tokens) == ([512, 2048], [1, 16, 64], 32)
    assert (args.train_batch, args.compile) == ((4, 512), ["eager"])
    args = model.parse_args(
        [
            *BASE,
            "--dtype",
            "fp16",
            "--steps",
            "Decode,train",
            "--prefill-tokens",
            "128",
            "--decode-batch",
            "1, 8,8",
            "--train-batch",
            "2X256",
            "--compile",
            "eager,static",
            "--seed",
            "7",
        ]
    )
    assert (args.dtype, args.steps, args.prefill_tokens, args.decode_batch) == (
        "fp16",
        ["decode", "train"],
        [128],
        [1, 8],
    )
    assert (args.train_batch, args.compile, args.seed) == ((2, 256), ["eager", "static"], 7)
    assert args.arch["model_type"] == "llama" and args.arch["hidden_size"] == 4096


def test_the_named_architectures():
    llama, qwen, mistral = (model.CONFIGS[n] for n in ("llama3-8b", "qwen2.5-7b", "mistral-7b"))
    fields = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
    assert [llama[f] for f in fields] == [4096, 14336, 32, 8, 128256]
    assert (llama["model_type"], llama["rope_theta"], llama["head_dim"]) == ("llama", 500000.0, 128)
    assert [qwen[f] for f in fields] == [3584, 18944, 28, 4, 152064]
    assert (qwen["model_type"], qwen["attention_bias"], qwen["rope_theta"]) == ("qwen2", True, 1000000.0)
    assert [mistral[f] for f in fields] == [4096, 14336, 32, 8, 32000]
    assert (mistral["model_type"], mistral["rope_theta"]) == ("mistral", 10000.0)
    assert all("num_hidden_layers" not in c for c in model.CONFIGS.values())  # --layers sets it


def test_a_config_file_drops_the_checkpoint_keys(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "torch_dtype": "bfloat16"}))
    assert model.load_config(str(path)) == {"model_type": "llama", "hidden_size": 64}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "llama9", "--layers", "2"], "not a named config (llama3-8b, qwen2.5-7b, mistral-7b)"),
        (["--config", "llama3-8b", "--layers", "0"], "--layers: expected a whole number > 0, got '0'"),
        ([*BASE, "--prefill-tokens", "512,0"], "whole numbers > 0 (as 1,16,64), got '512,0'"),
        ([*BASE, "--decode-batch", "1,x"], "whole numbers > 0 (as 1,16,64), got '1,x'"),
        ([*BASE, "--decode-batch", ""], "whole numbers > 0 (as 1,16,64), got ''"),
        ([*BASE, "--train-batch", "4"], "expected BATCHxTOKENS with whole numbers > 0 (as 4x512), got '4'"),
        ([*BASE, "--steps", "prefill,infer"], "expected a comma list of prefill, decode, train"),
        ([*BASE, "--compile", "jit"], "expected a comma list of eager, static, got 'jit'"),
        ([*BASE, "--dtype", "fp32"], "invalid choice: 'fp32'"),
        ([*BASE, "--kernel", "nosuchmode"], "--kernel: "),
        (["--layers", "2"], "the following arguments are required: --config"),
    ],
)
def test_bad_arguments_are_usage_errors_naming_the_fix(argv, message, capsys):
    assert main(["model", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: gluon-survey model") and message in err


def test_unreadable_config_files(tmp_path, capsys):
    missing, garbled, bare = tmp_path / "none.json", tmp_path / "bad.json", tmp_path / "bare.json"
    garbled.write_text("{not json")
    bare.write_text(json.dumps({"hidden_size": 64}))
    for path, message in (
        (missing, "cannot read it (No such file or directory); pass a config.json"),
        (garbled, "not JSON (Expecting property name"),
        (bare, 'a config.json needs a "model_type"'),
    ):
        assert main(["model", "--config", str(path), "--layers", "1"]) == 2
        assert f"--config {path}: {message}" in capsys.readouterr().err


def test_an_existing_results_file_is_refused(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text("")
    assert main(["model", *BASE, "--results", str(path)]) == 2
    assert f"--results {path} exists; a results file holds one run" in capsys.readouterr().err


def test_without_transformers_it_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    monkeypatch.setattr(model, "build_models", lambda *a, **k: pytest.fail("built a model"))
    assert main(["model", *BASE]) == 2
    assert capsys.readouterr().err == (
        "gluon-survey model: error: gluon-survey model needs transformers: pip install -e .[models] "
        "(or pip install transformers)\n"
    )


def test_without_a_gpu_it_says_so(fake_transformers, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(model, "build_models", lambda *a, **k: pytest.fail("built a model"))
    assert main(["model", *BASE]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gluon-survey model: error: needs a CUDA GPU that torch can use")
    assert "CUDA not available" in err and err.count("\n") == 1


def test_the_arithmetic_of_a_row():
    row = model.fill_times(model.Row("decode", 4, 32, "eager"), [10.0, 12.0, 11.0], [5.0, 8.0, 4.0])
    assert (row.stock_ms, row.ours_ms, row.x_stock) == (11.0, 5.0, 2.2)
    assert row.repeats == [[10.0, 5.0], [12.0, 8.0], [11.0, 4.0]]
    ratios = [2.0, 1.5, 2.75]  # per repeat; p20 and p80 of three values by inclusive quantiles
    assert row.spread == pytest.approx((2.45 - 1.7) / 2.0)
    assert min(ratios) < row.x_stock < max(ratios)
    assert (row.stock_tok_s, row.ours_tok_s) == (4 * 32 / 0.011, 4 * 32 / 0.005)
    prefill = model.fill_times(model.Row("prefill", 1, 512, "eager"), [3.0], [4.0])
    assert (prefill.x_stock, prefill.spread, prefill.stock_tok_s) == (0.75, 0.0, None)
    model.fill_agreement(prefill, "logits", 2e-3, 3e-3)
    assert (prefill.agreement, prefill.err_ratio) == ("logits", pytest.approx(1.5))
    assert model.fill_agreement(prefill, "logits", 0.0, 0.0).err_ratio == 1.0


def test_stock_and_ours_alternate_after_the_warmup():
    calls = []

    def timer(fn):
        calls.append(fn())
        return float(len(calls))

    stock, ours = model.alternate(lambda: "s", lambda: "o", repeats=3, warmup=2, timer=timer)
    assert calls == ["s", "o"] * 5
    assert (stock, ours) == ([5.0, 7.0, 9.0], [6.0, 8.0, 10.0])


def test_the_plan_follows_the_steps():
    args = model.parse_args(
        [*BASE, "--prefill-tokens", "64,128", "--decode-batch", "1,16", "--compile", "eager,static"]
    )
    assert [(r.what, r.batch, r.tokens, r.mode) for r in model.plan(args)] == [
        ("prefill", 1, 64, "eager"),
        ("prefill", 1, 128, "eager"),
        ("decode", 1, 32, "eager"),
        ("decode", 16, 32, "eager"),
        ("decode", 1, 32, "static"),
        ("decode", 16, 32, "static"),
        ("train", 4, 512, "eager"),
    ]


@pytest.fixture
def faked_run(monkeypatch):
    """`model.run` on fake models: `step_fns` hands out labelled calls, `agreement` fixed errors;
    the fake timer gives each call a time by its label (stock 6 ms, ours 4 ms); --seed 13
    makes the train step raise."""
    monkeypatch.setattr(
        model, "build_models", lambda *a, **k: model.Models(None, None, 7, {"lm_head": "why"})
    )

    def agreement(models, args, rows, device):
        for row in rows:
            model.fill_agreement(row, "grads" if row.what == "train" else "logits", 0.004, 0.005)

    def step_fns(models, row, args, device):
        if row.what == "train" and args.seed == 13:
            raise RuntimeError("no backward")
        return (lambda: "stock"), (lambda: "ours")

    monkeypatch.setattr(model, "agreement", agreement)
    monkeypatch.setattr(model, "step_fns", step_fns)
    return lambda fn: {"stock": 6.0, "ours": 4.0}[fn()]


def _run(argv, timer):
    return model.run(model.parse_args(argv), None, argv, timer, "cpu", {"name": "Fake GPU"})


def test_the_results_file_and_the_report(faked_run, tmp_path, capsys):
    path = tmp_path / "out" / "model.jsonl"
    argv = [*BASE, "--prefill-tokens", "64", "--decode-batch", "2", "--decode-tokens", "8"]
    assert _run([*argv, "--results", str(path), "--format", "json"], faked_run) == 0
    header, *rows = (json.loads(line) for line in path.read_text().splitlines())
    assert header["record"] == "header" and header["env"] == {"name": "Fake GPU"}
    assert header["settings"]["config"] == "llama3-8b" and header["settings"]["swapped"] == 7
    assert header["settings"]["skipped"] == {"lm_head": "why"}
    assert [(r["what"], r["batch"], r["tokens"], r["mode"]) for r in rows] == [
        ("prefill", 1, 64, "eager"),
        ("decode", 2, 8, "eager"),
        ("train", 4, 512, "eager"),
    ]
    for r in rows:
        assert r["record"] == "row" and r["status"] == "OK"
        assert (r["stock_ms"], r["ours_ms"], r["x_stock"], r["spread"]) == (6.0, 4.0, 1.5, 0.0)
        assert (r["stock_err"], r["ours_err"]) == (0.004, 0.005) and r["err_ratio"] == pytest.approx(1.25)
        assert len(r["repeats"]) == 10
    assert rows[1]["ours_tok_s"] == pytest.approx(2 * 8 / 0.004)
    assert [r["agreement"] for r in rows] == ["logits", "logits", "grads"]
    captured = capsys.readouterr()
    assert json.loads(captured.out)["rows"] == rows
    assert captured.err.endswith(f"gluon-survey model: results in {path}\n")


def test_a_step_that_raises_is_an_error_row_and_exit_1(faked_run, tmp_path, capsys):
    path = tmp_path / "model.jsonl"
    argv = [*BASE, "--steps", "prefill,train", "--prefill-tokens", "64", "--seed", "13", "--format", "csv"]
    assert _run([*argv, "--results", str(path)], faked_run) == 1
    prefill, train = (json.loads(line) for line in path.read_text().splitlines()[1:])
    assert prefill["status"] == "OK" and prefill["x_stock"] == 1.5
    assert train["status"] == "ERROR" and train["error"] == "RuntimeError: no backward"
    assert train["x_stock"] is None
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("what,batch,tokens,mode,stock_ms,ours_ms,x_stock")
    assert out[2].startswith("train,4,512,eager,,,") and out[2].endswith("ERROR,RuntimeError: no backward")


def test_the_table_names_the_run(faked_run, tmp_path, capsys):
    argv = [*BASE, "--steps", "prefill", "--prefill-tokens", "64"]
    assert _run([*argv, "--results", str(tmp_path / "r.jsonl")], faked_run) == 0
    out = capsys.readouterr().out
    assert "gluon-survey model: llama3-8b, 2 layers, bf16, kernel default (7 Linear swapped); Fake GPU" in out
    assert "1.500" in out and "4.00e-03" in out


def test_non_finite_figures_are_stored_as_null():
    row = model.fill_agreement(model.Row("prefill", 1, 8, "eager"), "logits", 1e-3, math.inf)
    assert row.to_json()["ours_err"] is None and row.to_json()["err_ratio"] is None


def test_the_gradients_error_takes_all_of_them_together():
    ref = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([0.0, 4.0])}
    got = {"a": torch.tensor([3.0, 0.0], dtype=torch.bfloat16), "b": torch.tensor([0.0, 3.0])}
    assert model._grads_error(got, ref) == pytest.approx(1 / 5)  # ||(0, 0, 0, 1)|| / ||(3, 0, 0, 4)||
    assert model._grads_error({"a": ref["a"]}, ref) == math.inf  # a gradient missing
    assert model._grads_error({**got, "b": torch.tensor([0.0, math.nan])}, ref) == math.inf
