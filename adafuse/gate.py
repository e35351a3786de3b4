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
other averaging, with a `GateError` naming both.
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

    def to_dict(self) -> dict:
        return {"version": GATE_VERSION, "models": self.models, "features": self.features, "W": self.W, "b": self.b,
                "trained": self.trained}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n", encoding="utf-8")


def stack(models: list[str], feats: dict[str, list[float]]) -> torch.Tensor:
    return torch.tensor([v for m in models for v in feats[m]], dtype=torch.float64)


def gate_weights(W: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """n · softmax(W x + b): weights that average to 1 (zeros → every weight 1)."""
    return W.shape[0] * torch.softmax(W @ x + b, dim=-1)


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
    return Gate(models, W, b, list(FEATURES), dict(raw.get("trained") or {}), str(path))
