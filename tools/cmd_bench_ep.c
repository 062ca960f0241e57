/*
 * cmd_bench_ep.c - `nvfp4moe bench --ep N`: the EP time split and all-to-all bandwidth on real
 * models' layers, over the launcher of `run --ep` (NCCL, one process per GPU) or the loopback
 * (threads; all ranks on the one GPU, or the CPU), which the output labels as not NCCL.
 */
#include "cli_ep.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef NVFP4MOE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

// ---- bench --ep ----
//
// Every rank runs the same function (bench_rank): as a thread over the loopback transport, or as
// its own process over NCCL. Rank 0 gathers the other ranks' stats through the transport after
// every forward, so both modes share one code path, and writes the results.

typedef struct {
    uint8_t *w13, *s13, *w2, *s2;
    float *g13, *g2, *in13, *in2;
} bench_layer;

typedef struct {
    const cli_layer_preset *p;
    int64_t M;
    char backend[40];
    int64_t rows_min, rows_max;       /* rows received per rank */
    double dispatch_ms, experts_ms, combine_ms, total_ms, xfer_ms;   /* medians of the slowest rank */
    double remote_mb;                 /* bytes sent to other ranks per forward, mean over ranks */
    double ep_gbps;                   /* remote bytes / all-to-all time */
    size_t peak_bytes_per_peer;
    double peak_ms, peak_gbps;        /* the transport's plain all-to-all of the same bytes per peer */
    bool ok;
    bool device_resident;             /* every rank's forwards kept the rows on the device */
} bench_point;

typedef struct {
    int32_t N;
    const cli_layer_preset *presets[16];
    int npresets;
    int64_t Ms[32];
    int nM, iters;
    bool per_gpu, nccl;
    const char *local_backend;        /* NULL: the oracle's pick */
    nvfp4moe_device dev;
    bench_layer shared;               /* loopback: the layer all threads fill and read */
    bool failed;                      /* loopback: set by rank 0 when something failed */
    bench_point pts[16 * 32];
    int npts;
    char out[512], commit[64], date[32], command[1024], where[160];
    bool json;                        /* --json: the points as JSON lines on stdout at the end */
} bench_ep;

static void layer_free(bench_layer *l) {
    free(l->w13); free(l->s13); free(l->w2); free(l->s2);
    free(l->g13); free(l->g2); free(l->in13); free(l->in2);
    memset(l, 0, sizeof *l);
}

/* calloc: the pages of experts a process never fills stay unmapped (one process per GPU fills only
 * its own experts; the plan reads only those codes). */
static bool layer_alloc(bench_layer *l, const nvfp4moe_config *c) {
    const size_t E = (size_t)c->num_experts, H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    const size_t N1 = (size_t)nvfp4moe_config_n1(c);
    l->w13 = calloc(E * N1 * H / 2, 1);
    l->s13 = calloc(E * N1 * H / 16, 1);
    l->w2 = calloc(E * H * I / 2, 1);
    l->s2 = calloc(E * H * I / 16, 1);
    l->g13 = malloc(sizeof(float) * E);
    l->g2 = malloc(sizeof(float) * E);
    l->in13 = malloc(sizeof(float) * E);
    l->in2 = malloc(sizeof(float) * E);
    if (!l->w13 || !l->s13 || !l->w2 || !l->s2 || !l->g13 || !l->g2 || !l->in13 || !l->in2) {
        layer_free(l);
        return false;
    }
    for (size_t e = 0; e < E; e++) {
        /* weights of roughly unit variance / sqrt(fan-in), as bench's */
        l->g13[e] = (float)(1.0 / (125.0 * sqrt((double)H)));
        l->g2[e] = (float)(1.0 / (125.0 * sqrt((double)I)));
        l->in13[e] = l->in2[e] = 1.0f;
    }
    return true;
}

/* Experts [first, first + n): random E2M1 codes and E4M3 scales, seeded per expert, so every
 * process makes the same expert the same way. */
static void layer_fill_range(bench_layer *l, const nvfp4moe_config *c, int64_t first, int64_t n) {
    const size_t H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size, N1 = (size_t)nvfp4moe_config_n1(c);
    for (int64_t e = first; e < first + n; e++) {
        const uint64_t s = 0x5EED0000ull + (uint64_t)e * 4;
        cli_fill_nvfp4(l->w13 + (size_t)e * N1 * H / 2, N1 * H / 2, s, false);
        cli_fill_nvfp4(l->s13 + (size_t)e * N1 * H / 16, N1 * H / 16, s + 1, true);
        cli_fill_nvfp4(l->w2 + (size_t)e * H * I / 2, H * I / 2, s + 2, false);
        cli_fill_nvfp4(l->s2 + (size_t)e * H * I / 16, H * I / 16, s + 3, true);
    }
}

typedef struct {
    bench_layer *l;
    const nvfp4moe_config *c;
    int64_t first, n;
} fill_job;

static void *fill_main(void *arg) {
    fill_job *j = arg;
    layer_fill_range(j->l, j->c, j->first, j->n);
    return NULL;
}

/* The same, spread over `threads` threads (gigabytes of weights: the page faults dominate). The
 * values do not depend on the thread count. */
