"""MoELayer and CheckpointLayer on the host backends, through numpy: bit for bit the output of
`nvfp4moe run` on the same checkpoint and hidden states, a float64 numpy reference for layers
made from tensors, and errors that name the argument."""

import threading
import unittest

import nvfp4moe
from _util import (checkpoint, cli, cli_run_checksum, fnv1a, need_numpy, random_weights, reference_w4a16,
                   renormalize_topk)


def setUpModule():
    global np
    np = need_numpy()


def bf16_hidden(rows, cols, seed):
    """Random hidden states as bf16 bit patterns, and the same values as float32."""
    x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    bits = nvfp4moe.from_float32(x, "bf16")
    return bits, nvfp4moe.to_float32(bits, "bf16")


class TestCheckpoint(unittest.TestCase):
    def test_tensors_and_config(self):
        ck = nvfp4moe.CheckpointLayer(checkpoint())
        self.assertEqual((ck.index, ck.format, ck.router_name), (0, "modelopt", "gate"))
        c = ck.config
        self.assertEqual((c["num_experts"], c["top_k"], c["hidden_size"], c["intermediate_size"]), (8, 2, 256, 128))
        t = ck.tensors
        self.assertEqual(t["w13"].shape, (8, 256, 128))
        self.assertEqual(t["w13_scale"].shape, (8, 256, 16))
        self.assertEqual(t["w2"].shape, (8, 256, 64))
        self.assertEqual(t["w2_scale_2"].dtype, np.float32)
        self.assertFalse(t["w13"].flags.writeable)
        self.assertTrue((t["w13_scale_2"] > 0).all())
        self.assertEqual(ck.router_weight.shape, (8, 256))
        self.assertIsNone(ck.router_bias)
        # a view outlives the object it came from
        w2 = nvfp4moe.CheckpointLayer(checkpoint()).tensors["w2"]
        self.assertEqual(int(w2.astype(np.int64).sum()), int(t["w2"].astype(np.int64).sum()))

    def test_router_logits(self):
        ck = nvfp4moe.CheckpointLayer(checkpoint())
        bits, x = bf16_hidden(3, 256, 1)
        got = ck.router_logits(x)
        self.assertEqual(got.shape, (3, 8))
        np.testing.assert_array_equal(got, ck.router_logits(bits))   # bf16 bits are converted first
        want = x.astype(np.float64) @ ck.router_weight.astype(np.float64).T
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

    def test_missing(self):
        with self.assertRaises(nvfp4moe.NotFoundError) as ctx:
            nvfp4moe.CheckpointLayer("/nonexistent/model")
        self.assertIsInstance(ctx.exception, FileNotFoundError)
        self.assertIn("/nonexistent/model", str(ctx.exception))
        with self.assertRaises(nvfp4moe.Error) as ctx:
            nvfp4moe.CheckpointLayer(checkpoint(), layer=5)
        self.assertIn("5", str(ctx.exception))


class TestSameAsCli(unittest.TestCase):
    """The layer's output, bit for bit, against `nvfp4moe run --model DIR --input FILE`."""

    def check(self, model, backend, tokens=7, extra_flags=()):
        ck = nvfp4moe.CheckpointLayer(model)
        bits, x = bf16_hidden(tokens, ck.config["hidden_size"], tokens)
        layer = nvfp4moe.MoELayer.from_checkpoint(ck, device="cpu", backend=backend)
        self.assertEqual(layer.backend, backend.upper())
        out = layer(bits, ck.router_logits(x))
        self.assertEqual(out.dtype, np.uint16)
        self.assertEqual(out.shape, (tokens, ck.config["hidden_size"]))
        self.assertTrue(np.isfinite(nvfp4moe.to_float32(out, "bf16")).all())
        self.assertEqual(fnv1a(out.tobytes()), cli_run_checksum(model, x, "--moe-backend", backend, *extra_flags))
        return layer, out

    def test_backends(self):
        d = checkpoint()
        for backend in ("cpu_fast", "cpu_reference"):
            with self.subTest(backend=backend):
                self.check(d, backend)

    def test_formats_and_schemes(self):
        for conv in (("--format", "modelopt-fused"), ("--format", "compressed-tensors"), ("--w4a16",)):
            with self.subTest(conv=conv):
                self.check(checkpoint((), conv), "cpu_fast", tokens=5)

    def test_gpt_oss_router_bias_and_expert_biases(self):
        d = checkpoint(("--activation", "swigluoai", "--hidden-size", "128", "--intermediate-size", "64"))
        layer, _ = self.check(d, "cpu_reference", tokens=4)
        self.assertTrue(layer.config["has_bias"])
        self.assertIsNotNone(layer.router_bias)

    def test_auto_picks_what_the_cli_picks(self):
        d = checkpoint()
        layer = nvfp4moe.MoELayer.from_checkpoint(d, device="cpu")
        r = cli("run", "--model", d, "--tokens", "1", "--device", "cpu")
        self.assertIn(f"backend   {layer.backend} ({layer.kernel})", r.stdout)
        self.assertEqual(layer.report.backend, layer.backend)
        self.assertEqual(layer.device, "cpu")
        self.assertEqual(layer.effective_scheme, "w4a4")


