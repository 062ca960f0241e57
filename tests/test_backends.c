/*
 * test_backends.c - every backend of the backend table that runs on this machine's CPU, through
 * the plan API, against the float64 reference, over a grid of shapes, activations, routings,
 * schemes and dtypes (the idea of ggml's test-backend-ops). A new host backend is covered by adding
 * its row; the GPU ones are tests/gpu_test.c's. Outputs are poisoned before each run; inputs are
 * fresh random data.
 */
#include "harness.h"
#include "oracle/oracle.h"

/* The table's rows whose implementation is in this build and runs on the host. */
static const char *k_backends[32];
static int n_backends;

static void find_backends(void) {
    char gpu[256] = "", none[512] = "";
    for (int i = 0; i < nvfp4moe_backend_count(); i++) {
        const char *name = nvfp4moe_backend_name(i);
        const nvfp4moe_backend_impl *impl = nvfp4moe_backend_impl_find(name);
        char *list = !impl ? none : gpu;
        if (impl && !impl->device_memory && n_backends < (int)(sizeof k_backends / sizeof k_backends[0]))
            k_backends[n_backends++] = name;
        else
            snprintf(list + strlen(list), (!impl ? sizeof none : sizeof gpu) - strlen(list), " %s", name);
    }
    printf("test_backends: host backends:");
    for (int b = 0; b < n_backends; b++) printf(" %s", k_backends[b]);
    printf("\ntest_backends: on a GPU (tests/gpu_test.c):%s\ntest_backends: no implementation in this build:%s\n",
           gpu[0] ? gpu : " none", none);
}

/* Runs cfg on backend with the given inputs; returns the output as float in got. */
static nvfp4moe_status run_backend(const char *backend, const nvfp4moe_config *cfg, const nvfp4moe_layer *l,
                                   const nvfp4moe_io *in, float *got) {
    return t_run_host(backend, cfg, &l->w, in, 0, got);
}

static void grid_case(nvfp4moe_config c, int64_t M, uint64_t seed, bool one_expert) {
    char desc[200], name[300];
    nvfp4moe_config_describe(&c, desc, sizeof desc);
    nvfp4moe_layer *l = NULL;
    if (nvfp4moe_layer_random(&c, seed, &l) != NVFP4MOE_OK) {
        snprintf(name, sizeof name, "M=%lld %s", (long long)M, desc);
        T_CASE(name);
        CHECK(0, "layer_random: %s", nvfp4moe_last_error());
        return;
    }
    const int64_t E = c.num_experts, K = c.top_k, H = c.hidden_size;
    void *hidden = malloc((size_t)(M * H) * nvfp4moe_dtype_size(c.in_dtype) + 1);
    float *logits = malloc(sizeof(float) * (size_t)(M * E) + 1), *ref = malloc(sizeof(float) * (size_t)(M * H) + 1);
    float *got = malloc(sizeof(float) * (size_t)(M * H) + 1), *tw = malloc(sizeof(float) * (size_t)(M * K) + 1);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(M * K) + 1);
    double *want = malloc(sizeof(double) * (size_t)(M * H) + 1);
    nvfp4moe_fill_normal(hidden, c.in_dtype, M * H, seed + 1);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, M * E, seed + 2);
    nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits};
    if (one_expert) { /* every token to expert E-1 (and then distinct others), precomputed top-k */
        for (int64_t t = 0; t < M; t++)
            for (int64_t j = 0; j < K; j++) {
                ids[t * K + j] = (int32_t)((E - 1 + j) % E);
                tw[t * K + j] = 1.0f / (float)(j + 1);
            }
        io.topk_ids = ids;
        io.topk_weights = tw;
    }
    /* The reference, computed into f32 so that only the backend's rounding is compared. */
    nvfp4moe_config cr = c;
    cr.out_dtype = NVFP4MOE_DTYPE_F32;
    io.output = ref;
    nvfp4moe_status st = nvfp4moe_reference_forward(&cr, &l->w, &io);
    for (int64_t i = 0; i < M * H; i++) want[i] = ref[i];
    const double out_round = c.out_dtype == NVFP4MOE_DTYPE_F32 ? 0 : c.out_dtype == NVFP4MOE_DTYPE_BF16 ? 4e-3 : 5e-4;
    /* float32 accumulation against float64; W4A4-style schemes re-quantize the intermediate, where an
     * ulp can flip an FP4 code now and then. */
    const double tol = (c.scheme == NVFP4MOE_SCHEME_W4A16 ? 2e-5 : 3e-3) + out_round;
    for (int b = 0; b < n_backends; b++) {
        snprintf(name, sizeof name, "%s M=%lld %s%s%s", k_backends[b], (long long)M, desc, c.has_bias ? " bias" : "",
                 one_expert ? " one-expert" : "");
        T_CASE(name);
        CHECK(st == NVFP4MOE_OK, "reference: %s", nvfp4moe_last_error());
        nvfp4moe_status sb = run_backend(k_backends[b], &c, l, &io, got);
        CHECK(sb == NVFP4MOE_OK, "%s", nvfp4moe_last_error());
        if (sb == NVFP4MOE_OK && M > 0) check_rel_l2("output vs reference", got, want, (size_t)(M * H), tol);
    }
    free(hidden); free(logits); free(ref); free(got); free(tw); free(ids); free(want);
    nvfp4moe_layer_free(l);
}

