"""select() and explain() against `nvfp4moe select` of the same build: the same object, the same
text, vLLM's keyword names mapped as vLLM maps them, and errors as exceptions."""

import dataclasses
import io
import json
import os
import subprocess
import sys
import unittest
from pathlib import Path

import nvfp4moe
from _util import checkpoint, cli, tmpdir

# (select() keywords, the same deployment as `nvfp4moe select` flags, its exit status)
CASES = [
    ({}, [], 0),
    ({"device": "h200", "vllm_only": True}, ["--device", "h200", "--vllm-only"], 0),
    ({"device": "b200", "installed": "all"}, ["--device", "b200", "--installed", "all"], 0),
    ({"device": "b200", "installed": "all", "tensor_parallel_size": 4, "enable_expert_parallel": True,
      "enable_eplb": True}, ["--device", "b200", "--installed", "all", "--tp", "4", "--ep", "4", "--eplb"], 0),
    ({"device": "b200", "installed": "all", "moe_backend": "b12x"},
     ["--device", "b200", "--installed", "all", "--moe-backend", "b12x"], 2),
    ({"device": "h100", "installed": ["flashinfer"], "tensor_parallel_size": 2, "data_parallel_size": 2,
      "enable_expert_parallel": True, "all2all_backend": "deepep_low_latency"},
     ["--device", "h100", "--installed", "flashinfer", "--tp", "2", "--dp", "2", "--ep", "4", "--all2all",
      "deepep_low_latency"], 3),
    ({"device": "cpu", "vllm_only": True}, ["--device", "cpu", "--vllm-only"], 3),
    ({"device": "b200", "installed": "all", "activation": "swigluoai", "swiglu_limit": 7.0, "has_bias": True},
     ["--device", "b200", "--installed", "all", "--activation", "swigluoai", "--swiglu-limit", "7", "--bias"], 0),
    ({"device": "h200", "hidden_size": 7168, "intermediate_size": 2048, "num_experts": 256},
     ["--device", "h200", "--hidden-size", "7168", "--intermediate-size", "2048", "--num-experts", "256"], 0),
    ({"device": "sm_120", "scheme": "w4a16", "dtype": "torch.float16"},
     ["--device", "sm_120", "--scheme", "w4a16", "--dtype", "fp16"], 0),
    ({"device": "b200", "moe_backend": "Flashinfer-CUTLASS", "installed": "flashinfer,cutlass", "enable_lora": True},
     ["--device", "b200", "--moe-backend", "Flashinfer-CUTLASS", "--installed", "flashinfer,cutlass", "--lora"], 2),
    ({"device": "b200", "moe_backend": "Flashinfer-CUTLASS", "installed": "flashinfer,cutlass"},
     ["--device", "b200", "--moe-backend", "Flashinfer-CUTLASS", "--installed", "flashinfer,cutlass"], 0),
    ({"device": "h200", "moe_backend": "nonsense"}, ["--device", "h200", "--moe-backend", "nonsense"], 2),
]


def cli_json(flags):
    r = cli("select", "--json", *flags, check=False)
    return r.returncode, json.loads(r.stdout)


