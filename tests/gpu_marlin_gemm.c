/*
 * gpu_marlin_gemm.c - correctness test and microbenchmark of the MARLIN-class W4A16 MoE GEMM
 * (kernels/marlin_gemm.cu, interface kernels/moe_gemm.h). CUDA builds only; needs a GPU.
 *
 *   gpu_marlin_gemm            correctness grid against a CPU float64 reference
 *   gpu_marlin_gemm --bench    DeepSeek-V3 GEMM1 + GEMM2 shapes at M in {1,16,64,256,1024,4096}
 *
 * Each case: random top-k routing (distinct experts per token, some experts left empty), the
 * moe-align grouping built on the host, random E2M1 codes, realistic random E4M3 block scales
 * (plus zeros, subnormals and a few negatives), per-expert scale_2 != 1 (or per (expert, half),
 * gate and up up to 10x apart, stacked or interleaved: GEMM1 of checkpoints whose halves carry
 * their own), random activations;
 * C is poisoned (NaN) including guard rows past P; the result is compared with
 *   ref[p, n] = rs[p] * (s2[e] * sum_k A[p / div, k] * e2m1(w) * e4m3(sf) + bias[e, n])
 * in double, by the norm-wise relative error (<= 1e-2) and per element (|d| <= 1e-2 * max|ref|
 * + 2^-7 * |ref|, the bf16 output rounding).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "../kernels/moe_gemm.h"

#include "gpu_gemm_common.h"

typedef struct {
    const char *name;
    int E, N, K, M, topk, block_m, gather, row_scale, bias, bf16, e_used;
    int no_ws;  // 1: pass no workspace, which forces the whole-unit partition (no stream-K)
    int halves; // scale_2_halves: 0 [E]; 1 [E, 2] stacked gate/up; 2 [E, 2] interleaved
} test_case;

/* Column n's scale: the expert's, or its half's (up: n >= N/2 stacked, odd n interleaved). */
static double col_scale(const float *s2, int halves, int e, int n, int N) {
    if (!halves) return s2[e];
    const int up = halves == 1 ? n >= N / 2 : n & 1;
    return s2[2 * e + up];
}