static nvfp4moe_config cfg_of(int E, int K, int H, int I) {
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);
    c.num_experts = E;
    c.top_k = K;
    c.hidden_size = H;
    c.intermediate_size = I;
    return c;
}

/* CPU_FAST's dot products run in a fixed order: a token's output does not depend on its batch. */
static void test_batch_invariance(void) {
    T_CASE("cpu_fast batch invariance");
    nvfp4moe_config c = cfg_of(16, 4, 64, 48);
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, 5, &l));
    if (!l) return;
    enum { M = 9 };
    uint16_t hidden[M * 64];
    float logits[M * 16], all[M * 64], one[64];
    nvfp4moe_fill_normal(hidden, NVFP4MOE_DTYPE_BF16, M * 64, 6);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, M * 16, 7);
    nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits};
    CHECK_OK(run_backend("cpu_fast", &c, l, &io, all));
    io.num_tokens = 1;
    io.hidden = hidden + 5 * 64;
    io.router_logits = logits + 5 * 16;
    CHECK_OK(run_backend("cpu_fast", &c, l, &io, one));
    CHECK(!memcmp(one, all + 5 * 64, sizeof one), "token 5 alone differs from token 5 in a batch of %d", M);
    nvfp4moe_layer_free(l);
}

/* A plan is one layer on one device: deployment features it cannot honour are refused, by name. */
static void test_plan_refusals(void) {
    T_CASE("plan refusals");
    nvfp4moe_config c = cfg_of(8, 2, 32, 32);
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, 3, &l));
    if (!l) return;
    nvfp4moe_device dev = t_cpu();
    nvfp4moe_plan_options po = {.device = &dev};
    nvfp4moe_plan *plan = NULL;
    c.lora = true;
    CHECK_ERR(nvfp4moe_plan_create(&c, &l->w, &po, &plan), NVFP4MOE_ERR_UNSUPPORTED, "lora is set");
    c.lora = false;
    c.parallel.ep_size = 2;
    CHECK_ERR(nvfp4moe_plan_create(&c, &l->w, &po, &plan), NVFP4MOE_ERR_UNSUPPORTED, "parallel.ep_size=2");
    c.parallel.ep_size = 1;
    po.backend = "marlin";   /* a GPU backend on the CPU: the oracle's reason comes back */
    CHECK_ERR(nvfp4moe_plan_create(&c, &l->w, &po, &plan), NVFP4MOE_ERR_UNSUPPORTED, "MARLIN");
    CHECK(plan == NULL, "no plan on failure");
    nvfp4moe_layer_free(l);
}

