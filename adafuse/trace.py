"""The trace: plain dataclasses (str/float/int/bool/list/dict) recording every decision."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

from .errors import TraceError

TRACE_VERSION = 3  # 2: end events with stop strings, notes, end_term, cut; 3: stop strings of several tokens


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
    fused: float | None            # the fused score (scoring.fused_score: weighted mean NLL; lower is better)
    words: int = 0
    straddle: dict[str, bool] = field(default_factory=dict)  # a token crossed the y|c boundary
    notes: dict[str, str] = field(default_factory=dict)      # per model: why its nll is None
    end_term: dict[str, float | None] = field(default_factory=dict)  # eos candidates: log p(answer ends) per model


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
    prompt_modes: dict[str, str]   # per model: "raw", "chat", or "raw (no chat template)"
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

    def check(self) -> None:
        """Raise TraceError naming the first field whose type, index or length is wrong."""
        def bad(where: str, what: str):
            raise TraceError(f"this trace is inconsistent: {where} {what}; load a file written by Trace.save or "
                             "the app's export")

        def num(v, none=False):
            return (v is None and none) or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                            and math.isfinite(v))

        if not isinstance(self.prompt, str) or not isinstance(self.output, str):
            bad("prompt/output", "must be text")
        if not isinstance(self.models, list) or not all(isinstance(m, str) for m in self.models) or not self.models:
            bad("models", "must be a list of model names")
        if not isinstance(self.settings, dict):
            bad("settings", "must be an object")
        for i, ch in enumerate(self.changes if isinstance(self.changes, list) else [None]):
            if not isinstance(ch, dict) or not isinstance(ch.get("from_round"), int) or isinstance(
                    ch.get("from_round"), bool) or ch["from_round"] < 0 or not isinstance(ch.get("settings"), dict):
                bad(f"changes[{i}]", "must be {from_round: round index, settings: {...}}")
        for i, r in enumerate(self.rounds):
            at = f"rounds[{i}]"
            n = len(r.candidates) if isinstance(r.candidates, list) else 0
            for name in ("chosen", "winner"):
                v = getattr(r, name)
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
                    bad(f"{at}.{name}", f"is {v!r}, not a candidate index (0..{n - 1})")
            if not isinstance(r.text, str) or isinstance(r.words, bool) or not isinstance(r.words, int):
                bad(f"{at}.text/words", "must be text and a whole number")  # (version 1 traces hold -1 after a cut)
            if not num(r.seconds):
                bad(f"{at}.seconds", "must be a number")
            if not isinstance(r.weights, dict) or not all(m in self.models and num(v) for m, v in r.weights.items()):
                bad(f"{at}.weights", "must map the trace's models to numbers")
            if not isinstance(r.features, dict) or not all(
                    m in self.models and isinstance(v, list) and all(num(x) for x in v) for m, v in r.features.items()):
                bad(f"{at}.features", "must map the trace's models to lists of numbers")
            if len(r.steps) != len(self.models):
                bad(f"{at}.steps", f"has {len(r.steps)} entries for {len(self.models)} models")
            for j, st in enumerate(r.steps):
                if st.model not in self.models:
                    bad(f"{at}.steps[{j}].model", f"{st.model!r} is not one of the trace's models")
                if not isinstance(st.margins, list) or not all(num(x) for x in st.margins):
                    bad(f"{at}.steps[{j}].margins", "must be a list of numbers")
                if not isinstance(st.proposals, list) or not all(
                        isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n for x in st.proposals):
                    bad(f"{at}.steps[{j}].proposals", f"must be candidate indices (0..{n - 1})")
                for f in ("forward_passes", "tokens_fed", "seconds", "draft_tokens", "accepted_tokens", "verify_passes",
                          "scores_from_drafts"):
                    if not num(getattr(st, f)):
                        bad(f"{at}.steps[{j}].{f}", "must be a number")
                sel = st.selection
                toks = sel.get("tokens", []) if isinstance(sel, dict) else None
                if not isinstance(toks, list) or not all(
                        isinstance(x, dict) and isinstance(x.get("picked"), bool)
                        and all(num(x.get(f)) for f in ("p", "penalty", "score"))
                        and all(num(x.get(f), none=True) for f in ("similarity", "logp"))
                        and all(x.get(f) is None or isinstance(x.get(f), int) and not isinstance(x.get(f), bool)
                                for f in ("rank", "order", "like"))
                        and isinstance(x.get("text", ""), str) for x in toks) \
                        or not all(num(sel.get(f), none=True) for f in ("lambda", "bandwidth")):
                    bad(f"{at}.steps[{j}].selection", "must be an object whose tokens each have p, penalty, score "
                        "numbers and a picked flag")
            for j, c in enumerate(r.candidates):
                where = f"{at}.candidates[{j}]"
                if not all(num(v, none=True) for f in ("n_tokens", "end_term") if isinstance(getattr(c, f), dict)
                           for v in getattr(c, f).values()):
                    bad(f"{where}.n_tokens/end_term", "must hold finite numbers (or null)")
                if not isinstance(c.text, str) or not isinstance(c.eos, bool):
                    bad(where, "needs text and an eos flag")
                if not isinstance(c.proposers, list) or not num(c.fused, none=True):
                    bad(where, "needs a proposer list and a fused score (or null)")
                for f in ("nll", "n_tokens", "straddle", "notes", "end_term"):
                    if not isinstance(getattr(c, f), dict):
                        bad(f"{where}.{f}", "must be an object keyed by model")
                if not all(num(v, none=True) for v in c.nll.values()):
                    bad(f"{where}.nll", "must hold finite numbers (or null)")
        if self.version >= 2 and "".join(r.text for r in self.rounds if isinstance(r.text, str)) != self.output:
            bad("output", "is not the rounds' texts joined (every round appends its text to the output)")

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


def _not_json(constant: str):
    """NaN / Infinity / -Infinity: Python's json reads them, strict JSON (and browsers) do not."""
    raise ValueError(f"{constant} is not a JSON number (traces are strict JSON: unscored values are null)")
