/*
 * util.c - errors, version, dtype conversions and the pseudo-random generator.
 */
#include "core/internal.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

// ---- version ----

#define NVFP4MOE_STR_(x) #x
#define NVFP4MOE_STR(x) NVFP4MOE_STR_(x)
#define NVFP4MOE_VERSION_STRING                                                                    \
    NVFP4MOE_STR(NVFP4MOE_VERSION_MAJOR) "." NVFP4MOE_STR(NVFP4MOE_VERSION_MINOR) "." NVFP4MOE_STR( \
        NVFP4MOE_VERSION_PATCH)

const char *nvfp4moe_version(void) {
#ifdef NVFP4MOE_HAVE_CUDA
    return NVFP4MOE_VERSION_STRING " (cuda)";
#else
    return NVFP4MOE_VERSION_STRING " (cpu-only)";
#endif
}

bool nvfp4moe_built_with_cuda(void) {
#ifdef NVFP4MOE_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

// ---- status and errors ----

const char *nvfp4moe_status_str(nvfp4moe_status s) {
    switch (s) {
    case NVFP4MOE_OK:                   return "ok";
    case NVFP4MOE_ERR_INVALID_ARGUMENT: return "invalid argument";
    case NVFP4MOE_ERR_SHAPE:            return "bad shape";
    case NVFP4MOE_ERR_UNSUPPORTED:      return "unsupported";
    case NVFP4MOE_ERR_NOT_FOUND:        return "not found";
    case NVFP4MOE_ERR_IO:               return "I/O error";
    case NVFP4MOE_ERR_FORMAT:           return "malformed input";
    case NVFP4MOE_ERR_OUT_OF_MEMORY:    return "out of memory";
    case NVFP4MOE_ERR_CUDA:             return "CUDA error";
    case NVFP4MOE_ERR_BUFFER_TOO_SMALL: return "buffer too small";
    case NVFP4MOE_ERR_INTERNAL:         return "internal error";
    }
    return "unknown status";
}

static _Thread_local char g_last_error[1024];

const char *nvfp4moe_last_error(void) { return g_last_error; }

nvfp4moe_status nvfp4moe_set_error(nvfp4moe_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return s;
}

void nvfp4moe_error_prefix(const char *fmt, ...) {
    char prefix[512], old[sizeof g_last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_last_error, sizeof old);
    /* Truncation is fine here: the message stays terminated. */
    if (snprintf(g_last_error, sizeof g_last_error, "%s: %s", prefix, old) < 0) g_last_error[0] = '\0';
}

bool nvfp4moe_name_eq(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        char x = (char)tolower((unsigned char)*a), y = (char)tolower((unsigned char)*b);
        if (x == '-') x = '_';
        if (y == '-') y = '_';
        if (x != y) return false;
    }
    return *a == *b;
}

void nvfp4moe_strlcpy(char *dst, const char *src, size_t len) {
    if (len == 0) return;
    size_t n = strlen(src);
    if (n >= len) n = len - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

// ---- bf16 / fp16 ----

static uint32_t f2u(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float u2f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

uint16_t nvfp4moe_bf16_from_float(float x) {
    uint32_t u = f2u(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1u);                                          /* RNE */
    return (uint16_t)(u >> 16);
}

float nvfp4moe_bf16_to_float(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t nvfp4moe_fp16_from_float(float x) {
    uint32_t u = f2u(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7E00u;          /* NaN */
    if (a >= 0x477FF000u) return sign | 0x7C00u;         /* >= 65520 rounds to Inf */
    if (a < 0x38800000u) {                               /* below 2^-14: subnormal or zero */
        /* value = a as float; fp16 subnormal unit is 2^-24. */
        float f = u2f(a) * 16777216.0f;                  /* exact: scales by 2^24 */
        /* round half to even on an integer */
        float r = rintf(f);
        return sign | (uint16_t)r;
    }
    uint32_t mant = a & 0x7FFFFFu;
    int32_t exp = (int32_t)(a >> 23) - 127 + 15;
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return sign | (uint16_t)h;
}

float nvfp4moe_fp16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    if (exp == 0) {
        float f = (float)mant * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) return u2f(sign | 0x7F800000u | (mant << 13));
    return u2f(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

size_t nvfp4moe_dtype_size(nvfp4moe_dtype dt) { return dt == NVFP4MOE_DTYPE_F32 ? 4 : 2; }

float nvfp4moe_round_to_dtype(nvfp4moe_dtype dt, float x) {
    switch (dt) {
    case NVFP4MOE_DTYPE_BF16: return nvfp4moe_bf16_to_float(nvfp4moe_bf16_from_float(x));
    case NVFP4MOE_DTYPE_FP16: return nvfp4moe_fp16_to_float(nvfp4moe_fp16_from_float(x));
    case NVFP4MOE_DTYPE_F32: break;
    }
    return x;
}

void nvfp4moe_to_float(nvfp4moe_dtype dt, const void *src, int64_t n, float *dst) {
    if (!src || !dst) return;
    const uint16_t *h = (const uint16_t *)src;
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case NVFP4MOE_DTYPE_BF16: dst[i] = nvfp4moe_bf16_to_float(h[i]); break;
        case NVFP4MOE_DTYPE_FP16: dst[i] = nvfp4moe_fp16_to_float(h[i]); break;
        case NVFP4MOE_DTYPE_F32:  dst[i] = ((const float *)src)[i]; break;
        }
    }
}

void nvfp4moe_from_float(nvfp4moe_dtype dt, const float *src, int64_t n, void *dst) {
    if (!src || !dst) return;
    uint16_t *h = (uint16_t *)dst;
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case NVFP4MOE_DTYPE_BF16: h[i] = nvfp4moe_bf16_from_float(src[i]); break;
        case NVFP4MOE_DTYPE_FP16: h[i] = nvfp4moe_fp16_from_float(src[i]); break;
        case NVFP4MOE_DTYPE_F32:  ((float *)dst)[i] = src[i]; break;
        }
    }
}

// ---- random numbers ----

uint64_t nvfp4moe_rand_u64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double nvfp4moe_rand_uniform(uint64_t *state) {
    return (double)(nvfp4moe_rand_u64(state) >> 11) * (1.0 / 9007199254740992.0);
}

double nvfp4moe_rand_normal(uint64_t *state) {
    double u1 = nvfp4moe_rand_uniform(state), u2 = nvfp4moe_rand_uniform(state);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void nvfp4moe_fill_normal(void *dst, nvfp4moe_dtype dt, int64_t n, uint64_t seed) {
    if (!dst) return;
    uint64_t st = seed;
    for (int64_t i = 0; i < n; i++) {
        float v = (float)nvfp4moe_rand_normal(&st);
        nvfp4moe_from_float(dt, &v, 1, (char *)dst + (size_t)i * nvfp4moe_dtype_size(dt));
    }
}
