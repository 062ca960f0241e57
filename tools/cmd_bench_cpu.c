/*
 * cmd_bench_cpu.c - `nvfp4moe bench --cpu`: CPU_FAST on real models' MoE layer shapes, against
 * this machine's read bandwidth measured in the same run with the same threads.
 *
 * Method: weights are random NVFP4 (uniform E2M1 codes, E4M3 scales in [2^-3, 448], never zero or
 * NaN) made directly, not quantized: the values do not change the time. To stay within memory, the
 * source layer holds at most a gigabyte of distinct experts, repeated (the plan's repacked copy,
 * which the forward reads, is distinct for every expert). Router logits are random normal
 * (uniform routing, renormalized top-k; with --hot-tokens N, N of each point's tokens pick expert 0
 * first: nvfp4moe_hot_expert_logits), hidden states random bf16. Per point: 2 warm-up forwards,
 * then --iters timed ones, each preceded by a read of a 1 GiB buffer on the same threads, which
 * evicts the caches and keeps the threads awake as a model's previous layer would. The time is the
 * median. Bytes read are the repacked weights of the experts the routing touches (codes and block
 * scales). The read bandwidth of a point is the median over its timed forwards of the 1 GiB read
 * that precedes each (the same threads, the kernels' own load width): on a shared machine the
 * bandwidth moves, and this measures it at the moment of each forward.
 *
 * --prefetch LIST repeats every point with each prefetch setting (the plan keeps its weights; the
 * results do not depend on the setting). --profile adds, per point, where a forward's time goes:
 * the medians of the phases each thread records (the caller before the run, the wake-up of the
 * workers, the routing and the inputs, the barriers, GEMM1 and GEMM2 of the fastest and the slowest thread, the
 * sums, the join), the weight bytes over the time the GEMM phases take, and how the GEMM chunks
 * fell to the threads (the least and most bytes one read, the bytes taken from another's share). --stream measures the kernels
 * alone instead of the layer: each thread runs the integer kernel over its share of the 1 GiB
 * buffer (tiles of 2048 columns, one or two activation rows: decode's case) with each prefetch
 * setting, against the plain read of the same buffer; then the kernel on one tile that stays in
 * the cache, per activation row count: the compute rate without memory.
 */
#define _GNU_SOURCE   /* memfd_create */
#include "cli_ep.h"
#include "backends/cpu.h"
#include "reference/reference.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define EVICT_BYTES ((size_t)1 << 30)
#define SOURCE_BUDGET ((size_t)1 << 30)
/* The router logits' seed, and the hot tokens' (--hot-tokens): tests/test_cli.c recomputes a
 * point's routing from it. */
#define LOGIT_SEED 8

/* ggml's NVFP4 MUL_MAT_ID (W4A8, Q8_0 activations), one layer forward, median ms, measured on a
 * 16-core x86 host whose read bandwidth was 104 GB/s at 16 threads, same weights and routing as
 * CPU_FAST there. These are that host's figures, quoted for comparison: ggml does not run here. */
static const struct { const char *preset; int64_t M; double ms; } k_ggml[] = {
    {"qwen3-30b-a3b", 1, 1.57}, {"qwen3-30b-a3b", 16, 7.7}, {"qwen3-30b-a3b", 256, 83},
    {"deepseek-v3", 1, 4.5},    {"deepseek-v3", 16, 51},
};
#define GGML_BW_GBS 104.0
#define GGML_THREADS 16

/* A forward's phases (microseconds), from its profile; see phases_of. */
enum { PH_ROUTE, PH_WAKE, PH_INPUTS, PH_BAR1, PH_G1_MIN, PH_G1_MAX, PH_ROWS, PH_BAR2, PH_G2_MIN, PH_G2_MAX, PH_SUMS,
       PH_JOIN, PH_POST, PH_GEMM_GBS, PH_SHARE_MIN, PH_SHARE_MAX, PH_STOLEN, PH_COUNT };
static const char *const k_phase_names[PH_COUNT] = {"before", "wake", "inputs", "barrier1", "gemm1 min", "gemm1 max", "rows",
                                                   "barrier2", "gemm2 min", "gemm2 max", "sums", "join", "after", "GEMM GB/s",
                                                   "bytes min %", "bytes max %", "stolen %"};
/* The same as CSV columns and JSON keys. */
static const char *const k_phase_keys[PH_COUNT] = {"before_us", "wake_us", "inputs_us", "barrier1_us", "gemm1_min_us",
                                                  "gemm1_max_us", "rows_us", "barrier2_us", "gemm2_min_us", "gemm2_max_us",
                                                  "sums_us", "join_us", "after_us", "gemm_gb_s", "bytes_min_pct",
                                                  "bytes_max_pct", "stolen_pct"};

typedef struct {
    const cli_layer_preset *p;
    int64_t M;
    int64_t hot;              /* tokens made to pick expert 0 first (--hot-tokens; 0: uniform routing) */
    int threads;
    const char *isa;
    char prefetch[32];
    int64_t experts;          /* touched */
    int64_t chunks;           /* the plan's chunks a thread share (NVFP4MOE_CPU_CHUNKS) */
    double mb, ms, ms_min, gbs, pct, bw_gbs;
    double ggml_ms, ggml_pct; /* 0: no figure */
    bool profiled;
    double phase[PH_COUNT];   /* medians */
} point;

// ---- random layers ----

/* E experts of `per` bytes, of which the first `distinct` are repeated over the rest through
 * shared mappings of one memory file (per must be a multiple of the page size); plain memory
 * otherwise. Filled at random. */
typedef struct {
    uint8_t *p;
    size_t len;
    bool mapped;
} tensor;

