/*
 * moe_ref.c - the float64 CPU reference of the whole MoE layer: the spec every backend is tested
 * against. Plain loops, no intrinsics, one expert at a time.
 *
 *   route -> [apply weight on input] -> quantize activations (per scheme) -> GEMM1 [gate; up]
 *         -> activation (exact clamp rules) -> quantize again (per scheme) -> GEMM2 -> weighted sum
 *
 * Numerics, per scheme (docs/numerics.md has the whole account):
 *   W4A4           activations quantize-dequantized with a1_gs = 1/max_e(w13_input_scale) before
 *                  GEMM1 and a2_gs = 1/max_e(w2_input_scale) before GEMM2 (vLLM EMULATION's rule),
 *                  with the quantizer of vLLM's Triton QDQ kernel (NVFP4MOE_QUANTIZER_VLLM_TRITON),
 *                  the dequantized values kept in float32
 *   W4A4 per-token the global scale is 448*6/amax(row), per token and per row of GEMM1's output
 *   W4A8 MXFP8     activations quantize-dequantized as MXFP8 (E4M3, E8M0 scale per 32)
 *   W4A16          activations are used as they are
 * Weights are dequantized exactly (e2m1 * e4m3 * scale_2, in float64); GEMMs accumulate in float64.
 * Where a quantizer consumes an intermediate, the intermediate is first rounded to the activation
 * dtype, as every real kernel stores it in that dtype. The output is rounded to cfg.out_dtype.
 */
#include "format/format.h"
#include "reference/reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Dequantizes one [rows, cols] NVFP4 matrix into float64 (exact: every product fits a double).
 * Both codes go through tables: the decoders are the codec's, called once per code value. A GEMM1
 * matrix (cfg != NULL) applies each row's half's scale: scale_2 to the gate rows, scale_up to the up
 * rows (nvfp4moe_w13_row_half). */
static void dequant_f64(const uint8_t *q, const uint8_t *sf, int64_t rows, int64_t cols, float scale_2,
                        const nvfp4moe_config *cfg, float scale_up, double *out) {
    double e2m1[16], e4m3[2][256];
    for (int i = 0; i < 16; i++) e2m1[i] = nvfp4moe_e2m1_decode((uint8_t)i);
    for (int i = 0; i < 256; i++) {
        e4m3[0][i] = (double)nvfp4moe_e4m3_decode((uint8_t)i) * (double)scale_2;
        e4m3[1][i] = (double)nvfp4moe_e4m3_decode((uint8_t)i) * (double)scale_up;
    }
    for (int64_t r = 0; r < rows; r++) {
        const double *tab = e4m3[cfg ? nvfp4moe_w13_row_half(cfg, r) : 0];
        for (int64_t c = 0; c < cols; c += 2) {
            uint8_t byte = q[r * (cols / 2) + c / 2];
            double s = tab[sf[r * (cols / 16) + c / 16]];
            out[r * cols + c] = e2m1[byte & 0xF] * s;
            out[r * cols + c + 1] = e2m1[byte >> 4] * s;
        }
    }
}

float nvfp4moe_per_token_global_scale(const float *x, int64_t n) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    /* 448 * 6 / amax puts the row's largest block at the top of the E4M3 scale range; an all-zero
     * row quantizes to zeros with any scale. */
    return amax > 0.0f ? 448.0f * 6.0f / amax : 1.0f;
}

void nvfp4moe_quantize_activation_row(nvfp4moe_scheme scheme, const float *src, int64_t n, float gs, float *dst) {
    switch (scheme) {
    case NVFP4MOE_SCHEME_W4A4:
        nvfp4moe_qdq_row_as(NVFP4MOE_QUANTIZER_VLLM_TRITON, src, n, gs, NVFP4MOE_DTYPE_F32, dst);
        break;
    case NVFP4MOE_SCHEME_W4A4_PER_TOKEN:
        nvfp4moe_qdq_row_as(NVFP4MOE_QUANTIZER_VLLM_TRITON, src, n, nvfp4moe_per_token_global_scale(src, n),
                            NVFP4MOE_DTYPE_F32, dst);
        break;
    case NVFP4MOE_SCHEME_W4A8_MXFP8:
        nvfp4moe_mxfp8_qdq_row(src, n, dst);
        break;
    default:
        if (dst != src) memcpy(dst, src, sizeof(float) * (size_t)n);
        break;
    }
}

