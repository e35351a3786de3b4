"""An evaluation's examples as data: answers, scores and labels per example, and one example opened."""
from __future__ import annotations

import csv
import html
from pathlib import Path

from adafuse.config import DecodeConfig
from adafuse.divergence import SOLO as SINGLE, divergence, is_solo
from adafuse.errors import ConfigError
from adafuse.harness.evaluate import decode_seconds
from adafuse.harness.tasks import TASKS
from adafuse.trace import Trace


# The labels an example can carry (the Evaluate tab's filter), each computed from the methods' scores
WRONG_BUT_MEMBER = "ensemble wrong, a member right"
RIGHT_ALONE = "ensemble right, every member wrong"
ALL_WRONG = "all wrong"
ALL_RIGHT = "all right"
EMPTY = "an empty answer"
OTHER = "other"
LABELS = (WRONG_BUT_MEMBER, RIGHT_ALONE, ALL_WRONG, EMPTY, ALL_RIGHT, OTHER)
ALL = "every example"

TRANSLATION_RIGHT = 50.0  # chrF at or above which a translation counts as right (labels only; the score is shown)


def rule(task_name: str) -> str:
    """What "right" means for a task's labels, in words."""
    task = TASKS[task_name]
    return {"em": "exact match", "em_f1": "exact match (F1 shown beside it)", "number": "the final number matches",
            "translation": f"chrF ≥ {TRANSLATION_RIGHT:g}"}[task.metric]


def right(row: dict) -> bool:
    """Whether one result row counts as right: exact match for QA (not F1: "10th century" shares "century" with
    "9th century"), the final number for GSM8K, chrF ≥ 50 for translation."""
    task = TASKS[row["task"]]
    s = row["scores"]
    if task.metric in ("em", "em_f1"):
        return s.get("em", 0.0) >= 1.0
    if task.metric == "number":
        return s.get("acc", 0.0) >= 1.0
    return s.get("chrf", 0.0) >= TRANSLATION_RIGHT


def ensemble_method(methods) -> str | None:
    """The method whose answers the labels judge: AdaFuse if it ran, else the first other method that is not a
    single model."""
    fused = [m for m in methods if not m.startswith(SINGLE)]
    default = DecodeConfig().method
    return default if default in fused else (fused[0] if fused else None)


def by_example(rows: list[dict]) -> dict[tuple[str, int], dict[str, dict]]:
    """{(task, line): {method: row}} in task, line order."""
    out: dict[tuple[str, int], dict[str, dict]] = {}
    for r in sorted(rows, key=lambda r: (r["task"], r["line"])):
        out.setdefault((r["task"], r["line"]), {})[r["method"]] = r
    return out


def labels(methods: dict[str, dict]) -> list[str]:
    """An example's labels from its rows' scores (every label that applies; OTHER when none does)."""
    out = []
    ens = ensemble_method(methods)
    members = [r for m, r in methods.items() if m.startswith(SINGLE)]
    if ens is not None and members:
        e = right(methods[ens])
        good = [right(r) for r in members]
        if not e and any(good):
            out.append(WRONG_BUT_MEMBER)
        if e and not any(good):
            out.append(RIGHT_ALONE)
    if not any(right(r) for r in methods.values()):
        out.append(ALL_WRONG)
    elif all(right(r) for r in methods.values()):
        out.append(ALL_RIGHT)
    if any(not r["prediction"].strip() for r in methods.values()):
        out.append(EMPTY)
    return out or [OTHER]


def _gold(gold) -> str:
    return gold if isinstance(gold, str) else " | ".join(dict.fromkeys(gold))


def _score(row: dict) -> float:
    return round(row["scores"].get(TASKS[row["task"]].main_metric, 0.0), 3)


def _short(text: str, n: int, end: bool = False) -> str:
    """At most `n` characters of one line: the start, or the end (`end`: a question comes last in its passage)."""
    text = " ".join(text.split())
    if len(text) <= n:
        return text
    return "…" + text[-(n - 1):] if end else text[: n - 1] + "…"


def example_table(rows: list[dict], show: str = ALL) -> list[dict]:
    """One row per example, compact enough to read: line, its labels, the first gold answers, per method its answer
    marked ✓/✗ under the labels' rule and its score under the task's main metric, then the question's end (the CSV
    holds everything in full); `show`: only examples with that label."""
    if show != ALL and show not in LABELS:
        raise ConfigError(f"unknown filter {show!r}: pick one of {ALL!r}, {', '.join(map(repr, LABELS))}")
    out = []
    for (task, line), methods in by_example(rows).items():
        tags = labels(methods)
        if show != ALL and show not in tags:
            continue
        first = next(iter(methods.values()))
        metric = TASKS[task].main_metric
        golds = [first["gold"]] if isinstance(first["gold"], str) else list(dict.fromkeys(first["gold"]))
        row = {"line": line, "labels": "; ".join(tags),
               "gold": _short(" | ".join(golds[:3]) + (f" (+{len(golds) - 3})" if len(golds) > 3 else ""), 60)}
        for m in sorted(methods, key=lambda m: (m.startswith(SINGLE), m)):  # ensembles first, then each member
            r = methods[m]
            row[m] = f"{'✓' if right(r) else '✗'} {_short(r['prediction'], 60) or '(empty)'}"
            row[f"{m} {metric}"] = _score(r)
        row["question"] = _short(first["question"], 100, end=True)  # last: the longest, the least compared
        out.append(row)
    return out


