"""Many decodes at once (`python -m adafuse.harness.bench --concurrency 1 2 4 8 16`): the same prompts decoded with
1, 2, 4, … decodes in flight, the levels interleaved (each level runs twice, in the given order and then in reverse,
so a busy spell on the machine does not land on one level); examples per minute and seconds per word per level, the
speed-up over one at a time, what the models' batchers carried (decodes per forward, the largest forward) and whether
every trace is the one decoded alone (the first difference is shown with its margin when one is not)."""
from __future__ import annotations

import resource
import statistics
import time

from ..ensemble import AdaFuse
from ..report import format_table
from ..trace import Trace


def first_difference(alone: Trace, shared: Trace) -> str:
    """Where `shared` departs from `alone` (round, texts, and the fused-score margin alone had there), or ""."""
    for a, b in zip(alone.rounds, shared.rounds):
        if a.text != b.text or a.chosen != b.chosen:
            fused = sorted(c.fused for c in a.candidates if c.fused is not None)
            margin = f"; alone its best two fused scores were {fused[1] - fused[0]:.2e} apart" if len(fused) > 1 else ""
            return f"round {a.index}: alone {a.text!r}, in company {b.text!r}{margin}"
    if alone.output != shared.output or len(alone.rounds) != len(shared.rounds):
        return f"output: alone {alone.output!r}, in company {shared.output!r}"
    return ""


def interleaved(levels: list[int], rounds: int) -> list[int]:
    """The order the levels run in: as given, then reversed, `rounds` times in all (a busy spell hits no one level)."""
    return [lv for r in range(rounds) for lv in (levels if r % 2 == 0 else levels[::-1])]


def batcher_counts(models) -> tuple[int, int, int, int]:
    """Forwards, requests, the most requests and positions in one forward, summed over the models' batchers."""
    bs = [m.batcher for m in models if hasattr(m, "batcher")]
    return (sum(b.forwards for b in bs), sum(b.requests for b in bs), max((b.peak_requests for b in bs), default=0),
            max((b.peak_positions for b in bs), default=0))


def concurrency_bench(models, work, levels: list[int], rounds: int = 2) -> int:
    """`work`: (task, prompt, DecodeConfig) items; prints the table and returns 1 when a trace differed."""
    levels = list(dict.fromkeys(levels))
    base = 1 if 1 in levels else levels[0]
    order = interleaved(levels, rounds)
    walls: dict[int, list[float]] = {lv: [] for lv in levels}
    traces: dict[int, list[Trace]] = {}
    carried: dict[int, list[tuple[int, int, int, int]]] = {lv: [] for lv in levels}
    # warm-up: the first decode of a process pays one-time costs (allocator, kernels, the prompts' shared prefix)
    AdaFuse(models, work[0][2], tau=0.7).generate(work[0][1])
    for lv in order:
        before = batcher_counts(models)
        for b in (m.batcher for m in models if hasattr(m, "batcher")):
            b.peak_requests = b.peak_positions = 0
        t0 = time.perf_counter()
        out = _decode_all(models, work, lv)
        walls[lv].append(time.perf_counter() - t0)
        after = batcher_counts(models)
        carried[lv].append((after[0] - before[0], after[1] - before[1], after[2], after[3]))
        traces.setdefault(lv, out)
        print(f"  concurrency {lv}: {walls[lv][-1]:.1f} s", flush=True)
    words = sum(t.words for t in traces[base])
    rows, differed = [], 0
    one = statistics.median(walls[base])
    for lv in levels:
        wall = statistics.median(walls[lv])
        diffs = [(i, first_difference(a, b)) for i, (a, b) in enumerate(zip(traces[base], traces[lv]))]
        diffs = [(i, d) for i, d in diffs if d]
        differed += len(diffs)
        fwd, req, peak_req, peak_pos = (max(c[k] for c in carried[lv]) if k >= 2 else sum(c[k] for c in carried[lv])
                                        for k in range(4))
        rows.append({"in flight": lv, "examples/min": round(60 * len(work) / wall, 1),
                     "s/word": round(wall / max(1, words), 3), "× one at a time": round(one / wall, 2),
                     "requests/forward": round(req / max(1, fwd), 2), "largest forward (requests, positions)":
                     f"{peak_req}, {peak_pos}", "same traces": f"{len(work) - len(diffs)}/{len(work)}",
                     "wall s (runs)": " / ".join(f"{w:.0f}" for w in walls[lv])})
        for i, d in diffs[:3]:
            print(f"  differs at concurrency {lv}, prompt {i} ({work[i][0]}): {d}")
    print(format_table(rows))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    caps = ", ".join(f"{m.name}: {m.batcher.max_rows} rows, {m.batcher.max_tokens} positions per forward"
                     for m in models if hasattr(m, "batcher"))
    print(f"{len(work)} prompts, {words} words alone; caps {caps}; peak RSS {rss:.0f} MiB")
    return 1 if differed else 0


def _decode_all(models, work, concurrency: int) -> list[Trace]:
    from ..many import run_many
    return list(run_many([lambda p=prompt, c=cfg: AdaFuse(models, c, tau=0.7).generate(p) for _, prompt, cfg in work],
                         concurrency))
