/*
 * cmd_quantize.c - `nvfp4moe quantize`: writes an NVFP4 checkpoint (ModelOpt per-expert by
 * default; ModelOpt fused or compressed-tensors on request) from a BF16/F16/F32 safetensors model,
 * and, with --random, writes such a BF16 source model to start from. The output directory is one
 * transaction (cli_outdir.h).
 */
#include "cli_model.h"
#include "cli_outdir.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

enum { O_IN, O_OUT, O_FORCE, O_FORMAT, O_W4A16, O_LAYER, O_MAX_SHARD, O_CALIB, O_RANDOM, O_NUM_LAYERS, O_FIRST_MOE, O_SEED,
       O_COUNT };
static const cli_opt k_opts[O_COUNT] = {
    [O_IN] = {"--in", "SRC", "unquantized model directory"},
    [O_OUT] = {"--out", "DIR", "output directory: missing or empty (refused if it is, or is inside,\n"
                               "--in); written beside it, fsynced, then renamed into place"},
    [O_FORCE] = {"--force", NULL, "replace a non-empty --out whole (nothing of it is kept)"},
    [O_FORMAT] = {"--format", "F", "modelopt (per-expert tensors, default) | modelopt-fused |\n"
                                   "compressed-tensors"},
    [O_W4A16] = {"--w4a16", NULL, "weight-only NVFP4 (W4A16_NVFP4; no input scales)"},
    [O_LAYER] = {"--layer", "N", "quantize only decoder layer N (the other MoE layers are copied and\n"
                                 "excluded)"},
    [O_MAX_SHARD] = {"--max-shard-size", "S", "tensor bytes per file: 5GB (default), 500MB, 2GiB, or bytes"},
    [O_CALIB] = {"--calib-tokens", "N", "calibration tokens for the input scales (default 64)"},
    [O_RANDOM] = {"--random", NULL, "write a random BF16 source model instead"},
    [O_NUM_LAYERS] = {"--num-layers", "L", "--random: decoder layers (default 1); the MoE layers are"},
    [O_FIRST_MOE] = {"--first-moe-layer", "F", "--random: [F, L) (default 0)"},
    [O_SEED] = {"--seed", "S", "weights (--random) / calibration seed (default 0)"},
};

static void quantize_usage(FILE *f, const cli_args *a) {
    fprintf(f, "usage: nvfp4moe quantize --in SRC --out DIR [flags]\n"
               "       nvfp4moe quantize --random --out DIR [config flags]\n\n"
               "The first form writes the whole unquantized (BF16/F16/F32) model in SRC to DIR with its MoE\n"
               "layers' experts in NVFP4, one tensor at a time (memory: one expert's weights):\n"
               "- the experts the ModelOpt way: per expert and projection scale_2 = amax / (6*448), gate\n"
               "  and up sharing one amax as ModelOpt's export does, input scales calibrated on random\n"
               "  N(0, 1) hidden states; under the source's module and projection names; expert biases\n"
               "  (gpt-oss) kept;\n"
               "- every other tensor (embeddings, attention, norms, routers, shared experts, lm_head)\n"
               "  copied bit for bit;\n"
               "- shards of at most --max-shard-size (model.safetensors, or model-0000i-of-0000N.safetensors\n"
               "  with model.safetensors.index.json);\n"
               "- config.json (SRC's, with its quantization_config) and, for ModelOpt, hf_quant_config.json,\n"
               "  whose exclusion list names every unquantized module; SRC's other files (tokenizer,\n"
               "  generation config, ...) copied.\n"
               "On a terminal a progress bar (tensors and bytes written, rate, time left) is drawn on stderr;\n"
               "otherwise one line per MoE layer quantized is printed.\n\n"
               "The second form writes a random BF16 source model (a small decoder: embeddings, attention,\n"
               "norms, dense MLPs before --first-moe-layer, MoE layers with weights N(0, 1/sqrt(fan_in)),\n"
               "lm_head) of the shape the config flags give; default E=8, top-k 2, hidden 256, intermediate\n"
               "128. With --activation swigluoai (gpt-oss) the router is mlp.router with a bias, and the\n"
               "experts have biases; --bias gives any layer expert biases. It is written tensor by tensor\n"
               "too, so sources of any size can be made.\n\n");
    cli_opts_help(f, k_opts, O_COUNT);
    fprintf(f, "  -h, --help                this text\n\n");
    cli_config_flags_help(f, a);
}

