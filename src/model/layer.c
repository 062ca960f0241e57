/*
 * layer.c - the owning layer container, including random layers quantized the ModelOpt way (the
 * built-in default of `nvfp4moe run`, the tests' data).
 */
#include "core/internal.h"
#include "reference/reference.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ---- the owning container ----

typedef struct layer_storage {
    uint8_t *w13, *w13_scale, *w2, *w2_scale;
    float *w13_scale_2, *w13_input_scale, *w2_scale_2, *w2_input_scale;
    float *w13_bias, *w2_bias, *correction_bias, *w13_up_scale_2;
} layer_storage;

void nvfp4moe_layer_free(nvfp4moe_layer *layer) {
    if (!nvfp4moe_handle_remove(layer, NVFP4MOE_HANDLE_LAYER)) return;   // NULL, freed already, or not ours
    layer_storage *s = layer->storage_;
    if (s) {
        free(s->w13); free(s->w13_scale); free(s->w2); free(s->w2_scale);
        free(s->w13_scale_2); free(s->w13_input_scale); free(s->w2_scale_2); free(s->w2_input_scale);
        free(s->w13_bias); free(s->w2_bias); free(s->correction_bias); free(s->w13_up_scale_2);
        free(s);
    }
    free(layer);
}

/* Allocates the tensors cfg needs (biases only when configured), zero-filled. */
static nvfp4moe_status layer_alloc(const nvfp4moe_config *cfg, nvfp4moe_layer **out) {
    const size_t E = (size_t)cfg->num_experts, H = (size_t)cfg->hidden_size, I = (size_t)cfg->intermediate_size;
    const size_t N1 = (size_t)nvfp4moe_config_n1(cfg);
    nvfp4moe_layer *l = calloc(1, sizeof *l);
    layer_storage *s = calloc(1, sizeof *s);
    if (!l || !s || nvfp4moe_handle_add(l, NVFP4MOE_HANDLE_LAYER) != NVFP4MOE_OK) {
        free(l); free(s);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "layer: out of memory");
    }
    l->cfg = *cfg;
    l->storage_ = s;
    s->w13 = calloc(E * N1 * H / 2, 1);
    s->w13_scale = calloc(E * N1 * H / 16, 1);
    s->w2 = calloc(E * H * I / 2, 1);
    s->w2_scale = calloc(E * H * I / 16, 1);
    s->w13_scale_2 = calloc(E, sizeof(float));
    s->w13_input_scale = calloc(E, sizeof(float));
    s->w2_scale_2 = calloc(E, sizeof(float));
    s->w2_input_scale = calloc(E, sizeof(float));
    bool ok = s->w13 && s->w13_scale && s->w2 && s->w2_scale && s->w13_scale_2 && s->w13_input_scale &&
              s->w2_scale_2 && s->w2_input_scale;
    if (cfg->has_bias) {
        s->w13_bias = calloc(E * N1, sizeof(float));
        s->w2_bias = calloc(E * H, sizeof(float));
        ok = ok && s->w13_bias && s->w2_bias;
    }
    if (cfg->has_correction_bias) ok = ok && (s->correction_bias = calloc(E, sizeof(float)));
    if (!ok) {
        nvfp4moe_layer_free(l);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "layer: out of memory for E=%zu H=%zu I=%zu", E, H, I);
    }
    l->w = (nvfp4moe_weights){
        .w13 = s->w13, .w13_scale = s->w13_scale, .w13_scale_2 = s->w13_scale_2,
        .w13_input_scale = s->w13_input_scale, .w2 = s->w2, .w2_scale = s->w2_scale,
        .w2_scale_2 = s->w2_scale_2, .w2_input_scale = s->w2_input_scale, .w13_bias = s->w13_bias,
        .w2_bias = s->w2_bias, .correction_bias = s->correction_bias,
    };
    *out = l;
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_layer_copy(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                    nvfp4moe_layer **out) {
    NVFP4MOE_RETURN_IF(!out, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_layer_copy: out is NULL");
    NVFP4MOE_TRY(nvfp4moe_weights_validate(cfg, w));
    nvfp4moe_layer *l;
    NVFP4MOE_TRY(layer_alloc(cfg, &l));
    const size_t E = (size_t)cfg->num_experts, H = (size_t)cfg->hidden_size, I = (size_t)cfg->intermediate_size;
    const size_t N1 = (size_t)nvfp4moe_config_n1(cfg);
    layer_storage *s = l->storage_;
    memcpy(s->w13, w->w13, E * N1 * H / 2);
    memcpy(s->w13_scale, w->w13_scale, E * N1 * H / 16);
    memcpy(s->w2, w->w2, E * H * I / 2);
    memcpy(s->w2_scale, w->w2_scale, E * H * I / 16);
    memcpy(s->w13_scale_2, w->w13_scale_2, E * sizeof(float));
    memcpy(s->w2_scale_2, w->w2_scale_2, E * sizeof(float));
    /* Input scales are optional outside W4A4: keep them when given. */
    if (w->w13_input_scale) memcpy(s->w13_input_scale, w->w13_input_scale, E * sizeof(float));
    else l->w.w13_input_scale = NULL;
    if (w->w2_input_scale) memcpy(s->w2_input_scale, w->w2_input_scale, E * sizeof(float));
    else l->w.w2_input_scale = NULL;
    if (cfg->has_bias) {
        memcpy(s->w13_bias, w->w13_bias, E * N1 * sizeof(float));
        memcpy(s->w2_bias, w->w2_bias, E * H * sizeof(float));
    }
    if (cfg->has_correction_bias) memcpy(s->correction_bias, w->correction_bias, E * sizeof(float));
    if (w->w13_up_scale_2) {   /* the up half's own global scale, when the weights have one */
        if (!(s->w13_up_scale_2 = malloc(E * sizeof(float)))) {
            nvfp4moe_layer_free(l);
            return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "layer: out of memory");
        }
        memcpy(s->w13_up_scale_2, w->w13_up_scale_2, E * sizeof(float));
        l->w.w13_up_scale_2 = s->w13_up_scale_2;
    }
    *out = l;
    return NVFP4MOE_OK;
}

