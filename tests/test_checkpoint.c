/*
 * test_checkpoint.c - model directories end to end: quantize -> write -> load -> run equals the
 * in-memory layer; ModelOpt per-expert, ModelOpt fused (both layouts) and compressed-tensors give
 * the same weights and the same output; gate/up scale reconciliation is numerically right; broken
 * checkpoints (missing scale tensor, wrong dtype, wrong shape, bad scale values) each fail with
 * their own message; config.json of real model families maps to the right deployment config;
 * gpt-oss's router bias is loaded, kept through quantization and shifts the routing; gpt-oss's
 * mlp.router keeps its name through quantize --in, and the quantization config excludes it;
 * gpt-oss's expert biases survive quantize --in in every format.
 * Every fixture is generated at test time in a temporary directory.
 */
#include "ckpt_fixtures.h"

/* Runs the reference on M tokens of seeded hidden states, routed by the layer's router. */
static float *run_layer(const nvfp4moe_config *cfg, const nvfp4moe_weights *w, const float *router,
                        int64_t M, uint64_t seed) {
    const int64_t H = cfg->hidden_size, E = cfg->num_experts;
    float *x = malloc(sizeof(float) * (size_t)(M * H)), *logits = malloc(sizeof(float) * (size_t)(M * E));
    float *out = calloc((size_t)(M * H), sizeof(float));
    uint64_t st = seed;
    for (int64_t i = 0; i < M * H; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t e = 0; e < E; e++) {
            double acc = 0;
            for (int64_t k = 0; k < H; k++) acc += (double)x[m * H + k] * router[e * H + k];
            logits[m * E + e] = (float)acc;
        }
    nvfp4moe_io io = {.num_tokens = M, .hidden = x, .router_logits = logits, .output = out};
    nvfp4moe_status s = nvfp4moe_reference_forward(cfg, w, &io);
    CHECK(s == NVFP4MOE_OK, "reference_forward: %s", nvfp4moe_last_error());
    free(x);
    free(logits);
    return out;
}

static bool same_weights(const nvfp4moe_config *cfg, const nvfp4moe_weights *a,
                         const nvfp4moe_weights *b) {
    const size_t E = (size_t)cfg->num_experts, H = (size_t)cfg->hidden_size,
                 I = (size_t)cfg->intermediate_size, N1 = (size_t)nvfp4moe_config_n1(cfg);
    int ok = check_bytes("w13", b->w13, a->w13, E * N1 * H / 2) &
             check_bytes("w13_scale", b->w13_scale, a->w13_scale, E * N1 * H / 16) &
             check_bytes("w2", b->w2, a->w2, E * H * I / 2) &
             check_bytes("w2_scale", b->w2_scale, a->w2_scale, E * H * I / 16) &
             check_bytes("w13_scale_2", (const uint8_t *)b->w13_scale_2,
                         (const uint8_t *)a->w13_scale_2, E * 4) &
             check_bytes("w2_scale_2", (const uint8_t *)b->w2_scale_2,
                         (const uint8_t *)a->w2_scale_2, E * 4);
    if (cfg->scheme != NVFP4MOE_SCHEME_W4A16 && a->w13_input_scale && b->w13_input_scale)
        ok &= check_bytes("w13_input_scale", (const uint8_t *)b->w13_input_scale,
                          (const uint8_t *)a->w13_input_scale, E * 4) &
              check_bytes("w2_input_scale", (const uint8_t *)b->w2_input_scale,
                          (const uint8_t *)a->w2_input_scale, E * 4);
    return ok;
}

static bool same_floats(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* Whether dir/model.safetensors holds a tensor of that name. */
static bool file_has_tensor(const char *dir, const char *name) {
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    nvfp4moe_st_file *f = NULL;
    if (nvfp4moe_st_open(p, &f) != NVFP4MOE_OK) return false;
    bool has = nvfp4moe_st_file_find(f, name) != NULL;
    nvfp4moe_st_close(f);
    return has;
}

// ---- round trips ----


static void test_round_trip_formats(void) {
    T_CASE("quantize -> write -> load -> run, every format");
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 7);
    if (!q) return;
    CHECK(q->router != NULL, "quantized layer has no router");
    const int64_t M = 9, H = cfg.hidden_size;
    float *want = run_layer(&q->layer.cfg, &q->layer.w, q->router, M, 99);
    const nvfp4moe_ckpt_format fmts[] = {NVFP4MOE_CKPT_MODELOPT, NVFP4MOE_CKPT_MODELOPT_FUSED,
                                         NVFP4MOE_CKPT_COMPRESSED_TENSORS};
    const char *names[] = {"rt_modelopt", "rt_fused", "rt_ct"};
    for (int i = 0; i < 3; i++) {
        T_CASE(names[i]);
        const char *d = dir_in(names[i]);
        save_layer(d, fmts[i], q, 1);
        nvfp4moe_ckpt_layer *l = NULL;
        CHECK_OK(nvfp4moe_ckpt_layer_load(d, 1, &l));
        if (!l) continue;
        CHECK(l->format == fmts[i], "format %s, want %s", nvfp4moe_ckpt_format_name(l->format),
              nvfp4moe_ckpt_format_name(fmts[i]));
        CHECK(l->warnings.count == 0, "unexpected warning: %s", l->warnings.text[0]);
        CHECK(l->layer.cfg.num_experts == 4 && l->layer.cfg.top_k == 2 &&
                  l->layer.cfg.hidden_size == 64 && l->layer.cfg.intermediate_size == 32 &&
                  l->layer.cfg.routing == NVFP4MOE_ROUTING_RENORMALIZE &&
                  l->layer.cfg.activation == NVFP4MOE_ACT_SILU &&
                  l->layer.cfg.scheme == NVFP4MOE_SCHEME_W4A4,
              "config from config.json differs");
        same_weights(&cfg, &q->layer.w, &l->layer.w);
        CHECK(l->router && same_floats(l->router, q->router, (size_t)(4 * H)), "router differs");
        // Run with the loaded config but the test's f32 dtypes (config.json says bf16).
        nvfp4moe_config rc = l->layer.cfg;
        rc.in_dtype = rc.out_dtype = NVFP4MOE_DTYPE_F32;
        float *got = run_layer(&rc, &l->layer.w, l->router, M, 99);
        CHECK(same_floats(got, want, (size_t)(M * H)), "%s output differs from in-memory",
              names[i]);
        free(got);
        nvfp4moe_ckpt_layer_free(l);
    }
    free(want);

    T_CASE("a layer split over two shards with an index");
    {
        char p[700];
        snprintf(p, sizeof p, "%s/model.safetensors", dir_in("rt_modelopt"));
        nvfp4moe_st_file *f = NULL;
        CHECK_OK(nvfp4moe_st_open(p, &f));
        const char *sd = dir_in("rt_sharded");
        nvfp4moe_st_writer *w[2] = {NULL, NULL};
        CHECK_OK(nvfp4moe_st_writer_create(&w[0]));
        CHECK_OK(nvfp4moe_st_writer_create(&w[1]));
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", sd);
        FILE *idx = fopen(p, "w");
        fprintf(idx, "{\"metadata\":{},\"weight_map\":{");
        size_t n = f ? nvfp4moe_st_file_count(f) : 0;
        for (size_t k = 0; k < n; k++) {
            const nvfp4moe_st_tensor *t = nvfp4moe_st_file_tensor(f, k);
            int shard = k < n / 2 ? 0 : 1;
            CHECK_OK(nvfp4moe_st_writer_add(w[shard], t->name, t->dtype, t->ndim, t->shape, t->data));
            fprintf(idx, "%s\"%s\":\"model-0000%d-of-00002.safetensors\"", k ? "," : "", t->name, shard + 1);
        }
        fprintf(idx, "}}");
        fclose(idx);
        for (int k = 0; k < 2; k++) {
            snprintf(p, sizeof p, "%s/model-0000%d-of-00002.safetensors", sd, k + 1);
            CHECK_OK(nvfp4moe_st_writer_save(w[k], p));
            nvfp4moe_st_writer_free(w[k]);
        }
        nvfp4moe_st_close(f);
        char cmd[1500];
        snprintf(cmd, sizeof cmd, "cp %s/*.json %s/", dir_in("rt_modelopt"), sd);
        CHECK(system(cmd) == 0, "copy configs");
        nvfp4moe_ckpt_layer *l = NULL;
        CHECK_OK(nvfp4moe_ckpt_layer_load(sd, 1, &l));
        if (l) same_weights(&cfg, &q->layer.w, &l->layer.w);
        nvfp4moe_ckpt_layer_free(l);
    }

    T_CASE("not a MoE layer / out of range");
    nvfp4moe_ckpt_layer *l = NULL;
    CHECK_ERR(nvfp4moe_ckpt_layer_load(dir_in("rt_modelopt"), 0, &l), NVFP4MOE_ERR_NOT_FOUND,
              "layer 0 is not a MoE layer");
    CHECK_ERR(nvfp4moe_ckpt_layer_load(dir_in("rt_modelopt"), 5, &l),
              NVFP4MOE_ERR_INVALID_ARGUMENT, "the model has layers 0..1");
    CHECK(l == NULL, "output written on failure");
    nvfp4moe_ckpt_layer_free(q);
}

/* Llama-4 exports keep the fused experts in the HF [in, out] layout: transposed weight and scale. */
static void test_fused_transposed(void) {
    T_CASE("fused experts, transposed (Llama-4) layout");
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 11);
    if (!q) return;
    const int64_t E = 4, H = 64, I = 32, N1 = 64;
    const nvfp4moe_weights *w = &q->layer.w;
    uint8_t *t13 = malloc((size_t)(E * N1 * H / 2)), *t13s = malloc((size_t)(E * N1 * H / 16));
    uint8_t *t2 = malloc((size_t)(E * H * I / 2)), *t2s = malloc((size_t)(E * H * I / 16));
    for (int64_t e = 0; e < E; e++) {
        for (int64_t n = 0; n < N1; n++) {
            for (int64_t k = 0; k < H / 2; k++)
                t13[(e * (H / 2) + k) * N1 + n] = w->w13[(e * N1 + n) * (H / 2) + k];
            for (int64_t k = 0; k < H / 16; k++)
                t13s[(e * (H / 16) + k) * N1 + n] = w->w13_scale[(e * N1 + n) * (H / 16) + k];
        }
        for (int64_t n = 0; n < H; n++) {
            for (int64_t k = 0; k < I / 2; k++)
                t2[(e * (I / 2) + k) * H + n] = w->w2[(e * H + n) * (I / 2) + k];
            for (int64_t k = 0; k < I / 16; k++)
                t2s[(e * (I / 16) + k) * H + n] = w->w2_scale[(e * H + n) * (I / 16) + k];
        }
    }
    // Gate and up scale_2 as a [E, 2] pair and a scalar input scale: shapes real exports use.
    float s13[8], in13[1], in2[4];
    for (int e = 0; e < 4; e++) s13[2 * e] = s13[2 * e + 1] = w->w13_scale_2[e];
    in13[0] = 0;
    for (int e = 0; e < 4; e++) in13[0] = in13[0] > w->w13_input_scale[e] ? in13[0] : w->w13_input_scale[e];
    for (int e = 0; e < 4; e++) in2[e] = w->w2_input_scale[e];
    const char *d = dir_in("fused_t");
    nvfp4moe_st_writer *wr;
    CHECK_OK(nvfp4moe_st_writer_create(&wr));
    const char *b = "model.layers.0.mlp.";
    char n[200];
    int64_t s_13[3] = {E, H / 2, N1}, s_13s[3] = {E, H / 16, N1}, s_2[3] = {E, I / 2, H},
            s_2s[3] = {E, I / 16, H}, s_e2[2] = {E, 2}, s_e[1] = {E};
#define PUT(suffix, dt, nd, shape, data)                                                           \
    snprintf(n, sizeof n, "%s%s", b, suffix);                                                      \
    CHECK_OK(nvfp4moe_st_writer_add(wr, n, dt, nd, shape, data))
    PUT("experts.gate_up_proj", NVFP4MOE_ST_U8, 3, s_13, t13);
    PUT("experts.gate_up_proj_weight_scale", NVFP4MOE_ST_F8_E4M3, 3, s_13s, t13s);
    PUT("experts.gate_up_proj_weight_scale_2", NVFP4MOE_ST_F32, 2, s_e2, s13);
    PUT("experts.gate_up_proj_input_scale", NVFP4MOE_ST_F32, 0, NULL, in13);
    PUT("experts.down_proj", NVFP4MOE_ST_U8, 3, s_2, t2);
    PUT("experts.down_proj_weight_scale", NVFP4MOE_ST_F8_E4M3, 3, s_2s, t2s);
    PUT("experts.down_proj_weight_scale_2", NVFP4MOE_ST_F32, 1, s_e, w->w2_scale_2);
    PUT("experts.down_proj_input_scale", NVFP4MOE_ST_F32, 1, s_e, in2);
#undef PUT
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    CHECK_OK(nvfp4moe_st_writer_save(wr, p));
    nvfp4moe_st_writer_free(wr);
    CHECK_OK(nvfp4moe_model_config_write(d, &q->layer.cfg, 1, 0, NVFP4MOE_CKPT_MODELOPT_FUSED, NULL, NULL));
    nvfp4moe_ckpt_layer *l = NULL;
    CHECK_OK(nvfp4moe_ckpt_layer_load(d, 0, &l));
    if (l) {
        const size_t sz = (size_t)E;
        check_bytes("w13", l->layer.w.w13, w->w13, (size_t)(E * N1 * H / 2));
        check_bytes("w13_scale", l->layer.w.w13_scale, w->w13_scale, (size_t)(E * N1 * H / 16));
        check_bytes("w2", l->layer.w.w2, w->w2, (size_t)(E * H * I / 2));
        check_bytes("w2_scale", l->layer.w.w2_scale, w->w2_scale, (size_t)(E * H * I / 16));
        CHECK(same_floats(l->layer.w.w13_scale_2, w->w13_scale_2, sz), "scale_2");
        for (int e = 0; e < 4; e++)
            CHECK(l->layer.w.w13_input_scale[e] == in13[0], "broadcast input scale, expert %d", e);
        CHECK(l->router == NULL, "no router in this file");
        nvfp4moe_ckpt_layer_free(l);
    }
    free(t13);
    free(t13s);
    free(t2);
    free(t2s);
    nvfp4moe_ckpt_layer_free(q);
}

/* Every decoder-layer prefix a published MoE checkpoint uses loads, whatever config.json's model
 * type suggests: plain causal LMs (model.layers), Llama-4's multimodal wrapper
 * (language_model.model.layers) and Qwen3-VL-MoE / Qwen3.5-MoE's (model.language_model.layers). */
