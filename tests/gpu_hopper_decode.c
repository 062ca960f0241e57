/*
 * gpu_hopper_decode.c - correctness test and streaming microbenchmark of HOPPER_WGMMA's decode
 * kernels (kernels/hopper_decode.cu: GEMM1 + activation, GEMM2 + router weight + combine).
 * CUDA builds only; needs a GPU. On a device other than compute capability 9.0 it only checks
 * that the kernels refuse to run (cudaErrorNoKernelImageForDevice).
 *
 *   gpu_hopper_decode              correctness grid against a CPU float64 reference
 *   gpu_hopper_decode --case I     case I alone (for compute-sanitizer)
 *   gpu_hopper_decode --stream     one expert's packed weights (N x K = 65536 x 7168, 264 MB)
 *                                  streamed at M = 1: median time, TB/s, and the device-to-device
 *                                  copy bandwidth measured in the same run; then a DeepSeek-V3
 *                                  and a Qwen3-30B-A3B layer at M = 1 timed kernel by kernel
 *   gpu_hopper_decode --coldcode   the M = 1 layers' kernels timed cold and with their code warm,
 *                                  read probes of the same bytes (no decode), the routing alone
 *
 * Each case: random top-k routing (distinct experts per token, some experts empty, optionally a
 * slot per token sent to expert -1 as expert parallelism does), the grouping built on the host,
 * random E2M1 codes, realistic E4M3 block scales (zeros, subnormals, negatives), per-expert
 * scale_2 (GEMM1: optionally per (expert, half), gate and up up to 10x apart), optional biases,
 * random activations and router weights. Checked, in double:
 *   GEMM1: act[p, i] = act(s2g[e] * (x[t] . W13_e[gate i]) + b, s2u[e] * (x[t] . W13_e[up i]) + b),
 *          the activation being the float64 reference's (nvfp4moe_activation_ref, the same config)
 *          against the kernel's bf16/fp16 act rows (relative error <= 1e-2 by norm; every valid
 *          row written, no sentinel row touched);
 *   GEMM2: out[t, h] = sum_j w[t, j] * (s2[e_j] * (act[p] . W2_e[h]) + b) computed from the
 *          kernel's own act rows (so GEMM2 is judged on its exact input), relative error <= 1e-2,
 *          tokens without a valid slot exactly 0, the whole output written (poisoned before);
 *   determinism: a second run, with the combine as a kernel of its own after GEMM2
 *          (nvfp4moe_hopper_decode_combine), gives the same bits.
 * The kernels choose how many warps share an item on the device; the kw cases force each choice.
 * The route cases run GEMM1 with the routing and grouping inside: its grouping must equal the
 * host's bit for bit, and (routing) its ids and weights those of nvfp4moe_gpu_route_and_group on
 * the same logits.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "../kernels/hopper_decode.h"
#include "../kernels/hopper_gemm.h"
#include "../kernels/moe_gemm.h"
#include "../tools/bench_kernels.h"
#include "nvfp4moe.h"
#include "reference/reference.h"

#include "gpu_gemm_common.h"

typedef struct {
    const char *name;
    int E, H, I, M, topk, e_used, block_m;
    int act;       /* nvfp4moe_activation */
    int limit;     /* clamp on (silu / swigluoai) */
    int bias, bf16, row_scale, ep_holes, out_dtype;
    int kw;        /* warps per item forced on both kernels (0: the kernels' choice) */
    int halves;    /* GEMM1's scale_2 per (expert, half): 1 stacked, 2 interleaved (swigluoai) */
    int pdl;       /* both kernels launched with programmatic dependent launch */
    int prefetch;  /* k tiles prefetched into L2 ahead of the loads */
    int room;      /* GEMM1: CTA slots per multiprocessor left free (for GEMM2) */
    int echunks;   /* GEMM2: chunks of the active experts prefetched into L2 before its wait */
    int route;     /* 0: the grouping built on the host; 1: GEMM1 groups the ids itself
                      (nvfp4moe_hopper_decode_route_gemm1 without a router); 2: GEMM1 also routes
                      the tokens from logits with `method` */
    int method;    /* nvfp4moe_routing for route 2 (deepseek_v3: 4 groups, 2 kept, a correction bias) */
} test_case;

static float to_f(int bf16, uint16_t h) { return bf16 ? bf2f(h) : h2f(h); }

static void *dup_dev(const void *h, size_t n) {
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, n ? n : 1));
    if (n) CUDA_OK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

/* Repacked copy of one projection [E, N, K] in the HOPPER_WGMMA layout (device). */
static void *pack(const uint8_t *w, const uint8_t *sf, int E, int N, int K, int bf16) {
    void *dw = dup_dev(w, (size_t)E * N * (K / 2)), *dsf = dup_dev(sf, (size_t)E * N * (K / 16));
    void *out = NULL;
    CUDA_OK(cudaMalloc(&out, nvfp4moe_hopper_packed_bytes(E, N, K)));
    CUDA_OK(nvfp4moe_hopper_repack(dw, dsf, E, N, K, bf16, out, 0));
    CUDA_OK(cudaDeviceSynchronize());
    cudaFree(dw);
    cudaFree(dsf);
    return out;
}

/* [E, N, K] dequantized (e2m1 * e4m3: exact in float). */
static float *dequant(const uint8_t *w, const uint8_t *sf, int E, int N, int K) {
    float *d = malloc(sizeof(float) * (size_t)E * N * K);
    for (size_t r = 0; r < (size_t)E * N; r++)
        for (int k = 0; k < K; k++) {
            const uint8_t byte = w[r * (K / 2) + k / 2];
            d[r * K + k] = (float)(e2m1_val((k & 1) ? byte >> 4 : byte & 15) * e4m3_val(sf[r * (K / 16) + k / 16]));
        }
    return d;
}

