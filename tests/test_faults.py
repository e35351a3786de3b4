"""Faults inside a shared forward stay where they happen (adafuse/models/batching.py): a packed forward that raises at
any layer or at the output head leaves every request's cache as it was, the request that caused it gets its error and
the others get what they get alone, once the failed forward's tensors are freed; an interrupt (Ctrl-C, SystemExit)
stops the thread that leads the forward and nothing is retried; a waiting thread that is interrupted leaves the queue;
decodes sharing forwards with one that fails give the traces they give alone (tiny random transformers, and the
bundled pair)."""
from __future__ import annotations

import copy
import gc
import random
import threading
import time
import weakref
from contextlib import contextmanager

import pytest
import torch

from adafuse import AdaFuse, DecodeConfig
from adafuse.errors import ForwardError
from adafuse.many import run_many
from adafuse.models.batching import Batcher, Request
from adafuse.models.packed import RUN
from tests.test_batching import prefilled, tiny

POISON = 63  # a token id the tests' fault fires on: the forward carrying it raises


class Injected(RuntimeError):
    pass


def _layers(model):
    return model.model.layers


@contextmanager
def fault(model, where: str, poison=POISON, every: int | None = None, seed: int = 0, scratch: int = 0):
    """Make `model`'s forward raise `Injected` at `where` ("first", "middle", "last" layer or "head") whenever its
    input holds `poison` (or, with `every`, on every `every`-th forward at a random layer, seeded). With `scratch`, the
    failing layer first makes a tensor of that many bytes (as a forward's activations are), and the state's "made"
    holds weak references to it and to the layer's output."""
    state = {"armed": False, "calls": 0, "at": None, "shared": 0, "fired": 0, "made": []}
    rng = random.Random(seed)
    n = len(_layers(model))

    def before(_module, args, _kwargs):
        ids = _kwargs.get("input_ids", args[0] if args else None)
        state["calls"] += 1
        if every is not None:  # count the forwards shared by several requests (the retries alone then succeed)
            run = _kwargs.get(RUN)
            shared = run is not None and len(run.segments) > 1
            state["shared"] += shared
            state["armed"] = shared and state["shared"] % every == 0
            state["fired"] += state["armed"]
            state["at"] = rng.randrange(n + 1)  # a layer, or n: the head
        else:
            state["armed"] = ids is not None and bool((ids == poison).any())
            state["at"] = {"first": 0, "middle": n // 2, "last": n - 1, "head": n}[where]

    def raiser(index):
        def hook(_module, _args, output):
            if state["armed"] and state["at"] == index:
                made = torch.ones(scratch // 4) if scratch else None
                if made is not None:
                    state["made"] = [weakref.ref(made), weakref.ref(output)]
                raise Injected(f"injected fault at {'the head' if index == n else f'layer {index}'}")
        return hook

    handles = [model.register_forward_pre_hook(before, with_kwargs=True)]
    handles += [layer.register_forward_hook(raiser(i)) for i, layer in enumerate(_layers(model))]
    handles.append(model.lm_head.register_forward_hook(raiser(n)))
    try:
        yield state
    finally:
        for h in handles:
            h.remove()


def _cases():
    """Four requests: cached pasts of different lengths (past the sliding window), one or several rows."""
    return [([5, 6, 7], [[8]], None), ([], [[1, 2, 3, 4, 5, 6]], 2), (list(range(10, 19)), [[20, 21], [22, 23]], None),
            (list(range(30, 36)), [[40, POISON]], 1)]


def _request(model, past, rows, keep):
    cache = prefilled(model, past)
    if past:
        cache.batch_repeat_interleave(len(rows))
    return Request(rows, cache, keep)


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["llama", "gemma-sliding"])
@pytest.mark.parametrize("where", ["first", "middle", "last", "head"])
def test_a_fault_in_a_packed_forward_harms_no_other_request(kind, where):
    """The 4th request carries the poison: the packed forward of all 4 raises at `where`. It gets its error and its
    cache as it was; the other 3 get the log-probs and caches they get alone."""
    model = tiny(kind)
    b = Batcher(model)
    assert b.packed
    clean = copy.deepcopy(model)
    alone = []
    for past, rows, keep in _cases()[:3]:
        r = _request(clean, past, rows, keep)
        Batcher(clean)._run([r])
        alone.append(r)
    reqs = [_request(clean, *c) for c in _cases()]
    before = reqs[3].cache.get_seq_length(), reqs[3].cache.layers[0].keys.clone()
    with fault(model, where) as state:
        b._run(reqs)
    assert state["calls"] >= 5  # the packed forward, then each request alone
    assert isinstance(reqs[3].error, Injected) and reqs[3].logprobs is None
    assert reqs[3].cache.get_seq_length() == before[0] and torch.equal(reqs[3].cache.layers[0].keys, before[1])
    for r, a in zip(reqs[:3], alone):
        assert r.error is None
        assert torch.equal(r.logprobs, a.logprobs), (r.logprobs - a.logprobs).abs().max()
        assert r.cache.get_seq_length() == a.cache.get_seq_length()
        for mine, theirs in zip(r.cache.layers, a.cache.layers):
            assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)


