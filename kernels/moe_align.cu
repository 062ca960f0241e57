// moe_align.cu - token -> expert grouping (moe_align style) and the fused small-M route+group
// kernel. Output arrays as documented in kernels/moe_gemm.h.
//
// The grouping runs in ONE thread block: per-expert counts with shared-memory atomics (plain: with
// random routing a warp's ids rarely collide; warp aggregation by __match_any_sync measured twice as
// slow on the H200), a prefix sum of the counts padded to block_m, block -> expert table, sentinel
// fill, then a scatter of the pair indices. A single block needs no inter-block synchronization
// (graph-capturable, no host round trip) and the grid never depends on data: num_blocks stays on
// the device. Measured alone on the H200 (cold L2, incl. ~3.6 us of launch): 7 us for 8 pairs,
// 15 us for 8K, 46 us for 32K (DeepSeek-V3, M = 4096) -- a multi-block count/scan/scatter is the
// next step if large batches matter.
#include "moe_route.cuh"
#include "pdl.cuh"

namespace {

constexpr int kGroupThreads = 1024;
constexpr int kFusedThreads = 256;     // 8 warps route, then all group
constexpr int64_t kFusedMaxTokens = 8;

// Groups P pairs by expert. smem_int: 2*E + 33 ints. Must be called by the whole block.
__device__ void group_pairs(const int32_t *ids, int64_t P64, int E, int bm, int32_t *sorted_ids,
                            int32_t *block_expert, int32_t *num_blocks, int max_blocks, int *sm) {
    const int P = (int)P64;
    int *cnt = sm;            // [E] counts, then cursors
    int *off = sm + E;        // [E] start of each expert's run
    int *wsum = sm + 2 * E;   // [33] scan scratch
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;

    for (int e = tid; e < E; e += nt) cnt[e] = 0;
    __syncthreads();
    // kU independent loads in flight per thread: one block walks all P pairs, so the loop is bound
    // by load latency, not bandwidth.
    constexpr int kU = 8;
    for (int p0 = 0; p0 < P; p0 += nt * kU) {
        int ev[kU];
#pragma unroll
        for (int u = 0; u < kU; u++) {
            const int p = p0 + u * nt + tid;
            ev[u] = p < P ? ids[p] : -1;
        }
#pragma unroll
        for (int u = 0; u < kU; u++)
            if (ev[u] >= 0 && ev[u] < E) atomicAdd(&cnt[ev[u]], 1);
    }
    __syncthreads();

    // Exclusive scan of padded counts by warp 0: each lane sums a contiguous chunk of experts.
    if (warp == 0) {
        const int chunk = (E + 31) / 32;
        const int lo = lane * chunk, hi = min(E, lo + chunk);
        int s = 0;
        for (int e = lo; e < hi; e++) s += (cnt[e] + bm - 1) / bm * bm;
        int incl = s;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            int o = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += o;
        }
        int run = incl - s;
        for (int e = lo; e < hi; e++) {
            off[e] = run;
            run += (cnt[e] + bm - 1) / bm * bm;
        }
        if (lane == 31) wsum[0] = incl;  // total padded rows
    }
    __syncthreads();
    const int total = wsum[0];
    const int nb = total / bm;

    // Block -> expert table (each expert writes its own blocks; the rest -1) and sentinel fill.
    for (int e = tid; e < E; e += nt) {
        const int b0 = off[e] / bm, b1 = b0 + (cnt[e] + bm - 1) / bm;
        for (int b = b0; b < b1; b++) block_expert[b] = e;
    }
    for (int b = nb + tid; b < max_blocks; b += nt) block_expert[b] = -1;
    for (int i = tid; i < total; i += nt) sorted_ids[i] = P;
    if (tid == 0) *num_blocks = nb;
    __syncthreads();  // orders the sentinel stores before the scatter's stores (same block)

    for (int e = tid; e < E; e += nt) cnt[e] = off[e];
    __syncthreads();
    for (int p0 = 0; p0 < P; p0 += nt * kU) {
        int ev[kU];
#pragma unroll
        for (int u = 0; u < kU; u++) {
            const int p = p0 + u * nt + tid;
            ev[u] = p < P ? ids[p] : -1;
        }
#pragma unroll
        for (int u = 0; u < kU; u++) {
            const int e = ev[u];
            if (e >= 0 && e < E) sorted_ids[atomicAdd(&cnt[e], 1)] = p0 + u * nt + tid;
        }
    }
}

