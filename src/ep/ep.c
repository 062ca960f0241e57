/*
 * ep.c - expert parallelism, the transport-independent part: expert partition, dispatch plans
 * (standard and batched formats), the EP plan (local experts on a single-rank plan), the combine,
 * and the in-process loopback transport that simulates N ranks with threads (the CPU tests' one).
 * The NCCL transport is in src/ep/nccl.c. The design is described at the declarations in
 * include/nvfp4moe.h ("expert parallelism") and in docs/expert_parallel.md.
 */
#include "oracle/oracle.h"
#include "reference/reference.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef NVFP4MOE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/ep_kernels.h"
#include "kernels/moe_gemm.h"
#include "kernels/pipeline.h"
#endif

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
    if (!d) return;
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

// ---- the loopback transport ----

typedef struct {
    const nvfp4moe_ep_xfer *sends;
    int32_t nsend;
} lb_posted;

typedef struct {
    nvfp4moe_ep_loopback *lb;
    int32_t rank;
} lb_rank;

struct nvfp4moe_ep_loopback {
    int32_t size;
    pthread_barrier_t barrier;
    lb_posted *posted;   /* [size]: each rank's sends of the exchange in progress */
    lb_rank *ranks;      /* [size]: the transports' contexts */
};

/* One exchange; device: the buffers are device memory, copied with cudaMemcpyAsync on this
 * thread's per-thread stream (cudaMemcpyDefault: the same GPU, or peer to peer between GPUs). */
static nvfp4moe_status lb_exchange_any(void *ctx, const nvfp4moe_ep_xfer *sends, int32_t nsend,
                                       const nvfp4moe_ep_xfer *recvs, int32_t nrecv, bool device) {
    nvfp4moe_ep_loopback *lb = ((lb_rank *)ctx)->lb;
    const int32_t me = ((lb_rank *)ctx)->rank, R = lb->size;
    lb->posted[me].sends = sends;
    lb->posted[me].nsend = nsend;
    /* Two barriers: after the first every rank's sends are visible; after the second every
     * receive has copied, so the senders may reuse their buffers. Both are reached whatever
     * happens in between, so a mismatch on one rank cannot hang the others. */
    pthread_barrier_wait(&lb->barrier);
    nvfp4moe_status st = NVFP4MOE_OK;
    int32_t cursor[256];
    int32_t *cur = R <= 256 ? cursor : calloc((size_t)R, sizeof(int32_t));
    if (!cur) st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "loopback: out of memory");
    else memset(cur, 0, sizeof(int32_t) * (size_t)R);
    for (int32_t i = 0; st == NVFP4MOE_OK && i < nrecv; i++) {
        const int32_t src = recvs[i].peer;
        if (src < 0 || src >= R) {
            st = nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT, "loopback: receive %d names rank %d of %d", i,
                                    src, R);
            break;
        }
        const lb_posted *ps = &lb->posted[src];
        int32_t k = cur[src];
        while (k < ps->nsend && ps->sends[k].peer != me) k++;
        if (k == ps->nsend) {
            st = nvfp4moe_set_error(NVFP4MOE_ERR_INTERNAL, "loopback: rank %d receives from rank %d, which sent nothing",
                                    me, src);
            break;
        }
        if (ps->sends[k].bytes != recvs[i].bytes) {
            st = nvfp4moe_set_error(NVFP4MOE_ERR_INTERNAL,
                                    "loopback: rank %d expects %zu bytes from rank %d, which sends %zu", me,
                                    recvs[i].bytes, src, ps->sends[k].bytes);
            break;
        }
        if (recvs[i].bytes && !device) memcpy(recvs[i].buf, ps->sends[k].buf, recvs[i].bytes);
#ifdef NVFP4MOE_HAVE_CUDA
        if (recvs[i].bytes && device) {
            cudaError_t e = cudaMemcpyAsync(recvs[i].buf, ps->sends[k].buf, recvs[i].bytes, cudaMemcpyDefault,
                                            cudaStreamPerThread);
            if (e != cudaSuccess) {
                st = nvfp4moe_set_error(NVFP4MOE_ERR_CUDA, "loopback: rank %d: device copy from rank %d: %s", me, src,
                                        cudaGetErrorString(e));
                break;
            }
        }
#endif
        cur[src] = k + 1;
    }
    if (cur && cur != cursor) free(cur);
#ifdef NVFP4MOE_HAVE_CUDA
    /* The copies are done before the senders may reuse their buffers (the second barrier). */
    if (device) {
        cudaError_t e = cudaStreamSynchronize(cudaStreamPerThread);
        if (e != cudaSuccess && st == NVFP4MOE_OK)
            st = nvfp4moe_set_error(NVFP4MOE_ERR_CUDA, "loopback: rank %d: device copies: %s", me, cudaGetErrorString(e));
    }
#endif
    pthread_barrier_wait(&lb->barrier);
    return st;
}

static nvfp4moe_status lb_exchange(void *ctx, const nvfp4moe_ep_xfer *sends, int32_t nsend,
                                   const nvfp4moe_ep_xfer *recvs, int32_t nrecv) {
    return lb_exchange_any(ctx, sends, nsend, recvs, nrecv, false);
}

