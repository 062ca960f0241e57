#!/usr/bin/env bash
# Call 1 (2026-12-07, thirteenth session): the k-group split (KS = 2: four consumer warpgroups,
# each pair splitting a k tile's steps) at block_m 64 (ks64: NVFP4MOE_HOPPER_KS2_MAX_BM=64) and at
# 64 and 128 (ks128) against the built kernel (KS = 1 from block_m 64); the epilogue probe (noepi:
# NVFP4MOE_HOPPER_NOEPI_PROBE=1, items not split along K skip their epilogue: what the epilogue
# costs, the bound on overlapping it); tests, hashes, the GEMMs alone alternated twice; Kimi-K2
# M = 1024 whole layer re-timed.
# Pack: PACK_LEAN=1 HOPPER_VARIANTS="ks64:-DNVFP4MOE_HOPPER_KS2_MAX_BM=64 ks128:-DNVFP4MOE_HOPPER_KS2_MAX_BM=128
#   noepi:-DNVFP4MOE_HOPPER_NOEPI_PROBE=1" bench/h200_check.sh pack; device: LIMIT=<s> bash .devbin/call.sh
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
L=${LIMIT:-300}
t() { echo "[t=${SECONDS}s] $*" >> $S; }
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
for v in ${TEST_V-gpu_hopper_gemm gpu_hopper_gemm_ks64 gpu_hopper_gemm_ks128}; do
  timeout 60 $B/$v > $OUT/r/$v.test.txt 2>&1; t "$v tests rc=$?: $(tail -1 $OUT/r/$v.test.txt)"
  grep -E "^FAIL" $OUT/r/$v.test.txt | head -5 >> $S
  [ $v = gpu_hopper_gemm ] && continue
  diff <(grep -o 'hash=[0-9a-f]*' $OUT/r/gpu_hopper_gemm.test.txt) <(grep -o 'hash=[0-9a-f]*' $OUT/r/$v.test.txt) > $OUT/r/hash-$v.diff
  t "hash diff $v: $(wc -l < $OUT/r/hash-$v.diff) lines of $(grep -c 'hash=' $OUT/r/$v.test.txt) hashes"
done
V="gpu_hopper_gemm gpu_hopper_gemm_ks64 gpu_hopper_gemm_ks128 gpu_hopper_gemm_noepi"
for round in 1 2; do for v in $V; do
  [ $SECONDS -gt $((L - 35)) ] && break 2
  timeout 60 $B/$v --bench 1024,4096 --model all > $OUT/r/gemmab-$v$round.txt 2>&1; t "gemm bench $v $round rc=$?"; done; done
tar -C $OUT -czf $OUT/logs.tgz r
for r in 1 2 3; do
  [ $SECONDS -gt $((L - 30)) ] && break
  timeout 60 $B/nvfp4moe bench --preset kimi-k2 --m 1024 --backend HOPPER_WGMMA --no-baseline --iters 20 --out $OUT/r/kimi$r > /dev/null 2>&1; t "kimi round $r rc=$?"
done
tar -C $OUT -czf $OUT/logs.tgz r
