"""The cost of one packed forward, attention as one call per layer against a call per request
(adafuse/models/packed.py), for requests of the shapes decodes send: single tokens after a context (a confident span,
one decode's step), three exploration rows after a context, prefill chunks, and one prefill chunk beside single tokens
(where the one call wastes most). Medians of a few forwards each; the caches are put back after each. Run by
`python -m bench.packed_attention` (the bundled pair here) and by the GPU check (its random-weight models)."""
from __future__ import annotations

import statistics
import time

import torch
from transformers import DynamicCache

from ..models.packed import (Request, _Segment, _cheapest, _dense_waste, _rows_waste, cache_state, packed_forward,
                             restore, use_packed_attention)

MODES = ("loop", "one", "rows", "auto")


def _shared_cache(model, context: list[int]) -> DynamicCache:
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([context], device=next(model.parameters()).device), past_key_values=cache,
              use_cache=True)
    return cache


def _copy(cache: DynamicCache, rows: int) -> DynamicCache:
    """A cache of its own holding `cache`'s keys (the tensors shared: a dynamic layer replaces them as it grows)."""
    new = DynamicCache()
    for layer in cache.layers:
        twin = type(layer).__new__(type(layer))
        vars(twin).update(vars(layer))
        new.layers.append(twin)
    if rows > 1:
        new.batch_repeat_interleave(rows)
    return new


def shapes(n: int, context: int):
    """(name, [(past, rows, length)] per request) for `n` requests."""
    return [("single tokens", [(context, 1, 1)] * n), ("3 exploration rows", [(context, 3, 1)] * n),
            ("prefill chunks of 64", [(0, 1, 64)] * n),
            ("a 256 chunk + single tokens", [(0, 1, 256)] + [(context, 1, 1)] * (n - 1))]


def time_forward(model, shared, spec, mode: str, repeats: int, vocab: int) -> tuple[float, float, float, str]:
    gen = torch.Generator().manual_seed(0)
    reqs = []
    for past, rows, length in spec:
        cache = _copy(shared, rows) if past else DynamicCache()
        ids = torch.randint(0, vocab, (rows, length), generator=gen).tolist()
        reqs.append(Request(ids, cache, 1))
    states = [cache_state(r.cache) for r in reqs]
    times = []
    cuda = next(model.parameters()).device.type == "cuda"
    for _ in range(repeats + 1):  # the first warms up
        t0 = time.perf_counter()
        with torch.inference_mode():
            packed_forward(model, reqs, mode)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        for r, s in zip(reqs, states):
            restore(r.cache, s)
    segments = [_Segment(r, 0, len(r.rows), len(r.rows[0]), p) for r, (p, _, _) in zip(reqs, spec)]
    kv = [(torch.empty(s.rows, 1, s.past + s.length, 1), None) for s in segments]
    return statistics.median(times[1:]) * 1000, _dense_waste(segments, kv), _rows_waste(segments, kv), \
        _cheapest(segments, kv, next(model.parameters()).device)


def attention_table(models, counts=(1, 8, 32), context: int = 300, repeats: int = 5, echo=print) -> list[str]:
    """Lines of a table: per model, request count and shape, ms per packed forward in each mode, the single calls'
    waste (query-key pairs computed over those needed) and what "auto" picks; each line echoed as it is measured."""
    device = next(models[0].model.parameters()).device
    where = f"{torch.get_num_threads()} CPU threads" if device.type == "cpu" else torch.cuda.get_device_name(device)
    lines = [f"packed forward ms (median of {repeats}), context {context} tokens, {where}",
             f"{'model':<22} {'requests':>8}  {'shape':<28} {'loop':>8} {'one':>8} {'rows':>8} {'auto':>8}  "
             f"{'waste one':>9} {'rows':>5}  auto picks"]
    for line in lines:
        echo(line)
    for lm in models:
        model = lm.model
        if not use_packed_attention(model):
            raise ValueError(f"{lm.name} cannot pack (its attention is not sdpa or eager)")
        vocab = min(lm.vocab_size, 30000)
        shared = _shared_cache(model, torch.randint(0, vocab, (context,)).tolist())
        for n in counts:
            for shape, spec in shapes(n, context):
                ms = {m: time_forward(model, shared, spec, m, repeats, vocab) for m in MODES}
                _, one_waste, rows_waste, picks = ms["auto"]
                line = (f"{lm.name[:22]:<22} {n:>8}  {shape:<28} {ms['loop'][0]:>8.1f} {ms['one'][0]:>8.1f} "
                        f"{ms['rows'][0]:>8.1f} {ms['auto'][0]:>8.1f}  {one_waste:>9.1f} {rows_waste:>5.1f}  {picks}")
                echo(line)
                lines.append(line)
    return lines
