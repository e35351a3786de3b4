"""Pure view builders: a trace in, a Plotly figure / HTML / DataFrame out. No Gradio here."""
from __future__ import annotations

import html
from collections import Counter

import pandas as pd
import plotly.graph_objects as go

from adafuse.report import candidate_label, cost_rows, round_rows
from adafuse.trace import Round, Trace

KIND_COLORS = {"commit": "#c8ecd4", "explore": "#fde2b8", "override": "#e3d2fb"}
KIND_NAMES = {"commit": "committed by confident models", "explore": "chosen after exploration",
              "override": "overridden by you"}
MODEL_COLORS = ["#2563eb", "#dc2626", "#059669", "#9333ea"]
FUSED_COLOR = "#111827"


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, template="plotly_white", height=360,
                      margin=dict(l=50, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.25))
    return fig


def empty_figure(title: str, message: str = "Run or step a decode to fill this view") -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, font=dict(size=14, color="#6b7280"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(title=title, template="plotly_white", height=360)
    return fig


def margins_figure(trace: Trace | None) -> go.Figure:
    """Δ per model per round (at the round's first word start), the τ line, commit/explore markers."""
    title = "Confidence margins Δ = p(top1) − p(top2)"
    if not trace or not trace.rounds:
        return empty_figure(title)
    fig = go.Figure()
    for k, model in enumerate(trace.models):
        xs, ys, symbols, text = [], [], [], []
        for r in trace.rounds:
            s = next(s for s in r.steps if s.model == model)
            if not s.margins:
                continue
            xs.append(r.index)
            ys.append(s.margins[0])
            symbols.append("circle" if s.mode in ("commit", "greedy", "span") else "x")
            text.append(f"round {r.index} · {s.mode} · Δ={s.margins[0]:.3f}<br>margins: "
                        + ", ".join(f"{m:.2f}" for m in s.margins))
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=model, hovertext=text, hoverinfo="text",
                                 line=dict(color=MODEL_COLORS[k % 4], width=1.5),
                                 marker=dict(symbol=symbols, size=9, color=MODEL_COLORS[k % 4])))
    tau = trace.settings.get("tau")
    if tau is not None:
        fig.add_hline(y=tau, line=dict(color="#6b7280", dash="dash"), annotation_text=f"τΔ = {tau}",
                      annotation_position="top left")
    fig.update_yaxes(range=[-0.02, 1.05])
    return _layout(fig, title + "  (● commit, ✕ explore)", "round", "Δ")


