"""A learned gate: per-round model weights from what the models show at decode time (DLLG-style).

Each round, after the pool is scored, every model `m` is described by a few features it shows at that moment —
its margin Δ at the word start, the entropy of its next-token distribution there, whether it was confident
(committed a span) or explored, the NLL it gives its own first proposal, and how far the answer has come. The gate
maps the features of all models to one weight per model,

    w = n · softmax(W · x + b),      x = the features of every model, concatenated

so a gate of zeros gives every model weight 1 (plain AdaFuse). The fused score of a candidate is then Σ w·NLL / Σ w.
With two models and five features that is 2 × 10 + 2 = 22 numbers. It is trained from the final answer's metric
alone (`adafuse/harness/gate_train.py`: policy gradient, the round's choice sampled from the gated scores); at
decode time the lowest gated score wins, as always.

A gate file is JSON: the models and features it was trained for, W, b, and how it was trained (with
`trained.normalize`, how candidates' NLLs were averaged, when not per token). It refuses other models, or the
other averaging, with a `GateError` naming both. It may also say how the gate did on examples it was not tuned on
(`validated`, written by a validation script; shape: `check_validated`), which a menu can show beside it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import ConfigError

FEATURES = ("margin", "entropy", "confident", "own_nll", "position")
GATE_VERSION = 1


class GateError(ConfigError):
    """A gate file that cannot be used: missing, malformed, or trained for other models."""


def entropy(logprobs: torch.Tensor) -> float:
    """Entropy in nats of a next-token distribution given as log-probs (-inf entries count 0; a top-k distribution
    is renormalized first)."""
    lp = logprobs.float()
    finite = torch.isfinite(lp)
    if not bool(finite.any()):
        return 0.0
    lp = lp[finite]
    lp = lp - torch.logsumexp(lp, 0)
    return float(-(lp.exp() * lp).sum())


def features(margin: float | None, ent: float, confident: bool, own_nll: float | None, words_before: int) -> list[float]:
    """One model's features in one round, scaled to about [0, 1]."""
    return [float(margin or 0.0), ent / 10.0, 1.0 if confident else 0.0,
            min(own_nll, 20.0) / 10.0 if own_nll is not None else 2.0, min(words_before, 100) / 100.0]


@dataclass
class Gate:
    models: list[str]
    W: list[list[float]]           # n models × (n models · len(FEATURES))
    b: list[float]                 # n models
    features: list[str] = field(default_factory=lambda: list(FEATURES))
    trained: dict = field(default_factory=dict)  # how: tasks, examples, steps, seed, reward ...
    path: str = ""
    validated: dict = field(default_factory=dict)  # its scores on lines nobody tuned on (`check_validated`); {}: none

    @classmethod
    def zeros(cls, models: list[str]) -> "Gate":
        n, f = len(models), len(FEATURES)
        return cls(list(models), [[0.0] * (n * f) for _ in range(n)], [0.0] * n)

    @property
    def parameters(self) -> int:
        return sum(len(r) for r in self.W) + len(self.b)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(self.W, dtype=torch.float64), torch.tensor(self.b, dtype=torch.float64)

    def weights(self, feats: dict[str, list[float]]) -> dict[str, float]:
        """Per model, its weight this round from every model's features (same order as `models`)."""
        W, b = self.tensors()
        return dict(zip(self.models, gate_weights(W, b, stack(self.models, feats)).tolist()))

    @property
    def normalize(self) -> str:
        """How each candidate's NLL was averaged while the gate learned ("token" or "word"): its weights are tuned
        to that score."""
        return str(self.trained.get("normalize", "token"))

    def check(self, names: list[str], normalize: str) -> None:
        """Refuse models or an NLL averaging other than the ones the gate was trained with."""
        self.check_models(names)
        if normalize != self.normalize:
            raise GateError(f"the gate {self.path or ''} was trained with each candidate's NLL averaged per "
                            f"{self.normalize}, not per {normalize}: decode with normalize={self.normalize!r} "
                            f"(--normalize {self.normalize}), or train a gate with --normalize {normalize}")

    def check_models(self, names: list[str]) -> None:
        if list(names) != list(self.models):
            raise GateError(f"the gate {self.path or ''} was trained for the models {', '.join(self.models)} (in "
                            f"that order), not {', '.join(names)}: pick those models, train a gate for these "
                            "(python -m adafuse gate train), or decode without a gate")

    @property
    def helps(self) -> bool | None:
        """Whether its validation found it better than equal weights (by the rule recorded with the numbers); None
        when it was never validated."""
        return bool(self.validated["helps"]) if self.validated else None

    @property
    def summary(self) -> str:
        """One line on how it did on unseen examples, for a menu; "not validated" when it never was."""
        return str(self.validated["summary"]) if self.validated else "not validated"

    def to_dict(self) -> dict:
        return {"version": GATE_VERSION, "models": self.models, "features": self.features, "W": self.W, "b": self.b,
                "trained": self.trained, **({"validated": self.validated} if self.validated else {})}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False, ensure_ascii=False) + "\n",
                              encoding="utf-8")


