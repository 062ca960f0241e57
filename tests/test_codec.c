/*
 * test_codec.c - the NVFP4 codec, bitwise: E2M1 and E4M3 encoders against brute-force nearest-value
 * encoders, ties, thresholds, saturation, subnormals, NaN/Inf, the block quantizer and its packing,
 * and the 128x4 scale swizzle against the reshape/permute definition. The quantizers' formulas are
 * pinned bit for bit against vLLM's and ModelOpt's code by tests/test_emulation.c.
 */
#include "harness.h"
#include "core/internal.h"

#include <float.h>

// ---- independent brute-force encoders ----

/* Nearest representable value; on a tie the code with the even mantissa bit wins. */
static uint8_t brute_e2m1(float x) {
    if (isnan(x)) return 0;
    uint8_t best = 0;
    double bestd = INFINITY;
    for (uint8_t c = 0; c < 16; c++) {
        if ((c & 8) != (signbit(x) ? 8 : 0)) continue;
        double d = fabs((double)nvfp4moe_e2m1_decode(c) - (double)x);
        if (d < bestd || (d == bestd && (c & 1) == 0)) {
            bestd = d;
            best = c;
        }
    }
    return best;
}

static uint8_t brute_e4m3(float x) {
    if (isnan(x)) return 0x7F;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (fabsf(x) >= 448.0f) return sign | 0x7E;
    uint8_t best = 0;
    double bestd = INFINITY;
    for (int c = 0; c < 0x7F; c++) {
        double d = fabs((double)nvfp4moe_e4m3_decode((uint8_t)c) - fabs((double)x));
        if (d < bestd || (d == bestd && (c & 1) == 0)) {
            bestd = d;
            best = (uint8_t)c;
        }
    }
    return sign | best;
}

static void test_e2m1(void) {
    T_CASE("e2m1 round trip");
    for (int c = 0; c < 16; c++)
        CHECK(nvfp4moe_e2m1_encode(nvfp4moe_e2m1_decode((uint8_t)c)) == c, "code 0x%x -> %g -> 0x%x", c,
              (double)nvfp4moe_e2m1_decode((uint8_t)c), nvfp4moe_e2m1_encode(nvfp4moe_e2m1_decode((uint8_t)c)));
    CHECK(nvfp4moe_e2m1_decode(0x17) == 6.0f && nvfp4moe_e2m1_decode(0xF9) == -0.5f, "decode uses low 4 bits");

    T_CASE("e2m1 ties to even");
    const float ties[][2] = {{0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5.0f, 6}};
    for (size_t i = 0; i < sizeof ties / sizeof ties[0]; i++) {
        CHECK(nvfp4moe_e2m1_encode(ties[i][0]) == (uint8_t)ties[i][1], "%g -> 0x%x want 0x%x", (double)ties[i][0],
              nvfp4moe_e2m1_encode(ties[i][0]), (unsigned)ties[i][1]);
        CHECK(nvfp4moe_e2m1_encode(-ties[i][0]) == (uint8_t)(8 + ties[i][1]), "%g", -(double)ties[i][0]);
    }

    T_CASE("e2m1 around every threshold");
    const float th[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    for (size_t i = 0; i < sizeof th / sizeof th[0]; i++) {
        float lo = nextafterf(th[i], 0.0f), hi = nextafterf(th[i], INFINITY);
        CHECK(nvfp4moe_e2m1_encode(lo) == (uint8_t)i && nvfp4moe_e2m1_encode(hi) == (uint8_t)(i + 1),
              "around %g: below 0x%x above 0x%x", (double)th[i], nvfp4moe_e2m1_encode(lo), nvfp4moe_e2m1_encode(hi));
    }

    T_CASE("e2m1 saturation, NaN, Inf, signed zero");
    CHECK(nvfp4moe_e2m1_encode(6.0f) == 7 && nvfp4moe_e2m1_encode(1e30f) == 7, "saturate +");
    CHECK(nvfp4moe_e2m1_encode(-7.0f) == 0xF, "saturate -");
    CHECK(nvfp4moe_e2m1_encode(INFINITY) == 7 && nvfp4moe_e2m1_encode(-INFINITY) == 0xF, "inf");
    CHECK(nvfp4moe_e2m1_encode(NAN) == 0, "nan -> +0");
    CHECK(nvfp4moe_e2m1_encode(-0.0f) == 8 && nvfp4moe_e2m1_encode(-0.1f) == 8, "negative zero keeps its sign");

    T_CASE("e2m1 vs brute force");
    uint64_t rng = 1;
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        float x = (float)((nvfp4moe_rand_uniform(&rng) - 0.5) * 16.0);
        if (i % 4 == 0) x = roundf(x * 4.0f) / 4.0f; /* many exact ties */
        if (nvfp4moe_e2m1_encode(x) != brute_e2m1(x) && bad++ < 5)
            fprintf(stderr, "  e2m1(%a) = 0x%x, brute 0x%x\n", (double)x, nvfp4moe_e2m1_encode(x), brute_e2m1(x));
    }
    CHECK(bad == 0, "%d mismatches", bad);
}

