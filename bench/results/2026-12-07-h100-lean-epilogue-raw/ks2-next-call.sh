#!/usr/bin/env bash
# Not run yet (no device machine started in time). Before the call:
#   rm -rf .devbin && PACK_LEAN=1 HOPPER_VARIANTS="ks64:-DNVFP4MOE_HOPPER_KS2_MAX_BM=64 ks128:-DNVFP4MOE_HOPPER_KS2_MAX_BM=128" bench/h200_check.sh pack
#   this file as .devbin/call.sh; device command: LIMIT=<s> bash .devbin/call.sh (carry .devbin)
# ptxas (-Xptxas -v): the KS = 2 kernels at block_m 64 spill 4 / 20 bytes, at block_m 128 (RT = 1) 92 / 104 bytes.
# Call 3 (2026-12-07, twelfth session): the k-group split (KS = 2: four consumer warpgroups, each
# pair splitting a k tile's steps) at block_m 64 (ks64: NVFP4MOE_HOPPER_KS2_MAX_BM=64) and at 64
# and 128 (ks128) against the built kernel (KS = 1 from block_m 64: lean epilogue, two weight tiles
# per item, claimed items): tests, the GEMMs alone alternated twice.
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
L=${LIMIT:-300}
t() { echo "[t=${SECONDS}s] $*" >> $S; }
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
V="gpu_hopper_gemm gpu_hopper_gemm_ks64 gpu_hopper_gemm_ks128"
for v in ${TEST_V-$V}; do
  timeout 60 $B/$v > $OUT/r/$v.test.txt 2>&1; t "$v tests rc=$?: $(tail -1 $OUT/r/$v.test.txt)"
  grep -E "^FAIL" $OUT/r/$v.test.txt | head -5 >> $S
done
for round in 1 2; do for v in $V; do
  [ $SECONDS -gt $((L - 35)) ] && break 2
  timeout 60 $B/$v --bench 1024,4096 --model all > $OUT/r/gemmab-$v$round.txt 2>&1; t "gemm bench $v $round rc=$?"; done; done
tar -C $OUT -czf $OUT/logs.tgz r
