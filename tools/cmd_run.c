/*
 * cmd_run.c - `nvfp4moe run`: builds a layer (the built-in default, or the shape the flags give),
 * with random BF16 weights quantized to NVFP4, runs random hidden states through it on the backend
 * the oracle picks (or --moe-backend), and prints the backend, shapes, time and an output checksum.
 */
#include "cli.h"
#include "cli_ep.h"
#include "cli_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef NVFP4MOE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static void run_usage(FILE *f) {
    fprintf(f, "usage: nvfp4moe run [flags]\n\n"
               "Runs one NVFP4 MoE layer on the best available backend (or --moe-backend) and prints the\n"
               "backend, the shapes, the time and a checksum of the output. With no flags: the MoE layer of\n"
               "Qwen3-30B-A3B (E=128, top-8, hidden 2048, intermediate 768), random weights, 16 tokens.\n\n"
               "  --tokens M                tokens to run (default 16)\n"
               "  --model DIR               run a layer of this checkpoint (see nvfp4moe inspect); config\n"
               "                            flags then override its config.json\n"
               "  --layer N                 with --model: decoder layer (default: the first MoE layer)\n"
               "  --input FILE              hidden states [M, H]: .safetensors or raw float32 (sets M)\n"
               "  --device NAME             plan for this device (default: detect; see nvfp4moe select --help)\n\n"
               "With --ep N (N > 1): expert parallelism over N ranks, --tokens per rank. On a GPU machine one\n"
               "process per GPU over NCCL (needs N GPUs and an NCCL build); without a GPU (or with --device)\n"
               "N ranks simulated by threads of this process (loopback), local experts on CPU_FAST.\n\n");
    cli_config_flags_help(f);
}

