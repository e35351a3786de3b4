"""The ensemble as a scorer: how likely each model finds a continuation after a context, each in its own tokens, and
the fused log-likelihood — what lm-evaluation-harness's `loglikelihood` and `loglikelihood_rolling` ask of a model.

Each model splits the text the way lm-evaluation-harness's `hf` model does (`split`): trailing whitespace of the
context moves to the continuation; the context is `encode(context)` and the continuation's tokens are those of
`encode(context + continuation)` after its first `len(encode(context))`. Where a model's tokenizer merges the
context's last characters with the continuation's first into one token, the context keeps its own tokens and the
continuation's are the whole text's after as many as the context has — they then spell the continuation only in
part, or not at all (a continuation merged wholly into the context has no token of its own: its log-likelihood is
the empty sum, 0, and it counts as greedy — `hf`'s own formula, where `hf` itself stops at an assert). `encode` is
`hf`'s `tok_encode`: the tokenizer's own call, special tokens included, except for a text that already starts with
the text of the model's prefix token (BOS, else EOS), which is encoded without them. An empty context is the prefix
token, and its continuation is encoded without special tokens (a continuation starting with the prefix token gives
it up as the context). A model's window is `hf`'s `max_length`: the one given, else the config's (`n_positions`,
`max_position_embeddings`, `n_ctx`), else the tokenizer's `model_max_length`, else 2048. A model's log-likelihood is
the sum of its continuation tokens' log-probabilities, computed a chunk of positions at a time (`token_scores`: only
the target tokens' log-probabilities are kept, so memory is bounded by a chunk, not by a window or a text); the fused
one is their weighted mean over models (`DecodeConfig.weights`, or a learned gate's weights from what each model
shows at the context's end). The boundary lies at the same character for every model, so the models score the same
text.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .errors import ConfigError, PromptError
from .gate import Gate, entropy, features
from .models import LoadedModel
from .models.prefixes import copy_cache
from .writer import margin

DEFAULT_MAX_LENGTH = 2048  # a model whose config and tokenizer name no context window: lm-evaluation-harness's default
TOKENIZER_UNSET = int(1e30)  # a tokenizer's model_max_length when nobody set it (transformers' VERY_LARGE_INTEGER)
WINDOW_ATTRIBUTES = ("n_positions", "max_position_embeddings", "n_ctx")  # in hf's order (`resolve_max_length`)
# Most bytes of log-probabilities one scoring forward hands back (rows × positions × vocabulary × 4): a window or a
# long continuation is fed this many positions at a time and only its target tokens' log-probabilities are kept
# (a 262k vocabulary: 128 positions a forward; a 32k-token window's log-probs alone would be 34 GB)
CHUNK_BYTES = 2**27
log = logging.getLogger(__name__)


@dataclass
class Likelihood:
    """One continuation scored after its context (or a whole text, rolling)."""
    continuation: str
    logprob: dict[str, float]           # per model: Σ log p of its continuation tokens
    tokens: dict[str, int]              # per model: how many tokens the continuation is in its tokenization
    greedy: dict[str, bool]             # per model: every continuation token was its most probable one
    fused: float                        # Σ w·logprob / Σ w
    weights: dict[str, float] = field(default_factory=dict)  # the weights fused with (empty: equal)
    is_greedy: bool | None = None       # the fused greedy decode writes this continuation (None: not asked)

    @property
    def bytes(self) -> int:
        return len(self.continuation.encode("utf-8"))


def encode(lm: LoadedModel, text: str) -> list[int]:
    """`text` as lm-evaluation-harness's `hf` model encodes it (`tok_encode`): the tokenizer's own call, special tokens
    included (BOS where it adds one, EOS where it appends one), except for a text that already starts with the text
    of the prefix token, which is encoded without them."""
    first = prefix_token(lm)
    starts = first is not None and text.startswith(lm.decode([first]))
    with lm.tokenizer_lock:
        return list((lm.tokenizer(text, add_special_tokens=False) if starts else lm.tokenizer(text)).input_ids)


def prefix_token(lm: LoadedModel) -> int:
    """The token an empty context stands for: BOS, else EOS."""
    tok = lm.tokenizer
    bos = getattr(tok, "bos_token_id", None)
    return bos if bos is not None else tok.eos_token_id


def split(lm: LoadedModel, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The context's and the continuation's tokens for model `lm`, as lm-evaluation-harness's `hf` model splits
    them (see the module's docstring)."""
    if context == "":
        cont, first = lm.tokenize(continuation), prefix_token(lm)
        return ([first], cont) if not cont or cont[0] != first else (cont[:1], cont[1:])
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    ctx = encode(lm, context)
    cont = encode(lm, context + continuation)[len(ctx):]
    return (ctx or [prefix_token(lm)]), cont  # a context of whitespace only: hf asserts; here the empty context's token


