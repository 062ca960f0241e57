#!/usr/bin/env bash
# Call 5 (2026-12-07, fourteenth session): is the m64n256k16 instruction what makes the block_m 256
# form slow? bm256nw1 (block-m-256.patch, one width: every item 256 columns, m64n256k16) against
# bm256split (the same with each m64n256k16 issued as two m64n128k16 on the two token halves,
# NVFP4MOE_HOPPER_SPLIT256=1, split256-probe.patch) and the built kernel at block_m 128; the GEMMs
# alone at M = 4096, alternated twice.
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
L=${LIMIT:-200}
t() { echo "[t=${SECONDS}s] $*" >> $S; }
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
for n in bm256nw1 bm256split; do gunzip -c .devbin/v/gpu_hopper_gemm_$n.gz > $B/gpu_hopper_gemm_$n && chmod +x $B/gpu_hopper_gemm_$n; done
t "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
for round in 1 2; do for v in "":128 _bm256nw1:256 _bm256split:256; do
  [ $SECONDS -gt $((L - 22)) ] && break 2
  n=${v%%:*} bm=${v#*:}
  HOPPER_BENCH_BLOCK_M=$bm timeout 40 $B/gpu_hopper_gemm$n --bench 4096 --model all > $OUT/r/gemmab-gpu_hopper_gemm$n$round.txt 2>&1; t "gemm bench $n bm$bm $round rc=$?"; done; done
tar -C $OUT -czf $OUT/logs.tgz r
