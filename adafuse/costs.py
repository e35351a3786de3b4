"""Cost bookkeeping: each model's forward passes, tokens fed, seconds and speculation counts, charged to rounds."""
from __future__ import annotations

from typing import Sequence

from .trace import ModelStep
from .view import ModelView

SPEC_COUNTERS = ("draft_tokens", "accepted_tokens", "verify_passes", "scores_from_drafts")
# many decodes at once (models/batching.py): forwards shared with other decodes, and the decodes in them
BATCH_COUNTERS = ("shared_passes", "riders")
COUNTERS = SPEC_COUNTERS + BATCH_COUNTERS


def snapshot(s: ModelView) -> tuple:
    """A model's cost counters now: forward passes, tokens fed, seconds, cached prompt tokens, then COUNTERS."""
    return (*s.stats(), *(getattr(s, key) for key in COUNTERS))  # COUNTERS: fields of every ModelView


class Ledger:
    """What each model's view has been charged so far: `charge` adds the work done since to a round's steps (the one
    place costs are counted), so work between rounds, such as a catch-up in the background, goes to the next round
    charged."""

    def __init__(self, views: Sequence[ModelView]):
        self.views = list(views)
        self.charged = [snapshot(s) for s in self.views]

    def charge(self, steps: list[ModelStep]) -> None:
        for i, (step, s) in enumerate(zip(steps, self.views)):
            now, before = snapshot(s), self.charged[i]
            step.forward_passes += now[0] - before[0]
            step.tokens_fed += now[1] - before[1]
            step.seconds += now[2] - before[2]
            step.cached_tokens += now[3] - before[3]
            for k, key in enumerate(COUNTERS):
                setattr(step, key, getattr(step, key) + now[4 + k] - before[4 + k])
            self.charged[i] = now
