/*
 * test_quantize.c - whole models through nvfp4moe_model_quantize (and `nvfp4moe quantize`): every
 * tensor of the source is in the output (experts quantized exactly as the in-memory quantizer does,
 * everything else bit for bit), the exclusion list names every unquantized module and no quantized
 * one (ModelOpt's prefix-wildcard summary, compressed-tensors' explicit names), shards of at most
 * the size asked with model.safetensors.index.json, every format and W4A16, gpt-oss's fused source,
 * one layer only, the directory's other files, failures that leave nothing behind, and memory that
 * stays bounded by one expert (a child with an address-space limit the in-memory path exceeds).
 */
#include "ckpt_fixtures.h"

#include <fcntl.h>
#include <jansson.h>

/* A tensor of a model directory, loaded whole (every shard): dtype, shape and bytes. */
typedef struct {
    char name[320];
    nvfp4moe_st_dtype dtype;
    int32_t ndim;
    int64_t shape[8];
    uint8_t *data;
    uint64_t nbytes;
} ftensor;

typedef struct {
    ftensor *t;
    size_t n;
} fmodel;

static void fmodel_free(fmodel *m) {
    for (size_t i = 0; i < m->n; i++) free(m->t[i].data);
    free(m->t);
    m->t = NULL;
    m->n = 0;
}

/* Every tensor of dir, sorted by name (through the library's reader, which checks the format). */
static fmodel load_all(const char *dir) {
    fmodel fm = {0};
    nvfp4moe_st_model *m = NULL;
    CHECK_OK(nvfp4moe_st_model_open(dir, &m));
    if (!m) return fm;
    fm.n = nvfp4moe_st_model_count(m);
    fm.t = calloc(fm.n + 1, sizeof *fm.t);
    for (size_t i = 0; i < fm.n; i++) {
        const nvfp4moe_st_tensor *t = nvfp4moe_st_model_tensor(m, i);
        ftensor *f = &fm.t[i];
        snprintf(f->name, sizeof f->name, "%s", t->name);
        f->dtype = t->dtype;
        f->ndim = t->ndim;
        for (int32_t d = 0; d < t->ndim; d++) f->shape[d] = t->shape[d];
        f->nbytes = t->nbytes;
        f->data = malloc(t->nbytes + 1);
        CHECK_OK(nvfp4moe_st_tensor_read(t, 0, t->nbytes, f->data));
    }
    nvfp4moe_st_model_close(m);
    return fm;
}

static const ftensor *find(const fmodel *m, const char *name) {
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

static bool same_tensor(const ftensor *a, const ftensor *b) {
    if (!a || !b || a->dtype != b->dtype || a->ndim != b->ndim || a->nbytes != b->nbytes) return false;
    for (int32_t d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return !memcmp(a->data, b->data, a->nbytes);
}

/* The exclusion list of dir's quantization config (nvfp4moe_model_info_excluded). */
static int excluded_list(const char *dir, char list[][96], int max) {
    nvfp4moe_model_info *info = NULL;
    CHECK_OK(nvfp4moe_model_info_read(dir, &info));
    int n = 0;
    for (int32_t i = 0; info && i < info->num_excluded && n < max; i++)
        snprintf(list[n++], 96, "%s", nvfp4moe_model_info_excluded(info, i));
    nvfp4moe_model_info_free(info);
    return n;
}

static bool excluded(const char *dir, const char *module) {
    nvfp4moe_model_info *info = NULL;
    CHECK_OK(nvfp4moe_model_info_read(dir, &info));
    bool r = info && nvfp4moe_model_info_is_excluded(info, module);
    nvfp4moe_model_info_free(info);
    return r;
}

/* The number of entries of dir (not . and ..). */
static int entries(const char *dir) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p && fscanf(p, "%d", &n) != 1) n = -1;
    if (p) pclose(p);
    return n;
}

static const char *fresh_dir(const char *name) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/%s'", g_dir, name);
    if (system(cmd) != 0) return NULL;
    return dir_in(name);
}

/* The model the tests quantize: 3 decoder layers (a dense one, two MoE layers of E=4 top-2 H=64
 * I=32), embeddings, attention, norms, lm_head; and beside the weights a tokenizer, a generation
 * config, a hidden file, a weight file of another format and a directory. */
static void make_source(const char *dir, nvfp4moe_activation act, uint64_t seed) {
    nvfp4moe_config cfg = small_cfg();
    cfg.in_dtype = cfg.out_dtype = NVFP4MOE_DTYPE_BF16;
    cfg.activation = act;
    cfg.seed = seed;
    CHECK_OK(nvfp4moe_model_write_random(dir, &cfg, 3, 1, 0));
    write_text(dir, "tokenizer.json", "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n");
    write_text(dir, "generation_config.json", "{\"temperature\": 0.7}\n");
    write_text(dir, ".gitattributes", "*.safetensors filter=lfs\n");
    write_text(dir, "pytorch_model.bin", "not copied");
    char p[700];
    snprintf(p, sizeof p, "%s/original", dir);
    mkdir(p, 0755);
}