// ---- random layers ----

typedef struct {
    nvfp4moe_layer *layer;
    uint64_t seed;
    int32_t next_expert;    /* shared work counter */
    pthread_mutex_t lock;
    nvfp4moe_status status;
    char message[512];      /* the failing worker's message (errors are per thread) */
} random_job;

/* Draws a bf16-rounded matrix of mean 0 and deviation std and quantizes it ModelOpt-style:
 * global_scale = 448*6/amax over the whole tensor, stored as scale_2 = 1/global_scale.
 * The values are approximately normal: the sum of four uniform 16-bit draws (Irwin-Hall), scaled
 * to unit variance, which costs one generator step per value instead of a log and a cosine (a
 * Qwen3-30B-sized layer has 600 M weights, and `make run` builds one). */
static nvfp4moe_status random_tensor(uint64_t *rng, int64_t rows, int64_t cols, double std, float *buf,
                                     uint8_t *packed, uint8_t *scales, float *scale_2) {
    float amax = 0.0f;
    const float k = (float)(std * sqrt(3.0) / 65536.0); /* 4 uniforms on [0,1): variance 1/3 */
    for (int64_t i = 0; i < rows * cols; i++) {
        uint64_t r = nvfp4moe_rand_u64(rng);
        int32_t sum = (int32_t)(r & 0xFFFF) + (int32_t)((r >> 16) & 0xFFFF) + (int32_t)((r >> 32) & 0xFFFF) +
                      (int32_t)(r >> 48) - 2 * 65536;
        buf[i] = nvfp4moe_bf16_to_float(nvfp4moe_bf16_from_float((float)sum * k));
        if (fabsf(buf[i]) > amax) amax = fabsf(buf[i]);
    }
    float gs = 448.0f * 6.0f / amax;
    *scale_2 = 1.0f / gs;
    return nvfp4moe_quantize(buf, rows, cols, gs, packed, scales);
}

