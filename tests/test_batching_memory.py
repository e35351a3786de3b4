"""What the batcher holds and how it waits (adafuse/models/batching.py): a request's log-probs are its own tensor, not a
view that keeps the whole packed forward's block alive; threads queued behind a forward sleep until it ends instead of
polling; every forward of a model runs on that model's one CUDA stream (checked on the CPU with a stand-in for torch's
CUDA stream API: what a GPU run must confirm is in docs/models-and-devices.md)."""
from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace

import pytest
import torch

from adafuse.models.batching import Batcher, Rider, Runtime, packed_forward
from adafuse.models.session import LocalSession
from adafuse.parallel import Workers
from tests.test_batching import prefilled, tiny
from tests.test_faults import _cases, _request, queued as wait_queued, tiny_local, until

pytestmark = pytest.mark.unit


def _own_size(t: torch.Tensor) -> bool:
    """`t` is the whole of its storage (no other rows kept alive with it)."""
    return t.untyped_storage().nbytes() == t.numel() * t.element_size()


@contextmanager
def _held(b: Batcher, queued: int):
    """A forward is under way on `b` while the block runs: requests queue behind it; on leaving, once `queued` requests
    wait, it ends and they run as one packed forward."""
    with b.gate:
        b.running = True
    try:
        yield
        wait_queued(b, queued)
    finally:
        with b.gate:
            b.running = False
            b.wake_head()


def test_each_request_of_a_packed_forward_gets_log_probs_of_its_own():
    """A packed forward of 4 requests (one row, several rows, several positions kept): each request's log-probs are a
    tensor of their own, its rows of the forward (one log-softmax per request). Before: views, each keeping the whole
    block (the 4 requests' 8 rows of 64 floats, 2 KB, for a request of one row, 256 bytes), later copies of it."""
    model = tiny("llama")
    b = Batcher(model)
    with torch.inference_mode():  # as the packed forward gives them
        views = packed_forward(model, [_request(model, *c) for c in _cases()])
    assert sum(v.numel() for v in views) == 8 * 64 and all(_own_size(v) for v in views)
    reqs = [_request(model, *c) for c in _cases()]
    b._run(reqs)
    for r, view in zip(reqs, views):
        assert r.error is None and torch.equal(r.logprobs, view)
        assert _own_size(r.logprobs), (r.logprobs.shape, r.logprobs.untyped_storage().nbytes())


def test_what_sessions_keep_after_a_shared_prefill_holds_no_other_decodes_rows():
    """Four views' prefills run as one packed forward; the next-token log-probs each view keeps for the next round
    (`end_logprobs`, `next_logprobs`) take their own (V,) floats, not the block of all four (4 × V: a 4 KB row kept a
    3.2 MB block on a real model)."""
    lm = tiny_local("llama")
    b = lm.batcher
    prompts = [" a b", " c", " d e f", " g"]
    views: dict[int, LocalSession] = {}
    forwards = b.forwards

    def open_view(i):
        views[i] = LocalSession(lm, prompts[i])
    threads = [threading.Thread(target=open_view, args=(i,)) for i in range(4)]
    with _held(b, 4):
        for t in threads:
            t.start()
    for t in threads:
        t.join(60)
    assert len(views) == 4 and b.forwards == forwards + 1 and b.peak_requests == 4  # one forward carried all four
    for v in views.values():
        for kept in (v.end_logprobs, v.next_logprobs):
            assert kept.shape == (lm.vocab_size,) and _own_size(kept), kept.untyped_storage().nbytes()


class CountingWaits:
    """The conditions a runtime's queued requests sleep on (`Runtime.waiter`, on the runtime's gate), each counting
    its thread's waits (each wait is one sleep and one wake-up); `began` is set as a thread starts one."""

    def __init__(self, runtime: Runtime):
        self.gate, self.waits, self.began = runtime.gate, {}, threading.Event()

    def __call__(self) -> threading.Condition:
        return _Counting(self)


