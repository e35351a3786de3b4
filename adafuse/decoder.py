"""The round loop of one decode: views -> proposals -> pool -> scores -> choice -> trace."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator, Sequence

from .candidates import Proposal
from .catchups import CatchUps
from .config import DecodeConfig
from .crew import Crew
from .ending import Ending
from .errors import ConfigError, PromptError
from .fusion import Fusion
from .gate import Gate, entropy
from .live import LIVE_SETTINGS, LiveSettings
from .models import LoadedModel
from .models.batching import Rider, working
from .models.prompt import with_turn_end
from .methods import Method, Proposed, RoundContext, make_method
from .parallel import Workers
from .pool import Pool, build_pool
from .scoring import score_candidates
from .speculation import Speculation
from .trace import Candidate, ModelStep, Round, StepMode, StopReason, Trace, lowest
from .view import ModelView
from .words import count_words

__all__ = ["Decoding", "LIVE_SETTINGS", "unique_names"]


class Decoding:
    """One prompt being decoded. `propose()` decides a round, `commit()` appends it (optionally another
    candidate: counterfactual steering); iterating runs `step()` until a stop.

    The loop and the lifecycle are here; each policy is its own object: `speculation` (drafts the models verify),
    `catch_ups` (a lazy method's idle models in the background), `fusion` (each model's weight, plain or from a gate)
    and `settings` (changed mid-decode); `crew` holds the models at work (views, workers, costs)."""

    def __init__(self, models: Sequence[LoadedModel], config: DecodeConfig, prompt: str,
                 parallel: bool | None = None, threads: int | None = None):
        names = unique_names(models)
        kind = config.method_class
        if not isinstance(prompt, str) or not prompt.strip():
            raise PromptError("the prompt is empty: type a question or pick an example")
        config = with_turn_end(config, models)  # chat read as a transcript: its turn's end is a stop string
        self.settings = LiveSettings(config)
        self.fusion = Fusion(names, kind)
        self._check_settings(config, kind, models)  # every check before any model prefills
        self.method: Method = make_method(config)
        t0 = time.perf_counter()
        self.crew = Crew(models, prompt, config.view_args(), parallel, threads, probe=kind.overlaps)
        views = self.crew.views
        self.trace = Trace(
            prompt=prompt, models=names, settings=config.to_dict(),
            prompt_modes={n: s.mode_used for n, s in zip(names, views)},
            prefill={n: {"prompt_tokens": s.prompt_tokens, "reused_tokens": s.prefix_reused,
                         "forward_passes": s.forward_passes,
                         "tokens_fed": s.tokens_fed, "seconds": s.seconds, "cached_tokens": s.stats()[3]}
                     for n, s in zip(names, views)},
            devices={n: lm.placement() for n, lm in zip(names, models)},
            workers=self.crew.workers.describe(),
            seconds=time.perf_counter() - t0,
        )
        # text that ends the answer wherever it appears: the stop strings and every model's end-token strings
        self.ending = Ending(config.stop, tuple(e for lm in models for e in lm.end_strings()))
        self.speculation = Speculation(models)
        self.catch_ups = CatchUps(self.crew)
        self._decided: tuple[Round, frozenset[int]] | None = None  # the pending round, its candidates cut by a stop
        self.done = False

    # ---- what the app, the harness and the tests read ----
    @property
    def config(self) -> DecodeConfig:
        return self.settings.config

    @property
    def pending(self) -> Round | None:
        """The round `propose` decided and `commit` has not appended yet."""
        return self._decided[0] if self._decided is not None else None

    @property
    def names(self) -> list[str]:
        return self.trace.models

    @property
    def models(self) -> list[LoadedModel]:
        return self.crew.models

    @property
    def sessions(self) -> list[ModelView]:
        return self.crew.views

    @property
    def workers(self) -> Workers:
        return self.crew.workers

    @property
    def rider(self) -> Rider:
        return self.crew.rider

    @property
    def gate_object(self) -> Gate | None:
        """A Gate to use instead of the settings' file (gate training sets it)."""
        return self.fusion.gate_object

    @gate_object.setter
    def gate_object(self, gate: Gate | None) -> None:
        self.fusion.gate_object = gate

    # ---- one round: propose -> pool -> score -> choose ----
    @working
    def propose(self) -> Round:
        """Decide the next round (proposals, pool, scores, winner) without appending it."""
        if self.done:
            raise ConfigError("this decode has finished: start a new one")
        if self._decided is not None:
            return self._decided[0]
        t0 = time.perf_counter()
        with self._fatal():
            ctx = self._context()
            own = self.method.own_round(ctx)  # a method that builds its whole round itself (token union)
            if own is None:
                steps, candidates, cut, fused = self._pool_round(ctx)
            else:
                (steps, candidates), cut, fused = own, frozenset(), None
        self.crew.ledger.charge(steps)
        winner = lowest([c.fused for c in candidates])
        weights, feats = fused if fused is not None else (self.fusion.weights(self.config), {})  # {}: none entered
        pending = Round(index=len(self.trace.rounds), steps=steps, candidates=candidates, chosen=winner, winner=winner,
                        text=candidates[winner].text, words=candidates[winner].words,
                        seconds=time.perf_counter() - t0, weights=weights, features=feats)
        self._decided = (pending, cut)
        return pending

    def _context(self) -> RoundContext:
        last = self.trace.rounds[-1].steps if self.trace.rounds else []
        return RoundContext(
            config=self.config, views=self.sessions, names=self.names, output=self.trace.output,
            budget=max(1, self.config.max_new_words - self.trace.words),
            last_writer=next((i for i, st in enumerate(last) if st.mode != StepMode.IDLE), None),
            busy=self.catch_ups.busy())

    def _pool_round(self, ctx: RoundContext) -> tuple[list[ModelStep], list[Candidate], frozenset[int],
                                                       tuple[dict, dict] | None]:
        """The acting models propose; the pool is the union of their proposals by exact (text, end); every model
        scores it when the method scores and there is a choice to make, and the scores are fused (None: not scored).
        Returns the steps, the candidates, those a stop cut, and the round's weights and gate features."""
        acting = set(self.method.acting(ctx))
        self.catch_ups.before_round(acting, self.method.drawn(ctx), ctx.output)
        gate = self.fusion.gate(ctx.config)
        proposed, entropies = self._propose_all(ctx, acting, gate is not None)
        pool = build_pool(self.names, proposed, ctx.output, self.ending, self._on_stop_token, ctx.config.allow_empty)
        fused = None
        if self.method.scores and (len(pool.candidates) > 1 or ctx.config.score_single):
            self._score(pool, ctx.config)
            fused = self.fusion.fuse(ctx.config, gate, pool.steps, pool.candidates, entropies, self.trace.words)
        return pool.steps, pool.candidates, pool.cut, fused

    def _propose_all(self, ctx: RoundContext, acting: set[int],
                     gated: bool) -> tuple[dict[int, Proposed], dict[int, float]]:
        """Each acting model catches up on the words it did not commit (a lazy method's), then proposes with this
        round's drafts: one after another, the spans of the models before it. Returns the proposals by model and,
        `gated`, each model's entropy at the word start (what it shows before it proposes)."""
        output, cfg, side_by_side = ctx.output, ctx.config, self.crew.side_by_side
        # what a model catching up will likely write next rides along in its catch-up's forward (read here, before
        # the models' workers start)
        now = replace(ctx, busy=self.catch_ups.busy())
        hints = {m: self.method.guess(now, m) for m in acting if self.sessions[m].text != output}
        lookups = self.speculation.lookups(self.trace.prompt, output, cfg)

        def act(m: int) -> tuple[Proposed, float | None]:
            s = self.sessions[m]
            if s.text != output:
                s.commit(output, hints.get(m, ""))
            shows = entropy(s.next_logprobs) if gated else None
            mine = replace(ctx, drafts=self.speculation.drafts(m, cfg, side_by_side), lookups=lookups)
            proposed = self.method.propose(mine, m)
            self.speculation.record(m, proposed)
            return proposed, shows

        moving = self.speculation.start_round(acting, cfg, side_by_side)
        done = dict(zip(moving, self.workers.map(act, moving)))
        return {m: p for m, (p, _) in done.items()}, {m: e for m, (_, e) in done.items() if e is not None}

    def _on_stop_token(self, m: int, p: Proposal) -> bool:
        """Whether proposal `p` of model `m` ended on a token that starts one of the decode's stop strings (one of
        its end tokens, but not an EOS): the trace then names the stop string as what ended the answer."""
        stops = self.ending.stops
        return bool(stops and p.eos and p.tokens) and self.sessions[m].vocab_texts()[p.tokens[-1]].startswith(stops)

    def _score(self, pool: Pool, cfg: DecodeConfig) -> None:
        """Every model scores every candidate of the pool (one batched forward each), into the candidates."""
        texts = [(c.text, c.eos) for c in pool.candidates]
        scored = self.workers.map(lambda m: score_candidates(self.sessions[m], texts, pool.own[m], cfg.stop),
                                  range(len(self.sessions)))
        for name, scores in zip(self.names, scored):
            for c, sc in zip(pool.candidates, scores):
                c.nll[name], c.n_tokens[name], c.straddle[name] = sc.nll, sc.n_tokens, sc.straddle
                if sc.note:
                    c.notes[name] = sc.note
                if c.eos:
                    c.end_term[name] = sc.end_term

    # ---- commit ----
    @working
    def commit(self, choice: int | None = None) -> Round:
        """Append the winner (or candidate `choice`, marking the round overridden) and apply stop rules."""
        r = self.propose()
        cut_by_stop = self._decided[1]
        if choice is not None:
            if isinstance(choice, bool) or not isinstance(choice, int) or not 0 <= choice < len(r.candidates):
                raise ConfigError(f"choice={choice!r} is not a candidate of round {r.index}: pick 0..{len(r.candidates) - 1}")
            r.chosen, r.overridden = choice, choice != r.winner
        cfg, t0 = self.config, time.perf_counter()
        cand = r.candidates[r.chosen]
        old = self.trace.output
        new, stop = self._ended(old, cand, r.chosen in cut_by_stop)
        if len(new) < len(old):  # a stop string that began in earlier rounds: their texts lose its start
            self._trim(len(old) - len(new))
        r.text = new[len(old):]  # "" when the cut fell into earlier rounds
        r.words = self.method.words_added(old, new, cand)
        if stop is None and self.trace.words + r.words >= cfg.max_new_words:
            stop = StopReason.MAX_NEW_WORDS
        self.speculation.after_commit(r)
        if stop is None:
            stop = self._move_models(r, new, cfg)
        r.stop = stop
        r.seconds += time.perf_counter() - t0
        if stop:  # catch-ups still running in the background finish and are charged to this last round
            self._settle(r.steps)
        self.trace.rounds.append(r)
        self.trace.output = new
        self.settings.after_commit()  # settings changed while this round was pending: from the next one on
        self.trace.seconds += r.seconds
        self._decided = None
        if stop:
            self.done = True
            self.trace.stop_reason = stop
            self.crew.close()
        return r

    def _ended(self, old: str, cand: Candidate, cut_by_stop: bool) -> tuple[str, StopReason | None]:
        """The output after `cand` follows `old`, cut at the end of the answer, and whether (and why) it ends there."""
        new = old + cand.text
        cut = self.ending.cut(old, cand.text)
        if cut is not None:
            return new[:cut], StopReason.STOP_STRING if self.ending.stop_string_at(new, cut) else StopReason.EOS
        if cand.eos:
            return new, StopReason.STOP_STRING if cut_by_stop else StopReason.EOS
        return new, StopReason.NO_PROGRESS if cand.text == "" else None

    def _move_models(self, r: Round, new: str, cfg: DecodeConfig) -> StopReason | None:
        """The models move to the new output (a lazy method's idle ones catch up in a later round's first phase) and
        the round is charged; a length cap may end the decode."""
        moving = [m for m, st in enumerate(r.steps) if not self.method.lazy or st.mode != StepMode.IDLE]
        with self._fatal():
            self.workers.map(lambda m: self.sessions[m].commit(new), moving)
        self.crew.ledger.charge(r.steps)
        return self._limits(new, cfg)

    def _limits(self, new: str, cfg: DecodeConfig) -> StopReason | None:
        """Whether every model, moved or idle, can go on from `new`: its output tokens under `max_new_tokens`, and room
        in its context window for a round's words. An idle model (a lazy method's) counts `new` in its own tokens as
        its catch-up will read it; one catching up in the background (`CatchUps.busy`) counts without reading its
        view's state (`ModelView.length`)."""
        busy = self.catch_ups.busy()
        sizes = [len(s.ids) if s.text == new else s.length(new) if m in busy else len(s.encode(new))
                 for m, s in enumerate(self.sessions)]
        if max(n - s.prompt_tokens for n, s in zip(sizes, self.sessions)) >= cfg.max_new_tokens:
            return StopReason.MAX_NEW_TOKENS
        if any(s.lm.max_positions and n + cfg.max_word_tokens * cfg.max_words >= s.lm.max_positions
               for n, s in zip(sizes, self.sessions)):
            return StopReason.CONTEXT_FULL
        return None

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

    def __iter__(self) -> Iterator[Round]:
        while not self.done:
            yield self.step()

    # ---- settings changed mid-decode ----
    def reconfigure(self, config: DecodeConfig) -> dict:
        """Change settings that only steer later rounds (LIVE_SETTINGS) from the next undecided round on; the trace
        records each change. Anything else (models, prompt, mode, stop strings, method) needs a new decode."""
        config = with_turn_end(config, self.models)
        changed = self.settings.changes(config)
        self._check_settings(config, type(self.method), self.models)
        if changed and not self.done:
            # the decided round keeps its settings, its commit (stop caps) included
            self.settings.change(config, pending=self._decided is not None)
            start = len(self.trace.rounds) + (self._decided is not None)
            self.trace.changes.append({"from_round": start, "settings": changed})
        return changed

    def _check_settings(self, config: DecodeConfig, kind: type[Method], models: Sequence[LoadedModel]) -> None:
        """The settings' checks against these models, at the start of a decode and on every change of settings; a
        gate file is read and checked here once, and its rounds use that gate."""
        config.check_models(len(models))
        kind.check(models, config)
        self.fusion.read_gate(config)

    # ---- the end of a decode ----
    def cancel(self, reason: StopReason = StopReason.CANCELLED) -> None:
        """Stop between rounds; the trace keeps what was decided (its stop reason: `reason`)."""
        self._decided = None
        if not self.done:
            self.done = True
            self.trace.stop_reason = reason
            self._settle()
            self.crew.close()

    @contextmanager
    def _fatal(self):
        """A model failing inside a phase (a server gone, out of memory) ends the decode: the trace keeps every round
        appended so far and says why; the models' states are not trusted any further."""
        try:
            yield
        except BaseException as exc:
            self._decided, self.done = None, True
            self.trace.stop_reason = f"error: {type(exc).__name__}: {str(exc)[:200]}"
            self._settle()
            self.crew.close()
            raise

    def _settle(self, steps: list[ModelStep] | None = None) -> None:
        """The decode is over: its background catch-ups end (`CatchUps.settle`) and their work is charged to `steps`
        (default: the last round's, if any)."""
        if steps is None and self.trace.rounds:
            steps = self.trace.rounds[-1].steps
        self.catch_ups.settle()
        if steps is not None:
            self.crew.ledger.charge(steps)


def unique_names(models: Sequence[LoadedModel]) -> list[str]:
    """The models' names in a trace: a name given twice gets #2, #3, ..."""
    names: list[str] = []
    for lm in models:
        name, k = lm.name, 2
        while name in names:
            name, k = f"{lm.name}#{k}", k + 1
        names.append(name)
    return names
