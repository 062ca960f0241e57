/*
 * test_emulation.c - the codec's quantizers and the host EMULATION path against
 * tests/vllm_emulation.py, an independent numpy transcription of vLLM's (and ModelOpt's) code,
 * bit for bit: every quantizer's block scales and E2M1 codes and its quantize-dequantize on
 * tie-heavy bf16 data, and whole EMULATION layers over activations, top-k (both moe_sum
 * branches), dtypes, the router weight on the input, zero experts, outliers, power-of-two input
 * scales and concentrated routing. Then how often the quantizers disagree, the figure
 * docs/numerics.md quotes (tests/test_numerics.c measures the backends' distances).
 *
 * Each case is written to a temporary directory (meta.txt plus raw tensors) that one run of
 * /usr/bin/python3 (numpy: Debian python3-numpy; NVFP4MOE_PYTHON overrides) reads and answers.
 */
#include "harness.h"
#include "format/format.h"
#include "reference/reference.h"
#include "nvfp4_data.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_root[256];
static int g_ncase;

// ---- writing a case ----

static void write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n)) {
        fprintf(stderr, "test_emulation: cannot write %s: %s\n", path, strerror(errno));
        exit(2);
    }
    fclose(f);
}

/* Reads dir/want_<name>.bin (n bytes expected); NULL with a failure recorded when it is not there. */
static uint8_t *read_want(const char *dir, const char *name, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/want_%s.bin", dir, name);
    FILE *f = fopen(path, "rb");
    uint8_t *buf = malloc(n + 1);
    size_t got = f ? fread(buf, 1, n + 1, f) : 0;
    if (f) fclose(f);
    CHECK(f && got == n, "%s: %zu bytes read, %zu expected (did the python reference run?)", path, got, n);
    if (!f || got != n) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void new_case(char *dir, size_t len, FILE **meta) {
    snprintf(dir, len, "%s/c%04d", g_root, g_ncase++);
    if (mkdir(dir, 0700) != 0) {
        fprintf(stderr, "test_emulation: mkdir %s: %s\n", dir, strerror(errno));
        exit(2);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/meta.txt", dir);
    *meta = fopen(path, "w");
    if (!*meta) exit(2);
}

/* Values of dtype dt (bit patterns) compared bitwise; two NaNs are equal whatever their payload. */
static int compare_dtype(const char *what, nvfp4moe_dtype dt, const uint8_t *got, const uint8_t *want, int64_t n) {
    const size_t sz = nvfp4moe_dtype_size(dt);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float g, w;
        nvfp4moe_to_float(dt, got + (size_t)i * sz, 1, &g);
        nvfp4moe_to_float(dt, want + (size_t)i * sz, 1, &w);
        if ((isnan(g) && isnan(w)) || memcmp(got + (size_t)i * sz, want + (size_t)i * sz, sz) == 0) continue;
        if (bad++ < 5) fprintf(stderr, "  [%s] %s: [%lld] got %.9g want %.9g\n", t_case, what, (long long)i, (double)g, (double)w);
    }
    if (bad) fprintf(stderr, "FAIL [%s] %s: %d of %lld values differ\n", t_case, what, bad, (long long)n);
    t_record(bad == 0);
    return bad;
}

// ---- the quantizers ----

typedef struct qcase {
    char dir[320];
    char name[160];
    nvfp4moe_quantizer q;
    nvfp4moe_dtype dt;
    int64_t rows, cols;
    float *x;
    uint8_t *packed, *scales, *qdq;
} qcase;

static qcase g_q[64];
static int g_nq;

static void add_quantize_case(const char *data, nvfp4moe_quantizer q, const float *x, int64_t rows, int64_t cols,
                              float ts, nvfp4moe_dtype dt) {
    qcase *c = &g_q[g_nq++];
    snprintf(c->name, sizeof c->name, "quantize %s %s %lldx%lld scale=%a %s", nvfp4moe_quantizer_name(q), data,
             (long long)rows, (long long)cols, (double)ts, nvfp4moe_dtype_name(dt));
    T_CASE(c->name);
    c->q = q;
    c->dt = dt;
    c->rows = rows;
    c->cols = cols;
    const size_t n = (size_t)(rows * cols);
    c->x = malloc(sizeof(float) * n);
    memcpy(c->x, x, sizeof(float) * n);
    c->packed = malloc(n / 2);
    c->scales = malloc(n / 16);
    c->qdq = malloc(n * nvfp4moe_dtype_size(dt));
    CHECK_OK(nvfp4moe_quantize_as(q, x, rows, cols, ts, c->packed, c->scales));
    float *row = malloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        nvfp4moe_qdq_row_as(q, x + r * cols, cols, ts, dt, row);
        nvfp4moe_from_float(dt, row, cols, c->qdq + (size_t)(r * cols) * nvfp4moe_dtype_size(dt));
    }
    free(row);
    FILE *meta;
    new_case(c->dir, sizeof c->dir, &meta);
    fprintf(meta, "kind quantize\nquantizer %s\nrows %lld\ncols %lld\ndtype %s\n", nvfp4moe_quantizer_name(q),
            (long long)rows, (long long)cols, nvfp4moe_dtype_name(dt));
    fclose(meta);
    write_file(c->dir, "x", x, sizeof(float) * n);
    write_file(c->dir, "tensor_scale", &ts, sizeof ts);
}

