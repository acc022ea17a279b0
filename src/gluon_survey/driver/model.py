"""`gluon-survey model`: a whole transformers model, stock against gluon_survey's, in one process.
The model is built from a config with random weights (nothing is downloaded): one of the named
architectures below, or a FILE.json as in a Hugging Face repository's config.json, with --layers
decoder layers, on the GPU in --dtype.

    gluon-survey model --config llama3-8b --layers 4
    gluon-survey model --config qwen2.5-7b --layers 4 --steps decode --compile eager,static
    gluon-survey model --config mixtral-8x7b --layers 2 --moe-baseline grouped_mm,eager
    gluon-survey model --config my-config.json --layers 2 --results out/model.jsonl --format json
    gluon-survey model --config llama3-8b --layers 4 --control

Ours is a twin of the stock model: the same Parameters and buffers (no copy of the weights). A
dense model's twin has its nn.Linear modules swapped for gluon_survey.Linear running --kernel
(default: matmul's choice per call), as `gluon_survey.patch` does; every row is against "stock".

A mixture-of-experts model (one with transformers experts modules: mixtral-8x7b, qwen3-30b-a3b,
a config.json of the same kinds) is compared by experts implementation. Ours runs its experts on
"gluon_survey" (`gluon_survey.patch_experts`: the survey's grouped kernel); the baselines are the
same model on transformers' own implementations, one twin each, named by --moe-baseline (default
grouped_mm,eager); each twin has its own config, since an experts module finds its implementation
in `config._experts_implementation` at every forward. Each measurement is a row per baseline, the
row's `baseline` naming it. By default only the experts differ, so the rows compare experts
implementations alone; --patch-linear also swaps ours' nn.Linear modules (attention, lm_head, dense
MLP layers) as for a dense model, --kernel picking their mode.

--control makes ours the stock model's twin with nothing swapped: an A/A run whose rows measure
the benchmark's own bias between two identical models (1.00 ideally; the spread is its noise).

What is measured, each step as stock (the row's baseline) and ours in pairs that take turns at
going first, after a warm-up of each, timed with CUDA events, medians over --repeats; each timed
call follows --settle-ms of its own model's untimed calls, so that a model runs at the clock its own
power draw sets (driver/timing.py, "Settled windows"):

    prefill   forward of [1, T] tokens without a KV cache, at each --prefill-tokens T
    decode    greedy generate: --decode-tokens new tokens (min = max) after an 8-token prompt, at
              each --decode-batch, per --compile mode: eager (the dynamic cache), static
              (cache_implementation="static", which transformers compiles itself, as it documents
              fast decode); the row's tokens/s is batch * new tokens / the generate call's time
    train     forward + backward of a loss on random labels (no optimizer step) at --train-batch BxT

x_stock = stock_ms / ours_ms (> 1: ours is faster); spread = (p80 - p20) / median of the
per-repeat ratios. Agreement: rel. Frobenius error of the stock (baseline) and of our model's
logits against an fp32 copy of the stock model (its experts on transformers' "eager"; prefill: the
[1, T] forward; decode: a forward of the batch's prompt), and for train of the weight gradients of
one step (all of them together), with their ratio ours / stock.

Rows go to a JSON Lines results file (default out/model-<run id>.jsonl): a header (env, settings)
as the other commands write, then one row per measurement. Exit status: 0, 1 when a measurement
raised (its row says ERROR and why), 2 for a usage error or a machine without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import copy
import csv
import gc
import json
import math
import re
import shlex
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gluon_survey.driver import args as argtypes
from gluon_survey.driver.settings import DEFAULTS

PROG = "gluon-survey model"
NEEDS_TRANSFORMERS = (
    "gluon-survey model needs transformers: pip install -e .[models] (or pip install transformers)"
)
STEPS = ("prefill", "decode", "train")
COMPILES = ("eager", "static")
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
FORMATS = ("table", "json", "csv")
PROMPT_TOKENS = 8  # the decode prompt
# transformers' experts implementations that a mixture-of-experts model can be compared against
# (those that need no package besides transformers), and the default: the pair.
MOE_BASELINES = ("grouped_mm", "eager", "batched_mm")
DEFAULT_MOE_BASELINES = ["grouped_mm", "eager"]
DENSE_BASELINE = "stock"  # a dense model's only baseline: the model as transformers builds it
REFERENCE_EXPERTS = "eager"  # the fp32 copy's experts implementation (torch._grouped_mm is bf16 only)
TIMER = (
    "CUDA events around each call; stock and ours alternate, each warmed up first, the pairs "
    "taking turns at going first; no garbage collection in a timed pair"
)

# The published architectures, as in the config.json of the model cards meta-llama/Meta-Llama-3-8B,
# Qwen/Qwen2.5-7B, mistralai/Mistral-7B-v0.1, mistralai/Mixtral-8x7B-v0.1 and Qwen/Qwen3-30B-A3B
# (num_hidden_layers comes from --layers). Qwen2's q/k/v projections always have biases
# (attention_bias records it; the model class adds them). The two mixture-of-experts models:
# Mixtral's num_local_experts is transformers' num_experts; Qwen3-MoE's experts are
# moe_intermediate_size wide (intermediate_size is its dense MLP's, used by no layer here:
# mlp_only_layers is empty and decoder_sparse_step 1), and its head_dim (128) is not
# hidden_size / heads (64).
CONFIGS: dict[str, dict[str, Any]] = {
    "llama3-8b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    "qwen2.5-7b": {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 152064,
        "max_position_embeddings": 131072,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": True,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
    },
    "mistral-7b": {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "mixtral-8x7b": {
        "model_type": "mixtral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "sliding_window": None,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
}
# Keys of a repository's config.json that describe the checkpoint, not the architecture.
_NOT_ARCHITECTURE = ("torch_dtype", "dtype", "transformers_version", "_name_or_path", "quantization_config")


# ------------------------------------------------------------------------------------------------
# Arguments


def int_list(text: str) -> list[int]:
    """'512,2048' -> [512, 2048]: whole numbers > 0, comma-separated."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p.isdigit() or int(p) < 1 for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected a comma list of whole numbers > 0 (as 1,16,64), got {text!r}"
        )
    return list(dict.fromkeys(int(p) for p in parts))


