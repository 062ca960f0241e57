#!/usr/bin/env bash
# Verification of the PDL default (branch land): gpu_test auto + gemm regime, racecheck and
# memcheck on PDL cases, a third layer A/B round, triton_kernels. LIMIT as in call12.sh.
cd "$(dirname "$0")/.."
LIMIT=${LIMIT:-280}
B=/tmp/land; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/land.tgz; export LD_LIBRARY_PATH=$B
S=$OUT/r; mkdir -p $S
t() { echo "[t=${SECONDS}s] $*" >> $S/summary.txt; }
go() { if [ $((SECONDS + $1)) -gt $LIMIT ]; then t "skipped: $2"; return 1; fi; }
t "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit $(git rev-parse --short HEAD 2>/dev/null)"
go 40 gpu_test && { timeout 90 $B/gpu_test > $S/gpu_test_auto.txt 2>&1; t "gpu_test (auto, PDL default) rc=$?: $(tail -1 $S/gpu_test_auto.txt)"; grep FAIL $S/gpu_test_auto.txt | head -5 >> $S/summary.txt; }
for c in 75 65; do
  go 50 "racecheck $c" && { timeout 50 compute-sanitizer --tool racecheck $B/gpu_hopper_gemm --case $c > $S/racecheck_$c.txt 2>&1; t "racecheck gpu_hopper_gemm case $c rc=$?: $(grep -E '^(ok|FAIL)' $S/racecheck_$c.txt | cut -c1-60) $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' $S/racecheck_$c.txt | tail -1)"; }
done
go 40 gpu_test_gemm && { NVFP4MOE_HOPPER_REGIME=gemm timeout 90 $B/gpu_test > $S/gpu_test_gemm.txt 2>&1; t "gpu_test (REGIME=gemm) rc=$?: $(tail -1 $S/gpu_test_gemm.txt)"; grep FAIL $S/gpu_test_gemm.txt | head -5 >> $S/summary.txt; }
for round in 3; do for v in 0 1; do
  go 15 "layer pdl $v" && { NVFP4MOE_HOPPER_GEMM_PDL=$v timeout 60 $B/nvfp4moe bench --m 64,128,256,1024,4096 --backend HOPPER_WGMMA --no-baseline --iters 20 --out $S/gpdl$v-$round > $S/gpdl$v-$round.log 2>&1; t "layer pdl $v round $round rc=$?"; }
done; done
go 60 triton && { PYTHONUNBUFFERED=1 timeout 90 python3 .anchors/triton_moe/bench_triton_moe.py --ms 64,256,1024,4096 --no-check --out $S/triton.json > $S/triton.log 2>&1; t "triton rc=$?"; }
go 40 memcheck && { timeout 60 compute-sanitizer --tool memcheck $B/gpu_hopper_gemm --case 75 > $S/memcheck_75.txt 2>&1; t "memcheck case 75 rc=$?: $(grep -E 'ERROR SUMMARY' $S/memcheck_75.txt | tail -1)"; }
cp $S/summary.txt $OUT/summary.txt; cd $OUT && tar czf r.tgz r && rm -rf r
