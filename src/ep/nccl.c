/*
 * nccl.c - the NCCL transport of expert parallelism (one process per GPU). It has not run on
 * several GPUs; the transport-independent logic is tested with the loopback transport
 * (docs/expert_parallel.md, "What has been run").
 *
 * Built with NCCL's types (nvcc-less: nccl.h is plain C) when the Makefile finds nccl.h in a CUDA
 * build (NVFP4MOE_HAVE_NCCL). libnccl.so.2 is loaded with dlopen at nvfp4moe_ep_nccl_create, not
 * linked: the library, the CLI and the CPU tests then start on machines without NCCL, and only an
 * EP run needs it.
 *
 * One exchange = one ncclGroupStart/End holding every ncclSend and ncclRecv of the call (standard
 * format: variable byte counts after the count exchange; batched format: the fixed [max_tokens, H]
 * blocks, an all-to-all of equal sizes). Transfers are bytes (ncclUint8). exchange() takes host
 * buffers (the host path, and the small count/status/id exchanges of every path), so sends are
 * staged into one device buffer, receives come back through another; a self transfer (peer ==
 * rank) is a host memcpy. exchange_device() (the device-resident path: EP plans over device local
 * plans) sends and receives the caller's device buffers directly; a self transfer is a
 * device-to-device copy. Neither has run over NCCL yet (no multi-GPU machine was lent).
 */
#include "nvfp4moe_experimental.h"
#include "core/internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---- the transport's own all-to-all (the yardstick of bench --ep), transport-independent part ----

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(double *v, int32_t n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Every rank learns whether every rank is ready (allocations made): one int32 to each peer. A rank
 * that failed (mine != OK, its message set) still takes part, so none is left waiting in the
 * all-to-all; it returns its own status, the others one naming it. */
static nvfp4moe_status all_ready(const nvfp4moe_ep_transport *t, nvfp4moe_status mine) {
    const int32_t R = t->size;
    int32_t *f = calloc((size_t)R + 1, sizeof(int32_t));
    nvfp4moe_ep_xfer *x = calloc((size_t)(2 * R), sizeof *x);
    if (!f || !x) {   /* two small arrays: the other ranks would wait, as in ep_plan.c's agreement */
        free(f);
        free(x);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "all-to-all timing: out of memory");
    }
    f[R] = mine == NVFP4MOE_OK;
    for (int32_t r = 0; r < R; r++) {
        x[r] = (nvfp4moe_ep_xfer){r, &f[R], sizeof(int32_t)};
        x[R + r] = (nvfp4moe_ep_xfer){r, &f[r], sizeof(int32_t)};
    }
    nvfp4moe_status st = t->exchange(t->ctx, x, R, x + R, R);
    int32_t bad = -1;
    for (int32_t r = 0; st == NVFP4MOE_OK && r < R; r++)
        if (!f[r] && bad < 0) bad = r;
    free(f);
    free(x);
    if (st != NVFP4MOE_OK) return st;
    if (mine != NVFP4MOE_OK) return mine;
    NVFP4MOE_RETURN_IF(bad >= 0, NVFP4MOE_ERR_OUT_OF_MEMORY,
                       "all-to-all timing: rank %d could not allocate its buffers; see its message", bad);
    return NVFP4MOE_OK;
}

