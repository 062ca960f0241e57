/*
 * test_cpu_fast.c - CPU_FAST's pieces and its exactness claims.
 *
 *   kernels   every ISA this CPU runs: the integer kernel against an independent exact sum
 *             (__int128, from the canonical codes through the codec's decoders), bit for bit, up
 *             to the largest K it takes; the float kernel against the portable C, bit for bit
 *   quantizer the activation rows against the codec's VLLM_TRITON quantizer, which the reference
 *             uses (codes and scales, bit for bit), and its quantize-dequantize for every global
 *             scale, 0 and infinite included
 *   layer     W4A4 with power-of-two activation scales, one expert per token: every output within
 *             one float32 ulp of the float64 reference (the claim: exact up to the final rounding);
 *             the same outputs bit for bit for every ISA and thread count; NaN inputs
 *   pool      barriers and concurrent callers; the caller's CPU kept free of workers wherever the
 *             caller runs; runs and forwards after the workers went to sleep; the thread and ISA
 *             settings' errors
 */
#define _GNU_SOURCE   /* sched_getaffinity, sched_getcpu */
#include "harness.h"
#include "backends/cpu.h"
#include "core/internal.h"
#include "format/format.h"
#include "nvfp4moe.h"

#include <sched.h>
#include <time.h>

/* An environment variable's value, to put back after a test changed it (the suite may run with
 * NVFP4MOE_CPU_ISA set, to run the layer tests on one instruction set). */
typedef struct {
    const char *name;
    char value[64];
    bool set;
} env_save;

static env_save env_keep(const char *name) {
    env_save e = {.name = name};
    const char *v = getenv(name);
    if (v) snprintf(e.value, sizeof e.value, "%s", v);
    e.set = v != NULL;
    return e;
}

static void env_restore(const env_save *e) {
    if (e->set) setenv(e->name, e->value, 1);
    else unsetenv(e->name);
}

// ---- E4M3 as integers ----

static void test_e4m3_int(void) {
    T_CASE("e4m3 as integers");
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7F) == 0x7F) continue;
        double want = fabs((double)nvfp4moe_e4m3_decode((uint8_t)c)) * 512.0;
        if ((double)nvfp4moe_cpu_e4m3_int((uint8_t)c) != want && bad++ < 5)
            fprintf(stderr, "  code 0x%02X: %d, want %.0f\n", c, nvfp4moe_cpu_e4m3_int((uint8_t)c), want);
    }
    CHECK(bad == 0, "%d codes differ", bad);
}

// ---- kernels ----

typedef struct {
    int64_t N, K;
    uint8_t *q, *sf;          /* canonical */
    uint8_t *packed;          /* repacked */
} matrix;

/* Random codes; scale codes from `mode`: 0 random non-NaN (both signs, subnormals, zero), 1 all
 * 448 with codes +-6 (the largest products). */
static void matrix_make(matrix *m, int64_t N, int64_t K, uint64_t seed, int mode) {
    m->N = N;
    m->K = K;
    m->q = malloc((size_t)(N * K / 2));
    m->sf = malloc((size_t)(N * K / 16));
    m->packed = aligned_alloc(64, (size_t)(N / 16) * nvfp4moe_cpu_tile_bytes(K));
    uint64_t s = seed;
    for (int64_t i = 0; i < N * K / 2; i++) {
        uint64_t r = nvfp4moe_rand_u64(&s);
        m->q[i] = mode == 1 ? (uint8_t)((r & 1 ? 0x7 : 0xF) | (r & 2 ? 0x70 : 0xF0)) : (uint8_t)r;
    }
    for (int64_t i = 0; i < N * K / 16; i++) {
        uint8_t c = (uint8_t)nvfp4moe_rand_u64(&s);
        if ((c & 0x7F) == 0x7F) c ^= 0x01;
        m->sf[i] = mode == 1 ? 0x7E : c;
    }
    nvfp4moe_cpu_repack(m->q, m->sf, K, 0, N / 16, m->packed);
}

static void matrix_free(matrix *m) {
    free(m->q);
    free(m->sf);
    free(m->packed);
}

/* A prefetch cursor over the whole repacked matrix, one of a few settings by `which` (the kernels'
 * results cannot depend on it: the kernel tests run with it). */
static void stream_over(nvfp4moe_cpu_stream *pf, const matrix *m, int which) {
    static const char *const settings[] = {"t0:4608", "t1:1152:128", "nta:64", "t2:65536:4096"};
    static nvfp4moe_cpu_seg seg;
    nvfp4moe_cpu_prefetch set;
    nvfp4moe_cpu_prefetch_parse(settings[which % 4], "test", &set);
    seg = (nvfp4moe_cpu_seg){m->packed, (size_t)(m->N / 16) * nvfp4moe_cpu_tile_bytes(m->K)};
    nvfp4moe_cpu_stream_start(pf, &seg, 1, &set);
}

static int code_at(const uint8_t *q, int64_t K, int64_t r, int64_t c) { return (q[r * (K / 2) + c / 2] >> (4 * (c & 1))) & 0xF; }

/* The exact sum of row r's products with activation row x (codes xq, scales xs), times 2^20, from
 * the canonical layout through the codec's decoders. */
static __int128 exact_dot(const matrix *m, int64_t r, const uint8_t *xq, const uint8_t *xs) {
    __int128 acc = 0;
    for (int64_t c = 0; c < m->K; c++) {
        double w = nvfp4moe_e2m1_decode((uint8_t)code_at(m->q, m->K, r, c)) * 2.0;
        double x = nvfp4moe_e2m1_decode((uint8_t)code_at(xq, m->K, 0, c)) * 2.0;
        double sw = nvfp4moe_e4m3_decode(m->sf[r * (m->K / 16) + c / 16]) * 512.0;
        double sx = nvfp4moe_e4m3_decode(xs[c / 16]) * 512.0;
        acc += (__int128)(int64_t)(w * x) * (__int128)(int64_t)sw * (__int128)(int64_t)sx;
    }
    return acc;
}

static void test_gemm_q(int64_t N, int64_t K, int nt, uint64_t seed, int mode) {
    char name[160];
    snprintf(name, sizeof name, "gemm_q N=%lld K=%lld rows=%d%s", (long long)N, (long long)K, nt,
             mode ? " (largest products)" : "");
    T_CASE(name);
    matrix m;
    matrix_make(&m, N, K, seed, mode);
    const int64_t kp = nvfp4moe_cpu_superblocks(K) * NVFP4MOE_CPU_SB_COLS;
    nvfp4moe_cpu_qrow rows[NVFP4MOE_CPU_MAX_NT];
    const nvfp4moe_cpu_qblock *blk[NVFP4MOE_CPU_MAX_NT];
    uint8_t *xq = malloc((size_t)(nt * K / 2)), *xs = malloc((size_t)(nt * K / 16)), *scratch = malloc((size_t)K);
    float *x = malloc(sizeof(float) * (size_t)K);
    for (int t = 0; t < nt; t++) {
        rows[t].blk = malloc(sizeof(nvfp4moe_cpu_qblock) * (size_t)(kp / 16));
        blk[t] = rows[t].blk;
        if (mode == 1) {
            for (int64_t i = 0; i < K; i++) x[i] = (i + t) % 3 ? 6.0f * 448.0f : -6.0f * 448.0f;
        } else {
            nvfp4moe_fill_normal(x, NVFP4MOE_DTYPE_F32, K, seed + 100 + (uint64_t)t);
            for (int64_t i = 0; i < K; i++) x[i] *= (float)(1 << ((i / 16) % 7));   /* scales of every size */
        }
        const float gs = mode == 1 ? 1.0f : 37.0f;
        nvfp4moe_cpu_quantize_row(nvfp4moe_cpu_kernels_of(NVFP4MOE_CPU_PORTABLE), x, K, gs, &rows[t], scratch);
        nvfp4moe_quantize_as(NVFP4MOE_QUANTIZER_VLLM_TRITON, x, 1, K, gs, xq + t * K / 2, xs + t * K / 16);
    }
    int64_t *got = malloc(sizeof(int64_t) * (size_t)(nt * 16));
    for (int isa = 0; isa < NVFP4MOE_CPU_ISA_COUNT; isa++) {
        const nvfp4moe_cpu_kernels *k = nvfp4moe_cpu_kernels_of((nvfp4moe_cpu_isa)isa);
        if (!k) continue;
        int bad = 0;
        nvfp4moe_cpu_stream pf;
        stream_over(&pf, &m, isa);
        for (int64_t tile = 0; tile < N / 16; tile++) {
            k->gemm_q(m.packed + tile * nvfp4moe_cpu_tile_bytes(K), nvfp4moe_cpu_superblocks(K), blk, nt, got,
                      tile % 2 ? &pf : NULL);
            for (int t = 0; t < nt; t++)
                for (int r = 0; r < 16; r++) {
                    __int128 want = exact_dot(&m, 16 * tile + r, xq + t * K / 2, xs + t * K / 16);
                    if ((__int128)got[t * 16 + r] != want && bad++ < 5)
                        fprintf(stderr, "  [%s] %s: row %lld act %d: %lld, want %.17g\n", name, nvfp4moe_cpu_isa_name(k->isa),
                                (long long)(16 * tile + r), t, (long long)got[t * 16 + r], (double)want);
                }
        }
        CHECK(bad == 0, "%s: %d sums differ from the exact ones", nvfp4moe_cpu_isa_name(k->isa), bad);
    }
    for (int t = 0; t < nt; t++) free(rows[t].blk);
    free(xq); free(xs); free(scratch); free(x); free(got);
    matrix_free(&m);
}

