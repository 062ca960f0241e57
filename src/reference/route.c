/*
 * route.c - the reference router (vLLM fused_topk / grouped_topk, FlashInfer RoutingMethodType).
 *
 * Selection compares the raw logits wherever the score is a monotonic function of them (softmax,
 * sigmoid), so that every implementation that also compares logits selects bit-identically. Ties go
 * to the lower expert index. Weights are computed in float64.
 */
#include "core/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* Top-k of score[0..n) among allowed (NULL: all), by descending score, ties to the lower index. */
static void topk(const double *score, const bool *allowed, int32_t n, int32_t k, int32_t *ids) {
    int32_t found = 0;
    for (int32_t e = 0; e < n; e++) {
        if (allowed && !allowed[e]) continue;
        int32_t pos = found < k ? found : k;
        /* strict '>' keeps earlier (lower-index) experts ahead on ties */
        while (pos > 0 && score[e] > score[ids[pos - 1]]) pos--;
        if (pos >= k) continue;
        int32_t last = found < k ? found : k - 1;
        for (int32_t j = last; j > pos; j--) ids[j] = ids[j - 1];
        ids[pos] = e;
        if (found < k) found++;
    }
}

static void normalize(double *w, int32_t k) {
    double s = 0;
    for (int32_t j = 0; j < k; j++) s += w[j];
    for (int32_t j = 0; j < k; j++) w[j] = s > 0 ? w[j] / s : 0.0;
}

/* DeepSeek-V3 grouped top-k: the biased score picks groups and experts, the unbiased score is the
 * weight; a group scores the sum of its top-2 biased scores (its max without a bias). */
static void route_grouped(const nvfp4moe_config *cfg, const double *logit, const float *bias,
                          double *choice, double *scoreb, bool *allowed, int32_t *gsel, int32_t *ids,
                          double *w) {
    const int32_t E = cfg->num_experts, G = cfg->n_group, per = E / G;
    for (int32_t e = 0; e < E; e++) {
        scoreb[e] = sigmoid(logit[e]);
        choice[e] = scoreb[e] + (bias ? (double)bias[e] : 0.0);
    }
    double *group = choice + E;          /* the caller gave choice room for E + G values */
    for (int32_t g = 0; g < G; g++) {
        const double *c = choice + g * per;
        if (bias) {
            double a = -INFINITY, b = -INFINITY;
            for (int32_t j = 0; j < per; j++) {
                if (c[j] > a) { b = a; a = c[j]; }
                else if (c[j] > b) b = c[j];
            }
            group[g] = per >= 2 ? a + b : a;
        } else {
            double a = -INFINITY;
            for (int32_t j = 0; j < per; j++) if (c[j] > a) a = c[j];
            group[g] = a;
        }
    }
    topk(group, NULL, G, cfg->topk_group, gsel);
    for (int32_t e = 0; e < E; e++) allowed[e] = false;
    for (int32_t j = 0; j < cfg->topk_group; j++)
        for (int32_t e = gsel[j] * per; e < (gsel[j] + 1) * per; e++) allowed[e] = true;
    topk(choice, allowed, E, cfg->top_k, ids);
    for (int32_t j = 0; j < cfg->top_k; j++) w[j] = scoreb[ids[j]];
    normalize(w, cfg->top_k);
    for (int32_t j = 0; j < cfg->top_k; j++) w[j] *= cfg->routed_scaling_factor;
}

size_t nvfp4moe_route_scratch_bytes(const nvfp4moe_config *cfg) {
    const size_t E = (size_t)cfg->num_experts, G = (size_t)cfg->n_group, K = (size_t)cfg->top_k;
    return sizeof(double) * (3 * E + G + K) + sizeof(int32_t) * (K + G) + sizeof(bool) * E;
}