static void check_quantize_cases(void) {
    for (int i = 0; i < g_nq; i++) {
        qcase *c = &g_q[i];
        T_CASE(c->name);
        const size_t n = (size_t)(c->rows * c->cols);
        uint8_t *wp = read_want(c->dir, "packed", n / 2), *ws = read_want(c->dir, "scales", n / 16);
        uint8_t *wq = read_want(c->dir, "qdq", n * nvfp4moe_dtype_size(c->dt));
        if (ws) check_bytes("block scale codes", c->scales, ws, n / 16);
        if (wp) check_bytes("packed E2M1 codes", c->packed, wp, n / 2);
        if (wq) compare_dtype("quantize-dequantize", c->dt, c->qdq, wq, (int64_t)n);
        free(wp); free(ws); free(wq);
        free(c->x); free(c->packed); free(c->scales); free(c->qdq);
    }
}

static void quantize_cases(void) {
    enum { R = 24, C = 256 };
    static float x[R * C];
    tie_heavy(x, R, C, 11);
    float amax = 0;
    for (int i = 0; i < R * C; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float scale_2 = amax / 2688.0f;   /* ModelOpt: amax / (6 * 448) */
    const float vllm_scales[] = {1.0f, 0.25f, 1.0f / scale_2, 3.0f, 1.7f};
    for (size_t s = 0; s < sizeof vllm_scales / sizeof vllm_scales[0]; s++) {
        add_quantize_case("ties", NVFP4MOE_QUANTIZER_VLLM_REF, x, R, C, vllm_scales[s], NVFP4MOE_DTYPE_BF16);
        add_quantize_case("ties", NVFP4MOE_QUANTIZER_VLLM_TRITON, x, R, C, vllm_scales[s], NVFP4MOE_DTYPE_BF16);
    }
    add_quantize_case("ties", NVFP4MOE_QUANTIZER_VLLM_TRITON, x, R, C, 2.0f, NVFP4MOE_DTYPE_FP16);
    add_quantize_case("ties", NVFP4MOE_QUANTIZER_MODELOPT, x, R, C, scale_2, NVFP4MOE_DTYPE_BF16);
    add_quantize_case("ties", NVFP4MOE_QUANTIZER_MODELOPT, x, R, C, 0.125f, NVFP4MOE_DTYPE_BF16);
    /* a scale_2 small enough that the block scales pass 448 and 464: torch's conversion has no
     * saturation, so those blocks get the NaN code */
    add_quantize_case("ties", NVFP4MOE_QUANTIZER_MODELOPT, x, R, C, scale_2 / 1.05f, NVFP4MOE_DTYPE_BF16);

    /* near-ties, where the formulas differ */
    static float z[R * C];
    const float near_scales[] = {1.0f + 0x1p-23f, 0.125f * (1.0f - 0x1p-24f), 3.0f * (1.0f + 0x1p-22f), 1792.0f / 3.0f};
    for (size_t s = 0; s < sizeof near_scales / sizeof near_scales[0]; s++) {
        near_ties(z, R, C, near_scales[s], false, 20 + s);
        add_quantize_case("near-ties", NVFP4MOE_QUANTIZER_VLLM_REF, z, R, C, near_scales[s], NVFP4MOE_DTYPE_BF16);
        add_quantize_case("near-ties", NVFP4MOE_QUANTIZER_VLLM_TRITON, z, R, C, near_scales[s], NVFP4MOE_DTYPE_BF16);
    }
    const float near_s2[] = {(1.0f + 0x1p-23f) / 448.0f, 0.01f, scale_2};
    for (size_t s = 0; s < sizeof near_s2 / sizeof near_s2[0]; s++) {
        near_ties(z, R, C, near_s2[s], true, 30 + s);
        add_quantize_case("near-ties", NVFP4MOE_QUANTIZER_MODELOPT, z, R, C, near_s2[s], NVFP4MOE_DTYPE_BF16);
    }

    static float y[2 * 64];
    for (int i = 0; i < 2 * 64; i++) y[i] = (float)(i % 16) - 7.5f;
    y[3] = NAN;
    y[20] = INFINITY;
    y[40] = -INFINITY;
    y[70] = -0.0f;
    for (int q = 0; q < NVFP4MOE_QUANTIZER_COUNT; q++)
        add_quantize_case("nan-inf", (nvfp4moe_quantizer)q, y, 2, 64, 0.5f, NVFP4MOE_DTYPE_BF16);
}

/* The default quantizer is vLLM's reference, and the quantizers disagree at ties: the figures
 * docs/numerics.md gives. */
static void quantizer_disagreement(void) {
    T_CASE("nvfp4moe_quantize is the vllm_ref quantizer");
    enum { R = 64, C = 512 };
    static float x[R * C];
    static uint8_t p0[R * C / 2], s0[R * C / 16], p1[R * C / 2], s1[R * C / 16];
    tie_heavy(x, R, C, 5);
    CHECK_OK(nvfp4moe_quantize(x, R, C, 1.0f, p0, s0));
    CHECK_OK(nvfp4moe_quantize_as(NVFP4MOE_QUANTIZER_VLLM_REF, x, R, C, 1.0f, p1, s1));
    check_bytes("codes", p0, p1, sizeof p0);
    check_bytes("scales", s0, s1, sizeof s0);

    T_CASE("vllm_ref and vllm_triton disagree only at ties");
    const float gs[] = {1.0f, 1792.0f / 3.0f};
    for (int data = 0; data < 2; data++)
        for (size_t k = 0; k < sizeof gs / sizeof gs[0]; k++) {
            if (data == 0) tie_heavy(x, R, C, 5);
            else near_ties(x, R, C, gs[k], false, 6);
            CHECK_OK(nvfp4moe_quantize_as(NVFP4MOE_QUANTIZER_VLLM_REF, x, R, C, gs[k], p0, s0));
            CHECK_OK(nvfp4moe_quantize_as(NVFP4MOE_QUANTIZER_VLLM_TRITON, x, R, C, gs[k], p1, s1));
            int codes = 0, off_tie = 0;
            for (int i = 0; i < R * C; i++) {
                const uint8_t a = (p0[i / 2] >> (4 * (i & 1))) & 0xF, b = (p1[i / 2] >> (4 * (i & 1))) & 0xF;
                if (a == b) continue;
                codes++;
                /* a disagreement is one step on the grid, where x * inv sits within 2 ulp of a
                 * rounding threshold */
                const float v = fabsf(x[i] * (gs[k] / nvfp4moe_e4m3_decode(s0[i / 16])));
                const float th[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
                bool near = false;
                for (int t = 0; t < 7; t++) near |= fabsf(v - th[t]) <= 2.0f * (nextafterf(th[t], 10.0f) - th[t]);
                if (!near || abs((a & 7) - (b & 7)) != 1) off_tie++;
            }
            CHECK(memcmp(s0, s1, sizeof s0) == 0, "the block scales are the same formula in both");
            CHECK(off_tie == 0, "%d of %d disagreements are not one grid step at a tie", off_tie, codes);
            /* docs/numerics.md and the README quote this figure */
            if (k == 1) {
                const double pct = 100.0 * codes / (R * C), doc = data ? 17.6 : 0.049;
                CHECK(fabs(pct - doc) < 0.05 * doc, "%s at global scale 1792/3: %.3f%% of the codes differ, the docs "
                      "say %.3g%%", data ? "near-ties" : "tie-heavy data", pct, doc);
            }
            if (k == 0) CHECK(codes == 0, "with a power-of-two global scale the two formulas are the same number");
            printf("test_emulation: %s, global scale %g: vllm_ref and vllm_triton codes differ on %d of %d (%.3f%%)\n",
                   data ? "near-ties" : "tie-heavy bf16", (double)gs[k], codes, R * C, 100.0 * codes / (R * C));
        }
}

// ---- EMULATION layers ----

typedef struct lcase {
    char dir[320];
    char name[300];
    nvfp4moe_config cfg;
    int64_t M;
    uint8_t *out;
} lcase;

static lcase g_l[64];
static int g_nl;

enum { SPECIAL_NONE = 0, SPECIAL_ZERO_EXPERT = 1, SPECIAL_POW2_SCALES = 2, SPECIAL_OUTLIERS = 4,
       SPECIAL_CONCENTRATED = 8, SPECIAL_MAGNITUDES = 16 };

static void write_layer(const char *dir, const nvfp4moe_config *c, const nvfp4moe_weights *w) {
    const int64_t E = c->num_experts, H = c->hidden_size, I = c->intermediate_size, N1 = nvfp4moe_config_n1(c);
    write_file(dir, "w13", w->w13, (size_t)(E * N1 * H / 2));
    write_file(dir, "w13_scale", w->w13_scale, (size_t)(E * N1 * H / 16));
    write_file(dir, "w13_scale_2", w->w13_scale_2, sizeof(float) * (size_t)E);
    write_file(dir, "w13_input_scale", w->w13_input_scale, sizeof(float) * (size_t)E);
    write_file(dir, "w2", w->w2, (size_t)(E * H * I / 2));
    write_file(dir, "w2_scale", w->w2_scale, (size_t)(E * H * I / 16));
    write_file(dir, "w2_scale_2", w->w2_scale_2, sizeof(float) * (size_t)E);
    write_file(dir, "w2_input_scale", w->w2_input_scale, sizeof(float) * (size_t)E);
    if (c->has_bias) {
        write_file(dir, "w13_bias", w->w13_bias, sizeof(float) * (size_t)(E * N1));
        write_file(dir, "w2_bias", w->w2_bias, sizeof(float) * (size_t)(E * H));
    }
}

static void add_layer_case(nvfp4moe_config c, int64_t M, uint64_t seed, int special) {
    lcase *lc = &g_l[g_nl++];
    char desc[200];
    nvfp4moe_config_describe(&c, desc, sizeof desc);
    snprintf(lc->name, sizeof lc->name, "emulation M=%lld %s%s%s%s%s%s%s", (long long)M, desc,
             c.has_bias ? " bias" : "", special & SPECIAL_ZERO_EXPERT ? " zero-expert" : "",
             special & SPECIAL_POW2_SCALES ? " pow2-input-scales" : "", special & SPECIAL_OUTLIERS ? " outliers" : "",
             special & SPECIAL_CONCENTRATED ? " concentrated" : "", special & SPECIAL_MAGNITUDES ? " 1e-3/1e3" : "");
    T_CASE(lc->name);
    lc->cfg = c;
    lc->M = M;
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, seed, &l));
    if (!l) {
        g_nl--;
        return;
    }
    const int64_t E = c.num_experts, K = c.top_k, H = c.hidden_size, I = c.intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(&c);
    nvfp4moe_weights *w = &l->w;
    if (special & SPECIAL_ZERO_EXPERT) { /* expert 1: every code and block scale zero */
        memset((uint8_t *)w->w13 + N1 * H / 2, 0, (size_t)(N1 * H / 2));
        memset((uint8_t *)w->w13_scale + N1 * H / 16, 0, (size_t)(N1 * H / 16));
        memset((uint8_t *)w->w2 + H * I / 2, 0, (size_t)(H * I / 2));
        memset((uint8_t *)w->w2_scale + H * I / 16, 0, (size_t)(H * I / 16));
    }
    if (special & SPECIAL_POW2_SCALES) /* input scales powers of two: exact ties everywhere */
        for (int64_t e = 0; e < E; e++) {
            ((float *)w->w13_input_scale)[e] = ldexpf(1.0f, -(int)(e % 3) - 2);
            ((float *)w->w2_input_scale)[e] = ldexpf(1.0f, -(int)(e % 2) - 3);
        }
    size_t isz = nvfp4moe_dtype_size(c.in_dtype), osz = nvfp4moe_dtype_size(c.out_dtype);
    float *hf = malloc(sizeof(float) * (size_t)(M * H)), *logits = malloc(sizeof(float) * (size_t)(M * E));
    void *hidden = malloc((size_t)(M * H) * isz);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(M * K));
    float *tw = malloc(sizeof(float) * (size_t)(M * K));
    nvfp4moe_fill_normal(hf, NVFP4MOE_DTYPE_F32, M * H, seed + 1);
    for (int64_t i = 0; i < M * H; i++) {
        if (special & SPECIAL_OUTLIERS && i % 37 == 3) hf[i] *= 40.0f;
        if (special & SPECIAL_MAGNITUDES) hf[i] *= (i / H) % 2 ? 1e3f : 1e-3f;
        if (special & SPECIAL_MAGNITUDES && i / H == 2) hf[i] = 0.0f; /* an all-zero token */
    }
    nvfp4moe_from_float(c.in_dtype, hf, M * H, hidden);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, M * E, seed + 2);
    if (special & (SPECIAL_CONCENTRATED | SPECIAL_ZERO_EXPERT)) /* most tokens on experts 0 and 1 */
        for (int64_t t = 0; t < M; t++)
            if (t % 4 != 3) {
                logits[t * E + 1] += 8.0f;
                logits[t * E + 0] += 7.0f;
            }
    CHECK_OK(nvfp4moe_route(&c, logits, M, w->correction_bias, ids, tw));
    lc->out = malloc((size_t)(M * H) * osz);
    memset(lc->out, 0xFF, (size_t)(M * H) * osz);
    nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .topk_ids = ids, .topk_weights = tw, .output = lc->out};
    CHECK_OK(nvfp4moe_emulation_forward_host(&c, w, &io));

    FILE *meta;
    new_case(lc->dir, sizeof lc->dir, &meta);
    fprintf(meta, "kind emulation\ndtype %s\nout_dtype %s\nE %lld\ntop_k %lld\nH %lld\nI %lld\nM %lld\n",
            nvfp4moe_dtype_name(c.in_dtype), nvfp4moe_dtype_name(c.out_dtype), (long long)E, (long long)K,
            (long long)H, (long long)I, (long long)M);
    fprintf(meta, "activation %s\nhas_swiglu_limit %d\nswiglu_limit %.17g\nswiglu_alpha %.9g\nswiglu_beta %.9g\n",
            nvfp4moe_activation_name(c.activation), c.has_swiglu_limit ? 1 : 0, c.swiglu_limit,
            (double)c.swiglu_alpha, (double)c.swiglu_beta);
    fprintf(meta, "situ_beta %.9g\nsitu_linear_beta %.9g\non_input %d\nhas_bias %d\n", (double)c.situ_beta,
            (double)c.situ_linear_beta, c.apply_router_weight_on_input ? 1 : 0, c.has_bias ? 1 : 0);
    fclose(meta);
    write_layer(lc->dir, &c, w);
    write_file(lc->dir, "hidden", hidden, (size_t)(M * H) * isz);
    write_file(lc->dir, "topk_ids", ids, sizeof(int32_t) * (size_t)(M * K));
    write_file(lc->dir, "topk_weights", tw, sizeof(float) * (size_t)(M * K));
    free(hf); free(logits); free(hidden); free(ids); free(tw);
    nvfp4moe_layer_free(l);
}

