"""`python -m adafuse.harness.results RESULTS_DIR DOCS_DIR`: docs/results.md and Plotly figures (HTML + PNG) from eval runs."""
from __future__ import annotations

import json
import random
import sys
from collections import defaultdict
from pathlib import Path

import plotly.graph_objects as go

from .figures import save
from .evaluate import _markdown, load_results, main_metric_table, summarize
from .tasks import TASKS
from ..trace import TRACE_VERSION

PAPER_WPR = {"nq": (80.29, 15.53, 4.18), "squad": (57.64, 21.27, 21.09), "flores-de-en": (34.02, 19.89, 46.09)}


def _score(summary: dict, task: str, method: str):
    row = summary.get((task, method))
    return None if row is None else row.get(TASKS[task].main_metric)


def _mean(vals):
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def paired_difference(a: dict[int, float], b: dict[int, float], seed: int = 0, n_boot: int = 2000):
    """Mean of a − b over the examples both have, a 95 % paired-bootstrap interval, and wins/ties/losses of a."""
    lines = sorted(set(a) & set(b))
    if not lines:
        return None
    diffs = [a[i] - b[i] for i in lines]
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(n_boot))
    return {"n": len(diffs), "mean": sum(diffs) / len(diffs), "low": means[int(0.025 * n_boot)],
            "high": means[int(0.975 * n_boot) - 1], "wins": sum(d > 0 for d in diffs),
            "ties": sum(d == 0 for d in diffs), "losses": sum(d < 0 for d in diffs)}


def _per_example(rows: list[dict]) -> dict[tuple[str, str], dict[int, float]]:
    """(task, method) → {example line: main-metric score on a 0–100 scale}."""
    out: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for r in rows:
        task = TASKS.get(r["task"])
        if task:
            scale = 1.0 if task.metric == "translation" else 100.0
            out[(r["task"], r["method"])][r["line"]] = scale * r["scores"].get(task.main_metric, 0.0)
    return out


OLD_DECODERS = {1: "before the exactness fixes and the end-of-answer event",
                2: "before a stop string spelled over several tokens counted as the end of the answer"}


def _versions(rows: list[dict], order: list[str], tasks: list[str]) -> list[str]:
    """Which decoder version produced each (task, method). Version 3 changed only how a stop string of several tokens
    ends the answer, so a version-2 row counts as current where every stop string of its task is one character (it
    could only gain a merged spelling such as ".\n")."""
    seen: dict[tuple[str, str], set] = defaultdict(set)
    for r in rows:
        seen[(r["task"], r["method"])].add(r["trace"].get("version", 1))
    methods = order + sorted({m for _, m in seen} - set(order))
    old: dict[int, list[str]] = defaultdict(list)
    for m in methods:
        for t in tasks:
            v = max(seen.get((t, m)) or {TRACE_VERSION})
            if v < 2 or (v == 2 and any(len(s) > 1 for s in TASKS[t].stop)):
                old[v].append(f"{m} on {t}")
    if not old:
        return [f"Every row above was decoded with the current decoder (trace version {TRACE_VERSION}).", ""]
    parts = [f"{', '.join(old[v])} — trace version {v} ({OLD_DECODERS[v]})" for v in sorted(old)]
    return [f"Decoded with the current decoder (trace version {TRACE_VERSION}; version-2 rows count as current on "
            "tasks whose stop strings are one character: there version 3 only adds spellings that merge the stop with the "
            "text before it, such as '.\\n') except: "
            + "; ".join(parts) + ".", ""]


def _seconds_per_word(rows: list[dict]) -> dict[tuple[str, str], float]:
    """(task, method) -> decode seconds per output word over all its examples."""
    secs: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for r in rows:
        c = secs[(r["task"], r["method"])]
        c[0] += r["seconds"]
        c[1] += sum(x["words"] for x in r["trace"]["rounds"])
    return {k: v[0] / v[1] for k, v in secs.items() if v[1]}


