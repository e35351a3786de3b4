"""Memory soak: the app's controller driven as visitors would for N runs; says whether RSS levels off (python -m bench.soak).

Each run is one kind of use (PLAN), with new Explorer sessions as new visitors arrive, all kept as gr.State keeps them.
After each run it measures RSS (anonymous and file-backed), glibc's heap (in use, free inside its arenas, mmapped),
the tensors alive (outside the weights; in prefix stores; in decodes' views) and the app objects alive; it prints a
row every --every runs and a verdict from the numbers (growth over the last half of the runs against the first half).
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter

import torch

from adafuse import DecodeConfig
from adafuse.errors import AdafuseError
from adafuse.models import DEFAULT_PAIR, LocalModel, free_unused_memory
from app.controller import COMPARE_METHODS, MODELS, Explorer

MIB = 2**20
# The mixed runs, one per run in this order, over and over: the kinds of use the report saw (evaluations, long
# prompts, five-model attempts, branches) and what the page does around them.
PLAN = ("decode", "compare", "long", "invalid", "evaluate", "open", "abandon", "stops", "long_same", "chat")
WORDS = ("the of and to in is was for on that with as by at from his her it an were are which this be or has had "
         "river city king war people year church music school water light night house story world road").split()
QUESTIONS = ("Who wrote Hamlet?", "What is the capital of France?", "How many legs has a spider?",
             "Which planet is the largest?", "What colour is the sky?", "Who painted the Mona Lisa?")


# ---- what the process holds ----
class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_HAS_MALLINFO2 = hasattr(_LIBC, "mallinfo2")
if _HAS_MALLINFO2:
    _LIBC.mallinfo2.restype = _Mallinfo2


def proc_status() -> dict[str, int]:
    """VmRSS, RssAnon, RssFile (KiB) and Threads from /proc/self/status."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
                out[key] = int(value.split()[0])
    return out


def malloc_state() -> dict[str, float]:
    """glibc's view of the C heap (MiB): bytes in use, free bytes kept inside its arenas (fragmentation: RSS that no
    object holds) and bytes in mmapped blocks. Empty where mallinfo2 is missing (not glibc ≥ 2.33)."""
    if not _HAS_MALLINFO2:
        return {}
    m = _LIBC.mallinfo2()
    return {"heap_used": m.uordblks / MIB, "heap_free": m.fordblks / MIB, "mmapped": m.hblkhd / MIB}


def live_objects() -> dict[str, float]:
    """Tensors reachable by the garbage collector (their distinct storages, MiB, and how many), the app objects alive,
    and the KV bytes each model's prefix store holds."""
    storages, tensors, held = {}, 0, {}
    kinds = Counter()
    for obj in gc.get_objects():
        name = type(obj).__name__
        if name == "LocalSession":
            held.update(_tensors_of(obj))
        if name in ("Explorer", "Decoding", "LocalSession", "DynamicCache", "Trace", "Workers"):
            kinds[name] += 1
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            tensors += 1
            try:
                s = obj.untyped_storage()
                storages[s.data_ptr()] = s.nbytes()
            except (RuntimeError, NotImplementedError):
                pass
    weights = sum(p.untyped_storage().nbytes() for lm in MODELS.loaded() if isinstance(lm, LocalModel)
                  for p in (*lm.model.parameters(), *lm.model.buffers()))
    prefix = {}
    for lm in MODELS.loaded():
        if isinstance(lm, LocalModel):
            for entry in lm.prefixes.entries:  # (ids, cache, bytes): the storages its views keep alive
                prefix.update(_tensors_of(entry[1]))
    return {"tensors": (sum(storages.values()) - weights) / MIB, "n_tensors": tensors,
            "prefix_kv": sum(prefix.values()) / MIB, "session_kv": sum(held.values()) / MIB,
            **{k: kinds[k] for k in ("Explorer", "Decoding", "LocalSession", "DynamicCache", "Workers")}}


