/*
 * cpu_gemm.c - the CPU backend's weight repacking, activation quantization and GEMM kernels, in
 * portable C and in AVX2 and AVX-512 (compiled with target attributes, chosen at run time from
 * the CPU's features). The layout and the arithmetic are described in cpu.h; every variant
 * computes the same numbers: the integer kernels exactly, the float kernels in one fixed order.
 *
 * The kernels take a tile of 16 weight rows and up to 8 activation rows: the 16 rows are the 16
 * 32-bit lanes of a 512-bit register (two 256-bit halves in AVX2), so a block's weights are decoded
 * once (a byte shuffle turns each 4-bit code into 2w + 12, a small unsigned integer) and used for
 * every activation row, and each lane ends a block holding its row's D without any horizontal sum.
 */
#include "backends/cpu.h"
#include "nvfp4moe.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define CPU_X86 1
#include <immintrin.h>
#endif

/* 2w + 12 for each E2M1 code w: the weights as unsigned bytes (0..24), as vpdpbusd wants them. */
static const uint8_t k_w_u8[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
/* Twice each E2M1 value. */
static const int8_t k_x_s8[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
/* The E2M1 values (code 8 is -0). */
static const float k_e2m1_f[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// ---- repacking ----

void nvfp4moe_cpu_repack(const uint8_t *q, const uint8_t *sf, int64_t cols, int64_t t0, int64_t t1, uint8_t *dst) {
    const int64_t kb = cols / 16, nsb = nvfp4moe_cpu_superblocks(cols);
    const size_t tb = nvfp4moe_cpu_tile_bytes(cols);
    for (int64_t t = t0; t < t1; t++) {
        uint8_t *o = dst + (size_t)t * tb;
        if (kb % 4) memset(o + (nsb - 1) * NVFP4MOE_CPU_SB_BYTES, 0, NVFP4MOE_CPU_SB_BYTES);   /* padding */
        for (int r = 0; r < NVFP4MOE_CPU_TILE_ROWS; r++) {
            const int64_t row = t * NVFP4MOE_CPU_TILE_ROWS + r;
            const uint8_t *qr = q + row * (cols / 2), *sr = sf + row * kb;
            for (int64_t b = 0; b < kb; b++) {
                uint8_t *sb = o + (b / 4) * NVFP4MOE_CPU_SB_BYTES;
                const int j = (int)(b % 4);
                const uint8_t sc = sr[b] & 0x7F, flip = (sr[b] & 0x80) ? 0x88 : 0x00;
                const int e = sc >> 3, m = sc & 7;
                sb[512 + 16 * j + r] = (uint8_t)(e == 0 ? m : (8 + m) | (e - 1) << 4);
                /* Source byte i holds elements 2i (low nibble) and 2i + 1; v_h's byte 4r + i wants
                 * elements 8h + i and 8h + 4 + i. */
                for (int h = 0; h < 2; h++) {
                    const uint8_t *in = qr + 8 * b + 4 * h;
                    const uint8_t b0 = in[0] ^ flip, b1 = in[1] ^ flip, b2 = in[2] ^ flip, b3 = in[3] ^ flip;
                    uint8_t *out = sb + 128 * j + 64 * h + 4 * r;
                    out[0] = (uint8_t)((b0 & 0x0F) | (b2 << 4));
                    out[1] = (uint8_t)((b0 >> 4) | (b2 & 0xF0));
                    out[2] = (uint8_t)((b1 & 0x0F) | (b3 << 4));
                    out[3] = (uint8_t)((b1 >> 4) | (b3 & 0xF0));
                }
            }
        }
    }
}

// ---- activation rows ----

/* The global scales without a finite positive step: gs = +Inf dequantizes every finite block to
 * zeros (step s / gs = 0) and gives a block with amax 0 or NaN the NaN scale; gs = 0 (a row amax of
 * Inf) makes every step NaN (gs is never negative or NaN here: the W4A4 scale is 1 / a positive
 * input scale, the per-token one 2688 / amax). Returns true when gs is one of those, having zeroed
 * the blocks and set *nan as the codec's quantizer would. */
static bool quantize_special(const float *x, int64_t nb, float gs, nvfp4moe_cpu_qblock *blk, bool *nan) {
    if (gs > 0.0f && isfinite(gs)) return false;
    memset(blk, 0, sizeof(nvfp4moe_cpu_qblock) * (size_t)nb);
    bool n = !(gs > 0.0f);
    for (int64_t b = 0; b < nb && !n; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 16; i++) {
            float a = fabsf(x[16 * b + i]);
            if (a > amax || isnan(a)) amax = a;
        }
        n = !(amax > 0.0f);
    }
    *nan = n;
    return true;
}

/* A block's scale code into its record; returns whether it is NaN. */
static bool set_block_scale(nvfp4moe_cpu_qblock *o, uint8_t sc) {
    const int64_t v = nvfp4moe_cpu_e4m3_int(sc);
    o->sx = (sc & 0x80) ? -v : v;
    return (sc & 0x7F) == 0x7F;
}

static bool quantize_blocks_portable(const float *x, int64_t nb, float gs, nvfp4moe_cpu_qblock *blk, uint8_t *scratch) {
    bool nan = false;
    if (quantize_special(x, nb, gs, blk, &nan)) return nan;
    uint8_t *packed = scratch, *scales = scratch + 8 * nb;
    /* the quantizer the reference's activations go through (vLLM EMULATION's Triton kernel); it
     * cannot fail: 16 * nb columns, gs finite and > 0 */
    nvfp4moe_quantize_as(NVFP4MOE_QUANTIZER_VLLM_TRITON, x, 1, 16 * nb, gs, packed, scales);
    for (int64_t b = 0; b < nb; b++) {
        nvfp4moe_cpu_qblock *o = &blk[b];
        nan |= set_block_scale(o, scales[b]);
        int32_t sum = 0;
        for (int i = 0; i < 8; i++) {
            const uint8_t byte = packed[8 * b + i];
            o->q[2 * i] = k_x_s8[byte & 0xF];
            o->q[2 * i + 1] = k_x_s8[byte >> 4];
            sum += o->q[2 * i] + o->q[2 * i + 1];
        }
        o->corr = -12 * sum;
        o->pad = 0;
    }
    return nan;
}

void nvfp4moe_cpu_quantize_row(const nvfp4moe_cpu_kernels *k, const float *x, int64_t cols, float gs,
                               nvfp4moe_cpu_qrow *r, uint8_t *scratch) {
    const int64_t nb = cols / 16, padded = nvfp4moe_cpu_superblocks(cols) * 4;
    memset(r->blk + nb, 0, sizeof(nvfp4moe_cpu_qblock) * (size_t)(padded - nb));
    r->gs = gs;
    atomic_store_explicit(&r->nan, k->quantize_blocks(x, nb, gs, r->blk, scratch), memory_order_relaxed);
}

// ---- portable C ----

/* Row r's 16 codes of block j in a superblock, in column order. */
static void tile_codes(const uint8_t *sb, int j, int r, uint8_t codes[16]) {
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            const uint8_t byte = sb[128 * j + 64 * h + 4 * r + i];
            codes[8 * h + i] = byte & 0xF;
            codes[8 * h + 4 + i] = byte >> 4;
        }
}

static int32_t tile_scale(const uint8_t *sb, int j, int r) {
    const uint8_t s = sb[512 + 16 * j + r];
    return (int32_t)(s & 0xF) << (s >> 4);
}

static void gemm_q_portable(const uint8_t *tile, int64_t nsb, const nvfp4moe_cpu_qblock *const *rows, int nt,
                            int64_t *out, nvfp4moe_cpu_stream *pf) {
    memset(out, 0, sizeof(int64_t) * (size_t)nt * NVFP4MOE_CPU_TILE_ROWS);
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *sb = tile + s * NVFP4MOE_CPU_SB_BYTES;
        nvfp4moe_cpu_stream_advance(pf, NVFP4MOE_CPU_SB_BYTES);
        for (int j = 0; j < 4; j++) {
            const int64_t b = 4 * s + j;
            for (int r = 0; r < NVFP4MOE_CPU_TILE_ROWS; r++) {
                uint8_t codes[16];
                tile_codes(sb, j, r, codes);
                const int32_t sw = tile_scale(sb, j, r);
                for (int t = 0; t < nt; t++) {
                    const nvfp4moe_cpu_qblock *x = &rows[t][b];
                    int32_t d = x->corr;
                    for (int k = 0; k < 16; k++) d += k_w_u8[codes[k]] * x->q[k];
                    out[t * NVFP4MOE_CPU_TILE_ROWS + r] += (int64_t)(d * sw) * x->sx;
                }
            }
        }
    }
}

