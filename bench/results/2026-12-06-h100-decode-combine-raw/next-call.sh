#!/usr/bin/env bash
# The combine as a kernel after GEMM2 (NVFP4MOE_HOPPER_COMBINE_KERNEL=1) against the combine in
# GEMM2's epilogue (=0, the default): decode tests (every case's second run deferred, compared bit
# for bit with the first), memcheck 43, racecheck 44, the new build (default) against the base
# tool, and both settings of the new build, at M = 1..256. Written and packed in the tenth
# session, never run (no machine started). Before it:
#   git apply bench/results/2026-12-06-h100-decode-combine-raw/deferred-combine.patch
#   rm -rf .devbin && PACK_LEAN=1 bench/h200_check.sh pack
#   the tool of the commit the patch applies to, stripped and gzipped, as .devbin/base/nvfp4moe_base.gz;
#   this file as .devbin/call5.sh
# Device command: LIMIT=<s> bash .devbin/call5.sh   (carry .devbin)
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
SAN_MEMCHECK="43" SAN_RACECHECK="44" AB_M=1,2,4,8,16,32,64,128,256 \
ENV_AB="fused:NVFP4MOE_HOPPER_COMBINE_KERNEL=0 kernel:NVFP4MOE_HOPPER_COMBINE_KERNEL=1" ENVAB_M=1,2,4,8,16,32,64,128,256 \
  timeout $((${LIMIT:-240} - 15)) bench/h200_check.sh run decode,sanitize,ab,envab > $OUT/r/h200_check.log 2>&1
echo "h200_check rc=$? at ${SECONDS}s" >> $S
cat $OUT/summary.txt >> $S
tar -C $OUT -czf $OUT/logs.tgz r