typedef struct {
    nvfp4moe_quantize_progress last;
    int calls, backwards;
} progress_log;

static void record(const nvfp4moe_quantize_progress *p, void *user) {
    progress_log *l = user;
    if (l->calls && (p->bytes_done < l->last.bytes_done || p->tensors_done < l->last.tensors_done ||
                     p->layers_done < l->last.layers_done))
        l->backwards++;
    l->last = *p;
    l->calls++;
}

/* What the in-memory path (float_layer_load + float_layer_quantize + ckpt_add_layer) writes for the
 * source's MoE layer L, the tensors of writer-format fmt, as a model of its own in dir. */
static void in_memory_layer(const char *src, int32_t L, nvfp4moe_ckpt_format fmt, bool w4a16, const char *dir) {
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_st_model *m = NULL;
    nvfp4moe_float_layer *f = NULL;
    nvfp4moe_ckpt_layer *q = NULL;
    CHECK_OK(nvfp4moe_model_info_read(src, &info));
    CHECK_OK(nvfp4moe_st_model_open(src, &m));
    if (info && m) CHECK_OK(nvfp4moe_float_layer_load(info, m, L, &f));
    if (f) {
        f->cfg.scheme = w4a16 ? NVFP4MOE_SCHEME_W4A16 : NVFP4MOE_SCHEME_W4A4;
        CHECK_OK(nvfp4moe_float_layer_quantize(f, 64, (uint64_t)L, &q));
    }
    nvfp4moe_st_writer *w = NULL;
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    if (q) CHECK_OK(nvfp4moe_ckpt_add_layer(w, fmt, "model.layers", L, q, NULL));
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(nvfp4moe_st_writer_save(w, p));
    nvfp4moe_st_writer_free(w);
    nvfp4moe_ckpt_layer_free(q);
    nvfp4moe_float_layer_free(f);
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
}

static bool is_expert_tensor(const char *name) { return strstr(name, ".mlp.experts.") != NULL; }

