"""Benchmark: `python -m adafuse.harness.bench` prints per-method cost on TriviaQA and GSM8K with two models (the
bundled pair unless `--models`), each ensemble method run twice: models one after another (sequential, every core for
each model) and side by side (parallel, one worker per model with the cores shared out); AdaFuse B=3 with
exploration="embedding" adds what choosing the explored first tokens costs per uncertain round, beside the surface
strategy's."""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..models.packed import ATTENTION_MODES
from ..config import DecodeConfig
from ..costs import SPEC_COUNTERS
from ..method_registry import from_spec
from ..ensemble import AdaFuse, greedy
from ..models import DEFAULT_PAIR, get_model
from ..report import format_table
from .tasks import data_dir
from ..trace import Trace


def tasks(data: Path, n_trivia: int, n_gsm: int) -> list[tuple[str, str, DecodeConfig]]:
    out = []
    head = (data / "triviaqa" / "prompt.txt").read_text()
    for line in (data / "triviaqa" / "dev.jsonl").read_text().splitlines()[:n_trivia]:
        q = json.loads(line)["question"]
        out.append(("triviaqa", f"{head}\n\nQuestion: {q}\nAnswer:", DecodeConfig(stop=("\n",), max_new_words=32)))
    head = (data / "gsm8k" / "prompt.txt").read_text()
    for line in (data / "gsm8k" / "test300.jsonl").read_text().splitlines()[:n_gsm]:
        q = json.loads(line)["question"]
        out.append(("gsm8k", f"{head}\n\nQuestion: {q}\nLet's think step by step\n",
                    DecodeConfig(stop=("\n\nQuestion:",), max_new_words=200, max_new_tokens=400)))
    return out


def quarter_ratio(trace: Trace) -> tuple[float, float, float] | None:
    """Last quarter of the words ÷ first quarter (decode rounds only): seconds per word, forward passes (all models)
    per word, seconds per forward pass. The first says whether a word costs more late in a long answer; the other two
    say whether that is more work per word (the decoder's choices) or dearer work (context, tokenizer)."""
    total = trace.words
    if total < 8:
        return None
    q = total / 4
    first, last = [0.0, 0, 0], [0.0, 0, 0]  # seconds, words, forward passes
    done = 0
    for r in trace.rounds:
        mid = done + r.words / 2
        part = first if mid < q else last if mid >= total - q else None
        if part is not None:
            part[0] += r.seconds
            part[1] += r.words
            part[2] += sum(x.forward_passes for x in r.steps)
        done += r.words
    if not (first[1] and last[1] and first[2] and last[2]):
        return None
    return ((last[0] / last[1]) / (first[0] / first[1]), (last[2] / last[1]) / (first[2] / first[1]),
            (last[0] / last[2]) / (first[0] / first[2]))


def cpu_step_seconds(models, context: int = 500, steps: int = 16) -> tuple[int, int, list[tuple[str, float, float]]]:
    """Each CPU model's single-token step (most of a round) at `context` tokens of context, on this process's torch
    threads and on its share of them side by side: (threads, share, [(name, seconds on threads, seconds on share)]).
    Best of three runs of `steps` steps, each on a fresh prefix (sliding-window layers cannot be cropped back)."""
    from ..parallel import cpu_threads_per_model
    if any(lm.device.type != "cpu" for lm in models):
        raise ValueError("the side-by-side floor is measured for models on this machine's CPU")
    share, every = cpu_threads_per_model(len(models)), torch.get_num_threads()

    def step_seconds(lm, threads: int) -> float:
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            best = float("inf")
            with torch.inference_mode():
                for _ in range(3):
                    cache = lm.model(input_ids=torch.arange(100, 100 + context)[None], use_cache=True,
                                     logits_to_keep=1).past_key_values
                    t0 = time.perf_counter()
                    for t in range(steps):
                        lm.model(input_ids=torch.tensor([[200 + t]]), past_key_values=cache, use_cache=True,
                                 logits_to_keep=1)
                    best = min(best, (time.perf_counter() - t0) / steps)
            return best
        finally:
            torch.set_num_threads(old)

    return every, share, [(lm.name, step_seconds(lm, every), step_seconds(lm, share)) for lm in models]


def floor_ratio(timings: list[tuple[str, float, float]]) -> float:
    """Side by side over one after another for single-token steps alone: the slower model on its share of the
    threads (a round side by side waits for it) over every model on all of them, added up."""
    return max(b for _, _, b in timings) / sum(a for _, a, _ in timings)


