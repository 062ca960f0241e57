/*
 * test_moe_ref.c - the CPU reference layer: activations and routing against hand-computed values,
 * and the whole layer against an independent straightforward computation (written here, using only
 * the public codec) over a grid of shapes, activations, routings, schemes and dtypes.
 */
#include "harness.h"
#include "reference/reference.h"

static nvfp4moe_config small_cfg(int E, int K, int H, int I) {
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);
    c.num_experts = E;
    c.top_k = K;
    c.hidden_size = H;
    c.intermediate_size = I;
    return c;
}

/* 1e-7: alpha and the limits are float parameters (1.702f is not 1.702). */
#define NEAR(a, b) (fabs((a) - (b)) <= 1e-7 * (1.0 + fabs(b)))

static void test_activations(void) {
    nvfp4moe_config c = small_cfg(4, 1, 16, 16);
    double in[32], out[16];
    struct {
        nvfp4moe_activation act;
        bool limit;
        float L;
        double g, u, want;
    } cases[] = {
        {NVFP4MOE_ACT_SILU, false, 0, 1.0, 2.0, 1.4621171572600098},
        {NVFP4MOE_ACT_SILU, true, 7, 10.0, -9.0, -48.95535849147437},   /* gate from above, up both sides */
        {NVFP4MOE_ACT_SILU, true, 7, -10.0, 3.0, -10.0 / (1 + exp(10.0)) * 3.0}, /* no lower gate clamp */
        {NVFP4MOE_ACT_GELU, false, 0, 1.5, -2.0, -2.799578396193426},
        {NVFP4MOE_ACT_GELU_TANH, false, 0, -0.5, 3.0, -0.4628579705245682},
        {NVFP4MOE_ACT_RELU2, false, 0, 2.0, 0.5, 2.0},
        {NVFP4MOE_ACT_RELU2, false, 0, -1.0, 0.5, 0.0},
        {NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE, true, 7, 2.0, 3.0, 7.742634492576833}, /* alpha 1.702 beta 1 */
        {NVFP4MOE_ACT_SWIGLUSTEP, false, 0, 10.0, 9.0, 49.0},
        {NVFP4MOE_ACT_SITU, false, 0, 2.0, 30.0, 33.93236366537544},
        {NVFP4MOE_ACT_SILU_NO_MUL, false, 0, -2.0, 0, -0.2384058440442351},
        {NVFP4MOE_ACT_GELU_NO_MUL, false, 0, 0.7, 0, 0.5306254434438489},
        {NVFP4MOE_ACT_GELU_TANH_NO_MUL, false, 0, 0.7, 0, 0.5305701347051167},
        {NVFP4MOE_ACT_RELU2_NO_MUL, false, 0, -3.0, 0, 0.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        c.activation = cases[i].act;
        c.has_swiglu_limit = cases[i].limit;
        c.swiglu_limit = cases[i].L;
        c.swiglu_alpha = cases[i].act == NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE ? 1.702f : NAN;
        c.swiglu_beta = cases[i].act == NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE ? 1.0f : NAN;
        T_CASE(nvfp4moe_activation_name(cases[i].act));
        CHECK_OK(nvfp4moe_config_validate(&c));
        for (int j = 0; j < 32; j++) in[j] = j < 16 ? cases[i].g : cases[i].u;
        nvfp4moe_activation_ref(&c, in, out);
        CHECK(NEAR(out[0], cases[i].want) && NEAR(out[15], cases[i].want), "case %zu: got %.15g want %.15g", i,
              out[0], cases[i].want);
    }
    /* swigluoai reads interleaved rows [g0, u0, g1, u1, ...] and defaults to alpha 1.702, limit 7. */
    T_CASE("swigluoai interleaved");
    c.activation = NVFP4MOE_ACT_SWIGLUOAI;
    c.has_swiglu_limit = false;
    c.swiglu_alpha = c.swiglu_beta = NAN;
    for (int j = 0; j < 16; j++) {
        in[2 * j] = j == 0 ? 9.0 : -1.0;
        in[2 * j + 1] = j == 0 ? -8.0 : 2.0;
    }
    nvfp4moe_activation_ref(&c, in, out);
    CHECK(NEAR(out[0], -41.99971876981991), "g=9 u=-8: %.15g", out[0]);
    CHECK(NEAR(out[1], -0.4626127022015361), "g=-1 u=2: %.15g", out[1]);
}

static void test_routing(void) {
    int32_t ids[8];
    float w[8];
    const float l4[4] = {1, 3, 2, 0};
    struct {
        nvfp4moe_routing r;
        int k;
        int32_t id0, id1;
        double w0, w1;
    } cases[] = {
        {NVFP4MOE_ROUTING_SOFTMAX_TOPK, 2, 1, 2, 0.6439142598879724, 0.23688281808991016},
        {NVFP4MOE_ROUTING_RENORMALIZE, 2, 1, 2, 0.7310585786300048, 0.2689414213699951},
        {NVFP4MOE_ROUTING_RENORMALIZE_NAIVE, 2, 1, 2, 0.7310585786300048, 0.2689414213699951},
        {NVFP4MOE_ROUTING_SIGMOID, 2, 1, 2, 0.9525741268224334, 0.8807970779778823},
        {NVFP4MOE_ROUTING_SIGMOID_RENORM, 2, 1, 2, 0.5195751544086155, 0.48042484559138454},
        {NVFP4MOE_ROUTING_LLAMA4, 1, 1, -1, 0.9525741268224334, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nvfp4moe_config c = small_cfg(4, cases[i].k, 16, 16);
        c.routing = cases[i].r;
        T_CASE(nvfp4moe_routing_name(c.routing));
        CHECK_OK(nvfp4moe_route(&c, l4, 1, NULL, ids, w));
        CHECK(ids[0] == cases[i].id0 && (cases[i].k < 2 || ids[1] == cases[i].id1), "ids %d %d", ids[0], ids[1]);
        CHECK(fabs(w[0] - cases[i].w0) < 1e-6 && (cases[i].k < 2 || fabs(w[1] - cases[i].w1) < 1e-6),
              "weights %.9g %.9g want %.9g %.9g", (double)w[0], (double)w[1], cases[i].w0, cases[i].w1);
    }

    T_CASE("deepseek_v3 grouped, biased selection, unbiased weights");
    const float l8[8] = {0.5f, -1, 2, 1.5f, -0.5f, 0.3f, 1.0f, 0.9f};
    const float bias[8] = {0, 0.2f, 0, 0, 0.5f, 0, 0, 0.1f};
    nvfp4moe_config c = small_cfg(8, 2, 16, 16);
    c.routing = NVFP4MOE_ROUTING_DEEPSEEK_V3;
    c.n_group = 4;
    c.topk_group = 2;
    c.routed_scaling_factor = 2.5f;
    c.has_correction_bias = true;
    CHECK_OK(nvfp4moe_route(&c, l8, 1, bias, ids, w));
    /* groups (sum of top-2 biased scores): 1.09 1.70 1.45 1.54 -> keep groups 1 and 3 (experts 2,3,6,7) */
    CHECK(ids[0] == 2 && ids[1] == 3, "ids %d %d", ids[0], ids[1]);
    CHECK(fabs(w[0] - 1.296531780420009) < 1e-6 && fabs(w[1] - 1.2034682195799915) < 1e-6, "w %.9g %.9g",
          (double)w[0], (double)w[1]);

    T_CASE("minimax2");
    c.routing = NVFP4MOE_ROUTING_MINIMAX2;
    c.top_k = 3;
    c.routed_scaling_factor = 1.5f;
    CHECK_OK(nvfp4moe_route(&c, l8, 1, bias, ids, w));
    CHECK(ids[0] == 2 && ids[1] == 4 && ids[2] == 3, "ids %d %d %d", ids[0], ids[1], ids[2]);
    CHECK(fabs(w[0] - 0.636440983557967) < 1e-6 && fabs(w[1] - 0.2728010350972782) < 1e-6 &&
              fabs(w[2] - 0.5907579813447548) < 1e-6, "w %g %g %g", (double)w[0], (double)w[1], (double)w[2]);

    T_CASE("ties go to the lower expert");
    const float tie[6] = {0.5f, 2, 2, 1, 2, 0};
    c = small_cfg(6, 3, 16, 16);
    CHECK_OK(nvfp4moe_route(&c, tie, 1, NULL, ids, w));
    CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 4, "ids %d %d %d", ids[0], ids[1], ids[2]);

    T_CASE("simulated");
    c = small_cfg(16, 4, 16, 16);
    c.routing = NVFP4MOE_ROUTING_SIMULATED;
    int32_t a[4 * 50], b[4 * 50];
    float wa[4 * 50];
    CHECK_OK(nvfp4moe_route(&c, NULL, 50, NULL, a, wa));
    CHECK_OK(nvfp4moe_route(&c, NULL, 50, NULL, b, wa));
    CHECK(!memcmp(a, b, sizeof a), "deterministic in the seed");
    int distinct = 1;
    for (int t = 0; t < 50; t++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < i; j++) distinct &= a[t * 4 + i] != a[t * 4 + j];
    CHECK(distinct && wa[0] == 0.25f, "distinct experts, weight 1/k");
    c.seed = 99;
    CHECK_OK(nvfp4moe_route(&c, NULL, 50, NULL, b, wa));
    CHECK(memcmp(a, b, sizeof a) != 0, "another seed routes differently");

    T_CASE("routing errors");
    c = small_cfg(8, 2, 16, 16);
    CHECK_ERR(nvfp4moe_route(&c, NULL, 1, NULL, ids, w), NVFP4MOE_ERR_INVALID_ARGUMENT, "router logits are NULL");
    c.routing = NVFP4MOE_ROUTING_DEEPSEEK_V3;
    c.n_group = 4;
    c.topk_group = 2;
    c.has_correction_bias = true;
    CHECK_ERR(nvfp4moe_route(&c, l8, 1, NULL, ids, w), NVFP4MOE_ERR_INVALID_ARGUMENT, "correction_bias");
}

/* nvfp4moe_hot_expert_logits, the benchmarks' skewed routing: exactly the hot tokens, a seeded
 * subset, put expert 0 first under every method that ranks logits (grouped deepseek_v3 included,
 * and with saturated sigmoids, where expert 0 wins on ties); the others route as before. */
static void test_hot_logits(void) {
    enum { M = 200, E = 64, HOT = 150, KMAX = 8 };
    static float base[M * E], hot[M * E];
    static bool is_hot[M], again[M];
    static int32_t ids[M * KMAX], ids0[M * KMAX];
    static float w[M * KMAX];

    T_CASE("hot expert logits: the subset");
    nvfp4moe_fill_normal(base, NVFP4MOE_DTYPE_F32, M * E, 21);
    memcpy(hot, base, sizeof hot);
    CHECK(nvfp4moe_hot_expert_logits(hot, M, E, HOT, 5, is_hot) == HOT, "the count");
    int n = 0, past = 0, rows_kept = 1;
    for (int t = 0; t < M; t++) {
        n += is_hot[t];
        past += is_hot[t] && t >= HOT;
        /* a hot row changes in column 0 only, another row not at all */
        rows_kept &= !memcmp(hot + t * E + 1, base + t * E + 1, sizeof(float) * (E - 1)) &&
                     (is_hot[t] || hot[t * E] == base[t * E]);
        if (is_hot[t]) {
            float top = -INFINITY;
            for (int e = 1; e < E; e++) top = fmaxf(top, base[t * E + e]);
            rows_kept &= hot[t * E] == top + 1.0f;
        }
    }
    CHECK(n == HOT && rows_kept, "%d hot tokens, rows as documented: %d", n, rows_kept);
    CHECK(past > 0, "a random subset, not the first %d tokens", HOT);
    float tmp[M * E];
    memcpy(tmp, base, sizeof tmp);
    nvfp4moe_hot_expert_logits(tmp, M, E, HOT, 5, again);
    CHECK(!memcmp(is_hot, again, sizeof again) && !memcmp(tmp, hot, sizeof tmp), "deterministic in the seed");
    memcpy(tmp, base, sizeof tmp);
    nvfp4moe_hot_expert_logits(tmp, M, E, HOT, 6, again);
    CHECK(memcmp(is_hot, again, sizeof again) != 0, "another seed, another subset");
    memcpy(tmp, base, sizeof tmp);
    int all = 1;
    CHECK(nvfp4moe_hot_expert_logits(tmp, M, E, M + 7, 5, again) == M, "hot > M: every token");
    for (int t = 0; t < M; t++) all &= again[t];
    CHECK(all, "hot > M marks every token");
    memcpy(tmp, base, sizeof tmp);
    CHECK(nvfp4moe_hot_expert_logits(tmp, M, E, 0, 5, again) == 0 &&
              nvfp4moe_hot_expert_logits(tmp, M, E, -3, 5, NULL) == 0 && !memcmp(tmp, base, sizeof tmp),
          "hot <= 0: no token, the logits untouched");

    /* every method that ranks logits; deepseek_v3 with a group selection that bites (1 of 8) */
    static const struct { nvfp4moe_routing r; int k, groups, topk_group; } methods[] = {
        {NVFP4MOE_ROUTING_RENORMALIZE, 8, 1, 1},    {NVFP4MOE_ROUTING_SOFTMAX_TOPK, 8, 1, 1},
        {NVFP4MOE_ROUTING_RENORMALIZE_NAIVE, 6, 1, 1}, {NVFP4MOE_ROUTING_SIGMOID, 8, 1, 1},
        {NVFP4MOE_ROUTING_SIGMOID_RENORM, 2, 1, 1}, {NVFP4MOE_ROUTING_LLAMA4, 1, 1, 1},
        {NVFP4MOE_ROUTING_DEEPSEEK_V3, 8, 8, 4},    {NVFP4MOE_ROUTING_DEEPSEEK_V3, 6, 8, 1},
        {NVFP4MOE_ROUTING_MINIMAX2, 8, 1, 1},
    };
    /* logits of scale 1, then 40: sigmoid(x) is 1.0 in float64 from x = 37 on, so expert 0 then
     * ties with others in deepseek_v3 and minimax2 and must win on its lower index */
    for (int pass = 0; pass < 2; pass++) {
        const float scale = pass ? 40.0f : 1.0f;
        for (int i = 0; i < M * E; i++) tmp[i] = base[i] * scale;
        memcpy(hot, tmp, sizeof hot);
        nvfp4moe_hot_expert_logits(hot, M, E, HOT, 5, is_hot);
        for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++) {
            nvfp4moe_config c = small_cfg(E, methods[m].k, 16, 16);
            c.routing = methods[m].r;
            c.n_group = methods[m].groups;
            c.topk_group = methods[m].topk_group;
            char name[96];
            snprintf(name, sizeof name, "hot expert logits: %s top-%d%s, logits x%.0f", nvfp4moe_routing_name(c.routing),
                     c.top_k, c.n_group > 1 ? (c.topk_group == 1 ? ", 1 of 8 groups" : ", 4 of 8 groups") : "",
                     (double)scale);
            T_CASE(name);
            const int K = c.top_k;
            CHECK_OK(nvfp4moe_route(&c, tmp, M, NULL, ids0, w));
            CHECK_OK(nvfp4moe_route(&c, hot, M, NULL, ids, w));
            int hot_first = 0, was_first = 0, others_same = 1, others_without = 0;
            for (int t = 0; t < M; t++) {
                bool has0 = false;
                for (int j = 0; j < K; j++) has0 |= ids[t * K + j] == 0;
                if (is_hot[t]) {
                    hot_first += ids[t * K] == 0;
                    was_first += ids0[t * K] == 0;
                } else {
                    others_same &= !memcmp(ids + t * K, ids0 + t * K, sizeof(int32_t) * (size_t)K);
                    others_without += !has0;
                }
            }
            CHECK(hot_first == HOT, "expert 0 first for %d of %d hot tokens", hot_first, HOT);
            CHECK(was_first < HOT, "expert 0 was first already for %d hot tokens before", was_first);
            CHECK(others_same && others_without > 0,
                  "the other tokens route as before (%d), %d of %d without expert 0", others_same, others_without,
                  M - HOT);
        }
    }
}

