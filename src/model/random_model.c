/*
 * random_model.c - a random unquantized (BF16) model directory written tensor by tensor: a small
 * decoder of the config's shape (embeddings, attention, norms, dense MLPs before the first MoE
 * layer, lm_head) whose MoE layers hold exactly nvfp4moe_float_layer_random's draws. Memory: one
 * expert's rows at a time, so sources of any size (a DeepSeek-V3-sized layer: 22 GB) can be made
 * for quantize.
 */
#include "format/format.h"
#include "model/ckpt.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RANDOM_VOCAB 1024

/* The attention shape of a random model: head size 128 (H >= 2048), 64 or 16, a quarter as many
 * key/value heads when that divides. */
static void heads_of(int64_t H, int64_t *hd, int64_t *nh, int64_t *nkv) {
    *hd = H >= 2048 && H % 128 == 0 ? 128 : H % 64 == 0 ? 64 : 16;
    *nh = H / *hd;
    *nkv = *nh % 4 == 0 ? *nh / 4 : *nh;
}

typedef struct {
    nvfp4moe_st_shards *sh;
    uint16_t *row;             /* bf16 scratch, one expert matrix */
    float *f;                  /* float scratch */
    size_t cap;                /* elements of both */
} rmodel;

static nvfp4moe_status add(rmodel *r, const char *name, nvfp4moe_st_dtype dt, int32_t nd, int64_t a, int64_t b,
                           int64_t *idx) {
    const int64_t shape[2] = {a, b};
    return nvfp4moe_st_shards_add(r->sh, name, dt, nd, shape, idx);
}