def _empty(rows: list[dict]) -> dict[tuple[str, str], tuple[int, int]]:
    """(task, method) -> (empty answers, examples)."""
    out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        c = out[(r["task"], r["method"])]
        c[0] += not r["trace"]["output"].strip()
        c[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def _empties(rows, results: Path, order, tasks, singles, obs) -> list[str]:
    """Empty answers per method (the decoded output is blank), against each method's worse single member, and the
    translation tasks before and after the end-of-answer fix (results/v1: the previous decoder's committed run)."""
    now = _empty(rows)
    table = [{"method": m, **{t: (f"{now[(t, m)][0]}/{now[(t, m)][1]}" if (t, m) in now else None) for t in tasks}}
             for m in order]
    out = ["## Empty answers", "", "Examples whose decoded output is blank, per method and task (empty/examples).", "",
           _markdown(table), ""]
    worse = {t: max((now[(t, s)][0] for s in singles if (t, s) in now), default=None) for t in tasks}
    over = [f"{m} on {t} ({now[(t, m)][0]} vs {worse[t]})" for m in order if m not in singles for t in tasks
            if (t, m) in now and worse[t] is not None and now[(t, m)][0] > worse[t]]
    obs.append("- Empty answers: " + ("no method produces more than its worse single member alone." if not over else
                                      "more than the worse single member alone: " + "; ".join(over) + "."))
    v1 = results / "v1"
    if v1.is_dir():
        before_rows = load_results(v1)
        before, sb = _empty(before_rows), {(r["task"], r["method"]): r for r in summarize(before_rows)}
        sn = {(r["task"], r["method"]): r for r in summarize(rows)}
        gemma = next((s for s in singles if "gemma" in s), None)
        comp = []
        for t in [t for t in tasks if t.startswith("flores")] + [t for t in tasks if not t.startswith("flores")]:
            for m in [m for m in ("adafuse", "beam", "fixed-span-3", "token-union") if (t, m) in sn and (t, m) in sb]:
                metric = TASKS[t].main_metric
                row = {"task": t, "method": m, "empty before": f"{before[(t, m)][0]}/{before[(t, m)][1]}",
                       "empty now": f"{now[(t, m)][0]}/{now[(t, m)][1]}",
                       "score before": sb[(t, m)].get(metric), "score now": sn[(t, m)].get(metric)}
                if gemma and (t, gemma) in sn and (t, gemma) in sb:
                    gb = sb[(t, m)][metric] - sb[(t, gemma)][metric]
                    gn = sn[(t, m)][metric] - sn[(t, gemma)][metric]
                    row["gap to Gemma before"], row["gap to Gemma now"] = round(gb, 2), round(gn, 2)
                    if m == "adafuse" and t.startswith("flores"):
                        halved = gn >= gb / 2
                        obs.append(f"- {t}: AdaFuse's chrF gap to Gemma alone {gb:+.1f} before the end-of-answer fix, "
                                   f"{gn:+.1f} now — {'at least halved' if halved else 'not halved'} "
                                   f"(empty answers {before[(t, m)][0]} → {now[(t, m)][0]} of {now[(t, m)][1]}).")
                comp.append(row)
        out += ["## The end of the answer as one event: before and after", "",
                "`results/v1/` is the previous committed run (trace version 1), where a candidate such as "
                "`\\n\\nGerman:` was scored over the few-shot format it continues into; now the end of the answer is "
                "one event (end tokens and tokens that start a stop string) and text past it is never scored. "
                "Main metric (chrF for Flores) and empty answers on the same examples.", "", _markdown(comp), ""]
    return out


# exploration strategies (issue 13): B → method label per strategy; B=3 surface is "adafuse", B=3 beam is "beam"
STRATEGIES = {
    "surface": {b: f"adafuse[branches={b}]" for b in (2, 4, 5)} | {3: "adafuse"},
    "embedding": {b: f"adafuse[exploration=embedding,branches={b}]" for b in (2, 4, 5)}
    | {3: "adafuse[exploration=embedding]"},
    "beam": {b: f"adafuse[branches={b},diversity=false]" for b in (2, 4, 5)} | {3: "beam"},
}
EMBEDDING_LAMBDA3 = "adafuse[exploration=embedding,explore_lambda=3]"
DIVERSITY_MODEL = "gemma3-270m"  # whose input embeddings measure how far apart a pool's candidates are


class PoolEmbedder:
    """A candidate text as the mean of one fixed model's input-embedding rows of its tokens (tokenized alone, no
    special tokens); cosine distances between those means."""

    def __init__(self, name: str = DIVERSITY_MODEL):
        from ..loading import get_model
        lm = get_model(name)
        self.name, self.tokenizer = lm.name, lm.tokenizer
        self.weight = lm.model.get_input_embeddings().weight.detach().float().cpu()
        self.cache: dict = {}

    def vector(self, text: str):
        text = text.strip()
        if text not in self.cache:
            ids = self.tokenizer(text, add_special_tokens=False).input_ids if text else []
            self.cache[text] = self.weight[ids].mean(0) if ids else None
        return self.cache[text]

    def mean_distance(self, texts: list[str]) -> float | None:
        import torch
        vecs = [v for v in (self.vector(t) for t in dict.fromkeys(texts)) if v is not None]
        if len(vecs) < 2:
            return None
        e = torch.nn.functional.normalize(torch.stack(vecs), dim=-1)
        cos = e @ e.T
        iu = torch.triu_indices(len(vecs), len(vecs), 1)
        return float((1.0 - cos[iu[0], iu[1]]).mean())


def pool_diversity(rows: list[dict], embedder: PoolEmbedder | None) -> dict[tuple[str, str], dict]:
    """(task, method) → over its explore rounds (some model explored or ran beam search): mean distinct answers per
    pool (candidate texts after SQuAD normalization; the bare end of the answer counts as the answer ""), mean
    pairwise embedding distance of the pool (rounds with at least two candidates that hold text), and the counts."""
    from .metrics import normalize_answer
    acc: dict[tuple[str, str], list] = defaultdict(lambda: [0, 0.0, 0, 0.0])
    for r in rows:
        a = acc[(r["task"], r["method"])]
        for rd in r["trace"]["rounds"]:
            if not any(st["mode"] in ("explore", "beam") for st in rd["steps"]):
                continue
            texts = [c["text"] for c in rd["candidates"]]
            a[0] += 1
            a[1] += len({normalize_answer(t) for t in texts})
            dist = embedder.mean_distance(texts) if embedder else None
            if dist is not None:
                a[2] += 1
                a[3] += dist
    return {k: {"rounds": v[0], "answers": v[1] / v[0] if v[0] else None, "distance_rounds": v[2],
                "distance": v[3] / v[2] if v[2] else None} for k, v in acc.items()}


def changed_picks(rows: list[dict]) -> dict[tuple[str, str], tuple[int, int]]:
    """(task, method) → (explore steps whose embedding selection picked other tokens than the surface strategy would
    have from the same distribution, explore steps with an embedding selection)."""
    out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        for rd in r["trace"]["rounds"]:
            for st in rd["steps"]:
                sel = st.get("selection") or {}
                if sel.get("strategy") != "embedding":
                    continue
                toks = sel.get("tokens", [])
                reps = [t["token"] for t in toks if t.get("skip") in ("", "redundant", "outscored")]
                picked = {t["token"] for t in toks if t.get("picked")}
                c = out[(r["task"], r["method"])]
                c[0] += picked != set(reps[:len(picked)])
                c[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def _exploration(rows, per_ex, tasks, figs: Path, obs: list[str]) -> list[str]:
    """The exploration-strategy ablation: B = 2..5 × {surface, embedding, beam} on NQ, TriviaQA and SQuAD, the task
    score beside two measures of pool diversity, the issue's target at B = 3 and B's trend per strategy."""
    xt = [t for t in ("nq", "triviaqa", "squad") if t in tasks]
    labels = [m for series in STRATEGIES.values() for m in series.values()] + [EMBEDDING_LAMBDA3]
    if not xt or not any((t, STRATEGIES["embedding"][3]) in per_ex for t in xt):
        return []
    common = {}
    for t in xt:  # the examples every setting of this ablation ran on (the main table's examples)
        sets = [set(per_ex[(t, m)]) for m in labels if (t, m) in per_ex]
        common[t] = set.intersection(*sets) if sets else set()
    wanted = {m for m in labels}
    sub = [r for r in rows if r["task"] in xt and r["method"] in wanted and r["line"] in common[r["task"]]]
    try:
        embedder = PoolEmbedder()
        model_note = f"{embedder.name}'s"
    except Exception as exc:  # noqa: BLE001 - the report still shows scores and distinct answers
        embedder, model_note = None, f"(not computed: {type(exc).__name__})"
    div = pool_diversity(sub, embedder)

    def score(t, m):
        vals, lines = per_ex.get((t, m), {}), common[t]
        return sum(vals[i] for i in lines) / len(lines) if lines and lines <= set(vals) else None

    def fmt(v, nd=2):
        return None if v is None else round(v, nd)

    metric = {t: TASKS[t].main_metric.upper() for t in xt}
    table = []
    settings = [(b, st) for b in (2, 3, 4, 5) for st in STRATEGIES] + [(3, "embedding λ=3")]
    for b, st in settings:
        m = EMBEDDING_LAMBDA3 if st == "embedding λ=3" else STRATEGIES[st][b]
        if not any((t, m) in per_ex for t in xt):
            continue
        row = {"B": b, "strategy": st}
        for t in xt:
            d = div.get((t, m), {})
            row[f"{t} {metric[t]}"] = fmt(score(t, m))
            row[f"{t} answers/pool"] = fmt(d.get("answers"))
            row[f"{t} distance"] = fmt(d.get("distance"), 3)
        table.append(row)
    n = min((len(v) for v in common.values()), default=0)
    out = [f"## Exploration strategies: surface, embedding, beam (NQ, TriviaQA, SQuAD; the {n} examples every "
           "setting ran on)", "",
           "How an uncertain model picks its B first tokens. *surface*: the B most probable tokens whose texts differ "
           "once whitespace is stripped (AdaFuse's diversity-aware exploration). *embedding*: greedy subset selection "
           "in the model's own input-embedding space — the most probable token first, then each next pick maximizes "
           "log p − λ · (its largest kernel similarity to a pick), the kernel exp(−d/h) over squared distances of "
           "unit embedding rows with h their median among the top-k (λ = 1 unless said; `adafuse/selection.py`). "
           "*beam*: width-B beam search over the word (no diversity). Score: the task's main metric ×100 (EM for NQ "
           "and TriviaQA, F1 for SQuAD). Pool diversity, over each run's explore rounds (rounds in which some model "
           "explored or ran beam search): *answers/pool* is the mean number of distinct candidate texts in the pool "
           "after SQuAD answer normalization (lower case, no punctuation or articles); *distance* is the mean over "
           "those rounds of the mean pairwise cosine distance between the pool's candidates, each candidate embedded "
           f"as the mean of {model_note} input-embedding rows of its tokens (the text tokenized alone; candidates "
           "without text — the bare end of the answer — and rounds with fewer than two texts left out). Both are "
           "computed from the stored traces.", "", _markdown(table), ""]
    b3 = []
    for t in xt:
        se, ss = score(t, STRATEGIES["embedding"][3]), score(t, STRATEGIES["surface"][3])
        de, ds = div.get((t, STRATEGIES["embedding"][3]), {}), div.get((t, STRATEGIES["surface"][3]), {})
        if se is None or ss is None:
            continue
        more = [k for k in ("answers", "distance") if de.get(k) is not None and ds.get(k) is not None
                and de[k] > ds[k]]
        b3.append((t, se, ss, de, ds, more))
    changed = changed_picks(sub)
    if b3:
        both = [t for t, se, ss, _, _, more in b3 if se >= ss and len(more) == 2]
        by_distance = [t for t, se, ss, _, _, more in b3 if se >= ss and "distance" in more]
        met = len(both) >= 2
        detail = "; ".join(
            f"{t}: score {se:.1f} vs {ss:.1f}, answers/pool {_num(de.get('answers'))} vs {_num(ds.get('answers'))}, "
            f"distance {_num(de.get('distance'), 3)} vs {_num(ds.get('distance'), 3)}" for t, se, ss, de, ds, _ in b3)
        obs.append(f"- Exploration by embedding vs by surface at B = 3 (embedding first): {detail}. Target (score at "
                   "or above surface with larger pool diversity on at least 2 of 3 tasks): **"
                   + ("met" if met else "not met") + f"** — score ≥ and both diversity measures larger on "
                   f"{', '.join(both) or 'no task'}; score ≥ and larger embedding distance on "
                   f"{', '.join(by_distance) or 'no task'}."
                   + (f" Ties on {', '.join(t for t, se, ss, *_ in b3 if se == ss)} count as 'at or above'."
                      if any(se == ss for t, se, ss, *_ in b3) else ""))
        paired = []
        for t, *_ in b3:
            d = paired_difference(per_ex[(t, STRATEGIES["embedding"][3])], per_ex[(t, STRATEGIES["surface"][3])])
            if d:
                paired.append(f"{t} {d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}] "
                              f"({d['wins']}/{d['ties']}/{d['losses']})")
        flips = [f"{t} {changed[(t, m)][0]}/{changed[(t, m)][1]}" for t in xt for m in [STRATEGIES["embedding"][3]]
                 if changed.get((t, m), (0, 0))[1]]
        flips3 = [f"{t} {changed[(t, EMBEDDING_LAMBDA3)][0]}/{changed[(t, EMBEDDING_LAMBDA3)][1]}" for t in xt
                  if changed.get((t, EMBEDDING_LAMBDA3), (0, 0))[1]]
        obs.append("- Embedding − surface at B = 3, per example (main metric points, 95 % paired-bootstrap interval, "
                   "examples better/same/worse): " + "; ".join(paired) + ". Explore steps where the embedding "
                   "selection picked other first tokens than the surface strategy would have from the same "
                   "distribution, λ = 1: " + (", ".join(flips) or "none")
                   + (f"; λ = 3: {', '.join(flips3)}" if flips3 else "")
                   + ".")
    trends, slopes = [], {}
    fig_s, fig_d = go.Figure(), go.Figure()
    for st, series in STRATEGIES.items():
        bs = [b for b in (2, 3, 4, 5) if all(score(t, series[b]) is not None for t in xt)]
        if len(bs) < 2:
            continue
        ys = [sum(score(t, series[b]) for t in xt) / len(xt) for b in bs]
        dv = [_mean([div.get((t, series[b]), {}).get("distance") for t in xt]) for b in bs]
        slope = slopes[st] = _slope(bs, ys)
        trends.append(f"{st} " + " → ".join(f"{y:.1f}" for y in ys)
                      + f" (least-squares slope {slope:+.2f} points per branch: "
                      + ("up" if slope > 0 else "down" if slope < 0 else "flat") + ")")
        fig_s.add_trace(go.Scatter(x=bs, y=ys, mode="lines+markers", name=st))
        if all(v is not None for v in dv):
            fig_d.add_trace(go.Scatter(x=bs, y=dv, mode="lines+markers", name=st))
    if trends:
        obs.append(f"- B from 2 to 5 per exploration strategy (mean main metric over {', '.join(xt)}): "
                   + "; ".join(trends) + ". Paper: B up trends up with diversity, beam search degrades as B grows — "
                   + "; ".join(f"{st}: {'up' if v > 0 else 'not up'}" + (" (paper: down)" if st == "beam" else "")
                               for st, v in slopes.items())
                   + ". With the diverse strategies the trend is **"
                   + ("reproduced" if all(slopes.get(st, 0) > 0 for st in ("surface", "embedding")) else
                      "not reproduced" if all(slopes.get(st, 0) <= 0 for st in ("surface", "embedding")) else
                      "reproduced for one strategy only") + "**; beam's decline is **"
                   + ("reproduced" if slopes.get("beam", 0) < 0 else "not reproduced") + "**.")
        fig_s.update_layout(title=f"Branches B per exploration strategy (mean main metric, {', '.join(xt)})",
                            xaxis_title="B", yaxis_title="score ×100", xaxis_dtick=1)
        out += [save(fig_s, figs, "ablation_exploration"), ""]
        if fig_d.data:
            fig_d.update_layout(title="Pool diversity per exploration strategy (mean pairwise embedding distance)",
                                xaxis_title="B", yaxis_title="cosine distance", xaxis_dtick=1)
            out += [save(fig_d, figs, "ablation_exploration_diversity"), ""]
    return out


GATES = Path(__file__).resolve().parents[2] / "assets" / "gates"
WEIGHTED = ("adafuse+weights", "adafuse+gate", "adafuse+tuned", "adafuse+per-task")


PER_TASK = "adafuse+per-task"


def per_task_choice(results: Path, task: str) -> dict | None:
    """The static weighting chosen for a task on training lines: from the task's own searches per token and per word
    (gate/search-<task>-token.json and -word.json, `gate search` on that task alone) where both exist, else its
    family's (gate/normalize-<family>.json). {"ratio": first ÷ second weight, "normalize", "weights", "reward",
    "source"}; None where neither exists."""
    own = [results / "gate" / f"search-{task}-{n}.json" for n in ("token", "word")]
    if all(p.exists() for p in own):
        cands = []
        for p in own:
            res = json.loads(p.read_text())
            for i, row in enumerate(res["grid"]):
                cands.append((row["reward"], res["normalize"] == "token", -i, row["weights"], res["normalize"],
                              res["examples"], p.name))
        reward, _, _, w, norm, n, src = max(cands)
    else:
        fam = results / "gate" / f"normalize-{'mt' if TASKS[task].metric == 'translation' else 'qa'}.json"
        if not fam.exists():
            return None
        res = json.loads(fam.read_text())
        w, norm, n, src = res["weights"], res["chosen"], res["examples"], fam.name
        reward = res[norm]
    if len(w) != 2 or w[1] <= 0:
        return None
    return {"ratio": w[0] / w[1], "normalize": norm, "weights": list(w), "reward": reward, "examples": n,
            "source": src}


def per_task_rows(rows: list[dict], results: Path) -> tuple[list[dict], dict[str, dict]]:
    """`adafuse+per-task`: for each task, the rows of the run decoded with the static weighting chosen for that task
    on training lines (`per_task_choice`) — no decode of its own: the decoder is deterministic, so a run with the same
    settings is that method's run. Returns the rows (relabelled, `from` naming the run) and per task the choice."""
    runs = static_runs(rows)
    out, chosen = [], {}
    for task in sorted({r["task"] for r in rows}):
        pick = per_task_choice(results, task) if task in TASKS else None
        hit = pick and runs.get((task, round(pick["ratio"], 9), pick["normalize"]))
        if hit:
            out += [{**r, "method": PER_TASK, "from": hit[0]} for r in rows
                    if r["task"] == task and r["method"] == hit[0]]
            chosen[task] = {**pick, "run": hit[0]}
    return out, chosen


def _gates(rows, per_ex, summary, table, tasks, singles, results: Path, figs: Path, obs: list[str],
           per_task: dict | None = None) -> list[str]:
    """Issue 12: static weights and the learned gate against plain AdaFuse and the better single model."""
    have = [m for m in WEIGHTED if any((t, m) in per_ex for t in tasks)]
    if not have or not singles:
        return []
    scores = {r["method"]: r for r in table}
    avg = {m: scores[m].get("average") for m in scores}
    best = max(singles, key=lambda m: avg.get(m) or -1)
    out = ["## Per-model weights and a learned gate", "",
           "`adafuse+weights`: the fused score Σ w·NLL / Σ w with the static weights that scored best on training "
           "examples; `adafuse+gate`: weights chosen each round by a learned gate (`adafuse/gate.py`, "
           "`assets/gates/`) from what the models show that round. Training examples are lines 101 and later of each "
           "data file; every number in this report is from lines 1–50, so the two never meet. One weighting and one gate per "
           "task family: QA (NQ, TriviaQA, SQuAD) and translation (Flores, both directions); GSM8K, where no method "
           "scores above 0 and so no reward can teach anything, uses the QA family's.", ""]
    search = []
    for path in sorted(results.glob("gate/search-*.json")):
        res = json.loads(path.read_text())
        own = next((c for t, c in (per_task or {}).items()  # one task's own search: chosen across token and word
                    if path.stem in (f"search-{t}-token", f"search-{t}-word")), None)
        for row in res["grid"]:
            chosen = (own["source"] == path.name and own["weights"] == row["weights"]) if own \
                else row["weights"] == res["best"]
            search.append({"search": path.stem.removeprefix("search-"), "tasks": ", ".join(res["tasks"]),
                           "NLL averaged per": res.get("normalize", "token"),
                           "weights (" + " / ".join(res["models"]) + ")": " / ".join(f"{w:g}" for w in row["weights"]),
                           "mean reward": round(row["reward"], 4), "examples": res["examples"],
                           "chosen": "✓" if chosen else ""})
    if search:
        out += ["Static weights tried on the training examples (reward: token F1 for QA, chrF/100 for translation; "
                "a task's own searches, per token and per word, choose one weighting between them for "
                f"`{PER_TASK}`):", "", _markdown(search), ""]
    norms = []
    for path in sorted(results.glob("gate/normalize-*.json")):
        res = json.loads(path.read_text())
        norms.append({"family": path.stem.removeprefix("normalize-"), "tasks": ", ".join(res["tasks"]),
                      "weights": " / ".join(f"{w:g}" for w in res["weights"]), "examples": res["examples"],
                      "reward, NLL per token": round(res["token"], 4), "reward, NLL per word": round(res["word"], 4),
                      "chosen": res["chosen"]})
    if norms:
        out += ["`adafuse+tuned`: the same static weights, with each model's NLL of a candidate averaged over its "
                "tokens (the paper) or over its words (the end of the answer counting as one), whichever scored better "
                "on the family's training examples — tried after the traces showed why the weighted methods trail "
                "the strong model on Flores (below):", "", _markdown(norms), ""]
    picks = [{"task": t, "weights": " / ".join(f"{w:g}" for w in c["weights"]), "NLL averaged per": c["normalize"],
              "training reward": round(c["reward"], 4), "training examples": c["examples"],
              "chosen in": f"results/gate/{c['source']}", "reported run with these settings": c["run"]}
             for t, c in (per_task or {}).items() if t in tasks]
    obs += _selection_notes(rows, summary, results, per_task or {}, tasks)
    if picks:
        out += [f"`{PER_TASK}`: static weights and NLL averaging chosen for each task on its own training lines where "
                "the task has its own searches (`gate search --task TASK --normalize token|word`; the Flores "
                "directions), else its family's choice (`adafuse+tuned`'s). It decodes nothing of its own: the decoder "
                "is deterministic, so each task's cells are the reported run decoded with exactly those settings, "
                "named in the last column:", "", _markdown(picks), ""]
    gates, fig = [], go.Figure()
    for path in sorted(GATES.glob("*.json")):
        g = json.loads(path.read_text())
        tr = g.get("trained", {})
        curve = tr.get("curve", [])
        if not curve:
            continue
        k = 20
        smooth = [sum(c["reward"] for c in curve[max(0, i - k + 1): i + 1]) / len(curve[max(0, i - k + 1): i + 1])
                  for i in range(len(curve))]
        fig.add_trace(go.Scatter(x=[c["step"] for c in curve], y=smooth, mode="lines",
                                 name=f"{path.stem} ({', '.join(tr.get('tasks', []))})"))
        first, last = curve[: len(curve) // 4], curve[-(len(curve) // 4):]
        gates.append({"gate": f"assets/gates/{path.name}", "tasks": ", ".join(tr.get("tasks", [])),
                      "parameters": sum(len(r) for r in g["W"]) + len(g["b"]), "steps": len(curve),
                      "training examples": tr.get("examples"),
                      "reward, first quarter": round(sum(c["reward"] for c in first) / max(1, len(first)), 4),
                      "reward, last quarter": round(sum(c["reward"] for c in last) / max(1, len(last)), 4),
                      "rounds sampled off the winner": f"{sum(c['sampled_off_winner'] for c in curve)}/"
                                                       f"{sum(c['choices'] for c in curve)}"})
    if gates:
        fig.update_layout(title="Gate training: reward of the sampled answers (moving mean of 20 steps)",
                          xaxis_title="step (one training example)", yaxis_title="reward")
        out += ["Learned gates (REINFORCE from the final answer's reward; the choice sampled from the gated scores "
                "while training, the lowest score at test time):", "", _markdown(gates), "",
                save(fig, figs, "gate_learning_curve"), ""]
    picks = []
    for path in sorted(results.glob("gate/select-*.json")):
        res = json.loads(path.read_text())
        for row in res["rows"]:
            picks.append({"family": res["family"], "gate": row["gate"], "NLL averaged per": row["normalize"],
                          "steps": row["steps"], **{f"reward {t}": round(v, 4) for t, v in row["per_task"].items()},
                          "mean reward": round(row["reward"], 4), "examples per task": res["per_task_examples"],
                          "chosen": "✓" if row["gate"] == res["chosen"] else ""})
    if picks:
        out += ["Which gate a family ships: each candidate gate decodes the first training lines of every task of the "
                "family greedily (as at test time, with the NLL averaging it was trained with); the higher mean reward "
                "is shipped as `assets/gates/<family>.json` (`experiments/gate_select.py`):", "", _markdown(picks), ""]
    # the gate's weights per task, from the traces of the reported examples
    shares = []
    for t in tasks:
        ws = defaultdict(list)
        for r in rows:
            if r["task"] == t and r["method"] == "adafuse+gate":
                for rd in r["trace"]["rounds"]:
                    if rd.get("features") and rd.get("weights"):
                        tot = sum(rd["weights"].values()) or 1.0
                        for m, w in rd["weights"].items():
                            ws[m].append(w / tot)
        if ws:
            shares.append({"task": t, **{f"mean share {m}": round(sum(v) / len(v), 3) for m, v in ws.items()},
                           "gated rounds": len(next(iter(ws.values())))})
    if shares:
        out += ["The gate's weight share per model (rounds with a scored pool, reported examples):", "",
                _markdown(shares), ""]
    out += _gate_start(rows, per_ex, summary, tasks, obs)
    strong = best.removeprefix("greedy:")
    why = _departures(rows, tasks, [m for m in have if m != PER_TASK], strong)  # per-task: another run's rows
    for w in why:  # why a weighted method trails the strong model on translation, in the traces' numbers
        left = int(w[f"left {strong}'s word"].split()[0])
        obs.append(f"- Why {w['method']} trails {strong} on {w['task']} (from the traces): it leaves {strong}'s own "
                   f"first word in {w[f'left {strong}' + chr(39) + 's word']} of {w['rounds']} rounds — "
                   f"{w['its own longer word']} times for one of {strong}'s own longer words (more of its tokens), "
                   f"{w['its own other word']} for another of its words, {w['the other model' + chr(39) + 's']} for "
                   f"the other model's, {w['the end']} for the end; in {w['own score prefers']} of the {left} "
                   f"{strong}'s own averaged NLL preferred the chosen candidate, and a summed NLL would have kept its "
                   f"word in {w['kept by a sum']}.")
    if why:
        out += [f"Where the weighted methods leave {best}'s own word (rounds of the reported examples in which the "
                f"chosen candidate is not {best.removeprefix('greedy:')}'s first proposal — its greedy span, or its "
                "most likely word when it explores; 'longer': the strong model proposed the chosen word itself and "
                "it is more of its tokens; 'own score prefers': its own length-normalized NLL of the chosen word is "
                "lower than of its first proposal; 'kept by a sum': a summed, not averaged, NLL of the strong model "
                "would have kept its first proposal):", "", _markdown(why), ""]
    out += _judge(per_ex, summary, tasks, best, obs)
    out += _sweep(rows, per_ex, summary, tasks, best, figs, obs)
    # paired differences and the targets
    pair_rows = []
    for t in tasks:
        row = {"task": t}
        for m in have:
            for rival in (best, "adafuse"):
                d = paired_difference(per_ex.get((t, m), {}), per_ex.get((t, rival), {}))
                if d:
                    row[f"{m} − {rival}"] = (f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}] "
                                             f"{d['wins']}/{d['ties']}/{d['losses']}")
        pair_rows.append(row)
    out += ["Per example, the same paired intervals as above (mean difference, 95 % bootstrap interval, "
            "better/same/worse):", "", _markdown(pair_rows), ""]
    for m in have:
        if avg.get(m) is None:
            obs.append(f"- {m}: not run on every task, so no average.")
            continue
        checks = [("the average", avg[m], avg[best])]
        checks += [(t, scores[m].get(t), scores[best].get(t)) for t in ("flores-de-en", "flores-en-de") if t in tasks]
        missed = [f"{what} by {b - a:.2f}" for what, a, b in checks if a is not None and b is not None and a < b]
        sq = scores[m].get("squad")
        above = [scores[x].get("squad") for x in singles if scores[x].get("squad") is not None]
        if sq is not None and above and sq <= max(above):
            missed.append(f"SQuAD's gain over both singles (lost by {max(above) - sq:.2f})")
        obs.append(f"- {m} (target: at or above the better member, {best}, on the average and on each Flores "
                   f"direction, and still above both singles on SQuAD): " + "; ".join(
                       f"{what} {a:.2f} vs {b:.2f}" for what, a, b in checks if a is not None and b is not None)
                   + (f"; squad {sq:.2f} vs " + " / ".join(f"{v:.2f}" for v in above) if sq is not None else "")
                   + f" (plain AdaFuse's average {avg.get('adafuse') or 0:.2f}) — **"
                   + ("met" if not missed else "missed") + "**" + (": " + ", ".join(missed) if missed else "") + ".")
    return out


JUDGE = {"adafuse+judge": "per token", "adafuse+judge+word": "per word"}


def _judge(per_ex, summary, tasks, best: str, obs: list[str]) -> list[str]:
    """One end of the weighting range: AdaFuse with the better member as the only judge (the other model's weight 0; it
    still proposes), against that member's greedy decode, on the tasks where both ran."""
    rows = []
    for t in tasks:
        ref = _score(summary, t, best)
        got = {m: _score(summary, t, m) for m in JUDGE}
        if ref is None or all(v is None for v in got.values()):
            continue
        row = {"task": t, best: ref}
        for m, per in JUDGE.items():
            if got[m] is None:
                continue
            d = paired_difference(per_ex.get((t, m), {}), per_ex.get((t, best), {}))
            row[f"{m} ({per})"] = got[m]
            row[f"{m} − {best}"] = (f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}] "
                                    f"{d['wins']}/{d['ties']}/{d['losses']}" if d else "")
        rows.append(row)
    if not rows:
        return []
    strong = best.removeprefix("greedy:")
    for row in rows:
        gaps = [f"{per} {row[f'{m} ({per})'] - row[best]:+.2f}" for m, per in JUDGE.items() if f"{m} ({per})" in row]
        below = all(row[f"{m} ({per})"] < row[best] for m, per in JUDGE.items() if f"{m} ({per})" in row)
        obs.append(f"- With {strong} as the only judge (the other model's weight 0), AdaFuse on {row['task']} vs "
                   f"{strong} alone: " + ", ".join(gaps) + (
                       f" — below it either way: {strong}'s own judgement of AdaFuse's candidates (its exploration's "
                       "alternatives, the other model's spans) already loses to its greedy first token here, whatever"
                       " the other model's vote adds or takes." if below else "."))
    return [f"With {strong} as the only judge (`weights=0/1`: the other model still proposes, only {strong} scores; "
            "each candidate's NLL averaged per token, the paper, or per word): one end of the weighting range, "
            f"against {strong}'s own greedy decode (score; paired difference, interval, better/same/worse):", "",
            _markdown(rows), ""]


