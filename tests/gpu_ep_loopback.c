/*
 * gpu_ep_loopback.c - the GPU path of expert parallelism on ONE GPU: N ranks as threads of this
 * process over the loopback transport, each with its own EP plan whose local experts run on a
 * device plan on the same GPU, against the single-GPU plan's output on the same layer and tokens.
 *
 * What it covers that test_ep (CPU backends) and gpu_ep (NCCL, >= 2 GPUs) do not: the host-staged
 * device path of nvfp4moe_ep_forward (rows copied to the GPU, the local device plan, outputs back
 * in out_dtype, the float32 combine), with the oracle's own local backend in the standard format
 * (HOPPER_WGMMA on sm_90 since that backend's oracle row; MARLIN before), and MARLIN forced in the
 * batched format (the oracle has no batched NVFP4 kernel for sm_90 here), as gpu_ep.c does. What it
 * does not cover: NCCL, and several GPUs.
 *
 * Cases, for N = 2, 4 and 8 ranks:
 *   - standard format, router logits, a different number of tokens on every rank;
 *   - uneven routing (given ids): ~7/8 of the pairs to rank 0's experts, none to the last rank's;
 *   - rank 1 has no tokens;
 *   - batched format (deepep_low_latency, dp 2), local MARLIN.
 * Tolerance as gpu_ep: the single-GPU plan sums a token's slots inside its kernels, while under EP
 * each expert's output comes back rounded to bf16 and the combine sums in float32: relative L2
 * error <= 1e-2. The reference runs first, on the main thread (it also loads the kernels before
 * the rank threads start). Without a GPU it prints SKIP and exits 0 (it is not part of make test).
 */
#include "harness.h"
#include "nvfp4moe.h"

#include <cuda_runtime_api.h>

#define MAX_RANKS 8

typedef struct {
    nvfp4moe_config cfg;               /* global; parallel.ep_size set, ep_rank per thread */
    const nvfp4moe_weights *w;
    nvfp4moe_device dev;
    const char *local_backend;         /* NULL: the oracle's pick */
    int64_t max_tokens;
    int64_t m[MAX_RANKS];
    void *hidden[MAX_RANKS];
    float *logits[MAX_RANKS];
    int32_t *ids[MAX_RANKS];
    float *wts[MAX_RANKS];
    uint16_t *out[MAX_RANKS];
    nvfp4moe_ep_stats stats[MAX_RANKS];
    char local[MAX_RANKS][40], oracle[MAX_RANKS][40];
    nvfp4moe_status st[MAX_RANKS];
    char msg[MAX_RANKS][512];
} world;

/* The single-GPU plan on host tensors: copies in, runs, copies the output back. */
static nvfp4moe_status single_gpu(nvfp4moe_plan *plan, const nvfp4moe_config *c, int64_t M, const void *hidden,
                                  const float *logits, const int32_t *ids, const float *wts, void *out) {
    const int64_t H = c->hidden_size, E = c->num_experts, K = c->top_k;
    const size_t hb = (size_t)(M * H) * nvfp4moe_dtype_size(c->in_dtype), ob = (size_t)(M * H) * nvfp4moe_dtype_size(c->out_dtype);
    const size_t ws = nvfp4moe_plan_workspace_size(plan, M);
    void *dh = NULL, *dl = NULL, *di = NULL, *dw = NULL, *dout = NULL, *dws = NULL;
    nvfp4moe_status st = NVFP4MOE_ERR_CUDA;
    if (M == 0) return NVFP4MOE_OK;
    if (cudaMalloc(&dh, hb) || cudaMalloc(&dout, ob) || (ws && cudaMalloc(&dws, ws)) ||
        cudaMemcpy(dh, hidden, hb, cudaMemcpyHostToDevice))
        goto out;
    if (logits && (cudaMalloc(&dl, sizeof(float) * (size_t)(M * E)) ||
                   cudaMemcpy(dl, logits, sizeof(float) * (size_t)(M * E), cudaMemcpyHostToDevice)))
        goto out;
    if (ids && (cudaMalloc(&di, sizeof(int32_t) * (size_t)(M * K)) || cudaMalloc(&dw, sizeof(float) * (size_t)(M * K)) ||
                cudaMemcpy(di, ids, sizeof(int32_t) * (size_t)(M * K), cudaMemcpyHostToDevice) ||
                cudaMemcpy(dw, wts, sizeof(float) * (size_t)(M * K), cudaMemcpyHostToDevice)))
        goto out;
    nvfp4moe_io io = {.num_tokens = M, .hidden = dh, .router_logits = dl, .topk_ids = di, .topk_weights = dw,
                      .output = dout, .workspace = dws, .workspace_size = ws};
    st = nvfp4moe_plan_forward(plan, &io, NULL);
    if (st == NVFP4MOE_OK && (cudaDeviceSynchronize() || cudaMemcpy(out, dout, ob, cudaMemcpyDeviceToHost)))
        st = NVFP4MOE_ERR_CUDA;
out:
    cudaFree(dh); cudaFree(dl); cudaFree(di); cudaFree(dw); cudaFree(dout); cudaFree(dws);
    return st;
}

