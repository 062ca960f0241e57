/*
 * cmd_quantize.c - `nvfp4moe quantize`: writes an NVFP4 checkpoint (ModelOpt per-expert by
 * default; ModelOpt fused or compressed-tensors on request) from a BF16/F16/F32 safetensors model,
 * and, with --random, writes such a BF16 source model to start from. The output directory is one
 * transaction (cli_outdir.h).
 */
#include "cli_model.h"
#include "cli_outdir.h"

#include <stdlib.h>
#include <string.h>

enum { O_IN, O_OUT, O_FORCE, O_FORMAT, O_W4A16, O_LAYER, O_CALIB, O_RANDOM, O_NUM_LAYERS, O_FIRST_MOE, O_SEED,
       O_COUNT };
static const cli_opt k_opts[O_COUNT] = {
    [O_IN] = {"--in", "SRC", "unquantized model directory"},
    [O_OUT] = {"--out", "DIR", "output directory: missing or empty (refused if it is, or is inside,\n"
                               "--in); written beside it, fsynced, then renamed into place"},
    [O_FORCE] = {"--force", NULL, "replace a non-empty --out whole (nothing of it is kept)"},
    [O_FORMAT] = {"--format", "F", "modelopt (per-expert tensors, default) | modelopt-fused |\n"
                                   "compressed-tensors"},
    [O_W4A16] = {"--w4a16", NULL, "weight-only NVFP4 (W4A16_NVFP4; no input scales)"},
    [O_LAYER] = {"--layer", "N", "quantize only decoder layer N"},
    [O_CALIB] = {"--calib-tokens", "N", "calibration tokens for the input scales (default 64)"},
    [O_RANDOM] = {"--random", NULL, "write a random BF16 source model instead"},
    [O_NUM_LAYERS] = {"--num-layers", "L", "--random: decoder layers (default 1); the MoE layers are"},
    [O_FIRST_MOE] = {"--first-moe-layer", "F", "--random: [F, L) (default 0)"},
    [O_SEED] = {"--seed", "S", "weights (--random) / calibration seed (default 0)"},
};

static void quantize_usage(FILE *f, const cli_args *a) {
    fprintf(f, "usage: nvfp4moe quantize --in SRC --out DIR [flags]\n"
               "       nvfp4moe quantize --random --out DIR [config flags]\n\n"
               "The first form quantizes every MoE layer of the unquantized (BF16/F16/F32) model in SRC\n"
               "to NVFP4 and writes DIR/model.safetensors, DIR/config.json (SRC's, plus its\n"
               "quantization_config) and, for ModelOpt, DIR/hf_quant_config.json. Per expert and\n"
               "projection: scale_2 = amax / (6*448), gate and up sharing one amax as ModelOpt's export\n"
               "does; input scales calibrated on random N(0, 1) hidden states. The router (and its\n"
               "bias, as gpt-oss has) stays BF16, under the source's module name (mlp.gate, or\n"
               "gpt-oss's mlp.router), which the quantization config excludes. Expert biases (gpt-oss)\n"
               "are kept, as F32.\n\n"
               "The second form writes a random BF16 source model (weights N(0, 1/sqrt(fan_in))) of the\n"
               "shape the config flags give; default E=8, top-k 2, hidden 256, intermediate 128. With\n"
               "--activation swigluoai (gpt-oss) the router is mlp.router with a bias, and the experts\n"
               "have biases; --bias gives any layer expert biases.\n\n");
    cli_opts_help(f, k_opts, O_COUNT);
    fprintf(f, "  -h, --help                this text\n\n");
    cli_config_flags_help(f, a);
}

static int save(nvfp4moe_st_writer *w, const char *dir) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (nvfp4moe_st_writer_save(w, path) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe quantize: %s\n", nvfp4moe_last_error());
        return -1;
    }
    return 0;
}

