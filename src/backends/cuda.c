/*
 * cuda.c - the three CUDA backends of the oracle: MARLIN (W4A16: NVFP4 weights decoded in
 * the Marlin-class mma.sync GEMM, kernels/marlin_gemm.cu), HOPPER_WGMMA (W4A16 on sm_90a's wgmma,
 * kernels/hopper_gemm.cu, same arguments as MARLIN's GEMM) and EMULATION (vLLM's EMULATION path
 * with vLLM's rounding points, kernels/emulation.cu; src/reference/emulation.c computes the same on
 * the host).
 *
 * All three share one pipeline, all on the caller's stream, with no allocation, no host
 * synchronization and no host branching on data (a forward can be captured in a CUDA graph):
 *
 *   route (or the caller's top-k) + group pairs by expert   1 launch for M <= 64, else 2
 *   [scale by the router weight and/or QDQ the input]       EMULATION, or weight-on-input only
 *   GEMM1 [gate; up] (bias)                                  1
 *   activation [+ QDQ for EMULATION]                         1 (HOPPER_WGMMA: 0 where GEMM1
 *                                                              applies SiLU itself)
 *   GEMM2 x top-k weight (bias)                              1
 *   sum over the top-k (EMULATION: vLLM's moe_sum)           1
 *
 * Intermediates are stored in the activation dtype (bf16/fp16), as every real kernel does.
 *
 * HOPPER_WGMMA has a second regime for small batches (a few tokens per expert): the decode
 * kernels of kernels/hopper_decode.cu read the same packed weights and fuse the stages, so a
 * forward is route+group, GEMM1 + activation, GEMM2 + router weight + combine: 3 launches
 * (+ the input pass for weight-on-input). The regime follows the pairs per expert
 * (nvfp4moe_hopper_decode_block_m); NVFP4MOE_HOPPER_REGIME=decode|gemm|auto at plan creation
 * forces one, for benchmarks and tests.
 */
#ifdef NVFP4MOE_HAVE_CUDA

#include "backends/backends.h"
#include "reference/reference.h"

#include "kernels/emulation.h"
#include "kernels/hopper_decode.h"
#include "kernels/hopper_gemm.h"
#include "kernels/moe_gemm.h"
#include "kernels/pipeline.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* A W4A16 GEMM: MARLIN's and HOPPER_WGMMA's take the same arguments (nvfp4moe_marlin_args) and
 * the same grouping, and differ in weight layout, block_m rule and workspace. */
typedef struct w4a16_gemm {
    const char *backend;          /* "MARLIN" */
    size_t (*packed_bytes)(int32_t E, int32_t N, int32_t K);
    cudaError_t (*repack)(const uint8_t *w, const uint8_t *sf, int32_t E, int32_t N, int32_t K,
                          int32_t is_bf16, void *out, cudaStream_t stream);
    size_t (*workspace_bytes)(int32_t P, int32_t N, int32_t K, int32_t max_blocks, int32_t block_m,
                              int32_t sm_count);
    cudaError_t (*gemm)(const nvfp4moe_marlin_args *args, cudaStream_t stream);
    int32_t (*block_m)(int64_t P, int32_t E, int32_t I);  /* I: the intermediate size */
    bool has_decode;              /* a fused small-batch path (kernels/hopper_decode.h) on the same weights */
    /* whether GEMM1 with these arguments writes act(C) to args->act_out itself, or NULL: never */
    int32_t (*fuses_activation)(const nvfp4moe_marlin_args *args);
} w4a16_gemm;

/* MARLIN's layout is the same for both activation dtypes. */
static cudaError_t marlin_repack(const uint8_t *w, const uint8_t *sf, int32_t E, int32_t N, int32_t K,
                                 int32_t is_bf16, void *out, cudaStream_t stream) {
    (void)is_bf16;
    return nvfp4moe_marlin_repack(w, sf, E, N, K, out, stream);
}

/* MARLIN's block_m rule (vLLM's) does not look at the intermediate size. */
static int32_t marlin_block_m(int64_t P, int32_t E, int32_t I) {
    (void)I;
    return nvfp4moe_marlin_block_m(P, E);
}

static const w4a16_gemm k_marlin_gemm = {
    "MARLIN", nvfp4moe_marlin_packed_bytes, marlin_repack,
    nvfp4moe_marlin_workspace_bytes, nvfp4moe_marlin_gemm, marlin_block_m, false, NULL};
static const w4a16_gemm k_hopper_gemm = {
    "HOPPER_WGMMA", nvfp4moe_hopper_packed_bytes, nvfp4moe_hopper_repack,
    nvfp4moe_hopper_workspace_bytes, nvfp4moe_hopper_gemm, nvfp4moe_hopper_block_m, true,
    nvfp4moe_hopper_fuses_activation};

/* Which of HOPPER_WGMMA's two regimes a forward runs: by the tokens per expert (auto), or forced
 * by NVFP4MOE_HOPPER_REGIME=decode|gemm at plan creation (benchmarks and tests time and check
 * both regimes at every batch size; the results are the same layer either way). */
typedef enum { REGIME_AUTO = 0, REGIME_DECODE, REGIME_GEMM } regime;

typedef struct cuda_state {
    const char *name;             /* "MARLIN" / "HOPPER_WGMMA" / "EMULATION" */
    const w4a16_gemm *gemm;       /* the W4A16 GEMM; NULL: EMULATION */
    bool w4a16;                   /* gemm != NULL */
    nvfp4moe_config cfg;
    int32_t E, H, I, N1, K;       /* K = top_k */
    int32_t is_bf16;
    int32_t sm_count;
    int device;
    regime regime;                /* HOPPER_WGMMA: decode/gemm choice */
    int32_t decode_pdl;           /* HOPPER_WGMMA decode: GEMM1 and GEMM2 launched with PDL */
    int32_t decode_prefetch;      /* HOPPER_WGMMA decode: k tiles prefetched into L2 ahead */
    int32_t decode_g1_room;       /* HOPPER_WGMMA decode: CTA slots per SM GEMM1 leaves free */
    int32_t decode_g2_l2_mb;      /* HOPPER_WGMMA decode: MB of GEMM2's weights prefetched early */
    int32_t decode_route;         /* HOPPER_WGMMA decode: GEMM1 routes and groups a few tokens itself */
    int32_t decode_combine_kernel; /* HOPPER_WGMMA decode: the top-k combine as a kernel after GEMM2
                                    * (1), in GEMM2's epilogue (0), or by the batch (-1) */
    int32_t decode_kw[2];         /* HOPPER_WGMMA decode: warps per item of GEMM1, GEMM2 (0: the kernels' choice) */
    int32_t gemm_row_tiles;       /* HOPPER_WGMMA larger batches: 128-row weight tiles per item (0: the GEMM's choice) */
    int32_t gemm_token_tiles;     /* and its token tile form: 1 one width, 0 the GEMM's choice */
    int32_t gemm_fused_act;       /* HOPPER_WGMMA larger batches: GEMM1 applies the activation where it can */
    int32_t gemm_pdl;             /* HOPPER_WGMMA larger batches: GEMM2 launched with PDL behind GEMM1 */
    int32_t gemm_chain_pdl;       /* HOPPER_WGMMA larger batches: grouping, GEMM1 and combine launched with PDL */
    int32_t gemm_block_m;         /* HOPPER_WGMMA larger batches: the GEMM's block_m (0: its rule) */
    nvfp4moe_gpu_act_params act;
    nvfp4moe_gpu_route_params route;
    float a1_gs, a2_gs;           /* EMULATION: activation quantization global scales */
    /* device memory, owned */
    void *w13, *w2;               /* MARLIN: repacked; EMULATION: canonical packed E2M1 */
    uint8_t *w13_sf, *w2_sf;      /* EMULATION: linear E4M3 block scales */
    float *w13_s2, *w2_s2;        /* [E]; w13_s2 [E, 2] (gate, up) when w13_halves */
    int32_t w13_halves;           /* GEMM1's scale_2_halves: 0, 1 stacked gate/up, 2 interleaved */
    float *w13_bias, *w2_bias;    /* or NULL */
    float *corr_bias;             /* or NULL */
} cuda_state;

