/*
 * fuzz_config.c - libFuzzer target: the input is a config.json text, optionally followed by a NUL
 * byte and an hf_quant_config.json text. Parsing must fail with a status and a message or give a
 * model whose layers, exclusion patterns (matched against module names) and deployment config can
 * all be queried, validated, described and given to the oracle. `make fuzz` runs it with
 * tests/fuzz/corpus/config and config.dict.
 */
#include "fuzz_util.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    const size_t first = strlen(text);
    const char *hfq = first < size ? text + first + 1 : NULL;
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_status s = nvfp4moe_model_info_parse(text, hfq, "fuzz", &info);
    fuzz_check_failure(s);
    if (s == NVFP4MOE_OK) {
        int moe = 0;
        for (int32_t L = -1; L <= info->num_layers; L++) moe += nvfp4moe_model_info_is_moe_layer(info, L);
        if (moe != info->num_moe_layers) abort();
        static const char *const k_modules[] = {"model.layers.0.mlp.experts", "model.layers.3.mlp.gate",
                                                "lm_head", "model.layers.12.self_attn.q_proj", ""};
        for (int32_t i = 0; i <= info->num_excluded; i++) (void)nvfp4moe_model_info_excluded(info, i);
        for (size_t k = 0; k < sizeof k_modules / sizeof k_modules[0]; k++)
            (void)nvfp4moe_model_info_is_excluded(info, k_modules[k]);
        char desc[256];
        nvfp4moe_config_describe(&info->cfg, desc, sizeof desc);
        s = nvfp4moe_config_validate(&info->cfg);
        fuzz_check_failure(s);
        if (s == NVFP4MOE_OK) {
            static const char *const k_devices[] = {"cpu", "h200", "b200"};
            for (int d = 0; d < 3; d++) {
                nvfp4moe_device dev;
                nvfp4moe_report report;
                char out[8192];
                if (nvfp4moe_device_parse(k_devices[d], &dev) != NVFP4MOE_OK) abort();
                fuzz_check_failure(nvfp4moe_select(&info->cfg, &dev, NULL, &report));
                nvfp4moe_report_render(&report, out, sizeof out);
            }
        }
    }
    nvfp4moe_model_info_free(info);
    free(text);
    return 0;
}
