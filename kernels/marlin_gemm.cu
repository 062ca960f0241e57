/*
 * marlin_gemm.cu - the MARLIN-class W4A16 fused MoE GEMM: NVFP4 weights (E2M1 codes, one E4M3
 * scale per 16 K elements, one fp32 scale_2 per expert) times bf16/fp16 activations gathered row
 * by row through the moe-align grouping (sorted_ids / block_expert / num_blocks), on tensor cores
 * with mma.sync.m16n8k16 and fp32 accumulation. Runs on sm_80+ (the H200 runs this Ampere path).
 * Interface: kernels/moe_gemm.h.
 *
 * Design
 * ------
 * Weight layout (nvfp4moe_marlin_repack, once per plan). The weights of an expert are cut into
 * "atoms" of 16 columns (N) x 64 K values: 1024 codes = 512 bytes = 32 lanes x 16 bytes. Lane l
 * (g = l/4, t = l%4) holds exactly the B fragments of mma.m16n8k16 it needs for the two n8 tiles
 * of the atom (columns g and g+8) and the four k16 steps of the atom: 32-bit word w is k16 step w,
 * and in it nibble j / j+4 are the low / high halves of pair j, with
 *     pair 0: col g,   k 2t,2t+1      pair 1: col g,   k 2t+8,2t+9
 *     pair 2: col g+8, k 2t,2t+1      pair 3: col g+8, k 2t+8,2t+9
 * so one conflict-free 16-byte LDS per lane per atom feeds 8 MMAs' B operands. Atoms are stored
 * [E][K/64][N/16]: one K tile of a CTA's N tile is a contiguous run of TN/16 * 512 bytes, so the
 * cp.async loads are 16 bytes wide and fully coalesced. N is never padded (N % 16 == 0 is one atom
 * column); K is padded to 64 with zero codes, and the A tail is zero-filled by cp.async.
 *
 * Scales. Each atom has 64 scale bytes: for g, 8 bytes [w][h] = scale(col g + 8h, k group w); a
 * lane reads its 8 bytes with one broadcast LDS.64. The repack re-encodes E4M3 into an unsigned
 * "E5M3" byte (exponent e + 10 in bits 7..3, 3 mantissa bits) in which E4M3 subnormals become
 * normal, so the kernel expands a scale to a bf16x2 / fp16x2 pair with one PRMT and one IMAD (add
 * an exponent offset). Zero scales zero the group's codes (so the scale byte is irrelevant) and
 * negative scales flip the codes' sign bits: both exact.
 *
 * Decode (no LUT). An E2M1 code s|e1 e0|m placed as bf16 bits s<<15 | (e1 e0 m)<<6 is exactly
 * value * 2^-126 (the subnormal 0.5 lands on a bf16 subnormal), and as fp16 bits s<<15 | mag<<9 it
 * is value * 2^-14. The scale pair is built as sf * 2^119 (bf16) or sf * 2^7 (fp16), so one HMUL2
 * gives W*sf*2^-7 EXACTLY in both types (W*sf has <= 6 significant bits and lies in
 * [2^-10, 2688]); the remaining 2^7 and the expert's fp32 scale_2 are applied to the fp32
 * accumulator in the epilogue, so nothing underflows in bf16 or overflows in fp16 (the two vLLM
 * Marlin NVFP4 bugs).
 *
 * A operand: gathered rows (A row = pair / a_row_div; sentinel rows are zero-filled) land in shared
 * memory with a 16-byte-chunk XOR swizzle (chunk ^ (row & 7)) so the ldmatrix.x4 reads of 8 rows
 * hit 8 different bank groups. block_m = 8 uses ldmatrix.x2 and the upper half of the m16 tile is 0.
 *
 * Work partition. A work unit is (block of sorted rows, N tile); its K loop has k_iters steps of
 * TK. The CTAs of a fixed grid (SMs x occupancy, never sized from num_blocks, so graph capture
 * works) read num_blocks on the device and take equal contiguous ranges of the flattened
 * [unit][k step] space ("stream-K"). A CTA's cp.async pipeline (STAGES deep) runs straight across
 * unit boundaries, so decode at M = 1 keeps many loads in flight on every SM even though only 8
 * experts are active. A unit a CTA covers whole is written directly; a unit split between CTAs is
 * summed in an fp32 workspace with red.add, and the CTA that completes its k count (a per-unit
 * counter) applies the epilogue. When the workspace would be too large (large P) the ranges are
 * rounded to whole units instead and no workspace is used.
 *
 * Graph capture: a launch is a cudaMemsetAsync of the workspace (stream-K only) and one kernel; the
 * first call of each (block_m, dtype) also sets the kernel's shared-memory limit and reads its
 * occupancy (cached), so make one call before capturing.
 *
 * Numerics: the product W*sf is exact in bf16/fp16, the MMA accumulates in fp32, scale_2 * 2^7,
 * bias and row_scale are applied in fp32, and the output is rounded once (RNE) to bf16/fp16. NaN
 * block scales (0x7F/0xFF) are not supported (they decode as 480).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "moe_gemm.h"
#include "nvfp4_dev.cuh"

namespace {

using nvfp4moe_dev::decode_pair;

constexpr int kWarp = 32;
constexpr int kAtomN = 16;          // columns per atom
constexpr int kAtomK = 64;          // K values per atom
constexpr int kAtomBytes = 512;     // 16 x 64 codes, 4 bits each
constexpr int kAtomScaleBytes = 64; // 16 columns x 4 groups of 16
constexpr float kAccUnscale = 128.0f; // 2^7: the decoded product is W*sf*2^-7
// Scale byte -> 16-bit float: exponent offsets added to the E5M3 byte (see the top comment).
constexpr uint32_t kScaleBiasBf16 = (236u << 7) | (236u << 23); // bf16 exp = E5 + 236 -> sf*2^119
constexpr uint32_t kScaleBiasFp16 = (12u << 10) | (12u << 26);  // fp16 exp = E5 + 12  -> sf*2^7
constexpr uint8_t kScaleDontCare = 0x08;  // E5 = 1: used where the group's codes are all zero
// Stream-K needs P*N*4 bytes of fp32 partial sums; above this the partition uses whole units.
constexpr size_t kMaxStreamKBytes = size_t(64) << 20;
constexpr int kMinTileN = 64;       // smallest TN of the configs: sizes the counter array

// ---- tile configurations ------------------------------------------------------------------
template <int BM_, int WARPS_, int NA_, int KA_, int STAGES_, int MINB_>
struct Cfg {
    static constexpr int BM = BM_;                     // rows of a sorted block (= block_m)
    static constexpr int MT = (BM + 15) / 16;          // m16 tiles
    static constexpr int WARPS = WARPS_;               // warps split N
    static constexpr int THREADS = WARPS * kWarp;
    static constexpr int NA = NA_;                     // atoms (16 columns) per warp
    static constexpr int TN = WARPS * NA * kAtomN;     // N tile
    static constexpr int KA = KA_;                     // atoms along K per stage
    static constexpr int TK = KA * kAtomK;             // K tile
    static constexpr int STAGES = STAGES_;
    static constexpr int MIN_CTAS = MINB_;             // __launch_bounds__ occupancy target
    static constexpr int ATOMS_N = TN / kAtomN;
    static constexpr int A_ROW_BYTES = TK * 2;
    static constexpr int A_CHUNKS_ROW = TK / 8;        // 16-byte chunks per A row
    static constexpr int A_STAGE = BM * A_ROW_BYTES;
    static constexpr int B_STAGE = KA * ATOMS_N * kAtomBytes;
    static constexpr int S_STAGE = KA * ATOMS_N * kAtomScaleBytes;
    static constexpr int STAGE = A_STAGE + B_STAGE + S_STAGE;
    static constexpr int SMEM = STAGES * STAGE;

    static_assert(BM == 8 || BM % 16 == 0, "block_m is 8 or a multiple of 16");
    static_assert(A_CHUNKS_ROW >= 8, "the XOR swizzle needs >= 8 chunks per A row");
    static_assert(A_STAGE % 16 == 0 && B_STAGE % 16 == 0 && S_STAGE % 16 == 0, "16-byte stages");
    static_assert(SMEM <= 227 * 1024, "shared memory per CTA on sm_90 (sm_80: 163 KB)");
    static_assert(SMEM <= 163 * 1024, "must also fit an sm_80 CTA");
    static_assert(STAGES >= 2, "pipeline");
};

// The tile is chosen by block_m (the grouping fixes it; nvfp4moe_marlin_block_m picks it from
// P / E as vLLM does). Measured on the H200, 2026-12-02, DeepSeek-V3 GEMM1 + GEMM2, cold L2
// (bench/results/2026-12-02-h200-marlin-gemm.md):
//
// Decode-bound small batches (block_m 8/16): narrow N tiles (64) and a long K tile (128) so that
// 4-5 CTAs per SM each keep 5 x 4.6 KB of weights in flight. M = 1: 118 us (1.68 TB/s);
// M = 16..256: 2.0-2.1 TB/s, where the integer pipe (FP4 decode) is the suspected cap.
using CfgM8 = Cfg<8, 4, 1, 2, 6, 4>;
using CfgM16 = Cfg<16, 4, 1, 2, 6, 4>;
// Mid batches: 128-column tiles, 2 atoms per warp (each A fragment feeds 4 MMAs). M = 1024
// (block_m 48): 4.80 ms, 150 TFLOP/s.
using CfgM32 = Cfg<32, 4, 2, 1, 4, 3>;
using CfgM48 = Cfg<48, 4, 2, 1, 4, 3>;
// Compute-bound (block_m 64): 64 x 128 tiles, 8 warps of 64 x 16, K tile 128, 3 stages (75 KB,
// 2 CTAs per SM). Measured at M = 4096 against the other candidates (tuning builds,
// -DNVFP4MOE_MARLIN_M64_VARIANT=n), same session (the default and 3 pass gpu_marlin_gemm; 1 and 2
// were only timed):
//   default 8,1,2,3,2: 195 TFLOP/s     3: 8,2,1,4,2 (64 x 256, TK 64, 4 stages, small spill): 183
//   1: 8,2,1,4,1 (190 regs, 1 CTA/SM): 178     2: 8,1,1,4,2 (64 x 128, TK 64): 176
// The spread is small: the tile shape is not what limits large M (see the bench results).
#if NVFP4MOE_MARLIN_M64_VARIANT == 1
using CfgM64 = Cfg<64, 8, 2, 1, 4, 1>;
#elif NVFP4MOE_MARLIN_M64_VARIANT == 2
using CfgM64 = Cfg<64, 8, 1, 1, 4, 2>;
#elif NVFP4MOE_MARLIN_M64_VARIANT == 3
using CfgM64 = Cfg<64, 8, 2, 1, 4, 2>;
#else
using CfgM64 = Cfg<64, 8, 1, 2, 3, 2>;
#endif

struct Params {
    const uint16_t *a;
    const uint8_t *bw;     // atoms
    const uint8_t *bs;     // atom scales
    const float *scale_2;
    const float *bias;
    const float *row_scale;
    uint16_t *c;
    const int32_t *sorted_ids;
    const int32_t *block_expert;
    const int32_t *num_blocks;
    float *ws;             // stream-K partial sums [P, N] (zeroed by the launcher) or NULL
    int32_t *counters;     // stream-K per-unit k counts (zeroed by the launcher)
    int a_row_div;
    int P, N, K;
    int KT, NB;            // atoms along K (padded K / 64) and along N (N / 16)
    int n_tiles, k_iters;
    int max_blocks;
    int streamk;
    int halves;            // scale_2: 0 [E]; 1 [E, 2] stacked gate/up halves; 2 [E, 2] interleaved
};

// ---- small PTX helpers --------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 zero-fills the destination without reading src.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
// Weights: plain cp.async.cg (L1 bypass). An evict-first L2::cache_hint variant of the zero-fill
// form was tried first: ptxas 13.0 encoded it with an odd uniform descriptor register and the
// H200 raised "illegal instruction" (2026-12-02), so the hint is left out.
__device__ __forceinline__ void cp_async16_ef(uint32_t dst, const void *src, bool valid,
                                              uint64_t pol) {
    (void)pol;
    cp_async16(dst, src, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                        uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(addr));
}

template <bool BF16>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    if constexpr (BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}


// Scale byte B of word sw -> the same 16-bit float in both halves (sf*2^119 bf16, sf*2^7 fp16).
template <bool BF16, int B>
__device__ __forceinline__ uint32_t expand_scale(uint32_t sw) {
    constexpr uint32_t kSel = B | (4 << 4) | (B << 8) | (4 << 12);  // [b, 0, b, 0]
    uint32_t x = __byte_perm(sw, 0u, kSel);
    return BF16 ? x * 16u + kScaleBiasBf16 : x * 128u + kScaleBiasFp16;
}

template <bool BF16>
__device__ __forceinline__ uint32_t hmul2_u32(uint32_t a, uint32_t b) {
    uint32_t r;
    if constexpr (BF16) {
        __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162 *>(&a);
        __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162 *>(&b);
        __nv_bfloat162 z = __hmul2(x, y);
        r = *reinterpret_cast<uint32_t *>(&z);
    } else {
        __half2 x = *reinterpret_cast<__half2 *>(&a);
        __half2 y = *reinterpret_cast<__half2 *>(&b);
        __half2 z = __hmul2(x, y);
        r = *reinterpret_cast<uint32_t *>(&z);
    }
    return r;
}

template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
    uint32_t r;
    if constexpr (BF16) {
        __nv_bfloat162 z = __floats2bfloat162_rn(x, y);
        r = *reinterpret_cast<uint32_t *>(&z);
    } else {
        __half2 z = __floats2half2_rn(x, y);
        r = *reinterpret_cast<uint32_t *>(&z);
    }
    return r;
}

// ---- the GEMM kernel ----------------------------------------------------------------------
template <class C, bool BF16>
struct Kernel {
    using Acc = float[C::MT][C::NA * 2][4];

    static constexpr int kBIters = (C::B_STAGE / 16 + C::THREADS - 1) / C::THREADS;
    static constexpr int kSIters = (C::S_STAGE / 16 + C::THREADS - 1) / C::THREADS;
    static constexpr int kAChunks = C::BM * C::A_CHUNKS_ROW;
    static constexpr int kAIters = (kAChunks + C::THREADS - 1) / C::THREADS;

    // Position in the [block][N tile][k step] space, advanced by increments: no divisions and no
    // dependent global loads on the per-stage path.
    struct Cursor {
        int kk, nt, blk;
        __device__ __forceinline__ void init(const Params &p, long long it) {
            const long long u = it / p.k_iters;
            kk = int(it - u * p.k_iters);
            blk = int(u / p.n_tiles);
            nt = int(u - (long long)blk * p.n_tiles);
        }
        // Returns true when the block (so the expert and the A rows) changed.
        __device__ __forceinline__ bool advance(const Params &p) {
            if (++kk < p.k_iters) return false;
            kk = 0;
            if (++nt < p.n_tiles) return false;
            nt = 0;
            blk++;
            return true;
        }
    };

    // What the loader caches per block: the expert's atom base and this thread's A row pointers.
    struct BlockCache {
        const uint8_t *bw;   // expert's atoms, or NULL when the block has no expert
        const uint8_t *bs;
        const uint16_t *arow[kAIters];  // row start, or NULL for a sentinel row
        __device__ __forceinline__ void fill(const Params &p, int blk) {
            const int e = __ldg(p.block_expert + blk);
            const size_t e_atoms = size_t(e >= 0 ? e : 0) * p.KT * p.NB;
            bw = e >= 0 ? p.bw + e_atoms * kAtomBytes : nullptr;
            bs = e >= 0 ? p.bs + e_atoms * kAtomScaleBytes : nullptr;
#pragma unroll
            for (int i = 0; i < kAIters; i++) {
                const int ci = threadIdx.x + i * C::THREADS;
                const int r = ci / C::A_CHUNKS_ROW;
                arow[i] = nullptr;
                if (ci < kAChunks) {
                    const int pr = __ldg(p.sorted_ids + (size_t)blk * C::BM + r);
                    if (pr >= 0 && pr < p.P) arow[i] = p.a + (size_t)(pr / p.a_row_div) * p.K;
                }
            }
        }
    };

    // Issues the cp.async loads of the k step at cursor `cur` into stage buffer `st`.
    static __device__ __forceinline__ void load_stage(const Params &p, uint8_t *st,
                                                      const Cursor &cur, const BlockCache &bc,
                                                      uint64_t pol) {
        const int tid = threadIdx.x;
        const bool e_ok = bc.bw != nullptr;
        // Stage-uniform: first K atom and first N atom of this step; the atoms of one K atom row
        // of the tile are contiguous, so each chunk is base + a per-thread constant.
        const int kt0 = cur.kk * C::KA;
        const int nb0 = cur.nt * C::ATOMS_N;
        const size_t atom0 = (size_t)kt0 * p.NB + nb0;
        const uint8_t *b_stage = bc.bw + atom0 * kAtomBytes;
        const uint8_t *s_stage = bc.bs + atom0 * kAtomScaleBytes;
        // Weights: [ka][atom][lane chunk], contiguous in global for each ka.
        uint8_t *sb = st + C::A_STAGE;
#pragma unroll
        for (int i = 0; i < kBIters; i++) {
            const int ci = tid + i * C::THREADS;
            if (C::B_STAGE / 16 % C::THREADS == 0 || ci < C::B_STAGE / 16) {
                const int ka = ci / (C::ATOMS_N * 32);
                const int an = (ci / 32) % C::ATOMS_N;
                const int lc = ci % 32;
                // Loop-invariant per thread: ka, an, lc and their offset from the stage base.
                const bool ok = e_ok && kt0 + ka < p.KT && nb0 + an < p.NB;
                const uint8_t *src =
                    ok ? b_stage + (ka * p.NB + an) * kAtomBytes + lc * 16 : p.bw;
                cp_async16_ef(smem_u32(sb + ci * 16), src, ok, pol);
            }
        }
        // Scales: 4 chunks per atom.
        uint8_t *ss = sb + C::B_STAGE;
#pragma unroll
        for (int i = 0; i < kSIters; i++) {
            const int ci = tid + i * C::THREADS;
            if (ci < C::S_STAGE / 16) {
                const int ka = ci / (C::ATOMS_N * 4);
                const int an = (ci / 4) % C::ATOMS_N;
                const int part = ci % 4;
                const bool ok = e_ok && kt0 + ka < p.KT && nb0 + an < p.NB;
                const uint8_t *src =
                    ok ? s_stage + (ka * p.NB + an) * kAtomScaleBytes + part * 16 : p.bs;
                cp_async16_ef(smem_u32(ss + ci * 16), src, ok, pol);
            }
        }
        // Activations: gathered rows, swizzled 16-byte chunks, zero fill past K and for sentinels.
#pragma unroll
        for (int i = 0; i < kAIters; i++) {
            const int ci = tid + i * C::THREADS;
            if (kAChunks % C::THREADS == 0 || ci < kAChunks) {
                const int r = ci / C::A_CHUNKS_ROW;
                const int ch = ci % C::A_CHUNKS_ROW;
                const int k0 = cur.kk * C::TK + ch * 8;
                const bool ok = bc.arow[i] != nullptr && k0 < p.K;
                const uint16_t *src = ok ? bc.arow[i] + k0 : p.a;
                cp_async16(smem_u32(st + r * C::A_ROW_BYTES + ((ch ^ (r & 7)) << 4)), src, ok);
            }
        }
    }

    // One stage of MMAs for this warp.
    static __device__ __forceinline__ void compute_stage(const uint8_t *st, Acc &acc) {
        const int lane = threadIdx.x % kWarp;
        const int warp = threadIdx.x / kWarp;
        const int g = lane / 4;
        const uint32_t a_base = smem_u32(st);
        const uint8_t *sb = st + C::A_STAGE;
        const uint8_t *ss = sb + C::B_STAGE;
#pragma unroll
        for (int ka = 0; ka < C::KA; ka++) {
            uint4 bq[C::NA];
            uint2 sq[C::NA];
#pragma unroll
            for (int na = 0; na < C::NA; na++) {
                const int atom = ka * C::ATOMS_N + warp * C::NA + na;
                bq[na] = *reinterpret_cast<const uint4 *>(sb + atom * kAtomBytes + lane * 16);
                sq[na] = *reinterpret_cast<const uint2 *>(ss + atom * kAtomScaleBytes + g * 8);
            }
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const int kq = ka * 4 + w;  // k16 step within the stage
                uint32_t af[C::MT][4];
#pragma unroll
                for (int mt = 0; mt < C::MT; mt++) {
                    if constexpr (C::BM == 8) {
                        const int row = lane & 7;
                        const int ch = 2 * kq + ((lane >> 3) & 1);
                        ldsm_x2(a_base + row * C::A_ROW_BYTES + ((ch ^ (row & 7)) << 4), af[mt][0],
                                af[mt][2]);
                        af[mt][1] = 0u;
                        af[mt][3] = 0u;
                    } else {
                        const int row = mt * 16 + (lane & 15);
                        const int ch = 2 * kq + (lane >> 4);
                        ldsm_x4(a_base + row * C::A_ROW_BYTES + ((ch ^ (row & 7)) << 4), af[mt][0],
                                af[mt][1], af[mt][2], af[mt][3]);
                    }
                }
#pragma unroll
                for (int na = 0; na < C::NA; na++) {
                    const uint32_t q = w == 0 ? bq[na].x : w == 1 ? bq[na].y : w == 2 ? bq[na].z
                                                                                      : bq[na].w;
                    const uint32_t sw = w < 2 ? sq[na].x : sq[na].y;
                    uint32_t s0, s1;
                    if (w % 2 == 0) {
                        s0 = expand_scale<BF16, 0>(sw);
                        s1 = expand_scale<BF16, 1>(sw);
                    } else {
                        s0 = expand_scale<BF16, 2>(sw);
                        s1 = expand_scale<BF16, 3>(sw);
                    }
                    const uint32_t q8 = q >> 8;
                    const uint32_t b00 = hmul2_u32<BF16>(decode_pair<BF16, 0>(q, q8), s0);
                    const uint32_t b01 = hmul2_u32<BF16>(decode_pair<BF16, 1>(q, q8), s0);
                    const uint32_t b10 = hmul2_u32<BF16>(decode_pair<BF16, 2>(q, q8), s1);
                    const uint32_t b11 = hmul2_u32<BF16>(decode_pair<BF16, 3>(q, q8), s1);
#pragma unroll
                    for (int mt = 0; mt < C::MT; mt++) {
                        mma16816<BF16>(acc[mt][na * 2 + 0], af[mt], b00, b01);
                        mma16816<BF16>(acc[mt][na * 2 + 1], af[mt], b10, b11);
                    }
                }
            }
        }
    }

    // Writes (or, for a split unit, accumulates) the unit's tile. Returns nothing; CTA-uniform.
    static __device__ __forceinline__ void epilogue(const Params &p, Acc &acc, int blk, int nt,
                                                    bool whole, int nk, int *s_flag) {
        const int lane = threadIdx.x % kWarp;
        const int warp = threadIdx.x / kWarp;
        const int g = lane / 4, t = lane % 4;
        const int u = blk * p.n_tiles + nt;
        const int e = __ldg(p.block_expert + blk);
        const int col_base = nt * C::TN + warp * C::NA * kAtomN + 2 * t;

        bool final_pass = whole;
        if (!whole) {
            // Partial sums of this CTA's k range into the fp32 workspace.
            if (e >= 0) {
#pragma unroll
                for (int mt = 0; mt < C::MT; mt++) {
#pragma unroll
                    for (int hr = 0; hr < 2; hr++) {
                        const int r = mt * 16 + g + hr * 8;
                        if (r >= C::BM) continue;
                        const int pr = __ldg(p.sorted_ids + (size_t)blk * C::BM + r);
                        if (pr < 0 || pr >= p.P) continue;
#pragma unroll
                        for (int nn = 0; nn < C::NA * 2; nn++) {
                            const int col = col_base + nn * 8;
                            if (col >= p.N) continue;
                            float *dst = p.ws + (size_t)pr * p.N + col;
                            atomicAdd(dst, acc[mt][nn][hr * 2 + 0]);
                            atomicAdd(dst + 1, acc[mt][nn][hr * 2 + 1]);
                        }
                    }
                }
            }
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) {
                const int old = atomicAdd(p.counters + u, nk);
                *s_flag = (old + nk == p.k_iters);
            }
            __syncthreads();
            final_pass = *s_flag != 0;
            __syncthreads();  // s_flag is rewritten by the next split unit
            if (final_pass) __threadfence();
        }
        if (!final_pass || e < 0) return;

        // One scale per expert, or per (expert, half): the up half's for columns >= N/2 (stacked)
        // or the odd columns (interleaved; col is even, so v0 is gate and v1 up).
        const float sc = __ldg(p.scale_2 + (p.halves ? 2 * e : e)) * kAccUnscale;
        const float sc_up = p.halves ? __ldg(p.scale_2 + 2 * e + 1) * kAccUnscale : sc;
#pragma unroll
        for (int mt = 0; mt < C::MT; mt++) {
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int r = mt * 16 + g + hr * 8;
                if (r >= C::BM) continue;
                const int pr = __ldg(p.sorted_ids + (size_t)blk * C::BM + r);
                if (pr < 0 || pr >= p.P) continue;  // padding rows are never written
                const float rs = p.row_scale ? __ldg(p.row_scale + pr) : 1.0f;
#pragma unroll
                for (int nn = 0; nn < C::NA * 2; nn++) {
                    const int col = col_base + nn * 8;
                    if (col >= p.N) continue;
                    float v0, v1;
                    if (whole) {
                        v0 = acc[mt][nn][hr * 2 + 0];
                        v1 = acc[mt][nn][hr * 2 + 1];
                    } else {
                        const float2 s =
                            __ldcg(reinterpret_cast<const float2 *>(p.ws + (size_t)pr * p.N + col));
                        v0 = s.x;
                        v1 = s.y;
                    }
                    const bool up0 = p.halves == 1 && col >= p.N / 2;
                    v0 *= up0 ? sc_up : sc;
                    v1 *= up0 || p.halves == 2 ? sc_up : sc;
                    if (p.bias) {
                        v0 += __ldg(p.bias + (size_t)e * p.N + col);
                        v1 += __ldg(p.bias + (size_t)e * p.N + col + 1);
                    }
                    v0 *= rs;
                    v1 *= rs;
                    *reinterpret_cast<uint32_t *>(p.c + (size_t)pr * p.N + col) =
                        pack2<BF16>(v0, v1);
                }
            }
        }
    }

    static __device__ void run(const Params &p) {
        extern __shared__ __align__(128) uint8_t smem[];
        __shared__ int s_flag;

        int nblocks = __ldg(p.num_blocks);
        nblocks = nblocks < 0 ? 0 : (nblocks > p.max_blocks ? p.max_blocks : nblocks);
        const long long units = (long long)nblocks * p.n_tiles;
        const long long total = units * p.k_iters;
        const long long grid = gridDim.x, cta = blockIdx.x;
        long long it0, it1;
        if (p.streamk) {
            it0 = total * cta / grid;
            it1 = total * (cta + 1) / grid;
        } else {
            it0 = units * cta / grid * p.k_iters;
            it1 = units * (cta + 1) / grid * p.k_iters;
        }
        if (it0 >= it1) return;

        const uint64_t pol = 0;

        // Loader cursor runs STAGES-1 steps ahead of the compute cursor.
        Cursor lc;
        lc.init(p, it0);
        BlockCache bc;
        bc.fill(p, lc.blk);
#pragma unroll
        for (int s = 0; s < C::STAGES - 1; s++) {
            if (it0 + s < it1) {
                load_stage(p, smem + s * C::STAGE, lc, bc, pol);
                if (lc.advance(p) && it0 + s + 1 < it1) bc.fill(p, lc.blk);
            }
            cp_async_commit();
        }

        Acc acc;
#pragma unroll
        for (int i = 0; i < C::MT; i++)
#pragma unroll
            for (int j = 0; j < C::NA * 2; j++)
#pragma unroll
                for (int k = 0; k < 4; k++) acc[i][j][k] = 0.f;

        Cursor cc;
        cc.init(p, it0);
        int unit_done = 0;  // k steps of the current unit done by this CTA
        int st = 0;
        for (long long it = it0; it < it1; it++) {
            cp_async_wait<C::STAGES - 2>();
            __syncthreads();
            {
                const long long nx = it + C::STAGES - 1;
                int sn = st + C::STAGES - 1;
                if (sn >= C::STAGES) sn -= C::STAGES;
                if (nx < it1) {
                    load_stage(p, smem + sn * C::STAGE, lc, bc, pol);
                    if (lc.advance(p) && nx + 1 < it1) bc.fill(p, lc.blk);
                }
                cp_async_commit();
            }
            compute_stage(smem + st * C::STAGE, acc);
            if (++st == C::STAGES) st = 0;
            unit_done++;

            if (cc.kk == p.k_iters - 1 || it == it1 - 1) {
                const bool whole = unit_done == p.k_iters;
                epilogue(p, acc, cc.blk, cc.nt, whole, unit_done, &s_flag);
#pragma unroll
                for (int i = 0; i < C::MT; i++)
#pragma unroll
                    for (int j = 0; j < C::NA * 2; j++)
#pragma unroll
                        for (int k = 0; k < 4; k++) acc[i][j][k] = 0.f;
                unit_done = 0;
            }
            cc.advance(p);
        }
        cp_async_wait<0>();
    }
};

template <class C, bool BF16>
__global__ void __launch_bounds__(C::THREADS, C::MIN_CTAS) marlin_moe_gemm_kernel(const Params p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    Kernel<C, BF16>::run(p);
#endif
}

// ---- repack -------------------------------------------------------------------------------

// E4M3 byte -> the kernel's unsigned E5M3 scale byte (exponent + 10, 3 mantissa bits); the sign
// is handled by the caller. mag must be non-zero.
__device__ __forceinline__ uint8_t scale_code(uint32_t mag) {
    int ex = int(mag >> 3), m = int(mag & 7), e;
    if (ex > 0) {
        e = ex - 7;
    } else {  // subnormal m/8 * 2^-6: normalize
        const int msb = 31 - __clz(m);
        e = msb - 9;
        m = (m << (3 - msb)) & 7;
    }
    return uint8_t(((e + 10) << 3) | m);
}

// One thread per (expert, K atom, N atom, lane): its 16 bytes of codes (and 4 scale bytes for
// lanes < 16).
__global__ void marlin_repack_kernel(const uint8_t *__restrict__ w, const uint8_t *__restrict__ sf,
                                     int E, int N, int K, int KT, int NB, uint8_t *__restrict__ bw,
                                     uint8_t *__restrict__ bs) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total = (long long)E * KT * NB * 32;
    if (idx >= total) return;
    const int lane = int(idx % 32);
    const long long atom = idx / 32;  // (e * KT + kt) * NB + nb
    const int nb = int(atom % NB);
    const int kt = int((atom / NB) % KT);
    const int e = int(atom / ((long long)NB * KT));
    const int g = lane / 4, t = lane % 4;
    const int KB = K / 2, KG = K / 16;
    const uint8_t *we = w + (size_t)e * N * KB;
    const uint8_t *se = sf + (size_t)e * N * KG;

    uint32_t words[4];
#pragma unroll
    for (int wd = 0; wd < 4; wd++) {
        const int kg = kt * 4 + wd;
        uint32_t q = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int col = nb * 16 + g + 8 * (j >> 1);
            const int kb = kt * 32 + wd * 8 + t + 4 * (j & 1);
            uint32_t byte = 0;
            if (kb < KB) {
                byte = we[(size_t)col * KB + kb];
                const uint32_t s = se[(size_t)col * KG + kg];
                if ((s & 0x7F) == 0) byte = 0;          // zero scale: exact zeros
                else if (s & 0x80) byte ^= 0x88;        // negative scale: flip both codes' signs
            }
            q |= (byte & 0xF) << (4 * j);
            q |= (byte >> 4) << (16 + 4 * j);
        }
        words[wd] = q;
    }
    reinterpret_cast<uint4 *>(bw + atom * kAtomBytes)[lane] =
        make_uint4(words[0], words[1], words[2], words[3]);

    if (lane < 16) {
        // Lane l writes bytes 4l..4l+3 of the 64: g = l/2, (w, h) = ((l%2)*2 + i/2, i%2).
        const int gg = lane / 2;
        uint32_t out = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int wd = (lane % 2) * 2 + i / 2, h = i % 2;
            const int col = nb * 16 + gg + 8 * h;
            const int kg = kt * 4 + wd;
            uint32_t code = kScaleDontCare;
            if (kg < KG) {
                const uint32_t mag = se[(size_t)col * KG + kg] & 0x7F;
                if (mag) code = scale_code(mag);
            }
            out |= code << (8 * i);
        }
        reinterpret_cast<uint32_t *>(bs + atom * kAtomScaleBytes)[lane] = out;
    }
}

int pad_kt(int K) { return (K + kAtomK - 1) / kAtomK; }

// Occupancy of one instance (cached: the answer never changes for a process).
template <class C, bool BF16>
cudaError_t prepare(int *ctas_per_sm) {
    static int cached = 0;
    if (cached > 0) {
        *ctas_per_sm = cached;
        return cudaSuccess;
    }
    auto *fn = marlin_moe_gemm_kernel<C, BF16>;
    cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (err != cudaSuccess) return err;
    int n = 0;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, C::THREADS, C::SMEM);
    if (err != cudaSuccess) return err;
    if (n < 1) return cudaErrorInvalidConfiguration;
    cached = n;
    *ctas_per_sm = n;
    return cudaSuccess;
}

size_t streamk_ws_floats(int P, int N) { return (size_t)P * N; }

bool streamk_allowed(int P, int N) { return streamk_ws_floats(P, N) * 4 <= kMaxStreamKBytes; }

size_t counters_count(int N, int max_blocks) {
    return (size_t)max_blocks * ((N + kMinTileN - 1) / kMinTileN);
}

template <class C, bool BF16>
cudaError_t launch(const nvfp4moe_marlin_args *args, cudaStream_t stream) {
    int occ = 0;
    cudaError_t err = prepare<C, BF16>(&occ);
    if (err != cudaSuccess) return err;
    Params p;
    p.a = static_cast<const uint16_t *>(args->a);
    p.KT = pad_kt(args->K);
    p.NB = args->N / kAtomN;
    p.bw = static_cast<const uint8_t *>(args->b);
    p.bs = p.bw + (size_t)args->E * p.KT * p.NB * kAtomBytes;
    p.scale_2 = args->scale_2;
    p.halves = args->scale_2_halves;
    p.bias = args->bias;
    p.row_scale = args->row_scale;
    p.c = static_cast<uint16_t *>(args->c);
    p.sorted_ids = args->sorted_ids;
    p.block_expert = args->block_expert;
    p.num_blocks = args->num_blocks;
    p.a_row_div = args->a_row_div;
    p.P = args->P;
    p.N = args->N;
    p.K = args->K;
    p.n_tiles = (args->N + C::TN - 1) / C::TN;
    p.k_iters = (p.KT + C::KA - 1) / C::KA;
    p.max_blocks = args->max_blocks;

    const int grid = (args->sm_count > 0 ? args->sm_count : 1) * occ;
    // Heuristic by (P, E, N, K): whole units when there are enough of them for every CTA to get
    // >= 8 (imbalance <= 1/8) or when the partial-sum buffer would be big; stream-K otherwise.
    // The unit count is estimated from P: each touched expert adds at most one partly filled
    // block. DeepSeek-V3 on the H200 (660 CTAs for block_m 8): M = 1 has 9 x 64 = 576 estimated
    // GEMM1 units -> stream-K, 43 k steps per CTA, 1.68 TB/s (whole units would give 512 of 660
    // CTAs one 56-step unit each and leave the rest idle). M = 16 has 144 x 64 = 9216 -> whole
    // units, 2.09 TB/s. The crossover itself is not measured.
    const long long est_blocks = (long long)args->P / C::BM + (args->P < args->E ? args->P : args->E);
    const long long est_units = est_blocks * p.n_tiles;
    p.streamk = args->workspace != nullptr && streamk_allowed(args->P, args->N) &&
                est_units < 8LL * grid;
    p.ws = nullptr;
    p.counters = nullptr;
    if (p.streamk) {
        p.ws = static_cast<float *>(args->workspace);
        p.counters = reinterpret_cast<int32_t *>(p.ws + streamk_ws_floats(args->P, args->N));
        const size_t units = (size_t)args->max_blocks * p.n_tiles;
        err = cudaMemsetAsync(p.ws, 0,
                              streamk_ws_floats(args->P, args->N) * 4 + units * sizeof(int32_t),
                              stream);
        if (err != cudaSuccess) return err;
    }
    marlin_moe_gemm_kernel<C, BF16><<<grid, C::THREADS, C::SMEM, stream>>>(p);
    return cudaGetLastError();
}

template <class C>
cudaError_t launch_dtype(const nvfp4moe_marlin_args *args, cudaStream_t stream) {
    return args->is_bf16 ? launch<C, true>(args, stream) : launch<C, false>(args, stream);
}

}  // namespace

extern "C" size_t nvfp4moe_marlin_packed_bytes(int32_t E, int32_t N, int32_t K) {
    if (E <= 0 || N <= 0 || K <= 0) return 0;
    return (size_t)E * pad_kt(K) * (N / kAtomN) * (kAtomBytes + kAtomScaleBytes);
}

extern "C" cudaError_t nvfp4moe_marlin_repack(const uint8_t *w, const uint8_t *sf, int32_t E,
                                              int32_t N, int32_t K, void *out,
                                              cudaStream_t stream) {
    if (!w || !sf || !out || E <= 0 || N <= 0 || K <= 0 || N % 16 || K % 16)
        return cudaErrorInvalidValue;
    const int KT = pad_kt(K), NB = N / kAtomN;
    uint8_t *bw = static_cast<uint8_t *>(out);
    uint8_t *bs = bw + (size_t)E * KT * NB * kAtomBytes;
    const long long threads = (long long)E * KT * NB * 32;
    const int block = 256;
    const long long grid = (threads + block - 1) / block;
    if (grid > 0x7FFFFFFFLL) return cudaErrorInvalidValue;
    marlin_repack_kernel<<<(unsigned)grid, block, 0, stream>>>(w, sf, E, N, K, KT, NB, bw, bs);
    return cudaGetLastError();
}

extern "C" size_t nvfp4moe_marlin_workspace_bytes(int32_t P, int32_t N, int32_t K,
                                                  int32_t max_blocks, int32_t block_m,
                                                  int32_t sm_count) {
    (void)K;
    (void)block_m;
    (void)sm_count;
    if (P <= 0 || N <= 0 || max_blocks <= 0 || !streamk_allowed(P, N)) return 0;
    return streamk_ws_floats(P, N) * 4 + counters_count(N, max_blocks) * sizeof(int32_t);
}

extern "C" cudaError_t nvfp4moe_marlin_gemm(const nvfp4moe_marlin_args *args,
                                            cudaStream_t stream) {
    if (!args || !args->a || !args->b || !args->scale_2 || !args->c || !args->sorted_ids ||
        !args->block_expert || !args->num_blocks)
        return cudaErrorInvalidValue;
    if (args->N <= 0 || args->K <= 0 || args->N % 16 || args->K % 16 || args->E <= 0 ||
        args->a_row_div < 1 || args->max_blocks < 0 || args->P < 0 || args->scale_2_halves < 0 ||
        args->scale_2_halves > 2)
        return cudaErrorInvalidValue;
    if (args->P == 0 || args->max_blocks == 0) return cudaSuccess;  // nothing to compute
    switch (args->block_m) {
    case 8: return launch_dtype<CfgM8>(args, stream);
    case 16: return launch_dtype<CfgM16>(args, stream);
    case 32: return launch_dtype<CfgM32>(args, stream);
    case 48: return launch_dtype<CfgM48>(args, stream);
    case 64: return launch_dtype<CfgM64>(args, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" int32_t nvfp4moe_marlin_block_m(int64_t P, int32_t E) {
    static const int32_t kSizes[] = {8, 16, 32, 48, 64};
    if (E <= 0) return 64;
    for (int i = 0; i < 5; i++)
        if ((double)P / E / kSizes[i] < 0.9) return kSizes[i];
    return 64;
}
