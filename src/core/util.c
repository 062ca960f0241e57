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

// ---- "did you mean" ----

static char fold(char c) {
    c = (char)tolower((unsigned char)c);
    return c == '-' ? '_' : c;
}

/* Edit distance with adjacent transpositions (optimal string alignment) between a and b, or
 * limit + 1 as soon as it must exceed limit. Words longer than 63 characters are never near. */
static int edit_distance(const char *a, const char *b, int limit) {
    const int n = (int)strlen(a), m = (int)strlen(b);
    if (n > 63 || m > 63) return limit + 1;
    if (n - m > limit || m - n > limit) return limit + 1;
    int d[64][64];
    for (int i = 0; i <= n; i++) d[i][0] = i;
    for (int j = 0; j <= m; j++) d[0][j] = j;
    for (int i = 1; i <= n; i++) {
        int row_min = limit + 1;
        for (int j = 1; j <= m; j++) {
            const int cost = fold(a[i - 1]) != fold(b[j - 1]);
            int v = d[i - 1][j - 1] + cost;
            if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) && fold(a[i - 2]) == fold(b[j - 1]) &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
            if (v < row_min) row_min = v;
        }
        if (row_min > limit) return limit + 1;
    }
    return d[n][m];
}

void nvfp4moe_suggest_init(nvfp4moe_suggest *s, const char *typed) {
    memset(s, 0, sizeof *s);
    s->typed = typed ? typed : "";
}

void nvfp4moe_suggest_add(nvfp4moe_suggest *s, const char *candidate) {
    if (!s || !candidate || !candidate[0] || !s->typed[0]) return;
    const size_t n = strlen(s->typed);
    const int limit = n <= 3 ? 0 : n <= 5 ? 1 : n <= 8 ? 2 : 3;
    const int d = edit_distance(s->typed, candidate, limit);
    if (d <= limit && (!s->best || d < s->dist)) {
        s->best = candidate;
        s->dist = d;
    }
    size_t k = 0;
    while (k < n && candidate[k] && fold(candidate[k]) == fold(s->typed[k])) k++;
    if (n >= 3 && k == n && candidate[n]) {   /* typed is the start of candidate */
        if (!s->prefixes || s->prefix_of != candidate) s->prefixes++;
        s->prefix_of = candidate;
    }
}

const char *nvfp4moe_suggest_best(const nvfp4moe_suggest *s) {
    if (!s) return NULL;
    if (s->best && s->dist == 0) return NULL;   /* typed is a known name: nothing to suggest */
    if (s->best) return s->best;
    return s->prefixes == 1 ? s->prefix_of : NULL;
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

/* bf16 to float is a shift; separate arrays, so that the loop vectorizes. */
static void bf16_row_to_float(const uint16_t *restrict h, int64_t n, float *restrict dst) {
    for (int64_t i = 0; i < n; i++) dst[i] = u2f((uint32_t)h[i] << 16);
}

/* nvfp4moe_bf16_to_float(nvfp4moe_bf16_from_float(x)), inline. */
static inline float bf16_round(float x) {
    uint32_t u = f2u(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return u2f((u & 0xFFFF0000u) | 0x00400000u);   /* the quiet NaN it stores */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return u2f(u & 0xFFFF0000u);
}

void nvfp4moe_to_float(nvfp4moe_dtype dt, const void *src, int64_t n, float *dst) {
    if (!src || !dst) return;
    const uint16_t *h = (const uint16_t *)src;
    /* one loop per dtype (the exported converters are calls from here: -fPIC) */
    switch (dt) {
    case NVFP4MOE_DTYPE_BF16:
        bf16_row_to_float(h, n, dst);
        break;
    case NVFP4MOE_DTYPE_FP16:
        for (int64_t i = 0; i < n; i++) dst[i] = nvfp4moe_fp16_to_float(h[i]);
        break;
    case NVFP4MOE_DTYPE_F32:
        if (dst != src) memmove(dst, src, sizeof(float) * (size_t)n);
        break;
    }
}

void nvfp4moe_round_row_to_dtype(nvfp4moe_dtype dt, float *x, int64_t n) {
    switch (dt) {
    case NVFP4MOE_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
        break;
    case NVFP4MOE_DTYPE_FP16:
        for (int64_t i = 0; i < n; i++) x[i] = nvfp4moe_fp16_to_float(nvfp4moe_fp16_from_float(x[i]));
        break;
    case NVFP4MOE_DTYPE_F32:
        break;
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
