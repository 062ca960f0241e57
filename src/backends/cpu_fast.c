/*
 * cpu_fast.c - CPU_FAST: the layer on the CPU at memory speed, W4A4 computed exactly.
 *
 * At plan creation the weights are repacked into 16-row tiles for the SIMD kernels (cpu.h), each
 * thread of the pool repacking the rows it will read (so that on a multi-node machine they live
 * on its node). A forward, per pass of up to `chunk` tokens, in one run of the pool:
 *   A  inputs: each token to float (router weight applied first when asked), then quantized to
 *      NVFP4 for the integer kernels (W4A4: the layer's global scale; per-token: the row's), or
 *      kept float (W4A16) or quantize-dequantized (W4A8-MXFP8) for the float kernels;
 *   B  GEMM1: every thread takes the same share of every active expert's tiles (split by bytes of
 *      weights: at decode the few active experts still use every core); each tile meets its
 *      expert's tokens 8 at a time, so a weight block is decoded once per 8 tokens; the output is
 *      float64;
 *   C  activation (the reference's, in float64) and, for W4A4, rounding to the input dtype and
 *      quantization, per (token, slot) pair;
 *   D  GEMM2 like GEMM1, then E: each thread sums the slots of the output columns it computed
 *      (the same tiles for every expert: no barrier), in slot order, in float32, as the expert-
 *      parallel combine does.
 * Every sum has a fixed order (the integer ones are exact), so a token's output does not depend on
 * the batch it is in, the number of threads or the instruction set.
 */
#include "backends/backends.h"
#include "backends/cpu.h"
#include "reference/reference.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Workspace bytes a pass may use: more tokens go in several passes over the weights. */
#define PASS_BYTES ((size_t)256 << 20)

typedef struct {
    nvfp4moe_config cfg;
    nvfp4moe_weights w;           /* the per-expert vectors (copies); matrices NULL */
    float *vecs;                  /* their storage */
    uint8_t *w13, *w2;            /* repacked, expert after expert */
    size_t bytes13, bytes2;       /* one expert's repacked w13 / w2 */
    int64_t kp1, kp2;             /* H and I padded to whole superblocks */
    bool qpath;                   /* W4A4 schemes: the integer kernels */
    const nvfp4moe_cpu_kernels *k;
    nvfp4moe_cpu_pool *pool;
    pthread_mutex_t lock;         /* one forward at a time (the workspace) */
    char *ws;
    size_t ws_size;
    int64_t chunk;                /* tokens per pass */
    size_t scratch;               /* per-thread scratch bytes */
} fast_state;

static int64_t n1_of(const fast_state *s) { return nvfp4moe_config_n1(&s->cfg); }
/* Bytes of a quantized row's blocks for kp (padded) columns. */
static size_t qrow_bytes(int64_t kp) { return sizeof(nvfp4moe_cpu_qblock) * (size_t)(kp / 16); }

// ---- creation: copies of the small tensors, the repacking ----

static nvfp4moe_status copy_vectors(fast_state *s, const nvfp4moe_weights *w) {
    const nvfp4moe_config *c = &s->cfg;
    const int64_t E = c->num_experts, H = c->hidden_size, N1 = nvfp4moe_config_n1(c);
    struct { const float *src; const float **dst; int64_t n; } v[] = {
        {w->w13_scale_2, &s->w.w13_scale_2, E},
        {w->w2_scale_2, &s->w.w2_scale_2, E},
        {w->w13_input_scale, &s->w.w13_input_scale, E},
        {w->w2_input_scale, &s->w.w2_input_scale, E},
        {c->has_bias ? w->w13_bias : NULL, &s->w.w13_bias, E * N1},
        {c->has_bias ? w->w2_bias : NULL, &s->w.w2_bias, E * H},
        {c->has_correction_bias ? w->correction_bias : NULL, &s->w.correction_bias, E},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) total += v[i].src ? (size_t)v[i].n : 0;
    s->vecs = malloc(sizeof(float) * (total + 1));
    NVFP4MOE_RETURN_IF(!s->vecs, NVFP4MOE_ERR_OUT_OF_MEMORY, "CPU_FAST: out of memory");
    float *p = s->vecs;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        if (!v[i].src) continue;
        memcpy(p, v[i].src, sizeof(float) * (size_t)v[i].n);
        *v[i].dst = p;
        p += v[i].n;
    }
    return NVFP4MOE_OK;
}

