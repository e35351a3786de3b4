"""Four visitors at once: how soon each one's first round arrives, against a lone visitor's (python -m bench.first_round).

The end-to-end browser test (tests/test_app_e2e.py) has four visitors press Run together on four examples and aims
at the slowest first round under 2× a lone visitor's. This measures the same through the library, without the page,
and says what the machine allows: each visitor's prompt has to be prefilled by both models before its first round,
and a prefill is compute: four prompts in one packed forward cost nearly what they cost one by one, so the fourth
visitor pays for every prefill before its own round can start. The floor printed is the four prompts' prefill in one
packed forward per model (measured) plus the longest lone first round without its prefill (its round-0 forwards,
as if shared for free).

Prefix stores are emptied before every measurement (each visitor's prompt is new to the server); each level is
measured --reps times, interleaved.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from contextlib import nullcontext

from transformers import DynamicCache

from adafuse import AdaFuse, DecodeConfig
from adafuse.models import DEFAULT_PAIR, get_model
from adafuse.models.batching import Rider
from adafuse.models.lean import lean
from adafuse.stops import parse_stops
from app.controller import load_examples

# the browser test's four examples (tests/test_app_e2e.py FOUR)
FOUR = ("QA · tallest mountain", "Reading · lighthouse", "Translate · German → English", "QA · author of Hamlet")


def app_config(example: dict) -> DecodeConfig:
    """What the page decodes an example with: its mode, stop and word cap, and the page's defaults where they differ
    from the library's (Max new tokens 1024: app/layout.py)."""
    return DecodeConfig(max_new_words=example["max_words"], max_new_tokens=1024, stop=parse_stops(example["stop"]),
                        mode=example["mode"])


def forget_prompts(models) -> None:
    for lm in models:
        lm.prefixes.clear()


def first_rounds(models, examples, together: bool, lean_threads: bool) -> list[float]:
    """Seconds from start to each decode's first round; the decodes then run to their end (as the page's do)."""
    out = [0.0] * len(examples)
    go = threading.Barrier(len(examples) if together else 1)

    def visit(i: int) -> None:
        with lean() if lean_threads else nullcontext():
            go.wait()
            t0 = time.perf_counter()
            d = AdaFuse(models, app_config(examples[i])).start(examples[i]["prompt"])
            d.step()
            out[i] = time.perf_counter() - t0
            while not d.done:
                d.step()

    if together:
        threads = [threading.Thread(target=visit, args=(i,)) for i in range(len(examples))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(len(examples)):
            visit(i)
    return out


def prefill_seconds(lm, prompts: list[str], together: bool) -> float:
    """Wall seconds to prefill `prompts` through the model's batcher: one after another, or all at once (their
    requests gathered into one packed forward: each a working rider, so the batcher waits for the others)."""
    rows = [lm.tokenizer(p)["input_ids"] for p in prompts]
    if not together:
        t0 = time.perf_counter()
        for r in rows:
            lm.batcher.forward([r], DynamicCache(), keep=1)
        return time.perf_counter() - t0
    go = threading.Barrier(len(rows) + 1)

    def one(r):
        with Rider().working() as rider:
            lm.expect(rider)
            go.wait()
            lm.batcher.forward([r], DynamicCache(), keep=1)

    threads = [threading.Thread(target=one, args=(r,)) for r in rows]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.first_round", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(DEFAULT_PAIR))
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--lean", action="store_true", help="each visitor's thread does its own small tensor work on one "
                   "CPU thread (as `run_many` and the server's pool do); the page's handler threads do not")
    p.add_argument("--out", help="write the numbers here (JSON)")
    a = p.parse_args(argv)
    by_label = {e["label"]: e for e in load_examples()}
    examples = [by_label[label] for label in FOUR]
    models = [get_model(n) for n in a.models]
    first_rounds(models, examples[:1], together=False, lean_threads=False)  # warm-up: kernels chosen, batchers made
    alone, together = [], []
    for _ in range(a.reps):
        forget_prompts(models)
        alone.append(first_rounds(models, examples, together=False, lean_threads=a.lean))
        forget_prompts(models)
        together.append(first_rounds(models, examples, together=True, lean_threads=a.lean))
    prompts = [e["prompt"] for e in examples]
    prefill = {lm.name: {"one by one": prefill_seconds(lm, prompts, False), "packed": prefill_seconds(lm, prompts, True)}
               for lm in models}
    lone = [statistics.median(x) for x in zip(*alone)]
    tog = [statistics.median(x) for x in zip(*together)]
    # each prompt's own prefill by every model, alone
    own_prefill = [sum(prefill_seconds(lm, [p], False) for lm in models) for p in prompts]
    floor = sum(v["packed"] for v in prefill.values()) + max(a_ - p_ for a_, p_ in zip(lone, own_prefill))
    print(f"{'example':32} {'alone s':>8} {'together s':>11} {'ratio':>6} {'own prefill s':>14}")
    for e, a_, t_, p_ in zip(examples, lone, tog, own_prefill):
        print(f"{e['label']:32} {a_:8.2f} {t_:11.2f} {t_ / a_:6.2f} {p_:14.2f}")
    print(f"slowest together ÷ mean alone: {max(tog) / statistics.mean(lone):.2f} (target < 2); "
          f"slowest together ÷ its own alone: {max(t / a for t, a in zip(tog, lone)):.2f}")
    for name, v in prefill.items():
        print(f"prefill of the four prompts, {name}: one by one {v['one by one']:.2f} s, in one packed forward "
              f"{v['packed']:.2f} s")
    print(f"floor for the slowest (four prefills packed + the longest round 0 without its prefill): {floor:.2f} s = "
          f"{floor / statistics.mean(lone):.2f}× the mean lone first round")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"alone": alone, "together": together, "prefill": prefill, "own_prefill": own_prefill,
                       "floor": floor, "lean": a.lean}, f, indent=1)


if __name__ == "__main__":
    main()