class TestFromTensors(unittest.TestCase):
    """Layers made from numpy tensors against an independent float64 reference (W4A16: the
    reference of the weights alone)."""

    def make(self, activation="silu", dtype="f32", **kw):
        rng = np.random.default_rng(7)
        gated = activation == "silu"
        w = random_weights(np, rng, experts=4, hidden=64, inter=32, gated=gated)
        layer = nvfp4moe.MoELayer.from_tensors(device="cpu", backend="cpu_reference", top_k=2, scheme="w4a16",
                                               activation=activation, dtype=dtype, **w, **kw)
        return w, layer

    def test_reference_with_router_logits(self):
        for activation in ("silu", "relu2_no_mul"):
            with self.subTest(activation=activation):
                w, layer = self.make(activation)
                self.assertEqual((layer.num_experts, layer.hidden_size, layer.intermediate_size), (4, 64, 32))
                rng = np.random.default_rng(3)
                x = rng.standard_normal((6, 64)).astype(np.float32)
                logits = rng.standard_normal((6, 4)).astype(np.float32)
                out = layer(x, logits)
                self.assertEqual(out.dtype, np.float32)
                ids, wts = renormalize_topk(np, logits, 2)
                want = reference_w4a16(np, w, x, ids, wts, activation)
                np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())

    def test_precomputed_routing(self):
        w, layer = self.make()
        rng = np.random.default_rng(4)
        x = rng.standard_normal((5, 64)).astype(np.float32)
        ids = np.array([[0, 3], [1, 2], [2, 2], [3, 0], [1, 1]], dtype=np.int64)   # int64 is converted
        wts = rng.uniform(0.1, 1.0, size=(5, 2)).astype(np.float32)
        out = layer(x, topk_ids=ids, topk_weights=wts)
        want = reference_w4a16(np, w, x, ids, wts)
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
        np.testing.assert_array_equal(layer(x, topk_ids=ids.astype(np.int32), topk_weights=wts), out)

    def test_vllm_names_and_shapes(self):
        rng = np.random.default_rng(7)
        w = random_weights(np, rng, experts=4, hidden=64, inter=32, a4=True)
        canonical = nvfp4moe.MoELayer.from_tensors(device="cpu", backend="cpu_reference", top_k=2, dtype="f32", **w)
        vllm = {"w13_weight": w["w13"], "w13_weight_scale": w["w13_scale"],
                "w13_weight_scale_2": np.stack([w["w13_scale_2"]] * 2, axis=1),              # [E, 2], equal
                "w13_input_scale": np.stack([w["w13_input_scale"], w["w13_input_scale"] / 2], axis=1),  # max
                "w2_weight": w["w2"], "w2_weight_scale": w["w2_scale"], "w2_weight_scale_2": w["w2_scale_2"],
                "w2_input_scale": np.array([w["w2_input_scale"][0]], dtype=np.float32)}    # one for all
        layer = nvfp4moe.MoELayer.from_tensors(vllm, device="cpu", backend="cpu_reference", top_k=2, dtype="f32")
        x = rng.standard_normal((3, 64)).astype(np.float32)
        logits = rng.standard_normal((3, 4)).astype(np.float32)
        np.testing.assert_array_equal(layer(x, logits), canonical(x, logits))

        class FusedMoELike:   # an object holding the tensors as attributes, as vLLM's layer does
            pass

        obj = FusedMoELike()
        for k, v in vllm.items():
            setattr(obj, k, v)
        np.testing.assert_array_equal(nvfp4moe.MoELayer.from_tensors(obj, device="cpu", backend="cpu_reference",
                                                                     top_k=2, dtype="f32")(x, logits),
                                      canonical(x, logits))
        both = dict(vllm, w13_weight_scale_2=w["w13_scale_2"], w13_up_scale_2=w["w13_scale_2"])
        with self.assertRaises(nvfp4moe.InvalidArgumentError) as ctx:
            nvfp4moe.MoELayer.from_tensors(dict(both, w13_weight_scale_2=vllm["w13_weight_scale_2"]), device="cpu",
                                           top_k=2)
        self.assertIn("w13_up_scale_2 is given twice", str(ctx.exception))

    def test_gate_and_up_global_scales_that_differ(self):
        """vLLM's [E, 2] w13_weight_scale_2 whose columns differ (up to 10x): each half is applied
        with its own, as w13_up_scale_2 does, against the float64 reference of both."""
        rng = np.random.default_rng(11)
        w = random_weights(np, rng, experts=4, hidden=64, inter=32)
        up = (w["w13_scale_2"] * np.array([1.0, 2.5, 0.1, 10.0])).astype(np.float32)
        x = rng.standard_normal((5, 64)).astype(np.float32)
        logits = rng.standard_normal((5, 4)).astype(np.float32)
        ids, wts = renormalize_topk(np, logits, 2)
        want = reference_w4a16(np, dict(w, w13_up_scale_2=up), x, ids, wts)
        kw = dict(device="cpu", backend="cpu_reference", top_k=2, scheme="w4a16", dtype="f32")
        pairs = nvfp4moe.MoELayer.from_tensors(dict(w, w13_scale_2=np.stack([w["w13_scale_2"], up], axis=1)), **kw)
        named = nvfp4moe.MoELayer.from_tensors(dict(w, w13_up_scale_2=up), **kw)
        gate_only = nvfp4moe.MoELayer.from_tensors(w, **kw)
        out = pairs(x, logits)
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
        np.testing.assert_array_equal(named(x, logits), out)
        self.assertGreater(np.abs(gate_only(x, logits) - out).max(), 1e-2 * np.abs(want).max())

    def test_vllm_fused_moe_config(self):
        import dataclasses
        import enum

        class MoEActivation(enum.Enum):
            SILU = "silu"

        @dataclasses.dataclass
        class FusedMoEConfig:   # vLLM's field names, in vLLM's order, for a TP=2 shard with EP off
            num_experts: int = 4
            experts_per_token: int = 2
            hidden_dim: int = 64
            intermediate_size: int = 64
            num_local_experts: int = 4
            num_logical_experts: int = 4
            activation: MoEActivation = MoEActivation.SILU
            device: str = "cpu"
            in_dtype: str = "float32"
            router_logits_dtype: str = "float32"
            moe_backend: str = "auto"
            has_bias: bool = False
            is_lora_enabled: bool = False
            swiglu_limit: object = None
            intermediate_size_per_partition: int = 32

        rng = np.random.default_rng(7)
        w = random_weights(np, rng, experts=4, hidden=64, inter=32)
        a = nvfp4moe.MoELayer.from_tensors(w, config=FusedMoEConfig(), device="cpu", backend="cpu_reference",
                                           scheme="w4a16")
        self.assertEqual((a.top_k, a.intermediate_size, a.in_dtype), (2, 32, "f32"))
        b = nvfp4moe.MoELayer.from_tensors(w, device="cpu", backend="cpu_reference", scheme="w4a16", top_k=2,
                                           dtype="f32")
        x = rng.standard_normal((3, 64)).astype(np.float32)
        logits = rng.standard_normal((3, 4)).astype(np.float32)
        np.testing.assert_array_equal(a(x, logits), b(x, logits))

    def test_w4a4_matches_the_checkpoint_layer(self):
        ck = nvfp4moe.CheckpointLayer(checkpoint())
        a = nvfp4moe.MoELayer.from_checkpoint(ck, device="cpu", backend="cpu_fast")
        b = nvfp4moe.MoELayer.from_tensors(ck.tensors, device="cpu", backend="cpu_fast", top_k=2)
        bits, x = bf16_hidden(4, 256, 9)
        logits = ck.router_logits(x)
        np.testing.assert_array_equal(a(bits, logits), b(bits, logits))

    def test_errors_name_the_tensor(self):
        rng = np.random.default_rng(7)
        w = random_weights(np, rng, experts=4, hidden=64, inter=32)
        cases = [
            (dict(w, w13=w["w13"][:, :48]), "weights.w13: shape [4, 48, 32], expected [4, 64, 32]"),
            (dict(w, w2_scale=w["w2_scale"].astype(np.float32)), "weights.w2_scale: dtype f32"),
            ({k: v for k, v in w.items() if k != "w2_scale_2"}, "weights.w2_scale_2 is missing"),
            (dict(w, w13_bias=np.zeros((4, 64), np.float32)), "weights.w2_bias is missing"),
        ]
        for tensors, needle in cases:
            with self.subTest(needle=needle):
                with self.assertRaises(nvfp4moe.InvalidArgumentError) as ctx:
                    nvfp4moe.MoELayer.from_tensors(tensors, device="cpu", top_k=2, scheme="w4a16")
                self.assertIn(needle, str(ctx.exception))
        with self.assertRaises(nvfp4moe.InvalidArgumentError) as ctx:
            nvfp4moe.MoELayer.from_tensors(w, device="cpu", scheme="w4a16")
        self.assertIn("top_k is not given", str(ctx.exception))
        with self.assertRaises(nvfp4moe.InvalidArgumentError) as ctx:
            nvfp4moe.MoELayer.from_tensors(w, device="cpu", top_k=2)   # W4A4 needs input scales
        self.assertIn("w13_input_scale is missing", str(ctx.exception))
        with self.assertRaises(nvfp4moe.InvalidArgumentError) as ctx:
            nvfp4moe.MoELayer.from_tensors(w, device="h200", top_k=2, scheme="w4a16")
        self.assertIn("device 'h200'", str(ctx.exception))
        with self.assertRaises(nvfp4moe.InvalidArgumentError):
            nvfp4moe.MoELayer.from_tensors(w, device="cpu", top_k=2, scheme="w4a16", bogus=1)
        with self.assertRaises(TypeError):
            nvfp4moe.MoELayer.from_tensors(w, device="cpu", top_k=2, scheme="w4a16", backend="cpu_fast",
                                           moe_backend="cpu_fast")

    def test_oracle_errors_are_vllms(self):
        rng = np.random.default_rng(7)
        w = random_weights(np, rng, experts=4, hidden=64, inter=32)
        with self.assertRaises(nvfp4moe.NoBackendError) as ctx:   # vLLM's backends cannot run on the CPU
            nvfp4moe.MoELayer.from_tensors(w, device="cpu", top_k=2, scheme="w4a16", vllm_only=True)
        self.assertIsInstance(ctx.exception, NotImplementedError)
        self.assertEqual(str(ctx.exception), "No NvFp4 MoE backend supports the deployment configuration.")
        self.assertEqual(ctx.exception.report["error"]["kind"], "NotImplementedError")
        with self.assertRaises(nvfp4moe.BackendError) as ctx:
            nvfp4moe.MoELayer.from_tensors(w, device="cpu", top_k=2, scheme="w4a16", backend="flashinfer_trtllm")
        self.assertIsInstance(ctx.exception, ValueError)
        self.assertIn("'FLASHINFER_TRTLLM' does not support the deployment configuration", str(ctx.exception))
        with self.assertRaises(nvfp4moe.BackendError):
            nvfp4moe.MoELayer.from_tensors(w, device="cpu", top_k=2, scheme="w4a16", backend="nonsense")
        with self.assertRaises(nvfp4moe.UnsupportedError) as ctx:   # a layer runs on one device
            nvfp4moe.MoELayer.from_tensors(w, device="cpu", top_k=2, scheme="w4a16", tensor_parallel_size=2,
                                           enable_expert_parallel=True)
        self.assertIn("expert parallelism", str(ctx.exception))

    def test_forward_errors(self):
        w, layer = self.make()
        x = np.zeros((3, 64), np.float32)
        logits = np.zeros((3, 4), np.float32)
        ids = np.zeros((3, 2), np.int32)
        wts = np.ones((3, 2), np.float32)
        cases = [
            (lambda: layer(np.zeros((3, 60), np.float32), logits), "hidden: shape [3, 60], expected [M, 64]"),
            (lambda: layer(x.astype(np.float64), logits), "hidden: dtype float64"),
            (lambda: layer(x, logits[:2]), "router_logits: shape [2, 4], expected [3, 4]"),
            (lambda: layer(x), "router_logits is missing"),
            (lambda: layer(x, logits, topk_ids=ids, topk_weights=wts), "not both"),
            (lambda: layer(x, topk_ids=ids), "go together"),
            (lambda: layer(x, topk_ids=ids, topk_weights=wts.astype(np.float64)), "topk_weights: dtype float64"),
            (lambda: layer(x, topk_ids=np.full((3, 2), 9, np.int32), topk_weights=wts), "topk_ids"),
        ]
        for call, needle in cases:
            with self.subTest(needle=needle):
                with self.assertRaises(nvfp4moe.InvalidArgumentError) as ctx:
                    call()
                self.assertIn(needle, str(ctx.exception))
        with self.assertRaises(TypeError):
            layer([[0.0] * 64], logits)
        self.assertEqual(layer(np.zeros((0, 64), np.float32), np.zeros((0, 4), np.float32)).shape, (0, 64))

    def test_bf16_layer_takes_bit_patterns(self):
        _, layer = self.make(dtype="bf16")
        bits, x = bf16_hidden(2, 64, 5)
        logits = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
        out = layer(bits, logits)
        self.assertEqual(out.dtype, np.uint16)
        _, f32 = self.make(dtype="f32")
        ref = f32(x, logits)
        np.testing.assert_allclose(nvfp4moe.to_float32(out, "bf16"), ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
        with self.assertRaises(nvfp4moe.InvalidArgumentError):
            layer(x, logits)   # float32 into a bf16 layer

    def test_threads_share_a_layer(self):
        w, layer = self.make()
        rng = np.random.default_rng(6)
        xs = [rng.standard_normal((8, 64)).astype(np.float32) for _ in range(4)]
        ls = [rng.standard_normal((8, 4)).astype(np.float32) for _ in range(4)]
        want = [layer(x, lg) for x, lg in zip(xs, ls)]
        got = [None] * 4

        def work(i):
            for _ in range(5):
                got[i] = layer(xs[i], ls[i])

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for g, wnt in zip(got, want):
            np.testing.assert_array_equal(g, wnt)

    def test_names_and_close(self):
        _, a = self.make(name="experts.3")
        self.assertEqual(a.name, "experts.3")
        with self.assertRaises(nvfp4moe.InvalidArgumentError):
            self.make(name="experts.3")
        self.assertIn("CPU_REFERENCE", repr(a))
        a.close()
        with self.assertRaises(nvfp4moe.InvalidArgumentError):
            a(np.zeros((1, 64), np.float32), np.zeros((1, 4), np.float32))
        a.close()   # twice is harmless


class TestConversions(unittest.TestCase):
    def test_bf16(self):
        x = np.array([1.0, -2.0, 1.00390625, 1.01171875, np.inf], np.float32)
        bits = nvfp4moe.from_float32(x, "bf16")
        # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even gives 1; 1 + 3*2^-8 rounds to 1 + 2^-6
        np.testing.assert_array_equal(bits, np.array([0x3F80, 0xC000, 0x3F80, 0x3F82, 0x7F80], np.uint16))
        np.testing.assert_array_equal(nvfp4moe.to_float32(bits, "bf16"), [1.0, -2.0, 1.0, 1.015625, np.inf])
        self.assertTrue(np.isnan(nvfp4moe.to_float32(nvfp4moe.from_float32(np.array([np.nan], np.float32), "bf16"),
                                                     "bf16")).all())
        h = nvfp4moe.from_float32(np.array([0.1], np.float32), "fp16")
        self.assertEqual(h.dtype, np.float16)
        self.assertEqual(h[0], np.float16(0.1))


if __name__ == "__main__":
    unittest.main()