def _choices(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        picked = list(dict.fromkeys(p.strip().lower() for p in text.split(",")))
        if not text.strip() or any(p not in allowed for p in picked):
            raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(allowed)}, got {text!r}")
        return picked

    parse.__name__ = "list"
    return parse


def batch_by_tokens(text: str) -> tuple[int, int]:
    """'4x512' -> (4, 512)."""
    b, _, t = text.lower().partition("x")
    if not (b.strip().isdigit() and t.strip().isdigit() and int(b) >= 1 and int(t) >= 1):
        raise argparse.ArgumentTypeError(
            f"expected BATCHxTOKENS with whole numbers > 0 (as 4x512), got {text!r}"
        )
    return int(b), int(t)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="A transformers model with random weights, stock against ours (gluon_survey.patch; "
        "a mixture-of-experts model's experts on gluon_survey's grouped kernel) in one process: prefill, "
        "greedy decode and a training step, timed alternately, and the logits' and gradients' agreement "
        "with an fp32 copy.",
        epilog="\n\n".join(__doc__.split("\n\n")[1:7]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        required=True,
        metavar="|".join(CONFIGS) + "|FILE.json",
        help="a named architecture or a config.json (as in a Hugging Face repository)",
    )
    parser.add_argument(
        "--layers", type=argtypes.positive_int, required=True, metavar="N", help="decoder layers (>= 1)"
    )
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16", help="(default: %(default)s)")
    parser.add_argument(
        "--kernel", metavar="MODE", help="the survey mode to patch nn.Linear with (default: matmul's)"
    )
    parser.add_argument(
        "--steps",
        metavar="prefill,decode,train",
        type=_choices(STEPS),
        default=list(STEPS),
        help="comma list (default: prefill,decode,train)",
    )
    parser.add_argument(
        "--prefill-tokens", type=int_list, default=[512, 2048], metavar="T,...", help="(default: 512,2048)"
    )
    parser.add_argument(
        "--decode-batch", type=int_list, default=[1, 16, 64], metavar="B,...", help="(default: 1,16,64)"
    )
    parser.add_argument(
        "--decode-tokens",
        type=argtypes.positive_int,
        metavar="N",
        default=32,
        help="new tokens (default: %(default)s)",
    )
    parser.add_argument(
        "--train-batch", type=batch_by_tokens, default=(4, 512), metavar="BxT", help="(default: 4x512)"
    )
    parser.add_argument(
        "--compile",
        metavar="eager,static",
        type=_choices(COMPILES),
        default=["eager"],
        help="decode modes, comma list of eager, static (default: eager)",
    )
    parser.add_argument(
        "--repeats",
        type=argtypes.positive_int,
        metavar="N",
        default=10,
        help="medians over (default: %(default)s)",
    )
    parser.add_argument(
        "--warmup",
        type=argtypes.positive_int,
        metavar="N",
        default=2,
        help="untimed calls of each first (default: 2)",
    )
    parser.add_argument(
        "--settle-ms",
        type=argtypes.non_negative,
        metavar="MS",
        default=DEFAULTS.settle_ms,
        help="before each timed call, untimed calls of the same model for about this long, so that at "
        "the power limit each runs at the clock its own power draw sets, not the other model's "
        "(0: none) (default: %(default)g)",
    )
    parser.add_argument(
        "--moe-baseline",
        metavar=",".join(MOE_BASELINES),
        type=_choices(MOE_BASELINES),
        help="mixture-of-experts models: transformers' experts implementations to compare the "
        f"gluon_survey experts against, a row each (default: {','.join(DEFAULT_MOE_BASELINES)})",
    )
    parser.add_argument(
        "--patch-linear",
        action="store_true",
        help="mixture-of-experts models: also swap our twin's nn.Linear modules for gluon_survey.Linear "
        "(default: only the experts differ)",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="an A/A run: ours is the stock model's twin with nothing swapped, so that each row's "
        "x stock measures the benchmark's own bias between two identical models (ideal 1.00)",
    )
    parser.add_argument(
        "--results", type=Path, metavar="FILE.jsonl", help="(default: out/model-<run id>.jsonl)"
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="(default: %(default)s)")
    parser.add_argument(
        "--seed", type=int, default=0, metavar="N", help="weights and inputs (default: %(default)s)"
    )
    return parser


