"""A local model's view of a decode: its KV cache follows the committed text; batches run on copies of it."""
from __future__ import annotations

import functools
import threading
import time

import torch
from transformers import DynamicCache

from ..view import Branch
from ..words import common_prefix
from .ahead import Ahead, Drafts, rows_kv
from .base import LoadedModel
from .prefixes import cache_bytes, copy_cache
from .tokenized import TokenizedView

# Largest logits block (rows × positions × vocab floats) computed in one forward while scoring.
MAX_LOGIT_FLOATS = 48_000_000
# Largest copy of the cached prefix made for one batch (rows × prefix KV bytes): scoring splits its rows to stay
# under it (an 8B model at 2k tokens holds ~0.25 GB of KV per row).
MAX_SIDE_CACHE_BYTES = 2 * 2**30
# At most this many tokens of a guess ride along with a catch-up's forward (`LocalSession.commit`).
GUESS_TOKENS = 4


class LocalBranch(Branch):
    """Rows on a side cache copied from the committed prefix; the live cache is never touched."""

    def __init__(self, s: "LocalSession", rows: int):
        self.s, self.start = s, len(s.ids)
        self.cache = s.side_cache(self.start, rows)

    def step(self, tokens: list[int]) -> torch.Tensor:
        return self.s.run(self.cache, [[t] for t in tokens])[:, -1]  # (N, V)

    def keep(self, rows: list[int]) -> None:
        self.cache.batch_select_indices(torch.tensor(rows, device=self.s.lm.device))

    def remember(self, rows: list[tuple[int, list[int], torch.Tensor]]) -> None:
        self.s.remember_rows(self.cache, self.start, rows)


