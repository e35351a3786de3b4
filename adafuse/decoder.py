"""The round loop: sessions -> proposals -> pool -> scores -> choice -> trace."""
from __future__ import annotations

import time
import weakref
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator, Sequence

from .candidates import Proposal
from .config import DecodeConfig
from .errors import ConfigError, PromptError, ReplayError
from .gate import Gate, entropy, features, load_gate
from .loading import LoadedModel, get_model
from .methods import METHODS
from .parallel import Workers
from .remote import RemoteModel
from .report import candidate_label
from .scoring import candidate_nll, score_candidates
from .selection import check_exploration
from .session import LocalSession
from .trace import Candidate, ModelStep, Round, Trace
from .view import ModelView
from .words import count_words, find_stop, lookup_continuations

MAX_MODELS = 4
# settings that only steer the rounds still to come (`Decoding.reconfigure`)
LIVE_SETTINGS = ("tau", "max_words", "branches", "diversity", "exploration", "explore_lambda", "max_new_words",
                 "max_new_tokens", "weights", "gate", "speculate", "draft_lookup",
                 "normalize")


class Decoding:
    """One prompt being decoded. `propose()` decides a round, `commit()` appends it (optionally another
    candidate: counterfactual steering); iterating runs `step()` until a stop."""

    def __init__(self, models: Sequence[LoadedModel], config: DecodeConfig, prompt: str,
                 parallel: bool | None = None, threads: int | None = None):
        self.config = config
        self.models = list(models)
        self.names = _unique_names(self.models)
        self.method = METHODS[config.method]
        _validate(self.models, config, prompt)  # every check before any model prefills
        t0 = time.perf_counter()
        # each phase of a round runs the models side by side (one worker each) or one after another: `parallel`
        # True/False, or None to choose (side by side when each model has its own GPU, server or the CPU; see `Workers`);
        # `threads`: torch CPU threads per worker (default: the cores shared out)
        self.workers = Workers(self.models, parallel, threads, probe=self.method.overlaps)
        weakref.finalize(self, self.workers.close)
        self.sessions: list[ModelView] = self.workers.map(
            lambda m: _open_view(self.models[m], prompt, config), range(len(self.models)))
        self.trace = Trace(
            prompt=prompt, models=self.names, settings=config.to_dict(),
            prompt_modes={n: s.mode_used for n, s in zip(self.names, self.sessions)},
            prefill={n: {"prompt_tokens": s.prompt_tokens, "reused_tokens": s.prefix_reused,
                         "forward_passes": s.forward_passes,
                         "tokens_fed": s.tokens_fed, "seconds": s.seconds, "cached_tokens": s.stats()[3]}
                     for n, s in zip(self.names, self.sessions)},
            devices={n: ", ".join(lm.devices) for n, lm in zip(self.names, self.models)},
            workers=self.workers.describe(),
            seconds=time.perf_counter() - t0,
        )
        # text that ends the answer wherever it appears: the stop strings and every model's end-token strings
        self.enders = tuple(config.stop) + tuple(sorted({e for lm in self.models for e in lm.end_strings()}))
        self.pending: Round | None = None
        self.gate_object: Gate | None = None
        self._gated: tuple[dict, dict] | None = None  # this round's gate weights and features, until `propose` uses them
        self._next_config: DecodeConfig | None = None  # `reconfigure` while a round is pending
        # speculative proposals: texts proposed so far this round per model, and each model's own span left over from
        # the last round (what it proposed past the committed text)
        self._proposed: dict[int, list[str]] = {}
        self._leftover: dict[int, str] = {}
        self._cut_by_stop: set[int] = set()  # this round's candidates a proposal ended by holding a stop string
        self._costs: dict[int, int] = {}
        self._guesses: tuple[tuple | None, list[str]] = (None, [])  # prompt lookup of the current round
        self._behind: dict[int, Future] = {}  # idle models' catch-ups running in the background (lazy methods)
        self._charged = [_snapshot(s) for s in self.sessions]  # cost counters as last charged to a round
        self.done = False
        self.method.start(self)

    # ---- one round ----
    def propose(self) -> Round:
        """Decide the next round (proposals, pool, scores, winner) without appending it."""
        if self.done:
            raise ConfigError("this decode has finished: start a new one")
        if self.pending is not None:
            return self.pending
        t0 = time.perf_counter()
        with self._fatal():
            decided = self.method.round(self)
            if decided is None:
                decided = self._pool_round()
        steps, candidates = decided
        self._charge(steps)
        winner = min(range(len(candidates)), key=lambda i: (candidates[i].fused is None, candidates[i].fused or 0.0, i))
        weights, feats = self._gated if self._gated is not None else (self.weights() if self.method.scores else {}, {})
        self._gated = None
        self.pending = Round(index=len(self.trace.rounds), steps=steps, candidates=candidates, chosen=winner,
                             winner=winner, text=candidates[winner].text, words=candidates[winner].words,
                             seconds=time.perf_counter() - t0, weights=weights, features=feats)
        return self.pending

    def _pool_round(self) -> tuple[list[ModelStep], list[Candidate]]:
        """The acting models propose; the pool is the union of their proposals by exact (text, end); every model
        scores it when the method scores and there is a choice to make."""
        cfg = self.config
        budget = max(1, cfg.max_new_words - self.trace.words)
        acting = set(self.method.acting(self))
        output = self.trace.output
        # a lazy method's idle models catch up in the background when the models run side by side: the round does not
        # wait for them, and a model drawn later finishes its catch-up first; one after another they catch up only
        # when next drawn (one forward over every word they missed)
        side_by_side = self.workers.enabled and self.workers.parallel
        for m in acting:
            behind = self._behind.pop(m, None)
            if behind is not None:
                behind.result()  # done, or waited for (its error, if any, is this round's)
        for m in self.method.drawn(self):
            if side_by_side and m not in acting and self.sessions[m].text != output:
                self._catch_up_later(m, output)

        gate = self.gate()
        entropies: dict[int, float] = {}
        # what a model catching up will likely write next rides along in its catch-up's forward (read here, before
        # the models' workers start)
        guesses = {m: self.method.guess(self, m) for m in acting if self.sessions[m].text != output}

        def act(m: int):
            s = self.sessions[m]
            if s.text != output:  # a lazy method's model catching up on the words it did not commit
                s.commit(output, guesses.get(m, ""))
            if gate is not None and m in acting:  # what the model shows at the word start, before it proposes
                entropies[m] = entropy(s.next_logprobs)
            if m not in acting:
                return None
            proposed = self.method.propose(self, s, budget)
            self._proposed[m] = [p.text for p in proposed[0] if p.text.strip()]
            return proposed

        moving = sorted(acting)
        self._proposed = {}
        if cfg.speculate and not side_by_side:  # the cheapest model first: its span is the others' draft
            moving.sort(key=lambda m: (self._cost(m), m))
        done = dict(zip(moving, self.workers.map(act, moving)))
        keys: dict[tuple[str, bool], int] = {}
        self._cut_by_stop = set()
        words: list[int] = []
        proposers: list[list[str]] = []
        own: list[dict[int, Proposal]] = [{} for _ in self.sessions]
        steps = []
        for m, name in enumerate(self.names):
            if m not in acting:
                steps.append(ModelStep(model=name, mode="idle", margins=[], proposals=[]))
                continue
            proposals, mode, margins = done[m]
            indices = []
            for p in proposals:
                head, eos, at_stop = self._ending_at(p.text, p.eos)
                key = (head, eos)
                if key[0] == "" and not key[1]:
                    continue
                if key not in keys:
                    keys[key] = len(keys)
                    proposers.append([])
                    words.append(p.words if key[0] == p.text else count_words(key[0]))
                i = keys[key]
                if eos and (at_stop or self._ends_with_stop_token(m, p)):
                    self._cut_by_stop.add(i)
                if name not in proposers[i]:
                    proposers[i].append(name)
                own[m].setdefault(i, p)
                if i not in indices:
                    indices.append(i)
            steps.append(ModelStep(model=name, mode=mode, margins=margins, proposals=indices))
        cands = list(keys)
        if not cands:  # nothing but empty text: cannot move
            cands, proposers, words = [("", True)], [[]], [0]
        candidates = [Candidate(text=t, eos=e, proposers=proposers[i], nll={}, n_tokens={}, fused=None,
                                words=words[i]) for i, (t, e) in enumerate(cands)]
        if self.method.scores and (len(cands) > 1 or cfg.score_single):
            scored = self.workers.map(lambda m: score_candidates(self.sessions[m], cands, own[m], cfg.stop),
                                      range(len(self.sessions)))
            for name, scores in zip(self.names, scored):
                for c, sc in zip(candidates, scores):
                    c.nll[name], c.n_tokens[name], c.straddle[name] = sc.nll, sc.n_tokens, sc.straddle
                    if sc.note:
                        c.notes[name] = sc.note
                    if c.eos:
                        c.end_term[name] = sc.end_term
            weights = self.weights()
            if gate is not None:  # this round's weights from what every model shows now
                feats = {name: features(st.margins[0] if st.margins else None, entropies.get(m, 0.0),
                                        st.mode == "commit",
                                        candidates[st.proposals[0]].nll.get(name) if st.proposals else None,
                                        self.trace.words)
                         for m, (name, st) in enumerate(zip(self.names, steps))}
                weights = gate.weights(feats)
                self._gated = (weights, feats)
            for c in candidates:
                c.fused = fused_score(c, weights, cfg.normalize)
        return steps, candidates

    def drafts_for(self, s: ModelView) -> list[str]:
        """Speculative proposals: the texts model `s` verifies before writing its span. One after another, the spans
        the models before it proposed this round; side by side, none of those exist yet. Either way every model's
        span left over from the last round (what it proposed past the committed text), its own first."""
        if not self.config.speculate:
            return []
        m = self.sessions.index(s)
        drafts = [] if self.workers.enabled and self.workers.parallel else \
            [t for o, texts in list(self._proposed.items()) if o != m for t in texts]
        for o in sorted(self._leftover, key=lambda o: o != m):
            if self._leftover[o] not in drafts:
                drafts.append(self._leftover[o])
        return drafts

    def guesses_for(self, s: ModelView) -> list[str]:
        """Prompt lookup (`draft_lookup`): what followed the latest earlier occurrence of the answer's last words in
        the prompt and the answer, as drafts that model `s` verifies only where they start with its own first token
        (unlike the spans, they are not in the pool, so they serve nothing else)."""
        if not (self.config.speculate and self.config.draft_lookup):
            return []
        key = (self.trace.output, self.config.max_words)  # the same for every model of a round: looked up once
        if self._guesses[0] != key:
            self._guesses = (key, lookup_continuations(self.trace.prompt + key[0], key[1] + 1))
        return self._guesses[1]

    def _cost(self, m: int) -> int:
        """How heavy model m is (bytes of weights; a served model 0): the order models propose in when speculating.
        Summed over the parameters once per decode (a few ms a model)."""
        if m not in self._costs:
            try:
                self._costs[m] = int(self.models[m].memory_bytes)
            except (AttributeError, TypeError, StopIteration):
                self._costs[m] = 0
        return self._costs[m]

    def gate(self) -> Gate | None:
        """The learned gate of the current settings (checked against these models), or None. `gate_object` (a Gate
        set on the decoding, as gate training does with its current parameters) takes precedence."""
        if not self.method.scores or len(self.models) < 2:  # a model alone has no ensemble weights
            return None
        if self.gate_object is not None:
            return self.gate_object
        if not self.config.gate:
            return None
        gate = load_gate(self.config.gate)
        gate.check(self.names, self.config.normalize)
        return gate

    def weights(self) -> dict[str, float]:
        """Per model, the weight of its NLL in the fused score (`DecodeConfig.weights`); empty: all equal."""
        return dict(zip(self.names, self.config.weights)) if self.config.weights else {}

    def _ends_with_stop_token(self, m: int, p: Proposal) -> bool:
        """Whether proposal `p` of model `m` ended on a token that starts one of the decode's stop strings (one of
        its end tokens, but not an EOS): the trace then names the stop string as what ended the answer."""
        stops = tuple(self.config.stop)
        return bool(stops and p.eos and p.tokens) and self.sessions[m].vocab_texts()[p.tokens[-1]].startswith(stops)

    def _ending(self, text: str, eos: bool) -> tuple[str, bool]:
        """A span holding a stop string or an end-token string (possibly begun in the committed text) is cut before it
        and ends the answer: (text before it, True). Text past the end is never scored."""
        return self._ending_at(text, eos)[:2]

    def _ending_at(self, text: str, eos: bool) -> tuple[str, bool, bool]:
        """`_ending`, and whether one of the decode's stop strings (not an end-token string) made the cut."""
        old = self.trace.output
        longest = max((len(x) for x in self.enders), default=0)
        cut = find_stop(old + text, self.enders, len(old) - longest + 1) if self.enders else None
        at = []
        if cut is None or cut < len(old):  # a stop begun in committed text: commit cuts the rounds it began in
            head = text
        else:
            head, eos = text[: cut - len(old)], True
            at = [x for x in self.config.stop if (old + text).startswith(x, cut)]  # the stop strings found there
        # whitespace before a stop string that does not begin with whitespace ("\n\n" before "Question") is part of
        # how the answer ends: scored as that text and then the stop (scoring.py); else whitespace and then the end
        # is the answer ending here, one event
        if eos and not head.strip() and not any(not x[0].isspace() for x in at):
            head = ""
        return head, eos, bool(at)

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
        longest = max((len(x) for x in self.enders), default=0)
        cut = find_stop(new, self.enders, len(old) - longest + 1) if self.enders else None
        stop = None
        if cut is not None:
            stop = "stop string" if find_stop(new, cfg.stop, cut) == cut else "eos"
            new = new[:cut]
        elif cand.eos:
            stop = "stop string" if r.chosen in self._cut_by_stop else "eos"
        elif cand.text == "":
            stop = "no progress"
        if len(new) < len(old):  # a stop string that began in earlier rounds: their texts lose its start
            self._trim(len(old) - len(new))
        r.text = new[len(old):]  # "" when the cut fell into earlier rounds
        if cfg.method == "token-union":  # tokens, not words: count the words the token completes or starts
            r.words = count_words(new) - count_words(old[: len(new)])
        else:
            r.words = cand.words if r.text == cand.text else min(cand.words, count_words(r.text))
        if stop is None and self.trace.words + r.words >= cfg.max_new_words:
            stop = "max_new_words"
        # each confident model's span past what was committed: its draft for the next round (speculative proposals)
        self._leftover = {m: c.text[len(r.text):] for m, st in enumerate(r.steps)
                          if st.mode in ("commit", "span") and st.proposals
                          for c in [r.candidates[st.proposals[0]]]
                          if r.text and len(c.text) > len(r.text) and c.text.startswith(r.text)}
        if stop is None:
            # a lazy method moves only the models that acted; the others catch up in a later round's first phase
            moving = [m for m, st in enumerate(r.steps) if not self.method.lazy or st.mode != "idle"]
            with self._fatal():
                self.workers.map(lambda m: self.sessions[m].commit(new), moving)
            current = [self.sessions[m] for m in moving]
            self._charge(r.steps)
            if max(len(s.ids) - s.prompt_tokens for s in current) >= cfg.max_new_tokens:
                stop = "max_new_tokens"
            elif any(s.lm.max_positions and len(s.ids) + cfg.max_word_tokens * cfg.max_words >= s.lm.max_positions
                     for s in current):
                stop = "context full"
        r.stop = stop
        r.seconds += time.perf_counter() - t0
        if stop:  # catch-ups still running in the background finish and are charged to this last round
            self._settle_behind(r.steps)
        self.trace.rounds.append(r)
        self.trace.output = new
        if self._next_config is not None:  # settings changed while this round was pending: from the next one on
            self.config, self._next_config = self._next_config, None
        self.trace.seconds += r.seconds
        self.pending = None
        if stop:
            self.done = True
            self.trace.stop_reason = stop
            self.workers.close()
        return r

    def _catch_up_later(self, m: int, output: str) -> None:
        """Start model m's catch-up to `output` on its worker unless one is still running (the next takes the rest)."""
        behind = self._behind.get(m)
        if behind is not None:
            if not behind.done():
                return
            behind.result()  # a catch-up that failed ends the decode here
        future = self.workers.submit(m, lambda i, text=output: self.sessions[i].commit(text))
        if future is not None:
            self._behind[m] = future

    def _settle_behind(self, steps: list[ModelStep] | None = None) -> None:
        """The decode is over: cancel the background catch-ups not started, wait for the running ones (so nothing
        touches a model of this decode afterwards) and charge their work to `steps` (default: the last round's, if
        any). What they raise no longer matters: the model is not used again."""
        if steps is None and self.trace.rounds:
            steps = self.trace.rounds[-1].steps
        behind, self._behind = self._behind, {}
        for future in behind.values():
            if not future.cancel():
                try:
                    future.result()
                except Exception:  # noqa: BLE001 - see above
                    pass
        if steps is not None:
            self._charge(steps)

    def _charge(self, steps: list[ModelStep]) -> None:
        """Add each model's forward passes, tokens fed, seconds and speculation counts since they were last charged
        to its step (the one place costs are counted): work done between rounds, such as a catch-up in the
        background, goes to the next round charged."""
        for i, (step, s) in enumerate(zip(steps, self.sessions)):
            now, before = _snapshot(s), self._charged[i]
            step.forward_passes += now[0] - before[0]
            step.tokens_fed += now[1] - before[1]
            step.seconds += now[2] - before[2]
            step.cached_tokens += now[3] - before[3]
            for k, key in enumerate(SPEC_COUNTERS):
                setattr(step, key, getattr(step, key) + now[4 + k] - before[4 + k])
            self._charged[i] = now

    @contextmanager
    def _fatal(self):
        """A model failing inside a phase (a server gone, out of memory) ends the decode: the trace keeps every round
        appended so far and says why; the models' states are not trusted any further."""
        try:
            yield
        except BaseException as exc:
            self.pending, self.done = None, True
            self.trace.stop_reason = f"error: {type(exc).__name__}: {str(exc)[:200]}"
            self._settle_behind()
            self.workers.close()
            raise

    def _trim(self, excess: int) -> None:
        """Remove the last `excess` characters of the output from the rounds that wrote them (recorded in `cut`)."""
        for prev in reversed(self.trace.rounds):
            if excess <= 0:
                break
            take = min(excess, len(prev.text))
            prev.text, prev.cut, excess = prev.text[: len(prev.text) - take], prev.cut + take, excess - take
            prev.words = min(prev.words, count_words(prev.text))

    def step(self) -> Round:
        return self.commit()

    def reconfigure(self, config: DecodeConfig) -> dict:
        """Change settings that only steer later rounds (LIVE_SETTINGS) from the next undecided round on; the trace
        records each change. Anything else (models, prompt, mode, stop strings, method) needs a new decode."""
        old, new = (self._next_config or self.config).to_dict(), config.to_dict()
        fixed = sorted(k for k in new if k not in LIVE_SETTINGS and new[k] != old[k])
        if fixed:
            raise ConfigError(f"{', '.join(fixed)} cannot change during a decode: start a new one")
        changed = {k: new[k] for k in LIVE_SETTINGS if new[k] != old[k]}
        check_exploration(self.models, config)
        if config.gate and self.method.scores and len(self.models) > 1:
            load_gate(config.gate).check(self.names, config.normalize)
        if config.weights and len(config.weights) != len(self.models):
            raise ConfigError(f"weights has {len(config.weights)} values for {len(self.models)} models")
        if changed and not self.done:
            if self.pending is not None:  # the decided round keeps its settings, its commit (stop caps) included
                self._next_config = config
            else:
                self.config = config
            start = len(self.trace.rounds) + (self.pending is not None)
            self.trace.changes.append({"from_round": start, "settings": changed})
        return changed

    def cancel(self) -> None:
        """Stop between rounds; the trace keeps what was decided."""
        self.pending = None
        if not self.done:
            self.done = True
            self.trace.stop_reason = "cancelled"
            self._settle_behind()
            self.workers.close()

    def __iter__(self) -> Iterator[Round]:
        while not self.done:
            yield self.step()


