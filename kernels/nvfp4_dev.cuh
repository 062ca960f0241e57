// nvfp4_dev.cuh - the FP4 device helpers every GPU kernel shares: NVFP4 element/scale decoders,
// 16-bit <-> float conversions, and the GEMMs' register-level E2M1 decode. (The activation
// quantize-dequantize is EMULATION's alone: kernels/emulation.cu.)
#ifndef NVFP4MOE_NVFP4_DEV_CUH
#define NVFP4MOE_NVFP4_DEV_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

namespace nvfp4moe_dev {

// E2M1 magnitudes 2..7 have the float bit pattern 0x3F000000 + (mag << 22); 0 and 0.5 are special.
__device__ __forceinline__ float e2m1_decode(unsigned code) {
    const unsigned mag = code & 7u;
    float v = mag == 0 ? 0.0f : mag == 1 ? 0.5f : __uint_as_float(0x3F000000u + (mag << 22));
    return (code & 8u) ? -v : v;
}

__device__ __forceinline__ float e4m3_decode(unsigned code) {
    const unsigned exp = (code >> 3) & 15u, man = code & 7u;
    float v = exp == 0 ? (float)man * 0.001953125f : __uint_as_float(((exp + 120u) << 23) | (man << 20));
    if ((code & 0x7Fu) == 0x7Fu) v = __uint_as_float(0x7FC00000u);
    return (code & 0x80u) ? -v : v;
}

template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <typename T> __device__ __forceinline__ float round_t(float x) { return to_f<T>(from_f<T>(x)); }

// 8 consecutive 16-bit values (16 bytes, must be 16-byte aligned) <-> floats.
template <typename T> __device__ __forceinline__ void load8(const T *p, float *v) {
    const uint4 u = *reinterpret_cast<const uint4 *>(p);
    const T *h = reinterpret_cast<const T *>(&u);
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = to_f<T>(h[i]);
}
template <typename T> __device__ __forceinline__ void store8(T *p, const float *v) {
    uint4 u;
    T *h = reinterpret_cast<T *>(&u);
#pragma unroll
    for (int i = 0; i < 8; i++) h[i] = from_f<T>(v[i]);
    *reinterpret_cast<uint4 *>(p) = u;
}

// 16 consecutive 16-bit values (two 16-byte halves) <-> floats.
template <typename T> __device__ __forceinline__ void load16(const T *p, float *v) {
    load8<T>(p, v);
    load8<T>(p + 8, v + 8);
}
template <typename T> __device__ __forceinline__ void store16(T *p, const float *v) {
    store8<T>(p, v);
    store8<T>(p + 8, v + 8);
}

// The block of 16 values of a row-major [rows, cols] matrix (cols % 16 == 0) that element-wise
// thread idx owns: its row r and the offset of its first value; false past the end.
__device__ __forceinline__ bool block16_of(int64_t idx, int64_t rows, int cols, int64_t *r, int64_t *o) {
    const int bpr = cols / 16;
    if (idx >= rows * bpr) return false;
    *r = idx / bpr;
    *o = *r * cols + (idx % bpr) * 16;
    return true;
}

// ---- the E2M1 decode of MARLIN's weight fragments (HOPPER_WGMMA has its own: hopper_bits.h) ----

// Pair J of word q (nibbles J and J+4) -> two 16-bit floats: value * 2^-126 (bf16) / 2^-14 (fp16);
// the GEMM applies the scale, whose bias makes up the exponent. The sign (nibble bit 3) must land
// on bit 15 (31) and the magnitude (bits 0..2) on bits 6..8 (bf16) or 9..11 (fp16). At M = 1 the
// GEMMs are bound by the integer (ALU) pipe, so the bit moves put work on the FMA pipe: for bf16
// one IMAD makes both shifted copies of the isolated nibble pair at once (x * (2^a + 2^b); the
// copies never overlap, so the add never carries), leaving 2 ALU ops per pair. Pairs 2 and 3 read
// q8 = q >> 8 (one shift per word) because a multiply cannot shift right. fp16's two copies would
// overlap by one bit, so it ORs two shifts.
template <bool BF16, int J>
__device__ __forceinline__ uint32_t decode_pair(uint32_t q, uint32_t q8) {
    constexpr int jj = J & 1;
    const uint32_t x = (J < 2 ? q : q8) & (0x000F000Fu << (4 * jj));
    if constexpr (BF16) {
        constexpr uint32_t kCopies = (1u << (12 - 4 * jj)) + (1u << (6 - 4 * jj));
        return (x * kCopies) & 0x81C081C0u;
    } else {
        return ((x << (9 - 4 * jj)) | (x << (12 - 4 * jj))) & 0x8E008E00u;
    }
}

}  // namespace nvfp4moe_dev

#endif  // NVFP4MOE_NVFP4_DEV_CUH