def _tensors_of(obj, depth: int = 0) -> dict[int, int]:
    """{storage address: bytes} of the tensors `obj` holds: its attributes, dicts, lists and tuples, a cache's layers
    (a few levels deep: a session's cache, adoptable KV, verified drafts, log-probs)."""
    out: dict[int, int] = {}
    if isinstance(obj, torch.Tensor):
        s = obj.untyped_storage()
        return {s.data_ptr(): s.nbytes()}
    if depth > 4 or isinstance(obj, (str, bytes, int, float, type(None))):
        return out
    if isinstance(obj, dict):
        children = list(obj.keys()) + list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        children = list(obj)
    elif hasattr(obj, "layers") and not isinstance(obj, torch.nn.Module):  # a transformers cache
        children = [t for layer in obj.layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))]
    elif hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, LocalModel)):
        children = list(vars(obj).values())
    else:
        return out
    if len(children) > 10_000:  # token lists, vocabularies: no tensors there
        return out
    for child in children:
        out.update(_tensors_of(child, depth + 1))
    return out


def snapshot(run: int, kind: str, seconds: float) -> dict:
    st = proc_status()
    return {"run": run, "kind": kind, "seconds": seconds, "rss": st["VmRSS"] / 1024, "anon": st["RssAnon"] / 1024,
            "file": st["RssFile"] / 1024, "threads": st["Threads"],
            **malloc_state(), **live_objects()}


# ---- what visitors do ----
def long_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


class Visitors:
    """Explorer sessions as the page's gr.State keeps them: one per visitor, each kept until `keep` newer visitors
    came (gradio keeps a closed tab's state for an hour: within a soak, every visitor; None keeps all)."""

    def __init__(self, keep: int | None):
        if keep is not None and keep < 1:
            raise ValueError(f"keep={keep}: keep at least the current visitor's session (or None: all)")
        self.keep, self.sessions = keep, []

    def new(self) -> Explorer:
        ex = Explorer()
        self.sessions.append(ex)
        if self.keep is not None:
            del self.sessions[: -self.keep]
        return ex

    @property
    def current(self) -> Explorer:
        return self.sessions[-1] if self.sessions else self.new()


