#!/usr/bin/env bash
# Call 4 (2026-12-07, fourteenth session): the SASS of the block_m 256 kernel (bf16, one width,
# no GU) and of the built block_m 128 two-tile kernel (bf16, two widths, no GU), for their k loops.
cd "$(dirname "$0")/.."
mkdir -p $OUT/r
B=/tmp/b; rm -rf $B && mkdir -p $B && tar -C $B -xzf .devbin/bins.tgz
gunzip -c .devbin/v/gpu_hopper_gemm_bm256nw1.gz > $B/g256 && chmod +x $B/g256
cob=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
split() { awk -v pat="$2" '/Function :/ {keep = index($0, pat) > 0} keep' "$1"; }
$cob -sass $B/g256 > /tmp/s256.txt 2>&1; split /tmp/s256.txt Li256ELb1ELi1ELi1ELb0 > $OUT/r/sass_bm256_bf16_nw1.txt
$cob -sass $B/gpu_hopper_gemm > /tmp/s128.txt 2>&1; split /tmp/s128.txt Li128ELb1ELi2ELi2ELb0 > $OUT/r/sass_bm128_bf16_rt2.txt
for f in $OUT/r/sass_*.txt; do echo "$f $(wc -l < $f) lines, HGMMA $(grep -c HGMMA $f), WARPGROUP $(grep -c WARPGROUP $f), DEPBAR $(grep -c DEPBAR $f), STL $(grep -c STL $f)"; done > $OUT/r/summary.txt
gzip $OUT/r/sass_*.txt