static void test_e4m3(void) {
    T_CASE("e4m3 all 256 codes round trip");
    for (int c = 0; c < 256; c++) {
        float v = nvfp4moe_e4m3_decode((uint8_t)c);
        if ((c & 0x7F) == 0x7F) {
            CHECK(isnan(v), "code 0x%02x should be NaN", c);
            continue;
        }
        CHECK(nvfp4moe_e4m3_encode(v) == c, "code 0x%02x -> %a -> 0x%02x", c, (double)v, nvfp4moe_e4m3_encode(v));
    }
    T_CASE("e4m3 known values");
    CHECK(nvfp4moe_e4m3_decode(0x7E) == 448.0f && nvfp4moe_e4m3_decode(0x08) == 0.015625f, "max, min normal");
    CHECK(nvfp4moe_e4m3_decode(0x01) == 0.001953125f && nvfp4moe_e4m3_decode(0x38) == 1.0f, "min subnormal, one");
    CHECK(nvfp4moe_e4m3_encode(17.0f) == 0x58 && nvfp4moe_e4m3_encode(19.0f) == 0x5A, "ties to even: 17->16, 19->20");

    T_CASE("e4m3 saturation, NaN, Inf");
    CHECK(nvfp4moe_e4m3_encode(448.0f) == 0x7E && nvfp4moe_e4m3_encode(449.0f) == 0x7E, "448, 449");
    CHECK(nvfp4moe_e4m3_encode(480.0f) == 0x7E && nvfp4moe_e4m3_encode(1e30f) == 0x7E, "saturate");
    CHECK(nvfp4moe_e4m3_encode(INFINITY) == 0x7E && nvfp4moe_e4m3_encode(-INFINITY) == 0xFE, "inf saturates");
    CHECK(nvfp4moe_e4m3_encode(NAN) == 0x7F && nvfp4moe_e4m3_encode(-NAN) == 0x7F, "nan -> 0x7F");

    T_CASE("e4m3 subnormals");
    const float step = 0.001953125f; /* 2^-9 */
    CHECK(nvfp4moe_e4m3_encode(step) == 0x01, "2^-9");
    CHECK(nvfp4moe_e4m3_encode(step / 2) == 0x00, "2^-10 ties to 0");
    CHECK(nvfp4moe_e4m3_encode(nextafterf(step / 2, 1.0f)) == 0x01, "just above 2^-10");
    CHECK(nvfp4moe_e4m3_encode(1.5f * step) == 0x02, "1.5 steps ties to 2");
    CHECK(nvfp4moe_e4m3_encode(7.5f * step) == 0x08, "7.5 steps rounds up to the min normal");
    CHECK(nvfp4moe_e4m3_encode(-3.0f * step) == 0x83, "negative subnormal");
    CHECK(nvfp4moe_e4m3_encode(1e-30f) == 0x00, "underflow to zero");

    T_CASE("e4m3 vs brute force");
    uint64_t rng = 2;
    int bad = 0;
    for (int i = 0; i < 100000; i++) {
        float x = (float)(ldexp(nvfp4moe_rand_uniform(&rng) * 2.0 - 1.0, (int)(nvfp4moe_rand_u64(&rng) % 24) - 12));
        if (i % 3 == 0) { /* a midpoint between two neighbouring codes */
            uint8_t c = (uint8_t)(nvfp4moe_rand_u64(&rng) % 0x7E);
            x = (nvfp4moe_e4m3_decode(c) + nvfp4moe_e4m3_decode((uint8_t)(c + 1))) / 2;
        }
        if (nvfp4moe_e4m3_encode(x) != brute_e4m3(x) && bad++ < 5)
            fprintf(stderr, "  e4m3(%a) = 0x%02x, brute 0x%02x\n", (double)x, nvfp4moe_e4m3_encode(x), brute_e4m3(x));
    }
    CHECK(bad == 0, "%d mismatches", bad);
}