def side_by_side_floor(models, context: int = 500, steps: int = 16) -> list[str]:
    """`cpu_step_seconds` and `floor_ratio` as the benchmark prints them. An estimate of the best side by side can do
    here, not a bound: a round also holds batched forwards, which gain differently from threads, and tokenizer and
    Python work, which can overlap side by side."""
    every, share, timings = cpu_step_seconds(models, context, steps)
    lines = [f"Side by side's floor on this CPU (single-token steps at {context} tokens, ms per step; {every} thread(s) "
             f"one after another, {share} each side by side):"]
    lines += [f"  {name}: {1000 * a:.1f} ms on {every} thread(s), {1000 * b:.1f} ms on {share}" for name, a, b in timings]
    lines.append(f"  one after another {1000 * sum(a for _, a, _ in timings):.1f} ms a step for all models; side by side "
                 f"at best the slower model's {1000 * max(b for _, _, b in timings):.1f} ms = {floor_ratio(timings):.2f}× "
                 "(single-token steps alone: expect the '÷ sequential' column no lower than about this)")
    return lines


def _parser() -> argparse.ArgumentParser:
    """The benchmark's command line."""
    p = argparse.ArgumentParser(prog="python -m adafuse.harness.bench", description=__doc__)
    p.add_argument("--data", type=Path, default=None, help="folder with triviaqa/ and gsm8k/ (default: tasks.data_dir())")
    p.add_argument("--trivia", type=int, default=20)
    p.add_argument("--gsm8k", type=int, default=5)
    p.add_argument("--models", nargs=2, default=list(DEFAULT_PAIR))
    p.add_argument("--out", type=Path, help="write every trace here (JSONL)")
    p.add_argument("--only", nargs="+", metavar="TEXT", help="run only the methods whose name contains one of these")
    p.add_argument("--remote", action="store_true",
                   help="instead: the first model served by a vLLM server started here (./dev vllm) vs local, "
                        "on the TriviaQA questions")
    p.add_argument("--concurrency", nargs="+", type=int, metavar="N",
                   help="instead: AdaFuse B=3 with N decodes in flight at each of these levels (bench_many.py; "
                        "e.g. --concurrency 1 2 4 8 16 --trivia 32 --gsm8k 8)")
    p.add_argument("--rounds", type=int, default=2, metavar="R",
                   help="with --concurrency: runs of each level (2: in the given order, then in reverse)")
    p.add_argument("--speculate", action=argparse.BooleanOptionalAction, default=DecodeConfig.speculate,
                   help="with --concurrency: speculative proposals on or off (the library's default: on; compare "
                        "--no-speculate, same prompts)")
    p.add_argument("--attention", choices=ATTENTION_MODES, default="auto",
                   help="with --concurrency: how a packed forward's attention runs (models/packed.py; default auto)")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    args.data = args.data or data_dir()  # found now, not at import
    if args.remote:
        return remote_bench(args)
    models = [get_model(m) for m in args.models]
    for lm in models:
        if hasattr(lm, "batcher"):
            lm.batcher.attention = args.attention
    if args.concurrency:
        from ..many import check_concurrency
        from .bench_many import concurrency_bench
        work = [(t, prompt, replace(cfg, branches=3, speculate=args.speculate))
                for t, prompt, cfg in tasks(args.data, args.trivia, args.gsm8k)]
        return concurrency_bench(models, work, [check_concurrency(n) for n in args.concurrency], args.rounds)
    methods = _methods()
    work = tasks(args.data, args.trivia, args.gsm8k)
    side_by_side = any(n.endswith(" parallel") and (not args.only or any(o in n for o in args.only)) for n in methods)
    floor = side_by_side_floor(models) if side_by_side and all(m.device.type == "cpu" for m in models) else []
    # one untimed decode first: the first decode of a process pays one-time costs (allocator, first kernels, the
    # prompt's prefix), which would otherwise land on whichever method the table lists first
    for kw in (dict(parallel=False), dict(parallel=True)):
        for _ in AdaFuse(models, replace(work[0][2], max_new_words=8), tau=0.7, **kw).start(work[0][1]):
            pass
    tables = _Tables()
    sink = args.out.open("w") if args.out else None
    for task in ("triviaqa", "gsm8k"):
        items = [(prompt, cfg) for t, prompt, cfg in work if t == task]
        if items:
            _bench_task(task, items, models, methods, args.only, tables, sink)
    _print_report(tables, models, floor)
    return 0


