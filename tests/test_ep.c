/*
 * test_ep.c - expert parallelism on the CPU: N ranks simulated by threads over the loopback
 * transport, each running its local experts on a CPU backend, against the single-rank output of
 * the same layer on the same tokens. CPU_FAST must match bit for bit (same dot products, same
 * slot-order float sum); CPU_REFERENCE (float64 sums on one rank, float32 combine under EP) to a
 * relative error of 1e-6. Both activation formats; uneven routing; ranks without tokens; batched
 * overflow; bad parallel configs; the oracle's EP verdicts.
 */
#include "harness.h"
#include "core/internal.h"
#include "nvfp4moe_experimental.h"

#include <pthread.h>

// ---- a simulated deployment ----

#define MAX_RANKS 8

typedef struct {
    nvfp4moe_config cfg;           /* global, parallel.ep_size set; ep_rank per thread */
    const nvfp4moe_layer *layer;
    const char *backend;           /* local backend forced (the oracle has no CPU EP backend) */
    int64_t max_tokens;            /* batched capacity */
    int64_t m[MAX_RANKS];          /* tokens of each rank */
    void *hidden[MAX_RANKS];       /* [m, H] in_dtype */
    float *logits[MAX_RANKS];      /* [m, E] or NULL when ids are given */
    int32_t *ids[MAX_RANKS];
    float *wts[MAX_RANKS];
    void *out[MAX_RANKS];          /* [m, H] out_dtype */
    nvfp4moe_ep_stats stats[MAX_RANKS];
    nvfp4moe_status st[MAX_RANKS];
    char msg[MAX_RANKS][512];
    nvfp4moe_ep_format format[MAX_RANKS];
} world;

static nvfp4moe_status rank_main(int32_t rank, const nvfp4moe_ep_transport *t, void *ctx) {
    world *w = ctx;
    nvfp4moe_config cfg = w->cfg;
    cfg.parallel.ep_rank = rank;
    nvfp4moe_device cpu;
    nvfp4moe_device_parse("cpu", &cpu);
    nvfp4moe_plan_options po = {.device = &cpu};
    nvfp4moe_ep_options eo = {.plan = &po, .local_backend = w->backend, .max_tokens = w->max_tokens};
    nvfp4moe_ep_plan *p = NULL;
    nvfp4moe_status st = nvfp4moe_ep_plan_create(&cfg, &w->layer->w, t, &eo, &p);
    if (st == NVFP4MOE_OK) {
        w->format[rank] = nvfp4moe_ep_plan_format(p);
        nvfp4moe_io io = {.num_tokens = w->m[rank], .hidden = w->hidden[rank], .router_logits = w->logits[rank],
                          .topk_ids = w->ids[rank], .topk_weights = w->wts[rank], .output = w->out[rank]};
        st = nvfp4moe_ep_forward(p, &io, &w->stats[rank]);
    }
    w->st[rank] = st;
    if (st != NVFP4MOE_OK) nvfp4moe_strlcpy(w->msg[rank], nvfp4moe_last_error(), sizeof w->msg[rank]);
    nvfp4moe_ep_plan_destroy(p);
    return st;
}

static nvfp4moe_status run_world(world *w, int32_t ranks) {
    nvfp4moe_ep_loopback *lb = NULL;
    nvfp4moe_status st = nvfp4moe_ep_loopback_create(ranks, &lb);
    if (st != NVFP4MOE_OK) return st;
    st = nvfp4moe_ep_loopback_run(lb, rank_main, w);
    nvfp4moe_ep_loopback_free(lb);
    return st;
}

/* Routing used by the uneven cases: pair j of token t goes to an expert of rank 0 with probability
 * ~7/8 (distinct experts per token), the rest spread. */
static void uneven_ids(const nvfp4moe_config *c, int64_t m, int32_t ranks, uint64_t seed, int32_t *ids, float *wts,
                       bool empty_last_rank) {
    const int32_t E = c->num_experts, K = c->top_k, L = E / ranks;
    uint64_t s = seed;
    for (int64_t t = 0; t < m; t++) {
        float sum = 0;
        for (int32_t j = 0; j < K; j++) {
            int32_t e;
            for (;;) {
                bool hot = nvfp4moe_rand_uniform(&s) < 0.875;
                e = hot ? (int32_t)(nvfp4moe_rand_u64(&s) % (uint64_t)L)
                        : (int32_t)(nvfp4moe_rand_u64(&s) % (uint64_t)(empty_last_rank ? E - L : E));
                bool dup = false;
                for (int32_t q = 0; q < j; q++) dup |= ids[t * K + q] == e;
                if (!dup || K > L) break;   /* K > L: duplicates cannot be avoided inside rank 0 */
            }
            ids[t * K + j] = e;
            wts[t * K + j] = 0.25f + (float)nvfp4moe_rand_uniform(&s);
            sum += wts[t * K + j];
        }
        for (int32_t j = 0; j < K; j++) wts[t * K + j] /= sum;
    }
}

/* Fills rank inputs, runs the single-rank plan on each rank's tokens (the expected output), runs
 * the EP world, compares. bitwise: CPU_FAST; else rel err 1e-6. */
