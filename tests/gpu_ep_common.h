/*
 * gpu_ep_common.h - what the two GPU EP tests share (tests/gpu_ep.c over NCCL, one process per GPU;
 * tests/gpu_ep_loopback.c, every rank on one GPU): the single-GPU plan run on host tensors, the
 * reference every EP result is compared with, and the uneven routing of the "one rank gets most
 * tokens" cases. Test code only: included by those two files.
 */
#ifndef NVFP4MOE_GPU_EP_COMMON_H
#define NVFP4MOE_GPU_EP_COMMON_H

#include "nvfp4moe_experimental.h"

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

/* The single-GPU plan on host tensors: copies in, runs, copies the output back. */
static nvfp4moe_status single_gpu(nvfp4moe_plan *plan, const nvfp4moe_config *c, int64_t M, const void *hidden,
                                  const float *logits, const int32_t *ids, const float *wts, void *out) {
    const int64_t H = c->hidden_size, E = c->num_experts, K = c->top_k;
    const size_t hb = (size_t)(M * H) * nvfp4moe_dtype_size(c->in_dtype), ob = (size_t)(M * H) * nvfp4moe_dtype_size(c->out_dtype);
    const size_t ws = nvfp4moe_plan_workspace_size(plan, M);
    void *dh = NULL, *dl = NULL, *di = NULL, *dw = NULL, *dout = NULL, *dws = NULL;
    nvfp4moe_status st = NVFP4MOE_ERR_CUDA;
    if (M == 0) return NVFP4MOE_OK;
    if (cudaMalloc(&dh, hb) || cudaMalloc(&dout, ob) || (ws && cudaMalloc(&dws, ws)) ||
        cudaMemcpy(dh, hidden, hb, cudaMemcpyHostToDevice))
        goto out;
    if (logits && (cudaMalloc(&dl, sizeof(float) * (size_t)(M * E)) ||
                   cudaMemcpy(dl, logits, sizeof(float) * (size_t)(M * E), cudaMemcpyHostToDevice)))
        goto out;
    if (ids && (cudaMalloc(&di, sizeof(int32_t) * (size_t)(M * K)) || cudaMalloc(&dw, sizeof(float) * (size_t)(M * K)) ||
                cudaMemcpy(di, ids, sizeof(int32_t) * (size_t)(M * K), cudaMemcpyHostToDevice) ||
                cudaMemcpy(dw, wts, sizeof(float) * (size_t)(M * K), cudaMemcpyHostToDevice)))
        goto out;
    nvfp4moe_io io = {.num_tokens = M, .hidden = dh, .router_logits = dl, .topk_ids = di, .topk_weights = dw,
                      .output = dout, .workspace = dws, .workspace_size = ws};
    st = nvfp4moe_plan_forward(plan, &io, NULL);
    if (st == NVFP4MOE_OK && (cudaDeviceSynchronize() || cudaMemcpy(out, dout, ob, cudaMemcpyDeviceToHost)))
        st = NVFP4MOE_ERR_CUDA;
out:
    cudaFree(dh); cudaFree(dl); cudaFree(di); cudaFree(dw); cudaFree(dout); cudaFree(dws);
    return st;
}

/* ~7/8 of the pairs to rank 0's experts, the rest to any expert but the last rank's; distinct
 * experts per token; positive weights summing to 1. */
static void uneven_ids(const nvfp4moe_config *c, int32_t ranks, int64_t m, uint64_t seed, int32_t *ids, float *wts) {
    const int32_t E = c->num_experts, K = c->top_k, L = E / ranks;
    uint64_t s = seed;
    for (int64_t t = 0; t < m; t++) {
        float sum = 0;
        for (int32_t j = 0; j < K; j++) {
            int32_t e;
            for (;;) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                const bool hot = (s >> 33) % 8 != 0;
                e = hot ? (int32_t)((s >> 17) % (uint64_t)L) : (int32_t)((s >> 17) % (uint64_t)(E - L));
                bool dup = false;
                for (int32_t q = 0; q < j; q++) dup |= ids[t * K + q] == e;
                if (!dup) break;
            }
            ids[t * K + j] = e;
            wts[t * K + j] = 0.25f + (float)((s >> 40) % 1000) / 1000.0f;
            sum += wts[t * K + j];
        }
        for (int32_t j = 0; j < K; j++) wts[t * K + j] /= sum;
    }
}

#endif // NVFP4MOE_GPU_EP_COMMON_H
