#!/usr/bin/env bash
# Call 2: the landing candidate (chain PDL on by default, the wide routing taken out): gpu_test in
# the auto and GEMM regimes with the defaults, checksums against CHAIN_PDL=0, two more A/B rounds.
cd "$(dirname "$0")/.."
LIMIT=${LIMIT:-240}
B=/tmp/chain; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/chain.tgz; export LD_LIBRARY_PATH=$B
S=$OUT/r; mkdir -p $S
t() { echo "[t=${SECONDS}s] $*" >> $S/summary.txt; }
go() { if [ $((SECONDS + $1)) -gt $LIMIT ]; then t "skipped: $2"; return 1; fi; }
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/chain.commit)"
go 40 gpu_test && { timeout 90 $B/gpu_test > $S/gpu_test_auto.txt 2>&1; t "gpu_test (auto, defaults) rc=$?: $(tail -1 $S/gpu_test_auto.txt) chained-route lines: $(grep -c 'chained launches too' $S/gpu_test_auto.txt)"; grep FAIL $S/gpu_test_auto.txt | head -5 >> $S/summary.txt; }
go 40 gpu_test_gemm && { NVFP4MOE_HOPPER_REGIME=gemm timeout 90 $B/gpu_test > $S/gpu_test_gemm.txt 2>&1; t "gpu_test (REGIME=gemm, defaults) rc=$?: $(tail -1 $S/gpu_test_gemm.txt)"; grep FAIL $S/gpu_test_gemm.txt | head -5 >> $S/summary.txt; }
go 30 bits && { for m in 1 16 64 256 1024 4096; do for v in def c0; do
    case $v in def) e="X=1";; c0) e="NVFP4MOE_HOPPER_CHAIN_PDL=0";; esac
    echo "M=$m $v $(env $e timeout 30 $B/nvfp4moe run --moe-backend hopper_wgmma --tokens $m 2>&1 | grep -o 'fnv1a=[0-9a-f]*')"
  done; done > $S/bits.txt 2>&1
  t "bits: $(awk '{print $1, $3}' $S/bits.txt | sort -u | awk '{print $1}' | uniq -c | awk '$1 > 1' | wc -l) M values with differing checksums; $(grep -c 'fnv1a=' $S/bits.txt) of 12 ran"; }
for round in 3 4; do for v in 0 1; do
  go 15 "layer chain $v round $round" && { NVFP4MOE_HOPPER_CHAIN_PDL=$v timeout 60 $B/nvfp4moe bench --m 1,16,32,64,128,256,1024,4096 --backend HOPPER_WGMMA --no-baseline --iters 20 --out $S/chain$v-$round > $S/chain$v-$round.log 2>&1; t "layer chain $v round $round rc=$?"; }
done; done
cp $S/summary.txt $OUT/summary.txt; cd $OUT && tar czf r.tgz r && rm -rf r
