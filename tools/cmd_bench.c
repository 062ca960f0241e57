/*
 * cmd_bench.c - `nvfp4moe bench`: times our GPU backends (MARLIN, HOPPER_WGMMA on sm_90, or those
 * named by --backend) on real models' MoE layer shapes against a cuBLAS BF16 baseline and against
 * the layer's physical floor, all measured in the same run.
 *
 * Method (perf_anchors.md §5-6): weights are generated on the GPU (random E2M1 codes, random E4M3
 * scales in [2^-3, 448]: valid NVFP4, never zeros); router logits are uniform random (uniform
 * routing), and with --hot-tokens N changed on the host so that N of each point's tokens pick
 * expert 0 first (nvfp4moe_hot_expert_logits, as in bench --cpu). Each timed run is one CUDA-graph
 * replay of the whole forward between two CUDA events, preceded (outside the events) by a 512 MB
 * memset that evicts the 60 MB L2, so every run reads its weights from HBM; 3 warm-ups, then the
 * median of --iters runs. The floor of a point is max(touched experts' NVFP4 weight bytes / copy
 * bandwidth, FLOPs / bf16 matmul rate), the experts those the point's routing touched, with the
 * bandwidth measured by a 2 GB device-to-device copy (bytes read + written) and the rate by an
 * 8192^3 bf16 cublasGemmEx on random data, both in this run.
 *
 * The baseline is what a user without an NVFP4 kernel does: weights dequantized to BF16 once,
 * tokens gathered per expert, grouped BF16 GEMMs through cuBLAS (cublasGemmGroupedBatchedEx, or a
 * cublasGemmEx per expert when the library lacks it), the same activation kernel, a weighted
 * combine. Its routing and expert counts are computed once outside the timed region (the host must
 * know them to call cuBLAS), so the baseline is timed without routing; our backends' times include
 * routing and grouping from the logits.
 *
 * cuBLAS is loaded with dlopen (NVFP4MOE_CUBLAS=path overrides the search): the library stays free
 * of cuBLAS and the CLI builds where the toolkit has no libcublas.
 */
#include "cli.h"
#include "cli_ep.h"
#include "core/internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- presets ----

typedef cli_layer_preset preset;   /* tools/cli_ep.h: bench --ep uses the same table */

static const preset k_presets[] = {
    {"deepseek-v3", 256, 7168, 2048, 8, NVFP4MOE_ACT_SILU, false, 0},
    {"qwen3-30b-a3b", 128, 2048, 768, 8, NVFP4MOE_ACT_SILU, false, 0},
    {"qwen3-235b-a22b", 128, 4096, 1536, 8, NVFP4MOE_ACT_SILU, false, 0},
    {"mixtral-8x7b", 8, 4096, 14336, 2, NVFP4MOE_ACT_SILU, false, 0},
    {"gpt-oss-120b", 128, 2880, 2880, 4, NVFP4MOE_ACT_SWIGLUOAI, true, 7.0f},
    {"kimi-k2", 384, 7168, 2048, 8, NVFP4MOE_ACT_SILU, false, 0},
};
#define N_PRESETS ((int)(sizeof k_presets / sizeof k_presets[0]))

#define MAX_BACKENDS 4

enum { O_PRESET, O_M, O_HOT_TOKENS, O_BACKEND, O_ITERS, O_NO_BASELINE, O_OUT, O_COMMIT, O_JSON, O_EP, O_CPU, O_COUNT };
static const cli_opt k_opts[O_COUNT] = {
    [O_PRESET] = {"--preset", "LIST", "comma-separated presets (default: all)"},
    [O_M] = {"--m", "LIST", "token counts (default 1,4,16,64,256,1024,4096)"},
    [O_HOT_TOKENS] = {"--hot-tokens", "N", CLI_BENCH_HOT_HELP},
    [O_BACKEND] = {"--backend", "LIST", "comma-separated GPU backends (default: MARLIN, and HOPPER_WGMMA on\n"
                                        "sm_90)"},
    [O_ITERS] = {"--iters", "N", "timed runs per point (default 25, at least 20 recommended)"},
    [O_NO_BASELINE] = {"--no-baseline", NULL, "skip the cuBLAS baseline"},
    [O_OUT] = {"--out", "PREFIX", "output files PREFIX.csv, .md and .jsonl (default\n"
                                  CLI_BENCH_DEFAULT_DIR "/<date>-<gpu>-bench in the current directory);\n"
                                  "missing folders are created, existing files replaced"},
    [O_COMMIT] = {"--commit", "SHA", "recorded in the markdown (default: $NVFP4MOE_COMMIT or git rev-parse)"},
    [O_JSON] = {"--json", NULL, "print the points as JSON lines on stdout (the progress goes to stderr)"},
    [O_EP] = {"--ep", "N", "expert parallelism over N ranks instead (its own flags:\n"
                           "nvfp4moe bench --ep 2 --help)"},
    [O_CPU] = {"--cpu", NULL, "the CPU backend instead (its own flags: nvfp4moe bench --cpu --help)"},
};

static void bench_usage(FILE *f) {
    fprintf(f, "usage: nvfp4moe bench [flags]\n\n"
               "Times our GPU backends (routing from logits through the combined output, one CUDA graph) and\n"
               "a cuBLAS BF16 grouped-GEMM baseline on real models' MoE layers, cold L2, median of runs,\n"
               "against the floor max(weight bytes / copy bandwidth, FLOPs / bf16 rate) measured in the same run.\n"
               "Needs a CUDA build and a GPU. Writes PREFIX.csv, PREFIX.md and PREFIX.jsonl (one JSON object per\n"
               "CSV line). Presets:");
    for (int i = 0; i < N_PRESETS; i++) fprintf(f, " %s", k_presets[i].name);
    fprintf(f, "\n\n");
    cli_opts_help(f, k_opts, O_COUNT);
    fprintf(f, "  -h, --help                this text\n");
}

/* What the command line asks of the GPU benchmark. */
typedef struct {
    int Ms[32], nM;
    bool sel[N_PRESETS];
    int iters;
    long long hot_tokens;   /* --hot-tokens: 0 uniform routing */
    bool baseline, json;
    char be_list[256];
    const char *out, *commit;
} bench_opts;

/* Parses the GPU benchmark's flags: 0 to go on, else the exit status to return at once. */
static int parse_bench(int argc, char **argv, bench_opts *o, bool *done) {
    *done = false;
    const int defM[] = {1, 4, 16, 64, 256, 1024, 4096};
    memset(o, 0, sizeof *o);
    for (o->nM = 0; o->nM < 7; o->nM++) o->Ms[o->nM] = defM[o->nM];
    for (int i = 0; i < N_PRESETS; i++) o->sel[i] = true;
    o->iters = 25;
    o->baseline = true;
    o->commit = getenv("NVFP4MOE_COMMIT");
    const char *v = NULL;
    cli_args args;
    cli_args_init(&args, "bench", k_opts, O_COUNT, false, 0, argc, argv);
    for (int f; (f = cli_args_next(&args, &v)) != CLI_ARGS_END;) {
        long long n;
        switch (f) {
        case CLI_ARGS_HELP:
            bench_usage(stdout);
            *done = true;
            return CLI_EXIT_OK;
        case CLI_ARGS_ERROR: *done = true; return CLI_EXIT_FAILURE;
        case O_PRESET: {
            const cli_layer_preset *chosen[N_PRESETS * 4];
            const int k = cli_parse_presets("--preset", v, k_presets, N_PRESETS, chosen, N_PRESETS * 4);
            if (k < 0) {
                *done = true;
                return CLI_EXIT_FAILURE;
            }
            for (int p = 0; p < N_PRESETS; p++) o->sel[p] = false;
            for (int c = 0; c < k; c++) o->sel[chosen[c] - k_presets] = true;
            break;
        }
        case O_M: {
            char buf[512];
            nvfp4moe_strlcpy(buf, v, sizeof buf);
            o->nM = 0;
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && o->nM < 32;
                 tok = strtok_r(NULL, ",", &save)) {
                if (cli_parse_int("--m", tok, 1, &n)) {
                    *done = true;
                    return CLI_EXIT_FAILURE;
                }
                o->Ms[o->nM++] = (int)n;
            }
            if (!o->nM) {
                fprintf(stderr, "nvfp4moe bench: --m: no value in '%s'\n", v);
                *done = true;
                return CLI_EXIT_FAILURE;
            }
            break;
        }
        case O_HOT_TOKENS:
            if (cli_parse_int("--hot-tokens", v, 0, &n)) {
                *done = true;
                return CLI_EXIT_FAILURE;
            }
            o->hot_tokens = n;
            break;
        case O_ITERS:
            if (cli_parse_int("--iters", v, 1, &n)) {
                *done = true;
                return CLI_EXIT_FAILURE;
            }
            o->iters = (int)n;
            break;
        case O_BACKEND: nvfp4moe_strlcpy(o->be_list, v, sizeof o->be_list); break;
        case O_NO_BASELINE: o->baseline = false; break;
        case O_OUT: o->out = v; break;
        case O_COMMIT: o->commit = v; break;
        case O_JSON: o->json = true; break;
        case O_EP: case O_CPU: break;   /* not reached: cmd_bench hands those to their own commands */
        }
    }
    return 0;
}

