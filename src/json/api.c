/*
 * api.c - the JSON interface (include/nvfp4moe.h): select, checkpoint layers and plans from JSON
 * requests, for language bindings that pass strings, pointers and integers only.
 */
#include "json/json_internal.h"
#include "oracle/oracle.h"

#include <stdlib.h>
#include <string.h>

#define BAD(...) nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT, __VA_ARGS__)
#define OOM() nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory")

void nvfp4moe_json_free(char *s) { free(s); }

// ---- requests and responses ----

static nvfp4moe_status parse_request(const char *request, const char *fn, json_t **root) {
    NVFP4MOE_RETURN_IF(!request, NVFP4MOE_ERR_INVALID_ARGUMENT, "%s: request is NULL", fn);
    json_error_t err;
    json_t *r = json_loads(request, JSON_REJECT_DUPLICATES, &err);
    NVFP4MOE_RETURN_IF(!r, NVFP4MOE_ERR_INVALID_ARGUMENT, "%s: the request is not valid JSON (line %d, column %d): %s",
                       fn, err.line, err.column, err.text);
    if (!json_is_object(r)) {
        json_decref(r);
        return BAD("%s: the request must be a JSON object", fn);
    }
    *root = r;
    return NVFP4MOE_OK;
}

/* Every key of the request must be one of allowed (NULL-terminated). */
static nvfp4moe_status check_keys(json_t *root, const char *fn, const char *const *allowed) {
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        bool ok = false;
        for (int i = 0; allowed[i] && !ok; i++) ok = !strcmp(key, allowed[i]);
        if (!ok) {
            char list[512] = "";
            size_t used = 0;
            for (int i = 0; allowed[i] && used < sizeof list; i++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", allowed[i]);
            return BAD("%s: unknown request key '%s' (accepted: %s)", fn, key, list);
        }
    }
    return NVFP4MOE_OK;
}

/* A string member, NULL when absent or null. */
static nvfp4moe_status opt_string(json_t *root, const char *key, const char **out) {
    json_t *v = json_object_get(root, key);
    *out = NULL;
    if (!v || json_is_null(v)) return NVFP4MOE_OK;
    if (!json_is_string(v)) return BAD("%s: expected a string", key);
    *out = json_string_value(v);
    return NVFP4MOE_OK;
}

/* Dumps obj (taking it) into *response. */
static nvfp4moe_status respond(json_t *obj, char **response) {
    char *s = obj ? json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(obj);
    if (!s) return OOM();
    *response = s;
    return NVFP4MOE_OK;
}

json_t *json_report_object(const nvfp4moe_report *r) {
    json_t *root = json_object(), *cands = json_array();
    if (!root || !cands) {
        json_decref(root);
        json_decref(cands);
        return NULL;
    }
    int bad = 0;
    bad |= json_object_set_new(root, "backend", r->backend[0] ? json_string(r->backend) : json_null());
    bad |= json_object_set_new(root, "kernel", r->kernel[0] ? json_string(r->kernel) : json_null());
    bad |= json_object_set_new(root, "log", json_string(r->log));
    bad |= json_object_set_new(root, "device", json_string(r->device));
    bad |= json_object_set_new(root, "detail", json_string(r->detail));
    bad |= json_object_set_new(root, "vllm_revision", json_string(nvfp4moe_vllm_revision()));
    for (int i = 0; i < r->n_candidates; i++) {
        const nvfp4moe_candidate *c = &r->candidates[i];
        json_t *o = json_object();
        bad |= !o;
        if (!o) break;
        bad |= json_object_set_new(o, "backend", json_string(c->backend));
        bad |= json_object_set_new(o, "kernel", json_string(c->kernel));
        bad |= json_object_set_new(o, "supported", json_boolean(c->supported));
        bad |= json_object_set_new(o, "verdict", json_string(nvfp4moe_verdict_name(c->verdict)));
        bad |= json_object_set_new(o, "reason", json_string(c->reason));
        bad |= json_object_set_new(o, "detail", json_string(c->detail));
        bad |= json_array_append_new(cands, o);
    }
    bad |= json_object_set_new(root, "candidates", cands);
    if (r->error_kind[0]) {
        json_t *e = json_object();
        bad |= !e || json_object_set_new(e, "kind", json_string(r->error_kind)) ||
               json_object_set_new(e, "message", json_string(r->error));
        bad |= json_object_set_new(root, "error", e);
    } else {
        bad |= json_object_set_new(root, "error", json_null());
    }
    if (bad) {
        json_decref(root);
        return NULL;
    }
    return root;
}

nvfp4moe_status nvfp4moe_report_json(const nvfp4moe_report *report, char **out) {
    NVFP4MOE_RETURN_IF(!report || !out, NVFP4MOE_ERR_INVALID_ARGUMENT, "report_json: %s is NULL",
                       !report ? "report" : "out");
    json_t *o = json_report_object(report);
    char *s = o ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!s) return OOM();
    *out = s;
    return NVFP4MOE_OK;
}

