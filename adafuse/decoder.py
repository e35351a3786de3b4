"""The round loop: sessions -> proposals -> pool -> scores -> choice -> trace."""
from __future__ import annotations

import math
import random
import time
from dataclasses import replace
from typing import Iterator, Sequence

import torch

from .candidates import Proposal, beam, end_logprob, explore, greedy_span, margin
from .config import DecodeConfig
from .errors import ConfigError, PromptError
from .loading import LoadedModel, get_model
from .scoring import score_candidates
from .session import ModelSession
from .trace import Candidate, ModelStep, Round, Trace
from .words import count_words, find_stop

MAX_MODELS = 4


def _validate_prompt(prompt) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptError("the prompt is empty: type a question or pick an example")
    return prompt


class Decoding:
    """One prompt being decoded. `propose()` decides a round, `commit()` appends it (optionally another
    candidate: counterfactual steering); iterating runs `step()` until a stop."""

    def __init__(self, models: Sequence[LoadedModel], config: DecodeConfig, prompt: str):
        self.config = config
        self.models = list(models)
        self.names = _unique_names(self.models)
        t0 = time.perf_counter()
        self.sessions = [ModelSession(lm, _validate_prompt(prompt), config.mode) for lm in self.models]
        self.trace = Trace(
            prompt=prompt, models=self.names, settings=config.to_dict(),
            prompt_modes={n: s.mode_used for n, s in zip(self.names, self.sessions)},
            prefill={n: {"prompt_tokens": s.prompt_tokens, "reused_tokens": s.prefix_reused,
                         "forward_passes": s.forward_passes,
                         "tokens_fed": s.tokens_fed, "seconds": s.seconds} for n, s in zip(self.names, self.sessions)},
            devices={n: str(lm.device) for n, lm in zip(self.names, self.models)},
            seconds=time.perf_counter() - t0,
        )
        self.pending: Round | None = None
        self.done = False
        self.rng = random.Random(config.seed)
        if config.weights and len(config.weights) != len(self.models):
            raise ConfigError(f"weights has {len(config.weights)} values for {len(self.models)} models: give one per model")

    # ---- one round ----
    def propose(self) -> Round:
        """Decide the next round (proposals, pool, scores, winner) without appending it."""
        if self.done:
            raise ConfigError("this decode has finished: start a new one")
        if self.pending is not None:
            return self.pending
        cfg = self.config
        t0 = time.perf_counter()
        before = [s.stats() for s in self.sessions]
        if cfg.method == "token-union":
            return self._finish(self._token_union(), before, t0)
        writer = None
        if cfg.method == "mixture":
            writer = self.rng.choices(range(len(self.sessions)), weights=cfg.weights or None)[0]
        budget = max(1, cfg.max_new_words - self.trace.words)
        keys: dict[tuple[str, bool], int] = {}
        words: list[int] = []
        proposers: list[list[str]] = []
        own: list[dict[int, Proposal]] = [{} for _ in self.sessions]
        steps = []
        for m, (name, s) in enumerate(zip(self.names, self.sessions)):
            if writer is not None and m != writer:
                steps.append(ModelStep(model=name, mode="idle", margins=[], proposals=[]))
                continue
            proposals, mode, margins = self._propose_one(s, budget)
            indices = []
            for p in proposals:
                if p.text == "" and not p.eos:
                    continue
                key = (p.text, p.eos)
                if key not in keys:
                    keys[key] = len(keys)
                    proposers.append([])
                    words.append(p.words)
                i = keys[key]
                if name not in proposers[i]:
                    proposers[i].append(name)
                own[m].setdefault(i, p)
                if i not in indices:
                    indices.append(i)
            steps.append(ModelStep(model=name, mode=mode, margins=margins, proposals=indices))
        cands = list(keys)
        if not cands:  # nothing but empty text: cannot move
            cands, proposers, words = [("", True)], [[]], [0]
        nll: list[dict] = [{} for _ in cands]
        ntok: list[dict] = [{} for _ in cands]
        strad: list[dict] = [{} for _ in cands]
        if len(cands) > 1 or cfg.score_single:
            for m, (name, s) in enumerate(zip(self.names, self.sessions)):
                for i, sc in enumerate(score_candidates(s, cands, own[m])):
                    nll[i][name], ntok[i][name], strad[i][name] = sc.nll, sc.n_tokens, sc.straddle
        fused = [sum(d.values()) / len(d) if d else None for d in nll]
        candidates = [Candidate(text=t, eos=e, proposers=proposers[i], nll=nll[i], n_tokens=ntok[i], fused=fused[i],
                                words=words[i], straddle=strad[i]) for i, (t, e) in enumerate(cands)]
        return self._finish((steps, candidates), before, t0)

    def _finish(self, decided: tuple[list[ModelStep], list[Candidate]], before, t0: float) -> Round:
        """Pick the winner (argmin fused score, ties to the first) and hold the round as pending."""
        steps, candidates = decided
        winner = min(range(len(candidates)),
                     key=lambda i: (candidates[i].fused if candidates[i].fused is not None else 0.0, i))
        for step, s, b in zip(steps, self.sessions, before):
            f, t, sec = s.stats()
            step.forward_passes, step.tokens_fed, step.seconds = f - b[0], t - b[1], sec - b[2]
        self.pending = Round(index=len(self.trace.rounds), steps=steps, candidates=candidates, chosen=winner,
                             winner=winner, text=candidates[winner].text, words=candidates[winner].words,
                             seconds=time.perf_counter() - t0)
        return self.pending

    def _token_union(self) -> tuple[list[ModelStep], list[Candidate]]:
        """UniTE-style step: the union (by decoded text) of every model's top-k next tokens, each scored by the
        probability every model gives that text as one token (0 if it cannot), averaged over models."""
        k = self.config.union_top_k
        texts: dict[tuple[str, bool], list[str]] = {}
        steps = []
        for name, s in zip(self.names, self.sessions):
            s.rewind()
            mine = []
            for t in torch.topk(s.next_logprobs, k).indices.tolist():
                key = ("", True) if t in s.lm.end_ids else (s.decode_after(s.ids, [t]), False)
                if key[0] == "" and not key[1]:
                    continue
                proposers = texts.setdefault(key, [])
                if name not in proposers:
                    proposers.append(name)
                mine.append(list(texts).index(key))
            steps.append(ModelStep(model=name, mode="token", margins=[margin(s.next_logprobs)], proposals=mine))
        candidates = []
        for (text, eos), proposers in texts.items():
            probs = {name: self._token_prob(s, text, eos) for name, s in zip(self.names, self.sessions)}
            mean = sum(probs.values()) / len(probs)
            candidates.append(Candidate(text=text, eos=eos, proposers=proposers,
                                        nll={n: -math.log(max(p, 1e-30)) for n, p in probs.items()},
                                        n_tokens={n: 1 if p > 0 else 0 for n, p in probs.items()},
                                        fused=-math.log(max(mean, 1e-30)), words=count_words(text)))
        return steps, candidates

    @staticmethod
    def _token_prob(s: ModelSession, text: str, eos: bool) -> float:
        if eos:
            return math.exp(end_logprob(s, s.next_logprobs))
        new = s.encode(s.text + text)
        tail = new[len(s.ids):] if new[: len(s.ids)] == s.ids else []
        return math.exp(float(s.next_logprobs[tail[0]])) if len(tail) == 1 else 0.0

    def _propose_one(self, s: ModelSession, budget: int) -> tuple[list[Proposal], str, list[float]]:
        cfg = self.config
        if cfg.method == "greedy":
            p, margins = greedy_span(s, 1, None, cfg.max_word_tokens)
            return [p], "greedy", margins
        if cfg.method == "fixed-span":
            p, margins = greedy_span(s, min(cfg.span_words, budget), None, cfg.max_word_tokens)
            return [p], "span", margins
        delta = margin(s.next_logprobs)
        if delta >= cfg.tau:
            p, margins = greedy_span(s, min(cfg.max_words, budget), cfg.tau, cfg.max_word_tokens)
            return [p], "commit", margins
        if cfg.diversity and cfg.method == "adafuse":
            return explore(s, cfg.branches, cfg.explore_top_k, cfg.max_word_tokens), "explore", [delta]
        return beam(s, cfg.branches, cfg.max_word_tokens), "beam", [delta]

    def commit(self, choice: int | None = None) -> Round:
        """Append the winner (or candidate `choice`, marking the round overridden) and apply stop rules."""
        r = self.propose()
        if choice is not None:
            if isinstance(choice, bool) or not isinstance(choice, int) or not 0 <= choice < len(r.candidates):
                raise ConfigError(f"choice={choice!r} is not a candidate of round {r.index}: pick 0..{len(r.candidates) - 1}")
            r.chosen, r.overridden = choice, choice != r.winner
        cfg, t0 = self.config, time.perf_counter()
        cand = r.candidates[r.chosen]
        old = self.trace.output
        new = old + cand.text
        longest = max((len(x) for x in cfg.stop), default=0)
        cut = find_stop(new, cfg.stop, len(old) - longest + 1) if cfg.stop else None
        stop = None
        if cut is not None:
            new, stop = new[:cut], "stop string"
        elif cand.eos:
            stop = "eos"
        elif cand.text == "":
            stop = "no progress"
        r.text = new[len(old):]
        if cfg.method == "token-union":  # tokens, not words: count the words the token completes or starts
            r.words = count_words(new) - count_words(old)
        else:
            r.words = cand.words if r.text == cand.text else min(cand.words, count_words(r.text))
        if stop is None and self.trace.words + r.words >= cfg.max_new_words:
            stop = "max_new_words"
        if stop is None:
            before = [s.stats() for s in self.sessions]
            for s in self.sessions:
                s.commit(new)
            for step, s, b in zip(r.steps, self.sessions, before):
                f, t, sec = s.stats()
                step.forward_passes += f - b[0]
                step.tokens_fed += t - b[1]
                step.seconds += sec - b[2]
            if max(len(s.ids) - s.prompt_tokens for s in self.sessions) >= cfg.max_new_tokens:
                stop = "max_new_tokens"
            elif any(s.lm.max_positions and len(s.ids) + cfg.max_word_tokens * cfg.max_words >= s.lm.max_positions
                     for s in self.sessions):
                stop = "context full"
        r.stop = stop
        r.seconds += time.perf_counter() - t0
        self.trace.rounds.append(r)
        self.trace.output = new
        self.trace.seconds += r.seconds
        self.pending = None
        if stop:
            self.done = True
            self.trace.stop_reason = stop
        return r

    def step(self) -> Round:
        return self.commit()

    def cancel(self) -> None:
        """Stop between rounds; the trace keeps what was decided."""
        self.pending = None
        if not self.done:
            self.done = True
            self.trace.stop_reason = "cancelled"

    def __iter__(self) -> Iterator[Round]:
        while not self.done:
            yield self.step()


