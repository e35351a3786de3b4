"""Models side by side (adafuse/parallel.py): one worker per model gives the same trace as running them one after
another."""
import threading
import time
from dataclasses import replace

import pytest
import torch

from adafuse import AdaFuse, DecodeConfig
from adafuse.errors import ModelLoadError
from adafuse.parallel import Workers
from tests.real import gsm8k_prompt, qa_prompt
from tests.toy import toy_pair


class FakeModel:
    device = torch.device("cpu")


def test_workers_run_models_at_the_same_time_and_keep_model_order():
    a, b = FakeModel(), FakeModel()
    w = Workers([a, b], parallel=True, threads=1)
    barrier = threading.Barrier(2, timeout=5)  # passes only if both models' calls run at once

    def call(i):
        barrier.wait()
        time.sleep(0.01 * (2 - i))  # the first model finishes last
        return i, threading.current_thread().name

    out = w.map(call, [0, 1])
    assert [i for i, _ in out] == [0, 1] and out[0][1] != out[1][1]
    w.close()


def test_sequential_workers_run_one_call_at_a_time():
    a, b = FakeModel(), FakeModel()
    w = Workers([a, b], parallel=False, threads=1)
    running, seen = [0], []

    def call(i):
        running[0] += 1
        seen.append(running[0])
        time.sleep(0.01)
        running[0] -= 1
        return i

    assert w.map(call, [1, 0]) == [1, 0] and seen == [1, 1]
    threads = torch.get_num_threads()
    assert w.map(lambda i: (threading.current_thread() is threading.main_thread(), torch.get_num_threads()),
                 [0]) == [(True, 1)]  # in the caller's thread, with the budget asked for
    assert torch.get_num_threads() == threads  # and the caller's own budget back


def test_views_of_one_loaded_model_share_a_worker():
    a = FakeModel()
    w = Workers([a, a], parallel=True)
    assert not w.enabled and w.map(lambda i: threading.current_thread() is threading.main_thread(), [0, 1]) == [True, True]


def test_an_error_in_one_worker_is_raised_after_the_others_finish():
    a, b = FakeModel(), FakeModel()
    w = Workers([a, b], parallel=True, threads=1)
    finished = []

    def call(i):
        if i == 0:
            raise ModelLoadError("model 0 broke")
        time.sleep(0.05)
        finished.append(i)

    with pytest.raises(ModelLoadError, match="model 0 broke"):
        w.map(call, [0, 1])
    assert finished == [1]


def test_the_default_puts_models_side_by_side_only_in_places_of_their_own():
    class OnGPU:
        device = torch.device("cuda", 0)

    class OnGPU1:
        device = torch.device("cuda", 1)

    assert not Workers([FakeModel(), FakeModel()]).parallel  # they share this machine's CPU and cannot be measured
    assert not Workers([OnGPU(), OnGPU()]).parallel  # one shared GPU: measured slower (docs/performance.md)
    mixed = Workers([FakeModel(), OnGPU()])
    assert mixed.parallel and mixed.threads == max(1, len(__import__("os").sched_getaffinity(0)))
    mixed.close()
    two_gpus = Workers([OnGPU(), OnGPU1()])
    assert two_gpus.parallel
    two_gpus.close()
    assert not Workers([OnGPU(), OnGPU1(), FakeModel(), FakeModel()]).parallel  # two share the CPU


