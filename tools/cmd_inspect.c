/*
 * cmd_inspect.c - `nvfp4moe inspect DIR`: what a model directory holds (files, format, scheme,
 * MoE layers, experts, shapes) and every problem found, checking each MoE layer's tensors without
 * copying them; as text or, with --json, one JSON object. Exit status 1 when a problem stops a
 * layer from loading.
 */
#include "cli_model.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

enum { O_LAYER, O_JSON, O_COUNT };
static const cli_opt k_opts[O_COUNT] = {
    [O_LAYER] = {"--layer", "N", "check only decoder layer N"},
    [O_JSON] = {"--json", NULL, "print one JSON object instead of text (docs/checkpoints.md)"},
};

static void inspect_usage(FILE *f) {
    fprintf(f, "usage: nvfp4moe inspect DIR [--layer N] [--json]\n\n"
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

/* What inspect found: printed as it goes (text) or kept for one object at the end (--json). */
typedef struct {
    bool json;
    json_t *root, *problems, *warnings, *layers;
    int nproblems, nwarnings;
} report;

static void problem(report *r, const char *text_label, const char *msg) {
    r->nproblems++;
    if (r->json) json_array_append_new(r->problems, json_string(msg));
    else printf("%-14s%s\n", text_label, msg);
}

static void warning(report *r, json_t *into, const char *msg) {
    r->nwarnings++;
    if (r->json) json_array_append_new(into ? into : r->warnings, json_string(msg));
    else printf("warning       %s\n", msg);
}

static json_t *shape3(int64_t a, int64_t b, int64_t c) {
    json_t *s = json_array();
    json_array_append_new(s, json_integer(a));
    json_array_append_new(s, json_integer(b));
    json_array_append_new(s, json_integer(c));
    return s;
}

/* Prints the report (--json) and gives the exit status. */
static int finish(report *r, int checked) {
    int rc = r->nproblems ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
    if (!r->json) {
        if (checked >= 0)
            printf("result        %d MoE layer%s checked: %d problem%s, %d warning%s\n", checked, checked == 1 ? "" : "s",
                   r->nproblems, r->nproblems == 1 ? "" : "s", r->nwarnings, r->nwarnings == 1 ? "" : "s");
        return rc;
    }
    json_object_set_new(r->root, "layers_checked", json_integer(checked > 0 ? checked : 0));
    json_object_set_new(r->root, "ok", json_boolean(!r->nproblems));
    json_object_set_new(r->root, "problems", r->problems);
    json_object_set_new(r->root, "warnings", r->warnings);
    json_object_set_new(r->root, "layers", r->layers);
    r->problems = r->warnings = r->layers = NULL;
    char *s = json_dumps(r->root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!s) {
        fprintf(stderr, "nvfp4moe inspect: out of memory\n");
        rc = CLI_EXIT_FAILURE;
    } else {
        printf("%s\n", s);
        free(s);
    }
    return rc;
}

int cmd_inspect(int argc, char **argv) {
    const char *v = NULL;
    long long only = -1;
    bool json = false;
    cli_args args;
    cli_args_init(&args, "inspect", k_opts, O_COUNT, false, 1, argc, argv);
    for (int o; (o = cli_args_next(&args, &v)) != CLI_ARGS_END;) {
        switch (o) {
        case CLI_ARGS_HELP: inspect_usage(stdout); return CLI_EXIT_OK;
        case CLI_ARGS_ERROR: return CLI_EXIT_FAILURE;
        case O_LAYER:
            if (cli_parse_int("--layer", v, 0, &only)) return CLI_EXIT_FAILURE;
            break;
        case O_JSON: json = true; break;
        }
    }
    if (args.npos != 1) {
        fprintf(stderr, "nvfp4moe inspect: needs the model directory: nvfp4moe inspect DIR\n\n");
        inspect_usage(stderr);
        return CLI_EXIT_FAILURE;
    }
    const char *dir = args.pos[0];

    report r = {.json = json};
    if (json) {
        r.root = json_object();
        r.problems = json_array();
        r.warnings = json_array();
        r.layers = json_array();
        if (!r.root || !r.problems || !r.warnings || !r.layers) {
            fprintf(stderr, "nvfp4moe inspect: out of memory\n");
            json_decref(r.root), json_decref(r.problems), json_decref(r.warnings), json_decref(r.layers);
            return CLI_EXIT_FAILURE;
        }
        json_object_set_new(r.root, "model", json_string(dir));
    } else {
        printf("model         %s\n", dir);
    }
    int rc = CLI_EXIT_FAILURE, checked = -1;
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_st_model *m = NULL;
    char hb[32];
    if (nvfp4moe_model_info_read(dir, &info) != NVFP4MOE_OK) {
        problem(&r, "problem", nvfp4moe_last_error());
        goto done;
    }
    if (nvfp4moe_st_model_open(dir, &m) != NVFP4MOE_OK) {
        if (json) json_object_set_new(r.root, "files", json_null());
        else printf("files         unreadable\n");
        problem(&r, "problem", nvfp4moe_last_error());
        goto done;
    }
    size_t nf = nvfp4moe_st_model_num_files(m);
    const nvfp4moe_config *c = &info->cfg;
    if (json) {
        json_t *files = json_object();
        json_object_set_new(files, "safetensors_files", json_integer((json_int_t)nf));
        json_object_set_new(files, "tensors", json_integer((json_int_t)nvfp4moe_st_model_count(m)));
        json_object_set_new(files, "bytes", json_integer((json_int_t)total_bytes(m)));
        json_object_set_new(r.root, "files", files);
        json_t *arch = json_object();
        json_object_set_new(arch, "model_type", info->model_type[0] ? json_string(info->model_type) : json_null());
        json_object_set_new(arch, "num_layers", json_integer(info->num_layers));
        json_object_set_new(arch, "hidden_size", json_integer(c->hidden_size));
        json_object_set_new(r.root, "architecture", arch);
        if (info->quantized) {
            json_t *q = json_object();
            json_object_set_new(q, "method", json_string(info->quant_method));
            json_object_set_new(q, "algo", json_string(info->quant_algo));
            json_object_set_new(q, "scheme", json_string(nvfp4moe_scheme_name(c->scheme)));
            json_object_set_new(q, "source", json_string(info->quant_source));
            json_t *ex = json_array();
            for (int32_t i = 0; i < info->num_excluded; i++)
                json_array_append_new(ex, json_string(nvfp4moe_model_info_excluded(info, i)));
            json_object_set_new(q, "excluded", ex);
            json_object_set_new(r.root, "quantization", q);
        } else {
            json_object_set_new(r.root, "quantization", json_null());
        }
    } else {
        printf("files         %zu safetensors file%s, %zu tensors, %s\n", nf, nf == 1 ? "" : "s",
               nvfp4moe_st_model_count(m), human(total_bytes(m), hb, sizeof hb));
        printf("architecture  %s, %d layers, hidden %d\n", info->model_type[0] ? info->model_type : "(no model_type)",
               info->num_layers, c->hidden_size);
        if (info->quantized)
            printf("quantization  %s %s (%s) from %s, %d excluded-module pattern%s\n", info->quant_method,
                   info->quant_algo, nvfp4moe_scheme_name(c->scheme), info->quant_source, info->num_excluded,
                   info->num_excluded == 1 ? "" : "s");
        else
            printf("quantization  none (unquantized: make NVFP4 with `nvfp4moe quantize --in %s --out DIR`)\n", dir);
    }
    for (int32_t i = 0; i < info->warnings.count; i++) warning(&r, NULL, info->warnings.text[i]);
    if (info->num_moe_layers == 0) {
        if (json) json_object_set_new(r.root, "moe", json_null());
        else printf("moe           none: config.json names no experts\n");
        rc = finish(&r, -1);
        goto out;
    }
    // Every shape below is computed from this config: it must be sane first.
    if (nvfp4moe_config_validate(c) != NVFP4MOE_OK) {
        char msg[1400];
        snprintf(msg, sizeof msg, "%s/config.json: the MoE layers' config is invalid: %s", dir, nvfp4moe_last_error());
        problem(&r, "problem", msg);
        goto done;
    }
    char desc[256];
    nvfp4moe_config_describe(c, desc, sizeof desc);
    const int64_t E = c->num_experts, H = c->hidden_size, I = c->intermediate_size, N1 = nvfp4moe_config_n1(c);
    if (json) {
        json_t *moe = json_object();
        json_object_set_new(moe, "num_moe_layers", json_integer(info->num_moe_layers));
        json_object_set_new(moe, "first_moe_layer", json_integer(info->first_moe_layer));
        json_object_set_new(moe, "num_experts", json_integer(c->num_experts));
        json_object_set_new(moe, "shared_experts", json_boolean(info->num_shared_experts > 0));
        json_object_set_new(moe, "config", json_string(desc));
        json_t *sh = json_object();
        json_object_set_new(sh, "w13", shape3(E, N1, H / 2));
        json_object_set_new(sh, "w13_scale", shape3(E, N1, H / 16));
        json_object_set_new(sh, "w2", shape3(E, H, I / 2));
        json_object_set_new(sh, "w2_scale", shape3(E, H, I / 16));
        json_object_set_new(moe, "shapes", sh);
        json_object_set_new(r.root, "moe", moe);
    } else {
        printf("moe           %d of %d layers (first %d), %d routed expert%s%s; %s\n", info->num_moe_layers,
               info->num_layers, info->first_moe_layer, c->num_experts, c->num_experts == 1 ? "" : "s",
               info->num_shared_experts ? " + shared experts (not run by nvfp4moe)" : "", desc);
        printf("shapes        w13 [%lld, %lld, %lld] + scales [%lld, %lld, %lld], w2 [%lld, %lld, %lld] + "
               "scales [%lld, %lld, %lld] (E, rows, packed bytes)\n",
               (long long)E, (long long)N1, (long long)H / 2, (long long)E, (long long)N1, (long long)H / 16,
               (long long)E, (long long)H, (long long)I / 2, (long long)E, (long long)H, (long long)I / 16);
    }

    checked = 0;
    for (int32_t L = 0; L < info->num_layers; L++) {
        if (!nvfp4moe_model_info_is_moe_layer(info, L) || (only >= 0 && L != only)) continue;
        checked++;
        json_t *lj = json ? json_object() : NULL;
        if (lj) {
            json_object_set_new(lj, "index", json_integer(L));
            json_array_append_new(r.layers, lj);
        }
        char module[96];
        snprintf(module, sizeof module, "%s.%d.mlp.experts", info->prefix, L);
        if (nvfp4moe_model_info_is_excluded(info, module)) {
            if (lj) json_object_set_new(lj, "status", json_string("excluded"));
            else printf("layer %-7d excluded from quantization (%s matches an exclusion)\n", L, module);
            continue;
        }
        nvfp4moe_ckpt_layer *l = NULL;
        nvfp4moe_status st = nvfp4moe_ckpt_layer_load_from(info, m, L, true, &l);
        if (st == NVFP4MOE_ERR_UNSUPPORTED && !info->quantized) {
            // A BF16 source model: nothing wrong, just not NVFP4 yet.
            if (lj) json_object_set_new(lj, "status", json_string("unquantized"));
            else printf("layer %-7d unquantized experts (a source for nvfp4moe quantize)\n", L);
            continue;
        }
        if (st != NVFP4MOE_OK) {
            char label[32], msg[1200];
            snprintf(label, sizeof label, "layer %-7d", L);
            if (lj) {
                json_object_set_new(lj, "status", json_string("problem"));
                json_object_set_new(lj, "problem", json_string(nvfp4moe_last_error()));
                snprintf(msg, sizeof msg, "layer %d: %s", L, nvfp4moe_last_error());
                problem(&r, label, msg);
            } else {
                snprintf(msg, sizeof msg, "PROBLEM %s", nvfp4moe_last_error());
                problem(&r, label, msg);
            }
            continue;
        }
        const nvfp4moe_config *lc = &l->layer.cfg;
        if (lj) {
            json_object_set_new(lj, "status", json_string("ok"));
            json_object_set_new(lj, "format", json_string(nvfp4moe_ckpt_format_name(l->format)));
            json_object_set_new(lj, "num_experts", json_integer(lc->num_experts));
            json_object_set_new(lj, "scheme", json_string(nvfp4moe_scheme_name(lc->scheme)));
            if (l->has_router) {
                json_t *rt = json_object();
                json_object_set_new(rt, "name", json_string(nvfp4moe_ckpt_router_name(l->router_name, lc)));
                json_object_set_new(rt, "dtype", json_string(nvfp4moe_st_dtype_name(l->router_dtype)));
                json_object_set_new(rt, "bias", json_boolean(l->has_router_bias));
                json_object_set_new(lj, "router", rt);
            } else {
                json_object_set_new(lj, "router", json_null());
            }
            json_object_set_new(lj, "correction_bias", json_boolean(lc->has_correction_bias));
            json_object_set_new(lj, "expert_biases", json_boolean(lc->has_bias));
            json_t *lw = json_array();
            for (int32_t i = 0; i < l->warnings.count; i++) warning(&r, lw, l->warnings.text[i]);
            json_object_set_new(lj, "warnings", lw);
        } else {
            char router[80] = "no router weight";
            if (l->has_router)
                snprintf(router, sizeof router, "router %s [%d, %d]%s", nvfp4moe_st_dtype_name(l->router_dtype),
                         lc->num_experts, lc->hidden_size, l->has_router_bias ? " with bias" : "");
            printf("layer %-7d ok: %s, %d experts, %s, %s%s%s\n", L, nvfp4moe_ckpt_format_name(l->format),
                   lc->num_experts, nvfp4moe_scheme_name(lc->scheme), router,
                   lc->has_correction_bias ? ", e_score_correction_bias" : "", lc->has_bias ? ", expert biases" : "");
            for (int32_t i = 0; i < l->warnings.count; i++) warning(&r, NULL, l->warnings.text[i]);
        }
        nvfp4moe_ckpt_layer_free(l);
    }
    if (only >= 0 && !checked) {
        char label[32], msg[96];
        snprintf(label, sizeof label, "layer %-7lld", only);
        if (json) snprintf(msg, sizeof msg, "layer %lld is not a MoE layer of this model", only);
        else snprintf(msg, sizeof msg, "PROBLEM not a MoE layer of this model");
        problem(&r, label, msg);
    }
done:
    rc = finish(&r, checked);
out:
    json_decref(r.root), json_decref(r.problems), json_decref(r.warnings), json_decref(r.layers);
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
    return rc;
}
