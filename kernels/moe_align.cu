// moe_align.cu - token -> expert grouping (moe_align style) and the fused small-M route+group
// kernel. Output arrays as documented in kernels/moe_gemm.h.
//
// The fused small-M kernel and tiny P (< kMultiMinPairs): ONE thread block groups everything
// (group_pairs): per-expert counts with shared-memory atomics (plain: with random routing a warp's
// ids rarely collide; warp aggregation by __match_any_sync measured twice as slow on the H200), a
// prefix sum of the counts padded to block_m, block -> expert table, sentinel fill, then a scatter
// of the pair indices. A single block needs no inter-block synchronization (graph-capturable, no
// host round trip) and the grid never depends on data: num_blocks stays on the device. Measured
// alone on the H200 (cold L2, incl. ~3.6 us of launch): 7 us for 8 pairs, 15 us for 8K, 46 us for
// 32K (DeepSeek-V3, M = 4096): one SM walks every pair twice.
//
// Otherwise group_multi_kernel: one launch of G blocks, still with no scratch memory, no global
// atomics, no inter-block synchronization beyond a thread block cluster's own barrier, and a grid
// chosen from P on the host. The pairs are cut into G contiguous chunks; block s scatters chunk s.
// Its pairs of expert e go to rows off[e] + before_s[e] + (rank among the chunk's pairs of e),
// where off is the padded exclusive scan of the totals and before_s[e] counts expert e's pairs in
// the chunks ahead of s. Every block needs the totals and its before_s, and no block can hand
// them to another (no scratch, no zeroed counters), so the counting is redundant:
//  - C = 1 (no cluster; every device): each block counts ALL pairs (ids read from L2), binned as
//    before / in / after its own chunk, and computes the same scan as every other block
//    (identical integer arithmetic: identical offsets);
//  - clusters of C blocks (sm_90, large P): the G chunks are dealt to the C blocks of a cluster by
//    column (block c of cluster k counts chunks c, C + c, 2C + c, ..., binned against chunk
//    kC + c, its own), so a block counts P / C pairs instead of P, then reads the other blocks'
//    bins through distributed shared memory after one cluster barrier. Totals: the sum of all
//    the cluster's bins; before: every block's "before" bin plus the "in" bins of the lower
//    ranks, whose chunks kC + c' (c' < c) precede kC + c.
// Each block then scatters only its chunk (its ids kept in shared memory from the count). The
// padding rows (sentinels) and the block -> expert table are disjoint from the scattered rows and
// are split over all blocks; num_blocks is written by block 0. An expert's pairs come chunk by
// chunk (deterministic), within a chunk in the order of the shared-memory atomics (arbitrary, as in
// the single block; no consumer depends on it). Measured figures: at the host's choice below.
#include "moe_route.cuh"
#include "pdl.cuh"

#include <atomic>

#include <cooperative_groups.h>