def write_csv(rows: list[dict], path: str | Path) -> Path:
    """Every example's full row (the whole question, every metric of every method) as CSV."""
    out = []
    for (task, line), methods in by_example(rows).items():
        first = next(iter(methods.values()))
        row = {"task": task, "line": line, "labels": "; ".join(labels(methods)), "question": first["question"],
               "gold": _gold(first["gold"])}
        for m, r in methods.items():
            row[f"{m}: answer"] = r["prediction"]
            row[f"{m}: output"] = r["trace"]["output"]
            row.update({f"{m}: {k}": v for k, v in r["scores"].items()})
            row[f"{m}: right"] = int(right(r))
            row[f"{m}: seconds"] = round(decode_seconds(r), 3)
        out.append(row)
    path = Path(path)
    fields = list(dict.fromkeys(k for r in out for k in r))
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(out)
    return path


def example_rows(rows: list[dict], line: int, task: str | None = None) -> dict[str, dict]:
    """{method: row} of one evaluated example (`task`: needed only when the run holds several tasks)."""
    found = {k: v for k, v in by_example(rows).items() if k[1] == line and (task is None or k[0] == task)}
    if not found:
        lines = sorted({r["line"] for r in rows})
        raise ConfigError(f"no evaluated example on line {line}: this run has lines "
                          f"{', '.join(map(str, lines[:20]))}{' …' if len(lines) > 20 else ''}" if lines
                          else "no evaluation yet: press Run evaluation first")
    if len(found) > 1:
        raise ConfigError(f"line {line} is in several tasks ({', '.join(k[0] for k in found)}): pick the task")
    return next(iter(found.values()))


def split(methods: dict[str, dict], opened: str) -> tuple[Trace, dict[str, Trace], dict[str, Trace]]:
    """The opened method's trace, each single model's own decode ({model: trace}) and the other ensembles'."""
    if opened not in methods:
        raise ConfigError(f"{opened!r} did not run on this example: pick one of {', '.join(methods)}")
    trace = Trace.from_dict(methods[opened]["trace"])
    singles = {t.models[0]: t for t in (Trace.from_dict(r["trace"]) for m, r in methods.items()  # by the model's name
                                        if is_solo(r) and m != opened)}
    others = {m: Trace.from_dict(r["trace"]) for m, r in methods.items() if not m.startswith(SINGLE) and m != opened}
    return trace, singles, others


def example_html(methods: dict[str, dict], opened: str, notes: list[str] = ()) -> str:
    """Everything about one example: its question (the passage too), the gold answer(s), every method's answer and
    score side by side (the opened one marked), its labels, and `notes` (e.g. where the ensemble left a member)."""
    first = next(iter(methods.values()))
    task = TASKS[first["task"]]
    cells = []
    for m in sorted(methods, key=lambda m: (m != opened, m.startswith(SINGLE), m)):
        r = methods[m]
        scores = " · ".join(f"{k} {v:.3g}" for k, v in r["scores"].items())
        mark = "✓ right" if right(r) else "✗ wrong"
        head = f"{m}{' (opened)' if m == opened else ''}"
        cells.append(f'<div class="af-col"><b>{html.escape(head)}</b><div class="af-meta">{html.escape(scores)} · '
                     f'{mark}</div><pre>{html.escape(r["prediction"]) or "(empty)"}</pre></div>')
    question = html.escape(first["question"]).replace("\n", "<br>")
    extra = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (f'<div class="af-example" role="region" aria-label="The opened example">'
            f'<p class="af-meta">{html.escape(task.name)} line {first["line"]} · labels: '
            f'{html.escape("; ".join(labels(methods)))} · right means {html.escape(rule(task.name))}</p>'
            f'<details open><summary>Question{" and passage" if len(first["question"]) > 300 else ""}</summary>'
            f'<p>{question}</p></details>'
            f'<p><b>Gold:</b> {html.escape(_gold(first["gold"]))}</p>'
            f'<div class="af-grid">{"".join(cells)}</div>'
            + (f'<ul class="af-notes">{extra}</ul>' if extra else "") + "</div>")


def column_widths(table: list[dict]) -> list[str]:
    """Widths for the table's columns (answers wrap inside them instead of pushing the others off screen)."""
    if not table:
        return []
    width = {"line": "56px", "labels": "150px", "gold": "160px", "question": "320px"}
    return [width.get(c, "90px" if c.rsplit(" ", 1)[-1] in ("em", "f1", "acc", "chrf") else "170px") for c in table[0]]


def members(rows: list[dict]) -> list[str]:
    """The models an evaluation ran alone, by the names their traces (and the fused ones) give them."""
    return sorted({r["trace"]["models"][0] for r in rows if is_solo(r)})


def right_models(methods: dict[str, dict]) -> set[str]:
    """The models whose own decode of this example is right."""
    return {r["trace"]["models"][0] for r in methods.values() if is_solo(r) and right(r)}


def departures_of(trace: Trace, singles: dict[str, Trace], methods: dict[str, dict]):
    """Where an opened trace leaves each member's own decode: (the divergences, the one to look at first — a member
    that was right where the opened answer is wrong, else the earliest —, a note when there is none)."""
    if len(trace.models) == 1:
        return [], None, f"{trace.models[0]}'s own decode: one model alone, nothing was fused"
    found = [d for m, single in singles.items() if (d := divergence(trace, single, m)) is not None]
    if not found:
        return [], None, ("the opened answer follows every member's own decode" if singles
                          else "no single-model run of this example to compare with")
    good = right_models(methods)
    return found, min(found, key=lambda d: (d.model not in good, d.round)), ""
