/*
 * activation.c - the reference activations (vLLM fused_moe/activation.py), in float64.
 *
 * Gated activations read a row of N1 = 2*I values: gate = first half, up = second half, except
 * swigluoai (gpt-oss), whose rows interleave them: g0, u0, g1, u1, ... Clamp rules are vLLM's:
 * the gate is clamped from above only, the up half on both sides.
 */
#include "reference/reference.h"

#include <math.h>

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu(double x) { return x * sigmoid(x); }
static double gelu(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double gelu_tanh(double x) {
    const double k = 0.7978845608028654; /* sqrt(2/pi) */
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}
static double relu2(double x) { return x > 0 ? x * x : 0.0; }
static double upper(double x, double lim) { return x > lim ? lim : x; }
static double clampd(double x, double lim) { return x > lim ? lim : x < -lim ? -lim : x; }

void nvfp4moe_activation_ref(const nvfp4moe_config *cfg, const double *in, double *out) {
    nvfp4moe_activation_ref_range(cfg, in, 0, cfg->intermediate_size, out);
}

void nvfp4moe_activation_ref_range(const nvfp4moe_config *cfg, const double *in, int64_t lo, int64_t hi, double *out) {
    const int64_t I = cfg->intermediate_size;
    const nvfp4moe_act_params p = nvfp4moe_config_act_params(cfg);
    /* Output i reads its own gate and up values only: in[i] and in[I + i], or in[2i] and
     * in[2i + 1] when interleaved (a caller may own just those). */
    const bool interleaved = cfg->activation == NVFP4MOE_ACT_SWIGLUOAI;
    const double *g = in, *u = in + I;
    for (int64_t i = lo; i < hi; i++) {
        double gi = interleaved ? 0.0 : g[i];
        double ui = !interleaved && nvfp4moe_activation_is_gated(cfg->activation) ? u[i] : 0.0;
        switch (cfg->activation) {
        case NVFP4MOE_ACT_SILU:
            if (p.has_limit) {
                gi = upper(gi, p.limit);
                ui = clampd(ui, p.limit);
            }
            out[i] = silu(gi) * ui;
            break;
        case NVFP4MOE_ACT_GELU:      out[i] = gelu(gi) * ui; break;
        case NVFP4MOE_ACT_GELU_TANH: out[i] = gelu_tanh(gi) * ui; break;
        case NVFP4MOE_ACT_RELU2:     out[i] = relu2(gi) * ui; break;
        case NVFP4MOE_ACT_SWIGLUOAI:
            gi = upper(in[2 * i], p.limit);
            ui = clampd(in[2 * i + 1], p.limit);
            out[i] = (ui + p.beta) * gi * sigmoid(p.alpha * gi);
            break;
        case NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE:
            gi = upper(gi, p.limit);
            ui = clampd(ui, p.limit);
            out[i] = gi * sigmoid(p.alpha * gi) * (ui + p.beta);
            break;
        case NVFP4MOE_ACT_SWIGLUSTEP:
            out[i] = upper(silu(gi), p.limit) * clampd(ui, p.limit);
            break;
        case NVFP4MOE_ACT_SITU: {
            double b = p.situ_beta, bl = p.situ_linear_beta;
            double up = bl > 0 ? bl * tanh(ui / bl) : ui;
            out[i] = b * tanh(gi / b) * sigmoid(gi) * up;
            break;
        }
        case NVFP4MOE_ACT_SILU_NO_MUL:      out[i] = silu(gi); break;
        case NVFP4MOE_ACT_GELU_NO_MUL:      out[i] = gelu(gi); break;
        case NVFP4MOE_ACT_GELU_TANH_NO_MUL: out[i] = gelu_tanh(gi); break;
        case NVFP4MOE_ACT_RELU2_NO_MUL:     out[i] = relu2(gi); break;
        case NVFP4MOE_ACT_COUNT:            out[i] = NAN; break;
        }
    }
}
