/*
 * cmd_bench_cpu.c - `nvfp4moe bench --cpu`: CPU_FAST on real models' MoE layer shapes, against
 * this machine's read bandwidth measured in the same run with the same threads.
 *
 * Method: weights are random NVFP4 (uniform E2M1 codes, E4M3 scales in [2^-3, 448], never zero or
 * NaN) made directly, not quantized: the values do not change the time. To stay within memory, the
 * source layer holds at most a gigabyte of distinct experts, repeated (the plan's repacked copy,
 * which the forward reads, is distinct for every expert). Router logits are random normal
 * (uniform routing, renormalized top-k), hidden states random bf16. Per point: 2 warm-up forwards,
 * then --iters timed ones, each preceded by a read of a 1 GiB buffer on the same threads, which
 * evicts the caches and keeps the threads awake as a model's previous layer would. The time is the
 * median. Bytes read are the repacked weights of the experts the routing touches (codes and block
 * scales). The read bandwidth of a point is the median over its timed forwards of the 1 GiB read
 * that precedes each (the same threads, the kernels' own load width): on a shared machine the
 * bandwidth moves, and this measures it at the moment of each forward.
 */
#define _GNU_SOURCE   /* memfd_create */
#include "cli_ep.h"
#include "backends/cpu.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define EVICT_BYTES ((size_t)1 << 30)
#define SOURCE_BUDGET ((size_t)1 << 30)

/* ggml's NVFP4 MUL_MAT_ID (W4A8, Q8_0 activations), one layer forward, median ms, measured on a
 * 16-core x86 host whose read bandwidth was 104 GB/s at 16 threads, same weights and routing as
 * CPU_FAST there. These are that host's figures, quoted for comparison: ggml does not run here. */
static const struct { const char *preset; int64_t M; double ms; } k_ggml[] = {
    {"qwen3-30b-a3b", 1, 1.57}, {"qwen3-30b-a3b", 16, 7.7}, {"qwen3-30b-a3b", 256, 83},
    {"deepseek-v3", 1, 4.5},    {"deepseek-v3", 16, 51},
};
#define GGML_BW_GBS 104.0
#define GGML_THREADS 16

