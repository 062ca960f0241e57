#!/usr/bin/env bash
# Call 1 (2026-12-07, twelfth session): the lean epilogue (NVFP4MOE_HOPPER_LEAN_EPI=1, the pack's
# default build; gpu_hopper_gemm_old = the same source at 0 = HEAD's kernel) and, on top of it, the
# second consumer warpgroup started 2 / 5 µs late (st2, st5: NVFP4MOE_HOPPER_STAGGER_NS): tests and
# hash equality, GEMMs alone alternated twice, whole-layer gpu_test, the whole layer against HEAD's
# tool alternated twice, sanitizers, the triton anchor, ncu's source page of the lean GEMM2.
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
L=${LIMIT:-470}
t() { echo "[t=${SECONDS}s] $*" >> $S; }
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
V="gpu_hopper_gemm_old gpu_hopper_gemm gpu_hopper_gemm_st2 gpu_hopper_gemm_st5"
for v in $V; do
  timeout 90 $B/$v > $OUT/r/$v.test.txt 2>&1; t "$v tests rc=$?: $(tail -1 $OUT/r/$v.test.txt)"
done
for v in gpu_hopper_gemm gpu_hopper_gemm_st2 gpu_hopper_gemm_st5; do
  diff <(grep -o 'hash=[0-9a-f]*' $OUT/r/gpu_hopper_gemm_old.test.txt) <(grep -o 'hash=[0-9a-f]*' $OUT/r/$v.test.txt) > $OUT/r/hash-$v.diff
  t "hash diff $v vs old: $(wc -l < $OUT/r/hash-$v.diff) lines of $(grep -c 'hash=' $OUT/r/$v.test.txt) hashes"
done
for round in 1 2; do for v in $V; do
  timeout 60 $B/$v --bench 1024,4096 --model all > $OUT/r/gemmab-$v$round.txt 2>&1; t "gemm bench $v $round rc=$?"; done; done
GPUTEST_MODES="auto gemm" GSAN_MEMCHECK="14 39" GSAN_RACECHECK="33" AB_M=256,1024,4096 \
  timeout $((L - SECONDS - 60)) bench/h200_check.sh run gputest,ab,gsan > $OUT/r/h200_check.log 2>&1
t "h200_check gputest,ab,gsan rc=$?"
cp $OUT/summary.txt $OUT/r/h200_summary.txt 2>/dev/null
if [ $SECONDS -lt $((L - 60)) ]; then
  TRITON_MS=1024,4096 timeout $((L - SECONDS - 15)) bench/h200_check.sh run triton > $OUT/r/h200_triton.log 2>&1
  t "triton rc=$?"; cat $OUT/summary.txt >> $OUT/r/h200_summary.txt 2>/dev/null
fi
if [ $SECONDS -lt $((L - 40)) ]; then
  timeout $((L - SECONDS - 10)) compute-sanitizer --tool racecheck $B/gpu_hopper_gemm_st5 --case 33 > $OUT/r/st5_racecheck33.txt 2>&1
  t "st5 racecheck 33 rc=$?: $(grep 'RACECHECK SUMMARY' $OUT/r/st5_racecheck33.txt)"
fi
if [ $SECONDS -lt $((L - 25)) ]; then
  timeout $((L - SECONDS - 5)) ncu --clock-control none --section SourceCounters --section WarpStateStats -k regex:hopper_moe_gemm \
    --launch-skip 9 --launch-count 1 --page source --print-source sass --csv \
    $B/gpu_hopper_gemm --bench 4096 --model qwen3-30b-a3b > $OUT/r/lean_sass_l9.csv 2>&1
  t "ncu lean GEMM2 rc=$?"; gzip $OUT/r/lean_sass_l9.csv
fi
tar -C $OUT -czf $OUT/logs.tgz r