def _selection_notes(rows, summary, results: Path, per_task: dict, tasks) -> list[str]:
    """Per task with its own searches: how the weightings tried on training lines rank on the reported lines (from the
    runs decoded with the same settings), so a miss of the per-task choice can be told from a choice that is wrong."""
    runs = static_runs(rows)
    notes = []
    for t, c in per_task.items():
        files = [results / "gate" / f"search-{t}-{n}.json" for n in ("token", "word")]
        if t not in tasks or c["source"] not in {f.name for f in files}:
            continue
        tried = []
        for f in files:
            res = json.loads(f.read_text())
            for row in res["grid"]:
                w = row["weights"]
                m = runs.get((t, round(w[0] / w[1], 9), res["normalize"]), ("",))[0]
                tried.append((row["reward"], f"{w[0]:g} / {w[1]:g} per {res['normalize']}",
                              _score(summary, t, m) if m else None))
        scored = sorted((v for _, _, v in tried if v is not None), reverse=True)
        chosen = f"{c['weights'][0]:g} / {c['weights'][1]:g} per {c['normalize']}"
        mine = next(v for _, name, v in tried if name == chosen)
        top = max(tried, key=lambda x: -1 if x[2] is None else x[2])
        runner = sorted((r for r, _, _ in tried), reverse=True)[1]
        notes.append(f"- How {PER_TASK} chose on {t}: {len(tried)} weightings scored {min(r for r, _, _ in tried):.4f}"
                     f"–{max(r for r, _, _ in tried):.4f} on {c['examples']} training lines; the chosen one "
                     f"({c['weights'][0]:g} / {c['weights'][1]:g} per {c['normalize']}, {c['reward']:.4f}; the next "
                     f"{runner:.4f})" + (f" ranks {scored.index(mine) + 1} of {len(scored)} on the reported lines "
                                        f"({mine:.2f}; best {top[1]} at {top[2]:.2f})" if mine is not None else "")
                     + ".")
    return notes