static void test_quantize(void) {
    T_CASE("quantize one block by hand");
    /* amax 6, gs 1: s = e4m3(1) = 1.0, inv = 1: the codes are the values themselves. */
    float x[32] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.5f, -1, -1.5f, -2, -3, -4, -6, 0.3f};
    for (int i = 16; i < 32; i++) x[i] = 0.0f; /* second block all zero */
    uint8_t packed[16], scales[2];
    CHECK_OK(nvfp4moe_quantize(x, 1, 32, 1.0f, packed, scales));
    CHECK(scales[0] == 0x38, "block scale 0x%02x want 0x38 (1.0)", scales[0]);
    CHECK(scales[1] == 0x00, "zero block scale 0x%02x", scales[1]);
    const uint8_t want[8] = {0x10, 0x32, 0x54, 0x76, 0xA9, 0xCB, 0xED, 0x1F};
    check_bytes("packed block 0 (low nibble = even element)", packed, want, 8);
    uint8_t zeros[8] = {0};
    check_bytes("packed zero block", packed + 8, zeros, 8);

    T_CASE("quantize: scale rounding and global scale");
    /* amax = 5 with gs = 448*6/5: s = 448 exactly; x*inv maps 5 -> 6. */
    float y[16];
    for (int i = 0; i < 16; i++) y[i] = (float)i / 3.0f;
    float gs = 448.0f * 6.0f / 5.0f;
    CHECK_OK(nvfp4moe_quantize(y, 1, 16, gs, packed, scales));
    float s = nvfp4moe_e4m3_decode(scales[0]);
    /* vLLM's ref_nvfp4_quant: s = gs * (amax * (1/6)), inv = 1 / (s * (1/gs)) */
    CHECK(scales[0] == nvfp4moe_e4m3_encode(gs * (5.0f * (float)(1.0 / 6.0))), "scale code 0x%02x", scales[0]);
    for (int i = 0; i < 16; i++) {
        uint8_t code = (packed[i / 2] >> (4 * (i & 1))) & 0xF;
        float inv = 1.0f / (s * (1.0f / gs));
        CHECK(code == brute_e2m1(fminf(y[i] * inv, 6.0f)), "element %d code 0x%x", i, code);
    }

    T_CASE("quantize: NaN and Inf inputs");
    float z[16] = {1, 2, 3};
    z[5] = NAN;
    CHECK_OK(nvfp4moe_quantize(z, 1, 16, 1.0f, packed, scales));
    CHECK(scales[0] == 0x7F, "a NaN in the block makes its scale NaN (0x%02x)", scales[0]);
    z[5] = INFINITY;
    CHECK_OK(nvfp4moe_quantize(z, 1, 16, 1.0f, packed, scales));
    CHECK(scales[0] == 0x7E && (packed[2] >> 4) == 7, "Inf saturates: scale 0x%02x code 0x%x", scales[0], packed[2] >> 4);

    T_CASE("quantize_as: each quantizer's tensor scale, and bad quantizers");
    CHECK_ERR(nvfp4moe_quantize_as(NVFP4MOE_QUANTIZER_MODELOPT, x, 1, 16, -1.0f, packed, scales),
              NVFP4MOE_ERR_INVALID_ARGUMENT, "scale_2=-1");
    CHECK_ERR(nvfp4moe_quantize_as(NVFP4MOE_QUANTIZER_VLLM_TRITON, x, 1, 16, INFINITY, packed, scales),
              NVFP4MOE_ERR_INVALID_ARGUMENT, "global_scale=inf");
    CHECK_ERR(nvfp4moe_quantize_as(NVFP4MOE_QUANTIZER_COUNT, x, 1, 16, 1.0f, packed, scales),
              NVFP4MOE_ERR_INVALID_ARGUMENT, "quantizer=3");
    CHECK(strcmp(nvfp4moe_quantizer_name(NVFP4MOE_QUANTIZER_VLLM_TRITON), "vllm_triton") == 0 &&
              strcmp(nvfp4moe_quantizer_name((nvfp4moe_quantizer)7), "?") == 0, "names");

    T_CASE("quantize/dequantize errors");
    float out[32];
    CHECK_ERR(nvfp4moe_quantize(x, 1, 17, 1.0f, packed, scales), NVFP4MOE_ERR_SHAPE, "cols=17");
    CHECK_ERR(nvfp4moe_quantize(x, 1, 0, 1.0f, packed, scales), NVFP4MOE_ERR_SHAPE, "cols=0");
    CHECK_ERR(nvfp4moe_quantize(x, -1, 16, 1.0f, packed, scales), NVFP4MOE_ERR_SHAPE, "rows=-1");
    CHECK_ERR(nvfp4moe_quantize(NULL, 1, 16, 1.0f, packed, scales), NVFP4MOE_ERR_INVALID_ARGUMENT, "x is NULL");
    CHECK_ERR(nvfp4moe_quantize(x, 1, 16, 0.0f, packed, scales), NVFP4MOE_ERR_INVALID_ARGUMENT, "global_scale=0");
    CHECK_ERR(nvfp4moe_quantize(x, 1, 16, NAN, packed, scales), NVFP4MOE_ERR_INVALID_ARGUMENT, "global_scale");
    CHECK_ERR(nvfp4moe_dequantize(packed, scales, 1, 24, 1.0f, out), NVFP4MOE_ERR_SHAPE, "cols=24");
    CHECK_ERR(nvfp4moe_dequantize(packed, NULL, 1, 16, 1.0f, out), NVFP4MOE_ERR_INVALID_ARGUMENT, "scales is NULL");

    T_CASE("dequantize inverts the codes");
    uint64_t rng = 3;
    enum { R = 7, C = 64 };
    float big[R * C], back[R * C];
    uint8_t p2[R * C / 2], s2[R * C / 16];
    for (int i = 0; i < R * C; i++) big[i] = (float)nvfp4moe_rand_normal(&rng);
    float g = 448.0f * 6.0f / 4.0f;
    CHECK_OK(nvfp4moe_quantize(big, R, C, g, p2, s2));
    CHECK_OK(nvfp4moe_dequantize(p2, s2, R, C, 1.0f / g, back));
    int bad = 0;
    for (int i = 0; i < R * C; i++) {
        /* The dequantized value is on the block's grid and is the grid point nearest to x. */
        float sc = nvfp4moe_e4m3_decode(s2[i / 16]) * (1.0f / g);
        float near = nvfp4moe_e2m1_decode(brute_e2m1(fminf(fmaxf(big[i] * (1.0f / (nvfp4moe_e4m3_decode(s2[i / 16]) * (1.0f / g))), -6), 6))) * nvfp4moe_e4m3_decode(s2[i / 16]) * (1.0f / g);
        if (back[i] != near && bad++ < 5) fprintf(stderr, "  [%d] %g -> %g want %g (step %g)\n", i, (double)big[i], (double)back[i], (double)near, (double)sc);
    }
    CHECK(bad == 0, "%d elements off the nearest grid point", bad);
}