static void test_layer_prefixes(void) {
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 13);
    if (!q) return;
    const char *prefixes[] = {"model.layers", "language_model.model.layers", "model.language_model.layers"};
    for (int i = 0; i < 3; i++) {
        char name[96], sub[16];
        snprintf(name, sizeof name, "layer prefix %s", prefixes[i]);
        T_CASE(name);
        snprintf(sub, sizeof sub, "prefix%d", i);
        const char *d = dir_in(sub);
        nvfp4moe_st_writer *w = NULL;
        CHECK_OK(nvfp4moe_st_writer_create(&w));
        CHECK_OK(nvfp4moe_ckpt_add_layer(w, NVFP4MOE_CKPT_MODELOPT, prefixes[i], 1, q, NULL));
        char p[700];
        snprintf(p, sizeof p, "%s/model.safetensors", d);
        CHECK_OK(nvfp4moe_st_writer_save(w, p));
        nvfp4moe_st_writer_free(w);
        CHECK_OK(nvfp4moe_model_config_write(d, &q->layer.cfg, 2, 1, NVFP4MOE_CKPT_MODELOPT, NULL, NULL));
        nvfp4moe_ckpt_layer *l = NULL;
        CHECK_OK(nvfp4moe_ckpt_layer_load(d, 1, &l));
        if (l) {
            same_weights(&cfg, &q->layer.w, &l->layer.w);
            CHECK(l->router && same_floats(l->router, q->router, (size_t)(cfg.num_experts * cfg.hidden_size)),
                  "router under %s", prefixes[i]);
        }
        nvfp4moe_ckpt_layer_free(l);
    }
    T_CASE("a prefix no checkpoint uses: the message lists the ones tried");
    {
        const char *d = dir_in("prefix_other");
        nvfp4moe_st_writer *w = NULL;
        CHECK_OK(nvfp4moe_st_writer_create(&w));
        CHECK_OK(nvfp4moe_ckpt_add_layer(w, NVFP4MOE_CKPT_MODELOPT, "transformer.h", 1, q, NULL));
        char p[700];
        snprintf(p, sizeof p, "%s/model.safetensors", d);
        CHECK_OK(nvfp4moe_st_writer_save(w, p));
        nvfp4moe_st_writer_free(w);
        CHECK_OK(nvfp4moe_model_config_write(d, &q->layer.cfg, 2, 1, NVFP4MOE_CKPT_MODELOPT, NULL, NULL));
        nvfp4moe_ckpt_layer *l = NULL;
        CHECK_ERR(nvfp4moe_ckpt_layer_load(d, 1, &l), NVFP4MOE_ERR_NOT_FOUND,
                  "{model.layers,language_model.model.layers,model.language_model.layers}.1.{mlp,");
        CHECK(l == NULL, "output written on failure");
    }
    nvfp4moe_ckpt_layer_free(q);
}

/* dir_src/model.safetensors copied to dir_dst with every tensor renamed by rename (NULL: dropped),
 * and dir_src's configs. */
static void copy_renamed(const char *src_dir, const char *dst_dir, void (*rename)(const char *, char *, size_t)) {
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", src_dir);
    nvfp4moe_st_file *f = NULL;
    CHECK_OK(nvfp4moe_st_open(p, &f));
    nvfp4moe_st_writer *w = NULL;
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    for (size_t i = 0; f && i < nvfp4moe_st_file_count(f); i++) {
        const nvfp4moe_st_tensor *t = nvfp4moe_st_file_tensor(f, i);
        char name[320];
        rename(t->name, name, sizeof name);
        CHECK_OK(nvfp4moe_st_writer_add(w, name, t->dtype, t->ndim, t->shape, t->data));
    }
    nvfp4moe_st_close(f);
    snprintf(p, sizeof p, "%s/model.safetensors", dst_dir);
    CHECK_OK(nvfp4moe_st_writer_save(w, p));
    nvfp4moe_st_writer_free(w);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "cp '%s'/*.json '%s'/", src_dir, dst_dir);
    CHECK(system(cmd) == 0, "copy configs");
}

/* "model.layers.L.mlp.experts.E.P.leaf" -> "model.language_model.layers.L.mlp.experts.P.E.leaf", as
 * ModelOpt writes Qwen3-VL-MoE (the projection before the expert index). */
static void rename_proj_first(const char *in, char *out, size_t len) {
    const char *x = strstr(in, ".experts.");
    const char *rest = in + strlen("model.layers");
    if (!x) {
        snprintf(out, len, "model.language_model.layers%s", rest);
        return;
    }
    const char *e = x + strlen(".experts."), *dot = strchr(e, '.'), *leaf = dot ? strchr(dot + 1, '.') : NULL;
    if (!dot || !leaf) {
        snprintf(out, len, "model.language_model.layers%s", rest);
        return;
    }
    snprintf(out, len, "model.language_model.layers%.*s.experts.%.*s.%.*s%s", (int)(x - rest), rest,
             (int)(leaf - dot - 1), dot + 1, (int)(dot - e), e, leaf);
}

/* "mlp." -> "block_sparse_moe.", gate_proj/up_proj/down_proj -> w1/w3/w2: Mixtral's and MiniMax-M2's
 * names. */
static void rename_mixtral(const char *in, char *out, size_t len) {
    char tmp[320];
    const char *m = strstr(in, ".mlp.");
    if (m) snprintf(tmp, sizeof tmp, "%.*s.block_sparse_moe.%s", (int)(m - in), in, m + 5);
    else snprintf(tmp, sizeof tmp, "%s", in);
    const char *from[3] = {"gate_proj", "up_proj", "down_proj"}, *to[3] = {"w1", "w3", "w2"};
    for (int i = 0; i < 3; i++) {
        char *at = strstr(tmp, from[i]);
        if (!at) continue;
        snprintf(out, len, "%.*s%s%s", (int)(at - tmp), tmp, to[i], at + strlen(from[i]));
        return;
    }
    snprintf(out, len, "%s", tmp);
}

/* MiniMax-M2: Mixtral's names, the correction bias directly under block_sparse_moe. */
static void rename_minimax(const char *in, char *out, size_t len) {
    char tmp[320];
    rename_mixtral(in, tmp, sizeof tmp);
    const char *g = strstr(tmp, ".gate.e_score_correction_bias");
    if (g) snprintf(out, len, "%.*s.e_score_correction_bias", (int)(g - tmp), tmp);
    else snprintf(out, len, "%s", tmp);
}

/* The expert naming vLLM's loaders accept: each one loads to the same layer. */
static void test_expert_names(void) {
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 17);
    if (!q) return;
    const int64_t E = cfg.num_experts, H = cfg.hidden_size;
    const nvfp4moe_ckpt_format fmts[2] = {NVFP4MOE_CKPT_MODELOPT, NVFP4MOE_CKPT_COMPRESSED_TENSORS};
    for (int i = 0; i < 2; i++) {
        char name[128];
        snprintf(name, sizeof name, "%s, experts.<proj>.<e> under model.language_model.layers",
                 nvfp4moe_ckpt_format_name(fmts[i]));
        T_CASE(name);
        const char *src = dir_in(i ? "names_ct" : "names_mo"), *dst = dir_in(i ? "names_ct_pf" : "names_mo_pf");
        save_layer(src, fmts[i], q, 0);
        copy_renamed(src, dst, rename_proj_first);
        CHECK(file_has_tensor(dst, "model.language_model.layers.0.mlp.experts.up_proj.3.weight_scale"),
              "the fixture is named projection first");
        nvfp4moe_ckpt_layer *l = NULL;
        CHECK_OK(nvfp4moe_ckpt_layer_load(dst, 0, &l));
        if (l) {
            same_weights(&cfg, &q->layer.w, &l->layer.w);
            CHECK(l->router && same_floats(l->router, q->router, (size_t)(E * H)), "router");
            CHECK(l->warnings.count == 0, "warning: %s", l->warnings.text[0]);
        }
        nvfp4moe_ckpt_layer_free(l);
        // A missing tensor is named in the layout's own order.
        const char *bad = dir_in(i ? "names_ct_bad" : "names_mo_bad");
        const edit drop = {i ? "model.language_model.layers.0.mlp.experts.down_proj.2.weight_global_scale"
                             : "model.language_model.layers.0.mlp.experts.down_proj.2.weight_scale_2",
                           0, 0, 0, {0}, NULL};
        rewrite(dst, bad, &drop, 1);
        ckpt_load_fails(bad, NVFP4MOE_ERR_NOT_FOUND, drop.name);
    }
    T_CASE("Mixtral / MiniMax-M2: block_sparse_moe.experts.<e>.{w1,w3,w2}");
    {
        const char *src = dir_in("names_mo"), *dst = dir_in("names_mixtral");
        copy_renamed(src, dst, rename_mixtral);
        CHECK(file_has_tensor(dst, "model.layers.0.block_sparse_moe.experts.1.w3.weight") &&
                  file_has_tensor(dst, "model.layers.0.block_sparse_moe.gate.weight"),
              "the fixture has Mixtral's names");
        nvfp4moe_ckpt_layer *l = NULL;
        CHECK_OK(nvfp4moe_ckpt_layer_load(dst, 0, &l));
        if (l) {
            same_weights(&cfg, &q->layer.w, &l->layer.w);
            CHECK(l->router && same_floats(l->router, q->router, (size_t)(E * H)), "router");
        }
        nvfp4moe_ckpt_layer_free(l);
    }
    nvfp4moe_ckpt_layer_free(q);

    T_CASE("MiniMax-M2: block_sparse_moe.e_score_correction_bias");
    {
        nvfp4moe_config mc = small_cfg();
        mc.routing = NVFP4MOE_ROUTING_MINIMAX2;
        mc.has_correction_bias = true;
        mc.routed_scaling_factor = 2.0f;
        nvfp4moe_ckpt_layer *mq = make_quantized(&mc, 23);
        const char *src = dir_in("names_mm_src"), *dst = dir_in("names_minimax");
        if (mq) save_layer(src, NVFP4MOE_CKPT_MODELOPT, mq, 0);
        copy_renamed(src, dst, rename_minimax);
        CHECK(file_has_tensor(dst, "model.layers.0.block_sparse_moe.e_score_correction_bias") &&
                  file_has_tensor(dst, "model.layers.0.block_sparse_moe.experts.0.w1.weight_scale_2"),
              "the fixture has MiniMax-M2's names");
        nvfp4moe_ckpt_layer *l = NULL;
        CHECK_OK(nvfp4moe_ckpt_layer_load(dst, 0, &l));
        if (l && mq) {
            same_weights(&mc, &mq->layer.w, &l->layer.w);
            CHECK(l->layer.cfg.routing == NVFP4MOE_ROUTING_MINIMAX2 && l->layer.w.correction_bias &&
                      same_floats(l->layer.w.correction_bias, mq->layer.w.correction_bias, (size_t)E),
                  "routing %s, correction bias", nvfp4moe_routing_name(l->layer.cfg.routing));
        }
        nvfp4moe_ckpt_layer_free(l);
        nvfp4moe_ckpt_layer_free(mq);
    }

    // Unquantized sources (quantize --in): per expert projection first, and fused experts in both
    // orientations.
    nvfp4moe_float_layer *f = NULL;
    CHECK_OK(nvfp4moe_float_layer_random(&cfg, 19, &f));
    if (!f) return;
    const int64_t I = cfg.intermediate_size, N1 = 2 * I;
    T_CASE("BF16 source, experts.<proj>.<e>");
    {
        const char *src = dir_in("names_f"), *dst = dir_in("names_f_pf");
        write_float_model(src, &cfg, f);
        copy_renamed(src, dst, rename_proj_first);
        nvfp4moe_model_info *info = NULL;
        nvfp4moe_st_model *m = NULL;
        nvfp4moe_float_layer *g = NULL;
        CHECK_OK(nvfp4moe_model_info_read(dst, &info));
        CHECK_OK(nvfp4moe_st_model_open(dst, &m));
        if (info && m) CHECK_OK(nvfp4moe_float_layer_load(info, m, 0, &g));
        if (g)
            CHECK(same_floats(g->w13, f->w13, (size_t)(E * N1 * H)) && same_floats(g->w2, f->w2, (size_t)(E * H * I)),
                  "weights differ");
        nvfp4moe_float_layer_free(g);
        nvfp4moe_st_model_close(m);
        nvfp4moe_model_info_free(info);
    }
    for (int t = 0; t < 2; t++) {
        T_CASE(t ? "BF16 source, fused [E, H, 2I] / [E, I, H] (Qwen3-VL-MoE)"
                 : "BF16 source, fused [E, 2I, H] / [E, H, I] (Transformers v5, Qwen3.5-MoE)");
        const char *dst = dir_in(t ? "names_fused_t" : "names_fused_n");
        nvfp4moe_st_writer *w = NULL;
        CHECK_OK(nvfp4moe_st_writer_create(&w));
        uint16_t *gu = malloc(sizeof(uint16_t) * (size_t)(E * N1 * H)), *dn = malloc(sizeof(uint16_t) * (size_t)(E * H * I));
        for (int64_t e = 0; e < E; e++)
            for (int64_t n = 0; n < N1; n++)
                for (int64_t k = 0; k < H; k++)
                    gu[t ? (e * H + k) * N1 + n : (e * N1 + n) * H + k] =
                        nvfp4moe_bf16_from_float(f->w13[(e * N1 + n) * H + k]);
        for (int64_t e = 0; e < E; e++)
            for (int64_t n = 0; n < H; n++)
                for (int64_t k = 0; k < I; k++)
                    dn[t ? (e * I + k) * H + n : (e * H + n) * I + k] =
                        nvfp4moe_bf16_from_float(f->w2[(e * H + n) * I + k]);
        int64_t dgu[3] = {E, t ? H : N1, t ? N1 : H}, ddn[3] = {E, t ? I : H, t ? H : I};
        CHECK_OK(nvfp4moe_st_writer_add(w, "model.language_model.layers.0.mlp.experts.gate_up_proj", NVFP4MOE_ST_BF16,
                                        3, dgu, gu));
        CHECK_OK(nvfp4moe_st_writer_add(w, "model.language_model.layers.0.mlp.experts.down_proj", NVFP4MOE_ST_BF16, 3,
                                        ddn, dn));
        char p[700];
        snprintf(p, sizeof p, "%s/model.safetensors", dst);
        CHECK_OK(nvfp4moe_st_writer_save(w, p));
        nvfp4moe_st_writer_free(w);
        free(gu);
        free(dn);
        CHECK_OK(nvfp4moe_model_config_write(dst, &cfg, 1, 0, NVFP4MOE_CKPT_UNQUANTIZED, NULL, NULL));
        nvfp4moe_model_info *info = NULL;
        nvfp4moe_st_model *m = NULL;
        nvfp4moe_float_layer *g = NULL;
        CHECK_OK(nvfp4moe_model_info_read(dst, &info));
        CHECK_OK(nvfp4moe_st_model_open(dst, &m));
        if (info && m) CHECK_OK(nvfp4moe_float_layer_load(info, m, 0, &g));
        if (g)
            CHECK(same_floats(g->w13, f->w13, (size_t)(E * N1 * H)) && same_floats(g->w2, f->w2, (size_t)(E * H * I)),
                  "weights differ");
        nvfp4moe_float_layer_free(g);
        nvfp4moe_st_model_close(m);
        nvfp4moe_model_info_free(info);
    }
    nvfp4moe_float_layer_free(f);
}