def _gate_start(rows, per_ex, summary, tasks, obs: list[str]) -> list[str]:
    """What training did to each gate, on the reported examples: a gate starts from static weights (W = 0, b = log w,
    `trained.init`) with its NLL averaging, so the reported run with those static settings is the gate before its
    first step; the gate's rows against that run, task by task."""
    table, runs = [], static_runs(rows)
    for t in tasks:
        gated = [r for r in rows if r["task"] == t and r["method"] == "adafuse+gate"]
        paths = {r["trace"]["settings"].get("gate") for r in gated}
        if not gated or len(paths) != 1:
            continue
        path = GATES.parents[1] / next(iter(paths))
        if not path.exists():
            continue
        tr = json.loads(path.read_text()).get("trained", {})
        init = tr.get("init") or [1.0, 1.0]
        if len(init) != 2:
            continue
        key = (init[0] / init[1], tr.get("normalize", "token"))
        start = runs.get((t, round(key[0], 9), key[1]), ("",))[0]
        if not start:
            continue
        a, b = _score(summary, t, start), _score(summary, t, "adafuse+gate")
        d = paired_difference(per_ex[(t, "adafuse+gate")], per_ex[(t, start)])
        table.append({"task": t, "gate": str(path.relative_to(GATES.parents[1])),
                      "its start (weights, NLL per)": f"{init[0]:g} / {init[1]:g}, {key[1]}", "run at the start": start,
                      "score at the start": a, "score trained": b,
                      "trained − start": f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}] "
                                         f"{d['wins']}/{d['ties']}/{d['losses']}"})
    if not table:
        return []
    obs.append("- What training did to the gates on the reported examples (each against the static weights it "
               "started from): " + "; ".join(f"{r['task']} {r['score at the start']:.2f} → {r['score trained']:.2f} "
                                             f"({r['trained − start']})" for r in table) + ".")
    return ["What training did, on the reported examples: a gate starts as static weights (W = 0, b = log w, with "
            "its NLL averaging), so the reported run with exactly those settings is the gate before its first step. "
            "This compares on the same held-out examples, unlike the training curve, whose steps are different "
            "training examples:", "", _markdown(table), ""]


