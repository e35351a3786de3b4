"""Decoding methods: one object per decode, each deciding what its models do in a round.

Each method class has a `name` and its own frozen `Settings` (a `MethodSettings`); the registry
(adafuse/method_registry.py) lists the built-in ones (`BUILT_IN`) and any registered later, and `DecodeConfig.method` is
a spec naming one ("fixed-span-2", "mixture[seed=3]"). The decoder makes one
object per decode (`make_method`) and hands it a `RoundContext` each round, never its own internals; the CLI, the
harness, lm-eval, the server and the app read the same registry. The decoder runs every method the same way: the models the
method lets act this round propose (`propose`), the pool is the union of their proposals, and every model scores it
when the method scores; a method that builds its whole round itself (token union) returns it from `own_round`.
"""
from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass, field, fields
from typing import Any, Sequence

import torch

from .candidates import Proposal, beam, explore, greedy_span, sample_word
from .errors import ConfigError
from .selection import check_exploration
from .trace import Candidate, ModelStep, StepMode
from .view import ModelView
from .words import count_words
from .writer import best_token, end_logprob, margin

# A decode's settings: a `DecodeConfig` (adafuse/config.py), named here without importing it — the config reads the
# method registry, which holds these methods, so an import back (even for type checkers) would close a circle.
Config = Any

MAX_MODELS = 4  # the most models an ensemble decodes


@dataclass(frozen=True)
class MethodSettings:
    """A method's own settings. Each field's metadata: `range` (low, high) and `help` (what it does, for the CLI's
    flags and the docs); a field with a range holds a whole number when its default is one, else any number."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value, (low, high) = getattr(self, f.name), f.metadata["range"]
            whole = isinstance(f.default, int)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and not isinstance(value, int)) \
                    or math.isnan(value) or not low <= value <= high:
                kind = "a whole number" if whole else "a number"
                raise ConfigError(f"{f.name}={value!r} is invalid: use {kind} from {low} to {high} "
                                  f"(default {f.default})")
            if not whole:
                object.__setattr__(self, f.name, float(value))


def setting(default, low, high, help: str):
    """A field of a method's settings (see `MethodSettings`)."""
    return field(default=default, metadata={"range": (low, high), "help": help})


@dataclass
class RoundContext:
    """What a method sees of the decode in one round: the models' views and plain values for the round, never a way
    back into the decoder (methods run on the models' worker threads)."""
    config: Config
    views: list[ModelView]                  # each model's view, in the decode's model order
    names: list[str]                        # the models' names in the trace (a model given twice: "m", "m#2")
    output: str                             # the text committed so far
    budget: int                             # words left before max_new_words
    # for `propose(ctx, m)`, set just before model m proposes: the texts it verifies before writing (speculative
    # proposals: one after another, the spans of the models that proposed before it this round; every model's span
    # left over from the last round), and the prompt-lookup drafts (`draft_lookup`)
    drafts: list[str] = field(default_factory=list)
    lookups: list[str] = field(default_factory=list)
    last_writer: int | None = None          # the first model that acted in the previous round (None in round 0)
    busy: frozenset[int] = frozenset()      # models still catching up in the background (their views are not read)


@dataclass
class Proposed:
    """One model's part of a round: its proposals, what it did, the margins it looked at, and (an explore step) how
    its first tokens were chosen (`ModelStep.selection`)."""
    proposals: list[Proposal]
    mode: StepMode
    margins: list[float]
    selection: dict = field(default_factory=dict)


