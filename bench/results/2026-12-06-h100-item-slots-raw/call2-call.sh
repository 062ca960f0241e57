#!/usr/bin/env bash
# call 2: v2 (slot + epilogue ids/scales from the slot, working tree) and its st16 variant against
# v1 (8d53dc9) and h0 (173f0af)
cd "$(dirname "$0")/.."
gunzip -f .devbin/base/*.gz; chmod +x .devbin/base/*
B=/tmp/b; R=$OUT/r; S=$OUT/summary.txt
export GPUTEST_MODES="auto rt1 nofuse" AB_M="1024,4096" GSAN_MEMCHECK="14 2 33 38 39 47" GSAN_RACECHECK="14 33 46"
bench/h200_check.sh run gputest,others >/dev/null
bench/h200_check.sh run gsan >/dev/null
timeout 100 $B/gpu_hopper_gemm_st16 > $R/gpu_hopper_gemm_st16.txt 2>&1; echo "st16 tests rc=$? $(tail -1 $R/gpu_hopper_gemm_st16.txt)" >> $S
bench/h200_check.sh run ab >/dev/null
for round in 1 2; do for side in v1 v2 st16; do
  case $side in h0|v1) bin=.devbin/base/gpu_hopper_gemm_$side;; v2) bin=$B/gpu_hopper_gemm;; st16) bin=$B/gpu_hopper_gemm_st16;; esac
  timeout 120 $bin --bench 1024,4096 --model all > $R/gemm-$side$round.txt 2>&1
  echo "gemm alone $side round $round rc=$? $(date +%T)" >> $S
done; done
timeout 60 ncu --clock-control none --section SourceCounters --section WarpStateStats -k regex:hopper_moe_gemm --launch-skip 9 --launch-count 1 --page source --print-source sass --csv $B/gpu_hopper_gemm --bench 4096 --model qwen3-30b-a3b > $R/prof_sass_q_l9.csv 2>&1
echo "prof q done $(date +%T)" >> $S
bench/h200_check.sh run bench,triton >/dev/null
for f in $R/prof_sass*.csv; do gzip $f; done
tar -C $OUT -czf $OUT/logs.tgz r
grep -vE "^\||^==|^##" $S | tail -40
