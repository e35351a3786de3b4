"""The round loop of one decode: views -> proposals -> pool -> scores -> choice -> trace."""
from __future__ import annotations

import time
import weakref
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Iterator, Sequence

from .config import DecodeConfig
from .costs import Ledger
from .ending import Ending
from .errors import ConfigError, PromptError
from .gate import Gate, entropy, features, load_gate
from .models import LoadedModel
from .models.batching import Rider, working
from .methods import Method, Proposed, RoundContext, make_method
from .parallel import Workers
from .scoring import score_candidates
from .trace import Candidate, ModelStep, Round, StepMode, StopReason, Trace, fused_score, lowest
from .view import ModelView
from .words import count_words, lookup_continuations

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
        self.names = unique_names(self.models)
        kind = config.method_class
        if not isinstance(prompt, str) or not prompt.strip():
            raise PromptError("the prompt is empty: type a question or pick an example")
        self._gates: dict[str, Gate] = {}  # the gate files this decode read and checked, by path
        self._check_settings(config, kind)  # every check before any model prefills
        self.method: Method = make_method(config)
        t0 = time.perf_counter()
        # each phase of a round runs the models side by side (one worker each) or one after another: `parallel`
        # True/False, or None to choose (side by side when each model has its own GPU, server or the CPU; see `Workers`);
        # `threads`: torch CPU threads per worker (default: the cores shared out)
        self.workers = Workers(self.models, parallel, threads, probe=kind.overlaps)
        weakref.finalize(self, self.workers.close)
        self.rider = Rider()  # this decode at the models' batchers (many decodes at once share forwards)
        with self.rider.working():
            for lm in self.models:
                lm.expect(self.rider)
            self.sessions: list[ModelView] = self.workers.map(
                lambda m: self.models[m].open_view(prompt, *config.view_args()), range(len(self.models)))
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
        self.ending = Ending(config.stop, tuple(e for lm in self.models for e in lm.end_strings()))
        self.pending: Round | None = None
        self.gate_object: Gate | None = None  # a Gate to use instead of the settings' file (gate training sets it)
        self._gated: tuple[dict, dict] | None = None  # this round's gate weights and features, until `propose` uses them
        self._next_config: DecodeConfig | None = None  # `reconfigure` while a round is pending
        # speculative proposals: texts proposed so far this round per model, and each model's own span left over from
        # the last round (what it proposed past the committed text)
        self._proposed: dict[int, list[str]] = {}
        self._leftover: dict[int, str] = {}
        self._cut_by_stop: set[int] = set()  # this round's candidates a proposal ended by holding a stop string
        self._weight_bytes: dict[int, int] = {}
        self._lookups: tuple[tuple | None, list[str]] = (None, [])  # prompt lookup of the current round
        self._behind: dict[int, Future] = {}  # idle models' catch-ups running in the background (lazy methods)
        self.ledger = Ledger(self.sessions)   # cost counters as last charged to a round
        self.done = False

    # ---- one round ----
    @working
    def propose(self) -> Round:
        """Decide the next round (proposals, pool, scores, winner) without appending it."""
        if self.done:
            raise ConfigError("this decode has finished: start a new one")
        if self.pending is not None:
            return self.pending
        t0 = time.perf_counter()
        with self._fatal():
            ctx = self._context()
            decided = self.method.own_round(ctx)
            if decided is None:
                decided = self._pool_round(ctx)
        steps, candidates = decided
        self.ledger.charge(steps)
        winner = lowest([c.fused for c in candidates])
        weights, feats = self._gated if self._gated is not None else (self.weights() if self.method.scores else {}, {})
        self._gated = None
        self.pending = Round(index=len(self.trace.rounds), steps=steps, candidates=candidates, chosen=winner,
                             winner=winner, text=candidates[winner].text, words=candidates[winner].words,
                             seconds=time.perf_counter() - t0, weights=weights, features=feats)
        return self.pending

    def _context(self) -> RoundContext:
        last = self.trace.rounds[-1].steps if self.trace.rounds else []
        return RoundContext(
            config=self.config, views=self.sessions, names=self.names, output=self.trace.output,
            budget=max(1, self.config.max_new_words - self.trace.words),
            drafts=self._drafts_for, lookups=self._lookups_for,
            last_writer=next((i for i, st in enumerate(last) if st.mode != StepMode.IDLE), None),
            busy=lambda m: m in self._behind and not self._behind[m].done())

    def _pool_round(self, ctx: RoundContext) -> tuple[list[ModelStep], list[Candidate]]:
        """The acting models propose; the pool is the union of their proposals by exact (text, end); every model
        scores it when the method scores and there is a choice to make."""
        cfg = ctx.config
        acting = set(self.method.acting(ctx))
        output = ctx.output
        # a lazy method's idle models catch up in the background when the models run side by side: the round does not
        # wait for them, and a model drawn later finishes its catch-up first; one after another they catch up only
        # when next drawn (one forward over every word they missed)
        side_by_side = self.workers.enabled and self.workers.parallel
        for m in acting:
            behind = self._behind.pop(m, None)
            if behind is not None:
                behind.result()  # done, or waited for (its error, if any, is this round's)
        for m in self.method.drawn(ctx):
            if side_by_side and m not in acting and self.sessions[m].text != output:
                self._catch_up_later(m, output)

        gate = self.gate()
        entropies: dict[int, float] = {}
        # what a model catching up will likely write next rides along in its catch-up's forward (read here, before
        # the models' workers start)
        hints = {m: self.method.guess(ctx, m) for m in acting if self.sessions[m].text != output}

        def act(m: int) -> Proposed | None:
            s = self.sessions[m]
            if s.text != output:  # a lazy method's model catching up on the words it did not commit
                s.commit(output, hints.get(m, ""))
            if gate is not None and m in acting:  # what the model shows at the word start, before it proposes
                entropies[m] = entropy(s.next_logprobs)
            if m not in acting:
                return None
            proposed = self.method.propose(ctx, m)
            self._proposed[m] = [p.text for p in proposed.proposals if p.text.strip()]
            return proposed

        moving = sorted(acting)
        self._proposed = {}
        if cfg.speculate and not side_by_side:  # the cheapest model first: its span is the others' draft
            moving.sort(key=lambda m: (self._weight_size(m), m))
        done = dict(zip(moving, self.workers.map(act, moving)))
        keys: dict[tuple[str, bool], int] = {}
        self._cut_by_stop = set()
        words: list[int] = []
        proposers: list[list[str]] = []
        own: list[dict[int, object]] = [{} for _ in self.sessions]
        steps = []
        for m, name in enumerate(self.names):
            if m not in acting:
                steps.append(ModelStep(model=name, mode=StepMode.IDLE, margins=[], proposals=[]))
                continue
            mine: Proposed = done[m]
            indices = []
            for p in mine.proposals:
                head, eos, at_stop = self.ending.head(output, p.text, p.eos)
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
            steps.append(ModelStep(model=name, mode=mine.mode, margins=mine.margins, proposals=indices,
                                   selection=mine.selection))
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
                                        st.mode == StepMode.COMMIT,
                                        candidates[st.proposals[0]].nll.get(name) if st.proposals else None,
                                        self.trace.words)
                         for m, (name, st) in enumerate(zip(self.names, steps))}
                weights = gate.weights(feats)
                self._gated = (weights, feats)
            for c in candidates:
                c.fused = fused_score(c, weights, cfg.normalize)
        return steps, candidates

    def _drafts_for(self, m: int) -> list[str]:
        """Speculative proposals: the texts model m verifies before writing its span. One after another, the spans
        the models before it proposed this round; side by side, none of those exist yet. Either way every model's
        span left over from the last round (what it proposed past the committed text), its own first."""
        if not self.config.speculate:
            return []
        drafts = [] if self.workers.enabled and self.workers.parallel else \
            [t for o, texts in list(self._proposed.items()) if o != m for t in texts]
        for o in sorted(self._leftover, key=lambda o: o != m):
            if self._leftover[o] not in drafts:
                drafts.append(self._leftover[o])
        return drafts

    def _lookups_for(self, m: int) -> list[str]:
        """Prompt lookup (`draft_lookup`): what followed the latest earlier occurrence of the answer's last words in
        the prompt and the answer, as drafts that model m verifies only where they start with its own first token
        (unlike the spans, they are not in the pool, so they serve nothing else)."""
        if not (self.config.speculate and self.config.draft_lookup):
            return []
        key = (self.trace.output, self.config.max_words)  # the same for every model of a round: looked up once
        if self._lookups[0] != key:
            self._lookups = (key, lookup_continuations(self.trace.prompt + key[0], key[1] + 1))
        return self._lookups[1]

    def _weight_size(self, m: int) -> int:
        """How heavy model m is (bytes of weights; a served model 0): the order models propose in when speculating.
        Summed over the parameters once per decode (a few ms a model)."""
        if m not in self._weight_bytes:
            try:
                self._weight_bytes[m] = int(self.models[m].memory_bytes)
            except (AttributeError, TypeError, StopIteration):
                self._weight_bytes[m] = 0
        return self._weight_bytes[m]

    def gate(self) -> Gate | None:
        """The learned gate of the current settings (checked against these models), or None. `gate_object` takes
        precedence."""
        if not _gated(type(self.method), self.models):
            return None
        if self.gate_object is not None:
            return self.gate_object
        return self._gates[self.config.gate] if self.config.gate else None

    def weights(self) -> dict[str, float]:
        """Per model, the weight of its NLL in the fused score (`DecodeConfig.weights`); empty: all equal."""
        return dict(zip(self.names, self.config.weights)) if self.config.weights else {}

    def _ends_with_stop_token(self, m: int, p) -> bool:
        """Whether proposal `p` of model `m` ended on a token that starts one of the decode's stop strings (one of
        its end tokens, but not an EOS): the trace then names the stop string as what ended the answer."""
        stops = self.ending.stops
        return bool(stops and p.eos and p.tokens) and self.sessions[m].vocab_texts()[p.tokens[-1]].startswith(stops)

    @working
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
        cut = self.ending.cut(old, cand.text)
        stop = None
        if cut is not None:
            stop = StopReason.STOP_STRING if self.ending.stop_string_at(new, cut) else StopReason.EOS
            new = new[:cut]
        elif cand.eos:
            stop = StopReason.STOP_STRING if r.chosen in self._cut_by_stop else StopReason.EOS
        elif cand.text == "":
            stop = StopReason.NO_PROGRESS
        if len(new) < len(old):  # a stop string that began in earlier rounds: their texts lose its start
            self._trim(len(old) - len(new))
        r.text = new[len(old):]  # "" when the cut fell into earlier rounds
        r.words = self.method.words_added(old, new, cand)
        if stop is None and self.trace.words + r.words >= cfg.max_new_words:
            stop = StopReason.MAX_NEW_WORDS
        # each confident model's span past what was committed: its draft for the next round (speculative proposals)
        self._leftover = {m: c.text[len(r.text):] for m, st in enumerate(r.steps)
                          if st.mode in (StepMode.COMMIT, StepMode.SPAN) and st.proposals
                          for c in [r.candidates[st.proposals[0]]]
                          if r.text and len(c.text) > len(r.text) and c.text.startswith(r.text)}
        if stop is None:
            # a lazy method moves only the models that acted; the others catch up in a later round's first phase
            moving = [m for m, st in enumerate(r.steps) if not self.method.lazy or st.mode != StepMode.IDLE]
            with self._fatal():
                self.workers.map(lambda m: self.sessions[m].commit(new), moving)
            current = [self.sessions[m] for m in moving]
            self.ledger.charge(r.steps)
            if max(len(s.ids) - s.prompt_tokens for s in current) >= cfg.max_new_tokens:
                stop = StopReason.MAX_NEW_TOKENS
            elif any(s.lm.max_positions and len(s.ids) + cfg.max_word_tokens * cfg.max_words >= s.lm.max_positions
                     for s in current):
                stop = StopReason.CONTEXT_FULL
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
            self._close()
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
            self.ledger.charge(steps)

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
            self._close()
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
        self._check_settings(config, type(self.method))
        if changed and not self.done:
            if self.pending is not None:  # the decided round keeps its settings, its commit (stop caps) included
                self._next_config = config
            else:
                self.config = config
            start = len(self.trace.rounds) + (self.pending is not None)
            self.trace.changes.append({"from_round": start, "settings": changed})
        return changed

    def _check_settings(self, config: DecodeConfig, kind: type[Method]) -> None:
        """The settings' checks against these models, at the start of a decode and on every change of settings; a
        gate file is read and checked here once, and its rounds use that gate."""
        if config.weights and len(config.weights) != len(self.models):
            raise ConfigError(f"weights has {len(config.weights)} values for {len(self.models)} models: "
                              "give one per model")
        kind.check(self.models, config)
        if config.gate and _gated(kind, self.models):
            gate = self._gates.get(config.gate) or load_gate(config.gate)
            gate.check(self.names, config.normalize)  # again on a change: `normalize` may have changed
            self._gates[config.gate] = gate

    def cancel(self, reason: StopReason = StopReason.CANCELLED) -> None:
        """Stop between rounds; the trace keeps what was decided (its stop reason: `reason`)."""
        self.pending = None
        if not self.done:
            self.done = True
            self.trace.stop_reason = reason
            self._settle_behind()
            self._close()

    def _close(self) -> None:
        """The decode is over: its workers stop and its views let go of their caches (a finished decode that is still
        referenced, say by a page's session, holds no model memory; the trace keeps everything)."""
        self.workers.close()
        for view in self.sessions:
            view.release()

    def __iter__(self) -> Iterator[Round]:
        while not self.done:
            yield self.step()



def _gated(kind: type[Method], models: Sequence[LoadedModel]) -> bool:
    """Whether a gate's weights can enter the fused score: the method scores the pool, with two models or more (a
    model alone has no ensemble weights)."""
    return kind.scores and len(models) > 1


def unique_names(models: Sequence[LoadedModel]) -> list[str]:
    """The models' names in a trace: a name given twice gets #2, #3, ..."""
    names: list[str] = []
    for lm in models:
        name, k = lm.name, 2
        while name in names:
            name, k = f"{lm.name}#{k}", k + 1
        names.append(name)
    return names