#ifdef NVFP4MOE_HAVE_CUDA
static nvfp4moe_status lb_exchange_device(void *ctx, const nvfp4moe_ep_xfer *sends, int32_t nsend,
                                          const nvfp4moe_ep_xfer *recvs, int32_t nrecv) {
    return lb_exchange_any(ctx, sends, nsend, recvs, nrecv, true);
}
#endif

nvfp4moe_status nvfp4moe_ep_loopback_create(int32_t size, nvfp4moe_ep_loopback **out) {
    NVFP4MOE_RETURN_IF(!out, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_ep_loopback_create: out is NULL");
    NVFP4MOE_RETURN_IF(size < 1 || size > 1024, NVFP4MOE_ERR_INVALID_ARGUMENT, "loopback: size=%d must be in [1, 1024]",
                       size);
    nvfp4moe_ep_loopback *lb = calloc(1, sizeof *lb);
    lb_rank *rk = calloc((size_t)size, sizeof *rk);
    if (lb) lb->posted = calloc((size_t)size, sizeof *lb->posted);
    if (!lb || !rk || !lb->posted || pthread_barrier_init(&lb->barrier, NULL, (unsigned)size) != 0) {
        if (lb) free(lb->posted);
        free(lb);
        free(rk);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "loopback: out of memory for %d ranks", size);
    }
    lb->size = size;
    for (int32_t r = 0; r < size; r++) rk[r] = (lb_rank){lb, r};
    lb->ranks = rk;
    *out = lb;
    return NVFP4MOE_OK;
}

nvfp4moe_ep_transport nvfp4moe_ep_loopback_transport(nvfp4moe_ep_loopback *lb, int32_t rank) {
    nvfp4moe_ep_transport t = {0};
    if (!lb || rank < 0 || rank >= lb->size) return t;   /* exchange NULL: plan creation rejects it */
    t.size = lb->size;
    t.rank = rank;
    t.ctx = &lb->ranks[rank];
    t.name = "loopback";
    t.exchange = lb_exchange;
#ifdef NVFP4MOE_HAVE_CUDA
    t.exchange_device = lb_exchange_device;
#endif
    return t;
}

void nvfp4moe_ep_loopback_free(nvfp4moe_ep_loopback *lb) {
    if (!lb) return;
    pthread_barrier_destroy(&lb->barrier);
    free(lb->posted);
    free(lb->ranks);
    free(lb);
}

typedef struct {
    nvfp4moe_ep_loopback *lb;
    int32_t rank;
    nvfp4moe_status (*fn)(int32_t, const nvfp4moe_ep_transport *, void *);
    void *ctx;
    nvfp4moe_status st;
    char msg[1024];
} lb_thread;

static void *lb_thread_main(void *arg) {
    lb_thread *th = arg;
    nvfp4moe_ep_transport t = nvfp4moe_ep_loopback_transport(th->lb, th->rank);
    th->st = th->fn(th->rank, &t, th->ctx);
    /* Errors are per thread: copy the message out before the thread ends. */
    if (th->st != NVFP4MOE_OK) nvfp4moe_strlcpy(th->msg, nvfp4moe_last_error(), sizeof th->msg);
    return NULL;
}

nvfp4moe_status nvfp4moe_ep_loopback_run(nvfp4moe_ep_loopback *lb,
                                         nvfp4moe_status (*fn)(int32_t, const nvfp4moe_ep_transport *, void *),
                                         void *ctx) {
    NVFP4MOE_RETURN_IF(!lb || !fn, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_ep_loopback_run: %s is NULL",
                       !lb ? "lb" : "fn");
    lb_thread *th = calloc((size_t)lb->size, sizeof *th);
    pthread_t *tid = calloc((size_t)lb->size, sizeof *tid);
    if (!th || !tid) {
        free(th);
        free(tid);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "loopback: out of memory");
    }
    /* Every rank must start: a rank that is missing would leave the others at a barrier. */
    int32_t started = 0;
    for (; started < lb->size; started++) {
        th[started] = (lb_thread){.lb = lb, .rank = started, .fn = fn, .ctx = ctx};
        if (pthread_create(&tid[started], NULL, lb_thread_main, &th[started]) != 0) break;
    }
    nvfp4moe_status st = NVFP4MOE_OK;
    if (started < lb->size) {
        /* Cannot happen quietly: the started ranks are blocked; this is unrecoverable here. */
        st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "loopback: could not start thread %d of %d", started,
                                lb->size);
        for (int32_t r = 0; r < started; r++) pthread_detach(tid[r]);
        /* The loopback must not be freed now: the detached threads still use it. Leak by design. */
        free(tid);
        return st;
    }
    for (int32_t r = 0; r < lb->size; r++) pthread_join(tid[r], NULL);
    for (int32_t r = 0; r < lb->size; r++) {
        if (th[r].st != NVFP4MOE_OK) {
            st = nvfp4moe_set_error(th[r].st, "rank %d: %s", r, th[r].msg);
            break;
        }
    }
    free(th);
    free(tid);
    return st;
}

// ---- EP plans ----

