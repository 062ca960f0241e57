/*
 * gpu_hopper_gemm.c - correctness test and microbenchmark of the Hopper-native (sm_90a, wgmma)
 * W4A16 MoE GEMM (kernels/hopper_gemm.cu, interface kernels/hopper_gemm.h). CUDA builds only;
 * needs a GPU. On a device other than compute capability 9.0 it only checks that the GEMM
 * refuses to run (cudaErrorNoKernelImageForDevice) and says so.
 *
 *   gpu_hopper_gemm            correctness grid against a CPU float64 reference; each case's
 *                              line ends with hash= (FNV-1a of C where its bits are defined,
 *                              "-" where K may be split), so two builds can be compared bit for bit
 *   gpu_hopper_gemm --case I   case I alone (for compute-sanitizer; past the table: the reruns
 *                              on 2-3 CTAs, then those as a launch with PDL behind the same GEMM)
 *   gpu_hopper_gemm --bench [M,M..] [--sets N] [--model NAME|all] [--marlin]
 *                              GEMM1 + GEMM2 of a model's routed experts (deepseek-v3 default;
 *                              qwen3-30b-a3b, mixtral-8x7b, gpt-oss-120b, kimi-k2,
 *                              qwen3-235b-a22b) at M in
 *                              {1,16,64,256,1024,4096} (or M alone), cold L2 by rotating N (4)
 *                              separately repacked weight copies, median of 24; --marlin also
 *                              times nvfp4moe_marlin_gemm the same way in the same run
 *                              (env HOPPER_BENCH_BLOCK_M=B forces the Hopper block_m and
 *                              HOPPER_BENCH_SUBTILES=1|2 one token tile width or the fitted ones,
 *                              HOPPER_BENCH_ROWTILES=1|2 its weight tiles per item, for tuning)
 *
 * Each case: random top-k routing (distinct experts per token, some experts left empty), the
 * moe-align grouping built on the host, random E2M1 codes, realistic random E4M3 block scales
 * (plus zeros, subnormals and a few negatives), per-expert scale_2 != 1 (or per (expert, half),
 * gate and up up to 10x apart, stacked or interleaved), random activations;
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

#include "../kernels/hopper_gemm.h"
#include "../kernels/moe_gemm.h"
#include "../kernels/pipeline.h"

#include "gpu_gemm_common.h"

typedef struct {
    const char *name;
    int E, N, K, M, topk, block_m, gather, row_scale, bias, bf16, e_used;
    int no_ws;  // 1: pass no workspace (the GEMM must not split K; items dealt round robin)
    int graph;  // 1: capture the GEMM in a CUDA graph and run the graph instead
    int halves; // scale_2_halves: 0 [E]; 1 [E, 2] stacked gate/up; 2 [E, 2] interleaved
    int subtiles; // token_subtiles: 0 or 2 widths fitted per block; 1 one width (block_m 64, 128)
    int rowtiles; // row_tiles: 0 chosen by the GEMM; 1 or 2 forced (block_m 64 and 128 only)
    int act;      // 0, or GEMM1's activation asked for (k_acts[act - 1]): where the GEMM fuses it,
                  // checked against its own C passed through the activation kernel
} test_case;

// The activations the fused-activation cases ask GEMM1 to apply (act, has_limit, limit, alpha,
// beta, situ_beta, situ_linear_beta).
static const nvfp4moe_gpu_act_params k_acts[] = {
    {NVFP4MOE_ACT_SILU, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
    {NVFP4MOE_ACT_SILU, 1, 0.75f, 0.0f, 0.0f, 0.0f, 0.0f},
    {NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE, 1, 0.5f, 1.702f, 1.0f, 0.0f, 0.0f},
    {NVFP4MOE_ACT_GELU_TANH, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
};

// 16-bit values of got unlike want's (n values, rows of ld): every differing one when exact, else
// those off by more than one 16-bit step plus 2^-10 of want's largest finite magnitude. The
// values that differ at all go to *diff; the first unlike ones are printed as `what`.
static size_t count_unlike(const test_case *tc, const uint16_t *got, const uint16_t *want, size_t n, int ld,
                           int exact, const char *what, size_t *diff) {
    double wmax = 0;
    for (size_t i = 0; i < n && !exact; i++) {
        const double r = tc->bf16 ? bf2f(want[i]) : h2f(want[i]);
        if (isfinite(r)) wmax = fmax(wmax, fabs(r));
    }
    size_t unlike = 0;
    for (size_t i = 0; i < n; i++) {
        if (got[i] == want[i]) continue;
        ++*diff;
        const double a = tc->bf16 ? bf2f(got[i]) : h2f(got[i]), r = tc->bf16 ? bf2f(want[i]) : h2f(want[i]);
        const double tol = ldexp(fmax(fabs(a), fabs(r)), tc->bf16 ? -7 : -10) + ldexp(wmax, -10);
        if (exact || !(fabs(a - r) <= tol)) {
            if (unlike < 5)
                fprintf(stderr, "  [%s] %s[%zu, %zu] %.6g, want %.6g\n", tc->name, what, i / ld, i % ld, a, r);
            unlike++;
        }
    }
    return unlike;
}

// Whether the GEMM's output bits are defined: K may not be split (no workspace past the item
// counter), so the sums are added in the same order every run.
static int bits_defined(const nvfp4moe_hopper_args *args) {
    return !args->workspace || nvfp4moe_hopper_workspace_bytes(args->P, args->N, args->K, args->max_blocks,
                                                               args->block_m, args->sm_count) <= 16;
}

// The fused-activation check of one case: act_out from the GEMM with args->act_out set, against
// the activation kernel applied to C of the plain run (d_c; c0 its host copy); C must stay
// untouched (re-poisoned first) where the GEMM fuses, act_out where it does not, and there C must
// be written again as the plain run wrote it. Bit-exact without a K split (the same roundings in
// the same order), else within one 16-bit step plus 2^-10 of the largest value (the split's
// partial sums arrive in a different order every run). Returns 1 when right.
static int check_fused_act(const test_case *tc, nvfp4moe_hopper_args *args, void *d_c, const uint16_t *c0,
                           int P, int N, int guard) {
    const nvfp4moe_gpu_act_params *ap = &k_acts[tc->act - 1];
    const int nh = N / 2;
    const size_t nact = (size_t)P * nh, ncc = (size_t)(P + guard) * N;
    void *d_act, *d_ref;
    CUDA_OK(cudaMalloc(&d_act, sizeof(uint16_t) * (nact + (size_t)guard * nh)));
    CUDA_OK(cudaMalloc(&d_ref, sizeof(uint16_t) * nact));
    CUDA_OK(nvfp4moe_gpu_activation(d_c, d_ref, P, nh, N, ap, tc->bf16, 0));
    CUDA_OK(cudaMemset(d_act, 0xFF, sizeof(uint16_t) * (nact + (size_t)guard * nh)));
    CUDA_OK(cudaMemset(d_c, 0xFF, sizeof(uint16_t) * ncc));
    args->act_out = d_act;
    args->act = ap;
    const int fused = nvfp4moe_hopper_fuses_activation(args);
    CUDA_OK(nvfp4moe_hopper_gemm(args, 0));
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    args->act_out = NULL;
    args->act = NULL;
    uint16_t *act = malloc(sizeof(uint16_t) * (nact + (size_t)guard * nh));
    uint16_t *ref = malloc(sizeof(uint16_t) * nact), *cc = malloc(sizeof(uint16_t) * ncc);
    CUDA_OK(cudaMemcpy(act, d_act, sizeof(uint16_t) * (nact + (size_t)guard * nh), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(ref, d_ref, sizeof(uint16_t) * nact, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(cc, d_c, sizeof(uint16_t) * ncc, cudaMemcpyDeviceToHost));
    size_t touched_c = 0, touched_act = 0, bad = 0, diff = 0;
    for (size_t i = 0; i < ncc; i++) touched_c += cc[i] != 0xFFFF;
    for (size_t i = 0; i < nact + (size_t)guard * nh; i++) touched_act += act[i] != 0xFFFF;
    const int exact = bits_defined(args);
    if (fused) {  // act against GEMM + activation kernel, then the guard rows
        bad = count_unlike(tc, act, ref, nact, nh, exact, "fused act (want: GEMM + activation kernel)", &diff);
        for (size_t i = nact; i < nact + (size_t)guard * nh; i++) bad += act[i] != 0xFFFF;
    } else {  // C as the plain run wrote it
        size_t cdiff = 0;
        bad = count_unlike(tc, cc, c0, (size_t)P * N, N, exact, "C (want: the plain run's)", &cdiff);
    }
    // fused: C untouched; not fused: act_out untouched and C as the plain run wrote it
    const int ok = fused ? bad == 0 && touched_c == 0 : touched_act == 0 && bad == 0;
    t_record(ok);
    printf("%-4s %-34s fused activation %d (act %d, limit %d): %s, %zu values differ, %zu bad, C written %zu, act written %zu\n",
           ok ? "ok" : "FAIL", tc->name, fused, ap->activation, ap->has_limit,
           fused ? (exact ? "bit-exact vs GEMM + activation kernel" : "vs GEMM + activation kernel (K split: one step)")
                 : "not fused: act_out untouched, C as the plain run",
           diff, bad, touched_c, touched_act);
    free(act); free(ref); free(cc);
    cudaFree(d_act); cudaFree(d_ref);
    return ok;
}

/* Column n's scale: the expert's, or its half's (up: n >= N/2 stacked, odd n interleaved). */
static double col_scale(const float *s2, int halves, int e, int n, int N) {
    if (!halves) return s2[e];
    const int up = halves == 1 ? n >= N / 2 : n & 1;
    return s2[2 * e + up];
}