static int run_case(const test_case *tc, int sm_count) {
    const int E = tc->E, H = tc->H, I = tc->I, M = tc->M, k = tc->topk, bm = tc->block_m;
    const int P = M * k, bf = tc->bf16;
    const int N1 = nvfp4moe_activation_is_gated((nvfp4moe_activation)tc->act) ? 2 * I : I;
    int fails = 0;

    int32_t *ids = malloc(sizeof(int32_t) * (size_t)P);
    if (tc->e_used < k)  /* a caller's top-k with repeats: pair p on expert p % e_used (several blocks per expert) */
        for (int p = 0; p < P; p++) ids[p] = p % tc->e_used;
    else
        route(M, k, tc->e_used, ids);
    if (tc->ep_holes)  /* slot 0 of every third token is another rank's expert, token 1 has none */
        for (int t = 0; t < M; t++)
            for (int j = 0; j < k; j++)
                if ((t % 3 == 0 && j == 0) || t == 1) ids[t * k + j] = -1;
    /* route 2: the routing kernel's ids and weights on random logits are the case's (and what
     * GEMM1's own routing must reproduce) */
    float *rw_ref = NULL;
    void *d_logits = NULL, *d_cbias = NULL;
    nvfp4moe_gpu_route_params rp = {.method = tc->method, .logits_dtype = NVFP4MOE_DTYPE_F32, .num_experts = E,
                                    .top_k = k, .n_group = 1, .topk_group = 1, .routed_scaling_factor = 2.5f,
                                    .seed = 77};
    if (tc->route == 2) {
        float *lg = malloc(sizeof(float) * (size_t)M * E), *cbias = malloc(sizeof(float) * (size_t)E);
        for (int i = 0; i < M * E; i++) lg[i] = (float)rng_normal();
        for (int e = 0; e < E; e++) cbias[e] = (float)(0.1 * rng_normal());
        d_logits = dup_dev(lg, sizeof(float) * (size_t)M * E);
        d_cbias = dup_dev(cbias, sizeof(float) * (size_t)E);
        if (tc->method == NVFP4MOE_ROUTING_DEEPSEEK_V3) {
            rp.n_group = 4;
            rp.topk_group = 2;
        }
        if (tc->method == NVFP4MOE_ROUTING_DEEPSEEK_V3 || tc->method == NVFP4MOE_ROUTING_MINIMAX2)
            rp.correction_bias = d_cbias;
        const int cap = (int)nvfp4moe_group_capacity(P, E, bm), max_blocks = cap / bm;
        void *d_i = NULL, *d_w = NULL, *d_s = NULL, *d_b = NULL, *d_n = NULL;
        CUDA_OK(cudaMalloc(&d_i, sizeof(int32_t) * (size_t)P));
        CUDA_OK(cudaMalloc(&d_w, sizeof(float) * (size_t)P));
        CUDA_OK(cudaMalloc(&d_s, sizeof(int32_t) * (size_t)cap));
        CUDA_OK(cudaMalloc(&d_b, sizeof(int32_t) * (size_t)max_blocks));
        CUDA_OK(cudaMalloc(&d_n, sizeof(int32_t)));
        CUDA_OK(nvfp4moe_gpu_route_and_group(&rp, d_logits, d_i, d_w, M, k, E, bm, d_s, d_b, d_n, max_blocks, NULL, 0));
        rw_ref = malloc(sizeof(float) * (size_t)P);
        CUDA_OK(cudaMemcpy(ids, d_i, sizeof(int32_t) * (size_t)P, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(rw_ref, d_w, sizeof(float) * (size_t)P, cudaMemcpyDeviceToHost));
        void *tmp[] = {d_i, d_w, d_s, d_b, d_n};
        for (int i = 0; i < 5; i++) cudaFree(tmp[i]);
        free(lg);
        free(cbias);
    }
    grouping g = make_grouping(ids, P, E, bm);

    uint8_t *w13 = malloc((size_t)E * N1 * (H / 2)), *sf13 = malloc((size_t)E * N1 * (H / 16));
    uint8_t *w2 = malloc((size_t)E * H * (I / 2)), *sf2 = malloc((size_t)E * H * (I / 16));
    for (size_t i = 0; i < (size_t)E * N1 * (H / 2); i++) w13[i] = (uint8_t)rng_next();
    for (size_t i = 0; i < (size_t)E * N1 * (H / 16); i++) sf13[i] = rand_scale(1);
    for (size_t i = 0; i < (size_t)E * H * (I / 2); i++) w2[i] = (uint8_t)rng_next();
    for (size_t i = 0; i < (size_t)E * H * (I / 16); i++) sf2[i] = rand_scale(1);
    float *s13 = malloc(sizeof(float) * 2 * E), *s2 = malloc(sizeof(float) * E);
    for (int e = 0; e < E; e++) {
        const double sc = bf ? 0.002 : 0.0002;  /* fp16 outputs must stay below 65504 */
        s13[e] = (float)(sc * (1.0 + rng_unif()));
        s2[e] = (float)(sc * (1.0 + rng_unif()));
    }
    /* gate (s13g) and up (s13u) scales: the same, or with halves [E, 2] pairs up to 10x apart */
    float *s13g = malloc(sizeof(float) * E), *s13u = malloc(sizeof(float) * E);
    for (int e = 0; e < E; e++) {
        s13g[e] = s13u[e] = s13[e];
        if (tc->halves) s13u[e] = (float)(s13[e] * (0.1 + 0.9 * rng_unif()) * (e % 2 ? 10.0 : 1.0));
    }
    if (tc->halves)
        for (int e = 0; e < E; e++) s13[2 * e] = s13g[e], s13[2 * e + 1] = s13u[e];
    float *b13 = NULL, *b2 = NULL;
    if (tc->bias) {
        b13 = malloc(sizeof(float) * (size_t)E * N1);
        b2 = malloc(sizeof(float) * (size_t)E * H);
        for (size_t i = 0; i < (size_t)E * N1; i++) b13[i] = (float)(0.5 * rng_normal());
        for (size_t i = 0; i < (size_t)E * H; i++) b2[i] = (float)(0.05 * rng_normal());
    }
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)M * H);
    for (size_t i = 0; i < (size_t)M * H; i++) {
        const float v = (float)rng_normal();
        x[i] = bf ? f2bf(v) : f2h(v);
    }
    float *rw = malloc(sizeof(float) * (size_t)P);
    for (int p = 0; p < P; p++) rw[p] = rw_ref ? rw_ref[p] : (float)(0.1 + rng_unif());

    void *d_w13 = pack(w13, sf13, E, N1, H, bf), *d_w2 = pack(w2, sf2, E, H, I, bf);
    void *d_s13 = dup_dev(s13, sizeof(float) * (tc->halves ? 2 * E : E)), *d_s2 = dup_dev(s2, sizeof(float) * E);
    void *d_b13 = b13 ? dup_dev(b13, sizeof(float) * (size_t)E * N1) : NULL;
    void *d_b2 = b2 ? dup_dev(b2, sizeof(float) * (size_t)E * H) : NULL;
    void *d_x = dup_dev(x, sizeof(uint16_t) * (size_t)M * H);
    void *d_ids = dup_dev(ids, sizeof(int32_t) * (size_t)P);
    void *d_rw = dup_dev(rw, sizeof(float) * (size_t)P);
    void *d_sorted = dup_dev(g.sorted_ids, sizeof(int32_t) * (size_t)g.cap);
    void *d_bexp = dup_dev(g.block_expert, sizeof(int32_t) * (size_t)g.max_blocks);
    void *d_nb = dup_dev(&g.num_blocks, sizeof(int32_t));
    const int osz = tc->out_dtype == NVFP4MOE_DTYPE_F32 ? 4 : 2;
    void *d_act = NULL, *d_part = NULL, *d_cnt = NULL, *d_out = NULL;
    const size_t act_bytes = sizeof(uint16_t) * (size_t)(P + 2) * I;  // + 2 guard rows
    CUDA_OK(cudaMalloc(&d_act, act_bytes));
    CUDA_OK(cudaMalloc(&d_part, sizeof(float) * (size_t)P * H));
    CUDA_OK(cudaMalloc(&d_cnt, sizeof(int32_t) * nvfp4moe_hopper_decode_counters(M, H) + 4));
    CUDA_OK(cudaMalloc(&d_out, (size_t)osz * M * H));

    /* the activation as a config states it: the float64 reference and the kernel read the same */
    nvfp4moe_config cfg;
    nvfp4moe_config_init(&cfg);
    cfg.activation = (nvfp4moe_activation)tc->act;
    cfg.intermediate_size = I;
    cfg.has_swiglu_limit = tc->limit;
    cfg.swiglu_limit = 7.0;
    const nvfp4moe_act_params cp = nvfp4moe_config_act_params(&cfg);
    nvfp4moe_gpu_act_params ap = {.activation = tc->act, .has_limit = cp.has_limit, .limit = cp.limit, .alpha = cp.alpha,
                                  .beta = cp.beta, .situ_beta = cp.situ_beta, .situ_linear_beta = cp.situ_linear_beta};
    nvfp4moe_decode_combine cb = {.topk_ids = d_ids, .M = M, .top_k = k, .H = H, .counters = d_cnt,
                                  .out = d_out, .out_dtype = tc->out_dtype};
    nvfp4moe_decode_gemm g1 = {.a = d_x, .a_row_div = k, .w = d_w13, .scale_2 = d_s13, .bias = d_b13,
                               .sorted_ids = d_sorted, .block_expert = d_bexp, .num_blocks = d_nb,
                               .P = P, .N = N1, .K = H, .E = E, .block_m = bm, .max_blocks = g.max_blocks,
                               .is_bf16 = bf, .sm_count = sm_count, .warps_per_item = tc->kw,
                               .scale_2_halves = tc->halves, .prefetch_tiles = tc->prefetch, .pdl = tc->pdl,
                               .room_per_sm = tc->room, .expert_prefetch_chunks = tc->echunks};
    nvfp4moe_decode_gemm g2 = g1;
    g2.scale_2_halves = 0;
    g2.a = d_act;
    g2.a_row_div = 1;
    g2.w = d_w2;
    g2.scale_2 = d_s2;
    g2.bias = d_b2;
    g2.N = H;
    g2.K = I;

    const nvfp4moe_decode_route rt = {.rp = tc->route == 2 ? &rp : NULL, .logits = d_logits, .topk_ids = d_ids,
                                      .topk_weights = d_rw, .sorted_ids = d_sorted, .block_expert = d_bexp,
                                      .num_blocks = d_nb};
    uint16_t *act = malloc(act_bytes);
    uint8_t *out = malloc((size_t)osz * M * H), *out2 = malloc((size_t)osz * M * H);
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int rep = 0; rep < 2; rep++) {
        /* on a stream of its own (non-blocking), as the plans launch: PDL applies between kernels
         * of one stream */
        CUDA_OK(cudaMemsetAsync(d_act, 0xFF, act_bytes, st));  // NaN
        CUDA_OK(cudaMemsetAsync(d_part, 0xFF, sizeof(float) * (size_t)P * H, st));
        CUDA_OK(cudaMemsetAsync(d_cnt, 0x7F, sizeof(int32_t) * nvfp4moe_hopper_decode_counters(M, H), st));
        CUDA_OK(cudaMemsetAsync(d_out, 0xFF, (size_t)osz * M * H, st));
        if (tc->route) {  /* what GEMM1 writes: poisoned (out-of-range experts and block counts) */
            CUDA_OK(cudaMemsetAsync(d_sorted, 0x7F, sizeof(int32_t) * (size_t)g.cap, st));
            CUDA_OK(cudaMemsetAsync(d_bexp, 0x7F, sizeof(int32_t) * (size_t)g.max_blocks, st));
            CUDA_OK(cudaMemsetAsync(d_nb, 0x7F, sizeof(int32_t), st));
        }
        if (tc->route == 2) {
            CUDA_OK(cudaMemsetAsync(d_ids, 0x7F, sizeof(int32_t) * (size_t)P, st));
            CUDA_OK(cudaMemsetAsync(d_rw, 0x7F, sizeof(float) * (size_t)P, st));
        }
        /* the second run with the combine as a kernel of its own after GEMM2: the same bits */
        cb.deferred = rep;
        cudaError_t e1 = tc->route ? nvfp4moe_hopper_decode_route_gemm1(&g1, &rt, &ap, I, d_act, &cb, st)
                                   : nvfp4moe_hopper_decode_gemm1(&g1, &ap, I, d_act, &cb, st);
        cudaError_t e2 = e1 == cudaSuccess ? nvfp4moe_hopper_decode_gemm2(&g2, tc->row_scale ? d_rw : NULL, d_part, &cb, st)
                                           : cudaSuccess;
        if (e2 == cudaSuccess && rep) e2 = nvfp4moe_hopper_decode_combine(&cb, d_part, E, st);
        if (e1 != cudaSuccess || e2 != cudaSuccess) {
            printf("  %s: launch failed: %s\n", tc->name, cudaGetErrorString(e1 != cudaSuccess ? e1 : e2));
            fails++;
            goto done;
        }
        CUDA_OK(cudaStreamSynchronize(st));
        CUDA_OK(cudaMemcpy(rep ? out2 : out, d_out, (size_t)osz * M * H, cudaMemcpyDeviceToHost));
        if (!rep) CUDA_OK(cudaMemcpy(act, d_act, act_bytes, cudaMemcpyDeviceToHost));
    }
    if (tc->route) {  /* GEMM1's grouping (and routing) against the host's (and the routing kernel's) */
        int32_t *gs = malloc(sizeof(int32_t) * (size_t)g.cap), *gb = malloc(sizeof(int32_t) * (size_t)g.max_blocks);
        int32_t gn = -1, *gi = malloc(sizeof(int32_t) * (size_t)P);
        float *gw = malloc(sizeof(float) * (size_t)P);
        CUDA_OK(cudaMemcpy(gs, d_sorted, sizeof(int32_t) * (size_t)g.cap, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(gb, d_bexp, sizeof(int32_t) * (size_t)g.max_blocks, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(&gn, d_nb, sizeof gn, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(gi, d_ids, sizeof(int32_t) * (size_t)P, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(gw, d_rw, sizeof(float) * (size_t)P, cudaMemcpyDeviceToHost));
        int bad = 0;
        if (gn != g.num_blocks) {
            printf("  %s: GEMM1's grouping has %d blocks, expected %d\n", tc->name, gn, g.num_blocks);
            bad++;
        }
        for (int i = 0; i < g.num_blocks * bm && !bad; i++)
            if (gs[i] != g.sorted_ids[i] && bad++ < 3)
                printf("  %s: sorted_ids[%d] = %d, expected %d\n", tc->name, i, gs[i], g.sorted_ids[i]);
        for (int b = 0; b < g.max_blocks; b++)
            if (gb[b] != g.block_expert[b] && bad++ < 3)
                printf("  %s: block_expert[%d] = %d, expected %d\n", tc->name, b, gb[b], g.block_expert[b]);
        for (int p = 0; p < P && tc->route == 2; p++)
            if ((gi[p] != ids[p] || memcmp(&gw[p], &rw[p], 4) != 0) && bad++ < 3)
                printf("  %s: pair %d routed to %d (weight %.9g), the routing kernel: %d (%.9g)\n", tc->name, p, gi[p],
                       gw[p], ids[p], rw[p]);
        if (bad) fails++;
        free(gs); free(gb); free(gi); free(gw);
    }

    float *dq13 = dequant(w13, sf13, E, N1, H), *dq2 = dequant(w2, sf2, E, H, I);
    /* GEMM1 + activation */
    {
        double num = 0, den = 0;
        int bad = 0;
        double *row = malloc(sizeof(double) * (size_t)N1), *ref_row = malloc(sizeof(double) * (size_t)I);
        for (int p = 0; p < P && bad < 4; p++) {
            const int e = ids[p], t = p / k;
            if (e < 0) continue;
            for (int n = 0; n < N1; n++) {  /* GEMM1's row, then the float64 reference activation */
                double d = 0;
                for (int kk = 0; kk < H; kk++) d += to_f(bf, x[(size_t)t * H + kk]) * dq13[((size_t)e * N1 + n) * H + kk];
                const int up = tc->act == NVFP4MOE_ACT_SWIGLUOAI ? (n & 1) : (N1 == 2 * I && n >= I);
                row[n] = d * (up ? s13u[e] : s13g[e]) + (b13 ? b13[(size_t)e * N1 + n] : 0);
            }
            nvfp4moe_activation_ref(&cfg, row, ref_row);
            for (int i = 0; i < I; i++) {
                const uint16_t got = act[(size_t)p * I + i];
                const double ref = ref_row[i];
                const double v = to_f(bf, got);
                if (!isfinite(v)) {
                    if (bad++ < 3) printf("  %s: act[%d][%d] not written (0x%04x), ref %g\n", tc->name, p, i, got, ref);
                    continue;
                }
                num += (v - ref) * (v - ref);
                den += ref * ref;
            }
        }
        free(row);
        free(ref_row);
        for (int i = 0; i < 2 * I; i++)
            if (act[(size_t)P * I + i] != 0xFFFF) bad++;  // guard rows untouched
        const double rel = sqrt(num / (den > 0 ? den : 1));
        if (bad || !(rel <= 1e-2)) {
            printf("  %s: GEMM1+act rel err %.3e, %d unwritten/guard values\n", tc->name, rel, bad);
            fails++;
        }
    }
    /* GEMM2 + combine, from the kernel's act rows */
    {
        double num = 0, den = 0;
        int bad = 0;
        for (int t = 0; t < M; t++)
            for (int h = 0; h < H; h++) {
                double ref = 0;
                for (int j = 0; j < k; j++) {
                    const int p = t * k + j, e = ids[p];
                    if (e < 0) continue;
                    double y = 0;
                    for (int i = 0; i < I; i++) y += to_f(bf, act[(size_t)p * I + i]) * dq2[((size_t)e * H + h) * I + i];
                    y = y * s2[e] + (b2 ? b2[(size_t)e * H + h] : 0);
                    ref += (tc->row_scale ? rw[p] : 1.0) * y;
                }
                const size_t o = (size_t)t * H + h;
                double v;
                if (tc->out_dtype == NVFP4MOE_DTYPE_F32) { float f; memcpy(&f, out + 4 * o, 4); v = f; }
                else { uint16_t u; memcpy(&u, out + 2 * o, 2); v = tc->out_dtype == NVFP4MOE_DTYPE_BF16 ? bf2f(u) : h2f(u); }
                if (!isfinite(v)) {
                    if (bad++ < 3) printf("  %s: out[%d][%d] not written, ref %g\n", tc->name, t, h, ref);
                    continue;
                }
                if (ref == 0 && v != 0 && bad++ < 3) printf("  %s: out[%d][%d] = %g, expected exactly 0\n", tc->name, t, h, v);
                num += (v - ref) * (v - ref);
                den += ref * ref;
            }
        const double rel = sqrt(num / (den > 0 ? den : 1));
        if (bad || !(rel <= 1e-2)) {
            printf("  %s: GEMM2+combine rel err %.3e, %d bad values\n", tc->name, rel, bad);
            fails++;
        }
    }
    free(dq13);
    free(dq2);
    if (memcmp(out, out2, (size_t)osz * M * H) != 0) {
        printf("  %s: the second run (the combine as a kernel after GEMM2) gave different bits\n", tc->name);
        fails++;
    }
done:
    printf("%s %s (E=%d H=%d I=%d M=%d top-%d block_m=%d warps/item %s, pdl %d, L2 prefetch %d, room/SM %d, "
           "expert chunks %d%s%s)\n",
           fails ? "FAIL" : "ok  ", tc->name, E, H, I, M, k, bm,
           tc->kw == 1 ? "1" : tc->kw == 2 ? "2" : tc->kw == 4 ? "4" : "auto", tc->pdl, tc->prefetch, tc->room,
           tc->echunks, tc->route == 1 ? ", GEMM1 groups" : tc->route == 2 ? ", GEMM1 routes " : "",
           tc->route == 2 ? nvfp4moe_routing_name((nvfp4moe_routing)tc->method) : "");
    cudaStreamDestroy(st);
    void *dev[] = {d_w13, d_w2, d_s13, d_s2, d_b13, d_b2, d_x, d_ids, d_rw, d_sorted, d_bexp, d_nb, d_act, d_part, d_cnt, d_out,
                   d_logits, d_cbias};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    free(ids); free(w13); free(sf13); free(w2); free(sf2); free(s13); free(s2); free(b13); free(b2);
    free(s13g); free(s13u);
    free(x); free(rw); free(rw_ref); free(act); free(out); free(out2);
    free(g.sorted_ids); free(g.block_expert);
    return fails;
}

static const test_case k_cases[] = {
    /* name             E    H     I    M  k used bm  act                              lim bias bf rs holes out kw halves pdl pf room echunks */
    {"m1-silu",        16, 512,  256,   1, 4, 16,  8, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 0, 0},
    {"m7-silu-bias",   16, 768,  384,   7, 4, 12,  8, NVFP4MOE_ACT_SILU,               1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 0, 0},
    {"m64-bm16",       32, 1024, 512,  64, 6, 30, 16, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 0, 0},
    {"m40-fp16",       16, 512,  256,  40, 2, 16,  8, NVFP4MOE_ACT_GELU,               0, 1, 0, 1, 0, NVFP4MOE_DTYPE_FP16, 0, 0, 0, 0, 0, 0, 0, 0},
    {"swigluoai",      8,  2880, 2880,  5, 4,  8,  8, NVFP4MOE_ACT_SWIGLUOAI,          1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 0, 0},
    {"no-mul-odd",     8,  528,  208,   9, 2,  8, 16, NVFP4MOE_ACT_SILU_NO_MUL,        0, 1, 1, 0, 0, NVFP4MOE_DTYPE_F32, 0, 0, 0, 0, 0, 0, 0, 0},
    {"relu2-k128",     8,  256,  128,  17, 3,  6,  8, NVFP4MOE_ACT_RELU2_NO_MUL,       0, 0, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 0, 0},
    {"ep-holes",       16, 512,  256,  12, 4, 16, 16, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 1, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 0, 0},
    {"one-expert",     8,  256,  256,  50, 1,  1, 16, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 0, 0},
    /* every warps-per-item split forced: one warp over all of K, two, four */
    {"kw1-bias",       16, 768,  384,   7, 4, 12,  8, NVFP4MOE_ACT_SILU,               1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 1, 0, 0, 0, 0, 0, 0, 0},
    {"kw2-bias",       16, 768,  384,   7, 4, 12,  8, NVFP4MOE_ACT_SILU,               1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 2, 0, 0, 0, 0, 0, 0, 0},
    {"kw4-fp16",       16, 1024, 512,  40, 2, 16,  8, NVFP4MOE_ACT_GELU,               0, 1, 0, 1, 0, NVFP4MOE_DTYPE_FP16, 4, 0, 0, 0, 0, 0, 0, 0},
    {"kw1-swigluoai",  8,  2880, 2880,  5, 4,  8,  8, NVFP4MOE_ACT_SWIGLUOAI,          1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 1, 0, 0, 0, 0, 0, 0, 0},
    {"kw1-bm16-holes", 16, 512,  256,  12, 4, 16, 16, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 1, NVFP4MOE_DTYPE_BF16, 1, 0, 0, 0, 0, 0, 0, 0},
    {"kw2-no-mul-odd", 8,  528,  208,   9, 2,  8, 16, NVFP4MOE_ACT_SILU_NO_MUL,        0, 1, 1, 0, 0, NVFP4MOE_DTYPE_F32, 2, 0, 0, 0, 0, 0, 0, 0},
    /* gate and up with global scales of their own ([E, 2] pairs, up to 10x apart) */
    {"halves-silu",    16, 512,  256,   3, 4, 16,  8, NVFP4MOE_ACT_SILU,               1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 1, 0, 0, 0, 0, 0, 0},
    {"halves-bm16",    32, 1024, 512,  64, 6, 30, 16, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 1, NVFP4MOE_DTYPE_F32, 0, 1, 0, 0, 0, 0, 0, 0},
    {"halves-oai",     8,  2880, 2880,  5, 4,  8,  8, NVFP4MOE_ACT_SWIGLUOAI,          1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 2, 0, 0, 0, 0, 0, 0},
    {"halves-kw2-oai", 8,  2880, 2880,  5, 4,  8,  8, NVFP4MOE_ACT_SWIGLUOAI,          1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 2, 2, 0, 0, 0, 0, 0, 0},
    /* GEMM2 launched with PDL behind GEMM1 (its prologue overlapping GEMM1), L2 prefetch from one
     * tile ahead to more tiles than a warp's slice has; every warps-per-item split */
    /* name             E    H     I    M  k used bm  act                              lim bias bf rs holes out kw halves pdl pf room echunks */
    {"pdl-m1",         16, 512,  256,   1, 4, 16,  8, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 1, 0, 0, 0, 0, 0},
    {"pdl-pf4-bm16",   32, 1024, 512,  64, 6, 30, 16, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 1, 4, 0, 0, 0, 0},
    {"pdl-pf1-kw1",    16, 768,  384,   7, 4, 12,  8, NVFP4MOE_ACT_SILU,               1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 1, 0, 1, 1, 0, 0, 0, 0},
    {"pf4-kw4-fp16",   16, 1024, 512,  40, 2, 16,  8, NVFP4MOE_ACT_GELU,               0, 1, 0, 1, 0, NVFP4MOE_DTYPE_FP16, 4, 0, 0, 4, 0, 0, 0, 0},
    {"pdl-pf16-oai",   8,  2880, 2880,  5, 4,  8,  8, NVFP4MOE_ACT_SWIGLUOAI,          1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 1, 2, 1, 16, 0, 0, 0, 0},
    {"pdl-pf4-holes",  16, 512,  256,  12, 4, 16, 16, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 1, NVFP4MOE_DTYPE_BF16, 0, 0, 1, 4, 0, 0, 0, 0},
    {"pdl-pf2-odd",    8,  528,  208,   9, 2,  8, 16, NVFP4MOE_ACT_SILU_NO_MUL,        0, 1, 1, 0, 0, NVFP4MOE_DTYPE_F32, 2, 0, 1, 2, 0, 0, 0, 0},
    {"pdl-pf4-one",    8,  256,  256,  50, 1,  1, 16, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 1, 4, 0, 0, 0, 0},
    /* GEMM1 on fewer CTAs per multiprocessor (room for GEMM2 beside it), GEMM2 prefetching the
     * active experts' weights into L2 before its wait: a few chunks, more than there are */
    {"pdl-room1-ex",   16, 768,  384,   7, 4, 12,  8, NVFP4MOE_ACT_SILU,               1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 1, 4, 1, 40, 0, 0},
    {"pdl-room3-all",  32, 1024, 512,  64, 6, 30, 16, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 1, NVFP4MOE_DTYPE_BF16, 0, 0, 1, 2, 3, 1 << 20, 0, 0},
    {"ex-oai-kw2",     8,  2880, 2880,  5, 4,  8,  8, NVFP4MOE_ACT_SWIGLUOAI,          1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 2, 2, 0, 0, 0, 7, 0, 0},
    /* GEMM1 routing and grouping the tokens itself (route 1: the caller's ids; 2: from logits) */
    /* name             E    H     I    M  k used bm  act                              lim bias bf rs holes out kw halves pdl pf room echunks route method */
    {"grp-m1",         16, 512,  256,   1, 4, 16,  8, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 1, 0},
    {"grp-m4-holes",   16, 512,  256,   4, 4, 16, 16, NVFP4MOE_ACT_SILU,               0, 1, 1, 1, 1, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 1, 0},
    {"grp-m4-k8-kw1",  8,  768,  384,   4, 8,  8,  8, NVFP4MOE_ACT_GELU,               0, 1, 0, 1, 0, NVFP4MOE_DTYPE_FP16, 1, 0, 0, 0, 0, 0, 1, 0},
    {"rt-m1-softmax",  16, 512,  256,   1, 4, 16,  8, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 2, NVFP4MOE_ROUTING_SOFTMAX_TOPK},
    {"rt-m4-dsv3",     64, 1024, 512,   4, 8, 64,  8, NVFP4MOE_ACT_SILU,               1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 1, 0, 0, 0, 0, 2, NVFP4MOE_ROUTING_DEEPSEEK_V3},
    {"rt-m3-renorm",   16, 512,  256,   3, 2, 16, 16, NVFP4MOE_ACT_GELU,               0, 1, 0, 1, 0, NVFP4MOE_DTYPE_F32,  0, 0, 0, 0, 0, 0, 2, NVFP4MOE_ROUTING_RENORMALIZE},
    {"rt-m2-oai-kw2",  8,  2880, 2880,  2, 4,  8,  8, NVFP4MOE_ACT_SWIGLUOAI,          1, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 2, 2, 0, 0, 0, 0, 2, NVFP4MOE_ROUTING_SOFTMAX_TOPK},
    {"rt-m4-sigmoid",  40, 768,  384,   4, 6, 40,  8, NVFP4MOE_ACT_RELU2_NO_MUL,       0, 0, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 2, NVFP4MOE_ROUTING_SIGMOID_RENORM},
    {"rt-m2-simulated",256, 512, 256,   2, 8,256,  8, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 2, NVFP4MOE_ROUTING_SIMULATED},
    {"rt-m1-minimax",  256,1024, 512,   1, 8,256,  8, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 2, NVFP4MOE_ROUTING_MINIMAX2},
    /* the caller's ids repeating experts within a token: 16 and 32 pairs on one expert, 2 blocks each */
    {"grp-dup-2blk",   16, 512,  256,   4, 8,  2,  8, NVFP4MOE_ACT_SILU,               0, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 1, 0},
    {"grp-dup-bm16",   8,  512,  256,   4, 8,  1, 16, NVFP4MOE_ACT_GELU,               0, 0, 0, 1, 0, NVFP4MOE_DTYPE_FP16, 0, 0, 0, 0, 0, 0, 1, 0},
    /* the most experts and the largest routing scratch (1024 x 4 doubles), two token columns */
    {"rt-m4-dsv3-e1k", 1024,256, 128,   4, 8,1024,16, NVFP4MOE_ACT_SILU,               0, 0, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 2, NVFP4MOE_ROUTING_DEEPSEEK_V3},
    /* the combine's slot reads past 8 slots: 16 slots (4 batches of 4 rows), and 40 (more than a
     * warp's lanes: the one-by-one path) with another rank's experts among them */
    {"k16-m5",         64, 512,  256,   5,16, 64,  8, NVFP4MOE_ACT_SILU,               0, 1, 1, 1, 0, NVFP4MOE_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 0, 0},
    {"k40-holes",      64, 512,  256,   4,40, 64, 16, NVFP4MOE_ACT_GELU,               0, 0, 0, 1, 1, NVFP4MOE_DTYPE_F32,  0, 0, 0, 0, 0, 0, 0, 0},
};
#define N_CASES ((int)(sizeof k_cases / sizeof k_cases[0]))

/* Median of n floats (sorts them). */
static float median_f(float *v, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (v[j] < v[i]) { float t = v[i]; v[i] = v[j]; v[j] = t; }
    return v[n / 2];
}

static int stream_bench(int sm_count) {
    const int E = 1, N = 65536, K = 7168, iters = 20;
    const size_t wb = (size_t)N * (K / 2), sb = (size_t)N * (K / 16);
    uint8_t *w = malloc(wb), *sf = malloc(sb);
    for (size_t i = 0; i < wb; i++) w[i] = (uint8_t)rng_next();
    for (size_t i = 0; i < sb; i++) sf[i] = rand_scale(0);
    void *d_w = pack(w, sf, E, N, K, 1);
    free(w);
    free(sf);
    const size_t packed = nvfp4moe_hopper_packed_bytes(E, N, K);
    uint16_t x[7168];
    for (int i = 0; i < K; i++) x[i] = f2bf((float)rng_normal());
    int32_t ids = 0, sorted[8] = {0, 1, 1, 1, 1, 1, 1, 1}, bexp = 0, nb = 1;
    float s2 = 1e-3f, one = 1.0f;
    void *d_x = dup_dev(x, sizeof x), *d_ids = dup_dev(&ids, 4), *d_sorted = dup_dev(sorted, sizeof sorted);
    void *d_bexp = dup_dev(&bexp, 4), *d_nb = dup_dev(&nb, 4), *d_s2 = dup_dev(&s2, 4), *d_rw = dup_dev(&one, 4);
    void *d_part, *d_cnt, *d_out;
    CUDA_OK(cudaMalloc(&d_part, sizeof(float) * N));
    CUDA_OK(cudaMalloc(&d_cnt, sizeof(int32_t) * nvfp4moe_hopper_decode_counters(1, N)));
    CUDA_OK(cudaMemset(d_cnt, 0, sizeof(int32_t) * nvfp4moe_hopper_decode_counters(1, N)));
    CUDA_OK(cudaMalloc(&d_out, 2 * (size_t)N));
    nvfp4moe_decode_combine cb = {.topk_ids = d_ids, .M = 1, .top_k = 1, .H = N, .counters = d_cnt, .out = d_out,
                                  .out_dtype = NVFP4MOE_DTYPE_BF16};
    nvfp4moe_decode_gemm g2 = {.a = d_x, .a_row_div = 1, .w = d_w, .scale_2 = d_s2, .sorted_ids = d_sorted,
                               .block_expert = d_bexp, .num_blocks = d_nb, .P = 1, .N = N, .K = K, .E = E,
                               .block_m = 8, .max_blocks = 1, .is_bf16 = 1, .sm_count = sm_count};
    /* the copy ceiling: 2 GB device-to-device (read + write counted) */
    void *c0, *c1;
    const size_t cbytes = (size_t)1 << 30;
    CUDA_OK(cudaMalloc(&c0, cbytes));
    CUDA_OK(cudaMalloc(&c1, cbytes));
    CUDA_OK(cudaMemset(c0, 1, cbytes));
    cudaEvent_t a, b;
    CUDA_OK(cudaEventCreate(&a));
    CUDA_OK(cudaEventCreate(&b));
    /* the L2 prefetch distances compared: the kernel streams with each */
    static const int k_pf[] = {0, 2, 4, 8};
    float tpf[4][64];
    for (int v = 0; v < 4; v++) {
        nvfp4moe_decode_gemm gv = g2;
        gv.prefetch_tiles = k_pf[v];
        for (int i = 0; i < iters + 3; i++) {
            CUDA_OK(cudaMemcpyAsync(c1, c0, cbytes, cudaMemcpyDeviceToDevice, 0));  // evicts L2
            CUDA_OK(cudaEventRecord(a, 0));
            CUDA_OK(nvfp4moe_hopper_decode_gemm2(&gv, d_rw, d_part, &cb, 0));
            CUDA_OK(cudaEventRecord(b, 0));
            CUDA_OK(cudaEventSynchronize(b));
            if (i >= 3) CUDA_OK(cudaEventElapsedTime(&tpf[v][i - 3], a, b));
        }
    }
    float tk[64], tc[64];
    for (int i = 0; i < iters + 3; i++) {
        CUDA_OK(cudaEventRecord(a, 0));
        CUDA_OK(nvfp4moe_hopper_decode_gemm2(&g2, d_rw, d_part, &cb, 0));
        CUDA_OK(cudaEventRecord(b, 0));
        CUDA_OK(cudaEventSynchronize(b));
        if (i >= 3) CUDA_OK(cudaEventElapsedTime(&tk[i - 3], a, b));
        CUDA_OK(cudaEventRecord(a, 0));
        CUDA_OK(cudaMemcpyAsync(c1, c0, cbytes, cudaMemcpyDeviceToDevice, 0));
        CUDA_OK(cudaEventRecord(b, 0));
        CUDA_OK(cudaEventSynchronize(b));
        if (i >= 3) CUDA_OK(cudaEventElapsedTime(&tc[i - 3], a, b));
    }
    for (int i = 0; i < iters; i++)  // sort for the medians
        for (int j = i + 1; j < iters; j++) {
            if (tk[j] < tk[i]) { float s = tk[i]; tk[i] = tk[j]; tk[j] = s; }
            if (tc[j] < tc[i]) { float s = tc[i]; tc[i] = tc[j]; tc[j] = s; }
        }
    const double kt = tk[iters / 2] * 1e-3, ct = tc[iters / 2] * 1e-3;
    const double ktb = packed / kt / 1e12, ctb = 2.0 * cbytes / ct / 1e12;
    printf("stream: one expert N=%d K=%d, %.1f MB packed, M=1: median %.1f us = %.2f TB/s; "
           "device copy %.2f TB/s (read+write); %.1f %% of the copy bandwidth\n",
           N, K, packed / 1e6, kt * 1e6, ktb, ctb, 100.0 * ktb / ctb);
    for (int v = 0; v < 4; v++) {
        const double t = median_f(tpf[v], iters) * 1e-3;
        printf("stream, L2 evicted before each run, prefetch %d tiles ahead: median %.1f us = %.2f TB/s (%.1f %% of the copy)\n",
               k_pf[v], t * 1e6, packed / t / 1e12, 100.0 * packed / t / 1e12 / ctb);
    }
    /* what the memory system gives the same bytes read without any decode: linearly, in the
     * kernels' pattern over the chunked layout, and with each row group's k tiles contiguous */
    uint32_t *sink;
    CUDA_OK(cudaMalloc((void **)&sink, 4));
    const char *pat[3] = {"linear", "chunked (the kernels' pattern)", "group-contiguous"};
    for (int mode = 0; mode < 3; mode++) {
        float tp[64];
        for (int i = 0; i < iters + 3; i++) {
            CUDA_OK(cudaMemcpyAsync(c1, c0, cbytes, cudaMemcpyDeviceToDevice, 0));  // evicts L2
            CUDA_OK(cudaEventRecord(a, 0));
            CUDA_OK(nvfp4moe_gpu_read_probe(d_w, packed, mode, K / 128, sink, sm_count, 0));
            CUDA_OK(cudaEventRecord(b, 0));
            CUDA_OK(cudaEventSynchronize(b));
            if (i >= 3) CUDA_OK(cudaEventElapsedTime(&tp[i - 3], a, b));
        }
        const double pt = median_f(tp, iters) * 1e-3;
        printf("read probe %-32s %.1f us = %.2f TB/s (%.1f %% of the copy bandwidth)\n", pat[mode], pt * 1e6,
               packed / pt / 1e12, 100.0 * packed / pt / 1e12 / ctb);
    }
    cudaFree(sink);
    void *dev[] = {d_w, d_x, d_ids, d_sorted, d_bexp, d_nb, d_s2, d_rw, d_part, d_cnt, d_out, c0, c1};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
    return 0;
}

/* Cold-L2 timing of the decode benches: a 512 MB memset evicts L2 before each run, then events
 * around what the caller launches (eagerly, on the default stream). */
typedef struct cold_timer {
    void *flush;
    cudaEvent_t a, b;
} cold_timer;
static const size_t k_flush_bytes = (size_t)512 << 20;

static void ct_init(cold_timer *ct) {
    CUDA_OK(cudaMalloc(&ct->flush, k_flush_bytes));
    CUDA_OK(cudaEventCreate(&ct->a));
    CUDA_OK(cudaEventCreate(&ct->b));
}
static void ct_flush(cold_timer *ct, int i) { CUDA_OK(cudaMemsetAsync(ct->flush, i & 0xFF, k_flush_bytes, 0)); }
static void ct_start(cold_timer *ct) { CUDA_OK(cudaEventRecord(ct->a, 0)); }
/* Waits for the run; its milliseconds into *ms unless ms is NULL (a warm-up). */
static void ct_stop(cold_timer *ct, float *ms) {
    CUDA_OK(cudaEventRecord(ct->b, 0));
    CUDA_OK(cudaEventSynchronize(ct->b));
    if (ms) CUDA_OK(cudaEventElapsedTime(ms, ct->a, ct->b));
}
static void ct_free(cold_timer *ct) {
    cudaFree(ct->flush);
    cudaEventDestroy(ct->a);
    cudaEventDestroy(ct->b);
}

/* The device buffers of one decode-regime layer (layer_bench); a second set is the same layer
 * again at other addresses. */
typedef struct lb_set {
    void *w13, *w2, *x, *ids, *sorted, *bexp, *nb, *s2, *rw, *act, *part, *cnt, *out;
    nvfp4moe_decode_combine cb;
    nvfp4moe_decode_gemm g1, g2;
} lb_set;

static void lb_alloc(lb_set *s, int E, int H, int I, int ppe, int sm_count, int pdl, int prefetch, int room,
                     int l2_mb) {
    const int N1 = 2 * I, M = ppe, P = E * ppe, bm = ppe <= 3 ? 8 : 16;
    uint8_t *w13 = malloc((size_t)E * N1 * (H / 2)), *sf13 = malloc((size_t)E * N1 * (H / 16));
    uint8_t *w2 = malloc((size_t)E * H * (I / 2)), *sf2 = malloc((size_t)E * H * (I / 16));
    for (size_t i = 0; i < (size_t)E * N1 * (H / 2); i++) w13[i] = (uint8_t)rng_next();
    for (size_t i = 0; i < (size_t)E * N1 * (H / 16); i++) sf13[i] = rand_scale(0);
    for (size_t i = 0; i < (size_t)E * H * (I / 2); i++) w2[i] = (uint8_t)rng_next();
    for (size_t i = 0; i < (size_t)E * H * (I / 16); i++) sf2[i] = rand_scale(0);
    s->w13 = pack(w13, sf13, E, N1, H, 1);
    s->w2 = pack(w2, sf2, E, H, I, 1);
    free(w13); free(sf13); free(w2); free(sf2);
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)M * H);
    for (int i = 0; i < M * H; i++) x[i] = f2bf((float)rng_normal());
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)P), *sorted = malloc(sizeof(int32_t) * (size_t)E * bm);
    int32_t *bexp = malloc(sizeof(int32_t) * (size_t)E);
    float *s2 = malloc(sizeof(float) * (size_t)E), *rw = malloc(sizeof(float) * (size_t)P);
    for (int p = 0; p < P; p++) {
        ids[p] = p % E;  /* pair p = t * E + e */
        rw[p] = 1.0f / E;
    }
    for (int e = 0; e < E; e++) {
        bexp[e] = e;
        s2[e] = 1e-3f;
        for (int r = 0; r < bm; r++) sorted[e * bm + r] = r < ppe ? r * E + e : P;
    }
    const int nb = E;
    s->x = dup_dev(x, sizeof(uint16_t) * (size_t)M * H);
    s->ids = dup_dev(ids, sizeof(int32_t) * (size_t)P);
    s->sorted = dup_dev(sorted, sizeof(int32_t) * (size_t)E * bm);
    s->bexp = dup_dev(bexp, sizeof(int32_t) * (size_t)E);
    s->nb = dup_dev(&nb, 4);
    s->s2 = dup_dev(s2, sizeof(float) * (size_t)E);
    s->rw = dup_dev(rw, sizeof(float) * (size_t)P);
    free(x); free(ids); free(sorted); free(bexp); free(s2); free(rw);
    CUDA_OK(cudaMalloc(&s->act, sizeof(uint16_t) * (size_t)P * I));
    CUDA_OK(cudaMalloc(&s->part, sizeof(float) * (size_t)P * H));
    CUDA_OK(cudaMalloc(&s->cnt, sizeof(int32_t) * nvfp4moe_hopper_decode_counters(M, H)));
    CUDA_OK(cudaMemset(s->cnt, 0, sizeof(int32_t) * nvfp4moe_hopper_decode_counters(M, H)));
    CUDA_OK(cudaMalloc(&s->out, 2 * (size_t)M * H));
    s->cb = (nvfp4moe_decode_combine){.topk_ids = s->ids, .M = M, .top_k = E, .H = H, .counters = s->cnt,
                                      .out = s->out, .out_dtype = NVFP4MOE_DTYPE_BF16};
    s->g1 = (nvfp4moe_decode_gemm){.a = s->x, .a_row_div = E, .w = s->w13, .scale_2 = s->s2, .sorted_ids = s->sorted,
                                   .block_expert = s->bexp, .num_blocks = s->nb, .P = P, .N = N1, .K = H, .E = E,
                                   .block_m = bm, .max_blocks = E, .is_bf16 = 1, .sm_count = sm_count,
                                   .prefetch_tiles = prefetch, .pdl = pdl, .room_per_sm = room};
    s->g2 = s->g1;
    s->g2.a = s->act; s->g2.a_row_div = 1; s->g2.w = s->w2; s->g2.N = H; s->g2.K = I; s->g2.room_per_sm = 0;
    s->g2.expert_prefetch_chunks = (int32_t)(((int64_t)l2_mb << 20) / NVFP4MOE_DECODE_CHUNK_BYTES);
}