class _Counting(threading.Condition):
    def __init__(self, counts: CountingWaits):
        super().__init__(counts.gate)
        self.counts = counts

    def wait(self, timeout=None):
        self.counts.waits.setdefault(threading.get_ident(), []).append(timeout)
        self.counts.began.set()
        return super().wait(timeout)


class SlowModel(torch.nn.Module):
    """A model stand-in (it cannot pack: its batcher runs its requests one by one) whose first forward takes
    `seconds` once `queued` is set: a slow forward with another request waiting behind it."""

    def __init__(self, seconds: float):
        super().__init__()
        self.emb = torch.nn.Embedding(8, 2)
        self.seconds, self.entered, self.queued, self.release = seconds, threading.Event(), threading.Event(), \
            threading.Event()

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        if not self.entered.is_set():
            self.entered.set()
            self.queued.wait(30)
            self.release.wait(self.seconds)  # the forward's own time (nothing sets it: a slow forward)
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, 8))


def test_a_request_queued_behind_a_running_forward_sleeps_until_it_ends():
    """One thread's forward runs for 0.2 s while another thread's request waits behind it: the waiting thread sleeps
    until the forward ends (woken by its request's condition), a handful of waits in all. Before: once the gather
    window had passed it polled every millisecond (about 150 wake-ups in those 0.2 s; 780 in 0.9 s in a decode)."""
    runtime = Runtime(gather_seconds=0.01)
    runtime.waiter = counts = CountingWaits(runtime)
    model = SlowModel(0.2)
    b = Batcher(model, runtime)
    assert not b.packed
    got, who = {}, {}

    def run(name):
        who[name] = threading.get_ident()
        got[name] = b.forward([[1]], None)
    first = threading.Thread(target=run, args=("first",))
    first.start()
    assert model.entered.wait(30)  # the first forward runs
    counts.began.clear()
    second = threading.Thread(target=run, args=("second",))
    second.start()
    assert counts.began.wait(30) and len(b.queue) == 1  # the second request waits behind it
    model.queued.set()
    first.join(30)
    second.join(30)
    assert set(got) == {"first", "second"}
    waits = counts.waits.get(who["second"], [])
    assert 1 <= len(waits) <= 5, (len(waits), waits[:10])
    assert waits[0] is None  # while the forward ran: no timeout, woken when it ended


def test_a_change_of_a_decode_wakes_the_oldest_request_not_every_waiting_one():
    """Eight decodes' requests wait while another decode computes; that decode's state changes 10 times (each step
    and each forward of a decode is such a change): only the oldest request's thread wakes to check whether the batch
    may start, the seven behind it sleep until they are served, all eight in one forward. Before: every change woke
    every waiting thread (32 decodes in flight: a quarter of the time holding Python's lock went to waking them)."""
    runtime = Runtime(gather_seconds=30.0)  # only the decodes' changes start the batch
    runtime.waiter = counts = CountingWaits(runtime)
    model = tiny("llama")
    b = Batcher(model, runtime)
    busy = Rider()
    with busy.working():
        b.forward([[5]], prefilled(model, [6]))  # it is the batcher's: waited for while it works
    caches = [prefilled(model, [2, i + 3]) for i in range(8)]
    got, who = {}, {}

    def run(i):
        who[i] = threading.get_ident()
        got[i] = b.forward([[1]], caches[i])
    with busy.working():
        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        until(lambda: len(counts.waits) == 8)  # every thread sleeps (a wait is counted holding the gate)
        head = next(t for t, w in counts.waits.items() if w[0] is not None)  # the oldest: until its deadline
        for _ in range(5):
            slept = len(counts.waits[head])
            with busy.working():  # two changes (a step inside the step): it works all along
                pass
            until(lambda: len(counts.waits[head]) > slept)  # the oldest woke, checked and sleeps again
    for t in threads:  # it stops working: the batch starts
        t.join(30)
    assert sorted(got) == list(range(8)) and b.forwards == 2 and b.peak_requests == 8
    assert all(w == [None] for t, w in counts.waits.items() if t != head), counts.waits  # woken once: served


