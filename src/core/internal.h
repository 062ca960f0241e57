/*
 * internal.h - helpers shared by the library's own C files (and the tests). Not installed.
 */
#ifndef NVFP4MOE_INTERNAL_H
#define NVFP4MOE_INTERNAL_H

#include "nvfp4moe.h"

#include <stdarg.h>

// ---- errors ----

/* Records a formatted message as this thread's last error and returns s. */
nvfp4moe_status nvfp4moe_set_error(nvfp4moe_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Prefixes this thread's last error with "prefix: ". */
void nvfp4moe_error_prefix(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

#define NVFP4MOE_RETURN_IF(cond, status, ...)                                                      \
    do {                                                                                           \
        if (cond) return nvfp4moe_set_error((status), __VA_ARGS__);                                \
    } while (0)

#define NVFP4MOE_TRY(expr)                                                                         \
    do {                                                                                           \
        nvfp4moe_status s_ = (expr);                                                               \
        if (s_ != NVFP4MOE_OK) return s_;                                                          \
    } while (0)

// ---- small helpers ----

#define NVFP4MOE_MIN(a, b) ((a) < (b) ? (a) : (b))
#define NVFP4MOE_MAX(a, b) ((a) > (b) ? (a) : (b))
#define NVFP4MOE_CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

/* Names as the library compares them: case-insensitive, '-' and '_' equivalent. */
bool nvfp4moe_name_eq(const char *a, const char *b);

/* snprintf into a fixed buffer, never overflowing, always terminated. */
void nvfp4moe_strlcpy(char *dst, const char *src, size_t len);


/* Rounds x through dtype (bf16/fp16/f32) and back. */
float nvfp4moe_round_to_dtype(nvfp4moe_dtype dt, float x);

/* splitmix64: the library's one pseudo-random generator (deterministic in its state). */
uint64_t nvfp4moe_rand_u64(uint64_t *state);
/* Uniform in [0, 1). */
double nvfp4moe_rand_uniform(uint64_t *state);
/* Standard normal (Box-Muller). */
double nvfp4moe_rand_normal(uint64_t *state);

// ---- reference pieces (src/reference/moe_ref.c, src/reference/activation.c) ----

/* Applies cfg's activation to one row: in has nvfp4moe_config_n1(cfg) values (gated: [g | u], or
 * interleaved for swigluoai), out has I values. */
void nvfp4moe_activation_ref(const nvfp4moe_config *cfg, const double *in, double *out);

/* Quantize-dequantize one row of n values (n % 16 == 0) with global scale gs, as vLLM's
 * ref_nvfp4_quant followed by dequantization, in float32. */
void nvfp4moe_qdq_row(const float *x, int64_t n, float gs, float *out);
/* MXFP8 (E4M3 elements, E8M0 scale per 32) quantize-dequantize of one row (n % 32 == 0). */
void nvfp4moe_mxfp8_qdq_row(const float *x, int64_t n, float *out);

/* Quantize-dequantize one activation row of n values as scheme prescribes (src already rounded to
 * the activation dtype): W4A4 with global scale gs, per-token, MXFP8; W4A16 copies. */
void nvfp4moe_quantize_activation_row(nvfp4moe_scheme scheme, const float *src, int64_t n, float gs, float *dst);
/* W4A4's activation global scales: 1 / max over experts of the input scales (vLLM EMULATION's
 * rule); 1 for the other schemes. */
void nvfp4moe_w4a4_global_scales(const nvfp4moe_config *cfg, const nvfp4moe_weights *w, float *a1_gs,
                                 float *a2_gs);
/* The inputs of a host forward: hidden [M, H] to float, times the top-1 weight when the router
 * weight goes on the input, then quantize-dequantized per scheme. Writes x [M, H] and the W4A4
 * global scale of GEMM2's input (1 for the other schemes). */
void nvfp4moe_prepare_inputs(const nvfp4moe_config *cfg, const nvfp4moe_weights *w, const void *hidden,
                             int64_t M, const float *wts, float *x, float *a2_gs);
/* Groups P (token, slot) pairs by expert with a counting sort (token order kept within an expert):
 * expert e's pairs are order[start[e] .. start[e + 1]). start has E + 1 entries. */
nvfp4moe_status nvfp4moe_group_by_expert(const int32_t *ids, int64_t P, int64_t E, int64_t *start, int64_t *order);
/* Checks the io tensors a host forward needs. */
nvfp4moe_status nvfp4moe_check_io(const nvfp4moe_config *cfg, const nvfp4moe_io *io);
/* The routing of a host forward: io's precomputed top-k (checked) or the reference router on its
 * logits. ids/wts: [M, top_k]. */
nvfp4moe_status nvfp4moe_routing_for_io(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                       const nvfp4moe_io *io, int32_t *ids, float *wts);

/* Pieces of nvfp4moe_weights_validate for backends that check device-resident weights: the NaN
 * block-scale error for flat index i of a [E, rows, kb] scale tensor, and the per-expert float
 * check (finite, and > 0 when positive) of n values already on the host. */
nvfp4moe_status nvfp4moe_scale_nan_error(const char *name, uint8_t code, int64_t i, int64_t rows, int64_t kb);
nvfp4moe_status nvfp4moe_check_per_expert(const char *name, const float *v, int64_t n, bool positive);

// ---- backends that run ----
//
// One per runnable oracle row (CPU_REFERENCE, MARLIN, EMULATION, ...). The oracle table in
// src/oracle/oracle.c points at these; a row whose impl is NULL is "not available in this build".

typedef struct nvfp4moe_backend_impl {
    const char *name;          /* the oracle row's name, e.g. "CPU_REFERENCE" */
    bool device_memory;        /* forward() takes device pointers and a cudaStream_t */
    /* Numerics the backend computes with for a config of scheme s (MARLIN: always W4A16). */
    nvfp4moe_scheme (*effective_scheme)(nvfp4moe_scheme s);
    /* Prepares the weights (copies / converts them; w may be freed afterwards). */
    nvfp4moe_status (*create)(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                              bool weights_on_device, const nvfp4moe_device *dev, void **state);
    size_t (*workspace_size)(const void *state, int64_t num_tokens);
    nvfp4moe_status (*forward)(void *state, const nvfp4moe_io *io, void *stream);
    void (*destroy)(void *state);
} nvfp4moe_backend_impl;

extern const nvfp4moe_backend_impl nvfp4moe_impl_cpu_reference;
extern const nvfp4moe_backend_impl nvfp4moe_impl_cpu_fast;
#ifdef NVFP4MOE_HAVE_CUDA
extern const nvfp4moe_backend_impl nvfp4moe_impl_marlin;
extern const nvfp4moe_backend_impl nvfp4moe_impl_hopper_wgmma;
extern const nvfp4moe_backend_impl nvfp4moe_impl_emulation;
#endif

/* Looks up the runnable implementation of an oracle row by name (NULL: none in this build). */
const nvfp4moe_backend_impl *nvfp4moe_impl_find(const char *backend_name);

#endif // NVFP4MOE_INTERNAL_H
