/*
 * nvfp4.c - the NVFP4 format: E2M1 and E4M3 codecs, the block quantizers by name (vLLM's Python
 * reference, vLLM's Triton kernel, ModelOpt's export), the dequantizer, the 128x4 scale swizzle,
 * and the activation quantize-dequantize helpers the reference layers use (NVFP4 and MXFP8).
 *
 * Each quantizer is plain float32 code in the order its source evaluates it, so that results are
 * bit-exact with it, ties included:
 *   vLLM        vllm/model_executor/layers/quantization/utils/nvfp4_emulation_utils.py
 *               (ref_nvfp4_quant, ref_nvfp4_quant_dequant, _nvfp4_quant_dequant_kernel)
 *   ModelOpt    modelopt/torch/quantization/qtensor/nvfp4_tensor.py (NVFP4QTensor.quantize)
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

// ---- block quantizers ----

/* clamp that keeps NaN (fminf/fmaxf would turn a NaN into a bound), as torch.clamp does. */
static float clamp_keep_nan(float x, float lo, float hi) { return x < lo ? lo : x > hi ? hi : x; }

/* FLOAT4_E2M1_MAX_RECIPROCAL: the Python float 1/6, which torch and Triton multiply with as float32. */
#define INV6_F32 ((float)(1.0 / 6.0))

/* |x| max over a block; a NaN propagates and stays, as torch.max does (Triton's tl.max drops it:
 * the two differ on blocks holding a NaN only). */
static float block_amax(const float *x) {
    float amax = 0.0f;
    for (int i = 0; i < 16; i++) {
        float a = fabsf(x[i]);
        if (a > amax || isnan(a)) amax = a;
    }
    return amax;
}

/* torch's float32 -> float8_e4m3fn conversion (c10 fp8e4m3fn_from_fp32_value): RNE without
 * saturation: above 464 it reaches the NaN code. ModelOpt converts its block scales with it. */
static uint8_t torch_e4m3(float x) {
    if (fabsf(x) > 464.0f) return (uint8_t)((signbit(x) ? 0x80 : 0x00) | 0x7F);
    return nvfp4moe_e4m3_encode(x);
}

/* ModelOpt's _cast_fp4: searchsorted over the thresholds (NaN sorts last: code 7), ties to even,
 * sign bit from x < 0 (so -0.0 encodes as +0). */
static uint8_t modelopt_e2m1(float x) {
    if (isnan(x)) return 7;
    uint8_t m = e2m1_encode(fabsf(x));
    return (uint8_t)((x < 0.0f ? 0x8 : 0x0) | m);
}

/* Quantizes one block of 16 with quantizer q and tensor scale ts: returns the scale code, writes
 * the 16 E2M1 codes and, when step is not NULL, the dequantization step (x_hat = e2m1 * step) in
 * the source's form: s / gs for vLLM's quantizers, sf * scale_2 for ModelOpt's. rcp_ts (VLLM_TRITON
 * only, else NULL): divide as the GPU's div.full.f32 does (nvfp4moe_qdq_row_triton). */
static uint8_t quantize_block(nvfp4moe_quantizer q, const float *x, float ts, const float *rcp_ts, uint8_t *codes,
                              float *step) {
    const float amax = block_amax(x);
    if (q == NVFP4MOE_QUANTIZER_MODELOPT) {
        const float six_s2 = 6.0f * ts;
        float d = amax / six_s2;
        if (d == 0.0f) d = 1.0f;
        const uint8_t sf = torch_e4m3(d);
        const float denom = nvfp4moe_e4m3_decode(sf) * ts;
        for (int i = 0; i < 16; i++) codes[i] = modelopt_e2m1(x[i] / denom);
        if (step) *step = denom;
        return sf;
    }
    /* vLLM: s = gs * (amax * (1/6)), clamped to the E4M3 range and rounded to E4M3 */
    const uint8_t sf = nvfp4moe_e4m3_encode(clamp_keep_nan(ts * (amax * INV6_F32), -E4M3_MAX, E4M3_MAX));
    const float s = nvfp4moe_e4m3_decode(sf);
    float inv;
    if (q == NVFP4MOE_QUANTIZER_VLLM_TRITON) {
        /* output_scale = where(scale == 0, 0, global_scale / scale); div.full.f32 multiplies by the
         * reciprocal of s, which is the correctly rounded one for every E4M3 value */
        inv = s == 0.0f ? 0.0f : rcp_ts ? ts * (1.0f / s) : ts / s;
    } else {
        /* output_scale = get_reciprocal(scale * get_reciprocal(global_scale)), where
         * get_reciprocal(t) = 1 / (t + (t == 0) * 1e8) on tensors */
        const float t = s * (1.0f / ts);
        inv = 1.0f / (t == 0.0f ? 1e8f : t);
    }
    for (int i = 0; i < 16; i++) codes[i] = e2m1_encode(clamp_keep_nan(x[i] * inv, -6.0f, 6.0f));
    if (step) *step = rcp_ts ? s * *rcp_ts : s / ts;
    return sf;
}

