"""One model's view of a decode: rendered prompt, committed text, token ids and KV cache."""
from __future__ import annotations

import threading
import time
import weakref

import torch
from transformers import DynamicCache

from .errors import PromptError
from .loading import LoadedModel
from .words import common_prefix

# Largest logits block (rows × positions × vocab floats) computed in one forward while scoring.
MAX_LOGIT_FLOATS = 48_000_000


def copy_cache(cache: DynamicCache, length: int, rows: int = 1) -> DynamicCache:
    """A new cache holding the first `length` positions of row 0 of `cache`, repeated `rows` times."""
    data = []
    for layer in cache.layers:
        k = layer.keys[:1, :, :length]  # (1, H, length, D)
        v = layer.values[:1, :, :length]
        data.append((k.expand(rows, -1, -1, -1).contiguous(), v.expand(rows, -1, -1, -1).contiguous()))
    return DynamicCache(ddp_cache_data=data)


class PrefixStore:
    """The KV caches of the last few prompts per model: a new prompt sharing a long prefix with one of them (the
    same few-shot examples, the same chat preamble) starts from a copy instead of re-encoding it."""

    def __init__(self, per_model: int = 2, min_tokens: int = 16):
        self.per_model, self.min_tokens = per_model, min_tokens
        self.entries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # LoadedModel -> [(ids, cache)]
        self.lock = threading.Lock()

    def lookup(self, lm: LoadedModel, ids: list[int]) -> tuple[DynamicCache, int]:
        with self.lock:
            best, best_len = None, 0
            for old_ids, cache in self.entries.get(lm, []):
                n = min(common_prefix(old_ids, ids), len(ids) - 1)  # feed at least one token for the logits
                if n > best_len:
                    best, best_len = cache, n
            if best is None or best_len < self.min_tokens:
                return DynamicCache(), 0
            return copy_cache(best, best_len), best_len

    def store(self, lm: LoadedModel, ids: list[int], cache: DynamicCache) -> None:
        with self.lock:
            entries = [e for e in self.entries.get(lm, []) if e[0] != ids]
            entries.insert(0, (list(ids), copy_cache(cache, len(ids))))
            self.entries[lm] = entries[: self.per_model]


PREFIXES = PrefixStore()


def render_prompt(lm: LoadedModel, prompt: str, mode: str) -> tuple[str, str]:
    """The text model `lm` is conditioned on, and the mode actually used."""
    if mode == "chat":
        if lm.has_chat_template:
            text = lm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                    add_generation_prompt=True)
            bos = getattr(lm.tokenizer, "bos_token", None)
            if lm.add_bos and bos and text.startswith(bos):
                text = text[len(bos):]  # we add BOS as an id ourselves
            return text, "chat"
        return prompt, "raw (no chat template)"
    return prompt, "raw"


