/*
 * cmd_run_ep.c - `nvfp4moe run --ep N`: the layer run with expert parallelism over N ranks.
 *
 *  - On a machine whose detected device is a GPU: one process per GPU. The launcher (the process
 *    the user started) checks that the build has NCCL and that N GPUs are present, sets
 *    NCCL_NVLS_ENABLE=0, and starts N copies of itself (fork + exec of /proc/self/exe, so no child
 *    inherits the parent's CUDA context) with NVFP4MOE_EP_RANK and NVFP4MOE_EP_ID_FILE set; rank 0
 *    writes the NCCL id to that file. Each rank builds the same layer (same seed), its own tokens,
 *    plans its local experts on the backend the oracle picks for the deployment (or --moe-backend),
 *    and prints its time split and an output checksum. This path has not run on several GPUs
 *    (docs/expert_parallel.md, "What has been run").
 *  - Otherwise (no GPU): the loopback simulation: N ranks as threads of this process, the local
 *    experts on CPU_FAST (or --moe-backend), since the oracle, like vLLM, has no EP backend for
 *    the CPU. The output says so.
 *
 * The launcher is shared with `nvfp4moe bench --ep N` (tools/cmd_bench_ep.c).
 */
#include "cli_ep.h"

#include <errno.h>
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

typedef struct {
    const nvfp4moe_config *cfg;
    const nvfp4moe_weights *w;
    int64_t tokens;
    const char *local_backend;
    const nvfp4moe_device *dev;
    bool per_gpu;                  /* one process per GPU: rank r runs on CUDA device r */
    uint64_t checksum[64];
    double sum[64];
    nvfp4moe_ep_stats stats[64];
    char backend[64][40];
} ep_run;

/* One rank: its own tokens (seeded by rank), its EP plan, one forward. Shared by both modes. */
static nvfp4moe_status one_rank(int32_t rank, const nvfp4moe_ep_transport *t, void *ctx) {
    ep_run *r = ctx;
    nvfp4moe_config cfg = *r->cfg;
    cfg.parallel.ep_rank = rank;
    const int64_t M = r->tokens, H = cfg.hidden_size, E = cfg.num_experts;
    nvfp4moe_device dev = *r->dev;
    if (r->per_gpu) dev.ordinal = rank;
    nvfp4moe_plan_options po = {.device = &dev};
    /* A token's top-k experts are distinct, so one source sends an expert at most M rows: M is the
     * smallest capacity that can never overflow (each rank then receives E*M padded rows). */
    nvfp4moe_ep_options eo = {.plan = &po, .local_backend = r->local_backend, .max_tokens = M > 0 ? M : 1};
    nvfp4moe_ep_plan *p = NULL;
    /* Collective: a rank failing here makes every rank fail here. */
    nvfp4moe_status st = nvfp4moe_ep_plan_create(&cfg, r->w, t, &eo, &p);
    if (st != NVFP4MOE_OK) return st;
    const size_t isz = nvfp4moe_dtype_size(cfg.in_dtype), osz = nvfp4moe_dtype_size(cfg.out_dtype);
    void *hidden = malloc((size_t)(M * H) * isz + 1), *logits = malloc((size_t)(M * E) * nvfp4moe_dtype_size(cfg.router_logits_dtype) + 1);
    void *out = malloc((size_t)(M * H) * osz + 1);
    if (!hidden || !logits || !out) {
        /* Still take part (with no tokens) so the other ranks are not left waiting. */
        nvfp4moe_io none = {.num_tokens = 0};
        nvfp4moe_ep_forward(p, &none, NULL);
        nvfp4moe_ep_forward(p, &none, NULL);
        fprintf(stderr, "nvfp4moe run: rank %d: out of memory for %lld tokens\n", rank, (long long)M);
        st = NVFP4MOE_ERR_OUT_OF_MEMORY;
    } else {
        nvfp4moe_fill_normal(hidden, cfg.in_dtype, M * H, cfg.seed * 31 + 7 + (uint64_t)rank * 1000003u);
        nvfp4moe_fill_normal(logits, cfg.router_logits_dtype, M * E, cfg.seed * 31 + 11 + (uint64_t)rank * 1000003u);
        nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits, .output = out};
        /* The first forward warms up (kernel loading, NCCL connections); the second is timed. */
        for (int rep = 0; rep < 2 && st == NVFP4MOE_OK; rep++) st = nvfp4moe_ep_forward(p, &io, &r->stats[rank]);
    }
    if (st == NVFP4MOE_OK) {
        double sum = 0;
        float v;
        for (int64_t i = 0; i < M * H; i++) {
            nvfp4moe_to_float(cfg.out_dtype, (const char *)out + (size_t)i * osz, 1, &v);
            sum += v;
        }
        r->sum[rank] = sum;
        r->checksum[rank] = cli_fnv1a(out, (size_t)(M * H) * osz, CLI_FNV1A_INIT);
        snprintf(r->backend[rank], sizeof r->backend[rank], "%s", nvfp4moe_plan_backend(nvfp4moe_ep_plan_local(p)));
    }
    free(hidden);
    free(logits);
    free(out);
    nvfp4moe_ep_plan_destroy(p);
    return st;
}

