/*
 * cmd_run.c - `nvfp4moe run`: builds a layer (the built-in default, the shape the flags give, or a
 * checkpoint's), runs hidden states through it on the backend the oracle picks (or --moe-backend),
 * and prints the backend, shapes, time and an output checksum, as text or one JSON object. The
 * inputs are random unless given as files (hidden states, router logits, or the top-k ids and
 * weights themselves); --output writes the output, and with .safetensors the inputs it saw, so
 * that another run (another backend, another engine) can be fed the same and `compare`d.
 */
#include "cli.h"
#include "cli_ep.h"
#include "cli_model.h"
#include "cli_tensor.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef NVFP4MOE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

enum { O_TOKENS, O_MODEL, O_LAYER, O_INPUT, O_ROUTER_LOGITS, O_TOPK_IDS, O_TOPK_WEIGHTS, O_OUTPUT, O_DEVICE, O_JSON,
       O_COUNT };
static const cli_opt k_opts[O_COUNT] = {
    [O_TOKENS] = {"--tokens", "M", "tokens to run (default 16; input files set it)"},
    [O_MODEL] = {"--model", "DIR", "run a layer of this checkpoint (see nvfp4moe inspect); config\n"
                                   "flags then override its config.json"},
    [O_LAYER] = {"--layer", "N", "with --model: decoder layer (default: the first MoE layer)"},
    [O_INPUT] = {"--input", "FILE", "hidden states [M, H]: tensor \"hidden_states\" of a .safetensors\n"
                                    "file, or raw float32"},
    [O_ROUTER_LOGITS] = {"--router-logits", "FILE", "router logits [M, E] instead of random ones (or the\n"
                                                    "checkpoint's router): tensor \"router_logits\", or raw float32"},
    [O_TOPK_IDS] = {"--topk-ids", "FILE", "the routing itself, with --topk-weights: expert ids [M, top_k]\n"
                                          "(tensor \"topk_ids\", I32 or I64; raw int32)"},
    [O_TOPK_WEIGHTS] = {"--topk-weights", "FILE", "their weights [M, top_k] (tensor \"topk_weights\"; raw float32)"},
    [O_OUTPUT] = {"--output", "FILE", "write the output [M, H]. FILE.safetensors: tensors output,\n"
                                      "hidden_states and the routing used (router_logits, or topk_ids\n"
                                      "and topk_weights), the backend in its metadata; any other name:\n"
                                      "the raw output, little-endian --dtype values, row-major.\n"
                                      "Missing folders are created"},
    [O_DEVICE] = {"--device", "NAME", "run on this device: cpu, or the GPU of this machine (a GPU that is\n"
                                      "not here only plans: see nvfp4moe select --device)"},
    [O_JSON] = {"--json", NULL, "print one JSON object instead of text"},
};

static void run_usage(FILE *f, const cli_args *a) {
    fprintf(f, "usage: nvfp4moe run [flags]\n\n"
               "Runs one NVFP4 MoE layer on the best available backend (or --moe-backend) and prints the\n"
               "backend, the shapes, the time and a checksum of the output. With no flags: the MoE layer of\n"
               "Qwen3-30B-A3B (E=128, top-8, hidden 2048, intermediate 768), random weights, 16 tokens.\n"
               "Input files are .safetensors (\"FILE.safetensors:NAME\" picks a tensor by name; a file\n"
               "with one tensor of the right rank needs no name) or raw little-endian values; a run's\n"
               "--output .safetensors file feeds --input and --router-logits of another run, and\n"
               "nvfp4moe compare compares two outputs.\n\n");
    cli_opts_help(f, k_opts, O_COUNT);
    fprintf(f, "  -h, --help                this text\n\n"
               "With --ep N (N > 1): expert parallelism over N ranks, --tokens per rank, each rank's tokens\n"
               "random (the file flags and --json do not apply). On a GPU machine one process per GPU over\n"
               "NCCL (needs N GPUs and an NCCL build); without a GPU (or with --device) N ranks simulated by\n"
               "threads of this process (loopback), local experts on CPU_FAST.\n\n");
    cli_config_flags_help(f, a);
}