#ifndef NVFP4MOE_HAVE_CUDA

int cmd_bench(int argc, char **argv) {
    if (cli_has_flag(argc, argv, "--ep")) return cli_bench_ep(argc, argv, k_presets, N_PRESETS);
    if (cli_has_flag(argc, argv, "--cpu")) return cli_bench_cpu(argc, argv, k_presets, N_PRESETS);
    bench_opts o;
    bool done;
    int rc = parse_bench(argc, argv, &o, &done);
    if (done) return rc;
    fprintf(stderr, "nvfp4moe bench: not available: this build has no CUDA backends (build with nvcc present); "
                    "nvfp4moe bench --cpu times the CPU backend\n");
    return CLI_EXIT_FAILURE;
}

#else

#include "oracle/oracle.h"
#include "reference/reference.h"
#include "kernels/pipeline.h"
#include "bench_kernels.h"

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <time.h>

// ---- cuBLAS through dlopen ----

typedef struct cublas_fns {
    void *lib;
    const char *path;
    __typeof__(cublasCreate_v2) *create;
    __typeof__(cublasDestroy_v2) *destroy;
    __typeof__(cublasSetStream_v2) *set_stream;
    __typeof__(cublasSetWorkspace_v2) *set_workspace;
    __typeof__(cublasGemmEx) *gemm_ex;
    __typeof__(cublasGemmGroupedBatchedEx) *gemm_grouped; /* NULL in cuBLAS < 12.5 */
} cublas_fns;

static int cublas_load(cublas_fns *f) {
    memset(f, 0, sizeof *f);
    const char *env = getenv("NVFP4MOE_CUBLAS");
    const char *names[] = {env, "libcublas.so.13", "libcublas.so.12", "libcublas.so",
                           "/usr/local/cuda/lib64/libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.12"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !f->lib; i++)
        if (names[i] && (f->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL))) f->path = names[i];
    if (!f->lib) return -1;
    f->create = (__typeof__(f->create))dlsym(f->lib, "cublasCreate_v2");
    f->destroy = (__typeof__(f->destroy))dlsym(f->lib, "cublasDestroy_v2");
    f->set_stream = (__typeof__(f->set_stream))dlsym(f->lib, "cublasSetStream_v2");
    f->set_workspace = (__typeof__(f->set_workspace))dlsym(f->lib, "cublasSetWorkspace_v2");
    f->gemm_ex = (__typeof__(f->gemm_ex))dlsym(f->lib, "cublasGemmEx");
    f->gemm_grouped = (__typeof__(f->gemm_grouped))dlsym(f->lib, "cublasGemmGroupedBatchedEx");
    return f->create && f->destroy && f->set_stream && f->gemm_ex ? 0 : -1;
}

// ---- timing ----

typedef int (*enqueue_fn)(void *ctx, cudaStream_t s);

typedef struct timer {
    cudaStream_t s;
    cudaEvent_t e0, e1;
    void *flush;
    size_t flush_bytes;
    int iters;
} timer;

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median microseconds of fn, cold L2, as a graph replay when it captures (else eager). */
static int time_op(timer *t, enqueue_fn fn, void *ctx, double *us, bool *graphed) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    *graphed = false;
    if (cudaStreamBeginCapture(t->s, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
        int rc = fn(ctx, t->s);
        cudaError_t e = cudaStreamEndCapture(t->s, &g);
        if (rc == 0 && e == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess) *graphed = true;
        cudaGetLastError(); /* a failed capture leaves an error behind: clear it, run eagerly */
    }
    float *ms = malloc(sizeof(float) * (size_t)t->iters);
    int rc = 0;
    for (int i = -3; i < t->iters && rc == 0; i++) {
        if (cudaMemsetAsync(t->flush, i & 0xFF, t->flush_bytes, t->s) != cudaSuccess) { rc = -1; break; }
        cudaEventRecord(t->e0, t->s);
        if (*graphed) rc = cudaGraphLaunch(ge, t->s) == cudaSuccess ? 0 : -1;
        else rc = fn(ctx, t->s);
        cudaEventRecord(t->e1, t->s);
        if (cudaEventSynchronize(t->e1) != cudaSuccess) rc = -1;
        if (i >= 0 && rc == 0) cudaEventElapsedTime(&ms[i], t->e0, t->e1);
    }
    if (rc == 0) {
        qsort(ms, (size_t)t->iters, sizeof(float), cmp_f);
        *us = 1e3 * (t->iters % 2 ? ms[t->iters / 2] : 0.5 * (ms[t->iters / 2 - 1] + ms[t->iters / 2]));
    }
    free(ms);
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    return rc;
}

// ---- the ceilings ----

typedef struct copy_ctx { void *dst, *src; size_t bytes; int blocks_per_sm; } copy_ctx;
static int enqueue_copy(void *ctx, cudaStream_t s) {
    copy_ctx *c = ctx;
    if (c->blocks_per_sm < 0)
        return cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess ? 0 : -1;
    return nvfp4moe_gpu_copy(c->dst, c->src, c->bytes, c->blocks_per_sm, s) == cudaSuccess ? 0 : -1;
}