__global__ void __launch_bounds__(kGroupThreads)
group_kernel(const int32_t *ids, int64_t P, int E, int bm, int32_t *sorted_ids,
             int32_t *block_expert, int32_t *num_blocks, int max_blocks) {
    extern __shared__ int sm[];
    nvfp4moe_pdl::trigger();  // a kernel launched with PDL after this one may start (it waits for our writes)
    group_pairs(ids, P, E, bm, sorted_ids, block_expert, num_blocks, max_blocks, sm);
}

// Small M: route (one warp per token) and group in one launch.
template <int VPL>
__global__ void __launch_bounds__(kFusedThreads)
route_group_kernel(nvfp4moe_gpu_route_params rp, const void *logits, int64_t M, int32_t *ids,
                   float *weights, int bm, int32_t *sorted_ids, int32_t *block_expert,
                   int32_t *num_blocks, int max_blocks, int route_warps) {
    extern __shared__ int sm[];
    nvfp4moe_pdl::trigger();  // as in group_kernel
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // the routing scratch (doubles) starts 8-byte aligned after the grouping ints
    const int ints = (2 * rp.num_experts + 33 + 1) & ~1;
    double *sel = (double *)(sm + ints) + (size_t)warp * rp.num_experts;
    // The routed ids stay in shared memory for the grouping (no global round trip on the critical
    // path); their global copies are written alongside. M <= route_warps <= 8 and top_k <= 32.
    __shared__ int32_t ids_s[8 * NVFP4MOE_GPU_MAX_TOPK];
    __shared__ float w_s[8 * NVFP4MOE_GPU_MAX_TOPK];
    if (warp < route_warps)
        for (int64_t t = warp; t < M; t += route_warps)
            nvfp4moe_rt::route_token<VPL>(rp, logits, t, sel, ids_s, w_s, lane);
    __syncthreads();
    const int P = (int)M * rp.top_k;
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        ids[p] = ids_s[p];
        weights[p] = w_s[p];
    }
    group_pairs(ids_s, P, rp.num_experts, bm, sorted_ids, block_expert, num_blocks, max_blocks, sm);
}

}  // namespace

extern "C" cudaError_t nvfp4moe_gpu_route_and_group(const nvfp4moe_gpu_route_params *rp,
                                                    const void *logits, int32_t *ids,
                                                    float *weights, int64_t M, int32_t top_k,
                                                    int32_t E, int32_t block_m, int32_t *sorted_ids,
                                                    int32_t *block_expert, int32_t *num_blocks,
                                                    int32_t max_blocks, cudaStream_t stream) {
    if (E <= 0 || E > NVFP4MOE_GPU_MAX_EXPERTS || block_m <= 0 || top_k <= 0) return cudaErrorInvalidValue;
    const size_t group_smem = (size_t)((2 * E + 33 + 1) & ~1) * sizeof(int);
    if (rp && M <= kFusedMaxTokens) {
        // as many routing warps as fit next to the grouping arrays in 48 KB
        int route_warps = (int)((48 * 1024 - group_smem) / ((size_t)E * sizeof(double)));
        if (route_warps > kFusedThreads / 32) route_warps = kFusedThreads / 32;
        if (route_warps > 8) route_warps = 8;
        if (route_warps >= 1 && M <= route_warps) {  // one round: every token has its own warp
            const size_t smem = group_smem + (size_t)route_warps * E * sizeof(double);
#define NVFP4MOE_LAUNCH_FUSED(V)                                                                   \
    route_group_kernel<V><<<1, kFusedThreads, smem, stream>>>(*rp, logits, M, ids, weights, block_m,   \
                                                              sorted_ids, block_expert, num_blocks,    \
                                                              max_blocks, route_warps)
            switch (nvfp4moe_rt::vpl_for(E)) {
            case 2: NVFP4MOE_LAUNCH_FUSED(2); break;
            case 4: NVFP4MOE_LAUNCH_FUSED(4); break;
            case 8: NVFP4MOE_LAUNCH_FUSED(8); break;
            case 16: NVFP4MOE_LAUNCH_FUSED(16); break;
            default: NVFP4MOE_LAUNCH_FUSED(32); break;
            }
#undef NVFP4MOE_LAUNCH_FUSED
            return cudaGetLastError();
        }
    }
    if (rp) {
        cudaError_t err = nvfp4moe_gpu_route_grid(rp, logits, M, ids, weights, stream);
        if (err != cudaSuccess) return err;
    }
    group_kernel<<<1, kGroupThreads, group_smem, stream>>>(ids, M * top_k, E, block_m, sorted_ids,
                                                          block_expert, num_blocks, max_blocks);
    return cudaGetLastError();
}
