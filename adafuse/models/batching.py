"""Many decodes at once: each local model's forwards from every live decode, gathered into one packed forward.

Every forward a view of a local model needs (a prefill chunk, one token of a confident span, exploration rows, scoring
rows, speculative drafts) is a `Request`: rows of equal length fed after a cache of their own. A model's `Batcher`
runs the requests that are waiting at the same moment as one forward: their tokens side by side in one sequence (no
padding), each token at its own position, and attention computed per request against that request's own cache (the
same shapes, masks and kernel as a request alone); only the layers that see one token at a time (projections, MLP,
output layer) run once over all of them, which is where one forward per decode left the hardware idle.

When does a batch start? Each decode has a `Rider`, working while it computes a step and waiting while one of its
forwards is queued or running. A batch starts when no rider that uses this model is working (every live decode has
asked for its next forward or waits on another model), or when the oldest request has waited GATHER_SECONDS (a decode
busy elsewhere never holds the others back for longer). Decodes join and leave whenever they start and end: a batch
is whatever is waiting, not a lock-step group. A request alone runs at once, in its caller's thread, through the same
code (so one decode computes the same numbers alone as in company, up to the last bits of the shared layers).

Caps (`max_rows`, `max_tokens`) bound one forward: requests past them wait for the next one (back-pressure; a request
larger than the caps runs alone). A forward that fails (out of memory, a bad row) may have written some layers' keys
and values into the requests' caches: every cache is put back as it was before that forward (`packed.restore`), then
the requests are retried one by one, so one decode's error never reaches the others (a cache that cannot be put back
fails its request with `ForwardError` instead of going on from a corrupted one). A request whose waiting thread is
interrupted leaves the queue.

The riders, the batchers' queues and their states share one condition (`_GATE`): a rider that starts waiting at one
model may be what another model's batcher is waiting for.
"""
from __future__ import annotations

import contextvars
import os
import functools
import threading
import time
import weakref
from contextlib import contextmanager

import torch

from ..errors import ForwardError
from .packed import (PACKED, Request, _device, cache_state, packed_forward, restore,  # noqa: F401 (re-exported)
                     use_packed_attention)

# Longest a request waits for decodes still working before its batch starts anyway.
GATHER_SECONDS = 0.05
# Default caps on one packed forward: rows (requests' rows) and token positions.
MAX_ROWS = 256
MAX_TOKENS = 8192

_GATE = threading.Condition()
_RIDER: contextvars.ContextVar["Rider | None"] = contextvars.ContextVar("adafuse_rider", default=None)


class Rider:
    """One decode's presence at the batchers of the models it uses. `working()` marks the span of a step (the
    batchers wait for a working rider's next request); a rider not inside one is idle and never waited for (a decode
    a page keeps between Step presses, a finished one)."""

    def __init__(self):
        self.working_depth = 0
        self.waiting = 0

    @contextmanager
    def working(self):
        """The decode computes: its forwards carry this rider, and batchers expect its requests."""
        token = _RIDER.set(self)
        with _GATE:
            self.working_depth += 1
        try:
            yield self
        finally:
            with _GATE:
                self.working_depth -= 1
                _GATE.notify_all()
            _RIDER.reset(token)

    @property
    def expected(self) -> bool:
        """Working and not waiting for a forward: its next request may come any moment (read under _GATE)."""
        return self.working_depth > 0 and self.waiting == 0


