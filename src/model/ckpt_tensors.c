/*
 * ckpt_tensors.c - a layer's tensors in a model directory: finding the layer and its format,
 * typed access with messages that name the file and the tensor, the router, and the owning
 * containers the loaders fill.
 */
#include "model/ckpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


// ---- tensor access ----

/* One value of a float dtype (F32, F64, BF16, F16) at p, as float. */
static float float_at(nvfp4moe_st_dtype dt, const uint8_t *p) {
    switch (dt) {
    case NVFP4MOE_ST_F32: {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    case NVFP4MOE_ST_F64: {
        double v;
        memcpy(&v, p, 8);
        return (float)v;
    }
    case NVFP4MOE_ST_BF16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return nvfp4moe_bf16_to_float(v);
    }
    default: {
        uint16_t v;
        memcpy(&v, p, 2);
        return nvfp4moe_fp16_to_float(v);
    }
    }
}

nvfp4moe_status nvfp4moe_ckpt_read_floats(const nvfp4moe_st_tensor *t, int64_t first, int64_t n, float *dst) {
    NVFP4MOE_RETURN_IF(!nvfp4moe_ckpt_is_float_dtype(t->dtype), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': dtype %s, expected a float type", t->file, t->name,
                       nvfp4moe_st_dtype_name(t->dtype));
    const int64_t esz = nvfp4moe_st_dtype_bits(t->dtype) / 8;
    uint8_t buf[4096];
    const int64_t per = (int64_t)sizeof buf / esz;
    for (int64_t i = 0; i < n; i += per) {
        const int64_t k = n - i < per ? n - i : per;
        NVFP4MOE_TRY(nvfp4moe_st_tensor_read(t, (uint64_t)((first + i) * esz), (uint64_t)(k * esz), buf));
        for (int64_t j = 0; j < k; j++) dst[i + j] = float_at(t->dtype, buf + j * esz);
    }
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_ckpt_read_rows(const nvfp4moe_st_tensor *t, int64_t rows, int64_t row_bytes, uint8_t *dst,
                                        int64_t dst_stride) {
    if (dst_stride == row_bytes) return nvfp4moe_st_tensor_read(t, 0, (uint64_t)(rows * row_bytes), dst);
    // Scattered rows (gpt-oss's interleaved gate/up): through a bounded scratch buffer.
    const int64_t per = row_bytes >= (1 << 20) ? 1 : (1 << 20) / row_bytes;
    uint8_t *buf = malloc((size_t)((per < rows ? per : rows) * row_bytes));
    NVFP4MOE_RETURN_IF(!buf, NVFP4MOE_ERR_OUT_OF_MEMORY, "%s: tensor '%s': out of memory", t->file, t->name);
    nvfp4moe_status s = NVFP4MOE_OK;
    for (int64_t r = 0; r < rows && s == NVFP4MOE_OK; r += per) {
        const int64_t k = rows - r < per ? rows - r : per;
        s = nvfp4moe_st_tensor_read(t, (uint64_t)(r * row_bytes), (uint64_t)(k * row_bytes), buf);
        for (int64_t j = 0; j < k && s == NVFP4MOE_OK; j++)
            memcpy(dst + (r + j) * dst_stride, buf + j * row_bytes, (size_t)row_bytes);
    }
    free(buf);
    return s;
}

bool nvfp4moe_ckpt_is_float_dtype(nvfp4moe_st_dtype d) {
    return d == NVFP4MOE_ST_F32 || d == NVFP4MOE_ST_F64 || d == NVFP4MOE_ST_BF16 ||
           d == NVFP4MOE_ST_F16;
}

static void shape_str(const nvfp4moe_st_tensor *t, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int32_t i = 0; i < t->ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
}

/* Flat element i of t as an index in its shape: "[2, 17, 3]". */
static void index_str(const nvfp4moe_st_tensor *t, int64_t i, char *buf, size_t len) {
    int64_t idx[NVFP4MOE_ST_MAX_DIMS];
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        idx[d] = t->shape[d] ? i % t->shape[d] : 0;
        i = t->shape[d] ? i / t->shape[d] : 0;
    }
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int32_t d = 0; d < t->ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)idx[d]);
    if (n < len) snprintf(buf + n, len - n, "]");
}