namespace {

constexpr int kGroupThreads = 1024;
constexpr int kFusedThreads = 256;     // 8 warps route, then all group
constexpr int64_t kFusedMaxTokens = 8;
// Id loads in flight per thread: a block walking pairs is bound by load latency, not bandwidth.
constexpr int kIdsInFlight = 8;

// f(e, p) for every pair p in [lo, hi) whose expert id e is in [0, E), thread tid of nt taking
// pairs lo + tid, lo + tid + nt, ..., kIdsInFlight loads issued before the first call.
template <typename F>
__device__ __forceinline__ void for_each_valid_id(const int32_t *ids, int lo, int hi, int E, int tid, int nt,
                                                  F &&f) {
    for (int p0 = lo; p0 < hi; p0 += nt * kIdsInFlight) {
        int ev[kIdsInFlight];
#pragma unroll
        for (int u = 0; u < kIdsInFlight; u++) {
            const int p = p0 + u * nt + tid;
            ev[u] = p < hi ? ids[p] : -1;
        }
#pragma unroll
        for (int u = 0; u < kIdsInFlight; u++)
            if ((unsigned)ev[u] < (unsigned)E) f(ev[u], p0 + u * nt + tid);
    }
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
    for_each_valid_id(ids, 0, P, E, tid, nt, [&](int e, int) { atomicAdd(&cnt[e], 1); });
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
    for_each_valid_id(ids, 0, P, E, tid, nt, [&](int e, int p) { sorted_ids[atomicAdd(&cnt[e], 1)] = p; });
}

__global__ void __launch_bounds__(kGroupThreads)
group_kernel(const int32_t *ids, int64_t P, int E, int bm, int32_t *sorted_ids,
             int32_t *block_expert, int32_t *num_blocks, int max_blocks, int32_t *zero) {
    extern __shared__ int sm[];
    nvfp4moe_pdl::trigger();  // a kernel launched with PDL after this one may start (it waits for our writes)
    nvfp4moe_pdl::wait();     // launched with PDL behind the routing grid: its ids complete
    if (zero && threadIdx.x == 0) *zero = 0;
    group_pairs(ids, P, E, bm, sorted_ids, block_expert, num_blocks, max_blocks, sm);
}

// ---- larger P: several blocks (see the header) ----

constexpr int kMultiThreads = 512;
constexpr int kMultiWarps = kMultiThreads / 32;
static_assert(NVFP4MOE_GPU_MAX_EXPERTS <= 2 * kMultiThreads, "the scan gives each thread at most 2 experts");

// The expert whose padded run holds row `row` (< the total): the largest e with off[e] <= row
// (empty experts before it share its start, those after it start past its run).
__device__ __forceinline__ int expert_of_row(const int *off, int E, int row) {
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (off[mid] <= row) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Shared memory of group_multi_kernel, in ints: 6 E + kMultiWarps + 1, then the stash of the
// block's own chunk (`chunk` ints) when stash is set.
constexpr size_t multi_smem_ints(int E) { return (size_t)6 * E + kMultiWarps + 1; }

// G = gridDim.x chunks of `chunk` pairs (the last ones may be short or empty; G chunk >= P), C
// blocks per cluster (C = 1: no cluster; G a multiple of C). stash: the block keeps its own
// chunk's ids in shared memory during the count, so the scatter reads no global memory.
template <int C>
__global__ void __launch_bounds__(kMultiThreads)
group_multi_kernel(const int32_t *ids, int P, int E, int bm, int chunk, int32_t *sorted_ids,
                   int32_t *block_expert, int32_t *num_blocks, int max_blocks, int stash, int32_t *zero) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    if (C > 1) __trap();  // no clusters before sm_90: the host never launches this
#endif
    extern __shared__ int sm[];
    nvfp4moe_pdl::trigger();  // as in group_kernel
    nvfp4moe_pdl::wait();
    if (zero && blockIdx.x == 0 && threadIdx.x == 0) *zero = 0;
    int *bin = sm;                     // [3][E] pairs counted here: before / in / after the own chunk
    int *tot = sm + 3 * E;             // [E] pairs of each expert
    int *cur = sm + 4 * E;             // [E] where this block's next pair of each expert goes
    int *off = sm + 5 * E;             // [E] start of each expert's run
    int *wsum = sm + 6 * E;            // [kMultiWarps + 1] scan of the warps' sums, then the total
    int *own_ids = sm + multi_smem_ints(E);  // [chunk] the own chunk's ids, if stash
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int nt = kMultiThreads;
    const int G = gridDim.x;
    const int c = C > 1 ? (int)(blockIdx.x % C) : 0;  // rank in the cluster: cluster k = blockIdx.x / C
    const int k = (int)blockIdx.x / C;
    const int own = k * C + c;                        // == blockIdx.x: the chunk this block scatters
    const int K = G / C;                              // chunks this block counts: c, C + c, ...
    const int p_lo = own * chunk, p_hi = min(P, p_lo + chunk);

    for (int i = tid; i < 3 * E; i += nt) bin[i] = 0;
    __syncthreads();
    // Count chunks j C + c, j < K, binned 0 / 1 / 2 as chunk j C + c is before the own chunk
    // (j < k), is it, or is after it. With C = 1 these are all the pairs (i = p).
    const int span = K * chunk;
    for (int i0 = 0; i0 < span; i0 += nt * kIdsInFlight) {
        int ev[kIdsInFlight], sl[kIdsInFlight], pv[kIdsInFlight];
#pragma unroll
        for (int u = 0; u < kIdsInFlight; u++) {
            const int i = i0 + u * nt + tid;
            int p;
            if constexpr (C > 1) {
                const int j = i / chunk;
                p = (j * C + c) * chunk + (i - j * chunk);
                sl[u] = (j >= k) + (j > k);
            } else {
                p = i;
                sl[u] = (p >= p_lo) + (p >= p_lo + chunk);
            }
            pv[u] = p;
            ev[u] = i < span && p < P ? ids[p] : -1;
        }
#pragma unroll
        for (int u = 0; u < kIdsInFlight; u++) {
            if ((unsigned)ev[u] < (unsigned)E) atomicAdd(&bin[sl[u] * E + ev[u]], 1);
            if (stash && sl[u] == 1 && pv[u] < p_hi) own_ids[pv[u] - p_lo] = ev[u];
        }
    }

    // Per expert (thread tid has experts [tid * per, tid * per + per)): the total and the pairs
    // ahead of the own chunk, then the exclusive scan of the padded totals over the block (the
    // same in every block), so off[e] and cur[e] = off[e] + pairs of e ahead of the own chunk.
    const int per = (E + nt - 1) / nt;  // 1 or 2
    const int e0 = tid * per;
    int tv[2] = {0, 0}, bv[2] = {0, 0};
    if constexpr (C > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        namespace cg = cooperative_groups;
        cg::cluster_group cluster = cg::this_cluster();
        cluster.sync();  // every block's bins complete and visible to the cluster
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int e = e0 + q;
            if (q >= per || e >= E) continue;
#pragma unroll
            for (int r = 0; r < C; r++) {
                const int *rb = cluster.map_shared_rank(bin, r);
                const int b0 = rb[e], b1 = rb[E + e], b2 = rb[2 * E + e];
                tv[q] += b0 + b1 + b2;
                bv[q] += b0 + (r < c ? b1 : 0);
            }
        }
        // Done reading the others' bins: a block may exit once every block has arrived (the wait
        // is at the end, so the scatter does not wait for the slowest reader).
        cluster.barrier_arrive();
#endif
    } else {
        __syncthreads();
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int e = e0 + q;
            if (q >= per || e >= E) continue;
            tv[q] = bin[e] + bin[E + e] + bin[2 * E + e];
            bv[q] = bin[e];
        }
    }
    int s = 0;
