"""The packed forward of many decodes' requests (models/batching.py schedules them): their tokens side by side in one
sequence, each at its own position, each row attending to its own cache only.

Attention runs through the model's own attention function in one of three ways per layer (`ATTENTION_MODES`):
- "rows": one call with every row as a batch entry — its queries (the T tokens every request feeds; requests feeding
  different T run as one call per T) and its own keys and values padded at the end to the longest row's, under a mask
  that hides the padding and keeps causality and the sliding window;
- "one": one call over the packed sequence as it is — every row's keys and values side by side (a varlen layout, as
  transformers' continuous batching packs for eager/SDPA and vLLM's FlexAttention backend under one block mask) under
  one block-diagonal mask; dense attention then computes every query against every key of the layout;
- "loop": a call per request, the reference the tests compare the others with.
"auto" (the default) runs the loop on a CPU — measured there (bench/packed_attention.py,
results/bench/packed_attention.txt and attention_e2e.txt): the dense one call is the slowest at 8 and 32 requests (it
computes 8–96× the pairs needed), the rows call within noise of the loop per forward and 4–12 % fewer examples per
minute end to end —; on an accelerator, where each call's launch costs more than the arithmetic of a small one, it
takes the rows call where padding computes at most `ONE_CALL_WASTE` times the query-key pairs the rows need, else the
one call under the same bound, else the loop (not yet measured on a GPU: bench/gpu_check.sh)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

# The attention implementation a batched model runs (registered with transformers under this name): the model's own
# attention function (`inner`) over the packed requests, in one of ATTENTION_MODES.
PACKED = "adafuse_packed"
# A single call per layer ("rows", then "one") where it computes at most this many times the query-key pairs the rows
# need (their own keys only); above it, a call per request
ONE_CALL_WASTE = 4.0
ATTENTION_MODES = ("auto", "one", "rows", "loop")
# The keyword a packed forward hands its `_PackedCache` to `packed_attention` by: transformers passes the model's extra
# keyword arguments down to the attention function (as its continuous batching passes `cu_seq_lens`)
RUN = "adafuse_packed"


def _device(model) -> torch.device:
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return emb.weight.device if emb is not None else next(model.parameters()).device


@dataclass(eq=False)
class Request:
    """Rows of equal length fed after the positions `cache` holds (one cache row per row); `keep` last positions'
    next-token distributions are wanted per row (None: all). The batcher fills `logprobs` (N, kept, V) float32,
    `seconds` (its share of the forward, by positions) and `riders` (decodes in that forward), or `error`."""
    rows: list[list[int]]
    cache: object
    keep: int | None = None
    rider: object | None = None  # the decode's `batching.Rider` (None: a forward outside any decode)
    since: float = field(default_factory=time.monotonic)
    done: bool = False
    logprobs: torch.Tensor | None = None
    seconds: float = 0.0
    riders: int = 1
    error: BaseException | None = None

    @property
    def positions(self) -> int:
        return len(self.rows) * len(self.rows[0])



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

    def __init__(self, segments: list[_Segment], attention: str = "auto"):
        self.segments = segments
        self.attention = attention  # ATTENTION_MODES: one call per layer, a call per request, or chosen by cost
        self.kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.masks: dict[tuple, torch.Tensor] = {}  # the one call's masks, by (the rows' key lengths, window)
        self.calls = 0  # attention calls this forward made (all layers)

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


# ---- a cache as it was before a forward that failed ----
def cache_state(cache):
    """What `cache` holds now, for `restore` to put back should a forward fail midway (having written some layers'
    keys and values): its layers and each layer's attributes. Dynamic layers replace their tensors as they grow, so
    the references keep the contents, at no cost; None for a cache that writes into its tensors in place (a static
    one): it cannot be put back."""
    from transformers.cache_utils import DynamicLayer
    layers = getattr(cache, "layers", None)
    if layers is None or not all(isinstance(layer, DynamicLayer) for layer in layers):
        return None
    return list(layers), [dict(vars(layer)) for layer in layers]


def restore(cache, state) -> None:
    """Put `cache` back as `cache_state` found it (layers a failed forward added are dropped)."""
    layers, attributes = state
    cache.layers[:] = layers
    for layer, kept in zip(layers, attributes):
        vars(layer).clear()
        vars(layer).update(kept)


def packed_forward(model, batch: list[Request], attention: str = "auto") -> list[torch.Tensor]:
    """Run the requests as one sequence; returns each request's (rows, kept, V) float32 log-probs (computed here for
    the whole forward at once: over a large vocabulary they cost as much as a small forward's layers). `attention`:
    one call per layer ("one"), a call per request ("loop"), or the cheaper of the two per layer ("auto")."""
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
    cache = _PackedCache(segments, attention)
    keep_at = torch.cat(keep)
    # a 4D mask is taken as it is (transformers builds none: each request's own is made per layer) and not used
    unused = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)
    out = model(input_ids=torch.tensor([ids], device=device), attention_mask=unused,
                position_ids=torch.cat(positions)[None].to(device),
                cache_position=torch.arange(start, device=device), past_key_values=cache, use_cache=True,
                logits_to_keep=keep_at.to(device), **{RUN: cache})
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
    cache = kwargs.pop(RUN, None)
    if cache is None:
        return inner(module, query, key, value, attention_mask, **kwargs)
    segments = cache.segments
    window = kwargs.get("sliding_window")
    kv = cache.kv[module.layer_idx]
    mode = cache.attention if cache.attention != "auto" else _cheapest(segments, kv, query.device)
    if mode == "one":
        cache.calls += 1
        return _one_call(module, inner, query, segments, kv, window, cache.masks, **kwargs)
    if mode == "rows":
        cache.calls += len({s.length for s in segments})  # a call per length the requests feed
        return _rows_call(module, inner, query, segments, kv, window, cache.masks, **kwargs)
    outs = []
    cache.calls += len(segments)
    for s, (k, v) in zip(segments, kv):
        q = _unpack(query, s)
        mask = s.mask(window, query.device)
        if mask is not None and _float_masks(module):
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, torch.finfo(q.dtype).min)
        o, _ = inner(module, q, k, v, mask, **kwargs)  # (rows, T, H, D)
        outs.append(o.reshape(1, s.rows * s.length, *o.shape[2:]))
    return torch.cat(outs, 1), None


def _dense_waste(segments: list[_Segment], kv) -> float:
    """Query-key pairs the one call computes over those the rows need (each row's queries against its own keys)."""
    queries = sum(s.rows * s.length for s in segments)
    keys = sum(s.rows * k.shape[2] for s, (k, _) in zip(segments, kv))
    needed = sum(s.rows * s.length * k.shape[2] for s, (k, _) in zip(segments, kv))
    return queries * keys / needed


def _rows_waste(segments: list[_Segment], kv) -> float:
    """Query-key pairs the rows call computes (every row's keys padded to the longest) over those the rows need."""
    longest = max(k.shape[2] for k, _ in kv)
    return sum(s.rows * longest for s in segments) / sum(s.rows * k.shape[2] for s, (k, _) in zip(segments, kv))


def _cheapest(segments: list[_Segment], kv, device: torch.device) -> str:
    """What "auto" runs: on a CPU a call per request (measured the fastest there: see the module doc); elsewhere the
    rows call where some requests feed as many tokens as others (one call per length) and padding wastes little, the
    dense one call where it wastes little, else a call per request."""
    if device.type == "cpu":
        return "loop"
    lengths = {s.length for s in segments}
    if len(lengths) == len(segments):
        return "loop"  # no two requests feed as many tokens: a call each either way
    groups = [[(s, p) for s, p in zip(segments, kv) if s.length == n] for n in lengths]
    if max(_rows_waste([s for s, _ in g], [p for _, p in g]) for g in groups) <= ONE_CALL_WASTE:
        return "rows"
    return "one" if _dense_waste(segments, kv) <= ONE_CALL_WASTE else "loop"


def _rows_call(module, inner, query, segments, kv, window, masks: dict, **kwargs):
    """Every row as one batch entry of one call: queries (rows, heads, T, D) — every request feeds the same T tokens
    (else its requests run per length) —, each row's keys and values padded at the end to the longest row's, a mask
    that hides the padding and keeps causality (and the window). Padding wastes less than the dense layout when the
    rows' contexts are alike."""
    if len({s.length for s in segments}) > 1:  # per length: each group of requests as one call
        outs = []
        for length in dict.fromkeys(s.length for s in segments):
            group = [(s, pair) for s, pair in zip(segments, kv) if s.length == length]
            outs.append((group, _rows_call(module, inner, query, [s for s, _ in group], [p for _, p in group], window,
                                           masks, **kwargs)[0]))
        placed = {}
        for group, out in outs:
            members = [s for s, _ in group]
            placed.update({id(s): o for s, o in zip(members, _split(out, members))})
        return torch.cat([placed[id(s)] for s in segments], 1), None
    length = segments[0].length
    q = torch.cat([_unpack(query, s) for s in segments])  # (R, H, T, D)
    longest = max(k.shape[2] for k, _ in kv)

    def padded(x):
        return torch.nn.functional.pad(x, (0, 0, 0, longest - x.shape[2]))
    keys = torch.cat([padded(k) for k, _ in kv])
    values = torch.cat([padded(v) for _, v in kv])
    lengths = tuple(k.shape[2] for k, _ in kv)
    mask = masks.get(("rows", lengths, window))
    if mask is None:
        mask = masks[("rows", lengths, window)] = _row_mask(segments, lengths, longest, window, query.device)
    if _float_masks(module):
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, torch.finfo(q.dtype).min)
    out, _ = inner(module, q, keys, values, mask, **kwargs)  # (R, T, H, D)
    return out.reshape(1, out.shape[0] * length, *out.shape[2:]), None