static void gemm_f_portable(const uint8_t *tile, int64_t nsb, const float *const *rows, int nt, float *out,
                            nvfp4moe_cpu_stream *pf) {
    memset(out, 0, sizeof(float) * (size_t)nt * NVFP4MOE_CPU_TILE_ROWS);
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *sb = tile + s * NVFP4MOE_CPU_SB_BYTES;
        nvfp4moe_cpu_stream_advance(pf, NVFP4MOE_CPU_SB_BYTES);
        for (int j = 0; j < 4; j++) {
            const int64_t b = 4 * s + j;
            for (int r = 0; r < NVFP4MOE_CPU_TILE_ROWS; r++) {
                uint8_t codes[16];
                tile_codes(sb, j, r, codes);
                const float sw = (float)tile_scale(sb, j, r) * (1.0f / 512.0f);
                for (int t = 0; t < nt; t++) {
                    const float *x = rows[t] + 16 * b;
                    float p[4];
                    for (int i = 0; i < 4; i++) p[i] = k_e2m1_f[codes[i]] * x[i];
                    for (int g = 1; g < 4; g++)
                        for (int i = 0; i < 4; i++) p[i] = fmaf(k_e2m1_f[codes[4 * g + i]], x[4 * g + i], p[i]);
                    const float bs = (p[0] + p[1]) + (p[2] + p[3]);
                    float *o = &out[t * NVFP4MOE_CPU_TILE_ROWS + r];
                    *o = fmaf(bs, sw, *o);
                }
            }
        }
    }
}