static void test_gemm_f(int64_t N, int64_t K, int nt, uint64_t seed) {
    char name[160];
    snprintf(name, sizeof name, "gemm_f N=%lld K=%lld rows=%d", (long long)N, (long long)K, nt);
    T_CASE(name);
    matrix m;
    matrix_make(&m, N, K, seed, 0);
    const int64_t kp = nvfp4moe_cpu_superblocks(K) * NVFP4MOE_CPU_SB_COLS;
    const float *rows[NVFP4MOE_CPU_MAX_NT];
    for (int t = 0; t < nt; t++) {
        float *x = calloc((size_t)kp, sizeof(float));
        nvfp4moe_fill_normal(x, NVFP4MOE_DTYPE_F32, K, seed + 7 + (uint64_t)t);
        rows[t] = x;
    }
    float *want = malloc(sizeof(float) * (size_t)(nt * 16)), *got = malloc(sizeof(float) * (size_t)(nt * 16));
    const nvfp4moe_cpu_kernels *ref = nvfp4moe_cpu_kernels_of(NVFP4MOE_CPU_PORTABLE);
    for (int64_t tile = 0; tile < N / 16; tile++) {
        const uint8_t *tp = m.packed + tile * nvfp4moe_cpu_tile_bytes(K);
        ref->gemm_f(tp, nvfp4moe_cpu_superblocks(K), rows, nt, want, NULL);
        /* the portable order against a float64 dot product of the dequantized row */
        double err = 0, norm = 0;
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < 16; r++) {
                double d = 0;
                for (int64_t c = 0; c < K; c++)
                    d += (double)nvfp4moe_e2m1_decode((uint8_t)code_at(m.q, K, 16 * tile + r, c)) *
                         (double)nvfp4moe_e4m3_decode(m.sf[(16 * tile + r) * (K / 16) + c / 16]) * (double)rows[t][c];
                err += (want[t * 16 + r] - d) * (want[t * 16 + r] - d);
                norm += d * d;
            }
        CHECK(sqrt(err) <= 1e-5 * sqrt(norm) + 1e-30, "tile %lld: portable vs float64: %.3g relative", (long long)tile,
              sqrt(err / (norm + 1e-300)));
        for (int isa = 1; isa < NVFP4MOE_CPU_ISA_COUNT; isa++) {
            const nvfp4moe_cpu_kernels *k = nvfp4moe_cpu_kernels_of((nvfp4moe_cpu_isa)isa);
            if (!k) continue;
            nvfp4moe_cpu_stream pf;
            stream_over(&pf, &m, isa);
            k->gemm_f(tp, nvfp4moe_cpu_superblocks(K), rows, nt, got, &pf);
            check_bytes(nvfp4moe_cpu_isa_name(k->isa), (const uint8_t *)got, (const uint8_t *)want,
                        sizeof(float) * (size_t)(nt * 16));
        }
    }
    for (int t = 0; t < nt; t++) free((void *)rows[t]);
    free(want); free(got);
    matrix_free(&m);
}

// ---- the prefetch cursor and its settings ----

/* Where a cursor stands, as a byte offset in its stream (-1: finished, or at the end waiting for
 * more). */
static int64_t stream_pos(const nvfp4moe_cpu_stream *c, const nvfp4moe_cpu_seg *segs) {
    if (c->hint == NVFP4MOE_CPU_PF_OFF || c->seg == c->end) return -1;
    int64_t pos = 0;
    for (const nvfp4moe_cpu_seg *g = segs; g < c->seg; g++) pos += (int64_t)g->n;
    return pos + (int64_t)c->off;
}

static void test_stream(void) {
    T_CASE("prefetch cursor");
    static uint8_t buf[8 * 576];
    /* segments of 3, 1, 2 and 1 superblocks, not adjacent in memory */
    const nvfp4moe_cpu_seg segs[] = {{buf + 4 * 576, 3 * 576}, {buf, 576}, {buf + 2 * 576, 2 * 576}, {buf + 7 * 576, 576}};
    const int64_t total = 7 * 576;
    const char *cases[] = {"t0:1152", "t1:640", "nta:64", "t2:1024:512", "t1:1600:320", "t0:2048:1024", "t0:8192:1024"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nvfp4moe_cpu_prefetch pf;
        CHECK_OK(nvfp4moe_cpu_prefetch_parse(cases[i], "test", &pf));
        nvfp4moe_cpu_stream c;
        nvfp4moe_cpu_stream_start(&c, segs, 4, &pf);
        /* After the warm-up and `done` more bytes of reads, the lines asked for are those up to
         * `distance` bytes ahead, one every `stride`: the next one is at that point rounded down to
         * a whole stride (finished once past the last segment). */
        int bad = 0;
        for (int64_t done = 0; done <= total + 576; done += 576) {
            if (done > 0) nvfp4moe_cpu_stream_advance(&c, 576);
            const int64_t next = (pf.distance + done) / pf.stride * pf.stride;
            const int64_t want = next >= total ? -1 : next;
            if (stream_pos(&c, segs) != want && bad++ < 3)
                fprintf(stderr, "  [%s] after %lld bytes: at %lld, want %lld\n", cases[i], (long long)done,
                        (long long)stream_pos(&c, segs), (long long)want);
        }
        CHECK(bad == 0, "%s: %d positions off", cases[i], bad);
    }
    nvfp4moe_cpu_prefetch off;
    CHECK_OK(nvfp4moe_cpu_prefetch_parse("off", "test", &off));
    nvfp4moe_cpu_stream c;
    nvfp4moe_cpu_stream_start(&c, segs, 4, &off);
    nvfp4moe_cpu_stream_advance(&c, 576);
    CHECK(c.hint == NVFP4MOE_CPU_PF_OFF && c.seg == segs && c.off == 0, "off moves nothing");
    nvfp4moe_cpu_stream_start(&c, segs, 0, &(nvfp4moe_cpu_prefetch){NVFP4MOE_CPU_PF_T0, 4608, 64});
    CHECK(c.hint == NVFP4MOE_CPU_PF_OFF, "an empty stream is finished");
    nvfp4moe_cpu_stream_advance(NULL, 576);   /* a kernel without a cursor */
}