static void layer_cases(void) {
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);
    c.num_experts = 8;
    c.top_k = 2;
    c.hidden_size = 128;
    c.intermediate_size = 64;
    add_layer_case(c, 16, 100, SPECIAL_NONE);
    add_layer_case(c, 16, 101, SPECIAL_POW2_SCALES);
    add_layer_case(c, 12, 102, SPECIAL_ZERO_EXPERT | SPECIAL_OUTLIERS);
    add_layer_case(c, 8, 103, SPECIAL_MAGNITUDES);
    /* moe_sum: top_k 2..4 add in bf16, the others sum in float32 once */
    const int topks[] = {1, 3, 4, 5, 8};
    for (size_t i = 0; i < sizeof topks / sizeof topks[0]; i++) {
        nvfp4moe_config d = c;
        d.top_k = topks[i];
        add_layer_case(d, 9, 110 + i, topks[i] == 8 ? SPECIAL_CONCENTRATED : SPECIAL_NONE);
    }
    nvfp4moe_config f = c;
    f.in_dtype = f.out_dtype = NVFP4MOE_DTYPE_FP16;
    add_layer_case(f, 10, 120, SPECIAL_POW2_SCALES);
    f.out_dtype = NVFP4MOE_DTYPE_F32;
    add_layer_case(f, 10, 121, SPECIAL_NONE);
    nvfp4moe_config b = c;
    b.out_dtype = NVFP4MOE_DTYPE_F32;
    add_layer_case(b, 7, 122, SPECIAL_NONE);

    const struct { nvfp4moe_activation act; double limit; } acts[] = {
        {NVFP4MOE_ACT_SILU, 7.0}, {NVFP4MOE_ACT_SILU, 2.5}, {NVFP4MOE_ACT_GELU, 0}, {NVFP4MOE_ACT_GELU_TANH, 0},
        {NVFP4MOE_ACT_SWIGLUOAI, 0}, {NVFP4MOE_ACT_SWIGLUOAI, 5.0}, {NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE, 7.0},
        {NVFP4MOE_ACT_SWIGLUSTEP, 0}, {NVFP4MOE_ACT_SITU, 0}, {NVFP4MOE_ACT_SILU_NO_MUL, 0},
        {NVFP4MOE_ACT_GELU_NO_MUL, 0}, {NVFP4MOE_ACT_GELU_TANH_NO_MUL, 0}, {NVFP4MOE_ACT_RELU2_NO_MUL, 0},
    };
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        nvfp4moe_config d = c;
        d.activation = acts[i].act;
        d.has_swiglu_limit = acts[i].limit > 0;
        d.swiglu_limit = acts[i].limit;
        if (acts[i].act == NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE) {
            d.swiglu_alpha = 1.702f;
            d.swiglu_beta = 1.0f;
        }
        add_layer_case(d, 8, 130 + i, i % 3 == 0 ? SPECIAL_POW2_SCALES : SPECIAL_NONE);
    }
    nvfp4moe_config r = c;   /* Llama4: top-1, the router weight on the input */
    r.top_k = 1;
    r.routing = NVFP4MOE_ROUTING_LLAMA4;
    r.apply_router_weight_on_input = true;
    add_layer_case(r, 11, 150, SPECIAL_NONE);
    nvfp4moe_config bias = c;  /* ours: vLLM's EMULATION rejects biases */
    bias.has_bias = true;
    add_layer_case(bias, 6, 151, SPECIAL_NONE);
}

