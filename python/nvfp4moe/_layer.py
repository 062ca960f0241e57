"""MoELayer: an NVFP4 MoE layer on the backend the oracle picks; CheckpointLayer: one read from a
model directory."""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Mapping

from . import _lib, _tensors, _torch_op
from ._errors import InvalidArgumentError, error_for
from ._oracle import Selection, deployment_request, device_name, installed_value
from ._tensors import is_numpy, torch_module

__all__ = ["MoELayer", "CheckpointLayer", "to_float32", "from_float32"]

# The weights' names: the library's (nvfp4moe_weights) and vLLM's FusedMoE parameter names.
_TENSOR_NAMES = {
    "w13": "w13", "w13_weight": "w13",
    "w13_scale": "w13_scale", "w13_weight_scale": "w13_scale",
    "w13_scale_2": "w13_scale_2", "w13_weight_scale_2": "w13_scale_2",
    "w13_up_scale_2": "w13_up_scale_2",
    "w13_input_scale": "w13_input_scale",
    "w2": "w2", "w2_weight": "w2",
    "w2_scale": "w2_scale", "w2_weight_scale": "w2_scale",
    "w2_scale_2": "w2_scale_2", "w2_weight_scale_2": "w2_scale_2",
    "w2_input_scale": "w2_input_scale",
    "w13_bias": "w13_bias", "w2_bias": "w2_bias",
    "correction_bias": "correction_bias", "e_score_correction_bias": "correction_bias",
}
_PER_EXPERT = ("w13_scale_2", "w13_up_scale_2", "w2_scale_2", "w13_input_scale", "w2_input_scale",
               "correction_bias")
_FLOAT_TENSORS = _PER_EXPERT + ("w13_bias", "w2_bias")


def _bad(message: str):
    return InvalidArgumentError(message, 1, "invalid argument")


# ---- the registry the torch op looks layers up in ----

_LAYERS = weakref.WeakValueDictionary()
_names = itertools.count()
_registry_lock = threading.Lock()


def lookup(name: str) -> "MoELayer":
    layer = _LAYERS.get(name)
    if layer is None:
        raise _bad(f"nvfp4moe layer '{name}' does not exist (any more): keep the MoELayer alive while the op runs")
    return layer


# ---- host memory the library owns, seen from numpy ----

class _HostView:
    """An array interface over library memory that keeps its owner alive while numpy uses it."""

    def __init__(self, owner, desc, typestr):
        self._owner = owner
        self.__array_interface__ = {"data": (desc["data"], True), "shape": tuple(desc["shape"]),
                                    "typestr": typestr, "version": 3}


_TYPESTR = {"u8": "|u1", "f8_e4m3": "|u1", "f32": "<f4"}


def _numpy():
    import numpy
    return numpy


def _host_array(owner, desc):
    """A read-only numpy view of a library tensor (FP8 scales as their uint8 codes)."""
    return _numpy().asarray(_HostView(owner, desc, _TYPESTR[desc["dtype"]]))


def to_float32(a, dtype: str):
    """A numpy array of layer dtype `dtype` ("bf16", "fp16": uint16 bit patterns or float16; "f32")
    as float32, converted by the library (exact)."""
    np = _numpy()
    code = _lib.DTYPE_CODES[dtype]
    a = np.ascontiguousarray(a)
    out = np.empty(a.shape, dtype=np.float32)
    _lib.load().nvfp4moe_to_float(code, a.ctypes.data, a.size, out.ctypes.data)
    return out


def from_float32(a, dtype: str):
    """float32 values as layer dtype `dtype`: uint16 bit patterns for "bf16", float16 for "fp16",
    float32 for "f32"; rounded to nearest even by the library."""
    np = _numpy()
    code = _lib.DTYPE_CODES[dtype]
    a = np.ascontiguousarray(a, dtype=np.float32)
    out = np.empty(a.shape, dtype={"bf16": np.uint16, "fp16": np.float16, "f32": np.float32}[dtype])
    _lib.load().nvfp4moe_from_float(code, a.ctypes.data, a.size, out.ctypes.data)
    return out