static nvfp4moe_status cuda_fail(const cuda_state *st, cudaError_t err, const char *what) {
    return nvfp4moe_set_error(NVFP4MOE_ERR_CUDA, "%s: %s: %s", st ? st->name : "CUDA", what,
                              cudaGetErrorString(err));
}

#define CUDA_TRY(st, expr, what)                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) return cuda_fail((st), e_, (what));                                 \
    } while (0)

// ---- workspace layout ----

typedef struct ws_layout {
    int64_t P;
    int32_t block_m, max_blocks;
    bool decode;                  /* the fused small-batch kernels run (HOPPER_WGMMA) */
    int64_t cap;
    size_t ids, wts, sorted, bexp, nblk, a1, c1, act, gemm_ws, gemm_ws2, partial, counters, total;
} ws_layout;

static size_t align_up(size_t x) { return (x + 255) & ~(size_t)255; }

static bool needs_input_pass(const cuda_state *st) {
    return !st->w4a16 || st->cfg.apply_router_weight_on_input;
}

/* Whether the decode regime's top-k combine runs as a kernel of its own after GEMM2 rather than in
 * GEMM2's epilogue (the same bits either way). In the epilogue, every item ends with a fence and an
 * arrival count before the next item's loads, which a batch of many short items pays item after
 * item; the kernel costs a launch. H100, whole layer, every preset, from 2 tokens and 8
 * token-expert pairs on: -7.8 to +0.2 % as a kernel (Qwen3-30B-A3B M = 16 117.5 -> 109.1 us;
 * every top-4 and top-8 preset from 8 tokens on -1.4 % or better); at one token -0.8 to +1.1 %
 * (Mixtral-8x7B) and at 2 tokens of top-2 +0.6 %: kept in the epilogue there
 * (bench/results/2026-12-07-h100-combine-kernel.md). */
static bool combine_as_kernel(const cuda_state *st, int64_t M) {
    if (st->decode_combine_kernel >= 0) return st->decode_combine_kernel != 0;
    return M >= 2 && M * st->K >= 8;
}

/* block_m of the decode kernels for P pairs, or 0 when the wgmma GEMM runs. */
static int32_t decode_block_m(const cuda_state *st, int64_t P) {
    if (!st->w4a16 || !st->gemm->has_decode || st->regime == REGIME_GEMM) return 0;
    const int32_t bm = nvfp4moe_hopper_decode_block_m(P, st->E);
    return bm ? bm : st->regime == REGIME_DECODE ? 16 : 0;
}

static ws_layout layout_for(const cuda_state *st, int64_t M) {
    ws_layout L;
    memset(&L, 0, sizeof L);
    L.P = M * st->K;
    const int32_t dbm = decode_block_m(st, L.P);
    L.decode = dbm != 0;
    L.block_m = L.decode          ? dbm
                : st->gemm_block_m ? st->gemm_block_m
                : st->w4a16        ? st->gemm->block_m(L.P, st->E, st->I)
                                   : NVFP4MOE_EMUL_BLOCK_M;
    L.cap = nvfp4moe_group_capacity(L.P, st->E, L.block_m);
    L.max_blocks = (int32_t)(L.cap / L.block_m);
    const size_t e16 = 2;
    size_t off = 0;
    L.ids = off;    off += align_up((size_t)L.P * sizeof(int32_t));
    L.wts = off;    off += align_up((size_t)L.P * sizeof(float));
    L.sorted = off; off += align_up((size_t)L.cap * sizeof(int32_t));
    L.bexp = off;   off += align_up((size_t)L.max_blocks * sizeof(int32_t));
    L.nblk = off;   off += align_up(sizeof(int32_t));
    L.a1 = off;     off += needs_input_pass(st) ? align_up((size_t)M * st->H * e16) : 0;
    if (L.decode) {
        /* GEMM1 writes the activation's output directly; GEMM2 parks each slot's fp32 row tile in
         * `partial` until the token's last slot arrives (arrival counters per token and tile). */
        L.act = off;      off += align_up((size_t)L.P * st->I * e16);
        L.partial = off;  off += align_up((size_t)L.P * st->H * sizeof(float));
        L.counters = off; off += align_up(nvfp4moe_hopper_decode_counters(M, st->H) * sizeof(int32_t));
        L.total = off;
        return L;
    }
    /* GEMM1's output, reused for GEMM2's (the activation has consumed it by then). */
    L.c1 = off;     off += align_up((size_t)L.P * (size_t)NVFP4MOE_MAX(st->N1, st->H) * e16);
    L.act = off;    off += align_up((size_t)L.P * st->I * e16);
    L.gemm_ws = off;
    if (st->w4a16) {
        size_t g1 = st->gemm->workspace_bytes((int32_t)L.P, st->N1, st->H, L.max_blocks, L.block_m,
                                              st->sm_count);
        size_t g2 = st->gemm->workspace_bytes((int32_t)L.P, st->H, st->I, L.max_blocks, L.block_m,
                                              st->sm_count);
        off += align_up(NVFP4MOE_MAX(g1, g2));
        /* GEMM2 launched with PDL behind GEMM1 claims items while GEMM1's last CTAs still run:
         * a workspace of its own (GEMM1 zeroes its item counter); g2 is the 16-byte counter
         * except at batches small enough for GEMM2 to split K */
        if (st->gemm_pdl && st->gemm->has_decode) {
            L.gemm_ws2 = off;
            off += align_up(g2);
        }
    }
    L.total = off;
    return L;
}

// ---- create / destroy ----