class FakeStream:
    """Stands in for `torch.cuda.Stream` on a machine without CUDA: records what is done with it."""
    made: list["FakeStream"] = []

    def __init__(self, device=None, name="made"):
        self.device, self.name, self.events = device, name, []
        if name == "made":
            FakeStream.made.append(self)

    def synchronize(self):
        self.events.append("synchronize")

    def wait_stream(self, other):
        self.events.append(("wait", other))


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch's CUDA stream calls replaced: `current_stream` is the thread's stream (set by `torch.cuda.stream`), or its
    own default one."""
    FakeStream.made = []
    local = threading.local()

    def current(device=None):
        if getattr(local, "stream", None) is None:
            local.default = getattr(local, "default", None) or FakeStream(device, "default")
            return local.default
        return local.stream

    @contextmanager
    def on(stream):
        before, local.stream = getattr(local, "stream", None), stream
        try:
            yield
        finally:
            local.stream = before
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "current_stream", current)
    monkeypatch.setattr(torch.cuda, "device", lambda d: nullcontext())
    return current


def test_every_forward_of_a_model_runs_on_its_one_stream(fake_cuda):
    """A model on "CUDA" (its batcher told so; the arithmetic runs on the CPU): forwards led by two threads, alone or
    packed with another decode's request, and the phases `parallel.Workers` runs for two decodes all run on the one
    stream made for that model; each forward waits for what the requesting thread queued first and is synchronized
    before its results are handed back. Before: the forward ran on whichever stream the leading thread had, and each
    decode's workers made their own stream (a new one per call)."""
    model = tiny("llama")
    b = Batcher(model)
    b.device = torch.device("cuda", 0)
    reqs = [_request(model, past, rows, None) for past, rows in (([1, 2], [[3]]), ([4], [[5, 6]]), ([7], [[8]]),
                                                                  ([9, 10], [[11]]))]
    seen, last = [], []
    hook = model.register_forward_pre_hook(lambda *_: seen.append(fake_cuda()))

    def forward(r):
        b.forward(r.rows, r.cache)
        last.append(b.stream.events[-1])  # when the results are handed back
    try:
        forward(reqs[0])  # in this thread
        t = threading.Thread(target=forward, args=(reqs[1],))
        t.start()
        t.join(30)
        threads = [threading.Thread(target=forward, args=(r,)) for r in reqs[2:]]
        with _held(b, 2):  # two requests in one packed forward, led by one of their threads
            for t in threads:
                t.start()
        for t in threads:
            t.join(30)
    finally:
        hook.remove()
    assert len(seen) == 3 and b.forwards == 3 and b.peak_requests == 2
    assert len(FakeStream.made) == 1 and all(s is b.stream for s in seen)
    assert last == ["synchronize"] * 4
    waited = [e[1] for e in b.stream.events if e != "synchronize"]
    assert len(waited) == 4 and all(s.name == "default" for s in waited)  # each requesting thread's own stream first

    class OnCuda:  # a loaded model on that GPU: what Workers needs of it
        device, batcher = torch.device("cuda", 0), b

    class Other:  # a model without a batcher on another GPU
        device = torch.device("cuda", 1)
    models = [OnCuda(), Other()]
    phases = []
    for parallel in (False, True, False):  # three decodes' workers, each phase called twice
        w = Workers(models, parallel=parallel)
        for _ in range(2):
            phases.append(w.map(lambda i: fake_cuda(), [0, 1]))
        w.close()
    assert all(p[0] is b.stream for p in phases)
    assert len({id(p[1]) for p in phases}) == 3  # the other model: one stream per decode's workers, not per call
    assert len(FakeStream.made) == 4
