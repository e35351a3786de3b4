"""The Answers tab: which of a few candidate answers each model prefers after a question, and the fused pair's
preference — each model's log-likelihood of every answer in its own tokens and their weighted mean (`AdaFuse.score`,
what lm-eval's multiple-choice tasks read)."""
from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from adafuse import AdaFuse, DecodeConfig
from adafuse.errors import ConfigError, PromptError
from adafuse.harness.figures import MODEL_COLORS, empty_figure
from adafuse.methods import Greedy
from adafuse.scorer import Likelihood

MIN_ANSWERS, MAX_ANSWERS = 2, 5
# the longest answer scored: each model reads every token of every answer, about 16 ms a character for the bundled pair
# on 2 CPU cores (2,000 characters: 34 s; 5,000: 79 s behind a bare "processing") — choices are short texts
MAX_ANSWER_CHARS = 500
QUESTION = "Question: Who wrote the play Hamlet?\nAnswer:"
ANSWERS = "William Shakespeare\nCharles Dickens\nMount Everest"
FUSED = "fused"
FUSED_COLOR = "#111827"
TITLE = "Each model's log-likelihood of every answer"


def no_figure(message: str = "Press “Score the answers” to chart each model's preference") -> go.Figure:
    """The chart before a scoring, or in place of one that failed (no earlier answers' chart under a new error)."""
    return empty_figure(TITLE, message)


def no_frame() -> pd.DataFrame:
    """The table before a scoring, or in place of one that failed."""
    return pd.DataFrame(columns=["answer", "fused"])


def parse_answers(text: str | None) -> list[str]:
    """The candidate answers, one per line (blank lines skipped: `blank_note` says which): 2 to 5 different ones, each
    of at most MAX_ANSWER_CHARS characters."""
    answers = [a.strip() for a in (text or "").splitlines() if a.strip()]
    if not MIN_ANSWERS <= len(answers) <= MAX_ANSWERS:
        raise ConfigError(f"{len(answers)} answers given: write {MIN_ANSWERS} to {MAX_ANSWERS}, one per line"
                          + (f" ({blank_note(text)[:-1].lower()})" if blank_lines(text) else ""))
    if len(set(answers)) < len(answers):
        raise ConfigError("an answer is given twice: write each candidate once")
    for i, a in enumerate(answers, 1):
        if len(a) > MAX_ANSWER_CHARS:
            raise ConfigError(f"answer {i} is {len(a):,} characters long: answers of up to {MAX_ANSWER_CHARS} "
                              "characters are scored here (every model reads each of their tokens: a long one takes "
                              "minutes on a CPU) — shorten it")
    return answers


def blank_lines(text: str | None) -> list[int]:
    """The numbers (from 1) of the blank lines between the answers: skipped, not scored as an empty answer."""
    lines = (text or "").splitlines()
    while lines and not lines[-1].strip():  # the box's trailing new lines are no answer lines
        lines.pop()
    return [i for i, line in enumerate(lines, 1) if not line.strip()]


def blank_note(text: str | None) -> str:
    """"Blank line 2 skipped." (the lines `blank_lines` finds), or ""."""
    lines = blank_lines(text)
    if not lines:
        return ""
    return f"Blank line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))} skipped."


def continuations(question: str, answers: list[str]) -> list[str]:
    """Each answer as it continues the question: after a space, as lm-eval's multiple-choice tasks join them (none
    when the question already ends with whitespace)."""
    sep = "" if question[-1:].isspace() else " "
    return [sep + a for a in answers]


def check_answers(question: str | None, text: str | None) -> list[str]:
    """The question and the answers as the tab takes them (`parse_answers`), or a typed error before any model loads."""
    if not (question or "").strip():
        raise PromptError("the question is empty: type the text each answer continues (e.g. \"Question: …\\nAnswer:\")")
    return parse_answers(text)


def score_answers(models: list, cfg: DecodeConfig, question: str, text: str) -> tuple[list[str], list[Likelihood]]:
    """Every candidate answer scored after the question by these models with these settings' weights (or gate)."""
    answers = check_answers(question, text)
    if len(models) == 1:  # one model scores alone: no ensemble method, weights or gate
        cfg = replace(cfg, method=Greedy.name, weights=(), gate="")
    return answers, AdaFuse(models, replace(cfg, stop=())).score(question, continuations(question, answers))


def preferred(scored: list[Likelihood], model: str | None = None) -> int:
    """The answer `model` (None: the fused pair) finds most likely."""
    values = [s.fused if model is None else s.logprob[model] for s in scored]
    return max(range(len(values)), key=values.__getitem__)


def shares(values: list[float]) -> list[float]:
    """Each answer's share among these answers: exp(log-likelihood), normalized over them."""
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    return [w / sum(weights) for w in weights]


def answers_figure(answers: list[str], scored: list[Likelihood]) -> go.Figure:
    """One bar chart per model and one for the fused pair: each answer's share among these answers (its likelihood
    over theirs added up), the one preferred solid; a bar's label and hover give its log-likelihood."""
    names = list(scored[0].logprob)
    panels = [*names, FUSED]
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, subplot_titles=panels)
    for k, panel in enumerate(panels):
        model = None if panel == FUSED else panel
        values = [s.fused if model is None else s.logprob[model] for s in scored]
        best = preferred(scored, model)
        color = FUSED_COLOR if model is None else MODEL_COLORS[k % len(MODEL_COLORS)]
        fig.add_trace(go.Bar(x=answers, y=shares(values), name=panel, marker_color=color,
                             marker_opacity=[1.0 if i == best else 0.35 for i in range(len(answers))],
                             text=[f"{v:.2f}" for v in values], textposition="outside", customdata=values,
                             hovertemplate="%{x}<br>share %{y:.1%}, log-likelihood %{customdata:.3f}<extra>"
                                           + panel + "</extra>"),
                      row=1, col=k + 1)
    fig.update_layout(showlegend=False, height=360, margin=dict(t=40, l=50, r=10, b=80),
                      yaxis_title="share among these answers")
    fig.update_yaxes(range=[0, 1.15], tickformat=".0%")
    return fig


def answers_frame(answers: list[str], scored: list[Likelihood]) -> pd.DataFrame:
    """A row per answer: the fused log-likelihood, each model's with its token count, per byte too (acc_norm's)."""
    rows = []
    for a, s in zip(answers, scored):
        row = {"answer": a, "fused": round(s.fused, 3), "fused per byte": round(s.fused / max(1, s.bytes), 4)}
        for name, value in s.logprob.items():
            row[name] = round(value, 3)
            row[f"{name} tokens"] = s.tokens[name]
        rows.append(row)
    return pd.DataFrame(rows)


def answers_summary(answers: list[str], scored: list[Likelihood]) -> str:
    """Which answer each model and the fused pair prefer, and who disagrees with the fused choice."""
    fused = preferred(scored)
    picks = {name: preferred(scored, name) for name in scored[0].logprob}
    say = [f"**Fused**: {answers[fused]}"] + [f"**{n}**: {answers[i]}" for n, i in picks.items()]
    apart = [n for n, i in picks.items() if i != fused]
    verdict = ("Every model prefers the fused choice" if not apart else
               f"Disagreeing: {', '.join(apart)} {'prefers' if len(apart) == 1 else 'prefer'} another answer than the "
               "fused pair")
    weights = scored[0].weights
    how = "weighted " + ", ".join(f"{n} {w:g}" for n, w in weights.items()) if weights else "equal weights"
    return f"Preferred — {' · '.join(say)}. {verdict} (fused: the mean log-likelihood, {how})."
