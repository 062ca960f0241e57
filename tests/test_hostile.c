/*
 * test_hostile.c - hostile and careless input: model directories, config.json texts, files and
 * command lines made to break the readers. Each case must end in a status and a message naming the
 * file, the field or tensor and the value; nothing written to outputs, no crash, no hang, nothing
 * read out of bounds or leaked (tests/sanitize.sh runs this program under AddressSanitizer and
 * UndefinedBehaviorSanitizer). Every fixture is generated at test time.
 */
#include "ckpt_fixtures.h"
#include "nvfp4moe_experimental.h"

#include <dirent.h>
#include <pthread.h>
#include <jansson.h>
#include <signal.h>
#include <sys/resource.h>

// ---- config.json ----

/* A quantized layer 0 of small_cfg's shape in dir (ModelOpt per-expert unless fmt says otherwise). */
static void quantized_model(const char *dir, nvfp4moe_ckpt_format fmt) {
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 5);
    if (q) save_layer(dir, fmt, q, 0);
    nvfp4moe_ckpt_layer_free(q);
}

/* dir's config and tensors, both checked to open. */
static void open_model(const char *dir, nvfp4moe_model_info **info, nvfp4moe_st_model **m) {
    *info = NULL;
    *m = NULL;
    CHECK_OK(nvfp4moe_model_info_read(dir, info));
    CHECK_OK(nvfp4moe_st_model_open(dir, m));
}

static nvfp4moe_model_info *parse_config(const char *config_json) {
    nvfp4moe_model_info *info = NULL;
    CHECK_OK(nvfp4moe_model_info_parse(config_json, NULL, "m", &info));
    return info;
}

/* A dense model (no expert count): every layer answers "not MoE", and loading one says so. */
static void test_dense_config(void) {
    T_CASE("config.json without an expert count");
    nvfp4moe_model_info *info = parse_config("{\"hidden_size\": 256, \"num_hidden_layers\": 8}");
    if (info) {
        CHECK(info->num_moe_layers == 0 && info->first_moe_layer == -1, "%d MoE layers, first %d",
              info->num_moe_layers, info->first_moe_layer);
        for (int32_t L = -1; L <= 8; L++)
            CHECK(!nvfp4moe_model_info_is_moe_layer(info, L), "layer %d is MoE", L);
    }
    nvfp4moe_model_info_free(info);

    // The same config beside a real MoE checkpoint: asking for a layer must not read past the
    // config's per-layer table.
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 3);
    if (!q) return;
    const char *d = dir_in("dense");
    save_layer(d, NVFP4MOE_CKPT_MODELOPT, q, 3);
    nvfp4moe_ckpt_layer_free(q);
    write_text(d, "config.json", "{\"hidden_size\": 64, \"num_hidden_layers\": 8}");
    nvfp4moe_ckpt_layer *l = NULL;
    CHECK_ERR(nvfp4moe_ckpt_layer_load(d, 3, &l), NVFP4MOE_ERR_NOT_FOUND, "layer 3 is not a MoE layer");
    CHECK(l == NULL, "output written on failure");
    if (getenv("NVFP4MOE_CLI")) {
        int rc = cli("run --model %s --layer 3", d);
        CHECK(rc == 1 && strstr(g_out, "layer 3 is not a MoE layer"), "rc %d: %s", rc, g_out);
    }
}

/* Sizes past what any layer has: validation names the field before anything multiplies them. */
static void test_huge_sizes(void) {
    T_CASE("intermediate_size near INT32_MAX");
    nvfp4moe_model_info *info = parse_config(
        "{\"hidden_size\": 256, \"num_hidden_layers\": 2, \"num_experts\": 8, "
        "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 2147483632}");
    if (info) {
        CHECK_ERR(nvfp4moe_config_validate(&info->cfg), NVFP4MOE_ERR_INVALID_ARGUMENT,
                  "intermediate_size=2147483632");
        CHECK(nvfp4moe_config_n1(&info->cfg) >= 0, "n1 %d", nvfp4moe_config_n1(&info->cfg));
    }
    nvfp4moe_model_info_free(info);
    nvfp4moe_config c = small_cfg();
    c.hidden_size = 1 << 30;
    CHECK_ERR(nvfp4moe_config_validate(&c), NVFP4MOE_ERR_INVALID_ARGUMENT, "hidden_size=1073741824");
    if (getenv("NVFP4MOE_CLI")) {
        const char *d = dir_in("huge_inter");
        write_text(d, "config.json", "{\"hidden_size\": 256, \"num_hidden_layers\": 2, \"num_experts\": 8, "
                                     "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 2147483632}");
        quantized_model(dir_in("huge_inter_src"), NVFP4MOE_CKPT_MODELOPT);
        char cmd[1400];
        snprintf(cmd, sizeof cmd, "cp '%s/model.safetensors' '%s/'", dir_in("huge_inter_src"), d);
        CHECK(system(cmd) == 0, "copy");
        int rc = cli("inspect %s", d);
        CHECK(rc == 1 && strstr(g_out, "intermediate_size=2147483632") && !strstr(g_out, "-2147483648") &&
                  !strstr(g_out, "-4294967"),
              "rc %d: %s", rc, g_out);
        rc = cli("select --model %s --device h200", d);
        CHECK(rc == 1 && strstr(g_out, "intermediate_size=2147483632"), "rc %d: %s", rc, g_out);
    }
}

// ---- exclusion patterns ----

/* Parses a config.json whose quantization config ignores the one module pattern p. */
static nvfp4moe_status parse_with_pattern(const char *p, nvfp4moe_model_info **info) {
    json_t *root = json_pack("{s:i, s:i, s:{s:s, s:s, s:[s]}}", "hidden_size", 64, "num_hidden_layers", 1,
                             "quantization_config", "quant_method", "modelopt", "quant_algo", "NVFP4",
                             "ignore", p);
    char *text = root ? json_dumps(root, 0) : NULL;
    json_decref(root);
    if (!text) {
        fprintf(stderr, "cannot encode pattern '%s'\n", p);
        exit(2);
    }
    nvfp4moe_status s = nvfp4moe_model_info_parse(text, NULL, "m", info);
    free(text);
    return s;
}

/* Whether pattern p (as config.json's ignore list would give it) excludes module. */
static bool excludes(const char *p, const char *module) {
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_status s = parse_with_pattern(p, &info);
    CHECK(s == NVFP4MOE_OK, "pattern '%s': %s", p, nvfp4moe_last_error());
    bool r = info && nvfp4moe_model_info_is_excluded(info, module);
    nvfp4moe_model_info_free(info);
    return r;
}

