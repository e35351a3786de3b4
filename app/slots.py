"""Decoding slots: at most N decodes run at once on this server; a visitor who waits is told where they are in line and
an estimate measured from the decodes this server has run (not Gradio's guess from other handlers' times)."""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque


class Slots:
    """First come, first served: `try_take(ticket)` takes a slot when one is free and the ticket is first in line;
    `release(ticket)` gives it back (or leaves the line). Durations of the last `window` holds are kept to estimate
    waits."""

    def __init__(self, n: int, window: int = 20):
        self.n = n
        self._lock = threading.Lock()
        self._running: dict[int, float] = {}   # ticket -> when it took its slot
        self._line: list[int] = []             # tickets waiting, first in line first
        self._durations: deque[float] = deque(maxlen=window)
        self._tickets = itertools.count()

    def ticket(self) -> int:
        with self._lock:
            t = next(self._tickets)
            self._line.append(t)
            return t

    def try_take(self, ticket: int) -> bool:
        with self._lock:
            if len(self._running) < self.n and self._line and self._line[0] == ticket:
                self._line.pop(0)
                self._running[ticket] = time.monotonic()
                return True
            return False

    def release(self, ticket: int) -> None:
        with self._lock:
            start = self._running.pop(ticket, None)
            if start is not None:
                self._durations.append(time.monotonic() - start)
            elif ticket in self._line:
                self._line.remove(ticket)

    def waiting(self, ticket: int) -> tuple[int, float | None]:
        """(decodes ahead of this ticket, estimated seconds until it gets a slot): each running decode is expected to
        take the mean of the measured holds; None before any hold was measured."""
        with self._lock:
            if ticket not in self._line:  # running (or gone): nothing to wait for
                return 0, 0.0
            ahead = self._line.index(ticket)
            if not self._durations:
                return ahead + len(self._running), None
            mean = sum(self._durations) / len(self._durations)
            now = time.monotonic()
            frees = sorted(max(0.0, mean - (now - s)) for s in self._running.values())
            frees += [0.0] * (self.n - len(frees))  # a free slot frees now
            return ahead + len(self._running), frees[ahead % self.n] + (ahead // self.n) * mean

    def note(self, ticket: int) -> str:
        """The waiting visitor's status line."""
        ahead, eta = self.waiting(ticket)
        when = f"about {eta:.0f}s (measured from the last {len(self._durations)} decodes here)" if eta is not None \
            else "no decode measured on this server yet"
        return f"… waiting for a free decoding slot: {ahead} decode(s) ahead, {when}"
