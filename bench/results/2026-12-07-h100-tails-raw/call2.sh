#!/usr/bin/env bash
# Call 2 (2026-12-07, thirteenth session): what the block_m 128 tails cost. The notail build
# (NVFP4MOE_HOPPER_NOTAIL_PROBE=1, notail-probe.patch: the producer claims and skips the items of
# every block_m 128 tail of at most 32 pairs, so they are not computed) against the built kernel
# (f27e0ac's): the GEMMs alone alternated three times. A probe: its outputs are incomplete.
# Pack: PACK_LEAN=1 HOPPER_VARIANTS="notail:-DNVFP4MOE_HOPPER_NOTAIL_PROBE=1" bench/h200_check.sh pack
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
L=${LIMIT:-300}
t() { echo "[t=${SECONDS}s] $*" >> $S; }
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
timeout 90 $B/gpu_hopper_gemm > $OUT/r/gpu_hopper_gemm.test.txt 2>&1; t "gpu_hopper_gemm tests rc=$?: $(tail -1 $OUT/r/gpu_hopper_gemm.test.txt)"
for round in 1 2 3; do for v in gpu_hopper_gemm gpu_hopper_gemm_notail; do
  [ $SECONDS -gt $((L - 30)) ] && break 2
  timeout 60 $B/$v --bench 4096 --model all > $OUT/r/gemmab-$v$round.txt 2>&1; t "gemm bench $v $round rc=$?"; done; done
tar -C $OUT -czf $OUT/logs.tgz r