static void test_whole_model(void) {
    T_CASE("every tensor of the source written: experts quantized, the rest bit for bit");
    char src[512], out[512];   // dir_in's buffers rotate
    snprintf(src, sizeof src, "%s", fresh_dir("wm_src"));
    snprintf(out, sizeof out, "%s", fresh_dir("wm_out"));
    make_source(src, NVFP4MOE_ACT_SILU, 0);
    progress_log pl = {0};
    nvfp4moe_quantize_options opt;
    nvfp4moe_quantize_options_init(&opt);
    opt.progress = record;
    opt.user = &pl;
    nvfp4moe_quantize_result res;
    CHECK_OK(nvfp4moe_model_quantize(src, out, &opt, &res));
    fmodel s = load_all(src), o = load_all(out);
    size_t copied = 0, experts_in = 0;
    for (size_t i = 0; i < s.n; i++) {
        if (is_expert_tensor(s.t[i].name)) {
            experts_in++;
            continue;
        }
        const ftensor *t = find(&o, s.t[i].name);
        CHECK(t && same_tensor(t, &s.t[i]), "'%s' not copied bit for bit", s.t[i].name);
        copied++;
    }
    CHECK(copied > 20 && find(&o, "model.embed_tokens.weight") && find(&o, "lm_head.weight") &&
              find(&o, "model.layers.0.mlp.down_proj.weight") && find(&o, "model.layers.2.self_attn.q_proj.weight") &&
              find(&o, "model.layers.1.mlp.gate.weight"),
          "the source's embeddings, attention, dense MLP, router and lm_head are in the output");
    // Two MoE layers of 4 experts: 3 projections x (weight, scale, global scale, input scale).
    size_t experts_out = 0;
    for (size_t i = 0; i < o.n; i++) experts_out += is_expert_tensor(o.t[i].name);
    CHECK(experts_out == 2 * 4 * 3 * 4 && o.n == copied + experts_out && res.tensors == (int64_t)o.n &&
              res.tensors_copied == (int64_t)copied && res.tensors_quantized == (int64_t)experts_out &&
              res.moe_layers == 2 && res.shards == 1,
          "%zu output tensors (%zu expert), %zu copied; result %lld/%lld/%lld, %d layers, %d shards", o.n, experts_out,
          copied, (long long)res.tensors, (long long)res.tensors_quantized, (long long)res.tensors_copied,
          res.moe_layers, res.shards);
    const ftensor *w = find(&o, "model.layers.2.mlp.experts.3.down_proj.weight");
    const ftensor *sc = find(&o, "model.layers.2.mlp.experts.3.down_proj.weight_scale");
    const ftensor *s2 = find(&o, "model.layers.2.mlp.experts.3.down_proj.weight_scale_2");
    const ftensor *in = find(&o, "model.layers.2.mlp.experts.3.down_proj.input_scale");
    CHECK(w && w->dtype == NVFP4MOE_ST_U8 && w->ndim == 2 && w->shape[0] == 64 && w->shape[1] == 16 && sc &&
              sc->dtype == NVFP4MOE_ST_F8_E4M3 && sc->shape[1] == 2 && s2 && s2->dtype == NVFP4MOE_ST_F32 &&
              s2->ndim == 0 && in && in->ndim == 0,
          "ModelOpt's names, dtypes and shapes");
    // The experts: exactly what the in-memory quantizer writes for each layer.
    for (int32_t L = 1; L <= 2; L++) {
        const char *mem = fresh_dir("wm_mem");
        in_memory_layer(src, L, NVFP4MOE_CKPT_MODELOPT, false, mem);
        fmodel mm = load_all(mem);
        int bad = 0;
        for (size_t i = 0; i < mm.n; i++)
            if (is_expert_tensor(mm.t[i].name) && !same_tensor(find(&o, mm.t[i].name), &mm.t[i]) && bad++ < 3)
                fprintf(stderr, "  layer %d: '%s' differs from the in-memory quantizer's\n", L, mm.t[i].name);
        CHECK(bad == 0, "layer %d: %d expert tensors differ from the in-memory quantizer's", L, bad);
        fmodel_free(&mm);
    }
    // The quantization config and its exclusions: ModelOpt's summary of the unquantized modules.
    char list[32][96];
    const int n = excluded_list(out, list, 32);
    const char *want[] = {"lm_head", "model.layers.0*", "model.layers.1.mlp.gate", "model.layers.1.self_attn*",
                          "model.layers.2.mlp.gate", "model.layers.2.self_attn*"};
    bool same = n == 6;
    for (int i = 0; same && i < 6; i++) same = !strcmp(list[i], want[i]);
    CHECK(same, "exclude_modules: %d entries, first '%s'", n, n ? list[0] : "");
    for (size_t i = 0; i < s.n; i++) {   // every unquantized weight matrix's module excluded
        const ftensor *t = &s.t[i];
        if (t->ndim < 2 || is_expert_tensor(t->name) || strstr(t->name, "embed")) continue;
        char mod[320];
        snprintf(mod, sizeof mod, "%.*s", (int)(strrchr(t->name, '.') - t->name), t->name);
        CHECK(excluded(out, mod), "module %s is not excluded", mod);
    }
    CHECK(!excluded(out, "model.layers.1.mlp.experts.0.gate_proj") && !excluded(out, "model.layers.2.mlp.experts") &&
              !excluded(out, "model.layers.2.mlp.experts.3.down_proj"),
          "a quantized expert is excluded");
    nvfp4moe_model_info *info = NULL;
    CHECK_OK(nvfp4moe_model_info_read(out, &info));
    if (info)
        CHECK(info->quantized && !strcmp(info->quant_method, "modelopt") && !strcmp(info->quant_algo, "NVFP4") &&
                  info->num_moe_layers == 2 && info->num_layers == 3,
              "config: %s %s, %d MoE layers", info->quant_method, info->quant_algo, info->num_moe_layers);
    nvfp4moe_model_info_free(info);
    // Loads in our tools: every layer, bit for bit the in-memory layer.
    nvfp4moe_ckpt_layer *l = NULL;
    CHECK_OK(nvfp4moe_ckpt_layer_load(out, 2, &l));
    CHECK(l && l->warnings.count == 0 && l->router, "layer 2 loads with its router and no warning");
    nvfp4moe_ckpt_layer_free(l);
    // The directory's other files.
    char p[700];
    snprintf(p, sizeof p, "%s/tokenizer.json", out);
    CHECK(access(p, F_OK) == 0, "tokenizer.json copied");
    snprintf(p, sizeof p, "%s/generation_config.json", out);
    CHECK(access(p, F_OK) == 0, "generation_config.json copied");
    snprintf(p, sizeof p, "%s/.gitattributes", out);
    CHECK(access(p, F_OK) != 0, "hidden files are not copied");
    snprintf(p, sizeof p, "%s/pytorch_model.bin", out);
    CHECK(access(p, F_OK) != 0, "weights of another format are not copied");
    snprintf(p, sizeof p, "%s/original", out);
    CHECK(access(p, F_OK) != 0, "directories are not copied");
    CHECK(res.files_copied == 2 && entries(out) == 5, "%d files copied, %d entries", res.files_copied, entries(out));
    // Progress: never backwards, ends at the totals.
    CHECK(pl.calls > 8 && !pl.backwards && pl.last.bytes_done == pl.last.bytes_total &&
              pl.last.tensors_done == pl.last.tensors_total && pl.last.tensors_total == (int64_t)o.n &&
              pl.last.layers_done == 2 && pl.last.layers_total == 2 && pl.last.last_layer == 2,
          "progress: %d calls, %d backwards, %llu/%llu bytes, %lld/%lld tensors, %d/%d layers", pl.calls,
          pl.backwards, (unsigned long long)pl.last.bytes_done, (unsigned long long)pl.last.bytes_total,
          (long long)pl.last.tensors_done, (long long)pl.last.tensors_total, pl.last.layers_done,
          pl.last.layers_total);
    fmodel_free(&s);
    fmodel_free(&o);
}

