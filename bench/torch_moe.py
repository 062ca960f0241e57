#!/usr/bin/env python3
"""torch_moe.py - a whole bf16 MoE layer in plain PyTorch on one GPU, timed the way `nvfp4moe bench`
times ours, so that the two sets of figures compare point for point.

What it runs (the layer a user without an NVFP4 kernel runs):
    weights   random NVFP4 (E2M1 codes, E4M3 scale per 16 weights in [2^-3, 448], an fp32 global
              scale per expert of 1 / (125 sqrt(K)), as `nvfp4moe bench` draws them), dequantized
              to bf16 once, outside the timing; stored [E, N, K] and handed to the GEMMs transposed
              ([E, K, N] with K contiguous)
    forward   router logits [M, E] (bf16) -> top-k -> softmax over the k chosen ("renormalize"),
              fp32 weights -> sort the M*k pairs by expert -> per-expert end offsets -> gather rows
              -> GEMM1 torch._grouped_mm -> SiLU-and-mul (swigluoai with its clamp for gpt-oss) ->
              GEMM2 torch._grouped_mm -> times the router weight (fp32) -> index_add_ into an fp32
              [M, H] sum -> bf16 output
Every step of the forward is inside the timed region, as for our backends (routing from logits to
the combined output).

Timing: the forward captured in one CUDA graph (the routing sizes are static); if capture fails the
forward is timed eagerly and the output says so ("eager" in the timing column, the reason logged).
Before each run a 512 MB memset evicts the L2 (outside the events); 3 warm-ups, then the median of
--iters runs between two CUDA events. The same process measures its ceilings: the copy bandwidth
(2 GiB device-to-device copy, bytes read + written) and the bf16 8192^3 matmul rate, and derives
the floor the way `nvfp4moe bench` does: max(touched experts' NVFP4 bytes / copy bandwidth,
FLOPs / bf16 rate). The floor of the bf16 bytes this layer really streams is reported next to it.
(`nvfp4moe bench` takes the best of several copy variants, this script torch's copy_ alone: its
bandwidth can come out a little lower and its floors a little higher.)

Correctness guard: at the smallest M of each preset the graph's output is compared to a per-expert
loop in float32 on the same bf16 weights (relative L2 error; above 2e-2 the run fails).

Exit status: 0 ok; 1 a point raised (recorded in the JSON, the others still run); 2 no PyTorch, no
GPU, or a bad command line; 3 torch._grouped_mm missing or unusable on this GPU; 4 the correctness
guard failed (the timings are still printed).

Examples (on the GPU machine):
    python3 bench/torch_moe.py --preset deepseek-v3,qwen3-30b-a3b --json out/torch.json
    python3 bench/torch_moe.py --preset gpt-oss-120b --ms 1,1024 --iters 50
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

# The layer shapes of `nvfp4moe bench` (tools/cmd_bench.c, k_presets): name -> (E, H, I, top_k,
# activation, swiglu_limit or None).
PRESETS = {
    "deepseek-v3": (256, 7168, 2048, 8, "silu", None),
    "qwen3-30b-a3b": (128, 2048, 768, 8, "silu", None),
    "qwen3-235b-a22b": (128, 4096, 1536, 8, "silu", None),
    "mixtral-8x7b": (8, 4096, 14336, 2, "silu", None),
    "gpt-oss-120b": (128, 2880, 2880, 4, "swigluoai", 7.0),
    "kimi-k2": (384, 7168, 2048, 8, "silu", None),
}
DEFAULT_MS = (1, 16, 64, 256, 1024, 4096)
# swigluoai as vLLM and our kernels compute it (kernels/activation.cuh): gate g and up u interleaved
# (g0, u0, g1, u1, ...), g clamped from above only, u on both sides, (u + 1) * g * sigmoid(1.702 g).
SWIGLU_ALPHA = 1.702
SWIGLU_BETA = 1.0
FLUSH_BYTES = 512 << 20  # larger than the H200's L2 many times over
COPY_BYTES = 2 << 30  # the ceilings' sizes, those of `nvfp4moe bench`
MATMUL_N = 8192
WARMUP = 3
REL_TOL = 2e-2
NVFP4_BYTES_PER_WEIGHT = 0.5 + 1.0 / 16  # 4-bit code + one E4M3 scale per 16 weights
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# elements per weight-generation chunk: bounds the int64 / fp32 temporaries at about 2 GB
GEN_CHUNK_ELEMS = 1 << 26


def log(msg=""):
    print(msg, flush=True)


def die(code, msg):
    print(f"torch_moe: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="all",
                    help="comma list of presets, or all (default): " + ", ".join(PRESETS))
    ap.add_argument("--ms", default=",".join(map(str, DEFAULT_MS)),
                    help="comma list of token counts M (default %(default)s)")
    ap.add_argument("--iters", type=int, default=20, help="timed runs per point, median reported (default 20)")
    ap.add_argument("--json", default="", metavar="PATH",
                    help="write the records (a JSON list) here; rewritten after every point")
    ap.add_argument("--seed", type=int, default=1234, help="seed of the weights, activations and logits")
    a = ap.parse_args(argv)
    names = list(PRESETS) if a.preset.strip() == "all" else [p.strip() for p in a.preset.split(",") if p.strip()]
    bad = [p for p in names if p not in PRESETS]
    if bad or not names:
        ap.error(f"unknown preset(s) {', '.join(bad) or '(none given)'}; known: {', '.join(PRESETS)}")
    try:
        ms = [int(v) for v in a.ms.split(",") if v.strip()]
    except ValueError:
        ap.error(f"--ms {a.ms!r}: expected a comma list of integers")
    if not ms or min(ms) < 1:
        ap.error("--ms: token counts must be >= 1")
    if a.iters < 1:
        ap.error("--iters must be >= 1")
    a.presets, a.ms = names, ms
    return a


# ----------------------------------------------------------------------------------------------------
# environment
# ----------------------------------------------------------------------------------------------------
def import_torch():
    """torch with a usable GPU and torch._grouped_mm, or exit 2 / 3 with the reason."""
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means: not this python
        die(2, f"cannot import torch ({type(e).__name__}: {e}); run with the python3 that has PyTorch")
    if not torch.cuda.is_available():
        die(2, f"torch {torch.__version__}: torch.cuda.is_available() is False, no GPU visible")
    if not hasattr(torch, "_grouped_mm"):
        die(3, f"torch {torch.__version__} has no torch._grouped_mm (it first shipped in PyTorch 2.8)")
    cc = torch.cuda.get_device_capability()
    # a small 2D x 3D product with an empty group, the layout the layer uses: it must run and be
    # right here before any big allocation
    try:
        g = torch.Generator(device="cuda")
        g.manual_seed(0)
        a = torch.randn(24, 64, device="cuda", generator=g).to(torch.bfloat16)
        w = torch.randn(3, 32, 64, device="cuda", generator=g).to(torch.bfloat16)  # [G, N, K]
        offs = torch.tensor([8, 8, 24], dtype=torch.int32, device="cuda")
        y = torch._grouped_mm(a, w.transpose(1, 2), offs=offs).float()
        ref = torch.cat([a[0:8].float() @ w[0].float().t(), a[8:24].float() @ w[2].float().t()])
        err = ((y - ref).norm() / ref.norm()).item()
        if not (tuple(y.shape) == (24, 32) and err < 1e-2):
            raise RuntimeError(f"wrong result (shape {tuple(y.shape)}, rel err {err:.2e})")
    except Exception as e:  # noqa: BLE001
        die(3, f"torch {torch.__version__}: torch._grouped_mm (bf16, 2D x 3D with offs) fails on this GPU "
               f"(sm_{cc[0]}{cc[1]}): {type(e).__name__}: {e}")
    if cc[0] < 9:
        log(f"WARNING: sm_{cc[0]}{cc[1]}: torch._grouped_mm takes its per-group fallback below sm_90 (a "
            "device-to-host copy of the offsets): not graph-capturable, timed eagerly")
    return torch, F


# ----------------------------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------------------------
def capture(torch, fn):
    """fn captured in a CUDA graph after two eager runs on a side stream (the warm-up that
    torch.cuda.graph asks for: lazy initialisation, cuBLAS / CUTLASS setup). Returns
    (graph, fn's outputs in the graph's memory, None) or (None, None, why capture failed)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            outs = fn()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - any refusal means: time it eagerly instead
        # a capture that fails inside torch.cuda.graph may leave its side stream current: go back
        # to the default stream, where the eager timing and its events run
        torch.cuda.set_stream(torch.cuda.default_stream())
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            pass
        return None, None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return g, outs, None


