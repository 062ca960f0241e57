/*
 * cmd_inspect.c - `nvfp4moe inspect DIR`: what a model directory holds (files, format, scheme,
 * MoE layers, experts, shapes) and every problem found, checking each MoE layer's tensors without
 * copying them. Exit status 1 when a problem stops a layer from loading.
 */
#include "cli_model.h"

#include <stdlib.h>
#include <string.h>

enum { O_LAYER, O_COUNT };
static const cli_opt k_opts[O_COUNT] = {
    [O_LAYER] = {"--layer", "N", "check only decoder layer N"},
};

static void inspect_usage(FILE *f) {
    fprintf(f, "usage: nvfp4moe inspect DIR [--layer N]\n\n"
               "Reads DIR/config.json (+ hf_quant_config.json) and its safetensors files (one file, an\n"
               "index with shards, or every *.safetensors), prints the format, quantization scheme, MoE\n"
               "layers, experts and shapes, and checks every MoE layer's tensors (names, dtypes, shapes,\n"
               "scales). Problems are listed at the end; the exit status is 1 if any layer cannot load.\n\n");
    cli_opts_help(f, k_opts, O_COUNT);
    fprintf(f, "  -h, --help                this text\n");
}

static double total_bytes(const nvfp4moe_st_model *m) {
    double b = 0;
    for (size_t i = 0; i < nvfp4moe_st_model_count(m); i++) b += (double)nvfp4moe_st_model_tensor(m, i)->nbytes;
    return b;
}

static const char *human(double b, char *buf, size_t len) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int k = 0;
    while (b >= 1024 && k < 4) b /= 1024, k++;
    snprintf(buf, len, k ? "%.1f %s" : "%.0f %s", b, u[k]);
    return buf;
}