typedef struct {
    const fast_state *s;
    const nvfp4moe_weights *w;
} repack_job;

/* Each thread repacks, for every expert, the tiles it reads in a forward. */
static void repack_task(void *ctx, int tid, int nthreads) {
    const repack_job *j = ctx;
    const fast_state *s = j->s;
    const int64_t E = s->cfg.num_experts, H = s->cfg.hidden_size, I = s->cfg.intermediate_size, N1 = n1_of(s);
    int64_t a, b;
    for (int64_t e = 0; e < E; e++) {
        nvfp4moe_cpu_split(N1 / 16, tid, nthreads, &a, &b);
        nvfp4moe_cpu_repack(j->w->w13 + e * N1 * H / 2, j->w->w13_scale + e * N1 * H / 16, H, a, b,
                            s->w13 + (size_t)e * s->bytes13);
        nvfp4moe_cpu_split(H / 16, tid, nthreads, &a, &b);
        nvfp4moe_cpu_repack(j->w->w2 + e * H * I / 2, j->w->w2_scale + e * H * I / 16, I, a, b,
                            s->w2 + (size_t)e * s->bytes2);
    }
}

static void fast_destroy(void *state) {
    fast_state *s = state;
    if (!s) return;
    nvfp4moe_cpu_pool_put(s->pool);
    pthread_mutex_destroy(&s->lock);
    free(s->w13);
    free(s->w2);
    free(s->vecs);
    free(s->ws);
    free(s);
}

/* n bytes at 64-byte alignment; from 2 MiB on, 2 MiB aligned and advised to use transparent huge
 * pages (a gigabyte of weights is then 512 page faults instead of 262144 at creation, and the
 * streams of a forward miss the TLB 512 times less). NULL on overflow or out of memory. */
static void *alloc_big(size_t n) {
    const size_t huge = (size_t)2 << 20, align = n >= huge ? huge : 64;
    if (n > SIZE_MAX - huge) return NULL;
    const size_t len = (n + align - 1) / align * align;
    void *p = aligned_alloc(align, len);
#ifdef MADV_HUGEPAGE
    if (p && align == huge) madvise(p, len, MADV_HUGEPAGE);   /* advice only: ignore refusals */
#endif
    return p;
}