void nvfp4moe_w4a4_global_scales(const nvfp4moe_config *cfg, const nvfp4moe_weights *w, float *a1_gs,
                                 float *a2_gs) {
    *a1_gs = *a2_gs = 1.0f;
    if (cfg->scheme != NVFP4MOE_SCHEME_W4A4) return;
    float m1 = 0.0f, m2 = 0.0f;
    for (int64_t e = 0; e < cfg->num_experts; e++) {
        m1 = fmaxf(m1, w->w13_input_scale[e]);
        m2 = fmaxf(m2, w->w2_input_scale[e]);
    }
    *a1_gs = 1.0f / m1;
    *a2_gs = 1.0f / m2;
}

void nvfp4moe_prepare_inputs(const nvfp4moe_config *cfg, const nvfp4moe_weights *w, const void *hidden,
                             int64_t M, const float *wts, float *x, float *a2_gs) {
    const int64_t H = cfg->hidden_size;
    /* The router weight is applied first when the model asks for it (Llama4), in the input dtype. */
    nvfp4moe_to_float(cfg->in_dtype, hidden, M * H, x);
    if (cfg->apply_router_weight_on_input)
        for (int64_t i = 0; i < M * H; i++) x[i] = nvfp4moe_round_to_dtype(cfg->in_dtype, x[i] * wts[i / H]);
    float a1_gs = 1.0f;
    nvfp4moe_w4a4_global_scales(cfg, w, &a1_gs, a2_gs);
    /* Each quantizer reads a whole block (or row) before writing it: in place is safe. */
    for (int64_t t = 0; t < M; t++) nvfp4moe_quantize_activation_row(cfg->scheme, x + t * H, H, a1_gs, x + t * H);
}

