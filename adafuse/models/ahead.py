"""What a local model's view holds ahead of its committed ids, in one object: offered, taken, adopted, dropped.

Four kinds of speculative work, each computed by a forward that ran anyway, each good only until the next commit:
- a **guess**: tokens fed after the committed ids on the live cache with the last catch-up (`commit(y, guess)`), and
  the log-probs after each; `extend` takes them one by one while they are the tokens it is given;
- **pending drafts**: rows given for the next span (`draft`), verified in one batched forward on a side cache when the
  span's first token is fed;
- **drafts**: the verified rows, which `extend` takes tokens from while a row continues that way; the last verified
  drafts stay readable by scoring (`verified`) until the next commit;
- **kept KV**: per token tuple after the committed ids, the keys and values a batch row computed and the log-probs after
  it, which a commit of exactly those tokens adopts instead of a forward.

A guess and drafts never coexist: drafts are only offered while the live cache holds just the committed ids, and a
guess lives on the live cache. This object holds the stores and their rules; the view does what touches its live cache
(cropping a guess not taken, appending the taken drafts' KV), from what `settle` and `rewind` return.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer, (keys, values) of some positions


def row_kv(cache: DynamicCache, row: int, start: int, end: int) -> KV:
    """Per layer, the keys and values of positions start..end-1 of one batch row of a side cache (views)."""
    return [(layer.keys[row: row + 1, :, start:end], layer.values[row: row + 1, :, start:end])
            for layer in cache.layers]


def rows_kv(cache: DynamicCache, rows: list[int], start: int, end: int) -> KV:
    """Per layer, copies of the keys and values of positions start..end-1 of several batch rows of a side cache, in
    the order given: (len(rows), heads, end - start, dim) each, one copy per layer and tensor for all the rows."""
    indexes: dict[torch.device, torch.Tensor] = {}  # a model split over devices: the rows' index on each
    out = []
    for layer in cache.layers:
        index = indexes.get(layer.keys.device)
        if index is None:
            index = indexes[layer.keys.device] = torch.tensor(rows, device=layer.keys.device)
        out.append((layer.keys[:, :, start:end].index_select(0, index),
                    layer.values[:, :, start:end].index_select(0, index)))
    return out


class Drafts:
    """Draft rows verified in one batched forward after `start` positions: which of their tokens `extend` took."""

    def __init__(self, rows: list[list[int]], logprobs: torch.Tensor, cache: DynamicCache, start: int):
        self.rows, self.logprobs, self.cache, self.start = rows, logprobs, cache, start  # logprobs (N, T, V)
        self.taken: list[int] = []
        self.row = 0

    def take(self, token: int) -> torch.Tensor | None:
        """The (V,) log-probs after the taken tokens + `token` when a row continues that way, else None."""
        pos = len(self.taken)
        for i, r in enumerate(self.rows):
            if len(r) > pos and r[pos] == token and r[:pos] == self.taken:
                self.taken.append(token)
                self.row = i
                return self.logprobs[i, pos]
        return None

    def prefix(self, tokens: list[int]) -> tuple[int, torch.Tensor] | None:
        """The first row that starts with `tokens` and its (len(tokens), V) log-probs, else None."""
        n = len(tokens)
        for i, r in enumerate(self.rows):
            if len(r) >= n and r[:n] == tokens:
                return i, self.logprobs[i, :n]
        return None


class Guess:
    """Tokens fed after the committed ids on the live cache by a catch-up, the (len(tokens), V) log-probs after each,
    and how many `extend` has taken."""

    def __init__(self, tokens: list[int], logprobs: torch.Tensor):
        self.tokens, self.logprobs, self.taken = tokens, logprobs, 0

    def take(self, token: int) -> torch.Tensor | None:
        if self.taken < len(self.tokens) and self.tokens[self.taken] == token:
            self.taken += 1
            return self.logprobs[self.taken - 1]
        return None


class Ahead:
    """The speculative stores of one view (see the module doc): offer_*, take, verified_rows, adopt, settle, rewind,
    drop."""

    def __init__(self):
        self.guess: Guess | None = None
        self.pending: list[list[int]] = []
        self.drafts: Drafts | None = None    # the verified rows `take` reads
        self.verified: Drafts | None = None  # the last verified rows, read by scoring until the next commit
        self.kept: dict[tuple[int, ...], tuple[KV, torch.Tensor]] = {}

    # ---- offer ----
    def offer_guess(self, tokens: list[int], logprobs: torch.Tensor) -> None:
        assert not self.pending and self.drafts is None
        self.guess = Guess(tokens, logprobs)

    def offer_drafts(self, rows: list[list[int]]) -> None:
        assert self.guess is None and self.drafts is None
        self.pending = rows

    def offer_kv(self, tokens: list[int], kv: KV, logprobs: torch.Tensor) -> None:
        """Keep `kv` of `tokens` after the committed ids, and the log-probs after them, for a later commit. `kv` is a
        copy (`rows_kv`), never a view into a side cache, which it would keep alive whole."""
        self.kept[tuple(tokens)] = (kv, logprobs)

    # ---- take ----
    @property
    def taking(self) -> bool:
        """Tokens were taken from drafts or a guess that no commit has settled yet (a proposal in progress)."""
        return self.drafts is not None or bool(self.guess and self.guess.taken)

    def take(self, token: int, verify: Callable[[list[list[int]]], Drafts]) -> torch.Tensor | None:
        """The (V,) log-probs after `token` when a guess or a verified draft continues with it (no forward), else None:
        the caller settles and feeds it. Pending drafts are verified (`verify`, one forward) when their span's first
        token is this one; a span whose first token is never fed verifies nothing."""
        if self.guess is not None:
            return self.guess.take(token)
        if self.pending:
            rows, self.pending = self.pending, []
            if any(len(r) >= 2 and r[0] == token for r in rows):
                self.drafts = self.verified = verify(rows)
        return self.drafts.take(token) if self.drafts is not None else None

    def verified_rows(self, start: int, tokens: list[int]) -> tuple[Drafts, int, torch.Tensor] | None:
        """The last verified drafts, the row starting with `tokens` after `start` positions and its log-probs."""
        v = self.verified
        hit = v.prefix(tokens) if v is not None and v.start == start else None
        return (v, *hit) if hit else None

    def adopt(self, tokens: tuple[int, ...] | None) -> tuple[KV, torch.Tensor] | None:
        """The kept KV and next-token log-probs of exactly `tokens` after the committed ids, if a batch made them (None:
        the new ids do not extend the committed ones)."""
        return self.kept.get(tokens)

    # ---- end ----
    def settle(self) -> tuple[Guess | None, KV, list[int]]:
        """Stop taking: the guess (its tokens not taken are the caller's to crop), and the KV and tokens taken from
        drafts (the caller's to append to the live cache); pending drafts are dropped."""
        guess, self.guess = self.guess, None
        self.pending = []
        d, self.drafts = self.drafts, None
        if d is None or not d.taken:
            return guess, [], []
        return guess, row_kv(d.cache, d.row, d.start, d.start + len(d.taken)), d.taken

    def rewind(self) -> torch.Tensor | None:
        """Untake what was taken: the guess stays (where the catch-up fed it) with nothing taken, and the log-probs
        after its last token are returned; drafts and what was taken from them are dropped."""
        self.pending = []
        if self.guess is not None:
            self.guess.taken = 0
            return self.guess.logprobs[-1]
        self.drafts = None
        return None

    def drop(self) -> None:
        """Everything (a commit moved the ids, or the view parks or is released)."""
        self.guess, self.pending, self.drafts, self.verified, self.kept = None, [], None, None, {}

    def tensors(self) -> list[torch.Tensor]:
        """The tensors held: the drafts' caches and the kept KV (what parking would free)."""
        out = [t for d in (self.drafts, self.verified) if d is not None for layer in d.cache.layers
               for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if t is not None]
        return out + [t for kv, _ in self.kept.values() for pair in kv for t in pair]
