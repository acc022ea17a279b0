set -u
S=swapab@BLOCK_M=64:SPLIT_K=1
T16=torch
for c in 256:4 256:8 256:10 512:4 512:5 1024:2; do T16=$T16,$S:BLOCK_N=16:BLOCK_K=${c%:*}:STAGES=${c#*:}; done
T64=torch
for c in 128:6 128:12 256:4 256:6 512:3; do T64=$T64,$S:BLOCK_N=64:BLOCK_K=${c%:*}:STAGES=${c#*:}; done
for sc in tensor row; do
  python3 scripts/kernel_time.py --shapes out/fp8-16.csv --modes $T16 --dtype fp8 --scaling $sc --output $OUT/fp8-$sc-t16.csv > $OUT/fp8-$sc-t16.log 2>&1
  python3 scripts/kernel_time.py --shapes out/fp8-64.csv --modes $T64 --dtype fp8 --scaling $sc --output $OUT/fp8-$sc-t64.csv > $OUT/fp8-$sc-t64.log 2>&1
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > $OUT/env.txt
tail -2 $OUT/*.log
