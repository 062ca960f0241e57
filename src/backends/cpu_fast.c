/*
 * cpu_fast.c - CPU_FAST: the layer on the CPU, multi-threaded, in float32.
 *
 * Same function as the reference (src/reference/moe_ref.c), organised for speed:
 *   1. route (the reference router: selections are bit-identical) and quantize the activations
 *      per scheme, once per token (W4A4 uses one global scale for every expert);
 *   2. group the (token, slot) pairs by expert;
 *   3. GEMM1: work items are (expert, block of ROWS weight rows). A worker decodes the block's NVFP4
 *      rows to float once (tables of the 16 E2M1 values times the block scale) and takes the dot
 *      product with every token routed to that expert, so each weight is decoded once per forward
 *      however many tokens use it;
 *   4. activation and the second quantization, per pair;
 *   5. GEMM2 like GEMM1, then the weighted sum over each token's slots in slot order.
 * Each dot product runs in a fixed order (8 float partial sums), so the result of a token does not
 * depend on the batch it is in (batch invariant) nor on the number of threads.
 */
#include "backends/backends.h"
#include "reference/reference.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { ROWS = 32 }; /* weight rows per work item: 32 rows of a 7168-wide matrix are 0.9 MB of floats */

typedef struct {
    nvfp4moe_layer *layer;   /* host copy of the weights */
    int nthreads;
} fast_state;

// ---- a parallel for over work items ----

typedef struct {
    void (*fn)(void *ctx, int64_t item, float *scratch);
    void *ctx;
    int64_t items;
    atomic_llong next;
    size_t scratch_floats;
    atomic_int failed;
} pfor;

static void *pfor_worker(void *arg) {
    pfor *p = arg;
    float *scratch = p->scratch_floats ? malloc(sizeof(float) * p->scratch_floats) : NULL;
    if (p->scratch_floats && !scratch) {
        atomic_store(&p->failed, 1);
        return NULL;
    }
    for (;;) {
        int64_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->items) break;
        p->fn(p->ctx, i, scratch);
    }
    free(scratch);
    return NULL;
}

/* Runs fn(ctx, i, scratch) for i in [0, items) on up to nthreads threads (this one included); each
 * thread gets its own scratch of scratch_floats floats. */
static nvfp4moe_status parallel_for(int nthreads, int64_t items, size_t scratch_floats,
                                    void (*fn)(void *, int64_t, float *), void *ctx) {
    pfor p = {.fn = fn, .ctx = ctx, .items = items, .scratch_floats = scratch_floats};
    atomic_init(&p.next, 0);
    atomic_init(&p.failed, 0);
    pthread_t th[64];
    int started = 0;
    int want = (int)NVFP4MOE_MIN((int64_t)nthreads, items);
    for (int i = 1; i < want && i < 64; i++)
        if (pthread_create(&th[started], NULL, pfor_worker, &p) == 0) started++;
    pfor_worker(&p);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (atomic_load(&p.failed) || atomic_load(&p.next) < items)
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "CPU_FAST: out of memory for thread scratch");
    return NVFP4MOE_OK;
}

// ---- kernels ----

/* Decodes rows [r0, r0 + n) of an NVFP4 matrix with `cols` columns into float. */
static void decode_rows(const uint8_t *q, const uint8_t *sf, int64_t cols, float scale_2, int64_t r0, int64_t n,
                        float *out) {
    float lut[16];
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *qr = q + (r0 + r) * (cols / 2), *sr = sf + (r0 + r) * (cols / 16);
        float *o = out + r * cols;
        for (int64_t b = 0; b < cols / 16; b++) {
            float s = nvfp4moe_e4m3_decode(sr[b]) * scale_2;
            for (int c = 0; c < 16; c++) lut[c] = nvfp4moe_e2m1_decode((uint8_t)c) * s;
            for (int c = 0; c < 8; c++) {
                uint8_t byte = qr[b * 8 + c];
                o[b * 16 + 2 * c] = lut[byte & 0xF];
                o[b * 16 + 2 * c + 1] = lut[byte >> 4];
            }
        }
    }
}

/* n is a multiple of 16: eight independent partial sums let the compiler vectorize without
 * reassociating anything the source does not say. */