const char *nvfp4moe_quantizer_name(nvfp4moe_quantizer q) {
    switch (q) {
    case NVFP4MOE_QUANTIZER_VLLM_REF: return "vllm_ref";
    case NVFP4MOE_QUANTIZER_VLLM_TRITON: return "vllm_triton";
    case NVFP4MOE_QUANTIZER_MODELOPT: return "modelopt";
    case NVFP4MOE_QUANTIZER_COUNT: break;
    }
    return "?";
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

nvfp4moe_status nvfp4moe_quantize_as(nvfp4moe_quantizer q, const float *x, int64_t rows, int64_t cols,
                                     float tensor_scale, uint8_t *packed, uint8_t *scales) {
    NVFP4MOE_RETURN_IF((int)q < 0 || q >= NVFP4MOE_QUANTIZER_COUNT, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "nvfp4moe_quantize_as: quantizer=%d is not a quantizer", (int)q);
    NVFP4MOE_TRY(check_matrix("nvfp4moe_quantize", x, "x", packed, "packed", scales, "scales", rows, cols));
    NVFP4MOE_RETURN_IF(!(isfinite(tensor_scale) && tensor_scale > 0.0f), NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "nvfp4moe_quantize: %s=%g must be finite and > 0",
                       q == NVFP4MOE_QUANTIZER_MODELOPT ? "scale_2" : "global_scale", (double)tensor_scale);
    uint8_t c[16];
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < cols / 16; b++) {
            scales[r * (cols / 16) + b] = quantize_block(q, x + r * cols + b * 16, tensor_scale, NULL, c, NULL);
            uint8_t *p = packed + r * (cols / 2) + b * 8;
            for (int i = 0; i < 8; i++) p[i] = (uint8_t)(c[2 * i] | (c[2 * i + 1] << 4));
        }
    }
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_quantize(const float *x, int64_t rows, int64_t cols, float global_scale,
                                  uint8_t *packed, uint8_t *scales) {
    return nvfp4moe_quantize_as(NVFP4MOE_QUANTIZER_VLLM_REF, x, rows, cols, global_scale, packed, scales);
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

static void qdq_row(nvfp4moe_quantizer q, const float *x, int64_t n, float ts, const float *rcp_ts,
                    nvfp4moe_dtype out_dt, float *out) {
    uint8_t c[16];
    float step;
    for (int64_t b = 0; b < n / 16; b++) {
        quantize_block(q, x + b * 16, ts, rcp_ts, c, &step);
        /* the dequantized block is a tensor of the input dtype (ref_nvfp4_quant_dequant's .to,
         * the Triton kernel's store); F32 keeps it as float32 computes it */
        for (int i = 0; i < 16; i++)
            out[b * 16 + i] = nvfp4moe_round_to_dtype(out_dt, nvfp4moe_e2m1_decode(c[i]) * step);
    }
}

void nvfp4moe_qdq_row_as(nvfp4moe_quantizer q, const float *x, int64_t n, float ts, nvfp4moe_dtype out_dt,
                         float *out) {
    qdq_row(q, x, n, ts, NULL, out_dt, out);
}

void nvfp4moe_qdq_row_triton(const float *x, int64_t n, float ts, const float *rcp_ts, nvfp4moe_dtype out_dt,
                             float *out) {
    qdq_row(NVFP4MOE_QUANTIZER_VLLM_TRITON, x, n, ts, rcp_ts, out_dt, out);
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