#ifdef NVFP4MOE_HAVE_CUDA
/* Runs a device plan: copies the inputs to the GPU, runs, copies the output back. */
static int forward_on_device(nvfp4moe_plan *plan, const nvfp4moe_io *host, size_t hidden_bytes,
                             size_t logits_bytes, size_t out_bytes, double *seconds) {
    void *d_hidden = NULL, *d_logits = NULL, *d_out = NULL, *d_ws = NULL;
    size_t ws = nvfp4moe_plan_workspace_size(plan, host->num_tokens);
    int rc = CLI_EXIT_FAILURE;
    cudaError_t e = cudaSuccess;
    if ((e = cudaMalloc(&d_hidden, hidden_bytes ? hidden_bytes : 1)) != cudaSuccess ||
        (e = cudaMalloc(&d_logits, logits_bytes ? logits_bytes : 1)) != cudaSuccess ||
        (e = cudaMalloc(&d_out, out_bytes ? out_bytes : 1)) != cudaSuccess ||
        (ws && (e = cudaMalloc(&d_ws, ws)) != cudaSuccess) ||
        (e = cudaMemcpy(d_hidden, host->hidden, hidden_bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMemcpy(d_logits, host->router_logits, logits_bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
        fprintf(stderr, "nvfp4moe run: CUDA: %s\n", cudaGetErrorString(e));
        goto out;
    }
    nvfp4moe_io io = *host;
    io.hidden = d_hidden;
    io.router_logits = d_logits;
    io.output = d_out;
    io.workspace = d_ws;
    io.workspace_size = ws;
    /* The first forward loads the kernels; time the second one. */
    for (int rep = 0; rep < 2; rep++) {
        double t0 = cli_now_s();
        nvfp4moe_status st = nvfp4moe_plan_forward(plan, &io, NULL);
        if (st == NVFP4MOE_OK && (e = cudaDeviceSynchronize()) != cudaSuccess) st = NVFP4MOE_ERR_CUDA;
        if (st != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe run: forward failed: %s: %s\n", nvfp4moe_status_str(st),
                    e != cudaSuccess ? cudaGetErrorString(e) : nvfp4moe_last_error());
            goto out;
        }
        *seconds = cli_now_s() - t0;
    }
    if ((e = cudaMemcpy(host->output, d_out, out_bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) {
        fprintf(stderr, "nvfp4moe run: CUDA: %s\n", cudaGetErrorString(e));
        goto out;
    }
    rc = CLI_EXIT_OK;
out:
    cudaFree(d_hidden); cudaFree(d_logits); cudaFree(d_out); cudaFree(d_ws);
    return rc;
}
#endif

int cmd_run(int argc, char **argv) {
    nvfp4moe_config cfg;
    nvfp4moe_config_init(&cfg);
    long long tokens = 16;
    const char *device_name = NULL;
    bool custom = false;
    const char *model = NULL, *input = NULL;
    long long layer_n = -1;
    nvfp4moe_ckpt_layer *ck = NULL;
    float *xin = NULL;
    int64_t xin_m = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_config_flag(argc, argv, &i, &cfg);
        if (r < 0) return CLI_EXIT_FAILURE;
        if (r > 0) {
            custom = true;
            continue;
        }
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            run_usage(stdout);
            return CLI_EXIT_OK;
        } else if (!strcmp(a, "--tokens")) {
            if (!(v = cli_flag_value(argc, argv, &i)) || cli_parse_int(a, v, 0, &tokens)) return CLI_EXIT_FAILURE;
        } else if (!strcmp(a, "--device")) {
            if (!(device_name = cli_flag_value(argc, argv, &i))) return CLI_EXIT_FAILURE;
        } else if (!strcmp(a, "--model")) {
            if (!(model = cli_flag_value(argc, argv, &i))) return CLI_EXIT_FAILURE;
        } else if (!strcmp(a, "--layer")) {
            if (!(v = cli_flag_value(argc, argv, &i)) || cli_parse_int(a, v, 0, &layer_n)) return CLI_EXIT_FAILURE;
        } else if (!strcmp(a, "--input")) {
            if (!(input = cli_flag_value(argc, argv, &i))) return CLI_EXIT_FAILURE;
        } else {
            fprintf(stderr, "nvfp4moe run: unknown flag '%s' (try nvfp4moe run --help)\n", a);
            return CLI_EXIT_FAILURE;
        }
    }
    if (layer_n >= 0 && !model) {
        fprintf(stderr, "nvfp4moe run: --layer needs --model DIR\n");
        return CLI_EXIT_FAILURE;
    }
    // From here on every failure goes through `done`, which frees what was loaded.
    int rc = CLI_EXIT_FAILURE;
    nvfp4moe_layer *layer = NULL;
    nvfp4moe_plan *plan = NULL;
    void *hidden = NULL, *logits = NULL, *out = NULL;
    nvfp4moe_status st;
    if (model) {   /* the checkpoint's layer; config flags were applied on top of its config */
        if (cli_model_layer("run", model, (int)layer_n, argc, argv, &ck) != 0) goto done;
        cfg = ck->layer.cfg;
        custom = true;
    }
    // Before anything is sized from the config (the input file's rows are hidden_size wide).
    if (nvfp4moe_config_validate(&cfg) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe run: bad config: %s\n", nvfp4moe_last_error());
        goto done;
    }
    if (input) {
        if (cli_read_hidden("run", input, cfg.hidden_size, &xin, &xin_m) != 0) goto done;
        tokens = xin_m;
    }
    nvfp4moe_device dev;
    st = device_name ? nvfp4moe_device_parse(device_name, &dev) : nvfp4moe_device_detect(&dev);
    if (st != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe run: --device: %s\n", nvfp4moe_last_error());
        goto done;
    }

    char desc[256];
    nvfp4moe_config_describe(&cfg, desc, sizeof desc);
    printf("layer     %s%s\n", custom ? "" : "Qwen3-30B-A3B MoE layer (built-in default): ", desc);
    double t0 = cli_now_s();
    const nvfp4moe_weights *weights = ck ? &ck->layer.w : NULL;
    if (ck) {
        printf("weights   %s layer %d (%s checkpoint)%s\n", model, ck->index, nvfp4moe_ckpt_format_name(ck->format),
               cfg.parallel.ep_size > 1 ? ", random router logits per rank (--ep does not apply the checkpoint's router)"
               : !ck->router        ? ", no router weight: random router logits"
               : ck->router_bias ? ", router from the checkpoint (weight and bias)"
                                 : ", router from the checkpoint");
    } else if ((st = nvfp4moe_layer_random(&cfg, cfg.seed, &layer)) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe run: building the layer failed: %s\n", nvfp4moe_last_error());
        goto done;
    }
    const int64_t E = cfg.num_experts, H = cfg.hidden_size, I = cfg.intermediate_size, N1 = nvfp4moe_config_n1(&cfg);
    double mb = (double)E * (double)(N1 * H + H * I) * (0.5 + 1.0 / 16) / 1e6;
    if (!ck) {
        weights = &layer->w;
        printf("weights   random bf16 -> NVFP4 (seed %llu): %.1f MB, made in %.2f s\n", (unsigned long long)cfg.seed,
               mb, cli_now_s() - t0);
    }

    if (cfg.parallel.ep_size > 1) {   /* --ep N: expert parallelism (tools/cmd_run_ep.c) */
        if (xin) fprintf(stderr, "nvfp4moe run: --input is not used with --ep (each rank makes its own tokens)\n");
        rc = cli_run_ep(&cfg, weights, tokens, &dev, device_name != NULL, argc, argv);
        goto done;
    }
    nvfp4moe_plan_options po = {.device = &dev};
    if ((st = nvfp4moe_plan_create(&cfg, weights, &po, &plan)) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe run: no backend can run this layer: %s\n", nvfp4moe_last_error());
        goto done;
    }
    char dbuf[32];
    printf("device    %s (%s)\n", nvfp4moe_device_str(&dev, dbuf, sizeof dbuf), dev.name);
    printf("backend   %s (%s), numerics %s\n", nvfp4moe_plan_backend(plan), nvfp4moe_plan_kernel(plan),
           nvfp4moe_scheme_name(nvfp4moe_plan_effective_scheme(plan)));

    const int64_t M = tokens;
    size_t hidden_bytes = (size_t)(M * H) * nvfp4moe_dtype_size(cfg.in_dtype), out_bytes = (size_t)(M * H) * nvfp4moe_dtype_size(cfg.out_dtype);
    size_t logits_bytes = (size_t)(M * E) * nvfp4moe_dtype_size(cfg.router_logits_dtype);
    hidden = malloc(hidden_bytes + 1), logits = malloc(logits_bytes + 1), out = malloc(out_bytes + 1);
    if (!hidden || !logits || !out) {
        fprintf(stderr, "nvfp4moe run: out of memory for %lld tokens\n", (long long)M);
        goto done;
    }
    if (xin) nvfp4moe_from_float(cfg.in_dtype, xin, M * H, hidden);
    else nvfp4moe_fill_normal(hidden, cfg.in_dtype, M * H, cfg.seed * 31 + 7);
    if (ck && ck->router) {   /* logits = hidden (as the layer sees it) @ router^T (+ router bias) */
        float *xf = malloc(sizeof(float) * (size_t)(M * H) + 1), *lf = malloc(sizeof(float) * (size_t)(M * E) + 1);
        if (xf && lf) {
            nvfp4moe_to_float(cfg.in_dtype, hidden, M * H, xf);
            if ((st = nvfp4moe_ckpt_router_logits(ck, xf, M, lf)) != NVFP4MOE_OK) {
                fprintf(stderr, "nvfp4moe run: router logits: %s\n", nvfp4moe_last_error());
                free(xf);
                free(lf);
                goto done;
            }
            nvfp4moe_from_float(cfg.router_logits_dtype, lf, M * E, logits);
        }
        free(xf);
        free(lf);
        if (!xf || !lf) {
            fprintf(stderr, "nvfp4moe run: out of memory for %lld tokens\n", (long long)M);
            goto done;
        }
    } else {
        nvfp4moe_fill_normal(logits, cfg.router_logits_dtype, M * E, cfg.seed * 31 + 11);
    }
    nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits, .output = out};
    double secs = 0;
    if (nvfp4moe_plan_uses_device_memory(plan)) {
#ifdef NVFP4MOE_HAVE_CUDA
        if (forward_on_device(plan, &io, hidden_bytes, logits_bytes, out_bytes, &secs) != CLI_EXIT_OK) goto done;
#endif
    } else {
        t0 = cli_now_s();
        if ((st = nvfp4moe_plan_forward(plan, &io, NULL)) != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe run: forward failed: %s\n", nvfp4moe_last_error());
            goto done;
        }
        secs = cli_now_s() - t0;
    }
    printf("tokens    %lld: hidden [%lld, %lld] %s -> output [%lld, %lld] %s\n", (long long)M, (long long)M,
           (long long)H, nvfp4moe_dtype_name(cfg.in_dtype), (long long)M, (long long)H,
           nvfp4moe_dtype_name(cfg.out_dtype));
    printf("forward   %.3f ms\n", secs * 1e3);
    double sum = 0, asum = 0;
    for (int64_t i = 0; i < M * H; i++) {
        float v;
        nvfp4moe_to_float(cfg.out_dtype, (const char *)out + (size_t)i * nvfp4moe_dtype_size(cfg.out_dtype), 1, &v);
        sum += v;
        asum += fabs(v);
    }
    printf("checksum  sum=%.6g abs_sum=%.6g fnv1a=%016llx\n", sum, asum,
           (unsigned long long)cli_fnv1a(out, out_bytes, CLI_FNV1A_INIT));
    rc = CLI_EXIT_OK;
done:
    free(hidden); free(logits); free(out);
    nvfp4moe_plan_destroy(plan);
    nvfp4moe_layer_free(layer);
    nvfp4moe_ckpt_layer_free(ck);
    free(xin);
    return rc;
}
