#!/usr/bin/env bash
# Everything a GPU lease is for, in one call: the GPU tests, then the survey. Logs and results go
# under $OUT (the device tool's folder) or out/gpu. Run from the repo root; uses the machine's own
# torch/triton (PYTHONPATH=src, nothing installed).
#   STEPS=tests,bench (default) | tests | bench     MODES=Blocked,... (default: all)
#   DTYPES=fp16,bf16   BENCH_ARGS="--k 512,16384"
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
# The tree shipped to a GPU box has no .git: name the commit for the results file.
[[ -f out/commit ]] && export GLUON_SURVEY_COMMIT=$(cat out/commit)
STEPS=${STEPS:-tests,bench}
DTYPES=${DTYPES:-fp16,bf16}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"
if [[ ",$STEPS," == *",tests,"* ]]; then
  python3 -m pytest -m gpu tests -q -p no:cacheprovider --timeout=300 --timeout-method=thread ${PYTEST_ARGS:-} \
    2>&1 | tee "$OUT/pytest-gpu.log" | tail -25
fi
if [[ ",$STEPS," == *",bench,"* ]]; then
  python3 -m gluon_survey ${MODES:-} --dtype "$DTYPES" --results "$OUT/results.jsonl" \
    --plot "$OUT/plot.png" ${BENCH_ARGS:-} 2>"$OUT/bench.err" | tee "$OUT/table.txt"
  tail -5 "$OUT/bench.err"
  python3 -m gluon_survey report "$OUT/results.jsonl" --format markdown --output "$OUT/table.md"
  python3 -m gluon_survey report "$OUT/results.jsonl" --format legacy --output "$OUT/legacy.txt"
fi
