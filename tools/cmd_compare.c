/*
 * cmd_compare.c - `nvfp4moe compare A B`: how far output A is from output B (the reference): the
 * relative error, the largest and mean absolute differences, where they are, non-finite values,
 * and a verdict with its exit status. A and B are `run --output` files, or any tensors of the same
 * size (.safetensors, or raw values of --dtype). For two `run --output` .safetensors files it also
 * checks that both runs saw the same inputs.
 */
#include "cli.h"
#include "cli_tensor.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { O_TENSOR, O_DTYPE, O_TOLERANCE, O_JSON, O_COUNT };
static const cli_opt k_opts[O_COUNT] = {
    [O_TENSOR] = {"--tensor", "NAME", "the tensor compared in .safetensors files (default \"output\", or a\n"
                                      "file's only tensor; FILE.safetensors:NAME picks one per file)"},
    [O_DTYPE] = {"--dtype", "NAME", "the values of raw files: bf16 (default, as run writes them) | fp16 |\n"
                                    "f32"},
    [O_TOLERANCE] = {"--tolerance", "X", "the largest relative error that is still \"close\" (default 1e-2)"},
    [O_JSON] = {"--json", NULL, "print one JSON object instead of text"},
};

static void compare_usage(FILE *f) {
    fprintf(f, "usage: nvfp4moe compare A B [flags]\n\n"
               "Compares output A with output B, the reference: two files of `nvfp4moe run --output` (of the\n"
               "same layer and inputs: feed the second run the first one's file with --input and\n"
               "--router-logits), or any two tensors of the same size. Prints\n"
               "  rel err    ||A - B|| / ||B|| over the finite values (Frobenius norms)\n"
               "  max abs    the largest |A - B| and where it is; mean abs: its mean\n"
               "  cosine     A.B / (||A|| ||B||)\n"
               "  differ     how many values are not equal; NaN and Inf of each, whether in the same places\n"
               "and a verdict: identical (every value equal, non-finite ones in the same places), close (the\n"
               "relative error at most --tolerance, non-finite values in the same places) or different.\n"
               "For two run outputs it also says whether they saw the same inputs (hidden_states and the\n"
               "routing they carry).\n\n");
    cli_opts_help(f, k_opts, O_COUNT);
    fprintf(f, "  -h, --help                this text\n\n"
               "exit status: 0 identical or close, 2 different, 1 usage error or an unreadable file\n");
}

typedef struct {
    double rel, max_abs, mean_abs, cosine, norm_a, norm_b;
    int64_t max_at, differ, nonfinite_a, nonfinite_b, nonfinite_mismatch, n;
    bool identical;
} stats;

static bool same_nonfinite(float a, float b) {
    return (isnan(a) && isnan(b)) || (isinf(a) && isinf(b) && (a > 0) == (b > 0));
}

static stats measure(const float *a, const float *b, int64_t n) {
    stats s = {.n = n, .max_at = -1};
    double diff2 = 0, aa = 0, bb = 0, ab = 0, sum_abs = 0;
    int64_t finite = 0;
    for (int64_t i = 0; i < n; i++) {
        const bool fa = isfinite(a[i]), fb = isfinite(b[i]);
        s.nonfinite_a += !fa;
        s.nonfinite_b += !fb;
        if (!fa || !fb) {
            if (!same_nonfinite(a[i], b[i])) {
                s.nonfinite_mismatch++;
                s.differ++;
            }
            continue;
        }
        const double x = a[i], y = b[i], d = fabs(x - y);
        finite++;
        s.differ += x != y;
        diff2 += d * d;
        aa += x * x;
        bb += y * y;
        ab += x * y;
        sum_abs += d;
        if (d > s.max_abs || s.max_at < 0) {
            s.max_abs = d;
            s.max_at = i;
        }
    }
    s.norm_a = sqrt(aa);
    s.norm_b = sqrt(bb);
    s.rel = bb > 0 ? sqrt(diff2) / sqrt(bb) : diff2 > 0 ? INFINITY : 0;
    s.cosine = aa > 0 && bb > 0 ? ab / (sqrt(aa) * sqrt(bb)) : aa == bb ? 1 : 0;
    s.mean_abs = finite ? sum_abs / (double)finite : 0;
    s.identical = s.differ == 0;
    return s;
}