static void ep_case(const char *name, const nvfp4moe_config *base, int32_t ranks, const char *backend,
                    int64_t max_tokens, const int64_t *m, bool given_ids, bool empty_last_rank, bool bitwise) {
    T_CASE(name);
    nvfp4moe_layer *layer = NULL;
    nvfp4moe_config c1 = *base;
    c1.parallel.ep_size = 1;
    c1.parallel.dp_size = 1;
    c1.parallel.all2all[0] = '\0';
    CHECK_OK(nvfp4moe_layer_random(&c1, 1234, &layer));
    if (!layer) return;
    /* Input scales that differ per expert (random layers calibrate them alike): W4A4's activation
     * global scale is the maximum over all experts, which each rank's local layer must keep. */
    if (layer->w.w13_input_scale && layer->w.w2_input_scale)
        for (int64_t e = 0; e < c1.num_experts; e++) {
            ((float *)layer->w.w13_input_scale)[e] *= 1.0f + 0.37f * (float)((e * 7) % 5);
            ((float *)layer->w.w2_input_scale)[e] *= 1.0f + 0.29f * (float)((e * 3) % 7);
        }
    /* And gate/up halves with global scales of their own: each rank's local layer slices both. */
    float *up = malloc(sizeof(float) * (size_t)c1.num_experts);
    for (int64_t e = 0; e < c1.num_experts; e++) up[e] = layer->w.w13_scale_2[e] * (1.0f + 0.5f * (float)(e % 3));
    layer->w.w13_up_scale_2 = up;
    world *w = calloc(1, sizeof *w);
    w->cfg = *base;
    w->cfg.parallel.ep_size = ranks;
    w->layer = layer;
    w->backend = backend;
    w->max_tokens = max_tokens;
    const int64_t H = base->hidden_size, E = base->num_experts, K = base->top_k;
    const size_t isz = nvfp4moe_dtype_size(base->in_dtype), osz = nvfp4moe_dtype_size(base->out_dtype);
    void *want[MAX_RANKS] = {0};
    nvfp4moe_device cpu;
    nvfp4moe_device_parse("cpu", &cpu);
    nvfp4moe_plan *single = NULL;
    nvfp4moe_plan_options po = {.device = &cpu, .backend = backend};
    CHECK_OK(nvfp4moe_plan_create(&c1, &layer->w, &po, &single));
    for (int32_t r = 0; r < ranks; r++) {
        w->m[r] = m[r];
        w->hidden[r] = malloc((size_t)(m[r] * H) * isz + 1);
        w->out[r] = calloc((size_t)(m[r] * H) + 1, osz);
        want[r] = calloc((size_t)(m[r] * H) + 1, osz);
        nvfp4moe_fill_normal(w->hidden[r], base->in_dtype, m[r] * H, 100 + (uint64_t)r);
        if (given_ids) {
            w->ids[r] = malloc(sizeof(int32_t) * (size_t)(m[r] * K) + 4);
            w->wts[r] = malloc(sizeof(float) * (size_t)(m[r] * K) + 4);
            uneven_ids(base, m[r], ranks, 77 + (uint64_t)r, w->ids[r], w->wts[r], empty_last_rank);
        } else {
            w->logits[r] = malloc(sizeof(float) * (size_t)(m[r] * E) + 4);
            nvfp4moe_fill_normal(w->logits[r], NVFP4MOE_DTYPE_F32, m[r] * E, 200 + (uint64_t)r);
        }
        nvfp4moe_io io = {.num_tokens = m[r], .hidden = w->hidden[r], .router_logits = w->logits[r],
                          .topk_ids = w->ids[r], .topk_weights = w->wts[r], .output = want[r]};
        if (single) CHECK_OK(nvfp4moe_plan_forward(single, &io, NULL));
    }
    nvfp4moe_status st = run_world(w, ranks);
    CHECK(st == NVFP4MOE_OK, "EP run failed: %s", nvfp4moe_last_error());
    if (st == NVFP4MOE_OK) {
        int64_t sent = 0, received = 0;
        for (int32_t r = 0; r < ranks; r++) {
            CHECK(w->format[r] == nvfp4moe_ep_format_of(&w->cfg), "rank %d ran the %s format", r,
                  nvfp4moe_ep_format_name(w->format[r]));
            sent += w->stats[r].rows_sent;
            received += w->stats[r].rows_received;
            if (m[r] == 0) continue;
            if (bitwise) {
                check_bytes("EP output vs single rank", w->out[r], want[r], (size_t)(m[r] * H) * osz);
            } else {
                float *got = malloc(sizeof(float) * (size_t)(m[r] * H));
                float *wf = malloc(sizeof(float) * (size_t)(m[r] * H));
                double *wd = malloc(sizeof(double) * (size_t)(m[r] * H));
                nvfp4moe_to_float(base->out_dtype, w->out[r], m[r] * H, got);
                nvfp4moe_to_float(base->out_dtype, want[r], m[r] * H, wf);
                for (int64_t i = 0; i < m[r] * H; i++) wd[i] = wf[i];
                check_rel_l2("EP output vs single rank", got, wd, (size_t)(m[r] * H), 1e-6);
                free(got); free(wf); free(wd);
            }
        }
        CHECK(sent == received, "rows sent %lld != rows received %lld", (long long)sent, (long long)received);
        /* The all-to-all accounting (bench --ep's bandwidth): X rows cross ranks; the combine sends
         * each back as float32 (the CPU backends' local output); the dispatch sends them in
         * in_dtype, plus (standard) their int32 expert ids, plus per peer the counts (int64, one per
         * peer or per local expert) and the int32 agreement. Exact, summed over the ranks. */
        const int64_t L = E / ranks;
        const bool batched = nvfp4moe_ep_format_of(&w->cfg) == NVFP4MOE_EP_BATCHED;
        size_t dsum = 0, csum = 0;
        for (int32_t r = 0; r < ranks; r++) {
            const nvfp4moe_ep_stats *S = &w->stats[r];
            dsum += S->dispatch_bytes_remote;
            csum += S->combine_bytes_remote;
            CHECK(S->dispatch_xfer_s >= 0 && S->dispatch_xfer_s <= S->dispatch_s && S->combine_xfer_s >= 0 &&
                      S->combine_xfer_s <= S->combine_s,
                  "rank %d: all-to-all time %g/%g s outside its stage %g/%g s", r, S->dispatch_xfer_s,
                  S->combine_xfer_s, S->dispatch_s, S->combine_s);
        }
        const size_t X = csum / (size_t)(H * 4);
        CHECK(csum % (size_t)(H * 4) == 0, "combine remote bytes %zu are not whole float32 rows of %lld", csum,
              (long long)H);
        if (batched)
            CHECK(X == (size_t)(ranks * (ranks - 1) * L * max_tokens), "batched: %zu rows crossed ranks, want %lld", X,
                  (long long)(ranks * (ranks - 1) * L * max_tokens));
        const size_t want_d = X * (size_t)H * isz + (batched ? 0 : X * 4) +
                              (size_t)(ranks * (ranks - 1)) * ((batched ? (size_t)L : 1) * 8 + 4);
        CHECK(dsum == want_d, "dispatch remote bytes %zu, want %zu (%zu rows crossing ranks)", dsum, want_d, X);
        if (ranks > 1 && !batched) {
            int64_t pairs = 0;
            for (int32_t r = 0; r < ranks; r++) pairs += m[r] * K;
            CHECK(X > 0 && (int64_t)X <= pairs, "%zu rows crossed ranks of %lld pairs", X, (long long)pairs);
        }
    }
    for (int32_t r = 0; r < ranks; r++) {
        free(w->hidden[r]); free(w->out[r]); free(want[r]); free(w->logits[r]); free(w->ids[r]); free(w->wts[r]);
    }
    nvfp4moe_plan_destroy(single);
    nvfp4moe_layer_free(layer);
    free(up);
    free(w);
}

