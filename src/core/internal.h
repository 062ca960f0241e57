/*
 * internal.h - the core every part of the library uses: errors, small helpers, the weights checks
 * and the parallel layout's rules. Not installed.
 */
#ifndef NVFP4MOE_INTERNAL_H
#define NVFP4MOE_INTERNAL_H

#include "nvfp4moe.h"

#include <stdarg.h>
#include <stdio.h>

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

/* "Did you mean": the known name closest to what was typed. Feed every candidate to
 * nvfp4moe_suggest_add; nvfp4moe_suggest_best then gives the nearest one, or NULL when none is
 * near enough to be a likely typo. Names are compared as nvfp4moe_name_eq does (case-insensitive,
 * '-' and '_' equivalent); the distance is the edit distance with adjacent transpositions
 * ("marlni" -> "marlin" is 1), at most 1 for words of 4 or 5 characters, 2 up to 8, 3 beyond, and
 * 0 for shorter words (too many names are one letter from them); a word of 3 or more characters
 * that is the start of exactly one candidate ("hidden" for "hidden-size") is suggested too.
 * Deterministic: ties go to the first candidate added. */
typedef struct nvfp4moe_suggest {
    const char *typed;
    const char *best;      /* nearest so far */
    int dist;              /* its distance */
    const char *prefix_of; /* the one candidate typed begins, NULL if none or several */
    int prefixes;
} nvfp4moe_suggest;
void nvfp4moe_suggest_init(nvfp4moe_suggest *s, const char *typed);
void nvfp4moe_suggest_add(nvfp4moe_suggest *s, const char *candidate);
const char *nvfp4moe_suggest_best(const nvfp4moe_suggest *s);


/* Rounds x through dtype (bf16/fp16/f32) and back. */
float nvfp4moe_round_to_dtype(nvfp4moe_dtype dt, float x);
/* nvfp4moe_round_to_dtype on each of x[0, n), in place. */
void nvfp4moe_round_row_to_dtype(nvfp4moe_dtype dt, float *x, int64_t n);

/* splitmix64: the library's one pseudo-random generator (deterministic in its state). */
uint64_t nvfp4moe_rand_u64(uint64_t *state);
/* Uniform in [0, 1). */
double nvfp4moe_rand_uniform(uint64_t *state);
/* Standard normal (Box-Muller). */
double nvfp4moe_rand_normal(uint64_t *state);

// ---- devices (src/core/device.c) ----

/* CUDA GPU `ordinal` of this process (-1: the calling thread's current device), as
 * nvfp4moe_device_detect describes the first one. UNSUPPORTED when there is none or this is a
 * CPU-only build, NOT_FOUND for an ordinal past the last GPU. */
nvfp4moe_status nvfp4moe_device_detect_cuda(int32_t ordinal, nvfp4moe_device *dev);

// ---- files (src/core/files.c) ----

/* Opens path read-only if it is a regular file, without blocking on anything else (a FIFO would
 * wait for a writer forever): IO "not a regular file" for FIFOs, devices, sockets and directories,
 * NOT_FOUND when it does not exist. *size: its size now. */
nvfp4moe_status nvfp4moe_open_regular(const char *path, int *fd, uint64_t *size);

/* Reads a whole (small) regular file: config.json and friends. *out is NUL-terminated, caller
 * frees. Files over max_bytes are a FORMAT error. */
nvfp4moe_status nvfp4moe_read_text_file(const char *path, size_t max_bytes, char **out);

/* Writes text to path through path.tmp: written, fsynced, renamed over path, and the directory
 * fsynced, so that path holds the old text or the new one even across a crash. */
nvfp4moe_status nvfp4moe_write_text_file(const char *path, const char *text);

/* The end of such a write: flushes, fsyncs and closes f (open on tmp), renames tmp to path and
 * fsyncs path's directory; removes tmp on failure. IO naming path. */
nvfp4moe_status nvfp4moe_commit_file(FILE *f, const char *tmp, const char *path);

