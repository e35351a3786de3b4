"""Which models' requests may share a packed forward (models/packed.py) and keep their own numbers exactly: the
families the conformance suite checked (tests/test_conformance.py; the table in docs/models-and-devices.md), with the
attention implementations it wraps. Any other model runs its requests one by one through its own forward, and says so
(the Loaded models table, the trace's devices)."""
from __future__ import annotations

import sys

from .catalog import PACKED_EXACT_FAMILIES

# The attention implementation a batched model runs (registered with transformers under this name)
PACKED = "adafuse_packed"
# Any family outside the catalog's checked ones (PACKED_EXACT_FAMILIES) runs its requests one by one through its own
# forward (`packing_refused` says why), never with numbers that were not checked
# Attention implementations the packed forward wraps (flash and paged kernels take no per-request masks here)
PACKABLE = ("sdpa", "eager")


def packing_refused(model) -> str | None:
    """Why `model`'s requests cannot share a packed forward exactly (None: they can): a model without transformers'
    attention interface, an attention implementation other than PACKABLE, or a family outside PACKED_EXACT_FAMILIES."""
    cfg = getattr(model, "config", None)
    if not hasattr(model, "set_attn_implementation") or cfg is None:
        return "no attention interface to pack"
    current = getattr(cfg, "_attn_implementation", None)
    if current == PACKED:
        return None
    if current not in PACKABLE and not str(current).startswith("adafuse_"):
        return f"{current} attention takes no per-request masks"
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    family = getattr(text, "model_type", None) or getattr(cfg, "model_type", None)
    if family not in PACKED_EXACT_FAMILIES and getattr(cfg, "model_type", None) not in PACKED_EXACT_FAMILIES:
        return f"the packed forward is not checked exact on {family} models"
    if current == "eager" and any(own_eager(m) is None for m in model.modules() if _is_attention(m)):
        return "its attention module defines no eager function of its own"
    return None


def _is_attention(module) -> bool:
    return hasattr(module, "layer_idx") and hasattr(module, "config") and type(module).__name__.endswith("Attention")


def own_eager(module):
    """The `eager_attention_forward` of the file that defines `module`'s class (None: it defines none)."""
    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