static uint64_t read_portable(const uint8_t *p, size_t n) {
    uint64_t a[8] = {0};
    for (size_t i = 0; i < n; i += 64)
        for (int j = 0; j < 8; j++) {
            uint64_t v;
            memcpy(&v, p + i + 8 * j, 8);
            a[j] += v;
        }
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

static const nvfp4moe_cpu_kernels k_portable = {NVFP4MOE_CPU_PORTABLE, gemm_q_portable, gemm_f_portable, read_portable,
                                                 quantize_blocks_portable};

#ifdef CPU_X86

static inline int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Each variant's body is an always-inline function of a constant row count NT, instantiated by a
 * switch and fully unrolled over the rows, so that the accumulators live in registers. */
#define NT_SWITCH(body, ...)                                                                       \
    switch (nt) {                                                                                  \
    case 1: body(__VA_ARGS__, 1); break;                                                           \
    case 2: body(__VA_ARGS__, 2); break;                                                           \
    case 3: body(__VA_ARGS__, 3); break;                                                           \
    case 4: body(__VA_ARGS__, 4); break;                                                           \
    case 5: body(__VA_ARGS__, 5); break;                                                           \
    case 6: body(__VA_ARGS__, 6); break;                                                           \
    case 7: body(__VA_ARGS__, 7); break;                                                           \
    default: body(__VA_ARGS__, 8); break;                                                          \
    }
#define NT_SWITCH4(body, ...)                                                                      \
    switch (nt) {                                                                                  \
    case 1: body(__VA_ARGS__, 1); break;                                                           \
    case 2: body(__VA_ARGS__, 2); break;                                                           \
    case 3: body(__VA_ARGS__, 3); break;                                                           \
    default: body(__VA_ARGS__, 4); break;                                                          \
    }
#define UNROLL _Pragma("GCC unroll 8")

/* The float kernels keep 16 decoded weight vectors live: 4 activation rows per pass at most. */
#define F_PASSES(body)                                                                             \
    for (int t0 = 0; t0 < nt; t0 += 4) {                                                           \
        const int n = nt - t0 < 4 ? nt - t0 : 4;                                                   \
        body(tile, nsb, rows + t0, n, out + t0 * NVFP4MOE_CPU_TILE_ROWS, t0 == 0 ? pf : NULL);     \
    }

// ---- AVX2 ----

#define AVX2 __attribute__((target("avx2,fma")))
#define AVX2_INLINE static inline __attribute__((always_inline)) AVX2

/* Block j's scales of rows 8h .. 8h + 7 of a superblock as E4M3 * 2^9 integers: m << sh. */
AVX2_INLINE __m256i scales_avx2(const uint8_t *sb, int j, int h) {
    const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sb + 512 + 16 * j + 8 * h)));
    return _mm256_sllv_epi32(_mm256_and_si256(sc, _mm256_set1_epi32(0x0F)), _mm256_srli_epi32(sc, 4));
}

AVX2_INLINE void q_avx2_body(const uint8_t *tile, int64_t nsb, const nvfp4moe_cpu_qblock *const *rows, int64_t *out,
                             nvfp4moe_cpu_stream *pf, const int NT) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)k_w_u8));
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {   /* rows 8h .. 8h + 7 */
        __m256i ae[NVFP4MOE_CPU_MAX_NT], ao[NVFP4MOE_CPU_MAX_NT];
        UNROLL for (int t = 0; t < NT; t++) ae[t] = ao[t] = _mm256_setzero_si256();
        for (int64_t s = 0; s < nsb; s++) {
            const uint8_t *sb = tile + s * NVFP4MOE_CPU_SB_BYTES;
            if (h == 0) nvfp4moe_cpu_stream_advance(pf, NVFP4MOE_CPU_SB_BYTES);
            for (int j = 0; j < 4; j++) {
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(sb + 128 * j + 32 * h));
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(sb + 128 * j + 64 + 32 * h));
                const __m256i w0 = _mm256_shuffle_epi8(lut, _mm256_and_si256(v0, m4));
                const __m256i w1 = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4));
                const __m256i w2 = _mm256_shuffle_epi8(lut, _mm256_and_si256(v1, m4));
                const __m256i w3 = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4));
                const __m256i sw = scales_avx2(sb, j, h);
                const int64_t b = 4 * s + j;
                UNROLL for (int t = 0; t < NT; t++) {
                    const nvfp4moe_cpu_qblock *x = &rows[t][b];
                    __m256i d = _mm256_set1_epi32(x->corr);
                    d = _mm256_add_epi32(d, _mm256_madd_epi16(_mm256_maddubs_epi16(w0, _mm256_set1_epi32(load_i32(x->q))), ones));
                    d = _mm256_add_epi32(d, _mm256_madd_epi16(_mm256_maddubs_epi16(w1, _mm256_set1_epi32(load_i32(x->q + 4))), ones));
                    d = _mm256_add_epi32(d, _mm256_madd_epi16(_mm256_maddubs_epi16(w2, _mm256_set1_epi32(load_i32(x->q + 8))), ones));
                    d = _mm256_add_epi32(d, _mm256_madd_epi16(_mm256_maddubs_epi16(w3, _mm256_set1_epi32(load_i32(x->q + 12))), ones));
                    const __m256i p = _mm256_mullo_epi32(d, sw);
                    const __m256i sx = _mm256_set1_epi64x(x->sx);
                    ae[t] = _mm256_add_epi64(ae[t], _mm256_mul_epi32(p, sx));
                    ao[t] = _mm256_add_epi64(ao[t], _mm256_mul_epi32(_mm256_srli_epi64(p, 32), sx));
                }
            }
        }
        UNROLL for (int t = 0; t < NT; t++) {
            int64_t e[4], o[4];
            _mm256_storeu_si256((__m256i *)e, ae[t]);
            _mm256_storeu_si256((__m256i *)o, ao[t]);
            for (int i = 0; i < 4; i++) {
                out[t * NVFP4MOE_CPU_TILE_ROWS + 8 * h + 2 * i] = e[i];
                out[t * NVFP4MOE_CPU_TILE_ROWS + 8 * h + 2 * i + 1] = o[i];
            }
        }
    }
}

