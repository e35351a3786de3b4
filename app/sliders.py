"""The settings' sliders and what a value typed into a slider's box becomes: the nearest value the slider can show,
in its range and on its steps, said when it differs from what was typed (the box, the slider and the decode then agree).

Gradio's own slider refuses an out-of-range number with an error at every keystroke, then clamps it in the page when
the box loses focus, and takes 3.5 for a whole-number slider whose bar shows 4: a `setting` snaps instead, the same
way in the page (`snap_typed`, when the box loses focus) and in every handler that reads it (`Spec.snap`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import gradio as gr

from adafuse.errors import ConfigError


@dataclass(frozen=True)
class Spec:
    """A slider's range and step, and its name in messages."""
    lo: float
    hi: float
    step: float
    name: str

    @property
    def whole(self) -> bool:
        return float(self.step).is_integer() and float(self.lo).is_integer()

    def rule(self) -> str:
        """"whole numbers from 1 to 8", "values from 0 to 1 in steps of 0.05"."""
        kind = "whole numbers" if self.whole and self.step == 1 else "values"
        steps = "" if self.whole and self.step == 1 else f" in steps of {self.step:g}"
        return f"{kind} from {self.lo:g} to {self.hi:g}{steps}"

    def snap(self, value) -> float | int:
        """The nearest value this slider can show: within its range, on its steps (an empty box: its minimum, as the
        page sets it). Not a number: a typed error naming the range."""
        if value is None or value == "":
            return int(self.lo) if self.whole else float(self.lo)
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.name} takes {self.rule()}: {value!r} is not a number") from None
        if not math.isfinite(v):
            raise ConfigError(f"{self.name} takes {self.rule()}: {value!r} is not one")
        k = math.floor((min(max(v, self.lo), self.hi) - self.lo) / self.step + 0.5)
        out = round(min(self.hi, self.lo + k * self.step), 10)
        return int(out) if self.whole else out

    def says(self, typed, value) -> str:
        """What happened to a typed value that is not one of this slider's."""
        shown = "an empty box" if typed is None or typed == "" else f"{typed:g}" if isinstance(typed, (int, float)) \
            else repr(typed)
        return f"{self.name} takes {self.rule()}: {shown} is set to {value:g}"


def passed_on(payload):
    """A `setting`'s preprocess: the number as typed (the handler snaps it), not gr.Slider's range error."""
    return payload


def setting(spec: Spec, **kwargs) -> gr.Slider:
    """A Gradio slider over `spec`'s range and steps whose typed values reach the handlers as typed, to be snapped
    (`Spec.snap`), rather than raise at every keystroke; `.spec` says how. (Its own preprocess, not a subclass: Gradio
    writes a .pyi stub beside the module of every component subclass.)"""
    c = gr.Slider(spec.lo, spec.hi, step=spec.step, **kwargs)
    c.spec = spec
    c.preprocess = passed_on
    return c


def snap_typed(spec: Spec):
    """The handler of a `setting`'s release (its box loses focus, or its bar is let go): a value it cannot show is set
    to the nearest one it can, in the box and on the bar, and a message says so, naming the range."""
    def on_release(value):
        try:
            out = spec.snap(value)
        except ConfigError as exc:
            gr.Warning(str(exc))
            return spec.snap(None)
        if value is None or value == "" or float(value) != out:
            gr.Warning(spec.says(value, out))
            return out
        return gr.update()
    return on_release


TAU = Spec(0, 1, 0.05, "τΔ")
MAX_WORDS = Spec(1, 5, 1, "M (most words a confident model commits)")
BRANCHES = Spec(1, 8, 1, "B (candidates an uncertain model explores)")
LAMBDA = Spec(0, 5, 0.25, "λ")
MAX_NEW_WORDS = Spec(1, 200, 1, "Max new words")
MAX_NEW_TOKENS = Spec(16, 2048, 16, "Max new tokens")
WEIGHT = Spec(0, 5, 0.25, "A model's weight")
EXAMPLES = Spec(1, 20, 1, "Examples")