class TestSameAsCli(unittest.TestCase):
    def test_cases(self):
        for kwargs, flags, status in CASES:
            with self.subTest(kwargs=kwargs):
                rc, want = cli_json(flags)
                self.assertEqual(rc, status, f"the CLI's exit status for {flags}")
                got = nvfp4moe.select(**kwargs)
                self.assertIsInstance(got, nvfp4moe.Selection)
                self.assertEqual(dict(got), want)
                self.assertEqual(got.backend, want["backend"])
                self.assertEqual(got.kernel, want["kernel"])
                if status == 0:
                    self.assertIsNone(got.error)
                    self.assertIs(got.raise_for_error(), got)
                else:
                    self.assertEqual(got.error["kind"], "ValueError" if status == 2 else "NotImplementedError")
                    exc = nvfp4moe.BackendError if status == 2 else nvfp4moe.NoBackendError
                    with self.assertRaises(exc) as ctx:
                        nvfp4moe.select(check=True, **kwargs)
                    self.assertEqual(str(ctx.exception), want["error"]["message"])
                    self.assertEqual(ctx.exception.report["error"], want["error"])
                    self.assertIn(ctx.exception.status, (3, 4))
                    self.assertIn(ctx.exception.status_name, ("unsupported", "not found"))

    def test_text_is_the_cli_text(self):
        for kwargs, flags, status in CASES[1:6]:
            with self.subTest(kwargs=kwargs):
                r = cli("select", *flags, check=False)
                sel = nvfp4moe.select(**kwargs)
                self.assertEqual(sel.text, r.stdout)
                self.assertEqual(str(sel), r.stdout)
                buf = io.StringIO()
                again = nvfp4moe.explain(file=buf, **kwargs)
                self.assertEqual(buf.getvalue(), r.stdout)
                self.assertEqual(dict(again), dict(sel))

    def test_model_directory(self):
        d = checkpoint()
        rc, want = cli_json(["--model", d, "--device", "h200"])
        self.assertEqual(rc, 0)
        got = nvfp4moe.select(model=d, device="h200")
        self.assertEqual(dict(got), want)
        self.assertEqual(got.config["num_experts"], 8)
        self.assertEqual(got.config["hidden_size"], 256)
        self.assertEqual(got.warnings, [])
        # keywords override the model, as flags do
        rc, want = cli_json(["--model", d, "--device", "b200", "--installed", "all", "--moe-backend", "b12x"])
        self.assertEqual(dict(nvfp4moe.select(model=Path(d), device="b200", installed="all", moe_backend="b12x")), want)

    def test_hf_config_dict(self):
        d = checkpoint()
        cfg = json.loads((Path(d) / "config.json").read_text())
        quant = json.loads((Path(d) / "hf_quant_config.json").read_text())
        want = nvfp4moe.select(model=d, device="h200")
        got = nvfp4moe.select(hf_config=cfg, hf_quant_config=quant, device="h200")
        self.assertEqual(dict(got), dict(want))
        self.assertEqual(got.config, want.config)

        class FakePretrainedConfig:  # transformers' configs have to_dict()
            def to_dict(self):
                return cfg

        self.assertEqual(dict(nvfp4moe.select(hf_config=FakePretrainedConfig(), hf_quant_config=quant, device="h200")),
                         dict(want))

    def test_hub_cache(self):
        d = checkpoint()
        cache = tmpdir() / "hub"
        snap = cache / "models--someorg--Some-Model-FP4" / "snapshots" / "abc123"
        snap.mkdir(parents=True, exist_ok=True)
        for f in ("config.json", "hf_quant_config.json"):
            (snap / f).write_text((Path(d) / f).read_text())
        (cache / "models--someorg--Some-Model-FP4" / "refs").mkdir(exist_ok=True)
        (cache / "models--someorg--Some-Model-FP4" / "refs" / "main").write_text("abc123\n")
        old = os.environ.get("HF_HUB_CACHE")
        os.environ["HF_HUB_CACHE"] = str(cache)
        try:
            got = nvfp4moe.select(model="someorg/Some-Model-FP4", device="h200")
            self.assertEqual(dict(got), dict(nvfp4moe.select(model=d, device="h200")))
            with self.assertRaises(nvfp4moe.NotFoundError) as ctx:
                nvfp4moe.select(model="someorg/not-downloaded", device="h200")
            self.assertIn(str(cache), str(ctx.exception))
            self.assertIsInstance(ctx.exception, FileNotFoundError)
        finally:
            if old is None:
                del os.environ["HF_HUB_CACHE"]
            else:
                os.environ["HF_HUB_CACHE"] = old

    def test_hub_offline(self):
        """huggingface_hub installed but unable to fetch (no network): NotFoundError, not its exception"""
        import types
        fake = types.ModuleType("huggingface_hub")

        def snapshot_download(*args, **kwargs):
            raise OSError("network is unreachable")

        fake.snapshot_download = snapshot_download
        saved = sys.modules.get("huggingface_hub")
        sys.modules["huggingface_hub"] = fake
        try:
            with self.assertRaises(nvfp4moe.NotFoundError) as ctx:
                nvfp4moe.select(model="someorg/not-downloaded", device="h200")
            self.assertIn("network is unreachable", str(ctx.exception))
            self.assertIsInstance(ctx.exception, FileNotFoundError)
        finally:
            if saved is None:
                del sys.modules["huggingface_hub"]
            else:
                sys.modules["huggingface_hub"] = saved