nvfp4moe_status nvfp4moe_ckpt_check_scales(const nvfp4moe_st_tensor *t) {
    uint8_t buf[16384];
    for (uint64_t off = 0; off < t->nbytes; off += sizeof buf) {
        const uint64_t k = t->nbytes - off < sizeof buf ? t->nbytes - off : sizeof buf;
        NVFP4MOE_TRY(nvfp4moe_st_tensor_read(t, off, k, buf));
        for (uint64_t j = 0; j < k; j++) {
            if ((buf[j] & 0x7F) != 0x7F) continue;
            char at[160];
            index_str(t, (int64_t)(off + j), at, sizeof at);
            return nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT,
                                      "%s: tensor '%s': block scale %s is NaN (E4M3 code 0x%02X)", t->file,
                                      t->name, at, buf[j]);
        }
    }
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_ckpt_check_finite(const nvfp4moe_st_tensor *t) {
    float buf[1024];
    for (int64_t i = 0; i < t->numel; i += 1024) {
        const int64_t k = t->numel - i < 1024 ? t->numel - i : 1024;
        NVFP4MOE_TRY(nvfp4moe_ckpt_read_floats(t, i, k, buf));
        for (int64_t j = 0; j < k; j++) {
            if (isfinite(buf[j])) continue;
            char at[160];
            index_str(t, i + j, at, sizeof at);
            return nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT, "%s: tensor '%s': element %s is %g, not a finite number",
                                      t->file, t->name, at, (double)buf[j]);
        }
    }
    return NVFP4MOE_OK;
}

bool nvfp4moe_ckpt_shape_is(const nvfp4moe_st_tensor *t, int32_t ndim, const int64_t *dims) {
    if (t->ndim != ndim) return false;
    for (int32_t i = 0; i < ndim; i++)
        if (t->shape[i] != dims[i]) return false;
    return true;
}

/* The tensor base+suffix, or NOT_FOUND naming it. */
nvfp4moe_status nvfp4moe_ckpt_need(const load_ctx *c, const char *suffix, const nvfp4moe_st_tensor **out) {
    char name[320];
    snprintf(name, sizeof name, "%s%s", c->base, suffix);
    *out = nvfp4moe_st_model_find(c->tensors, name);
    NVFP4MOE_RETURN_IF(!*out, NVFP4MOE_ERR_NOT_FOUND, "%s: layer %d: tensor '%s' not found",
                       c->where, c->layer, name);
    return NVFP4MOE_OK;
}

const nvfp4moe_st_tensor *nvfp4moe_ckpt_maybe(const load_ctx *c, const char *suffix) {
    char name[320];
    snprintf(name, sizeof name, "%s%s", c->base, suffix);
    return nvfp4moe_st_model_find(c->tensors, name);
}

nvfp4moe_status nvfp4moe_ckpt_bad_shape(const nvfp4moe_st_tensor *t, const char *want) {
    char got[128];
    shape_str(t, got, sizeof got);
    return nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT, "%s: tensor '%s': shape %s, expected %s",
                              t->file, t->name, got, want);
}

nvfp4moe_status nvfp4moe_ckpt_want_dtype(const nvfp4moe_st_tensor *t, nvfp4moe_st_dtype a,
                                         nvfp4moe_st_dtype b) {
    NVFP4MOE_RETURN_IF(t->dtype != a && t->dtype != b, NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': dtype %s, expected %s", t->file, t->name,
                       nvfp4moe_st_dtype_name(t->dtype), nvfp4moe_st_dtype_name(a));
    return NVFP4MOE_OK;
}

/* A per-tensor scale: one float value (shape [] or [1]). */
nvfp4moe_status nvfp4moe_ckpt_scalar(const nvfp4moe_st_tensor *t, float *v) {
    NVFP4MOE_RETURN_IF(!nvfp4moe_ckpt_is_float_dtype(t->dtype), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': dtype %s, expected F32", t->file, t->name,
                       nvfp4moe_st_dtype_name(t->dtype));
    if (t->numel != 1) return nvfp4moe_ckpt_bad_shape(t, "[] or [1] (one value)");
    return nvfp4moe_ckpt_read_floats(t, 0, 1, v);
}

/* A global scale must be finite and positive to mean anything; reciprocal for compressed-tensors. */
nvfp4moe_status nvfp4moe_ckpt_global_scale(const nvfp4moe_st_tensor *t, float v, bool reciprocal,
                                           float *out) {
    NVFP4MOE_RETURN_IF(!isfinite(v) || !(v > 0), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': value %g must be finite and > 0", t->file, t->name,
                       (double)v);
    float r = reciprocal ? 1.0f / v : v;
    NVFP4MOE_RETURN_IF(!isfinite(r) || !(r > 0), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': reciprocal of %g is not a usable scale", t->file, t->name,
                       (double)v);
    *out = r;
    return NVFP4MOE_OK;
}

