/*
 * cpu.h - the pieces of the CPU_FAST backend (src/backends/cpu_fast.c): a shared thread pool
 * (cpu_pool.c), and the repacked weight layout, the activation rows and the GEMM kernels with
 * their runtime ISA dispatch (cpu_gemm.c). Private to src/backends/; the tests and the CPU
 * benchmark use it through the static library.
 *
 * The W4A4 arithmetic, exact
 * --------------------------
 * Twice an E2M1 value is an integer in {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12}, and an E4M3 value times
 * 2^9 is an integer m << sh with m <= 15 and sh <= 14 (below 2^18). So with both operands in NVFP4,
 * a 16-element block's dot product is
 *     sum_i xq_i wq_i = D * Sx * Sw * 2^-20,   D = sum_i (2 xq_i)(2 wq_i)  (|D| <= 2304),
 * an integer times a power of two. The kernels sum D * Sw * Sx over a row's blocks in 64-bit
 * integers: |D * Sw| < 2^30 and each term stays below 2^47.1, so up to 65536 blocks (K <= 2^20)
 * cannot overflow and the sum is exact, in any order. The per-tensor factors (scale_2 of the
 * weights, 1 / global scale of the activations) are applied once, in float64. A W4A4 GEMM output
 * is therefore the exact value of the NVFP4 dot product, rounded once.
 *
 * The float path (W4A16, W4A8-MXFP8)
 * ----------------------------------
 * Activations that are not NVFP4 stay float32: per row and block, four partial sums over the
 * block's elements k = 4g + i (p_i accumulates g = 0..3 by fused multiply-add, the first one a
 * plain product), then bs = (p0 + p1) + (p2 + p3), then acc = fma(bs, block scale, acc) over the
 * blocks in order. Every ISA variant and the portable C code follow this order, so they agree to
 * the bit.
 */
#ifndef NVFP4MOE_BACKENDS_CPU_H
#define NVFP4MOE_BACKENDS_CPU_H

#include "core/internal.h"

#include <stdatomic.h>

// ---- the thread pool ----
//
// One pool per thread count, shared by every plan of the process that asks for that count (a
// model's layers keep their threads hot between one another and do not multiply them). The
// caller of run() is thread 0; workers 1..n-1 are pinned to the CPUs this process may run on,
// round robin, the caller's CPU left out while there are no more threads than CPUs (a run that
// finds the caller on a worker's CPU moves that worker to the CPU the caller left). Runs from
// several callers are serialized.

typedef struct nvfp4moe_cpu_pool nvfp4moe_cpu_pool;
typedef void (*nvfp4moe_cpu_task)(void *ctx, int tid, int nthreads);

/* The thread count a plan gets when it asks for none: NVFP4MOE_NUM_THREADS when set (a positive
 * integer, else INVALID_ARGUMENT naming the variable), otherwise the CPUs this process may run on. */
nvfp4moe_status nvfp4moe_cpu_default_threads(int *n);
/* A reference to the shared pool of nthreads threads (created on first use). When the system
 * refuses threads, the pool has fewer (nvfp4moe_cpu_pool_size). Release with _put. */
nvfp4moe_status nvfp4moe_cpu_pool_get(int nthreads, nvfp4moe_cpu_pool **out);
void nvfp4moe_cpu_pool_put(nvfp4moe_cpu_pool *p);
int nvfp4moe_cpu_pool_size(const nvfp4moe_cpu_pool *p);
/* Runs fn(ctx, tid, n) on every thread of the pool, the caller as tid 0, and returns when all
 * have returned. */
void nvfp4moe_cpu_pool_run(nvfp4moe_cpu_pool *p, nvfp4moe_cpu_task fn, void *ctx);
/* Inside a task: waits until every thread of the run has reached it. */
void nvfp4moe_cpu_pool_barrier(nvfp4moe_cpu_pool *p);
/* Inside a task: waits (spinning, then yielding, as the barrier) until *v reads at least n
 * (acquire). */