static bool tensor_make(tensor *t, size_t per, int64_t E, int64_t distinct, uint64_t seed, bool scales) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    t->len = per * (size_t)E;
    t->mapped = distinct < E && per % page == 0;
    if (!t->mapped) {
        t->p = malloc(t->len);
        if (!t->p) return false;
        cli_fill_nvfp4(t->p, t->len, seed, scales);
        return true;
    }
    int fd = memfd_create("nvfp4moe-bench", 0);
    if (fd < 0) return false;
    void *base = MAP_FAILED;
    if (ftruncate(fd, (off_t)(per * (size_t)distinct)) == 0)
        base = mmap(NULL, t->len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    bool ok = base != MAP_FAILED;
    for (int64_t e = 0; ok && e < E; e += distinct) {
        size_t n = per * (size_t)NVFP4MOE_MIN(distinct, E - e);
        ok = mmap((uint8_t *)base + per * (size_t)e, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED;
    }
    close(fd);
    if (!ok) {
        if (base != MAP_FAILED) munmap(base, t->len);
        return false;
    }
    t->p = base;
    cli_fill_nvfp4(t->p, per * (size_t)distinct, seed, scales);
    return true;
}

static void tensor_free(tensor *t) {
    if (t->mapped) munmap(t->p, t->len);
    else free(t->p);
    t->p = NULL;
}

// ---- read bandwidth ----

typedef struct {
    const nvfp4moe_cpu_kernels *k;
    const uint8_t *buf;
    size_t len;
    uint64_t sums[1024];
} read_job;

static void read_task(void *ctx, int tid, int n) {
    read_job *j = ctx;
    int64_t a, b;
    nvfp4moe_cpu_split((int64_t)(j->len / 256), tid, n, &a, &b);
    j->sums[tid] = j->k->read(j->buf + 256 * (size_t)a, 256 * (size_t)(b - a));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return v[n / 2];
}

/* One forward's phases from its profile (the last pass's): the caller before the run, the time
 * until the last worker started, the longest routing and inputs share, each barrier from the last
 * arrival to the first departure, the shortest and longest GEMM1 (its chunks, with their
 * activations) and GEMM2 (its chunks), the per-token / W4A8 row pass (with its barrier), the
 * longest wait for a share's last chunks with its sums, the join after the last thread, the caller
 * after the run; the weight bytes over the two GEMM phases' spans (first thread in to last thread
 * out); and how the chunks fell: the least and the most weight bytes a thread read, in % of an even
 * share, and the % of the bytes read by a thread other than the share's owner. */
static void phases_of(const nvfp4moe_cpu_profile *pr, double mb, double *ph) {
    enum { S = NVFP4MOE_CPU_AT_START, IN = NVFP4MOE_CPU_AT_INPUTS, G1GO = NVFP4MOE_CPU_AT_GEMM1_GO, G1 = NVFP4MOE_CPU_AT_GEMM1,
           RW = NVFP4MOE_CPU_AT_ROWS, G2GO = NVFP4MOE_CPU_AT_GEMM2_GO, G2 = NVFP4MOE_CPU_AT_GEMM2, END = NVFP4MOE_CPU_AT_END };
    int64_t lo[NVFP4MOE_CPU_AT_COUNT], hi[NVFP4MOE_CPU_AT_COUNT];
    for (int k = 0; k < NVFP4MOE_CPU_AT_COUNT; k++) {
        lo[k] = INT64_MAX;
        hi[k] = INT64_MIN;
        for (int t = 0; t < pr->nthreads; t++) {
            lo[k] = NVFP4MOE_MIN(lo[k], pr->thread[t].t[k]);
            hi[k] = NVFP4MOE_MAX(hi[k], pr->thread[t].t[k]);
        }
    }
    double in = 0, g1lo = 1e300, g1hi = 0, rows = 0, g2lo = 1e300, g2hi = 0, sums = 0;
    double blo = 1e300, bhi = 0, btot = 0, bstolen = 0;
    for (int t = 0; t < pr->nthreads; t++) {
        const int64_t *x = pr->thread[t].t;
        const nvfp4moe_cpu_prof_thread *th = &pr->thread[t];
        const double bytes = (double)(th->bytes[0] + th->bytes[1]);
        blo = NVFP4MOE_MIN(blo, bytes);
        bhi = NVFP4MOE_MAX(bhi, bytes);
        btot += bytes;
        bstolen += (double)(th->stolen_bytes[0] + th->stolen_bytes[1]);
        sums = NVFP4MOE_MAX(sums, (double)(x[END] - x[G2]));
        in = NVFP4MOE_MAX(in, (double)(x[IN] - x[S]));
        g1lo = NVFP4MOE_MIN(g1lo, (double)(x[G1] - x[G1GO]));
        g1hi = NVFP4MOE_MAX(g1hi, (double)(x[G1] - x[G1GO]));
        rows = NVFP4MOE_MAX(rows, (double)(x[RW] - x[G1]));
        g2lo = NVFP4MOE_MIN(g2lo, (double)(x[G2] - x[G2GO]));
        g2hi = NVFP4MOE_MAX(g2hi, (double)(x[G2] - x[G2GO]));
    }
    ph[PH_ROUTE] = (double)(pr->run - pr->entry) / 1e3;
    ph[PH_WAKE] = (double)(hi[S] - pr->run) / 1e3;
    ph[PH_INPUTS] = in / 1e3;
    ph[PH_BAR1] = (double)(lo[G1GO] - hi[IN]) / 1e3;
    ph[PH_G1_MIN] = g1lo / 1e3;
    ph[PH_G1_MAX] = g1hi / 1e3;
    ph[PH_ROWS] = rows / 1e3;
    ph[PH_BAR2] = (double)(lo[G2GO] - hi[RW]) / 1e3;
    ph[PH_G2_MIN] = g2lo / 1e3;
    ph[PH_G2_MAX] = g2hi / 1e3;
    ph[PH_SUMS] = sums / 1e3;
    ph[PH_JOIN] = (double)(pr->joined - hi[END]) / 1e3;
    ph[PH_POST] = (double)(pr->exit - pr->joined) / 1e3;
    ph[PH_GEMM_GBS] = mb * 1e6 / ((double)(hi[G1] - lo[G1GO]) + (double)(hi[G2] - lo[G2GO]));   /* bytes / ns */
    const double even = btot / pr->nthreads;
    ph[PH_SHARE_MIN] = even > 0 ? 100.0 * blo / even : 0;
    ph[PH_SHARE_MAX] = even > 0 ? 100.0 * bhi / even : 0;
    ph[PH_STOLEN] = btot > 0 ? 100.0 * bstolen / btot : 0;
}

// ---- one preset ----

typedef struct {
    const cli_layer_preset *presets[16];
    int npresets;
    int64_t Ms[16];
    int nM;
    int64_t threads[16];
    int nthreads;
    nvfp4moe_cpu_prefetch prefetch[16];
    bool prefetch_default[16];   /* the plan's own setting (NVFP4MOE_CPU_PREFETCH or the built-in) */
    int nprefetch;
    bool profile, stream;
    int64_t hot_tokens;          /* --hot-tokens */
    int iters;
    nvfp4moe_scheme scheme;
    point pts[16 * 16 * 16];
    int npts;
    char out[512], commit[64], date[32], command[1024], cpu[160];
} bench_cpu;

/* The expected number of experts uniform top-k routing touches: the routing ggml's quoted figures
 * were measured with, hence quoted for uniform points only (a hot-expert point touches fewer). */
static double expected_ggml_experts(const cli_layer_preset *p, int64_t M) {
    return p->E * (1.0 - pow(1.0 - (double)p->k / p->E, (double)M));
}

// ---- the kernels alone (--stream) ----

#define STREAM_K 2048   /* columns of the stream's tiles (Qwen3-30B-A3B's GEMM1) */
#define CACHED_MACS ((int64_t)1 << 28)   /* multiply-adds per thread of a cached-tile measurement */

typedef struct {
    const nvfp4moe_cpu_kernels *k;
    const uint8_t *buf;
    size_t len;
    const nvfp4moe_cpu_qblock *rows[NVFP4MOE_CPU_MAX_NT];
    int nt;
    bool cached;                 /* one tile again and again, no prefetch */
    nvfp4moe_cpu_prefetch pf;
    nvfp4moe_cpu_seg segs[1024];
    int64_t sums[1024][8];       /* a thread's results, one cache line each */
} stream_job;

static void stream_task(void *ctx, int tid, int n) {
    stream_job *j = ctx;
    const size_t tb = nvfp4moe_cpu_tile_bytes(STREAM_K);
    const int64_t nsb = nvfp4moe_cpu_superblocks(STREAM_K);
    int64_t a, b;
    nvfp4moe_cpu_split((int64_t)(j->len / tb), tid, n, &a, &b);
    int64_t out[NVFP4MOE_CPU_MAX_NT * NVFP4MOE_CPU_TILE_ROWS], acc = 0;
    if (j->cached) {
        const int64_t reps = CACHED_MACS / ((int64_t)j->nt * NVFP4MOE_CPU_TILE_ROWS * STREAM_K);
        for (int64_t r = 0; r < reps; r++) {
            j->k->gemm_q(j->buf + (size_t)a * tb, nsb, j->rows, j->nt, out, NULL);
            acc += out[0];
        }
    } else {
        j->segs[tid] = (nvfp4moe_cpu_seg){j->buf + (size_t)a * tb, (size_t)(b - a) * tb};
        nvfp4moe_cpu_stream pf;
        nvfp4moe_cpu_stream_start(&pf, &j->segs[tid], b > a, &j->pf);
        for (int64_t t = a; t < b; t++) {
            j->k->gemm_q(j->buf + (size_t)t * tb, nsb, j->rows, j->nt, out, &pf);
            acc += out[0];
        }
    }
    j->sums[tid][0] = acc;
}

/* Seconds of one run of job on pool. */
static double time_run(nvfp4moe_cpu_pool *pool, nvfp4moe_cpu_task fn, void *job) {
    double a = cli_now_s();
    nvfp4moe_cpu_pool_run(pool, fn, job);
    return cli_now_s() - a;
}

typedef struct {
    int threads;
    char prefetch[32];
    double read_gbs, gbs[2];      /* the kernel streaming with 1 and 2 rows */
} stream_point;

typedef struct {
    int threads, nt;
    double gmacs;                 /* all threads together */
} cached_point;

static int run_stream(const bench_cpu *b, read_job *rj, FILE *md, FILE *csv) {
    enum { REPS = 5 };
    stream_job *j = calloc(1, sizeof *j);
    nvfp4moe_cpu_qrow rows[NVFP4MOE_CPU_MAX_NT];
    nvfp4moe_cpu_qblock *blk = malloc(sizeof(nvfp4moe_cpu_qblock) * (STREAM_K / 16) * NVFP4MOE_CPU_MAX_NT);
    float *x = malloc(sizeof(float) * STREAM_K);
    uint8_t *scratch = malloc(STREAM_K);
    if (!j || !blk || !x || !scratch) {
        fprintf(stderr, "nvfp4moe bench --cpu --stream: out of memory\n");
        free(j); free(blk); free(x); free(scratch);
        return -1;
    }
    *j = (stream_job){.k = rj->k, .buf = rj->buf, .len = rj->len};
    for (int t = 0; t < NVFP4MOE_CPU_MAX_NT; t++) {
        rows[t].blk = blk + t * (STREAM_K / 16);
        nvfp4moe_fill_normal(x, NVFP4MOE_DTYPE_F32, STREAM_K, 900 + (uint64_t)t);
        nvfp4moe_cpu_quantize_row(j->k, x, STREAM_K, 1.0f, &rows[t], scratch);
        j->rows[t] = rows[t].blk;
    }
    fprintf(md, "## The integer kernel streaming from memory\n\nEach thread runs the %s kernel over its contiguous "
                "share of a 1 GiB buffer, tiles of %d columns (%zu bytes), with 1 or 2 activation rows (decode); "
                "medians of %d runs. read: the plain read of the same buffer by the same threads.\n\n"
                "| threads | prefetch | read GB/s | 1 row GB/s | %% of read | 2 rows GB/s | %% of read |\n"
                "|---:|---|---:|---:|---:|---:|---:|\n",
            nvfp4moe_cpu_isa_name(j->k->isa), STREAM_K, nvfp4moe_cpu_tile_bytes(STREAM_K), REPS);
    fprintf(csv, "kind,threads,prefetch,rows,gb_s,read_gb_s,gmacs\n");
    cached_point cps[16 * 4];
    int ncp = 0, rc = 0;
    for (int ti = 0; ti < b->nthreads && rc == 0; ti++) {
        nvfp4moe_cpu_pool *pool = NULL;
        if (nvfp4moe_cpu_pool_get((int)b->threads[ti], &pool) != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe bench --cpu --stream: %s\n", nvfp4moe_last_error());
            rc = -1;
            break;
        }
        const int T = nvfp4moe_cpu_pool_size(pool);
        for (int pi = 0; pi < b->nprefetch; pi++) {
            stream_point sp = {.threads = T};
            j->pf = b->prefetch[pi];
            nvfp4moe_cpu_prefetch_format(&j->pf, sp.prefetch, sizeof sp.prefetch);
            double rd[REPS], st[2][REPS];
            time_run(pool, read_task, rj);   /* awake, warm TLB */
            for (int r = 0; r < REPS; r++) {
                rd[r] = (double)rj->len / time_run(pool, read_task, rj) / 1e9;
                for (int nt = 1; nt <= 2; nt++) {
                    j->nt = nt;
                    j->cached = false;
                    time_run(pool, read_task, rj);   /* the same cold start for each */
                    st[nt - 1][r] = (double)j->len / time_run(pool, stream_task, j) / 1e9;
                }
            }
            sp.read_gbs = median(rd, REPS);
            sp.gbs[0] = median(st[0], REPS);
            sp.gbs[1] = median(st[1], REPS);
            fprintf(cli_bench_text, "  stream %2d threads prefetch %-14s read %6.1f GB/s  1 row %6.1f GB/s (%3.0f %%)  2 rows %6.1f GB/s (%3.0f %%)\n",
                   T, sp.prefetch, sp.read_gbs, sp.gbs[0], 100 * sp.gbs[0] / sp.read_gbs, sp.gbs[1],
                   100 * sp.gbs[1] / sp.read_gbs);
            fflush(cli_bench_text);
            fprintf(md, "| %d | %s | %.1f | %.1f | %.0f %% | %.1f | %.0f %% |\n", T, sp.prefetch, sp.read_gbs, sp.gbs[0],
                    100 * sp.gbs[0] / sp.read_gbs, sp.gbs[1], 100 * sp.gbs[1] / sp.read_gbs);
            for (int nt = 1; nt <= 2; nt++)
                fprintf(csv, "stream,%d,%s,%d,%.2f,%.2f,\n", T, sp.prefetch, nt, sp.gbs[nt - 1], sp.read_gbs);
        }
        for (int nt = 1; nt <= NVFP4MOE_CPU_MAX_NT; nt *= 2) {
            j->nt = nt;
            j->cached = true;
            double g[REPS];
            const int64_t reps = CACHED_MACS / ((int64_t)nt * NVFP4MOE_CPU_TILE_ROWS * STREAM_K);
            const double macs = (double)reps * nt * NVFP4MOE_CPU_TILE_ROWS * STREAM_K * T;
            for (int r = 0; r < REPS; r++) g[r] = macs / time_run(pool, stream_task, j) / 1e9;
            cps[ncp++] = (cached_point){T, nt, median(g, REPS)};
            fprintf(cli_bench_text, "  cached tile %2d threads %d rows: %7.1f G multiply-adds/s (%.1f a thread)\n", T, nt, cps[ncp - 1].gmacs,
                   cps[ncp - 1].gmacs / T);
            fprintf(csv, "cached,%d,,%d,,,%.2f\n", T, nt, cps[ncp - 1].gmacs);
        }
        nvfp4moe_cpu_pool_put(pool);
    }
    fprintf(md, "\n## The integer kernel on a tile in the cache\n\nOne tile of %d columns (%zu bytes, first-level cache) "
                "again and again on every thread, no prefetch: multiply-adds per second (16 weight rows x columns x "
                "activation rows), medians of %d runs.\n\n| threads | rows | G multiply-adds/s | a thread |\n"
                "|---:|---:|---:|---:|\n",
            STREAM_K, nvfp4moe_cpu_tile_bytes(STREAM_K), REPS);
    for (int i = 0; i < ncp; i++)
        fprintf(md, "| %d | %d | %.1f | %.1f |\n", cps[i].threads, cps[i].nt, cps[i].gmacs, cps[i].gmacs / cps[i].threads);
    free(j); free(blk); free(x); free(scratch);
    return rc;
}

static int run_preset(bench_cpu *b, const cli_layer_preset *pr, read_job *rj) {
    nvfp4moe_config c;
    cli_preset_config(pr, &c);
    c.scheme = b->scheme;
    const int64_t E = c.num_experts, H = c.hidden_size, I = c.intermediate_size, N1 = nvfp4moe_config_n1(&c);
    const size_t per13 = (size_t)(N1 * H / 2), per2 = (size_t)(H * I / 2);
    const size_t per_expert = (per13 + per2) * 9 / 8;
    int64_t distinct = (int64_t)NVFP4MOE_MIN((size_t)E, NVFP4MOE_MAX((size_t)1, SOURCE_BUDGET / per_expert));
    tensor w13 = {0}, s13 = {0}, w2 = {0}, s2 = {0};
    float *vec = malloc(sizeof(float) * (size_t)(4 * E));
    bool ok = vec && tensor_make(&w13, per13, E, distinct, 11, false) && tensor_make(&s13, per13 / 8, E, distinct, 12, true) &&
              tensor_make(&w2, per2, E, distinct, 13, false) && tensor_make(&s2, per2 / 8, E, distinct, 14, true);
    if (!ok) {
        fprintf(stderr, "nvfp4moe bench --cpu: %s: out of memory for the source weights\n", pr->name);
        tensor_free(&w13); tensor_free(&s13); tensor_free(&w2); tensor_free(&s2);
        free(vec);
        return -1;
    }
    for (int64_t e = 0; e < E; e++) {
        vec[e] = (float)(1.0 / (125.0 * sqrt((double)H)));
        vec[E + e] = (float)(1.0 / (125.0 * sqrt((double)I)));
        vec[2 * E + e] = vec[3 * E + e] = 1.0f;
    }
    nvfp4moe_weights w = {.w13 = w13.p, .w13_scale = s13.p, .w13_scale_2 = vec, .w13_input_scale = vec + 2 * E,
                          .w2 = w2.p, .w2_scale = s2.p, .w2_scale_2 = vec + E, .w2_input_scale = vec + 3 * E};
    int64_t Mmax = 1;
    for (int i = 0; i < b->nM; i++) Mmax = NVFP4MOE_MAX(Mmax, b->Ms[i]);
    uint16_t *hidden = malloc(sizeof(uint16_t) * (size_t)(Mmax * H));
    float *logits = malloc(sizeof(float) * (size_t)(Mmax * E)), *tw = malloc(sizeof(float) * (size_t)(Mmax * pr->k));
    /* --hot-tokens: each point's own logits (its hot subset depends on its M) */
    float *hot_logits = b->hot_tokens > 0 ? malloc(sizeof(float) * (size_t)(Mmax * E)) : NULL;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(Mmax * pr->k));
    uint16_t *outb = malloc(sizeof(uint16_t) * (size_t)(Mmax * H));
    bool *seen = malloc((size_t)E);
    double *times = malloc(sizeof(double) * (size_t)b->iters), *bws = malloc(sizeof(double) * (size_t)b->iters);
    double *phs = malloc(sizeof(double) * PH_COUNT * (size_t)b->iters);
    int rc = 0;
    if (!hidden || !logits || !tw || !ids || !outb || !seen || !times || !bws || !phs ||
        (b->hot_tokens > 0 && !hot_logits)) {
        fprintf(stderr, "nvfp4moe bench --cpu: out of memory\n");
        rc = -1;
        goto done;
    }
    nvfp4moe_fill_normal(hidden, NVFP4MOE_DTYPE_BF16, Mmax * H, 7);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, Mmax * E, LOGIT_SEED);
    for (int ti = 0; ti < b->nthreads && rc == 0; ti++) {
        const int T = (int)b->threads[ti];
        nvfp4moe_device cpu;
        nvfp4moe_device_parse("cpu", &cpu);
        nvfp4moe_plan_options po = {.backend = "cpu_fast", .device = &cpu, .num_threads = T};
        nvfp4moe_plan *plan = NULL;
        nvfp4moe_cpu_pool *pool = NULL;
        double t0 = cli_now_s();
        nvfp4moe_status st = nvfp4moe_plan_create(&c, &w, &po, &plan);
        if (st == NVFP4MOE_OK) st = nvfp4moe_cpu_pool_get(T, &pool);
        if (st != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe bench --cpu: %s, %d threads: %s\n", pr->name, T, nvfp4moe_last_error());
            nvfp4moe_plan_destroy(plan);
            rc = -1;
            break;
        }
        fprintf(cli_bench_text, "%s: %d threads: plan in %.1f s (%.2f GB repacked, GEMM shares in about %lld chunks each)\n",
                pr->name, T, cli_now_s() - t0, (double)E * (double)per_expert / 1e9, (long long)nvfp4moe_cpu_fast_chunks(plan));
        nvfp4moe_cpu_prefetch own;
        nvfp4moe_cpu_fast_prefetch(plan, NULL, &own);
        const nvfp4moe_cpu_profile *prof = b->profile ? nvfp4moe_cpu_fast_profile(plan, true) : NULL;
        if (b->profile && !prof) {
            fprintf(stderr, "nvfp4moe bench --cpu: out of memory for the profile\n");
            rc = -1;
        }
        for (int mi = 0; mi < b->nM && rc == 0; mi++) {
            const int64_t M = b->Ms[mi];
            /* the first M rows of the uniform logits, or of a copy with this point's hot tokens */
            const float *lg = logits;
            int64_t hot = 0;
            if (b->hot_tokens > 0) {
                memcpy(hot_logits, logits, sizeof(float) * (size_t)(M * E));
                hot = nvfp4moe_hot_expert_logits(hot_logits, M, (int32_t)E, b->hot_tokens, LOGIT_SEED, NULL);
                lg = hot_logits;
            }
            nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = lg, .output = outb};
            /* the experts this routing touches, for the bytes read: the forward routes the same logits */
            nvfp4moe_route(&c, lg, M, NULL, ids, tw);
            memset(seen, 0, (size_t)E);
            int64_t touched = 0;
            for (int64_t i = 0; i < M * pr->k; i++)
                if (!seen[ids[i]]) {
                    seen[ids[i]] = true;
                    touched++;
                }
            const double mb = (double)touched * (double)per_expert / 1e6;
            for (int pi = 0; pi < NVFP4MOE_MAX(1, b->nprefetch) && st == NVFP4MOE_OK; pi++) {
                const nvfp4moe_cpu_prefetch *set = b->nprefetch == 0 || b->prefetch_default[pi] ? &own : &b->prefetch[pi];
                nvfp4moe_cpu_fast_prefetch(plan, set, NULL);
                for (int it = 0; it < 2 && st == NVFP4MOE_OK; it++) st = nvfp4moe_plan_forward(plan, &io, NULL);
                for (int it = 0; it < b->iters && st == NVFP4MOE_OK; it++) {
                    double a = cli_now_s();
                    nvfp4moe_cpu_pool_run(pool, read_task, rj);
                    double r = cli_now_s();
                    st = nvfp4moe_plan_forward(plan, &io, NULL);
                    times[it] = cli_now_s() - r;
                    bws[it] = (double)rj->len / (r - a) / 1e9;
                    if (prof) phases_of(prof, mb, &phs[it * PH_COUNT]);
                }
                if (st != NVFP4MOE_OK) {
                    fprintf(stderr, "nvfp4moe bench --cpu: %s M=%lld: %s\n", pr->name, (long long)M, nvfp4moe_last_error());
                    rc = -1;
                    break;
                }
                if (b->npts == (int)(sizeof b->pts / sizeof b->pts[0])) {
                    fprintf(stderr, "nvfp4moe bench --cpu: more than %d points\n", b->npts);
                    rc = -1;
                    break;
                }
                qsort(times, (size_t)b->iters, sizeof times[0], cmp_double);
                const double bw = median(bws, b->iters);
                point *pt = &b->pts[b->npts++];
                *pt = (point){.p = pr, .M = M, .hot = hot, .threads = nvfp4moe_cpu_pool_size(pool), .experts = touched,
                              .bw_gbs = bw, .chunks = nvfp4moe_cpu_fast_chunks(plan)};
                const nvfp4moe_cpu_kernels *k = NULL;
                nvfp4moe_cpu_kernels_select(&k);
                pt->isa = nvfp4moe_cpu_isa_name(k->isa);
                nvfp4moe_cpu_prefetch_format(set, pt->prefetch, sizeof pt->prefetch);
                pt->mb = mb;
                pt->ms = times[b->iters / 2] * 1e3;
                pt->ms_min = times[0] * 1e3;
                pt->gbs = pt->mb / pt->ms;
                pt->pct = 100.0 * pt->gbs / bw;
                for (size_t g = 0; g < sizeof k_ggml / sizeof k_ggml[0] && hot == 0; g++)
                    if (!strcmp(k_ggml[g].preset, pr->name) && k_ggml[g].M == M) {
                        pt->ggml_ms = k_ggml[g].ms;
                        pt->ggml_pct = 100.0 * expected_ggml_experts(pr, M) * (double)per_expert / 1e6 / k_ggml[g].ms / GGML_BW_GBS;
                    }
                fprintf(cli_bench_text, "  M=%-5lld %3lld experts %8.1f MB  prefetch %-14s %9.3f ms (min %.3f)  %6.1f GB/s  read %5.1f GB/s  %5.1f %%\n",
                       (long long)M, (long long)touched, pt->mb, pt->prefetch, pt->ms, pt->ms_min, pt->gbs, bw, pt->pct);
                if (prof) {
                    pt->profiled = true;
                    double col[1000];
                    for (int q = 0; q < PH_COUNT; q++) {
                        for (int it = 0; it < b->iters; it++) col[it] = phs[it * PH_COUNT + q];
                        pt->phase[q] = median(col, b->iters);
                    }
                    fprintf(cli_bench_text, "         us:");
                    for (int q = 0; q < PH_COUNT; q++) fprintf(cli_bench_text, " %s %.1f%s", k_phase_names[q], pt->phase[q], q + 1 < PH_COUNT ? "," : "\n");
                }
                fflush(cli_bench_text);
            }
        }
        nvfp4moe_cpu_pool_put(pool);
        nvfp4moe_plan_destroy(plan);
    }