def _open_view(lm: LoadedModel, prompt: str, config: DecodeConfig) -> ModelView:
    """The model's view of this decode: a served model's requests, or a local model's KV cache."""
    if isinstance(lm, RemoteModel):
        return lm.view(prompt, config.mode, config.stop, config.system, config.thinking)
    return LocalSession(lm, prompt, config.mode, config.stop, config.system, config.thinking)


def fused_score(c: Candidate, weights: dict[str, float] | None = None, normalize: str = "token") -> float | None:
    """Mean NLL (per token, or per word: `normalize`) over the models that scored the candidate, weighted by
    `weights` when given (Σ w·NLL / Σ w; a model of weight 0 is shown but does not count); None (ranked last) when a
    counted model gives it probability 0."""
    w = weights or {}
    counted = {m: candidate_nll(c, m, normalize) for m in c.nll if w.get(m, 1.0) > 0}
    if any(v is None and c.notes.get(m, "").startswith("probability 0") for m, v in counted.items()):
        return None
    vals = [(w.get(m, 1.0), v) for m, v in counted.items() if v is not None]
    total = sum(x for x, _ in vals)
    return sum(x * v for x, v in vals) / total if total > 0 else None


SPEC_COUNTERS = ("draft_tokens", "accepted_tokens", "verify_passes", "scores_from_drafts")


