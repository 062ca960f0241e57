/*
 * reference.h - the float64 reference layer's pieces (src/reference/) that the host backends, the
 * random layers, the checkpoint calibration and EP reuse. Not installed.
 */
#ifndef NVFP4MOE_REFERENCE_H
#define NVFP4MOE_REFERENCE_H

#include "core/internal.h"

/* Applies cfg's activation to one row: in has nvfp4moe_config_n1(cfg) values (gated: [g | u], or
 * interleaved for swigluoai), out has I values. */
void nvfp4moe_activation_ref(const nvfp4moe_config *cfg, const double *in, double *out);
/* The same for outputs [lo, hi) only (out[lo, hi) written; in is the whole row): each output
 * depends on its own gate and up values alone, so the parts of a row computed apart are the whole
 * row's values. */
void nvfp4moe_activation_ref_range(const nvfp4moe_config *cfg, const double *in, int64_t lo, int64_t hi, double *out);

/* Quantize-dequantize one activation row of n values as scheme prescribes (src already rounded to
 * the activation dtype): W4A4 with global scale gs, per-token, MXFP8; W4A16 copies. */
void nvfp4moe_quantize_activation_row(nvfp4moe_scheme scheme, const float *src, int64_t n, float gs, float *dst);
/* W4A4-per-token's global scale of one row of n values: 448 * 6 / amax (1 for an all-zero row). */
float nvfp4moe_per_token_global_scale(const float *x, int64_t n);
/* W4A4's activation global scales: 1 / max over experts of the input scales (vLLM EMULATION's
 * rule); 1 for the other schemes. */
void nvfp4moe_w4a4_global_scales(const nvfp4moe_config *cfg, const nvfp4moe_weights *w, float *a1_gs,
                                 float *a2_gs);
/* The inputs of a host forward: hidden [M, H] to float, times the top-1 weight when the router
 * weight goes on the input, then quantize-dequantized per scheme. Writes x [M, H] and the W4A4
 * global scale of GEMM2's input (1 for the other schemes). */
void nvfp4moe_prepare_inputs(const nvfp4moe_config *cfg, const nvfp4moe_weights *w, const void *hidden,
                             int64_t M, const float *wts, float *x, float *a2_gs);
/* The host backends' rule for non-finite inputs, applied to a finished output: the row of every
 * token whose hidden state, or router logits (when routing reads them), hold a NaN or an infinity
 * is set to NaN, whatever the arithmetic made of it (a clamp can turn NaN into a number); the other
 * rows are untouched. */
void nvfp4moe_nan_rows(const nvfp4moe_config *cfg, const nvfp4moe_io *io);
/* The two parts of that rule: whether n values of dtype dt at p hold a NaN or an infinity, and
 * whether the forward's routing reads io's router logits. */
bool nvfp4moe_values_nonfinite(nvfp4moe_dtype dt, const void *p, int64_t n);
bool nvfp4moe_routing_reads_logits(const nvfp4moe_config *cfg, const nvfp4moe_io *io);
/* Groups P (token, slot) pairs by expert with a counting sort (token order kept within an expert):
 * expert e's pairs are order[start[e] .. start[e + 1]). start has E + 1 entries. */
nvfp4moe_status nvfp4moe_group_by_expert(const int32_t *ids, int64_t P, int64_t E, int64_t *start, int64_t *order);
/* Checks the io tensors a host forward needs. */
nvfp4moe_status nvfp4moe_check_io(const nvfp4moe_config *cfg, const nvfp4moe_io *io);
/* The reference router (nvfp4moe_route) for one token: logits its E float logits (NULL for
 * simulated routing), t its index (simulated routing draws from (seed, t)), scratch
 * nvfp4moe_route_scratch_bytes(cfg) bytes; cfg valid. Writes top_k ids and weights. */
size_t nvfp4moe_route_scratch_bytes(const nvfp4moe_config *cfg);
void nvfp4moe_route_token(const nvfp4moe_config *cfg, const float *logits, int64_t t, const float *correction_bias,
                          void *scratch, int32_t *topk_ids, float *topk_weights);
