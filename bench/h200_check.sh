#!/usr/bin/env bash
# h200_check.sh - one device call on the lent H200: correctness first, then speed, everything under
# $OUT (at most 8 files come back, so the logs are bundled into $OUT/logs.tgz at the end).
#
# Here (no GPU), before the call:
#     bench/h200_check.sh pack            # build (BUILD=build-dev), strip, bundle into .devbin/bins.tgz,
#                                         # copy the triton_kernels anchor into .anchors/triton_moe
#                                         # (PACK_LEAN=1: binaries only, see below); a new pack
#                                         # replaces everything in .devbin but the call scripts
#                                         # kept there (.devbin/*.sh)
# Then, as the device command (carry .devbin and .anchors):
#     bench/h200_check.sh run [STEPS]     # STEPS: comma list of decode,sanitize,stream,ncu,stalls,sass,gputest,
#                                         # others,python,bench,hot,triton,torch,gemm (default: all of them);
#                                         # not in the default: regimes (both regimes forced on every
#                                         # preset), cpu, cli (the tool's files through the GPU),
#                                         # prof (ncu sections + SASS stall samples of the prefill GEMMs),
#                                         # gsan (the wgmma GEMM under compute-sanitizer), variants
#                                         # (gpu_hopper_gemm and the HOPPER_VARIANTS pack built: tests, bench),
#                                         # decodevar (the whole layer per DECODE_VARIANTS
#                                         # "name:pdl:prefetch:g1room:l2mb" setting of the decode kernels),
#                                         # ab (bench of this build against .devbin/base/nvfp4moe_base,
#                                         # a tool built from another commit and copied there after pack),
#                                         # envab (bench of this build under each ENV_AB environment),
#                                         # decprof (ncu: the decode layer's kernel durations and SASS stalls),
#                                         # gemmab (the GEMMs alone under each GEMM_AB environment),
#                                         # gsgroup (gpu_test's grouping cases under compute-sanitizer
#                                         # memcheck and racecheck; ncu's launch of the grouping at
#                                         # DeepSeek-V3 M = 4096: its cluster size)
# The hot step times one expert holding almost every token (bench --hot-tokens 3900 at M = 4096,
# HOPPER_WGMMA and MARLIN), to set beside the bench step's uniform routing at the same M.
# The python step runs the Python package's tests with the machine's torch (python/tests/run.py
# --gpu: torch.ops.nvfp4moe.moe against the C API, stream order, CUDA graphs, torch.compile).
# The torch step times the plain-PyTorch bf16 layer (bench/torch_moe.py: torch._grouped_mm on the
# dequantized weights, one CUDA graph, cold L2, as bench times ours) with the same python3.
# The steps use NVFP4MOE_HOPPER_REGIME=decode|gemm (src/backends/cuda.c) to cover both regimes.
# cpu: CPU_FAST on the host's cores: test_cpu_fast (every ISA the host runs, then each forced),
# bench --cpu --profile, the kernel alone (--stream: a prefetch sweep over 1, 2, 4 .. nproc threads),
# the decode layers per prefetch setting and per thread count.
# Environment: SAN_MEMCHECK, SAN_RACECHECK (gpu_hopper_decode cases under compute-sanitizer),
# GPUTEST_MODES (default "auto decode gemm rt1 nofuse bm32 bm64 bm128 nopdl pdl"), VARIANT_M, VARIANT_NCU (a variant whose stalls ncu
# reads beside the built kernel's), GSAN_MEMCHECK, GSAN_RACECHECK (gpu_hopper_gemm cases of the gsan
# step), AB_M, ENV_AB, ENVAB_M, GEMM_AB, GEMMAB_M, DECPROF_PRESETS, DECPROF_M, DECPROF_SRC_PRESET, BENCH_PRESETS (the gemm and hot steps; default deepseek-v3,qwen3-30b-a3b), BENCH_M
# (default 1,4,16,64,256), TRITON_MS (default 1,16,64,256,1024,4096), TORCH_PRESETS (default
# deepseek-v3,qwen3-30b-a3b), TORCH_MS (default 1,16,64,256,1024,4096), CPU_M (default 1,16,256),
# CPU_THREADS (default: all CPUs), CPU_PREFETCH (the layer's prefetch sweep, default
# default,off,t0:4608,t1:18432,t2:18432,t2:16384:4096).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = pack ]; then
    set -e
    make -j"$(nproc)" BUILD=build-dev build-all >/dev/null
    [ -d .devbin ] && find .devbin -mindepth 1 -maxdepth 1 ! -name '*.sh' -exec rm -rf {} +
    mkdir -p .devbin/b
    cp build-dev/nvfp4moe build-dev/tests/test_cpu_fast build-dev/tests/gpu_test build-dev/tests/gpu_hopper_decode \
       build-dev/tests/gpu_hopper_gemm build-dev/tests/gpu_marlin_gemm build-dev/tests/gpu_ep_loopback \
       build-dev/tests/gpu_emulation .devbin/b/
    # GEMM-kernel variants for A/B runs (HOPPER_VARIANTS="NAME:-DFLAG=V ..."): gpu_hopper_gemm relinked
    # against kernels/hopper_gemm.cu built with those flags
    for v in ${HOPPER_VARIANTS:-}; do
        n=${v%%:*} f=${v#*:}
        nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC -Iinclude -Isrc -Ikernels \
            --expt-relaxed-constexpr -lineinfo ${f//,/ } -c kernels/hopper_gemm.cu -o build-dev/hopper_gemm_$n.o
        cc -O2 -std=c11 -pthread -DNVFP4MOE_HAVE_CUDA -I/usr/local/cuda/include -Iinclude -Isrc -I. -o .devbin/b/gpu_hopper_gemm_$n \
            tests/gpu_hopper_gemm.c build-dev/hopper_gemm_$n.o $(ls tools/*.cu | sed "s,^,build-dev/obj/,; s,\.cu$,.o,") build-dev/libnvfp4moe.a \
            -ljansson -lm -pthread -L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lstdc++
    done
    strip .devbin/b/*
    cp -L build-dev/libnvfp4moe.so .devbin/b/libnvfp4moe.so && strip --strip-unneeded .devbin/b/libnvfp4moe.so
    cp build-dev/obj/kernels/hopper_decode.o build-dev/obj/kernels/hopper_gemm.o .devbin/b/
    for v in ${HOPPER_VARIANTS:-}; do cp build-dev/hopper_gemm_${v%%:*}.o .devbin/b/; done
    cp "$(ldconfig -p | awk '/libjansson.so.4 /{print $NF; exit}')" .devbin/b/
    # PACK_LEAN=1: without the objects (the sass, prof and variants steps' SASS), the shared
    # library (python step) and test_cpu_fast (cpu step): a pack with variants and a base build
    # beside it otherwise passes the 64 MiB a device call carries
    [ "${PACK_LEAN:-0}" = 1 ] && rm -f .devbin/b/*.o .devbin/b/libnvfp4moe.so .devbin/b/test_cpu_fast
    tar -C .devbin/b -czf .devbin/bins.tgz . && rm -rf .devbin/b
    git rev-parse --short HEAD >.devbin/commit
    git diff --quiet HEAD || echo "+local changes" >>.devbin/commit
    rm -rf .anchors && mkdir -p .anchors && cp -r ../shared/anchors/triton_moe .anchors/
    for p in /.devbin/ /.anchors/; do grep -qx "$p" .git/info/exclude 2>/dev/null || echo "$p" >>.git/info/exclude; done
    ls -la .devbin
    exit 0
fi
[ "${1:-}" = run ] || { sed -n '2,17p' "$0"; exit 1; }
steps=",${2:-decode,sanitize,stream,ncu,stalls,sass,gputest,others,python,bench,hot,triton,torch,gemm},"
has() { [[ $steps == *",$1,"* ]]; }

out=${OUT:-/tmp/h200-out}
R=$out/r
mkdir -p "$R"
T0=$(date +%s)
finish() { tar -C "$out" -czf "$out/logs.tgz" r 2>/dev/null; }
log() { echo "[t=$(($(date +%s) - T0))s] $*" | tee -a "$out/summary.txt"; finish; }
trap finish EXIT

B=/tmp/b
rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz
export LD_LIBRARY_PATH=$B
commit=$(tr '\n' ' ' <.devbin/commit)
log "commit $commit; $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"

if has decode; then
    timeout 240 $B/gpu_hopper_decode >"$R/gpu_hopper_decode.txt" 2>&1
    log "gpu_hopper_decode rc=$?: $(tail -1 "$R/gpu_hopper_decode.txt")"
    grep -E "^(FAIL|  )" "$R/gpu_hopper_decode.txt" | head -20 | tee -a "$out/summary.txt"
fi
if has sanitize; then
    # 20 23 25 27 29: launched with PDL and L2 prefetch (21 22 likewise, under racecheck); 32 34 42:
    # GEMM1 grouping / routing itself (42: 1024 experts, the largest routing scratch); 43 44: the
    # combine with 16 and 40 slots per token
    for c in ${SAN_MEMCHECK:-1 3 6 9 12 20 23 25 27 29 34 42 44}; do
        timeout 150 compute-sanitizer --tool memcheck $B/gpu_hopper_decode --case $c >"$R/memcheck$c.txt" 2>&1
        log "memcheck case $c rc=$?: $(grep -E 'ERROR SUMMARY' "$R/memcheck$c.txt")"
    done
    for c in ${SAN_RACECHECK:-2 10 11 21 22 32 34 43}; do
        timeout 200 compute-sanitizer --tool racecheck $B/gpu_hopper_decode --case $c >"$R/racecheck$c.txt" 2>&1
        log "racecheck case $c rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$R/racecheck$c.txt" | tr '\n' ' ')"
    done
fi
if has stream; then
    timeout 90 $B/gpu_hopper_decode --stream >"$R/stream.txt" 2>&1
    log "stream rc=$?"; cat "$R/stream.txt" >>"$out/summary.txt"
fi
if has ncu; then
    timeout 120 ncu --clock-control none --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis -k regex:decode_kernel --launch-skip 4 --launch-count 1 \
        $B/gpu_hopper_decode --stream >"$R/ncu_stream.txt" 2>&1
    log "ncu stream rc=$?: $(grep -E 'DRAM Throughput|Issued Warp Per|Duration' "$R/ncu_stream.txt" | tr -s ' ' | tr '\n' ';')"
fi
# ncu metrics of the stall steps: stall reasons per issued instruction, issue, tensor pipe, L2 and
# DRAM; stall_summary FILE appends the ones that matter to the summary
stall_metrics='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__issue_active.avg.pct_of_peak_sustained_active,regex:sm__pipe_tensor_op.*cycles_active\.avg\.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed'
stall_summary() {
    echo "== $(basename "$1")" >>"$out/summary.txt"
    grep -E "stalled|issue_active|dram__|tensor_op|lts__" "$1" | awk '$NF+0 >= 0.1 || /issue_active|dram__|tensor_op|lts__/' >>"$out/summary.txt"
}
if has stalls; then
    # the decode kernel streaming one expert, the wgmma GEMM at DeepSeek-V3 M = 4096
    m=$stall_metrics
    timeout 150 ncu --clock-control none --metrics "$m" -k regex:decode_kernel --launch-skip 4 --launch-count 1 \
        $B/gpu_hopper_decode --stream >"$R/stalls_decode.txt" 2>&1
    timeout 200 ncu --clock-control none --metrics "$m" -k regex:hopper_moe_gemm --launch-skip 4 --launch-count 1 \
        $B/gpu_hopper_gemm --bench 4096 >"$R/stalls_gemm.txt" 2>&1
    for f in "$R"/stalls_decode.txt "$R"/stalls_gemm.txt; do stall_summary "$f"; done
    log "stalls done"
fi
if has prof; then
    # the prefill GEMMs as ncu sees them, per PROF_CASES entry model:M (default DeepSeek-V3 M = 4096
    # and Qwen3-30B-A3B M = 256): GEMM1 (launch 8: after 4 warm-up pairs) and GEMM2 (launch 9):
    # sections, then the per-SASS-instruction stall samples of both; the kernels' SASS
    sec="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section SourceCounters"
    for pc in ${PROF_CASES:-deepseek-v3:4096 qwen3-30b-a3b:256}; do
        pm=${pc%%:*} pM=${pc#*:} tag=${pm%%-*}_$pM
        for l in 8 9; do
            timeout 200 ncu --clock-control none $sec -k regex:hopper_moe_gemm --launch-skip $l --launch-count 1 \
                $B/gpu_hopper_gemm --bench $pM --model $pm >"$R/prof_gemm_${tag}_l$l.txt" 2>&1
            log "prof $pm M=$pM launch $l rc=$?: $(grep -E 'Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|L2 Cache Throughput|DRAM Throughput|Registers Per' "$R/prof_gemm_${tag}_l$l.txt" | tr -s ' ' | tr '\n' ';')"
            timeout 200 ncu --clock-control none --section SourceCounters --section WarpStateStats -k regex:hopper_moe_gemm \
                --launch-skip $l --launch-count 1 --page source --print-source sass --csv \
                $B/gpu_hopper_gemm --bench $pM --model $pm >"$R/prof_gemm_sass_${tag}_l$l.csv" 2>&1
            log "prof sass $pm M=$pM launch $l rc=$?: $(wc -l <"$R/prof_gemm_sass_${tag}_l$l.csv") lines"
        done
    done
    cob=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
    [ -x "$cob" ] && "$cob" -sass $B/hopper_gemm.o >"$R/hopper_gemm.sass" 2>&1
    log "sass: $(grep -c 'Function' "$R/hopper_gemm.sass" 2>/dev/null) functions"
    # the GEMMs alone per model and M, at the default token tile and forced to 64
    timeout 200 $B/gpu_hopper_gemm --bench 256,1024,4096 --model all >"$R/gemm_bench.txt" 2>&1
    log "gemm bench rc=$?"; grep -E '^\|' "$R/gemm_bench.txt" | cut -d'|' -f1-12 >>"$out/summary.txt"
    HOPPER_BENCH_BLOCK_M=64 timeout 200 $B/gpu_hopper_gemm --bench 1024,4096 --model all >"$R/gemm_bench64.txt" 2>&1
    log "gemm bench block_m 64 rc=$?"; grep -E '^\| [0-9]' "$R/gemm_bench64.txt" | cut -d'|' -f1-12 >>"$out/summary.txt"
fi
if has gsan; then
    # the wgmma GEMM under compute-sanitizer: partial token tiles at block_m 128 and 64, split-K,
    # two weight tiles per item on an odd tile count (33, 35), fused SiLU with a K split (38) and
    # at block_m 128 (39),
    # reruns on 2-3 CTAs (53: case 14, 56: case 33, 58: case 35, 60: case 38, 62: case 47, 63:
    # case 48), the narrowest token widths (45, 46, 47), block_m 32 (48, 49, 50)
    for c in ${GSAN_MEMCHECK:-14 6 2 20 33 35 38 39 45 46 47 48 49 50 53 58 60 63}; do
        timeout 150 compute-sanitizer --tool memcheck $B/gpu_hopper_gemm --case $c >"$R/gemm_memcheck$c.txt" 2>&1
        log "gemm memcheck case $c rc=$?: $(grep -E 'ERROR SUMMARY' "$R/gemm_memcheck$c.txt")"
    done
    for c in ${GSAN_RACECHECK:-14 17 33 46 47 48 53 56 60 62 64}; do
        timeout 200 compute-sanitizer --tool racecheck $B/gpu_hopper_gemm --case $c >"$R/gemm_racecheck$c.txt" 2>&1
        log "gemm racecheck case $c rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$R/gemm_racecheck$c.txt" | tr '\n' ' ')"
    done
fi
if has gsgroup; then
    for tool in memcheck racecheck; do
        timeout 300 compute-sanitizer --tool $tool $B/gpu_test --only group >"$R/group_$tool.txt" 2>&1
        log "gpu_test --only group under $tool rc=$?: $(grep -E 'passed|RACECHECK SUMMARY|ERROR SUMMARY' "$R/group_$tool.txt" | tr '\n' ' ')"
    done
    timeout 120 ncu --clock-control none --section LaunchStats -k regex:group_multi --launch-count 1 \
        $B/nvfp4moe bench --preset deepseek-v3 --m 4096 --backend HOPPER_WGMMA --no-baseline --iters 2 \
        --out "$R/gsgroup-bench" >"$R/group_ncu.txt" 2>&1
    log "grouping launch at DeepSeek-V3 M = 4096 rc=$?: $(grep -E 'group_multi|Cluster Size|Grid Size' "$R/group_ncu.txt" | tr -s ' ' | tr '\n' ';')"
fi
if has gemmab; then
    # the GEMMs alone (gpu_hopper_gemm --bench, every model) under two or more environments,
    # alternately twice: GEMM_AB="name:VAR=V,VAR2=V2 name2:VAR=W" (default: one and two weight
    # tiles per work item), at GEMMAB_M (default 256,1024,4096)
    for round in 1 2; do
        for v in ${GEMM_AB:-rt1:HOPPER_BENCH_ROWTILES=1 rt2:HOPPER_BENCH_ROWTILES=2}; do
            n=${v%%:*} vars=${v#*:}
            env ${vars//,/ } timeout 200 $B/gpu_hopper_gemm --bench "${GEMMAB_M:-256,1024,4096}" --model all \
                >"$R/gemmab-$n$round.txt" 2>&1
            log "gemm A/B $n ($vars) round $round rc=$?"
            grep -E '^\| [0-9]' "$R/gemmab-$n$round.txt" | cut -d'|' -f1-8 >>"$out/summary.txt"
        done
    done
fi
if has variants; then
    # the GEMMs alone, the built kernel and each variant built by pack (HOPPER_VARIANTS)
    for b in $B/gpu_hopper_gemm $B/gpu_hopper_gemm_*; do
        [ -x "$b" ] || continue
        n=$(basename "$b")
        timeout 120 $b >"$R/$n.test.txt" 2>&1
        log "$n tests rc=$?: $(tail -1 "$R/$n.test.txt")"
        timeout 200 $b --bench ${VARIANT_M:-1024,4096} --model all >"$R/$n.bench.txt" 2>&1
        log "$n bench rc=$?"; grep -E '^\| [0-9]' "$R/$n.bench.txt" | cut -d'|' -f1-12 >>"$out/summary.txt"
    done
    # local-memory traffic (spills) per kernel instance of each variant's object
    for o in $B/hopper_gemm*.o; do
        cuobjdump -sass "$o" 2>/dev/null | awk -v n="$(basename "$o")" '/Function :/{f=$3} /LDL|STL/{c[f]++} END{for (k in c) print n, k, c[k], "LDL/STL"}' >>"$R/variants_spills.txt"
    done
    log "variant spills: $(wc -l <"$R/variants_spills.txt" 2>/dev/null) kernel instances with LDL/STL"
    cat "$R/variants_spills.txt" >>"$out/summary.txt" 2>/dev/null
    if [ -n "${VARIANT_NCU:-}" ] && [ -x "$B/gpu_hopper_gemm_$VARIANT_NCU" ]; then
        # stall reasons of the GEMM1 of DeepSeek-V3 M = 4096, the base kernel and one variant
        for b in gpu_hopper_gemm gpu_hopper_gemm_$VARIANT_NCU; do
            timeout 150 ncu --clock-control none --metrics "$stall_metrics" -k regex:hopper_moe_gemm --launch-skip 8 \
                --launch-count 1 $B/$b --bench 4096 >"$R/stalls_$b.txt" 2>&1
            stall_summary "$R/stalls_$b.txt"
        done
        log "variant stalls done"
    fi
fi
if has sass; then
    cuobjdump -sass $B/hopper_decode.o >"$R/hopper_decode.sass" 2>&1
    # opcode histogram of each decode kernel instance
    awk '/Function :/{f=$3} /^ +\/\*[0-9a-f]+\*\/ /{op=$2; if (op ~ /^@/) op=$3; sub(/\..*/,"",op); sub(/;$/,"",op); n[f" "op]++}
         END{for (k in n) print k, n[k]}' "$R/hopper_decode.sass" | sort >"$R/sass_hist.txt"
    log "sass: $(grep -c 'Function :' "$R/hopper_decode.sass") functions; HMUL2 with selectors: $(grep -cE 'HMUL2.*\.H[01]_H[01]' "$R/hopper_decode.sass")"
fi
gmodes=" ${GPUTEST_MODES:-auto decode gemm rt1 nofuse bm32 bm64 bm128 nopdl pdl} "
if has gputest; then
    for rg in auto decode gemm; do  # HOPPER_WGMMA's regime: chosen by the plan (auto), or forced
        [[ $gmodes == *" $rg "* ]] || continue
        NVFP4MOE_HOPPER_REGIME=$rg timeout 120 $B/gpu_test >"$R/gpu_test_$rg.txt" 2>&1
        log "gpu_test (HOPPER_WGMMA regime $rg) rc=$?: $(grep -E 'passed' "$R/gpu_test_$rg.txt" | tail -1)"
        grep -E "FAIL" "$R/gpu_test_$rg.txt" | head -10 | tee -a "$out/summary.txt"
    done
    # the decode regime with every launch setting of its kernels on (PDL, L2 prefetch, GEMM1
    # leaving one CTA slot per SM free, GEMM2's early expert prefetch): the plan's whole chain, graph replay included
    # the larger-batch GEMM's non-default forms through the whole layer: one weight tile per item
    # (rt1), and two without GEMM1's fused SiLU (nofuse), block_m forced to 32, 64 and 128 at every M,
    # GEMM2 launched only after GEMM1 has finished (nopdl: without PDL)
    for v in rt1:NVFP4MOE_HOPPER_ROW_TILES=1 nofuse:NVFP4MOE_HOPPER_FUSED_ACT=0 bm32:NVFP4MOE_HOPPER_BLOCK_M=32 \
             bm64:NVFP4MOE_HOPPER_BLOCK_M=64 bm128:NVFP4MOE_HOPPER_BLOCK_M=128 nopdl:NVFP4MOE_HOPPER_GEMM_PDL=0; do
        n=${v%%:*}
        [[ $gmodes == *" $n "* ]] || continue
        env NVFP4MOE_HOPPER_REGIME=gemm ${v#*:} timeout 120 $B/gpu_test >"$R/gpu_test_$n.txt" 2>&1
        log "gpu_test (gemm regime, ${v#*:}) rc=$?: $(grep -E 'passed' "$R/gpu_test_$n.txt" | tail -1)"
        grep -E "FAIL" "$R/gpu_test_$n.txt" | head -10 | tee -a "$out/summary.txt"
    done
    if [[ $gmodes == *" pdl "* ]]; then
        NVFP4MOE_HOPPER_REGIME=decode NVFP4MOE_HOPPER_PDL=1 NVFP4MOE_HOPPER_PREFETCH=4 NVFP4MOE_HOPPER_G1_ROOM=1 \
            NVFP4MOE_HOPPER_G2_L2_MB=24 timeout 120 $B/gpu_test >"$R/gpu_test_decode_pdl.txt" 2>&1
        log "gpu_test (decode, PDL + prefetch settings on) rc=$?: $(grep -E 'passed' "$R/gpu_test_decode_pdl.txt" | tail -1)"
        grep -E "FAIL" "$R/gpu_test_decode_pdl.txt" | head -10 | tee -a "$out/summary.txt"
    fi
fi
if has others; then
    for t in gpu_emulation gpu_hopper_gemm gpu_marlin_gemm gpu_ep_loopback; do
        timeout 120 $B/$t >"$R/$t.txt" 2>&1
        log "$t rc=$?: $(tail -1 "$R/$t.txt")"
    done
fi
if has cpu; then
    { lscpu; echo; grep -E 'MemTotal' /proc/meminfo; echo "transparent_hugepage: $(cat /sys/kernel/mm/transparent_hugepage/enabled)";
      echo "nproc: $(nproc)"; } >"$R/lscpu.txt" 2>&1
    log "cpu: $(grep -m1 'Model name' "$R/lscpu.txt" | tr -s ' '); $(grep -E '^(Thread|Core)' "$R/lscpu.txt" | tr -s ' ' | tr '\n' ';')"
    # correctness first: every ISA this CPU runs (the test iterates them), then each one forced
    timeout 120 $B/test_cpu_fast >"$R/test_cpu_fast.txt" 2>&1
    log "test_cpu_fast rc=$?: $(head -1 "$R/test_cpu_fast.txt"); $(tail -1 "$R/test_cpu_fast.txt")"
    for isa in avx512 avx2 portable; do
        NVFP4MOE_CPU_ISA=$isa timeout 120 $B/test_cpu_fast >"$R/test_cpu_fast_$isa.txt" 2>&1
        log "test_cpu_fast NVFP4MOE_CPU_ISA=$isa rc=$?: $(tail -1 "$R/test_cpu_fast_$isa.txt")"
    done
    grep -E "^FAIL" "$R"/test_cpu_fast*.txt | head -10 | tee -a "$out/summary.txt"
    n=$(nproc); sweep=1; t=2; while [ "$t" -lt "$n" ]; do sweep="$sweep,$t"; t=$((t * 2)); done; sweep="$sweep,$n"
    # the layers as the targets measure them, with where the time goes
    timeout 300 $B/nvfp4moe bench --cpu --preset qwen3-30b-a3b,deepseek-v3 --m "${CPU_M:-1,16,256}" \
        ${CPU_THREADS:+--threads "$CPU_THREADS"} --iters 10 --profile --commit "$commit" --out "$R/bench-cpu" \
        >"$R/bench-cpu.log" 2>&1
    log "bench --cpu --profile rc=$?"
    grep -E "^  M=|^ +us:" "$R/bench-cpu.log" | tee -a "$out/summary.txt"
    # CPU_SWEEPS=0 stops here
    if [ "${CPU_SWEEPS:-1}" = 1 ]; then
    # the kernel alone: streaming per prefetch setting and thread count, and on a cached tile
    timeout 240 $B/nvfp4moe bench --cpu --stream --threads "$sweep" --commit "$commit" --out "$R/bench-cpu-stream" \
        >"$R/bench-cpu-stream.log" 2>&1
    log "bench --cpu --stream (threads $sweep) rc=$?"
    grep -E "stream +$n threads|cached tile +($n|1) threads" "$R/bench-cpu-stream.log" | tee -a "$out/summary.txt"
    # the decode layers per prefetch setting (one plan per preset), then per thread count
    timeout 240 $B/nvfp4moe bench --cpu --preset qwen3-30b-a3b,deepseek-v3 --m 1,16 \
        --prefetch "${CPU_PREFETCH:-default,off,t0:4608,t1:18432,t2:18432,t2:16384:4096}" --iters 10 --profile \
        --commit "$commit" --out "$R/bench-cpu-prefetch" >"$R/bench-cpu-prefetch.log" 2>&1
    log "bench --cpu --prefetch rc=$?"
    grep -E "^  M=" "$R/bench-cpu-prefetch.log" | tee -a "$out/summary.txt"
    timeout 400 $B/nvfp4moe bench --cpu --preset qwen3-30b-a3b,deepseek-v3 --m 1,16 --threads "$sweep" --iters 10 \
        --profile --commit "$commit" --out "$R/bench-cpu-threads" >"$R/bench-cpu-threads.log" 2>&1
    log "bench --cpu --threads $sweep rc=$?"
    grep -E "threads: plan|^  M=" "$R/bench-cpu-threads.log" | tee -a "$out/summary.txt"
    fi
fi
if has cli; then
    # the tool's files through the GPU backends: run --output, routing from files, compare
    (
        set -x
        N=$B/nvfp4moe G=/tmp/cli
        rm -rf $G && mkdir -p $G
        $N quantize --random --num-experts 32 --top-k 8 --hidden-size 2048 --intermediate-size 768 --out $G/src &&
            $N quantize --in $G/src --out $G/q || exit 1
        $N run --model $G/q --tokens 64 --moe-backend cpu_reference --scheme w4a16 --output $G/ref.safetensors
        $N run --model $G/q --input $G/ref.safetensors --router-logits $G/ref.safetensors --output $G/auto.safetensors
        $N run --model $G/q --input $G/ref.safetensors --router-logits $G/ref.safetensors --moe-backend hopper_wgmma \
            --output $G/wgmma.safetensors
        $N compare $G/auto.safetensors $G/ref.safetensors; echo "compare auto rc=$?"
        $N compare $G/wgmma.safetensors $G/ref.safetensors; echo "compare hopper_wgmma rc=$?"
        python3 -c "import struct,random;r=random.Random(1);open('$G/ids.bin','wb').write(b''.join(struct.pack('<8i',*r.sample(range(32),8)) for _ in range(64)));open('$G/w.bin','wb').write(struct.pack('<512f',*[0.125]*512))"
        $N run --model $G/q --input $G/ref.safetensors --topk-ids $G/ids.bin --topk-weights $G/w.bin --moe-backend cpu_reference \
            --scheme w4a16 --output $G/ref_k.safetensors
        $N run --model $G/q --input $G/ref.safetensors --topk-ids $G/ids.bin --topk-weights $G/w.bin --output $G/gpu_k.safetensors
        $N compare $G/gpu_k.safetensors $G/ref_k.safetensors; echo "compare topk rc=$?"
        $N run --device h200 --tokens 4; echo "run --device h200 rc=$?"
        $N run --device b200 --tokens 4; echo "run --device b200 rc=$?"
        $N bench --preset qwen3-30b-a3b --m 1,16 --iters 20 --no-baseline --json --out $G/bj >$G/b.jsonl
        echo "bench --json rc=$? lines=$(wc -l <$G/b.jsonl) files: $(ls $G | grep bj | tr '\n' ' ')"
    ) >"$R/cli.txt" 2>&1
    log "cli: $(grep -E '^(compare|run --device|bench --json)' "$R/cli.txt" | tr '\n' ';')"
fi
if has python; then
    NVFP4MOE_LIBRARY=$B/libnvfp4moe.so NVFP4MOE_CLI=$B/nvfp4moe timeout 200 python3 python/tests/run.py --gpu -v \
        >"$R/python.txt" 2>&1
    rc=$?
    log "python ($(python3 -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -n 1)) rc=$rc: $(tail -1 "$R/python.txt")"
    grep -E "^(FAIL|ERROR):" "$R/python.txt" | head -20 | tee -a "$out/summary.txt"
fi
presets=${BENCH_PRESETS:-deepseek-v3,qwen3-30b-a3b}
ms=${BENCH_M:-1,4,16,64,256}
if has bench; then
    timeout 300 $B/nvfp4moe bench --m 1,4,16,64,256,1024,4096 --backend MARLIN,HOPPER_WGMMA --no-baseline \
        --iters 20 --commit "$commit" --out "$R/bench-auto" >"$R/bench-auto.log" 2>&1
    log "bench (auto, every preset) rc=$?"
fi
if has hot; then
    # 3900 of 4096 tokens pick expert 0 first, to set beside the bench step's uniform routing at
    # M = 4096 (the summary's table rows below; gpu_test's hot-expert case checks the outputs)
    timeout 300 $B/nvfp4moe bench --preset "$presets" --m 4096 --hot-tokens 3900 --backend HOPPER_WGMMA,MARLIN \
        --no-baseline --iters 20 --commit "$commit" --out "$R/bench-hot" >"$R/bench-hot.log" 2>&1
    log "bench (hot expert: 3900 of 4096 tokens on expert 0) rc=$?"
fi
if has gemm; then
    NVFP4MOE_HOPPER_REGIME=gemm timeout 300 $B/nvfp4moe bench --preset "$presets" --m "$ms" --backend HOPPER_WGMMA \
        --no-baseline --iters 20 --commit "$commit (HOPPER_WGMMA forced to its wgmma GEMM)" --out "$R/bench-gemm" \
        >"$R/bench-gemm.log" 2>&1
    log "bench (HOPPER_WGMMA gemm regime) rc=$?"
fi
if has regimes; then
    # HOPPER_WGMMA forced into each regime on every preset where the choice is close
    for rg in decode gemm; do
        NVFP4MOE_HOPPER_REGIME=$rg timeout 300 $B/nvfp4moe bench --m "${REGIME_M:-4,16,64,256}" --backend HOPPER_WGMMA \
            --no-baseline --iters 20 --commit "$commit (HOPPER_WGMMA forced to its $rg regime)" --out "$R/bench-$rg" \
            >"$R/bench-$rg.log" 2>&1
        log "bench (HOPPER_WGMMA forced to $rg, every preset) rc=$?"
    done
fi
# bench_env NAME "VAR=V VAR2=W" M OUT: the whole layer, HOPPER_WGMMA on every preset, with those
# variables set (src/backends/cuda.c reads the decode kernels' settings from the environment)
bench_env() {
    env $2 timeout 300 $B/nvfp4moe bench --m "$3" --backend HOPPER_WGMMA --no-baseline --iters 20 \
        --commit "$commit ($1: $2)" --out "$R/$4" >"$R/$4.log" 2>&1
}
if has decodevar; then
    # the decode kernels' settings: name:pdl:prefetch tiles:CTA slots per SM GEMM1 leaves
    # free:GEMM2 early L2 MB
    for v in ${DECODE_VARIANTS:-off:0:0:0:0 pdl:1:0:0:0 pf4:0:4:0:0 pdl-pf4:1:4:0:0 pdl-pf8:1:8:0:0 pdl-pf4-r1:1:4:1:0 pdl-pf4-r1-l2:1:4:1:24}; do
        IFS=: read -r n v_pdl v_pf v_c v_l2 <<<"$v"
        bench_env "$n" "NVFP4MOE_HOPPER_PDL=$v_pdl NVFP4MOE_HOPPER_PREFETCH=$v_pf NVFP4MOE_HOPPER_G1_ROOM=$v_c NVFP4MOE_HOPPER_G2_L2_MB=$v_l2" \
            "${DECODE_M:-1,4,16,64}" "bench-dv-$n"
        log "bench decode variant $n rc=$?"
    done
fi
if has envab; then
    # one tool under two or more environments, alternately twice:
    # ENV_AB="name:VAR=V,VAR2=V2 name2:VAR=W" (default: GEMM1 routing in its prologue on and off)
    for round in 1 2; do
        for v in ${ENV_AB:-fused:NVFP4MOE_HOPPER_FUSED_ROUTE=1 kernel:NVFP4MOE_HOPPER_FUSED_ROUTE=0}; do
            n=${v%%:*} vars=${v#*:}
            bench_env "$n" "${vars//,/ }" "${ENVAB_M:-1,2,4}" "bench-env-$n$round"
            log "bench env $n ($vars) round $round rc=$?"
        done
    done
fi
if has ab; then
    # the built tool against .devbin/base/nvfp4moe_base (the same bench built from another commit,
    # carried beside the pack), alternately twice, HOPPER_WGMMA on every preset: A/B in one call
    if ! [ -x .devbin/base/nvfp4moe_base ]; then
        log "bench A/B skipped: no .devbin/base/nvfp4moe_base"
    else
        for round in 1 2; do
            for side in base new; do
                bin=$B/nvfp4moe; [ $side = base ] && bin=.devbin/base/nvfp4moe_base
                timeout 300 $bin bench --m "${AB_M:-1,4,16,64,256,1024,4096}" --backend HOPPER_WGMMA --no-baseline \
                    --iters 20 --commit "$commit ($side)" --out "$R/bench-ab-$side$round" >"$R/bench-ab-$side$round.log" 2>&1
                log "bench A/B $side round $round rc=$?"
            done
        done
    fi
fi
if has decprof; then
    # where the decode layer's time goes at small M: ncu's duration of each kernel of the bench's
    # layer (cold caches before each kernel), with GEMM1's routing inside and outside it, then the
    # SASS-level stall samples of the decode kernels (the source page as CSV)
    for fr in 1 0; do
        NVFP4MOE_HOPPER_FUSED_ROUTE=$fr timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum \
            --print-summary per-kernel $B/nvfp4moe bench --preset "${DECPROF_PRESETS:-qwen3-30b-a3b,deepseek-v3}" \
            --m "${DECPROF_M:-1}" --backend HOPPER_WGMMA --no-baseline --iters 20 --out "$R/decprof-bench$fr" \
            >"$R/decprof-durations-fused$fr.txt" 2>&1
        log "decprof durations (fused route $fr) rc=$?"
        grep -E "^  [a-z_].*\(|gpu__time_duration|^    [a-z]" "$R/decprof-durations-fused$fr.txt" | grep -vE "^==" | head -60 >>"$out/summary.txt"
    done
    timeout 200 ncu --clock-control none --section WarpStateStats --section SourceCounters -k regex:decode_kernel \
        --launch-skip 6 --launch-count 2 -o "$R/decprof" $B/nvfp4moe bench --preset "${DECPROF_SRC_PRESET:-qwen3-30b-a3b}" \
        --m 1 --backend HOPPER_WGMMA --no-baseline --iters 20 --out "$R/decprof-bench-src" >"$R/decprof-src.log" 2>&1
    log "decprof source profile rc=$?"
    ncu -i "$R/decprof.ncu-rep" --page details >"$R/decprof-details.txt" 2>&1
    ncu -i "$R/decprof.ncu-rep" --page source --csv --print-source sass >"$R/decprof-source.csv" 2>&1
    log "decprof source page: $(wc -l <"$R/decprof-source.csv") lines"
    rm -f "$R/decprof.ncu-rep"
fi
if has triton; then
    PYTHONUNBUFFERED=1 timeout 400 python3 .anchors/triton_moe/bench_triton_moe.py --ms "${TRITON_MS:-1,16,64,256,1024,4096}" \
        --no-check --out "$R/triton.json" >"$R/triton.log" 2>&1
    log "triton anchor rc=$?"
    tail -30 "$R/triton.log" >>"$out/summary.txt"
fi
if has torch; then
    # the bf16 baseline of the targets: the whole layer in plain PyTorch, timed in this same call
    PYTHONUNBUFFERED=1 timeout 400 python3 bench/torch_moe.py --preset "${TORCH_PRESETS:-deepseek-v3,qwen3-30b-a3b}" \
        --ms "${TORCH_MS:-1,16,64,256,1024,4096}" --iters 20 --json "$R/torch.json" >"$R/torch.log" 2>&1
    rc=$?
    log "torch bf16 baseline rc=$rc: $(grep -E '^torch_moe: ' "$R/torch.log" | sed -n '1p;$p' | uniq | tr '\n' ' ')"
    grep -E "^(ceilings|FAIL|### |\| *[0-9]+ \|)|CUDA graph capture failed" "$R/torch.log" >>"$out/summary.txt"
fi
for f in "$R"/bench-*.md; do
    [ -f "$f" ] || continue
    echo "== $f" >>"$out/summary.txt"
    grep -E "^## |^\| *[0-9]+ \|" "$f" | cut -d'|' -f1-11 >>"$out/summary.txt"
done
log done
cat "$out/summary.txt" | tail -60