#pragma unroll
    for (int q = 0; q < 2; q++) s += (tv[q] + bm - 1) / bm * bm;  // 0 past E and past per
    int incl = s;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int o = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += o;
    }
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int w = lane < kMultiWarps ? wsum[lane] : 0;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int o = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d) w += o;
        }
        if (lane < kMultiWarps) wsum[lane] = w;  // inclusive: wsum[kMultiWarps - 1] is the total
    }
    __syncthreads();
    int run = (warp > 0 ? wsum[warp - 1] : 0) + incl - s;
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int e = e0 + q;
        if (q >= per || e >= E) continue;
        off[e] = run;
        tot[e] = tv[q];
        cur[e] = run + bv[q];
        run += (tv[q] + bm - 1) / bm * bm;
    }
    const int total = wsum[kMultiWarps - 1];
    const int nb = total / bm;
    __syncthreads();

    // Scatter the own chunk.
    if (stash) {
        for (int t = tid; t < p_hi - p_lo; t += nt) {
            const int e = own_ids[t];
            if ((unsigned)e < (unsigned)E) sorted_ids[atomicAdd(&cur[e], 1)] = p_lo + t;
        }
    } else {
        for_each_valid_id(ids, p_lo, p_hi, E, tid, nt, [&](int e, int p) { sorted_ids[atomicAdd(&cur[e], 1)] = p; });
    }

    // Split over the grid: the block -> expert table and its -1 tail (one entry per thread, by
    // binary search), and the padding rows (one warp per expert).
    for (int b = (int)blockIdx.x * nt + tid; b < max_blocks; b += G * nt)
        block_expert[b] = b < nb ? expert_of_row(off, E, b * bm) : -1;
    for (int e = (int)blockIdx.x * kMultiWarps + warp; e < E; e += G * kMultiWarps) {
        const int end = off[e] + (tot[e] + bm - 1) / bm * bm;
        for (int r = off[e] + tot[e] + lane; r < end; r += 32) sorted_ids[r] = P;
    }
    if (blockIdx.x == 0 && tid == 0) *num_blocks = nb;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (C > 1) cooperative_groups::this_cluster().barrier_wait();  // our bins stay for the others
