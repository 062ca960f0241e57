#!/usr/bin/env bash
# Call 2 (same machine, warm, right after call 1; same pack): more sanitizer cases of the lean
# GEMM and a third and fourth whole-layer round against HEAD's tool at M = 1024, 4096.
B=/tmp/b; S=$OUT/s.txt; mkdir -p $OUT/r
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base; chmod +x .devbin/base/nvfp4moe_base
GSAN_MEMCHECK="46 33" GSAN_RACECHECK="47" AB_M=1024,4096 timeout 200 bench/h200_check.sh run ab,gsan > $OUT/r/h.log 2>&1
echo "rc=$? at $SECONDS" >> $S
for s in base new; do bin=$B/nvfp4moe; [ $s = base ] && bin=.devbin/base/nvfp4moe_base
  LD_LIBRARY_PATH=$B timeout 60 $bin bench --m 1024,4096 --preset kimi-k2,mixtral-8x7b,qwen3-30b-a3b,deepseek-v3 \
    --backend HOPPER_WGMMA --no-baseline --iters 20 --out $OUT/r/bench-ab-$s'3' > /dev/null 2>&1
  echo "$s 3 rc=$? at $SECONDS" >> $S; done
tar -C $OUT -czf $OUT/logs.tgz r