@pytest.mark.unit
def test_a_failed_shared_forward_is_let_go_before_any_retry():
    """The packed forward of 4 requests fails at the middle layer after making 32 MB of scratch (a stand-in for the
    activations an out-of-memory forward leaves): when the first retry starts, that scratch and the failing layer's
    output are already freed (by reference counts, no garbage collection: what a GPU's allocator would get back),
    and the tensors alive are what they were before the forward. Before: all of it was held by the error's traceback
    while the retries ran (32 MB more at each retry)."""
    model = tiny("llama")
    reqs = [_request(model, *c) for c in _cases()]
    at_retries = []

    def before(_module, _args, kwargs):  # each forward's start: the first retry after the failed one is measured
        if state["made"] and not at_retries:
            at_retries.append(([ref() is None for ref in state["made"]], live_tensor_bytes()))
    level = live_tensor_bytes()
    with fault(model, "middle", scratch=32 * 2**20) as state:
        hook = model.register_forward_pre_hook(before, with_kwargs=True)
        try:
            Batcher(model)._run(reqs)
        finally:
            hook.remove()
    assert isinstance(reqs[3].error, Injected) and all(r.error is None for r in reqs[:3])
    (freed, live), = at_retries
    assert freed == [True, True], freed
    assert live - level < 4 * 2**20, (live, level)  # the 32 MB and the forward's activations gone


@pytest.mark.unit
@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_in_a_shared_forward_stops_the_thread_that_leads_it_and_retries_nothing(stop):
    """Three decodes' requests queue behind a forward under way, then run as one packed forward that is interrupted
    (Ctrl-C, or SystemExit) at the middle layer in the thread that leads it: that thread gets the interrupt, its cache
    as it was; nothing is retried one by one (before: the interrupt became three retries and nobody stopped); the other
    two requests go back to the queue, caches put back, and run together in the next forward with the numbers they
    get alone."""
    model = tiny("llama")
    clean = copy.deepcopy(model)
    cases = [([5, 6, 7], [[8]], None), ([], [[1, 2, 3, 4, 5, 6]], 2), (list(range(10, 19)), [[20, 21]], None)]
    alone = []
    for c in cases:
        r = _request(clean, *c)
        Batcher(clean)._run([r])
        alone.append(r)
    b = Batcher(model)
    reqs = [_request(clean, *c) for c in cases]
    lengths = [r.cache.get_seq_length() for r in reqs]
    forwards, got, leader = [], {}, []

    def count(_module, _args, kwargs):
        forwards.append(len(kwargs[RUN].segments))
        leader.append(threading.get_ident())

    def interrupt(*_):  # the first forward only, in whichever thread leads it
        if len(forwards) == 1:
            raise stop()

    def run(i):
        try:
            got[i] = b.forward(reqs[i].rows, reqs[i].cache, reqs[i].keep)
        except BaseException as exc:  # noqa: BLE001 - what this thread was given
            got[i] = exc
        got[i, "thread"] = threading.get_ident()

    with b.gate:
        b.running = True  # a forward under way: the three requests queue behind it
    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    hooks = [model.register_forward_pre_hook(count, with_kwargs=True),
             _layers(model)[1].register_forward_hook(interrupt)]
    try:
        for t in threads:
            t.start()
        queued(b, 3)
        with b.gate:
            b.running = False
            b.wake_head()
        for t in threads:
            t.join(60)
    finally:
        for h in hooks:
            h.remove()
    assert forwards == [3, 2], forwards  # the interrupted forward, then the other two together: no retries alone
    stopped = [i for i in range(3) if isinstance(got[i], stop)]
    assert len(stopped) == 1, got
    i = stopped[0]
    assert got[i, "thread"] == leader[0]  # the interrupt stayed in the thread that led the forward
    assert reqs[i].cache.get_seq_length() == lengths[i]  # its cache as it was
    for i in set(range(3)) - set(stopped):
        assert not isinstance(got[i], BaseException), got[i]
        assert torch.allclose(got[i].logprobs, alone[i].logprobs, atol=1e-5)
        assert reqs[i].cache.get_seq_length() == alone[i].cache.get_seq_length()
    assert b.queue == [] and not any(isinstance(g, ForwardError) for g in got.values())


