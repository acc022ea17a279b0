#!/usr/bin/env bash
# docs/perf-notes.md, entry 38: the fp8 whole-K tile (64 weight rows, one program an SM) on other
# rings, at M = 16 and 64 on the weights with at most one wave of 64-row tiles, kernel-only.
# BLOCK_K in bytes; the package's rings are 512 x 4 (16 tokens) and 256 x 6 (64 tokens).
set -u
S=results/experiments/h100-fp8-deeper-ring/shapes.csv
w16='swapab@BLOCK_M=64:BLOCK_N=16:SPLIT_K=1'
w64='swapab@BLOCK_M=64:BLOCK_N=64:SPLIT_K=1'
OUT=$OUT STEPS=decode DECODE_SHAPES=$S DECODE_DTYPES=fp8-tensor,fp8-row \
  DECODE_MODES="torch,auto,$w16:BLOCK_K=512:STAGES=4,$w16:BLOCK_K=512:STAGES=5,$w64:BLOCK_K=256:STAGES=6,$w64:BLOCK_K=512:STAGES=3,$w64:BLOCK_K=128:STAGES=12" \
  bash scripts/gpu_session.sh
