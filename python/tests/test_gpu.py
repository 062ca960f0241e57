"""The GPU backends through torch (a GPU machine with a CUDA build and a CUDA torch): for MARLIN,
HOPPER_WGMMA (sm_90) and EMULATION,

- the output equals the C API's bit for bit: `nvfp4moe run` on the same checkpoint and hidden
  states, and nvfp4moe_plan_run called directly on the same buffers;
- stream ordering: the layer runs on torch's current stream, after the torch work that wrote its
  inputs and before the work that reads its output (a side stream held back by a sleep);
- CUDA graphs: a captured forward replayed on new inputs equals the eager one;
- torch.compile (inductor, and mode="reduce-overhead") traces through torch.ops.nvfp4moe.moe and
  gives the eager bits; opcheck passes;
- CUDA weight tensors (from_tensors) give the same layer as host ones.

Skipped without a CUDA torch, unless run.py --gpu asked for them (then it is a failure)."""

import os
import unittest

import nvfp4moe
from _util import checkpoint, cli_run_checksum, fnv1a, need_numpy

REQUIRED = os.environ.get("NVFP4MOE_TEST_GPU") == "1"
torch = None


def setUpModule():
    global torch, np
    why = None
    try:
        import torch as t
        torch = t
    except ImportError:
        why = "torch is not installed"
    if why is None and not torch.cuda.is_available():
        why = "torch sees no CUDA GPU"
    if why is None and not nvfp4moe.built_with_cuda():
        why = f"the library is a CPU-only build ({nvfp4moe.library_path()})"
    if why is None and not hasattr(torch.library, "custom_op"):
        why = f"torch {torch.__version__} has no torch.library.custom_op (2.4+)"
    if why:
        if REQUIRED:
            raise AssertionError(f"the GPU tests were asked for (--gpu), but {why}")
        raise unittest.SkipTest(why)
    np = need_numpy()


def backends():
    major, minor = torch.cuda.get_device_capability()
    sm = 10 * major + minor
    out = ["marlin", "emulation"] if sm >= 80 else []
    if sm == 90:
        out.insert(1, "hopper_wgmma")
    return out


def bits_of(t):
    """A bf16 CUDA tensor's bytes, as `nvfp4moe run` checksums them."""
    return t.detach().cpu().view(torch.int16).numpy().tobytes()


class GpuCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = checkpoint()
        cls.ck = nvfp4moe.CheckpointLayer(cls.model)
        cls.layers = {b: nvfp4moe.MoELayer.from_checkpoint(cls.ck, device="cuda", backend=b) for b in backends()}

    def inputs(self, m, seed=0):
        """Hidden states (bf16 on the GPU), their float32 values, and the checkpoint's router logits
        (float32 on the GPU, computed by the library as `nvfp4moe run` does)."""
        x = np.random.default_rng(seed).standard_normal((m, 256)).astype(np.float32)
        xf = nvfp4moe.to_float32(nvfp4moe.from_float32(x, "bf16"), "bf16")
        hidden = torch.from_numpy(xf).to(torch.bfloat16).cuda()
        logits = torch.from_numpy(self.ck.router_logits(xf)).cuda()
        return hidden, xf, logits

    def reproducible(self, run, times=5):
        """Whether a forward gives the same bits every time (split-K units of MARLIN and HOPPER_WGMMA
        add their fp32 partial sums in arrival order, which can move a bf16 rounding)."""
        first = run()
        return all(torch.equal(first, run()) for _ in range(times - 1))

    def assertBitsEqual(self, a, b, what, rerun=None):
        """a == b bit for bit; where the backend itself is not reproducible (rerun, a forward of the
        same inputs, gives different bits from run to run), at most one bf16 rounding step apart."""
        if torch.equal(a, b):
            return
        diff = (a.float() - b.float()).abs()
        n = int((diff > 0).sum())
        step = b.float().abs() * 2.0 ** -7 + 1e-30
        if rerun is not None and torch.isfinite(a.float()).all() and bool((diff <= step).all()) \
                and not self.reproducible(rerun):
            print(f"note: {what}: {n} of {a.numel()} elements one bf16 rounding step apart; the backend's own output "
                  "varies between identical runs")
            return
        self.fail(f"{what}: {n} of {a.numel()} elements differ (max {float(diff.max()):.3g})")