def _split(out: torch.Tensor, segments: list[_Segment]) -> list[torch.Tensor]:
    """(1, Σ rows·T, H, D) → each segment's (1, rows·T, H, D)."""
    return list(out.split([s.rows * s.length for s in segments], 1))


def _row_mask(segments, lengths, longest: int, window: int | None, device) -> torch.Tensor:
    """(R, 1, T, longest) booleans: row r's query t (at position past+t) sees its key j (at past+T-L+j) for j < L, at
    its position or before (and inside the window)."""
    parts = []
    for s, length in zip(segments, lengths):
        q = torch.arange(s.past, s.past + s.length, device=device)[:, None]
        k = (s.past + s.length - length + torch.arange(longest, device=device))[None, :]
        visible = (k <= q) & (torch.arange(longest, device=device)[None, :] < length)
        if window is not None:
            visible &= k > q - window
        parts.append(visible[None, None].expand(s.rows, 1, -1, -1))
    return torch.cat(parts)


def _one_call(module, inner, query, segments, kv, window, masks: dict, **kwargs):
    """Every row's queries against every row's keys in one call of the inner attention: keys and values of all rows
    side by side ((1, heads, Σ keys, D), a row's keys after the previous row's), under a block-diagonal mask that lets
    each query see its own row's keys up to its position (and inside the sliding window)."""
    keys = torch.cat([k.transpose(0, 1).reshape(k.shape[1], -1, k.shape[3]) for k, _ in kv], 1)[None]
    values = torch.cat([v.transpose(0, 1).reshape(v.shape[1], -1, v.shape[3]) for _, v in kv], 1)[None]
    lengths = tuple(k.shape[2] for k, _ in kv)
    mask = masks.get((lengths, window))
    if mask is None:
        mask = masks[(lengths, window)] = _block_mask(segments, lengths, window, query.device)
    if _float_masks(module):
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~mask, torch.finfo(query.dtype).min)
    out, _ = inner(module, query, keys, values, mask, **kwargs)  # (1, Σ queries, heads, D)
    return out, None