void nvfp4moe_cpu_pool_wait(nvfp4moe_cpu_pool *p, atomic_llong *v, long long n);
/* [*lo, *hi): thread tid's share of n items split in nthreads contiguous parts. */
static inline void nvfp4moe_cpu_split(int64_t n, int tid, int nthreads, int64_t *lo, int64_t *hi) {
    *lo = n * tid / nthreads;
    *hi = n * (tid + 1) / nthreads;
}

// ---- the repacked weight layout ----
//
// A [rows, cols] NVFP4 matrix (rows a multiple of 16) is stored as rows/16 tiles of 16 rows, one
// after the other. A tile is a run of superblocks of 4 blocks (64 columns; the last one padded
// with zero codes and zero scales), each 576 bytes:
//   512 bytes  codes, 128 per block b, as two 64-byte vectors v0, v1. Byte 4r + i of v_h holds
//              row r's element 16b + 8h + i in its low nibble and element 16b + 8h + 4 + i in its
//              high nibble: a vector's low (high) nibbles are 4 consecutive elements of each of
//              the 16 rows, as the 16 32-bit lanes of a dot-product instruction want them.
//    64 bytes  scales, 16 per block (one per row): m | sh << 4 for the E4M3 value m * 2^(sh - 9).
// A negative block scale is stored as its magnitude with the block's codes negated (sign bit
// flipped), which is exact.

enum {
    NVFP4MOE_CPU_TILE_ROWS = 16,
    NVFP4MOE_CPU_SB_COLS = 64,       /* columns of a superblock */
    NVFP4MOE_CPU_SB_BYTES = 576,
    NVFP4MOE_CPU_MAX_NT = 8,         /* rows of activations per kernel call */
};
/* The largest K (columns) the integer kernels take: 2^16 blocks keep the int64 sums exact. Every
 * valid config is within it. */
#define NVFP4MOE_CPU_MAX_K ((int64_t)1 << 20)
_Static_assert(NVFP4MOE_MAX_DIM <= NVFP4MOE_CPU_MAX_K, "the integer kernels' sums must stay exact");

/* Superblocks per tile row for cols columns, and the repacked bytes of one tile. */
static inline int64_t nvfp4moe_cpu_superblocks(int64_t cols) { return NVFP4MOE_CEIL_DIV(cols, NVFP4MOE_CPU_SB_COLS); }
static inline size_t nvfp4moe_cpu_tile_bytes(int64_t cols) {
    return (size_t)nvfp4moe_cpu_superblocks(cols) * NVFP4MOE_CPU_SB_BYTES;
}
// ---- software prefetch ----
//
// A thread's weight reads in a forward are a sequence of contiguous segments (the tiles of the
// chunks it claims, GEMM1's then GEMM2's), known a chunk ahead: a thread claims its next chunk when
// it starts one and appends that chunk's segments to its stream. A stream cursor walks that
// sequence `distance` bytes ahead of the kernels: the kernels advance it by a superblock per
// superblock they read, and it asks for one cache line every `stride` bytes it passes, with the
// hint of the setting. So the prefetches follow the thread's own reads across tiles, chunks,
// experts and the two GEMMs, never touch another thread's chunks, and come at the pace of the
// reads rather than in bursts. A cursor that reaches the end of what is known waits there, still
// counting the bytes read, and catches up when more segments come.

typedef enum nvfp4moe_cpu_pf_hint {
    NVFP4MOE_CPU_PF_OFF = 0,   /* "off": the hardware prefetchers alone */
    NVFP4MOE_CPU_PF_T0,        /* "t0": into every cache level (x86 prefetcht0) */
    NVFP4MOE_CPU_PF_T1,        /* "t1": into L2 and beyond (prefetcht1) */
    NVFP4MOE_CPU_PF_T2,        /* "t2": into the last level (prefetcht2) */
    NVFP4MOE_CPU_PF_NTA,       /* "nta": non-temporal (prefetchnta) */
    NVFP4MOE_CPU_PF_HINT_COUNT
} nvfp4moe_cpu_pf_hint;

