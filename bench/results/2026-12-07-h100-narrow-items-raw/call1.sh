#!/usr/bin/env bash
# Call 1 (2026-12-07, fifteenth session): the narrow items of the wgmma GEMM (an expert's tail block
# of <= 32 pairs). Pack: defaults NVFP4MOE_HOPPER_NARROW=1 (each k tile of a narrow item as two
# 8-step groups, one per 64-row set, wait_group 0) and NVFP4MOE_HOPPER_WPF=4 (the producer's L2
# prefetch of a narrow item's weight chunks 4 k tiles ahead): gpu_hopper_gemm = n1p4;
# variants old (0/0 = HEAD's cubin), n1 (NARROW only), p4 (WPF only). Tests + hashes, the GEMMs
# alone alternated twice, gpu_test, sanitizers, ncu's source page of HEAD's GEMM1 on DeepSeek-V3
# M = 4096 (where the tails wait), the triton anchor, the layer against HEAD's tool.
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
L=${LIMIT:-580}
t() { echo "[t=${SECONDS}s] $*" >> $S; }
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
V="gpu_hopper_gemm_old gpu_hopper_gemm gpu_hopper_gemm_n1 gpu_hopper_gemm_p4"
for v in $V; do
  timeout 90 $B/$v > $OUT/r/$v.test.txt 2>&1; t "$v tests rc=$?: $(tail -1 $OUT/r/$v.test.txt)"
done
for v in gpu_hopper_gemm gpu_hopper_gemm_n1 gpu_hopper_gemm_p4; do
  diff <(grep -o 'hash=[0-9a-f]*' $OUT/r/gpu_hopper_gemm_old.test.txt) <(grep -o 'hash=[0-9a-f]*' $OUT/r/$v.test.txt) > $OUT/r/hash-$v.diff
  t "hash diff $v vs old: $(wc -l < $OUT/r/hash-$v.diff) lines of $(grep -c 'hash=' $OUT/r/$v.test.txt) hashes"
done
for round in 1 2; do for v in $V; do
  timeout 60 $B/$v --bench 1024,4096 --model all > $OUT/r/gemmab-$v$round.txt 2>&1; t "gemm bench $v $round rc=$?"; done; done
GPUTEST_MODES="auto gemm bm64 bm128" GSAN_MEMCHECK="45 46 47 57" GSAN_RACECHECK="47 57" \
  timeout $((L - SECONDS - 150)) bench/h200_check.sh run gputest,gsan > $OUT/r/h200_check.log 2>&1
t "h200_check gputest,gsan rc=$?"
cp $OUT/summary.txt $OUT/r/h200_summary.txt 2>/dev/null
if [ $SECONDS -lt $((L - 100)) ]; then
  timeout 60 ncu --clock-control none --section SourceCounters --section WarpStateStats -k regex:hopper_moe_gemm \
    --launch-skip 8 --launch-count 1 --page source --print-source sass --csv \
    $B/gpu_hopper_gemm_old --bench 4096 --model deepseek-v3 > $OUT/r/old_sass_ds_l8.csv 2>&1
  t "ncu old GEMM1 deepseek 4096 rc=$?"; gzip $OUT/r/old_sass_ds_l8.csv
fi
if [ $SECONDS -lt $((L - 60)) ]; then
  TRITON_MS=1024,4096 timeout $((L - SECONDS - 30)) bench/h200_check.sh run triton > $OUT/r/h200_triton.log 2>&1
  t "triton rc=$?"; cat $OUT/summary.txt >> $OUT/r/h200_summary.txt 2>/dev/null
fi
if [ $SECONDS -lt $((L - 90)) ]; then
  AB_M=1024,4096 timeout $((L - SECONDS - 5)) bench/h200_check.sh run ab > $OUT/r/h200_ab.log 2>&1
  t "ab rc=$?"; cat $OUT/summary.txt >> $OUT/r/h200_summary.txt 2>/dev/null
fi
tar -C $OUT -czf $OUT/logs.tgz r
