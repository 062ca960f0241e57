/*
 * fuzz_json.c - libFuzzer target: the JSON interface. The input is a select request, optionally
 * followed by a NUL byte and a JSON object of deployment keys. nvfp4moe_select_json must answer
 * the request or fail with a status and a message (and a response exactly when the oracle
 * decided); the object is then given as "deployment" and as "config" of plan requests over a
 * real small layer (E=4, H=64, I=32, f32), which must create a plan that runs two tokens, or fail
 * the same way. The weights' addresses are the harness's own: a request from the input never names
 * memory. `make fuzz` runs it with tests/fuzz/corpus/json and json.dict.
 */
#include "fuzz_util.h"

#include <jansson.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static nvfp4moe_layer *g_layer;

static json_t *tensor(const void *p, const char *dtype, int64_t a, int64_t b, int64_t c, int nd) {
    json_t *shape = json_array();
    json_array_append_new(shape, json_integer(a));
    if (nd > 1) json_array_append_new(shape, json_integer(b));
    if (nd > 2) json_array_append_new(shape, json_integer(c));
    return json_pack("{s:I, s:o, s:s, s:s}", "data", (json_int_t)(uintptr_t)p, "shape", shape, "dtype", dtype,
                     "device", "cpu");
}

static json_t *weights(void) {
    const nvfp4moe_weights *w = &g_layer->w;
    json_t *o = json_object();
    json_object_set_new(o, "w13", tensor(w->w13, "u8", 4, 64, 32, 3));
    json_object_set_new(o, "w13_scale", tensor(w->w13_scale, "f8_e4m3", 4, 64, 4, 3));
    json_object_set_new(o, "w13_scale_2", tensor(w->w13_scale_2, "f32", 4, 0, 0, 1));
    json_object_set_new(o, "w13_input_scale", tensor(w->w13_input_scale, "f32", 4, 0, 0, 1));
    json_object_set_new(o, "w2", tensor(w->w2, "u8", 4, 64, 16, 3));
    json_object_set_new(o, "w2_scale", tensor(w->w2_scale, "u8", 4, 64, 2, 3));
    json_object_set_new(o, "w2_scale_2", tensor(w->w2_scale_2, "f32", 4, 0, 0, 1));
    json_object_set_new(o, "w2_input_scale", tensor(w->w2_input_scale, "f32", 4, 0, 0, 1));
    return o;
}

/* A plan request with keys as "deployment" or as "config"; a plan that is made runs two tokens. */
static void plan_with(json_t *keys, const char *as) {
    json_t *req = json_pack("{s:s, s:{s:i, s:s}, s:o, s:i}", "device", "cpu", "deployment", "top_k", 2, "dtype", "f32",
                            "weights", weights(), "num_threads", 1);
    if (!strcmp(as, "config")) json_object_set(req, "config", keys);
    else json_object_update(json_object_get(req, "deployment"), keys);
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!text) return;
    nvfp4moe_plan *plan = NULL;
    char *resp = NULL;
    nvfp4moe_status s = nvfp4moe_plan_create_json(text, &plan, &resp);
    fuzz_check_failure(s);
    if ((s == NVFP4MOE_OK) != (plan != NULL)) abort();
    if (s == NVFP4MOE_OK) {
        json_t *r = json_loads(resp, 0, NULL);
        if (!r) abort();
        /* the plan's layer has the harness's shape, so these buffers are the right size */
        json_t *c = json_object_get(r, "config");
        const int64_t H = json_integer_value(json_object_get(c, "hidden_size"));
        const int64_t E = json_integer_value(json_object_get(c, "num_experts"));
        if (H != 64 || E != 4) abort();
        float x[2 * 64], logits[2 * 4], out[2 * 64];
        for (int i = 0; i < 2 * 64; i++) x[i] = (float)(i % 5) - 2.0f;
        for (int i = 0; i < 2 * 4; i++) logits[i] = (float)(i % 3);
        size_t ws = nvfp4moe_plan_workspace_size(plan, 2);
        void *wsb = ws ? malloc(ws) : NULL;
        /* in and out dtypes may be bf16/fp16 now: f32-sized buffers hold them */
        fuzz_check_failure(nvfp4moe_plan_run(plan, 2, x, logits, NULL, NULL, out, wsb, ws, NULL));
        free(wsb);
        json_decref(r);
    }
    nvfp4moe_json_free(resp);
    nvfp4moe_plan_destroy(plan);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_layer) {
        nvfp4moe_config cfg;
        nvfp4moe_config_init(&cfg);
        cfg.num_experts = 4, cfg.top_k = 2, cfg.hidden_size = 64, cfg.intermediate_size = 32;
        cfg.in_dtype = cfg.out_dtype = NVFP4MOE_DTYPE_F32;
        if (nvfp4moe_layer_random(&cfg, 1, &g_layer) != NVFP4MOE_OK) abort();
    }
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    const size_t first = strlen(text);

    char *resp = NULL;
    nvfp4moe_status s = nvfp4moe_select_json(text, &resp);
    fuzz_check_failure(s);
    /* a response exactly when the oracle decided: OK, or its ValueError / NotImplementedError */
    const bool decided = s == NVFP4MOE_OK || ((s == NVFP4MOE_ERR_NOT_FOUND || s == NVFP4MOE_ERR_UNSUPPORTED) && resp);
    if (resp && !decided) abort();
    if (resp) {
        json_t *r = json_loads(resp, 0, NULL);
        if (!r || !json_is_object(json_object_get(r, "report"))) abort();
        json_decref(r);
    }
    nvfp4moe_json_free(resp);

    if (first < size) {
        json_t *keys = json_loads(text + first + 1, JSON_DISABLE_EOF_CHECK, NULL);
        if (json_is_object(keys)) {
            plan_with(keys, "deployment");
            plan_with(keys, "config");
        }
        json_decref(keys);
    }
    free(text);
    return 0;
}
