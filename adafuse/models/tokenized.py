"""The text side of a model's view, shared by local and served models: rendered prompt, committed text, token ids."""
from __future__ import annotations

import time

from ..view import ModelView
from ..words import word_starts
from .base import LoadedModel
from .prompt import render_prompt

# Re-anchor the tokenization once the text after the anchor is this many tokens long.
ANCHOR_EVERY = 48


class TokenizedView(ModelView):
    """The rendered prompt, the committed text, its token ids (tokenized from an anchor) and byte-exact decoding.
    Subclasses add the forward passes.

    `encode` tokenizes from an anchor: `ids[:anchor_tok]` are the tokens of the first `anchor_char` characters of
    the text, and tokenizing the rest alone gives the rest (checked against a full tokenization whenever the anchor
    moves).
    """

    def __init__(self, lm: LoadedModel, prompt: str, mode: str = "raw", stop: tuple[str, ...] = (), system: str = "",
                 thinking: bool | None = None, history: tuple = ()):
        super().__init__()
        self.lm = lm
        self.name = lm.name
        # the end of the answer: the model's end tokens and every token that starts a stop string
        self.end_ids, self.banned_ids = lm.end_ids | lm.stop_token_ids(stop), lm.banned_ids
        self.prefix_text, self.mode_used = render_prompt(lm, prompt, mode, system, thinking, history)
        self.text = ""
        self.forward_passes = 0
        self.tokens_fed = 0
        self.seconds = 0.0
        self.tokenizer_seconds = 0.0
        self.peak_side_bytes = 0  # the largest prefix copy a batch made (exploration, beam, scoring)
        self.anchor_char, self.anchor_tok = 0, 0
        self._heads: dict[tuple[int, ...], tuple[int, str]] = {}  # `decode_after`'s anchors, by the context's tail
        self.ids = self.encode("")
        self.prompt_tokens = len(self.ids)
        lm.check_fits(self.prompt_tokens)
        self._move_anchor()

    # ---- tokenization ----
    def _full(self, y: str) -> list[int]:
        return self._bos() + self.lm.tokenize(self.prefix_text + y)

    def _bos(self) -> list[int]:
        return [self.lm.tokenizer.bos_token_id] if self.lm.add_bos else []

    def encode(self, y: str) -> list[int]:
        """Token ids of render(prompt) + y, tokenized jointly as a fresh encoding would (from the anchor)."""
        return self.encode_many([y])[0]

    def encode_many(self, ys: list[str]) -> list[list[int]]:
        """`encode` of each text, the tokenizer called once for all of them."""
        t0 = time.perf_counter()
        a = self.anchor_char - len(self.prefix_text)  # the anchor's position inside y (negative: inside the prompt)
        heads, texts = [], []  # per text: the ids before the part tokenized, and that part
        for y in ys:
            if self.anchor_tok and a >= 0 and y.startswith(self.text[:a]):
                head, text = self.ids[: self.anchor_tok], y[a:]
            elif self.anchor_tok and a < 0:
                head, text = self.ids[: self.anchor_tok], self.prefix_text[self.anchor_char:] + y
            else:
                head, text = self._bos(), self.prefix_text + y
            heads.append(head)
            texts.append(text)
        ids = [head + tail for head, tail in zip(heads, self.lm.tokenize_many(texts))]
        self.tokenizer_seconds += time.perf_counter() - t0
        return ids

    def length(self, y: str) -> int:
        return len(self._full(y))

    def _move_anchor(self) -> None:
        """Put the anchor at the start of a committed word that two more words follow, if tokenizing from there
        reproduces the full tokenization; else keep the old one."""
        if len(self.ids) - self.anchor_tok < ANCHOR_EVERY:
            return
        t0 = time.perf_counter()
        full_text = self.prefix_text + self.text
        starts = [i for i in word_starts(full_text) if i > self.anchor_char]
        if len(starts) >= 3:
            a = starts[-3]
            enc = self.lm.tokenize(full_text, offsets=True)
            shift = 1 if self.lm.add_bos else 0
            k = next((j for j, (lo, _) in enumerate(enc.offset_mapping) if lo >= a), None)
            full = ([self.lm.tokenizer.bos_token_id] if shift else []) + enc.input_ids
            if full != self.ids:  # never seen; if it were, a full tokenization from here on repairs it
                self.anchor_char, self.anchor_tok = 0, 0
            elif k is not None and k > 0 and enc.offset_mapping[k][0] == a and enc.offset_mapping[k - 1][1] <= a:
                if full[: k + shift] + self.lm.tokenize(full_text[a:]) == full:
                    self.anchor_char, self.anchor_tok = a, k + shift
        self.tokenizer_seconds += time.perf_counter() - t0

    def decode(self, ids: list[int]) -> str:
        return self.lm.decode(ids)

    def decode_after(self, context: list[int], new: list[int]) -> str:
        """Text that tokens `new` add after `context` (anchored so leading spaces survive; no clean-up)."""
        n, head = self._head(context)
        full = self.decode(context[len(context) - n:] + new)
        return full[len(head):] if full.startswith(head) else self.decode(new)

    def _head(self, context: list[int]) -> tuple[int, str]:
        """The anchor of `decode_after`: the last n (4 to 12) tokens of `context` and their text, decoded once per
        context (a round's candidates all follow the same one)."""
        tail = tuple(context[-12:])
        got = self._heads.get(tail)
        if got is None:
            n = min(4, len(context))
            head = self.decode(context[len(context) - n:]) if n else ""
            while n < min(len(context), 12) and head.startswith("\ufffd"):  # the anchor began inside a character
                n += 1
                head = self.decode(context[len(context) - n:])
            if len(self._heads) >= 64:
                self._heads.clear()
            got = self._heads[tail] = (n, head)
        return got

    def vocab_texts(self) -> list[str]:
        return self.lm.vocab_texts()