static int write_random(const nvfp4moe_config *cfg, int32_t layers, int32_t first_moe, const char *out, bool force,
                        uint64_t max_shard) {
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
    if (nvfp4moe_model_write_random(od.tmp, cfg, layers, first_moe, max_shard) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe quantize: %s\n", nvfp4moe_last_error());
        cli_outdir_abort(&od);
        return CLI_EXIT_FAILURE;
    }
    if (cli_outdir_commit("quantize", &od) != 0) return CLI_EXIT_FAILURE;
    char desc[256];
    nvfp4moe_config_describe(cfg, desc, sizeof desc);
    printf("wrote %s: random BF16 source model, %d layer%s (MoE layers %d..%d), seed %llu\n", out, layers,
           layers == 1 ? "" : "s", first_moe, layers - 1, (unsigned long long)cfg->seed);
    printf("moe   %s\n", desc);
    return CLI_EXIT_OK;
}

/* --max-shard-size: bytes, or a number with a unit as Hugging Face writes them ("5GB" = 5e9,
 * "500MB", "2GiB" = 2^31). */
static int parse_size(const char *v, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    const double x = strtod(v, &end);
    static const struct { const char *unit; double mult; } units[] = {
        {"", 1}, {"b", 1}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
        {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
    if (end && end != v && !errno && isfinite(x) && x > 0)
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (!strcasecmp(end, units[i].unit) && x * units[i].mult >= 1 && x * units[i].mult < 1.8e19) {
                *out = (uint64_t)(x * units[i].mult);
                return 0;
            }
    fprintf(stderr, "nvfp4moe quantize: --max-shard-size: expected a size such as 5GB, 500MB, 2GiB or a "
                    "number of bytes, got '%s'\n", v);
    return -1;
}

static void human_bytes(double b, char *buf, size_t len) {
    const char *u[] = {"B", "KB", "MB", "GB", "TB"};
    int i = 0;
    while (b >= 1000 && i < 4) b /= 1000, i++;
    snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

/* The progress of a quantize: a bar redrawn in place on a terminal (stderr), otherwise one plain
 * line per MoE layer quantized (stdout). */
typedef struct {
    bool tty;
    double t0, last;
    int32_t layers_printed;
} progress_view;

static void on_progress(const nvfp4moe_quantize_progress *p, void *user) {
    progress_view *v = user;
    const double now = cli_now_s();
    if (!v->tty) {
        if (v->layers_printed < p->layers_done) {
            v->layers_printed = p->layers_done;
            printf("layer %d: %d experts quantized%s (%d of %d MoE layers; %lld of %lld tensors, %.0f%% of the "
                   "bytes written)\n", p->last_layer, p->experts_total, p->expert_biases ? " (with their biases)" : "",
                   p->layers_done, p->layers_total,
                   (long long)p->tensors_done, (long long)p->tensors_total,
                   p->bytes_total ? 100.0 * (double)p->bytes_done / (double)p->bytes_total : 100.0);
            fflush(stdout);
        }
        return;
    }
    const bool end = p->bytes_done == p->bytes_total && p->tensors_done == p->tensors_total;
    if (!end && now - v->last < 0.1) return;
    v->last = now;
    const double frac = p->bytes_total ? (double)p->bytes_done / (double)p->bytes_total : 1.0;
    const double el = now - v->t0, rate = el > 0 ? (double)p->bytes_done / el : 0;
    char done[24], total[24], rt[24], eta[48] = "--:--";
    human_bytes((double)p->bytes_done, done, sizeof done);
    human_bytes((double)p->bytes_total, total, sizeof total);
    human_bytes(rate, rt, sizeof rt);
    if (rate > 0 && frac > 0) {
        const long left = (long)((double)(p->bytes_total - p->bytes_done) / rate + 0.5);
        snprintf(eta, sizeof eta, "%ld:%02ld:%02ld", left / 3600, left / 60 % 60, left % 60);
    }
    char bar[32];
    const int filled = (int)(frac * 24 + 0.5);
    for (int i = 0; i < 24; i++) bar[i] = i < filled ? '#' : '.';
    bar[24] = '\0';
    char what[64] = "copying";
    if (end) snprintf(what, sizeof what, "done");
    if (p->layer >= 0)
        snprintf(what, sizeof what, "layer %d: expert %d/%d", p->layer, p->experts_done, p->experts_total);
    fprintf(stderr, "\r[%s] %3.0f%%  %lld/%lld tensors  %s/%s  %s/s  ETA %s  %-20s", bar, 100 * frac,
            (long long)p->tensors_done, (long long)p->tensors_total, done, total, rt, eta, what);
    if (end) fputc('\n', stderr);
    fflush(stderr);
}

static int quantize_dir(const char *in, const char *out, bool force, nvfp4moe_ckpt_format fmt, bool w4a16,
                        long long only, int32_t calib, uint64_t seed, uint64_t max_shard) {
    // The source first: a file that cannot be read, or a model that cannot be quantized, is named
    // before --out is looked at.
    nvfp4moe_model_info *info = NULL;
    if (nvfp4moe_model_info_read(in, &info) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe quantize: --in: %s\n", nvfp4moe_last_error());
        return CLI_EXIT_FAILURE;
    }
    const bool quantized = info->quantized, moe = info->num_moe_layers > 0;
    if (quantized)
        fprintf(stderr, "nvfp4moe quantize: %s is already quantized (%s %s)\n", in, info->quant_method,
                info->quant_algo);
    else if (!moe)
        fprintf(stderr, "nvfp4moe quantize: %s has no MoE layers\n", in);
    nvfp4moe_model_info_free(info);
    if (quantized || !moe) return CLI_EXIT_FAILURE;
    cli_outdir od = {.tmp = ""};
    if (cli_outdir_begin("quantize", out, in, force, &od) != 0) return CLI_EXIT_FAILURE;
    nvfp4moe_quantize_options opt;
    nvfp4moe_quantize_options_init(&opt);
    opt.format = fmt;
    opt.w4a16 = w4a16;
    opt.layer = only >= 0 ? (int32_t)only : -1;
    opt.calib_tokens = calib;
    opt.seed = seed;
    if (max_shard) opt.max_shard_bytes = max_shard;
    progress_view pv = {.tty = isatty(fileno(stderr)) != 0, .t0 = cli_now_s()};
    opt.progress = on_progress;
    opt.user = &pv;
    nvfp4moe_quantize_result res;
    if (nvfp4moe_model_quantize(in, od.tmp, &opt, &res) != NVFP4MOE_OK) {
        if (pv.tty) fputc('\n', stderr);
        fprintf(stderr, "nvfp4moe quantize: %s\n", nvfp4moe_last_error());
        cli_outdir_abort(&od);
        return CLI_EXIT_FAILURE;
    }
    if (cli_outdir_commit("quantize", &od) != 0) return CLI_EXIT_FAILURE;
    char size[24];
    human_bytes((double)res.bytes, size, sizeof size);
    printf("wrote %s: %s, %s format, %d MoE layer%s quantized%s; %lld tensors (%lld quantized, %lld copied bit "
           "for bit), %s in %d shard%s; exclusion list of %d entr%s; %d other file%s copied\n",
           out, w4a16 ? "W4A16_NVFP4 (weight-only)" : "NVFP4 w4a4", nvfp4moe_ckpt_format_name(fmt), res.moe_layers,
           res.moe_layers == 1 ? "" : "s", res.expert_biases ? " (with their biases)" : "", (long long)res.tensors,
           (long long)res.tensors_quantized, (long long)res.tensors_copied, size, res.shards,
           res.shards == 1 ? "" : "s", res.excluded, res.excluded == 1 ? "y" : "ies", res.files_copied,
           res.files_copied == 1 ? "" : "s");
    return CLI_EXIT_OK;
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
    uint64_t max_shard = 0;
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
        case O_MAX_SHARD:
            if (parse_size(v, &max_shard)) return CLI_EXIT_FAILURE;
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
    if (random) return write_random(&cfg, (int32_t)layers, (int32_t)first_moe, out, force, max_shard);
    return quantize_dir(in, out, force, fmt, w4a16, only, (int32_t)calib, cfg.seed, max_shard);
}