def load_config(spec: str) -> dict[str, Any]:
    """The architecture `spec` names (a key of CONFIGS) or the dict of a config.json file; ValueError
    naming the fix otherwise."""
    if spec.lower() in CONFIGS:
        return copy.deepcopy(CONFIGS[spec.lower()])
    path = Path(spec)
    if path.suffix.lower() != ".json" and not path.exists():
        raise ValueError(f"--config {spec}: not a named config ({', '.join(CONFIGS)}) nor a FILE.json")
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(
            f"--config {spec}: cannot read it ({exc.strerror or exc}); pass a config.json"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--config {spec}: not JSON ({exc}); pass a config.json") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model_type"), str):
        raise ValueError(
            f'--config {spec}: a config.json needs a "model_type" (as "llama"), as a Hugging Face '
            "repository's has"
        )
    return {k: v for k, v in doc.items() if k not in _NOT_ARCHITECTURE}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The arguments, checked (argparse exits 2 naming the problem), `args.arch` the config dict."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.arch = load_config(args.config)
    except ValueError as exc:
        parser.error(str(exc))
    if args.kernel is not None:
        from gluon_survey import registry

        try:
            args.kernel = registry.get(args.kernel).name
        except KeyError as exc:
            parser.error(f"--kernel: {exc.args[0]}")
    if args.control and (args.kernel is not None or args.patch_linear):
        parser.error(
            "--control times the stock model against its twin with nothing swapped: "
            "leave --kernel and --patch-linear out"
        )
    if args.results is not None:
        from gluon_survey.driver.cli import _output_path_error

        problem = _output_path_error(argparse.Namespace(output=None, plot=None), args.results)
        if problem:
            parser.error(problem)
    return args


def baselines_of(args: argparse.Namespace, moe: bool) -> list[str]:
    """What the rows are against: "stock" for a dense model; for a mixture-of-experts model (`moe`)
    the --moe-baseline experts implementations. ValueError naming the fix for an option that does
    not fit the model."""
    if not moe:
        for given, option in ((args.moe_baseline, "--moe-baseline"), (args.patch_linear, "--patch-linear")):
            if given:
                raise ValueError(
                    f"{option} applies to mixture-of-experts models, and --config {args.config} has no "
                    "experts modules (a dense model's nn.Linear modules are always patched, against "
                    f"stock): leave {option} out"
                )
        return [DENSE_BASELINE]
    if args.kernel is not None and not args.patch_linear:
        raise ValueError(
            f"--kernel picks the mode of the patched nn.Linear modules, and a mixture-of-experts model "
            f"(--config {args.config}) keeps them unless --patch-linear: add --patch-linear or leave "
            "--kernel out"
        )
    return list(args.moe_baseline or DEFAULT_MOE_BASELINES)


def model_config(transformers: Any, args: argparse.Namespace) -> Any:
    """transformers' config object of `args.arch` with `args.layers` layers."""
    arch = dict(args.arch)
    return transformers.AutoConfig.for_model(arch.pop("model_type"), **arch, num_hidden_layers=args.layers)


def count_experts(transformers: Any, config: Any) -> int:
    """How many experts modules (`gluon_survey.experts.experts_modules`) the model of `config` has,
    counted on a model built on the meta device (no memory, no GPU)."""
    import torch

    from gluon_survey.experts import experts_modules

    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(config)
    return sum(1 for _ in experts_modules(built))


def import_transformers() -> Any:
    """transformers, or ImportError with the install line."""
    try:
        import transformers
    except ImportError:
        raise ImportError(NEEDS_TRANSFORMERS) from None
    return transformers


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "config": args.config,
        "architecture": args.arch,
        "layers": args.layers,
        "dtype": args.dtype,
        "kernel": args.kernel,
        "steps": args.steps,
        "prefill_tokens": args.prefill_tokens,
        "decode_batch": args.decode_batch,
        "decode_tokens": args.decode_tokens,
        "prompt_tokens": PROMPT_TOKENS,
        "train_batch": list(args.train_batch),
        "compile": args.compile,
        "moe_baseline": args.moe_baseline,
        "patch_linear": args.patch_linear,
        "control": args.control,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "settle_ms": args.settle_ms,
        "seed": args.seed,
        "timer": TIMER,
    }


