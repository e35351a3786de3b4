"""How a round's scores fuse into one per candidate: each model's weight, from the settings or a learned gate."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .gate import Gate, features, load_gate
from .trace import Candidate, ModelStep, StepMode, fused_score

if TYPE_CHECKING:
    from .config import DecodeConfig


def weighs(method: type, count: int) -> bool:
    """Whether per-model weights (fixed, or a learned gate's) enter the fused score: the method weighs its pool
    (`Method.weighted`) and there are two models or more."""
    return method.weighted and count > 1


def checked_gate(config: "DecodeConfig", names: Sequence[str], read: Gate | None = None) -> Gate | None:
    """The learned gate `config` names (`read`: that file already read), checked against these models and the
    settings' averaging, where one enters (`weighs`); None where it does not. The decoder and the scorer both take
    their gate from here."""
    if not (config.gate and weighs(config.method_class, len(names))):
        return None
    gate = read or load_gate(config.gate)
    gate.check(list(names), config.normalize)
    return gate


class Fusion:
    """The weights of one decode's rounds: `DecodeConfig.weights` (empty: all equal), or a learned gate's weights from
    what every model shows in the round (adafuse/gate.py), which can enter only where weights do (`weighs`). The gate
    files the settings name are read and checked once (`read_gate`); `gate_object` takes precedence over them (gate
    training sets it)."""

    def __init__(self, names: Sequence[str], method: type):
        self.names = list(names)
        self.weighted = weighs(method, len(self.names))  # weights enter its fused scores
        self.gates: dict[str, Gate] = {}  # the gate files this decode read and checked, by path
        self.gate_object: Gate | None = None

    def read_gate(self, config: "DecodeConfig") -> None:
        """Read and check the gate file `config` names (once; checked again on every change: `normalize` may have
        changed)."""
        gate = checked_gate(config, self.names, self.gates.get(config.gate))
        if gate is not None:
            self.gates[config.gate] = gate

    def gate(self, config: "DecodeConfig") -> Gate | None:
        """The learned gate of these settings (checked against these models), or None."""
        if not self.weighted:
            return None
        if self.gate_object is not None:
            return self.gate_object
        return self.gates[config.gate] if config.gate else None

    def weights(self, config: "DecodeConfig") -> dict[str, float]:
        """Per model, the weight of its NLL in the fused score (`DecodeConfig.weights`); empty: all equal, or weights
        do not enter (`weighs`)."""
        return dict(zip(self.names, config.weights)) if config.weights and self.weighted else {}

    def fuse(self, config: "DecodeConfig", gate: Gate | None, steps: list[ModelStep], candidates: list[Candidate],
             entropies: dict[int, float], words_before: int) -> tuple[dict[str, float], dict[str, list[float]]]:
        """Set each scored candidate's fused score; returns the round's weights and, with a gate, the features it saw
        (from what every model showed: its margin and `entropies` at the word start, whether it committed, the NLL it
        gives its own first proposal, and `words_before`)."""
        weights, feats = self.weights(config), {}
        if gate is not None:
            feats = {name: features(st.margins[0] if st.margins else None, entropies.get(m, 0.0),
                                    st.mode == StepMode.COMMIT,
                                    candidates[st.proposals[0]].nll.get(name) if st.proposals else None, words_before)
                     for m, (name, st) in enumerate(zip(self.names, steps))}
            weights = gate.weights(feats)
        for c in candidates:
            c.fused = fused_score(c, weights, config.normalize)
        return weights, feats