done:
    tensor_free(&w13); tensor_free(&s13); tensor_free(&w2); tensor_free(&s2);
    free(vec); free(hidden); free(logits); free(hot_logits); free(tw); free(ids); free(outb); free(seen); free(times);
    free(bws); free(phs);
    return rc;
}

// ---- outputs ----

static int write_outputs(const bench_cpu *b, bool json) {
    char path[600];
    snprintf(path, sizeof path, "%s.csv", b->out);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "nvfp4moe bench --cpu: cannot write %s\n", path);
        return -1;
    }
    fprintf(f, "preset,scheme,M,hot_tokens,threads,isa,prefetch,chunks,experts,mb_read,ms_median,ms_min,gb_s,read_bw_gb_s,"
               "pct_read_bw,ggml_16c_ms,ggml_16c_pct_read_bw");
    for (int q = 0; q < PH_COUNT; q++) fprintf(f, ",%s", k_phase_keys[q]);
    fprintf(f, "\n");
    for (int i = 0; i < b->npts; i++) {
        const point *p = &b->pts[i];
        fprintf(f, "%s,%s,%lld,%lld,%d,%s,%s,%lld,%lld,%.2f,%.4f,%.4f,%.2f,%.2f,%.1f,", p->p->name,
                nvfp4moe_scheme_name(b->scheme), (long long)p->M, (long long)p->hot, p->threads, p->isa, p->prefetch,
                (long long)p->chunks, (long long)p->experts, p->mb, p->ms, p->ms_min, p->gbs, p->bw_gbs, p->pct);
        if (p->ggml_ms > 0) fprintf(f, "%.2f,%.1f", p->ggml_ms, p->ggml_pct);
        else fprintf(f, ",");
        for (int q = 0; q < PH_COUNT; q++) {
            if (p->profiled) fprintf(f, ",%.2f", p->phase[q]);
            else fprintf(f, ",");
        }
        fprintf(f, "\n");
    }
    fclose(f);
    snprintf(path, sizeof path, "%s.md", b->out);
    f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "nvfp4moe bench --cpu: cannot write %s\n", path);
        return -1;
    }
    fprintf(f, "# CPU_FAST on %s\n\n", b->cpu);
    fprintf(f, "- date: %s\n- commit: %s\n- command: `%s`\n", b->date, b->commit, b->command);
    if (b->npts > 0)
        fprintf(f, "- work split: each thread's share of a GEMM phase in about %lld chunks, claimed by the threads as "
                   "they go (NVFP4MOE_CPU_CHUNKS)\n", (long long)b->pts[0].chunks);
    char routing[512];
    cli_bench_routing_words(b->hot_tokens, routing, sizeof routing);
    fprintf(f, "- layer: random NVFP4 weights (E2M1 codes, E4M3 scales in [2^-3, 448]), scheme %s, bf16 activations, "
               "random normal router logits\n- routing: %s\n", nvfp4moe_scheme_name(b->scheme), routing);
    fprintf(f, "- time: median of %d forwards, each after a 1 GiB read on the same threads (cold caches, awake "
               "threads); MB read: the touched experts' NVFP4 codes and block scales\n", b->iters);
    fprintf(f, "- read bandwidth: per point, the median of the 1 GiB reads that precede its timed forwards (the same "
               "threads, the kernels' loads)\n");
    if (b->hot_tokens > 0)
        fprintf(f, "- ggml: the figures of a 16-core x86 host were measured with uniform routing: not quoted for "
                   "hot-expert points\n\n");
    else
        fprintf(f, "- ggml: the figures of a 16-core x86 host (read bandwidth 104 GB/s at 16 threads), quoted, not "
                   "measured here; its %% assumes the experts uniform routing touches on average\n\n");
    fprintf(f, "| preset | M | threads | ISA | prefetch | experts | MB read | ms | GB/s | read BW GB/s | %% of read BW | "
               "ggml 16 cores ms | ggml %% of its read BW |\n|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    bool profiled = false;
    for (int i = 0; i < b->npts; i++) {
        const point *p = &b->pts[i];
        profiled |= p->profiled;
        fprintf(f, "| %s | %lld | %d | %s | %s | %lld | %.1f | %.3f | %.1f | %.1f | %.0f %% |", p->p->name, (long long)p->M,
                p->threads, p->isa, p->prefetch, (long long)p->experts, p->mb, p->ms, p->gbs, p->bw_gbs, p->pct);
        if (p->ggml_ms > 0) fprintf(f, " %.2f | %.0f %% |\n", p->ggml_ms, p->ggml_pct);
        else fprintf(f, " | |\n");
    }
    if (profiled) {
        fprintf(f, "\nWhere the time goes (--profile; microseconds, medians over the timed forwards): before = the caller "
                   "before the threads' run (checks, workspace); wake = until the last thread started; inputs = the "
                   "longest share of the routing and the input quantization; barrier = from the last arrival to the "
                   "first departure; gemm min / max = the fastest and the slowest thread's GEMM1 (with its grouping "
                   "and activations) and GEMM2, each the chunks it ran; rows = the row pass of per-token / W4A8 with its "
                   "barrier; sums = the longest wait for the last chunks of a thread's share with that share's "
                   "weighted sums; join = after the last thread; after = the caller after the run. GEMM GB/s: the "
                   "weight bytes over the spans of the two GEMM phases. bytes min / max %%: the least and the most "
                   "weight bytes one thread read, in %% of an even share (how far the chunk claiming moved work from "
                   "slower threads to faster ones); stolen %%: the bytes a thread read from another's share.\n\n");
        fprintf(f, "| preset | M | threads | prefetch | ms |");
        for (int q = 0; q < PH_COUNT; q++) fprintf(f, " %s |", k_phase_names[q]);
        fprintf(f, "\n|---|---:|---:|---|---:|");
        for (int q = 0; q < PH_COUNT; q++) fprintf(f, "---:|");
        fprintf(f, "\n");
        for (int i = 0; i < b->npts; i++) {
            const point *p = &b->pts[i];
            if (!p->profiled) continue;
            fprintf(f, "| %s | %lld | %d | %s | %.3f |", p->p->name, (long long)p->M, p->threads, p->prefetch, p->ms);
            for (int q = 0; q < PH_COUNT; q++) fprintf(f, " %.1f |", p->phase[q]);
            fprintf(f, "\n");
        }
    }
    fclose(f);
    json_t *rows[16 * 16 * 16];
    for (int i = 0; i < b->npts; i++) {
        const point *p = &b->pts[i];
        json_t *o = rows[i] = json_object();
        json_object_set_new(o, "preset", json_string(p->p->name));
        json_object_set_new(o, "scheme", json_string(nvfp4moe_scheme_name(b->scheme)));
        json_object_set_new(o, "M", json_integer(p->M));
        json_object_set_new(o, "hot_tokens", json_integer(p->hot));
        json_object_set_new(o, "threads", json_integer(p->threads));
        json_object_set_new(o, "isa", json_string(p->isa));
        json_object_set_new(o, "prefetch", json_string(p->prefetch));
        json_object_set_new(o, "chunks", json_integer(p->chunks));
        json_object_set_new(o, "experts", json_integer(p->experts));
        json_object_set_new(o, "mb_read", json_real(p->mb));
        json_object_set_new(o, "ms_median", json_real(p->ms));
        json_object_set_new(o, "ms_min", json_real(p->ms_min));
        json_object_set_new(o, "gb_s", json_real(p->gbs));
        json_object_set_new(o, "read_bw_gb_s", json_real(p->bw_gbs));
        json_object_set_new(o, "pct_read_bw", json_real(p->pct));
        json_object_set_new(o, "ggml_16c_ms", p->ggml_ms > 0 ? json_real(p->ggml_ms) : json_null());
        json_object_set_new(o, "ggml_16c_pct_read_bw", p->ggml_ms > 0 ? json_real(p->ggml_pct) : json_null());
        json_object_set_new(o, "cpu", json_string(b->cpu));
        json_object_set_new(o, "commit", json_string(b->commit));
        json_object_set_new(o, "date", json_string(b->date));
        for (int q = 0; q < PH_COUNT && p->profiled; q++) json_object_set_new(o, k_phase_keys[q], json_real(p->phase[q]));
    }
    if (cli_bench_write_jsonl(b->out, rows, b->npts, json) != 0) return -1;
    fprintf(cli_bench_text, "wrote %s.csv, %s.md and %s.jsonl\n", b->out, b->out, b->out);
    return 0;
}