typedef struct {
    const cli_layer_preset *p;
    int64_t M;
    int threads;
    const char *isa;
    int64_t experts;          /* touched */
    double mb, ms, ms_min, gbs, pct, bw_gbs;
    double ggml_ms, ggml_pct; /* 0: no figure */
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

// ---- one preset ----

typedef struct {
    const cli_layer_preset *presets[16];
    int npresets;
    int64_t Ms[16];
    int nM;
    int64_t threads[16];
    int nthreads;
    int iters;
    nvfp4moe_scheme scheme;
    point pts[16 * 16 * 16];
    int npts;
    char out[512], commit[64], date[32], command[1024], cpu[160];
} bench_cpu;

static double expected_ggml_experts(const cli_layer_preset *p, int64_t M) {
    /* the expected number of experts uniform top-k routing touches */
    return p->E * (1.0 - pow(1.0 - (double)p->k / p->E, (double)M));
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
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(Mmax * pr->k));
    uint16_t *outb = malloc(sizeof(uint16_t) * (size_t)(Mmax * H));
    bool *seen = malloc((size_t)E);
    double *times = malloc(sizeof(double) * (size_t)b->iters), *bws = malloc(sizeof(double) * (size_t)b->iters);
    int rc = 0;
    if (!hidden || !logits || !tw || !ids || !outb || !seen || !times || !bws) {
        fprintf(stderr, "nvfp4moe bench --cpu: out of memory\n");
        rc = -1;
        goto done;
    }
    nvfp4moe_fill_normal(hidden, NVFP4MOE_DTYPE_BF16, Mmax * H, 7);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, Mmax * E, 8);
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
        fprintf(cli_bench_text, "%s: %d threads: plan in %.1f s (%.2f GB repacked)\n", pr->name, T, cli_now_s() - t0,
               (double)E * (double)per_expert / 1e9);
        for (int mi = 0; mi < b->nM; mi++) {
            const int64_t M = b->Ms[mi];
            nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits, .output = outb};
            for (int it = 0; it < 2 && st == NVFP4MOE_OK; it++) st = nvfp4moe_plan_forward(plan, &io, NULL);
            for (int it = 0; it < b->iters && st == NVFP4MOE_OK; it++) {
                double a = cli_now_s();
                nvfp4moe_cpu_pool_run(pool, read_task, rj);
                double r = cli_now_s();
                st = nvfp4moe_plan_forward(plan, &io, NULL);
                times[it] = cli_now_s() - r;
                bws[it] = (double)rj->len / (r - a) / 1e9;
            }
            if (st != NVFP4MOE_OK) {
                fprintf(stderr, "nvfp4moe bench --cpu: %s M=%lld: %s\n", pr->name, (long long)M, nvfp4moe_last_error());
                rc = -1;
                break;
            }
            qsort(times, (size_t)b->iters, sizeof times[0], cmp_double);
            qsort(bws, (size_t)b->iters, sizeof bws[0], cmp_double);
            const double bw = bws[b->iters / 2];
            nvfp4moe_route(&c, logits, M, NULL, ids, tw);
            memset(seen, 0, (size_t)E);
            int64_t touched = 0;
            for (int64_t i = 0; i < M * pr->k; i++)
                if (!seen[ids[i]]) {
                    seen[ids[i]] = true;
                    touched++;
                }
            point *pt = &b->pts[b->npts++];
            *pt = (point){.p = pr, .M = M, .threads = nvfp4moe_cpu_pool_size(pool), .experts = touched, .bw_gbs = bw};
            const nvfp4moe_cpu_kernels *k = NULL;
            nvfp4moe_cpu_kernels_select(&k);
            pt->isa = nvfp4moe_cpu_isa_name(k->isa);
            pt->mb = (double)touched * (double)per_expert / 1e6;
            pt->ms = times[b->iters / 2] * 1e3;
            pt->ms_min = times[0] * 1e3;
            pt->gbs = pt->mb / pt->ms;
            pt->pct = 100.0 * pt->gbs / bw;
            for (size_t g = 0; g < sizeof k_ggml / sizeof k_ggml[0]; g++)
                if (!strcmp(k_ggml[g].preset, pr->name) && k_ggml[g].M == M) {
                    pt->ggml_ms = k_ggml[g].ms;
                    pt->ggml_pct = 100.0 * expected_ggml_experts(pr, M) * (double)per_expert / 1e6 / k_ggml[g].ms / GGML_BW_GBS;
                }
            fprintf(cli_bench_text, "  M=%-5lld %3lld experts %8.1f MB  %9.3f ms (min %.3f)  %6.1f GB/s  read %5.1f GB/s  %5.1f %%\n",
                   (long long)M, (long long)touched, pt->mb, pt->ms, pt->ms_min, pt->gbs, bw, pt->pct);
            fflush(cli_bench_text);
        }
        nvfp4moe_cpu_pool_put(pool);
        nvfp4moe_plan_destroy(plan);
    }