def _block_mask(segments: list[_Segment], lengths: tuple[int, ...], window: int | None, device) -> torch.Tensor:
    """(1, 1, Σ queries, Σ keys) booleans: a query sees the keys of its own row at its position or before (and after
    its position minus the window). A row of a request fed T tokens after `past` has queries at positions past..past+T-1
    and its L keys at positions past+T-L..past+T-1 (a sliding layer keeps only the last ones)."""
    q_row, q_pos, k_row, k_pos, row = [], [], [], [], 0
    for s, length in zip(segments, lengths):
        rows = torch.arange(row, row + s.rows)
        q_row.append(rows.repeat_interleave(s.length))
        q_pos.append(torch.arange(s.past, s.past + s.length).repeat(s.rows))
        k_row.append(rows.repeat_interleave(length))
        k_pos.append(torch.arange(s.past + s.length - length, s.past + s.length).repeat(s.rows))
        row += s.rows
    qr, qp, kr, kp = (torch.cat(x).to(device) for x in (q_row, q_pos, k_row, k_pos))
    visible = (qr[:, None] == kr[None, :]) & (kp[None, :] <= qp[:, None])
    if window is not None:
        visible &= kp[None, :] > qp[:, None] - window
    return visible[None, None]


def _inner_name(module) -> str:
    return getattr(module.config, "_adafuse_inner_attention", "sdpa")


def _inner(module):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward
    name = _inner_name(module)
    return eager_attention_forward if name == "eager" else ALL_ATTENTION_FUNCTIONS[name]


def _float_masks(module) -> bool:
    return _inner_name(module) == "eager"


def packed_mask(*args, **kwargs):
    """The mask transformers builds before the layers of a direct call of the model (a packed forward hands it one to
    take as it is): the inner attention's own."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask
    config = kwargs.get("config")
    name = getattr(config, "_adafuse_inner_attention", "sdpa")
    fn = eager_mask if name == "eager" else ALL_MASK_ATTENTION_FUNCTIONS.get(name, sdpa_mask)
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
