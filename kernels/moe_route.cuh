// moe_route.cuh - the per-token router as a warp-level device function, shared by the routing grid
// kernel (moe_route.cu) and the fused single-block route+group kernel (moe_align.cu).
//
// One warp routes one token. The token's selection scores live in a per-warp shared array of E
// doubles; top-k is k rounds of a warp arg-max whose order is (score descending, index ascending),
// the reference's tie rule. A selected score is overwritten with NaN, which never wins a compare.
#ifndef NVFP4MOE_MOE_ROUTE_CUH
#define NVFP4MOE_MOE_ROUTE_CUH

#include "nvfp4moe.h"
#include "pipeline.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

namespace nvfp4moe_rt {

__device__ __forceinline__ float load_logit(const void *p, int dtype, int64_t i) {
    if (dtype == NVFP4MOE_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dtype == NVFP4MOE_DTYPE_FP16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

// The float64 exponential and sigmoid, one copy each (not inlined): the routing runs once per
// token, usually with a cold instruction cache, where the size of the code it runs through is
// its cost (inlined at every call site, they made the routing kernels 70-190 KB of code).
static __device__ __noinline__ double exp_d(double x) { return exp(x); }
static __device__ __noinline__ double sigmoid_d(double x) { return 1.0 / (1.0 + exp_d(-x)); }

// True when (v, i) ranks before (bv, bi): larger value first, then the lower index. bi < 0 means
// "nothing yet", which anything but NaN beats (NaN marks a taken or absent entry).
__device__ __forceinline__ bool ranks_before(double v, int i, double bv, int bi) {
    if (bi < 0) return !isnan(v);
    return v > bv || (v == bv && i < bi);
}

// Order-preserving 64-bit key of a double: a > b  <=>  okey(a) > okey(b) (0 is below every number).
__device__ __forceinline__ unsigned long long okey(double v) {
    const unsigned long long b = (unsigned long long)__double_as_longlong(v);
    return (b >> 63) ? ~b : (b | 0x8000000000000000ull);
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// splitmix64, the library's generator (src/core/util.c), so "simulated" matches the CPU bit for bit.
__device__ __forceinline__ uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Routes token t exactly as src/reference/route.c does (selection and weights in float64, the same
// comparisons): the top-k ids are bit-identical on tie-free data and follow the same tie rule.
// VPL: experts per lane held in registers (E <= 32 * VPL); the launchers pick the smallest that
// fits, which keeps the unrolled loops (and the code a cold instruction cache must fetch) short.
// Three steps, so a caller that needs the ids before the weights (GEMM1 routing itself) can put
// the weights off the critical path: lane_logits, route_select (ids), route_weigh (weights);
// route_token runs all three.

// The lane's logits (lg) and, where the method's selection score adds one, correction biases (cb)
// of experts lane, lane + 32, ...: all loaded before any is used (with each load behind the
// previous expert's sigmoid call, a cold logit row was one DRAM round trip after another).
template <int VPL>
static __device__ __forceinline__ void lane_logits(const nvfp4moe_gpu_route_params &rp, const void *logits,
                                                   int64_t t, float (&lg)[VPL], float (&cb)[VPL], int lane) {
    const int E = rp.num_experts, m = rp.method;
    const int64_t row = t * (int64_t)E;
    const bool biased = (m == NVFP4MOE_ROUTING_DEEPSEEK_V3 || m == NVFP4MOE_ROUTING_MINIMAX2) &&
                        rp.correction_bias != nullptr;
    const bool any = m != NVFP4MOE_ROUTING_SIMULATED;
#pragma unroll
    for (int i = 0; i < VPL; i++) {
        const int e = lane + 32 * i;
        lg[i] = any && e < E ? load_logit(logits, rp.logits_dtype, row + e) : 0.0f;
        cb[i] = biased && e < E ? rp.correction_bias[e] : 0.0f;
    }
}

// Token t's top-k from its lane_logits: writes ids[t*k, t*k+k) and returns lane j's selected
// expert (j < k; -1 for the other lanes, and for "simulated"). sel: this warp's shared scratch of
// E doubles.
template <int VPL>
static __device__ __forceinline__ int route_select(const nvfp4moe_gpu_route_params &rp, int64_t t,
                                                   const float (&lg)[VPL], const float (&cb)[VPL], double *sel,
                                                   int32_t *ids, int lane) {
    const int E = rp.num_experts, k = rp.top_k;
    const int m = rp.method;

    if (m == NVFP4MOE_ROUTING_SIMULATED) {
        // k distinct experts drawn uniformly (redrawing repeats); lane 0 draws.
        if (lane == 0) {
            uint64_t st = (rp.seed ^ 0x5151F00Dull) ^ ((uint64_t)t * 0x9E3779B97F4A7C15ull);
            int32_t chosen[NVFP4MOE_GPU_MAX_TOPK];
            for (int j = 0; j < k; j++) {
                int32_t e;
                bool dup;
                do {
                    e = (int32_t)(splitmix64(&st) % (uint64_t)E);
                    dup = false;
                    for (int q = 0; q < j; q++) dup |= chosen[q] == e;
                } while (dup);
                chosen[j] = e;
                ids[t * k + j] = e;
            }
        }
        return -1;
    }

    // Selection scores, as order-preserving keys held in registers (lane l owns experts l, l+32,
    // ...). Where the score is a monotonic function of the logit (softmax, sigmoid, and the
    // bias-free grouped methods) the logit itself is compared, as the reference does.
    const bool biased = (m == NVFP4MOE_ROUTING_DEEPSEEK_V3 || m == NVFP4MOE_ROUTING_MINIMAX2) &&
                        rp.correction_bias != nullptr;
    unsigned long long key[VPL];
#pragma unroll
    for (int i = 0; i < VPL; i++) {
        const int e = lane + 32 * i;
        key[i] = 0;
        if (e < E) {
            const double l = (double)lg[i];
            const double v = biased ? sigmoid_d(l) + (double)cb[i] : l;
            key[i] = okey(v);
            if (m == NVFP4MOE_ROUTING_DEEPSEEK_V3 && rp.n_group > 1) sel[e] = v;
        }
    }

    // DeepSeek-V3 group limiting: a group scores the sum of its top-2 biased scores (with a
    // correction bias) or its max; keep topk_group groups (ties to the lower group); the experts
    // of the other groups drop to -inf.
    if (m == NVFP4MOE_ROUTING_DEEPSEEK_V3 && rp.n_group > 1) {
        __syncwarp();
        const int G = rp.n_group, per = E / G;
        double gv = -INFINITY;
        if (lane < G) {
            double a = -INFINITY, b = -INFINITY;
            for (int i = 0; i < per; i++) {
                const double c = sel[lane * per + i];
                if (c > a) { b = a; a = c; } else if (c > b) { b = c; }
            }
            gv = biased && per >= 2 ? a + b : a;
        }
        bool keep = false;
        for (int r = 0; r < rp.topk_group; r++) {
            int bi = lane < G && !isnan(gv) ? lane : -1;
            double bv = bi >= 0 ? gv : -INFINITY;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                const double ov = __shfl_xor_sync(0xffffffffu, bv, off);
                const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
                if (oi >= 0 && ranks_before(ov, oi, bv, bi)) { bv = ov; bi = oi; }
            }
            if (lane == bi) { keep = true; gv = NAN; }
        }
        const unsigned kept = __ballot_sync(0xffffffffu, keep);
        const unsigned long long masked = okey(-INFINITY);
#pragma unroll
        for (int i = 0; i < VPL; i++) {
            const int e = lane + 32 * i;
            if (e < E && !((kept >> (e / per)) & 1u)) key[i] = masked;
        }
        __syncwarp();
    }

    // Top-k: k rounds of a warp arg-max over the lanes' current bests, in the order (key
    // descending, index ascending): max of the high words, then of the low words among the lanes
    // that tie, then the lowest index among those. Only the winner's lane rescans its keys, for its
    // next best below the one just taken. Lane j keeps the j-th selected expert.
    const unsigned kNone = 0xFFFFFFFFu;
    unsigned long long lk = 0;
    unsigned li = kNone;
#pragma unroll
    for (int i = 0; i < VPL; i++) {
        const unsigned e = (unsigned)(lane + 32 * i);
        if ((int)e < E && (li == kNone || key[i] > lk)) { lk = key[i]; li = e; }
    }
    int my_id = -1;
    for (int j = 0; j < k; j++) {
        const unsigned hi = __reduce_max_sync(0xffffffffu, li == kNone ? 0u : (unsigned)(lk >> 32));
        const bool m1 = li != kNone && (unsigned)(lk >> 32) == hi;
        const unsigned lo = __reduce_max_sync(0xffffffffu, m1 ? (unsigned)lk : 0u);
        const bool m2 = m1 && (unsigned)lk == lo;
        const unsigned win = __reduce_min_sync(0xffffffffu, m2 ? li : kNone);
        if (lane == j) my_id = (int)win;
        if (li == win) {
            const unsigned long long tk = lk;
            const unsigned ti = li;
            lk = 0;
            li = kNone;
#pragma unroll
            for (int i = 0; i < VPL; i++) {
                const unsigned e = (unsigned)(lane + 32 * i);
                const unsigned long long kk = key[i];
                const bool below = kk < tk || (kk == tk && e > ti);
                if ((int)e < E && below && (li == kNone || kk > lk)) { lk = kk; li = e; }
            }
        }
    }
    if (my_id >= E) my_id = -1;
    if (lane < k) ids[t * k + lane] = my_id;
    return my_id;
}

// Token t's weights, in float64 as the reference, from its lane_logits and route_select's my_id:
// writes weights[t*k, t*k+k).
template <int VPL>
static __device__ __forceinline__ void route_weigh(const nvfp4moe_gpu_route_params &rp, const void *logits,
                                                   int64_t t, const float (&lg)[VPL], int my_id, float *weights,
                                                   int lane) {
    const int E = rp.num_experts, k = rp.top_k;
    const int64_t row = t * (int64_t)E;
    const int m = rp.method;
    if (m == NVFP4MOE_ROUTING_SIMULATED) {  // weight 1/k
        if (lane < k) weights[t * k + lane] = (float)(1.0 / k);
        return;
    }
    const bool mine = lane < k && my_id >= 0;
    const double l = mine ? (double)load_logit(logits, rp.logits_dtype, row + my_id) : 0.0;
    const double top = __shfl_sync(0xffffffffu, l, 0);  // the first selected has the largest logit
    double w = 0.0;
    switch (m) {
    case NVFP4MOE_ROUTING_SOFTMAX_TOPK:
    case NVFP4MOE_ROUTING_RENORMALIZE_NAIVE: {
        double z = 0.0;
#pragma unroll
        for (int i = 0; i < VPL; i++)  // experts lane, lane + 32, ...: the reference's order per lane
            if (lane + 32 * i < E) z += exp_d((double)lg[i] - top);
        z = warp_sum(z);
        w = mine ? exp_d(l - top) / z : 0.0;
        if (m == NVFP4MOE_ROUTING_RENORMALIZE_NAIVE) {
            const double s = warp_sum(w);
            w = s > 0 ? w / s : 0.0;
        }
        break;
    }
    case NVFP4MOE_ROUTING_RENORMALIZE: {
        const double ex = mine ? exp_d(l - top) : 0.0;
        w = ex / warp_sum(ex);
        break;
    }
    case NVFP4MOE_ROUTING_LLAMA4:
    case NVFP4MOE_ROUTING_SIGMOID:
        w = mine ? sigmoid_d(l) : 0.0;
        break;
    case NVFP4MOE_ROUTING_SIGMOID_RENORM:
    case NVFP4MOE_ROUTING_DEEPSEEK_V3:
    case NVFP4MOE_ROUTING_MINIMAX2: {
        const double sc = mine ? sigmoid_d(l) : 0.0;  // the unbiased score is the weight
        const double s = warp_sum(sc);
        w = s > 0 ? sc / s : 0.0;
        if (m != NVFP4MOE_ROUTING_SIGMOID_RENORM) w *= (double)rp.routed_scaling_factor;
        break;
    }
    default:
        break;
    }
    if (lane < k) weights[t * k + lane] = (float)w;
}

// All three steps: writes ids/weights [t*k, t*k+k).
template <int VPL>
static __device__ void route_token(const nvfp4moe_gpu_route_params &rp, const void *logits, int64_t t,
                                   double *sel, int32_t *ids, float *weights, int lane) {
    float lg[VPL], cb[VPL];
    lane_logits<VPL>(rp, logits, t, lg, cb, lane);
    const int my_id = route_select<VPL>(rp, t, lg, cb, sel, ids, lane);
    route_weigh<VPL>(rp, logits, t, lg, my_id, weights, lane);
}

// The smallest VPL for E experts (E <= NVFP4MOE_GPU_MAX_EXPERTS).
inline int vpl_for(int E) { return E <= 64 ? 2 : E <= 128 ? 4 : E <= 256 ? 8 : E <= 512 ? 16 : 32; }

}  // namespace nvfp4moe_rt

// Routing grid: one warp per token, dynamic shared memory of E doubles per warp.
cudaError_t nvfp4moe_gpu_route_grid(const nvfp4moe_gpu_route_params *rp, const void *logits,
                                    int64_t M, int32_t *ids, float *weights, cudaStream_t stream);

#endif  // NVFP4MOE_MOE_ROUTE_CUH