static json_t *device_object(const nvfp4moe_device *d) {
    char str[32];
    json_t *o = json_object();
    if (!o) return NULL;
    int bad = json_object_set_new(o, "name", json_string(d->name));
    bad |= json_object_set_new(o, "str", json_string(nvfp4moe_device_str(d, str, sizeof str)));
    bad |= json_object_set_new(o, "is_cuda", json_boolean(d->is_cuda));
    bad |= json_object_set_new(o, "sm", json_integer(d->sm));
    bad |= json_object_set_new(o, "ordinal", json_integer(d->ordinal));
    bad |= json_object_set_new(o, "detected", json_boolean(d->detected));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

// ---- the parts every request shares ----

/* The deployment from the request's sources, in order: base (a complete config, strict), or model,
 * or hf_config (+ hf_quant_config); config (lenient); deployment (strict). Warnings of the model
 * config go to warnings. */
static nvfp4moe_status deploy_from_request(json_t *root, json_deploy *d, json_t *warnings) {
    json_deploy_init(d);
    const char *model = NULL;
    NVFP4MOE_TRY(opt_string(root, "model", &model));
    json_t *hf = json_object_get(root, "hf_config"), *hfq = json_object_get(root, "hf_quant_config");
    if (hf && json_is_null(hf)) hf = NULL;
    if (hfq && json_is_null(hfq)) hfq = NULL;
    NVFP4MOE_RETURN_IF(model && hf, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "model and hf_config are both given: one model config at a time");
    NVFP4MOE_RETURN_IF(hfq && !hf && !model, NVFP4MOE_ERR_INVALID_ARGUMENT, "hf_quant_config needs hf_config");
    NVFP4MOE_RETURN_IF(hfq && model, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "hf_quant_config goes with hf_config; a model directory's own hf_quant_config.json is read");
    NVFP4MOE_RETURN_IF(hf && !json_is_object(hf), NVFP4MOE_ERR_INVALID_ARGUMENT, "hf_config: expected an object");
    NVFP4MOE_RETURN_IF(hfq && !json_is_object(hfq), NVFP4MOE_ERR_INVALID_ARGUMENT, "hf_quant_config: expected an object");
    json_t *base = json_object_get(root, "base");
    if (base && json_is_null(base)) base = NULL;
    NVFP4MOE_RETURN_IF(base && (model || hf), NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "base and %s are both given: one model config at a time", model ? "model" : "hf_config");
    if (base) {   /* a complete config (a response's "config"): every shape key given */
        NVFP4MOE_TRY(json_deploy_apply(d, base, "base", true));
        d->given |= DEPLOY_GIVEN_MODEL;
    }
    if (model || hf) {
        nvfp4moe_model_info *info = NULL;
        nvfp4moe_status s;
        if (model) {
            s = nvfp4moe_model_info_read(model, &info);
        } else {
            char *text = json_dumps(hf, JSON_COMPACT), *qtext = hfq ? json_dumps(hfq, JSON_COMPACT) : NULL;
            s = text && (!hfq || qtext) ? nvfp4moe_model_info_parse(text, qtext, "hf_config", &info) : OOM();
            free(text);
            free(qtext);
        }
        if (s != NVFP4MOE_OK) {
            if (model) nvfp4moe_error_prefix("model");   /* the parser names hf_config itself */
            return s;
        }
        if (info->num_moe_layers == 0) {
            nvfp4moe_model_info_free(info);
            return nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT, "%s%s has no MoE layers (no expert count in its "
                                      "config)", model ? "model " : "hf_config", model ? model : "");
        }
        json_deploy_model(d, info, warnings);
        nvfp4moe_model_info_free(info);
    }
    json_t *cfg = json_object_get(root, "config"), *dep = json_object_get(root, "deployment");
    if (cfg && !json_is_null(cfg)) NVFP4MOE_TRY(json_deploy_apply(d, cfg, "config", false));
    if (dep && !json_is_null(dep)) NVFP4MOE_TRY(json_deploy_apply(d, dep, "deployment", true));
    return json_deploy_finish(d);
}