/* ~7/8 of the pairs to rank 0's experts, the rest to any expert but the last rank's; distinct
 * experts per token; positive weights summing to 1. */
static void uneven_ids(const nvfp4moe_config *c, int32_t ranks, int64_t m, uint64_t seed, int32_t *ids, float *wts) {
    const int32_t E = c->num_experts, K = c->top_k, L = E / ranks;
    uint64_t s = seed;
    for (int64_t t = 0; t < m; t++) {
        float sum = 0;
        for (int32_t j = 0; j < K; j++) {
            int32_t e;
            for (;;) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                const bool hot = (s >> 33) % 8 != 0;
                e = hot ? (int32_t)((s >> 17) % (uint64_t)L) : (int32_t)((s >> 17) % (uint64_t)(E - L));
                bool dup = false;
                for (int32_t q = 0; q < j; q++) dup |= ids[t * K + q] == e;
                if (!dup) break;
            }
            ids[t * K + j] = e;
            wts[t * K + j] = 0.25f + (float)((s >> 40) % 1000) / 1000.0f;
            sum += wts[t * K + j];
        }
        for (int32_t j = 0; j < K; j++) wts[t * K + j] /= sum;
    }
}

/* One rank's thread: its EP plan (the device plan of its local experts on the shared GPU), one
 * forward. Only the world is written here; the checks run on the main thread afterwards. */
static nvfp4moe_status rank_main(int32_t rank, const nvfp4moe_ep_transport *t, void *ctx) {
    world *w = ctx;
    nvfp4moe_config cfg = w->cfg;
    cfg.parallel.ep_rank = rank;
    nvfp4moe_device dev = w->dev;
    nvfp4moe_plan_options po = {.device = &dev};
    nvfp4moe_ep_options eo = {.plan = &po, .local_backend = w->local_backend, .max_tokens = w->max_tokens};
    nvfp4moe_ep_plan *p = NULL;
    nvfp4moe_status st = nvfp4moe_ep_plan_create(&cfg, w->w, t, &eo, &p);
    if (st == NVFP4MOE_OK) {
        snprintf(w->local[rank], sizeof w->local[rank], "%s", nvfp4moe_plan_backend(nvfp4moe_ep_plan_local(p)));
        snprintf(w->oracle[rank], sizeof w->oracle[rank], "%s", nvfp4moe_ep_plan_report(p)->backend);
        nvfp4moe_io io = {.num_tokens = w->m[rank], .hidden = w->hidden[rank], .router_logits = w->logits[rank],
                          .topk_ids = w->ids[rank], .topk_weights = w->wts[rank], .output = w->out[rank]};
        st = nvfp4moe_ep_forward(p, &io, &w->stats[rank]);
    }
    w->st[rank] = st;
    if (st != NVFP4MOE_OK) snprintf(w->msg[rank], sizeof w->msg[rank], "%s", nvfp4moe_last_error());
    nvfp4moe_ep_plan_destroy(p);
    return st;
}

typedef enum { LOGITS, UNEVEN, EMPTY_RANK1, BATCHED } case_kind;