void nvfp4moe_ckpt_expert_suffix(const load_ctx *c, int32_t e, const char *proj, const char *leaf, char *buf,
                                 size_t len) {
    if (c->proj_first) snprintf(buf, len, "experts.%s.%d.%s", proj, e, leaf);
    else snprintf(buf, len, "experts.%d.%s.%s", e, proj, leaf);
}

/* Canonical w13 row of element i of a half (0 gate, 1 up). Gated activations stack gate then up,
 * except swigluoai, which interleaves them as gpt-oss does; non-gated ones only have "up". */
int64_t nvfp4moe_ckpt_w13_row(const nvfp4moe_config *cfg, int half, int64_t i) {
    if (!nvfp4moe_activation_is_gated(cfg->activation)) return i;
    if (cfg->activation == NVFP4MOE_ACT_SWIGLUOAI) return 2 * i + half;
    return (int64_t)half * cfg->intermediate_size + i;
}

// ---- expert biases ----

/* Whether a layer has expert biases: every one the layout names (fused
 * experts.{gate_up,down}_proj_bias; per expert experts.E.{gate,up,down}_proj.bias) or none, else
 * NOT_FOUND naming the first missing one, so no bias is dropped or half-applied. */
nvfp4moe_status nvfp4moe_ckpt_bias_presence(const load_ctx *c, bool fused, bool *has) {
    const bool gated = nvfp4moe_activation_is_gated(c->cfg.activation);
    const nvfp4moe_st_tensor *present = NULL;
    char suf[160], missing[320] = "";
    const int32_t E = fused ? 1 : c->cfg.num_experts;
    for (int32_t e = 0; e < E; e++) {
        for (int p = fused || gated ? 0 : 1; p < 3; p++) {
            if (fused && p == 2) break;
            if (fused) snprintf(suf, sizeof suf, "experts.%s_bias", p ? "down_proj" : "gate_up_proj");
            else nvfp4moe_ckpt_expert_suffix(c, e, p == 0 ? c->gate : p == 1 ? c->up : c->down, "bias", suf,
                                             sizeof suf);
            const nvfp4moe_st_tensor *t = nvfp4moe_ckpt_maybe(c, suf);
            if (t && !present) present = t;
            if (!t && !missing[0]) snprintf(missing, sizeof missing, "%s%s", c->base, suf);
        }
    }
    NVFP4MOE_RETURN_IF(present && missing[0], NVFP4MOE_ERR_NOT_FOUND,
                       "%s: layer %d: tensor '%s' not found ('%s' is present: expert biases must "
                       "be given for every projection and expert, or for none)",
                       c->where, c->layer, missing, present->name);
    *has = present != NULL;
    return NVFP4MOE_OK;
}

// ---- router and correction bias ----