# ------------------------------------------------------------------------------------------------
# Rows and their arithmetic (no GPU)


@dataclass
class Row:
    """One measurement: stock (the row's baseline) against ours."""

    what: str  # prefill, decode, train
    batch: int
    tokens: int  # prefill: T; decode: new tokens; train: tokens per sequence
    mode: str  # eager or static
    baseline: str = DENSE_BASELINE  # "stock", or the experts implementation ours is against
    status: str = "OK"
    error: str = ""
    stock_ms: float | None = None
    ours_ms: float | None = None
    x_stock: float | None = None  # stock_ms / ours_ms
    spread: float | None = None  # (p80 - p20) / median of the per-repeat ratios
    stock_tok_s: float | None = None  # decode: batch * new tokens per second
    ours_tok_s: float | None = None
    agreement: str | None = None  # "logits" or "grads"
    stock_err: float | None = None  # rel. Frobenius error against the fp32 copy
    ours_err: float | None = None
    err_ratio: float | None = None  # ours_err / stock_err
    repeats: list[list[float]] = field(default_factory=list)  # [stock_ms, ours_ms] per repeat

    def to_json(self) -> dict[str, Any]:
        return {"record": "row", **{k: _finite(v) for k, v in asdict(self).items()}}


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def spread_of(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=5, method="inclusive")
    return (q[3] - q[0]) / statistics.median(values)


def fill_times(row: Row, stock: Sequence[float], ours: Sequence[float]) -> Row:
    """`row` with the medians, x_stock, the spread and (decode) tokens/s of the repeats' times."""
    row.repeats = [[s, o] for s, o in zip(stock, ours, strict=True)]
    row.stock_ms, row.ours_ms = statistics.median(stock), statistics.median(ours)
    row.x_stock = row.stock_ms / row.ours_ms
    row.spread = spread_of([s / o for s, o in zip(stock, ours, strict=True)])
    if row.what == "decode":
        row.stock_tok_s = row.batch * row.tokens / (row.stock_ms / 1e3)
        row.ours_tok_s = row.batch * row.tokens / (row.ours_ms / 1e3)
    return row


def fill_agreement(row: Row, kind: str, stock_err: float, ours_err: float) -> Row:
    row.agreement, row.stock_err, row.ours_err = kind, stock_err, ours_err
    row.err_ratio = ours_err / stock_err if stock_err > 0 else (1.0 if ours_err == 0 else math.inf)
    return row


def alternate(
    stock: Callable[[], object],
    ours: Callable[[], object],
    repeats: int,
    warmup: int,
    timer: Callable,
    settle_ms: float = 0.0,
) -> tuple[list[float], list[float]]:
    """`timer(fn)` (ms of one call) of stock and ours taking turns, after `warmup` untimed turns.
    Each timed call after the first of its model follows about `settle_ms` of that model's own
    untimed calls (counted from its last timed call), so that at the power limit a model's step
    runs at the clock its own power draw sets, not one the other model's step left
    (driver/timing.py, "Settled windows").
    Python's garbage collector is off throughout and runs, untimed, before each timed pair (as
    timeit keeps it out of its loops): a collection that one call's allocations trigger would
    otherwise land in whichever call comes next, tens of ms in a host-bound generate. The pairs
    take turns at going first (stock first in even repeats, ours in odd ones): the first call after
    a collection finds the host's caches cold, and a host-bound step pays for it, so a fixed order
    would favour the second model (`--control` measures what is left of such a bias)."""
    enabled = gc.isenabled()
    gc.disable()
    last: dict[Callable[[], object], float] = {}  # ms of each model's latest timed call

    def timed(fn: Callable[[], object]) -> float:
        if settle_ms > 0 and fn in last:
            for _ in range(math.ceil(settle_ms / max(last[fn], 1e-3))):
                fn()
        last[fn] = timer(fn)
        return last[fn]

    try:
        for _ in range(warmup):
            timed(stock)
            timed(ours)
        times: tuple[list[float], list[float]] = ([], [])
        for i in range(repeats):
            gc.collect()
            if i % 2:
                o = timed(ours)
                times[0].append(timed(stock))
                times[1].append(o)
            else:
                times[0].append(timed(stock))
                times[1].append(timed(ours))
        return times
    finally:
        if enabled:
            gc.enable()


