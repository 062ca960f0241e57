#!/usr/bin/env bash
# Call 5 (2026-12-07, eighteenth session): call4.sh, then ncu of the block_m 32 kernel at
# Qwen3-30B-A3B M = 64 and 256 (per-kernel durations and DRAM bytes; then SpeedOfLight, memory
# workload and warp-state sections of four GEMM launches at M = 256).
cd "$(dirname "$0")/.."
.devbin/divprobe2 > $OUT/divprobe2.txt 2>&1
LIMIT=${LIMIT4:-330} bash .devbin/call4.sh
B=/tmp/b; export LD_LIBRARY_PATH=$B
S=$OUT/r2; mkdir -p $S
for m in 256 64; do
  [ $SECONDS -gt 480 ] && break
  timeout 40 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed \
    --print-summary per-kernel $B/nvfp4moe bench --preset qwen3-30b-a3b --m $m --backend HOPPER_WGMMA --no-baseline --iters 5 \
    --out $S/bench-$m > $S/ncu-qwen3-$m.txt 2>&1
  echo "ncu M=$m rc=$? at ${SECONDS}s" >> $S/summary.txt
done
if [ $SECONDS -lt 500 ]; then
  timeout $((580 - SECONDS)) ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section LaunchStats --section Occupancy -k regex:hopper_moe_gemm --launch-skip 2 --launch-count 4 \
    $B/nvfp4moe bench --preset qwen3-30b-a3b --m 256 --backend HOPPER_WGMMA --no-baseline --iters 3 --out $S/bench-sec \
    > $S/ncu-sections-256.txt 2>&1
  echo "ncu sections rc=$? at ${SECONDS}s" >> $S/summary.txt
fi
tar -C $OUT -czf $OUT/logs2.tgz r2 && rm -rf $S
ls -la $OUT