static nvfp4moe_status fast_create(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                   const nvfp4moe_plan_options *opt, const nvfp4moe_device *dev, void **state) {
    NVFP4MOE_RETURN_IF(opt->weights_on_device, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "backend CPU_FAST runs on the host but the weights are in device memory");
    int nthreads = opt->num_threads;
    if (nthreads == 0) NVFP4MOE_TRY(nvfp4moe_cpu_default_threads(&nthreads));
    const nvfp4moe_cpu_kernels *k;
    NVFP4MOE_TRY(nvfp4moe_cpu_kernels_select(&k));

    fast_state *s = calloc(1, sizeof *s);
    NVFP4MOE_RETURN_IF(!s, NVFP4MOE_ERR_OUT_OF_MEMORY, "CPU_FAST: out of memory");
    pthread_mutex_init(&s->lock, NULL);
    s->cfg = *cfg;
    s->k = k;
    s->qpath = cfg->scheme == NVFP4MOE_SCHEME_W4A4 || cfg->scheme == NVFP4MOE_SCHEME_W4A4_PER_TOKEN;
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size, N1 = n1_of(s);
    s->kp1 = nvfp4moe_cpu_superblocks(H) * NVFP4MOE_CPU_SB_COLS;
    s->kp2 = nvfp4moe_cpu_superblocks(I) * NVFP4MOE_CPU_SB_COLS;
    s->bytes13 = (size_t)(N1 / 16) * nvfp4moe_cpu_tile_bytes(H);
    s->bytes2 = (size_t)(H / 16) * nvfp4moe_cpu_tile_bytes(I);
    nvfp4moe_status st = copy_vectors(s, w);
    if (st == NVFP4MOE_OK) {
        /* Not touched here: each page is first written by the thread that will read it. */
        s->w13 = (size_t)E <= SIZE_MAX / s->bytes13 ? alloc_big((size_t)E * s->bytes13) : NULL;
        s->w2 = (size_t)E <= SIZE_MAX / s->bytes2 ? alloc_big((size_t)E * s->bytes2) : NULL;
        if (!s->w13 || !s->w2)
            st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "CPU_FAST: out of memory for the repacked weights (%.1f MB)",
                                    (double)E * (double)(s->bytes13 + s->bytes2) / 1e6);
    }
    if (st == NVFP4MOE_OK) st = nvfp4moe_cpu_pool_get(nthreads, &s->pool);
    if (st != NVFP4MOE_OK) {
        fast_destroy(s);
        return st;
    }
    repack_job j = {s, w};
    nvfp4moe_cpu_pool_run(s->pool, repack_task, &j);

    /* Per token of a pass: its input row, and per pair GEMM1's output, GEMM2's input and output. */
    const int64_t K = cfg->top_k;
    const size_t in1 = s->qpath ? sizeof(nvfp4moe_cpu_qrow) + qrow_bytes(s->kp1) : sizeof(float) * (size_t)s->kp1;
    const size_t in2 = s->qpath ? sizeof(nvfp4moe_cpu_qrow) + qrow_bytes(s->kp2) : sizeof(float) * (size_t)s->kp2;
    const size_t per_token = in1 + 64 + (size_t)K * (sizeof(double) * (size_t)N1 + in2 + sizeof(float) * (size_t)H + 128);
    s->chunk = (int64_t)NVFP4MOE_MAX((size_t)1, PASS_BYTES / per_token);
    const int64_t wide = NVFP4MOE_MAX(H, I);
    s->scratch = (sizeof(double) * (size_t)I + sizeof(float) * (size_t)wide +
                  (size_t)wide / 2 + (size_t)wide / 16 + sizeof(int64_t) * NVFP4MOE_CPU_MAX_NT * NVFP4MOE_CPU_TILE_ROWS +
                  6 * 64 + 63) / 64 * 64;
    *state = s;
    return NVFP4MOE_OK;
}

static size_t fast_workspace(const void *state, int64_t num_tokens) { return 0; }

// ---- the forward ----

typedef struct {
    const fast_state *s;
    const nvfp4moe_io *io;
    int64_t t0, m, P;                     /* this pass: tokens [t0, t0 + m), P = m * top_k pairs */
    const float *wts;                     /* [M, top_k] */
    int64_t *start, *order;               /* the pass's pairs grouped by expert */
    float a1_gs, a2_gs;                   /* W4A4's global scales */
    nvfp4moe_cpu_qrow *x1q, *x2q;         /* integer path: inputs of GEMM1 (per token) and GEMM2 */
    float *x1f, *x2f;                     /* float path: the same, [m, kp1] and [P, kp2] */
    double *h;                            /* [P, N1] GEMM1's output, by grouped position */
    float *y;                             /* [P, H] GEMM2's output, by pair */
    char *scratch;                        /* per thread, `stride` bytes each */
    size_t stride;
} pass;

typedef struct {
    double *act;                          /* [I] */
    float *row;                           /* [max(H, I)] */
    uint8_t *qs;                          /* the quantizer's [max(H, I) * 9/16] */
    void *out;                            /* a kernel's output */
    const nvfp4moe_cpu_qblock **qrows;    /* [P] one expert's rows */
    const float **frows;                  /* [P] */
    double *factor;                       /* [P] */
} scratch_view;

