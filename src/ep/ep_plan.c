/*
 * ep_plan.c - the EP plan: rank r's experts on a single-rank plan, the agreement that keeps every
 * rank's failures shared, and the forward on the host path (host local plans). The device-resident
 * path is ep_device.c, the NCCL transport nccl.c. The design: docs/expert_parallel.md.
 */
#include "ep/ep_internal.h"
#include "reference/reference.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

nvfp4moe_ep_format nvfp4moe_ep_plan_format(const nvfp4moe_ep_plan *p) { return p->format; }
                                           const nvfp4moe_ep_partition *nvfp4moe_ep_plan_partition(const nvfp4moe_ep_plan *p) { return &p->part; }
                                           const nvfp4moe_report *nvfp4moe_ep_plan_report(const nvfp4moe_ep_plan *p) { return &p->report; }
                                           const nvfp4moe_plan *nvfp4moe_ep_plan_local(const nvfp4moe_ep_plan *p) { return p->local; }
                                           
                                           void nvfp4moe_ep_plan_destroy(nvfp4moe_ep_plan *p) {
    if (!nvfp4moe_handle_remove(p, NVFP4MOE_HANDLE_EP_PLAN)) return;   // NULL, destroyed already, or not ours
    nvfp4moe_plan_destroy(p->local);
    free(p->correction_bias);
#ifdef NVFP4MOE_HAVE_CUDA
    for (int i = 0; i < DB_COUNT; i++) cudaFree(p->db[i].p);
    cudaFree(p->d_correction_bias);
#endif
    free(p);
}

/* The local experts' layer: E/ep experts, one row per (token, slot) pair, so top_k 1 and weight 1
 * (the router weight is applied on the input at dispatch or in the combine, never here); no
 * routing of its own (the ids come with the rows); a single rank. */
static void local_config(const nvfp4moe_config *cfg, const nvfp4moe_ep_partition *part, nvfp4moe_config *lc) {
    *lc = *cfg;
    lc->num_experts = part->local_experts;
    lc->top_k = 1;
    lc->routing = NVFP4MOE_ROUTING_RENORMALIZE;
    lc->n_group = 1;
    lc->topk_group = 1;
    lc->routed_scaling_factor = 1.0f;
    lc->has_correction_bias = false;
    lc->apply_router_weight_on_input = false;
    lc->parallel.tp_size = 1;
    lc->parallel.dp_size = 1;
    lc->parallel.ep_size = 1;
    lc->parallel.ep_rank = 0;
    lc->parallel.all2all[0] = '\0';
    lc->parallel.eplb = false;
}

double nvfp4moe_ep_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


/* One exchange through the transport; its time and the bytes sent to other ranks are added to a. */
nvfp4moe_status nvfp4moe_ep_exchange_any(const nvfp4moe_ep_transport *t, const nvfp4moe_ep_xfer *sends, int32_t nsend,
                                         const nvfp4moe_ep_xfer *recvs, int32_t nrecv, xfer_acct a, bool device) {
    const double t0 = nvfp4moe_ep_now_s();
    nvfp4moe_status st = device ? t->exchange_device(t->ctx, sends, nsend, recvs, nrecv)
                                : t->exchange(t->ctx, sends, nsend, recvs, nrecv);
    if (a.seconds) *a.seconds += nvfp4moe_ep_now_s() - t0;
    if (a.remote)
        for (int32_t i = 0; i < nsend; i++)
            if (sends[i].peer != t->rank) *a.remote += sends[i].bytes;
    return st;
}

nvfp4moe_status nvfp4moe_ep_exchange_acct(const nvfp4moe_ep_transport *t, const nvfp4moe_ep_xfer *sends, int32_t nsend,
                                          const nvfp4moe_ep_xfer *recvs, int32_t nrecv, xfer_acct a) {
    return nvfp4moe_ep_exchange_any(t, sends, nsend, recvs, nrecv, a, false);
}

/* A status every rank learns: each rank sends its own (0 = fine) to every peer; returns this
 * rank's status if it failed, else the first failed peer's as an error naming it. */