@pytest.mark.parametrize("ending", ["finished", "cancelled"])
def test_side_by_side_the_mixture_does_not_wait_for_an_idle_model_catching_up(ending):
    a, b = toy_pair()
    hold, entered, released, waited = [False], threading.Event(), threading.Event(), []
    forward = b.model.forward

    def slow_forward(*args, **kw):  # b's catch-ups wait for the test (its prefill does not)
        if hold[0]:
            waited.append(threading.current_thread().name)
            entered.set()
            assert released.wait(10)
        return forward(*args, **kw)

    b.model.forward = slow_forward
    # a writes every word (b's weight is tiny), b may be drawn, so it catches up after every round
    d = AdaFuse([a, b], DecodeConfig.of(method="mixture", weights=(1, 1e-9), temperature=0), parallel=True).start("Q")
    hold[0] = True
    texts = [d.commit().text for _ in range(2)]  # the second round goes on while b's first catch-up is held
    assert entered.wait(5) and texts == [" Paris", " is"] and not released.is_set() and not d.done
    assert waited[0].startswith("adafuse-model1")  # b's own worker, not the decoding thread
    if ending == "finished":
        released.set()
        for _ in d:
            pass
        assert d.trace.output == " Paris is nice." and d.trace.stop_reason == "eos"
    else:  # cancelling waits for the running catch-up (nothing touches the model afterwards) and charges it
        threading.Timer(0.2, released.set).start()
        d.cancel()
        assert d.trace.stop_reason == "cancelled" and released.is_set()
    assert d.trace.output.startswith(d.sessions[1].text) and d.sessions[1].text  # b caught up as far as it got
    # every forward b made while catching up in the background is charged to some round
    charged = sum(s.forward_passes for r in d.trace.rounds for s in r.steps if s.model == "b")
    assert charged == d.sessions[1].forward_passes - d.trace.prefill["b"]["forward_passes"] > 0


def test_the_mixture_takes_turns_on_a_shared_cpu_unless_side_by_side_is_asked_for(monkeypatch):
    """One model writes each word, so there is nothing to overlap but catch-ups, which ride along with the writer's
    forward: models sharing the CPU take turns without probing; asked for, side by side gives the same text."""
    import adafuse.parallel as par
    probed = []
    monkeypatch.setattr(par, "_measure_or_none", lambda models: probed.append(1) or (1.0, 0.5))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    cfg = DecodeConfig.of(method="mixture", temperature=0, seed=3)
    turns = AdaFuse(toy_pair(), cfg).start("Q")
    assert not turns.workers.parallel and probed == []
    adafuse = AdaFuse(toy_pair(), DecodeConfig()).start("Q")  # the same models, a method that overlaps: probed
    assert adafuse.workers.parallel and probed == [1]
    both = AdaFuse(toy_pair(), cfg, parallel=True).start("Q")
    assert both.workers.parallel
    for d in (turns, both):
        for _ in d:
            pass
    assert both.trace.output == turns.trace.output and \
        [r.text for r in both.trace.rounds] == [r.text for r in turns.trace.rounds]


def _without_timings(tr) -> dict:
    d = tr.to_dict()
    d.pop("seconds"), d.pop("workers")
    for p in d["prefill"].values():
        p.pop("seconds")
    for r in d["rounds"]:
        r.pop("seconds")
        for s in r["steps"]:
            s.pop("seconds")
    return d


@pytest.mark.parametrize("case", ["triviaqa", "gsm8k", "mixture", "chat"])
def test_parallel_models_write_the_same_trace_as_sequential(tiny_bundled, case):
    """Side by side (a worker thread per model) and one after another write the same trace bit for bit, on the
    bundled pair's architectures, tokenizers and chat templates (tiny random weights: what is checked is how the
    forwards run, not what the models say), a prompt past Gemma 3's sliding window among them."""
    pair = tiny_bundled
    prompt = gsm8k_prompt(2, shots=1) if case == "gsm8k" else qa_prompt("triviaqa", 3)
    cfg = {"triviaqa": DecodeConfig(stop=("\n",), max_new_words=20),
           "gsm8k": DecodeConfig(stop=("\n\nQuestion:",), max_new_words=12, branches=2),
           "mixture": DecodeConfig.of(stop=("\n",), method="mixture", seed=3, max_new_words=20),
           "chat": DecodeConfig(mode="chat", max_new_words=6)}[case]
    if case == "chat":
        prompt = "Name two rivers of Europe."
    # without speculation: its drafts differ by design (side by side, this round's spans do not exist yet when a model
    # starts), so its costs do; tests/test_speculation.py checks speculation side by side
    cfg = replace(cfg, speculate=False)
    traces = {}
    for parallel in (False, True):
        for lm in pair:
            lm.prefixes.clear()  # both decodes prefill from scratch
        traces[parallel] = AdaFuse(pair, cfg, parallel=parallel, threads=1).generate(prompt)
    seq, par = traces[False], traces[True]
    assert seq.workers.startswith("sequential") and par.workers.startswith("parallel")
    if case == "mixture":  # side by side the idle model catches up every round (free), one after another when drawn
        assert seq.output == par.output and [r.text for r in seq.rounds] == [r.text for r in par.rounds]
    else:
        assert _without_timings(seq) == _without_timings(par)  # bit for bit: every margin, NLL, count
    assert seq.rounds and seq.output.strip()


