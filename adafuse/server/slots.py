"""Decodes of requests in worker threads: a bounded number in flight, a bounded queue, cancellation between rounds."""
from __future__ import annotations

import asyncio
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from ..decoder import Decoding
from ..many import check_concurrency
from ..models.lean import run_lean
from ..trace import StopReason


class Overloaded(Exception):
    """Every slot is taken and the queue is full: the client should come back after `retry_after` seconds."""

    def __init__(self, retry_after: int):
        super().__init__(f"retry after {retry_after} s")
        self.retry_after = retry_after


class Run:
    """One request's decode, run by a worker thread. What happens reaches the event loop as events in `events`:
    ("started", Decoding), ("round", (Round, the output so far)) for each committed round, then ("end", Trace) or
    ("error", exception); or ("cancelled", None) alone when it was cancelled before it started. `cancel()` (a client
    gone, the server stopping) stops the decode before its next round; so does its `timeout` (seconds from its start,
    None: none), the trace then ending with the stop reason "deadline"."""

    def __init__(self, start: Callable[[], Decoding], loop: asyncio.AbstractEventLoop, timeout: float | None = None):
        self.start, self.loop, self.timeout = start, loop, timeout
        self.events: asyncio.Queue[tuple[str, object]] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.finished = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()

    def __call__(self) -> None:
        try:
            if self.cancelled.is_set():  # the server stopped while the request waited for a slot
                self._send("cancelled", None)
                return
            deadline = None if self.timeout is None else time.monotonic() + self.timeout
            d = self.start()
            self._send("started", d)
            while not d.done:
                if self.cancelled.is_set():
                    d.cancel()  # between rounds: the decode lets go of its models' caches and workers
                    break
                if deadline is not None and time.monotonic() > deadline:
                    d.cancel(StopReason.DEADLINE)
                    break
                r = d.step()
                self._send("round", (r, d.trace.output))  # the output as of this round: the next one changes it
            self._send("end", d.trace)
        except Exception as exc:  # the event loop turns it into an error object; the decode has closed itself
            self._send("error", exc)
        finally:
            self.finished.set()

    def _send(self, kind: str, value: object) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop has closed (the server stopped): nobody reads on, so stop
            self.cancelled.set()

    async def next(self) -> tuple[str, object]:
        return await self.events.get()


class DecodeSlots:
    """Up to `concurrency` decodes at once, each in a worker thread of its own (decodes in different threads share
    each model's forwards, models/batching.py), and up to `queue` more waiting for a thread; past that `submit`
    refuses at once, with a retry time from the decodes' recent durations."""

    def __init__(self, concurrency: int, queue: int):
        self.concurrency = check_concurrency(concurrency)
        if isinstance(queue, bool) or not isinstance(queue, int) or queue < 0:
            raise ValueError(f"queue={queue!r} is invalid: give how many requests may wait for a slot (0 or more)")
        self.limit = concurrency + queue
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="adafuse-serve")
        self._lock = threading.Lock()
        self._taken = 0          # requests admitted and not finished (running or waiting)
        self._running = 0
        self._seconds = 10.0     # a decode's seconds, a running mean (a guess until the first ends)
        self._runs: set[Run] = set()

    def submit(self, run: Run) -> Future:
        """Start `run` when a thread is free; raises Overloaded when slots and queue are full."""
        with self._lock:
            if self._taken >= self.limit:
                raise Overloaded(self._retry_after())
            self._taken += 1
            self._runs.add(run)
        try:
            return self._pool.submit(run_lean, self._work, run)  # lean: the forwards get the cores
        except RuntimeError:  # the pool has shut down: the server is stopping
            self._done(run)
            raise Overloaded(self._retry_after()) from None

    def _work(self, run: Run) -> None:
        t0 = time.monotonic()
        with self._lock:
            self._running += 1
        try:
            run()
        finally:
            with self._lock:
                self._running -= 1
                self._seconds = 0.7 * self._seconds + 0.3 * (time.monotonic() - t0)
            self._done(run)

    def _done(self, run: Run) -> None:
        with self._lock:
            self._taken -= 1
            self._runs.discard(run)

    def _retry_after(self) -> int:
        # when the queue ahead has drained at `concurrency` decodes at a time (called with the lock held)
        waves = max(1, math.ceil((self._taken - self.concurrency + 1) / self.concurrency))
        return max(1, math.ceil(self._seconds * waves))

    def counts(self) -> dict[str, int]:
        """Decodes running and waiting now, and how many may."""
        with self._lock:
            return {"running": self._running, "waiting": self._taken - self._running, "concurrency": self.concurrency,
                    "queue": self.limit - self.concurrency}

    def close(self) -> None:
        """The server stops: the running decodes stop before their next round, and the waiting ones say they were
        cancelled without starting (their requests get a 503)."""
        with self._lock:
            runs = list(self._runs)
        for run in runs:
            run.cancel()
        self._pool.shutdown(wait=False)

