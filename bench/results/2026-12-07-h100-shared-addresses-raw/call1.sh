#!/usr/bin/env bash
# Call 1 (2026-12-07, sixteenth session): shared addresses kept per item instead of rebuilt from
# SR_CgaCtaId in every k tile (NVFP4MOE_HOPPER_SADDR=1, the build's default), against old
# (SADDR=0 = HEAD's cubin) and pf (SADDR=1 + PFENCE=1: the proxy fence in the producer).
# SASS counts, tests + hashes, the GEMMs alone alternated, the layer against HEAD's tool,
# triton_kernels, ncu's source page of the new GEMM1 (DeepSeek-V3 M = 4096), gputest, sanitizers.
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
L=${LIMIT:-580}
t() { echo "[t=${SECONDS}s] $*" >> $S; }
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
for o in old new pf; do
  cuobjdump -sass -arch sm_90a .devbin/v/hopper_gemm_$o.o > $OUT/r/sass-$o.full.txt 2>&1
  awk -v n=$o '/Function :/{f=$3} /^ +\/\*[0-9a-f]+\*\//{c[f]++; if ($0 ~ /S2UR/) s[f]++; if ($0 ~ /CgaCtaId/) g[f]++; if ($0 ~ /HGMMA/) h[f]++; if ($0 ~ /MEMBAR/) m[f]++; if ($0 ~ /STL/) l[f]++} END{for (k in c) printf "%s %s instrs %d S2UR %d CgaCtaId %d HGMMA %d MEMBAR %d STL %d\n", n, k, c[k], s[k], g[k], h[k], m[k], l[k]}' $OUT/r/sass-$o.full.txt | sort > $OUT/r/sass-$o.txt
  gzip $OUT/r/sass-$o.full.txt
  t "sass $o: $(grep -c . $OUT/r/sass-$o.txt) kernels"
done
V="gpu_hopper_gemm_old gpu_hopper_gemm gpu_hopper_gemm_pf"
for v in $V; do
  timeout 90 $B/$v > $OUT/r/$v.test.txt 2>&1; t "$v tests rc=$?: $(tail -1 $OUT/r/$v.test.txt)"
done
for v in gpu_hopper_gemm gpu_hopper_gemm_pf; do
  diff <(grep -o 'hash=[0-9a-f]*' $OUT/r/gpu_hopper_gemm_old.test.txt) <(grep -o 'hash=[0-9a-f]*' $OUT/r/$v.test.txt) > $OUT/r/hash-$v.diff
  t "hash diff $v vs old: $(wc -l < $OUT/r/hash-$v.diff) lines of $(grep -c 'hash=' $OUT/r/$v.test.txt) hashes"
done
for round in 1 2; do for v in $V; do
  timeout 60 $B/$v --bench 1024,4096 --model all > $OUT/r/gemmab-$v$round.txt 2>&1; t "gemm bench $v $round rc=$?"; done; done
AB_M=1024,4096 timeout 60 bench/h200_check.sh run ab > $OUT/r/h200_ab.log 2>&1
t "ab rc=$?"; cat $OUT/summary.txt >> $OUT/r/h200_summary.txt 2>/dev/null; rm -f $OUT/summary.txt
TRITON_MS=1024,4096 timeout 80 bench/h200_check.sh run triton > $OUT/r/h200_triton.log 2>&1
t "triton rc=$?"; cat $OUT/summary.txt >> $OUT/r/h200_summary.txt 2>/dev/null; rm -f $OUT/summary.txt
timeout 40 ncu --clock-control none --section SourceCounters --section WarpStateStats -k regex:hopper_moe_gemm \
  --launch-skip 8 --launch-count 1 --page source --print-source sass --csv \
  $B/gpu_hopper_gemm --bench 4096 --model deepseek-v3 > $OUT/r/new_sass_ds_l8.csv 2>&1
t "ncu new GEMM1 deepseek 4096 rc=$?"; gzip $OUT/r/new_sass_ds_l8.csv
GPUTEST_MODES="auto gemm bm128" GSAN_MEMCHECK="14 45 47" GSAN_RACECHECK="33 47 57" \
  timeout $((L - SECONDS - 70)) bench/h200_check.sh run gputest,gsan > $OUT/r/h200_check.log 2>&1
t "h200_check gputest,gsan rc=$?"; cat $OUT/summary.txt >> $OUT/r/h200_summary.txt 2>/dev/null; rm -f $OUT/summary.txt
for v in gpu_hopper_gemm_old gpu_hopper_gemm; do
  [ $SECONDS -gt $((L - 35)) ] && break
  timeout 32 $B/$v --bench 1024,4096 --model all > $OUT/r/gemmab-${v}3.txt 2>&1; t "gemm bench $v 3 rc=$?"; done
tar -C $OUT -czf $OUT/logs.tgz r