static void check_layer_cases(void) {
    for (int i = 0; i < g_nl; i++) {
        lcase *lc = &g_l[i];
        T_CASE(lc->name);
        const int64_t n = lc->M * lc->cfg.hidden_size;
        uint8_t *want = read_want(lc->dir, "out", (size_t)n * nvfp4moe_dtype_size(lc->cfg.out_dtype));
        if (want) compare_dtype("host EMULATION vs vLLM's path in numpy", lc->cfg.out_dtype, lc->out, want, n);
        free(want);
        free(lc->out);
    }
}

// ---- the python run ----

/* Runs the numpy transcription over every case. 0 when it answered; a machine without numpy (the
 * GPU machines have no package registry) may set NVFP4MOE_SKIP_NUMPY=1 to skip the comparison,
 * which is then reported, never silent. */
static int run_python(void) {
    const char *py = getenv("NVFP4MOE_PYTHON");
    if (!py || !*py) py = "/usr/bin/python3";
    const char *skip = getenv("NVFP4MOE_SKIP_NUMPY");
    if (skip && strcmp(skip, "1") == 0) {
        printf("test_emulation: NVFP4MOE_SKIP_NUMPY=1: the comparison with vLLM's code in numpy is SKIPPED\n");
        return 1;
    }
    char script[512], dir[256];
    snprintf(dir, sizeof dir, "%s", __FILE__);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    snprintf(script, sizeof script, "%s/vllm_emulation.py", dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s'", py, script, g_root);
    int rc = system(cmd);
    T_CASE("the numpy transcription of vLLM runs");
    CHECK(rc == 0, "%s exited with %d: it needs %s with numpy (Debian: python3-numpy; `make deps` installs it)",
          cmd, rc, py);
    return rc;
}

static void remove_tree(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0) fprintf(stderr, "test_emulation: could not remove %s\n", g_root);
}

