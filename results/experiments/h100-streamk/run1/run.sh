set -u
WK16=swapab@BLOCK_M=64:BLOCK_N=16:BLOCK_K=256:STAGES=4:SPLIT_K=1
WK64=swapab@BLOCK_M=64:BLOCK_N=64:BLOCK_K=128:STAGES=6:SPLIT_K=1
F16=swapab@BLOCK_M=64:BLOCK_N=16:BLOCK_K=512:STAGES=4:SPLIT_K=1
F64=swapab@BLOCK_M=64:BLOCK_N=64:BLOCK_K=256:STAGES=6:SPLIT_K=1
STEPS=tests PYTEST_K=streamk bash scripts/gpu_session.sh
STEPS=decode DECODE_DTYPES=bf16 DECODE_MODES=torch,streamk,$WK16,$WK64 bash scripts/gpu_session.sh
STEPS=decode DECODE_DTYPES=fp8-tensor,fp8-row DECODE_MODES=torch,streamk,$F16,$F64 bash scripts/gpu_session.sh
