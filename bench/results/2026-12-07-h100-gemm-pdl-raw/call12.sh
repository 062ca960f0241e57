#!/usr/bin/env bash
# Call 12 (prepared in the twentieth session; call 11, its first part, never ran: no device start
# succeeded in two sessions): branch gemm-pdl = g1-l2-prefetch (GEMM1 prefetching GEMM2's weights
# into L2, NVFP4MOE_HOPPER_G1_L2_MB) + GEMM2 launched with PDL behind GEMM1 in the GEMM regime
# (NVFP4MOE_HOPPER_GEMM_PDL) + the combine kernel's slots loaded four at a time (nvfp4moe_c0: the
# library with moe_pipeline.o built with -DNVFP4MOE_COMBINE_BATCH=0, the old loop); the L2 prefetch of weight chunks in the GEMM (NVFP4MOE_HOPPER_WPF =
# 4: variant p4, gpu_hopper_gemm_p4 and the layer tool nvfp4moe_p4 = this build's library with
# hopper_gemm_p4.o as its hopper_gemm.o); one weight tile per item at block_m 32 (existing knobs).
# Steps in priority order; a step is skipped when its estimate would pass LIMIT seconds (default
# 400). Run: LIMIT=400 bash .devbin/call12.sh, carry .devbin and .anchors. Bins: make build-all
# of the commit in .devbin/commit (build-dev); the p4 variant built from the same source with
# -DNVFP4MOE_HOPPER_WPF=4.
cd "$(dirname "$0")/.."
LIMIT=${LIMIT:-400}
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
for v in p4 c0; do gunzip -c .devbin/base/nvfp4moe_$v.gz > $B/nvfp4moe_$v && chmod +x $B/nvfp4moe_$v; done
S=$OUT/r; mkdir -p $S
t() { echo "[t=${SECONDS}s] $*" >> $S/summary.txt; }
# ONLY (an extended regex): run only the steps whose names match it, e.g. a second call's
# ONLY='rt|memcheck|gpu_test$|emulation|p4 test'
go() { if [ -n "${ONLY:-}" ] && ! [[ "$2" =~ $ONLY ]]; then return 1; fi
  if [ $((SECONDS + $1)) -gt $LIMIT ]; then t "skipped: $2"; return 1; fi; }
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
go 60 decode && { timeout 120 $B/gpu_hopper_decode > $S/gpu_hopper_decode.txt 2>&1; t "gpu_hopper_decode rc=$?: $(tail -1 $S/gpu_hopper_decode.txt) $(grep -c '^FAIL' $S/gpu_hopper_decode.txt) FAIL lines"
  grep -E "^(FAIL|ok  ) g1pf" $S/gpu_hopper_decode.txt >> $S/summary.txt; }
# the GEMM's grid (with its cases rerun as PDL launches behind the same GEMM)
for v in gpu_hopper_gemm; do
  go 45 "$v test" && { timeout 120 $B/$v > $S/$v.test.txt 2>&1; t "$v rc=$?: $(tail -1 $S/$v.test.txt) $(grep -c 'pdl=same' $S/$v.test.txt) pdl same"
    grep -E "^FAIL|pdl=UNLIKE" $S/$v.test.txt >> $S/summary.txt; }
done
# bits: the layer's output checksum (nvfp4moe run, Qwen3-30B-A3B, random weights) must not move
# with GEMM_PDL=1, G1_L2_MB=16 or the combine's old loop (c0)
go 40 bits && { for m in 1 4 64 256 1024; do
    for v in base pdl g1pf c0; do
      case $v in base) e=""; b=$B/nvfp4moe;; pdl) e="NVFP4MOE_HOPPER_GEMM_PDL=1"; b=$B/nvfp4moe;;
        g1pf) e="NVFP4MOE_HOPPER_G1_L2_MB=16"; b=$B/nvfp4moe;; c0) e=""; b=$B/nvfp4moe_c0;; esac
      echo "M=$m $v $(env $e timeout 30 $b run --moe-backend hopper_wgmma --tokens $m 2>&1 | grep -o 'fnv1a=[0-9a-f]*')"
    done; done > $S/bits.txt 2>&1
  t "bits: $(awk '{print $1, $3}' $S/bits.txt | sort | uniq | awk '{print $1}' | uniq -c | awk '$1 > 1' | wc -l) M values with differing checksums; $(grep -c 'fnv1a=' $S/bits.txt) of 20 ran"; }
# GEMM1 prefetching GEMM2's weights: the whole layer, 0 / 16 MB, two rounds
for round in 1 2; do
  for mb in 0 16; do
    go 15 "g1pf $mb $round" && { NVFP4MOE_HOPPER_G1_L2_MB=$mb timeout 60 $B/nvfp4moe bench --m 1,2,4,8 --backend HOPPER_WGMMA --no-baseline --iters 20 \
      --out $S/g1pf$mb-$round > $S/g1pf$mb-$round.log 2>&1; t "layer g1pf $mb MB $round rc=$?"; }
  done
done
# GEMM2 launched with PDL behind GEMM1 (GEMM regime): correctness first, then the layer 0 / 1
go 60 "gpu_test gemm pdl" && { NVFP4MOE_HOPPER_GEMM_PDL=1 NVFP4MOE_HOPPER_REGIME=gemm timeout 90 $B/gpu_test > $S/gpu_test_gemmpdl.txt 2>&1
  t "gpu_test (REGIME=gemm GEMM_PDL=1) rc=$?: $(tail -1 $S/gpu_test_gemmpdl.txt)"; }