nvfp4moe_status nvfp4moe_ckpt_load_router(load_ctx *c, nvfp4moe_ckpt_layer *out) {
    const int64_t E = c->cfg.num_experts, H = c->cfg.hidden_size;
    c->router_t = c->router_bias_t = NULL;
    // gpt-oss names it mlp.router; the name is kept so a writer can use the same one.
    const char *rname = "gate";
    const nvfp4moe_st_tensor *r = nvfp4moe_ckpt_maybe(c, "gate.weight");
    if (!r) r = nvfp4moe_ckpt_maybe(c, "router.weight"), rname = "router";
    if (r) {
        if (!nvfp4moe_ckpt_is_float_dtype(r->dtype)) {
            nvfp4moe_warn(c->warn, "layer %d: router '%s' is %s, not a float type: not loaded "
                          "(routing needs logits given some other way)", c->layer, r->name,
                          nvfp4moe_st_dtype_name(r->dtype));
        } else {
            int64_t dims[2] = {E, H};
            char want[64];
            snprintf(want, sizeof want, "[%lld, %lld] (experts, hidden)", (long long)E,
                     (long long)H);
            if (!nvfp4moe_ckpt_shape_is(r, 2, dims)) return nvfp4moe_ckpt_bad_shape(r, want);
            out->router_dtype = r->dtype;
            out->has_router = true;
            c->router_found = true;
            c->router_t = r;
            nvfp4moe_strlcpy(out->router_name, rname, sizeof out->router_name);
            if (!c->check_only) {
                NVFP4MOE_TRY(nvfp4moe_ckpt_read_floats(r, 0, E * H, c->st->router));
                out->router = c->st->router;
            }
        }
    }
    // gpt-oss's router is a Linear with a bias: logits = hidden @ weight^T + bias.
    const nvfp4moe_st_tensor *rb = nvfp4moe_ckpt_maybe(c, "gate.bias");
    if (!rb) rb = nvfp4moe_ckpt_maybe(c, "router.bias");
    if (rb && !c->router_t) {
        nvfp4moe_warn(c->warn, "layer %d: router bias '%s' without a usable router weight: not "
                      "loaded", c->layer, rb->name);
    } else if (rb) {
        NVFP4MOE_RETURN_IF(!nvfp4moe_ckpt_is_float_dtype(rb->dtype), NVFP4MOE_ERR_FORMAT,
                           "%s: tensor '%s': dtype %s, expected a float type", rb->file, rb->name,
                           nvfp4moe_st_dtype_name(rb->dtype));
        int64_t dims[1] = {E};
        char want[48];
        snprintf(want, sizeof want, "[%lld] (experts)", (long long)E);
        if (!nvfp4moe_ckpt_shape_is(rb, 1, dims)) return nvfp4moe_ckpt_bad_shape(rb, want);
        out->has_router_bias = true;
        c->router_bias_t = rb;
        if (!c->check_only) {
            NVFP4MOE_TRY(nvfp4moe_ckpt_read_floats(rb, 0, E, c->st->router_bias));
            out->router_bias = c->st->router_bias;
        }
    }
    const nvfp4moe_st_tensor *b = nvfp4moe_ckpt_maybe(c, "gate.e_score_correction_bias");
    if (!b) b = nvfp4moe_ckpt_maybe(c, "e_score_correction_bias");
    const bool uses_bias = c->cfg.routing == NVFP4MOE_ROUTING_DEEPSEEK_V3 ||
                           c->cfg.routing == NVFP4MOE_ROUTING_MINIMAX2;
    if (b && !uses_bias) {
        nvfp4moe_warn(c->warn, "layer %d: '%s' is present but routing %s takes no correction "
                      "bias: ignored", c->layer, b->name, nvfp4moe_routing_name(c->cfg.routing));
        b = NULL;
    }
    if (!b && c->cfg.has_correction_bias) {
        return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND,
                                  "%s: layer %d: tensor '%sgate.e_score_correction_bias' not found "
                                  "(the config's routing uses a correction bias)",
                                  c->where, c->layer, c->base);
    }
    c->cfg.has_correction_bias = b != NULL;
    if (b) {
        int64_t dims[1] = {E};
        char want[32];
        snprintf(want, sizeof want, "[%lld]", (long long)E);
        if (!nvfp4moe_ckpt_is_float_dtype(b->dtype) || !nvfp4moe_ckpt_shape_is(b, 1, dims)) return nvfp4moe_ckpt_bad_shape(b, want);
        NVFP4MOE_TRY(nvfp4moe_ckpt_check_finite(b));
        if (!c->check_only) NVFP4MOE_TRY(nvfp4moe_ckpt_read_floats(b, 0, E, c->st->correction_bias));
    }
    return NVFP4MOE_OK;
}

// ---- finding the layer ----

/* The directory of the model's first file: what messages name. */
void nvfp4moe_ckpt_model_where(const nvfp4moe_st_model *m, char *buf, size_t len) {
    const nvfp4moe_st_file *f = nvfp4moe_st_model_file(m, 0);
    nvfp4moe_strlcpy(buf, f ? nvfp4moe_st_file_path(f) : "model", len);
    char *slash = strrchr(buf, '/');
    if (slash && slash != buf) *slash = '\0';
}

static const char *const k_prefixes[] = {"model.layers", "language_model.model.layers",
                                         "model.language_model.layers", NULL};
static const char *const k_modules[] = {"mlp", "feed_forward", "block_sparse_moe", NULL};

/* True when some tensor name starts with prefix. */
static bool has_prefix(const nvfp4moe_st_model *m, const char *prefix) {
    size_t i = nvfp4moe_st_model_lower_bound(m, prefix);
    const nvfp4moe_st_tensor *t = nvfp4moe_st_model_tensor(m, i);
    return t && !strncmp(t->name, prefix, strlen(prefix));
}

/* Sets c->base to the layer's MoE module ("model.layers.3.mlp."), or NOT_FOUND. The config's
 * prefix is tried first, then every one of k_prefixes. */