class Method:
    """A proposer: every model acts every round, the pool is scored by every model."""
    name = ""                    # its name in the registry and in specs
    Settings = MethodSettings    # its own settings (none by default)
    suffix = ""                  # the setting a spec's "-N" sets ("fixed-span-2")
    summary = ""
    label = ""                   # how the app names it beside the main decode ({field}: its own settings)
    specs: tuple[str, ...] = ()  # how the evaluation harness names its runs (default: the method's own name)
    models = (2, MAX_MODELS)     # how many models it decodes with
    scores = True     # the pool is scored by every model
    lazy = False      # models that did not act this round catch up later (when next drawn, or in the background)
    overlaps = True   # models sharing the CPU may run side by side (False: one works at a time, they take turns)
    weighted = True   # `DecodeConfig.weights` (or a gate) enters the fused score of the pool

    def __init__(self, config: Config):
        """Per-decode state from the settings the decode starts with (its own: `self.settings`)."""
        self.settings = config.method_settings

    @classmethod
    def title(cls, settings: MethodSettings) -> str:
        """How the app names a decode of this method with these settings."""
        return cls.label.format(**{f: getattr(settings, f) for f in settings.__dataclass_fields__})

    @classmethod
    def check(cls, models: Sequence, config: Config) -> None:
        """Raise ConfigError, before any model prefills (and on a change of settings), for settings these models
        cannot decode with."""

    @classmethod
    def check_count(cls, count: int) -> None:
        """Raise ConfigError when `count` models are not what this method decodes with (before loading any)."""
        low, high = cls.models
        if low == high == 1 and count != 1:
            raise ConfigError(f"method {cls.name!r} runs exactly one model, got {count}: pass one model")
        if not low <= count <= high:
            raise ConfigError(f"an ensemble needs {low} to {high} models, got {count}: "
                              "add models, or use method='greedy' for a single model")

    def acting(self, ctx: RoundContext) -> list[int]:
        return list(range(len(ctx.views)))

    def drawn(self, ctx: RoundContext) -> list[int]:
        """Models that may act in some round (a lazy method catches only these up)."""
        return list(range(len(ctx.views)))

    def guess(self, ctx: RoundContext, m: int) -> str:
        """Text model m, about to catch up on words it did not see, will likely write next ("": none): fed in the
        catch-up's forward, it saves the writer a forward where it agrees."""
        return ""

    def propose(self, ctx: RoundContext, m: int) -> Proposed:
        """Model m's part of the round (`ctx.views[m]`, on its worker thread: touch nothing shared)."""
        raise NotImplementedError

    def own_round(self, ctx: RoundContext) -> tuple[list[ModelStep], list[Candidate]] | None:
        """A whole round built by the method itself (None: propose, pool and score as usual)."""
        return None

    def words_added(self, old: str, new: str, candidate: Candidate) -> int:
        """Words a round adds when the committed text goes from `old` to `new` with `candidate` chosen (`new` may be
        cut short by a stop)."""
        text = new[len(old):]
        return candidate.words if text == candidate.text else min(candidate.words, count_words(text))


class AdaFuseMethod(Method):
    """Confident models (Δ ≥ τ) commit a greedy span of up to M words; uncertain ones explore B first tokens chosen by
    `exploration` (distinct surface forms, or probability against redundancy in embedding space) or, with `diversity`
    off, run a width-B beam search over the word. Each explore step records its selection (`ModelStep.selection`)."""
    name = "adafuse"
    summary = "AdaFuse: confident models commit up to M words, uncertain ones explore B candidates"
    label = "AdaFuse"
    diverse: bool | None = None  # None: as `DecodeConfig.diversity` says

    @classmethod
    def _diverse(cls, config) -> bool:
        return config.diversity if cls.diverse is None else cls.diverse

    @classmethod
    def check(cls, models, config):
        if config.exploration == "embedding" and cls._diverse(config):  # only diverse exploration selects tokens
            check_exploration(models)

    def propose(self, ctx, m):
        cfg, s = ctx.config, ctx.views[m]
        delta = margin(s.next_logprobs)
        if delta >= cfg.tau:
            p, margins = greedy_span(s, min(cfg.max_words, ctx.budget), cfg.tau, cfg.max_word_tokens,
                                     drafts=ctx.drafts, guesses=ctx.lookups)
            return Proposed([p], StepMode.COMMIT, margins)
        if self._diverse(cfg):
            record: dict = {}
            proposals = explore(s, cfg.branches, cfg.explore_top_k, cfg.max_word_tokens, cfg.exploration,
                                cfg.explore_lambda, record)
            return Proposed(proposals, StepMode.EXPLORE, [delta], record)
        return Proposed(beam(s, cfg.branches, cfg.explore_top_k, cfg.max_word_tokens), StepMode.BEAM, [delta])