AVX2 static void gemm_q_avx2(const uint8_t *tile, int64_t nsb, const nvfp4moe_cpu_qblock *const *rows, int nt,
                             int64_t *out, nvfp4moe_cpu_stream *pf) {
    NT_SWITCH(q_avx2_body, tile, nsb, rows, out, pf)
}

/* The E2M1 value of the code in bits 0..3 of each lane (AVX2 has 8-entry permutes: the
 * magnitude from bits 0..2, the sign from bit 3). */
AVX2_INLINE __m256 e2m1_avx2(__m256i idx, __m256 mag) {
    const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(idx, 28), _mm256_set1_epi32((int)0x80000000u));
    return _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, idx), _mm256_castsi256_ps(sign));
}

AVX2_INLINE void f_avx2_body(const uint8_t *tile, int64_t nsb, const float *const *rows, float *out,
                             nvfp4moe_cpu_stream *pf, const int NT) {
    const __m256 mag = _mm256_loadu_ps(k_e2m1_f);
    for (int h = 0; h < 2; h++) {
        __m256 acc[4];
        UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
        for (int64_t s = 0; s < nsb; s++) {
            const uint8_t *sb = tile + s * NVFP4MOE_CPU_SB_BYTES;
            if (h == 0) nvfp4moe_cpu_stream_advance(pf, NVFP4MOE_CPU_SB_BYTES);
            for (int j = 0; j < 4; j++) {
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(sb + 128 * j + 32 * h));
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(sb + 128 * j + 64 + 32 * h));
                const __m256 sw = _mm256_mul_ps(_mm256_cvtepi32_ps(scales_avx2(sb, j, h)), _mm256_set1_ps(1.0f / 512.0f));
                const int64_t b = 4 * s + j;
                __m256 p[4][4];
                UNROLL for (int g = 0; g < 4; g++) {
                    const __m256i v = g < 2 ? v0 : v1;
                    UNROLL for (int i = 0; i < 4; i++) {
                        const __m256 w = e2m1_avx2(_mm256_srli_epi32(v, 8 * i + 4 * (g & 1)), mag);
                        UNROLL for (int t = 0; t < NT; t++) {
                            const __m256 x = _mm256_set1_ps(rows[t][16 * b + 4 * g + i]);
                            p[t][i] = g == 0 ? _mm256_mul_ps(w, x) : _mm256_fmadd_ps(w, x, p[t][i]);
                        }
                    }
                }
                UNROLL for (int t = 0; t < NT; t++) {
                    const __m256 bs = _mm256_add_ps(_mm256_add_ps(p[t][0], p[t][1]), _mm256_add_ps(p[t][2], p[t][3]));
                    acc[t] = _mm256_fmadd_ps(bs, sw, acc[t]);
                }
            }
        }
        UNROLL for (int t = 0; t < NT; t++) _mm256_storeu_ps(out + t * NVFP4MOE_CPU_TILE_ROWS + 8 * h, acc[t]);
    }
}

AVX2 static void f_avx2(const uint8_t *tile, int64_t nsb, const float *const *rows, int nt, float *out,
                        nvfp4moe_cpu_stream *pf) {
    NT_SWITCH4(f_avx2_body, tile, nsb, rows, out, pf)
}

AVX2 static void gemm_f_avx2(const uint8_t *tile, int64_t nsb, const float *const *rows, int nt, float *out,
                             nvfp4moe_cpu_stream *pf) {
    F_PASSES(f_avx2)
}