// ---- broken checkpoints ----

/* Halves every block scale of one projection: exact for normal E4M3 values. Returns a malloc'd
 * copy. */
static uint8_t *halved_scales(const nvfp4moe_st_tensor *t) {
    uint8_t *out = malloc((size_t)t->nbytes);
    const uint8_t *in = t->data;
    for (uint64_t i = 0; i < t->nbytes; i++)
        out[i] = nvfp4moe_e4m3_encode(nvfp4moe_e4m3_decode(in[i]) * 0.5f);
    return out;
}

/* Runs the layer on a host backend (NULL: the float64 reference) over M seeded tokens with seeded
 * router logits; the output as float (f32 in and out). */
static float *run_on(const char *backend, const nvfp4moe_config *cfg, const nvfp4moe_weights *w, int64_t M,
                     uint64_t seed) {
    const int64_t H = cfg->hidden_size, E = cfg->num_experts;
    nvfp4moe_config c = *cfg;
    c.in_dtype = c.out_dtype = NVFP4MOE_DTYPE_F32;
    float *x = malloc(sizeof(float) * (size_t)(M * H)), *lg = malloc(sizeof(float) * (size_t)(M * E));
    float *out = malloc(sizeof(float) * (size_t)(M * H));
    nvfp4moe_fill_normal(x, NVFP4MOE_DTYPE_F32, M * H, seed);
    nvfp4moe_fill_normal(lg, NVFP4MOE_DTYPE_F32, M * E, seed + 1);
    nvfp4moe_io io = {.num_tokens = M, .hidden = x, .router_logits = lg, .output = out};
    nvfp4moe_status s = backend ? t_run_host(backend, &c, w, &io, 0, out) : nvfp4moe_reference_forward(&c, w, &io);
    CHECK(s == NVFP4MOE_OK, "%s: %s", backend ? backend : "reference", nvfp4moe_last_error());
    free(x);
    free(lg);
    return out;
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return sqrt(num / (den > 0 ? den : 1));
}

/* Whether canonical w13 row r is an up row (the test's own statement of the layout). */
static bool up_row(const nvfp4moe_config *c, int64_t r) {
    return c->activation == NVFP4MOE_ACT_SWIGLUOAI ? (r & 1) != 0 : r >= c->intermediate_size;
}

/* A layer whose experts' up halves carry a global scale of their own: expert e's up weights are the
 * random layer's times ratio[e] (up to 10), and each half is quantized with scale_2 = amax / (6*448)
 * of its own rows (what a quantizer that does not share gate/up amax writes). Input scales and w2 come
 * from quantizing the same float weights the ModelOpt way (shared amax), which is *shared. */
typedef struct {
    nvfp4moe_ckpt_layer *shared;
    uint8_t *w13, *sf13;
    float s_gate[16], s_up[16];
    nvfp4moe_weights w;
} split_layer;

/* x nudged to a float whose reciprocal's reciprocal is itself, so that compressed-tensors' stored
 * reciprocal reads back as x. */
static float reciprocal_stable(float x) {
    for (int i = 0; i < 8 && 1.0f / (1.0f / x) != x; i++) x = 1.0f / (1.0f / x);
    return x;
}

static bool split_scale_layer(const nvfp4moe_config *cfg, const float *ratio, uint64_t seed, split_layer *out) {
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, N1 = nvfp4moe_config_n1(cfg);
    memset(out, 0, sizeof *out);
    nvfp4moe_float_layer *f = NULL;
    CHECK_OK(nvfp4moe_float_layer_random(cfg, seed, &f));
    if (!f) return false;
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = 0; r < N1; r++)
            if (up_row(cfg, r))
                for (int64_t k = 0; k < H; k++) f->w13[(e * N1 + r) * H + k] *= ratio[e];
    CHECK_OK(nvfp4moe_float_layer_quantize(f, 16, seed, &out->shared));
    out->w13 = malloc((size_t)(E * N1 * H / 2));
    out->sf13 = malloc((size_t)(E * N1 * H / 16));
    for (int64_t e = 0; e < E && out->shared; e++) {
        float amax[2] = {0, 0};
        for (int64_t r = 0; r < N1; r++)
            for (int64_t k = 0; k < H; k++)
                amax[up_row(cfg, r)] = fmaxf(amax[up_row(cfg, r)], fabsf(f->w13[(e * N1 + r) * H + k]));
        out->s_gate[e] = reciprocal_stable(amax[0] / 2688.0f);
        out->s_up[e] = reciprocal_stable(amax[1] / 2688.0f);
        for (int64_t r = 0; r < N1; r++) {
            const float s2 = up_row(cfg, r) ? out->s_up[e] : out->s_gate[e];
            CHECK_OK(nvfp4moe_quantize(f->w13 + (e * N1 + r) * H, 1, H, 1.0f / s2, out->w13 + (e * N1 + r) * H / 2,
                                       out->sf13 + (e * N1 + r) * H / 16));
        }
    }
    nvfp4moe_float_layer_free(f);
    if (!out->shared) return false;
    out->w = out->shared->layer.w;
    out->w.w13 = out->w13;
    out->w.w13_scale = out->sf13;
    out->w.w13_scale_2 = out->s_gate;
    out->w.w13_up_scale_2 = out->s_up;
    return true;
}

static void split_layer_free(split_layer *s) {
    nvfp4moe_ckpt_layer_free(s->shared);
    free(s->w13);
    free(s->sf13);
}

/* Gate and up with different global scales (real exports have ratios up to 10): each half keeps its
 * own scale through every format, block scales are never re-rounded, and the CPU backends match
 * the float64 reference that applies both at today's bounds. */
static void test_gate_up_scales(void) {
    const float ratio[4] = {1.0f, 1.27f, 3.5f, 10.0f};
    const nvfp4moe_activation acts[2] = {NVFP4MOE_ACT_SILU, NVFP4MOE_ACT_SWIGLUOAI};
    for (int a = 0; a < 2; a++) {
        nvfp4moe_config cfg = small_cfg();
        cfg.activation = acts[a];
        const int64_t E = cfg.num_experts, H = cfg.hidden_size, I = cfg.intermediate_size, N1 = 2 * I, M = 24;
        split_layer sl;
        if (!split_scale_layer(&cfg, ratio, 41 + (uint64_t)a, &sl)) continue;
        char name[160];
        const nvfp4moe_ckpt_format fmts[3] = {NVFP4MOE_CKPT_MODELOPT, NVFP4MOE_CKPT_MODELOPT_FUSED,
                                              NVFP4MOE_CKPT_COMPRESSED_TENSORS};
        nvfp4moe_ckpt_layer q = *sl.shared;   // the shared layer's router, biases and config; split weights
        q.layer.w = sl.w;
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof name, "%s: gate/up scales of ratio up to 10, %s, load exactly",
                     nvfp4moe_activation_name(acts[a]), nvfp4moe_ckpt_format_name(fmts[i]));
            T_CASE(name);
            char sub[32];
            snprintf(sub, sizeof sub, "split_%d_%d", a, i);
            const char *d = dir_in(sub);
            save_layer(d, fmts[i], &q, 0);
            nvfp4moe_ckpt_layer *l = NULL;
            CHECK_OK(nvfp4moe_ckpt_layer_load(d, 0, &l));
            if (!l) continue;
            check_bytes("w13", l->layer.w.w13, sl.w13, (size_t)(E * N1 * H / 2));
            check_bytes("w13_scale (never re-rounded)", l->layer.w.w13_scale, sl.sf13, (size_t)(E * N1 * H / 16));
            CHECK(l->layer.w.w13_up_scale_2 && same_floats(l->layer.w.w13_scale_2, sl.s_gate, (size_t)E) &&
                      same_floats(l->layer.w.w13_up_scale_2, sl.s_up, (size_t)E),
                  "the halves' global scales are not the file's");
            CHECK(l->warnings.count >= 1 && strstr(l->warnings.text[0], "4 of 4 experts have different gate and up "
                                                                        "global scales") &&
                      strstr(l->warnings.text[0], "expert 0") && strstr(l->warnings.text[0], "each half's own"),
                  "warning: %s", l->warnings.count ? l->warnings.text[0] : "(none)");
            nvfp4moe_ckpt_layer_free(l);
        }
        const nvfp4moe_scheme schemes[2] = {NVFP4MOE_SCHEME_W4A16, NVFP4MOE_SCHEME_W4A4};
        for (int sc = 0; sc < 2; sc++) {
            nvfp4moe_config rc = sl.shared->layer.cfg;
            rc.scheme = schemes[sc];
            float *want = run_on(NULL, &rc, &sl.w, M, 77);
            double *wd = malloc(sizeof(double) * (size_t)(M * H));
            for (int64_t k = 0; k < M * H; k++) wd[k] = want[k];
            const double tol = schemes[sc] == NVFP4MOE_SCHEME_W4A16 ? 2e-5 : 3e-3;   // test_backends' bounds
            const char *backends[2] = {"cpu_reference", "cpu_fast"};
            for (int b = 0; b < 2; b++) {
                snprintf(name, sizeof name, "%s %s: %s with split gate/up scales vs the float64 reference",
                         nvfp4moe_activation_name(acts[a]), nvfp4moe_scheme_name(schemes[sc]), backends[b]);
                T_CASE(name);
                float *got = run_on(backends[b], &rc, &sl.w, M, 77);
                check_rel_l2("output", got, wd, (size_t)(M * H), tol);
                free(got);
            }
            // The reference applies the up scale: the split layer is as close to the shared-amax one
            // (both quantize the same weights) as two quantizations are, while one scale for both
            // halves (vLLM's loader) is off by the ratios.
            snprintf(name, sizeof name, "%s %s: the reference applies each half's scale", nvfp4moe_activation_name(acts[a]),
                     nvfp4moe_scheme_name(schemes[sc]));
            T_CASE(name);
            float *shared = run_on(NULL, &rc, &sl.shared->layer.w, M, 77);
            nvfp4moe_weights gate_only = sl.w;
            gate_only.w13_up_scale_2 = NULL;
            float *bad = run_on(NULL, &rc, &gate_only, M, 77);
            const double e_split = rel_l2(want, shared, (size_t)(M * H)), e_bad = rel_l2(bad, shared, (size_t)(M * H));
            CHECK(e_split < 0.2 && e_bad > 0.5 && e_bad > 5 * e_split,
                  "split vs shared %.3g, one scale for both vs shared %.3g", e_split, e_bad);
            free(shared);
            free(bad);
            free(want);
            free(wd);
        }
        if (a == 0) {
            T_CASE("a NaN up-half global scale is refused, naming it");
            float nan_up[4];
            memcpy(nan_up, sl.s_up, sizeof nan_up);
            nan_up[1] = NAN;
            nvfp4moe_weights bad = sl.w;
            bad.w13_up_scale_2 = nan_up;
            CHECK_ERR(nvfp4moe_weights_validate(&sl.shared->layer.cfg, &bad), NVFP4MOE_ERR_INVALID_ARGUMENT,
                      "w13_up_scale_2[expert 1]=nan must be finite and > 0");
        }
        split_layer_free(&sl);
    }

    T_CASE("an up half stored with scale_2 doubled and block scales halved is the same layer");
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 21);
    if (!q) return;
    const char *src = dir_in("rec_src");
    save_layer(src, NVFP4MOE_CKPT_MODELOPT, q, 0);
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    nvfp4moe_st_file *f = NULL;
    CHECK_OK(nvfp4moe_st_open(p, &f));
    if (!f) return;
    const nvfp4moe_st_tensor *us = nvfp4moe_st_file_find(f, "model.layers.0.mlp.experts.2.up_proj.weight_scale");
    CHECK(us != NULL, "up scale tensor");
    if (!us) return;
    uint8_t *halved = halved_scales(us);
    bool exact = true;
    for (uint64_t i = 0; i < us->nbytes; i++)
        exact &= nvfp4moe_e4m3_decode(halved[i]) * 2.0f == nvfp4moe_e4m3_decode(((const uint8_t *)us->data)[i]);
    CHECK(exact, "the fixture's halving is exact");
    float s2 = 2.0f * q->layer.w.w13_scale_2[2], in_gate = 3.0f * q->layer.w.w13_input_scale[2];
    edit ed[3] = {
        {"model.layers.0.mlp.experts.2.up_proj.weight_scale", 1, NVFP4MOE_ST_F8_E4M3, 2,
         {us->shape[0], us->shape[1]}, halved},
        {"model.layers.0.mlp.experts.2.up_proj.weight_scale_2", 1, NVFP4MOE_ST_F32, 0, {0}, &s2},
        {"model.layers.0.mlp.experts.2.gate_proj.input_scale", 1, NVFP4MOE_ST_F32, 0, {0}, &in_gate},
    };
    const char *dst = dir_in("rec_dst");
    rewrite(src, dst, ed, 3);
    nvfp4moe_ckpt_layer *l = NULL;
    CHECK_OK(nvfp4moe_ckpt_layer_load(dst, 0, &l));
    if (l) {
        const int64_t H = cfg.hidden_size, N1 = 2 * cfg.intermediate_size, I = cfg.intermediate_size, M = 16;
        CHECK(l->warnings.count == 2, "%d warnings", l->warnings.count);
        CHECK(l->warnings.count > 1 && strstr(l->warnings.text[1], "different gate and up input scales"),
              "input scale warning: %s", l->warnings.text[1]);
        CHECK(l->layer.w.w13_scale_2[2] == q->layer.w.w13_scale_2[2] && l->layer.w.w13_up_scale_2[2] == s2,
              "expert 2: gate %g up %g, want %g and %g", (double)l->layer.w.w13_scale_2[2],
              (double)l->layer.w.w13_up_scale_2[2], (double)q->layer.w.w13_scale_2[2], (double)s2);
        CHECK(l->layer.w.w13_input_scale[2] == in_gate, "input scale = max over gate/up");
        check_bytes("expert 2's up block scales as stored", l->layer.w.w13_scale + (2 * N1 + I) * H / 16, halved,
                    (size_t)us->nbytes);
        // The same dequantized weights, so the same output, bit for bit (the input scale aside).
        nvfp4moe_config rc = l->layer.cfg;
        rc.scheme = NVFP4MOE_SCHEME_W4A16;
        const char *backends[3] = {NULL, "cpu_reference", "cpu_fast"};
        for (int b = 0; b < 3; b++) {
            float *want = run_on(backends[b], &rc, &q->layer.w, M, 5);
            float *got = run_on(backends[b], &rc, &l->layer.w, M, 5);
            CHECK(same_floats(got, want, (size_t)(M * H)), "%s: output differs from the original layer's",
                  backends[b] ? backends[b] : "reference");
            free(want);
            free(got);
        }
    }
    nvfp4moe_st_close(f);
    free(halved);
    nvfp4moe_ckpt_layer_free(l);
    nvfp4moe_ckpt_layer_free(q);
}

