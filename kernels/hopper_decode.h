/*
 * hopper_decode.h - the C interface of the HOPPER_WGMMA backend's small-batch (decode) kernels
 * (kernels/hopper_decode.cu): a fused GEMM1 + activation and a fused GEMM2 + router weight +
 * top-k combine, over the weights packed by nvfp4moe_hopper_repack (kernels/hopper_gemm.h) and
 * the token grouping of kernels/moe_gemm.h. Plain C, C linkage; includable from C and CUDA. All
 * pointers are device pointers. No allocation, no host synchronization, no host branching on
 * device data: both launches can be captured in a CUDA graph.
 *
 * Runs on compute capability 9.0 (built for sm_90a); elsewhere the launchers return
 * cudaErrorNoKernelImageForDevice and launch nothing.
 */
#ifndef NVFP4MOE_HOPPER_DECODE_H
#define NVFP4MOE_HOPPER_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "pipeline.h"  // nvfp4moe_gpu_act_params, nvfp4moe_gpu_route_params

#ifdef __cplusplus
extern "C" {
#endif

/* One projection's GEMM over the grouped pairs (fields as in nvfp4moe_marlin_args):
 * D[p, n] = scale_2[e] * (A[p / a_row_div, :] . dequant(W_e)[n, :]) + bias[e, n]. */
typedef struct nvfp4moe_decode_gemm {
    const void *a;              /* activations, bf16 or fp16, rows of K values, 16-byte aligned */
    int32_t a_row_div;          /* pair p reads A row p / a_row_div */
    const void *w;              /* weights packed by nvfp4moe_hopper_repack ([E, N, K]) */
    const float *scale_2;       /* [E], or [E, 2] (gate, up) when scale_2_halves != 0 */
    const float *bias;          /* [E, N] or NULL */
    const int32_t *sorted_ids, *block_expert, *num_blocks;
    int32_t P, N, K, E;
    int32_t block_m;            /* nvfp4moe_hopper_decode_block_m(...): 8 or 16 */
    int32_t max_blocks;         /* grid bound: cap / block_m */
    int32_t is_bf16;
    int32_t sm_count;
    int32_t warps_per_item;     /* 0: chosen on the device from the item count (the default); 1, 2 or 4
                                   forces it (tests), never above the k tiles of K */
    int32_t scale_2_halves;     /* GEMM1 of a gated activation: nonzero when scale_2 is [E, 2], the
                                   gate rows taking [2 e] and the up rows [2 e + 1] (as in
                                   nvfp4moe_marlin_args: 1 stacked halves, 2 interleaved) */
    int32_t prefetch_tiles;     /* k tiles (of 128) each warp prefetches into L2 ahead of its loads,
                                   0 .. NVFP4MOE_DECODE_MAX_PREFETCH (0: none) */
    int32_t pdl;                /* nonzero: launched with programmatic dependent launch, so its
                                   launch and prologue overlap the kernel ahead in the stream. Then
                                   GEMM1's kernel ahead must have been launched without PDL (the
                                   grouping kernel, or one after it; none of them may touch the
                                   counters), and GEMM2 must come right after GEMM1 on the same
                                   stream */
    int32_t room_per_sm;        /* CTA slots per multiprocessor the persistent grid leaves free
                                   (0: it takes all that fit, at least one CTA always runs); on
                                   GEMM1 they let GEMM2's CTAs start beside it */
    int32_t expert_prefetch_chunks; /* GEMM2: weight chunks (of 9216 bytes) of the active experts,
                                   in block order, prefetched into L2 by the grid before it waits
                                   for GEMM1 (0: none) */
} nvfp4moe_decode_gemm;

/* Upper bound of nvfp4moe_decode_gemm.prefetch_tiles. */
#define NVFP4MOE_DECODE_MAX_PREFETCH 16
/* Bytes of one packed weight chunk (128 rows x 128 k: codes and scales), the unit of
 * expert_prefetch_chunks. */
#define NVFP4MOE_DECODE_CHUNK_BYTES 9216

/* The layer's output and the top-k combine state shared by the two launches. */
typedef struct nvfp4moe_decode_combine {
    const int32_t *topk_ids;    /* [M, top_k]: slots with ids outside [0, E) contribute nothing */
    int32_t M, top_k, H;
    int32_t *counters;          /* nvfp4moe_hopper_decode_counters(M, H) ints; GEMM1 zeroes them */
    int32_t deferred;           /* nonzero: GEMM2 only parks each slot's row in partial, and
                                   nvfp4moe_hopper_decode_combine sums them after it */
    void *out;                  /* [M, H] of out_dtype (nvfp4moe_dtype) */
    int32_t out_dtype;
} nvfp4moe_decode_combine;

/* The most token-expert pairs per expert, on average, that the decode regime takes; beyond it
 * the wgmma GEMM runs, at block_m 32 or 64 (nvfp4moe_hopper_block_m starts there). */
#define NVFP4MOE_DECODE_MAX_PAIRS_PER_EXPERT 3

/* block_m of the decode regime for P pairs over E experts: 8 (one 8-token MMA column) up to
 * NVFP4MOE_DECODE_MAX_PAIRS_PER_EXPERT pairs per expert, else 0: the wgmma GEMM should run. A
 * caller may force either block_m (8, or 16: two columns) at any size. */
int32_t nvfp4moe_hopper_decode_block_m(int64_t P, int32_t E);

/* Ints of the combine's arrival counters for M tokens of hidden size H. */
size_t nvfp4moe_hopper_decode_counters(int64_t M, int32_t H);

/* GEMM1 with the activation in its epilogue: act_out[p, i] = act(gate, up) of g (N = N1 rows:
 * gate rows [0, I) and up rows [I, 2I), or interleaved g0,u0,g1,u1.. for SWIGLUOAI, or I rows for
 * the non-gated activations), rounded to the 16-bit dtype. Also zeroes c->counters and writes
 * zero output rows for tokens none of whose slots names an expert in [0, E). */
cudaError_t nvfp4moe_hopper_decode_gemm1(const nvfp4moe_decode_gemm *g, const nvfp4moe_gpu_act_params *act,
                                         int32_t I, void *act_out, const nvfp4moe_decode_combine *c,
                                         cudaStream_t stream);

/* GEMM1 that also routes and groups a few tokens itself (nvfp4moe_hopper_decode_route_gemm1):
 * every CTA routes the M tokens (the routing of nvfp4moe_gpu_route_and_group: the same ids and
 * weights, bit for bit) or reads the caller's top-k, and groups the pairs in shared memory in the
 * grouping kernel's layout (blocks in expert order; within an expert, pairs in pair order where
 * the kernel's order follows its atomics); so no routing or grouping launch runs ahead of it. It
 * also writes what GEMM2 reads: the ids and weights (when it routes) and the grouping. */
typedef struct nvfp4moe_decode_route {
    const nvfp4moe_gpu_route_params *rp;  /* the router; NULL: c->topk_ids are the caller's top-k */
    const void *logits;                   /* [M, E] router logits (rp != NULL; unused when simulated) */
    int32_t *topk_ids;                    /* rp != NULL: [M, top_k] written; must be c->topk_ids */
    float *topk_weights;                  /* rp != NULL: [M, top_k] written */
    int32_t *sorted_ids, *block_expert, *num_blocks;  /* the grouping, written: GEMM2's g arrays */
} nvfp4moe_decode_route;

/* The most tokens and (token, slot) pairs GEMM1 routes and groups itself. */
#define NVFP4MOE_DECODE_ROUTE_MAX_TOKENS 4
#define NVFP4MOE_DECODE_ROUTE_MAX_PAIRS 32

/* Nonzero when nvfp4moe_hopper_decode_route_gemm1 takes M tokens of top_k over E experts. */
int32_t nvfp4moe_hopper_decode_can_route(int64_t M, int32_t top_k, int32_t E);

/* nvfp4moe_hopper_decode_gemm1 with the routing and the grouping done inside (r), for
 * nvfp4moe_hopper_decode_can_route(c->M, c->top_k, g->E) (M >= 1): g->P = M * top_k,
 * g->max_blocks = nvfp4moe_group_capacity(P, E, block_m) / block_m (or more); g->sorted_ids,
 * block_expert and num_blocks must be non-NULL but are not read. Launched without PDL and without
 * the L2 prefetches (g->pdl, prefetch_tiles and room_per_sm are ignored); GEMM2 must then run
 * without PDL, after it. */
cudaError_t nvfp4moe_hopper_decode_route_gemm1(const nvfp4moe_decode_gemm *g, const nvfp4moe_decode_route *r,
                                               const nvfp4moe_gpu_act_params *act, int32_t I, void *act_out,
                                               const nvfp4moe_decode_combine *c, cudaStream_t stream);

/* GEMM2 with the combine in its epilogue (unless c->deferred): out[t, :] = sum over t's valid
 * slots j, in slot order, of row_scale[t*top_k + j] * D[t*top_k + j, :] (row_scale NULL: 1),
 * each slot's fp32 row parked in partial [P, H] until the last of the token's slots has arrived;
 * rounded once to out_dtype. Deterministic: the same inputs give the same bits. */
cudaError_t nvfp4moe_hopper_decode_gemm2(const nvfp4moe_decode_gemm *g, const float *row_scale, float *partial,
                                         const nvfp4moe_decode_combine *c, cudaStream_t stream);

/* The combine of a GEMM2 launched with c->deferred, as a kernel of its own after it: the same sums
 * in the same order, so the same bits as GEMM2's own combine. E: GEMM2's g->E (slots naming an
 * expert outside [0, E) contribute nothing); partial: the rows GEMM2 wrote. */
cudaError_t nvfp4moe_hopper_decode_combine(const nvfp4moe_decode_combine *c, const float *partial, int32_t E,
                                           cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* NVFP4MOE_HOPPER_DECODE_H */
