#!/usr/bin/env bash
# tests/asan.sh - builds the library and the checkpoint tests (safetensors reader, layer loading,
# the broken-file corpus) with AddressSanitizer + UndefinedBehaviorSanitizer in a temporary build
# directory and runs them. Any finding (out-of-bounds read, leak, undefined behaviour) or failed
# check exits non-zero. CI runs it as: tests/asan.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CC=${CC:-cc}
build=$(mktemp -d /tmp/nvfp4moe-asan.XXXXXX)
trap 'rm -rf "$build"' EXIT

san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
tests="test_safetensors test_checkpoint test_hostile"
targets=""
for t in $tests; do targets="$targets $build/tests/$t"; done

echo "== building with $CC $san into $build"
make --no-print-directory CUDA=0 CC="$CC" BUILD="$build" OPT="-O1 -g $san" \
     LDLIBS="-ljansson -lm -pthread $san" $targets "$build/nvfp4moe" >"$build/make.log" 2>&1 || {
    cat "$build/make.log"
    echo "asan.sh: build failed"
    exit 1
}

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:exitcode=86"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export NVFP4MOE_CLI="$build/nvfp4moe"
status=0
for t in $tests; do
    echo "== $t (ASan/UBSan)"
    if ! "$build/tests/$t"; then
        echo "asan.sh: $t failed"
        status=1
    fi
done
exit $status