static void ep_case(const char *name, const nvfp4moe_layer *layer, const nvfp4moe_config *base,
                    const nvfp4moe_device *dev, int32_t ranks, case_kind kind) {
    T_CASE(name);
    world *w = calloc(1, sizeof *w);
    if (!w) {
        CHECK(0, "out of memory");
        return;
    }
    w->cfg = *base;
    w->cfg.parallel.ep_size = ranks;
    w->w = &layer->w;
    w->dev = *dev;
    w->max_tokens = 64;
    if (kind == BATCHED) {
        w->cfg.parallel.dp_size = 2;
        snprintf(w->cfg.parallel.all2all, sizeof w->cfg.parallel.all2all, "deepep_low_latency");
        w->local_backend = "marlin";
    }
    const nvfp4moe_config *c1 = base;   /* the single-GPU layer: ep 1 */
    const int64_t H = c1->hidden_size, E = c1->num_experts, K = c1->top_k;
    nvfp4moe_plan_options po = {.device = &w->dev};
    nvfp4moe_plan *single = NULL;
    CHECK_OK(nvfp4moe_plan_create(c1, &layer->w, &po, &single));
    uint16_t *want[MAX_RANKS] = {0};
    for (int32_t r = 0; r < ranks; r++) {
        const int64_t M = kind == EMPTY_RANK1 && r == 1 ? 0 : kind == LOGITS ? 5 + 11 * r : kind == BATCHED ? 24 : 40;
        w->m[r] = M;
        w->hidden[r] = malloc((size_t)(M * H) * 2 + 2);
        w->out[r] = calloc((size_t)(M * H) + 1, 2);
        want[r] = calloc((size_t)(M * H) + 1, 2);
        nvfp4moe_fill_normal(w->hidden[r], c1->in_dtype, M * H, 900 + (uint64_t)r);
        if (kind == UNEVEN) {
            w->ids[r] = malloc(sizeof(int32_t) * (size_t)(M * K) + 4);
            w->wts[r] = malloc(sizeof(float) * (size_t)(M * K) + 4);
            uneven_ids(c1, ranks, M, 300 + (uint64_t)r, w->ids[r], w->wts[r]);
        } else {
            w->logits[r] = malloc(sizeof(float) * (size_t)(M * E) + 4);
            nvfp4moe_fill_normal(w->logits[r], NVFP4MOE_DTYPE_F32, M * E, 700 + (uint64_t)r);
        }
        if (single)
            CHECK_OK(single_gpu(single, c1, M, w->hidden[r], w->logits[r], w->ids[r], w->wts[r], want[r]));
    }
    nvfp4moe_plan_destroy(single);

    nvfp4moe_ep_loopback *lb = NULL;
    CHECK_OK(nvfp4moe_ep_loopback_create(ranks, &lb));
    if (lb) CHECK_OK(nvfp4moe_ep_loopback_run(lb, rank_main, w));
    nvfp4moe_ep_loopback_free(lb);

    int64_t sent = 0, received = 0;
    for (int32_t r = 0; r < ranks; r++) {
        CHECK(w->st[r] == NVFP4MOE_OK, "rank %d: %s: %s", r, nvfp4moe_status_str(w->st[r]), w->msg[r]);
        if (w->st[r] != NVFP4MOE_OK) continue;
        const nvfp4moe_ep_stats *s = &w->stats[r];
        printf("  [%s] ep=%d rank %d: %lld tokens, local %s (oracle: %s), dispatch %.3f ms (a2a %.3f), experts "
               "%.3f ms, combine %.3f ms (a2a %.3f), rows sent %lld received %lld, remote bytes %zu + %zu\n",
               name, ranks, r, (long long)w->m[r], w->local[r], w->oracle[r][0] ? w->oracle[r] : "none",
               s->dispatch_s * 1e3, s->dispatch_xfer_s * 1e3, s->experts_s * 1e3, s->combine_s * 1e3,
               s->combine_xfer_s * 1e3, (long long)s->rows_sent, (long long)s->rows_received, s->dispatch_bytes_remote,
               s->combine_bytes_remote);
        /* The standard format runs the oracle's own choice for the EP deployment (a device backend). */
        if (kind != BATCHED)
            CHECK(w->oracle[r][0] && !strcmp(w->local[r], w->oracle[r]) && strncmp(w->local[r], "CPU_", 4),
                  "rank %d: local %s, oracle %s", r, w->local[r], w->oracle[r][0] ? w->oracle[r] : "none");
        if (kind == BATCHED) CHECK(!strcmp(w->local[r], "MARLIN"), "rank %d: local %s", r, w->local[r]);
        CHECK(s->dispatch_xfer_s >= 0 && s->dispatch_xfer_s <= s->dispatch_s && s->combine_xfer_s >= 0 &&
                  s->combine_xfer_s <= s->combine_s,
              "rank %d: all-to-all time %.6f/%.6f s outside its stage %.6f/%.6f s", r, s->dispatch_xfer_s,
              s->combine_xfer_s, s->dispatch_s, s->combine_s);
        sent += s->rows_sent;
        received += s->rows_received;
        if (kind == UNEVEN && r == ranks - 1)
            CHECK(s->rows_received == 0, "the last rank received %lld rows, want 0", (long long)s->rows_received);
        if (w->m[r] > 0) {
            float *g = malloc(sizeof(float) * (size_t)(w->m[r] * H)), *x = malloc(sizeof(float) * (size_t)(w->m[r] * H));
            double *wd = malloc(sizeof(double) * (size_t)(w->m[r] * H));
            nvfp4moe_to_float(c1->out_dtype, w->out[r], w->m[r] * H, g);
            nvfp4moe_to_float(c1->out_dtype, want[r], w->m[r] * H, x);
            double norm = 0;
            for (int64_t i = 0; i < w->m[r] * H; i++) {
                wd[i] = x[i];
                norm += wd[i] * wd[i];
            }
            CHECK(norm > 0, "rank %d: the single-GPU output is all zeros (the comparison would prove nothing)", r);
            const double err = check_rel_l2("EP (loopback, device plans) vs single GPU", g, wd, (size_t)(w->m[r] * H), 1e-2);
            printf("  [%s] ep=%d rank %d: relative L2 error %.3g\n", name, ranks, r, err);
            free(g); free(x); free(wd);
        }
    }
    /* Every row sent is received (standard: counts exchanged; batched: fixed padded blocks). */
    CHECK(sent == received, "rows sent %lld != rows received %lld", (long long)sent, (long long)received);
    for (int32_t r = 0; r < ranks; r++) {
        free(w->hidden[r]); free(w->logits[r]); free(w->ids[r]); free(w->wts[r]); free(w->out[r]); free(want[r]);
    }
    free(w);
}

