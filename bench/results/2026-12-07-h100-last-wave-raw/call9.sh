#!/usr/bin/env bash
# Call 9 (2026-12-07, eighteenth session), on ceb273e + no split-K clear where no block count can
# split (may_split; the tail split of call 8 removed: its sm_90a cubin is ceb273e's) + the QDQ
# check's zero sign: gpu_hopper_gemm (hashes against 9c58536's for the first 51 cases and against
# call 8's for the reruns), compute-sanitizer on two reruns, the EMULATION judgment (gpu_test at
# the seed that failed, gpu_emulation), the layer against 9c58536's tool alternated twice.
cd "$(dirname "$0")/.."
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
S=$OUT/r4; mkdir -p $S
t() { echo "[t=${SECONDS}s] $*" >> $S/summary.txt; }
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
timeout 150 $B/gpu_hopper_gemm > $S/gpu_hopper_gemm.test.txt 2>&1; t "gpu_hopper_gemm rc=$?: $(tail -1 $S/gpu_hopper_gemm.test.txt)"
grep -E '^FAIL|qwen3-30b GEMM1|64 experts fp16' $S/gpu_hopper_gemm.test.txt | head -8 >> $S/summary.txt
grep -o '^[a-z].*hash=[0-9a-f-]*' $S/gpu_hopper_gemm.test.txt > $S/hashes.txt
diff <(grep -o '^[a-z].*hash=[0-9a-f-]*' .devbin/ref-gemm-9c58536.txt | head -51 | sed 's/ rel=.*hash=/ hash=/') \
     <(head -51 $S/hashes.txt | sed 's/ rel=.*hash=/ hash=/') > $S/hash-9c58536.diff
t "hash diff, cases 0-50 vs 9c58536: $(grep -c '^<' $S/hash-9c58536.diff) of 51 lines differ"
diff <(grep 'CTAs\]' .devbin/ref-gemm-call8.txt | sed 's/ rel=.*hash=/ hash=/') \
     <(grep 'CTAs\]' $S/hashes.txt | sed 's/ rel=.*hash=/ hash=/') > $S/hash-call8.diff
t "hash diff, reruns vs call 8: $(grep -c '^<' $S/hash-call8.diff) of $(grep -c 'CTAs\]' .devbin/ref-gemm-call8.txt) lines differ"
for c in 60 53; do
  timeout 60 compute-sanitizer --tool memcheck $B/gpu_hopper_gemm --case $c > $S/memcheck$c.txt 2>&1; t "memcheck $c rc=$?: $(grep -E 'ERROR SUMMARY' $S/memcheck$c.txt)"
done
timeout 90 compute-sanitizer --tool racecheck $B/gpu_hopper_gemm --case 60 > $S/racecheck60.txt 2>&1; t "racecheck 60 rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' $S/racecheck60.txt | tr '\n' ' ')"
GPUTEST_SEED=1796649155 timeout 60 $B/gpu_test > $S/gpu_test_seed1796649155.txt 2>&1; t "gpu_test seed 1796649155 rc=$?: $(tail -1 $S/gpu_test_seed1796649155.txt)"
timeout 60 $B/gpu_emulation > $S/gpu_emulation.txt 2>&1; t "gpu_emulation rc=$?: $(tail -1 $S/gpu_emulation.txt)"
grep -E '^FAIL' $S/gpu_emulation.txt | head -4 >> $S/summary.txt
tar -C $OUT -czf $OUT/logs4.tgz r4; cp $S/summary.txt $OUT/summary4.txt
AB_M=24,64,128 timeout $((190 - SECONDS)) bench/h200_check.sh run ab
tar -C $OUT -czf $OUT/logs4.tgz r4; cp $S/summary.txt $OUT/summary4.txt; rm -rf $S
ls -la $OUT
