/*
 * nvfp4moe_experimental.h - the experimental part of libnvfp4moe's API: expert parallelism and
 * the benchmark hooks.
 *
 * EXPERIMENTAL: the names, arguments and behaviour below may change in any release, minor ones
 * included. Everything in nvfp4moe.h (included here) is stable and holds here too.
 */
#ifndef NVFP4MOE_EXPERIMENTAL_H
#define NVFP4MOE_EXPERIMENTAL_H

#include "nvfp4moe.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- expert parallelism ----
//
// Expert parallelism (EP) shards a layer's experts over ep_size ranks (one process per GPU, or
// threads in one process for the loopback simulation). Rank r owns the contiguous experts
// [r*E/ep, (r+1)*E/ep) (vLLM's default expert map). A forward on rank r takes that rank's own tokens
// and runs three steps:
//   dispatch  route the tokens (global router), and send each (token, slot) pair's hidden row to the
//             rank owning its expert, together with the expert's local index there;
//   experts   every rank runs the rows it received through an ordinary single-rank plan over its
//             E/ep local experts (top_k 1, weight 1: the expert's plain output);
//   combine   the outputs go back to their source rank, which sums each token's slots in slot order
//             with the top-k weights (float32 accumulation, then cfg.out_dtype).
// The top-k weights are applied exactly once: on the input at dispatch when
// cfg.apply_router_weight_on_input (as vLLM's prepare step does), otherwise in the combine.
// With the CPU backends this gives the single-rank CPU_FAST output bit for bit (the same dot
// products, the same slot-order sum). W4A4's activation global scale is the layer's (1 / max over
// ALL experts' input scales), as on one rank: each rank's local layer carries the global maxima.
//
// Activation formats (vLLM's standard and BatchedExperts), chosen from the parallel config exactly
// as the oracle derives it: batched iff ep_size > 1, dp_size > 1 and
// all2all is "deepep_low_latency" or "nixl_ep"; standard otherwise.
//   standard  variable counts: each rank first exchanges how many rows it sends to every peer,
//             then the rows (all-to-all-v), token order, one row per (token, slot) pair;
//   batched   fixed shapes for CUDA graphs: every rank receives [E_local, ep*max_tokens, H], source
//             s's rows for local expert e at rows [s*max_tokens, s*max_tokens + n) of block e, zero
//             padding after; per-expert counts travel first. max_tokens is a per (source rank, local
//             expert) capacity fixed at plan creation; exceeding it is ERR_BUFFER_TOO_SMALL naming
//             the expert (never silent truncation). The experts step runs the whole padded block
//             (fixed shape; padding rows are zeros and their outputs are never read).
// Every step that can fail on one rank (plan creation, routing, overflow, the local experts) is
// followed by a status exchange, so all ranks fail together instead of deadlocking.
//
// Device local plans run a device-resident path (nvfp4moe_ep_forward_device below): rows stay in
// device memory, and only counts, statuses, top-k ids and row indices pass through the host.
//
// The user's guide, with what has been measured on which transport: docs/expert_parallel.md.

typedef enum nvfp4moe_ep_format {
    NVFP4MOE_EP_STANDARD = 0,    /* "standard" */
    NVFP4MOE_EP_BATCHED  = 1,    /* "batched" */
} nvfp4moe_ep_format;
NVFP4MOE_API const char *nvfp4moe_ep_format_name(nvfp4moe_ep_format f);   /* "?" out of range */
/* The format the oracle's parallel config implies (see above). cfg is not validated. */
NVFP4MOE_API nvfp4moe_ep_format nvfp4moe_ep_format_of(const nvfp4moe_config *cfg);

/* Which experts a rank owns. */
typedef struct nvfp4moe_ep_partition {
    int32_t ep_size, ep_rank;
    int32_t num_experts;      /* E (global) */
    int32_t local_experts;    /* E / ep_size */
    int32_t first_expert;     /* ep_rank * local_experts */
} nvfp4moe_ep_partition;

/* From cfg->parallel (ep_size, ep_rank) and cfg->num_experts. INVALID_ARGUMENT naming the field
 * when ep_size < 1, ep_rank is out of [0, ep_size) or ep_size does not divide num_experts. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_ep_partition_of(const nvfp4moe_config *cfg, nvfp4moe_ep_partition *out);
/* The rank owning global expert e (0 <= e < num_experts). */
static inline int32_t nvfp4moe_ep_owner(const nvfp4moe_ep_partition *p, int32_t e) {
    return e / p->local_experts;
}

