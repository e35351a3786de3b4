"""The models at work in one decode: their views of the text, the workers that run them, their costs so far."""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Sequence

from .costs import Ledger
from .models.batching import Rider
from .parallel import Workers
from .view import ModelView

if TYPE_CHECKING:
    from .models import LoadedModel


class Crew:
    """Each model's view of the text (prefilled with the prompt here), the workers that run a phase of a round on all
    of them, this decode's rider at the models' batchers (many decodes at once share forwards) and the ledger that
    charges their work to rounds."""

    def __init__(self, models: Sequence["LoadedModel"], prompt: str, view_args: tuple,
                 parallel: bool | None = None, threads: int | None = None, probe: bool = True):
        self.models = list(models)
        # each phase of a round runs the models side by side (one worker each) or one after another: `parallel`
        # True/False, or None to choose (side by side when each model has its own GPU, server or the CPU; see `Workers`);
        # `threads`: torch CPU threads per worker (default: the cores shared out); `probe`: see `Method.overlaps`
        self.workers = Workers(self.models, parallel, threads, probe=probe)
        weakref.finalize(self, self.workers.close)
        self.rider = Rider()
        with self.rider.working():
            for lm in self.models:
                lm.expect(self.rider)
            self.views: list[ModelView] = self.workers.map(
                lambda m: self.models[m].open_view(prompt, *view_args), range(len(self.models)))
        self.ledger = Ledger(self.views)  # cost counters as last charged to a round

    @property
    def side_by_side(self) -> bool:
        """The models run side by side, one worker each (else one after another in the caller's thread)."""
        return self.workers.enabled and self.workers.parallel

    def close(self) -> None:
        """The decode is over: the workers stop and the views let go of their caches (a finished decode that is still
        referenced, say by a page's session, holds no model memory; the trace keeps everything)."""
        self.workers.close()
        for view in self.views:
            view.release()
