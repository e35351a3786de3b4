"""Decoding methods by name: what each model does in a round, and whether the pool is scored.

`METHODS` maps `DecodeConfig.method` to a `Method`. The decoder runs every method the same way: the models a method
lets act this round propose (`propose`), the pool is the union of their proposals, and it is scored by every model
when the method scores; `token-union` builds its whole round itself (`round`).
"""
from __future__ import annotations

import bisect
import itertools
import math
import random
from typing import TYPE_CHECKING

import torch

from .candidates import Proposal, beam, explore, greedy_span, sample_word
from .errors import ConfigError
from .selection import NO_WEIGHTS
from .trace import Candidate, ModelStep
from .view import ModelView
from .words import count_words
from .writer import best_token, end_logprob, margin

if TYPE_CHECKING:
    from .decoder import Decoding


class Method:
    """A proposer: every model acts every round, the pool is scored by every model."""
    scores = True     # the pool is scored by every model
    lazy = False      # models that did not act this round catch up later (when next drawn, or in the background)
    overlaps = True   # models sharing the CPU may run side by side (False: one works at a time, they take turns)
    weighted = True   # `DecodeConfig.weights` (or a gate) enters the fused score of the pool

    def start(self, d: "Decoding") -> None:
        """Per-decode state (random generators)."""

    def acting(self, d: "Decoding") -> list[int]:
        return list(range(len(d.sessions)))

    def drawn(self, d: "Decoding") -> list[int]:
        """Models that may act in some round (a lazy method catches only these up)."""
        return list(range(len(d.sessions)))

    def guess(self, d: "Decoding", m: int) -> str:
        """Text model m, about to catch up on words it did not see, will likely write next ("": none): fed in the
        catch-up's forward, it saves the writer a forward where it agrees."""
        return ""

    def propose(self, d: "Decoding", s: ModelView, budget: int) -> tuple[list[Proposal], str, list[float]]:
        """Model `s`'s proposals this round, its mode and the margins it looked at (`budget`: words left)."""
        raise NotImplementedError

    def round(self, d: "Decoding") -> tuple[list[ModelStep], list[Candidate]] | None:
        """A whole round built by the method itself (None: propose, pool and score as usual)."""
        return None


class AdaFuse(Method):
    """Confident models (Δ ≥ τ) commit a greedy span of up to M words; uncertain ones explore B first tokens chosen by
    `exploration` (distinct surface forms, or probability against redundancy in embedding space) or, with `diversity`
    off, run a width-B beam search over the word. Each explore step records its selection (`ModelStep.selection`)."""

    def __init__(self, diversity: bool | None = None):
        self.diversity = diversity  # None: as the config says

    def start(self, d):
        d.selections = {}
        diverse = d.config.diversity if self.diversity is None else self.diversity
        if d.config.exploration == "embedding" and diverse:  # before any round (a served model has no embeddings)
            for s in d.sessions:
                if s.token_embeddings(s.ids[-1:]) is None:
                    raise ConfigError(NO_WEIGHTS.format(name=s.name))

    def propose(self, d, s, budget):
        cfg = d.config
        delta = margin(s.next_logprobs)
        if delta >= cfg.tau:
            p, margins = greedy_span(s, min(cfg.max_words, budget), cfg.tau, cfg.max_word_tokens,
                                     drafts=d.drafts_for(s), guesses=d.guesses_for(s))
            return [p], "commit", margins
        diverse = cfg.diversity if self.diversity is None else self.diversity
        if diverse:
            record: dict = {}
            proposals = explore(s, cfg.branches, cfg.explore_top_k, cfg.max_word_tokens, cfg.exploration,
                                cfg.explore_lambda, record)
            selections = getattr(d, "selections", None)
            if selections is not None:
                selections[id(s)] = record  # one key per model: safe from the models' worker threads
            return proposals, "explore", [delta]
        return beam(s, cfg.branches, cfg.explore_top_k, cfg.max_word_tokens), "beam", [delta]

    def round(self, d):
        """The usual pool round, with each explore step's selection record attached to its step."""
        d.selections = {}
        steps, candidates = d._pool_round()
        for step, s in zip(steps, d.sessions):
            step.selection = d.selections.pop(id(s), {})
        return steps, candidates


class FixedSpan(Method):
    """Every model proposes its greedy span of exactly n words (SweetSpan-like); the pool is scored."""

    def propose(self, d, s, budget):
        cfg = d.config
        p, margins = greedy_span(s, min(cfg.span_words, budget), None, cfg.max_word_tokens, drafts=d.drafts_for(s),
                                 guesses=d.guesses_for(s))
        return [p], "span", margins