/* The dispatch plan of one rank's tokens: where each (token, slot) pair p = t*top_k + j goes.
 * Pure host computation from topk_ids (no communication). Owned by the caller: free with
 * nvfp4moe_ep_dispatch_free. */
typedef struct nvfp4moe_ep_dispatch {
    nvfp4moe_ep_format format;
    int32_t ep_size, local_experts, top_k;
    int64_t num_tokens;
    int64_t max_tokens;        /* batched: capacity per (rank, local expert); 0 for standard */
    int64_t *send_counts;      /* [ep_size] rows sent to each rank (batched: local_experts*max_tokens) */
    int64_t *send_offsets;     /* [ep_size + 1] first row of each rank's block in the send buffer */
    int64_t *pair_row;         /* [M*top_k] the send-buffer row of pair p (standard: destination
                                  rank's block, token order; batched: rank block, expert block
                                  (max_tokens rows each), then arrival order) */
    int32_t *row_expert;       /* [send_offsets[ep_size]] the destination's local expert of each
                                  send row (batched: -1 for padding rows) */
    int64_t *row_pair;         /* [send_offsets[ep_size]] the pair a send row carries (-1: padding) */
    int64_t *expert_counts;    /* [ep_size * local_experts] pairs sent to (rank, local expert) */
} nvfp4moe_ep_dispatch;

/* Builds the dispatch plan. topk_ids [num_tokens, top_k] global expert ids (checked: in range).
 * format BATCHED needs max_tokens >= 1; a (rank, local expert) receiving more than max_tokens
 * pairs is ERR_BUFFER_TOO_SMALL: "batched dispatch: expert 5 (local expert 1 of rank 2) gets 9
 * tokens, max_tokens=8". */
NVFP4MOE_API nvfp4moe_status nvfp4moe_ep_dispatch_build(const nvfp4moe_ep_partition *part, nvfp4moe_ep_format format,
                                                        int64_t max_tokens, const int32_t *topk_ids,
                                                        int64_t num_tokens, int32_t top_k,
                                                        nvfp4moe_ep_dispatch **out);
NVFP4MOE_API void nvfp4moe_ep_dispatch_free(nvfp4moe_ep_dispatch *d);   /* NULL is fine */

/* The combine: out[t] = sum over slots j in order of coef(t, j) * rows[pair_row[t*top_k + j]],
 * accumulated in float32, coef = topk_weights[t*top_k + j] (or 1 when weights is NULL: they were
 * applied on the input). rows: [*, H] float32 returned expert outputs; out: [M, H] in out_dtype. */
NVFP4MOE_API void nvfp4moe_ep_combine(const nvfp4moe_ep_dispatch *d, const float *rows, int64_t hidden,
                                      const float *topk_weights, nvfp4moe_dtype out_dtype, void *out);

/* One point-to-point transfer of a transport exchange. */
typedef struct nvfp4moe_ep_xfer {
    int32_t peer;      /* the other rank (may be this rank) */
    void   *buf;       /* send: read; receive: written */
    size_t  bytes;
} nvfp4moe_ep_xfer;

/* How ranks move bytes: a small table of functions (loopback below; NCCL in NCCL builds).
 * exchange() is collective: every rank of the group calls it the same number of times; it posts all
 * of this rank's sends and receives as one group and returns when the receives have landed and the
 * send buffers may be reused. The k-th send from rank a to rank b matches the k-th receive on b
 * from a; their byte counts must agree. Buffers are host memory. The transport is owned by its
 * creator: destroy(ctx) releases it (may be NULL when there is nothing to release).
 * exchange_device() is the same for CUDA device buffers of this rank's device: the caller has
 * finished writing the send buffers (its stream synchronized) and the receives are complete when it
 * returns. NULL when the transport cannot move device memory; EP plans whose local plan uses device
 * memory need it (the loopback's copies device to device, NCCL's ncclSend/ncclRecv on the
 * buffers themselves). */
typedef struct nvfp4moe_ep_transport {
    int32_t size, rank;
    void   *ctx;
    const char *name;  /* "loopback", "nccl" */
    nvfp4moe_status (*exchange)(void *ctx, const nvfp4moe_ep_xfer *sends, int32_t nsend,
                                const nvfp4moe_ep_xfer *recvs, int32_t nrecv);
    void (*destroy)(void *ctx);
    nvfp4moe_status (*exchange_device)(void *ctx, const nvfp4moe_ep_xfer *sends, int32_t nsend,
                                       const nvfp4moe_ep_xfer *recvs, int32_t nrecv);
} nvfp4moe_ep_transport;