/* The address at byte `off` of the concatenation of segs [0, n) (NULL past the end). */
static const uint8_t *seg_addr(const nvfp4moe_cpu_seg *segs, int n, int64_t off) {
    for (int i = 0; i < n; i++) {
        if (off < (int64_t)segs[i].n) return segs[i].p + off;
        off -= (int64_t)segs[i].n;
    }
    return NULL;
}

/* A growing cursor fed a segment at a time (one ahead of the reads, as a thread pushes the chunk it
 * claims next) asks for the lines a fixed one over all of them would, and waits at the end of what
 * it has been given until more comes; in a buffer of two, the segments it passed are dropped. */
static void test_stream_push(void) {
    T_CASE("prefetch cursor, growing");
    static uint8_t buf[8 * 576];
    const nvfp4moe_cpu_seg segs[] = {{buf + 4 * 576, 3 * 576}, {buf, 576}, {buf + 2 * 576, 2 * 576}, {buf + 7 * 576, 576}};
    const int64_t start[] = {0, 3 * 576, 4 * 576, 6 * 576}, total = 7 * 576;
    const char *cases[] = {"t0:1152", "t1:640", "nta:64", "t2:1024:512", "t1:1600:320", "t0:2048:1024", "t0:8192:1024"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nvfp4moe_cpu_prefetch pf;
        CHECK_OK(nvfp4moe_cpu_prefetch_parse(cases[i], "test", &pf));
        nvfp4moe_cpu_seg room[2];
        nvfp4moe_cpu_stream c;
        nvfp4moe_cpu_stream_open(&c, room, 2, &pf);
        int pushed = 0, bad = 0;
        nvfp4moe_cpu_stream_push(&c, segs, 1);
        pushed = 1;
        for (int64_t done = 0; done <= total + 576; done += 576) {
            if (done > 0) nvfp4moe_cpu_stream_advance(&c, 576);
            if (pushed < 4 && done >= start[pushed - 1]) {
                nvfp4moe_cpu_stream_push(&c, &segs[pushed], 1);
                pushed++;
            }
            const int64_t have = pushed < 4 ? start[pushed] : total;
            const int64_t next = (pf.distance + done) / pf.stride * pf.stride;
            const bool waiting = c.seg == c.end;
            const uint8_t *at = waiting ? NULL : c.seg->p + c.off;
            const uint8_t *want = next < have ? seg_addr(segs, 4, next) : NULL;
            if ((c.hint == NVFP4MOE_CPU_PF_OFF || at != want) && bad++ < 3)
                fprintf(stderr, "  [%s] after %lld bytes, %d segments: %s, want %s\n", cases[i], (long long)done, pushed,
                        waiting ? "waiting" : "asking", want ? "asking" : "waiting");
        }
        CHECK(bad == 0, "%s: %d positions off", cases[i], bad);
    }
    /* more than it has room for: it stops; "off": it keeps nothing */
    nvfp4moe_cpu_prefetch t0;
    CHECK_OK(nvfp4moe_cpu_prefetch_parse("t0:64", "test", &t0));
    nvfp4moe_cpu_seg room[2];
    nvfp4moe_cpu_stream c;
    nvfp4moe_cpu_stream_open(&c, room, 2, &t0);
    nvfp4moe_cpu_stream_push(&c, segs, 3);
    CHECK(c.hint == NVFP4MOE_CPU_PF_OFF, "overflow stops the cursor");
    nvfp4moe_cpu_stream_advance(&c, 576);
    nvfp4moe_cpu_prefetch off;
    CHECK_OK(nvfp4moe_cpu_prefetch_parse("off", "test", &off));
    nvfp4moe_cpu_stream_open(&c, room, 2, &off);
    nvfp4moe_cpu_stream_push(&c, segs, 2);
    CHECK(c.hint == NVFP4MOE_CPU_PF_OFF && c.end == room, "off keeps no segment");
}

static void test_prefetch_settings(void) {
    T_CASE("prefetch settings");
    const char *good[] = {"off", "OFF", "t0:4608", "t1:64", "t2:1048576", "nta:8192:4096", "t0:4096:4096"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        nvfp4moe_cpu_prefetch p, q;
        char text[64];
        CHECK_OK(nvfp4moe_cpu_prefetch_parse(good[i], "NVFP4MOE_CPU_PREFETCH", &p));
        nvfp4moe_cpu_prefetch_format(&p, text, sizeof text);
        CHECK_OK(nvfp4moe_cpu_prefetch_parse(text, "NVFP4MOE_CPU_PREFETCH", &q));
        CHECK(p.hint == q.hint && p.distance == q.distance && p.stride == q.stride, "%s -> %s does not read back", good[i], text);
    }
    const char *bad[] = {"", "on", "t0", "t0:", "t3:4096", "t0:100", "t0:0", "t0:2097152", "t0:4096:8192",
                         "t0:4096:0", "t0:4096:96", "t0:-64", "t0:4096:64:64", "t0:4096x", ":4096", "t0 :4096"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        nvfp4moe_cpu_prefetch p;
        CHECK_ERR(nvfp4moe_cpu_prefetch_parse(bad[i], "NVFP4MOE_CPU_PREFETCH", &p), NVFP4MOE_ERR_INVALID_ARGUMENT,
                  "NVFP4MOE_CPU_PREFETCH='");
    }
    nvfp4moe_cpu_prefetch d;
    const env_save pf_env = env_keep("NVFP4MOE_CPU_PREFETCH");
    unsetenv("NVFP4MOE_CPU_PREFETCH");
    CHECK_OK(nvfp4moe_cpu_prefetch_default(&d));
    CHECK(d.hint != NVFP4MOE_CPU_PF_OFF && d.distance > 0, "a built-in setting");
    setenv("NVFP4MOE_CPU_PREFETCH", "t1:8192:4096", 1);
    CHECK_OK(nvfp4moe_cpu_prefetch_default(&d));
    CHECK(d.hint == NVFP4MOE_CPU_PF_T1 && d.distance == 8192 && d.stride == 4096, "NVFP4MOE_CPU_PREFETCH is read");
    env_restore(&pf_env);
}

// ---- the activation quantizer ----

