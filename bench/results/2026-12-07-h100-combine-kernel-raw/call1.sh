#!/usr/bin/env bash
# Call 1 (2026-12-07, H100): the deferred-combine patch (2026-12-06-h100-decode-combine-raw/
# deferred-combine.patch applied on df02f48, the knob NVFP4MOE_HOPPER_COMBINE_KERNEL=0|1, default 0)
# packed with `PACK_LEAN=1 bench/h200_check.sh pack`, df02f48's nvfp4moe as .devbin/base.
# Device command: LIMIT=580 bash .devbin/call5.sh   (carry .devbin .anchors)
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
SAN_MEMCHECK="43" SAN_RACECHECK="44" AB_M=1,4,16,64,256 TRITON_MS=1,16,64,256,1024,4096 \
ENV_AB="fused:NVFP4MOE_HOPPER_COMBINE_KERNEL=0 kernel:NVFP4MOE_HOPPER_COMBINE_KERNEL=1" ENVAB_M=1,2,4,8,16,32,64,128,256 \
  timeout $((${LIMIT:-240} - 90)) bench/h200_check.sh run decode,sanitize,envab,ab,triton > $OUT/r/h200_check.log 2>&1
echo "h200_check rc=$? at ${SECONDS}s" >> $S
B=/tmp/b
for pr in qwen3-30b-a3b deepseek-v3; do
  timeout 70 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
    $B/nvfp4moe bench --preset $pr --m 1024,4096 --backend HOPPER_WGMMA \
    --no-baseline --iters 3 --out $OUT/r/pf-$pr > $OUT/r/pf-durations-$pr.txt 2>&1
  echo "ncu prefill $pr rc=$? at ${SECONDS}s" >> $S
done
cat $OUT/summary.txt >> $S
tar -C $OUT -czf $OUT/logs.tgz r