done:
    tensor_free(&w13); tensor_free(&s13); tensor_free(&w2); tensor_free(&s2);
    free(vec); free(hidden); free(logits); free(tw); free(ids); free(outb); free(seen); free(times); free(bws);
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
    fprintf(f, "preset,scheme,M,threads,isa,experts,mb_read,ms_median,ms_min,gb_s,read_bw_gb_s,pct_read_bw,"
               "ggml_16c_ms,ggml_16c_pct_read_bw\n");
    for (int i = 0; i < b->npts; i++) {
        const point *p = &b->pts[i];
        fprintf(f, "%s,%s,%lld,%d,%s,%lld,%.2f,%.4f,%.4f,%.2f,%.2f,%.1f,", p->p->name, nvfp4moe_scheme_name(b->scheme),
                (long long)p->M, p->threads, p->isa, (long long)p->experts, p->mb, p->ms, p->ms_min, p->gbs, p->bw_gbs,
                p->pct);
        if (p->ggml_ms > 0) fprintf(f, "%.2f,%.1f\n", p->ggml_ms, p->ggml_pct);
        else fprintf(f, ",\n");
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
    fprintf(f, "- layer: random NVFP4 weights (E2M1 codes, E4M3 scales in [2^-3, 448]), scheme %s, bf16 activations, "
               "random normal router logits (renormalize top-k)\n", nvfp4moe_scheme_name(b->scheme));
    fprintf(f, "- time: median of %d forwards, each after a 1 GiB read on the same threads (cold caches, awake "
               "threads); MB read: the touched experts' NVFP4 codes and block scales\n", b->iters);
    fprintf(f, "- read bandwidth: per point, the median of the 1 GiB reads that precede its timed forwards (the same "
               "threads, the kernels' loads)\n");
    fprintf(f, "- ggml: the figures of a 16-core x86 host (read bandwidth 104 GB/s at 16 threads), quoted, not "
               "measured here; its %% assumes the experts uniform routing touches on average\n\n");
    fprintf(f, "| preset | M | threads | ISA | experts | MB read | ms | GB/s | read BW GB/s | %% of read BW | "
               "ggml 16 cores ms | ggml %% of its read BW |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < b->npts; i++) {
        const point *p = &b->pts[i];
        fprintf(f, "| %s | %lld | %d | %s | %lld | %.1f | %.3f | %.1f | %.1f | %.0f %% |", p->p->name, (long long)p->M,
                p->threads, p->isa, (long long)p->experts, p->mb, p->ms, p->gbs, p->bw_gbs, p->pct);
        if (p->ggml_ms > 0) fprintf(f, " %.2f | %.0f %% |\n", p->ggml_ms, p->ggml_pct);
        else fprintf(f, " | |\n");
    }
    fclose(f);
    json_t *rows[16 * 16 * 16];
    for (int i = 0; i < b->npts; i++) {
        const point *p = &b->pts[i];
        json_t *o = rows[i] = json_object();
        json_object_set_new(o, "preset", json_string(p->p->name));
        json_object_set_new(o, "scheme", json_string(nvfp4moe_scheme_name(b->scheme)));
        json_object_set_new(o, "M", json_integer(p->M));
        json_object_set_new(o, "threads", json_integer(p->threads));
        json_object_set_new(o, "isa", json_string(p->isa));
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
    }
    if (cli_bench_write_jsonl(b->out, rows, b->npts, json) != 0) return -1;
    fprintf(cli_bench_text, "wrote %s.csv, %s.md and %s.jsonl\n", b->out, b->out, b->out);
    return 0;
}

// ---- the command ----

enum { O_CPU, O_PRESET, O_M, O_THREADS, O_SCHEME, O_ITERS, O_OUT, O_COMMIT, O_JSON, O_COUNT };
static const cli_opt k_opts[O_COUNT] = {
    [O_CPU] = {"--cpu", NULL, "this mode: the CPU backend"},
    [O_PRESET] = {"--preset", "LIST", "comma-separated presets (default qwen3-30b-a3b,deepseek-v3)"},
    [O_M] = {"--m", "LIST", "tokens (default 1,16,64,256)"},
    [O_THREADS] = {"--threads", "LIST", "thread counts (default: every CPU this process may use)"},
    [O_SCHEME] = {"--scheme", "S", "w4a4 (default, the integer kernels) or w4a16 (the float kernels)"},
    [O_ITERS] = {"--iters", "N", "timed forwards per point (default 10)"},
    [O_OUT] = {"--out", "PREFIX", "output files PREFIX.csv, .md and .jsonl (default\n"
                                  CLI_BENCH_DEFAULT_DIR "/<date>-cpu-<threads>t in the current directory);\n"
                                  "missing folders are created, existing files replaced"},
    [O_COMMIT] = {"--commit", "SHA", "recorded in the markdown (default: $NVFP4MOE_COMMIT or git rev-parse)"},
    [O_JSON] = {"--json", NULL, "print the points as JSON lines on stdout (the progress goes to stderr)"},
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
               "Environment: NVFP4MOE_CPU_ISA=portable|avx2|avx512 forces the kernels.\n");
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
        }
    }
    cli_bench_text = json ? stderr : stdout;
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
    int bad = 0;
    for (int p = 0; p < b->npresets; p++) bad |= run_preset(b, b->presets[p], rj);
    free(evict);
    free(rj);
    if (b->npts && write_outputs(b, json) != 0) bad = 1;
    rc = bad ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
done:
    free(b);
    return rc;
}