typedef struct gemm_ctx { cublas_fns *cb; cublasHandle_t h; void *a, *b, *c; int n; } gemm_ctx;
static int enqueue_gemm(void *ctx, cudaStream_t s) {
    gemm_ctx *g = ctx;
    const float one = 1.0f, zero = 0.0f;
    g->cb->set_stream(g->h, s);
    return g->cb->gemm_ex(g->h, CUBLAS_OP_T, CUBLAS_OP_N, g->n, g->n, g->n, &one, g->a, CUDA_R_16BF, g->n, g->b,
                          CUDA_R_16BF, g->n, &zero, g->c, CUDA_R_16BF, g->n, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}

// ---- our backends' forward ----

/* "nvfp4moe bench: BACKEND[ WHAT]: MESSAGE" for the library's last error, naming the backend once:
 * the backends' own messages already start with "BACKEND: ". */
static void backend_error(const char *backend, const char *what) {
    const char *msg = nvfp4moe_last_error();
    const size_t bl = strlen(backend);
    if (strncmp(msg, backend, bl) == 0 && msg[bl] == ':') msg += bl + (msg[bl + 1] == ' ' ? 2 : 1);
    fprintf(stderr, "nvfp4moe bench: %s%s%s: %s\n", backend, what ? " " : "", what ? what : "", msg);
}

typedef struct fwd_ctx {
    nvfp4moe_plan *plan;
    nvfp4moe_io io;
} fwd_ctx;
static int enqueue_forward(void *ctx, cudaStream_t s) {
    fwd_ctx *m = ctx;
    nvfp4moe_status st = nvfp4moe_plan_forward(m->plan, &m->io, s);
    if (st != NVFP4MOE_OK)
        backend_error(nvfp4moe_plan_backend(m->plan), "forward");
    return st == NVFP4MOE_OK ? 0 : -1;
}

// ---- cuBLAS baseline forward ----

typedef struct base_ctx {
    cublas_fns *cb;
    cublasHandle_t h;
    int M, k, H, I, N1, groups;
    const void *hidden;
    const int32_t *sorted, *pos;
    const float *wts;
    void *xs, *y1, *act, *y2, *out;
    nvfp4moe_gpu_act_params ap;
    /* grouped GEMM arguments (host arrays; pointer arrays on the device) */
    cublasOperation_t *ta, *tb;
    int *m1, *n1, *k1, *lda1, *ldb1, *ldc1, *m2, *n2, *k2, *lda2, *ldb2, *ldc2, *gsize;
    float *alpha, *beta;
    void **dA1, **dB1, **dC1, **dA2, **dB2, **dC2;  /* device */
    void **hA1, **hB1, **hC1, **hA2, **hB2, **hC2;  /* host copies, for the per-expert fallback */
} base_ctx;

static int enqueue_base(void *ctx, cudaStream_t s) {
    base_ctx *b = ctx;
    const int P = b->M * b->k;
    b->cb->set_stream(b->h, s);
    if (nvfp4moe_gpu_gather_rows(b->hidden, b->sorted, b->k, P, b->H, b->xs, s) != cudaSuccess) return -1;
    const float one = 1.0f, zero = 0.0f;
    for (int pass = 0; pass < 2; pass++) {
        if (b->cb->gemm_grouped) {
            cublasStatus_t st = pass == 0
                ? b->cb->gemm_grouped(b->h, b->ta, b->tb, b->m1, b->n1, b->k1, b->alpha, (const void *const *)b->dA1,
                                      CUDA_R_16BF, b->lda1, (const void *const *)b->dB1, CUDA_R_16BF, b->ldb1,
                                      b->beta, b->dC1, CUDA_R_16BF, b->ldc1, b->groups, b->gsize, CUBLAS_COMPUTE_32F)
                : b->cb->gemm_grouped(b->h, b->ta, b->tb, b->m2, b->n2, b->k2, b->alpha, (const void *const *)b->dA2,
                                      CUDA_R_16BF, b->lda2, (const void *const *)b->dB2, CUDA_R_16BF, b->ldb2,
                                      b->beta, b->dC2, CUDA_R_16BF, b->ldc2, b->groups, b->gsize, CUBLAS_COMPUTE_32F);
            if (st != CUBLAS_STATUS_SUCCESS) return -1;
        } else {
            for (int g = 0; g < b->groups; g++) {
                cublasStatus_t st = pass == 0
                    ? b->cb->gemm_ex(b->h, CUBLAS_OP_T, CUBLAS_OP_N, b->m1[g], b->n1[g], b->k1[g], &one, b->hA1[g],
                                     CUDA_R_16BF, b->lda1[g], b->hB1[g], CUDA_R_16BF, b->ldb1[g], &zero, b->hC1[g],
                                     CUDA_R_16BF, b->ldc1[g], CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
                    : b->cb->gemm_ex(b->h, CUBLAS_OP_T, CUBLAS_OP_N, b->m2[g], b->n2[g], b->k2[g], &one, b->hA2[g],
                                     CUDA_R_16BF, b->lda2[g], b->hB2[g], CUDA_R_16BF, b->ldb2[g], &zero, b->hC2[g],
                                     CUDA_R_16BF, b->ldc2[g], CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                if (st != CUBLAS_STATUS_SUCCESS) return -1;
            }
        }
        if (pass == 0 &&
            nvfp4moe_gpu_activation(b->y1, b->act, P, b->I, b->N1, &b->ap, 1, s) != cudaSuccess)
            return -1;
    }
    return nvfp4moe_gpu_weighted_combine(b->y2, b->pos, b->wts, b->M, b->k, b->H, 1, b->out, s) == cudaSuccess ? 0 : -1;
}

// ---- the pipeline's own (non-GEMM) stages, timed alone: route+group, activation, combine ----

typedef struct stages_ctx {
    nvfp4moe_gpu_route_params rp;
    const void *logits;
    int32_t *ids, *sorted, *bexp, *nb;
    float *wts;
    int M, k, E, H, I, N1, bm, max_blocks;
    void *c1, *act, *out;
    nvfp4moe_gpu_act_params ap;
    int which;   /* 0 route+group, 1 activation, 2 combine, 3 group alone (ids given) */
} stages_ctx;

static int enqueue_stage(void *ctx, cudaStream_t s) {
    stages_ctx *c = ctx;
    cudaError_t e;
    if (c->which == 0)
        e = nvfp4moe_gpu_route_and_group(&c->rp, c->logits, c->ids, c->wts, c->M, c->k, c->E, c->bm, c->sorted,
                                         c->bexp, c->nb, c->max_blocks, NULL, s);
    else if (c->which == 1)
        e = nvfp4moe_gpu_activation(c->c1, c->act, (int64_t)c->M * c->k, c->I, c->N1, &c->ap, 1, s);
    else if (c->which == 2)
        e = nvfp4moe_gpu_combine(c->c1, c->ids, c->M, c->k, c->E, c->H, 1, c->out, NVFP4MOE_DTYPE_BF16, 0, s);
    else
        e = nvfp4moe_gpu_route_and_group(NULL, NULL, c->ids, c->wts, c->M, c->k, c->E, c->bm, c->sorted, c->bexp,
                                         c->nb, c->max_blocks, NULL, s);
    return e == cudaSuccess ? 0 : -1;
}

static double g_launch_us = NAN;  /* median time of a one-kernel graph that does nothing (16-byte copy) */

// ---- results ----

typedef struct result {
    const preset *p;
    int M, touched;
    int64_t hot;          /* tokens sent to expert 0 first (--hot-tokens; 0: uniform routing) */
    double wbytes, flops, floor_us;
    double be_us[MAX_BACKENDS], base_us;
    double be_rel[MAX_BACKENDS]; /* output rel. diff vs cuBLAS (vs backend 0 without a baseline) */
    double stage_us[4];   /* the non-GEMM stages: route+group, activation, combine, group alone (NAN: not measured) */
    bool be_ok[MAX_BACKENDS], base_ok, be_graph[MAX_BACKENDS], base_graph;
} result;

/* The backends timed in this run (--backend). */
static const char *g_be[MAX_BACKENDS];
static int g_nbe;
/* Points (a backend at one M) that failed: the run still writes the others, then exits 1. */
static int g_failed_points;

#define CK(expr)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "nvfp4moe bench: %s: %s\n", #expr, cudaGetErrorString(e_));           \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* The same inside the per-M loop: give up on this M only. */
#define CKM(expr)                                                                                  \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "nvfp4moe bench: M=%d: %s: %s\n", M, #expr, cudaGetErrorString(e_));  \
            goto next;                                                                             \
        }                                                                                          \
    } while (0)

static void *dalloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) {
        fprintf(stderr, "nvfp4moe bench: cudaMalloc(%zu bytes) failed\n", bytes);
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static double bf16_rel_diff(const uint16_t *a, const uint16_t *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double x = nvfp4moe_bf16_to_float(a[i]), y = nvfp4moe_bf16_to_float(b[i]);
        num += (x - y) * (x - y);
        den += y * y;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* --hot-tokens: the M x E logits on the device made hot-expert logits (nvfp4moe_hot_expert_logits,
 * the hot subset drawn from the logits' seed) through the host, before any timing. *count: the
 * hot tokens. */
static cudaError_t make_hot_logits(void *logits, int M, int E, long long hot, uint64_t seed, cudaStream_t s,
                                   int64_t *count) {
    float *h = malloc(sizeof(float) * (size_t)M * E);
    if (!h) return cudaErrorMemoryAllocation;
    /* on the bench's stream, which does not wait for the legacy default stream's copies */
    cudaError_t e = cudaMemcpyAsync(h, logits, sizeof(float) * (size_t)M * E, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e == cudaSuccess) {
        *count = nvfp4moe_hot_expert_logits(h, M, E, hot, seed, NULL);
        e = cudaMemcpyAsync(logits, h, sizeof(float) * (size_t)M * E, cudaMemcpyHostToDevice, s);
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);   /* h is freed next */
    free(h);
    return e;
}

/* Runs every M of one preset. Appends to res. */
static int bench_preset(const preset *p, const int *Ms, int nM, long long hot_tokens, timer *t, cublas_fns *cb,
                        cublasHandle_t h, bool baseline, double copy_bw, double peak, result *res, int *nres) {
    const int E = p->E, H = p->H, I = p->I, k = p->k;
    nvfp4moe_config cfg;
    cli_preset_config(p, &cfg);
    cfg.routing = NVFP4MOE_ROUTING_RENORMALIZE;
    cfg.router_logits_dtype = NVFP4MOE_DTYPE_F32;
    cfg.in_dtype = cfg.out_dtype = NVFP4MOE_DTYPE_BF16;
    const int N1 = nvfp4moe_config_n1(&cfg);
    const size_t w13b = (size_t)E * N1 * (H / 2), s13b = (size_t)E * N1 * (H / 16);
    const size_t w2b = (size_t)E * H * (I / 2), s2b = (size_t)E * H * (I / 16);
    const double bytes_per_expert = (double)(w13b + s13b + w2b + s2b) / E;
    const double flops_per_pair = 2.0 * ((double)N1 * H + (double)H * I);
    uint8_t *w13 = NULL, *sf13 = NULL, *w2 = NULL, *sf2 = NULL;
    float *s2a = NULL, *s2b_ = NULL, *ins = NULL;
    void *w13bf = NULL, *w2bf = NULL;
    nvfp4moe_plan *plans[MAX_BACKENDS] = {NULL};
    int rc = -1;
    fprintf(cli_bench_text, "\n== %s: E=%d H=%d I=%d top_k=%d %s%s, %.1f MB NVFP4 per expert\n", p->name, E, H, I, k,
           nvfp4moe_activation_name(p->act), p->limit ? " swiglu_limit=7" : "", bytes_per_expert / 1e6);
    fflush(cli_bench_text);

    if (!(w13 = dalloc(w13b)) || !(sf13 = dalloc(s13b)) || !(w2 = dalloc(w2b)) || !(sf2 = dalloc(s2b)) ||
        !(s2a = dalloc(4 * (size_t)E)) || !(s2b_ = dalloc(4 * (size_t)E)) || !(ins = dalloc(4 * (size_t)E)))
        goto fail;
    CK(nvfp4moe_gpu_fill_random_bytes(w13, w13b, 11, t->s));
    CK(nvfp4moe_gpu_fill_random_bytes(w2, w2b, 12, t->s));
    CK(nvfp4moe_gpu_fill_random_e4m3(sf13, s13b, 13, t->s));
    CK(nvfp4moe_gpu_fill_random_e4m3(sf2, s2b, 14, t->s));
    {
        /* scale_2 so that weights are roughly unit-variance / sqrt(fan_in): codes ~2.5, scales ~50 */
        float *hv = malloc(4 * (size_t)E);
        for (int e = 0; e < E; e++) hv[e] = (float)(1.0 / (125.0 * sqrt((double)H)));
        CK(cudaMemcpy(s2a, hv, 4 * (size_t)E, cudaMemcpyHostToDevice));
        for (int e = 0; e < E; e++) hv[e] = (float)(1.0 / (125.0 * sqrt((double)I)));
        CK(cudaMemcpy(s2b_, hv, 4 * (size_t)E, cudaMemcpyHostToDevice));
        for (int e = 0; e < E; e++) hv[e] = 1.0f;
        CK(cudaMemcpy(ins, hv, 4 * (size_t)E, cudaMemcpyHostToDevice));
        free(hv);
    }
    if (baseline) {
        if (!(w13bf = dalloc((size_t)E * N1 * H * 2)) || !(w2bf = dalloc((size_t)E * H * I * 2))) goto fail;
        CK(nvfp4moe_gpu_dequant_bf16(w13, sf13, s2a, E, N1, H, w13bf, t->s));
        CK(nvfp4moe_gpu_dequant_bf16(w2, sf2, s2b_, E, H, I, w2bf, t->s));
    }
    CK(cudaStreamSynchronize(t->s));
    {
        nvfp4moe_weights dw = {.w13 = w13, .w13_scale = sf13, .w13_scale_2 = s2a, .w13_input_scale = ins,
                               .w2 = w2, .w2_scale = sf2, .w2_scale_2 = s2b_, .w2_input_scale = ins};
        for (int bi = 0; bi < g_nbe; bi++) {
            nvfp4moe_plan_options po = {.backend = g_be[bi], .weights_on_device = true};
            if (nvfp4moe_plan_create(&cfg, &dw, &po, &plans[bi]) != NVFP4MOE_OK) {
                backend_error(g_be[bi], NULL);
                plans[bi] = NULL;
                goto fail;
            }
        }
    }
    /* each plan keeps its own repacked copy */
    cudaFree(w13); cudaFree(sf13); cudaFree(w2); cudaFree(sf2);
    w13 = sf13 = w2 = sf2 = NULL;

    for (int mi = 0; mi < nM; mi++) {
        const int M = Ms[mi], P = M * k;
        result r = {.p = p, .M = M};
        void *hidden = NULL, *logits = NULL, *ids = NULL, *wts = NULL, *sorted = NULL, *bexp = NULL, *nb = NULL,
             *pos = NULL, *out_b = NULL, *xs = NULL, *y1 = NULL, *act = NULL, *y2 = NULL;
        void *out_be[MAX_BACKENDS] = {NULL}, *ws_be[MAX_BACKENDS] = {NULL};
        void **dptr = NULL;
        int32_t *h_ids = NULL, *h_sorted = NULL, *h_pos = NULL;
        base_ctx b = {0};
        const int64_t cap = P;  /* block_m = 1: no padding */
        if (!(hidden = dalloc((size_t)M * H * 2)) || !(logits = dalloc((size_t)M * E * 4)) ||
            !(ids = dalloc((size_t)P * 4)) || !(wts = dalloc((size_t)P * 4)) || !(sorted = dalloc((size_t)cap * 4)) ||
            !(bexp = dalloc((size_t)cap * 4)) || !(nb = dalloc(4)) || !(pos = dalloc((size_t)P * 4)) ||
            !(out_b = dalloc((size_t)M * H * 2)))
            goto next;
        for (int bi = 0; bi < g_nbe; bi++)
            if (!(out_be[bi] = dalloc((size_t)M * H * 2))) goto next;
        CKM(nvfp4moe_gpu_fill_random_values(hidden, (size_t)M * H, NVFP4MOE_DTYPE_BF16, 1.0f, 100 + M, t->s));
        CKM(nvfp4moe_gpu_fill_random_values(logits, (size_t)M * E, NVFP4MOE_DTYPE_F32, 2.0f, 200 + M, t->s));
        if (hot_tokens > 0) CKM(make_hot_logits(logits, M, E, hot_tokens, 200 + M, t->s, &r.hot));
        /* the routing once, for the accounting and the baseline's groups (the same kernel as MARLIN's) */
        {
            nvfp4moe_gpu_route_params rp = {.method = cfg.routing, .logits_dtype = cfg.router_logits_dtype,
                                            .num_experts = E, .top_k = k, .n_group = 1, .topk_group = 1,
                                            .routed_scaling_factor = 1.0f};
            CKM(nvfp4moe_gpu_route_and_group(&rp, logits, ids, wts, M, k, E, 1, sorted, bexp, nb, (int32_t)cap, NULL, t->s));
            CKM(cudaStreamSynchronize(t->s));
        }
        h_ids = malloc(4 * (size_t)P);
        h_sorted = malloc(4 * (size_t)P);
        h_pos = malloc(4 * (size_t)P);
        CKM(cudaMemcpy(h_ids, ids, 4 * (size_t)P, cudaMemcpyDeviceToHost));
        CKM(cudaMemcpy(h_sorted, sorted, 4 * (size_t)P, cudaMemcpyDeviceToHost));
        {
            int *cnt = calloc((size_t)E, sizeof(int));
            for (int i = 0; i < P; i++) cnt[h_ids[i]]++;
            for (int e = 0; e < E; e++) r.touched += cnt[e] > 0;
            for (int i = 0; i < P; i++) h_pos[h_sorted[i]] = i;
            CKM(cudaMemcpy(pos, h_pos, 4 * (size_t)P, cudaMemcpyHostToDevice));
            r.wbytes = r.touched * bytes_per_expert;
            r.flops = (double)P * flops_per_pair;
            r.floor_us = 1e6 * fmax(r.wbytes / copy_bw, r.flops / peak);
            /* baseline groups: one per touched expert, rows contiguous in sorted order */
            if (baseline) {
                b.groups = r.touched;
                const int G = b.groups;
                b.ta = malloc(sizeof(cublasOperation_t) * (size_t)G);
                b.tb = malloc(sizeof(cublasOperation_t) * (size_t)G);
                int **arrs[] = {&b.m1, &b.n1, &b.k1, &b.lda1, &b.ldb1, &b.ldc1, &b.m2, &b.n2, &b.k2, &b.lda2,
                                &b.ldb2, &b.ldc2, &b.gsize};
                for (size_t q = 0; q < sizeof arrs / sizeof arrs[0]; q++) *arrs[q] = malloc(sizeof(int) * (size_t)G);
                b.alpha = malloc(sizeof(float) * (size_t)G);
                b.beta = malloc(sizeof(float) * (size_t)G);
                void ***harrs[] = {&b.hA1, &b.hB1, &b.hC1, &b.hA2, &b.hB2, &b.hC2};
                for (size_t q = 0; q < 6; q++) *harrs[q] = malloc(sizeof(void *) * (size_t)G);
                if (!(xs = dalloc((size_t)P * H * 2)) || !(y1 = dalloc((size_t)P * N1 * 2)) ||
                    !(act = dalloc((size_t)P * I * 2)) || !(y2 = dalloc((size_t)P * H * 2)) ||
                    !(dptr = dalloc(sizeof(void *) * 6 * (size_t)G))) {
                    free(cnt);
                    goto next;
                }
                int g = 0, off = 0;
                for (int e = 0; e < E; e++) {
                    if (!cnt[e]) continue;
                    b.ta[g] = CUBLAS_OP_T;
                    b.tb[g] = CUBLAS_OP_N;
                    b.gsize[g] = 1;
                    b.alpha[g] = 1.0f;
                    b.beta[g] = 0.0f;
                    /* column-major view: Y^T [N, rows] = W [N, K] (row-major = K x N col-major, op T) . X^T */
                    b.m1[g] = N1; b.n1[g] = cnt[e]; b.k1[g] = H; b.lda1[g] = H; b.ldb1[g] = H; b.ldc1[g] = N1;
                    b.m2[g] = H; b.n2[g] = cnt[e]; b.k2[g] = I; b.lda2[g] = I; b.ldb2[g] = I; b.ldc2[g] = H;
                    b.hA1[g] = (char *)w13bf + (size_t)e * N1 * H * 2;
                    b.hB1[g] = (char *)xs + (size_t)off * H * 2;
                    b.hC1[g] = (char *)y1 + (size_t)off * N1 * 2;
                    b.hA2[g] = (char *)w2bf + (size_t)e * H * I * 2;
                    b.hB2[g] = (char *)act + (size_t)off * I * 2;
                    b.hC2[g] = (char *)y2 + (size_t)off * H * 2;
                    off += cnt[e];
                    g++;
                }
                for (int q = 0; q < 6; q++)
                    CKM(cudaMemcpy(dptr + (size_t)q * G, *harrs[q], sizeof(void *) * (size_t)G, cudaMemcpyHostToDevice));
                b.dA1 = dptr; b.dB1 = dptr + G; b.dC1 = dptr + 2 * G;
                b.dA2 = dptr + 3 * G; b.dB2 = dptr + 4 * G; b.dC2 = dptr + 5 * G;
            }
            free(cnt);
        }

        /* our backends, one after the other on the same inputs */
        for (int bi = 0; bi < g_nbe; bi++) {
            const size_t wsz = nvfp4moe_plan_workspace_size(plans[bi], M);
            if (wsz && !(ws_be[bi] = dalloc(wsz))) goto next;
            fwd_ctx m = {.plan = plans[bi],
                         .io = {.num_tokens = M, .hidden = hidden, .router_logits = logits, .output = out_be[bi],
                                .workspace = ws_be[bi], .workspace_size = wsz}};
            /* one eager forward first: a kernel's first launch may set attributes that graph capture forbids */
            if (enqueue_forward(&m, t->s) == 0 && cudaStreamSynchronize(t->s) == cudaSuccess)
                r.be_ok[bi] = time_op(t, enqueue_forward, &m, &r.be_us[bi], &r.be_graph[bi]) == 0;
            if (!r.be_ok[bi]) {
                fprintf(stderr, "  %s M=%d failed: %s\n", g_be[bi], M, cudaGetErrorString(cudaGetLastError()));
                g_failed_points++;
            }
            cudaFree(ws_be[bi]);   /* the next backend's workspace may be as large */
            ws_be[bi] = NULL;
        }
        /* the non-GEMM stages alone (MARLIN's block_m): the rest of a forward's time is the two GEMMs */
        r.stage_us[0] = r.stage_us[1] = r.stage_us[2] = r.stage_us[3] = NAN;
        {
            /* MARLIN's block_m rule (vLLM's; kernels/moe_gemm.h nvfp4moe_marlin_block_m), restated here so
             * the CLI does not link the GEMM directly */
            int bm = 64;
            const int sizes[] = {8, 16, 32, 48, 64};
            for (int q = 4; q >= 0; q--)
                if ((double)P / E / sizes[q] < 0.9) bm = sizes[q];
            const int64_t gcap = ((int64_t)P + (int64_t)E * (bm - 1) + bm - 1) / bm * bm;
            void *s_sorted = dalloc((size_t)gcap * 4), *s_bexp = dalloc((size_t)(gcap / bm) * 4);
            void *s_c1 = dalloc((size_t)P * (N1 > H ? N1 : H) * 2), *s_act = dalloc((size_t)P * I * 2);
            if (s_sorted && s_bexp && s_c1 && s_act &&
                nvfp4moe_gpu_fill_random_values(s_c1, (size_t)P * (N1 > H ? N1 : H), NVFP4MOE_DTYPE_BF16, 1.0f, 7,
                                                t->s) == cudaSuccess) {
                const nvfp4moe_act_params ap = nvfp4moe_config_act_params(&cfg);
                stages_ctx sc = {.rp = {.method = cfg.routing, .logits_dtype = cfg.router_logits_dtype,
                                        .num_experts = E, .top_k = k, .n_group = 1, .topk_group = 1,
                                        .routed_scaling_factor = 1.0f},
                                 .logits = logits, .ids = ids, .sorted = s_sorted, .bexp = s_bexp, .nb = nb,
                                 .wts = wts, .M = M, .k = k, .E = E, .H = H, .I = I, .N1 = N1, .bm = bm,
                                 .max_blocks = (int)(gcap / bm), .c1 = s_c1, .act = s_act, .out = out_b,
                                 .ap = {.activation = cfg.activation, .has_limit = ap.has_limit, .limit = ap.limit,
                                        .alpha = ap.alpha, .beta = ap.beta, .situ_beta = ap.situ_beta,
                                        .situ_linear_beta = ap.situ_linear_beta}};
                bool gr;
                for (int w = 0; w < 4; w++) {
                    sc.which = w;
                    if (time_op(t, enqueue_stage, &sc, &r.stage_us[w], &gr)) r.stage_us[w] = NAN;
                }
            }
            void *sb[] = {s_sorted, s_bexp, s_c1, s_act};
            for (int q = 0; q < 4; q++)
                if (sb[q]) cudaFree(sb[q]);
        }
        /* baseline */
        if (baseline) {
            b.cb = cb; b.h = h; b.M = M; b.k = k; b.H = H; b.I = I; b.N1 = N1;
            b.hidden = hidden; b.sorted = sorted; b.pos = pos; b.wts = wts;
            b.xs = xs; b.y1 = y1; b.act = act; b.y2 = y2; b.out = out_b;
            const nvfp4moe_act_params ap = nvfp4moe_config_act_params(&cfg);
            b.ap = (nvfp4moe_gpu_act_params){.activation = cfg.activation, .has_limit = ap.has_limit,
                                             .limit = ap.limit, .alpha = ap.alpha, .beta = ap.beta,
                                             .situ_beta = ap.situ_beta, .situ_linear_beta = ap.situ_linear_beta};
            r.base_ok = time_op(t, enqueue_base, &b, &r.base_us, &r.base_graph) == 0;
            if (!r.base_ok) fprintf(stderr, "  cuBLAS baseline M=%d failed: %s\n", M, cudaGetErrorString(cudaGetLastError()));
        }
        /* all compute the same layer: a cheap guard against timing something wrong (the correctness
         * test is gpu_test) */
        {
            const void *ref = r.base_ok ? out_b : r.be_ok[0] ? out_be[0] : NULL;
            uint16_t *a = malloc((size_t)M * H * 2), *c = malloc((size_t)M * H * 2);
            for (int bi = 0; bi < g_nbe; bi++) {
                r.be_rel[bi] = NAN;
                if (ref && r.be_ok[bi] && out_be[bi] != ref &&
                    cudaMemcpy(a, out_be[bi], (size_t)M * H * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
                    cudaMemcpy(c, ref, (size_t)M * H * 2, cudaMemcpyDeviceToHost) == cudaSuccess)
                    r.be_rel[bi] = bf16_rel_diff(a, c, (size_t)M * H);
            }
            free(a);
            free(c);
        }
        fprintf(cli_bench_text, "  M=%-5d experts %3d  floor %9.1f us |", M, r.touched, r.floor_us);
        for (int bi = 0; bi < g_nbe; bi++)
            fprintf(cli_bench_text, " %s %9.1f us %5.1f%% %7.0f GB/s %6.1f TF/s (rel diff %.1e) |", g_be[bi], r.be_us[bi],
                   100 * r.floor_us / r.be_us[bi], r.wbytes / r.be_us[bi] / 1e3, r.flops / r.be_us[bi] / 1e6,
                   r.be_rel[bi]);
        fprintf(cli_bench_text, " cuBLAS %9.1f us %5.1f%% | stages route+group %.1f act %.1f combine %.1f us (group alone %.1f)\n",
               r.base_us, 100 * r.floor_us / r.base_us, r.stage_us[0], r.stage_us[1], r.stage_us[2], r.stage_us[3]);
        fflush(cli_bench_text);
        res[(*nres)++] = r;
    next:
        {
            void *bufs[] = {hidden, logits, ids, wts, sorted, bexp, nb, pos, out_b, xs, y1, act, y2, dptr};
            for (size_t q = 0; q < sizeof bufs / sizeof bufs[0]; q++)
                if (bufs[q]) cudaFree(bufs[q]);
            for (int bi = 0; bi < g_nbe; bi++) {
                if (out_be[bi]) cudaFree(out_be[bi]);
                if (ws_be[bi]) cudaFree(ws_be[bi]);
            }
        }
        free(h_ids); free(h_sorted); free(h_pos);
        free(b.ta); free(b.tb); free(b.m1); free(b.n1); free(b.k1); free(b.lda1); free(b.ldb1); free(b.ldc1);
        free(b.m2); free(b.n2); free(b.k2); free(b.lda2); free(b.ldb2); free(b.ldc2); free(b.gsize);
        free(b.alpha); free(b.beta); free(b.hA1); free(b.hB1); free(b.hC1); free(b.hA2); free(b.hB2); free(b.hC2);
        continue;
    }
    rc = 0;
fail:
    for (int bi = 0; bi < g_nbe; bi++)
        if (plans[bi]) nvfp4moe_plan_destroy(plans[bi]);
    {
        void *bufs[] = {w13, sf13, w2, sf2, s2a, s2b_, ins, w13bf, w2bf};
        for (size_t q = 0; q < sizeof bufs / sizeof bufs[0]; q++)
            if (bufs[q]) cudaFree(bufs[q]);
    }
    return rc;
}

// ---- outputs ----

static const char *gpu_short(const char *name, char *buf, size_t len) {
    const char *last = strrchr(name, ' ');
    nvfp4moe_strlcpy(buf, last ? last + 1 : name, len);
    for (char *c = buf; *c; c++) *c = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
    return buf;
}

static int write_outputs(const char *prefix, const result *res, int n, const char *card, const char *date,
                         const char *commit, const char *command, double copy_bw, double peak, int iters,
                         long long hot_tokens, const char *cublas_mode, bool json) {
    char path[1024];
    snprintf(path, sizeof path, "%s.csv", prefix);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "nvfp4moe bench: cannot write %s\n", path);
        return -1;
    }
    fprintf(f, "preset,E,H,I,top_k,M,hot_tokens,touched_experts,weight_bytes,flops,floor_us,backend,time_us,"
               "pct_of_floor,weight_GBps,TFLOPs,graph,stage_route_group_us,stage_activation_us,stage_combine_us,"
               "stage_group_only_us,out_rel_diff\n");
    for (int i = 0; i < n; i++) {
        const result *r = &res[i];
        for (int b = 0; b <= g_nbe; b++) {   /* b == g_nbe: the cuBLAS baseline */
            const bool base = b == g_nbe;
            if (!(base ? r->base_ok : r->be_ok[b])) continue;
            const double us = base ? r->base_us : r->be_us[b];
            fprintf(f, "%s,%d,%d,%d,%d,%d,%lld,%d,%.0f,%.0f,%.2f,%s,%.2f,%.2f,%.1f,%.2f,%d", r->p->name, r->p->E,
                    r->p->H, r->p->I, r->p->k, r->M, (long long)r->hot, r->touched, r->wbytes, r->flops, r->floor_us,
                    base ? "cublas_bf16" : g_be[b], us, 100 * r->floor_us / us, r->wbytes / us / 1e3,
                    r->flops / us / 1e6, (int)(base ? r->base_graph : r->be_graph[b]));
            if (!base)
                fprintf(f, ",%.2f,%.2f,%.2f,%.2f,%.2e\n", r->stage_us[0], r->stage_us[1], r->stage_us[2], r->stage_us[3],
                        r->be_rel[b]);
            else fprintf(f, ",,,,,\n");
        }
    }
    fclose(f);
    snprintf(path, sizeof path, "%s.md", prefix);
    if (!(f = fopen(path, "w"))) {
        fprintf(stderr, "nvfp4moe bench: cannot write %s\n", path);
        return -1;
    }
    fprintf(f, "# nvfp4moe bench:");
    for (int b = 0; b < g_nbe; b++) fprintf(f, "%s %s", b ? "," : "", g_be[b]);
    fprintf(f, " vs cuBLAS BF16, %s\n\n", card);
    fprintf(f, "- card: %s\n- date: %s\n- commit: %s\n- command: `%s`\n", card, date, commit, command);
    fprintf(f, "- ceilings measured in this run: copy %.2f TB/s (2 GB device-to-device copy kernel, 16-byte accesses, read + write), "
               "bf16 matmul %.0f TFLOP/s (cublasGemmEx 8192^3, random data)\n", copy_bw / 1e12, peak / 1e12);
    fprintf(f, "- a one-kernel graph that does nothing times at %.1f us here (events + launch): the stage columns "
               "below, each stage timed alone, include it; inside the forward's graph the stages run back to back "
               "(HOPPER_WGMMA's GEMM1 applies SiLU itself where it runs 256 weight rows per stage, block_m 64 and "
               "128: there the forward runs no activation kernel)\n",
            g_launch_us);
    fprintf(f, "- floor = max(touched experts' NVFP4 bytes (0.5625 B/weight) / copy bandwidth, FLOPs / bf16 rate); "
               "%% = floor / time\n");
    char routing[512];
    cli_bench_routing_words(hot_tokens, routing, sizeof routing);
    fprintf(f, "- timing: one CUDA-graph replay per run, L2 flushed (512 MB memset) before each, 3 warm-ups, "
               "median of %d runs; %s\n", iters, routing);
    fprintf(f, "- our backends: routing + grouping from logits, GEMM1, activation, GEMM2 x top-k weight, combine "
               "(the whole forward, the plan API). cuBLAS baseline (%s): BF16 weights dequantized once; gather, "
               "grouped GEMM1, the same activation kernel, grouped GEMM2, weighted combine; routing and the "
               "per-expert counts precomputed (not timed)\n", cublas_mode);
    fprintf(f, "- rel diff: ||out - cuBLAS out|| / ||cuBLAS out|| (bf16 outputs), a guard that the same layer is "
               "timed; correctness against the float64 reference is gpu_test's job\n\n");
    const preset *cur = NULL;
    for (int i = 0; i < n; i++) {
        const result *r = &res[i];
        if (r->p != cur) {
            cur = r->p;
            fprintf(f, "\n## %s (E=%d, H=%d, I=%d, top-%d%s)\n\n", cur->name, cur->E, cur->H, cur->I, cur->k,
                    cur->limit ? ", swigluoai, swiglu_limit 7" : "");
            fprintf(f, "| M | experts | floor (us) |");
            for (int b = 0; b < g_nbe; b++) fprintf(f, " %s (us) | %% of floor | TFLOP/s |", g_be[b]);
            for (int b = 1; b < g_nbe; b++) fprintf(f, " %s vs %s |", g_be[b], g_be[0]);
            fprintf(f, " cuBLAS bf16 (us) | %% of floor | best ours vs cuBLAS | out rel diff |"
                       " non-GEMM stages, each timed alone: route+group / act / combine (us) |\n|---:|---:|---:|");
            for (int b = 0; b < g_nbe; b++) fprintf(f, "---:|---:|---:|");
            for (int b = 1; b < g_nbe; b++) fprintf(f, "---:|");
            fprintf(f, "---:|---:|---:|---|---|\n");
        }
        fprintf(f, "| %d | %d | %.1f |", r->M, r->touched, r->floor_us);
        double best = INFINITY;
        for (int b = 0; b < g_nbe; b++) {
            if (r->be_ok[b]) {
                fprintf(f, " %.1f | %.1f | %.1f |", r->be_us[b], 100 * r->floor_us / r->be_us[b],
                        r->flops / r->be_us[b] / 1e6);
                if (r->be_us[b] < best) best = r->be_us[b];
            } else {
                fprintf(f, " failed | | |");
            }
        }
        for (int b = 1; b < g_nbe; b++) {
            if (r->be_ok[0] && r->be_ok[b]) fprintf(f, " %.2fx |", r->be_us[0] / r->be_us[b]);
            else fprintf(f, " |");
        }
        if (r->base_ok) fprintf(f, " %.1f | %.1f |", r->base_us, 100 * r->floor_us / r->base_us);
        else fprintf(f, " - | |");
        if (r->base_ok && isfinite(best)) fprintf(f, " %.2fx |", r->base_us / best);
        else fprintf(f, " |");
        for (int b = 0; b < g_nbe; b++) fprintf(f, "%s%.1e", b ? " / " : " ", r->be_rel[b]);
        fprintf(f, " |");
        fprintf(f, " %.1f / %.1f / %.1f (group alone %.1f) |\n", r->stage_us[0], r->stage_us[1], r->stage_us[2],
                r->stage_us[3]);
    }
    fclose(f);
    /* the JSON lines: one object per CSV line, the same fields */
    json_t **rows = calloc((size_t)n * (MAX_BACKENDS + 1) + 1, sizeof *rows);
    int nrows = 0;
    for (int i = 0; rows && i < n; i++) {
        const result *r = &res[i];
        for (int b = 0; b <= g_nbe; b++) {
            const bool base = b == g_nbe;
            if (!(base ? r->base_ok : r->be_ok[b])) continue;
            const double us = base ? r->base_us : r->be_us[b];
            json_t *o = rows[nrows++] = json_object();
            json_object_set_new(o, "preset", json_string(r->p->name));
            json_object_set_new(o, "E", json_integer(r->p->E));
            json_object_set_new(o, "H", json_integer(r->p->H));
            json_object_set_new(o, "I", json_integer(r->p->I));
            json_object_set_new(o, "top_k", json_integer(r->p->k));
            json_object_set_new(o, "M", json_integer(r->M));
            json_object_set_new(o, "hot_tokens", json_integer(r->hot));
            json_object_set_new(o, "touched_experts", json_integer(r->touched));
            json_object_set_new(o, "weight_bytes", json_real(r->wbytes));
            json_object_set_new(o, "flops", json_real(r->flops));
            json_object_set_new(o, "floor_us", json_real(r->floor_us));
            json_object_set_new(o, "backend", json_string(base ? "cublas_bf16" : g_be[b]));
            json_object_set_new(o, "time_us", json_real(us));
            json_object_set_new(o, "pct_of_floor", json_real(100 * r->floor_us / us));
            json_object_set_new(o, "weight_GBps", json_real(r->wbytes / us / 1e3));
            json_object_set_new(o, "TFLOPs", json_real(r->flops / us / 1e6));
            json_object_set_new(o, "graph", json_boolean(base ? r->base_graph : r->be_graph[b]));
            for (int q = 0; q < 4; q++) {
                static const char *const k_stage[] = {"stage_route_group_us", "stage_activation_us",
                                                      "stage_combine_us", "stage_group_only_us"};
                json_object_set_new(o, k_stage[q], !base && isfinite(r->stage_us[q]) ? json_real(r->stage_us[q])
                                                                                     : json_null());
            }
            json_object_set_new(o, "out_rel_diff", !base && isfinite(r->be_rel[b]) ? json_real(r->be_rel[b]) : json_null());
            json_object_set_new(o, "card", json_string(card));
            json_object_set_new(o, "commit", json_string(commit));
            json_object_set_new(o, "date", json_string(date));
        }
    }
    int rc = rows ? cli_bench_write_jsonl(prefix, rows, nrows, json) : -1;
    if (!rows) fprintf(stderr, "nvfp4moe bench: out of memory\n");
    free(rows);
    if (rc == 0) fprintf(cli_bench_text, "\nwrote %s.csv, %s.md and %s.jsonl\n", prefix, prefix, prefix);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    if (cli_has_flag(argc, argv, "--ep")) return cli_bench_ep(argc, argv, k_presets, N_PRESETS);
    if (cli_has_flag(argc, argv, "--cpu")) return cli_bench_cpu(argc, argv, k_presets, N_PRESETS);
    bench_opts opts;
    bool parsed_done;
    int prc = parse_bench(argc, argv, &opts, &parsed_done);
    if (parsed_done) return prc;
    int *Ms = opts.Ms, nM = opts.nM, iters = opts.iters;
    const bool *sel = opts.sel;
    bool baseline = opts.baseline;
    char *be_list = opts.be_list;
    const char *out = opts.out, *commit = opts.commit;
    cli_bench_text = opts.json ? stderr : stdout;
    char command[1024];
    cli_bench_command(argc, argv, command, sizeof command);

    nvfp4moe_device dev;
    if (nvfp4moe_device_detect(&dev) != NVFP4MOE_OK || !dev.is_cuda) {
        fprintf(stderr, "nvfp4moe bench: not available: no CUDA GPU found\n");
        return CLI_EXIT_FAILURE;
    }
    /* the backends: named ones must be GPU backends of this build; the default is every fast one */
    static char be_names[MAX_BACKENDS][32];
    g_nbe = 0;
    if (!be_list[0]) snprintf(be_list, sizeof opts.be_list, "MARLIN%s", dev.sm == 90 ? ",HOPPER_WGMMA" : "");
    for (char *save = NULL, *tok = strtok_r(be_list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const nvfp4moe_backend_impl *im = NULL;
        for (char *c = tok; *c; c++) *c = (char)(*c >= 'a' && *c <= 'z' ? *c - 'a' + 'A' : *c == '-' ? '_' : *c);
        if (!(im = nvfp4moe_backend_impl_find(tok)) || !im->device_memory) {
            nvfp4moe_suggest sg;
            nvfp4moe_suggest_init(&sg, tok);
            for (int r = 0; r < nvfp4moe_backend_count(); r++) {
                const nvfp4moe_backend_impl *ri = nvfp4moe_backend_impl_find(nvfp4moe_backend_name(r));
                if (ri && ri->device_memory) nvfp4moe_suggest_add(&sg, nvfp4moe_backend_name(r));
            }
            const char *best = nvfp4moe_suggest_best(&sg);
            fprintf(stderr, "nvfp4moe bench: --backend: '%s' is not a GPU backend of this build%s%s%s (try MARLIN, "
                            "HOPPER_WGMMA, EMULATION)\n", tok, best ? "; did you mean '" : "", best ? best : "",
                    best ? "'?" : "");
            return CLI_EXIT_FAILURE;
        }
        if (g_nbe == MAX_BACKENDS) {
            fprintf(stderr, "nvfp4moe bench: --backend: at most %d backends\n", MAX_BACKENDS);
            return CLI_EXIT_FAILURE;
        }
        nvfp4moe_strlcpy(be_names[g_nbe], tok, sizeof be_names[g_nbe]);
        g_be[g_nbe] = be_names[g_nbe];
        g_nbe++;
    }
    cublas_fns cb;
    const bool have_cublas = cublas_load(&cb) == 0;
    if (!have_cublas) {
        fprintf(stderr, "nvfp4moe bench: cuBLAS could not be loaded (set NVFP4MOE_CUBLAS=/path/libcublas.so): "
                        "no baseline and no measured bf16 rate\n");
        baseline = false;
    }
    char commit_buf[64], date[32], d[16], gshort[64], prefix[512];
    cli_bench_stamp(commit, commit_buf, sizeof commit_buf, date, sizeof date, d, sizeof d);
    commit = commit_buf;
    if (!out) {
        char what[96];
        snprintf(what, sizeof what, "%s-bench", gpu_short(dev.name, gshort, sizeof gshort));
        cli_bench_default_prefix(d, what, prefix, sizeof prefix);
        out = prefix;
    }
    if (cli_make_parent_dirs("--out", out) != 0) return CLI_EXIT_FAILURE;

    timer t = {.iters = iters, .flush_bytes = (size_t)512 << 20};
    cublasHandle_t h = NULL;
    void *cws = NULL, *buf_a = NULL, *buf_b = NULL, *buf_c = NULL;
    result *res = calloc((size_t)N_PRESETS * 32, sizeof *res);
    int nres = 0, rc = CLI_EXIT_FAILURE;
    double copy_bw = 0, peak = 0;
    bool graphed;
    CK(cudaStreamCreateWithFlags(&t.s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&t.e0));
    CK(cudaEventCreate(&t.e1));
    if (!(t.flush = dalloc(t.flush_bytes))) goto fail;
    if (have_cublas) {
        if (cb.create(&h) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "nvfp4moe bench: cublasCreate failed\n");
            goto fail;
        }
        /* a fixed workspace: cuBLAS then allocates nothing while a graph is captured */
        if (cb.set_workspace && (cws = dalloc((size_t)64 << 20))) cb.set_workspace(h, cws, (size_t)64 << 20);
    }

    /* the ceilings, measured now */
    {
        const size_t bytes = (size_t)2 << 30;
        if (!(buf_a = dalloc(bytes)) || !(buf_b = dalloc(bytes))) goto fail;
        CK(nvfp4moe_gpu_fill_random_bytes(buf_a, bytes, 1, t.s));
        /* the best of cudaMemcpyAsync and our copy kernel at a few grid sizes: the ceiling is the
         * fastest copy we can make, not the first one tried */
        double us;
        const int variants[] = {-1, 2, 4, 8, 16, 32};
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
            copy_ctx c = {buf_b, buf_a, bytes, variants[v]};
            if (time_op(&t, enqueue_copy, &c, &us, &graphed)) goto fail;
            const double bw = 2.0 * (double)bytes / (us * 1e-6);
            fprintf(cli_bench_text, "copy %s: %.2f TB/s\n", variants[v] < 0 ? "cudaMemcpyAsync" : "kernel", bw / 1e12);
            if (bw > copy_bw) copy_bw = bw;
        }
        cudaFree(buf_b);
        buf_b = NULL;
        if (have_cublas) {
            const int n = 8192;
            const size_t mb = (size_t)n * n * 2;
            if (!(buf_b = dalloc(mb)) || !(buf_c = dalloc(mb))) goto fail;
            CK(nvfp4moe_gpu_fill_random_values(buf_a, (size_t)n * n, NVFP4MOE_DTYPE_BF16, 1.0f, 2, t.s));
            CK(nvfp4moe_gpu_fill_random_values(buf_b, (size_t)n * n, NVFP4MOE_DTYPE_BF16, 1.0f, 3, t.s));
            gemm_ctx g = {&cb, h, buf_a, buf_b, buf_c, n};
            if (time_op(&t, enqueue_gemm, &g, &us, &graphed)) {
                fprintf(stderr, "nvfp4moe bench: the bf16 GEMM failed\n");
                goto fail;
            }
            peak = 2.0 * n * (double)n * n / (us * 1e-6);
        } else {
            peak = 790e12; /* the workplace's measured figure, used only when cuBLAS is missing */
        }
        /* what timing one tiny graph costs: the floor under every "stage alone" figure */
        {
            copy_ctx c = {buf_c ? buf_c : buf_a, buf_a, 16, 1};
            if (time_op(&t, enqueue_copy, &c, &g_launch_us, &graphed)) g_launch_us = NAN;
        }
        cudaFree(buf_a); cudaFree(buf_b); cudaFree(buf_c);
        buf_a = buf_b = buf_c = NULL;
    }
    fprintf(cli_bench_text, "nvfp4moe bench on %s (sm_%d, %d SMs), commit %s\n", dev.name, dev.sm, dev.sm_count, commit);
    fprintf(cli_bench_text, "a one-kernel graph that does nothing times at %.1f us (events + launch)\n", g_launch_us);
    if (opts.hot_tokens > 0)
        fprintf(cli_bench_text, "hot-expert routing: %lld of each point's tokens (all of them when fewer) pick "
                                "expert 0 first\n", opts.hot_tokens);
    fprintf(cli_bench_text, "ceilings: copy %.2f TB/s, bf16 matmul %.0f TFLOP/s%s; cuBLAS %s (%s)\n", copy_bw / 1e12, peak / 1e12,
           have_cublas ? "" : " (assumed)", have_cublas ? cb.path : "missing",
           have_cublas ? (cb.gemm_grouped ? "cublasGemmGroupedBatchedEx" : "cublasGemmEx per expert") : "-");
    fflush(cli_bench_text);

    int failed_presets = 0;
    g_failed_points = 0;
    for (int p = 0; p < N_PRESETS; p++) {
        if (!sel[p]) continue;
        if (bench_preset(&k_presets[p], Ms, nM, opts.hot_tokens, &t, &cb, h, baseline, copy_bw, peak, res, &nres)) {
            fprintf(stderr, "nvfp4moe bench: preset %s failed\n", k_presets[p].name);
            failed_presets++;
        }
    }
    rc = write_outputs(out, res, nres, dev.name, date, commit, command, copy_bw, peak, iters, opts.hot_tokens,
                       !baseline ? "not run" : cb.gemm_grouped ? "cublasGemmGroupedBatchedEx" : "cublasGemmEx per expert",
                       opts.json)
             ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
    /* what did run is in the files; a failed preset or point still makes the run a failure */
    if (rc == CLI_EXIT_OK && (failed_presets || g_failed_points)) {
        fprintf(stderr, "nvfp4moe bench: %d preset(s) and %d point(s) failed (messages above); the files hold "
                        "the rest\n", failed_presets, g_failed_points);
        rc = CLI_EXIT_FAILURE;
    }
fail:
    if (buf_a) cudaFree(buf_a);
    if (buf_b) cudaFree(buf_b);
    if (buf_c) cudaFree(buf_c);
    if (h) cb.destroy(h);
    if (cws) cudaFree(cws);
    if (t.flush) cudaFree(t.flush);
    free(res);
    return rc;
}

#endif /* NVFP4MOE_HAVE_CUDA */