AVX2 static uint64_t read_avx2(const uint8_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 128) {
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        c = _mm256_add_epi64(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
        d = _mm256_add_epi64(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    int64_t v[4];
    _mm256_storeu_si256((__m256i *)v, _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
    return (uint64_t)(v[0] + v[1] + v[2] + v[3]);
}

static const nvfp4moe_cpu_kernels k_avx2 = {NVFP4MOE_CPU_AVX2, gemm_q_avx2, gemm_f_avx2, read_avx2, quantize_blocks_portable};

// ---- AVX-512 ----

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma")))
#define AVX512_INLINE static inline __attribute__((always_inline)) AVX512

/* Block j's 16 scales of a superblock as E4M3 * 2^9 integers: m << sh. */
AVX512_INLINE __m512i scales_avx512(const uint8_t *sb, int j) {
    const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sb + 512 + 16 * j)));
    return _mm512_sllv_epi32(_mm512_and_si512(sc, _mm512_set1_epi32(0x0F)), _mm512_srli_epi32(sc, 4));
}

AVX512_INLINE void q_avx512_body(const uint8_t *tile, int64_t nsb, const nvfp4moe_cpu_qblock *const *rows,
                                 int64_t *out, nvfp4moe_cpu_stream *pf, const int NT) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)k_w_u8));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i ae[NVFP4MOE_CPU_MAX_NT], ao[NVFP4MOE_CPU_MAX_NT];
    UNROLL for (int t = 0; t < NT; t++) ae[t] = ao[t] = _mm512_setzero_si512();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *sb = tile + s * NVFP4MOE_CPU_SB_BYTES;
        nvfp4moe_cpu_stream_advance(pf, NVFP4MOE_CPU_SB_BYTES);
        for (int j = 0; j < 4; j++) {
            const __m512i v0 = _mm512_loadu_si512(sb + 128 * j), v1 = _mm512_loadu_si512(sb + 128 * j + 64);
            const __m512i w0 = _mm512_shuffle_epi8(lut, _mm512_and_si512(v0, m4));
            const __m512i w1 = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4));
            const __m512i w2 = _mm512_shuffle_epi8(lut, _mm512_and_si512(v1, m4));
            const __m512i w3 = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4));
            const __m512i sw = scales_avx512(sb, j);
            const int64_t b = 4 * s + j;
            UNROLL for (int t = 0; t < NT; t++) {
                const nvfp4moe_cpu_qblock *x = &rows[t][b];
                __m512i d = _mm512_set1_epi32(x->corr);
                d = _mm512_dpbusd_epi32(d, w0, _mm512_set1_epi32(load_i32(x->q)));
                d = _mm512_dpbusd_epi32(d, w1, _mm512_set1_epi32(load_i32(x->q + 4)));
                d = _mm512_dpbusd_epi32(d, w2, _mm512_set1_epi32(load_i32(x->q + 8)));
                d = _mm512_dpbusd_epi32(d, w3, _mm512_set1_epi32(load_i32(x->q + 12)));
                const __m512i p = _mm512_mullo_epi32(d, sw);
                const __m512i sx = _mm512_set1_epi64(x->sx);
                ae[t] = _mm512_add_epi64(ae[t], _mm512_mul_epi32(p, sx));
                ao[t] = _mm512_add_epi64(ao[t], _mm512_mul_epi32(_mm512_srli_epi64(p, 32), sx));
            }
        }
    }
    /* ae holds rows 0, 2, .., 14 and ao rows 1, 3, .., 15: interleave them back. */
    const __m512i lo = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), hi = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    UNROLL for (int t = 0; t < NT; t++) {
        _mm512_storeu_si512(out + t * NVFP4MOE_CPU_TILE_ROWS, _mm512_permutex2var_epi64(ae[t], lo, ao[t]));
        _mm512_storeu_si512(out + t * NVFP4MOE_CPU_TILE_ROWS + 8, _mm512_permutex2var_epi64(ae[t], hi, ao[t]));
    }
}

AVX512 static void gemm_q_avx512(const uint8_t *tile, int64_t nsb, const nvfp4moe_cpu_qblock *const *rows, int nt,
                                 int64_t *out, nvfp4moe_cpu_stream *pf) {
    NT_SWITCH(q_avx512_body, tile, nsb, rows, out, pf)
}

