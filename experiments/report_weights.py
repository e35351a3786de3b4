"""docs/results.md's weights study: static per-model weights, the learned gates, the weighting chosen per task on
training lines (`adafuse+per-task`), the strong member as the only judge, and the sweep from equal weights to it."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import plotly.graph_objects as go

from adafuse.divergence import departures
from adafuse.harness.compare import format_difference, main_score, paired_difference
from adafuse.harness.evaluate import markdown_table
from adafuse.harness.figures import save
from adafuse.harness.stats import weight_shares
from adafuse.harness.tasks import TASKS

ROOT = Path(__file__).resolve().parents[1]
GATES = ROOT / "assets" / "gates"
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


def weights_section(rows, per_ex, summary, table, tasks, singles, results: Path, figs: Path, obs: list[str],
                    per_task: dict | None = None) -> list[str]:
    """The section on static weights and the learned gates, against plain AdaFuse and the better single model (the
    single with the higher average); appends its observations to `obs`."""
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
                f"`{PER_TASK}`):", "", markdown_table(search), ""]
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
                "the strong model on Flores (below):", "", markdown_table(norms), ""]
    picks = [{"task": t, "weights": " / ".join(f"{w:g}" for w in c["weights"]), "NLL averaged per": c["normalize"],
              "training reward": round(c["reward"], 4), "training examples": c["examples"],
              "chosen in": f"results/gate/{c['source']}", "reported run with these settings": c["run"]}
             for t, c in (per_task or {}).items() if t in tasks]
    obs += selection_notes(rows, summary, results, per_task or {}, tasks)
    if picks:
        out += [f"`{PER_TASK}`: static weights and NLL averaging chosen for each task on its own training lines where "
                "the task has its own searches (`gate search --task TASK --normalize token|word`; the Flores "
                "directions), else its family's choice (`adafuse+tuned`'s). It decodes nothing of its own: the decoder "
                "is deterministic, so each task's cells are the reported run decoded with exactly those settings, "
                "named in the last column:", "", markdown_table(picks), ""]
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
                "while training, the lowest score at test time):", "", markdown_table(gates), "",
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
                "is shipped as `assets/gates/<family>.json` (`experiments/gate_select.py`):", "",
                markdown_table(picks), ""]
    # the gate's weights per task, from the traces of the reported examples
    gated = weight_shares([r for r in rows if r["method"] == "adafuse+gate"])
    shares = [{"task": t, **{f"mean share {m}": round(v, 3) for m, v in gated[(t, "adafuse+gate")][0].items()},
               "gated rounds": gated[(t, "adafuse+gate")][1]} for t in tasks if (t, "adafuse+gate") in gated]
    if shares:
        out += ["The gate's weight share per model (rounds with a scored pool, reported examples):", "",
                markdown_table(shares), ""]
    out += gate_start_section(rows, per_ex, summary, tasks, obs)
    strong = best.removeprefix("greedy:")
    why = departures_table(rows, tasks, [m for m in have if m != PER_TASK], strong)  # per-task: another run's rows
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
                "would have kept its first proposal):", "", markdown_table(why), ""]
    out += judge_section(per_ex, summary, tasks, best, obs)
    out += sweep_section(rows, per_ex, summary, tasks, best, figs, obs)
    # paired differences and the targets
    pair_rows = []
    for t in tasks:
        row = {"task": t}
        for m in have:
            for rival in (best, "adafuse"):
                d = paired_difference(per_ex.get((t, m), {}), per_ex.get((t, rival), {}))
                if d:
                    row[f"{m} − {rival}"] = format_difference(d)
        pair_rows.append(row)
    out += ["Per example, the same paired intervals as above (mean difference, 95 % bootstrap interval, "
            "better/same/worse):", "", markdown_table(pair_rows), ""]
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


def judge_section(per_ex, summary, tasks, best: str, obs: list[str]) -> list[str]:
    """One end of the weighting range: AdaFuse with the better member as the only judge (the other model's weight 0; it
    still proposes), against that member's greedy decode, on the tasks where both ran."""
    rows = []
    for t in tasks:
        ref = main_score(summary, t, best)
        got = {m: main_score(summary, t, m) for m in JUDGE}
        if ref is None or all(v is None for v in got.values()):
            continue
        row = {"task": t, best: ref}
        for m, per in JUDGE.items():
            if got[m] is None:
                continue
            d = paired_difference(per_ex.get((t, m), {}), per_ex.get((t, best), {}))
            row[f"{m} ({per})"] = got[m]
            row[f"{m} − {best}"] = format_difference(d) if d else ""
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
            markdown_table(rows), ""]


def selection_notes(rows, summary, results: Path, per_task: dict, tasks) -> list[str]:
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
                              main_score(summary, t, m) if m else None))
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


