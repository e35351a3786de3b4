"""The one word builder: a word written token by token, where it ends and how; token choice; margins; the end event.

Every proposer (a confident model's greedy span, diverse exploration, beam search, the mixture's sampled word)
writes its words through `Word.offer`, so the word boundary, the forced end at `max_word_tokens`, the rule that a
word never ends inside a UTF-8 character, and the end of the answer live here and nowhere else.
"""
from __future__ import annotations

import torch

from .view import ModelView
from .words import word_end

# How a word ended: the next token starts a new word (not taken), the answer ends (end token taken), a token crossed
# the boundary (taken, text cut at the whitespace inside it), or the word reached max_word_tokens (taken).
BOUNDARY, END, STRADDLE, FULL = "boundary", "end", "straddle", "full"
# A word at its token cap takes up to this many more tokens to finish the character it is inside (byte tokens of
# CJK and emoji); past that a model emitting stray bytes still moves.
UTF8_SLACK = 16


def margin(logprobs: torch.Tensor) -> float:
    """Δ = p(top1) − p(top2) of a (V,) log-prob vector."""
    top = torch.topk(logprobs, 2).values.exp()  # (2,)
    return float(top[0] - top[1])


def end_logprob(view: ModelView, logprobs: torch.Tensor) -> float:
    """log p(the answer ends here): every end token of the model together. Args: logprobs (V,)."""
    return float(end_logprob_rows(view, logprobs))


def end_logprob_rows(view: ModelView, logprobs: torch.Tensor) -> torch.Tensor:
    """log p(the answer ends here) for each row of `logprobs` (..., V) -> (...), on its device (no host sync)."""
    ids = token_index(view, "end_ids")
    if not ids.numel():
        return torch.full(logprobs.shape[:-1], float("-inf"), device=logprobs.device)
    return torch.logsumexp(logprobs[..., ids], dim=-1)


def best_token(view: ModelView, logprobs: torch.Tensor) -> int:
    """The most likely token that may be proposed (special tokens other than end tokens are never proposed)."""
    return best_tokens(view, logprobs[None])[0]


def best_tokens(view: ModelView, logprobs: torch.Tensor) -> list[int]:
    """`best_token` of each row of (N, V) `logprobs`, read back in one transfer (a row whose best is banned: again
    without the banned tokens)."""
    picked = logprobs.argmax(dim=-1).tolist()  # (N,)
    for i, t in enumerate(picked):
        if t in view.banned_ids:
            masked = logprobs[i].clone()  # (V,)
            masked[token_index(view, "banned_ids")] = float("-inf")
            picked[i] = int(masked.argmax())
    return picked


def sample_token(view: ModelView, logprobs: torch.Tensor, temperature: float, generator: torch.Generator) -> int:
    """A token drawn from softmax(logprobs / temperature) over the tokens that may be proposed; greedy at 0."""
    if temperature == 0:
        return best_token(view, logprobs)
    scaled = logprobs / temperature  # (V,)
    scaled[token_index(view, "banned_ids")] = float("-inf")
    probs = torch.softmax(scaled.double().cpu(), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def token_index(view: ModelView, key: str, ids=None) -> torch.Tensor:
    """Token ids as a tensor on the logits' device, built once per view: `view.<key>`, or `ids()` when given."""
    cache = view.token_indexes
    if key not in cache:
        cache[key] = torch.tensor(sorted(ids() if ids else getattr(view, key)), dtype=torch.long,
                                  device=view.next_logprobs.device)
    return cache[key]





class Word:
    """One word being written after the tokens `context`.

    `offer(token, logprobs)` either takes the token (the word goes on) or completes the word; then `status` says how,
    `took` whether the offered token belongs to the word, `text` is the word exactly as the model's tokens decode
    (cut at the whitespace when a token straddles the boundary) and `tokens`/`logprobs` what it was written with.
    """

    def __init__(self, view: ModelView, context: list[int], max_tokens: int):
        self.view, self.context, self.max_tokens = view, context, max_tokens
        self.tokens: list[int] = []
        self.logprobs: list[float] = []   # log p of each token; for an end token, all end tokens together
        self.text = ""
        self.status: str | None = None
        self.took = False

    def copy(self) -> "Word":
        w = Word(self.view, self.context, self.max_tokens)
        w.tokens, w.logprobs, w.text, w.status, w.took = list(self.tokens), list(self.logprobs), self.text, \
            self.status, self.took
        return w

    @property
    def eos(self) -> bool:
        return self.status == END

    @property
    def clean(self) -> bool:
        return self.status != STRADDLE

    @property
    def counts(self) -> int:
        """1 if the word holds any text token, else 0 (an immediate end of the answer)."""
        return int(len(self.tokens) > (1 if self.status == END else 0))

    @property
    def has_text(self) -> bool:
        """The word holds a non-whitespace character: a token starting with whitespace would end it."""
        return bool(self.text.strip())

    def _take(self, token: int, logp: float, text: str, status: str | None) -> bool:
        self.tokens.append(token)
        self.logprobs.append(logp)
        self.text, self.status, self.took = text, status, status is not None
        return status is None

    def offer(self, token: int, logprobs: torch.Tensor) -> bool:
        """Offer the next token, with the (V,) distribution it comes from. True: taken, the word goes on."""
        assert self.status is None, "the word is complete"
        v = self.view
        if token in v.end_ids:
            return self._take(token, end_logprob(v, logprobs), self.text, END)
        full = v.decode_after(self.context, self.tokens + [token])
        cut = word_end(full)
        if cut is not None:
            if cut == len(self.text) and full.startswith(self.text):
                self.status, self.took = BOUNDARY, False
                return False
            return self._take(token, float(logprobs[token]), full[:cut], STRADDLE)
        at_cap = len(self.tokens) + 1 >= self.max_tokens
        inside_char = full.endswith("\ufffd") and len(self.tokens) + 1 < self.max_tokens + UTF8_SLACK
        return self._take(token, float(logprobs[token]), full, FULL if at_cap and not inside_char else None)
