/*
 * quantize_model.c - a whole unquantized model directory to NVFP4, one tensor at a time: the MoE
 * layers' experts quantized (an expert at a time), every other tensor copied bit for bit, the
 * output in shards, config.json with the quantization config and its exclusion list, the other
 * files of the directory copied.
 *
 * The output is planned before a byte is written: every tensor's name, dtype and shape, in the
 * order of the source's names (a quantized layer's experts where its first expert tensor was), so
 * that the shards' headers are written first and each tensor then goes to its place (a fused
 * tensor gets its experts' slices one by one). Memory: one expert's float weights, its quantized
 * copy and the names; never a layer, never a shard.
 */
#include "format/format.h"
#include "model/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void nvfp4moe_quantize_options_init(nvfp4moe_quantize_options *opt) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->format = NVFP4MOE_CKPT_MODELOPT;
    opt->layer = -1;
    opt->calib_tokens = 64;
    opt->max_shard_bytes = 5000000000ull;
}

// ---- the plan ----

/* The tensors a quantized expert projection gets, in the order they are written. */
enum { LEAF_W, LEAF_S, LEAF_S2, LEAF_IN, LEAF_BIAS, LEAF_COUNT };

typedef struct {
    nvfp4moe_float_src src;
    int32_t index;                /* decoder layer */
    uint64_t seed;
    bool emitted;                 /* its tensors are in the plan */
    int64_t first;                /* index of its first output tensor */
    int64_t count;                /* how many */
    nvfp4moe_st_dtype b13_dt, b2_dt;   /* the expert biases' output dtypes */
} qlayer;

typedef struct {
    const nvfp4moe_st_tensor *src;   /* copied tensor, or NULL: produced by layer `layer` */
    int32_t layer;                   /* index into layers (quantized) or -1 */
} entry;

typedef struct {
    const nvfp4moe_quantize_options *opt;
    const nvfp4moe_st_model *m;
    qlayer *layers;
    int32_t nlayers;
    entry *e;                        /* one per output tensor, in plan order */
    int64_t n, cap;
    nvfp4moe_st_shards *sh;
    uint64_t *left;                  /* per output tensor, bytes not written yet */
    nvfp4moe_quantize_progress pr;
    char **quantized, **unquantized; /* module names, for the exclusion list */
    size_t nq, nu, capq, capu;
} qrun;

