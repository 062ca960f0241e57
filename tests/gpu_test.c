/*
 * gpu_test.c - the GPU correctness test (CUDA builds, run on a GPU machine: `make gpu-test`).
 *
 * 1. Routing: every method of the reference on the GPU router, ids bit-identical to
 *    nvfp4moe_route (f32 and bf16 logits; bf16 logits have exact ties, so the tie rule is tested
 *    too), weights to float rounding; the token grouping's invariants. 1b. The grouping alone on
 *    precomputed ids (invalid ones included) against a host reference, on both sides of the
 *    single-block / multi-block switch: num_blocks, the block table and its -1 tail, each
 *    expert's run and its sentinel padding.
 * 2. Every GPU backend (MARLIN, HOPPER_WGMMA on sm_90, EMULATION) against the float64 CPU reference
 *    on a sample of vLLM's test grid (m, n = intermediate, k = hidden, e, top_k), every activation,
 *    swiglu_limit on and off, bf16 and fp16, fresh random data per case, outputs poisoned (0xFF =
 *    NaN) and checked fully written. MARLIN and HOPPER_WGMMA (W4A16): ||out - ref|| / ||ref|| <=
 *    1e-2. EMULATION (W4A4) against vLLM's EMULATION path computed on the host, its two
 *    quantize-dequantizes dividing as the GPU's div.full.f32 does (nvfp4moe_emulation_forward_host_rcp
 *    with the GPU's reciprocals of a1_gs and a2_gs, nvfp4moe_emul_triton_rcp; the case line says
 *    when one is not the correctly rounded 1/gs): norm-wise <= 1e-2 and vLLM's |out - ref| <= 0.1 +
 *    0.1 |ref| on every element (and <= 0.15 norm-wise from the float64 reference); gated relu2,
 *    which vLLM's EMULATION does not have, must be refused. With IEEE divisions a global scale
 *    whose GPU reciprocal is one ulp off puts the dequantized inputs on bf16 ties that the GPU
 *    rounds the other way, enough to fail a layer (rel 3e-2); the model removes that. The bounds
 *    stay: CUDA's expf and Triton's exp still differ from the host's in the last bit.
 * 3. Edge cases: M = 0, an expert with no tokens, all tokens to one expert, 15 of 16 tokens routed
 *    to one expert by their router logits at M = 512 (bench --hot-tokens' routing, in
 *    HOPPER_WGMMA's wgmma GEMM regime), apply_router_weight_on_input
 *    (llama4), expert biases, a forward captured in a CUDA graph and replayed == eager, the public
 *    plan API with device-resident weights.
 * 4. Gate and up halves with global scales of their own (w13_up_scale_2, the up half scaled by 1 to
 *    10 per expert): stacked (silu) and interleaved (swigluoai) halves, decode-sized and larger
 *    batches, host and device-resident weights (a NaN up scale refused, naming it), same bounds.
 *
 * The reference is the slow part: large cases check a spread subset of tokens against it (tokens
 * are independent: static activation scales, per-token routing); every token is still checked
 * for being written and finite. CPU work runs on all cores, GPU work one case at a time.
 * `gpu_test --only route|group|layer` runs one kind of case (the grouping alone under
 * compute-sanitizer, say). Ends with "gpu_test: N passed, N failed".
 */
#include "harness.h"
#include "oracle/oracle.h"
#include "reference/reference.h"
#include "../kernels/emulation.h"
#include "../kernels/moe_gemm.h"
#include "../kernels/pipeline.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_skipped;
static pthread_mutex_t g_gpu = PTHREAD_MUTEX_INITIALIZER;   /* one case on the GPU at a time */
static pthread_mutex_t g_print = PTHREAD_MUTEX_INITIALIZER;
static nvfp4moe_device g_dev;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A case's log: built privately, printed in one piece. */
typedef struct logbuf {
    char text[8192];
    size_t len;
    int failed;
} logbuf;

static void logf_(logbuf *l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (l->len < sizeof l->text) {
        int n = vsnprintf(l->text + l->len, sizeof l->text - l->len, fmt, ap);
        if (n > 0) l->len = NVFP4MOE_MIN(sizeof l->text - 1, l->len + (size_t)n);
    }
    va_end(ap);
}

static void finish(logbuf *l, int skipped) {
    pthread_mutex_lock(&g_print);
    fputs(l->text, stdout);
    fflush(stdout);
    if (skipped) g_skipped++;
    else t_record(!l->failed);
    pthread_mutex_unlock(&g_print);
}

#define CU(l, expr)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            logf_((l), "    CUDA error: %s: %s\n", #expr, cudaGetErrorString(e_));                 \
            (l)->failed = 1;                                                                       \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static float half_to_f(nvfp4moe_dtype dt, const uint16_t *p, int64_t i) {
    return dt == NVFP4MOE_DTYPE_BF16 ? nvfp4moe_bf16_to_float(p[i]) : nvfp4moe_fp16_to_float(p[i]);
}

/* ======================= 1. routing and grouping ======================= */

typedef struct route_case {
    nvfp4moe_routing method;
    int E, k, M;
    nvfp4moe_dtype ldt;
    bool bias;
} route_case;