@pytest.mark.unit
def test_a_single_request_that_fails_keeps_its_cache():
    model = tiny("gemma-sliding")
    r = _request(model, list(range(10, 19)), [[POISON, 2]], None)
    keys = [layer.keys.clone() for layer in r.cache.layers]
    with fault(model, "middle"):
        Batcher(model)._run([r])
    assert isinstance(r.error, Injected)
    assert [torch.equal(layer.keys, k) for layer, k in zip(r.cache.layers, keys)] == [True] * len(keys)


@pytest.mark.unit
def test_a_cache_written_in_place_is_not_retried_on():
    """A cache whose layers write into their tensors (a static cache) cannot be put back: its request fails with a
    typed error instead of going on from a cache that holds part of a failed forward."""
    from transformers import StaticCache

    from adafuse.errors import ForwardError
    model = tiny("llama")
    static = StaticCache(config=model.config, max_cache_len=32)
    good, fixed = _request(model, [5, 6], [[7]], None), Request([[1, 2]], static, None)
    poisoned = _request(model, [5], [[POISON]], None)
    with fault(model, "middle"):
        Batcher(model)._run([good, fixed, poisoned])
    assert good.error is None and isinstance(poisoned.error, Injected)
    assert isinstance(fixed.error, ForwardError) and "cannot be restored" in str(fixed.error)


@pytest.mark.unit
def test_a_waiting_thread_that_is_interrupted_leaves_the_queue(monkeypatch):
    """A decode's thread interrupted while its request waits for a forward (an exception raised in it) takes its
    request out of the queue: no forward runs it later on a cache the decode has left."""
    model = tiny("llama")
    b = Batcher(model)
    b.running = True  # another forward is under way: the request waits
    waits = []

    class Interrupted(threading.Condition):
        def wait(self, timeout=None):
            waits.append(timeout)
            raise KeyboardInterrupt

    monkeypatch.setattr(b.runtime, "waiter", lambda: Interrupted(b.gate))
    with pytest.raises(KeyboardInterrupt):
        b.forward([[1]], prefilled(model, [2]))
    assert waits and b.queue == []


def until(check, timeout: float = 30) -> None:
    """Wait until `check()` holds (polled: the threads it watches sleep on conditions of their own)."""
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"not within {timeout} s"
        time.sleep(0.005)


def queued(b: Batcher, n: int) -> None:
    """Wait until `n` requests wait in `b`'s queue."""
    until(lambda: len(b.queue) == n)


def _poisoned_decodes(pair, prompts, poison_prompt, where, concurrency=4):
    """Decode `prompts` at once with a fault in every forward of both models whose input holds a token id of the
    poisoned prompt that no other prompt has (in each model's tokenizer); returns each prompt's trace or error."""
    def job(p):
        def run():
            try:
                return AdaFuse(pair, DecodeConfig(stop=("\n",), max_new_words=3)).generate(p)
            except Exception as exc:  # noqa: BLE001
                return exc
        return run
    hooks = []
    with contextlib_exit() as stack:
        for lm in pair:
            others = {i for p in prompts if p != poison_prompt for i in lm.tokenize(p)}
            rare = [i for i in lm.tokenize(poison_prompt) if i not in others]
            hooks.append(stack.enter_context(fault(lm.model, where, poison=rare[0])))
        return list(run_many([job(p) for p in prompts], concurrency))


@contextmanager
def contextlib_exit():
    from contextlib import ExitStack
    with ExitStack() as stack:
        yield stack


def _same(a, b) -> bool:
    """Two traces of one prompt decided alike: the output, and every round's kind, candidates and choice, their fused
    scores equal to 1e-4 (a forward shared with other decodes rounds the shared layers' last bits differently)."""
    def key(t):
        return t.output, t.stop_reason, [(r.kind, r.chosen, [(c.text, c.eos) for c in r.candidates]) for r in t.rounds]

    def scores(t):
        return [c.fused for r in t.rounds for c in r.candidates if c.fused is not None]
    return key(a) == key(b) and scores(a) == pytest.approx(scores(b), abs=1e-4)


QUESTIONS = ["Who wrote Hamlet?", "What is the capital of France?", "Who painted the Mona Lisa?",
             "Which planet is known as the Red Planet zyzzogeton?"]
PROMPTS = [f"Question: {q}\nAnswer:" for q in QUESTIONS]


@pytest.fixture(scope="module")
def alone(pair):
    return [AdaFuse(pair, DecodeConfig(stop=("\n",), max_new_words=3)).generate(p) for p in PROMPTS[:3]]


