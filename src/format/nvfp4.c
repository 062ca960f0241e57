/*
 * nvfp4.c - the NVFP4 format: E2M1 and E4M3 codecs, vLLM's reference block quantizer, the
 * dequantizer, the 128x4 scale swizzle, and the activation quantize-dequantize helpers the
 * reference layer uses (NVFP4 and MXFP8).
 *
 * Everything here is plain float32 code in the order vLLM's reference quantizer
 * (nvfp4_emulation_utils.ref_nvfp4_quant) evaluates it, so that results are bit-exact with it.
 * Build with -ffp-contract=off: a fused multiply-add would change roundings.
 */
#include "format/format.h"

#include <math.h>
#include <string.h>

// ---- E2M1 ----

static const float k_e2m1_magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

/* The thresholds of round-to-nearest-even on the grid {0, .5, 1, 1.5, 2, 3, 4, 6}: each midpoint
 * goes to the neighbour whose code is even (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0,
 * 2.5 -> 2.0, 3.5 -> 4.0, 5.0 -> 4.0), which is the hardware's cvt.rn.satfinite.e2m1x2. */
static inline uint8_t e2m1_encode(float x) {
    if (isnan(x)) return 0;
    uint8_t sign = signbit(x) ? 0x8 : 0x0;
    float a = fabsf(x);
    /* Counting the thresholds passed (strict '>' where the tie goes down, '>=' where it goes up)
     * is the same rounding as a chain of ifs, without its unpredictable branches. */
    uint8_t m = (uint8_t)((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) +
                          (a > 5.0f)); /* saturates at code 7 (6.0), Inf included */
    return sign | m;
}

uint8_t nvfp4moe_e2m1_encode(float x) { return e2m1_encode(x); }

float nvfp4moe_e2m1_decode(uint8_t code) {
    float v = k_e2m1_magnitude[code & 0x7];
    return (code & 0x8) ? -v : v;
}

// ---- E4M3 (fn) ----

#define E4M3_MAX 448.0f
#define E4M3_MIN_NORMAL 0.015625f      /* 2^-6 */
#define E4M3_SUBNORMAL_STEP 0.001953125f /* 2^-9 */

uint8_t nvfp4moe_e4m3_encode(float x) {
    if (isnan(x)) return 0x7F;
    uint8_t sign = signbit(x) ? 0x80 : 0x00;
    float a = fabsf(x);
    if (a >= E4M3_MAX) return sign | 0x7E;   /* saturate: 448 = exponent 15, mantissa 6 */
    if (a < E4M3_MIN_NORMAL) {
        /* Subnormals are multiples of 2^-9; rintf rounds half to even. 8 * 2^-9 = 2^-6 is the
         * smallest normal and its code is 0x08, so the carry needs no special case. */
        return sign | (uint8_t)rintf(a / E4M3_SUBNORMAL_STEP);
    }
    int e2;
    float f = frexpf(a, &e2);               /* a = f * 2^e2, f in [0.5, 1) */
    int exp = e2 - 1;                        /* a = (2f) * 2^exp, 2f in [1, 2) */
    float m = rintf((2.0f * f - 1.0f) * 8.0f); /* exact products: powers of two */
    if (m == 8.0f) {
        m = 0.0f;
        exp++;
    }
    /* a < 448 and RNE can reach 448 (exp 8, m 6) at most: never the NaN code. */
    return sign | (uint8_t)(((exp + 7) << 3) | (int)m);
}

float nvfp4moe_e4m3_decode(uint8_t code) {
    if ((code & 0x7F) == 0x7F) return NAN;
    int exp = (code >> 3) & 0xF, man = code & 0x7;
    float v = exp == 0 ? (float)man * E4M3_SUBNORMAL_STEP : ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return (code & 0x80) ? -v : v;
}

// ---- block quantizer ----

/* clamp that keeps NaN (fminf/fmaxf would turn a NaN into a bound). */
static float clamp_keep_nan(float x, float lo, float hi) { return x < lo ? lo : x > hi ? hi : x; }