static void cuda_destroy(void *state) {
    cuda_state *st = state;
    if (!st) return;
    void *bufs[] = {st->w13, st->w2, st->w13_sf, st->w2_sf, st->w13_s2, st->w2_s2,
                    st->w13_bias, st->w2_bias, st->corr_bias};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cudaFree(bufs[i]);
    free(st);
}

/* A device copy of bytes at src (host or device memory). */
static nvfp4moe_status upload(cuda_state *st, const void *src, size_t bytes, bool on_device,
                              const char *what, void **dst) {
    *dst = NULL;
    cudaError_t e = cudaMalloc(dst, bytes);
    if (e != cudaSuccess) {
        *dst = NULL;
        return nvfp4moe_set_error(e == cudaErrorMemoryAllocation ? NVFP4MOE_ERR_OUT_OF_MEMORY : NVFP4MOE_ERR_CUDA,
                                  "%s: cudaMalloc(%s, %zu bytes): %s", st->name, what, bytes,
                                  cudaGetErrorString(e));
    }
    CUDA_TRY(st, cudaMemcpy(*dst, src, bytes, on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice), what);
    return NVFP4MOE_OK;
}

/* A device [E, 2] array of (a[e], b[e]) pairs, from E floats each (host or device memory). */
static nvfp4moe_status upload_pairs(cuda_state *st, const float *a, const float *b, int32_t E, bool on_device,
                                    void **dst) {
    *dst = NULL;
    const size_t bytes = sizeof(float) * 2 * (size_t)E;
    cudaError_t e = cudaMalloc(dst, bytes);
    if (e != cudaSuccess) {
        *dst = NULL;
        return nvfp4moe_set_error(e == cudaErrorMemoryAllocation ? NVFP4MOE_ERR_OUT_OF_MEMORY : NVFP4MOE_ERR_CUDA,
                                  "%s: cudaMalloc(w13 gate/up scales, %zu bytes): %s", st->name, bytes,
                                  cudaGetErrorString(e));
    }
    const enum cudaMemcpyKind kind = on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
    float *d = *dst;
    CUDA_TRY(st, cudaMemcpy2D(d, 2 * sizeof(float), a, sizeof(float), sizeof(float), (size_t)E, kind), "w13_scale_2");
    CUDA_TRY(st, cudaMemcpy2D(d + 1, 2 * sizeof(float), b, sizeof(float), sizeof(float), (size_t)E, kind),
             "w13_up_scale_2");
    return NVFP4MOE_OK;
}

/* Host copy of E floats that may live on the device. */
static nvfp4moe_status fetch_floats(cuda_state *st, const float *src, int32_t n, bool on_device,
                                    float *dst, const char *what) {
    if (!on_device) {
        memcpy(dst, src, sizeof(float) * (size_t)n);
        return NVFP4MOE_OK;
    }
    CUDA_TRY(st, cudaMemcpy(dst, src, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost), what);
    return NVFP4MOE_OK;
}

/* Device-resident weights get the checks nvfp4moe_weights_validate gives host weights: the small
 * per-expert tensors are copied to the host and checked there, the block scales are searched for
 * NaN codes on the device (the host never holds them). The kernels would read a NaN scale as 480. */
static nvfp4moe_status validate_device_weights(cuda_state *st, const nvfp4moe_config *cfg,
                                               const nvfp4moe_weights *w) {
    const int64_t E = st->E, H = st->H, I = st->I, N1 = st->N1;
    const struct { const float *p; const char *name; int64_t n; bool positive; } vecs[] = {
        {w->w13_scale_2, "w13_scale_2", E, true},
        {w->w13_up_scale_2, "w13_up_scale_2", E, true},
        {w->w2_scale_2, "w2_scale_2", E, true},
        {st->w4a16 ? NULL : w->w13_input_scale, "w13_input_scale", E, true},
        {st->w4a16 ? NULL : w->w2_input_scale, "w2_input_scale", E, true},
        {cfg->has_bias ? w->w13_bias : NULL, "w13_bias", E * N1, false},
        {cfg->has_bias ? w->w2_bias : NULL, "w2_bias", E * H, false},
        {cfg->has_correction_bias ? w->correction_bias : NULL, "correction_bias", E, false},
    };
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) {
        if (!vecs[i].p) continue;
        float *h = malloc(sizeof(float) * (size_t)vecs[i].n);
        NVFP4MOE_RETURN_IF(!h, NVFP4MOE_ERR_OUT_OF_MEMORY, "%s: out of memory", st->name);
        cudaError_t e = cudaMemcpy(h, vecs[i].p, sizeof(float) * (size_t)vecs[i].n, cudaMemcpyDeviceToHost);
        nvfp4moe_status s = e != cudaSuccess ? cuda_fail(st, e, vecs[i].name)
                                             : nvfp4moe_check_per_expert(vecs[i].name, h,
                                                                         vecs[i].n, vecs[i].positive);
        free(h);
        if (s != NVFP4MOE_OK) return s;
    }
    const struct { const uint8_t *p; const char *name; int64_t rows, kb; } sfs[] = {
        {w->w13_scale, "w13_scale", N1, H / 16}, {w->w2_scale, "w2_scale", H, I / 16}};
    unsigned long long *d_first = NULL;
    CUDA_TRY(st, cudaMalloc((void **)&d_first, sizeof *d_first), "cudaMalloc");
    nvfp4moe_status s = NVFP4MOE_OK;
    for (int i = 0; i < 2 && s == NVFP4MOE_OK; i++) {
        unsigned long long first = 0;
        uint8_t code = 0;
        cudaError_t e = nvfp4moe_gpu_find_e4m3_nan(sfs[i].p, (size_t)(E * sfs[i].rows * sfs[i].kb), d_first, 0);
        if (e == cudaSuccess) e = cudaMemcpy(&first, d_first, sizeof first, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess && first != ~0ull) e = cudaMemcpy(&code, sfs[i].p + first, 1, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) s = cuda_fail(st, e, sfs[i].name);
        else if (first != ~0ull) s = nvfp4moe_scale_nan_error(sfs[i].name, code, (int64_t)first, sfs[i].rows, sfs[i].kb);
    }
    cudaFree(d_first);
    return s;
}

/* Repacks one projection ([E, N, K]) into the W4A16 GEMM's layout. */
static nvfp4moe_status w4a16_pack(cuda_state *st, const uint8_t *w, const uint8_t *sf, int32_t N,
                                   int32_t K, bool on_device, const char *what, void **out) {
    const size_t wb = (size_t)st->E * N * (K / 2), sb = (size_t)st->E * N * (K / 16);
    const uint8_t *dw = w, *dsf = sf;
    void *tw = NULL, *tsf = NULL;
    nvfp4moe_status s = NVFP4MOE_OK;
    if (!on_device) {
        if ((s = upload(st, w, wb, false, what, &tw)) != NVFP4MOE_OK) goto done;
        if ((s = upload(st, sf, sb, false, what, &tsf)) != NVFP4MOE_OK) goto done;
        dw = tw;
        dsf = tsf;
    }
    const size_t pb = st->gemm->packed_bytes(st->E, N, K);
    cudaError_t e = cudaMalloc(out, pb);
    if (e != cudaSuccess) {
        *out = NULL;
        s = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "%s: cudaMalloc(%s repacked, %zu bytes): %s",
                               st->name, what, pb, cudaGetErrorString(e));
        goto done;
    }
    e = st->gemm->repack(dw, dsf, st->E, N, K, st->is_bf16, *out, 0);
    if (e == cudaSuccess) e = cudaStreamSynchronize(0);
    if (e != cudaSuccess) s = cuda_fail(st, e, "repacking the weights");
