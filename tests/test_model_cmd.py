"""`gluon-survey model` without a GPU or transformers: its arguments and every error before the
model is built, the named architectures, and the rows' arithmetic and results file with a fake
timer and fake models (nothing real is timed); for a mixture-of-experts model, the baselines the
options pick, a row per baseline, and the options that do not fit the model refused before the
GPU. Where transformers is installed, a tiny Mixtral and Qwen3-MoE built for real and run end to
end on the CPU, torch._grouped_mm standing in for the grouped kernel."""

from __future__ import annotations

import json
import math
import sys
import time
import types
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from gluon_survey.driver import model
from gluon_survey.driver.cli import main

BASE = ["--config", "llama3-8b", "--layers", "2"]
MOE = ["--config", "mixtral-8x7b", "--layers", "2"]


class _FakeExperts(nn.Module):
    """What `gluon_survey.experts.experts_modules` finds: a config with `_experts_implementation`
    and a 3-D down_proj."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.down_proj = nn.Parameter(torch.empty(config.num_local_experts, 8, 4))


def _fake_model(config):
    """A Linear, and an experts module when the config has experts; built on the meta device only."""
    assert torch.empty(1).device.type == "meta", "the check before the GPU built a model in memory"
    built = nn.Module()
    built.config = config
    built.proj = nn.Linear(4, 4)
    if getattr(config, "num_local_experts", 0):
        built.experts = _FakeExperts(config)
    return built


@pytest.fixture
def fake_transformers(monkeypatch):
    """An importable `transformers` as far as `main` uses it before the GPU check: configs are
    namespaces of their fields, models a Linear plus an experts module where the config has
    experts."""
    fake = types.ModuleType("transformers")
    fake.AutoConfig = SimpleNamespace(
        for_model=lambda model_type, **fields: SimpleNamespace(
            model_type=model_type, _experts_implementation=None, **fields
        )
    )
    fake.AutoModelForCausalLM = SimpleNamespace(from_config=_fake_model)
    monkeypatch.setitem(sys.modules, "transformers", fake)


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
        (
            ["--config", "llama9", "--layers", "2"],
            "not a named config (llama3-8b, qwen2.5-7b, mistral-7b, mixtral-8x7b, qwen3-30b-a3b)",
        ),
        (["--config", "llama3-8b", "--layers", "0"], "--layers: expected a whole number > 0, got '0'"),
        ([*BASE, "--prefill-tokens", "512,0"], "whole numbers > 0 (as 1,16,64), got '512,0'"),
        ([*BASE, "--decode-batch", "1,x"], "whole numbers > 0 (as 1,16,64), got '1,x'"),
        ([*BASE, "--decode-batch", ""], "whole numbers > 0 (as 1,16,64), got ''"),
        ([*BASE, "--train-batch", "4"], "expected BATCHxTOKENS with whole numbers > 0 (as 4x512), got '4'"),
        ([*BASE, "--steps", "prefill,infer"], "expected a comma list of prefill, decode, train"),
        ([*BASE, "--compile", "jit"], "expected a comma list of eager, static, got 'jit'"),
        (
            [*MOE, "--moe-baseline", "grouped_mm,cutlass"],
            "expected a comma list of grouped_mm, eager, batched_mm, got 'grouped_mm,cutlass'",
        ),
        ([*BASE, "--dtype", "fp32"], "invalid choice: 'fp32'"),
        ([*BASE, "--kernel", "nosuchmode"], "--kernel: "),
        ([*BASE, "--control", "--kernel", "warpspec"], "--control times the stock model against its twin"),
        ([*MOE, "--control", "--patch-linear"], "leave --kernel and --patch-linear out"),
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
    assert calls == ["s", "o"] * 2 + ["s", "o", "o", "s", "s", "o"]  # the pairs take turns going first
    assert (stock, ours) == ([5.0, 8.0, 9.0], [6.0, 7.0, 10.0])  # each time with its own call


def test_each_timed_call_follows_its_own_models_settling_calls():
    """With settle_ms, every timed call but a model's first follows ceil(settle_ms / its model's
    last timed ms) untimed calls of the same model; the settling calls are never timed."""
    calls, timed = [], []

    def timer(fn):
        timed.append(len(calls))
        fn()
        return {"s": 4.0, "o": 3.0}[calls[-1]]

    stock, ours = model.alternate(
        lambda: calls.append("s"), lambda: calls.append("o"), repeats=2, warmup=1, timer=timer, settle_ms=10.0
    )
    assert calls == ["s", "o"] + ["s"] * 4 + ["o"] * 5 + ["o"] * 5 + ["s"] * 4
    assert [calls[i] for i in timed] == ["s", "o", "s", "o", "o", "s"]
    assert (stock, ours) == ([4.0, 4.0], [3.0, 3.0])


def test_no_garbage_collection_runs_inside_a_timed_pair(monkeypatch):
    events = []
    monkeypatch.setattr(model.gc, "collect", lambda *a: events.append("collect"))

    def timer(fn):
        events.append((fn(), model.gc.isenabled()))
        return 1.0

    assert model.gc.isenabled()
    model.alternate(lambda: "s", lambda: "o", repeats=2, warmup=1, timer=timer)
    pairs = ["collect", ("s", False), ("o", False), "collect", ("o", False), ("s", False)]
    assert events == [("s", False), ("o", False), *pairs]
    assert model.gc.isenabled()  # on again after, as it was before
    with pytest.raises(RuntimeError):  # and after a timed call raised
        model.alternate(lambda: "s", lambda: "o", repeats=1, warmup=0, timer=lambda fn: _raise())
    assert model.gc.isenabled()


def _raise():
    raise RuntimeError("a timed call failed")


@pytest.mark.parametrize("argv", [BASE, MOE], ids=["dense", "moe"])
def test_a_control_run_times_the_stock_model_against_its_unpatched_twin(fake_transformers, argv):
    """--control: ours is a twin on the same Parameters with nothing swapped (no gluon_survey.Linear,
    the experts on the first baseline's implementation), and the rows are against that baseline
    alone."""
    from gluon_survey import ops

    extra = ["--moe-baseline", "eager,grouped_mm"] if argv is MOE else []
    args = model.parse_args([*argv, "--control", *extra])
    models = model.build_models(sys.modules["transformers"], args, device="meta")
    assert models.ours is not models.stock and (models.swapped, models.skipped) == (0, {})
    assert models.names() == (("eager",) if argv is MOE else ("stock",))
    assert all(a is b for a, b in zip(models.stock.parameters(), models.ours.parameters(), strict=True))
    assert not any(isinstance(m, ops.Linear) for m in models.ours.modules())
    assert type(models.ours.proj) is nn.Linear
    if argv is MOE:
        implementations = {m.config._experts_implementation for m in (models.stock, models.ours)}
        assert implementations == {"eager"}
    assert model.settings_of(args)["control"] is True
    assert {r.baseline for r in model.plan(args, models.names())} == set(models.names())


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
    assert (header["settings"]["experts"], header["settings"]["baselines"]) == (0, ["stock"])
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
    assert [r["baseline"] for r in rows] == ["stock"] * 3
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
    assert out[0].startswith("what,batch,tokens,mode,baseline,stock_ms,ours_ms,x_stock")
    assert out[2].startswith("train,4,512,eager,stock,,,") and out[2].endswith(
        "ERROR,RuntimeError: no backward"
    )


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


# ------------------------------------------------------------------------------------------------
# Mixture-of-experts models: by experts implementation


def test_the_named_mixture_of_experts_architectures():
    mixtral, qwen = model.CONFIGS["mixtral-8x7b"], model.CONFIGS["qwen3-30b-a3b"]
    fields = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
    assert [mixtral[f] for f in fields] == [4096, 14336, 32, 8, 32000]
    assert (mixtral["model_type"], mixtral["num_local_experts"], mixtral["num_experts_per_tok"]) == (
        "mixtral",
        8,
        2,
    )
    assert (mixtral["rope_theta"], mixtral["rms_norm_eps"], mixtral["sliding_window"]) == (1e6, 1e-5, None)
    assert [qwen[f] for f in fields] == [2048, 6144, 32, 4, 151936]
    assert (qwen["model_type"], qwen["moe_intermediate_size"], qwen["head_dim"]) == ("qwen3_moe", 768, 128)
    assert (qwen["num_experts"], qwen["num_experts_per_tok"], qwen["norm_topk_prob"]) == (128, 8, True)
    assert (qwen["rope_theta"], qwen["decoder_sparse_step"], qwen["mlp_only_layers"]) == (1e6, 1, [])
    args = model.parse_args(["--config", "qwen3-30b-a3b", "--layers", "1"])
    args.arch["mlp_only_layers"].append(0)
    assert model.CONFIGS["qwen3-30b-a3b"]["mlp_only_layers"] == []  # each run gets its own copy


def test_the_moe_options_parse():
    args = model.parse_args(MOE)
    assert (args.moe_baseline, args.patch_linear) == (None, False)
    args = model.parse_args([*MOE, "--moe-baseline", "Eager, grouped_mm,eager", "--patch-linear"])
    assert (args.moe_baseline, args.patch_linear) == (["eager", "grouped_mm"], True)
    settings = model.settings_of(args)
    assert (settings["moe_baseline"], settings["patch_linear"]) == (["eager", "grouped_mm"], True)


def test_the_baselines_follow_the_model():
    assert model.baselines_of(model.parse_args(BASE), moe=False) == ["stock"]
    assert model.baselines_of(model.parse_args(MOE), moe=True) == ["grouped_mm", "eager"]
    picked = model.parse_args([*MOE, "--moe-baseline", "batched_mm", "--kernel", "auto", "--patch-linear"])
    assert model.baselines_of(picked, moe=True) == ["batched_mm"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [*BASE, "--moe-baseline", "eager"],
            "--moe-baseline applies to mixture-of-experts models, and --config llama3-8b has no experts "
            "modules (a dense model's nn.Linear modules are always patched, against stock): leave "
            "--moe-baseline out",
        ),
        ([*BASE, "--patch-linear"], "--patch-linear applies to mixture-of-experts models, and"),
        (
            [*MOE, "--kernel", "auto"],
            "--kernel picks the mode of the patched nn.Linear modules, and a mixture-of-experts model "
            "(--config mixtral-8x7b) keeps them unless --patch-linear: add --patch-linear or leave "
            "--kernel out",
        ),
    ],
)
def test_options_that_do_not_fit_the_model_are_refused_before_the_gpu(
    fake_transformers, monkeypatch, capsys, argv, message
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(model, "build_models", lambda *a, **k: pytest.fail("built a model"))
    assert main(["model", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gluon-survey model: error: {message}") and err.count("\n") == 1
    with pytest.raises(ValueError) as refused:  # what build_models checks again on the real model
        model.baselines_of(model.parse_args(argv), moe=argv[1] == "mixtral-8x7b")
    assert message in str(refused.value)


def test_a_moe_model_with_fitting_options_reaches_the_gpu_check(fake_transformers, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["model", *MOE, "--kernel", "auto", "--patch-linear", "--moe-baseline", "eager"]) == 2
    assert capsys.readouterr().err.startswith("gluon-survey model: error: needs a CUDA GPU")


def test_the_plan_has_each_measurement_once_per_baseline():
    args = model.parse_args(
        [*MOE, "--prefill-tokens", "64,128", "--decode-batch", "1", "--compile", "eager,static"]
    )
    rows = [
        (r.what, r.batch, r.tokens, r.mode, r.baseline) for r in model.plan(args, ("grouped_mm", "eager"))
    ]
    assert rows == [
        ("prefill", 1, 64, "eager", "grouped_mm"),
        ("prefill", 1, 64, "eager", "eager"),
        ("prefill", 1, 128, "eager", "grouped_mm"),
        ("prefill", 1, 128, "eager", "eager"),
        ("decode", 1, 32, "eager", "grouped_mm"),
        ("decode", 1, 32, "eager", "eager"),
        ("decode", 1, 32, "static", "grouped_mm"),
        ("decode", 1, 32, "static", "eager"),
        ("train", 4, 512, "eager", "grouped_mm"),
        ("train", 4, 512, "eager", "eager"),
    ]


@pytest.fixture
def faked_moe_run(monkeypatch):
    """`model.run` on a fake mixture-of-experts pair: baselines "grouped_mm" (6 ms) and "eager"
    (12 ms) against ours (4 ms); each baseline's error its own, ours' the same in every row."""
    models = model.Models("g", "o", 0, {}, {"grouped_mm": "g", "eager": "e"}, ("l0.experts", "l1.experts"))
    monkeypatch.setattr(model, "build_models", lambda *a, **k: models)

    def agreement(models, args, rows, device):
        for row in rows:
            stock_err = {"grouped_mm": 0.004, "eager": 0.002}[row.baseline]
            model.fill_agreement(row, "grads" if row.what == "train" else "logits", stock_err, 0.004)

    def step_fns(models, row, args, device):
        stock = models.baseline(row.baseline)
        return (lambda: stock), (lambda: models.ours)

    monkeypatch.setattr(model, "agreement", agreement)
    monkeypatch.setattr(model, "step_fns", step_fns)
    return lambda fn: {"g": 6.0, "e": 12.0, "o": 4.0}[fn()]


def test_a_moe_run_has_a_row_per_baseline_saying_which(faked_moe_run, tmp_path, capsys):
    path = tmp_path / "moe.jsonl"
    argv = [*MOE, "--steps", "prefill,train", "--prefill-tokens", "64", "--results", str(path)]
    assert _run(argv, faked_moe_run) == 0
    header, *rows = (json.loads(line) for line in path.read_text().splitlines())
    settings = header["settings"]
    assert (settings["experts"], settings["baselines"], settings["swapped"]) == (
        2,
        ["grouped_mm", "eager"],
        0,
    )
    assert (settings["moe_baseline"], settings["patch_linear"]) == (None, False)
    got = [(r["what"], r["baseline"], r["x_stock"], r["err_ratio"]) for r in rows]
    assert got == [
        ("prefill", "grouped_mm", 1.5, pytest.approx(1.0)),
        ("prefill", "eager", 3.0, pytest.approx(2.0)),
        ("train", "grouped_mm", 1.5, pytest.approx(1.0)),
        ("train", "eager", 3.0, pytest.approx(2.0)),
    ]
    captured = capsys.readouterr()
    assert (
        "mixtral-8x7b, 2 layers, bf16, experts on gluon_survey (2 modules), nn.Linear as stock"
        in captured.out
    )
    assert "against" in captured.out and "grouped_mm" in captured.out
    assert "ours runs 2 experts modules on gluon_survey, against grouped_mm, eager" in captured.err


def test_a_model_that_cannot_be_put_on_our_experts_is_a_usage_error(monkeypatch, tmp_path, capsys):
    def refuse(*a, **k):
        raise ValueError("these experts modules cannot run on gluon_survey's grouped kernel: l0: why")

    monkeypatch.setattr(model, "build_models", refuse)
    path = tmp_path / "r.jsonl"
    assert _run([*MOE, "--results", str(path)], lambda fn: pytest.fail("timed")) == 2
    assert capsys.readouterr().err.endswith(
        "gluon-survey model: error: these experts modules cannot run on gluon_survey's grouped kernel: "
        "l0: why\n"
    )
    assert not path.exists()


# ------------------------------------------------------------------------------------------------
# A tiny mixture-of-experts model for real, on the CPU (where transformers is installed)

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts_per_tok": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}
TINY_MOE = {
    "mixtral": {"model_type": "mixtral", **TINY, "num_local_experts": 4},
    "qwen3-moe": {
        "model_type": "qwen3_moe",
        **TINY,
        "num_experts": 4,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
    },
}


@pytest.fixture
def experts_on_cpu(monkeypatch):
    """transformers, and our experts on the CPU: torch._grouped_mm in the grouped kernel's place
    (`experts._grouped`, counted) and CPU weights let through `experts_reason`."""
    transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e .[models]")
    from gluon_survey import experts

    calls = []

    def grouped(x, w, offs):
        calls.append(tuple(x.shape))
        return torch._grouped_mm(x, w, offs=offs)

    monkeypatch.setattr(experts, "_grouped", grouped)
    monkeypatch.setattr(experts, "experts_reason", lambda module: None)
    return transformers, calls


def _wall_ms(fn):
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


@pytest.mark.parametrize("name", list(TINY_MOE))
def test_a_tiny_moe_model_end_to_end_on_the_cpu(experts_on_cpu, name, tmp_path):
    transformers, calls = experts_on_cpu
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_MOE[name]))
    argv = ["--config", str(config), "--layers", "2", "--prefill-tokens", "16", "--decode-batch", "2"]
    argv += ["--decode-tokens", "2", "--train-batch", "2x16", "--repeats", "1", "--warmup", "1"]
    args = model.parse_args([*argv, "--results", str(tmp_path / "r.jsonl")])
    assert model.count_experts(transformers, model.model_config(transformers, args)) == 2

    models = model.build_models(transformers, args, device="cpu")
    assert models.names() == ("grouped_mm", "eager") and len(models.experts) == 2
    eager = models.baselines["eager"]
    assert models.stock is models.baselines["grouped_mm"]
    implementations = [m.config._experts_implementation for m in (models.stock, eager, models.ours)]
    assert implementations == ["grouped_mm", "eager", "gluon_survey"]  # each twin on its own config
    assert (models.swapped, models.skipped) == (0, {})
    for twin in (eager, models.ours):  # the same Parameters, not copies
        assert all(a is b for a, b in zip(models.stock.parameters(), twin.parameters(), strict=True))

    rows = model.measure(models, args, lambda row: None, _wall_ms, "cpu")
    assert calls, "ours never ran its experts on the grouped product"
    assert [(r.what, r.baseline) for r in rows] == [
        (what, base) for what in ("prefill", "decode", "train") for base in ("grouped_mm", "eager")
    ]
    for r in rows:
        assert r.status == "OK" and r.error == "", r
        assert r.ours_ms > 0 and r.stock_ms > 0
        assert 0 < r.stock_err < 0.05, r
        if r.baseline == "grouped_mm":  # the same products on the CPU: the same logits and gradients
            assert r.ours_err == pytest.approx(r.stock_err, rel=1e-3), r
        else:
            assert r.ours_err <= 2 * r.stock_err + 1e-3, r


def test_the_summary_has_a_line_per_run_and_baseline_and_a_column_per_step(tmp_path):
    def run(name, config, rows):
        header = {"record": "header", "env": {"name": "NVIDIA H100 80GB HBM3", "git": {"commit": "abc1234"}},
                  "settings": {"config": config, "layers": 4}}  # fmt: skip
        path = tmp_path / name
        path.write_text("\n".join(json.dumps(r) for r in [header, *rows]) + "\n")
        return path

    def row(what, batch, tokens, x, spread=0.05, baseline="stock", mode="eager", status="OK"):
        return {"record": "row", "what": what, "batch": batch, "tokens": tokens, "mode": mode,
                "baseline": baseline, "x_stock": x, "spread": spread, "status": status}  # fmt: skip

    dense = run("a.jsonl", "llama3-8b", [row("prefill", 1, 512, 1.02), row("decode", 16, 32, 0.98, 0.4)])
    moe = run(
        "b.jsonl",
        "qwen3-30b-a3b",
        [
            row("prefill", 1, 512, 1.1, baseline="grouped_mm"),
            row("prefill", 1, 512, 3.0, baseline="eager"),
            row("train", 4, 512, None, baseline="grouped_mm", status="ERROR"),
            row("decode", 1, 16, 1.01, baseline="grouped_mm", mode="static"),
        ],
    )
    doc = f"x\n<!-- model {dense.name},{moe.name} -->\nstale\n<!-- end model -->\ny\n"
    out = model.embed_summaries(doc, tmp_path)
    table = out.split("\n")[2:-3]
    assert table[0] == (
        "| model | GPU | commit | prefill 512 | decode b16 | train 4x512 | decode b1 static |"
    )
    assert (
        table[2]
        == "| llama3-8b, 4 layers, vs stock | H100 80GB HBM3 | abc1234 | 1.020 (5 %) | 0.980 (40 %) |  |  |"
    )
    assert table[3] == (
        "| qwen3-30b-a3b, 4 layers, vs grouped_mm | H100 80GB HBM3 | abc1234 "
        "| 1.100 (5 %) |  | ERROR | 1.010 (5 %) |"
    )
    assert table[4].startswith(
        "| qwen3-30b-a3b, 4 layers, vs eager | H100 80GB HBM3 | abc1234 | 3.000 (5 %) |"
    )
    assert "stale" not in out and out.startswith("x\n") and out.endswith("y\n")
    assert model.embed_summaries(out, tmp_path) == out