/* Shards of at most the size asked, their index, the same tensors as one file. */
static void test_shards(void) {
    T_CASE("shards of at most --max-shard-size, with model.safetensors.index.json");
    char src[512], one[512], out[512];
    snprintf(src, sizeof src, "%s", dir_in("wm_src"));
    snprintf(one, sizeof one, "%s", dir_in("wm_out"));
    snprintf(out, sizeof out, "%s", fresh_dir("sh_out"));
    nvfp4moe_quantize_options opt;
    nvfp4moe_quantize_options_init(&opt);
    opt.max_shard_bytes = 40000;
    nvfp4moe_quantize_result res;
    CHECK_OK(nvfp4moe_model_quantize(src, out, &opt, &res));
    fmodel a = load_all(one), b = load_all(out);
    int bad = 0;
    for (size_t i = 0; i < a.n; i++) bad += !same_tensor(find(&b, a.t[i].name), &a.t[i]);
    CHECK(a.n == b.n && bad == 0, "%zu vs %zu tensors, %d differ from the single file's", a.n, b.n, bad);
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", out);
    json_error_t err;
    json_t *idx = json_load_file(p, 0, &err);
    CHECK(idx != NULL, "index: %s", err.text);
    json_t *map = json_object_get(idx, "weight_map");
    CHECK(json_object_size(map) == b.n && res.shards > 3, "%zu mapped of %zu, %d shards", json_object_size(map), b.n,
          res.shards);
    uint64_t total = 0;
    for (size_t i = 0; i < b.n; i++) total += b.t[i].nbytes;
    CHECK((uint64_t)json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")) == total,
          "total_size");
    // Each shard: at most the maximum of tensor bytes, unless it holds one larger tensor.
    for (int f = 1; f <= res.shards; f++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", f, res.shards);
        uint64_t bytes = 0;
        int count = 0;
        const char *k;
        json_t *v;
        json_object_foreach(map, k, v) {
            if (strcmp(json_string_value(v), name)) continue;
            bytes += find(&b, k)->nbytes;
            count++;
        }
        CHECK(count > 0 && (bytes <= opt.max_shard_bytes || count == 1), "%s: %d tensors, %llu bytes", name, count,
              (unsigned long long)bytes);
    }
    if (idx) json_decref(idx);
    nvfp4moe_ckpt_layer *l = NULL;
    CHECK_OK(nvfp4moe_ckpt_layer_load(out, 1, &l));
    nvfp4moe_ckpt_layer_free(l);
    fmodel_free(&a);
    fmodel_free(&b);
}