def cuda_timer(fn: Callable[[], object]) -> float:
    """Milliseconds of one call of fn, CUDA events around it."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


# ------------------------------------------------------------------------------------------------
# The models (need transformers and, for the patch to swap anything, a CUDA GPU)


@dataclass
class Models:
    stock: Any  # the model as built (a mixture-of-experts one on the first baseline's experts)
    ours: Any
    swapped: int  # ours' nn.Linear modules swapped for gluon_survey.Linear
    skipped: dict[str, str]  # and those left alone, name -> why
    baselines: dict[str, Any] = field(default_factory=dict)  # name -> the model timed as it
    experts: tuple[str, ...] = ()  # ours' experts modules on "gluon_survey" (mixture-of-experts)

    def names(self) -> tuple[str, ...]:
        """The baselines, in order."""
        return tuple(self.baselines) or (DENSE_BASELINE,)

    def baseline(self, name: str) -> Any:
        return self.baselines.get(name, self.stock)


def _twin(model: Any) -> Any:
    """A copy of `model`'s modules and config on the same Parameters and buffers (no weight copied).
    A fresh memo each time: deepcopy fills it with the copies it makes."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo=shared)


def build_models(transformers: Any, args: argparse.Namespace, device: str = "cuda") -> Models:
    """The stock model from `args.arch` with `args.layers` layers, random weights, and our twin on
    the same Parameters: a dense model's with its nn.Linear modules patched; a mixture-of-experts
    model's with its experts on "gluon_survey" (and, with --patch-linear, its nn.Linear patched),
    the stock model on the first --moe-baseline and one more twin for each other. ValueError when
    an option does not fit the model or the experts cannot run on the grouped kernel."""
    import torch

    from gluon_survey import patch, patch_experts
    from gluon_survey.experts import experts_modules

    config = model_config(transformers, args)
    dtype = getattr(torch, DTYPES[args.dtype])
    torch.manual_seed(args.seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            stock = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    stock.eval()
    moe = any(True for _ in experts_modules(stock))
    names = baselines_of(args, moe)
    if getattr(args, "control", False):  # A/A: the twin as built, on the first baseline's experts
        if moe:
            stock.config._experts_implementation = names[0]
        return Models(stock, _twin(stock), 0, {}, {names[0]: stock})
    if not moe:
        ours = _twin(stock)
        report = patch(ours, kernel=args.kernel)
        return Models(stock, ours, len(report), dict(report.skipped), {DENSE_BASELINE: stock})
    stock.config._experts_implementation = names[0]
    baselines = {names[0]: stock}
    for name in names[1:]:
        baselines[name] = _twin(stock)
        baselines[name].config._experts_implementation = name  # its own config: stock's is unchanged
    ours = _twin(stock)
    switched = patch_experts(ours)
    swapped, skipped = 0, {}
    if args.patch_linear:
        report = patch(ours, kernel=args.kernel)
        swapped, skipped = len(report), dict(report.skipped)
    return Models(stock, ours, swapped, skipped, baselines, switched)


def _tokens(vocab: int, batch: int, tokens: int, seed: int, device: str) -> Any:
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, vocab, (batch, tokens), generator=gen, device=device)


def _train_step(model: Any, ids: Any, labels: Any) -> None:
    for p in model.parameters():
        p.grad = None
    model(input_ids=ids, labels=labels).loss.backward()


def _grads(model: Any) -> dict[str, Any]:
    """The gradients now held by `model`'s parameters, by name (not copies)."""
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _grads_error(grads: dict[str, Any], ref: dict[str, Any]) -> float:
    """Rel. Frobenius error of all of `grads` together against `ref` (same names); inf when a
    gradient is missing or not finite."""
    if grads.keys() != ref.keys():
        return math.inf
    num = sum(float((grads[n].double() - g.double()).norm() ** 2) for n, g in ref.items())
    den = sum(float(g.double().norm() ** 2) for g in ref.values())
    error = math.sqrt(num / den) if den > 0 else 0.0
    return error if math.isfinite(error) else math.inf


def _input_of(row: Row) -> tuple[int, int]:
    """The (batch, tokens) of the input that `row`'s agreement is measured on."""
    return row.batch, PROMPT_TOKENS if row.what == "decode" else row.tokens


def _by_input(rows: Sequence[Row]) -> dict[tuple[int, int], list[Row]]:
    groups: dict[tuple[int, int], list[Row]] = {}
    for row in rows:
        groups.setdefault(_input_of(row), []).append(row)
    return groups


def _compared(models: Models, rows: Sequence[Row]) -> list[Any]:
    """The models that `rows` compare, each once: their baselines, then ours."""
    found = [models.baseline(row.baseline) for row in rows] + [models.ours]
    return list({id(m): m for m in found}.values())


def _fill_from(row: Row, kind: str, errors: dict[int, float], models: Models) -> None:
    """`row`'s agreement from `errors`, id(model) -> its error: its baseline's, ours."""
    fill_agreement(row, kind, errors[id(models.baseline(row.baseline))], errors[id(models.ours)])


