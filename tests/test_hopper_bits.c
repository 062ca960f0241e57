/*
 * test_hopper_bits.c - the bit layout of the HOPPER_WGMMA weight words (kernels/hopper_bits.h),
 * which the GPU kernels decode with a handful of shifts, masks and multiplies: every E2M1 code
 * pair of every register position, in every surrounding of the word's other codes that matters
 * (the multiplies' copies must never carry into a result bit), decodes to the exact 16-bit float
 * the layout promises: value * 2^-126 as bf16, value * 2^-14 as fp16.
 */
#include "harness.h"

#include "kernels/hopper_bits.h"

/* The bits a code must decode to in one 16-bit half: sign at 15, magnitude at 6 (bf16) or 9 (fp16). */
static uint32_t want_half(int fp16, uint8_t code) {
    return ((uint32_t)(code >> 3) << 15) | ((uint32_t)(code & 7) << (fp16 ? 9 : 6));
}

/* A 16-bit float bit pattern as a double. */
static double half_value(int fp16, uint32_t h) {
    const double sign = (h & 0x8000u) ? -1.0 : 1.0;
    const int eb = fp16 ? 5 : 8, mb = fp16 ? 10 : 7, bias = fp16 ? 15 : 127;
    const uint32_t ex = (h >> mb) & ((1u << eb) - 1), man = h & ((1u << mb) - 1);
    if (ex == 0) return sign * ldexp((double)man, 1 - bias - mb);
    return sign * ldexp((double)(man | (1u << mb)), (int)ex - bias - mb);
}

static void decode(int fp16, uint32_t q, uint32_t a[4]) {
    if (fp16) nvfp4moe_hbits_decode_fp16(q, a);
    else nvfp4moe_hbits_decode_bf16(q, a);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

/* Decodes pack(lo, hi) and compares all four registers; returns 0 and prints on a mismatch. */
static int check_word(int fp16, const uint8_t lo[4], const uint8_t hi[4]) {
    const uint32_t q = nvfp4moe_hbits_pack(fp16, lo, hi);
    uint32_t a[4];
    decode(fp16, q, a);
    for (int j = 0; j < 4; j++) {
        const uint32_t want = want_half(fp16, lo[j]) | want_half(fp16, hi[j]) << 16;
        if (a[j] != want) {
            fprintf(stderr, "  %s word 0x%08x (lo %x%x%x%x hi %x%x%x%x): pair %d decoded 0x%08x, want 0x%08x\n",
                    fp16 ? "fp16" : "bf16", q, lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3], j,
                    a[j], want);
            return 0;
        }
    }
    return 1;
}

int main(void) {
    for (int fp16 = 0; fp16 < 2; fp16++) {
        T_CASE(fp16 ? "fp16" : "bf16");
        /* the layout is a bijection: every bit of the word feeds exactly one target */
        uint32_t seen = 0;
        int dup = 0;
        for (int j = 0; j < 4; j++)
            for (int f = 0; f < 8; f++) {
                uint8_t lo[4] = {0}, hi[4] = {0};
                (f < 4 ? lo : hi)[j] = (uint8_t)(8u >> (f % 4));
                const uint32_t q = nvfp4moe_hbits_pack(fp16, lo, hi);
                dup += (seen & q) != 0 || __builtin_popcount(q) != 1;
                seen |= q;
            }
        CHECK(dup == 0 && seen == 0xFFFFFFFFu, "%d bits placed twice or not once, coverage 0x%08x", dup, seen);

        /* the 16 decoded patterns are the E2M1 values, scaled by 2^-126 (bf16) or 2^-14 (fp16) */
        int bad = 0;
        for (uint8_t c = 0; c < 16; c++) {
            const double got = half_value(fp16, want_half(fp16, c));
            const double want = (double)nvfp4moe_e2m1_decode(c) * ldexp(1.0, fp16 ? -14 : -126);
            if (got != want && !(got == 0 && want == 0)) {
                if (bad++ < 3) fprintf(stderr, "  code %x: pattern value %g, want %g\n", c, got, want);
            }
        }
        CHECK(bad == 0, "%d E2M1 codes decode to the wrong value", bad);

        /* every code pair of every register, the other six codes cycling through all values and
         * random ones: the multiplies' copies of the neighbours must never carry into the result */
        int ok = 1;
        for (int j = 0; j < 4 && ok; j++)
            for (int pair = 0; pair < 256 && ok; pair++)
                for (int fill = 0; fill < 16 + 64 && ok; fill++) {
                    uint8_t lo[4], hi[4];
                    for (int i = 0; i < 4; i++) {
                        lo[i] = (uint8_t)(fill < 16 ? (uint32_t)fill : next32() & 15);
                        hi[i] = (uint8_t)(fill < 16 ? (uint32_t)(15 - fill) : next32() & 15);
                    }
                    lo[j] = (uint8_t)(pair & 15);
                    hi[j] = (uint8_t)(pair >> 4);
                    ok = check_word(fp16, lo, hi);
                }
        CHECK(ok, "a code pair decoded wrong (see above)");

        /* and every one of 2^20 random words decodes to what its codes say */
        ok = 1;
        for (int n = 0; n < (1 << 20) && ok; n++) {
            const uint32_t r = next32();
            uint8_t lo[4], hi[4];
            for (int i = 0; i < 4; i++) {
                lo[i] = (uint8_t)((r >> (8 * i)) & 15);
                hi[i] = (uint8_t)((r >> (8 * i + 4)) & 15);
            }
            ok = check_word(fp16, lo, hi);
        }
        CHECK(ok, "a random word decoded wrong (see above)");
    }
    return t_finish("test_hopper_bits");
}
