"""Finding and loading libnvfp4moe.so, and calling it.

The package talks to the library through its JSON interface (requests and responses as JSON
texts) and a few functions of plain arguments; it never reads or builds a C struct.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

from ._errors import LibraryNotFoundError, error_for

ENV_LIBRARY = "NVFP4MOE_LIBRARY"
__version__ = "0.1.0"

# nvfp4moe_dtype values (include/nvfp4moe.h), checked against nvfp4moe_dtype_name at load time.
DTYPE_CODES = {"bf16": 0, "fp16": 1, "f32": 2}

_lock = threading.Lock()
_lib = None
_path = None


def _checkout_root() -> Path | None:
    """The source checkout this package lives in (python/nvfp4moe/ of it), if it is one."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "include" / "nvfp4moe.h").is_file() else None


def _pkg_config_libdir() -> str | None:
    exe = shutil.which("pkg-config")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "--variable=libdir", "nvfp4moe"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    out = r.stdout.strip()
    return out if r.returncode == 0 and out else None


def _candidates():
    """(where, path) pairs in the order they are tried; path may be a bare soname for the loader."""
    env = os.environ.get(ENV_LIBRARY)
    if env:
        p = Path(env)
        if p.is_dir():
            p = p / "libnvfp4moe.so"
        yield f"${ENV_LIBRARY}", str(p)
        return  # set explicitly: nothing else
    root = _checkout_root()
    if root is not None:
        yield "the checkout's build directory", str(root / "build" / "libnvfp4moe.so")
    libdir = _pkg_config_libdir()
    if libdir:
        yield "pkg-config nvfp4moe", str(Path(libdir) / "libnvfp4moe.so.0")
    yield "the dynamic loader's search path", "libnvfp4moe.so.0"


def _declare(lib):
    c = ctypes
    vp, sz, i64 = c.c_void_p, c.c_size_t, c.c_int64
    protos = {
        "nvfp4moe_version": (c.c_char_p, []),
        "nvfp4moe_vllm_revision": (c.c_char_p, []),
        "nvfp4moe_built_with_cuda": (c.c_bool, []),
        "nvfp4moe_last_error": (c.c_char_p, []),
        "nvfp4moe_status_str": (c.c_char_p, [c.c_int]),
        "nvfp4moe_dtype_name": (c.c_char_p, [c.c_int]),
        "nvfp4moe_json_free": (None, [vp]),
        "nvfp4moe_select_json": (c.c_int, [c.c_char_p, c.POINTER(vp)]),
        "nvfp4moe_plan_create_json": (c.c_int, [c.c_char_p, c.POINTER(vp), c.POINTER(vp)]),
        "nvfp4moe_ckpt_layer_load_json": (c.c_int, [c.c_char_p, c.POINTER(vp), c.POINTER(vp)]),
        "nvfp4moe_plan_run": (c.c_int, [vp, i64, vp, vp, vp, vp, vp, vp, sz, vp]),
        "nvfp4moe_plan_workspace_size": (sz, [vp, i64]),
        "nvfp4moe_plan_destroy": (None, [vp]),
        "nvfp4moe_ckpt_layer_free": (None, [vp]),
        "nvfp4moe_ckpt_router_logits": (c.c_int, [vp, vp, i64, vp]),
        "nvfp4moe_to_float": (None, [c.c_int, vp, i64, vp]),
        "nvfp4moe_from_float": (None, [c.c_int, vp, i64, vp]),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)  # AttributeError: a library older than this package
        fn.restype = restype
        fn.argtypes = argtypes


def load():
    """The loaded library (found on the first call)."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for where, path in _candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append(f"{where}: {path} (no such file)")
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append(f"{where}: {path} ({e})")
                continue
            try:
                _declare(lib)
            except AttributeError as e:
                tried.append(f"{where}: {path} (too old for this package: {e})")
                continue
            version = lib.nvfp4moe_version().decode()
            if version.split(".")[0] != __version__.split(".")[0]:
                tried.append(f"{where}: {path} (version {version}, this package is {__version__})")
                continue
            for name, code in DTYPE_CODES.items():
                if lib.nvfp4moe_dtype_name(code).decode() != name:
                    raise LibraryNotFoundError(f"{path}: its dtype codes differ from this package's")
            _lib, _path = lib, path
            return lib
        raise LibraryNotFoundError(
            "libnvfp4moe.so was not found. Build it (make) in the checkout, install it (make install), or set "
            f"{ENV_LIBRARY} to its path. Tried:\n  " + "\n  ".join(tried))


def library_path() -> str:
    """Where the library in use was loaded from (as it was found: a path, or a soname the dynamic
    loader resolved)."""
    load()
    return _path


def last_error() -> str:
    return load().nvfp4moe_last_error().decode(errors="replace")


def status_name(status: int) -> str:
    return load().nvfp4moe_status_str(status).decode()


def fail(status: int, report=None):
    """The exception for a failed call (the message is the calling thread's last error)."""
    return error_for(status, status_name(status), last_error(), report)


def _default(o):
    """JSON for values json does not know: numpy scalars, dtypes, paths."""
    item = getattr(o, "item", None)
    if callable(item) and getattr(o, "shape", None) == ():
        return item()
    mod = type(o).__module__
    if mod.startswith("torch") and type(o).__name__ == "dtype":
        return str(o)
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    if mod.startswith("numpy") and type(o).__name__.startswith("dtype"):
        return str(o)
    raise TypeError(f"{type(o).__name__} value {o!r} cannot be passed to nvfp4moe (expected a number, a string, "
                    "a bool, None, a list or a dict)")


def dumps(request: dict) -> bytes:
    try:
        return json.dumps(request, default=_default, allow_nan=False).encode()
    except ValueError as e:  # NaN / infinity
        raise error_for(1, "invalid argument", f"the request holds a non-finite number: {e}") from None


def _take(p: ctypes.c_void_p):
    """Reads and frees a response of the JSON interface."""
    if not p.value:
        return None
    try:
        return json.loads(ctypes.string_at(p.value).decode())
    finally:
        load().nvfp4moe_json_free(p)


def call_json(fn_name: str, request: dict, with_handle: bool):
    """Calls a JSON-interface function: returns (status, handle, response); handle is None when
    the function has none or failed."""
    lib = load()
    fn = getattr(lib, fn_name)
    req = dumps(request)
    resp = ctypes.c_void_p()
    if with_handle:
        handle = ctypes.c_void_p()
        status = fn(req, ctypes.byref(handle), ctypes.byref(resp))
    else:
        handle = None
        status = fn(req, ctypes.byref(resp))
    # the message first: reading the response runs no library code that fails, but keep the order safe
    message = last_error() if status else ""
    response = _take(resp)
    return status, (handle.value if handle is not None and handle.value else None), response, message