/* One ISA's quantizer on one row against the codec. */
static void check_quantizer(const nvfp4moe_cpu_kernels *k, const float *x, int64_t K, float gs, int variant) {
    static const int8_t twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    char name[96];
    snprintf(name, sizeof name, "quantize_row %s gs=%g variant %d", nvfp4moe_cpu_isa_name(k->isa), (double)gs, variant);
    T_CASE(name);
    float deq[208], want[208];
    uint8_t xq[104], xs[13], scratch[208];
    nvfp4moe_cpu_qblock blk[16];
    memset(blk, 0x5A, sizeof blk);   /* the padding blocks must come out zero */
    nvfp4moe_cpu_qrow r = {.blk = blk};
    nvfp4moe_cpu_quantize_row(k, x, K, gs, &r, scratch);
    nvfp4moe_qdq_row_as(NVFP4MOE_QUANTIZER_VLLM_TRITON, x, K, gs, NVFP4MOE_DTYPE_F32, want);
    /* The integer kernels make a whole row NaN where the reference has a NaN block (the GEMM output
     * is all NaN either way); elsewhere the row as they read it, q/2 * Sx * 2^-9 / gs, is the
     * reference's within its float32 rounding of s / gs. */
    bool any_nan = false;
    for (int64_t i = 0; i < K; i++) any_nan |= isnan(want[i]);
    int bad = 0;
    const bool row_nan = atomic_load(&r.nan);
    for (int64_t i = 0; i < K && !row_nan; i++) {
        deq[i] = (float)((double)blk[i / 16].q[i % 16] / 2.0 * (double)blk[i / 16].sx / 512.0 / (double)gs);
        if (!(fabsf(deq[i] - want[i]) <= 2.5e-7f * fabsf(want[i])) && bad++ < 3)
            fprintf(stderr, "  [%s] [%lld] got %g want %g\n", name, (long long)i, (double)deq[i], (double)want[i]);
    }
    CHECK(bad == 0 && row_nan == any_nan, "%d values differ; NaN row %d, reference has NaN %d", bad, row_nan, any_nan);
    /* In two parts, as the threads of a forward quantize a row: the same blocks, the row's NaN
     * flag the OR of the parts', the padding blocks zero. */
    nvfp4moe_cpu_qblock parts[16];
    memset(parts, 0x5A, sizeof parts);
    const int64_t cut = 5;
    const bool n0 = k->quantize_blocks(x, cut, gs, parts, scratch);
    const bool n1 = k->quantize_blocks(x + 16 * cut, K / 16 - cut, gs, parts + cut, scratch);
    CHECK(!memcmp(parts, blk, sizeof(nvfp4moe_cpu_qblock) * (size_t)(K / 16)) && (n0 || n1) == row_nan,
          "the row quantized in two parts differs from the whole (NaN %d %d, whole %d)", n0, n1, row_nan);
    int nonzero = 0;
    for (int64_t b = K / 16; b < nvfp4moe_cpu_superblocks(K) * 4; b++)
        nonzero += blk[b].corr != 0 || blk[b].sx != 0 || memcmp(blk[b].q, (int8_t[16]){0}, 16) != 0;
    CHECK(nonzero == 0, "%d padding blocks are not zero", nonzero);
    if (!(isfinite(gs) && gs > 0.0f)) return;
    /* the codes, the scales and the kernels' correction term, bit for bit */
    nvfp4moe_quantize_as(NVFP4MOE_QUANTIZER_VLLM_TRITON, x, 1, K, gs, xq, xs);
    int diff = 0;
    for (int64_t b = 0; b < K / 16; b++) {
        int32_t sum = 0;
        for (int i = 0; i < 16; i++) {
            diff += blk[b].q[i] != twice[code_at(xq, K, 0, 16 * b + i)];
            sum += blk[b].q[i];
        }
        diff += blk[b].corr != -12 * sum;
        if ((xs[b] & 0x7F) != 0x7F) diff += blk[b].sx != nvfp4moe_cpu_e4m3_int(xs[b]) * ((xs[b] & 0x80) ? -1 : 1);
    }
    CHECK(diff == 0, "%d codes, scales or sums differ from nvfp4moe_quantize_as", diff);
}

static void test_quantizer(void) {
    const int64_t K = 208;
    const float gss[] = {1.0f, 0.37f, 2688.0f / 3.5f, 1e-6f, 1e30f, INFINITY, 0.0f};
    float x[208];
    for (size_t g = 0; g < sizeof gss / sizeof gss[0]; g++)
        for (int v = 0; v < 5; v++) {
            nvfp4moe_fill_normal(x, NVFP4MOE_DTYPE_F32, K, 300 + (uint64_t)(10 * g) + (uint64_t)v);
            if (v == 1) for (int i = 16; i < 32; i++) x[i] = 0.0f;          /* a zero block */
            if (v == 2) x[40] = INFINITY;
            if (v == 3) x[77] = NAN;
            if (v == 4) for (int i = 0; i < K; i++) x[i] = (float)(i % 29 - 14) * 0.125f;   /* rounding ties */
            for (int isa = 0; isa < NVFP4MOE_CPU_ISA_COUNT; isa++) {
                const nvfp4moe_cpu_kernels *k = nvfp4moe_cpu_kernels_of((nvfp4moe_cpu_isa)isa);
                if (k) check_quantizer(k, x, K, gss[g], v);
            }
        }
}

// ---- the layer ----

/* Runs cfg on CPU_FAST (threads, the current NVFP4MOE_CPU_ISA) into got [M, H] float. */
static nvfp4moe_status run_fast(const nvfp4moe_config *cfg, const nvfp4moe_weights *w, const nvfp4moe_io *in,
                                int threads, float *got) {
    return t_run_host("cpu_fast", cfg, w, in, threads, got);
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* W4A4 with activation input scales that are powers of two (the global scales then are too, and
 * the reference's float32 dequantized activations are exact), one expert per token with weight 1:
 * each output is one expert's output, which CPU_FAST computes exactly and rounds once; the float64
 * reference sums in float64 and rounds once. They must agree within one float32 ulp. */
static void test_exact_w4a4(nvfp4moe_config c, int64_t M, uint64_t seed) {
    char desc[200], name[260];
    c.scheme = NVFP4MOE_SCHEME_W4A4;
    c.top_k = 1;
    c.out_dtype = NVFP4MOE_DTYPE_F32;
    nvfp4moe_config_describe(&c, desc, sizeof desc);
    snprintf(name, sizeof name, "exact W4A4, M=%lld %s", (long long)M, desc);
    T_CASE(name);
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, seed, &l));
    if (!l) return;
    const int64_t E = c.num_experts, H = c.hidden_size;
    float *in_scales = malloc(sizeof(float) * (size_t)(2 * E));
    for (int64_t e = 0; e < 2 * E; e++) {
        const float v = e < E ? l->w.w13_input_scale[e] : l->w.w2_input_scale[e - E];
        in_scales[e] = exp2f(rintf(log2f(v)) + (float)(e % 3));   /* powers of two, differing per expert */
    }
    nvfp4moe_weights w = l->w;
    w.w13_input_scale = in_scales;
    w.w2_input_scale = in_scales + E;
    uint16_t *hidden = malloc(sizeof(uint16_t) * (size_t)(M * H));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)M);
    float *tw = malloc(sizeof(float) * (size_t)M), *want = malloc(sizeof(float) * (size_t)(M * H));
    float *got = malloc(sizeof(float) * (size_t)(M * H));
    nvfp4moe_fill_normal(hidden, NVFP4MOE_DTYPE_BF16, M * H, seed + 1);
    uint64_t s = seed;
    for (int64_t t = 0; t < M; t++) {
        ids[t] = (int32_t)(nvfp4moe_rand_u64(&s) % (uint64_t)E);
        tw[t] = 1.0f;
    }
    nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .topk_ids = ids, .topk_weights = tw, .output = want};
    CHECK_OK(nvfp4moe_reference_forward(&c, &w, &io));
    const env_save isa_env = env_keep("NVFP4MOE_CPU_ISA");
    for (int isa = 0; isa < NVFP4MOE_CPU_ISA_COUNT; isa++) {
        if (!nvfp4moe_cpu_isa_supported((nvfp4moe_cpu_isa)isa)) continue;
        setenv("NVFP4MOE_CPU_ISA", nvfp4moe_cpu_isa_name((nvfp4moe_cpu_isa)isa), 1);
        CHECK_OK(run_fast(&c, &w, &io, 0, got));
        int64_t same = 0, one = 0, worse = 0;
        for (int64_t i = 0; i < M * H; i++) {
            const uint32_t a = bits(got[i]), b = bits(want[i]);
            const int64_t d = (a >> 31) != (b >> 31) ? (got[i] == want[i] ? 0 : 2) : (int64_t)a - (int64_t)b;
            if (d == 0) same++;
            else if (d == 1 || d == -1) one++;
            else if (worse++ < 5)
                fprintf(stderr, "  [%s] %s [%lld] got %.9g want %.9g\n", name, nvfp4moe_cpu_isa_name((nvfp4moe_cpu_isa)isa),
                        (long long)i, (double)got[i], (double)want[i]);
        }
        CHECK(worse == 0, "%s: %lld of %lld outputs are more than one ulp from the reference",
              nvfp4moe_cpu_isa_name((nvfp4moe_cpu_isa)isa), (long long)worse, (long long)(M * H));
        printf("test_cpu_fast: %s, %s: %lld of %lld outputs bit-identical to the float64 reference, %lld one ulp apart\n",
               name, nvfp4moe_cpu_isa_name((nvfp4moe_cpu_isa)isa), (long long)same, (long long)(M * H), (long long)one);
    }
    env_restore(&isa_env);
    free(in_scales); free(hidden); free(ids); free(tw); free(want); free(got);
    nvfp4moe_layer_free(l);
}

