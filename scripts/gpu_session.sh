#!/usr/bin/env bash
# Everything a GPU lease is for, in one call: the GPU tests, the survey and the measurements around
# it. Logs and results go under $OUT (the device tool's folder) or out/gpu. Run from the repo root;
# uses the machine's own torch/triton (PYTHONPATH=src, nothing installed).
#   STEPS=tests,bench (default), any of:
#     tests     pytest -m gpu (PYTEST_K: a -k expression; PYTEST_ARGS: more options, word-split)
#                                                               -> pytest-gpu.log
#     bench     the survey: MODES (default all), DTYPES, BENCH_ARGS -> results.jsonl, table.*, plot.png
#     memcpy    rung 0, the copy ladder, fp16 and bf16          -> memcpy-<dtype>.json/.md/.log
#     overhead  host cost per call at 16 and 1 tokens, and where it goes (scripts/host_probe.py)
#                                                               -> overhead{,-m1}.json/.txt, host-probe.csv/.txt
#     kernel    kernel-only GPU time from CUPTI (scripts/kernel_time.py KERNEL_ARGS) -> kernel-time.csv
#     decode    kernel-only GPU time at M <= 64 (the decode shapes), per DECODE_DTYPES (fp16, bf16,
#               fp8-tensor, fp8-row; default bf16,fp8-tensor), modes DECODE_MODES (default torch,
#               swapab,slab and slab's 16- and 64-row slabs)           -> decode-<dtype>.csv
#     probe     where a slab program's time goes (scripts/slab_probe.py)  -> slab-probe*.csv/.log
#     wholek    where swapab's whole-K tile's time goes (scripts/wholek_probe.py) -> wholek-probe*.csv/.log
#     narrow    swapab's whole-K tile on 32/48 weight rows (scripts/narrow_probe.py NARROW_ARGS) -> narrow-probe.csv/.log
#     readfloor the fastest read of a decode weight's bytes (scripts/read_floor.py) -> read-floor.csv/.log
#     split     split-K in programs of 4-64 KB at the M <= 64 misses (scripts/split_probe.py) -> split-probe.csv/.log
#     grouped   grouped_matmul against torch._grouped_mm and a cuBLAS loop, kernel-only
#               (scripts/grouped_probe.py GROUPED_ARGS)           -> grouped-probe.csv/.log
#     glu       the gate-and-up projection with SwiGLU fused (grouped_swiglu) against grouped_matmul +
#               silu * mul, kernel-only (scripts/glu_probe.py GLU_ARGS, default --tiles)
#                                                               -> glu-probe.csv/.log
#     bias      a product with a bias, fused against matmul + a separate add, ours and cuBLAS,
#               kernel-only (scripts/bias_probe.py BIAS_ARGS, default fp16, bf16, fp8, fp8-row)
#                                                               -> bias-probe.csv/.log
#     pdl       calls back to back on the GPU's timeline, without and with GLUON_SURVEY_PDL=1 (dependent
#               launches), scripts/pdl_probe.py PDL_ARGS (default: --shapes
#               results/experiments/h200-fp8-persistent/shapes-pdl.csv --dtype fp8) -> pdl-<0|1>.csv/.log
#     power     a mode against cuBLAS sustained (after 200 ms of its own calls), at half duty and in
#               bursts after a rest, with SM clocks (scripts/power_probe.py POWER_ARGS, default:
#               --shapes results/experiments/h200-fp8-power/shapes.csv --modes torch,warpspec
#               --dtype fp8)                                      -> power-probe.csv/.log
#     settle    the paired timing at each --settle-ms of SETTLE_LIST (default 0,50,100,200,500):
#               SETTLE_MODES (default warpspec) against cuBLAS, SETTLE_ARGS (default: fp8 on
#               results/experiments/h200-settle-calibration/shapes.csv, 50 ms windows)
#                                                               -> settle-<ms>/results.jsonl, table.md
#     tune      the choice table over TUNE_ARGS (default: --shapes llm, both dtypes, B layout t);
#               with --update or --confirm it starts from src/gluon_survey/tables/$TUNE_TABLE.json
#               (default h100)                                  -> tune-table.json, tune.log
#     moe       `--shapes moe` for grouped_matmul (MOE_MODES, default grouped-auto) in bf16 and
#               fp8-row, MOE_ARGS (default short windows)     -> moe-<dtype>/results.jsonl, table.*
#     model     `gluon-survey model` per MODEL_CONFIGS (config:layers, default llama3-8b:4,
#               qwen2.5-7b:4, qwen3-30b-a3b:4, mixtral-8x7b:2), MODEL_ARGS; MODEL_CONTROL=1 also
#               runs each with --control (the A/A band)   -> model-<config>.jsonl/.txt, control-<config>.*
#     linearhost  host and GPU µs a call, Linear against nn.Linear (scripts/linear_host_probe.py)
#                                                               -> linear-host.csv/.log
#     profile   where a model step's time goes (scripts/model_profile.py PROFILE_ARGS) -> profile/
#     sweep     a sweep longer than one call, over several: each call times only what the parts
#               before it lack (--continue-from) into SWEEP_DIR/partN (default /tmp/sweep, which
#               outlives a call on a held machine) and stops itself after SWEEP_S seconds (default
#               540, with SIGINT: the rows so far stay); MODES, DTYPES, SWEEP_ARGS (default
#               --shapes llm-dense --b-layout t, short windows) -> sweep/partN/ (every part so far)
#   DTYPES=fp16,bf16   RUNS=2 (independent survey runs)   PACK=1 (one .tgz of everything: the device
#   tool returns at most 8 files; packing is automatic when there are more)
# Several calls in one device command: give each its own OUT outside the device tool's folder and
# tar them into it at the end (the 8-file limit counts the whole folder, and each call packs only
# its own OUT): e.g. OUT=/tmp/w/a ...; OUT=/tmp/w/b ...; tar czf "$DEVICE_OUT/all.tgz" -C /tmp/w .
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
# The tree shipped to a GPU box has no .git: name the commit for the results file.
[[ -f out/commit ]] && export GLUON_SURVEY_COMMIT=$(cat out/commit)
STEPS=${STEPS:-tests,bench}
DTYPES=${DTYPES:-fp16,bf16}
step() { [[ ",$STEPS," == *",$1,"* ]]; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"
if step tests; then
  python3 -m pytest -m gpu tests -q -p no:cacheprovider --timeout=300 --timeout-method=thread ${PYTEST_ARGS:-} \
    ${PYTEST_K:+-k "$PYTEST_K"} \
    2>&1 | tee "$OUT/pytest-gpu.log" | tail -25
fi
if step memcpy; then
  for d in ${DTYPES//,/ }; do
    python3 -m gluon_survey memcpy --dtype "$d" --format markdown --results "$OUT/memcpy-$d.json" \
      --output "$OUT/memcpy-$d.md" ${MEMCPY_ARGS:-} 2>&1 | tee "$OUT/memcpy-$d.log" | tail -8
  done
fi
if step overhead; then
  python3 -m gluon_survey overhead --results "$OUT/overhead.json" ${OVERHEAD_ARGS:-} 2>&1 | tee "$OUT/overhead.txt"
  python3 -m gluon_survey overhead --m 1 --results "$OUT/overhead-m1.json" ${OVERHEAD_ARGS:-} 2>&1 \
    | tee "$OUT/overhead-m1.txt"
  python3 scripts/host_probe.py --output "$OUT/host-probe.csv" 2>&1 | tee "$OUT/host-probe.txt"
fi
if step kernel; then
  python3 scripts/kernel_time.py ${KERNEL_ARGS:---shapes results/h100-decode-gputime/shapes.csv} \
    --output "$OUT/kernel-time.csv" 2>&1 | tee "$OUT/kernel-time.log" | tail -4
fi
if step decode; then
  decode_dtypes=${DECODE_DTYPES:-bf16,fp8-tensor}
  for d in ${decode_dtypes//,/ }; do
    case $d in fp8-*) dt=(--dtype fp8 --scaling "${d#fp8-}") ;; *) dt=(--dtype "$d") ;; esac
    python3 scripts/kernel_time.py --shapes ${DECODE_SHAPES:-results/h100-decode-gputime/shapes.csv} \
      --modes "${DECODE_MODES:-torch,swapab,slab,slab@BLOCK_N=16:num_warps=1,slab@BLOCK_N=64:num_warps=4}" \
      "${dt[@]}" --output "$OUT/decode-$d.csv" 2>&1 | tee "$OUT/decode-$d.log" | tail -3
  done
fi
if step probe; then
  python3 scripts/slab_probe.py --output "$OUT/slab-probe.csv" 2>&1 | tee "$OUT/slab-probe.log" | tail -30
fi
if step wholek; then
  python3 scripts/wholek_probe.py --output "$OUT/wholek-probe.csv" 2>&1 | tee "$OUT/wholek-probe.log" | tail -30
fi
if step narrow; then
  python3 scripts/narrow_probe.py ${NARROW_ARGS:-} --output "$OUT/narrow-probe.csv" 2>&1 | tee "$OUT/narrow-probe.log" | tail -40
fi
if step readfloor; then
  python3 scripts/read_floor.py --output "$OUT/read-floor.csv" 2>&1 | tee "$OUT/read-floor.log" | tail -5
fi
if step split; then
  python3 scripts/split_probe.py --output "$OUT/split-probe.csv" 2>&1 | tee "$OUT/split-probe.log" | tail -5
fi
if step grouped; then
  python3 scripts/grouped_probe.py ${GROUPED_ARGS:-} --output "$OUT/grouped-probe.csv" 2>&1 | tee "$OUT/grouped-probe.log" | tail -30
fi
if step glu; then
  python3 scripts/glu_probe.py ${GLU_ARGS:---tiles} --output "$OUT/glu-probe.csv" 2>&1 | tee "$OUT/glu-probe.log" | tail -40
fi
if step bias; then
  python3 scripts/bias_probe.py ${BIAS_ARGS:---dtype fp16,bf16,fp8,fp8-row} --output "$OUT/bias-probe.csv" 2>&1 \
    | tee "$OUT/bias-probe.log" | tail -5
fi
if step pdl; then
  for p in 0 1; do
    GLUON_SURVEY_PDL=$p python3 scripts/pdl_probe.py ${PDL_ARGS:---shapes results/experiments/h200-fp8-persistent/shapes-pdl.csv --dtype fp8} \
      --output "$OUT/pdl-$p.csv" 2>&1 | tee "$OUT/pdl-$p.log" | tail -16
  done
fi
if step power; then
  PYTHONPATH=src:scripts python3 scripts/power_probe.py \
    ${POWER_ARGS:---shapes results/experiments/h200-fp8-power/shapes.csv --modes torch,warpspec --dtype fp8} \
    --output "$OUT/power-probe.csv" 2>&1 | tee "$OUT/power-probe.log" | tail -6
fi
if step settle; then
  settle_list=${SETTLE_LIST:-0,50,100,200,500}
  for ms in ${settle_list//,/ }; do
    mkdir -p "$OUT/settle-$ms"
    python3 -m gluon_survey ${SETTLE_MODES:-warpspec} ${SETTLE_ARGS:---dtype fp8 --b-layout t \
      --shapes results/experiments/h200-settle-calibration/shapes.csv --warmup-ms 200 --min-ms 50 --rounds 3} \
      --settle-ms "$ms" --results "$OUT/settle-$ms/results.jsonl" 2>"$OUT/settle-$ms/bench.err" >/dev/null
    python3 -m gluon_survey report "$OUT/settle-$ms/results.jsonl" --format markdown --output "$OUT/settle-$ms/table.md"
    echo "settle $ms: $(tail -1 "$OUT/settle-$ms/bench.err")"
  done
fi
if step tune; then
  # --update and --confirm work on a table at --output: start from the committed one (TUNE_TABLE)
  if [[ " ${TUNE_ARGS:-} " == *" --update "* || " ${TUNE_ARGS:-} " == *" --confirm "* ]] && [[ ! -f "$OUT/tune-table.json" ]]; then
    cp "src/gluon_survey/tables/${TUNE_TABLE:-h100}.json" "$OUT/tune-table.json"
  fi
  python3 -m gluon_survey tune ${TUNE_ARGS:---shapes llm --dtype fp16,bf16 --b-layout t --name h100 --match H100} \
    --output "$OUT/tune-table.json" 2>&1 | tee "$OUT/tune.log" | tail -12
fi
if step moe; then
  for d in bf16 fp8-row; do
    mkdir -p "$OUT/moe-$d"
    python3 -m gluon_survey ${MOE_MODES:-grouped-auto} --shapes moe --dtype "$d" \
      ${MOE_ARGS:---warmup-ms 50 --min-ms 20 --rounds 3} --results "$OUT/moe-$d/results.jsonl" \
      2>"$OUT/moe-$d/bench.err" | tee "$OUT/moe-$d/table.txt" | tail -3
  done
fi
if step model; then
  for spec in ${MODEL_CONFIGS:-llama3-8b:4 qwen2.5-7b:4 qwen3-30b-a3b:4 mixtral-8x7b:2}; do
    python3 -m gluon_survey model --config "${spec%%:*}" --layers "${spec##*:}" ${MODEL_ARGS:-} \
      --results "$OUT/model-${spec%%:*}.jsonl" 2>&1 | tee "$OUT/model-${spec%%:*}.txt" | tail -14
    if [[ ${MODEL_CONTROL:-0} == 1 ]]; then  # the A/A band of the same rows, same lease
      python3 -m gluon_survey model --config "${spec%%:*}" --layers "${spec##*:}" ${MODEL_ARGS:-} --control \
        --results "$OUT/control-${spec%%:*}.jsonl" 2>&1 | tee "$OUT/control-${spec%%:*}.txt" | tail -14
    fi
  done
fi
if step linearhost; then
  python3 scripts/linear_host_probe.py --output "$OUT/linear-host.csv" 2>&1 | tee "$OUT/linear-host.log" | tail -16
fi
if step profile; then
  python3 scripts/model_profile.py ${PROFILE_ARGS:---config llama3-8b --layers 4 --steps prefill,decode,train \
    --prefill-tokens 512 --decode-batch 64 --decode-tokens 8 --host} --output "$OUT/profile" 2>&1 \
    | tee "$OUT/profile.log" | grep "==\|host "
fi
if step sweep; then
  dir=${SWEEP_DIR:-/tmp/sweep}
  n=$(find "$dir" -maxdepth 1 -name 'part*' -type d 2>/dev/null | wc -l)
  part="$dir/part$((n + 1))"
  mkdir -p "$part"
  earlier=()
  for f in "$dir"/part*/results.jsonl; do [[ -f $f ]] && earlier+=(--continue-from "$f"); done
  timeout --signal=INT "${SWEEP_S:-540}" python3 -m gluon_survey ${MODES:-} --dtype "$DTYPES" \
    ${SWEEP_ARGS:---shapes llm-dense --b-layout t --warmup-ms 50 --min-ms 20 --rounds 1} \
    "${earlier[@]}" --results "$part/results.jsonl" 2>"$part/bench.err" >"$part/table.txt"
  echo "sweep: part$((n + 1)) exited $?"
  tail -3 "$part/bench.err"
  [[ -f $part/results.jsonl ]] || rm -rf "$part"  # nothing was left to measure
  mkdir -p "$OUT/sweep" && cp -r "$dir"/. "$OUT/sweep/"
fi
bench() {  # one complete survey run into folder $1
  mkdir -p "$1"
  python3 -m gluon_survey ${MODES:-} --dtype "$DTYPES" --results "$1/results.jsonl" \
    --plot "$1/plot.png" ${BENCH_ARGS:-} 2>"$1/bench.err" | tee "$1/table.txt"
  tail -5 "$1/bench.err"
  python3 -m gluon_survey report "$1/results.jsonl" --format markdown --output "$1/table.md"
  python3 -m gluon_survey report "$1/results.jsonl" --format legacy --output "$1/legacy.txt"
}
if step bench; then
  if [[ ${RUNS:-1} == 1 ]]; then
    bench "$OUT"
  else
    for r in $(seq 1 "$RUNS"); do bench "$OUT/run$r"; done
  fi
fi
# The device tool returns at most 8 files: pack them when there are more (or when asked).
if [[ ${PACK:-0} == 1 || $(find "$OUT" -type f | wc -l) -gt 8 ]]; then
  tar czf /tmp/session.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/session.tgz "$OUT/session.tgz"
fi