/* --stream: the sweep when no --prefetch is given, then the measurement into PREFIX.md / .csv. */
static int write_stream(bench_cpu *b, read_job *rj) {
    static const char *const sweep[] = {"off",      "t0:4608",  "t0:9216",  "t0:18432", "t1:4608",      "t1:9216",
                                        "t1:18432", "t1:36864", "t2:9216",  "t2:18432", "t2:36864",     "nta:4608",
                                        "nta:9216", "t0:8192:4096", "t2:16384:4096"};
    if (b->nprefetch == 0)
        for (size_t i = 0; i < sizeof sweep / sizeof sweep[0]; i++)
            nvfp4moe_cpu_prefetch_parse(sweep[i], "sweep", &b->prefetch[b->nprefetch++]);
    char path[600];
    snprintf(path, sizeof path, "%s.md", b->out);
    FILE *md = fopen(path, "w");
    snprintf(path, sizeof path, "%s.csv", b->out);
    FILE *csv = fopen(path, "w");
    if (!md || !csv) {
        fprintf(stderr, "nvfp4moe bench --cpu: cannot write %s.md / .csv\n", b->out);
        if (md) fclose(md);
        if (csv) fclose(csv);
        return 1;
    }
    fprintf(md, "# CPU_FAST's integer kernel on %s\n\n- date: %s\n- commit: %s\n- command: `%s`\n\n", b->cpu, b->date,
            b->commit, b->command);
    const int rc = run_stream(b, rj, md, csv);
    fclose(md);
    fclose(csv);
    if (rc == 0) fprintf(cli_bench_text, "wrote %s.csv and %s.md\n", b->out, b->out);
    return rc != 0;
}