def _methods() -> dict[str, dict]:
    """The ensemble methods the table compares, by name: AdaFuse's and its settings."""
    methods = {}
    # without speculation, the algorithm's own forwards (the speculative rows below save some of them)
    for name, kw in (("AdaFuse B=1", dict(branches=1)), ("AdaFuse B=3", dict(branches=3)),
                     ("mixture (ME, greedy words)", dict(method="mixture[temperature=0]"))):
        methods[f"{name} sequential"] = dict(kw, parallel=False, speculate=False)
        methods[f"{name} parallel"] = dict(kw, parallel=True, speculate=False)
    # exploration by meaning (selection.py): its selection's cost per uncertain round is printed below the table
    methods["AdaFuse B=3 embedding sequential"] = dict(branches=3, exploration="embedding", parallel=False,
                                                       speculate=False)
    # speculative proposals: the same decodes, drafts verified in one forward; compared with the rows above
    # (with prompt lookup, and with the models' spans as the only drafts)
    for b in (1, 3):
        methods[f"AdaFuse B={b} speculative sequential"] = dict(branches=b, parallel=False, speculate=True)
        methods[f"AdaFuse B={b} speculative spans-only sequential"] = dict(branches=b, parallel=False, speculate=True,
                                                                           draft_lookup=False)
    return methods


@dataclass
class _Tables:
    """What the benchmark prints, gathered over the tasks."""
    rows: list[dict] = field(default_factory=list)         # the cost table: a row per task and method
    selecting: list[dict] = field(default_factory=list)    # choosing the explored first tokens, per method
    mixing: list[dict] = field(default_factory=list)       # the mixture against its writers alone
    speculating: list[dict] = field(default_factory=list)  # speculative rows against the same decodes without
    quarters: dict[str, list] = field(default_factory=dict)  # per method: `quarter_ratio` of its long GSM8K answers
    peaks: dict[str, int] = field(default_factory=dict)    # per model: its largest prefix copy, bytes
    order: list[str] = field(default_factory=list)         # every method's name, in the table's order


def _ensemble(models, prompt: str, cfg: DecodeConfig, kw: dict, acc: list, peaks: dict[str, int], seed: int) -> Trace:
    """One AdaFuse decode; its selection and explore-round seconds are added to `acc`, its prefix copies to `peaks`."""
    own = from_spec(kw.get("method", cfg.method))[0].Settings.__dataclass_fields__  # the mixture's seed: per prompt
    d = AdaFuse(models, cfg, tau=0.7, **kw, **({"seed": seed} if "seed" in own else {})).start(prompt)
    for _ in d:
        pass
    for s in d.sessions:
        peaks[s.name] = max(peaks.get(s.name, 0), s.peak_side_bytes)
        acc[0] += s.selection_seconds
        acc[1] += s.selections_made
    explored = [r for r in d.trace.rounds if any(st.mode == "explore" for st in r.steps)]
    acc[2] += sum(r.seconds for r in explored)
    acc[4] += len(explored)
    acc[3] += sum(r.seconds for r in d.trace.rounds)
    return d.trace


def _runs(models, methods: dict[str, dict], only, sel: dict[str, list], peaks: dict[str, int]) -> list:
    """(name, decode a prompt) for every method and each model alone, those `--only` names if given; an ensemble's
    selection seconds, selections, explore-round seconds, decode seconds and explore rounds go to `sel[name]`."""
    runs = [(name, lambda pr, c, seed, kw=kw, name=name: _ensemble(
        models, pr, c, kw, sel.setdefault(name, [0.0, 0, 0.0, 0.0, 0]), peaks, seed)) for name, kw in methods.items()]
    runs += [(f"{lm.name} alone", lambda pr, c, seed, lm=lm: greedy(lm, pr, c)) for lm in models]
    if only:
        runs = [(n, fn) for n, fn in runs if any(o in n for o in only)]
    return runs