def gate_start_section(rows, per_ex, summary, tasks, obs: list[str]) -> list[str]:
    """What training did to each gate, on the reported examples: a gate starts from static weights (W = 0, b = log w,
    `trained.init`) with its NLL averaging, so the reported run with those static settings is the gate before its
    first step; the gate's rows against that run, task by task."""
    table, runs = [], static_runs(rows)
    for t in tasks:
        gated = [r for r in rows if r["task"] == t and r["method"] == "adafuse+gate"]
        paths = {r["trace"]["settings"].get("gate") for r in gated}
        if not gated or len(paths) != 1:
            continue
        path = ROOT / next(iter(paths))
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
        a, b = main_score(summary, t, start), main_score(summary, t, "adafuse+gate")
        d = paired_difference(per_ex[(t, "adafuse+gate")], per_ex[(t, start)])
        table.append({"task": t, "gate": str(path.relative_to(ROOT)),
                      "its start (weights, NLL per)": f"{init[0]:g} / {init[1]:g}, {key[1]}", "run at the start": start,
                      "score at the start": a, "score trained": b,
                      "trained − start": format_difference(d)})
    if not table:
        return []
    obs.append("- What training did to the gates on the reported examples (each against the static weights it "
               "started from): " + "; ".join(f"{r['task']} {r['score at the start']:.2f} → {r['score trained']:.2f} "
                                             f"({r['trained − start']})" for r in table) + ".")
    return ["What training did, on the reported examples: a gate starts as static weights (W = 0, b = log w, with "
            "its NLL averaging), so the reported run with exactly those settings is the gate before its first step. "
            "This compares on the same held-out examples, unlike the training curve, whose steps are different "
            "training examples:", "", markdown_table(table), ""]


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


def sweep_section(rows, per_ex, summary, tasks, best: str, figs: Path, obs: list[str]) -> list[str]:
    """Every static weighting run on the reported translation examples (plain AdaFuse, adafuse+weights, +tuned, +judge
    and the sweep of experiments/run.py), ordered from equal weights to the strong model alone: whether any static
    weight could meet the target, chosen with hindsight on the very examples it is scored on."""
    strong = best.removeprefix("greedy:")
    found = {key: label for key, (label, models) in static_runs(rows).items()
             if key[0].startswith("flores") and models[-1:] == (strong,)}
    table, fig, notes = [], go.Figure(), []
    for t in tasks:
        ref = main_score(summary, t, best)
        mine = sorted({(ratio, norm) for tt, ratio, norm in found if tt == t}, key=lambda k: -k[0])
        if ref is None or len(mine) < 3:
            continue
        for norm in ("token", "word"):
            pts = [(ratio, main_score(summary, t, found[(t, ratio, n)])) for ratio, n in mine if n == norm]
            if pts:
                fig.add_trace(go.Scatter(x=[1 / (1 + ratio) for ratio, _ in pts], y=[v for _, v in pts],
                                         mode="lines+markers", name=f"{t}, NLL per {norm}"))
        best_row = None
        for ratio in sorted({k[0] for k in mine}, reverse=True):
            row = {"task": t, "weights (other / " + strong + ")": "0 / 1" if ratio == 0 else f"1 / {1 / ratio:g}"}
            for norm in ("token", "word"):
                m = found.get((t, ratio, norm))
                v = main_score(summary, t, m) if m else None
                if v is None:
                    row[f"per {norm}"] = row[f"per {norm} − {strong}"] = ""
                    continue
                d = paired_difference(per_ex.get((t, m), {}), per_ex.get((t, best), {}))
                row[f"per {norm}"] = f"{v:.2f} ({m})"
                row[f"per {norm} − {strong}"] = format_difference(d) if d else ""
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
            markdown_table(table), "", save(fig, figs, "weight_sweep"), ""]


def departures_table(rows, tasks, methods, strong: str) -> list[dict]:
    """Per Flores task and weighted method: how often the chosen candidate differs from the strong model's first
    proposal, and why (`adafuse.divergence.departures`, from the traces)."""
    flores = [t for t in tasks if t.startswith("flores")]
    counts = departures([r for r in rows if r["task"] in flores and r["method"] in methods], strong)
    out = []
    for t in flores:
        for m in methods:
            c = counts.get((t, m))
            if c:
                left = c["longer"] + c["own other"] + c["other"] + c["ended"]
                out.append({"task": t, "method": m, "examples": c["examples"], "rounds": c["rounds"],
                            f"left {strong}'s word": f"{left} ({100 * left / max(1, c['rounds']):.0f} %)",
                            "its own longer word": c["longer"], "its own other word": c["own other"],
                            "the other model's": c["other"], "the end": c["ended"],
                            "own score prefers": c["prefers"], "kept by a sum": c["kept by a sum"]})
    return out