static void run_route_case(const route_case *rc, uint64_t seed) {
    logbuf l = {.len = 0};
    nvfp4moe_config cfg;
    nvfp4moe_config_init(&cfg);
    cfg.num_experts = rc->E;
    cfg.top_k = rc->k;
    cfg.routing = rc->method;
    cfg.router_logits_dtype = rc->ldt;
    cfg.seed = seed;
    if (rc->method == NVFP4MOE_ROUTING_DEEPSEEK_V3) {
        cfg.n_group = rc->E % 8 == 0 && rc->E >= 32 ? 8 : 4;
        cfg.topk_group = cfg.n_group / 2;
        cfg.routed_scaling_factor = 2.5f;
    }
    if (rc->method == NVFP4MOE_ROUTING_MINIMAX2) cfg.routed_scaling_factor = 1.5f;
    cfg.has_correction_bias = rc->bias;
    const int64_t M = rc->M, E = rc->E, K = rc->k, P = M * K;
    logf_(&l, "route %-18s E=%-3d top_k=%d M=%-4lld logits=%s%s", nvfp4moe_routing_name(rc->method), rc->E,
          rc->k, (long long)M, nvfp4moe_dtype_name(rc->ldt), rc->bias ? " bias" : "");
    if (nvfp4moe_config_validate(&cfg) != NVFP4MOE_OK) {
        logf_(&l, ": SKIP (%s)\n", nvfp4moe_last_error());
        finish(&l, 1);
        return;
    }
    const size_t lsz = nvfp4moe_dtype_size(rc->ldt);
    void *logits = malloc((size_t)(M * E) * lsz);
    float *logf32 = malloc(sizeof(float) * (size_t)(M * E));
    float *bias = malloc(sizeof(float) * (size_t)E);
    int32_t *ids_ref = malloc(sizeof(int32_t) * (size_t)P), *ids_gpu = malloc(sizeof(int32_t) * (size_t)P);
    float *w_ref = malloc(sizeof(float) * (size_t)P), *w_gpu = malloc(sizeof(float) * (size_t)P);
    const int bm = 16;
    const int64_t cap = nvfp4moe_group_capacity(P, E, bm);
    int32_t *sorted = malloc(sizeof(int32_t) * (size_t)cap), *bexp = malloc(sizeof(int32_t) * (size_t)(cap / bm));
    void *d_logits = NULL, *d_ids = NULL, *d_w = NULL, *d_sorted = NULL, *d_bexp = NULL, *d_nb = NULL,
         *d_bias = NULL, *d_zero = NULL;
    nvfp4moe_fill_normal(logits, rc->ldt, M * E, seed * 7 + 1);
    nvfp4moe_to_float(rc->ldt, logits, M * E, logf32);
    nvfp4moe_fill_normal(bias, NVFP4MOE_DTYPE_F32, E, seed * 7 + 2);
    for (int64_t e = 0; e < E; e++) bias[e] *= 0.1f;
    if (nvfp4moe_route(&cfg, logf32, M, rc->bias ? bias : NULL, ids_ref, w_ref) != NVFP4MOE_OK) {
        logf_(&l, ": FAIL reference: %s\n", nvfp4moe_last_error());
        l.failed = 1;
        goto out;
    }
    pthread_mutex_lock(&g_gpu);
    {
        nvfp4moe_gpu_route_params rp = {.method = cfg.routing, .logits_dtype = cfg.router_logits_dtype,
                                        .num_experts = cfg.num_experts, .top_k = cfg.top_k,
                                        .n_group = cfg.n_group, .topk_group = cfg.topk_group,
                                        .routed_scaling_factor = cfg.routed_scaling_factor, .seed = cfg.seed};
        cudaError_t e = cudaMalloc(&d_logits, (size_t)(M * E) * lsz);
        if (!e) e = cudaMalloc(&d_ids, sizeof(int32_t) * (size_t)P);
        if (!e) e = cudaMalloc(&d_w, sizeof(float) * (size_t)P);
        if (!e) e = cudaMalloc(&d_sorted, sizeof(int32_t) * (size_t)cap);
        if (!e) e = cudaMalloc(&d_bexp, sizeof(int32_t) * (size_t)(cap / bm));
        if (!e) e = cudaMalloc(&d_nb, sizeof(int32_t));
        if (!e) e = cudaMalloc(&d_bias, sizeof(float) * (size_t)E);
        if (!e) e = cudaMalloc(&d_zero, sizeof(int32_t));
        if (!e) e = cudaMemcpy(d_logits, logits, (size_t)(M * E) * lsz, cudaMemcpyHostToDevice);
        if (!e) e = cudaMemcpy(d_bias, bias, sizeof(float) * (size_t)E, cudaMemcpyHostToDevice);
        pthread_mutex_unlock(&g_gpu);
        rp.correction_bias = rc->bias ? d_bias : NULL;
        /* pass 0 plain launches; pass 1 the chain of the wgmma GEMM's layer (the grouping launched
         * with PDL behind the routing grid, zeroing a poisoned counter); same checks */
        for (int pass = 0; pass < 2 && !l.failed; pass++) {
            const nvfp4moe_gpu_chain ch = {.pdl = 1, .zero = (int32_t *)d_zero};
            pthread_mutex_lock(&g_gpu);
            if (!e) e = cudaMemset(d_sorted, 0x7F, sizeof(int32_t) * (size_t)cap);
            if (!e) e = cudaMemset(d_bexp, 0x7F, sizeof(int32_t) * (size_t)(cap / bm));
            if (!e) e = cudaMemset(d_ids, 0x7F, sizeof(int32_t) * (size_t)P);
            if (!e) e = cudaMemset(d_zero, 0x7F, sizeof(int32_t));
            if (!e) e = cudaMemset(d_w, 0xFF, sizeof(float) * (size_t)P);  /* NaN */
            if (!e) e = cudaMemset(d_nb, 0x7F, sizeof(int32_t));
            if (!e) e = nvfp4moe_gpu_route_and_group(&rp, d_logits, d_ids, d_w, M, (int32_t)K, (int32_t)E, bm,
                                                     d_sorted, d_bexp, d_nb, (int32_t)(cap / bm), pass ? &ch : NULL, 0);
            if (!e) e = cudaDeviceSynchronize();
            int32_t nb = -1, zero = -1;
            if (!e) e = cudaMemcpy(ids_gpu, d_ids, sizeof(int32_t) * (size_t)P, cudaMemcpyDeviceToHost);
            if (!e) e = cudaMemcpy(w_gpu, d_w, sizeof(float) * (size_t)P, cudaMemcpyDeviceToHost);
            if (!e) e = cudaMemcpy(sorted, d_sorted, sizeof(int32_t) * (size_t)cap, cudaMemcpyDeviceToHost);
            if (!e) e = cudaMemcpy(bexp, d_bexp, sizeof(int32_t) * (size_t)(cap / bm), cudaMemcpyDeviceToHost);
            if (!e) e = cudaMemcpy(&nb, d_nb, sizeof nb, cudaMemcpyDeviceToHost);
            if (!e) e = cudaMemcpy(&zero, d_zero, sizeof zero, cudaMemcpyDeviceToHost);
            pthread_mutex_unlock(&g_gpu);
            if (e) {
                logf_(&l, ": FAIL CUDA: %s\n", cudaGetErrorString(e));
                l.failed = 1;
                goto out;
            }
            if (pass == 1 && zero != 0) {
                logf_(&l, "\n    pass %d: the counter to zero holds 0x%08x", pass, (unsigned)zero);
                l.failed = 1;
            }
            int bad_ids = 0, bad_w = 0;
            double max_wrel = 0;
            for (int64_t i = 0; i < P; i++) {
                if (ids_gpu[i] != ids_ref[i]) {
                    if (bad_ids < 3)
                        logf_(&l, "\n    token %lld slot %lld: id %d, reference %d", (long long)(i / K),
                              (long long)(i % K), ids_gpu[i], ids_ref[i]);
                    bad_ids++;
                }
                double rel = fabs((double)w_gpu[i] - w_ref[i]) / fmax(fabs((double)w_ref[i]), 1e-30);
                if (!(rel <= 1e-5)) {
                    if (bad_w < 3)
                        logf_(&l, "\n    token %lld slot %lld: weight %.9g, reference %.9g", (long long)(i / K),
                              (long long)(i % K), w_gpu[i], w_ref[i]);
                    bad_w++;
                }
                if (rel > max_wrel) max_wrel = rel;
            }
            /* grouping invariants: every pair exactly once, in a block of its expert, padding = P */
            int bad_group = 0;
            int64_t total = (int64_t)nb * bm;
            if (nb < 0 || total > cap) bad_group = 1;
            char *seen = calloc((size_t)P + 1, 1);
            for (int64_t r = 0; !bad_group && r < total; r++) {
                int32_t p = sorted[r], e2 = bexp[r / bm];
                if (p == P) continue;
                if (p < 0 || p > P || seen[p] || ids_gpu[p] != e2) bad_group = 2;
                else seen[p] = 1;
            }
            for (int64_t p = 0; !bad_group && p < P; p++)
                if (!seen[p]) bad_group = 3;
            for (int64_t b = nb; !bad_group && b < cap / bm; b++)
                if (bexp[b] != -1) bad_group = 4;
            free(seen);
            if (bad_group) logf_(&l, "\n    grouping invariant %d broken (num_blocks=%d)", bad_group, nb);
            l.failed |= bad_ids || bad_w || bad_group;
            if (l.failed || pass == 1)
                logf_(&l, "%s: %s (ids %d/%lld differ, max weight rel err %.2e%s)\n", l.failed ? "\n   " : "",
                      l.failed ? "FAIL" : "ok", bad_ids, (long long)P, max_wrel,
                      pass ? "; chained launches too" : "");
        }
    }
out:
    pthread_mutex_lock(&g_gpu);
    if (d_logits) cudaFree(d_logits);
    if (d_ids) cudaFree(d_ids);
    if (d_w) cudaFree(d_w);
    if (d_sorted) cudaFree(d_sorted);
    if (d_bexp) cudaFree(d_bexp);
    if (d_nb) cudaFree(d_nb);
    if (d_bias) cudaFree(d_bias);
    if (d_zero) cudaFree(d_zero);
    pthread_mutex_unlock(&g_gpu);
    free(logits); free(logf32); free(bias); free(ids_ref); free(ids_gpu); free(w_ref); free(w_gpu);
    free(sorted); free(bexp);
    finish(&l, 0);
}

/* ======================= 1b. the grouping alone, against a host reference ======================= */

/* Precomputed ids (rp == NULL) grouped on the GPU and compared with the contract of
 * kernels/moe_gemm.h computed here: num_blocks, every entry of block_expert (the -1 tail
 * included), each expert's run holding exactly its pairs (in any order), sentinels P in its
 * padding. Sizes on both sides of the single-block / multi-block switch of kernels/moe_align.cu. */
typedef enum { GI_UNIFORM, GI_INVALID, GI_HOT, GI_ONE } group_ids;

typedef struct group_case {
    int E, M, k, bm;
    group_ids ids;
} group_case;

static const char *group_ids_name(group_ids g) {
    switch (g) {
    case GI_INVALID: return "uniform, every 7th id outside [0,E)";
    case GI_HOT: return "15/16 of the tokens pick expert 0 first";
    case GI_ONE: return "every pair to expert E-1";
    default: return "uniform";
    }
}

