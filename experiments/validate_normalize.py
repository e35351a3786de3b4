"""Per token, per word or per byte: which NLL unit serves users as the default. Decodes plain AdaFuse with each unit
(`adafuse` = per token, the paper's rule; `adafuse[normalize=word]`, `adafuse[normalize=byte]`) and each model alone
on the validation lines (51–100) of every task with the bundled pair, and counts, beside each task's main metric, the
answers a user would find broken: empty ones and run-on ones (the decode hit the word or token cap instead of ending).
What newcomers type comes from bench/newcomers.py's stored runs (results/bench/newcomers-*.json).

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

# each unit's eval method spec
UNITS = {"token": "adafuse", "word": "adafuse[normalize=word]", "byte": "adafuse[normalize=byte]"}
TOKEN, WORD, BYTE = UNITS.values()
NAMED = {"token": "per token (the paper's rule)", "word": "per word", "byte": "per byte"}
NEWCOMERS = ROOT / "results" / "bench"  # bench/newcomers.py --out newcomers-<way>.json
RUN_ON = ("max_new_words", "max_new_tokens", "context full")
OUT = STORE / "normalize.json"
DOC = ROOT / "docs" / "defaults.md"
COMMAND = "python -m experiments.validate_normalize"
GSM8K_LINES = "51-62"   # a GSM8K decode takes ~75 s here (long answers): a shorter stretch of its validation lines


def _broken(row: dict) -> tuple[bool, bool]:
    """(empty, run-on) for one row."""
    reason = str((row.get("trace") or {}).get("stop_reason") or "")
    return not row["prediction"].strip(), reason in RUN_ON


def _diff(d: dict) -> dict:
    return {k: round(d[k], 2) if isinstance(d[k], float) else d[k] for k in ("mean", "low", "high", "wins", "ties",
                                                                              "losses")}


def numbers(rows: list[dict]) -> dict:
    """Per task, on the lines every unit decoded: the main metric of each (and of each model alone), each unit's paired
    difference from per token with its 95 % bootstrap interval, and the empty and run-on answers of each; the same
    pooled over tasks. Units with no rows are left out."""
    per_ex = per_example_scores(rows)
    by_key = {(r["task"], r["method"], r["line"]): r for r in rows}
    units = [u for u, m in UNITS.items() if any(k[1] == m for k in per_ex)]
    tasks, pooled = {}, {u: {} for u in units}
    broken_total = {u: {"empty": 0, "run_on": 0} for u in units}
    for t in TASKS:
        lines = sorted(set.intersection(*[set(per_ex.get((t, UNITS[u]), {})) for u in units])) if units else []
        if not lines or "token" not in units:
            continue
        entry = {"metric": TASKS[t].main_metric, "n": len(lines), "lines": format_lines((lines[0], lines[-1]))}
        for u in units:
            v = per_ex[(t, UNITS[u])]
            flags = [_broken(by_key[(t, UNITS[u], i)]) for i in lines]
            entry[u] = {"score": round(sum(v[i] for i in lines) / len(lines), 2),
                        "empty": sum(e for e, _ in flags), "run_on": sum(r for _, r in flags)}
            broken_total[u]["empty"] += entry[u]["empty"]
            broken_total[u]["run_on"] += entry[u]["run_on"]
            pooled[u].update({(t, i): v[i] for i in lines})
        for m in sorted(m for (tt, m) in per_ex if tt == t and m.startswith("greedy:")):
            v = per_ex[(t, m)]
            if all(i in v for i in lines):
                entry.setdefault("alone", {})[m.removeprefix("greedy:")] = round(sum(v[i] for i in lines) / len(lines), 2)
        entry["minus_token"] = {u: _diff(paired_difference({i: per_ex[(t, UNITS[u])][i] for i in lines},
                                                           {i: per_ex[(t, TOKEN)][i] for i in lines}))
                                for u in units if u != "token"}
        tasks[t] = entry
    if not tasks:
        return {"tasks": {}}
    n = sum(e["n"] for e in tasks.values())
    return {"tasks": tasks, "n": n, "units": units, "pooled": {
        "minus_token": {u: _diff(paired_difference(pooled[u], pooled["token"])) for u in units if u != "token"},
        "broken": broken_total},
        "settings": "the bundled pair, τΔ=0.7, M=3, B=3, equal weights, each task's stop strings and word caps",
        "command": COMMAND}


RULE = ("declared before the run: among the units whose pooled main-metric difference from per token on the tasks "
        "has a 95 % interval not wholly below 0 (per token itself qualifies), the one whose fused answers to the "
        "newcomers' questions (bench/newcomers.py: 30 questions of this project's own, as completions and as chat "
        "messages, default settings) most often hold the answer without being empty or running on; a tie keeps per "
        "token")


def newcomer_numbers(folder: Path = NEWCOMERS) -> dict:
    """From bench/newcomers.py's stored runs: per run label ("fused (token)", "<model> alone") and way, the questions
    asked, those whose answer holds the answer, the empty and the run-on ones, and `answered` (holds, not empty, not
    run on)."""
    out: dict = {}
    for path in sorted(folder.glob("newcomers-*.json")):
        for r in json.loads(path.read_text(encoding="utf-8"))["rows"]:
            e = out.setdefault(r["run"], {}).setdefault(r["way"], dict.fromkeys(
                ("asked", "holds", "empty", "run_on", "answered"), 0))
            e["asked"] += 1
            e["holds"] += r["holds"]
            e["empty"] += r["empty"]
            e["run_on"] += r["run_on"]
            e["answered"] += r["holds"] and not r["empty"] and not r["run_on"]
    return out


def choose(result: dict) -> str:
    """The default `RULE` picks from `numbers` and `newcomer_numbers` (under "newcomers")."""
    diffs = result["pooled"]["minus_token"]
    eligible = ["token"] + [u for u, d in diffs.items() if d["high"] >= 0]
    newcomers = result.get("newcomers", {})

    def answered(u: str) -> int:
        return sum(e["answered"] for e in newcomers.get(f"fused ({u})", {}).values())
    return max(eligible, key=lambda u: (answered(u), u == "token"))


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
    from adafuse.config import PAPER
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
            cfg = DecodeConfig(stop=("\n",), max_new_words=ZERO_SHOT_WORDS, **{**PAPER, "normalize": norm})
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


def _interval(d: dict) -> str:
    return f"{_signed(d['mean'])} [{_signed(d['low'])}, {_signed(d['high'])}]"


def table(result: dict) -> list[str]:
    """docs/defaults.md's table: a row per task, a column per unit, each other unit's difference from per token."""
    units = result["units"]
    others = [u for u in units if u != "token"]
    out = ["| task | n | metric | " + " | ".join(f"per {u}" for u in units) + " | "
           + " | ".join(f"{u} − token [95 % CI]" for u in others) + " | empty (" + " / ".join(units) + ") | run-on ("
           + " / ".join(units) + ") | each model alone |", "|---" * (5 + len(units) + len(others)) + "|"]
    for t, e in result["tasks"].items():
        alone = ", ".join(f"{m} {s:.1f}" for m, s in e.get("alone", {}).items())
        out.append(f"| {NAMES.get(t, t)} ({e['lines']}) | {e['n']} | {e['metric']} | "
                   + " | ".join(f"{e[u]['score']:.1f}" for u in units) + " | "
                   + " | ".join(_interval(e["minus_token"][u]) for u in others) + " | "
                   + " / ".join(str(e[u]["empty"]) for u in units) + " | "
                   + " / ".join(str(e[u]["run_on"]) for u in units) + f" | {alone} |")
    p = result["pooled"]
    out.append(f"| all | {result['n']} | 0–100 | " + " | " * (len(units) - 1) + " | "
               + " | ".join(_interval(p["minus_token"][u]) for u in others) + " | "
               + " / ".join(str(p["broken"][u]["empty"]) for u in units) + " | "
               + " / ".join(str(p["broken"][u]["run_on"]) for u in units) + " | |")
    return out


def newcomer_table(newcomers: dict) -> list[str]:
    out = ["| run | way | asked | holds the answer | empty | run on | answered (holds, not empty, not run on) |",
           "|---|---|---|---|---|---|---|"]
    for run, ways in newcomers.items():
        for way, e in ways.items():
            out.append(f"| {run} | {way} | {e['asked']} | {e['holds']} | {e['empty']} | {e['run_on']} | "
                       f"{e['answered']} |")
    return out


def document(result: dict) -> str:
    """docs/defaults.md: the measurement behind `DecodeConfig.normalize`'s default, from `result`."""
    z = result.get("zero_shot", {})
    zrows = [f"| per {m} | {z[m]['n']} | {z[m]['holds_gold']} | {z[m]['empty']} | {z[m]['run_on']} | "
             f"{z[m]['mean_words']} |" for m in UNITS if m in z]
    pooled = "; ".join(f"per {u} − per token {_interval(d)}" for u, d in result["pooled"]["minus_token"].items())
    return "\n".join([
        "# The default NLL unit: per token, per word or per byte",
        "",
        f"*Written by `{COMMAND}` from results/validation/normalize.json; do not edit by hand.*",
        "",
        "AdaFuse scores a candidate by each model's NLL of it, divided by its length before the models are fused. The",
        "paper divides by the candidate's tokens (in each model's own tokenization); this project also offers its words",
        "(`normalize=\"word\"`, the end of the answer counting as one word) and its UTF-8 bytes (`normalize=\"byte\"`,",
        "the same count for every model, the end counting as one). One default is shared by the library",
        "(`DecodeConfig`), the command line, `adafuse serve`, lm-eval's model_args and the app, chosen by this",
        "measurement; per token stays one setting away (`normalize=\"token\"`), as the paper's rule.",
        "",
        "With the unit goes one rule of the pool (`allow_empty=False`, also the default everywhere): while the answer "
        "holds no word, a proposal to end it is left out of the round when another candidate is in it (the model's "
        "step records `held_end`), as `min_new_tokens` holds a model's end token back. It changes only the decodes "
        "whose first round the end won — the empty answers —, since it leaves out a candidate that did not win "
        "otherwise. The tasks' rows below and the bare NQ/TriviaQA questions were decoded with the end allowed at "
        "once (the paper's pool, `adafuse.config.PAPER`, as every stored run): their 'empty' columns are the answers "
        "the rule changes. The newcomers' table shows both.",
        "",
        f"**Chosen: {NAMED[result['chosen']]}.** Rule ({result['rule']}).",
        "",
        *_status(result["chosen"]),
        f"## The tasks' validation lines ({result['settings']})",
        "",
        *table(result),
        "",
        f"Pooled over {result['n']} examples (main metric on a 0–100 scale, 95 % paired bootstrap): {pooled}. 'empty': "
        "no answer; 'run-on': the word or token cap stopped it, not the answer's end. GSM8K decodes take about 75 s "
        "each here, so it has a shorter stretch of its validation lines (the table names the lines each task had).",
        "",
        "## What newcomers type (`python -m bench.newcomers`, default settings; `--redo-empty` brought the stored "
        "runs to the held-back end)",
        "",
        "30 common-knowledge questions of this project's own (bench/newcomers.py), as a completion (`Question: …\\n"
        "Answer:` with the `\\n` stop the app proposes) and as a chat message (each model's chat template; a model "
        "without one reads a User/Assistant transcript whose turn ends at its next `User:` line); "
        "an answer holds the answer when one of the question's aliases is inside it (normalized text). \"End at once "
        "allowed\": the paper's pool, the end of the answer free to win before the first word.",
        "",
        *newcomer_table(result.get("newcomers", {})),
        "",
        *([f"## NQ and TriviaQA questions asked bare ({z.get('settings', '')}; an earlier run, per token and per word)",
           "",
           "| unit | questions | answer holds a gold answer | empty | run-on | mean words |",
           "|---|---|---|---|---|---|",
           *zrows, ""] if zrows else []),
        "Per token, a candidate with an unsure first token and a near-certain tail (\" 1.\") is cheap per token and can "
        "start a list; per word, the end of the answer is one word with its own NLL and often wins at once (empty "
        "answers, until the end was held back before the first word); per byte, a whole word's NLL is spread over its "
        "letters, so neither a sure tail nor ending early is favoured the way the other units favour them, but a chat "
        "answer's sure tail of words runs on (23 of 30 chat answers hit the word cap).",
        "",
    ])