/* The host EMULATION path applies each GEMM1 half's own global scale: an up half whose block scales
 * are halved (exactly) and whose w13_up_scale_2 is doubled is the same layer, bit for bit; doubling
 * w13_up_scale_2 alone changes the output. */
static void split_gate_up_scales(void) {
    const nvfp4moe_activation acts[2] = {NVFP4MOE_ACT_SILU, NVFP4MOE_ACT_SWIGLUOAI};
    for (int a = 0; a < 2; a++) {
        T_CASE(a ? "emulation (host): per-half gate/up scales, swigluoai" : "emulation (host): per-half gate/up scales, silu");
        nvfp4moe_config c;
        nvfp4moe_config_init(&c);
        c.num_experts = 4;
        c.top_k = 2;
        c.hidden_size = 64;
        c.intermediate_size = 32;
        c.activation = acts[a];
        nvfp4moe_layer *l = NULL;
        CHECK_OK(nvfp4moe_layer_random(&c, 91 + (uint64_t)a, &l));
        if (!l) continue;
        const int64_t E = 4, H = 64, I = 32, N1 = 64, M = 12;
        uint8_t *sf = malloc((size_t)(E * N1 * H / 16));
        memcpy(sf, l->w.w13_scale, (size_t)(E * N1 * H / 16));
        float up[4], up_only[4];
        int inexact = 0;
        for (int64_t e = 0; e < E; e++) {
            up[e] = 2.0f * l->w.w13_scale_2[e];
            up_only[e] = up[e];
            for (int64_t r = 0; r < N1; r++) {
                if (!(a ? (r & 1) : r >= I)) continue;
                for (int64_t k = 0; k < H / 16; k++) {
                    uint8_t *b = sf + (e * N1 + r) * (H / 16) + k;
                    const uint8_t h = nvfp4moe_e4m3_encode(nvfp4moe_e4m3_decode(*b) * 0.5f);
                    inexact += nvfp4moe_e4m3_decode(h) * 2.0f != nvfp4moe_e4m3_decode(*b);
                    *b = h;
                }
            }
        }
        CHECK(inexact == 0, "%d block scales do not halve exactly", inexact);
        nvfp4moe_weights split = l->w, doubled = l->w;
        split.w13_scale = sf;
        split.w13_up_scale_2 = up;
        doubled.w13_up_scale_2 = up_only;
        uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(M * H)), *o0 = malloc(sizeof(uint16_t) * (size_t)(M * H));
        uint16_t *o1 = malloc(sizeof(uint16_t) * (size_t)(M * H)), *o2 = malloc(sizeof(uint16_t) * (size_t)(M * H));
        float lg[12 * 4];
        nvfp4moe_fill_normal(x, NVFP4MOE_DTYPE_BF16, M * H, 5);
        nvfp4moe_fill_normal(lg, NVFP4MOE_DTYPE_F32, M * E, 6);
        nvfp4moe_io io = {.num_tokens = M, .hidden = x, .router_logits = lg, .output = o0};
        CHECK_OK(nvfp4moe_emulation_forward_host(&c, &l->w, &io));
        io.output = o1;
        CHECK_OK(nvfp4moe_emulation_forward_host(&c, &split, &io));
        io.output = o2;
        CHECK_OK(nvfp4moe_emulation_forward_host(&c, &doubled, &io));
        CHECK(!memcmp(o0, o1, sizeof(uint16_t) * (size_t)(M * H)), "halved block scales x doubled up scale differ");
        CHECK(memcmp(o0, o2, sizeof(uint16_t) * (size_t)(M * H)) != 0, "the up scale is not applied");
        free(x); free(o0); free(o1); free(o2); free(sf);
        nvfp4moe_layer_free(l);
    }
}

