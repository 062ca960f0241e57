// hopper_layout.cuh - the packed NVFP4 weight layout of the HOPPER_WGMMA backend and its
// in-register decode, shared by both of the backend's kernels: the wgmma grouped GEMM
// (kernels/hopper_gemm.cu, larger batches) and the decode kernel (kernels/hopper_decode.cu, small
// batches). One copy of the weights, packed once at plan creation by nvfp4moe_hopper_repack,
// serves both.
//
// Layout. Per (expert, n tile of 128 rows, k tile of 128) one contiguous 9216-byte chunk,
// chunks ordered [E][n_tiles][k_tiles]:
//   codes  8192 B  [16-row group gw 8][q 2][lane 32][16 B]: lane l (g = l/4, t = l%4) holds, for
//                  k16 step s = 4q + i, the 32-bit word i of its q-th 16-byte vector: exactly its
//                  m16n8k16 (mma.sync) / m64nNk16 (wgmma, warp gw%4 of warpgroup gw/4) A fragment
//                  of that step: rows 16gw+g and 16gw+g+8, k 2t,2t+1 and 2t+8,2t+9, as the pairs
//                  a0 = (row g, k 2t), a1 = (row g+8, k 2t), a2 = (row g, k 2t+8),
//                  a3 = (row g+8, k 2t+8), i.e. the a0..a3 registers; which bit of the word holds
//                  which bit of the 8 codes is kernels/hopper_bits.h's layout (it differs between
//                  bf16 and fp16 activations, so the repack is told the dtype).
//   scales 1024 B  [gw 8][g 8][s 8][h 2]: the scale byte of row 16gw+g+8h, k group s.
// N is padded to 128 and K to 128 with zero codes.
//
// Decode (no LUT). An E2M1 code s|e1 e0|m moved to bf16 bits s<<15 | (e1 e0 m)<<6 is exactly
// value * 2^-126 (0.5 becomes a bf16 subnormal), to fp16 bits s<<15 | mag<<9 value * 2^-14.
// The repack re-encodes each E4M3 scale as an unsigned byte u = Eb<<3 | M such that bf16 bits
// (u<<4) + (232<<7) are sf * 2^119 and fp16 bits (u<<7) + (8<<10) are sf * 2^7 (E4M3 subnormals
// become normal; Eb is 5..22, so neither the exponent nor the sign overflows). One HMUL2 then
// gives W * sf * 2^-7 EXACTLY in both types (W*sf has <= 6 significant bits); the 2^7
// (kAccUnscale) and the expert's scale_2 are applied to the fp32 accumulator in the epilogue.
// Zero scales zero the codes, negative scales flip the code signs (both exact).
#ifndef NVFP4MOE_HOPPER_LAYOUT_CUH
#define NVFP4MOE_HOPPER_LAYOUT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "hopper_bits.h"
#include "nvfp4_dev.cuh"