static nvfp4moe_status agree_on(const nvfp4moe_ep_transport *t, nvfp4moe_status mine, const char *step,
                                nvfp4moe_ep_stats *stats, xfer_acct acct) {
    const int32_t R = t->size;
    int32_t *buf = calloc((size_t)(R + 1), sizeof(int32_t));
    nvfp4moe_ep_xfer *x = calloc((size_t)(2 * R), sizeof *x);
    if (!buf || !x) {
        free(buf);
        free(x);
        /* Cannot take part in the exchange: the others will hang. Out of memory on 2 small arrays. */
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "ep %s: out of memory", step);
    }
    buf[R] = (int32_t)mine;
    for (int32_t r = 0; r < R; r++) {
        x[r] = (nvfp4moe_ep_xfer){r, &buf[R], sizeof(int32_t)};
        x[R + r] = (nvfp4moe_ep_xfer){r, &buf[r], sizeof(int32_t)};
    }
    nvfp4moe_status st = nvfp4moe_ep_exchange_acct(t, x, R, x + R, R, acct);
    if (stats) {
        stats->bytes_sent += sizeof(int32_t) * (size_t)R;
        stats->bytes_received += sizeof(int32_t) * (size_t)R;
    }
    if (st == NVFP4MOE_OK && mine != NVFP4MOE_OK) st = mine;   /* this rank's own message stands */
    for (int32_t r = 0; st == NVFP4MOE_OK && r < R; r++)
        if (buf[r] != NVFP4MOE_OK)
            st = nvfp4moe_set_error((nvfp4moe_status)buf[r], "ep %s: rank %d failed (%s); see its message", step, r,
                                    nvfp4moe_status_str((nvfp4moe_status)buf[r]));
    free(buf);
    free(x);
    return st;
}

nvfp4moe_status nvfp4moe_ep_agree(nvfp4moe_ep_plan *p, nvfp4moe_status mine, const char *step, nvfp4moe_ep_stats *stats,
                                  xfer_acct acct) {
    return agree_on(&p->t, mine, step, stats, acct);
}

