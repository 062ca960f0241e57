// activation.cuh - the MoE activations on the device (float in, float out), with the clamp rules
// of the float64 reference (src/moe_ref.c): shared by the activation kernel (kernels/moe_pipeline.cu)
// and the fused GEMM1 epilogue of the decode kernel (kernels/hopper_decode.cu).
#ifndef NVFP4MOE_ACTIVATION_CUH
#define NVFP4MOE_ACTIVATION_CUH

#include <math.h>

#include "nvfp4moe.h"
#include "pipeline.h"

namespace nvfp4moe_dev {

__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}

// One output of a gated activation from its gate g and up u (the clamp rules of the reference:
// the gate is clamped from above only, the up half symmetrically).
__device__ __forceinline__ float act_gated(const nvfp4moe_gpu_act_params &p, float g, float u) {
    switch (p.activation) {
    case NVFP4MOE_ACT_SILU:
        if (p.has_limit) { g = fminf(g, p.limit); u = fminf(fmaxf(u, -p.limit), p.limit); }
        return silu(g) * u;
    case NVFP4MOE_ACT_GELU: return gelu(g) * u;
    case NVFP4MOE_ACT_GELU_TANH: return gelu_tanh(g) * u;
    case NVFP4MOE_ACT_RELU2: { float r = fmaxf(g, 0.0f); return r * r * u; }
    case NVFP4MOE_ACT_SWIGLUOAI:
    case NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE:
        if (p.has_limit) { g = fminf(g, p.limit); u = fminf(fmaxf(u, -p.limit), p.limit); }
        return (u + p.beta) * g * sigm(p.alpha * g);
    case NVFP4MOE_ACT_SWIGLUSTEP: {
        const float L = p.has_limit ? p.limit : 7.0f;
        return fminf(silu(g), L) * fminf(fmaxf(u, -L), L);
    }
    case NVFP4MOE_ACT_SITU: {
        const float b = p.situ_beta, lb = p.situ_linear_beta;
        const float up = lb > 0.0f ? lb * tanhf(u / lb) : u;
        return b * tanhf(g / b) * sigm(g) * up;
    }
    default: return NAN;
    }
}

__device__ __forceinline__ float act_plain(int act, float x) {
    switch (act) {
    case NVFP4MOE_ACT_SILU_NO_MUL: return silu(x);
    case NVFP4MOE_ACT_GELU_NO_MUL: return gelu(x);
    case NVFP4MOE_ACT_GELU_TANH_NO_MUL: return gelu_tanh(x);
    case NVFP4MOE_ACT_RELU2_NO_MUL: { float r = fmaxf(x, 0.0f); return r * r; }
    default: return NAN;
    }
}

}  // namespace nvfp4moe_dev

#endif  // NVFP4MOE_ACTIVATION_CUH
