/*
 * dispatch.c - expert parallelism's data movement plans, independent of any transport: the expert
 * partition, the dispatch plan of a rank's (token, slot) pairs in the standard and batched formats,
 * and the combine of the returned rows.
 */
#include "ep/ep_internal.h"

#include <stdlib.h>
#include <string.h>


const char *nvfp4moe_ep_format_name(nvfp4moe_ep_format f) {
    switch (f) {
    case NVFP4MOE_EP_STANDARD: return "standard";
    case NVFP4MOE_EP_BATCHED: return "batched";
    }
    return "?";
}

/* The oracle reads the same rule (nvfp4moe_config_batched_format), so the run and the verdict
 * cannot disagree. */
nvfp4moe_ep_format nvfp4moe_ep_format_of(const nvfp4moe_config *cfg) {
    return nvfp4moe_config_batched_format(cfg) ? NVFP4MOE_EP_BATCHED : NVFP4MOE_EP_STANDARD;
}

nvfp4moe_status nvfp4moe_ep_partition_of(const nvfp4moe_config *cfg, nvfp4moe_ep_partition *out) {
    NVFP4MOE_RETURN_IF(!cfg || !out, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_ep_partition_of: %s is NULL",
                       !cfg ? "cfg" : "out");
    const nvfp4moe_parallel *p = &cfg->parallel;
    NVFP4MOE_RETURN_IF(p->ep_size < 1, NVFP4MOE_ERR_INVALID_ARGUMENT, "parallel.ep_size=%d must be >= 1",
                       p->ep_size);
    NVFP4MOE_RETURN_IF(p->ep_rank < 0 || p->ep_rank >= p->ep_size, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "parallel.ep_rank=%d must be in [0, ep_size=%d)", p->ep_rank, p->ep_size);
    NVFP4MOE_RETURN_IF(cfg->num_experts < 1 || cfg->num_experts % p->ep_size, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "num_experts=%d must be a positive multiple of parallel.ep_size=%d", cfg->num_experts,
                       p->ep_size);
    out->ep_size = p->ep_size;
    out->ep_rank = p->ep_rank;
    out->num_experts = cfg->num_experts;
    out->local_experts = cfg->num_experts / p->ep_size;
    out->first_expert = p->ep_rank * out->local_experts;
    return NVFP4MOE_OK;
}

// ---- dispatch plans ----

void nvfp4moe_ep_dispatch_free(nvfp4moe_ep_dispatch *d) {
    if (!nvfp4moe_handle_remove(d, NVFP4MOE_HANDLE_EP_DISPATCH)) return;   // NULL, freed already, or not ours
    free(d->send_counts); free(d->send_offsets); free(d->pair_row); free(d->row_expert); free(d->row_pair);
    free(d->expert_counts);
    free(d);
}