class ModelSession:
    """Token ids and KV cache of `render(prompt) + y` for one model.

    Invariants: the cache holds `cached_ids` (the committed `ids`, possibly followed by speculative
    tokens of this model's own greedy proposal); `next_logprobs` is the next-token distribution after
    `ids`, `end_logprobs` the one after `cached_ids`.
    """

    def __init__(self, lm: LoadedModel, prompt: str, mode: str = "raw"):
        self.lm = lm
        self.prefix_text, self.mode_used = render_prompt(lm, prompt, mode)
        self.text = ""
        self.forward_passes = 0
        self.tokens_fed = 0
        self.seconds = 0.0
        self.ids = self.encode("")
        self.prompt_tokens = len(self.ids)
        if lm.max_positions and self.prompt_tokens >= lm.max_positions:
            raise PromptError(f"the prompt is {self.prompt_tokens} tokens for {lm.name}, whose context holds "
                              f"{lm.max_positions}: shorten it (fewer few-shot examples)")
        self.end_index = torch.tensor(sorted(lm.end_ids), dtype=torch.long, device=lm.device)  # (E,)
        # full layers only: sliding-window layers could not be cropped
        self.cache, reused = PREFIXES.lookup(lm, self.ids)
        self.cached_ids = self.ids[:reused]
        self.end_logprobs = self._feed(self.ids[reused:])[-1]
        self.next_logprobs = self.end_logprobs
        self.prefix_reused = reused
        # token tuples after `ids` whose KV (new positions only) and next-token log-probs a batch already computed
        self.adoptable: dict[tuple[int, ...], tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]] = {}
        PREFIXES.store(lm, self.ids, self.cache)

    # ---- tokenization ----
    def encode(self, y: str) -> list[int]:
        """Token ids of render(prompt) + y, tokenized jointly as a fresh encoding would."""
        ids = self.lm.tokenizer(self.prefix_text + y, add_special_tokens=False).input_ids
        if self.lm.add_bos:
            ids = [self.lm.tokenizer.bos_token_id] + ids
        return ids

    def decode_after(self, context: list[int], new: list[int]) -> str:
        """Text that tokens `new` add after `context` (anchored so leading spaces survive)."""
        anchor = context[-4:]
        tok = self.lm.tokenizer
        head = tok.decode(anchor, skip_special_tokens=False) if anchor else ""
        full = tok.decode(anchor + new, skip_special_tokens=False)
        return full[len(head):] if full.startswith(head) else tok.decode(new, skip_special_tokens=False)

    # ---- forward passes ----
    @torch.inference_mode()
    def _feed(self, new: list[int]) -> torch.Tensor:
        """Feed tokens on the live cache; returns (1, V) float32 log-probs after the last one."""
        t0 = time.perf_counter()
        input_ids = torch.tensor([new], device=self.lm.device)  # (1, T)
        # Only the last position's logits are needed: skipping the rest spares a (T, V) head product.
        out = self.lm.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.cached_ids = self.cached_ids + list(new)
        self.forward_passes += 1
        self.tokens_fed += len(new)
        self.seconds += time.perf_counter() - t0
        return torch.log_softmax(out.logits[0].float(), dim=-1)  # (T, V)

    def extend(self, token: int) -> torch.Tensor:
        """Speculatively feed one token of this model's own proposal; returns the next (V,) log-probs."""
        self.end_logprobs = self._feed([token])[-1]
        return self.end_logprobs

    def rewind(self) -> None:
        """Drop speculative tokens so the cache holds exactly the committed ids."""
        if len(self.cached_ids) > len(self.ids):
            self.cache.crop(len(self.ids))
            self.cached_ids = self.cached_ids[: len(self.ids)]
            self.end_logprobs = self.next_logprobs

    def commit(self, y: str) -> None:
        """Set the committed text to `y`: reuse the cache up to the common token prefix, feed the rest."""
        new = self.encode(y)
        lcp = common_prefix(self.cached_ids, new)
        tail = tuple(new[len(self.ids):]) if new[: len(self.ids)] == self.ids else None
        if lcp == len(new) == len(self.cached_ids):
            self.next_logprobs = self.end_logprobs  # our own speculative tokens were exactly this text
        elif tail in self.adoptable:  # a batch row already holds this text: append its KV, no forward
            kv, logprobs = self.adoptable[tail]
            self.rewind()
            for layer, (k, v) in enumerate(kv):
                self.cache.update(k, v, layer)
            self.cached_ids = self.ids + list(tail)
            self.end_logprobs = self.next_logprobs = logprobs
        else:
            keep = min(lcp, len(new) - 1)
            self.cache.crop(keep)
            self.cached_ids = self.cached_ids[:keep]
            self.end_logprobs = self._feed(new[keep:])[-1]
            self.next_logprobs = self.end_logprobs
        self.ids = new
        self.text = y
        self.adoptable = {}

    def remember(self, tokens: list[int], cache: DynamicCache, row: int, start: int, logprobs: torch.Tensor) -> None:
        """Keep the KV of `tokens` (fed after ids[:start] in `row` of a side cache) for a later commit."""
        if start != len(self.ids):
            return
        end = start + len(tokens)
        self.adoptable[tuple(tokens)] = ([(layer.keys[row: row + 1, :, start:end].clone(),
                                           layer.values[row: row + 1, :, start:end].clone())
                                          for layer in cache.layers], logprobs)

    @torch.inference_mode()
    def batch_forward(self, start: int, rows: list[list[int]], remember: list[bool] | None = None) -> list[torch.Tensor]:
        """Feed `rows` (ragged) in one batch on top of the committed prefix ids[:start], without touching
        the live cache. Returns per row a (len(row), V) tensor of next-token log-probs. Rows flagged in
        `remember` are kept for `commit` (see `remember`)."""
        if not rows:
            return []
        assert 0 < start <= len(self.ids) and all(rows)
        vocab = self.lm.vocab_size
        longest = max(len(r) for r in rows)
        chunk = max(1, MAX_LOGIT_FLOATS // (longest * vocab))
        out: list[torch.Tensor] = []
        flags = remember or [False] * len(rows)
        for lo in range(0, len(rows), chunk):
            out.extend(self._batch_chunk(start, rows[lo: lo + chunk], flags[lo: lo + chunk]))
        return out

    def _batch_chunk(self, start: int, rows: list[list[int]], flags: list[bool]) -> list[torch.Tensor]:
        n, width = len(rows), max(len(r) for r in rows)
        pad = rows[0][0]
        cache = self.expanded_cache(start, n)
        # Right padding: causal attention keeps every real position blind to the pads after it.
        logp = self.run(cache, [r + [pad] * (width - len(r)) for r in rows])  # (N, T, V)
        for i, r in enumerate(rows):
            if flags[i]:
                self.remember(r, cache, i, start, logp[i, len(r) - 1])
        return [logp[i, : len(r)] for i, r in enumerate(rows)]

    @torch.inference_mode()
    def run(self, cache: DynamicCache, rows: list[list[int]]) -> torch.Tensor:
        """One batched forward of equal-length `rows` on a side cache; returns (N, T, V) log-probs."""
        t0 = time.perf_counter()
        input_ids = torch.tensor(rows, device=self.lm.device)  # (N, T)
        logits = self.lm.model(input_ids=input_ids, past_key_values=cache, use_cache=True).logits  # (N, T, V)
        self.forward_passes += 1
        self.tokens_fed += input_ids.numel()
        self.seconds += time.perf_counter() - t0
        return torch.log_softmax(logits.float(), dim=-1)

    def expanded_cache(self, start: int, n: int) -> DynamicCache:
        """A new cache holding ids[:start] repeated `n` times along the batch (the live cache is untouched)."""
        return copy_cache(self.cache, start, n)

    def stats(self) -> tuple[int, int, float]:
        return self.forward_passes, self.tokens_fed, self.seconds