static nvfp4moe_config small_cfg(void) {
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);
    c.num_experts = 16;
    c.top_k = 3;
    c.hidden_size = 64;
    c.intermediate_size = 32;
    c.in_dtype = NVFP4MOE_DTYPE_F32;
    c.out_dtype = NVFP4MOE_DTYPE_F32;
    return c;
}

static void set_batched(nvfp4moe_config *c) {
    c->parallel.dp_size = 2;
    nvfp4moe_strlcpy(c->parallel.all2all, "deepep_low_latency", sizeof c->parallel.all2all);
}

// ---- the pieces ----

static void test_partition_and_dispatch(void) {
    T_CASE("partition");
    nvfp4moe_config c = small_cfg();
    c.parallel.ep_size = 4;
    c.parallel.ep_rank = 2;
    nvfp4moe_ep_partition p;
    CHECK_OK(nvfp4moe_ep_partition_of(&c, &p));
    CHECK(p.local_experts == 4 && p.first_expert == 8, "local %d first %d", p.local_experts, p.first_expert);
    CHECK(nvfp4moe_ep_owner(&p, 0) == 0 && nvfp4moe_ep_owner(&p, 7) == 1 && nvfp4moe_ep_owner(&p, 15) == 3,
          "owners of 0/7/15: %d %d %d", nvfp4moe_ep_owner(&p, 0), nvfp4moe_ep_owner(&p, 7), nvfp4moe_ep_owner(&p, 15));

    T_CASE("bad parallel configs");
    c.parallel.ep_size = 3;
    c.parallel.ep_rank = 0;
    CHECK_ERR(nvfp4moe_ep_partition_of(&c, &p), NVFP4MOE_ERR_INVALID_ARGUMENT, "parallel.ep_size=3");
    c.parallel.ep_size = 4;
    c.parallel.ep_rank = 4;
    CHECK_ERR(nvfp4moe_ep_partition_of(&c, &p), NVFP4MOE_ERR_INVALID_ARGUMENT, "parallel.ep_rank=4");
    c.parallel.ep_rank = -1;
    CHECK_ERR(nvfp4moe_ep_partition_of(&c, &p), NVFP4MOE_ERR_INVALID_ARGUMENT, "parallel.ep_rank=-1");
    c.parallel.ep_size = 0;
    c.parallel.ep_rank = 0;
    CHECK_ERR(nvfp4moe_ep_partition_of(&c, &p), NVFP4MOE_ERR_INVALID_ARGUMENT, "parallel.ep_size=0");

    T_CASE("dispatch standard");
    c.parallel.ep_size = 4;
    c.parallel.ep_rank = 1;
    CHECK_OK(nvfp4moe_ep_partition_of(&c, &p));
    /* 3 tokens, top-2: pairs 0..5 -> experts 5 0 | 15 4 | 1 6 -> ranks 1 0 | 3 1 | 0 1 */
    const int32_t ids[] = {5, 0, 15, 4, 1, 6};
    nvfp4moe_ep_dispatch *d = NULL;
    CHECK_OK(nvfp4moe_ep_dispatch_build(&p, NVFP4MOE_EP_STANDARD, 0, ids, 3, 2, &d));
    if (d) {
        const int64_t counts[] = {2, 3, 0, 1}, rows[] = {2, 0, 5, 3, 1, 4};
        const int32_t lexp[] = {0, 1, 1, 0, 2, 3};
        for (int r = 0; r < 4; r++) CHECK(d->send_counts[r] == counts[r], "send_counts[%d]=%lld", r, (long long)d->send_counts[r]);
        for (int q = 0; q < 6; q++) CHECK(d->pair_row[q] == rows[q], "pair_row[%d]=%lld want %lld", q, (long long)d->pair_row[q], (long long)rows[q]);
        for (int q = 0; q < 6; q++) CHECK(d->row_expert[q] == lexp[q], "row_expert[%d]=%d want %d", q, d->row_expert[q], lexp[q]);
        CHECK(d->expert_counts[5] == 1 && d->expert_counts[0] == 1 && d->expert_counts[15] == 1, "expert counts");

        T_CASE("combine");
        /* rows hold (row index + 1) in every column: out[t] = sum_j w * (pair_row + 1) in slot order */
        float rowsbuf[6 * 16], out[3 * 16];
        const float w[] = {0.5f, 0.25f, 1.0f, 2.0f, -1.0f, 3.0f};
        for (int i = 0; i < 6 * 16; i++) rowsbuf[i] = (float)(i / 16 + 1);
        nvfp4moe_ep_combine(d, rowsbuf, 16, w, NVFP4MOE_DTYPE_F32, out);
        const float want[] = {0.5f * 3 + 0.25f * 1, 1.0f * 6 + 2.0f * 4, -1.0f * 2 + 3.0f * 5};
        for (int t = 0; t < 3; t++) CHECK(out[t * 16 + 7] == want[t], "out[%d]=%g want %g", t, (double)out[t * 16 + 7], (double)want[t]);
        nvfp4moe_ep_combine(d, rowsbuf, 16, NULL, NVFP4MOE_DTYPE_F32, out);
        CHECK(out[0] == 4.0f && out[16] == 10.0f, "unweighted combine %g %g", (double)out[0], (double)out[16]);
        nvfp4moe_ep_dispatch_free(d);
    }

    T_CASE("dispatch batched");
    d = NULL;
    CHECK_OK(nvfp4moe_ep_dispatch_build(&p, NVFP4MOE_EP_BATCHED, 2, ids, 3, 2, &d));
    if (d) {
        for (int r = 0; r < 4; r++) CHECK(d->send_counts[r] == 8, "batched send_counts[%d]=%lld", r, (long long)d->send_counts[r]);
        /* expert 5 = rank 1 local 1 -> row 8 + 1*2 + 0 = 10; expert 0 -> row 0; 15 -> 24 + 3*2 = 30 */
        CHECK(d->pair_row[0] == 10 && d->pair_row[1] == 0 && d->pair_row[2] == 30, "rows %lld %lld %lld",
              (long long)d->pair_row[0], (long long)d->pair_row[1], (long long)d->pair_row[2]);
        CHECK(d->row_expert[1] == -1 && d->row_pair[1] == -1, "padding row");
        nvfp4moe_ep_dispatch_free(d);
    }
    T_CASE("dispatch batched overflow");
    const int32_t hot[] = {5, 0, 5, 4, 5, 6};
    d = NULL;
    CHECK_ERR(nvfp4moe_ep_dispatch_build(&p, NVFP4MOE_EP_BATCHED, 2, hot, 3, 2, &d), NVFP4MOE_ERR_BUFFER_TOO_SMALL,
              "expert 5 (local expert 1 of rank 1) gets 3 tokens from this rank, max_tokens=2");
    CHECK(d == NULL, "no plan on overflow");
    CHECK_ERR(nvfp4moe_ep_dispatch_build(&p, NVFP4MOE_EP_BATCHED, 0, hot, 3, 2, &d), NVFP4MOE_ERR_INVALID_ARGUMENT,
              "max_tokens=0");
    const int32_t bad[] = {5, 16};
    CHECK_ERR(nvfp4moe_ep_dispatch_build(&p, NVFP4MOE_EP_STANDARD, 0, bad, 1, 2, &d), NVFP4MOE_ERR_INVALID_ARGUMENT,
              "topk_ids[0][1]=16");
}