def _add_trace(st: dict, tr: Trace, wall: float) -> None:
    """Add one decode (its trace and its wall seconds) to a method's totals."""
    st["wall"] += wall
    st["words"] += tr.words
    st["decode"] += sum(r.seconds for r in tr.rounds)
    st["rounds"] += len(tr.rounds)
    st["slower"] += sum(max(x.seconds for x in r.steps) for r in tr.rounds)
    st["sum"] += sum(sum(x.seconds for x in r.steps) for r in tr.rounds)
    st["outputs"].append(tr.output)
    for r in tr.rounds:  # the mixture: who wrote each word
        for x in r.steps:
            if x.mode == "write":
                st["writers"][x.model] = st["writers"].get(x.model, 0) + r.words
    for k, key in enumerate(SPEC_COUNTERS):
        st["spec"][k] += sum(getattr(x, key) for r in tr.rounds for x in r.steps)
    for m in tr.models:
        c, pre = tr.cost(m), tr.prefill[m]
        st[m][0] += c["forward_passes"] - pre["forward_passes"]
        st[m][1] += c["tokens_fed"] - pre["tokens_fed"]


def _bench_task(task: str, items: list, models, methods: dict[str, dict], only, tables: _Tables, sink) -> None:
    """Every method on each of one task's prompts (`items`: (prompt, config)); the task's rows go to `tables`, its
    traces to `sink` (if any)."""
    stats: dict[str, dict] = {}
    sel: dict[str, list] = {}
    runs = _runs(models, methods, only, sel, tables.peaks)
    tables.order += [name for name, _ in runs if name not in tables.order]
    for name, _ in runs:
        stats[name] = {"words": 0, "wall": 0.0, "decode": 0.0, "rounds": 0, "slower": 0.0, "sum": 0.0,
                       "outputs": [], "spec": [0] * len(SPEC_COUNTERS), "writers": {},
                       **{m.name: [0, 0] for m in models}}
    # every method on one prompt before the next prompt, starting one method further on each prompt: a drift of
    # the machine's speed (another process, the clock) lands on all methods alike instead of on whichever ran
    # last, and the methods compared below (speculative or not, side by side or not) run minutes apart at most.
    # The mixture draws its writers from `seed`: one seed per prompt (only the mixture reads it), else every
    # answer would have the same writer for its first word, its second, ... and the cost would follow whichever
    # model that one sequence favours
    for i, (prompt, cfg) in enumerate(items):
        for name, fn in runs[i % len(runs):] + runs[:i % len(runs)]:
            t0 = time.perf_counter()
            tr = fn(prompt, cfg, i)
            _add_trace(stats[name], tr, time.perf_counter() - t0)
            if task == "gsm8k" and tr.words >= 100:
                tables.quarters.setdefault(name, []).append(quarter_ratio(tr))
            if sink:
                sink.write(json.dumps({"task": task, "method": name, "trace": tr.to_dict()}) + "\n")
                sink.flush()
        print(f"  {task:8s} prompt {i + 1}/{len(items)} done", file=sys.stderr, flush=True)
    for name, st in stats.items():
        print(f"  {task:8s} {name:28s} {st['words']:5d} words {st['wall']:7.1f}s", file=sys.stderr, flush=True)
    _add_rows(task, stats, models, len(items), tables)
    for name, (secs, count, explore_s, decode_s, n_explored) in sel.items():
        if count:
            tables.selecting.append({
                "task": task, "method": name, "explore steps": count, "explore rounds": n_explored,
                "selection ms/step": round(1000 * secs / count, 2),
                "explore round ms": round(1000 * explore_s / max(1, n_explored), 1),
                "% of explore rounds": round(100 * secs / explore_s, 2) if explore_s else None,
                "% of decode": round(100 * secs / decode_s, 2) if decode_s else None})


def _s_per_word(st: dict) -> float:
    """A method's decode seconds per word."""
    return st["decode"] / max(1, st["words"])


def _fwd_per_word(st: dict, models) -> float:
    """A method's forward passes (all models) per word."""
    return sum(st[m.name][0] for m in models) / max(1, st["words"])


def _add_rows(task: str, stats: dict[str, dict], models, prompts: int, tables: _Tables) -> None:
    """One task's rows of the cost table, and of the mixture's and the speculative proposals' tables."""
    single = sum(_s_per_word(stats[f"{m.name} alone"]) for m in models if f"{m.name} alone" in stats) or float("nan")
    alone = {m.name: stats[f"{m.name} alone"] for m in models if f"{m.name} alone" in stats}
    for name, st in stats.items():
        row = _cost_row(task, name, st, stats, models, single)
        tables.rows.append(row)
        if st["writers"] and len(alone) == len(models):  # against the writers' own speed, word by word
            tables.mixing.append(_mixing_row(task, name, st, alone, models, row))
        plain = stats.get(re.sub(r" speculative( spans-only)?", "", name)) if " speculative" in name else None
        if plain:
            tables.speculating.append(_speculating_row(task, name, st, plain, models, prompts))


