"""Plain-text and row views of a trace, shared by the CLI, the benchmark and the app."""
from __future__ import annotations

from .trace import EXPLORING, SPAN_WRITING, Round, StepMode, Trace


def show(text: str, width: int = 40) -> str:
    """A span made visible: newlines as ⏎, tabs as ⇥, long spans shortened."""
    out = text.replace("\n", "⏎").replace("\t", "⇥")
    return out if len(out) <= width else out[: width - 1] + "…"


def candidate_label(text: str, eos: bool) -> str:
    """A candidate as the pool lists it; one that ends the answer reads "text ⏎ end" ("⏎ end" with no text)."""
    if not eos:
        return show(text)
    return f"{show(text)} ⏎ end" if text else "⏎ end"


def round_rows(trace: Trace) -> list[dict]:
    """One row per round: each model's margin and mode, pool size, chosen span, fused score."""
    rows = []
    for r in trace.rounds:
        row = {"round": r.index, "kind": r.kind}
        for s in r.steps:
            row[f"Δ {s.model}"] = round(s.margins[0], 3) if s.margins else None
            row[f"mode {s.model}"] = s.mode if len(s.margins) < 2 else f"{s.mode}×{len(s.margins)}"
        c = r.candidates[r.chosen]
        row.update({"pool": len(r.candidates), "chosen": candidate_label(r.text, c.eos), "words": r.words,
                    "fused NLL": None if c.fused is None else round(c.fused, 3), "seconds": round(r.seconds, 3)})
        rows.append(row)
    return rows


def cost_rows(trace: Trace) -> list[dict]:
    """Per model: forward passes, tokens fed, seconds (prefill included); with speculative proposals on, the draft
    tokens verified, the tokens taken from them and the forwards saved; where it ran and how the models took turns
    (side by side or one after another, and what the machine measured) when the trace says."""
    speculated = trace.settings.get("speculate") or any(s.draft_tokens for r in trace.rounds for s in r.steps)
    rows = []
    for m in trace.models:
        row = {"model": m, **{k: (round(v, 2) if isinstance(v, float) else v) for k, v in trace.cost(m).items()},
               "prompt tokens": trace.prefill.get(m, {}).get("prompt_tokens"),
               **(trace.speculation(m) if speculated else {})}
        if trace.devices:
            row["device"] = trace.devices.get(m)
        if trace.workers:
            row["ran"] = trace.workers
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table."""
    if not rows:
        return "(no rounds)"
    cols = list(rows[0])
    cells = [[("" if row.get(c) is None else str(row.get(c))) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])


# ---- a round in plain words ----
UNIT_WORDS = {"token": "per token", "word": "per word", "byte": "per byte"}


def round_sentence(trace: Trace, r: Round) -> str:
    """Round `r` of `trace` (decided, or pending) in plain words: what each model did and why (its margin Δ against
    τΔ), and what chose the text (the fused score, its unit and weights, or a hand's pick). E.g. "Both models were
    unsure (Δ 0.12, 0.30 < τΔ 0.70), so each offered up to 3 first words; of 5 candidates, their average NLL per byte
    chose “Shakespeare” (1.21; runner-up “The” 1.80)." """
    settings = trace.settings_at(r.index)
    tau = float(settings.get("tau", 0.0))
    sure, unsure, other = [], [], []
    for s in r.steps:
        d = f"{s.margins[0]:.2f}" if s.margins else "–"
        (sure if s.mode in SPAN_WRITING else unsure if s.mode in EXPLORING else other).append((s, d))
    parts = []
    if len(trace.models) == 1:
        parts.append(f"{trace.models[0]} alone wrote its likeliest next word")
    elif sure:
        names = _names([s.model for s, _ in sure], len(r.steps))
        margins = ", ".join(d for _, d in sure)
        parts.append(f"{names} {'was' if len(sure) == 1 else 'were'} sure (Δ {margins} ≥ τΔ {tau:.2f}), so "
                     f"{'it' if len(sure) == 1 else 'each'} wrote up to {settings.get('max_words', '?')} words")
    if unsure and len(trace.models) > 1:
        names = _names([s.model for s, _ in unsure], len(r.steps))
        how = "a beam over" if unsure[0][0].mode == StepMode.BEAM else "up to"
        margins, b = ", ".join(d for _, d in unsure), settings.get("branches", "?")
        parts.append(f"{names} {'was' if len(unsure) == 1 else 'were'} unsure (Δ {margins} < τΔ {tau:.2f}), so "
                     f"{'it' if len(unsure) == 1 else 'each'} offered {how} {b} first words")
    for s, _ in other:
        parts.append(f"{s.model} {'sat this round out' if s.mode == StepMode.IDLE else 'worked ' + str(s.mode)}")
    held = [s.model for s in r.steps if s.held_end]
    if held:
        who = _names(held, len(r.steps))
        who = who[0].lower() + who[1:] if who.startswith(("Both", "All")) else who
        parts.append(f"the end of the answer, proposed by {who} before its first word, was held back")
    did = "; ".join(parts) or f"round {r.index}"
    c = r.candidates[r.chosen]
    label = f"“{candidate_label(c.text, c.eos)}”"
    if r.overridden:
        w = r.candidates[r.winner]
        return f"{did}. You picked {label}; the scores preferred “{candidate_label(w.text, w.eos)}”."
    if len(r.candidates) == 1:
        return f"{did}; one candidate, {label}, so nothing was scored."
    if len(trace.models) == 1 or c.fused is None:
        return f"{did}; {len(r.candidates)} candidates, {label} chosen."
    unit = UNIT_WORDS.get(settings.get("normalize") or "token", "per token")
    weights = r.weights or {}
    mean = ("the learned gate's weighted average" if r.features else "their weighted average"
            if len(set(weights.values())) > 1 else "their average")
    rivals = sorted((x for i, x in enumerate(r.candidates) if i != r.chosen and x.fused is not None),
                    key=lambda x: x.fused)
    runner = f"; runner-up “{candidate_label(rivals[0].text, rivals[0].eos)}” {rivals[0].fused:.2f}" \
        if rivals else ""
    return (f"{did}; of {len(r.candidates)} candidates, {mean} NLL {unit} (lower is likelier) chose {label} "
            f"({c.fused:.2f}{runner}).")


def _names(models: list[str], of: int) -> str:
    """"Both models", "All 3 models", or the names."""
    if len(models) == of > 1:
        return "Both models" if of == 2 else f"All {of} models"
    return " and ".join(models)
