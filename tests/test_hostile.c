/*
 * test_hostile.c - hostile and careless input: model directories, config.json texts, files and
 * command lines made to break the readers. Each case must end in a status and a message naming the
 * file, the field or tensor and the value; nothing written to outputs, no crash, no hang, nothing
 * read out of bounds or leaked (tests/asan.sh runs this program under AddressSanitizer and
 * UndefinedBehaviorSanitizer). Every fixture is generated at test time.
 */
#include "ckpt_fixtures.h"

// ---- config.json ----

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

int main(void) {
    fixtures_begin("nvfp4moe-hostile");
    test_dense_config();
    fixtures_end();
    return t_finish("test_hostile");
}