/* Quantizes one block of 16: returns the scale code, writes 16 E2M1 codes. */
static uint8_t quantize_block(const float *x, float gs, uint8_t *q) {
    float amax = 0.0f;
    for (int i = 0; i < 16; i++) {
        float a = fabsf(x[i]);
        if (a > amax || isnan(a)) amax = a;  /* NaN propagates and stays, as torch.max does */
    }
    float s = gs * amax / 6.0f;
    uint8_t sf = nvfp4moe_e4m3_encode(clamp_keep_nan(s, -E4M3_MAX, E4M3_MAX));
    s = nvfp4moe_e4m3_decode(sf);
    float inv = (s == 0.0f) ? 0.0f : 1.0f / (s / gs);
    for (int i = 0; i < 16; i++) q[i] = e2m1_encode(clamp_keep_nan(x[i] * inv, -6.0f, 6.0f));
    return sf;
}

static nvfp4moe_status check_matrix(const char *fn, const void *a, const char *an, const void *b,
                                    const char *bn, const void *c, const char *cn, int64_t rows,
                                    int64_t cols) {
    NVFP4MOE_RETURN_IF(!a, NVFP4MOE_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, an);
    NVFP4MOE_RETURN_IF(!b, NVFP4MOE_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, bn);
    NVFP4MOE_RETURN_IF(!c, NVFP4MOE_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, cn);
    NVFP4MOE_RETURN_IF(rows < 0, NVFP4MOE_ERR_SHAPE, "%s: rows=%lld is negative", fn, (long long)rows);
    NVFP4MOE_RETURN_IF(cols <= 0 || cols % 16 != 0, NVFP4MOE_ERR_SHAPE,
                       "%s: cols=%lld must be a positive multiple of 16", fn, (long long)cols);
    // rows * cols floats must be addressable: the element count and its byte size fit 64 bits.
    NVFP4MOE_RETURN_IF(rows > INT64_MAX / 4 / cols, NVFP4MOE_ERR_SHAPE,
                       "%s: rows=%lld x cols=%lld overflows 64-bit sizes", fn, (long long)rows, (long long)cols);
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_quantize(const float *x, int64_t rows, int64_t cols, float global_scale,
                                  uint8_t *packed, uint8_t *scales) {
    NVFP4MOE_TRY(check_matrix("nvfp4moe_quantize", x, "x", packed, "packed", scales, "scales", rows, cols));
    NVFP4MOE_RETURN_IF(!(isfinite(global_scale) && global_scale > 0.0f), NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "nvfp4moe_quantize: global_scale=%g must be finite and > 0", (double)global_scale);
    uint8_t q[16];
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < cols / 16; b++) {
            scales[r * (cols / 16) + b] = quantize_block(x + r * cols + b * 16, global_scale, q);
            uint8_t *p = packed + r * (cols / 2) + b * 8;
            for (int i = 0; i < 8; i++) p[i] = (uint8_t)(q[2 * i] | (q[2 * i + 1] << 4));
        }
    }
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_dequantize(const uint8_t *packed, const uint8_t *scales, int64_t rows,
                                    int64_t cols, float scale_2, float *out) {
    NVFP4MOE_TRY(check_matrix("nvfp4moe_dequantize", packed, "packed", scales, "scales", out, "out", rows, cols));
    NVFP4MOE_RETURN_IF(!isfinite(scale_2), NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "nvfp4moe_dequantize: scale_2=%g is not finite", (double)scale_2);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) {
            uint8_t byte = packed[r * (cols / 2) + c / 2];
            uint8_t code = (c & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 0xF);
            float sf = nvfp4moe_e4m3_decode(scales[r * (cols / 16) + c / 16]);
            out[r * cols + c] = nvfp4moe_e2m1_decode(code) * sf * scale_2;
        }
    }
    return NVFP4MOE_OK;
}

// ---- 128x4 scale swizzle ----

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

size_t nvfp4moe_swizzled_scales_size(int64_t rows, int64_t kblocks) {
    if (rows <= 0 || kblocks <= 0 || rows > INT64_MAX - 127 || kblocks > INT64_MAX - 3) return 0;
    const int64_t r = round_up(rows, 128), k = round_up(kblocks, 4);
    if (r > INT64_MAX / k || (uint64_t)(r * k) > SIZE_MAX) return 0;   // does not fit: no size
    return (size_t)(r * k);
}

/* Offset of scale (m, kb) in the swizzled layout: 128-row x 4-column tiles of 512 bytes, inside
 * which row m%32 of each 32-row quarter is a 16-byte line holding the 4 quarters' 4 scales. */
