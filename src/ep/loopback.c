/*
 * loopback.c - the in-process loopback transport: N ranks simulated by threads of one process
 * (the CPU tests' transport; on a GPU, one device serves every rank).
 */
#include "ep/ep_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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
    if (nvfp4moe_handle_add(lb, NVFP4MOE_HANDLE_EP_LOOPBACK) != NVFP4MOE_OK) {
        pthread_barrier_destroy(&lb->barrier);
        free(lb->posted);
        free(lb->ranks);
        free(lb);
        return NVFP4MOE_ERR_OUT_OF_MEMORY;
    }
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
    if (!nvfp4moe_handle_remove(lb, NVFP4MOE_HANDLE_EP_LOOPBACK)) return;   // NULL, freed already, or not ours
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
