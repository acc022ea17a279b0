#!/usr/bin/env bash
# docs/perf-notes.md, entry 37: the whole-K tile with 128 weight rows against 64, at M = 64,
# kernel-only (scripts/kernel_time.py through scripts/gpu_session.sh's decode step).
set -u
S=results/experiments/h100-tall-tile/shapes-m64.csv
W='swapab@BLOCK_M=128:BLOCK_N=64:SPLIT_K=1'
w='swapab@BLOCK_M=64:BLOCK_N=64:SPLIT_K=1'
# fp8: BLOCK_K in bytes (elements)
OUT=$OUT/fp8 STEPS=decode DECODE_SHAPES=$S DECODE_DTYPES=fp8-row,fp8-tensor \
  DECODE_MODES="torch,auto,$w:BLOCK_K=256:STAGES=6,$w:BLOCK_K=128:STAGES=6,$W:BLOCK_K=128:STAGES=8,$W:BLOCK_K=256:STAGES=4,$W:BLOCK_K=128:STAGES=4,$W:BLOCK_K=64:STAGES=6" \
  bash scripts/gpu_session.sh
# bf16: the same rings in bytes, K steps half as many elements
OUT=$OUT/bf16 STEPS=decode DECODE_SHAPES=$S DECODE_DTYPES=bf16 \
  DECODE_MODES="torch,auto,$w:BLOCK_K=128:STAGES=6,$w:BLOCK_K=64:STAGES=6,$W:BLOCK_K=64:STAGES=8,$W:BLOCK_K=128:STAGES=4,$W:BLOCK_K=64:STAGES=4,$W:BLOCK_K=32:STAGES=6" \
  bash scripts/gpu_session.sh
