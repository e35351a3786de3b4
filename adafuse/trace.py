"""The trace: plain dataclasses (str/float/int/bool/list/dict) recording every decision."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

from .errors import TraceError

TRACE_VERSION = 3  # 2: end events with stop strings, notes, end_term, cut; 3: stop strings of several tokens
NLL_MAX = 1e6        # a per-token NLL above this (p < e^-1000000) is no model's: logits are never that far apart
ROUNDING = 1e-4      # float32 log-probs: a near-certain token's log p may come out a little above 0
PROB_FLOOR = 1e-30   # token union: a probability below this counts as it (the NLL of probability 0 is finite)


class StepMode(StrEnum):
    """What a model did in a round (`ModelStep.mode`); a str, so traces stay plain data."""
    COMMIT = "commit"    # confident (Δ ≥ τ): a greedy span of up to M words
    EXPLORE = "explore"  # uncertain: B first tokens, each finished into a word
    BEAM = "beam"        # uncertain, diversity off: a width-B beam search over the word
    SPAN = "span"        # fixed-span: a greedy span of exactly n words
    GREEDY = "greedy"    # one model alone, word by word
    WRITE = "write"      # mixture: the drawn model writes the word
    TOKEN = "token"      # token union: the model's top-k next tokens
    IDLE = "idle"        # did not act this round (mixture: not drawn)


class Unscored(StrEnum):
    """Why a model gives a candidate no NLL (`Candidate.notes`); a str, so traces stay plain data."""
    NO_TOKENS = "no token of the candidate can be scored in context"
    ZERO_PROB = "probability 0 under this model"   # ranks the candidate last when the model counts


# How steps count in a round's kind and in the figures (plain strings compare equal: read traces too)
EXPLORING = frozenset({StepMode.EXPLORE, StepMode.BEAM})                       # an uncertain model searched
SPAN_WRITING = frozenset({StepMode.COMMIT, StepMode.GREEDY, StepMode.SPAN})    # wrote its own greedy span
CONFIDENT = SPAN_WRITING | {StepMode.IDLE, StepMode.WRITE}  # a round of only these is a commit round


class StopReason(StrEnum):
    """Why a decode stopped (`Round.stop`, `Trace.stop_reason`); a failure is the text "error: ..." instead."""
    STOP_STRING = "stop string"
    EOS = "eos"
    NO_PROGRESS = "no progress"
    MAX_NEW_WORDS = "max_new_words"
    MAX_NEW_TOKENS = "max_new_tokens"
    CONTEXT_FULL = "context full"
    CANCELLED = "cancelled"
    DEADLINE = "deadline"          # a server's time limit for one request (`adafuse serve --timeout`)


@dataclass
class ModelStep:
    """What one model did in one round."""
    model: str
    mode: str                      # a StepMode: commit, explore, beam, span, greedy, write, token or idle
    margins: list[float]           # Δ = p(top1) − p(top2) at every word start it looked at
    proposals: list[int]           # indices into the round's candidates, in proposal order
    forward_passes: int = 0        # model calls this round (proposing + scoring + catching up)
    tokens_fed: int = 0            # token positions fed this round (batch rows × length)
    seconds: float = 0.0
    cached_tokens: int = 0         # a served model: prompt tokens its server took from its prefix cache this round
    # speculative proposals: draft tokens verified (in `verify_passes` batched forwards), tokens taken from them
    # instead of a forward each, and scoring forwards the verified drafts made unnecessary; forwards saved =
    # accepted - verify_passes + scores_from_drafts
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_passes: int = 0
    scores_from_drafts: int = 0
    # many decodes at once: forwards this round shared with other decodes' forwards, and the decodes in them (summed
    # over those forwards: riders / shared_passes decodes per shared forward)
    shared_passes: int = 0
    riders: int = 0
    # it proposed to end the answer before the answer held a word, and another candidate was in the pool: its end was
    # left out (`DecodeConfig.allow_empty` off)
    held_end: bool = False
    # an explore step: how its first tokens were chosen (adafuse/selection.py): {"strategy", "lambda", "bandwidth",
    # "tokens": [{token, rank, text, end, p, logp, penalty, score, picked, order, skip, like, similarity}]}
    selection: dict = field(default_factory=dict)


@dataclass
class Candidate:
    """One distinct span in the pool and how every model scored it."""
    text: str
    eos: bool                      # the span ends the answer: an end token, or a stop string it was cut before
    proposers: list[str]
    nll: dict[str, float | None]   # length-normalized NLL per model (None: not scored)
    n_tokens: dict[str, int]       # |T_m(c)| in context, per model
    fused: float | None            # the fused score (`fused_score`: weighted mean NLL; lower is better)
    words: int = 0
    straddle: dict[str, bool] = field(default_factory=dict)  # a token crossed the y|c boundary
    notes: dict[str, str] = field(default_factory=dict)      # per model: why its nll is None
    end_term: dict[str, float | None] = field(default_factory=dict)  # eos candidates: log p(answer ends) per model


def candidate_nll(c: Candidate, model: str, normalize: str = "token") -> float | None:
    """Model `model`'s NLL of candidate `c` as it enters the fused score: per token as scored, per word (its total NLL
    over its words, the end of the answer counting as one word), or per byte (its total NLL over the UTF-8 bytes of its
    text, the end of the answer counting as one byte: the same count for every model, whatever its tokenizer)."""
    v = c.nll.get(model)
    if v is None or normalize == "token":
        return v
    units = c.words if normalize == "word" else len(c.text.encode("utf-8"))
    return v * c.n_tokens[model] / max(1, units + int(c.eos))


def fused_score(c: Candidate, weights: dict[str, float] | None = None, normalize: str = "token") -> float | None:
    """Mean NLL (per token, word or byte: `normalize`) of candidate `c` over the models that scored it, weighted by
    `weights` when given (Σ w·NLL / Σ w; a model of weight 0 is shown but does not count); None (ranked last) when a
    counted model gives it probability 0."""
    w = weights or {}
    counted = {m: candidate_nll(c, m, normalize) for m in c.nll if w.get(m, 1.0) > 0}
    if any(v is None and c.notes.get(m) == Unscored.ZERO_PROB for m, v in counted.items()):
        return None
    vals = [(w.get(m, 1.0), v) for m, v in counted.items() if v is not None]
    total = sum(x for x, _ in vals)
    return sum(x * v for x, v in vals) / total if total > 0 else None


def lowest(scores: list[float | None]) -> int:
    """The index of the round's winner among these fused scores: the lowest, unscored (None) last, a tie to the
    earlier candidate."""
    return min(range(len(scores)), key=lambda i: (scores[i] is None, scores[i] or 0.0, i))


@dataclass
class Round:
    """One round: proposals, pool, scores, the choice."""
    index: int
    steps: list[ModelStep]
    candidates: list[Candidate]
    chosen: int                    # index of the appended candidate
    winner: int                    # index the scores picked (differs from chosen when overridden)
    text: str                      # exactly what was appended to the output (after stop cutting)
    words: int
    seconds: float
    overridden: bool = False
    stop: str | None = None        # why decoding stopped after this round, if it did
    cut: int = 0                   # characters later removed from `text` by a stop string that began here
    weights: dict[str, float] = field(default_factory=dict)  # per model: its weight in the fused score (empty: equal)
    # a gated round: per model, the features the gate saw (adafuse/gate.py FEATURES order); empty without a gate
    features: dict[str, list[float]] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """"override", "commit" (every model confident) or "explore" (someone explored)."""
        if self.overridden:
            return "override"
        return "commit" if all(s.mode in CONFIDENT for s in self.steps) else "explore"


@dataclass
class Trace:
    """A whole decode: settings, models, rounds, output and costs."""
    prompt: str
    models: list[str]
    settings: dict
    prompt_modes: dict[str, str]   # per model: "raw", "chat", "chat (no chat template: …)" (a transcript), with notes
    rounds: list[Round] = field(default_factory=list)
    output: str = ""
    stop_reason: str | None = None
    prefill: dict[str, dict] = field(default_factory=dict)  # per model: prompt_tokens, forward_passes, tokens_fed, seconds
    seconds: float = 0.0
    devices: dict[str, str] = field(default_factory=dict)
    workers: str = ""              # how the models ran: "parallel (2 workers, 1 CPU thread(s) each)" or "sequential"
    changes: list[dict] = field(default_factory=list)  # settings changed mid-decode: {"from_round": i, "settings": {..}}
    version: int = TRACE_VERSION

    # ---- derived numbers the CLI, app and benchmark read ----
    @property
    def words(self) -> int:
        return sum(r.words for r in self.rounds)

    def cost(self, model: str) -> dict:
        """Forward passes (requests), tokens fed, seconds and server prefix-cache tokens of one model, prefill
        included."""
        pre = self.prefill.get(model, {})
        steps = [s for r in self.rounds for s in r.steps if s.model == model]
        return {
            "forward_passes": pre.get("forward_passes", 0) + sum(s.forward_passes for s in steps),
            "tokens_fed": pre.get("tokens_fed", 0) + sum(s.tokens_fed for s in steps),
            "seconds": pre.get("seconds", 0.0) + sum(s.seconds for s in steps),
            "cached_tokens": pre.get("cached_tokens", 0) + sum(s.cached_tokens for s in steps),
        }

    def speculation(self, model: str) -> dict:
        """Speculative proposals of one model: draft tokens verified, tokens taken from them, forwards saved (taken
        tokens minus the verifying forwards, plus the scoring forwards they made unnecessary)."""
        steps = [s for r in self.rounds for s in r.steps if s.model == model]
        return {"draft tokens": sum(s.draft_tokens for s in steps),
                "accepted tokens": sum(s.accepted_tokens for s in steps),
                "forwards saved": sum(s.accepted_tokens - s.verify_passes + s.scores_from_drafts for s in steps)}

    def words_per_round(self) -> list[int]:
        return [r.words for r in self.rounds]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        """A trace from plain data, checked completely (types, indices, lengths): a bad field is a TraceError that
        names it, never a trace the views would trip over."""
        try:
            rounds = [
                Round(**{**r, "steps": [ModelStep(**s) for s in r["steps"]],
                         "candidates": [Candidate(**c) for c in r["candidates"]]})
                for r in d.get("rounds", [])
            ]
            fields = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k != "rounds"}
            trace = cls(**fields, rounds=rounds)
        except (TypeError, KeyError, AttributeError) as exc:
            raise TraceError(f"not a valid AdaFuse trace ({exc}); load a file written by Trace.save "
                             "or the app's export") from exc
        trace.check()
        return trace

    # ---- the settings a round was decided under ----
    def settings_at(self, round_index: int) -> dict:
        """The settings round `round_index` was decided under: the decode's, updated by each mid-decode change from
        the round it applied from."""
        settings = dict(self.settings)
        for ch in self.changes:
            if ch["from_round"] <= round_index:
                settings.update(ch["settings"])
        return settings

    def round_weights(self, round_index: int) -> dict[str, float]:
        """Per model, the weight of its NLL in round `round_index`'s fused scores (empty: all equal): the round's
        record (the settings' or a gate's weights), else, in a trace from before rounds recorded them, the settings'."""
        recorded = self.rounds[round_index].weights
        if recorded:
            return dict(recorded)
        return dict(zip(self.models, self.settings_at(round_index).get("weights") or ()))

    def check(self) -> None:
        """Raise TraceError naming the first field whose type, index or length is wrong, or whose numbers do not add
        up (`_check_numbers`)."""
        self._check_header()
        for i, r in enumerate(self.rounds):
            self._check_round(f"rounds[{i}]", r)
        if self.version >= 2 and "".join(r.text for r in self.rounds if isinstance(r.text, str)) != self.output:
            _bad("output", "is not the rounds' texts joined (every round appends its text to the output)")
        self._check_numbers()

    def _check_header(self) -> None:
        """The trace's own fields: prompt, output, models, settings, version and the mid-decode changes."""
        if not isinstance(self.prompt, str) or not isinstance(self.output, str):
            _bad("prompt/output", "must be text")
        if not isinstance(self.models, list) or not all(isinstance(m, str) for m in self.models) or not self.models:
            _bad("models", "must be a list of model names")
        if not isinstance(self.settings, dict):
            _bad("settings", "must be an object")
        if isinstance(self.version, bool) or not isinstance(self.version, int):
            _bad("version", f"is {self.version!r}, not a version number")
        for i, ch in enumerate(self.changes if isinstance(self.changes, list) else [None]):
            if not isinstance(ch, dict) or not isinstance(ch.get("from_round"), int) or isinstance(
                    ch.get("from_round"), bool) or ch["from_round"] < 0 or not isinstance(ch.get("settings"), dict):
                _bad(f"changes[{i}]", "must be {from_round: round index, settings: {...}}")
        for where, settings in [("settings", self.settings)] + [(f"changes[{i}].settings", ch["settings"])
                                                                for i, ch in enumerate(self.changes)]:
            w = settings.get("weights")
            if w is not None and (not isinstance(w, (list, tuple)) or len(w) not in (0, len(self.models))
                                  or not all(_num(x) and x >= 0 for x in w)):
                _bad(f"{where}.weights", f"is {w!r}: give one non-negative number per model ({len(self.models)}) "
                     "or none")

    def _check_round(self, at: str, r: Round) -> None:
        """One round's fields (`at`: "rounds[i]"), then each of its steps and candidates."""
        n = len(r.candidates) if isinstance(r.candidates, list) else 0
        for name in ("chosen", "winner"):
            v = getattr(r, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
                _bad(f"{at}.{name}", f"is {v!r}, not a candidate index (0..{n - 1})")
        if not isinstance(r.overridden, bool):
            _bad(f"{at}.overridden", "must be true or false")
        if not isinstance(r.text, str) or isinstance(r.words, bool) or not isinstance(r.words, int):
            _bad(f"{at}.text/words", "must be text and a whole number")  # (version 1 traces hold -1 after a cut)
        if not _num(r.seconds):
            _bad(f"{at}.seconds", "must be a number")
        if not isinstance(r.weights, dict) or not all(m in self.models and _num(v) and v >= 0
                                                      for m, v in r.weights.items()):
            _bad(f"{at}.weights", "must map the trace's models to non-negative numbers")
        if not isinstance(r.features, dict) or not all(
                m in self.models and isinstance(v, list) and all(_num(x) for x in v) for m, v in r.features.items()):
            _bad(f"{at}.features", "must map the trace's models to lists of numbers")
        if len(r.steps) != len(self.models):
            _bad(f"{at}.steps", f"has {len(r.steps)} entries for {len(self.models)} models")
        for j, st in enumerate(r.steps):
            self._check_step(f"{at}.steps[{j}]", st, n)
        for j, c in enumerate(r.candidates):
            self._check_candidate(f"{at}.candidates[{j}]", c)

    def _check_step(self, where: str, st: ModelStep, n: int) -> None:
        """One model's step in a round of `n` candidates: its model, margins, proposals, counters and selection."""
        if st.model not in self.models:
            _bad(f"{where}.model", f"{st.model!r} is not one of the trace's models")
        if not isinstance(st.margins, list) or not all(_num(x) for x in st.margins):
            _bad(f"{where}.margins", "must be a list of numbers")
        if not all(-ROUNDING <= x <= 1 + ROUNDING for x in st.margins):
            _bad(f"{where}.margins", f"are {st.margins}: a margin Δ = p(top1) − p(top2) lies in 0..1")
        if not isinstance(st.proposals, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n for x in st.proposals):
            _bad(f"{where}.proposals", f"must be candidate indices (0..{n - 1})")
        for f in ("forward_passes", "tokens_fed", "seconds", "draft_tokens", "accepted_tokens", "verify_passes",
                  "scores_from_drafts"):
            if not _num(getattr(st, f)) or getattr(st, f) < 0:
                _bad(f"{where}.{f}", "must be a number, never negative")
        if not _selection_ok(st.selection):
            _bad(f"{where}.selection", "must be an object whose tokens each have p, penalty, score numbers and a "
                 "picked flag")
        if not isinstance(st.held_end, bool):
            _bad(f"{where}.held_end", "must be true or false")

    def _check_candidate(self, where: str, c: Candidate) -> None:
        """One candidate's text, flags, proposers, fused score, word count and its per-model objects."""
        if not isinstance(c.text, str) or not isinstance(c.eos, bool):
            _bad(where, "needs text and an eos flag")
        if not isinstance(c.proposers, list) or not _num(c.fused, none=True):
            _bad(where, "needs a proposer list and a fused score (or null)")
        if isinstance(c.words, bool) or not isinstance(c.words, int) or c.words < 0:
            _bad(f"{where}.words", f"is {c.words!r}, not a count of words")
        for f in ("nll", "n_tokens", "straddle", "notes", "end_term"):
            if not isinstance(getattr(c, f), dict):
                _bad(f"{where}.{f}", "must be an object keyed by model")
        if not all(m in self.models and _num(v, none=True) for m, v in c.nll.items()):
            _bad(f"{where}.nll", "must map the trace's models to finite numbers (or null)")
        if not all(_num(v, none=True) for v in c.end_term.values()):
            _bad(f"{where}.end_term", "must hold finite numbers (or null)")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in c.n_tokens.values()) \
                or any(v is not None and m not in c.n_tokens for m, v in c.nll.items()):
            _bad(f"{where}.n_tokens", "must give each scoring model's count of tokens (a whole number)")

    def _check_numbers(self) -> None:
        """The numbers add up: every NLL and end term is one a model can give, every fused score is what the decoder
        computes from its candidate's NLLs under the round's weights and normalization (`fused_score`; token union:
        the log of the models' mean probability), the winner has the lowest fused score, and a chosen candidate
        other than the winner is recorded as an override."""
        stops = self.settings.get("stop")
        # each stop string's path joins the end term (scoring.py) and may overlap a pooled end token, so a log p of
        # the end reaches log(1 + stop strings) at most; an NLL (−mean log p) dips at most that far below 0
        top = math.log(1 + (len(stops) if isinstance(stops, (list, tuple)) else 0))
        shown = f"{top:.2f}" if top else "0"
        top += ROUNDING
        for i, r in enumerate(self.rounds):
            at = f"rounds[{i}]"
            weights, normalize = self.round_weights(i), self.settings_at(i).get("normalize") or "token"
            union = any(st.mode == StepMode.TOKEN for st in r.steps)
            for j, c in enumerate(r.candidates):
                where = f"{at}.candidates[{j}]"
                for m, v in c.nll.items():
                    if v is not None and not -top <= v <= NLL_MAX:
                        _bad(f"{where}.nll[{m!r}]", f"is {v!r}: an NLL (−mean log p per token) lies between "
                            f"{'−' * (shown != '0')}{shown} and {NLL_MAX:g}")
                for m, v in c.end_term.items():
                    if v is not None and not -NLL_MAX <= v <= top:
                        _bad(f"{where}.end_term[{m!r}]", f"is {v!r}: a log-probability of the end lies between "
                            f"−{NLL_MAX:g} and {shown}")
                if union:  # each NLL is −log max(p, floor), the fused score −log max(mean p, floor)
                    probs = [math.exp(-v) for v in c.nll.values() if v is not None]
                    mean = sum(probs) / len(probs) if probs else None
                    ok = mean is None if c.fused is None else mean is not None and c.fused >= -top and \
                        abs(math.exp(-c.fused) - mean) <= 2 * PROB_FLOOR + 1e-9 * mean
                    how, expected = "−log of its models' mean probability", \
                        None if mean is None else -math.log(max(mean, PROB_FLOOR))
                else:
                    expected = fused_score(c, weights, normalize)
                    ok = expected is None if c.fused is None else expected is not None and _close(c.fused, expected)
                    listed = ", ".join(f"{m}={w:g}" for m, w in weights.items()) or "equal"
                    how = f"the weighted mean of its NLLs (weights {listed}; per {normalize})"
                if not ok:
                    _bad(f"{where}.fused", f"is {c.fused!r}, but {how} is {expected!r}")
            best = r.candidates[r.winner].fused
            lower = [k for k, c in enumerate(r.candidates) if c.fused is not None
                     and (best is None or c.fused < best and not _close(c.fused, best))]
            if lower:
                k = lower[0]
                _bad(f"{at}.winner", f"is candidate {r.winner} (fused {best!r}), but candidate {k} scores lower "
                    f"({r.candidates[k].fused!r}): the winner is the lowest fused score")
            if r.overridden != (r.chosen != r.winner):
                _bad(f"{at}.chosen", f"is candidate {r.chosen} and the winner {r.winner}, but overridden is "
                    f"{r.overridden}: a round commits its winner unless a pick of another candidate is recorded")

    def to_json(self) -> str:
        """Strict JSON (no NaN or Infinity: browsers' JSON.parse rejects them; unscored values are null)."""
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=1, allow_nan=False)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json(), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"), parse_constant=_not_json)
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            # the file's name only: an upload's full path is a server's temporary folder, no use to the reader
            raise TraceError(f"cannot read trace {Path(path).name}: {reason}; pick a .json trace exported by "
                             "AdaFuse") from exc
        if not isinstance(data, dict) or "rounds" not in data or "models" not in data:
            raise TraceError(f"{Path(path).name} is JSON but not an AdaFuse trace (no 'rounds'/'models'); "
                             "pick a file exported by AdaFuse")
        return cls.from_dict(data)