static void test_broken_layers(void) {
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 31);
    if (!q) return;
    const char *src = dir_in("brk_src");
    save_layer(src, NVFP4MOE_CKPT_MODELOPT, q, 0);
    const char *ct = dir_in("brk_ct");
    save_layer(ct, NVFP4MOE_CKPT_COMPRESSED_TENSORS, q, 0);
    uint8_t zeros[64 * 64] = {0};
    float zero = 0.0f, nan = NAN, one = 1.0f;
    const char *dst = dir_in("brk");
    nvfp4moe_ckpt_layer *l = NULL;

    struct {
        const char *what;
        const char *from;
        edit ed;
        nvfp4moe_status st;
        const char *needle;
    } cases[] = {
        {"missing scale tensor", src,
         {"model.layers.0.mlp.experts.3.up_proj.weight_scale_2", 0, 0, 0, {0}, NULL},
         NVFP4MOE_ERR_NOT_FOUND,
         "tensor 'model.layers.0.mlp.experts.3.up_proj.weight_scale_2' not found"},
        {"missing block scales", src,
         {"model.layers.0.mlp.experts.1.down_proj.weight_scale", 0, 0, 0, {0}, NULL},
         NVFP4MOE_ERR_NOT_FOUND, "tensor 'model.layers.0.mlp.experts.1.down_proj.weight_scale' not found"},
        {"missing input scale (W4A4)", src,
         {"model.layers.0.mlp.experts.0.gate_proj.input_scale", 0, 0, 0, {0}, NULL},
         NVFP4MOE_ERR_NOT_FOUND, "experts.0.gate_proj.input_scale' not found"},
        {"missing expert", src,
         {"model.layers.0.mlp.experts.3.down_proj.weight", 0, 0, 0, {0}, NULL},
         NVFP4MOE_ERR_NOT_FOUND, "experts.3.down_proj.weight' not found"},
        {"wrong weight dtype", src,
         {"model.layers.0.mlp.experts.2.gate_proj.weight", 1, NVFP4MOE_ST_I8, 2, {32, 32}, zeros},
         NVFP4MOE_ERR_FORMAT, "experts.2.gate_proj.weight': dtype I8, expected U8"},
        {"wrong scale dtype", src,
         {"model.layers.0.mlp.experts.2.gate_proj.weight_scale", 1, NVFP4MOE_ST_F16, 2, {32, 2}, zeros},
         NVFP4MOE_ERR_FORMAT, "weight_scale': dtype F16, expected F8_E4M3"},
        {"wrong weight shape", src,
         {"model.layers.0.mlp.experts.1.up_proj.weight", 1, NVFP4MOE_ST_U8, 2, {32, 16}, zeros},
         NVFP4MOE_ERR_FORMAT, "experts.1.up_proj.weight': shape [32, 16], expected [32, 32] (packed E2M1)"},
        {"wrong scale shape", src,
         {"model.layers.0.mlp.experts.1.down_proj.weight_scale", 1, NVFP4MOE_ST_F8_E4M3, 2, {64, 4}, zeros},
         NVFP4MOE_ERR_FORMAT, "shape [64, 4], expected [64, 2]"},
        {"scale_2 not a scalar", src,
         {"model.layers.0.mlp.experts.0.down_proj.weight_scale_2", 1, NVFP4MOE_ST_F32, 1, {2}, zeros},
         NVFP4MOE_ERR_FORMAT, "expected [] or [1] (one value)"},
        {"zero scale_2", src,
         {"model.layers.0.mlp.experts.0.down_proj.weight_scale_2", 1, NVFP4MOE_ST_F32, 0, {0}, &zero},
         NVFP4MOE_ERR_FORMAT, "down_proj.weight_scale_2': value 0 must be finite and > 0"},
        {"NaN input scale", src,
         {"model.layers.0.mlp.experts.0.up_proj.input_scale", 1, NVFP4MOE_ST_F32, 0, {0}, &nan},
         NVFP4MOE_ERR_FORMAT, "up_proj.input_scale': value nan must be finite and > 0"},
        {"router of the wrong shape", src,
         {"model.layers.0.mlp.gate.weight", 1, NVFP4MOE_ST_F32, 2, {4, 32}, zeros},
         NVFP4MOE_ERR_FORMAT, "mlp.gate.weight': shape [4, 32], expected [4, 64]"},
        {"compressed-tensors: missing global scale", ct,
         {"model.layers.0.mlp.experts.2.gate_proj.weight_global_scale", 0, 0, 0, {0}, NULL},
         NVFP4MOE_ERR_NOT_FOUND, "experts.2.gate_proj.weight_global_scale' not found"},
        {"compressed-tensors: zero global scale", ct,
         {"model.layers.0.mlp.experts.2.gate_proj.input_global_scale", 1, NVFP4MOE_ST_F32, 1, {1}, &zero},
         NVFP4MOE_ERR_FORMAT, "input_global_scale': value 0 must be finite and > 0"},
        {"compressed-tensors: packed weight shape", ct,
         {"model.layers.0.mlp.experts.0.down_proj.weight_packed", 1, NVFP4MOE_ST_U8, 2, {64, 32}, zeros},
         NVFP4MOE_ERR_FORMAT, "down_proj.weight_packed': shape [64, 32], expected [64, 16]"},
        {"control: a valid edit loads", src,
         {"model.layers.0.mlp.experts.0.down_proj.weight_scale_2", 1, NVFP4MOE_ST_F32, 1, {1}, &one},
         NVFP4MOE_OK, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        T_CASE(cases[i].what);
        rewrite(cases[i].from, dst, &cases[i].ed, 1);
        l = NULL;
        if (cases[i].st == NVFP4MOE_OK) {
            CHECK_OK(nvfp4moe_ckpt_layer_load(dst, 0, &l));
            CHECK(l && l->layer.w.w2_scale_2[0] == 1.0f, "edited value not loaded");
            nvfp4moe_ckpt_layer_free(l);
            continue;
        }
        ckpt_load_fails(dst, cases[i].st, cases[i].needle);
    }

    T_CASE("config.json that contradicts the tensors");
    rewrite(src, dst, NULL, 0);
    const char *cfg_fmt = "{\"model_type\":\"qwen3_moe\",\"hidden_size\":%d,\"moe_intermediate_size\":32,"
                          "\"num_experts\":4,\"num_experts_per_tok\":2,\"num_hidden_layers\":1,"
                          "\"quantization_config\":{\"quant_method\":\"modelopt\",\"quant_algo\":\"NVFP4\"}}";
    char text[600];
    snprintf(text, sizeof text, cfg_fmt, 72);
    write_text(dst, "config.json", text);
    CHECK_ERR(nvfp4moe_ckpt_layer_load(dst, 0, &l), NVFP4MOE_ERR_INVALID_ARGUMENT, "hidden_size=72");
    snprintf(text, sizeof text, cfg_fmt, 128);
    write_text(dst, "config.json", text);
    CHECK_ERR(nvfp4moe_ckpt_layer_load(dst, 0, &l), NVFP4MOE_ERR_FORMAT,
              "mlp.gate.weight': shape [4, 64], expected [4, 128] (experts, hidden)");

    T_CASE("unquantized layer");
    nvfp4moe_float_layer *f = NULL;
    CHECK_OK(nvfp4moe_float_layer_random(&cfg, 3, &f));
    const char *bf = dir_in("bf16_src");
    write_float_model(bf, &cfg, f);
    CHECK_ERR(nvfp4moe_ckpt_layer_load(bf, 0, &l), NVFP4MOE_ERR_UNSUPPORTED,
              "is not NVFP4-quantized");
    // ... but it loads as a float layer, exactly (the random weights are bf16-rounded).
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_st_model *m = NULL;
    nvfp4moe_float_layer *g = NULL;
    CHECK_OK(nvfp4moe_model_info_read(bf, &info));
    CHECK_OK(nvfp4moe_st_model_open(bf, &m));
    if (info && m) CHECK_OK(nvfp4moe_float_layer_load(info, m, 0, &g));
    if (g) {
        CHECK(same_floats(g->w13, f->w13, 4 * 64 * 64), "w13 round trip");
        CHECK(same_floats(g->w2, f->w2, 4 * 64 * 32), "w2 round trip");
        CHECK(g->router && same_floats(g->router, f->router, 4 * 64), "router round trip");
    }
    nvfp4moe_float_layer_free(g);
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
    nvfp4moe_float_layer_free(f);
    nvfp4moe_ckpt_layer_free(q);
}

/* W4A16 checkpoints store no input scales; DeepSeek routing carries a correction bias. */
static void test_schemes_and_bias(void) {
    T_CASE("W4A16 ModelOpt and compressed-tensors");
    nvfp4moe_config cfg = small_cfg();
    cfg.scheme = NVFP4MOE_SCHEME_W4A16;
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 41);
    if (!q) return;
    for (int k = 0; k < 2; k++) {
        const char *d = dir_in(k ? "w4a16_ct" : "w4a16_mo");
        save_layer(d, k ? NVFP4MOE_CKPT_COMPRESSED_TENSORS : NVFP4MOE_CKPT_MODELOPT, q, 0);
        nvfp4moe_ckpt_layer *l = NULL;
        CHECK_OK(nvfp4moe_ckpt_layer_load(d, 0, &l));
        if (!l) continue;
        CHECK(l->layer.cfg.scheme == NVFP4MOE_SCHEME_W4A16, "scheme %s",
              nvfp4moe_scheme_name(l->layer.cfg.scheme));
        CHECK(l->layer.w.w13_input_scale == NULL && l->layer.w.w2_input_scale == NULL,
              "W4A16 has no input scales");
        same_weights(&cfg, &q->layer.w, &l->layer.w);
        nvfp4moe_ckpt_layer_free(l);
    }
    nvfp4moe_ckpt_layer_free(q);

    T_CASE("deepseek_v3 routing with e_score_correction_bias");
    cfg = small_cfg();
    cfg.num_experts = 8;
    cfg.routing = NVFP4MOE_ROUTING_DEEPSEEK_V3;
    cfg.n_group = 2;
    cfg.topk_group = 1;
    cfg.has_correction_bias = true;
    cfg.routed_scaling_factor = 2.5f;
    q = make_quantized(&cfg, 51);
    if (!q) return;
    const char *d = dir_in("dsv3");
    save_layer(d, NVFP4MOE_CKPT_MODELOPT, q, 2);
    nvfp4moe_ckpt_layer *l = NULL;
    CHECK_OK(nvfp4moe_ckpt_layer_load(d, 2, &l));
    if (l) {
        const nvfp4moe_config *c = &l->layer.cfg;
        CHECK(c->routing == NVFP4MOE_ROUTING_DEEPSEEK_V3 && c->n_group == 2 && c->topk_group == 1 &&
                  c->has_correction_bias && c->routed_scaling_factor == 2.5f,
              "routing %s n_group %d topk_group %d bias %d rsf %g", nvfp4moe_routing_name(c->routing),
              c->n_group, c->topk_group, c->has_correction_bias, (double)c->routed_scaling_factor);
        CHECK(l->layer.w.correction_bias &&
                  same_floats(l->layer.w.correction_bias, q->layer.w.correction_bias, 8),
              "correction bias");
        nvfp4moe_config rc = *c;
        rc.in_dtype = rc.out_dtype = NVFP4MOE_DTYPE_F32;
        float *a = run_layer(&rc, &l->layer.w, l->router, 7, 3);
        float *b = run_layer(&q->layer.cfg, &q->layer.w, q->router, 7, 3);
        CHECK(same_floats(a, b, 7 * 64), "deepseek layer output differs");
        free(a);
        free(b);
        nvfp4moe_ckpt_layer_free(l);
    }
    T_CASE("deepseek_v3 without its correction bias");
    edit ed = {"model.layers.2.mlp.gate.e_score_correction_bias", 0, 0, 0, {0}, NULL};
    const char *d2 = dir_in("dsv3_nobias");
    rewrite(d, d2, &ed, 1);
    l = NULL;
    CHECK_ERR(nvfp4moe_ckpt_layer_load(d2, 2, &l), NVFP4MOE_ERR_NOT_FOUND,
              "gate.e_score_correction_bias' not found");
    nvfp4moe_ckpt_layer_free(q);
}

// ---- config.json ----

static nvfp4moe_model_info *parse(const char *cfg, const char *hfq) {
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_status s = nvfp4moe_model_info_parse(cfg, hfq, "m", &info);
    CHECK(s == NVFP4MOE_OK, "parse: %s", nvfp4moe_last_error());
    return info;
}

