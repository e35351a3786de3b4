"""A thread's CPU budget while many decodes run: each decode's thread does its own small tensor work on one CPU
thread (`lean`), and a forward it leads gets the cores back (`full_threads`, batching.py)."""
from __future__ import annotations

import contextvars
import threading
from contextlib import contextmanager

import torch

# (thread, its torch thread budget) while a thread runs lean (`lean`)
_LEAN: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("adafuse_lean", default=None)


@contextmanager
def lean():
    """This thread (one of many decodes' threads) computes its own small tensor work on one CPU thread meanwhile: many
    threads each starting a team of CPU threads for an argmax would crowd the cores a batched forward needs. A forward
    it leads still gets the budget the thread had (`full_threads`); workers it hands work to (`parallel.Workers`, in
    a copy of its context) keep their own."""
    budget = torch.get_num_threads()
    token = _LEAN.set((threading.get_ident(), budget))
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(budget)
        _LEAN.reset(token)


def run_lean(fn, *args):
    """`fn(*args)` with this thread lean (`lean`): what the threads of many decodes run."""
    with lean():
        return fn(*args)


@contextmanager
def full_threads():
    """A forward led by a lean thread gets the budget the thread had (`lean`)."""
    leaning = _LEAN.get()
    if leaning is None or leaning[0] != threading.get_ident():
        yield
        return
    torch.set_num_threads(leaning[1])
    try:
        yield
    finally:
        torch.set_num_threads(1)