static const char *shape_str(const cli_tensor *t, char *buf, size_t len) {
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < t->ndim && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (used < len) snprintf(buf + used, len - used, "]");
    return buf;
}

/* The index i of t as "[r, c]" (its shape's coordinates) or "[i]". */
static const char *index_str(const cli_tensor *t, int64_t i, char *buf, size_t len) {
    if (t->ndim < 2) {
        snprintf(buf, len, "[%lld]", (long long)i);
        return buf;
    }
    int64_t rest = i, coord[NVFP4MOE_ST_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        coord[d] = t->shape[d] ? rest % t->shape[d] : 0;
        rest = t->shape[d] ? rest / t->shape[d] : 0;
    }
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < t->ndim && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", d ? ", " : "", (long long)coord[d]);
    if (used < len) snprintf(buf + used, len - used, "]");
    return buf;
}

static json_t *num(double x) { return isfinite(x) ? json_real(x) : json_null(); }

static json_t *file_json(const cli_tensor *t) {
    json_t *o = json_object(), *sh = json_array();
    json_object_set_new(o, "file", json_string(t->path));
    json_object_set_new(o, "tensor", t->raw ? json_null() : json_string(t->name));
    for (int d = 0; d < t->ndim; d++) json_array_append_new(sh, json_integer(t->shape[d]));
    json_object_set_new(o, "shape", sh);
    json_object_set_new(o, "dtype", json_string(nvfp4moe_st_dtype_name(t->dtype)));
    for (int i = 0; i < t->nmeta; i++) json_object_set_new(o, t->meta[i][0], json_string(t->meta[i][1]));
    return o;
}

/* Whether the two run outputs saw the same inputs: the hidden states and the routing tensor both
 * carry. *what names what was compared; returns 1 same, 0 different, -1 nothing to compare. */
static int same_inputs(const cli_tensor *a, const cli_tensor *b, char *what, size_t len) {
    what[0] = '\0';
    if (a->raw || b->raw || strcmp(a->name, "output") || strcmp(b->name, "output")) return -1;
    static const char *const names[] = {"hidden_states", "router_logits", "topk_ids", "topk_weights"};
    int compared = 0, same = 1;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char sa[1100], sb[1100];
        snprintf(sa, sizeof sa, "%s:%s", a->path, names[k]);
        snprintf(sb, sizeof sb, "%s:%s", b->path, names[k]);
        const bool ids = !strcmp(names[k], "topk_ids");
        cli_tensor ta, tb;
        /* quietly: a tensor one of them lacks is simply not compared */
        cli_tensor_quiet(true);
        const int ra = cli_tensor_read("A", sa, NULL, 0, 0, ids ? CLI_TENSOR_INT : CLI_TENSOR_FLOAT, NVFP4MOE_ST_F32,
                                       &ta);
        const int rb = ra == 0 ? cli_tensor_read("B", sb, NULL, 0, 0, ids ? CLI_TENSOR_INT : CLI_TENSOR_FLOAT,
                                                 NVFP4MOE_ST_F32, &tb) : -1;
        cli_tensor_quiet(false);
        if (ra == 0 && rb == 0) {
            bool eq = ta.numel == tb.numel && ta.ndim == tb.ndim &&
                      !memcmp(ta.shape, tb.shape, sizeof ta.shape);
            for (int64_t i = 0; eq && i < ta.numel; i++)
                eq = ids ? ta.i[i] == tb.i[i] : (ta.f[i] == tb.f[i] || same_nonfinite(ta.f[i], tb.f[i]));
            const size_t used = strlen(what);
            snprintf(what + used, len - used, "%s%s%s", compared ? ", " : "", names[k], eq ? "" : " (differ)");
            compared++;
            same &= eq;
        }
        if (ra == 0) cli_tensor_free(&ta);
        if (rb == 0) cli_tensor_free(&tb);
    }
    return compared ? same : -1;
}