def agreement(models: Models, args: argparse.Namespace, rows: Sequence[Row], device: str) -> None:
    """The agreement figures of every row, against an fp32 copy of the stock model (made and freed
    here; a mixture-of-experts model's copy runs its experts on transformers' "eager"). Each input
    is run once per model, whatever number of rows share it."""
    import torch

    from gluon_survey.driver.check import rel_error

    ref = copy.deepcopy(models.stock).float()  # its own config too
    if models.experts:
        ref.config._experts_implementation = REFERENCE_EXPERTS
    vocab = models.stock.config.vocab_size
    measured = [row for row in rows if row.status == "OK"]
    with torch.no_grad():
        for (batch, tokens), group in _by_input([r for r in measured if r.what != "train"]).items():
            ids = _tokens(vocab, batch, tokens, args.seed, device)
            want = ref(input_ids=ids, use_cache=False).logits
            errors = {
                id(m): rel_error(m(input_ids=ids, use_cache=False).logits, want)
                for m in _compared(models, group)
            }
            for row in group:
                _fill_from(row, "logits", errors, models)
            del want
    for (batch, tokens), group in _by_input([r for r in measured if r.what == "train"]).items():
        ids = _tokens(vocab, batch, tokens, args.seed, device)
        labels = _tokens(vocab, batch, tokens, args.seed + 1, device)
        errors = {}  # one model at a time: the twins share their Parameters, and so their .grad
        for model in (ref, *_compared(models, group)):
            model.train()
            _train_step(model, ids, labels)
            model.eval()
            if model is not ref:
                errors[id(model)] = _grads_error(_grads(model), _grads(ref))
        for row in group:
            _fill_from(row, "grads", errors, models)
    for model in (models.stock, models.ours):
        for p in model.parameters():
            p.grad = None
    del ref
    if device == "cuda":
        torch.cuda.empty_cache()


def plan(args: argparse.Namespace, baselines: Sequence[str] = (DENSE_BASELINE,)) -> list[Row]:
    """The rows to measure, in order: each measurement once per baseline, those rows together."""
    rows = []
    if "prefill" in args.steps:
        rows += [Row("prefill", 1, t, "eager", base) for t in args.prefill_tokens for base in baselines]
    if "decode" in args.steps:
        rows += [
            Row("decode", b, args.decode_tokens, m, base)
            for m in args.compile
            for b in args.decode_batch
            for base in baselines
        ]
    if "train" in args.steps:
        rows += [Row("train", args.train_batch[0], args.train_batch[1], "eager", base) for base in baselines]
    return rows


def step_fns(models: Models, row: Row, args: argparse.Namespace, device: str) -> tuple[Callable, Callable]:
    """The (stock, ours) calls that `row` times, stock the model of the row's baseline."""
    import torch

    vocab = models.stock.config.vocab_size
    if row.what == "prefill":
        ids = _tokens(vocab, 1, row.tokens, args.seed, device)

        def make(model: Any) -> Callable[[], object]:
            return torch.no_grad()(lambda: model(input_ids=ids, use_cache=False))

    elif row.what == "decode":
        ids = _tokens(vocab, row.batch, PROMPT_TOKENS, args.seed, device)
        extra = {"cache_implementation": "static"} if row.mode == "static" else {}

        def make(model: Any) -> Callable[[], object]:
            return lambda: model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=row.tokens,
                min_new_tokens=row.tokens,
                pad_token_id=0,
                **extra,
            )

    else:
        ids = _tokens(vocab, row.batch, row.tokens, args.seed, device)
        labels = _tokens(vocab, row.batch, row.tokens, args.seed + 1, device)

        def make(model: Any) -> Callable[[], object]:
            def step() -> None:
                model.train()
                try:
                    _train_step(model, ids, labels)
                finally:
                    model.eval()

            return step

    return make(models.baseline(row.baseline)), make(models.ours)


