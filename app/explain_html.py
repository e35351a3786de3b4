"""HTML of the explanations: the decision tree of every round's pool and each model's tokens of a candidate
(`adafuse.explain.token_view`'s rows). Pure functions, no Gradio."""
from __future__ import annotations

import html

from adafuse.report import candidate_label, show
from adafuse.trace import Candidate, Round, Trace, candidate_nll

# Class names of the tree (style them, or keep TREE_CSS): af-tree-wrap (scroll container), af-tree (rounds), af-round
# (one round's column), af-round-head, af-pool (its candidates), af-node (a candidate; a <button> unless chosen),
# af-chosen, af-winner, af-override, af-end, af-branch-point, af-label, af-meta, af-tag, af-kind, af-branches
TREE_CSS = """
.af-tree-wrap{overflow-x:auto;padding:4px 2px 8px}
.af-tree{display:flex;gap:8px;list-style:none;margin:0;padding:0;align-items:flex-start}
.af-round{flex:0 0 13.5rem;border:1px solid #d1d5db;border-radius:6px;padding:6px;background:#fff}
.af-round.af-override{border:2px double #7c3aed}
.af-round-head{font-size:.8rem;color:#374151;margin-bottom:4px}
.af-kind{font-weight:600;text-transform:uppercase;font-size:.72rem;letter-spacing:.03em}
.af-pool{list-style:none;margin:0;padding:0;display:flex;flex-direction:column;gap:4px}
.af-node{display:block;box-sizing:border-box;width:100%;text-align:left;font:inherit;font-size:.8rem;color:#111827;
 background:#f9fafb;border:1px solid #d1d5db;border-radius:5px;padding:4px 6px;cursor:pointer}
.af-node:hover{background:#eef2ff}
.af-node:focus-visible{outline:3px solid #2563eb;outline-offset:1px}
.af-node.af-chosen{background:#dcfce7;border:2px solid #15803d;cursor:default}
.af-node.af-winner{border:2px dashed #b45309}
.af-node.af-end{border-style:dotted}
.af-node.af-branch-point{box-shadow:inset 4px 0 0 #7c3aed}
.af-label{display:block;font-family:ui-monospace,monospace;white-space:pre-wrap;word-break:break-all;font-weight:600}
.af-meta{display:block;color:#4b5563;font-size:.74rem}
.af-tag{display:inline-block;font-size:.7rem;font-weight:600;margin-right:4px}
.af-branches{font-size:.85rem;margin:6px 0 0}
.af-tokens{border-collapse:collapse;font-size:.82rem;margin:4px 0 10px;min-width:32rem}
.af-tokens th,.af-tokens td{border:1px solid #e5e7eb;padding:2px 6px;text-align:left}
.af-tokens caption{text-align:left;font-weight:600;padding:2px 0}
.af-tok{font-family:ui-monospace,monospace;white-space:pre}
.af-ws{color:#6b7280}
"""