/* The in-process loopback: `size` ranks simulated by threads of one process (each rank's thread
 * calls exchange() through its own transport). Free with nvfp4moe_ep_loopback_free once every
 * rank's thread is done. */
typedef struct nvfp4moe_ep_loopback nvfp4moe_ep_loopback;
NVFP4MOE_API nvfp4moe_status nvfp4moe_ep_loopback_create(int32_t size, nvfp4moe_ep_loopback **out);
/* Rank `rank`'s transport (borrowing the loopback: destroy is NULL). In CUDA builds it has
 * exchange_device (cudaMemcpyAsync between the ranks' device buffers on the calling thread's
 * per-thread stream; ranks on several GPUs of one process copy peer to peer). */
NVFP4MOE_API nvfp4moe_ep_transport nvfp4moe_ep_loopback_transport(nvfp4moe_ep_loopback *lb, int32_t rank);
NVFP4MOE_API void nvfp4moe_ep_loopback_free(nvfp4moe_ep_loopback *lb);   /* NULL is fine */
/* Runs fn(rank, transport, ctx) for every rank on its own thread and waits for all; returns the
 * first failing rank's status (its message prefixed "rank R: "). */
NVFP4MOE_API nvfp4moe_status nvfp4moe_ep_loopback_run(nvfp4moe_ep_loopback *lb,
                                                      nvfp4moe_status (*fn)(int32_t rank, const nvfp4moe_ep_transport *t,
                                                                            void *ctx),
                                                      void *ctx);

/* True when this build contains the NCCL transport (CUDA builds where nccl.h was found). */
NVFP4MOE_API bool nvfp4moe_built_with_nccl(void);
/* The NCCL transport of rank `rank` of `size`, on CUDA device `device`: rank 0 writes the NCCL
 * unique id to id_file (through id_file.tmp + rename), the others wait for it (up to 120 s).
 * exchange() stages host buffers through device memory; exchange_device() sends and receives the
 * device buffers themselves (ncclSend/ncclRecv inside one ncclGroupStart/End, self transfers as
 * device-to-device copies). libnccl.so.2 is loaded at run time (dlopen), so
 * nothing else in the library needs NCCL. UNSUPPORTED in builds without NCCL or when libnccl
 * cannot be loaded; ERR_CUDA for NCCL/CUDA failures (the message has NCCL's text). Release with
 * t->destroy(t->ctx). */
NVFP4MOE_API nvfp4moe_status nvfp4moe_ep_nccl_create(int32_t size, int32_t rank, int32_t device, const char *id_file,
                                                     nvfp4moe_ep_transport *out);

/* An EP plan: one rank's share of a layer. */
typedef struct nvfp4moe_ep_plan nvfp4moe_ep_plan;

typedef struct nvfp4moe_ep_options {
    const nvfp4moe_plan_options *plan; /* device, oracle options for the local plan (NULL: defaults;
                                          plan->backend is ignored: see local_backend) */
    const char *local_backend;  /* NULL: run the backend the oracle picks for the global config with
                                   its parallel config (ep size/rank, all2all, format); a name
                                   ("cpu_fast", "marlin"): force it for the local experts, e.g. the
                                   CPU loopback simulation, where the oracle (as vLLM) has no EP
                                   backend for the CPU */
    int64_t max_tokens;         /* batched format: capacity per (source rank, local expert); must be
                                   >= 1 for a batched config */
} nvfp4moe_ep_options;

/* Creates rank t->rank's plan: checks cfg (its parallel.ep_size must equal t->size and
 * parallel.ep_rank t->rank), asks the oracle with the global config, slices w (host memory, the
 * whole layer) to the local experts and creates their single-rank plan. Weights are copied.
 * Collective once cfg and t agree on the rank: every rank calls it, and a failure on one rank
 * (say, a backend its device lacks) fails every rank ("ep plan creation: rank 2 failed"). A rank
 * whose cfg and transport disagree returns at once without taking part. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_ep_plan_create(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                                     const nvfp4moe_ep_transport *t, const nvfp4moe_ep_options *opt,
                                                     nvfp4moe_ep_plan **out);
NVFP4MOE_API nvfp4moe_ep_format nvfp4moe_ep_plan_format(const nvfp4moe_ep_plan *p);
NVFP4MOE_API const nvfp4moe_ep_partition *nvfp4moe_ep_plan_partition(const nvfp4moe_ep_plan *p);
/* The oracle's report for the global config with its parallel config: the EP verdict (for the CPU
 * with ep > 1 it holds no backend; the local plan then ran a forced local_backend). */
