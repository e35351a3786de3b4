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
larger than the caps runs alone). A forward that fails (out of memory, a bad row) may have written some layers' keys and
values into the requests' caches: every cache is put back as it was before that forward (`packed.restore`) and the
failed forward's tensors are let go (its traceback dropped, kept as text), then the requests are retried one by one, so
one decode's error never reaches the others (a cache that cannot be put back fails its request with `ForwardError`
instead of going on from a corrupted one). A forward stopped by something that is not an `Exception` (Ctrl-C,
SystemExit) is not retried: it is raised in the thread that led the forward, and the other requests go back to the front
of the queue with their caches put back (the next forward runs them). A request whose waiting thread is interrupted
leaves the queue. Each request's log-probs are its own tensor, not a view into the forward's block (what a decode keeps
of them holds no other decode's rows). On CUDA every forward of a model runs on that model's one stream
(`Batcher.stream`), whichever decode's thread leads it, and is synchronized before its results are handed back.

What the models of one `ModelRegistry` share while decodes run is its `Runtime`: the lock its batchers queue
under, the CPU's turn (two forwards that each use every core go one after the other) and the batchers' settings. A
decode's `Rider` is its own (a lock for its counters) and wakes the batchers of every model it uses, whichever runtime
they belong to. Nothing here is module-level state: two registries in one process share nothing but the cores; the
current decode's rider and a thread's lean budget are context variables (each thread and context sees its own).
"""
from __future__ import annotations

import contextvars
import os
import functools
import threading
import time
import traceback
import weakref
from contextlib import contextmanager

import torch

from ..errors import ForwardError
from .lean import full_threads
from .packed import (PACKED, Request, _device, cache_state, packed_forward, restore,  # noqa: F401 (re-exported)
                     use_packed_attention)

# Longest a request waits for decodes still working before its batch starts anyway.
GATHER_SECONDS = 0.05
# Default caps on one packed forward: rows (requests' rows) and token positions.
MAX_ROWS = 256
MAX_TOKENS = 8192

# The decode computing in this context (Python's rule: context variables are made once, at module level; each
# context holds its own value)
_RIDER: contextvars.ContextVar["Rider | None"] = contextvars.ContextVar("adafuse_rider", default=None)


class Runtime:
    """What the models of one registry share while they compute: `gate`, the lock their batchers' queues and states
    are read and changed under (a queued request's thread sleeps on a condition of its own on it, `waiter`);
    `cpu_turn`, held by a forward that uses every core of this machine's CPU; and the settings of the batchers it
    makes (`gather_seconds`, `max_rows`, `max_tokens`, `attention`: see the module doc); `probes`, what the
    side-by-side probe measured of its models. `ModelRegistry` makes one and gives it to every model it loads; a model
    made by hand has one of its own."""

    def __init__(self, gather_seconds: float = GATHER_SECONDS, max_rows: int = MAX_ROWS,
                 max_tokens: int = MAX_TOKENS, attention: str = "auto"):
        self.gate = threading.RLock()
        self.cpu_turn = threading.Lock()
        self.gather_seconds, self.max_rows, self.max_tokens = gather_seconds, max_rows, max_tokens
        self.attention = attention  # packed.ATTENTION_MODES: how a packed forward's attention runs
        self.probes: dict = {}  # the side-by-side probe's seconds, per set of models (parallel.py)

    def waiter(self) -> threading.Condition:
        """The condition a queued request's thread sleeps on: woken alone (when its request is served, or when it is
        the oldest and a batch may start), not with every decode's thread."""
        return threading.Condition(self.gate)

    def batcher(self, model: torch.nn.Module) -> "Batcher":
        return Batcher(model, self)

    @contextmanager
    def turn(self, model):
        """A forward that uses every core of this machine's CPU waits for another one that does (two models' batches
        at once would each run at half speed, and threads spinning on busy cores lose more); on a GPU, or with a thread
        budget of its own (models side by side, `parallel.Workers`), it goes at once."""
        if _device(model).type != "cpu" or torch.get_num_threads() < (os.cpu_count() or 1):
            yield
            return
        with self.cpu_turn:
            yield


class Rider:
    """One decode's presence at the batchers of the models it uses. `working()` marks the span of a step (the
    batchers wait for a working rider's next request); a rider not inside one is idle and never waited for (a decode
    a page keeps between Step presses, a finished one). Its counters change under its own lock; each change then wakes
    the batchers it has joined (the thread at the head of each one's queue), never while holding one of them."""

    def __init__(self):
        self.working_depth = 0
        self.waiting = 0
        self._lock = threading.Lock()
        self._batchers: list[Batcher] = []

    def join(self, batcher: "Batcher") -> None:
        """`batcher` may wait for this rider: its changes wake that batcher too."""
        with self._lock:
            if not any(b is batcher for b in self._batchers):
                self._batchers.append(batcher)

    def change(self, working: int = 0, waiting: int = 0) -> None:
        with self._lock:
            self.working_depth += working
            self.waiting += waiting
            batchers = list(self._batchers)
        for b in batchers:  # after the change: a batcher that read the old value is waiting by now, and wakes
            with b.gate:
                b.wake_head()

    @contextmanager
    def working(self):
        """The decode computes: its forwards carry this rider, and batchers expect its requests."""
        token = _RIDER.set(self)
        self.change(working=1)
        try:
            yield self
        finally:
            self.change(working=-1)
            _RIDER.reset(token)

    @contextmanager
    def waiting_for(self):
        """A forward of this decode is queued or running, or it waits on something else: not expected meanwhile."""
        self.change(waiting=1)
        try:
            yield
        finally:
            self.change(waiting=-1)

    @property
    def expected(self) -> bool:
        """Working and not waiting for a forward: its next request may come any moment."""
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
    with rider.waiting_for():
        yield


class Batcher:
    """The forwards of one local model: `forward` queues a request and returns when a forward has run it. Its queue and
    state are read and changed under its runtime's `gate`; its caps and attention mode start as the runtime's."""

    def __init__(self, model: torch.nn.Module, runtime: Runtime | None = None, *, max_rows: int | None = None,
                 max_tokens: int | None = None, attention: str | None = None):
        self.model = model
        self.runtime = runtime = runtime or Runtime()
        self.gate = runtime.gate
        self.attention = attention or runtime.attention  # packed.ATTENTION_MODES: how a packed forward's attention runs
        self.max_rows, self.max_tokens = max_rows or runtime.max_rows, max_tokens or runtime.max_tokens
        self.packed = use_packed_attention(model)  # False: a model that cannot pack runs its requests one by one
        self.device = _device(model)
        self._stream = None  # `stream`, made at its first use
        self.queue: list[Request] = []
        self.running = False
        self.free_since = 0.0  # when the last forward ended
        self.riders: weakref.WeakSet[Rider] = weakref.WeakSet()  # riders that sent a request here
        # what it did: forwards run, requests served, the most requests and positions one forward carried
        self.forwards = self.requests = self.peak_requests = self.peak_positions = 0

    @property
    def stream(self):
        """The CUDA stream every forward of this model runs on, whichever decode's thread leads it (None off CUDA): made
        once per model, so every cache tensor its forwards write is allocated and freed on one stream (no
        `record_stream` needed); `parallel.Workers` runs this model's phases on it too."""
        if self._stream is None and self.device.type == "cuda":
            with self.gate:
                if self._stream is None:
                    self._stream = torch.cuda.Stream(self.device)
        return self._stream

    def expect(self, rider: Rider) -> None:
        """A decode starting now will send requests here: its first forward is waited for like its later ones (four
        prefills that start together run as one forward, not one alone and three packed)."""
        rider.join(self)
        with self.gate:
            self.riders.add(rider)

    def forward(self, rows: list[list[int]], cache, keep: int | None = None) -> Request:
        """Feed `rows` (equal lengths) after `cache`'s positions, in a forward with whatever else waits; returns the
        served request (its `logprobs`, `seconds`, `riders`), or raises the error its forward raised."""
        assert rows and all(len(r) == len(rows[0]) for r in rows) and rows[0], "rows of equal, non-zero length"
        req = Request([list(r) for r in rows], cache, keep, current_rider())
        rider, gate, stream = req.rider, self.gate, self.stream
        if rider is not None:
            self.expect(rider)
        if stream is not None and torch.cuda.current_stream(self.device) != stream:
            stream.wait_stream(torch.cuda.current_stream(self.device))  # what this thread queued (a cache copy) first
        req.wake = self.runtime.waiter()
        with gate:
            self.queue.append(req)
        if rider is not None:  # queued first: no batch starts between this rider's last step and its request
            rider.change(waiting=1)
        try:
            while True:
                with gate:
                    while not req.done and (self.running or not self._ready()):
                        req.wake.wait(self._wait_left() if self.queue and self.queue[0] is req else None)
                    if req.done:
                        break
                    batch = self._take()
                    self.running = True
                ran = False
                try:
                    self._run(batch)
                    ran = True
                finally:
                    with gate:
                        self.running = False
                        self.free_since = time.monotonic()
                        if not ran and req in self.queue:  # this thread stops (`_run` raised): its request with it
                            self.queue.remove(req)
                        queued = {id(r) for r in self.queue}  # put back by a forward that was stopped (`_run`)
                        for r in batch:
                            r.done = id(r) not in queued
                            r.wake.notify()
                        self.wake_head()
        finally:
            with gate:
                if not req.done and req in self.queue:  # the waiting thread was interrupted: no forward runs it now
                    self.queue.remove(req)
                self.wake_head()
            if rider is not None:
                rider.change(waiting=-1)
        if req.error is not None:
            raise req.error
        return req

    # ---- scheduling (under the gate) ----
    def _waited(self) -> float:
        """How long the oldest request has waited for others since the model was free (not behind a forward)."""
        return time.monotonic() - max(self.queue[0].since, self.free_since)

    def _ready(self) -> bool:
        if not self.queue:
            return False
        if self._waited() >= self.runtime.gather_seconds:
            return True
        return not any(r.expected for r in self.riders)

    def wake_head(self) -> None:
        """Wake the thread of the oldest queued request, which decides when the next batch starts (under the gate; a
        thread whose request is behind it sleeps until its request is served or it is the oldest: with N decodes
        waiting, a change costs one wake-up, not N)."""
        if self.queue and not self.running:
            self.queue[0].wake.notify()

    def _wait_left(self) -> float | None:
        """How long the oldest request's thread sleeps unless woken (as it is when a forward ends or a rider changes):
        until its gather deadline; while a forward runs or nothing waits, until woken."""
        if self.running or not self.queue:
            return None
        return max(0.0, self.runtime.gather_seconds - self._waited())

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

    # ---- running (outside the gate) ----
    def _run(self, batch: list[Request]) -> None:
        """Run `batch` as one forward; on a failure, every cache back as it was and each request retried alone (its own
        error, or what it gets alone). Raises what is not an `Exception` (Ctrl-C, SystemExit) in this thread, not
        retried, once the caches are put back and the requests re-queued."""
        states = [cache_state(r.cache) for r in batch]
        failure = self._attempt(batch, states)
        if failure is None:
            return
        if len(batch) == 1:
            batch[0].error = failure
            return
        for i, (r, state) in enumerate(zip(batch, states)):  # one request's trouble (memory, a bad row) fails it alone
            if state is None:
                r.error = ForwardError(f"a forward shared with other decodes failed ({type(failure).__name__}: "
                                       f"{failure}) and this decode's cache cannot be restored (it is written in "
                                       "place): start the decode again")
                continue
            r.error = self._attempt([r], [state], later=batch[i + 1:], later_states=states[i + 1:])

    def _attempt(self, batch: list[Request], states: list, later: list[Request] = (),
                 later_states: list = ()) -> Exception | None:
        """One forward of `batch`; None when it ran, else its error, once the forward is let go (its traceback
        dropped: the tensors its frames held are freed before anything is retried) and every cache put back. An
        interruption (not an `Exception`) re-queues `batch` and `later` (those whose caches can be put back; the
        others fail with `ForwardError`) and is raised here."""
        stop = error = None
        try:
            self._forward(batch)
            return None
        except Exception as exc:  # noqa: BLE001 - the request's own answer (`_run`)
            error = exc
        except BaseException as exc:  # Ctrl-C, SystemExit: this thread stops, nothing is retried
            stop = exc
        _let_go(stop or error)  # out of the except block, its traceback dropped: nothing holds the forward's tensors
        for r, state in zip(batch, states):  # as before the forward: no layer holds part of it
            if state is not None:
                restore(r.cache, state)
        if stop is None:
            return error
        back = []
        for r, state in zip([*batch, *later], [*states, *later_states]):
            if state is None:
                r.error = ForwardError(f"a forward shared with other decodes was stopped ({type(stop).__name__}) and "
                                       "this decode's cache cannot be restored (it is written in place): start the "
                                       "decode again")
            else:
                back.append(r)
        with self.gate:
            self.queue[:0] = back  # first again: the next forward runs them
        raise stop

    @torch.inference_mode()
    def _forward(self, batch: list[Request]) -> None:
        if self.packed and getattr(self.model.config, "_attn_implementation", None) != PACKED:
            self.packed = use_packed_attention(self.model)  # someone switched the model's attention since
        stream = self.stream
        with full_threads(), self.runtime.turn(self.model), _on_stream(stream, self.device):
            t0 = time.perf_counter()
            if self.packed:
                outs = packed_forward(self.model, batch, self.attention)
            else:
                outs = [torch.log_softmax(_plain_forward(self.model, r).float(), dim=-1) for r in batch]
            _synchronize(stream, outs)  # the results complete before they are handed back (and the seconds true)
            seconds = time.perf_counter() - t0
        total = sum(r.positions for r in batch)
        decodes = len({id(r.rider) if r.rider is not None else id(r) for r in batch})
        for r, logprobs in zip(batch, outs):
            r.logprobs, r.seconds, r.riders = logprobs, seconds * r.positions / total, decodes
        self.forwards += 1
        self.requests += len(batch)
        self.peak_requests = max(self.peak_requests, len(batch))
        self.peak_positions = max(self.peak_positions, total)


def _let_go(exc: BaseException) -> None:
    """Drop the traceback of `exc` (and of the exceptions it chains to), kept as text in a note: its frames hold the
    failed forward's tensors (activations, its packed cache; clearing their locals is not enough, a frame keeps its
    function's closure), which are freed now, not when the error is."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            exc.add_note("where it was raised (the frames let go):\n" + "".join(traceback.format_tb(exc.__traceback__)))
            exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def _synchronize(stream, outs: list[torch.Tensor]) -> None:
    """Wait for the model's stream (and, for a model spread over GPUs, the current stream where its outputs are)."""
    if stream is not None:
        stream.synchronize()
    if outs and outs[0].device.type == "cuda":
        torch.cuda.current_stream(outs[0].device).synchronize()


@contextmanager
def _on_stream(stream, device):
    """CUDA work queued meanwhile goes to `stream` on `device` (nothing changes where `stream` is None)."""
    if stream is None:
        yield
        return
    with torch.cuda.device(device), torch.cuda.stream(stream):
        yield


def _plain_forward(model, r: Request) -> torch.Tensor:
    """One request as the model's own forward computes it (a model that cannot pack)."""
    ids = torch.tensor(r.rows, device=_device(model))
    kw = {"logits_to_keep": r.keep} if r.keep is not None else {}
    logits = model(input_ids=ids, past_key_values=r.cache, use_cache=True, **kw).logits
    return logits if r.keep is None else logits[:, -r.keep:]