def _bad(where: str, what: str):
    """Refuse the trace: `where` is the field, `what` what is wrong with it."""
    raise TraceError(f"this trace is inconsistent: {where} {what}; load a file written by Trace.save or the app's "
                     "export")


def _selection_ok(sel) -> bool:
    """An explore step's record of its first tokens (`ModelStep.selection`) has the fields the views read."""
    toks = sel.get("tokens", []) if isinstance(sel, dict) else None
    return isinstance(toks, list) and all(
        isinstance(x, dict) and isinstance(x.get("picked"), bool)
        and all(_num(x.get(f)) for f in ("p", "penalty", "score"))
        and all(_num(x.get(f), none=True) for f in ("similarity", "logp"))
        and all(x.get(f) is None or isinstance(x.get(f), int) and not isinstance(x.get(f), bool)
                for f in ("rank", "order", "like"))
        and isinstance(x.get("text", ""), str) for x in toks) \
        and all(_num(sel.get(f), none=True) for f in ("lambda", "bandwidth"))


def _num(v, none: bool = False) -> bool:
    """A finite number (not a bool), or None when `none`."""
    return (v is None and none) or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


def _close(a: float, b: float) -> bool:
    """Equal up to float rounding (a score recomputed in another order, or written by another program)."""
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _not_json(constant: str):
    """NaN / Infinity / -Infinity: Python's json reads them, strict JSON (and browsers) do not."""
    raise ValueError(f"{constant} is not a JSON number (traces are strict JSON: unscored values are null)")


def transcript_readers(trace: Trace) -> list[str]:
    """The models that read a chat decode's prompt as a plain User/Assistant transcript (no chat template of their
    own); older traces said "raw (no chat template)"."""
    if trace.settings.get("mode") != "chat":
        return []
    return [m for m, mode in trace.prompt_modes.items() if "no chat template" in mode]