namespace nvfp4moe_hopper {

constexpr int kTK = 128;                           // K values per chunk (8 k16 steps, 8 scale groups)
constexpr int kTN = 128;                           // weight rows per chunk (8 groups of 16)
constexpr int kCodeBytes = kTN * kTK / 2;          // 8192
constexpr int kScaleBytes = kTN * kTK / 16;        // 1024
constexpr int kWChunk = kCodeBytes + kScaleBytes;  // 9216
constexpr int kGroupCodeBytes = 1024;              // one 16-row group's codes in a chunk
constexpr int kGroupScaleBytes = 128;              // one 16-row group's scales in a chunk
constexpr uint8_t kScaleDontCare = 5 << 3;         // Eb = 5: any valid scale, used where codes are 0
constexpr float kAccUnscale = 128.0f;              // 2^7: the decoded product is W*sf*2^-7

inline int n_tiles_of(int N) { return (N + kTN - 1) / kTN; }
inline int k_tiles_of(int K) { return (K + kTK - 1) / kTK; }

// Byte offset of k tile kt of the 16-row group holding row `row` (a multiple of 16) of expert e.
__host__ __device__ __forceinline__ size_t group_offset(int e, int row, int kt, int n_tiles, int k_tiles) {
    return ((size_t)(e * n_tiles + row / kTN) * k_tiles + kt) * kWChunk;
}

// E4M3 magnitude (non-zero) -> the kernel's scale byte Eb<<3 | M (see the top comment).
__device__ __forceinline__ uint8_t scale_code(uint32_t mag) {
    const int ex = int(mag >> 3);
    int m = int(mag & 7), eb;
    if (ex > 0) {
        eb = ex + 7;                       // bf16 exponent ex + 239 = Eb + 232
    } else {                               // subnormal m * 2^-9: normalize
        const int msb = 31 - __clz(m);
        eb = msb + 5;                      // bf16 exponent msb + 237
        m = (m << (3 - msb)) & 7;
    }
    return uint8_t((eb << 3) | m);
}

// Scale bytes B (row g) and B+1 (row g+8) of word w -> the two 16-bit floats [row g | row g+8]
// (sf*2^119 bf16, sf*2^7 fp16): one PRMT and one IMAD for both rows. The HMUL2 that applies them
// picks its half with an operand selector (.H0_H0 / .H1_H1), so no per-row broadcast is built.
template <bool BF16, int B>
__device__ __forceinline__ uint32_t expand_scales(uint32_t w) {
    constexpr uint32_t kSel = B | (4 << 4) | ((B + 1) << 8) | (4 << 12);  // bytes [b, 0, b+1, 0]
    const uint32_t x = __byte_perm(w, 0u, kSel);
    return BF16 ? x * 16u + ((232u << 7) | (232u << 23)) : x * 128u + ((8u << 10) | (8u << 26));
}

// a * (low or high half of s, broadcast), as 16-bit float pairs in 32-bit registers.
template <bool BF16, bool HIGH>
__device__ __forceinline__ uint32_t hmul2_half(uint32_t a, uint32_t s) {
    uint32_t r;
    if constexpr (BF16) {
        const __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162 *>(&a);
        const __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162 *>(&s);
        const __nv_bfloat162 z = __hmul2(x, HIGH ? __high2bfloat162(y) : __low2bfloat162(y));
        r = *reinterpret_cast<const uint32_t *>(&z);
    } else {
        const __half2 x = *reinterpret_cast<__half2 *>(&a);
        const __half2 y = *reinterpret_cast<__half2 *>(&s);
        const __half2 z = __hmul2(x, HIGH ? __high2half2(y) : __low2half2(y));
        r = *reinterpret_cast<const uint32_t *>(&z);
    }
    return r;
}

template <bool BF16>
__device__ __forceinline__ uint16_t to_half_bits(float x) {
    if constexpr (BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    else return __half_as_ushort(__float2half_rn(x));
}

// One k16 step's A fragment: word q of codes (bits placed by kernels/hopper_bits.h), scale bytes
// SB (row g) and SB+1 (row g+8) of sw. 8 (bf16) / 9 (fp16) integer operations move the codes'
// bits, PRMT + IMAD expand the two scales, 4 HMUL2 apply them.
template <bool BF16, int SB>
__device__ __forceinline__ void decode_step(uint32_t q, uint32_t sw, uint32_t (&a)[4]) {
    const uint32_t sc = expand_scales<BF16, SB>(sw);  // [row g | row g + 8]
    uint32_t d[4];
    if constexpr (BF16) nvfp4moe_hbits_decode_bf16(q, d);
    else nvfp4moe_hbits_decode_fp16(q, d);
    a[0] = hmul2_half<BF16, false>(d[0], sc);
    a[1] = hmul2_half<BF16, true>(d[1], sc);
    a[2] = hmul2_half<BF16, false>(d[2], sc);
    a[3] = hmul2_half<BF16, true>(d[3], sc);
}

}  // namespace nvfp4moe_hopper

#endif  // NVFP4MOE_HOPPER_LAYOUT_CUH