// ---- the command ----

enum { O_CPU, O_PRESET, O_M, O_HOT_TOKENS, O_THREADS, O_SCHEME, O_ITERS, O_OUT, O_COMMIT, O_JSON, O_PREFETCH, O_PROFILE,
       O_STREAM, O_COUNT };
static const cli_opt k_opts[O_COUNT] = {
    [O_CPU] = {"--cpu", NULL, "this mode: the CPU backend"},
    [O_PRESET] = {"--preset", "LIST", "comma-separated presets (default qwen3-30b-a3b,deepseek-v3)"},
    [O_M] = {"--m", "LIST", "tokens (default 1,16,64,256)"},
    [O_HOT_TOKENS] = {"--hot-tokens", "N", CLI_BENCH_HOT_HELP},
    [O_THREADS] = {"--threads", "LIST", "thread counts (default: every CPU this process may use)"},
    [O_SCHEME] = {"--scheme", "S", "w4a4 (default, the integer kernels) or w4a16 (the float kernels)"},
    [O_ITERS] = {"--iters", "N", "timed forwards per point (default 10)"},
    [O_OUT] = {"--out", "PREFIX", "output files PREFIX.csv, .md and .jsonl (default\n"
                                  CLI_BENCH_DEFAULT_DIR "/<date>-cpu-<threads>t in the current directory);\n"
                                  "missing folders are created, existing files replaced"},
    [O_COMMIT] = {"--commit", "SHA", "recorded in the markdown (default: $NVFP4MOE_COMMIT or git rev-parse)"},
    [O_JSON] = {"--json", NULL, "print the points as JSON lines on stdout (the progress goes to stderr)"},
    [O_PREFETCH] = {"--prefetch", "LIST", "prefetch settings to run each point with: default (the plan's), off,\n"
                                          "or HINT:DISTANCE[:STRIDE] (HINT t0|t1|t2|nta, bytes; as\n"
                                          "NVFP4MOE_CPU_PREFETCH)"},
    [O_PROFILE] = {"--profile", NULL, "also where each point's time goes (the forward's phases, per thread)"},
    [O_STREAM] = {"--stream", NULL, "the integer kernel alone instead of the layers: streaming from memory\n"
                                    "with each --prefetch setting (default: a sweep) and on a tile in the\n"
                                    "cache; writes PREFIX.csv and PREFIX.md"},
};

