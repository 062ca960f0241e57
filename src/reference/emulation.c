/*
 * emulation.c - vLLM's EMULATION path on the host: what Nvfp4QuantizationEmulationTritonExperts
 * computes, step by step, with vLLM's rounding points. The GPU EMULATION backend
 * (kernels/emulation.cu) computes the same; the tests pin this file against an independent numpy
 * transcription of vLLM's code (tests/vllm_emulation.py).
 *
 * Read from vLLM (vllm/model_executor/layers/...):
 *   fused_moe/experts/nvfp4_emulation_moe.py    the path: QDQ(a1), fused dequant+GEMM1, activation,
 *                                               QDQ(a2), fused dequant+GEMM2 x top-k weight, moe_sum
 *   quantization/utils/nvfp4_emulation_utils.py _nvfp4_quant_dequant_kernel (the QDQ on CUDA),
 *                                               _e2m1_inline
 *   fused_moe/oracle/nvfp4.py                   a1_gscale = 1 / max(w13_input_scale), g1_alphas =
 *                                               w13_scale_2 (likewise for GEMM2)
 *   fused_moe/activation.py, fused_moe/utils.py apply_moe_activation, swiglu_limit_func
 *   csrc/activation_kernels.cu                  silu/gelu/gelu_tanh_and_mul, silu_and_mul_clamp,
 *                                               swigluoai_and_mul, situ_and_mul
 *   model_executor/layers/activation.py         swiglustep_and_mul_triton
 *   csrc/moe/moe_align_sum_kernels.cu           moe_sum
 *   fused_moe/prepare_finalize (no_dp_ep.py)    a1 * topk_weights.to(a1.dtype)
 *
 * Per (token, slot) pair of expert e, T the activation dtype (bf16 or fp16):
 *   x     = T(hidden * T(w))  when the router weight goes on the input, else hidden
 *   a1    = T(QDQ_triton(x, a1_gs))                      one row, blocks of 16
 *   W13   = T(e2m1 * (e4m3 * s))                          float32 products, then T; s the row's
 *                                                         half's scale (gate: w13_scale_2[e], up:
 *                                                         w13_up_scale_2[e]; vLLM keeps one)
 *   h     = T(sum_k a1[k] * W13[n, k])                    float32 accumulation, k in order
 *   act   = vLLM's activation kernel on h, its own T roundings
 *   a2    = T(QDQ_triton(act, a2_gs))
 *   y     = T(sum_i a2[i] * W2[n, i] * w)                 float32, times the top-k weight, then T
 *   out   = moe_sum over the slots: top_k 2..4 add in T one slot at a time (vLLM's moe_sum_kernel
 *           accumulates in scalar_t), any other top_k sums in float32 and rounds once (at::sum_out)
 * Transcendental functions are float64 rounded to float32 (CUDA's expf/erff/tanhf are within 2
 * ulp of that; Triton's tl.exp and its division are approximate); divisions are IEEE (Triton's
 * '/' is div.full.f32). Biases, which vLLM's EMULATION rejects, are added in float32 before the
 * top-k weight.
 *
 * nvfp4moe_emulation_forward_host_rcp divides the two QDQs as the GPU does instead (format.h,
 * nvfp4moe_qdq_row_triton), given the GPU's reciprocals of a1_gs and a2_gs: the step s / gs lands
 * e2m1 * step on bf16/fp16 rounding ties for some global scales, and there one ulp of the step
 * moves the value one step of T. The activations' Triton divisions (swiglustep's sigmoid) are not
 * modelled: Triton's exp differs from the host's anyway.
 */
#include "format/format.h"
#include "reference/reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

nvfp4moe_act_params nvfp4moe_emulation_act_params(const nvfp4moe_config *cfg) {
    nvfp4moe_act_params p = nvfp4moe_config_act_params(cfg);
    if (cfg->activation == NVFP4MOE_ACT_SWIGLUOAI) {
        /* apply_moe_activation calls swigluoai_and_mul(output, input): the op's defaults
         * alpha=1.702, limit=7.0, and the kernel's fixed (up + 1) */
        p.has_limit = true;
        p.limit = 7.0f;
        p.alpha = 1.702f;
        p.beta = 1.0f;
    } else if (cfg->activation == NVFP4MOE_ACT_SWIGLUSTEP) {
        /* swiglustep_and_mul_triton(output, input): limit=7.0 */
        p.has_limit = true;
        p.limit = 7.0f;
    }
    return p;
}