static void print_rank(const ep_run *r, int32_t rank) {
    const nvfp4moe_ep_stats *s = &r->stats[rank];
    printf("rank %-3d  %lld tokens on %s: dispatch %.3f ms, experts %.3f ms, combine %.3f ms; rows sent %lld, "
           "received %lld; checksum sum=%.6g fnv1a=%016llx\n",
           rank, (long long)r->tokens, r->backend[rank], s->dispatch_s * 1e3, s->experts_s * 1e3, s->combine_s * 1e3,
           (long long)s->rows_sent, (long long)s->rows_received, r->sum[rank], (unsigned long long)r->checksum[rank]);
}

int cli_cuda_gpu_count(void) {
    int gpus = 0;
#ifdef NVFP4MOE_HAVE_CUDA
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
#endif
    return gpus;
}

/* The launcher of `run --ep` and `bench --ep` over NCCL: starts N copies of this program (fork +
 * exec of /proc/self/exe, so no child inherits a CUDA context) with the same arguments,
 * NVFP4MOE_EP_RANK=r and NVFP4MOE_EP_ID_FILE (a file in a fresh temporary directory, where rank 0
 * writes the NCCL id), NCCL_NVLS_ENABLE=0; waits for all. argv[0] is the subcommand. */
int cli_launch_ranks(const char *what, int32_t N, int argc, char **argv) {
    char dir[] = "/tmp/nvfp4moe-ep-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "nvfp4moe %s: cannot make a temporary directory: %s\n", what, strerror(errno));
        return CLI_EXIT_FAILURE;
    }
    char id_file[sizeof dir + 16];
    snprintf(id_file, sizeof id_file, "%s/nccl_id", dir);
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    setenv("NVFP4MOE_EP_ID_FILE", id_file, 1);
    FILE *text = cli_bench_text ? cli_bench_text : stdout;   /* bench --json keeps stdout for its JSON */
    fprintf(text, "mode      %d processes, one per GPU, NCCL transport (NCCL_NVLS_ENABLE=0)\n", N);
    fflush(text);
    char **cargv = calloc((size_t)argc + 2, sizeof *cargv);
    pid_t pids[64];
    int started = 0, failed = 0;
    if (!cargv) {
        fprintf(stderr, "nvfp4moe %s: out of memory\n", what);
        rmdir(dir);
        return CLI_EXIT_FAILURE;
    }
    cargv[0] = "nvfp4moe";
    for (int i = 0; i < argc; i++) cargv[i + 1] = argv[i];
    for (; started < N && started < 64; started++) {
        pid_t pid = fork();
        if (pid < 0) break;
        if (pid == 0) {
            char rk[16];
            snprintf(rk, sizeof rk, "%d", started);
            setenv("NVFP4MOE_EP_RANK", rk, 1);
            execv("/proc/self/exe", cargv);
            fprintf(stderr, "nvfp4moe %s: rank %d: exec failed: %s\n", what, started, strerror(errno));
            _exit(127);
        }
        pids[started] = pid;
    }
    if (started < N) fprintf(stderr, "nvfp4moe %s: could only start %d of %d ranks\n", what, started, N);
    /* A rank that could not start leaves the others waiting for the NCCL id or the group; they
     * give up after their 120 s id timeout or when NCCL reports the missing peer. */
    for (int i = 0; i < started; i++) {
        int status = 0;
        if (waitpid(pids[i], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
    }
    free(cargv);
    unlink(id_file);
    rmdir(dir);
    if (failed || started < N) {
        fprintf(stderr, "nvfp4moe %s: %d of %d ranks failed\n", what, failed + (N - started), N);
        return CLI_EXIT_FAILURE;
    }
    return CLI_EXIT_OK;
}

static const char *explicit_backend(const nvfp4moe_config *cfg) {
    return strcmp(cfg->moe_backend, "auto") ? cfg->moe_backend : NULL;
}

int cli_run_ep(const nvfp4moe_config *cfg, const nvfp4moe_weights *w, long long tokens, const nvfp4moe_device *dev,
               bool device_given, int argc, char **argv) {
    const int32_t N = cfg->parallel.ep_size;
    if (N > 64) {
        fprintf(stderr, "nvfp4moe run: --ep %d: at most 64 ranks\n", N);
        return CLI_EXIT_FAILURE;
    }
    ep_run r = {.cfg = cfg, .w = w, .tokens = tokens, .dev = dev, .local_backend = explicit_backend(cfg)};
    printf("parallel  ep_size=%d dp_size=%d all2all=%s -> %s activation format\n", N, cfg->parallel.dp_size,
           cfg->parallel.all2all[0] ? cfg->parallel.all2all : "(none)",
           nvfp4moe_ep_format_name(nvfp4moe_ep_format_of(cfg)));

    const char *rank_env = getenv("NVFP4MOE_EP_RANK");
    if (rank_env) {   /* a rank process started by the launcher below */
        const char *id_file = getenv("NVFP4MOE_EP_ID_FILE");
        int rank = atoi(rank_env);
        nvfp4moe_ep_transport t;
        if (!id_file || rank < 0 || rank >= N) {
            fprintf(stderr, "nvfp4moe run: rank process: NVFP4MOE_EP_RANK=%s / NVFP4MOE_EP_ID_FILE=%s are not valid\n",
                    rank_env, id_file ? id_file : "(unset)");
            return CLI_EXIT_FAILURE;
        }
        r.per_gpu = true;
        nvfp4moe_status st = nvfp4moe_ep_nccl_create(N, rank, rank, id_file, &t);
        if (st == NVFP4MOE_OK) {
            st = one_rank(rank, &t, &r);
            t.destroy(t.ctx);
        }
        if (st != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe run: rank %d: %s\n", rank, nvfp4moe_last_error());
            return CLI_EXIT_FAILURE;
        }
        print_rank(&r, rank);
        return CLI_EXIT_OK;
    }

    if (!dev->is_cuda || device_given) {
        /* No GPU here (or a what-if device): simulate the ranks in this process. */
        nvfp4moe_report *rep = malloc(sizeof *rep);
        if (rep && nvfp4moe_select(cfg, dev, NULL, rep) != NVFP4MOE_OK && !r.local_backend)
            printf("oracle    no backend for this EP deployment on %s (%s); simulating with CPU_FAST\n", rep->device,
                   rep->error_kind);
        free(rep);
        if (!r.local_backend) r.local_backend = "cpu_fast";
        printf("mode      loopback simulation: %d ranks as threads of this process (no GPUs used), local experts "
               "on %s\n", N, r.local_backend);
        nvfp4moe_ep_loopback *lb = NULL;
        nvfp4moe_status st = nvfp4moe_ep_loopback_create(N, &lb);
        if (st == NVFP4MOE_OK) st = nvfp4moe_ep_loopback_run(lb, one_rank, &r);
        nvfp4moe_ep_loopback_free(lb);
        if (st != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe run: %s\n", nvfp4moe_last_error());
            return CLI_EXIT_FAILURE;
        }
        for (int32_t k = 0; k < N; k++) print_rank(&r, k);
        return CLI_EXIT_OK;
    }

    /* One process per GPU. */
    if (!nvfp4moe_built_with_nccl()) {
        fprintf(stderr, "nvfp4moe run: --ep %d needs the NCCL transport, and this build has none (nccl.h was not "
                        "found when it was built)\n", N);
        return CLI_EXIT_FAILURE;
    }
    const int gpus = cli_cuda_gpu_count();
    if (gpus < N) {
        fprintf(stderr, "nvfp4moe run: --ep %d needs %d GPUs, found %d\n", N, N, gpus);
        return CLI_EXIT_FAILURE;
    }
    return cli_launch_ranks("run", N, argc, argv);
}