class Soak:
    def __init__(self, args):
        self.args, self.rng = args, random.Random(args.seed)
        self.names = list(args.models)
        self.visitors = Visitors(args.keep)
        self.passages = [long_text(random.Random(args.seed + i), args.long_words) for i in range(args.passages)]
        self.exports: list[str] = []
        self.errors = Counter()
        self.unfinished = 0  # abandoned decodes left unfinished (as a closed tab leaves them)

    def cfg(self, **kw) -> DecodeConfig:
        base = {"max_new_words": self.args.max_new_words, "max_new_tokens": 4 * self.args.max_new_words,
                "stop": ("\n",)}
        return DecodeConfig(**{**base, **kw})

    def decode(self, ex: Explorer, cfg: DecodeConfig, prompt: str):
        d = ex.begin(self.names, cfg, prompt, resume=True)
        while not d.done:
            d.step()
        return d

    def look_around(self, ex: Explorer, reload: bool = False) -> None:
        """What a visitor does with a finished trace: the Tokens view, a branch, the export (`reload`: read back)."""
        t = ex.trace
        if t is None or not t.rounds:
            return
        ex.tokens(0, t.rounds[0].chosen)
        pick = next(((r, c) for r, rnd in enumerate(t.rounds) for c in range(len(rnd.candidates))
                     if c != rnd.chosen), None)
        if pick is not None:
            for _ in ex.branch(*pick):
                pass
        path = ex.export()
        if path:
            self.exports.append(os.path.dirname(path))
            if reload:
                ex.load_trace(path)

    def run(self, kind: str) -> None:
        a, rng = self.args, self.rng
        q = rng.choice(QUESTIONS)
        if kind == "decode":
            ex = self.visitors.new()
            self.decode(ex, self.cfg(), f"Question: {q}\nAnswer:")
            for _ in ex.run_singles(self.names, ex.decoding.config, ex.trace.prompt):
                pass
            self.look_around(ex)
        elif kind == "compare":
            ex = self.visitors.current
            cfg = self.cfg()
            prompt = f"Question: {q}\nAnswer:"
            self.decode(ex, cfg, prompt)
            for _ in ex.run_others(self.names, cfg, prompt, list(COMPARE_METHODS)[:1]):
                pass
            self.look_around(ex, reload=True)
        elif kind in ("long", "long_same"):
            # "long": a passage of thousands of words cycling among a few (more than a prefix store keeps);
            # "long_same": the last passage again with another question (its prefix is reused)
            i = (self.long_i if kind == "long_same" else rng.randrange(len(self.passages)))
            self.long_i = i
            ex = self.visitors.new()
            self.decode(ex, self.cfg(max_new_words=2), f"{self.passages[i]}\n\nQuestion: {q}\nAnswer:")
            self.look_around(ex)
        elif kind == "invalid":
            ex = self.visitors.new()
            for names, prompt in ((self.names * 2 + self.names[:1], "Q"), ([self.names[0], "no-such/model-xyz"], "Q"),
                                  (self.names, "   ")):
                try:
                    ex.begin(names, self.cfg(), prompt, resume=True)
                    self.errors["accepted"] += 1
                except AdafuseError as exc:
                    self.errors[type(exc).__name__] += 1
        elif kind == "evaluate":
            ex = self.visitors.new()
            ex.evaluate("squad", a.eval_lines, ["adafuse", "greedy"], self.names,
                        {"max_new_words": a.max_new_words, "max_new_tokens": 4 * a.max_new_words})
        elif kind == "open":
            ex = self.visitors.current
            if not ex.eval_rows:
                return
            row = ex.eval_rows[rng.randrange(len(ex.eval_rows))]
            ex.open_example(row["line"], row["method"])
            self.look_around(ex)
        elif kind == "abandon":  # a visitor who pastes a long text, starts a decode and closes the tab after a round
            ex = self.visitors.new()
            prompt = f"{self.passages[getattr(self, 'long_i', 0)]}\n\nWrite a long story about it."
            d = ex.begin(self.names, self.cfg(max_new_words=40, stop=()), prompt, resume=True)
            d.step()
            self.unfinished += not d.done
        elif kind == "stops":  # stop strings proposed from each prompt: a new stop set per visitor
            ex = self.visitors.new()
            label = rng.choice(("Question", "Q", "Answer", "Input", "Text")) + str(rng.randrange(1000))
            self.decode(ex, self.cfg(stop=("\n", f"\n{label}:")), f"{label}: {q}\nAnswer:")
        elif kind == "chat":
            ex = self.visitors.new()
            self.decode(ex, self.cfg(mode="chat"), q)
            self.look_around(ex)

    def cleanup(self) -> None:
        for d in {p for p in self.exports if p}:
            shutil.rmtree(d, ignore_errors=True)


