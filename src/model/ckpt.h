/*
 * ckpt.h - what the checkpoint files of src/model/ share: the loading context and the tensor
 * helpers (ckpt_tensors.c). Not installed.
 */
#ifndef NVFP4MOE_CKPT_H
#define NVFP4MOE_CKPT_H

#include "model/model.h"

typedef struct {
    uint8_t *w13, *w13_scale, *w2, *w2_scale;
    float *w13_scale_2, *w13_input_scale, *w2_scale_2, *w2_input_scale;
    float *w13_bias, *w2_bias, *correction_bias, *router, *router_bias;
    float *w13_up_scale_2;      /* gated activations: the up half's global scale */
} ckpt_storage;

typedef struct {
    const nvfp4moe_model_info *info;
    const nvfp4moe_st_model *tensors;
    char where[256];            /* the model directory, for messages */
    bool router_found;          /* a float router weight of the right shape exists */
    const nvfp4moe_st_tensor *router_t, *router_bias_t; /* what load_router accepted, or NULL */
    int32_t layer;
    nvfp4moe_config cfg;
    char base[160];             /* "model.layers.3.mlp." */
    const char *gate, *up, *down; /* projection names: gate_proj/up_proj/down_proj or w1/w3/w2 */
    bool proj_first;            /* per-expert tensors named experts.<proj>.<e>.* (ModelOpt's
                                   Qwen3-VL-MoE), not experts.<e>.<proj>.* */
    bool check_only;
    nvfp4moe_warnings *warn;
    ckpt_storage *st;
    /* gate/up scale statistics, for the warnings */
    int32_t n_differ, first_differ;
    float first_g, first_u;
    int32_t n_input_differ;
} load_ctx;


/* Shared by the loaders (ckpt_tensors.c defines these). */
/* Values [first, first + n) of a float tensor (F32, F64, BF16, F16) as float, read from the file
 * (nvfp4moe_st_tensor_read): FORMAT for another dtype, IO when the file changed. */
nvfp4moe_status nvfp4moe_ckpt_read_floats(const nvfp4moe_st_tensor *t, int64_t first, int64_t n, float *dst);
/* The rows of a [rows, row_bytes] tensor into dst, consecutive rows dst_stride bytes apart. */
nvfp4moe_status nvfp4moe_ckpt_read_rows(const nvfp4moe_st_tensor *t, int64_t rows, int64_t row_bytes, uint8_t *dst,
                                        int64_t dst_stride);
bool nvfp4moe_ckpt_is_float_dtype(nvfp4moe_st_dtype d);
bool nvfp4moe_ckpt_shape_is(const nvfp4moe_st_tensor *t, int32_t ndim, const int64_t *dims);
/* The tensor base+suffix, or NOT_FOUND naming it; maybe: NULL when absent. */
nvfp4moe_status nvfp4moe_ckpt_need(const load_ctx *c, const char *suffix, const nvfp4moe_st_tensor **out);
const nvfp4moe_st_tensor *nvfp4moe_ckpt_maybe(const load_ctx *c, const char *suffix);
/* FORMAT errors naming the file and tensor. */
nvfp4moe_status nvfp4moe_ckpt_bad_shape(const nvfp4moe_st_tensor *t, const char *want);
nvfp4moe_status nvfp4moe_ckpt_want_dtype(const nvfp4moe_st_tensor *t, nvfp4moe_st_dtype a, nvfp4moe_st_dtype b);
/* Values a layer cannot run with, checked in every load (check-only included) so that inspect
 * reports what a run would refuse: FORMAT naming the tensor and the element for a NaN E4M3 block
 * scale (read from the file in chunks) or a non-finite float (a bias). */
nvfp4moe_status nvfp4moe_ckpt_check_scales(const nvfp4moe_st_tensor *t);
nvfp4moe_status nvfp4moe_ckpt_check_finite(const nvfp4moe_st_tensor *t);
/* A per-tensor scale: one float value; a global scale (finite, > 0; reciprocal for
 * compressed-tensors). */
nvfp4moe_status nvfp4moe_ckpt_scalar(const nvfp4moe_st_tensor *t, float *v);
nvfp4moe_status nvfp4moe_ckpt_global_scale(const nvfp4moe_st_tensor *t, float v, bool reciprocal, float *out);
/* The suffix of expert e's tensor <leaf> of projection proj under the layer's module, in the
 * layer's order: "experts.3.up_proj.weight" (or "experts.up_proj.3.weight"). */