static void lb_free(lb_set *s) {
    void *dev[] = {s->w13, s->w2, s->x, s->ids, s->sorted, s->bexp, s->nb, s->s2, s->rw, s->act, s->part, s->cnt, s->out};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
}

static void lb_gemm1(lb_set *s, int I) {
    nvfp4moe_gpu_act_params ap = {.activation = NVFP4MOE_ACT_SILU};
    CUDA_OK(nvfp4moe_hopper_decode_gemm1(&s->g1, &ap, I, s->act, &s->cb, 0));
}
static void lb_gemm2(lb_set *s) { CUDA_OK(nvfp4moe_hopper_decode_gemm2(&s->g2, s->rw, s->part, &s->cb, 0)); }

/* One decode-regime layer of E active experts with ppe pairs each (ppe tokens, every token on
 * every expert; block_m as the backend picks it: 8 up to 3 pairs per expert, else 16) timed
 * kernel by kernel: GEMM1 + activation alone, GEMM2 + combine alone, and both back to back, each
 * after a 512 MB memset that evicts L2; the weight bytes each kernel streams over its median time.
 * warm_code: the same three again, each right after the same kernels ran on a second set of
 * buffers (other weights, activations, grouping): everything the timed kernels read is as cold
 * as before except their code, which the kernels ahead brought into L2 and the instruction
 * caches. The difference is what a cold instruction stream costs. */