static void test_formats_and_oracle(void) {
    T_CASE("format of the parallel config");
    nvfp4moe_config c = small_cfg();
    c.parallel.ep_size = 2;
    CHECK(nvfp4moe_ep_format_of(&c) == NVFP4MOE_EP_STANDARD, "ep=2 alone");
    nvfp4moe_strlcpy(c.parallel.all2all, "deepep_low_latency", sizeof c.parallel.all2all);
    CHECK(nvfp4moe_ep_format_of(&c) == NVFP4MOE_EP_STANDARD, "deepep_low_latency without dp > 1 is not all2all");
    c.parallel.dp_size = 2;
    CHECK(nvfp4moe_ep_format_of(&c) == NVFP4MOE_EP_BATCHED, "deepep_low_latency, dp=2");
    nvfp4moe_strlcpy(c.parallel.all2all, "nixl_ep", sizeof c.parallel.all2all);
    CHECK(nvfp4moe_ep_format_of(&c) == NVFP4MOE_EP_BATCHED, "nixl_ep, dp=2");
    nvfp4moe_strlcpy(c.parallel.all2all, "deepep_high_throughput", sizeof c.parallel.all2all);
    CHECK(nvfp4moe_ep_format_of(&c) == NVFP4MOE_EP_STANDARD, "deepep_high_throughput");

    /* The oracle's verdicts the EP run uses. sm_90 with our backends only (installed none, what-if:
     * independent of whether this build has CUDA): for the standard format HOPPER_WGMMA, on this
     * small layer as on a DeepSeek-sized one; nothing for the batched one (vLLM has no batched
     * NVFP4 MARLIN/EMULATION class, and HOPPER_WGMMA has none yet), which those rows report as
     * the activation format. */
    nvfp4moe_report *rep = malloc(sizeof *rep);
    nvfp4moe_device h200, cpu;
    nvfp4moe_device_parse("sm_90", &h200);
    nvfp4moe_device_parse("cpu", &cpu);
    nvfp4moe_oracle_options ours = {.installed_set = true, .installed = 0};
    nvfp4moe_config s = small_cfg();
    s.in_dtype = s.out_dtype = NVFP4MOE_DTYPE_BF16;
    s.parallel.ep_size = 2;
    T_CASE("oracle sm_90 ep=2 standard");
    CHECK_OK(nvfp4moe_select(&s, &h200, &ours, rep));
    CHECK(!strcmp(rep->backend, "HOPPER_WGMMA") && !strcmp(rep->kernel, "HopperWgmmaExperts"), "chose %s/%s",
          rep->backend, rep->kernel);
    {
        nvfp4moe_config big = s;
        big.hidden_size = 7168;
        CHECK_OK(nvfp4moe_select(&big, &h200, &ours, rep));
        CHECK(!strcmp(rep->backend, "HOPPER_WGMMA") && !strcmp(rep->kernel, "HopperWgmmaExperts"),
              "hidden 7168: chose %s/%s", rep->backend, rep->kernel);
    }
    T_CASE("oracle sm_90 ep=2 batched");
    set_batched(&s);
    CHECK(nvfp4moe_select(&s, &h200, &ours, rep) == NVFP4MOE_ERR_UNSUPPORTED && !rep->backend[0], "chose %s", rep->backend);
    int seen = 0;
    for (int i = 0; i < rep->n_candidates; i++)
        if (!strcmp(rep->candidates[i].backend, "MARLIN") || !strcmp(rep->candidates[i].backend, "EMULATION") ||
            !strcmp(rep->candidates[i].backend, "HOPPER_WGMMA")) {
            seen++;
            /* vLLM prints FusedMoEActivationFormat.BatchedExperts' value (modular_kernel.py) */
            CHECK(strstr(rep->candidates[i].reason, "('batched_experts',) activation format") != NULL, "%s: %s",
                  rep->candidates[i].backend, rep->candidates[i].reason);
        }
    CHECK(seen == 3, "MARLIN, HOPPER_WGMMA and EMULATION rows: %d", seen);
    T_CASE("oracle sm_90 ep=2 batched, every library");
    ours.installed = NVFP4MOE_LIB_ALL;
    CHECK_OK(nvfp4moe_select(&s, &h200, &ours, rep));
    CHECK(!strcmp(rep->kernel, "BatchedHummingGroupedExperts"), "chose %s/%s", rep->backend, rep->kernel);
    T_CASE("oracle cpu ep=2");
    nvfp4moe_config cc = small_cfg();
    cc.parallel.ep_size = 2;
    CHECK(nvfp4moe_select(&cc, &cpu, NULL, rep) == NVFP4MOE_ERR_UNSUPPORTED && !rep->backend[0], "chose %s", rep->backend);
    for (int i = 0; i < rep->n_candidates; i++)
        if (!strncmp(rep->candidates[i].backend, "CPU_", 4))
            CHECK(strstr(rep->candidates[i].reason, "parallel config") != NULL, "%s: %s", rep->candidates[i].backend,
                  rep->candidates[i].reason);
    free(rep);
}