/* A prefetch setting: NVFP4MOE_CPU_PREFETCH="off" | "HINT:DISTANCE[:STRIDE]" (bytes, DISTANCE
 * a multiple of 64 up to 1 MiB, STRIDE a multiple of 64 up to DISTANCE, default 64). */
typedef struct nvfp4moe_cpu_prefetch {
    nvfp4moe_cpu_pf_hint hint;
    int64_t distance;
    int64_t stride;
} nvfp4moe_cpu_prefetch;

#define NVFP4MOE_CPU_PF_MAX_DISTANCE ((int64_t)1 << 20)
/* Parses a setting (the form above; INVALID_ARGUMENT naming `what` when it is not one). */
nvfp4moe_status nvfp4moe_cpu_prefetch_parse(const char *text, const char *what, nvfp4moe_cpu_prefetch *out);
/* Writes a setting in the form the parser reads. */
void nvfp4moe_cpu_prefetch_format(const nvfp4moe_cpu_prefetch *p, char *buf, size_t n);
/* The setting plans use: NVFP4MOE_CPU_PREFETCH when set, else the built-in one (t1:9216). */
nvfp4moe_status nvfp4moe_cpu_prefetch_default(nvfp4moe_cpu_prefetch *out);

/* One contiguous run of a thread's weight reads. */
typedef struct nvfp4moe_cpu_seg {
    const uint8_t *p;
    size_t n;
} nvfp4moe_cpu_seg;

typedef struct nvfp4moe_cpu_stream {
    const nvfp4moe_cpu_seg *seg, *end;   /* the current segment, one past the last known (seg == end:
                                            at the end, waiting for more) */
    size_t off;                          /* the next line to ask for: seg->p + off (at the end: that
                                            far into the next segment to come) */
    size_t credit;                       /* bytes advanced not yet covered by a prefetch */
    size_t stride;
    nvfp4moe_cpu_pf_hint hint;
    nvfp4moe_cpu_seg *buf;               /* a growing stream's segments (NULL: a fixed list) */
    int64_t cap;                         /* their room */
} nvfp4moe_cpu_stream;

/* A cursor at the start of segs [0, n) for setting pf; then `distance` bytes of it asked for at
 * once (the warm-up, while the thread does other work). */
void nvfp4moe_cpu_stream_start(nvfp4moe_cpu_stream *s, const nvfp4moe_cpu_seg *segs, int64_t n,
                               const nvfp4moe_cpu_prefetch *pf);
/* A growing cursor for setting pf with room for cap segments in buf, empty: the warm-up's
 * `distance` bytes are asked for as the first segments come. */
void nvfp4moe_cpu_stream_open(nvfp4moe_cpu_stream *s, nvfp4moe_cpu_seg *buf, int64_t cap, const nvfp4moe_cpu_prefetch *pf);
/* Appends segs [0, n) (empty ones skipped) to a growing cursor's sequence, first dropping the
 * segments it has passed; a cursor waiting at the end goes on into them at once. When they do not
 * fit, the cursor stops (prefetching only: the reads do not depend on it). */
void nvfp4moe_cpu_stream_push(nvfp4moe_cpu_stream *s, const nvfp4moe_cpu_seg *segs, int64_t n);

#define NVFP4MOE_CPU_STREAM_LOOP(loc)                                                              \
    while (s->credit >= s->stride) {                                                               \
        s->credit -= s->stride;                                                                    \
        __builtin_prefetch(s->seg->p + s->off, 0, loc);                                            \
        s->off += s->stride;                                                                       \
        while (s->off >= s->seg->n) {   /* into the next segment, carrying what is past the end */ \
            const size_t over = s->off - s->seg->n;                                                \
            s->off = over;                                                                         \
            if (++s->seg == s->end) return;   /* at the end: waits for more */                     \
        }                                                                                          \
    }

