"""The ensemble as a scorer: how likely each model finds a continuation after a context, each in its own tokens, and
the fused log-likelihood — what lm-evaluation-harness's `loglikelihood` and `loglikelihood_rolling` ask of a model.

Each model splits the text the way lm-evaluation-harness's `hf` model does (`split`): trailing whitespace of the
context moves to the continuation; the context is `encode(context)` and the continuation's tokens are those of
`encode(context + continuation)` after its first `len(encode(context))`. Where a model's tokenizer merges the
context's last characters with the continuation's first into one token, the context keeps its own tokens and the
continuation's are the whole text's after as many as the context has — they then spell the continuation only in
part (`hf` scores exactly these; so does this, so one member gives `hf`'s numbers). An empty context is the model's
BOS (else EOS) token. `encode` is the tokenizer's own call, special tokens included (a tokenizer that adds BOS
adds it). A model's log-likelihood is the sum of its continuation tokens' log-probabilities; the fused one is their
weighted mean over models (`DecodeConfig.weights`, or a learned gate's weights from what each model shows at the
context's end). The boundary lies at the same character for every model, so the models score the same text.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from .errors import ConfigError, PromptError
from .gate import Gate, entropy, features
from .models import LoadedModel
from .models.prefixes import copy_cache
from .writer import margin

DEFAULT_MAX_LENGTH = 2048  # a model whose config names no context window: lm-evaluation-harness's default


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
    """`text` as the model's tokenizer encodes it by default (special tokens included: BOS where it adds one)."""
    with lm.tokenizer_lock:
        return list(lm.tokenizer(text).input_ids)


def prefix_token(lm: LoadedModel) -> int:
    """The token an empty context stands for: BOS, else EOS."""
    tok = lm.tokenizer
    bos = getattr(tok, "bos_token_id", None)
    return bos if bos is not None else tok.eos_token_id


def split(lm: LoadedModel, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The context's and the continuation's tokens for model `lm`, as lm-evaluation-harness's `hf` model splits
    them (see the module's docstring)."""
    if context == "":
        cont = encode(lm, continuation)
        first = prefix_token(lm)
        return ([first], cont) if not cont or cont[0] != first else (cont[:1], cont[1:])
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    ctx = encode(lm, context)
    cont = encode(lm, context + continuation)[len(ctx):]
    return (ctx or [prefix_token(lm)]), cont  # a context of whitespace only: hf asserts; here the empty context's token


def max_length(lm: LoadedModel) -> int:
    return lm.max_positions or DEFAULT_MAX_LENGTH


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
    on copies of its cache."""
    if not hasattr(lm, "batcher"):
        raise ConfigError(f"{lm.name} is served: scoring given text needs each member's full next-token "
                          "distributions, so score with local members")
    with lm.prefixes.prefill(ctx) as (cache, reused):  # a prefix shared with other prompts (few-shot examples): reused
        first = lm.batcher.forward([ctx[reused:]], cache, keep=1).logprobs[0, -1].float()  # (V,)
        lm.prefixes.store(ctx, cache)
    rows = [c[:-1] for c in conts]
    after = None
    if any(rows):
        width = max(len(r) for r in rows)
        side = copy_cache(cache, len(ctx), len(rows))
        after = lm.batcher.forward([r + [conts[0][0]] * (width - len(r)) for r in rows], side).logprobs.float()
    logprobs, greedy = [], []
    for i, c in enumerate(conts):
        steps = torch.cat([first[None], after[i, : len(c) - 1]]) if len(c) > 1 else first[None]  # (len(c), V)
        target = torch.tensor(c, device=steps.device)
        logprobs.append(steps.gather(1, target[:, None])[:, 0].tolist())
        greedy.append(bool((steps.argmax(-1) == target).all()))
    return Scores(logprobs, greedy, first)


def fitted(lm: LoadedModel, ctx: list[int], cont: list[int], text: str) -> tuple[list[int], list[int]]:
    """The context left-truncated so that context and continuation fit the model's window, each request on its own
    (lm-evaluation-harness's `(ctx + cont)[-(max_length + 1):]`); a continuation that is no token or fills the window
    alone is a PromptError."""
    if not cont:
        raise PromptError(f"{text!r} adds no token of its own after the context for {lm.name} (its tokenizer merges it "
                          "into the context's last token): end the context at a word boundary, or start the "
                          "continuation with a space")
    room = max_length(lm) + 1 - len(cont)
    if room < 1:
        raise PromptError(f"{text[:40]!r}… is {len(cont)} tokens for {lm.name}, whose window is {max_length(lm)}: "
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
    """Scores continuations with an ensemble's models, fused with its weights or learned gate."""

    def __init__(self, models: Sequence[LoadedModel], names: Sequence[str], weights: Sequence[float] = (),
                 gate: Gate | None = None, tau: float = 0.7):
        self.models, self.names = list(models), list(names)
        self.weights, self.gate, self.tau = tuple(weights), gate, tau

    def score(self, context: str, continuations: Sequence[str]) -> list[Likelihood]:
        """Each continuation after `context`: each model's log-likelihood in its own tokens and the fused one."""
        if not continuations:
            return []
        per_model = []
        for lm in self.models:
            pairs = [fitted(lm, *split(lm, context, c), c) for c in continuations]
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
        (lm-evaluation-harness's loglikelihood_rolling); the fused log-likelihood with the ensemble's fixed weights (a
        gate reads a word start, which a whole text does not have: a gated ensemble fuses with its fixed weights, equal
        when none are set)."""
        logprob, tokens, greedy = {}, {}, {}
        for lm, name in zip(self.models, self.names):
            total, count, all_greedy = 0.0, 0, True
            for ctx, pred in rolling_windows(encode(lm, text), prefix_token(lm), max_length(lm)):
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
