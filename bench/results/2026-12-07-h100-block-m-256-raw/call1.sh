#!/usr/bin/env bash
# Call 1 (2026-12-07, fourteenth session): block_m 256 (one weight tile per item, token tile widths
# 256 - 32 j in one m64nWk16 accumulator set, GU items of 64 gate rows + their up rows exchanging
# halves through the last stage). Correctness (gpu_hopper_gemm with the new cases, compute-sanitizer
# memcheck/racecheck on them, gpu_test through the layer with block_m 256 forced), then the GEMMs
# alone at block_m 128 vs 256 (and the base build at 128), then the whole layer at 128 vs 256 with
# the triton_kernels anchor in the same call.
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
L=${LIMIT:-540}
t() { echo "[t=${SECONDS}s] $*" >> $S; }
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
BASE=.devbin/base; [ -f $BASE/gpu_hopper_gemm_base.gz ] && gunzip -kf $BASE/*.gz && chmod +x $BASE/gpu_hopper_gemm_base
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
timeout 150 $B/gpu_hopper_gemm > $OUT/r/gpu_hopper_gemm.test.txt 2>&1; t "gpu_hopper_gemm tests rc=$?: $(tail -1 $OUT/r/gpu_hopper_gemm.test.txt)"
grep -E "^FAIL|bm256|bm=256" $OUT/r/gpu_hopper_gemm.test.txt | cut -c1-200 >> $S
for c in 47 49 55 68 70; do
  timeout 60 compute-sanitizer --tool memcheck $B/gpu_hopper_gemm --case $c > $OUT/r/memcheck$c.txt 2>&1
  t "memcheck $c rc=$?: $(grep -E 'ERROR SUMMARY' $OUT/r/memcheck$c.txt)"; done
for c in 47 55 70; do
  timeout 90 compute-sanitizer --tool racecheck $B/gpu_hopper_gemm --case $c > $OUT/r/racecheck$c.txt 2>&1
  t "racecheck $c rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' $OUT/r/racecheck$c.txt | tr '\n' ' ')"; done
for bm in 256; do
  NVFP4MOE_HOPPER_REGIME=gemm NVFP4MOE_HOPPER_BLOCK_M=$bm timeout 120 $B/gpu_test > $OUT/r/gpu_test_bm$bm.txt 2>&1
  t "gpu_test gemm bm$bm rc=$?: $(grep passed $OUT/r/gpu_test_bm$bm.txt | tail -1)"; grep FAIL $OUT/r/gpu_test_bm$bm.txt | head -5 >> $S
done
for round in 1 2; do
  for v in base:128 new:128 new:256; do
    [ $SECONDS -gt $((L - 200)) ] && break 2
    side=${v%%:*} bm=${v#*:}; bin=$B/gpu_hopper_gemm; [ $side = base ] && bin=$BASE/gpu_hopper_gemm_base
    [ -x $bin ] || continue
    HOPPER_BENCH_BLOCK_M=$bm timeout 60 $bin --bench 4096 --model all > $OUT/r/gemm-$side-bm$bm-$round.txt 2>&1
    t "gemm bench $side bm$bm round $round rc=$?"
  done
done
for bm in 128 256; do
  [ $SECONDS -gt $((L - 120)) ] && break
  NVFP4MOE_HOPPER_BLOCK_M=$bm timeout 100 $B/nvfp4moe bench --m 1024,4096 --backend HOPPER_WGMMA --no-baseline \
     --iters 20 --commit "$(cat .devbin/commit | head -1) block_m $bm" --out $OUT/r/bench-bm$bm > $OUT/r/bench-bm$bm.log 2>&1
  t "layer bench bm$bm rc=$?"
done
if [ $SECONDS -lt $((L - 70)) ]; then
  PYTHONUNBUFFERED=1 timeout $((L - SECONDS - 5)) python3 .anchors/triton_moe/bench_triton_moe.py --ms 1024,4096 --no-check --out $OUT/r/triton.json > $OUT/r/triton.log 2>&1
  t "triton rc=$?"; tail -12 $OUT/r/triton.log >> $S
fi
tar -C $OUT -czf $OUT/logs.tgz r