class CheckpointLayer:
    """One NVFP4 MoE layer read from a model directory (config.json + safetensors; ModelOpt
    per-expert or fused, or compressed-tensors), in the library's canonical layout.

    ``layer`` is the decoder layer number (None: the first MoE layer). The tensors stay in memory
    the library owns until this object and every array taken from it are gone.
    """

    def __init__(self, path, layer: int | None = None):
        status, handle, resp, message = _lib.call_json(
            "nvfp4moe_ckpt_layer_load_json", {"path": os.fspath(path), "layer": layer}, with_handle=True)
        if status:
            raise error_for(status, _lib.status_name(status), message)
        self._handle = handle
        self._info = resp
        self.path = os.fspath(path)

    def __del__(self):
        h, self._handle = getattr(self, "_handle", None), None
        if h and _lib is not None and _lib._lib is not None:
            _lib._lib.nvfp4moe_ckpt_layer_free(h)

    @property
    def index(self) -> int:
        """The decoder layer number."""
        return self._info["index"]

    @property
    def format(self) -> str:
        """"modelopt", "modelopt-fused" or "compressed-tensors"."""
        return self._info["format"]

    @property
    def config(self) -> dict:
        """The layer's deployment config (the library's key names)."""
        return dict(self._info["config"])

    @property
    def warnings(self) -> list:
        """What loading warned about (gate and up global scales that differ, ...)."""
        return list(self._info["warnings"])

    @property
    def router_name(self) -> str:
        return self._info["router_name"]

    @property
    def tensors(self) -> dict:
        """The weights as read-only numpy views (no copy): w13 [E, N1, H/2] uint8, w13_scale
        [E, N1, H/16] (E4M3 codes as uint8), w13_scale_2 [E] float32, w13_input_scale [E], w2 ...,
        and the biases when the layer has them."""
        return {k: _host_array(self, d) for k, d in self._info["tensors"].items()}

    @property
    def router_weight(self):
        """The router weight [E, H] as float32 (a read-only numpy view), or None."""
        d = self._info["router"]
        return _host_array(self, d) if d else None

    @property
    def router_bias(self):
        """The router bias [E] (gpt-oss), or None."""
        d = self._info["router_bias"]
        return _host_array(self, d) if d else None

    def router_logits(self, hidden):
        """The router logits [M, E] float32 of hidden states [M, H] (a numpy array: float32, or
        the layer's dtype as its bit patterns), as the library computes them: float64 sums of
        hidden @ router^T, plus the router bias, rounded to float32."""
        np = _numpy()
        if self._info["router"] is None:
            raise _bad(f"layer {self.index} of {self.path} has no router weight")
        x = np.asarray(hidden)
        cfg = self._info["config"]
        if x.ndim != 2 or x.shape[1] != cfg["hidden_size"]:
            raise _bad(f"hidden: shape {list(x.shape)}, expected [M, {cfg['hidden_size']}]")
        if x.dtype != np.float32:
            x = to_float32(x, cfg["in_dtype"])
        x = np.ascontiguousarray(x)
        out = np.empty((x.shape[0], cfg["num_experts"]), dtype=np.float32)
        status = _lib.load().nvfp4moe_ckpt_router_logits(self._handle, x.ctypes.data, x.shape[0], out.ctypes.data)
        if status:
            raise _lib.fail(status)
        return out


def _torch_device_ctx(device: str | None):
    """torch's device guard for cuda:N (so that the library's CUDA calls find that device current
    and torch's current device is restored after), or None."""
    torch = torch_module()
    if torch is None or not device or not device.startswith("cuda:"):
        return None
    return torch.cuda.device(int(device.split(":")[1]))