static void layer_fill(bench_layer *l, const nvfp4moe_config *c, int64_t first, int64_t n, int threads) {
    fill_job jobs[32];
    pthread_t tid[32];
    bool started[32] = {false};
    if (threads > 32) threads = 32;
    if (threads > n) threads = (int)n;
    if (threads < 1) threads = 1;
    for (int i = 0; i < threads; i++) {
        const int64_t a = first + n * i / threads, b = first + n * (i + 1) / threads;
        jobs[i] = (fill_job){l, c, a, b - a};
        if (i > 0) started[i] = pthread_create(&tid[i], NULL, fill_main, &jobs[i]) == 0;
    }
    for (int i = 1; i < threads; i++)
        if (!started[i]) layer_fill_range(l, c, jobs[i].first, jobs[i].n);   /* no thread: do it here */
    layer_fill_range(l, c, jobs[0].first, jobs[0].n);
    for (int i = 1; i < threads; i++)
        if (started[i]) pthread_join(tid[i], NULL);
}

/* Every rank says whether it is fine; true when all are (a barrier too: the loopback's exchange
 * orders memory). */
static bool all_ok(const nvfp4moe_ep_transport *t, bool ok) {
    int32_t mine = ok, theirs[64] = {0};
    nvfp4moe_ep_xfer x[128];
    for (int32_t r = 0; r < t->size; r++) {
        x[r] = (nvfp4moe_ep_xfer){r, &mine, sizeof mine};
        x[64 + r] = (nvfp4moe_ep_xfer){r, &theirs[r], sizeof theirs[r]};
    }
    if (t->exchange(t->ctx, x, t->size, x + 64, t->size) != NVFP4MOE_OK) return false;
    for (int32_t r = 0; r < t->size; r++) ok = ok && theirs[r];
    return ok;
}

/* Rank 0 receives `bytes` from every rank into all[r * bytes] (its own included). */
static nvfp4moe_status gather0(const nvfp4moe_ep_transport *t, const void *mine, void *all, size_t bytes) {
    nvfp4moe_ep_xfer s = {0, (void *)mine, bytes}, r[64];
    int32_t nr = 0;
    if (t->rank == 0)
        for (int32_t k = 0; k < t->size; k++) r[nr++] = (nvfp4moe_ep_xfer){k, (char *)all + (size_t)k * bytes, bytes};
    return t->exchange(t->ctx, &s, 1, r, nr);
}

/* Every rank receives rank 0's `bytes` into buf (rank 0's buf is the source). */
static nvfp4moe_status bcast0(const nvfp4moe_ep_transport *t, void *buf, size_t bytes) {
    nvfp4moe_ep_xfer s[64], r = {0, buf, bytes};
    int32_t ns = 0;
    char tmp[64];
    if (t->rank == 0) {
        memcpy(tmp, buf, bytes);
        for (int32_t k = 0; k < t->size; k++) s[ns++] = (nvfp4moe_ep_xfer){k, tmp, bytes};
    }
    return t->exchange(t->ctx, s, ns, &r, 1);
}

static int cmp_dbl(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
    int32_t status;
    nvfp4moe_ep_stats s;
} rank_stats;

static int write_ep_outputs(const bench_ep *b, bool quiet);