static int64_t swizzle_offset(int64_t m, int64_t kb, int64_t kp) {
    return (m / 128) * (kp / 4) * 512 + (kb / 4) * 512 + (m % 32) * 16 + ((m / 32) % 4) * 4 + kb % 4;
}

static nvfp4moe_status check_swizzle(const char *fn, const uint8_t *a, const uint8_t *b, int64_t rows,
                                     int64_t kblocks) {
    NVFP4MOE_RETURN_IF(!a || !b, NVFP4MOE_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                       !a ? "the input" : "the output");
    NVFP4MOE_RETURN_IF(rows <= 0, NVFP4MOE_ERR_SHAPE, "%s: rows=%lld must be > 0", fn, (long long)rows);
    NVFP4MOE_RETURN_IF(kblocks <= 0, NVFP4MOE_ERR_SHAPE, "%s: kblocks=%lld must be > 0", fn,
                       (long long)kblocks);
    NVFP4MOE_RETURN_IF(nvfp4moe_swizzled_scales_size(rows, kblocks) == 0, NVFP4MOE_ERR_SHAPE,
                       "%s: rows=%lld x kblocks=%lld overflows 64-bit sizes", fn, (long long)rows,
                       (long long)kblocks);
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_swizzle_scales(const uint8_t *linear, int64_t rows, int64_t kblocks,
                                        uint8_t *swizzled) {
    NVFP4MOE_TRY(check_swizzle("nvfp4moe_swizzle_scales", linear, swizzled, rows, kblocks));
    int64_t kp = round_up(kblocks, 4);
    memset(swizzled, 0, nvfp4moe_swizzled_scales_size(rows, kblocks));
    for (int64_t m = 0; m < rows; m++)
        for (int64_t kb = 0; kb < kblocks; kb++)
            swizzled[swizzle_offset(m, kb, kp)] = linear[m * kblocks + kb];
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_unswizzle_scales(const uint8_t *swizzled, int64_t rows, int64_t kblocks,
                                          uint8_t *linear) {
    NVFP4MOE_TRY(check_swizzle("nvfp4moe_unswizzle_scales", swizzled, linear, rows, kblocks));
    int64_t kp = round_up(kblocks, 4);
    for (int64_t m = 0; m < rows; m++)
        for (int64_t kb = 0; kb < kblocks; kb++)
            linear[m * kblocks + kb] = swizzled[swizzle_offset(m, kb, kp)];
    return NVFP4MOE_OK;
}

// ---- activation quantize-dequantize (reference layer) ----

void nvfp4moe_qdq_row(const float *x, int64_t n, float gs, float *out) {
    uint8_t q[16];
    for (int64_t b = 0; b < n / 16; b++) {
        float s = nvfp4moe_e4m3_decode(quantize_block(x + b * 16, gs, q));
        /* x_hat = q * (s / gs): vLLM dequantizes with the block scale over the global scale. */
        float step = s / gs;
        for (int i = 0; i < 16; i++) out[b * 16 + i] = nvfp4moe_e2m1_decode(q[i]) * step;
    }
}

/* OCP MX: a shared power-of-two scale 2^(floor(log2(amax)) - 8) per 32 elements (8 = the largest
 * E4M3 exponent), elements rounded to E4M3 with saturation. A zero block stays zero. */
void nvfp4moe_mxfp8_qdq_row(const float *x, int64_t n, float *out) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            float a = fabsf(xb[i]);
            if (a > amax || isnan(a)) amax = a;
        }
        if (amax == 0.0f || !isfinite(amax)) {
            for (int i = 0; i < 32; i++) out[b * 32 + i] = amax == 0.0f ? 0.0f * xb[i] : NAN;
            continue;
        }
        int e2;
        frexpf(amax, &e2);                               /* amax in [2^(e2-1), 2^e2) */
        int shared = e2 - 1 - 8;
        if (shared < -127) shared = -127;                /* E8M0 range */
        if (shared > 127) shared = 127;
        for (int i = 0; i < 32; i++) {
            float v = nvfp4moe_e4m3_decode(nvfp4moe_e4m3_encode(ldexpf(xb[i], -shared)));
            out[b * 32 + i] = ldexpf(v, shared);
        }
    }
}