def _plan_device(device, tensor_device: str | None) -> str | None:
    """Where the plan runs: as asked (a bare "cuda" is torch's current GPU), else where the
    weights are, else torch's current GPU when torch has one, else the library's detection."""
    torch = torch_module()
    dev = device_name(device)
    if dev == "cuda" and torch is not None and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    if dev is not None:
        return dev
    if tensor_device and tensor_device.startswith("cuda"):
        return tensor_device
    if torch is not None and torch.cuda.is_available() and _lib.load().nvfp4moe_built_with_cuda():
        return f"cuda:{torch.cuda.current_device()}"
    return None


def _split_w13_scale_2(tensors):
    """vLLM's [E, 2] w13 global scales (gate, up): the gate's become w13_scale_2 and, where the
    halves differ in some expert, the up's w13_up_scale_2 (each half is applied with its own)."""
    s2 = tensors.get("w13_scale_2")
    if s2 is None or len(s2.shape) != 2 or s2.shape[1] != 2:
        return
    gate, up = s2[:, 0], s2[:, 1]
    if "w13_up_scale_2" in tensors:
        raise _bad("w13_up_scale_2 is given twice: as itself and as the second column of an [E, 2] w13_scale_2")
    tensors["w13_scale_2"] = gate
    if not bool((gate == up).all()):
        tensors["w13_up_scale_2"] = up


def _per_expert(name: str, x, experts: int):
    """A per-expert vector [E] from the shapes vLLM keeps: [E, 2] (gate and up) input scales are
    reduced to their maximum (GEMM1 quantizes its input once); a scalar or [1] is one value for every
    expert. Other float dtypes become float32."""
    np = _tensors.numpy_module()
    if is_numpy(x):
        if x.dtype != np.float32:
            x = x.astype(np.float32)
        if x.ndim == 2 and x.shape[1] == 2 and name == "w13_input_scale":
            x = x.max(axis=1)
        if x.size == 1 and experts > 1 and name != "correction_bias":
            x = np.full((experts,), x.reshape(()), dtype=np.float32)
        return x
    t = _tensors.as_torch(x, name)
    torch = torch_module()
    if t.dtype != torch.float32:
        t = t.float()
    if t.dim() == 2 and t.shape[1] == 2 and name == "w13_input_scale":
        t = t.amax(dim=1)
    if t.numel() == 1 and experts > 1 and name != "correction_bias":
        t = t.reshape(()).expand(experts)
    return t


def _to_float32(name, x):
    if is_numpy(x):
        np = _tensors.numpy_module()
        return x.astype(np.float32) if x.dtype != np.float32 else x
    t = _tensors.as_torch(x, name)
    torch = torch_module()
    return t.float() if t.dtype != torch.float32 else t