/* The matcher reads what Python's re.match and fnmatch read, for the forms checkpoints use. */
static void test_pattern_semantics(void) {
    T_CASE("exclusion patterns match as Python does");
    static const struct {
        const char *pattern, *module;
        bool want;
    } k_cases[] = {
        {"re:.*mlp\\.gate$", "model.layers.7.mlp.gate", true},
        {"re:.*mlp\\.gate$", "model.layers.7.mlp.gate_proj", false},
        {"re:model\\.layers\\.\\d+\\.mlp\\.gate", "model.layers.12.mlp.gate_proj", true},   // re.match: a prefix
        {"re:model\\.layers\\.\\d+\\.mlp\\.gate", "model.layers.x.mlp.gate", false},
        {"re:.*lm_head", "lm_head", true},
        {"re:(?:vision|audio)_tower.*", "vision_tower.blocks.0", true},
        {"re:(?:vision|audio)_tower.*", "model.vision_tower", false},
        {"re:^model\\.layers\\.[0-2]\\.", "model.layers.1.mlp", true},
        {"re:^model\\.layers\\.[0-2]\\.", "model.layers.3.mlp", false},
        {"re:a{2,3}b", "aab", true},
        {"re:a{2,3}b", "ab", false},
        {"re:a{2,3}b", "aaaab", false},
        {"re:a{,2}b", "b", true},
        {"re:a{x}", "a{x}", true},
        {"re:x|y", "y", true},
        {"re:[^.]+\\.mlp", "layers.mlp", true},
        {"re:[^.]+\\.mlp", ".mlp", false},
        {"re:\\w+\\s?$", "abc", true},
        {"re:\\D+", "7", false},
        {"re:.*(?P<n>gate)$", "mlp.gate", true},
        {"re:.*gate\\Z", "mlp.gate", true},
        {"re:.*gate+?$", "mlp.gateee", true},
        {"re:", "anything", true},
        {"*.mlp.gate", "model.layers.3.mlp.gate", true},
        {"*.mlp.gate", "model.layers.3.mlp.gate_proj", false},
        {"model.layers.?.mlp.*", "model.layers.3.mlp.experts", true},
        {"model.layers.?.mlp.*", "model.layers.13.mlp.experts", false},
        {"model.layers.[0-4].mlp*", "model.layers.2.mlpx", true},
        {"model.layers.[!0-4].mlp", "model.layers.5.mlp", true},
        {"model.layers.[!0-4].mlp", "model.layers.4.mlp", false},
        {"[]x]", "]", true},
        {"[abc", "[abc", true},
        {"lm_head", "lm_head.weight", true},   // a plain module name covers what is inside it
        {"lm_head", "lm_head2", false},
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++)
        CHECK(excludes(k_cases[i].pattern, k_cases[i].module) == k_cases[i].want, "'%s' on '%s': want %s",
              k_cases[i].pattern, k_cases[i].module, k_cases[i].want ? "a match" : "no match");
}

/* Patterns made to blow up a regex engine: refused at once or matched in linear time. */
static void hostile_patterns(void) {
    static const struct {
        const char *pattern, *needle;   /* needle: in the FORMAT message; NULL: must load */
    } k_cases[] = {
        {"re:a+++++++++++++++++++++++++++++++", "a repetition of a repetition"},
        {"re:(((a{256}){256}){256})", "too complex"},
        {"re:(?=model)", "look-around"},
        {"re:model\\b", "does not read"},
        {"re:(a)\\1", "does not read"},
        {"re:(a", "an unterminated ("},
        {"re:a)", "an unmatched )"},
        {"re:[a", "an unterminated ["},
        {"re:*a", "nothing to repeat"},
        {"re:(a*)*$", NULL},
        {"re:(a|a|aa)*b", NULL},
        {"*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b", NULL},
    };
    // A long name that almost matches: what makes a backtracking matcher take forever.
    char name[1002];
    memset(name, 'a', 1000);
    strcpy(name + 1000, "c");
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        nvfp4moe_model_info *info = NULL;
        nvfp4moe_status s = parse_with_pattern(k_cases[i].pattern, &info);
        if (k_cases[i].needle) {
            CHECK(s == NVFP4MOE_ERR_FORMAT && strstr(nvfp4moe_last_error(), k_cases[i].needle) &&
                      strstr(nvfp4moe_last_error(), "m/config.json") && !info,
                  "'%s': %s: %s", k_cases[i].pattern, nvfp4moe_status_str(s), nvfp4moe_last_error());
        } else {
            CHECK(s == NVFP4MOE_OK, "'%s': %s", k_cases[i].pattern, nvfp4moe_last_error());
            CHECK(info && !nvfp4moe_model_info_is_excluded(info, name), "'%s' matched", k_cases[i].pattern);
        }
        nvfp4moe_model_info_free(info);
    }
    char pat[1100];
    memset(pat, 'a', sizeof pat - 1);
    pat[sizeof pat - 1] = '\0';
    memcpy(pat, "re:", 3);
    nvfp4moe_model_info *info = NULL;
    CHECK_ERR(parse_with_pattern(pat, &info), NVFP4MOE_ERR_FORMAT, "more than 1024");
}

static void test_hostile_patterns(void) {
    T_CASE("regular expressions made to exhaust memory or time");
    bounded("hostile exclusion patterns", hostile_patterns, 60, 1024);
}

// ---- checkpoints ----

/* Expert biases are all there or all absent: one bias alone is named, in the full load and in
 * inspect's check-only load (which must not call such a layer "ok"). */
static void test_partial_biases(void) {
    T_CASE("expert 0 has only a down_proj bias");
    const char *src = dir_in("bias_src"), *d = dir_in("bias_down_only");
    quantized_model(src, NVFP4MOE_CKPT_MODELOPT);
    static float bias[64];
    const edit add = {"model.layers.0.mlp.experts.0.down_proj.bias", 2, NVFP4MOE_ST_F32, 1, {64}, bias};
    rewrite(src, d, &add, 1);
    ckpt_load_fails(d, NVFP4MOE_ERR_NOT_FOUND, "experts.0.gate_proj.bias' not found");
    if (getenv("NVFP4MOE_CLI")) {
        int rc = cli("inspect %s", d);
        CHECK(rc == 1 && strstr(g_out, "PROBLEM") && strstr(g_out, "gate_proj.bias"), "rc %d: %s", rc, g_out);
        rc = cli("run --model %s --tokens 2", d);
        CHECK(rc == 1 && strstr(g_out, "gate_proj.bias' not found"), "rc %d: %s", rc, g_out);
    }
}

/* config.json sizes that would need gigabytes, beside a file that holds small experts: the
 * quantize loader must find the wrong shapes before it allocates anything of that size (in a
 * child limited to 1 GiB of address space, outside sanitizer builds). */
