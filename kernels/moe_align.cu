// moe_align.cu - token -> expert grouping (moe_align style) and the fused small-M route+group
// kernel. Output arrays as documented in kernels/moe_gemm.h.
//
// The grouping runs in ONE thread block: per-expert counts with warp-aggregated shared-memory
// atomics, a prefix sum of the counts padded to block_m, block -> expert table, sentinel fill,
// then a scatter of the pair indices. One block is enough: even M=4096, top-8 is 32K pairs, a few
// microseconds, and a single block needs no inter-block synchronization (graph-capturable, no
// host round trip). The grid never depends on data: num_blocks stays on the device.
#include "moe_route.cuh"

namespace {

constexpr int kGroupThreads = 1024;
constexpr int kFusedThreads = 256;     // 8 warps route, then all group
constexpr int64_t kFusedMaxTokens = 8;

__device__ __forceinline__ unsigned lanemask_lt() {
    unsigned m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

// Adds 1 to counter[e] for each lane with a valid e, aggregated per warp; returns the lane's old
// value (its slot) when want_slot. Every lane of the warp must call it (e < 0: no-op).
__device__ __forceinline__ int warp_aggregated_add(int *counter, int e) {
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int lane = threadIdx.x & 31;
    const int leader = __ffs(peers) - 1;
    int base = 0;
    if (e >= 0 && lane == leader) base = atomicAdd(&counter[e], __popc(peers));
    base = __shfl_sync(0xffffffffu, base, leader);
    return base + __popc(peers & lanemask_lt());
}

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
        for (int u = 0; u < kU; u++) warp_aggregated_add(cnt, ev[u] < E ? ev[u] : -1);
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
            const int e = ev[u] < E ? ev[u] : -1;
            const int pos = warp_aggregated_add(cnt, e);
            if (e >= 0) sorted_ids[pos] = p0 + u * nt + tid;
        }
    }
}

__global__ void __launch_bounds__(kGroupThreads)
group_kernel(const int32_t *ids, int64_t P, int E, int bm, int32_t *sorted_ids,
             int32_t *block_expert, int32_t *num_blocks, int max_blocks) {
    extern __shared__ int sm[];
    group_pairs(ids, P, E, bm, sorted_ids, block_expert, num_blocks, max_blocks, sm);
}

// Small M: route (one warp per token) and group in one launch.
template <int VPL>
__global__ void __launch_bounds__(kFusedThreads)
route_group_kernel(nvfp4moe_gpu_route_params rp, const void *logits, int64_t M, int32_t *ids,
                   float *weights, int bm, int32_t *sorted_ids, int32_t *block_expert,
                   int32_t *num_blocks, int max_blocks, int route_warps) {
    extern __shared__ int sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // the routing scratch (doubles) starts 8-byte aligned after the grouping ints
    const int ints = (2 * rp.num_experts + 33 + 1) & ~1;
    double *sel = (double *)(sm + ints) + (size_t)warp * rp.num_experts;
    if (warp < route_warps)
        for (int64_t t = warp; t < M; t += route_warps)
            nvfp4moe_rt::route_token<VPL>(rp, logits, t, sel, ids, weights, lane);
    __syncthreads();  // the ids written above (global memory) are visible to the whole block
    group_pairs(ids, M * rp.top_k, rp.num_experts, bm, sorted_ids, block_expert, num_blocks,
                max_blocks, sm);
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