def _cost_row(task: str, name: str, st: dict, stats: dict[str, dict], models, single: float) -> dict:
    """A method's row of the cost table (`single`: the single models' s/word, added up)."""
    per = _s_per_word(st)
    row = {"task": task, "method": name, "words": st["words"], "wall s": round(st["wall"], 1),
           "decode s/word": round(per, 3)}
    for m in models:
        row[f"fwd {m.name}"], row[f"tok {m.name}"] = st[m.name]
    row["fwd/word"] = round(_fwd_per_word(st, models), 2)
    row["÷ sum of singles"] = round(per / single, 2)
    row["÷ mean single"] = round(per / (single / len(models)), 2)
    seq = stats.get(name.replace(" parallel", " sequential")) if name.endswith(" parallel") else None
    row["÷ sequential"] = round(per / _s_per_word(seq), 2) if seq else ""
    rounds = max(1, st["rounds"])
    row["round wall ms"] = round(1000 * st["decode"] / rounds)
    row["slower model ms"] = round(1000 * st["slower"] / rounds)
    row["models' sum ms"] = round(1000 * st["sum"] / rounds)
    return row


def _mixing_row(task: str, name: str, st: dict, alone: dict[str, dict], models, row: dict) -> dict:
    """The mixture against its writers: each word at its writer's own greedy s/word (`alone`: per model)."""
    per = _s_per_word(st)
    own = sum(n * alone[m]["decode"] / max(1, alone[m]["words"]) for m, n in st["writers"].items())
    return {"task": task, "method": name, **{f"words by {m.name}": st["writers"].get(m.name, 0) for m in models},
            "s/word": round(per, 3), "writers alone s/word": round(own / max(1, st["words"]), 3),
            "÷ writers alone": round(per / (own / max(1, st["words"])), 2), "÷ mean single": row["÷ mean single"]}


def _speculating_row(task: str, name: str, st: dict, plain: dict, models, prompts: int) -> dict:
    """A speculative method against the same decodes without speculation (`plain`)."""
    f0, f1, s0, s1 = _fwd_per_word(plain, models), _fwd_per_word(st, models), _s_per_word(plain), _s_per_word(st)
    drafted, accepted, verifies, scored = st["spec"]
    return {"task": task, "method": name.replace(" sequential", ""),
            "same output": f"{sum(a == b for a, b in zip(st['outputs'], plain['outputs']))}/{prompts}",
            "fwd/word": f"{f0:.2f} → {f1:.2f}", "Δ fwd/word %": round(100 * (f1 / f0 - 1), 1),
            "s/word": f"{s0:.3f} → {s1:.3f}", "Δ s/word %": round(100 * (s1 / s0 - 1), 1),
            "draft tokens": drafted, "accepted": accepted, "verify fwd": verifies,
            "scores from drafts": scored, "saved fwd": accepted - verifies + scored}


