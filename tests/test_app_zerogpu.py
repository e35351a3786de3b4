"""ZeroGPU (app/gpu.py, app/leases.py): on a ZeroGPU Space a GPU is attached only inside a function decorated with
`spaces.GPU`. The app is imported here under a stand-in `spaces` module whose `GPU` counts the leases open, its models
are toy LMs under the bundled pair's names that log every forward and every load with whether a lease was open, and
each handler that runs a model (Run, Step, Branch, the token view, Evaluate, Answers, Load, the API's /decode) is
driven as the page drives it: no model work outside a lease, no page drawn inside one, one lease per press."""
from __future__ import annotations

import functools
import importlib
import inspect
import sys
import threading
import types
from contextlib import contextmanager

import pytest

from adafuse import DEFAULT_PAIR
from adafuse.errors import ModelNotFoundError
from adafuse.models import LocalModel
from tests.toy import EmbeddedToyLM, ToyTokenizer
from tests.toy_app import CHAT, RULES, VOCAB

pytestmark = pytest.mark.unit

NAMES = list(DEFAULT_PAIR)
PROMPT = "Question: Who wrote the play Hamlet?\nAnswer:"  # the toys disagree on round 0: a pool to pick from
SETTINGS = dict(names=NAMES, tau=0.7, max_words=3, branches=3, diversity=True, exploration="surface", lam=1.0,
                max_new_words=8, max_new_tokens=80, mode="raw", stop="\\n", system="", thinking="template default",
                speculate=False, normalize="per token (paper)", allow_empty=False, gate="", weights=(1, 1))
S = [*list(SETTINGS.values())[:-1], *SETTINGS["weights"]]  # the page's settings, as the handlers take them


class Leases:
    """What the stand-in `spaces.GPU` saw: how many leases are open now (any thread: a model's forward may run on a
    batcher's thread), how many were taken, and every model event with whether a lease was open for it."""

    def __init__(self):
        self.open, self.taken, self.events = 0, 0, []
        self._lock = threading.Lock()

    @contextmanager
    def held(self, taken: bool = False):
        """Open while the decorated function's own code runs; `taken`: a new lease (a call), not a generator going
        on in the one it took."""
        with self._lock:
            self.open += 1
            self.taken += taken
        try:
            yield
        finally:
            with self._lock:
                self.open -= 1

    def log(self, what: str, name: str) -> None:
        self.events.append((what, name, self.open > 0))

    def clear(self) -> None:
        self.taken, self.events = 0, []


def stand_in_spaces(leases: Leases) -> types.ModuleType:
    """`spaces` as app/gpu.py reads it on a ZeroGPU Space: `config.Config.zero_gpu` and `GPU(fn, duration=)`. A
    decorated generator holds its lease while its own code runs, not while its consumer handles what it yielded
    (ZeroGPU runs it apart, in a worker: a page drawn between two updates holds no GPU)."""

    def GPU(fn=None, *, duration=None):  # noqa: N802 - the name spaces gives it
        if fn is None:
            return lambda f: GPU(f, duration=duration)
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def leased_generator(*args, **kwargs):
                it, first = fn(*args, **kwargs), True
                try:
                    while True:
                        with leases.held(taken=first):
                            first = False
                            try:
                                item = next(it)
                            except StopIteration:
                                return
                        yield item
                finally:
                    with leases.held():
                        it.close()
            return leased_generator

        @functools.wraps(fn)
        def leased(*args, **kwargs):
            with leases.held(taken=True):
                return fn(*args, **kwargs)
        return leased

    spaces = types.ModuleType("spaces")
    spaces.GPU = GPU
    spaces.config = types.SimpleNamespace(Config=types.SimpleNamespace(zero_gpu=True))
    return spaces


class LoggedToy(EmbeddedToyLM):
    """The toy of tests/toy_app.py, logging each forward."""
    leases: Leases
    name: str

    def forward(self, *args, **kwargs):
        self.leases.log("forward", self.name)
        return super().forward(*args, **kwargs)


def loader(leases: Leases):
    """The registry's loader: the toy under a bundled name, the load logged."""
    def load(name, device=None, dtype=None, trust_remote_code=False):
        leases.log("load", name)
        if name not in RULES:
            raise ModelNotFoundError(f"{name!r}: the toy app knows only {', '.join(RULES)}")
        tok = ToyTokenizer(VOCAB, chat=CHAT if name == DEFAULT_PAIR[0] else None)
        lm = LoggedToy(tok, RULES[name], max_positions=32_768)
        lm.leases, lm.name = leases, name
        return LocalModel.from_objects(name, lm, tok)
    return load


def _ours(name: str) -> bool:
    return name in ("app", "spaces") or name.startswith(("app.", "spaces."))


@pytest.fixture(scope="module")
def zero():
    """The app's modules imported afresh under the stand-in `spaces` (as on a ZeroGPU Space), given back after."""
    saved = {k: m for k, m in sys.modules.items() if _ours(k)}
    for k in saved:
        del sys.modules[k]
    leases = Leases()
    sys.modules["spaces"] = stand_in_spaces(leases)
    try:
        gpu = importlib.import_module("app.gpu")
        assert gpu.ZERO_GPU, "app/gpu.py did not take the stand-in for a ZeroGPU Space"
        ns = types.SimpleNamespace(leases=leases, handlers=importlib.import_module("app.handlers"),
                                   api=importlib.import_module("app.api"),
                                   controller=importlib.import_module("app.controller"))
        ns.controller.MODELS.loader = loader(leases)
        yield ns
        for lm in ns.controller.MODELS.loaded():
            ns.controller.MODELS.unload(lm.name)
    finally:
        for k in [k for k in sys.modules if _ours(k)]:
            del sys.modules[k]
        sys.modules.update(saved)