static void test_model_configs(void) {
    T_CASE("DeepSeek-V3 / R1 NVFP4");
    nvfp4moe_model_info *i = parse(
        "{\"model_type\":\"deepseek_v3\",\"hidden_size\":7168,\"moe_intermediate_size\":2048,"
        "\"intermediate_size\":18432,\"n_routed_experts\":256,\"n_shared_experts\":1,"
        "\"num_experts_per_tok\":8,\"n_group\":8,\"topk_group\":4,\"routed_scaling_factor\":2.5,"
        "\"scoring_func\":\"sigmoid\",\"topk_method\":\"noaux_tc\",\"norm_topk_prob\":true,"
        "\"first_k_dense_replace\":3,\"moe_layer_freq\":1,\"num_hidden_layers\":61,"
        "\"hidden_act\":\"silu\",\"torch_dtype\":\"bfloat16\"}",
        "{\"producer\":{\"name\":\"modelopt\",\"version\":\"0.23.0\"},\"quantization\":"
        "{\"quant_algo\":\"NVFP4\",\"kv_cache_quant_algo\":null,\"group_size\":16,"
        "\"exclude_modules\":[\"lm_head\",\"model.layers.30.self_attn*\",\"model.layers.26.mlp.gate\"]}}");
    if (i) {
        const nvfp4moe_config *c = &i->cfg;
        CHECK(c->num_experts == 256 && c->intermediate_size == 2048 && c->top_k == 8 &&
                  c->hidden_size == 7168 && c->routing == NVFP4MOE_ROUTING_DEEPSEEK_V3 &&
                  c->n_group == 8 && c->topk_group == 4 && c->routed_scaling_factor == 2.5f &&
                  c->has_correction_bias && c->activation == NVFP4MOE_ACT_SILU &&
                  c->scheme == NVFP4MOE_SCHEME_W4A4,
              "deepseek config");
        CHECK(i->num_layers == 61 && i->num_moe_layers == 58 && i->first_moe_layer == 3, "layers");
        CHECK(!nvfp4moe_model_info_is_moe_layer(i, 2) && nvfp4moe_model_info_is_moe_layer(i, 3) &&
                  nvfp4moe_model_info_is_moe_layer(i, 60) && !nvfp4moe_model_info_is_moe_layer(i, 61),
              "moe layers");
        CHECK(i->quantized && i->format == NVFP4MOE_CKPT_MODELOPT && !strcmp(i->quant_algo, "NVFP4") &&
                  !strcmp(i->quant_source, "hf_quant_config.json") && i->num_shared_experts == 1,
              "quant");
        CHECK(i->num_excluded == 3 && nvfp4moe_model_info_is_excluded(i, "model.layers.26.mlp.gate") &&
                  nvfp4moe_model_info_is_excluded(i, "model.layers.30.self_attn.q_proj") &&
                  !nvfp4moe_model_info_is_excluded(i, "model.layers.26.mlp.experts") &&
                  !nvfp4moe_model_info_is_excluded(i, "model.layers.3.self_attn"),
              "exclusions");
        CHECK_OK(nvfp4moe_config_validate(c));
    }
    nvfp4moe_model_info_free(i);

    T_CASE("Qwen3-30B-A3B, compressed-tensors W4A4");
    i = parse("{\"model_type\":\"qwen3_moe\",\"hidden_size\":2048,\"moe_intermediate_size\":768,"
              "\"intermediate_size\":6144,\"num_experts\":128,\"num_experts_per_tok\":8,"
              "\"norm_topk_prob\":true,\"decoder_sparse_step\":1,\"mlp_only_layers\":[],"
              "\"num_hidden_layers\":48,\"hidden_act\":\"silu\",\"quantization_config\":{"
              "\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\","
              "\"config_groups\":{\"group_0\":{\"weights\":{\"num_bits\":4,\"type\":\"float\","
              "\"strategy\":\"tensor_group\",\"group_size\":16},\"input_activations\":{"
              "\"num_bits\":4,\"type\":\"float\",\"group_size\":16,\"dynamic\":\"local\"},"
              "\"targets\":[\"Linear\"]}},\"ignore\":[\"lm_head\",\"re:.*mlp\\\\.gate$\"]}}",
              NULL);
    if (i) {
        CHECK(i->cfg.num_experts == 128 && i->cfg.intermediate_size == 768 &&
                  i->cfg.routing == NVFP4MOE_ROUTING_RENORMALIZE && i->num_moe_layers == 48 &&
                  i->format == NVFP4MOE_CKPT_COMPRESSED_TENSORS &&
                  i->cfg.scheme == NVFP4MOE_SCHEME_W4A4,
              "qwen3 config");
        CHECK(nvfp4moe_model_info_is_excluded(i, "model.layers.7.mlp.gate") &&
                  !nvfp4moe_model_info_is_excluded(i, "model.layers.7.mlp.gate_proj") &&
                  !nvfp4moe_model_info_is_excluded(i, "model.layers.7.mlp.experts"),
              "re: exclusions");
    }
    nvfp4moe_model_info_free(i);

    T_CASE("Qwen3-VL-MoE: the language model's fields in text_config, layers under model.language_model");
    i = parse("{\"model_type\":\"qwen3_vl_moe\",\"architectures\":[\"Qwen3VLMoeForConditionalGeneration\"],"
              "\"text_config\":{\"model_type\":\"qwen3_vl_moe_text\",\"hidden_size\":2048,"
              "\"moe_intermediate_size\":768,\"num_experts\":128,\"num_experts_per_tok\":8,"
              "\"num_hidden_layers\":48,\"decoder_sparse_step\":1,\"norm_topk_prob\":true,"
              "\"hidden_act\":\"silu\"},\"vision_config\":{\"depth\":27}}",
              NULL);
    if (i)
        CHECK(!strcmp(i->prefix, "model.language_model.layers") && i->cfg.num_experts == 128 &&
                  i->num_moe_layers == 48 && i->cfg.routing == NVFP4MOE_ROUTING_RENORMALIZE,
              "prefix '%s', %d experts", i->prefix, i->cfg.num_experts);
    nvfp4moe_model_info_free(i);

    T_CASE("compressed-tensors W4A16 (no input_activations)");
    i = parse("{\"hidden_size\":1024,\"num_experts\":8,\"moe_intermediate_size\":256,"
              "\"num_experts_per_tok\":2,\"num_hidden_layers\":4,\"quantization_config\":{"
              "\"quant_method\":\"compressed-tensors\",\"config_groups\":{\"g\":{\"format\":"
              "\"nvfp4-pack-quantized\",\"weights\":{\"num_bits\":4,\"type\":\"float\","
              "\"group_size\":16},\"input_activations\":null}}}}",
              NULL);
    CHECK(i && i->cfg.scheme == NVFP4MOE_SCHEME_W4A16, "W4A16");
    nvfp4moe_model_info_free(i);

    T_CASE("Mixtral, ModelOpt W4A16 in config.json");
    i = parse("{\"model_type\":\"mixtral\",\"hidden_size\":4096,\"intermediate_size\":14336,"
              "\"num_local_experts\":8,\"num_experts_per_tok\":2,\"num_hidden_layers\":32,"
              "\"hidden_act\":\"silu\",\"quantization_config\":{\"quant_method\":\"modelopt\","
              "\"quant_algo\":\"W4A16_NVFP4\",\"ignore\":[\"lm_head\"]}}",
              NULL);
    if (i)
        CHECK(i->cfg.num_experts == 8 && i->cfg.intermediate_size == 14336 &&
                  i->cfg.routing == NVFP4MOE_ROUTING_RENORMALIZE && i->num_moe_layers == 32 &&
                  i->cfg.scheme == NVFP4MOE_SCHEME_W4A16 && !strcmp(i->quant_source, "config.json"),
              "mixtral");
    nvfp4moe_model_info_free(i);

    T_CASE("gpt-oss: swigluoai with its clamp");
    i = parse("{\"model_type\":\"gpt_oss\",\"hidden_size\":2880,\"intermediate_size\":2880,"
              "\"num_local_experts\":32,\"experts_per_token\":4,\"num_hidden_layers\":24,"
              "\"swiglu_limit\":7.0}",
              NULL);
    if (i)
        CHECK(i->cfg.activation == NVFP4MOE_ACT_SWIGLUOAI && i->cfg.has_swiglu_limit &&
                  i->cfg.swiglu_limit == 7.0f && i->cfg.top_k == 4 && !i->quantized && i->cfg.has_bias,
              "gpt-oss");
    nvfp4moe_model_info_free(i);

    T_CASE("Llama-4: text_config, interleaved MoE layers");
    i = parse("{\"model_type\":\"llama4\",\"text_config\":{\"model_type\":\"llama4_text\","
              "\"hidden_size\":5120,\"intermediate_size\":8192,\"intermediate_size_mlp\":16384,"
              "\"num_local_experts\":128,\"num_experts_per_tok\":1,\"num_hidden_layers\":48,"
              "\"interleave_moe_layer_step\":2,\"hidden_act\":\"silu\"}}",
              NULL);
    if (i)
        CHECK(i->cfg.routing == NVFP4MOE_ROUTING_LLAMA4 && i->cfg.apply_router_weight_on_input &&
                  i->num_moe_layers == 24 && i->first_moe_layer == 1 &&
                  nvfp4moe_model_info_is_moe_layer(i, 47) && !nvfp4moe_model_info_is_moe_layer(i, 46),
              "llama4 routing %s moe layers %d first %d", nvfp4moe_routing_name(i->cfg.routing),
              i->num_moe_layers, i->first_moe_layer);
    nvfp4moe_model_info_free(i);

    T_CASE("ModelOpt MIXED_PRECISION: the experts' recipe decides");
    i = parse("{\"model_type\":\"qwen3_moe\",\"hidden_size\":2048,\"moe_intermediate_size\":512,"
              "\"num_experts\":64,\"num_experts_per_tok\":8,\"num_hidden_layers\":4}",
              "{\"producer\":{\"name\":\"modelopt\"},\"quantization\":{\"quant_algo\":\"MIXED_PRECISION\","
              "\"kv_cache_quant_algo\":\"FP8\",\"exclude_modules\":[\"mtp*\"],\"quantized_layers\":{"
              "\"model.layers.0.self_attn.q_proj\":{\"quant_algo\":\"FP8\"},"
              "\"model.layers.0.mlp.shared_expert.gate_proj\":{\"quant_algo\":\"NVFP4\"},"
              "\"model.layers.0.mlp.experts\":{\"quant_algo\":\"W4A16_NVFP4\",\"group_size\":16}}}}");
    if (i)
        CHECK(i->cfg.scheme == NVFP4MOE_SCHEME_W4A16 && !strcmp(i->quant_algo, "MIXED_PRECISION/W4A16_NVFP4") &&
                  i->format == NVFP4MOE_CKPT_MODELOPT,
              "mixed: scheme %s algo %s", nvfp4moe_scheme_name(i->cfg.scheme), i->quant_algo);
    nvfp4moe_model_info_free(i);
    i = parse("{\"hidden_size\":64,\"num_experts\":4,\"moe_intermediate_size\":32,"
              "\"num_experts_per_tok\":2,\"num_hidden_layers\":1,\"quantization_config\":{"
              "\"quant_method\":\"modelopt\",\"quant_algo\":\"MIXED_PRECISION\",\"config_groups\":{"
              "\"group_0\":{\"weights\":{\"num_bits\":8,\"type\":\"float\"},\"targets\":[\"model.layers.0.self_attn.q_proj\"]},"
              "\"group_1\":{\"weights\":{\"num_bits\":4,\"type\":\"float\",\"group_size\":16},"
              "\"input_activations\":{\"num_bits\":4,\"type\":\"float\",\"group_size\":16},"
              "\"targets\":[\"model.layers.0.mlp.experts\"]}}}}",
              NULL);
    CHECK(i && i->cfg.scheme == NVFP4MOE_SCHEME_W4A4 && !strcmp(i->quant_algo, "MIXED_PRECISION/NVFP4"),
          "mixed via config_groups");
    nvfp4moe_model_info_free(i);
    nvfp4moe_model_info *none = NULL;
    CHECK_ERR(nvfp4moe_model_info_parse("{\"hidden_size\":64,\"num_hidden_layers\":2}",
                                        "{\"quantization\":{\"quant_algo\":\"MIXED_PRECISION\","
                                        "\"quantized_layers\":{\"model.layers.0.mlp.experts\":{\"quant_algo\":\"FP8\"}}}}",
                                        "m", &none),
              NVFP4MOE_ERR_UNSUPPORTED, "MIXED_PRECISION quantizes no routed experts with NVFP4");

    T_CASE("sigmoid routing without groups, softmax without renormalization");
    i = parse("{\"hidden_size\":64,\"num_experts\":4,\"moe_intermediate_size\":32,"
              "\"num_experts_per_tok\":2,\"num_hidden_layers\":1,\"scoring_func\":\"sigmoid\","
              "\"norm_topk_prob\":false}",
              NULL);
    CHECK(i && i->cfg.routing == NVFP4MOE_ROUTING_SIGMOID, "sigmoid");
    nvfp4moe_model_info_free(i);
    i = parse("{\"hidden_size\":64,\"num_experts\":4,\"moe_intermediate_size\":32,"
              "\"num_experts_per_tok\":2,\"num_hidden_layers\":1,\"norm_topk_prob\":false}",
              NULL);
    CHECK(i && i->cfg.routing == NVFP4MOE_ROUTING_SOFTMAX_TOPK, "softmax top-k");
    nvfp4moe_model_info_free(i);

    T_CASE("the two quantization configs disagree");
    i = parse("{\"hidden_size\":64,\"num_experts\":4,\"moe_intermediate_size\":32,"
              "\"num_experts_per_tok\":2,\"num_hidden_layers\":1,\"quantization_config\":{"
              "\"quant_method\":\"modelopt\",\"quant_algo\":\"NVFP4\"}}",
              "{\"quantization\":{\"quant_algo\":\"W4A16_NVFP4\"}}");
    if (i)
        CHECK(i->cfg.scheme == NVFP4MOE_SCHEME_W4A4 && i->warnings.count == 1 &&
                  strstr(i->warnings.text[0], "hf_quant_config.json says \"W4A16_NVFP4\""),
              "disagreement: %d warnings", i->warnings.count);
    nvfp4moe_model_info_free(i);

    T_CASE("config errors name the field");
    nvfp4moe_model_info *bad = NULL;
    CHECK_ERR(nvfp4moe_model_info_parse("{\"hidden_size\":\"big\",\"num_hidden_layers\":2}", NULL,
                                        "m", &bad),
              NVFP4MOE_ERR_FORMAT, "m/config.json: field \"hidden_size\" must be a whole number");
    CHECK_ERR(nvfp4moe_model_info_parse("{\"num_hidden_layers\":2}", NULL, "m", &bad),
              NVFP4MOE_ERR_FORMAT, "missing field \"hidden_size\"");
    CHECK_ERR(nvfp4moe_model_info_parse("{\"hidden_size\":64,\"num_hidden_layers\":2,"
                                        "\"num_experts\":4,\"moe_intermediate_size\":32}",
                                        NULL, "m", &bad),
              NVFP4MOE_ERR_FORMAT, "without \"num_experts_per_tok\"");
    CHECK_ERR(nvfp4moe_model_info_parse("{\"hidden_size\":64,\"num_hidden_layers\":2,"
                                        "\"hidden_act\":\"tanhshrink\"}",
                                        NULL, "m", &bad),
              NVFP4MOE_ERR_UNSUPPORTED, "field \"hidden_act\"=\"tanhshrink\"");
    CHECK_ERR(nvfp4moe_model_info_parse("{\"hidden_size\":64,\"num_hidden_layers\":2,"
                                        "\"quantization_config\":{\"quant_method\":\"modelopt\","
                                        "\"quant_algo\":\"FP8\"}}",
                                        NULL, "m", &bad),
              NVFP4MOE_ERR_UNSUPPORTED, "quant_algo \"FP8\" is not an NVFP4 scheme");
    CHECK_ERR(nvfp4moe_model_info_parse("{\"hidden_size\":64,\"num_hidden_layers\":2,"
                                        "\"quantization_config\":{\"quant_method\":\"awq\"}}",
                                        NULL, "m", &bad),
              NVFP4MOE_ERR_UNSUPPORTED, "quant_method \"awq\"");
    CHECK_ERR(nvfp4moe_model_info_parse("{\"hidden_size\":64,\"num_hidden_layers\":2000000}", NULL,
                                        "m", &bad),
              NVFP4MOE_ERR_FORMAT, "is absurd");
    CHECK_ERR(nvfp4moe_model_info_parse("{\"hidden_size\":64,", NULL, "m", &bad),
              NVFP4MOE_ERR_FORMAT, "m/config.json: not valid JSON");
    CHECK(bad == NULL, "output written on failure");
    const char *d = dir_in("no_config");
    CHECK_ERR(nvfp4moe_model_info_read(d, &bad), NVFP4MOE_ERR_NOT_FOUND, "config.json: cannot open");
    write_text(d, "config.json", "{\"hidden_size\":64,\"num_hidden_layers\":1}");
    write_text(d, "hf_quant_config.json", "{\"quantization\":[]}");
    CHECK_ERR(nvfp4moe_model_info_read(d, &bad), NVFP4MOE_ERR_FORMAT,
              "hf_quant_config.json: missing or non-object \"quantization\"");

    T_CASE("written configs read back");
    nvfp4moe_config want = small_cfg();
    want.in_dtype = want.out_dtype = NVFP4MOE_DTYPE_BF16;
    want.activation = NVFP4MOE_ACT_GELU_TANH;
    want.routing = NVFP4MOE_ROUTING_SIGMOID_RENORM;
    const char *wd = dir_in("written");
    CHECK_OK(nvfp4moe_model_config_write(wd, &want, 3, 1, NVFP4MOE_CKPT_COMPRESSED_TENSORS, NULL, NULL));
    i = NULL;
    CHECK_OK(nvfp4moe_model_info_read(wd, &i));
    if (i)
        CHECK(i->cfg.activation == want.activation && i->cfg.routing == want.routing &&
                  i->num_moe_layers == 2 && i->first_moe_layer == 1 &&
                  i->format == NVFP4MOE_CKPT_COMPRESSED_TENSORS &&
                  nvfp4moe_model_info_is_excluded(i, "model.layers.1.mlp.gate"),
              "written config");
    nvfp4moe_model_info_free(i);
}