/* The same outputs, bit for bit, for every ISA this CPU runs, 1 to 7 threads (7: more threads than
 * GEMM1 has column tiles, one of them idle there) and several prefetch settings; and a token alone
 * as in its batch. */
static void test_invariance(nvfp4moe_scheme scheme, nvfp4moe_activation act, bool bias) {
    char name[160];
    snprintf(name, sizeof name, "invariance %s %s%s", nvfp4moe_scheme_name(scheme), nvfp4moe_activation_name(act),
             bias ? " bias" : "");
    T_CASE(name);
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);
    c.num_experts = 12;
    c.top_k = 3;
    c.hidden_size = 160;   /* multiples of 32 (MXFP8), not of 64 (a padded superblock) */
    c.intermediate_size = 96;
    c.scheme = scheme;
    c.activation = act;
    c.has_bias = bias;
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, 77, &l));
    if (!l) return;
    enum { M = 13, H = 160 };
    uint16_t hidden[M * H];
    float logits[M * 12], first[M * H], got[M * H];
    nvfp4moe_fill_normal(hidden, NVFP4MOE_DTYPE_BF16, M * H, 78);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, M * 12, 79);
    nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits};
    static const char *const prefetch[] = {"", "off", "t1:1152:128", "nta:64", "t0:65536:4096"};
    static const int threads[] = {1, 2, 3, 5, 7};
    bool have = false;
    int run = 0;
    const env_save isa_env = env_keep("NVFP4MOE_CPU_ISA");
    for (int isa = 0; isa < NVFP4MOE_CPU_ISA_COUNT; isa++) {
        if (!nvfp4moe_cpu_isa_supported((nvfp4moe_cpu_isa)isa)) continue;
        setenv("NVFP4MOE_CPU_ISA", nvfp4moe_cpu_isa_name((nvfp4moe_cpu_isa)isa), 1);
        for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++, run++) {
            const char *pf = prefetch[run % 5];
            setenv("NVFP4MOE_CPU_PREFETCH", pf, 1);
            nvfp4moe_status st = run_fast(&c, &l->w, &io, threads[ti], have ? got : first);
            CHECK(st == NVFP4MOE_OK, "%s", nvfp4moe_last_error());
            if (have && st == NVFP4MOE_OK) {
                char what[96];
                snprintf(what, sizeof what, "%s, %d threads, prefetch '%s'", nvfp4moe_cpu_isa_name((nvfp4moe_cpu_isa)isa),
                         threads[ti], pf);
                check_bytes(what, (const uint8_t *)got, (const uint8_t *)first, sizeof first);
            }
            if (!have && st == NVFP4MOE_OK) {
                int nonfinite = 0;
                for (int i = 0; i < M * H; i++) nonfinite += !isfinite(first[i]);
                CHECK(nonfinite == 0, "%d outputs are not finite", nonfinite);
            }
            have = true;
        }
    }
    env_restore(&isa_env);
    unsetenv("NVFP4MOE_CPU_PREFETCH");
    nvfp4moe_io one = {.num_tokens = 1, .hidden = hidden + 7 * H, .router_logits = logits + 7 * 12};
    CHECK_OK(run_fast(&c, &l->w, &one, 0, got));
    check_bytes("token 7 alone", (const uint8_t *)got, (const uint8_t *)(first + 7 * H), H * sizeof(float));
    nvfp4moe_layer_free(l);
}

/* Which thread runs which GEMM chunk, and how the shares are cut, change no bit. Against one
 * thread: 2, 3 and 5 threads (on this machine's CPUs, in turn, so the claiming interleaves
 * differently from run to run), each forward repeated; with every thread but one idle (that one
 * then runs every chunk, all but its own share's stolen), for each thread in turn; with some
 * threads slowed before each chunk, so that the others take over part of their shares; with
 * NVFP4MOE_CPU_CHUNKS at 1 and at its largest. float32 outputs, compared bit for bit; in every
 * run the threads' chunks read each active expert's weights exactly once between them (the
 * profile's bytes). No timing is checked: the slowed runs may or may not move chunks. */
static void test_schedule(nvfp4moe_scheme scheme, nvfp4moe_activation act, bool bias, int64_t M) {
    char name[160];
    snprintf(name, sizeof name, "schedule %s %s%s, M=%lld", nvfp4moe_scheme_name(scheme), nvfp4moe_activation_name(act),
             bias ? " bias" : "", (long long)M);
    T_CASE(name);
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);
    c.num_experts = 16;
    c.top_k = 4;
    c.hidden_size = 320;        /* 20 output tiles, a padded superblock */
    c.intermediate_size = 192;  /* 12 units of 16 columns */
    c.scheme = scheme;
    c.activation = act;
    c.has_bias = bias;
    c.has_swiglu_limit = act == NVFP4MOE_ACT_SWIGLUOAI;
    c.swiglu_limit = 7.0;
    c.out_dtype = NVFP4MOE_DTYPE_F32;
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, 301, &l));
    if (!l) return;
    enum { H = 320, E = 16, MMAX = 16 };
    uint16_t hidden[MMAX * H], decoy_hidden[MMAX * H];
    float logits[MMAX * E], decoy_logits[MMAX * E], want[MMAX * H], got[MMAX * H];
    nvfp4moe_fill_normal(hidden, NVFP4MOE_DTYPE_BF16, MMAX * H, 302);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, MMAX * E, 303);
    nvfp4moe_fill_normal(decoy_hidden, NVFP4MOE_DTYPE_BF16, MMAX * H, 304);
    nvfp4moe_fill_normal(decoy_logits, NVFP4MOE_DTYPE_F32, MMAX * E, 305);
    const size_t bytes = sizeof(float) * (size_t)(M * H);
    nvfp4moe_device dev = t_cpu();
    const env_save chunks_env = env_keep("NVFP4MOE_CPU_CHUNKS");
    unsetenv("NVFP4MOE_CPU_CHUNKS");
    static const int threads[] = {1, 2, 3, 5};
    int64_t total = -1;   /* the weight bytes a forward reads */
    int runs = 0, stolen_runs = 0, bad_bytes = 0, bad_idle = 0;
    for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
        const int T = threads[ti];
        for (int setting = 0; setting < (T == 3 ? 3 : 1); setting++) {
            if (setting == 1) setenv("NVFP4MOE_CPU_CHUNKS", "1", 1);
            if (setting == 2) setenv("NVFP4MOE_CPU_CHUNKS", "4096", 1);
            nvfp4moe_plan_options po = {.backend = "cpu_fast", .device = &dev, .num_threads = T};
            nvfp4moe_plan *plan = NULL;
            CHECK_OK(nvfp4moe_plan_create(&c, &l->w, &po, &plan));
            unsetenv("NVFP4MOE_CPU_CHUNKS");
            if (!plan) continue;
            const nvfp4moe_cpu_profile *pr = nvfp4moe_cpu_fast_profile(plan, true);
            CHECK(pr != NULL, "a profile");
            if (T > 1) {
                const nvfp4moe_cpu_steer all = {.idle = ((uint64_t)1 << T) - 1};
                CHECK_ERR(nvfp4moe_cpu_fast_steer(plan, &all), NVFP4MOE_ERR_INVALID_ARGUMENT, "no thread");
            }
            /* the steerings: none (3 times), each thread alone, slowed threads */
            nvfp4moe_cpu_steer steers[16];
            int ns = 0;
            for (int r = 0; r < 3; r++) steers[ns++] = (nvfp4moe_cpu_steer){0};
            for (int t = 0; t < T && T > 1; t++) steers[ns++] = (nvfp4moe_cpu_steer){.idle = (((uint64_t)1 << T) - 1) & ~((uint64_t)1 << t)};
            if (T > 1) {
                steers[ns++] = (nvfp4moe_cpu_steer){.slow = 1, .slow_ns = 200000};
                steers[ns++] = (nvfp4moe_cpu_steer){.slow = 0x5, .slow_ns = 100000};
                steers[ns++] = (nvfp4moe_cpu_steer){.slow = (uint64_t)1 << (T - 1), .slow_ns = 300000};
            }
            for (int k = 0; k < ns; k++) {
                CHECK_OK(nvfp4moe_cpu_fast_steer(plan, &steers[k]));
                uint8_t out[MMAX * H * sizeof(float)];
                /* another batch first, so that a value read before this forward wrote it (the plan
                 * keeps its workspace) is another one */
                nvfp4moe_io decoy = {.num_tokens = M, .hidden = decoy_hidden, .router_logits = decoy_logits, .output = out};
                CHECK_OK(nvfp4moe_plan_forward(plan, &decoy, NULL));
                memset(out, 0xFF, bytes);
                nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits, .output = out};
                const nvfp4moe_status st = nvfp4moe_plan_forward(plan, &io, NULL);
                CHECK(st == NVFP4MOE_OK, "%s", nvfp4moe_last_error());
                if (st != NVFP4MOE_OK) continue;
                memcpy(runs == 0 ? want : got, out, bytes);
                if (runs > 0) {
                    char what[160];
                    snprintf(what, sizeof what, "%d threads, chunks %s, idle %#llx, slow %#llx", T,
                             setting == 0 ? "default" : setting == 1 ? "1" : "4096", (unsigned long long)steers[k].idle,
                             (unsigned long long)steers[k].slow);
                    check_bytes(what, (const uint8_t *)got, (const uint8_t *)want, bytes);
                } else {
                    int nonfinite = 0;
                    for (int64_t i = 0; i < M * H; i++) nonfinite += !isfinite(want[i]);
                    CHECK(nonfinite == 0, "%d outputs are not finite", nonfinite);
                }
                runs++;
                if (!pr) continue;
                int64_t sum = 0, stolen = 0;
                for (int t = 0; t < pr->nthreads; t++) {
                    sum += pr->thread[t].bytes[0] + pr->thread[t].bytes[1];
                    stolen += pr->thread[t].stolen[0] + pr->thread[t].stolen[1];
                    const bool idle = steers[k].idle >> t & 1;
                    if (idle && pr->thread[t].chunks[0] + pr->thread[t].chunks[1] != 0) bad_idle++;
                }
                if (total < 0) total = sum;
                if (sum != total || sum <= 0) bad_bytes++;
                if (steers[k].idle) stolen_runs += stolen > 0;
            }
            nvfp4moe_plan_destroy(plan);
        }
    }
    env_restore(&chunks_env);
    CHECK(bad_bytes == 0, "%d runs whose chunks did not read each active expert's weights exactly once", bad_bytes);
    CHECK(bad_idle == 0, "%d idle threads ran chunks", bad_idle);
    /* a thread alone runs the other shares' chunks: for 2, 3 (three chunk settings) and 5 threads,
     * each in turn */
    CHECK(stolen_runs == 2 + 3 * 3 + 5, "%d runs with one thread alone stole chunks, want %d", stolen_runs, 2 + 3 * 3 + 5);
    nvfp4moe_layer_free(l);
}