AVX512_INLINE void f_avx512_body(const uint8_t *tile, int64_t nsb, const float *const *rows, float *out,
                                 nvfp4moe_cpu_stream *pf, const int NT) {
    const __m512 lut = _mm512_loadu_ps(k_e2m1_f);
    __m512 acc[4];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *sb = tile + s * NVFP4MOE_CPU_SB_BYTES;
        nvfp4moe_cpu_stream_advance(pf, NVFP4MOE_CPU_SB_BYTES);
        for (int j = 0; j < 4; j++) {
            const __m512i v0 = _mm512_loadu_si512(sb + 128 * j), v1 = _mm512_loadu_si512(sb + 128 * j + 64);
            const __m512 sw = _mm512_mul_ps(_mm512_cvtepi32_ps(scales_avx512(sb, j)), _mm512_set1_ps(1.0f / 512.0f));
            __m512 w[16];   /* column 4g + i of the block: nibble 2i + (g & 1) of v_(g / 2)'s lanes */
            UNROLL for (int i = 0; i < 4; i++) {
                w[i] = _mm512_permutexvar_ps(_mm512_srli_epi32(v0, 8 * i), lut);
                w[4 + i] = _mm512_permutexvar_ps(_mm512_srli_epi32(v0, 8 * i + 4), lut);
                w[8 + i] = _mm512_permutexvar_ps(_mm512_srli_epi32(v1, 8 * i), lut);
                w[12 + i] = _mm512_permutexvar_ps(_mm512_srli_epi32(v1, 8 * i + 4), lut);
            }
            const int64_t b = 4 * s + j;
            UNROLL for (int t = 0; t < NT; t++) {
                const float *x = rows[t] + 16 * b;
                __m512 p[4];
                UNROLL for (int i = 0; i < 4; i++) p[i] = _mm512_mul_ps(w[i], _mm512_set1_ps(x[i]));
                UNROLL for (int g = 1; g < 4; g++)
                    UNROLL for (int i = 0; i < 4; i++) p[i] = _mm512_fmadd_ps(w[4 * g + i], _mm512_set1_ps(x[4 * g + i]), p[i]);
                const __m512 bs = _mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3]));
                acc[t] = _mm512_fmadd_ps(bs, sw, acc[t]);
            }
        }
    }
    UNROLL for (int t = 0; t < NT; t++) _mm512_storeu_ps(out + t * NVFP4MOE_CPU_TILE_ROWS, acc[t]);
}

AVX512 static void f_avx512(const uint8_t *tile, int64_t nsb, const float *const *rows, int nt, float *out,
                            nvfp4moe_cpu_stream *pf) {
    NT_SWITCH4(f_avx512_body, tile, nsb, rows, out, pf)
}

AVX512 static void gemm_f_avx512(const uint8_t *tile, int64_t nsb, const float *const *rows, int nt, float *out,
                                 nvfp4moe_cpu_stream *pf) {
    F_PASSES(f_avx512)
}

AVX512 static uint64_t read_avx512(const uint8_t *p, size_t n) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 256) {
        a = _mm512_add_epi64(a, _mm512_load_si512(p + i));
        b = _mm512_add_epi64(b, _mm512_load_si512(p + i + 64));
        c = _mm512_add_epi64(c, _mm512_load_si512(p + i + 128));
        d = _mm512_add_epi64(d, _mm512_load_si512(p + i + 192));
    }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
}

/* The codec's VLLM_TRITON block quantizer (src/format/nvfp4.c, quantize_block) with a block in a
 * register, in the same float32 operations: amax (NaN if any element is), s = gs * (amax * (1/6))
 * clamped to +-448 keeping NaN, its E4M3 code (the codec's encoder), inv = gs / s (0 when s is 0),
 * then each element's E2M1 code from x * inv clamped to +-6 keeping NaN, by counting the rounding
 * thresholds it passes; NaN codes 0. test_cpu_fast compares it with nvfp4moe_quantize_as bit for
 * bit. */
AVX512 static bool quantize_blocks_avx512(const float *x, int64_t nb, float gs, nvfp4moe_cpu_qblock *blk,
                                          uint8_t *scratch) {
    bool nan = false;
    if (quantize_special(x, nb, gs, blk, &nan)) return nan;
    const __m512i lut = _mm512_setr_epi32(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m512i one = _mm512_set1_epi32(1);
    for (int64_t b = 0; b < nb; b++) {
        nvfp4moe_cpu_qblock *o = &blk[b];
        const __m512 v = _mm512_loadu_ps(x + 16 * b);
        const __m512 a = _mm512_abs_ps(v);
        float amax = _mm512_reduce_max_ps(a);
        if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) amax = NAN;
        float s = gs * (amax * (float)(1.0 / 6.0));
        s = s < -448.0f ? -448.0f : s > 448.0f ? 448.0f : s;
        const uint8_t sc = nvfp4moe_e4m3_encode(s);
        nan |= set_block_scale(o, sc);
        const float sd = nvfp4moe_e4m3_decode(sc);
        const float inv = sd == 0.0f ? 0.0f : gs / sd;
        __m512 y = _mm512_mul_ps(v, _mm512_set1_ps(inv));
        y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(y, _mm512_set1_ps(-6.0f), _CMP_LT_OQ), y, _mm512_set1_ps(-6.0f));
        y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(y, _mm512_set1_ps(6.0f), _CMP_GT_OQ), y, _mm512_set1_ps(6.0f));
        const __m512 ay = _mm512_abs_ps(y);
        __m512i m = _mm512_setzero_si512();
        m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(ay, _mm512_set1_ps(0.25f), _CMP_GT_OQ), m, one);
        m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(ay, _mm512_set1_ps(0.75f), _CMP_GE_OQ), m, one);
        m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(ay, _mm512_set1_ps(1.25f), _CMP_GT_OQ), m, one);
        m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(ay, _mm512_set1_ps(1.75f), _CMP_GE_OQ), m, one);
        m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(ay, _mm512_set1_ps(2.5f), _CMP_GT_OQ), m, one);
        m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(ay, _mm512_set1_ps(3.5f), _CMP_GE_OQ), m, one);
        m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(ay, _mm512_set1_ps(5.0f), _CMP_GT_OQ), m, one);
        /* the sign bit as code bit 3, except for NaN (code 0) */
        const __m512i sign = _mm512_srli_epi32(_mm512_castps_si512(y), 28);
        const __mmask16 num = _mm512_cmp_ps_mask(y, y, _CMP_ORD_Q);
        const __m512i code = _mm512_mask_or_epi32(m, num, m, _mm512_and_si512(sign, _mm512_set1_epi32(8)));
        const __m512i q = _mm512_permutexvar_epi32(code, lut);
        _mm_storeu_si128((__m128i *)o->q, _mm512_cvtepi32_epi8(q));
        o->corr = -12 * _mm512_reduce_add_epi32(q);
        o->pad = 0;
    }
    return nan;
}