def _unique_names(models: Sequence[LoadedModel]) -> list[str]:
    names: list[str] = []
    for lm in models:
        name, k = lm.name, 2
        while name in names:
            name, k = f"{lm.name}#{k}", k + 1
        names.append(name)
    return names


class AdaFuse:
    """Word-level ensemble decoding of 2 to 4 causal LMs (or one model with method="greedy")."""

    def __init__(self, models: Sequence[LoadedModel | str], config: DecodeConfig | None = None, **settings):
        if isinstance(models, (str, LoadedModel)):
            models = [models]
        config = replace(config, **settings) if config is not None else DecodeConfig(**settings)
        count = len(models)
        if config.method == "greedy" and count != 1:
            raise ConfigError(f"method 'greedy' runs exactly one model, got {count}: pass one model")
        if config.method not in ("greedy",) and not 2 <= count <= MAX_MODELS:
            raise ConfigError(f"an ensemble needs 2 to {MAX_MODELS} models, got {count}: "
                              "add models, or use method='greedy' for a single model")
        self.models = [get_model(m) if isinstance(m, str) else m for m in models]
        self.config = config

    def start(self, prompt: str) -> Decoding:
        return Decoding(self.models, self.config, prompt)

    def stream(self, prompt: str) -> Iterator[Round]:
        """Yield each round as it is decided and appended."""
        yield from self.start(prompt)

    def generate(self, prompt: str) -> Trace:
        d = self.start(prompt)
        for _ in d:
            pass
        return d.trace


def greedy(model: LoadedModel | str, prompt: str, config: DecodeConfig | None = None) -> Trace:
    """One model alone through the same machinery (same words, stops and costs)."""
    cfg = replace(config or DecodeConfig(), method="greedy")
    return AdaFuse([model], cfg).generate(prompt)
