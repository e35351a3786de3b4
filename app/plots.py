"""Pure view builders: a trace in, HTML / DataFrame out (figures come from adafuse.harness.figures). No Gradio here."""
from __future__ import annotations

import html

import pandas as pd

from adafuse.harness.figures import (KIND_COLORS, KIND_NAMES, MODEL_COLORS, cost_figure, empty_figure,  # noqa: F401
                                     margins_figure, pool_figure, words_per_round_figure)
from adafuse.errors import ConfigError
from adafuse.method_registry import from_spec, legacy
from adafuse.explain import why_empty
from adafuse.report import candidate_label, cost_rows, round_rows, round_sentence
from adafuse.selection import selection_rows
from adafuse.trace import Round, Trace, candidate_nll, transcript_readers


def rounds_frame(trace: Trace | None) -> pd.DataFrame:
    """The rounds table (`adafuse.report.round_rows`) narrow enough for the views' column on a laptop: each model's
    margin and mode in one column ("0.10 explore×3"), its seconds as "s" to two decimals."""
    if not trace or not trace.rounds:
        return pd.DataFrame({"round": []})
    rows = []
    for row in round_rows(trace):
        out = {}
        for key, value in row.items():
            if key.startswith("Δ "):
                mode = row[f"mode {key[2:]}"]
                out[f"{key[2:]} Δ, mode"] = mode if value is None else f"{value:.2f} {mode}"
            elif not key.startswith("mode "):
                out[key] = value
        out["s"] = round(out.pop("seconds"), 2)
        rows.append(out)
    return pd.DataFrame(rows)


ROUNDS_WIDTHS = {"round": 8, "kind": 10, "pool": 6, "words": 8, "fused NLL": 9, "s": 7}  # % of the table's width


def rounds_widths(frame: pd.DataFrame) -> list[str] | None:
    """Column widths that keep every column of `rounds_frame` in view: the models' columns share up to 40 %, the
    chosen text takes the rest."""
    if "chosen" not in frame.columns:
        return None
    models = [c for c in frame.columns if c not in ROUNDS_WIDTHS and c != "chosen"]
    each = min(15.0, 40.0 / max(1, len(models)))
    rest = 100 - sum(ROUNDS_WIDTHS.values()) - each * len(models)
    return [f"{ROUNDS_WIDTHS.get(c, rest if c == 'chosen' else each):g}%" for c in frame.columns]


def selection_frame(trace: Trace | None, index: int) -> pd.DataFrame:
    """Round `index`'s first-token selection (`adafuse.selection.selection_rows`): every token an unsure model looked
    at, its probability and redundancy penalty, picked or skipped and why."""
    if not trace or not 0 <= index < len(trace.rounds):
        return pd.DataFrame({"why": []})
    rows = selection_rows(trace, index)
    return pd.DataFrame(rows) if rows else pd.DataFrame({"why": ["no model explored first tokens in this round"]})


def cost_frame(trace: Trace | None, singles: dict[str, Trace] | None = None) -> pd.DataFrame:
    if not trace:
        return pd.DataFrame({"model": []})
    rows = [{"run": "ensemble", **row} for row in cost_rows(trace)]
    for name, t in (singles or {}).items():
        rows += [{"run": "alone", **row} for row in cost_rows(t)]
    # a model's own busy time (side by side, the models' seconds overlap): the run's one duration is its wall clock
    return pd.DataFrame(rows).rename(columns={"seconds": "busy seconds"})


KIND_MARKS = {"commit": "solid", "explore": "dotted", "override": "double"}  # told apart without colour too


def _span(text: str, kind: str | None, tip: str, ident: str) -> str:
    """A round's text: coloured and underlined by kind, focusable; its details show on hover and keyboard focus
    (data-tip) and are read by screen readers from the description `ident` (see `_descriptions`)."""
    body = html.escape(text).replace("\n", "⏎<br>")
    style = (f"background:{KIND_COLORS[kind]};text-decoration:underline {KIND_MARKS[kind]} #374151"
             if kind else "border:1px dashed #9ca3af;color:#4b5563")
    return (f'<span class="af-span" tabindex="0" style="{style}" title="{html.escape(tip)}" '
            f'data-tip="{html.escape(tip)}" aria-describedby="{ident}">{body}</span>')


def _descriptions(tips: dict[str, str]) -> str:
    """The spans' details for screen readers, outside the text so reading the answer is not interrupted."""
    return '<div class="af-sr">' + "".join(f'<span id="{i}">{html.escape(t)}</span>' for i, t in tips.items()) + "</div>"


def empty_answer_note(trace: Trace) -> str:
    """Why an answer came out empty, in the answer's place ("(empty)" when the library has nothing to add)."""
    why = why_empty(trace, "Model weights")
    return f"(empty: {why}. The Pool tab shows the round.)" if why else "(empty)"


def why_won(trace: Trace, r: Round) -> str:
    """Why a round's text won, for its hover tip: the runner-up and the score gap (each model's NLL of both), or why
    there was nothing to compare."""
    c = r.candidates[r.chosen]
    if r.overridden:
        w = r.candidates[r.winner]
        return f"your pick; the scores preferred “{candidate_label(w.text, w.eos)}”"
    if len(trace.models) == 1:
        return f"{trace.models[0]}'s own next word (one model, greedy)"
    scored = sorted((x for i, x in enumerate(r.candidates) if i != r.chosen and x.fused is not None),
                    key=lambda x: x.fused)
    if len(r.candidates) == 1:
        return "the only candidate: " + ("every model was confident (Δ ≥ τΔ)" if r.kind == "commit"
                                          else "no other span was proposed")
    if c.fused is None or not scored:
        return f"{len(r.candidates)} candidates, chosen without a fused score ({trace.settings.get('method')})"
    ru, unit = scored[0], trace.settings_at(r.index).get("normalize") or "token"
    nll = {m: (candidate_nll(c, m, unit), candidate_nll(ru, m, unit)) for m in trace.models}  # as the score took them
    per = ", ".join(f"{m} {a:.2f} vs {b:.2f}" for m, (a, b) in nll.items() if a is not None and b is not None)
    weights = trace.round_weights(r.index)
    weighed = f"; weights {', '.join(f'{m} {w:g}' for m, w in weights.items())}" if len(set(weights.values())) > 1 \
        else ""
    return (f"beat runner-up “{candidate_label(ru.text, ru.eos)}” by {ru.fused - c.fused:.3f} fused NLL "
            f"({c.fused:.3f} vs {ru.fused:.3f}; NLL per {unit} {per}{weighed})")