int cmd_inspect(int argc, char **argv) {
    const char *v = NULL;
    long long only = -1;
    cli_args args;
    cli_args_init(&args, "inspect", k_opts, O_COUNT, false, 1, argc, argv);
    for (int o; (o = cli_args_next(&args, &v)) != CLI_ARGS_END;) {
        switch (o) {
        case CLI_ARGS_HELP: inspect_usage(stdout); return CLI_EXIT_OK;
        case CLI_ARGS_ERROR: return CLI_EXIT_FAILURE;
        case O_LAYER:
            if (cli_parse_int("--layer", v, 0, &only)) return CLI_EXIT_FAILURE;
            break;
        }
    }
    if (args.npos != 1) {
        fprintf(stderr, "nvfp4moe inspect: needs the model directory: nvfp4moe inspect DIR\n\n");
        inspect_usage(stderr);
        return CLI_EXIT_FAILURE;
    }
    const char *dir = args.pos[0];

    int problems = 0, warnings = 0;
    printf("model         %s\n", dir);
    nvfp4moe_model_info *info = NULL;
    if (nvfp4moe_model_info_read(dir, &info) != NVFP4MOE_OK) {
        printf("problem       %s\n", nvfp4moe_last_error());
        return CLI_EXIT_FAILURE;
    }
    nvfp4moe_st_model *m = NULL;
    char hb[32];
    if (nvfp4moe_st_model_open(dir, &m) != NVFP4MOE_OK) {
        printf("files         unreadable\n");
        printf("problem       %s\n", nvfp4moe_last_error());
        nvfp4moe_model_info_free(info);
        return CLI_EXIT_FAILURE;
    }
    size_t nf = nvfp4moe_st_model_num_files(m);
    printf("files         %zu safetensors file%s, %zu tensors, %s\n", nf, nf == 1 ? "" : "s",
           nvfp4moe_st_model_count(m), human(total_bytes(m), hb, sizeof hb));
    const nvfp4moe_config *c = &info->cfg;
    printf("architecture  %s, %d layers, hidden %d\n", info->model_type[0] ? info->model_type : "(no model_type)",
           info->num_layers, c->hidden_size);
    if (info->quantized)
        printf("quantization  %s %s (%s) from %s, %d excluded-module pattern%s\n", info->quant_method,
               info->quant_algo, nvfp4moe_scheme_name(c->scheme), info->quant_source, info->num_excluded,
               info->num_excluded == 1 ? "" : "s");
    else
        printf("quantization  none (unquantized: make NVFP4 with `nvfp4moe quantize --in %s --out DIR`)\n", dir);
    for (int32_t i = 0; i < info->warnings.count; i++, warnings++)
        printf("warning       %s\n", info->warnings.text[i]);
    if (info->num_moe_layers == 0) {
        printf("moe           none: config.json names no experts\n");
        nvfp4moe_st_model_close(m);
        nvfp4moe_model_info_free(info);
        return CLI_EXIT_OK;
    }
    // Every shape below is computed from this config: it must be sane first.
    if (nvfp4moe_config_validate(c) != NVFP4MOE_OK) {
        printf("problem       %s/config.json: the MoE layers' config is invalid: %s\n", dir, nvfp4moe_last_error());
        nvfp4moe_st_model_close(m);
        nvfp4moe_model_info_free(info);
        return CLI_EXIT_FAILURE;
    }
    char desc[256];
    nvfp4moe_config_describe(c, desc, sizeof desc);
    printf("moe           %d of %d layers (first %d), %d routed expert%s%s; %s\n", info->num_moe_layers,
           info->num_layers, info->first_moe_layer, c->num_experts, c->num_experts == 1 ? "" : "s",
           info->num_shared_experts ? " + shared experts (not run by nvfp4moe)" : "", desc);
    const int64_t E = c->num_experts, H = c->hidden_size, I = c->intermediate_size,
                  N1 = nvfp4moe_config_n1(c);
    printf("shapes        w13 [%lld, %lld, %lld] + scales [%lld, %lld, %lld], w2 [%lld, %lld, %lld] + "
           "scales [%lld, %lld, %lld] (E, rows, packed bytes)\n",
           (long long)E, (long long)N1, (long long)H / 2, (long long)E, (long long)N1, (long long)H / 16,
           (long long)E, (long long)H, (long long)I / 2, (long long)E, (long long)H, (long long)I / 16);

    int checked = 0;
    for (int32_t L = 0; L < info->num_layers; L++) {
        if (!nvfp4moe_model_info_is_moe_layer(info, L) || (only >= 0 && L != only)) continue;
        checked++;
        char module[96];
        snprintf(module, sizeof module, "%s.%d.mlp.experts", info->prefix, L);
        if (nvfp4moe_model_info_is_excluded(info, module)) {
            printf("layer %-7d excluded from quantization (%s matches an exclusion)\n", L, module);
            continue;
        }
        nvfp4moe_ckpt_layer *l = NULL;
        nvfp4moe_status st = nvfp4moe_ckpt_layer_load_from(info, m, L, true, &l);
        if (st == NVFP4MOE_ERR_UNSUPPORTED && !info->quantized) {
            // A BF16 source model: nothing wrong, just not NVFP4 yet.
            printf("layer %-7d unquantized experts (a source for nvfp4moe quantize)\n", L);
            continue;
        }
        if (st != NVFP4MOE_OK) {
            printf("layer %-7d PROBLEM %s\n", L, nvfp4moe_last_error());
            problems++;
            continue;
        }
        const nvfp4moe_config *lc = &l->layer.cfg;
        char router[80] = "no router weight";
        if (l->has_router)
            snprintf(router, sizeof router, "router %s [%d, %d]%s", nvfp4moe_st_dtype_name(l->router_dtype),
                     lc->num_experts, lc->hidden_size, l->has_router_bias ? " with bias" : "");
        printf("layer %-7d ok: %s, %d experts, %s, %s%s%s\n", L, nvfp4moe_ckpt_format_name(l->format),
               lc->num_experts, nvfp4moe_scheme_name(lc->scheme), router,
               lc->has_correction_bias ? ", e_score_correction_bias" : "", lc->has_bias ? ", expert biases" : "");
        for (int32_t i = 0; i < l->warnings.count; i++, warnings++)
            printf("warning       %s\n", l->warnings.text[i]);
        nvfp4moe_ckpt_layer_free(l);
    }
    if (only >= 0 && !checked)
        printf("layer %-7lld PROBLEM not a MoE layer of this model\n", only), problems++;
    printf("result        %d MoE layer%s checked: %d problem%s, %d warning%s\n", checked, checked == 1 ? "" : "s",
           problems, problems == 1 ? "" : "s", warnings, warnings == 1 ? "" : "s");
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
    return problems ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
}
