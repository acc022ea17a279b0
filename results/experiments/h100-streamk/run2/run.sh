set -u
WK16=swapab@BLOCK_M=64:BLOCK_N=16:BLOCK_K=256:STAGES=4:SPLIT_K=1
WK64=swapab@BLOCK_M=64:BLOCK_N=64:BLOCK_K=128:STAGES=6:SPLIT_K=1
F16=swapab@BLOCK_M=64:BLOCK_N=16:BLOCK_K=512:STAGES=4:SPLIT_K=1
F64=swapab@BLOCK_M=64:BLOCK_N=64:BLOCK_K=256:STAGES=6:SPLIT_K=1
STEPS=tests PYTEST_K=streamk bash scripts/gpu_session.sh
STEPS=decode DECODE_SHAPES=out/probe-bf16.csv DECODE_DTYPES=bf16 DECODE_MODES=streamk,streamk@HEAD_SUMS=0,streamk@PROGRAMS=64,streamk@PROGRAMS=128,$WK16,$WK64 bash scripts/gpu_session.sh
STEPS=decode DECODE_SHAPES=out/probe-fp8.csv DECODE_DTYPES=fp8-tensor DECODE_MODES=streamk,streamk@HEAD_SUMS=0,streamk@PROGRAMS=128,$F16,$F64 bash scripts/gpu_session.sh
