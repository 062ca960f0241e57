/*
 * hopper_bits.h - where the HOPPER_WGMMA weight layout puts the E2M1 bits of one fragment word,
 * and the integer decode that takes them out again. Shared by the repack and both Hopper kernels
 * (CUDA, through kernels/hopper_layout.cuh) and by the host test of the bit layout
 * (tests/test_hopper_bits.c, plain C).
 *
 * A 32-bit fragment word holds one lane's 8 weights of one k16 step: the four 16-bit-float pairs
 * a0..a3 of the mma/wgmma A fragment (kernels/hopper_layout.cuh says which rows and k). Each pair
 * decodes into one register whose low half is the lower-k value and whose high half the higher-k
 * one. An E2M1 code s|e1 e0|m decodes by moving its bits to
 *   bf16: s -> bit 15, e1 e0 m -> bits 8..6    (the bf16 number value * 2^-126)
 *   fp16: s -> bit 15, e1 e0 m -> bits 11..9   (the fp16 number value * 2^-14)
 * of its half; the block scale's HMUL2 supplies the exponent bias (kernels/hopper_layout.cuh).
 *
 * The repack places the bits so that the moves are as few operations as possible:
 *   bf16: a0 = q & M;  a1 = rotl(q, 10) & M;  a2 = rotl(q, 13) & M;
 *         a3 = ((q & 0x001B001B) * 4228) & M            M = 0x81C081C0
 *   fp16: a0 = q & M;  a1 = rotl(q, 3) & M;
 *         a2 = ((q & 0x40384038) * 66) & M;  a3 = ((q & 0x20072007) * 516) & M   M = 0x8E008E00
 * i.e. 8 (bf16) or 9 (fp16) ALU/IMAD operations per 8 weights (a rotation is one SHF.L.W). The
 * multiplies make two or three shifted copies of the isolated bits; the repack's placement keeps
 * the copies from overlapping where the mask looks, so no carry reaches a result bit (the host
 * test checks every input). Nothing else of a word is read: all 32 bits are used.
 */
#ifndef NVFP4MOE_HOPPER_BITS_H
#define NVFP4MOE_HOPPER_BITS_H

#include <stdint.h>

#if defined(__CUDACC__)
#define NVFP4MOE_HBITS_FN __host__ __device__ __forceinline__
#else
#define NVFP4MOE_HBITS_FN static inline
#endif

#define NVFP4MOE_HBITS_MASK_BF16 0x81C081C0u
#define NVFP4MOE_HBITS_MASK_FP16 0x8E008E00u

/* The fragment word of 8 E2M1 codes: pair j's lower-k code lo[j], higher-k code hi[j]. */
NVFP4MOE_HBITS_FN uint32_t nvfp4moe_hbits_pack(int fp16, const uint8_t lo[4], const uint8_t hi[4]) {
    /* [dtype][pair j][target]: the word bit that feeds each target bit (see the top comment) */
    const uint8_t src[2][4][8] = {
        {{15, 8, 7, 6, 31, 24, 23, 22}, {5, 30, 29, 28, 21, 14, 13, 12},
         {2, 27, 26, 25, 18, 11, 10, 9}, {3, 1, 0, 4, 19, 17, 16, 20}},
        {{15, 11, 10, 9, 31, 27, 26, 25}, {12, 8, 7, 6, 28, 24, 23, 22},
         {14, 5, 4, 3, 30, 21, 20, 19}, {13, 2, 1, 0, 29, 18, 17, 16}},
    };
    const uint8_t(*s)[8] = src[fp16 != 0];
    uint32_t q = 0;
    for (int j = 0; j < 4; j++)
        for (int f = 0; f < 4; f++) {  /* f = 0: sign (code bit 3), 1..3: code bits 2, 1, 0 */
            const unsigned cb = 3u - (unsigned)f;
            q |= (uint32_t)((lo[j] >> cb) & 1u) << s[j][f];
            q |= (uint32_t)((hi[j] >> cb) & 1u) << s[j][4 + f];
        }
    return q;
}

NVFP4MOE_HBITS_FN uint32_t nvfp4moe_hbits_rotl(uint32_t q, unsigned s) {
    return (q << s) | (q >> (32u - s));
}

/* The four decoded pairs of word q (16-bit-float bit patterns, two per register). */
NVFP4MOE_HBITS_FN void nvfp4moe_hbits_decode_bf16(uint32_t q, uint32_t a[4]) {
    const uint32_t m = NVFP4MOE_HBITS_MASK_BF16;
    a[0] = q & m;
    a[1] = nvfp4moe_hbits_rotl(q, 10) & m;
    a[2] = nvfp4moe_hbits_rotl(q, 13) & m;
    a[3] = ((q & 0x001B001Bu) * 4228u) & m;
}
NVFP4MOE_HBITS_FN void nvfp4moe_hbits_decode_fp16(uint32_t q, uint32_t a[4]) {
    const uint32_t m = NVFP4MOE_HBITS_MASK_FP16;
    a[0] = q & m;
    a[1] = nvfp4moe_hbits_rotl(q, 3) & m;
    a[2] = ((q & 0x40384038u) * 66u) & m;
    a[3] = ((q & 0x20072007u) * 516u) & m;
}

#endif /* NVFP4MOE_HOPPER_BITS_H */
