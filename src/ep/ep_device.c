/*
 * ep_device.c - the EP forward's device-resident path, taken when the local plan uses device
 * memory.
 */
#include "ep/ep_internal.h"
#include "reference/reference.h"

#include <stdlib.h>
#include <string.h>

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
nvfp4moe_status nvfp4moe_ep_forward_resident(nvfp4moe_ep_plan *p, const nvfp4moe_io *io, cudaStream_t s,
                                             nvfp4moe_status st, nvfp4moe_ep_stats *S) {
    const nvfp4moe_config *c = &p->cfg;
    const int32_t R = p->part.ep_size;
    const int64_t L = p->part.local_experts, K = c->top_k, H = c->hidden_size, E = c->num_experts;
    const size_t in_sz = nvfp4moe_dtype_size(c->in_dtype), lout_sz = nvfp4moe_dtype_size(p->local_cfg.out_dtype);
    S->device_resident = true;
    double t0 = nvfp4moe_ep_now_s();
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
                                             p->db[DB_NBLK].p, (int32_t)(cap / bm), NULL, s);
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
    if ((st = nvfp4moe_ep_exchange_counts(p, d, st, per, scnt, rcnt, xs, dacct, S)) != NVFP4MOE_OK) goto done;

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
    if ((st = nvfp4moe_ep_agree(p, mine, "dispatch", S, dacct)) != NVFP4MOE_OK) goto done;

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
    if ((st = nvfp4moe_ep_exchange_any(&p->t, big, ns, big + R * L, nr, dacct, true)) != NVFP4MOE_OK) goto done;
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
        if ((st = nvfp4moe_ep_exchange_acct(&p->t, big, R, big + R * L, R, dacct)) != NVFP4MOE_OK) goto done;
        S->bytes_sent += sizeof(int32_t) * (size_t)nsend;
        S->bytes_received += sizeof(int32_t) * (size_t)nrecv;
    }
    double t1 = nvfp4moe_ep_now_s();
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
    st = nvfp4moe_ep_agree(p, mine, "local experts", S, (xfer_acct){0});   /* part of experts_s: it waits for the slowest rank */
    double t2 = nvfp4moe_ep_now_s();
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
    if ((st = nvfp4moe_ep_exchange_any(&p->t, big, ns, big + R * L, nr, cacct, true)) != NVFP4MOE_OK) goto done;
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
    S->combine_s = nvfp4moe_ep_now_s() - t2;

done:
    free(ids); free(hidx); free(recv_ids); free(big); free(cnt); free(xs);
    nvfp4moe_ep_dispatch_free(d);
    return st;
}

/* nvfp4moe_ep_forward with host io on a device plan: io to the device, the device-resident path,
 * the output back. A staging failure goes through the path's count exchange like any other. */
nvfp4moe_status nvfp4moe_ep_forward_staged(nvfp4moe_ep_plan *p, const nvfp4moe_io *io, nvfp4moe_ep_stats *S) {
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
    st = nvfp4moe_ep_forward_resident(p, &dio, s, st, S);
    if (st == NVFP4MOE_OK && M > 0) {
        if ((e = cudaMemcpyAsync(io->output, p->db[DB_OUT].p, ob, cudaMemcpyDeviceToHost, s)) != cudaSuccess ||
            (e = cudaStreamSynchronize(s)) != cudaSuccess)
            st = cuda_err(e, "forward (output to the host)");
        S->host_device_bytes += ob;
    }
    return st;
}
#endif