def _allow_recompiles() -> None:
    """Static decode compiles the forward once per model and batch: more than dynamo's default
    recompile limit with two models and several batches."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))


def measure(
    models: Models,
    args: argparse.Namespace,
    on_row: Callable[[Row], None],
    timer: Callable[[Callable[[], object]], float] = cuda_timer,
    device: str = "cuda",
    progress: Callable[[str], None] = lambda what: None,
) -> list[Row]:
    """Every row of `plan(args, models.names())`: agreement first, then timed, each handed to `on_row`
    when done."""
    rows = plan(args, models.names())
    if "static" in args.compile:
        _allow_recompiles()
    progress("agreement against an fp32 copy")
    try:
        agreement(models, args, rows, device)
    except Exception as exc:  # no agreement figures, but the timing still runs
        for row in rows:
            row.error = f"agreement: {type(exc).__name__}: {str(exc).strip()}"
    for row in rows:
        progress(f"{row.what} {row.mode} batch {row.batch} x {row.tokens} against {row.baseline}")
        try:
            stock, ours = step_fns(models, row, args, device)
            fill_times(row, *alternate(stock, ours, args.repeats, args.warmup, timer, args.settle_ms))
        except Exception as exc:  # a step that cannot run is a result, not a crash
            row.status, row.error = "ERROR", f"{type(exc).__name__}: {str(exc).strip()}"
        on_row(row)
    return rows


# ------------------------------------------------------------------------------------------------
# Rendering

COLUMNS = (
    ("what", "what"),
    ("batch", "batch"),
    ("tokens", "tokens"),
    ("mode", "mode"),
    ("baseline", "against"),
    ("stock_ms", "stock ms"),
    ("ours_ms", "ours ms"),
    ("x_stock", "x stock"),
    ("spread", "spread"),
    ("stock_tok_s", "stock tok/s"),
    ("ours_tok_s", "ours tok/s"),
    ("agreement", "agreement"),
    ("stock_err", "stock err"),
    ("ours_err", "ours err"),
    ("err_ratio", "ours/stock err"),
    ("status", "status"),
)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_err"):
        return f"{value:.2e}"
    if key == "spread":
        return f"{100 * value:.1f} %"
    if key in ("x_stock", "err_ratio"):
        return f"{value:.3f}"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 100 else f"{value:.0f}"
    return str(value)


def _ours(doc: dict[str, Any]) -> str:
    """What ours is, for the table's title."""
    s = doc["settings"]
    if s.get("control"):
        return "the stock model's twin, nothing swapped (--control: an A/A run)"
    linear = f"kernel {s['kernel'] or 'default'} ({doc.get('swapped', '?')} Linear swapped)"
    if not s.get("experts"):
        return linear
    return f"experts on gluon_survey ({s['experts']} modules), " + (
        linear if s.get("patch_linear") else "nn.Linear as stock"
    )


def render(doc: dict[str, Any], fmt: str, out: Any = None) -> None:
    """The run (`document`) in `fmt` to `out` (default stdout)."""
    out = out or sys.stdout
    rows = doc["rows"]
    if fmt == "json":
        out.write(json.dumps(doc, indent=2) + "\n")
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([key for key, _ in COLUMNS] + ["error"])
        for r in rows:
            writer.writerow(["" if r.get(k) is None else r.get(k) for k, _ in COLUMNS] + [r.get("error", "")])
    else:
        from rich.console import Console
        from rich.table import Table

        s, env = doc["settings"], doc.get("env") or {}
        table = Table(
            title=f"{PROG}: {s['config']}, {s['layers']} layers, {s['dtype']}, {_ours(doc)}; "
            f"{env.get('name') or 'unknown GPU'}",
            caption="x stock = stock ms / ours ms, stock the row's baseline (> 1: ours faster); errors: rel. "
            "Frobenius against fp32",
        )
        for key, title in COLUMNS:
            table.add_column(
                title,
                justify="left" if key in ("what", "mode", "baseline", "agreement", "status") else "right",
            )
        for r in rows:
            table.add_row(*(_cell(k, r.get(k)) for k, _ in COLUMNS))
        console = Console(file=out, width=200) if out is not sys.stdout else Console(width=200)
        console.print(table)
        for r in rows:
            if r.get("error"):
                where = f"{r['what']} batch {r['batch']} x {r['tokens']} {r['mode']}"
                if r.get("baseline", DENSE_BASELINE) != DENSE_BASELINE:
                    where += f" against {r['baseline']}"
                console.print(f"{where}: {r['error']}")


def document(header: dict[str, Any], rows: Sequence[Row], swapped: int | None = None) -> dict[str, Any]:
    return {**header, "swapped": swapped, "rows": [r.to_json() for r in rows]}