/* "installed" and "vllm_only". */
static nvfp4moe_status oracle_from_request(json_t *root, nvfp4moe_oracle_options *opt) {
    memset(opt, 0, sizeof *opt);
    json_t *inst = json_object_get(root, "installed"), *vo = json_object_get(root, "vllm_only");
    if (inst && !json_is_null(inst)) {
        char list[256] = "";
        if (json_is_string(inst)) {
            NVFP4MOE_RETURN_IF(strlen(json_string_value(inst)) >= sizeof list, NVFP4MOE_ERR_INVALID_ARGUMENT,
                               "installed: too long");
            nvfp4moe_strlcpy(list, json_string_value(inst), sizeof list);
        } else if (json_is_array(inst)) {
            size_t i, used = 0;
            json_t *e;
            json_array_foreach(inst, i, e) {
                NVFP4MOE_RETURN_IF(!json_is_string(e), NVFP4MOE_ERR_INVALID_ARGUMENT,
                                   "installed[%zu]: expected a library name (a string)", i);
                used += (size_t)snprintf(list + used, used < sizeof list ? sizeof list - used : 0, "%s%s",
                                         i ? "," : "", json_string_value(e));
                NVFP4MOE_RETURN_IF(used >= sizeof list, NVFP4MOE_ERR_INVALID_ARGUMENT, "installed: too long");
            }
        } else {
            return BAD("installed: expected a string or an array of library names");
        }
        nvfp4moe_status s = nvfp4moe_oracle_libs_parse(list, &opt->installed);
        if (s != NVFP4MOE_OK) {
            nvfp4moe_error_prefix("installed");
            return NVFP4MOE_ERR_INVALID_ARGUMENT;
        }
        opt->installed_set = true;
    }
    if (vo && !json_is_null(vo)) {
        NVFP4MOE_RETURN_IF(!json_is_boolean(vo), NVFP4MOE_ERR_INVALID_ARGUMENT, "vllm_only: expected true or false");
        opt->vllm_only = json_is_true(vo);
    }
    return NVFP4MOE_OK;
}

/* "cuda" (-1: the current device) or "cuda:N"; false when s names no CUDA device of this form. */
static bool parse_cuda_name(const char *s, int32_t *ordinal) {
    if (strncmp(s, "cuda", 4)) return false;
    if (!s[4]) {
        *ordinal = -1;
        return true;
    }
    if (s[4] != ':' || !s[5]) return false;
    long v = 0;
    for (const char *p = s + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > 1000000) return false;
        v = v * 10 + (*p - '0');
    }
    *ordinal = (int32_t)v;
    return true;
}

/* "device": for select a what-if name too; for a plan "cpu" or a CUDA GPU of this machine. */
static nvfp4moe_status device_from_request(json_t *root, bool for_plan, nvfp4moe_device *dev) {
    const char *name = NULL;
    NVFP4MOE_TRY(opt_string(root, "device", &name));
    if (!name) return nvfp4moe_device_detect(dev);
    int32_t ordinal;
    if (parse_cuda_name(name, &ordinal)) return nvfp4moe_device_detect_cuda(ordinal, dev);
    if (for_plan) {
        NVFP4MOE_RETURN_IF(strcmp(name, "cpu") != 0, NVFP4MOE_ERR_INVALID_ARGUMENT,
                           "device '%s': a layer runs on \"cpu\", \"cuda\" or \"cuda:N\" (a GPU name such as "
                           "h200 plans for that GPU: use it with select)", name);
        memset(dev, 0, sizeof *dev);
        dev->ordinal = -1;
        dev->detected = true;
        nvfp4moe_strlcpy(dev->name, "cpu", sizeof dev->name);
        return NVFP4MOE_OK;
    }
    nvfp4moe_status s = nvfp4moe_device_parse(name, dev);
    if (s != NVFP4MOE_OK) {
        nvfp4moe_error_prefix("device");
        return NVFP4MOE_ERR_INVALID_ARGUMENT;
    }
    return NVFP4MOE_OK;
}

// ---- select ----

static const char *const k_select_keys[] = {"model", "hf_config", "hf_quant_config", "config", "deployment",
                                            "device", "installed", "vllm_only", NULL};

nvfp4moe_status nvfp4moe_select_json(const char *request, char **response) {
    NVFP4MOE_RETURN_IF(!response, NVFP4MOE_ERR_INVALID_ARGUMENT, "select_json: response is NULL");
    *response = NULL;
    json_t *root = NULL, *warnings = NULL, *out = NULL;
    nvfp4moe_report *report = NULL;
    char *text = NULL;
    json_deploy d;
    nvfp4moe_oracle_options opt;
    nvfp4moe_device dev;
    nvfp4moe_status s = parse_request(request, "select_json", &root);
    if (s == NVFP4MOE_OK) s = check_keys(root, "select_json", k_select_keys);
    if (s == NVFP4MOE_OK && !(warnings = json_array())) s = OOM();
    if (s == NVFP4MOE_OK) s = deploy_from_request(root, &d, warnings);
    if (s == NVFP4MOE_OK) s = oracle_from_request(root, &opt);
    if (s == NVFP4MOE_OK) s = device_from_request(root, false, &dev);
    if (s == NVFP4MOE_OK && !(report = malloc(sizeof *report))) s = OOM();
    if (s != NVFP4MOE_OK) goto done;

    s = nvfp4moe_select(&d.cfg, &dev, &opt, report);
    if (s != NVFP4MOE_OK && !report->error_kind[0]) goto done;   /* an invalid config: no decision */
    const nvfp4moe_status decided = s;
    char saved[1024];
    nvfp4moe_strlcpy(saved, nvfp4moe_last_error(), sizeof saved);
    size_t need = nvfp4moe_report_render(report, NULL, 0);
    if (!(text = malloc(need + 1)) || !(out = json_object())) {
        s = OOM();
        goto done;
    }
    nvfp4moe_report_render(report, text, need + 1);
    int bad = json_object_set_new(out, "report", json_report_object(report));
    bad |= json_object_set_new(out, "status", json_integer(decided));
    bad |= json_object_set_new(out, "status_name", json_string(nvfp4moe_status_str(decided)));
    bad |= json_object_set_new(out, "text", json_string(text));
    bad |= json_object_set_new(out, "config", json_config_object(&d.cfg));
    bad |= json_object_set_new(out, "device", device_object(&dev));
    bad |= json_object_set_new(out, "warnings", warnings);
    warnings = NULL;
    if (bad) {
        s = OOM();
        goto done;
    }
    s = respond(out, response);
    out = NULL;
    if (s == NVFP4MOE_OK && decided != NVFP4MOE_OK) {
        nvfp4moe_set_error(decided, "%s", saved);   /* the oracle's exception stays the last error */
        s = decided;
    }
done:
    json_decref(root);
    json_decref(warnings);
    json_decref(out);
    free(report);
    free(text);
    return s;
}