@pytest.mark.models
@pytest.mark.parametrize("where", ["first", "middle", "last", "head"])
def test_decodes_sharing_forwards_with_a_failing_one_give_what_they_give_alone(pair, alone, where):
    """Four TriviaQA-style decodes start together (their prefills share forwards); the fourth prompt's forwards raise
    at `where` in both models: it fails with that error, the other three give the traces they give alone."""
    prompts = PROMPTS
    got = _poisoned_decodes(pair, prompts, prompts[3], where)
    assert isinstance(got[3], Injected), got[3]
    for a, g in zip(alone, got[:3]):
        assert not isinstance(g, Exception), g
        assert _same(a, g), (a.output, g.output)
    for lm in pair:
        assert lm.batcher.queue == []


PROMPTS8 = [" a b", " c", " d e f", " g", " h i", " j k", " l", " m n o"]
CFG = DecodeConfig(max_new_words=4, branches=3, tau=0.9)


def tiny_local(name: str):
    """A tiny random transformer that packs ("llama", or "gemma" with sliding windows) as a model of a decode, over a
    toy tokenizer of letters: the same weights each time."""
    from adafuse.models.local import LocalModel
    from tests.toy import ToyTokenizer
    vocab = [chr(ord("a") + i) for i in range(26)] + [" " + chr(ord("a") + i) for i in range(26)] + [" ", ".", "\n"]
    tok = ToyTokenizer(vocab)
    m = tiny({"llama": "llama", "gemma": "gemma-sliding"}[name])
    m.resize_token_embeddings(len(tok.tokens))
    return LocalModel.from_objects(name, m, tok)


def tiny_pair():
    return [tiny_local("llama"), tiny_local("gemma")]


def live_tensor_bytes() -> int:
    """Bytes of the tensors alive in this process (each storage once)."""
    gc.collect()
    storages = {}
    for o in gc.get_objects():
        if issubclass(type(o), torch.Tensor) and o.device.type == "cpu":
            st = o.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
    return sum(storages.values())


@pytest.mark.unit
def test_a_decode_cancelled_while_its_forward_waits_or_runs_stops_alone():
    """Decodes stepping side by side; one is asked to stop while its forward waits in the queue, another while its
    forward runs: each stops at its next round (its trace "cancelled", keeping its rounds), the others give what they
    give alone, and no request is left in a queue."""
    models = tiny_pair()
    alone = [AdaFuse(models, CFG).generate(p) for p in PROMPTS8[:4]]
    decodes = [AdaFuse(models, CFG).start(p) for p in PROMPTS8[:4]]
    stop = [threading.Event() for _ in decodes]
    batcher = models[0].batcher

    def run(i):
        d = decodes[i]
        while not d.done:
            if stop[i].is_set():
                d.cancel()
                break
            d.step()

    def before(_module, _args, _kwargs):  # in a forward: ask decode 1 to stop now (its request is running or queued)
        stop[1].set()
        if batcher.queue:
            stop[2].set()  # queued behind this forward
    hook = models[0].model.register_forward_pre_hook(before, with_kwargs=True)
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        hook.remove()
    assert decodes[1].trace.stop_reason == "cancelled"
    for i in (0, 3):
        assert _same(alone[i], decodes[i].trace)
    for i in (1, 2):  # what a stopped decode kept is what it decided alone up to there
        t = decodes[i].trace
        assert [r.text for r in t.rounds] == [r.text for r in alone[i].rounds[: len(t.rounds)]]
    assert all(lm.batcher.queue == [] for lm in models)


@pytest.mark.unit
def test_eight_decodes_with_every_third_forward_failing_survive_as_alone():
    """8 decodes on two tiny transformers (a packed Llama and a packed Gemma with sliding windows), every 3rd
    forward that several decodes share failing at a random layer or the head (seeded): every decode gives the trace it
    gives alone (the failed forward's requests put back and retried alone); nothing is left in any queue, and the
    memory held afterwards is what the same decodes without faults leave (no request, no cache of a failed forward
    kept)."""
    models = tiny_pair()
    alone = [AdaFuse(models, CFG).generate(p) for p in PROMPTS8]
    cfg, prompts = CFG, PROMPTS8

    def job(p):
        def run():
            try:
                return AdaFuse(models, cfg).generate(p)
            except Injected as exc:
                return exc
        return run
    list(run_many([job(p) for p in prompts], 8))  # without faults: the level the models' stores settle at
    level = live_tensor_bytes()
    with contextlib_exit() as stack:
        states = [stack.enter_context(fault(lm.model, "", every=3, seed=i)) for i, lm in enumerate(models)]
        got = list(run_many([job(p) for p in prompts], 8))
    assert sum(s["fired"] for s in states) >= 3, states  # faults did fire inside shared forwards
    for a, g in zip(alone, got):
        assert not isinstance(g, Exception), g
        assert _same(a, g), (a.output, g.output)
    for lm in models:
        assert lm.batcher.queue == []
    del got
    assert live_tensor_bytes() <= level * 1.01, (live_tensor_bytes(), level)
    assert not [o for o in gc.get_objects() if type(o) is Request]