static void layer_bench(const char *name, int E, int H, int I, int ppe, int sm_count, int pdl, int prefetch,
                        int room, int l2_mb, int warm_code) {
    const int iters = 20, N1 = 2 * I, whats = warm_code ? 6 : 3;
    lb_set set[2];
    lb_alloc(&set[0], E, H, I, ppe, sm_count, pdl, prefetch, room, l2_mb);
    if (warm_code) lb_alloc(&set[1], E, H, I, ppe, sm_count, pdl, prefetch, room, l2_mb);
    const double b1 = (double)nvfp4moe_hopper_packed_bytes(E, N1, H), b2 = (double)nvfp4moe_hopper_packed_bytes(E, H, I);
    cold_timer ct;
    ct_init(&ct);
    float t[6][64];
    for (int i = 0; i < iters + 3; i++)
        for (int what = 0; what < whats; what++) {
            const int kind = what % 3;  /* 0: GEMM1, 1: GEMM2, 2: both */
            ct_flush(&ct, i);
            if (what >= 3) {
                lb_gemm1(&set[1], I);
                if (kind != 0) lb_gemm2(&set[1]);
            }
            if (kind == 1) lb_gemm1(&set[0], I);  /* GEMM2's input */
            ct_start(&ct);
            if (kind != 1) lb_gemm1(&set[0], I);
            if (kind != 0) lb_gemm2(&set[0]);
            ct_stop(&ct, i >= 3 ? &t[what][i - 3] : NULL);
        }
    double m[6];
    for (int w = 0; w < whats; w++) m[w] = median_f(t[w], iters) * 1e-3;
    printf("layer %s %d pair(s) on each of E=%d (H=%d I=%d, %.1f + %.1f MB packed), pdl %d, prefetch %d, GEMM1 room/SM %d, GEMM2 "
           "early L2 %d MB: GEMM1 %.1f us (%.2f TB/s), GEMM2 %.1f us (%.2f TB/s), both %.1f us (%.2f TB/s)\n",
           name, ppe, E, H, I, b1 / 1e6, b2 / 1e6, pdl, prefetch, room, l2_mb, m[0] * 1e6, b1 / m[0] / 1e12, m[1] * 1e6,
           b2 / m[1] / 1e12, m[2] * 1e6, (b1 + b2) / m[2] / 1e12);
    if (warm_code)
        printf("layer %s %d pair(s), code warm (the kernels ran just before on other buffers): GEMM1 %.1f us (cold "
               "%.1f), GEMM2 %.1f us (cold %.1f), both %.1f us (cold %.1f)\n",
               name, ppe, m[3] * 1e6, m[0] * 1e6, m[4] * 1e6, m[1] * 1e6, m[5] * 1e6, m[2] * 1e6);
    lb_free(&set[0]);
    if (warm_code) lb_free(&set[1]);
    ct_free(&ct);
}

