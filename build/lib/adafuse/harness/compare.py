"""Methods compared on the same examples: per-example scores, a paired bootstrap, lookups in a summary."""
from __future__ import annotations

import random
from collections import defaultdict
from typing import Iterable

from .tasks import TASKS


def per_example_scores(rows: list[dict]) -> dict[tuple[str, str], dict[int, float]]:
    """(task, method) → {example line: main-metric score on a 0–100 scale} (translation metrics already are)."""
    out: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for r in rows:
        task = TASKS.get(r["task"])
        if task:
            scale = 1.0 if task.metric == "translation" else 100.0
            out[(r["task"], r["method"])][r["line"]] = scale * r["scores"].get(task.main_metric, 0.0)
    return out


def paired_difference(a: dict[int, float], b: dict[int, float], seed: int = 0, n_boot: int = 2000) -> dict | None:
    """Mean of a − b over the examples both have, a 95 % paired-bootstrap interval, and wins/ties/losses of a;
    None when they share no example. {"n", "mean", "low", "high", "wins", "ties", "losses"}."""
    lines = sorted(set(a) & set(b))
    if not lines:
        return None
    diffs = [a[i] - b[i] for i in lines]
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(n_boot))
    return {"n": len(diffs), "mean": sum(diffs) / len(diffs), "low": means[int(0.025 * n_boot)],
            "high": means[int(0.975 * n_boot) - 1], "wins": sum(d > 0 for d in diffs),
            "ties": sum(d == 0 for d in diffs), "losses": sum(d < 0 for d in diffs)}


def format_difference(d: dict) -> str:
    """A `paired_difference` in one cell: "+1.5 [-0.8, +3.9] 7/30/3" (mean [interval] wins/ties/losses)."""
    return f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}] {d['wins']}/{d['ties']}/{d['losses']}"


def main_score(summary: dict[tuple[str, str], dict], task: str, method: str) -> float | None:
    """The task's main metric in a summary keyed by (task, method) (rows of `evaluate.summarize`); None if absent."""
    row = summary.get((task, method))
    return None if row is None else row.get(TASKS[task].main_metric)


def mean_or_none(values: Iterable[float | None]) -> float | None:
    """Mean of the values that are there (None left out); None when none is."""
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None