/* One preset on this rank: layer, plan, every M. */
static nvfp4moe_status bench_preset_rank(bench_ep *b, const cli_layer_preset *pr, int32_t rank,
                                         const nvfp4moe_ep_transport *t) {
    const int32_t N = b->N;
    nvfp4moe_config cfg;
    cli_preset_config(pr, &cfg);
    cfg.parallel.ep_size = N;
    cfg.parallel.ep_rank = rank;
    const int64_t L = pr->E / N, H = pr->H, E = pr->E;

    /* The layer: shared by the loopback's threads (rank 0 allocates), private per process. */
    bench_layer own = {0}, *lay = b->per_gpu ? &own : &b->shared;
    bool ok = true;
    if (b->per_gpu || rank == 0) ok = layer_alloc(lay, &cfg);
    if (!ok) fprintf(stderr, "nvfp4moe bench: rank %d: out of memory for %s's weights\n", rank, pr->name);
    if (!all_ok(t, ok)) {
        layer_free(&own);
        if (rank == 0 && !b->per_gpu) layer_free(&b->shared);
        fprintf(stderr, "nvfp4moe bench: rank %d: %s: a rank could not allocate the layer\n", rank, pr->name);
        return NVFP4MOE_ERR_OUT_OF_MEMORY;
    }
    const double t0 = cli_now_s();
    /* The CPUs are shared by the ranks of this machine (threads or processes alike). */
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    layer_fill(lay, &cfg, (int64_t)rank * L, L, cpus > N ? (int)(cpus / N) : 1);
    const double fill_s = cli_now_s() - t0;
    all_ok(t, true);   /* every rank's experts are written before any plan reads the scales */
    nvfp4moe_weights w = {.w13 = lay->w13, .w13_scale = lay->s13, .w13_scale_2 = lay->g13, .w13_input_scale = lay->in13,
                          .w2 = lay->w2, .w2_scale = lay->s2, .w2_scale_2 = lay->g2, .w2_input_scale = lay->in2};
    nvfp4moe_device dev = b->dev;
    if (b->per_gpu) dev.ordinal = rank;
    nvfp4moe_plan_options po = {.device = &dev};
    nvfp4moe_ep_options eo = {.plan = &po, .local_backend = b->local_backend};
    nvfp4moe_ep_plan *plan = NULL;
    const double t1 = cli_now_s();
    nvfp4moe_status st = nvfp4moe_ep_plan_create(&cfg, &w, t, &eo, &plan);   /* collective */
    if (rank == 0 && st == NVFP4MOE_OK) {
        fprintf(cli_bench_text, "\n== %s: E=%d H=%d I=%d top_k=%d, %d ranks x %lld experts; weights made in %.1f s (rank 0), plans in "
               "%.1f s; local experts on %s (oracle: %s)\n",
               pr->name, pr->E, pr->H, pr->I, pr->k, N, (long long)L, fill_s, cli_now_s() - t1,
               nvfp4moe_plan_backend(nvfp4moe_ep_plan_local(plan)),
               nvfp4moe_ep_plan_report(plan)->backend[0] ? nvfp4moe_ep_plan_report(plan)->backend : "none");
        fprintf(cli_bench_text, "  %6s %9s %9s %9s %9s %9s %9s %10s %9s %12s %7s\n", "M/rank", "rows max", "dispatch", "experts",
               "combine", "total ms", "a2a ms", "MB/rank", "a2a GB/s", "plain GB/s", "% plain");
        fflush(cli_bench_text);
    }
    int64_t Mmax = 0;
    for (int i = 0; i < b->nM; i++) Mmax = b->Ms[i] > Mmax ? b->Ms[i] : Mmax;
    void *hidden = NULL, *out = NULL;
    float *logits = NULL;
    const int iters = b->iters, warm = 1;
    rank_stats *all = NULL;   /* rank 0: [warm + iters][N] */
    double *tmp = NULL;
    if (st == NVFP4MOE_OK) {
        hidden = malloc((size_t)(Mmax * H) * 2 + 2);
        logits = malloc(sizeof(float) * (size_t)(Mmax * E) + 4);
        out = malloc((size_t)(Mmax * H) * 2 + 2);
        if (rank == 0) {
            all = calloc((size_t)N * (size_t)(iters + warm), sizeof *all);
            tmp = malloc(sizeof(double) * (size_t)iters * 5);
        }
        if (hidden && logits && out) {
            nvfp4moe_fill_normal(hidden, NVFP4MOE_DTYPE_BF16, Mmax * H, 100 + (uint64_t)rank * 1000003u);
            nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, Mmax * E, 200 + (uint64_t)rank * 1000003u);
        }
        if (!all_ok(t, hidden && logits && out && (rank != 0 || (all && tmp)))) {
            fprintf(stderr, "nvfp4moe bench: rank %d: %s: a rank could not allocate %lld tokens\n", rank, pr->name,
                    (long long)Mmax);
            st = NVFP4MOE_ERR_OUT_OF_MEMORY;
        }
    }
    /* Device local plans: the tokens live on the device, as in a model, and the forward is the
     * device-resident one (nvfp4moe_ep_forward_device) on a stream of this rank's own. */
    void *dev_hidden = NULL, *dev_logits = NULL, *dev_out = NULL, *dev_stream = NULL;
    const bool on_device = st == NVFP4MOE_OK && nvfp4moe_plan_uses_device_memory(nvfp4moe_ep_plan_local(plan));
#ifdef NVFP4MOE_HAVE_CUDA
    if (on_device) {
        cudaStream_t cs = NULL;
        const bool dok = cudaMalloc(&dev_hidden, (size_t)(Mmax * H) * 2 + 16) == cudaSuccess &&
                         cudaMalloc(&dev_logits, sizeof(float) * (size_t)(Mmax * E) + 16) == cudaSuccess &&
                         cudaMalloc(&dev_out, (size_t)(Mmax * H) * 2 + 16) == cudaSuccess &&
                         cudaMemcpy(dev_hidden, hidden, (size_t)(Mmax * H) * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
                         cudaMemcpy(dev_logits, logits, sizeof(float) * (size_t)(Mmax * E), cudaMemcpyHostToDevice) ==
                             cudaSuccess &&
                         cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) == cudaSuccess &&
                         cudaDeviceSynchronize() == cudaSuccess;   /* pageable copies may return before their DMA lands */
        dev_stream = cs;
        if (!all_ok(t, dok)) {
            fprintf(stderr, "nvfp4moe bench: rank %d: %s: a rank could not put %lld tokens on its device\n", rank,
                    pr->name, (long long)Mmax);
            st = NVFP4MOE_ERR_CUDA;
        }
    }