PLAIN = {"tau": 0.7, "max_words": 3, "branches": 3, "diversity": True, "exploration": "surface", "method": "adafuse"}


def static_weighting(settings: dict) -> tuple[float, str] | None:
    """(the first model's weight ÷ the second's, how NLL is averaged) of an AdaFuse run with static weights and the
    default τΔ, M, B and exploration; None for anything else (a gate, another method or setting, not two weights)."""
    if any(settings.get(k) != v for k, v in PLAIN.items()) or settings.get("gate"):
        return None
    w = settings.get("weights") or [1.0, 1.0]
    if len(w) != 2 or w[1] <= 0:
        return None
    return w[0] / w[1], settings.get("normalize") or "token"


def static_runs(rows: list[dict]) -> dict[tuple[str, float, str], tuple[str, tuple]]:
    """(task, first ÷ second weight rounded to 9 places, NLL averaging) → (label, models) of the complete run decoded
    with that static weighting (`static_weighting` alike on every row, as many examples as the task's largest run; the
    first label in sorted order where several have it). The composed `adafuse+per-task` rows are not a run."""
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        if r["method"] != PER_TASK:
            runs[(r["task"], r["method"])].append(r)
    full: dict[str, int] = defaultdict(int)
    for (t, _), items in runs.items():
        full[t] = max(full[t], len(items))
    out: dict[tuple[str, float, str], tuple[str, tuple]] = {}
    for (t, label), items in sorted(runs.items()):
        keys = {static_weighting(r["trace"]["settings"]) for r in items}
        if len(items) < full[t] or len(keys) != 1 or None in keys:
            continue
        ratio, norm = next(iter(keys))
        out.setdefault((t, round(ratio, 9), norm), (label, tuple(items[0]["trace"].get("models", ()))))
    return out


