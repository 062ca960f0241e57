#!/usr/bin/env bash
# device.sh - build and run the GPU programs on the lent H200 machine (the `run` tool of the
# development environment), which has nvcc and a GPU but no package registry and no libjansson-dev.
#
# Here, once per checkout (the .debs go to .deb/, which git ignores):
#     bench/device.sh fetch
# Then, as the device command (name .deb in carry):
#     bench/device.sh test            # build, then every GPU test; logs under $OUT
#     bench/device.sh python          # build, then the Python package's tests with torch on the GPU
#                                     # (python/tests/run.py --gpu: the machine's python3 with torch)
#     bench/device.sh bench [ARGS]    # build, then nvfp4moe bench ARGS (default: all presets)
#     bench/device.sh all [ARGS]      # all three
# Everything printed also lands in $OUT/device.log.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
fetch)
    mkdir -p .deb
    grep -qx '/.deb/' .git/info/exclude 2>/dev/null || echo '/.deb/' >>.git/info/exclude
    (cd .deb && apt-get download libjansson-dev libjansson4)
    ls -l .deb
    exit 0
    ;;
test | python | bench | all) ;;
*)
    sed -n '2,15p' "$0"
    exit 1
    ;;
esac
what=$1
shift

out=${OUT:-/tmp/nvfp4moe-out}
mkdir -p "$out"
exec > >(tee -a "$out/device.log") 2>&1

make_flags=(BUILD=build-device)
if ! [ -f /usr/include/jansson.h ]; then
    ls .deb/libjansson*.deb >/dev/null 2>&1 || { echo "no jansson here: run 'bench/device.sh fetch' first and carry .deb"; exit 1; }
    prefix=/tmp/jansson
    for d in .deb/libjansson*.deb; do dpkg -x "$d" "$prefix"; done
    make_flags+=(DEPS=0 JANSSON_PREFIX="$prefix")
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit, $(date -u '+%Y-%m-%d %H:%M UTC')"

make "${make_flags[@]}" -j"$(nproc)" build-all >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }

if [ "$what" = test ] || [ "$what" = all ]; then
    rc=0
    for t in build-device/tests/gpu_*; do
        echo "== $t"
        "$t" >"$out/$(basename "$t").txt" 2>&1 || rc=1
        tail -n 1 "$out/$(basename "$t").txt"
    done
    # test_emulation compares with vLLM's code in numpy, which this machine may lack
    /usr/bin/python3 -c 'import numpy' 2>/dev/null || export NVFP4MOE_SKIP_NUMPY=1
    NVFP4MOE_CLI=build-device/nvfp4moe tests/run_all.sh build-device/tests/test_* | tail -n 1
    build-device/nvfp4moe run | tee "$out/run.txt"
    [ "$rc" = 0 ] || echo "a GPU test failed: see $out"
fi
if [ "$what" = python ] || [ "$what" = all ]; then
    # torch.ops.nvfp4moe.moe on the GPU backends: the C API's bits, stream order, CUDA graphs,
    # torch.compile (python/tests/test_gpu.py), and the package's CPU tests
    echo "== python $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1 | tail -n 1)"
    NVFP4MOE_LIBRARY="$PWD/build-device/libnvfp4moe.so" NVFP4MOE_CLI="$PWD/build-device/nvfp4moe" \
        python3 python/tests/run.py --gpu -v >"$out/python.txt" 2>&1 || echo "a Python test failed: see $out/python.txt"
    tail -n 1 "$out/python.txt"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    build-device/nvfp4moe bench --commit "$commit" --out "$out/bench" "$@"
fi