static void run_group_case(const group_case *gc, uint64_t seed) {
    logbuf l = {.len = 0};
    const int64_t E = gc->E, M = gc->M, K = gc->k, bm = gc->bm, P = M * K;
    const int64_t cap = nvfp4moe_group_capacity(P, E, bm), max_blocks = cap / bm;
    logf_(&l, "group E=%-4d top_k=%d M=%-5d P=%-6lld block_m=%-3d ids %s", gc->E, gc->k, gc->M, (long long)P, gc->bm,
          group_ids_name(gc->ids));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)NVFP4MOE_MAX(P, 1));
    int32_t *sorted = malloc(sizeof(int32_t) * (size_t)cap), *bexp = malloc(sizeof(int32_t) * (size_t)max_blocks);
    int64_t *cnt = calloc((size_t)E, sizeof(int64_t)), *off = calloc((size_t)E + 1, sizeof(int64_t));
    void *d_ids = NULL, *d_sorted = NULL, *d_bexp = NULL, *d_nb = NULL;
    /* k distinct experts per token, as a router picks them (GI_ONE: top-1 only) */
    uint64_t rs = seed;
    for (int64_t t = 0; t < M; t++)
        for (int64_t j = 0; j < K; j++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(nvfp4moe_rand_u64(&rs) % (uint64_t)E);
                if (gc->ids == GI_HOT && j == 0 && nvfp4moe_rand_u64(&rs) % 16) e = 0;
                if (gc->ids == GI_ONE) e = (int32_t)E - 1;
                dup = false;
                for (int64_t q = 0; q < j; q++) dup |= ids[t * K + q] == e;
            } while (dup && gc->ids != GI_ONE);
            ids[t * K + j] = e;
        }
    if (gc->ids == GI_INVALID) /* dropped, never placed: -1, E, a large id */
        for (int64_t p = 0; p < P; p += 7) ids[p] = (p / 7) % 3 == 0 ? -1 : (p / 7) % 3 == 1 ? (int32_t)E : 1 << 30;
    /* the reference: counts, padded runs */
    for (int64_t p = 0; p < P; p++)
        if (ids[p] >= 0 && ids[p] < E) cnt[ids[p]]++;
    for (int64_t e = 0; e < E; e++) off[e + 1] = off[e] + (cnt[e] + bm - 1) / bm * bm;
    const int64_t want_nb = off[E] / bm;

    int32_t nb = -1;
    pthread_mutex_lock(&g_gpu);
    {
        cudaError_t e = cudaMalloc(&d_ids, sizeof(int32_t) * (size_t)NVFP4MOE_MAX(P, 1));
        if (!e) e = cudaMalloc(&d_sorted, sizeof(int32_t) * (size_t)cap);
        if (!e) e = cudaMalloc(&d_bexp, sizeof(int32_t) * (size_t)max_blocks);
        if (!e) e = cudaMalloc(&d_nb, sizeof(int32_t));
        if (!e && P) e = cudaMemcpy(d_ids, ids, sizeof(int32_t) * (size_t)P, cudaMemcpyHostToDevice);
        /* poison: 0x7F7F7F7F is neither a pair, the sentinel nor an expert */
        if (!e) e = cudaMemset(d_sorted, 0x7F, sizeof(int32_t) * (size_t)cap);
        if (!e) e = cudaMemset(d_bexp, 0x7F, sizeof(int32_t) * (size_t)max_blocks);
        if (!e) e = cudaMemset(d_nb, 0x7F, sizeof(int32_t));
        if (!e) e = cudaDeviceSynchronize();
        if (!e) e = nvfp4moe_gpu_route_and_group(NULL, NULL, d_ids, NULL, M, (int32_t)K, (int32_t)E, (int32_t)bm,
                                                 d_sorted, d_bexp, d_nb, (int32_t)max_blocks, NULL, 0);
        if (!e) e = cudaDeviceSynchronize();
        if (!e) e = cudaMemcpy(sorted, d_sorted, sizeof(int32_t) * (size_t)cap, cudaMemcpyDeviceToHost);
        if (!e) e = cudaMemcpy(bexp, d_bexp, sizeof(int32_t) * (size_t)max_blocks, cudaMemcpyDeviceToHost);
        if (!e) e = cudaMemcpy(&nb, d_nb, sizeof nb, cudaMemcpyDeviceToHost);
        pthread_mutex_unlock(&g_gpu);
        if (e) {
            logf_(&l, "\n    FAIL CUDA: %s\n", cudaGetErrorString(e));
            l.failed = 1;
            goto out;
        }
    }
    {
        int64_t bad = 0;
#define GBAD(...)                                                                                  \
    do {                                                                                           \
        if (bad++ < 6) logf_(&l, "\n    " __VA_ARGS__);                                            \
    } while (0)
        if (nb != want_nb) GBAD("num_blocks %d, reference %lld", nb, (long long)want_nb);
        for (int64_t b = 0, e = 0; b < max_blocks; b++) {
            int64_t want = -1;
            if (b < want_nb) {
                while (off[e + 1] <= b * bm) e++;  /* the expert whose run holds row b * bm */
                want = e;
            }
            if (bexp[b] != want) GBAD("block_expert[%lld] = %d, reference %lld", (long long)b, bexp[b], (long long)want);
        }
        for (int64_t e = 0; e < E; e++) {
            /* the run: cnt[e] pairs of expert e (any order; each pair once is checked below),
             * then the sentinels */
            for (int64_t i = 0; i < cnt[e]; i++) {
                const int32_t got = sorted[off[e] + i];
                if (got < 0 || got >= P || ids[got] != e)
                    GBAD("expert %lld row %lld: %d (id %d), expected a pair of expert %lld", (long long)e,
                         (long long)(off[e] + i), got, got >= 0 && got < P ? ids[got] : -1, (long long)e);
            }
            for (int64_t r = off[e] + cnt[e]; r < off[e + 1]; r++)
                if (sorted[r] != P) GBAD("expert %lld padding row %lld = %d, expected the sentinel %lld", (long long)e,
                                         (long long)r, sorted[r], (long long)P);
        }
        /* past the last run nothing is written: the poison stays */
        for (int64_t r = off[E]; r < cap; r++)
            if (sorted[r] != 0x7F7F7F7F) GBAD("row %lld past the runs (%lld rows) = %d, expected untouched",
                                              (long long)r, (long long)off[E], sorted[r]);
        /* every valid pair exactly once among the runs (with the check above: in its own expert's run) */
        char *seen = calloc((size_t)NVFP4MOE_MAX(P, 1), 1);
        for (int64_t e = 0; e < E; e++)
            for (int64_t i = 0; i < cnt[e]; i++) {
                const int32_t got = sorted[off[e] + i];
                if (got < 0 || got >= P) continue;
                if (seen[got]) GBAD("pair %d placed twice (row %lld)", got, (long long)(off[e] + i));
                seen[got] = 1;
            }
        for (int64_t p = 0; p < P; p++)
            if (ids[p] >= 0 && ids[p] < E && !seen[p]) GBAD("pair %lld (expert %d) not placed", (long long)p, ids[p]);
        free(seen);
#undef GBAD
        if (bad > 6) logf_(&l, "\n    ... %lld mismatches in all", (long long)bad);
        l.failed = bad > 0;
        logf_(&l, "%s: %s (num_blocks %d)\n", l.failed ? "\n   " : "", l.failed ? "FAIL" : "ok", nb);
    }
out:
    pthread_mutex_lock(&g_gpu);
    if (d_ids) cudaFree(d_ids);
    if (d_sorted) cudaFree(d_sorted);
    if (d_bexp) cudaFree(d_bexp);
    if (d_nb) cudaFree(d_nb);
    pthread_mutex_unlock(&g_gpu);
    free(ids); free(sorted); free(bexp); free(cnt); free(off);
    finish(&l, 0);
}

/* ======================= 2./3. the layer against the reference ======================= */

enum special {
    SP_NONE = 0,
    SP_EMPTY,          /* M = 0 */
    SP_IDLE_EXPERT,    /* precomputed top-k that never picks experts 0 and 3 */
    SP_ONE_EXPERT,     /* precomputed top-1: every token to one expert */
    SP_GRAPH,          /* CUDA graph capture + replay == eager */
    SP_PLAN_API,       /* through nvfp4moe_plan_create with device weights */
    SP_HOT,            /* router logits that send 15/16 of the tokens to expert 0 first */
};

/* The backends under test, by index (layer_case.be): every row of the backend table whose
 * implementation runs on a GPU, in this order (the order the case grid is dealt in), then any
 * other such row. W4A16 ones run a W4A4 config as W4A16, as their implementation says. */
enum { MAX_BE = 16 };
static struct {
    const char *name;
    const nvfp4moe_backend_impl *impl;
    bool w4a16;
} k_be[MAX_BE];
static int g_nbe;

static void add_backend(const char *name) {
    const nvfp4moe_backend_impl *impl = nvfp4moe_backend_impl_find(name);
    if (!impl || !impl->device_memory || g_nbe == MAX_BE) return;
    for (int b = 0; b < g_nbe; b++)
        if (k_be[b].impl == impl) return;
    k_be[g_nbe].name = name;
    k_be[g_nbe].impl = impl;
    k_be[g_nbe].w4a16 = impl->effective_scheme(NVFP4MOE_SCHEME_W4A4) == NVFP4MOE_SCHEME_W4A16;
    g_nbe++;
}

