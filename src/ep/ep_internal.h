/*
 * ep_internal.h - what the EP files of src/ep/ share: the plan's state and the exchange helpers.
 * Not installed.
 */
#ifndef NVFP4MOE_EP_INTERNAL_H
#define NVFP4MOE_EP_INTERNAL_H

#include "nvfp4moe_experimental.h"
#include "oracle/oracle.h"

#ifdef NVFP4MOE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/ep_kernels.h"
#include "kernels/moe_gemm.h"
#include "kernels/pipeline.h"
#endif

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


/* Where a forward stage's all-to-all time and remote bytes go (NULL: not counted). */
typedef struct {
    double *seconds;
    size_t *remote;
} xfer_acct;

/* A monotonic clock, seconds. */
double nvfp4moe_ep_now_s(void);
/* One exchange through the transport (host or device buffers); its time and the bytes sent to
 * other ranks are added to a. */
nvfp4moe_status nvfp4moe_ep_exchange_any(const nvfp4moe_ep_transport *t, const nvfp4moe_ep_xfer *sends, int32_t nsend,
                                         const nvfp4moe_ep_xfer *recvs, int32_t nrecv, xfer_acct a, bool device);
nvfp4moe_status nvfp4moe_ep_exchange_acct(const nvfp4moe_ep_transport *t, const nvfp4moe_ep_xfer *sends,
                                          int32_t nsend, const nvfp4moe_ep_xfer *recvs, int32_t nrecv, xfer_acct a);
/* A status every rank learns (see agree_on in ep_plan.c). */
nvfp4moe_status nvfp4moe_ep_agree(nvfp4moe_ep_plan *p, nvfp4moe_status mine, const char *step,
                                  nvfp4moe_ep_stats *stats, xfer_acct acct);
/* The count exchange that opens a dispatch, on either path (ep_plan.c). */
nvfp4moe_status nvfp4moe_ep_exchange_counts(nvfp4moe_ep_plan *p, const nvfp4moe_ep_dispatch *d, nvfp4moe_status st,
                                            int64_t per, int64_t *scnt, int64_t *rcnt, nvfp4moe_ep_xfer *xs,
                                            xfer_acct dacct, nvfp4moe_ep_stats *S);
#ifdef NVFP4MOE_HAVE_CUDA
/* ep_device.c: the forward of device io on stream; and of host io, staged through the device. */
nvfp4moe_status nvfp4moe_ep_forward_resident(nvfp4moe_ep_plan *p, const nvfp4moe_io *io, cudaStream_t s,
                                             nvfp4moe_status in_st, nvfp4moe_ep_stats *S);
nvfp4moe_status nvfp4moe_ep_forward_staged(nvfp4moe_ep_plan *p, const nvfp4moe_io *io, nvfp4moe_ep_stats *S);
#endif

#endif // NVFP4MOE_EP_INTERNAL_H