static const char *g_big_dir;

static void big_config_small_file(void) {
    nvfp4moe_model_info *info;
    nvfp4moe_st_model *m;
    nvfp4moe_float_layer *f = NULL;
    open_model(g_big_dir, &info, &m);
    if (info && m)
        CHECK_ERR(nvfp4moe_float_layer_load(info, m, 0, &f), NVFP4MOE_ERR_FORMAT,
                  "experts.0.gate_proj.weight': shape [32, 64], expected [4096, 4096] float");
    CHECK(f == NULL, "output written on failure");
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
}

static void test_big_config(void) {
    T_CASE("config.json sizes far beyond the file's tensors");
    const char *src = dir_in("big_config_src");
    g_big_dir = dir_in("big_config");
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_float_layer *f = NULL;
    CHECK_OK(nvfp4moe_float_layer_random(&cfg, 1, &f));
    if (f) write_float_model(src, &cfg, f);
    nvfp4moe_float_layer_free(f);
    const edit no_router = {"model.layers.0.mlp.gate.weight", 0, 0, 0, {0}, NULL};   // its shape is checked first
    rewrite(src, g_big_dir, &no_router, 1);
    // 64 experts of 4096 x 8192: 8.6 GB of float w13 alone.
    write_text(g_big_dir, "config.json",
               "{\"hidden_size\": 4096, \"num_hidden_layers\": 1, \"num_experts\": 64, "
               "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 4096}");
    bounded("quantize loader with a lying config", big_config_small_file, 60, 1024);
}

// ---- files that are not regular files ----

static const char *g_fifo_dir;

/* Every reader refuses a FIFO (which would block the open forever) and a directory where a file
 * should be, naming it. Runs in a bounded child: before the fix it hangs. */
static void fifo_readers(void) {
    const char *d = g_fifo_dir;
    nvfp4moe_model_info *info = NULL;
    CHECK_ERR(nvfp4moe_model_info_read(d, &info), NVFP4MOE_ERR_IO, "config.json: not a regular file");
    nvfp4moe_st_model *m = NULL;
    CHECK_ERR(nvfp4moe_st_model_open(d, &m), NVFP4MOE_ERR_IO, "fifo.safetensors: not a regular file");
    char p[700];
    snprintf(p, sizeof p, "%s/fifo.safetensors", d);
    nvfp4moe_st_file *f = NULL;
    CHECK_ERR(nvfp4moe_st_open(p, &f), NVFP4MOE_ERR_IO, "not a regular file");
    CHECK(!info && !m && !f, "output written on failure");
    if (getenv("NVFP4MOE_CLI")) {
        int rc = cli("inspect %s", d);
        CHECK(rc == 1 && strstr(g_out, "not a regular file"), "rc %d: %s", rc, g_out);
        rc = cli("select --model %s", d);
        CHECK(rc == 1 && strstr(g_out, "not a regular file"), "rc %d: %s", rc, g_out);
        rc = cli("run --hidden-size 64 --input %s/fifo.bin", d);
        CHECK(rc == 1 && strstr(g_out, "not a regular file"), "rc %d: %s", rc, g_out);
        rc = cli("quantize --in %s --out %s/out", d, d);
        CHECK(rc == 1 && strstr(g_out, "not a regular file"), "rc %d: %s", rc, g_out);
    }
    // A directory named like the file it should be.
    const char *e = dir_in("dir_as_file");
    snprintf(p, sizeof p, "%s/config.json", e);
    mkdir(p, 0755);
    CHECK_ERR(nvfp4moe_model_info_read(e, &info), NVFP4MOE_ERR_IO, "config.json: not a regular file");
}

static void test_fifos(void) {
    T_CASE("a FIFO as config.json, as the only shard, as --input");
    const char *d = dir_in("fifo");
    char p[700];
    const char *names[] = {"config.json", "fifo.safetensors", "fifo.bin"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", d, names[i]);
        CHECK(mkfifo(p, 0644) == 0, "mkfifo %s", p);
    }
    g_fifo_dir = d;
    bounded("readers on FIFOs", fifo_readers, 60, 4096);
}

/* Values a run would refuse (a NaN block scale, a NaN bias) are problems for inspect's check-only
 * load too, named with the tensor and the element, in every layout. */
static void test_nan_values(void) {
    T_CASE("NaN block scales and biases");
    static const nvfp4moe_ckpt_format fmts[] = {NVFP4MOE_CKPT_MODELOPT, NVFP4MOE_CKPT_MODELOPT_FUSED,
                                                NVFP4MOE_CKPT_COMPRESSED_TENSORS};
    static const char *scale_names[] = {"model.layers.0.mlp.experts.2.down_proj.weight_scale",
                                        "model.layers.0.mlp.experts.down_proj_weight_scale",
                                        "model.layers.0.mlp.experts.2.down_proj.weight_scale"};
    for (int i = 0; i < 3; i++) {
        char src[64], dst[64];
        snprintf(src, sizeof src, "nan_src_%d", i);
        snprintf(dst, sizeof dst, "nan_scale_%d", i);
        const char *sd = dir_in(src), *dd = dir_in(dst);
        quantized_model(sd, fmts[i]);
        char p[700];
        snprintf(p, sizeof p, "%s/model.safetensors", sd);
        nvfp4moe_st_file *f = NULL;
        CHECK_OK(nvfp4moe_st_open(p, &f));
        const nvfp4moe_st_tensor *t = f ? nvfp4moe_st_file_find(f, scale_names[i]) : NULL;
        CHECK(t != NULL, "no tensor %s", scale_names[i]);
        if (!t) {
            nvfp4moe_st_close(f);
            continue;
        }
        uint8_t *bad = malloc((size_t)t->nbytes);
        memcpy(bad, t->data, (size_t)t->nbytes);
        bad[t->nbytes - 3] = 0x7F;   // one NaN block scale near the end
        edit e = {scale_names[i], 1, t->dtype, t->ndim, {t->shape[0], t->ndim > 1 ? t->shape[1] : 0,
                                                          t->ndim > 2 ? t->shape[2] : 0}, bad};
        rewrite(sd, dd, &e, 1);
        nvfp4moe_st_close(f);
        free(bad);
        ckpt_load_fails(dd, NVFP4MOE_ERR_FORMAT, "is NaN (E4M3 code 0x7F)");
        CHECK(strstr(nvfp4moe_last_error(), scale_names[i]) != NULL, "message: %s", nvfp4moe_last_error());
        if (getenv("NVFP4MOE_CLI")) {
            int rc = cli("inspect %s", dd);
            CHECK(rc == 1 && strstr(g_out, "PROBLEM") && strstr(g_out, "NaN"), "rc %d: %s", rc, g_out);
        }
    }
    T_CASE("a NaN expert bias");
    const char *bs = dir_in("nan_bias_src"), *bd = dir_in("nan_bias");
    nvfp4moe_config cfg = small_cfg();
    cfg.has_bias = true;
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 8);
    if (q) save_layer(bs, NVFP4MOE_CKPT_MODELOPT, q, 0);
    nvfp4moe_ckpt_layer_free(q);
    float bias[64];
    for (int i = 0; i < 64; i++) bias[i] = 0.25f;
    bias[17] = NAN;
    edit e = {"model.layers.0.mlp.experts.1.down_proj.bias", 1, NVFP4MOE_ST_F32, 1, {64}, bias};
    rewrite(bs, bd, &e, 1);
    ckpt_load_fails(bd, NVFP4MOE_ERR_FORMAT, "experts.1.down_proj.bias': element [17] is nan");
}

