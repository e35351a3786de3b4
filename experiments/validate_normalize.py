"""Per token against per word: which NLL averaging serves users as the default (issue 41). Decodes plain AdaFuse with
each averaging (`adafuse` = per token, the paper's rule; `adafuse[normalize=word]` = per word) and each model alone on
the validation lines (51–100) of every task with the bundled pair, and counts, beside each task's main metric, the
answers a user would find broken: empty ones and run-on ones (the decode hit the word or token cap instead of ending).

    python -m experiments.validate_normalize                       # every task, lines 51-100 (GSM8K: --gsm8k-lines)
    python -m experiments.validate_normalize --tasks nq --per-task 5
    python -m experiments.validate_normalize --numbers-only        # recompute results/validation/normalize.json

Rows share artifacts/validation/<task>.jsonl and results/validation/<task>.jsonl.gz with experiments/validate_gates.py
(same lines, same settings: τΔ = 0.7, M = 3, B = 3, the tasks' stop strings and word caps), so what one decoded the
other reuses, and a rerun resumes. The numbers go to results/validation/normalize.json; docs/defaults.md is written
from them.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from adafuse.harness.compare import paired_difference, per_example_scores
from adafuse.harness.tasks import TASKS, VALIDATION_LINES, format_lines, parse_lines

from .validate_gates import NAMES, ROOT, STORE, WORK, decode_methods, load_rows

TOKEN, WORD = "adafuse", "adafuse[normalize=word]"
RUN_ON = ("max_new_words", "max_new_tokens", "context full")
OUT = STORE / "normalize.json"
DOC = ROOT / "docs" / "defaults.md"
COMMAND = "python -m experiments.validate_normalize"
GSM8K_LINES = "51-62"   # a GSM8K decode takes ~75 s here (long answers): a shorter stretch of its validation lines


def _broken(row: dict) -> tuple[bool, bool]:
    """(empty, run-on) for one row."""
    reason = str((row.get("trace") or {}).get("stop_reason") or "")
    return not row["prediction"].strip(), reason in RUN_ON


def numbers(rows: list[dict]) -> dict:
    """Per task, on the lines both averagings decoded: the main metric of each (and of each model alone), the paired
    difference word − token with its 95 % bootstrap interval, and the empty and run-on answers of each; the same
    pooled over tasks."""
    per_ex = per_example_scores(rows)
    by_key = {(r["task"], r["method"], r["line"]): r for r in rows}
    tasks, pooled = {}, {"token": {}, "word": {}}
    broken_total = {m: {"empty": 0, "run_on": 0} for m in ("token", "word")}
    for t in TASKS:
        tok, word = per_ex.get((t, TOKEN), {}), per_ex.get((t, WORD), {})
        lines = sorted(set(tok) & set(word))
        if not lines:
            continue
        entry = {"metric": TASKS[t].main_metric, "n": len(lines), "lines": format_lines((lines[0], lines[-1]))}
        for label, method in (("token", TOKEN), ("word", WORD)):
            v = per_ex[(t, method)]
            flags = [_broken(by_key[(t, method, i)]) for i in lines]
            entry[label] = {"score": round(sum(v[i] for i in lines) / len(lines), 2),
                            "empty": sum(e for e, _ in flags), "run_on": sum(r for _, r in flags)}
            broken_total[label]["empty"] += entry[label]["empty"]
            broken_total[label]["run_on"] += entry[label]["run_on"]
            pooled[label].update({(t, i): v[i] for i in lines})
        for m in sorted(m for (tt, m) in per_ex if tt == t and m.startswith("greedy:")):
            v = per_ex[(t, m)]
            if all(i in v for i in lines):
                entry.setdefault("alone", {})[m.removeprefix("greedy:")] = round(sum(v[i] for i in lines) / len(lines), 2)
        d = paired_difference(word, tok)
        entry["word_minus_token"] = {k: round(d[k], 2) if isinstance(d[k], float) else d[k]
                                     for k in ("mean", "low", "high", "wins", "ties", "losses")}
        tasks[t] = entry
    if not tasks:
        return {"tasks": {}}
    d = paired_difference(pooled["word"], pooled["token"])
    n = sum(e["n"] for e in tasks.values())
    return {"tasks": tasks, "n": n, "pooled": {"word_minus_token": {
        k: round(d[k], 2) if isinstance(d[k], float) else d[k] for k in ("mean", "low", "high", "wins", "ties", "losses")},
        "broken": broken_total},
        "settings": "the bundled pair, τΔ=0.7, M=3, B=3, equal weights, each task's stop strings and word caps",
        "command": COMMAND}


RULE = ("the averaging whose pooled main-metric difference on the tasks has a 95 % interval away from 0; when the "
        "interval holds 0, the one with fewer broken answers (empty or run-on) on the tasks and on the bare questions "
        "together")


def choose(result: dict) -> str:
    """The default `RULE` picks from `numbers` and `zero_shot_numbers`."""
    d = result["pooled"]["word_minus_token"]
    if d["low"] > 0 or d["high"] < 0:
        return "word" if d["mean"] > 0 else "token"
    zero = result.get("zero_shot", {})
    broken = {m: sum(result["pooled"]["broken"][m].values()) + zero.get(m, {}).get("empty", 0)
              + zero.get(m, {}).get("run_on", 0) for m in ("token", "word")}
    return "word" if broken["word"] < broken["token"] else "token"


# ---- zero-shot: the prompt a newcomer types into the app, the library or the server ----

ZERO_SHOT = "Question: {}\nAnswer:"
ZERO_SHOT_TASKS = ("nq", "triviaqa")
ZERO_SHOT_WORDS = 32


def decode_zero_shot(tasks=ZERO_SHOT_TASKS, lines=VALIDATION_LINES, per_task: int | None = None, concurrency: int = 4,
                     work: Path = WORK, store: Path = STORE) -> None:
    """Each validation question as a bare "Question: …\nAnswer:" prompt (no few-shot examples), with the `\n` stop the
    app proposes for it and a 32-word cap, per token and per word; rows in <store>/zero-shot/rows.jsonl.gz (resumed;
a folder of its own: they are not a task's rows)."""
    from adafuse import AdaFuse, DecodeConfig
    from adafuse.harness.tasks import data_dir, read_examples
    from adafuse.models import DEFAULT_PAIR, ModelRegistry
    from .validate_gates import pack, unpack
    work, store = work / "zero-shot", store / "zero-shot"
    unpack("rows", work, store)
    out = work / "rows.jsonl"
    done = {(r["task"], r["line"], r["normalize"]) for r in _read(out)}
    registry = ModelRegistry()
    models = [registry.get(n) for n in DEFAULT_PAIR]
    for t in tasks:
        task = TASKS[t]
        exs = read_examples(data_dir() / task.folder / task.file, per_task, lines=lines)
        for norm in ("token", "word"):
            todo = [(no, ex) for no, ex in exs if (t, no, norm) not in done]
            if not todo:
                continue
            cfg = DecodeConfig(stop=("\n",), max_new_words=ZERO_SHOT_WORDS, normalize=norm)
            print(f"zero-shot {t} per {norm}: {len(todo)} questions", flush=True)
            traces = AdaFuse(models, cfg).generate_many([ZERO_SHOT.format(ex["question"]) for _, ex in todo],
                                                        concurrency)
            with out.open("a", encoding="utf-8") as sink:
                for (no, ex), trace in zip(todo, traces):
                    sink.write(json.dumps({"task": t, "line": no, "method": TOKEN if norm == "token" else WORD,
                                           "normalize": norm, "question": ex["question"], "output": trace.output,
                                           "gold": ex["answer"], "stop_reason": trace.stop_reason,
                                           "trace": trace.to_dict()}, ensure_ascii=False) + "\n")
        pack("rows", work, store)


def _read(path: Path) -> list[dict]:
    from adafuse.harness.evaluate import read_rows
    return read_rows(path) if path.exists() else []


def zero_shot_numbers(rows: list[dict]) -> dict:
    """Per averaging, over the questions both decoded: answers holding a gold answer, empty ones, run-on ones (the
    word cap, not the line's end, stopped them), and the mean words."""
    from adafuse.harness.metrics import normalize_answer
    keys = {(r["task"], r["line"]) for r in rows if r["normalize"] == "token"} & \
        {(r["task"], r["line"]) for r in rows if r["normalize"] == "word"}
    out = {}
    for norm in ("token", "word"):
        mine = [r for r in rows if r["normalize"] == norm and (r["task"], r["line"]) in keys]
        hold = [any(normalize_answer(g) and f" {normalize_answer(g)} " in f" {normalize_answer(r['output'])} "
                    for g in (r["gold"] if isinstance(r["gold"], list) else [r["gold"]])) for r in mine]
        out[norm] = {"n": len(mine), "holds_gold": sum(hold), "empty": sum(not r["output"].strip() for r in mine),
                     "run_on": sum(r["stop_reason"] in RUN_ON for r in mine),
                     "mean_words": round(sum(len(r["output"].split()) for r in mine) / max(len(mine), 1), 1)}
    return {"prompt": ZERO_SHOT, "settings": f"the bundled pair, τΔ=0.7, M=3, B=3, stop \\n, {ZERO_SHOT_WORDS} "
            "words at most", "tasks": sorted({t for t, _ in keys}), **out}


def _signed(x: float) -> str:
    return f"{x:+.2f}".replace("-", "−")


def table(result: dict) -> list[str]:
    """docs/defaults.md's table: a row per task."""
    out = ["| task | n | metric | per token | per word | word − token [95 % CI] | W/T/L | empty (token / word) "
           "| run-on (token / word) | each model alone |", "|---|---|---|---|---|---|---|---|---|---|"]
    for t, e in result["tasks"].items():
        d = e["word_minus_token"]
        alone = ", ".join(f"{m} {s:.1f}" for m, s in e.get("alone", {}).items())
        out.append(f"| {NAMES.get(t, t)} ({e['lines']}) | {e['n']} | {e['metric']} | {e['token']['score']:.1f} | "
                   f"{e['word']['score']:.1f} | {_signed(d['mean'])} [{_signed(d['low'])}, {_signed(d['high'])}] | "
                   f"{d['wins']}/{d['ties']}/{d['losses']} | {e['token']['empty']} / {e['word']['empty']} | "
                   f"{e['token']['run_on']} / {e['word']['run_on']} | {alone} |")
    p = result["pooled"]
    d = p["word_minus_token"]
    b = p["broken"]
    out.append(f"| all | {result['n']} | 0–100 | | | {_signed(d['mean'])} [{_signed(d['low'])}, {_signed(d['high'])}] "
               f"| {d['wins']}/{d['ties']}/{d['losses']} | {b['token']['empty']} / {b['word']['empty']} | "
               f"{b['token']['run_on']} / {b['word']['run_on']} | |")
    return out


def document(result: dict) -> str:
    """docs/defaults.md: the measurement behind `DecodeConfig.normalize`'s default, from `result`."""
    z = result["zero_shot"]
    d = result["pooled"]["word_minus_token"]
    chosen = {"token": "per token (the paper's rule)", "word": "per word"}[result["chosen"]]
    zrows = [f"| per {m} | {z[m]['n']} | {z[m]['holds_gold']} | {z[m]['empty']} | {z[m]['run_on']} | "
             f"{z[m]['mean_words']} |" for m in ("token", "word") if m in z]
    return "\n".join([
        "# The default NLL averaging: per token or per word",
        "",
        f"*Written by `{COMMAND}` from results/validation/normalize.json; do not edit by hand.*",
        "",
        "AdaFuse scores a candidate by each model's NLL of it, averaged before the models are fused. The paper averages",
        "over the candidate's tokens (in each model's own tokenization); this project also offers averaging over its",
        "words (`normalize=\"word\"`, the end of the answer counting as one word). One default is shared by the",
        "library (`DecodeConfig`), the command line, `adafuse serve`, lm-eval's model_args and the app, and it was",
        "chosen by this measurement.",
        "",
        f"**Chosen: {chosen}.** Rule: {result['rule']}.",
        "",
        f"## The tasks' validation lines ({result['settings']})",
        "",
        *table(result),
        "",
        f"Pooled over {result['n']} examples (main metric on a 0–100 scale), per word − per token: "
        f"{_signed(d['mean'])} [{_signed(d['low'])}, {_signed(d['high'])}] (95 % paired bootstrap). 'empty': no "
        "answer; 'run-on': the word or token cap stopped it, not the answer's end. GSM8K decodes take about 75 s each "
        f"here, so it has a shorter stretch of its validation lines ({GSM8K_LINES}).",
        "",
        f"## The same questions asked bare ({z.get('settings', '')})",
        "",
        f"NQ and TriviaQA validation questions as `{z.get('prompt', '').encode('unicode_escape').decode()}`, with no "
        "worked example: what a newcomer types into the app, the library or the server.",
        "",
        "| averaging | questions | answer holds a gold answer | empty | run-on | mean words |",
        "|---|---|---|---|---|---|",
        *zrows,
        "",
        "Per word, the end of the answer is one word with its own NLL, and on a bare question ending at once often beats "
        "every first word; per token, a word with an unsure first token and a sure tail (\" 1.\") can win and start "
        "a list. docs/weights-and-gates.md's *NLL per word* shows one bare question where per word is right.",
        "",
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--lines", type=parse_lines, default=VALIDATION_LINES)
    ap.add_argument("--gsm8k-lines", type=parse_lines, default=parse_lines(GSM8K_LINES))
    ap.add_argument("--per-task", type=int, default=None, help="only the first N lines of each task")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--skip-zero-shot", action="store_true", help="only the tasks' own few-shot prompts")
    ap.add_argument("--numbers-only", action="store_true", help="recompute the numbers from the stored rows")
    args = ap.parse_args(argv)
    if not args.numbers_only:
        for t in args.tasks:
            lines = args.gsm8k_lines if t == "gsm8k" else args.lines
            decode_methods([TOKEN, WORD, "greedy"], [t], lines, args.per_task, concurrency=args.concurrency)
    if not args.numbers_only and not args.skip_zero_shot:
        decode_zero_shot(per_task=args.per_task, concurrency=args.concurrency)
    result = numbers(load_rows())
    if not result["tasks"]:
        print("no task has both averagings yet")
        return 1
    result["zero_shot"] = zero_shot_numbers(_read(WORK / "zero-shot" / "rows.jsonl")
                                            or _read(STORE / "zero-shot" / "rows.jsonl.gz"))
    result["chosen"], result["rule"] = choose(result), RULE
    OUT.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    DOC.write_text(document(result))
    print(f"{OUT.relative_to(ROOT)}, {DOC.relative_to(ROOT)}: chosen per {result['chosen']}")
    print("\n".join(table(result)))
    print("zero-shot:", json.dumps(result["zero_shot"], ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