#endif
}

// Small M: route (one warp per token, route_warps warps taking every route_warps-th token) and
// group in one launch. Dynamic shared memory: the grouping's ints (2 E + 33, rounded up to even),
// route_warps x E doubles of routing scratch, then the routed ids and weights (M top_k of each).
template <int VPL>
__global__ void __launch_bounds__(kFusedThreads)
route_group_kernel(nvfp4moe_gpu_route_params rp, const void *logits, int64_t M, int32_t *ids,
                   float *weights, int bm, int32_t *sorted_ids, int32_t *block_expert,
                   int32_t *num_blocks, int max_blocks, int route_warps, int32_t *zero) {
    extern __shared__ int sm[];
    nvfp4moe_pdl::trigger();  // as in group_kernel
    if (zero && threadIdx.x == 0) *zero = 0;  // (the first kernel of the chain: no wait)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // the routing scratch (doubles) starts 8-byte aligned after the grouping ints
    const int ints = (2 * rp.num_experts + 33 + 1) & ~1;
    double *sel = (double *)(sm + ints) + (size_t)warp * rp.num_experts;
    // The routed ids stay in shared memory for the grouping (no global round trip on the critical
    // path); their global copies are written alongside.
    int32_t *ids_s = (int32_t *)((double *)(sm + ints) + (size_t)route_warps * rp.num_experts);
    float *w_s = (float *)(ids_s + M * rp.top_k);
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

// The host's choice of kernel, from P and E alone. Measured on an H100 with a scratch bench (cold
// L2, one graph replay each, median of 31, incl. ~3.5 us of launch; uniform random top-k ids),
// the single block against this path:
//   pairs     32   128    1K    4K    8K   12K    16K    24K    32K    32K bm=1   128K
//   single   6.8   6.9   7.9  11.4  15.6  19.5   25.3   31.3   43.8     76.5       -
//   here     5.8   5.7   5.9   6.1   6.8   7.5    8.5    9.1    8.8      9.0     15.6
// (E = 256 but 12K: E = 128, at 32K E = 128 gave 8.7; 24K with invalid ids; 32 pairs at G = 32;
// 32K and more with clusters, 24K too). Clusters cost ~2 us more to start and synchronize (8.7
// vs 6.8 at 8K) and pay from about 20K pairs at E = 256 (16K: 8.9 vs 8.5 without, 24K: 9.1 vs
// 10.4, 32K: 8.8 vs 11.1, 128K: 15.6 vs 30.8), but less where E is large, as every block reads
// 3 E bins of each of the others (E = 1024, 24K pairs: 14.4 vs 11.0 without). The boundaries are
// guesses between the sizes measured; below 32 pairs (this path not measured) the single block
// stays.
constexpr int64_t kMultiMinPairs = 32;
constexpr int kMultiBlocks = 64;            // G, or P if smaller (at 32K: 64 beat 128, 32 and fewer)
constexpr int kClusterBlocks = 8;           // blocks per cluster on sm_90 (the portable size)
constexpr int64_t kClusterMinPairs = 20480;
constexpr int64_t kClusterMinPairsPerExpert = 64;  // and P >= 64 E

// group_multi_kernel's dynamic shared memory at most: the 48 KB that need no opt-in.
constexpr size_t kMultiMaxSmem = 48 * 1024;

// The launch configuration of G blocks in clusters of C (attr: its one attribute's storage), for
// the launch and for the occupancy query that decides whether clusters fit.
cudaLaunchConfig_t cluster_config(int G, int C, size_t smem, cudaStream_t stream, cudaLaunchAttribute (&attr)[1]) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)G);
    cfg.blockDim = dim3(kMultiThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)C;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