static scratch_view scratch_of(const pass *p, int tid) {
    const fast_state *s = p->s;
    const int64_t H = s->cfg.hidden_size, I = s->cfg.intermediate_size, wide = NVFP4MOE_MAX(H, I);
    char *b = p->scratch + (size_t)tid * p->stride;
    scratch_view v;
    v.act = (double *)b;
    v.row = (float *)(v.act + I);
    v.qs = (uint8_t *)(v.row + wide);
    v.out = (void *)(((uintptr_t)(v.qs + wide / 2 + wide / 16) + 63) / 64 * 64);
    v.qrows = (const nvfp4moe_cpu_qblock **)((char *)v.out + sizeof(int64_t) * NVFP4MOE_CPU_MAX_NT * NVFP4MOE_CPU_TILE_ROWS);
    v.frows = (const float **)v.qrows;
    v.factor = (double *)(v.qrows + p->P);
    return v;
}

/* A: token t of the pass to GEMM1's input. */
static void prepare_token(const pass *p, int64_t t, scratch_view *sv) {
    const fast_state *s = p->s;
    const nvfp4moe_config *c = &s->cfg;
    const int64_t H = c->hidden_size, K = c->top_k, g = p->t0 + t;
    const char *hidden = (const char *)p->io->hidden + (size_t)(g * H) * nvfp4moe_dtype_size(c->in_dtype);
    if (s->qpath) {
        /* The reference's inputs before its quantize-dequantize, then the codec's quantization. */
        nvfp4moe_config raw = *c;
        raw.scheme = NVFP4MOE_SCHEME_W4A16;
        float unused;
        nvfp4moe_prepare_inputs(&raw, &s->w, hidden, 1, p->wts + g * K, sv->row, &unused);
        float gs = c->scheme == NVFP4MOE_SCHEME_W4A4 ? p->a1_gs : nvfp4moe_per_token_global_scale(sv->row, H);
        s->k->quantize(sv->row, H, gs, &p->x1q[t], sv->qs);
    } else {
        float *x = p->x1f + t * s->kp1, unused;
        nvfp4moe_prepare_inputs(c, &s->w, hidden, 1, p->wts + g * K, x, &unused);
        memset(x + H, 0, sizeof(float) * (size_t)(s->kp1 - H));
    }
}

/* C: pair q (grouped position) from GEMM1's output to GEMM2's input. */
static void activate_pair(const pass *p, int64_t q, scratch_view *sv) {
    const fast_state *s = p->s;
    const nvfp4moe_config *c = &s->cfg;
    const int64_t I = c->intermediate_size;
    nvfp4moe_activation_ref(c, p->h + q * n1_of(s), sv->act);
    if (c->scheme == NVFP4MOE_SCHEME_W4A16) {
        float *x = p->x2f + q * s->kp2;
        for (int64_t i = 0; i < I; i++) x[i] = (float)sv->act[i];
        memset(x + I, 0, sizeof(float) * (size_t)(s->kp2 - I));
        return;
    }
    /* Quantizers read the intermediate in the activation dtype, as the reference does. */
    for (int64_t i = 0; i < I; i++) sv->row[i] = nvfp4moe_round_to_dtype(c->in_dtype, (float)sv->act[i]);
    if (s->qpath) {
        float gs = c->scheme == NVFP4MOE_SCHEME_W4A4 ? p->a2_gs : nvfp4moe_per_token_global_scale(sv->row, I);
        s->k->quantize(sv->row, I, gs, &p->x2q[q], sv->qs);
    } else {
        float *x = p->x2f + q * s->kp2;
        nvfp4moe_quantize_activation_row(c->scheme, sv->row, I, 1.0f, x);
        memset(x + I, 0, sizeof(float) * (size_t)(s->kp2 - I));
    }
}

/* B and D: this thread's tiles of every active expert's matrix against the expert's pairs. GEMM1
 * writes h (float64, by grouped position); GEMM2 writes y (float32, by pair). */
