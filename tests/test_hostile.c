/*
 * test_hostile.c - hostile and careless input: model directories, config.json texts, files and
 * command lines made to break the readers. Each case must end in a status and a message naming the
 * file, the field or tensor and the value; nothing written to outputs, no crash, no hang, nothing
 * read out of bounds or leaked (tests/asan.sh runs this program under AddressSanitizer and
 * UndefinedBehaviorSanitizer). Every fixture is generated at test time.
 */
#include "ckpt_fixtures.h"

// ---- config.json ----

/* A quantized layer 0 of small_cfg's shape in dir (ModelOpt per-expert unless fmt says otherwise). */
static void quantized_model(const char *dir, nvfp4moe_ckpt_format fmt) {
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 5);
    if (q) save_layer(dir, fmt, q, 0);
    nvfp4moe_ckpt_layer_free(q);
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

int main(void) {
    fixtures_begin("nvfp4moe-hostile");
    test_dense_config();
    test_partial_biases();
    test_huge_sizes();
    fixtures_end();
    return t_finish("test_hostile");
}