#ifdef NVFP4MOE_HAVE_CUDA
/* Runs a device plan: copies the inputs to the GPU, runs, copies the output back. */
static int forward_on_device(nvfp4moe_plan *plan, const nvfp4moe_io *host, size_t hidden_bytes,
                             size_t logits_bytes, size_t out_bytes, size_t topk_bytes, double *seconds) {
    void *d_hidden = NULL, *d_logits = NULL, *d_out = NULL, *d_ws = NULL, *d_ids = NULL, *d_wts = NULL;
    size_t ws = nvfp4moe_plan_workspace_size(plan, host->num_tokens);
    int rc = CLI_EXIT_FAILURE;
    cudaError_t e = cudaSuccess;
    if ((e = cudaMalloc(&d_hidden, hidden_bytes ? hidden_bytes : 1)) != cudaSuccess ||
        (e = cudaMalloc(&d_out, out_bytes ? out_bytes : 1)) != cudaSuccess ||
        (ws && (e = cudaMalloc(&d_ws, ws)) != cudaSuccess) ||
        (e = cudaMemcpy(d_hidden, host->hidden, hidden_bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
        fprintf(stderr, "nvfp4moe run: CUDA: %s\n", cudaGetErrorString(e));
        goto out;
    }
    if (host->router_logits &&
        ((e = cudaMalloc(&d_logits, logits_bytes ? logits_bytes : 1)) != cudaSuccess ||
         (e = cudaMemcpy(d_logits, host->router_logits, logits_bytes, cudaMemcpyHostToDevice)) != cudaSuccess)) {
        fprintf(stderr, "nvfp4moe run: CUDA: %s\n", cudaGetErrorString(e));
        goto out;
    }
    if (host->topk_ids &&
        ((e = cudaMalloc(&d_ids, topk_bytes ? topk_bytes : 1)) != cudaSuccess ||
         (e = cudaMalloc(&d_wts, topk_bytes ? topk_bytes : 1)) != cudaSuccess ||
         (e = cudaMemcpy(d_ids, host->topk_ids, topk_bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
         (e = cudaMemcpy(d_wts, host->topk_weights, topk_bytes, cudaMemcpyHostToDevice)) != cudaSuccess)) {
        fprintf(stderr, "nvfp4moe run: CUDA: %s\n", cudaGetErrorString(e));
        goto out;
    }
    nvfp4moe_io io = *host;
    io.hidden = d_hidden;
    io.router_logits = d_logits;
    io.topk_ids = d_ids;
    io.topk_weights = d_wts;
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
    cudaFree(d_hidden); cudaFree(d_logits); cudaFree(d_out); cudaFree(d_ws); cudaFree(d_ids); cudaFree(d_wts);
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

/* What a file flag gave: the tensor and its flag. */
typedef struct {
    const char *flag, *spec;
    cli_tensor t;
    bool loaded;
} file_input;

/* Rows agree across the input files (and --tokens when it was given): *m is set from the first. */
static int agree_rows(file_input *const *in, int n, long long tokens, bool tokens_given, int64_t *m) {
    const file_input *first = NULL;
    for (int i = 0; i < n; i++) {
        if (!in[i]->loaded) continue;
        const int64_t rows = in[i]->t.shape[0];
        if (!first) {
            first = in[i];
            *m = rows;
            if (tokens_given && rows != tokens) {
                fprintf(stderr, "nvfp4moe run: --tokens %lld disagrees with %s %s, which holds %lld tokens\n", tokens,
                        first->flag, first->spec, (long long)rows);
                return -1;
            }
        } else if (rows != *m) {
            fprintf(stderr, "nvfp4moe run: %s %s holds %lld tokens but %s %s holds %lld\n", in[i]->flag, in[i]->spec,
                    (long long)rows, first->flag, first->spec, (long long)*m);
            return -1;
        }
    }
    return 0;
}

/* Writes the output (and, to a .safetensors file, the inputs the layer saw). */
static int write_output(const char *path, const nvfp4moe_config *cfg, int64_t M, const void *hidden,
                        const void *logits, const int32_t *ids, const float *wts, const void *out,
                        const nvfp4moe_plan *plan, const nvfp4moe_device *dev, const char *model, int layer) {
    if (cli_make_parent_dirs("--output", path) != 0) return -1;
    const int64_t H = cfg->hidden_size, E = cfg->num_experts, K = cfg->top_k;
    const size_t n = strlen(path);
    if (n < 12 || strcmp(path + n - 12, ".safetensors")) {
        FILE *f = fopen(path, "wb");
        const size_t bytes = (size_t)(M * H) * nvfp4moe_dtype_size(cfg->out_dtype);
        bool ok = f && (bytes == 0 || fwrite(out, 1, bytes, f) == bytes);
        if (f && fclose(f) != 0) ok = false;
        if (!ok) {
            fprintf(stderr, "nvfp4moe run: --output %s: cannot write the file\n", path);
            return -1;
        }
        return 0;
    }
    nvfp4moe_st_writer *w = NULL;
    char desc[256], dbuf[32], lay[16];
    nvfp4moe_config_describe(cfg, desc, sizeof desc);
    snprintf(lay, sizeof lay, "%d", layer);
    const int64_t shape_mh[2] = {M, H}, shape_me[2] = {M, E}, shape_mk[2] = {M, K};
    nvfp4moe_status st = nvfp4moe_st_writer_create(&w);
    if (st == NVFP4MOE_OK) st = nvfp4moe_st_writer_add(w, "output", cli_st_dtype(cfg->out_dtype), 2, shape_mh, out);
    if (st == NVFP4MOE_OK)
        st = nvfp4moe_st_writer_add(w, "hidden_states", cli_st_dtype(cfg->in_dtype), 2, shape_mh, hidden);
    if (st == NVFP4MOE_OK && ids) st = nvfp4moe_st_writer_add(w, "topk_ids", NVFP4MOE_ST_I32, 2, shape_mk, ids);
    if (st == NVFP4MOE_OK && ids) st = nvfp4moe_st_writer_add(w, "topk_weights", NVFP4MOE_ST_F32, 2, shape_mk, wts);
    if (st == NVFP4MOE_OK && logits)
        st = nvfp4moe_st_writer_add(w, "router_logits", cli_st_dtype(cfg->router_logits_dtype), 2, shape_me, logits);
    const char *meta[][2] = {
        {"format", "pt"},
        {"producer", "nvfp4moe run"},
        {"version", nvfp4moe_version()},
        {"backend", nvfp4moe_plan_backend(plan)},
        {"kernel", nvfp4moe_plan_kernel(plan)},
        {"numerics", nvfp4moe_scheme_name(nvfp4moe_plan_effective_scheme(plan))},
        {"device", nvfp4moe_device_str(dev, dbuf, sizeof dbuf)},
        {"config", desc},
        {"model", model},
        {"layer", model ? lay : NULL},
    };
    for (size_t i = 0; st == NVFP4MOE_OK && i < sizeof meta / sizeof meta[0]; i++)
        if (meta[i][1]) st = nvfp4moe_st_writer_set_metadata(w, meta[i][0], meta[i][1]);
    if (st == NVFP4MOE_OK) st = nvfp4moe_st_writer_save(w, path);
    nvfp4moe_st_writer_free(w);
    if (st != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe run: --output %s: %s\n", path, nvfp4moe_last_error());
        return -1;
    }
    return 0;
}

/* The routing files, checked: ids in [0, E), weights finite; as the io wants them. */
static int routing_from_files(const file_input *fid, const file_input *fw, int64_t M, int64_t E, int64_t K,
                              int32_t **ids, float **wts) {
    char where[1400];
    *ids = malloc(sizeof(int32_t) * (size_t)(M * K) + 1);
    *wts = malloc(sizeof(float) * (size_t)(M * K) + 1);
    if (!*ids || !*wts) {
        fprintf(stderr, "nvfp4moe run: out of memory for %lld tokens\n", (long long)M);
        return -1;
    }
    for (int64_t i = 0; i < M * K; i++) {
        const int64_t id = fid->t.i[i];
        if (id < 0 || id >= E) {
            fprintf(stderr, "nvfp4moe run: --topk-ids: %s: [%lld][%lld] = %lld is not an expert in [0, %lld)\n",
                    cli_tensor_where(&fid->t, where, sizeof where), (long long)(i / K), (long long)(i % K),
                    (long long)id, (long long)E);
            return -1;
        }
        if (!isfinite(fw->t.f[i])) {
            fprintf(stderr, "nvfp4moe run: --topk-weights: %s: [%lld][%lld] = %g is not finite\n",
                    cli_tensor_where(&fw->t, where, sizeof where), (long long)(i / K), (long long)(i % K),
                    (double)fw->t.f[i]);
            return -1;
        }
        (*ids)[i] = (int32_t)id;
        (*wts)[i] = fw->t.f[i];
    }
    return 0;
}

int cmd_run(int argc, char **argv) {
    nvfp4moe_config cfg;
    nvfp4moe_config_init(&cfg);
    long long tokens = 16, layer_n = -1;
    bool tokens_given = false, json = false;
    const char *device_name = NULL, *model = NULL, *output = NULL, *v = NULL;
    file_input fin = {.flag = "--input"}, flog = {.flag = "--router-logits"}, fid = {.flag = "--topk-ids"},
               fw = {.flag = "--topk-weights"};
    cli_args args;
    cli_args_init(&args, "run", k_opts, O_COUNT, true, 0, argc, argv);
    for (int o; (o = cli_args_next(&args, &v)) != CLI_ARGS_END;) {
        switch (o) {
        case CLI_ARGS_HELP: run_usage(stdout, &args); return CLI_EXIT_OK;
        case CLI_ARGS_ERROR: return CLI_EXIT_FAILURE;
        case O_TOKENS:
            if (cli_parse_int("--tokens", v, 0, &tokens)) return CLI_EXIT_FAILURE;
            tokens_given = true;
            break;
        case O_DEVICE: device_name = v; break;
        case O_MODEL: model = v; break;
        case O_LAYER:
            if (cli_parse_int("--layer", v, 0, &layer_n)) return CLI_EXIT_FAILURE;
            break;
        case O_INPUT: fin.spec = v; break;
        case O_ROUTER_LOGITS: flog.spec = v; break;
        case O_TOPK_IDS: fid.spec = v; break;
        case O_TOPK_WEIGHTS: fw.spec = v; break;
        case O_OUTPUT: output = v; break;
        case O_JSON: json = true; break;
        }
    }
    if (layer_n >= 0 && !model) {
        fprintf(stderr, "nvfp4moe run: --layer needs --model DIR\n");
        return CLI_EXIT_FAILURE;
    }
    if (!fid.spec != !fw.spec) {
        fprintf(stderr, "nvfp4moe run: %s needs %s too: the routing is the ids and their weights\n",
                fid.spec ? "--topk-ids" : "--topk-weights", fid.spec ? "--topk-weights" : "--topk-ids");
        return CLI_EXIT_FAILURE;
    }
    if (fid.spec && flog.spec) {
        fprintf(stderr, "nvfp4moe run: --router-logits and --topk-ids both give the routing: pass one of them\n");
        return CLI_EXIT_FAILURE;
    }
    // From here on every failure goes through `done`, which frees what was loaded.
    int rc = CLI_EXIT_FAILURE;
    nvfp4moe_ckpt_layer *ck = NULL;
    nvfp4moe_layer *layer = NULL;
    nvfp4moe_plan *plan = NULL;
    void *hidden = NULL, *logits = NULL, *out = NULL;
    int32_t *ids = NULL;
    float *wts = NULL;
    json_t *jr = NULL;
    nvfp4moe_status st;
    const bool custom = model || args.ncfg > 0;
    if (model) {   /* the checkpoint's layer; config flags were applied on top of its config */
        if (cli_model_layer("run", model, (int)layer_n, &args, &ck) != 0) goto done;
        cfg = ck->layer.cfg;
    } else if (cli_config_apply(&args, &cfg) != 0) {
        goto done;
    }
    // Before anything is sized from the config (the input files' rows are hidden_size wide).
    if (nvfp4moe_config_validate(&cfg) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe run: bad config: %s\n", nvfp4moe_last_error());
        goto done;
    }
    const bool ep = cfg.parallel.ep_size > 1;
    if (ep && (output || flog.spec || fid.spec || json)) {
        fprintf(stderr, "nvfp4moe run: %s does not apply with --ep (each rank makes its own tokens and prints its "
                "own line)\n", output ? "--output" : flog.spec ? "--router-logits" : fid.spec ? "--topk-ids" : "--json");
        goto done;
    }
    if (flog.spec && cfg.routing == NVFP4MOE_ROUTING_SIMULATED) {
        fprintf(stderr, "nvfp4moe run: --router-logits: the simulated routing reads no router logits (pass "
                "--topk-ids / --topk-weights, or another --routing)\n");
        goto done;
    }
    const int64_t E = cfg.num_experts, H = cfg.hidden_size, I = cfg.intermediate_size, K = cfg.top_k,
                  N1 = nvfp4moe_config_n1(&cfg);
    if (fin.spec && !ep) {
        if (cli_tensor_read("--input", fin.spec, "hidden_states", 2, H, CLI_TENSOR_FLOAT, NVFP4MOE_ST_F32, &fin.t) != 0)
            goto done;
        fin.loaded = true;
        if (cli_tensor_expect_2d(&fin.t, "--input", -1, H, "[M, hidden_size] with hidden_size from the config") != 0)
            goto done;
    }
    if (flog.spec) {
        if (cli_tensor_read("--router-logits", flog.spec, "router_logits", 2, E, CLI_TENSOR_FLOAT, NVFP4MOE_ST_F32,
                            &flog.t) != 0)
            goto done;
        flog.loaded = true;
        if (cli_tensor_expect_2d(&flog.t, "--router-logits", -1, E, "[M, num_experts]") != 0) goto done;
    }
    if (fid.spec) {
        if (cli_tensor_read("--topk-ids", fid.spec, "topk_ids", 2, K, CLI_TENSOR_INT, NVFP4MOE_ST_I32, &fid.t) != 0 ||
            (fid.loaded = true, cli_tensor_expect_2d(&fid.t, "--topk-ids", -1, K, "[M, top_k]") != 0))
            goto done;
        if (cli_tensor_read("--topk-weights", fw.spec, "topk_weights", 2, K, CLI_TENSOR_FLOAT, NVFP4MOE_ST_F32,
                            &fw.t) != 0 ||
            (fw.loaded = true, cli_tensor_expect_2d(&fw.t, "--topk-weights", -1, K, "[M, top_k]") != 0))
            goto done;
    }
    int64_t M = tokens;
    {
        file_input *const files[] = {&fin, &flog, &fid, &fw};
        if (agree_rows(files, 4, tokens, tokens_given, &M) != 0) goto done;
    }
    if (fid.loaded && routing_from_files(&fid, &fw, M, E, K, &ids, &wts) != 0) goto done;
    nvfp4moe_device dev;
    if (run_device(device_name, ep, &dev) != 0) goto done;
    if (!ep) {   /* the oracle's answer before the weights are made: an unknown or unfit backend fails now */
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
    const char *routing = fid.loaded              ? "top-k ids and weights from --topk-ids / --topk-weights"
                          : flog.loaded           ? "router logits from --router-logits"
                          : cfg.routing == NVFP4MOE_ROUTING_SIMULATED ? "simulated (seeded)"
                          : ck && ck->router && !ep ? "router logits from the checkpoint's router"
                                                    : "random router logits";
    if (!json) printf("layer     %s%s\n", custom ? "" : "Qwen3-30B-A3B MoE layer (built-in default): ", desc);
    double t0 = cli_now_s();
    const nvfp4moe_weights *weights = ck ? &ck->layer.w : NULL;
    if (ck) {
        if (!json)
            printf("weights   %s layer %d (%s checkpoint)%s\n", model, ck->index, nvfp4moe_ckpt_format_name(ck->format),
                   ep                   ? ", random router logits per rank (--ep does not apply the checkpoint's router)"
                   : flog.loaded || fid.loaded ? ", routing from the files given (the checkpoint's router is not used)"
                   : !ck->router        ? ", no router weight: random router logits"
                   : ck->router_bias    ? ", router from the checkpoint (weight and bias)"
                                        : ", router from the checkpoint");
    } else if ((st = nvfp4moe_layer_random(&cfg, cfg.seed, &layer)) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe run: building the layer failed: %s\n", nvfp4moe_last_error());
        goto done;
    }
    double mb = (double)E * (double)(N1 * H + H * I) * (0.5 + 1.0 / 16) / 1e6;
    if (!ck) {
        weights = &layer->w;
        if (!json)
            printf("weights   random bf16 -> NVFP4 (seed %llu): %.1f MB, made in %.2f s\n",
                   (unsigned long long)cfg.seed, mb, cli_now_s() - t0);
    }

    if (ep) {   /* --ep N: expert parallelism (tools/cmd_run_ep.c) */
        if (fin.spec) fprintf(stderr, "nvfp4moe run: --input is not used with --ep (each rank makes its own tokens)\n");
        rc = cli_run_ep(&cfg, weights, tokens, &dev, device_name != NULL, argc, argv);
        goto done;
    }
    nvfp4moe_plan_options po = {.device = &dev};
    if ((st = nvfp4moe_plan_create(&cfg, weights, &po, &plan)) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe run: no backend can run this layer: %s\n", nvfp4moe_last_error());
        goto done;
    }
    char dbuf[32];
    if (!json) {
        printf("device    %s (%s)\n", nvfp4moe_device_str(&dev, dbuf, sizeof dbuf), dev.name);
        printf("backend   %s (%s), numerics %s\n", nvfp4moe_plan_backend(plan), nvfp4moe_plan_kernel(plan),
               nvfp4moe_scheme_name(nvfp4moe_plan_effective_scheme(plan)));
    }

    size_t hidden_bytes = (size_t)(M * H) * nvfp4moe_dtype_size(cfg.in_dtype), out_bytes = (size_t)(M * H) * nvfp4moe_dtype_size(cfg.out_dtype);
    size_t logits_bytes = (size_t)(M * E) * nvfp4moe_dtype_size(cfg.router_logits_dtype);
    hidden = malloc(hidden_bytes + 1), logits = malloc(logits_bytes + 1), out = malloc(out_bytes + 1);
    if (!hidden || !logits || !out) {
        fprintf(stderr, "nvfp4moe run: out of memory for %lld tokens\n", (long long)M);
        goto done;
    }
    if (fin.loaded) nvfp4moe_from_float(cfg.in_dtype, fin.t.f, M * H, hidden);
    else nvfp4moe_fill_normal(hidden, cfg.in_dtype, M * H, cfg.seed * 31 + 7);
    /* the router logits, unless the routing is given as ids and weights (routing_from_files above) */
    if (flog.loaded) {
        nvfp4moe_from_float(cfg.router_logits_dtype, flog.t.f, M * E, logits);
    } else if (!fid.loaded && ck && ck->router) {   /* logits = hidden (as the layer sees it) @ router^T (+ router bias) */
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
    } else if (!fid.loaded) {
        nvfp4moe_fill_normal(logits, cfg.router_logits_dtype, M * E, cfg.seed * 31 + 11);
    }
    nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = ids ? NULL : logits, .topk_ids = ids,
                      .topk_weights = wts, .output = out};
    double secs = 0;
    if (nvfp4moe_plan_uses_device_memory(plan)) {
#ifdef NVFP4MOE_HAVE_CUDA
        if (forward_on_device(plan, &io, hidden_bytes, logits_bytes, out_bytes, sizeof(int32_t) * (size_t)(M * K),
                              &secs) != CLI_EXIT_OK)
            goto done;
#endif
    } else {
        t0 = cli_now_s();
        if ((st = nvfp4moe_plan_forward(plan, &io, NULL)) != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe run: forward failed: %s\n", nvfp4moe_last_error());
            goto done;
        }
        secs = cli_now_s() - t0;
    }
    double sum = 0, asum = 0;
    for (int64_t i = 0; i < M * H; i++) {
        float x;
        nvfp4moe_to_float(cfg.out_dtype, (const char *)out + (size_t)i * nvfp4moe_dtype_size(cfg.out_dtype), 1, &x);
        sum += x;
        asum += fabs(x);
    }
    const unsigned long long fnv = (unsigned long long)cli_fnv1a(out, out_bytes, CLI_FNV1A_INIT);
    /* the logits are written only when the layer read them */
    const bool used_logits = !ids && cfg.routing != NVFP4MOE_ROUTING_SIMULATED;
    if (output && write_output(output, &cfg, M, hidden, used_logits ? logits : NULL, ids, wts, out, plan, &dev, model,
                               ck ? ck->index : -1) != 0)
        goto done;
    if (!json) {
        if (fin.loaded) printf("input     hidden states from %s\n", fin.spec);
        if (flog.loaded || fid.loaded) printf("routing   %s (%s)\n", routing, flog.loaded ? flog.spec : fid.spec);
        printf("tokens    %lld: hidden [%lld, %lld] %s -> output [%lld, %lld] %s\n", (long long)M, (long long)M,
               (long long)H, nvfp4moe_dtype_name(cfg.in_dtype), (long long)M, (long long)H,
               nvfp4moe_dtype_name(cfg.out_dtype));
        printf("forward   %.3f ms\n", secs * 1e3);
        printf("checksum  sum=%.6g abs_sum=%.6g fnv1a=%016llx\n", sum, asum, fnv);
        if (output) printf("output    wrote %s\n", output);
        rc = CLI_EXIT_OK;
        goto done;
    }
    {
        char hex[20];
        snprintf(hex, sizeof hex, "%016llx", fnv);
        jr = json_object();
        json_t *lj = json_object(), *wj = json_object(), *dj = json_object(), *ij = json_object(),
               *cj = json_object();
        json_object_set_new(lj, "config", json_string(desc));
        json_object_set_new(lj, "built_in_default", json_boolean(!custom));
        json_object_set_new(lj, "model", model ? json_string(model) : json_null());
        json_object_set_new(lj, "index", ck ? json_integer(ck->index) : json_null());
        json_object_set_new(lj, "format", ck ? json_string(nvfp4moe_ckpt_format_name(ck->format)) : json_null());
        json_object_set_new(jr, "layer", lj);
        json_object_set_new(wj, "source", json_string(ck ? "checkpoint" : "random"));
        json_object_set_new(wj, "seed", ck ? json_null() : json_integer((json_int_t)cfg.seed));
        json_object_set_new(wj, "megabytes", json_real(mb));
        json_object_set_new(jr, "weights", wj);
        json_object_set_new(dj, "name", json_string(dev.name));
        json_object_set_new(dj, "target", json_string(nvfp4moe_device_str(&dev, dbuf, sizeof dbuf)));
        json_object_set_new(jr, "device", dj);
        json_object_set_new(jr, "backend", json_string(nvfp4moe_plan_backend(plan)));
        json_object_set_new(jr, "kernel", json_string(nvfp4moe_plan_kernel(plan)));
        json_object_set_new(jr, "numerics", json_string(nvfp4moe_scheme_name(nvfp4moe_plan_effective_scheme(plan))));
        json_object_set_new(jr, "tokens", json_integer(M));
        json_object_set_new(jr, "hidden_size", json_integer(H));
        json_object_set_new(jr, "in_dtype", json_string(nvfp4moe_dtype_name(cfg.in_dtype)));
        json_object_set_new(jr, "out_dtype", json_string(nvfp4moe_dtype_name(cfg.out_dtype)));
        json_object_set_new(ij, "hidden_states", fin.loaded ? json_string(fin.spec) : json_string("random"));
        json_object_set_new(ij, "routing", json_string(routing));
        json_object_set_new(ij, "routing_file", flog.loaded ? json_string(flog.spec)
                                                : fid.loaded ? json_string(fid.spec) : json_null());
        json_object_set_new(jr, "inputs", ij);
        json_object_set_new(jr, "forward_ms", json_real(secs * 1e3));
        json_object_set_new(cj, "sum", json_real(sum));
        json_object_set_new(cj, "abs_sum", json_real(asum));
        json_object_set_new(cj, "fnv1a", json_string(hex));
        json_object_set_new(jr, "checksum", cj);
        json_object_set_new(jr, "output", output ? json_string(output) : json_null());
        char *s = json_dumps(jr, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
        if (!s) {
            fprintf(stderr, "nvfp4moe run: out of memory\n");
            goto done;
        }
        printf("%s\n", s);
        free(s);
    }
    rc = CLI_EXIT_OK;
done:
    json_decref(jr);
    free(hidden); free(logits); free(out); free(ids); free(wts);
    cli_tensor_free(&fin.t); cli_tensor_free(&flog.t); cli_tensor_free(&fid.t); cli_tensor_free(&fw.t);
    nvfp4moe_plan_destroy(plan);
    nvfp4moe_layer_free(layer);
    nvfp4moe_ckpt_layer_free(ck);
    return rc;
}
