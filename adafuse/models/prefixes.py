"""KV caches of recent prompts, kept by the model that computed them, and cheap copies of a cached prefix."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..words import common_prefix
from .batching import waiting_elsewhere

# Most bytes of keys and values one model's prefix store keeps, its entries together (512 MiB: an 8B model's 4k-token
# prompt, a 135M model's 11k; without it two 32k-token prompts of a 270M model kept 2.3 GB): a prompt whose KV alone is
# larger is not kept.
PREFIX_STORE_BYTES = 2**29
# Longest a prompt waits for another decode's prefill of a prefix it shares (then it prefills on its own).
PREFILL_WAIT_SECONDS = 120.0


def copy_cache(cache: DynamicCache, length: int, rows: int = 1) -> DynamicCache:
    """A new cache holding the first `length` positions of row 0 of `cache`, repeated `rows` times.

    The new cache holds views, not copies: a dynamic cache never writes into its tensors (every update concatenates
    into new ones, a crop slices), so neither cache can change the other, and the first forward on the new cache
    makes the one copy it needs (copying here too cost a second full copy of the prefix per batch)."""
    new = DynamicCache()
    if length == 0:
        return new
    for layer in cache.layers:
        k = layer.keys[:1, :, :length].expand(rows, -1, -1, -1)  # (rows, H, length, D), one copy's memory
        v = layer.values[:1, :, :length].expand(rows, -1, -1, -1)
        held = DynamicLayer()  # initialized as its first update would, with these tensors (no copy, no empty ones)
        held.dtype, held.device, held.is_initialized = k.dtype, k.device, True
        held.keys, held.values = k, v  # (building from `ddp_cache_data` would concatenate: a copy)
        new.layers.append(held)
    return new


def cache_bytes(cache: DynamicCache, length: int) -> int:
    """Bytes of keys and values the first `length` positions of row 0 of `cache` take (every layer)."""
    return sum((layer.keys[:1, :, :length].numel() + layer.values[:1, :, :length].numel()) * layer.keys.element_size()
               for layer in cache.layers if getattr(layer, "keys", None) is not None and layer.keys.numel())


class PrefixStore:
    """One model's KV caches of its last few prompts: a new prompt sharing a long prefix with one of them (the same
    few-shot examples, the same chat preamble) starts from a copy instead of re-encoding it. Each local model holds
    its own (`LocalModel.prefixes`), so whoever holds the model holds its store. Bounded twice: at most `size`
    prompts, and at most `max_bytes` of KV together (the oldest go first)."""

    def __init__(self, size: int = 2, min_tokens: int = 16, max_bytes: int = PREFIX_STORE_BYTES):
        if size < 0 or max_bytes < 0:
            raise ValueError(f"size={size}, max_bytes={max_bytes}: a prefix store keeps ≥ 0 prompts in ≥ 0 bytes "
                             "(0 turns it off)")
        self.size, self.min_tokens, self.max_bytes = size, min_tokens, max_bytes
        self.entries: list[tuple[list[int], DynamicCache, int]] = []  # (ids, their KV, its bytes), most recent first
        self.prefilling: list[tuple[list[int], threading.Event]] = []  # prompts being prefilled now, not stored yet
        self.lock = threading.Lock()

    @contextmanager
    def prefill(self, ids: list[int]) -> Iterator[tuple[DynamicCache, int]]:
        """`lookup(ids)` for a prompt about to be prefilled (and `store`d inside the block). When another decode is
        prefilling a prompt that shares a longer prefix with `ids` than anything stored (decodes started together
        on the same few-shot examples or passage), wait for it to be stored first, so the shared prefix is computed
        once, not once per decode (at most PREFILL_WAIT_SECONDS; the batchers do not wait for this decode meanwhile)."""
        mine, gave_up = (list(ids), threading.Event()), False
        while True:
            with self.lock:
                stored = self._longest(ids)[1]
                ahead = [e for p, e in self.prefilling if self._usable(p, ids) > max(stored, self.min_tokens - 1)]
                if not ahead or self.size == 0 or gave_up:  # gave up: prefill alone
                    self.prefilling.append(mine)
                    break
            with waiting_elsewhere():
                gave_up = not ahead[0].wait(PREFILL_WAIT_SECONDS)
        try:
            yield self.lookup(ids)
        finally:
            with self.lock:
                self.prefilling.remove(mine)
            mine[1].set()

    @staticmethod
    def _usable(old: list[int], ids: list[int]) -> int:
        """How many positions of `old`'s KV a prompt `ids` could start from (one token is left to feed: the logits)."""
        return min(common_prefix(old, ids), len(ids) - 1)

    def _longest(self, ids: list[int]) -> tuple[DynamicCache | None, int]:
        """The stored cache sharing the longest usable prefix with `ids`, and that length (under the lock)."""
        best, best_len = None, 0
        for old_ids, cache, _ in self.entries:
            n = self._usable(old_ids, ids)
            if n > best_len:
                best, best_len = cache, n
        return best, best_len

    def lookup(self, ids: list[int]) -> tuple[DynamicCache, int]:
        """A cache holding the longest stored prefix of `ids` (at least `min_tokens`, at most all but the last
        token, so a forward is left to give the logits) and its length; an empty cache and 0 otherwise."""
        with self.lock:
            best, best_len = self._longest(ids)
            if best is None or best_len < self.min_tokens:
                return DynamicCache(), 0
            return copy_cache(best, best_len), best_len

    def store(self, ids: list[int], cache: DynamicCache) -> None:
        """Keep the first len(ids) positions of `cache` as the KV of `ids`, dropping the oldest beyond `size` prompts
        or `max_bytes` (a prompt larger than `max_bytes` alone is not kept)."""
        size = cache_bytes(cache, len(ids))
        with self.lock:
            entries = [e for e in self.entries if e[0] != ids]
            if size <= self.max_bytes:
                entries.insert(0, (list(ids), copy_cache(cache, len(ids)), size))
            kept, total = [], 0
            for e in entries[: self.size]:
                total += e[2]
                if total > self.max_bytes:
                    break
                kept.append(e)
            self.entries = kept

    def storages(self) -> set[int]:
        """Addresses of the tensor storages the store keeps alive (a view's cache may share them)."""
        with self.lock:
            return {t.untyped_storage().data_ptr() for _, cache, _ in self.entries for layer in cache.layers
                    for t in (layer.keys, layer.values)}

    def held_bytes(self) -> int:
        """Bytes of KV the store keeps now."""
        with self.lock:
            return sum(e[2] for e in self.entries)

    def clear(self) -> None:
        with self.lock:
            self.entries = []