MODEL_WORK = ("load", "forward")  # inside a lease, always
NO_GPU_NEEDED = ("render", "waits for a slot")  # outside one, always


@pytest.fixture
def app(zero, monkeypatch):
    """Each test starts with no model loaded (its handler loads them) and a fresh log; every page drawn and every try
    for a decoding slot is logged too."""
    for lm in zero.controller.MODELS.loaded():
        zero.controller.MODELS.unload(lm.name)
    zero.leases.clear()
    render, slots = zero.handlers.render, zero.controller.slots()
    take = slots.try_take

    def logged_render(ex, *args, **kwargs):
        zero.leases.log("render", "page")
        return render(ex, *args, **kwargs)

    def logged_take(ticket):
        zero.leases.log("waits for a slot", str(ticket))
        return take(ticket)
    monkeypatch.setattr(zero.handlers, "render", logged_render)
    monkeypatch.setattr(slots, "try_take", logged_take)
    return zero


def leased_only(app, leases_taken: int = 1) -> None:
    """What the calls just made did: both models loaded and ran forwards, all inside a lease; no page was drawn and
    no decoding slot waited for inside one; `leases_taken` leases in all."""
    events = app.leases.events
    outside = sorted({(what, name) for what, name, leased in events if what in MODEL_WORK and not leased})
    assert not outside, f"model work outside a GPU lease: {outside}"
    inside = sorted({what for what, _, leased in events if what in NO_GPU_NEEDED and leased})
    assert not inside, f"holding a GPU lease for no model work: {inside}"
    for name in NAMES:
        assert ("load", name, True) in events and ("forward", name, True) in events
    assert app.leases.taken == leases_taken


def run(app, ex=None, **kw):
    args = dict(names=NAMES, dev="default", allow=False, prompt_text=PROMPT, want_singles=True,
                other_methods=[next(iter(app.controller.COMPARE_METHODS))], picked=None) | kw
    outs = list(app.handlers.on_run(ex, *args.values(), *S))
    return outs[-1][0], outs


def test_run_decodes_and_compares_inside_one_lease(app):
    ex, outs = run(app)
    assert ex.trace.output and len(ex.singles) == 2 and len(ex.others) == 1
    assert len(outs) > 4  # streamed: each model loading, each round, each comparison
    leased_only(app)


def test_each_step_press_is_one_lease(app):
    out = app.handlers.on_step(None, NAMES, "default", False, PROMPT, None, *S)
    ex = out[0]
    assert ex.pending is not None  # round 0 decided: the visitor reads its pool with no GPU held
    leased_only(app)
    out = app.handlers.on_step(ex, NAMES, "default", False, PROMPT, 1, *S)  # their pick committed, round 1 decided
    assert out[0].trace.rounds[0].chosen == 1
    leased_only(app, leases_taken=2)


def test_branch_and_token_view_run_their_models_inside_a_lease(app):
    ex, _ = run(app, want_singles=False, other_methods=[])
    r = ex.trace.rounds[0]
    other = next(i for i in range(len(r.candidates)) if i != r.chosen)
    for m in NAMES:
        app.controller.MODELS.unload(m)
    app.leases.clear()
    outs = list(app.handlers.on_branch(ex, 0, other))
    assert outs[-1][0].branches, outs[-1]
    leased_only(app)
    for m in NAMES:
        app.controller.MODELS.unload(m)
    app.leases.clear()
    assert "⚠️" not in app.handlers.on_tokens(ex, 0, other)
    leased_only(app)


def test_answers_are_scored_inside_a_lease(app):
    from app.answers import ANSWERS, QUESTION
    ex, summary, *_ = app.handlers.on_answers(None, QUESTION, ANSWERS, "default", False, *S)
    assert summary.startswith("Preferred"), summary
    leased_only(app)


def test_evaluate_runs_its_batch_inside_a_lease(app):
    out = app.handlers.on_eval(None, "nq", 2, ["adafuse", "greedy"], NAMES, "default", False, 0.7, 3, 3,
                               "per token (paper)", False)
    assert out[1].startswith("✓ 2 examples"), out[1]
    leased_only(app)


def test_load_button_loads_inside_a_lease(app):
    said = list(app.handlers.on_load(NAMES, "default", False))
    assert said[-1].count("✓") == 2, said[-1]
    assert {(what, leased) for what, _, leased in app.leases.events} == {("load", True)} and app.leases.taken == 1


def test_the_decode_endpoint_decodes_inside_a_lease_and_waits_for_its_slot_outside(app):
    r = app.api.decode(PROMPT, ",".join(NAMES), 0.7, 3, 3, 8, "raw", "\\n")
    assert r["output"] and r["trace"]["models"] == NAMES
    leased_only(app)
    with pytest.raises(Exception, match="knows only") as err:  # a typed error still reaches the client, named
        app.api.decode(PROMPT, "no-such-model," + NAMES[1])
    assert type(err.value).__name__ == "Error" and err.value.title == "ModelNotFoundError"