static nvfp4moe_status push_name(char ***v, size_t *n, size_t *cap, const char *s, size_t len) {
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 256;
        char **nv = realloc(*v, c * sizeof *nv);
        NVFP4MOE_RETURN_IF(!nv, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        *v = nv;
        *cap = c;
    }
    char *d = malloc(len + 1);
    NVFP4MOE_RETURN_IF(!d, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    memcpy(d, s, len);
    d[len] = '\0';
    (*v)[(*n)++] = d;
    return NVFP4MOE_OK;
}

static nvfp4moe_status plan_add(qrun *r, const char *name, nvfp4moe_st_dtype dt, int32_t ndim, const int64_t *shape,
                                const nvfp4moe_st_tensor *src, int32_t layer) {
    if (r->n == r->cap) {
        int64_t c = r->cap ? 2 * r->cap : 1024;
        entry *ne = realloc(r->e, (size_t)c * sizeof *ne);
        NVFP4MOE_RETURN_IF(!ne, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        r->e = ne;
        r->cap = c;
    }
    int64_t idx;
    NVFP4MOE_TRY(nvfp4moe_st_shards_add(r->sh, name, dt, ndim, shape, &idx));
    r->e[r->n++] = (entry){.src = src, .layer = layer};
    return NVFP4MOE_OK;
}

/* A dtype expert biases can be written in so that their float values read back exactly: the
 * source's when every bias of the kind has it and it is BF16, F16 or F32, else F32. */
static nvfp4moe_st_dtype bias_dtype(nvfp4moe_st_dtype have, nvfp4moe_st_dtype t, bool first) {
    const bool ok = t == NVFP4MOE_ST_BF16 || t == NVFP4MOE_ST_F16 || t == NVFP4MOE_ST_F32;
    if (first) return ok ? t : NVFP4MOE_ST_F32;
    return ok && t == have ? have : NVFP4MOE_ST_F32;
}

static void layer_bias_dtypes(qlayer *q) {
    const load_ctx *c = &q->src.c;
    q->b13_dt = q->b2_dt = NVFP4MOE_ST_F32;
    if (!c->cfg.has_bias) return;
    if (q->src.fused) {
        q->b13_dt = bias_dtype(0, q->src.gub->dtype, true);
        q->b2_dt = bias_dtype(0, q->src.dnb->dtype, true);
        return;
    }
    const bool gated = nvfp4moe_activation_is_gated(c->cfg.activation);
    bool first13 = true, first2 = true;
    for (int32_t e = 0; e < c->cfg.num_experts; e++)
        for (int p = gated ? 0 : 1; p < 3; p++) {
            char suf[160];
            nvfp4moe_ckpt_expert_suffix(c, e, p == 0 ? c->gate : p == 1 ? c->up : c->down, "bias", suf, sizeof suf);
            const nvfp4moe_st_tensor *t = nvfp4moe_ckpt_maybe(c, suf);
            if (!t) continue;
            if (p == 2) q->b2_dt = bias_dtype(q->b2_dt, t->dtype, first2), first2 = false;
            else q->b13_dt = bias_dtype(q->b13_dt, t->dtype, first13), first13 = false;
        }
}

/* The output tensors of quantized layer li, appended to the plan. */
static nvfp4moe_status plan_layer(qrun *r, int32_t li) {
    qlayer *q = &r->layers[li];
    const load_ctx *c = &q->src.c;
    const nvfp4moe_config *cfg = &c->cfg;
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size, N1 = nvfp4moe_config_n1(cfg);
    const bool w4a16 = r->opt->w4a16, ct = r->opt->format == NVFP4MOE_CKPT_COMPRESSED_TENSORS;
    const bool gated = nvfp4moe_activation_is_gated(cfg->activation);
    char name[400];
    q->first = r->n;
    q->emitted = true;
    if (r->opt->format == NVFP4MOE_CKPT_MODELOPT_FUSED) {
        const int64_t d13[3] = {E, N1, H / 2}, d13s[3] = {E, N1, H / 16}, d2[3] = {E, H, I / 2}, d2s[3] = {E, H, I / 16};
        const int64_t de[1] = {E}, db13[2] = {E, N1}, db2[2] = {E, H};
        const struct { const char *suffix; nvfp4moe_st_dtype dt; int32_t nd; const int64_t *shape; bool on; } t[10] = {
            {"experts.gate_up_proj", NVFP4MOE_ST_U8, 3, d13, true},
            {"experts.gate_up_proj_weight_scale", NVFP4MOE_ST_F8_E4M3, 3, d13s, true},
            {"experts.gate_up_proj_weight_scale_2", NVFP4MOE_ST_F32, 1, de, true},
            {"experts.gate_up_proj_input_scale", NVFP4MOE_ST_F32, 1, de, !w4a16},
            {"experts.down_proj", NVFP4MOE_ST_U8, 3, d2, true},
            {"experts.down_proj_weight_scale", NVFP4MOE_ST_F8_E4M3, 3, d2s, true},
            {"experts.down_proj_weight_scale_2", NVFP4MOE_ST_F32, 1, de, true},
            {"experts.down_proj_input_scale", NVFP4MOE_ST_F32, 1, de, !w4a16},
            {"experts.gate_up_proj_bias", q->b13_dt, 2, db13, cfg->has_bias},
            {"experts.down_proj_bias", q->b2_dt, 2, db2, cfg->has_bias},
        };
        for (int i = 0; i < 10; i++) {
            if (!t[i].on) continue;
            snprintf(name, sizeof name, "%s%s", c->base, t[i].suffix);
            NVFP4MOE_TRY(plan_add(r, name, t[i].dt, t[i].nd, t[i].shape, NULL, li));
        }
        snprintf(name, sizeof name, "%sexperts", c->base);
        NVFP4MOE_TRY(push_name(&r->quantized, &r->nq, &r->capq, name, strlen(name)));
    } else {
        for (int32_t e = 0; e < E; e++)
            for (int p = gated ? 0 : 1; p < 3; p++) {
                const char *proj = p == 0 ? c->gate : p == 1 ? c->up : c->down;
                const int64_t rows = p == 2 ? H : I, cols = p == 2 ? I : H;
                const int64_t dw[2] = {rows, cols / 2}, ds[2] = {rows, cols / 16}, one[1] = {1}, db[1] = {rows};
                const struct { const char *leaf; nvfp4moe_st_dtype dt; int32_t nd; const int64_t *shape; bool on; } t[5] = {
                    {ct ? "weight_packed" : "weight", NVFP4MOE_ST_U8, 2, dw, true},
                    {"weight_scale", NVFP4MOE_ST_F8_E4M3, 2, ds, true},
                    {ct ? "weight_global_scale" : "weight_scale_2", NVFP4MOE_ST_F32, ct ? 1 : 0, one, true},
                    {ct ? "input_global_scale" : "input_scale", NVFP4MOE_ST_F32, ct ? 1 : 0, one, !w4a16},
                    {"bias", p == 2 ? q->b2_dt : q->b13_dt, 1, db, cfg->has_bias},
                };
                for (int i = 0; i < LEAF_COUNT; i++) {
                    if (!t[i].on) continue;
                    snprintf(name, sizeof name, "%sexperts.%d.%s.%s", c->base, e, proj, t[i].leaf);
                    NVFP4MOE_TRY(plan_add(r, name, t[i].dt, t[i].nd, t[i].shape, NULL, li));
                }
                snprintf(name, sizeof name, "%sexperts.%d.%s", c->base, e, proj);
                NVFP4MOE_TRY(push_name(&r->quantized, &r->nq, &r->capq, name, strlen(name)));
            }
    }
    q->count = r->n - q->first;
    return NVFP4MOE_OK;
}

/* Whether a copied tensor is a module's weight matrix the exclusion list should name (float, two or
 * more dimensions; not an embedding table, which no quantization config names). */
static bool names_a_module(const nvfp4moe_st_tensor *t, size_t *module_len) {
    if (!nvfp4moe_ckpt_is_float_dtype(t->dtype) || t->ndim < 2) return false;
    const char *dot = strrchr(t->name, '.');
    if (!dot || dot == t->name) return false;
    const char *prev = dot - 1;
    while (prev > t->name && *prev != '.') prev--;
    const char *last = *prev == '.' ? prev + 1 : prev;   // the module's own name
    const size_t ll = (size_t)(dot - last);
    for (size_t i = 0; i + 5 <= ll; i++)
        if (!strncmp(last + i, "embed", 5)) return false;
    if (ll == 3 && (!strncmp(last, "wte", 3) || !strncmp(last, "wpe", 3))) return false;
    *module_len = (size_t)(dot - t->name);
    return true;
}

/* Every source tensor a quantized layer reads, by index in the model's name order: -1 or the layer. */
static nvfp4moe_status mark(const qrun *r, const nvfp4moe_st_tensor *t, int32_t li, int32_t *owner) {
    if (!t) return NVFP4MOE_OK;
    size_t i = nvfp4moe_st_model_lower_bound(r->m, t->name);
    NVFP4MOE_RETURN_IF(nvfp4moe_st_model_tensor(r->m, i) != t, NVFP4MOE_ERR_INTERNAL, "quantize: tensor '%s' lost",
                       t->name);
    owner[i] = li;
    return NVFP4MOE_OK;
}

static nvfp4moe_status mark_layer(const qrun *r, int32_t li, int32_t *owner) {
    const qlayer *q = &r->layers[li];
    const load_ctx *c = &q->src.c;
    if (q->src.fused) {
        NVFP4MOE_TRY(mark(r, q->src.gu, li, owner));
        NVFP4MOE_TRY(mark(r, q->src.dn, li, owner));
        NVFP4MOE_TRY(mark(r, q->src.gub, li, owner));
        NVFP4MOE_TRY(mark(r, q->src.dnb, li, owner));
    } else {
        const bool gated = nvfp4moe_activation_is_gated(c->cfg.activation);
        for (int32_t e = 0; e < c->cfg.num_experts; e++)
            for (int p = gated ? 0 : 1; p < 3; p++) {
                const char *proj = p == 0 ? c->gate : p == 1 ? c->up : c->down;
                char suf[160];
                nvfp4moe_ckpt_expert_suffix(c, e, proj, "weight", suf, sizeof suf);
                NVFP4MOE_TRY(mark(r, nvfp4moe_ckpt_maybe(c, suf), li, owner));
                nvfp4moe_ckpt_expert_suffix(c, e, proj, "bias", suf, sizeof suf);
                NVFP4MOE_TRY(mark(r, nvfp4moe_ckpt_maybe(c, suf), li, owner));
            }
    }
    // Anything else under the experts module would be copied next to tensors it does not belong
    // with (a loader would read it as an expert parameter): refused, naming it.
    char prefix[200];
    snprintf(prefix, sizeof prefix, "%sexperts.", c->base);
    const size_t plen = strlen(prefix);
    for (size_t i = nvfp4moe_st_model_lower_bound(r->m, prefix); i < nvfp4moe_st_model_count(r->m); i++) {
        const nvfp4moe_st_tensor *t = nvfp4moe_st_model_tensor(r->m, i);
        if (strncmp(t->name, prefix, plen)) break;
        NVFP4MOE_RETURN_IF(owner[i] != li, NVFP4MOE_ERR_UNSUPPORTED,
                           "%s: tensor '%s' is in layer %d's experts module but is not one of its experts' %s "
                           "tensors: quantize would not know what it is",
                           c->where, t->name, c->layer, q->src.fused ? "fused" : "weight or bias");
    }
    return NVFP4MOE_OK;
}

// ---- the exclusion list ----

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Whether some quantized module's name starts with p[0..len). */
static bool any_prefixed(char **q, size_t nq, const char *p, size_t len) {
    size_t lo = 0, hi = nq;
    while (lo < hi) {   // the first name whose first len bytes are >= p's
        size_t mid = (lo + hi) / 2;
        if (strncmp(q[mid], p, len) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < nq && strncmp(q[lo], p, len) == 0;
}

static bool is_quantized(char **q, size_t nq, const char *name) {
    return bsearch(&name, q, nq, sizeof *q, cmp_str) != NULL;
}

static bool in_list(char **v, size_t n, const char *s) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(v[i], s)) return true;
    return false;
}

/* ModelOpt's summary of the unquantized modules with prefix wildcards (its export's
 * _prefix_wildcard_summarize_exclude_modules): per module, the shortest candidate cut at a dot,
 * "prefix*" or the pair {"prefix", "prefix.*"}, that matches no quantized module, else the name
 * itself; candidates already listed cover it. Sorted. */
static nvfp4moe_status summarize(qrun *r, char ***out, size_t *nout) {
    char **res = NULL;
    size_t n = 0, cap = 0;
    char buf[512];
    for (size_t u = 0; u < r->nu; u++) {
        const char *name = r->unquantized[u];
        const size_t len = strlen(name);
        bool done = false;
        for (size_t i = 0; i <= len && !done; i++) {
            if (i < len && name[i] != '.') continue;
            if (i == len) {   // the name itself
                if (is_quantized(r->quantized, r->nq, name)) break;
                if (!in_list(res, n, name)) NVFP4MOE_TRY(push_name(&res, &n, &cap, name, len));
                done = true;
                break;
            }
            if (i + 2 >= sizeof buf) break;
            // "prefix*": negative when a quantized module starts with prefix
            if (!any_prefixed(r->quantized, r->nq, name, i)) {
                memcpy(buf, name, i);
                buf[i] = '*', buf[i + 1] = '\0';
                if (!in_list(res, n, buf)) NVFP4MOE_TRY(push_name(&res, &n, &cap, buf, i + 1));
                done = true;
                break;
            }
            // {"prefix", "prefix.*"}: negative when prefix is quantized or one starts with "prefix."
            memcpy(buf, name, i);
            buf[i] = '\0';
            const bool neg = is_quantized(r->quantized, r->nq, buf) || any_prefixed(r->quantized, r->nq, name, i + 1);
            if (!neg) {
                const bool have = in_list(res, n, buf);
                buf[i] = '.', buf[i + 1] = '*', buf[i + 2] = '\0';
                if (have && in_list(res, n, buf)) {
                    done = true;
                    break;
                }
                NVFP4MOE_TRY(push_name(&res, &n, &cap, name, i));
                NVFP4MOE_TRY(push_name(&res, &n, &cap, buf, i + 2));
                done = true;
            }
        }
    }
    qsort(res, n, sizeof *res, cmp_str);
    // the pair rule may list a name twice: keep one
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k && !strcmp(res[k - 1], res[i])) {
            free(res[i]);
            continue;
        }
        res[k++] = res[i];
    }
    *out = res;
    *nout = k;
    return NVFP4MOE_OK;
}