/* Moves the cursor `bytes` further (NULL or an "off" cursor: nothing; one at the end of its
 * sequence only counts them). Prefetches never fault. */
#define NVFP4MOE_CPU_PF_SB(loc)                                                                    \
    for (int i_ = 0; i_ < NVFP4MOE_CPU_SB_BYTES; i_ += 64) __builtin_prefetch(p_ + i_, 0, loc)

static inline __attribute__((always_inline)) void nvfp4moe_cpu_stream_advance(nvfp4moe_cpu_stream *s, size_t bytes) {
    if (!s || s->hint == NVFP4MOE_CPU_PF_OFF) return;
    /* The kernels' case: a superblock, every line, inside the segment (segments are whole
     * superblocks, so the cursor stays on superblock boundaries). */
    if (s->seg != s->end && bytes == NVFP4MOE_CPU_SB_BYTES && s->stride == 64 && s->credit == 0 &&
        s->off + bytes < s->seg->n) {
        const uint8_t *p_ = s->seg->p + s->off;
        switch (s->hint) {
        case NVFP4MOE_CPU_PF_T0: NVFP4MOE_CPU_PF_SB(3); break;
        case NVFP4MOE_CPU_PF_T1: NVFP4MOE_CPU_PF_SB(2); break;
        case NVFP4MOE_CPU_PF_T2: NVFP4MOE_CPU_PF_SB(1); break;
        default: NVFP4MOE_CPU_PF_SB(0); break;
        }
        s->off += bytes;
        return;
    }
    s->credit += bytes;
    if (s->seg == s->end) return;
    switch (s->hint) {
    case NVFP4MOE_CPU_PF_T0: NVFP4MOE_CPU_STREAM_LOOP(3) break;
    case NVFP4MOE_CPU_PF_T1: NVFP4MOE_CPU_STREAM_LOOP(2) break;
    case NVFP4MOE_CPU_PF_T2: NVFP4MOE_CPU_STREAM_LOOP(1) break;
    default: NVFP4MOE_CPU_STREAM_LOOP(0) break;
    }
}
/* Repacks tiles [t0, t1) of the matrix q [rows, cols/2], sf [rows, cols/16] (canonical layout)
 * into dst, the whole matrix's repacked buffer. */
void nvfp4moe_cpu_repack(const uint8_t *q, const uint8_t *sf, int64_t cols, int64_t t0, int64_t t1, uint8_t *dst);

/* An E4M3 code's magnitude times 2^9 as an integer (m << sh, below 2^18); the NaN codes give 0
 * (callers test for them). */
static inline int32_t nvfp4moe_cpu_e4m3_int(uint8_t code) {
    int e = (code >> 3) & 0xF, m = code & 0x7;
    if ((code & 0x7F) == 0x7F) return 0;
    return e == 0 ? m : (8 + m) << (e - 1);
}

// ---- activation rows ----

/* One block of 16 activations quantized to NVFP4, as the integer kernels read it. */
typedef struct nvfp4moe_cpu_qblock {
    int8_t  q[16];    /* twice the E2M1 values */
    int32_t corr;     /* -12 * the sum of q: the kernels hold weights as 2w + 12 */
    int32_t pad;
    int64_t sx;       /* the block scale as an E4M3 * 2^9 integer (signed) */
} nvfp4moe_cpu_qblock;

/* One activation row quantized to NVFP4 for the integer kernels: kp/16 blocks for kp = the row's
 * columns rounded up to whole superblocks (the blocks past the row are zeros). */
typedef struct nvfp4moe_cpu_qrow {
    nvfp4moe_cpu_qblock *blk;
    float gs;         /* the global scale it was quantized with */
    atomic_bool nan;  /* a block scale is NaN: every output of the row is NaN (threads quantizing
                         parts of a row set it) */
} nvfp4moe_cpu_qrow;