// ---- the command line ----

/* The "checksum" line of `nvfp4moe run`. */
static void checksum_line(char *buf, size_t len) {
    const char *c = strstr(g_out, "checksum");
    snprintf(buf, len, "%.*s", c ? (int)strcspn(c, "\n") : 0, c ? c : "");
}

static void test_cli(void) {
    if (!getenv("NVFP4MOE_CLI")) {
        printf("NVFP4MOE_CLI is not set: the command-line checks need it (make test sets it)\n");
        return;
    }
    const char *src = dir_in("cli_src"), *mo = dir_in("cli_mo"), *ct = dir_in("cli_ct");
    T_CASE("quantize --random");
    int rc = cli("quantize --random --num-layers 2 --first-moe-layer 1 --num-experts 4 --top-k 2 "
                 "--hidden-size 64 --intermediate-size 32 --seed 9 --out %s", src);
    CHECK(rc == 0 && strstr(g_out, "random BF16 source model"), "rc %d: %s", rc, g_out);
    T_CASE("quantize --in, ModelOpt and compressed-tensors");
    rc = cli("quantize --in %s --out %s", src, mo);
    CHECK(rc == 0 && strstr(g_out, "wrote"), "rc %d: %s", rc, g_out);
    rc = cli("quantize --in %s --out %s --format compressed-tensors", src, ct);
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    rc = cli("quantize --in %s --out %s/again", mo, mo);
    CHECK(rc == 1 && strstr(g_out, "is already quantized"), "rc %d: %s", rc, g_out);
    T_CASE("inspect");
    rc = cli("inspect %s", mo);
    CHECK(rc == 0 && strstr(g_out, "ok: modelopt, 4 experts, w4a4, router BF16 [4, 64]") &&
              strstr(g_out, "0 problems"),
          "rc %d: %s", rc, g_out);
    rc = cli("inspect %s", ct);
    CHECK(rc == 0 && strstr(g_out, "ok: compressed-tensors"), "rc %d: %s", rc, g_out);
    rc = cli("inspect %s", src);
    CHECK(rc == 0 && strstr(g_out, "unquantized experts"), "rc %d: %s", rc, g_out);
    T_CASE("run --model: both conventions give the same output");
    char a[256], b[256];
    rc = cli("run --model %s --tokens 3 --seed 5", mo);
    CHECK(rc == 0 && strstr(g_out, "router from the checkpoint"), "rc %d: %s", rc, g_out);
    checksum_line(a, sizeof a);
    rc = cli("run --model %s --layer 1 --tokens 3 --seed 5", ct);
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    checksum_line(b, sizeof b);
    CHECK(a[0] && !strcmp(a, b), "'%s' vs '%s'", a, b);
    rc = cli("run --model %s --num-experts 8", mo);
    CHECK(rc == 1 && strstr(g_out, "--num-experts conflicts with the checkpoint"), "rc %d: %s", rc, g_out);
    T_CASE("select --model");
    rc = cli("select --model %s --device cpu", mo);
    CHECK(rc == 0 && strstr(g_out, "CPU_REFERENCE"), "rc %d: %s", rc, g_out);
    T_CASE("inspect finds a truncated file");
    const char *bad = dir_in("cli_bad");
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp %s/*.json %s/ && head -c 4000 %s/model.safetensors > %s/model.safetensors",
             mo, bad, mo, bad);
    CHECK(system(cmd) == 0, "copy");
    rc = cli("inspect %s", bad);
    CHECK(rc == 1 && strstr(g_out, "truncated"), "rc %d: %s", rc, g_out);
}

// ---- gpt-oss's router bias ----

/* Copies src_dir's checkpoint into dst_dir with the router named the gpt-oss way:
 * mlp.gate.{weight,bias} -> mlp.router.{weight,bias}. */
static void copy_as_gpt_oss(const char *src_dir, const char *dst_dir) {
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", src_dir);
    nvfp4moe_st_file *f = NULL;
    CHECK_OK(nvfp4moe_st_open(p, &f));
    nvfp4moe_st_writer *w = NULL;
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    for (size_t i = 0; f && i < nvfp4moe_st_file_count(f); i++) {
        const nvfp4moe_st_tensor *t = nvfp4moe_st_file_tensor(f, i);
        char name[320];
        const char *g = strstr(t->name, ".mlp.gate.");
        if (g)
            snprintf(name, sizeof name, "%.*s.mlp.router.%s", (int)(g - t->name), t->name,
                     g + strlen(".mlp.gate."));
        else
            snprintf(name, sizeof name, "%s", t->name);
        CHECK_OK(nvfp4moe_st_writer_add(w, name, t->dtype, t->ndim, t->shape, t->data));
    }
    nvfp4moe_st_close(f);
    snprintf(p, sizeof p, "%s/model.safetensors", dst_dir);
    CHECK_OK(nvfp4moe_st_writer_save(w, p));
    nvfp4moe_st_writer_free(w);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "cp '%s'/*.json '%s'/", src_dir, dst_dir);
    CHECK(system(cmd) == 0, "copy configs");
}

/* Seeded hidden states in [-1, 1). */
static void fill_hidden(float *x, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

/* How many of the M tokens route their first choice to expert e, with the CLI's logits. */
static int first_choice_count(const nvfp4moe_ckpt_layer *l, const float *x, int64_t M, int32_t e) {
    const nvfp4moe_config *c = &l->layer.cfg;
    float *logits = malloc(sizeof(float) * (size_t)(M * c->num_experts));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(M * c->top_k));
    float *wts = malloc(sizeof(float) * (size_t)(M * c->top_k));
    int n = -1;
    CHECK_OK(nvfp4moe_ckpt_router_logits(l, x, M, logits));
    nvfp4moe_status s = nvfp4moe_route(c, logits, M, NULL, ids, wts);
    CHECK(s == NVFP4MOE_OK, "route: %s", nvfp4moe_last_error());
    if (s == NVFP4MOE_OK)
        for (int64_t m = n = 0; m < M; m++) n += ids[m * c->top_k] == e;
    free(logits);
    free(ids);
    free(wts);
    return n;
}

static void test_router_bias(void) {
    T_CASE("gpt-oss fixture: router.weight + router.bias load exactly");
    nvfp4moe_config cfg = small_cfg();
    cfg.activation = NVFP4MOE_ACT_SWIGLUOAI;   // model_type gpt_oss in the written config.json
    const int64_t E = cfg.num_experts, H = cfg.hidden_size;
    nvfp4moe_float_layer *f = NULL;
    nvfp4moe_ckpt_layer *q = NULL, *l = NULL;
    CHECK_OK(nvfp4moe_float_layer_random(&cfg, 71, &f));
    if (f) CHECK_OK(nvfp4moe_float_layer_quantize(f, 16, 71, &q));
    if (!f || !q) goto out;
    CHECK(f->router_bias != NULL, "a random gpt-oss-style layer has a router bias");
    CHECK(q->router_bias && q->has_router_bias && same_floats(q->router_bias, f->router_bias, 4),
          "quantization keeps the router bias");
    // dir_in's buffers are reused: keep this one.
    char d[512];
    snprintf(d, sizeof d, "%s", dir_in("goss"));
    const char *tmp = dir_in("goss_gate");
    save_layer(tmp, NVFP4MOE_CKPT_MODELOPT_FUSED, q, 0);
    copy_as_gpt_oss(tmp, d);
    CHECK_OK(nvfp4moe_ckpt_layer_load(d, 0, &l));
    if (l) {
        CHECK(l->layer.cfg.activation == NVFP4MOE_ACT_SWIGLUOAI, "activation %s",
              nvfp4moe_activation_name(l->layer.cfg.activation));
        CHECK(l->warnings.count == 0, "unexpected warning: %s", l->warnings.text[0]);
        CHECK(l->router && same_floats(l->router, q->router, (size_t)(E * H)), "router weight");
        CHECK(l->has_router_bias && l->router_bias &&
                  same_floats(l->router_bias, q->router_bias, (size_t)E),
              "router bias not loaded exactly");
        // logits = x @ W^T + b, in float64 then rounded.
        float x[3 * 64], got[3 * 4];
        fill_hidden(x, 3 * H, 5);
        CHECK_OK(nvfp4moe_ckpt_router_logits(l, x, 3, got));
        int bad = 0;
        for (int64_t m = 0; m < 3; m++)
            for (int64_t e = 0; e < E; e++) {
                double acc = 0;
                for (int64_t k = 0; k < H; k++) acc += (double)x[m * H + k] * q->router[e * H + k];
                bad += got[m * E + e] != (float)(acc + q->router_bias[e]);
            }
        CHECK(bad == 0, "%d router logits are not x @ W^T + b", bad);
    }
    {   // The check-only load (inspect) sees the bias but copies nothing.
        nvfp4moe_model_info *info = NULL;
        nvfp4moe_st_model *m = NULL;
        nvfp4moe_ckpt_layer *c = NULL;
        CHECK_OK(nvfp4moe_model_info_read(d, &info));
        CHECK_OK(nvfp4moe_st_model_open(d, &m));
        if (info && m) CHECK_OK(nvfp4moe_ckpt_layer_load_from(info, m, 0, true, &c));
        if (c) {
            CHECK(c->has_router_bias && !c->router_bias, "check-only: bias seen, not copied");
            float x[64], lg[4];
            CHECK_ERR(nvfp4moe_ckpt_router_logits(c, x, 1, lg), NVFP4MOE_ERR_INVALID_ARGUMENT,
                      "check-only");
        }
        nvfp4moe_ckpt_layer_free(c);
        nvfp4moe_st_model_close(m);
        nvfp4moe_model_info_free(info);
    }

    T_CASE("a float source's router bias survives quantization");
    {
        char src[512];
        snprintf(src, sizeof src, "%s", dir_in("goss_bf16"));
        const char *ftmp = dir_in("goss_bf16_gate");
        write_float_model(ftmp, &cfg, f);
        copy_as_gpt_oss(ftmp, src);
        nvfp4moe_model_info *info = NULL;
        nvfp4moe_st_model *m = NULL;
        nvfp4moe_float_layer *g = NULL;
        nvfp4moe_ckpt_layer *q2 = NULL, *l2 = NULL;
        CHECK_OK(nvfp4moe_model_info_read(src, &info));
        CHECK_OK(nvfp4moe_st_model_open(src, &m));
        if (info && m) CHECK_OK(nvfp4moe_float_layer_load(info, m, 0, &g));
        if (g) {
            CHECK(g->router_bias && same_floats(g->router_bias, f->router_bias, (size_t)E),
                  "float load: router bias");
            CHECK_OK(nvfp4moe_float_layer_quantize(g, 16, 3, &q2));
        }
        if (q2) {
            CHECK(q2->router_bias && same_floats(q2->router_bias, f->router_bias, (size_t)E),
                  "quantized: router bias");
            const char *qd = dir_in("goss_q");
            save_layer(qd, NVFP4MOE_CKPT_MODELOPT, q2, 0);
            CHECK_OK(nvfp4moe_ckpt_layer_load(qd, 0, &l2));
        }
        if (l2)
            CHECK(l2->router_bias && same_floats(l2->router_bias, f->router_bias, (size_t)E),
                  "written and read back: router bias");
        nvfp4moe_ckpt_layer_free(l2);
        nvfp4moe_ckpt_layer_free(q2);
        nvfp4moe_float_layer_free(g);
        nvfp4moe_st_model_close(m);
        nvfp4moe_model_info_free(info);
        if (getenv("NVFP4MOE_CLI")) {   // the same through `nvfp4moe quantize --in`
            const char *cq = dir_in("goss_cli");
            int rc = cli("quantize --in %s --out %s", src, cq);
            CHECK(rc == 0, "rc %d: %s", rc, g_out);
            l2 = NULL;
            CHECK_OK(nvfp4moe_ckpt_layer_load(cq, 0, &l2));
            if (l2)
                CHECK(l2->router_bias && same_floats(l2->router_bias, f->router_bias, (size_t)E),
                      "quantize --in: router bias");
            nvfp4moe_ckpt_layer_free(l2);
            rc = cli("inspect %s", cq);
            CHECK(rc == 0 && strstr(g_out, "router BF16 [4, 64] with bias"), "rc %d: %s", rc, g_out);
            rc = cli("run --model %s --tokens 3", cq);
            CHECK(rc == 0 && strstr(g_out, "router from the checkpoint (weight and bias)"),
                  "rc %d: %s", rc, g_out);
        }

        T_CASE("float source with a wrong-shaped router bias");
        float three[3] = {1, 2, 3};
        edit ed = {"model.layers.0.mlp.router.bias", 1, NVFP4MOE_ST_F32, 1, {3}, three};
        const char *bs = dir_in("goss_bf16_bad");
        rewrite(src, bs, &ed, 1);
        float_load_fails(bs, NVFP4MOE_ERR_FORMAT,
                         "tensor 'model.layers.0.mlp.router.bias': shape [3], expected [4] (experts)");
    }

    T_CASE("broken router biases are named");
    {
        float three[3] = {1, 2, 3}, four[4] = {0};
        int8_t i8[4] = {0};
        struct {
            edit ed;
            nvfp4moe_status st;
            const char *needle;
        } cases[] = {
            {{"model.layers.0.mlp.router.bias", 1, NVFP4MOE_ST_F32, 1, {3}, three},
             NVFP4MOE_ERR_FORMAT,
             "tensor 'model.layers.0.mlp.router.bias': shape [3], expected [4] (experts)"},
            {{"model.layers.0.mlp.router.bias", 1, NVFP4MOE_ST_F32, 2, {1, 4}, four},
             NVFP4MOE_ERR_FORMAT, "mlp.router.bias': shape [1, 4], expected [4] (experts)"},
            {{"model.layers.0.mlp.router.bias", 1, NVFP4MOE_ST_I8, 1, {4}, i8},
             NVFP4MOE_ERR_FORMAT, "mlp.router.bias': dtype I8, expected a float type"},
        };
        const char *dst = dir_in("goss_bad");
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            rewrite(d, dst, &cases[i].ed, 1);
            ckpt_load_fails(dst, cases[i].st, cases[i].needle);
        }
        // A bias with no router weight to go with it is not loaded, with a warning.
        edit drop = {"model.layers.0.mlp.router.weight", 0, 0, 0, {0}, NULL};
        rewrite(d, dst, &drop, 1);
        nvfp4moe_ckpt_layer *b = NULL;
        CHECK_OK(nvfp4moe_ckpt_layer_load(dst, 0, &b));
        if (b)
            CHECK(!b->router && !b->router_bias && !b->has_router_bias && b->warnings.count == 1 &&
                      strstr(b->warnings.text[0], "router bias 'model.layers.0.mlp.router.bias' "
                                                  "without a usable router weight"),
                  "%d warnings: %s", b->warnings.count, b->warnings.text[0]);
        nvfp4moe_ckpt_layer_free(b);
    }

    T_CASE("the router bias changes routing");
    if (l) {
        // Expert 2's bias far above any logit: it is every token's first choice.
        float big[4] = {0, 0, 100, 0};
        edit ed = {"model.layers.0.mlp.router.bias", 1, NVFP4MOE_ST_F32, 1, {4}, big};
        const char *bd = dir_in("goss_big");
        rewrite(d, bd, &ed, 1);
        nvfp4moe_ckpt_layer *b = NULL;
        CHECK_OK(nvfp4moe_ckpt_layer_load(bd, 0, &b));
        enum { M = 32 };
        static float x[M * 64];
        fill_hidden(x, M * H, 17);
        if (b) {
            int n = first_choice_count(b, x, M, 2);
            CHECK(n == M, "expert 2 is the first choice of %d of %d tokens", n, M);
        }
        int n0 = first_choice_count(l, x, M, 2);
        CHECK(n0 >= 0 && n0 < M, "control: expert 2 first for %d of %d tokens", n0, M);
        nvfp4moe_ckpt_layer_free(b);
        if (getenv("NVFP4MOE_CLI")) {   // run --model routes with the bias: other output
            char a[256], c[256];
            int rc = cli("run --model %s --tokens 4 --seed 3 --device cpu", d);
            CHECK(rc == 0, "rc %d: %s", rc, g_out);
            checksum_line(a, sizeof a);
            rc = cli("run --model %s --tokens 4 --seed 3 --device cpu", bd);
            CHECK(rc == 0 && strstr(g_out, "(weight and bias)"), "rc %d: %s", rc, g_out);
            checksum_line(c, sizeof c);
            CHECK(a[0] && c[0] && strcmp(a, c) != 0, "same output with and without the big bias: %s", a);
        }
    }