def read_results(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A results file of this command: its header and its rows."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    header = next((r for r in records if r.get("record") == "header"), {})
    return header, [r for r in records if r.get("record") == "row"]


def _step(row: dict[str, Any]) -> str:
    """A summary column: the step and its size (and the decode mode where it is not eager)."""
    if row["what"] == "prefill":
        return f"prefill {row['tokens']}"
    if row["what"] == "decode":
        return f"decode b{row['batch']}" + ("" if row["mode"] == "eager" else f" {row['mode']}")
    return f"train {row['batch']}x{row['tokens']}"


def format_summary(runs: Sequence[tuple[dict[str, Any], list[dict[str, Any]]]]) -> str:
    """Runs of this command as one markdown table: a line per run and baseline (model, layers,
    baseline, GPU, commit), a column per step, each cell x_stock with the spread of its paired
    ratios (ERROR where the row failed, empty where the run has no such row)."""
    lines, columns = [], []
    for _, rows in runs:
        columns += [c for c in map(_step, rows) if c not in columns]
    for header, rows in runs:
        s, env = header.get("settings", {}), header.get("env", {})
        commit = ((env.get("git") or {}).get("commit") or "?")[:7]
        for baseline in dict.fromkeys(r.get("baseline", DENSE_BASELINE) for r in rows):
            cells = {}
            for r in rows:
                if r.get("baseline", DENSE_BASELINE) == baseline:
                    ok = r.get("status") == "OK" and r.get("x_stock") is not None
                    cells[_step(r)] = f"{r['x_stock']:.3f} ({100 * r['spread']:.0f} %)" if ok else "ERROR"
            name = f"{s.get('config', '?')}, {s.get('layers', '?')} layers, vs {baseline}"
            name += " (A/A control: ours is its twin)" if s.get("control") else ""
            gpu = (env.get("name") or "?").replace("NVIDIA ", "")
            lines.append([name, gpu, commit, *(cells.get(c, "") for c in columns)])
    head = ["model", "GPU", "commit", *columns]
    table = [head, ["---"] * 3 + ["---:"] * len(columns), *lines]
    return "\n".join("| " + " | ".join(row) + " |" for row in table) + "\n"


# `<!-- model PATH[,PATH...] -->` ... `<!-- end model -->` in a markdown document: the runs' summary.
MODEL_BLOCK = re.compile(
    r"(?P<open><!-- model (?P<paths>\S+) -->\n)(?P<body>.*?)(?P<close><!-- end model -->)", re.DOTALL
)


def embed_summaries(text: str, root: Path) -> str:
    """`text` with every model block replaced by `format_summary` of its results files (paths
    relative to `root`, comma-separated): how the model tables of docs/results.md are made (make readme)."""

    def render_block(match: re.Match[str]) -> str:
        runs = [read_results(root / path) for path in match["paths"].split(",")]
        return f"{match['open']}{format_summary(runs)}{match['close']}"

    return MODEL_BLOCK.sub(render_block, text)


# ------------------------------------------------------------------------------------------------
# The command


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _progress_bar() -> Any:
    """A rich progress bar on stderr, drawn only on a terminal."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
        transient=True,
    )


def main(argv: Sequence[str], timer: Callable[[Callable[[], object]], float] = cuda_timer) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    try:
        transformers = import_transformers()
    except ImportError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        config = model_config(transformers, args)
    except (ValueError, KeyError, TypeError) as exc:
        print(f"{PROG}: error: --config {args.config}: transformers cannot build it: {exc}", file=sys.stderr)
        return 2
    try:
        experts = count_experts(transformers, config)
    except Exception:  # not on the meta device: the real build decides (build_models checks again)
        experts = None
    if experts is not None:
        try:
            baselines_of(args, experts > 0)
        except ValueError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
    if not _cuda_available():
        from gluon_survey.api import describe_torch_cuda

        print(
            f"{PROG}: error: needs a CUDA GPU that torch can use (torch.cuda.is_available()); found "
            f"{describe_torch_cuda()}. `gluon-survey inspect` compiles kernels without one.",
            file=sys.stderr,
        )
        return 2
    return run(args, transformers, argv, timer)


def run(
    args: argparse.Namespace,
    transformers: Any,
    argv: Sequence[str],
    timer: Callable[[Callable[[], object]], float] = cuda_timer,
    device: str = "cuda",
    env: dict[str, Any] | None = None,
) -> int:
    """Build, measure, write the results file and print the report (the checks are done)."""
    from gluon_survey.driver import results

    if env is None:
        from gluon_survey.driver import hardware

        env = hardware.gpu_info(shlex.join(["gluon-survey", "model", *argv]))
    run_id = results.new_run_id()
    path = args.results or Path("out") / f"model-{run_id}.jsonl"
    header = results.make_header(run_id, env, settings_of(args))
    print(f"{PROG}: building {args.config} with {args.layers} layers ({args.dtype})", file=sys.stderr)
    try:
        models = build_models(transformers, args, device)
    except ValueError as exc:  # an option that does not fit the model, experts the kernel cannot run
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    header["settings"].update(
        swapped=models.swapped,
        skipped=models.skipped,
        experts=len(models.experts),
        baselines=list(models.names()),
    )
    if models.experts:
        print(
            f"{PROG}: ours runs {len(models.experts)} experts modules on gluon_survey, against "
            f"{', '.join(models.names())}",
            file=sys.stderr,
        )
    print(
        f"{PROG}: patched {models.swapped} Linear modules, left {len(models.skipped)} alone", file=sys.stderr
    )
    try:
        writer = results.ResultsWriter(path, header)
    except OSError as exc:
        print(f"{PROG}: error: --results {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    rows: list[Row] = []
    try:
        with writer, _progress_bar() as bar:
            task = bar.add_task("model", total=len(plan(args, models.names())))

            def on_row(row: Row) -> None:
                writer.append(row)
                bar.advance(task)

            rows = measure(
                models, args, on_row, timer, device, lambda what: bar.update(task, description=what)
            )
        render(document(header, rows, models.swapped), args.format)
    finally:
        print(f"{PROG}: results in {path}", file=sys.stderr)
    return 1 if any(r.status != "OK" for r in rows) else 0