class TestSameAsTheCApi(GpuCase):
    def test_cli_checksum(self):
        for backend, layer in self.layers.items():
            for m in (1, 3, 64):
                with self.subTest(backend=backend, m=m):
                    self.assertEqual(layer.backend, backend.upper())
                    self.assertEqual(layer.device, f"cuda:{torch.cuda.current_device()}")
                    hidden, xf, logits = self.inputs(m, seed=m)
                    out = layer(hidden, logits)
                    self.assertEqual((tuple(out.shape), out.dtype, out.device), ((m, 256), torch.bfloat16, hidden.device))
                    self.assertTrue(torch.isfinite(out.float()).all())
                    want = cli_run_checksum(self.model, xf, "--moe-backend", backend)
                    if fnv1a(bits_of(out)) != want:
                        runs = {fnv1a(bits_of(layer(hidden, logits))) for _ in range(8)}
                        if want in runs:
                            print(f"note: {backend} M={m}: the CLI's bits are one of {len(runs)} this forward gives")
                        else:
                            self.assertEqual(fnv1a(bits_of(out)), want, "the output differs from nvfp4moe run's")

    def test_direct_call(self):
        lib = nvfp4moe._lib.load()
        for backend, layer in self.layers.items():
            with self.subTest(backend=backend):
                hidden, _, logits = self.inputs(16, seed=5)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    out = layer(hidden, logits)
                side.synchronize()
                direct = torch.empty_like(out)
                ws_size = lib.nvfp4moe_plan_workspace_size(layer._plan, 16)
                ws = torch.empty(max(ws_size, 1), dtype=torch.uint8, device="cuda")
                torch.cuda.synchronize()
                status = lib.nvfp4moe_plan_run(layer._plan, 16, hidden.data_ptr(), logits.data_ptr(), None, None,
                                               direct.data_ptr(), ws.data_ptr(), ws_size, None)
                self.assertEqual(status, 0, nvfp4moe._lib.last_error())
                torch.cuda.synchronize()
                self.assertBitsEqual(out, direct, "the op on a side stream vs nvfp4moe_plan_run on the default stream",
                                     rerun=lambda: layer(hidden, logits))

    def test_from_cuda_tensors(self):
        t = {k: torch.from_numpy(np.array(v)).cuda() for k, v in self.ck.tensors.items()}
        t["w13_scale"] = t["w13_scale"].view(torch.float8_e4m3fn)
        t["w2_scale"] = t["w2_scale"].view(torch.float8_e4m3fn)
        for backend, layer in self.layers.items():
            with self.subTest(backend=backend):
                dev_layer = nvfp4moe.MoELayer.from_tensors(t, top_k=2, backend=backend)
                self.assertEqual(dev_layer.device, layer.device)
                hidden, _, logits = self.inputs(9, seed=9)
                self.assertBitsEqual(dev_layer(hidden, logits), layer(hidden, logits), "CUDA weights vs host weights",
                                     rerun=lambda: layer(hidden, logits))

    def test_precomputed_routing(self):
        for backend, layer in self.layers.items():
            with self.subTest(backend=backend):
                hidden, _, logits = self.inputs(8, seed=8)
                top = torch.topk(logits, 2, dim=1)
                wts = torch.softmax(top.values, dim=1)
                a = layer(hidden, topk_ids=top.indices, topk_weights=wts)          # int64 ids
                b = layer(hidden, topk_ids=top.indices.int(), topk_weights=wts)
                self.assertBitsEqual(a, b, "int64 vs int32 topk_ids",
                                     rerun=lambda: layer(hidden, topk_ids=top.indices, topk_weights=wts))
                ref = layer(hidden, logits).float()
                rel = float((a.float() - ref).norm() / ref.norm())
                self.assertLess(rel, 1e-2, "precomputed renormalize routing vs the layer's own")

    def test_against_the_cpu_reference(self):
        model = checkpoint((), ("--w4a16",))
        ref_layer = nvfp4moe.MoELayer.from_checkpoint(model, device="cpu", backend="cpu_reference")
        ck = nvfp4moe.CheckpointLayer(model)
        x = np.random.default_rng(3).standard_normal((32, 256)).astype(np.float32)
        bits = nvfp4moe.from_float32(x, "bf16")
        xf = nvfp4moe.to_float32(bits, "bf16")
        logits = ck.router_logits(xf)
        ref = nvfp4moe.to_float32(ref_layer(bits, logits), "bf16")
        for backend in [b for b in backends() if b != "emulation"]:
            with self.subTest(backend=backend):
                layer = nvfp4moe.MoELayer.from_checkpoint(ck, device="cuda", backend=backend)
                out = layer(torch.from_numpy(xf).to(torch.bfloat16).cuda(), torch.from_numpy(logits).cuda())
                got = out.float().cpu().numpy()
                self.assertLess(float(np.linalg.norm(got - ref) / np.linalg.norm(ref)), 1e-2)

    def test_errors(self):
        layer = next(iter(self.layers.values()))
        hidden, _, logits = self.inputs(2)
        with self.assertRaises(nvfp4moe.InvalidArgumentError) as ctx:
            layer(hidden.cpu(), logits.cpu())
        self.assertIn("hidden is on cpu", str(ctx.exception))
        with self.assertRaises(nvfp4moe.InvalidArgumentError) as ctx:
            layer(hidden, logits.cpu())
        self.assertIn("router_logits is on cpu", str(ctx.exception))
        with self.assertRaises(nvfp4moe.InvalidArgumentError):
            layer(np.zeros((2, 256), np.uint16), logits)
        self.assertEqual(tuple(layer(hidden[:0], logits[:0]).shape), (0, 256))


