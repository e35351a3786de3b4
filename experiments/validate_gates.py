"""Re-check the shipped gates and the report's static weightings on the validation lines (51–100 of each data file:
used neither for training, from line 101 on, nor for the report, lines 1–50), against equal weights (plain AdaFuse)
and the better single model, with paired-bootstrap intervals.

    python -m experiments.validate_gates                                   # everything, lines 51-100
    python -m experiments.validate_gates --per-task 3                      # a quick look: the first 3 lines per task
    python -m experiments.validate_gates --tasks flores-de-en --per-task 20 # resume one task further
    python -m experiments.validate_gates --metadata-only                   # recompute the numbers from stored rows

Subjects: every gate in assets/gates/ on the tasks it was trained for (`trained.tasks`), decoded with the NLL averaging
it learned with; the static weightings docs/results.md reports, on their family's tasks (QA: NQ, TriviaQA, SQuAD;
translation: Flores both ways; GSM8K is left out: no method scores above 0 there) — `adafuse+weights` (the family's
`gate search` best, NLL per token), `adafuse+tuned` (the same weights with the averaging chosen in
results/gate/normalize-<family>.json) and `adafuse+per-task` (each task's own choice). Identical settings are decoded
once. Decoding: the gates' models (the bundled pair), τΔ = 0.7, M = 3, B = 3, the tasks' stop strings and word caps.

Rows are appended to artifacts/validation/<task>.jsonl as they come (a rerun resumes; an interrupted one loses at most
the example in progress) and packed into results/validation/<task>.jsonl.gz, which a fresh checkout unpacks to resume.
The numbers (`validation_numbers`) go into each gate file under "validated" (weights untouched) and into
results/validation/summary.json; docs/results.md's validation table is computed from the same rows by the same function.

A subject *helps* when its mean difference to equal weights, pooled over the examples of all its tasks (main metric on
a 0–100 scale: EM, F1, chrF), has a 95 % paired-bootstrap interval above 0; otherwise it is experimental.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

from adafuse.harness.compare import paired_difference, per_example_scores
from adafuse.harness.evaluate import markdown_table
from adafuse.harness.tasks import TASKS, VALIDATION_LINES, format_lines, parse_lines

ROOT = Path(__file__).resolve().parents[1]
GATES = ROOT / "assets" / "gates"
STORE = ROOT / "results" / "validation"     # committed: <task>.jsonl.gz, summary.json
WORK = ROOT / "artifacts" / "validation"    # ignored by git: the plain files a run appends to
FAMILIES = {"qa": ("nq", "triviaqa", "squad"), "mt": ("flores-de-en", "flores-en-de")}
EQUAL = "adafuse"
NAMES = {"nq": "NQ", "triviaqa": "TriviaQA", "squad": "SQuAD", "gsm8k": "GSM8K", "flores-de-en": "Flores De→En",
         "flores-en-de": "Flores En→De"}
UNITS = {"em": "EM", "f1": "F1", "chrf": "chrF", "acc": "accuracy"}
RULE = ("helps: the mean difference to equal weights (plain AdaFuse), pooled over the examples of all its tasks (main "
        "metric, 0-100), has a 95 % paired-bootstrap interval above 0; otherwise experimental")
COMMAND = "python -m experiments.validate_gates"


def _w(weights) -> str:
    return "/".join(f"{w:g}" for w in weights)


def _rel(path) -> str:
    """A path as the repository names it (relative to its root where it is inside)."""
    path = Path(path)
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def subjects(results: Path = ROOT / "results", gates: Path = GATES) -> list[dict]:
    """What is re-checked: {"key" (unique), "name", "kind" ("gate" or "static"), "label" (the rows' method), "spec"
    (the eval method spec), "tasks", "models" (gates), "path" (gates), "family" and "report" (a static weighting: its
    task family and the report's names for it)}. A static weighting is one subject per family (its numbers pooled
    over that family's tasks); the same settings on a task are decoded once."""
    from adafuse.gate import load_gate
    out = []
    for path in sorted(gates.glob("*.json")):
        g = load_gate(path)
        label = f"gate:{path.stem}"
        norm = f",normalize={g.normalize}" if g.normalize != "token" else ""
        out.append({"key": label, "name": f"gate {path.stem}", "kind": "gate", "label": label, "path": str(path),
                    "spec": f"{label}=adafuse[gate={_rel(path)}{norm}]", "tasks": list(g.trained.get("tasks", [])),
                    "models": g.models})
    static: dict[tuple[str, str, str], dict] = {}  # (family, weights, normalize) → subject

    def add(report_name: str, weights, normalize: str, task: str) -> None:
        spec = f"adafuse[weights={_w(weights)}" + (f",normalize={normalize}]" if normalize != "token" else "]")
        s = static.setdefault((fam, _w(weights), normalize), {
            "key": f"{spec} {fam}", "name": f"weights {_w(weights)} per {normalize} ({fam})", "kind": "static",
            "label": spec, "spec": spec, "family": fam, "tasks": [], "report": []})
        if task not in s["tasks"]:
            s["tasks"].append(task)
        if report_name not in s["report"]:
            s["report"].append(report_name)

    from .report_weights import PER_TASK, per_task_choice
    for fam, tasks in FAMILIES.items():
        search = results / "gate" / f"search-{fam}.json"
        norm = results / "gate" / f"normalize-{fam}.json"
        for t in tasks:
            if search.exists():
                add("adafuse+weights", json.loads(search.read_text())["best"], "token", t)
            if norm.exists():
                res = json.loads(norm.read_text())
                add("adafuse+tuned", res["weights"], res["chosen"], t)
            pick = per_task_choice(results, t)
            if pick:
                add(PER_TASK, pick["weights"], pick["normalize"], t)
    return out + list(static.values())


def pack(task: str, work: Path = WORK, store: Path = STORE) -> None:
    """results/validation/<task>.jsonl.gz from the run's plain file (byte-stable: no time stamp in the header)."""
    src = work / f"{task}.jsonl"
    if src.exists():
        store.mkdir(parents=True, exist_ok=True)
        (store / f"{task}.jsonl.gz").write_bytes(gzip.compress(src.read_bytes(), mtime=0))


def unpack(task: str, work: Path = WORK, store: Path = STORE) -> None:
    """A stored run to resume from when this machine has no plain file of its own yet."""
    gz, plain = store / f"{task}.jsonl.gz", work / f"{task}.jsonl"
    if gz.exists() and not plain.exists():
        work.mkdir(parents=True, exist_ok=True)
        plain.write_bytes(gzip.decompress(gz.read_bytes()))


def decode(subs: list[dict], tasks: list[str], lines: tuple[int, int], per_task: int | None, data: Path | None = None,
           work: Path = WORK, store: Path = STORE, progress: bool = True, registry=None) -> None:
    """Decode every subject on its tasks with equal weights and each model alone beside it, task by task (all methods
    of a line before the next line, so a stopped run leaves whole lines)."""
    models = {tuple(s["models"]) for s in subs if s.get("models")}
    if len(models) > 1:
        raise SystemExit(f"the gates are for different models ({models}): validate them separately (--only)")
    for task in tasks:
        specs = list(dict.fromkeys(s["spec"] for s in subs if task in s["tasks"]))
        if specs:
            decode_methods([EQUAL, "greedy", *specs], [task], lines, per_task, data, work, store, progress, registry,
                           pair=list(next(iter(models))) if models else None)


def decode_methods(specs: list[str], tasks: list[str], lines: tuple[int, int], per_task: int | None = None,
                   data: Path | None = None, work: Path = WORK, store: Path = STORE, progress: bool = True,
                   registry=None, pair: list[str] | None = None, concurrency: int = 1) -> None:
    """Decode the eval method `specs` on `tasks` (lines `lines`) into the validation rows, resuming from them and
    packing them again after each task; as the stored rows were decoded (the paper's unit and pool, `PAPER`: a spec
    names any other, "adafuse[normalize=word]")."""
    from adafuse.config import PAPER
    from adafuse.harness.evaluate import evaluate, parse_methods
    from adafuse.models import DEFAULT_PAIR, ModelRegistry
    registry = registry or ModelRegistry()
    runs = parse_methods(specs, list(pair or DEFAULT_PAIR))
    for task in tasks:
        unpack(task, work, store)
        print(f"{task}: lines {format_lines(lines)}" + (f", the first {per_task}" if per_task else "") + ": "
              + ", ".join(r.label for r in runs), file=sys.stderr, flush=True)
        evaluate(TASKS[task], runs, work, data, per_task, base=PAPER, progress=progress, registry=registry, lines=lines,
                 concurrency=concurrency)
        pack(task, work, store)


def load_rows(store: Path = STORE, work: Path = WORK) -> list[dict]:
    """The validation rows: the run's plain files where this machine has them, else the stored ones."""
    from adafuse.harness.evaluate import read_rows
    paths = {p.name.removesuffix(".gz"): p for p in sorted(store.glob("*.jsonl.gz"))}
    paths |= {p.name: p for p in sorted(work.glob("*.jsonl"))}
    return [r for _, p in sorted(paths.items()) for r in read_rows(p)]


def _diff(d: dict | None) -> dict | None:
    return None if d is None else {"diff": round(d["mean"], 2), "low": round(d["low"], 2), "high": round(d["high"], 2),
                                   "wins": d["wins"], "ties": d["ties"], "losses": d["losses"]}


def validation_numbers(rows: list[dict], subject: dict, planned: tuple[int, int] = VALIDATION_LINES) -> dict | None:
    """A subject's numbers on the lines where it, equal weights and every single model were all decoded: per task the
    main metric of each and the paired differences (subject − equal weights, subject − the better single model on
    those lines), the same pooled over its tasks, whether it helps (`RULE`) and a one-line summary. None when no task
    has such a line. The shape `adafuse.gate.load_gate` checks under "validated"."""
    per_ex = per_example_scores(rows)
    singles = sorted({m for _, m in per_ex if m.startswith("greedy:")})
    tasks, pooled = {}, defaultdict(dict)
    for t in subject["tasks"]:
        mine, equal = per_ex.get((t, subject["label"]), {}), per_ex.get((t, EQUAL), {})
        alone = {m: per_ex[(t, m)] for m in singles if (t, m) in per_ex}
        common = set(mine) & set(equal)
        for v in alone.values():
            common &= set(v)
        if not alone or not common:
            continue
        lines = sorted(common)

        def mean(v, lines=lines):
            return round(sum(v[i] for i in lines) / len(lines), 2)

        best = max(sorted(alone), key=lambda m: mean(alone[m]))  # on these lines; the first by name on a tie
        keep = {i: mine[i] for i in lines}
        tasks[t] = {"metric": TASKS[t].main_metric, "n": len(lines), "lines": format_lines((lines[0], lines[-1])),
                    "gate": mean(mine), "equal": mean(equal),
                    "best_single": {"model": best.removeprefix("greedy:"), "score": mean(alone[best])},
                    "vs_equal": _diff(paired_difference(keep, equal)),
                    "vs_best_single": _diff(paired_difference(keep, alone[best]))}
        for i in lines:
            pooled["gate"][(t, i)], pooled["equal"][(t, i)] = mine[i], equal[i]
            pooled["best"][(t, i)] = alone[best][i]
    if not tasks:
        return None
    vs_equal = _diff(paired_difference(pooled["gate"], pooled["equal"]))
    vs_best = _diff(paired_difference(pooled["gate"], pooled["best"]))
    helps = vs_equal["low"] > 0
    n = sum(v["n"] for v in tasks.values())
    full = planned[1] - planned[0] + 1
    metrics = {v["metric"] for v in tasks.values()}
    unit = UNITS[metrics.pop()] if len(metrics) == 1 else "points"
    where = "/".join(NAMES.get(t, t) for t in tasks)

    def signed(x: float) -> str:
        return f"{x:+.1f}".replace("-", "−")

    summary = (f"{'helps' if helps else 'experimental'}: {signed(vs_equal['diff'])} {unit} vs equal weights "
               f"[{signed(vs_equal['low'])}, {signed(vs_equal['high'])}], {signed(vs_best['diff'])} vs the better "
               f"single model, on {n} unseen {where} lines")
    lo = min(int(v["lines"].split("-")[0]) for v in tasks.values())
    hi = max(int(v["lines"].split("-")[1]) for v in tasks.values())
    complete = all(v["n"] == full for v in tasks.values()) and set(tasks) == set(subject["tasks"])
    note = {} if complete else {"note": "partial: " + ", ".join(
        f"{t} {tasks[t]['n'] if t in tasks else 0} of {full} lines" for t in subject["tasks"])
        + f"; `{COMMAND}` completes it (it resumes)"}
    return {"lines": format_lines((lo, hi)), "planned_lines": format_lines(planned), "complete": complete, **note,
            "tasks": tasks, "pooled": {"n": n, "vs_equal": vs_equal, "vs_best_single": vs_best},
            "helps": helps, "rule": RULE, "summary": summary,
            "settings": "the gate's models, τΔ=0.7, M=3, B=3; the gate's NLL averaging; equal weights: plain AdaFuse"
            if subject["kind"] == "gate" else "τΔ=0.7, M=3, B=3; equal weights: plain AdaFuse",
            "command": COMMAND}


def write_metadata(subs: list[dict], rows: list[dict], store: Path = STORE,
                   planned: tuple[int, int] = VALIDATION_LINES) -> dict:
    """Each gate file gets its numbers under "validated" (everything else in the file is kept as it is: the weights are
    never touched); results/validation/summary.json gets every subject's. Returns the summary."""
    from adafuse.gate import load_gate
    out = {}
    for s in subs:
        v = validation_numbers(rows, s, planned)
        if v is None:
            continue
        out[s["key"]] = {"name": s["name"], "kind": s["kind"], "tasks": s["tasks"], **(
            {"path": _rel(s["path"])}
            if s["kind"] == "gate" else {"report": s["report"]}), "validated": v}
        if s["kind"] == "gate":
            path = Path(s["path"])
            raw = json.loads(path.read_text(encoding="utf-8"))
            raw["validated"] = v
            path.write_text(json.dumps(raw, indent=1, allow_nan=False, ensure_ascii=False) + "\n", encoding="utf-8")
            load_gate(path)  # the file still reads, its "validated" shape checked
    store.mkdir(parents=True, exist_ok=True)
    (store / "summary.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def _cell(d: dict) -> str:
    return f"{d['diff']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}] {d['wins']}/{d['ties']}/{d['losses']}"


def validation_section(results: Path, obs: list[str], subs: list[dict] | None = None) -> list[str]:
    """docs/results.md's validation table, computed from RESULTS/validation/*.jsonl.gz by `validation_numbers` (the
    numbers the gate files carry); appends an observation saying which shipped gates help. [] without rows."""
    store = results / "validation"
    rows = load_rows(store, store / "none")  # the committed rows only: the report is rebuilt from what is stored
    if not rows:
        return []
    subs = subjects(results) if subs is None else subs
    table, verdicts = [], []
    done: dict[str, int] = {}  # per task, the lines every subject there has
    planned = VALIDATION_LINES[1] - VALIDATION_LINES[0] + 1
    for s in subs:
        v = validation_numbers(rows, s)
        if v is None:
            continue
        shown = f"`{_rel(s['path'])}`" if s["kind"] == "gate" else f"`{s['label']}` ({s['family']})"
        also = "learned gate" if s["kind"] == "gate" else ", ".join(s["report"])
        for t, n in v["tasks"].items():
            table.append({"subject": shown, "is": also, "task": t, "lines": f"{n['lines']} ({n['n']})",
                          "metric": n["metric"], "score": n["gate"], "equal weights": n["equal"],
                          "better single": f"{n['best_single']['score']} ({n['best_single']['model']})",
                          "− equal weights": _cell(n["vs_equal"]), "− better single": _cell(n["vs_best_single"]),
                          "helps": ""})
        table.append({"subject": shown, "is": also, "task": "**all its tasks**", "lines": f"({v['pooled']['n']})",
                      "metric": "", "score": None, "equal weights": None, "better single": None,
                      "− equal weights": _cell(v["pooled"]["vs_equal"]),
                      "− better single": _cell(v["pooled"]["vs_best_single"]),
                      "helps": "**yes**" if v["helps"] else "no: experimental"})
        if s["kind"] == "gate":
            verdicts.append((shown, v))
        for t in s["tasks"]:
            done[t] = min(done.get(t, planned), v["tasks"][t]["n"] if t in v["tasks"] else 0)
    if not table:
        return []
    short = [f"{t} {n}" for t, n in done.items() if n < planned]
    partial = f"lines decoded so far per task: {', '.join(short)} of {planned}" if short else ""
    def pooled(v: dict, key: str) -> str:
        d = v["pooled"][key]
        return f"{d['diff']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]"

    helps = [name + (f" (but below the better single model: {pooled(v, 'vs_best_single')})"
                     if v["pooled"]["vs_best_single"]["high"] < 0 else "") for name, v in verdicts if v["helps"]]
    hurts = [f"{name} ({pooled(v, 'vs_equal')})" for name, v in verdicts if not v["helps"]]
    obs.append("- Validation on unseen lines (51–100 of each file; neither trained nor reported on): shipped gates "
               "that beat equal weights with the interval above 0 — " + (", ".join(helps) or "none")
               + "; experimental (no such gain over equal weights: mean difference and interval, pooled over their "
               "tasks) — " + (", ".join(hurts) or "none") + "."
               + (f" Not every line is decoded yet ({partial}): `{COMMAND}` completes it." if partial else ""))
    return ["## Validation: the shipped gates and static weightings on unseen lines", "",
            "Lines 51–100 of every data file are used neither for training (lines 101 on: `gate search`, `gate train`) "
            "nor for the tables above (lines 1–50). Each shipped gate is decoded there on the tasks it was trained "
            "for, "
            "each static weighting of this report on its family's tasks, beside equal weights (plain AdaFuse) and each "
            "model alone (τΔ = 0.7, M = 3, B = 3; a gate with the NLL averaging it learned with), by "
            f"`{COMMAND}` (rows: `results/validation/`). Score: the task's main metric ×100 on the lines every method "
            "there was decoded on; differences: the subject minus equal weights and minus the better single model on "
            "those lines (mean, 95 % paired-bootstrap interval, examples better/same/worse). " + RULE[0].upper()
            + RULE[1:] + ". The same numbers are in each gate file under `validated`, which the app's gate menu shows."
            + (f" Not every line is decoded yet ({partial}; `{COMMAND}` completes it, resuming)." if partial else ""),
            "",
            markdown_table(table), ""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", default=format_lines(VALIDATION_LINES), metavar="FIRST-LAST",
                    help="the validation lines of every data file")
    ap.add_argument("--per-task", type=int, help="only the first N of those lines per task (default: all)")
    ap.add_argument("--tasks", nargs="+", choices=list(TASKS), help="only these tasks (default: every subject's)")
    ap.add_argument("--only", nargs="+", metavar="LABEL",
                    help="only these subjects (gate:qa, adafuse[weights=1/9] ...)")
    ap.add_argument("--metadata-only", action="store_true", help="decode nothing: recompute the numbers from the rows")
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    lines = parse_lines(args.lines)
    subs = subjects()
    chosen = [s for s in subs if not args.only or s["label"] in args.only or s["key"] in args.only]
    if not args.metadata_only:
        tasks = [t for t in TASKS if any(t in s["tasks"] for s in chosen) and (not args.tasks or t in args.tasks)]
        decode(chosen, tasks, lines, args.per_task, args.data, progress=not args.no_progress)
    summary = write_metadata(subs, load_rows(), planned=lines)
    for key, s in summary.items():
        print(f"{key}: {s['validated']['summary']} (lines {s['validated']['lines']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