static void usage(FILE *f, const cli_layer_preset *presets, int n) {
    fprintf(f, "usage: nvfp4moe bench --cpu [flags]\n\n"
               "Times CPU_FAST's whole forward on real models' MoE layers and reports each point's share of this\n"
               "machine's read bandwidth, measured just before each timed forward with the same threads. Writes\n"
               "PREFIX.csv, PREFIX.md and PREFIX.jsonl (one JSON object per CSV line). Presets:");
    for (int i = 0; i < n; i++) fprintf(f, " %s", presets[i].name);
    fprintf(f, "\n\n");
    cli_opts_help(f, k_opts, O_COUNT);
    fprintf(f, "  -h, --help                this text\n\n"
               "Environment: NVFP4MOE_CPU_ISA=portable|avx2|avx512 forces the kernels, NVFP4MOE_CPU_PREFETCH\n"
               "the plans' prefetch setting, NVFP4MOE_CPU_CHUNKS the chunks of a thread's share of a GEMM phase.\n");
}

/* --prefetch: a comma-separated list of settings, "default" for the plan's own. Returns nonzero
 * after a message. */
static int parse_prefetch(bench_cpu *b, const char *v) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", v);
    b->nprefetch = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (b->nprefetch == 16) {
            fprintf(stderr, "nvfp4moe bench --cpu: --prefetch: at most 16 settings\n");
            return 1;
        }
        const int i = b->nprefetch++;
        b->prefetch_default[i] = nvfp4moe_name_eq(tok, "default");
        const nvfp4moe_status st = b->prefetch_default[i] ? nvfp4moe_cpu_prefetch_default(&b->prefetch[i])
                                                          : nvfp4moe_cpu_prefetch_parse(tok, "--prefetch", &b->prefetch[i]);
        if (st != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe bench --cpu: %s\n", nvfp4moe_last_error());
            return 1;
        }
    }
    if (b->nprefetch == 0) {
        fprintf(stderr, "nvfp4moe bench --cpu: --prefetch: no setting in '%s'\n", v);
        return 1;
    }
    return 0;
}

