"""select() and explain(): which NVFP4 MoE backend vLLM's oracle picks for a deployment, and why."""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
from pathlib import Path

from . import _lib
from ._errors import NotFoundError, error_for

__all__ = ["Selection", "select", "explain"]


class Selection(dict):
    """The oracle's report: the object ``nvfp4moe select --json`` prints, as a dict

    (``backend``, ``kernel``, ``log``, ``device``, ``detail``, ``vllm_revision``, ``candidates``,
    ``error``), with

    - ``text``: the report as ``nvfp4moe select`` prints it (also ``str(selection)``);
    - ``config``: the deployment that was planned, with the library's key names;
    - ``device_info``: the device planned for (name, sm, is_cuda, ...);
    - ``warnings``: what reading the model's config warned about.
    """

    def __init__(self, response: dict):
        super().__init__(response["report"])
        self.text = response.get("text", "")
        self.config = response.get("config")
        self.device_info = response.get("device")
        self.warnings = list(response.get("warnings", []))
        self._status = response.get("status", 0)
        self._status_name = response.get("status_name", "")

    @property
    def backend(self):
        """The chosen backend ("MARLIN"), or None when nothing was chosen."""
        return self["backend"]

    @property
    def kernel(self):
        """The chosen kernel class ("MarlinExperts"), or None."""
        return self["kernel"]

    @property
    def error(self):
        """None, or {"kind": "ValueError" | "NotImplementedError", "message": ...}: vLLM's exception."""
        return self["error"]

    def raise_for_error(self):
        """Raises vLLM's exception (BackendError, a ValueError, or NoBackendError, a
        NotImplementedError) when the oracle raised one."""
        if self["error"]:
            raise error_for(self._status, self._status_name, self["error"]["message"], self)
        return self

    def __str__(self):
        return self.text

    def __repr__(self):
        if self["backend"]:
            return f"<Selection {self['backend']} ({self['kernel']}) on {self['device']}>"
        err = self["error"] or {}
        return f"<Selection none on {self['device']}: {err.get('kind')}>"


# ---- request building (shared with the layers) ----

def device_name(device) -> str | None:
    """The request's device: None (detect), "cpu", "cuda[:N]", or a what-if name. Accepts a
    torch.device, an int (a CUDA ordinal) and strings."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise TypeError("device: expected a name, an int or a torch.device")
    if isinstance(device, int):
        return f"cuda:{device}"
    if type(device).__module__.startswith("torch") and type(device).__name__ == "device":
        if device.type == "cuda":
            return f"cuda:{device.index}" if device.index is not None else "cuda"
        return str(device.type)
    if not isinstance(device, str):
        raise TypeError(f"device: expected a name, an int or a torch.device, got {type(device).__name__}")
    return device


def installed_value(installed):
    if installed is None or isinstance(installed, str):
        return installed
    return [str(x) for x in installed]


_SECTIONS = ("parallel_config", "kernel_config", "model_config")
_SCALARS = (str, int, float, bool, type(None))


def _plain(v):
    """A config value as JSON can carry it, or a marker to leave it out (lenient reading)."""
    if isinstance(v, _SCALARS):
        return v
    mod = type(v).__module__
    if mod.startswith("torch") and type(v).__name__ == "dtype":
        return str(v)
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    item = getattr(v, "item", None)
    if callable(item) and getattr(v, "shape", None) == ():
        return item()
    if isinstance(v, enum.Enum) and isinstance(v.value, _SCALARS):
        return v.value
    return _SKIP


_SKIP = object()


def _config_dict(obj, depth=0) -> dict:
    """A vLLM-like config (a dict, EngineArgs, VllmConfig or another dataclass) as a plain dict of
    what JSON can carry; the library reads it leniently."""
    if isinstance(obj, dict):
        items = obj.items()
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items = ((f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj))
    else:
        raise TypeError(f"config: expected a dict or a vLLM config object, got {type(obj).__name__}")
    out = {}
    for k, v in items:
        if not isinstance(k, str):
            continue
        if k in _SECTIONS and depth == 0 and v is not None and not isinstance(v, _SCALARS):
            out[k] = _config_dict(v, depth + 1) if (isinstance(v, dict) or dataclasses.is_dataclass(v)) else {}
            continue
        if k == "lora_config":  # an object turns LoRA on
            out[k] = None if v is None else {}
            continue
        p = _plain(v)
        if p is not _SKIP:
            out[k] = p
    return out


def _hf_config_of(obj):
    """The Hugging Face config a vLLM config carries (model_config.hf_text_config / hf_config), as
    a dict, or None."""
    mc = obj.get("model_config") if isinstance(obj, dict) else getattr(obj, "model_config", None)
    if mc is None:
        return None
    for name in ("hf_text_config", "hf_config"):
        hf = mc.get(name) if isinstance(mc, dict) else getattr(mc, name, None)
        if isinstance(hf, dict):
            return hf
        to_dict = getattr(hf, "to_dict", None)
        if callable(to_dict):
            d = to_dict()
            if isinstance(d, dict):
                return d
    return None


def _model_of(obj):
    """The model a vLLM config names (model, or model_config.model)."""
    m = obj.get("model") if isinstance(obj, dict) else getattr(obj, "model", None)
    if isinstance(m, (str, os.PathLike)):
        return m
    mc = obj.get("model_config") if isinstance(obj, dict) else getattr(obj, "model_config", None)
    if mc is not None:
        m = mc.get("model") if isinstance(mc, dict) else getattr(mc, "model", None)
        if isinstance(m, (str, os.PathLike)):
            return m
    return None


def hub_cache() -> Path:
    """Hugging Face's hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def resolve_model(model, download: bool = True) -> str:
    """A model directory: the path itself, or a Hugging Face model id ("org/name") found in the hub
    cache (the snapshot refs/main names, else the newest one with a config.json); failing that,
    when huggingface_hub is installed and download is true, its config files are fetched."""
    p = Path(os.fspath(model)).expanduser()
    if p.is_dir():
        return str(p)
    name = os.fspath(model)
    if p.exists():
        raise NotFoundError(f"model '{name}' is not a directory", 4, "not found")
    cache = hub_cache()
    repo = cache / ("models--" + name.replace("/", "--"))
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        snaps = repo / "snapshots"
        ref = repo / "refs" / "main"
        if ref.is_file():
            snap = snaps / ref.read_text().strip()
            if (snap / "config.json").is_file():
                return str(snap)
        if snaps.is_dir():
            found = sorted((s for s in snaps.iterdir() if (s / "config.json").is_file()),
                           key=lambda s: (s / "config.json").stat().st_mtime, reverse=True)
            if found:
                return str(found[0])
        if download:
            try:
                import huggingface_hub  # optional
            except ImportError:
                huggingface_hub = None
            if huggingface_hub is not None:
                try:
                    path = huggingface_hub.snapshot_download(name, allow_patterns=["config.json", "hf_quant_config.json"])
                    return str(path)
                except Exception as e:  # offline, unknown repository, no access: say so, with the cache
                    raise NotFoundError(
                        f"model '{name}': not a directory, not in the Hugging Face cache ({cache}), and "
                        f"huggingface_hub could not fetch its config files ({type(e).__name__}: {e}); download it "
                        "(or its config.json) first, or pass hf_config=", 4, "not found") from e
    raise NotFoundError(
        f"model '{name}': not a directory, and not in the Hugging Face cache ({cache}); download it (or its "
        "config.json) first, or pass hf_config=", 4, "not found")