// ---- the activation kernels, element by element ----

/* float64 transcendental functions rounded to float32 */
static float exp_f(float x) { return (float)exp((double)x); }
static float erf_f(float x) { return (float)erf((double)x); }
static float tanh_f(float x) { return (float)tanh((double)x); }
static float fma_f(float a, float b, float c) { return fmaf(a, b, c); }

/* vllm::silu_kernel with alpha: x / (1 + exp(-x * alpha)) */
static float silu_a(float x, float alpha) { return x / (1.0f + exp_f(-x * alpha)); }
/* vllm::gelu_kernel / torch's GELU (erf): x * 0.5 * (1 + erf(x * M_SQRT1_2)) */
static float gelu_erf(float x) { return x * 0.5f * (1.0f + erf_f(x * (float)M_SQRT1_2)); }
/* vllm::gelu_tanh_kernel / torch's GELU (tanh). nvcc contracts x + KAPPA * x^3 into one fma. */
static float gelu_tanh_f(float x) {
    const float beta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = (float)0.044715;
    const float x_cube = x * x * x;
    const float inner = beta * fma_f(kappa, x_cube, x);
    return 0.5f * x * (1.0f + tanh_f(inner));
}

void nvfp4moe_emulation_activation(const nvfp4moe_config *cfg, const nvfp4moe_act_params *p, nvfp4moe_dtype dt,
                                   const float *in, float *out) {
    const int32_t I = cfg->intermediate_size;
#define T(x) nvfp4moe_round_to_dtype(dt, (x))
    for (int32_t i = 0; i < I; i++) {
        float g = in[i], u = nvfp4moe_activation_is_gated(cfg->activation) ? in[I + i] : 0.0f;
        switch (cfg->activation) {
        case NVFP4MOE_ACT_SILU:
        case NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE:
            /* act_and_mul_kernel, packed path: the clamped gate goes back to T, the clamped up
             * stays float; ACT_FN's result is T; (float)act * (up + beta) is rounded to T */
            if (p->has_limit) {
                g = T(fminf(g, p->limit));
                u = fmaxf(fminf(u, p->limit), -p->limit);
            }
            out[i] = T(T(silu_a(g, p->alpha)) * (u + p->beta));
            break;
        case NVFP4MOE_ACT_GELU:      out[i] = T(T(gelu_erf(g)) * (u + 0.0f)); break;
        case NVFP4MOE_ACT_GELU_TANH: out[i] = T(T(gelu_tanh_f(g)) * (u + 0.0f)); break;
        case NVFP4MOE_ACT_SWIGLUOAI: {
            /* interleaved g0, u0, g1, u1, ...; one rounding at the end */
            const float gi = fminf(in[2 * i], p->limit);
            const float ui = fmaxf(fminf(in[2 * i + 1], p->limit), -p->limit);
            out[i] = T((ui + 1.0f) * gi / (1.0f + exp_f(-gi * p->alpha)));
            break;
        }
        case NVFP4MOE_ACT_SWIGLUSTEP: {
            /* Triton: tl.sigmoid(gate) * gate, min with the limit; up clamped; product to T */
            const float gs = 1.0f / (1.0f + exp_f(-g)) * g;
            out[i] = T(fminf(gs, p->limit) * fminf(fmaxf(u, -p->limit), p->limit));
            break;
        }
        case NVFP4MOE_ACT_SITU: {
            /* vllm::situ_activation: beta * tanh(g / beta) * sigmoid(g) * (linear_beta * tanh(u /
             * linear_beta), or u when linear_beta <= 0), reciprocals taken once */
            const float b = p->situ_beta, lb = p->situ_linear_beta;
            const float gate_out = b * tanh_f(g * (1.0f / b)) / (1.0f + exp_f(-g));
            const float up_out = lb > 0.0f ? lb * tanh_f(u * (1.0f / lb)) : u;
            out[i] = T(gate_out * up_out);
            break;
        }
        case NVFP4MOE_ACT_SILU_NO_MUL:      out[i] = T(silu_a(g, 1.0f)); break;   /* F.silu */
        case NVFP4MOE_ACT_GELU_NO_MUL:      out[i] = T(gelu_erf(g)); break;       /* F.gelu */
        case NVFP4MOE_ACT_GELU_TANH_NO_MUL: out[i] = T(gelu_tanh_f(g)); break;    /* F.gelu(tanh) */
        case NVFP4MOE_ACT_RELU2_NO_MUL: {   /* F.relu in place, then torch.square */
            const float r = g > 0.0f ? g : isnan(g) ? g : 0.0f;
            out[i] = T(r * r);
            break;
        }
        /* relu2 (gated) is not one of apply_moe_activation's: the oracle rejects it for EMULATION */
        case NVFP4MOE_ACT_RELU2:
        case NVFP4MOE_ACT_COUNT: out[i] = NAN; break;
        }
    }
#undef T
}

