"""A lazy method's idle models catching up in the background while the models run side by side."""
from __future__ import annotations

from concurrent.futures import Future
from typing import Iterable

from .crew import Crew


class CatchUps:
    """With a lazy method (`Method.lazy`) a model that did not act still has to read the words it missed before it
    acts again. Side by side, the drawn models left idle catch up on their workers while the round goes on, and a model
    drawn later finishes its catch-up first; one after another they catch up only when next drawn (one forward over
    every word they missed, in the round itself)."""

    def __init__(self, crew: Crew):
        self.crew = crew
        self.running: dict[int, Future] = {}  # per model: its catch-up in the background

    def before_round(self, acting: Iterable[int], drawn: Iterable[int], output: str) -> None:
        """The acting models' catch-ups are over (done, or waited for: an error is this round's); side by side, the
        drawn models that do not act start catching up to `output`."""
        for m in acting:
            behind = self.running.pop(m, None)
            if behind is not None:
                behind.result()
        if self.crew.side_by_side:
            for m in drawn:
                if m not in acting and self.crew.views[m].text != output:
                    self._start(m, output)

    def busy(self) -> frozenset[int]:
        """The models still catching up in the background (their views are not to be read meanwhile)."""
        return frozenset(m for m, future in self.running.items() if not future.done())

    def _start(self, m: int, output: str) -> None:
        """Start model m's catch-up to `output` on its worker unless one is still running (the next takes the rest)."""
        behind = self.running.get(m)
        if behind is not None:
            if not behind.done():
                return
            behind.result()  # a catch-up that failed ends the decode here
        future = self.crew.workers.submit(m, lambda i, text=output: self.crew.views[i].commit(text))
        if future is not None:
            self.running[m] = future

    def settle(self) -> None:
        """The decode is over: the catch-ups not started are cancelled, the running ones waited for (nothing touches a
        model of this decode afterwards). What they raise no longer matters: the model is not used again."""
        running, self.running = self.running, {}
        for future in running.values():
            if not future.cancel():
                try:
                    future.result()
                except Exception:  # noqa: BLE001 - see above
                    pass
