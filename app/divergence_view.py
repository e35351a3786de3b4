"""Views of the divergence analysis: where an evaluation's ensemble leaves a member (a figure), one divergence (HTML)."""
from __future__ import annotations

import html
import math
from collections import defaultdict

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from adafuse.divergence import LEFT, Divergence, departures, round_departures, trace_dict
from adafuse.harness.figures import empty_figure
from adafuse.report import candidate_label

# why a round's chosen candidate is not the member's first proposal, in the report's words
LEFT_NAMES = {"longer": "its own longer word", "own other": "another of its own words",
              "other": "another model's word", "ended": "the end of the answer"}
LEFT_COLORS = {"longer": "#2563eb", "own other": "#93c5fd", "other": "#dc2626", "ended": "#9ca3af"}
LINE_COLORS = ["#111827", "#059669", "#9333ea", "#d97706", "#0891b2", "#be185d"]


def divergence_figure(rows: list[dict], model: str) -> go.Figure:
    """Over an evaluation run's rows (`load_results`), per (task, method) whose traces have `model` among several
    models: why the chosen candidate is not `model`'s first proposal (left: % of all rounds, stacked by cause, from
    `departures`) and where (right: at each round index that at least a tenth of the answers reach, the % of those
    answers whose round left it, from `round_departures`)."""
    title = f"Where and why the ensemble leaves {model}'s own word"
    rows = [r for r in rows if _member(trace_dict(r)["models"], model)]
    if not rows:
        return empty_figure(title, f"No evaluated answer was decoded with {model} among several models")
    counts = departures(rows, model)
    tasks = {t for t, _ in counts}
    # plotly reads tags in tick labels, legend names and hovers: a label is escaped once, here
    label = {k: html.escape(k[1] if len(tasks) == 1 else f"{k[1]} · {k[0]}", quote=False) for k in counts}
    keys = sorted(counts, key=lambda k: label[k])
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.16,
                        subplot_titles=("why: what was chosen instead (% of rounds)",
                                        "where: % of answers leaving it, by round"))
    for cause in LEFT:
        n = [counts[k][cause] for k in keys]
        share = [100 * v / max(1, counts[k]["rounds"]) for v, k in zip(n, keys)]
        fig.add_trace(go.Bar(
            y=[label[k] for k in keys], x=share, orientation="h", name=LEFT_NAMES[cause], legendgroup=cause,
            marker_color=LEFT_COLORS[cause], customdata=[[v, counts[k]["rounds"]] for v, k in zip(n, keys)],
            hovertext=[f"{label[k]}: {LEFT_NAMES[cause]} in {v} of {counts[k]['rounds']} rounds ({s:.0f} %)"
                       for v, s, k in zip(n, share, keys)],
            hovertemplate="%{hovertext}<extra></extra>"), row=1, col=1)
    at: dict[tuple, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for rec in round_departures(rows, model):
        c = at[(rec["task"], rec["method"])][rec["round"]]
        c[0] += rec["left"] is not None
        c[1] += 1
    for i, k in enumerate(keys):
        enough = max(2, math.ceil(counts[k]["examples"] / 10))  # rounds few answers reach say little
        by = sorted((j, c) for j, c in at[k].items() if c[1] >= enough)
        fig.add_trace(go.Scatter(
            x=[j for j, _ in by], y=[100 * left / n for _, (left, n) in by], mode="lines+markers", name=label[k],
            legendgroup=f"where {label[k]}", line=dict(color=LINE_COLORS[i % len(LINE_COLORS)], width=1.5),
            marker=dict(size=5), customdata=[[left, n] for _, (left, n) in by],
            hovertext=[f"{label[k]}: round {j}, left in {left} of {n} answers" for j, (left, n) in by],
            hovertemplate="%{hovertext}<extra></extra>"), row=1, col=2)
    fig.update_layout(title=html.escape(title, quote=False), barmode="stack", template="plotly_white",
                      height=320 + 22 * len(keys), margin=dict(l=50, r=20, t=70, b=50),
                      legend=dict(orientation="h", y=-0.2), hoverlabel=dict(namelength=-1))
    fig.update_xaxes(title_text="% of rounds", row=1, col=1)
    last = max((j for k in keys for j in at[k]), default=0)  # whole rounds, each tick once (never "0 0 1 1")
    fig.update_xaxes(title_text="round", tickformat="d", tick0=0, dtick=max(1, math.ceil((last + 1) / 12)), row=1,
                     col=2)
    fig.update_yaxes(title_text="% left", range=[0, 101], row=1, col=2)
    return fig


def divergence_html(div: Divergence | None) -> str:
    """One divergence (`adafuse.divergence.divergence`) as a short HTML block: its sentence, then per model its NLL of
    the chosen and of the member's candidate, its margin Δ and its weight in that round. None: the same answer."""
    if div is None:
        return ('<div class="af-divergence" role="note"><p>The ensemble\'s answer is the member\'s own, word for '
                "word.</p></div>")
    head = f"<p>{html.escape(div.sentence())}</p>"
    if div.member is None:
        return f'<div class="af-divergence" role="note">{head}</div>'
    c, m = (html.escape(candidate_label(t, e)) for t, e in ((div.chosen_text, div.chosen_eos),
                                                             (div.member_text, div.member_eos)))
    tau = f" (τΔ {div.tau:g})" if div.tau is not None else ""
    per = f" per {html.escape(div.normalize)}"
    cells = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{_num(v['chosen'])}</td><td>{_num(v['member'])}</td>"
        f"<td>{_num(div.margins.get(name), 3)}</td><td>{div.weights.get(name, 0.0):.3g}</td></tr>"
        for name, v in div.nll.items())
    heads = ["model", f"NLL{per} of “{c}”", f"NLL{per} of “{m}”", f"Δ{tau}",
             f"weight ({html.escape(div.weights_from)})"]
    table = ('<table class="af-divergence-scores"><thead><tr>' + "".join(f'<th scope="col">{h}</th>' for h in heads)
             + f"</tr></thead><tbody>{cells}</tbody></table>")
    return f'<div class="af-divergence" role="note">{head}{table}</div>'


def _member(models: list[str], model: str) -> bool:
    """`model` decoded with others (its own greedy run never leaves it)."""
    return model in models and len(models) > 1


def _num(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"