done:
    if (tw) cudaFree(tw);
    if (tsf) cudaFree(tsf);
    return s;
}

static nvfp4moe_status cuda_create(const w4a16_gemm *gemm, const nvfp4moe_backend_impl *impl,
                                   const nvfp4moe_config *cfg, const nvfp4moe_weights *w, bool on_device,
                                   const nvfp4moe_device *dev, void **state) {
    const bool w4a16 = gemm != NULL;
    const char *name = w4a16 ? gemm->backend : "EMULATION";
    NVFP4MOE_RETURN_IF(!cfg || !w || !state, NVFP4MOE_ERR_INVALID_ARGUMENT, "%s: create: %s is NULL", name,
                       !cfg ? "cfg" : !w ? "weights" : "state");
    NVFP4MOE_TRY(nvfp4moe_config_validate(cfg));
    NVFP4MOE_RETURN_IF(dev && !dev->is_cuda, NVFP4MOE_ERR_UNSUPPORTED,
                       "%s: not available: the device is not a CUDA GPU (%s)", name, dev->name);
    NVFP4MOE_RETURN_IF(cfg->in_dtype == NVFP4MOE_DTYPE_F32, NVFP4MOE_ERR_UNSUPPORTED,
                       "%s: in_dtype=f32 is not supported: the CUDA backends take bf16 or fp16 hidden states",
                       name);
    NVFP4MOE_RETURN_IF(!w4a16 && cfg->activation == NVFP4MOE_ACT_RELU2, NVFP4MOE_ERR_UNSUPPORTED,
                       "EMULATION: activation=relu2 is not supported: vLLM's EMULATION (TritonExperts) has no "
                       "gated relu2 (relu2_no_mul is supported)");
    NVFP4MOE_RETURN_IF(!w4a16 && cfg->scheme != NVFP4MOE_SCHEME_W4A4, NVFP4MOE_ERR_UNSUPPORTED,
                       "EMULATION: scheme=%s is not supported: EMULATION runs W4A4 only",
                       nvfp4moe_scheme_name(cfg->scheme));
    NVFP4MOE_RETURN_IF(cfg->num_experts > NVFP4MOE_GPU_MAX_EXPERTS, NVFP4MOE_ERR_UNSUPPORTED,
                       "%s: num_experts=%d exceeds the GPU router's limit of %d", name, cfg->num_experts,
                       NVFP4MOE_GPU_MAX_EXPERTS);
    NVFP4MOE_RETURN_IF(cfg->top_k > NVFP4MOE_GPU_MAX_TOPK, NVFP4MOE_ERR_UNSUPPORTED,
                       "%s: top_k=%d exceeds the GPU router's limit of %d", name, cfg->top_k,
                       NVFP4MOE_GPU_MAX_TOPK);
    NVFP4MOE_RETURN_IF(cfg->routing == NVFP4MOE_ROUTING_DEEPSEEK_V3 && cfg->n_group > 32,
                       NVFP4MOE_ERR_UNSUPPORTED, "%s: n_group=%d exceeds the GPU router's limit of 32",
                       name, cfg->n_group);
    const char *missing = !w->w13 ? "w13" : !w->w13_scale ? "w13_scale" : !w->w13_scale_2 ? "w13_scale_2"
                        : !w->w2 ? "w2" : !w->w2_scale ? "w2_scale" : !w->w2_scale_2 ? "w2_scale_2"
                        : (!w4a16 && !w->w13_input_scale) ? "w13_input_scale"
                        : (!w4a16 && !w->w2_input_scale) ? "w2_input_scale"
                        : (cfg->has_bias && !w->w13_bias) ? "w13_bias"
                        : (cfg->has_bias && !w->w2_bias) ? "w2_bias"
                        : (cfg->has_correction_bias && !w->correction_bias) ? "correction_bias" : NULL;
    NVFP4MOE_RETURN_IF(missing, NVFP4MOE_ERR_INVALID_ARGUMENT, "%s: weight tensor %s is NULL", name, missing);

    cuda_state *st = calloc(1, sizeof *st);
    NVFP4MOE_RETURN_IF(!st, NVFP4MOE_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    st->name = name;
    st->gemm = gemm;
    st->w4a16 = w4a16;
    st->cfg = *cfg;
    st->E = cfg->num_experts;
    st->H = cfg->hidden_size;
    st->I = cfg->intermediate_size;
    st->N1 = nvfp4moe_config_n1(cfg);
    st->K = cfg->top_k;
    st->is_bf16 = cfg->in_dtype == NVFP4MOE_DTYPE_BF16;
    st->regime = REGIME_AUTO;
    if (w4a16 && gemm->has_decode) {
        const char *r = getenv("NVFP4MOE_HOPPER_REGIME");
        if (r && strcmp(r, "decode") == 0) st->regime = REGIME_DECODE;
        else if (r && strcmp(r, "gemm") == 0) st->regime = REGIME_GEMM;
        else if (r && *r && strcmp(r, "auto") != 0) {
            free(st);
            return nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT,
                                      "%s: NVFP4MOE_HOPPER_REGIME=%s: expected auto, decode or gemm", name, r);
        }
    }
    /* The decode kernels' launch settings, for benchmarks to compare: NVFP4MOE_HOPPER_PDL=0|1
     * (programmatic dependent launch), NVFP4MOE_HOPPER_PREFETCH (k tiles prefetched into L2 ahead
     * of the loads), NVFP4MOE_HOPPER_G1_ROOM (CTA slots per multiprocessor GEMM1 leaves free for
     * GEMM2), NVFP4MOE_HOPPER_G2_L2_MB (MB of GEMM2's weights prefetched into L2 before it waits
     * for GEMM1). All off by default: the kernels as measured in bench/results; a setting becomes
     * a default once a committed benchmark shows it faster. NVFP4MOE_HOPPER_FUSED_ROUTE=0|1:
     * GEMM1 routes and groups up to NVFP4MOE_DECODE_ROUTE_MAX_TOKENS tokens itself (on by default)
     * instead of a routing/grouping kernel running ahead of it. NVFP4MOE_HOPPER_COMBINE_KERNEL=0|1:
     * the top-k combine in GEMM2's epilogue (0) or as a kernel of its own after GEMM2 (1; the same
     * bits); unset, by the batch (combine_as_kernel). NVFP4MOE_HOPPER_G1_KW and
     * NVFP4MOE_HOPPER_G2_KW = 1, 2 or 4 force the warps that share an item in GEMM1 / GEMM2 (0:
     * the kernels choose from the item count). NVFP4MOE_HOPPER_ROW_TILES = 1 or 2 forces the
     * larger-batch GEMM's 128-row weight tiles per work item (0: the GEMM's choice);
     * NVFP4MOE_HOPPER_FUSED_ACT=0 keeps that GEMM1 from applying the activation itself (on by
     * default where the GEMM can: nvfp4moe_hopper_fuses_activation). NVFP4MOE_HOPPER_TOKEN_TILES=1
     * runs every block of that GEMM on one token tile of block_m columns (0: the narrowest that
     * holds its pairs, nvfp4moe_hopper_token_subtiles). NVFP4MOE_HOPPER_BLOCK_M = 8, 16, 32, 64
     * or 128 forces that GEMM's block_m (0: nvfp4moe_hopper_block_m's rule).
     * NVFP4MOE_HOPPER_GEMM_PDL (1, the default) launches that GEMM2 with programmatic dependent
     * launch right behind a GEMM1 that applies the activation itself: GEMM2's CTAs take the
     * multiprocessors GEMM1's last CTAs leave and stream their first weights before they wait
     * for GEMM1 (H100, whole layer: Qwen3-30B-A3B 3-4 % faster at M = 64-1024, Qwen3-235B-A22B
     * 1-2 %, the other presets within +-0.6 %: bench/results/2026-12-07-h100-gemm-pdl.md); 0
     * launches it after GEMM1 has finished. NVFP4MOE_HOPPER_CHAIN_PDL (1, the default) launches
     * the rest of that chain with programmatic dependent launch too: the grouping behind the
     * routing grid, GEMM1 behind the grouping (which zeroes GEMM1's item counter, so no clear runs
     * between them unless GEMM1 splits K) and the combine behind GEMM2; each waits for the kernel
     * ahead before it reads its output (H100, whole layer: 0.3-2.2 % faster on most presets from
     * M = 128, within noise below: bench/results/2026-12-07-h100-chain-pdl.md); 0 launches them
     * plainly. */
    st->decode_pdl = 0;
    st->decode_prefetch = 0;
    st->decode_g1_room = 0;
    st->decode_g2_l2_mb = 0;
    st->decode_route = 1;
    st->decode_combine_kernel = -1;
    st->decode_kw[0] = st->decode_kw[1] = 0;
    st->gemm_row_tiles = 0;
    st->gemm_token_tiles = 0;
    st->gemm_fused_act = 1;
    st->gemm_pdl = 1;
    st->gemm_chain_pdl = 1;
    st->gemm_block_m = 0;
    if (w4a16 && gemm->has_decode) {
        static const struct {
            const char *var;
            long max;
            size_t off;
            long pow2_min;  /* 0: any integer from 0 to max; else 0 or a power of two from pow2_min to max */
        } k_knobs[] = {
            {"NVFP4MOE_HOPPER_PDL", 1, offsetof(cuda_state, decode_pdl), 0},
            {"NVFP4MOE_HOPPER_PREFETCH", NVFP4MOE_DECODE_MAX_PREFETCH, offsetof(cuda_state, decode_prefetch), 0},
            {"NVFP4MOE_HOPPER_G1_ROOM", 3, offsetof(cuda_state, decode_g1_room), 0},
            {"NVFP4MOE_HOPPER_G2_L2_MB", 48, offsetof(cuda_state, decode_g2_l2_mb), 0},
            {"NVFP4MOE_HOPPER_FUSED_ROUTE", 1, offsetof(cuda_state, decode_route), 0},
            {"NVFP4MOE_HOPPER_COMBINE_KERNEL", 1, offsetof(cuda_state, decode_combine_kernel), 0},
            {"NVFP4MOE_HOPPER_G1_KW", 4, offsetof(cuda_state, decode_kw), 1},
            {"NVFP4MOE_HOPPER_G2_KW", 4, offsetof(cuda_state, decode_kw) + sizeof(int32_t), 1},
            {"NVFP4MOE_HOPPER_ROW_TILES", 2, offsetof(cuda_state, gemm_row_tiles), 0},
            {"NVFP4MOE_HOPPER_TOKEN_TILES", 2, offsetof(cuda_state, gemm_token_tiles), 0},
            {"NVFP4MOE_HOPPER_FUSED_ACT", 1, offsetof(cuda_state, gemm_fused_act), 0},
            {"NVFP4MOE_HOPPER_GEMM_PDL", 1, offsetof(cuda_state, gemm_pdl), 0},
            {"NVFP4MOE_HOPPER_CHAIN_PDL", 1, offsetof(cuda_state, gemm_chain_pdl), 0},
            {"NVFP4MOE_HOPPER_BLOCK_M", 128, offsetof(cuda_state, gemm_block_m), 8},
        };
        for (size_t i = 0; i < sizeof k_knobs / sizeof k_knobs[0]; i++) {
            const char *v = getenv(k_knobs[i].var);
            if (!v || !*v) continue;
            char *end = NULL;
            const long n = strtol(v, &end, 10);
            const long p2 = k_knobs[i].pow2_min;
            if (*end || n < 0 || n > k_knobs[i].max || (p2 && n && ((n & (n - 1)) || n < p2))) {
                free(st);
                if (p2)
                    return nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT,
                                              "%s: %s=%s: expected 0 or a power of two from %ld to %ld", name,
                                              k_knobs[i].var, v, p2, k_knobs[i].max);
                return nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT,
                                          "%s: %s=%s: expected an integer from 0 to %ld", name,
                                          k_knobs[i].var, v, k_knobs[i].max);
            }
            *(int32_t *)((char *)st + k_knobs[i].off) = (int32_t)n;
        }
    }
    nvfp4moe_status s = NVFP4MOE_OK;
    cudaError_t e;