// pdl: the case runs twice in a row on one stream, the second launch a programmatic dependent
// of the first (args.pdl = 1) with a workspace of its own, poisoned, whose item counter the first
// launch zeroes (args.next_workspace), into a second poisoned C: that C is the one checked, and it
// must equal the first launch's bit for bit where bits are defined.
static void run_case(const test_case *tc, int sm_count, int pdl) {
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
    size_t packed = nvfp4moe_hopper_packed_bytes(E, N, K);
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
    size_t wsb = nvfp4moe_hopper_workspace_bytes(P, N, K, g.max_blocks, bm, sm_count);
    if (wsb && !tc->no_ws) CUDA_OK(cudaMalloc(&d_ws, wsb));
    void *d_ws2 = NULL, *d_c2 = NULL;
    if (pdl) {
        if (d_ws) {
            CUDA_OK(cudaMalloc(&d_ws2, wsb));
            // the first launch must zero the item counter: left at 0x7F7F7F7F, the second launch
            // would run only each CTA's first item and leave the rest of C2 poisoned
            CUDA_OK(cudaMemset(d_ws2, 0x7F, wsb));
        }
        CUDA_OK(cudaMalloc(&d_c2, sizeof(uint16_t) * (size_t)(P + guard) * N));
        CUDA_OK(cudaMemset(d_c2, 0xFF, sizeof(uint16_t) * (size_t)(P + guard) * N));
    }
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

    CUDA_OK(nvfp4moe_hopper_repack(d_w, d_sf, E, N, K, tc->bf16, d_b, 0));
    nvfp4moe_hopper_args args;
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
    args.token_subtiles = tc->subtiles;
    args.row_tiles = tc->rowtiles;
    nvfp4moe_hopper_args args2 = args;  // pdl: the dependent launch
    if (pdl) {
        args.next_workspace = d_ws2;
        args2.c = d_c2;
        args2.workspace = d_ws2;
        args2.pdl = 1;
    }
    if (tc->graph) {
        // Graph capture: no host synchronization or allocation may happen inside the GEMM call.
        cudaStream_t st;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        // the poison fills and the repack above ran on the legacy stream, which this one does not
        // wait for
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        CUDA_OK(nvfp4moe_hopper_gemm(&args, st));
        if (pdl) CUDA_OK(nvfp4moe_hopper_gemm(&args2, st));
        CUDA_OK(cudaStreamEndCapture(st, &graph));
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        CUDA_OK(cudaGraphLaunch(exec, st));  // twice: a replay must give the same result
        if (pdl)  // (and the replay's dependent launch must write all of C2 again)
            CUDA_OK(cudaMemsetAsync(d_c2, 0xFF, sizeof(uint16_t) * (size_t)(P + guard) * N, st));
        CUDA_OK(cudaGraphLaunch(exec, st));
        CUDA_OK(cudaStreamSynchronize(st));
        CUDA_OK(cudaGraphExecDestroy(exec));
        CUDA_OK(cudaGraphDestroy(graph));
        CUDA_OK(cudaStreamDestroy(st));
    } else if (pdl) {
        cudaStream_t st;
        CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(nvfp4moe_hopper_gemm(&args, st));
        CUDA_OK(nvfp4moe_hopper_gemm(&args2, st));
        CUDA_OK(cudaStreamSynchronize(st));
        CUDA_OK(cudaStreamDestroy(st));
    } else {
        CUDA_OK(nvfp4moe_hopper_gemm(&args, 0));
    }
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());

    uint16_t *c = malloc(sizeof(uint16_t) * (size_t)(P + guard) * N);
    CUDA_OK(cudaMemcpy(c, pdl ? d_c2 : d_c, sizeof(uint16_t) * (size_t)(P + guard) * N, cudaMemcpyDeviceToHost));
    size_t pdl_unlike = 0;  // pdl: elements where the two launches differ, where bits are defined
    if (pdl && bits_defined(&args)) {
        uint16_t *c1 = malloc(sizeof(uint16_t) * (size_t)P * N);
        CUDA_OK(cudaMemcpy(c1, d_c, sizeof(uint16_t) * (size_t)P * N, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < (size_t)P * N; i++) {
            if (c1[i] == c[i]) continue;
            if (pdl_unlike < 5)
                fprintf(stderr, "  [%s, pdl] C[%zu, %zu]: 0x%04x, first launch 0x%04x\n", tc->name, i / N, i % N,
                        c[i], c1[i]);
            pdl_unlike++;
        }
        free(c1);
    }

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
    if (tc->act && !pdl) check_fused_act(tc, &args, d_c, c, P, N, guard);
    double rel = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
    int ok = bad == 0 && guard_bad == 0 && rel <= 1e-2 && pdl_unlike == 0;
    t_record(ok);
    // FNV-1a of C where its bits are defined (no K split: the same roundings in the same order every
    // run), so two builds of the kernel can be compared bit for bit; "-" where K may be split
    char hash[20] = "-";
    if (bits_defined(&args))
        snprintf(hash, sizeof hash, "%016llx", (unsigned long long)t_fnv1a(c, sizeof(uint16_t) * (size_t)P * N));
    printf("%-4s %-34s E=%-3d N=%-5d K=%-5d M=%-4d top%d bm=%-3d div=%d rs=%d bias=%d %s ws=%d "
           "graph=%d halves=%d sub=%d rt=%d blocks=%d rel=%.2e bad=%d guard=%d%s hash=%s\n",
           ok ? "ok" : "FAIL", tc->name, E, N, K, M, topk, bm, div, tc->row_scale, tc->bias,
           tc->bf16 ? "bf16" : "fp16", d_ws != NULL, tc->graph, tc->halves,
           nvfp4moe_hopper_token_subtiles(&args), nvfp4moe_hopper_row_tiles(&args), g.num_blocks,
           rel, bad, guard_bad, pdl ? (pdl_unlike ? " pdl=UNLIKE" : " pdl=same") : "", hash);

    free(ids); free(g.sorted_ids); free(g.block_expert); free(w); free(sf); free(s2); free(bias);
    free(rs); free(a); free(ad); free(c); free(wrow); free(ref); free(expert_of);
    cudaFree(d_w); cudaFree(d_sf); cudaFree(d_b); cudaFree(d_a); cudaFree(d_c); cudaFree(d_s2);
    cudaFree(d_bias); cudaFree(d_rs); cudaFree(d_sorted); cudaFree(d_bexp); cudaFree(d_nb);
    if (d_ws) cudaFree(d_ws);
    if (d_ws2) cudaFree(d_ws2);
    if (d_c2) cudaFree(d_c2);
}