int cmd_compare(int argc, char **argv) {
    const char *v = NULL, *tensor = NULL;
    nvfp4moe_dtype raw = NVFP4MOE_DTYPE_BF16;
    double tol = 1e-2;
    bool json = false;
    cli_args args;
    cli_args_init(&args, "compare", k_opts, O_COUNT, false, 2, argc, argv);
    for (int o; (o = cli_args_next(&args, &v)) != CLI_ARGS_END;) {
        switch (o) {
        case CLI_ARGS_HELP: compare_usage(stdout); return CLI_EXIT_OK;
        case CLI_ARGS_ERROR: return CLI_EXIT_FAILURE;
        case O_TENSOR: tensor = v; break;
        case O_DTYPE:
            if (nvfp4moe_dtype_parse(v, &raw) != NVFP4MOE_OK) {
                fprintf(stderr, "nvfp4moe compare: --dtype: %s\n", nvfp4moe_last_error());
                return CLI_EXIT_FAILURE;
            }
            break;
        case O_TOLERANCE:
            if (cli_parse_double("--tolerance", v, &tol)) return CLI_EXIT_FAILURE;
            if (tol < 0) {
                fprintf(stderr, "nvfp4moe compare: --tolerance %s: must be >= 0\n", v);
                return CLI_EXIT_FAILURE;
            }
            break;
        case O_JSON: json = true; break;
        }
    }
    if (args.npos != 2) {
        fprintf(stderr, "nvfp4moe compare: needs two files: nvfp4moe compare A B (B is the reference)\n\n");
        compare_usage(stderr);
        return CLI_EXIT_FAILURE;
    }
    cli_tensor t[2];
    const char *label[2] = {"A", "B"};
    for (int k = 0; k < 2; k++) {
        char spec[1400];
        const char *p = args.pos[k];
        const size_t n = strlen(p);
        /* --tensor NAME: exactly that tensor of a .safetensors file (unless the argument names one) */
        if (tensor && n >= 12 && !strcmp(p + n - 12, ".safetensors")) snprintf(spec, sizeof spec, "%s:%s", p, tensor);
        else snprintf(spec, sizeof spec, "%s", p);
        if (cli_tensor_read(label[k], spec, "output", 0, 0, CLI_TENSOR_FLOAT, cli_st_dtype(raw), &t[k]) != 0) {
            if (k) cli_tensor_free(&t[0]);
            return CLI_EXIT_FAILURE;
        }
    }
    int rc = CLI_EXIT_FAILURE;
    char sa[160], sb[160], where[1400];
    if (t[0].numel != t[1].numel ||
        (!t[0].raw && !t[1].raw && (t[0].ndim != t[1].ndim || memcmp(t[0].shape, t[1].shape, sizeof t[0].shape)))) {
        fprintf(stderr, "nvfp4moe compare: A (%s) has shape %s but B (%s) %s: not outputs of the same layer and "
                "tokens\n", cli_tensor_where(&t[0], where, sizeof where), shape_str(&t[0], sa, sizeof sa),
                t[1].path, shape_str(&t[1], sb, sizeof sb));
        goto out;
    }
    /* a raw file takes the other's shape, for the coordinates */
    const cli_tensor *shaped = !t[0].raw ? &t[0] : &t[1];
    const stats s = measure(t[0].f, t[1].f, t[0].numel);
    const bool nonfinite_ok = s.nonfinite_mismatch == 0;
    const char *verdict = s.identical ? "identical" : nonfinite_ok && s.rel <= tol ? "close" : "different";
    char inputs[200];
    const int same = same_inputs(&t[0], &t[1], inputs, sizeof inputs);
    char at[96] = "-";
    if (s.max_at >= 0) index_str(shaped, s.max_at, at, sizeof at);
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "a", file_json(&t[0]));
        json_object_set_new(o, "b", file_json(&t[1]));
        json_object_set_new(o, "values", json_integer(s.n));
        json_object_set_new(o, "rel_err", num(s.rel));
        json_object_set_new(o, "max_abs", num(s.max_abs));
        json_object_set_new(o, "max_abs_at", s.max_at >= 0 ? json_string(at) : json_null());
        json_object_set_new(o, "max_abs_a", s.max_at >= 0 ? num(t[0].f[s.max_at]) : json_null());
        json_object_set_new(o, "max_abs_b", s.max_at >= 0 ? num(t[1].f[s.max_at]) : json_null());
        json_object_set_new(o, "mean_abs", num(s.mean_abs));
        json_object_set_new(o, "cosine", num(s.cosine));
        json_object_set_new(o, "differ", json_integer(s.differ));
        json_object_set_new(o, "nonfinite_a", json_integer(s.nonfinite_a));
        json_object_set_new(o, "nonfinite_b", json_integer(s.nonfinite_b));
        json_object_set_new(o, "nonfinite_mismatch", json_integer(s.nonfinite_mismatch));
        json_object_set_new(o, "same_inputs", same < 0 ? json_null() : json_boolean(same));
        json_object_set_new(o, "inputs_compared", same < 0 ? json_null() : json_string(inputs));
        json_object_set_new(o, "tolerance", json_real(tol));
        json_object_set_new(o, "verdict", json_string(verdict));
        char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
        json_decref(o);
        if (!text) {
            fprintf(stderr, "nvfp4moe compare: out of memory\n");
            goto out;
        }
        printf("%s\n", text);
        free(text);
    } else {
        for (int k = 0; k < 2; k++) {
            const char *be = cli_tensor_meta(&t[k], "backend"), *dev = cli_tensor_meta(&t[k], "device");
            char from[160] = "";
            if (be) snprintf(from, sizeof from, " (from %s%s%s)", be, dev ? " on " : "", dev ? dev : "");
            printf("%s         %s %s %s%s\n", label[k], cli_tensor_where(&t[k], where, sizeof where),
                   shape_str(&t[k], sa, sizeof sa), nvfp4moe_st_dtype_name(t[k].dtype), from);
        }
        const char *ca = cli_tensor_meta(&t[0], "config"), *cb = cli_tensor_meta(&t[1], "config");
        if (ca && cb && strcmp(ca, cb)) printf("config    A %s, B %s\n", ca, cb);
        if (same >= 0)
            printf("inputs    %s: %s\n", same ? "the same" : "NOT the same (the outputs of different inputs)", inputs);
        if (isfinite(s.rel)) printf("rel err   %.3e  (||A - B|| / ||B||, B the reference)\n", s.rel);
        else printf("rel err   inf  (B is all zeros, A is not)\n");
        if (s.max_at >= 0 && s.max_abs > 0)
            printf("max abs   %.3e at %s (A %.6g, B %.6g)\n", s.max_abs, at, (double)t[0].f[s.max_at],
                   (double)t[1].f[s.max_at]);
        else printf("max abs   0\n");
        printf("mean abs  %.3e\n", s.mean_abs);
        printf("cosine    %.9f\n", s.cosine);
        printf("differ    %lld of %lld values (%.1f %%)\n", (long long)s.differ, (long long)s.n,
               s.n ? 100.0 * (double)s.differ / (double)s.n : 0.0);
        if (s.nonfinite_a || s.nonfinite_b)
            printf("nonfinite A %lld, B %lld, %s\n", (long long)s.nonfinite_a, (long long)s.nonfinite_b,
                   nonfinite_ok ? "in the same places" : "NOT in the same places");
        if (s.identical) printf("verdict   identical: every value is equal\n");
        else if (!strcmp(verdict, "close")) printf("verdict   close: relative error %.3e <= tolerance %g\n", s.rel, tol);
        else if (!nonfinite_ok)
            printf("verdict   different: %lld non-finite values in one file only\n", (long long)s.nonfinite_mismatch);
        else printf("verdict   different: relative error %.3e > tolerance %g\n", s.rel, tol);
    }
    rc = s.identical || !strcmp(verdict, "close") ? CLI_EXIT_OK : CLI_EXIT_DIFFERENT;
out:
    cli_tensor_free(&t[0]);
    cli_tensor_free(&t[1]);
    return rc;
}