/* A NaN or an infinity in a token's hidden state: its output row is NaN, as the reference's, and
 * the other tokens are untouched. */
static void test_nonfinite_inputs(nvfp4moe_scheme scheme) {
    char name[96];
    snprintf(name, sizeof name, "non-finite inputs %s", nvfp4moe_scheme_name(scheme));
    T_CASE(name);
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);
    c.num_experts = 8;
    c.top_k = 2;
    c.hidden_size = 64;
    c.intermediate_size = 32;
    c.scheme = scheme;
    c.in_dtype = c.out_dtype = NVFP4MOE_DTYPE_F32;
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, 5, &l));
    if (!l) return;
    enum { M = 4 };
    float hidden[M * 64], logits[M * 8], want[M * 64], got[M * 64];
    nvfp4moe_fill_normal(hidden, NVFP4MOE_DTYPE_F32, M * 64, 6);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, M * 8, 7);
    hidden[1 * 64 + 5] = NAN;
    hidden[2 * 64 + 40] = INFINITY;
    nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits, .output = want};
    CHECK_OK(nvfp4moe_reference_forward(&c, &l->w, &io));
    CHECK_OK(run_fast(&c, &l->w, &io, 0, got));
    int bad = 0;
    for (int i = 0; i < M * 64; i++) {
        const bool ok = isnan(want[i]) ? isnan(got[i]) : !isnan(got[i]) && fabsf(got[i] - want[i]) <= 1e-2f * (fabsf(want[i]) + 1.0f);
        if (!ok && bad++ < 5) fprintf(stderr, "  [%s] [%d] got %g want %g\n", name, i, (double)got[i], (double)want[i]);
    }
    CHECK(bad == 0, "%d outputs differ in kind or value", bad);
    nvfp4moe_layer_free(l);
}

/* Bad thread counts and ISA names are refused at plan creation, naming the setting. */
static void test_settings(void) {
    T_CASE("CPU settings");
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);
    c.num_experts = 4;
    c.top_k = 1;
    c.hidden_size = 32;
    c.intermediate_size = 16;
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, 1, &l));
    if (!l) return;
    nvfp4moe_device dev = t_cpu();
    nvfp4moe_plan *plan = NULL;
    nvfp4moe_plan_options po = {.backend = "cpu_fast", .device = &dev, .num_threads = -2};
    CHECK_ERR(nvfp4moe_plan_create(&c, &l->w, &po, &plan), NVFP4MOE_ERR_INVALID_ARGUMENT, "num_threads=-2");
    po.num_threads = 0;
    setenv("NVFP4MOE_NUM_THREADS", "two", 1);
    CHECK_ERR(nvfp4moe_plan_create(&c, &l->w, &po, &plan), NVFP4MOE_ERR_INVALID_ARGUMENT, "NVFP4MOE_NUM_THREADS='two'");
    setenv("NVFP4MOE_NUM_THREADS", "3", 1);
    CHECK_OK(nvfp4moe_plan_create(&c, &l->w, &po, &plan));
    nvfp4moe_plan_destroy(plan);
    plan = NULL;
    unsetenv("NVFP4MOE_NUM_THREADS");
    env_save isa = env_keep("NVFP4MOE_CPU_ISA");
    setenv("NVFP4MOE_CPU_ISA", "sse9", 1);
    CHECK_ERR(nvfp4moe_plan_create(&c, &l->w, &po, &plan), NVFP4MOE_ERR_INVALID_ARGUMENT, "NVFP4MOE_CPU_ISA='sse9'");
    env_restore(&isa);
    setenv("NVFP4MOE_CPU_PREFETCH", "t9:4096", 1);
    CHECK_ERR(nvfp4moe_plan_create(&c, &l->w, &po, &plan), NVFP4MOE_ERR_INVALID_ARGUMENT, "NVFP4MOE_CPU_PREFETCH='t9:4096'");
    unsetenv("NVFP4MOE_CPU_PREFETCH");
    static const char *const chunks[] = {"0", "4097", "16x", "-3"};
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "NVFP4MOE_CPU_CHUNKS='%s'", chunks[i]);
        setenv("NVFP4MOE_CPU_CHUNKS", chunks[i], 1);
        CHECK_ERR(nvfp4moe_plan_create(&c, &l->w, &po, &plan), NVFP4MOE_ERR_INVALID_ARGUMENT, want);
    }
    unsetenv("NVFP4MOE_CPU_CHUNKS");
    CHECK(plan == NULL, "no plan on failure");
    nvfp4moe_layer_free(l);
}

/* The benchmark's handles on a plan: its prefetch setting, and the phase times of a forward, in
 * the order the phases run. */