// ---- kernels ----

typedef enum nvfp4moe_cpu_isa {
    NVFP4MOE_CPU_PORTABLE = 0,   /* "portable": C */
    NVFP4MOE_CPU_AVX2,           /* "avx2": AVX2 + FMA, pmaddubsw / pmaddwd */
    NVFP4MOE_CPU_AVX512,         /* "avx512": AVX-512 F/BW + VNNI, vpdpbusd */
    NVFP4MOE_CPU_ISA_COUNT
} nvfp4moe_cpu_isa;

typedef struct nvfp4moe_cpu_kernels {
    nvfp4moe_cpu_isa isa;
    /* One tile against nt <= NVFP4MOE_CPU_MAX_NT quantized rows (their blocks): out[t][r] = the
     * exact integer sum over the tile's nsb superblocks of D * Sw * Sx (see the top of this file).
     * pf (may be NULL): the thread's prefetch cursor, advanced by a superblock per superblock. */
    void (*gemm_q)(const uint8_t *tile, int64_t nsb, const nvfp4moe_cpu_qblock *const *rows, int nt, int64_t *out,
                   nvfp4moe_cpu_stream *pf);
    /* One tile against nt <= NVFP4MOE_CPU_MAX_NT float rows (padded with zeros to the tile's
     * columns): out[t][r] = sum over blocks of the block sum times the block scale, in the float
     * path's order. */
    void (*gemm_f)(const uint8_t *tile, int64_t nsb, const float *const *rows, int nt, float *out,
                   nvfp4moe_cpu_stream *pf);
    /* Reads n bytes (a multiple of 256, 64-byte aligned) with the widest loads: the benchmark's
     * read bandwidth. Returns a sum of them, so that the reads happen. */
    uint64_t (*read)(const uint8_t *p, size_t n);
    /* Quantizes nb blocks of 16 values x with global scale gs (never negative; 0 and +Inf as the
     * codec's quantizer treats them) exactly as the reference quantizes activations (the codec's
     * VLLM_TRITON quantizer: the same codes and block scales) into blk[0, nb). Returns whether a
     * block's scale is NaN. Blocks are independent: a row may be quantized in parts. scratch
     * holds 9 * nb bytes. */
    bool (*quantize_blocks)(const float *x, int64_t nb, float gs, nvfp4moe_cpu_qblock *blk, uint8_t *scratch);
} nvfp4moe_cpu_kernels;

/* Quantizes a whole row x [cols] with global scale gs into r (blk with room for the row padded to
 * whole superblocks; the padding blocks are zeroed), setting r->gs and r->nan. */
void nvfp4moe_cpu_quantize_row(const nvfp4moe_cpu_kernels *k, const float *x, int64_t cols, float gs,
                               nvfp4moe_cpu_qrow *r, uint8_t *scratch);

const char *nvfp4moe_cpu_isa_name(nvfp4moe_cpu_isa isa);
/* Whether this CPU (and its OS) runs isa. */
bool nvfp4moe_cpu_isa_supported(nvfp4moe_cpu_isa isa);
/* The kernels plans use: NVFP4MOE_CPU_ISA ("portable", "avx2", "avx512") when set, which must name
 * one this CPU runs (else INVALID_ARGUMENT naming the variable), otherwise the best one it runs. */
nvfp4moe_status nvfp4moe_cpu_kernels_select(const nvfp4moe_cpu_kernels **out);
/* The kernels of one ISA (tests and the benchmark); NULL when the CPU does not run it. */
const nvfp4moe_cpu_kernels *nvfp4moe_cpu_kernels_of(nvfp4moe_cpu_isa isa);

// ---- CPU_FAST's settings and timings, for the benchmark ----