def verdict(rows: list[dict], key: str = "rss", window: int = 10) -> str:
    """Levels off when the growth over the last half of the runs is at most a quarter of the growth over the first
    half, or within 2 % of the RSS (noise): each endpoint the mean of `window` samples, from the first run on (the
    models' weights are paged in by the first decode)."""
    vals = [r[key] for r in rows[1:]]
    n = len(vals) - 1
    if n < 4:
        return "too few runs for a verdict"
    w = max(1, min(window, n // 4))
    start, mid, end = (statistics.mean(vals[i: i + w]) for i in (0, n // 2 - w // 2, n + 1 - w))
    first, last = mid - start, end - mid
    ok = last <= max(0.25 * first, 0.02 * mid)
    return (f"verdict: {'LEVELS OFF' if ok else 'STILL GROWING'} — {key} first half {first:+.0f} MiB, last half "
            f"{last:+.0f} MiB (start {start:.0f}, middle {mid:.0f}, end {end:.0f} MiB; levels off when the last "
            f"half grows ≤ max(¼ of the first half, 2 % of the middle))")


COLUMNS = ("run", "kind", "seconds", "rss", "anon", "file", "heap_used", "heap_free", "mmapped", "tensors", "prefix_kv",
           "session_kv", "n_tensors", "Explorer", "Decoding", "LocalSession", "DynamicCache", "Workers", "threads")


def print_row(r: dict) -> None:
    print("  ".join(f"{r[c]:>9.0f}" if isinstance(r.get(c), float) else f"{r.get(c, '')!s:>9}"
                    for c in COLUMNS), flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--models", nargs="+", default=list(DEFAULT_PAIR))
    p.add_argument("--max-new-words", type=int, default=3)
    p.add_argument("--long-words", type=int, default=1500, help="words in each long prompt")
    p.add_argument("--passages", type=int, default=3, help="distinct long passages the long runs cycle among")
    p.add_argument("--eval-lines", type=int, default=1)
    p.add_argument("--keep", type=int, default=None, help="visitors' sessions kept (default all, as gradio keeps a "
                                                          "closed tab's state for an hour)")
    p.add_argument("--every", type=int, default=10, help="print a row every this many runs")
    p.add_argument("--collect", action="store_true", help="gc.collect() after each run (reference cycles)")
    p.add_argument("--trim", action=argparse.BooleanOptionalAction, default=True,
                   help="hand freed memory back after each run, as the app's handlers do (free_unused_memory; "
                        "--no-trim: without it)")
    p.add_argument("--max-rss-gib", type=float, default=10.0, help="stop early once RSS passes this (a soak that "
                                                                      "does not level off must not take the machine)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the unknown model id is refused without asking the network
    print(f"soak: {args.runs} runs of {', '.join(PLAN)}; models {', '.join(args.models)}; "
          f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', 'unset')}; torch threads {torch.get_num_threads()}; "
          f"collect={args.collect} trim={args.trim} keep={args.keep}", flush=True)
    # the soak's temporary folders (exports, evaluations) in one folder of its own: counted, then removed
    tempfile.tempdir = tempfile.mkdtemp(prefix="adafuse-soak-")
    soak = Soak(args)
    t0 = time.perf_counter()
    for n in soak.names:
        MODELS.get(n)
    gc.collect()
    rows = [snapshot(0, "loaded", time.perf_counter() - t0)]
    print("  ".join(f"{c:>9}" for c in COLUMNS))
    print_row(rows[0])
    for i in range(1, args.runs + 1):
        kind = PLAN[(i - 1) % len(PLAN)]
        t = time.perf_counter()
        soak.run(kind)
        if args.collect:
            gc.collect()
        trim_ms = 0.0
        if args.trim:
            t_trim = time.perf_counter()
            free_unused_memory()
            trim_ms = 1000 * (time.perf_counter() - t_trim)
        rows.append({**snapshot(i, kind, time.perf_counter() - t), "trim_ms": trim_ms})
        stop = rows[-1]["rss"] > args.max_rss_gib * 1024
        if i % args.every == 0 or i == args.runs or stop:
            print_row(rows[-1])
        if stop:
            print(f"stopped after run {i}: RSS {rows[-1]['rss']:.0f} MiB passed --max-rss-gib {args.max_rss_gib}")
            break
    soak.cleanup()
    left = os.listdir(tempfile.tempdir)  # what the app left behind: the evaluations' result folders nobody removes
    shutil.rmtree(tempfile.tempdir, ignore_errors=True)
    peak = max(r["rss"] for r in rows)
    by_kind = Counter()
    for r in rows[1:]:
        by_kind[r["kind"]] += r["seconds"]
    print(f"total {time.perf_counter() - t0:.0f} s; seconds by kind: "
          + ", ".join(f"{k} {v:.0f}" for k, v in by_kind.most_common()))
    if args.trim:
        print(f"malloc_trim after each run: {statistics.mean(r['trim_ms'] for r in rows[1:]):.0f} ms on average, "
              f"{max(r['trim_ms'] for r in rows[1:]):.0f} ms at most")
    print(f"peak rss {peak:.0f} MiB; refused attempts {dict(soak.errors)}; abandoned unfinished: {soak.unfinished}; "
          f"adafuse-* temp dirs left: {len(left)}")
    if rows[-1].get("heap_free") is not None:
        free_unused_memory()
        after = proc_status()["VmRSS"] / 1024
        print(f"malloc_trim at the end: rss {rows[-1]['rss']:.0f} → {after:.0f} MiB (heap free before "
              f"{rows[-1]['heap_free']:.0f} MiB)")
    print(verdict(rows))
    print(verdict(rows, "anon"))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
