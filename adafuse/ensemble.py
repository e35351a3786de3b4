"""The library's entry point: an ensemble of models with its settings, decoding prompts into traces."""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Iterable, Iterator, Sequence

from .config import DecodeConfig
from .errors import PromptError
from .decoder import Decoding, unique_names
from .fusion import checked_gate
from .models import LoadedModel, get_model
from .many import DEFAULT_CONCURRENCY, run_many
from .methods import Greedy
from .replay import branch_from
from .scorer import Likelihood, Scorer
from .trace import Round, Trace
from .words import count_words


class AdaFuse:
    """Word-level ensemble decoding of 2 to 4 causal LMs (or one model alone with method="greedy")."""

    def __init__(self, models: Sequence[LoadedModel | str], config: DecodeConfig | None = None,
                 parallel: bool | None = None, threads: int | None = None, **settings):
        if isinstance(models, (str, LoadedModel)):
            models = [models]
        config = DecodeConfig.of(config, **settings) if settings or config is None else config
        config.check_models(len(models))  # before any model loads
        self.models = [get_model(m) if isinstance(m, str) else m for m in models]
        self.config = config
        self.parallel = parallel  # models side by side, one worker each (False: one after another; None: choose)
        self.threads = threads    # torch CPU threads per worker (default: the cores shared out)

    def start(self, prompt: str) -> Decoding:
        return Decoding(self.models, self.config, prompt, self.parallel, self.threads)

    def stream(self, prompt: str) -> Iterator[Round]:
        """Yield each round as it is decided and appended."""
        yield from self.start(prompt)

    def generate(self, prompt: str) -> Trace:
        d = self.start(prompt)
        for _ in d:
            pass
        return d.trace

    def generate_many(self, prompts: Iterable[str], concurrency: int = DEFAULT_CONCURRENCY) -> list[Trace]:
        """Decode every prompt with up to `concurrency` decodes in flight; the traces in the prompts' order, each
        the trace `generate` gives for that prompt alone (the models' forwards are shared among the decodes in flight:
        models/batching.py). The first prompt that fails raises its error."""
        return list(run_many([functools.partial(self.generate, p) for p in prompts], concurrency))

    def scorer(self) -> Scorer:
        """Scores given text with these models, fused with this ensemble's weights or learned gate."""
        names = unique_names(self.models)
        return Scorer(self.models, names, self.config.weights, checked_gate(self.config, names), self.config.tau)

    def score(self, context: str, continuations: Sequence[str], is_greedy: bool = False) -> list[Likelihood]:
        """How likely each model finds each continuation after `context`, each in its own tokens, and the fused
        log-likelihood (adafuse/scorer.py says where the boundary falls). With `is_greedy`, also whether the fused
        decode of `context` writes the continuation: one decode of as many words as the longest continuation."""
        scored = self.scorer().score(context, continuations)
        if is_greedy and context.strip() and scored:
            words = max(1, max(count_words(c) for c in continuations))
            cfg = replace(self.config, max_new_words=words, stop=(), mode="raw", system="", history=())  # the text as is
            try:
                out = AdaFuse(self.models, cfg, self.parallel, self.threads).generate(context).output
            except PromptError:  # a context longer than a model's window: scoring truncated it, a decode cannot
                out = None
            for s in scored:
                s.is_greedy = None if out is None or not s.continuation.strip() else \
                    out.startswith(s.continuation) and not out[len(s.continuation):][:1].isalnum()  # " 1" of " 10": no
        return scored

    def score_rolling(self, text: str) -> Likelihood:
        """How likely each model finds the whole of `text` from its start (windows of each model's context size) and
        the fused log-likelihood."""
        return self.scorer().rolling(text)

    def branch(self, trace: Trace, round_index: int, candidate: int) -> Decoding:
        """`branch_from` with these models: the trace's own settings decide, not this object's config."""
        return branch_from(self.models, trace, round_index, candidate, self.parallel, self.threads)


def greedy(model: LoadedModel | str, prompt: str, config: DecodeConfig | None = None) -> Trace:
    """One model alone through the same machinery (same words, stops and costs)."""
    cfg = replace(config or DecodeConfig(), method=Greedy.name, weights=(), gate="")  # alone: no ensemble weights
    return AdaFuse([model], cfg).generate(prompt)
