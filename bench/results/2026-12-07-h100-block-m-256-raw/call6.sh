#!/usr/bin/env bash
# Call 6 (2026-12-07, fourteenth session): the NVFP4MOE_HOPPER_BLOCK_M knob as landed (a3e9580's
# src/backends/cuda.c, in this pack): gpu_test with the larger-batch GEMM forced to block_m 64 and
# 128 at every M, and a refused value.
cd "$(dirname "$0")/.."
mkdir -p $OUT/r; S=$OUT/r/summary.txt
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
echo "$(nvidia-smi --query-gpu=name --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')" >> $S
for bm in 64 128; do
  NVFP4MOE_HOPPER_REGIME=gemm NVFP4MOE_HOPPER_BLOCK_M=$bm timeout 100 $B/gpu_test > $OUT/r/gpu_test_bm$bm.txt 2>&1
  echo "gpu_test gemm block_m $bm rc=$?: $(grep passed $OUT/r/gpu_test_bm$bm.txt | tail -1)" >> $S; grep FAIL $OUT/r/gpu_test_bm$bm.txt | head -3 >> $S
done
for v in 4 96 256; do
  NVFP4MOE_HOPPER_BLOCK_M=$v timeout 30 $B/nvfp4moe bench --m 64 --preset qwen3-30b-a3b --backend HOPPER_WGMMA --no-baseline --iters 2 > $OUT/r/bad$v.txt 2>&1
  echo "block_m $v rc=$?: $(grep -i "BLOCK_M" $OUT/r/bad$v.txt | head -2 | tr '\n' ' ')" >> $S
done
