"""Arrays as the library sees them: an address, a shape, a dtype and a device, without copies.

torch tensors (CPU or CUDA) and numpy arrays are read directly; objects with
``__cuda_array_interface__`` or ``__dlpack__`` go through torch (``torch.as_tensor`` /
``torch.from_dlpack``, both zero-copy). torch and numpy are imported only when such an object is
seen.
"""

from __future__ import annotations

import sys

from ._errors import InvalidArgumentError


def torch_module():
    """torch when it has been imported already (nvfp4moe never imports it for an object that is
    not a torch tensor)."""
    return sys.modules.get("torch")


def numpy_module():
    return sys.modules.get("numpy")


def is_torch(x) -> bool:
    t = torch_module()
    return t is not None and isinstance(x, t.Tensor)


def is_numpy(x) -> bool:
    np = numpy_module()
    return np is not None and isinstance(x, np.ndarray)


def as_torch(x, what: str):
    """x as a torch tensor, zero-copy: torch tensors as they are, CUDA-array-interface and DLPack
    objects through torch."""
    if is_torch(x):
        return x
    if hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack__"):
        import torch
        return torch.as_tensor(x) if hasattr(x, "__cuda_array_interface__") else torch.from_dlpack(x)
    raise TypeError(f"{what}: expected a torch tensor, a numpy array or an array with __cuda_array_interface__ "
                    f"or __dlpack__, got {type(x).__name__}")


# dtype names of the JSON interface's tensors and of the layer's config
_TORCH_NAMES = {
    "uint8": "u8", "int8": "i8", "float8_e4m3fn": "f8_e4m3", "float32": "f32", "bfloat16": "bf16",
    "float16": "fp16", "int32": "i32", "int64": "i64", "float64": "f64", "float4_e2m1fn_x2": "u8",
}
_NUMPY_NAMES = {
    "uint8": "u8", "int8": "i8", "float32": "f32", "float16": "fp16", "int32": "i32", "int64": "i64",
    "float64": "f64", "uint16": "u16",
}


def torch_dtype_name(dtype) -> str:
    return _TORCH_NAMES.get(str(dtype).replace("torch.", ""), str(dtype).replace("torch.", ""))


def numpy_dtype_name(dtype) -> str:
    return _NUMPY_NAMES.get(str(dtype), str(dtype))


_TORCH_DTYPES = {}


def torch_dtype(name: str):
    """The torch dtype of a layer dtype name ("bf16", "fp16", "f32")."""
    if not _TORCH_DTYPES:
        import torch
        _TORCH_DTYPES.update(bf16=torch.bfloat16, fp16=torch.float16, f32=torch.float32)
    return _TORCH_DTYPES[name]


def numpy_dtypes(name: str):
    """The numpy dtypes that hold a layer dtype: bf16 and fp16 as their uint16 bit patterns, fp16
    also as float16, f32 as float32."""
    import numpy as np
    return {"bf16": (np.uint16,), "fp16": (np.float16, np.uint16), "f32": (np.float32,)}[name]


def device_of(x) -> str:
    """ "cpu" or "cuda:N" for a torch tensor or a numpy array."""
    if is_torch(x):
        if x.device.type == "cuda":
            return f"cuda:{x.device.index}"
        if x.device.type != "cpu":
            raise InvalidArgumentError(f"tensors on device '{x.device}' are not supported (cpu or cuda)", 1,
                                       "invalid argument")
        return "cpu"
    return "cpu"


def descriptor(x, what: str):
    """(descriptor, keep): the JSON interface's tensor for x, made contiguous first when it is not
    (a copy, which keep holds until the library has read it)."""
    if is_numpy(x):
        import numpy as np
        x = np.ascontiguousarray(x)
        d = {"data": int(x.ctypes.data), "shape": [int(s) for s in x.shape],
             "dtype": numpy_dtype_name(x.dtype), "device": "cpu"}
        return d, x
    x = as_torch(x, what).detach()
    if not x.is_contiguous():
        x = x.contiguous()
    d = {"data": int(x.data_ptr()), "shape": [int(s) for s in x.shape], "dtype": torch_dtype_name(x.dtype),
         "device": device_of(x)}
    return d, x