/* An EP plan without a forced local backend follows the oracle: on the CPU it has none. */
static nvfp4moe_status oracle_rank(int32_t rank, const nvfp4moe_ep_transport *t, void *ctx) {
    nvfp4moe_config c = *(const nvfp4moe_config *)ctx;
    c.parallel.ep_rank = rank;
    nvfp4moe_layer *layer = NULL;
    nvfp4moe_config c1 = c;
    c1.parallel.ep_size = 1;
    c1.parallel.ep_rank = 0;
    nvfp4moe_status st = nvfp4moe_layer_random(&c1, 5, &layer);
    if (st != NVFP4MOE_OK) return st;
    nvfp4moe_device cpu;
    nvfp4moe_device_parse("cpu", &cpu);
    nvfp4moe_plan_options po = {.device = &cpu};
    nvfp4moe_ep_options eo = {.plan = &po};
    nvfp4moe_ep_plan *p = NULL;
    st = nvfp4moe_ep_plan_create(&c, &layer->w, t, &eo, &p);
    if (st == NVFP4MOE_OK) {
        const nvfp4moe_report *r = nvfp4moe_ep_plan_report(p);
        st = nvfp4moe_set_error(NVFP4MOE_ERR_INTERNAL, "unexpected: the oracle chose %s", r->backend);
    }
    nvfp4moe_ep_plan_destroy(p);
    nvfp4moe_layer_free(layer);
    return st;
}