/* What the memory system gives a kernel streaming a decode layer's bytes with no decode and no
 * dependency at all: read probes (tools/bench_kernels.cu; linear, or the decode kernels' pattern
 * with k1 / k2 k tiles per item) over GEMM1's b1 and GEMM2's b2 bytes, alone and back to back,
 * and an empty probe (launch and event overhead only), each after the 512 MB memset, eager, as
 * layer_bench times the GEMMs: the layer's time without the GEMMs' work. */
static void probe_bench(const char *name, size_t b1, size_t b2, int k1, int k2, int sm_count) {
    const int iters = 20;
    uint8_t *buf;
    uint32_t *sink;
    CUDA_OK(cudaMalloc((void **)&buf, b1 + b2));
    CUDA_OK(cudaMemset(buf, 0x5A, b1 + b2));
    CUDA_OK(cudaMalloc((void **)&sink, 4));
    cold_timer ct;
    ct_init(&ct);
    for (int mode = 0; mode <= 1; mode++) {
        float t[4][64];
        for (int i = 0; i < iters + 3; i++)
            for (int what = 0; what < 4; what++) { /* 0: empty, 1: b1, 2: b2, 3: b1 then b2 */
                ct_flush(&ct, i);
                ct_start(&ct);
                if (what == 0) CUDA_OK(nvfp4moe_gpu_read_probe(buf, 0, 0, 1, sink, sm_count, 0));
                if (what == 1 || what == 3) CUDA_OK(nvfp4moe_gpu_read_probe(buf, b1, mode, k1, sink, sm_count, 0));
                if (what >= 2) CUDA_OK(nvfp4moe_gpu_read_probe(buf + b1, b2, mode, k2, sink, sm_count, 0));
                ct_stop(&ct, i >= 3 ? &t[what][i - 3] : NULL);
            }
        double m[4];
        for (int w = 0; w < 4; w++) m[w] = median_f(t[w], iters) * 1e-3;
        printf("probe %s %s (%.1f + %.1f MB): empty %.1f us, GEMM1's bytes %.1f us (%.2f TB/s), GEMM2's %.1f us "
               "(%.2f TB/s), both %.1f us (%.2f TB/s)\n",
               name, mode ? "decode pattern" : "linear", b1 / 1e6, b2 / 1e6, m[0] * 1e6, m[1] * 1e6, b1 / m[1] / 1e12,
               m[2] * 1e6, b2 / m[2] / 1e12, m[3] * 1e6, (b1 + b2) / m[3] / 1e12);
    }
    ct_free(&ct);
    cudaFree(sink);
    cudaFree(buf);
}