def pool_figure(trace: Trace | None, index: int | None = None, pending: Round | None = None) -> go.Figure:
    """Candidates of one round: NLL under every model and the fused score, winner highlighted."""
    title = "Candidate pool"
    r = pending if pending is not None else (trace.rounds[index] if trace and trace.rounds and index is not None
                                             and 0 <= index < len(trace.rounds) else None)
    if r is None:
        return empty_figure(title)
    labels = [f"{i}: {candidate_label(c.text, c.eos)}" for i, c in enumerate(r.candidates)]
    models = trace.models if trace else sorted({m for c in r.candidates for m in c.nll})
    fig = go.Figure()
    for k, model in enumerate(models):
        fig.add_trace(go.Bar(x=labels, y=[c.nll.get(model) for c in r.candidates], name=f"NLL {model}",
                             marker_color=MODEL_COLORS[k % 4], opacity=0.75,
                             hovertext=[f"{model}: {c.n_tokens.get(model, '?')} tokens, proposed by "
                                        f"{', '.join(c.proposers) or '—'}" for c in r.candidates]))
    fused = [c.fused for c in r.candidates]
    fig.add_trace(go.Scatter(x=labels, y=fused, mode="markers", name="fused (mean)",
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
    return _layout(fig, f"{title}: round {r.index} ({state})", "candidate (proposers in hover)", "NLL (lower is better)")


def words_per_round_figure(trace: Trace | None) -> go.Figure:
    """Share of rounds that committed 1…M words, like the paper's figure."""
    title = "Words per round"
    if not trace or not trace.rounds:
        return empty_figure(title)
    counts = Counter(max(1, r.words) for r in trace.rounds if r.text)
    top = max([trace.settings.get("max_words", 3), *counts] or [1])
    xs = list(range(1, top + 1))
    total = sum(counts.values()) or 1
    shares = [100 * counts.get(x, 0) / total for x in xs]
    fig = go.Figure(go.Bar(x=[str(x) for x in xs], y=shares, text=[f"{s:.1f}%" for s in shares],
                           textposition="outside", marker_color="#0f766e"))
    fig.update_yaxes(range=[0, 110])
    return _layout(fig, f"{title} ({total} rounds)", "words committed in the round", "% of rounds")


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


def rounds_frame(trace: Trace | None) -> pd.DataFrame:
    return pd.DataFrame(round_rows(trace)) if trace and trace.rounds else pd.DataFrame({"round": []})


def cost_frame(trace: Trace | None, singles: dict[str, Trace] | None = None) -> pd.DataFrame:
    if not trace:
        return pd.DataFrame({"model": []})
    rows = [{"run": "ensemble", **row} for row in cost_rows(trace)]
    for name, t in (singles or {}).items():
        rows += [{"run": "alone", **row} for row in cost_rows(t)]
    return pd.DataFrame(rows)


def _span(text: str, style: str, tip: str) -> str:
    body = html.escape(text).replace("\n", "⏎<br>")
    return f'<span class="af-span" style="{style}" title="{html.escape(tip)}">{body}</span>'


def fused_html(trace: Trace | None, pending: Round | None = None) -> str:
    """The fused output, each round's span coloured by its kind; hover shows round, margins and score."""
    if not trace:
        return '<div class="af-out af-empty">No output yet: pick an example or type a prompt, then Run or Step.</div>'
    parts = []
    for r in trace.rounds:
        c = r.candidates[r.chosen]
        tip = (f"round {r.index} · {KIND_NAMES[r.kind]} · {len(r.candidates)} candidate(s)"
               + (f" · fused NLL {c.fused:.3f}" if c.fused is not None else "")
               + " · Δ " + ", ".join(f"{s.model}={s.margins[0]:.2f}" for s in r.steps if s.margins))
        parts.append(_span(r.text, f"background:{KIND_COLORS[r.kind]}", tip) if r.text else "")
    if pending is not None:
        c = pending.candidates[pending.winner]
        parts.append(_span(c.text, "border:1px dashed #9ca3af;color:#6b7280",
                           f"round {pending.index} · pending: Step accepts it"))
    legend = " ".join(f'<span class="af-span" style="background:{col}">{KIND_NAMES[k]}</span>'
                      for k, col in KIND_COLORS.items())
    stop = f" · stopped: {trace.stop_reason}" if trace.stop_reason else ""
    return (f'<div class="af-out">{"".join(parts) or "<i>(empty)</i>"}</div>'
            f'<div class="af-legend">{legend} · {len(trace.rounds)} rounds · {trace.words} words{stop}</div>')


def _seconds(t: Trace) -> float:
    return sum(t.cost(m)["seconds"] for m in t.models)


def compare_html(trace: Trace | None, singles: dict[str, Trace] | None, others: dict[str, Trace] | None = None) -> str:
    """Fused output next to each base model's own greedy output and any other methods decoded."""
    cols = []
    if trace:
        method = trace.settings.get("method", "adafuse")
        cols.append((f"{'AdaFuse' if method == 'adafuse' else method} (fused)", trace.output,
                     f"{trace.words} words · {_seconds(trace):.1f}s"))
    for name, t in (others or {}).items():
        cols.append((name, t.output, f"{t.words} words · {_seconds(t):.1f}s"))
    for name, t in (singles or {}).items():
        cols.append((f"{name} alone", t.output, f"{t.words} words · {_seconds(t):.1f}s"))
    if not cols:
        return '<div class="af-empty">Single-model outputs appear here after a Run.</div>'
    cells = "".join(f'<div class="af-col"><b>{html.escape(h)}</b><div class="af-meta">{html.escape(m)}</div>'
                    f'<pre>{html.escape(o.strip()) or "(empty)"}</pre></div>' for h, o, m in cols)
    return f'<div class="af-grid">{cells}</div>'