// ---- writing ----

static void report(qrun *r) {
    if (r->opt->progress) r->opt->progress(&r->pr, r->opt->user);
}

/* n bytes of output tensor i at offset, with the progress accounting. */
static nvfp4moe_status put(qrun *r, int64_t i, uint64_t offset, const void *data, uint64_t n) {
    NVFP4MOE_TRY(nvfp4moe_st_shards_write(r->sh, i, offset, data, n));
    r->left[i] -= n;
    r->pr.bytes_done += n;
    if (r->left[i] == 0) r->pr.tensors_done++;
    return NVFP4MOE_OK;
}

/* A source tensor copied bit for bit, in chunks. */
static nvfp4moe_status copy_tensor(qrun *r, int64_t i, uint8_t *buf, size_t bufsize) {
    const nvfp4moe_st_tensor *t = r->e[i].src;
    if (t->nbytes == 0) return put(r, i, 0, NULL, 0);
    for (uint64_t off = 0; off < t->nbytes; off += bufsize) {
        const uint64_t k = t->nbytes - off < bufsize ? t->nbytes - off : bufsize;
        NVFP4MOE_TRY(nvfp4moe_st_tensor_read(t, off, k, buf));
        NVFP4MOE_TRY(put(r, i, off, buf, k));
        if (t->nbytes > bufsize) report(r);
    }
    return NVFP4MOE_OK;
}

