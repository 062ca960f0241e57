/*
 * ep_nccl.c - the NCCL transport of expert parallelism (one process per GPU).
 *
 * NOT YET RUN ON GPUS: written and compiled in a session without a multi-GPU machine; only the
 * transport-independent logic (src/ep.c) was verified, with the loopback transport on the CPU.
 *
 * Built with NCCL's types (nvcc-less: nccl.h is plain C) when the Makefile finds nccl.h in a CUDA
 * build (NVFP4MOE_HAVE_NCCL). libnccl.so.2 is loaded with dlopen at nvfp4moe_ep_nccl_create, not
 * linked: the library, the CLI and the CPU tests then start on machines without NCCL, and only an
 * EP run needs it.
 *
 * One exchange = one ncclGroupStart/End holding every ncclSend and ncclRecv of the call (standard
 * format: variable byte counts after the count exchange; batched format: the fixed [max_tokens, H]
 * blocks, an all-to-all of equal sizes). Transfers are bytes (ncclUint8). The interface takes host
 * buffers (src/ep.c works in host memory), so sends are staged into one device buffer, receives
 * come back through another; a self transfer (peer == rank) is a host memcpy.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

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
                                   .exchange = nccl_exchange, .destroy = nccl_destroy};
    return NVFP4MOE_OK;
}

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

#endif
