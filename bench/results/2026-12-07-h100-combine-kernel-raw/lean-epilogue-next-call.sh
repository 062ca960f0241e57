#!/usr/bin/env bash
# The lean epilogue (lean-epilogue.patch, NVFP4MOE_HOPPER_LEAN_EPI=1 builds it; 0, the patch's
# default, compiles to the cubin of the commit it applies to): written and compiled after call 2
# of 2026-12-07 (ptxas: 0 spills except the block_m 128 two-width kernels, 20/24 bytes against
# 16/16 before), never run. Before the call:
#   git apply bench/results/2026-12-07-h100-combine-kernel-raw/lean-epilogue.patch
#   rm -rf .devbin && PACK_LEAN=1 HOPPER_VARIANTS="lean:-DNVFP4MOE_HOPPER_LEAN_EPI=1" bench/h200_check.sh pack
#   this file as .devbin/call.sh
# Device command: LIMIT=<s> bash .devbin/call.sh   (carry .devbin .anchors)
# What it runs: the variant's gpu_hopper_gemm tests (its hash column must equal the built
# kernel's on every case whose bits are defined: same bits), the variant under memcheck and
# racecheck, the GEMMs alone built / lean alternately twice, and ncu's source page of the lean
# GEMM2 at Qwen3-30B-A3B M = 4096 (the epilogue's instruction count per item: 1803 before).
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
for v in gpu_hopper_gemm gpu_hopper_gemm_lean; do
  timeout 90 $B/$v > $OUT/r/$v.test.txt 2>&1; echo "$v tests rc=$?: $(tail -1 $OUT/r/$v.test.txt)" >> $S
done
diff <(grep -o 'hash=[0-9a-f]*' $OUT/r/gpu_hopper_gemm.test.txt) <(grep -o 'hash=[0-9a-f]*' $OUT/r/gpu_hopper_gemm_lean.test.txt) \
  > $OUT/r/hash.diff; echo "hash diff lines: $(wc -l < $OUT/r/hash.diff)" >> $S
for c in 14 39 46; do timeout 150 compute-sanitizer --tool memcheck $B/gpu_hopper_gemm_lean --case $c > $OUT/r/lean_memcheck$c.txt 2>&1
  echo "lean memcheck $c: $(grep 'ERROR SUMMARY' $OUT/r/lean_memcheck$c.txt)" >> $S; done
for c in 33 47; do timeout 200 compute-sanitizer --tool racecheck $B/gpu_hopper_gemm_lean --case $c > $OUT/r/lean_racecheck$c.txt 2>&1
  echo "lean racecheck $c: $(grep 'RACECHECK SUMMARY' $OUT/r/lean_racecheck$c.txt)" >> $S; done
for round in 1 2; do for v in gpu_hopper_gemm gpu_hopper_gemm_lean; do
  timeout 100 $B/$v --bench 1024,4096 --model all > $OUT/r/gemmab-$v$round.txt 2>&1; echo "bench $v $round rc=$?" >> $S; done; done
timeout 200 ncu --clock-control none --section SourceCounters --section WarpStateStats -k regex:hopper_moe_gemm \
  --launch-skip 9 --launch-count 1 --page source --print-source sass --csv \
  $B/gpu_hopper_gemm_lean --bench 4096 --model qwen3-30b-a3b > $OUT/r/lean_sass_l9.csv 2>&1
echo "ncu lean GEMM2 rc=$?" >> $S
tar -C $OUT -czf $OUT/logs.tgz r