/* The routed layer at M = 1 (GEMM1 routing and grouping the token itself, then GEMM2), and the
 * routing + grouping kernel alone, each timed cold (after the 512 MB memset) and with its code
 * warm (the same kernels ran just before on a second set of buffers: other logits, weights,
 * grouping). Weights are a byte pattern (the timing does not depend on their values). */
typedef struct rb_set {
    void *logits, *ids, *wts, *sorted, *bexp, *nb, *x, *w13, *w2, *s13, *s2, *act, *part, *cnt, *out;
} rb_set;

static void route_bench(const char *name, int E, int H, int I, int k, int method, int sm_count) {
    const int M = 1, P = M * k, N1 = 2 * I, bm = 8, iters = 20;
    const int cap = (int)nvfp4moe_group_capacity(P, E, bm), max_blocks = cap / bm;
    const size_t p13 = nvfp4moe_hopper_packed_bytes(E, N1, H), p2 = nvfp4moe_hopper_packed_bytes(E, H, I);
    float *cbias = malloc(sizeof(float) * (size_t)E), *s2v = malloc(sizeof(float) * (size_t)E);
    for (int e = 0; e < E; e++) cbias[e] = (float)(0.01 * rng_normal()), s2v[e] = 1e-3f;
    void *d_cbias = dup_dev(cbias, sizeof(float) * (size_t)E);
    nvfp4moe_gpu_route_params rp = {.method = method, .logits_dtype = NVFP4MOE_DTYPE_BF16, .num_experts = E,
                                    .top_k = k, .routed_scaling_factor = 2.5f};
    if (method == NVFP4MOE_ROUTING_DEEPSEEK_V3) {
        rp.n_group = 8;
        rp.topk_group = 4;
        rp.correction_bias = d_cbias;
    }
    rb_set set[2];
    for (int i = 0; i < 2; i++) {
        rb_set *b = &set[i];
        uint16_t lg[1024], x[8192];
        for (int e = 0; e < E; e++) lg[e] = f2bf((float)rng_normal());
        for (int h = 0; h < H; h++) x[h] = f2bf((float)rng_normal());
        b->logits = dup_dev(lg, sizeof(uint16_t) * (size_t)E);
        b->x = dup_dev(x, sizeof(uint16_t) * (size_t)H);
        b->s13 = dup_dev(s2v, sizeof(float) * (size_t)E);
        b->s2 = dup_dev(s2v, sizeof(float) * (size_t)E);
        CUDA_OK(cudaMalloc(&b->ids, sizeof(int32_t) * (size_t)P));
        CUDA_OK(cudaMalloc(&b->wts, sizeof(float) * (size_t)P));
        CUDA_OK(cudaMalloc(&b->sorted, sizeof(int32_t) * (size_t)cap));
        CUDA_OK(cudaMalloc(&b->bexp, sizeof(int32_t) * (size_t)max_blocks));
        CUDA_OK(cudaMalloc(&b->nb, sizeof(int32_t)));
        CUDA_OK(cudaMalloc(&b->w13, p13));
        CUDA_OK(cudaMalloc(&b->w2, p2));
        CUDA_OK(cudaMemset(b->w13, 0x22, p13));
        CUDA_OK(cudaMemset(b->w2, 0x22, p2));
        CUDA_OK(cudaMalloc(&b->act, sizeof(uint16_t) * (size_t)P * I));
        CUDA_OK(cudaMalloc(&b->part, sizeof(float) * (size_t)P * H));
        CUDA_OK(cudaMalloc(&b->cnt, sizeof(int32_t) * nvfp4moe_hopper_decode_counters(M, H)));
        CUDA_OK(cudaMemset(b->cnt, 0, sizeof(int32_t) * nvfp4moe_hopper_decode_counters(M, H)));
        CUDA_OK(cudaMalloc(&b->out, 2 * (size_t)M * H));
    }
    nvfp4moe_gpu_act_params ap = {.activation = NVFP4MOE_ACT_SILU};
    cold_timer ct;
    ct_init(&ct);
    float t[4][64];
    for (int i = 0; i < iters + 3; i++)
        for (int what = 0; what < 4; what++) {
            ct_flush(&ct, i);
            for (int si = what >= 2 ? 1 : 0; si >= 0; si--) {  /* set 1 first when warming */
                rb_set *s = &set[si];
                if (si == 0) ct_start(&ct);
                if (what % 2 == 0) {
                    CUDA_OK(nvfp4moe_gpu_route_and_group(&rp, s->logits, s->ids, s->wts, M, k, E, bm, s->sorted,
                                                         s->bexp, s->nb, max_blocks, NULL, 0));
                } else {
                    nvfp4moe_decode_combine cb = {.topk_ids = s->ids, .M = M, .top_k = k, .H = H, .counters = s->cnt,
                                                  .out = s->out, .out_dtype = NVFP4MOE_DTYPE_BF16};
                    nvfp4moe_decode_gemm g1 = {.a = s->x, .a_row_div = k, .w = s->w13, .scale_2 = s->s13,
                                               .sorted_ids = s->sorted, .block_expert = s->bexp, .num_blocks = s->nb,
                                               .P = P, .N = N1, .K = H, .E = E, .block_m = bm, .max_blocks = max_blocks,
                                               .is_bf16 = 1, .sm_count = sm_count};
                    nvfp4moe_decode_gemm g2 = g1;
                    g2.a = s->act; g2.a_row_div = 1; g2.w = s->w2; g2.scale_2 = s->s2; g2.N = H; g2.K = I;
                    const nvfp4moe_decode_route rt = {.rp = &rp, .logits = s->logits, .topk_ids = s->ids,
                                                      .topk_weights = s->wts, .sorted_ids = s->sorted,
                                                      .block_expert = s->bexp, .num_blocks = s->nb};
                    CUDA_OK(nvfp4moe_hopper_decode_route_gemm1(&g1, &rt, &ap, I, s->act, &cb, 0));
                    CUDA_OK(nvfp4moe_hopper_decode_gemm2(&g2, s->wts, s->part, &cb, 0));
                }
            }
            ct_stop(&ct, i >= 3 ? &t[what][i - 3] : NULL);
        }
    double m[4];
    for (int w = 0; w < 4; w++) m[w] = median_f(t[w], iters) * 1e-3;
    printf("routed %s M=1 (E=%d top-%d): routing+grouping kernel %.1f us cold, %.1f us code warm; GEMM1 routing "
           "itself + GEMM2 %.1f us cold, %.1f us code warm\n", name, E, k, m[0] * 1e6, m[2] * 1e6, m[1] * 1e6, m[3] * 1e6);
    for (int i = 0; i < 2; i++) {
        void *dev[] = {set[i].logits, set[i].ids, set[i].wts, set[i].sorted, set[i].bexp, set[i].nb, set[i].x,
                       set[i].w13, set[i].w2, set[i].s13, set[i].s2, set[i].act, set[i].part, set[i].cnt, set[i].out};
        for (size_t j = 0; j < sizeof dev / sizeof dev[0]; j++) cudaFree(dev[j]);
    }
    cudaFree(d_cbias);
    ct_free(&ct);
    free(cbias);
    free(s2v);
}