out:
    nvfp4moe_ckpt_layer_free(l);
    nvfp4moe_ckpt_layer_free(q);
    nvfp4moe_float_layer_free(f);
}

// ---- the router's module name through quantize ----

/* What `quantize --in src` does for layer 0, through the library: the quantized layer, also
 * written to dst in format fmt. */
static nvfp4moe_ckpt_layer *quantize_source(const char *src, const char *dst, nvfp4moe_ckpt_format fmt) {
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_st_model *m = NULL;
    nvfp4moe_float_layer *g = NULL;
    nvfp4moe_ckpt_layer *q = NULL;
    CHECK_OK(nvfp4moe_model_info_read(src, &info));
    CHECK_OK(nvfp4moe_st_model_open(src, &m));
    if (info && m) CHECK_OK(nvfp4moe_float_layer_load(info, m, 0, &g));
    if (g) CHECK_OK(nvfp4moe_float_layer_quantize(g, 16, 3, &q));
    if (q) save_layer(dst, fmt, q, 0);
    nvfp4moe_float_layer_free(g);
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
    return q;
}

/* The tensor `name` of dir/model.safetensors as floats (NULL when absent); *dt gets its dtype. */
static float *file_tensor(const char *dir, const char *name, nvfp4moe_st_dtype *dt, int64_t *numel) {
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    nvfp4moe_st_file *f = NULL;
    CHECK_OK(nvfp4moe_st_open(p, &f));
    const nvfp4moe_st_tensor *t = f ? nvfp4moe_st_file_find(f, name) : NULL;
    float *x = NULL;
    if (t && (t->dtype == NVFP4MOE_ST_F32 || t->dtype == NVFP4MOE_ST_BF16)) {
        x = malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1));
        for (int64_t i = 0; i < t->numel; i++) {
            uint16_t h;
            if (t->dtype == NVFP4MOE_ST_F32) memcpy(&x[i], (const uint8_t *)t->data + 4 * i, 4);
            else memcpy(&h, (const uint8_t *)t->data + 2 * i, 2), x[i] = nvfp4moe_bf16_to_float(h);
        }
        *dt = t->dtype;
        *numel = t->numel;
    }
    nvfp4moe_st_close(f);
    return x;
}

static bool file_has(const char *dir, const char *name) {
    nvfp4moe_st_dtype dt;
    int64_t n;
    float *x = file_tensor(dir, name, &dt, &n);
    free(x);
    return x != NULL;
}

/* Whether dir's quantization config excludes module. */
static bool excludes(const char *dir, const char *module) {
    nvfp4moe_model_info *info = NULL;
    CHECK_OK(nvfp4moe_model_info_read(dir, &info));
    bool r = info && nvfp4moe_model_info_is_excluded(info, module);
    nvfp4moe_model_info_free(info);
    return r;
}

static void test_router_name(void) {
    T_CASE("gpt-oss's mlp.router keeps its name through quantize, every format");
    nvfp4moe_config cfg = small_cfg();
    cfg.activation = NVFP4MOE_ACT_SWIGLUOAI;
    const int64_t E = cfg.num_experts, H = cfg.hidden_size;
    nvfp4moe_float_layer *f = NULL;
    CHECK_OK(nvfp4moe_float_layer_random(&cfg, 29, &f));
    if (!f) return;
    CHECK(!strcmp(f->router_name, "router"), "random gpt-oss-style router_name '%s'", f->router_name);
    char src[512];
    snprintf(src, sizeof src, "%s", dir_in("rn_src"));
    write_float_model(src, &cfg, f);
    CHECK(file_has(src, "model.layers.0.mlp.router.weight") &&
              !file_has(src, "model.layers.0.mlp.gate.weight"),
          "the BF16 source names its router mlp.router");
    const nvfp4moe_ckpt_format fmts[3] = {NVFP4MOE_CKPT_MODELOPT, NVFP4MOE_CKPT_MODELOPT_FUSED,
                                          NVFP4MOE_CKPT_COMPRESSED_TENSORS};
    for (int i = 0; i < 3; i++) {
        const char *name = nvfp4moe_ckpt_format_name(fmts[i]);
        char d[512];
        snprintf(d, sizeof d, "%s", dir_in(i == 0 ? "rn_mo" : i == 1 ? "rn_fused" : "rn_ct"));
        nvfp4moe_ckpt_layer *q = quantize_source(src, d, fmts[i]), *l = NULL;
        if (q) CHECK(!strcmp(q->router_name, "router"), "%s: quantized router_name '%s'", name,
                     q->router_name);
        CHECK(file_has(d, "model.layers.0.mlp.router.weight") &&
                  file_has(d, "model.layers.0.mlp.router.bias") &&
                  !file_has(d, "model.layers.0.mlp.gate.weight") &&
                  !file_has(d, "model.layers.0.mlp.gate.bias"),
              "%s: router not written as mlp.router", name);
        CHECK(excludes(d, "model.layers.0.mlp.router") && !excludes(d, "model.layers.0.mlp.gate") &&
                  !excludes(d, "model.layers.0.mlp.experts"),
              "%s: the quantization config does not exclude mlp.router (and only it)", name);
        CHECK_OK(nvfp4moe_ckpt_layer_load(d, 0, &l));
        if (l)
            CHECK(!strcmp(l->router_name, "router") && l->router &&
                      same_floats(l->router, f->router, (size_t)(E * H)) && l->router_bias &&
                      same_floats(l->router_bias, f->router_bias, (size_t)E),
                  "%s: router '%s' does not round-trip", name, l->router_name);
        nvfp4moe_ckpt_layer_free(l);
        nvfp4moe_ckpt_layer_free(q);
    }

    T_CASE("a non-gpt-oss router stays mlp.gate, and is what the config excludes");
    {
        nvfp4moe_config qc = small_cfg();
        nvfp4moe_ckpt_layer *q = make_quantized(&qc, 5);
        const char *d = dir_in("rn_qwen");
        if (q) {
            CHECK(!strcmp(q->router_name, "gate"), "router_name '%s'", q->router_name);
            save_layer(d, NVFP4MOE_CKPT_MODELOPT, q, 0);
            CHECK(file_has(d, "model.layers.0.mlp.gate.weight") &&
                      !file_has(d, "model.layers.0.mlp.router.weight") &&
                      excludes(d, "model.layers.0.mlp.gate") && !excludes(d, "model.layers.0.mlp.router"),
                  "mlp.gate written and excluded");
        }
        nvfp4moe_ckpt_layer_free(q);
    }

    if (getenv("NVFP4MOE_CLI")) {
        T_CASE("quantize --in of a gpt-oss source: mlp.router written and excluded");
        const char *formats[3] = {"modelopt", "modelopt-fused", "compressed-tensors"};
        for (int i = 0; i < 3; i++) {
            char d[512];
            snprintf(d, sizeof d, "%s/rn_cli_%s", g_dir, formats[i]);
            int rc = cli("quantize --in %s --out %s --format %s", src, d, formats[i]);
            CHECK(rc == 0, "rc %d: %s", rc, g_out);
            CHECK(excludes(d, "model.layers.0.mlp.router") && file_has(d, "model.layers.0.mlp.router.weight"),
                  "%s: mlp.router written and excluded", formats[i]);
            nvfp4moe_ckpt_layer *l = NULL;
            CHECK_OK(nvfp4moe_ckpt_layer_load(d, 0, &l));
            if (l) CHECK(!strcmp(l->router_name, "router"), "%s: router_name '%s'", formats[i], l->router_name);
            nvfp4moe_ckpt_layer_free(l);
        }
    }
    nvfp4moe_float_layer_free(f);
}

// ---- gpt-oss's expert biases through quantize ----

/* Adds a float array as a BF16 tensor "model.layers.0.mlp.<suffix>". */
static void add_bf16(nvfp4moe_st_writer *w, const char *suffix, int32_t ndim, const int64_t *shape,
                     const float *x, int64_t n) {
    uint16_t *b = malloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) b[i] = nvfp4moe_bf16_from_float(x[i]);
    char name[160];
    snprintf(name, sizeof name, "model.layers.0.mlp.%s", suffix);
    CHECK_OK(nvfp4moe_st_writer_add(w, name, NVFP4MOE_ST_BF16, ndim, shape, b));
    free(b);
}

/* Writes f as a BF16 source in gpt-oss's own layout: fused experts.gate_up_proj [E, H, 2I] (the
 * Hugging Face [in, out] layout; columns interleaved gate, up), gate_up_proj_bias [E, 2I],
 * down_proj [E, I, H], down_proj_bias [E, H], router.{weight,bias}; config.json model_type
 * gpt_oss (what nvfp4moe_model_config_write writes for swigluoai). */
static void write_gpt_oss_source(const char *dir, const nvfp4moe_float_layer *f) {
    const nvfp4moe_config *c = &f->cfg;
    const int64_t E = c->num_experts, H = c->hidden_size, I = c->intermediate_size, N1 = 2 * I;
    float *t = malloc(sizeof(float) * (size_t)(E * N1 * H));
    nvfp4moe_st_writer *w = NULL;
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    for (int64_t e = 0; e < E; e++)
        for (int64_t k = 0; k < H; k++)
            for (int64_t n = 0; n < N1; n++) t[(e * H + k) * N1 + n] = f->w13[(e * N1 + n) * H + k];
    int64_t dgu[3] = {E, H, N1}, dgb[2] = {E, N1}, ddn[3] = {E, I, H}, ddb[2] = {E, H};
    int64_t dr[2] = {E, H}, drb[1] = {E};
    add_bf16(w, "experts.gate_up_proj", 3, dgu, t, E * H * N1);
    add_bf16(w, "experts.gate_up_proj_bias", 2, dgb, f->w13_bias, E * N1);
    for (int64_t e = 0; e < E; e++)
        for (int64_t k = 0; k < I; k++)
            for (int64_t n = 0; n < H; n++) t[(e * I + k) * H + n] = f->w2[(e * H + n) * I + k];
    add_bf16(w, "experts.down_proj", 3, ddn, t, E * I * H);
    add_bf16(w, "experts.down_proj_bias", 2, ddb, f->w2_bias, E * H);
    add_bf16(w, "router.weight", 2, dr, f->router, E * H);
    add_bf16(w, "router.bias", 1, drb, f->router_bias, E);
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(nvfp4moe_st_writer_save(w, p));
    nvfp4moe_st_writer_free(w);
    free(t);
    CHECK_OK(nvfp4moe_model_config_write(dir, &f->cfg, 1, 0, NVFP4MOE_CKPT_UNQUANTIZED, NULL, NULL));
}