/* Floats encoded in a bias dtype (BF16, F16, F32: exact for values read from those). */
static void encode(nvfp4moe_st_dtype dt, const float *x, int64_t n, uint8_t *out) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == NVFP4MOE_ST_F32) {
            memcpy(out + 4 * i, &x[i], 4);
        } else {
            const uint16_t h = dt == NVFP4MOE_ST_BF16 ? nvfp4moe_bf16_from_float(x[i]) : nvfp4moe_fp16_from_float(x[i]);
            memcpy(out + 2 * i, &h, 2);
        }
    }
}

typedef struct {
    float *w13, *w2, *b13, *b2, *x, *wdq, *fb;
    double *g, *a;
    uint8_t *q13, *sf13, *q2, *sf2, *bb;
} qbuf;

static void qbuf_free(qbuf *b) {
    free(b->w13); free(b->w2); free(b->b13); free(b->b2); free(b->x); free(b->wdq); free(b->fb);
    free(b->g); free(b->a); free(b->q13); free(b->sf13); free(b->q2); free(b->sf2); free(b->bb);
    memset(b, 0, sizeof *b);
}

/* Quantized layer li: every expert read, quantized and written to its tensors' places. */
static nvfp4moe_status write_layer(qrun *r, int32_t li) {
    qlayer *q = &r->layers[li];
    const nvfp4moe_config *cfg = &q->src.c.cfg;
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size, N1 = nvfp4moe_config_n1(cfg);
    const int64_t M = r->opt->calib_tokens, W = NVFP4MOE_MAX(N1, H);
    const bool fused = r->opt->format == NVFP4MOE_CKPT_MODELOPT_FUSED, w4a16 = r->opt->w4a16;
    const bool ct = r->opt->format == NVFP4MOE_CKPT_COMPRESSED_TENSORS;
    const bool gated = nvfp4moe_activation_is_gated(cfg->activation);
    qbuf b = {0};
    size_t n13, n2;
    NVFP4MOE_RETURN_IF(!nvfp4moe_ckpt_checked_size(N1, H, 1, 1, &n13) || !nvfp4moe_ckpt_checked_size(H, I, 1, 1, &n2),
                       NVFP4MOE_ERR_SHAPE, "layer %d: experts too large", q->index);
    b.w13 = malloc(sizeof(float) * n13), b.wdq = malloc(sizeof(float) * n13), b.w2 = malloc(sizeof(float) * n2);
    b.q13 = malloc(n13 / 2), b.sf13 = malloc(n13 / 16), b.q2 = malloc(n2 / 2), b.sf2 = malloc(n2 / 16);
    b.x = malloc(sizeof(float) * (size_t)(M * H)), b.g = malloc(sizeof(double) * (size_t)N1);
    b.a = malloc(sizeof(double) * (size_t)I), b.b13 = malloc(sizeof(float) * (size_t)N1);
    b.b2 = malloc(sizeof(float) * (size_t)H), b.fb = malloc(sizeof(float) * (size_t)W);
    b.bb = malloc(4 * (size_t)W);
    if (!b.w13 || !b.wdq || !b.w2 || !b.q13 || !b.sf13 || !b.q2 || !b.sf2 || !b.x || !b.g || !b.a || !b.b13 || !b.b2 ||
        !b.fb || !b.bb) {
        qbuf_free(&b);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY,
                                  "layer %d: out of memory for one expert's weights (H=%lld I=%lld)", q->index,
                                  (long long)H, (long long)I);
    }
    float in13;
    nvfp4moe_calibration_tokens(q->seed, M, H, b.x, &in13);
    r->pr.layer = q->index;
    r->pr.experts_done = 0;
    r->pr.experts_total = (int32_t)E;
    r->pr.expert_biases = cfg->has_bias;
    nvfp4moe_status s = NVFP4MOE_OK;
    for (int32_t e = 0; e < E && s == NVFP4MOE_OK; e++) {
        float s13, s2, in2;
        s = nvfp4moe_float_src_expert(&q->src, e, b.w13, b.w2, cfg->has_bias ? b.b13 : NULL,
                                      cfg->has_bias ? b.b2 : NULL);
        if (s == NVFP4MOE_OK)
            s = nvfp4moe_quantize_expert(cfg, b.w13, b.w2, cfg->has_bias ? b.b13 : NULL, b.x, M, b.q13, b.sf13, &s13,
                                         b.q2, b.sf2, &s2, &in2, b.wdq, b.g, b.a);
        if (s != NVFP4MOE_OK) break;
        if (fused) {
            int64_t t = q->first;
            s = put(r, t++, (uint64_t)e * n13 / 2, b.q13, n13 / 2);
            if (s == NVFP4MOE_OK) s = put(r, t++, (uint64_t)e * n13 / 16, b.sf13, n13 / 16);
            if (s == NVFP4MOE_OK) s = put(r, t++, 4 * (uint64_t)e, &s13, 4);
            if (s == NVFP4MOE_OK && !w4a16) s = put(r, t++, 4 * (uint64_t)e, &in13, 4);
            if (s == NVFP4MOE_OK) s = put(r, t++, (uint64_t)e * n2 / 2, b.q2, n2 / 2);
            if (s == NVFP4MOE_OK) s = put(r, t++, (uint64_t)e * n2 / 16, b.sf2, n2 / 16);
            if (s == NVFP4MOE_OK) s = put(r, t++, 4 * (uint64_t)e, &s2, 4);
            if (s == NVFP4MOE_OK && !w4a16) s = put(r, t++, 4 * (uint64_t)e, &in2, 4);
            if (s == NVFP4MOE_OK && cfg->has_bias) {
                const uint64_t e13 = (uint64_t)nvfp4moe_st_dtype_bits(q->b13_dt) / 8, e2 = (uint64_t)nvfp4moe_st_dtype_bits(q->b2_dt) / 8;
                encode(q->b13_dt, b.b13, N1, b.bb);
                s = put(r, t++, (uint64_t)e * (uint64_t)N1 * e13, b.bb, (uint64_t)N1 * e13);
                encode(q->b2_dt, b.b2, H, b.bb);
                if (s == NVFP4MOE_OK) s = put(r, t++, (uint64_t)e * (uint64_t)H * e2, b.bb, (uint64_t)H * e2);
            }
        } else {
            // Per expert: gate (gated only), up, down, each weight, scale, global scale, input scale,
            // bias; the halves' rows taken from the canonical w13.
            int64_t t = q->first + (int64_t)e * ((q->count) / E);
            for (int p = gated ? 0 : 1; p < 3 && s == NVFP4MOE_OK; p++) {
                const int64_t rows = p == 2 ? H : I, cols = p == 2 ? I : H;
                const uint8_t *qw = p == 2 ? b.q2 : b.q13, *qs = p == 2 ? b.sf2 : b.sf13;
                for (int64_t rr = 0; rr < rows && s == NVFP4MOE_OK; rr++) {   // packed rows, then scale rows
                    const int64_t src_row = p == 2 ? rr : nvfp4moe_ckpt_w13_row(cfg, p, rr);
                    s = put(r, t, (uint64_t)(rr * (cols / 2)), qw + src_row * (cols / 2), (uint64_t)(cols / 2));
                    if (s == NVFP4MOE_OK)
                        s = put(r, t + 1, (uint64_t)(rr * (cols / 16)), qs + src_row * (cols / 16), (uint64_t)(cols / 16));
                }
                t += 2;
                const float sc = p == 2 ? s2 : s13, in = p == 2 ? in2 : in13;
                const float g = ct ? 1.0f / sc : sc, gi = ct ? 1.0f / in : in;
                if (s == NVFP4MOE_OK) s = put(r, t++, 0, &g, 4);
                if (s == NVFP4MOE_OK && !w4a16) s = put(r, t++, 0, &gi, 4);
                if (s == NVFP4MOE_OK && cfg->has_bias) {
                    const nvfp4moe_st_dtype dt = p == 2 ? q->b2_dt : q->b13_dt;
                    for (int64_t rr = 0; rr < rows; rr++)
                        b.fb[rr] = p == 2 ? b.b2[rr] : b.b13[nvfp4moe_ckpt_w13_row(cfg, p, rr)];
                    encode(dt, b.fb, rows, b.bb);
                    s = put(r, t++, 0, b.bb, (uint64_t)rows * (uint64_t)(nvfp4moe_st_dtype_bits(dt) / 8));
                }
            }
        }
        if (s == NVFP4MOE_OK) r->pr.experts_done = e + 1;
        if (s == NVFP4MOE_OK && e + 1 == E) {
            r->pr.layers_done++;
            r->pr.layer = -1;
            r->pr.last_layer = q->index;
        }
        if (s == NVFP4MOE_OK) report(r);
    }
    qbuf_free(&b);
    return s;
}