static nvfp4moe_status mismatch_rank(int32_t rank, const nvfp4moe_ep_transport *t, void *ctx) {
    nvfp4moe_config c = *(const nvfp4moe_config *)ctx;
    /* Every rank claims the next rank. (A rank alone in disagreeing would leave the others waiting
     * in plan creation's agreement: a rank that does not know who it is cannot take part.) */
    c.parallel.ep_rank = (rank + 1) % c.parallel.ep_size;
    nvfp4moe_layer *layer = NULL;
    nvfp4moe_config c1 = c;
    c1.parallel.ep_size = 1;
    c1.parallel.ep_rank = 0;
    nvfp4moe_status st = nvfp4moe_layer_random(&c1, 5, &layer);
    if (st != NVFP4MOE_OK) return st;
    nvfp4moe_ep_options eo = {.local_backend = "cpu_fast"};
    nvfp4moe_ep_plan *p = NULL;
    st = nvfp4moe_ep_plan_create(&c, &layer->w, t, &eo, &p);
    nvfp4moe_ep_plan_destroy(p);
    nvfp4moe_layer_free(layer);
    return st;
}

/* Rank 2 asks for a backend that does not exist; the others are fine. Everyone must fail (no rank
 * may go on to a forward the others never join). */
static nvfp4moe_status one_bad_rank(int32_t rank, const nvfp4moe_ep_transport *t, void *ctx) {
    nvfp4moe_config c = *(const nvfp4moe_config *)ctx;
    c.parallel.ep_size = t->size;
    c.parallel.ep_rank = rank;
    nvfp4moe_layer *layer = NULL;
    nvfp4moe_config c1 = c;
    c1.parallel.ep_size = 1;
    c1.parallel.ep_rank = 0;
    nvfp4moe_status st = nvfp4moe_layer_random(&c1, 5, &layer);
    if (st != NVFP4MOE_OK) return st;
    nvfp4moe_device cpu;
    nvfp4moe_device_parse("cpu", &cpu);
    nvfp4moe_plan_options po = {.device = &cpu};
    nvfp4moe_ep_options eo = {.plan = &po, .local_backend = rank == 2 ? "no_such_backend" : "cpu_fast"};
    nvfp4moe_ep_plan *p = NULL;
    st = nvfp4moe_ep_plan_create(&c, &layer->w, t, &eo, &p);
    if (st == NVFP4MOE_OK) st = nvfp4moe_set_error(NVFP4MOE_ERR_INTERNAL, "rank %d: plan created", rank);
    else if (rank == 2 && !strstr(nvfp4moe_last_error(), "no_such_backend"))
        st = nvfp4moe_set_error(NVFP4MOE_ERR_INTERNAL, "rank 2's own message is lost: %s", nvfp4moe_last_error());
    nvfp4moe_ep_plan_destroy(p);
    nvfp4moe_layer_free(layer);
    return st;
}

static void test_plan_errors(void) {
    nvfp4moe_ep_loopback *lb = NULL;
    nvfp4moe_config c = small_cfg();
    c.parallel.ep_size = 2;
    T_CASE("ep plan follows the oracle on the cpu");
    CHECK_OK(nvfp4moe_ep_loopback_create(2, &lb));
    CHECK_ERR(nvfp4moe_ep_loopback_run(lb, oracle_rank, &c), NVFP4MOE_ERR_UNSUPPORTED,
              "the oracle has no backend for standard format, ep_size=2 on cpu");
    T_CASE("ep plan rank vs transport");
    CHECK_ERR(nvfp4moe_ep_loopback_run(lb, mismatch_rank, &c), NVFP4MOE_ERR_INVALID_ARGUMENT,
              "rank 0: parallel.ep_size=2, ep_rank=1 do not match the transport (loopback: 2 ranks, rank 0)");
    T_CASE("ep plan creation fails on one rank only");
    nvfp4moe_ep_loopback *lb4 = NULL;
    CHECK_OK(nvfp4moe_ep_loopback_create(4, &lb4));
    if (lb4)
        CHECK_ERR(nvfp4moe_ep_loopback_run(lb4, one_bad_rank, &c), NVFP4MOE_ERR_NOT_FOUND,
                  "rank 0: ep plan creation: rank 2 failed");
    nvfp4moe_ep_loopback_free(lb4);
    nvfp4moe_ep_loopback_free(lb);
    T_CASE("ep plan batched needs max_tokens");
    set_batched(&c);
    world *w = calloc(1, sizeof *w);
    nvfp4moe_layer *layer = NULL;
    nvfp4moe_config c1 = small_cfg();
    CHECK_OK(nvfp4moe_layer_random(&c1, 9, &layer));
    w->cfg = c;
    w->layer = layer;
    w->backend = "cpu_fast";
    CHECK_ERR(run_world(w, 2), NVFP4MOE_ERR_INVALID_ARGUMENT, "max_tokens=0 must be >= 1");
    nvfp4moe_layer_free(layer);
    free(w);
}