/* What one forward's last pass did when, per thread (CLOCK_MONOTONIC nanoseconds): */
enum {
    NVFP4MOE_CPU_AT_START = 0,   /* the thread's task began */
    NVFP4MOE_CPU_AT_INPUTS,      /* its share of the routing and of the inputs done */
    NVFP4MOE_CPU_AT_GEMM1_GO,    /* the barrier after the inputs passed */
    NVFP4MOE_CPU_AT_GEMM1,       /* its grouping of the pairs, GEMM1 tiles and their activations done */
    NVFP4MOE_CPU_AT_ROWS,        /* W4A4 per-token, W4A8: after a barrier, its rows of GEMM2's input
                                    quantized (else = GEMM1) */
    NVFP4MOE_CPU_AT_GEMM2_GO,    /* the barrier before GEMM2 passed */
    NVFP4MOE_CPU_AT_GEMM2,       /* its GEMM2 chunks done */
    NVFP4MOE_CPU_AT_END,         /* the chunks of its share run (by whichever threads), their output
                                    columns summed */
    NVFP4MOE_CPU_AT_COUNT
};
typedef struct nvfp4moe_cpu_prof_thread {
    int64_t t[8];        /* NVFP4MOE_CPU_AT_* */
    int64_t chunks[2];   /* the GEMM1 and GEMM2 chunks the thread ran */
    int64_t stolen[2];   /* of them, those of another thread's share */
    int64_t bytes[2];    /* the weight bytes of its chunks; of the stolen ones: */
    int64_t stolen_bytes[2];
} nvfp4moe_cpu_prof_thread;   /* two cache lines a thread */
typedef struct nvfp4moe_cpu_profile {
    int64_t entry;    /* the forward began */
    int64_t run;      /* its last pass's pool run began (routing and grouping done) */
    int64_t joined;   /* that run returned */
    int64_t exit;     /* the forward returned */
    int64_t passes;
    int nthreads;
    nvfp4moe_cpu_prof_thread *thread;   /* [nthreads] */
} nvfp4moe_cpu_profile;

/* The prefetch setting of a CPU_FAST plan, and a new one for its next forwards (the results do not
 * depend on it). INVALID_ARGUMENT when plan is not a CPU_FAST plan. */
nvfp4moe_status nvfp4moe_cpu_fast_prefetch(nvfp4moe_plan *plan, const nvfp4moe_cpu_prefetch *set, nvfp4moe_cpu_prefetch *get);
/* The chunks a CPU_FAST plan cuts each thread's share of a GEMM phase into, about (its
 * NVFP4MOE_CPU_CHUNKS or the built-in 16; the results do not depend on it); 0 when plan is not a
 * CPU_FAST plan. */
int64_t nvfp4moe_cpu_fast_chunks(nvfp4moe_plan *plan);
/* Steering a CPU_FAST plan's work claiming, for the tests (the results must not depend on it):
 * the threads of `idle` (bit t: thread t) claim no GEMM chunk, so the others run all of them; those
 * of `slow` wait `slow_ns` before each chunk they run, so the others take over part of their
 * shares. Threads from 64 on are never steered. */
typedef struct nvfp4moe_cpu_steer {
    uint64_t idle, slow;
    int64_t slow_ns;
} nvfp4moe_cpu_steer;
/* Sets a CPU_FAST plan's steering for its next forwards ({0}: none). INVALID_ARGUMENT when plan is
 * not a CPU_FAST plan or `idle` holds every thread of its pool. */
nvfp4moe_status nvfp4moe_cpu_fast_steer(nvfp4moe_plan *plan, const nvfp4moe_cpu_steer *set);
/* Starts (on) or stops recording a CPU_FAST plan's forwards' timings; returns the record each
 * forward then rewrites (NULL when off, out of memory or not a CPU_FAST plan). */
const nvfp4moe_cpu_profile *nvfp4moe_cpu_fast_profile(nvfp4moe_plan *plan, bool on);

#endif // NVFP4MOE_BACKENDS_CPU_H