int main(int argc, char **argv) {
    int dev = 0, major = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        printf("gpu_hopper_decode: no CUDA device\ngpu_hopper_decode: 0 passed, 1 failed\n");
        return 1;
    }
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (major != 9) {
        nvfp4moe_decode_gemm g = {0};
        nvfp4moe_decode_combine c = {0};
        cudaError_t e = nvfp4moe_hopper_decode_gemm2(&g, NULL, NULL, &c, 0);
        printf("gpu_hopper_decode: sm_%d0 device: the kernels must refuse (%s)\n", major, cudaGetErrorString(e));
        printf("gpu_hopper_decode: %d passed, %d failed\n", e != cudaSuccess, e == cudaSuccess);
        return e == cudaSuccess;
    }
    int only = -1, stream = 0, coldcode = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--stream") == 0) stream = 1;
        else if (strcmp(argv[i], "--coldcode") == 0) coldcode = 1;
        else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc) only = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: gpu_hopper_decode [--case I] [--stream] [--coldcode]\n");
            return 2;
        }
    }
    if (coldcode) {
        /* what a cold instruction stream costs the decode kernels at M = 1 (layer_bench) */
        for (int r = 0; r < 2; r++) {
            layer_bench("deepseek-v3", 8, 7168, 2048, 1, sms, 0, 0, 0, 0, 1);
            layer_bench("qwen3-30b-a3b", 8, 2048, 768, 1, sms, 0, 0, 0, 0, 1);
            layer_bench("qwen3-30b-a3b (M=16)", 82, 2048, 768, 2, sms, 0, 0, 0, 0, 1);
            probe_bench("deepseek-v3", nvfp4moe_hopper_packed_bytes(8, 2 * 2048, 7168),
                        nvfp4moe_hopper_packed_bytes(8, 7168, 2048), 7168 / 128, 2048 / 128, sms);
            probe_bench("qwen3-30b-a3b", nvfp4moe_hopper_packed_bytes(8, 2 * 768, 2048),
                        nvfp4moe_hopper_packed_bytes(8, 2048, 768), 2048 / 128, 768 / 128, sms);
            route_bench("qwen3-30b-a3b", 128, 2048, 768, 8, NVFP4MOE_ROUTING_RENORMALIZE, sms);
            route_bench("deepseek-v3", 256, 7168, 2048, 8, NVFP4MOE_ROUTING_DEEPSEEK_V3, sms);
        }
        return 0;
    }
    if (stream) {
        stream_bench(sms);
        /* {pdl, prefetch tiles, GEMM1 CTA slots left free per SM, GEMM2 early L2 MB}: off; launch overlap and
         * prefetch distance alone and together; GEMM1 leaving room for GEMM2, which prefetches */
        static const int k_var[][4] = {{0, 0, 0, 0}, {1, 0, 0, 0}, {0, 4, 0, 0}, {1, 4, 0, 0}, {1, 8, 0, 0},
                                       {1, 4, 1, 0}, {1, 4, 1, 16}, {1, 4, 1, 32}, {1, 4, 0, 32}};
        for (size_t v = 0; v < sizeof k_var / sizeof k_var[0]; v++) {
            layer_bench("deepseek-v3", 8, 7168, 2048, 1, sms, k_var[v][0], k_var[v][1], k_var[v][2], k_var[v][3], 0);
            layer_bench("qwen3-30b-a3b", 8, 2048, 768, 1, sms, k_var[v][0], k_var[v][1], k_var[v][2], k_var[v][3], 0);
        }
        /* the shapes of M = 16 and 64 (the experts they touch, their pairs per expert rounded) */
        for (int pdl = 0; pdl <= 1; pdl++) {
            layer_bench("qwen3-30b-a3b (M=16)", 82, 2048, 768, 2, sms, pdl, 0, 0, 0, 0);
            layer_bench("qwen3-30b-a3b (M=64)", 125, 2048, 768, 4, sms, pdl, 0, 0, 0, 0);
            layer_bench("deepseek-v3 (M=64)", 220, 7168, 2048, 2, sms, pdl, 0, 0, 0, 0);
        }
        return 0;
    }
    for (int i = 0; i < N_CASES; i++) {
        if (only >= 0 && i != only) continue;
        t_record(run_case(&k_cases[i], sms) == 0);
    }
    return t_finish("gpu_hopper_decode");
}