def stack(models: list[str], feats: dict[str, list[float]]) -> torch.Tensor:
    return torch.tensor([v for m in models for v in feats[m]], dtype=torch.float64)


def gate_weights(W: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """n · softmax(W x + b): weights that average to 1 (zeros → every weight 1)."""
    return W.shape[0] * torch.softmax(W @ x + b, dim=-1)


def _number(d: dict, key: str, where: str) -> float:
    v = d.get(key) if isinstance(d, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"validated: {where}{key} must be a number, not {v!r}")
    return float(v)


def check_validated(v) -> dict:
    """The shape of a gate's validation record, or a ValueError naming what is wrong:
    {"lines": "51-100", "tasks": {TASK: {"metric": str, "n": int, "gate": num, "equal": num,
    "best_single": {"model": str, "score": num}, "vs_equal": {"diff", "low", "high"}, "vs_best_single": {...}}},
    "helps": bool, "summary": str} — scores on the task's main metric; differences are the gate minus the other, with
    a 95 % interval (low ≤ diff ≤ high). Other keys (how it was decoded, pooled numbers, the rule) are kept as is."""
    if not isinstance(v, dict):
        raise ValueError(f"validated must be an object, not {type(v).__name__}")
    lines = v.get("lines")
    lo, _, hi = str(lines).partition("-")
    if not isinstance(lines, str) or not (lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)):
        raise ValueError(f"validated: lines must read FIRST-LAST, e.g. '51-100', not {lines!r}")
    if not isinstance(v.get("helps"), bool) or not isinstance(v.get("summary"), str) or not v["summary"].strip():
        raise ValueError("validated: helps must be true or false and summary a non-empty line")
    tasks = v.get("tasks")
    if not isinstance(tasks, dict) or not tasks:
        raise ValueError("validated: tasks must map each task to its numbers")
    for task, t in tasks.items():
        where = f"tasks.{task}."
        if not isinstance(t, dict) or not isinstance(t.get("metric"), str):
            raise ValueError(f"validated: {where}metric must name the task's metric")
        if isinstance(t.get("n"), bool) or not isinstance(t.get("n"), int) or t["n"] < 1:
            raise ValueError(f"validated: {where}n must be a count of examples, not {t.get('n')!r}")
        _number(t, "gate", where), _number(t, "equal", where)
        best = t.get("best_single")
        if not isinstance(best, dict) or not isinstance(best.get("model"), str):
            raise ValueError(f"validated: {where}best_single must name a model and its score")
        _number(best, "score", where + "best_single.")
        for key in ("vs_equal", "vs_best_single"):
            d = t.get(key)
            low, diff, high = (_number(d, k, f"{where}{key}.") for k in ("low", "diff", "high"))
            if not low <= diff <= high:
                raise ValueError(f"validated: {where}{key} must have low <= diff <= high, not {low}, {diff}, {high}")
    return v


def load_gate(path: str | Path) -> Gate:
    """Read and check a gate file (a decode reads it once, when it starts or its settings change)."""
    p = Path(path)
    if not p.is_file():
        raise GateError(f"no gate file at {path}: give the path of a file written by `python -m adafuse gate train` "
                        f"(shipped ones are in assets/gates/)")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GateError(f"{path} is not a gate file (not JSON: {exc})") from exc
    try:
        if raw.get("version") != GATE_VERSION:
            raise ValueError(f"version {raw.get('version')!r}, this library reads {GATE_VERSION}")
        if list(raw["features"]) != list(FEATURES):
            raise ValueError(f"features {raw['features']} differ from this library's {list(FEATURES)}")
        models = [str(m) for m in raw["models"]]
        n, f = len(models), len(FEATURES)
        W = [[float(v) for v in row] for row in raw["W"]]
        b = [float(v) for v in raw["b"]]
        if len(W) != n or any(len(row) != n * f for row in W) or len(b) != n:
            raise ValueError(f"W must be {n}×{n * f} and b {n} long for {n} models")
        if not all(math.isfinite(v) for row in W for v in row) or not all(math.isfinite(v) for v in b):
            raise ValueError("W and b must be finite numbers")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise GateError(f"{path} is not a usable gate file: {exc}") from exc
    try:
        validated = check_validated(raw["validated"]) if "validated" in raw else {}
    except ValueError as exc:
        raise GateError(f"{path} has a malformed validation record ({exc}): write it again with the script that "
                        "validated the gate, or delete the \"validated\" entry") from exc
    return Gate(models, W, b, list(FEATURES), dict(raw.get("trained") or {}), str(path), dict(validated))