static void gemm_phase(const pass *p, int tid, int nthreads, bool gemm1, scratch_view *sv) {
    const fast_state *s = p->s;
    const nvfp4moe_config *c = &s->cfg;
    const int64_t E = c->num_experts, K = c->top_k, H = c->hidden_size, N1 = n1_of(s);
    const int64_t rows = gemm1 ? N1 : H, nsb = nvfp4moe_cpu_superblocks(gemm1 ? H : c->intermediate_size);
    const size_t tb = nvfp4moe_cpu_tile_bytes(gemm1 ? H : c->intermediate_size);
    const uint8_t *wbase = gemm1 ? s->w13 : s->w2;
    const size_t wbytes = gemm1 ? s->bytes13 : s->bytes2;
    const float *scale_2 = gemm1 ? s->w.w13_scale_2 : s->w.w2_scale_2;
    const float *bias = !c->has_bias ? NULL : gemm1 ? s->w.w13_bias : s->w.w2_bias;
    int64_t t0, t1;
    nvfp4moe_cpu_split(rows / 16, tid, nthreads, &t0, &t1);
    int64_t *qout = sv->out;
    float *fout = sv->out;
    for (int64_t e = 0; e < E; e++) {
        const int64_t q0 = p->start[e], n = p->start[e + 1] - q0;
        if (n == 0) continue;
        /* The expert's rows of activations, and per row the factor of the integer sums: exact sum *
         * 2^-20 * scale_2 / gs, the only roundings, in float64. */
        for (int64_t i = 0; i < n; i++) {
            const int64_t q = q0 + i, tok = p->order[q] / K;
            if (s->qpath) {
                const nvfp4moe_cpu_qrow *x = gemm1 ? &p->x1q[tok] : &p->x2q[q];
                sv->qrows[i] = x->blk;
                sv->factor[i] = x->nan ? NAN : (double)scale_2[e] / (double)x->gs * 0x1p-20;
            } else {
                sv->frows[i] = gemm1 ? p->x1f + tok * s->kp1 : p->x2f + q * s->kp2;
            }
        }
        const uint8_t *we = wbase + (size_t)e * wbytes;
        int64_t enext = e + 1;   /* the next active expert: its first tile follows this one's last */
        while (enext < E && p->start[enext] == p->start[enext + 1]) enext++;
        /* Tile by tile, so that a tile stays in cache while all the expert's rows go by. With several
         * rows the next tile is asked for as this one starts (the kernels alone then leave the memory
         * idle half the time); with any, the next expert's first tile as this one's last starts. */
        for (int64_t t = t0; t < t1; t++) {
            const uint8_t *tile = we + (size_t)t * tb;
            if (t + 1 < t1 && n > 2) nvfp4moe_cpu_prefetch(tile + tb, tb);
            else if (t + 1 == t1 && enext < E) nvfp4moe_cpu_prefetch(wbase + (size_t)enext * wbytes + (size_t)t0 * tb, tb);
            for (int64_t c0 = 0; c0 < n; c0 += NVFP4MOE_CPU_MAX_NT) {
                const int nt = (int)NVFP4MOE_MIN((int64_t)NVFP4MOE_CPU_MAX_NT, n - c0);
                if (s->qpath) s->k->gemm_q(tile, nsb, sv->qrows + c0, nt, qout);
                else s->k->gemm_f(tile, nsb, sv->frows + c0, nt, fout);
                for (int i = 0; i < nt; i++) {
                    const int64_t q = q0 + c0 + i;
                    double *h = p->h + q * N1 + 16 * t;
                    float *y = p->y + p->order[q] * H + 16 * t;
                    const float *b = bias ? bias + e * rows + 16 * t : NULL;
                    for (int r = 0; r < NVFP4MOE_CPU_TILE_ROWS; r++) {
                        const double v = s->qpath ? (double)qout[16 * i + r] * sv->factor[c0 + i]
                                                  : (double)(fout[16 * i + r] * scale_2[e]);
                        const double out = v + (b ? (double)b[r] : 0.0);
                        if (gemm1) h[r] = out;
                        else y[r] = (float)out;
                    }
                }
            }
        }
    }
}

