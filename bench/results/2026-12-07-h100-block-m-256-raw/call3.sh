#!/usr/bin/env bash
# Call 3 (2026-12-07, fourteenth session): why the block_m 256 form is slower. The GEMMs alone at
# M = 4096, alternated twice: the built kernel; st3 (the built kernel with 3 stages instead of 4:
# NVFP4MOE_HOPPER_SMEM_BUDGET=163840); bm256 (block-m-256.patch, HOPPER_BENCH_BLOCK_M=256); bm256nw1
# (the same with one token width, 256: no run-time width switch, NVFP4MOE_HOPPER_NW256=1).
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
L=${LIMIT:-300}
t() { echo "[t=${SECONDS}s] $*" >> $S; }
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
for n in bm256 bm256nw1 st3; do gunzip -c .devbin/v/gpu_hopper_gemm_$n.gz > $B/gpu_hopper_gemm_$n && chmod +x $B/gpu_hopper_gemm_$n; done
t "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
for round in 1 2; do for v in "":128 _st3:128 _bm256:256 _bm256nw1:256; do
  [ $SECONDS -gt $((L - 25)) ] && break 2
  n=${v%%:*} bm=${v#*:}
  HOPPER_BENCH_BLOCK_M=$bm timeout 60 $B/gpu_hopper_gemm$n --bench 4096 --model all > $OUT/r/gemmab-gpu_hopper_gemm$n$round.txt 2>&1; t "gemm bench $n bm$bm $round rc=$?"; done; done
tar -C $OUT -czf $OUT/logs.tgz r