def _sweep(rows, per_ex, summary, tasks, best: str, figs: Path, obs: list[str]) -> list[str]:
    """Every static weighting run on the reported translation examples (plain AdaFuse, adafuse+weights, +tuned, +judge
    and the sweep of experiments/run.py), ordered from equal weights to the strong model alone: whether any static
    weight could meet the target, chosen with hindsight on the very examples it is scored on."""
    strong = best.removeprefix("greedy:")
    found = {key: label for key, (label, models) in static_runs(rows).items()
             if key[0].startswith("flores") and models[-1:] == (strong,)}
    table, fig, notes = [], go.Figure(), []
    for t in tasks:
        ref = _score(summary, t, best)
        mine = sorted({(ratio, norm) for tt, ratio, norm in found if tt == t}, key=lambda k: -k[0])
        if ref is None or len(mine) < 3:
            continue
        for norm in ("token", "word"):
            pts = [(ratio, _score(summary, t, found[(t, ratio, n)])) for ratio, n in mine if n == norm]
            if pts:
                fig.add_trace(go.Scatter(x=[1 / (1 + ratio) for ratio, _ in pts], y=[v for _, v in pts],
                                         mode="lines+markers", name=f"{t}, NLL per {norm}"))
        best_row = None
        for ratio in sorted({k[0] for k in mine}, reverse=True):
            row = {"task": t, "weights (other / " + strong + ")": "0 / 1" if ratio == 0 else f"1 / {1 / ratio:g}"}
            for norm in ("token", "word"):
                m = found.get((t, ratio, norm))
                v = _score(summary, t, m) if m else None
                if v is None:
                    row[f"per {norm}"] = row[f"per {norm} − {strong}"] = ""
                    continue
                d = paired_difference(per_ex.get((t, m), {}), per_ex.get((t, best), {}))
                row[f"per {norm}"] = f"{v:.2f} ({m})"
                row[f"per {norm} − {strong}"] = (f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}] "
                                                 f"{d['wins']}/{d['ties']}/{d['losses']}" if d else "")
                if best_row is None or v > best_row[0]:
                    best_row = (v, row[next(iter(k for k in row if k.startswith("weights")))], norm,
                                row[f"per {norm} − {strong}"])
            table.append(row)
        v, w, norm, paired = best_row
        notes.append(f"{t}: best {w} per {norm} at {v:.2f} vs {ref:.2f} — "
                     + ("at or above it" if v >= ref else f"below it by {ref - v:.2f}")
                     + (f" (sentence by sentence {paired})" if paired else ""))
        equal = 1 / (1 + max(k[0] for k in mine))  # the strong model's share at the most even weighting run
        fig.add_trace(go.Scatter(x=[equal, 1], y=[ref, ref], mode="lines", line={"dash": "dot"},
                                 name=f"{t}, {strong} alone"))
    if not table:
        return []
    obs.append("- The static weights run from equal to " + strong + " alone, scored on the reported Flores examples "
               "themselves (hindsight, not a selection: the most any of these weights, however chosen, could reach): "
               + "; ".join(notes) + ".")
    fig.update_layout(title=f"Static weights on Flores: chrF against {strong}'s share of the weight",
                      xaxis_title=f"{strong}'s weight ÷ the sum of weights", yaxis_title="chrF")
    return [f"Every static weighting run on the reported Flores examples, from equal weights to {strong} alone "
            "(`experiments/run.py`'s sweep with the rows above; each candidate's NLL averaged per token or per word): "
            "chrF and the paired difference to " + best + ". The weights are scored on the very examples they are "
            "reported on, so the best of them is hindsight — the most any of these weights could reach, not a method:", "",
            _markdown(table), "", save(fig, figs, "weight_sweep"), ""]