// ---- an independent layer computation ----

/* Straightforward: dequantize with the public codec, loop over tokens and slots, float64 sums. */
static void independent_layer(const nvfp4moe_config *c, const nvfp4moe_weights *w, const float *x,
                              const int32_t *ids, const float *tw, int64_t M, double *out) {
    const int64_t E = c->num_experts, K = c->top_k, H = c->hidden_size, I = c->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(c);
    float *W1 = malloc(sizeof(float) * (size_t)(E * N1 * H)), *W2 = malloc(sizeof(float) * (size_t)(E * H * I));
    for (int64_t e = 0; e < E; e++) {
        nvfp4moe_dequantize(w->w13 + e * N1 * H / 2, w->w13_scale + e * N1 * H / 16, N1, H, w->w13_scale_2[e],
                            W1 + e * N1 * H);
        nvfp4moe_dequantize(w->w2 + e * H * I / 2, w->w2_scale + e * H * I / 16, H, I, w->w2_scale_2[e],
                            W2 + e * H * I);
    }
    float a1 = 0, a2 = 0;
    for (int64_t e = 0; e < E && c->scheme == NVFP4MOE_SCHEME_W4A4; e++) {
        a1 = fmaxf(a1, w->w13_input_scale[e]);
        a2 = fmaxf(a2, w->w2_input_scale[e]);
    }
    float *xq = malloc(sizeof(float) * (size_t)H), *hq = malloc(sizeof(float) * (size_t)I);
    uint8_t *pk = malloc((size_t)(H > I ? H : I)), *sf = malloc((size_t)(H > I ? H : I));
    double *h = malloc(sizeof(double) * (size_t)N1), *act = malloc(sizeof(double) * (size_t)I);
    for (int64_t t = 0; t < M; t++) {
        for (int64_t n = 0; n < H; n++) out[t * H + n] = 0;
        for (int64_t k = 0; k < H; k++) xq[k] = x[t * H + k];
        if (c->scheme == NVFP4MOE_SCHEME_W4A4) { /* quantize-dequantize with the public codec */
            nvfp4moe_quantize(xq, 1, H, 1.0f / a1, pk, sf);
            nvfp4moe_dequantize(pk, sf, 1, H, a1, xq);
        }
        for (int64_t j = 0; j < K; j++) {
            int64_t e = ids[t * K + j];
            for (int64_t n = 0; n < N1; n++) {
                double s = c->has_bias ? w->w13_bias[e * N1 + n] : 0;
                for (int64_t k = 0; k < H; k++) s += (double)xq[k] * W1[(e * N1 + n) * H + k];
                h[n] = s;
            }
            nvfp4moe_activation_ref(c, h, act);
            for (int64_t i = 0; i < I; i++) hq[i] = nvfp4moe_round_to_dtype(c->in_dtype, (float)act[i]);
            if (c->scheme == NVFP4MOE_SCHEME_W4A4) {
                nvfp4moe_quantize(hq, 1, I, 1.0f / a2, pk, sf);
                nvfp4moe_dequantize(pk, sf, 1, I, a2, hq);
            } else {
                for (int64_t i = 0; i < I; i++) hq[i] = (float)act[i];
            }
            for (int64_t n = 0; n < H; n++) {
                double s = c->has_bias ? w->w2_bias[e * H + n] : 0;
                for (int64_t i = 0; i < I; i++) s += (double)hq[i] * W2[(e * H + n) * I + i];
                out[t * H + n] += (c->apply_router_weight_on_input ? 1.0 : tw[t * K + j]) * s;
            }
        }
    }
    free(W1); free(W2); free(xq); free(hq); free(pk); free(sf); free(h); free(act);
}