/* fsync of the directory holding path (a rename is durable once its directory is). */
nvfp4moe_status nvfp4moe_sync_parent_dir(const char *path);

// ---- handles (src/core/handles.c) ----

/* The objects the library hands out and takes back through a *_free / *_destroy / *_close. */
typedef enum nvfp4moe_handle_kind {
    NVFP4MOE_HANDLE_LAYER = 1, NVFP4MOE_HANDLE_PLAN, NVFP4MOE_HANDLE_ST_FILE, NVFP4MOE_HANDLE_ST_MODEL,
    NVFP4MOE_HANDLE_ST_WRITER, NVFP4MOE_HANDLE_MODEL_INFO, NVFP4MOE_HANDLE_CKPT_LAYER,
    NVFP4MOE_HANDLE_FLOAT_LAYER, NVFP4MOE_HANDLE_EP_DISPATCH, NVFP4MOE_HANDLE_EP_LOOPBACK,
    NVFP4MOE_HANDLE_EP_PLAN,
} nvfp4moe_handle_kind;

/* Records p as a live object of this kind: right after allocating it, so that every cleanup path,
 * the creator's own included, goes through the public free function. OUT_OF_MEMORY when the table
 * cannot grow (the caller then frees p itself). */
nvfp4moe_status nvfp4moe_handle_add(const void *p, nvfp4moe_handle_kind kind);
/* Forgets p. True when it was live and of this kind; false for NULL, a pointer freed already or
 * never handed out, or an object of another kind: the free functions then do nothing. */
bool nvfp4moe_handle_remove(const void *p, nvfp4moe_handle_kind kind);
/* Whether p is a live object of this kind (functions that take an object check it). */
bool nvfp4moe_handle_live(const void *p, nvfp4moe_handle_kind kind);

// ---- weights (src/core/weights.c) ----

/* Pieces of nvfp4moe_weights_validate for backends that check device-resident weights: the NaN
 * block-scale error for flat index i of a [E, rows, kb] scale tensor, and the per-expert float
 * check (finite, and > 0 when positive) of n values already on the host. */
nvfp4moe_status nvfp4moe_scale_nan_error(const char *name, uint8_t code, int64_t i, int64_t rows, int64_t kb);
nvfp4moe_status nvfp4moe_check_per_expert(const char *name, const float *v, int64_t n, bool positive);

/* Which half of GEMM1's output canonical w13 row `row` belongs to: 1 for an up row of a gated
 * activation (rows [I, 2I), or the odd rows of swigluoai's interleaved layout), else 0 (gate rows,
 * and every row of a non-gated activation). */
static inline int nvfp4moe_w13_row_half(const nvfp4moe_config *cfg, int64_t row) {
    if (!nvfp4moe_activation_is_gated(cfg->activation)) return 0;
    if (cfg->activation == NVFP4MOE_ACT_SWIGLUOAI) return (int)(row & 1);
    return row >= cfg->intermediate_size;
}
/* The dequantization scale of expert e's w13 half (0 gate, 1 up): w13_up_scale_2[e] for the up
 * half when given, else w13_scale_2[e]. */
static inline float nvfp4moe_w13_half_scale_2(const nvfp4moe_weights *w, int64_t e, int half) {
    return half && w->w13_up_scale_2 ? w->w13_up_scale_2[e] : w->w13_scale_2[e];
}

// ---- the deployment's parallel layout (src/core/config.c) ----

/* vLLM's use_all2all_kernels: expert parallelism (ep_size > 1) with data parallelism (dp_size > 1). */
bool nvfp4moe_config_uses_all2all(const nvfp4moe_config *cfg);
/* The all2all backends whose kernels take the BatchedExperts activation format (DeepEP
 * low-latency, NIXL EP), when all2all is used. The oracle's format and EP's dispatch read it. */
bool nvfp4moe_config_batched_format(const nvfp4moe_config *cfg);

#endif // NVFP4MOE_INTERNAL_H