class Greedy(Method):
    """One model alone, word by word, through the same machinery."""
    weighted = False  # one model, one candidate a round

    def propose(self, d, s, budget):
        cfg = d.config
        p, margins = greedy_span(s, 1, None, cfg.max_word_tokens)
        return [p], "greedy", margins


class Mixture(Method):
    """Word-level mixture of experts (ME): each round one model, drawn with `weights` and `seed`, writes the next word
    by sampling at `temperature` (0: greedily). No other model proposes or scores; the others catch up with one
    forward over the accumulated text when they are next drawn, and that forward also feeds the token the last
    writer would write next (`guess`): where the new writer writes it too, the forward that follows its first token
    is saved. One model works at a time, so on a shared CPU the models take turns (each with every core) unless
    side by side is asked for; side by side, the idle models catch up in the background."""
    scores = False
    lazy = True
    overlaps = False
    weighted = False  # the weights draw the writer; nothing is scored

    def start(self, d):
        d.rng = random.Random(d.config.seed)
        d.generator = torch.Generator().manual_seed(d.config.seed)

    def acting(self, d):
        return [writer(d.rng.random(), len(d.sessions), d.config.weights)]

    def drawn(self, d):
        return [m for m in range(len(d.sessions)) if not d.config.weights or d.config.weights[m] > 0]

    def guess(self, d, m):
        """The next token of a model that is up to date (the last writer first: the token that told it its word had
        ended), as text. Only models with nothing running in the background are read."""
        output = d.trace.output
        last = next((i for i, st in enumerate(d.trace.rounds[-1].steps) if st.mode != "idle"), None) \
            if d.trace.rounds else None
        for o in sorted(range(len(d.sessions)), key=lambda o: o != last):
            s, behind = d.sessions[o], d._behind.get(o)
            if o == m or s.text != output or (behind is not None and not behind.done()):
                continue
            t = best_token(s, s.next_logprobs)
            return "" if t in s.end_ids else s.decode_after(s.ids, [t])
        return ""

    def propose(self, d, s, budget):
        cfg = d.config
        return [sample_word(s, cfg.temperature, d.generator, cfg.max_word_tokens)], "write", \
            [margin(s.next_logprobs)]


def writer(u: float, count: int, weights) -> int:
    """The model `random.choices(range(count), weights)` draws when its one call to `random()` returns `u`."""
    if not weights:
        return math.floor(u * count)
    cum = list(itertools.accumulate(weights))
    return bisect.bisect(cum, u * cum[-1], 0, count - 1)


class TokenUnion(Method):
    """UniTE-style: the union (by decoded text) of every model's top-k next tokens, each scored by the probability
    every model gives that text as one token (0 if it cannot), averaged over models."""
    weighted = False  # a plain mean of probabilities

    def round(self, d):
        k = d.config.union_top_k
        texts: dict[tuple[str, bool], list[str]] = {}
        steps = []
        for name, s in zip(d.names, d.sessions):
            s.rewind()
            mine = []
            for t in torch.topk(s.next_logprobs, k).indices.tolist():
                if t in s.banned_ids:
                    continue
                key = ("", True) if t in s.end_ids else (s.decode_after(s.ids, [t]), False)
                if key[0] == "" and not key[1]:
                    continue
                proposers = texts.setdefault(key, [])
                if name not in proposers:
                    proposers.append(name)
                mine.append(list(texts).index(key))
            steps.append(ModelStep(model=name, mode="token", margins=[margin(s.next_logprobs)], proposals=mine))
        candidates = []
        for (text, eos), proposers in texts.items():
            probs = {name: _token_prob(s, text, eos) for name, s in zip(d.names, d.sessions)}
            mean = sum(probs.values()) / len(probs)
            candidates.append(Candidate(text=text, eos=eos, proposers=proposers,
                                        nll={n: -math.log(max(p, 1e-30)) for n, p in probs.items()},
                                        n_tokens={n: 1 if p > 0 else 0 for n, p in probs.items()},
                                        fused=-math.log(max(mean, 1e-30)), words=count_words(text)))
        return steps, candidates


def _token_prob(s: ModelView, text: str, eos: bool) -> float:
    if eos:
        return math.exp(end_logprob(s, s.next_logprobs))
    new = s.encode(s.text + text)
    tail = new[len(s.ids):] if new[: len(s.ids)] == s.ids else []
    return math.exp(float(s.next_logprobs[tail[0]])) if len(tail) == 1 else 0.0


METHODS: dict[str, Method] = {
    "adafuse": AdaFuse(),
    "beam": AdaFuse(diversity=False),
    "fixed-span": FixedSpan(),
    "greedy": Greedy(),
    "token-union": TokenUnion(),
    "mixture": Mixture(),
}
