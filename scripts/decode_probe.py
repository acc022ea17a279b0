"""Where a mixture-of-experts model's greedy decode spends its host time, stock against ours: the
`gluon-survey model` models (stock on "grouped_mm", which transformers' generate may switch to
"batched_mm" for decoding), one generate call each per batch, timed alternately; then for each
model the CUDA runtime calls a generate makes (kernel launches, synchronizations, copies) from
torch.profiler and the top of a cProfile by own time.

    PYTHONPATH=src python3 scripts/decode_probe.py --config qwen3-30b-a3b --layers 4 --batches 1,16 \
        --tokens 32 --output out/decode-probe.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from collections import Counter
from pathlib import Path

import torch

from gluon_survey.driver import model as cmd


def _generate(model, ids, tokens: int):
    return model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=tokens,
        min_new_tokens=tokens,
        pad_token_id=0,
    )


def _runtime_calls(fn) -> Counter:
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        torch.cuda.synchronize()
    counts: Counter = Counter()
    for event in prof.events():
        name = event.name
        if name.startswith(("cuda", "cu")) and event.device_type != torch.autograd.DeviceType.CUDA:
            counts[name] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="qwen3-30b-a3b")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batches", type=cmd.int_list, default=[1, 16])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--output", type=Path, required=True)
    opts = parser.parse_args()
    transformers = cmd.import_transformers()
    lines = [f"transformers {transformers.__version__}, torch {torch.__version__}"]
    mixin = transformers.generation.utils.GenerationMixin
    switches = hasattr(mixin, "_optimize_model_for_decode")
    lines.append(f"generate switches grouped_mm to batched_mm: {switches}")
    args = cmd.parse_args(
        ["--config", opts.config, "--layers", str(opts.layers), "--moe-baseline", "grouped_mm,batched_mm"]
    )
    models = cmd.build_models(transformers, args)
    named = {"stock": models.stock, "batched_mm": models.baseline("batched_mm"), "ours": models.ours}
    for batch in opts.batches:
        ids = cmd._tokens(models.stock.config.vocab_size, batch, cmd.PROMPT_TOKENS, 0, "cuda")
        calls = {name: (lambda m=m, ids=ids: _generate(m, ids, opts.tokens)) for name, m in named.items()}
        for fn in calls.values():
            fn()
        times: dict[str, list[float]] = {name: [] for name in calls}
        for r in range(opts.rounds):
            for name in list(calls) if r % 2 == 0 else list(reversed(calls)):
                torch.cuda.synchronize()
                start = time.perf_counter()
                calls[name]()
                torch.cuda.synchronize()
                times[name].append((time.perf_counter() - start) * 1e3)
        for name, ms in times.items():
            lines.append(f"batch {batch}: {name} generate {statistics.median(ms):.1f} ms (runs {ms})")
        for name, fn in calls.items():
            counts = _runtime_calls(fn)
            top = ", ".join(f"{k} x{n}" for k, n in counts.most_common(8))
            lines.append(f"batch {batch}: {name} runtime calls a generate: {top}")
            profiler = cProfile.Profile()
            profiler.enable()
            fn()
            profiler.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            stats.sort_stats("tottime").print_stats(22)
            lines.append(f"== batch {batch}: {name}, cProfile of one generate\n{text.getvalue()}")
        print("\n".join(lines[-9:]), flush=True)
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