// ---- the directory's other files ----

/* Whether a file of the source directory is copied: not hidden, not a weight file of any format,
 * not one of the configs written anew. */
static bool copy_other(const char *n) {
    static const char *const skip_names[] = {"config.json", "hf_quant_config.json", "model.safetensors.index.json",
                                             "pytorch_model.bin.index.json", NULL};
    static const char *const skip_ext[] = {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5",
                                           ".msgpack", ".onnx", ".npz", NULL};
    if (n[0] == '.') return false;
    for (const char *const *s = skip_names; *s; s++)
        if (!strcmp(n, *s)) return false;
    const size_t len = strlen(n);
    for (const char *const *s = skip_ext; *s; s++) {
        const size_t l = strlen(*s);
        if (len >= l && !strcmp(n + len - l, *s)) return false;
    }
    return true;
}

/* Copies in/name to out/name (a new file); a source that is not a regular file is skipped (*done
 * false), without blocking on it. */
static nvfp4moe_status copy_file(const char *in, const char *out, const char *name, uint8_t *buf, size_t bufsize,
                                 bool *done) {
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/%s", in, name);
    snprintf(dst, sizeof dst, "%s/%s", out, name);
    *done = false;
    const int fd = open(src, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return NVFP4MOE_OK;   // vanished, or unreadable: not part of the model
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return NVFP4MOE_OK;
    }
    const int od = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (od < 0) {
        const int err = errno;
        close(fd);
        return nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: cannot create: %s", dst, strerror(err));
    }
    *done = true;   // created: the caller removes it if anything fails
    nvfp4moe_status s = NVFP4MOE_OK;
    for (;;) {
        const ssize_t k = read(fd, buf, bufsize);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: read failed: %s", src, strerror(errno));
            break;
        }
        if (k == 0) break;
        for (ssize_t w = 0; w < k;) {
            const ssize_t x = write(od, buf + w, (size_t)(k - w));
            if (x < 0 && errno == EINTR) continue;
            if (x <= 0) {
                s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: write failed: %s", dst, strerror(errno));
                break;
            }
            w += x;
        }
        if (s != NVFP4MOE_OK) break;
    }
    if (s == NVFP4MOE_OK && fsync(od) != 0) s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: fsync: %s", dst, strerror(errno));
    if (close(od) != 0 && s == NVFP4MOE_OK) s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: close: %s", dst, strerror(errno));
    close(fd);
    return s;
}

