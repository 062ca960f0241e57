/*
 * test_hopper_forms.c - which form the HOPPER_WGMMA larger-batch GEMM launches, as its host-side
 * reporters say (kernels/hopper_gemm.h): weight tiles per work item (nvfp4moe_hopper_row_tiles),
 * token tile widths per item (nvfp4moe_hopper_token_subtiles) and whether GEMM1 applies SiLU itself
 * (nvfp4moe_hopper_fuses_activation), over every block_m, forced setting, activation, gate/up
 * layout and N the rules distinguish, against the rules as the header states them; and where the
 * plan's two regimes meet (nvfp4moe_hopper_decode_block_m, nvfp4moe_hopper_block_m). The backend
 * skips its activation kernel on the last answer, so a wrong one is a wrong layer. Pure host
 * functions: runs without a GPU. A build without CUDA has none of them and checks nothing.
 */
#include "harness.h"

#ifdef NVFP4MOE_HAVE_CUDA
#include "kernels/hopper_decode.h"
#include "kernels/hopper_gemm.h"
#include "kernels/pipeline.h"

/* The rules of kernels/hopper_gemm.h, written out independently of the implementation. */
static int want_row_tiles(int bm, int row_tiles) {
    if (row_tiles < 0 || row_tiles > 2) return 0;
    if (bm == 8 || bm == 16) return 1;
    if (bm == 32 || bm == 64 || bm == 128) return row_tiles ? row_tiles : 2;
    return 0;
}
static int want_token_subtiles(int bm, int P, int E, int token_subtiles, int row_tiles) {
    (void)P;
    (void)E;
    if (token_subtiles < 0 || token_subtiles > 2 || row_tiles < 0 || row_tiles > 2) return 0;
    if (bm == 8 || bm == 16 || bm == 32) return 1;
    if (bm == 64) return token_subtiles == 1 ? 1 : 3;   /* 64, 32, 16 token columns */
    if (bm == 128) return token_subtiles == 1 ? 1 : 2;  /* 128, 32 */
    return 0;
}
/* The decode kernels up to 3 pairs per expert on average; the GEMM beyond at block_m 32 up to 24
 * pairs per expert with 32 experts or more and an intermediate size of at most 1536, or with
 * fewer than 32 experts from 4.5 pairs per expert on; else at 64 (with fewer than 32 experts
 * from 16 pairs per expert, the first of 8, 16, 32 with P/E/block_m < 0.9 below that), 128 from
 * 1.1 * 64. */
static int want_decode_block_m(long long P, int E) { return P * 1.0 / E <= 3.0 ? 8 : 0; }
static int want_block_m(long long P, int E, int I) {
    const double pe = (double)P / E;
    if (pe >= 1.1 * 64) return 128;
    if (pe > 3.0 && pe <= 24.0 && ((E >= 32 && I > 0 && I <= 1536) || (E < 32 && pe > 4.5))) return 32;
    if (pe > 3.0 && (E >= 32 || pe >= 16.0)) return 64;
    return pe / 8 < 0.9 ? 8 : pe / 16 < 0.9 ? 16 : pe / 32 < 0.9 ? 32 : 64;
}
static int want_fused(int bm, int row_tiles, int act_out, int act, int activation, int halves, int N) {
    return act_out && act && want_row_tiles(bm, row_tiles) == 2 && halves != 2 &&
           activation == NVFP4MOE_ACT_SILU && N % 256 == 0;
}
#endif