int main(void) {
    uint64_t seed = 1000;
    find_backends();
    T_CASE("the table has host backends");
    CHECK(n_backends >= 2, "%d host backends found", n_backends);
    test_plan_refusals();
    /* vLLM-like shapes, scaled down to stay fast on two cores; H and I not multiples of 128 too. */
    const int shapes[][5] = {{8, 2, 128, 64, 7},   {40, 6, 256, 128, 5}, {64, 1, 144, 80, 33},
                             {256, 8, 64, 32, 9},   {8, 8, 48, 208, 4},   {40, 2, 256, 96, 64}};
    const nvfp4moe_scheme schemes[] = {NVFP4MOE_SCHEME_W4A16, NVFP4MOE_SCHEME_W4A4};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (size_t s = 0; s < 2; s++) {
            nvfp4moe_config c = cfg_of(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
            c.scheme = schemes[s];
            grid_case(c, shapes[i][4], seed++, false);
        }
    for (int a = 0; a < NVFP4MOE_ACT_COUNT; a++)
        for (int lim = 0; lim < 2; lim++) {
            nvfp4moe_config c = cfg_of(8, 2, 64, 48);
            c.activation = (nvfp4moe_activation)a;
            bool clamps = a == NVFP4MOE_ACT_SILU || a == NVFP4MOE_ACT_SWIGLUOAI ||
                          a == NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE || a == NVFP4MOE_ACT_SWIGLUSTEP;
            if (lim && !clamps) continue;
            if (!lim && a == NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE) continue; /* requires a limit */
            c.has_swiglu_limit = lim;
            c.swiglu_limit = 1.25f;
            c.scheme = NVFP4MOE_SCHEME_W4A16;
            grid_case(c, 11, seed++, false);
        }
    for (int r = 0; r < NVFP4MOE_ROUTING_COUNT; r++) {
        nvfp4moe_config c = cfg_of(16, r == NVFP4MOE_ROUTING_LLAMA4 ? 1 : 4, 48, 32);
        c.routing = (nvfp4moe_routing)r;
        if (r == NVFP4MOE_ROUTING_DEEPSEEK_V3) {
            c.n_group = 4;
            c.topk_group = 2;
            c.routed_scaling_factor = 2.5f;
        }
        c.has_correction_bias = r == NVFP4MOE_ROUTING_DEEPSEEK_V3 || r == NVFP4MOE_ROUTING_MINIMAX2;
        c.apply_router_weight_on_input = r == NVFP4MOE_ROUTING_LLAMA4;
        grid_case(c, 10, seed++, false);
    }
    const nvfp4moe_scheme more[] = {NVFP4MOE_SCHEME_W4A4_PER_TOKEN, NVFP4MOE_SCHEME_W4A8_MXFP8};
    for (int s = 0; s < 2; s++) {
        nvfp4moe_config c = cfg_of(8, 2, 64, 64);
        c.scheme = more[s];
        grid_case(c, 6, seed++, false);
    }
    nvfp4moe_config c = cfg_of(8, 2, 64, 48);
    c.has_bias = true;
    grid_case(c, 6, seed++, false);
    c.has_bias = false;
    c.in_dtype = c.out_dtype = NVFP4MOE_DTYPE_FP16;
    grid_case(c, 6, seed++, false);
    c.in_dtype = c.out_dtype = NVFP4MOE_DTYPE_F32;
    grid_case(c, 6, seed++, false);
    c = cfg_of(40, 2, 64, 48);
    grid_case(c, 0, seed++, false);          /* empty batch */
    grid_case(c, 1, seed++, false);          /* one token: most experts get none */
    grid_case(c, 13, seed++, true);          /* all tokens to one expert */
    test_batch_invariance();
    return t_finish("test_backends");
}