class TestVllmKeywords(unittest.TestCase):
    def test_expert_parallel_is_tp_times_dp(self):
        sel = nvfp4moe.select(device="h200", tensor_parallel_size=2, data_parallel_size=4, enable_expert_parallel=True)
        self.assertEqual((sel.config["tp_size"], sel.config["dp_size"], sel.config["ep_size"]), (2, 4, 8))
        off = nvfp4moe.select(device="h200", tensor_parallel_size=2, enable_expert_parallel=False)
        self.assertEqual(off.config["ep_size"], 1)
        one = nvfp4moe.select(device="h200", enable_expert_parallel=True)  # tp * dp == 1: no EP in vLLM
        self.assertEqual(one.config["ep_size"], 1)
        same = nvfp4moe.select(device="h200", tensor_parallel_size=2, enable_expert_parallel=True, ep_size=2)
        self.assertEqual(same.config["ep_size"], 2)
        with self.assertRaises(nvfp4moe.InvalidArgumentError) as ctx:
            nvfp4moe.select(device="h200", tensor_parallel_size=2, enable_expert_parallel=True, ep_size=4)
        self.assertIn("ep_size=4 does not match enable_expert_parallel", str(ctx.exception))
        self.assertIsInstance(ctx.exception, ValueError)

    def test_reason_shows_the_parallel_config(self):
        sel = nvfp4moe.select(device="b200", installed="all", tensor_parallel_size=4, enable_expert_parallel=True,
                              enable_eplb=True)
        mono = [c for c in sel["candidates"] if c["kernel"] == "TrtLlmNvFp4ExpertsMonolithic"][0]
        self.assertIn("ep_size=4", mono["reason"])
        self.assertIn("use_ep=True", mono["reason"])
        self.assertIn("enable_eplb=True", mono["reason"])
        self.assertEqual(sel["kernel"], "TrtLlmNvFp4ExpertsModular")

    def test_default_all2all_without_ep_is_none(self):
        sel = nvfp4moe.select(device="h200", all2all_backend="allgather_reducescatter")
        self.assertEqual(sel.config["all2all"], "")
        with self.assertRaises(ValueError):
            nvfp4moe.select(device="h200", all2all_backend="naive")   # an all2all needs EP

    def test_names_and_env_vars(self):
        sel = nvfp4moe.select(device="b200", installed="all", num_experts_per_tok=4, moe_intermediate_size=512,
                              hidden_act="gelu", VLLM_BATCH_INVARIANT=True, n_routed_experts=64)
        c = sel.config
        self.assertEqual((c["top_k"], c["intermediate_size"], c["activation"], c["batch_invariant"], c["num_experts"]),
                         (4, 512, "gelu", True, 64))
        self.assertEqual(nvfp4moe.select(enable_lora=True, lora_config=None).config["lora"], False)   # the last wins
        self.assertEqual(nvfp4moe.select(lora_config={"max_loras": 4}).config["lora"], True)
        self.assertEqual(nvfp4moe.select(swiglu_limit=None).config["swiglu_limit"], None)

    def test_unknown_keyword_is_an_error(self):
        with self.assertRaises(nvfp4moe.InvalidArgumentError) as ctx:
            nvfp4moe.select(tensor_paralel_size=2)
        msg = str(ctx.exception)
        self.assertIn("unknown key 'tensor_paralel_size'", msg)
        self.assertIn("tensor_parallel_size", msg)
        self.assertEqual(ctx.exception.status, 1)
        self.assertEqual(ctx.exception.status_name, "invalid argument")

    def test_bad_values(self):
        with self.assertRaises(ValueError) as ctx:
            nvfp4moe.select(hidden_size=100)
        self.assertIn("hidden_size=100", str(ctx.exception))
        with self.assertRaises(ValueError) as ctx:
            nvfp4moe.select(top_k="eight")
        self.assertIn("deployment.top_k: expected an integer", str(ctx.exception))
        with self.assertRaises(ValueError) as ctx:
            nvfp4moe.select(activation="swish")
        self.assertIn("deployment.activation", str(ctx.exception))
        self.assertIn("silu", str(ctx.exception))   # the accepted names
        with self.assertRaises(ValueError):
            nvfp4moe.select(device="h900")
        with self.assertRaises(ValueError):
            nvfp4moe.select(installed="flashinfer,tensorrt")
        with self.assertRaises(ValueError):
            nvfp4moe.select(swiglu_limit=float("nan"))
        with self.assertRaises(TypeError):
            nvfp4moe.select(top_k=object())

    def test_vllm_config_dict_is_read_leniently(self):
        engine_args = {"model": "/nonexistent/model", "tensor_parallel_size": 4, "enable_expert_parallel": True,
                       "gpu_memory_utilization": 0.9, "max_model_len": 8192, "moe_backend": "marlin",
                       "some_future_option": {"x": 1}}
        sel = nvfp4moe.select(engine_args, device="h200")
        self.assertEqual(sel.config["ep_size"], 4)
        self.assertEqual(sel.backend, "MARLIN")
        nested = {"parallel_config": {"tensor_parallel_size": 2, "data_parallel_size": 2, "enable_expert_parallel": True,
                                      "all2all_backend": "deepep_low_latency", "worker_cls": "auto"},
                  "kernel_config": {"moe_backend": "auto"}, "model_config": {"dtype": "bfloat16"}}
        sel = nvfp4moe.select(nested, device="h100", installed=["flashinfer"])
        self.assertEqual(dict(sel), cli_json(["--device", "h100", "--installed", "flashinfer", "--tp", "2", "--dp", "2",
                                              "--ep", "4", "--all2all", "deepep_low_latency"])[1])
        # keywords win over the config dict
        self.assertEqual(nvfp4moe.select(engine_args, device="h200", tensor_parallel_size=2).config["ep_size"], 2)

    def test_vllm_config_objects(self):
        d = checkpoint()
        hf = json.loads((Path(d) / "config.json").read_text())

        @dataclasses.dataclass
        class ParallelConfig:
            tensor_parallel_size: int = 2
            data_parallel_size: int = 1
            enable_expert_parallel: bool = True
            enable_eplb: bool = False
            all2all_backend: str = "allgather_reducescatter"

        class HFConfig:
            def to_dict(self):
                return hf

        @dataclasses.dataclass
        class ModelConfig:
            model: str = "someorg/absent"
            dtype: str = "bfloat16"
            hf_config: object = dataclasses.field(default_factory=HFConfig)

        @dataclasses.dataclass
        class VllmConfig:
            parallel_config: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
            model_config: ModelConfig = dataclasses.field(default_factory=ModelConfig)
            lora_config: object = None

        sel = nvfp4moe.select(VllmConfig(), device="h200")
        self.assertEqual(sel.config["num_experts"], 8)       # from model_config.hf_config
        self.assertEqual(sel.config["ep_size"], 2)           # from parallel_config
        self.assertEqual(sel.config["lora"], False)
        want = nvfp4moe.select(hf_config=hf, device="h200", tensor_parallel_size=2, enable_expert_parallel=True)
        self.assertEqual(dict(sel), dict(want))