/* Skewed ("hot expert") router logits, for benchmarks and tests. Of the M tokens of logits [M, E]
 * (row-major, already filled with finite values below 2^24 in magnitude, where adding 1 always
 * gives a larger float), min(hot, M) get expert 0's logit set to 1 above the largest of their
 * other logits; the other tokens' rows are left as they are. The hot tokens are a random subset
 * drawn from seed, every subset of that size equally likely, the same for the same (M, hot, seed).
 * Expert 0 is then the first choice of every hot token under every routing method that ranks
 * experts by their logits: softmax_topk, renormalize(_naive), sigmoid(_renorm) and llama4 compare
 * the logits, deepseek_v3 and minimax2 a monotonic score of them (deepseek_v3's group 0 then
 * scores highest too; ties go to the lower index). Not with a correction bias, which may outweigh
 * any logit once the sigmoid saturates, nor with simulated routing, which reads no logits. is_hot
 * (M entries, may be NULL) gets which tokens are hot. Returns their count (0 for hot <= 0). */
int64_t nvfp4moe_hot_expert_logits(float *logits, int64_t M, int32_t E, int64_t hot, uint64_t seed, bool *is_hot);
/* io's precomputed top-k, checked: INVALID_ARGUMENT naming the first id outside [0, E) or weight
 * that is not finite. */
nvfp4moe_status nvfp4moe_check_topk(const nvfp4moe_config *cfg, const nvfp4moe_io *io);
/* The routing of a host forward: io's precomputed top-k (checked) or the reference router on its
 * logits. ids/wts: [M, top_k]. */
nvfp4moe_status nvfp4moe_routing_for_io(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                       const nvfp4moe_io *io, int32_t *ids, float *wts);

// ---- vLLM's EMULATION path on the host (src/reference/emulation.c) ----

/* The activation parameters vLLM's EMULATION path runs cfg's activation with: those of
 * nvfp4moe_config_act_params, except swigluoai (alpha 1.702, limit 7, up + 1: the op's defaults,
 * whatever the model says) and swiglustep (limit 7). */
nvfp4moe_act_params nvfp4moe_emulation_act_params(const nvfp4moe_config *cfg);
/* One row of vLLM's activation kernel for cfg's activation, with its roundings to dt: in has
 * nvfp4moe_config_n1(cfg) values (already of dtype dt), out gets I. */
void nvfp4moe_emulation_activation(const nvfp4moe_config *cfg, const nvfp4moe_act_params *p, nvfp4moe_dtype dt,
                                   const float *in, float *out);
/* The EMULATION GEMM's weights [rows, cols]: dt(e2m1 * (e4m3 * scale_2)), float32 products. */
void nvfp4moe_emulation_dequant(const uint8_t *q, const uint8_t *sf, int64_t rows, int64_t cols, float scale_2,
                                nvfp4moe_dtype dt, float *out);
/* vLLM's moe_sum of y [M * K, H] (values of dtype dt, slot j of token t in row t * K + j) into
 * out [M, H]: top-k 2..4 add in dt one slot at a time, other top-k sum in float32 and round once. */
void nvfp4moe_emulation_moe_sum(const float *y, int64_t M, int64_t K, int64_t H, nvfp4moe_dtype dt, float *out);
/* The whole layer as vLLM's EMULATION backend computes it (emulation.c says how), host pointers.
 * W4A4 with bf16 or fp16 hidden states only (UNSUPPORTED otherwise). */
nvfp4moe_status nvfp4moe_emulation_forward_host(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                                const nvfp4moe_io *io);
/* The same with the two QDQs dividing as the GPU's EMULATION kernels do (format.h,
 * nvfp4moe_qdq_row_triton): rcp_gs holds the GPU's reciprocals of a1_gs and a2_gs
 * (nvfp4moe_w4a4_global_scales; kernels/emulation.h nvfp4moe_emul_triton_rcp computes them). NULL:
 * IEEE divisions, nvfp4moe_emulation_forward_host. What tests judge the GPU backend against. */
nvfp4moe_status nvfp4moe_emulation_forward_host_rcp(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                                    const nvfp4moe_io *io, const float rcp_gs[2]);

#endif // NVFP4MOE_REFERENCE_H