static void find_backends(void) {
    add_backend("MARLIN");   /* first, in the order the grid has always been dealt in */
    add_backend("HOPPER_WGMMA");
    add_backend("EMULATION");
    for (int i = 0; i < nvfp4moe_backend_count(); i++) add_backend(nvfp4moe_backend_name(i));
}

/* Whether backend b's kernels run on this GPU (its implementation's sm range). */
static bool be_runs_here(int b, char *why, size_t len) {
    return nvfp4moe_impl_runs_on_sm(k_be[b].impl, g_dev.sm, why, len);
}

typedef struct layer_case {
    int be;                   /* index into k_be */
    int M, I, H, E, k;
    nvfp4moe_activation act;
    bool limit;
    nvfp4moe_dtype dt;
    nvfp4moe_routing routing;
    bool bias, weight_on_input;
    enum special sp;
    bool split;               /* w13_up_scale_2: the up half's own global scale, 1x to 10x the gate's */
} layer_case;

static const char *sp_name(enum special s) {
    switch (s) {
    case SP_EMPTY: return " [M=0]";
    case SP_IDLE_EXPERT: return " [experts 0,3 get no tokens]";
    case SP_ONE_EXPERT: return " [all tokens to expert 5]";
    case SP_GRAPH: return " [CUDA graph replay == eager]";
    case SP_PLAN_API: return " [plan API, device weights]";
    case SP_HOT: return " [15/16 of the tokens pick expert 0 first]";
    default: return "";
    }
}