static void layer_case(nvfp4moe_config c, int64_t M, uint64_t seed, double tol) {
    char name[256], desc[200];
    nvfp4moe_config_describe(&c, desc, sizeof desc);
    snprintf(name, sizeof name, "layer M=%lld %s%s", (long long)M, desc, c.has_bias ? " bias" : "");
    T_CASE(name);
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, seed, &l));
    if (!l) return;
    const int64_t E = c.num_experts, K = c.top_k, H = c.hidden_size;
    size_t isz = nvfp4moe_dtype_size(c.in_dtype), osz = nvfp4moe_dtype_size(c.out_dtype);
    void *hidden = malloc((size_t)(M * H) * isz), *out = malloc((size_t)(M * H) * osz + 1);
    float *logits = malloc(sizeof(float) * (size_t)(M * E)), *x = malloc(sizeof(float) * (size_t)(M * H));
    float *got = malloc(sizeof(float) * (size_t)(M * H)), *tw = malloc(sizeof(float) * (size_t)(M * K));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(M * K));
    double *want = malloc(sizeof(double) * (size_t)(M * H));
    nvfp4moe_fill_normal(hidden, c.in_dtype, M * H, seed + 1);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, M * E, seed + 2);
    memset(out, 0xFF, (size_t)(M * H) * osz); /* poison: NaN in every dtype */
    nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits, .output = out};
    CHECK_OK(nvfp4moe_reference_forward(&c, &l->w, &io));
    CHECK_OK(nvfp4moe_route(&c, logits, M, l->w.correction_bias, ids, tw));
    nvfp4moe_to_float(c.in_dtype, hidden, M * H, x);
    if (c.apply_router_weight_on_input)
        for (int64_t t = 0; t < M; t++)
            for (int64_t k = 0; k < H; k++) x[t * H + k] = nvfp4moe_round_to_dtype(c.in_dtype, x[t * H + k] * tw[t]);
    independent_layer(&c, &l->w, x, ids, tw, M, want);
    nvfp4moe_to_float(c.out_dtype, out, M * H, got);
    double floor_tol = c.out_dtype == NVFP4MOE_DTYPE_F32 ? 0 : c.out_dtype == NVFP4MOE_DTYPE_BF16 ? 4e-3 : 5e-4;
    check_rel_l2("output vs independent computation", got, want, (size_t)(M * H), tol + floor_tol);
    free(hidden); free(out); free(logits); free(x); free(got); free(tw); free(ids); free(want);
    nvfp4moe_layer_free(l);
}

