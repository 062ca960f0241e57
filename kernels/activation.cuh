// activation.cuh - the MoE activations on the device (float in, float out), with the clamp rules
// of the float64 reference (src/moe_ref.c): shared by the activation kernel (kernels/moe_pipeline.cu)
// and the fused GEMM1 epilogue of the decode kernel (kernels/hopper_decode.cu); and the walk over
// a row's gate and up halves that the activation kernels of kernels/moe_pipeline.cu and
// kernels/emulation.cu share.
#ifndef NVFP4MOE_ACTIVATION_CUH
#define NVFP4MOE_ACTIVATION_CUH

#include <math.h>

#include "nvfp4moe.h"
#include "nvfp4_dev.cuh"
#include "pipeline.h"

namespace nvfp4moe_dev {

__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}

// silu(g) * u with the optional swiglu_limit clamp: act_gated's NVFP4MOE_ACT_SILU case, alone
// for callers that inline it many times (the Hopper GEMM1 epilogue; kernels/hopper_gemm.cu).
__device__ __forceinline__ float act_silu_gated(const nvfp4moe_gpu_act_params &p, float g, float u) {
    if (p.has_limit) { g = fminf(g, p.limit); u = fminf(fmaxf(u, -p.limit), p.limit); }
    return silu(g) * u;
}

// One output of a gated activation from its gate g and up u (the clamp rules of the reference:
// the gate is clamped from above only, the up half symmetrically).
__device__ __forceinline__ float act_gated(const nvfp4moe_gpu_act_params &p, float g, float u) {
    switch (p.activation) {
    case NVFP4MOE_ACT_SILU: return act_silu_gated(p, g, u);
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

// The activation's outputs i0 .. i0+15 of one row x (16-bit, N1 values: the gate half then the up
// half; interleaved g0, u0, g1, u1, ... for swigluoai; I values for the _no_mul activations) into
// v, each gated(g, u) or plain(x).
template <typename T, typename Gated, typename Plain>
__device__ __forceinline__ void act_row16(const T *x, int I, int i0, int activation, Gated gated, Plain plain,
                                          float *v) {
    if (activation >= NVFP4MOE_ACT_SILU_NO_MUL) {
        float a[16];
        load8<T>(x + i0, a);
        load8<T>(x + i0 + 8, a + 8);
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = plain(a[j]);
    } else if (activation == NVFP4MOE_ACT_SWIGLUOAI) {
        float a[32];
#pragma unroll
        for (int q = 0; q < 4; q++) load8<T>(x + 2 * i0 + 8 * q, a + 8 * q);
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = gated(a[2 * j], a[2 * j + 1]);
    } else {
        float g[16], u[16];
        load8<T>(x + i0, g);
        load8<T>(x + i0 + 8, g + 8);
        load8<T>(x + I + i0, u);
        load8<T>(x + I + i0 + 8, u + 8);
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = gated(g[j], u[j]);
    }
}

}  // namespace nvfp4moe_dev

#endif  // NVFP4MOE_ACTIVATION_CUH