/* The swizzle's definition (vLLM swizzle_blockscale): pad to [Mp, Kp], reshape to
 * [Mp/128, 4, 32, Kp/4, 4], permute (0, 3, 2, 1, 4), flatten. Computed here by walking the output
 * in order, independent of the library's offset formula. */
static void swizzle_by_definition(const uint8_t *lin, int64_t rows, int64_t kb, uint8_t *out) {
    int64_t mp = (rows + 127) / 128 * 128, kp = (kb + 3) / 4 * 4, o = 0;
    for (int64_t a = 0; a < mp / 128; a++)
        for (int64_t d = 0; d < kp / 4; d++)
            for (int64_t c = 0; c < 32; c++)
                for (int64_t b = 0; b < 4; b++)
                    for (int64_t e = 0; e < 4; e++) {
                        int64_t m = a * 128 + b * 32 + c, k = d * 4 + e;
                        out[o++] = (m < rows && k < kb) ? lin[m * kb + k] : 0;
                    }
}

static void test_swizzle(void) {
    const int64_t rows_list[] = {1, 31, 127, 128, 129, 256, 300};
    const int64_t kb_list[] = {1, 3, 4, 5, 8, 9};
    uint64_t rng = 4;
    for (size_t i = 0; i < sizeof rows_list / sizeof rows_list[0]; i++) {
        for (size_t j = 0; j < sizeof kb_list / sizeof kb_list[0]; j++) {
            int64_t r = rows_list[i], kb = kb_list[j];
            char name[64];
            snprintf(name, sizeof name, "swizzle rows=%lld kblocks=%lld", (long long)r, (long long)kb);
            T_CASE(name);
            size_t n = nvfp4moe_swizzled_scales_size(r, kb);
            uint8_t *lin = malloc((size_t)(r * kb)), *sw = malloc(n), *def = malloc(n), *back = malloc((size_t)(r * kb));
            for (int64_t q = 0; q < r * kb; q++) lin[q] = (uint8_t)(1 + nvfp4moe_rand_u64(&rng) % 255);
            memset(sw, 0xAB, n);
            CHECK_OK(nvfp4moe_swizzle_scales(lin, r, kb, sw));
            swizzle_by_definition(lin, r, kb, def);
            check_bytes("swizzled vs definition (padding zero)", sw, def, n);
            CHECK_OK(nvfp4moe_unswizzle_scales(sw, r, kb, back));
            check_bytes("unswizzle(swizzle(x)) == x", back, lin, (size_t)(r * kb));
            free(lin); free(sw); free(def); free(back);
        }
    }
    T_CASE("swizzle errors");
    uint8_t a[4], b[512];
    CHECK_ERR(nvfp4moe_swizzle_scales(a, 0, 4, b), NVFP4MOE_ERR_SHAPE, "rows=0");
    CHECK_ERR(nvfp4moe_unswizzle_scales(a, 1, -2, b), NVFP4MOE_ERR_SHAPE, "kblocks=-2");
    CHECK_ERR(nvfp4moe_swizzle_scales(NULL, 1, 1, b), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
}

static void test_half(void) {
    T_CASE("bf16 / fp16");
    CHECK(nvfp4moe_bf16_from_float(1.0f) == 0x3F80 && nvfp4moe_bf16_to_float(0xC000) == -2.0f, "bf16 basics");
    CHECK(nvfp4moe_bf16_from_float(1.00390625f) == 0x3F80, "bf16 tie to even (down)");
    CHECK(nvfp4moe_bf16_from_float(1.01171875f) == 0x3F82, "bf16 tie to even (up)");
    CHECK(isnan(nvfp4moe_bf16_to_float(nvfp4moe_bf16_from_float(NAN))), "bf16 NaN");
    CHECK(nvfp4moe_fp16_from_float(1.0f) == 0x3C00 && nvfp4moe_fp16_from_float(65504.0f) == 0x7BFF, "fp16 basics");
    CHECK(nvfp4moe_fp16_from_float(1e6f) == 0x7C00 && nvfp4moe_fp16_from_float(-1e6f) == 0xFC00, "fp16 overflow");
    CHECK(nvfp4moe_fp16_from_float(5.9604645e-8f) == 0x0001, "fp16 min subnormal");
    CHECK(nvfp4moe_fp16_from_float(2.9802322e-8f) == 0x0000, "fp16 half the min subnormal ties to 0");
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if (((h >> 10) & 0x1F) == 0x1F && (h & 0x3FF)) continue; /* NaNs */
        if (nvfp4moe_fp16_from_float(nvfp4moe_fp16_to_float((uint16_t)h)) != h && bad++ < 5)
            fprintf(stderr, "  fp16 0x%04x does not round trip\n", h);
    }
    CHECK(bad == 0, "%d fp16 codes fail to round trip", bad);
}