#ifdef NVFP4MOE_HAVE_CUDA
/* The device-resident path's buffers, allocated on first use and grown with M (never shrunk). */
enum {
    DB_X,         /* nvfp4moe_ep_forward with host io: hidden, logits, ids, weights, output on the device */
    DB_LOGITS,
    DB_IDS,       /* [P] top-k ids: the device router's, or host io's */
    DB_WTS,       /* [P] top-k weights */
    DB_OUT,
    DB_SORTED,    /* the router's token grouping (unused here, written by the routing kernel) */
    DB_BEXP,
    DB_NBLK,
    DB_INDEX,     /* int32: row_pair [rows sent] then pair_row [P] of the dispatch plan */
    DB_SEND,      /* [rows sent, H] in_dtype, gathered per destination */
    DB_RECV,      /* [rows received, H] in_dtype */
    DB_RECV_IDS,  /* [rows received] local expert ids */
    DB_ONES,      /* [rows received] 1.0f: the local plan's top-1 weights */
    DB_YRECV,     /* [rows received, H] the local plan's output */
    DB_YSEND,     /* [rows sent, H] the outputs back at their source */
    DB_WS,        /* the local plan's workspace */
    DB_COUNT
};
typedef struct {
    void *p;
    size_t cap;
} dev_buf;
#endif

struct nvfp4moe_ep_plan {
    nvfp4moe_config cfg;              /* global config */
    nvfp4moe_config local_cfg;        /* the local experts' single-rank config */
    nvfp4moe_ep_partition part;
    nvfp4moe_ep_format format;
    int64_t max_tokens;
    nvfp4moe_ep_transport t;
    nvfp4moe_report report;           /* the oracle's verdict for cfg (parallel config included) */
    nvfp4moe_plan *local;
    float *correction_bias;           /* copy: routing runs on the source rank with the global router */
#ifdef NVFP4MOE_HAVE_CUDA
    bool device;                      /* the local plan uses device memory: the device-resident path */
    nvfp4moe_gpu_route_params route;  /* the global router on the device */
    float *d_correction_bias;
    dev_buf db[DB_COUNT];
#endif
};

nvfp4moe_ep_format nvfp4moe_ep_plan_format(const nvfp4moe_ep_plan *p) { return p->format; }
const nvfp4moe_ep_partition *nvfp4moe_ep_plan_partition(const nvfp4moe_ep_plan *p) { return &p->part; }
const nvfp4moe_report *nvfp4moe_ep_plan_report(const nvfp4moe_ep_plan *p) { return &p->report; }
const nvfp4moe_plan *nvfp4moe_ep_plan_local(const nvfp4moe_ep_plan *p) { return p->local; }