static const nvfp4moe_cpu_kernels k_avx512 = {NVFP4MOE_CPU_AVX512, gemm_q_avx512, gemm_f_avx512, read_avx512,
                                              quantize_blocks_avx512};

#endif // CPU_X86

// ---- dispatch ----

static const char *const k_isa_names[NVFP4MOE_CPU_ISA_COUNT] = {"portable", "avx2", "avx512"};

const char *nvfp4moe_cpu_isa_name(nvfp4moe_cpu_isa isa) {
    return isa >= 0 && isa < NVFP4MOE_CPU_ISA_COUNT ? k_isa_names[isa] : "?";
}

bool nvfp4moe_cpu_isa_supported(nvfp4moe_cpu_isa isa) {
    switch (isa) {
    case NVFP4MOE_CPU_PORTABLE: return true;
#ifdef CPU_X86
    case NVFP4MOE_CPU_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case NVFP4MOE_CPU_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx2") &&
               __builtin_cpu_supports("fma");
#endif
    default: return false;
    }
}

const nvfp4moe_cpu_kernels *nvfp4moe_cpu_kernels_of(nvfp4moe_cpu_isa isa) {
    if (!nvfp4moe_cpu_isa_supported(isa)) return NULL;
    switch (isa) {
#ifdef CPU_X86
    case NVFP4MOE_CPU_AVX2: return &k_avx2;
    case NVFP4MOE_CPU_AVX512: return &k_avx512;
#endif
    default: return &k_portable;
    }
}

nvfp4moe_status nvfp4moe_cpu_kernels_select(const nvfp4moe_cpu_kernels **out) {
    const char *env = getenv("NVFP4MOE_CPU_ISA");
    if (env && *env) {
        for (int i = 0; i < NVFP4MOE_CPU_ISA_COUNT; i++) {
            if (!nvfp4moe_name_eq(env, k_isa_names[i])) continue;
            const nvfp4moe_cpu_kernels *k = nvfp4moe_cpu_kernels_of((nvfp4moe_cpu_isa)i);
            NVFP4MOE_RETURN_IF(!k, NVFP4MOE_ERR_UNSUPPORTED, "NVFP4MOE_CPU_ISA=%s: this CPU does not run it", env);
            *out = k;
            return NVFP4MOE_OK;
        }
        return nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT,
                                  "NVFP4MOE_CPU_ISA='%s' is not one of portable, avx2, avx512", env);
    }
    for (int i = NVFP4MOE_CPU_ISA_COUNT - 1; i >= 0; i--) {
        const nvfp4moe_cpu_kernels *k = nvfp4moe_cpu_kernels_of((nvfp4moe_cpu_isa)i);
        if (k) {
            *out = k;
            return NVFP4MOE_OK;
        }
    }
    *out = &k_portable;
    return NVFP4MOE_OK;
}

// ---- prefetch settings ----

static const char *const k_pf_names[NVFP4MOE_CPU_PF_HINT_COUNT] = {"off", "t0", "t1", "t2", "nta"};

/* The built-in setting: every line 16 superblocks (9216 bytes) ahead, into L2. On the test
 * machine's Zen 5 the kernel then streams at 84 - 95 % of the plain read bandwidth on one thread
 * (tiles of 768, 2048 and 7168 columns, one activation row; medians of interleaved runs), against
 * 60 - 87 % with the earlier t0:4608. */
static const nvfp4moe_cpu_prefetch k_pf_default = {NVFP4MOE_CPU_PF_T1, 16 * NVFP4MOE_CPU_SB_BYTES, 64};

static bool parse_bytes(const char *p, char **end, int64_t *v) {
    if (*p < '0' || *p > '9') return false;
    errno = 0;
    long long x = strtoll(p, end, 10);
    if (errno || x < 0) return false;
    *v = x;
    return true;
}