// ---- a file that changes while it is open ----

static const char *g_trunc_dir;

/* Opens the model, then cuts its file in half (another process rewriting it), then loads: every
 * read must see the change as an I/O error naming the file, never as SIGBUS. */
static void truncated_while_open(void) {
    const char *d = g_trunc_dir;
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    nvfp4moe_model_info *info;
    nvfp4moe_st_model *m;
    open_model(d, &info, &m);
    struct stat st;
    CHECK(stat(p, &st) == 0 && truncate(p, st.st_size / 2) == 0, "truncate %s", p);
    for (int check_only = 0; check_only < 2 && info && m; check_only++) {
        nvfp4moe_ckpt_layer *l = NULL;
        CHECK_ERR(nvfp4moe_ckpt_layer_load_from(info, m, 0, check_only, &l), NVFP4MOE_ERR_IO, "model.safetensors");
        CHECK(l == NULL, "output written on failure");
        CHECK(strstr(nvfp4moe_last_error(), "changed") != NULL, "message: %s", nvfp4moe_last_error());
    }
    const nvfp4moe_st_file *file = m ? nvfp4moe_st_model_file(m, 0) : NULL;   // its last tensor in data order
    const nvfp4moe_st_tensor *t = file ? nvfp4moe_st_file_tensor(file, nvfp4moe_st_file_count(file) - 1) : NULL;
    uint8_t byte;
    if (t && t->nbytes)
        CHECK_ERR(nvfp4moe_st_tensor_read(t, t->nbytes - 1, 1, &byte), NVFP4MOE_ERR_IO, t->name);
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
}

static void test_truncated_while_open(void) {
    T_CASE("a checkpoint truncated while it is open");
    g_trunc_dir = dir_in("truncated_while_open");
    quantized_model(g_trunc_dir, NVFP4MOE_CKPT_MODELOPT);
    bounded("loading a file truncated after it was opened", truncated_while_open, 60, 4096);
}

// ---- the command line ----

/* Values that must be refused before anything uses them, and error paths that must free what the
 * command had loaded (under tests/sanitize.sh a leak turns the exit status into LeakSanitizer's). */
static void test_cli_errors(void) {
    if (!getenv("NVFP4MOE_CLI")) return;
    T_CASE("run --hidden-size 0 with an input file");
    const char *d = dir_in("cli_errors");
    char x[700];
    snprintf(x, sizeof x, "%s/x.bin", d);
    FILE *f = fopen(x, "wb");
    static float zeros[256];
    if (f) fwrite(zeros, sizeof zeros, 1, f), fclose(f);
    int rc = cli("run --hidden-size 0 --input %s", x);
    CHECK(rc == 1 && strstr(g_out, "hidden_size=0"), "rc %d: %s", rc, g_out);
    rc = cli("run --hidden-size 24 --input %s", x);
    CHECK(rc == 1 && strstr(g_out, "hidden_size=24"), "rc %d: %s", rc, g_out);

    T_CASE("run --model: errors after the layer is loaded");
    const char *m = dir_in("cli_errors_model");
    quantized_model(m, NVFP4MOE_CKPT_MODELOPT);
    rc = cli("run --model %s --device no-such-gpu", m);
    CHECK(rc == 1 && strstr(g_out, "--device") && strstr(g_out, "no-such-gpu"), "rc %d: %s", rc, g_out);
    rc = cli("run --model %s --top-k 9", m);
    CHECK(rc == 1 && strstr(g_out, "top_k=9"), "rc %d: %s", rc, g_out);
    rc = cli("run --model %s --input %s --device no-such-gpu", m, x);
    CHECK(rc == 1 && strstr(g_out, "no-such-gpu"), "rc %d: %s", rc, g_out);
    rc = cli("run --model %s --input %s/none.bin", m, d);
    CHECK(rc == 1 && strstr(g_out, "none.bin"), "rc %d: %s", rc, g_out);
}

// ---- C API misuse ----

/* Sizes whose products overflow 64 bits: SHAPE before a byte is touched (the buffers here are far
 * too small for the sizes claimed: a function that believed them would write out of bounds). */
static void test_codec_overflow(void) {
    T_CASE("codec sizes that overflow");
    float x[16] = {0};
    uint8_t packed[8], scales[4], lin[4], sw[4];
    const int64_t big = (int64_t)1 << 40;
    CHECK(nvfp4moe_swizzled_scales_size(big, big) == 0, "2^40 x 2^40 gave %zu", nvfp4moe_swizzled_scales_size(big, big));
    CHECK(nvfp4moe_swizzled_scales_size(INT64_MAX, 1) == 0, "INT64_MAX rows gave %zu",
          nvfp4moe_swizzled_scales_size(INT64_MAX, 1));
    CHECK(nvfp4moe_swizzled_scales_size(1, INT64_MAX) == 0, "INT64_MAX kblocks");
    CHECK(nvfp4moe_swizzled_scales_size(200, 5) == 256 * 8, "200 x 5: %zu", nvfp4moe_swizzled_scales_size(200, 5));
    CHECK_ERR(nvfp4moe_swizzle_scales(lin, big, big, sw), NVFP4MOE_ERR_SHAPE, "overflow");
    CHECK_ERR(nvfp4moe_unswizzle_scales(sw, INT64_MAX, 3, lin), NVFP4MOE_ERR_SHAPE, "overflow");
    CHECK_ERR(nvfp4moe_quantize(x, big, big, 1.0f, packed, scales), NVFP4MOE_ERR_SHAPE, "overflow");
    CHECK_ERR(nvfp4moe_dequantize(packed, scales, big, big, 1.0f, x), NVFP4MOE_ERR_SHAPE, "overflow");
    CHECK_ERR(nvfp4moe_quantize(x, INT64_MAX / 8, 16, 1.0f, packed, scales), NVFP4MOE_ERR_SHAPE, "overflow");
}

