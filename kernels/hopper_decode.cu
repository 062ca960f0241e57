/*
 * hopper_decode.cu - the small-batch (decode) kernels of the HOPPER_WGMMA backend: GEMM1 with the
 * activation fused into its epilogue, and GEMM2 with the router weight and the top-k combine
 * fused into its epilogue (or the combine in a small kernel after it). Interface:
 * kernels/hopper_decode.h. Weights: the packed layout of kernels/hopper_layout.cuh (the same copy
 * the wgmma GEMM of kernels/hopper_gemm.cu reads).
 *
 * At decode an expert sees a handful of tokens, so the layer is a stream of weight bytes: the
 * design goal is that every multiprocessor streams its equal share of them with enough bytes in
 * flight, and spends as few instructions per weight as the FP4 decode allows.
 *
 * Work split. A work item is one grouping block (<= 8*NT pairs of one expert) times one row tile
 * of 32 weight rows (two 16-row groups: for a gated GEMM1 the gate group and the matching up
 * group, so the activation can run in the epilogue), over all of K. A CTA is 4 warps; an item is
 * taken by kw = 1, 2 or 4 of them (an item slot), each over its share of the k tiles, and the
 * slot's warps meet in shared memory for the item's epilogue (named barrier per slot; one warp
 * needs none). kw is chosen on the device from the real item count (warps_per_item): GEMM2 the
 * fewest warps per item that still give every resident warp work, GEMM1 the split whose busiest
 * warp streams the fewest k tiles; so many-item GEMMs run one warp per item and a handful of
 * experts is still spread over every warp. Items are dealt round-robin to the item slots of a
 * persistent grid of (multiprocessors x resident CTAs) CTAs.
 *
 * Inner loop (per warp, per k tile of 128): 6 LDG.128 of packed weights (two 16-row groups:
 * 2 x 16 B of codes and 16 B of scales each, L1 no-allocate), 16 LDG.32 per 8-token column of
 * activations (the mma.sync B fragment: token g, k 2t,2t+1 and 2t+8,2t+9), then per k16 step and
 * row group 8 integer operations that move the codes' bits (kernels/hopper_bits.h), PRMT + LEA
 * expanding two rows' scales and 4 HMUL2 applying them (kernels/hopper_layout.cuh), and one
 * mma.sync m16n8k16 per row group and token column. The loads of the next k tile (of this item
 * or of the next) are issued before the current one is computed (two register sets). A
 * shared-memory ring of four tiles per warp fed by bulk copies was measured slower on the H200
 * (2.38 against 2.85 TB/s streaming one expert): bytes in flight are not what limits; the same
 * bytes read in this pattern with no decode at all reach 3.14 TB/s (gpu_hopper_decode --stream).
 * Optionally (Params.prefetch) each warp also has the k tiles a few steps ahead of its loads
 * prefetched into L2 with bulk prefetches: no registers, no shared memory, nothing to wait on.
 *
 * Launch overlap (nvfp4moe_decode_gemm.pdl): both kernels may be launched with programmatic
 * dependent launch. GEMM1 then starts while the grouping kernel runs (that kernel lets its
 * dependents launch at once) and waits for it after zeroing the combine's counters; GEMM2
 * starts once every GEMM1 CTA has passed its wait, where there is room (as GEMM1's CTAs retire,
 * or beside them when GEMM1 runs fewer CTAs per SM), reads the grouping, issues its first
 * weight loads and prefetches, and only then waits for GEMM1's intermediate. The launch latency
 * and the ramp of each kernel hide behind the one ahead. (Measured on an H100 on every preset at
 * M = 1..64: PDL within 2 % either way, the L2 prefetches 4-15 % slower; all off by default.)
 *
 * Routing inside GEMM1 (nvfp4moe_hopper_decode_route_gemm1, up to 4 tokens): every CTA routes
 * the tokens and groups the pairs in shared memory itself (route_and_group), so no routing or
 * grouping kernel runs ahead; CTA 0 publishes ids and the grouping for GEMM2. Only the top-k ids
 * are on the path to the first weight loads: the router weights (which only GEMM2 reads) are
 * computed by the last CTA once its items are done. Measured on an H100: 1-4 % faster at
 * M = 1..4 on most presets (bench/results/2026-12-06-h100-fused-route.md).
 * GEMM2 in the same launch behind a grid-wide barrier (a cooperative launch, each warp's first
 * GEMM2 weights loaded before the barrier) was correct but not faster: Qwen3-30B-A3B M = 1 34.9 us
 * either way, most presets at M = 1..4 1-7 % slower, the merged kernel spilling where the two do
 * not (bench/results/2026-12-06-h100-one-launch.md, its patch beside it).
 *
 * Epilogues (fp32 sums of the slot's kw warps through shared memory, in a fixed order):
 *   GEMM1: acc * 128 * scale_2[e] + bias, the activation (kernels/activation.cuh) on (gate, up)
 *     in fp32, rounded once to the 16-bit dtype, stored as the pair's row of the intermediate.
 *   GEMM2: acc * 128 * scale_2[e] + bias, times the router weight, stored as the pair's fp32 row
 *     tile in `partial`; then per token an arrival counter for the row tile: the CTA whose
 *     arrival completes the token's valid slots sums them in slot order and stores the output
 *     row tile in out_dtype (and resets the counter). No combine kernel, and the result does not
 *     depend on which CTA came last. Deferred (nvfp4moe_decode_combine.deferred): GEMM2 only
 *     stores the fp32 rows, and combine_kernel, launched after it, makes the same sums in the
 *     same order (the same bits) with no counters and no fences in GEMM2. The backend defers
 *     from 2 tokens and 8 pairs on (H100: up to 7.8 % faster there, even at one token:
 *     bench/results/2026-12-07-h100-combine-kernel.md).
 *   GEMM1 zeroes the counters for GEMM2 and writes the zero rows of tokens with no valid slot.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "activation.cuh"
#include "hopper_decode.h"
#include "hopper_layout.cuh"
#include "moe_gemm.h"
#include "moe_route.cuh"
#include "pdl.cuh"

// sm_90a feature set only: the same build guard as the wgmma GEMM (one backend, one target).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NVFP4MOE_DECODE_DEVICE 1
#else
#define NVFP4MOE_DECODE_DEVICE 0
#endif

namespace {

using namespace nvfp4moe_hopper;

constexpr int kWarps = 4;                 // k slices of an item
constexpr int kThreads = 32 * kWarps;
constexpr int kRowsPerItem = 32;          // two 16-row groups
constexpr int kHTile = 32;                // output columns per GEMM2 item (= kRowsPerItem)
static_assert(kWChunk == NVFP4MOE_DECODE_CHUNK_BYTES, "the header's chunk size");
// GEMM1 that routes and groups itself: one warp per token, one warp groups all pairs.
constexpr int kRouteMaxM = NVFP4MOE_DECODE_ROUTE_MAX_TOKENS;
constexpr int kRouteMaxPairs = NVFP4MOE_DECODE_ROUTE_MAX_PAIRS;
static_assert(kRouteMaxM <= kWarps && kRouteMaxPairs <= 32, "a warp per token, a lane per pair");
// The routing scratch of the DeepSeek-V3 group limiting: E doubles per token (dynamic shared memory).
constexpr size_t kRouteMaxScratch = (size_t)kRouteMaxM * NVFP4MOE_GPU_MAX_EXPERTS * sizeof(double);

enum Mode { GEMM1 = 0, GEMM2 = 1 };
enum Rows { ROWS_CONSECUTIVE = 0, ROWS_GATE_UP = 1 };

struct Params {
    const uint16_t *a;
    const uint8_t *w;
    const float *scale_2;
    const float *bias;
    const int32_t *sorted_ids;
    const int32_t *block_expert;
    const int32_t *num_blocks;
    int a_row_div;
    int P, N, K, E;
    int n_tiles, k_tiles;
    int items_per_block;
    int force_kw;              // warps per item forced (0: chosen on the device)
    int prefetch;              // k tiles of an item prefetched into L2 ahead of the loads (0: none)
    int expert_chunks;         // GEMM2: chunks of the active experts' weights prefetched before the wait
    int early_ctas;            // GEMM2: the CTAs that share that prefetch (the first wave's first CTA per SM)
    int rows;                  // Rows: which two 16-row groups make item r
    int I;                     // GEMM1: intermediate size (gate/up split, act_out row length)
    int halves;                // GEMM1: scale_2 is [E, 2] (gate, up), else [E]
    // GEMM1
    nvfp4moe_gpu_act_params act;
    int interleaved;           // gate/up rows interleaved (SWIGLUOAI)
    uint16_t *act_out;
    // combine (both)
    const int32_t *topk_ids;
    int M, top_k, H;
    int rt_count;              // counters per token: ceil(H / 32)
    int32_t *counters;
    void *out;
    int out_dtype;
    int deferred;              // GEMM2 parks the slots' rows only; combine_kernel sums them
    // GEMM2
    const float *row_scale;
    float *partial;
    // GEMM1 that routes (has_rp) or only groups (the caller's topk_ids) the M <= kRouteMaxM tokens
    // itself, every CTA on its own; CTA 0 writes the results for GEMM2 (FUSED kernels only)
    nvfp4moe_gpu_route_params rp;
    int has_rp, vpl, max_blocks;
    const void *logits;
    int32_t *ids_out, *sorted_out, *bexp_out, *nb_out;
    float *wts_out;
};

#if NVFP4MOE_DECODE_DEVICE

__device__ __forceinline__ uint4 ldg_stream(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ldg_act(const uint16_t *p) {
    uint32_t v;
    asm volatile("ld.global.nc.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
}
// Fire-and-forget prefetch of bytes (a multiple of 16, 16-byte aligned) at p into L2.
__device__ __forceinline__ void prefetch_l2(const uint8_t *p, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}
__device__ __forceinline__ uint32_t word(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <bool BF16>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (BF16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void store_out(const Params &p, size_t i, float v) {
    if (p.out_dtype == NVFP4MOE_DTYPE_BF16) reinterpret_cast<__nv_bfloat16 *>(p.out)[i] = __float2bfloat16_rn(v);
    else if (p.out_dtype == NVFP4MOE_DTYPE_FP16) reinterpret_cast<__half *>(p.out)[i] = __float2half_rn(v);
    else reinterpret_cast<float *>(p.out)[i] = v;
}

// The two 16-row groups of item r: first rows of group 0 and group 1.
__device__ __forceinline__ void item_rows(const Params &p, int r, int &r0, int &r1) {
    if (p.rows == ROWS_GATE_UP) {
        r0 = 16 * r;
        r1 = p.I + 16 * r;
    } else {
        r0 = kRowsPerItem * r;
        r1 = kRowsPerItem * r + 16;
    }
}

// The KW warps of item slot `slot` (KW = 1: the warp itself).
__device__ __forceinline__ void slot_sync(int slot, int kw) {
    if (kw == 1) __syncwarp();
    else asm volatile("bar.sync %0, %1;\n" ::"r"(1 + slot), "r"(32 * kw) : "memory");
}

// ---- GEMM1 that routes and groups (FUSED) ----
// Every CTA routes the M <= kRouteMaxM tokens (warp t selects token t's experts with the routing
// grid's own functions, so ids and weights are those bits) and groups the P = M * top_k <= 32
// pairs in its shared memory, one lane per pair: no routing/grouping kernel ahead, no global
// round trip before the first weight loads. The grouping is the grouping kernel's: blocks in ascending expert order,
// ceil(count / block_m) blocks per expert, a pair's row at its rank among its expert's pairs (pair
// order), sentinel P in the rows left over. CTA 0 also writes ids and the grouping to global
// memory for GEMM2, the last CTA the weights at its end (decode_kernel). File-scope arrays: only
// the FUSED kernels allocate them.
__shared__ int32_t f_ids[kRouteMaxPairs];
__shared__ int32_t f_sorted[kRouteMaxPairs * 16];  // <= P + (block_m - 1) per expert, block_m <= 16
__shared__ int32_t f_bexp[kRouteMaxPairs];         // a block per pair at most
__shared__ int f_nb;

// Token t's slots naming an expert in [0, E): in the global top-k, or (OWN) in the copy a FUSED
// GEMM1 routed or read into shared memory.
template <bool OWN = false>
__device__ __forceinline__ int valid_slots(const Params &p, int t) {
    int n = 0;
    for (int j = 0; j < p.top_k; j++) {
        const int e = OWN ? f_ids[(size_t)t * p.top_k + j] : p.topk_ids[(size_t)t * p.top_k + j];
        n += e >= 0 && e < p.E;
    }
    return n;
}

// Token t's top-k ids into f_ids (warp t; the weights come later, weigh_one).
template <int VPL>
__device__ __forceinline__ void select_vpl(const Params &p, int t, double *sel, int lane) {
    float lg[VPL], cb[VPL];
    nvfp4moe_rt::lane_logits<VPL>(p.rp, p.logits, t, lg, cb, lane);
    nvfp4moe_rt::route_select<VPL>(p.rp, t, lg, cb, sel, f_ids, lane);
}
__device__ __noinline__ void select_one(const Params &p, int t, double *sel, int lane) {
    switch (p.vpl) {
    case 2: select_vpl<2>(p, t, sel, lane); break;
    case 4: select_vpl<4>(p, t, sel, lane); break;
    case 8: select_vpl<8>(p, t, sel, lane); break;
    case 16: select_vpl<16>(p, t, sel, lane); break;
    default: select_vpl<32>(p, t, sel, lane); break;
    }
}
// Token t's weights from its ids in f_ids, written to the global wts_out (warp t).
template <int VPL>
__device__ __forceinline__ void weigh_vpl(const Params &p, int t, int lane) {
    float lg[VPL], cb[VPL];
    nvfp4moe_rt::lane_logits<VPL>(p.rp, p.logits, t, lg, cb, lane);
    const int my_id = lane < p.top_k ? f_ids[(size_t)t * p.top_k + lane] : -1;
    nvfp4moe_rt::route_weigh<VPL>(p.rp, p.logits, t, lg, my_id, p.wts_out, lane);
}
__device__ __noinline__ void weigh_one(const Params &p, int t, int lane) {
    switch (p.vpl) {
    case 2: weigh_vpl<2>(p, t, lane); break;
    case 4: weigh_vpl<4>(p, t, lane); break;
    case 8: weigh_vpl<8>(p, t, lane); break;
    case 16: weigh_vpl<16>(p, t, lane); break;
    default: weigh_vpl<32>(p, t, lane); break;
    }
}

// The grouping of f_ids[0, P) by warp 0: lane q holds pair q.
template <int BM>
__device__ __forceinline__ void group_warp(const Params &p, int lane) {
    const unsigned all = 0xffffffffu;
    constexpr int bm = BM;
    const int e = lane < p.P ? f_ids[lane] : -1;
    const bool valid = e >= 0 && e < p.E;
    const int key = valid ? e : -1 - lane;  // an invalid pair is a group of its own, never counted
    const unsigned peers = __match_any_sync(all, key);
    const int rank = __popc(peers & ((1u << lane) - 1)), cnt = __popc(peers);
    const int pad = valid && rank == 0 ? (cnt + bm - 1) / bm * bm : 0;  // the expert's rows, on its first pair
    int off = 0;  // rows of the experts below e
    for (int q = 0; q < 32; q++) {
        const int eq = __shfl_sync(all, key, q), pq = __shfl_sync(all, pad, q);
        if (valid && pq > 0 && eq < e) off += pq;
    }
    const int total = (int)__reduce_add_sync(all, (unsigned)pad);
    for (int i = lane; i < total; i += 32) f_sorted[i] = p.P;
    __syncwarp();
    if (valid) f_sorted[off + rank] = lane;
    for (int b = off / bm; pad > 0 && b < (off + pad) / bm; b++) f_bexp[b] = e;
    if (lane == 0) f_nb = total / bm;
}

// The FUSED prologue: route (or read the caller's ids), group into blocks of BM, and (CTA 0)
// publish.
template <int BM>
__device__ void route_and_group(const Params &p) {
    extern __shared__ double f_sel[];  // E doubles per token: DeepSeek-V3 group limiting only
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // the experts' global scales, which the epilogues read, on their way to L2 while routing runs
    for (int i = 32 * threadIdx.x; i < (p.halves ? 2 : 1) * p.E; i += 32 * blockDim.x)
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p.scale_2 + i));
    if (p.has_rp) {
        if (warp < p.M) select_one(p, warp, f_sel + (size_t)warp * p.E, lane);
    } else {
        for (int i = threadIdx.x; i < p.P; i += blockDim.x) f_ids[i] = p.topk_ids[i];
    }
    __syncthreads();
    if (warp == 0) group_warp<BM>(p, lane);
    __syncthreads();
    if (blockIdx.x == 0) {
        const int nb = f_nb;
        for (int i = threadIdx.x; i < p.P && p.has_rp; i += blockDim.x) p.ids_out[i] = f_ids[i];
        for (int i = threadIdx.x; i < nb * BM; i += blockDim.x) p.sorted_out[i] = f_sorted[i];
        for (int b = threadIdx.x; b < p.max_blocks; b += blockDim.x) p.bexp_out[b] = b < nb ? f_bexp[b] : -1;
        if (threadIdx.x == 0) *p.nb_out = nb;
    }
}

// PF: the L2 prefetches (Params.prefetch, Params.expert_chunks) are compiled in. Without them
// the kernel is the one without any prefetch code (ptxas allocates its registers alone: compiled
// in but unused, the prefetch code made the loop spill).
// FUSED: GEMM1 routes and groups itself (route_and_group); the grouping is then read from shared
// memory.
template <int NT, bool BF16, int MODE, bool PF, bool FUSED>
struct Decode {
    static constexpr int BM = 8 * NT;
    static_assert(!FUSED || (MODE == GEMM1 && !PF), "only GEMM1 routes, without the L2 prefetches");

    // The grouping: block b's expert and row i's pair id (through L2: GEMM2 may read them while
    // GEMM1 still runs, under PDL).
    static __device__ __forceinline__ int expert_of(const Params &p, int b) {
        if constexpr (FUSED) return f_bexp[b];
        else return __ldcg(p.block_expert + b);
    }
    static __device__ __forceinline__ int sorted_at(const Params &p, size_t i) {
        if constexpr (FUSED) return f_sorted[i];
        else return __ldcg(p.sorted_ids + i);
    }

    // One k tile's weights in registers: two row groups' codes and scales.
    struct WFrag {
        uint4 c[2][2];          // [group][q]: k16 steps 4q..4q+3
        uint4 s[2];             // [group]: 8 steps x rows (g, g+8)
    };
    // One k tile's activations: NT token columns of the mma B fragment.
    struct BFrag {
        uint32_t b[NT][8][2];   // [column][step][b0, b1]
        int ntv;                // valid token columns
    };

    // Where a warp's slice of an item is: its first k tile, and its tiles' count.
    struct Work {
        int item, kk;           // kk: tile of the slice
    };

    // The weight chunks of item `item`, group h, at the slice's first k tile.
    static __device__ __forceinline__ const uint8_t *group_chunk(const Params &p, int item, int h, int kt0, int &gw) {
        const int b = item / p.items_per_block, r = item % p.items_per_block;
        const int e = expert_of(p, b);
        int r0, r1;
        item_rows(p, r, r0, r1);
        const int row = h ? r1 : r0;
        gw = (row % kTN) / 16;
        return p.w + group_offset(e, row, kt0, p.n_tiles, p.k_tiles);
    }

    // The lane's token rows of item `item` (nullptr: sentinel) and the valid column count.
    static __device__ __forceinline__ void token_rows(const Params &p, int item, const uint16_t *(&arow)[NT], int &ntv) {
        const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
        const int b = item / p.items_per_block;
        ntv = 0;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int pid = sorted_at(p, (size_t)b * BM + 8 * j + g);
            const bool ok = pid >= 0 && pid < p.P;
            arow[j] = ok ? p.a + (size_t)(pid / p.a_row_div) * p.K + 2 * t : nullptr;
            if (__any_sync(0xffffffffu, ok)) ntv = j + 1;
        }
    }

    static __device__ __forceinline__ void load_b(const Params &p, BFrag &f, const uint16_t *const (&arow)[NT], int ntv,
                                                  int kt) {
        f.ntv = ntv;
        const int k0 = kt * kTK;
        const int steps = (p.K - k0) / 16;  // k16 steps of this tile inside K (K % 16 == 0)
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const uint16_t *row = j < ntv && arow[j] ? arow[j] + k0 : nullptr;
            if (row && steps >= 8) {  // every tile but a K tail: no per-step bound
#pragma unroll
                for (int s = 0; s < 8; s++) {
                    f.b[j][s][0] = ldg_act(row + 16 * s);
                    f.b[j][s][1] = ldg_act(row + 16 * s + 8);
                }
            } else {
#pragma unroll
                for (int s = 0; s < 8; s++) {
                    const bool in = row && s < steps;
                    f.b[j][s][0] = in ? ldg_act(row + 16 * s) : 0u;
                    f.b[j][s][1] = in ? ldg_act(row + 16 * s + 8) : 0u;
                }
            }
        }
    }

    // The lane's code and scale vectors of both groups at the slice's first k tile.
    static __device__ __forceinline__ void lane_ptrs(const Params &p, int item, int kt0, const uint8_t *(&wp)[2],
                                                     const uint8_t *(&sp)[2]) {
        const int lane = threadIdx.x % 32;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int gw;
            const uint8_t *chunk = group_chunk(p, item, h, kt0, gw);
            wp[h] = chunk + gw * kGroupCodeBytes + lane * 16;
            sp[h] = chunk + kCodeBytes + gw * kGroupScaleBytes + (lane / 4) * 16;
        }
    }
    static __device__ __forceinline__ void load_w(WFrag &w, const uint8_t *const (&wp)[2], const uint8_t *const (&sp)[2],
                                                  int kk) {
        const size_t off = (size_t)kk * kWChunk;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            w.c[h][0] = ldg_stream(wp[h] + off);
            w.c[h][1] = ldg_stream(wp[h] + off + 512);
            w.s[h] = ldg_stream(sp[h] + off);
        }
    }

    static __device__ __forceinline__ void compute(const WFrag &w, const BFrag &f, float (&acc)[2][NT][4]) {
#pragma unroll
        for (int s = 0; s < 8; s++) {
            uint32_t a[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t q = word(w.c[h][s / 4], s % 4);
                const uint32_t sw = word(w.s[h], s / 2);
                if (s % 2 == 0) decode_step<BF16, 0>(q, sw, a[h]);
                else decode_step<BF16, 2>(q, sw, a[h]);
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (j > 0 && j >= f.ntv) break;
#pragma unroll
                for (int h = 0; h < 2; h++) mma16816<BF16>(acc[h][j], a[h], f.b[j][s][0], f.b[j][s][1]);
            }
        }
    }

    struct Smem {
        float red[kWarps][2][NT][4][32];  // the epilogues: every warp's accumulators [group][column][reg][lane]
        int last[kWarps][BM];             // per item slot: the token each tile-completing arrival finished
    };
    // The FUSED kernels launch with up to kRouteMaxScratch of dynamic shared memory and no opt-in:
    // all of it must stay within the 48 KB default (1 KB left for alignment).
    static_assert(!FUSED || sizeof(Smem) + sizeof(f_ids) + sizeof(f_sorted) + sizeof(f_bexp) +
                                    sizeof(f_nb) + kRouteMaxScratch + 1024 <= 48 * 1024,
                  "the fused GEMM1's shared memory would need an opt-in");

    // The sum over the kw warps of item slot `slot` (warps slot*kw ..) for row (group h, row16 of
    // the group) and token column tok.
    static __device__ __forceinline__ float sum_of(const Smem &sm, int slot, int kw, int h, int row16, int tok) {
        const int j = tok / 8, n = tok % 8;
        const int reg = (row16 >= 8 ? 2 : 0) + (n & 1);
        const int ln = (row16 % 8) * 4 + n / 2;
        float v = 0.0f;
        for (int w = slot * kw; w < slot * kw + kw; w++) v += sm.red[w][h][j][reg][ln];
        return v;
    }

    static __device__ __forceinline__ float bias_of(const Params &p, int e, int row) {
        return p.bias ? p.bias[(size_t)e * p.N + row] : 0.0f;
    }

    // The item's epilogue, run by the kw warps of its slot (ks: this warp's k slice; tid: its
    // thread among the slot's 32*kw).
    static __device__ void epilogue(const Params &p, Smem &sm, int slot, int kw, int ks, int item,
                                    float (&acc)[2][NT][4]) {
        const int lane = threadIdx.x % 32, tid = ks * 32 + lane, nth = 32 * kw, warp = threadIdx.x / 32;
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    sm.red[warp][h][j][r][lane] = acc[h][j][r];
                    acc[h][j][r] = 0.0f;
                }
        slot_sync(slot, kw);
        const int b = item / p.items_per_block, r = item % p.items_per_block;
        int e;
        if constexpr (FUSED) e = f_bexp[b];
        else e = p.block_expert[b];
        // GEMM1 of a gated activation may have a scale per half: s2 is then the gate's.
        const float s2 = p.scale_2[MODE == GEMM1 && p.halves ? 2 * e : e] * kAccUnscale;
        const float s2u = MODE == GEMM1 && p.halves ? p.scale_2[2 * e + 1] * kAccUnscale : s2;
        const int32_t *ids;
        if constexpr (FUSED) ids = f_sorted + (size_t)b * BM;
        else ids = p.sorted_ids + (size_t)b * BM;
        if constexpr (MODE == GEMM1) {
            if (p.rows == ROWS_GATE_UP || p.interleaved) {  // gated: gate and up rows in the item
                // 16 intermediate columns x BM tokens
                for (int o = tid; o < 16 * BM; o += nth) {
                    const int i = o % 16, tok = o / 16;
                    const int pid = ids[tok];
                    if (pid < 0 || pid >= p.P) continue;
                    float gv, uv;
                    int rg, ru;
                    if (p.interleaved) {
                        rg = kRowsPerItem * r + 2 * i;
                        ru = rg + 1;
                        gv = sum_of(sm, slot, kw, (2 * i) / 16, (2 * i) % 16, tok);
                        uv = sum_of(sm, slot, kw, (2 * i + 1) / 16, (2 * i + 1) % 16, tok);
                    } else {
                        rg = 16 * r + i;
                        ru = p.I + 16 * r + i;
                        gv = sum_of(sm, slot, kw, 0, i, tok);
                        uv = sum_of(sm, slot, kw, 1, i, tok);
                    }
                    gv = gv * s2 + bias_of(p, e, rg);
                    uv = uv * s2u + bias_of(p, e, ru);
                    const float v = nvfp4moe_dev::act_gated(p.act, gv, uv);
                    p.act_out[(size_t)pid * p.I + 16 * r + i] = to_half_bits<BF16>(v);
                }
            } else {
                for (int o = tid; o < kRowsPerItem * BM; o += nth) {
                    const int i = o % kRowsPerItem, tok = o / kRowsPerItem;
                    const int row = kRowsPerItem * r + i;
                    const int pid = ids[tok];
                    if (row >= p.N || pid < 0 || pid >= p.P) continue;
                    const float x = sum_of(sm, slot, kw, i / 16, i % 16, tok) * s2 + bias_of(p, e, row);
                    p.act_out[(size_t)pid * p.I + row] = to_half_bits<BF16>(nvfp4moe_dev::act_plain(p.act.activation, x));
                }
            }
            slot_sync(slot, kw);  // red is rewritten by the next item
        } else {
            // Lane l < BM reads token row l's pair id and row scale once (the loop below takes
            // them by shuffle: its trip count is warp-uniform) and the lane's column's bias
            // once; the loop's stores then wait on no read (before, each iteration read the id,
            // the bias and the row scale after the previous iteration's store). The same values
            // and operations, so the same bits.
            const int pid_l = lane < BM ? ids[lane] : -1;
            {
                const float rs_l = p.row_scale && pid_l >= 0 && pid_l < p.P ? p.row_scale[pid_l] : 1.0f;
                const int hcol = kHTile * r + lane;
                const float bias = hcol < p.N ? bias_of(p, e, hcol) : 0.0f;
                for (int tok = ks; tok < BM; tok += kw) {  // o = 32 * tok + lane of the loop below
                    const int pid = __shfl_sync(0xffffffffu, pid_l, tok);
                    const float rs = __shfl_sync(0xffffffffu, rs_l, tok);
                    if (hcol >= p.N || pid < 0 || pid >= p.P) continue;
                    float v = sum_of(sm, slot, kw, lane / 16, lane % 16, tok) * s2 + bias;
                    if (p.row_scale) v *= rs;
                    p.partial[(size_t)pid * p.N + hcol] = v;
                }
            }
            if (p.deferred) {  // combine_kernel sums the rows after this kernel
                slot_sync(slot, kw);  // red is rewritten by the next item
                return;
            }
            __threadfence();  // the partial rows are visible before this item's arrivals count
            slot_sync(slot, kw);
            if (tid < BM) {
                const int pid = pid_l;  // tid < BM: warp ks = 0, lane tid
                int done = -1;
                if (pid >= 0 && pid < p.P) {
                    const int t = pid / p.top_k;
                    int32_t *cnt = p.counters + (size_t)t * p.rt_count + r;
                    const int before = atomicAdd(cnt, 1);
                    if (before == valid_slots(p, t) - 1) {
                        done = t;
                        *cnt = 0;  // every slot has arrived: ready for the next forward
                    }
                }
                sm.last[slot][tid] = done;
                __threadfence();  // acquire side: the other slots' partial rows are read after this
            }
            slot_sync(slot, kw);
            for (int tok = ks; tok < BM; tok += kw) {
                const int t = sm.last[slot][tok];  // the same for the whole warp
                if (t < 0) continue;
                const int hcol = kHTile * r + lane;
                float v = 0.0f;
                if (p.top_k <= 32) {
                    // The valid slots' partial rows summed in slot order: lane j reads slot j's id
                    // (one load for the warp; every lane reaches the ballot: t and top_k are
                    // warp-uniform, the column test comes after it), then each lane its column of
                    // 4 slots' rows at a time, all 4 in flight together (a row is read whether or
                    // not its slot is valid: it is inside partial's [M * top_k, N]; an invalid
                    // slot's value is never added). 4, not 8, and no unrolling of the j0 loop:
                    // more loads in flight made ptxas spill the k loop's pointers of the NT = 1
                    // kernels (reloaded every k tile).
                    const int ej = lane < p.top_k ? p.topk_ids[(size_t)t * p.top_k + lane] : -1;
                    const unsigned valid = __ballot_sync(0xffffffffu, ej >= 0 && ej < p.E);
                    if (hcol >= p.N) continue;
#pragma unroll 1
                    for (int j0 = 0; j0 < p.top_k; j0 += 4) {
                        float pv[4];
#pragma unroll
                        for (int u = 0; u < 4; u++)
                            pv[u] = j0 + u < p.top_k ? __ldcg(p.partial + ((size_t)t * p.top_k + j0 + u) * p.N + hcol)
                                                     : 0.0f;
#pragma unroll
                        for (int u = 0; u < 4; u++)  // j0 + u < 32: top_k <= 32
                            if ((valid >> (j0 + u)) & 1u) v += pv[u];
                    }
                } else {  // more slots than lanes (callers of this interface other than the
                          // library's layer, which has top_k <= 32): one read after another
                    if (hcol >= p.N) continue;
                    for (int j = 0; j < p.top_k; j++) {
                        const int ej = p.topk_ids[(size_t)t * p.top_k + j];
                        if (ej < 0 || ej >= p.E) continue;
                        v += __ldcg(p.partial + ((size_t)t * p.top_k + j) * p.N + hcol);
                    }
                }
                store_out(p, (size_t)t * p.N + hcol, v);
            }
            slot_sync(slot, kw);  // red and last are rewritten by the next item
        }
    }

    // GEMM1's side duties for the combine: zero the arrival counters, and (after the grouping
    // is known) zero the output rows of tokens without a valid slot (GEMM2 never writes them).
    static __device__ void zero_counters(const Params &p) {
        const size_t stride = (size_t)gridDim.x * blockDim.x;
        const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        const size_t nc = (size_t)p.M * p.rt_count;
        for (size_t i = first; i < nc; i += stride) p.counters[i] = 0;
    }
    static __device__ void zero_rows(const Params &p) {
        const size_t stride = (size_t)gridDim.x * blockDim.x;
        const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        // FUSED: the ids in shared memory (CTA 0 may be writing the global ones)
        for (size_t t = first; t < (size_t)p.M; t += stride)
            if (valid_slots<FUSED>(p, (int)t) == 0)
                for (int h = 0; h < p.H; h++) store_out(p, t * p.H + h, 0.0f);
    }

    // Prefetch into L2 of the k tiles ahead of the register loads (p.prefetch of them, within the
    // item), so those loads find their bytes in L2: more bytes in flight than two register sets
    // hold, with no shared memory and nothing to wait on (a bulk prefetch is fire-and-forget).
    // Loading tile kk of an item, tile kk + p.prefetch is prefetched (and tiles 1 .. p.prefetch
    // of the first item at the start; a later item's first tiles are not: a burst there cost
    // registers the loop spilled). Lanes 0-3 issue one each: group 0's codes and scales, group
    // 1's codes and scales, addressed from lane 0-3's own load pointers (lane_ptrs).
    static __device__ __forceinline__ void prefetch_tile(const uint8_t *const (&wp)[2], const uint8_t *const (&sp)[2],
                                                         int kk) {
        const int lane = threadIdx.x % 32;
        if (lane >= 4) return;
        const size_t off = (size_t)kk * kWChunk;
        // lanes 0-3 have lane / 4 == 0: sp[h] is the group's first scale byte, wp[h] - 16 * lane
        // its first code byte (selected, not indexed by lane: the arrays stay in registers)
        const uint8_t *w = lane < 2 ? wp[0] : wp[1], *sc = lane < 2 ? sp[0] : sp[1];
        prefetch_l2(lane % 2 ? sc + off : w - 16 * lane + off, lane % 2 ? kGroupScaleBytes : kGroupCodeBytes);
    }
    static __device__ __forceinline__ void prefetch_ahead(const Params &p, const uint8_t *const (&wp)[2],
                                                          const uint8_t *const (&sp)[2], int kk, int nkt) {
        if (kk + p.prefetch < nkt) prefetch_tile(wp, sp, kk + p.prefetch);
    }

    // GEMM2, before its wait: this CTA's slice of the first p.expert_chunks weight chunks of the
    // active experts (in block order: the order the items are dealt in) is prefetched into L2.
    // A CTA that starts while GEMM1 still streams (with PDL, where GEMM1 leaves room for it)
    // moves GEMM2's bytes with the HBM bandwidth GEMM1 does not use. The slices go to the first
    // p.early_ctas CTAs, the ones that start first (one per multiprocessor beside GEMM1). Warp 0
    // walks the blocks 32 at a time; a block starting a new expert gives that expert's distinct
    // index, and the lane holding it prefetches the part of the expert's chunks inside the slice
    // (an expert's chunks are contiguous: n_tiles x k_tiles of kWChunk bytes).
    static __device__ __noinline__ void prefetch_experts(const Params &p, int nb) {
        const int slices = p.early_ctas < (int)gridDim.x ? p.early_ctas : (int)gridDim.x;
        if (threadIdx.x >= 32 || p.expert_chunks <= 0 || nb <= 0 || (int)blockIdx.x >= slices) return;
        const int lane = threadIdx.x;
        const long long per = (long long)p.n_tiles * p.k_tiles;
        const long long lo = (long long)blockIdx.x * p.expert_chunks / slices;
        const long long hi = (long long)(blockIdx.x + 1) * p.expert_chunks / slices;
        if (lo >= hi) return;
        long long d_base = 0;  // distinct experts in the blocks before this window
        for (int b0 = 0; b0 < nb && d_base * per < hi; b0 += 32) {
            const int b = b0 + lane;
            const int e = b < nb ? __ldcg(p.block_expert + b) : -1;
            const int up = __shfl_up_sync(0xffffffffu, e, 1);
            const int before = lane > 0 ? up : b0 > 0 ? __ldcg(p.block_expert + b0 - 1) : -1;
            const bool fresh = e >= 0 && e < p.E && e != before;
            const unsigned m = __ballot_sync(0xffffffffu, fresh);
            if (fresh) {
                const long long d = d_base + __popc(m & ((1u << lane) - 1));
                const long long j0 = lo > d * per ? lo : d * per, j1 = hi < (d + 1) * per ? hi : (d + 1) * per;
                for (long long j = j0; j < j1; j++)
                    prefetch_l2(p.w + ((size_t)e * (size_t)per + (size_t)(j - d * per)) * kWChunk, kWChunk);
            }
            d_base += __popc(m);
        }
    }

    // Warps per item. GEMM2 (short K, an epilogue with a cross-CTA combine per item): the fewest
    // (1, 2, 4) that still give every resident warp an item's slice, so short-K items run on one
    // warp (no reduction, no CTA barrier) and few items are still spread over all warps. GEMM1:
    // the one whose busiest warp streams the fewest k tiles, ceil(items * kw / warps) x
    // ceil(k_tiles / kw), moving to more warps only for 10 % fewer (each split adds a reduction
    // per item): at a few hundred to a few thousand items a warp's round-robin share is 1-3 items,
    // and the rounding up decides (H100, bench/results/2026-12-06-h100-fused-route.md: 4-6 % at
    // M = 4 on Qwen3-235B-A22B, Mixtral-8x7B and gpt-oss-120b). Never more warps than k tiles.
    static __device__ __forceinline__ int warps_per_item(const Params &p, int items) {
        const long long warps = (long long)gridDim.x * kWarps;
        int kw = 1;
        if (p.force_kw > 0) {
            kw = p.force_kw;
        } else if constexpr (MODE == GEMM1) {
            // 32-bit arithmetic: every CTA computes this before its first load (a 64-bit division
            // is a long subroutine; measured 2 µs slower at M = 1). Past 2^28 items all three
            // are within 10 % anyway.
            if (items < (1 << 28)) {
                const unsigned w = (unsigned)warps, n = (unsigned)items, kt = (unsigned)p.k_tiles;
                const unsigned c1 = (n + w - 1) / w * kt, c2 = (2 * n + w - 1) / w * ((kt + 1) / 2),
                               c4 = (4 * n + w - 1) / w * ((kt + 3) / 4);
                unsigned best = c1;
                if (10 * c2 < 9 * best) best = c2, kw = 2;
                if (10 * c4 < 9 * best) kw = 4;
            }
        } else {
            while (kw < kWarps && (long long)items * kw * 4 < warps * 3) kw *= 2;
        }
        while (kw > 1 && kw > p.k_tiles) kw /= 2;
        return kw;
    }

    // Launched with programmatic dependent launch (PDL) after the grouping kernel (GEMM1) or
    // GEMM1 (GEMM2), a kernel may start before the kernel ahead has finished; nvfp4moe_pdl::wait
    // marks where it must have. Before it: GEMM1 zeroes the combine's counters (the previous
    // forward's GEMM2 finished before this forward's grouping kernel started, and that kernel
    // must have started for this one to launch); GEMM2 reads the grouping (complete: GEMM1
    // signals its dependents only after its own wait) and issues its first weight loads and
    // prefetches, which no kernel writes. GEMM2 reads the grouping through L2 (ld.global.cg).
    // Without PDL the waits return at once.
    static __device__ void run(const Params &p) {
        __shared__ __align__(128) Smem sm;
        if constexpr (FUSED) {
            route_and_group<BM>(p);  // no kernel ahead: launched without PDL
            zero_counters(p);
            zero_rows(p);
        } else if constexpr (MODE == GEMM1) {
            zero_counters(p);
            nvfp4moe_pdl::wait();     // the grouping, topk ids and GEMM1's input are complete
            // GEMM2 may launch: its prologue reads nothing GEMM1 writes. This trigger must stay
            // after the wait: GEMM2 reads the grouping before its own wait, which is complete
            // only because every GEMM1 CTA has waited for it before triggering.
            nvfp4moe_pdl::trigger();
            zero_rows(p);
        }
        const int warp = threadIdx.x / 32;
        const int nb = FUSED ? f_nb : __ldcg(p.num_blocks);
        const int items = nb * p.items_per_block;
        if constexpr (MODE == GEMM2 && PF) prefetch_experts(p, nb);
        const int kw = warps_per_item(p, items), slots = kWarps / kw;
        const int slot = warp / kw, ks = warp % kw;
        const int first = blockIdx.x * slots + slot, stride = gridDim.x * slots;
        if (first >= items) return;  // the slot's warps all leave together
        const int kt0 = ks * p.k_tiles / kw, nkt = (ks + 1) * p.k_tiles / kw - kt0;  // >= 1
        float acc[2][NT][4];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int r = 0; r < 4; r++) acc[h][j][r] = 0.0f;

        // The loads run one tile ahead of the compute, into a second register set (the cursor bw).
        Work bw = {first, 0};
        const uint16_t *arow[NT];
        int ntv;
        token_rows(p, first, arow, ntv);
        struct Frag {
            BFrag b;
            WFrag w;
        };
        const uint8_t *wp[2], *sp[2];
        lane_ptrs(p, first, kt0, wp, sp);
        Frag fa, fb;
        load_w(fa.w, wp, sp, 0);
        if constexpr (PF)
            for (int t = 1; t <= p.prefetch && t < nkt; t++) prefetch_tile(wp, sp, t);
        if constexpr (MODE == GEMM2) nvfp4moe_pdl::wait();  // GEMM1's intermediate, counters, zero rows
        load_b(p, fa.b, arow, ntv, kt0);
        int item = first, kk = 0;  // the tile being computed
        auto step = [&](Frag &now, Frag &next) -> bool {
            if (++bw.kk == nkt) {
                bw.kk = 0;
                bw.item += stride;
                if (bw.item < items) {
                    token_rows(p, bw.item, arow, ntv);
                    lane_ptrs(p, bw.item, kt0, wp, sp);
                }
            }
            const bool more = bw.item < items;
            if (more) {
                load_w(next.w, wp, sp, bw.kk);
                load_b(p, next.b, arow, ntv, kt0 + bw.kk);
                if constexpr (PF)
                    if (p.prefetch > 0) prefetch_ahead(p, wp, sp, bw.kk, nkt);
            }
            compute(now.w, now.b, acc);
            if (++kk == nkt) {
                epilogue(p, sm, slot, kw, ks, item, acc);
                kk = 0;
                item += stride;
            }
            return more;
        };
        while (step(fa, fb) && step(fb, fa)) {
        }
    }
};

#endif  // NVFP4MOE_DECODE_DEVICE

// Registers: one column (NT = 1) fits 4 CTAs (16 warps) per multiprocessor in 128 registers,
// two columns need 3 (12 warps, 168 registers): their B fragments are twice as many.
template <int NT, bool BF16, int MODE, bool PF, bool FUSED>
__global__ void __launch_bounds__(kThreads, NT == 1 ? 4 : 3) decode_kernel(const __grid_constant__ Params p) {
#if NVFP4MOE_DECODE_DEVICE
    Decode<NT, BF16, MODE, PF, FUSED>::run(p);
    if constexpr (FUSED) {
        // The router weights, which only GEMM2 reads, off the path to the first weight loads: by
        // the last CTA (the fewest items of the round robin) once its items are done.
        const int warp = threadIdx.x / 32;
        if (p.has_rp && blockIdx.x == gridDim.x - 1 && warp < p.M) weigh_one(p, warp, threadIdx.x % 32);
    }
#elif defined(__CUDA_ARCH__)
    __trap();  // no sm_90a code in this image: the launcher refuses before getting here
#endif
}

// The combine of a deferred GEMM2 (Params.deferred): thread i of the grid-stride loop sums output
// element i = t * H + h over token t's valid slots in slot order, exactly as the last CTA of GEMM2's
// own combine does (same fp32 additions from 0, the same rounding), so the same bits; neighbouring
// threads read neighbouring columns of each slot's row.
__global__ void __launch_bounds__(256) combine_kernel(const __grid_constant__ Params p) {
#if NVFP4MOE_DECODE_DEVICE
    const size_t n = (size_t)p.M * p.H, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const size_t t = i / p.H, h = i % p.H;
        float v = 0.0f;
        for (int j = 0; j < p.top_k; j++) {
            const int e = p.topk_ids[t * p.top_k + j];
            if (e >= 0 && e < p.E) v += __ldcg(p.partial + (t * p.top_k + j) * p.H + h);
        }
        store_out(p, i, v);
    }
#elif defined(__CUDA_ARCH__)
    __trap();  // no sm_90a code in this image: the launcher refuses before getting here
#endif
}

// smem: the FUSED kernel's routing scratch (dynamic shared memory, <= kRouteMaxScratch).
template <int NT, bool BF16, int MODE, bool PF, bool FUSED>
cudaError_t launch(const Params &p, int max_items, int sm_count, int room, bool pdl, size_t smem,
                   cudaStream_t stream) {
    auto *fn = decode_kernel<NT, BF16, MODE, PF, FUSED>;
    static int resident = 0;  // CTAs per multiprocessor; 0 unknown, -1 no sm_90a image
    if (resident < 0) return cudaErrorNoKernelImageForDevice;
    if (resident == 0) {
        int dev = 0, major = 0;
        cudaError_t err = cudaGetDevice(&dev);
        if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        if (err != cudaSuccess) return err;
        cudaFuncAttributes attr;
        err = cudaFuncGetAttributes(&attr, fn);
        if (err != cudaSuccess) return err;
        if (major != 9 || attr.binaryVersion != 90) {
            resident = -1;
            return cudaErrorNoKernelImageForDevice;
        }
        // FUSED: the occupancy with the largest routing scratch, so any launch fits the grid's
        // CTAs (static + scratch stay within the 48 KB that need no opt-in: Decode's static_assert)
        int n = 0;
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, kThreads, FUSED ? kRouteMaxScratch : 0);
        if (err != cudaSuccess) return err;
        resident = n > 0 ? n : 1;
    }
    const int per_sm = room > 0 ? (resident - room > 1 ? resident - room : 1) : resident;  // room: CTA slots left free
    long long grid = (long long)(sm_count > 0 ? sm_count : 1) * per_sm;
    if (grid > max_items) grid = max_items;
    if (grid < 1) grid = 1;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        nvfp4moe_pdl::config(dim3((unsigned)grid), dim3(kThreads), smem, stream, pdl, &attr);
    return cudaLaunchKernelEx(&cfg, fn, p);
}

template <int NT, bool BF16, int MODE>
cudaError_t launch_pf(const Params &p, int max_items, int sm_count, int room, bool pdl, cudaStream_t s) {
    const bool pf = p.prefetch > 0 || (MODE == GEMM2 && p.expert_chunks > 0);
    return pf ? launch<NT, BF16, MODE, true, false>(p, max_items, sm_count, room, pdl, 0, s)
              : launch<NT, BF16, MODE, false, false>(p, max_items, sm_count, room, pdl, 0, s);
}

template <int MODE>
cudaError_t launch_any(const Params &p, int block_m, bool bf16, int max_items, int sm_count, int room, bool pdl,
                       cudaStream_t s) {
    if (block_m == 8)
        return bf16 ? launch_pf<1, true, MODE>(p, max_items, sm_count, room, pdl, s)
                    : launch_pf<1, false, MODE>(p, max_items, sm_count, room, pdl, s);
    if (block_m == 16)
        return bf16 ? launch_pf<2, true, MODE>(p, max_items, sm_count, room, pdl, s)
                    : launch_pf<2, false, MODE>(p, max_items, sm_count, room, pdl, s);
    return cudaErrorInvalidValue;
}

bool gemm_ok(const nvfp4moe_decode_gemm *g) {
    return g && g->a && g->w && g->scale_2 && g->sorted_ids && g->block_expert && g->num_blocks &&
           g->N > 0 && g->K > 0 && g->N % 16 == 0 && g->K % 16 == 0 && g->E > 0 && g->a_row_div >= 1 &&
           g->P >= 0 && g->max_blocks >= 0 && (g->block_m == 8 || g->block_m == 16) &&
           (g->warps_per_item == 0 || g->warps_per_item == 1 || g->warps_per_item == 2 || g->warps_per_item == 4) &&
           g->scale_2_halves >= 0 && g->scale_2_halves <= 2 && g->prefetch_tiles >= 0 &&
           g->prefetch_tiles <= NVFP4MOE_DECODE_MAX_PREFETCH && g->room_per_sm >= 0 && g->expert_prefetch_chunks >= 0;
}

bool combine_ok(const nvfp4moe_decode_combine *c) {
    return c && c->topk_ids && c->counters && c->out && c->M >= 0 && c->top_k > 0 && c->H > 0 &&
           (c->out_dtype == NVFP4MOE_DTYPE_BF16 || c->out_dtype == NVFP4MOE_DTYPE_FP16 ||
            c->out_dtype == NVFP4MOE_DTYPE_F32);
}

Params params_of(const nvfp4moe_decode_gemm *g, const nvfp4moe_decode_combine *c) {
    Params p = {};
    p.a = static_cast<const uint16_t *>(g->a);
    p.w = static_cast<const uint8_t *>(g->w);
    p.scale_2 = g->scale_2;
    p.halves = g->scale_2_halves != 0;
    p.bias = g->bias;
    p.sorted_ids = g->sorted_ids;
    p.block_expert = g->block_expert;
    p.num_blocks = g->num_blocks;
    p.a_row_div = g->a_row_div;
    p.P = g->P;
    p.N = g->N;
    p.K = g->K;
    p.E = g->E;
    p.n_tiles = n_tiles_of(g->N);
    p.k_tiles = k_tiles_of(g->K);
    p.force_kw = g->warps_per_item;
    p.prefetch = g->prefetch_tiles;
    p.expert_chunks = g->expert_prefetch_chunks;
    p.early_ctas = g->sm_count > 0 ? g->sm_count : 1;
    p.topk_ids = c->topk_ids;
    p.M = c->M;
    p.top_k = c->top_k;
    p.H = c->H;
    p.rt_count = (c->H + kHTile - 1) / kHTile;
    p.counters = c->counters;
    p.out = c->out;
    p.out_dtype = c->out_dtype;
    p.deferred = c->deferred != 0;
    return p;
}

}  // namespace

extern "C" int32_t nvfp4moe_hopper_decode_block_m(int64_t P, int32_t E) {
    if (P <= 0 || E <= 0) return 8;
    // Measured on an H100 with the wgmma GEMM forced against this rule on every preset at 0.25..12
    // pairs per expert (bench/results/2026-12-06-h100-block-m.md, section 4): up to 3 pairs per
    // expert the decode kernels win or tie (Qwen3-30B-A3B at 3: 167 against 184 us); at 4, where
    // they ran two 8-token columns, the GEMM (block_m 64 since its items run narrow token tiles)
    // was 6-14 % faster on all six (DeepSeek-V3 M = 128: 2193-2206 against 2558-2562 us). So one
    // column up to 3 pairs per expert on average, and the GEMM beyond; the two-column kernels
    // (block_m 16) run when a caller forces the decode regime.
    const double per_expert = (double)P / E;
    return per_expert <= NVFP4MOE_DECODE_MAX_PAIRS_PER_EXPERT ? 8 : 0;
}

extern "C" size_t nvfp4moe_hopper_decode_counters(int64_t M, int32_t H) {
    if (M <= 0 || H <= 0) return 0;
    return (size_t)M * (size_t)((H + kHTile - 1) / kHTile);
}

// GEMM1's parameters (false: invalid arguments).
static bool gemm1_params(const nvfp4moe_decode_gemm *g, const nvfp4moe_gpu_act_params *act, int32_t I, void *act_out,
                         const nvfp4moe_decode_combine *c, Params &p, int &max_items) {
    if (!gemm_ok(g) || !combine_ok(c) || !act || !act_out || I <= 0 || I % 16) return false;
    const bool gated = nvfp4moe_activation_is_gated((nvfp4moe_activation)act->activation);
    if (g->N != (gated ? 2 * I : I)) return false;
    p = params_of(g, c);
    p.act = *act;
    p.I = I;
    p.act_out = static_cast<uint16_t *>(act_out);
    p.interleaved = act->activation == NVFP4MOE_ACT_SWIGLUOAI;
    p.rows = gated && !p.interleaved ? ROWS_GATE_UP : ROWS_CONSECUTIVE;
    p.items_per_block = gated ? I / 16 : (I + kRowsPerItem - 1) / kRowsPerItem;
    // at least enough CTAs for the combine preparation even when there are few items
    const long long items = (long long)g->max_blocks * p.items_per_block;
    max_items = (int)(items > 0x7fffffffLL ? 0x7fffffffLL : items < 1 ? 1 : items);
    return true;
}

extern "C" cudaError_t nvfp4moe_hopper_decode_gemm1(const nvfp4moe_decode_gemm *g, const nvfp4moe_gpu_act_params *act,
                                                    int32_t I, void *act_out, const nvfp4moe_decode_combine *c,
                                                    cudaStream_t stream) {
    Params p;
    int max_items = 0;
    if (!gemm1_params(g, act, I, act_out, c, p, max_items)) return cudaErrorInvalidValue;
    if (c->M == 0) return cudaSuccess;
    return launch_any<GEMM1>(p, g->block_m, g->is_bf16 != 0, max_items, g->sm_count, g->room_per_sm, g->pdl != 0,
                             stream);
}

extern "C" int32_t nvfp4moe_hopper_decode_can_route(int64_t M, int32_t top_k, int32_t E) {
    return M >= 1 && M <= kRouteMaxM && top_k >= 1 && M * top_k <= kRouteMaxPairs && E >= 1 &&
           E <= NVFP4MOE_GPU_MAX_EXPERTS;
}

extern "C" cudaError_t nvfp4moe_hopper_decode_route_gemm1(const nvfp4moe_decode_gemm *g, const nvfp4moe_decode_route *r,
                                                          const nvfp4moe_gpu_act_params *act, int32_t I, void *act_out,
                                                          const nvfp4moe_decode_combine *c, cudaStream_t stream) {
    Params p;
    int max_items = 0;
    if (!gemm1_params(g, act, I, act_out, c, p, max_items) || !r || !r->sorted_ids || !r->block_expert ||
        !r->num_blocks || !nvfp4moe_hopper_decode_can_route(c->M, c->top_k, g->E) || g->P != c->M * c->top_k ||
        (int64_t)g->max_blocks * g->block_m < nvfp4moe_group_capacity(g->P, g->E, g->block_m))
        return cudaErrorInvalidValue;
    const nvfp4moe_gpu_route_params *rp = r->rp;
    if (rp && (!r->topk_ids || !r->topk_weights || r->topk_ids != c->topk_ids || rp->num_experts != g->E ||
               rp->top_k != c->top_k ||
               (!r->logits && rp->method != NVFP4MOE_ROUTING_SIMULATED)))
        return cudaErrorInvalidValue;
    if (rp) {
        p.rp = *rp;
        p.has_rp = 1;
        p.vpl = nvfp4moe_rt::vpl_for(g->E);
        p.logits = r->logits;
        p.ids_out = r->topk_ids;
        p.wts_out = r->topk_weights;
    }
    p.max_blocks = g->max_blocks;
    p.sorted_out = r->sorted_ids;
    p.bexp_out = r->block_expert;
    p.nb_out = r->num_blocks;
    // the routing scratch: E doubles per token where DeepSeek-V3 limits groups (moe_route.cuh)
    const size_t smem = rp && rp->method == NVFP4MOE_ROUTING_DEEPSEEK_V3 && rp->n_group > 1
                            ? (size_t)c->M * (size_t)g->E * sizeof(double) : 0;
    const int sms = g->sm_count, room = g->room_per_sm;
    if (g->block_m == 8)
        return g->is_bf16 ? launch<1, true, GEMM1, false, true>(p, max_items, sms, room, false, smem, stream)
                          : launch<1, false, GEMM1, false, true>(p, max_items, sms, room, false, smem, stream);
    return g->is_bf16 ? launch<2, true, GEMM1, false, true>(p, max_items, sms, room, false, smem, stream)
                      : launch<2, false, GEMM1, false, true>(p, max_items, sms, room, false, smem, stream);
}

extern "C" cudaError_t nvfp4moe_hopper_decode_gemm2(const nvfp4moe_decode_gemm *g, const float *row_scale, float *partial,
                                                    const nvfp4moe_decode_combine *c, cudaStream_t stream) {
    if (!gemm_ok(g) || !combine_ok(c) || !partial || g->N != c->H) return cudaErrorInvalidValue;
    if (c->M == 0 || g->P == 0 || g->max_blocks == 0) return cudaSuccess;
    Params p = params_of(g, c);
    p.row_scale = row_scale;
    p.partial = partial;
    p.rows = ROWS_CONSECUTIVE;
    p.items_per_block = (g->N + kRowsPerItem - 1) / kRowsPerItem;
    const long long items = (long long)g->max_blocks * p.items_per_block;
    const int max_items = (int)(items > 0x7fffffffLL ? 0x7fffffffLL : items);
    return launch_any<GEMM2>(p, g->block_m, g->is_bf16 != 0, max_items, g->sm_count, g->room_per_sm, g->pdl != 0,
                             stream);
}

extern "C" cudaError_t nvfp4moe_hopper_decode_combine(const nvfp4moe_decode_combine *c, const float *partial, int32_t E,
                                                      cudaStream_t stream) {
    if (!combine_ok(c) || !c->deferred || !partial || E < 1) return cudaErrorInvalidValue;
    if (c->M == 0) return cudaSuccess;
    static int image = 0;  // 1: sm_90a code in this binary, -1: none (the decode kernels' rule)
    if (image == 0) {
        cudaFuncAttributes fa;
        const cudaError_t err = cudaFuncGetAttributes(&fa, combine_kernel);
        if (err != cudaSuccess) return err;
        image = fa.binaryVersion == 90 ? 1 : -1;
    }
    if (image < 0) return cudaErrorNoKernelImageForDevice;
    Params p = {};
    p.topk_ids = c->topk_ids;
    p.M = c->M;
    p.top_k = c->top_k;
    p.H = c->H;
    p.E = E;
    p.partial = const_cast<float *>(partial);
    p.out = c->out;
    p.out_dtype = c->out_dtype;
    const size_t n = (size_t)c->M * c->H, blocks = (n + 255) / 256;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(blocks < 4096 ? blocks : 4096));
    cfg.blockDim = dim3(256);
    cfg.stream = stream;
    return cudaLaunchKernelEx(&cfg, combine_kernel, p);
}
