#!/usr/bin/env bash
# Call 2 (2026-12-07, fifteenth session): the wgmma descriptors on the uniform datapath
# (NVFP4MOE_HOPPER_UDESC=1: each tile's descriptor low word taken from lane 0, so ptxas knows it is
# warp-uniform). Pack: default UDESC=1 (gpu_hopper_gemm, nvfp4moe); variant old = UDESC=0 (HEAD's
# cubin); base tool = HEAD's kernel. SASS counts, tests + hashes, the GEMMs alone alternated three
# times, gpu_test, sanitizers, ncu's source page of the new GEMM1 (DeepSeek-V3 M = 4096), the triton
# anchor, the layer against HEAD's tool.
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
L=${LIMIT:-560}
t() { echo "[t=${SECONDS}s] $*" >> $S; }
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
for o in old ud; do
  cuobjdump -sass -arch sm_90a .devbin/v/hopper_gemm_$o.o 2>&1 | awk -v n=$o '/Function :/{f=$3} /^ +\/\*[0-9a-f]+\*\//{c[f]++; if ($0 ~ /R2UR/) r[f]++; if ($0 ~ /HGMMA/) h[f]++; if ($0 ~ /UIADD3/) u[f]++} END{for (k in c) printf "%s %s instrs %d R2UR %d HGMMA %d UIADD3 %d\n", n, k, c[k], r[k], h[k], u[k]}' | sort > $OUT/r/sass-$o.txt
  t "sass $o: $(grep -c . $OUT/r/sass-$o.txt) kernels"
done
V="gpu_hopper_gemm_old gpu_hopper_gemm"
for v in $V; do
  timeout 90 $B/$v > $OUT/r/$v.test.txt 2>&1; t "$v tests rc=$?: $(tail -1 $OUT/r/$v.test.txt)"
done
diff <(grep -o 'hash=[0-9a-f]*' $OUT/r/gpu_hopper_gemm_old.test.txt) <(grep -o 'hash=[0-9a-f]*' $OUT/r/gpu_hopper_gemm.test.txt) > $OUT/r/hash-ud.diff
t "hash diff ud vs old: $(wc -l < $OUT/r/hash-ud.diff) lines of $(grep -c 'hash=' $OUT/r/gpu_hopper_gemm.test.txt) hashes"
for round in 1 2 3; do for v in $V; do
  timeout 60 $B/$v --bench 1024,4096 --model all > $OUT/r/gemmab-$v$round.txt 2>&1; t "gemm bench $v $round rc=$?"; done; done
GPUTEST_MODES="auto gemm bm64 bm128" GSAN_MEMCHECK="14 39 45 46 47" GSAN_RACECHECK="33 47 57" \
  timeout $((L - SECONDS - 140)) bench/h200_check.sh run gputest,gsan > $OUT/r/h200_check.log 2>&1
t "h200_check gputest,gsan rc=$?"
cp $OUT/summary.txt $OUT/r/h200_summary.txt 2>/dev/null
if [ $SECONDS -lt $((L - 110)) ]; then
  timeout 60 ncu --clock-control none --section SourceCounters --section WarpStateStats -k regex:hopper_moe_gemm \
    --launch-skip 8 --launch-count 1 --page source --print-source sass --csv \
    $B/gpu_hopper_gemm --bench 4096 --model deepseek-v3 > $OUT/r/ud_sass_ds_l8.csv 2>&1
  t "ncu ud GEMM1 deepseek 4096 rc=$?"; gzip $OUT/r/ud_sass_ds_l8.csv
fi
if [ $SECONDS -lt $((L - 70)) ]; then
  TRITON_MS=1024,4096 timeout $((L - SECONDS - 40)) bench/h200_check.sh run triton > $OUT/r/h200_triton.log 2>&1
  t "triton rc=$?"; cat $OUT/summary.txt >> $OUT/r/h200_summary.txt 2>/dev/null
fi
if [ $SECONDS -lt $((L - 30)) ]; then
  AB_M=1024,4096 timeout $((L - SECONDS - 5)) bench/h200_check.sh run ab > $OUT/r/h200_ab.log 2>&1
  t "ab rc=$?"; cat $OUT/summary.txt >> $OUT/r/h200_summary.txt 2>/dev/null
fi
tar -C $OUT -czf $OUT/logs.tgz r