/* Overflow on one rank: every rank fails together (nobody hangs), the overflowing one names the expert. */
static void test_overflow(void) {
    T_CASE("batched overflow across ranks");
    nvfp4moe_config c = small_cfg();
    c.parallel.ep_size = 4;
    set_batched(&c);
    nvfp4moe_layer *layer = NULL;
    nvfp4moe_config c1 = small_cfg();
    CHECK_OK(nvfp4moe_layer_random(&c1, 3, &layer));
    if (!layer) return;
    world *w = calloc(1, sizeof *w);
    w->cfg = c;
    w->layer = layer;
    w->backend = "cpu_fast";
    w->max_tokens = 4;
    const int64_t H = c.hidden_size, K = c.top_k;
    for (int r = 0; r < 4; r++) {
        w->m[r] = 6;
        w->hidden[r] = malloc(sizeof(float) * (size_t)(6 * H));
        w->out[r] = malloc(sizeof(float) * (size_t)(6 * H));
        nvfp4moe_fill_normal(w->hidden[r], NVFP4MOE_DTYPE_F32, 6 * H, 40 + (uint64_t)r);
        w->ids[r] = malloc(sizeof(int32_t) * (size_t)(6 * K));
        w->wts[r] = malloc(sizeof(float) * (size_t)(6 * K));
        for (int64_t q = 0; q < 6 * K; q++) {
            /* rank 2 sends all 6 tokens' first slot to expert 13; the others stay within capacity */
            w->ids[r][q] = (int32_t)((q % K == 0 && r == 2) ? 13 : (q * 5 + (int64_t)r) % 16);
            w->wts[r][q] = 1.0f / (float)K;
        }
        for (int64_t t = 0; t < 6; t++)   /* distinct experts per token */
            for (int64_t j = 1; j < K; j++)
                while (w->ids[r][t * K + j] == w->ids[r][t * K] || (j == 2 && w->ids[r][t * K + 2] == w->ids[r][t * K + 1]))
                    w->ids[r][t * K + j] = (w->ids[r][t * K + j] + 1) % 16;
    }
    nvfp4moe_status st = run_world(w, 4);
    CHECK(st != NVFP4MOE_OK, "overflow went unnoticed");
    CHECK(w->st[2] == NVFP4MOE_ERR_BUFFER_TOO_SMALL && strstr(w->msg[2], "expert 13 (local expert 1 of rank 3) gets 6 tokens"),
          "rank 2: %s: %s", nvfp4moe_status_str(w->st[2]), w->msg[2]);
    for (int r = 0; r < 4; r++)
        if (r != 2)
            CHECK(w->st[r] != NVFP4MOE_OK && strstr(w->msg[r], "rank 2 failed"), "rank %d: %s: %s", r,
                  nvfp4moe_status_str(w->st[r]), w->msg[r]);
    for (int r = 0; r < 4; r++) {
        free(w->hidden[r]); free(w->out[r]); free(w->ids[r]); free(w->wts[r]);
    }
    nvfp4moe_layer_free(layer);
    free(w);
}

/* The transport's own all-to-all (bench --ep's yardstick) on the loopback: collective, a median
 * time per rank, argument errors named. Results go through the world; checks run on this thread. */
typedef struct {
    size_t bytes;
    int32_t iters;
    nvfp4moe_status st[MAX_RANKS];
    double seconds[MAX_RANKS];
    char msg[MAX_RANKS][256];
} a2a_world;

static nvfp4moe_status a2a_rank(int32_t rank, const nvfp4moe_ep_transport *t, void *ctx) {
    a2a_world *w = ctx;
    w->seconds[rank] = -1;
    w->st[rank] = nvfp4moe_ep_transport_alltoall_time(t, w->bytes, w->iters, &w->seconds[rank]);
    nvfp4moe_strlcpy(w->msg[rank], nvfp4moe_last_error(), sizeof w->msg[rank]);
    return w->st[rank];
}

static void test_alltoall_time(void) {
    T_CASE("transport all-to-all timing");
    for (int32_t ranks = 1; ranks <= 4; ranks += 3) {
        a2a_world w = {.bytes = 100000, .iters = 3};
        nvfp4moe_ep_loopback *lb = NULL;
        CHECK_OK(nvfp4moe_ep_loopback_create(ranks, &lb));
        if (lb) CHECK_OK(nvfp4moe_ep_loopback_run(lb, a2a_rank, &w));
        nvfp4moe_ep_loopback_free(lb);
        for (int32_t r = 0; r < ranks; r++)
            CHECK(w.st[r] == NVFP4MOE_OK && w.seconds[r] >= 0 && (ranks == 1 || w.seconds[r] > 0),
                  "ranks %d, rank %d: %s, %g s: %s", ranks, r, nvfp4moe_status_str(w.st[r]), w.seconds[r], w.msg[r]);
    }
    nvfp4moe_ep_loopback *lb = NULL;
    CHECK_OK(nvfp4moe_ep_loopback_create(2, &lb));
    if (!lb) return;
    nvfp4moe_ep_transport t = nvfp4moe_ep_loopback_transport(lb, 0);
    double s;
    CHECK_ERR(nvfp4moe_ep_transport_alltoall_time(&t, 16, 0, &s), NVFP4MOE_ERR_INVALID_ARGUMENT, "iters=0 must be >= 1");
    CHECK_ERR(nvfp4moe_ep_transport_alltoall_time(&t, 16, 1, NULL), NVFP4MOE_ERR_INVALID_ARGUMENT, "seconds is NULL");
    CHECK_ERR(nvfp4moe_ep_transport_alltoall_time(NULL, 16, 1, &s), NVFP4MOE_ERR_INVALID_ARGUMENT, "transport is NULL");
    nvfp4moe_ep_transport bad = nvfp4moe_ep_loopback_transport(lb, 5);   /* out of range: no exchange */
    CHECK_ERR(nvfp4moe_ep_transport_alltoall_time(&bad, 16, 1, &s), NVFP4MOE_ERR_INVALID_ARGUMENT,
              "no exchange function");
    nvfp4moe_ep_loopback_free(lb);
}

