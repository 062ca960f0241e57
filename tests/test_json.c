/*
 * test_json.c - the JSON interface (nvfp4moe_select_json, nvfp4moe_plan_create_json,
 * nvfp4moe_ckpt_layer_load_json, nvfp4moe_report_json, nvfp4moe_plan_run): the same decisions and
 * outputs as the struct API, vLLM's keyword names mapped as vLLM maps them, and every bad request
 * refused with a message naming the key or tensor.
 */
#include "harness.h"
#include "ckpt_fixtures.h"

#include <jansson.h>
#include <stdarg.h>

/* A request built with printf formatting. */
static const char *req(const char *fmt, ...) {
    static char buf[8][16384];
    static int k;
    k = (k + 1) % 8;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf[k], sizeof buf[k], fmt, ap);
    va_end(ap);
    return buf[k];
}

/* Parses a response (NULL stays NULL). */
static json_t *parse(const char *text) {
    if (!text) return NULL;
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    CHECK(j != NULL, "response is not JSON: %s", e.text);
    return j;
}

/* The report of nvfp4moe_select on cfg as nvfp4moe_report_json prints it (malloc'd). */
static char *struct_report(const nvfp4moe_config *cfg, const char *device, const char *installed, bool vllm_only,
                           nvfp4moe_status *st) {
    nvfp4moe_device dev;
    nvfp4moe_oracle_options opt = {.vllm_only = vllm_only};
    if (installed) {
        opt.installed_set = true;
        CHECK_OK(nvfp4moe_oracle_libs_parse(installed, &opt.installed));
    }
    CHECK_OK(nvfp4moe_device_parse(device, &dev));
    static nvfp4moe_report r;
    *st = nvfp4moe_select(cfg, &dev, &opt, &r);
    char *s = NULL;
    CHECK_OK(nvfp4moe_report_json(&r, &s));
    return s;
}