def working(method):
    """A method of an object with a `rider` that computes: the rider is working meanwhile (the models' batchers wait
    for its forwards to share theirs with it)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self.rider.working():
            return method(self, *args, **kwargs)
    return call


def current_rider() -> Rider | None:
    return _RIDER.get()


@contextmanager
def waiting_elsewhere():
    """The current decode waits on something other than a forward (another decode's prefill of the same prompt
    prefix): the batchers do not wait for its requests meanwhile (as while its own forward is queued, `forward`)."""
    rider = current_rider()
    if rider is None:
        yield
        return
    with _GATE:
        rider.waiting += 1
        _GATE.notify_all()
    try:
        yield
    finally:
        with _GATE:
            rider.waiting -= 1
            _GATE.notify_all()


class Batcher:
    """The forwards of one local model: `forward` queues a request and returns when a forward has run it."""

    def __init__(self, model: torch.nn.Module, max_rows: int = MAX_ROWS, max_tokens: int = MAX_TOKENS,
                 attention: str = "auto"):
        self.model = model
        self.attention = attention  # packed.ATTENTION_MODES: how a packed forward's attention runs
        self.max_rows, self.max_tokens = max_rows, max_tokens
        self.packed = use_packed_attention(model)  # False: a model that cannot pack runs its requests one by one
        self.queue: list[Request] = []
        self.running = False
        self.free_since = 0.0  # when the last forward ended
        self.riders: weakref.WeakSet[Rider] = weakref.WeakSet()  # riders that sent a request here
        # what it did: forwards run, requests served, the most requests and positions one forward carried
        self.forwards = self.requests = self.peak_requests = self.peak_positions = 0

    def expect(self, rider: Rider) -> None:
        """A decode starting now will send requests here: its first forward is waited for like its later ones (four
        prefills that start together run as one forward, not one alone and three packed)."""
        with _GATE:
            self.riders.add(rider)

    def forward(self, rows: list[list[int]], cache, keep: int | None = None) -> Request:
        """Feed `rows` (equal lengths) after `cache`'s positions, in a forward with whatever else waits; returns the
        served request (its `logprobs`, `seconds`, `riders`), or raises the error its forward raised."""
        assert rows and all(len(r) == len(rows[0]) for r in rows) and rows[0], "rows of equal, non-zero length"
        req = Request([list(r) for r in rows], cache, keep, current_rider())
        with _GATE:
            if req.rider is not None:
                self.riders.add(req.rider)
                req.rider.waiting += 1
            self.queue.append(req)
            _GATE.notify_all()
        try:
            while True:
                with _GATE:
                    while not req.done and (self.running or not self._ready()):
                        _GATE.wait(self._wait_left())
                    if req.done:
                        break
                    batch = self._take()
                    self.running = True
                try:
                    self._run(batch)
                finally:
                    with _GATE:
                        self.running = False
                        self.free_since = time.monotonic()
                        for r in batch:
                            r.done = True
                        _GATE.notify_all()
        finally:
            with _GATE:
                if not req.done and req in self.queue:  # the waiting thread was interrupted: no forward runs it now
                    self.queue.remove(req)
                if req.rider is not None:
                    req.rider.waiting -= 1
                _GATE.notify_all()
        if req.error is not None:
            raise req.error
        return req

    # ---- scheduling (under _GATE) ----
    def _waited(self) -> float:
        """How long the oldest request has waited for others since the model was free (not behind a forward)."""
        return time.monotonic() - max(self.queue[0].since, self.free_since)

    def _ready(self) -> bool:
        if not self.queue:
            return False
        if self._waited() >= GATHER_SECONDS:
            return True
        return not any(r.expected for r in self.riders)

    def _wait_left(self) -> float:
        if not self.queue:
            return GATHER_SECONDS
        return max(0.001, GATHER_SECONDS - self._waited())

    def _take(self) -> list[Request]:
        """The queued requests, oldest first, as many as the caps allow (at least one)."""
        batch, rows, positions = [], 0, 0
        for r in self.queue:
            if batch and (rows + len(r.rows) > self.max_rows or positions + r.positions > self.max_tokens):
                break
            batch.append(r)
            rows, positions = rows + len(r.rows), positions + r.positions
        del self.queue[: len(batch)]
        return batch

    # ---- running (outside _GATE) ----
    def _run(self, batch: list[Request]) -> None:
        states = [cache_state(r.cache) for r in batch]
        try:
            self._forward(batch)
        except BaseException as exc:  # noqa: BLE001 - each request gets its own answer below
            for r, state in zip(batch, states):  # as before the forward: no layer holds part of it
                if state is not None:
                    restore(r.cache, state)
            if len(batch) == 1:
                batch[0].error = exc
                return
            for r, state in zip(batch, states):  # one request's trouble (memory, a bad row) must not fail the others
                if state is None:
                    r.error = ForwardError(f"a forward shared with other decodes failed ({type(exc).__name__}: "
                                           f"{exc}) and this decode's cache cannot be restored (it is written in "
                                           "place): start the decode again")
                    continue
                try:
                    self._forward([r])
                except BaseException as one:  # noqa: BLE001 - raised in that request's own thread
                    restore(r.cache, state)
                    r.error = one

    @torch.inference_mode()
    def _forward(self, batch: list[Request]) -> None:
        if self.packed and getattr(self.model.config, "_attn_implementation", None) != PACKED:
            self.packed = use_packed_attention(self.model)  # someone switched the model's attention since
        with _full_threads(), _turn(self.model):
            t0 = time.perf_counter()
            if self.packed:
                outs = packed_forward(self.model, batch, self.attention)
            else:
                outs = [torch.log_softmax(_plain_forward(self.model, r).float(), dim=-1) for r in batch]
            if outs and outs[0].device.type == "cuda":
                torch.cuda.current_stream(outs[0].device).synchronize()
            seconds = time.perf_counter() - t0
        total = sum(r.positions for r in batch)
        decodes = len({id(r.rider) if r.rider is not None else id(r) for r in batch})
        for r, logprobs in zip(batch, outs):
            r.logprobs, r.seconds, r.riders = logprobs, seconds * r.positions / total, decodes
        self.forwards += 1
        self.requests += len(batch)
        self.peak_requests = max(self.peak_requests, len(batch))
        self.peak_positions = max(self.peak_positions, total)


_CPU_TURN = threading.Lock()
_LEAN = threading.local()


def lean_thread() -> None:
    """Make this thread (one of many decodes' threads) compute its own small tensor work on one CPU thread: many
    threads each starting a team of CPU threads for an argmax would crowd the cores a batched forward needs. A forward
    it leads still gets the budget the thread had (`_full_threads`)."""
    _LEAN.budget = torch.get_num_threads()
    torch.set_num_threads(1)


@contextmanager
def _full_threads():
    budget = getattr(_LEAN, "budget", None)
    if budget is None:
        yield
        return
    torch.set_num_threads(budget)
    try:
        yield
    finally:
        torch.set_num_threads(1)



@contextmanager
def _turn(model):
    """A forward that uses every core of this machine's CPU waits for another one that does (two models' batches at
    once would each run at half speed, and threads spinning on busy cores lose more); on a GPU, or with a thread budget
    of its own (models side by side, `parallel.Workers`), it goes at once."""
    if _device(model).type != "cpu" or torch.get_num_threads() < (os.cpu_count() or 1):
        yield
        return
    with _CPU_TURN:
        yield


def _plain_forward(model, r: Request) -> torch.Tensor:
    """One request as the model's own forward computes it (a model that cannot pack)."""
    ids = torch.tensor(r.rows, device=_device(model))
    kw = {"logits_to_keep": r.keep} if r.keep is not None else {}
    logits = model(input_ids=ids, past_key_values=r.cache, use_cache=True, **kw).logits
    return logits if r.keep is None else logits[:, -r.keep:]
