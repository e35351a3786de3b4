"""A toy causal LM with hand-set next-token tables, a max-munch tokenizer, and the toy pair most tests decode with.

The toy model stores token ids in its KV cache, so its next-token distribution is a function of the
whole context as the cache holds it: a wrongly cropped or re-fed cache changes the answer.
"""
from __future__ import annotations

import math
import time
from types import SimpleNamespace

import torch

from adafuse import AdaFuse, DecodeConfig
from adafuse.models import LocalModel


class ToyTokenizer:
    """Max-munch over `vocab`; with `chat` (a format string holding {content}), a one-turn chat template."""

    def __init__(self, vocab: list[str], bos: str | None = "<bos>", eos: str = "<eos>", chat: str | None = None):
        self.tokens = ([bos] if bos else []) + [eos] + [v for v in vocab if v not in (bos, eos)]
        self.index = {t: i for i, t in enumerate(self.tokens)}
        self._by_first: dict[str, list[str]] = {}  # tokens by their first character, longest first
        for t in sorted(self.tokens, key=len, reverse=True):
            self._by_first.setdefault(t[0], []).append(t)
        self.bos_token, self.eos_token = bos, eos
        self.bos_token_id = self.index[bos] if bos else None
        self.eos_token_id = self.index[eos]
        self.specials = [t for t in (bos, eos) if t]
        self.all_special_ids = [self.index[t] for t in self.specials]
        self.added_tokens_decoder = {i: SimpleNamespace(content=self.tokens[i], special=True) for i in self.all_special_ids}
        self.chat_template = chat

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False, add_generation_prompt: bool = True,
                            **_) -> str:
        return "".join(self.chat_template.format(content=m["content"]) for m in messages)

    def __len__(self):
        return len(self.tokens)

    def encode_text(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            best = next((t for t in self._by_first.get(text[i], ()) if text.startswith(t, i)), None)
            if best is None:
                raise ValueError(f"toy tokenizer cannot encode {text[i:]!r}")
            ids.append(self.index[best])
            i += len(best)
        return ids

    def __call__(self, text: str | list[str], add_special_tokens: bool = True, return_offsets_mapping: bool = False):
        if isinstance(text, list):  # a batch, as Hugging Face tokenizers take one
            return SimpleNamespace(input_ids=[self(t, add_special_tokens).input_ids for t in text])
        ids = self.encode_text(text)
        offsets, pos = [], 0
        for i in ids:
            offsets.append((pos, pos + len(self.tokens[i])))
            pos += len(self.tokens[i])
        if add_special_tokens and self.bos_token_id is not None:
            ids, offsets = [self.bos_token_id] + ids, [(0, 0)] + offsets
        return SimpleNamespace(input_ids=ids, offset_mapping=offsets if return_offsets_mapping else None)

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        return "".join(self.tokens[i] for i in ids if not (skip_special_tokens and i in self.all_special_ids))

    def batch_decode(self, seqs, **kw) -> list[str]:
        return [self.decode(ids, **kw) for ids in seqs]


class ToyLM(torch.nn.Module):
    """Next-token probabilities looked up by the longest rule key that ends the context text.

    rules: {context suffix: {token: probability}}; leftover mass is spread evenly over the other tokens. `delay`:
    seconds each forward takes (a real model's pace, for a page to watch).
    """

    def __init__(self, tok: ToyTokenizer, rules: dict[str, dict[str, float]], max_positions: int = 4096,
                 delay: float = 0.0):
        super().__init__()
        self.tok, self.rules, self.delay = tok, rules, delay
        self.head = torch.nn.Linear(1, len(tok), bias=False)
        self.config = SimpleNamespace(max_position_embeddings=max_positions)
        self.generation_config = SimpleNamespace(eos_token_id=tok.eos_token_id)
        self.calls = 0
        self._dists: dict[str | None, torch.Tensor] = {}

    def get_output_embeddings(self):
        return self.head

    def dist(self, text: str) -> torch.Tensor:
        keys = [k for k in self.rules if text.endswith(k)]
        key = max(keys, key=len) if keys else None
        if key not in self._dists:  # one distribution per rule (and one for no rule), computed once
            self._dists[key] = self._table_dist(self.rules.get(key, {}))
        return self._dists[key]

    def _table_dist(self, table: dict[str, float]) -> torch.Tensor:
        v = len(self.tok)
        probs = torch.zeros(v, dtype=torch.float64)
        for t, p in table.items():
            probs[self.tok.index[t]] = p
        rest = [i for i in range(v) if self.tok.tokens[i] not in table]
        left = 1.0 - sum(table.values())
        probs[rest] = max(left, 1e-12) / max(len(rest), 1)
        return probs.log()

    def forward(self, input_ids, past_key_values=None, use_cache=True, **_):
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        n, t = input_ids.shape
        x = input_ids.double().reshape(n, 1, t, 1)  # (N, 1, T, 1): the cache stores token ids
        keys, _ = past_key_values.update(x, x, 0)  # (N, 1, P+T, 1)
        ids = keys[:, 0, :, 0].long()  # (N, P+T)
        p = ids.shape[1] - t
        rows = []
        for i in range(n):
            row = ids[i].tolist()
            text, out = self.tok.decode(row[:p]), []
            for j in range(t):  # the context text grows one token at a time (decode of row[: p + j + 1])
                text += self.tok.tokens[row[p + j]]
                out.append(self.dist(text))
            rows.append(torch.stack(out))
        logits = torch.stack(rows)  # (N, T, V)
        return SimpleNamespace(logits=logits.float())


class EmbeddedToyLM(ToyLM):
    """A toy LM with an input-embedding table (random, seeded): exploration by meaning has weights to read."""

    def __init__(self, tok: ToyTokenizer, rules: dict[str, dict[str, float]], **kw):
        super().__init__(tok, rules, **kw)
        self.embed = torch.nn.Embedding(len(tok), 8, _weight=torch.randn(len(tok), 8,
                                                                         generator=torch.Generator().manual_seed(0)))

    def get_input_embeddings(self):
        return self.embed


def toy_model(name: str, vocab: list[str], rules: dict, chat: str | None = None, embedded: bool = False,
              **kw) -> LocalModel:
    """A LocalModel over a toy LM (`embedded`: with input embeddings) and its tokenizer (`chat`: with a template)."""
    tok = ToyTokenizer(vocab, chat=chat)
    return LocalModel.from_objects(name, (EmbeddedToyLM if embedded else ToyLM)(tok, rules, **kw), tok)


def nll(*probs: float) -> float:
    """Length-normalized NLL of a token sequence with these probabilities."""
    return -sum(math.log(p) for p in probs) / len(probs)


V = ["Q", " Paris", "Paris", " London", ".", " is", " nice", "\n", " big", "ab"]

# a: confident; b: unsure between London and Paris.
A_RULES = {"Q": {" Paris": 0.9, " London": 0.05}, " Paris": {" is": 0.8, " big": 0.05},
           " is": {" nice": 0.9}, " nice": {".": 0.9}, ".": {"<eos>": 0.9}, " London": {" is": 0.5}}
B_RULES = {"Q": {" London": 0.5, " Paris": 0.3, "Paris": 0.15, "\n": 0.04}, " London": {" is": 0.9},
           " Paris": {" is": 0.6, " big": 0.3}, " is": {" nice": 0.5, " big": 0.4}, " nice": {".": 0.99},
           ".": {"<eos>": 0.99}}


def toy_pair(chat: str | None = None, **rules) -> tuple[LocalModel, LocalModel]:
    """Models a and b over V, with A_RULES and B_RULES unless `a=` or `b=` replaces them (`chat`: a chat template
    both tokenizers apply)."""
    return (toy_model("a", V, rules.get("a", A_RULES), chat=chat),
            toy_model("b", V, rules.get("b", B_RULES), chat=chat))


def first_round(cfg: DecodeConfig, models=None):
    """A decode of "Q" with the toy pair (or `models`) and its first round, proposed but not committed."""
    d = AdaFuse(models or toy_pair(), cfg).start("Q")
    return d, d.propose()