// A grouping launch of G blocks without clusters, as a programmatic dependent of the kernel ahead
// (the routing grid) when pdl is set: the kernels wait for it before they read the ids.
template <typename... KArgs, typename... Args>
cudaError_t launch_grouping(void (*kernel)(KArgs...), int G, int threads, size_t smem, bool pdl,
                            cudaStream_t stream, Args... args) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        nvfp4moe_pdl::config(dim3((unsigned)G), dim3((unsigned)threads), smem, stream, pdl, &attr);
    const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, args...);
    return err != cudaSuccess ? err : cudaGetLastError();
}

// query(dev) for the current device, once per device: its answer is cached. A query that fails
// answers no, and the error it left is cleared for the caller's launch check.
template <typename Q>
bool per_device(std::atomic<signed char> (&cache)[64], Q &&query) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    const bool cacheable = dev >= 0 && dev < 64;
    if (cacheable) {
        const signed char c = cache[dev].load(std::memory_order_relaxed);  // 0 unknown, 1 yes, -1 no
        if (c) return c > 0;
    }
    const cudaError_t before = cudaPeekAtLastError();
    const bool ok = query(dev);
    if (before == cudaSuccess && cudaPeekAtLastError() != cudaSuccess) cudaGetLastError();
    if (cacheable) cache[dev].store(ok ? 1 : -1, std::memory_order_relaxed);
    return ok;
}

// Whether kernel on device dev is sm_90 code: compiled for sm_90 or later, ptxVersion too (a
// kernel JIT-compiled from older PTX reports the device's binaryVersion but was built without
// what sm_90 adds).
bool sm90_code(int dev, const void *kernel) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major < 9)
        return false;
    cudaFuncAttributes attr;
    return cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion >= 90 && attr.ptxVersion >= 90;
}

// Whether the grouping kernels on the current device wait for a kernel ahead (griddepcontrol:
// pdl.cuh compiles it out below sm_90), so they may be launched with PDL.
bool pdl_ok() {
    static std::atomic<signed char> cache[64];
    return per_device(cache, [](int dev) {
        return sm90_code(dev, (const void *)group_kernel) && sm90_code(dev, (const void *)group_multi_kernel<1>);
    });
}

// Whether the current device runs group_multi_kernel<kClusterBlocks>: sm_90 code (without
// clusters it traps), and room for at least one cluster at the largest shared memory the launcher
// asks (a MIG slice or an MPS share may have none).
bool clusters_ok() {
    static std::atomic<signed char> cache[64];
    return per_device(cache, [](int dev) {
        if (!sm90_code(dev, (const void *)group_multi_kernel<kClusterBlocks>)) return false;
        cudaLaunchAttribute a[1];
        const cudaLaunchConfig_t cfg = cluster_config(kMultiBlocks, kClusterBlocks, kMultiMaxSmem, 0, a);
        int clusters = 0;
        return cudaOccupancyMaxActiveClusters(&clusters, group_multi_kernel<kClusterBlocks>, &cfg) == cudaSuccess &&
               clusters > 0;
    });
}