def max_length(lm: LoadedModel, given: int | None = None) -> int:
    """The model's window as lm-evaluation-harness's `hf` model reads it (`max_length`): `given`, else its config's
    (a text config inside it first), else its tokenizer's `model_max_length` where set, else DEFAULT_MAX_LENGTH."""
    if given:
        return given
    config = getattr(getattr(lm, "model", None), "config", None)
    config = getattr(config, "text_config", None) or config
    for name in WINDOW_ATTRIBUTES:
        if getattr(config, name, None) is not None:
            return int(getattr(config, name))
    if lm.max_positions:  # a served model: what its server says
        return lm.max_positions
    limit = getattr(lm.tokenizer, "model_max_length", None)
    return int(limit) if limit is not None and limit < TOKENIZER_UNSET else DEFAULT_MAX_LENGTH


@dataclass
class Scores:
    """One model's scores of continuations after one context."""
    logprobs: list[list[float]]   # per continuation, each token's log-probability
    greedy: list[bool]            # per continuation, every token its argmax
    first: torch.Tensor           # (V,) the distribution after the context


@torch.inference_mode()
def token_scores(lm: LoadedModel, ctx: list[int], conts: list[list[int]]) -> Scores:
    """Each continuation's token log-probabilities after `ctx` (`fitted` to the window): one forward over the
    context (over what the model's prefix store does not hold of it already), then the continuations side by side
    on copies of its cache, CHUNK_BYTES of log-probabilities a forward, of which only the targets' are kept."""
    if not hasattr(lm, "batcher"):
        raise ConfigError(f"{lm.name} is served: scoring given text needs each member's full next-token "
                          "distributions, so score with local members")
    with lm.prefixes.prefill(ctx) as (cache, reused):  # a prefix shared with other prompts (few-shot examples): reused
        first = lm.batcher.forward([ctx[reused:]], cache, keep=1).logprobs[0, -1].float()  # (V,)
        lm.prefixes.store(ctx, cache)
    width = max(len(c) for c in conts)
    target = torch.tensor([c + [0] * (width - len(c)) for c in conts], device=first.device)  # (N, W)
    found = torch.zeros(target.shape, device=first.device)  # (N, W) each target token's log-probability
    hits = torch.ones(target.shape, dtype=torch.bool, device=first.device)  # (N, W) each target the argmax
    if width:
        found[:, 0], hits[:, 0] = first[target[:, 0]], first.argmax() == target[:, 0]
    if width > 1:
        side = copy_cache(cache, len(ctx), len(conts))
        step = max(1, CHUNK_BYTES // (len(conts) * lm.vocab_size * 4))
        for at in range(0, width - 1, step):  # the tokens at..end-1 fed predict the targets at+1..end
            end = min(at + step, width - 1)
            logprobs = lm.batcher.forward(target[:, at:end].tolist(), side).logprobs  # (N, C, V)
            wanted = target[:, at + 1: end + 1]  # (N, C)
            found[:, at + 1: end + 1] = logprobs.gather(-1, wanted[..., None])[..., 0].float()
            hits[:, at + 1: end + 1] = logprobs.argmax(-1) == wanted
            del logprobs  # (the next chunk's forward allocates its own)
    return Scores([found[i, : len(c)].tolist() for i, c in enumerate(conts)],
                  [bool(hits[i, : len(c)].all()) for i, c in enumerate(conts)], first)


def fitted(lm: LoadedModel, ctx: list[int], cont: list[int], text: str, window: int | None = None
           ) -> tuple[list[int], list[int]]:
    """The context left-truncated so that context and continuation fit the model's window (`max_length(lm, window)`),
    each request on its own (lm-evaluation-harness's `(ctx + cont)[-(max_length + 1):]`); a continuation that fills
    the window alone is a PromptError. A continuation of no token (merged wholly into the context) is kept: it scores
    0, as `hf`'s formula gives."""
    size = max_length(lm, window)
    if not cont:
        log.warning("%r adds no token of its own after the context for %s (its tokenizer merges it into the "
                    "context's last token): its log-likelihood there is 0, as lm-eval's hf formula gives", text,
                    lm.name)
    room = size + 1 - len(cont)
    if room < 1:
        raise PromptError(f"{text[:40]!r}… is {len(cont)} tokens for {lm.name}, whose window is {size}: "
                          "score it rolling (AdaFuse.score_rolling)")
    return ctx[-room:], cont


def rolling_windows(tokens: list[int], prefix: int, max_len: int) -> list[tuple[list[int], list[int]]]:
    """A long text as disjoint (context, predicted) windows of at most `max_len` inputs, the first after `prefix`
    (lm-evaluation-harness's `get_rolling_token_windows` with context_len 1, made disjoint)."""
    if not tokens:
        return []
    first = min(max_len, len(tokens))
    windows = [([prefix], tokens[:first])]
    done = first
    while done < len(tokens):
        n = min(len(tokens) - done, max_len)
        end = done + n
        inputs = tokens[max(0, end - max_len - 1): end - 1]
        windows.append((inputs[: len(inputs) - (n - 1)], tokens[end - n: end]))
        done = end
    return windows


class Scorer:
    """Scores continuations with an ensemble's models, fused with its weights or learned gate; `max_length`, where
    given, is every model's window (lm-evaluation-harness's `max_length` model argument), else each its own."""

    def __init__(self, models: Sequence[LoadedModel], names: Sequence[str], weights: Sequence[float] = (),
                 gate: Gate | None = None, tau: float = 0.7, max_length: int | None = None):
        self.models, self.names = list(models), list(names)
        self.weights, self.gate, self.tau = tuple(weights), gate, tau
        self.max_length = max_length

    def score(self, context: str, continuations: Sequence[str]) -> list[Likelihood]:
        """Each continuation after `context`: each model's log-likelihood in its own tokens and the fused one."""
        if not continuations:
            return []
        per_model = []
        for lm in self.models:
            pairs = [fitted(lm, *split(lm, context, c), c, self.max_length) for c in continuations]
            groups: dict[tuple[int, ...], list[int]] = {}
            for i, (ctx, _) in enumerate(pairs):  # continuations after the same context tokens: one forward
                groups.setdefault(tuple(ctx), []).append(i)
            found: dict[int, tuple[list[float], bool, torch.Tensor]] = {}
            for ctx, members in groups.items():
                s = token_scores(lm, list(ctx), [pairs[i][1] for i in members])
                for k, i in enumerate(members):
                    found[i] = (s.logprobs[k], s.greedy[k], s.first)
            per_model.append([found[i] for i in range(len(continuations))])
        weights = self._weights({n: per_model[m][0][2] for m, n in enumerate(self.names)})  # one for every answer
        out = []
        for i, text in enumerate(continuations):
            rows = {n: per_model[m][i] for m, n in enumerate(self.names)}
            logprob = {n: float(sum(r[0])) for n, r in rows.items()}
            tokens = {n: len(r[0]) for n, r in rows.items()}
            out.append(Likelihood(text, logprob, tokens, {n: r[1] for n, r in rows.items()},
                                  fuse(logprob, weights), weights))
        return out

    def rolling(self, text: str) -> Likelihood:
        """The whole of `text` scored from its start, each model over its own tokens in windows of its context size
        (lm-evaluation-harness's loglikelihood_rolling), keeping only each window's sum; the fused log-likelihood with
        the ensemble's fixed weights (a gate reads a word start, which a whole text does not have: a gated ensemble
        fuses with its fixed weights, equal when none are set)."""
        logprob, tokens, greedy = {}, {}, {}
        for lm, name in zip(self.models, self.names):
            total, count, all_greedy = 0.0, 0, True
            for ctx, pred in rolling_windows(encode(lm, text), prefix_token(lm), max_length(lm, self.max_length)):
                s = token_scores(lm, ctx, [pred])
                total, count, all_greedy = total + sum(s.logprobs[0]), count + len(pred), all_greedy and s.greedy[0]
            logprob[name], tokens[name], greedy[name] = total, count, all_greedy
        weights = dict(zip(self.names, self.weights)) if self.weights else {}
        return Likelihood(text, logprob, tokens, greedy, fuse(logprob, weights), weights)

    def _weights(self, first: dict[str, torch.Tensor]) -> dict:
        """The fusing weights, one set for every continuation of a context (answers compare on one scale): the gate's,
        read from each model's distribution at the context's end (margin, entropy, confident or not; no proposal of
        its own, so its own-NLL feature reads as absent), else the fixed ones (empty: equal)."""
        if self.gate is None or len(self.names) < 2:
            return dict(zip(self.names, self.weights)) if self.weights else {}
        feats = {}
        for n in self.names:
            delta = margin(first[n])
            feats[n] = features(delta, entropy(first[n]), delta >= self.tau, None, 0)
        return self.gate.weights(feats)


def fuse(logprob: dict[str, float], weights: dict[str, float]) -> float:
    """Σ w·logprob / Σ w over the models (equal weights when `weights` is empty)."""
    w = {n: weights.get(n, 1.0) if weights else 1.0 for n in logprob}
    return sum(w[n] * v for n, v in logprob.items()) / sum(w.values())