def _print_report(tables: _Tables, models, floor: list[str]) -> None:
    """The cost table, the selection's, the mixture's and the speculative proposals' (those with rows), the peak
    prefix copies, what the columns mean, side by side's floor and the GSM8K quarters."""
    print(format_table(tables.rows))
    if tables.selecting:
        print("\nChoosing the explored first tokens (adafuse/selection.py) once per uncertain word start (an explore")
        print("step: top-k, decoding the candidates' texts and, for 'embedding', one gather of embedding rows, a")
        print("k x k kernel and the greedy picks); 'explore round ms': wall time of a round in which some model")
        print("explored; '% of explore rounds': selection seconds over those rounds' wall seconds:")
        print(format_table(tables.selecting))
    if tables.mixing:
        print("\nThe mixture (ME) against its writers: the words each model wrote, and what those words cost each writer")
        print("alone ('writers alone s/word': every word at its writer's own greedy s/word); '÷ writers alone' is the")
        print("mixture's own overhead (catching up on words another model wrote), '÷ mean single' the table's ratio,")
        print("which also counts the luck of the draws (which model wrote how many words):")
        print(format_table(tables.mixing))
    if tables.speculating:
        print("\nSpeculative proposals: each confident model first verifies the spans the models before it")
        print("proposed this round, its own span left from the last round and, unless 'spans-only', what followed the")
        print("latest earlier occurrence of the answer's last words (prompt lookup) in one batched forward and takes their")
        print("tokens where they are its own greedy choice; without → with speculation, same prompts; 'saved fwd' =")
        print("accepted - verify fwd + scoring forwards the verified drafts made unnecessary ('scores from drafts'):")
        print(format_table(tables.speculating))
    print("\nPeak prefix copy per model (largest batch: exploration, beam or scoring rows × cached prefix):")
    for lm in models:
        line = f"  {lm.name}: {tables.peaks.get(lm.name, 0) / 2**20:,.1f} MiB"
        if lm.device.type == "cuda":
            line += f"; CUDA peak allocated {torch.cuda.max_memory_allocated(lm.device) / 2**30:,.2f} GiB"
        print(line)
    print("\n'decode' excludes the prompt prefill; 'fwd'/'tok': forward passes / tokens fed per model while decoding;")
    print("'fwd/word': forward passes of all models per committed word; 's/word' is each round's wall time, so it")
    print("includes tokenizer time; '÷ sum of singles': s/word over the sum of the single models' s/word;")
    print("'÷ mean single': over the mean of the single models' s/word;")
    print("'÷ sequential': parallel s/word over the same method's sequential s/word;")
    print("per round: wall ms, the slower model's own seconds ('slower model') and both models' together ('sum').")
    if floor:
        print()
        print("\n".join(floor))
    if tables.quarters:
        print("\nGSM8K answers of 100+ words, last quarter ÷ first quarter: s/word (fwd/word, s/fwd):")
        # the table's order (the first to reach 100 words varies)
        for name in sorted(tables.quarters, key=tables.order.index):
            vals = [v for v in tables.quarters[name] if v is not None]
            print(f"  {name:28s} " + ", ".join(f"{a:.2f} ({b:.2f}, {c:.2f})" for a, b, c in vals))


def remote_bench(args) -> int:
    """Seconds and requests per word with the first model on a vLLM server vs loaded here (the second stays local)."""
    from . import serve
    server = serve.start(args.models[0], name="served")
    try:
        local, other = get_model(args.models[0]), get_model(args.models[1])
        remote = get_model(server.spec)
        items = [(prompt, cfg) for t, prompt, cfg in tasks(args.data, args.trivia, 0)]
        rows = []
        for label, pair in (("local + local", [local, other]), ("served + local", [remote, other])):
            for b in (1, 3):
                words = calls = 0
                decode = 0.0
                for prompt, cfg in items:
                    # without speculation: a served member verifies no drafts, a local one would
                    tr = AdaFuse(pair, cfg, tau=0.7, branches=b, speculate=False).generate(prompt)
                    words += tr.words
                    decode += sum(r.seconds for r in tr.rounds)
                    calls += sum(st.forward_passes for r in tr.rounds for st in r.steps if st.model == pair[0].name)
                rows.append({"models": label, "B": b, "words": words, "decode s/word": round(decode / max(1, words), 3),
                             "calls/word": round(calls / max(1, words), 2)})
                print(f"  {label} B={b}: {words} words {decode:.1f}s", file=sys.stderr, flush=True)
        print(format_table(rows))
        # what the server's prefix cache buys: a long few-shot prompt cold, then again with one more word
        head = (args.data / "gsm8k" / "prompt.txt").read_text()
        ids = remote.tokenizer(f"{head}\n\nQuestion: How many legs do 3 spiders have?\nLet's think step by step\n",
                               add_special_tokens=False).input_ids
        timings = []
        for ctx in (ids, ids + ids[-1:]):
            t0 = time.perf_counter()
            remote.ask([ctx], [None])
            timings.append(time.perf_counter() - t0)
        print(f"\nprefix cache: a {len(ids)}-token prompt {timings[0]:.2f}s cold, {timings[1]:.2f}s sharing its prefix")
        print(f"\n'calls/word': forward passes (local) or requests (served) of {args.models[0]} per word; served by vLLM "
              f"on this machine ({server.url}, CPU, fp32, --enforce-eager); a request is one completion: a "
              "top-k with an 8-token greedy look-ahead, or the log-probs of given tokens")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