// ---- tensors ----

typedef struct tensor_desc {
    bool present;
    const void *data;
    int32_t ndim;
    int64_t shape[NVFP4MOE_ST_MAX_DIMS];
    const char *dtype;
    int32_t device;          /* -1: host memory; N: CUDA device N */
} tensor_desc;

static nvfp4moe_status parse_tensor(json_t *v, const char *name, tensor_desc *t) {
    memset(t, 0, sizeof *t);
    if (!json_is_object(v)) return BAD("weights.%s: expected a tensor object {data, shape, dtype, device}", name);
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) {
        if (strcmp(key, "data") && strcmp(key, "shape") && strcmp(key, "dtype") && strcmp(key, "device"))
            return BAD("weights.%s: unknown key '%s' (accepted: data, shape, dtype, device)", name, key);
    }
    json_t *data = json_object_get(v, "data"), *shape = json_object_get(v, "shape");
    json_t *dtype = json_object_get(v, "dtype"), *dev = json_object_get(v, "device");
    NVFP4MOE_RETURN_IF(!json_is_integer(data) || json_integer_value(data) <= 0, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "weights.%s.data: expected the address of the tensor's first element (an integer > 0)", name);
    NVFP4MOE_RETURN_IF(!json_is_array(shape) || json_array_size(shape) > NVFP4MOE_ST_MAX_DIMS,
                       NVFP4MOE_ERR_INVALID_ARGUMENT, "weights.%s.shape: expected an array of at most %d sizes", name,
                       NVFP4MOE_ST_MAX_DIMS);
    NVFP4MOE_RETURN_IF(!json_is_string(dtype), NVFP4MOE_ERR_INVALID_ARGUMENT, "weights.%s.dtype: expected a string",
                       name);
    t->data = (const void *)(uintptr_t)json_integer_value(data);
    t->ndim = (int32_t)json_array_size(shape);
    for (int32_t i = 0; i < t->ndim; i++) {
        json_t *n = json_array_get(shape, (size_t)i);
        NVFP4MOE_RETURN_IF(!json_is_integer(n) || json_integer_value(n) < 0, NVFP4MOE_ERR_INVALID_ARGUMENT,
                           "weights.%s.shape[%d]: expected a size (an integer >= 0)", name, (int)i);
        t->shape[i] = json_integer_value(n);
    }
    t->dtype = json_string_value(dtype);
    t->device = -1;
    if (dev && !json_is_null(dev)) {
        NVFP4MOE_RETURN_IF(!json_is_string(dev), NVFP4MOE_ERR_INVALID_ARGUMENT, "weights.%s.device: expected a string",
                           name);
        const char *ds = json_string_value(dev);
        int32_t ord;
        if (parse_cuda_name(ds, &ord) && ord >= 0) t->device = ord;
        else if (strcmp(ds, "cpu"))
            return BAD("weights.%s.device='%s': expected \"cpu\" or \"cuda:N\"", name, ds);
    }
    t->present = true;
    return NVFP4MOE_OK;
}

typedef enum { W_PACKED, W_SCALES, W_F32 } weight_kind;

typedef struct weight_def {
    const char *name;
    size_t offset;           /* into nvfp4moe_weights */
    weight_kind kind;
} weight_def;

