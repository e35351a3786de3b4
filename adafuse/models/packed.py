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

from .families import PACKED, own_eager, packing_refused

# The attention implementation a batched model runs (registered with transformers under this name): the model's own
# attention function (`inner`) over the packed requests, in one of ATTENTION_MODES.
# A single call per layer ("rows", then "one") where it computes at most this many times the query-key pairs the rows
# need (their own keys only); above it, a call per request
ONE_CALL_WASTE = 4.0
ATTENTION_MODES = ("auto", "one", "rows", "loop")
# The keyword a packed forward hands its `_PackedCache` to `packed_attention` by: transformers passes the model's extra
# keyword arguments down to the attention function (as its continuous batching passes `cu_seq_lens`)
RUN = "adafuse_packed"
# Inner attention functions whose causal flag (SDPA's `is_causal`, set when no mask is given and several positions
# are new) is the causal rule of a prefill with nothing cached; any other (eager) always gets a mask
CAUSAL_KERNELS = ("sdpa", "adafuse_grouped_sdpa")
# The most booleans a request's mask holds at once (4 MB): a long prompt after a cache attends in chunks of queries
MASK_CELLS = 1 << 22


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
    wake: object | None = None  # the condition its waiting thread sleeps on (`batching.Batcher.forward`)

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

    def mask(self, window: int | None, device, causal_kernel: bool, first: int = 0,
             last: int | None = None) -> torch.Tensor | None:
        """(1, 1, Q, past + last) booleans for queries `first`..`last` - 1 (Q of them; all by default), True where a
        position may look: causal after the past (and inside the sliding window). None where the kernel needs none: one
        new position seeing every cached one, or a `causal_kernel` (SDPA's causal flag) over a prefill with nothing
        cached. Eager attention has no causal rule of its own: it always gets one for several new positions. The whole
        segment's mask is kept per window (the layers share it); a part of it is made for its call."""
        last = self.length if last is None else last
        cut = window is not None and self.past + self.length > window
        if not cut and (self.length == 1 or (self.past == 0 and causal_kernel)):
            return None
        whole = first == 0 and last == self.length
        if whole and window in self.masks:
            return self.masks[window]
        q = torch.arange(self.past + first, self.past + last, device=device)[:, None]
        k = torch.arange(self.past + last, device=device)[None, :]
        visible = k <= q
        if window is not None:
            visible &= k > q - window
        if whole:
            self.masks[window] = visible[None, None]
        return visible[None, None]


class _PackedCache:
    """The cache a packed forward sees: each layer's new keys and values go to their own request's cache, and the
    full keys and values per request wait for the attention of that layer."""

    def __init__(self, segments: list[_Segment], attention: str = "auto"):
        self.segments = segments
        self.sizes = [s.rows * s.length for s in segments]  # each segment's positions in the packed sequence
        self._kernels: dict[type, tuple] = {}  # per attention module class: `kernel`
        self.attention = attention  # ATTENTION_MODES: one call per layer, a call per request, or chosen by cost
        self.kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.masks: dict[tuple, torch.Tensor] = {}  # the one call's masks, by (the rows' key lengths, window)
        self.modes: dict[int | None, str] = {}  # what "auto" runs, by sliding window (`mode`)
        self.calls = 0  # attention calls this forward made (all layers)

    def update(self, key, value, layer_idx, cache_kwargs=None):
        segments, sizes = self.segments, self.sizes
        self.kv[layer_idx] = [s.request.cache.update(k, v, layer_idx) for s, k, v in
                              zip(segments, _parts(key, segments, sizes), _parts(value, segments, sizes))]
        return key, value

    def kernel(self, module) -> tuple:
        """The model's own attention function for `module` and whether it takes a causal flag of its own: read once
        per forward and attention class (config lookups), not once per layer."""
        got = self._kernels.get(type(module))
        if got is None:
            got = self._kernels[type(module)] = (_inner(module), _inner_name(module) in CAUSAL_KERNELS)
        return got

    def mode(self, window: int | None, kv, device: torch.device) -> str:
        """How this forward's layers of one sliding window (None: full attention) attend: the attention asked for, or
        under "auto" the cheapest (`_cheapest`), chosen at the first such layer (every layer of a window holds as many
        keys per request: the choice is the same, and was O(requests) of Python in every layer)."""
        if self.attention != "auto":
            return self.attention
        got = self.modes.get(window)
        if got is None:
            got = self.modes[window] = _cheapest(self.segments, kv, device)
        return got

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_mask_sizes(self, cache_position, layer_idx: int = 0):
        return cache_position.shape[0], 0


