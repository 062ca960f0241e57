#!/usr/bin/env bash
# Call 2 (2026-12-07, fourteenth session): (1) how much the activation bytes cost the block_m 128
# GEMM: the halfact probe (NVFP4MOE_HOPPER_HALFACT_PROBE=1, halfact-probe.patch: the producer fetches
# every other 8-row group of activations only, so half the activation bytes; outputs wrong) against
# the built kernel, the GEMMs alone alternated twice; (2) ncu on the GEMMs at M = 4096, the built
# kernel (block_m 128) and the block_m 256 form (block-m-256.patch, gpu_hopper_gemm_bm256).
# Pack: PACK_LEAN=1 HOPPER_VARIANTS="halfact:-DNVFP4MOE_HOPPER_HALFACT_PROBE=1" bench/h200_check.sh pack
# with halfact-probe.patch applied; gpu_hopper_gemm_bm256 built from e3e4d2e + block-m-256.patch.
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
L=${LIMIT:-420}
t() { echo "[t=${SECONDS}s] $*" >> $S; }
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
gunzip -c .devbin/v/gpu_hopper_gemm_bm256.gz > $B/gpu_hopper_gemm_bm256 && chmod +x $B/gpu_hopper_gemm_bm256
t "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
for round in 1 2; do for v in gpu_hopper_gemm gpu_hopper_gemm_halfact; do
  [ $SECONDS -gt $((L - 250)) ] && break 2
  timeout 60 $B/$v --bench 1024,4096 --model all > $OUT/r/gemmab-$v$round.txt 2>&1; t "gemm bench $v $round rc=$?"; done; done
sec="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats"
met="--metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum"
for m in deepseek-v3:4096 mixtral-8x7b:4096; do
  pm=${m%%:*} pM=${m#*:}
  for v in gpu_hopper_gemm:128 gpu_hopper_gemm_bm256:256; do
    bin=${v%%:*} bm=${v#*:}
    for l in 8 9; do
      [ $SECONDS -gt $((L - 25)) ] && break 3
      HOPPER_BENCH_BLOCK_M=$bm timeout 100 ncu --clock-control none $sec $met -k regex:hopper_moe_gemm --launch-skip $l --launch-count 1 \
          $B/$bin --bench $pM --model $pm > $OUT/r/prof_${pm%%-*}_bm${bm}_l$l.txt 2>&1
      t "prof $pm $pM bm$bm launch $l rc=$?: $(grep -E 'Duration|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|Issue Slots Busy|gmma_cycles|No Eligible' $OUT/r/prof_${pm%%-*}_bm${bm}_l$l.txt | tr -s ' ' | tr '\n' ';')"
    done
  done
done
tar -C $OUT -czf $OUT/logs.tgz r