/* Any transport: exchange() on host buffers, bytes_per_peer to every other rank. */
static nvfp4moe_status host_alltoall_time(const nvfp4moe_ep_transport *t, size_t b, int32_t iters, double *seconds) {
    const int32_t R = t->size, me = t->rank;
    char *sbuf = malloc(b * (size_t)R + 1), *rbuf = malloc(b * (size_t)R + 1);
    nvfp4moe_ep_xfer *x = calloc((size_t)(2 * R), sizeof *x);
    double *times = malloc(sizeof(double) * (size_t)iters);
    nvfp4moe_status st = sbuf && rbuf && x && times
        ? NVFP4MOE_OK
        : nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "all-to-all timing: out of memory for 2 x %zu bytes",
                             b * (size_t)R);
    st = all_ready(t, st);
    int32_t n = 0;
    if (st == NVFP4MOE_OK) {
        memset(sbuf, me & 0xFF, b * (size_t)R);
        for (int32_t r = 0; r < R; r++)
            if (r != me) {
                x[n] = (nvfp4moe_ep_xfer){r, sbuf + b * (size_t)r, b};
                x[R + n] = (nvfp4moe_ep_xfer){r, rbuf + b * (size_t)r, b};
                n++;
            }
    }
    for (int32_t i = -1; st == NVFP4MOE_OK && i < iters; i++) {   /* i = -1: warm-up */
        const double t0 = wall_s();
        st = t->exchange(t->ctx, x, n, x + R, n);
        if (i >= 0) times[i] = wall_s() - t0;
    }
    if (st == NVFP4MOE_OK) *seconds = median_of(times, iters);
    free(sbuf); free(rbuf); free(x); free(times);
    return st;
}

#ifdef NVFP4MOE_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
/* nccl.h declares ncclGroupStart() and friends without (void): not ours to fix. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <stdio.h>
#include <time.h>
#include <unistd.h>

bool nvfp4moe_built_with_nccl(void) { return true; }

typedef struct {
    void *lib;
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    const char *(*GetErrorString)(ncclResult_t);
} nccl_api;

typedef struct {
    nccl_api api;
    ncclComm_t comm;
    cudaStream_t stream;
    int32_t size, rank, device;
    void *d_send, *d_recv;           /* staging buffers, grown on demand */
    size_t send_cap, recv_cap;
} nccl_ctx;

static nvfp4moe_status load_api(nccl_api *a) {
    memset(a, 0, sizeof *a);
    /* NVFP4MOE_NCCL_LIB first (a path), then the loader's search path, then CUDA's own lib64,
     * where the CUDA images keep NCCL without always registering it with the loader. */
    const char *env = getenv("NVFP4MOE_NCCL_LIB");
    const char *names[] = {env, "libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib64/libnccl.so.2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !a->lib; i++)
        if (names[i] && names[i][0]) a->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    NVFP4MOE_RETURN_IF(!a->lib, NVFP4MOE_ERR_UNSUPPORTED,
                       "NCCL transport: cannot load libnccl.so.2 (set NVFP4MOE_NCCL_LIB to its path): %s", dlerror());
    /* dlsym returns void *; the cast through a union keeps -Wpedantic quiet without changing bits. */
#define NCCL_SYM(field, name)                                                                      \
    do {                                                                                           \
        void *s_ = dlsym(a->lib, name);                                                            \
        if (!s_) {                                                                                 \
            dlclose(a->lib);                                                                       \
            a->lib = NULL;                                                                         \
            return nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED, "NCCL transport: libnccl has no %s", name); \
        }                                                                                          \
        memcpy(&a->field, &s_, sizeof s_);                                                         \
    } while (0)
    NCCL_SYM(GetUniqueId, "ncclGetUniqueId");
    NCCL_SYM(CommInitRank, "ncclCommInitRank");
    NCCL_SYM(CommDestroy, "ncclCommDestroy");
    NCCL_SYM(GroupStart, "ncclGroupStart");
    NCCL_SYM(GroupEnd, "ncclGroupEnd");
    NCCL_SYM(Send, "ncclSend");
    NCCL_SYM(Recv, "ncclRecv");
    NCCL_SYM(GetErrorString, "ncclGetErrorString");
#undef NCCL_SYM
    return NVFP4MOE_OK;
}

#define NCCL_CHECK(ctx, expr, what)                                                                \
    do {                                                                                           \
        ncclResult_t r_ = (expr);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            return nvfp4moe_set_error(NVFP4MOE_ERR_CUDA, "NCCL %s (rank %d): %s", what, (ctx)->rank, \
                                      (ctx)->api.GetErrorString(r_));                              \
    } while (0)
#define CUDA_CHECK(ctx, expr, what)                                                                \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return nvfp4moe_set_error(NVFP4MOE_ERR_CUDA, "NCCL transport %s (rank %d): CUDA: %s", what, \
                                      (ctx)->rank, cudaGetErrorString(e_));                        \
    } while (0)