def _parts(x: torch.Tensor, segments: list[_Segment], sizes: list[int]) -> list[torch.Tensor]:
    """(1, H, S, D) packed → each segment's (rows, H, T, D), `sizes` their rows·T: one split for all of them (every
    layer does this for keys, values and queries: no operations per request but a reshape where a request has several
    rows)."""
    pieces = x.split_with_sizes(sizes, 2)  # (1, H, rows·T, D) each
    return [p if s.rows == 1 else p[0].reshape(p.shape[1], s.rows, s.length, p.shape[-1]).transpose(0, 1)
            for s, p in zip(segments, pieces)]


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
    """Run the requests as one sequence; returns each request's (rows, kept, V) float32 log-probs, a tensor of its own
    (a log-softmax per request: no request's rows keep another's alive, and no copy is needed to part them).
    `attention`: one call per layer ("one"), a call per request ("loop"), or the cheaper of the two per layer ("auto")."""
    device = _device(model)
    segments, ids, positions, keep, start = [], [], [], [], 0
    for r in batch:
        n, t, past = len(r.rows), len(r.rows[0]), r.cache.get_seq_length()
        s = _Segment(r, start, n, t, past)
        segments.append(s)
        for row in r.rows:
            ids.extend(row)
        # as Python lists, made into tensors once for all requests (not a few tensor operations per request)
        positions.extend(list(range(past, past + t)) * n)
        kept = t if r.keep is None else min(r.keep, t)
        keep.extend(start + i * t + j for i in range(n) for j in range(t - kept, t))  # each row's last `kept`
        start = s.stop
    cache = _PackedCache(segments, attention)
    # a 4D mask is taken as it is (transformers builds none: each request's own is made per layer) and not used
    unused = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)
    out = model(input_ids=torch.tensor([ids], device=device), attention_mask=unused,
                position_ids=torch.tensor([positions], dtype=torch.long, device=device),
                cache_position=torch.arange(start, device=device), past_key_values=cache, use_cache=True,
                logits_to_keep=torch.tensor(keep, dtype=torch.long, device=device), **{RUN: cache})
    logits, outs, at = out.logits[0], [], 0
    for s in segments:  # each request's log-probs a tensor of its own (no copy out of one block afterwards)
        kept = s.length if s.request.keep is None else min(s.request.keep, s.length)
        outs.append(torch.log_softmax(logits[at: at + s.rows * kept].float(), dim=-1).reshape(s.rows, kept, -1))
        at += s.rows * kept
    return outs


