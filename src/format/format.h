/*
 * format.h - the codec's pieces the reference layer reuses (src/format/nvfp4.c). Not installed.
 */
#ifndef NVFP4MOE_FORMAT_H
#define NVFP4MOE_FORMAT_H

#include "core/internal.h"

/* Quantize-dequantize one row of n values (n % 16 == 0) with quantizer q and tensor scale ts (its
 * form: see nvfp4moe_quantizer), dequantized in the quantizer's source form (vLLM: e2m1 * (s / gs),
 * ModelOpt: e2m1 * (sf * scale_2)) in float32 and rounded to out_dt (F32: kept as computed).
 * In place (out == x) is safe. */
void nvfp4moe_qdq_row_as(nvfp4moe_quantizer q, const float *x, int64_t n, float ts, nvfp4moe_dtype out_dt,
                         float *out);
/* The VLLM_TRITON quantize-dequantize with its two divisions as the GPU computes them (Triton's '/'
 * is div.full.f32: one reciprocal of the divisor, then one correctly rounded product, as measured
 * on the H100): the output scale ts / s as fl(ts * fl(1 / s)) (the GPU's reciprocal of an E4M3
 * value is the correctly rounded one) and the step s / ts as fl(s * *rcp_ts), rcp_ts being the
 * GPU's reciprocal of ts (correctly rounded or one ulp off: only the GPU says which;
 * kernels/emulation.h nvfp4moe_emul_triton_rcp asks it). rcp_ts NULL: IEEE divisions, the
 * quantizer's own (nvfp4moe_qdq_row_as). For judging the GPU's EMULATION path. */
void nvfp4moe_qdq_row_triton(const float *x, int64_t n, float ts, const float *rcp_ts, nvfp4moe_dtype out_dt,
                             float *out);
/* MXFP8 (E4M3 elements, E8M0 scale per 32) quantize-dequantize of one row (n % 32 == 0). */
void nvfp4moe_mxfp8_qdq_row(const float *x, int64_t n, float *out);

// ---- a sharded safetensors model written tensor by tensor (safetensors.c) ----
//
// Every tensor is declared first (name, dtype, shape), in the order the files will hold them; the
// layout then splits them into shards (Hugging Face's rule: a new shard when the next tensor would
// take the current one past max_shard_bytes; a tensor larger than that gets a shard of its own),
// creates the files in a directory (model.safetensors when there is one shard, else
// model-0000i-of-0000N.safetensors and model.safetensors.index.json) and writes their headers. The
// tensors' bytes then go to their places in any order, each byte once; finishing checks that every
// tensor was written whole, fsyncs the files and writes the index. Memory: the names and the
// headers, never the data.

typedef struct nvfp4moe_st_shards nvfp4moe_st_shards;

nvfp4moe_status nvfp4moe_st_shards_create(nvfp4moe_st_shards **out);
/* Declares tensor `name` (a new, valid name); *index gets its number. */
nvfp4moe_status nvfp4moe_st_shards_add(nvfp4moe_st_shards *s, const char *name, nvfp4moe_st_dtype dtype,
                                       int32_t ndim, const int64_t *shape, int64_t *index);
uint64_t nvfp4moe_st_shards_bytes(const nvfp4moe_st_shards *s, int64_t index);
const char *nvfp4moe_st_shards_name(const nvfp4moe_st_shards *s, int64_t index);
int64_t nvfp4moe_st_shards_count(const nvfp4moe_st_shards *s);
/* Splits into shards of at most max_shard_bytes (> 0) of tensor data, creates the files in dir
 * (none may exist) and writes their headers (with __metadata__ {"format": "pt"}). */
nvfp4moe_status nvfp4moe_st_shards_layout(nvfp4moe_st_shards *s, uint64_t max_shard_bytes, const char *dir);
int32_t nvfp4moe_st_shards_files(const nvfp4moe_st_shards *s);
/* Writes n bytes of tensor `index` at byte offset `offset` of its data (pwrite). */
nvfp4moe_status nvfp4moe_st_shards_write(nvfp4moe_st_shards *s, int64_t index, uint64_t offset, const void *data,
                                         uint64_t n);
/* Checks that every tensor was written whole, fsyncs and closes the files, writes the index (more
 * than one shard). */
nvfp4moe_status nvfp4moe_st_shards_finish(nvfp4moe_st_shards *s);
/* Makes a finished s remove its files (and index) when freed, as an unfinished one does. */
void nvfp4moe_st_shards_discard(nvfp4moe_st_shards *s);
/* Frees s; the files of a layout that was not finished are removed. */
void nvfp4moe_st_shards_free(nvfp4moe_st_shards *s);

#endif // NVFP4MOE_FORMAT_H
