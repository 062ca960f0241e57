/*
 * hopper_gemm.cu - the Hopper-native W4A16 fused MoE GEMM: NVFP4 weights (E2M1 codes,
 * one E4M3 scale per 16 K elements, one fp32 scale_2 per expert) times bf16/fp16 activations
 * gathered through the moe-align grouping, on sm_90a tensor cores with wgmma and fp32
 * accumulation. Interface: kernels/hopper_gemm.h (same shape as kernels/moe_gemm.h).
 *
 * STATUS (2026-12-07, H100): correct (tests/gpu_hopper_gemm, gpu_test through the HOPPER_WGMMA
 * backend, compute-sanitizer memcheck and racecheck), not at the issue's targets: the whole layer
 * 1.33 / 1.36x triton_kernels on DeepSeek-V3 and 1.34 / 1.50x on Qwen3-30B-A3B at M = 1024 / 4096
 * in the same call (bench/results/2026-12-07-h100-lean-epilogue.md). The epilogue of an item not
 * split along K now stores from each row's output offset, computed by the producer (the lean
 * epilogue, NVFP4MOE_HOPPER_LEAN_EPI): Qwen3-30B-A3B's GEMM2 at M = 4096 executes 14 % fewer
 * instructions (about 16 per 4-byte store instead of 28), the GEMMs alone ran 1.7-6.9 % faster at
 * M = 4096. Tried and not kept: a staged epilogue (stores by bulk copies from shared memory),
 * stores in batches (2026-12-06-h100-epilogue.md, 2026-12-07-h100-combine-kernel.md), the second
 * consumer warpgroup started 2 or 5 µs late so the two epilogues fall apart (within the noise,
 * 2026-12-07-h100-lean-epilogue.md). Also not kept (2026-12-07-h100-tails.md): the k-group split
 * at block_m 64 and 128 (24-64 % slower), and two forms that ptxas compiles only with every wgmma
 * serialized: a second 64-row half lagging one k tile so each half's epilogue overlaps the other's
 * wgmmas (the whole epilogue is 3-9 % of the GEMMs), and an expert's tail of at most 32 pairs
 * merged into the block before it as a 160-column item (more than 128 accumulators per thread).
 * What bounds the GEMM at M = 4096 now: the tail blocks, which decode an expert's weights again
 * for a few pairs (a probe that skips tails of at most 32 pairs ran DeepSeek-V3's GEMMs 24 %
 * faster for 3 % of the pairs, gpt-oss-120b's 18 %), and a register budget that holds no wider
 * token tile. Also not kept (2026-12-07-h100-block-m-256.md): block_m 256 with one weight tile
 * per item and up to 256 token columns in one 64-row set per warpgroup, which removes the tails
 * (correct, ptxas clean) but ran the GEMMs 5-24 % slower at M = 4096, 9-11 % per MMA on full
 * blocks. Its stages carry 1.46x the bytes per MMA, but half the activation bytes buy this kernel
 * only 2-5 %, and ncu shows the form waiting more, not saturating L2. This kernel keeps the tensor
 * pipe 84-85 % busy on Mixtral-8x7B's full blocks. The 32-column tail items are bound by the
 * decode's instruction issue (ncu, DeepSeek-V3 GEMM1 at M = 4096: 319 instructions per warp and
 * k tile, a tile 0.6 of a full one); not faster there (2026-12-07-h100-narrow-items.md): 8-step
 * wgmma groups on narrow items, an L2 prefetch of their weight chunks ahead of the bulk copies.
 * Nor (2026-12-07-h100-shared-addresses.md): the stage and barrier addresses held per item instead
 * of rebuilt from SR_CgaCtaId at every k tile's head (-1.4 to +2.1 %; the head's stalls are the
 * loop's back edge and the stage wait), the proxy fence in the producer (PFENCE = 1: 1-7 % slower),
 * nor that k-tile loop unrolled twice (within the rounds' spread of up to 8 %, 11 % more code;
 * 2026-12-07-h100-narrow-ctas.md, which also gives block_m 32 its two CTAs per SM), nor the last
 * wave's units in pieces along K where nothing else splits (Qwen3-30B-A3B's layer 11-13 % slower
 * at M = 64-128: a piece of 4 k tiles pays a whole item's overhead and the split's;
 * 2026-12-07-h100-last-wave.md). In the decode range (Qwen3-30B-A3B, block_m 32, M = 256) the
 * consumers wait a quarter of their k loop for a stage's bytes while the producer waits for a
 * free stage: the ring's bytes in flight, not the decode, bound the stream there.
 * History: v1 -> v2
 * (bench/results/2026-12-02-h200-hopper-gemm-v2.md), two weight tiles per item
 * (2026-12-06-h100-row-tiles.md), fitted token widths (2026-12-06-h100-token-widths.md), claimed
 * items (2026-12-06-h100-item-claims.md), the block_m rule (2026-12-06-h100-block-m.md; block_m 128
 * from 1.1 x 64 pairs per expert: 2026-12-06-h100-one-launch.md, Kimi-K2 M = 4096 -14.5 %).
 *
 * Design
 * ------
 * Swapped product. For one block of BM sorted rows (tokens) of expert e and a tile of 128 weight
 * rows (output columns n), the CTA computes D[n, m] = W_e[n, :] . A[m, :]^T: the weights are
 * wgmma's M side (64 rows per consumer warpgroup, two warpgroups across the 128 rows) and come from
 * REGISTERS after decoding; the tokens are wgmma's N side (N = BM = 8..128) and come from shared
 * memory. Small M then costs a narrow wgmma (m64n8k16 at decode) instead of a 64-row MMA tile
 * filled with padding, and the weights are never written back to shared memory.
 *
 * Weight layout and decode: kernels/hopper_layout.cuh (shared with the decode kernel). Per k16
 * step and lane (4 A registers, 8 weights): 8 integer operations (bf16; 9 for fp16) that move the
 * codes' bits, placed for them by the repack (kernels/hopper_bits.h), one PRMT + one LEA expanding
 * the two rows' scales into one register [row g | row g+8], and 4 HMUL2 that pick their half with
 * an operand selector: 14 instructions. A chunk's codes are [warpgroup 2][warp 4][q 2][lane 32][16 B]
 * here (16-row group gw = 4*warpgroup + warp), one LDS.128 per lane per 4 k16 steps, 512
 * contiguous bytes per warp: no conflicts; its scales [warpgroup 2][warp 4][g 8][s 8][h 2]: the 4
 * lanes of a g read the same 16 bytes (broadcast), one conflict-free LDS.128 per lane per k tile.
 *
 * Activations. Gathered rows (A row = pair / a_row_div; sentinel rows zero-filled) of one k tile
 * (128 values = 256 B) land in shared memory as two K-major 128-byte-swizzle atoms:
 * [k half 2][BM rows][128 B], 16-byte chunk c of row r stored at chunk c ^ (r & 7), 8-row groups
 * 1024 B apart. The wgmma B descriptor: start address >> 4 in bits 0..13 (k16 step s adds
 * (s/4) * BM*128 + (s%4)*32 bytes, the usual in-atom advance: the hardware applies the XOR to the
 * generated addresses), leading byte offset 16 B (unused by swizzled K-major), stride byte offset
 * 1024 B (8-row group pitch) in bits 32..45, layout type 1 (128B swizzle) in bits 62..63, base
 * offset 0 (every atom is 1024-byte aligned).
 *
 * Pipeline. One CTA per SM (two at block_m 32, CtasPerSm: half the stages, producer at 32 and
 * consumers at 104 registers): warpgroup 0 is the producer (setmaxnreg.dec to 40), 2*KS consumer
 * warpgroups follow. KS = 1 (block_m > NVFP4MOE_HOPPER_KS2_MAX_BM): 384 threads, 2 consumer
 * warpgroups (setmaxnreg.inc to 232), each 64 weight rows x all 8 k16 steps of a k tile. KS = 2
 * (small block_m): 640 threads, 4 consumer warpgroups (104 registers each): warpgroups wg and
 * wg + 2 share rows 64*wg.. and split each k tile's steps 0..3 / 4..7 (k group kg), each with its
 * own accumulators; once per work item k group 1 hands its sums to k group 0 through shared
 * memory (named barrier 4 + wg, 256 threads), which runs the epilogue. KS = 2 doubles the
 * consumer warps per scheduler (4 instead of 2) so the FP4 decode's latency is hidden. A ring of
 * STAGES shared-memory stages (16 at BM=8 down to 4 at BM=128 with two weight tiles, ~210 KB
 * with the k-group reduction buffer), each [activations
 * BM*256 B | weights 9216 B], with a "full" and an "empty" mbarrier per stage.
 *   producer: wait empty (parity trick: the first pass over the ring does not block), thread 0
 *     posts expect_tx(9216) and issues ONE cp.async.bulk of the weight chunk completing on the full
 *     barrier (async proxy, complete_tx); all 128 threads issue 16-byte cp.async.cg (zero-fill
 *     for sentinel rows and the K tail) for the gathered activations into the swizzled slots and
 *     then arrive on the full barrier (count 128 + 1): with NVFP4MOE_HOPPER_PFENCE = 0 through
 *     cp.async.mbarrier.arrive.noinc, and each consumer thread runs fence.proxy.async after its
 *     full-barrier wait (cp.async writes are generic-proxy, wgmma reads through the async proxy);
 *     with PFENCE = 1 the producer thread instead waits for its copies of the previous stage
 *     (cp.async.wait_group 1, or wait_all before it would block on an empty slot), fences the
 *     proxies itself and then arrives (release), so no consumer fences per tile.
 *   consumer warpgroup (STEPS = 8 / KS k16 steps per tile, in two halves): wait full; LDS its
 *     codes and scales; decode the first half into register set A0, wgmma.fence, STEPS/2 x wgmma
 *     m64nBMk16 (A0 from registers, B descriptor), commit; wait_group 1 (now the previous tile's
 *     second group is done, so its stage is released: every consumer thread arrives on
 *     the empty barrier, count 256 * KS); decode the second half into A1, wgmmas, commit; before
 *     the next tile's A0 decode, wait_group 1 retires the A0 group of this tile. So the decode
 *     of one half overlaps the tensor-core work of the other and A registers are never
 *     rewritten while a wgmma may still read them. Descriptors are the low 32-bit word only
 *     (one add per k16 step), the high word is a constant.
 * Two weight tiles per item (RT = 2, block_m 32, 64 and 128 by default; kernels/hopper_gemm.h
 * row_tiles): a stage holds the activations and the chunks of n tiles nt and nt + 1 (two bulk
 * copies, one expect_tx), consumer warpgroup wg takes all 128 rows of tile nt + wg as two 64-row
 * halves with one accumulator set each, so every stage of gathered token rows feeds 256 weight
 * rows: half the activation traffic (L2 reads, shared-memory fills) per MMA. A tile is then four
 * wgmma groups (half 0 steps 0-3, half 1 steps 0-3, half 0 steps 4-7, half 1 steps 4-7) over the
 * same two A sets, each group loading only its own codes and scales (one LDS.128, one LDS.64). An
 * odd tile count leaves the last item one chunk: its second warpgroup only waits for and releases
 * each stage. At block_m 128 the 128 tokens are then one m64n128k16 tile (two m64n64 tiles per
 * step with two accumulator sets spill and ran 4-22 % slower than one weight tile; one m64n128
 * tile ran 6-16 % faster). H100, GEMM1 + GEMM2: 7-9 % faster at M = 1024 (block_m 64) and 6-16 %
 * at M = 4096 (block_m 128) than one weight tile (bench/results/2026-12-06-h100-row-tiles.md).
 * Token tile width per item (Kernel::NW): the narrowest of 64/32/16 (block_m 64) or 128/32
 * (block_m 128) token columns that holds the block's pairs, so an expert's last, mostly empty
 * block costs a narrow wgmma instead of a full one. H100, the GEMMs alone against one width:
 * DeepSeek-V3 -9 to -11 %, Qwen3-235B-A22B -3 to -5 %, Mixtral-8x7B -2 to -6 %, Qwen3-30B-A3B
 * +1 % at M = 4096 (bench/results/2026-12-06-h100-token-widths.md). The epilogue's per-item
 * values (expert scales, row scales, bias) wait in the item's queue slot during the k loop
 * (ItemSlot, loaded by the producer): in registers they made ptxas spill at block_m 128. The
 * KS = 2 kernels (block_m 8 and 16) load them into registers.
 * GEMM1 with SiLU-and-mul fused (GU, two tiles per item where args->act_out asks for it and the
 * gate/up halves are stacked): the item's chunks are gate tile nt and up tile nt + n_tiles/2, and
 * warpgroup wg takes rows 64*wg .. of both, so each thread holds a gate value and its up value
 * for the same token and the epilogue writes silu(gate) * up [P, N/2] instead of C, rounding both
 * to the 16-bit type first exactly as the activation kernel would read them back.
 * Scheduler. Persistent: every CTA reads num_blocks on the device; work items are (block, n tile
 * group, k split). At block_m 32, 64 and 128 the producer warpgroup's thread 0 claims items from a
 * counter in the workspace (atomicAdd, one item ahead so the round trip overlaps the copies), and
 * hands each to the consumers with its coordinates, its block's pair ids and row scales, its
 * expert's scales and its rows' bias through a 4-slot queue in shared memory (ItemQueue, its own
 * full/empty mbarriers; a slot is held until the item's epilogue is done), so an item starts
 * with no memory latency on the consumers' side: a CTA that drew narrow or short items takes more,
 * so the kernel ends with its average CTA, not its slowest (H100, GEMMs alone: 3-11 % faster
 * than round robin at M = 1024 and 4096, bench/results/2026-12-06-h100-item-claims.md). Without
 * a workspace, and always at block_m 8 and 16, both sides walk item = blockIdx.x + i * gridDim.x.
 * Both sides see the same item sequence, so the stage counter (stage, phase) stays in lock step
 * across items. The
 * K split count is chosen on the device from the real unit count (blocks x n tiles) and the grid
 * (choose_splits: waves times per-item cost, <= 16 splits of >= 4 k tiles), so decode at
 * M = 1 (8 blocks) still spreads over all SMs; from 4 waves of units on (known on the host from
 * ceil(P / block_m) blocks at least) K is never split. Split
 * partial sums go to an fp32 workspace [P, N] with red.add; per (block, n tile, warpgroup) a
 * counter elects the last arriving split, which applies the epilogue. The launcher clears the
 * item counter and the split-K area with one cudaMemsetAsync (graph-capturable). GEMM2 may instead
 * be launched with PDL right behind GEMM1 (args->pdl; NVFP4MOE_HOPPER_GEMM_PDL in the backend):
 * GEMM1 zeroes its counter, and its CTAs take the multiprocessors GEMM1's last CTAs leave, each
 * issuing its first item (item blockIdx.x) and that item's first stages of weight chunks before it
 * waits for GEMM1 (Kernel::produce); it claims further items only after the wait.
 * Epilogue: acc * 128 * scale_2[e] (+ bias[e, n]) (* row_scale[p]) stored as bf16/fp16 at
 * C[p, n], two adjacent columns per 4-byte store; rows past N (padding) and sentinel pairs are
 * skipped. The ids it needs are in registers, the expert scales, row scales and bias loaded
 * before the item's k loop (KS = 1: by the producer, into the queue slot; KS = 2: by the
 * consumers, into registers). KS = 1, an item not split along K: the producer also puts each
 * row's output offset (p * ld, or -1 for a sentinel) in the slot beside its row scale, so a
 * consumer thread's store is one 16-byte shared load per token column, the value, a packed
 * exchange with its partner lane and a predicated store (lean_epilogue).
 *
 * sm_80 builds (the Makefile's second gencode pass) compile the kernel to a trap; the launcher
 * refuses any device that is not compute capability 9.0 and any binary without sm_90a code.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "activation.cuh"
#include "hopper_decode.h"  // NVFP4MOE_DECODE_MAX_PAIRS_PER_EXPERT
#include "hopper_gemm.h"
#include "hopper_layout.cuh"
#include "pdl.cuh"

// The device code uses sm_90a-only instructions (wgmma, setmaxnreg): compiled only where the
// architecture-specific feature set is available.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NVFP4MOE_HOPPER_DEVICE 1
#else
#define NVFP4MOE_HOPPER_DEVICE 0
#endif

namespace {

using namespace nvfp4moe_hopper;

constexpr int kMaxSplits = 16;
constexpr int kMinTilesPerSplit = 4;
// Dynamic shared memory for the stages (and the k-group reduction buffer); a smaller budget
// builds a kernel with fewer stages (for A/B runs: the cost of a shallower ring)
#ifndef NVFP4MOE_HOPPER_SMEM_BUDGET
#define NVFP4MOE_HOPPER_SMEM_BUDGET (220 * 1024)
#endif
constexpr int kSmemBudget = NVFP4MOE_HOPPER_SMEM_BUDGET;
constexpr size_t kMaxSplitWsBytes = size_t(64) << 20;
// 0 builds a kernel that deals items round robin even with a workspace (for A/B runs)
#ifndef NVFP4MOE_HOPPER_DYNAMIC
#define NVFP4MOE_HOPPER_DYNAMIC 1
#endif
constexpr size_t kSchedBytes = 16;  // the workspace's item counter (Params::sched), 16-byte aligned

// Consumer k groups per block_m: KS = 2 splits every k tile's 8 k16 steps between two pairs of
// consumer warpgroups (4 consumer warpgroups, 16 consumer warps: 4 per scheduler instead of 2, to
// hide the decode's latency), each pair with its own accumulators, summed through shared memory
// once per work item. KS = 1: the original 2 consumer warpgroups, each over all 8 steps. Block_m
// 8 and 16 run KS = 2, block_m 32 KS = 1 on two CTAs per SM (CtasPerSm; 32 for A/B runs of its
// KS = 2 form).
#ifndef NVFP4MOE_HOPPER_KS2_MAX_BM
#define NVFP4MOE_HOPPER_KS2_MAX_BM 16
#endif
// 1: the epilogue's stores predicated in place of a branch around each (for A/B runs)
#ifndef NVFP4MOE_HOPPER_PRED_ST
#define NVFP4MOE_HOPPER_PRED_ST 1
#endif
// 1: the epilogue of an item that is not split along K stores from each row's output offset,
// computed once by the producer (ItemSlot::ro), walks the tokens once for both 64-row halves and
// exchanges packed 16-bit pairs with the partner lane: the same bits in about 16 instructions per
// store instead of 28 (H100, Qwen3-30B-A3B GEMM2 at M = 4096: 14 % fewer instructions; the GEMMs
// alone 1.7-6.9 % faster at M = 4096, bench/results/2026-12-07-h100-lean-epilogue.md). 0 builds the
// plain epilogue for every item (for A/B runs).
#ifndef NVFP4MOE_HOPPER_LEAN_EPI
#define NVFP4MOE_HOPPER_LEAN_EPI 1
#endif
// Where the cp.async -> wgmma proxy fence sits: 1 = in the producer, after its copies of a stage
// have landed and before it arrives on the stage's full barrier; 0 = in every consumer thread
// after the full barrier, once per tile.
// The producer's L2 prefetch (KS = 1, thread 0) of weight chunks this many k tiles ahead of
// their bulk copies, and of an item's first ones past its first at the item's head; 0: none (the
// default, for A/B runs). In the decode range (Qwen3-30B-A3B at block_m 32, M = 256) the
// consumers wait a quarter of their k loop for a stage's bytes while the producer waits for a
// free stage (bench/results/2026-12-07-h100-last-wave.md): L2 holds bytes in flight that the
// shared-memory ring cannot.
#ifndef NVFP4MOE_HOPPER_WPF
#define NVFP4MOE_HOPPER_WPF 0
#endif
#ifndef NVFP4MOE_HOPPER_PFENCE
#define NVFP4MOE_HOPPER_PFENCE 0
#endif
template <int BM>
struct KSplit {
    static constexpr int value = BM <= NVFP4MOE_HOPPER_KS2_MAX_BM ? 2 : 1;
};
// CTAs per SM of the block_m 32 kernel where it runs KS = 1 (NVFP4MOE_HOPPER_KS2_MAX_BM < 32): 2
// halves its stages (4 of 26 KB, two weight tiles each) and its registers (producer 32, consumers
// 104) so that two CTAs share an SM, each with the item hand-over, two weight tiles per stage and
// the fused SiLU; 1: one CTA per SM (for A/B runs). H100, the whole layer with block_m 32 on two
// CTAs against block_m 64 on one: Qwen3-30B-A3B -4.5 / -4.4 / -12.0 % at M = 64 / 128 / 256 (4,
// 8, 16 pairs per expert), Qwen3-235B-A22B -1.1 / -2.1 / -2.0 %; the GEMMs alone on one CTA per SM
// gained less (Qwen3-30B-A3B M = 256 -6.2 % against -8.4 % on two). Where items are long (K 2048
// and up for GEMM2: DeepSeek-V3, Kimi-K2, gpt-oss-120b) -0.2 to +0.9 %, so the rule
// (nvfp4moe_hopper_block_m) takes it for short items only (bench/results/2026-12-07-h100-narrow-ctas.md).
#ifndef NVFP4MOE_HOPPER_MINB32
#define NVFP4MOE_HOPPER_MINB32 2
#endif
template <int BM>
struct CtasPerSm {
    static constexpr int value = BM == 32 && KSplit<BM>::value == 1 ? NVFP4MOE_HOPPER_MINB32 : 1;
    static_assert(value == 1 || value == 2, "one or two CTAs per SM");
};

// Token tile widths (see Kernel::NW): a KS = 1 block runs each item on the narrowest of the
// widths BM >> (SH * j), j < NW, that holds the block's pairs, or (token_subtiles 1) always on
// BM; KS = 2 blocks (block_m 8, 16) and block_m 32 are one width. NW and SH per block_m:
// block_m 64 64/32/16, block_m 128 128/32 (H100: 128/64/32 made ptxas serialize the wgmmas of the
// two-tile kernel and ran 4-18 % slower; 128/64 spilled in its k loop).
#ifndef NVFP4MOE_HOPPER_NW64
#define NVFP4MOE_HOPPER_NW64 3
#endif
#ifndef NVFP4MOE_HOPPER_SH64
#define NVFP4MOE_HOPPER_SH64 1
#endif
#ifndef NVFP4MOE_HOPPER_NW128
#define NVFP4MOE_HOPPER_NW128 2
#endif
#ifndef NVFP4MOE_HOPPER_SH128
#define NVFP4MOE_HOPPER_SH128 2
#endif
template <int BM>
struct TokenWidths {
    static constexpr int value = KSplit<BM>::value != 1 ? 1
                                 : BM == 64             ? NVFP4MOE_HOPPER_NW64
                                 : BM == 128            ? NVFP4MOE_HOPPER_NW128
                                                        : 1;
    static constexpr int shift = BM == 64 ? NVFP4MOE_HOPPER_SH64 : BM == 128 ? NVFP4MOE_HOPPER_SH128 : 1;
    static_assert(shift >= 1 && value >= 1, "widths");
};

template <int BM, int RT = 1>
struct Cfg {
    static constexpr int KS = KSplit<BM>::value;
    static constexpr int MINB = CtasPerSm<BM>::value;   // CTAs per SM
    static constexpr int THREADS = 128 * (1 + 2 * KS);  // producer warpgroup + 2*KS consumers
    static constexpr int ACT = BM * kTK * 2;            // activation bytes per stage
    static constexpr int STAGE = ACT + RT * kWChunk;    // activations + RT weight chunks
    static constexpr int NACC = BM / 2;                 // fp32 accumulators per thread
    static constexpr int RED = KS == 2 ? 2 * NACC * 128 * 4 : 0;  // k-group reduction buffer
    static constexpr int BUDGET = MINB == 2 ? 104 * 1024 : kSmemBudget;  // two CTAs: 228 KB per SM
    static constexpr int S0 = (BUDGET - RED) / STAGE;
    static constexpr int STAGES = S0 > 16 ? 16 : S0;
    static constexpr int SMEM = STAGES * STAGE + RED + 1024;  // + slack to align the base to 1024
    static constexpr int CPT = BM * (kTK / 8) / 128;    // 16-byte activation chunks per producer thread
    static_assert(BM % 8 == 0 && BM >= 8 && BM <= 128, "wgmma N = BM");
    static_assert(NACC * 2 == BM && CPT * 128 == BM * (kTK / 8), "whole chunks per thread");
    static_assert(STAGE % 1024 == 0, "swizzle atoms need 1024-byte alignment");
    static_assert(STAGES >= 3, "pipeline depth");
    static_assert(SMEM <= 227 * 1024, "shared memory per CTA on sm_90");
    static_assert(RT == 1 || (RT == 2 && KS == 1), "two weight tiles per CTA at KS = 1 only");
};

struct Params {
    const uint16_t *a;
    const uint8_t *b;
    const float *scale_2;
    const float *bias;
    const float *row_scale;
    uint16_t *c;
    const int32_t *sorted_ids;
    const int32_t *block_expert;
    const int32_t *num_blocks;
    int32_t *sched;        // the next unclaimed work item, zeroed by the launcher (a PDL launch: by
                           // the GEMM ahead, args->next_workspace, or by the grouping ahead,
                           // args->pdl_head), or NULL
    float *ws;             // split-K partial sums [P, N], zeroed by the launcher, or NULL
    int32_t *counters;     // split-K arrivals per (block, n tile, warpgroup), zeroed, or NULL
    int a_row_div;
    int P, N, K;
    int n_tiles, k_tiles;
    int n_groups;          // work units per block along N: ceil(n_tiles / RT)
    int max_splits;        // 1 when there is no workspace
    int halves;            // scale_2: 0 [E]; 1 [E, 2] stacked gate/up halves; 2 [E, 2] interleaved
    uint16_t *act;         // GU: the activation's output [P, N/2] in place of C
    nvfp4moe_gpu_act_params ap;
    int32_t *next_sched;   // the item counter of the GEMM launched next with PDL, zeroed here, or NULL
    int pdl;               // launched with PDL after the GEMM that zeroed sched (Kernel::produce)
    int pdl_head;          // launched with PDL after the grouping (which zeroed sched): waits first
};

#ifndef NVFP4MOE_HOPPER_PRODUCER_REGS
#define NVFP4MOE_HOPPER_PRODUCER_REGS 40
#endif
constexpr int kProducerRegs = NVFP4MOE_HOPPER_PRODUCER_REGS;
// setmaxnreg only moves registers inside the CTA's launch allocation: the producer's .dec
// releases what the consumers' .inc takes, and an .inc that asks for more than was released
// blocks forever. KS = 1: launch 384 x 168, 128*40 + 256*232 = 384*168 (the producer at 56 and
// the consumers at 224 spilled in the block_m 128 two-tile kernels: H100, 4-14 % slower). KS = 2:
// launch 640 x 96 (the __launch_bounds__(640, 1) cap), 128*40 + 512*104 <= 640*96 = 61440
// (112 per consumer, the first version, needed 64512 and hung in setmaxnreg.inc).
// Two CTAs per SM (CtasPerSm): launch 384 x 80 (65536 / 768, in steps of 8), the producer at
// NVFP4MOE_HOPPER_PRODUCER_REGS2, the consumers at what that leaves: 32 -> 104.
#ifndef NVFP4MOE_HOPPER_PRODUCER_REGS2
#define NVFP4MOE_HOPPER_PRODUCER_REGS2 32
#endif
template <int MINB>
struct ProducerRegs {
    static constexpr int value = MINB == 2 ? NVFP4MOE_HOPPER_PRODUCER_REGS2 : kProducerRegs;
};
template <int KS, int MINB = 1>
struct ConsumerRegs {
    static constexpr int value = KS == 2     ? 104
                                 : MINB == 2 ? (384 * 80 - 128 * ProducerRegs<2>::value) / 256 / 8 * 8
                                             : (384 * 168 - 128 * kProducerRegs) / 256 / 8 * 8;
};
static_assert(128 * ProducerRegs<2>::value + 256 * ConsumerRegs<1, 2>::value <= 384 * 80,
              "two-CTA register budget");
static_assert(128 * kProducerRegs + 256 * ConsumerRegs<1>::value <= 384 * 168, "KS = 1 register budget");
static_assert(128 * kProducerRegs + 512 * 104 <= 640 * 96, "KS = 2 register budget");

// The K split count, the same in every thread of the grid: the s with the shortest estimated
// time, waves(s) x (k tiles per split + kItemTiles + (s > 1 ? kSplitTiles : 0)), ties to the
// smaller s. An item's fixed cost (drain, epilogue) and a split's (fp32 red.add of its partial
// sums, the election, the re-read) are counted in k tiles: the first rule, the best-filled last
// wave alone, split K = 2048 GEMMs at 10 waves for a 5 % fuller last wave and ran them 2.2x
// slower (H200, Qwen3-30B-A3B GEMM1 at M = 1024: 525 against 235 us).
constexpr int kItemTiles = 2;
constexpr int kSplitTiles = 4;
__host__ __device__ __forceinline__ int choose_splits(int units, int grid, int k_tiles, int max_splits) {
    int best = 1;
    long long best_cost = -1;
    for (int s = 1; s <= max_splits; s++) {
        if (s > 1 && k_tiles / s < kMinTilesPerSplit) break;
        const long long items = (long long)units * s;
        const long long waves = (items + grid - 1) / grid;
        const long long cost =
            waves * ((k_tiles + s - 1) / s + kItemTiles + (s > 1 ? kSplitTiles : 0));
        if (best_cost < 0 || cost < best_cost) {
            best_cost = cost;
            best = s;
        }
    }
    return best;
}

#if NVFP4MOE_HOPPER_DEVICE

// ---- wgmma wrappers (generated) -----------------------------------------------------------
#include "hopper_wgmma.cuh"

// ---- PTX helpers ----------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
// Blocks until the phase with the given parity has completed (acquire, CTA scope).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
#if NVFP4MOE_HOPPER_PFENCE
// Non-blocking: has the phase with the given parity completed?
__device__ __forceinline__ bool mbar_test(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}
#endif
// One bulk copy global -> shared through the copy engine, completing bytes on the mbarrier.
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes,
                                         uint32_t bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
            "r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}
#if NVFP4MOE_HOPPER_WPF > 0
// A fire-and-forget bulk prefetch of [p, p + bytes) into L2 (bytes a multiple of 16).
__device__ __forceinline__ void prefetch_l2(const void *p, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}
// k tile kt's weight chunk at src and, when `two`, the item's second chunk w2off further on.
__device__ __forceinline__ void prefetch_chunks(const uint8_t *src, size_t w2off, int kt, bool two) {
    const uint8_t *c = src + (size_t)kt * kWChunk;
    prefetch_l2(c, kWChunk);
    if (two) prefetch_l2(c + w2off, kWChunk);
}
#endif
// 16-byte async copy; src_bytes = 0 zero-fills the destination without reading src.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
#if !NVFP4MOE_HOPPER_PFENCE
// The mbarrier receives one arrival when all of this thread's earlier cp.async have landed
// (.noinc: the arrival is counted in the barrier's init count, not added to it).
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
#endif
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
// Barrier among the 128 threads of one consumer warpgroup (ids 1 .. 4, one per (warpgroup,
// 64-row half); 0 is __syncthreads).
__device__ __forceinline__ void wg_barrier(int id) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}
// Barrier among the producer warpgroup's 128 threads (id 8).
__device__ __forceinline__ void producer_barrier() { asm volatile("bar.sync 8, 128;\n" ::: "memory"); }
// Pins the accumulators in place: no read or write of them may move across this point (used
// after zeroing and after the final wgmma.wait_group, where only asm ordering protects them).
template <int N>
__device__ __forceinline__ void fence_operands(float (&acc)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(acc[i])::"memory");
}
__device__ __forceinline__ void red_add_f32(float *p, float v) {
    asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(p), "f"(v) : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr));
    return v;
}

[[maybe_unused]] __device__ __forceinline__ uint2 lds64(uint32_t addr) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
    return v;
}
// Barrier among the 256 threads of the two k groups of consumer row half wg (ids 4, 5).
__device__ __forceinline__ void pair_barrier(int wg) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(4 + wg) : "memory");
}

// x rounded to the 16-bit activation type and back (what a store and a reload would give).
template <bool BF16>
__device__ __forceinline__ float round16(float x) {
    if constexpr (BF16) return __bfloat162float(__float2bfloat16_rn(x));
    else return __half2float(__float2half_rn(x));
}

// wgmma shared-memory descriptor of a K-major, 128-byte-swizzled operand (see the top comment):
// the low word is (address >> 4) | (leading byte offset 16 >> 4) << 16 (shared addresses are
// below 2^18, so address >> 4 fits its 14 bits), the high word the stride byte offset 1024 >> 4
// and layout type 1 (128B swizzle) in bits 62..63. Built from the low word alone so the k16-step
// advance is one 32-bit add.
constexpr uint32_t kDescHi = (1024u >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t desc_lo(uint32_t addr) { return (addr >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t desc_of(uint32_t lo) {
    return ((uint64_t)kDescHi << 32) | (uint64_t)lo;
}

// A tile's descriptor low word as lane 0 holds it (NVFP4MOE_HOPPER_UDESC = 1; 0 for A/B runs): a
// value ptxas then knows to be the same in every lane, so the wgmma descriptors are built on the
// uniform datapath. Computed per thread, each wgmma's descriptor cost a vector add, a move of the
// constant high word and two register-to-uniform moves. H100, DeepSeek-V3 GEMM1 at M = 4096 (ncu):
// 20 fewer instructions per warp and k tile (349 -> 329 on 128 token columns, 339 -> 319 on 32,
// where the decode's instructions are the limit); the GEMMs alone 2-6 % faster at M = 1024 and
// 4096 (bench/results/2026-12-07-h100-narrow-items.md). Used by the KS = 1 kernels (see tile).
#ifndef NVFP4MOE_HOPPER_UDESC
#define NVFP4MOE_HOPPER_UDESC 1
#endif
__device__ __forceinline__ uint32_t desc_uniform(uint32_t lo) {
#if NVFP4MOE_HOPPER_UDESC
    return __shfl_sync(0xffffffffu, lo, 0);
#else
    return lo;
#endif
}

struct Item {
    int blk, nt, kt0, kt1;
};

// A sorted-id slot holds a real pair (not padding: negative or >= P).
__device__ __forceinline__ bool real_pair(const Params &p, int pid) { return pid >= 0 && pid < p.P; }
// nt: the item's first n tile, STEP * its group along N.
template <int STEP>
__device__ __forceinline__ Item item_of(int item, int splits, const Params &p) {
    Item it;
    const int s = item % splits;
    const int unit = item / splits;
    it.nt = (unit % p.n_groups) * STEP;
    it.blk = unit / p.n_groups;
    it.kt0 = (int)((long long)s * p.k_tiles / splits);
    it.kt1 = (int)((long long)(s + 1) * p.k_tiles / splits);
    return it;
}

// The producer's hand-over of work items to the consumers (Kernel::produce, consume): per slot
// the item (-1: no more) and its block's pair ids, with a "full" and an "empty" mbarrier.
// With the item, the producer publishes everything the consumers' epilogue needs that is not an
// accumulator, loaded while the consumers still run the previous item: the item's coordinates,
// its expert's scales (times kAccUnscale), every row's pair id and row scale, and the bias of the
// item's weight rows (set q: RT = 2 its n tile nt + q, GU gate (0) and up (1) rows, RT = 1 tile
// nt). The consumers hold a slot until their epilogue is done: an item starts with no memory
// latency of its own (loaded by the consumers at item start, these were a chain of two dependent
// global loads per item, with the consumers' tensor cores idle).
constexpr int kQueue = 4;
template <int BM>
struct ItemSlot {
    int item, blk, nt, kt0, kt1;
    float s2, s2_up;
    int2 pr[BM];  // row r's pair id and row scale (as bits): one 8-byte load in the epilogue
    float bias[2][kTN];
#if NVFP4MOE_HOPPER_LEAN_EPI
    // row r's output: the element offset of its row in C (or, GU, in the activation's output) as
    // two words (-1: no pair there), its row scale as bits, its pair id: one 16-byte load (only
    // the hand-off kernels use the slots: block_m 8 and 16 keep one entry, within their shared memory)
    int4 ro[KSplit<BM>::value == 1 ? BM : 1];
#endif
};
template <int BM>
struct ItemQueue {
    ItemSlot<BM> s[kQueue];
    uint64_t full[kQueue], empty[kQueue];
    int claim[2];  // the producer warpgroup's claimed item, by item parity
};

template <int BM, bool BF16, int NW_, int RT, bool GU>
struct Kernel {
    using C = Cfg<BM, RT>;
    static_assert(!GU || RT == 2, "the gate/up pairing runs two weight tiles per item");
    // n tiles from one item's first tile to the next item's: RT, or 1 for GU (item g: gate tile g)
    static constexpr int kNtStep = GU ? 1 : RT;

    // Items handed from the producer to the consumers through ItemQueue (claimed from the
    // workspace counter where there is one): KS = 1. KS = 2 kernels (block_m 8 and 16) keep the
    // round-robin walk of both sides with the ids loaded one item ahead: with the hand-over,
    // claimed or round robin, the whole layer ran 4-8 % slower at M = 64..256 (H100).
    static constexpr bool kHandOff = KSplit<BM>::value == 1;

    // ---- producer warpgroup ----
    // Thread tid copies 16-byte chunk cc = tid % 16 of the 256-byte k-tile slice of rows
    // r0 + 8j (r0 = tid / 16, j < CPT). The rows' offsets are resolved ONCE per work item into
    // registers (16-byte units, 32 bits: the launcher checks the activations fit), so a tile costs
    // per chunk one address multiply-add and the cp.async: the per-tile row-id loads and 64-bit
    // address arithmetic of the first version made this warpgroup, not the tensor cores, the
    // limit at large M (ncu: the consumers waited on the full barrier a third of their time).
    // Sentinel rows are not copied at all: wgmma's output column m depends on token row m only,
    // so whatever a sentinel's slot holds lands in accumulators the epilogue skips.
    static __device__ void produce(const Params &p, uint8_t *smem, uint32_t bars, int items,
                                   int splits, ItemQueue<BM> &q) {
        const int tid = threadIdx.x;  // 0..127
        const int cc = tid % 16;      // 16-byte chunk of the 256-byte row slice (constant)
        const int r0 = tid / 16;      // first row; rows r0 + 8j
        // Destination of chunk cc of row r: K half cc/8, swizzled chunk (cc%8) ^ (r & 7); r & 7
        // is r0 & 7 for every j since rows step by 8.
        const uint32_t dst0 = (uint32_t)((cc / 8) * BM * 128 + r0 * 128 + (((cc % 8) ^ (r0 & 7)) * 16));
        const uint32_t row16 = (uint32_t)p.K / 8;  // a row's length in 16-byte units
        uint32_t it = 0;
        uint32_t pre = 0;  // thread 0, p.pdl: stages of the first item whose weights were issued early
#if NVFP4MOE_HOPPER_PFENCE
        int pending = -1;  // stage whose copies were issued but whose full barrier waits on them
#endif
        // Items come from the launch's counter (in claim order, so a CTA that drew short items
        // takes more of them), else every gridDim.x-th, and reach the consumers through the
        // queue. Thread 0 claims one item ahead, so the atomic's round trip overlaps an item's
        // copies.
        // KS = 2 (block_m 8 and 16) deals its items round robin without the hand-over (kHandOff).
        // A PDL launch (p.pdl) touches the counter only after its wait (the kernel ahead zeroes
        // it; only the wait makes that visible): CTA b's first item is b, the counter then hands
        // out items from gridDim.x on.
        int next = 0;
        const int claim_base = p.pdl ? (int)gridDim.x : 0;
        if (kHandOff && tid == 0) next = p.sched && !p.pdl ? atomicAdd(p.sched, 1) : (int)blockIdx.x;
        for (uint32_t qi = 0;; qi++) {
            int item = (int)(blockIdx.x + qi * gridDim.x);
            const uint32_t slot = qi % kQueue;
            if constexpr (kHandOff) {
                if (tid == 0) {
                    q.claim[qi & 1] = next;
                    if (next < items && !(p.pdl && qi == 0))  // (a PDL launch's: after its wait)
                        next = p.sched ? claim_base + atomicAdd(p.sched, 1)
                                       : (int)(blockIdx.x + (qi + 1) * gridDim.x);
                }
                producer_barrier();
                item = *reinterpret_cast<volatile int *>(&q.claim[qi & 1]);
                mbar_wait(smem_u32(&q.empty[slot]), ((qi / kQueue) & 1) ^ 1);
                if (item >= items) {
                    if (tid == 0) q.s[slot].item = -1;
                    mbar_arrive(smem_u32(&q.full[slot]));
                    break;
                }
            } else if (item >= items) {
                break;
            }
            const Item w = item_of<kNtStep>(item, splits, p);
            const int e = p.block_expert[w.blk];
            const uint8_t *wsrc =
                p.b + ((size_t)(e * p.n_tiles + w.nt) * p.k_tiles) * kWChunk;
            // RT = 2: the item's second n tile, when N has one (an odd tile count leaves the
            // last item one tile); GU: the up tile of gate tile nt, n_tiles / 2 further on.
            const int nw = RT == 1 ? 1 : GU || w.nt + 1 < p.n_tiles ? 2 : 1;
            const size_t w2off = (size_t)(GU ? p.n_tiles / 2 : 1) * p.k_tiles * kWChunk;
#if NVFP4MOE_HOPPER_WPF > 0
            // L2 prefetch: the item's chunks past its first, up to WPF k tiles, at its head; in the
            // k loop each tile's chunks WPF tiles ahead of its bulk copies.
            if (kHandOff && tid == 0)
                for (int kp = w.kt0 + 1; kp < w.kt0 + NVFP4MOE_HOPPER_WPF && kp < w.kt1; kp++)
                    prefetch_chunks(wsrc, w2off, kp, RT == 2 && nw == 2);
#endif
            uint32_t roff[C::CPT];  // ~0u: row r0 + 8j is a sentinel
#pragma unroll
            for (int j = 0; j < C::CPT; j++) {
                const int pid = p.sorted_ids[w.blk * BM + r0 + 8 * j];
                roff[j] = real_pair(p, pid) ? (uint32_t)(pid / p.a_row_div) * row16 : ~0u;
                if (kHandOff && cc == 0) q.s[slot].pr[r0 + 8 * j].x = pid;
            }
            if constexpr (kHandOff) {
                ItemSlot<BM> &sl = q.s[slot];
                if (tid == 0) {
                    sl.item = item;
                    sl.blk = w.blk;
                    sl.nt = w.nt;
                    sl.kt0 = w.kt0;
                    sl.kt1 = w.kt1;
                    sl.s2 = p.scale_2[p.halves ? 2 * e : e] * kAccUnscale;
                    sl.s2_up = p.halves ? p.scale_2[2 * e + 1] * kAccUnscale : sl.s2;
                }
                if (tid < BM) {
                    const int pid = p.sorted_ids[w.blk * BM + tid];
                    const float rs = p.row_scale && real_pair(p, pid) ? p.row_scale[pid] : 1.0f;
                    sl.pr[tid].y = __float_as_int(rs);
#if NVFP4MOE_HOPPER_LEAN_EPI
                    const long long off = real_pair(p, pid) ? (long long)pid * (GU ? p.N / 2 : p.N) : -1LL;
                    sl.ro[tid] = make_int4((int)(uint32_t)off, (int)(off >> 32), __float_as_int(rs), pid);
#endif
                }
                if (p.bias) {
#pragma unroll
                    for (int qq = 0; qq < (RT == 2 ? 2 : 1); qq++) {
                        const int n = GU ? qq * (p.N / 2) + w.nt * kTN + tid : (w.nt + qq) * kTN + tid;
                        sl.bias[qq][tid] = n < p.N ? p.bias[(size_t)e * p.N + n] : 0.0f;
                    }
                }
                mbar_arrive(smem_u32(&q.full[slot]));  // release: the item, its ids and values
            }
            if (p.pdl && qi == 0) {
                // Launched with PDL behind GEMM1 (args->pdl): everything above reads what was
                // complete before GEMM1 let this kernel start (the grouping, the router weights,
                // the weights' scales and bias; a GEMM1 launched with PDL itself lets it start
                // only after its own wait for the grouping). The first item's weight chunks for
                // the ring's first stages need no wait either (the first pass over the ring finds
                // every stage free): they stream while GEMM1's last CTAs finish. GEMM1's output,
                // the activations, only after the wait.
                if (tid == 0) {
                    pre = (uint32_t)min(C::STAGES, w.kt1 - w.kt0);
                    for (uint32_t s = 0; s < pre; s++) {
                        const uint32_t full = bars + 8 * s;
                        uint8_t *stage = smem + s * C::STAGE;
                        mbar_arrive_expect_tx(full, nw * kWChunk);
                        bulk_g2s(smem_u32(stage + C::ACT), wsrc + (size_t)(w.kt0 + s) * kWChunk, kWChunk, full);
                        if (RT == 2 && nw == 2)
                            bulk_g2s(smem_u32(stage + C::ACT + kWChunk),
                                     wsrc + w2off + (size_t)(w.kt0 + s) * kWChunk, kWChunk, full);
                    }
                }
                nvfp4moe_pdl::wait();
                nvfp4moe_pdl::trigger();  // after the wait: what the kernels ahead wrote is complete
                if (kHandOff && tid == 0 && next < items)  // the one-ahead claim, held back above
                    next = p.sched ? claim_base + atomicAdd(p.sched, 1) : (int)(blockIdx.x + gridDim.x);
            }
            for (int kt = w.kt0; kt < w.kt1; kt++, it++) {
                const uint32_t st = it % C::STAGES;
                const uint32_t ph = (it / C::STAGES) & 1;
                const uint32_t full = bars + 8 * st, empty = bars + 8 * (C::STAGES + st);
#if NVFP4MOE_HOPPER_PFENCE
                // Before blocking on a slot, publish the stage still pending (see below).
                if (pending >= 0 && !mbar_test(empty, ph ^ 1)) {
                    asm volatile("cp.async.wait_all;\n" ::: "memory");
                    fence_proxy_async();
                    mbar_arrive(bars + 8 * pending);
                    pending = -1;
                }
#endif
#if NVFP4MOE_HOPPER_WPF > 0
                if (kHandOff && tid == 0 && kt + NVFP4MOE_HOPPER_WPF < w.kt1)  // before any wait
                    prefetch_chunks(wsrc, w2off, kt + NVFP4MOE_HOPPER_WPF, RT == 2 && nw == 2);
#endif
                mbar_wait(empty, ph ^ 1);  // the first pass finds the previous parity complete
                uint8_t *stage = smem + st * C::STAGE;
                if (tid == 0 && it >= pre) {  // (the first stages of a PDL launch's first item: above)
                    mbar_arrive_expect_tx(full, nw * kWChunk);
                    bulk_g2s(smem_u32(stage + C::ACT), wsrc + (size_t)kt * kWChunk, kWChunk, full);
                    if (RT == 2 && nw == 2)  // the second tile's chunk
                        bulk_g2s(smem_u32(stage + C::ACT + kWChunk),
                                 wsrc + w2off + (size_t)kt * kWChunk, kWChunk, full);
                }
                // The K tail (k >= K) is zero-filled from a valid address: the weights there are
                // zero codes, but 0 * (stale NaN) would not be.
                const int k = kt * kTK + cc * 8;
                const bool kok = k < p.K;
                const uint4 *abase = reinterpret_cast<const uint4 *>(p.a + (kok ? k : 0));
                const uint32_t bytes = kok ? 16u : 0u;
                const uint32_t sdst = smem_u32(stage) + dst0;
#pragma unroll
                for (int j = 0; j < C::CPT; j++)
                    if (roff[j] != ~0u) cp_async16(sdst + j * 8 * 128, abase + roff[j], bytes);
#if NVFP4MOE_HOPPER_PFENCE
                // The activations are written by cp.async (generic proxy) and read by wgmma
                // (async proxy): this thread waits for its copies of the previous stage, fences
                // the proxies and only then arrives on that stage's full barrier, so the
                // consumers need no proxy fence of their own on every tile.
                asm volatile("cp.async.commit_group;\n" ::: "memory");
                if (pending >= 0) {
                    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
                    fence_proxy_async();
                    mbar_arrive(bars + 8 * pending);
                }
                pending = (int)st;
#else
                cp_async_arrive_noinc(full);
#endif
            }
        }
        // Leave only after this thread's copies have landed (the consumers may still wait).
        asm volatile("cp.async.wait_all;\n" ::: "memory");
#if NVFP4MOE_HOPPER_PFENCE
        if (pending >= 0) {
            fence_proxy_async();
            mbar_arrive(bars + 8 * pending);
        }
#endif
    }

    // ---- consumer warpgroups ----
    // Consumer warpgroup cw (0 .. 2*KS-1) owns weight rows 64*wg .. 64*wg+63 (wg = cw % 2) and,
    // of every k tile, the STEPS k16 steps of k group kg = cw / 2. Per tile: decode the first
    // half of its steps into A0, issue them (one wgmma group), then - once the previous tile's
    // second group has retired (wait_group 1) and its stage is released - decode the second
    // half into A1 and issue it; before the next tile's A0 decode, wait_group 1 retires this
    // tile's A0 group. So a decode always overlaps the tensor-core work of the other half, and
    // A registers are never rewritten while a wgmma may still read them.
    // RT = 2 (two weight tiles per item, KS = 1): consumer warpgroup wg owns all 128 rows of the
    // item's n tile nt + wg as two 64-row halves with one accumulator set each (RH = 2), both
    // against the same token rows: each stage's activations then feed 256 weight rows instead of
    // 128, half the activation traffic (shared memory fill, L2) per MMA. A tile is four wgmma
    // groups (half 0 steps 0-3, half 1 steps 0-3, half 0 steps 4-7, half 1 steps 4-7) over the
    // same two A register sets.
    static constexpr int RH = RT;  // 64-row halves per consumer warpgroup
    static constexpr int KS = C::KS;
    static constexpr int STEPS = 8 / KS;  // k16 steps per tile per consumer warpgroup
    static constexpr int HS = STEPS / 2;  // steps per wgmma group

    // Descriptor low-word offset (16-byte units) of local k16 step j: K half j/4 of the stage's
    // activations (BM*128 bytes each), then 32 bytes per step inside the swizzle atom.
    static __device__ __forceinline__ constexpr uint32_t step_off16(int j) {
        return (uint32_t)((j / 4) * BM * 8 + (j % 4) * 2);
    }

    // Token tile widths. An item's wgmma tile spans the narrowest of NW widths BM, BM/2, ..
    // that holds its block's pairs, so the tail block of an expert with 137 pairs at block_m 128
    // runs 32 token columns, not 128 (at M = 4096 on DeepSeek-V3's 256 experts, a third of the
    // blocks are such tails: ncu counted 48 % more wgmmas than pairs need with one width). Each
    // width is its own copy of the item (k loop and epilogue) with its own accumulators, so no
    // copy keeps another width's registers live: a prefix of one array of BM / 2 accumulators
    // per width made ptxas spill (two widths) or serialize the wgmmas (four or more) at block_m
    // 128 with two weight tiles. The block's pair ids come with the item from the producer's
    // queue in shared memory, so the width costs no memory latency.
    static constexpr int NW = NW_;
    static_assert(NW >= 1 && (BM >> (TokenWidths<BM>::shift * (NW - 1))) >= 8, "widths");
    static_assert(KS == 1 || NW == 1, "a KS = 2 block is one width");

    // The epilogue takes its rows' ids (and row scales) from registers by warp shuffles,
    // not from memory: its loads of ids, row scales and bias between the stores were one memory
    // latency each, in series (ncu: ~10 % of GEMM1's samples at K = 7168, more at short K).
    static constexpr int NR = BM < 32 ? 1 : BM / 32;  // ids per lane: lane l holds row 32i + l
    static __device__ __forceinline__ void load_rows(const Params &p, int blk, int lane, int (&pid)[NR]) {
#pragma unroll
        for (int i = 0; i < NR; i++)
            pid[i] = 32 * i + lane < BM ? p.sorted_ids[blk * BM + 32 * i + lane] : -1;
    }
    // Rows up to the block's last real pair (pairs fill a block from its first row).
    static __device__ __forceinline__ int real_rows(const Params &p, const int (&pid)[NR]) {
        if constexpr (NW == 1) return BM;
        int last = -1;  // highest row holding a real pair
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const unsigned m = __ballot_sync(0xffffffffu, real_pair(p, pid[i]));
            if (m) last = 32 * i + 31 - __clz(m);
        }
        return last + 1;
    }

    // One k16 step (A fragment a, descriptor low word dlo of the step) on the block's first
    // 2 * NA token columns: one m64n(2 NA)k16 wgmma on NA accumulators.
    template <int NA>
    static __device__ __forceinline__ void mma_step(float (&acc)[NA], const uint32_t (&a)[4],
                                                    uint32_t dlo) {
        Wgmma<2 * NA, BF16>::template rs<0>(acc, a, desc_of(dlo));
    }

    // Decodes half `half` of a tile's steps into A register set a (see consume).
    template <int HALF>
    static __device__ __forceinline__ void decode_half(const uint32_t (&cwd)[STEPS],
                                                       const uint32_t (&swd)[STEPS / 2],
                                                       uint32_t (&a)[HS][4]) {
#pragma unroll
        for (int j = 0; j < HS; j++) {
            const int s = HALF * HS + j;
            if (s % 2 == 0) decode_step<BF16, 0>(cwd[s], swd[s / 2], a[j]);
            else decode_step<BF16, 2>(cwd[s], swd[s / 2], a[j]);
        }
    }

    // RT = 2: the wgmma group of 64-row half H, steps 4J .. 4J+3 of the tile in stage sbase,
    // into A set a and accumulators acc (see tile).
    template <int H, int J, int NA>
    static __device__ __forceinline__ void group2(float (&acc)[NA], uint32_t (&a)[HS][4],
                                                  uint32_t sbase, uint32_t code_off,
                                                  uint32_t scale_off, uint32_t dlo, int prev,
                                                  uint32_t bars) {
        static_assert(KS == 1 && HS == 4, "RT = 2 runs 8 steps per tile in groups of 4");
        // Accumulator set H: the next 64 rows of the warpgroup's chunk, or (GU) the same rows of
        // the stage's second chunk.
        constexpr uint32_t kCodeStride = GU ? kWChunk : 4096, kScaleStride = GU ? kWChunk : 512;
        const uint4 q = lds128(sbase + code_off + H * kCodeStride + J * 512);
        const uint2 sc = lds64(sbase + scale_off + H * kScaleStride + J * 8);
        const uint32_t cwd[4] = {q.x, q.y, q.z, q.w}, swd[2] = {sc.x, sc.y};
        wgmma_wait<1>();
        // Every consumer thread arrives: an arrive releases only the arriving thread's own reads
        // of the stage, and the bulk copy refilling it must follow all of them (see tile).
        if (H == 1 && J == 0 && prev >= 0) mbar_arrive(bars + 8 * (C::STAGES + prev));
        decode_step<BF16, 0>(cwd[0], swd[0], a[0]);
        decode_step<BF16, 2>(cwd[1], swd[0], a[1]);
        decode_step<BF16, 0>(cwd[2], swd[1], a[2]);
        decode_step<BF16, 2>(cwd[3], swd[1], a[3]);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; j++) mma_step(acc, a[j], dlo + step_off16(4 * J + j));
        wgmma_commit();
    }

    // One k tile on a token tile of 2 * NA columns (see the comment above KS): the first half of its
    // steps is decoded into a0 once the previous tile's first group has retired, the second
    // into a1 once the previous tile's second group has, which also frees that tile's stage.
    // (A third group in flight, with three A sets in rotation, was not faster on the H200 and
    // without ptxas's serialization it read A registers being rewritten.)
    template <int NA>
    static __device__ __forceinline__ void tile(float (&accs)[RH][NA], uint32_t (&a0)[HS][4],
                                                uint32_t (&a1)[HS][4], uint32_t it, int &prev,
                                                uint32_t bars,
                                                uint32_t smem0, uint32_t code_off,
                                                uint32_t scale_off, uint32_t dlo0) {
        const uint32_t st = it % C::STAGES;
        const uint32_t ph = (it / C::STAGES) & 1;
        mbar_wait(bars + 8 * st, ph);
#if !NVFP4MOE_HOPPER_PFENCE
        fence_proxy_async();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
#endif
        const uint32_t sbase = smem0 + st * C::STAGE;
        const uint32_t dlo0s = dlo0 + st * (uint32_t)(C::STAGE / 16);
        // KS = 2 (block_m 8 and 16) keeps the per-thread form: its GEMMs ran 3-4 % slower with the
        // uniform one at block_m 8 (H100, M = 64, bench/results/2026-12-07-h100-narrow-items.md).
        const uint32_t dlo = KS == 1 ? desc_uniform(dlo0s) : dlo0s;
        if constexpr (RH == 2) {
            // Four groups; each loads only its own codes (one LDS.128: 4 steps) and scales (one
            // LDS.64) before its wait, so no more than one group's words are live at a time
            // (with the two halves' 128 accumulators, loading the tile's 24 words at once spilled).
            // Groups retire in order, so each wait_group 1 retires the group issued two before
            // it: the one that last read the A set about to be rewritten. The second group's wait
            // retires the previous tile's last group, which frees that tile's stage.
            group2<0, 0>(accs[0], a0, sbase, code_off, scale_off, dlo, prev, bars);
            group2<1, 0>(accs[1], a1, sbase, code_off, scale_off, dlo, prev, bars);
            group2<0, 1>(accs[0], a0, sbase, code_off, scale_off, dlo, prev, bars);
            group2<1, 1>(accs[1], a1, sbase, code_off, scale_off, dlo, prev, bars);
        } else {
            float (&acc)[NA] = accs[0];
            uint32_t cwd[STEPS], swd[STEPS / 2];
            if constexpr (KS == 1) {
                const uint4 q0 = lds128(sbase + code_off);
                const uint4 q1 = lds128(sbase + code_off + 512);
                const uint4 sc = lds128(sbase + scale_off);
                cwd[0] = q0.x; cwd[1] = q0.y; cwd[2] = q0.z; cwd[3] = q0.w;
                cwd[4] = q1.x; cwd[5] = q1.y; cwd[6] = q1.z; cwd[7] = q1.w;
                swd[0] = sc.x; swd[1] = sc.y; swd[2] = sc.z; swd[3] = sc.w;
            } else {
                const uint4 q0 = lds128(sbase + code_off);
                const uint2 sc = lds64(sbase + scale_off);
                cwd[0] = q0.x; cwd[1] = q0.y; cwd[2] = q0.z; cwd[3] = q0.w;
                swd[0] = sc.x; swd[1] = sc.y;
            }

            wgmma_wait<1>();  // the previous tile's first group is done: a0 may be rewritten
            decode_half<0>(cwd, swd, a0);
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < HS; j++) mma_step(acc, a0[j], dlo + step_off16(j));
            wgmma_commit();

            wgmma_wait<1>();  // the previous tile's second group is done: free its stage, rewrite a1
            // Every consumer thread arrives: an arrive releases only the arriving thread's own reads
            // of the stage (its LDS of codes and scales), and the bulk copy refilling it must follow
            // all of them (one arrive per warp after __syncwarp still raced under racecheck once an
            // item's k tiles wrap around the stages).
            if (prev >= 0) mbar_arrive(bars + 8 * (C::STAGES + prev));
            decode_half<1>(cwd, swd, a1);
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < HS; j++) mma_step(acc, a1[j], dlo + step_off16(HS + j));
            wgmma_commit();
        }
        prev = (int)st;
    }

    // The k tiles kt0 .. kt1-1 of one item on 2 * NA token columns; the stage not yet released
    // is left in prev.
    template <int NA>
    static __device__ __forceinline__ void tiles(float (&acc)[RH][NA], int kt0, int kt1,
                                                 uint32_t &it, int &prev, uint32_t bars,
                                                 uint32_t smem0, uint32_t code_off,
                                                 uint32_t scale_off, uint32_t dlo0) {
        uint32_t a0[HS][4], a1[HS][4];
        for (int kt = kt0; kt < kt1; kt++, it++)
            tile(acc, a0, a1, it, prev, bars, smem0, code_off, scale_off, dlo0);
    }

    // RT = 2, an item whose second n tile does not exist (odd tile count): the warpgroup that
    // would own it only waits for each stage and releases it, so the empty barriers count every
    // consumer thread once per use of a stage, in step with the producer.
    static __device__ __forceinline__ void skip_tiles(int kt0, int kt1, uint32_t &it, uint32_t bars) {
        for (int kt = kt0; kt < kt1; kt++, it++) {
            const uint32_t st = it % C::STAGES;
            mbar_wait(bars + 8 * st, (it / C::STAGES) & 1);
            mbar_arrive(bars + 8 * (C::STAGES + st));
        }
    }

    // Per item, per consumer thread: the block's pair ids spread over the
    // warp's lanes, their row scales (1 without row_scale), the thread's first output column
    // n_base of its first half (its second is n_base + 8; half q adds 64 q) and its bias values.
    struct Rows {
        int pid[NR];
        float rs[NR];
        int n_base;
        float bias[RH][2];
        float s2, s2_up;  // the expert's scale_2 (gate, up) times kAccUnscale
        const ItemSlot<BM> *sl;  // KS = 1: the item's queue slot, where the values above wait
    };

    // KS = 1: this consumer thread's epilogue values from the item's queue slot (the producer
    // loaded them; the row scales stay there, for_each_token reads them). Set q of the thread
    // is its chunk's 64-row half q (RT = 2), gate or up (GU), or the tile's half wg (RT = 1).
    static __device__ __forceinline__ void slot_get(const Params &p, Rows &r, int wg, int half0) {
        const ItemSlot<BM> &sl = *r.sl;
        const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4, g = lane / 4;
        constexpr bool kTwoTiles = RT == 2 && !GU;
        r.s2 = sl.s2;
        r.s2_up = sl.s2_up;
#pragma unroll
        for (int q = 0; q < RH; q++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int lr = (kTwoTiles ? 64 * q : 64 * half0) + warp * 16 + g + 8 * h;
                r.bias[q][h] = p.bias ? sl.bias[kTwoTiles ? wg : GU ? q : 0][lr] : 0.0f;
            }
    }

    static __device__ void consume(const Params &p, uint8_t *smem, uint32_t bars, int items,
                                   int splits, int *s_flag, ItemQueue<BM> &q) {
        const int cw = threadIdx.x / 128 - 1;
        // RT = 1: weight rows 64*wg .. 64*wg+63 of the item's n tile; RT = 2: n tile nt + wg;
        // GU: rows 64*wg .. of gate tile nt (set 0) and of its up tile (set 1).
        const int wg = cw % 2;
        const int kg = cw / 2;   // k group: steps STEPS*kg .. STEPS*kg + STEPS-1 of each tile
        const int warp = (threadIdx.x / 32) % 4;
        const int lane = threadIdx.x % 32;
        const int tid = threadIdx.x % 128;
        const int g = lane / 4, t = lane % 4;
        // The warpgroup's first 64-row half: chunk wg's half 0 (RT = 2), else half wg of chunk 0.
        constexpr bool kTwoTiles = RT == 2 && !GU;
        const int chunk = kTwoTiles ? wg : 0, half0 = kTwoTiles ? 0 : wg;
        const uint32_t code_off = (uint32_t)(C::ACT + chunk * kWChunk + half0 * 4096 + warp * 1024 +
                                             lane * 16 + kg * 512);
        const uint32_t scale_off = (uint32_t)(C::ACT + chunk * kWChunk + kCodeBytes + half0 * 512 +
                                              warp * 128 + g * 16 + kg * 8);
        const uint32_t smem0 = smem_u32(smem);
        // The k group's first step is 4*kg (KS = 2): K half kg of the activations.
        const uint32_t dlo0 = desc_lo(smem0) + (uint32_t)(kg * BM * 8);
        uint32_t it = 0;

        int pid[NR];  // KS = 2: the next item's ids, loaded one item ahead
        if (!kHandOff && (int)blockIdx.x < items)
            load_rows(p, item_of<kNtStep>(blockIdx.x, splits, p).blk, lane, pid);
        for (uint32_t qi = 0;; qi++) {
            // The next item and its block's pair ids (lane l: rows 32i + l): from the producer,
            // or (KS = 2) every gridDim.x-th with the ids loaded one item ahead.
            int item = (int)(blockIdx.x + qi * gridDim.x);
            Rows r;
            Item w;
            const uint32_t slot = qi % kQueue;
            if constexpr (kHandOff) {
                // The slot stays ours (its empty barrier unarrived) until the item's epilogue is done.
                mbar_wait(smem_u32(&q.full[slot]), (qi / kQueue) & 1);
                const ItemSlot<BM> &sl = q.s[slot];
                item = sl.item;
                if (item < 0) break;
                w.blk = sl.blk;
                w.nt = sl.nt;
                w.kt0 = sl.kt0;
                w.kt1 = sl.kt1;
#pragma unroll
                for (int i = 0; i < NR; i++) r.pid[i] = 32 * i + lane < BM ? sl.pr[32 * i + lane].x : -1;
                r.sl = &sl;
            } else {
                if (item >= items) break;
#pragma unroll
                for (int i = 0; i < NR; i++) r.pid[i] = pid[i];
                if (item + (int)gridDim.x < items)
                    load_rows(p, item_of<kNtStep>(item + gridDim.x, splits, p).blk, lane, pid);
                w = item_of<kNtStep>(item, splits, p);
                r.sl = nullptr;
            }
            const int nt = w.nt + chunk;  // this warpgroup's n tile
            r.n_base = nt * kTN + half0 * 64 + warp * 16 + g;
            if (kTwoTiles && nt >= p.n_tiles) {  // the last item of an odd tile count: no tile here
                skip_tiles(w.kt0, w.kt1, it, bars);
                if constexpr (kHandOff) mbar_arrive(smem_u32(&q.empty[slot]));
                continue;
            }
            if constexpr (!kHandOff) {
                // KS = 2: the epilogue's per-item values, loaded before the k loop and kept in
                // registers: the expert's scales, the row scales of the lane's ids, this thread's
                // bias values (KS = 1 finds them in the queue slot).
                const int e = p.block_expert[w.blk];
                r.s2 = p.scale_2[p.halves ? 2 * e : e] * kAccUnscale;
                r.s2_up = p.halves ? p.scale_2[2 * e + 1] * kAccUnscale : r.s2;
#pragma unroll
                for (int i = 0; i < NR; i++)
                    r.rs[i] = p.row_scale && real_pair(p, r.pid[i]) ? p.row_scale[r.pid[i]] : 1.0f;
                const int qrows = GU ? p.N / 2 : 64;  // set q's rows start q * qrows further on
#pragma unroll
                for (int q = 0; q < RH; q++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int n = r.n_base + qrows * q + 8 * h;
                        r.bias[q][h] = p.bias && n < p.N ? p.bias[(size_t)e * p.N + n] : 0.0f;
                    }
            }
            item_widths(splits > 1 ? BM : real_rows(p, r.pid), p, w, nt, wg, kg, half0, tid, g, t, r,
                        it, bars, smem, code_off, scale_off, dlo0, splits, s_flag);
            if constexpr (kHandOff) mbar_arrive(smem_u32(&q.empty[slot]));  // the epilogue has read the slot
        }
    }

    // The item's token tile width: the narrowest of BM, BM/2, .. (NW of them) holding its rows.
    template <int J = 0>
    static __device__ __forceinline__ void item_widths(int rows, const Params &p, const Item &w,
                                                       int nt, int wg, int kg, int half0, int tid,
                                                       int g, int t, const Rows &r,
                                                       uint32_t &it, uint32_t bars,
                                                       uint8_t *smem, uint32_t code_off,
                                                       uint32_t scale_off, uint32_t dlo0,
                                                       int splits, int *s_flag) {
        if constexpr (J + 1 < NW) {
            if (rows <= (BM >> (TokenWidths<BM>::shift * (J + 1)))) {
                item_widths<J + 1>(rows, p, w, nt, wg, kg, half0, tid, g, t, r, it, bars,
                                   smem, code_off, scale_off, dlo0, splits, s_flag);
                return;
            }
        }
        item<(C::NACC >> (TokenWidths<BM>::shift * J))>(p, w, nt, wg, kg, half0, tid, g, t, r, it, bars, smem,
                             code_off, scale_off, dlo0, splits, s_flag);
    }

    // One item's k tiles and epilogue on a token tile of 2 * NA columns, with its own NA
    // accumulators per 64-row set: an item of one width keeps no other width's registers live.
    template <int NA>
    static __device__ __forceinline__ void item(const Params &p, const Item &w, int nt, int wg,
                                                int kg, int half0, int tid, int g, int t,
                                                const Rows &r_in, uint32_t &it,
                                                uint32_t bars, uint8_t *smem, uint32_t code_off,
                                                uint32_t scale_off, uint32_t dlo0, int splits,
                                                int *s_flag) {
        const uint32_t smem0 = smem_u32(smem);
        float acc[RH][NA];
#pragma unroll
        for (int q = 0; q < RH; q++) {
#pragma unroll
            for (int i = 0; i < NA; i++) acc[q][i] = 0.f;
            fence_operands(acc[q]);
        }
        int prev = -1;
        tiles(acc, w.kt0, w.kt1, it, prev, bars, smem0, code_off, scale_off, dlo0);
        wgmma_wait<0>();
#pragma unroll
        for (int q = 0; q < RH; q++) fence_operands(acc[q]);
        if (prev >= 0) mbar_arrive(bars + 8 * (C::STAGES + prev));  // every thread, as in tile()
        if constexpr (KS == 2) {
            // k group 1 hands its partial sums to k group 0 of the same rows through shared
            // memory ([wg][i][128 threads]: conflict-free); barrier 4 + wg = those 256 threads.
            float *red = reinterpret_cast<float *>(smem + C::STAGES * C::STAGE) +
                         wg * NA * 128 + tid;
            if (kg == 1) {
#pragma unroll
                for (int i = 0; i < NA; i++) red[i * 128] = acc[0][i];
            }
            pair_barrier(wg);
            if (kg == 0) {
#pragma unroll
                for (int i = 0; i < NA; i++) acc[0][i] += red[i * 128];
            }
            pair_barrier(wg);  // read before k group 1 rewrites it for the next item
            if (kg == 1) return;
        }
        // KS = 1: the per-item values from the queue slot (held in registers across the k loop
        // they made ptxas serialize the wgmmas at block_m 128 with two weight tiles).
        Rows r = r_in;
        if constexpr (kHandOff) slot_get(p, r, wg, half0);
        const float s2 = r.s2, s2_up = r.s2_up;
        // Split-K bookkeeping per (n tile, 64-row half); the election's flag and barrier per
        // (warpgroup, half): ids 1 + ci, ci < 4 (RT = 2) or < 2.
#if NVFP4MOE_HOPPER_LEAN_EPI
        if constexpr (kHandOff) {
            if (!(NA == C::NACC && splits > 1)) {  // not split along K (only full widths split)
                lean_epilogue<NA>(p, acc, r, s2, s2_up, g, t);
                return;
            }
        }
#endif
        if constexpr (GU) {
            epilogue_act(p, acc[0], acc[1], w.blk, nt, wg, r, s2, s2_up, splits, g, t, s_flag);
        } else {
#pragma unroll
            for (int q = 0; q < RH; q++)
                epilogue(p, acc[q], w.blk, nt, half0 + q, RH * wg + q, r, r.n_base + 64 * q,
                         r.bias[q], s2, s2_up, splits, g, t, s_flag);
        }
    }

    // acc[4i + 2h + b] = D[row 16*warp + g + 8h of the 64-row half][token 8i + 2t + b]: token
    // 8i + 2t + b's id is in lane 8(i%4) + 2t + b's r.pid[i/4]. s2, s2_up: the block's expert's
    // scale_2 times kAccUnscale, one per expert or per (expert, half): row n takes the up half's
    // when n >= N/2 (stacked) or n is odd (interleaved). The half's split-K counter is
    // (blk, nt, half); ci picks its election flag and named barrier.
    // Split-K: this split's partial sums of rows n_base and n_base + 8 (those below n_end) into
    // the fp32 workspace [P, N], and back once the last split is elected.
    template <int NA>
    static __device__ __forceinline__ void ws_add(const Params &p, const float (&acc)[NA],
                                                  const Rows &r, int n_base, int n_end, int t) {
#pragma unroll
        for (int i = 0; i < NA / 4; i++)
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const int pid = __shfl_sync(0xffffffffu, r.pid[i / 4], 8 * (i % 4) + 2 * t + b);
                if (!real_pair(p, pid)) continue;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int n = n_base + 8 * h;
                    if (n < n_end) red_add_f32(p.ws + (size_t)pid * p.N + n, acc[4 * i + 2 * h + b]);
                }
            }
    }
    template <int NA>
    static __device__ __forceinline__ void ws_load(const Params &p, float (&acc)[NA],
                                                   const Rows &r, int n_base, int n_end, int t) {
#pragma unroll
        for (int i = 0; i < NA / 4; i++)
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const int pid = __shfl_sync(0xffffffffu, r.pid[i / 4], 8 * (i % 4) + 2 * t + b);
                if (!real_pair(p, pid)) continue;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int n = n_base + 8 * h;
                    if (n < n_end) acc[4 * i + 2 * h + b] = __ldcg(p.ws + (size_t)pid * p.N + n);
                }
            }
    }
    // After ws_add: whether this split is the last of its (block, n tile, half) to arrive (the
    // warpgroup's 128 threads agree through s_flag[ci] and named barrier 1 + ci).
    static __device__ __forceinline__ bool last_split(const Params &p, size_t counter, int ci,
                                                      int splits, int *s_flag) {
        __threadfence();
        wg_barrier(1 + ci);
        if (threadIdx.x % 128 == 0) {
            const int old = atomicAdd(p.counters + counter, 1);
            s_flag[ci] = old == splits - 1;
        }
        wg_barrier(1 + ci);
        const int last = s_flag[ci];
        wg_barrier(1 + ci);  // s_flag[ci] is rewritten by the next item's election
        if (last) __threadfence();
        return last != 0;
    }

    // One output value before its rounding: both epilogues compute every value through this, so
    // the fused path's gate and up are the plain epilogue's bit for bit.
    static __device__ __forceinline__ float c_value(float acc, float sc, bool has_bias, float bias,
                                                    float rs) {
        float v = acc * sc;
        if (has_bias) v += bias;
        return v * rs;
    }
    // A predicated 4-byte store: store_pair's (NVFP4MOE_HOPPER_PRED_ST) and store_packed's.
    static __device__ __forceinline__ void st_pred(uint16_t *addr, uint32_t word, bool ok) {
        asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n@q st.global.b32 [%0], %1;\n}\n" ::"l"(addr),
                     "r"(word), "r"((int)ok)
                     : "memory");
    }
    // Stores are 4 bytes: lanes g and g^1 (lane ^ 4) swap halves so the even one writes columns
    // n0+g, n0+g+1 and the odd one n0+7+g, n0+8+g (n0 = the 16-column group: N is even). Every
    // lane takes part in the shuffle; ok (real row, column in range) gates only its store.
    static __device__ __forceinline__ void store_pair(const Params &p, uint16_t *dst, int ld,
                                                      int pid, int col, bool odd, float v0,
                                                      float v1) {
        const float got = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
        const uint32_t lo = to_half_bits<BF16>(odd ? got : v0);
        const uint32_t hi = to_half_bits<BF16>(odd ? v1 : got);
#if NVFP4MOE_HOPPER_PRED_ST
        // A predicated store, no branch: the epilogue's 32 token columns per row set stay one
        // straight block the scheduler can interleave (the address of a skipped row is never used).
        const bool ok = real_pair(p, pid) && col < ld;
        st_pred(dst + (size_t)(ok ? pid : 0) * ld + col, lo | (hi << 16), ok);
#else
        if (!real_pair(p, pid) || col >= ld) return;
        *reinterpret_cast<uint32_t *>(dst + (size_t)pid * ld + col) = lo | (hi << 16);
#endif
    }

    // The scale_2 of rows n and n + 8 of a set (sc[0], sc[1]): the up half's where the expert has
    // two (halves 1: the second N/2 rows; halves 2: the odd rows).
    static __device__ __forceinline__ void set_scales(const Params &p, int n, float s2, float s2_up,
                                                      float (&sc)[2]) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int nn = n + 8 * h;
            const bool up = p.halves == 1 ? nn >= p.N / 2 : p.halves == 2 && (nn & 1);
            sc[h] = up ? s2_up : s2;
        }
    }
    // GU: the activation of the token column's gate values (ag[j0], ag[j1]) and up values: each
    // first what the plain epilogue would store (c_value, rounded to the 16-bit type), then
    // act(gate, up) as the activation kernel computes it from those stored values.
    template <int NA>
    static __device__ __forceinline__ void gated_pair(const Params &p, const float (&ag)[NA], const float (&au)[NA],
                                                      int j0, int j1, const Rows &r, float s2, float su,
                                                      float rs, float &v0, float &v1) {
        const float g0 = c_value(ag[j0], s2, p.bias, r.bias[0][0], rs);
        const float g1 = c_value(ag[j1], s2, p.bias, r.bias[0][1], rs);
        const float u0 = c_value(au[j0], su, p.bias, r.bias[1][0], rs);
        const float u1 = c_value(au[j1], su, p.bias, r.bias[1][1], rs);
        v0 = nvfp4moe_dev::act_silu_gated(p.ap, round16<BF16>(g0), round16<BF16>(u0));
        v1 = nvfp4moe_dev::act_silu_gated(p.ap, round16<BF16>(g1), round16<BF16>(u1));
    }

#if NVFP4MOE_HOPPER_LEAN_EPI
    // Two values rounded to the 16-bit type and packed (lo = v0), as to_half_bits rounds each.
    static __device__ __forceinline__ uint32_t pack16(float v0, float v1) {
        if constexpr (BF16) {
            const __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
            return *reinterpret_cast<const uint32_t *>(&h);
        } else {
            const __half2 h = __floats2half2_rn(v0, v1);
            return *reinterpret_cast<const uint32_t *>(&h);
        }
    }
    // v0, v1 packed, exchanged with the partner lane (lane ^ 4) as one word and stored at addr:
    // even lanes keep the low halves (their row, the partner's row + 1), odd lanes the high halves
    // (the partner's row + 8, their row + 8), as store_pair does; sel: odd ? 0x3276 : 0x5410.
    static __device__ __forceinline__ void store_packed(uint16_t *addr, float v0, float v1, uint32_t sel,
                                                        bool ok) {
        const uint32_t w = pack16(v0, v1);
        const uint32_t got = __shfl_xor_sync(0xffffffffu, w, 4);
        st_pred(addr, __byte_perm(w, got, sel), ok);
    }
    // Token column c's output row from the item's queue slot (ItemSlot::ro, one 16-byte
    // shared-memory load at ro0 + 16 c): its element offset, row scale and whether it holds a pair.
    struct RowOut {
        long long off;
        float rs;
        bool ok;
    };
    static __device__ __forceinline__ RowOut row_out(uint32_t ro0, int c) {
        const uint4 ro = lds128(ro0 + 16u * c);
        return {(long long)(((unsigned long long)ro.y << 32) | ro.x), __uint_as_float(ro.z), (int)ro.y >= 0};
    }
    // The epilogue of an item not split along K (NVFP4MOE_HOPPER_LEAN_EPI): per token column of
    // this thread, every 64-row set's two values (c_value, as the plain epilogue) stored through
    // store_packed at the row's output offset.
    template <int NA>
    static __device__ __forceinline__ void lean_epilogue(const Params &p, float (&acc)[RH][NA], const Rows &r,
                                                         float s2, float s2_up, int g, int t) {
        const bool odd = g & 1;
        const uint32_t sel = odd ? 0x3276u : 0x5410u;
        const uint32_t ro0 = smem_u32(&r.sl->ro[2 * t]);
        if constexpr (GU) {
            const int col = odd ? r.n_base + 7 : r.n_base;
            const bool colok = col < p.N / 2;
            uint16_t *const base = p.act + col;
            const float su = p.halves == 1 ? s2_up : s2;
#pragma unroll
            for (int i = 0; i < NA / 4; i++)
#pragma unroll
                for (int b = 0; b < 2; b++) {
                    const RowOut o = row_out(ro0, 8 * i + b);
                    float v0, v1;
                    gated_pair(p, acc[0], acc[1], 4 * i + b, 4 * i + 2 + b, r, s2, su, o.rs, v0, v1);
                    store_packed(base + o.off, v0, v1, sel, colok && o.ok);
                }
        } else {
            uint16_t *base[RH];
            bool colok[RH];
            float sc[RH][2];
#pragma unroll
            for (int q = 0; q < RH; q++) {
                const int n = r.n_base + 64 * q;
                const int col = odd ? n + 7 : n;
                colok[q] = col < p.N;
                base[q] = p.c + col;
                set_scales(p, n, s2, s2_up, sc[q]);
            }
#pragma unroll
            for (int i = 0; i < NA / 4; i++)
#pragma unroll
                for (int b = 0; b < 2; b++) {
                    const RowOut o = row_out(ro0, 8 * i + b);
                    const int j0 = 4 * i + b, j1 = j0 + 2;
#pragma unroll
                    for (int q = 0; q < RH; q++) {
                        const float v0 = c_value(acc[q][j0], sc[q][0], p.bias, r.bias[q][0], o.rs);
                        const float v1 = c_value(acc[q][j1], sc[q][1], p.bias, r.bias[q][1], o.rs);
                        store_packed(base[q] + o.off, v0, v1, sel, colok[q] && o.ok);
                    }
                }
        }
    }
#endif

    // Calls f(j0, j1, pid, rs) once per token column 8i + 2t + b of this thread's accumulators
    // (j0 = 4i + b: row n_base, j1 = j0 + 2: row n_base + 8), with the token's pair id and row
    // scale: KS = 1 one 8-byte shared-memory load from the item's queue slot (two shuffles per
    // token made the epilogue a chain of dependent shuffles: ncu put 40 % of the consumers' samples
    // of Qwen3-30B-A3B's GEMM2, K = 768, in the epilogue, most of them waiting on a dependency);
    // KS = 2 from the lane that holds them (every lane shuffles, so f may skip afterwards).
    template <int NA, typename F>
    static __device__ __forceinline__ void for_each_token(const Rows &r, int t, F &&f) {
        [[maybe_unused]] const uint32_t pr0 = kHandOff ? smem_u32(&r.sl->pr[2 * t]) : 0u;
#pragma unroll
        for (int i = 0; i < NA / 4; i++)
#pragma unroll
            for (int b = 0; b < 2; b++) {
                int pid;
                float rs;
                if constexpr (kHandOff) {
                    const uint2 v = lds64(pr0 + 8u * (8 * i + b));
                    pid = (int)v.x;
                    rs = __uint_as_float(v.y);
                } else {
                    const int src = 8 * (i % 4) + 2 * t + b;
                    pid = __shfl_sync(0xffffffffu, r.pid[i / 4], src);
                    rs = __shfl_sync(0xffffffffu, r.rs[i / 4], src);
                }
                f(4 * i + b, 4 * i + 2 + b, pid, rs);
            }
    }

    template <int NA>
    static __device__ void epilogue(const Params &p, float (&acc)[NA], int blk, int nt,
                                    int half, int ci, const Rows &r, int n_base,
                                    const float (&bias)[2], float s2, float s2_up, int splits,
                                    int g, int t, int *s_flag) {
        if (NA == C::NACC && splits > 1) {  // only full-width items run split (item_widths)
            ws_add(p, acc, r, n_base, p.N, t);
            if (!last_split(p, ((size_t)blk * p.n_tiles + nt) * 2 + half, ci, splits, s_flag)) return;
            ws_load(p, acc, r, n_base, p.N, t);
        }
        float sc[2];
        set_scales(p, n_base, s2, s2_up, sc);
        const bool odd = g & 1;
        const int col = odd ? n_base + 7 : n_base;  // even: the pair's first column
        for_each_token<NA>(r, t, [&](int j0, int j1, int pid, float rs) {
            const float v0 = c_value(acc[j0], sc[0], p.bias, bias[0], rs);
            const float v1 = c_value(acc[j1], sc[1], p.bias, bias[1], rs);
            store_pair(p, p.c, p.N, pid, col, odd, v0, v1);
        });
    }

    // GU: GEMM1 with its gated activation. ag holds gate rows n_base, n_base + 8 (of N/2), au the
    // up rows N/2 further on, for the same tokens. Each value is first what the plain epilogue
    // would store (c_value, rounded to the 16-bit type), then act(gate, up) as the activation
    // kernel computes it from those stored values, rounded once more: the fused GEMM1 writes
    // exactly what GEMM1 followed by the activation kernel would (without a K split; with one, the
    // sums' order varies run to run anyway). One split-K election per warpgroup covers both sets
    // (counter (blk, nt, wg), nt < n_tiles / 2).
    template <int NA>
    static __device__ void epilogue_act(const Params &p, float (&ag)[NA], float (&au)[NA],
                                        int blk, int nt, int wg, const Rows &r, float s2,
                                        float s2_up, int splits, int g, int t, int *s_flag) {
        const int nh = p.N / 2;
        const int n_base = r.n_base;
        if (NA == C::NACC && splits > 1) {
            ws_add(p, ag, r, n_base, nh, t);
            ws_add(p, au, r, n_base + nh, p.N, t);
            if (!last_split(p, ((size_t)blk * p.n_tiles + nt) * 2 + wg, wg, splits, s_flag)) return;
            ws_load(p, ag, r, n_base, nh, t);
            ws_load(p, au, r, n_base + nh, p.N, t);
        }
        const float su = p.halves == 1 ? s2_up : s2;
        const bool odd = g & 1;
        const int col = odd ? n_base + 7 : n_base;  // even: the pair's first column
        for_each_token<NA>(r, t, [&](int j0, int j1, int pid, float rs) {
            float v0, v1;
            gated_pair(p, ag, au, j0, j1, r, s2, su, rs, v0, v1);
            store_pair(p, p.act, nh, pid, col, odd, v0, v1);
        });
    }

    static __device__ void run(const Params &p) {
        extern __shared__ uint8_t smem_raw[];
        __shared__ __align__(8) uint64_t bars_mem[2 * C::STAGES];
        __shared__ int s_flag[4];
#if NVFP4MOE_HOPPER_LEAN_EPI
        __shared__ __align__(16) ItemQueue<BM> q;  // ro[] is read 16 bytes at a time
#else
        __shared__ __align__(8) ItemQueue<BM> q;
#endif
        // Swizzle atoms need 1024-byte-aligned shared addresses; the dynamic base is only
        // guaranteed 16 (SMEM has 1024 bytes of slack for this).
        uint8_t *smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
        const uint32_t bars = smem_u32(bars_mem);  // full[0..S), then empty[0..S)
        // Launched with PDL behind the grouping (p.pdl_head): only the launch overlaps it;
        // everything from here on may read what it wrote.
        if (p.pdl_head) nvfp4moe_pdl::wait();
        if (threadIdx.x == 0) {
            for (int s = 0; s < C::STAGES; s++) {
                mbar_init(bars + 8 * s, 128 + 1);           // 128 cp.async arrivals + expect_tx
                mbar_init(bars + 8 * (C::STAGES + s), 256 * C::KS);  // every consumer thread
            }
            for (int s = 0; s < kQueue; s++) {
                mbar_init(smem_u32(&q.full[s]), 128);           // every producer thread
                mbar_init(smem_u32(&q.empty[s]), 256 * C::KS);  // every consumer thread
            }
            // Make the initialized barriers visible to the async proxy (the bulk copies).
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
            // The next GEMM's item counter (args->next_workspace): that GEMM, launched with PDL,
            // claims from it only after its wait for this kernel.
            if (p.next_sched && blockIdx.x == 0) {
                *reinterpret_cast<volatile int32_t *>(p.next_sched) = 0;
                __threadfence();
            }
        }
        __syncthreads();
        // A PDL launch signals its dependents in the producer, after its wait (produce).
        if (!p.pdl) nvfp4moe_pdl::trigger();

        const int nb = *p.num_blocks;
        const int units = nb * p.n_groups;
        const int splits = choose_splits(units, gridDim.x, p.k_tiles, p.max_splits);
        const int items = units * splits;

        if (threadIdx.x < 128) {
            setmaxnreg_dec<ProducerRegs<C::MINB>::value>();
            produce(p, smem, bars, items, splits, q);
        } else {
            setmaxnreg_inc<ConsumerRegs<C::KS, C::MINB>::value>();
            consume(p, smem, bars, items, splits, s_flag, q);
        }
    }
};
#endif  // NVFP4MOE_HOPPER_DEVICE

template <int BM, bool BF16, int NW, int RT, bool GU>
__global__ void __launch_bounds__(Cfg<BM>::THREADS, Cfg<BM>::MINB) hopper_moe_gemm_kernel(const __grid_constant__ Params p) {
#if NVFP4MOE_HOPPER_DEVICE
    Kernel<BM, BF16, NW, RT, GU>::run(p);
#elif defined(__CUDA_ARCH__)
    __trap();  // no sm_90a code in this image: the launcher refuses before getting here
#endif
}

// ---- repack -------------------------------------------------------------------------------

// One thread per (expert, n tile, k tile, 16-row group gw = 4*warpgroup + warp, lane): its two
// 16-byte code vectors and, for lanes < 8 (g = lane), the 16 scale bytes of rows g and g+8.
__global__ void hopper_repack_kernel(const uint8_t *__restrict__ w, const uint8_t *__restrict__ sf,
                                     int E, int N, int K, int n_tiles, int k_tiles, int bf16,
                                     uint8_t *__restrict__ out) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total = (long long)E * n_tiles * k_tiles * 8 * 32;
    if (idx >= total) return;
    const int lane = int(idx % 32);
    const int gw = int((idx / 32) % 8);
    const long long chunk = idx / 256;  // (e * n_tiles + nt) * k_tiles + kt
    const int kt = int(chunk % k_tiles);
    const int nt = int((chunk / k_tiles) % n_tiles);
    const int e = int(chunk / ((long long)k_tiles * n_tiles));
    const int g = lane / 4, t = lane % 4;
    const int KB = K / 2, KG = K / 16;
    const int row0 = nt * kTN + gw * 16;
    const uint8_t *we = w + (size_t)e * N * KB;
    const uint8_t *se = sf + (size_t)e * N * KG;
    uint8_t *dst = out + chunk * kWChunk;

    uint32_t words[8];
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const int kg = kt * 8 + s;
        uint8_t lo[4], hi[4];  // pair j's codes at the lower and the higher k
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int row = row0 + g + 8 * (j & 1);
            const int kb = kg * 8 + t + 4 * (j >> 1);  // byte of k = 16*kg + 2t + 8*(j>>1)
            uint32_t byte = 0;
            if (row < N && kg < KG) {
                byte = we[(size_t)row * KB + kb];
                const uint32_t sc = se[(size_t)row * KG + kg];
                if ((sc & 0x7F) == 0) byte = 0;        // zero scale: exact zeros
                else if (sc & 0x80) byte ^= 0x88;      // negative scale: flip both codes' signs
            }
            lo[j] = uint8_t(byte & 0xF);
            hi[j] = uint8_t(byte >> 4);
        }
        words[s] = nvfp4moe_hbits_pack(!bf16, lo, hi);
    }
    uint4 *cw = reinterpret_cast<uint4 *>(dst + gw * 1024);
    cw[lane] = make_uint4(words[0], words[1], words[2], words[3]);
    cw[32 + lane] = make_uint4(words[4], words[5], words[6], words[7]);

    if (lane < 8) {
        uint32_t sw[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t v = 0;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int s = (4 * i + b) / 2, h = b % 2;
                const int row = row0 + lane + 8 * h;
                const int kg = kt * 8 + s;
                uint32_t code = kScaleDontCare;
                if (row < N && kg < KG) {
                    const uint32_t mag = se[(size_t)row * KG + kg] & 0x7F;
                    if (mag) code = scale_code(mag);
                }
                v |= code << (8 * b);
            }
            sw[i] = v;
        }
        reinterpret_cast<uint4 *>(dst + kCodeBytes + gw * 128)[lane] =
            make_uint4(sw[0], sw[1], sw[2], sw[3]);
    }
}


// Whether K may be split: a workspace of at most kMaxSplitWsBytes, two splits' worth of k tiles,
// and fewer than 4 waves of units even at the fewest blocks P pairs can fill (a block holds
// block_m pairs at most): from there the last wave costs a fifth at most, so K is not split
// and the workspace is neither needed nor cleared.
bool split_allowed(int P, int N, int K, int block_m, int sm_count) {
    const long long min_units = ((long long)P + block_m - 1) / block_m * n_tiles_of(N);
    const int sms = sm_count > 0 ? sm_count : 1;
    return (size_t)P * N * 4 <= kMaxSplitWsBytes && k_tiles_of(K) >= 2 * kMinTilesPerSplit &&
           min_units < 4LL * sms;
}
size_t counters_count(int N, int max_blocks) { return (size_t)max_blocks * n_tiles_of(N) * 2; }

// Whether choose_splits, on a grid of `grid` CTAs, splits K for any unit count this launch can
// reach: ceil(P / block_m) blocks at least, max_blocks at most, n_groups units each. Where it
// cannot, the launch clears no partial sums: split_allowed alone cleared P x N fp32 on every
// launch that K never split (6.3 MB at Qwen3-30B-A3B's GEMM1 at M = 128, 8.4 MB at
// Qwen3-235B-A22B's GEMM2 at M = 64). Only unit counts below grid * (k_tiles + kItemTiles) / (kItemTiles + 2 *
// kSplitTiles) can split: above, even the fullest waves of s >= 2 splits cost more than one pass
// with a last wave of one more item. Where pairs are dropped (ids outside [0, E)), fewer blocks
// than ceil(P / block_m) may run, and they run unsplit, as split_allowed's bound from P already
// has it.
bool may_split(int P, int n_groups, int max_blocks, int block_m, int grid, int k_tiles) {
    const long long lo = ((long long)P + block_m - 1) / block_m * n_groups;
    long long hi = (long long)max_blocks * n_groups;
    const long long most = (long long)grid * (k_tiles + kItemTiles) / (kItemTiles + 2 * kSplitTiles) + 1;
    if (hi > most) hi = most;
    for (long long u = lo; u <= hi; u++)
        if (choose_splits((int)u, grid, k_tiles, kMaxSplits) > 1) return true;
    return false;
}

// The persistent grid, from upper bounds only (graph capture): minb CTAs per SM, fewer when even
// the largest possible item count (max_blocks x n_groups x max_splits) is smaller.
int persistent_grid(const nvfp4moe_hopper_args *args, int minb, int n_groups, int max_splits) {
    const long long most = (long long)args->max_blocks * n_groups * max_splits;
    const int grid = args->sm_count > 0 ? args->sm_count * minb : 1;
    return most < grid ? (int)most : grid;
}

// The image of the kernel must be sm_90a code and the device compute capability 9.0.
template <int BM, bool BF16, int NW, int RT, bool GU>
cudaError_t prepare() {
    static int state = 0;  // 0 unknown, 1 ready, 2 no image
    if (state == 1) return cudaSuccess;
    if (state == 2) return cudaErrorNoKernelImageForDevice;
    int dev = 0, major = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (err != cudaSuccess) return err;
    auto *fn = hopper_moe_gemm_kernel<BM, BF16, NW, RT, GU>;
    cudaFuncAttributes attr;
    if (major != 9) {
        state = 2;
        return cudaErrorNoKernelImageForDevice;
    }
    err = cudaFuncGetAttributes(&attr, fn);
    if (err != cudaSuccess) return err;
    if (attr.binaryVersion != 90) {
        state = 2;
        return cudaErrorNoKernelImageForDevice;
    }
    // setmaxnreg only moves registers inside the launch allocation: an image compiled to fewer
    // registers per thread than the producer and the consumers take together would block in
    // setmaxnreg.inc forever, so refuse it rather than launch it.
    using C = Cfg<BM, RT>;
    const long long need = 128LL * ProducerRegs<C::MINB>::value +
                           (long long)(C::THREADS - 128) * ConsumerRegs<C::KS, C::MINB>::value;
    if ((long long)attr.numRegs * C::THREADS < need) return cudaErrorLaunchOutOfResources;
    err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg<BM, RT>::SMEM);
    if (err != cudaSuccess) return err;
    state = 1;
    return cudaSuccess;
}

template <int BM, bool BF16, int NW, int RT, bool GU>
cudaError_t launch(const nvfp4moe_hopper_args *args, cudaStream_t stream) {
    cudaError_t err = prepare<BM, BF16, NW, RT, GU>();
    if (err != cudaSuccess) return err;
    Params p;
    p.a = static_cast<const uint16_t *>(args->a);
    p.b = static_cast<const uint8_t *>(args->b);
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
    p.n_tiles = n_tiles_of(args->N);
    p.k_tiles = k_tiles_of(args->K);
    p.n_groups = GU ? p.n_tiles / 2 : (p.n_tiles + RT - 1) / RT;
    p.act = GU ? static_cast<uint16_t *>(args->act_out) : nullptr;
    p.ap = GU ? *args->act : nvfp4moe_gpu_act_params{};
    // Workspace: [the item counter, kSchedBytes][split-K partial sums P x N fp32][split-K
    // arrival counters], cleared together; none: items dealt round robin, K never split.
    p.sched = nullptr;
    p.ws = nullptr;
    p.counters = nullptr;
    p.max_splits = 1;
    p.next_sched = static_cast<int32_t *>(args->next_workspace);
    p.pdl = 0;
    p.pdl_head = 0;
    if (args->workspace) {
        size_t clear = 0;
        // Claimed items at block_m 32, 64 and 128 (H100, GEMMs alone: 3-11 % faster at M = 1024
        // and 4096); block_m 8 and 16 keep round robin (Kernel::kHandOff).
        if (NVFP4MOE_HOPPER_DYNAMIC && Cfg<BM, RT>::KS == 1) {
            p.sched = static_cast<int32_t *>(args->workspace);
            clear = kSchedBytes;
        }
        // the grid launched with max_splits = kMaxSplits, which choose_splits would see
        const int split_grid = persistent_grid(args, Cfg<BM, RT>::MINB, p.n_groups, kMaxSplits);
        if (split_allowed(args->P, args->N, args->K, BM, args->sm_count) && split_grid > 0 &&
            may_split(args->P, p.n_groups, args->max_blocks, BM, split_grid, p.k_tiles)) {
            p.ws = reinterpret_cast<float *>(static_cast<uint8_t *>(args->workspace) + kSchedBytes);
            p.counters = reinterpret_cast<int32_t *>(p.ws + (size_t)args->P * args->N);
            p.max_splits = kMaxSplits;
            clear = kSchedBytes + (size_t)args->P * args->N * 4 +
                    counters_count(args->N, args->max_blocks) * sizeof(int32_t);
        }
        // PDL behind the GEMM that zeroed our item counter (args->pdl); a split-K area to clear
        // makes it a plain launch (the clear sits between the kernels).
        p.pdl = args->pdl && clear == kSchedBytes;
        // PDL behind the grouping that zeroed our item counter (args->pdl_head), or behind it with
        // no counter at all (items dealt round robin); a split-K area to clear: a plain launch.
        p.pdl_head = !p.pdl && args->pdl_head && clear <= kSchedBytes;
        if (clear && !p.pdl && !p.pdl_head) {
            err = cudaMemsetAsync(args->workspace, 0, clear, stream);
            if (err != cudaSuccess) return err;
        }
    }
    const int grid = persistent_grid(args, Cfg<BM, RT>::MINB, p.n_groups, p.max_splits);
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = nvfp4moe_pdl::config(dim3((unsigned)grid), dim3(Cfg<BM, RT>::THREADS),
                                                        Cfg<BM, RT>::SMEM, stream, p.pdl || p.pdl_head, &attr);
    return cudaLaunchKernelEx(&cfg, hopper_moe_gemm_kernel<BM, BF16, NW, RT, GU>, p);
}

// Weight tiles per work item (Kernel's RT): two (256 weight rows against one activation stage)
// at block_m 32, 64 and 128 unless args->row_tiles forces one; always one where KS = 2. At block_m
// 128 two weight tiles went with one m64n128 token tile when each item ran one width.
// H100, the GEMMs alone at M = 1024 (block_m 64): two tiles 7-9 % faster on DeepSeek-V3,
// Qwen3-30B-A3B and gpt-oss-120b. At M = 4096 (block_m 128) two tiles with two m64n64 token
// tiles were 4-22 % slower than one weight tile (the instance spills), with one m64n128 token
// tile 6-16 % faster (DeepSeek-V3 -9 %, Qwen3-30B-A3B -11 %, Mixtral-8x7B -16 %, gpt-oss-120b
// -6 %; bench/results/2026-12-06-h100-row-tiles.md).
template <int BM>
int row_tiles_of(const nvfp4moe_hopper_args *args) {
    if (KSplit<BM>::value != 1) return 1;
    return args->row_tiles ? args->row_tiles : 2;
}

// The token tile widths of a launch at block_m BM (Kernel::NW): one, block_m, when
// args->token_subtiles is 1; else (0, 2) TokenWidths, each item on the narrowest that holds its
// block's pairs.
template <int BM>
int token_widths_of(const nvfp4moe_hopper_args *args) {
    return args->token_subtiles == 1 ? 1 : TokenWidths<BM>::value;
}

// Whether a launch applies the activation itself (GU: gate tile t and up tile t + n_tiles/2 in one
// item, each warpgroup holding a gate row and its up row for the same tokens): asked for
// (act_out and act set), two weight tiles per item, SiLU-and-mul (with or without its limit) on
// stacked halves (gate rows [0, N/2), up rows [N/2, N)) and N/2 a whole number of 128-row tiles.
// SiLU alone: the epilogue inlines the activation once per output pair (32 times at block_m 64),
// and with act_gated's every case inlined there the kernel's code grew from 6.7 K to 14.9 K
// instructions and GEMM1 ran ~35 % slower (H100, Qwen3-30B-A3B M = 1024); the other gated
// activations keep the activation kernel.
bool fuses_act(const nvfp4moe_hopper_args *args, int row_tiles) {
    if (!args->act_out || !args->act || row_tiles != 2 || args->scale_2_halves == 2) return false;
    return args->act->activation == NVFP4MOE_ACT_SILU && args->N % (2 * kTN) == 0;
}

template <int BM, bool BF16, int NW>
cudaError_t launch_rows(const nvfp4moe_hopper_args *args, cudaStream_t stream) {
    if constexpr (KSplit<BM>::value == 1) {
        if (row_tiles_of<BM>(args) == 2) {
            if (fuses_act(args, 2)) return launch<BM, BF16, NW, 2, true>(args, stream);
            return launch<BM, BF16, NW, 2, false>(args, stream);
        }
    }
    return launch<BM, BF16, NW, 1, false>(args, stream);
}

template <int BM, bool BF16>
cudaError_t launch_widths(const nvfp4moe_hopper_args *args, cudaStream_t stream) {
    constexpr int nw = TokenWidths<BM>::value;
    if constexpr (nw != 1) {
        if (token_widths_of<BM>(args) == 1) return launch_rows<BM, BF16, 1>(args, stream);
    }
    return launch_rows<BM, BF16, nw>(args, stream);
}

template <int BM>
cudaError_t launch_dtype(const nvfp4moe_hopper_args *args, cudaStream_t stream) {
    return args->is_bf16 ? launch_widths<BM, true>(args, stream)
                         : launch_widths<BM, false>(args, stream);
}

}  // namespace

extern "C" size_t nvfp4moe_hopper_packed_bytes(int32_t E, int32_t N, int32_t K) {
    if (E <= 0 || N <= 0 || K <= 0) return 0;
    return (size_t)E * n_tiles_of(N) * k_tiles_of(K) * kWChunk;
}

extern "C" cudaError_t nvfp4moe_hopper_repack(const uint8_t *w, const uint8_t *sf, int32_t E,
                                              int32_t N, int32_t K, int32_t is_bf16, void *out,
                                              cudaStream_t stream) {
    if (!w || !sf || !out || E <= 0 || N <= 0 || K <= 0 || N % 16 || K % 16)
        return cudaErrorInvalidValue;
    const int nt = n_tiles_of(N), kt = k_tiles_of(K);
    const long long threads = (long long)E * nt * kt * 256;
    const int block = 256;
    const long long grid = (threads + block - 1) / block;
    if (grid > 0x7FFFFFFFLL) return cudaErrorInvalidValue;
    hopper_repack_kernel<<<(unsigned)grid, block, 0, stream>>>(w, sf, E, N, K, nt, kt, is_bf16 != 0,
                                                               static_cast<uint8_t *>(out));
    return cudaGetLastError();
}

extern "C" size_t nvfp4moe_hopper_workspace_bytes(int32_t P, int32_t N, int32_t K,
                                                  int32_t max_blocks, int32_t block_m,
                                                  int32_t sm_count) {
    if (P <= 0 || N <= 0 || K <= 0 || max_blocks <= 0 || block_m <= 0) return 0;
    if (!split_allowed(P, N, K, block_m, sm_count)) return kSchedBytes;
    return kSchedBytes + (size_t)P * N * 4 + counters_count(N, max_blocks) * sizeof(int32_t);
}

extern "C" cudaError_t nvfp4moe_hopper_gemm(const nvfp4moe_hopper_args *args,
                                            cudaStream_t stream) {
    if (!args || !args->a || !args->b || !args->scale_2 || !args->c || !args->sorted_ids ||
        !args->block_expert || !args->num_blocks)
        return cudaErrorInvalidValue;
    if (args->N <= 0 || args->K <= 0 || args->N % 16 || args->K % 16 || args->E <= 0 ||
        args->a_row_div < 1 || args->max_blocks < 0 || args->P < 0 || args->scale_2_halves < 0 ||
        args->scale_2_halves > 2 || args->token_subtiles < 0 || args->token_subtiles > 2 ||
        args->row_tiles < 0 || args->row_tiles > 2)
        return cudaErrorInvalidValue;
    // The producer addresses activation rows by 32-bit offsets in 16-byte units (32 GiB of
    // activations at most: far beyond one GPU's batch).
    const long long a_rows = ((long long)args->P + args->a_row_div - 1) / args->a_row_div;
    if (a_rows * (args->K / 8) > 0xFFFFFFFFLL) return cudaErrorInvalidValue;
    if ((uintptr_t)args->c % 4 || (uintptr_t)args->act_out % 4)
        return cudaErrorInvalidValue;  // the epilogue stores 2 values
    if (args->P == 0 || args->max_blocks == 0) return cudaSuccess;  // nothing to compute
    switch (args->block_m) {
    case 8: return launch_dtype<8>(args, stream);
    case 16: return launch_dtype<16>(args, stream);
    case 32: return launch_dtype<32>(args, stream);
    case 64: return launch_dtype<64>(args, stream);
    case 128: return launch_dtype<128>(args, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" int32_t nvfp4moe_hopper_token_subtiles(const nvfp4moe_hopper_args *args) {
    if (!args || args->token_subtiles < 0 || args->token_subtiles > 2 || args->row_tiles < 0 ||
        args->row_tiles > 2)
        return 0;  // refused by the GEMM
    switch (args->block_m) {
    case 8: return token_widths_of<8>(args);
    case 16: return token_widths_of<16>(args);
    case 32: return token_widths_of<32>(args);
    case 64: return token_widths_of<64>(args);
    case 128: return token_widths_of<128>(args);
    default: return 0;
    }
}

extern "C" int32_t nvfp4moe_hopper_fuses_activation(const nvfp4moe_hopper_args *args) {
    const int32_t rt = nvfp4moe_hopper_row_tiles(args);
    return rt && fuses_act(args, rt) ? 1 : 0;
}

extern "C" int32_t nvfp4moe_hopper_row_tiles(const nvfp4moe_hopper_args *args) {
    if (!args || args->row_tiles < 0 || args->row_tiles > 2) return 0;  // refused by the GEMM
    switch (args->block_m) {
    case 8: return row_tiles_of<8>(args);
    case 16: return row_tiles_of<16>(args);
    case 32: return row_tiles_of<32>(args);
    case 64: return row_tiles_of<64>(args);
    case 128: return row_tiles_of<128>(args);
    default: return 0;
    }
}

extern "C" int32_t nvfp4moe_hopper_block_m(int64_t P, int32_t E, int32_t I) {
    // Measured on an H100, the GEMMs alone at block_m 8 / 16 / 32 / 64 / 128 on six layers
    // (bench/results/2026-12-06-h100-block-m.md, 2026-12-06-h100-one-launch.md). Since a block runs
    // the narrowest token tile that holds its pairs and CTAs claim their items, block_m 64 is the
    // fastest from about 4 pairs per expert up to 64 (DeepSeek-V3 at 8 per expert: 2215 us against
    // 2360 at 16; Qwen3-30B-A3B at 16: 173 against 195 at 32; gpt-oss-120b at 16: 687 against 818
    // at 32; at 64: DeepSeek-V3 4165 against 4494 at 128, Kimi-K2 6380 against 6800), and 128 from
    // 85 (Kimi-K2 M = 4096: 6744 against 8335 at 64; at 96 DeepSeek-V3 4840 against 5840, gpt-oss
    // 1327 against 1613): past 64 most experts need a second block of 64 and its weight pass.
    // Nothing was measured between 64 and 85; the switch sits where the ratios interpolate to
    // even, at 1.1 x 64. Not with fewer than 32 experts below 16 pairs each: Mixtral-8x7B at 5 and
    // 8 per expert ran 299 and 314 us at block_m 8 and 16 against 377 and 380 at 64. Up to 3
    // pairs per expert the decode regime runs (a GEMM forced there keeps the small block_m); from
    // there on this GEMM (nvfp4moe_hopper_decode_block_m). Block_m 32 on two CTAs per SM (CtasPerSm)
    // from there up to 24 pairs per expert where the intermediate size I (GEMM2's K) is at most
    // 1536 with 32 experts or more: Qwen3-30B-A3B (I 768) and Qwen3-235B-A22B (I 1536) ran the
    // layer 1.1-12 % faster at 4, 8 and 16 pairs per expert, I = 2048 and 2880 -0.2 to +0.9 %, and
    // at 32 pairs per expert the GEMMs alone 8-17 % slower (a second block for most experts).
    // Nothing was measured between 16 and 32: at 24 about 4 % of the experts need a second block
    // of 32 under uniform routing (bench/results/2026-12-07-h100-narrow-ctas.md). With fewer than
    // 32 experts, block_m 32 on two CTAs from 4.5 up to 24 pairs per expert whatever I: there a
    // few experts hold many more pairs than the average, and a block_m of 8 or 16 sized to the
    // average gives them a second block and a second pass over their weights. Mixtral-8x7B (I
    // 14336), the whole layer against block_m 8 / 16 / 16 / 64 at 6 / 8 / 12 / 16 pairs per
    // expert: -11.8 / -1.3 / -16.8 / -2.5 %; at 4 block_m 8 stays 3 % faster
    // (bench/results/2026-12-07-h100-few-experts.md).
    if (E <= 0) return 128;
    const double per_expert = (double)P / E;
    if (per_expert >= 1.1 * 64) return 128;
    if (CtasPerSm<32>::value == 2 && per_expert > NVFP4MOE_DECODE_MAX_PAIRS_PER_EXPERT && per_expert <= 24.0 &&
        ((E >= 32 && I > 0 && I <= 1536) || (E < 32 && per_expert > 4.5)))
        return 32;
    if (per_expert > NVFP4MOE_DECODE_MAX_PAIRS_PER_EXPERT && (E >= 32 || per_expert >= 16.0)) return 64;
    static const int32_t kSmall[] = {8, 16, 32};
    for (int i = 0; i < 3; i++)
        if (per_expert / kSmall[i] < 0.9) return kSmall[i];
    return 64;
}