int main(void) {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
    nvfp4moe_device dev;
    if (gpus < 1 || nvfp4moe_device_detect(&dev) != NVFP4MOE_OK || !dev.is_cuda) {
        printf("gpu_ep_loopback: SKIP: no CUDA GPU\n");
        return 0;
    }
    printf("gpu_ep_loopback on %s (sm_%d): N ranks as threads over the loopback transport, all on this GPU "
           "(not NCCL)\n", dev.name, dev.sm);
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);   /* Qwen3-30B-A3B's layer: E=128 top-8 H=2048 I=768 bf16 */
    nvfp4moe_layer *layer = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, 4242, &layer));
    if (!layer) return t_finish("gpu_ep_loopback");
    const int32_t sizes[] = {2, 4, 8};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const int32_t n = sizes[i];
        ep_case("standard, router logits, different M per rank", layer, &c, &dev, n, LOGITS);
        ep_case("standard, uneven routing, last rank gets nothing", layer, &c, &dev, n, UNEVEN);
        ep_case("standard, rank 1 has no tokens", layer, &c, &dev, n, EMPTY_RANK1);
        ep_case("batched (deepep_low_latency), local MARLIN", layer, &c, &dev, n, BATCHED);
    }
    nvfp4moe_layer_free(layer);
    return t_finish("gpu_ep_loopback");
}