static void test_plan_internals(void) {
    T_CASE("prefetch setting and profile of a plan");
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);
    c.num_experts = 8;
    c.top_k = 2;
    c.hidden_size = 128;
    c.intermediate_size = 64;
    c.scheme = NVFP4MOE_SCHEME_W4A4;
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, 9, &l));
    if (!l) return;
    nvfp4moe_device dev = t_cpu();
    nvfp4moe_plan_options po = {.backend = "cpu_fast", .device = &dev, .num_threads = 3};
    nvfp4moe_plan *plan = NULL, *ref = NULL;
    CHECK_OK(nvfp4moe_plan_create(&c, &l->w, &po, &plan));
    po.backend = "cpu_reference";
    CHECK_OK(nvfp4moe_plan_create(&c, &l->w, &po, &ref));
    if (!plan || !ref) goto out;
    nvfp4moe_cpu_prefetch set, got;
    CHECK_OK(nvfp4moe_cpu_prefetch_parse("t2:2048:128", "test", &set));
    CHECK_OK(nvfp4moe_cpu_fast_prefetch(plan, &set, NULL));
    CHECK_OK(nvfp4moe_cpu_fast_prefetch(plan, NULL, &got));
    CHECK(got.hint == set.hint && got.distance == set.distance && got.stride == set.stride, "the setting reads back");
    CHECK_ERR(nvfp4moe_cpu_fast_prefetch(ref, &set, NULL), NVFP4MOE_ERR_INVALID_ARGUMENT, "not a CPU_FAST plan");
    CHECK(nvfp4moe_cpu_fast_profile(ref, true) == NULL, "no profile of another backend");
    const nvfp4moe_cpu_profile *pr = nvfp4moe_cpu_fast_profile(plan, true);
    CHECK(pr && pr->nthreads == 3, "a profile of 3 threads");
    enum { M = 5 };
    uint16_t hidden[M * 128], out[M * 128];
    float logits[M * 8];
    nvfp4moe_fill_normal(hidden, NVFP4MOE_DTYPE_BF16, M * 128, 10);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, M * 8, 11);
    nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits, .output = out};
    CHECK_OK(nvfp4moe_plan_forward(plan, &io, NULL));
    if (pr) {
        int bad = !(pr->entry <= pr->run && pr->run <= pr->joined && pr->joined <= pr->exit && pr->passes == 1);
        for (int t = 0; t < pr->nthreads; t++) {
            bad += pr->thread[t].t[0] < pr->run || pr->thread[t].t[NVFP4MOE_CPU_AT_END] > pr->joined;
            for (int k = 1; k < NVFP4MOE_CPU_AT_COUNT; k++) bad += pr->thread[t].t[k] < pr->thread[t].t[k - 1];
        }
        /* no thread leaves a barrier before the last one reached it */
        for (int t = 0; t < pr->nthreads; t++)
            for (int u = 0; u < pr->nthreads; u++)
                bad += pr->thread[t].t[NVFP4MOE_CPU_AT_GEMM1_GO] < pr->thread[u].t[NVFP4MOE_CPU_AT_INPUTS] ||
                       pr->thread[t].t[NVFP4MOE_CPU_AT_GEMM2_GO] < pr->thread[u].t[NVFP4MOE_CPU_AT_ROWS];
        CHECK(bad == 0, "%d times out of order", bad);
    }
    CHECK(nvfp4moe_cpu_fast_profile(plan, false) == NULL, "recording off");
    CHECK_OK(nvfp4moe_plan_forward(plan, &io, NULL));
out:
    nvfp4moe_plan_destroy(plan);
    nvfp4moe_plan_destroy(ref);
    nvfp4moe_layer_free(l);
}

// ---- the pool ----

typedef struct {
    nvfp4moe_cpu_pool *pool;
    int counts[8][64];
    int bad;
} pool_job;

/* 64 phases; in each, every thread bumps its own counter, then after the barrier checks everyone's. */
static void pool_task(void *ctx, int tid, int n) {
    pool_job *j = ctx;
    for (int ph = 0; ph < 64; ph++) {
        j->counts[tid][ph]++;
        nvfp4moe_cpu_pool_barrier(j->pool);
        for (int t = 0; t < n; t++)
            if (j->counts[t][ph] != j->counts[0][ph]) j->bad = 1;
        nvfp4moe_cpu_pool_barrier(j->pool);
    }
}

typedef struct {
    nvfp4moe_cpu_pool *pool;
    pool_job job;
} caller;

static void *caller_main(void *arg) {
    caller *c = arg;
    c->job.pool = c->pool;
    for (int r = 0; r < 20; r++) nvfp4moe_cpu_pool_run(c->pool, pool_task, &c->job);
    return NULL;
}

static void test_pool(void) {
    T_CASE("thread pool");
    nvfp4moe_cpu_pool *p = NULL, *q = NULL;
    CHECK_OK(nvfp4moe_cpu_pool_get(3, &p));
    CHECK_OK(nvfp4moe_cpu_pool_get(3, &q));
    if (!p || !q) return;
    CHECK(p == q, "one pool per thread count");
    enum { CALLERS = 3 };
    caller c[CALLERS];
    pthread_t th[CALLERS];
    memset(c, 0, sizeof c);
    for (int i = 0; i < CALLERS; i++) {
        c[i].pool = p;
        pthread_create(&th[i], NULL, caller_main, &c[i]);
    }
    for (int i = 0; i < CALLERS; i++) pthread_join(th[i], NULL);
    const int n = nvfp4moe_cpu_pool_size(p);
    int bad = 0;
    for (int i = 0; i < CALLERS; i++) {
        bad += c[i].job.bad;
        for (int t = 0; t < n; t++)
            for (int ph = 0; ph < 64; ph++) bad += c[i].job.counts[t][ph] != 20;
    }
    CHECK(n == 3 && bad == 0, "%d threads, %d mismatches", n, bad);
    nvfp4moe_cpu_pool_put(q);
    nvfp4moe_cpu_pool_put(p);
}

/* Sleeps ms milliseconds: longer than the workers' idle poll (10 ms), so that they sleep. */
static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0) {}
}

typedef struct {
    int cpu[64];   /* the CPU each thread ran on */
} where_job;

static void where_task(void *ctx, int tid, int n) {
    where_job *j = ctx;
    if (tid < 64) j->cpu[tid] = sched_getcpu();
}

/* While a pool has no more threads than CPUs, no worker runs on the caller's CPU, whichever CPU
 * the caller is on (the scheduler may move it, or another thread may run the pool): a worker there
 * would share a core with the caller, and the caller would wait for it at each barrier and at the
 * join (in the bench, for a scheduler tick: milliseconds of join on a 0.4 ms forward). The caller
 * is moved onto each CPU in turn, then onto the first again after the workers went to sleep. */
static void test_pool_caller_cpu(void) {
    T_CASE("thread pool: the caller's CPU");
    cpu_set_t keep;
    if (sched_getaffinity(0, sizeof keep, &keep) != 0) return;
    int cpus[16], ncpu = 0;
    for (int c = 0; c < CPU_SETSIZE && ncpu < 16; c++)
        if (CPU_ISSET(c, &keep)) cpus[ncpu++] = c;
    if (ncpu < 2) {
        printf("test_cpu_fast: one CPU: the caller's CPU is not tested\n");
        return;
    }
    const int counts[2] = {ncpu, 2};   /* as many threads as CPUs, and fewer */
    for (int k = 0; k < (ncpu > 2 ? 2 : 1); k++) {
        const int n = counts[k];
        nvfp4moe_cpu_pool *p = NULL;
        CHECK_OK(nvfp4moe_cpu_pool_get(n, &p));
        if (!p) return;
        const int T = nvfp4moe_cpu_pool_size(p);
        int bad = 0, ran = 0;
        for (int i = 0; i <= ncpu; i++) {
            const int c = cpus[i % ncpu];
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(c, &one);
            if (sched_setaffinity(0, sizeof one, &one) != 0) continue;
            if (i == ncpu) sleep_ms(30);
            where_job j;
            memset(&j, 0xFF, sizeof j);
            nvfp4moe_cpu_pool_run(p, where_task, &j);
            ran++;
            bad += j.cpu[0] != c;
            for (int t = 1; t < T; t++) {
                bad += j.cpu[t] < 0;
                if (j.cpu[t] == j.cpu[0]) {
                    if (bad++ < 3) fprintf(stderr, "  %d threads: worker %d runs on the caller's CPU %d\n", T, t, c);
                }
            }
        }
        sched_setaffinity(0, sizeof keep, &keep);
        CHECK(ran > 0 && bad == 0, "%d threads, caller on %d CPUs in turn: %d mismatches", T, ran, bad);
        nvfp4moe_cpu_pool_put(p);
    }
}