nvfp4moe_status nvfp4moe_ckpt_find_layer(load_ctx *c) {
    char probe[256];
    const char *first = c->info ? c->info->prefix : NULL;
    const int n_prefixes = (int)(sizeof k_prefixes / sizeof k_prefixes[0]) - 1;
    for (int p = -1; p < n_prefixes; p++) {
        const char *pre = p < 0 ? first : k_prefixes[p];
        if (!pre || !*pre) continue;
        for (int m = 0; k_modules[m]; m++) {
            snprintf(probe, sizeof probe, "%s.%d.%s.experts.", pre, c->layer, k_modules[m]);
            if (has_prefix(c->tensors, probe)) {
                snprintf(c->base, sizeof c->base, "%s.%d.%s.", pre, c->layer, k_modules[m]);
                return NVFP4MOE_OK;
            }
        }
    }
    char tried[256] = "";
    size_t n = 0;
    for (int p = -1; p < n_prefixes && n < sizeof tried; p++) {
        const char *pre = p < 0 ? first : k_prefixes[p];
        if (!pre || !*pre || (p >= 0 && first && !strcmp(pre, first))) continue;
        n += (size_t)snprintf(tried + n, sizeof tried - n, "%s%s", n ? "," : "", pre);
    }
    return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND,
                              "%s: layer %d: no expert tensors (looked for "
                              "{%s}.%d.{mlp,feed_forward,block_sparse_moe}.experts.*)",
                              c->where, c->layer, tried, c->layer);
}

/* What the layer's tensors are: sets *fmt, *quantized, and the projection names. */
nvfp4moe_status nvfp4moe_ckpt_detect_format(load_ctx *c, nvfp4moe_ckpt_format *fmt, bool *quantized) {
    const nvfp4moe_st_tensor *t = nvfp4moe_ckpt_maybe(c, "experts.gate_up_proj");
    if (!t) t = nvfp4moe_ckpt_maybe(c, "experts.down_proj");
    if (t) {
        *fmt = NVFP4MOE_CKPT_MODELOPT_FUSED;
        *quantized = t->dtype == NVFP4MOE_ST_U8;
        c->gate = "gate_proj", c->up = "up_proj", c->down = "down_proj";
        return NVFP4MOE_OK;
    }
    // Per-expert tensors: Hugging Face's projection names or Mixtral's, the expert index first
    // (experts.0.up_proj) or, as ModelOpt writes Qwen3-VL-MoE, second (experts.up_proj.0).
    static const char *const k_names[][3] = {{"gate_proj", "up_proj", "down_proj"},
                                             {"w1", "w3", "w2"}};
    char suf[96];
    for (int order = 0; order < 2; order++) {
        c->proj_first = order == 1;
        for (int n = 0; n < 2; n++) {
            const char *up = k_names[n][1];
            nvfp4moe_ckpt_expert_suffix(c, 0, up, "weight_packed", suf, sizeof suf);
            if (nvfp4moe_ckpt_maybe(c, suf)) {
                *fmt = NVFP4MOE_CKPT_COMPRESSED_TENSORS;
                *quantized = true;
            } else {
                nvfp4moe_ckpt_expert_suffix(c, 0, up, "weight", suf, sizeof suf);
                if (!(t = nvfp4moe_ckpt_maybe(c, suf))) continue;
                *quantized = t->dtype == NVFP4MOE_ST_U8;
                *fmt = *quantized ? NVFP4MOE_CKPT_MODELOPT : NVFP4MOE_CKPT_UNQUANTIZED;
            }
            c->gate = k_names[n][0], c->up = k_names[n][1], c->down = k_names[n][2];
            return NVFP4MOE_OK;
        }
    }
    c->proj_first = false;
    return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND,
                              "%s: layer %d: tensor '%sexperts.0.up_proj.weight' not found (nor "
                              "weight_packed, w3, experts.up_proj.0.*, or fused experts.gate_up_proj)",
                              c->where, c->layer, c->base);
}

// ---- owning containers ----

void nvfp4moe_ckpt_storage_free(ckpt_storage *s) {
    if (!s) return;
    free(s->w13);
    free(s->w13_scale);
    free(s->w2);
    free(s->w2_scale);
    free(s->w13_scale_2);
    free(s->w13_input_scale);
    free(s->w2_scale_2);
    free(s->w2_input_scale);
    free(s->w13_bias);
    free(s->w2_bias);
    free(s->correction_bias);
    free(s->router);
    free(s->router_bias);
    free(s->w13_up_scale_2);
    free(s);
}

