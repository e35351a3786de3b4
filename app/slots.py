"""Decoding slots: at most N decodes at once on this server, and a waiting visitor's measured estimate."""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque


class Slots:
    """First come, first served: `try_take(ticket)` takes a slot when one is free and the ticket is first in line;
    `release(ticket)` gives it back (or leaves the line). The last `window` holds of each kind of work ("run", "step",
    "branch": a Step holds a slot for one round, a Run for a whole decode) are kept to estimate waits."""

    def __init__(self, n: int, window: int = 20):
        self.n = n
        self._lock = threading.Lock()
        self._running: dict[int, tuple[float, str]] = {}  # ticket -> (when it took its slot, its kind)
        self._line: list[int] = []                        # tickets waiting, first in line first
        self._kinds: dict[int, str] = {}
        self._durations: dict[str, deque[float]] = {}
        self._window = window
        self._tickets = itertools.count()

    def ticket(self, kind: str = "run") -> int:
        with self._lock:
            t = next(self._tickets)
            self._line.append(t)
            self._kinds[t] = kind
            return t

    def try_take(self, ticket: int) -> bool:
        with self._lock:
            if len(self._running) < self.n and self._line and self._line[0] == ticket:
                self._line.pop(0)
                self._running[ticket] = (time.monotonic(), self._kinds.pop(ticket))
                return True
            return False

    def release(self, ticket: int | None) -> None:
        with self._lock:
            held = self._running.pop(ticket, None)
            if held is not None:
                start, kind = held
                self._durations.setdefault(kind, deque(maxlen=self._window)).append(time.monotonic() - start)
            elif ticket in self._line:
                self._line.remove(ticket)
                self._kinds.pop(ticket, None)

    def _mean(self, kind: str) -> float | None:
        d = self._durations.get(kind) or [x for v in self._durations.values() for x in v]  # none of its kind yet
        return sum(d) / len(d) if d else None

    def waiting(self, ticket: int) -> tuple[int, float | None]:
        """(decodes ahead of this ticket, estimated seconds until it gets a slot): each running decode is expected to
        take the mean measured hold of its kind; None before any hold was measured."""
        with self._lock:
            if ticket not in self._line:  # running (or gone): nothing to wait for
                return 0, 0.0
            ahead = self._line.index(ticket)
            now = time.monotonic()
            left = []
            for start, kind in self._running.values():
                mean = self._mean(kind)
                if mean is None:
                    return ahead + len(self._running), None
                left.append(max(0.0, mean - (now - start)))
            frees = sorted(left + [0.0] * (self.n - len(left)))  # a free slot frees now
            waiting = [self._mean(self._kinds[t]) for t in self._line[:ahead]]
            if any(w is None for w in waiting):
                return ahead + len(self._running), None
            # the ones ahead in line take the slots as they free, each holding one for its kind's mean
            for w in waiting:
                frees = sorted(frees[1:] + [frees[0] + w])
            return ahead + len(self._running), frees[0]

    def note(self, ticket: int) -> str:
        """The waiting visitor's status line."""
        ahead, eta = self.waiting(ticket)
        n = sum(len(v) for v in self._durations.values())
        when = f"about {eta:.0f}s (measured from the last {n} decodes here)" if eta is not None \
            else "no decode measured on this server yet"
        return f"… waiting for a free decoding slot: {ahead} decode(s) ahead, {when} — ■ Cancel leaves the line"