nvfp4moe_status nvfp4moe_ep_dispatch_build(const nvfp4moe_ep_partition *part, nvfp4moe_ep_format format,
                                           int64_t max_tokens, const int32_t *topk_ids, int64_t num_tokens,
                                           int32_t top_k, nvfp4moe_ep_dispatch **out) {
    NVFP4MOE_RETURN_IF(!part || !out, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_ep_dispatch_build: %s is NULL",
                       !part ? "part" : "out");
    NVFP4MOE_RETURN_IF(num_tokens < 0 || top_k < 1, NVFP4MOE_ERR_SHAPE,
                       "ep dispatch: num_tokens=%lld must be >= 0 and top_k=%d >= 1", (long long)num_tokens, top_k);
    NVFP4MOE_RETURN_IF(num_tokens > 0 && !topk_ids, NVFP4MOE_ERR_INVALID_ARGUMENT, "ep dispatch: topk_ids is NULL");
    NVFP4MOE_RETURN_IF(format != NVFP4MOE_EP_STANDARD && format != NVFP4MOE_EP_BATCHED,
                       NVFP4MOE_ERR_INVALID_ARGUMENT, "ep dispatch: format=%d is not a format", (int)format);
    NVFP4MOE_RETURN_IF(format == NVFP4MOE_EP_BATCHED && max_tokens < 1, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "ep dispatch: max_tokens=%lld must be >= 1 for the batched format", (long long)max_tokens);
    const int64_t R = part->ep_size, L = part->local_experts, P = num_tokens * top_k, E = part->num_experts;
    for (int64_t p = 0; p < P; p++)
        NVFP4MOE_RETURN_IF(topk_ids[p] < 0 || topk_ids[p] >= E, NVFP4MOE_ERR_INVALID_ARGUMENT,
                           "topk_ids[%lld][%lld]=%d is not an expert in [0, %lld)", (long long)(p / top_k),
                           (long long)(p % top_k), topk_ids[p], (long long)E);

    nvfp4moe_ep_dispatch *d = calloc(1, sizeof *d);
    NVFP4MOE_RETURN_IF(!d, NVFP4MOE_ERR_OUT_OF_MEMORY, "ep dispatch: out of memory");
    if (nvfp4moe_handle_add(d, NVFP4MOE_HANDLE_EP_DISPATCH) != NVFP4MOE_OK) {
        free(d);
        return NVFP4MOE_ERR_OUT_OF_MEMORY;
    }
    d->format = format;
    d->ep_size = (int32_t)R;
    d->local_experts = (int32_t)L;
    d->top_k = top_k;
    d->num_tokens = num_tokens;
    d->max_tokens = format == NVFP4MOE_EP_BATCHED ? max_tokens : 0;
    d->send_counts = calloc((size_t)R, sizeof(int64_t));
    d->send_offsets = calloc((size_t)R + 1, sizeof(int64_t));
    d->pair_row = malloc(sizeof(int64_t) * (size_t)(P + 1));
    d->expert_counts = calloc((size_t)(R * L), sizeof(int64_t));
    if (!d->send_counts || !d->send_offsets || !d->pair_row || !d->expert_counts) {
        nvfp4moe_ep_dispatch_free(d);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "ep dispatch: out of memory for %lld pairs",
                                  (long long)P);
    }
    for (int64_t p = 0; p < P; p++) d->expert_counts[topk_ids[p]]++;   /* rank-major = global id order */
    if (format == NVFP4MOE_EP_BATCHED) {
        for (int64_t e = 0; e < R * L; e++) {
            if (d->expert_counts[e] > max_tokens) {
                int64_t n = d->expert_counts[e];
                nvfp4moe_ep_dispatch_free(d);
                return nvfp4moe_set_error(NVFP4MOE_ERR_BUFFER_TOO_SMALL,
                                          "batched dispatch: expert %lld (local expert %lld of rank %lld) gets %lld "
                                          "tokens from this rank, max_tokens=%lld",
                                          (long long)e, (long long)(e % L), (long long)(e / L), (long long)n,
                                          (long long)max_tokens);
            }
        }
        for (int64_t r = 0; r < R; r++) d->send_counts[r] = L * max_tokens;
    } else {
        for (int64_t p = 0; p < P; p++) d->send_counts[topk_ids[p] / L]++;
    }
    for (int64_t r = 0; r < R; r++) d->send_offsets[r + 1] = d->send_offsets[r] + d->send_counts[r];
    const int64_t rows = d->send_offsets[R];
    d->row_expert = malloc(sizeof(int32_t) * (size_t)(rows + 1));
    d->row_pair = malloc(sizeof(int64_t) * (size_t)(rows + 1));
    int64_t *fill = calloc((size_t)(R * L), sizeof(int64_t));
    if (!d->row_expert || !d->row_pair || !fill) {
        free(fill);
        nvfp4moe_ep_dispatch_free(d);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "ep dispatch: out of memory for %lld rows",
                                  (long long)rows);
    }
    if (format == NVFP4MOE_EP_BATCHED) {
        /* Every expert block has max_tokens rows; rows past the expert's count are padding. */
        for (int64_t i = 0; i < rows; i++) {
            d->row_expert[i] = -1;
            d->row_pair[i] = -1;
        }
        for (int64_t p = 0; p < P; p++) {
            const int64_t g = topk_ids[p], r = g / L, e = g % L;
            const int64_t row = d->send_offsets[r] + e * max_tokens + fill[g]++;
            d->pair_row[p] = row;
            d->row_expert[row] = (int32_t)e;
            d->row_pair[row] = p;
        }
    } else {
        /* Token order (then slot order) within each destination: deterministic and stable. */
        for (int64_t p = 0; p < P; p++) {
            const int64_t r = topk_ids[p] / L;
            const int64_t row = d->send_offsets[r] + fill[r]++;
            d->pair_row[p] = row;
            d->row_expert[row] = (int32_t)(topk_ids[p] % L);
            d->row_pair[row] = p;
        }
    }
    free(fill);
    *out = d;
    return NVFP4MOE_OK;
}

void nvfp4moe_ep_combine(const nvfp4moe_ep_dispatch *d, const float *rows, int64_t hidden,
                         const float *topk_weights, nvfp4moe_dtype out_dtype, void *out) {
    const int64_t M = d->num_tokens, K = d->top_k, H = hidden;
    float *acc = malloc(sizeof(float) * (size_t)(H + 1));
    const size_t osz = nvfp4moe_dtype_size(out_dtype);
    for (int64_t t = 0; t < M; t++) {
        /* Without scratch memory, the row is written per element (same arithmetic, slower). */
        for (int64_t n = 0; n < H; n++) {
            float a = 0.0f;
            for (int64_t j = 0; j < K; j++) {
                const float c = topk_weights ? topk_weights[t * K + j] : 1.0f;
                a += c * rows[d->pair_row[t * K + j] * H + n];
            }
            if (acc) acc[n] = a;
            else nvfp4moe_from_float(out_dtype, &a, 1, (char *)out + (size_t)(t * H + n) * osz);
        }
        if (acc) nvfp4moe_from_float(out_dtype, acc, H, (char *)out + (size_t)(t * H) * osz);
    }
    free(acc);
}
