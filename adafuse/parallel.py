"""One phase of a round (prefill, proposing, scoring, committing) on every model at once: one worker per model."""
from __future__ import annotations

import contextvars
import os
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence, TypeVar

import torch

from .models.served import ServedModel

T = TypeVar("T")


def cpu_threads_per_model(count: int) -> int:
    """Torch threads for each of `count` models decoding side by side on CPU: the cores shared out, at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, count))


# Side by side beats one after another on this machine's CPU by at least this factor, or models take turns.
SIDE_BY_SIDE_GAIN = 0.85


def _probe(lm) -> None:
    """The shape of a round's work, briefly: a short batch forward (as scoring makes) and single-token steps (as a
    greedy span makes) on a fresh cache."""
    model = lm.model
    with torch.inference_mode():
        out = model(input_ids=torch.arange(100, 124, device=lm.device)[None], use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        for t in range(4):
            model(input_ids=torch.tensor([[200 + t]], device=lm.device), past_key_values=cache, use_cache=True,
                  logits_to_keep=1)


def measure_cpu_side_by_side(models: Sequence, threads_each: int, repeats: int = 2) -> tuple[float, float]:
    """Seconds of the probe for every model one after another (each with this thread's torch threads) and side by
    side (one worker each, `threads_each` threads): the best of `repeats`, measured once for a set of loaded models
    and kept by their runtimes (`Runtime.probes`: the models of one registry share one; by weak references to the
    set, so a model unloaded and another loaded never match). Whether two threads speed one model up depends on the
    machine (on one 2-core machine 1.65×, on another not at all), so the default asks the machine rather than
    guessing."""
    key = (tuple(weakref.ref(m) for m in models), threads_each, torch.get_num_threads())
    runtimes = list({id(m.runtime): m.runtime for m in models}.values())
    kept = next((r.probes[key] for r in runtimes if key in r.probes), None)
    if kept is not None:
        return kept
    seq, par, mine = float("inf"), float("inf"), torch.get_num_threads()
    with ThreadPoolExecutor(len(models), initializer=torch.set_num_threads, initargs=(threads_each,)) as pool:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for m in models:
                _probe(m)
            seq = min(seq, time.perf_counter() - t0)
            t0 = time.perf_counter()
            list(pool.map(_probe, models))
            par = min(par, time.perf_counter() - t0)
    torch.set_num_threads(mine)  # the workers' setting also reaches process-wide defaults: put this one back
    for r in runtimes:
        r.probes[key] = (seq, par)
    return seq, par


def _measure_or_none(models: Sequence) -> tuple[float, float] | None:
    """`measure_cpu_side_by_side` for transformers models with the cores shared out; None for models the probe cannot
    run (toy or served models, or a probe that fails): those take turns."""
    from transformers import PreTrainedModel
    if not all(isinstance(getattr(m, "model", None), PreTrainedModel) for m in models):
        return None
    try:
        return measure_cpu_side_by_side(models, cpu_threads_per_model(len(models)))
    except Exception:  # noqa: BLE001 - see above
        return None


def _place(model, device: torch.device) -> str:
    """Where a model computes: its server, its GPU, or this machine's CPU (every CPU model shares the one place)."""
    if isinstance(model, ServedModel):
        return f"server {model.url}"
    return "cpu" if device.type == "cpu" else str(device)


class Workers:
    """The models of an ensemble are independent inside each phase of a round, so a phase costs about the slowest
    model's time instead of the sum. Each worker is a thread (torch releases the GIL inside its kernels) with its own
    torch thread budget on CPU; on a GPU a model's calls run on that model's one CUDA stream, the one its batcher runs
    every forward on (`Batcher.stream`: one stream per model, whichever decode's thread queues work for it);
    views of the same loaded model share one worker (their tokenizer and weights are not used from two threads at
    once). Results are gathered in model order, so a parallel
    decode writes the same trace as a sequential one.

    Runs `fn(i)` for model indices: concurrently, one worker thread per distinct loaded model, or (`parallel`
    False) one after another in the caller's thread; with the same torch thread budget the two ways give the same
    numbers bit for bit. A single model runs in the caller's thread. `parallel` None: side by side when every model
    computes in a place of its own (its own GPU, its own server, or the only one on this machine's CPU); models that
    share one GPU go one after another (two 8B models on one H200 took 1.2–1.8× longer per word side by side:
    docs/performance.md, GPU); models that share this machine's CPU go side by side when a short probe measures it
    faster by `SIDE_BY_SIDE_GAIN` (`measure_cpu_side_by_side`: on one 2-core machine a model ran 1.65× faster on two
    threads than on one, so taking turns won; on another, two threads were no faster than one and side by side took 0.7×
    the time)."""

    def __init__(self, models: Sequence, parallel: bool | None = None, threads: int | None = None,
                 probe: bool = True):
        # each loaded model once, in order of first appearance (models compare by identity): views of one model share
        # a worker
        groups: dict = {}
        self.group = [groups.setdefault(m, len(groups)) for m in models]
        distinct = list(groups)
        self.models = list(models)
        self.devices = [m.device for m in models]
        # models computing on this machine's CPU share its cores; GPUs and servers compute elsewhere
        cpu = {self.group[i] for i, m in enumerate(models)
               if self.devices[i].type == "cpu" and not isinstance(m, ServedModel)}
        self.measured: tuple[float, float] | None = None
        self.turns = ""  # why models sharing the CPU take turns without a probe
        if parallel is None:  # side by side where each model computes in a place of its own
            places = [_place(m, self.devices[i]) for i, m in enumerate(models)]
            parallel = len(set(places)) == len(distinct)
            shared = {p for p in places if places.count(p) > 1}
            # ... or where the CPU says so, if this process may use a thread per model (a process given one thread, as
            # each of experiments/run.py's workers, takes turns; so do the models of a method with one model working at
            # a time, `probe` False)
            if not parallel and shared == {"cpu"}:
                if not probe:
                    self.turns = "one model works at a time"
                elif 1 < len(cpu) <= torch.get_num_threads() and not threads:
                    self.measured = _measure_or_none([m for g, m in enumerate(distinct) if g in cpu])  # each once
                    parallel = bool(self.measured) and self.measured[1] <= SIDE_BY_SIDE_GAIN * self.measured[0]
        self.parallel = bool(parallel)
        self.enabled = len(distinct) > 1
        self.given = threads  # one after another, the caller's thread runs the models: its budget, unless given
        self.threads = threads or cpu_threads_per_model(max(1, len(cpu)) if self.parallel else 1)
        self.pool: list[ThreadPoolExecutor] = []
        self.streams: dict[int, object] = {}  # by loaded model (its group): its CUDA stream, looked up once
        if self.enabled and self.parallel:
            self.pool = [ThreadPoolExecutor(1, thread_name_prefix=f"adafuse-model{g}", initializer=self._init)
                         for g in range(len(distinct))]

    def describe(self) -> str:
        if not self.enabled:
            return "one model"
        cpu = any(d.type == "cpu" for d in self.devices)
        measured = f"; measured side by side {self.measured[1] / self.measured[0]:.2f}× one after another" \
            if self.measured else ""
        if not self.parallel:
            why = f"; {self.turns}" if self.turns else measured
            return "sequential" + (f" ({self.given if self.given else torch.get_num_threads()} CPU threads{why})"
                                   if cpu else "")
        return f"parallel ({len(self.pool)} workers" + (f", {self.threads} CPU thread(s) each{measured})" if cpu else ")")

    def _init(self) -> None:
        if any(d.type == "cpu" for d in self.devices):
            torch.set_num_threads(self.threads)

    def stream(self, i: int):
        """Model i's CUDA stream: its batcher's (where its forwards run), or for a model without one a stream made
        once for it."""
        g = self.group[i]
        if g not in self.streams:
            stream = getattr(getattr(self.models[i], "batcher", None), "stream", None)
            self.streams[g] = stream if stream is not None else torch.cuda.Stream(self.devices[i])
        return self.streams[g]

    def _run(self, fn: Callable[[int], T], indices: list[int]) -> list[T]:
        out = []
        for i in indices:
            device = self.devices[i]
            if device.type == "cuda":
                stream = self.stream(i)
                stream.wait_stream(torch.cuda.current_stream(device))  # what the caller queued before the phase first
                with torch.cuda.device(device), torch.cuda.stream(stream):
                    out.append(fn(i))
                stream.synchronize()  # the phase ends with its results ready (and its seconds true)
            else:
                out.append(fn(i))
        return out

    def map(self, fn: Callable[[int], T], indices: Sequence[int]) -> list[T]:
        """[fn(i) for i in indices], each model's calls on its own worker; the first error (in model order) is raised
        once every worker has finished."""
        indices = list(indices)
        if not self.enabled:
            return self._run(fn, indices)
        if not self.parallel:
            if not self.given or self.given == torch.get_num_threads():
                return self._run(fn, indices)
            old = torch.get_num_threads()
            torch.set_num_threads(self.given)
            try:
                return self._run(fn, indices)
            finally:
                torch.set_num_threads(old)
        by_group: dict[int, list[int]] = {}
        for i in indices:
            by_group.setdefault(self.group[i], []).append(i)
        # each worker runs in the caller's context (the decode's rider: models/batching.py)
        futures = {g: self.pool[g].submit(contextvars.copy_context().run, self._run, fn, members)
                   for g, members in by_group.items()}
        done: dict[int, T] = {}
        error: BaseException | None = None
        for g, members in by_group.items():
            try:
                done.update(zip(members, futures[g].result()))
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after every worker stopped
                error = error or exc
        if error is not None:
            raise error
        return [done[i] for i in indices]

    def submit(self, i: int, fn: Callable[[int], T]) -> Future | None:
        """Start `fn(i)` on model i's worker and return at once; None when the models do not run side by side. A
        worker runs what it is given in order, so a later `map` over model i starts once this call has finished."""
        if not (self.enabled and self.parallel):
            return None
        return self.pool[self.group[i]].submit(contextvars.copy_context().run, self._run, fn, [i])

    def close(self) -> None:
        for p in self.pool:
            p.shutdown(wait=False)
        self.pool, self.enabled = [], False