/* Parses a comma-separated list of integers in [min, max] into out (at most cap); returns the
 * count, or -1 after a message naming the flag. */
static int parse_list(const char *flag, const char *v, long long min, long long max, int64_t *out, int cap) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", v);
    int n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        long long x;
        if (n == cap) {
            fprintf(stderr, "nvfp4moe bench: %s: at most %d values\n", flag, cap);
            return -1;
        }
        if (cli_parse_int(flag, tok, min, &x)) return -1;
        if (x > max) {
            fprintf(stderr, "nvfp4moe bench: %s %lld: at most %lld\n", flag, x, max);
            return -1;
        }
        out[n++] = x;
    }
    if (!n) fprintf(stderr, "nvfp4moe bench: %s: no value in '%s'\n", flag, v);
    return n ? n : -1;
}

int cli_bench_cpu(int argc, char **argv, const cli_layer_preset *presets, int npresets) {
    bench_cpu *b = calloc(1, sizeof *b);
    if (!b) {
        fprintf(stderr, "nvfp4moe bench: out of memory\n");
        return CLI_EXIT_FAILURE;
    }
    int rc = CLI_EXIT_FAILURE;
    const char *out = NULL, *commit = getenv("NVFP4MOE_COMMIT"), *preset_list = "qwen3-30b-a3b,deepseek-v3";
    b->nM = 4;
    b->Ms[0] = 1, b->Ms[1] = 16, b->Ms[2] = 64, b->Ms[3] = 256;
    b->iters = 10;
    b->scheme = NVFP4MOE_SCHEME_W4A4;
    cli_bench_command(argc, argv, b->command, sizeof b->command);
    bool json = false;
    const char *v = NULL;
    cli_args args;
    cli_args_init(&args, "bench --cpu", k_opts, O_COUNT, false, 0, argc, argv);
    for (int o; (o = cli_args_next(&args, &v)) != CLI_ARGS_END;) {
        long long n;
        switch (o) {
        case CLI_ARGS_HELP:
            usage(stdout, presets, npresets);
            rc = CLI_EXIT_OK;
            goto done;
        case CLI_ARGS_ERROR: goto done;
        case O_CPU: break;
        case O_PRESET: preset_list = v; break;
        case O_M:
            if ((b->nM = parse_list("--m", v, 1, 65536, b->Ms, 16)) < 0) goto done;
            break;
        case O_HOT_TOKENS:
            if (cli_parse_int("--hot-tokens", v, 0, &n)) goto done;
            b->hot_tokens = n;
            break;
        case O_THREADS:
            if ((b->nthreads = parse_list("--threads", v, 1, 1024, b->threads, 16)) < 0) goto done;
            break;
        case O_SCHEME:
            if (nvfp4moe_scheme_parse(v, &b->scheme) != NVFP4MOE_OK ||
                (b->scheme != NVFP4MOE_SCHEME_W4A4 && b->scheme != NVFP4MOE_SCHEME_W4A16)) {
                fprintf(stderr, "nvfp4moe bench --cpu: --scheme '%s': w4a4 or w4a16\n", v);
                goto done;
            }
            break;
        case O_ITERS:
            if (cli_parse_int("--iters", v, 1, &n)) goto done;
            if (n > 1000) {
                fprintf(stderr, "nvfp4moe bench --cpu: --iters %lld: at most 1000\n", n);
                goto done;
            }
            b->iters = (int)n;
            break;
        case O_OUT: out = v; break;
        case O_COMMIT: commit = v; break;
        case O_JSON: json = true; break;
        case O_PREFETCH:
            if (parse_prefetch(b, v)) goto done;
            break;
        case O_PROFILE: b->profile = true; break;
        case O_STREAM: b->stream = true; break;
        }
    }
    cli_bench_text = json ? stderr : stdout;
    if (b->stream && b->hot_tokens > 0) {
        fprintf(stderr, "nvfp4moe bench --cpu: --hot-tokens: --stream times the kernel alone, which routes nothing\n");
        goto done;
    }
    if ((b->npresets = cli_parse_presets("--preset", preset_list, presets, npresets, b->presets, 16)) < 0) goto done;
    if (b->nthreads == 0) {
        int n;
        if (nvfp4moe_cpu_default_threads(&n) != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe bench: %s\n", nvfp4moe_last_error());
            goto done;
        }
        b->threads[0] = n;
        b->nthreads = 1;
    }
    {
        char d[16];
        cli_bench_stamp(commit, b->commit, sizeof b->commit, b->date, sizeof b->date, d, sizeof d);
        char what[32];
        snprintf(what, sizeof what, "cpu-%lldt", (long long)b->threads[b->nthreads - 1]);
        if (out) snprintf(b->out, sizeof b->out, "%s", out);
        else cli_bench_default_prefix(d, what, b->out, sizeof b->out);
        if (cli_make_parent_dirs("--out", b->out) != 0) goto done;
        snprintf(b->cpu, sizeof b->cpu, "this CPU");
        FILE *ci = fopen("/proc/cpuinfo", "r");
        char line[256];
        while (ci && fgets(line, sizeof line, ci))
            if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
                snprintf(b->cpu, sizeof b->cpu, "%s", strchr(line, ':') + 2);
                b->cpu[strcspn(b->cpu, "\n")] = 0;
                break;
            }
        if (ci) fclose(ci);
    }
    const nvfp4moe_cpu_kernels *k = NULL;
    if (nvfp4moe_cpu_kernels_select(&k) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe bench: %s\n", nvfp4moe_last_error());
        goto done;
    }
    read_job *rj = calloc(1, sizeof *rj);
    uint8_t *evict = aligned_alloc((size_t)2 << 20, EVICT_BYTES);   /* huge pages, as the plan's weights */
    if (!rj || !evict) {
        fprintf(stderr, "nvfp4moe bench --cpu: out of memory for the 1 GiB read buffer\n");
        free(rj);
        free(evict);
        goto done;
    }
#ifdef MADV_HUGEPAGE
    madvise(evict, EVICT_BYTES, MADV_HUGEPAGE);
#endif
    memset(evict, 1, EVICT_BYTES);
    *rj = (read_job){.k = k, .buf = evict, .len = EVICT_BYTES};
    fprintf(cli_bench_text, "nvfp4moe bench --cpu on %s, kernels %s, commit %s\n", b->cpu, nvfp4moe_cpu_isa_name(k->isa), b->commit);
    if (b->hot_tokens > 0)  /* (refused above with --stream) */
        fprintf(cli_bench_text, "hot-expert routing: %lld of each point's tokens (all of them when fewer) pick "
                                "expert 0 first\n", (long long)b->hot_tokens);
    int bad = 0;
    if (b->stream) {
        bad = write_stream(b, rj);
    } else {
        for (int p = 0; p < b->npresets; p++) bad |= run_preset(b, b->presets[p], rj);
    }
    free(evict);
    free(rj);
    if (!b->stream && b->npts && write_outputs(b, json) != 0) bad = 1;
    rc = bad ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
done:
    free(b);
    return rc;
}