def test_the_side_by_side_probe_is_kept_by_the_models_runtimes(monkeypatch):
    """The probe's result for a set of models is kept by the runtime they share (a registry's), or by each of theirs,
    never written onto a model: measured once per set either way."""
    import adafuse.parallel as par
    from adafuse.models.batching import Runtime

    class Probed:  # a loaded model as the probe sees it: its runtime (the probe itself is replaced)
        def __init__(self, runtime):
            self.runtime = runtime

    probed = []
    monkeypatch.setattr(par, "_probe", probed.append)
    shared = Runtime()
    a, b = Probed(shared), Probed(shared)
    first = par.measure_cpu_side_by_side([a, b], 1, repeats=1)
    assert par.measure_cpu_side_by_side([a, b], 1, repeats=1) == first and len(probed) == 4  # each model twice, once
    assert list(shared.probes.values()) == [first] and vars(a) == {"runtime": shared}
    c, d = Probed(Runtime()), Probed(Runtime())
    par.measure_cpu_side_by_side([c, d], 1, repeats=1)
    assert par.measure_cpu_side_by_side([c, d], 1, repeats=1) and len(probed) == 4 + 4
    assert len(c.runtime.probes) == len(d.runtime.probes) == 1


def test_models_sharing_the_cpu_go_side_by_side_when_the_machine_measures_it_faster(pair, monkeypatch):
    import adafuse.parallel as par
    seq, side = par.measure_cpu_side_by_side(pair, 1)  # the probe on the real pair: a few forwards
    assert seq > 0 and side > 0
    assert par.measure_cpu_side_by_side(pair, 1) == (seq, side)  # measured once per process
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # a process that may run a thread per model
    for measured, chosen in (((1.0, 0.6), True), ((1.0, 0.95), False)):
        monkeypatch.setattr(par, "measure_cpu_side_by_side", lambda models, threads, m=measured: m)
        w = Workers(pair)
        assert w.parallel is chosen and w.measured == measured
        assert f"measured side by side {measured[1]:.2f}× one after another" in w.describe()
        assert w.describe().startswith("parallel" if chosen else "sequential")
        w.close()
    # an explicit choice, or a thread budget, is not second-guessed
    assert Workers(pair, parallel=False).measured is None and not Workers(pair, threads=1).parallel
    # a process given fewer torch threads than models (one worker process per core) takes turns without probing
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    one = Workers(pair)
    assert not one.parallel and one.measured is None


@pytest.mark.models
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_models_on_cuda_decode_with_true_seconds():
    from adafuse import DEFAULT_PAIR, get_model
    n = torch.cuda.device_count()
    models = [get_model(f"{name}@cuda:{i % n}") for i, name in enumerate(DEFAULT_PAIR)]
    assert all(lm.device.type == "cuda" and lm.dtype == torch.bfloat16 for lm in models)
    tr = AdaFuse(models, DecodeConfig(stop=("\n",), max_new_words=12)).generate(qa_prompt("nq", 1))
    assert tr.output.strip() and tr.workers.startswith("parallel")
    for name in tr.models:
        cost = tr.cost(name)
        assert cost["forward_passes"] > 0 and cost["seconds"] > 0
