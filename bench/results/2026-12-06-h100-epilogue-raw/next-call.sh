#!/usr/bin/env bash
# The call that was ready when the ninth session's device time ran out (not run). Before it:
#   git apply bench/results/2026-12-06-h100-epilogue-raw/decode-batched-combine.patch
#   rm -rf .devbin && PACK_LEAN=1 bench/h200_check.sh pack
#   main's nvfp4moe (built from the commit before the patch), stripped and gzipped, as
#   .devbin/base/nvfp4moe_base.gz; this file as .devbin/call.sh
# device command: LIMIT=<seconds it may run> bash .devbin/call.sh (carry .devbin and .anchors).
# What it runs: the decode combine's batched id / partial-row reads (new) against main (base):
# gpu_hopper_decode, sanitizers, gpu_test, whole layer at M = 1..64; then, if time is left,
# GEMM1 routing itself vs the routing kernel ahead (with and without PDL).
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
SAN_MEMCHECK="34" SAN_RACECHECK="10" GPUTEST_MODES="auto" AB_M=1,2,4,8,16,64 \
  timeout $((${LIMIT:-280} - 10)) bench/h200_check.sh run decode,sanitize,gputest,ab > $OUT/r/h200_check.log 2>&1
echo "h200_check rc=$? at ${SECONDS}s" >> $S
left=$((${LIMIT:-280} - SECONDS))
if [ $left -gt 50 ]; then
  ENV_AB="fused:NVFP4MOE_HOPPER_FUSED_ROUTE=1 kernel:NVFP4MOE_HOPPER_FUSED_ROUTE=0 kpdl:NVFP4MOE_HOPPER_FUSED_ROUTE=0,NVFP4MOE_HOPPER_PDL=1" \
  ENVAB_M=1,2,4,8,16,64 timeout $((left - 10)) bench/h200_check.sh run envab > $OUT/r/h200_check2.log 2>&1
  echo "envab rc=$? at ${SECONDS}s" >> $S
fi
cat $OUT/summary.txt >> $S
tar -C $OUT -czf $OUT/logs.tgz r
cat $S