def _status(chosen: str) -> list[str]:
    """A line saying so when the library's default is not yet the unit the rule chose."""
    from adafuse import DecodeConfig
    if DecodeConfig.normalize == chosen:
        return []
    return [f"**Not yet the library's default**: `DecodeConfig.normalize` is still `\"{DecodeConfig.normalize}\"`; "
            f"the switch to `\"{chosen}\"` is open (issue 52: every stored run labelled `adafuse` means per token "
            "and must be named `adafuse[normalize=token]` first, and the examples' quoted answers change).", ""]


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
            decode_methods([*UNITS.values(), "greedy"], [t], lines, args.per_task, concurrency=args.concurrency)
    if not args.numbers_only and not args.skip_zero_shot:
        decode_zero_shot(per_task=args.per_task, concurrency=args.concurrency)
    result = numbers(load_rows())
    if not result["tasks"]:
        print("no task has per token and another unit yet")
        return 1
    result["newcomers"] = newcomer_numbers()
    result["zero_shot"] = zero_shot_numbers(_read(WORK / "zero-shot" / "rows.jsonl")
                                            or _read(STORE / "zero-shot" / "rows.jsonl.gz"))
    result["chosen"], result["rule"] = choose(result), RULE
    OUT.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    DOC.write_text(document(result))
    print(f"{OUT.relative_to(ROOT)}, {DOC.relative_to(ROOT)}: chosen per {result['chosen']}")
    print("\n".join(table(result)))
    print("\n".join(newcomer_table(result["newcomers"])))
    print("zero-shot:", json.dumps(result["zero_shot"], ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
