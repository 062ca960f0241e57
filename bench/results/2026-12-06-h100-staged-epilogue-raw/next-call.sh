#!/usr/bin/env bash
# call 5 (eighth session, short of device time): the staged epilogue (build) against pst
# (STAGED_EPI=0, = ee02ee7's kernel): tests, sanitizers, GEMMs alone alternately, gpu_test
cd "$(dirname "$0")/.."
B=/tmp/b; R=$OUT/r; S=$OUT/r/summary.txt
mkdir -p $R; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
T0=$(date +%s)
lg() { echo "[t=$(($(date +%s) - T0))s] $*" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; }
lg "$(cat .devbin/commit | tr '\n' ' ') $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
timeout 60 $B/gpu_hopper_gemm > $R/gpu_hopper_gemm.txt 2>&1; rc=$?; lg "gpu_hopper_gemm (staged) rc=$rc $(tail -1 $R/gpu_hopper_gemm.txt)"
grep -E "FAIL|mismatch" $R/gpu_hopper_gemm.txt | head -8 >> $S
[ $rc = 124 ] && { lg "hung: stop"; exit 1; }
timeout 30 compute-sanitizer --tool memcheck $B/gpu_hopper_gemm --case 39 > $R/memcheck39.txt 2>&1; lg "memcheck 39: $(grep 'ERROR SUMMARY' $R/memcheck39.txt)"
timeout 30 compute-sanitizer --tool racecheck $B/gpu_hopper_gemm --case 33 > $R/racecheck33.txt 2>&1; lg "racecheck 33: $(grep 'RACECHECK SUMMARY' $R/racecheck33.txt)"
for round in 1 2; do for side in stg pst; do
  bin=$B/gpu_hopper_gemm; [ $side = pst ] && bin=$B/gpu_hopper_gemm_pst
  timeout 60 $bin --bench 1024,4096 --model all > $R/gemm-$side$round.txt 2>&1
  lg "gemm alone $side round $round rc=$?"
done; done
timeout 60 $B/gpu_test > $R/gpu_test_auto.txt 2>&1; lg "gpu_test auto rc=$? $(tail -1 $R/gpu_test_auto.txt)"
grep -E "^FAIL" $R/gpu_test_auto.txt | head -5 >> $S
timeout 30 compute-sanitizer --tool memcheck $B/gpu_hopper_gemm --case 14 > $R/memcheck14.txt 2>&1; lg "memcheck 14: $(grep 'ERROR SUMMARY' $R/memcheck14.txt)"
NVFP4MOE_HOPPER_REGIME=gemm timeout 60 $B/gpu_test --only layer > $R/gpu_test_layer.txt 2>&1; lg "gpu_test layers, gemm forced, rc=$? $(tail -1 $R/gpu_test_layer.txt)"
grep -E "^FAIL" $R/gpu_test_layer.txt | head -5 >> $S
lg done
cat $S