static void test_layer(void) {
    /* Shapes: E in {8, 40, 256}, top_k in {1, 2, 6, 8}, H and I multiples of 16, not of 128. */
    const int shapes[][5] = {{8, 1, 48, 80, 5}, {8, 2, 144, 32, 7}, {40, 6, 80, 48, 9},
                             {256, 8, 48, 16, 11}, {40, 8, 16, 208, 3}, {256, 1, 32, 32, 13}};
    uint64_t seed = 100;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        nvfp4moe_config c = small_cfg(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
        c.out_dtype = NVFP4MOE_DTYPE_F32;
        c.scheme = NVFP4MOE_SCHEME_W4A16;
        layer_case(c, shapes[i][4], seed++, 1e-6);
        /* W4A4 compares two quantizer implementations whose roundings differ by an ulp: a rare
         * flipped FP4 code moves one element by a step. */
        c.scheme = NVFP4MOE_SCHEME_W4A4;
        layer_case(c, shapes[i][4], seed++, 2e-3);
    }
    for (int a = 0; a < NVFP4MOE_ACT_COUNT; a++) {
        nvfp4moe_config c = small_cfg(8, 2, 32, 48);
        c.out_dtype = NVFP4MOE_DTYPE_F32;
        c.scheme = NVFP4MOE_SCHEME_W4A16;
        c.activation = (nvfp4moe_activation)a;
        if (a == NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE || a == NVFP4MOE_ACT_SILU) {
            c.has_swiglu_limit = true;
            c.swiglu_limit = 1.5f; /* low enough to clamp often */
        }
        layer_case(c, 6, seed++, 1e-6);
    }
    for (int r = 0; r < NVFP4MOE_ROUTING_COUNT; r++) {
        nvfp4moe_config c = small_cfg(16, r == NVFP4MOE_ROUTING_LLAMA4 ? 1 : 4, 32, 32);
        c.out_dtype = NVFP4MOE_DTYPE_F32;
        c.scheme = NVFP4MOE_SCHEME_W4A16;
        c.routing = (nvfp4moe_routing)r;
        if (r == NVFP4MOE_ROUTING_DEEPSEEK_V3) {
            c.n_group = 4;
            c.topk_group = 2;
            c.routed_scaling_factor = 2.5f;
        }
        c.has_correction_bias = r == NVFP4MOE_ROUTING_DEEPSEEK_V3 || r == NVFP4MOE_ROUTING_MINIMAX2;
        c.apply_router_weight_on_input = r == NVFP4MOE_ROUTING_LLAMA4;
        layer_case(c, 9, seed++, 1e-6);
    }
    nvfp4moe_config c = small_cfg(8, 2, 32, 32);
    c.has_bias = true;
    c.out_dtype = NVFP4MOE_DTYPE_F32;
    c.scheme = NVFP4MOE_SCHEME_W4A16;
    layer_case(c, 5, seed++, 1e-6);
    c.has_bias = false;
    c.out_dtype = NVFP4MOE_DTYPE_BF16;
    layer_case(c, 5, seed++, 1e-6);
    c.in_dtype = c.out_dtype = NVFP4MOE_DTYPE_FP16;
    layer_case(c, 5, seed++, 1e-6);
    c.scheme = NVFP4MOE_SCHEME_W4A4;
    layer_case(c, 5, seed++, 2e-3);
}

