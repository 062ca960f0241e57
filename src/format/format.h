/*
 * format.h - the codec's pieces the reference layer reuses (src/format/nvfp4.c). Not installed.
 */
#ifndef NVFP4MOE_FORMAT_H
#define NVFP4MOE_FORMAT_H

#include "core/internal.h"

/* Quantize-dequantize one row of n values (n % 16 == 0) with global scale gs, as vLLM's
 * ref_nvfp4_quant followed by dequantization, in float32. */
void nvfp4moe_qdq_row(const float *x, int64_t n, float gs, float *out);
/* MXFP8 (E4M3 elements, E8M0 scale per 32) quantize-dequantize of one row (n % 32 == 0). */
void nvfp4moe_mxfp8_qdq_row(const float *x, int64_t n, float *out);

#endif // NVFP4MOE_FORMAT_H
