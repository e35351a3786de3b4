"""Decoding settings: a frozen dataclass validated on construction."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from . import method_registry
from .errors import ConfigError

MODES = ("raw", "chat")
EXPLORATIONS = ("surface", "embedding")
NORMALIZATIONS = ("token", "word", "byte")
# the paper's unit and pool, as every stored research run (results/) was decoded before per word and the held-back
# end became the defaults: what a reproduction or a resumed stored run names
PAPER = {"normalize": "token", "allow_empty": True}
# what a trace's settings meant where they do not name a setting (it did not exist yet): the behaviour of that time
LEGACY = {"speculate": False, **PAPER}


@dataclass(frozen=True)
class DecodeConfig:
    # τ_Δ: a model whose top1−top2 probability margin is at least this commits words greedily
    tau: float = 0.7
    # M: the most words one confident model may commit in a round
    max_words: int = 3
    # B: how many one-word candidates an uncertain model proposes
    branches: int = 3
    # diverse exploration (distinct first tokens); False is the paper's beam-search ablation
    diversity: bool = True
    # stop after this many words of output
    max_new_words: int = 64
    # stop after this many tokens of output (counted with each model's tokenizer, the largest wins)
    max_new_tokens: int = 256
    # a word ends after this many tokens even without whitespace (CJK, code, runaway tokens)
    max_word_tokens: int = 16
    # the output is cut before the first occurrence of any of these strings
    stop: tuple[str, ...] = ()
    # "raw": the prompt text as is; "chat": each model's own chat template (raw if it has none)
    mode: str = "raw"
    # chat mode: a system message before the user's (the user message holds it where the template has no system
    # role); raw mode ignores it and the trace's prompt modes say so
    system: str = ""
    # chat mode: the conversation before the prompt, as (role, text) pairs of "user" and "assistant" messages taking
    # turns, the first a user's and the last an assistant's; the prompt is the next user message and the ensemble
    # writes the assistant's answer to it. Each model's chat template renders the whole conversation
    history: tuple[tuple[str, str], ...] = ()
    # chat mode: the template's `enable_thinking` switch (think first, or answer directly); None leaves the
    # template's default, and templates without the switch ignore it
    thinking: bool | None = None
    # the method and its own settings, as a spec of the method registry (adafuse/method_registry.py; each method's
    # `summary` says what it does): "adafuse", "fixed-span-2", "mixture[seed=3,temperature=0.5]"; kept in the
    # shortest form (`method_registry.to_spec`), its settings in `method_settings`
    method: str = "adafuse"
    # score the pool even when it holds a single candidate (costs forwards, fills the trace)
    score_single: bool = False
    # how many top tokens exploration looks through for B distinct first tokens
    explore_top_k: int = 64
    # how an uncertain model picks its B first tokens: "surface" (the most probable ones whose stripped texts differ) or
    # "embedding" (greedy subset selection: log-probability minus a redundancy penalty from the similarity of the
    # tokens' input embeddings, see adafuse/selection.py; needs the model's weights, so not for a served model)
    exploration: str = "surface"
    # λ for exploration "embedding": the redundancy penalty's weight in nats (0: the surface strategy exactly)
    explore_lambda: float = 1.0
    # per-model weights (empty: equal): the scored methods (adafuse, beam, fixed-span) fuse Σ w·NLL / Σ w; "mixture"
    # draws its writer with these odds
    weights: tuple[float, ...] = ()
    # a learned gate (adafuse/gate.py): the path of a gate file; each scored round's weights come from what the models
    # show that round (margin, entropy, confidence, own NLL, position) instead of `weights`. Empty: no gate
    gate: str = ""
    # speculative proposals: before a confident model writes its span it verifies the spans the models before it
    # proposed this round (and its own continuation left from the last round) in one batched forward, and takes their
    # tokens where they are its own greedy choice; the decode is the same, with fewer forward passes. On by default:
    # measured no slower on short answers and 26–30 % faster on a mix with long ones (docs/performance.md,
    # "Speculative proposals")
    speculate: bool = True
    # with `speculate`: also verify what followed the latest earlier occurrence of the answer's last words in the prompt
    # and the answer (prompt lookup; answers that copy from their question or repeat a format), not only the models'
    # spans. Lossless either way: a draft only ever saves forwards
    draft_lookup: bool = True
    # what a candidate's NLL is averaged over before fusing: "token" (the paper: its tokens in each model's
    # tokenization), "word" (its words, the end of the answer counting as one) or "byte" (its text's UTF-8 bytes, the
    # same count for every model; the end counting as one): per token, a long word whose first token is unlikely and
    # whose last tokens are near certain beats a likelier one-token word (docs/results.md). Per word by default: the
    # unit a rule declared before the run chose, on the tasks and on newcomers' questions (docs/defaults.md)
    normalize: str = "word"
    # whether the end of the answer (an end token or a stop string) may win a round before the answer holds a word.
    # Off: while the answer is empty, a proposal to end it is left out of the pool whenever a candidate with text is in
    # it (its model's step says so: `ModelStep.held_end`), as `min_new_tokens` keeps a model's end token back. Per
    # word, a question's end ("\n" after "Answer:") is one word as likely as the answer's first, and won at once on 6 of
    # 30 newcomers' questions (bench/newcomers.py); the paper lets it (True). The methods that pool proposals follow
    # it; token union, which builds its own round from next-token probabilities, does not
    allow_empty: bool = False

    def __post_init__(self) -> None:
        def bad(name: str, value, fix: str) -> ConfigError:
            return ConfigError(f"{name}={value!r} is invalid: {fix}")

        if not isinstance(self.tau, (int, float)) or math.isnan(self.tau) or not 0.0 <= self.tau <= 1.0:
            raise bad("tau", self.tau, "use a margin threshold between 0 and 1 (default 0.7)")
        for name, low, high in (("max_words", 1, 64), ("branches", 1, 32), ("max_new_words", 1, 100_000),
                                ("max_new_tokens", 1, 1_000_000), ("max_word_tokens", 1, 256),
                                ("explore_top_k", 1, 10_000)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise bad(name, value, f"use a whole number from {low} to {high}")
        if self.mode not in MODES:
            raise bad("mode", self.mode, f"use one of {', '.join(MODES)}")
        if not isinstance(self.system, str):
            raise bad("system", self.system, "use a string (empty: no system message)")
        object.__setattr__(self, "history", _history(self.history, bad))
        if self.thinking is not None and not isinstance(self.thinking, bool):
            raise bad("thinking", self.thinking, "use True, False or None (the template's default)")
        if self.exploration not in EXPLORATIONS:
            raise bad("exploration", self.exploration, f"use one of {', '.join(EXPLORATIONS)}")
        if isinstance(self.explore_lambda, bool) or not isinstance(self.explore_lambda, (int, float)) \
                or not 0.0 <= self.explore_lambda <= 100.0:  # NaN and ±inf fail the range check too
            raise bad("explore_lambda", self.explore_lambda, "use a number from 0 (surface order) to 100 (default 1)")
        object.__setattr__(self, "explore_lambda", float(self.explore_lambda))
        cls, settings = method_registry.from_spec(self.method)
        object.__setattr__(self, "method", method_registry.to_spec(cls, settings))
        object.__setattr__(self, "_method", (cls, settings))  # not a field: equal specs, equal configs
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not isinstance(s, str) or s == "" for s in stop):
            raise bad("stop", self.stop, "stop strings must be non-empty strings")
        object.__setattr__(self, "stop", stop)
        weights = tuple(float(w) for w in self.weights)
        if any(not w >= 0 for w in weights) or (weights and sum(weights) <= 0):
            raise bad("weights", self.weights, "use non-negative numbers, at least one positive")
        object.__setattr__(self, "weights", weights)
        if self.normalize not in NORMALIZATIONS:
            raise bad("normalize", self.normalize, f"use one of {', '.join(NORMALIZATIONS)}")
        if not isinstance(self.speculate, bool):
            raise bad("speculate", self.speculate, "use True or False")
        if not isinstance(self.draft_lookup, bool):
            raise bad("draft_lookup", self.draft_lookup, "use True or False")
        if not isinstance(self.allow_empty, bool):
            raise bad("allow_empty", self.allow_empty, "use True or False")
        if not isinstance(self.gate, str):
            raise bad("gate", self.gate, "use the path of a gate file, or an empty string for none")
        if self.explore_top_k < self.branches:
            object.__setattr__(self, "explore_top_k", self.branches)

    @property
    def method_class(self) -> type:
        """The method's class in the registry (adafuse/methods.py)."""
        return self._method[0]

    @property
    def method_settings(self) -> method_registry.MethodSettings:
        """The method's own settings (its class's frozen `Settings`)."""
        return self._method[1]

    def check_models(self, count: int) -> None:
        """These settings against `count` models, before any loads: the method decodes with that many, and `weights`
        has one per model."""
        self.method_class.check_count(count)
        check_weights(self.weights, count)

    @classmethod
    def of(cls, base: "DecodeConfig | None" = None, **values) -> "DecodeConfig":
        """Settings given flat, as a CLI, a request or lm-eval's model_args give them: DecodeConfig's fields and the
        method's own settings by name (`method="fixed-span", span_words=2` is `method="fixed-span-2"`), over `base`
        (default: the defaults)."""
        base = base if base is not None else cls()
        own = {k: values.pop(k) for k in list(values) if k not in cls.__dataclass_fields__}
        for k, v in own.items():
            if k not in method_registry.setting_names():
                raise ConfigError(f"{k}={v!r} is not a setting: use a decoding setting ({', '.join(cls.__dataclass_fields__)}) "
                                  f"or a method's own ({', '.join(method_registry.setting_names())})")
        if own:
            values["method"] = method_registry.canonical(values.get("method", base.method), **own)
        return replace(base, **values)

    def view_args(self) -> tuple:
        """How each model reads the prompt: `LoadedModel.open_view`'s arguments after it."""
        return self.mode, self.stop, self.system, self.thinking, self.history

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop"] = list(self.stop)
        d["weights"] = list(self.weights)
        d["history"] = [list(turn) for turn in self.history]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DecodeConfig":
        """The settings a trace recorded (`to_dict`). A setting it does not name did not exist when it was decoded
        and takes its default, which was that decode's behaviour — except `speculate`, off until it became the
        default, `normalize` per token and `allow_empty` on before each was a setting (`LEGACY`): an older trace
        replays, branches and explains as it was decoded, costs included."""
        known = LEGACY | {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for key in ("stop", "weights"):
            if key in known:
                known[key] = tuple(known[key])
        known["method"] = method_registry.legacy(d)  # a method's own settings kept beside the others before
        return cls(**known)


def check_weights(weights, count: int) -> None:
    """Per-model weights against `count` models: none (equal weights) or one per model (ConfigError otherwise)."""
    if weights and len(weights) != count:
        raise ConfigError(f"weights has {len(weights)} values for {count} models: give one per model")


def _history(history, bad) -> tuple[tuple[str, str], ...]:
    """`DecodeConfig.history` checked: (role, text) pairs (lists from JSON too), user and assistant taking turns from a
    user's message to an assistant's."""
    fix = ('use (role, text) pairs of "user" and "assistant" messages taking turns, the first a user\'s and the last '
           'an assistant\'s (the prompt is the next user message)')
    try:
        turns = tuple((role, text) for role, text in history)
    except (TypeError, ValueError):
        raise bad("history", history, fix) from None
    for i, (role, text) in enumerate(turns):
        if role != ("user", "assistant")[i % 2] or not isinstance(text, str):
            raise bad("history", history, fix)
    if len(turns) % 2:
        raise bad("history", history, fix)
    return turns
