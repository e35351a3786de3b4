"""The cost of one packed forward on this machine, attention as one call per layer against a call per request
(adafuse/models/packed.py), for 1, 8 and 32 requests of the shapes decodes send: single tokens after a context (a
confident span, one decode's step), three exploration rows after a context, prefill chunks, and one prefill chunk beside
single tokens (where the one call wastes most). Medians of a few forwards each; the caches are put back after each.

    python -m bench.packed_attention                         # the bundled pair, a 300-token context
    python -m bench.packed_attention --models smollm2-135m-instruct --context 1000 --repeats 7
Prints a table (ms per forward of each attention mode: a call per request, one dense call, one call over the rows
padded; 'waste': query-key pairs each single call computes over those needed; what "auto" picks) and writes it to
results/bench/packed_attention.txt with --out.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from adafuse.models import get_model
from adafuse.models.batching import Request
from adafuse.models.packed import (_Segment, _cheapest, _dense_waste, _rows_waste, cache_state, packed_forward, restore,
                                   use_packed_attention)


def _shared_cache(model, context: list[int]) -> DynamicCache:
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([context]), past_key_values=cache, use_cache=True)
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
    for _ in range(repeats + 1):  # the first warms up
        t0 = time.perf_counter()
        with torch.inference_mode():
            packed_forward(model, reqs, mode)
        times.append(time.perf_counter() - t0)
        for r, s in zip(reqs, states):
            restore(r.cache, s)
    segments = [_Segment(r, 0, len(r.rows), len(r.rows[0]), p) for r, (p, _, _) in zip(reqs, spec)]
    kv = [(torch.empty(s.rows, 1, s.past + s.length, 1), None) for s in segments]
    return statistics.median(times[1:]) * 1000, _dense_waste(segments, kv), _rows_waste(segments, kv), \
        _cheapest(segments, kv, next(model.parameters()).device)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    ap.add_argument("--counts", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    lines = [f"packed forward ms (median of {args.repeats}), context {args.context} tokens, "
             f"{torch.get_num_threads()} CPU threads",
             f"{'model':<22} {'requests':>8}  {'shape':<28} {'loop':>8} {'one':>8} {'rows':>8} {'auto':>8}  "
             f"{'waste one':>9} {'rows':>5}  auto picks"]
    print("\n".join(lines), flush=True)
    for name in args.models:
        lm = get_model(name)
        model = lm.model
        assert use_packed_attention(model), f"{name} cannot pack"
        vocab = min(lm.vocab_size, 30000)
        shared = _shared_cache(model, torch.randint(0, vocab, (args.context,)).tolist())
        for n in args.counts:
            for shape, spec in shapes(n, args.context):
                ms = {m: time_forward(model, shared, spec, m, args.repeats, vocab)
                      for m in ("loop", "one", "rows", "auto")}
                _, one_waste, rows_waste, picks = ms["auto"]
                line = (f"{name:<22} {n:>8}  {shape:<28} {ms['loop'][0]:>8.1f} {ms['one'][0]:>8.1f} "
                        f"{ms['rows'][0]:>8.1f} {ms['auto'][0]:>8.1f}  {one_waste:>9.1f} {rows_waste:>5.1f}  {picks}")
                print(line, flush=True)
                lines.append(line)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
