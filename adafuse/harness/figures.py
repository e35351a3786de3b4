"""Plotly figures shared by the app and the results report: a trace (or results) in, a `go.Figure` out."""
from __future__ import annotations

import html
from collections import Counter
from pathlib import Path
from typing import Iterable

import plotly.graph_objects as go

from ..report import candidate_label, round_sentence
from ..trace import EXPLORING, SPAN_WRITING, Round, Trace, candidate_nll

KIND_COLORS = {"commit": "#c8ecd4", "explore": "#fde2b8", "override": "#e3d2fb"}
KIND_NAMES = {"commit": "committed by confident models", "explore": "chosen after exploration",
              "override": "overridden by you"}
MODEL_COLORS = ["#2563eb", "#dc2626", "#059669", "#9333ea"]
FUSED_COLOR = "#111827"
SHORT_NAMES = {"tau": "τΔ", "max_words": "M", "branches": "B", "explore_lambda": "λ"}  # the settings' symbols


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    # hover labels name traces in full (plotly cuts a trace's name at 15 characters by default)
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, template="plotly_white", height=360,
                      margin=dict(l=50, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.25),
                      hoverlabel=dict(namelength=-1))
    return fig


def empty_figure(title: str, message: str = "Run or step a decode to fill this view") -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, font=dict(size=14, color="#6b7280"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(title=title, template="plotly_white", height=360)
    return fig


def margin_marker(mode: str) -> tuple[str, str]:
    """(legend name, plotly symbol) of a model's mode in the margins figure: ● commit, ✕ explore, ◆ other."""
    if mode in SPAN_WRITING:
        return "commit", "circle"
    if mode in EXPLORING:
        return "explore", "x"
    return mode, "diamond"


def margins_figure(trace: Trace | None) -> go.Figure:
    """Δ per model per round (at the round's first word start), the τ line, commit/explore markers. Each model is a
    line plus one marker trace per kind (so every legend key shows the symbol its points use) and the legend has one
    neutral key per kind."""
    title = "Confidence margins Δ = p(top1) − p(top2)"
    if trace and any(r.features for r in trace.rounds):
        title += " and the gate's weight share per model"
    if not trace or not trace.rounds:
        return empty_figure(title)
    fig = go.Figure()
    kinds: dict[str, str] = {}
    for k, model in enumerate(trace.models):
        color = MODEL_COLORS[k % 4]
        points: list[tuple[int, float, str, str]] = []
        for r in trace.rounds:
            s = next(s for s in r.steps if s.model == model)
            if s.margins:
                points.append((r.index, s.margins[0], s.mode, f"{model}<br>round {r.index} · {s.mode} · "
                               f"Δ={s.margins[0]:.3f}<br>margins: " + ", ".join(f"{m:.2f}" for m in s.margins)))
        fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], mode="lines", name=model,
                                 legendgroup=model, hoverinfo="skip", line=dict(color=color, width=1.5)))
        by_kind: dict[tuple[str, str], list[tuple[int, float, str, str]]] = {}
        for p in points:
            by_kind.setdefault(margin_marker(p[2]), []).append(p)
        for (kind, symbol), pts in by_kind.items():
            kinds[kind] = symbol
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers",
                                     name=f"{model} · {kind}", legendgroup=model, showlegend=False,
                                     hovertext=[p[3] for p in pts], hovertemplate="%{hovertext}<extra></extra>",
                                     marker=dict(symbol=symbol, size=9, color=color)))
    for kind, symbol in sorted(kinds.items(), key=lambda ks: (ks[0] != "commit", ks[0] != "explore", ks[0])):
        # legend keys only: no points, the kind's symbol in a neutral colour
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=kind, legendgroup=f"kind {kind}",
                                 hoverinfo="skip", marker=dict(symbol=symbol, size=9, color="#6b7280")))
    gated = [r for r in trace.rounds if r.features and r.weights]
    for k, model in enumerate(trace.models if gated else []):  # a learned gate: each model's share of the weight
        share = [r.weights.get(model, 0.0) / (sum(r.weights.values()) or 1.0) for r in gated]
        fig.add_trace(go.Scatter(x=[r.index for r in gated], y=share, mode="lines+markers",
                                 name=f"{model} · gate weight share", legendgroup=f"gate {model}",
                                 line=dict(color=MODEL_COLORS[k % 4], dash="dot", width=1.5),
                                 marker=dict(symbol="square", size=5, color=MODEL_COLORS[k % 4]),
                                 hovertext=[f"{model}<br>round {r.index} · gate weight {r.weights.get(model, 0.0):.3f}"
                                            f" (share {v:.2f})" for r, v in zip(gated, share)],
                                 hovertemplate="%{hovertext}<extra></extra>"))
    tau = trace.settings.get("tau")
    if tau is not None:  # τΔ as it was in force each round: a step where a change applied from a round on
        steps = [(0, tau)] + [(c["from_round"], c["settings"]["tau"]) for c in trace.changes if "tau" in c["settings"]]
        bounds = [s[0] - 0.5 for s in steps] + [max(len(trace.rounds), steps[-1][0] + 1) - 0.5]
        xs = [x for i in range(len(steps)) for x in (max(bounds[i], 0), bounds[i + 1])]
        ys = [v for _, v in steps for _ in (0, 1)]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="τΔ", line=dict(color="#6b7280", dash="dash"),
                                 hovertext=[f"τΔ = {v}" for v in ys], hovertemplate="%{hovertext}<extra></extra>"))
        fig.add_annotation(x=0, y=tau, text=f"τΔ = {tau}", showarrow=False, xanchor="left", yanchor="bottom")
    for c in trace.changes:  # a marker where settings moved mid-decode (Step mode or during a Run)
        what = ", ".join(f"{SHORT_NAMES.get(k, k)} → {v}" for k, v in c["settings"].items())
        fig.add_vline(x=c["from_round"] - 0.5, line=dict(color="#7c3aed", dash="dot"),
                      annotation_text=html.escape(f"from round {c['from_round']}: {what}"), annotation_position="top")
    fig.update_yaxes(range=[-0.02, 1.05])
    fig.update_xaxes(tickformat="d", dtick=max(1, len(trace.rounds) // 10))  # rounds are whole numbers
    return _layout(fig, title, "round", "Δ")


def pool_figure(trace: Trace | None, index: int | None = None, pending: Round | None = None) -> go.Figure:
    """Candidates of one round: NLL under every model and the fused score, winner highlighted."""
    title = "Candidate pool"
    r = pending if pending is not None else (trace.rounds[index] if trace and trace.rounds and index is not None
                                             and 0 <= index < len(trace.rounds) else None)
    if r is None:
        return empty_figure(title)
    labels = [f"{i}: {candidate_label(c.text, c.eos)}" for i, c in enumerate(r.candidates)]
    models = trace.models if trace else sorted({m for c in r.candidates for m in c.nll})
    per = (trace.settings_at(r.index).get("normalize") if trace else None) or "token"  # as the fused score took them
    unit = f" per {per}"
    fig = go.Figure()
    for k, model in enumerate(models):
        fig.add_trace(go.Bar(x=labels, y=[candidate_nll(c, model, per) for c in r.candidates],
                             name=f"NLL{unit} {model}",
                             marker_color=MODEL_COLORS[k % 4], opacity=0.75,
                             hovertext=[_hover(c, model) for c in r.candidates],
                             hovertemplate="%{x}<br>NLL %{y:.3f} · %{hovertext}<extra></extra>"))
    fused = [c.fused for c in r.candidates]
    weights = getattr(r, "weights", {}) or {}
    gate = "gate " if getattr(r, "features", None) else ""
    how = (f"{gate}weighted mean: " + ", ".join(f"{m} ×{w:.3g}" for m, w in weights.items())) if weights \
        else "mean over models"
    fig.add_trace(go.Scatter(x=labels, y=fused, mode="markers", name=f"fused ({how})",
                             hovertemplate=f"%{{x}}<br>fused NLL %{{y:.3f}} ({how})<extra></extra>",
                             marker=dict(symbol="diamond", size=13, color=FUSED_COLOR)))
    win = labels[r.winner]
    fig.add_annotation(x=win, y=max([v for v in fused if v is not None] or [0]) * 1.08 + 0.05,
                       text="★ winner", showarrow=False, font=dict(color="#b45309", size=13))
    if r.chosen != r.winner:
        fig.add_annotation(x=labels[r.chosen], y=0, text="✎ your pick", showarrow=False, yshift=-12,
                           font=dict(color="#7c3aed"))
    fig.update_layout(barmode="group")
    state = "pending — pick a candidate below or Step to accept" if pending is not None else r.kind
    if all(v is None for v in fused):
        fig.add_annotation(text="one candidate only: nothing to score", showarrow=False, yref="paper", y=0.5)
    fig.update_xaxes(tickfont=dict(size=13))  # "⏎ end" at the size of every other label
    fig = _layout(fig, f"{title}: round {r.index} ({state})", "candidate (proposers in hover)",
                  f"NLL{unit} (lower is better)")
    if trace is not None:  # the round in plain words, under the title (wrapped: a figure's title does not wrap)
        lines = _wrap(html.escape(round_sentence(trace, r)), 110)
        fig.update_layout(title=dict(text=f"{title}: round {r.index} ({state})"
                                          + "".join(f"<br><sup>{line}</sup>" for line in lines)),
                          margin=dict(t=50 + 18 * len(lines)), height=360 + 18 * len(lines))
    return fig


def _wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters, broken at spaces (a figure's title does not wrap)."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line]


def _hover(c, model: str) -> str:
    """A bar's hover text: tokens scored, the end term of a candidate that ends the answer, why a score is missing."""
    text = f"{model}: {c.n_tokens.get(model, '?')} tokens, proposed by {', '.join(c.proposers) or '—'}"
    end = getattr(c, "end_term", {}).get(model)
    if c.eos and end is not None:
        text += f"; ⏎ end: log p(the answer ends here) = {end:.3f}"
    if getattr(c, "notes", {}).get(model):
        text += f"; not scored: {c.notes[model]}"
    return text


def words_per_round_figure(trace: Trace | None) -> go.Figure:
    """Share of rounds that committed 1…M words."""
    title = "Words per round"
    if not trace or not trace.rounds:
        return empty_figure(title)
    words = [r.words for r in trace.rounds]
    top = max([trace.settings.get("max_words", 3), *words])
    shares = word_shares(words, top)
    xs = list(range(1, top + 1))
    fig = go.Figure(go.Bar(x=[str(x) for x in xs], y=shares, text=[f"{s:.1f}%" for s in shares],
                           textposition="outside", marker_color="#0f766e"))
    fig.update_yaxes(range=[0, 110])
    return _layout(fig, f"{title} ({rounds_note(words)})", "words committed in the round", "% of rounds")


def rounds_note(words: list[int]) -> str:
    """"17 rounds" (every round, as len(trace.rounds) counts them), plus how many added no words (a final round that
    only ended the answer, or one a stop string cut away): the shares leave those out."""
    empty = sum(1 for w in words if w <= 0)
    note = f"{len(words)} round{'s' if len(words) != 1 else ''}"
    if empty:
        note += f"; {empty} added no words, left out of the shares"
    return note


def cost_figure(trace: Trace | None, singles: dict[str, Trace] | None = None) -> go.Figure:
    """Seconds per word per model in the ensemble against each model alone."""
    title = "Cost: seconds per generated word"
    if not trace or not trace.rounds:
        return empty_figure(title)
    fig = go.Figure()
    words = max(1, trace.words)
    fig.add_trace(go.Bar(x=trace.models, y=[trace.cost(m)["seconds"] / words for m in trace.models],
                         name="inside the ensemble", marker_color="#f59e0b"))
    if singles:
        fig.add_trace(go.Bar(x=list(singles), y=[t.cost(m)["seconds"] / max(1, t.words) for m, t in singles.items()],
                             name="alone (greedy)", marker_color="#64748b"))
    fig.update_layout(barmode="group")
    return _layout(fig, title, "model", "seconds / word")


def word_shares(words: Iterable[int], top: int = 3) -> list[float]:
    """% of the rounds that wrote 1, 2, … `top` words (`top` counts `top` or more); rounds that wrote nothing are
    left out. The app's words-per-round view and the report's table read the same numbers."""
    counts = Counter(min(w, top) for w in words if w > 0)
    total = sum(counts.values()) or 1
    return [100 * counts.get(k, 0) / total for k in range(1, top + 1)]


def save(fig: go.Figure, folder: Path, name: str) -> str:
    """Write a report figure as HTML (+ PNG when kaleido and Chrome are there); returns its Markdown."""
    fig.update_layout(template="plotly_white", width=900, height=460)
    fig.write_html(folder / f"{name}.html", include_plotlyjs="cdn")
    try:
        fig.write_image(folder / f"{name}.png", scale=1.5)
        return f"![{name}](figures/{name}.png) ([interactive](figures/{name}.html))"
    except Exception as exc:  # noqa: BLE001 - a PNG needs kaleido + Chrome; the HTML is always written
        return f"[{name} (interactive)](figures/{name}.html) (PNG not written: {type(exc).__name__})"