nvfp4moe_status nvfp4moe_group_by_expert(const int32_t *ids, int64_t P, int64_t E, int64_t *start, int64_t *order) {
    int64_t *fill = calloc((size_t)E, sizeof(int64_t));
    NVFP4MOE_RETURN_IF(!fill, NVFP4MOE_ERR_OUT_OF_MEMORY, "grouping %lld pairs by expert: out of memory",
                       (long long)P);
    memset(start, 0, sizeof(int64_t) * (size_t)(E + 1));
    for (int64_t p = 0; p < P; p++) start[ids[p] + 1]++;
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
    for (int64_t p = 0; p < P; p++) order[start[ids[p]] + fill[ids[p]]++] = p;
    free(fill);
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_check_io(const nvfp4moe_config *cfg, const nvfp4moe_io *io) {
    NVFP4MOE_RETURN_IF(!io, NVFP4MOE_ERR_INVALID_ARGUMENT, "io is NULL");
    NVFP4MOE_RETURN_IF(io->num_tokens < 0, NVFP4MOE_ERR_SHAPE, "io.num_tokens=%lld is negative",
                       (long long)io->num_tokens);
    if (io->num_tokens == 0) return NVFP4MOE_OK;
    NVFP4MOE_RETURN_IF(!io->hidden, NVFP4MOE_ERR_INVALID_ARGUMENT, "io.hidden is NULL");
    NVFP4MOE_RETURN_IF(!io->output, NVFP4MOE_ERR_INVALID_ARGUMENT, "io.output is NULL");
    NVFP4MOE_RETURN_IF(!io->topk_ids && !io->router_logits && cfg->routing != NVFP4MOE_ROUTING_SIMULATED,
                       NVFP4MOE_ERR_INVALID_ARGUMENT, "io.router_logits and io.topk_ids are both NULL");
    NVFP4MOE_RETURN_IF(io->topk_ids && !io->topk_weights, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "io.topk_ids is given but io.topk_weights is NULL");
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_check_topk(const nvfp4moe_config *cfg, const nvfp4moe_io *io) {
    const int64_t M = io->num_tokens, E = cfg->num_experts, K = cfg->top_k;
    for (int64_t i = 0; i < M * K; i++) {
        NVFP4MOE_RETURN_IF(io->topk_ids[i] < 0 || io->topk_ids[i] >= E, NVFP4MOE_ERR_INVALID_ARGUMENT,
                           "io.topk_ids[%lld][%lld]=%d is not an expert in [0, %lld)", (long long)(i / K),
                           (long long)(i % K), io->topk_ids[i], (long long)E);
        NVFP4MOE_RETURN_IF(!isfinite(io->topk_weights[i]), NVFP4MOE_ERR_INVALID_ARGUMENT,
                           "io.topk_weights[%lld][%lld] is not finite", (long long)(i / K), (long long)(i % K));
    }
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_routing_for_io(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                       const nvfp4moe_io *io, int32_t *ids, float *wts) {
    const int64_t M = io->num_tokens, E = cfg->num_experts, K = cfg->top_k;
    if (io->topk_ids) {
        NVFP4MOE_TRY(nvfp4moe_check_topk(cfg, io));
        memcpy(ids, io->topk_ids, sizeof(int32_t) * (size_t)(M * K));
        memcpy(wts, io->topk_weights, sizeof(float) * (size_t)(M * K));
        return NVFP4MOE_OK;
    }
    float *logits = NULL;
    if (io->router_logits) {
        logits = malloc(sizeof(float) * (size_t)(M * E));
        if (!logits) return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "reference: out of memory (logits)");
        nvfp4moe_to_float(cfg->router_logits_dtype, io->router_logits, M * E, logits);
    }
    nvfp4moe_status s = nvfp4moe_route(cfg, logits, M, w->correction_bias, ids, wts);
    free(logits);
    return s;
}

bool nvfp4moe_values_nonfinite(nvfp4moe_dtype dt, const void *p, int64_t n) {
    float buf[256];
    for (int64_t i = 0; i < n; i += 256) {
        const int64_t k = n - i < 256 ? n - i : 256;
        nvfp4moe_to_float(dt, (const char *)p + (size_t)i * nvfp4moe_dtype_size(dt), k, buf);
        for (int64_t j = 0; j < k; j++)
            if (!isfinite(buf[j])) return true;
    }
    return false;
}

bool nvfp4moe_routing_reads_logits(const nvfp4moe_config *cfg, const nvfp4moe_io *io) {
    return io->router_logits && !io->topk_ids && cfg->routing != NVFP4MOE_ROUTING_SIMULATED;
}

void nvfp4moe_nan_rows(const nvfp4moe_config *cfg, const nvfp4moe_io *io) {
    const int64_t H = cfg->hidden_size, E = cfg->num_experts;
    const size_t in_sz = nvfp4moe_dtype_size(cfg->in_dtype), out_sz = nvfp4moe_dtype_size(cfg->out_dtype);
    const size_t lg_sz = nvfp4moe_dtype_size(cfg->router_logits_dtype);
    const bool logits = nvfp4moe_routing_reads_logits(cfg, io);
    const float nan = NAN;
    for (int64_t t = 0; t < io->num_tokens; t++) {
        if (!nvfp4moe_values_nonfinite(cfg->in_dtype, (const char *)io->hidden + (size_t)(t * H) * in_sz, H) &&
            !(logits && nvfp4moe_values_nonfinite(cfg->router_logits_dtype, (const char *)io->router_logits + (size_t)(t * E) * lg_sz, E)))
            continue;
        for (int64_t n = 0; n < H; n++)
            nvfp4moe_from_float(cfg->out_dtype, &nan, 1, (char *)io->output + (size_t)(t * H + n) * out_sz);
    }
}

nvfp4moe_status nvfp4moe_reference_forward(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                           const nvfp4moe_io *io) {
    NVFP4MOE_TRY(nvfp4moe_config_validate(cfg));
    NVFP4MOE_TRY(nvfp4moe_weights_validate(cfg, w));
    NVFP4MOE_TRY(nvfp4moe_check_io(cfg, io));
    const int64_t M = io->num_tokens;
    if (M == 0) return NVFP4MOE_OK;
    const int64_t E = cfg->num_experts, K = cfg->top_k, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg);
    const nvfp4moe_scheme scheme = cfg->scheme;

    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(M * K));
    float *wts = malloc(sizeof(float) * (size_t)(M * K));
    float *x = malloc(sizeof(float) * (size_t)(M * H));       /* the quantize-dequantized inputs */
    double *acc = calloc((size_t)(M * H), sizeof(double));
    double *w13 = malloc(sizeof(double) * (size_t)(N1 * H));
    double *w2 = malloc(sizeof(double) * (size_t)(H * I));
    double *h = malloc(sizeof(double) * (size_t)N1), *act = malloc(sizeof(double) * (size_t)I);
    float *actf = malloc(sizeof(float) * (size_t)I), *actq = malloc(sizeof(float) * (size_t)I);
    int64_t *order = malloc(sizeof(int64_t) * (size_t)(M * K));
    int64_t *start = calloc((size_t)(E + 1), sizeof(int64_t));
    float *outf = malloc(sizeof(float) * (size_t)(M * H));
    nvfp4moe_status st = NVFP4MOE_OK;
    if (!ids || !wts || !x || !acc || !w13 || !w2 || !h || !act || !actf || !actq || !order || !start ||
        !outf) {
        st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "reference: out of memory (M=%lld)", (long long)M);
        goto done;
    }
    if ((st = nvfp4moe_routing_for_io(cfg, w, io, ids, wts)) != NVFP4MOE_OK) goto done;

    float a2_gs = 1.0f;
    nvfp4moe_prepare_inputs(cfg, w, io->hidden, M, wts, x, &a2_gs);
    if ((st = nvfp4moe_group_by_expert(ids, M * K, E, start, order)) != NVFP4MOE_OK) goto done;

    for (int64_t e = 0; e < E; e++) {
        if (start[e] == start[e + 1]) continue;
        dequant_f64(w->w13 + e * N1 * H / 2, w->w13_scale + e * N1 * H / 16, N1, H, nvfp4moe_w13_half_scale_2(w, e, 0),
                    cfg, nvfp4moe_w13_half_scale_2(w, e, 1), w13);
        dequant_f64(w->w2 + e * H * I / 2, w->w2_scale + e * H * I / 16, H, I, w->w2_scale_2[e], NULL,
                    w->w2_scale_2[e], w2);
        for (int64_t q = start[e]; q < start[e + 1]; q++) {
            const int64_t p = order[q], t = p / K;
            const float *xt = x + t * H;
            for (int64_t n = 0; n < N1; n++) {
                double s = 0;
                for (int64_t k = 0; k < H; k++) s += (double)xt[k] * w13[n * H + k];
                h[n] = s + (cfg->has_bias ? (double)w->w13_bias[e * N1 + n] : 0.0);
            }
            nvfp4moe_activation_ref(cfg, h, act);
            const double *a2 = act;
            double *a2buf = h; /* h is free again: reuse it for the quantized activation */
            if (scheme != NVFP4MOE_SCHEME_W4A16) {
                for (int64_t i = 0; i < I; i++) actf[i] = nvfp4moe_round_to_dtype(cfg->in_dtype, (float)act[i]);
                nvfp4moe_quantize_activation_row(scheme, actf, I, a2_gs, actq);
                for (int64_t i = 0; i < I; i++) a2buf[i] = actq[i];
                a2 = a2buf;
            }
            const double coef = cfg->apply_router_weight_on_input ? 1.0 : (double)wts[p];
            for (int64_t n = 0; n < H; n++) {
                double s = 0;
                for (int64_t i = 0; i < I; i++) s += a2[i] * w2[n * I + i];
                s += cfg->has_bias ? (double)w->w2_bias[e * H + n] : 0.0;
                acc[t * H + n] += coef * s;
            }
        }
    }
    for (int64_t i = 0; i < M * H; i++) outf[i] = (float)acc[i];
    nvfp4moe_from_float(cfg->out_dtype, outf, M * H, io->output);
    nvfp4moe_nan_rows(cfg, io);

done:
    free(ids); free(wts); free(x); free(acc); free(w13); free(w2); free(h); free(act);
    free(actf); free(actq); free(order); free(start); free(outf);
    return st;
}