/* The row converters the host backends use against the per-value ones, bit for bit: every bf16 /
 * fp16 code, and floats of every sign and exponent with low bits that round down, up, to even and
 * as NaN payloads. */
static void test_rows(void) {
    T_CASE("dtype rows");
    static uint16_t codes[0x10000];
    static float got[0x10000], x[0x10000];
    for (uint32_t h = 0; h < 0x10000; h++) codes[h] = (uint16_t)h;
    int bad = 0;
    for (int dt = NVFP4MOE_DTYPE_BF16; dt <= NVFP4MOE_DTYPE_FP16; dt++) {
        nvfp4moe_to_float((nvfp4moe_dtype)dt, codes, 0x10000, got);
        for (uint32_t h = 0; h < 0x10000; h++) {
            const float want = dt == NVFP4MOE_DTYPE_BF16 ? nvfp4moe_bf16_to_float((uint16_t)h) : nvfp4moe_fp16_to_float((uint16_t)h);
            bad += memcmp(&want, &got[h], 4) != 0;
        }
    }
    static const uint32_t low[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1000, 0x0FFF, 0x1001, 0x2000, 0x3000};
    for (size_t l = 0; l < sizeof low / sizeof low[0]; l++) {
        for (uint32_t hi = 0; hi < 0x10000; hi++) {
            const uint32_t u = hi << 16 | low[l];
            memcpy(&x[hi], &u, 4);
        }
        for (int dt = 0; dt <= NVFP4MOE_DTYPE_F32; dt++) {
            memcpy(got, x, sizeof x);
            nvfp4moe_round_row_to_dtype((nvfp4moe_dtype)dt, got, 0x10000);
            for (uint32_t hi = 0; hi < 0x10000; hi++) {
                const float want = nvfp4moe_round_to_dtype((nvfp4moe_dtype)dt, x[hi]);
                if (memcmp(&want, &got[hi], 4) != 0 && bad++ < 5)
                    fprintf(stderr, "  dtype %d: 0x%08x rounds to %a, want %a\n", dt, hi << 16 | low[l], (double)got[hi],
                            (double)want);
            }
        }
    }
    CHECK(bad == 0, "%d values differ", bad);
}

int main(void) {
    test_rows();
    test_e2m1();
    test_e4m3();
    test_quantize();
    test_swizzle();
    test_half();
    return t_finish("test_codec");
}