void nvfp4moe_ckpt_expert_suffix(const load_ctx *c, int32_t e, const char *proj, const char *leaf, char *buf,
                                 size_t len);
/* Canonical w13 row of element i of a half (0 gate, 1 up). */
int64_t nvfp4moe_ckpt_w13_row(const nvfp4moe_config *cfg, int half, int64_t i);
/* Whether the layer has expert biases: all of them (every projection of every expert, or both
 * fused ones) or none, else NOT_FOUND naming the first missing one. */
nvfp4moe_status nvfp4moe_ckpt_bias_presence(const load_ctx *c, bool fused, bool *has);
/* The router weight and bias and the correction bias: checks, and copies unless check_only. */
nvfp4moe_status nvfp4moe_ckpt_load_router(load_ctx *c, nvfp4moe_ckpt_layer *out);
/* The directory of the model's first file: what messages name. */
void nvfp4moe_ckpt_model_where(const nvfp4moe_st_model *m, char *buf, size_t len);
/* The layer's tensor prefix and projection names; the checkpoint format of its experts. */
nvfp4moe_status nvfp4moe_ckpt_find_layer(load_ctx *c);
nvfp4moe_status nvfp4moe_ckpt_detect_format(load_ctx *c, nvfp4moe_ckpt_format *fmt, bool *quantized);
/* The owning containers: a*b*c*d bytes without overflow; allocation for a config; the weights'
 * pointers into them. */
bool nvfp4moe_ckpt_checked_size(int64_t a, int64_t b, int64_t cc, int64_t d, size_t *out);
void nvfp4moe_ckpt_storage_free(ckpt_storage *s);
nvfp4moe_status nvfp4moe_ckpt_storage_alloc(const nvfp4moe_config *cfg, bool router, bool router_bias,
                                   ckpt_storage **out);
void nvfp4moe_ckpt_point_weights(nvfp4moe_ckpt_layer *l, const ckpt_storage *s);

// ---- unquantized sources, one expert at a time (float_layer.c) ----

/* An unquantized MoE layer whose every tensor has been resolved and checked: what reading it one
 * expert at a time (quantize's streaming path) needs. */
typedef struct {
    load_ctx c;                 /* the layer: base, projection names, config (has_bias) */
    nvfp4moe_warnings warnings;
    bool fused, transposed;     /* fused experts.gate_up_proj / down_proj, in [in, out] order */
    const nvfp4moe_st_tensor *gu, *dn, *gub, *dnb;   /* the fused tensors (and biases) */
    const nvfp4moe_st_tensor *router, *router_bias, *correction;
    char router_name[8];
} nvfp4moe_float_src;

/* Checks layer `layer` of an unquantized model (every expert tensor's presence, dtype and shape,
 * the router, the biases) and fills src; nothing is allocated. */
nvfp4moe_status nvfp4moe_float_src_open(const nvfp4moe_model_info *info, const nvfp4moe_st_model *tensors,
                                        int32_t layer, nvfp4moe_float_src *src);
/* Expert e as float: w13 [N1, H] (canonical rows), w2 [H, I], and when the layer has biases and the
 * pointers are not NULL, b13 [N1] and b2 [H]. */
nvfp4moe_status nvfp4moe_float_src_expert(const nvfp4moe_float_src *src, int32_t e, float *w13, float *w2,
                                          float *b13, float *b2);

/* ModelOpt's quantization of one expert (nvfp4moe_float_layer_quantize's, shared with quantize's
 * streaming path so that both write the same bits). x: the calibration tokens [M, H], in13 their
 * input scale. Writes q13 [N1, H/2], sf13 [N1, H/16], *s13 (gate and up share one amax), q2
 * [H, I/2], sf2 [H, I/16], *s2, and *in2 (the down projection's calibrated input scale).
 * wdq [N1 * H], g [N1], a [I]: scratch. */
nvfp4moe_status nvfp4moe_quantize_expert(const nvfp4moe_config *cfg, const float *w13, const float *w2,
                                         const float *b13, const float *x, int64_t M, uint8_t *q13, uint8_t *sf13,
                                         float *s13, uint8_t *q2, uint8_t *sf2, float *s2, float *in2, float *wdq,
                                         double *g, double *a);
/* The calibration tokens of a layer: M x H standard normal values from seed, and their input scale
 * (ModelOpt's amax / (6*448)). */
void nvfp4moe_calibration_tokens(uint64_t seed, int64_t M, int64_t H, float *x, float *in13);

#endif // NVFP4MOE_CKPT_H
