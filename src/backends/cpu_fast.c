/*
 * cpu_fast.c - CPU_FAST: the layer on the CPU at memory speed, W4A4 computed exactly.
 *
 * At plan creation the weights are repacked into 16-row tiles for the SIMD kernels (cpu.h), each
 * thread of the pool repacking the tiles of its share (below; so that on a multi-node machine they
 * live on its node). A forward, per pass of up to `chunk` tokens, is one run of the pool (the
 * caller only checks the io and lays out the workspace):
 *   A  routing (the reference router, a token per thread; skipped when io gives the top-k) and the
 *      inputs: each token to float (router weight applied first when asked: then after the
 *      routing and a barrier), its NaN / infinity check, then quantized to
 *      NVFP4 for the integer kernels (W4A4: the layer's global scale; per-token: the row's), or
 *      kept float (W4A16) or quantize-dequantized (W4A8-MXFP8) for the float kernels. Blocks are
 *      independent, so the tokens are cut in pieces of INPUT_COLS columns shared by all threads
 *      (per-token scales need a whole row: there, whole tokens);
 *   B  each thread groups the pairs by expert itself (the same counting sort, no barrier); GEMM1
 *      and the activation, in chunks the threads claim as they go (see "the GEMM phases' chunks"):
 *      a thread's share is the same columns [j0, j1) of the intermediate for every active expert,
 *      that is its gate and up tiles (work split by bytes of weights: at decode the few active
 *      experts still use every core), cut into chunks of one expert each; a thread claims its own
 *      share's chunks, then the others'. Each tile meets its expert's tokens 8 at a time, so a
 *      weight block is decoded once per 8 tokens; the float64 output goes straight through the
 *      reference's activation and, for W4A4 and W4A16, into GEMM2's input blocks of the chunk's
 *      columns. W4A4 per-token and W4A8 quantize whole rows: after a barrier, a pass over the rows
 *      (split by rows);
 *   C  GEMM2 like GEMM1, the shares being output tiles; then each thread, once its share's chunks
 *      have all run (by whichever threads), sums the slots of its share's output columns (no
 *      barrier), in slot order, in float32, as the expert-parallel combine does (or NaN for a
 *      token with non-finite inputs: the host backends' rule).
 * So a forward has two barriers (three for per-token and W4A8). A thread's weight reads are the
 * tiles of the chunks it claims, the next one claimed shortly before the current one ends; its
 * prefetch cursor (cpu.h) runs ahead of the kernels through them, across chunks, experts and from
 * GEMM1 into GEMM2 (so that the barrier before GEMM2 waits with the memory busy). Every sum has a
 * fixed order (the integer ones are exact) and a chunk's results do not depend on who runs it, so
 * a token's output does not depend on the batch it is in, the number of threads, which thread ran
 * which chunk, or the instruction set.
 */
#define _GNU_SOURCE   /* clock_gettime */
#include "backends/backends.h"
#include "backends/cpu.h"
#include "format/format.h"
#include "reference/reference.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* Workspace bytes a pass may use: more tokens go in several passes over the weights. */
#define PASS_BYTES ((size_t)256 << 20)
/* Columns of a token one input piece holds (a multiple of 64: whole superblocks and MXFP8 blocks). */
#define INPUT_COLS 256
/* The chunks a thread's share of a GEMM phase is cut into when NVFP4MOE_CPU_CHUNKS does not say
 * (at least one per active expert; at most one per tile or unit): several per thread, so that the
 * threads that finish first take over the rest of the slower ones' shares and all end within about
 * a chunk of one another. */
#define CHUNKS_DEFAULT 16
#define CHUNKS_MAX 4096
/* Room for a thread's prefetch segments: those of the chunk it runs and of the next (two each at
 * most), and as many to spare. */
#define SEG_CAP 8

typedef struct {
    nvfp4moe_config cfg;
    nvfp4moe_weights w;           /* the per-expert vectors (copies); matrices NULL */
    float *vecs;                  /* their storage */
    uint8_t *w13, *w2;            /* repacked, expert after expert */
    size_t bytes13, bytes2;       /* one expert's repacked w13 / w2 */
    size_t tb1, tb2;              /* one tile of w13 / w2 */
    int64_t kp1, kp2;             /* H and I padded to whole superblocks */
    bool qpath;                   /* W4A4 schemes: the integer kernels */
    bool row_pass;                /* W4A4 per-token, W4A8: GEMM2's input quantized row by row */
    const nvfp4moe_cpu_kernels *k;
    nvfp4moe_cpu_prefetch pf;
    nvfp4moe_cpu_pool *pool;
    pthread_mutex_t lock;         /* one forward at a time (the workspace, the profile) */
    char *ws;
    size_t ws_size;
    float a1_gs, a2_gs;           /* W4A4's global scales (1 for the other schemes) */
    int64_t chunk;                /* tokens per pass */
    size_t scratch;               /* per-thread scratch bytes (the fixed part) */
    nvfp4moe_cpu_profile *prof;   /* when recording */
    nvfp4moe_cpu_steer steer;     /* the tests' steering of the work claiming (none: zeros) */
    int64_t chunks;               /* a share's chunks (CHUNKS_DEFAULT, or NVFP4MOE_CPU_CHUNKS) */
} fast_state;

static int64_t n1_of(const fast_state *s) { return nvfp4moe_config_n1(&s->cfg); }
/* Bytes of a quantized row's blocks for kp (padded) columns. */
static size_t qrow_bytes(int64_t kp) { return sizeof(nvfp4moe_cpu_qblock) * (size_t)(kp / 16); }
static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// ---- who reads what ----

/* A run of consecutive tiles of one matrix. */
typedef struct {
    int64_t t0, n;
} tile_run;

/* The GEMM1 tiles of the intermediate's column units [ja, jb) (a unit: 16 columns, J = I / 16 of
 * them), the same for every expert. Gated layers hold the gate rows then the up rows ([g | u]: two
 * runs), or interleave them (swigluoai: g0, u0, g1, ..., one run of twice the tiles). Returns the
 * number of runs. */
static int unit_runs(const fast_state *s, int64_t ja, int64_t jb, tile_run r[2]) {
    const int64_t J = s->cfg.intermediate_size / 16, n = jb - ja;
    if (n <= 0) return 0;
    if (!nvfp4moe_activation_is_gated(s->cfg.activation)) {
        r[0] = (tile_run){ja, n};
        return 1;
    }
    if (s->cfg.activation == NVFP4MOE_ACT_SWIGLUOAI) {
        r[0] = (tile_run){2 * ja, 2 * n};
        return 1;
    }
    r[0] = (tile_run){ja, n};
    r[1] = (tile_run){J + ja, n};
    return 2;
}

/* Thread tid's share of GEMM1: the units [j0, j1) of J split in nthreads parts, for every expert;
 * its tiles into r. Returns the number of runs. */