void nvfp4moe_route_token(const nvfp4moe_config *cfg, const float *logits, int64_t t, const float *correction_bias,
                          void *scratch, int32_t *topk_ids, float *topk_weights) {
    const int32_t E = cfg->num_experts, K = cfg->top_k;
    /* choice has E + n_group slots: route_grouped keeps the group scores after the experts. */
    double *logit = scratch, *score = logit + E, *choice = score + E, *w = choice + E + cfg->n_group;
    int32_t *ids = (int32_t *)(w + K), *gsel = ids + K;
    bool *allowed = (bool *)(gsel + cfg->n_group);
    const uint64_t rng = cfg->seed ^ 0x5151F00Dull;
    bool finite = true;
    if (logits)
        for (int32_t e = 0; e < E; e++) finite &= isfinite(logit[e] = logits[e]) != 0;
    if (!finite && cfg->routing != NVFP4MOE_ROUTING_SIMULATED) {
        // No ranking means anything with a NaN or an infinity in it: the token's weights are NaN,
        // which makes its output row NaN, and its ids the first top_k experts (valid indices).
        for (int32_t j = 0; j < K; j++) {
            topk_ids[j] = j;
            topk_weights[j] = NAN;
        }
        return;
    }
    switch (cfg->routing) {
    case NVFP4MOE_ROUTING_SOFTMAX_TOPK:
    case NVFP4MOE_ROUTING_RENORMALIZE:
    case NVFP4MOE_ROUTING_RENORMALIZE_NAIVE: {
        topk(logit, NULL, E, K, ids);
        double mx = logit[ids[0]], s = 0;
        if (cfg->routing == NVFP4MOE_ROUTING_RENORMALIZE) {
            /* top-k first, then softmax over the k selected logits */
            for (int32_t j = 0; j < K; j++) s += exp(logit[ids[j]] - mx);
        } else {
            for (int32_t e = 0; e < E; e++) s += exp(logit[e] - mx);
        }
        for (int32_t j = 0; j < K; j++) w[j] = exp(logit[ids[j]] - mx) / s;
        if (cfg->routing == NVFP4MOE_ROUTING_RENORMALIZE_NAIVE) normalize(w, K);
        break;
    }
    case NVFP4MOE_ROUTING_SIGMOID:
    case NVFP4MOE_ROUTING_SIGMOID_RENORM:
        topk(logit, NULL, E, K, ids);
        for (int32_t j = 0; j < K; j++) w[j] = sigmoid(logit[ids[j]]);
        if (cfg->routing == NVFP4MOE_ROUTING_SIGMOID_RENORM) normalize(w, K);
        break;
    case NVFP4MOE_ROUTING_LLAMA4:
        topk(logit, NULL, E, 1, ids);
        w[0] = sigmoid(logit[ids[0]]);
        break;
    case NVFP4MOE_ROUTING_DEEPSEEK_V3:
        route_grouped(cfg, logit, cfg->has_correction_bias ? correction_bias : NULL, choice, score, allowed, gsel, ids, w);
        break;
    case NVFP4MOE_ROUTING_MINIMAX2:
        for (int32_t e = 0; e < E; e++) {
            score[e] = sigmoid(logit[e]);
            choice[e] = score[e] + (cfg->has_correction_bias ? (double)correction_bias[e] : 0.0);
        }
        topk(choice, NULL, E, K, ids);
        for (int32_t j = 0; j < K; j++) w[j] = score[ids[j]];
        normalize(w, K);
        for (int32_t j = 0; j < K; j++) w[j] *= cfg->routed_scaling_factor;
        break;
    case NVFP4MOE_ROUTING_SIMULATED: {
        /* K distinct experts drawn uniformly (redrawing repeats), equal weights 1/K.
         * Deterministic in (seed, token); the logits are not read. */
        uint64_t st = rng ^ ((uint64_t)t * 0x9E3779B97F4A7C15ull);
        for (int32_t j = 0; j < K; j++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(nvfp4moe_rand_u64(&st) % (uint64_t)E);
                dup = false;
                for (int32_t q = 0; q < j; q++) dup |= ids[q] == e;
            } while (dup);
            ids[j] = e;
            w[j] = 1.0 / K;
        }
        break;
    }
    case NVFP4MOE_ROUTING_COUNT:
        break;
    }
    for (int32_t j = 0; j < K; j++) {
        topk_ids[j] = ids[j];
        topk_weights[j] = (float)w[j];
    }
}

nvfp4moe_status nvfp4moe_route(const nvfp4moe_config *cfg, const float *logits, int64_t M,
                               const float *correction_bias, int32_t *topk_ids, float *topk_weights) {
    NVFP4MOE_TRY(nvfp4moe_config_validate(cfg));
    NVFP4MOE_RETURN_IF(M < 0, NVFP4MOE_ERR_SHAPE, "num_tokens=%lld is negative", (long long)M);
    if (M == 0) return NVFP4MOE_OK;
    NVFP4MOE_RETURN_IF(!topk_ids || !topk_weights, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "nvfp4moe_route: %s is NULL", !topk_ids ? "topk_ids" : "topk_weights");
    NVFP4MOE_RETURN_IF(!logits && cfg->routing != NVFP4MOE_ROUTING_SIMULATED, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "nvfp4moe_route: router logits are NULL (only routing=simulated needs none)");
    NVFP4MOE_RETURN_IF(cfg->has_correction_bias && !correction_bias, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "has_correction_bias is set but the correction_bias tensor is NULL");
    void *scratch = malloc(nvfp4moe_route_scratch_bytes(cfg));
    NVFP4MOE_RETURN_IF(!scratch, NVFP4MOE_ERR_OUT_OF_MEMORY, "nvfp4moe_route: out of memory");
    const int64_t E = cfg->num_experts, K = cfg->top_k;
    for (int64_t t = 0; t < M; t++)
        nvfp4moe_route_token(cfg, logits ? logits + t * E : NULL, t, correction_bias, scratch, topk_ids + t * K,
                             topk_weights + t * K);
    free(scratch);
    return NVFP4MOE_OK;
}

int64_t nvfp4moe_hot_expert_logits(float *logits, int64_t M, int32_t E, int64_t hot, uint64_t seed, bool *is_hot) {
    const int64_t n = hot <= 0 || M <= 0 ? 0 : NVFP4MOE_MIN(hot, M);
    /* not the stream a caller drew the logits from with the same seed */
    uint64_t st = seed ^ 0x40775EEDull;
    int64_t need = n;
    for (int64_t t = 0; t < M; t++) {
        /* selection sampling (Knuth's algorithm S): token t is taken with probability need / (M - t),
         * in integers, so that exactly n are (the last ones surely when as many are still needed) */
        const bool take = need > 0 && nvfp4moe_rand_u64(&st) % (uint64_t)(M - t) < (uint64_t)need;
        if (is_hot) is_hot[t] = take;
        if (!take) continue;
        need--;
        float *row = logits + t * E;
        float top = -INFINITY;
        for (int32_t e = 1; e < E; e++) top = fmaxf(top, row[e]);
        if (E > 1) row[0] = top + 1.0f;   /* E == 1: expert 0 is every token's only choice already */
    }
    return n;
}