/* The other formats load to the same layer; W4A16 stores no input scales. */
static void test_formats(void) {
    char src[512], ref[512];   // dir_in's buffers rotate
    snprintf(src, sizeof src, "%s", dir_in("wm_src"));
    snprintf(ref, sizeof ref, "%s", dir_in("wm_out"));
    nvfp4moe_ckpt_layer *want = NULL;
    CHECK_OK(nvfp4moe_ckpt_layer_load(ref, 1, &want));
    const nvfp4moe_ckpt_format fmts[2] = {NVFP4MOE_CKPT_MODELOPT_FUSED, NVFP4MOE_CKPT_COMPRESSED_TENSORS};
    for (int i = 0; i < 2 && want; i++) {
        T_CASE(i ? "compressed-tensors: the same layer, each ignored module by name" : "modelopt-fused: the same layer");
        const char *out = fresh_dir(i ? "fmt_ct" : "fmt_fused");
        nvfp4moe_quantize_options opt;
        nvfp4moe_quantize_options_init(&opt);
        opt.format = fmts[i];
        CHECK_OK(nvfp4moe_model_quantize(src, out, &opt, NULL));
        nvfp4moe_ckpt_layer *l = NULL;
        CHECK_OK(nvfp4moe_ckpt_layer_load(out, 1, &l));
        if (l) {
            const nvfp4moe_config *c = &l->layer.cfg;
            const size_t E = 4, N1 = 64, H = 64, I = 32;
            CHECK(l->format == fmts[i], "format %s", nvfp4moe_ckpt_format_name(l->format));
            check_bytes("w13", l->layer.w.w13, want->layer.w.w13, E * N1 * H / 2);
            check_bytes("w13_scale", l->layer.w.w13_scale, want->layer.w.w13_scale, E * N1 * H / 16);
            check_bytes("w2", l->layer.w.w2, want->layer.w.w2, E * H * I / 2);
            check_bytes("scales", (const uint8_t *)l->layer.w.w13_scale_2, (const uint8_t *)want->layer.w.w13_scale_2, E * 4);
            check_bytes("input scales", (const uint8_t *)l->layer.w.w2_input_scale,
                        (const uint8_t *)want->layer.w.w2_input_scale, E * 4);
            CHECK(c->scheme == NVFP4MOE_SCHEME_W4A4, "scheme");
        }
        nvfp4moe_ckpt_layer_free(l);
        if (i == 1) {
            char list[64][96];
            const int n = excluded_list(out, list, 64);
            CHECK(n == 18 && !strcmp(list[0], "lm_head") && !strcmp(list[1], "model.layers.0.mlp.down_proj") &&
                      !strcmp(list[8], "model.layers.1.mlp.gate") && !strcmp(list[17], "model.layers.2.self_attn.v_proj"),
                  "ignore: %d entries", n);
            CHECK(excluded(out, "model.layers.1.mlp.gate") && !excluded(out, "model.layers.1.mlp.experts.0.up_proj"),
                  "the router excluded, the experts not");
        }
    }
    T_CASE("W4A16: no input scales, quant_algo W4A16_NVFP4");
    const char *out = fresh_dir("fmt_w4a16");
    nvfp4moe_quantize_options opt;
    nvfp4moe_quantize_options_init(&opt);
    opt.w4a16 = true;
    CHECK_OK(nvfp4moe_model_quantize(src, out, &opt, NULL));
    fmodel o = load_all(out);
    CHECK(!find(&o, "model.layers.1.mlp.experts.0.gate_proj.input_scale") &&
              find(&o, "model.layers.1.mlp.experts.0.gate_proj.weight_scale_2"),
          "W4A16 input scales");
    nvfp4moe_model_info *info = NULL;
    CHECK_OK(nvfp4moe_model_info_read(out, &info));
    if (info) CHECK(!strcmp(info->quant_algo, "W4A16_NVFP4") && info->cfg.scheme == NVFP4MOE_SCHEME_W4A16, "algo");
    nvfp4moe_model_info_free(info);
    fmodel_free(&o);
    nvfp4moe_ckpt_layer_free(want);
}