#define FAIL(expr)                                                                                 \
    do {                                                                                           \
        if ((s = (expr)) != NVFP4MOE_OK) goto fail;                                                \
    } while (0)
#define CFAIL(expr, what)                                                                          \
    do {                                                                                           \
        if ((e = (expr)) != cudaSuccess) { s = cuda_fail(st, e, (what)); goto fail; }              \
    } while (0)

    st->device = dev && dev->ordinal >= 0 ? dev->ordinal : 0;
    if (dev && dev->ordinal >= 0) CFAIL(cudaSetDevice(dev->ordinal), "cudaSetDevice");
    else CFAIL(cudaGetDevice(&st->device), "cudaGetDevice");
    int major = 0, minor = 0;
    CFAIL(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, st->device), "cudaDeviceGetAttribute");
    CFAIL(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, st->device), "cudaDeviceGetAttribute");
    CFAIL(cudaDeviceGetAttribute(&st->sm_count, cudaDevAttrMultiProcessorCount, st->device), "cudaDeviceGetAttribute");
    char why[96];
    if (!nvfp4moe_impl_runs_on_sm(impl, major * 10 + minor, why, sizeof why)) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED, "%s: not available: %s", name, why);
        goto fail;
    }

    const nvfp4moe_act_params ap = nvfp4moe_config_act_params(cfg);
    st->act = (nvfp4moe_gpu_act_params){
        .activation = cfg->activation, .has_limit = ap.has_limit, .limit = ap.limit, .alpha = ap.alpha,
        .beta = ap.beta, .situ_beta = ap.situ_beta, .situ_linear_beta = ap.situ_linear_beta};

    if (on_device) FAIL(validate_device_weights(st, cfg, w));
    const int32_t E = st->E, H = st->H, I = st->I, N1 = st->N1;
    if (w4a16) {
        FAIL(w4a16_pack(st, w->w13, w->w13_scale, N1, H, on_device, "w13", &st->w13));
        FAIL(w4a16_pack(st, w->w2, w->w2_scale, H, I, on_device, "w2", &st->w2));
    } else {
        FAIL(upload(st, w->w13, (size_t)E * N1 * (H / 2), on_device, "w13", &st->w13));
        FAIL(upload(st, w->w13_scale, (size_t)E * N1 * (H / 16), on_device, "w13_scale", (void **)&st->w13_sf));
        FAIL(upload(st, w->w2, (size_t)E * H * (I / 2), on_device, "w2", &st->w2));
        FAIL(upload(st, w->w2_scale, (size_t)E * H * (I / 16), on_device, "w2_scale", (void **)&st->w2_sf));
        /* vLLM EMULATION: one activation global scale per projection, 1 / max over experts */
        float *tmp = malloc(sizeof(float) * (size_t)E);
        if (!tmp) {
            s = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
            goto fail;
        }
        float m1 = 0.0f, m2 = 0.0f;
        s = fetch_floats(st, w->w13_input_scale, E, on_device, tmp, "w13_input_scale");
        for (int32_t i = 0; s == NVFP4MOE_OK && i < E; i++) m1 = fmaxf(m1, tmp[i]);
        if (s == NVFP4MOE_OK) s = fetch_floats(st, w->w2_input_scale, E, on_device, tmp, "w2_input_scale");
        for (int32_t i = 0; s == NVFP4MOE_OK && i < E; i++) m2 = fmaxf(m2, tmp[i]);
        free(tmp);
        if (s != NVFP4MOE_OK) goto fail;
        if (!(m1 > 0.0f && isfinite(m1)) || !(m2 > 0.0f && isfinite(m2))) {
            s = nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT,
                                   "%s: %s must be finite and positive (max over experts is %g)", name,
                                   !(m1 > 0.0f && isfinite(m1)) ? "w13_input_scale" : "w2_input_scale",
                                   (double)(!(m1 > 0.0f && isfinite(m1)) ? m1 : m2));
            goto fail;
        }
        st->a1_gs = 1.0f / m1;
        st->a2_gs = 1.0f / m2;
        /* the activation as vLLM's EMULATION runs it (swigluoai and swiglustep at the ops' defaults) */
        const nvfp4moe_act_params ep = nvfp4moe_emulation_act_params(cfg);
        st->act.has_limit = ep.has_limit;
        st->act.limit = ep.limit;
        st->act.alpha = ep.alpha;
        st->act.beta = ep.beta;
    }
    if (nvfp4moe_activation_is_gated(cfg->activation)) {
        /* GEMM1's global scales per (expert, half): [E, 2], gate then up (the up half's own when the
         * weights have one, else the expert's). */
        st->w13_halves = cfg->activation == NVFP4MOE_ACT_SWIGLUOAI ? 2 : 1;
        FAIL(upload_pairs(st, w->w13_scale_2, w->w13_up_scale_2 ? w->w13_up_scale_2 : w->w13_scale_2, E, on_device,
                          (void **)&st->w13_s2));
    } else {
        FAIL(upload(st, w->w13_scale_2, sizeof(float) * (size_t)E, on_device, "w13_scale_2", (void **)&st->w13_s2));
    }
    FAIL(upload(st, w->w2_scale_2, sizeof(float) * (size_t)E, on_device, "w2_scale_2", (void **)&st->w2_s2));
    if (cfg->has_bias) {
        FAIL(upload(st, w->w13_bias, sizeof(float) * (size_t)E * N1, on_device, "w13_bias", (void **)&st->w13_bias));
        FAIL(upload(st, w->w2_bias, sizeof(float) * (size_t)E * H, on_device, "w2_bias", (void **)&st->w2_bias));
    }
    if (cfg->has_correction_bias)
        FAIL(upload(st, w->correction_bias, sizeof(float) * (size_t)E, on_device, "correction_bias",
                    (void **)&st->corr_bias));
    st->route = (nvfp4moe_gpu_route_params){
        .method = cfg->routing, .logits_dtype = cfg->router_logits_dtype, .num_experts = E,
        .top_k = cfg->top_k, .n_group = cfg->n_group, .topk_group = cfg->topk_group,
        .routed_scaling_factor = cfg->routed_scaling_factor, .correction_bias = st->corr_bias,
        .seed = cfg->seed};
    CFAIL(cudaDeviceSynchronize(), "preparing the weights");
    *state = st;
    return NVFP4MOE_OK;