static int gemm1_runs(const fast_state *s, int tid, int nthreads, int64_t *j0, int64_t *j1, tile_run r[2]) {
    nvfp4moe_cpu_split(s->cfg.intermediate_size / 16, tid, nthreads, j0, j1);
    return unit_runs(s, *j0, *j1, r);
}

/* Thread tid's share of GEMM2: its part of the H / 16 output tiles, for every expert. */
static tile_run gemm2_run(const fast_state *s, int tid, int nthreads) {
    int64_t a, b;
    nvfp4moe_cpu_split(s->cfg.hidden_size / 16, tid, nthreads, &a, &b);
    return (tile_run){a, b - a};
}

// ---- creation: copies of the small tensors, the repacking ----

static nvfp4moe_status copy_vectors(fast_state *s, const nvfp4moe_weights *w) {
    const nvfp4moe_config *c = &s->cfg;
    const int64_t E = c->num_experts, H = c->hidden_size, N1 = nvfp4moe_config_n1(c);
    struct { const float *src; const float **dst; int64_t n; } v[] = {
        {w->w13_scale_2, &s->w.w13_scale_2, E},
        {w->w13_up_scale_2, &s->w.w13_up_scale_2, E},
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
    int64_t j0, j1;
    tile_run r1[2];
    const int nr = gemm1_runs(s, tid, nthreads, &j0, &j1, r1);
    const tile_run r2 = gemm2_run(s, tid, nthreads);
    for (int64_t e = 0; e < E; e++) {
        for (int i = 0; i < nr; i++)
            nvfp4moe_cpu_repack(j->w->w13 + e * N1 * H / 2, j->w->w13_scale + e * N1 * H / 16, H, r1[i].t0,
                                r1[i].t0 + r1[i].n, s->w13 + (size_t)e * s->bytes13);
        nvfp4moe_cpu_repack(j->w->w2 + e * H * I / 2, j->w->w2_scale + e * H * I / 16, I, r2.t0, r2.t0 + r2.n,
                            s->w2 + (size_t)e * s->bytes2);
    }
}

static void profile_free(nvfp4moe_cpu_profile *p) {
    if (!p) return;
    free(p->thread);
    free(p);
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
    profile_free(s->prof);
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
    nvfp4moe_cpu_prefetch pf;
    NVFP4MOE_TRY(nvfp4moe_cpu_prefetch_default(&pf));
    int64_t chunks = CHUNKS_DEFAULT;
    const char *env = getenv("NVFP4MOE_CPU_CHUNKS");
    if (env && *env) {
        char *end;
        errno = 0;
        const long long v = strtoll(env, &end, 10);
        NVFP4MOE_RETURN_IF(errno || *end || v < 1 || v > CHUNKS_MAX, NVFP4MOE_ERR_INVALID_ARGUMENT,
                           "NVFP4MOE_CPU_CHUNKS='%s' must be an integer in [1, %d]", env, CHUNKS_MAX);
        chunks = v;
    }

    fast_state *s = calloc(1, sizeof *s);
    NVFP4MOE_RETURN_IF(!s, NVFP4MOE_ERR_OUT_OF_MEMORY, "CPU_FAST: out of memory");
    pthread_mutex_init(&s->lock, NULL);
    s->cfg = *cfg;
    s->k = k;
    s->pf = pf;
    s->chunks = chunks;
    s->qpath = cfg->scheme == NVFP4MOE_SCHEME_W4A4 || cfg->scheme == NVFP4MOE_SCHEME_W4A4_PER_TOKEN;
    s->row_pass = cfg->scheme == NVFP4MOE_SCHEME_W4A4_PER_TOKEN || cfg->scheme == NVFP4MOE_SCHEME_W4A8_MXFP8;
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size, N1 = n1_of(s);
    s->kp1 = nvfp4moe_cpu_superblocks(H) * NVFP4MOE_CPU_SB_COLS;
    s->kp2 = nvfp4moe_cpu_superblocks(I) * NVFP4MOE_CPU_SB_COLS;
    s->tb1 = nvfp4moe_cpu_tile_bytes(H);
    s->tb2 = nvfp4moe_cpu_tile_bytes(I);
    s->bytes13 = (size_t)(N1 / 16) * s->tb1;
    s->bytes2 = (size_t)(H / 16) * s->tb2;
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
    nvfp4moe_w4a4_global_scales(cfg, &s->w, &s->a1_gs, &s->a2_gs);

    /* Per token of a pass: its input row, a flag, and per pair GEMM1's output, GEMM2's input (and
     * for the row pass its unquantized values) and output. */
    const int64_t K = cfg->top_k;
    const size_t in1 = s->qpath ? sizeof(nvfp4moe_cpu_qrow) + qrow_bytes(s->kp1) : sizeof(float) * (size_t)s->kp1;
    const size_t in2 = (s->qpath ? sizeof(nvfp4moe_cpu_qrow) + qrow_bytes(s->kp2) : sizeof(float) * (size_t)s->kp2) +
                       (s->row_pass ? sizeof(float) * (size_t)I : 0);
    const size_t per_token = in1 + 64 + (size_t)K * (sizeof(double) * (size_t)N1 + in2 + sizeof(float) * (size_t)H + 128) +
                             (size_t)nthreads * sizeof(int64_t) * (size_t)K;   /* each thread's grouping */
    s->chunk = (int64_t)NVFP4MOE_MAX((size_t)1, PASS_BYTES / per_token);
    const int64_t wide = NVFP4MOE_MAX(H, I);
    s->scratch = round64(sizeof(double) * (size_t)I) + round64(sizeof(float) * (size_t)wide) +
                 round64((size_t)wide / 2 + (size_t)wide / 16) +
                 round64(sizeof(int64_t) * NVFP4MOE_CPU_MAX_NT * NVFP4MOE_CPU_TILE_ROWS) +
                 round64(sizeof(nvfp4moe_cpu_seg) * SEG_CAP) + round64(sizeof(int64_t) * (size_t)E) +
                 round64(nvfp4moe_route_scratch_bytes(cfg)) +
                 round64(sizeof(float) * (size_t)E) + 2 * round64(sizeof(int64_t) * (size_t)(E + 1));
    *state = s;
    return NVFP4MOE_OK;
}

static size_t fast_workspace(const void *state, int64_t num_tokens) { return 0; }

// ---- the forward ----

typedef struct {
    const fast_state *s;
    const nvfp4moe_io *io;
    int64_t t0, m, P;                     /* this pass: tokens [t0, t0 + m), P = m * top_k pairs */
    bool route;                           /* the routing is the task's (else io's top-k) */
    const int32_t *ids;                   /* [m, top_k] the pass's routing */
    const float *wts;                     /* [m, top_k] */
    int32_t *route_ids;                   /* when the task routes: where (= ids, wts) */
    float *route_wts;
    bool logits;                          /* the routing reads io's logits (the non-finite rule) */
    nvfp4moe_cpu_qrow *x1q, *x2q;         /* integer path: inputs of GEMM1 (per token) and GEMM2 */
    float *x1f, *x2f;                     /* float path: the same, [m, kp1] and [P, kp2] */
    float *x2raw;                         /* row pass: GEMM2's input before quantization [P, I] */
    atomic_bool *bad;                     /* [m] the token's inputs hold a NaN or an infinity */
    double *h;                            /* [P, N1] GEMM1's output, by grouped position */
    float *y;                             /* [P, H] GEMM2's output, by pair */
    char *scratch;                        /* per thread, `stride` bytes each */
    size_t stride;
    struct claim *claim;                  /* [2][nthreads] the chunks of each share claimed so far,
                                             GEMM1's then GEMM2's */
    nvfp4moe_cpu_steer steer;
    nvfp4moe_cpu_profile *prof;
} pass;

/* A share's counters, on a cache line of their own: its chunks claimed, and (GEMM2) run. */
struct claim {
    atomic_llong next, done;
    char pad[64 - 2 * sizeof(atomic_llong)];
};

typedef struct {
    int64_t *start, *order;               /* [E + 1], [P]: the pass's pairs grouped by expert (each
                                             thread groups them itself, the same way) */
    int64_t *fill;                        /* [E + 1] */
    void *route;                          /* the router's scratch */
    float *logit;                         /* [E] */
    double *act;                          /* [I] */
    float *row;                           /* [max(H, I)] */
    uint8_t *qs;                          /* the quantizer's [max(H, I) * 9/16] */
    void *out;                            /* a kernel's output */
    nvfp4moe_cpu_seg *segs;               /* [SEG_CAP] the thread's weight reads to come */
    int64_t *active;                      /* [E] the active experts, in order */
    int64_t nact;
    const nvfp4moe_cpu_qblock **qrows;    /* [P] one expert's rows */
    const float **frows;                  /* [P] */
    double *factor;                       /* [P] per row: the integer sums' factor (gate rows, GEMM2) */
    double *factor_up;                    /* [P] the same for GEMM1's up rows */
} scratch_view;

static scratch_view scratch_of(const pass *p, int tid) {
    const fast_state *s = p->s;
    const int64_t H = s->cfg.hidden_size, I = s->cfg.intermediate_size, wide = NVFP4MOE_MAX(H, I);
    const int64_t E = s->cfg.num_experts;
    char *b = p->scratch + (size_t)tid * p->stride;
    scratch_view v;
    v.start = (int64_t *)b;
    b += round64(sizeof(int64_t) * (size_t)(E + 1));
    v.fill = (int64_t *)b;
    b += round64(sizeof(int64_t) * (size_t)(E + 1));
    v.route = b;
    b += round64(nvfp4moe_route_scratch_bytes(&s->cfg));
    v.logit = (float *)b;
    b += round64(sizeof(float) * (size_t)E);
    v.act = (double *)b;
    b += round64(sizeof(double) * (size_t)I);
    v.row = (float *)b;
    b += round64(sizeof(float) * (size_t)wide);
    v.qs = (uint8_t *)b;
    b += round64((size_t)wide / 2 + (size_t)wide / 16);
    v.out = b;
    b += round64(sizeof(int64_t) * NVFP4MOE_CPU_MAX_NT * NVFP4MOE_CPU_TILE_ROWS);
    v.segs = (nvfp4moe_cpu_seg *)b;
    b += round64(sizeof(nvfp4moe_cpu_seg) * SEG_CAP);
    v.active = (int64_t *)b;
    v.nact = 0;
    b += round64(sizeof(int64_t) * (size_t)E);
    v.qrows = (const nvfp4moe_cpu_qblock **)b;
    v.frows = (const float **)b;
    v.factor = (double *)(b + sizeof(void *) * (size_t)p->P);
    v.factor_up = v.factor + p->P;
    v.order = (int64_t *)(b + (sizeof(void *) + 2 * sizeof(double)) * (size_t)p->P);
    return v;
}

/* A: columns [c0, c1) of token t of the pass to GEMM1's input (c0 = 0, c1 = H for per-token). */
static void prepare_input(const pass *p, int64_t t, int64_t c0, int64_t c1, scratch_view *sv) {
    const fast_state *s = p->s;
    const nvfp4moe_config *c = &s->cfg;
    const int64_t H = c->hidden_size, K = c->top_k, g = p->t0 + t, n = c1 - c0;
    float *x = sv->row;
    nvfp4moe_to_float(c->in_dtype, (const char *)p->io->hidden + (size_t)(g * H + c0) * nvfp4moe_dtype_size(c->in_dtype), n, x);
    bool bad = false;
    for (int64_t i = 0; i < n; i++) bad |= !isfinite(x[i]);
    if (c0 == 0 && p->logits)
        bad |= nvfp4moe_values_nonfinite(c->router_logits_dtype,
                                         (const char *)p->io->router_logits +
                                             (size_t)(g * c->num_experts) * nvfp4moe_dtype_size(c->router_logits_dtype),
                                         c->num_experts);
    if (bad) atomic_store_explicit(&p->bad[t], true, memory_order_relaxed);
    /* The router weight is applied first when the model asks for it (Llama4), in the input dtype,
     * as the reference's inputs are made (nvfp4moe_prepare_inputs). */
    if (c->apply_router_weight_on_input)
        for (int64_t i = 0; i < n; i++) x[i] = nvfp4moe_round_to_dtype(c->in_dtype, x[i] * p->wts[t * K]);
    switch (c->scheme) {
    case NVFP4MOE_SCHEME_W4A4_PER_TOKEN:
        nvfp4moe_cpu_quantize_row(s->k, x, H, nvfp4moe_per_token_global_scale(x, H), &p->x1q[t], sv->qs);
        return;
    case NVFP4MOE_SCHEME_W4A4: {
        nvfp4moe_cpu_qrow *r = &p->x1q[t];
        if (s->k->quantize_blocks(x, n / 16, s->a1_gs, r->blk + c0 / 16, sv->qs))
            atomic_store_explicit(&r->nan, true, memory_order_relaxed);
        if (c1 == H) memset(r->blk + H / 16, 0, sizeof(nvfp4moe_cpu_qblock) * (size_t)((s->kp1 - H) / 16));
        return;
    }
    default: {
        float *dst = p->x1f + t * s->kp1;
        if (c->scheme == NVFP4MOE_SCHEME_W4A8_MXFP8) nvfp4moe_mxfp8_qdq_row(x, n, dst + c0);
        else memcpy(dst + c0, x, sizeof(float) * (size_t)n);
        if (c1 == H) memset(dst + H, 0, sizeof(float) * (size_t)(s->kp1 - H));
        return;
    }
    }
}

static void inputs_phase(const pass *p, int tid, int nthreads, scratch_view *sv) {
    const int64_t H = p->s->cfg.hidden_size;
    const bool whole = p->s->cfg.scheme == NVFP4MOE_SCHEME_W4A4_PER_TOKEN;
    const int64_t pieces = whole ? 1 : NVFP4MOE_CEIL_DIV(H, (int64_t)INPUT_COLS);
    int64_t a, b;
    nvfp4moe_cpu_split(p->m * pieces, tid, nthreads, &a, &b);
    for (int64_t i = a; i < b; i++) {
        const int64_t t = i / pieces, c0 = whole ? 0 : (i % pieces) * INPUT_COLS;
        prepare_input(p, t, c0, whole ? H : NVFP4MOE_MIN(H, c0 + INPUT_COLS), sv);
    }
}

/* B, after GEMM1's tiles of an expert: columns [lo, hi) of the activation of pair q (grouped
 * position) into GEMM2's input. */
static void activate(const pass *p, int64_t q, int64_t lo, int64_t hi, scratch_view *sv) {
    const fast_state *s = p->s;
    const nvfp4moe_config *c = &s->cfg;
    const int64_t I = c->intermediate_size;
    nvfp4moe_activation_ref_range(c, p->h + q * n1_of(s), lo, hi, sv->act);
    if (c->scheme == NVFP4MOE_SCHEME_W4A16) {
        float *x = p->x2f + q * s->kp2;
        for (int64_t i = lo; i < hi; i++) x[i] = (float)sv->act[i];
        if (hi == I) memset(x + I, 0, sizeof(float) * (size_t)(s->kp2 - I));
        return;
    }
    /* Quantizers read the intermediate in the activation dtype, as the reference does. */
    float *x = s->row_pass ? p->x2raw + q * I + lo : sv->row;
    for (int64_t i = lo; i < hi; i++) x[i - lo] = (float)sv->act[i];
    nvfp4moe_round_row_to_dtype(c->in_dtype, x, hi - lo);
    if (s->row_pass) return;
    nvfp4moe_cpu_qrow *r = &p->x2q[q];
    if (s->k->quantize_blocks(x, (hi - lo) / 16, s->a2_gs, r->blk + lo / 16, sv->qs))
        atomic_store_explicit(&r->nan, true, memory_order_relaxed);
    if (hi == I) memset(r->blk + I / 16, 0, sizeof(nvfp4moe_cpu_qblock) * (size_t)((s->kp2 - I) / 16));
}

/* W4A4 per-token and W4A8: pair q's row of GEMM2's input, whole. */
static void quantize_pair(const pass *p, int64_t q, scratch_view *sv) {
    const fast_state *s = p->s;
    const int64_t I = s->cfg.intermediate_size;
    const float *x = p->x2raw + q * I;
    if (s->qpath) {
        nvfp4moe_cpu_quantize_row(s->k, x, I, nvfp4moe_per_token_global_scale(x, I), &p->x2q[q], sv->qs);
    } else {
        float *dst = p->x2f + q * s->kp2;
        nvfp4moe_quantize_activation_row(s->cfg.scheme, x, I, 1.0f, dst);
        memset(dst + I, 0, sizeof(float) * (size_t)(s->kp2 - I));
    }
}

/* GEMM1's up rows take the up half's global scale (nvfp4moe_w13_row_half); every other row
 * scale_2. */
static const float *scale_up_of(const fast_state *s, bool gemm1) {
    const float *scale_2 = gemm1 ? s->w.w13_scale_2 : s->w.w2_scale_2;
    return gemm1 && s->w.w13_up_scale_2 && nvfp4moe_activation_is_gated(s->cfg.activation) ? s->w.w13_up_scale_2
                                                                                           : scale_2;
}

/* Expert e's rows of activations for a GEMM, and per row the factors of the integer sums (gate
 * rows or GEMM2, up rows): exact sum * 2^-20 * scale_2 / gs, the only roundings, in float64. */
static void expert_rows(const pass *p, int64_t e, bool gemm1, scratch_view *sv) {
    const fast_state *s = p->s;
    const int64_t q0 = sv->start[e], n = sv->start[e + 1] - q0, K = s->cfg.top_k;
    const float *scale_2 = gemm1 ? s->w.w13_scale_2 : s->w.w2_scale_2, *scale_up = scale_up_of(s, gemm1);
    for (int64_t i = 0; i < n; i++) {
        const int64_t q = q0 + i, tok = sv->order[q] / K;
        if (s->qpath) {
            const nvfp4moe_cpu_qrow *x = gemm1 ? &p->x1q[tok] : &p->x2q[q];
            const bool nan = atomic_load_explicit(&x->nan, memory_order_relaxed);
            sv->qrows[i] = x->blk;
            sv->factor[i] = nan ? NAN : (double)scale_2[e] / (double)x->gs * 0x1p-20;
            sv->factor_up[i] = nan ? NAN : (double)scale_up[e] / (double)x->gs * 0x1p-20;
        } else {
            sv->frows[i] = gemm1 ? p->x1f + tok * s->kp1 : p->x2f + q * s->kp2;
        }
    }
}

/* Tile t of expert e's matrix (GEMM1: w13, into h; GEMM2: w2, into y) against the expert's rows,
 * 8 at a time; the first 8 advance the prefetch cursor. */
static void gemm_tile(const pass *p, int64_t e, bool gemm1, int64_t t, scratch_view *sv, nvfp4moe_cpu_stream *pf) {
    const fast_state *s = p->s;
    const nvfp4moe_config *c = &s->cfg;
    const int64_t H = c->hidden_size, N1 = n1_of(s), rows = gemm1 ? N1 : H;
    const int64_t q0 = sv->start[e], n = sv->start[e + 1] - q0;
    const int64_t nsb = nvfp4moe_cpu_superblocks(gemm1 ? H : c->intermediate_size);
    const uint8_t *tile = (gemm1 ? s->w13 + (size_t)e * s->bytes13 + (size_t)t * s->tb1
                                 : s->w2 + (size_t)e * s->bytes2 + (size_t)t * s->tb2);
    const float *scale_2 = gemm1 ? s->w.w13_scale_2 : s->w.w2_scale_2, *scale_up = scale_up_of(s, gemm1);
    const bool interleaved = c->activation == NVFP4MOE_ACT_SWIGLUOAI;
    const float *bias = !c->has_bias ? NULL : (gemm1 ? s->w.w13_bias : s->w.w2_bias) + e * rows + 16 * t;
    int64_t *qout = sv->out;
    float *fout = sv->out;
    for (int64_t c0 = 0; c0 < n; c0 += NVFP4MOE_CPU_MAX_NT) {
        const int nt = (int)NVFP4MOE_MIN((int64_t)NVFP4MOE_CPU_MAX_NT, n - c0);
        if (s->qpath) s->k->gemm_q(tile, nsb, sv->qrows + c0, nt, qout, c0 == 0 ? pf : NULL);
        else s->k->gemm_f(tile, nsb, sv->frows + c0, nt, fout, c0 == 0 ? pf : NULL);
        for (int i = 0; i < nt; i++) {
            const int64_t q = q0 + c0 + i;
            double *h = p->h + q * N1 + 16 * t;
            float *y = p->y + sv->order[q] * H + 16 * t;
            for (int r = 0; r < NVFP4MOE_CPU_TILE_ROWS; r++) {
                const int64_t row = 16 * t + r;
                const bool up = scale_up != scale_2 && (interleaved ? (row & 1) : row >= c->intermediate_size);
                const double v = s->qpath ? (double)qout[16 * i + r] * (up ? sv->factor_up : sv->factor)[c0 + i]
                                          : (double)(fout[16 * i + r] * (up ? scale_up : scale_2)[e]);
                const double out = v + (bias ? (double)bias[r] : 0.0);
                if (gemm1) h[r] = out;
                else y[r] = (float)out;
            }
        }
    }
}

// ---- the GEMM phases' chunks ----
//
// Each thread has a share of each GEMM phase, the one it repacked (so on a machine with several
// NUMA nodes, its own node's memory): GEMM1, its units of intermediate columns (16 columns: the
// gate and up tiles) of every active expert; GEMM2, its output tiles of every active expert. A
// share is cut into chunks, an active expert's part of the share's units or tiles each: the parts
// of an expert as few as keep about s->chunks chunks to the share (so, at decode, a few parts of
// each expert; with many active experts, an expert's whole share as one run of tiles: the reads
// stay long and contiguous). A share's chunks are claimed in order through its counter: a thread
// first claims from its own share, then, once that is all claimed, from the others' (the next
// thread's first), until every share of the phase is claimed. Threads with slower memory, or
// interrupted, so run fewer chunks, and all finish within about a chunk of one another.
//
// A GEMM1 chunk ends with the activations of its columns for the expert's pairs. The weighted sum
// of a GEMM2 share's output columns needs all of the share's chunks: when a thread finds no chunk
// left to claim, it waits until those of its own share have all been run (a counter per share),
// then sums its share's columns. So no barrier is needed after GEMM2, the sums stay spread over
// all threads, and a thread mostly sums the outputs it computed itself.
//
// Which thread runs a chunk changes nothing in the results: a chunk writes the outputs of its own
// tiles (and the activations of its own columns), in fixed places, from the same inputs in the same
// order, whoever runs it, and a share's sums read them only when all are written; how the shares
// are cut (which depends on the thread count) changes nothing either, since the tiles, the
// 16-column quantization blocks and the output columns are independent of one another.

typedef struct {
    int ph;          /* 0: none, 1: GEMM1, 2: GEMM2 */
    int owner;       /* the share */
    int64_t k;       /* its index in the share */
} chunk;

/* Share v of phase ph: its units [*u0, *u1) (GEMM1: units of 16 intermediate columns; GEMM2:
 * output tiles), and the parts each active expert's are cut into. */
static int64_t share_of(const pass *p, const scratch_view *sv, int ph, int v, int nthreads, int64_t *u0, int64_t *u1) {
    const nvfp4moe_config *c = &p->s->cfg;
    nvfp4moe_cpu_split((ph == 1 ? c->intermediate_size : c->hidden_size) / 16, v, nthreads, u0, u1);
    const int64_t units = *u1 - *u0;
    if (units <= 0 || sv->nact == 0) return 0;
    return NVFP4MOE_MIN(units, NVFP4MOE_MAX((int64_t)1, NVFP4MOE_CEIL_DIV(p->s->chunks, sv->nact)));
}

/* The chunks of share v of phase ph. */
static int64_t share_chunks(const pass *p, const scratch_view *sv, int ph, int v, int nthreads) {
    int64_t u0, u1;
    return sv->nact * share_of(p, sv, ph, v, nthreads, &u0, &u1);
}

/* Chunk ch's expert and its runs of tiles (its units [*ua, *ub)). Returns the number of runs. */
static int chunk_runs(const pass *p, const scratch_view *sv, chunk ch, int nthreads, int64_t *e, int64_t *ua,
                      int64_t *ub, tile_run r[2]) {
    int64_t u0, u1, a, b;
    const int64_t parts = share_of(p, sv, ch.ph, ch.owner, nthreads, &u0, &u1);
    nvfp4moe_cpu_split(u1 - u0, (int)(ch.k % parts), (int)parts, &a, &b);
    *ua = u0 + a;
    *ub = u0 + b;
    *e = sv->active[ch.k / parts];
    if (ch.ph == 1) return unit_runs(p->s, *ua, *ub, r);
    r[0] = (tile_run){*ua, *ub - *ua};
    return 1;
}

/* The next chunk for thread tid: phase 1's, then phase 2's; in each, its own share's, then the
 * others' in turn from the next thread's (d[ph - 1]: the shares it found all claimed). None when
 * every chunk is claimed, or for a thread the steering keeps idle. */
static chunk claim_chunk(const pass *p, const scratch_view *sv, int tid, int nthreads, int d[2]) {
    if (tid < 64 && (p->steer.idle >> tid & 1)) return (chunk){0};
    for (int ph = 1; ph <= 2; ph++)
        for (; d[ph - 1] < nthreads; d[ph - 1]++) {
            const int v = (tid + d[ph - 1]) % nthreads;
            const int64_t n = share_chunks(p, sv, ph, v, nthreads);
            atomic_llong *next = &p->claim[(ph - 1) * nthreads + v].next;
            if (atomic_load_explicit(next, memory_order_relaxed) >= n) continue;
            const int64_t k = atomic_fetch_add_explicit(next, 1, memory_order_relaxed);
            if (k < n) return (chunk){ph, v, k};
        }
    return (chunk){0};
}

/* Chunk ch's weight reads, in the order its kernels make them, to the prefetch cursor; returns
 * their bytes. */
static int64_t chunk_segments(const pass *p, const scratch_view *sv, chunk ch, int nthreads, nvfp4moe_cpu_stream *pf) {
    if (ch.ph == 0) return 0;
    const fast_state *s = p->s;
    int64_t e, ua, ub;
    tile_run r[2];
    nvfp4moe_cpu_seg g[2];
    const int nr = chunk_runs(p, sv, ch, nthreads, &e, &ua, &ub, r);
    const uint8_t *base = ch.ph == 1 ? s->w13 + (size_t)e * s->bytes13 : s->w2 + (size_t)e * s->bytes2;
    const size_t tb = ch.ph == 1 ? s->tb1 : s->tb2;
    int64_t bytes = 0;
    for (int i = 0; i < nr; i++) {
        g[i] = (nvfp4moe_cpu_seg){base + (size_t)r[i].t0 * tb, (size_t)r[i].n * tb};
        bytes += (int64_t)g[i].n;
    }
    nvfp4moe_cpu_stream_push(pf, g, nr);
    return bytes;
}

/* C, once every chunk of a GEMM2 share has run: the weighted sum of each token's slots over its
 * output tiles r. */
static void combine(const pass *p, tile_run r, scratch_view *sv) {
    const nvfp4moe_config *c = &p->s->cfg;
    const int64_t H = c->hidden_size, K = c->top_k, c0 = 16 * r.t0, n = 16 * r.n;
    const size_t osz = nvfp4moe_dtype_size(c->out_dtype);
    float *a = sv->row;
    for (int64_t t = 0; t < p->m; t++) {
        const int64_t g = p->t0 + t;
        if (atomic_load_explicit(&p->bad[t], memory_order_relaxed)) {
            /* the host backends' rule (nvfp4moe_nan_rows): whatever the arithmetic made of it */
            for (int64_t i = 0; i < n; i++) a[i] = NAN;
        } else {
            for (int64_t i = 0; i < n; i++) a[i] = 0.0f;
            for (int64_t j = 0; j < K; j++) {   /* slot order, as the expert-parallel combine */
                const float w = c->apply_router_weight_on_input ? 1.0f : p->wts[t * K + j];
                const float *y = p->y + (t * K + j) * H + c0;
                for (int64_t i = 0; i < n; i++) a[i] += w * y[i];
            }
        }
        nvfp4moe_from_float(c->out_dtype, a, n, (char *)p->io->output + (size_t)(g * H + c0) * osz);
    }
}

/* A thread's claiming: its next chunk, claimed (and its reads pushed to the prefetch cursor) once
 * fewer than `lead` weight bytes of the current one remain to be read: the prefetch distance, so
 * that the prefetches run on into it without a break while the thread holds it as briefly as can
 * be (a thread the system preempts then holds up little besides its current chunk); with no
 * prefetching, at the current one's end. With the chunks, weight bytes and stolen ones per phase
 * (the profile). */
typedef struct {
    chunk next;
    bool has_next;
    int64_t next_bytes;
    int64_t lead;
    int d[2];
    int64_t chunks[2], stolen[2], bytes[2], stolen_bytes[2];
} claimer;

static void claim_next(const pass *p, const scratch_view *sv, int tid, int nthreads, nvfp4moe_cpu_stream *pf, claimer *cl) {
    if (cl->has_next) return;
    cl->next = claim_chunk(p, sv, tid, nthreads, cl->d);
    cl->next_bytes = chunk_segments(p, sv, cl->next, nthreads, pf);
    cl->has_next = true;
}

/* The thread's next chunk into *ch when it is of phase ph (false: none left of it for this thread;
 * a chunk of the next phase stays claimed). */
static bool take_chunk(const pass *p, const scratch_view *sv, int tid, int nthreads, nvfp4moe_cpu_stream *pf, claimer *cl,
                       int ph, chunk *ch) {
    claim_next(p, sv, tid, nthreads, pf, cl);
    if (cl->next.ph != ph) return false;
    const int i = ph - 1;
    const bool stolen = cl->next.owner != tid;
    cl->chunks[i]++;
    cl->stolen[i] += stolen;
    cl->bytes[i] += cl->next_bytes;
    cl->stolen_bytes[i] += stolen ? cl->next_bytes : 0;
    *ch = cl->next;
    cl->has_next = false;
    return true;
}

/* B: a GEMM1 chunk, its tiles then the activations of its columns for the expert's pairs. C: a
 * GEMM2 chunk, its tiles (then counted as run in its share). The next chunk is claimed on the way
 * (cl->lead). */
static void run_chunk(const pass *p, chunk ch, int tid, int nthreads, scratch_view *sv, nvfp4moe_cpu_stream *pf, claimer *cl) {
    int64_t e, ua, ub;
    tile_run r[2];
    const int nr = chunk_runs(p, sv, ch, nthreads, &e, &ua, &ub, r);
    const bool gemm1 = ch.ph == 1;
    const int64_t tb = (int64_t)(gemm1 ? p->s->tb1 : p->s->tb2);
    int64_t left = 0;
    for (int i = 0; i < nr; i++) left += r[i].n * tb;
    expert_rows(p, e, gemm1, sv);
    for (int i = 0; i < nr; i++)
        for (int64_t t = r[i].t0; t < r[i].t0 + r[i].n; t++) {
            left -= tb;
            if (left < cl->lead) claim_next(p, sv, tid, nthreads, pf, cl);
            gemm_tile(p, e, gemm1, t, sv, pf);
        }
    if (gemm1) {
        for (int64_t q = sv->start[e]; q < sv->start[e + 1]; q++) activate(p, q, 16 * ua, 16 * ub, sv);
        return;
    }
    atomic_fetch_add_explicit(&p->claim[nthreads + ch.owner].done, 1, memory_order_release);
}

/* C, after the thread's chunks: waits until the chunks of its GEMM2 share have run (the others'
 * last ones: about a chunk), then sums the share's columns. */
static void combine_share(const pass *p, int tid, int nthreads, scratch_view *sv) {
    const int64_t n = share_chunks(p, sv, 2, tid, nthreads);
    const tile_run r = gemm2_run(p->s, tid, nthreads);
    if (r.n == 0) return;
    nvfp4moe_cpu_pool_wait(p->s->pool, &p->claim[nthreads + tid].done, n);
    combine(p, r, sv);
}

/* The steering's wait before a chunk (tests only). */
static void steer_wait(const pass *p, int tid) {
    if (tid >= 64 || !(p->steer.slow >> tid & 1) || p->steer.slow_ns <= 0) return;
    struct timespec ts = {p->steer.slow_ns / 1000000000, p->steer.slow_ns % 1000000000};
    nanosleep(&ts, NULL);
}

static void stamp(nvfp4moe_cpu_prof_thread *pr, int at) {
    if (pr) pr->t[at] = now_ns();
}

/* Tokens [a, b) of the pass through the reference router (io's logits, converted to float). */
static void route_tokens(const pass *p, int64_t a, int64_t b, scratch_view *sv) {
    const nvfp4moe_config *c = &p->s->cfg;
    const int64_t E = c->num_experts, K = c->top_k;
    const size_t lsz = nvfp4moe_dtype_size(c->router_logits_dtype);
    for (int64_t t = a; t < b; t++) {
        const int64_t g = p->t0 + t;
        const bool read = p->io->router_logits != NULL;
        if (read) nvfp4moe_to_float(c->router_logits_dtype, (const char *)p->io->router_logits + (size_t)(g * E) * lsz, E, sv->logit);
        nvfp4moe_route_token(c, read ? sv->logit : NULL, g, p->s->w.correction_bias, sv->route, p->route_ids + t * K,
                             p->route_wts + t * K);
    }
}

/* The pass's pairs grouped by expert, as nvfp4moe_group_by_expert groups them (a counting sort,
 * token order kept within an expert), into this thread's start and order; the active experts
 * into act. */
static void group_pairs(const pass *p, scratch_view *sv) {
    const int64_t E = p->s->cfg.num_experts;
    memset(sv->start, 0, sizeof(int64_t) * (size_t)(E + 1));
    for (int64_t q = 0; q < p->P; q++) sv->start[p->ids[q] + 1]++;
    for (int64_t e = 0; e < E; e++) sv->start[e + 1] += sv->start[e];
    memcpy(sv->fill, sv->start, sizeof(int64_t) * (size_t)E);
    for (int64_t q = 0; q < p->P; q++) sv->order[sv->fill[p->ids[q]]++] = q;
    sv->nact = 0;
    for (int64_t e = 0; e < E; e++)
        if (sv->start[e + 1] > sv->start[e]) sv->active[sv->nact++] = e;
}

static void forward_task(void *ctx, int tid, int nthreads) {
    const pass *p = ctx;
    const fast_state *s = p->s;
    nvfp4moe_cpu_prof_thread *pr = p->prof ? &p->prof->thread[tid] : NULL;
    stamp(pr, NVFP4MOE_CPU_AT_START);
    scratch_view sv = scratch_of(p, tid);
    /* A: the routing (when it is ours) and the inputs, which need the routing only when the router
     * weight goes on the input */
    if (p->route) {
        /* the routing's shares from the last thread back, the inputs' from the first: at decode
         * the thread that routes the token quantizes none of it */
        int64_t a, b;
        nvfp4moe_cpu_split(p->m, nthreads - 1 - tid, nthreads, &a, &b);
        route_tokens(p, a, b, &sv);
        if (s->cfg.apply_router_weight_on_input) nvfp4moe_cpu_pool_barrier(s->pool);
    }
    inputs_phase(p, tid, nthreads, &sv);
    stamp(pr, NVFP4MOE_CPU_AT_INPUTS);
    nvfp4moe_cpu_pool_barrier(s->pool);
    stamp(pr, NVFP4MOE_CPU_AT_GEMM1_GO);
    group_pairs(p, &sv);
    /* B and C: the chunks, GEMM1's then GEMM2's (the first of which is claimed, and its weights
     * asked for, before the barrier) */
    nvfp4moe_cpu_stream pf;
    nvfp4moe_cpu_stream_open(&pf, sv.segs, SEG_CAP, &s->pf);
    claimer cl = {.lead = s->pf.hint == NVFP4MOE_CPU_PF_OFF ? 0 : s->pf.distance};
    chunk ch;
    while (take_chunk(p, &sv, tid, nthreads, &pf, &cl, 1, &ch)) {
        steer_wait(p, tid);
        run_chunk(p, ch, tid, nthreads, &sv, &pf, &cl);
    }
    stamp(pr, NVFP4MOE_CPU_AT_GEMM1);
    if (s->row_pass) {
        nvfp4moe_cpu_pool_barrier(s->pool);
        int64_t a, b;
        nvfp4moe_cpu_split(p->P, tid, nthreads, &a, &b);
        for (int64_t q = a; q < b; q++) quantize_pair(p, q, &sv);
    }
    stamp(pr, NVFP4MOE_CPU_AT_ROWS);
    nvfp4moe_cpu_pool_barrier(s->pool);
    stamp(pr, NVFP4MOE_CPU_AT_GEMM2_GO);
    while (take_chunk(p, &sv, tid, nthreads, &pf, &cl, 2, &ch)) {
        steer_wait(p, tid);
        run_chunk(p, ch, tid, nthreads, &sv, &pf, &cl);
    }
    stamp(pr, NVFP4MOE_CPU_AT_GEMM2);
    combine_share(p, tid, nthreads, &sv);
    stamp(pr, NVFP4MOE_CPU_AT_END);
    if (pr)
        for (int i = 0; i < 2; i++) {
            pr->chunks[i] = cl.chunks[i];
            pr->stolen[i] = cl.stolen[i];
            pr->bytes[i] = cl.bytes[i];
            pr->stolen_bytes[i] = cl.stolen_bytes[i];
        }
}

/* Per-thread scratch bytes for a pass of P pairs: the fixed part, then per pair a row pointer, two
 * factors (gate, up) and its place in the grouping. */
static size_t scratch_stride(const fast_state *s, int64_t P) {
    return s->scratch + round64((size_t)P * (sizeof(void *) + 2 * sizeof(double) + sizeof(int64_t)));
}

/* Carves the workspace of a pass of m tokens out of s->ws (growing it); NULL pointers when count
 * is 0. Returns false when out of memory. */
static bool carve(fast_state *s, int64_t m, int nthreads, pass *p) {
    const nvfp4moe_config *c = &s->cfg;
    const int64_t K = c->top_k, H = c->hidden_size, I = c->intermediate_size, N1 = n1_of(s);
    const int64_t P = m * K;
    const size_t qb1 = qrow_bytes(s->kp1), qb2 = qrow_bytes(s->kp2);
    enum { IDS, WTS, X1Q, X1, H1, X2Q, X2, X2RAW, Y, BAD, CLAIM, SCRATCH, NPARTS };
    size_t sizes[NPARTS] = {
        [IDS] = p->route ? sizeof(int32_t) * (size_t)P : 0,
        [WTS] = p->route ? sizeof(float) * (size_t)P : 0,
        [X1Q] = s->qpath ? sizeof(nvfp4moe_cpu_qrow) * (size_t)m : 0,
        [X1] = s->qpath ? qb1 * (size_t)m : sizeof(float) * (size_t)(m * s->kp1),
        [H1] = sizeof(double) * (size_t)(P * N1),
        [X2Q] = s->qpath ? sizeof(nvfp4moe_cpu_qrow) * (size_t)P : 0,
        [X2] = s->qpath ? qb2 * (size_t)P : sizeof(float) * (size_t)(P * s->kp2),
        [X2RAW] = s->row_pass ? sizeof(float) * (size_t)(P * I) : 0,
        [Y] = sizeof(float) * (size_t)(P * H),
        [BAD] = sizeof(atomic_bool) * (size_t)m,
        [CLAIM] = sizeof(struct claim) * 2 * (size_t)nthreads,
        [SCRATCH] = scratch_stride(s, P) * (size_t)nthreads,
    };
    size_t off[NPARTS], total = 0;
    for (int i = 0; i < NPARTS; i++) {
        off[i] = total;
        total += round64(sizes[i]);
    }
    if (total > s->ws_size) {
        /* In 2 MiB pages even when small: what the caller touches before the threads start (and
         * they first) are then one TLB entry, not a page walk each after other work evicted them. */
        const size_t huge = (size_t)2 << 20;
        free(s->ws);
        s->ws_size = 0;
        s->ws = total <= SIZE_MAX - huge ? alloc_big((total + huge - 1) / huge * huge) : NULL;
        if (!s->ws) return false;
        s->ws_size = (total + huge - 1) / huge * huge;
    }
    char *w = s->ws;
    if (p->route) {
        p->ids = p->route_ids = (int32_t *)(w + off[IDS]);
        p->wts = p->route_wts = (float *)(w + off[WTS]);
    } else {
        p->ids = p->io->topk_ids + p->t0 * K;
        p->wts = p->io->topk_weights + p->t0 * K;
    }
    p->h = (double *)(w + off[H1]);
    p->y = (float *)(w + off[Y]);
    p->x2raw = s->row_pass ? (float *)(w + off[X2RAW]) : NULL;
    p->bad = (atomic_bool *)(w + off[BAD]);
    p->scratch = w + off[SCRATCH];
    p->stride = scratch_stride(s, P);
    for (int64_t t = 0; t < m; t++) atomic_init(&p->bad[t], false);
    p->claim = (struct claim *)(w + off[CLAIM]);
    for (int i = 0; i < 2 * nthreads; i++) {
        atomic_init(&p->claim[i].next, 0);
        atomic_init(&p->claim[i].done, 0);
    }
    if (s->qpath) {
        p->x1q = (nvfp4moe_cpu_qrow *)(w + off[X1Q]);
        p->x2q = (nvfp4moe_cpu_qrow *)(w + off[X2Q]);
        /* The headers: W4A4's rows are quantized in parts by several threads, which only raise the
         * NaN flag; per-token rows are written whole by one. */
        for (int64_t t = 0; t < m; t++) {
            p->x1q[t].blk = (nvfp4moe_cpu_qblock *)(w + off[X1] + (size_t)t * qb1);
            p->x1q[t].gs = s->a1_gs;
            atomic_init(&p->x1q[t].nan, false);
        }
        for (int64_t q = 0; q < P; q++) {
            p->x2q[q].blk = (nvfp4moe_cpu_qblock *)(w + off[X2] + (size_t)q * qb2);
            p->x2q[q].gs = s->a2_gs;
            atomic_init(&p->x2q[q].nan, false);
        }
    } else {
        p->x1f = (float *)(w + off[X1]);
        p->x2f = (float *)(w + off[X2]);
    }
    return true;
}

static nvfp4moe_status fast_forward(void *state, const nvfp4moe_io *io, void *stream) {
    fast_state *s = state;
    const nvfp4moe_config *c = &s->cfg;
    NVFP4MOE_TRY(nvfp4moe_check_io(c, io));
    const int64_t M = io->num_tokens;
    if (M == 0) return NVFP4MOE_OK;
    if (io->topk_ids) NVFP4MOE_TRY(nvfp4moe_check_topk(c, io));
    pthread_mutex_lock(&s->lock);
    nvfp4moe_cpu_profile *prof = s->prof;
    if (prof) {
        prof->entry = now_ns();
        prof->passes = 0;
    }
    /* The routing, the inputs and everything after are the threads' (the task's phase A). */
    pass p = {.s = s, .io = io, .route = !io->topk_ids, .logits = nvfp4moe_routing_reads_logits(c, io), .prof = prof,
              .steer = s->steer};
    const int nthreads = nvfp4moe_cpu_pool_size(s->pool);
    nvfp4moe_status st = NVFP4MOE_OK;
    for (int64_t t0 = 0; t0 < M; t0 += s->chunk) {
        p.t0 = t0;
        p.m = NVFP4MOE_MIN(s->chunk, M - t0);
        p.P = p.m * c->top_k;
        if (!carve(s, p.m, nthreads, &p)) {
            st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "CPU_FAST: out of memory for %lld tokens", (long long)p.m);
            break;
        }
        if (prof) prof->run = now_ns();
        nvfp4moe_cpu_pool_run(s->pool, forward_task, &p);
        if (prof) {
            prof->joined = now_ns();
            prof->passes++;
        }
    }
    if (prof) prof->exit = now_ns();
    pthread_mutex_unlock(&s->lock);
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

// ---- settings and timings, for the benchmark ----

nvfp4moe_status nvfp4moe_cpu_fast_prefetch(nvfp4moe_plan *plan, const nvfp4moe_cpu_prefetch *set, nvfp4moe_cpu_prefetch *get) {
    fast_state *s = nvfp4moe_plan_backend_state(plan, &nvfp4moe_impl_cpu_fast);
    NVFP4MOE_RETURN_IF(!s, NVFP4MOE_ERR_INVALID_ARGUMENT, "not a CPU_FAST plan");
    pthread_mutex_lock(&s->lock);
    if (get) *get = s->pf;
    if (set) s->pf = *set;
    pthread_mutex_unlock(&s->lock);
    return NVFP4MOE_OK;
}

int64_t nvfp4moe_cpu_fast_chunks(nvfp4moe_plan *plan) {
    const fast_state *s = nvfp4moe_plan_backend_state(plan, &nvfp4moe_impl_cpu_fast);
    return s ? s->chunks : 0;
}

nvfp4moe_status nvfp4moe_cpu_fast_steer(nvfp4moe_plan *plan, const nvfp4moe_cpu_steer *set) {
    fast_state *s = nvfp4moe_plan_backend_state(plan, &nvfp4moe_impl_cpu_fast);
    NVFP4MOE_RETURN_IF(!s, NVFP4MOE_ERR_INVALID_ARGUMENT, "not a CPU_FAST plan");
    const int n = nvfp4moe_cpu_pool_size(s->pool);
    const uint64_t all = n >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;
    NVFP4MOE_RETURN_IF(n <= 64 && (set->idle & all) == all, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "steering: no thread of the %d left to run the chunks", n);
    pthread_mutex_lock(&s->lock);
    s->steer = *set;
    pthread_mutex_unlock(&s->lock);
    return NVFP4MOE_OK;
}

const nvfp4moe_cpu_profile *nvfp4moe_cpu_fast_profile(nvfp4moe_plan *plan, bool on) {
    fast_state *s = nvfp4moe_plan_backend_state(plan, &nvfp4moe_impl_cpu_fast);
    if (!s) return NULL;
    pthread_mutex_lock(&s->lock);
    if (!on) {
        profile_free(s->prof);
        s->prof = NULL;
    } else if (!s->prof) {
        nvfp4moe_cpu_profile *p = calloc(1, sizeof *p);
        const int n = nvfp4moe_cpu_pool_size(s->pool);
        if (p) p->thread = aligned_alloc(64, sizeof(nvfp4moe_cpu_prof_thread) * (size_t)n);
        if (p && p->thread) {
            memset(p->thread, 0, sizeof(nvfp4moe_cpu_prof_thread) * (size_t)n);
            p->nthreads = n;
            s->prof = p;
        } else {
            profile_free(p);
        }
    }
    nvfp4moe_cpu_profile *r = s->prof;
    pthread_mutex_unlock(&s->lock);
    return r;
}
