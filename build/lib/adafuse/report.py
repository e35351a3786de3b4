"""Plain-text and row views of a trace, shared by the CLI, the benchmark and the app."""
from __future__ import annotations

from .trace import Trace


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