/* Rank t->rank's share, without the agreement (nvfp4moe_ep_plan_create below adds it). */
static nvfp4moe_status plan_create_rank(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                        const nvfp4moe_ep_transport *t, const nvfp4moe_ep_options *opt,
                                        nvfp4moe_ep_plan **out) {
    NVFP4MOE_RETURN_IF(!out, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_ep_plan_create: out is NULL");
    NVFP4MOE_RETURN_IF(!cfg || !w || !t, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_ep_plan_create: %s is NULL",
                       !cfg ? "cfg" : !w ? "w" : "transport");
    NVFP4MOE_RETURN_IF(!t->exchange, NVFP4MOE_ERR_INVALID_ARGUMENT, "ep plan: the transport has no exchange function");
    nvfp4moe_ep_partition part;
    NVFP4MOE_TRY(nvfp4moe_ep_partition_of(cfg, &part));
    NVFP4MOE_TRY(nvfp4moe_config_validate(cfg));
    NVFP4MOE_RETURN_IF(t->size != part.ep_size || t->rank != part.ep_rank, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "parallel.ep_size=%d, ep_rank=%d do not match the transport (%s: %d ranks, rank %d)",
                       part.ep_size, part.ep_rank, t->name ? t->name : "?", t->size, t->rank);
    nvfp4moe_ep_options o = {0};
    if (opt) o = *opt;
    nvfp4moe_plan_options po = {0};
    if (o.plan) po = *o.plan;
    NVFP4MOE_RETURN_IF(po.weights_on_device, NVFP4MOE_ERR_UNSUPPORTED,
                       "ep plan: weights must be in host memory (the EP plan slices them per rank)");
    const nvfp4moe_ep_format format = nvfp4moe_ep_format_of(cfg);
    NVFP4MOE_RETURN_IF(format == NVFP4MOE_EP_BATCHED && o.max_tokens < 1, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "ep options max_tokens=%lld must be >= 1: parallel.all2all='%s' uses the batched format",
                       (long long)o.max_tokens, cfg->parallel.all2all);
    NVFP4MOE_TRY(nvfp4moe_weights_validate(cfg, w));

    nvfp4moe_ep_plan *p = calloc(1, sizeof *p);
    NVFP4MOE_RETURN_IF(!p, NVFP4MOE_ERR_OUT_OF_MEMORY, "ep plan: out of memory");
    if (nvfp4moe_handle_add(p, NVFP4MOE_HANDLE_EP_PLAN) != NVFP4MOE_OK) {
        free(p);
        return NVFP4MOE_ERR_OUT_OF_MEMORY;
    }
    p->cfg = *cfg;
    p->part = part;
    p->format = format;
    p->max_tokens = format == NVFP4MOE_EP_BATCHED ? o.max_tokens : 0;
    p->t = *t;

    /* The oracle decides with the whole deployment: ep size/rank, all2all and the format. */
    nvfp4moe_device dev;
    nvfp4moe_status st = po.device ? NVFP4MOE_OK : nvfp4moe_device_detect(&dev);
    if (po.device) dev = *po.device;
    nvfp4moe_status sel = st == NVFP4MOE_OK ? nvfp4moe_select(cfg, &dev, po.oracle, &p->report) : st;
    char backend[40] = "";
    if (o.local_backend) {
        if (strlen(o.local_backend) >= sizeof backend) {
            nvfp4moe_ep_plan_destroy(p);
            return nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT, "ep options local_backend '%s' is too long",
                                      o.local_backend);
        }
        nvfp4moe_strlcpy(backend, o.local_backend, sizeof backend);
    } else if (sel == NVFP4MOE_OK) {
        nvfp4moe_strlcpy(backend, p->report.backend, sizeof backend);
    } else {
        if (st == NVFP4MOE_OK)   /* the message reads the report: set it before the plan goes */
            st = nvfp4moe_set_error(sel, "ep plan: the oracle has no backend for %s format, ep_size=%d on %s: %s: %s",
                                    nvfp4moe_ep_format_name(format), part.ep_size, p->report.device,
                                    p->report.error_kind, p->report.error);
        nvfp4moe_ep_plan_destroy(p);
        return st;
    }

    /* The local layer: a view of the rank's experts (no copy: the local plan copies). W4A4's input
     * scales are replaced by the global maxima so the local plan quantizes the activations with the
     * layer's global scale, as one rank running every expert does. */
    local_config(cfg, &part, &p->local_cfg);
    const int64_t f = part.first_expert, L = part.local_experts, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg);
    nvfp4moe_weights lw = {
        .w13 = w->w13 + f * N1 * H / 2, .w13_scale = w->w13_scale + f * N1 * H / 16,
        .w13_scale_2 = w->w13_scale_2 + f, .w2 = w->w2 + f * H * I / 2, .w2_scale = w->w2_scale + f * H * I / 16,
        .w2_scale_2 = w->w2_scale_2 + f,
        .w13_bias = w->w13_bias ? w->w13_bias + f * N1 : NULL, .w2_bias = w->w2_bias ? w->w2_bias + f * H : NULL,
        .w13_up_scale_2 = w->w13_up_scale_2 ? w->w13_up_scale_2 + f : NULL,
    };
    float *in_scales = NULL;
    if (w->w13_input_scale && w->w2_input_scale) {
        in_scales = malloc(sizeof(float) * (size_t)(2 * L));
        if (!in_scales) {
            nvfp4moe_ep_plan_destroy(p);
            return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "ep plan: out of memory");
        }
        float m1 = 0.0f, m2 = 0.0f;
        for (int64_t e = 0; e < cfg->num_experts; e++) {
            m1 = w->w13_input_scale[e] > m1 ? w->w13_input_scale[e] : m1;
            m2 = w->w2_input_scale[e] > m2 ? w->w2_input_scale[e] : m2;
        }
        for (int64_t e = 0; e < L; e++) {
            in_scales[e] = m1;
            in_scales[L + e] = m2;
        }
        lw.w13_input_scale = in_scales;
        lw.w2_input_scale = in_scales + L;
    }
    /* Host backends return float32 expert outputs, so the combine rounds once, at the end, as a
     * single rank does; device backends return cfg.out_dtype (bf16/fp16: what their GEMMs store). */
    const nvfp4moe_backend_impl *impl = nvfp4moe_backend_impl_find(backend);
    bool device = impl ? impl->device_memory : false;
    if (!device) p->local_cfg.out_dtype = NVFP4MOE_DTYPE_F32;
    po.backend = backend;
    po.device = &dev;
    st = nvfp4moe_plan_create(&p->local_cfg, &lw, &po, &p->local);
    free(in_scales);
    if (st != NVFP4MOE_OK) {
        nvfp4moe_error_prefix("ep plan: the local experts (%d of %d on rank %d, backend %s)", part.local_experts,
                              part.num_experts, part.ep_rank, backend);
        nvfp4moe_ep_plan_destroy(p);
        return st;
    }
    if (cfg->has_correction_bias) {
        p->correction_bias = malloc(sizeof(float) * (size_t)cfg->num_experts);
        if (!p->correction_bias) {
            nvfp4moe_ep_plan_destroy(p);
            return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "ep plan: out of memory");
        }
        memcpy(p->correction_bias, w->correction_bias, sizeof(float) * (size_t)cfg->num_experts);
    }
    if (nvfp4moe_plan_uses_device_memory(p->local)) {
#ifdef NVFP4MOE_HAVE_CUDA
        /* The device-resident path: rows move between device buffers, so the transport must move
         * device memory; the global router runs on the device. */
        p->device = true;
        if (!t->exchange_device) {
            st = nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED,
                                    "ep plan: the local plan (%s) uses device memory, and the transport '%s' has no "
                                    "exchange_device (device buffers)", nvfp4moe_plan_backend(p->local),
                                    t->name ? t->name : "?");
            nvfp4moe_ep_plan_destroy(p);
            return st;
        }
        cudaError_t e = cudaSuccess;
        if (cfg->has_correction_bias &&
            ((e = cudaMalloc((void **)&p->d_correction_bias, sizeof(float) * (size_t)cfg->num_experts)) != cudaSuccess ||
             (e = cudaMemcpy(p->d_correction_bias, w->correction_bias, sizeof(float) * (size_t)cfg->num_experts,
                             cudaMemcpyHostToDevice)) != cudaSuccess)) {
            nvfp4moe_ep_plan_destroy(p);
            return nvfp4moe_set_error(NVFP4MOE_ERR_CUDA, "ep plan: correction bias on the device: %s",
                                      cudaGetErrorString(e));
        }
        p->route = (nvfp4moe_gpu_route_params){
            .method = cfg->routing, .logits_dtype = cfg->router_logits_dtype, .num_experts = cfg->num_experts,
            .top_k = cfg->top_k, .n_group = cfg->n_group, .topk_group = cfg->topk_group,
            .routed_scaling_factor = cfg->routed_scaling_factor, .correction_bias = p->d_correction_bias,
            .seed = cfg->seed};
