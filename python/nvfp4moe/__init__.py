"""nvfp4moe for Python: vLLM's NVFP4 MoE backend choice, and NVFP4 MoE layers on torch tensors.

    import nvfp4moe
    nvfp4moe.explain(model="nvidia/DeepSeek-R1-FP4", device="b200", tensor_parallel_size=8,
                     enable_expert_parallel=True, installed="all")
    layer = nvfp4moe.MoELayer.from_checkpoint("demo-nvfp4", device="cuda")
    out = layer(hidden, router_logits)            # torch.ops.nvfp4moe.moe on the current stream

A pure-Python package over libnvfp4moe.so (found through $NVFP4MOE_LIBRARY, the checkout's
build/ directory, pkg-config, or the dynamic loader). torch and numpy are optional and imported
only when used. docs/python.md has the whole API.
"""

from ._errors import (BackendError, BufferTooSmallError, CudaError, Error, FileError, FormatError,
                      InternalError, InvalidArgumentError, LibraryNotFoundError, NoBackendError, NotFoundError,
                      OutOfMemoryError, ShapeError, UnsupportedError)
from ._lib import __version__, library_path
from ._layer import CheckpointLayer, MoELayer, from_float32, to_float32
from ._oracle import Selection, explain, select
from . import _lib as _lib_module
from . import _torch_op

__all__ = [
    "select", "explain", "Selection", "MoELayer", "CheckpointLayer", "register_torch_op", "library_path",
    "library_version", "vllm_revision", "built_with_cuda", "to_float32", "from_float32", "__version__",
    "Error", "InvalidArgumentError", "ShapeError", "UnsupportedError", "NotFoundError", "FileError", "FormatError",
    "OutOfMemoryError", "CudaError", "BufferTooSmallError", "InternalError", "BackendError", "NoBackendError",
    "LibraryNotFoundError",
]


def library_version() -> str:
    """The library's version and build: "0.1.0 (cuda)" or "0.1.0 (cpu-only)"."""
    return _lib_module.load().nvfp4moe_version().decode()


def vllm_revision() -> str:
    """The vLLM revision whose oracle the library mirrors."""
    return _lib_module.load().nvfp4moe_vllm_revision().decode()


def built_with_cuda() -> bool:
    """True when the library has its CUDA backends."""
    return bool(_lib_module.load().nvfp4moe_built_with_cuda())


def register_torch_op():
    """Registers torch.ops.nvfp4moe.moe (imports torch) and returns it. Done by itself when nvfp4moe
    is imported after torch, and the first time a layer is called with a torch tensor."""
    return _torch_op.register()


_torch_op.maybe_register()
