"""One phase of a round (prefill, proposing, scoring, committing) on every model at once: one worker per model.

The models of an ensemble are independent inside each phase, so a phase costs about the slowest model's time instead
of the sum. Each worker is a thread (torch releases the GIL inside its kernels) with its own torch thread budget on
CPU and its own CUDA stream on a GPU; views of the same loaded model share one worker (their tokenizer and weights
are not used from two threads at once). Results are gathered in model order, so a parallel decode writes the same
trace as a sequential one.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence, TypeVar

import torch

T = TypeVar("T")


def cpu_threads_per_model(count: int) -> int:
    """Torch threads for each of `count` models decoding side by side on CPU: the cores shared out, at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, count))


def _served(model) -> bool:
    from .remote import RemoteModel
    return isinstance(model, RemoteModel)


def _place(model, device: torch.device) -> str:
    """Where a model computes: its server, its GPU, or this machine's CPU (every CPU model shares the one place)."""
    if _served(model):
        return f"server {model.url}"
    return "cpu" if device.type == "cpu" else str(device)


class Workers:
    """Runs `fn(i)` for model indices: concurrently, one worker thread per distinct loaded model, or (`parallel`
    False) one after another in the caller's thread; with the same torch thread budget the two ways give the same
    numbers bit for bit. A single model runs in the caller's thread. `parallel` None: side by side when every model
    computes in a place of its own (its own GPU, its own server, or the only one on this machine's CPU); models that
    share a place go one after another, which measured faster: on 2 CPU cores a model runs 1.65× faster on two threads
    than on one, and two 8B models on one H200 took 1.2–1.8× longer per word side by side than one after another
    (README, GPU check)."""

    def __init__(self, models: Sequence, parallel: bool | None = None, threads: int | None = None):
        groups: dict[int, int] = {}
        self.group = [groups.setdefault(id(m), len(groups)) for m in models]
        self.devices = [m.device for m in models]
        # models computing on this machine's CPU share its cores; GPUs and servers compute elsewhere
        cpu = {self.group[i] for i, m in enumerate(models) if self.devices[i].type == "cpu" and not _served(m)}
        if parallel is None:  # side by side only where each model computes in a place of its own
            parallel = len({_place(m, self.devices[i]) for i, m in enumerate(models)}) == len(groups)
        self.parallel = bool(parallel)
        self.enabled = len(groups) > 1
        self.given = threads  # one after another, the caller's thread runs the models: its budget, unless given
        self.threads = threads or cpu_threads_per_model(max(1, len(cpu)) if self.parallel else 1)
        self.pool: list[ThreadPoolExecutor] = []
        self.streams: dict[int, object] = {}
        if self.enabled and self.parallel:
            self.pool = [ThreadPoolExecutor(1, thread_name_prefix=f"adafuse-model{g}", initializer=self._init)
                         for g in range(len(groups))]

    def describe(self) -> str:
        if not self.enabled:
            return "one model"
        cpu = any(d.type == "cpu" for d in self.devices)
        if not self.parallel:
            return "sequential" + (f" ({self.given if self.given else torch.get_num_threads()} CPU threads)" if cpu else "")
        return f"parallel ({len(self.pool)} workers" + (f", {self.threads} CPU thread(s) each)" if cpu else ")")

    def _init(self) -> None:
        if any(d.type == "cpu" for d in self.devices):
            torch.set_num_threads(self.threads)

    def _run(self, fn: Callable[[int], T], indices: list[int]) -> list[T]:
        out = []
        for i in indices:
            device = self.devices[i]
            if device.type == "cuda":
                stream = self.streams.setdefault(i, torch.cuda.Stream(device))
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
            return [fn(i) for i in indices]
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
        futures = {g: self.pool[g].submit(self._run, fn, members) for g, members in by_group.items()}
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

    def close(self) -> None:
        for p in self.pool:
            p.shutdown(wait=False)
        self.pool, self.enabled = [], False