#else
        nvfp4moe_ep_plan_destroy(p);
        return nvfp4moe_set_error(NVFP4MOE_ERR_INTERNAL, "ep plan: a device plan in a build without CUDA");
#endif
    }
    *out = p;
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_ep_plan_create(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                        const nvfp4moe_ep_transport *t, const nvfp4moe_ep_options *opt,
                                        nvfp4moe_ep_plan **out) {
    NVFP4MOE_RETURN_IF(!out, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_ep_plan_create: out is NULL");
    NVFP4MOE_RETURN_IF(!cfg || !t || !t->exchange, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_ep_plan_create: %s",
                       !cfg ? "cfg is NULL" : !t ? "transport is NULL" : "the transport has no exchange function");
    /* Only when the transport and the config agree on who this rank is can the ranks talk; past
     * that point a failure on one rank (a backend missing on its device, out of memory) is shared
     * so that no rank is left waiting in its first forward. */
    if (t->size != cfg->parallel.ep_size || t->rank != cfg->parallel.ep_rank)
        return plan_create_rank(cfg, w, t, opt, out);   /* fails, naming both */
    nvfp4moe_ep_plan *p = NULL;
    nvfp4moe_status st = agree_on(t, plan_create_rank(cfg, w, t, opt, &p), "plan creation", NULL, (xfer_acct){0});
    if (st != NVFP4MOE_OK) {
        nvfp4moe_ep_plan_destroy(p);
        return st;
    }
    *out = p;
    return NVFP4MOE_OK;
}

/* Runs the local host plan on rows [n, H] (in_dtype) with local expert ids; out [n, H] float32.
 * Device local plans take the device-resident path (nvfp4moe_ep_forward_device) instead. */
static nvfp4moe_status run_local(nvfp4moe_ep_plan *p, int64_t n, const void *rows, const int32_t *ids,
                                 const float *ones, void *out) {
    nvfp4moe_io io = {.num_tokens = n, .hidden = rows, .topk_ids = ids, .topk_weights = ones, .output = out};
    if (n == 0) return NVFP4MOE_OK;
    return nvfp4moe_plan_forward(p->local, &io, NULL);
}

/* The count exchange that opens a dispatch, on either path: standard sends one count per peer,
 * batched its per-expert counts (per = L per peer). A rank whose dispatch already failed (st) sends
 * -1, so every rank stops here together. scnt and rcnt hold R*per counts, xs 2R transfers. Returns
 * st, the exchange's failure, or "rank r failed" for the first peer that sent -1. */
nvfp4moe_status nvfp4moe_ep_exchange_counts(nvfp4moe_ep_plan *p, const nvfp4moe_ep_dispatch *d, nvfp4moe_status st,
                                            int64_t per, int64_t *scnt, int64_t *rcnt, nvfp4moe_ep_xfer *xs,
                                            xfer_acct dacct, nvfp4moe_ep_stats *S) {
    const int32_t R = p->part.ep_size;
    const int64_t L = p->part.local_experts;
    for (int32_t r = 0; r < R; r++) {
        for (int64_t q = 0; q < per; q++)
            scnt[r * per + q] = st != NVFP4MOE_OK ? -1 : per == 1 ? d->send_counts[r] : d->expert_counts[r * L + q];
        xs[r] = (nvfp4moe_ep_xfer){r, scnt + r * per, sizeof(int64_t) * (size_t)per};
        xs[R + r] = (nvfp4moe_ep_xfer){r, rcnt + r * per, sizeof(int64_t) * (size_t)per};
    }
    nvfp4moe_status tst = nvfp4moe_ep_exchange_acct(&p->t, xs, R, xs + R, R, dacct);
    S->bytes_sent += sizeof(int64_t) * (size_t)(R * per);
    S->bytes_received += sizeof(int64_t) * (size_t)(R * per);
    if (tst != NVFP4MOE_OK) return tst;
    for (int32_t r = 0; st == NVFP4MOE_OK && r < R; r++)
        if (rcnt[r * per] < 0)
            st = nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT, "ep dispatch: rank %d failed; see its message", r);
    return st;
}