def fused_html(trace: Trace | None, pending: Round | None = None, paused: bool = False, deciding: bool = False) -> str:
    """The fused output, each round's span coloured and underlined by its kind; hover or focus (Tab) shows its
    round, margins, the runner-up and why it won. The legend lists only the kinds present. `paused`: the decode
    stopped unfinished (Cancel) and Step or Run continues it; `deciding`: a Run is deciding the decode's first round
    (nothing to show yet, and nothing empty either)."""
    if not trace:
        return ('<div class="af-out af-empty">No output yet: type a prompt or pick an example, then ▶ Run '
                '(Ctrl+Enter) or Step › (Ctrl+Shift+Enter).</div>')
    if not trace.rounds and pending is None and not trace.stop_reason and (deciding or paused):
        return ('<div class="af-out af-empty">… deciding the first round: each model reads the prompt, then they '
                'propose and score the first words</div>' if deciding else
                '<div class="af-out af-empty">No round decided yet: Step › or ▶ Run starts the first one.</div>')
    alone = len(trace.models) == 1
    parts, kinds, tips = [], [], {}
    for r in trace.rounds:
        tip = (f"round {r.index} · {'written alone' if alone else KIND_NAMES[r.kind]} · {why_won(trace, r)}"
               + " · Δ " + ", ".join(f"{s.model}={s.margins[0]:.2f}" for s in r.steps if s.margins)
               + f" · in words: {round_sentence(trace, r)}")
        if r.text:
            parts.append(_span(r.text, r.kind, tip, f"af-tip-{r.index}"))
            kinds.append(r.kind)
            tips[f"af-tip-{r.index}"] = tip
    if pending is not None:
        c = pending.candidates[pending.winner]
        tips["af-tip-pending"] = f"round {pending.index} · pending: Step accepts it"
        parts.append(_span(c.text, None, tips["af-tip-pending"], "af-tip-pending"))
    names = {**KIND_NAMES, "commit": f"written by {trace.models[0]} alone"} if alone else KIND_NAMES
    legend = " ".join(f'<span class="af-key" style="background:{KIND_COLORS[k]};text-decoration:underline '
                      f'{KIND_MARKS[k]} #374151">{names[k]}</span>' for k in KIND_COLORS if k in kinds)
    stop = f" · stopped: {trace.stop_reason}" if trace.stop_reason else ""
    if paused and not trace.stop_reason:
        stop = " · paused: Step › or ▶ Run continues from here"
    plain = transcript_readers(trace)
    if plain:
        stop += f" · read as a transcript (no chat template): {', '.join(plain)}"
    text = "".join(parts) or f"<i>{html.escape(empty_answer_note(trace))}</i>"  # built only for an empty answer
    return (f'<div class="af-out">{text}</div>{_descriptions(tips)}'
            f'<div class="af-legend">{legend}{" · " if legend else ""}{count(len(trace.rounds), "round")} · '
            f'{count(trace.words, "word")} · {trace.seconds:.1f}s{stop} · Tab through the text for each round\'s '
            'details</div>')


def progress(trace: Trace) -> str:
    """A decode under way, as the answer's legend counts it: "14 rounds decided · 18 words"."""
    return f"{count(len(trace.rounds), 'round')} decided · {count(trace.words, 'word')}"


def count(n: int, noun: str) -> str:
    """"1 word", "3 words"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def title(trace: Trace) -> str:
    """A trace's heading: the method and how many models it fused, or the one model that wrote it alone."""
    try:
        cls, settings = from_spec(legacy(trace.settings))
        method, label = cls.name, cls.title(settings)
    except ConfigError:  # a method this version does not have: its name as the trace wrote it
        method = label = str(trace.settings.get("method"))
    if len(trace.models) == 1:
        return f"{trace.models[0]} alone ({method})"
    return f"{label} (fused)"


def compare_html(trace: Trace | None, singles: dict[str, Trace] | None, others: dict[str, Trace] | None = None) -> str:
    """Fused output next to each base model's own greedy output and any other methods decoded; each with its one
    duration, the decode's wall clock."""
    cols = []
    if trace:
        cols.append((title(trace), trace.output, f"{count(trace.words, 'word')} · {trace.seconds:.1f}s"))
    for name, t in (others or {}).items():
        cols.append((name, t.output, f"{count(t.words, 'word')} · {t.seconds:.1f}s"))
    for name, t in (singles or {}).items():
        cols.append((f"{name} alone", t.output, f"{count(t.words, 'word')} · {t.seconds:.1f}s"))
    if not cols:
        return '<div class="af-empty">Single-model outputs appear here after a Run.</div>'
    cells = "".join(f'<div class="af-col"><b>{html.escape(h)}</b><div class="af-meta">{html.escape(m)}</div>'
                    f'<pre>{html.escape(o.strip()) or "(empty)"}</pre></div>' for h, o, m in cols)
    return f'<div class="af-grid">{cells}</div>'
