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
/* MXFP8 (E4M3 elements, E8M0 scale per 32) quantize-dequantize of one row (n % 32 == 0). */
void nvfp4moe_mxfp8_qdq_row(const float *x, int64_t n, float *out);

#endif // NVFP4MOE_FORMAT_H