/* The host path (host local plans): routing, gather, exchanges and combine on the host. */
static nvfp4moe_status forward_host(nvfp4moe_ep_plan *p, const nvfp4moe_io *io, nvfp4moe_ep_stats *stats) {
    nvfp4moe_ep_stats local_stats = {0};
    nvfp4moe_ep_stats *S = stats ? stats : &local_stats;
    memset(S, 0, sizeof *S);
    const nvfp4moe_config *c = &p->cfg;
    const int32_t R = p->part.ep_size;
    const int64_t L = p->part.local_experts, K = c->top_k, H = c->hidden_size;
    const size_t in_sz = nvfp4moe_dtype_size(c->in_dtype), lout_sz = nvfp4moe_dtype_size(p->local_cfg.out_dtype);
    const int64_t M = io->num_tokens >= 0 ? io->num_tokens : 0, P = M * K;
    double t0 = nvfp4moe_ep_now_s();
    const xfer_acct dacct = {&S->dispatch_xfer_s, &S->dispatch_bytes_remote};
    const xfer_acct cacct = {&S->combine_xfer_s, &S->combine_bytes_remote};

    // ---- dispatch: route, plan, counts, rows ----
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(P + 1));
    float *wts = malloc(sizeof(float) * (size_t)(P + 1));
    float *xin = malloc(sizeof(float) * (size_t)(H + 1));
    nvfp4moe_ep_dispatch *d = NULL;
    void *send = NULL, *recv = NULL, *yrecv = NULL, *ysend = NULL;
    int32_t *recv_ids = NULL;
    float *ones = NULL, *yf = NULL;
    /* The count exchange's buffers come first: without them this rank cannot even tell the others
     * that it failed. */
    int64_t *cnt = calloc((size_t)(R * (L + 1)) * 2, sizeof(int64_t));
    nvfp4moe_ep_xfer *xs = calloc((size_t)(4 * R * (L + 1)), sizeof *xs);
    int64_t nrecv = 0;
    nvfp4moe_status st = NVFP4MOE_OK;
    if (!ids || !wts || !xin) st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "ep dispatch: out of memory");
    if (st == NVFP4MOE_OK) st = nvfp4moe_check_io(c, io);
    if (st == NVFP4MOE_OK && M > 0) {
        nvfp4moe_weights rw = {.correction_bias = p->correction_bias};
        st = nvfp4moe_routing_for_io(c, &rw, io, ids, wts);
    }
    if (st == NVFP4MOE_OK) st = nvfp4moe_ep_dispatch_build(&p->part, p->format, p->max_tokens, ids, M, (int32_t)K, &d);
    int64_t nsend = d ? d->send_offsets[R] : 0;
    if (st == NVFP4MOE_OK) {
        send = calloc((size_t)(nsend * H) + 1, in_sz);
        ysend = malloc((size_t)(nsend * H) * lout_sz + 1);
        if (!send || !ysend) st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "ep dispatch: out of memory");
    }
    if (st == NVFP4MOE_OK) {
        /* Gather each pair's row (padding stays zero from calloc). The router weight goes on the
         * input here when the model asks for it, rounded to the activation dtype as on one rank. */
        for (int64_t row = 0; row < nsend; row++) {
            const int64_t pr = d->row_pair[row];
            if (pr < 0) continue;
            const char *src = (const char *)io->hidden + (size_t)((pr / K) * H) * in_sz;
            char *dst = (char *)send + (size_t)(row * H) * in_sz;
            if (c->apply_router_weight_on_input) {
                nvfp4moe_to_float(c->in_dtype, src, H, xin);
                for (int64_t k = 0; k < H; k++) xin[k] = nvfp4moe_round_to_dtype(c->in_dtype, xin[k] * wts[pr]);
                nvfp4moe_from_float(c->in_dtype, xin, H, dst);
            } else {
                memcpy(dst, src, (size_t)H * in_sz);
            }
        }
    }
    /* Counts: standard sends one count per peer, batched its per-expert counts (L per peer). A
     * failed rank sends -1 so every rank stops here together. */
    const int64_t per = p->format == NVFP4MOE_EP_BATCHED ? L : 1;
    int64_t *scnt = cnt, *rcnt = cnt ? cnt + R * (L + 1) : NULL;
    if (!cnt || !xs) {
        free(ids); free(wts); free(xin); free(send); free(ysend); free(cnt); free(xs);
        nvfp4moe_ep_dispatch_free(d);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY,
                                  "ep dispatch: out of memory before the count exchange (the other ranks will wait)");
    }
    if ((st = nvfp4moe_ep_exchange_counts(p, d, st, per, scnt, rcnt, xs, dacct, S)) != NVFP4MOE_OK) goto done;

    /* Receive layout. Standard: rows concatenated by source rank. Batched: [L, R*max_tokens]: the
     * block of (local expert e, source s) at rows e*R*max_tokens + s*max_tokens. */
    const int64_t cap = p->max_tokens;
    nrecv = 0;
    if (p->format == NVFP4MOE_EP_BATCHED) nrecv = L * R * cap;
    else
        for (int32_t r = 0; r < R; r++) nrecv += rcnt[r];
    recv = malloc((size_t)(nrecv * H) * in_sz + 1);
    yrecv = malloc((size_t)(nrecv * H) * lout_sz + 1);
    recv_ids = malloc(sizeof(int32_t) * (size_t)(nrecv + 1));
    ones = malloc(sizeof(float) * (size_t)(nrecv + 1));
    nvfp4moe_ep_xfer *big = malloc(sizeof *big * (size_t)(2 * R * (L + 1)));
    if (!recv || !yrecv || !recv_ids || !ones || !big) {
        free(big);
        /* Cannot skip the row exchange alone: tell the others first. */
        st = nvfp4moe_ep_agree(p, nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "ep dispatch: out of memory for %lld rows",
                                         (long long)nrecv), "dispatch", S, dacct);
        goto done;
    }
    st = nvfp4moe_ep_agree(p, NVFP4MOE_OK, "dispatch", S, dacct);
    if (st != NVFP4MOE_OK) {
        free(big);
        goto done;
    }
    int32_t ns = 0, nr = 0;
    if (p->format == NVFP4MOE_EP_BATCHED) {
        for (int32_t r = 0; r < R; r++)
            for (int64_t e = 0; e < L; e++) {
                big[ns++] = (nvfp4moe_ep_xfer){r, (char *)send + (size_t)((d->send_offsets[r] + e * cap) * H) * in_sz,
                                               (size_t)(cap * H) * in_sz};
                big[R * L + nr++] = (nvfp4moe_ep_xfer){r, (char *)recv + (size_t)((e * R + r) * cap * H) * in_sz,
                                                       (size_t)(cap * H) * in_sz};
            }
        for (int64_t i = 0; i < nrecv; i++) recv_ids[i] = (int32_t)(i / (R * cap));
    } else {
        int64_t off = 0;
        for (int32_t r = 0; r < R; r++) {
            big[ns++] = (nvfp4moe_ep_xfer){r, (char *)send + (size_t)(d->send_offsets[r] * H) * in_sz,
                                           (size_t)(d->send_counts[r] * H) * in_sz};
            big[R * L + nr++] = (nvfp4moe_ep_xfer){r, (char *)recv + (size_t)(off * H) * in_sz, (size_t)(rcnt[r] * H) * in_sz};
            off += rcnt[r];
        }
    }
    const nvfp4moe_ep_xfer *rx = big + R * L;
    if ((st = nvfp4moe_ep_exchange_acct(&p->t, big, ns, rx, nr, dacct)) != NVFP4MOE_OK) {
        free(big);
        goto done;
    }
    S->rows_sent = nsend;
    S->rows_received = nrecv;
    S->bytes_sent += (size_t)(nsend * H) * in_sz;
    S->bytes_received += (size_t)(nrecv * H) * in_sz;
    if (p->format == NVFP4MOE_EP_STANDARD) {
        /* The local expert ids travel as a second all-to-all-v of int32 (same counts). */
        int32_t *sid = d->row_expert;
        int64_t off = 0;
        for (int32_t r = 0; r < R; r++) {
            big[r] = (nvfp4moe_ep_xfer){r, sid + d->send_offsets[r], sizeof(int32_t) * (size_t)d->send_counts[r]};
            big[R * L + r] = (nvfp4moe_ep_xfer){r, recv_ids + off, sizeof(int32_t) * (size_t)rcnt[r]};
            off += rcnt[r];
        }
        if ((st = nvfp4moe_ep_exchange_acct(&p->t, big, R, big + R * L, R, dacct)) != NVFP4MOE_OK) {
            free(big);
            goto done;
        }
        S->bytes_sent += sizeof(int32_t) * (size_t)nsend;
        S->bytes_received += sizeof(int32_t) * (size_t)nrecv;
    }
    double t1 = nvfp4moe_ep_now_s();
    S->dispatch_s = t1 - t0;

    // ---- experts ----
    for (int64_t i = 0; i < nrecv; i++) ones[i] = 1.0f;
    st = run_local(p, nrecv, recv, recv_ids, ones, yrecv);
    st = nvfp4moe_ep_agree(p, st, "local experts", S, (xfer_acct){0});   /* part of experts_s: it waits for the slowest rank */
    double t2 = nvfp4moe_ep_now_s();
    S->experts_s = t2 - t1;
    if (st != NVFP4MOE_OK) {
        free(big);
        goto done;
    }

    // ---- combine: rows back to their source (the mirror of the dispatch), weighted slot sum ----
    ns = nr = 0;
    if (p->format == NVFP4MOE_EP_BATCHED) {
        for (int32_t r = 0; r < R; r++)
            for (int64_t e = 0; e < L; e++) {
                big[ns++] = (nvfp4moe_ep_xfer){r, (char *)yrecv + (size_t)((e * R + r) * cap * H) * lout_sz,
                                               (size_t)(cap * H) * lout_sz};
                big[R * L + nr++] = (nvfp4moe_ep_xfer){r, (char *)ysend + (size_t)((d->send_offsets[r] + e * cap) * H) * lout_sz,
                                                       (size_t)(cap * H) * lout_sz};
            }
    } else {
        int64_t off = 0;
        for (int32_t r = 0; r < R; r++) {
            big[ns++] = (nvfp4moe_ep_xfer){r, (char *)yrecv + (size_t)(off * H) * lout_sz, (size_t)(rcnt[r] * H) * lout_sz};
            big[R * L + nr++] = (nvfp4moe_ep_xfer){r, (char *)ysend + (size_t)(d->send_offsets[r] * H) * lout_sz,
                                                   (size_t)(d->send_counts[r] * H) * lout_sz};
            off += rcnt[r];
        }
    }
    st = nvfp4moe_ep_exchange_acct(&p->t, big, ns, big + R * L, nr, cacct);
    free(big);
    if (st != NVFP4MOE_OK) goto done;
    S->bytes_sent += (size_t)(nrecv * H) * lout_sz;
    S->bytes_received += (size_t)(nsend * H) * lout_sz;
    if (M > 0) {
        const float *rows = ysend;
        if (p->local_cfg.out_dtype != NVFP4MOE_DTYPE_F32) {
            yf = malloc(sizeof(float) * (size_t)(nsend * H) + 1);
            if (!yf) {
                st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "ep combine: out of memory");
                goto done;
            }
            nvfp4moe_to_float(p->local_cfg.out_dtype, ysend, nsend * H, yf);
            rows = yf;
        }
        nvfp4moe_ep_combine(d, rows, H, c->apply_router_weight_on_input ? NULL : wts, c->out_dtype, io->output);
    }
    S->combine_s = nvfp4moe_ep_now_s() - t2;

