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

enum { O_TOKENS, O_MODEL, O_LAYER, O_INPUT, O_DEVICE, O_COUNT };
static const cli_opt k_opts[O_COUNT] = {
    [O_TOKENS] = {"--tokens", "M", "tokens to run (default 16)"},
    [O_MODEL] = {"--model", "DIR", "run a layer of this checkpoint (see nvfp4moe inspect); config\n"
                                   "flags then override its config.json"},
    [O_LAYER] = {"--layer", "N", "with --model: decoder layer (default: the first MoE layer)"},
    [O_INPUT] = {"--input", "FILE", "hidden states [M, H]: .safetensors or raw float32 (sets M)"},
    [O_DEVICE] = {"--device", "NAME", "run on this device: cpu, or the GPU of this machine (a GPU that is\n"
                                      "not here only plans: see nvfp4moe select --device)"},
};

static void run_usage(FILE *f, const cli_args *a) {
    fprintf(f, "usage: nvfp4moe run [flags]\n\n"
               "Runs one NVFP4 MoE layer on the best available backend (or --moe-backend) and prints the\n"
               "backend, the shapes, the time and a checksum of the output. With no flags: the MoE layer of\n"
               "Qwen3-30B-A3B (E=128, top-8, hidden 2048, intermediate 768), random weights, 16 tokens.\n\n");
    cli_opts_help(f, k_opts, O_COUNT);
    fprintf(f, "  -h, --help                this text\n\n"
               "With --ep N (N > 1): expert parallelism over N ranks, --tokens per rank. On a GPU machine one\n"
               "process per GPU over NCCL (needs N GPUs and an NCCL build); without a GPU (or with --device)\n"
               "N ranks simulated by threads of this process (loopback), local experts on CPU_FAST.\n\n");
    cli_config_flags_help(f, a);
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

/* The device to run on: detected, or --device, which must then be the CPU or this machine's GPU
 * (a what-if GPU only plans; `select` plans). EP runs keep a what-if device: they simulate. */
static int run_device(const char *name, bool ep, nvfp4moe_device *dev) {
    if (!name) {
        if (nvfp4moe_device_detect(dev) == NVFP4MOE_OK) return 0;
        fprintf(stderr, "nvfp4moe run: %s\n", nvfp4moe_last_error());
        return -1;
    }
    if (nvfp4moe_device_parse(name, dev) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe run: --device: %s\n", nvfp4moe_last_error());
        return -1;
    }
    if (!dev->is_cuda || ep) return 0;
    nvfp4moe_device here;
    if (nvfp4moe_device_detect(&here) != NVFP4MOE_OK || !here.is_cuda) {
        fprintf(stderr, "nvfp4moe run: --device %s: no GPU here: --device only plans (see select)%s\n", name,
                nvfp4moe_built_with_cuda() ? "" : "; this build has no CUDA backends either");
        return -1;
    }
    if (here.sm != dev->sm) {
        fprintf(stderr, "nvfp4moe run: --device %s (sm_%d) is not this machine's GPU (%s, sm_%d): --device only "
                "plans (see select)\n", name, (int)dev->sm, here.name, (int)here.sm);
        return -1;
    }
    *dev = here;   /* the GPU itself, with its ordinal and SM count */
    return 0;
}

int cmd_run(int argc, char **argv) {
    nvfp4moe_config cfg;
    nvfp4moe_config_init(&cfg);
    long long tokens = 16;
    const char *device_name = NULL;
    const char *model = NULL, *input = NULL;
    long long layer_n = -1;
    nvfp4moe_ckpt_layer *ck = NULL;
    float *xin = NULL;
    int64_t xin_m = 0;
    const char *v = NULL;
    cli_args args;
    cli_args_init(&args, "run", k_opts, O_COUNT, true, 0, argc, argv);
    for (int o; (o = cli_args_next(&args, &v)) != CLI_ARGS_END;) {
        switch (o) {
        case CLI_ARGS_HELP: run_usage(stdout, &args); return CLI_EXIT_OK;
        case CLI_ARGS_ERROR: return CLI_EXIT_FAILURE;
        case O_TOKENS:
            if (cli_parse_int("--tokens", v, 0, &tokens)) return CLI_EXIT_FAILURE;
            break;
        case O_DEVICE: device_name = v; break;
        case O_MODEL: model = v; break;
        case O_LAYER:
            if (cli_parse_int("--layer", v, 0, &layer_n)) return CLI_EXIT_FAILURE;
            break;
        case O_INPUT: input = v; break;
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
    const bool custom = model || args.ncfg > 0;
    if (model) {   /* the checkpoint's layer; config flags were applied on top of its config */
        if (cli_model_layer("run", model, (int)layer_n, &args, &ck) != 0) goto done;
        cfg = ck->layer.cfg;
    } else if (cli_config_apply(&args, &cfg) != 0) {
        goto done;
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
    if (run_device(device_name, cfg.parallel.ep_size > 1, &dev) != 0) goto done;
    if (cfg.parallel.ep_size <= 1) {   /* the oracle's answer before the weights are made */
        nvfp4moe_report *rep = malloc(sizeof *rep);
        if (!rep) {
            fprintf(stderr, "nvfp4moe run: out of memory\n");
            goto done;
        }
        const bool refused = nvfp4moe_select(&cfg, &dev, NULL, rep) != NVFP4MOE_OK && rep->error_kind[0];
        if (refused) {
            fprintf(stderr, "nvfp4moe run: no backend can run this layer: %s: %s\n", rep->error_kind, rep->error);
            if (rep->detail[0]) fprintf(stderr, "nvfp4moe run: note: %s\n", rep->detail);
        }
        free(rep);
        if (refused) goto done;
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
        float x;
        nvfp4moe_to_float(cfg.out_dtype, (const char *)out + (size_t)i * nvfp4moe_dtype_size(cfg.out_dtype), 1, &x);
        sum += x;
        asum += fabs(x);
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