class Greedy(Method):
    """One model alone, word by word, through the same machinery."""
    name = "greedy"
    summary = "one model alone, word by word"
    label = "greedy"
    models = (1, 1)
    weighted = False  # one model, one candidate a round

    def propose(self, ctx, m):
        p, margins = greedy_span(ctx.views[m], 1, None, ctx.config.max_word_tokens)
        return Proposed([p], StepMode.GREEDY, margins)


class Beam(AdaFuseMethod):
    """AdaFuse with diversity off: an uncertain model runs a width-B beam search over the word (the paper's
    ablation)."""
    name = "beam"
    summary = "AdaFuse with a width-B beam search over the word instead of diverse exploration"
    label = "beam (no diversity)"
    diverse = False


@dataclass(frozen=True)
class SpanSettings(MethodSettings):
    span_words: int = setting(1, 1, 64, "n: the words every model proposes in a round")


class FixedSpan(Method):
    """Every model proposes its greedy span of exactly n words (SweetSpan-like); the pool is scored."""
    name = "fixed-span"
    Settings = SpanSettings
    suffix = "span_words"
    summary = "every model proposes its greedy span of n words (fixed-span-N); the pool is scored"
    label = "fixed span {span_words}"
    specs = ("fixed-span-1", "fixed-span-2", "fixed-span-3")

    def propose(self, ctx, m):
        cfg = ctx.config
        p, margins = greedy_span(ctx.views[m], min(self.settings.span_words, ctx.budget), None, cfg.max_word_tokens,
                                 drafts=ctx.drafts, guesses=ctx.lookups)
        return Proposed([p], StepMode.SPAN, margins)


@dataclass(frozen=True)
class UnionSettings(MethodSettings):
    union_top_k: int = setting(5, 1, 1000, "k: each model's top-k next tokens enter the union")


class TokenUnion(Method):
    """UniTE-style: the union (by decoded text) of every model's top-k next tokens, each scored by the probability
    every model gives that text as one token (0 if it cannot), averaged over models."""
    name = "token-union"
    Settings = UnionSettings
    summary = "token union (UniTE-style): every model's top-k next tokens, averaged probabilities"
    label = "token union (UniTE-style)"
    weighted = False  # a plain mean of probabilities

    @classmethod
    def check(cls, models, config):
        vocab, k = min(lm.vocab_size for lm in models), config.method_settings.union_top_k
        if k > vocab:
            raise ConfigError(f"union_top_k={k} is larger than a model's vocabulary ({vocab}): "
                              "use fewer")
        if config.gate:  # weights never enter a plain mean (`weighted` False): a gate would be read and not used
            raise ConfigError(f"gate={config.gate!r} is invalid with method {cls.name!r}: it averages the models' "
                              "probabilities equally, so a learned gate has nothing to weigh; leave the gate empty or "
                              "use a scored method (adafuse, beam, fixed-span)")

    def own_round(self, ctx):
        k = self.settings.union_top_k
        names = ctx.names
        texts: dict[tuple[str, bool], list[str]] = {}
        steps = []
        for name, s in zip(names, ctx.views):
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
            steps.append(ModelStep(model=name, mode=StepMode.TOKEN, margins=[margin(s.next_logprobs)],
                                   proposals=mine))
        candidates = []
        for (text, eos), proposers in texts.items():
            probs = {name: _token_prob(s, text, eos) for name, s in zip(names, ctx.views)}
            mean = sum(probs.values()) / len(probs)
            candidates.append(Candidate(text=text, eos=eos, proposers=proposers,
                                        nll={n: -math.log(max(p, 1e-30)) for n, p in probs.items()},
                                        n_tokens={n: 1 if p > 0 else 0 for n, p in probs.items()},
                                        fused=-math.log(max(mean, 1e-30)), words=count_words(text)))
        return steps, candidates

    def words_added(self, old, new, candidate):
        """Tokens, not words: count the words the token completes or starts."""
        return count_words(new) - count_words(old[: len(new)])


