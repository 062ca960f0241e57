/*
 * nvfp4_data.h - test data that puts NVFP4 quantizers on their rounding ties, shared by the CPU test
 * of the quantizers and EMULATION (tests/test_emulation.c) and its GPU counterpart
 * (tests/gpu_emulation.c). Header-only, deterministic in the seed.
 */
#ifndef NVFP4MOE_TEST_NVFP4_DATA_H
#define NVFP4MOE_TEST_NVFP4_DATA_H

#include "core/internal.h"

#include <math.h>
#include <stdbool.h>

/* bf16 data dense in exact E2M1 and E4M3 ties: small integers over powers of two, blocks whose amax
 * makes the block scale exact, zero blocks, lone outliers, and 1e-3 / 1e3 magnitudes. */
static inline void tie_heavy(float *x, int64_t rows, int64_t cols, uint64_t seed) {
    uint64_t r = seed;
    for (int64_t i = 0; i < rows * cols; i++) {
        const int64_t block = i / 16;
        const int kind = (int)(block % 7);
        double v;
        if (kind == 0) v = (double)((int)(nvfp4moe_rand_u64(&r) % 25) - 12) / 4.0;         /* k/4 */
        else if (kind == 1) v = ldexp((double)((int)(nvfp4moe_rand_u64(&r) % 15) - 7), (int)(nvfp4moe_rand_u64(&r) % 5) - 2);
        else if (kind == 2) v = nvfp4moe_rand_normal(&r);
        else if (kind == 3) v = 0.0;
        else if (kind == 4) v = (i % 16 == 5) ? 96.0 : (double)((int)(nvfp4moe_rand_u64(&r) % 9) - 4) * 0.75;
        else if (kind == 5) v = 1e-3 * nvfp4moe_rand_normal(&r);
        else v = 1e3 * (double)((int)(nvfp4moe_rand_u64(&r) % 13) - 6) / 2.0;
        x[i] = nvfp4moe_round_to_dtype(NVFP4MOE_DTYPE_BF16, (float)v);
    }
}

/* bf16 data on the rounding thresholds of a quantizer that uses block scale s: per block an amax
 * element, then x = bf16(T * s / gs) for thresholds T, where s is the block's E4M3 scale. With a
 * tensor scale a few ulp off a power of two these are ties up to the last bits of x * inv, where
 * the quantizers' formulas part ways. modelopt: T * sf * scale_2. */
static inline void near_ties(float *x, int64_t rows, int64_t cols, float ts, bool modelopt, uint64_t seed) {
    static const float th[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.5f, 1.5f, 3.0f};
    uint64_t r = seed;
    for (int64_t b = 0; b < rows * cols / 16; b++) {
        float *xb = x + b * 16;
        const float amax = nvfp4moe_round_to_dtype(NVFP4MOE_DTYPE_BF16, (float)(0.25 + 8.0 * nvfp4moe_rand_uniform(&r)));
        float step;
        if (modelopt) {
            float d = amax / (6.0f * ts);
            step = nvfp4moe_e4m3_decode(nvfp4moe_e4m3_encode(d)) * ts;
        } else {
            step = nvfp4moe_e4m3_decode(nvfp4moe_e4m3_encode(fminf(ts * (amax * (float)(1.0 / 6.0)), 448.0f))) / ts;
        }
        xb[0] = amax;
        for (int i = 1; i < 16; i++) {
            const float t = th[nvfp4moe_rand_u64(&r) % 10] * ((nvfp4moe_rand_u64(&r) & 1) ? -1.0f : 1.0f);
            xb[i] = nvfp4moe_round_to_dtype(NVFP4MOE_DTYPE_BF16, t * step);
        }
    }
}

#endif // NVFP4MOE_TEST_NVFP4_DATA_H
