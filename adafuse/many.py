"""Many decodes at once: jobs on threads, in their order. Each decode's forwards meet the others' at the models'
batchers (models/batching.py), which run whatever is waiting as one forward; the threads only keep the decodes'
Python work (proposals, scoring, words) going while the models compute."""
from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

from .errors import ConfigError
from .models.lean import run_lean

T = TypeVar("T")
# Decodes in flight by default: on a 2-core CPU with the bundled pair, examples per minute rose up to 8 and no further
# (python -m adafuse.harness.bench --concurrency 1 2 4 8 16; docs/many-decodes.md).
DEFAULT_CONCURRENCY = 8
# Seconds one decode may hold a slot of a shared service (`adafuse serve --timeout`, the app's decoding slots): then it
# stops before its next round with the stop reason "deadline", keeping what it decided
DEFAULT_DEADLINE_S = 600.0
# The most candidates one request of a shared service may have an uncertain model explore (`adafuse serve
# --max-branches`)
MAX_BRANCHES = 8
MAX_CONCURRENCY = 256


def check_concurrency(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CONCURRENCY:
        raise ConfigError(f"concurrency is {n!r}: give a whole number of decodes in flight from 1 to {MAX_CONCURRENCY}")
    return n


def run_many(jobs: Iterable[Callable[[], T]], concurrency: int = DEFAULT_CONCURRENCY) -> Iterator[T]:
    """Run the jobs with up to `concurrency` at once and yield their results in the jobs' order. Jobs are taken
    lazily, at most twice `concurrency` ahead of the one yielded next (a slow job holds back the yielding, not the
    running). A job's error is raised at its place, after the results before it; the jobs not started then are
    dropped and the running ones finish first. Concurrency 1 runs each job in the caller's thread."""
    concurrency = check_concurrency(concurrency)
    jobs = iter(jobs)
    if concurrency == 1:
        for job in jobs:
            yield job()
        return
    ahead: deque[Future] = deque()
    with ThreadPoolExecutor(concurrency, thread_name_prefix="adafuse-decode") as pool:
        try:
            for job in jobs:
                ahead.append(pool.submit(run_lean, job))  # each thread lean: the forwards get the cores
                while len(ahead) >= 2 * concurrency or (ahead and ahead[0].done()):
                    yield ahead.popleft().result()
            while ahead:
                yield ahead.popleft().result()
        finally:  # an error, a consumer that stopped early, Ctrl-C: nothing more starts
            for f in ahead:
                f.cancel()