void nvfp4moe_emulation_dequant(const uint8_t *q, const uint8_t *sf, int64_t rows, int64_t cols, float scale_2,
                                nvfp4moe_dtype dt, float *out) {
    /* _e2m1_inline(nibble) * (fp8 scale as float32 * w_global_scale), then .to(compute_type) */
    float bs[256];
    for (int i = 0; i < 256; i++) bs[i] = nvfp4moe_e4m3_decode((uint8_t)i) * scale_2;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const uint8_t byte = q[r * (cols / 2) + c / 2];
            const float s = bs[sf[r * (cols / 16) + c / 16]];
            out[r * cols + c] = nvfp4moe_round_to_dtype(dt, nvfp4moe_e2m1_decode((c & 1) ? byte >> 4 : byte) * s);
        }
}

void nvfp4moe_emulation_moe_sum(const float *y, int64_t M, int64_t K, int64_t H, nvfp4moe_dtype dt, float *out) {
    /* moe_sum_kernel<scalar_t, TOPK> for top_k 2..4 (scalar_t x += ...), at::sum_out otherwise */
    const bool in_dt = K >= 2 && K <= 4;
    for (int64_t t = 0; t < M; t++)
        for (int64_t n = 0; n < H; n++) {
            float s = 0.0f;
            for (int64_t j = 0; j < K; j++) {
                s += y[(t * K + j) * H + n];
                if (in_dt) s = nvfp4moe_round_to_dtype(dt, s);
            }
            out[t * H + n] = nvfp4moe_round_to_dtype(dt, s);
        }
}

/* One GEMM output: float32 accumulation of exact products, k in order (tl.dot accumulates in
 * float32; its order is the hardware's). */
static float dot_f32(const float *a, const float *w, int64_t K) {
    float acc = 0.0f;
    for (int64_t k = 0; k < K; k++) acc += a[k] * w[k];
    return acc;
}

nvfp4moe_status nvfp4moe_emulation_forward_host(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                                const nvfp4moe_io *io) {
    return nvfp4moe_emulation_forward_host_rcp(cfg, w, io, NULL);
}