class TestLibrary(unittest.TestCase):
    def test_version_and_build(self):
        v = nvfp4moe.library_version()
        self.assertTrue(v.startswith(nvfp4moe.__version__))
        self.assertEqual(nvfp4moe.built_with_cuda(), "(cuda)" in v)
        self.assertIn("vLLM", nvfp4moe.vllm_revision())
        self.assertTrue(os.path.exists(nvfp4moe.library_path()) or "/" not in nvfp4moe.library_path())

    def _python(self, env, code):
        env = {**os.environ, **env, "PYTHONPATH": str(Path(nvfp4moe.__file__).parents[1])}
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)

    def test_env_var_names_the_library(self):
        r = self._python({"NVFP4MOE_LIBRARY": "/nonexistent/libnvfp4moe.so"},
                         "import nvfp4moe\ntry:\n nvfp4moe.select()\nexcept nvfp4moe.LibraryNotFoundError as e:\n print(e)")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("$NVFP4MOE_LIBRARY: /nonexistent/libnvfp4moe.so (no such file)", r.stdout)
        lib_dir = str(Path(nvfp4moe.library_path()).resolve().parent)
        r = self._python({"NVFP4MOE_LIBRARY": lib_dir}, "import nvfp4moe\nprint(nvfp4moe.select(device='h200').backend)")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "HOPPER_WGMMA")

    def test_import_needs_neither_torch_nor_numpy(self):
        r = self._python({}, "import sys, nvfp4moe\nnvfp4moe.select()\nprint('torch' in sys.modules, 'numpy' in sys.modules)")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "False False")


if __name__ == "__main__":
    unittest.main()