NVFP4MOE_API const nvfp4moe_report *nvfp4moe_ep_plan_report(const nvfp4moe_ep_plan *p);
/* The single-rank plan of the local experts (owned by the EP plan). */
NVFP4MOE_API const nvfp4moe_plan *nvfp4moe_ep_plan_local(const nvfp4moe_ep_plan *p);

/* Where a forward's time went on this rank (seconds) and what it moved. */
typedef struct nvfp4moe_ep_stats {
    double dispatch_s, experts_s, combine_s;
    int64_t rows_sent, rows_received;    /* hidden rows (batched: padding included) */
    size_t bytes_sent, bytes_received;   /* every exchange, counts and statuses included */
    /* The all-to-alls alone: seconds inside the transport's exchange() during the dispatch (counts,
     * rows, ids, agreement) and the combine (rows back), and the bytes this rank sent to OTHER
     * ranks in them (self transfers excluded). bytes / seconds is what the EP exchanges achieved,
     * host staging included for the NCCL transport's exchange() (the host path). */
    double dispatch_xfer_s, combine_xfer_s;
    size_t dispatch_bytes_remote, combine_bytes_remote;
    /* The path the forward took: true when the rows stayed in device memory (device-resident
     * dispatch and combine: a local plan in device memory), false for the host path (host plans). */
    bool device_resident;
    /* Bytes copied between host and device memory by the forward (device-resident path): the top-k
     * ids to the host and the dispatch's row indices back (4 bytes per pair and per row), plus,
     * for nvfp4moe_ep_forward with host io, the io tensors in and the output out. */
    size_t host_device_bytes;
} nvfp4moe_ep_stats;

/* One EP forward of this rank's tokens; collective (every rank calls it). io: host memory, as for
 * a single-rank host plan (hidden [M, H], router_logits [M, E] or topk_ids/topk_weights, output
 * [M, H]; workspace unused); M may differ between ranks and be 0. stats may be NULL.
 * Host local plans (CPU_FAST, CPU_REFERENCE) run the host path: routing, gather, exchanges and
 * the float32 combine on the host. Device local plans copy io to the device and run the
 * device-resident path of nvfp4moe_ep_forward_device, then copy the output back. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_ep_forward(nvfp4moe_ep_plan *p, const nvfp4moe_io *io, nvfp4moe_ep_stats *stats);

/* The device-resident EP forward, for plans whose local plan uses device memory: io in CUDA device
 * memory of this rank's device (hidden and output 16-byte aligned; router_logits [M, E] or
 * topk_ids/topk_weights; workspace unused), stream a cudaStream_t (NULL: the default stream).
 * Routing runs on the device (or the given top-k is used), the rows for each destination are
 * gathered by a kernel, only the counts, statuses, top-k ids and the dispatch's row indices go
 * through the host, the rows travel between device buffers (transport exchange_device), the local
 * plan runs on the received rows, and the top-k weighted sum in slot order (float32, then rounded to
 * out_dtype: the definition of nvfp4moe_ep_combine) is a kernel. Both formats. Collective, and
 * returns with the stream synchronized (the exchanges synchronize). Device buffers are allocated
 * once per plan and grow with M. A rank whose local plan is in host memory fails with
 * UNSUPPORTED, and so does every other rank with it (the failure is agreed, as every failure of a
 * forward); builds without CUDA refuse at once. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_ep_forward_device(nvfp4moe_ep_plan *p, const nvfp4moe_io *io, void *stream,
                                                        nvfp4moe_ep_stats *stats);
NVFP4MOE_API void nvfp4moe_ep_plan_destroy(nvfp4moe_ep_plan *p);   /* NULL is fine */

// ---- benchmark hooks ----

/* The transport's own all-to-all, the yardstick for the EP exchanges: every rank sends
 * bytes_per_peer bytes to every OTHER rank in one exchange, `iters` times after one warm-up;
 * *seconds is this rank's median time of one all-to-all. Collective (same bytes_per_peer and iters
 * on every rank). NCCL transport: one ncclGroupStart/End of ncclSend/ncclRecv between device
 * buffers (no host staging: NCCL's own peak between these ranks); any other transport (loopback):
 * its exchange() on host buffers. INVALID_ARGUMENT for iters < 1 or a transport without exchange. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_ep_transport_alltoall_time(const nvfp4moe_ep_transport *t, size_t bytes_per_peer,
                                                                 int32_t iters, double *seconds);

#ifdef __cplusplus
}
#endif

#endif // NVFP4MOE_EXPERIMENTAL_H