/* select_json's "report", indented as nvfp4moe_report_json prints it (malloc'd), and its status. */
static char *json_report(const char *request, nvfp4moe_status *st, json_t **whole) {
    char *resp = NULL;
    *st = nvfp4moe_select_json(request, &resp);
    json_t *j = parse(resp);
    nvfp4moe_json_free(resp);
    char *s = j ? json_dumps(json_object_get(j, "report"), JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    if (whole) *whole = j;
    else json_decref(j);
    return s;
}

static void ep4_eplb(nvfp4moe_config *c) {
    c->parallel.tp_size = 4;
    c->parallel.ep_size = 4;
    c->parallel.eplb = true;
}
static void b12x(nvfp4moe_config *c) { snprintf(c->moe_backend, sizeof c->moe_backend, "b12x"); }
static void dp_ll(nvfp4moe_config *c) {
    c->parallel.tp_size = 2;
    c->parallel.dp_size = 2;
    c->parallel.ep_size = 4;
    snprintf(c->parallel.all2all, sizeof c->parallel.all2all, "deepep_low_latency");
}
static void gptoss(nvfp4moe_config *c) {
    c->activation = NVFP4MOE_ACT_SWIGLUOAI;
    c->has_swiglu_limit = true;
    c->swiglu_limit = 7.0;
    c->has_bias = true;
    c->top_k = 4;
    c->in_dtype = c->out_dtype = NVFP4MOE_DTYPE_FP16;
}

static void test_select_same_as_struct(void) {
    T_CASE("select_json == nvfp4moe_select");
    typedef struct {
        const char *request, *device, *installed;
        bool vllm_only;
        void (*edit)(nvfp4moe_config *);
        nvfp4moe_status status;
    } sel_case;
    static const sel_case cases[] = {
        {"{\"device\": \"h200\"}", "h200", NULL, false, NULL, NVFP4MOE_OK},
        {"{\"device\": \"h200\", \"vllm_only\": true}", "h200", NULL, true, NULL, NVFP4MOE_OK},
        {"{\"device\": \"b200\", \"installed\": \"all\", \"deployment\": {\"tensor_parallel_size\": 4, "
         "\"enable_expert_parallel\": true, \"enable_eplb\": true}}", "b200", "all", false, ep4_eplb, NVFP4MOE_OK},
        {"{\"device\": \"b200\", \"installed\": [\"flashinfer\", \"b12x\", \"humming\", \"cutlass\"], "
         "\"deployment\": {\"moe_backend\": \"b12x\"}}", "b200", "all", false, b12x, NVFP4MOE_ERR_UNSUPPORTED},
        {"{\"device\": \"h100\", \"installed\": \"flashinfer\", \"config\": {\"parallel_config\": "
         "{\"tensor_parallel_size\": 2, \"data_parallel_size\": 2, \"enable_expert_parallel\": true, "
         "\"all2all_backend\": \"deepep_low_latency\", \"worker_cls\": \"auto\"}, \"gpu_memory_utilization\": 0.9}}",
         "h100", "flashinfer", false, dp_ll, NVFP4MOE_ERR_UNSUPPORTED},
        {"{\"device\": \"b200\", \"installed\": \"all\", \"deployment\": {\"hidden_act\": \"swigluoai\", "
         "\"swiglu_limit\": 7.0, \"has_bias\": true, \"num_experts_per_tok\": 4, \"dtype\": \"torch.float16\"}}",
         "b200", "all", false, gptoss, NVFP4MOE_OK},
        {"{\"device\": \"cpu\", \"vllm_only\": true}", "cpu", NULL, true, NULL, NVFP4MOE_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nvfp4moe_config cfg;
        nvfp4moe_config_init(&cfg);
        if (cases[i].edit) cases[i].edit(&cfg);
        nvfp4moe_status s1, s2;
        char *want = struct_report(&cfg, cases[i].device, cases[i].installed, cases[i].vllm_only, &s1);
        char msg1[1024];
        snprintf(msg1, sizeof msg1, "%s", nvfp4moe_last_error());
        json_t *whole = NULL;
        char *got = json_report(cases[i].request, &s2, &whole);
        CHECK(s1 == cases[i].status && s2 == s1, "case %zu: status %d / %d, want %d (%s)", i, (int)s1, (int)s2,
              (int)cases[i].status, nvfp4moe_last_error());
        CHECK(want && got && !strcmp(want, got), "case %zu: the reports differ:\n%s\n---\n%s", i, want, got);
        if (s1 != NVFP4MOE_OK)
            CHECK(!strcmp(msg1, nvfp4moe_last_error()), "case %zu: last error '%s', want '%s'", i,
                  nvfp4moe_last_error(), msg1);
        json_t *st = json_object_get(whole, "status");
        CHECK(st && json_integer_value(st) == (json_int_t)s1, "case %zu: response status", i);
        /* the text is nvfp4moe_report_render's, the config the struct's */
        const char *text = json_string_value(json_object_get(whole, "text"));
        CHECK(text && strstr(text, "candidates, in priority order:"), "case %zu: text", i);
        json_t *c = json_object_get(whole, "config");
        CHECK(json_integer_value(json_object_get(c, "ep_size")) == cfg.parallel.ep_size &&
                  json_integer_value(json_object_get(c, "top_k")) == cfg.top_k &&
                  !strcmp(json_string_value(json_object_get(c, "in_dtype")), nvfp4moe_dtype_name(cfg.in_dtype)),
              "case %zu: config", i);
        json_decref(whole);
        free(want);
        free(got);
    }
}
/* The canonical config a response carries reads back to the same config. */
static void test_config_round_trip(void) {
    T_CASE("config round trip");
    const char *dep =
        "{\"num_experts\": 256, \"top_k\": 8, \"hidden_size\": 7168, \"intermediate_size\": 2048, \"dtype\": \"fp16\","
        " \"activation\": \"swigluoai_uninterleave\", \"swiglu_limit\": 7.123456789012345, \"swiglu_alpha\": 1.5,"
        " \"swiglu_beta\": 0.25, \"routing\": \"deepseek_v3\", \"n_group\": 8, \"topk_group\": 4,"
        " \"routed_scaling_factor\": 2.5, \"has_correction_bias\": true, \"router_logits_dtype\": \"bf16\","
        " \"scheme\": \"w4a4-per-token\", \"tp_size\": 2, \"dp_size\": 2, \"ep_size\": 4, \"ep_rank\": 3,"
        " \"all2all\": \"naive\", \"eplb\": true, \"has_bias\": true, \"lora\": true, \"batch_invariant\": true,"
        " \"requantization_source\": false, \"force_a16\": true, \"moe_backend\": \"marlin\", \"seed\": 123456789}";
    char *r1 = NULL, *r2 = NULL;
    nvfp4moe_status s = nvfp4moe_select_json(req("{\"device\": \"h200\", \"deployment\": %s}", dep), &r1);
    CHECK(r1 != NULL, "status %d: %s", (int)s, nvfp4moe_last_error());
    json_t *j1 = parse(r1);
    char *c1 = json_dumps(json_object_get(j1, "config"), JSON_COMPACT | JSON_PRESERVE_ORDER);
    s = nvfp4moe_select_json(req("{\"device\": \"h200\", \"deployment\": %s}", c1), &r2);
    json_t *j2 = parse(r2);
    char *c2 = j2 ? json_dumps(json_object_get(j2, "config"), JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    CHECK(c1 && c2 && !strcmp(c1, c2), "config changed on the way back:\n%s\n%s", c1, c2);
    json_t *c = json_object_get(j1, "config");
    CHECK(json_real_value(json_object_get(c, "swiglu_limit")) == 7.123456789012345, "swiglu_limit keeps every digit");
    CHECK(json_integer_value(json_object_get(c, "seed")) == 123456789, "seed");
    CHECK(!strcmp(json_string_value(json_object_get(c, "routing")), "deepseek_v3"), "routing");
    /* the same config as a struct gives the same report */
    nvfp4moe_config cfg;
    nvfp4moe_config_init(&cfg);
    cfg.num_experts = 256, cfg.top_k = 8, cfg.hidden_size = 7168, cfg.intermediate_size = 2048;
    cfg.in_dtype = cfg.out_dtype = NVFP4MOE_DTYPE_FP16;
    cfg.activation = NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE;
    cfg.has_swiglu_limit = true, cfg.swiglu_limit = 7.123456789012345, cfg.swiglu_alpha = 1.5f, cfg.swiglu_beta = 0.25f;
    cfg.routing = NVFP4MOE_ROUTING_DEEPSEEK_V3, cfg.n_group = 8, cfg.topk_group = 4, cfg.routed_scaling_factor = 2.5f;
    cfg.has_correction_bias = true, cfg.router_logits_dtype = NVFP4MOE_DTYPE_BF16;
    cfg.scheme = NVFP4MOE_SCHEME_W4A4_PER_TOKEN;
    cfg.parallel = (nvfp4moe_parallel){.tp_size = 2, .dp_size = 2, .ep_size = 4, .ep_rank = 3, .eplb = true};
    snprintf(cfg.parallel.all2all, sizeof cfg.parallel.all2all, "naive");
    cfg.has_bias = true, cfg.lora = true, cfg.batch_invariant = true, cfg.force_a16 = true, cfg.seed = 123456789;
    snprintf(cfg.moe_backend, sizeof cfg.moe_backend, "marlin");
    nvfp4moe_status s1;
    char *want = struct_report(&cfg, "h200", NULL, false, &s1);
    char *got = j1 ? json_dumps(json_object_get(j1, "report"), JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    CHECK(want && got && !strcmp(want, got), "report of the struct config differs:\n%s\n---\n%s", want, got);
    free(want), free(got), free(c1), free(c2);
    json_decref(j1), json_decref(j2);
    nvfp4moe_json_free(r1), nvfp4moe_json_free(r2);
}

/* A request that fails with st, no response, and a message containing needle. */
static void select_fails(const char *request, nvfp4moe_status st, const char *needle) {
    char *resp = (char *)"untouched";
    nvfp4moe_status s = nvfp4moe_select_json(request, &resp);
    CHECK(s == st && resp == NULL && strstr(nvfp4moe_last_error(), needle),
          "%s -> %s '%s' (response %s), want %s containing '%s'", request, nvfp4moe_status_str(s),
          nvfp4moe_last_error(), resp ? "set" : "NULL", nvfp4moe_status_str(st), needle);
    if (resp && strcmp(resp, "untouched")) nvfp4moe_json_free(resp);
}

static void test_bad_requests(void) {
    T_CASE("bad requests");
    const nvfp4moe_status INV = NVFP4MOE_ERR_INVALID_ARGUMENT;
    select_fails("{\"device\": ", INV, "not valid JSON");
    select_fails("[1, 2]", INV, "must be a JSON object");
    select_fails("{\"devices\": \"h200\"}", INV, "unknown request key 'devices'");
    select_fails("{\"deployment\": {\"tensor_paralel_size\": 2}}", INV, "deployment: unknown key 'tensor_paralel_size'");
    select_fails("{\"deployment\": {\"parallel_config\": {\"tensor_parallel_size\": \"2\"}}}", INV,
                 "deployment.parallel_config.tensor_parallel_size: expected an integer, got a string");
    select_fails("{\"deployment\": {\"enable_eplb\": 1}}", INV, "deployment.enable_eplb: expected true or false");
    select_fails("{\"deployment\": {\"top_k\": -1}}", INV, "deployment.top_k=-1");
    select_fails("{\"deployment\": {\"activation\": \"swish\"}}", INV, "deployment.activation: unknown activation 'swish'");
    select_fails("{\"deployment\": {\"dtype\": \"int8\"}}", INV, "deployment.dtype: unknown dtype 'int8'");
    select_fails("{\"deployment\": {\"hidden_size\": 100}}", INV, "hidden_size=100");
    select_fails("{\"deployment\": {\"tensor_parallel_size\": 2, \"enable_expert_parallel\": true, \"ep_size\": 4}}", INV,
                 "ep_size=4 does not match enable_expert_parallel=true with tensor_parallel_size=2");
    select_fails("{\"deployment\": {\"all2all_backend\": \"naive\"}}", INV, "needs expert parallelism");
    select_fails("{\"deployment\": {\"moe_backend\": \"0123456789012345678901234567890123456789\"}}", INV, "too long");
    select_fails("{\"device\": \"h900\"}", INV, "device");
    select_fails("{\"installed\": \"flashinfer,tensorrt\"}", INV, "unknown library 'tensorrt'");
    select_fails("{\"model\": \"/nonexistent/model\"}", NVFP4MOE_ERR_NOT_FOUND, "model");
    select_fails("{\"model\": \"/x\", \"hf_config\": {}}", INV, "both given");
    select_fails("{\"hf_config\": {\"hidden_size\": 1024, \"num_hidden_layers\": 2}}", INV, "has no MoE layers");
    select_fails("{\"hf_config\": {\"hidden_size\": 1024}}", NVFP4MOE_ERR_FORMAT, "num_hidden_layers");
    select_fails("{\"config\": 3}", INV, "config: expected an object");
    select_fails(NULL, INV, "request is NULL");
    CHECK(nvfp4moe_select_json("{}", NULL) == INV, "NULL response");

    /* leniency: the config object ignores keys it does not know, null leaves a key as it is */
    char *resp = NULL;
    CHECK_OK(nvfp4moe_select_json("{\"device\": \"h200\", \"config\": {\"max_model_len\": 4096, \"top_k\": 4, "
                                  "\"swiglu_limit\": 5.0, \"lora_config\": {\"max_loras\": 2}}, \"deployment\": "
                                  "{\"swiglu_limit\": null, \"top_k\": null, \"all2all_backend\": "
                                  "\"allgather_reducescatter\"}}", &resp));
    json_t *j = parse(resp);
    json_t *c = json_object_get(j, "config");
    CHECK(json_integer_value(json_object_get(c, "top_k")) == 4, "top_k from config, null kept it");
    CHECK(json_is_null(json_object_get(c, "swiglu_limit")), "swiglu_limit null unsets it");
    CHECK(json_is_true(json_object_get(c, "lora")), "lora_config object turns LoRA on");
    CHECK(!strcmp(json_string_value(json_object_get(c, "all2all")), ""), "vLLM's default all2all without EP is none");
    json_decref(j);
    nvfp4moe_json_free(resp);
    /* in_dtype is the output's dtype too, unless out_dtype is given (in either order) */
    static const struct {
        const char *dep, *in, *out;
    } dt[] = {{"{\"in_dtype\": \"fp16\"}", "fp16", "fp16"},
              {"{\"out_dtype\": \"bf16\", \"in_dtype\": \"fp16\"}", "fp16", "bf16"},
              {"{\"in_dtype\": \"torch.float32\", \"out_dtype\": \"bf16\"}", "f32", "bf16"},
              {"{\"dtype\": \"float16\"}", "fp16", "fp16"}};
    for (size_t i = 0; i < sizeof dt / sizeof dt[0]; i++) {
        resp = NULL;
        CHECK_OK(nvfp4moe_select_json(req("{\"device\": \"cpu\", \"deployment\": %s}", dt[i].dep), &resp));
        j = parse(resp);
        c = json_object_get(j, "config");
        CHECK(j && !strcmp(json_string_value(json_object_get(c, "in_dtype")), dt[i].in) &&
                  !strcmp(json_string_value(json_object_get(c, "out_dtype")), dt[i].out),
              "%s: in %s out %s", dt[i].dep, json_string_value(json_object_get(c, "in_dtype")),
              json_string_value(json_object_get(c, "out_dtype")));
        json_decref(j);
        nvfp4moe_json_free(resp);
    }
    /* the model config from a JSON object is config.json's */
    resp = NULL;
    CHECK_OK(nvfp4moe_select_json("{\"device\": \"h200\", \"hf_config\": {\"model_type\": \"qwen3_moe\", \"hidden_size\":"
                                  " 1024, \"num_experts\": 16, \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 256,"
                                  " \"num_hidden_layers\": 2, \"hidden_act\": \"silu\", \"norm_topk_prob\": true}}", &resp));
    j = parse(resp);
    c = json_object_get(j, "config");
    CHECK(json_integer_value(json_object_get(c, "num_experts")) == 16 &&
              json_integer_value(json_object_get(c, "hidden_size")) == 1024 &&
              json_integer_value(json_object_get(c, "intermediate_size")) == 256 &&
              json_integer_value(json_object_get(c, "top_k")) == 4, "hf_config's shape");
    json_decref(j);
    nvfp4moe_json_free(resp);
}

// ---- plans ----

static const char *tensor(const void *p, const char *dtype, const char *shape) {
    return req("{\"data\": %llu, \"dtype\": \"%s\", \"shape\": %s, \"device\": \"cpu\"}",
               (unsigned long long)(uintptr_t)p, dtype, shape);
}

/* The weights object of a host layer with E=4, H=64, I=32 (gated); which: tensors left out or
 * replaced by a spec "name=..." */
static const char *weights_json(const nvfp4moe_weights *w, const char *replace_name, const char *replace_with) {
    struct {
        const char *name;
        const void *p;
        const char *dtype, *shape;
    } t[] = {
        {"w13", w->w13, "u8", "[4, 64, 32]"},         {"w13_scale", w->w13_scale, "f8_e4m3", "[4, 64, 4]"},
        {"w13_scale_2", w->w13_scale_2, "f32", "[4]"}, {"w13_input_scale", w->w13_input_scale, "f32", "[4]"},
        {"w2", w->w2, "u8", "[4, 64, 16]"},           {"w2_scale", w->w2_scale, "u8", "[4, 64, 2]"},
        {"w2_scale_2", w->w2_scale_2, "f32", "[4]"},  {"w2_input_scale", w->w2_input_scale, "f32", "[4]"},
    };
    static char buf[8192];
    char with[1024] = "";
    if (replace_with) snprintf(with, sizeof with, "%s", replace_with);   /* tensor() below reuses req's buffers */
    size_t used = (size_t)snprintf(buf, sizeof buf, "{");
    int n = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        const char *v = tensor(t[i].p, t[i].dtype, t[i].shape);
        if (replace_name && !strcmp(replace_name, t[i].name)) {
            if (!replace_with) continue;
            v = with;
        }
        used += (size_t)snprintf(buf + used, sizeof buf - used, "%s\"%s\": %s", n++ ? ", " : "", t[i].name, v);
    }
    if (replace_name && !strncmp(replace_name, "+", 1))
        used += (size_t)snprintf(buf + used, sizeof buf - used, ", \"%s\": %s", replace_name + 1, with);
    snprintf(buf + used, sizeof buf - used, "}");
    return buf;
}

static void plan_fails(const char *request, nvfp4moe_status st, const char *needle) {
    nvfp4moe_plan *p = (nvfp4moe_plan *)1;
    char *resp = NULL;
    nvfp4moe_status s = nvfp4moe_plan_create_json(request, &p, &resp);
    CHECK(s == st && p == NULL && strstr(nvfp4moe_last_error(), needle), "-> %s '%s', want %s containing '%s'",
          nvfp4moe_status_str(s), nvfp4moe_last_error(), nvfp4moe_status_str(st), needle);
    nvfp4moe_json_free(resp);
}

static void test_plans(void) {
    T_CASE("plan_create_json");
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_layer *layer = NULL;
    CHECK_OK(nvfp4moe_layer_random(&cfg, 5, &layer));
    if (!layer) return;
    const nvfp4moe_weights *w = &layer->w;
    const int64_t M = 7;
    float x[7 * 64], logits[7 * 4], want[7 * 64], got[7 * 64];
    nvfp4moe_fill_normal(x, NVFP4MOE_DTYPE_F32, M * 64, 1);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, M * 4, 2);

    const char *backends[] = {"cpu_reference", "cpu_fast"};
    for (int b = 0; b < 2; b++) {
        nvfp4moe_device cpu;
        CHECK_OK(nvfp4moe_device_parse("cpu", &cpu));
        nvfp4moe_plan_options po = {.backend = backends[b], .device = &cpu};
        nvfp4moe_plan *ref = NULL, *p = NULL;
        CHECK_OK(nvfp4moe_plan_create(&cfg, w, &po, &ref));
        nvfp4moe_io io = {.num_tokens = M, .hidden = x, .router_logits = logits, .output = want};
        size_t ws = nvfp4moe_plan_workspace_size(ref, M);
        void *wsb = ws ? malloc(ws) : NULL;
        io.workspace = wsb, io.workspace_size = ws;
        CHECK_OK(nvfp4moe_plan_forward(ref, &io, NULL));
        /* the shape comes from the tensors; dtype and top_k are given */
        char *resp = NULL;
        CHECK_OK(nvfp4moe_plan_create_json(req("{\"device\": \"cpu\", \"deployment\": {\"num_experts_per_tok\": 2, "
                                               "\"dtype\": \"f32\", \"moe_backend\": \"%s\"}, \"weights\": %s}",
                                               backends[b], weights_json(w, NULL, NULL)), &p, &resp));
        json_t *j = parse(resp);
        CHECK(j && !strcmp(json_string_value(json_object_get(j, "backend")), nvfp4moe_plan_backend(ref)), "backend");
        CHECK(j && json_is_false(json_object_get(j, "device_memory")), "host plan");
        json_t *c = json_object_get(j, "config");
        CHECK(json_integer_value(json_object_get(c, "num_experts")) == 4 &&
                  json_integer_value(json_object_get(c, "hidden_size")) == 64 &&
                  json_integer_value(json_object_get(c, "intermediate_size")) == 32, "the shape from the tensors");
        CHECK(!strcmp(json_string_value(json_object_get(json_object_get(j, "report"), "backend")),
                      nvfp4moe_plan_backend(ref)), "report");
        json_decref(j);
        nvfp4moe_json_free(resp);
        memset(got, 0xFF, sizeof got);
        CHECK_OK(nvfp4moe_plan_run(p, M, x, logits, NULL, NULL, got, wsb, ws, NULL));
        CHECK(!memcmp(got, want, sizeof got), "%s: plan_run on the JSON plan differs from plan_forward", backends[b]);
        /* precomputed routing through plan_run */
        int32_t ids[7 * 2];
        float wts[7 * 2];
        CHECK_OK(nvfp4moe_route(&cfg, logits, M, NULL, ids, wts));
        memset(got, 0xFF, sizeof got);
        CHECK_OK(nvfp4moe_plan_run(p, M, x, NULL, ids, wts, got, wsb, ws, NULL));
        CHECK(!memcmp(got, want, sizeof got), "%s: topk_ids path differs", backends[b]);
        free(wsb);
        nvfp4moe_plan_destroy(p);
        nvfp4moe_plan_destroy(ref);
    }
    CHECK_ERR(nvfp4moe_plan_run(NULL, 1, x, logits, NULL, NULL, got, NULL, 0, NULL), NVFP4MOE_ERR_INVALID_ARGUMENT,
              "plan is NULL");

    const nvfp4moe_status INV = NVFP4MOE_ERR_INVALID_ARGUMENT;
    const char *base = "{\"device\": \"cpu\", \"deployment\": {\"top_k\": 2, \"dtype\": \"f32\"}, \"weights\": %s}";
    plan_fails(req(base, weights_json(w, "w13", tensor(w->w13, "u8", "[4, 48, 32]"))), INV,
               "weights.w13: shape [4, 48, 32], expected [4, 64, 32]");
    plan_fails(req(base, weights_json(w, "w2_scale", tensor(w->w2_scale, "f32", "[4, 64, 2]"))), INV,
               "weights.w2_scale: dtype f32, expected f8_e4m3 or u8");
    plan_fails(req(base, weights_json(w, "w2_scale_2", NULL)), INV, "weights.w2_scale_2 is missing");
    plan_fails(req(base, weights_json(w, "w13_input_scale", NULL)), INV, "weights.w13_input_scale is missing");
    plan_fails(req(base, weights_json(w, "+w13_bias", tensor(w->w13, "f32", "[4, 64]"))), INV,
               "weights.w2_bias is missing");
    plan_fails(req(base, weights_json(w, "+bias", tensor(w->w13, "f32", "[4]"))), INV, "unknown tensor 'bias'");
    plan_fails(req(base, weights_json(w, "w13", "{\"data\": 0, \"dtype\": \"u8\", \"shape\": [4, 64, 32]}")), INV,
               "weights.w13.data");
    plan_fails(req(base, weights_json(w, "w13", req("{\"data\": %llu, \"dtype\": \"u8\", \"shape\": [4, 64, 32], "
                                                    "\"device\": \"cuda:0\"}", (unsigned long long)(uintptr_t)w->w13))),
               INV, "memory");
    plan_fails(req(base, weights_json(w, "w13", req("{\"data\": %llu, \"dtype\": \"u8\", \"shape\": [4, 64, 32], "
                                                    "\"strides\": [1]}", (unsigned long long)(uintptr_t)w->w13))),
               INV, "unknown key 'strides'");
    plan_fails(req("{\"device\": \"cpu\", \"deployment\": {\"dtype\": \"f32\"}, \"weights\": %s}", weights_json(w, NULL, NULL)),
               INV, "top_k is not given");
    plan_fails(req("{\"device\": \"h200\", \"deployment\": {\"top_k\": 2, \"dtype\": \"f32\"}, \"weights\": %s}",
                   weights_json(w, NULL, NULL)), INV, "device 'h200'");
    plan_fails(req("{\"device\": \"cpu\", \"deployment\": {\"top_k\": 2, \"dtype\": \"f32\", \"hidden_size\": 128}, "
                   "\"weights\": %s}", weights_json(w, NULL, NULL)), INV, "weights.w13: shape [4, 64, 32], expected [4, 64, 64]");
    plan_fails(req("{\"device\": \"cpu\", \"deployment\": {\"top_k\": 2, \"dtype\": \"f32\", \"lora\": true}, "
                   "\"weights\": %s}", weights_json(w, NULL, NULL)), NVFP4MOE_ERR_UNSUPPORTED, "lora");
    plan_fails(req("{\"device\": \"cpu\", \"weights\": {}, \"num_threads\": 1}"), INV, "weights.w13 is missing");
    plan_fails("{\"device\": \"cpu\"}", INV, "weights: expected an object");
    /* an oracle exception comes back with its report */
    nvfp4moe_plan *p = NULL;
    char *resp = NULL;
    nvfp4moe_status s = nvfp4moe_plan_create_json(req("{\"device\": \"cpu\", \"vllm_only\": true, \"deployment\": "
                                                      "{\"top_k\": 2, \"dtype\": \"f32\"}, \"weights\": %s}",
                                                      weights_json(w, NULL, NULL)), &p, &resp);
    json_t *j = parse(resp);
    json_t *e = json_object_get(json_object_get(j, "report"), "error");
    CHECK(s == NVFP4MOE_ERR_UNSUPPORTED && !p && e && !strcmp(json_string_value(json_object_get(e, "kind")),
                                                              "NotImplementedError"),
          "vllm_only on the CPU: %s %s", nvfp4moe_status_str(s), nvfp4moe_last_error());
    CHECK(strstr(nvfp4moe_last_error(), "NotImplementedError: No NvFp4 MoE backend") != NULL, "%s", nvfp4moe_last_error());
    json_decref(j);
    nvfp4moe_json_free(resp);
    nvfp4moe_layer_free(layer);
}

// ---- checkpoint layers ----

static void test_checkpoints(void) {
    T_CASE("ckpt_layer_load_json");
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 3);
    if (!q) return;
    const char *dir = dir_in("model");
    save_layer(dir, NVFP4MOE_CKPT_MODELOPT, q, 1);   /* layer 1 of 2: layer 0 is dense */
    nvfp4moe_ckpt_layer_free(q);

    nvfp4moe_ckpt_layer *l = NULL;
    char *resp = NULL;
    CHECK_OK(nvfp4moe_ckpt_layer_load_json(req("{\"path\": \"%s\"}", dir), &l, &resp));
    json_t *j = parse(resp);
    CHECK(j && json_integer_value(json_object_get(j, "index")) == 1, "the first MoE layer is 1");
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "format")), "modelopt"), "format");
    json_t *t = json_object_get(j, "tensors");
    json_t *w13 = json_object_get(t, "w13");
    CHECK(w13 && json_integer_value(json_array_get(json_object_get(w13, "shape"), 1)) == 64 &&
              json_integer_value(json_object_get(w13, "data")) == (json_int_t)(uintptr_t)l->layer.w.w13,
          "w13 descriptor");
    CHECK(json_object_size(t) == 8, "8 tensors, got %zu", json_object_size(t));
    CHECK(!json_is_null(json_object_get(j, "router")), "router");

    /* the plan of the response's config and tensors == the plan of the struct layer */
    char *cfgs = json_dumps(json_object_get(j, "config"), JSON_COMPACT);
    char *ts = json_dumps(t, JSON_COMPACT);
    nvfp4moe_plan *p = NULL, *ref = NULL;
    char *presp = NULL;
    CHECK_OK(nvfp4moe_plan_create_json(req("{\"device\": \"cpu\", \"base\": %s, \"deployment\": {\"moe_backend\": "
                                           "\"cpu_fast\"}, \"weights\": %s}", cfgs, ts), &p, &presp));
    nvfp4moe_device cpu;
    CHECK_OK(nvfp4moe_device_parse("cpu", &cpu));
    nvfp4moe_plan_options po = {.backend = "cpu_fast", .device = &cpu};
    CHECK_OK(nvfp4moe_plan_create(&l->layer.cfg, &l->layer.w, &po, &ref));
    float x[3 * 64], logits[3 * 4], a[3 * 64], b[3 * 64];
    nvfp4moe_fill_normal(x, NVFP4MOE_DTYPE_F32, 3 * 64, 4);
    CHECK_OK(nvfp4moe_ckpt_router_logits(l, x, 3, logits));
    size_t ws = nvfp4moe_plan_workspace_size(ref, 3);
    void *wsb = ws ? malloc(ws) : NULL;
    /* the checkpoint's layer is bf16 (config.json's torch_dtype): x's bytes as bf16 rows, outputs too */
    CHECK(l->layer.cfg.in_dtype == NVFP4MOE_DTYPE_BF16, "bf16 layer");
    memset(a, 0xFF, sizeof a);
    memset(b, 0xFF, sizeof b);
    CHECK_OK(nvfp4moe_plan_run(p, 3, x, logits, NULL, NULL, a, wsb, ws, NULL));
    CHECK_OK(nvfp4moe_plan_run(ref, 3, x, logits, NULL, NULL, b, wsb, ws, NULL));
    CHECK(p && ref && !memcmp(a, b, sizeof a), "the JSON plan of the checkpoint differs");
    /* base is complete: a key that would change the weights' shapes is refused by the tensors */
    plan_fails(req("{\"device\": \"cpu\", \"base\": %s, \"deployment\": {\"activation\": \"relu2_no_mul\"}, "
                   "\"weights\": %s}", cfgs, ts), NVFP4MOE_ERR_INVALID_ARGUMENT, "weights.w13: shape [4, 64, 32], expected [4, 32, 32]");
    plan_fails(req("{\"base\": %s, \"model\": \"%s\", \"weights\": %s}", cfgs, dir, ts), NVFP4MOE_ERR_INVALID_ARGUMENT,
               "both given");
    free(wsb), free(cfgs), free(ts);
    nvfp4moe_plan_destroy(p);
    nvfp4moe_plan_destroy(ref);
    nvfp4moe_json_free(presp);
    json_decref(j);
    nvfp4moe_json_free(resp);
    nvfp4moe_ckpt_layer_free(l);

    nvfp4moe_ckpt_layer *none = (nvfp4moe_ckpt_layer *)1;
    resp = NULL;
    CHECK(nvfp4moe_ckpt_layer_load_json(req("{\"path\": \"%s\", \"layer\": 0}", dir), &none, &resp) != NVFP4MOE_OK &&
              none == NULL && resp == NULL, "layer 0 is dense: %s", nvfp4moe_last_error());
    CHECK_ERR(nvfp4moe_ckpt_layer_load_json("{\"layer\": 1}", &none, &resp), NVFP4MOE_ERR_INVALID_ARGUMENT, "path");
    CHECK_ERR(nvfp4moe_ckpt_layer_load_json(req("{\"path\": \"%s\", \"layer\": \"1\"}", dir), &none, &resp),
              NVFP4MOE_ERR_INVALID_ARGUMENT, "layer: expected");
    CHECK_ERR(nvfp4moe_ckpt_layer_load_json("{\"path\": \"/nonexistent/model\"}", &none, &resp), NVFP4MOE_ERR_NOT_FOUND,
              "/nonexistent/model");
}