def _snapshot(s: ModelView) -> tuple:
    """A model's cost counters now: forward passes, tokens fed, seconds, cached prompt tokens, then SPEC_COUNTERS."""
    return (*s.stats(), *(getattr(s, key) for key in SPEC_COUNTERS))


def _validate(models: Sequence[LoadedModel], config: DecodeConfig, prompt) -> None:
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptError("the prompt is empty: type a question or pick an example")
    if config.weights and len(config.weights) != len(models):
        raise ConfigError(f"weights has {len(config.weights)} values for {len(models)} models: give one per model")
    vocab = min(lm.vocab_size for lm in models)
    if config.method == "token-union" and config.union_top_k > vocab:
        raise ConfigError(f"union_top_k={config.union_top_k} is larger than a model's vocabulary ({vocab}): use fewer")
    check_exploration(models, config)  # embedding exploration needs each model's weights here
    if config.gate and METHODS[config.method].scores and len(models) > 1:  # a model alone has no ensemble weights
        load_gate(config.gate).check(_unique_names(models), config.normalize)


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

    def __init__(self, models: Sequence[LoadedModel | str], config: DecodeConfig | None = None,
                 parallel: bool | None = None, threads: int | None = None, **settings):
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

    def branch(self, trace: Trace, round_index: int, candidate: int) -> "Decoding":
        """`branch_from` with these models: the trace's own settings decide, not this object's config."""
        return branch_from(self.models, trace, round_index, candidate, self.parallel, self.threads)


