"""The packed forward of many decodes' requests (models/batching.py schedules them): their tokens side by side in one
sequence, each at its own position, attention per request on its own cache with its own mask."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .batching import Request

# The attention implementation a batched model runs (registered with transformers under this name): per request, the
# model's own attention function (`inner`) on that request's queries, keys and values.
PACKED = "adafuse_packed"
_PACKING = threading.local()  # the packed forward running in this thread (its requests, their keys and values)


def _device(model) -> torch.device:
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return emb.weight.device if emb is not None else next(model.parameters()).device


# ---- the packed forward ----
@dataclass
class _Segment:
    """One request inside a packed forward: its rows × length tokens from `start` in the packed sequence, after
    `past` cached positions."""
    request: Request
    start: int
    rows: int
    length: int
    past: int
    masks: dict = field(default_factory=dict)  # by sliding window (None: full attention)

    @property
    def stop(self) -> int:
        return self.start + self.rows * self.length

    def mask(self, window: int | None, device) -> torch.Tensor | None:
        """(1, 1, T, past + T) booleans, True where a position may look: causal after the past (and inside the
        sliding window); None where the kernel's own causal rule is the same (nothing past, or one new position)."""
        cut = window is not None and self.past + self.length > window
        if not cut and (self.past == 0 or self.length == 1):
            return None
        if window not in self.masks:
            q = torch.arange(self.past, self.past + self.length, device=device)[:, None]
            k = torch.arange(self.past + self.length, device=device)[None, :]
            visible = k <= q
            if window is not None:
                visible &= k > q - window
            self.masks[window] = visible[None, None]
        return self.masks[window]


class _PackedCache:
    """The cache a packed forward sees: each layer's new keys and values go to their own request's cache, and the
    full keys and values per request wait for the attention of that layer."""

    def __init__(self, segments: list[_Segment]):
        self.segments = segments
        self.kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def update(self, key, value, layer_idx, cache_kwargs=None):
        full = []
        for s in self.segments:
            k = _unpack(key, s)
            v = _unpack(value, s)
            full.append(s.request.cache.update(k, v, layer_idx))
        self.kv[layer_idx] = full
        return key, value

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_mask_sizes(self, cache_position, layer_idx: int = 0):
        return cache_position.shape[0], 0


def _unpack(x: torch.Tensor, s: _Segment) -> torch.Tensor:
    """(1, H, S, D) packed → (rows, H, T, D) of one segment."""
    part = x[0, :, s.start: s.stop]  # (H, rows·T, D)
    return part.reshape(part.shape[0], s.rows, s.length, part.shape[-1]).transpose(0, 1)


def packed_forward(model, batch: list[Request]) -> list[torch.Tensor]:
    """Run the requests as one sequence; returns each request's (rows, kept, V) float32 log-probs (computed here for
    the whole forward at once: over a large vocabulary they cost as much as a small forward's layers)."""
    device = _device(model)
    segments, ids, positions, keep, start = [], [], [], [], 0
    for r in batch:
        n, t, past = len(r.rows), len(r.rows[0]), r.cache.get_seq_length()
        s = _Segment(r, start, n, t, past)
        segments.append(s)
        for row in r.rows:
            ids.extend(row)
        positions.append(torch.arange(past, past + t).repeat(n))
        kept = t if r.keep is None else min(r.keep, t)
        keep.append((torch.arange(t - kept, t)[None, :] + torch.arange(n)[:, None] * t + start).reshape(-1))
        start = s.stop
    cache = _PackedCache(segments)
    keep_at = torch.cat(keep)
    _PACKING.run = (segments, cache)
    try:
        out = model(input_ids=torch.tensor([ids], device=device),
                    position_ids=torch.cat(positions)[None].to(device),
                    cache_position=torch.arange(start, device=device), past_key_values=cache, use_cache=True,
                    logits_to_keep=keep_at.to(device))
    finally:
        _PACKING.run = None
    logits, outs, at = torch.log_softmax(out.logits[0].float(), dim=-1), [], 0
    for s in segments:
        kept = s.length if s.request.keep is None else min(s.request.keep, s.length)
        outs.append(logits[at: at + s.rows * kept].reshape(s.rows, kept, -1))
        at += s.rows * kept
    return outs


def packed_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention of a packed forward: per request, the model's own attention function (`inner`) on its queries and
    its full keys and values, with its causal mask. Outside a packed forward (a direct call of the model), the inner
    function as it is."""
    inner = _inner(module)
    run = getattr(_PACKING, "run", None)
    if run is None:
        return inner(module, query, key, value, attention_mask, **kwargs)
    segments, cache = run
    window = kwargs.get("sliding_window")
    outs = []
    for s, (k, v) in zip(segments, cache.kv[module.layer_idx]):
        q = _unpack(query, s)
        mask = s.mask(window, query.device)
        if mask is not None and _float_masks(module):
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, torch.finfo(q.dtype).min)
        o, _ = inner(module, q, k, v, mask, **kwargs)  # (rows, T, H, D)
        outs.append(o.reshape(1, s.rows * s.length, *o.shape[2:]))
    return torch.cat(outs, 1), None


def _inner_name(module) -> str:
    return getattr(module.config, "_adafuse_inner_attention", "sdpa")


def _inner(module):
    from transformers import AttentionInterface
    from transformers.models.llama.modeling_llama import eager_attention_forward
    name = _inner_name(module)
    return eager_attention_forward if name == "eager" else AttentionInterface._global_mapping[name]


def _float_masks(module) -> bool:
    return _inner_name(module) == "eager"


def packed_mask(*args, **kwargs):
    """The mask transformers builds before the layers: none inside a packed forward (each request's own is made per
    layer), the inner attention's own otherwise."""
    if getattr(_PACKING, "run", None) is not None:
        return None
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask
    config = kwargs.get("config")
    name = getattr(config, "_adafuse_inner_attention", "sdpa")
    fn = eager_mask if name == "eager" else ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(name, sdpa_mask)
    return fn(*args, **kwargs)


def use_packed_attention(model) -> bool:
    """Make `model` run `packed_attention` (its own attention function kept as the inner one); False when it cannot
    (no transformers attention interface: a toy model, a model class that cannot switch)."""
    cfg = getattr(model, "config", None)
    if not hasattr(model, "set_attn_implementation") or cfg is None:
        return False
    current = getattr(cfg, "_attn_implementation", None)
    if current == PACKED:
        return True
    if current not in ("sdpa", "eager") and not str(current).startswith("adafuse_"):
        return False  # flash or paged kernels take no per-request masks here
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(PACKED, packed_attention)  # idempotent: the same function under the same name
    AttentionMaskInterface.register(PACKED, packed_mask)
    for c in {id(c): c for c in (cfg, getattr(cfg, "text_config", None)) if c is not None}.values():
        c._adafuse_inner_attention = current
    try:
        model.set_attn_implementation(PACKED)
    except (ValueError, KeyError, TypeError):
        return False
    return getattr(cfg, "_attn_implementation", None) == PACKED