#define WOFF(f) offsetof(nvfp4moe_weights, f)
static const weight_def k_weights[] = {
    {"w13", WOFF(w13), W_PACKED},
    {"w13_scale", WOFF(w13_scale), W_SCALES},
    {"w13_scale_2", WOFF(w13_scale_2), W_F32},
    {"w13_input_scale", WOFF(w13_input_scale), W_F32},
    {"w2", WOFF(w2), W_PACKED},
    {"w2_scale", WOFF(w2_scale), W_SCALES},
    {"w2_scale_2", WOFF(w2_scale_2), W_F32},
    {"w2_input_scale", WOFF(w2_input_scale), W_F32},
    {"w13_bias", WOFF(w13_bias), W_F32},
    {"w2_bias", WOFF(w2_bias), W_F32},
    {"correction_bias", WOFF(correction_bias), W_F32},
    {"w13_up_scale_2", WOFF(w13_up_scale_2), W_F32},
};
enum { W_W13, W_W13_SCALE, W_W13_S2, W_W13_IN, W_W2, W_W2_SCALE, W_W2_S2, W_W2_IN, W_W13_BIAS, W_W2_BIAS, W_CORR,
       W_W13_UP_S2, W_COUNT };

static void shape_str(const int64_t *shape, int32_t ndim, char *buf, size_t len) {
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int32_t i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
}

static nvfp4moe_status check_tensor(const tensor_desc *t, const weight_def *w, const int64_t *want, int32_t ndim) {
    const char *ok1 = w->kind == W_F32 ? "f32" : "u8", *ok2 = w->kind == W_SCALES ? "f8_e4m3" : NULL;
    if (strcmp(t->dtype, ok1) && !(ok2 && !strcmp(t->dtype, ok2)))
        return BAD("weights.%s: dtype %s, expected %s%s%s", w->name, t->dtype, ok2 ? ok2 : ok1, ok2 ? " or " : "",
                   ok2 ? ok1 : "");
    bool same = t->ndim == ndim;
    for (int32_t i = 0; same && i < ndim; i++) same = t->shape[i] == want[i];
    if (!same) {
        char got[128], exp[128];
        shape_str(t->shape, t->ndim, got, sizeof got);
        shape_str(want, ndim, exp, sizeof exp);
        return BAD("weights.%s: shape %s, expected %s for this layer", w->name, got, exp);
    }
    return NVFP4MOE_OK;
}

/* Reads "weights" into t[W_COUNT]; fills the shape keys no source gave from w13 and w2, and
 * has_bias / has_correction_bias from the tensors present. */