def packed_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention of a packed forward: per request, the model's own attention function (`inner`) on its queries and
    its full keys and values, with its causal mask. Outside a packed forward (a direct call of the model), the inner
    function as it is."""
    cache = kwargs.pop(RUN, None)
    if cache is None:
        return _inner(module)(module, query, key, value, attention_mask, **kwargs)
    inner, causal = cache.kernel(module)
    segments = cache.segments
    window = kwargs.get("sliding_window")
    kv = cache.kv[module.layer_idx]
    mode = cache.mode(window, kv, query.device)
    if mode == "one":
        cache.calls += 1
        return _one_call(module, inner, query, segments, kv, window, cache.masks, **kwargs)
    queries = _parts(query, segments, cache.sizes)
    if mode == "rows":
        cache.calls += len({s.length for s in segments})  # a call per length the requests feed
        return _rows_call(module, inner, queries, segments, kv, window, cache.masks, **kwargs)
    cache.calls += len(segments)
    return torch.cat([_loop_call(module, inner, q, k, v, s, window, causal, **kwargs)
                      for s, q, (k, v) in zip(segments, queries, kv)], 1), None


def _loop_call(module, inner, q, k, v, s: _Segment, window: int | None, causal: bool, **kwargs) -> torch.Tensor:
    """One request's attention, (1, rows·T, H, D): its queries (rows, H, T, D) against its own keys and values. A
    request whose mask would pass MASK_CELLS (a long prompt after a cache) attends in chunks of queries, each against
    the keys up to its last position: the same numbers, the mask bounded."""
    held = s.past + s.length  # the keys it attends to
    step = s.length if s.length * held <= MASK_CELLS else max(1, MASK_CELLS // held)
    parts = []
    for first in range(0, s.length, step):
        last = min(s.length, first + step)
        mask = s.mask(window, q.device, causal, first, last)
        if mask is not None and _float_masks(module):
            mask = _additive(mask, q.dtype)
        end = s.past + last
        part = q if step >= s.length else q[:, :, first:last]  # slices only where they cut (each is an operation)
        keys, values = (k, v) if k.shape[2] <= end else (k[:, :, :end], v[:, :, :end])
        o, _ = inner(module, part, keys, values, mask, **kwargs)  # (rows, Q, H, D)
        parts.append(o)
    o = parts[0] if len(parts) == 1 else torch.cat(parts, 1)
    return o.reshape(1, s.rows * s.length, *o.shape[2:])


def _additive(mask: torch.Tensor, dtype) -> torch.Tensor:
    """A boolean mask as eager attention adds it: 0 where a position may look, the dtype's lowest value elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


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
    if not launches_cost_more(device):
        return "loop"
    lengths = {s.length for s in segments}
    if len(lengths) == len(segments):
        return "loop"  # no two requests feed as many tokens: a call each either way
    groups = [[(s, p) for s, p in zip(segments, kv) if s.length == n] for n in lengths]
    if max(_rows_waste([s for s, _ in g], [p for _, p in g]) for g in groups) <= ONE_CALL_WASTE:
        return "rows"
    return "one" if _dense_waste(segments, kv) <= ONE_CALL_WASTE else "loop"


def launches_cost_more(device: torch.device) -> bool:
    """Whether a kernel launch costs more than the arithmetic of a small call on `device` (an accelerator's)."""
    return device.type != "cpu"


def _rows_call(module, inner, queries, segments, kv, window, masks: dict, **kwargs):
    """Every row as one batch entry of one call: queries (rows, heads, T, D) — every request feeds the same T tokens
    (else its requests run per length) —, each row's keys and values padded at the end to the longest row's, a mask
    that hides the padding and keeps causality (and the window). Padding wastes less than the dense layout when the
    rows' contexts are alike. `queries`: each segment's (rows, H, T, D)."""
    if len({s.length for s in segments}) > 1:  # per length: each group of requests as one call
        outs = []
        for length in dict.fromkeys(s.length for s in segments):
            group = [i for i, s in enumerate(segments) if s.length == length]
            outs.append(([segments[i] for i in group],
                         _rows_call(module, inner, [queries[i] for i in group], [segments[i] for i in group],
                                    [kv[i] for i in group], window, masks, **kwargs)[0]))
        placed = {}
        for members, out in outs:
            placed.update({id(s): o for s, o in zip(members, _split(out, members))})
        return torch.cat([placed[id(s)] for s in segments], 1), None
    length = segments[0].length
    q = torch.cat(queries)  # (R, H, T, D)
    longest = max(k.shape[2] for k, _ in kv)

    def padded(x):  # (rows, H, L, D) → (rows, H, longest, D), zeros after (F.pad's own operation, without its wrapper)
        short = longest - x.shape[2]
        return torch.constant_pad_nd(x, (0, 0, 0, short)) if short else x
    keys = torch.cat([padded(k) for k, _ in kv])
    values = torch.cat([padded(v) for _, v in kv])
    lengths = tuple(k.shape[2] for k, _ in kv)
    # the mask depends on what each row feeds after what it holds, not only on the keys' lengths: a group feeding one
    # token and a later one feeding three can have the same lengths
    key = ("rows", tuple((s.past, s.length, s.rows) for s in segments), lengths, window)
    mask = masks.get(key)
    if mask is None:
        mask = masks[key] = _row_mask(segments, lengths, longest, window, q.device)
    if _float_masks(module):
        mask = _additive(mask, q.dtype)
    out, _ = inner(module, q, keys, values, mask, **kwargs)  # (R, T, H, D)
    return out.reshape(1, out.shape[0] * length, *out.shape[2:]), None