class MoELayer:
    """An NVFP4 MoE layer prepared on the backend vLLM's oracle (or ``backend``) picks.

    Make one with :meth:`from_checkpoint` or :meth:`from_tensors`; run it with
    ``layer(hidden, router_logits)`` or ``layer(hidden, topk_ids=..., topk_weights=...)``.
    ``backend`` and ``kernel`` say what runs; ``report`` is the oracle's full report.
    """

    def __init__(self, plan: int, response: dict, name: str | None):
        self._plan = plan
        self._lock = threading.Lock()
        self._cfg = response["config"]
        self.backend = response["backend"]
        self.kernel = response["kernel"]
        self.device_memory = bool(response["device_memory"])
        self.effective_scheme = response["effective_scheme"]
        self.device_info = response["device"]
        self.device = f"cuda:{self.device_info['ordinal']}" if self.device_memory else "cpu"
        self.report = Selection({"report": response["report"], "config": self._cfg, "device": response["device"]})
        self._router = None
        self._router_bias = None
        self._router_torch = {}
        with _registry_lock:
            if name is None:
                name = f"moe{next(_names)}"
            elif name in _LAYERS:
                raise _bad(f"name '{name}': another live MoELayer has it")
            self.name = name
            _LAYERS[name] = self
        _torch_op.maybe_register()

    # ---- construction ----

    @classmethod
    def _create(cls, request: dict, device: str | None, name: str | None) -> "MoELayer":
        if device is not None:
            request["device"] = device
        ctx = _torch_device_ctx(device)
        if ctx is not None:
            with ctx:
                status, handle, resp, message = _lib.call_json("nvfp4moe_plan_create_json", request, with_handle=True)
        else:
            status, handle, resp, message = _lib.call_json("nvfp4moe_plan_create_json", request, with_handle=True)
        if status:
            report = Selection(resp) if resp and "report" in resp else None
            if report is not None and report.error:
                message = report.error["message"]   # vLLM's words; the exception's class says which
            raise error_for(status, _lib.status_name(status), message, report)
        return cls(handle, resp, name)

    @staticmethod
    def _common(request, backend, installed, vllm_only, num_threads, deployment):
        if backend is not None:
            if "moe_backend" in deployment:
                raise TypeError("give backend= or moe_backend=, not both")
            deployment["moe_backend"] = backend
        if deployment:
            request["deployment"] = deployment
        if installed is not None:
            request["installed"] = installed_value(installed)
        if vllm_only:
            request["vllm_only"] = True
        if num_threads is not None:
            request["num_threads"] = int(num_threads)
        return request

    @classmethod
    def from_checkpoint(cls, path, layer: int | None = None, *, device=None, backend=None, config=None,
                        installed=None, vllm_only=False, num_threads=None, name=None, **deployment) -> "MoELayer":
        """The MoE layer ``layer`` (None: the first) of a model directory, on ``device`` ("cpu",
        "cuda", "cuda:N", a torch.device; None: torch's current GPU, else the library's choice),
        with ``backend`` (None or "auto": the oracle's choice; or a moe_backend name).

        ``config`` (a vLLM-like dict, read leniently) and deployment keywords (strict) go on top of
        the checkpoint's config, as for select(); keys that would change the weights' shapes are
        refused. ``installed``/``vllm_only`` are the oracle's options; ``num_threads`` the host
        backends' threads; ``name`` the layer's name in torch.ops.nvfp4moe.moe. Path may also be a
        CheckpointLayer."""
        ck = path if isinstance(path, CheckpointLayer) else CheckpointLayer(path, layer)
        request = {"base": ck._info["config"], "weights": ck._info["tensors"]}
        if config is not None:   # the checkpoint is the model: only the config's deployment keys
            request.update(deployment_request(config=config, model_from_config=False))
        cls._common(request, backend, installed, vllm_only, num_threads, dict(deployment))
        self = cls._create(request, _plan_device(device, None), name)
        np = _tensors.numpy_module()
        if ck._info["router"] is not None:
            if np is None:
                try:
                    np = _numpy()
                except ImportError:
                    np = None
            if np is not None:
                self._router = np.array(ck.router_weight)
                self._router_bias = np.array(ck.router_bias) if ck._info["router_bias"] else None
        return self

    @classmethod
    def from_tensors(cls, weights=None, /, *, device=None, backend=None, config=None, model=None, hf_config=None,
                     hf_quant_config=None, installed=None, vllm_only=False, num_threads=None, name=None,
                     **kwargs) -> "MoELayer":
        """A layer from NVFP4 tensors in ModelOpt's layout (torch tensors, CPU or CUDA, or numpy
        arrays), given as keywords or in ``weights`` (a dict, or an object with the tensors as
        attributes, such as a vLLM FusedMoE layer):

        w13 / w13_weight              [E, N1, H/2] uint8 (packed E2M1; N1 = 2I gate then up, or I)
        w13_scale / w13_weight_scale  [E, N1, H/16] float8_e4m3fn (or its uint8 codes)
        w13_scale_2 / w13_weight_scale_2  [E] float32 (dequantization form), or [E, 2] (gate, up)
        w13_up_scale_2                [E] float32: the up half's own (optional; else w13_scale_2's)
        w13_input_scale               [E] float32 (W4A4; [E, 2] gives the max of gate and up)
        w2 / w2_weight, w2_scale / w2_weight_scale, w2_scale_2 / w2_weight_scale_2, w2_input_scale
        w13_bias [E, N1], w2_bias [E, H], correction_bias / e_score_correction_bias [E]  (optional)

        The other keywords are deployment keys as for select() (top_k is required unless
        ``model``/``hf_config``/``config`` give it; E, H and I come from the tensors). CUDA
        tensors make a layer on their GPU. The plan keeps its own copy of the weights."""
        tensors, deployment = {}, {}
        if weights is not None:
            if isinstance(weights, Mapping):
                items = list(weights.items())
            else:
                # an object (a vLLM MoE layer): its weights and expert biases; a routing correction
                # bias only when passed by name (its routing is the caller's)
                items = [(k, getattr(weights, k)) for k in _TENSOR_NAMES
                         if _TENSOR_NAMES[k] != "correction_bias" and getattr(weights, k, None) is not None]
            for k, v in items:
                if k not in _TENSOR_NAMES:
                    raise _bad(f"weights: unknown tensor '{k}' (accepted: {', '.join(_TENSOR_NAMES)})")
                kwargs_key = _TENSOR_NAMES[k]
                if kwargs_key in tensors:
                    raise _bad(f"weights: {kwargs_key} is given twice (as '{k}')")
                tensors[kwargs_key] = v
        for k, v in kwargs.items():
            if k in _TENSOR_NAMES:
                if _TENSOR_NAMES[k] in tensors:
                    raise _bad(f"{k}: {_TENSOR_NAMES[k]} is given twice")
                tensors[_TENSOR_NAMES[k]] = v
            else:
                deployment[k] = v
        tensors = {k: v for k, v in tensors.items() if v is not None}
        if "w13" not in tensors:
            raise _bad("weights.w13 is missing")
        w13 = tensors["w13"]
        experts = int(w13.shape[0]) if len(w13.shape) else 0
        _split_w13_scale_2(tensors)
        for k in list(tensors):
            if k in _PER_EXPERT:
                tensors[k] = _per_expert(k, tensors[k], experts)
            elif k in _FLOAT_TENSORS:
                tensors[k] = _to_float32(k, tensors[k])
        descs, keep, tensor_device = {}, [], None
        for k, v in tensors.items():
            d, held = _tensors.descriptor(v, k)
            descs[k] = d
            keep.append(held)
            if tensor_device is None or d["device"] != "cpu":
                tensor_device = d["device"]
        request = deployment_request(config=config, model=model, hf_config=hf_config, hf_quant_config=hf_quant_config)
        request["weights"] = descs
        cls._common(request, backend, installed, vllm_only, num_threads, deployment)
        layer = cls._create(request, _plan_device(device, tensor_device), name)
        del keep  # the plan holds its own copy now
        return layer

    # ---- what it is ----

    @property
    def config(self) -> dict:
        """The layer's deployment config (the library's key names)."""
        return dict(self._cfg)

    num_experts = property(lambda self: self._cfg["num_experts"], doc="E")
    top_k = property(lambda self: self._cfg["top_k"], doc="experts per token")
    hidden_size = property(lambda self: self._cfg["hidden_size"], doc="H")
    intermediate_size = property(lambda self: self._cfg["intermediate_size"], doc="I")
    in_dtype = property(lambda self: self._cfg["in_dtype"], doc='hidden states: "bf16", "fp16" or "f32"')
    out_dtype = property(lambda self: self._cfg["out_dtype"], doc="output dtype")
    router_logits_dtype = property(lambda self: self._cfg["router_logits_dtype"], doc="router logits dtype")

    @property
    def router_weight(self):
        """From a checkpoint: the router weight [E, H] float32 (a numpy array), else None."""
        return self._router

    @property
    def router_bias(self):
        """From a checkpoint whose router has a bias: [E] float32, else None."""
        return self._router_bias

    def __repr__(self):
        c = self._cfg
        return (f"<nvfp4moe.MoELayer {self.name}: {self.backend} ({self.kernel}) on {self.device}, E={c['num_experts']} "
                f"top_k={c['top_k']} H={c['hidden_size']} I={c['intermediate_size']} {c['activation']} {c['scheme']}>")

    def close(self):
        """Frees the plan now (otherwise when the layer is garbage collected)."""
        plan, self._plan = getattr(self, "_plan", None), None
        if not plan or _lib is None or _lib._lib is None:
            return
        ctx = None
        try:
            ctx = _torch_device_ctx(self.device) if self.device_memory else None
        except Exception:
            ctx = None
        if ctx is not None:
            with ctx:
                _lib._lib.nvfp4moe_plan_destroy(plan)
        else:
            _lib._lib.nvfp4moe_plan_destroy(plan)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- running ----

    def router_logits(self, hidden):
        """Router logits of a checkpoint layer: hidden @ router_weight^T (+ router_bias) in float32,
        in the layer's router_logits_dtype; torch tensors (on their device) or numpy arrays in,
        the same kind out."""
        if self._router is None:
            raise _bad("this layer has no router weight (it was not made from a checkpoint that has one)")
        if is_numpy(hidden):
            np = _numpy()
            x = hidden if hidden.dtype == np.float32 else to_float32(hidden, self._cfg["in_dtype"])
            y = x @ self._router.T
            if self._router_bias is not None:
                y = y + self._router_bias
            return from_float32(y, self._cfg["router_logits_dtype"])
        h = _tensors.as_torch(hidden, "hidden")
        torch = torch_module()
        key = str(h.device)
        if key not in self._router_torch:
            w = torch.from_numpy(self._router).to(h.device)
            b = torch.from_numpy(self._router_bias).to(h.device) if self._router_bias is not None else None
            self._router_torch[key] = (w, b)
        w, b = self._router_torch[key]
        y = h.float() @ w.t()
        if b is not None:
            y = y + b
        return y.to(_tensors.torch_dtype(self._cfg["router_logits_dtype"]))

    def __call__(self, hidden, router_logits=None, *, topk_ids=None, topk_weights=None):
        """The layer's output [M, H] for hidden states [M, H] and either router logits [M, E] or
        precomputed routing (topk_ids [M, top_k] int32 or int64, topk_weights [M, top_k] float32).

        torch tensors run through torch.ops.nvfp4moe.moe on torch's current CUDA stream (or on the
        CPU) and give a torch tensor; numpy arrays (host layers) give a numpy array."""
        # The path torch.compile traces: plain isinstance checks and the op, nothing dynamo must
        # step around (the op is registered by the first eager call, or when nvfp4moe sees torch).
        op, torch = _torch_op._op, _torch_op._torch
        if op is not None and isinstance(hidden, torch.Tensor) \
                and (router_logits is None or isinstance(router_logits, torch.Tensor)) \
                and (topk_ids is None or isinstance(topk_ids, torch.Tensor)) \
                and (topk_weights is None or isinstance(topk_weights, torch.Tensor)):
            return op(hidden, router_logits, topk_ids, topk_weights, self.name)
        if is_numpy(hidden) and not self.device_memory:
            return self._forward_numpy(hidden, router_logits, topk_ids, topk_weights)
        torch_hidden = _tensors.as_torch(hidden, "hidden") if not is_numpy(hidden) else None
        if torch_hidden is None:
            raise _bad(f"hidden: a numpy array, but this layer runs on {self.device}: pass torch CUDA tensors")
        conv = [None if a is None else (self._torch_from_numpy(a) if is_numpy(a) else _tensors.as_torch(a, n))
                for a, n in ((router_logits, "router_logits"), (topk_ids, "topk_ids"), (topk_weights, "topk_weights"))]
        try:
            op = _torch_op.register()
        except _torch_op.TorchTooOld:   # no custom ops in this torch: the same forward, without the op
            return self._forward_torch(torch_hidden, conv[0], conv[1], conv[2])
        return op(torch_hidden, conv[0], conv[1], conv[2], self.name)

    # the torch dtypes of the layer's dtypes (torch is imported by then)
    _torch_in = property(lambda self: _tensors.torch_dtype(self._cfg["in_dtype"]))
    _torch_out = property(lambda self: _tensors.torch_dtype(self._cfg["out_dtype"]))
    _torch_logits = property(lambda self: _tensors.torch_dtype(self._cfg["router_logits_dtype"]))

    @staticmethod
    def _torch_from_numpy(a):
        import torch
        return torch.from_numpy(a)

    def _run(self, m, hidden, logits, ids, weights, out, ws, ws_size, stream):
        with self._lock:
            if not self._plan:
                raise _bad(f"layer {self.name} was closed")
            status = _lib.load().nvfp4moe_plan_run(self._plan, m, hidden, logits, ids, weights, out, ws, ws_size,
                                                   stream)
            if status:
                raise _lib.fail(status)

    def _workspace_size(self, m: int) -> int:
        return int(_lib.load().nvfp4moe_plan_workspace_size(self._plan, m))

    def _check_routing_args(self, router_logits, topk_ids, topk_weights):
        if topk_ids is not None or topk_weights is not None:
            if topk_ids is None or topk_weights is None:
                raise _bad("topk_ids and topk_weights go together")
            if router_logits is not None:
                raise _bad("give router_logits or topk_ids/topk_weights, not both")
        elif router_logits is None and self._cfg["routing"] != "simulated":
            raise _bad("router_logits is missing (or give topk_ids and topk_weights)")

    def _check_torch(self, hidden, router_logits, topk_ids, topk_weights):
        """Shapes, dtypes and devices (works on fake tensors too: torch.compile's tracing)."""
        torch = torch_module()
        c = self._cfg
        self._check_routing_args(router_logits, topk_ids, topk_weights)
        if hidden.dim() != 2 or hidden.shape[1] != c["hidden_size"]:
            raise _bad(f"hidden: shape {list(hidden.shape)}, expected [M, {c['hidden_size']}]")
        if hidden.dtype != self._torch_in:
            raise _bad(f"hidden: dtype {hidden.dtype}, the layer takes {self._torch_in} (in_dtype {c['in_dtype']})")
        where = hidden.device
        if self.device_memory:
            if where.type != "cuda" or where.index != self.device_info["ordinal"]:
                raise _bad(f"hidden is on {where}, the layer runs on {self.device}")
        elif where.type != "cpu":
            raise _bad(f"hidden is on {where}, the layer runs on the host ({self.backend}): pass CPU tensors")
        m = hidden.shape[0]

        def check(t, what, cols, dtypes, dtype_desc):
            if t.dim() != 2 or t.shape[0] != m or t.shape[1] != cols:
                raise _bad(f"{what}: shape {list(t.shape)}, expected [{m}, {cols}]")
            if t.dtype not in dtypes:
                raise _bad(f"{what}: dtype {t.dtype}, expected {dtype_desc}")
            if t.device != where:
                raise _bad(f"{what} is on {t.device}, hidden on {where}")

        if router_logits is not None:
            check(router_logits, "router_logits", c["num_experts"], (self._torch_logits,),
                  f"{self._torch_logits} (router_logits_dtype {c['router_logits_dtype']})")
        if topk_ids is not None:
            check(topk_ids, "topk_ids", c["top_k"], (torch.int32, torch.int64), "torch.int32 or torch.int64")
            check(topk_weights, "topk_weights", c["top_k"], (torch.float32,), "torch.float32")

    def _forward_torch(self, hidden, router_logits, topk_ids, topk_weights):
        torch = torch_module()
        self._check_torch(hidden, router_logits, topk_ids, topk_weights)
        hidden = hidden.contiguous()
        if topk_ids is not None:
            topk_ids = (topk_ids.to(torch.int32) if topk_ids.dtype != torch.int32 else topk_ids).contiguous()
            topk_weights = topk_weights.contiguous()
        if router_logits is not None:
            router_logits = router_logits.contiguous()
        m = hidden.shape[0]
        out = torch.empty((m, self._cfg["hidden_size"]), dtype=self._torch_out, device=hidden.device)
        if m == 0:
            return out
        ws_size = self._workspace_size(m)
        ws = torch.empty(ws_size, dtype=torch.uint8, device=hidden.device) if ws_size else None

        def ptr(t):
            return t.data_ptr() if t is not None else None

        args = (m, ptr(hidden), ptr(router_logits), ptr(topk_ids), ptr(topk_weights), ptr(out), ptr(ws), ws_size)
        if self.device_memory:
            ordinal = self.device_info["ordinal"]
            stream = torch.cuda.current_stream(hidden.device).cuda_stream
            if torch.cuda.current_device() != ordinal:
                with torch.cuda.device(ordinal):
                    self._run(*args, stream)
            else:
                self._run(*args, stream)
        else:
            self._run(*args, None)
        return out

    def _forward_numpy(self, hidden, router_logits, topk_ids, topk_weights):
        np = _numpy()
        c = self._cfg
        self._check_routing_args(router_logits, topk_ids, topk_weights)

        def check(a, what, cols, dtypes, dtype_desc, m=None):
            if not is_numpy(a):
                raise _bad(f"{what}: expected a numpy array like hidden, got {type(a).__name__}")
            if a.ndim != 2 or (m is not None and a.shape[0] != m) or a.shape[1] != cols:
                raise _bad(f"{what}: shape {list(a.shape)}, expected [{'M' if m is None else m}, {cols}]")
            if a.dtype not in [np.dtype(d) for d in dtypes]:
                raise _bad(f"{what}: dtype {a.dtype}, expected {dtype_desc}")
            return np.ascontiguousarray(a)

        desc = {"bf16": "uint16 (bf16 bit patterns)", "fp16": "float16 or uint16 bit patterns", "f32": "float32"}
        hidden = check(hidden, "hidden", c["hidden_size"], _tensors.numpy_dtypes(c["in_dtype"]),
                       f"{desc[c['in_dtype']]} (in_dtype {c['in_dtype']})")
        m = hidden.shape[0]
        if router_logits is not None:
            router_logits = check(router_logits, "router_logits", c["num_experts"],
                                  _tensors.numpy_dtypes(c["router_logits_dtype"]),
                                  f"{desc[c['router_logits_dtype']]} (router_logits_dtype {c['router_logits_dtype']})", m)
        if topk_ids is not None:
            topk_ids = check(topk_ids, "topk_ids", c["top_k"], (np.int32, np.int64), "int32 or int64", m)
            topk_ids = np.ascontiguousarray(topk_ids, dtype=np.int32)
            topk_weights = check(topk_weights, "topk_weights", c["top_k"], (np.float32,), "float32", m)
        out = np.empty((m, c["hidden_size"]), dtype={"bf16": np.uint16, "fp16": np.float16, "f32": np.float32}[c["out_dtype"]])
        if m == 0:
            return out
        ws_size = self._workspace_size(m)
        ws = np.empty(ws_size, dtype=np.uint8) if ws_size else None

        def ptr(a):
            return a.ctypes.data if a is not None else None

        self._run(m, ptr(hidden), ptr(router_logits), ptr(topk_ids), ptr(topk_weights), ptr(out), ptr(ws), ws_size, None)
        return out
