#!/usr/bin/env bash
# Kernel-only times of slab (with its accumulator chains), the slab heights and swapab with one
# 64-row wgmma tile and no split (SPLIT_K=1), per token group; then the probe. From the repo root:
#   OUT=... bash results/experiments/h100-slab-probe/run.sh
set -uo pipefail
D=results/experiments/h100-slab-probe
export PYTHONPATH=src
OUT=${OUT:-out/gpu}; mkdir -p "$OUT"
W64="swapab@BLOCK_M=64:num_warps=4:SPLIT_K=1"
kt() { python3 scripts/kernel_time.py --shapes "$D/shapes-$1.csv" --modes "$2" --output "$OUT/chains-$1.csv" 2>&1 | tail -40; }
kt m1 "torch,slab,slab@BLOCK_N=64:num_warps=4,slab@BLOCK_N=16:num_warps=1,$W64:BLOCK_N=8:BLOCK_K=64:STAGES=16,$W64:BLOCK_N=8:BLOCK_K=128:STAGES=8,$W64:BLOCK_N=8:BLOCK_K=256:STAGES=4"
kt m16 "torch,slab,slab@BLOCK_N=64:num_warps=4,$W64:BLOCK_N=16:BLOCK_K=128:STAGES=8,$W64:BLOCK_N=16:BLOCK_K=256:STAGES=4"
kt m64 "torch,slab,slab@BLOCK_N=64:num_warps=4,$W64:BLOCK_N=64:BLOCK_K=64:STAGES=12,$W64:BLOCK_N=64:BLOCK_K=128:STAGES=6"
python3 scripts/slab_probe.py --output "$OUT/slab-probe.csv" > "$OUT/slab-probe.log" 2>&1; tail -3 "$OUT/slab-probe.log"