void nvfp4moe_ep_plan_destroy(nvfp4moe_ep_plan *p) {
    if (!p) return;
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Where a forward stage's all-to-all time and remote bytes go (NULL: not counted). */
typedef struct {
    double *seconds;
    size_t *remote;
} xfer_acct;

/* One exchange through the transport; its time and the bytes sent to other ranks are added to a. */
static nvfp4moe_status exchange_any(const nvfp4moe_ep_transport *t, const nvfp4moe_ep_xfer *sends, int32_t nsend,
                                    const nvfp4moe_ep_xfer *recvs, int32_t nrecv, xfer_acct a, bool device) {
    const double t0 = now_s();
    nvfp4moe_status st = device ? t->exchange_device(t->ctx, sends, nsend, recvs, nrecv)
                                : t->exchange(t->ctx, sends, nsend, recvs, nrecv);
    if (a.seconds) *a.seconds += now_s() - t0;
    if (a.remote)
        for (int32_t i = 0; i < nsend; i++)
            if (sends[i].peer != t->rank) *a.remote += sends[i].bytes;
    return st;
}

static nvfp4moe_status exchange_acct(const nvfp4moe_ep_transport *t, const nvfp4moe_ep_xfer *sends, int32_t nsend,
                                     const nvfp4moe_ep_xfer *recvs, int32_t nrecv, xfer_acct a) {
    return exchange_any(t, sends, nsend, recvs, nrecv, a, false);
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
    nvfp4moe_status st = exchange_acct(t, x, R, x + R, R, acct);
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

static nvfp4moe_status agree(nvfp4moe_ep_plan *p, nvfp4moe_status mine, const char *step, nvfp4moe_ep_stats *stats,
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
static nvfp4moe_status exchange_counts(nvfp4moe_ep_plan *p, const nvfp4moe_ep_dispatch *d, nvfp4moe_status st,
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
    nvfp4moe_status tst = exchange_acct(&p->t, xs, R, xs + R, R, dacct);
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
    double t0 = now_s();
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
    if ((st = exchange_counts(p, d, st, per, scnt, rcnt, xs, dacct, S)) != NVFP4MOE_OK) goto done;

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
        st = agree(p, nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "ep dispatch: out of memory for %lld rows",
                                         (long long)nrecv), "dispatch", S, dacct);
        goto done;
    }
    st = agree(p, NVFP4MOE_OK, "dispatch", S, dacct);
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
    if ((st = exchange_acct(&p->t, big, ns, rx, nr, dacct)) != NVFP4MOE_OK) {
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
        if ((st = exchange_acct(&p->t, big, R, big + R * L, R, dacct)) != NVFP4MOE_OK) {
            free(big);
            goto done;
        }
        S->bytes_sent += sizeof(int32_t) * (size_t)nsend;
        S->bytes_received += sizeof(int32_t) * (size_t)nrecv;
    }
    double t1 = now_s();
    S->dispatch_s = t1 - t0;

    // ---- experts ----
    for (int64_t i = 0; i < nrecv; i++) ones[i] = 1.0f;
    st = run_local(p, nrecv, recv, recv_ids, ones, yrecv);
    st = agree(p, st, "local experts", S, (xfer_acct){0});   /* part of experts_s: it waits for the slowest rank */
    double t2 = now_s();
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
    st = exchange_acct(&p->t, big, ns, big + R * L, nr, cacct);
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
    S->combine_s = now_s() - t2;

done:
    free(ids); free(wts); free(xin); free(send); free(recv); free(yrecv); free(ysend); free(recv_ids); free(ones);
    free(yf); free(cnt); free(xs);
    nvfp4moe_ep_dispatch_free(d);
    return st;
}

// ---- the device-resident path (device local plans) ----
//
// The rows never leave the device: routing (or the caller's top-k) on the device, the top-k ids
// to the host (4 bytes per pair) for the dispatch plan, which is nvfp4moe_ep_dispatch_build's (so
// both formats, the id checks and the batched overflow message are the host path's), the plan's
// row indices back to the device, a gather kernel per destination, the counts and statuses through
// the host exchange, the rows through the transport's exchange_device, the local plan on the
// received rows, the outputs back the same way, and the weighted slot-order sum as a kernel.

#ifdef NVFP4MOE_HAVE_CUDA
static nvfp4moe_status reserve(nvfp4moe_ep_plan *p, int which, size_t bytes) {
    dev_buf *b = &p->db[which];
    if (b->p && bytes <= b->cap) return NVFP4MOE_OK;   /* never NULL, even for 0 bytes */
    cudaFree(b->p);
    b->p = NULL;
    b->cap = 0;
    const size_t want = bytes < 256 ? 256 : bytes;
    cudaError_t e = cudaMalloc(&b->p, want);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();   /* an allocation failure is not sticky: clear it */
        b->p = NULL;
        return nvfp4moe_set_error(e == cudaErrorMemoryAllocation ? NVFP4MOE_ERR_OUT_OF_MEMORY : NVFP4MOE_ERR_CUDA,
                                  "ep: %zu bytes of device memory: %s", want, cudaGetErrorString(e));
    }
    b->cap = want;
    return NVFP4MOE_OK;
}

static bool misaligned16(const void *q) { return ((uintptr_t)q & 15u) != 0; }

static nvfp4moe_status cuda_err(cudaError_t e, const char *what) {
    return nvfp4moe_set_error(NVFP4MOE_ERR_CUDA, "ep %s: CUDA: %s", what, cudaGetErrorString(e));
}

/* The checks of a device io (the pointers are not dereferenced on the host). */
static nvfp4moe_status check_device_io(const nvfp4moe_ep_plan *p, const nvfp4moe_io *io) {
    const nvfp4moe_config *c = &p->cfg;
    const int64_t M = io->num_tokens;
    NVFP4MOE_RETURN_IF(M < 0, NVFP4MOE_ERR_SHAPE, "ep forward: io.num_tokens=%lld is negative", (long long)M);
    NVFP4MOE_RETURN_IF(c->hidden_size % 8, NVFP4MOE_ERR_SHAPE,
                       "ep forward (device): hidden_size=%d must be a multiple of 8", c->hidden_size);
    NVFP4MOE_RETURN_IF(M * c->top_k > INT32_MAX / 2, NVFP4MOE_ERR_SHAPE,
                       "ep forward (device): io.num_tokens=%lld is too large for 32-bit pair indices", (long long)M);
    if (M == 0) return NVFP4MOE_OK;
    NVFP4MOE_RETURN_IF(!io->hidden || !io->output, NVFP4MOE_ERR_INVALID_ARGUMENT, "ep forward: io.%s is NULL",
                       !io->hidden ? "hidden" : "output");
    NVFP4MOE_RETURN_IF(misaligned16(io->hidden) || misaligned16(io->output), NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "ep forward (device): io.%s must be 16-byte aligned device memory",
                       misaligned16(io->hidden) ? "hidden" : "output");
    NVFP4MOE_RETURN_IF(io->topk_ids && !io->topk_weights, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "ep forward: io.topk_ids is given but io.topk_weights is NULL");
    NVFP4MOE_RETURN_IF(!io->topk_ids && !io->router_logits && c->routing != NVFP4MOE_ROUTING_SIMULATED,
                       NVFP4MOE_ERR_INVALID_ARGUMENT, "ep forward: io.router_logits and io.topk_ids are both NULL");
    NVFP4MOE_RETURN_IF(!io->topk_ids && (c->num_experts > NVFP4MOE_GPU_MAX_EXPERTS || c->top_k > NVFP4MOE_GPU_MAX_TOPK),
                       NVFP4MOE_ERR_UNSUPPORTED,
                       "ep forward (device): the GPU router handles up to %d experts and top_k %d (here %d, %d); "
                       "pass io.topk_ids", NVFP4MOE_GPU_MAX_EXPERTS, NVFP4MOE_GPU_MAX_TOPK, c->num_experts, c->top_k);
    return NVFP4MOE_OK;
}