/* E: the weighted sum of each token's slots over this thread's output columns (GEMM2's tiles). */
static void combine_phase(const pass *p, int tid, int nthreads, scratch_view *sv) {
    const nvfp4moe_config *c = &p->s->cfg;
    const int64_t H = c->hidden_size, K = c->top_k;
    const size_t osz = nvfp4moe_dtype_size(c->out_dtype);
    int64_t t0, t1;
    nvfp4moe_cpu_split(H / 16, tid, nthreads, &t0, &t1);
    const int64_t c0 = 16 * t0, n = 16 * (t1 - t0);
    if (n == 0) return;
    float *a = sv->row;
    for (int64_t t = 0; t < p->m; t++) {
        const int64_t g = p->t0 + t;
        for (int64_t i = 0; i < n; i++) a[i] = 0.0f;
        for (int64_t j = 0; j < K; j++) {   /* slot order, as the expert-parallel combine */
            const float w = c->apply_router_weight_on_input ? 1.0f : p->wts[g * K + j], *y = p->y + (t * K + j) * H + c0;
            for (int64_t i = 0; i < n; i++) a[i] += w * y[i];
        }
        nvfp4moe_from_float(c->out_dtype, a, n, (char *)p->io->output + (size_t)(g * H + c0) * osz);
    }
}

static void forward_task(void *ctx, int tid, int nthreads) {
    const pass *p = ctx;
    scratch_view sv = scratch_of(p, tid);
    int64_t a, b;
    nvfp4moe_cpu_split(p->m, tid, nthreads, &a, &b);
    for (int64_t t = a; t < b; t++) prepare_token(p, t, &sv);
    nvfp4moe_cpu_pool_barrier(p->s->pool);
    gemm_phase(p, tid, nthreads, true, &sv);
    nvfp4moe_cpu_pool_barrier(p->s->pool);
    nvfp4moe_cpu_split(p->P, tid, nthreads, &a, &b);
    for (int64_t q = a; q < b; q++) activate_pair(p, q, &sv);
    nvfp4moe_cpu_pool_barrier(p->s->pool);
    gemm_phase(p, tid, nthreads, false, &sv);
    combine_phase(p, tid, nthreads, &sv);
}

/* Per-thread scratch bytes for a pass of P pairs: the fixed part, then per pair a row pointer and
 * a factor. */
static size_t scratch_stride(const fast_state *s, int64_t P) {
    return s->scratch + ((size_t)P * (sizeof(void *) + sizeof(double)) + 63) / 64 * 64;
}

/* Carves the workspace of a pass of m tokens out of s->ws (growing it); NULL pointers when count
 * is 0. Returns false when out of memory. */
