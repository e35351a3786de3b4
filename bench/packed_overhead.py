"""What a packed forward costs per layer and request beyond the arithmetic (python -m bench.packed_overhead).

    python -m bench.packed_overhead [--layers 2 16] [--requests 1 32] [--modes loop rows] [--repeats 15]

A tiny random-weight Llama (hidden 64, a 512-token vocabulary: the arithmetic is next to nothing) with 2 and 16 layers;
1 and 32 requests of one token each after 40 to 47 cached positions (each its own cache, as decodes in flight), run as
one packed forward in each attention mode; the median ms per forward, and the engine's microseconds per layer and
request: the extra ms of 32 requests over 1, from 2 layers to 16, per added layer and request. On a GPU an 8B model's
forward has 32 layers: at 32 requests, 50 µs per layer and request would be ~50 ms of the engine per forward. One thread
(`torch.set_num_threads(1)`): the engine's work is Python and small operations.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers
from transformers import DynamicCache

from adafuse.models.packed import Request, packed_forward, use_packed_attention

PAST = 40


def tiny_llama(layers: int) -> torch.nn.Module:
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    assert use_packed_attention(model)
    return model


def ms_per_forward(model, requests: int, mode: str, repeats: int) -> float:
    caches = []
    for i in range(requests):  # contexts of different lengths, as decodes in flight have (the rows call pads them)
        cache = DynamicCache()
        model(input_ids=torch.randint(0, 512, (1, PAST + i % 8)), past_key_values=cache, use_cache=True)
        caches.append(cache)
    times = []
    for _ in range(repeats):
        for i, cache in enumerate(caches):
            cache.crop(PAST + i % 8)
        batch = [Request([[5]], cache, keep=1) for cache in caches]
        t0 = time.perf_counter()
        packed_forward(model, batch, mode)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, nargs=2, default=[2, 16])
    p.add_argument("--requests", type=int, nargs=2, default=[1, 32])
    p.add_argument("--modes", nargs="+", default=["loop", "rows"])
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report(args)
    finally:
        torch.set_num_threads(threads)  # as it was (a caller in the same process keeps its own)
    return 0


def report(args) -> None:
    (l0, l1), (r0, r1) = args.layers, args.requests
    print(f"ms per packed forward (median of {args.repeats}), one token per request after {PAST}-{PAST + 7} cached "
          "positions")
    with torch.inference_mode():
        for mode in args.modes:
            ms = {(lay, req): ms_per_forward(tiny_llama(lay), req, mode, args.repeats)
                  for lay in (l0, l1) for req in (r0, r1)}
            for (lay, req), v in ms.items():
                print(f"{mode:5s} {lay:3d} layers {req:3d} requests  {v:8.2f} ms")
            extra = (ms[l1, r1] - ms[l1, r0]) - (ms[l0, r1] - ms[l0, r0])
            print(f"{mode:5s} engine per layer and request: {extra / ((l1 - l0) * (r1 - r0)) * 1000:.1f} µs")


if __name__ == "__main__":
    raise SystemExit(main())