// G blocks (rounded up to a multiple of C), C blocks per cluster (1 or CL, CL the template's);
// without clusters, a programmatic dependent of the kernel ahead when pdl is set (cluster launches
// stay plain: they come at tens of thousands of pairs, where a launch's latency is small).
template <int CL>
cudaError_t launch_group_multi(const int32_t *ids, int P, int E, int bm, int32_t *sorted_ids,
                               int32_t *block_expert, int32_t *num_blocks, int max_blocks, int G,
                               bool cluster, bool pdl, int32_t *zero, cudaStream_t stream) {
    const int C = cluster ? CL : 1;
    G = (G + C - 1) / C * C;
    const int chunk = (P + G - 1) / G;
    size_t smem = multi_smem_ints(E) * sizeof(int);
    // the own chunk's ids kept in shared memory while they fit
    const int stash = smem + (size_t)chunk * sizeof(int) <= kMultiMaxSmem;
    if (stash) smem += (size_t)chunk * sizeof(int);
    if (!cluster)
        return launch_grouping(group_multi_kernel<1>, G, kMultiThreads, smem, pdl, stream, ids, P, E, bm, chunk,
                               sorted_ids, block_expert, num_blocks, max_blocks, stash, zero);
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = cluster_config(G, CL, smem, stream, attr);
    cudaError_t err = cudaLaunchKernelEx(&cfg, group_multi_kernel<CL>, ids, P, E, bm, chunk, sorted_ids,
                                         block_expert, num_blocks, max_blocks, stash, zero);
    return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t nvfp4moe_gpu_route_and_group(const nvfp4moe_gpu_route_params *rp,
                                                    const void *logits, int32_t *ids,
                                                    float *weights, int64_t M, int32_t top_k,
                                                    int32_t E, int32_t block_m, int32_t *sorted_ids,
                                                    int32_t *block_expert, int32_t *num_blocks,
                                                    int32_t max_blocks, const nvfp4moe_gpu_chain *chain,
                                                    cudaStream_t stream) {
    if (E <= 0 || E > NVFP4MOE_GPU_MAX_EXPERTS || block_m <= 0 || top_k <= 0) return cudaErrorInvalidValue;
    int32_t *zero = chain ? chain->zero : nullptr;
    const size_t group_smem = (size_t)((2 * E + 33 + 1) & ~1) * sizeof(int);
    // One launch for routing and grouping: up to kFusedMaxTokens tokens on 8 warps, one token each.
    // (Up to 128 tokens on 32 warps in rounds measured 5-15 % slower at 64-128 tokens on an H100,
    // whole layer: bench/results/2026-12-07-h100-chain-pdl.md.)
    if (rp && M <= kFusedMaxTokens) {
        // the kernel lays out its shared memory from rp: it must describe these ids
        if (rp->top_k != top_k || rp->num_experts != E) return cudaErrorInvalidValue;
        const size_t ids_smem = (size_t)M * top_k * (sizeof(int32_t) + sizeof(float));
        // routing warps that fit next to the grouping arrays and the ids in 48 KB
        const size_t room = 48 * 1024 - group_smem;
        const int64_t fit = room > ids_smem ? (int64_t)((room - ids_smem) / ((size_t)E * sizeof(double))) : 0;
        if (M <= fit) {  // every token its own warp
            const int route_warps = (int)(fit < kFusedThreads / 32 ? fit : kFusedThreads / 32);
            const size_t smem = group_smem + (size_t)route_warps * E * sizeof(double) + ids_smem;
#define NVFP4MOE_FUSED(V)                                                                                   \
    route_group_kernel<V><<<1, kFusedThreads, smem, stream>>>(*rp, logits, M, ids, weights, block_m, sorted_ids,  \
                                                              block_expert, num_blocks, max_blocks, route_warps, \
                                                              zero)
            switch (nvfp4moe_rt::vpl_for(E)) {
            case 2: NVFP4MOE_FUSED(2); break;
            case 4: NVFP4MOE_FUSED(4); break;
            case 8: NVFP4MOE_FUSED(8); break;
            case 16: NVFP4MOE_FUSED(16); break;
            default: NVFP4MOE_FUSED(32); break;
            }
#undef NVFP4MOE_FUSED
            return cudaGetLastError();
        }
    }
    if (rp) {
        cudaError_t err = nvfp4moe_gpu_route_grid(rp, logits, M, ids, weights, stream);
        if (err != cudaSuccess) return err;
    }
    // The grouping right behind the routing grid (launched here) may start before that finishes.
    const bool pdl = chain && chain->pdl && rp && pdl_ok();
    const int64_t P = M * top_k;
    if (P >= kMultiMinPairs && P <= INT32_MAX / 2) {
        const bool cluster = P >= kClusterMinPairs && P >= kClusterMinPairsPerExpert * E && clusters_ok();
        const int G = cluster || P > kMultiBlocks ? kMultiBlocks : (int)P;
        return launch_group_multi<kClusterBlocks>(ids, (int)P, E, block_m, sorted_ids, block_expert, num_blocks,
                                                  max_blocks, G, cluster, pdl, zero, stream);
    }
    return launch_grouping(group_kernel, 1, kGroupThreads, group_smem, pdl, stream, ids, P, E, block_m, sorted_ids,
                           block_expert, num_blocks, max_blocks, zero);
}