/* A checkpoint whose gate and up halves have global scales of their own: the response lists
 * w13_up_scale_2, and the plan made from the response runs the layer the struct plan runs, which
 * is not the layer with the gate's scale on both halves. */
static void test_split_scales(void) {
    T_CASE("ckpt_layer_load_json + plan_create_json: gate and up global scales that differ");
    nvfp4moe_config cfg = small_cfg();
    nvfp4moe_ckpt_layer *q = make_quantized(&cfg, 9);
    if (!q) return;
    float up[4];
    for (int e = 0; e < 4; e++) up[e] = q->layer.w.w13_scale_2[e] * (float)(1 << (e + 1)) * 1.25f;  /* 2.5x .. 20x */
    q->layer.w.w13_up_scale_2 = up;
    const char *dir = dir_in("split");
    save_layer(dir, NVFP4MOE_CKPT_MODELOPT, q, 0);
    nvfp4moe_ckpt_layer_free(q);

    nvfp4moe_ckpt_layer *l = NULL;
    char *resp = NULL;
    CHECK_OK(nvfp4moe_ckpt_layer_load_json(req("{\"path\": \"%s\"}", dir), &l, &resp));
    json_t *j = parse(resp);
    json_t *t = json_object_get(j, "tensors"), *u = json_object_get(t, "w13_up_scale_2");
    CHECK(l && l->layer.w.w13_up_scale_2 && u &&
              json_integer_value(json_object_get(u, "data")) == (json_int_t)(uintptr_t)l->layer.w.w13_up_scale_2 &&
              json_integer_value(json_array_get(json_object_get(u, "shape"), 0)) == 4 &&
              !strcmp(json_string_value(json_object_get(u, "dtype")), "f32"),
          "w13_up_scale_2 descriptor: %s", resp ? resp : "(no response)");
    CHECK(json_object_size(t) == 9, "9 tensors, got %zu", json_object_size(t));
    if (!l || !u) {
        json_decref(j);
        nvfp4moe_json_free(resp);
        nvfp4moe_ckpt_layer_free(l);
        return;
    }
    char *cfgs = json_dumps(json_object_get(j, "config"), JSON_COMPACT);
    char *ts = json_dumps(t, JSON_COMPACT);
    nvfp4moe_plan *p = NULL, *ref = NULL, *gate_only = NULL;
    char *presp = NULL;
    CHECK_OK(nvfp4moe_plan_create_json(req("{\"device\": \"cpu\", \"base\": %s, \"deployment\": {\"moe_backend\": "
                                           "\"cpu_reference\"}, \"weights\": %s}", cfgs, ts), &p, &presp));
    nvfp4moe_device cpu;
    CHECK_OK(nvfp4moe_device_parse("cpu", &cpu));
    nvfp4moe_plan_options po = {.backend = "cpu_reference", .device = &cpu};
    CHECK_OK(nvfp4moe_plan_create(&l->layer.cfg, &l->layer.w, &po, &ref));
    nvfp4moe_weights g = l->layer.w;
    g.w13_up_scale_2 = NULL;
    CHECK_OK(nvfp4moe_plan_create(&l->layer.cfg, &g, &po, &gate_only));
    float x[3 * 64], logits[3 * 4], a[3 * 64], b[3 * 64], c[3 * 64];
    nvfp4moe_fill_normal(x, NVFP4MOE_DTYPE_F32, 3 * 64, 4);
    CHECK_OK(nvfp4moe_ckpt_router_logits(l, x, 3, logits));
    size_t ws = nvfp4moe_plan_workspace_size(ref, 3);
    void *wsb = ws ? malloc(ws) : NULL;
    memset(a, 0xFF, sizeof a);
    memset(b, 0xFF, sizeof b);
    memset(c, 0xFF, sizeof c);
    CHECK_OK(nvfp4moe_plan_run(p, 3, x, logits, NULL, NULL, a, wsb, ws, NULL));
    CHECK_OK(nvfp4moe_plan_run(ref, 3, x, logits, NULL, NULL, b, wsb, ws, NULL));
    CHECK_OK(nvfp4moe_plan_run(gate_only, 3, x, logits, NULL, NULL, c, wsb, ws, NULL));
    CHECK(p && ref && !memcmp(a, b, sizeof a), "the JSON plan of the checkpoint differs from the struct plan");
    CHECK(gate_only && memcmp(a, c, sizeof a), "the up scale made no difference");

    /* the up scale is checked like the others: its shape, and finite positive values */
    char bad[256];
    snprintf(bad, sizeof bad, "%s", tensor(l->layer.w.w13_up_scale_2, "f32", "[3]"));
    plan_fails(req("{\"device\": \"cpu\", \"base\": %s, \"weights\": %s}", cfgs,
                   weights_json(&l->layer.w, "+w13_up_scale_2", bad)),
               NVFP4MOE_ERR_INVALID_ARGUMENT, "weights.w13_up_scale_2: shape [3], expected [4] for this layer");
    float nan_up[4] = {up[0], up[1], NAN, up[3]};
    snprintf(bad, sizeof bad, "%s", tensor(nan_up, "f32", "[4]"));
    plan_fails(req("{\"device\": \"cpu\", \"base\": %s, \"weights\": %s}", cfgs,
                   weights_json(&l->layer.w, "+w13_up_scale_2", bad)),
               NVFP4MOE_ERR_INVALID_ARGUMENT, "w13_up_scale_2[expert 2]=nan");
    free(wsb), free(cfgs), free(ts);
    nvfp4moe_plan_destroy(p);
    nvfp4moe_plan_destroy(ref);
    nvfp4moe_plan_destroy(gate_only);
    nvfp4moe_json_free(presp);
    json_decref(j);
    nvfp4moe_json_free(resp);
    nvfp4moe_ckpt_layer_free(l);
}

int main(void) {
    fixtures_begin("test_json");
    test_select_same_as_struct();
    test_config_round_trip();
    test_bad_requests();
    test_plans();
    test_checkpoints();
    test_split_scales();
    fixtures_end();
    return t_finish("test_json");
}
