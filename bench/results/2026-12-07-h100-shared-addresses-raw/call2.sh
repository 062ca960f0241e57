#!/usr/bin/env bash
# Call 2 (2026-12-07, sixteenth session): the k-tile loop unrolled twice (NVFP4MOE_HOPPER_KUNROLL=2,
# with SADDR=1: the build's defaults, "u2") against old (HEAD's cubin) and sa (SADDR=1 alone).
# Tests + hashes, the GEMMs alone alternated three times, the layer against HEAD's tool, gputest
# and the sanitizers on u2.
cd "$(dirname "$0")/.."
S=$OUT/r/summary.txt; mkdir -p $OUT/r
L=${LIMIT:-500}
t() { echo "[t=${SECONDS}s] $*" >> $S; }
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
for o in u2 sa; do
  cuobjdump -sass -arch sm_90a .devbin/v/hopper_gemm_$o.o > $OUT/r/sass-$o.full.txt 2>&1
  awk -v n=$o '/Function :/{f=$3} /^ +\/\*[0-9a-f]+\*\//{c[f]++; if ($0 ~ /HGMMA/) h[f]++; if ($0 ~ /STL/) l[f]++} END{for (k in c) printf "%s %s instrs %d HGMMA %d STL %d\n", n, k, c[k], h[k], l[k]}' $OUT/r/sass-$o.full.txt | sort > $OUT/r/sass-$o.txt
  gzip $OUT/r/sass-$o.full.txt
done
V="gpu_hopper_gemm_old gpu_hopper_gemm gpu_hopper_gemm_sa"
for v in $V; do
  timeout 90 $B/$v > $OUT/r/$v.test.txt 2>&1; t "$v tests rc=$?: $(tail -1 $OUT/r/$v.test.txt)"
done
for v in gpu_hopper_gemm gpu_hopper_gemm_sa; do
  diff <(grep -o 'hash=[0-9a-f]*' $OUT/r/gpu_hopper_gemm_old.test.txt) <(grep -o 'hash=[0-9a-f]*' $OUT/r/$v.test.txt) > $OUT/r/hash-$v.diff
  t "hash diff $v vs old: $(wc -l < $OUT/r/hash-$v.diff) lines of $(grep -c 'hash=' $OUT/r/$v.test.txt) hashes"
done
for round in 1 2; do for v in $V; do
  [ $SECONDS -gt $((L - 60)) ] && break 2
  timeout 45 $B/$v --bench 1024,4096 --model all > $OUT/r/gemmab-$v$round.txt 2>&1; t "gemm bench $v $round rc=$?"; done; done
AB_M=1024,4096 timeout 60 bench/h200_check.sh run ab > $OUT/r/h200_ab.log 2>&1
t "ab rc=$?"; cat $OUT/summary.txt >> $OUT/r/h200_summary.txt 2>/dev/null; rm -f $OUT/summary.txt
[ $SECONDS -lt $((L - 60)) ] && GPUTEST_MODES="auto gemm" GSAN_MEMCHECK="47" GSAN_RACECHECK="57" \
  timeout $((L - SECONDS - 5)) bench/h200_check.sh run gputest,gsan > $OUT/r/h200_check.log 2>&1
t "h200_check gputest,gsan rc=$?"; cat $OUT/summary.txt >> $OUT/r/h200_summary.txt 2>/dev/null; rm -f $OUT/summary.txt
tar -C $OUT -czf $OUT/logs.tgz r
