#!/usr/bin/env bash
# tests/sanitize.sh - builds the library, the CLI and every CPU test program with a sanitizer in a
# temporary build directory and runs the whole CPU suite (tests/run_all.sh) with it:
#   tests/sanitize.sh address   AddressSanitizer + UndefinedBehaviorSanitizer (and LeakSanitizer):
#                               out-of-bounds accesses, use after free, leaks, undefined behaviour
#   tests/sanitize.sh thread    ThreadSanitizer: data races (CPU_FAST's workers, expert
#                               parallelism's ranks, objects shared between threads)
# Any finding or failed check exits non-zero. CI runs both. CC defaults to clang.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-address}
case "$mode" in
address) san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" ;;
thread) san="-fsanitize=thread -fno-omit-frame-pointer" ;;
*) echo "usage: tests/sanitize.sh [address|thread]" >&2; exit 2 ;;
esac
CC=${CC:-clang}
build=$(mktemp -d /tmp/nvfp4moe-san.XXXXXX)
trap 'rm -rf "$build"' EXIT

tests=""
for t in tests/test_*.c; do tests="$tests $build/tests/$(basename "$t" .c)"; done

echo "== building with $CC $san into $build"
make --no-print-directory -j"${JOBS:-2}" CUDA=0 CC="$CC" BUILD="$build" OPT="-O1 -g $san" \
     LDLIBS="-ljansson -lm -pthread $san" $tests "$build/nvfp4moe" >"$build/make.log" 2>&1 || {
    cat "$build/make.log"
    echo "sanitize.sh: build failed"
    exit 1
}

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:exitcode=86"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1"
export NVFP4MOE_CLI="$build/nvfp4moe"
echo "== every CPU test under the $mode sanitizer"
tests/run_all.sh $tests