fail:
    cuda_destroy(st);
    return s;
#undef FAIL
#undef CFAIL
}

static nvfp4moe_status marlin_create(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                     const nvfp4moe_plan_options *opt, const nvfp4moe_device *dev, void **state) {
    return cuda_create(&k_marlin_gemm, &nvfp4moe_impl_marlin, cfg, w, opt->weights_on_device, dev, state);
}
static nvfp4moe_status hopper_create(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                     const nvfp4moe_plan_options *opt, const nvfp4moe_device *dev, void **state) {
    return cuda_create(&k_hopper_gemm, &nvfp4moe_impl_hopper_wgmma, cfg, w, opt->weights_on_device, dev, state);
}
static nvfp4moe_status emulation_create(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                        const nvfp4moe_plan_options *opt, const nvfp4moe_device *dev, void **state) {
    return cuda_create(NULL, &nvfp4moe_impl_emulation, cfg, w, opt->weights_on_device, dev, state);
}

static size_t cuda_workspace(const void *state, int64_t num_tokens) {
    if (!state || num_tokens <= 0) return 0;
    return layout_for(state, num_tokens).total;
}

// ---- forward ----

static bool misaligned(const void *p) { return ((uintptr_t)p & 15u) != 0; }

static nvfp4moe_status cuda_forward(void *state, const nvfp4moe_io *io, void *stream_) {
    cuda_state *st = state;
    NVFP4MOE_RETURN_IF(!st || !io, NVFP4MOE_ERR_INVALID_ARGUMENT, "forward: %s is NULL", !st ? "state" : "io");
    const int64_t M = io->num_tokens;
    NVFP4MOE_RETURN_IF(M < 0, NVFP4MOE_ERR_SHAPE, "%s: io.num_tokens=%lld is negative", st->name, (long long)M);
    if (M == 0) return NVFP4MOE_OK;
    NVFP4MOE_RETURN_IF(M * st->K > INT32_MAX / 2, NVFP4MOE_ERR_SHAPE,
                       "%s: io.num_tokens=%lld is too large for 32-bit pair indices", st->name, (long long)M);
    NVFP4MOE_RETURN_IF(!io->hidden || !io->output, NVFP4MOE_ERR_INVALID_ARGUMENT, "%s: io.%s is NULL",
                       st->name, !io->hidden ? "hidden" : "output");
    NVFP4MOE_RETURN_IF(misaligned(io->hidden) || misaligned(io->output), NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "%s: io.%s must be 16-byte aligned device memory", st->name,
                       misaligned(io->hidden) ? "hidden" : "output");
    const bool precomputed = io->topk_ids != NULL;
    NVFP4MOE_RETURN_IF(precomputed && !io->topk_weights, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "%s: io.topk_ids is given but io.topk_weights is NULL", st->name);
    NVFP4MOE_RETURN_IF(!precomputed && !io->router_logits && st->cfg.routing != NVFP4MOE_ROUTING_SIMULATED,
                       NVFP4MOE_ERR_INVALID_ARGUMENT, "%s: io.router_logits and io.topk_ids are both NULL",
                       st->name);
    const ws_layout L = layout_for(st, M);
    NVFP4MOE_RETURN_IF(!io->workspace || io->workspace_size < L.total, NVFP4MOE_ERR_BUFFER_TOO_SMALL,
                       "%s: io.workspace: %zu bytes given, %zu needed for %lld tokens", st->name,
                       io->workspace ? io->workspace_size : (size_t)0, L.total, (long long)M);

    cudaStream_t stream = (cudaStream_t)stream_;
    char *ws = io->workspace;
    int32_t *ids = precomputed ? (int32_t *)io->topk_ids : (int32_t *)(ws + L.ids);
    float *wts = precomputed ? (float *)io->topk_weights : (float *)(ws + L.wts);
    int32_t *sorted = (int32_t *)(ws + L.sorted), *bexp = (int32_t *)(ws + L.bexp);
    int32_t *nblk = (int32_t *)(ws + L.nblk);
    void *c1 = ws + L.c1, *act = ws + L.act;
    const int32_t P = (int32_t)L.P;

    /* A few tokens in the decode regime: GEMM1 routes and groups them itself (no kernel ahead).
     * Not with the launch settings it has no use for (PDL, L2 prefetch, GEMM1 room): those
     * benchmarks keep the chain they measure. */
    const bool route_in_gemm1 = L.decode && st->decode_route && !needs_input_pass(st) && !st->decode_pdl &&
                                !st->decode_prefetch && !st->decode_g1_room &&
                                nvfp4moe_hopper_decode_can_route(M, st->K, st->E);
    /* The wgmma GEMM's chain with programmatic dependent launch: the grouping behind the routing,
     * GEMM1 behind the grouping (which zeroes GEMM1's item counter: the first int32 of its
     * workspace, kernels/moe_gemm.h), the combine behind GEMM2. Not with an input pass between
     * the grouping and GEMM1. */
    const bool chain = st->gemm_chain_pdl && st->w4a16 && st->gemm->has_decode && !L.decode && !needs_input_pass(st);
    const nvfp4moe_gpu_chain ch = {.pdl = chain, .zero = chain ? (int32_t *)(ws + L.gemm_ws) : NULL};
    if (!route_in_gemm1)
        CUDA_TRY(st, nvfp4moe_gpu_route_and_group(precomputed ? NULL : &st->route, io->router_logits, ids, wts,
                                                  M, st->K, st->E, L.block_m, sorted, bexp, nblk,
                                                  L.max_blocks, &ch, stream),
                 "routing and grouping");

    /* GEMM1's input: the hidden states, or their scaled and/or quantize-dequantized copy */
    const void *a_in = io->hidden;
    const bool on_input = st->cfg.apply_router_weight_on_input;
    if (needs_input_pass(st)) {
        void *a1 = ws + L.a1;
        if (st->w4a16)
            CUDA_TRY(st, nvfp4moe_gpu_scale_rows(io->hidden, a1, M, st->H, wts, st->is_bf16, stream), "input scaling");
        else
            CUDA_TRY(st, nvfp4moe_emul_input(io->hidden, a1, M, st->H, on_input ? wts : NULL, st->a1_gs, st->is_bf16,
                                             stream),
                     "input quantization (emulation)");
        a_in = a1;
    }

    if (L.decode) {
        const nvfp4moe_decode_combine cb = {
            .topk_ids = ids, .M = (int32_t)M, .top_k = st->K, .H = st->H, .counters = (int32_t *)(ws + L.counters),
            .out = io->output, .out_dtype = st->cfg.out_dtype, .deferred = combine_as_kernel(st, M)};
        const nvfp4moe_decode_gemm g1 = {
            .a = a_in, .a_row_div = st->K, .w = st->w13, .scale_2 = st->w13_s2, .bias = st->w13_bias,
            .sorted_ids = sorted, .block_expert = bexp, .num_blocks = nblk, .P = P, .N = st->N1, .K = st->H,
            .E = st->E, .block_m = L.block_m, .max_blocks = L.max_blocks, .is_bf16 = st->is_bf16,
            .sm_count = st->sm_count, .scale_2_halves = st->w13_halves, .prefetch_tiles = st->decode_prefetch,
            /* PDL needs the grouping kernel right ahead (an input pass between them is launched
             * without it, which keeps the order) */
            .pdl = st->decode_pdl, .room_per_sm = st->decode_g1_room, .warps_per_item = st->decode_kw[0]};
        if (route_in_gemm1) {
            const nvfp4moe_decode_route r = {
                .rp = precomputed ? NULL : &st->route, .logits = io->router_logits, .topk_ids = ids,
                .topk_weights = wts, .sorted_ids = sorted, .block_expert = bexp, .num_blocks = nblk};
            CUDA_TRY(st, nvfp4moe_hopper_decode_route_gemm1(&g1, &r, &st->act, st->I, act, &cb, stream),
                     "routing + grouping + GEMM1 + activation");
        } else {
            CUDA_TRY(st, nvfp4moe_hopper_decode_gemm1(&g1, &st->act, st->I, act, &cb, stream), "GEMM1 + activation");
        }
        const nvfp4moe_decode_gemm g2 = {
            .a = act, .a_row_div = 1, .w = st->w2, .scale_2 = st->w2_s2, .bias = st->w2_bias,
            .sorted_ids = sorted, .block_expert = bexp, .num_blocks = nblk, .P = P, .N = st->H, .K = st->I,
            .E = st->E, .block_m = L.block_m, .max_blocks = L.max_blocks, .is_bf16 = st->is_bf16,
            .sm_count = st->sm_count, .prefetch_tiles = st->decode_prefetch,
            .pdl = st->decode_pdl,
            .warps_per_item = st->decode_kw[1],
            .expert_prefetch_chunks = (int32_t)(((int64_t)st->decode_g2_l2_mb << 20) / NVFP4MOE_DECODE_CHUNK_BYTES)};
        CUDA_TRY(st, nvfp4moe_hopper_decode_gemm2(&g2, on_input ? NULL : wts, (float *)(ws + L.partial), &cb, stream),
                 cb.deferred ? "GEMM2" : "GEMM2 + combine");
        if (cb.deferred)
            CUDA_TRY(st, nvfp4moe_hopper_decode_combine(&cb, (const float *)(ws + L.partial), st->E, stream), "combine");
        return NVFP4MOE_OK;
    }

    bool fused_act = false;
    if (st->w4a16) {
        nvfp4moe_marlin_args g = {
            .a = a_in, .a_row_div = st->K, .b = st->w13, .scale_2 = st->w13_s2, .bias = st->w13_bias,
            .row_scale = NULL, .c = c1, .sorted_ids = sorted, .block_expert = bexp, .num_blocks = nblk,
            .P = P, .N = st->N1, .K = st->H, .E = st->E, .block_m = L.block_m, .max_blocks = L.max_blocks,
            .is_bf16 = st->is_bf16, .workspace = ws + L.gemm_ws, .sm_count = st->sm_count,
            .scale_2_halves = st->w13_halves, .row_tiles = st->gemm_row_tiles,
            .token_subtiles = st->gemm_token_tiles, .act_out = act,
            .act = &st->act};
        /* GEMM1 applies the activation itself where it can (then no activation kernel) */
        fused_act = st->gemm_fused_act && st->gemm->fuses_activation && st->gemm->fuses_activation(&g);
        if (!fused_act) g.act_out = NULL, g.act = NULL;
        /* GEMM2 right behind GEMM1 (no activation kernel between): launched with PDL */
        if (fused_act && L.gemm_ws2) g.next_workspace = ws + L.gemm_ws2;
        g.pdl_head = chain;
        CUDA_TRY(st, st->gemm->gemm(&g, stream), "GEMM1");
    } else {
        nvfp4moe_emul_args g = {
            .a = a_in, .a_row_div = st->K, .w = st->w13, .sf = st->w13_sf, .scale_2 = st->w13_s2,
            .bias = st->w13_bias, .row_scale = NULL, .c = c1, .sorted_ids = sorted, .block_expert = bexp,
            .num_blocks = nblk, .P = P, .N = st->N1, .K = st->H, .E = st->E, .max_blocks = L.max_blocks,
            .is_bf16 = st->is_bf16, .scale_2_halves = st->w13_halves};
        CUDA_TRY(st, nvfp4moe_emul_gemm(&g, stream), "GEMM1 (emulation)");
    }

    if (st->w4a16) {
        if (!fused_act)
            CUDA_TRY(st, nvfp4moe_gpu_activation(c1, act, L.P, st->I, st->N1, &st->act, st->is_bf16, stream),
                     "activation");
    } else
        CUDA_TRY(st, nvfp4moe_emul_activation(c1, act, L.P, st->I, st->N1, &st->act, st->a2_gs, st->is_bf16, stream),
                 "activation (emulation)");

    const float *rs = on_input ? NULL : wts;
    if (st->w4a16) {
        nvfp4moe_marlin_args g = {
            .a = act, .a_row_div = 1, .b = st->w2, .scale_2 = st->w2_s2, .bias = st->w2_bias,
            .row_scale = rs, .c = c1, .sorted_ids = sorted, .block_expert = bexp, .num_blocks = nblk,
            .P = P, .N = st->H, .K = st->I, .E = st->E, .block_m = L.block_m, .max_blocks = L.max_blocks,
            .is_bf16 = st->is_bf16, .workspace = ws + L.gemm_ws, .sm_count = st->sm_count,
            .row_tiles = st->gemm_row_tiles, .token_subtiles = st->gemm_token_tiles};
        if (fused_act && L.gemm_ws2) g.workspace = ws + L.gemm_ws2, g.pdl = 1;
        CUDA_TRY(st, st->gemm->gemm(&g, stream), "GEMM2");
    } else {
        nvfp4moe_emul_args g = {
            .a = act, .a_row_div = 1, .w = st->w2, .sf = st->w2_sf, .scale_2 = st->w2_s2,
            .bias = st->w2_bias, .row_scale = rs, .c = c1, .sorted_ids = sorted, .block_expert = bexp,
            .num_blocks = nblk, .P = P, .N = st->H, .K = st->I, .E = st->E, .max_blocks = L.max_blocks,
            .is_bf16 = st->is_bf16};
        CUDA_TRY(st, nvfp4moe_emul_gemm(&g, stream), "GEMM2 (emulation)");
    }

    if (st->w4a16)
        CUDA_TRY(st, nvfp4moe_gpu_combine(c1, ids, M, st->K, st->E, st->H, st->is_bf16, io->output, st->cfg.out_dtype,
                                          chain, stream),
                 "combine");
    else
        CUDA_TRY(st, nvfp4moe_emul_moe_sum(c1, ids, M, st->K, st->E, st->H, st->is_bf16, io->output, st->cfg.out_dtype,
                                           stream),
                 "moe_sum (emulation)");
    return NVFP4MOE_OK;
}