/* The device-resident forward. io: device memory. st: a failure found by the caller, which this
 * rank then reports through the count exchange (every rank stops there together). */
static nvfp4moe_status forward_device(nvfp4moe_ep_plan *p, const nvfp4moe_io *io, cudaStream_t s,
                                      nvfp4moe_status st, nvfp4moe_ep_stats *S) {
    const nvfp4moe_config *c = &p->cfg;
    const int32_t R = p->part.ep_size;
    const int64_t L = p->part.local_experts, K = c->top_k, H = c->hidden_size, E = c->num_experts;
    const size_t in_sz = nvfp4moe_dtype_size(c->in_dtype), lout_sz = nvfp4moe_dtype_size(p->local_cfg.out_dtype);
    S->device_resident = true;
    double t0 = now_s();
    const xfer_acct dacct = {&S->dispatch_xfer_s, &S->dispatch_bytes_remote};
    const xfer_acct cacct = {&S->combine_xfer_s, &S->combine_bytes_remote};
    if (st == NVFP4MOE_OK && !p->device)
        st = nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED,
                                "nvfp4moe_ep_forward_device: the local plan (%s) uses host memory; use nvfp4moe_ep_forward",
                                nvfp4moe_plan_backend(p->local));
    if (st == NVFP4MOE_OK) st = check_device_io(p, io);
    const int64_t M = st == NVFP4MOE_OK ? io->num_tokens : 0, P = M * K;
    int32_t *ids = NULL, *hidx = NULL, *recv_ids = NULL;
    nvfp4moe_ep_dispatch *d = NULL;
    nvfp4moe_ep_xfer *big = NULL;
    int64_t *cnt = calloc((size_t)(R * (L + 1)) * 2, sizeof(int64_t));
    nvfp4moe_ep_xfer *xs = calloc((size_t)(2 * R), sizeof *xs);
    cudaError_t e = cudaSuccess;

    // ---- dispatch: route, ids to the host, plan, indices to the device, gather ----
    const int32_t *d_ids = st == NVFP4MOE_OK ? io->topk_ids : NULL;
    const float *d_wts = st == NVFP4MOE_OK ? io->topk_weights : NULL;
    if (st == NVFP4MOE_OK && M > 0 && !d_ids) {
        const int32_t bm = 64;
        const int64_t cap = nvfp4moe_group_capacity(P, E, bm);
        if ((st = reserve(p, DB_IDS, sizeof(int32_t) * (size_t)P)) == NVFP4MOE_OK &&
            (st = reserve(p, DB_WTS, sizeof(float) * (size_t)P)) == NVFP4MOE_OK &&
            (st = reserve(p, DB_SORTED, sizeof(int32_t) * (size_t)cap)) == NVFP4MOE_OK &&
            (st = reserve(p, DB_BEXP, sizeof(int32_t) * (size_t)(cap / bm))) == NVFP4MOE_OK &&
            (st = reserve(p, DB_NBLK, sizeof(int32_t))) == NVFP4MOE_OK) {
            d_ids = p->db[DB_IDS].p;
            d_wts = p->db[DB_WTS].p;
            e = nvfp4moe_gpu_route_and_group(&p->route, io->router_logits, (int32_t *)d_ids, (float *)d_wts, M,
                                             (int32_t)K, (int32_t)E, bm, p->db[DB_SORTED].p, p->db[DB_BEXP].p,
                                             p->db[DB_NBLK].p, (int32_t)(cap / bm), s);
            if (e != cudaSuccess) st = cuda_err(e, "dispatch (routing on the device)");
        }
    }
    if (st == NVFP4MOE_OK && M > 0) {
        ids = malloc(sizeof(int32_t) * (size_t)P);
        if (!ids) st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "ep dispatch: out of memory");
        else if ((e = cudaMemcpyAsync(ids, d_ids, sizeof(int32_t) * (size_t)P, cudaMemcpyDeviceToHost, s)) != cudaSuccess ||
                 (e = cudaStreamSynchronize(s)) != cudaSuccess)
            st = cuda_err(e, "dispatch (top-k ids to the host)");
        S->host_device_bytes += sizeof(int32_t) * (size_t)P;
    }
    if (st == NVFP4MOE_OK) st = nvfp4moe_ep_dispatch_build(&p->part, p->format, p->max_tokens, ids, M, (int32_t)K, &d);
    const int64_t nsend = d ? d->send_offsets[R] : 0;
    if (st == NVFP4MOE_OK && nsend > INT32_MAX / 2)
        st = nvfp4moe_set_error(NVFP4MOE_ERR_SHAPE, "ep dispatch (device): %lld rows are too many for 32-bit indices",
                                (long long)nsend);
    if (st == NVFP4MOE_OK) {
        /* row_pair of every send row (-1: batched padding), then pair_row of every pair. */
        hidx = malloc(sizeof(int32_t) * (size_t)(nsend + P + 1));
        if (!hidx) st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "ep dispatch: out of memory");
        if (st == NVFP4MOE_OK &&
            (st = reserve(p, DB_INDEX, sizeof(int32_t) * (size_t)(nsend + P))) == NVFP4MOE_OK &&
            (st = reserve(p, DB_SEND, (size_t)(nsend * H) * in_sz)) == NVFP4MOE_OK &&
            (st = reserve(p, DB_YSEND, (size_t)(nsend * H) * lout_sz)) == NVFP4MOE_OK) {
            for (int64_t r = 0; r < nsend; r++) hidx[r] = (int32_t)d->row_pair[r];
            for (int64_t q = 0; q < P; q++) hidx[nsend + q] = (int32_t)d->pair_row[q];
            const int32_t *d_row_pair = p->db[DB_INDEX].p;
            if (nsend > 0 &&
                ((e = cudaMemcpyAsync(p->db[DB_INDEX].p, hidx, sizeof(int32_t) * (size_t)(nsend + P),
                                     cudaMemcpyHostToDevice, s)) != cudaSuccess ||
                (e = nvfp4moe_ep_gather_rows(io->hidden, c->in_dtype, H, d_row_pair, nsend, (int32_t)K,
                                              c->apply_router_weight_on_input ? d_wts : NULL, p->db[DB_SEND].p, s)) !=
                     cudaSuccess))
                st = cuda_err(e, "dispatch (gather)");
            S->host_device_bytes += sizeof(int32_t) * (size_t)(nsend + P);
        }
    }
    /* Counts, as the host path: one per peer (batched: L per peer), -1 from a failed rank. */
    const int64_t per = p->format == NVFP4MOE_EP_BATCHED ? L : 1;
    int64_t *scnt = cnt, *rcnt = cnt ? cnt + R * (L + 1) : NULL;
    if (!cnt || !xs) {
        free(ids); free(hidx); free(cnt); free(xs);
        nvfp4moe_ep_dispatch_free(d);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY,
                                  "ep dispatch: out of memory before the count exchange (the other ranks will wait)");
    }
    if ((st = exchange_counts(p, d, st, per, scnt, rcnt, xs, dacct, S)) != NVFP4MOE_OK) goto done;

    const int64_t cap = p->max_tokens;
    int64_t nrecv = 0;
    if (p->format == NVFP4MOE_EP_BATCHED) nrecv = L * R * cap;
    else
        for (int32_t r = 0; r < R; r++) nrecv += rcnt[r];
    const size_t ws = nvfp4moe_plan_workspace_size(p->local, nrecv);
    nvfp4moe_status mine = NVFP4MOE_OK;
    recv_ids = malloc(sizeof(int32_t) * (size_t)(nrecv + 1));
    big = malloc(sizeof *big * (size_t)(2 * R * (L + 1)));
    if (!recv_ids || !big)
        mine = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "ep dispatch: out of memory for %lld rows", (long long)nrecv);
    if (mine == NVFP4MOE_OK &&
        ((mine = reserve(p, DB_RECV, (size_t)(nrecv * H) * in_sz)) != NVFP4MOE_OK ||
         (mine = reserve(p, DB_YRECV, (size_t)(nrecv * H) * lout_sz)) != NVFP4MOE_OK ||
         (mine = reserve(p, DB_RECV_IDS, sizeof(int32_t) * (size_t)nrecv)) != NVFP4MOE_OK ||
         (mine = reserve(p, DB_ONES, sizeof(float) * (size_t)nrecv)) != NVFP4MOE_OK ||
         (ws && (mine = reserve(p, DB_WS, ws)) != NVFP4MOE_OK)))
        (void)0;
    /* The gather is finished before any rank reads this rank's send buffer. */
    if (mine == NVFP4MOE_OK && (e = cudaStreamSynchronize(s)) != cudaSuccess) mine = cuda_err(e, "dispatch (gather)");
    /* Cannot skip the row exchange alone: every rank learns of a failure first. */
    if ((st = agree(p, mine, "dispatch", S, dacct)) != NVFP4MOE_OK) goto done;

    char *send = p->db[DB_SEND].p, *recv = p->db[DB_RECV].p;
    int32_t ns = 0, nr = 0;
    if (p->format == NVFP4MOE_EP_BATCHED) {
        for (int32_t r = 0; r < R; r++)
            for (int64_t q = 0; q < L; q++) {
                big[ns++] = (nvfp4moe_ep_xfer){r, send + (size_t)((d->send_offsets[r] + q * cap) * H) * in_sz,
                                               (size_t)(cap * H) * in_sz};
                big[R * L + nr++] = (nvfp4moe_ep_xfer){r, recv + (size_t)((q * R + r) * cap * H) * in_sz,
                                                       (size_t)(cap * H) * in_sz};
            }
        for (int64_t i = 0; i < nrecv; i++) recv_ids[i] = (int32_t)(i / (R * cap));
    } else {
        int64_t off = 0;
        for (int32_t r = 0; r < R; r++) {
            big[ns++] = (nvfp4moe_ep_xfer){r, send + (size_t)(d->send_offsets[r] * H) * in_sz,
                                           (size_t)(d->send_counts[r] * H) * in_sz};
            big[R * L + nr++] = (nvfp4moe_ep_xfer){r, recv + (size_t)(off * H) * in_sz, (size_t)(rcnt[r] * H) * in_sz};
            off += rcnt[r];
        }
    }
    if ((st = exchange_any(&p->t, big, ns, big + R * L, nr, dacct, true)) != NVFP4MOE_OK) goto done;
    S->rows_sent = nsend;
    S->rows_received = nrecv;
    S->bytes_sent += (size_t)(nsend * H) * in_sz;
    S->bytes_received += (size_t)(nrecv * H) * in_sz;
    if (p->format == NVFP4MOE_EP_STANDARD) {
        /* The local expert ids: an all-to-all-v of int32 through the host (4 bytes per row). */
        int64_t off = 0;
        for (int32_t r = 0; r < R; r++) {
            big[r] = (nvfp4moe_ep_xfer){r, d->row_expert + d->send_offsets[r], sizeof(int32_t) * (size_t)d->send_counts[r]};
            big[R * L + r] = (nvfp4moe_ep_xfer){r, recv_ids + off, sizeof(int32_t) * (size_t)rcnt[r]};
            off += rcnt[r];
        }
        if ((st = exchange_acct(&p->t, big, R, big + R * L, R, dacct)) != NVFP4MOE_OK) goto done;
        S->bytes_sent += sizeof(int32_t) * (size_t)nsend;
        S->bytes_received += sizeof(int32_t) * (size_t)nrecv;
    }
    double t1 = now_s();
    S->dispatch_s = t1 - t0;

    // ---- experts: the local plan on the received rows ----
    if (nrecv > 0) {
        if ((e = cudaMemcpyAsync(p->db[DB_RECV_IDS].p, recv_ids, sizeof(int32_t) * (size_t)nrecv,
                                 cudaMemcpyHostToDevice, s)) != cudaSuccess ||
            (e = nvfp4moe_ep_fill_f32(p->db[DB_ONES].p, nrecv, 1.0f, s)) != cudaSuccess)
            mine = cuda_err(e, "local experts (ids)");
        S->host_device_bytes += sizeof(int32_t) * (size_t)nrecv;
        nvfp4moe_io dio = {.num_tokens = nrecv, .hidden = recv, .topk_ids = p->db[DB_RECV_IDS].p,
                           .topk_weights = p->db[DB_ONES].p, .output = p->db[DB_YRECV].p,
                           .workspace = ws ? p->db[DB_WS].p : NULL, .workspace_size = ws};
        if (mine == NVFP4MOE_OK) mine = nvfp4moe_plan_forward(p->local, &dio, s);
        if (mine == NVFP4MOE_OK && (e = cudaStreamSynchronize(s)) != cudaSuccess) mine = cuda_err(e, "local experts");
    }
    st = agree(p, mine, "local experts", S, (xfer_acct){0});   /* part of experts_s: it waits for the slowest rank */
    double t2 = now_s();
    S->experts_s = t2 - t1;
    if (st != NVFP4MOE_OK) goto done;

    // ---- combine: the outputs back (the mirror of the dispatch), the weighted slot sum ----
    char *yrecv = p->db[DB_YRECV].p, *ysend = p->db[DB_YSEND].p;
    ns = nr = 0;
    if (p->format == NVFP4MOE_EP_BATCHED) {
        for (int32_t r = 0; r < R; r++)
            for (int64_t q = 0; q < L; q++) {
                big[ns++] = (nvfp4moe_ep_xfer){r, yrecv + (size_t)((q * R + r) * cap * H) * lout_sz,
                                               (size_t)(cap * H) * lout_sz};
                big[R * L + nr++] = (nvfp4moe_ep_xfer){r, ysend + (size_t)((d->send_offsets[r] + q * cap) * H) * lout_sz,
                                                       (size_t)(cap * H) * lout_sz};
            }
    } else {
        int64_t off = 0;
        for (int32_t r = 0; r < R; r++) {
            big[ns++] = (nvfp4moe_ep_xfer){r, yrecv + (size_t)(off * H) * lout_sz, (size_t)(rcnt[r] * H) * lout_sz};
            big[R * L + nr++] = (nvfp4moe_ep_xfer){r, ysend + (size_t)(d->send_offsets[r] * H) * lout_sz,
                                                   (size_t)(d->send_counts[r] * H) * lout_sz};
            off += rcnt[r];
        }
    }
    if ((st = exchange_any(&p->t, big, ns, big + R * L, nr, cacct, true)) != NVFP4MOE_OK) goto done;
    S->bytes_sent += (size_t)(nrecv * H) * lout_sz;
    S->bytes_received += (size_t)(nsend * H) * lout_sz;
    if (M > 0) {
        const int32_t *d_pair_row = (const int32_t *)p->db[DB_INDEX].p + nsend;
        if ((e = nvfp4moe_ep_combine_rows(ysend, p->local_cfg.out_dtype, d_pair_row,
                                          c->apply_router_weight_on_input ? NULL : d_wts, M, (int32_t)K, H, io->output,
                                          c->out_dtype, s)) != cudaSuccess ||
            (e = cudaStreamSynchronize(s)) != cudaSuccess)
            st = cuda_err(e, "combine");
    }
    S->combine_s = now_s() - t2;