# ---- the decision tree ----
def _node(r: Round, j: int, c: Candidate, models: list[str], branches: list[str], normalize: str = "token") -> str:
    """One candidate: label, proposers, per-model NLL averaged as the fused score is (`normalize`: per token or per
    word), fused score, and text tags (never colour alone)."""
    chosen, winner = j == r.chosen, j == r.winner
    tags = []
    if chosen:
        tags.append("✓ chosen" + (" (your pick)" if r.overridden else ""))
    if winner and r.overridden:
        tags.append("★ score winner")
    if c.eos:
        tags.append("⏎ ends the answer")
    tags += [f"↪ branch {b}" for b in branches]
    if not chosen:
        tags.append("branch from here")  # a button's name is its text: say what pressing it does
    per = {m: candidate_nll(c, m, normalize) for m in models if m in c.nll}
    nll = " · ".join(f"{m} {v:.3f}" if v is not None else f"{m} —" for m, v in per.items())
    fused = "not scored" if c.fused is None else f"fused {c.fused:.3f}"
    by = ", ".join(c.proposers) or "—"
    label = f"{j}: {candidate_label(c.text, c.eos)}"
    aria = (f"{label}; round {r.index}; proposed by {by}; NLL {nll or 'not scored'}; {fused}; "
            + ("; ".join(tags) if tags else "not chosen"))
    classes = ["af-node"] + (["af-chosen"] if chosen else []) + (["af-winner"] if winner and r.overridden else []) \
        + (["af-end"] if c.eos else []) + (["af-branch-point"] if branches else [])
    body = (f'<span class="af-label">{html.escape(label)}</span>'
            f'<span class="af-meta">by {html.escape(by)}</span>'
            + (f'<span class="af-meta">NLL per {normalize} {html.escape(nll)}</span>' if nll else "")
            + f'<span class="af-meta">{html.escape(fused)}</span>'
            + "".join(f'<span class="af-tag">{html.escape(t)}</span>' for t in tags))
    attrs = f'class="{" ".join(classes)}" data-node="{r.index}:{j}"'
    if chosen:  # not a button: nothing to pick; a group so its label is read
        return f'<li><div role="group" {attrs} aria-label="{html.escape(aria)}" aria-current="step">{body}</div></li>'
    # a button is named by its visible text (which holds every detail): an aria-label would hide or contradict it
    return f'<li><button type="button" {attrs}>{body}</button></li>'


def _round_head(r: Round) -> str:
    kind = {"commit": "commit", "explore": "explore", "override": "override (your pick)"}[r.kind]
    deltas = " · ".join(f"{s.model} {s.mode} Δ {s.margins[0]:.2f}" for s in r.steps if s.margins)
    stop = f" · stopped: {r.stop}" if r.stop else ""
    return (f'<div class="af-round-head"><b>Round {r.index}</b> · <span class="af-kind">{html.escape(kind)}</span>'
            f' · {len(r.candidates)} candidate{"s" if len(r.candidates) != 1 else ""}{html.escape(stop)}'
            + (f'<br>{html.escape(deltas)}' if deltas else "") + "</div>")


def tree_html(trace: Trace | None, branches: dict[str, tuple[int, int, Trace]] | None = None,
              style: bool = True) -> str:
    """Every round's pool as a column of nodes, left to right in a horizontal scroll container. Chosen nodes are
    highlighted (and say "✓ chosen"); the others are buttons with data-node="round:candidate". Overridden rounds
    show the score winner and your pick; `branches` (label -> (round, candidate, branch trace)) mark where each
    branch leaves the main path. `style`: include TREE_CSS."""
    css = f"<style>{TREE_CSS}</style>" if style else ""
    if not trace or not trace.rounds:
        return css + '<div class="af-tree-wrap af-empty">No rounds yet: Run or Step a decode to grow the tree.</div>'
    leaving: dict[tuple[int, int], list[str]] = {}
    notes = []
    for name, (ri, ci, bt) in (branches or {}).items():
        ok = isinstance(ri, int) and 0 <= ri < len(trace.rounds) and isinstance(ci, int) \
            and 0 <= ci < len(trace.rounds[ri].candidates)
        if not ok:
            notes.append(f"<li><b>{html.escape(name)}</b>: round {html.escape(str(ri))}, candidate "
                         f"{html.escape(str(ci))} is not in this trace (a branch of another decode)</li>")
            continue
        leaving.setdefault((ri, ci), []).append(name)
        c = trace.rounds[ri].candidates[ci]
        out = (f"“{html.escape(show(bt.output, 80))}” · {len(bt.rounds)} rounds" if bt is not None
               else "not decoded yet")
        stop = f" · stopped: {bt.stop_reason}" if bt is not None and bt.stop_reason else ""
        notes.append(f"<li><b>↪ {html.escape(name)}</b>: leaves at round {ri}, candidate {ci} "
                     f"({html.escape(candidate_label(c.text, c.eos))}) → {out}{html.escape(stop)}</li>")
    normalize = trace.settings.get("normalize", "token")  # the model NLLs as the fused score averaged them
    cols = []
    for r in trace.rounds:
        nodes = "".join(_node(r, j, c, trace.models, leaving.get((r.index, j), []), normalize)
                        for j, c in enumerate(r.candidates))
        cls = "af-round af-override" if r.overridden else "af-round"
        cols.append(f'<li class="{cls}">{_round_head(r)}'
                    f'<ul class="af-pool">{nodes}</ul></li>')
    summary = (f"Decision tree: {len(trace.rounds)} rounds, {sum(len(r.candidates) for r in trace.rounds)} "
               f"candidates; ✓ marks the chosen path")
    branch_list = f'<ul class="af-branches" aria-label="Branches">{"".join(notes)}</ul>' if notes else ""
    return (f'{css}<div class="af-tree-wrap" role="region" aria-label="{html.escape(summary)}" tabindex="0">'
            f'<ol class="af-tree">{"".join(cols)}</ol></div>{branch_list}')