static int write_random(const nvfp4moe_config *cfg, int32_t layers, int32_t first_moe, const char *out, bool force) {
    if (first_moe < 0 || first_moe >= layers) {
        fprintf(stderr, "nvfp4moe quantize: --first-moe-layer %d must be below --num-layers %d\n", first_moe,
                layers);
        return CLI_EXIT_FAILURE;
    }
    if (nvfp4moe_config_validate(cfg) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe quantize: bad config: %s\n", nvfp4moe_last_error());
        return CLI_EXIT_FAILURE;
    }
    cli_outdir od;
    if (cli_outdir_begin("quantize", out, NULL, force, &od) != 0) return CLI_EXIT_FAILURE;
    nvfp4moe_st_writer *w = NULL;
    int rc = nvfp4moe_st_writer_create(&w) == NVFP4MOE_OK ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
    for (int32_t L = first_moe; L < layers && rc == CLI_EXIT_OK; L++) {
        nvfp4moe_float_layer *f = NULL;
        if (nvfp4moe_float_layer_random(cfg, cfg->seed + (uint64_t)L, &f) != NVFP4MOE_OK ||
            nvfp4moe_ckpt_add_layer(w, NVFP4MOE_CKPT_UNQUANTIZED, "model.layers", L, NULL, f) != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe quantize: %s\n", nvfp4moe_last_error());
            rc = CLI_EXIT_FAILURE;
        }
        nvfp4moe_float_layer_free(f);
    }
    if (rc == CLI_EXIT_OK && nvfp4moe_st_writer_set_metadata(w, "format", "pt") != NVFP4MOE_OK) rc = CLI_EXIT_FAILURE;
    if (rc == CLI_EXIT_OK && save(w, od.tmp)) rc = CLI_EXIT_FAILURE;
    nvfp4moe_st_writer_free(w);
    if (rc == CLI_EXIT_OK &&
        nvfp4moe_model_config_write(od.tmp, cfg, layers, first_moe, NVFP4MOE_CKPT_UNQUANTIZED, NULL, NULL) !=
            NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe quantize: %s\n", nvfp4moe_last_error());
        rc = CLI_EXIT_FAILURE;
    }
    if (rc == CLI_EXIT_OK && cli_outdir_commit("quantize", &od) != 0) rc = CLI_EXIT_FAILURE;
    if (rc != CLI_EXIT_OK) cli_outdir_abort(&od);
    if (rc == CLI_EXIT_OK) {
        char desc[256];
        nvfp4moe_config_describe(cfg, desc, sizeof desc);
        printf("wrote %s: random BF16 source model, %d layer%s (MoE layers %d..%d), seed %llu\n", out, layers,
               layers == 1 ? "" : "s", first_moe, layers - 1, (unsigned long long)cfg->seed);
        printf("moe   %s\n", desc);
    }
    return rc;
}

static int quantize_dir(const char *in, const char *out, bool force, nvfp4moe_ckpt_format fmt, bool w4a16,
                        long long only, int32_t calib, uint64_t seed) {
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_st_model *m = NULL;
    char *base = NULL;
    nvfp4moe_st_writer *w = NULL;
    int rc = CLI_EXIT_FAILURE, done = 0;
    char path[4096];
    cli_outdir od = {.tmp = ""};
    if (nvfp4moe_model_info_read(in, &info) != NVFP4MOE_OK || nvfp4moe_st_model_open(in, &m) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe quantize: --in: %s\n", nvfp4moe_last_error());
        goto out;
    }
    if (info->quantized) {
        fprintf(stderr, "nvfp4moe quantize: %s is already quantized (%s %s)\n", in, info->quant_method,
                info->quant_algo);
        goto out;
    }
    if (info->num_moe_layers == 0) {
        fprintf(stderr, "nvfp4moe quantize: %s has no MoE layers\n", in);
        goto out;
    }
    snprintf(path, sizeof path, "%s/config.json", in);
    size_t base_len;
    if (cli_read_file("quantize", "--in", path, (size_t)64 << 20, &base, &base_len) != 0) goto out;
    if (cli_outdir_begin("quantize", out, in, force, &od) != 0 || nvfp4moe_st_writer_create(&w) != NVFP4MOE_OK)
        goto out;
    nvfp4moe_config qcfg = info->cfg;
    // The router keeps the source's module name (gpt-oss: mlp.router); the quantization config's
    // exclusion must name that same module, so every layer has to agree on it.
    char router[8] = "";
    int32_t router_layer = -1;
    for (int32_t L = 0; L < info->num_layers; L++) {
        if (!nvfp4moe_model_info_is_moe_layer(info, L) || (only >= 0 && L != only)) continue;
        nvfp4moe_float_layer *f = NULL;
        nvfp4moe_ckpt_layer *q = NULL;
        nvfp4moe_status s = nvfp4moe_float_layer_load(info, m, L, &f);
        if (s == NVFP4MOE_OK) {
            f->cfg.scheme = w4a16 ? NVFP4MOE_SCHEME_W4A16 : NVFP4MOE_SCHEME_W4A4;
            s = nvfp4moe_float_layer_quantize(f, calib, seed + (uint64_t)L, &q);
        }
        if (s == NVFP4MOE_OK) s = nvfp4moe_ckpt_add_layer(w, fmt, info->prefix, L, q, NULL);
        if (s == NVFP4MOE_OK) qcfg = q->layer.cfg;
        const char *rname = s == NVFP4MOE_OK ? nvfp4moe_ckpt_router_name(q->router_name, &qcfg) : NULL;
        if (rname && q->has_router && router_layer >= 0 && strcmp(rname, router)) {
            fprintf(stderr, "nvfp4moe quantize: layer %d's router is %s.%d.mlp.%s but layer %d's is mlp.%s: "
                    "one exclusion list cannot keep both unquantized\n", L, info->prefix, L, rname,
                    router_layer, router);
            nvfp4moe_ckpt_layer_free(q);
            nvfp4moe_float_layer_free(f);
            goto out;
        }
        if (rname && q->has_router && router_layer < 0) {
            snprintf(router, sizeof router, "%s", rname);
            router_layer = L;
        }
        nvfp4moe_ckpt_layer_free(q);
        nvfp4moe_float_layer_free(f);
        if (s != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe quantize: layer %d: %s\n", L, nvfp4moe_last_error());
            goto out;
        }
        printf("layer %d: %d experts quantized%s\n", L, qcfg.num_experts, qcfg.has_bias ? " (with their biases)" : "");
        done++;
    }
    if (!done) {
        fprintf(stderr, "nvfp4moe quantize: --layer %lld is not a MoE layer of %s\n", only, in);
        goto out;
    }
    if (nvfp4moe_st_writer_set_metadata(w, "format", "pt") != NVFP4MOE_OK || save(w, od.tmp)) goto out;
    if (nvfp4moe_model_config_write(od.tmp, &qcfg, info->num_layers, info->first_moe_layer, fmt, base,
                                    router_layer >= 0 ? router : NULL) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe quantize: %s\n", nvfp4moe_last_error());
        goto out;
    }
    if (cli_outdir_commit("quantize", &od) != 0) goto out;
    printf("wrote %s: %s, %s format, %d MoE layer%s; files model.safetensors config.json%s\n", out,
           w4a16 ? "W4A16_NVFP4 (weight-only)" : "NVFP4 w4a4", nvfp4moe_ckpt_format_name(fmt), done,
           done == 1 ? "" : "s",
           fmt == NVFP4MOE_CKPT_MODELOPT || fmt == NVFP4MOE_CKPT_MODELOPT_FUSED ? " hf_quant_config.json" : "");
    rc = CLI_EXIT_OK;
out:
    if (rc != CLI_EXIT_OK) cli_outdir_abort(&od);
    nvfp4moe_st_writer_free(w);
    free(base);
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
    return rc;
}