def _awake(method):
    """A call on the view: one at a time (an idle view may be parked from another thread, never during a call), its
    time noted, and a parked view's cache rebuilt first."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._lock:
            self.last_used = time.monotonic()
            if self.parked:
                self._wake()
            return method(self, *args, **kwargs)
    return call


class LocalSession(TokenizedView):
    """Token ids and KV cache of `render(prompt) + y` for one local model (a `LocalModel`: its weights, its prefix
    store, its idle views).

    Invariants: the cache holds `cached_ids` (the committed `ids`, possibly followed by speculative
    tokens of this model's own greedy proposal); `next_logprobs` is the next-token distribution after
    `ids`, `end_logprobs` the one after `cached_ids`. A parked view (`park`) holds no cache until its next call.
    """

    def __init__(self, lm: LoadedModel, prompt: str, mode: str = "raw", stop: tuple[str, ...] = (), system: str = "",
                 thinking: bool | None = None, history: tuple = ()):
        super().__init__(lm, prompt, mode, stop, system, thinking, history)
        self._kv_bytes = 0  # `kv_bytes_per_token`, once measured
        self.released = False  # `release` let go of the cache: nothing may run on it any more
        self.parked = False    # `park` let go of the cache: the next call rebuilds it
        self._lock = threading.RLock()
        self.last_used = time.monotonic()
        lm.idle.trim()  # room for this prompt's KV: views that stopped moving give theirs back first
        # full layers only: sliding-window layers could not be cropped
        with lm.prefixes.prefill(self.ids) as (self.cache, reused):  # decodes starting together share the prefix
            self.cached_ids = self.ids[:reused]
            self.end_logprobs = self._feed(self.ids[reused:])[-1]
            lm.prefixes.store(self.ids, self.cache)
        self.next_logprobs = self.end_logprobs
        self.prefix_reused = reused
        # what forwards computed ahead of `ids` (a guess, drafts, KV to adopt): good until the next commit
        self.ahead = Ahead()
        lm.idle.add(self)

    # ---- forward passes ----
    @torch.inference_mode()
    def _feed(self, new: list[int], last: int = 1) -> torch.Tensor:
        """Feed tokens on the live cache; returns (last, V) float32 log-probs after each of the `last` last ones."""
        assert not self.released, "this view was released (its decode is over): open a new one"
        # Only the last positions' logits are needed: skipping the rest spares a (T, V) head product.
        req = self.lm.batcher.forward([list(new)], self.cache, keep=last)
        self.cached_ids = self.cached_ids + list(new)
        self.tokens_fed += len(new)
        return self._charged(req, req.logprobs[0])  # (last, V)

    def _charged(self, req, logprobs: torch.Tensor) -> torch.Tensor:
        """A served request's forward counted, with its share of the forward's seconds (a forward shared with other
        decodes is split among them by positions) and the decodes that rode in it; returns `logprobs`."""
        self.seconds += req.seconds
        self.forward_passes += 1
        if req.riders > 1:
            self.shared_passes += 1
            self.riders += req.riders
        return logprobs

    @_awake
    def extend(self, token: int) -> torch.Tensor:
        logprobs = self.ahead.take(token, self._verify)
        if logprobs is not None:  # the catch-up's guess or a verified draft continues with this token: no forward
            self.accepted_tokens += 1
            self.end_logprobs = logprobs
            return logprobs
        self.settle()  # what was taken joins the live cache, the rest is dropped; then on alone
        self.end_logprobs = self._feed([token])[-1]
        return self.end_logprobs

    @_awake
    def draft(self, rows: list[list[int]]) -> int:
        rows = [list(r) for r in rows if r]
        if not rows or len(self.cached_ids) != len(self.ids) or self.ahead.drafts is not None:
            return 0
        # as many rows as one scoring batch may hold (logits, prefix copies), in the caller's order
        rows = rows[: self._rows_per_batch(len(self.ids), max(len(r) for r in rows))]
        self.ahead.offer_drafts(rows)
        return sum(len(r) for r in rows)

    @torch.inference_mode()
    def _verify(self, rows: list[list[int]]) -> Drafts:
        """The one batched forward of the drafts on a copy of the committed prefix."""
        cache, logprobs = self._batch(len(self.ids), rows)
        self.verify_passes += 1
        self.draft_tokens += sum(len(r) for r in rows)
        return Drafts(rows, logprobs, cache, len(self.ids))

    @_awake
    def verified(self, tokens: list[int]) -> torch.Tensor | None:
        hit = self.ahead.verified_rows(len(self.ids), tokens)
        if hit is None:
            return None
        v, row, logprobs = hit  # logprobs (len(tokens), V)
        self.remember(tokens, v.cache, row, v.start, logprobs[-1])
        return logprobs

    @_awake
    def settle(self) -> None:
        guess, kv, taken = self.ahead.settle()
        if guess is not None:  # the guess's tokens not taken leave the live cache
            keep = len(self.ids) + guess.taken
            if len(self.cached_ids) > keep:
                self.cache.crop(keep)
                self.cached_ids = self.cached_ids[:keep]
            if not guess.taken:
                self.end_logprobs = self.next_logprobs
        if taken:  # the tokens taken from drafts join the live cache
            self._append(kv)
            self.cached_ids = self.cached_ids + taken

    @_awake
    def rewind(self) -> None:
        after_guess = self.ahead.rewind()
        if after_guess is not None:  # a guess stays where the catch-up fed it (the live cache: ids + its tokens)
            self.end_logprobs = after_guess
            return
        if len(self.cached_ids) > len(self.ids):  # tokens of our own span, fed on the live cache
            self.cache.crop(len(self.ids))
            self.cached_ids = self.cached_ids[: len(self.ids)]
        self.end_logprobs = self.next_logprobs

    @_awake
    def commit(self, y: str, guess: str = "") -> None:
        """Set the committed text to `y`: reuse the cache up to the common token prefix, feed the rest. When a feed
        is needed, `guess` (text likely to follow `y`) goes into the same forward: while `extend` is then given its
        tokens, their log-probs come from that forward (the mixture's catch-up, which another model's next word
        usually starts as its writer's next token said)."""
        self.settle()
        new = self.encode(y)
        lcp = common_prefix(self.cached_ids, new)
        tail = tuple(new[len(self.ids):]) if new[: len(self.ids)] == self.ids else None
        adopted = self.ahead.adopt(tail)
        self.ahead.drop()  # all of it was ahead of the old ids
        if lcp == len(new) == len(self.cached_ids):
            self.next_logprobs = self.end_logprobs  # our own speculative tokens were exactly this text
        elif adopted is not None:  # a batch row already holds this text: append its KV, no forward
            kv, logprobs = adopted
            self.rewind()
            self._append(kv)
            self.cached_ids = self.ids + list(tail)
            self.end_logprobs = self.next_logprobs = logprobs
        else:
            keep = min(lcp, len(new) - 1)
            self.cache.crop(keep)
            self.cached_ids = self.cached_ids[:keep]
            extra = self._guess_tokens(y, guess, new) if guess else []
            logprobs = self._feed(new[keep:] + extra, 1 + len(extra))
            self.end_logprobs = self.next_logprobs = logprobs[0]
            if extra:  # the guess stays on the live cache as speculative tokens until `extend` takes or drops them
                self.ahead.offer_guess(extra, logprobs[1:])
                self.draft_tokens += len(extra)
                self.end_logprobs = logprobs[-1]
        self.ids = new
        self.text = y
        self._move_anchor()

    def _guess_tokens(self, y: str, guess: str, new: list[int]) -> list[int]:
        """The guess as this model's tokens after `new` (the ids of `y`), at most GUESS_TOKENS; none when its first
        token would merge with the end of `y`."""
        ids = self.encode(y + guess)
        return ids[len(new):][:GUESS_TOKENS] if ids[: len(new)] == new else []

    def remember(self, tokens: list[int], cache: DynamicCache, row: int, start: int, logprobs: torch.Tensor) -> None:
        """Keep the KV of `tokens` (fed after ids[:start] in `row` of a side cache) for a later commit."""
        self.remember_rows(cache, start, [(row, tokens, logprobs)])

    def remember_rows(self, cache: DynamicCache, start: int, rows: list[tuple[int, list[int], torch.Tensor]]) -> None:
        """`remember` of each (row, tokens, log-probs after them): the KV copied once per layer for the rows of each
        length (no row keeps another's positions or pads alive)."""
        if start != len(self.ids):
            return
        by_length: dict[int, list[tuple[int, list[int], torch.Tensor]]] = {}
        for item in rows:
            by_length.setdefault(len(item[1]), []).append(item)
        for n, group in by_length.items():
            kv = rows_kv(cache, [row for row, _, _ in group], start, start + n)  # per layer (len(group), H, n, D)
            for j, (_, tokens, logprobs) in enumerate(group):
                self.ahead.offer_kv(tokens, [(k[j: j + 1], v[j: j + 1]) for k, v in kv], logprobs)

    def _append(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Append per-layer (keys, values) of new positions to the live cache."""
        for layer, (k, v) in enumerate(kv):
            self.cache.update(k, v, layer)

    @_awake
    def branch(self, rows: int) -> LocalBranch:
        return LocalBranch(self, rows)

    @torch.inference_mode()
    def token_embeddings(self, ids: list[int]) -> torch.Tensor | None:
        emb = self.lm.model.get_input_embeddings() if hasattr(self.lm.model, "get_input_embeddings") else None
        weight = getattr(emb, "weight", None)
        if weight is None:
            return None
        return weight[torch.tensor(ids, dtype=torch.long, device=weight.device)]

    @_awake
    @torch.inference_mode()
    def score_rows(self, start: int, rows: list[list[int]], remember: list[bool], wanted=None) -> list[torch.Tensor]:
        if not rows:
            return []
        assert 0 <= start <= len(self.ids) and all(rows)
        chunk = self._rows_per_batch(start, max(len(r) for r in rows))
        out: list[torch.Tensor] = []
        for lo in range(0, len(rows), chunk):
            out.extend(self._score_chunk(start, rows[lo: lo + chunk], remember[lo: lo + chunk]))
        return out

    def _rows_per_batch(self, start: int, longest: int) -> int:
        """How many rows of up to `longest` tokens one batch after `start` positions may hold: the logits and the
        prefix copies stay under MAX_LOGIT_FLOATS and MAX_SIDE_CACHE_BYTES (at least one row)."""
        return max(1, min(MAX_LOGIT_FLOATS // (longest * self.lm.vocab_size),
                          MAX_SIDE_CACHE_BYTES // max(1, start * self.kv_bytes_per_token())))

    def _batch(self, start: int, rows: list[list[int]]) -> tuple[DynamicCache, torch.Tensor]:
        """`rows` fed side by side after the first `start` cached positions, on a copy: the copy and (N, T, V)
        log-probs. Right padding: causal attention keeps every real position blind to the pads after it."""
        width = max(len(r) for r in rows)
        cache = self.side_cache(start, len(rows))
        return cache, self.run(cache, [r + [rows[0][0]] * (width - len(r)) for r in rows])

    def _score_chunk(self, start: int, rows: list[list[int]], flags: list[bool]) -> list[torch.Tensor]:
        cache, logp = self._batch(start, rows)
        self.remember_rows(cache, start, [(i, r, logp[i, len(r) - 1]) for i, r in enumerate(rows) if flags[i]])
        return [logp[i, : len(r)] for i, r in enumerate(rows)]

    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one position takes in the cache (every layer): measured once on a cache that holds
        a position (the model's layers, heads and dtype fix it)."""
        if not self._kv_bytes:
            self._kv_bytes = cache_bytes(self.cache, 1)
        return self._kv_bytes

    def side_cache(self, start: int, rows: int) -> DynamicCache:
        """`rows` copies of the first `start` cached positions, for a batch that must not touch the live cache."""
        assert not self.released, "this view was released (its decode is over): open a new one"
        self.peak_side_bytes = max(self.peak_side_bytes, rows * start * self.kv_bytes_per_token())
        return copy_cache(self.cache, start, rows)

    @torch.inference_mode()
    def run(self, cache: DynamicCache, rows: list[list[int]]) -> torch.Tensor:
        """One batched forward of equal-length `rows` on a side cache; returns (N, T, V) log-probs."""
        req = self.lm.batcher.forward(rows, cache)
        self.tokens_fed += len(rows) * len(rows[0])
        return self._charged(req, req.logprobs)

    def stats(self) -> tuple[int, int, float, int]:
        return self.forward_passes, self.tokens_fed, self.seconds, 0

    def held_bytes(self, wait: bool = True) -> int | None:
        """KV bytes that parking this view would free: its live cache and what it kept for the next round (drafts,
        KV to adopt), less what the prefix store shares. None when `wait` is False and a call is under way."""
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            tensors = [t for layer in self.cache.layers
                       for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if t is not None]
            tensors += self.ahead.tensors()
            shared = self.lm.prefixes.storages()
            held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
            return sum(n for ptr, n in held.items() if ptr not in shared)
        finally:
            self._lock.release()

    def park(self) -> bool:
        """Let go of the cache and what was kept for the next round, keeping the committed text, its ids and the
        next-token log-probs; the next call rebuilds the cache (`_wake`). False, parking nothing, while a call is
        under way or tokens taken from drafts or a guess are not committed yet (a proposal in progress)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self.released or self.parked or self.ahead.taking:
                return False
            self.cache, self.cached_ids = DynamicCache(), []
            self.ahead.drop()
            self.end_logprobs = self.next_logprobs
            self.parked = True
            return True
        finally:
            self._lock.release()

    def _wake(self) -> None:
        """The cache of `ids` again: from the prefix store where it holds a prefix, the rest fed (charged to the
        call that needed it). The committed `next_logprobs` stay as they were computed."""
        self.cache, reused = self.lm.prefixes.lookup(self.ids)
        self.cached_ids = self.ids[:reused]
        self.parked = False
        self._feed(self.ids[reused:])

    def release(self) -> None:
        """The decode is over: let go of the KV cache and every tensor kept for a later round (verified drafts, KV
        to adopt, log-probs), so a finished decode that is still referenced (a page's session keeps it) holds no
        model memory; the counters and the text stay. A released view computes nothing more."""
        with self._lock:
            self.released = True
            self.cache, self.cached_ids = DynamicCache(), []
            self.ahead.drop()
            self.next_logprobs = self.end_logprobs = None