/* A BF16 source in gpt-oss's own layout (fused experts, interleaved gate/up, biases, mlp.router). */
static void test_gpt_oss_source(void) {
    T_CASE("gpt-oss's fused source: per-expert output, biases in their dtype, router copied and excluded");
    nvfp4moe_config cfg = small_cfg();
    cfg.activation = NVFP4MOE_ACT_SWIGLUOAI;
    const int64_t E = 4, H = 64, I = 32, N1 = 64;
    nvfp4moe_float_layer *f = NULL;
    CHECK_OK(nvfp4moe_float_layer_random(&cfg, 83, &f));
    if (!f) return;
    char src[512], out[512];
    snprintf(src, sizeof src, "%s", fresh_dir("goss_src"));
    snprintf(out, sizeof out, "%s", fresh_dir("goss_out"));
    nvfp4moe_st_writer *w = NULL;
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    uint16_t *t = malloc(sizeof(uint16_t) * (size_t)(E * N1 * H));
    for (int64_t e = 0; e < E; e++)
        for (int64_t k = 0; k < H; k++)
            for (int64_t n = 0; n < N1; n++) t[(e * H + k) * N1 + n] = nvfp4moe_bf16_from_float(f->w13[(e * N1 + n) * H + k]);
    const int64_t dgu[3] = {E, H, N1}, dgb[2] = {E, N1}, ddn[3] = {E, I, H}, ddb[2] = {E, H}, dr[2] = {E, H}, drb[1] = {E};
    CHECK_OK(nvfp4moe_st_writer_add(w, "model.layers.0.mlp.experts.gate_up_proj", NVFP4MOE_ST_BF16, 3, dgu, t));
    for (int64_t i = 0; i < E * N1; i++) t[i] = nvfp4moe_bf16_from_float(f->w13_bias[i]);
    CHECK_OK(nvfp4moe_st_writer_add(w, "model.layers.0.mlp.experts.gate_up_proj_bias", NVFP4MOE_ST_BF16, 2, dgb, t));
    for (int64_t e = 0; e < E; e++)
        for (int64_t k = 0; k < I; k++)
            for (int64_t n = 0; n < H; n++) t[(e * I + k) * H + n] = nvfp4moe_bf16_from_float(f->w2[(e * H + n) * I + k]);
    CHECK_OK(nvfp4moe_st_writer_add(w, "model.layers.0.mlp.experts.down_proj", NVFP4MOE_ST_BF16, 3, ddn, t));
    for (int64_t i = 0; i < E * H; i++) t[i] = nvfp4moe_bf16_from_float(f->w2_bias[i]);
    CHECK_OK(nvfp4moe_st_writer_add(w, "model.layers.0.mlp.experts.down_proj_bias", NVFP4MOE_ST_BF16, 2, ddb, t));
    for (int64_t i = 0; i < E * H; i++) t[i] = nvfp4moe_bf16_from_float(f->router[i]);
    CHECK_OK(nvfp4moe_st_writer_add(w, "model.layers.0.mlp.router.weight", NVFP4MOE_ST_BF16, 2, dr, t));
    for (int64_t i = 0; i < E; i++) t[i] = nvfp4moe_bf16_from_float(f->router_bias[i]);
    CHECK_OK(nvfp4moe_st_writer_add(w, "model.layers.0.mlp.router.bias", NVFP4MOE_ST_BF16, 1, drb, t));
    free(t);
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    CHECK_OK(nvfp4moe_st_writer_save(w, p));
    nvfp4moe_st_writer_free(w);
    CHECK_OK(nvfp4moe_model_config_write(src, &f->cfg, 1, 0, NVFP4MOE_CKPT_UNQUANTIZED, NULL, NULL));
    nvfp4moe_quantize_options opt;
    nvfp4moe_quantize_options_init(&opt);
    nvfp4moe_quantize_result res;
    CHECK_OK(nvfp4moe_model_quantize(src, out, &opt, &res));
    fmodel s = load_all(src), o = load_all(out);
    CHECK(same_tensor(find(&o, "model.layers.0.mlp.router.weight"), find(&s, "model.layers.0.mlp.router.weight")) &&
              same_tensor(find(&o, "model.layers.0.mlp.router.bias"), find(&s, "model.layers.0.mlp.router.bias")) &&
              !find(&o, "model.layers.0.mlp.experts.gate_up_proj"),
          "router copied, fused experts replaced");
    const ftensor *gb = find(&o, "model.layers.0.mlp.experts.1.gate_proj.bias");
    const ftensor *ub = find(&o, "model.layers.0.mlp.experts.1.up_proj.bias");
    CHECK(gb && ub && gb->dtype == NVFP4MOE_ST_BF16 && gb->shape[0] == I && res.expert_biases, "BF16 biases [I]");
    int bad = 0;
    for (int64_t r = 0; gb && ub && r < I; r++) {
        uint16_t g, u;
        memcpy(&g, gb->data + 2 * r, 2);
        memcpy(&u, ub->data + 2 * r, 2);
        bad += g != nvfp4moe_bf16_from_float(f->w13_bias[N1 + 2 * r]) || u != nvfp4moe_bf16_from_float(f->w13_bias[N1 + 2 * r + 1]);
    }
    CHECK(bad == 0, "%d gate/up bias values are not gate_up_proj_bias[..., 0::2] / [..., 1::2]", bad);
    CHECK(excluded(out, "model.layers.0.mlp.router") && !excluded(out, "model.layers.0.mlp.experts.0.gate_proj"),
          "mlp.router excluded");
    nvfp4moe_ckpt_layer *l = NULL;
    CHECK_OK(nvfp4moe_ckpt_layer_load(out, 0, &l));
    if (l)
        CHECK(l->layer.cfg.has_bias && l->router_bias && !strcmp(l->router_name, "router"), "loads with its biases");
    nvfp4moe_ckpt_layer_free(l);
    fmodel_free(&s);
    fmodel_free(&o);
    nvfp4moe_float_layer_free(f);
}