// ---- the GPU's divisions, modelled (nvfp4moe_qdq_row_triton) ----

/* The F32 quantize-dequantize of a block whose scale decodes to s at global scale gs and whose
 * second value quantizes to E2M1 1: that value is the dequantization step itself. */
static float qdq_step(float gs, float s, const float *rcp) {
    float x[16] = {0}, out[16];
    x[0] = 6.0f * s / gs;
    x[1] = x[0] / 6.0f;
    uint8_t p[8], sc;
    CHECK_OK(nvfp4moe_quantize_as(NVFP4MOE_QUANTIZER_VLLM_TRITON, x, 1, 16, gs, p, &sc));
    CHECK(nvfp4moe_e4m3_decode(sc) == s && (p[0] >> 4) == 2, "gs %a s %a: the block's scale is %a, code %d", (double)gs,
          (double)s, (double)nvfp4moe_e4m3_decode(sc), p[0] >> 4);
    nvfp4moe_qdq_row_triton(x, 16, gs, rcp, NVFP4MOE_DTYPE_F32, out);
    return out[1];
}

/* The model divides s / gs as s times the reciprocal given (NULL: IEEE), gs / s as gs times the
 * correctly rounded 1 / s; the figures of the layer gpu_test failed on (a1_gs 0x1.323e34p+9, whose
 * reciprocal the H100 computes one ulp up); a bf16 tie that the step's ulp moves, and a code that
 * the output scale's moves. */