static nvfp4moe_status weights_from_request(json_t *root, json_deploy *d, tensor_desc *t) {
    json_t *ws = json_object_get(root, "weights");
    NVFP4MOE_RETURN_IF(!ws || !json_is_object(ws), NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "weights: expected an object of tensors (w13, w13_scale, w13_scale_2, ...)");
    memset(t, 0, sizeof(tensor_desc) * W_COUNT);
    const char *key;
    json_t *v;
    json_object_foreach(ws, key, v) {
        int i = 0;
        while (i < W_COUNT && strcmp(key, k_weights[i].name)) i++;
        if (i == W_COUNT) {
            char list[256] = "";
            size_t used = 0;
            for (int j = 0; j < W_COUNT && used < sizeof list; j++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", j ? ", " : "", k_weights[j].name);
            return BAD("weights: unknown tensor '%s' (accepted: %s)", key, list);
        }
        if (json_is_null(v)) continue;
        NVFP4MOE_TRY(parse_tensor(v, key, &t[i]));
    }
    static const int required[] = {W_W13, W_W13_SCALE, W_W13_S2, W_W2, W_W2_SCALE, W_W2_S2};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        NVFP4MOE_RETURN_IF(!t[required[i]].present, NVFP4MOE_ERR_INVALID_ARGUMENT, "weights.%s is missing",
                           k_weights[required[i]].name);
    NVFP4MOE_RETURN_IF(t[W_W13].ndim != 3 || t[W_W2].ndim != 3, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "weights.%s: expected 3 dimensions ([E, %s]), got %d", t[W_W13].ndim != 3 ? "w13" : "w2",
                       t[W_W13].ndim != 3 ? "N1, H/2" : "H, I/2", (int)(t[W_W13].ndim != 3 ? t[W_W13].ndim : t[W_W2].ndim));
    nvfp4moe_config *c = &d->cfg;
    /* The shape the tensors have, where no source gave it: w13 [E, N1, H/2], w2 [E, H, I/2]. */
    if (!(d->given & DEPLOY_GIVEN_EXPERTS) && t[W_W13].shape[0] <= INT32_MAX) c->num_experts = (int32_t)t[W_W13].shape[0];
    if (!(d->given & DEPLOY_GIVEN_HIDDEN) && t[W_W2].shape[1] <= INT32_MAX) c->hidden_size = (int32_t)t[W_W2].shape[1];
    if (!(d->given & DEPLOY_GIVEN_INTER) && t[W_W2].shape[2] <= INT32_MAX / 2)
        c->intermediate_size = (int32_t)(2 * t[W_W2].shape[2]);
    const bool biases = t[W_W13_BIAS].present || t[W_W2_BIAS].present;
    if (!(d->given & DEPLOY_GIVEN_BIAS)) c->has_bias = biases;
    NVFP4MOE_RETURN_IF(c->has_bias && !(t[W_W13_BIAS].present && t[W_W2_BIAS].present), NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "weights.%s is missing (the layer has expert biases)", t[W_W13_BIAS].present ? "w2_bias" : "w13_bias");
    NVFP4MOE_RETURN_IF(!c->has_bias && biases, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "weights.%s is given, but has_bias is false", t[W_W13_BIAS].present ? "w13_bias" : "w2_bias");
    if (!(d->given & DEPLOY_GIVEN_CORR)) c->has_correction_bias = t[W_CORR].present;
    NVFP4MOE_RETURN_IF(c->has_correction_bias && !t[W_CORR].present, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "weights.correction_bias is missing (has_correction_bias is true)");
    return NVFP4MOE_OK;
}

/* Checks every tensor against the (validated) config and fills w. *device: -1 host, N CUDA. */
static nvfp4moe_status weights_check(const nvfp4moe_config *c, tensor_desc *t, nvfp4moe_weights *w, int32_t *device) {
    const int64_t E = c->num_experts, H = c->hidden_size, I = c->intermediate_size, N1 = nvfp4moe_config_n1(c);
    const bool a4 = c->scheme != NVFP4MOE_SCHEME_W4A16;
    const int64_t shapes[W_COUNT][3] = {
        [W_W13] = {E, N1, H / 2}, [W_W13_SCALE] = {E, N1, H / 16}, [W_W13_S2] = {E}, [W_W13_IN] = {E},
        [W_W2] = {E, H, I / 2},   [W_W2_SCALE] = {E, H, I / 16},   [W_W2_S2] = {E},  [W_W2_IN] = {E},
        [W_W13_BIAS] = {E, N1},   [W_W2_BIAS] = {E, H},            [W_CORR] = {E},
        [W_W13_UP_S2] = {E},
    };
    static const int32_t ndims[W_COUNT] = {3, 3, 1, 1, 3, 3, 1, 1, 2, 2, 1, 1};
    if (a4) {
        NVFP4MOE_RETURN_IF(!t[W_W13_IN].present || !t[W_W2_IN].present, NVFP4MOE_ERR_INVALID_ARGUMENT,
                           "weights.%s is missing (scheme %s quantizes the activations)",
                           !t[W_W13_IN].present ? "w13_input_scale" : "w2_input_scale", nvfp4moe_scheme_name(c->scheme));
    }
    memset(w, 0, sizeof *w);
    *device = -2;
    for (int i = 0; i < W_COUNT; i++) {
        if (!t[i].present) continue;
        /* not used by this config: input scales of W4A16, a correction bias switched off */
        if ((!a4 && (i == W_W13_IN || i == W_W2_IN)) || (i == W_CORR && !c->has_correction_bias)) continue;
        NVFP4MOE_TRY(check_tensor(&t[i], &k_weights[i], shapes[i], ndims[i]));
        if (*device == -2) *device = t[i].device;
        if (t[i].device != *device)
            return BAD("weights.%s is in %s memory, the other weights in %s memory: give them all in one place",
                       k_weights[i].name, t[i].device < 0 ? "host" : "CUDA", *device < 0 ? "host" : "CUDA");
        *(const void **)(void *)((char *)w + k_weights[i].offset) = t[i].data;
    }
    return NVFP4MOE_OK;
}

// ---- plans ----

static const char *const k_plan_keys[] = {"base", "model", "hf_config", "hf_quant_config", "config", "deployment",
                                          "device", "installed", "vllm_only", "weights", "num_threads", NULL};

nvfp4moe_status nvfp4moe_plan_create_json(const char *request, nvfp4moe_plan **out, char **response) {
    NVFP4MOE_RETURN_IF(!out || !response, NVFP4MOE_ERR_INVALID_ARGUMENT, "plan_create_json: %s is NULL",
                       !out ? "out" : "response");
    *out = NULL;
    *response = NULL;
    json_t *root = NULL, *o = NULL;
    nvfp4moe_report *report = NULL;
    nvfp4moe_plan *plan = NULL;
    json_deploy d;
    nvfp4moe_oracle_options opt;
    nvfp4moe_device dev;
    tensor_desc t[W_COUNT];
    nvfp4moe_weights w;
    int32_t wdev = -1;
    nvfp4moe_status s = parse_request(request, "plan_create_json", &root);
    if (s == NVFP4MOE_OK) s = check_keys(root, "plan_create_json", k_plan_keys);
    if (s == NVFP4MOE_OK) s = deploy_from_request(root, &d, NULL);
    if (s == NVFP4MOE_OK) s = oracle_from_request(root, &opt);
    if (s == NVFP4MOE_OK) s = weights_from_request(root, &d, t);
    if (s == NVFP4MOE_OK && !(d.given & DEPLOY_GIVEN_TOP_K))
        s = BAD("top_k is not given: pass the model's experts per token (top_k, or num_experts_per_tok)");
    if (s == NVFP4MOE_OK) s = nvfp4moe_config_validate(&d.cfg);
    if (s == NVFP4MOE_OK) s = weights_check(&d.cfg, t, &w, &wdev);
    if (s == NVFP4MOE_OK) s = device_from_request(root, true, &dev);
    int32_t threads = 0;
    json_t *nt = json_object_get(root, "num_threads");
    if (s == NVFP4MOE_OK && nt && !json_is_null(nt)) {
        if (!json_is_integer(nt) || json_integer_value(nt) < 0 || json_integer_value(nt) > 4096)
            s = BAD("num_threads: expected an integer in [0, 4096] (0: the default)");
        else
            threads = (int32_t)json_integer_value(nt);
    }
    if (s == NVFP4MOE_OK && wdev >= 0 && (!dev.is_cuda || dev.ordinal != wdev)) {
        char where[32] = "cpu";
        if (dev.is_cuda) snprintf(where, sizeof where, "cuda:%d", (int)dev.ordinal);
        s = BAD("the weights are in the memory of cuda:%d, but the layer is to run on %s", (int)wdev, where);
    }
    if (s == NVFP4MOE_OK && !(report = malloc(sizeof *report))) s = OOM();
    if (s != NVFP4MOE_OK) goto done;

    nvfp4moe_plan_options po = {.device = &dev, .weights_on_device = wdev >= 0, .oracle = &opt, .num_threads = threads};
    if (d.cfg.lora || d.cfg.parallel.ep_size > 1) {
        /* what a plan cannot be whatever the oracle says: nvfp4moe_plan_create's own message */
        s = nvfp4moe_plan_create(&d.cfg, &w, &po, &plan);
        if (s == NVFP4MOE_OK) s = nvfp4moe_set_error(NVFP4MOE_ERR_INTERNAL, "plan_create_json: a LoRA or EP plan");
        goto done;
    }
    /* The decision first: an exception of the oracle comes back with its report. */
    s = nvfp4moe_select(&d.cfg, &dev, &opt, report);
    if (s != NVFP4MOE_OK) {
        if (report->error_kind[0]) {
            char saved[1024];
            snprintf(saved, sizeof saved, "%s: %s", report->error_kind, report->error);
            json_t *r = json_object();
            if (r && !json_object_set_new(r, "report", json_report_object(report)) && respond(r, response) == NVFP4MOE_OK)
                r = NULL;
            json_decref(r);
            nvfp4moe_set_error(s, "%s", saved);
        }
        goto done;
    }
    const nvfp4moe_backend_impl *impl = nvfp4moe_backend_impl_find(report->backend);
    if (impl && !impl->device_memory && wdev >= 0) {
        s = BAD("the weights are in CUDA memory, but %s runs on the host: give host weights (or another backend)",
                report->backend);
        goto done;
    }
    if ((s = nvfp4moe_plan_create(&d.cfg, &w, &po, &plan)) != NVFP4MOE_OK) goto done;

    if (!(o = json_object())) {
        s = OOM();
        goto done;
    }
    int bad = json_object_set_new(o, "backend", json_string(nvfp4moe_plan_backend(plan)));
    bad |= json_object_set_new(o, "kernel", json_string(nvfp4moe_plan_kernel(plan)));
    bad |= json_object_set_new(o, "device_memory", json_boolean(nvfp4moe_plan_uses_device_memory(plan)));
    bad |= json_object_set_new(o, "effective_scheme", json_string(nvfp4moe_scheme_name(nvfp4moe_plan_effective_scheme(plan))));
    bad |= json_object_set_new(o, "config", json_config_object(&d.cfg));
    bad |= json_object_set_new(o, "device", device_object(&dev));
    bad |= json_object_set_new(o, "report", json_report_object(nvfp4moe_plan_report(plan)));
    if (bad) {
        s = OOM();
        goto done;
    }
    s = respond(o, response);
    o = NULL;
    if (s == NVFP4MOE_OK) {
        *out = plan;
        plan = NULL;
    }
done:
    nvfp4moe_plan_destroy(plan);
    json_decref(root);
    json_decref(o);
    free(report);
    return s;
}

// ---- checkpoint layers ----

static json_t *tensor_object(const void *data, const int64_t *shape, int32_t ndim, const char *dtype) {
    json_t *o = json_object(), *sh = json_array();
    if (!o || !sh) {
        json_decref(o);
        json_decref(sh);
        return NULL;
    }
    int bad = 0;
    for (int32_t i = 0; i < ndim; i++) bad |= json_array_append_new(sh, json_integer(shape[i]));
    bad |= json_object_set_new(o, "data", json_integer((json_int_t)(uintptr_t)data));
    bad |= json_object_set_new(o, "shape", sh);
    bad |= json_object_set_new(o, "dtype", json_string(dtype));
    bad |= json_object_set_new(o, "device", json_string("cpu"));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static const char *const k_ckpt_keys[] = {"path", "layer", NULL};

nvfp4moe_status nvfp4moe_ckpt_layer_load_json(const char *request, nvfp4moe_ckpt_layer **out, char **response) {
    NVFP4MOE_RETURN_IF(!out || !response, NVFP4MOE_ERR_INVALID_ARGUMENT, "ckpt_layer_load_json: %s is NULL",
                       !out ? "out" : "response");
    *out = NULL;
    *response = NULL;
    json_t *root = NULL, *o = NULL;
    nvfp4moe_ckpt_layer *l = NULL;
    const char *path = NULL;
    nvfp4moe_status s = parse_request(request, "ckpt_layer_load_json", &root);
    if (s == NVFP4MOE_OK) s = check_keys(root, "ckpt_layer_load_json", k_ckpt_keys);
    if (s == NVFP4MOE_OK) s = opt_string(root, "path", &path);
    if (s == NVFP4MOE_OK && !path) s = BAD("path: the model directory is missing");
    if (s != NVFP4MOE_OK) goto done;
    json_t *lv = json_object_get(root, "layer");
    int32_t layer = -1;
    if (lv && !json_is_null(lv)) {
        if (!json_is_integer(lv) || json_integer_value(lv) < 0 || json_integer_value(lv) > INT32_MAX) {
            s = BAD("layer: expected a decoder layer number (an integer >= 0) or null");
            goto done;
        }
        layer = (int32_t)json_integer_value(lv);
    } else {
        nvfp4moe_model_info *info = NULL;
        if ((s = nvfp4moe_model_info_read(path, &info)) != NVFP4MOE_OK) goto done;
        layer = info->first_moe_layer;
        nvfp4moe_model_info_free(info);
        if (layer < 0) {
            s = BAD("%s has no MoE layers", path);
            goto done;
        }
    }
    if ((s = nvfp4moe_ckpt_layer_load(path, layer, &l)) != NVFP4MOE_OK) goto done;

    const nvfp4moe_config *c = &l->layer.cfg;
    const nvfp4moe_weights *w = &l->layer.w;
    const int64_t E = c->num_experts, H = c->hidden_size, I = c->intermediate_size, N1 = nvfp4moe_config_n1(c);
    const int64_t sh[W_COUNT][3] = {
        [W_W13] = {E, N1, H / 2}, [W_W13_SCALE] = {E, N1, H / 16}, [W_W13_S2] = {E}, [W_W13_IN] = {E},
        [W_W2] = {E, H, I / 2},   [W_W2_SCALE] = {E, H, I / 16},   [W_W2_S2] = {E},  [W_W2_IN] = {E},
        [W_W13_BIAS] = {E, N1},   [W_W2_BIAS] = {E, H},            [W_CORR] = {E},
        [W_W13_UP_S2] = {E},
    };
    static const int32_t ndims[W_COUNT] = {3, 3, 1, 1, 3, 3, 1, 1, 2, 2, 1, 1};
    json_t *tensors = json_object(), *warn = json_array();
    o = json_object();
    int bad = !tensors || !warn || !o;
    for (int i = 0; !bad && i < W_COUNT; i++) {
        const void *p = *(const void *const *)(const void *)((const char *)w + k_weights[i].offset);
        if (!p) continue;
        const char *dt = k_weights[i].kind == W_PACKED ? "u8" : k_weights[i].kind == W_SCALES ? "f8_e4m3" : "f32";
        bad |= json_object_set_new(tensors, k_weights[i].name, tensor_object(p, sh[i], ndims[i], dt));
    }
    const int64_t rsh[2] = {E, H};
    for (int32_t i = 0; warn && i < l->warnings.count; i++) bad |= json_array_append_new(warn, json_string(l->warnings.text[i]));
    if (!bad) {
        bad |= json_object_set_new(o, "index", json_integer(l->index));
        bad |= json_object_set_new(o, "format", json_string(nvfp4moe_ckpt_format_name(l->format)));
        bad |= json_object_set_new(o, "config", json_config_object(c));
        bad |= json_object_set_new(o, "tensors", tensors);
        tensors = NULL;
        bad |= json_object_set_new(o, "router", l->router ? tensor_object(l->router, rsh, 2, "f32") : json_null());
        bad |= json_object_set_new(o, "router_bias", l->router_bias ? tensor_object(l->router_bias, rsh, 1, "f32") : json_null());
        bad |= json_object_set_new(o, "router_name", json_string(l->router_name));
        bad |= json_object_set_new(o, "warnings", warn);
        warn = NULL;
    }
    json_decref(tensors);
    json_decref(warn);
    if (bad) {
        s = OOM();
        goto done;
    }
    s = respond(o, response);
    o = NULL;
    if (s == NVFP4MOE_OK) {
        *out = l;
        l = NULL;
    }
done:
    nvfp4moe_ckpt_layer_free(l);
    json_decref(root);
    json_decref(o);
    return s;
}