static float dot(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    for (int64_t i = 0; i < n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

typedef struct {
    const nvfp4moe_config *cfg;
    const nvfp4moe_weights *w;
    const int64_t *start, *order;     /* pairs grouped by expert */
    const int64_t *item_expert, *item_row; /* work item -> (expert, first row) */
    const float *in;                  /* GEMM1: [M, H] by token; GEMM2: [P, I] by pair */
    float *out;                       /* [P, n_out] by pair */
    bool gemm1;
} gemm_job;

static void gemm_item(void *ctx, int64_t item, float *wbuf) {
    const gemm_job *j = ctx;
    const nvfp4moe_config *c = j->cfg;
    const int64_t e = j->item_expert[item], r0 = j->item_row[item], K = c->top_k;
    const int64_t H = c->hidden_size, I = c->intermediate_size, N1 = nvfp4moe_config_n1(c);
    const int64_t rows = j->gemm1 ? N1 : H, cols = j->gemm1 ? H : I;
    const int64_t n = NVFP4MOE_MIN((int64_t)ROWS, rows - r0);
    if (j->gemm1)
        decode_rows(j->w->w13 + e * N1 * H / 2, j->w->w13_scale + e * N1 * H / 16, H, j->w->w13_scale_2[e], r0, n, wbuf);
    else
        decode_rows(j->w->w2 + e * H * I / 2, j->w->w2_scale + e * H * I / 16, I, j->w->w2_scale_2[e], r0, n, wbuf);
    const float *bias = !c->has_bias ? NULL : j->gemm1 ? j->w->w13_bias + e * N1 : j->w->w2_bias + e * H;
    for (int64_t q = j->start[e]; q < j->start[e + 1]; q++) {
        const int64_t p = j->order[q];
        const float *a = j->gemm1 ? j->in + (p / K) * H : j->in + p * I;
        float *o = j->out + p * rows + r0;
        for (int64_t r = 0; r < n; r++) o[r] = dot(a, wbuf + r * cols, cols) + (bias ? bias[r0 + r] : 0.0f);
    }
}

typedef struct {
    const nvfp4moe_config *cfg;
    const float *h;      /* [P, N1] */
    float *a2;           /* [P, I] */
    float a2_gs;
} act_job;

static void act_item(void *ctx, int64_t p, float *scratch) {
    const act_job *j = ctx;
    const nvfp4moe_config *c = j->cfg;
    const int64_t I = c->intermediate_size, N1 = nvfp4moe_config_n1(c);
    double *hd = (double *)scratch, *ad = hd + N1;   /* scratch holds 2 * (N1 + I) floats */
    for (int64_t n = 0; n < N1; n++) hd[n] = j->h[p * N1 + n];
    nvfp4moe_activation_ref(c, hd, ad);
    float *a2 = j->a2 + p * I;
    if (c->scheme == NVFP4MOE_SCHEME_W4A16) {
        for (int64_t i = 0; i < I; i++) a2[i] = (float)ad[i];
        return;
    }
    float *tmp = (float *)(ad + I);
    for (int64_t i = 0; i < I; i++) tmp[i] = nvfp4moe_round_to_dtype(c->in_dtype, (float)ad[i]);
    nvfp4moe_quantize_activation_row(c->scheme, tmp, I, j->a2_gs, a2);
}

// ---- the backend ----

static nvfp4moe_scheme same_scheme(nvfp4moe_scheme s) { return s; }

static nvfp4moe_status fast_create(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                   const nvfp4moe_plan_options *opt, const nvfp4moe_device *dev, void **state) {
    NVFP4MOE_RETURN_IF(opt->weights_on_device, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "backend CPU_FAST runs on the host but the weights are in device memory");
    fast_state *s = calloc(1, sizeof *s);
    NVFP4MOE_RETURN_IF(!s, NVFP4MOE_ERR_OUT_OF_MEMORY, "CPU_FAST: out of memory");
    nvfp4moe_status st = nvfp4moe_layer_copy(cfg, w, &s->layer);
    if (st != NVFP4MOE_OK) {
        free(s);
        return st;
    }
    long n = opt->num_threads > 0 ? opt->num_threads : sysconf(_SC_NPROCESSORS_ONLN);
    s->nthreads = (int)NVFP4MOE_MAX(1, NVFP4MOE_MIN(n, 64));
    *state = s;
    return NVFP4MOE_OK;
}

static size_t fast_workspace(const void *state, int64_t num_tokens) { return 0; }

static nvfp4moe_status fast_forward(void *state, const nvfp4moe_io *io, void *stream) {
    fast_state *s = state;
    const nvfp4moe_config *c = &s->layer->cfg;
    const nvfp4moe_weights *w = &s->layer->w;
    NVFP4MOE_TRY(nvfp4moe_check_io(c, io));
    const int64_t M = io->num_tokens;
    if (M == 0) return NVFP4MOE_OK;
    const int64_t E = c->num_experts, K = c->top_k, H = c->hidden_size, I = c->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(c), P = M * K;

    int32_t *ids = malloc(sizeof(int32_t) * (size_t)P);
    float *wts = malloc(sizeof(float) * (size_t)P);
    float *xq = malloc(sizeof(float) * (size_t)(M * H)), *h = malloc(sizeof(float) * (size_t)(P * N1));
    float *a2 = malloc(sizeof(float) * (size_t)(P * I)), *y = malloc(sizeof(float) * (size_t)(P * H));
    float *outf = malloc(sizeof(float) * (size_t)(M * H));
    int64_t *order = malloc(sizeof(int64_t) * (size_t)P), *start = calloc((size_t)E + 1, sizeof(int64_t));
    int64_t rows_max = NVFP4MOE_MAX(N1, H), items_max = E * NVFP4MOE_CEIL_DIV(rows_max, (int64_t)ROWS);
    int64_t *item_e = malloc(sizeof(int64_t) * (size_t)items_max), *item_r = malloc(sizeof(int64_t) * (size_t)items_max);
    nvfp4moe_status st = NVFP4MOE_OK;
    if (!ids || !wts || !xq || !h || !a2 || !y || !outf || !order || !start || !item_e || !item_r) {
        st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "CPU_FAST: out of memory for %lld tokens", (long long)M);
        goto done;
    }
    if ((st = nvfp4moe_routing_for_io(c, w, io, ids, wts)) != NVFP4MOE_OK) goto done;

    float a2_gs = 1.0f;
    nvfp4moe_prepare_inputs(c, w, io->hidden, M, wts, xq, &a2_gs);
    if ((st = nvfp4moe_group_by_expert(ids, P, E, start, order)) != NVFP4MOE_OK) goto done;

    for (int pass = 0; pass < 2; pass++) {
        const int64_t rows = pass == 0 ? N1 : H;
        int64_t items = 0;
        for (int64_t e = 0; e < E; e++) {
            if (start[e] == start[e + 1]) continue;
            for (int64_t r = 0; r < rows; r += ROWS) {
                item_e[items] = e;
                item_r[items++] = r;
            }
        }
        gemm_job g = {.cfg = c, .w = w, .start = start, .order = order, .item_expert = item_e, .item_row = item_r,
                      .in = pass == 0 ? xq : a2, .out = pass == 0 ? h : y, .gemm1 = pass == 0};
        if ((st = parallel_for(s->nthreads, items, (size_t)ROWS * (size_t)(pass == 0 ? H : I), gemm_item, &g)) !=
            NVFP4MOE_OK)
            goto done;
        if (pass == 0) {
            act_job aj = {.cfg = c, .h = h, .a2 = a2, .a2_gs = a2_gs};
            if ((st = parallel_for(s->nthreads, P, (size_t)(2 * (N1 + I) + I), act_item, &aj)) != NVFP4MOE_OK) goto done;
        }
    }

    for (int64_t t = 0; t < M; t++) {
        for (int64_t n = 0; n < H; n++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < K; j++)
                acc += (c->apply_router_weight_on_input ? 1.0f : wts[t * K + j]) * y[(t * K + j) * H + n];
            outf[t * H + n] = acc;
        }
    }
    nvfp4moe_from_float(c->out_dtype, outf, M * H, io->output);
    nvfp4moe_nan_rows(c, io);

done:
    free(ids); free(wts); free(xq); free(h); free(a2); free(y); free(outf); free(order); free(start);
    free(item_e); free(item_r);
    return st;
}

static void fast_destroy(void *state) {
    fast_state *s = state;
    nvfp4moe_layer_free(s->layer);
    free(s);
}

const nvfp4moe_backend_impl nvfp4moe_impl_cpu_fast = {
    .device_memory = false,
    .effective_scheme = same_scheme,
    .create = fast_create,
    .workspace_size = fast_workspace,
    .forward = fast_forward,
    .destroy = fast_destroy,
};
