#!/usr/bin/env bash
# Call 3 (2026-12-07, seventeenth session): block_m 32 with one k group (two weight tiles, the item
# hand-over), one CTA per SM (k1) or two (k2, the pack's default build), against the built kernel
# (old: block_m 64 by the rule at 4..64 pairs per expert). Tests + hashes, SASS spills, the GEMMs
# alone at M = 64..512 alternated twice, the layer (base tool vs this build with block_m 32
# forced), compute-sanitizer on the block_m 32 cases, gpu_test with block_m 32 forced.
cd "$(dirname "$0")/.."
S=$OUT/r; mkdir -p $S
L=${LIMIT:-520}
t() { echo "[t=${SECONDS}s] $*" >> $S/summary.txt; }
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
cuobjdump -sass -arch sm_90a .devbin/v/hopper_gemm_k2.o > $S/sass-k2.full.txt 2>&1
awk '/Function :/{f=$3} /^ +\/\*[0-9a-f]+\*\//{c[f]++; if ($0 ~ /HGMMA/) h[f]++; if ($0 ~ /STL/) l[f]++} END{for (k in c) printf "%s instrs %d HGMMA %d STL %d\n", k, c[k], h[k], l[k]}' $S/sass-k2.full.txt | sort > $S/sass-k2.txt
gzip $S/sass-k2.full.txt
for v in gpu_hopper_gemm gpu_hopper_gemm_k1; do
  timeout 100 $B/$v > $S/$v.test.txt 2>&1; t "$v tests rc=$?: $(tail -1 $S/$v.test.txt)"
done
for v in gpu_hopper_gemm_k1; do
  diff <(grep -o '^[a-z].*hash=[0-9a-f-]*' $S/gpu_hopper_gemm.test.txt | sed 's/ rel=.*hash=/ hash=/') \
       <(grep -o '^[a-z].*hash=[0-9a-f-]*' $S/$v.test.txt | sed 's/ rel=.*hash=/ hash=/') > $S/hash-$v.diff
  t "hash diff k2 vs $v: $(grep -c '^<' $S/hash-$v.diff) of $(grep -c 'hash=' $S/gpu_hopper_gemm.test.txt)"
done
for round in 1 2; do
  [ $SECONDS -gt $((L - 200)) ] && break
  timeout 60 $B/gpu_hopper_gemm_old --bench 64,128,256,512 --model all > $S/gemmab-old$round.txt 2>&1; t "gemm old $round rc=$?"
  HOPPER_BENCH_BLOCK_M=32 timeout 60 $B/gpu_hopper_gemm_k1 --bench 64,128,256,512 --model all > $S/gemmab-k1$round.txt 2>&1; t "gemm k1 $round rc=$?"
  HOPPER_BENCH_BLOCK_M=32 timeout 60 $B/gpu_hopper_gemm --bench 64,128,256,512 --model all > $S/gemmab-k2$round.txt 2>&1; t "gemm k2 $round rc=$?"
done
for round in 1 2; do
  [ $SECONDS -gt $((L - 120)) ] && break
  timeout 60 .devbin/base/nvfp4moe_base bench --m 64,128,256 --backend HOPPER_WGMMA --no-baseline --iters 20 --out $S/layer-base$round > $S/layer-base$round.log 2>&1; t "layer base $round rc=$?"
  NVFP4MOE_HOPPER_BLOCK_M=32 timeout 60 $B/nvfp4moe bench --m 64,128,256 --backend HOPPER_WGMMA --no-baseline --iters 20 --out $S/layer-k2$round > $S/layer-k2$round.log 2>&1; t "layer k2 (block_m 32) $round rc=$?"
done
for c in 48 49 50 61; do
  [ $SECONDS -gt $((L - 60)) ] && break
  timeout 60 compute-sanitizer --tool memcheck $B/gpu_hopper_gemm --case $c > $S/memcheck$c.txt 2>&1; t "memcheck $c rc=$?: $(grep -E 'ERROR SUMMARY' $S/memcheck$c.txt)"
done
for c in 48 62; do
  [ $SECONDS -gt $((L - 50)) ] && break
  timeout 60 compute-sanitizer --tool racecheck $B/gpu_hopper_gemm --case $c > $S/racecheck$c.txt 2>&1; t "racecheck $c rc=$?: $(grep -E 'RACECHECK SUMMARY' $S/racecheck$c.txt)"
done
if [ $SECONDS -lt $((L - 45)) ]; then
  GPUTEST_SEED=1796649155 NVFP4MOE_HOPPER_REGIME=gemm NVFP4MOE_HOPPER_BLOCK_M=32 timeout $((L - SECONDS - 5)) $B/gpu_test > $S/gpu_test_bm32.txt 2>&1; t "gpu_test gemm bm32 rc=$?: $(tail -1 $S/gpu_test_bm32.txt)"
fi
tar -C $OUT -czf $OUT/logs3.tgz r
cp $S/summary.txt $OUT/summary3.txt; rm -rf $S