def greedy(model: LoadedModel | str, prompt: str, config: DecodeConfig | None = None) -> Trace:
    """One model alone through the same machinery (same words, stops and costs)."""
    cfg = replace(config or DecodeConfig(), method="greedy", weights=(), gate="")  # alone: no ensemble weights
    return AdaFuse([model], cfg).generate(prompt)


def branch_from(models: Sequence[LoadedModel | str], trace: Trace, round_index: int, candidate: int,
                parallel: bool | None = None, threads: int | None = None) -> Decoding:
    """A counterfactual decode of `trace`'s prompt: rounds 0..round_index-1 are decided again by `models` (the models
    the trace names, in its order) under the trace's settings and mid-decode changes, each committing the candidate
    the original committed (its overrides included); round `round_index` then commits candidate `candidate` of its
    pool. Returns the Decoding ready to continue (`step()` until `done`). Raises ConfigError for indices outside the
    trace and ReplayError when a replayed round does not reproduce the original (other models or versions)."""
    n = len(trace.rounds)
    if not n:
        raise ConfigError("this trace has no rounds to branch from: decode at least one round first")
    if isinstance(round_index, bool) or not isinstance(round_index, int) or not 0 <= round_index < n:
        raise ConfigError(f"round_index={round_index!r} is not a round of this trace: pick 0..{n - 1}")
    pool = trace.rounds[round_index].candidates
    if isinstance(candidate, bool) or not isinstance(candidate, int) or not 0 <= candidate < len(pool):
        raise ConfigError(f"candidate={candidate!r} is not a candidate of round {round_index}: "
                          f"pick 0..{len(pool) - 1}")
    models = [get_model(m) if isinstance(m, str) else m for m in ([models] if isinstance(models, (str, LoadedModel))
                                                                  else models)]
    names = _unique_names(models)
    if names != trace.models:
        raise ConfigError(f"this trace was decoded by {', '.join(trace.models)}; got {', '.join(names) or 'none'}: "
                          "pass the trace's models in its order")
    d = Decoding(models, DecodeConfig.from_dict(trace.settings), trace.prompt, parallel, threads)
    changes: dict[int, dict] = {}
    for ch in trace.changes:
        changes.setdefault(ch["from_round"], {}).update(ch["settings"])
    try:
        for i, orig in enumerate(trace.rounds[: round_index + 1]):
            if i in changes:  # settings changed mid-decode, from the round they were changed at
                d.reconfigure(DecodeConfig.from_dict({**d.config.to_dict(), **changes[i]}))
            r = d.propose()
            want = orig.candidates[candidate if i == round_index else orig.chosen]
            labels = [candidate_label(c.text, c.eos) for c in r.candidates]
            match = next((j for j, c in enumerate(r.candidates) if (c.text, c.eos) == (want.text, want.eos)), None)
            why = ""
            if match is None:
                why = f"{candidate_label(want.text, want.eos)!r} is not in its pool {labels}"
            elif i < round_index and not orig.overridden and match != r.winner:
                why = (f"the scores now pick {labels[r.winner]!r}, the original picked "
                       f"{candidate_label(want.text, want.eos)!r}")
            if why:
                raise ReplayError(f"the replay diverged at round {i}: {why}; branch with the models (and versions) "
                                  "that decoded the trace, or decode the prompt again")
            d.commit(match if i == round_index or orig.overridden else None)
            if d.done and i < round_index:
                raise ReplayError(f"the replay diverged at round {i}: it stopped ({d.trace.stop_reason}) where the "
                                  "original went on; branch with the models that decoded the trace")
    except BaseException:
        d.cancel()
        raise
    return d
