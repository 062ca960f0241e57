/*
 * fuzz_checkpoint.c - libFuzzer target: the input is a model directory, a config.json text, a NUL
 * byte, then the bytes of its model.safetensors. Every MoE layer's check-only load, full load and
 * float (quantize) load must fail with a status and a message or succeed; a layer that loads is run
 * for two tokens on CPU_REFERENCE through a plan, which must accept it. Sizes come from the file, so
 * nothing here can allocate more than a small multiple of the input. `make fuzz` runs it with
 * tests/fuzz/corpus/checkpoint and checkpoint.dict.
 */
#include "fuzz_util.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void run_layer(const nvfp4moe_ckpt_layer *l) {
    nvfp4moe_device cpu;
    if (nvfp4moe_device_parse("cpu", &cpu) != NVFP4MOE_OK) abort();
    nvfp4moe_plan_options po = {.backend = "cpu_reference", .device = &cpu};
    nvfp4moe_plan *plan = NULL;
    nvfp4moe_status s = nvfp4moe_plan_create(&l->layer.cfg, &l->layer.w, &po, &plan);
    fuzz_check_failure(s);
    if (s != NVFP4MOE_OK) return;
    const nvfp4moe_config *c = &l->layer.cfg;
    const size_t H = (size_t)c->hidden_size, E = (size_t)c->num_experts;
    void *x = calloc(2 * H, nvfp4moe_dtype_size(c->in_dtype)), *out = calloc(2 * H, nvfp4moe_dtype_size(c->out_dtype));
    float *xf = calloc(2 * H, sizeof(float)), *logits = calloc(2 * E, sizeof(float));
    if (x && out && xf && logits) {
        for (size_t i = 0; i < 2 * H; i++) xf[i] = (float)(i % 7) - 3.0f;
        nvfp4moe_from_float(c->in_dtype, xf, (int64_t)(2 * H), x);
        if (l->router) fuzz_check_failure(nvfp4moe_ckpt_router_logits(l, xf, 2, logits));
        void *lg = calloc(2 * E, nvfp4moe_dtype_size(c->router_logits_dtype));
        if (lg) {
            nvfp4moe_from_float(c->router_logits_dtype, logits, (int64_t)(2 * E), lg);
            nvfp4moe_io io = {.num_tokens = 2, .hidden = x, .router_logits = lg, .output = out};
            fuzz_check_failure(nvfp4moe_plan_forward(plan, &io, NULL));
            free(lg);
        }
    }
    free(x), free(out), free(xf), free(logits);
    nvfp4moe_plan_destroy(plan);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    if (!nul) return 0;
    const char *dir = fuzz_dir();
    fuzz_write(dir, "config.json", data, (size_t)(nul - data));
    fuzz_write(dir, "model.safetensors", nul + 1, size - (size_t)(nul + 1 - data));
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_st_model *m = NULL;
    nvfp4moe_status s = nvfp4moe_model_info_read(dir, &info);
    fuzz_check_failure(s);
    if (s == NVFP4MOE_OK) fuzz_check_failure(s = nvfp4moe_st_model_open(dir, &m));
    for (int32_t L = 0, tried = 0; s == NVFP4MOE_OK && L < info->num_layers && tried < 2; L++) {
        if (!nvfp4moe_model_info_is_moe_layer(info, L)) continue;
        tried++;
        for (int check_only = 1; check_only >= 0; check_only--) {
            nvfp4moe_ckpt_layer *l = NULL;
            nvfp4moe_status ls = nvfp4moe_ckpt_layer_load_from(info, m, L, check_only, &l);
            fuzz_check_failure(ls);
            if (ls == NVFP4MOE_OK && !check_only) run_layer(l);
            nvfp4moe_ckpt_layer_free(l);
        }
        nvfp4moe_float_layer *f = NULL;
        fuzz_check_failure(nvfp4moe_float_layer_load(info, m, L, &f));
        nvfp4moe_float_layer_free(f);
    }
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
    return 0;
}
