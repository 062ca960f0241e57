#!/usr/bin/env bash
# Runs each test program given, then prints the total as "N passed, N failed".
# A test program prints "<suite>: N passed, N failed" as its last line and exits non-zero on failure.
set -u
total_p=0; total_f=0; status=0
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^[A-Za-z0-9_./-]+: [0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    if [ "$rc" != 0 ] || [ -z "$line" ]; then
        printf '%s\n' "$out"
        echo "== $t exited $rc"
        status=1
    else
        echo "$line"
    fi
    p=$(printf '%s' "$line" | sed -n 's/.*: \([0-9]*\) passed, \([0-9]*\) failed/\1/p')
    f=$(printf '%s' "$line" | sed -n 's/.*: \([0-9]*\) passed, \([0-9]*\) failed/\2/p')
    total_p=$((total_p + ${p:-0})); total_f=$((total_f + ${f:-0}))
    [ -n "$line" ] || total_f=$((total_f + 1))
done
echo "total: $total_p passed, $total_f failed"
exit $status
