/*
 * gpu_gemm_common.h - what the standalone MoE GEMM tests (gpu_marlin_gemm.c, gpu_hopper_gemm.c)
 * share (besides tests/harness.h): a seeded generator, host decoders of E2M1, E4M3, bf16
 * and fp16 written independently of the library's codec, the moe-align grouping built on the host,
 * random routing and random block scales. Static functions: each test program includes it once.
 */
#ifndef NVFP4MOE_GPU_GEMM_COMMON_H
#define NVFP4MOE_GPU_GEMM_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "harness.h"

// ---- host numerics (independent of the library's codec) ----
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}
static double rng_unif(void) { return (double)(rng_next() >> 11) / 9007199254740992.0; }
static double rng_normal(void) {
    double u1 = rng_unif(), u2 = rng_unif();
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static double e2m1_val(uint8_t c) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    double v = mag[c & 7];
    return (c & 8) ? -v : v;
}
static double e4m3_val(uint8_t c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}
static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f2h(float f) {  // round to nearest even, finite inputs in fp16 range
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000;
    int e = (int)((u >> 23) & 0xFF) - 127 + 15;
    uint32_t m = u & 0x7FFFFF;
    if (((u >> 23) & 0xFF) == 0xFF) return (uint16_t)(s | 0x7C00 | (m ? 0x200 : 0));
    if (e >= 31) return (uint16_t)(s | 0x7C00);
    if (e <= 0) {
        if (e < -10) return (uint16_t)s;
        m |= 0x800000;
        int sh = 14 - e;
        uint32_t r = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(s | r);
    }
    uint32_t r = m >> 13, rem = m & 0x1FFF;
    uint32_t out = s | ((uint32_t)e << 10) | r;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) out++;
    return (uint16_t)out;
}
static float h2f(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexpf((float)m, -24);
    else v = ldexpf((float)(m | 1024), e - 25);
    return s ? -v : v;
}

// ---- the moe-align grouping, on the host ----
typedef struct {
    int32_t *sorted_ids, *block_expert, num_blocks, cap, max_blocks;
} grouping;

static grouping make_grouping(const int32_t *topk_ids, int P, int E, int block_m) {
    grouping g;
    g.cap = (int)nvfp4moe_group_capacity(P, E, block_m);
    g.max_blocks = g.cap / block_m;
    g.sorted_ids = malloc(sizeof(int32_t) * (size_t)(g.cap > 0 ? g.cap : 1));
    g.block_expert = malloc(sizeof(int32_t) * (size_t)(g.max_blocks > 0 ? g.max_blocks : 1));
    for (int i = 0; i < g.cap; i++) g.sorted_ids[i] = P;
    for (int i = 0; i < g.max_blocks; i++) g.block_expert[i] = -1;
    int pos = 0;
    for (int e = 0; e < E; e++) {
        int start = pos;
        for (int p = 0; p < P; p++)
            if (topk_ids[p] == e) g.sorted_ids[pos++] = p;
        if (pos == start) continue;
        pos = (pos + block_m - 1) / block_m * block_m;
        for (int b = start / block_m; b < pos / block_m; b++) g.block_expert[b] = e;
    }
    g.num_blocks = pos / block_m;
    return g;
}

// Random top-k experts per token, avoiding experts >= e_used so some experts get no tokens.
static void route(int M, int topk, int e_used, int32_t *ids) {
    if (topk > e_used) {
        fprintf(stderr, "route: top-%d needs >= %d experts, got %d\n", topk, topk, e_used);
        exit(2);
    }
    for (int t = 0; t < M; t++)
        for (int j = 0; j < topk; j++) {
            int e, dup;
            do {
                e = (int)(rng_next() % (uint64_t)e_used);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[t * topk + i] == e;
            } while (dup);
            ids[t * topk + j] = e;
        }
}

// Realistic E4M3 block scale: what the quantizer produces for blocks of a tensor scaled so the
// largest block hits 448 (mostly 0x50..0x7E), with a sprinkle of subnormals, zeros, negatives.
static uint8_t rand_scale(int allow_neg) {
    uint64_t r = rng_next() % 1000;
    if (r < 10) return 0x00;                                 // all-zero block
    if (r < 25) return (uint8_t)(1 + rng_next() % 7);        // subnormal
    if (allow_neg && r < 35) return (uint8_t)(0x80 | (0x40 + rng_next() % 0x3E));
    return (uint8_t)(0x40 + rng_next() % 0x3F);              // 2^1 .. 448 (never 0x7F NaN)
}

#endif // NVFP4MOE_GPU_GEMM_COMMON_H