def _split(out: torch.Tensor, segments: list[_Segment]) -> list[torch.Tensor]:
    """(1, Σ rows·T, H, D) → each segment's (1, rows·T, H, D)."""
    return list(out.split([s.rows * s.length for s in segments], 1))


def _row_mask(segments, lengths, longest: int, window: int | None, device) -> torch.Tensor:
    """(R, 1, T, longest) booleans: row r's query t (at position past+t) sees its key j (at past+T-L+j) for j < L, at
    its position or before (and inside the window). Every segment at once (its past, T, L and rows as tensors): a
    handful of operations per forward, not a handful per request (no device sync: the sizes are known here)."""
    fed = segments[0].length  # every segment feeds T tokens (`_rows_call` groups them so)
    past, held, rows = torch.tensor([[s.past, n, s.rows] for s, n in zip(segments, lengths)], device=device).unbind(1)
    j = torch.arange(longest, device=device)
    q = (past[:, None] + torch.arange(fed, device=device)[None, :])[:, :, None]  # (S, T, 1) query positions
    k = (past + fed - held)[:, None, None] + j[None, None, :]  # (S, 1, longest) key positions
    visible = (k <= q) & (j[None, None, :] < held[:, None, None])
    if window is not None:
        visible &= k > q - window
    return visible.repeat_interleave(rows, dim=0, output_size=sum(s.rows for s in segments))[:, None]


def _one_call(module, inner, query, segments, kv, window, masks: dict, **kwargs):
    """Every row's queries against every row's keys in one call of the inner attention: keys and values of all rows
    side by side ((1, heads, Σ keys, D), a row's keys after the previous row's), under a block-diagonal mask that lets
    each query see its own row's keys up to its position (and inside the sliding window)."""
    keys = torch.cat([k.transpose(0, 1).reshape(k.shape[1], -1, k.shape[3]) for k, _ in kv], 1)[None]
    values = torch.cat([v.transpose(0, 1).reshape(v.shape[1], -1, v.shape[3]) for _, v in kv], 1)[None]
    lengths = tuple(k.shape[2] for k, _ in kv)
    key = ("one", tuple((s.past, s.length, s.rows) for s in segments), lengths, window)
    mask = masks.get(key)
    if mask is None:
        mask = masks[key] = _block_mask(segments, lengths, window, query.device)
    if _float_masks(module):
        mask = _additive(mask, query.dtype)
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
    """The model's own attention function: a registered one by its name, or for "eager" the one the attention
    module's own modeling file defines (a family's softcap or attention sinks live in its own)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    name = _inner_name(module)
    return own_eager(module) if name == "eager" else ALL_ATTENTION_FUNCTIONS[name]


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
    (`packing_refused`: a toy model, a kernel that takes no masks, a family not checked exact): its requests then run
    one by one through its own forward."""
    if packing_refused(model) is not None:
        return False
    cfg = model.config
    current = getattr(cfg, "_attn_implementation", None)
    if current == PACKED:
        return True
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