static void run_layer_case(const layer_case *c, uint64_t seed) {
    logbuf l = {.len = 0};
    const char *bname = k_be[c->be].name;
    const bool w4a16 = k_be[c->be].w4a16;
    logf_(&l, "%-12s m=%-3d n=%-4d k=%-4d e=%-3d top_k=%d %-22s limit=%-3s %s %s%s%s%s%s", bname, c->M, c->I,
          c->H, c->E, c->k, nvfp4moe_activation_name(c->act), c->limit ? "on" : "off",
          nvfp4moe_dtype_name(c->dt), nvfp4moe_routing_name(c->routing), c->bias ? " bias" : "",
          c->weight_on_input ? " weight-on-input" : "", sp_name(c->sp),
          c->split ? " [gate/up scales differ, up x1..x10]" : "");

    nvfp4moe_config cfg;
    nvfp4moe_config_init(&cfg);
    cfg.num_experts = c->E;
    cfg.top_k = c->k;
    cfg.hidden_size = c->H;
    cfg.intermediate_size = c->I;
    cfg.in_dtype = cfg.out_dtype = c->dt;
    cfg.activation = c->act;
    cfg.has_swiglu_limit = c->limit;
    cfg.swiglu_limit = c->act == NVFP4MOE_ACT_SILU ? 1.5f : 7.0f; /* tight for silu: the clamp must bite */
    cfg.routing = c->routing;
    cfg.router_logits_dtype = NVFP4MOE_DTYPE_F32;
    cfg.scheme = NVFP4MOE_SCHEME_W4A4;
    cfg.has_bias = c->bias;
    cfg.apply_router_weight_on_input = c->weight_on_input;
    cfg.seed = seed;
    if (c->routing == NVFP4MOE_ROUTING_DEEPSEEK_V3) {
        cfg.n_group = 4;
        cfg.topk_group = 2;
        cfg.has_correction_bias = true;
        cfg.routed_scaling_factor = 2.5f;
    }
    if (c->routing == NVFP4MOE_ROUTING_MINIMAX2) cfg.has_correction_bias = true;
    if (nvfp4moe_config_validate(&cfg) != NVFP4MOE_OK) {
        logf_(&l, ": SKIP (%s)\n", nvfp4moe_last_error());
        finish(&l, 1);
        return;
    }
    const int64_t M = c->M, H = c->H, E = c->E, K = c->k, P = M * K;
    const nvfp4moe_backend_impl *impl = k_be[c->be].impl;
    nvfp4moe_layer *layer = NULL;
    uint16_t *hidden = malloc(sizeof(uint16_t) * (size_t)NVFP4MOE_MAX(M * H, 1));
    float *logits = malloc(sizeof(float) * (size_t)NVFP4MOE_MAX(M * E, 1));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)NVFP4MOE_MAX(P, 1));
    float *wts = malloc(sizeof(float) * (size_t)NVFP4MOE_MAX(P, 1));
    uint16_t *out = malloc(sizeof(uint16_t) * (size_t)NVFP4MOE_MAX(M * H, 1));
    uint16_t *out2 = malloc(sizeof(uint16_t) * (size_t)NVFP4MOE_MAX(M * H, 1));
    void *d_hidden = NULL, *d_logits = NULL, *d_ids = NULL, *d_wts = NULL, *d_out = NULL, *d_ws = NULL;
    void *state = NULL;
    nvfp4moe_plan *plan = NULL;
    void *d_w[12] = {0};
    float *up_scale = NULL;
    cudaStream_t stream = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t gexec = NULL;
    double t_gpu = 0;
    bool gpu_locked = false;
    float act_gs[2] = {1.0f, 1.0f}, act_rcp[2] = {1.0f, 1.0f};   /* EMULATION: a1_gs, a2_gs, the GPU's 1/gs */

    if (nvfp4moe_layer_random(&cfg, seed, &layer) != NVFP4MOE_OK) {
        logf_(&l, "\n    FAIL nvfp4moe_layer_random: %s", nvfp4moe_last_error());
        l.failed = 1;
        goto out;
    }
    if (c->split) {
        /* The up half's own global scale: expert e's up weights become 1x, 3.25x, .. 10x what the
         * block scales and the gate's scale say; the reference applies the same. */
        up_scale = malloc(sizeof(float) * (size_t)E);
        for (int64_t e = 0; e < E; e++) up_scale[e] = layer->w.w13_scale_2[e] * (1.0f + 2.25f * (float)(e % 5));
        layer->w.w13_up_scale_2 = up_scale;
    }
    nvfp4moe_fill_normal(hidden, c->dt, M * H, seed * 31 + 5);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, M * E, seed * 31 + 6);
    /* the skewed routing bench --hot-tokens times: one expert holding almost every token, the rest
     * spread, routed from the logits by the GPU itself */
    const int64_t hot =
        c->sp == SP_HOT ? nvfp4moe_hot_expert_logits(logits, M, (int32_t)E, M - M / 16, seed * 31 + 8, NULL) : 0;
    /* routing: the reference's, for every token (the GPU routes by itself unless precomputed) */
    {
        uint64_t rs = seed * 31 + 7;
        if (c->sp == SP_IDLE_EXPERT) {
            for (int64_t t = 0; t < M; t++)
                for (int64_t j = 0; j < K; j++) {
                    int32_t e;
                    bool dup;
                    do {
                        e = (int32_t)(nvfp4moe_rand_u64(&rs) % (uint64_t)E);
                        dup = e == 0 || e == 3;
                        for (int64_t q = 0; q < j; q++) dup |= ids[t * K + q] == e;
                    } while (dup);
                    ids[t * K + j] = e;
                    wts[t * K + j] = (float)(0.25 + nvfp4moe_rand_uniform(&rs));
                }
        } else if (c->sp == SP_ONE_EXPERT) {
            for (int64_t p = 0; p < P; p++) {
                ids[p] = 5 % (int32_t)E;
                wts[p] = (float)(0.5 + nvfp4moe_rand_uniform(&rs));
            }
        } else if (M > 0 &&
                   nvfp4moe_route(&cfg, logits, M, layer->w.correction_bias, ids, wts) != NVFP4MOE_OK) {
            logf_(&l, "\n    FAIL nvfp4moe_route: %s", nvfp4moe_last_error());
            l.failed = 1;
            goto out;
        }
    }
    const bool precomputed = c->sp == SP_IDLE_EXPERT || c->sp == SP_ONE_EXPERT;
    if (c->sp == SP_HOT) {
        /* the case is what it says: at least the hot tokens on expert 0 (the reference's routing,
         * which the GPU router's matches bit for bit: part 1) */
        int64_t on0 = 0;
        for (int64_t p = 0; p < P; p++) on0 += ids[p] == 0;
        logf_(&l, " expert 0: %lld of %lld pairs", (long long)on0, (long long)P);
        if (on0 < hot) {
            logf_(&l, "\n    FAIL only %lld pairs on expert 0, %lld hot tokens", (long long)on0, (long long)hot);
            l.failed = 1;
            goto out;
        }
    }

    /* ---- GPU ---- */
    pthread_mutex_lock(&g_gpu);
    gpu_locked = true;
    double t0 = now_s();
    nvfp4moe_status s;
    if (c->sp == SP_PLAN_API) {
        /* device-resident weights through the public API */
        const nvfp4moe_weights *hw = &layer->w;
        const int64_t N1 = nvfp4moe_config_n1(&cfg), I = c->I;
        const void *src[12] = {hw->w13, hw->w13_scale, hw->w13_scale_2, hw->w13_input_scale, hw->w2,
                               hw->w2_scale, hw->w2_scale_2, hw->w2_input_scale, hw->w13_bias,
                               hw->w2_bias, hw->correction_bias, hw->w13_up_scale_2};
        const size_t bytes[12] = {(size_t)(E * N1 * H / 2), (size_t)(E * N1 * H / 16), 4 * (size_t)E,
                                  4 * (size_t)E, (size_t)(E * H * I / 2), (size_t)(E * H * I / 16),
                                  4 * (size_t)E, 4 * (size_t)E, 4 * (size_t)(E * N1), 4 * (size_t)(E * H),
                                  4 * (size_t)E, 4 * (size_t)E};
        for (int i = 0; i < 12; i++) {
            if (!src[i]) continue;
            CU(&l, cudaMalloc(&d_w[i], bytes[i]));
            CU(&l, cudaMemcpy(d_w[i], src[i], bytes[i], cudaMemcpyHostToDevice));
        }
        nvfp4moe_weights dw = {d_w[0], d_w[1], d_w[2], d_w[3], d_w[4],  d_w[5],
                               d_w[6], d_w[7], d_w[8], d_w[9], d_w[10], d_w[11]};
        nvfp4moe_plan_options po = {.backend = bname, .weights_on_device = true};
        /* Bad device weights are refused with the tensor and the element named, as host weights
         * are: a NaN block scale (the last of w2_scale, then one in the middle of w13_scale) and a
         * NaN per-expert scale. Each is put back before the next. */
        {
            const int64_t kb2 = I / 16, kb1 = H / 16;
            const struct { int tensor; size_t off; uint8_t bad[4]; size_t n; char want[96]; } pokes[4] = {
                {5, (size_t)(E * H * kb2 - 1), {0xFF}, 1, ""},
                {1, (size_t)((1 * N1 + 3) * kb1 + 2), {0x7F}, 1, "w13_scale[expert 1][row 3][block 2] is NaN (E4M3 code 0x7F)"},
                {2, 4 * (size_t)(E - 1), {0x00, 0x00, 0xC0, 0x7F}, 4, ""},
                {11, 4 * 2, {0x00, 0x00, 0xC0, 0x7F}, 4, "w13_up_scale_2[expert 2]=nan must be finite"}};
            char want0[96], want2[96];
            snprintf(want0, sizeof want0, "w2_scale[expert %lld][row %lld][block %lld] is NaN (E4M3 code 0xFF)",
                     (long long)(E - 1), (long long)(H - 1), (long long)(kb2 - 1));
            snprintf(want2, sizeof want2, "w13_scale_2[expert %lld]=nan must be finite", (long long)(E - 1));
            for (int q = 0; q < (d_w[11] ? 4 : 3); q++) {
                const char *want = q == 0 ? want0 : q == 2 ? want2 : pokes[q].want;
                uint8_t keep[4];
                char *at = (char *)d_w[pokes[q].tensor] + pokes[q].off;
                CU(&l, cudaMemcpy(keep, at, pokes[q].n, cudaMemcpyDeviceToHost));
                CU(&l, cudaMemcpy(at, pokes[q].bad, pokes[q].n, cudaMemcpyHostToDevice));
                nvfp4moe_plan *bad = NULL;
                s = nvfp4moe_plan_create(&cfg, &dw, &po, &bad);
                if (s != NVFP4MOE_ERR_INVALID_ARGUMENT || bad || !strstr(nvfp4moe_last_error(), want)) {
                    logf_(&l, "\n    FAIL bad device weights: %s, '%s', want INVALID_ARGUMENT naming '%s'",
                          nvfp4moe_status_str(s), nvfp4moe_last_error(), want);
                    l.failed = 1;
                    nvfp4moe_plan_destroy(bad);
                }
                CU(&l, cudaMemcpy(at, keep, pokes[q].n, cudaMemcpyHostToDevice));
            }
            if (l.failed) goto out;
        }
        s = nvfp4moe_plan_create(&cfg, &dw, &po, &plan);
        if (s == NVFP4MOE_OK && (!nvfp4moe_plan_uses_device_memory(plan) || strcmp(nvfp4moe_plan_backend(plan), bname))) {
            logf_(&l, "\n    FAIL plan runs %s (device memory: %d)", nvfp4moe_plan_backend(plan),
                  (int)nvfp4moe_plan_uses_device_memory(plan));
            l.failed = 1;
            goto out;
        }
    } else {
        const nvfp4moe_plan_options host_weights = {.weights_on_device = false};
        s = impl->create(&cfg, &layer->w, &host_weights, &g_dev, &state);
    }
    /* vLLM's EMULATION (TritonExperts) has no gated relu2: the backend must refuse it */
    const bool must_refuse = !w4a16 && c->act == NVFP4MOE_ACT_RELU2;
    if (must_refuse) {
        if (s == NVFP4MOE_ERR_UNSUPPORTED && strstr(nvfp4moe_last_error(), "relu2")) {
            logf_(&l, ": ok (refused: %s)\n", nvfp4moe_last_error());
            goto out_noprint;
        }
        logf_(&l, "\n    FAIL: relu2 accepted (%s), EMULATION must refuse it", nvfp4moe_status_str(s));
        l.failed = 1;
        goto out;
    }
    if (s != NVFP4MOE_OK) {
        logf_(&l, "\n    FAIL create: %s: %s", nvfp4moe_status_str(s), nvfp4moe_last_error());
        l.failed = 1;
        goto out;
    }
    const size_t wsz = plan ? nvfp4moe_plan_workspace_size(plan, M) : impl->workspace_size(state, M);
    CU(&l, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CU(&l, cudaMalloc(&d_hidden, sizeof(uint16_t) * (size_t)NVFP4MOE_MAX(M * H, 1)));
    CU(&l, cudaMalloc(&d_logits, sizeof(float) * (size_t)NVFP4MOE_MAX(M * E, 1)));
    CU(&l, cudaMalloc(&d_ids, sizeof(int32_t) * (size_t)NVFP4MOE_MAX(P, 1)));
    CU(&l, cudaMalloc(&d_wts, sizeof(float) * (size_t)NVFP4MOE_MAX(P, 1)));
    CU(&l, cudaMalloc(&d_out, sizeof(uint16_t) * (size_t)NVFP4MOE_MAX(M * H, 1)));
    if (wsz) CU(&l, cudaMalloc(&d_ws, wsz));
    CU(&l, cudaMemcpy(d_hidden, hidden, sizeof(uint16_t) * (size_t)(M * H), cudaMemcpyHostToDevice));
    CU(&l, cudaMemcpy(d_logits, logits, sizeof(float) * (size_t)(M * E), cudaMemcpyHostToDevice));
    CU(&l, cudaMemcpy(d_ids, ids, sizeof(int32_t) * (size_t)P, cudaMemcpyHostToDevice));
    CU(&l, cudaMemcpy(d_wts, wts, sizeof(float) * (size_t)P, cudaMemcpyHostToDevice));
    /* poison: the output (0xFFFF is a NaN in bf16 and fp16) and the workspace */
    CU(&l, cudaMemset(d_out, 0xFF, sizeof(uint16_t) * (size_t)NVFP4MOE_MAX(M * H, 1)));
    if (wsz) CU(&l, cudaMemset(d_ws, 0xFF, wsz));
    /* cudaMemset and pageable cudaMemcpy may return before the device has finished them, and the
     * forward runs on a non-blocking stream, which does not wait for the legacy stream: without
     * this a late poison fill could land on the workspace mid-forward (EMULATION's quantizers turn
     * the NaN into finite values, so it showed as a rare 1e-2 mismatch, not as a NaN) */
    CU(&l, cudaDeviceSynchronize());
    nvfp4moe_io io = {.num_tokens = M, .hidden = d_hidden, .router_logits = precomputed ? NULL : d_logits,
                      .topk_ids = precomputed ? d_ids : NULL, .topk_weights = precomputed ? d_wts : NULL,
                      .output = d_out, .workspace = d_ws, .workspace_size = wsz};
    s = plan ? nvfp4moe_plan_forward(plan, &io, stream) : impl->forward(state, &io, stream);
    if (s != NVFP4MOE_OK) {
        logf_(&l, "\n    FAIL forward: %s: %s", nvfp4moe_status_str(s), nvfp4moe_last_error());
        l.failed = 1;
        goto out;
    }
    CU(&l, cudaStreamSynchronize(stream));
    CU(&l, cudaGetLastError());
    CU(&l, cudaMemcpy(out, d_out, sizeof(uint16_t) * (size_t)(M * H), cudaMemcpyDeviceToHost));
    if (!w4a16) {
        /* the GPU's reciprocals of the activation global scales, which its QDQs' s / gs multiply with */
        nvfp4moe_w4a4_global_scales(&cfg, &layer->w, &act_gs[0], &act_gs[1]);
        CU(&l, nvfp4moe_emul_triton_rcp(act_gs, act_rcp, 2));
        for (int i = 0; i < 2; i++)
            if (act_rcp[i] != 1.0f / act_gs[i])
                logf_(&l, " [GPU 1/%s %a, RN %a]", i ? "a2_gs" : "a1_gs", (double)act_rcp[i], (double)(1.0f / act_gs[i]));
    }
    if (c->sp == SP_GRAPH) {
        /* capture the same forward, poison everything again, replay twice, compare bitwise */
        CU(&l, cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        s = impl->forward(state, &io, stream);
        cudaError_t ce = cudaStreamEndCapture(stream, &graph);
        if (s != NVFP4MOE_OK) {
            logf_(&l, "\n    FAIL forward under capture: %s", nvfp4moe_last_error());
            l.failed = 1;
            goto out;
        }
        CU(&l, ce);
        CU(&l, cudaGraphInstantiate(&gexec, graph, 0));
        for (int rep = 0; rep < 2; rep++) {
            CU(&l, cudaMemsetAsync(d_out, 0xFF, sizeof(uint16_t) * (size_t)(M * H), stream));
            CU(&l, cudaMemsetAsync(d_ws, 0xFF, wsz, stream));
            CU(&l, cudaGraphLaunch(gexec, stream));
        }
        CU(&l, cudaStreamSynchronize(stream));
        CU(&l, cudaMemcpy(out2, d_out, sizeof(uint16_t) * (size_t)(M * H), cudaMemcpyDeviceToHost));
        /* EMULATION sums in a fixed order: the replay must equal eager bit for bit. MARLIN's
         * stream-K and HOPPER_WGMMA's split-K add fp32 partial sums with atomics, whose order varies
         * from run to run: a GEMM1 value one 16-bit step apart then moves every GEMM2 sum it feeds,
         * so an output may differ by one step of its own type plus 2^-10 of the largest output
         * magnitude (outputs near zero come from cancellation, where one step is tiny). */
        const bool fixed_order = strcmp(bname, "EMULATION") == 0;
        double outmax = 0;
        for (int64_t i = 0; i < M * H; i++) {
            float a;
            nvfp4moe_to_float(c->dt, &out[i], 1, &a);
            if (isfinite(a)) outmax = fmax(outmax, fabs(a));
        }
        int64_t diff = 0, far = 0;
        for (int64_t i = 0; i < M * H; i++) {
            if (out[i] == out2[i]) continue;
            diff++;
            float a, b;
            nvfp4moe_to_float(c->dt, &out[i], 1, &a);
            nvfp4moe_to_float(c->dt, &out2[i], 1, &b);
            const double step = ldexp(fmax(fabs(a), fabs(b)), c->dt == NVFP4MOE_DTYPE_BF16 ? -7 : -10);
            far += fixed_order || !(fabs((double)a - b) <= step + ldexp(outmax, -10));
        }
        logf_(&l, "\n    graph replay: %lld of %lld values differ from eager, %lld by more than %s", (long long)diff,
              (long long)(M * H), (long long)far, fixed_order ? "nothing" : "one 16-bit step + 2^-10 max|out|");
        if (far) l.failed = 1;
    }
    t_gpu = now_s() - t0;
    pthread_mutex_unlock(&g_gpu);
    gpu_locked = false;

    if (M == 0) {
        logf_(&l, ": %s (forward of 0 tokens returned OK, workspace %zu bytes)\n", l.failed ? "FAIL" : "ok", wsz);
        goto out_noprint;
    }
    /* fully written and finite */
    int64_t nonfinite = 0;
    for (int64_t i = 0; i < M * H; i++)
        if (!isfinite(half_to_f(c->dt, out, i))) {
            if (nonfinite < 3)
                logf_(&l, "\n    output[%lld][%lld] = 0x%04x is not finite (unwritten or NaN)",
                      (long long)(i / H), (long long)(i % H), out[i]);
            nonfinite++;
        }
    if (nonfinite) {
        logf_(&l, "\n    FAIL %lld of %lld outputs not finite", (long long)nonfinite, (long long)(M * H));
        l.failed = 1;
    }

    /* ---- reference on a spread subset of tokens ---- */
    {
        const int64_t N1 = nvfp4moe_config_n1(&cfg);
        const double per_tok = (double)K * (double)(N1 + c->I) * (double)H;
        int64_t R = (int64_t)(1.5e9 / per_tok);
        R = NVFP4MOE_MAX(R, 8);
        R = NVFP4MOE_MIN(R, M);
        int64_t *rows = malloc(sizeof(int64_t) * (size_t)R);
        for (int64_t r = 0; r < R; r++) rows[r] = R == 1 ? 0 : r * (M - 1) / (R - 1);
        uint16_t *sh = malloc(sizeof(uint16_t) * (size_t)(R * H));
        int32_t *sids = malloc(sizeof(int32_t) * (size_t)(R * K));
        float *sw = malloc(sizeof(float) * (size_t)(R * K));
        float *ref = malloc(sizeof(float) * (size_t)(R * H));
        for (int64_t r = 0; r < R; r++) {
            memcpy(sh + r * H, hidden + rows[r] * H, sizeof(uint16_t) * (size_t)H);
            memcpy(sids + r * K, ids + rows[r] * K, sizeof(int32_t) * (size_t)K);
            memcpy(sw + r * K, wts + rows[r] * K, sizeof(float) * (size_t)K);
        }
        nvfp4moe_config rcfg = cfg;
        rcfg.out_dtype = NVFP4MOE_DTYPE_F32;               /* an unrounded reference */
        if (w4a16) rcfg.scheme = NVFP4MOE_SCHEME_W4A16; /* W4A16 drops the activation scales */
        nvfp4moe_io rio = {.num_tokens = R, .hidden = sh, .topk_ids = sids, .topk_weights = sw, .output = ref};
        s = nvfp4moe_reference_forward(&rcfg, &layer->w, &rio);
        /* EMULATION is judged against vLLM's EMULATION path on the host (src/reference/emulation.c),
         * which rounds where vLLM's kernels round, its QDQs dividing by the global scales as the GPU
         * does; the float64 reference only guards gross errors */
        float *emu = NULL;
        if (s == NVFP4MOE_OK && !w4a16) {
            emu = malloc(sizeof(float) * (size_t)(R * H));
            nvfp4moe_io eio = rio;
            eio.output = emu;
            s = nvfp4moe_emulation_forward_host_rcp(&rcfg, &layer->w, &eio, act_rcp);
        }
        if (s != NVFP4MOE_OK) {
            logf_(&l, "\n    FAIL reference: %s", nvfp4moe_last_error());
            l.failed = 1;
        } else {
            double num = 0, den = 0, max_abs = 0, enum_ = 0, eden = 0;
            int64_t bad = 0;
            for (int64_t r = 0; r < R; r++)
                for (int64_t h = 0; h < H; h++) {
                    const double g = half_to_f(c->dt, out, rows[r] * H + h), f = ref[r * H + h];
                    const double d = fabs(g - f);
                    num += d * d;
                    den += f * f;
                    if (d > max_abs || isnan(d)) max_abs = d;
                    bool ok = isfinite(g);
                    if (emu) {  /* vLLM's element rule, against vLLM's own path */
                        const double e = emu[r * H + h], de = fabs(g - e);
                        enum_ += de * de;
                        eden += e * e;
                        ok = ok && de <= 0.1 + 0.1 * fabs(e);
                    }
                    if (!ok) {
                        if (bad < 4)
                            logf_(&l, "\n    token %lld col %lld: %.6g, reference %.6g", (long long)rows[r],
                                  (long long)h, g, f);
                        bad++;
                    }
                }
            const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
            if (w4a16 && !(rel <= 1e-2)) {
                logf_(&l, "\n    FAIL rel err %.3e > 1e-2", rel);
                l.failed = 1;
            }
            if (emu) {
                const double erel = eden > 0 ? sqrt(enum_ / eden) : sqrt(enum_);
                logf_(&l, " emulation-path rel=%.2e", erel);
                if (!(erel <= 1e-2) || !(rel <= 0.15)) {
                    logf_(&l, "\n    FAIL rel err %.3e vs the host EMULATION path (<= 1e-2), %.3e vs the float64 "
                          "reference (<= 0.15)", erel, rel);
                    l.failed = 1;
                }
            }
            if (bad) {
                logf_(&l, "\n    FAIL %lld of %lld checked values outside atol=rtol=0.1 of the EMULATION path", (long long)bad,
                      (long long)(R * H));
                l.failed = 1;
            }
            logf_(&l, "%s: %s rel=%.2e max_abs=%.2e tokens checked %lld/%lld (gpu %.0f ms)\n",
                  l.failed ? "\n   " : "", l.failed ? "FAIL" : "ok", rel, max_abs, (long long)R, (long long)M,
                  1e3 * t_gpu);
        }
        free(rows); free(sh); free(sids); free(sw); free(ref); free(emu);
    }
    goto out_noprint;

out:
    logf_(&l, "\n    FAIL\n");
    l.failed = 1;
out_noprint:
    if (!gpu_locked) pthread_mutex_lock(&g_gpu);  /* frees synchronize: keep them off other cases' captures */
    if (gexec) cudaGraphExecDestroy(gexec);
    if (graph) cudaGraphDestroy(graph);
    if (stream) cudaStreamDestroy(stream);
    if (state) impl->destroy(state);
    if (plan) nvfp4moe_plan_destroy(plan);
    for (int i = 0; i < 12; i++)
        if (d_w[i]) cudaFree(d_w[i]);
    if (d_hidden) cudaFree(d_hidden);
    if (d_logits) cudaFree(d_logits);
    if (d_ids) cudaFree(d_ids);
    if (d_wts) cudaFree(d_wts);
    if (d_out) cudaFree(d_out);
    if (d_ws) cudaFree(d_ws);
    pthread_mutex_unlock(&g_gpu);
    nvfp4moe_layer_free(layer);
    free(up_scale);
    free(hidden); free(logits); free(ids); free(wts); free(out); free(out2);
    finish(&l, 0);
}

/* ======================= the case lists and the worker pool ======================= */

#define MAX_CASES 512
typedef struct job {
    bool is_route, is_group;
    route_case rc;
    group_case gc;
    layer_case lc;
} job;
static job g_jobs[MAX_CASES];
static int g_njobs, g_next;
static pthread_mutex_t g_take = PTHREAD_MUTEX_INITIALIZER;

/* The cases' inputs: case i draws from 0x6A7E5EED + 1000003 i + g_seed_base, the time by
 * default (printed; GPUTEST_SEED=N runs the same inputs again). */
static uint64_t g_seed_base;

static void *worker(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&g_take);
        int i = g_next < g_njobs ? g_next++ : -1;
        pthread_mutex_unlock(&g_take);
        if (i < 0) return NULL;
        const uint64_t seed = 0x6A7E5EEDull + 1000003ull * (uint64_t)i + g_seed_base;
        if (g_jobs[i].is_route) run_route_case(&g_jobs[i].rc, seed);
        else if (g_jobs[i].is_group) run_group_case(&g_jobs[i].gc, seed);
        else run_layer_case(&g_jobs[i].lc, seed);
    }
}