nvfp4moe_status nvfp4moe_emulation_forward_host_rcp(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                                    const nvfp4moe_io *io, const float rcp_gs[2]) {
    NVFP4MOE_TRY(nvfp4moe_config_validate(cfg));
    NVFP4MOE_RETURN_IF(cfg->scheme != NVFP4MOE_SCHEME_W4A4, NVFP4MOE_ERR_UNSUPPORTED,
                       "EMULATION: scheme=%s is not supported: EMULATION runs W4A4 only",
                       nvfp4moe_scheme_name(cfg->scheme));
    NVFP4MOE_RETURN_IF(cfg->in_dtype == NVFP4MOE_DTYPE_F32, NVFP4MOE_ERR_UNSUPPORTED,
                       "EMULATION: in_dtype=f32 is not supported: bf16 or fp16 hidden states");
    NVFP4MOE_TRY(nvfp4moe_weights_validate(cfg, w));
    NVFP4MOE_TRY(nvfp4moe_check_io(cfg, io));
    const int64_t M = io->num_tokens;
    if (M == 0) return NVFP4MOE_OK;
    const int64_t E = cfg->num_experts, K = cfg->top_k, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg), P = M * K;
    const nvfp4moe_dtype dt = cfg->in_dtype;
    const bool on_input = cfg->apply_router_weight_on_input;
    const nvfp4moe_act_params ap = nvfp4moe_emulation_act_params(cfg);

    int32_t *ids = malloc(sizeof(int32_t) * (size_t)P);
    float *wts = malloc(sizeof(float) * (size_t)P);
    float *x = malloc(sizeof(float) * (size_t)(M * H));
    float *w13 = malloc(sizeof(float) * (size_t)(N1 * H)), *w2 = malloc(sizeof(float) * (size_t)(H * I));
    float *h = malloc(sizeof(float) * (size_t)N1), *act = malloc(sizeof(float) * (size_t)I);
    float *y = malloc(sizeof(float) * (size_t)(P * H)), *outf = malloc(sizeof(float) * (size_t)(M * H));
    int64_t *order = malloc(sizeof(int64_t) * (size_t)P), *start = calloc((size_t)(E + 1), sizeof(int64_t));
    nvfp4moe_status st = NVFP4MOE_OK;
    if (!ids || !wts || !x || !w13 || !w2 || !h || !act || !y || !outf || !order || !start) {
        st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "EMULATION (host): out of memory (M=%lld)", (long long)M);
        goto done;
    }
    if ((st = nvfp4moe_routing_for_io(cfg, w, io, ids, wts)) != NVFP4MOE_OK) goto done;
    if ((st = nvfp4moe_group_by_expert(ids, P, E, start, order)) != NVFP4MOE_OK) goto done;

    float a1_gs = 1.0f, a2_gs = 1.0f;
    nvfp4moe_w4a4_global_scales(cfg, w, &a1_gs, &a2_gs);
    nvfp4moe_to_float(dt, io->hidden, M * H, x);
    if (on_input) /* top_k == 1 */
        for (int64_t i = 0; i < M * H; i++)
            x[i] = nvfp4moe_round_to_dtype(dt, x[i] * nvfp4moe_round_to_dtype(dt, wts[i / H]));
    for (int64_t t = 0; t < M; t++)
        nvfp4moe_qdq_row_triton(x + t * H, H, a1_gs, rcp_gs ? &rcp_gs[0] : NULL, dt, x + t * H);

    for (int64_t e = 0; e < E; e++) {
        if (start[e] == start[e + 1]) continue;
        /* GEMM1's rows with their half's global scale (gate, up): one row at a time */
        for (int64_t n = 0; n < N1; n++)
            nvfp4moe_emulation_dequant(w->w13 + (e * N1 + n) * H / 2, w->w13_scale + (e * N1 + n) * H / 16, 1, H,
                                       nvfp4moe_w13_half_scale_2(w, e, nvfp4moe_w13_row_half(cfg, n)), dt,
                                       w13 + n * H);
        nvfp4moe_emulation_dequant(w->w2 + e * H * I / 2, w->w2_scale + e * H * I / 16, H, I, w->w2_scale_2[e],
                                   dt, w2);
        for (int64_t q = start[e]; q < start[e + 1]; q++) {
            const int64_t p = order[q], t = p / K;
            for (int64_t n = 0; n < N1; n++) {
                float v = dot_f32(x + t * H, w13 + n * H, H);
                if (cfg->has_bias) v += w->w13_bias[e * N1 + n];
                h[n] = nvfp4moe_round_to_dtype(dt, v);
            }
            nvfp4moe_emulation_activation(cfg, &ap, dt, h, act);
            nvfp4moe_qdq_row_triton(act, I, a2_gs, rcp_gs ? &rcp_gs[1] : NULL, dt, act);
            for (int64_t n = 0; n < H; n++) {
                float v = dot_f32(act, w2 + n * I, I);
                if (cfg->has_bias) v += w->w2_bias[e * H + n];
                if (!on_input) v *= wts[p];
                y[p * H + n] = nvfp4moe_round_to_dtype(dt, v);
            }
        }
    }
    nvfp4moe_emulation_moe_sum(y, M, K, H, dt, outf);
    nvfp4moe_from_float(cfg->out_dtype, outf, M * H, io->output);

done:
    free(ids); free(wts); free(x); free(w13); free(w2); free(h); free(act); free(y); free(outf);
    free(order); free(start);
    return st;
}