static void run_case(const test_case *tc, int sm_count) {
    const int E = tc->E, N = tc->N, K = tc->K, M = tc->M, topk = tc->topk, bm = tc->block_m;
    const int P = M * topk;
    const int div = tc->gather ? topk : 1;
    const int a_rows = tc->gather ? M : P;
    const int guard = 3;  // poisoned rows after the P rows of C: must stay untouched

    int32_t *ids = malloc(sizeof(int32_t) * (size_t)P);
    route(M, topk, tc->e_used, ids);
    grouping g = make_grouping(ids, P, E, bm);

    size_t wbytes = (size_t)E * N * (K / 2), sbytes = (size_t)E * N * (K / 16);
    uint8_t *w = malloc(wbytes), *sf = malloc(sbytes);
    for (size_t i = 0; i < wbytes; i++) w[i] = (uint8_t)rng_next();
    for (size_t i = 0; i < sbytes; i++) sf[i] = rand_scale(1);
    const int ns2 = tc->halves ? 2 * E : E;
    float *s2 = malloc(sizeof(float) * (size_t)ns2);
    for (int e = 0; e < ns2; e++)  // ~amax/2688; gate and up up to 10x apart
        s2[e] = (float)(ldexp(1.0, -9) * (tc->halves ? 0.25 + 2.25 * rng_unif() : 0.5 + rng_unif()));
    float *bias = malloc(sizeof(float) * (size_t)E * N);
    for (size_t i = 0; i < (size_t)E * N; i++) bias[i] = (float)rng_normal() * 0.5f;
    float *rs = malloc(sizeof(float) * (size_t)P);
    for (int p = 0; p < P; p++) rs[p] = (float)(0.05 + rng_unif());
    uint16_t *a = malloc(sizeof(uint16_t) * (size_t)a_rows * K);
    double *ad = malloc(sizeof(double) * (size_t)a_rows * K);
    for (size_t i = 0; i < (size_t)a_rows * K; i++) {
        float v = (float)rng_normal();
        a[i] = tc->bf16 ? f2bf(v) : f2h(v);
        ad[i] = tc->bf16 ? bf2f(a[i]) : h2f(a[i]);
    }

    // Device buffers.
    uint8_t *d_w, *d_sf;
    void *d_b, *d_a, *d_c, *d_ws = NULL;
    float *d_s2, *d_bias, *d_rs;
    int32_t *d_sorted, *d_bexp, *d_nb;
    size_t packed = nvfp4moe_marlin_packed_bytes(E, N, K);
    CUDA_OK(cudaMalloc((void **)&d_w, wbytes));
    CUDA_OK(cudaMalloc((void **)&d_sf, sbytes));
    CUDA_OK(cudaMalloc(&d_b, packed));
    CUDA_OK(cudaMalloc(&d_a, sizeof(uint16_t) * (size_t)a_rows * K));
    CUDA_OK(cudaMalloc(&d_c, sizeof(uint16_t) * (size_t)(P + guard) * N));
    CUDA_OK(cudaMalloc((void **)&d_s2, sizeof(float) * (size_t)ns2));
    CUDA_OK(cudaMalloc((void **)&d_bias, sizeof(float) * (size_t)E * N));
    CUDA_OK(cudaMalloc((void **)&d_rs, sizeof(float) * (size_t)P));
    CUDA_OK(cudaMalloc((void **)&d_sorted, sizeof(int32_t) * (size_t)g.cap));
    CUDA_OK(cudaMalloc((void **)&d_bexp, sizeof(int32_t) * (size_t)g.max_blocks));
    CUDA_OK(cudaMalloc((void **)&d_nb, sizeof(int32_t)));
    size_t wsb = nvfp4moe_marlin_workspace_bytes(P, N, K, g.max_blocks, bm, sm_count);
    if (wsb && !tc->no_ws) CUDA_OK(cudaMalloc(&d_ws, wsb));
    CUDA_OK(cudaMemcpy(d_w, w, wbytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_sf, sf, sbytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_a, a, sizeof(uint16_t) * (size_t)a_rows * K, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_s2, s2, sizeof(float) * (size_t)ns2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_bias, bias, sizeof(float) * (size_t)E * N, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_rs, rs, sizeof(float) * (size_t)P, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_sorted, g.sorted_ids, sizeof(int32_t) * (size_t)g.cap,
                       cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_bexp, g.block_expert, sizeof(int32_t) * (size_t)g.max_blocks,
                       cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_nb, &g.num_blocks, sizeof(int32_t), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_c, 0xFF, sizeof(uint16_t) * (size_t)(P + guard) * N));  // NaN poison
    CUDA_OK(cudaMemset(d_b, 0xA5, packed));  // the repack must write every byte it owns

    CUDA_OK(nvfp4moe_marlin_repack(d_w, d_sf, E, N, K, d_b, 0));
    nvfp4moe_marlin_args args;
    memset(&args, 0, sizeof args);
    args.a = d_a;
    args.a_row_div = div;
    args.b = d_b;
    args.scale_2 = d_s2;
    args.bias = tc->bias ? d_bias : NULL;
    args.row_scale = tc->row_scale ? d_rs : NULL;
    args.c = d_c;
    args.sorted_ids = d_sorted;
    args.block_expert = d_bexp;
    args.num_blocks = d_nb;
    args.P = P;
    args.N = N;
    args.K = K;
    args.E = E;
    args.block_m = bm;
    args.max_blocks = g.max_blocks;
    args.is_bf16 = tc->bf16;
    args.workspace = d_ws;
    args.sm_count = sm_count;
    args.scale_2_halves = tc->halves;
    CUDA_OK(nvfp4moe_marlin_gemm(&args, 0));
    CUDA_OK(cudaDeviceSynchronize());

    uint16_t *c = malloc(sizeof(uint16_t) * (size_t)(P + guard) * N);
    CUDA_OK(cudaMemcpy(c, d_c, sizeof(uint16_t) * (size_t)(P + guard) * N, cudaMemcpyDeviceToHost));

    // Reference in double: dequantize one (expert, column) row at a time.
    double *wrow = malloc(sizeof(double) * (size_t)K);
    double *ref = malloc(sizeof(double) * (size_t)P * N);
    int *expert_of = malloc(sizeof(int) * (size_t)P);
    for (int p = 0; p < P; p++) expert_of[p] = ids[p];
    for (int e = 0; e < E; e++) {
        int any = 0;
        for (int p = 0; p < P; p++) any |= expert_of[p] == e;
        if (!any) continue;
        for (int n = 0; n < N; n++) {
            const uint8_t *wr = w + ((size_t)e * N + n) * (K / 2);
            const uint8_t *sr = sf + ((size_t)e * N + n) * (K / 16);
            for (int k = 0; k < K; k++) {
                uint8_t byte = wr[k / 2];
                wrow[k] = e2m1_val((k & 1) ? (byte >> 4) : (byte & 15)) * e4m3_val(sr[k / 16]);
            }
            for (int p = 0; p < P; p++) {
                if (expert_of[p] != e) continue;
                const double *ar = ad + (size_t)(p / div) * K;
                double s = 0;
                for (int k = 0; k < K; k++) s += ar[k] * wrow[k];
                double v = s * col_scale(s2, tc->halves, e, n, N) + (tc->bias ? bias[(size_t)e * N + n] : 0.0);
                ref[(size_t)p * N + n] = v * (tc->row_scale ? rs[p] : 1.0);
            }
        }
    }
    double num = 0, den = 0, maxref = 0;
    for (size_t i = 0; i < (size_t)P * N; i++) maxref = fmax(maxref, fabs(ref[i]));
    int bad = 0;
    for (size_t i = 0; i < (size_t)P * N; i++) {
        double got = tc->bf16 ? bf2f(c[i]) : h2f(c[i]);
        double d = got - ref[i];
        if (isnan(got)) d = INFINITY;
        num += d * d;
        den += ref[i] * ref[i];
        if (!(fabs(d) <= 1e-2 * maxref + ldexp(fabs(ref[i]), -7))) {
            if (bad < 5)
                fprintf(stderr, "  [%s] C[%zu, %zu] got %.6g want %.6g\n", tc->name, i / N, i % N,
                        got, ref[i]);
            bad++;
        }
    }
    int guard_bad = 0;
    for (size_t i = (size_t)P * N; i < (size_t)(P + guard) * N; i++) guard_bad += c[i] != 0xFFFF;
    double rel = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
    int ok = bad == 0 && guard_bad == 0 && rel <= 1e-2;
    t_record(ok);
    printf("%-4s %-38s E=%-3d N=%-5d K=%-5d M=%-4d top%d bm=%-2d div=%d rs=%d bias=%d %s halves=%d "
           "blocks=%d rel=%.2e bad=%d guard=%d\n",
           ok ? "ok" : "FAIL", tc->name, E, N, K, M, topk, bm, div, tc->row_scale, tc->bias,
           tc->bf16 ? "bf16" : "fp16", tc->halves, g.num_blocks, rel, bad, guard_bad);

    free(ids); free(g.sorted_ids); free(g.block_expert); free(w); free(sf); free(s2); free(bias);
    free(rs); free(a); free(ad); free(c); free(wrow); free(ref); free(expert_of);
    cudaFree(d_w); cudaFree(d_sf); cudaFree(d_b); cudaFree(d_a); cudaFree(d_c); cudaFree(d_s2);
    cudaFree(d_bias); cudaFree(d_rs); cudaFree(d_sorted); cudaFree(d_bexp); cudaFree(d_nb);
    if (d_ws) cudaFree(d_ws);
}