def _departures(rows, tasks, methods, strong: str) -> list[dict]:
    """Per task and weighted method: how often the chosen candidate differs from the strong model's first proposal,
    and why (from the traces)."""
    out = []
    for t in tasks:
        if not t.startswith("flores"):
            continue
        for m in methods:
            n = rounds = longer = own_other = other = ended = prefers = kept = 0
            for r in rows:
                if r["task"] != t or r["method"] != m or strong not in r["trace"]["models"]:
                    continue
                n += 1
                for rd in r["trace"]["rounds"]:
                    st = next(s for s in rd["steps"] if s["model"] == strong)
                    rounds += 1
                    if not st["proposals"] or rd["chosen"] == st["proposals"][0]:
                        continue
                    c, g = rd["candidates"][rd["chosen"]], rd["candidates"][st["proposals"][0]]
                    if c["eos"] and not c["text"].strip():
                        ended += 1
                    elif rd["chosen"] in st["proposals"]:
                        if (c["n_tokens"].get(strong) or 0) > (g["n_tokens"].get(strong) or 0):
                            longer += 1
                        else:
                            own_other += 1
                    else:
                        other += 1
                    cn, gn = c["nll"].get(strong), g["nll"].get(strong)
                    if cn is not None and gn is not None:
                        prefers += cn < gn
                        kept += cn * c["n_tokens"][strong] > gn * g["n_tokens"][strong]
            if n:
                left = longer + own_other + other + ended
                out.append({"task": t, "method": m, "examples": n, "rounds": rounds,
                            f"left {strong}'s word": f"{left} ({100 * left / max(1, rounds):.0f} %)",
                            "its own longer word": longer, "its own other word": own_other,
                            "the other model's": other, "the end": ended,
                            "own score prefers": prefers, "kept by a sum": kept})
    return out


def _num(v, nd: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}"