def time_runs(torch, run, flush, iters):
    """Median / min / max microseconds of run(), each run preceded (outside the events) by a
    memset of flush that evicts the L2; WARMUP runs first, not counted. One run at a time, as
    `nvfp4moe bench` does (it waits for each run before the next memset)."""
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    us = []
    for i in range(WARMUP + iters):
        flush.zero_()
        t0.record()
        run()
        t1.record()
        t1.synchronize()
        if i >= WARMUP:
            us.append(t0.elapsed_time(t1) * 1e3)
    return dict(us=statistics.median(us), min_us=min(us), max_us=max(us), n=len(us))


def time_op(torch, fn, flush, iters):
    """fn timed as a graph replay when it captures, else eagerly: (times, 'graph'|'eager', reason)."""
    g, _, why = capture(torch, fn)
    if g is not None:
        t = time_runs(torch, g.replay, flush, iters)
        del g
        return t, "graph", None
    return time_runs(torch, fn, flush, iters), "eager", why


def measure_ceilings(torch, flush, iters):
    """Copy bandwidth (B/s, read + write of a 2 GiB device-to-device copy) and bf16 matmul rate
    (FLOP/s, 8192^3), measured like `nvfp4moe bench` measures its own."""
    n = COPY_BYTES
    src = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(0x5A)
    dst = torch.empty_like(src)
    tc, _, _ = time_op(torch, lambda: dst.copy_(src), flush, iters)
    bw = 2.0 * n / (tc["us"] * 1e-6)
    del src, dst
    m = MATMUL_N
    g = torch.Generator(device="cuda")
    g.manual_seed(2)
    a = (torch.rand(m, m, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    b = (torch.rand(m, m, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    c = torch.empty(m, m, dtype=torch.bfloat16, device="cuda")
    tm, _, _ = time_op(torch, lambda: torch.mm(a, b, out=c), flush, iters)
    flops = 2.0 * m ** 3 / (tm["us"] * 1e-6)
    del a, b, c
    torch.cuda.empty_cache()
    return bw, flops


# ----------------------------------------------------------------------------------------------------
# weights
# ----------------------------------------------------------------------------------------------------
def random_nvfp4_as_bf16(torch, E, N, K, gen):
    """[E, N, K] bf16: the dequantization of random NVFP4 weights made on the GPU, a few experts at
    a time. Codes: uniform bytes, two E2M1 codes each (low nibble = even k, the NVFP4 packing);
    block scales: E4M3 with exponent field 4..15 and any mantissa but the NaN code 0x7F, i.e.
    [2^-3, 448]; global scale 1 / (125 sqrt(K)) per expert, so that the weights are roughly
    1/sqrt(fan-in) (codes ~2.5, scales ~50 on average). Dequantized as our kernels do: the
    block scale times the global scale in fp32, times the code, rounded to bf16 once."""
    dev = "cuda"
    lut = torch.tensor(E2M1, dtype=torch.float32, device=dev)
    gscale = torch.full((E,), 1.0 / (125.0 * math.sqrt(K)), dtype=torch.float32, device=dev)
    out = torch.empty((E, N, K), dtype=torch.bfloat16, device=dev)
    per = max(1, GEN_CHUNK_ELEMS // (N * K))
    for e0 in range(0, E, per):
        n = min(per, E - e0)
        codes = torch.randint(0, 256, (n, N, K // 2), dtype=torch.uint8, device=dev, generator=gen)
        idx = torch.stack((codes & 15, codes >> 4), dim=-1).view(n, N, K // 16, 16).long()
        del codes
        vals = lut[idx]
        del idx
        ex = torch.randint(4, 16, (n, N, K // 16), dtype=torch.int32, device=dev, generator=gen)
        man = torch.randint(0, 8, (n, N, K // 16), dtype=torch.int32, device=dev, generator=gen)
        man.masked_fill_((ex == 15) & (man == 7), 6)  # 0x7F is E4M3's NaN
        sf = torch.exp2((ex - 7).float()) * (1.0 + man.float() / 8.0)  # E4M3 normal numbers, bias 7
        del ex, man
        s = sf * gscale[e0:e0 + n].view(n, 1, 1)
        del sf
        out[e0:e0 + n] = (vals * s.unsqueeze(-1)).view(n, N, K).to(torch.bfloat16)
        del vals, s
    return out


# ----------------------------------------------------------------------------------------------------
# the layer
# ----------------------------------------------------------------------------------------------------
def activation(torch, F, h, act, I, limit):
    """GEMM1's output [P, 2I] -> [P, I], in bf16 as plain PyTorch computes it."""
    if act == "swigluoai":
        g, u = h[:, 0::2], h[:, 1::2]  # interleaved gate / up
        if limit is not None:
            g = g.clamp(max=limit)
            u = u.clamp(min=-limit, max=limit)
        a = (u + SWIGLU_BETA) * (g * torch.sigmoid(g * SWIGLU_ALPHA))
    else:
        a = F.silu(h[:, :I]) * h[:, I:]  # gate half, then up half
    # the ops above write fresh row-major tensors; _grouped_mm needs a 16-byte-aligned row stride
    return a.contiguous()


def make_forward(torch, F, x, logits, w13t, w2t, k, act, I, limit):
    """The layer from logits to the combined output, as a closure over static inputs (what the
    graph captures). Returns (out [M, H] bf16, top-k ids [M, k])."""
    M, H = x.shape
    E = logits.shape[1]
    # the experts' ids, made once outside the forward: searchsorted over the sorted pair ids
    # yields every expert's end offset in one kernel, no host sync (bincount would sync)
    experts = torch.arange(E, dtype=torch.int64, device=x.device)

    def forward():
        top_v, top_i = torch.topk(logits, k, dim=-1)
        w = torch.softmax(top_v.float(), dim=-1)  # renormalize: softmax over the k chosen, fp32
        sorted_ids, order = torch.sort(top_i.reshape(-1), stable=True)  # pairs grouped by expert
        offs = torch.searchsorted(sorted_ids, experts, right=True, out_int32=True)  # cumulative ends
        tok = torch.div(order, k, rounding_mode="floor")  # the token of each sorted pair
        xs = x.index_select(0, tok)
        h = torch._grouped_mm(xs, w13t, offs=offs)  # [P, N1]
        a = activation(torch, F, h, act, I, limit)
        y = torch._grouped_mm(a, w2t, offs=offs)  # [P, H]
        # bf16 * fp32 promotes to fp32: the router weight applied and the sum kept in fp32
        contrib = y * w.reshape(-1).index_select(0, order).unsqueeze(1)
        acc = torch.zeros((M, H), dtype=torch.float32, device=x.device)
        acc.index_add_(0, tok, contrib)
        return acc.to(torch.bfloat16), top_i

    return forward


def reference(torch, F, x, logits, w13, w2, k, act, I, limit):
    """The layer in float32, expert by expert, on the same bf16 weights (float32 matmuls, no TF32)."""
    M, H = x.shape
    top_v, top_i = torch.topk(logits, k, dim=-1)
    w = torch.softmax(top_v.float(), dim=-1)
    xf = x.float()
    out = torch.zeros((M, H), dtype=torch.float32, device=x.device)
    for e in torch.unique(top_i).tolist():
        rows, slots = (top_i == e).nonzero(as_tuple=True)
        h = xf.index_select(0, rows) @ w13[e].float().t()
        if act == "swigluoai":
            g, u = h[:, 0::2], h[:, 1::2]
            if limit is not None:
                g = g.clamp(max=limit)
                u = u.clamp(min=-limit, max=limit)
            a = (u + SWIGLU_BETA) * g * torch.sigmoid(SWIGLU_ALPHA * g)
        else:
            a = F.silu(h[:, :I]) * h[:, I:]
        y = a @ w2[e].float().t()
        out.index_add_(0, rows, y * w[rows, slots].unsqueeze(1))
    return out, top_i


# ----------------------------------------------------------------------------------------------------
# output
# ----------------------------------------------------------------------------------------------------
def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def markdown(records, meta):
    lines = [f"## torch bf16 MoE layer (`torch._grouped_mm`, NVFP4 weights dequantized to bf16), {meta['device']}",
             "",
             f"- torch {meta['torch']} (CUDA {meta['cuda']}); ceilings measured in this run: copy "
             f"{meta['copy_bw_Bps'] / 1e12:.2f} TB/s (2 GiB device-to-device, read + write), bf16 matmul "
             f"{meta['bf16_flops'] / 1e12:.0f} TFLOP/s (8192^3)",
             f"- floor = max(touched experts' NVFP4 bytes ({NVFP4_BYTES_PER_WEIGHT} B/weight) / copy bandwidth, "
             "FLOPs / bf16 rate), as `nvfp4moe bench`; bf16 floor = the same with the 2 B/weight this layer reads",
             f"- timing: routing from bf16 logits through the combined output, one CUDA-graph replay per run "
             f"(eager where capture failed), L2 flushed (512 MB memset) before each, {WARMUP} warm-ups, median of "
             f"{meta['iters']}; combine: fp32 index_add_, bf16 output",
             "- rel err: ||out - fp32 per-expert loop|| / ||fp32 loop|| at the smallest M of each preset",
             ""]
    cur = None
    for r in records:
        if r["preset"] != cur:
            cur = r["preset"]
            lines += ["", f"### {cur} (E={r['E']}, H={r['H']}, I={r['I']}, top-{r['top_k']}, {r['activation']}"
                      + (f", swiglu_limit {r['swiglu_limit']:g}" if r.get("swiglu_limit") else "") + ")", "",
                      "| M | experts | floor (us) | torch bf16 (us) | % of floor | bf16 floor (us) | TFLOP/s | "
                      "timing | rel err |",
                      "|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
        if "error" in r:
            lines.append(f"| {r['m']} | | | failed: {r['error'][:80]} | | | | | |")
            continue
        lines.append(f"| {r['m']} | {r['experts_touched']} | {fmt(r['floor_us'], '.1f')} | {fmt(r['us'], '.1f')} | "
                     f"{fmt(100 * r['floor_us'] / r['us'], '.1f')} | {fmt(r['floor_bf16_us'], '.1f')} | "
                     f"{fmt(r['flops'] / r['us'] / 1e6, '.1f')} | {r['timing']} | "
                     f"{fmt(r['rel_err'], '.2e') if r.get('rel_err') is not None else ''} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------------
def run_preset(torch, F, name, args, flush, meta, records, save):
    """Every M of one preset; appends its records. Returns (points failed, guard failed)."""
    E, H, I, k, act, limit = PRESETS[name]
    N1 = 2 * I
    weights_per_expert = N1 * H + H * I
    flops_per_pair = 2.0 * weights_per_expert
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)  # a preset's weights do not depend on which presets ran before it
    t0 = time.time()
    w13 = random_nvfp4_as_bf16(torch, E, N1, H, gen)  # [E, N1, H]: gate rows then up rows
    w2 = random_nvfp4_as_bf16(torch, E, H, I, gen)  # [E, H, I]
    torch.cuda.synchronize()
    log(f"\n== {name}: E={E} H={H} I={I} top-{k} {act}" + (f" swiglu_limit={limit:g}" if limit else "")
        + f"; bf16 weights {(w13.numel() + w2.numel()) * 2 / 1e9:.1f} GB made in {time.time() - t0:.1f} s")
    # K-major [E, K, N] views of the [E, N, K] tensors: the layout of a checkpoint's weights
    # transposed, which _grouped_mm takes as a column-major B (no copy)
    w13t, w2t = w13.transpose(1, 2), w2.transpose(1, 2)
    failed, guard_failed = 0, False
    m_check = min(args.ms)
    for M in args.ms:
        rec = dict(preset=name, E=E, H=H, I=I, top_k=k, activation=act, swiglu_limit=limit, m=M,
                   torch=meta["torch"], cuda=meta["cuda"], device=meta["device"],
                   copy_bw_Bps=meta["copy_bw_Bps"], bf16_flops=meta["bf16_flops"], iters=args.iters,
                   rel_err=None)
        try:
            ig = torch.Generator(device="cuda")
            ig.manual_seed(args.seed + 100 + M)
            x = (torch.rand(M, H, device="cuda", generator=ig) * 2 - 1).to(torch.bfloat16)
            logits = (torch.rand(M, E, device="cuda", generator=ig) * 4 - 2).to(torch.bfloat16)
            fwd = make_forward(torch, F, x, logits, w13t, w2t, k, act, I, limit)
            g, outs, why = capture(torch, fwd)
            if g is not None:
                t = time_runs(torch, g.replay, flush, args.iters)
                out, ids = outs  # the graph's static outputs: the last replay's result
                rec["timing"] = "graph"
            else:
                log(f"  M={M}: CUDA graph capture failed ({why}); timing eagerly")
                t = time_runs(torch, fwd, flush, args.iters)
                out, ids = fwd()
                rec.update(timing="eager", capture_error=why)
            torch.cuda.synchronize()
            touched = int(torch.unique(ids).numel())
            wb_nv = touched * weights_per_expert * NVFP4_BYTES_PER_WEIGHT
            wb_bf = touched * weights_per_expert * 2.0
            flops = flops_per_pair * M * k
            fl = flops / meta["bf16_flops"]
            rec.update(us=t["us"], min_us=t["min_us"], max_us=t["max_us"], experts_touched=touched,
                       flops=flops, weight_bytes_nvfp4=wb_nv, weight_bytes_bf16=wb_bf,
                       floor_us=max(wb_nv / meta["copy_bw_Bps"], fl) * 1e6,
                       floor_bf16_us=max(wb_bf / meta["copy_bw_Bps"], fl) * 1e6,
                       finite=bool(torch.isfinite(out).all().item()))
            if M == m_check:
                ref, ref_ids = reference(torch, F, x, logits, w13, w2, k, act, I, limit)
                rel = ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
                ok = math.isfinite(rel) and rel <= REL_TOL
                rec.update(rel_err=rel, check_ok=ok, routing_matches_reference=bool(torch.equal(ids, ref_ids)))
                if not ok:
                    guard_failed = True
                    log(f"FAIL {name} M={M}: rel err {rel:.3e} against the fp32 per-expert loop (limit {REL_TOL:g})"
                        + ("" if rec["routing_matches_reference"] else "; the top-k ids differ from the reference's"))
                del ref, ref_ids
            log(f"  M={M:5d}: {t['us']:9.1f} us ({rec['timing']}), {touched} experts, floor {rec['floor_us']:.1f} us"
                + (f", rel err {rec['rel_err']:.2e}" if rec["rel_err"] is not None else ""))
            del g, outs, out, ids, fwd, x, logits
        except Exception as e:  # noqa: BLE001 - record it and go on with the next point
            traceback.print_exc()
            failed += 1
            rec["error"] = f"{type(e).__name__}: {e}"
            log(f"  M={M}: ERROR {rec['error']}")
        records.append(rec)
        save()
        torch.cuda.empty_cache()
    del w13, w2, w13t, w2t
    torch.cuda.empty_cache()
    return failed, guard_failed


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch, F = import_torch()
    # the reference is float32: no TF32 (this leaves the bf16 GEMMs alone)
    torch.backends.cuda.matmul.allow_tf32 = False
    cc = torch.cuda.get_device_capability()
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                iters=args.iters)
    log(f"torch_moe: {meta['device']} (sm_{cc[0]}{cc[1]}), torch {meta['torch']}, CUDA {meta['cuda']}")
    records = []

    def save():
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(records, f, indent=1)

    failed, guard_failed = 0, False
    with torch.no_grad():
        flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        bw, flops = measure_ceilings(torch, flush, args.iters)
        meta.update(copy_bw_Bps=bw, bf16_flops=flops)
        log(f"ceilings: copy {bw / 1e12:.2f} TB/s (read + write), bf16 matmul 8192^3 {flops / 1e12:.0f} TFLOP/s")
        for name in args.presets:
            try:
                f, gf = run_preset(torch, F, name, args, flush, meta, records, save)
            except Exception as e:  # noqa: BLE001 - e.g. out of memory making the weights
                traceback.print_exc()
                f, gf = 1, False
                records.append(dict(preset=name, m=None, error=f"{type(e).__name__}: {e}", torch=meta["torch"]))
                save()
                log(f"== {name}: ERROR {type(e).__name__}: {e}")
                torch.cuda.empty_cache()
            failed += f
            guard_failed |= gf
    save()
    log("")
    log(markdown([r for r in records if r.get("m") is not None], meta))
    if args.json:
        log(f"\nwrote {args.json}")
    if guard_failed:
        die(4, "the correctness guard failed (see the FAIL lines): the timings above are of a wrong layer")
    if failed:
        die(1, f"{failed} point(s) failed (see the ERROR lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
