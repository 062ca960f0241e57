#!/usr/bin/env bash
# Call 3 (2026-12-07, fifteenth session): the committed source (NVFP4MOE_HOPPER_UDESC=1 default;
# the same cubin as call 2's build) against HEAD at the batches call 2 did not time: the GEMMs
# alone at M = 64 and 256 (block_m 8..32 kernels) and 4096 again, alternated three times; the
# whole layer at M = 1, 16, 64, 256, 4096 against HEAD's tool, alternated twice.
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
L=${LIMIT:-400}
t() { echo "[t=${SECONDS}s] $*" >> $S; }
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
timeout 90 $B/gpu_hopper_gemm > $OUT/r/gpu_hopper_gemm.test.txt 2>&1; t "gpu_hopper_gemm tests rc=$?: $(tail -1 $OUT/r/gpu_hopper_gemm.test.txt)"
V="gpu_hopper_gemm_old gpu_hopper_gemm"
for round in 1 2 3; do for v in $V; do
  [ $SECONDS -gt $((L - 150)) ] && break 2
  timeout 60 $B/$v --bench 64,256,4096 --model all > $OUT/r/gemmab-$v$round.txt 2>&1; t "gemm bench $v $round rc=$?"; done; done
AB_M=1,16,64,256,4096 timeout $((L - SECONDS - 5)) bench/h200_check.sh run ab > $OUT/r/h200_ab.log 2>&1
t "ab rc=$?"
tar -C $OUT -czf $OUT/logs.tgz r
