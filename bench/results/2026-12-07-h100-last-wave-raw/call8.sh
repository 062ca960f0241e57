#!/usr/bin/env bash
# Call 8 (2026-12-07, eighteenth session), on ceb273e + the last wave split along K (tail_pieces,
# NVFP4MOE_HOPPER_TAIL_SPLIT 4) + no split-K clear where no block count can split; variant
# notail = the same with NVFP4MOE_HOPPER_TAIL_SPLIT=1, the base tool = this build's library with
# notail's kernel. gpu_hopper_gemm (hashes against 9c58536's), compute-sanitizer on the reruns
# whose last wave splits, gpu_test (auto), the EMULATION judgment with the div.full.f32 model
# (gpu_test at the seed that failed, gpu_emulation); the GEMMs alone new against notail and the
# layer against the base tool, alternated twice; block_m forced at Mixtral-8x7B's larger M;
# triton_kernels at M = 64, 256; ncu of Qwen3-30B-A3B's GEMMs alone at M = 256 and 64.
cd "$(dirname "$0")/.."
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz; export LD_LIBRARY_PATH=$B
S=$OUT/r3; mkdir -p $S
t() { echo "[t=${SECONDS}s] $*" >> $S/summary.txt; }
t "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit $(cat .devbin/commit | tr '\n' ' ')"
timeout 150 $B/gpu_hopper_gemm > $S/gpu_hopper_gemm.test.txt 2>&1; t "gpu_hopper_gemm rc=$?: $(tail -1 $S/gpu_hopper_gemm.test.txt)"
grep -E '^FAIL|last wave' $S/gpu_hopper_gemm.test.txt | head -8 >> $S/summary.txt
diff <(grep -o '^[a-z].*hash=[0-9a-f-]*' .devbin/ref-gemm-9c58536.txt | sed 's/ rel=.*hash=/ hash=/') \
     <(grep -o '^[a-z].*hash=[0-9a-f-]*' $S/gpu_hopper_gemm.test.txt | sed 's/ rel=.*hash=/ hash=/') > $S/hash.diff
t "hash diff vs 9c58536: $(grep -c '^<' $S/hash.diff) of $(grep -c 'hash=' .devbin/ref-gemm-9c58536.txt) old lines differ"
for c in 60 53 56 58; do
  timeout 60 compute-sanitizer --tool memcheck $B/gpu_hopper_gemm --case $c > $S/memcheck$c.txt 2>&1; t "memcheck $c rc=$?: $(grep -E 'ERROR SUMMARY' $S/memcheck$c.txt)"
done
for c in 60 53; do
  timeout 90 compute-sanitizer --tool racecheck $B/gpu_hopper_gemm --case $c > $S/racecheck$c.txt 2>&1; t "racecheck $c rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' $S/racecheck$c.txt | tr '\n' ' ')"
done
GPUTEST_SEED=1796649155 timeout 60 $B/gpu_test > $S/gpu_test_seed1796649155.txt 2>&1; t "gpu_test seed 1796649155 rc=$?: $(tail -1 $S/gpu_test_seed1796649155.txt)"
timeout 60 $B/gpu_emulation > $S/gpu_emulation.txt 2>&1; t "gpu_emulation rc=$?: $(tail -1 $S/gpu_emulation.txt)"
for round in 1 2; do
  timeout 60 $B/gpu_hopper_gemm_notail --bench 64,128,256 --model all > $S/gemmab-notail$round.txt 2>&1; t "gemm notail $round rc=$?"
  timeout 60 $B/gpu_hopper_gemm --bench 64,128,256 --model all > $S/gemmab-new$round.txt 2>&1; t "gemm new $round rc=$?"
done
tar -C $OUT -czf $OUT/logs3.tgz r3; cp $S/summary.txt $OUT/summary3.txt
GPUTEST_MODES="auto" AB_M=16,24,48,64,96,128,256 \
ENV_AB="auto:NVFP4MOE_HOPPER_REGIME=auto b128:NVFP4MOE_HOPPER_BLOCK_M=128" ENVAB_M=128,192,256 TRITON_MS=64,256 \
PROF_CASES="qwen3-30b-a3b:256 qwen3-30b-a3b:64" timeout $((578 - SECONDS)) bench/h200_check.sh run gputest,ab,envab,triton,prof
tar -C $OUT -czf $OUT/logs3.tgz r3; cp $S/summary.txt $OUT/summary3.txt; rm -rf $S
ls -la $OUT
