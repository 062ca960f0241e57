"""torch on the CPU: CPU tensors in and out with no copy, the same bits as numpy, and (torch 2.4+)
torch.ops.nvfp4moe.moe with its fake implementation: opcheck, fake tensors, torch.compile.
Skipped where torch is not installed (it is optional)."""

import unittest

import nvfp4moe
from _util import checkpoint, need_numpy

try:
    import torch
except ImportError:
    torch = None

HAS_OP = torch is not None and hasattr(torch.library, "custom_op")


def setUpModule():
    global np
    if torch is None:
        raise unittest.SkipTest("torch is not installed (optional; the GPU machine has it)")
    np = need_numpy()


class TestTorchCpu(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ck = nvfp4moe.CheckpointLayer(checkpoint())
        cls.layer = nvfp4moe.MoELayer.from_checkpoint(cls.ck, device="cpu", backend="cpu_fast")
        rng = np.random.default_rng(11)
        x = rng.standard_normal((6, 256)).astype(np.float32)
        cls.bits = nvfp4moe.from_float32(x, "bf16")
        cls.x = nvfp4moe.to_float32(cls.bits, "bf16")
        cls.logits = cls.ck.router_logits(cls.x)
        cls.want = cls.layer(cls.bits, cls.logits)   # numpy

    def hidden(self):
        return torch.from_numpy(self.x).to(torch.bfloat16)

    def test_same_bits_as_numpy(self):
        out = self.layer(self.hidden(), torch.from_numpy(self.logits))
        self.assertIsInstance(out, torch.Tensor)
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertEqual(tuple(out.shape), (6, 256))
        np.testing.assert_array_equal(out.view(torch.int16).numpy().view(np.uint16), self.want)

    def test_topk_int64_and_int32(self):
        logits = torch.from_numpy(self.logits)
        ids = torch.topk(logits, 2, dim=1).indices                     # int64, as torch gives them
        wts = torch.softmax(torch.gather(logits, 1, ids), dim=1)
        a = self.layer(self.hidden(), topk_ids=ids, topk_weights=wts)
        b = self.layer(self.hidden(), topk_ids=ids.to(torch.int32), topk_weights=wts)
        self.assertTrue(torch.equal(a, b))
        ref = self.layer(self.bits, topk_ids=ids.numpy().astype(np.int32), topk_weights=wts.numpy())
        np.testing.assert_array_equal(a.view(torch.int16).numpy().view(np.uint16), ref)

    def test_non_contiguous_hidden(self):
        wide = torch.zeros((6, 512), dtype=torch.bfloat16)
        wide[:, ::2] = self.hidden()
        out = self.layer(wide[:, ::2], torch.from_numpy(self.logits))
        np.testing.assert_array_equal(out.view(torch.int16).numpy().view(np.uint16), self.want)

    def test_errors(self):
        with self.assertRaises(nvfp4moe.InvalidArgumentError) as ctx:
            self.layer(self.hidden().float(), torch.from_numpy(self.logits))
        self.assertIn("hidden: dtype torch.float32, the layer takes torch.bfloat16", str(ctx.exception))
        with self.assertRaises(nvfp4moe.InvalidArgumentError) as ctx:
            self.layer(self.hidden(), torch.from_numpy(self.logits).to(torch.bfloat16))
        self.assertIn("router_logits_dtype f32", str(ctx.exception))

    def test_from_torch_tensors(self):
        t = {k: torch.from_numpy(np.array(v)) for k, v in self.ck.tensors.items()}
        t["w13_scale"] = t["w13_scale"].view(torch.float8_e4m3fn) if hasattr(torch, "float8_e4m3fn") else t["w13_scale"]
        layer = nvfp4moe.MoELayer.from_tensors(t, top_k=2, device="cpu", backend="cpu_fast")
        out = layer(self.hidden(), torch.from_numpy(self.logits))
        np.testing.assert_array_equal(out.view(torch.int16).numpy().view(np.uint16), self.want)

    def test_dlpack_objects(self):
        class Array:   # another framework's array: only the DLPack protocol
            def __init__(self, t):
                self._t = t

            def __dlpack__(self, stream=None):
                return self._t.__dlpack__()

            def __dlpack_device__(self):
                return self._t.__dlpack_device__()

        h = self.hidden()
        out = self.layer(Array(h), Array(torch.from_numpy(self.logits)))
        self.assertIsInstance(out, torch.Tensor)
        np.testing.assert_array_equal(out.view(torch.int16).numpy().view(np.uint16), self.want)

    def test_router_logits_in_torch(self):
        got = self.layer.router_logits(self.hidden())
        self.assertEqual(got.dtype, torch.float32)
        np.testing.assert_allclose(got.numpy(), self.logits, rtol=1e-5, atol=1e-5)

    @unittest.skipUnless(HAS_OP, "torch.library.custom_op needs torch 2.4+")
    def test_op_is_registered(self):
        op = nvfp4moe.register_torch_op()
        self.assertIs(op, torch.ops.nvfp4moe.moe)
        out = torch.ops.nvfp4moe.moe(self.hidden(), torch.from_numpy(self.logits), None, None, self.layer.name)
        np.testing.assert_array_equal(out.view(torch.int16).numpy().view(np.uint16), self.want)

    @unittest.skipUnless(HAS_OP, "torch.library.custom_op needs torch 2.4+")
    def test_opcheck(self):
        torch.library.opcheck(torch.ops.nvfp4moe.moe.default,
                              (self.hidden(), torch.from_numpy(self.logits), None, None, self.layer.name))

    @unittest.skipUnless(HAS_OP, "torch.library.custom_op needs torch 2.4+")
    def test_fake_tensors(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode() as mode:
            h = mode.from_tensor(self.hidden())
            lg = mode.from_tensor(torch.from_numpy(self.logits))
            out = torch.ops.nvfp4moe.moe(h, lg, None, None, self.layer.name)
            self.assertEqual(tuple(out.shape), (6, 256))
            self.assertEqual(out.dtype, torch.bfloat16)
            with self.assertRaises(nvfp4moe.InvalidArgumentError):
                torch.ops.nvfp4moe.moe(h[:, :128], lg, None, None, self.layer.name)

    @unittest.skipUnless(HAS_OP, "torch.library.custom_op needs torch 2.4+")
    def test_compile(self):
        layer = self.layer

        def f(h, lg):
            return layer(h * 1, lg) + 0

        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
        h, lg = self.hidden(), torch.from_numpy(self.logits)
        self.assertTrue(torch.equal(compiled(h, lg), f(h, lg)))
        self.assertTrue(torch.equal(compiled(h[:3], lg[:3]), f(h[:3], lg[:3])))   # another M


if __name__ == "__main__":
    unittest.main()