static void triton_division_model(void) {
    T_CASE("qdq_row_triton: the step is s times the reciprocal given");
    float gs[24] = {0x1.323e34p+9f, 2688.0f / 4.5f, 1792.0f / 3.0f, 1.0f + 0x1p-23f, 3.0f * (1.0f + 0x1p-22f), 1.0f};
    uint64_t r = 17;
    for (int i = 6; i < 24; i++) gs[i] = (float)exp2(-12.0 + 24.0 * nvfp4moe_rand_uniform(&r));
    int rn_differs = 0, bad_rn = 0, bad_up = 0, bad_ieee = 0;
    for (int g = 0; g < 24; g++)
        for (int code = 1; code < 0x7F; code++) {
            const float s = nvfp4moe_e4m3_decode((uint8_t)code), rn = 1.0f / gs[g], up = nextafterf(rn, INFINITY);
            bad_rn += qdq_step(gs[g], s, &rn) != s * rn;
            bad_up += qdq_step(gs[g], s, &up) != s * up;
            bad_ieee += qdq_step(gs[g], s, NULL) != s / gs[g];
            rn_differs += s * rn != s / gs[g];
        }
    CHECK(bad_rn == 0 && bad_up == 0, "%d steps are not s * RN(1/gs), %d not s * (RN(1/gs) + 1 ulp)", bad_rn, bad_up);
    CHECK(bad_ieee == 0, "%d steps without a reciprocal are not s / gs", bad_ieee);
    CHECK(rn_differs > 0, "s * RN(1/gs) is s / gs for every E4M3 s and these global scales");
    printf("test_emulation: s * RN(1/gs) != s / gs for %d of %d (s, gs)\n", rn_differs, 24 * 126);

    T_CASE("qdq_row_triton: the H100's reciprocal of 0x1.323e34p+9");
    const float a1 = 0x1.323e34p+9f, hw = 0x1.ac0002p-10f;
    const float probe[4][2] = {{0x1.6p+8f, 0x1.264002p-1f}, {0x1.8p+8f, 0x1.410002p-1f},
                               {0x1.ap+8f, 0x1.5bc002p-1f}, {0x1.cp+8f, 0x1.768002p-1f}};
    CHECK(hw == nextafterf(1.0f / a1, INFINITY), "the probe's reciprocal is RN + 1 ulp");
    for (int i = 0; i < 4; i++) {
        const float got = qdq_step(a1, probe[i][0], &hw);
        CHECK(got == probe[i][1], "s %a: step %a, the GPU's %a", (double)probe[i][0], (double)got, (double)probe[i][1]);
    }
    CHECK(qdq_step(a1, 0x1.6p+8f, NULL) == 0x1.264p-1f && qdq_step(a1, 0x1.8p+8f, NULL) == 0x1.41p-1f,
          "IEEE steps %a %a", (double)qdq_step(a1, 0x1.6p+8f, NULL), (double)qdq_step(a1, 0x1.8p+8f, NULL));

    T_CASE("qdq_row_triton: one ulp of the step moves a bf16 tie");
    {
        /* s = 384: the IEEE step 0x1.41p-1 (= s * RN(1/gs)) is a bf16 tie, rounded to even
         * 0x1.4p-1; the GPU's step one ulp above rounds up to 0x1.42p-1 */
        float x[16] = {0}, ieee[16], rn_out[16], gpu[16];
        x[0] = 6.0f * 384.0f / a1;
        x[1] = x[0] / 6.0f;
        const float rn = 1.0f / a1;
        nvfp4moe_qdq_row_triton(x, 16, a1, NULL, NVFP4MOE_DTYPE_BF16, ieee);
        nvfp4moe_qdq_row_triton(x, 16, a1, &rn, NVFP4MOE_DTYPE_BF16, rn_out);
        nvfp4moe_qdq_row_triton(x, 16, a1, &hw, NVFP4MOE_DTYPE_BF16, gpu);
        CHECK(ieee[1] == 0x1.4p-1f && rn_out[1] == 0x1.4p-1f && gpu[1] == 0x1.42p-1f,
              "the tie: IEEE %a, RN reciprocal %a, the GPU's %a", (double)ieee[1], (double)rn_out[1], (double)gpu[1]);
        CHECK(!memcmp(ieee, rn_out, sizeof ieee) && !memcmp(ieee + 2, gpu + 2, sizeof(float) * 14) && ieee[0] == gpu[0],
              "other values moved");
    }

    T_CASE("qdq_row_triton: the output scale is gs times RN(1/s)");
    {
        /* where fl(gs * RN(1/s)) != gs / s, a value next to the 1.25 threshold takes E2M1 1 with one
         * and 1.5 with the other; with the reciprocal RN(1/gs) the steps are equal, so the output
         * differs by half a step exactly there */
        const float rn = 1.0f / a1;
        int found = 0, wrong = 0;
        for (int code = 1; code < 0x7F; code++) {
            const float s = nvfp4moe_e4m3_decode((uint8_t)code), im = a1 * (1.0f / s), ii = a1 / s;
            if (im == ii) continue;
            float x[16] = {0}, out_m[16], out_i[16];
            x[0] = 6.0f * s / a1;
            for (int d = -64; d <= 64; d++) {
                float v = 1.25f / ii;
                for (int k = 0; k < (d < 0 ? -d : d); k++) v = nextafterf(v, d < 0 ? 0.0f : INFINITY);
                if ((v * im > 1.25f) == (v * ii > 1.25f)) continue;
                x[1] = v;
                nvfp4moe_qdq_row_triton(x, 16, a1, &rn, NVFP4MOE_DTYPE_F32, out_m);
                nvfp4moe_qdq_row_triton(x, 16, a1, NULL, NVFP4MOE_DTYPE_F32, out_i);
                const float step = s * rn;
                found++;
                wrong += out_m[1] != (v * im > 1.25f ? 1.5f : 1.0f) * step ||
                         out_i[1] != (v * ii > 1.25f ? 1.5f : 1.0f) * (s / a1);
            }
        }
        CHECK(found > 0, "no value whose E2M1 code the output scale's ulp moves");
        CHECK(wrong == 0, "%d of %d values off the model", wrong, found);
    }
}

int main(void) {
    snprintf(g_root, sizeof g_root, "/tmp/nvfp4moe-emulation.XXXXXX");
    if (!mkdtemp(g_root)) {
        fprintf(stderr, "test_emulation: mkdtemp: %s\n", strerror(errno));
        return 2;
    }
    quantize_cases();
    layer_cases();
    if (run_python() == 0) {
        check_quantize_cases();
        check_layer_cases();
    }
    remove_tree();
    quantizer_disagreement();
    split_gate_up_scales();
    triton_division_model();
    return t_finish("test_emulation");
}
