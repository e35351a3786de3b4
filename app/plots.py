"""Pure view builders: a trace in, HTML / DataFrame out (figures come from adafuse.harness.figures). No Gradio here."""
from __future__ import annotations

import html

import pandas as pd

from adafuse.harness.figures import (KIND_COLORS, KIND_NAMES, MODEL_COLORS, cost_figure, empty_figure,  # noqa: F401
                                     margins_figure, pool_figure, words_per_round_figure)
from adafuse.report import cost_rows, round_rows
from adafuse.trace import Round, Trace


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