for round in 1 2; do
  for v in 0 1; do
    go 20 "gemm pdl $v $round" && { NVFP4MOE_HOPPER_GEMM_PDL=$v timeout 60 $B/nvfp4moe bench --m 64,128,256,1024 --backend HOPPER_WGMMA --no-baseline --iters 20 \
      --out $S/gpdl$v-$round > $S/gpdl$v-$round.log 2>&1; t "layer gemm pdl $v $round rc=$?"; }
  done
  # the same points with the combine's one-slot-at-a-time loop (nvfp4moe_c0; gpdl0 is its A)
  go 20 "combine c0 $round" && { timeout 60 $B/nvfp4moe_c0 bench --m 64,128,256,1024 --backend HOPPER_WGMMA --no-baseline --iters 20 \
      --out $S/comb0-$round > $S/comb0-$round.log 2>&1; t "layer combine c0 $round rc=$?"; }
done
# the GEMM's L2 prefetch: the GEMMs alone and the layer, default / p4, two rounds
for round in 1 2; do
  for v in "" _p4; do
    go 25 "gemm '$v' $round" && { timeout 60 $B/gpu_hopper_gemm$v --bench 64,256 --model all > $S/gemmab$v-$round.txt 2>&1; t "gemm bench '$v' $round rc=$?"; }
  done
  for v in "" _p4; do
    go 12 "layer '$v' $round" && { timeout 60 $B/nvfp4moe$v bench --m 64,128,256 --backend HOPPER_WGMMA --no-baseline --iters 20 \
      --out $S/layer$v-$round > $S/layer$v-$round.log 2>&1; t "layer '$v' $round rc=$?"; }
  done
done
go 60 triton && { PYTHONUNBUFFERED=1 timeout 90 python3 .anchors/triton_moe/bench_triton_moe.py --ms 1,64,256 --no-check \
  --out $S/triton.json > $S/triton.log 2>&1; t "triton rc=$?"; }
# one weight tile per item at block_m 32 (twice the units: a finer last wave)
for round in 1 2; do
  for rt in 2 1; do
    go 10 "gemm rt$rt $round" && { HOPPER_BENCH_BLOCK_M=32 HOPPER_BENCH_ROWTILES=$rt timeout 60 $B/gpu_hopper_gemm --bench 64,256 --model qwen3-30b-a3b > $S/gemmrt$rt-$round.txt 2>&1; t "gemm rt$rt $round rc=$?"; }
  done
  for rt in 0 1; do
    go 8 "layer rt$rt $round" && { NVFP4MOE_HOPPER_ROW_TILES=$rt timeout 60 $B/nvfp4moe bench --preset qwen3-30b-a3b,qwen3-235b-a22b --m 64,256 --backend HOPPER_WGMMA --no-baseline --iters 20 \
      --out $S/layerrt$rt-$round > $S/layerrt$rt-$round.log 2>&1; t "layer rt$rt $round rc=$?"; }
  done
done
go 60 "memcheck gemm pdl" && { NVFP4MOE_HOPPER_GEMM_PDL=1 timeout 120 compute-sanitizer --tool memcheck $B/nvfp4moe bench --preset qwen3-30b-a3b,gpt-oss-120b --m 64,1024 --backend HOPPER_WGMMA --no-baseline --iters 2 > $S/memcheck_gemmpdl.txt 2>&1
  t "memcheck gpu_test gemm pdl rc=$?: $(grep -E 'ERROR SUMMARY' $S/memcheck_gemmpdl.txt | tail -1)"; }
go 45 "gpu_test" && { NVFP4MOE_HOPPER_G1_L2_MB=16 timeout 90 $B/gpu_test > $S/gpu_test_g1pf.txt 2>&1; t "gpu_test (G1_L2_MB=16) rc=$?: $(tail -1 $S/gpu_test_g1pf.txt)"; }
go 15 emulation && { timeout 60 $B/gpu_emulation > $S/gpu_emulation.txt 2>&1; t "gpu_emulation rc=$?: $(tail -1 $S/gpu_emulation.txt)"; }
go 30 memcheck && { timeout 60 compute-sanitizer --tool memcheck $B/gpu_hopper_decode --case 45 > $S/memcheck_dec45.txt 2>&1; t "memcheck decode 45 rc=$?: $(grep -E 'ERROR SUMMARY' $S/memcheck_dec45.txt)"; }
for v in gpu_hopper_gemm_p4; do
  go 45 "$v test" && { timeout 120 $B/$v > $S/$v.test.txt 2>&1; t "$v rc=$?: $(tail -1 $S/$v.test.txt)"; }
done
[ -f $S/gpu_hopper_gemm_p4.test.txt ] && { diff <(grep -o '^[a-z].*hash=[0-9a-f-]*' $S/gpu_hopper_gemm.test.txt | sed 's/ rel=.*hash=/ hash=/') \
     <(grep -o '^[a-z].*hash=[0-9a-f-]*' $S/gpu_hopper_gemm_p4.test.txt | sed 's/ rel=.*hash=/ hash=/') > $S/hash-p4.diff
  t "hash diff p4: $(grep -c '^<' $S/hash-p4.diff) of $(grep -c 'hash=' $S/gpu_hopper_gemm.test.txt)"; }
cp $S/summary.txt $OUT/summary.txt
