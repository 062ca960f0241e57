#!/usr/bin/env bash
# The GEMM regime's launch chain with PDL (NVFP4MOE_HOPPER_CHAIN_PDL, branch chain-pdl): correctness
# with the knob on and off, then the layer A/B (two rounds) and triton_kernels in the same call.
# Run: LIMIT=480 bash .devbin/chain.sh; carry .devbin/chain.tgz, .devbin/chain.sh, .devbin/chain.commit, .anchors
cd "$(dirname "$0")/.."
LIMIT=${LIMIT:-480}
B=/tmp/chain; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/chain.tgz; export LD_LIBRARY_PATH=$B
S=$OUT/r; mkdir -p $S
t() { echo "[t=${SECONDS}s] $*" >> $S/summary.txt; }
go() { if [ $((SECONDS + $1)) -gt $LIMIT ]; then t "skipped: $2"; return 1; fi; }
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/chain.commit)"
go 40 gpu_test && { timeout 90 $B/gpu_test > $S/gpu_test_auto.txt 2>&1; t "gpu_test (auto, defaults) rc=$?: $(tail -1 $S/gpu_test_auto.txt) chained-route lines: $(grep -c 'one-block routing too' $S/gpu_test_auto.txt)"; grep FAIL $S/gpu_test_auto.txt | head -5 >> $S/summary.txt; }
go 40 gpu_test_chain && { NVFP4MOE_HOPPER_REGIME=gemm NVFP4MOE_HOPPER_CHAIN_PDL=1 NVFP4MOE_HOPPER_ROUTE_TOKENS=256 timeout 90 $B/gpu_test > $S/gpu_test_chain.txt 2>&1; t "gpu_test (REGIME=gemm CHAIN_PDL=1 ROUTE_TOKENS=256) rc=$?: $(tail -1 $S/gpu_test_chain.txt)"; grep FAIL $S/gpu_test_chain.txt | head -5 >> $S/summary.txt; }
go 40 gemm && { timeout 90 $B/gpu_hopper_gemm > $S/gpu_hopper_gemm.txt 2>&1; t "gpu_hopper_gemm rc=$?: $(tail -1 $S/gpu_hopper_gemm.txt) $(grep -c 'pdl=same' $S/gpu_hopper_gemm.txt) pdl same"; grep -E "^FAIL|pdl=UNLIKE" $S/gpu_hopper_gemm.txt | head -5 >> $S/summary.txt; }
go 30 bits && { for m in 16 64 256 1024 4096; do for v in c0 c1 c2 g0; do
    case $v in c0) e="NVFP4MOE_HOPPER_CHAIN_PDL=0";; c1) e="NVFP4MOE_HOPPER_CHAIN_PDL=1";; c2) e="NVFP4MOE_HOPPER_CHAIN_PDL=1 NVFP4MOE_HOPPER_ROUTE_TOKENS=256";; g0) e="NVFP4MOE_HOPPER_GEMM_PDL=0";; esac
    echo "M=$m $v $(env $e timeout 30 $B/nvfp4moe run --moe-backend hopper_wgmma --tokens $m 2>&1 | grep -o 'fnv1a=[0-9a-f]*')"
  done; done > $S/bits.txt 2>&1
  t "bits: $(awk '{print $1, $3}' $S/bits.txt | sort -u | awk '{print $1}' | uniq -c | awk '$1 > 1' | wc -l) M values with differing checksums; $(grep -c 'fnv1a=' $S/bits.txt) of 20 ran"; }
for round in 1 2; do for v in 0 1 2; do
  go 25 "layer chain $v round $round" && { NVFP4MOE_HOPPER_CHAIN_PDL=$((v > 0)) NVFP4MOE_HOPPER_ROUTE_TOKENS=$((v > 1 ? 256 : 0)) timeout 60 $B/nvfp4moe bench --m 16,32,64,128,256,1024,4096 --backend HOPPER_WGMMA --no-baseline --iters 20 --out $S/chain$v-$round > $S/chain$v-$round.log 2>&1; t "layer chain $v round $round rc=$?"; }
done; done
go 45 memcheck && { NVFP4MOE_HOPPER_CHAIN_PDL=1 NVFP4MOE_HOPPER_ROUTE_TOKENS=256 timeout 80 compute-sanitizer --tool memcheck $B/nvfp4moe run --moe-backend hopper_wgmma --tokens 64 > $S/memcheck_chain.txt 2>&1; t "memcheck layer CHAIN_PDL=1 ROUTE_TOKENS=256 M=64 rc=$?: $(grep -E 'ERROR SUMMARY' $S/memcheck_chain.txt | tail -1)"; }
go 50 racecheck && { timeout 60 compute-sanitizer --tool racecheck $B/gpu_hopper_gemm --case 75 > $S/racecheck_75.txt 2>&1; t "racecheck gpu_hopper_gemm case 75 rc=$?: $(grep -E '^(ok|FAIL)' $S/racecheck_75.txt | cut -c1-60) $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' $S/racecheck_75.txt | tail -1)"; }
go 50 racecheck_layer && { NVFP4MOE_HOPPER_CHAIN_PDL=1 timeout 80 compute-sanitizer --tool racecheck $B/nvfp4moe run --moe-backend hopper_wgmma --tokens 64 > $S/racecheck_chain.txt 2>&1; t "racecheck layer CHAIN_PDL=1 M=64 rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' $S/racecheck_chain.txt | tail -1)"; }
go 60 triton && { PYTHONUNBUFFERED=1 timeout 90 python3 .anchors/triton_moe/bench_triton_moe.py --ms 64,256,1024,4096 --no-check --out $S/triton.json > $S/triton.log 2>&1; t "triton rc=$?"; }
cp $S/summary.txt $OUT/summary.txt; cd $OUT && tar czf r.tgz r && rm -rf r