/* Work handed to workers that went to sleep after their idle poll completes, on pools with fewer
 * threads than CPUs, as many and more; a plan's forwards after such a sleep give the same bits for
 * every thread count. */
static void test_pool_sleep(void) {
    T_CASE("thread pool: runs after the workers slept");
    for (int n = 2; n <= 5; n += 3) {
        nvfp4moe_cpu_pool *p = NULL;
        CHECK_OK(nvfp4moe_cpu_pool_get(n, &p));
        if (!p) return;
        pool_job job;
        memset(&job, 0, sizeof job);
        job.pool = p;
        enum { RUNS = 3 };
        for (int r = 0; r < RUNS; r++) {
            sleep_ms(30);
            nvfp4moe_cpu_pool_run(p, pool_task, &job);
            nvfp4moe_cpu_pool_run(p, pool_task, &job);   /* and once more at once: awake */
        }
        const int T = nvfp4moe_cpu_pool_size(p);
        int bad = job.bad;
        for (int t = 0; t < T; t++)
            for (int ph = 0; ph < 64; ph++) bad += job.counts[t][ph] != 2 * RUNS;
        CHECK(T == n && bad == 0, "%d threads: %d mismatches", T, bad);
        nvfp4moe_cpu_pool_put(p);
    }
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);
    c.num_experts = 8;
    c.top_k = 2;
    c.hidden_size = 256;
    c.intermediate_size = 128;
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&c, 31, &l));
    if (!l) return;
    enum { M = 6, H = 256 };
    uint16_t hidden[M * H], out[M * H], first[M * H];
    float logits[M * 8];
    nvfp4moe_fill_normal(hidden, NVFP4MOE_DTYPE_BF16, M * H, 32);
    nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, M * 8, 33);
    nvfp4moe_device dev = t_cpu();
    static const int threads[] = {1, 2, 3};
    bool have = false;
    for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
        nvfp4moe_plan_options po = {.backend = "cpu_fast", .device = &dev, .num_threads = threads[ti]};
        nvfp4moe_plan *plan = NULL;
        CHECK_OK(nvfp4moe_plan_create(&c, &l->w, &po, &plan));
        if (!plan) continue;
        for (int r = 0; r < 2; r++) {
            sleep_ms(30);
            memset(out, 0xFF, sizeof out);
            nvfp4moe_io io = {.num_tokens = M, .hidden = hidden, .router_logits = logits, .output = out};
            CHECK_OK(nvfp4moe_plan_forward(plan, &io, NULL));
            if (!have) memcpy(first, out, sizeof out);
            else {
                char what[64];
                snprintf(what, sizeof what, "%d threads, forward %d after a sleep", threads[ti], r + 1);
                check_bytes(what, (const uint8_t *)out, (const uint8_t *)first, sizeof out);
            }
            have = true;
        }
        nvfp4moe_plan_destroy(plan);
    }
    nvfp4moe_layer_free(l);
}

int main(void) {
    uint64_t seed = 4242;
    printf("test_cpu_fast: kernels on this CPU:");
    for (int i = 0; i < NVFP4MOE_CPU_ISA_COUNT; i++)
        if (nvfp4moe_cpu_isa_supported((nvfp4moe_cpu_isa)i)) printf(" %s", nvfp4moe_cpu_isa_name((nvfp4moe_cpu_isa)i));
    printf("\n");
    test_e4m3_int();
    const int64_t shapes[][2] = {{16, 16}, {32, 48}, {16, 64}, {48, 144}, {32, 208}, {16, 1024}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int nt = 1; nt <= NVFP4MOE_CPU_MAX_NT; nt += (nt < 3 ? 1 : 4)) {
            test_gemm_q(shapes[i][0], shapes[i][1], nt, seed++, 0);
            test_gemm_f(shapes[i][0], shapes[i][1], nt, seed++);
        }
    test_gemm_q(16, 4096, 8, seed++, 1);
    test_gemm_q(16, NVFP4MOE_CPU_MAX_K, 1, seed++, 1);   /* the largest K: the int64 sums at their bound */
    test_quantizer();
    const nvfp4moe_activation acts[] = {NVFP4MOE_ACT_SILU, NVFP4MOE_ACT_SWIGLUOAI, NVFP4MOE_ACT_GELU, NVFP4MOE_ACT_RELU2_NO_MUL};
    const int dims[][3] = {{16, 256, 128}, {8, 144, 80}, {32, 64, 208}, {4, 2048, 768}};
    for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++) {
        nvfp4moe_config c;
        nvfp4moe_config_init(&c);
        c.num_experts = dims[a][0];
        c.hidden_size = dims[a][1];
        c.intermediate_size = dims[a][2];
        c.activation = acts[a];
        c.has_swiglu_limit = acts[a] == NVFP4MOE_ACT_SWIGLUOAI;
        c.swiglu_limit = 7.0;
        test_exact_w4a4(c, 24, seed++);
    }
    test_invariance(NVFP4MOE_SCHEME_W4A4, NVFP4MOE_ACT_SILU, false);
    test_invariance(NVFP4MOE_SCHEME_W4A4, NVFP4MOE_ACT_SWIGLUOAI, true);   /* gate and up interleaved */
    test_invariance(NVFP4MOE_SCHEME_W4A4, NVFP4MOE_ACT_RELU2_NO_MUL, false);
    test_invariance(NVFP4MOE_SCHEME_W4A4_PER_TOKEN, NVFP4MOE_ACT_GELU, false);
    test_invariance(NVFP4MOE_SCHEME_W4A16, NVFP4MOE_ACT_SILU, true);
    test_invariance(NVFP4MOE_SCHEME_W4A8_MXFP8, NVFP4MOE_ACT_RELU2, false);
    test_schedule(NVFP4MOE_SCHEME_W4A4, NVFP4MOE_ACT_SILU, false, 1);
    test_schedule(NVFP4MOE_SCHEME_W4A4, NVFP4MOE_ACT_SILU, false, 16);
    test_schedule(NVFP4MOE_SCHEME_W4A4, NVFP4MOE_ACT_SWIGLUOAI, true, 3);   /* gate and up interleaved */
    test_schedule(NVFP4MOE_SCHEME_W4A4_PER_TOKEN, NVFP4MOE_ACT_GELU, false, 5);
    test_schedule(NVFP4MOE_SCHEME_W4A16, NVFP4MOE_ACT_SILU, true, 1);
    test_schedule(NVFP4MOE_SCHEME_W4A8_MXFP8, NVFP4MOE_ACT_RELU2, false, 7);
    test_nonfinite_inputs(NVFP4MOE_SCHEME_W4A4);
    test_nonfinite_inputs(NVFP4MOE_SCHEME_W4A4_PER_TOKEN);
    test_nonfinite_inputs(NVFP4MOE_SCHEME_W4A16);
    test_settings();
    test_stream();
    test_stream_push();
    test_prefetch_settings();
    test_plan_internals();
    test_pool();
    test_pool_caller_cpu();
    test_pool_sleep();
    return t_finish("test_cpu_fast");
}