void nvfp4moe_ckpt_layer_free(nvfp4moe_ckpt_layer *l) {
    if (!nvfp4moe_handle_remove(l, NVFP4MOE_HANDLE_CKPT_LAYER)) return;   // NULL, freed already, or not ours
    nvfp4moe_ckpt_storage_free(l->storage_);
    free(l);
}

/* size = a * b * c / d bytes, overflow-checked against a sane bound. */
bool nvfp4moe_ckpt_checked_size(int64_t a, int64_t b, int64_t cc, int64_t d, size_t *out) {
    if (a < 0 || b < 0 || cc < 0) return false;
    double approx = (double)a * (double)b * (double)cc / (double)d;
    if (approx > 1.0e13) return false;   // 10 TB: no real layer; a corrupt config
    *out = (size_t)(a * b * cc / d);
    return true;
}

/* Allocates every buffer cfg needs (zeroed), and the router weight / bias when asked. */
nvfp4moe_status nvfp4moe_ckpt_storage_alloc(const nvfp4moe_config *cfg, bool router, bool router_bias,
                                            ckpt_storage **out) {
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg);
    size_t n13, n13s, n2, n2s;
    NVFP4MOE_RETURN_IF(!nvfp4moe_ckpt_checked_size(E, N1, H, 2, &n13) || !nvfp4moe_ckpt_checked_size(E, N1, H, 16, &n13s) ||
                           !nvfp4moe_ckpt_checked_size(E, H, I, 2, &n2) || !nvfp4moe_ckpt_checked_size(E, H, I, 16, &n2s),
                       NVFP4MOE_ERR_SHAPE, "layer of E=%lld H=%lld I=%lld is absurdly large",
                       (long long)E, (long long)H, (long long)I);
    ckpt_storage *s = calloc(1, sizeof *s);
    NVFP4MOE_RETURN_IF(!s, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    bool ok = (s->w13 = calloc(n13 ? n13 : 1, 1)) && (s->w13_scale = calloc(n13s ? n13s : 1, 1)) &&
              (s->w2 = calloc(n2 ? n2 : 1, 1)) && (s->w2_scale = calloc(n2s ? n2s : 1, 1)) &&
              (s->w13_scale_2 = calloc((size_t)E, sizeof(float))) &&
              (s->w2_scale_2 = calloc((size_t)E, sizeof(float)));
    if (ok && nvfp4moe_activation_is_gated(cfg->activation))
        ok = (s->w13_up_scale_2 = calloc((size_t)E, sizeof(float)));
    if (ok && cfg->scheme != NVFP4MOE_SCHEME_W4A16)
        ok = (s->w13_input_scale = calloc((size_t)E, sizeof(float))) &&
             (s->w2_input_scale = calloc((size_t)E, sizeof(float)));
    if (ok && cfg->has_bias)
        ok = (s->w13_bias = calloc((size_t)(E * N1), sizeof(float))) &&
             (s->w2_bias = calloc((size_t)(E * H), sizeof(float)));
    if (ok && cfg->has_correction_bias) ok = (s->correction_bias = calloc((size_t)E, sizeof(float)));
    if (ok && router) ok = (s->router = calloc((size_t)(E * H), sizeof(float)));
    if (ok && router_bias) ok = (s->router_bias = calloc((size_t)E, sizeof(float)));
    if (!ok) {
        nvfp4moe_ckpt_storage_free(s);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY,
                                  "out of memory for a layer of E=%lld H=%lld I=%lld", (long long)E,
                                  (long long)H, (long long)I);
    }
    *out = s;
    return NVFP4MOE_OK;
}

void nvfp4moe_ckpt_point_weights(nvfp4moe_ckpt_layer *l, const ckpt_storage *s) {
    nvfp4moe_weights *w = &l->layer.w;
    w->w13 = s->w13, w->w13_scale = s->w13_scale, w->w13_scale_2 = s->w13_scale_2;
    w->w13_input_scale = s->w13_input_scale;
    w->w2 = s->w2, w->w2_scale = s->w2_scale, w->w2_scale_2 = s->w2_scale_2;
    w->w2_input_scale = s->w2_input_scale;
    w->w13_bias = s->w13_bias, w->w2_bias = s->w2_bias, w->correction_bias = s->correction_bias;
    w->w13_up_scale_2 = s->w13_up_scale_2;
}