static nvfp4moe_status grow(nccl_ctx *c, void **buf, size_t *cap, size_t need) {
    if (need <= *cap) return NVFP4MOE_OK;
    cudaFree(*buf);
    *buf = NULL;
    *cap = 0;
    CUDA_CHECK(c, cudaMalloc(buf, need), "staging buffer");
    *cap = need;
    return NVFP4MOE_OK;
}

static nvfp4moe_status nccl_exchange(void *ctx, const nvfp4moe_ep_xfer *sends, int32_t nsend,
                                     const nvfp4moe_ep_xfer *recvs, int32_t nrecv) {
    nccl_ctx *c = ctx;
    size_t sb = 0, rb = 0;
    for (int32_t i = 0; i < nsend; i++)
        if (sends[i].peer != c->rank) sb += sends[i].bytes;
    for (int32_t i = 0; i < nrecv; i++)
        if (recvs[i].peer != c->rank) rb += recvs[i].bytes;
    NVFP4MOE_TRY(grow(c, &c->d_send, &c->send_cap, sb ? sb : 1));
    NVFP4MOE_TRY(grow(c, &c->d_recv, &c->recv_cap, rb ? rb : 1));
    CUDA_CHECK(c, cudaSetDevice(c->device), "cudaSetDevice");
    size_t off = 0;
    for (int32_t i = 0; i < nsend; i++) {
        if (sends[i].peer == c->rank || !sends[i].bytes) continue;
        CUDA_CHECK(c, cudaMemcpyAsync((char *)c->d_send + off, sends[i].buf, sends[i].bytes, cudaMemcpyHostToDevice,
                                      c->stream), "staging a send");
        off += sends[i].bytes;
    }
    /* Self transfers: the k-th self send matches the k-th self receive, as between ranks. */
    int32_t k = 0;
    for (int32_t i = 0; i < nrecv; i++) {
        if (recvs[i].peer != c->rank) continue;
        while (k < nsend && sends[k].peer != c->rank) k++;
        NVFP4MOE_RETURN_IF(k == nsend || sends[k].bytes != recvs[i].bytes, NVFP4MOE_ERR_INTERNAL,
                           "NCCL transport: rank %d's self receive %d has no matching send", c->rank, i);
        if (recvs[i].bytes) memcpy(recvs[i].buf, sends[k].buf, recvs[i].bytes);
        k++;
    }
    /* Empty transfers are skipped on both sides: the counts agree on every rank, so the pairing
     * of the remaining sends and receives is unchanged. */
    NCCL_CHECK(c, c->api.GroupStart(), "ncclGroupStart");
    off = 0;
    for (int32_t i = 0; i < nsend; i++) {
        if (sends[i].peer == c->rank || !sends[i].bytes) continue;
        NCCL_CHECK(c, c->api.Send((char *)c->d_send + off, sends[i].bytes, ncclUint8, sends[i].peer, c->comm, c->stream),
                   "ncclSend");
        off += sends[i].bytes;
    }
    off = 0;
    for (int32_t i = 0; i < nrecv; i++) {
        if (recvs[i].peer == c->rank || !recvs[i].bytes) continue;
        NCCL_CHECK(c, c->api.Recv((char *)c->d_recv + off, recvs[i].bytes, ncclUint8, recvs[i].peer, c->comm, c->stream),
                   "ncclRecv");
        off += recvs[i].bytes;
    }
    NCCL_CHECK(c, c->api.GroupEnd(), "ncclGroupEnd");
    off = 0;
    for (int32_t i = 0; i < nrecv; i++) {
        if (recvs[i].peer == c->rank || !recvs[i].bytes) continue;
        CUDA_CHECK(c, cudaMemcpyAsync(recvs[i].buf, (char *)c->d_recv + off, recvs[i].bytes, cudaMemcpyDeviceToHost,
                                      c->stream), "copying a receive back");
        off += recvs[i].bytes;
    }
    CUDA_CHECK(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    return NVFP4MOE_OK;
}

/* Device buffers: no staging. The caller has finished writing the sends (its stream synchronized),
 * so the transport's own stream may read them; the receives are complete on return. */
static nvfp4moe_status nccl_exchange_device(void *ctx, const nvfp4moe_ep_xfer *sends, int32_t nsend,
                                            const nvfp4moe_ep_xfer *recvs, int32_t nrecv) {
    nccl_ctx *c = ctx;
    CUDA_CHECK(c, cudaSetDevice(c->device), "cudaSetDevice");
    /* Self transfers: device-to-device copies, the k-th self send to the k-th self receive. */
    int32_t k = 0;
    for (int32_t i = 0; i < nrecv; i++) {
        if (recvs[i].peer != c->rank) continue;
        while (k < nsend && sends[k].peer != c->rank) k++;
        NVFP4MOE_RETURN_IF(k == nsend || sends[k].bytes != recvs[i].bytes, NVFP4MOE_ERR_INTERNAL,
                           "NCCL transport: rank %d's self receive %d has no matching send", c->rank, i);
        if (recvs[i].bytes)
            CUDA_CHECK(c, cudaMemcpyAsync(recvs[i].buf, sends[k].buf, recvs[i].bytes, cudaMemcpyDeviceToDevice,
                                          c->stream), "a self copy");
        k++;
    }
    /* One group: NCCL pairs every send with its receive without ordering deadlocks. Empty transfers
     * are skipped on both sides, as in nccl_exchange. */
    NCCL_CHECK(c, c->api.GroupStart(), "ncclGroupStart");
    for (int32_t i = 0; i < nsend; i++) {
        if (sends[i].peer == c->rank || !sends[i].bytes) continue;
        NCCL_CHECK(c, c->api.Send(sends[i].buf, sends[i].bytes, ncclUint8, sends[i].peer, c->comm, c->stream), "ncclSend");
    }
    for (int32_t i = 0; i < nrecv; i++) {
        if (recvs[i].peer == c->rank || !recvs[i].bytes) continue;
        NCCL_CHECK(c, c->api.Recv(recvs[i].buf, recvs[i].bytes, ncclUint8, recvs[i].peer, c->comm, c->stream), "ncclRecv");
    }
    NCCL_CHECK(c, c->api.GroupEnd(), "ncclGroupEnd");
    CUDA_CHECK(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    return NVFP4MOE_OK;
}

static void nccl_destroy(void *ctx) {
    nccl_ctx *c = ctx;
    if (!c) return;
    if (c->comm) c->api.CommDestroy(c->comm);
    cudaFree(c->d_send);
    cudaFree(c->d_recv);
    if (c->stream) cudaStreamDestroy(c->stream);
    if (c->api.lib) dlclose(c->api.lib);
    free(c);
}

/* Rank 0 publishes the id atomically (tmp + rename) so a reader never sees half a file. */
static nvfp4moe_status share_id(nccl_ctx *c, const char *id_file, ncclUniqueId *id) {
    char tmp[4096];
    NVFP4MOE_RETURN_IF(strlen(id_file) + 5 > sizeof tmp, NVFP4MOE_ERR_INVALID_ARGUMENT, "NCCL id_file path is too long");
    if (c->rank == 0) {
        NCCL_CHECK(c, c->api.GetUniqueId(id), "ncclGetUniqueId");
        snprintf(tmp, sizeof tmp, "%s.tmp", id_file);
        FILE *f = fopen(tmp, "wb");
        NVFP4MOE_RETURN_IF(!f, NVFP4MOE_ERR_IO, "NCCL id_file %s: %s", tmp, strerror(errno));
        size_t n = fwrite(id, 1, sizeof *id, f);
        int cl = fclose(f);
        NVFP4MOE_RETURN_IF(n != sizeof *id || cl != 0 || rename(tmp, id_file) != 0, NVFP4MOE_ERR_IO,
                           "NCCL id_file %s: cannot write it", id_file);
        return NVFP4MOE_OK;
    }
    for (int tries = 0; tries < 120 * 20; tries++) {
        FILE *f = fopen(id_file, "rb");
        if (f) {
            size_t n = fread(id, 1, sizeof *id, f);
            fclose(f);
            NVFP4MOE_RETURN_IF(n != sizeof *id, NVFP4MOE_ERR_FORMAT, "NCCL id_file %s has %zu bytes, want %zu", id_file, n,
                               sizeof *id);
            return NVFP4MOE_OK;
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return nvfp4moe_set_error(NVFP4MOE_ERR_IO, "NCCL id_file %s did not appear within 120 s (is rank 0 running?)",
                              id_file);
}

nvfp4moe_status nvfp4moe_ep_nccl_create(int32_t size, int32_t rank, int32_t device, const char *id_file,
                                        nvfp4moe_ep_transport *out) {
    NVFP4MOE_RETURN_IF(!out || !id_file, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_ep_nccl_create: %s is NULL",
                       !out ? "out" : "id_file");
    NVFP4MOE_RETURN_IF(size < 1 || rank < 0 || rank >= size, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "NCCL transport: rank=%d must be in [0, size=%d)", rank, size);
    /* NVLink SHARP (multicast) stays off: the machines this runs on must not create multicast
     * objects. The caller's own setting is kept if it set one. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    nccl_ctx *c = calloc(1, sizeof *c);
    NVFP4MOE_RETURN_IF(!c, NVFP4MOE_ERR_OUT_OF_MEMORY, "NCCL transport: out of memory");
    c->size = size;
    c->rank = rank;
    c->device = device;
    nvfp4moe_status st = load_api(&c->api);
    ncclUniqueId id;
    cudaError_t e = cudaSuccess;
    if (st == NVFP4MOE_OK && ((e = cudaSetDevice(device)) != cudaSuccess ||
                              (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess))
        st = nvfp4moe_set_error(NVFP4MOE_ERR_CUDA, "NCCL transport: CUDA device %d: %s", device, cudaGetErrorString(e));
    if (st == NVFP4MOE_OK) st = share_id(c, id_file, &id);
    if (st == NVFP4MOE_OK) {
        ncclResult_t r = c->api.CommInitRank(&c->comm, size, id, rank);
        if (r != ncclSuccess) {
            c->comm = NULL;
            st = nvfp4moe_set_error(NVFP4MOE_ERR_CUDA, "ncclCommInitRank (rank %d of %d): %s", rank, size,
                                    c->api.GetErrorString(r));
        }
    }
    if (st != NVFP4MOE_OK) {
        nccl_destroy(c);
        return st;
    }
    *out = (nvfp4moe_ep_transport){.size = size, .rank = rank, .ctx = c, .name = "nccl",
                                   .exchange = nccl_exchange, .destroy = nccl_destroy,
                                   .exchange_device = nccl_exchange_device};
    return NVFP4MOE_OK;
}

/* NCCL's own all-to-all between device buffers: what the EP exchanges are compared with. */
static nvfp4moe_status nccl_alltoall_time(const nvfp4moe_ep_transport *t, size_t b, int32_t iters, double *seconds) {
    nccl_ctx *c = t->ctx;
    const int32_t R = c->size, me = c->rank;
    void *ds = NULL, *dr = NULL;
    double *times = malloc(sizeof(double) * (size_t)iters);
    cudaError_t e = cudaSetDevice(c->device);
    if (e == cudaSuccess) e = cudaMalloc(&ds, b * (size_t)R + 1);
    if (e == cudaSuccess) e = cudaMalloc(&dr, b * (size_t)R + 1);
    if (e == cudaSuccess) e = cudaMemsetAsync(ds, me & 0xFF, b * (size_t)R + 1, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    nvfp4moe_status st = e == cudaSuccess && times
        ? NVFP4MOE_OK
        : nvfp4moe_set_error(e != cudaSuccess ? NVFP4MOE_ERR_CUDA : NVFP4MOE_ERR_OUT_OF_MEMORY,
                             "all-to-all timing (rank %d): 2 x %zu device bytes: %s", me, b * (size_t)R,
                             e != cudaSuccess ? cudaGetErrorString(e) : "out of host memory");
    st = all_ready(t, st);
    /* Two warm-ups: NCCL connects peers lazily, on their first transfer. */
    for (int32_t i = -2; st == NVFP4MOE_OK && i < iters; i++) {
        const double t0 = wall_s();
        ncclResult_t r = c->api.GroupStart();
        for (int32_t p = 0; r == ncclSuccess && p < R; p++)
            if (p != me && b) r = c->api.Send((char *)ds + b * (size_t)p, b, ncclUint8, p, c->comm, c->stream);
        for (int32_t p = 0; r == ncclSuccess && p < R; p++)
            if (p != me && b) r = c->api.Recv((char *)dr + b * (size_t)p, b, ncclUint8, p, c->comm, c->stream);
        ncclResult_t r2 = c->api.GroupEnd();
        if (r == ncclSuccess) r = r2;
        if (r != ncclSuccess) {
            st = nvfp4moe_set_error(NVFP4MOE_ERR_CUDA, "NCCL all-to-all timing (rank %d): %s", me,
                                    c->api.GetErrorString(r));
            break;
        }
        if ((e = cudaStreamSynchronize(c->stream)) != cudaSuccess) {
            st = nvfp4moe_set_error(NVFP4MOE_ERR_CUDA, "NCCL all-to-all timing (rank %d): CUDA: %s", me,
                                    cudaGetErrorString(e));
            break;
        }
        if (i >= 0) times[i] = wall_s() - t0;
    }
    if (st == NVFP4MOE_OK) *seconds = median_of(times, iters);
    cudaFree(ds);
    cudaFree(dr);
    free(times);
    return st;
}

static bool is_nccl(const nvfp4moe_ep_transport *t) { return t->exchange == nccl_exchange; }

#else /* !NVFP4MOE_HAVE_NCCL */

bool nvfp4moe_built_with_nccl(void) { return false; }

nvfp4moe_status nvfp4moe_ep_nccl_create(int32_t size, int32_t rank, int32_t device, const char *id_file,
                                        nvfp4moe_ep_transport *out) {
    NVFP4MOE_RETURN_IF(!out || !id_file, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_ep_nccl_create: %s is NULL",
                       !out ? "out" : "id_file");
    NVFP4MOE_RETURN_IF(size < 1 || rank < 0 || rank >= size, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "NCCL transport: rank=%d must be in [0, size=%d)", rank, size);
    return nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED,
                              "this build has no NCCL transport (%s): expert parallelism across processes needs a "
                              "CUDA build where nccl.h was found; the loopback transport runs in one process",
                              nvfp4moe_built_with_cuda() ? "nccl.h was not found at build time" : "CPU-only build");
}

static bool is_nccl(const nvfp4moe_ep_transport *t) {
    (void)t;
    return false;
}

static nvfp4moe_status nccl_alltoall_time(const nvfp4moe_ep_transport *t, size_t b, int32_t iters, double *seconds) {
    (void)t; (void)b; (void)iters; (void)seconds;
    return nvfp4moe_set_error(NVFP4MOE_ERR_INTERNAL, "NCCL all-to-all timing in a build without NCCL");
}

#endif

nvfp4moe_status nvfp4moe_ep_transport_alltoall_time(const nvfp4moe_ep_transport *t, size_t bytes_per_peer,
                                                    int32_t iters, double *seconds) {
    NVFP4MOE_RETURN_IF(!t || !t->exchange || !seconds, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "nvfp4moe_ep_transport_alltoall_time: %s",
                       !t ? "transport is NULL" : !t->exchange ? "the transport has no exchange function" : "seconds is NULL");
    NVFP4MOE_RETURN_IF(iters < 1, NVFP4MOE_ERR_INVALID_ARGUMENT, "all-to-all timing: iters=%d must be >= 1", iters);
    NVFP4MOE_RETURN_IF(t->size < 1 || t->rank < 0 || t->rank >= t->size, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "all-to-all timing: the transport's rank %d is not in [0, size=%d)", t->rank, t->size);
    return is_nccl(t) ? nccl_alltoall_time(t, bytes_per_peer, iters, seconds)
                      : host_alltoall_time(t, bytes_per_peer, iters, seconds);
}