static void test_schemes_and_errors(void) {
    /* Per-token and MXFP8 activations sit between W4A16 and W4A4 in error: both are close to the
     * unquantized-activation result, and differ from it. */
    nvfp4moe_config c = small_cfg(8, 2, 64, 64);
    c.out_dtype = NVFP4MOE_DTYPE_F32;
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, 7, &l));
    if (!l) return;
    enum { M = 4 };
    uint16_t hidden[M * 64];
    float logits[M * 8], o16[M * 64], o[M * 64];
    double ref[M * 64];
    nvfp4moe_fill_normal(hidden, NVFP4MOE_DTYPE_BF16, M * 64, 8);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, M * 8, 9);
    nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits, .output = o16};
    c.scheme = NVFP4MOE_SCHEME_W4A16;
    CHECK_OK(nvfp4moe_reference_forward(&c, &l->w, &io));
    for (int i = 0; i < M * 64; i++) ref[i] = o16[i];
    const nvfp4moe_scheme sch[] = {NVFP4MOE_SCHEME_W4A4_PER_TOKEN, NVFP4MOE_SCHEME_W4A8_MXFP8, NVFP4MOE_SCHEME_W4A4};
    const double lo[] = {1e-3, 1e-4, 1e-3}, hi[] = {0.25, 0.08, 0.25};
    for (int s = 0; s < 3; s++) {
        c.scheme = sch[s];
        T_CASE(nvfp4moe_scheme_name(c.scheme));
        io.output = o;
        CHECK_OK(nvfp4moe_reference_forward(&c, &l->w, &io));
        double num = 0, den = 0;
        for (int i = 0; i < M * 64; i++) {
            num += (o[i] - ref[i]) * (o[i] - ref[i]);
            den += ref[i] * ref[i];
        }
        double err = sqrt(num / den);
        CHECK(err > lo[s] && err < hi[s], "rel err vs w4a16 %.3g outside (%.g, %.g)", err, lo[s], hi[s]);
    }

    T_CASE("reference errors");
    c.scheme = NVFP4MOE_SCHEME_W4A4;
    io.output = o;
    io.num_tokens = -1;
    CHECK_ERR(nvfp4moe_reference_forward(&c, &l->w, &io), NVFP4MOE_ERR_SHAPE, "num_tokens=-1");
    io.num_tokens = M;
    io.hidden = NULL;
    CHECK_ERR(nvfp4moe_reference_forward(&c, &l->w, &io), NVFP4MOE_ERR_INVALID_ARGUMENT, "io.hidden");
    io.hidden = hidden;
    int32_t bad_ids[M * 2] = {0, 1, 2, 9};
    float tw[M * 2] = {0};
    io.topk_ids = bad_ids;
    io.topk_weights = tw;
    CHECK_ERR(nvfp4moe_reference_forward(&c, &l->w, &io), NVFP4MOE_ERR_INVALID_ARGUMENT, "io.topk_ids[1][1]=9");
    io.topk_ids = NULL;
    nvfp4moe_weights w = l->w;
    w.w2_input_scale = NULL;
    CHECK_ERR(nvfp4moe_reference_forward(&c, &w, &io), NVFP4MOE_ERR_INVALID_ARGUMENT, "w2_input_scale");
    c.scheme = NVFP4MOE_SCHEME_W4A16;
    CHECK_OK(nvfp4moe_reference_forward(&c, &w, &io)); /* W4A16 needs no input scales */
    uint8_t *sf = malloc(8 * 128 * 4);
    memcpy(sf, l->w.w13_scale, 8 * 128 * 4);
    sf[3 * 128 * 4 + 5 * 4 + 2] = 0x7F;
    w.w13_scale = sf;
    CHECK_ERR(nvfp4moe_reference_forward(&c, &w, &io), NVFP4MOE_ERR_INVALID_ARGUMENT, "w13_scale[expert 3][row 5][block 2] is NaN");
    free(sf);
    io.num_tokens = 0;
    CHECK_OK(nvfp4moe_reference_forward(&c, &l->w, &io));
    nvfp4moe_layer_free(l);
}

int main(void) {
    test_activations();
    test_routing();
    test_hot_logits();
    test_layer();
    test_schemes_and_errors();
    return t_finish("test_moe_ref");
}