static void test_one_layer(void) {
    T_CASE("one layer only: the other MoE layer copied and excluded");
    char src[512], out[512];
    snprintf(src, sizeof src, "%s", dir_in("wm_src"));
    snprintf(out, sizeof out, "%s", fresh_dir("one_out"));
    nvfp4moe_quantize_options opt;
    nvfp4moe_quantize_options_init(&opt);
    opt.layer = 2;
    nvfp4moe_quantize_result res;
    CHECK_OK(nvfp4moe_model_quantize(src, out, &opt, &res));
    fmodel s = load_all(src), o = load_all(out);
    CHECK(res.moe_layers == 1 &&
              same_tensor(find(&o, "model.layers.1.mlp.experts.2.up_proj.weight"),
                          find(&s, "model.layers.1.mlp.experts.2.up_proj.weight")) &&
              find(&o, "model.layers.2.mlp.experts.2.up_proj.weight_scale"),
          "layer 1 copied, layer 2 quantized");
    CHECK(excluded(out, "model.layers.1.mlp.experts") && excluded(out, "model.layers.1.mlp.experts.0.gate_proj") &&
              !excluded(out, "model.layers.2.mlp.experts.0.gate_proj"),
          "layer 1's experts excluded, layer 2's not");
    nvfp4moe_ckpt_layer *l = NULL;
    CHECK_OK(nvfp4moe_ckpt_layer_load(out, 2, &l));
    nvfp4moe_ckpt_layer_free(l);
    opt.layer = 0;
    CHECK_ERR(nvfp4moe_model_quantize(src, fresh_dir("one_bad"), &opt, NULL), NVFP4MOE_ERR_NOT_FOUND,
              "layer 0 is not a MoE layer");
    fmodel_free(&s);
    fmodel_free(&o);
}

/* Failures leave nothing in the output directory. */
static void test_failures(void) {
    char src[512];
    snprintf(src, sizeof src, "%s", dir_in("wm_src"));
    T_CASE("a tensor under the experts module that is not an expert's: refused, nothing written");
    {
        const char *bad = fresh_dir("fail_src"), *out = fresh_dir("fail_out");
        static float x[4];
        const edit add = {"model.layers.2.mlp.experts.scale", 2, NVFP4MOE_ST_F32, 1, {4}, x};
        rewrite(src, bad, &add, 1);
        nvfp4moe_quantize_options opt;
        nvfp4moe_quantize_options_init(&opt);
        CHECK_ERR(nvfp4moe_model_quantize(bad, out, &opt, NULL), NVFP4MOE_ERR_UNSUPPORTED,
                  "tensor 'model.layers.2.mlp.experts.scale' is in layer 2's experts module");
        CHECK(entries(out) == 0, "%d entries left", entries(out));
    }
    T_CASE("an output directory that holds a shard's name: refused, nothing else written, the file kept");
    {
        const char *out = fresh_dir("fail_exists");
        write_text(out, "model.safetensors", "mine");
        nvfp4moe_quantize_options opt;
        nvfp4moe_quantize_options_init(&opt);
        CHECK_ERR(nvfp4moe_model_quantize(src, out, &opt, NULL), NVFP4MOE_ERR_IO, "model.safetensors: cannot create");
        char p[700];
        snprintf(p, sizeof p, "%s/model.safetensors", out);
        FILE *f = fopen(p, "r");
        char b[8] = "";
        if (f) {
            CHECK(fgets(b, sizeof b, f) != NULL, "read");
            fclose(f);
        }
        CHECK(entries(out) == 1 && !strcmp(b, "mine"), "%d entries, '%s'", entries(out), b);
    }
    T_CASE("a failure after the shards are written (config.json cannot be written): nothing left");
    {
        const char *out = fresh_dir("fail_late");
        char p[700];
        snprintf(p, sizeof p, "%s/config.json", out);
        mkdir(p, 0755);   // a directory where config.json goes
        snprintf(p, sizeof p, "%s/config.json/x", out);
        write_text(out, "config.json/x", "keep");
        nvfp4moe_quantize_options opt;
        nvfp4moe_quantize_options_init(&opt);
        opt.max_shard_bytes = 40000;
        CHECK_ERR(nvfp4moe_model_quantize(src, out, &opt, NULL), NVFP4MOE_ERR_IO, "config.json");
        CHECK(entries(out) == 1 && access(p, F_OK) == 0, "%d entries left", entries(out));
    }
    T_CASE("bad options");
    nvfp4moe_quantize_options opt;
    nvfp4moe_quantize_options_init(&opt);
    opt.format = NVFP4MOE_CKPT_UNQUANTIZED;
    CHECK_ERR(nvfp4moe_model_quantize(src, dir_in("x"), &opt, NULL), NVFP4MOE_ERR_INVALID_ARGUMENT, "format unquantized");
    nvfp4moe_quantize_options_init(&opt);
    opt.max_shard_bytes = 0;
    CHECK_ERR(nvfp4moe_model_quantize(src, dir_in("x"), &opt, NULL), NVFP4MOE_ERR_INVALID_ARGUMENT, "max_shard_bytes");
    nvfp4moe_quantize_options_init(&opt);
    CHECK_ERR(nvfp4moe_model_quantize(dir_in("wm_out"), dir_in("x"), &opt, NULL), NVFP4MOE_ERR_UNSUPPORTED,
              "is already quantized");
}

// ---- memory ----

static const char *g_big_src, *g_big_out;

/* Under the limit, the streaming quantizer finishes; the in-memory path (a float copy of the whole
 * layer) cannot, which shows that the limit is below a layer's size. */