// ---- microbenchmark: DeepSeek-V3 GEMM1 ([2I, H]) + GEMM2 ([H, I]) ----
typedef struct {
    void *b, *a, *c, *ws;
    float *s2, *rs;
    int32_t *sorted, *bexp, *nb;
} gemm_bufs;

static int cmp_float(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

// Fills a device buffer with random bytes (a 16 MB random block replicated) so nothing is zero.
static void fill_random(void *d, size_t bytes, int scales) {
    size_t blk = (size_t)16 << 20;
    if (blk > bytes) blk = bytes;
    uint8_t *h = malloc(blk);
    for (size_t i = 0; i < blk; i++) h[i] = scales ? rand_scale(0) : (uint8_t)rng_next();
    CUDA_OK(cudaMemcpy(d, h, blk, cudaMemcpyHostToDevice));
    for (size_t off = blk; off < bytes;) {
        size_t n = off < bytes - off ? off : bytes - off;
        CUDA_OK(cudaMemcpy((uint8_t *)d + off, d, n, cudaMemcpyDeviceToDevice));
        off += n;
    }
    free(h);
}

static int bench(int sm_count, int only_m) {
    const int E = 256, H = 7168, I = 2048, topk = 8;
    const int Ms[] = {1, 16, 64, 256, 1024, 4096};
    const int reps = 30;
    const double bw_floor = 4.27e12, tf_floor = 788e12;  // measured on this H200 (perf_anchors)
    const int N1 = 2 * I, K1 = H, N2 = H, K2 = I;

    // Canonical weights -> repacked, once per GEMM (the canonical buffers are freed after).
    void *b1, *b2;
    size_t p1 = nvfp4moe_marlin_packed_bytes(E, N1, K1), p2 = nvfp4moe_marlin_packed_bytes(E, N2, K2);
    CUDA_OK(cudaMalloc(&b1, p1));
    CUDA_OK(cudaMalloc(&b2, p2));
    {
        uint8_t *w, *sf;
        size_t wb = (size_t)E * N1 * K1 / 2, sb = (size_t)E * N1 * K1 / 16;
        CUDA_OK(cudaMalloc((void **)&w, wb));
        CUDA_OK(cudaMalloc((void **)&sf, sb));
        fill_random(w, wb, 0);
        fill_random(sf, sb, 1);
        cudaEvent_t r0, r1;
        CUDA_OK(cudaEventCreate(&r0));
        CUDA_OK(cudaEventCreate(&r1));
        CUDA_OK(cudaEventRecord(r0, 0));
        CUDA_OK(nvfp4moe_marlin_repack(w, sf, E, N1, K1, b1, 0));
        CUDA_OK(cudaEventRecord(r1, 0));
        CUDA_OK(nvfp4moe_marlin_repack(w, sf, E, N2, K2, b2, 0));  // same random bytes, other shape
        CUDA_OK(cudaDeviceSynchronize());
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, r0, r1));
        printf("repack GEMM1 weights (%.2f GB canonical): %.2f ms\n", (wb + sb) / 1e9, ms);
        cudaFree(w);
        cudaFree(sf);
    }
    float *s2;
    CUDA_OK(cudaMalloc((void **)&s2, sizeof(float) * E));
    {
        float hs[256];
        for (int e = 0; e < E; e++) hs[e] = 1.0f / 2688.0f;
        CUDA_OK(cudaMemcpy(s2, hs, sizeof hs, cudaMemcpyHostToDevice));
    }
    // L2 flush buffer: 256 MB, > 4x the 60 MB L2.
    void *flush;
    size_t flush_bytes = (size_t)256 << 20;
    CUDA_OK(cudaMalloc(&flush, flush_bytes));

    printf("\n| M | P | block_m | experts | GEMM1 us | GEMM2 us | total us | weight GB/s | %% of 4.27 TB/s | TFLOP/s | %% of 788 TF | floor us |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        const int M = Ms[mi], P = M * topk;
        if (only_m > 0 && M != only_m) continue;
        int32_t *ids = malloc(sizeof(int32_t) * P);
        route(M, topk, E, ids);
        const int bm = nvfp4moe_marlin_block_m(P, E);
        grouping g = make_grouping(ids, P, E, bm);
        int touched = 0;
        for (int e = 0; e < E; e++) {
            int any = 0;
            for (int p = 0; p < P; p++) any |= ids[p] == e;
            touched += any;
        }
        void *a1, *c1, *c2, *ws1 = NULL, *ws2 = NULL;
        float *rs;
        int32_t *sorted, *bexp, *nb;
        CUDA_OK(cudaMalloc(&a1, (size_t)M * K1 * 2));
        CUDA_OK(cudaMalloc(&c1, (size_t)P * N1 * 2));  // GEMM1 out, also GEMM2's A (K2 = N1/2)
        CUDA_OK(cudaMalloc(&c2, (size_t)P * N2 * 2));
        CUDA_OK(cudaMalloc((void **)&rs, sizeof(float) * P));
        CUDA_OK(cudaMalloc((void **)&sorted, sizeof(int32_t) * g.cap));
        CUDA_OK(cudaMalloc((void **)&bexp, sizeof(int32_t) * g.max_blocks));
        CUDA_OK(cudaMalloc((void **)&nb, sizeof(int32_t)));
        {
            uint16_t *h = malloc((size_t)M * K1 * 2);
            for (size_t i = 0; i < (size_t)M * K1; i++) h[i] = f2bf((float)rng_normal());
            CUDA_OK(cudaMemcpy(a1, h, (size_t)M * K1 * 2, cudaMemcpyHostToDevice));
            free(h);
            float *hr = malloc(sizeof(float) * P);
            for (int p = 0; p < P; p++) hr[p] = 1.0f / topk;
            CUDA_OK(cudaMemcpy(rs, hr, sizeof(float) * P, cudaMemcpyHostToDevice));
            free(hr);
        }
        CUDA_OK(cudaMemcpy(sorted, g.sorted_ids, sizeof(int32_t) * g.cap, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(bexp, g.block_expert, sizeof(int32_t) * g.max_blocks,
                           cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(nb, &g.num_blocks, sizeof(int32_t), cudaMemcpyHostToDevice));
        size_t w1 = nvfp4moe_marlin_workspace_bytes(P, N1, K1, g.max_blocks, bm, sm_count);
        size_t w2 = nvfp4moe_marlin_workspace_bytes(P, N2, K2, g.max_blocks, bm, sm_count);
        if (w1) CUDA_OK(cudaMalloc(&ws1, w1));
        if (w2) CUDA_OK(cudaMalloc(&ws2, w2));

        nvfp4moe_marlin_args g1, g2;
        memset(&g1, 0, sizeof g1);
        g1.a = a1; g1.a_row_div = topk; g1.b = b1; g1.scale_2 = s2; g1.c = c1;
        g1.sorted_ids = sorted; g1.block_expert = bexp; g1.num_blocks = nb;
        g1.P = P; g1.N = N1; g1.K = K1; g1.E = E; g1.block_m = bm; g1.max_blocks = g.max_blocks;
        g1.is_bf16 = 1; g1.workspace = ws1; g1.sm_count = sm_count;
        g2 = g1;
        g2.a = c1; g2.a_row_div = 1; g2.b = b2; g2.c = c2; g2.N = N2; g2.K = K2;
        g2.row_scale = rs; g2.workspace = ws2;
        // GEMM2 reads the first K2 columns of each GEMM1 row as its activations: stride N1 != K2,
        // so give it its own contiguous buffer the size of P x K2 (the activation output).
        void *a2;
        CUDA_OK(cudaMalloc(&a2, (size_t)P * K2 * 2));
        CUDA_OK(nvfp4moe_marlin_gemm(&g1, 0));  // real (non-zero) GEMM1 output feeds GEMM2
        CUDA_OK(cudaMemcpy2D(a2, K2 * 2, c1, N1 * 2, K2 * 2, P, cudaMemcpyDeviceToDevice));
        g2.a = a2;

        cudaEvent_t ev[3];
        for (int i = 0; i < 3; i++) CUDA_OK(cudaEventCreate(&ev[i]));
        float t1[64], t2[64];
        for (int r = -3; r < reps; r++) {
            CUDA_OK(cudaMemsetAsync(flush, r & 0xFF, flush_bytes, 0));
            CUDA_OK(cudaEventRecord(ev[0], 0));
            CUDA_OK(nvfp4moe_marlin_gemm(&g1, 0));
            CUDA_OK(cudaEventRecord(ev[1], 0));
            CUDA_OK(cudaMemsetAsync(flush, (r + 1) & 0xFF, flush_bytes, 0));
            CUDA_OK(cudaEventRecord(ev[2], 0));  // reuse: GEMM2 timed from after the flush
            CUDA_OK(nvfp4moe_marlin_gemm(&g2, 0));
            cudaEvent_t e3;
            CUDA_OK(cudaEventCreate(&e3));
            CUDA_OK(cudaEventRecord(e3, 0));
            CUDA_OK(cudaEventSynchronize(e3));
            if (r >= 0) {
                CUDA_OK(cudaEventElapsedTime(&t1[r], ev[0], ev[1]));
                CUDA_OK(cudaEventElapsedTime(&t2[r], ev[2], e3));
            }
            cudaEventDestroy(e3);
        }
        qsort(t1, reps, sizeof(float), cmp_float);
        qsort(t2, reps, sizeof(float), cmp_float);
        double us1 = t1[reps / 2] * 1e3, us2 = t2[reps / 2] * 1e3, us = us1 + us2;
        double bytes = (double)touched * ((double)N1 * K1 + (double)N2 * K2) * 0.5625;
        double flops = 2.0 * P * ((double)N1 * K1 + (double)N2 * K2);
        double floor_us = fmax(bytes / bw_floor, flops / tf_floor) * 1e6;
        printf("| %d | %d | %d | %d | %.1f | %.1f | %.1f | %.0f | %.1f | %.1f | %.1f | %.1f |\n", M,
               P, bm, touched, us1, us2, us, bytes / (us * 1e-6) / 1e9,
               100.0 * bytes / (us * 1e-6) / bw_floor, flops / (us * 1e-6) / 1e12,
               100.0 * flops / (us * 1e-6) / tf_floor, floor_us);
        fflush(stdout);
        for (int i = 0; i < 3; i++) cudaEventDestroy(ev[i]);
        cudaFree(a1); cudaFree(a2); cudaFree(c1); cudaFree(c2); cudaFree(rs); cudaFree(sorted);
        cudaFree(bexp); cudaFree(nb);
        if (ws1) cudaFree(ws1);
        if (ws2) cudaFree(ws2);
        free(ids); free(g.sorted_ids); free(g.block_expert);
    }
    cudaFree(b1); cudaFree(b2); cudaFree(s2); cudaFree(flush);
    return 0;
}

int main(int argc, char **argv) {
    int dev = 0, sm_count = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);  // keep the lines already printed if a run is cut short
    CUDA_OK(cudaSetDevice(dev));
    CUDA_OK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, dev));
    if (argc > 1 && strcmp(argv[1], "--bench") == 0)
        return bench(sm_count, argc > 2 ? atoi(argv[2]) : 0);  // --bench [M]

    // name, E, N, K, M, topk, block_m, gather, row_scale, bias, bf16, e_used, no_ws, halves
    static const test_case cases[] = {
        {"P=1 decode bm8", 4, 144, 272, 1, 1, 8, 1, 0, 0, 1, 4, 0, 0},
        {"gather top4 bm8 bias", 8, 272, 144, 5, 4, 8, 1, 0, 1, 1, 6, 0, 0},
        {"gpt-oss-like 2880 bm16", 6, 2880, 2880, 6, 4, 16, 1, 0, 1, 1, 5, 0, 0},
        {"gemm2 row_scale bm16 fp16", 8, 1024, 256, 16, 2, 16, 0, 1, 0, 0, 5, 0, 0},
        {"bm32 gather fp16 bias rs", 6, 272, 1040, 40, 2, 32, 1, 1, 1, 0, 4, 0, 0},
        {"bm48 n=2880 k=144", 4, 2880, 144, 64, 2, 48, 0, 1, 1, 1, 3, 0, 0},
        {"bm64 large", 4, 1536, 512, 128, 2, 64, 1, 0, 0, 1, 4, 0, 0},
        {"bm64 fp16 rs bias empty experts", 8, 400, 720, 96, 2, 64, 0, 1, 1, 0, 3, 0, 0},
        {"deepseek-ish K split bm8", 16, 512, 7168, 2, 8, 8, 1, 0, 0, 1, 16, 0, 0},
        {"deepseek-ish gemm2 bm8 fp16", 16, 2048, 1024, 3, 8, 8, 0, 1, 0, 0, 16, 0, 0},
        {"bm16 top1 all one expert", 4, 256, 512, 33, 1, 16, 1, 0, 1, 1, 1, 0, 0},
        {"bm64 k=16 n=16 tiny", 2, 16, 16, 70, 1, 64, 1, 1, 1, 0, 2, 0, 0},
        {"bm8 bf16 many experts", 64, 144, 1024, 7, 6, 8, 1, 1, 1, 1, 64, 0, 0},
        {"whole units bm8 fp16 gather", 16, 272, 2880, 9, 4, 8, 1, 1, 1, 0, 12, 1, 0},
        {"whole units bm16 bf16", 8, 2880, 272, 20, 2, 16, 0, 0, 1, 1, 8, 1, 0},
        {"whole units bm48 bf16 rs", 4, 144, 1040, 80, 2, 48, 1, 1, 0, 1, 3, 1, 0},
        {"whole units bm64 fp16", 4, 1024, 512, 150, 2, 64, 0, 1, 1, 0, 4, 1, 0},
        {"gate/up scales stacked bm8 gather", 16, 512, 7168, 2, 8, 8, 1, 0, 0, 1, 16, 0, 1},
        {"gate/up scales interleaved bm16 bias", 6, 2880, 2880, 6, 4, 16, 1, 0, 1, 1, 5, 0, 2},
        {"gate/up scales stacked bm64 fp16", 4, 1536, 512, 128, 2, 64, 1, 0, 1, 0, 4, 0, 1},
        {"gate/up scales interleaved whole units", 16, 272, 2880, 9, 4, 8, 1, 0, 1, 0, 12, 1, 2},
    };
    int only = -1;  // --case I runs case I alone (for compute-sanitizer)
    if (argc > 2 && strcmp(argv[1], "--case") == 0) only = atoi(argv[2]);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (only < 0 || (size_t)only == i) run_case(&cases[i], sm_count);
    return t_finish("gpu_marlin_gemm");
}