class TestTorchIntegration(GpuCase):
    def test_stream_order(self):
        for backend, layer in self.layers.items():
            with self.subTest(backend=backend):
                hidden, _, logits = self.inputs(32, seed=32)
                want = layer(hidden, logits)
                torch.cuda.synchronize()
                h = torch.full_like(hidden, float("nan"))
                lg = torch.full_like(logits, float("nan"))
                torch.cuda.synchronize()
                side = torch.cuda.Stream()
                with torch.cuda.stream(side):
                    torch.cuda._sleep(200_000_000)   # holds the side stream back; kernels elsewhere would run now
                    h.copy_(hidden)
                    lg.copy_(logits)
                    out = layer(h, lg)
                    read = out * 1                   # torch work after the layer, on the same stream
                side.synchronize()
                rerun = lambda: layer(hidden, logits)  # noqa: E731
                self.assertBitsEqual(read, want, "the layer on a side stream behind a sleep", rerun)
                self.assertBitsEqual(out, want, "its output", rerun)

    def test_cuda_graph(self):
        for backend, layer in self.layers.items():
            with self.subTest(backend=backend):
                h1, _, l1 = self.inputs(16, seed=1)
                h2, _, l2 = self.inputs(16, seed=2)
                want1, want2 = layer(h1, l1), layer(h2, l2)
                sh, sl = h1.clone(), l1.clone()
                warm = torch.cuda.Stream()
                warm.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(warm):
                    for _ in range(3):
                        layer(sh, sl)
                torch.cuda.current_stream().wait_stream(warm)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    sout = layer(sh, sl)
                for h, lg, want in ((h2, l2, want2), (h1, l1, want1), (h2, l2, want2)):
                    sh.copy_(h)
                    sl.copy_(lg)
                    graph.replay()
                    torch.cuda.synchronize()
                    self.assertBitsEqual(sout, want, "graph replay vs eager", lambda: layer(h, lg))

    def test_compile(self):
        for backend, layer in self.layers.items():
            with self.subTest(backend=backend):
                def f(h, lg):
                    return layer(h * 1, lg.float()) * 2

                compiled = torch.compile(f, fullgraph=True)
                for m in (4, 7):
                    h, _, lg = self.inputs(m, seed=m)
                    self.assertBitsEqual(compiled(h, lg), f(h, lg), f"torch.compile, M={m}", lambda: f(h, lg))

    def test_compile_reduce_overhead(self):
        layer = next(iter(self.layers.values()))

        def f(h, lg):
            return layer(h, lg) + 0

        compiled = torch.compile(f, mode="reduce-overhead", fullgraph=True)
        h, _, lg = self.inputs(8, seed=80)
        want = f(h, lg)
        for _ in range(4):   # warm-up, capture, replays
            got = compiled(h, lg).clone()
        self.assertBitsEqual(got, want, "torch.compile(mode='reduce-overhead')", lambda: f(h, lg))

    def test_opcheck(self):
        for backend, layer in self.layers.items():
            with self.subTest(backend=backend):
                h, _, lg = self.inputs(4, seed=4)
                torch.library.opcheck(torch.ops.nvfp4moe.moe.default, (h, lg, None, None, layer.name))

    def test_layer_dies_op_says_so(self):
        layer = nvfp4moe.MoELayer.from_checkpoint(self.ck, device="cuda", backend=backends()[0], name="short-lived")
        h, _, lg = self.inputs(2)
        torch.ops.nvfp4moe.moe(h, lg, None, None, "short-lived")
        del layer
        import gc
        gc.collect()
        with self.assertRaises(nvfp4moe.InvalidArgumentError) as ctx:
            torch.ops.nvfp4moe.moe(h, lg, None, None, "short-lived")
        self.assertIn("does not exist", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()