def visible(text: str) -> str:
    """A token's text with its whitespace shown: space ·, newline ⏎, tab ⇥ (HTML, escaped)."""
    out = []
    for ch in text:
        if ch in " \n\t":
            out.append(f'<span class="af-ws">{ {" ": "·", chr(10): "⏎", chr(9): "⇥"}[ch]}</span>')
        else:
            out.append(html.escape(ch))
    return "".join(out)


def token_view_html(rows: list[dict], style: bool = True) -> str:
    """`token_view`'s rows as HTML: per model a table of the candidate's tokens and one of the top-k tokens at the
    word start (column headers with scope, a caption naming the model)."""
    css = f"<style>{TREE_CSS}</style>" if style else ""
    if not rows:
        return css + '<div class="af-empty">Pick a round and a candidate to see how each model tokenized it.</div>'
    parts = [css]
    for row in rows:
        nll = "not scored" if row["nll"] is None else f"mean NLL {row['nll']:.4f} (sum {row['nll_sum']:.4f})"
        rec = row["recorded_nll"]
        nll += "" if rec is None else f", trace {rec:.4f}"
        head = (f"{row['model']}: round {row['round']}, candidate {row['candidate']} ({row['label']}) · "
                f"{row['n_tokens']} tokens · {nll}" + (" · a token straddles the word boundary" if row["straddle"]
                                                     else "") + (f" · {row['note']}" if row["note"] else ""))
        body = "".join(
            f'<tr><td>{i}</td><td class="af-tok">{visible(t["text"]) if t["part"] != "end" else "⏎ end"}</td>'
            f'<td>{t["id"] if t["id"] >= 0 else "any end token"}</td><td>{t["logprob"]:.4f}</td>'
            f'<td>{t["prob"]:.4f}</td><td>{html.escape(t["part"])}</td></tr>' for i, t in enumerate(row["tokens"]))
        parts.append(f'<table class="af-tokens"><caption>{html.escape(head)}</caption><thead><tr>'
                     + "".join(f'<th scope="col">{h}</th>' for h in ("#", "token", "id", "log p", "p", "part"))
                     + f"</tr></thead><tbody>{body}</tbody></table>")
        rec_m = row["recorded_margin"]
        top_head = (f"{row['model']}: top {len(row['top'])} next tokens at the word start · Δ = p1 − p2 = "
                    f"{row['margin']:.4f}" + ("" if rec_m is None else f" (trace {rec_m:.4f})"))
        top_body = "".join(
            f'<tr><td>{i + 1}</td><td class="af-tok">'
            f'{visible(t["text"]) if t["text"] else ("⏎ end" if t["end"] else "(empty)")}</td>'
            f'<td>{t["id"]}</td><td>{t["prob"]:.4f}</td>'
            f'<td>{"end token" if t["end"] else ("starts the candidate" if t["in_candidate"] else "")}</td></tr>'
            for i, t in enumerate(row["top"]))
        parts.append(f'<table class="af-tokens"><caption>{html.escape(top_head)}</caption><thead><tr>'
                     + "".join(f'<th scope="col">{h}</th>' for h in ("rank", "token", "id", "p", "note"))
                     + f"</tr></thead><tbody>{top_body}</tbody></table>")
    return "".join(parts)