// ---- the whole model ----

static void free_names(char **v, size_t n) {
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

nvfp4moe_status nvfp4moe_model_quantize(const char *in_dir, const char *out_dir, const nvfp4moe_quantize_options *opt,
                                        nvfp4moe_quantize_result *result) {
    NVFP4MOE_RETURN_IF(!in_dir || !out_dir || !opt, NVFP4MOE_ERR_INVALID_ARGUMENT, "model_quantize: NULL argument");
    NVFP4MOE_RETURN_IF(opt->format != NVFP4MOE_CKPT_MODELOPT && opt->format != NVFP4MOE_CKPT_MODELOPT_FUSED &&
                           opt->format != NVFP4MOE_CKPT_COMPRESSED_TENSORS,
                       NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "model_quantize: format %s: expected modelopt, modelopt-fused or compressed-tensors",
                       nvfp4moe_ckpt_format_name(opt->format));
    NVFP4MOE_RETURN_IF(opt->calib_tokens < 1 || opt->calib_tokens > 65536, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "model_quantize: calib_tokens=%d must be in [1, 65536]", opt->calib_tokens);
    NVFP4MOE_RETURN_IF(opt->max_shard_bytes == 0, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "model_quantize: max_shard_bytes must be > 0");
    if (result) memset(result, 0, sizeof *result);
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_st_model *m = NULL;
    char *config = NULL, path[4096];
    qrun r = {.opt = opt};
    char **excl = NULL, **other = NULL;
    size_t nexcl = 0, nother = 0, capother = 0;
    int32_t *owner = NULL;
    uint8_t *buf = NULL;
    const size_t bufsize = (size_t)8 << 20;
    bool configs_written = false;
    nvfp4moe_status s = nvfp4moe_model_info_read(in_dir, &info);
    if (s == NVFP4MOE_OK) s = nvfp4moe_st_model_open(in_dir, &m);
    if (s != NVFP4MOE_OK) goto done;
    r.m = m;
    if (info->quantized) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED, "%s is already quantized (%s %s)", in_dir, info->quant_method,
                               info->quant_algo);
        goto done;
    }
    if (info->num_moe_layers == 0) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED, "%s has no MoE layers", in_dir);
        goto done;
    }
    if (opt->layer >= 0 && !nvfp4moe_model_info_is_moe_layer(info, opt->layer)) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND, "layer %d is not a MoE layer of %s (first MoE layer: %d)",
                               opt->layer, in_dir, info->first_moe_layer);
        goto done;
    }
    snprintf(path, sizeof path, "%s/config.json", in_dir);
    if ((s = nvfp4moe_read_text_file(path, (size_t)64 << 20, &config)) != NVFP4MOE_OK) goto done;

    // Every quantized layer checked before anything is written.
    r.layers = calloc((size_t)info->num_moe_layers, sizeof *r.layers);
    owner = malloc(sizeof(int32_t) * (nvfp4moe_st_model_count(m) + 1));
    buf = malloc(bufsize);
    if (!r.layers || !owner || !buf || nvfp4moe_st_shards_create(&r.sh) != NVFP4MOE_OK) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < nvfp4moe_st_model_count(m); i++) owner[i] = -1;
    for (int32_t L = 0; L < info->num_layers && s == NVFP4MOE_OK; L++) {
        if (!nvfp4moe_model_info_is_moe_layer(info, L) || (opt->layer >= 0 && L != opt->layer)) continue;
        qlayer *q = &r.layers[r.nlayers];
        s = nvfp4moe_float_src_open(info, m, L, &q->src);
        if (s != NVFP4MOE_OK) {
            nvfp4moe_error_prefix("layer %d", L);
            break;
        }
        q->index = L;
        q->seed = opt->seed + (uint64_t)L;
        q->src.c.cfg.scheme = opt->w4a16 ? NVFP4MOE_SCHEME_W4A16 : NVFP4MOE_SCHEME_W4A4;
        layer_bias_dtypes(q);
        s = mark_layer(&r, r.nlayers, owner);
        r.nlayers++;
        if (q->src.c.cfg.has_bias && result) result->expert_biases = true;
    }
    if (s != NVFP4MOE_OK) goto done;

    // The plan: the source's tensors in name order, a quantized layer's where its first expert
    // tensor was; the modules of the copied weight matrices, for the exclusion list.
    for (size_t i = 0; i < nvfp4moe_st_model_count(m) && s == NVFP4MOE_OK; i++) {
        const nvfp4moe_st_tensor *t = nvfp4moe_st_model_tensor(m, i);
        if (owner[i] >= 0) {
            if (!r.layers[owner[i]].emitted) s = plan_layer(&r, owner[i]);
            continue;
        }
        s = plan_add(&r, t->name, t->dtype, t->ndim, t->shape, t, -1);
        size_t ml;
        if (s == NVFP4MOE_OK && names_a_module(t, &ml)) s = push_name(&r.unquantized, &r.nu, &r.capu, t->name, ml);
    }
    if (s == NVFP4MOE_OK && !in_list(r.unquantized, r.nu, "lm_head"))   // what ModelOpt lists, tied or not
        s = push_name(&r.unquantized, &r.nu, &r.capu, "lm_head", 7);
    if (s != NVFP4MOE_OK) goto done;
    qsort(r.quantized, r.nq, sizeof *r.quantized, cmp_str);
    qsort(r.unquantized, r.nu, sizeof *r.unquantized, cmp_str);
    {   // duplicates (a module's weight and bias) once
        size_t k = 0;
        for (size_t i = 0; i < r.nu; i++) {
            if (k && !strcmp(r.unquantized[k - 1], r.unquantized[i])) {
                free(r.unquantized[i]);
                continue;
            }
            r.unquantized[k++] = r.unquantized[i];
        }
        r.nu = k;
    }
    if (opt->format == NVFP4MOE_CKPT_COMPRESSED_TENSORS) {   // llm-compressor lists each module
        excl = r.unquantized, nexcl = r.nu;
        r.unquantized = NULL, r.nu = 0;
    } else if ((s = summarize(&r, &excl, &nexcl)) != NVFP4MOE_OK) {
        goto done;
    }

    // Shards, then every tensor to its place.
    if ((s = nvfp4moe_st_shards_layout(r.sh, opt->max_shard_bytes, out_dir)) != NVFP4MOE_OK) goto done;
    r.left = malloc(sizeof(uint64_t) * (size_t)(r.n ? r.n : 1));
    if (!r.left) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    r.pr = (nvfp4moe_quantize_progress){.tensors_total = r.n, .layers_total = r.nlayers, .layer = -1, .last_layer = -1};
    for (int64_t i = 0; i < r.n; i++) {
        r.left[i] = nvfp4moe_st_shards_bytes(r.sh, i);
        r.pr.bytes_total += r.left[i];
    }
    report(&r);
    for (int64_t i = 0; i < r.n && s == NVFP4MOE_OK; i++) {
        if (r.e[i].src) {
            s = copy_tensor(&r, i, buf, bufsize);
            report(&r);
        } else if (i == r.layers[r.e[i].layer].first) {
            s = write_layer(&r, r.e[i].layer);
        }
    }
    if (s == NVFP4MOE_OK) s = nvfp4moe_st_shards_finish(r.sh);
    if (s == NVFP4MOE_OK) {
        configs_written = true;
        s = nvfp4moe_model_config_write_quantized(out_dir, config, opt->format, opt->w4a16,
                                                  (const char *const *)excl, nexcl);
    }
    // The directory's other files (tokenizer, generation config, ...).
    DIR *d = s == NVFP4MOE_OK ? opendir(in_dir) : NULL;
    for (struct dirent *de; d && s == NVFP4MOE_OK && (de = readdir(d));) {
        if (!copy_other(de->d_name)) continue;
        bool created = false;
        s = copy_file(in_dir, out_dir, de->d_name, buf, bufsize, &created);
        if (created) {
            nvfp4moe_status ps = push_name(&other, &nother, &capother, de->d_name, strlen(de->d_name));
            if (s == NVFP4MOE_OK) s = ps;
        }
    }
    if (d) closedir(d);
    if (s == NVFP4MOE_OK && nother) {
        snprintf(path, sizeof path, "%s/%s", out_dir, other[0]);
        s = nvfp4moe_sync_parent_dir(path);
    }
    if (s == NVFP4MOE_OK && result) {
        result->moe_layers = r.nlayers;
        result->tensors = r.n;
        result->tensors_copied = 0;
        for (int64_t i = 0; i < r.n; i++) result->tensors_copied += r.e[i].src != NULL;
        result->tensors_quantized = r.n - result->tensors_copied;
        result->bytes = r.pr.bytes_total;
        result->shards = nvfp4moe_st_shards_files(r.sh);
        result->excluded = (int32_t)nexcl;
        result->files_copied = (int32_t)nother;
    }

done:
    if (s != NVFP4MOE_OK) {   // nothing of this call is left in out_dir
        nvfp4moe_st_shards_discard(r.sh);
        if (configs_written) {
            snprintf(path, sizeof path, "%s/config.json", out_dir);
            unlink(path);
            snprintf(path, sizeof path, "%s/hf_quant_config.json", out_dir);
            unlink(path);
        }
        for (size_t i = 0; i < nother; i++) {
            snprintf(path, sizeof path, "%s/%s", out_dir, other[i]);
            unlink(path);
        }
        if (result) memset(result, 0, sizeof *result);
    }
    nvfp4moe_st_shards_free(r.sh);
    free_names(r.quantized, r.nq);
    free_names(r.unquantized, r.nu);
    free_names(excl, nexcl);
    free_names(other, nother);
    free(r.layers);
    free(r.e);
    free(r.left);
    free(owner);
    free(buf);
    free(config);
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
    return s;
}