def deployment_request(config=None, model=None, hf_config=None, hf_quant_config=None, deployment=None,
                       model_from_config=True) -> dict:
    """The deployment sources of a JSON request (a vLLM config also gives the model, through its
    model_config.hf_config or its model path, unless model_from_config is false)."""
    req = {}
    if config is not None:
        if hf_config is None and model is None and model_from_config:
            hf_config = _hf_config_of(config)
            if hf_config is None:
                model = _model_of(config)
                if model is not None:
                    try:
                        model = resolve_model(model, download=False)
                    except NotFoundError:
                        model = None  # a config's model that is not here: its keys still count
        req["config"] = _config_dict(config)
    if model is not None:
        req["model"] = resolve_model(model)
    if hf_config is not None:
        if not isinstance(hf_config, dict):
            to_dict = getattr(hf_config, "to_dict", None)
            hf_config = to_dict() if callable(to_dict) else _config_dict(hf_config)
        req["hf_config"] = hf_config
        if hf_quant_config is not None:
            req["hf_quant_config"] = hf_quant_config
    elif hf_quant_config is not None:
        req["hf_quant_config"] = hf_quant_config
    if deployment:
        req["deployment"] = {k: v for k, v in deployment.items()}
    return req


# ---- the functions ----

def select(config=None, /, *, model=None, hf_config=None, hf_quant_config=None, device=None, installed=None,
           vllm_only=False, check=False, **deployment) -> Selection:
    """Which NVFP4 MoE backend and kernel vLLM's oracle chooses for a deployment, and why.

    Returns a :class:`Selection`: the object ``nvfp4moe select --json`` prints. An oracle
    exception (vLLM's ValueError or NotImplementedError) is in ``selection["error"]``; with
    ``check=True`` it is raised instead (:class:`BackendError` / :class:`NoBackendError`).

    config           a vLLM-like config: a dict of engine arguments or VllmConfig sections, or such
                     an object; read leniently (keys nvfp4moe does not know are ignored)
    model            a model directory or a Hugging Face model id in the local hub cache: its
                     config.json (and hf_quant_config.json) give the layer
    hf_config        or the config.json contents as a dict (hf_quant_config: hf_quant_config.json's)
    device           a GPU to plan for ("h200", "b200", "sm_100", "NVIDIA H100 80GB HBM3", "cpu"),
                     or "cuda" / "cuda:N" / a torch.device for this machine's; None: detect
    installed        plan as if these libraries were present: "all", "none", "flashinfer,b12x" or a
                     list; None: what this build has
    vllm_only        only vLLM's backends (none of nvfp4moe's own)
    **deployment     deployment keys, vLLM's names or the library's, read strictly
                     (moe_backend, tensor_parallel_size, data_parallel_size,
                     enable_expert_parallel, all2all_backend, enable_eplb, num_experts, top_k,
                     hidden_size, intermediate_size, dtype, activation, swiglu_limit, routing,
                     scheme, ...; docs/python.md lists them all)
    """
    req = deployment_request(config, model, hf_config, hf_quant_config, deployment)
    dev = device_name(device)
    if dev is not None:
        req["device"] = dev
    if installed is not None:
        req["installed"] = installed_value(installed)
    if vllm_only:
        req["vllm_only"] = True
    status, _, response, message = _lib.call_json("nvfp4moe_select_json", req, with_handle=False)
    if response is None:
        raise error_for(status, _lib.status_name(status), message)
    sel = Selection(response)
    if check:
        sel.raise_for_error()
    return sel


def explain(config=None, /, *, file=None, **kwargs) -> Selection:
    """select() with the same arguments, printing the report as ``nvfp4moe select`` does (to
    ``file``, default sys.stdout): the decision, vLLM's log line or exception, and every backend's
    verdict and reason. Returns the Selection."""
    sel = select(config, **kwargs)
    out = file if file is not None else sys.stdout
    for w in sel.warnings:
        print(f"warning: {w}", file=out)
    out.write(sel.text)
    return sel