/* --only: 0 every case, 1 routing, 2 grouping, 3 layers */
static int g_only;

static void add_route(route_case rc) {
    if (g_only && g_only != 1) return;
    if (g_njobs < MAX_CASES) g_jobs[g_njobs++] = (job){.is_route = true, .rc = rc};
}
static void add_group(group_case gc) {
    if (g_only && g_only != 2) return;
    if (g_njobs < MAX_CASES) g_jobs[g_njobs++] = (job){.is_group = true, .gc = gc};
}
static void add_layer(layer_case lc) {
    char why[96];
    if (g_only && g_only != 3) return;
    if (!be_runs_here(lc.be, why, sizeof why)) return;  /* announced in main */
    if (g_njobs < MAX_CASES) g_jobs[g_njobs++] = (job){.is_route = false, .lc = lc};
}

/* vLLM's grid (m, n, k, e, top_k), sampled: every value of each appears, large e only with small
 * n*k (the reference and the random layer cost e*n*k on the CPU). */
static const int k_shapes[][5] = {
    {1, 128, 256, 8, 2},      {2, 1024, 1024, 40, 6},   {64, 3072, 1024, 8, 2},
    {123, 2048, 1536, 8, 1},  {224, 1024, 1536, 64, 8}, {666, 128, 2048, 256, 8},
    {1, 3072, 2048, 8, 1},    {64, 128, 256, 256, 6},   {666, 1024, 256, 40, 2},
    {224, 2048, 1024, 40, 6}, {123, 128, 1536, 64, 8},  {2, 2048, 2048, 8, 8},
};
#define N_SHAPES ((int)(sizeof k_shapes / sizeof k_shapes[0]))

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--only")) {
        static const char *const kinds[] = {"route", "group", "layer"};
        for (int i = 0; i < 3; i++)
            if (!strcmp(argv[2], kinds[i])) g_only = i + 1;
    }
    if (argc != 1 && !g_only) {
        fprintf(stderr, "usage: gpu_test [--only route|group|layer]\n");
        return 2;
    }
    if (nvfp4moe_device_detect(&g_dev) != NVFP4MOE_OK || !g_dev.is_cuda) {
        printf("gpu_test: no CUDA GPU found (%s)\n", nvfp4moe_last_error());
        t_record(0);
        return t_finish("gpu_test");
    }
    const char *seed_env = getenv("GPUTEST_SEED");
    g_seed_base = seed_env && *seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL);
    printf("gpu_test on %s (sm_%d, %d SMs), nvfp4moe %s, inputs GPUTEST_SEED=%llu\n", g_dev.name, g_dev.sm,
           g_dev.sm_count, nvfp4moe_version(), (unsigned long long)g_seed_base);
    find_backends();

    /* 1. routing */
    const nvfp4moe_routing methods[] = {
        NVFP4MOE_ROUTING_SOFTMAX_TOPK, NVFP4MOE_ROUTING_RENORMALIZE, NVFP4MOE_ROUTING_RENORMALIZE_NAIVE,
        NVFP4MOE_ROUTING_DEEPSEEK_V3, NVFP4MOE_ROUTING_LLAMA4, NVFP4MOE_ROUTING_SIGMOID,
        NVFP4MOE_ROUTING_SIGMOID_RENORM, NVFP4MOE_ROUTING_MINIMAX2, NVFP4MOE_ROUTING_SIMULATED};
    const int Es[] = {8, 40, 64, 256, 384};
    const int Ks[] = {1, 2, 6, 8};
    const int Ms[] = {1, 7, 64, 500};
    int v = 0;
    for (size_t mi = 0; mi < sizeof methods / sizeof methods[0]; mi++)
        for (int ei = 0; ei < 5; ei++) {
            int k = methods[mi] == NVFP4MOE_ROUTING_LLAMA4 ? 1 : Ks[(ei + mi) % 4];
            if (methods[mi] == NVFP4MOE_ROUTING_DEEPSEEK_V3 && Es[ei] == 8) k = NVFP4MOE_MIN(k, 4);
            const bool bias = methods[mi] == NVFP4MOE_ROUTING_DEEPSEEK_V3 || methods[mi] == NVFP4MOE_ROUTING_MINIMAX2;
            add_route((route_case){methods[mi], Es[ei], k, Ms[v % 4], NVFP4MOE_DTYPE_F32, bias && (v & 1)});
            add_route((route_case){methods[mi], Es[ei], k, Ms[(v + 1) % 4], NVFP4MOE_DTYPE_BF16, bias});
            v++;
        }

    /* 16 pairs: the routing grid, then the single-block grouping (chained in pass 1) */
    add_route((route_case){NVFP4MOE_ROUTING_RENORMALIZE, 128, 1, 16, NVFP4MOE_DTYPE_BF16, false});
    /* routing at large batches too: the routing grid, then the multi-block grouping */
    add_route((route_case){NVFP4MOE_ROUTING_DEEPSEEK_V3, 256, 8, 4096, NVFP4MOE_DTYPE_BF16, true});
    add_route((route_case){NVFP4MOE_ROUTING_RENORMALIZE, 128, 8, 4096, NVFP4MOE_DTYPE_F32, false});
    /* 1b. the grouping alone: DeepSeek-V3 (E=256) and Qwen3-MoE (E=128) at M=4096 top-8 with
     * MARLIN's and the Hopper GEMM's block_m, block_m 1 (bench), invalid ids, a P that is no
     * multiple of any chunk, skewed and one-expert routing, P past the largest grid (M=16384),
     * E=1024, a few pairs on both sides of the switch to the single block (32 pairs), M=0; on
     * sm_90 the cluster path with 1024 experts (two per scan thread), with a chunk too large to
     * keep in shared memory (393K pairs), and with every pair on one expert; chunks left empty
     * at the end of the grid (65 and 1000 pairs) */
    const group_case groups[] = {
        {256, 4096, 8, 64, GI_UNIFORM}, {256, 4096, 8, 128, GI_UNIFORM}, {128, 4096, 8, 64, GI_UNIFORM},
        {128, 4096, 8, 128, GI_UNIFORM}, {256, 4096, 8, 1, GI_UNIFORM},  {256, 3001, 8, 64, GI_INVALID},
        {128, 4096, 8, 64, GI_HOT},      {64, 5003, 1, 16, GI_ONE},      {256, 16384, 8, 64, GI_UNIFORM},
        {1024, 4099, 6, 16, GI_INVALID}, {40, 700, 6, 48, GI_UNIFORM},   {128, 1021, 8, 32, GI_INVALID},
        {16, 4095, 1, 32, GI_UNIFORM},   {256, 64, 8, 16, GI_INVALID},   {64, 5, 8, 16, GI_INVALID},
        {64, 4, 8, 8, GI_UNIFORM},       {128, 31, 1, 8, GI_UNIFORM},    {8, 1, 2, 8, GI_UNIFORM},
        {256, 0, 8, 64, GI_UNIFORM},
        {1024, 16384, 8, 64, GI_UNIFORM}, {1024, 49152, 8, 64, GI_INVALID}, {64, 32768, 1, 64, GI_ONE},
        {16, 65, 1, 8, GI_UNIFORM},       {40, 125, 8, 16, GI_INVALID},
    };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) add_group(groups[i]);

    /* 2. every activation x limit x backend on the sampled grid */
    const nvfp4moe_routing fwd_routing[] = {NVFP4MOE_ROUTING_RENORMALIZE, NVFP4MOE_ROUTING_SOFTMAX_TOPK,
                                            NVFP4MOE_ROUTING_DEEPSEEK_V3, NVFP4MOE_ROUTING_SIGMOID_RENORM,
                                            NVFP4MOE_ROUTING_MINIMAX2, NVFP4MOE_ROUTING_RENORMALIZE_NAIVE,
                                            NVFP4MOE_ROUTING_SIMULATED, NVFP4MOE_ROUTING_SIGMOID};
    int si = 0, ri = 0;
    for (int b = 0; b < g_nbe; b++)
        for (int a = 0; a < NVFP4MOE_ACT_COUNT; a++)
            for (int lim = 0; lim < 2; lim++) {
                const nvfp4moe_activation act = (nvfp4moe_activation)a;
                const bool clampable = act == NVFP4MOE_ACT_SILU || act == NVFP4MOE_ACT_SWIGLUOAI ||
                                       act == NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE || act == NVFP4MOE_ACT_SWIGLUSTEP;
                if (lim && !clampable) continue;
                if (!lim && act == NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE) continue; /* needs its limit */
                const int *sh = k_shapes[si++ % N_SHAPES];
                add_layer((layer_case){.be = b, .M = sh[0], .I = sh[1], .H = sh[2], .E = sh[3],
                                       .k = sh[4], .act = act, .limit = lim, .dt = (si & 1) ? NVFP4MOE_DTYPE_BF16
                                                                                         : NVFP4MOE_DTYPE_FP16,
                                       .routing = fwd_routing[ri++ % 8]});
            }
    /* 3. edge cases, every backend */
    for (int b = 0; b < g_nbe; b++) {
        const int m = b;
        const nvfp4moe_dtype bf = NVFP4MOE_DTYPE_BF16;
        add_layer((layer_case){m, 0, 256, 512, 8, 2, NVFP4MOE_ACT_SILU, false, bf, NVFP4MOE_ROUTING_RENORMALIZE,
                               false, false, SP_EMPTY, false});
        add_layer((layer_case){m, 64, 256, 512, 8, 2, NVFP4MOE_ACT_SILU, false, bf, NVFP4MOE_ROUTING_RENORMALIZE,
                               false, false, SP_IDLE_EXPERT, false});
        add_layer((layer_case){m, 666, 512, 256, 8, 1, NVFP4MOE_ACT_SILU, true, bf, NVFP4MOE_ROUTING_RENORMALIZE,
                               false, false, SP_ONE_EXPERT, false});
        /* 480 of 512 tokens on expert 0, 64 pairs per expert on average: HOPPER_WGMMA's wgmma GEMM */
        add_layer((layer_case){m, 512, 512, 1024, 64, 8, NVFP4MOE_ACT_SILU, false, bf, NVFP4MOE_ROUTING_RENORMALIZE,
                               false, false, SP_HOT, false});
        add_layer((layer_case){m, 123, 1024, 1024, 40, 6, NVFP4MOE_ACT_SILU, false, bf, NVFP4MOE_ROUTING_RENORMALIZE,
                               false, false, SP_GRAPH, false});
        add_layer((layer_case){m, 1, 2048, 2048, 64, 8, NVFP4MOE_ACT_SWIGLUOAI, true, bf,
                               NVFP4MOE_ROUTING_DEEPSEEK_V3, false, false, SP_GRAPH, false});
        add_layer((layer_case){m, 224, 128, 1024, 16, 1, NVFP4MOE_ACT_SILU, false, bf, NVFP4MOE_ROUTING_LLAMA4,
                               false, true, SP_NONE, false});
        add_layer((layer_case){m, 64, 256, 1024, 8, 2, NVFP4MOE_ACT_GELU, false, NVFP4MOE_DTYPE_FP16,
                               NVFP4MOE_ROUTING_RENORMALIZE, true, false, SP_NONE, false});
        add_layer((layer_case){m, 64, 1024, 1024, 40, 6, NVFP4MOE_ACT_SILU, true, bf, NVFP4MOE_ROUTING_RENORMALIZE,
                               false, false, SP_PLAN_API, false});
        /* 4. gate and up halves with global scales of their own */
        add_layer((layer_case){m, 1, 2048, 2048, 64, 8, NVFP4MOE_ACT_SILU, false, bf, NVFP4MOE_ROUTING_RENORMALIZE,
                               false, false, SP_NONE, true});
        add_layer((layer_case){m, 2, 1024, 1024, 40, 6, NVFP4MOE_ACT_SWIGLUOAI, true, bf,
                               NVFP4MOE_ROUTING_RENORMALIZE, true, false, SP_NONE, true});
        add_layer((layer_case){m, 224, 1024, 1536, 64, 8, NVFP4MOE_ACT_SILU, true, bf, NVFP4MOE_ROUTING_DEEPSEEK_V3,
                               false, false, SP_NONE, true});
        add_layer((layer_case){m, 666, 512, 1024, 8, 2, NVFP4MOE_ACT_SWIGLUOAI, true, NVFP4MOE_DTYPE_FP16,
                               NVFP4MOE_ROUTING_RENORMALIZE, false, false, SP_NONE, true});
        add_layer((layer_case){m, 64, 256, 512, 8, 2, NVFP4MOE_ACT_GELU, false, bf, NVFP4MOE_ROUTING_RENORMALIZE,
                               false, false, SP_GRAPH, true});
        add_layer((layer_case){m, 64, 1024, 1024, 40, 6, NVFP4MOE_ACT_SWIGLUOAI, true, bf,
                               NVFP4MOE_ROUTING_RENORMALIZE, false, false, SP_PLAN_API, true});
        add_layer((layer_case){m, 123, 256, 512, 16, 2, NVFP4MOE_ACT_SILU_NO_MUL, false, bf,
                               NVFP4MOE_ROUTING_RENORMALIZE, false, false, SP_NONE, true});
    }

    for (int b = 0; b < g_nbe; b++) {
        char why[96];
        if (!be_runs_here(b, why, sizeof why)) printf("%s: not tested: %s\n", k_be[b].name, why);
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = (int)NVFP4MOE_MAX(1, NVFP4MOE_MIN(ncpu, 16));
    printf("%d cases on %d threads\n", g_njobs, nthreads);
    fflush(stdout);
    double t0 = now_s();
    pthread_t th[16];
    for (int i = 0; i < nthreads; i++) pthread_create(&th[i], NULL, worker, NULL);
    for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
    printf("gpu_test: %d skipped (invalid configs), %.1f s\n", g_skipped, now_s() - t0);
    return t_finish("gpu_test");
}