static void test_expert_biases(void) {
    T_CASE("gpt-oss source: expert biases survive quantize, every format");
    nvfp4moe_config cfg = small_cfg();
    cfg.activation = NVFP4MOE_ACT_SWIGLUOAI;
    const int64_t E = cfg.num_experts, H = cfg.hidden_size, I = cfg.intermediate_size, N1 = 2 * I;
    nvfp4moe_float_layer *f = NULL;
    CHECK_OK(nvfp4moe_float_layer_random(&cfg, 83, &f));
    if (!f) return;
    CHECK(f->cfg.has_bias && f->w13_bias && f->w2_bias && !strcmp(f->router_name, "router"),
          "a random gpt-oss-style layer has expert biases and an mlp.router");
    char src[512];
    snprintf(src, sizeof src, "%s", dir_in("eb_src"));
    write_gpt_oss_source(src, f);
    const nvfp4moe_ckpt_format fmts[3] = {NVFP4MOE_CKPT_MODELOPT, NVFP4MOE_CKPT_MODELOPT_FUSED,
                                          NVFP4MOE_CKPT_COMPRESSED_TENSORS};
    const char *dirs[3] = {"eb_mo", "eb_fused", "eb_ct"};
    enum { M = 6 };
    for (int i = 0; i < 3; i++) {
        char d[512];
        snprintf(d, sizeof d, "%s", dir_in(dirs[i]));
        nvfp4moe_ckpt_layer *q = quantize_source(src, d, fmts[i]), *l = NULL;
        if (!q) continue;
        CHECK(q->layer.cfg.has_bias && same_floats(q->layer.w.w13_bias, f->w13_bias, (size_t)(E * N1)) &&
                  same_floats(q->layer.w.w2_bias, f->w2_bias, (size_t)(E * H)),
              "%s: quantized layer keeps the biases", dirs[i]);
        CHECK_OK(nvfp4moe_ckpt_layer_load(d, 0, &l));
        if (l) {
            // Stored as F32, so exactly the source's (BF16) values, in w13's interleaved rows.
            CHECK(l->layer.cfg.has_bias && l->layer.w.w13_bias && l->layer.w.w2_bias &&
                      same_floats(l->layer.w.w13_bias, f->w13_bias, (size_t)(E * N1)) &&
                      same_floats(l->layer.w.w2_bias, f->w2_bias, (size_t)(E * H)),
                  "%s: expert biases not loaded back exactly", dirs[i]);
            CHECK(!strcmp(l->router_name, "router") && l->router &&
                      same_floats(l->router, f->router, (size_t)(E * H)) && l->router_bias &&
                      same_floats(l->router_bias, f->router_bias, (size_t)E),
                  "%s: router '%s' does not round-trip", dirs[i], l->router_name);
            CHECK(file_has(d, "model.layers.0.mlp.router.weight") &&
                      file_has(d, "model.layers.0.mlp.router.bias") &&
                      !file_has(d, "model.layers.0.mlp.gate.weight"),
                  "%s: router not written as mlp.router", dirs[i]);
            CHECK(excludes(d, "model.layers.0.mlp.router") &&
                      !excludes(d, "model.layers.0.mlp.experts"),
                  "%s: the quantization config does not exclude mlp.router (only it)", dirs[i]);
            // The biases change the layer's output; with them it is the in-memory layer's.
            float *with = run_layer(&l->layer.cfg, &l->layer.w, l->router, M, 7);
            float *mem = run_layer(&q->layer.cfg, &q->layer.w, q->router, M, 7);
            nvfp4moe_config nb = l->layer.cfg;
            nb.has_bias = false;
            nvfp4moe_weights wnb = l->layer.w;
            wnb.w13_bias = wnb.w2_bias = NULL;
            float *without = run_layer(&nb, &wnb, l->router, M, 7);
            CHECK(same_floats(with, mem, (size_t)(M * H)), "%s: output differs from in-memory", dirs[i]);
            double diff = 0;
            for (int64_t k = 0; k < M * H; k++) diff = fmax(diff, fabs((double)with[k] - without[k]));
            CHECK(diff > 1e-3, "%s: biases do not change the output (max diff %g)", dirs[i], diff);
            free(with);
            free(mem);
            free(without);
        }
        nvfp4moe_ckpt_layer_free(l);
        nvfp4moe_ckpt_layer_free(q);
    }

    T_CASE("per-expert biases split gpt-oss's interleaved gate_up_proj_bias");
    {
        nvfp4moe_st_dtype dt = NVFP4MOE_ST_U8;
        int64_t n = 0, n2 = 0;
        const char *d = dir_in("eb_mo");
        float *g = file_tensor(d, "model.layers.0.mlp.experts.1.gate_proj.bias", &dt, &n);
        float *u = file_tensor(d, "model.layers.0.mlp.experts.1.up_proj.bias", &dt, &n2);
        CHECK(g && u && n == I && n2 == I && dt == NVFP4MOE_ST_F32, "per-expert F32 biases [%lld]",
              (long long)I);
        int bad = 0;
        for (int64_t r = 0; g && u && r < I; r++)
            bad += g[r] != f->w13_bias[N1 + 2 * r] || u[r] != f->w13_bias[N1 + 2 * r + 1];
        CHECK(bad == 0, "%d gate/up bias values are not gate_up_proj_bias[..., 0::2] / [..., 1::2]", bad);
        free(g);
        free(u);
        float *fb = file_tensor(dir_in("eb_fused"), "model.layers.0.mlp.experts.gate_up_proj_bias",
                                &dt, &n);
        CHECK(fb && n == E * N1 && dt == NVFP4MOE_ST_F32 && same_floats(fb, f->w13_bias, (size_t)n),
              "fused gate_up_proj_bias keeps gpt-oss's order");
        free(fb);
    }

    T_CASE("a source's biases are all there or the quantize fails naming the tensor");
    {
        float short_b[4 * 32] = {0};
        const char *bad = dir_in("eb_bad");
        struct {
            edit ed;
            nvfp4moe_status st;
            const char *needle;
        } cases[] = {
            {{"model.layers.0.mlp.experts.down_proj_bias", 0, 0, 0, {0}, NULL}, NVFP4MOE_ERR_NOT_FOUND,
             "tensor 'model.layers.0.mlp.experts.down_proj_bias' not found"},
            {{"model.layers.0.mlp.experts.gate_up_proj_bias", 0, 0, 0, {0}, NULL}, NVFP4MOE_ERR_NOT_FOUND,
             "tensor 'model.layers.0.mlp.experts.gate_up_proj_bias' not found"},
            {{"model.layers.0.mlp.experts.gate_up_proj_bias", 1, NVFP4MOE_ST_F32, 2, {4, 32}, short_b},
             NVFP4MOE_ERR_FORMAT, "gate_up_proj_bias': shape [4, 32], expected [4, 64]"},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            rewrite(src, bad, &cases[i].ed, 1);
            float_load_fails(bad, cases[i].st, cases[i].needle);
        }
        // Per-expert source (what quantize --random writes): one expert's up bias missing.
        const char *pe = dir_in("eb_pe"), *pe_bad = dir_in("eb_pe_bad");
        write_float_model(pe, &f->cfg, f);
        nvfp4moe_model_info *info = NULL;
        nvfp4moe_st_model *m = NULL;
        nvfp4moe_float_layer *g = NULL;
        CHECK_OK(nvfp4moe_model_info_read(pe, &info));
        CHECK_OK(nvfp4moe_st_model_open(pe, &m));
        if (info && m) CHECK_OK(nvfp4moe_float_layer_load(info, m, 0, &g));
        if (g)   // BF16 on disk; the random biases are bf16-rounded, so exact
            CHECK(g->cfg.has_bias && same_floats(g->w13_bias, f->w13_bias, (size_t)(E * N1)) &&
                      same_floats(g->w2_bias, f->w2_bias, (size_t)(E * H)) &&
                      !strcmp(g->router_name, "router"),
                  "per-expert float source: biases and router name");
        nvfp4moe_float_layer_free(g);
        g = NULL;
        nvfp4moe_st_model_close(m);
        nvfp4moe_model_info_free(info);
        edit drop = {"model.layers.0.mlp.experts.2.up_proj.bias", 0, 0, 0, {0}, NULL};
        rewrite(pe, pe_bad, &drop, 1);
        float_load_fails(pe_bad, NVFP4MOE_ERR_NOT_FOUND, "tensor 'model.layers.0.mlp.experts.2.up_proj.bias' not found");
    }

    T_CASE("quantize refuses a float layer whose biases and has_bias disagree");
    {
        nvfp4moe_float_layer h = *f;
        nvfp4moe_ckpt_layer *q = NULL;
        h.w2_bias = NULL;
        CHECK_ERR(nvfp4moe_float_layer_quantize(&h, 4, 1, &q), NVFP4MOE_ERR_INVALID_ARGUMENT,
                  "w2_bias NULL");
        h = *f;
        h.cfg.has_bias = false;
        CHECK_ERR(nvfp4moe_float_layer_quantize(&h, 4, 1, &q), NVFP4MOE_ERR_INVALID_ARGUMENT,
                  "cfg.has_bias is not set but w13_bias is given");
        CHECK(q == NULL, "output written on failure");
    }

    if (getenv("NVFP4MOE_CLI")) {
        T_CASE("quantize --in of the gpt-oss source");
        const char *formats[3] = {"modelopt", "modelopt-fused", "compressed-tensors"};
        for (int i = 0; i < 3; i++) {
            char d[512];
            snprintf(d, sizeof d, "%s", dir_in(formats[i]));
            int rc = cli("quantize --in %s --out %s --format %s", src, d, formats[i]);
            CHECK(rc == 0 && strstr(g_out, "4 experts quantized (with their biases)"), "rc %d: %s", rc, g_out);
            nvfp4moe_ckpt_layer *l = NULL;
            CHECK_OK(nvfp4moe_ckpt_layer_load(d, 0, &l));
            if (l)
                CHECK(l->layer.cfg.has_bias && same_floats(l->layer.w.w13_bias, f->w13_bias, (size_t)(E * N1)) &&
                          same_floats(l->layer.w.w2_bias, f->w2_bias, (size_t)(E * H)) &&
                          !strcmp(l->router_name, "router"),
                      "%s: biases / router name", formats[i]);
            nvfp4moe_ckpt_layer_free(l);
            CHECK(excludes(d, "model.layers.0.mlp.router") && file_has(d, "model.layers.0.mlp.router.weight"),
                  "%s: mlp.router written and excluded", formats[i]);
            rc = cli("inspect %s", d);
            CHECK(rc == 0 && strstr(g_out, "router BF16 [4, 64] with bias, expert biases"), "rc %d: %s", rc, g_out);
        }
        char d[512];
        snprintf(d, sizeof d, "%s", dir_in("modelopt"));
        int rc = cli("run --model %s --tokens 3 --device cpu", d);
        CHECK(rc == 0 && strstr(g_out, "(weight and bias)"), "rc %d: %s", rc, g_out);
    }
    nvfp4moe_float_layer_free(f);
}

/* Random damage to a checkpoint file: loading must succeed or fail with FORMAT / NOT_FOUND, never
 * crash or read out of bounds (tests/sanitize.sh). */
static void test_checkpoint_mutations(void) {
    T_CASE("random mutations of a checkpoint");
    nvfp4moe_config cfg = small_cfg();
    cfg.num_experts = 2;
    cfg.top_k = 1;
    cfg.hidden_size = 32;
    cfg.intermediate_size = 16;
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 61);
    if (!q) return;
    const char *src = dir_in("mut_src"), *dst = dir_in("mut_dst");
    save_layer(src, NVFP4MOE_CKPT_MODELOPT, q, 0);
    nvfp4moe_ckpt_layer_free(q);
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    FILE *f = fopen(p, "rb");
    static uint8_t orig[1 << 16], buf[1 << 16];
    size_t n = f ? fread(orig, 1, sizeof orig, f) : 0;
    if (f) fclose(f);
    CHECK(n > 1000 && n < sizeof orig, "fixture size %zu", n);
    char cmd[1500];
    snprintf(cmd, sizeof cmd, "cp %s/*.json %s/", src, dst);
    CHECK(system(cmd) == 0, "copy configs");
    uint64_t st = 777;
    int ok = 0, rejected = 0, wrong = 0;
    snprintf(p, sizeof p, "%s/model.safetensors", dst);
    for (int iter = 0; iter < 600; iter++) {
        memcpy(buf, orig, n);
        size_t len = n;
        for (int e = 0; e < 3; e++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)((st >> 20) % len);
            if (((st >> 60) & 3) == 0) len = at > 8 ? at : 8;
            else buf[at] = (uint8_t)(st >> 40);
        }
        f = fopen(p, "wb");
        fwrite(buf, 1, len, f);
        fclose(f);
        nvfp4moe_ckpt_layer *l = NULL;
        nvfp4moe_status s = nvfp4moe_ckpt_layer_load(dst, 0, &l);
        if (s == NVFP4MOE_OK) ok++, nvfp4moe_ckpt_layer_free(l);
        else if (s == NVFP4MOE_ERR_FORMAT || s == NVFP4MOE_ERR_NOT_FOUND) rejected++;
        else if (wrong++ < 5) fprintf(stderr, "  mutation %d: %s: %s\n", iter, nvfp4moe_status_str(s), nvfp4moe_last_error());
    }
    CHECK(wrong == 0, "%d mutations gave an unexpected status", wrong);
    CHECK(ok > 0 && rejected > 0, "ok %d rejected %d", ok, rejected);
    printf("checkpoint mutations: %d loaded, %d rejected\n", ok, rejected);
}

int main(void) {
    fixtures_begin("nvfp4moe-ckpt");
    test_model_configs();
    test_round_trip_formats();
    test_fused_transposed();
    test_layer_prefixes();
    test_expert_names();
    test_gate_up_scales();
    test_broken_layers();
    test_schemes_and_bias();
    test_router_bias();
    test_router_name();
    test_expert_biases();
    test_checkpoint_mutations();
    test_cli();
    fixtures_end();
    return t_finish("test_checkpoint");
}