/* The NCCL transport's argument checks (no NCCL is loaded: they come first), and the plain
 * refusal of a build without it. */
static void test_nccl_entry(void) {
    T_CASE("nccl transport arguments");
    nvfp4moe_ep_transport t;
    CHECK_ERR(nvfp4moe_ep_nccl_create(2, 2, 0, "/nonexistent/id", &t), NVFP4MOE_ERR_INVALID_ARGUMENT,
              "rank=2 must be in [0, size=2)");
    CHECK_ERR(nvfp4moe_ep_nccl_create(2, 0, 0, NULL, &t), NVFP4MOE_ERR_INVALID_ARGUMENT, "id_file is NULL");
    if (!nvfp4moe_built_with_nccl())
        CHECK_ERR(nvfp4moe_ep_nccl_create(2, 0, 0, "/nonexistent/id", &t), NVFP4MOE_ERR_UNSUPPORTED,
                  "this build has no NCCL transport");
}

int main(void) {
    test_nccl_entry();
    test_alltoall_time();
    test_partition_and_dispatch();
    test_formats_and_oracle();
    test_plan_errors();
    test_overflow();

    const int64_t m8[MAX_RANKS] = {5, 9, 1, 7, 3, 6, 2, 8};
    static const int32_t sizes[] = {2, 4, 8};
    char name[128];
    for (int f = 0; f < 2; f++) {
        for (int s = 0; s < 3; s++) {
            nvfp4moe_config c = small_cfg();
            if (f) set_batched(&c);
            snprintf(name, sizeof name, "ep=%d %s cpu_fast, router logits", sizes[s], f ? "batched" : "standard");
            ep_case(name, &c, sizes[s], "cpu_fast", 16, m8, false, false, true);
            snprintf(name, sizeof name, "ep=%d %s cpu_fast, uneven routing, last rank gets nothing", sizes[s],
                     f ? "batched" : "standard");
            ep_case(name, &c, sizes[s], "cpu_fast", 32, m8, true, true, true);
        }
        nvfp4moe_config c = small_cfg();
        if (f) set_batched(&c);
        const int64_t m_empty[MAX_RANKS] = {6, 0, 4, 0};
        snprintf(name, sizeof name, "ep=4 %s cpu_fast, ranks with no tokens", f ? "batched" : "standard");
        ep_case(name, &c, 4, "cpu_fast", 16, m_empty, false, false, true);
        snprintf(name, sizeof name, "ep=4 %s cpu_reference", f ? "batched" : "standard");
        ep_case(name, &c, 4, "cpu_reference", 16, m8, false, false, false);
        /* bf16 in and out, silu with clamp, biases, deepseek_v3 grouped routing with its correction
         * bias and scaling factor (routing happens on the source rank with the global router) */
        c.in_dtype = c.out_dtype = NVFP4MOE_DTYPE_BF16;
        c.has_bias = true;
        c.has_swiglu_limit = true;
        c.swiglu_limit = 7.0f;
        c.routing = NVFP4MOE_ROUTING_DEEPSEEK_V3;
        c.n_group = 4;
        c.topk_group = 2;
        c.has_correction_bias = true;
        c.routed_scaling_factor = 2.5f;
        snprintf(name, sizeof name, "ep=4 %s cpu_fast bf16 bias clamp deepseek_v3", f ? "batched" : "standard");
        ep_case(name, &c, 4, "cpu_fast", 16, m8, false, false, true);
        /* Llama4: top-1, the router weight on the input (applied at dispatch, never again) */
        nvfp4moe_config l = small_cfg();
        if (f) set_batched(&l);
        l.top_k = 1;
        l.routing = NVFP4MOE_ROUTING_LLAMA4;
        l.apply_router_weight_on_input = true;
        snprintf(name, sizeof name, "ep=2 %s cpu_fast llama4 weight on input", f ? "batched" : "standard");
        ep_case(name, &l, 2, "cpu_fast", 16, m8, false, false, true);
        /* the other schemes: per-token and W4A16 */
        nvfp4moe_config q = small_cfg();
        if (f) set_batched(&q);
        q.scheme = NVFP4MOE_SCHEME_W4A4_PER_TOKEN;
        snprintf(name, sizeof name, "ep=8 %s cpu_fast w4a4-per-token", f ? "batched" : "standard");
        ep_case(name, &q, 8, "cpu_fast", 16, m8, false, false, true);
        q.scheme = NVFP4MOE_SCHEME_W4A16;
        snprintf(name, sizeof name, "ep=2 %s cpu_fast w4a16", f ? "batched" : "standard");
        ep_case(name, &q, 2, "cpu_fast", 16, m8, false, false, true);
    }
    return t_finish("test_ep");
}