/* A dense tensor of n values: N(0, std) bf16 from its own stream, or all `fill` (std 0). */
static nvfp4moe_status write_dense(rmodel *r, int64_t idx, int64_t n, double std, float fill, uint64_t seed) {
    uint64_t st = seed;
    for (int64_t i0 = 0; i0 < n; i0 += (int64_t)r->cap) {
        const int64_t k = NVFP4MOE_MIN((int64_t)r->cap, n - i0);
        for (int64_t i = 0; i < k; i++)
            r->row[i] = nvfp4moe_bf16_from_float(std > 0 ? (float)(nvfp4moe_rand_normal(&st) * std) : fill);
        NVFP4MOE_TRY(nvfp4moe_st_shards_write(r->sh, idx, (uint64_t)i0 * 2, r->row, (uint64_t)k * 2));
    }
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_model_write_random(const char *dir, const nvfp4moe_config *cfg, int32_t num_layers,
                                            int32_t first_moe_layer, uint64_t max_shard_bytes) {
    NVFP4MOE_RETURN_IF(!dir || !cfg, NVFP4MOE_ERR_INVALID_ARGUMENT, "model_write_random: NULL argument");
    NVFP4MOE_RETURN_IF(num_layers < 1 || num_layers > 4096 || first_moe_layer < 0 || first_moe_layer >= num_layers,
                       NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "model_write_random: first_moe_layer=%d must be in [0, num_layers=%d), num_layers <= 4096",
                       first_moe_layer, num_layers);
    NVFP4MOE_TRY(nvfp4moe_config_validate(cfg));
    const uint64_t shard = max_shard_bytes ? max_shard_bytes : 5000000000ull;
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size, N1 = nvfp4moe_config_n1(cfg);
    const int64_t V = RANDOM_VOCAB, ID = 2 * I;   // the dense layers' MLP
    int64_t hd, nh, nkv;
    heads_of(H, &hd, &nh, &nkv);
    const bool gated = nvfp4moe_activation_is_gated(cfg->activation);
    // The MoE layers' extras follow nvfp4moe_float_layer_random: gpt-oss (swigluoai) has a router
    // bias, expert biases and the router under mlp.router.
    const bool goss = cfg->activation == NVFP4MOE_ACT_SWIGLUOAI, biases = cfg->has_bias || goss;
    const char *rname = goss ? "router" : "gate";
    rmodel r = {0};
    r.cap = (size_t)NVFP4MOE_MAX(NVFP4MOE_MAX(N1, H) * NVFP4MOE_MAX(H, I), V * H);
    if (r.cap > ((size_t)1 << 27)) r.cap = (size_t)1 << 27;   // dense tensors stream through chunks
    size_t exp_elems;
    NVFP4MOE_RETURN_IF(!nvfp4moe_ckpt_checked_size(NVFP4MOE_MAX(N1, H), NVFP4MOE_MAX(H, I), 1, 1, &exp_elems),
                       NVFP4MOE_ERR_SHAPE, "model_write_random: experts too large");
    r.row = malloc(sizeof(uint16_t) * NVFP4MOE_MAX(r.cap, exp_elems));
    r.f = malloc(sizeof(float) * NVFP4MOE_MAX(r.cap, exp_elems));
    nvfp4moe_status s = r.row && r.f ? nvfp4moe_st_shards_create(&r.sh)
                                     : nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    if (s != NVFP4MOE_OK) goto done;
    if (exp_elems > r.cap) r.cap = exp_elems;

    // The plan, in the order the loaders' names sort, and the indices of each layer's tensors.
    int64_t emb = 0, norm = 0, head = 0;
    int64_t (*lt)[10] = calloc((size_t)num_layers, sizeof *lt);   // per layer: norms, attention, dense MLP / router
    int64_t *ex = calloc((size_t)(num_layers - first_moe_layer) * (size_t)E * 6 + 1, sizeof *ex);
    if (!lt || !ex) {
        free(lt);
        free(ex);
        s = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    char name[256];
    s = add(&r, "model.embed_tokens.weight", NVFP4MOE_ST_BF16, 2, V, H, &emb);
    for (int32_t L = 0; L < num_layers && s == NVFP4MOE_OK; L++) {
        const bool moe = L >= first_moe_layer;
        const struct { const char *suffix; int32_t nd; int64_t a, b; bool on; } t[10] = {
            {"input_layernorm.weight", 1, H, 0, true},
            {"post_attention_layernorm.weight", 1, H, 0, true},
            {"self_attn.q_proj.weight", 2, nh * hd, H, true},
            {"self_attn.k_proj.weight", 2, nkv * hd, H, true},
            {"self_attn.v_proj.weight", 2, nkv * hd, H, true},
            {"self_attn.o_proj.weight", 2, H, nh * hd, true},
            {"mlp.gate_proj.weight", 2, ID, H, !moe},
            {"mlp.up_proj.weight", 2, ID, H, !moe},
            {"mlp.down_proj.weight", 2, H, ID, !moe},
            {NULL, 2, E, H, moe},
        };
        for (int i = 0; i < 10 && s == NVFP4MOE_OK; i++) {
            lt[L][i] = -1;
            if (!t[i].on) continue;
            if (t[i].suffix) snprintf(name, sizeof name, "model.layers.%d.%s", L, t[i].suffix);
            else snprintf(name, sizeof name, "model.layers.%d.mlp.%s.weight", L, rname);
            s = add(&r, name, NVFP4MOE_ST_BF16, t[i].nd, t[i].a, t[i].b, &lt[L][i]);
        }
        if (!moe || s != NVFP4MOE_OK) continue;
        // A MoE layer has no dense MLP: its slots 6 and 7 hold the router bias and the correction bias.
        int64_t *x = ex + (size_t)(L - first_moe_layer) * (size_t)E * 6;
        if (goss) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.router.bias", L);
            s = add(&r, name, NVFP4MOE_ST_BF16, 1, E, 0, &lt[L][6]);
        }
        if (s == NVFP4MOE_OK && cfg->has_correction_bias) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.gate.e_score_correction_bias", L);
            s = add(&r, name, NVFP4MOE_ST_F32, 1, E, 0, &lt[L][7]);
        }
        for (int32_t e = 0; e < E && s == NVFP4MOE_OK; e++)
            for (int p = gated ? 0 : 1; p < 3 && s == NVFP4MOE_OK; p++) {
                const char *proj = p == 0 ? "gate_proj" : p == 1 ? "up_proj" : "down_proj";
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.weight", L, e, proj);
                s = add(&r, name, NVFP4MOE_ST_BF16, 2, p == 2 ? H : I, p == 2 ? I : H, &x[e * 6 + p]);
                if (s != NVFP4MOE_OK || !biases) continue;
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.bias", L, e, proj);
                s = add(&r, name, NVFP4MOE_ST_BF16, 1, p == 2 ? H : I, 0, &x[e * 6 + 3 + p]);
            }
    }
    if (s == NVFP4MOE_OK) s = add(&r, "model.norm.weight", NVFP4MOE_ST_BF16, 1, H, 0, &norm);
    if (s == NVFP4MOE_OK) s = add(&r, "lm_head.weight", NVFP4MOE_ST_BF16, 2, V, H, &head);
    if (s == NVFP4MOE_OK) s = nvfp4moe_st_shards_layout(r.sh, shard, dir);

    // The dense tensors: their own streams, N(0, 0.02) (norms: ones).
    const uint64_t base = cfg->seed * 0x9e3779b97f4a7c15ull + 0x3c6ef372fe94f82bull;
    if (s == NVFP4MOE_OK) s = write_dense(&r, emb, V * H, 0.02, 0, base ^ 1);
    if (s == NVFP4MOE_OK) s = write_dense(&r, norm, H, 0, 1.0f, 0);
    if (s == NVFP4MOE_OK) s = write_dense(&r, head, V * H, 0.02, 0, base ^ 2);
    for (int32_t L = 0; L < num_layers && s == NVFP4MOE_OK; L++) {
        const bool moe = L >= first_moe_layer;
        const int64_t n[9] = {H, H, nh * hd * H, nkv * hd * H, nkv * hd * H, H * nh * hd, ID * H, ID * H, H * ID};
        for (int i = 0; i < 9 && s == NVFP4MOE_OK; i++) {
            if (lt[L][i] < 0 || (moe && i >= 6)) continue;
            s = write_dense(&r, lt[L][i], n[i], i < 2 ? 0 : 0.02, 1.0f, base ^ ((uint64_t)(L + 1) << 8 | (uint64_t)i));
        }
        if (!moe || s != NVFP4MOE_OK) continue;
        // The MoE layer: nvfp4moe_float_layer_random's draws, in its order (w13 of every expert,
        // then w2, router, correction bias, router bias, expert biases), an expert at a time.
        const int64_t *x = ex + (size_t)(L - first_moe_layer) * (size_t)E * 6;
        uint64_t st = (cfg->seed + (uint64_t)L) ^ 0x6a09e667f3bcc909ull;
        const double s13 = 1.0 / sqrt((double)H), s2 = 1.0 / sqrt((double)I);
        for (int32_t e = 0; e < E && s == NVFP4MOE_OK; e++) {
            for (int64_t i = 0; i < N1 * H; i++) r.f[i] = nvfp4moe_round_to_dtype(NVFP4MOE_DTYPE_BF16, (float)(nvfp4moe_rand_normal(&st) * s13));
            for (int p = gated ? 0 : 1; p < 2 && s == NVFP4MOE_OK; p++) {
                for (int64_t rr = 0; rr < I; rr++)
                    for (int64_t k = 0; k < H; k++)
                        r.row[rr * H + k] = nvfp4moe_bf16_from_float(r.f[nvfp4moe_ckpt_w13_row(cfg, p, rr) * H + k]);
                s = nvfp4moe_st_shards_write(r.sh, x[e * 6 + p], 0, r.row, (uint64_t)(I * H) * 2);
            }
        }
        for (int32_t e = 0; e < E && s == NVFP4MOE_OK; e++) {
            for (int64_t i = 0; i < H * I; i++)
                r.row[i] = nvfp4moe_bf16_from_float((float)(nvfp4moe_rand_normal(&st) * s2));
            s = nvfp4moe_st_shards_write(r.sh, x[e * 6 + 2], 0, r.row, (uint64_t)(H * I) * 2);
        }
        for (int64_t i = 0; i < E * H && s == NVFP4MOE_OK; i++) r.f[i] = (float)(nvfp4moe_rand_normal(&st) * s13);
        for (int64_t i = 0; i < E * H && s == NVFP4MOE_OK; i++) r.row[i] = nvfp4moe_bf16_from_float(r.f[i]);
        if (s == NVFP4MOE_OK) s = nvfp4moe_st_shards_write(r.sh, lt[L][9], 0, r.row, (uint64_t)(E * H) * 2);
        if (s == NVFP4MOE_OK && cfg->has_correction_bias) {
            for (int64_t e = 0; e < E; e++) r.f[e] = (float)(0.1 * nvfp4moe_rand_normal(&st));
            s = nvfp4moe_st_shards_write(r.sh, lt[L][7], 0, r.f, (uint64_t)E * 4);
        }
        if (s == NVFP4MOE_OK && goss) {
            for (int64_t e = 0; e < E; e++) r.row[e] = nvfp4moe_bf16_from_float((float)(0.5 * nvfp4moe_rand_normal(&st)));
            s = nvfp4moe_st_shards_write(r.sh, lt[L][6], 0, r.row, (uint64_t)E * 2);
        }
        if (s == NVFP4MOE_OK && biases) {   // w13's biases of every expert, then w2's
            for (int32_t e = 0; e < E && s == NVFP4MOE_OK; e++) {
                for (int64_t i = 0; i < N1; i++) r.f[i] = (float)(0.1 * nvfp4moe_rand_normal(&st));
                for (int p = gated ? 0 : 1; p < 2 && s == NVFP4MOE_OK; p++) {
                    for (int64_t rr = 0; rr < I; rr++) r.row[rr] = nvfp4moe_bf16_from_float(r.f[nvfp4moe_ckpt_w13_row(cfg, p, rr)]);
                    s = nvfp4moe_st_shards_write(r.sh, x[e * 6 + 3 + p], 0, r.row, (uint64_t)I * 2);
                }
            }
            for (int32_t e = 0; e < E && s == NVFP4MOE_OK; e++) {
                for (int64_t i = 0; i < H; i++) r.row[i] = nvfp4moe_bf16_from_float((float)(0.1 * nvfp4moe_rand_normal(&st)));
                s = nvfp4moe_st_shards_write(r.sh, x[e * 6 + 5], 0, r.row, (uint64_t)H * 2);
            }
        }
    }
    free(lt);
    free(ex);
    if (s == NVFP4MOE_OK) s = nvfp4moe_st_shards_finish(r.sh);
    if (s == NVFP4MOE_OK) {
        // config.json: the MoE layers' config, and the decoder's other shapes.
        s = nvfp4moe_model_config_write(dir, cfg, num_layers, first_moe_layer, NVFP4MOE_CKPT_UNQUANTIZED, NULL, NULL);
        char path[4096], *text = NULL;
        snprintf(path, sizeof path, "%s/config.json", dir);
        if (s == NVFP4MOE_OK) s = nvfp4moe_read_text_file(path, (size_t)1 << 20, &text);
        json_t *c = text ? json_loads(text, 0, NULL) : NULL;
        free(text);
        text = NULL;
        if (s == NVFP4MOE_OK && c &&
            json_object_set_new(c, "vocab_size", json_integer(V)) == 0 &&
            json_object_set_new(c, "intermediate_size", json_integer(ID)) == 0 &&
            json_object_set_new(c, "num_attention_heads", json_integer(nh)) == 0 &&
            json_object_set_new(c, "num_key_value_heads", json_integer(nkv)) == 0 &&
            json_object_set_new(c, "head_dim", json_integer(hd)) == 0 &&
            json_object_set_new(c, "rms_norm_eps", json_real(1e-6)) == 0 &&
            json_object_set_new(c, "tie_word_embeddings", json_false()) == 0)
            text = json_dumps(c, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (c) json_decref(c);
        if (s == NVFP4MOE_OK) s = text ? nvfp4moe_write_text_file(path, text)
                                       : nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "config.json: out of memory");
        free(text);
        if (s != NVFP4MOE_OK) unlink(path);
    }
    if (s != NVFP4MOE_OK) nvfp4moe_st_shards_discard(r.sh);
done:
    nvfp4moe_st_shards_free(r.sh);
    free(r.row);
    free(r.f);
    return s;
}
