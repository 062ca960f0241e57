#!/usr/bin/env bash
# Call 4 (2026-12-07, seventeenth session): the committed rule (block_m 32 on two CTAs for short
# items) in the auto regime: gpu_test (auto, block_m 32 forced through the layer), the layer
# against bfc2952's tool at M = 1..512, the decode regime against the GEMM at block_m 32 at 1-6
# pairs per expert, triton_kernels in the same call; divprobe (div.full.f32 against IEEE).
cd "$(dirname "$0")/.."
.devbin/divprobe > $OUT/divprobe.txt 2>&1
gunzip -c .devbin/base/nvfp4moe_base.gz > .devbin/base/nvfp4moe_base && chmod +x .devbin/base/nvfp4moe_base
GPUTEST_MODES="auto bm32" AB_M=1,16,32,48,64,128,256,512 \
ENV_AB="auto:NVFP4MOE_HOPPER_REGIME=auto g32:NVFP4MOE_HOPPER_REGIME=gemm,NVFP4MOE_HOPPER_BLOCK_M=32" \
ENVAB_M=8,16,24,32,48 TRITON_MS=1,16,64,256 timeout ${LIMIT:-330} bench/h200_check.sh run gputest,ab,envab,triton
ls $OUT