int cmd_quantize(int argc, char **argv) {
    nvfp4moe_config cfg;
    nvfp4moe_config_init(&cfg);
    // --random's default shape: small enough for a fixture, valid for every backend.
    cfg.num_experts = 8;
    cfg.top_k = 2;
    cfg.hidden_size = 256;
    cfg.intermediate_size = 128;
    cfg.seed = 0;
    const char *in = NULL, *out = NULL;
    bool random = false, w4a16 = false, force = false;
    long long only = -1, calib = 64, layers = 1, first_moe = 0, seed = 0;
    nvfp4moe_ckpt_format fmt = NVFP4MOE_CKPT_MODELOPT;
    const char *v = NULL;
    cli_args args;
    cli_args_init(&args, "quantize", k_opts, O_COUNT, true, 0, argc, argv);
    for (int o; (o = cli_args_next(&args, &v)) != CLI_ARGS_END;) {
        switch (o) {
        case CLI_ARGS_HELP: quantize_usage(stdout, &args); return CLI_EXIT_OK;
        case CLI_ARGS_ERROR: return CLI_EXIT_FAILURE;
        case O_IN: in = v; break;
        case O_OUT: out = v; break;
        case O_FORMAT:
            if (nvfp4moe_ckpt_format_parse(v, &fmt) != NVFP4MOE_OK || fmt == NVFP4MOE_CKPT_UNQUANTIZED) {
                fprintf(stderr, "nvfp4moe quantize: --format: expected modelopt, modelopt-fused or "
                        "compressed-tensors, got '%s'\n", v);
                return CLI_EXIT_FAILURE;
            }
            break;
        case O_W4A16: w4a16 = true; break;
        case O_RANDOM: random = true; break;
        case O_FORCE: force = true; break;
        case O_LAYER:
            if (cli_parse_int("--layer", v, 0, &only)) return CLI_EXIT_FAILURE;
            break;
        case O_CALIB:
            if (cli_parse_int("--calib-tokens", v, 1, &calib)) return CLI_EXIT_FAILURE;
            break;
        case O_NUM_LAYERS:
            if (cli_parse_int("--num-layers", v, 1, &layers)) return CLI_EXIT_FAILURE;
            break;
        case O_FIRST_MOE:
            if (cli_parse_int("--first-moe-layer", v, 0, &first_moe)) return CLI_EXIT_FAILURE;
            break;
        case O_SEED:
            if (cli_parse_int("--seed", v, 0, &seed)) return CLI_EXIT_FAILURE;
            break;
        }
    }
    if (cli_config_apply(&args, &cfg) != 0) return CLI_EXIT_FAILURE;
    cfg.seed = (uint64_t)seed;
    if (!out || (random == (in != NULL))) {
        fprintf(stderr, "nvfp4moe quantize: needs --out DIR and exactly one of --in SRC or --random\n");
        return CLI_EXIT_FAILURE;
    }
    w4a16 = w4a16 || cfg.scheme == NVFP4MOE_SCHEME_W4A16;
    if (random) return write_random(&cfg, (int32_t)layers, (int32_t)first_moe, out, force);
    return quantize_dir(in, out, force, fmt, w4a16, only, (int32_t)calib, cfg.seed);
}
