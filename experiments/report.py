"""docs/results.md and its Plotly figures (HTML + PNG) from the stored eval runs: the tables, the paired comparisons
and the observations that say what the numbers show against the paper.

    python -m experiments.report results docs      # from the repository root (experiments/run.sh calls it)
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import plotly.graph_objects as go

from adafuse.harness.compare import (format_difference, main_score, mean_or_none, paired_difference,
                                     per_example_scores)
from adafuse.harness.evaluate import load_results, main_metric_table, markdown_table, summarize
from adafuse.harness.figures import save
from adafuse.harness.stats import empty_answers, seconds_per_word
from adafuse.harness.tasks import TASKS
from adafuse.trace import TRACE_VERSION

from .report_exploration import exploration_section
from .report_weights import PER_TASK, per_task_rows, weights_section
from .validate_gates import validation_section

# the paper's share of AdaFuse rounds that commit 1/2/3 words, per task
PAPER_WPR = {"nq": (80.29, 15.53, 4.18), "squad": (57.64, 21.27, 21.09), "flores-de-en": (34.02, 19.89, 46.09)}
GEMMA = "greedy:gemma3-270m"  # the pair's stronger member alone, the reference of the end-of-answer comparison


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


def _empties(rows, results: Path, order, tasks, singles, obs) -> list[str]:
    """Empty answers per method (the decoded output is blank), against each method's worse single member, and the
    translation tasks before and after the end-of-answer fix (results/v1: the previous decoder's committed run)."""
    now = empty_answers(rows)
    table = [{"method": m, **{t: (f"{now[(t, m)][0]}/{now[(t, m)][1]}" if (t, m) in now else None) for t in tasks}}
             for m in order]
    out = ["## Empty answers", "", "Examples whose decoded output is blank, per method and task (empty/examples).", "",
           markdown_table(table), ""]
    worse = {t: max((now[(t, s)][0] for s in singles if (t, s) in now), default=None) for t in tasks}
    over = [f"{m} on {t} ({now[(t, m)][0]} vs {worse[t]})" for m in order if m not in singles for t in tasks
            if (t, m) in now and worse[t] is not None and now[(t, m)][0] > worse[t]]
    obs.append("- Empty answers: " + ("no method produces more than its worse single member alone." if not over else
                                      "more than the worse single member alone: " + "; ".join(over) + "."))
    v1 = results / "v1"
    if v1.is_dir():
        before_rows = load_results(v1)
        before, sb = empty_answers(before_rows), {(r["task"], r["method"]): r for r in summarize(before_rows)}
        sn = {(r["task"], r["method"]): r for r in summarize(rows)}
        gemma = GEMMA if GEMMA in singles else None
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
                "Main metric (chrF for Flores) and empty answers on the same examples.", "", markdown_table(comp), ""]
    return out