// ---- microbenchmark: DeepSeek-V3 GEMM1 ([2I, H]) + GEMM2 ([H, I]) ----
static int cmp_float(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

// Fills a device buffer with random bytes (a 16 MB random block replicated) so nothing is zero.
static void fill_random(void *d, size_t bytes, int scales) {
    size_t blk = (size_t)16 << 20;
    if (blk > bytes) blk = bytes;
    uint8_t *h = calloc(blk ? blk : 1, 1);  // calloc: gcc cannot see that the loop fills it
    if (!h) {
        fprintf(stderr, "fill_random: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < blk; i++) h[i] = scales ? rand_scale(0) : (uint8_t)rng_next();
    CUDA_OK(cudaMemcpy(d, h, blk, cudaMemcpyHostToDevice));
    for (size_t off = blk; off < bytes;) {
        size_t n = off < bytes - off ? off : bytes - off;
        CUDA_OK(cudaMemcpy((uint8_t *)d + off, d, n, cudaMemcpyDeviceToDevice));
        off += n;
    }
    free(h);
}

#define BENCH_MAX_SETS 8  // weight copies rotated so every launch reads cold (default 4)
#define BENCH_REPS 24      // timed launches per GEMM and M; the median is reported

typedef struct {
    const char *name;
    int E, H, I, topk;
} bench_model;

static const bench_model bench_models[] = {
    {"deepseek-v3", 256, 7168, 2048, 8},
    {"qwen3-30b-a3b", 128, 2048, 768, 8},
    {"mixtral-8x7b", 8, 4096, 14336, 2},
    {"gpt-oss-120b", 128, 2880, 2880, 4},
    {"kimi-k2", 384, 7168, 2048, 8},
    {"qwen3-235b-a22b", 128, 4096, 1536, 8},
};

// The two GEMMs of one kernel (Hopper or MARLIN) at one M: args, buffers, per-set weights.
typedef struct {
    nvfp4moe_hopper_args g1, g2;  // (nvfp4moe_marlin_args: the same struct)
    void *ws1, *ws2;
    int32_t *sorted, *bexp, *nb;
    int bm;
} bench_side;

static void side_init(bench_side *sd, int marlin, const int32_t *ids, int P, int E, int N1, int K1,
                      int N2, int K2, int topk, void *a1, void *a2, void *c1, void *c2, float *rs,
                      float *s2, int sm_count) {
    memset(sd, 0, sizeof *sd);
    sd->bm = marlin ? nvfp4moe_marlin_block_m(P, E) : nvfp4moe_hopper_block_m(P, E, K2);
    const char *force = marlin ? NULL : getenv("HOPPER_BENCH_BLOCK_M");  // tuning experiments
    if (force && atoi(force) > 0) sd->bm = atoi(force);
    grouping g = make_grouping(ids, P, E, sd->bm);
    CUDA_OK(cudaMalloc((void **)&sd->sorted, sizeof(int32_t) * g.cap));
    CUDA_OK(cudaMalloc((void **)&sd->bexp, sizeof(int32_t) * g.max_blocks));
    CUDA_OK(cudaMalloc((void **)&sd->nb, sizeof(int32_t)));
    CUDA_OK(cudaMemcpy(sd->sorted, g.sorted_ids, sizeof(int32_t) * g.cap, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(sd->bexp, g.block_expert, sizeof(int32_t) * g.max_blocks,
                       cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(sd->nb, &g.num_blocks, sizeof(int32_t), cudaMemcpyHostToDevice));
    size_t w1 = marlin ? nvfp4moe_marlin_workspace_bytes(P, N1, K1, g.max_blocks, sd->bm, sm_count)
                       : nvfp4moe_hopper_workspace_bytes(P, N1, K1, g.max_blocks, sd->bm, sm_count);
    size_t w2 = marlin ? nvfp4moe_marlin_workspace_bytes(P, N2, K2, g.max_blocks, sd->bm, sm_count)
                       : nvfp4moe_hopper_workspace_bytes(P, N2, K2, g.max_blocks, sd->bm, sm_count);
    if (w1) CUDA_OK(cudaMalloc(&sd->ws1, w1));
    if (w2) CUDA_OK(cudaMalloc(&sd->ws2, w2));
    nvfp4moe_hopper_args *x = &sd->g1;
    x->a = a1; x->a_row_div = topk; x->scale_2 = s2; x->c = c1;
    x->sorted_ids = sd->sorted; x->block_expert = sd->bexp; x->num_blocks = sd->nb;
    x->P = P; x->N = N1; x->K = K1; x->E = E; x->block_m = sd->bm; x->max_blocks = g.max_blocks;
    x->is_bf16 = 1; x->workspace = sd->ws1; x->sm_count = sm_count;
    const char *tiles = marlin ? NULL : getenv("HOPPER_BENCH_SUBTILES");  // 1 or 2; else chosen
    if (tiles && (atoi(tiles) == 1 || atoi(tiles) == 2)) x->token_subtiles = atoi(tiles);
    const char *rows = marlin ? NULL : getenv("HOPPER_BENCH_ROWTILES");  // 1 or 2; else chosen
    if (rows && (atoi(rows) == 1 || atoi(rows) == 2)) x->row_tiles = atoi(rows);
    sd->g2 = sd->g1;
    sd->g2.a = a2; sd->g2.a_row_div = 1; sd->g2.c = c2; sd->g2.N = N2; sd->g2.K = K2;
    sd->g2.row_scale = rs; sd->g2.workspace = sd->ws2;
    free(g.sorted_ids);
    free(g.block_expert);
}

static void side_free(bench_side *sd) {
    cudaFree(sd->sorted); cudaFree(sd->bexp); cudaFree(sd->nb);
    if (sd->ws1) cudaFree(sd->ws1);
    if (sd->ws2) cudaFree(sd->ws2);
}

// Median times (us) of GEMM1 and GEMM2, rotating the weight sets (the first `sets` launches are
// warm-up), CUDA events around each GEMM call.
static void side_time(bench_side *sd, int marlin, void **b1, void **b2, int sets, double *us1,
                      double *us2) {
    cudaEvent_t ev[4];
    for (int i = 0; i < 4; i++) CUDA_OK(cudaEventCreate(&ev[i]));
    float t1[BENCH_REPS], t2[BENCH_REPS];
    for (int r = -sets; r < BENCH_REPS; r++) {
        const int set = (r + sets) % sets;
        sd->g1.b = b1[set];
        sd->g2.b = b2[set];
        CUDA_OK(cudaEventRecord(ev[0], 0));
        CUDA_OK(marlin ? nvfp4moe_marlin_gemm(&sd->g1, 0) : nvfp4moe_hopper_gemm(&sd->g1, 0));
        CUDA_OK(cudaEventRecord(ev[1], 0));
        CUDA_OK(cudaEventRecord(ev[2], 0));
        CUDA_OK(marlin ? nvfp4moe_marlin_gemm(&sd->g2, 0) : nvfp4moe_hopper_gemm(&sd->g2, 0));
        CUDA_OK(cudaEventRecord(ev[3], 0));
        CUDA_OK(cudaEventSynchronize(ev[3]));
        CUDA_OK(cudaGetLastError());
        if (r >= 0) {
            CUDA_OK(cudaEventElapsedTime(&t1[r], ev[0], ev[1]));
            CUDA_OK(cudaEventElapsedTime(&t2[r], ev[2], ev[3]));
        }
    }
    qsort(t1, BENCH_REPS, sizeof(float), cmp_float);
    qsort(t2, BENCH_REPS, sizeof(float), cmp_float);
    *us1 = t1[BENCH_REPS / 2] * 1e3;
    *us2 = t2[BENCH_REPS / 2] * 1e3;
    for (int i = 0; i < 4; i++) cudaEventDestroy(ev[i]);
}

// GEMM1 ([2I, H]) + GEMM2 ([H, I]) of one model's routed experts, bf16, both kernels (the MARLIN
// one only with `marlin`) timed the same way in the same process: cold L2 by rotating `sets`
// separately repacked weight copies per kernel and GEMM.
// only_m: NULL = the default M values, else a comma-separated list of the M values to run
// ("1,64,1024", at most 16). Returns how many are in Ms.
static int bench_ms(const char *only_m, int *Ms) {
    static const int kDefault[] = {1, 16, 64, 256, 1024, 4096};
    int n = 0;
    if (!only_m) {
        for (size_t i = 0; i < sizeof kDefault / sizeof kDefault[0]; i++) Ms[n++] = kDefault[i];
        return n;
    }
    for (const char *q = only_m; *q && n < 16;) {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q) break;
        if (v >= 1 && v <= (1 << 20)) Ms[n++] = (int)v;
        q = *end == ',' ? end + 1 : end;
    }
    return n;
}

static int bench(int sm_count, const char *only_m, int sets, const bench_model *md, int marlin) {
    const int E = md->E, H = md->H, I = md->I, topk = md->topk;
    int Ms[16];
    const int nms = bench_ms(only_m, Ms);
    const double bw_floor = 4.27e12, tf_floor = 788e12;  // the H200's, measured (perf_anchors)
    const int N1 = 2 * I, K1 = H, N2 = H, K2 = I;

    // One random canonical tensor per GEMM shape, repacked `sets` times into separate buffers.
    void *b1[BENCH_MAX_SETS], *b2[BENCH_MAX_SETS], *m1[BENCH_MAX_SETS], *m2[BENCH_MAX_SETS];
    size_t p1 = nvfp4moe_hopper_packed_bytes(E, N1, K1), p2 = nvfp4moe_hopper_packed_bytes(E, N2, K2);
    size_t q1 = nvfp4moe_marlin_packed_bytes(E, N1, K1), q2 = nvfp4moe_marlin_packed_bytes(E, N2, K2);
    for (int gi = 0; gi < 2; gi++) {
        const int N = gi ? N2 : N1, K = gi ? K2 : K1;
        uint8_t *w, *sf;
        size_t wb = (size_t)E * N * K / 2, sb = (size_t)E * N * K / 16;
        CUDA_OK(cudaMalloc((void **)&w, wb));
        CUDA_OK(cudaMalloc((void **)&sf, sb));
        fill_random(w, wb, 0);
        fill_random(sf, sb, 1);
        for (int s = 0; s < sets; s++) {
            void **hb = gi ? &b2[s] : &b1[s], **mb = gi ? &m2[s] : &m1[s];
            CUDA_OK(cudaMalloc(hb, gi ? p2 : p1));
            CUDA_OK(nvfp4moe_hopper_repack(w, sf, E, N, K, 1, *hb, 0));
            if (marlin) {
                CUDA_OK(cudaMalloc(mb, gi ? q2 : q1));
                CUDA_OK(nvfp4moe_marlin_repack(w, sf, E, N, K, *mb, 0));
            }
        }
        CUDA_OK(cudaDeviceSynchronize());
        cudaFree(w);
        cudaFree(sf);
    }
    float *s2;
    CUDA_OK(cudaMalloc((void **)&s2, sizeof(float) * E));
    {
        float *hs = malloc(sizeof(float) * E);
        for (int e = 0; e < E; e++) hs[e] = 1.0f / 2688.0f;
        CUDA_OK(cudaMemcpy(s2, hs, sizeof(float) * E, cudaMemcpyHostToDevice));
        free(hs);
    }

    printf("\n%s routed experts (E=%d, H=%d, I=%d, top-%d), bf16, cold L2 (%d weight copies "
           "rotated per kernel), median of %d, CUDA events per GEMM call\n",
           md->name, E, H, I, topk, sets, BENCH_REPS);
    printf("floors: weight bytes touched / 4.27 TB/s and FLOPs / 788 TFLOP/s (an H200's, measured; on another "
           "card compare the times, not the %% of floor)\n\n");
    printf("| M | P | block_m | experts | GEMM1 us | GEMM2 us | total us | weight GB/s | TFLOP/s "
           "| floor us | %% of floor | MARLIN bm | MARLIN G1 us | MARLIN G2 us | MARLIN us | vs MARLIN |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int mi = 0; mi < nms; mi++) {
        const int M = Ms[mi], P = M * topk;
        int32_t *ids = malloc(sizeof(int32_t) * P);
        route(M, topk, E, ids);
        int *hit = calloc((size_t)E, sizeof(int));
        int touched = 0;
        for (int p = 0; p < P; p++) hit[ids[p]] = 1;
        for (int e = 0; e < E; e++) touched += hit[e];
        free(hit);
        void *a1, *a2, *c1, *c2;
        float *rs;
        CUDA_OK(cudaMalloc(&a1, (size_t)M * K1 * 2));
        CUDA_OK(cudaMalloc(&a2, (size_t)P * K2 * 2));
        CUDA_OK(cudaMalloc(&c1, (size_t)P * N1 * 2));
        CUDA_OK(cudaMalloc(&c2, (size_t)P * N2 * 2));
        CUDA_OK(cudaMalloc((void **)&rs, sizeof(float) * P));
        {
            size_t n1 = (size_t)M * K1, n2 = (size_t)P * K2;
            uint16_t *h = malloc(2 * (n1 > n2 ? n1 : n2));
            for (size_t i = 0; i < n1; i++) h[i] = f2bf((float)rng_normal());
            CUDA_OK(cudaMemcpy(a1, h, n1 * 2, cudaMemcpyHostToDevice));
            // GEMM2's activations: what the SiLU-and-mul stage would produce, magnitude ~1.
            for (size_t i = 0; i < n2; i++) h[i] = f2bf((float)rng_normal());
            CUDA_OK(cudaMemcpy(a2, h, n2 * 2, cudaMemcpyHostToDevice));
            free(h);
            float *hr = malloc(sizeof(float) * P);
            for (int p = 0; p < P; p++) hr[p] = 1.0f / topk;
            CUDA_OK(cudaMemcpy(rs, hr, sizeof(float) * P, cudaMemcpyHostToDevice));
            free(hr);
        }
        bench_side hs, ms;
        double us1, us2, mu1 = 0, mu2 = 0;
        side_init(&hs, 0, ids, P, E, N1, K1, N2, K2, topk, a1, a2, c1, c2, rs, s2, sm_count);
        side_time(&hs, 0, b1, b2, sets, &us1, &us2);
        side_free(&hs);
        if (marlin) {
            side_init(&ms, 1, ids, P, E, N1, K1, N2, K2, topk, a1, a2, c1, c2, rs, s2, sm_count);
            side_time(&ms, 1, m1, m2, sets, &mu1, &mu2);
            side_free(&ms);
        }
        const double us = us1 + us2, mu = mu1 + mu2;
        double bytes = (double)touched * ((double)N1 * K1 + (double)N2 * K2) * 0.5625;
        double flops = 2.0 * P * ((double)N1 * K1 + (double)N2 * K2);
        double floor_us = fmax(bytes / bw_floor, flops / tf_floor) * 1e6;
        printf("| %d | %d | %d | %d | %.1f | %.1f | %.1f | %.0f | %.1f | %.1f | %.1f ", M, P, hs.bm,
               touched, us1, us2, us, bytes / (us * 1e-6) / 1e9, flops / (us * 1e-6) / 1e12,
               floor_us, 100.0 * floor_us / us);
        if (marlin)
            printf("| %d | %.1f | %.1f | %.1f | %.2fx |\n", ms.bm, mu1, mu2, mu, mu / us);
        else
            printf("| - | - | - | - | - |\n");
        fflush(stdout);
        cudaFree(a1); cudaFree(a2); cudaFree(c1); cudaFree(c2); cudaFree(rs);
        free(ids);
    }
    for (int s = 0; s < sets; s++) {
        cudaFree(b1[s]);
        cudaFree(b2[s]);
        if (marlin) {
            cudaFree(m1[s]);
            cudaFree(m2[s]);
        }
    }
    cudaFree(s2);
    return 0;
}

// On a device that is not compute capability 9.0 the GEMM must refuse without launching.
static void check_refusal(int major, int minor) {
    void *buf;
    CUDA_OK(cudaMalloc(&buf, 4096));
    CUDA_OK(cudaMemset(buf, 0, 4096));
    nvfp4moe_hopper_args args;
    memset(&args, 0, sizeof args);
    args.a = buf; args.a_row_div = 1; args.b = buf; args.scale_2 = buf; args.c = buf;
    args.sorted_ids = buf; args.block_expert = buf; args.num_blocks = buf;
    args.P = 1; args.N = 16; args.K = 16; args.E = 1; args.block_m = 8; args.max_blocks = 1;
    args.is_bf16 = 1; args.sm_count = 1;
    cudaError_t err = nvfp4moe_hopper_gemm(&args, 0);
    int ok = err == cudaErrorNoKernelImageForDevice;
    t_record(ok);
    printf("%-4s compute capability %d.%d: the Hopper GEMM refuses (%s)\n", ok ? "ok" : "FAIL",
           major, minor, cudaGetErrorString(err));
    cudaFree(buf);
}

int main(int argc, char **argv) {
    int dev = 0, sm_count = 0, major = 0, minor = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);  // keep the lines already printed if a run is cut short
    CUDA_OK(cudaSetDevice(dev));
    CUDA_OK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, dev));
    CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9) {
        printf("gpu_hopper_gemm: not a compute capability 9.x device: the correctness grid and "
               "the benchmark are skipped\n");
        check_refusal(major, minor);
        return t_finish("gpu_hopper_gemm");
    }
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        // --bench [M,M..] [--sets N] [--model NAME|all] [--marlin]
        int sets = 4, marlin = 0, rc = 0;
        const char *only_m = NULL;
        const char *model = "deepseek-v3";
        for (int i = 2; i < argc; i++) {
            if (strcmp(argv[i], "--sets") == 0 && i + 1 < argc) sets = atoi(argv[++i]);
            else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) model = argv[++i];
            else if (strcmp(argv[i], "--marlin") == 0) marlin = 1;
            else only_m = argv[i];
        }
        if (sets < 1 || sets > BENCH_MAX_SETS) sets = 4;
        for (size_t i = 0; i < sizeof bench_models / sizeof bench_models[0]; i++)
            if (strcmp(model, "all") == 0 || strcmp(model, bench_models[i].name) == 0)
                rc |= bench(sm_count, only_m, sets, &bench_models[i], marlin);
        return rc;
    }

    // name, E, N, K, M, topk, block_m, gather, row_scale, bias, bf16, e_used, no_ws, graph,
    // halves, subtiles, rowtiles (block_m 64 and 128 run two weight tiles per item unless
    // rowtiles forces one: the cases without it cover that form)
    static const test_case cases[] = {
        {"P=1 decode bm8", 4, 144, 272, 1, 1, 8, 1, 0, 0, 1, 4, 0, 0, 0, 0, 0, 0},
        {"gather top4 bm8 bias", 8, 272, 144, 5, 4, 8, 1, 0, 1, 1, 6, 0, 0, 0, 0, 0, 0},
        {"gpt-oss-like 2880 bm16 split", 6, 2880, 2880, 6, 4, 16, 1, 0, 1, 1, 5, 0, 0, 0, 0, 0, 0},
        {"gemm2 row_scale bm16 fp16", 8, 1024, 256, 16, 2, 16, 0, 1, 0, 0, 5, 0, 0, 0, 0, 0, 0},
        {"bm32 gather fp16 bias rs", 6, 272, 1040, 40, 2, 32, 1, 1, 1, 0, 4, 0, 0, 0, 0, 0, 0},
        {"bm64 n=2880 k=144", 4, 2880, 144, 64, 2, 64, 0, 1, 1, 1, 3, 0, 0, 0, 0, 0, 0},
        {"bm64 large", 4, 1536, 512, 128, 2, 64, 1, 0, 0, 1, 4, 0, 0, 0, 0, 0, 0},
        {"bm64 fp16 rs bias empty experts", 8, 400, 720, 96, 2, 64, 0, 1, 1, 0, 3, 0, 0, 0, 0, 0, 0},
        {"deepseek-ish K split bm8", 16, 512, 7168, 2, 8, 8, 1, 0, 0, 1, 16, 0, 0, 0, 0, 0, 0},
        {"deepseek-ish no workspace bm8", 16, 512, 7168, 2, 8, 8, 1, 0, 0, 1, 16, 1, 0, 0, 0, 0, 0},
        {"deepseek-ish gemm2 bm8 fp16", 16, 2048, 1024, 3, 8, 8, 0, 1, 0, 0, 16, 0, 0, 0, 0, 0, 0},
        {"bm16 top1 all one expert", 4, 256, 512, 33, 1, 16, 1, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0},
        {"bm64 k=16 n=16 tiny", 2, 16, 16, 70, 1, 64, 1, 1, 1, 0, 2, 0, 0, 0, 0, 0, 0},
        {"bm8 bf16 many experts", 64, 144, 1024, 7, 6, 8, 1, 1, 1, 1, 64, 0, 0, 0, 0, 0, 0},
        {"bm128 prefill bf16 bias rs", 4, 384, 1024, 300, 2, 128, 1, 1, 1, 1, 4, 0, 0, 0, 0, 0, 0},
        {"bm128 fp16 n=2880 k=2880", 3, 2880, 2880, 200, 2, 128, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0},
        {"graph decode split bm8", 16, 1024, 4096, 1, 8, 8, 1, 0, 0, 1, 16, 0, 1, 0, 0, 0, 0},
        {"graph bm32 fp16 rs bias", 8, 512, 512, 40, 2, 32, 1, 1, 1, 0, 6, 0, 1, 0, 0, 0, 0},
        {"gate/up scales stacked K split bm8", 16, 512, 7168, 2, 8, 8, 1, 0, 0, 1, 16, 0, 0, 1, 0, 0, 0},
        {"gate/up scales interleaved bm16 bias", 6, 2880, 2880, 6, 4, 16, 1, 0, 1, 1, 5, 0, 0, 2, 0, 0, 0},
        {"gate/up scales stacked bm128 prefill", 4, 384, 1024, 300, 2, 128, 1, 0, 1, 1, 4, 0, 0, 1, 0, 0, 0},
        {"gate/up scales interleaved no workspace", 16, 512, 7168, 2, 8, 8, 1, 0, 0, 0, 16, 1, 0, 2, 0, 0, 0},
        // blocks whose second token half holds no pair, with and without a K split
        {"bm64 K split second token half empty", 4, 512, 4096, 20, 4, 64, 1, 1, 1, 1, 4, 0, 0, 0, 0, 0, 0},
        {"bm128 K split fp16 bias halves", 6, 768, 2048, 100, 4, 128, 1, 1, 1, 0, 6, 0, 0, 1, 0, 0, 0},
        {"bm128 half-empty blocks no workspace", 5, 640, 1024, 90, 3, 128, 1, 0, 1, 1, 5, 1, 0, 0, 0, 0, 0},
        // block_m 64 with one token tile width forced (1) and the fitted widths forced (2) on full
        // blocks (top-4 of 4 experts at M = 64: every expert exactly one block of 64 pairs) and on
        // blocks whose second token half is empty
        {"bm64 one tile forced half-empty K split", 4, 512, 4096, 20, 4, 64, 1, 1, 1, 1, 4, 0, 0, 0, 1, 0, 0},
        {"bm64 fitted widths forced, full blocks", 4, 1536, 512, 64, 4, 64, 1, 0, 0, 1, 4, 0, 0, 0, 2, 0, 0},
        {"bm64 one tile forced fp16 empty experts", 8, 400, 720, 96, 2, 64, 0, 1, 1, 0, 3, 1, 0, 2, 1, 0, 0},
        {"graph bm64 full blocks", 4, 768, 1024, 64, 4, 64, 1, 1, 1, 1, 4, 0, 1, 1, 0, 0, 0},
        {"bm64 one tile forced k=16 n=16 tiny", 2, 16, 16, 70, 1, 64, 1, 1, 1, 0, 2, 0, 0, 0, 1, 0, 0},
        // one weight tile per item forced at block_m 64, and two at 64 and 128 on an odd tile
        // count (the last item's second tile absent) with a K split, fp16, halves, graph
        {"bm128 one row tile bf16 bias rs", 4, 384, 1024, 300, 2, 128, 1, 1, 1, 1, 4, 0, 0, 0, 0, 1, 0},
        {"bm64 one row tile K split fp16 halves", 6, 768, 2048, 100, 4, 64, 1, 1, 1, 0, 6, 0, 0, 1, 2, 1, 0},
        {"bm64 one row tile one token tile", 4, 1536, 512, 64, 4, 64, 1, 0, 0, 1, 4, 0, 0, 0, 1, 1, 0},
        {"bm64 two row tiles K split odd n tiles", 4, 384, 4096, 20, 4, 64, 1, 1, 1, 1, 4, 0, 0, 0, 0, 2, 0},
        {"bm128 two row tiles odd fp16 halves", 5, 1408, 640, 260, 2, 128, 1, 1, 0, 0, 5, 0, 0, 2, 0, 2, 0},
        {"graph bm128 two row tiles K split odd", 6, 640, 4096, 70, 4, 128, 1, 1, 1, 1, 5, 0, 1, 1, 0, 2, 0},
        // GEMM1 with SiLU-and-mul fused (two weight tiles per item, gate tile t with up tile
        // t + n_tiles/2): plain, with a limit on fp16 with gate/up scales, with a K split, forced
        // to block_m 128, on one token tile with a row scale, on two token tiles; and requests it
        // does not take (other activations; N/2 not whole tiles): C written, act_out untouched
        {"fused silu bm64 bias", 4, 512, 1024, 64, 4, 64, 1, 0, 1, 1, 4, 1, 0, 0, 0, 0, 1},
        {"fused silu limit fp16 halves bm64", 6, 768, 640, 100, 4, 64, 1, 0, 1, 0, 6, 1, 0, 1, 0, 0, 2},
        {"fused silu limit K split", 4, 512, 4096, 20, 4, 64, 1, 0, 1, 1, 4, 0, 0, 1, 0, 0, 2},
        {"fused silu bm128 two row tiles", 5, 1024, 512, 260, 2, 128, 1, 0, 1, 1, 5, 1, 0, 0, 0, 2, 1},
        {"fused silu one token tile rs", 4, 1536, 512, 64, 4, 64, 1, 1, 0, 1, 4, 1, 0, 0, 1, 0, 1},
        {"fused silu limit fitted widths forced", 8, 256, 768, 96, 2, 64, 0, 0, 1, 1, 3, 1, 0, 0, 2, 0, 2},
        {"swigluoai stacked asked, not fused", 4, 512, 1024, 64, 4, 64, 1, 0, 1, 1, 4, 1, 0, 1, 0, 0, 3},
        {"gelu_tanh asked, not fused", 4, 512, 1024, 64, 4, 64, 1, 0, 1, 0, 4, 1, 0, 0, 0, 0, 4},
        {"silu asked, N/2 not whole tiles", 4, 384, 1024, 64, 2, 64, 1, 0, 1, 1, 4, 1, 0, 0, 0, 0, 1},
        // the narrowest widths: block_m 64 blocks of at most 16 pairs (round-robin items, no
        // workspace), fused SiLU at block_m 128 on experts of 150 pairs (a 22-pair tail block)
        {"bm64 width 16 blocks no workspace", 4, 512, 1024, 12, 4, 64, 1, 1, 1, 1, 4, 1, 0, 0, 0, 0, 0},
        {"fused silu bm128 width 32 tails rs", 4, 512, 1024, 150, 4, 128, 1, 1, 1, 1, 4, 0, 0, 0, 0, 0, 1},
        // block_m 128 tails of 22 pairs without the activation: fp16, bias, gate/up scales, an odd
        // tile count (the last item's second tile absent on a narrow item too)
        {"bm128 width 32 tails fp16 bias odd n tiles", 4, 640, 1024, 150, 4, 128, 1, 0, 1, 0, 4, 0, 0, 1, 0, 0, 0},
        // block_m 32 (a built form where it runs one k group: two weight tiles, the item
        // hand-over, two CTAs per SM): fused SiLU on experts of 40 pairs (a block of 32 and a tail
        // of 8), an odd tile count with a K split on fp16 with gate/up scales, fused SiLU with a
        // limit in a graph
        {"bm32 fused silu bias", 4, 512, 1024, 40, 4, 32, 1, 0, 1, 1, 4, 0, 0, 0, 0, 0, 1},
        {"bm32 odd n tiles K split fp16 halves rs", 6, 640, 4096, 12, 4, 32, 1, 1, 1, 0, 6, 0, 0, 1, 0, 0, 0},
        {"graph bm32 fused silu limit fp16 halves", 6, 768, 640, 30, 4, 32, 1, 0, 1, 0, 6, 0, 1, 1, 0, 0, 2},
        // a layer's shape: more units than CTAs, claimed, with a workspace that K may split
        // (Qwen3-30B-A3B's GEMM1 at M = 64 with the fused SiLU at block_m 32; 64 experts of 16
        // pairs at block_m 64, fp16, row scales, gate/up scales)
        {"bm32 qwen3-30b GEMM1 M=64 fused silu", 128, 1536, 2048, 64, 8, 32, 1, 0, 1, 1, 128, 0, 0, 0, 0, 0, 1},
        {"bm64 64 experts fp16 rs halves", 64, 1024, 2048, 128, 8, 64, 1, 1, 1, 0, 64, 0, 0, 1, 0, 0, 0},
    };
    // Cases again on a grid of 2 or 3 CTAs (the GEMM sizes its persistent grid from sm_count): each
    // CTA then walks many items, so the stage ring wraps across items, an item whose second weight
    // tile is absent (idle warpgroup) is followed by full ones, and the split-K election's flags and
    // barriers are reused. Then cases again as a launch with PDL behind the same GEMM (run_case's
    // pdl; sms 0: the device's grid): block_m 32 (two CTAs per SM), 64 and 128, claimed items with a
    // graph, ones that may split K and one without a workspace (plain launches then), a layer's
    // shape, and on 2-3 CTAs (later items claimed after the wait; case 6's first item shorter than
    // the ring). --case ncases + j runs rerun j alone.
    static const struct {
        int idx, sms, pdl;
    } reruns[] = {{14, 2, 0}, {22, 3, 0}, {24, 2, 0}, {33, 2, 0}, {34, 3, 0}, {35, 2, 0}, {36, 3, 0},
                  {38, 2, 0}, {39, 3, 0}, {47, 2, 0}, {48, 2, 0}, {49, 3, 0},
                  {4, 0, 1},  {6, 0, 1},  {14, 0, 1}, {17, 0, 1}, {22, 0, 1}, {24, 0, 1}, {28, 0, 1},
                  {35, 0, 1}, {51, 0, 1}, {52, 0, 1}, {4, 2, 1},  {6, 2, 1},  {14, 2, 1}, {28, 3, 1}};
    const size_t ncases = sizeof cases / sizeof cases[0];
    int only = -1;  // --case I runs case I alone (for compute-sanitizer)
    if (argc > 2 && strcmp(argv[1], "--case") == 0) only = atoi(argv[2]);
    for (size_t i = 0; i < ncases; i++)
        if (only < 0 || (size_t)only == i) run_case(&cases[i], sm_count, 0);
    for (size_t j = 0; j < sizeof reruns / sizeof reruns[0]; j++) {
        if (only >= 0 && (size_t)only != ncases + j) continue;
        test_case tc = cases[reruns[j].idx];
        char name[64], ctas[16] = "";
        if (reruns[j].sms) snprintf(ctas, sizeof ctas, reruns[j].pdl ? ", %d CTAs" : "%d CTAs", reruns[j].sms);
        snprintf(name, sizeof name, "%.24s [%s%s]", tc.name, reruns[j].pdl ? "pdl" : "", ctas);
        tc.name = name;
        run_case(&tc, reruns[j].sms ? reruns[j].sms : sm_count, reruns[j].pdl);
    }
    return t_finish("gpu_hopper_gemm");
}