static bool carve(fast_state *s, int64_t m, int nthreads, pass *p) {
    const nvfp4moe_config *c = &s->cfg;
    const int64_t E = c->num_experts, K = c->top_k, H = c->hidden_size, N1 = n1_of(s), P = m * K;
    const size_t qb1 = qrow_bytes(s->kp1), qb2 = qrow_bytes(s->kp2);
    size_t sizes[9] = {
        sizeof(int64_t) * (size_t)(E + 1),                               /* start */
        sizeof(int64_t) * (size_t)P,                                     /* order */
        s->qpath ? sizeof(nvfp4moe_cpu_qrow) * (size_t)m : 0,            /* x1q */
        s->qpath ? qb1 * (size_t)m : sizeof(float) * (size_t)(m * s->kp1), /* x1 data */
        sizeof(double) * (size_t)(P * N1),                               /* h */
        s->qpath ? sizeof(nvfp4moe_cpu_qrow) * (size_t)P : 0,            /* x2q */
        s->qpath ? qb2 * (size_t)P : sizeof(float) * (size_t)(P * s->kp2), /* x2 data */
        sizeof(float) * (size_t)(P * H),                                 /* y */
        scratch_stride(s, P) * (size_t)nthreads,                         /* scratch */
    };
    size_t off[9], total = 0;
    for (int i = 0; i < 9; i++) {
        off[i] = total;
        total += (sizes[i] + 63) / 64 * 64;
    }
    if (total > s->ws_size) {
        free(s->ws);
        s->ws_size = 0;
        s->ws = alloc_big(total);
        if (!s->ws) return false;
        s->ws_size = total;
    }
    char *w = s->ws;
    p->start = (int64_t *)(w + off[0]);
    p->order = (int64_t *)(w + off[1]);
    p->h = (double *)(w + off[4]);
    p->y = (float *)(w + off[7]);
    p->scratch = w + off[8];
    p->stride = scratch_stride(s, P);
    if (s->qpath) {
        p->x1q = (nvfp4moe_cpu_qrow *)(w + off[2]);
        p->x2q = (nvfp4moe_cpu_qrow *)(w + off[5]);
        for (int64_t t = 0; t < m; t++) p->x1q[t].blk = (nvfp4moe_cpu_qblock *)(w + off[3] + (size_t)t * qb1);
        for (int64_t q = 0; q < P; q++) p->x2q[q].blk = (nvfp4moe_cpu_qblock *)(w + off[6] + (size_t)q * qb2);
    } else {
        p->x1f = (float *)(w + off[3]);
        p->x2f = (float *)(w + off[6]);
    }
    return true;
}

static nvfp4moe_status fast_forward(void *state, const nvfp4moe_io *io, void *stream) {
    fast_state *s = state;
    const nvfp4moe_config *c = &s->cfg;
    NVFP4MOE_TRY(nvfp4moe_check_io(c, io));
    const int64_t M = io->num_tokens, K = c->top_k, E = c->num_experts;
    if (M == 0) return NVFP4MOE_OK;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(M * K));
    float *wts = malloc(sizeof(float) * (size_t)(M * K));
    nvfp4moe_status st = NVFP4MOE_OK;
    if (!ids || !wts) {
        st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "CPU_FAST: out of memory for %lld tokens", (long long)M);
        goto done;
    }
    if ((st = nvfp4moe_routing_for_io(c, &s->w, io, ids, wts)) != NVFP4MOE_OK) goto done;
    pass p = {.s = s, .io = io, .wts = wts};
    nvfp4moe_w4a4_global_scales(c, &s->w, &p.a1_gs, &p.a2_gs);
    pthread_mutex_lock(&s->lock);
    const int nthreads = nvfp4moe_cpu_pool_size(s->pool);
    for (int64_t t0 = 0; t0 < M && st == NVFP4MOE_OK; t0 += s->chunk) {
        p.t0 = t0;
        p.m = NVFP4MOE_MIN(s->chunk, M - t0);
        p.P = p.m * K;
        if (!carve(s, p.m, nthreads, &p)) {
            st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "CPU_FAST: out of memory for %lld tokens", (long long)p.m);
            break;
        }
        if ((st = nvfp4moe_group_by_expert(ids + t0 * K, p.P, E, p.start, p.order)) != NVFP4MOE_OK)
            break;
        nvfp4moe_cpu_pool_run(s->pool, forward_task, &p);
    }
    pthread_mutex_unlock(&s->lock);
    if (st == NVFP4MOE_OK) nvfp4moe_nan_rows(c, io);
done:
    free(ids);
    free(wts);
    return st;
}

static nvfp4moe_scheme same_scheme(nvfp4moe_scheme s) { return s; }

const nvfp4moe_backend_impl nvfp4moe_impl_cpu_fast = {
    .device_memory = false,
    .effective_scheme = same_scheme,
    .create = fast_create,
    .workspace_size = fast_workspace,
    .forward = fast_forward,
    .destroy = fast_destroy,
};