done:
    free(ids); free(hidx); free(recv_ids); free(big); free(cnt); free(xs);
    nvfp4moe_ep_dispatch_free(d);
    return st;
}

/* nvfp4moe_ep_forward with host io on a device plan: io to the device, the device-resident path,
 * the output back. A staging failure goes through the path's count exchange like any other. */
static nvfp4moe_status forward_staged(nvfp4moe_ep_plan *p, const nvfp4moe_io *io, nvfp4moe_ep_stats *S) {
    const nvfp4moe_config *c = &p->cfg;
    const cudaStream_t s = cudaStreamPerThread;
    nvfp4moe_status st = nvfp4moe_check_io(c, io);
    const int64_t M = st == NVFP4MOE_OK && io->num_tokens > 0 ? io->num_tokens : 0;
    const int64_t H = c->hidden_size, E = c->num_experts, P = M * c->top_k;
    const size_t hb = (size_t)(M * H) * nvfp4moe_dtype_size(c->in_dtype);
    const size_t ob = (size_t)(M * H) * nvfp4moe_dtype_size(c->out_dtype);
    const size_t lb = io->router_logits ? (size_t)(M * E) * nvfp4moe_dtype_size(c->router_logits_dtype) : 0;
    nvfp4moe_io dio = {.num_tokens = M};
    cudaError_t e = cudaSuccess;
    if (st == NVFP4MOE_OK && M > 0) {
        if ((st = reserve(p, DB_X, hb)) == NVFP4MOE_OK && (st = reserve(p, DB_OUT, ob)) == NVFP4MOE_OK &&
            (!lb || (st = reserve(p, DB_LOGITS, lb)) == NVFP4MOE_OK) &&
            (!io->topk_ids || ((st = reserve(p, DB_IDS, sizeof(int32_t) * (size_t)P)) == NVFP4MOE_OK &&
                               (st = reserve(p, DB_WTS, sizeof(float) * (size_t)P)) == NVFP4MOE_OK))) {
            dio.hidden = p->db[DB_X].p;
            dio.output = p->db[DB_OUT].p;
            if ((e = cudaMemcpyAsync(p->db[DB_X].p, io->hidden, hb, cudaMemcpyHostToDevice, s)) != cudaSuccess)
                st = cuda_err(e, "forward (hidden to the device)");
            S->host_device_bytes += hb;
            if (st == NVFP4MOE_OK && io->topk_ids) {
                dio.topk_ids = p->db[DB_IDS].p;
                dio.topk_weights = p->db[DB_WTS].p;
                if ((e = cudaMemcpyAsync(p->db[DB_IDS].p, io->topk_ids, sizeof(int32_t) * (size_t)P,
                                         cudaMemcpyHostToDevice, s)) != cudaSuccess ||
                    (e = cudaMemcpyAsync(p->db[DB_WTS].p, io->topk_weights, sizeof(float) * (size_t)P,
                                         cudaMemcpyHostToDevice, s)) != cudaSuccess)
                    st = cuda_err(e, "forward (top-k to the device)");
                S->host_device_bytes += 2 * sizeof(int32_t) * (size_t)P;
            } else if (st == NVFP4MOE_OK && lb) {
                dio.router_logits = p->db[DB_LOGITS].p;
                if ((e = cudaMemcpyAsync(p->db[DB_LOGITS].p, io->router_logits, lb, cudaMemcpyHostToDevice, s)) !=
                    cudaSuccess)
                    st = cuda_err(e, "forward (router logits to the device)");
                S->host_device_bytes += lb;
            }
        }
    }
    st = forward_device(p, &dio, s, st, S);
    if (st == NVFP4MOE_OK && M > 0) {
        if ((e = cudaMemcpyAsync(io->output, p->db[DB_OUT].p, ob, cudaMemcpyDeviceToHost, s)) != cudaSuccess ||
            (e = cudaStreamSynchronize(s)) != cudaSuccess)
            st = cuda_err(e, "forward (output to the host)");
        S->host_device_bytes += ob;
    }
    return st;
}
#endif

nvfp4moe_status nvfp4moe_ep_forward(nvfp4moe_ep_plan *p, const nvfp4moe_io *io, nvfp4moe_ep_stats *stats) {
    NVFP4MOE_RETURN_IF(!p || !io, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_ep_forward: %s is NULL", !p ? "plan" : "io");
#ifdef NVFP4MOE_HAVE_CUDA
    if (p->device) {
        nvfp4moe_ep_stats local_stats;
        nvfp4moe_ep_stats *S = stats ? stats : &local_stats;
        memset(S, 0, sizeof *S);
        return forward_staged(p, io, S);
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
    return forward_device(p, io, (cudaStream_t)stream, NVFP4MOE_OK, S);
#else
    (void)stream;
    (void)stats;
    return nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED,
                              "nvfp4moe_ep_forward_device: this build has no CUDA (use nvfp4moe_ep_forward)");
#endif
}