int main(void) {
#ifdef NVFP4MOE_HAVE_CUDA
    static const int bms[] = {8, 16, 32, 48, 64, 128};
    static const int acts[] = {NVFP4MOE_ACT_SILU, NVFP4MOE_ACT_GELU, NVFP4MOE_ACT_SWIGLUOAI,
                               NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE, NVFP4MOE_ACT_SILU_NO_MUL};
    static const int Ns[] = {384, 512, 1536, 2880, 5760, 7168};
    static const int Ps[][2] = {{64, 8}, {380, 8}, {384, 8}, {8192, 256}, {32768, 128}};
    int a = 0;
    static char act_buf[4];  /* any non-NULL, 4-byte aligned address: never dereferenced here */
    for (size_t ib = 0; ib < sizeof bms / sizeof bms[0]; ib++)
        for (int rt = -1; rt <= 3; rt++)
            for (int ts = -1; ts <= 3; ts++) {
                const int bm = bms[ib];
                T_CASE("row_tiles / token_subtiles");
                int bad = 0;  /* one check per (block_m, row_tiles, token_subtiles); the first mismatches printed */
                for (size_t ip = 0; ip < sizeof Ps / sizeof Ps[0]; ip++) {
                    nvfp4moe_hopper_args x;
                    memset(&x, 0, sizeof x);
                    x.block_m = bm;
                    x.row_tiles = rt;
                    x.token_subtiles = ts;
                    x.P = Ps[ip][0];
                    x.E = Ps[ip][1];
                    const int got_rt = nvfp4moe_hopper_row_tiles(&x), got_ts = nvfp4moe_hopper_token_subtiles(&x);
                    const int w_rt = want_row_tiles(bm, rt), w_ts = want_token_subtiles(bm, x.P, x.E, ts, rt);
                    if ((got_rt != w_rt || got_ts != w_ts) && bad++ < 3)
                        fprintf(stderr, "  block_m %d P %d E %d row_tiles %d token_subtiles %d: reports %d / %d, want %d / %d\n",
                                bm, x.P, x.E, rt, ts, got_rt, got_ts, w_rt, w_ts);
                }
                CHECK(bad == 0, "block_m %d row_tiles %d token_subtiles %d: %d mismatches", bm, rt, ts, bad);
                if (rt < 0 || rt > 2 || ts != 0) continue;
                T_CASE("fuses_activation");
                bad = 0;  /* one check per (block_m, row_tiles) */
                for (size_t ia = 0; ia < sizeof acts / sizeof acts[0]; ia++)
                    for (int halves = 0; halves <= 2; halves++)
                        for (size_t in = 0; in < sizeof Ns / sizeof Ns[0]; in++)
                            for (int mask = 0; mask < 4; mask++) {
                                nvfp4moe_gpu_act_params ap;
                                memset(&ap, 0, sizeof ap);
                                ap.activation = acts[ia];
                                nvfp4moe_hopper_args x;
                                memset(&x, 0, sizeof x);
                                x.block_m = bm;
                                x.row_tiles = rt;
                                x.N = Ns[in];
                                x.scale_2_halves = halves;
                                x.act_out = (mask & 1) ? act_buf : NULL;
                                x.act = (mask & 2) ? &ap : NULL;
                                const int got = nvfp4moe_hopper_fuses_activation(&x);
                                const int want = want_fused(bm, rt, mask & 1, mask & 2, acts[ia], halves, Ns[in]);
                                if (got != want && bad++ < 3)
                                    fprintf(stderr, "  block_m %d row_tiles %d act %d halves %d N %d act_out %d act %d: %d, want %d\n",
                                            bm, rt, acts[ia], halves, Ns[in], mask & 1, (mask >> 1) & 1, got, want);
                                a += got;
                            }
                CHECK(bad == 0, "block_m %d row_tiles %d: %d mismatches", bm, rt, bad);
            }
    static const int Es[] = {8, 16, 32, 64, 128, 256, 384};
    static const int Is[] = {0, 768, 1536, 1544, 2048, 2880};
    for (size_t ie = 0; ie < sizeof Es / sizeof Es[0]; ie++)
        for (size_t ii = 0; ii < sizeof Is / sizeof Is[0]; ii++) {
            T_CASE("decode regime / GEMM block_m");
            const int E = Es[ie], I = Is[ii];
            int bad = 0, gemm32 = 0, gemm64 = 0;
            for (long long P = 1; P <= 300LL * E; P += 1 + P / 16) {
                const int d = nvfp4moe_hopper_decode_block_m(P, E), b = nvfp4moe_hopper_block_m(P, E, I);
                const int wd = want_decode_block_m(P, E), wb = want_block_m(P, E, I);
                if ((d != wd || b != wb) && bad++ < 3)
                    fprintf(stderr, "  P %lld E %d I %d: decode block_m %d, GEMM block_m %d; want %d, %d\n", P, E, I,
                            d, b, wd, wb);
                gemm32 += d == 0 && b == 32;
                gemm64 += d == 0 && b == 64;
            }
            CHECK(bad == 0, "E %d I %d: %d mismatches", E, I, bad);
            /* short items (32 experts or more, I <= 1536) and few experts run block_m 32 past the
             * decode regime; every layer reaches block_m 64 */
            if (E < 32 || (I > 0 && I <= 1536)) CHECK(gemm32 > 0, "E %d I %d: the GEMM never takes block_m 32", E, I);
            CHECK(gemm64 > 0, "E %d I %d: the GEMM never takes block_m 64", E, I);
        }
    T_CASE("some launches fuse");
    CHECK(a > 0, "no combination fuses");
#endif
    return t_finish("test_hopper_forms");
}