/* NULL where an object belongs, objects destroyed twice or given to the wrong free function, a
 * destroyed plan run again: a status (or nothing, for the void functions), never a crash or a
 * double free (tests/sanitize.sh checks the latter). */
static void test_api_misuse(void) {
    T_CASE("NULL arguments");
    nvfp4moe_config_init(NULL);
    nvfp4moe_config cfg = small_cfg();
    char buf[64] = "x";
    CHECK_ERR(nvfp4moe_config_validate(NULL), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
    CHECK(nvfp4moe_config_describe(NULL, buf, sizeof buf) == 0 && buf[0] == '\0', "describe(NULL)");
    CHECK(nvfp4moe_config_n1(NULL) == 0, "n1(NULL)");
    CHECK(!nvfp4moe_config_act_params(NULL).has_limit, "act_params(NULL)");
    nvfp4moe_to_float(NVFP4MOE_DTYPE_BF16, NULL, 4, NULL);
    nvfp4moe_from_float(NVFP4MOE_DTYPE_BF16, NULL, 4, NULL);
    nvfp4moe_fill_normal(NULL, NVFP4MOE_DTYPE_F32, 4, 1);
    CHECK_ERR(nvfp4moe_weights_validate(&cfg, NULL), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(nvfp4moe_layer_random(NULL, 1, &(nvfp4moe_layer *){NULL}), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(nvfp4moe_layer_random(&cfg, 1, NULL), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(nvfp4moe_layer_copy(&cfg, NULL, &(nvfp4moe_layer *){NULL}), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(nvfp4moe_reference_forward(&cfg, NULL, NULL), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(nvfp4moe_plan_create(&cfg, NULL, NULL, &(nvfp4moe_plan *){NULL}), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
    CHECK(nvfp4moe_plan_backend(NULL)[0] == '\0' && nvfp4moe_plan_report(NULL) == NULL &&
              nvfp4moe_plan_workspace_size(NULL, 4) == 0 && !nvfp4moe_plan_uses_device_memory(NULL),
          "plan accessors on NULL");
    CHECK(!strcmp(nvfp4moe_scheme_name(nvfp4moe_plan_effective_scheme(NULL)), "?"), "effective_scheme(NULL)");
    CHECK_ERR(nvfp4moe_device_detect(NULL), NVFP4MOE_ERR_INVALID_ARGUMENT, "");
    CHECK_ERR(nvfp4moe_device_parse(NULL, &(nvfp4moe_device){0}), NVFP4MOE_ERR_INVALID_ARGUMENT, "");
    CHECK_ERR(nvfp4moe_dtype_parse(NULL, &(nvfp4moe_dtype){0}), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(nvfp4moe_st_open(NULL, &(nvfp4moe_st_file *){NULL}), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
    CHECK(nvfp4moe_st_file_find(NULL, "x") == NULL && nvfp4moe_st_model_find(NULL, "x") == NULL &&
              nvfp4moe_st_file_count(NULL) == 0 && nvfp4moe_st_model_count(NULL) == 0,
          "safetensors accessors on NULL");
    CHECK_ERR(nvfp4moe_st_tensor_read(NULL, 0, 1, buf), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(nvfp4moe_st_writer_add(NULL, "x", NVFP4MOE_ST_U8, 0, NULL, buf), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(nvfp4moe_model_info_parse(NULL, NULL, "m", &(nvfp4moe_model_info *){NULL}), NVFP4MOE_ERR_INVALID_ARGUMENT,
              "NULL");
    CHECK(!nvfp4moe_model_info_is_moe_layer(NULL, 0) && !nvfp4moe_model_info_is_excluded(NULL, "x") &&
              nvfp4moe_model_info_excluded(NULL, 0) == NULL,
          "model_info accessors on NULL");
    CHECK_ERR(nvfp4moe_ckpt_layer_load(NULL, 0, &(nvfp4moe_ckpt_layer *){NULL}), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(nvfp4moe_ckpt_router_logits(NULL, NULL, 1, NULL), NVFP4MOE_ERR_INVALID_ARGUMENT, "");
    CHECK_ERR(nvfp4moe_float_layer_quantize(NULL, 16, 1, &(nvfp4moe_ckpt_layer *){NULL}), NVFP4MOE_ERR_INVALID_ARGUMENT,
              "NULL");
    CHECK_ERR(nvfp4moe_ckpt_add_layer(NULL, NVFP4MOE_CKPT_MODELOPT, "model.layers", 0, NULL, NULL),
              NVFP4MOE_ERR_INVALID_ARGUMENT, "");
    CHECK_ERR(nvfp4moe_model_config_write(NULL, &cfg, 1, 0, NVFP4MOE_CKPT_MODELOPT, NULL, NULL),
              NVFP4MOE_ERR_INVALID_ARGUMENT, "");
    CHECK_ERR(nvfp4moe_ep_partition_of(NULL, &(nvfp4moe_ep_partition){0}), NVFP4MOE_ERR_INVALID_ARGUMENT, "");
    // Every free function takes NULL.
    nvfp4moe_layer_free(NULL), nvfp4moe_plan_destroy(NULL), nvfp4moe_st_close(NULL), nvfp4moe_st_model_close(NULL);
    nvfp4moe_st_writer_free(NULL), nvfp4moe_model_info_free(NULL), nvfp4moe_ckpt_layer_free(NULL);
    nvfp4moe_float_layer_free(NULL), nvfp4moe_ep_dispatch_free(NULL), nvfp4moe_ep_loopback_free(NULL);
    nvfp4moe_ep_plan_destroy(NULL);

    T_CASE("destroyed twice, freed by the wrong function, run after destroy");
    cfg.num_experts = 2;
    cfg.top_k = 1;
    cfg.hidden_size = cfg.intermediate_size = 16;
    nvfp4moe_layer *layer = NULL;
    CHECK_OK(nvfp4moe_layer_random(&cfg, 3, &layer));
    nvfp4moe_plan *plan = NULL;
    nvfp4moe_device cpu;
    CHECK_OK(nvfp4moe_device_parse("cpu", &cpu));
    nvfp4moe_plan_options po = {.device = &cpu};
    if (layer) CHECK_OK(nvfp4moe_plan_create(&cfg, &layer->w, &po, &plan));
    nvfp4moe_plan_destroy((nvfp4moe_plan *)(void *)layer);   // not a plan: ignored
    nvfp4moe_layer_free((nvfp4moe_layer *)(void *)plan);     // not a layer: ignored
    float x[16] = {1}, logits[2] = {0.5f, -0.5f}, out[16];
    nvfp4moe_io io = {.num_tokens = 1, .hidden = x, .router_logits = logits, .output = out};
    if (plan) CHECK_OK(nvfp4moe_plan_forward(plan, &io, NULL));
    nvfp4moe_plan_destroy(plan);
    nvfp4moe_plan_destroy(plan);
    if (plan)
        CHECK_ERR(nvfp4moe_plan_forward(plan, &io, NULL), NVFP4MOE_ERR_INVALID_ARGUMENT, "not a live plan");
    nvfp4moe_layer_free(layer);
    nvfp4moe_layer_free(layer);

    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 4);
    if (q) nvfp4moe_layer_free(&q->layer);   // the embedded layer belongs to q: ignored
    nvfp4moe_ckpt_layer_free(q);
    nvfp4moe_ckpt_layer_free(q);
    nvfp4moe_float_layer *f = NULL;
    CHECK_OK(nvfp4moe_float_layer_random(&cfg, 1, &f));
    nvfp4moe_float_layer_free(f);
    nvfp4moe_float_layer_free(f);
    nvfp4moe_st_writer *w = NULL;
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    nvfp4moe_st_writer_free(w);
    nvfp4moe_st_writer_free(w);
    const char *d = dir_in("misuse");
    quantized_model(d, NVFP4MOE_CKPT_MODELOPT);
    nvfp4moe_model_info *info;
    nvfp4moe_st_model *m;
    open_model(d, &info, &m);
    nvfp4moe_st_close((nvfp4moe_st_file *)(void *)nvfp4moe_st_model_file(m, 0));   // owned by m: closed by m
    nvfp4moe_st_model_close(m);
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
    nvfp4moe_model_info_free(info);
    nvfp4moe_ep_loopback *lb = NULL;
    CHECK_OK(nvfp4moe_ep_loopback_create(2, &lb));
    nvfp4moe_ep_loopback_free(lb);
    nvfp4moe_ep_loopback_free(lb);
}

// ---- non-finite inputs ----

/* A token with a NaN or an infinity in its hidden state or its router logits gets an all-NaN row
 * and leaves every other row bit-identical, on both host backends, for several schemes, with a
 * clamping activation (a clamp can turn NaN into a number) and with the router weight on the
 * input. The NaN logit sits at the last expert: the one place a comparison-based top-k used to
 * skip it, leaving the row finite. */
static void test_nonfinite_inputs(void) {
    T_CASE("NaN and Inf in router logits and hidden states");
    static const struct {
        nvfp4moe_scheme scheme;
        bool limit, llama4;
    } k_cases[] = {{NVFP4MOE_SCHEME_W4A4, false, false},
                   {NVFP4MOE_SCHEME_W4A16, true, false},
                   {NVFP4MOE_SCHEME_W4A4_PER_TOKEN, true, false},
                   {NVFP4MOE_SCHEME_W4A4, false, true}};
    const char *backends[] = {"cpu_reference", "cpu_fast"};
    nvfp4moe_device cpu;
    CHECK_OK(nvfp4moe_device_parse("cpu", &cpu));
    for (size_t c = 0; c < sizeof k_cases / sizeof k_cases[0]; c++) {
        nvfp4moe_config cfg = small_cfg();
        cfg.scheme = k_cases[c].scheme;
        if (k_cases[c].limit) cfg.has_swiglu_limit = true, cfg.swiglu_limit = 0.5f;
        if (k_cases[c].llama4) {
            cfg.routing = NVFP4MOE_ROUTING_LLAMA4;
            cfg.top_k = 1;
            cfg.apply_router_weight_on_input = true;
        }
        nvfp4moe_layer *layer = NULL;
        CHECK_OK(nvfp4moe_layer_random(&cfg, 11 + c, &layer));
        if (!layer) continue;
        enum { M = 6 };
        const int64_t H = cfg.hidden_size, E = cfg.num_experts;
        float x[M * 64], logits[M * 4], want[M * 64], got[M * 64];
        for (int64_t i = 0; i < M * H; i++) x[i] = (float)((i * 37 % 101) - 50) / 50.0f;
        for (int64_t i = 0; i < M * E; i++) logits[i] = (float)((i * 13 % 17) - 8) / 4.0f;
        for (int b = 0; b < 2; b++) {
            nvfp4moe_plan *plan = NULL;
            nvfp4moe_plan_options po = {.backend = backends[b], .device = &cpu};
            CHECK_OK(nvfp4moe_plan_create(&cfg, &layer->w, &po, &plan));
            if (!plan) continue;
            nvfp4moe_io io = {.num_tokens = M, .hidden = x, .router_logits = logits, .output = want};
            CHECK_OK(nvfp4moe_plan_forward(plan, &io, NULL));
            float bx[M * 64], bl[M * 4];
            memcpy(bx, x, sizeof bx);
            memcpy(bl, logits, sizeof bl);
            bl[1 * E + E - 1] = NAN;      // token 1: a NaN logit at the last expert
            bx[3 * H + 5] = INFINITY;     // token 3: an infinite hidden value
            bl[4 * E + 0] = -INFINITY;    // token 4: an infinite logit
            bx[5 * H + H - 1] = NAN;      // token 5: a NaN hidden value
            io.hidden = bx;
            io.router_logits = bl;
            io.output = got;
            CHECK_OK(nvfp4moe_plan_forward(plan, &io, NULL));
            for (int64_t t = 0; t < M; t++) {
                const bool bad = t == 1 || t >= 3;
                int nan = 0, same = 0;
                for (int64_t n = 0; n < H; n++) {
                    nan += isnan(got[t * H + n]);
                    same += !memcmp(&got[t * H + n], &want[t * H + n], sizeof(float));
                }
                CHECK(bad ? nan == H : same == H, "%s, scheme %s%s%s, token %lld: %d of %lld NaN, %d unchanged",
                      backends[b], nvfp4moe_scheme_name(cfg.scheme), k_cases[c].limit ? ", clamped" : "",
                      k_cases[c].llama4 ? ", weight on input" : "", (long long)t, nan, (long long)H, same);
            }
            nvfp4moe_plan_destroy(plan);
        }
        int32_t ids[4];
        float wts[4], nl[4] = {1, NAN, 0, 0};
        CHECK_OK(nvfp4moe_route(&cfg, nl, 1, NULL, ids, wts));
        CHECK(isnan(wts[0]) && ids[0] == 0, "route: weight %g id %d", (double)wts[0], ids[0]);
        nvfp4moe_layer_free(layer);
    }
}

/* The same rule through host expert parallelism: two loopback ranks, each with its own tokens, one
 * bad token on each; their rows NaN, every other row as in a clean run. */
typedef struct {
    const nvfp4moe_config *cfg;
    const nvfp4moe_layer *layer;
    float x[2][3 * 64], logits[2][3 * 4], out[2][3 * 64];
} ep_world;

static nvfp4moe_status ep_rank(int32_t rank, const nvfp4moe_ep_transport *t, void *ctx) {
    ep_world *w = ctx;
    nvfp4moe_config cfg = *w->cfg;
    cfg.parallel.ep_rank = rank;
    nvfp4moe_device cpu;
    nvfp4moe_device_parse("cpu", &cpu);
    nvfp4moe_plan_options po = {.device = &cpu};
    nvfp4moe_ep_options eo = {.plan = &po, .local_backend = "cpu_fast"};
    nvfp4moe_ep_plan *p = NULL;
    nvfp4moe_status st = nvfp4moe_ep_plan_create(&cfg, &w->layer->w, t, &eo, &p);
    nvfp4moe_io io = {.num_tokens = 3, .hidden = w->x[rank], .router_logits = w->logits[rank], .output = w->out[rank]};
    if (st == NVFP4MOE_OK) st = nvfp4moe_ep_forward(p, &io, NULL);
    nvfp4moe_ep_plan_destroy(p);
    return st;
}

static void test_nonfinite_ep(void) {
    T_CASE("NaN and Inf through host expert parallelism");
    nvfp4moe_config cfg = small_cfg();
    cfg.parallel.ep_size = 2;
    nvfp4moe_config one = cfg;
    one.parallel.ep_size = 1;
    nvfp4moe_layer *layer = NULL;
    CHECK_OK(nvfp4moe_layer_random(&one, 31, &layer));
    nvfp4moe_ep_loopback *lb = NULL;
    CHECK_OK(nvfp4moe_ep_loopback_create(2, &lb));
    static ep_world clean, bad;
    if (!layer || !lb) return;
    clean.cfg = &cfg, clean.layer = layer;
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 3 * 64; i++) clean.x[r][i] = (float)(((i + 31 * r) * 29 % 61) - 30) / 30.0f;
        for (int i = 0; i < 12; i++) clean.logits[r][i] = (float)(((i + r) * 5 % 9) - 4) / 2.0f;
    }
    bad = clean;
    bad.logits[0][1 * 4 + 3] = NAN;   // rank 0, token 1
    bad.x[1][2 * 64 + 7] = INFINITY;  // rank 1, token 2
    CHECK_OK(nvfp4moe_ep_loopback_run(lb, ep_rank, &clean));
    CHECK_OK(nvfp4moe_ep_loopback_run(lb, ep_rank, &bad));
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 3; t++) {
            const bool poisoned = (r == 0 && t == 1) || (r == 1 && t == 2);
            int nan = 0, same = 0;
            for (int n = 0; n < 64; n++) {
                nan += isnan(bad.out[r][t * 64 + n]);
                same += !memcmp(&bad.out[r][t * 64 + n], &clean.out[r][t * 64 + n], sizeof(float));
            }
            CHECK(poisoned ? nan == 64 : same == 64, "rank %d token %d: %d NaN, %d unchanged", r, t, nan, same);
        }
    nvfp4moe_ep_loopback_free(lb);
    nvfp4moe_layer_free(layer);
}

// ---- threads ----

/* The thread-safety contract of the header: objects only read (a layer's weights, a model's info
 * and tensors) shared by every thread, one plan per thread, errors per thread. Each thread checks
 * its own results against the single-threaded ones; tests/sanitize.sh thread runs this under ThreadSanitizer. */
typedef struct {
    const nvfp4moe_config *cfg;
    const nvfp4moe_layer *layer;
    const nvfp4moe_model_info *info;
    const nvfp4moe_st_model *model;
    const float *x, *logits, *want;
    int index;
    int bad;          /* failures seen by this thread (CHECK is not thread-safe) */
} thread_job;

static void *thread_main(void *arg) {
    thread_job *j = arg;
    nvfp4moe_device cpu;
    nvfp4moe_device_parse("cpu", &cpu);
    nvfp4moe_plan_options po = {.backend = j->index % 2 ? "cpu_fast" : "cpu_reference", .device = &cpu};
    float out[4 * 64];
    for (int rep = 0; rep < 3; rep++) {
        nvfp4moe_plan *plan = NULL;
        j->bad += nvfp4moe_plan_create(j->cfg, &j->layer->w, &po, &plan) != NVFP4MOE_OK;
        nvfp4moe_io io = {.num_tokens = 4, .hidden = j->x, .router_logits = j->logits, .output = out};
        j->bad += !plan || nvfp4moe_plan_forward(plan, &io, NULL) != NVFP4MOE_OK ||
                  memcmp(out, j->want, sizeof out) != 0;
        nvfp4moe_plan_destroy(plan);
        nvfp4moe_ckpt_layer *l = NULL;
        j->bad += nvfp4moe_ckpt_layer_load_from(j->info, j->model, 0, rep == 1, &l) != NVFP4MOE_OK;
        nvfp4moe_ckpt_layer_free(l);
        j->bad += nvfp4moe_model_info_is_excluded(j->info, "model.layers.0.mlp.experts");
        // This thread's own error, whatever the others do meanwhile.
        char name[32];
        snprintf(name, sizeof name, "no-such-device-%d", j->index);
        nvfp4moe_device d;
        j->bad += nvfp4moe_device_parse(name, &d) != NVFP4MOE_ERR_NOT_FOUND || !strstr(nvfp4moe_last_error(), name);
    }
    return NULL;
}

static void test_threads(void) {
    T_CASE("objects shared between threads, a plan per thread");
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_layer *layer = NULL;
    CHECK_OK(nvfp4moe_layer_random(&cfg, 21, &layer));
    const char *d = dir_in("threads");
    quantized_model(d, NVFP4MOE_CKPT_MODELOPT);
    nvfp4moe_model_info *info;
    nvfp4moe_st_model *m;
    open_model(d, &info, &m);
    if (!layer || !info || !m) return;
    float x[4 * 64], logits[4 * 4], want[2][4 * 64];
    for (int i = 0; i < 4 * 64; i++) x[i] = (float)((i * 7 % 23) - 11) / 11.0f;
    for (int i = 0; i < 16; i++) logits[i] = (float)(i % 5) - 2.0f;
    nvfp4moe_device cpu;
    CHECK_OK(nvfp4moe_device_parse("cpu", &cpu));
    for (int b = 0; b < 2; b++) {   // each backend's own answer, on one thread
        nvfp4moe_plan_options po = {.backend = b ? "cpu_fast" : "cpu_reference", .device = &cpu};
        nvfp4moe_plan *plan = NULL;
        CHECK_OK(nvfp4moe_plan_create(&cfg, &layer->w, &po, &plan));
        nvfp4moe_io io = {.num_tokens = 4, .hidden = x, .router_logits = logits, .output = want[b]};
        if (plan) CHECK_OK(nvfp4moe_plan_forward(plan, &io, NULL));
        nvfp4moe_plan_destroy(plan);
    }
    enum { T = 4 };
    pthread_t th[T];
    thread_job jobs[T];
    for (int i = 0; i < T; i++) {
        jobs[i] = (thread_job){&cfg, layer, info, m, x, logits, want[i % 2], i, 0};
        CHECK(pthread_create(&th[i], NULL, thread_main, &jobs[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].bad == 0, "thread %d: %d failures", i, jobs[i].bad);
    }
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
    nvfp4moe_layer_free(layer);
}

// ---- quantize's output ----

/* The bytes of dir/name (NULL if unreadable); *n its size. */
static uint8_t *file_bytes(const char *dir, const char *name, size_t *n) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)size + 1);
    *n = b ? fread(b, 1, (size_t)size, f) : 0;
    fclose(f);
    return b;
}

/* dir/name holds exactly the bytes of want (n of them). */
static bool same_file(const char *dir, const char *name, const uint8_t *want, size_t n) {
    size_t m = 0;
    uint8_t *got = file_bytes(dir, name, &m);
    bool same = got && want && m == n && !memcmp(got, want, n);
    free(got);
    return same;
}

/* How many entries of dir hold `part` in their name. */
static int entries_named(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, part) != NULL;
    if (d) closedir(d);
    return n;
}

/* quantize writes --out as one transaction: never over or inside its source, never into a
 * non-empty directory unless --force (which replaces it whole), nothing left behind on failure. */
static void test_quantize_output(void) {
    if (!getenv("NVFP4MOE_CLI")) return;
    T_CASE("quantize --out: the source, stale files, failures");
    char q[512], src[512], stale[512], fresh[512], bad[512];   // dir_in's own buffers rotate
    snprintf(q, sizeof q, "%s", dir_in("qout"));
    snprintf(src, sizeof src, "%s", dir_in("qout/src"));
    int rc = cli("quantize --random --num-experts 4 --hidden-size 64 --intermediate-size 32 --out %s", src);
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    size_t nw = 0, nc = 0;
    uint8_t *w0 = file_bytes(src, "model.safetensors", &nw), *c0 = file_bytes(src, "config.json", &nc);
    rc = cli("quantize --in %s --out %s", src, src);
    CHECK(rc == 1 && strstr(g_out, "the source would be overwritten"), "rc %d: %s", rc, g_out);
    rc = cli("quantize --in %s --out %s/./", src, src);
    CHECK(rc == 1 && strstr(g_out, "the source would be overwritten"), "rc %d: %s", rc, g_out);
    rc = cli("quantize --in %s --out %s/sub/dir", src, src);
    CHECK(rc == 1 && strstr(g_out, "is inside --in"), "rc %d: %s", rc, g_out);
    CHECK(same_file(src, "model.safetensors", w0, nw) && same_file(src, "config.json", c0, nc),
          "the source changed");
    CHECK(entries_named(src, "nvfp4moe") == 0 && entries_named(src, "sub") == 0, "left something in the source");

    // An output directory holding an older sharded checkpoint: its index would win over the new file.
    snprintf(stale, sizeof stale, "%s", dir_in("qout/stale"));
    snprintf(fresh, sizeof fresh, "%s", dir_in("qout/fresh"));
    write_text(stale, "model.safetensors.index.json", "{\"metadata\": {}, \"weight_map\": {}}");
    write_text(stale, "model-00001-of-00002.safetensors", "old");
    rc = cli("quantize --in %s --out %s", src, stale);
    CHECK(rc == 1 && strstr(g_out, "is not empty") && strstr(g_out, "--force"), "rc %d: %s", rc, g_out);
    CHECK(entries_named(stale, "index.json") == 1, "--out changed although refused");
    rc = cli("quantize --in %s --out %s --force", src, stale);
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    rc = cli("quantize --in %s --out %s", src, fresh);   // an empty directory is fine
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    CHECK(entries_named(stale, "") == 5, "--force left other files (%d entries)", entries_named(stale, ""));
    size_t nf = 0;
    uint8_t *wf = file_bytes(fresh, "model.safetensors", &nf);
    CHECK(same_file(stale, "model.safetensors", wf, nf), "replaced output differs from a fresh one");
    free(wf);
    nvfp4moe_ckpt_layer *l = NULL;
    CHECK_OK(nvfp4moe_ckpt_layer_load(stale, 0, &l));
    nvfp4moe_ckpt_layer_free(l);
    rc = cli("quantize --in %s --out %s --force", src, q);
    CHECK(rc == 1 && strstr(g_out, "would delete the source"), "rc %d: %s", rc, g_out);
    rc = cli("quantize --random --out %s", stale);
    CHECK(rc == 1 && strstr(g_out, "is not empty"), "rc %d: %s", rc, g_out);
    rc = cli("quantize --in %s --out %s/model.safetensors --force", src, stale);
    CHECK(rc == 1 && strstr(g_out, "is not a directory"), "rc %d: %s", rc, g_out);

    // A source that fails half-way (a bias without its counterparts): no output, no temporary left.
    snprintf(bad, sizeof bad, "%s", dir_in("qout/bad"));
    static float bias[64];
    const edit add = {"model.layers.0.mlp.experts.3.down_proj.bias", 2, NVFP4MOE_ST_F32, 1, {64}, bias};
    rewrite(src, bad, &add, 1);
    rc = cli("quantize --in %s --out %s/never", bad, q);
    CHECK(rc == 1 && strstr(g_out, "bias"), "rc %d: %s", rc, g_out);
    CHECK(entries_named(q, "never") == 0 && entries_named(q, "nvfp4moe") == 0, "a failed quantize left files");
    rc = cli("quantize --in %s --out %s --force", bad, stale);
    CHECK(rc == 1, "rc %d: %s", rc, g_out);
    CHECK(same_file(stale, "model.safetensors", w0, 0) == false && entries_named(stale, "") == 5 &&
              entries_named(q, "nvfp4moe") == 0,
          "a failed --force changed --out");
    free(w0);
    free(c0);
}

int main(void) {
    fixtures_begin("nvfp4moe-hostile");
    test_dense_config();
    test_partial_biases();
    test_huge_sizes();
    test_pattern_semantics();
    test_hostile_patterns();
    test_codec_overflow();
    test_api_misuse();
    test_nonfinite_inputs();
    test_nonfinite_ep();
    test_threads();
    test_cli_errors();
    test_quantize_output();
    test_big_config();
    test_fifos();
    test_nan_values();
    test_truncated_while_open();
    fixtures_end();
    return t_finish("test_hostile");
}