nvfp4moe_status nvfp4moe_cpu_prefetch_parse(const char *text, const char *what, nvfp4moe_cpu_prefetch *out) {
    const char *form = "off, or HINT:DISTANCE[:STRIDE] with HINT t0, t1, t2 or nta and byte counts that are multiples of 64 "
                       "(DISTANCE at most 1048576, STRIDE 64 by default and at most DISTANCE)";
    NVFP4MOE_RETURN_IF(!text, NVFP4MOE_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    if (nvfp4moe_name_eq(text, "off")) {
        *out = (nvfp4moe_cpu_prefetch){NVFP4MOE_CPU_PF_OFF, 0, 64};
        return NVFP4MOE_OK;
    }
    const char *colon = strchr(text, ':');
    int hint = -1;
    for (int i = 1; colon && i < NVFP4MOE_CPU_PF_HINT_COUNT; i++)
        if ((size_t)(colon - text) == strlen(k_pf_names[i]) && !strncmp(text, k_pf_names[i], (size_t)(colon - text))) hint = i;
    int64_t dist = 0, stride = 64;
    char *end = NULL;
    bool ok = hint > 0 && parse_bytes(colon + 1, &end, &dist);
    if (ok && *end == ':') ok = parse_bytes(end + 1, &end, &stride);
    ok = ok && *end == '\0' && dist % 64 == 0 && dist >= 64 && dist <= NVFP4MOE_CPU_PF_MAX_DISTANCE && stride % 64 == 0 &&
         stride >= 64 && stride <= dist;
    NVFP4MOE_RETURN_IF(!ok, NVFP4MOE_ERR_INVALID_ARGUMENT, "%s='%s' is not a prefetch setting: %s", what, text, form);
    *out = (nvfp4moe_cpu_prefetch){(nvfp4moe_cpu_pf_hint)hint, dist, stride};
    return NVFP4MOE_OK;
}

void nvfp4moe_cpu_prefetch_format(const nvfp4moe_cpu_prefetch *p, char *buf, size_t n) {
    if (p->hint == NVFP4MOE_CPU_PF_OFF || p->hint >= NVFP4MOE_CPU_PF_HINT_COUNT) snprintf(buf, n, "off");
    else if (p->stride == 64) snprintf(buf, n, "%s:%lld", k_pf_names[p->hint], (long long)p->distance);
    else snprintf(buf, n, "%s:%lld:%lld", k_pf_names[p->hint], (long long)p->distance, (long long)p->stride);
}

nvfp4moe_status nvfp4moe_cpu_prefetch_default(nvfp4moe_cpu_prefetch *out) {
    const char *env = getenv("NVFP4MOE_CPU_PREFETCH");
    if (env && *env) return nvfp4moe_cpu_prefetch_parse(env, "NVFP4MOE_CPU_PREFETCH", out);
    *out = k_pf_default;
    return NVFP4MOE_OK;
}

void nvfp4moe_cpu_stream_start(nvfp4moe_cpu_stream *s, const nvfp4moe_cpu_seg *segs, int64_t n,
                               const nvfp4moe_cpu_prefetch *pf) {
    *s = (nvfp4moe_cpu_stream){.seg = segs, .end = segs + n, .stride = (size_t)pf->stride, .hint = pf->hint};
    if (n == 0) s->hint = NVFP4MOE_CPU_PF_OFF;
    nvfp4moe_cpu_stream_advance(s, (size_t)pf->distance);
}

void nvfp4moe_cpu_stream_open(nvfp4moe_cpu_stream *s, nvfp4moe_cpu_seg *buf, int64_t cap, const nvfp4moe_cpu_prefetch *pf) {
    *s = (nvfp4moe_cpu_stream){.seg = buf, .end = buf, .stride = (size_t)pf->stride, .hint = pf->hint, .buf = buf, .cap = cap};
    if (cap == 0 || !buf) s->hint = NVFP4MOE_CPU_PF_OFF;
    nvfp4moe_cpu_stream_advance(s, (size_t)pf->distance);   /* at the end: counted, asked for on the first push */
}

void nvfp4moe_cpu_stream_push(nvfp4moe_cpu_stream *s, const nvfp4moe_cpu_seg *segs, int64_t n) {
    if (s->hint == NVFP4MOE_CPU_PF_OFF || !s->buf) return;
    /* the segments still ahead of the cursor to the front */
    const int64_t keep = s->end - s->seg;
    if (s->seg != s->buf) memmove(s->buf, s->seg, sizeof(nvfp4moe_cpu_seg) * (size_t)keep);
    nvfp4moe_cpu_seg *end = s->buf + keep;
    for (int64_t i = 0; i < n; i++) {
        if (segs[i].n == 0) continue;
        if (end == s->buf + s->cap) {
            s->hint = NVFP4MOE_CPU_PF_OFF;
            return;
        }
        *end++ = segs[i];
    }
    const bool waiting = keep == 0;
    s->seg = s->buf;
    s->end = end;
    if (!waiting) return;
    /* the cursor went on past the end by s->off (a stride's remainder) and s->credit bytes */
    while (s->seg != s->end && s->off >= s->seg->n) {
        s->off -= s->seg->n;
        s->seg++;
    }
    nvfp4moe_cpu_stream_advance(s, 0);
}