def build(results: Path, docs: Path) -> Path:
    """Write DOCS/results.md and DOCS/figures/ from the rows in RESULTS (and its gate/, validation/ and v1/ folders)."""
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
           "intervals below, not the decimals.", "", "## Main table", "", markdown_table(table), ""]
    obs: list[str] = []  # observations computed from the numbers, so a rerun keeps them true
    out += _versions(rows, order, tasks)
    per_word = seconds_per_word(rows)
    ratios = [(t, per_word[(t, "mixture")] / mean_or_none([per_word[(t, s)] for s in singles])) for t in tasks
              if (t, "mixture") in per_word and singles and all((t, s) in per_word for s in singles)]
    if ratios:
        obs.append("- Mixture (word-level ME: one model writes each word, nobody scores): seconds per word ÷ the mean "
                   "single model's, task by task: " + ", ".join(f"{t} {r:.2f}" for t, r in ratios)
                   + ". These are wall seconds per example over words (decoded one at a time): they include prefilling both models' prompts "
                   "(a single model prefills one) and ME samples at temperature 1, which writes words of more tokens; "
                   "the runs also shared the CPUs with other jobs. The benchmark in docs/performance.md measures "
                   "decode seconds per word with greedy words, where ME's point (about one model's work per word) can "
                   "be checked.")
    out += _empties(rows, results, order, tasks, singles, obs)
    fig = go.Figure()
    for t in tasks:
        fig.add_trace(go.Bar(name=t, x=[r["method"] for r in table], y=[r.get(t) for r in table]))
    fig.update_layout(barmode="group", title="Main metric per task", yaxis_title="score ×100")
    out += [save(fig, figs, "main"), ""]

    # paired comparisons on the same examples: is a difference more than noise?
    per_ex = per_example_scores(rows)
    rivals = singles + [m for m in main_methods if m != "adafuse"]
    pair_rows, clear = [], []
    for t in tasks:
        if (t, "adafuse") not in per_ex:
            continue
        row = {"task": t}
        for m in rivals:
            d = paired_difference(per_ex[(t, "adafuse")], per_ex.get((t, m), {}))
            if d:
                row[f"vs {m}"] = format_difference(d)
                if m in singles and (d["low"] > 0 or d["high"] < 0):
                    clear.append(f"{'above' if d['low'] > 0 else 'below'} {m} on {t} ({d['mean']:+.1f})")
        pair_rows.append(row)
    out += ["## AdaFuse against each other method, example by example", "",
            "Mean per-example difference AdaFuse − method (main metric, points), its 95 % paired-bootstrap interval, "
            "and the examples where AdaFuse scored higher/the same/lower. An interval that excludes 0 is a difference "
            "this sample can tell apart from noise (sentence-level chrF for Flores).", "", markdown_table(pair_rows),
            ""]

    out += weights_section(rows, per_ex, summary, table, tasks, singles, results, figs, obs, per_task)
    out += validation_section(results, obs)
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
        above_both = [t for t in tasks if main_score(summary, t, "adafuse") is not None and all(
            (main_score(summary, t, s) or 0) < main_score(summary, t, "adafuse") for s in singles)]
        obs.append(f"- Tasks where AdaFuse beats both single models: {', '.join(above_both) or 'none'}.")
        obs.append("- Differences from a single model that the paired intervals can tell from noise: AdaFuse "
                   + ("; ".join(clear) if clear else "none") + ".")
        floor = [t for t in tasks if all(not main_score(summary, t, m) for m in order if (t, m) in summary)]
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

    def abl_score(task, method):  # ablations: per-example scores on the lines every setting ran on
        vals = per_ex.get((task, method), {})
        lines = common.get(task, set())
        return round(sum(vals[i] for i in lines) / len(lines), 2) if lines and lines <= set(vals) else None

    out += [f"## Ablations (NQ and TriviaQA, the {min((len(v) for v in common.values()), default=0)} examples "
            "every setting ran on)", ""]
    abl_rows = []
    for label, method in [(f"B={b}, diversity", div[b]) for b in range(1, 6)] + \
            [(f"B={b}, beam (no diversity)", nodiv[b]) for b in range(1, 6)] + \
            [(f"τΔ={t}", m) for t, m in taus.items()] + [(f"fixed span {n}", f"fixed-span-{n}") for n in (1, 2, 3)]:
        vals = {t: abl_score(t, method) for t in qa}
        if any(v is not None for v in vals.values()):
            abl_rows.append({"setting": label, "method": method, **vals, "mean": mean_or_none(vals.values())})
    out += [markdown_table(abl_rows), ""]
    if abl_rows:
        fig = go.Figure()
        for name, series in (("diversity", div), ("beam (no diversity)", nodiv)):
            ys = [mean_or_none([abl_score(t, series[b]) for t in qa]) for b in range(1, 6)]
            fig.add_trace(go.Scatter(x=list(range(1, 6)), y=ys, mode="lines+markers", name=name))
        fig.update_layout(title="Branches B (NQ+TriviaQA mean EM)", xaxis_title="B", yaxis_title="EM ×100")
        out += [save(fig, figs, "ablation_branches"), ""]
        fig = go.Figure(go.Scatter(x=list(taus), y=[mean_or_none([abl_score(t, m) for t in qa])
                                                    for m in taus.values()], mode="lines+markers"))
        fig.update_layout(title="Margin threshold τΔ (NQ+TriviaQA mean EM)", xaxis_title="τΔ", yaxis_title="EM ×100")
        out += [save(fig, figs, "ablation_tau"), ""]
        b_div = [mean_or_none([abl_score(t, div[b]) for t in qa]) for b in range(1, 6)]
        b_beam = [mean_or_none([abl_score(t, nodiv[b]) for t in qa]) for b in range(1, 6)]
        if all(v is not None for v in b_div + b_beam):
            def trend(vals):
                return "up" if vals[-1] > vals[0] else "down" if vals[-1] < vals[0] else "flat"
            obs.append("- B from 1 to 5 with diversity: " + " → ".join(f"{v:.1f}" for v in b_div)
                       + f" ({trend(b_div)}); without: " + " → ".join(f"{v:.1f}" for v in b_beam)
                       + f" ({trend(b_beam)}). Paper: up with diversity, down without — "
                       f"diversity part {'reproduced' if trend(b_div) == 'up' else 'not reproduced'}, beam part "
                       f"{'reproduced' if trend(b_beam) == 'down' else 'not reproduced'}.")
        fixed = {n: mean_or_none([abl_score(t, f"fixed-span-{n}") for t in qa]) for n in (1, 2, 3)}
        adaptive = mean_or_none([abl_score(t, "adafuse") for t in qa])
        if adaptive is not None and all(v is not None for v in fixed.values()):
            verdict = "reproduced" if adaptive > max(fixed.values()) else "not reproduced"
            obs.append(f"- Adaptive vs fixed span lengths (NQ+TriviaQA mean, same examples): adaptive {adaptive:.2f}, "
                       "fixed 1/2/3 " + "/".join(f"{v:.2f}" for v in fixed.values()) + f" — **{verdict}**.")
        tau_vals = [mean_or_none([abl_score(t, m) for t in qa]) for m in taus.values()]
        if all(v is not None for v in tau_vals):
            obs.append("- τΔ 0.3/0.5/0.7/0.9: " + "/".join(f"{v:.1f}" for v in tau_vals)
                       + (" — stable, as in the paper." if max(tau_vals) - min(tau_vals) <= 5 else
                          " — not stable at this size."))

    out += exploration_section(rows, per_ex, tasks, figs, obs)

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
    out += [markdown_table(wpr), ""]
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
            "Wall-clock seconds per decode (model loading and the shared few-shot prefix excluded; a row decoded with "
            "others in flight counts its share of the models' forwards instead, `evaluate.decode_seconds`). The runs were made "
            "either as one process using both cores or as two processes with one core each (`experiments/run.py`); on "
            "these small models the two give per-decode times within about 10 % of each other.", ""]
    cost = defaultdict(dict)
    for (t, m), r in summary.items():
        if m in order:
            cost[m][t] = r["sec/example"]
    cost_rows = [{"method": m, **{t: cost[m].get(t) for t in tasks},
                  "mean fwd/example": round(mean_or_none([summary[(t, m)]["fwd/example"] for t in tasks
                                                          if (t, m) in summary]) or 0, 1)} for m in order if m in cost]
    out += [markdown_table(cost_rows), ""]
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
        print("usage: python -m experiments.report RESULTS_DIR DOCS_DIR", file=sys.stderr)
        return 2
    print(build(Path(argv[0]), Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