static void *random_worker(void *arg) {
    random_job *job = arg;
    nvfp4moe_layer *l = job->layer;
    const nvfp4moe_config *c = &l->cfg;
    layer_storage *s = l->storage_;
    const int64_t H = c->hidden_size, I = c->intermediate_size, N1 = nvfp4moe_config_n1(c);
    float *buf = malloc(sizeof(float) * (size_t)NVFP4MOE_MAX(N1 * H, H * I));
    double *g = malloc(sizeof(double) * (size_t)N1), *a = malloc(sizeof(double) * (size_t)I);
    nvfp4moe_status st = (buf && g && a) ? NVFP4MOE_OK
                                          : nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "layer: out of memory");
    for (;;) {
        pthread_mutex_lock(&job->lock);
        int32_t e = job->status == NVFP4MOE_OK && st == NVFP4MOE_OK ? job->next_expert++ : c->num_experts;
        pthread_mutex_unlock(&job->lock);
        if (e >= c->num_experts) break;
        /* One generator per expert: the layer does not depend on the number of threads. */
        uint64_t rng = job->seed * 0x100000001B3ull + (uint64_t)e * 0x9E3779B97F4A7C15ull + 1;
        st = random_tensor(&rng, N1, H, 1.0 / sqrt((double)H), buf, s->w13 + e * N1 * H / 2,
                           s->w13_scale + e * N1 * H / 16, &s->w13_scale_2[e]);
        if (st == NVFP4MOE_OK)
            st = random_tensor(&rng, H, I, 1.0 / sqrt((double)I), buf, s->w2 + e * H * I / 2,
                               s->w2_scale + e * H * I / 16, &s->w2_scale_2[e]);
        if (st != NVFP4MOE_OK) break;
        /* Input scales, ModelOpt's amax / (448*6): GEMM1 sees unit-variance tokens; GEMM2 sees the
         * activation of unit-variance GEMM1 outputs (weights are N(0, 1/fan_in)). */
        float amax1 = 0.0f, amax2 = 0.0f;
        for (int r = 0; r < 16; r++) {
            for (int64_t k = 0; k < H; k++) amax1 = fmaxf(amax1, (float)fabs(nvfp4moe_rand_normal(&rng)));
            for (int64_t n = 0; n < N1; n++) g[n] = nvfp4moe_rand_normal(&rng);
            nvfp4moe_activation_ref(c, g, a);
            for (int64_t i = 0; i < I; i++) amax2 = fmaxf(amax2, (float)fabs(a[i]));
        }
        s->w13_input_scale[e] = amax1 / (448.0f * 6.0f);
        s->w2_input_scale[e] = (amax2 > 0 ? amax2 : 1.0f) / (448.0f * 6.0f);
        if (c->has_bias) {
            for (int64_t n = 0; n < N1; n++) s->w13_bias[e * N1 + n] = (float)(0.1 * nvfp4moe_rand_normal(&rng));
            for (int64_t n = 0; n < H; n++) s->w2_bias[e * H + n] = (float)(0.1 * nvfp4moe_rand_normal(&rng));
        }
        if (c->has_correction_bias) s->correction_bias[e] = (float)(0.05 * nvfp4moe_rand_uniform(&rng));
    }
    pthread_mutex_lock(&job->lock);
    if (st != NVFP4MOE_OK && job->status == NVFP4MOE_OK) {
        job->status = st;
        nvfp4moe_strlcpy(job->message, nvfp4moe_last_error(), sizeof job->message);
    }
    pthread_mutex_unlock(&job->lock);
    free(buf); free(g); free(a);
    return NULL;
}

nvfp4moe_status nvfp4moe_layer_random(const nvfp4moe_config *cfg, uint64_t seed, nvfp4moe_layer **out) {
    NVFP4MOE_RETURN_IF(!out, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_layer_random: out is NULL");
    NVFP4MOE_TRY(nvfp4moe_config_validate(cfg));
    nvfp4moe_layer *l;
    NVFP4MOE_TRY(layer_alloc(cfg, &l));
    random_job job = {.layer = l, .seed = seed, .next_expert = 0, .status = NVFP4MOE_OK};
    pthread_mutex_init(&job.lock, NULL);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = (int)NVFP4MOE_MIN(NVFP4MOE_MAX(ncpu, 1), 64);
    if (nthreads > cfg->num_experts) nthreads = cfg->num_experts;
    pthread_t th[64];
    int started = 0;
    for (int i = 1; i < nthreads; i++)
        if (pthread_create(&th[started], NULL, random_worker, &job) == 0) started++;
    random_worker(&job);   /* this thread works too, so no thread at all is also fine */
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&job.lock);
    if (job.status != NVFP4MOE_OK) {
        nvfp4moe_layer_free(l);
        return nvfp4moe_set_error(job.status, "%s", job.message);
    }
    *out = l;
    return NVFP4MOE_OK;
}
