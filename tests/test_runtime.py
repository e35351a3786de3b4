"""One owner of the runtime (adafuse/models/batching.py `Runtime`): no module-level mutable state under
adafuse/models/ (the condition batchers wait on, the CPU's turn and the batchers' settings belong to a registry's
runtime; the packed forward's requests travel as a keyword of the model's forward; a thread's lean budget and the
current decode are context variables), so two registries in one process decode side by side as each does alone."""
from __future__ import annotations

import importlib
import pkgutil
import threading
import types

import pytest

import adafuse.models
from adafuse import AdaFuse
from adafuse.models import ModelRegistry
from tests.test_faults import CFG, PROMPTS8, _same, tiny_local

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()), threading.Condition, threading.Event,
               threading.Semaphore, threading.local)


def mutable_globals(module: types.ModuleType) -> list[str]:
    """Module globals that are dicts, lists, sets, locks, conditions, events or thread-locals (shared by every user
    of the module); imported modules, classes and functions are not state."""
    found = []
    for name, value in vars(module).items():
        if name.startswith("__"):
            continue
        if isinstance(value, (dict, list, set, bytearray, *_LOCK_TYPES)):
            found.append(f"{module.__name__}.{name}: {type(value).__name__}")
    return found


@pytest.mark.unit
def test_no_module_of_adafuse_models_holds_mutable_state():
    names = [m.name for m in pkgutil.iter_modules(adafuse.models.__path__)]
    found = [g for n in names for g in mutable_globals(importlib.import_module(f"adafuse.models.{n}"))]
    assert found == []
    assert len(names) >= 15  # every module was looked at


@pytest.mark.unit
def test_the_check_finds_each_kind_of_state():
    fake = types.ModuleType("fake")
    fake.GATE, fake.TURN, fake.LOCAL, fake.SEEN, fake.QUEUE = (threading.Condition(), threading.Lock(),
                                                                threading.local(), {}, [])
    fake.LIMIT, fake.NAMES = 8, ("a", "b")
    assert sorted(g.split(".")[1].split(":")[0] for g in mutable_globals(fake)) == ["GATE", "LOCAL", "QUEUE", "SEEN",
                                                                                    "TURN"]


@pytest.mark.unit
def test_two_registries_in_one_process_decode_side_by_side_as_each_does_alone():
    """Two registries (each loading its own tiny Llama and Gemma) decode 4 prompts each at once, in two threads at
    the same time: every trace is the trace that prompt gives alone; each registry's models share forwards among its
    own decodes only, under its own runtime."""
    registries = [ModelRegistry(loader=lambda name, *_: tiny_local(name)) for _ in range(2)]
    pairs = [[r.get("llama"), r.get("gemma")] for r in registries]
    assert all(lm.runtime is r.runtime for r, pair in zip(registries, pairs) for lm in pair)
    assert registries[0].runtime is not registries[1].runtime
    prompts = PROMPTS8[:4]
    alone = [AdaFuse(pairs[0], CFG).generate(p) for p in prompts]
    got: dict[int, list] = {}
    go = threading.Barrier(2)

    def decode(i):
        go.wait(10)
        got[i] = AdaFuse(pairs[i], CFG).generate_many(prompts, concurrency=4)
    threads = [threading.Thread(target=decode, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(2):
        assert all(_same(a, g) for a, g in zip(alone, got[i])), [t.output for t in got[i]]
        for lm in pairs[i]:
            assert lm.batcher.runtime is registries[i].runtime and lm.batcher.queue == []
            assert lm.batcher.peak_requests > 1  # its decodes did share forwards


@pytest.mark.unit
def test_the_docs_quote_the_measured_packed_forwards_and_runtime_runs():
    """docs/many-decodes.md's table of packed-forward milliseconds is the results file's, number for number; the
    before/after examples per minute it quotes are in the A/B run's file."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    measured = {}
    for line in (root / "results/bench/packed_attention.txt").read_text().splitlines()[3:]:
        model, n, shape, loop, one, rows = re.match(r"(\S+)\s+(\d+)\s+(.+?)\s{2,}(\S+)\s+(\S+)\s+(\S+)", line).groups()
        measured[(model.split("-")[0], n, shape)] = (loop, one, rows)
    page = (root / "docs" / "many-decodes.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| ([a-z0-9 +]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$",
                      page, re.M)
    assert len(rows) == 12
    for n, shape, *ms in rows:
        assert (tuple(ms[:3]), tuple(ms[3:])) == (measured[("smollm2", n, shape)], measured[("gemma3", n, shape)])
    ab = (root / "results/bench/runtime_ab.txt").read_text()
    quoted = re.search(r"runtime_ab\.txt`\): ([\d.]+) / ([\d.]+) and ([\d.]+) / ([\d.]+) examples/min at 8", page)
    at8 = re.findall(r"^8\s+([\d.]+)", ab, re.M)  # old, new, old, new
    assert quoted and list(quoted.groups()) == [at8[0], at8[2], at8[1], at8[3]]