#endif
    for (int mi = 0; st == NVFP4MOE_OK && mi < b->nM; mi++) {
        const int64_t M = b->Ms[mi];
        nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits, .output = out};
        nvfp4moe_io dio = {.num_tokens = M, .hidden = dev_hidden, .router_logits = dev_logits, .output = dev_out};
        for (int it = 0; it < warm + iters && st == NVFP4MOE_OK; it++) {
            rank_stats mine = {0};
            /* failures are agreed */
            mine.status = (int32_t)(on_device ? nvfp4moe_ep_forward_device(plan, &dio, dev_stream, &mine.s)
                                              : nvfp4moe_ep_forward(plan, &io, &mine.s));
            st = (nvfp4moe_status)mine.status;
            nvfp4moe_status gst = gather0(t, &mine, all ? all + (size_t)it * N : NULL, sizeof mine);
            if (st == NVFP4MOE_OK) st = gst;
        }
        if (st != NVFP4MOE_OK) break;
        /* The transport's own all-to-all of the dispatch's bytes per peer (rank 0 decides). */
        uint64_t bpp = 0;
        if (rank == 0 && N > 1) {
            double sum = 0;
            for (int32_t r = 0; r < N; r++) sum += (double)all[(size_t)(warm + iters - 1) * N + r].s.dispatch_bytes_remote;
            bpp = (uint64_t)(sum / N / (N - 1));
        }
        if ((st = bcast0(t, &bpp, sizeof bpp)) != NVFP4MOE_OK) break;
        double peak_s = 0, peaks[64] = {0};
        if ((st = nvfp4moe_ep_transport_alltoall_time(t, (size_t)bpp, iters, &peak_s)) != NVFP4MOE_OK) break;
        if ((st = gather0(t, &peak_s, peaks, sizeof peak_s)) != NVFP4MOE_OK) break;
        if (rank != 0) continue;
        bench_point *pt = &b->pts[b->npts < (int)(sizeof b->pts / sizeof b->pts[0]) ? b->npts++ : b->npts - 1];
        memset(pt, 0, sizeof *pt);
        pt->p = pr;
        pt->M = M;
        pt->ok = true;
        snprintf(pt->backend, sizeof pt->backend, "%s", nvfp4moe_plan_backend(nvfp4moe_ep_plan_local(plan)));
        double *d = tmp, *e = d + iters, *c = e + iters, *tot = c + iters, *x = tot + iters;
        double remote = 0;
        pt->rows_min = INT64_MAX;
        pt->device_resident = true;
        for (int it = 0; it < iters; it++) {
            d[it] = e[it] = c[it] = tot[it] = x[it] = 0;
            for (int32_t r = 0; r < N; r++) {
                const nvfp4moe_ep_stats *s = &all[(size_t)(warm + it) * N + r].s;
                d[it] = fmax(d[it], s->dispatch_s);
                e[it] = fmax(e[it], s->experts_s);
                c[it] = fmax(c[it], s->combine_s);
                tot[it] = fmax(tot[it], s->dispatch_s + s->experts_s + s->combine_s);
                x[it] = fmax(x[it], s->dispatch_xfer_s + s->combine_xfer_s);
                pt->device_resident = pt->device_resident && s->device_resident;
                if (it == 0) {
                    remote += (double)(s->dispatch_bytes_remote + s->combine_bytes_remote) / N;
                    pt->rows_min = s->rows_received < pt->rows_min ? s->rows_received : pt->rows_min;
                    pt->rows_max = s->rows_received > pt->rows_max ? s->rows_received : pt->rows_max;
                }
            }
        }
        pt->dispatch_ms = 1e3 * median(d, iters);
        pt->experts_ms = 1e3 * median(e, iters);
        pt->combine_ms = 1e3 * median(c, iters);
        pt->total_ms = 1e3 * median(tot, iters);
        pt->xfer_ms = 1e3 * median(x, iters);
        pt->remote_mb = remote / 1e6;
        pt->ep_gbps = pt->xfer_ms > 0 ? remote / (pt->xfer_ms * 1e-3) / 1e9 : 0;
        double pk = 0;
        for (int32_t r = 0; r < N; r++) pk = fmax(pk, peaks[r]);
        pt->peak_bytes_per_peer = (size_t)bpp;
        pt->peak_ms = 1e3 * pk;
        pt->peak_gbps = pk > 0 ? (double)bpp * (N - 1) / pk / 1e9 : 0;
        fprintf(cli_bench_text, "  %6lld %9lld %9.3f %9.3f %9.3f %9.3f %9.3f %10.2f %9.2f %12.2f %7.1f\n", (long long)M,
               (long long)pt->rows_max, pt->dispatch_ms, pt->experts_ms, pt->combine_ms, pt->total_ms, pt->xfer_ms,
               pt->remote_mb, pt->ep_gbps, pt->peak_gbps, pt->peak_gbps > 0 ? 100 * pt->ep_gbps / pt->peak_gbps : 0);
        fflush(cli_bench_text);
        /* The files after every point: a run stopped by a time limit keeps what it measured. */
        write_ep_outputs(b, true);
    }
    free(all);
    free(tmp);
    free(hidden);
    free(logits);
    free(out);
#ifdef NVFP4MOE_HAVE_CUDA
    cudaFree(dev_hidden);
    cudaFree(dev_logits);
    cudaFree(dev_out);
    if (dev_stream) cudaStreamDestroy((cudaStream_t)dev_stream);
#endif
    nvfp4moe_ep_plan_destroy(plan);
    all_ok(t, true);   /* no rank frees the shared layer while another still reads it */
    layer_free(&own);
    if (rank == 0 && !b->per_gpu) layer_free(&b->shared);
    return st;
}