static void big_streaming(void) {
    nvfp4moe_quantize_options opt;
    nvfp4moe_quantize_options_init(&opt);
    opt.calib_tokens = 2;
    CHECK_OK(nvfp4moe_model_quantize(g_big_src, g_big_out, &opt, NULL));
}

static void big_in_memory(void) {
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_st_model *m = NULL;
    nvfp4moe_float_layer *f = NULL;
    nvfp4moe_ckpt_layer *q = NULL;
    CHECK_OK(nvfp4moe_model_info_read(g_big_src, &info));
    CHECK_OK(nvfp4moe_st_model_open(g_big_src, &m));
    nvfp4moe_status s = info && m ? nvfp4moe_float_layer_load(info, m, 0, &f) : NVFP4MOE_ERR_INTERNAL;
    if (s == NVFP4MOE_OK) s = nvfp4moe_float_layer_quantize(f, 2, 0, &q);
    CHECK(s == NVFP4MOE_ERR_OUT_OF_MEMORY, "the in-memory path fits the limit too (%s): the limit proves nothing",
          nvfp4moe_status_str(s));
    nvfp4moe_ckpt_layer_free(q);
    nvfp4moe_float_layer_free(f);
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
}

static void test_memory(void) {
#ifdef UNDER_SANITIZER
    printf("test_quantize: memory bound not checked under sanitizers (no address-space limit)\n");
#else
    T_CASE("memory bounded by one expert: E=16 H=1024 I=1024 (a 200 MB float layer) in 200 MiB of address space");
    nvfp4moe_config c = small_cfg();
    c.num_experts = 16;
    c.hidden_size = 1024;
    c.intermediate_size = 1024;
    c.in_dtype = c.out_dtype = NVFP4MOE_DTYPE_BF16;
    g_big_src = fresh_dir("big_src");
    g_big_out = fresh_dir("big_out");
    CHECK_OK(nvfp4moe_model_write_random(g_big_src, &c, 1, 0, 0));
    bounded("streaming quantize under the limit", big_streaming, 120, 200);
    nvfp4moe_ckpt_layer *l = NULL;
    CHECK_OK(nvfp4moe_ckpt_layer_load(g_big_out, 0, &l));
    nvfp4moe_ckpt_layer_free(l);
    bounded("the in-memory path under the same limit", big_in_memory, 120, 200);
#endif
}

// ---- the command line ----

static void test_cli(void) {
    if (!getenv("NVFP4MOE_CLI")) {
        printf("NVFP4MOE_CLI is not set: the command-line checks need it (make test sets it)\n");
        return;
    }
    T_CASE("quantize --in: plain progress lines, the summary; --max-shard-size");
    const char *src = dir_in("wm_src");
    char out[512];
    snprintf(out, sizeof out, "%s/cli_out", g_dir);
    int rc = cli("quantize --in %s --out %s --max-shard-size 40KB", src, out);
    CHECK(rc == 0 && strstr(g_out, "layer 1: 4 experts quantized (1 of 2 MoE layers") &&
              strstr(g_out, "layer 2: 4 experts quantized (2 of 2 MoE layers") && strstr(g_out, "2 MoE layers quantized") &&
              strstr(g_out, "copied bit for bit") && strstr(g_out, "2 other files copied") && !strstr(g_out, "\r"),
          "rc %d: %s", rc, g_out);
    CHECK(entries(out) > 5, "%d entries", entries(out));
    rc = cli("run --model %s --tokens 3 --layer 2", out);
    CHECK(rc == 0 && strstr(g_out, "checksum"), "rc %d: %s", rc, g_out);
    rc = cli("inspect %s", out);
    CHECK(rc == 0 && strstr(g_out, "0 problems"), "rc %d: %s", rc, g_out);
    rc = cli("quantize --in %s --out %s/x --max-shard-size 5XB", src, g_dir);
    CHECK(rc == 1 && strstr(g_out, "--max-shard-size: expected a size"), "rc %d: %s", rc, g_out);
    rc = cli("quantize --in %s --out %s/y --layer 2", src, g_dir);
    CHECK(rc == 0 && strstr(g_out, "1 MoE layer quantized"), "rc %d: %s", rc, g_out);
    snprintf(out, sizeof out, "%s/y", g_dir);
    rc = cli("inspect %s", out);
    CHECK(rc == 0 && strstr(g_out, "layer 1       excluded from quantization"), "rc %d: %s", rc, g_out);
}

int main(void) {
    fixtures_begin("nvfp4moe-quantize");
    test_whole_model();
    test_shards();
    test_formats();
    test_gpt_oss_source();
    test_one_layer();
    test_failures();
    test_memory();
    test_cli();
    fixtures_end();
    return t_finish("test_quantize");
}
