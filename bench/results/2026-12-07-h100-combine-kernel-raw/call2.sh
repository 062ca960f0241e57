#!/usr/bin/env bash
# Call 2: the combine as a kernel from 2 tokens / 8 pairs (tri-state default) against df02f48:
# tests, sanitizers, whole-layer A/B at M = 1..4096 with SM clock/power logged; the batched
# epilogue variants (NVFP4MOE_HOPPER_EPI_BATCH=2, 4) against the built GEMM (tests, GEMMs alone,
# alternately twice); prefill profile of Qwen3-30B-A3B M = 4096.
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 250 > $OUT/r/smi.csv 2>&1 &
SMI=$!
GPUTEST_MODES="auto decode pdl" SAN_MEMCHECK="3 34" SAN_RACECHECK="10" AB_M=1,2,4,8,16,32,64,128,256,1024,4096 \
  timeout 300 bench/h200_check.sh run decode,sanitize,gputest,ab > $OUT/r/h200_check.log 2>&1
echo "h200_check rc=$? at ${SECONDS}s" >> $S
B=/tmp/b
NVFP4MOE_HOPPER_REGIME=decode NVFP4MOE_HOPPER_COMBINE_KERNEL=0 timeout 60 $B/gpu_test > $OUT/r/gpu_test_decode_epi.txt 2>&1
echo "gpu_test decode, combine in GEMM2 (=0) rc=$?: $(grep passed $OUT/r/gpu_test_decode_epi.txt | tail -1) at ${SECONDS}s" >> $S
for v in b2 b4; do
  timeout 60 $B/gpu_hopper_gemm_$v > $OUT/r/gemm_$v.test.txt 2>&1
  echo "gpu_hopper_gemm_$v tests rc=$?: $(tail -1 $OUT/r/gemm_$v.test.txt) at ${SECONDS}s" >> $S
done
timeout 60 $B/gpu_hopper_gemm > $OUT/r/gemm_base.test.txt 2>&1
echo "gpu_hopper_gemm tests rc=$?: $(tail -1 $OUT/r/gemm_base.test.txt)" >> $S
for round in 1 2; do
  for v in base b2 b4; do
    [ $SECONDS -gt $((${LIMIT:-500} - 80)) ] && break 2
    bin=$B/gpu_hopper_gemm; [ $v != base ] && bin=$B/gpu_hopper_gemm_$v
    timeout 100 $bin --bench 1024,4096 --model all > $OUT/r/gemmab-$v$round.txt 2>&1
    echo "gemm bench $v round $round rc=$? at ${SECONDS}s" >> $S
  done
done
if [ $SECONDS -lt $((${LIMIT:-500} - 70)) ]; then
  PROF_CASES="qwen3-30b-a3b:4096" timeout $((${LIMIT:-500} - SECONDS - 15)) bench/h200_check.sh run prof > $OUT/r/h200_check_prof.log 2>&1
  echo "prof rc=$? at ${SECONDS}s" >> $S
fi
kill $SMI
cat $OUT/summary.txt >> $S
tar -C $OUT -czf $OUT/logs.tgz r