def build(results: Path, docs: Path) -> Path:
    rows = load_results(results)
    composed, per_task = per_task_rows(rows, results)
    rows += composed
    summary_rows = summarize(rows)
    summary = {(r["task"], r["method"]): r for r in summary_rows}
    tasks = [t for t in TASKS if any(k[0] == t for k in summary)]
    figs = docs / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    main_methods = [m for m in ("adafuse", "adafuse+weights", "adafuse+gate", "adafuse+tuned", PER_TASK, "beam",
                                "fixed-span-1", "fixed-span-2", "fixed-span-3", "token-union", "mixture")
                    if any((t, m) in summary for t in tasks)]
    singles = sorted({m for _, m in summary if m.startswith("greedy:")})
    order = singles + main_methods
    table = [r for r in main_metric_table(summary_rows) if r["method"] in order]
    table.sort(key=lambda r: order.index(r["method"]))
    sizes = {t: max(r["n"] for (tt, _), r in summary.items() if tt == t) for t in tasks}
    out = ["# Results: AdaFuse and baselines with the embedded pair (SmolLM2-135M-Instruct + Gemma-3-270M)", "",
           "Produced by `experiments/run.sh` (which calls `python -m adafuse eval` per task and then this report). "
           "Examples per task: " + ", ".join(f"{t} {n}" for t, n in sizes.items()) + ". Scores ×100: exact match "
           "(NQ, TriviaQA), F1 (SQuAD), final-number accuracy (GSM8K), chrF (Flores). Decoding: τΔ=0.7, M=3, B=3 "
           "unless a label says otherwise. "
           f"With {min(sizes.values())}–{max(sizes.values())} examples one example moves an exact-match score by "
           f"{100 / max(sizes.values()):.0f}–{100 / min(sizes.values()):.0f} points: read the trends and the paired "
           "intervals below, not the decimals.", "", "## Main table", "", _markdown(table), ""]
    obs: list[str] = []  # observations computed from the numbers, so a rerun keeps them true
    out += _versions(rows, order, tasks)
    per_word = _seconds_per_word(rows)
    ratios = [(t, per_word[(t, "mixture")] / _mean([per_word[(t, s)] for s in singles])) for t in tasks
              if (t, "mixture") in per_word and singles and all((t, s) in per_word for s in singles)]
    if ratios:
        obs.append("- Mixture (word-level ME: one model writes each word, nobody scores): seconds per word ÷ the mean "
                   "single model's, task by task: " + ", ".join(f"{t} {r:.2f}" for t, r in ratios)
                   + ". These are wall seconds per example over words: they include prefilling both models' prompts "
                   "(a single model prefills one) and ME samples at temperature 1, which writes words of more tokens; "
                   "the runs also shared the CPUs with other jobs. The README's benchmark measures decode seconds per "
                   "word with greedy words, where ME's point (about one model's work per word) can be checked.")
    out += _empties(rows, results, order, tasks, singles, obs)
    fig = go.Figure()
    for t in tasks:
        fig.add_trace(go.Bar(name=t, x=[r["method"] for r in table], y=[r.get(t) for r in table]))
    fig.update_layout(barmode="group", title="Main metric per task", yaxis_title="score ×100")
    out += [save(fig, figs, "main"), ""]

    # paired comparisons on the same examples: is a difference more than noise?
    per_ex = _per_example(rows)
    rivals = singles + [m for m in main_methods if m != "adafuse"]
    pair_rows, clear = [], []
    for t in tasks:
        if (t, "adafuse") not in per_ex:
            continue
        row = {"task": t}
        for m in rivals:
            d = paired_difference(per_ex[(t, "adafuse")], per_ex.get((t, m), {}))
            if d:
                row[f"vs {m}"] = (f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}] "
                                  f"{d['wins']}/{d['ties']}/{d['losses']}")
                if m in singles and (d["low"] > 0 or d["high"] < 0):
                    clear.append(f"{'above' if d['low'] > 0 else 'below'} {m} on {t} ({d['mean']:+.1f})")
        pair_rows.append(row)
    out += ["## AdaFuse against each other method, example by example", "",
            "Mean per-example difference AdaFuse − method (main metric, points), its 95 % paired-bootstrap interval, "
            "and the examples where AdaFuse scored higher/the same/lower. An interval that excludes 0 is a difference "
            "this sample can tell apart from noise (sentence-level chrF for Flores).", "", _markdown(pair_rows), ""]

    out += _gates(rows, per_ex, summary, table, tasks, singles, results, figs, obs, per_task)
    avg = {r["method"]: r["average"] for r in table if r.get("average") is not None}  # methods run on every task
    if "adafuse" in avg and singles:
        best_single = max(singles, key=lambda m: avg.get(m) or -1)
        verdict = "reproduced" if (avg["adafuse"] or 0) > (avg[best_single] or 0) else "not reproduced"
        obs.append(f"- AdaFuse vs the better single model, average over all tasks: {avg['adafuse']:.2f} vs "
                   f"{avg[best_single]:.2f} "
                   f"({best_single}) — the paper's headline trend is **{verdict}** here.")
        others = [m for m in main_methods if m != "adafuse" and avg.get(m) is not None]
        if others:
            best_other = max(others, key=lambda m: avg[m])
            obs.append(f"- Best other ensemble run on every task: {best_other} at {avg[best_other]:.2f} "
                       f"({'below' if avg[best_other] < avg['adafuse'] else 'at or above'} AdaFuse).")
        per_task = [t for t in tasks if _score(summary, t, "adafuse") is not None and all(
            (_score(summary, t, s) or 0) < _score(summary, t, "adafuse") for s in singles)]
        obs.append(f"- Tasks where AdaFuse beats both single models: {', '.join(per_task) or 'none'}.")
        obs.append("- Differences from a single model that the paired intervals can tell from noise: AdaFuse "
                   + ("; ".join(clear) if clear else "none") + ".")
        floor = [t for t in tasks if all(not _score(summary, t, m) for m in order if (t, m) in summary)]
        if floor:
            obs.append(f"- No method scores above 0 on {', '.join(floor)}: these models are below the task's floor, so "
                       "it cannot tell the methods apart.")
    qa = [t for t in ("nq", "triviaqa") if t in tasks]

    # ablations: every setting scored on the same examples (those all of them were run on)
    div = {b: f"adafuse[branches={b}]" for b in (1, 2, 4, 5)} | {3: "adafuse"}
    nodiv = {b: f"adafuse[branches={b},diversity=false]" for b in (2, 4, 5)} | {1: "adafuse[branches=1]", 3: "beam"}
    taus = {0.3: "adafuse[tau=0.3]", 0.5: "adafuse[tau=0.5]", 0.7: "adafuse", 0.9: "adafuse[tau=0.9]"}
    ablated = set(div.values()) | set(nodiv.values()) | set(taus.values()) | {f"fixed-span-{n}" for n in (1, 2, 3)}
    common = {}
    for t in qa:
        sets = [set(v) for (tt, m), v in per_ex.items() if tt == t and m in ablated]
        common[t] = set.intersection(*sets) if sets else set()

    def _abl_score(task, method):  # ablations: per-example scores on the lines every setting ran on
        vals = per_ex.get((task, method), {})
        lines = common.get(task, set())
        return round(sum(vals[i] for i in lines) / len(lines), 2) if lines and lines <= set(vals) else None

    out += [f"## Ablations (NQ and TriviaQA, the {min((len(v) for v in common.values()), default=0)} examples "
            "every setting ran on)", ""]
    abl_rows = []
    for label, method in [(f"B={b}, diversity", div[b]) for b in range(1, 6)] + \
            [(f"B={b}, beam (no diversity)", nodiv[b]) for b in range(1, 6)] + \
            [(f"τΔ={t}", m) for t, m in taus.items()] + [(f"fixed span {n}", f"fixed-span-{n}") for n in (1, 2, 3)]:
        vals = {t: _abl_score(t, method) for t in qa}
        if any(v is not None for v in vals.values()):
            abl_rows.append({"setting": label, "method": method, **vals, "mean": _mean(vals.values())})
    out += [_markdown(abl_rows), ""]
    if abl_rows:
        fig = go.Figure()
        for name, series in (("diversity", div), ("beam (no diversity)", nodiv)):
            ys = [_mean([_abl_score(t, series[b]) for t in qa]) for b in range(1, 6)]
            fig.add_trace(go.Scatter(x=list(range(1, 6)), y=ys, mode="lines+markers", name=name))
        fig.update_layout(title="Branches B (NQ+TriviaQA mean EM)", xaxis_title="B", yaxis_title="EM ×100")
        out += [save(fig, figs, "ablation_branches"), ""]
        fig = go.Figure(go.Scatter(x=list(taus), y=[_mean([_abl_score(t, m) for t in qa]) for m in taus.values()],
                                   mode="lines+markers"))
        fig.update_layout(title="Margin threshold τΔ (NQ+TriviaQA mean EM)", xaxis_title="τΔ", yaxis_title="EM ×100")
        out += [save(fig, figs, "ablation_tau"), ""]
        b_div = [_mean([_abl_score(t, div[b]) for t in qa]) for b in range(1, 6)]
        b_beam = [_mean([_abl_score(t, nodiv[b]) for t in qa]) for b in range(1, 6)]
        if all(v is not None for v in b_div + b_beam):
            def trend(vals):
                return "up" if vals[-1] > vals[0] else "down" if vals[-1] < vals[0] else "flat"
            obs.append("- B from 1 to 5 with diversity: " + " → ".join(f"{v:.1f}" for v in b_div)
                       + f" ({trend(b_div)}); without: " + " → ".join(f"{v:.1f}" for v in b_beam)
                       + f" ({trend(b_beam)}). Paper: up with diversity, down without — "
                       f"diversity part {'reproduced' if trend(b_div) == 'up' else 'not reproduced'}, beam part "
                       f"{'reproduced' if trend(b_beam) == 'down' else 'not reproduced'}.")
        fixed = {n: _mean([_abl_score(t, f"fixed-span-{n}") for t in qa]) for n in (1, 2, 3)}
        adaptive = _mean([_abl_score(t, "adafuse") for t in qa])
        if adaptive is not None and all(v is not None for v in fixed.values()):
            verdict = "reproduced" if adaptive > max(fixed.values()) else "not reproduced"
            obs.append(f"- Adaptive vs fixed span lengths (NQ+TriviaQA mean, same examples): adaptive {adaptive:.2f}, "
                       "fixed 1/2/3 " + "/".join(f"{v:.2f}" for v in fixed.values()) + f" — **{verdict}**.")
        tau_vals = [_mean([_abl_score(t, m) for t in qa]) for m in taus.values()]
        if all(v is not None for v in tau_vals):
            obs.append("- τΔ 0.3/0.5/0.7/0.9: " + "/".join(f"{v:.1f}" for v in tau_vals)
                       + (" — stable, as in the paper." if max(tau_vals) - min(tau_vals) <= 5 else
                          " — not stable at this size."))

    out += _exploration(rows, per_ex, tasks, figs, obs)

    # words per round
    out += ["## Words per round (AdaFuse)", ""]
    wpr = []
    for t in tasks:
        r = summary.get((t, "adafuse"))
        if r:
            one, two, three = (float(x) for x in r["rounds 1/2/3+ words %"].split("/"))
            paper = PAPER_WPR.get(t)
            wpr.append({"task": t, "1 word %": one, "2 words %": two, "3 words %": three,
                        "paper 1/2/3 %": "/".join(f"{x:.1f}" for x in paper) if paper else ""})
    out += [_markdown(wpr), ""]
    if wpr:
        fig = go.Figure([go.Bar(name=f"{k} word{'s' if k > 1 else ''}", x=[w["task"] for w in wpr],
                                y=[w[f"{k} word{'s' if k > 1 else ''} %"] for w in wpr]) for k in (1, 2, 3)])
        fig.update_layout(barmode="stack", title="Share of rounds committing 1/2/3 words", yaxis_title="% of rounds")
        out += [save(fig, figs, "words_per_round"), ""]
        if "nq" in {w["task"] for w in wpr} and any(w["task"] in ("flores-de-en", "squad") for w in wpr):
            nq1 = next(w["1 word %"] for w in wpr if w["task"] == "nq")
            longer = [w for w in wpr if w["task"] in ("flores-de-en", "squad")]
            verdict = "reproduced" if all(w["1 word %"] < nq1 for w in longer) else "not reproduced"
            obs.append(f"- Span length adapts to the task (paper: NQ mostly 1-word rounds, SQuAD and De→En longer): "
                       f"**{verdict}** (1-word rounds: NQ {nq1:.0f} %, "
                       + ", ".join(f"{w['task']} {w['1 word %']:.0f} %" for w in longer) + ").")

    # cost
    out += ["## Cost per example (seconds, forward passes of all models, 2 CPU cores)", "",
            "Wall-clock seconds per decode (model loading and the shared few-shot prefix excluded). The runs were made "
            "either as one process using both cores or as two processes with one core each (`experiments/run.py`); on "
            "these small models the two give per-decode times within about 10 % of each other.", ""]
    cost = defaultdict(dict)
    for (t, m), r in summary.items():
        if m in order:
            cost[m][t] = r["sec/example"]
    cost_rows = [{"method": m, **{t: cost[m].get(t) for t in tasks},
                  "mean fwd/example": round(_mean([summary[(t, m)]["fwd/example"] for t in tasks
                                                   if (t, m) in summary]) or 0, 1)} for m in order if m in cost]
    out += [_markdown(cost_rows), ""]
    if cost_rows:
        fig = go.Figure([go.Bar(name=t, x=[r["method"] for r in cost_rows], y=[r.get(t) for r in cost_rows])
                         for t in tasks])
        fig.update_layout(barmode="group", title="Seconds per example", yaxis_title="s")
        out += [save(fig, figs, "cost"), ""]
    out[out.index("## Main table"):out.index("## Main table")] = ["## What the numbers say", ""] + obs + [""]
    md = docs / "results.md"
    md.write_text("\n".join(out) + "\n", encoding="utf-8")
    return md


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m adafuse.harness.results RESULTS_DIR DOCS_DIR", file=sys.stderr)
        return 2
    print(build(Path(argv[0]), Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
