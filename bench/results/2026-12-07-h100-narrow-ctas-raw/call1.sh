#!/usr/bin/env bash
# Call 1 (2026-12-07, seventeenth session): the unrolled k loop A/B (call2.sh of the
# shared-addresses raw folder, unchanged), then ncu's per-kernel durations of the decode-range
# layer (Qwen3-30B-A3B and DeepSeek-V3 at M = 1, 16, 64, 256).
cd "$(dirname "$0")/.."
LIMIT=${LIMIT1:-390} bash .devbin/call2.sh
B=/tmp/b; export LD_LIBRARY_PATH=$B
S=$OUT/r2; mkdir -p $S
for m in 256 64 16 1; do for p in qwen3-30b-a3b deepseek-v3; do
  [ $SECONDS -gt 560 ] && break 2
  timeout 40 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed \
    --print-summary per-kernel $B/nvfp4moe bench --preset $p --m $m --backend HOPPER_WGMMA --no-baseline --iters 5 \
    --out $S/bench-$p-$m > $S/ncu-$p-$m.txt 2>&1
  echo "ncu $p M=$m rc=$? at ${SECONDS}s" >> $S/summary.txt
done; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S/summary.txt
tar -C $OUT -czf $OUT/logs2.tgz r2
cp $OUT/r/summary.txt $OUT/summary1.txt; cp $S/summary.txt $OUT/summary2.txt
rm -rf $OUT/r $OUT/r2