static nvfp4moe_status bench_rank(int32_t rank, const nvfp4moe_ep_transport *t, void *ctx) {
    bench_ep *b = ctx;
    nvfp4moe_status first = NVFP4MOE_OK;
    for (int i = 0; i < b->npresets; i++) {
        nvfp4moe_status st = bench_preset_rank(b, b->presets[i], rank, t);
        if (st != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe bench: rank %d: %s failed: %s (last library message: %s)\n", rank,
                    b->presets[i]->name, nvfp4moe_status_str(st), nvfp4moe_last_error());
            if (first == NVFP4MOE_OK) first = st;
        }
    }
    return first;
}

static int write_ep_outputs(const bench_ep *b, bool quiet) {
    char path[600];
    snprintf(path, sizeof path, "%s.csv", b->out);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "nvfp4moe bench: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "preset,E,H,I,top_k,ep,transport,M_per_rank,local_backend,rows_received_min,rows_received_max,"
               "dispatch_ms,experts_ms,combine_ms,total_ms,alltoall_ms,remote_MB_per_rank,alltoall_GBps,"
               "plain_alltoall_bytes_per_peer,plain_alltoall_ms,plain_alltoall_GBps,pct_of_plain,path\n");
    for (int i = 0; i < b->npts; i++) {
        const bench_point *p = &b->pts[i];
        fprintf(f, "%s,%d,%d,%d,%d,%d,%s,%lld,%s,%lld,%lld,%.4f,%.4f,%.4f,%.4f,%.4f,%.3f,%.3f,%zu,%.4f,%.3f,%.1f,%s\n",
                p->p->name, p->p->E, p->p->H, p->p->I, p->p->k, b->N, b->nccl ? "nccl" : "loopback", (long long)p->M,
                p->backend, (long long)p->rows_min, (long long)p->rows_max, p->dispatch_ms, p->experts_ms,
                p->combine_ms, p->total_ms, p->xfer_ms, p->remote_mb, p->ep_gbps, p->peak_bytes_per_peer, p->peak_ms,
                p->peak_gbps, p->peak_gbps > 0 ? 100 * p->ep_gbps / p->peak_gbps : 0,
                p->device_resident ? "device" : "host");
    }
    fclose(f);
    snprintf(path, sizeof path, "%s.md", b->out);
    if (!(f = fopen(path, "w"))) {
        fprintf(stderr, "nvfp4moe bench: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "# nvfp4moe bench --ep %d: expert parallelism, %s\n\n", b->N,
            b->nccl ? "NCCL, one process per GPU" : "LOOPBACK (not NCCL)");
    if (!b->nccl)
        fprintf(f, "**These are loopback figures, NOT NCCL figures.** The %d ranks are threads of one process on %s; "
                   "an all-to-all is a memcpy between threads' buffers (device to device on the device-resident "
                   "path, host memcpy on the host path), and the ranks' experts share that one device. "
                   "They show where a forward's time goes in this implementation, not what %d GPUs over NCCL do.\n\n",
                b->N, b->where, b->N);
    fprintf(f, "- card: %s\n- date: %s\n- commit: %s\n- command: `%s`\n", b->where, b->date, b->commit, b->command);
    fprintf(f, "- transport: %s\n", b->nccl ? "NCCL (ncclSend/ncclRecv groups, NCCL_NVLS_ENABLE=0), one process per GPU"
                                           : "in-process loopback (nvfp4moe_ep_loopback): threads; rows by "
                                             "cudaMemcpyAsync between device buffers (device-resident path) or host "
                                             "memcpy (host path); counts and ids by host memcpy");
    fprintf(f, "- layer: random NVFP4 weights (E2M1 codes, E4M3 scales in [2^-3, 448]), bf16 activations, random "
               "normal router logits (renormalize top-k), standard activation format; M tokens on every rank\n");
    fprintf(f, "- timing: 1 warm-up, then the median of %d forwards (wall clock on each rank) "
               "of the slowest rank's time per stage. dispatch = routing + dispatch plan + gather + the count, "
               "row and id all-to-alls; experts = the local plan + an agreement that waits for the slowest rank; "
               "combine = the rows back + the weighted sum. total = the slowest rank's sum. path: device = "
               "device local plans, tokens in device memory, `nvfp4moe_ep_forward_device` (routing, gather, "
               "row exchanges and combine on the device; only counts, statuses, top-k ids and row indices "
               "through the host); host = host local plans, everything on the host\n", b->iters);
    fprintf(f, "- all-to-all: time inside the transport's exchange() in the dispatch and the combine (slowest "
               "rank); MB/rank = bytes each rank sends to OTHER ranks per forward (mean); GB/s = MB/rank / that "
               "time. plain = the transport's own all-to-all (`nvfp4moe_ep_transport_alltoall_time`: %s) with "
               "the dispatch's mean bytes per peer, measured in the same run, median of %d; %% plain = a2a GB/s / "
               "plain GB/s\n\n",
            b->nccl ? "ncclSend/ncclRecv between device buffers, no staging: NCCL's own peak here"
                    : "exchange() on host buffers, i.e. memcpy between threads", b->iters);
    const cli_layer_preset *cur = NULL;
    for (int i = 0; i < b->npts; i++) {
        const bench_point *p = &b->pts[i];
        if (p->p != cur) {
            cur = p->p;
            fprintf(f, "\n## %s (E=%d, H=%d, I=%d, top-%d), ep=%d (%d experts per rank), local experts on %s, %s path\n\n",
                    cur->name, cur->E, cur->H, cur->I, cur->k, b->N, cur->E / b->N, p->backend,
                    p->device_resident ? "device-resident" : "host");
            fprintf(f, "| M per rank | rows received (min-max) | dispatch (ms) | experts (ms) | combine (ms) | total (ms) "
                       "| all-to-all (ms) | MB/rank | all-to-all GB/s | plain all-to-all GB/s | %% of plain |\n");
            fprintf(f, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        }
        fprintf(f, "| %lld | %lld-%lld | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.2f | %.1f |\n", (long long)p->M,
                (long long)p->rows_min, (long long)p->rows_max, p->dispatch_ms, p->experts_ms, p->combine_ms,
                p->total_ms, p->xfer_ms, p->remote_mb, p->ep_gbps, p->peak_gbps,
                p->peak_gbps > 0 ? 100 * p->ep_gbps / p->peak_gbps : 0);
    }
    fclose(f);
    json_t *rows[16 * 32];
    for (int i = 0; i < b->npts; i++) {
        const bench_point *p = &b->pts[i];
        json_t *o = rows[i] = json_object();
        json_object_set_new(o, "preset", json_string(p->p->name));
        json_object_set_new(o, "E", json_integer(p->p->E));
        json_object_set_new(o, "H", json_integer(p->p->H));
        json_object_set_new(o, "I", json_integer(p->p->I));
        json_object_set_new(o, "top_k", json_integer(p->p->k));
        json_object_set_new(o, "ep", json_integer(b->N));
        json_object_set_new(o, "transport", json_string(b->nccl ? "nccl" : "loopback"));
        json_object_set_new(o, "M_per_rank", json_integer(p->M));
        json_object_set_new(o, "local_backend", json_string(p->backend));
        json_object_set_new(o, "rows_received_min", json_integer(p->rows_min));
        json_object_set_new(o, "rows_received_max", json_integer(p->rows_max));
        json_object_set_new(o, "dispatch_ms", json_real(p->dispatch_ms));
        json_object_set_new(o, "experts_ms", json_real(p->experts_ms));
        json_object_set_new(o, "combine_ms", json_real(p->combine_ms));
        json_object_set_new(o, "total_ms", json_real(p->total_ms));
        json_object_set_new(o, "alltoall_ms", json_real(p->xfer_ms));
        json_object_set_new(o, "remote_MB_per_rank", json_real(p->remote_mb));
        json_object_set_new(o, "alltoall_GBps", json_real(p->ep_gbps));
        json_object_set_new(o, "plain_alltoall_bytes_per_peer", json_integer((json_int_t)p->peak_bytes_per_peer));
        json_object_set_new(o, "plain_alltoall_ms", json_real(p->peak_ms));
        json_object_set_new(o, "plain_alltoall_GBps", json_real(p->peak_gbps));
        json_object_set_new(o, "pct_of_plain", json_real(p->peak_gbps > 0 ? 100 * p->ep_gbps / p->peak_gbps : 0));
        json_object_set_new(o, "path", json_string(p->device_resident ? "device" : "host"));
        json_object_set_new(o, "where", json_string(b->where));
        json_object_set_new(o, "commit", json_string(b->commit));
        json_object_set_new(o, "date", json_string(b->date));
    }
    if (cli_bench_write_jsonl(b->out, rows, b->npts, b->json && !quiet) != 0) return -1;
    if (!quiet) fprintf(cli_bench_text, "\nwrote %s.csv, %s.md and %s.jsonl\n", b->out, b->out, b->out);
    return 0;
}

enum { O_EP, O_PRESET, O_M, O_ITERS, O_TRANSPORT, O_MOE_BACKEND, O_OUT, O_COMMIT, O_JSON, O_COUNT };
static const cli_opt k_opts[O_COUNT] = {
    [O_EP] = {"--ep", "N", "ranks (>= 2, dividing every chosen preset's experts, at most 64)"},
    [O_PRESET] = {"--preset", "LIST", "comma-separated presets (default deepseek-v3,kimi-k2)"},
    [O_M] = {"--m", "LIST", "tokens per rank (default 1,16,128,1024,8192)"},
    [O_ITERS] = {"--iters", "N", "timed forwards per point after 1 warm-up (default 5)"},
    [O_TRANSPORT] = {"--transport", "T", "auto (default), nccl or loopback"},
    [O_MOE_BACKEND] = {"--moe-backend", "B", "the local experts' backend (default: the oracle's pick on GPUs,\n"
                                             "cpu_fast on the CPU)"},
    [O_OUT] = {"--out", "PREFIX", "output files PREFIX.csv, .md and .jsonl (default\n"
                                  CLI_BENCH_DEFAULT_DIR "/<date>-<device>-ep<N>-<transport> in the current\n"
                                  "directory); missing folders are created, existing files replaced"},
    [O_COMMIT] = {"--commit", "SHA", "recorded in the markdown (default: $NVFP4MOE_COMMIT or git rev-parse)"},
    [O_JSON] = {"--json", NULL, "print the points as JSON lines on stdout (the progress goes to stderr)"},
};

static void bench_ep_usage(FILE *f, const cli_layer_preset *presets, int n) {
    fprintf(f, "usage: nvfp4moe bench --ep N [flags]\n\n"
               "Times expert parallelism over N ranks on real models' MoE layers: M tokens on every rank, the\n"
               "time split into dispatch / experts / combine (median of forwards, slowest rank), the bytes the\n"
               "all-to-alls move and their bandwidth against the transport's own plain all-to-all of the same\n"
               "bytes, measured in the same run. Transport: NCCL, one process per GPU, when this build has NCCL\n"
               "and the machine N GPUs; otherwise the in-process LOOPBACK (threads; all ranks on the one GPU,\n"
               "or the CPU), whose figures are labelled as not NCCL figures. Writes PREFIX.csv, PREFIX.md and\n"
               "PREFIX.jsonl (one JSON object per CSV line). Presets:");
    for (int i = 0; i < n; i++) fprintf(f, " %s", presets[i].name);
    fprintf(f, "\n\n");
    cli_opts_help(f, k_opts, O_COUNT);
    fprintf(f, "  -h, --help                this text\n");
}

int cli_bench_ep(int argc, char **argv, const cli_layer_preset *presets, int npresets) {
    bench_ep *b = calloc(1, sizeof *b);
    if (!b) {
        fprintf(stderr, "nvfp4moe bench: out of memory\n");
        return CLI_EXIT_FAILURE;
    }
    int rc = CLI_EXIT_FAILURE;
    const int64_t defM[] = {1, 16, 128, 1024, 8192};
    for (b->nM = 0; b->nM < 5; b->nM++) b->Ms[b->nM] = defM[b->nM];
    b->iters = 5;
    long long N = 0;
    const char *transport = "auto", *out = NULL, *commit = getenv("NVFP4MOE_COMMIT"), *preset_list = "deepseek-v3,kimi-k2";
    cli_bench_command(argc, argv, b->command, sizeof b->command);
    bool json = false;
    const char *v = NULL;
    cli_args args;
    cli_args_init(&args, "bench --ep", k_opts, O_COUNT, false, 0, argc, argv);
    for (int o; (o = cli_args_next(&args, &v)) != CLI_ARGS_END;) {
        long long n;
        switch (o) {
        case CLI_ARGS_HELP:
            bench_ep_usage(stdout, presets, npresets);
            rc = CLI_EXIT_OK;
            goto done;
        case CLI_ARGS_ERROR: goto done;
        case O_EP:
            if (cli_parse_int("--ep", v, 1, &N)) goto done;
            break;
        case O_PRESET: preset_list = v; break;
        case O_M: {
            char buf[512];
            snprintf(buf, sizeof buf, "%s", v);
            b->nM = 0;
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (b->nM == 32) {
                    fprintf(stderr, "nvfp4moe bench --ep: --m: at most 32 values\n");
                    goto done;
                }
                if (cli_parse_int("--m", tok, 1, &n)) goto done;
                if (n > (1 << 20)) {   /* host buffers of M*H*top_k rows: keep the sizes far from overflow */
                    fprintf(stderr, "nvfp4moe bench --ep: --m %lld: at most %d tokens per rank\n", n, 1 << 20);
                    goto done;
                }
                b->Ms[b->nM++] = n;
            }
            if (b->nM == 0) {
                fprintf(stderr, "nvfp4moe bench --ep: --m: no value in '%s'\n", v);
                goto done;
            }
            break;
        }
        case O_ITERS:
            if (cli_parse_int("--iters", v, 1, &n)) goto done;
            if (n > 1000) {
                fprintf(stderr, "nvfp4moe bench --ep: --iters %lld: at most 1000\n", n);
                goto done;
            }
            b->iters = (int)n;
            break;
        case O_TRANSPORT:
            transport = v;
            if (strcmp(transport, "auto") && strcmp(transport, "nccl") && strcmp(transport, "loopback")) {
                fprintf(stderr, "nvfp4moe bench --ep: --transport '%s': auto, nccl or loopback\n", transport);
                goto done;
            }
            break;
        case O_MOE_BACKEND: b->local_backend = v; break;
        case O_OUT: out = v; break;
        case O_COMMIT: commit = v; break;
        case O_JSON: json = true; break;
        }
    }
    cli_bench_text = json ? stderr : stdout;
    b->json = json;
    if (N < 2 || N > 64) {
        fprintf(stderr, "nvfp4moe bench: --ep %lld: N must be in [2, 64] (plain `nvfp4moe bench` times one GPU)\n", N);
        goto done;
    }
    b->N = (int32_t)N;
    if ((b->npresets = cli_parse_presets("--preset", preset_list, presets, npresets, b->presets, 16)) < 0) goto done;
    for (int p = 0; p < b->npresets; p++)
        if (b->presets[p]->E % b->N) {
            fprintf(stderr, "nvfp4moe bench --ep: --ep %d must divide the number of experts: %s has %d\n", b->N,
                    b->presets[p]->name, b->presets[p]->E);
            goto done;
        }
    if (nvfp4moe_device_detect(&b->dev) != NVFP4MOE_OK) nvfp4moe_device_parse("cpu", &b->dev);
    const int gpus = b->dev.is_cuda ? cli_cuda_gpu_count() : 0;
    const bool can_nccl = b->dev.is_cuda && nvfp4moe_built_with_nccl() && gpus >= b->N;
    if (!strcmp(transport, "nccl") && !can_nccl) {
        fprintf(stderr, "nvfp4moe bench: --transport nccl needs a GPU build with NCCL (%s) and %d GPUs (found %d)\n",
                nvfp4moe_built_with_nccl() ? "this build has it" : "this build has none", b->N, gpus);
        goto done;
    }
    b->nccl = !strcmp(transport, "nccl") || (!strcmp(transport, "auto") && can_nccl);
    b->per_gpu = b->nccl;
    if (!b->dev.is_cuda && !b->local_backend) b->local_backend = "cpu_fast";

    {
        char d[16], dev_short[64];
        cli_bench_stamp(commit, b->commit, sizeof b->commit, b->date, sizeof b->date, d, sizeof d);
        const char *last = strrchr(b->dev.name, ' ');
        snprintf(dev_short, sizeof dev_short, "%s", b->dev.is_cuda ? (last ? last + 1 : b->dev.name) : "cpu");
        for (char *q = dev_short; *q; q++) *q = (char)(*q >= 'A' && *q <= 'Z' ? *q - 'A' + 'a' : *q);
        char what[128];
        snprintf(what, sizeof what, "%s-ep%d-%s", dev_short, b->N, b->nccl ? "nccl" : "loopback");
        if (out) snprintf(b->out, sizeof b->out, "%s", out);
        else cli_bench_default_prefix(d, what, b->out, sizeof b->out);
        if (cli_make_parent_dirs("--out", b->out) != 0) goto done;
        if (b->nccl) snprintf(b->where, sizeof b->where, "%d x %s", b->N, b->dev.name);
        else snprintf(b->where, sizeof b->where, "%s", b->dev.is_cuda ? b->dev.name : "the CPU");
    }

    const char *rank_env = getenv("NVFP4MOE_EP_RANK");
    if (b->nccl && rank_env) {   /* a rank process started by launch_ranks */
        const char *id_file = getenv("NVFP4MOE_EP_ID_FILE");
        const int rank = atoi(rank_env);
        if (!id_file || rank < 0 || rank >= b->N) {
            fprintf(stderr, "nvfp4moe bench: rank process: NVFP4MOE_EP_RANK=%s / NVFP4MOE_EP_ID_FILE=%s are not valid\n",
                    rank_env, id_file ? id_file : "(unset)");
            goto done;
        }
        nvfp4moe_ep_transport t;
        nvfp4moe_status st = nvfp4moe_ep_nccl_create(b->N, rank, rank, id_file, &t);
        if (st != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe bench: rank %d: %s\n", rank, nvfp4moe_last_error());
            goto done;
        }
        if (rank != 0) {   /* rank 0 speaks for all */
            fflush(stdout);
            if (!freopen("/dev/null", "w", stdout)) { /* keep going: only the output is lost */ }
            cli_bench_text = stdout;
        }
        st = bench_rank(rank, &t, b);
        t.destroy(t.ctx);
        if (rank == 0 && b->npts && write_ep_outputs(b, false) != 0) st = NVFP4MOE_ERR_IO;
        rc = st == NVFP4MOE_OK ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
        goto done;
    }
    fprintf(cli_bench_text, "nvfp4moe bench --ep %d on %s, commit %s\n", b->N, b->nccl ? "NCCL" : b->where, b->commit);
    if (b->nccl) {
        rc = cli_launch_ranks("bench", b->N, argc, argv);
        goto done;
    }
    fprintf(cli_bench_text, "mode      LOOPBACK, NOT NCCL: %d ranks as threads of this process, all on %s; the all-to-alls are "
           "copies between threads' buffers (device to device for device plans). These are not multi-GPU figures%s.\n",
           b->N, b->where,
           b->dev.is_cuda ? (gpus >= b->N ? " (--transport nccl runs one process per GPU)"
                                          : "; NCCL needs N GPUs, this machine has fewer")
                          : "");
    fflush(cli_bench_text);
    nvfp4moe_ep_loopback *lb = NULL;
    nvfp4moe_status st = nvfp4moe_ep_loopback_create(b->N, &lb);
    if (st == NVFP4MOE_OK) st = nvfp4moe_ep_loopback_run(lb, bench_rank, b);
    nvfp4moe_ep_loopback_free(lb);
    if (st != NVFP4MOE_OK) fprintf(stderr, "nvfp4moe bench: %s\n", nvfp4moe_last_error());
    if (b->npts && write_ep_outputs(b, false) != 0) st = NVFP4MOE_ERR_IO;
    rc = st == NVFP4MOE_OK ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
done:
    free(b);
    return rc;
}
