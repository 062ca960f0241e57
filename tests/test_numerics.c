/*
 * test_numerics.c - the distances docs/numerics.md quotes for the backends that run on the CPU,
 * measured and held to the bounds it states: CPU_FAST (W4A4 and W4A16) and EMULATION (the host
 * implementation of vLLM's path, which the GPU backend equals up to the last-bit differences
 * tests/gpu_emulation.c bounds) against the float64 reference, on scaled-down shapes of the GPU
 * test's grid; and the size of the activation quantization itself (the reference's W4A4 against
 * its W4A16), which puts them in proportion. Relative Frobenius distances over whole outputs; the
 * backends' outputs are bf16/fp16, the reference's float32, so bf16 output rounding (about
 * 2^-9 relative) is part of every figure.
 */
#include "harness.h"
#include "reference/reference.h"

typedef struct shape {
    int E, K, H, I, M;
    nvfp4moe_activation act;
    nvfp4moe_dtype dt;
} shape;

static double rel(const float *got, const float *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The reference (float32 output) of cfg under scheme s; the backend's output in got. */
static nvfp4moe_status reference(nvfp4moe_config c, nvfp4moe_scheme s, const nvfp4moe_weights *w, nvfp4moe_io io,
                                 float *out) {
    c.scheme = s;
    c.out_dtype = NVFP4MOE_DTYPE_F32;
    io.output = out;
    return nvfp4moe_reference_forward(&c, w, &io);
}

static nvfp4moe_status cpu_fast(nvfp4moe_config c, nvfp4moe_scheme s, const nvfp4moe_weights *w, nvfp4moe_io io,
                                void *out16) {
    c.scheme = s;
    nvfp4moe_device dev;
    nvfp4moe_device_parse("cpu", &dev);
    nvfp4moe_plan_options po = {.backend = "cpu_fast", .device = &dev};
    nvfp4moe_plan *plan = NULL;
    nvfp4moe_status st = nvfp4moe_plan_create(&c, w, &po, &plan);
    if (st != NVFP4MOE_OK) return st;
    io.output = out16;
    st = nvfp4moe_plan_forward(plan, &io, NULL);
    nvfp4moe_plan_destroy(plan);
    return st;
}

/* the bounds docs/numerics.md states */
#define BOUND_CPU_FAST_W4A16 4e-3
#define BOUND_CPU_FAST_W4A4 1e-2
#define BOUND_EMULATION 6e-2

static double g_max_fast16, g_max_fast4, g_max_emul, g_min_a4 = 1e9;

static void measure(shape s, uint64_t seed) {
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);
    c.num_experts = s.E;
    c.top_k = s.K;
    c.hidden_size = s.H;
    c.intermediate_size = s.I;
    c.activation = s.act;
    c.in_dtype = c.out_dtype = s.dt;
    char desc[200];
    nvfp4moe_config_describe(&c, desc, sizeof desc);
    T_CASE(desc);
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, seed, &l));
    if (!l) return;
    const int64_t M = s.M, H = s.H, n = M * H;
    uint16_t *hidden = malloc(2 * (size_t)n), *o16 = malloc(2 * (size_t)n);
    float *logits = malloc(sizeof(float) * (size_t)(M * s.E));
    float *r4 = malloc(sizeof(float) * (size_t)n), *r16 = malloc(sizeof(float) * (size_t)n);
    float *got = malloc(sizeof(float) * (size_t)n);
    nvfp4moe_fill_normal(hidden, s.dt, n, seed + 1);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, M * s.E, seed + 2);
    nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits};
    CHECK_OK(reference(c, NVFP4MOE_SCHEME_W4A4, &l->w, io, r4));
    CHECK_OK(reference(c, NVFP4MOE_SCHEME_W4A16, &l->w, io, r16));
    const double a4 = rel(r4, r16, n);

    CHECK_OK(cpu_fast(c, NVFP4MOE_SCHEME_W4A16, &l->w, io, o16));
    nvfp4moe_to_float(s.dt, o16, n, got);
    const double f16 = rel(got, r16, n);
    CHECK_OK(cpu_fast(c, NVFP4MOE_SCHEME_W4A4, &l->w, io, o16));
    nvfp4moe_to_float(s.dt, o16, n, got);
    const double f4 = rel(got, r4, n);
    io.output = o16;
    CHECK_OK(nvfp4moe_emulation_forward_host(&c, &l->w, &io));
    nvfp4moe_to_float(s.dt, o16, n, got);
    const double em = rel(got, r4, n);

    CHECK(f16 <= BOUND_CPU_FAST_W4A16, "CPU_FAST W4A16 vs reference %.3g > %.3g", f16, BOUND_CPU_FAST_W4A16);
    CHECK(f4 <= BOUND_CPU_FAST_W4A4, "CPU_FAST W4A4 vs reference %.3g > %.3g", f4, BOUND_CPU_FAST_W4A4);
    CHECK(em <= BOUND_EMULATION, "EMULATION vs reference %.3g > %.3g", em, BOUND_EMULATION);
    CHECK(3 * em < a4, "the activation quantization's own effect %.3g is three times or more EMULATION's distance %.3g",
          a4, em);
    printf("test_numerics: M=%-3lld %-60s CPU_FAST w4a16 %.2e  w4a4 %.2e  EMULATION %.2e  (W4A4 vs W4A16 %.3f)\n",
           (long long)M, desc, f16, f4, em, a4);
    g_max_fast16 = fmax(g_max_fast16, f16);
    g_max_fast4 = fmax(g_max_fast4, f4);
    g_max_emul = fmax(g_max_emul, em);
    g_min_a4 = fmin(g_min_a4, a4);
    free(hidden); free(o16); free(logits); free(r4); free(r16); free(got);
    nvfp4moe_layer_free(l);
}

int main(void) {
    const nvfp4moe_dtype bf = NVFP4MOE_DTYPE_BF16, fp = NVFP4MOE_DTYPE_FP16;
    /* the GPU grid's (n, k, e, top_k), scaled to two cores; activations and dtypes spread */
    const shape grid[] = {
        {8, 2, 256, 128, 16, NVFP4MOE_ACT_SILU, bf},       {40, 6, 256, 256, 8, NVFP4MOE_ACT_SILU, fp},
        {8, 1, 512, 256, 24, NVFP4MOE_ACT_GELU, bf},       {64, 8, 256, 128, 8, NVFP4MOE_ACT_SILU, bf},
        {16, 4, 256, 128, 32, NVFP4MOE_ACT_SWIGLUOAI, bf}, {8, 2, 512, 128, 16, NVFP4MOE_ACT_SITU, fp},
        {16, 3, 256, 128, 16, NVFP4MOE_ACT_RELU2_NO_MUL, bf}, {8, 8, 384, 192, 8, NVFP4MOE_ACT_GELU_TANH, fp},
    };
    for (size_t i = 0; i < sizeof grid / sizeof grid[0]; i++) measure(grid[i], 500 + 10 * i);
    printf("test_numerics: max over the grid: CPU_FAST w4a16 %.2e (bound %.0e), w4a4 %.2e (bound %.0e), "
           "EMULATION %.2e (bound %.0e); the W4A4 quantization itself >= %.3f\n",
           g_max_fast16, BOUND_CPU_FAST_W4A16, g_max_fast4, BOUND_CPU_FAST_W4A4, g_max_emul, BOUND_EMULATION, g_min_a4);
    return t_finish("test_numerics");
}