def _token_prob(s: ModelView, text: str, eos: bool) -> float:
    """p of the next token being `text` (or the end of the answer), exact where the view holds a top-k only."""
    if eos:
        return math.exp(end_logprob(s, s.next_exact(sorted(s.end_ids))))
    new = s.encode(s.text + text)
    tail = new[len(s.ids):] if new[: len(s.ids)] == s.ids else []
    return math.exp(float(s.next_exact(tail)[tail[0]])) if len(tail) == 1 else 0.0


@dataclass(frozen=True)
class MixtureSettings(MethodSettings):
    seed: int = setting(0, 0, 2**31 - 1, "the random seed that draws each word's writer")
    temperature: float = setting(1.0, 0.0, 10.0, "the drawn model samples its word at this temperature (0: greedily)")


class Mixture(Method):
    """Word-level mixture of experts (ME): each round one model, drawn with `weights` and `seed`, writes the next word
    by sampling at `temperature` (0: greedily). No other model proposes or scores; the others catch up with one
    forward over the accumulated text when they are next drawn, and that forward also feeds the token the last
    writer would write next (`guess`): where the new writer writes it too, the forward that follows its first token
    is saved. One model works at a time, so on a shared CPU the models take turns (each with every core) unless
    side by side is asked for; side by side, the idle models catch up in the background."""
    name = "mixture"
    Settings = MixtureSettings
    summary = "word-level mixture: each word written by one model drawn at random, nothing scored"
    label = "mixture (ME)"
    scores = False
    lazy = True
    overlaps = False
    weighted = False  # the weights draw the writer; nothing is scored

    def __init__(self, config):
        super().__init__(config)
        self.rng = random.Random(self.settings.seed)
        self.generator = torch.Generator().manual_seed(self.settings.seed)

    def acting(self, ctx):
        return [draw_writer(self.rng.random(), len(ctx.views), ctx.config.weights)]

    def drawn(self, ctx):
        weights = ctx.config.weights
        return [m for m in range(len(ctx.views)) if not weights or weights[m] > 0]

    def guess(self, ctx, m):
        """The next token of a model that is up to date (the last writer first: the token that told it its word had
        ended), as text. Only models with nothing running in the background are read."""
        for o in sorted(range(len(ctx.views)), key=lambda o: o != ctx.last_writer):
            s = ctx.views[o]
            if o == m or s.text != ctx.output or o in ctx.busy:
                continue
            t = best_token(s, s.next_logprobs)
            return "" if t in s.end_ids else s.decode_after(s.ids, [t])
        return ""

    def propose(self, ctx, m):
        cfg, s = ctx.config, ctx.views[m]
        return Proposed([sample_word(s, self.settings.temperature, self.generator, cfg.max_word_tokens)], StepMode.WRITE,
                        [margin(s.next_logprobs)])


def draw_writer(u: float, count: int, weights) -> int:
    """The model `random.choices(range(count), weights)` draws when its one call to `random()` returns `u`."""
    if not weights:
        return math.floor(u * count)
    cum = list(itertools.accumulate(weights))
    return bisect.bisect(cum, u * cum[-1], 0, count - 1)


# the methods this package defines, in the order the entry points list them (the registry holds them and any other)
BUILT_IN = (AdaFuseMethod, Greedy, Beam, FixedSpan, TokenUnion, Mixture)
# what an evaluation runs unless told: AdaFuse against each model alone
BASELINE = (AdaFuseMethod.name, Greedy.name)


def make_method(config: Config) -> Method:
    """The method object of one decode."""
    return config.method_class(config)
