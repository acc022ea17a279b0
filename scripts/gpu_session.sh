#!/usr/bin/env bash
# Everything a GPU lease is for, in one call: the GPU tests, then the survey. Logs and results go
# under $OUT (the device tool's folder) or out/gpu. Run from the repo root; uses the machine's own
# torch/triton (PYTHONPATH=src, nothing installed).
#   STEPS=tests,bench (default) | tests | bench     MODES=Blocked,... (default: all)
#   DTYPES=fp16,bf16   BENCH_ARGS="--k 512,16384"   RUNS=2 (independent survey runs, in $OUT/runs.tgz)
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
bench() {  # one complete survey run into folder $1
  mkdir -p "$1"
  python3 -m gluon_survey ${MODES:-} --dtype "$DTYPES" --results "$1/results.jsonl" \
    --plot "$1/plot.png" ${BENCH_ARGS:-} 2>"$1/bench.err" | tee "$1/table.txt"
  tail -5 "$1/bench.err"
  python3 -m gluon_survey report "$1/results.jsonl" --format markdown --output "$1/table.md"
  python3 -m gluon_survey report "$1/results.jsonl" --format legacy --output "$1/legacy.txt"
}
if [[ ",$STEPS," == *",bench,"* ]]; then
  if [[ ${RUNS:-1} == 1 ]]; then
    bench "$OUT"
  else  # independent runs, one after the other, packed into one archive (the device tool returns few files)
    for r in $(seq 1 "$RUNS"); do bench "$OUT/run$r"; done
    tar czf "$OUT/runs.tgz" -C "$OUT" $(seq -f 'run%g' 1 "$RUNS") && rm -r $(seq -f "$OUT/run%g" 1 "$RUNS")
  fi
fi