static nvfp4moe_scheme marlin_scheme(nvfp4moe_scheme s) { return NVFP4MOE_SCHEME_W4A16; }
static nvfp4moe_scheme same_scheme(nvfp4moe_scheme s) { return s; }

const nvfp4moe_backend_impl nvfp4moe_impl_marlin = {
    .device_memory = true,
    .sm_min = NVFP4MOE_SM_AMPERE_KERNELS,
    .effective_scheme = marlin_scheme,
    .create = marlin_create,
    .workspace_size = cuda_workspace,
    .forward = cuda_forward,
    .destroy = cuda_destroy,
};

const nvfp4moe_backend_impl nvfp4moe_impl_hopper_wgmma = {
    .device_memory = true,
    .sm_min = NVFP4MOE_SM_HOPPER_KERNELS,
    .sm_max = NVFP4MOE_SM_HOPPER_KERNELS,
    .effective_scheme = marlin_scheme,
    .create = hopper_create,
    .workspace_size = cuda_workspace,
    .forward = cuda_forward,
    .destroy = cuda_destroy,
};

const nvfp4moe_backend_impl nvfp4moe_impl_emulation = {
    .device_memory = true,
    .sm_min = NVFP4MOE_SM_AMPERE_KERNELS,
    .effective_scheme = same_scheme,
    .create = emulation_create,
    .workspace_size = cuda_workspace,
    .forward = cuda_forward,
    .destroy = cuda_destroy,
};

#endif /* NVFP4MOE_HAVE_CUDA */
