"""torch.ops.nvfp4moe.moe: the layers' forward as a torch.library custom op.

Registered the first time it is needed (a layer called with a torch tensor, or register()), so
that importing nvfp4moe never imports torch. The op names its layer by a string (a constant to
torch.compile); its fake implementation gives the output's shape and dtype from the layer alone,
so torch.compile traces through it without running it.
"""

import sys
import threading

_lock = threading.Lock()
_op = None      # torch.ops.nvfp4moe.moe once registered
_torch = None   # the torch module then


class TorchTooOld(ImportError):
    """torch before 2.4 has no torch.library.custom_op: layers then run without the op (eager)."""

SCHEMA = "(Tensor hidden, Tensor? router_logits, Tensor? topk_ids, Tensor? topk_weights, str layer) -> Tensor"


def register():
    """Registers torch.ops.nvfp4moe.moe (once per process) and returns it."""
    global _op, _torch
    if _op is not None:
        return _op
    with _lock:
        if _op is not None:
            return _op
        import torch
        from . import _layer

        if not hasattr(torch.library, "custom_op"):
            raise TorchTooOld(f"torch.ops.nvfp4moe.moe needs torch 2.4 or newer (this is torch {torch.__version__})")

        def moe(hidden, router_logits, topk_ids, topk_weights, layer):
            return _layer.lookup(layer)._forward_torch(hidden, router_logits, topk_ids, topk_weights)

        def moe_fake(hidden, router_logits, topk_ids, topk_weights, layer):
            moe_layer = _layer.lookup(layer)
            moe_layer._check_torch(hidden, router_logits, topk_ids, topk_weights)
            return hidden.new_empty((hidden.shape[0], moe_layer.hidden_size), dtype=moe_layer._torch_out)

        op = torch.library.custom_op("nvfp4moe::moe", moe, mutates_args=(), schema=SCHEMA)
        op.register_fake(moe_fake)
        _torch = torch
        _op = torch.ops.nvfp4moe.moe
        return _op


def registered() -> bool:
    return _op is not None


def maybe_register():
    """Registers the op when torch is imported already (at `import nvfp4moe`)."""
    if "torch" in sys.modules and _op is None:
        try:
            register()
        except ImportError:
            pass