done:
    free(ids); free(wts); free(xin); free(send); free(recv); free(yrecv); free(ysend); free(recv_ids); free(ones);
    free(yf); free(cnt); free(xs);
    nvfp4moe_ep_dispatch_free(d);
    return st;
}

nvfp4moe_status nvfp4moe_ep_forward(nvfp4moe_ep_plan *p, const nvfp4moe_io *io, nvfp4moe_ep_stats *stats) {
    NVFP4MOE_RETURN_IF(!p || !io, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_ep_forward: %s is NULL", !p ? "plan" : "io");
#ifdef NVFP4MOE_HAVE_CUDA
    if (p->device) {
        nvfp4moe_ep_stats local_stats;
        nvfp4moe_ep_stats *S = stats ? stats : &local_stats;
        memset(S, 0, sizeof *S);
        return nvfp4moe_ep_forward_staged(p, io, S);
    }
#endif
    return forward_host(p, io, stats);
}

nvfp4moe_status nvfp4moe_ep_forward_device(nvfp4moe_ep_plan *p, const nvfp4moe_io *io, void *stream,
                                           nvfp4moe_ep_stats *stats) {
    NVFP4MOE_RETURN_IF(!p || !io, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_ep_forward_device: %s is NULL",
                       !p ? "plan" : "io");
#ifdef NVFP4MOE_HAVE_CUDA
    nvfp4moe_ep_stats local_stats;
    nvfp4moe_ep_stats *S = stats ? stats : &local_stats;
    memset(S, 0, sizeof *S);
    return nvfp4moe_ep_forward_resident(p, io, (cudaStream_t)stream, NVFP4MOE_OK, S);
#else
    (void)stream;
    (void)stats;
    return nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED,
                              "nvfp4moe_ep_forward_device: this build has no CUDA (use nvfp4moe_ep_forward)");
#endif
}
