"""Which first tokens an uncertain model explores: distinct in spelling ("surface") or in meaning ("embedding").

Both strategies walk the model's top-k next tokens from the most probable down and treat tokens alike: an end token
(end of answer, end of turn, a token that starts a stop string) is the one answer "<end>"; special tokens are never
proposed; a token that decodes to no text is skipped; a token that is only part of a character is keyed by its own
bytes. Two tokens whose texts are equal once whitespace is stripped (" Paris", "Paris") are the same surface form:
only the more probable one can be picked. The most probable token is always picked first.

surface: the first B distinct surface forms by probability (the paper's diversity-aware exploration).

embedding (ME-Decoding-style subset selection): the B tokens are chosen one at a time. Each next pick is the token with
the highest  log p(token) − λ · (its largest similarity to a token already picked), where the similarity of two tokens
is a kernel over the model's own input embeddings: exp(−d / h), d the squared distance between the two unit-length
embedding rows (0 for the same direction, 4 for opposite ones) and h the median of those distances among the top-k
tokens (the bandwidth adapts to how spread out this position's candidates are). A near-synonym of a picked token has
similarity close to 1 and pays up to λ nats; a token unlike every pick pays little. λ = 0 is the surface strategy
exactly; a larger λ trades more probability for more different meanings. Since the penalty is at most λ, a token more
than λ nats below the B-th distinct surface form can never be picked: only the tokens above that bound are decoded
and compared (the early stop that keeps the greedy near-linear in the number of candidates). The selection runs once
per uncertain word start on the log-probs and embedding rows already on the model's device (one gather, one k × k
product).

Each explore step records what the selection looked at (`ModelStep.selection`): every token it considered with its
probability, penalty, score, whether it was picked (and in which order) or why not; `selection_rows` formats it.
The seconds the selection takes are counted on the view (`selection_seconds`, `selections_made`) for the benchmark.
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Sequence

import torch

from .errors import ConfigError
from .report import show

if TYPE_CHECKING:
    from .trace import Trace
    from .view import ModelView

END_KEY = "<end>"
NO_WEIGHTS = ("exploration='embedding' needs the model's weights (its input embeddings), and {name} has none here "
              "(a served model keeps them on its server): a served model explores by surface form — use "
              "exploration='surface'")


def token_key(s: "ModelView", t: int):
    """(key, text, skip): the surface form a first token counts as, its text, and why it is never picked (or "")."""
    if t in s.end_ids:
        return END_KEY, s.decode_after(s.ids, [t]), ""
    if t in s.banned_ids:
        return None, "", "special"
    txt = s.decode_after(s.ids, [t])
    if txt == "":
        return None, "", "empty"
    return (("bytes", t) if "\ufffd" in txt else (txt.strip() or txt)), txt, ""


def select_first_tokens(s: "ModelView", lp: torch.Tensor, count: int, top_k: int, strategy: str = "surface",
                        lam: float = 1.0) -> tuple[list[int], dict]:
    """The `count` first tokens an uncertain model explores, and the record of the choice (`ModelStep.selection`).
    See the module docstring for both strategies."""
    t0 = time.perf_counter()
    embedding = strategy == "embedding" and lam > 0
    top = torch.topk(lp, min(top_k, lp.numel()))
    ids, vals = top.indices.tolist(), top.values.tolist()
    finite = next((i for i, v in enumerate(vals) if v == float("-inf")), len(vals))  # a server's top-k ends early
    ids, vals = ids[:finite], vals[:finite]
    rows: list[dict] = []
    reps: list[int] = []          # rows of the distinct surface forms that may be picked, most probable first
    first: dict = {}              # surface key -> its row
    for rank, (t, v) in enumerate(zip(ids, vals)):
        if len(reps) >= count and (not embedding or v < rows[reps[count - 1]]["logp"] - lam):
            break  # surface: B found; embedding: too improbable to beat the B-th surface form whatever the penalty
        key, txt, skip = token_key(s, t)
        row = {"token": t, "rank": rank, "text": txt, "end": key == END_KEY, "p": math.exp(v), "logp": v,
               "penalty": 0.0, "score": v, "picked": False, "order": None, "skip": skip, "like": None,
               "similarity": None}
        if key is not None:
            if key in first:
                row["skip"], row["like"] = "surface", first[key]
            else:
                first[key] = len(rows)
                reps.append(len(rows))
        rows.append(row)
    bandwidth = None
    if not reps:
        picks = []
    elif not embedding or len(reps) == 1:
        picks = reps[:count]
    else:
        sim, bandwidth = _similarities(s, ids, [rows[r]["rank"] for r in reps])
        picks = _greedy(rows, reps, sim, count, lam)
    for order, r in enumerate(picks, 1):
        rows[r]["picked"], rows[r]["order"] = True, order
    if embedding and len(reps) > 1:
        at = {r: i for i, r in enumerate(reps)}
        lowest = min(rows[q]["logp"] for q in picks)
        for j, r in enumerate(reps):  # the unpicked: their score against every pick
            if not rows[r]["picked"]:
                best = max(picks, key=lambda q: sim[j][at[q]])
                _charge(rows[r], best, sim[j][at[best]], lam)
                # more probable than a pick: its penalty kept it out; else it was simply less probable
                rows[r]["skip"] = "redundant" if rows[r]["logp"] > lowest else "outscored"
    for r in rows:  # the record, once the picks are made: 6 decimals (6 significant digits for p) keep traces small
        r["p"] = float(f"{r['p']:.6g}")
        for f in ("logp", "penalty", "score", "similarity"):
            if r[f] is not None:
                r[f] = round(r[f], 6)
    if bandwidth is not None:
        bandwidth = round(bandwidth, 6)
    # the selection's own cost, kept on the view (the benchmark reads it; the trace stays deterministic)
    s.selection_seconds += time.perf_counter() - t0
    s.selections_made += 1
    return [rows[r]["token"] for r in picks], {"strategy": strategy, "lambda": float(lam), "bandwidth": bandwidth,
                                                "tokens": rows}


def _similarities(s: "ModelView", ids: list[int], ranks: list[int]) -> tuple[list[list[float]], float]:
    """Kernel similarities exp(−d/h) among the candidate ranks, h the median squared distance over all `ids`."""
    emb = s.token_embeddings(ids)
    if emb is None:
        raise ConfigError(NO_WEIGHTS.format(name=s.name))
    e = torch.nn.functional.normalize(emb.float(), dim=-1)  # (k, D) unit rows, on the model's device
    d = (2.0 - 2.0 * (e @ e.T)).clamp_min(0.0)               # squared distances in [0, 4]
    k = len(ids)
    iu = torch.triu_indices(k, k, 1, device=d.device)
    h = float(d[iu[0], iu[1]].median()) if k > 1 else 0.0
    if not h > 1e-6:  # every candidate in one direction: any bandwidth gives similarity 1
        h = 1.0
    pick = torch.tensor(ranks, device=d.device)
    return torch.exp(-d[pick][:, pick] / h).tolist(), h


def _greedy(rows: list[dict], reps: list[int], sim: list[list[float]], count: int, lam: float) -> list[int]:
    """The most probable first, then repeatedly the highest log p − λ·max similarity to the picks (ties: the more
    probable). O(count × candidates)."""
    near = [0.0] * len(reps)    # each candidate's largest similarity to a pick so far
    nearest = [0] * len(reps)
    taken = [False] * len(reps)
    picks = []
    for _ in range(min(count, len(reps))):
        j = 0 if not picks else max((i for i in range(len(reps)) if not taken[i]),
                                    key=lambda i: (rows[reps[i]]["logp"] - lam * near[i], -i))
        if picks:
            _charge(rows[reps[j]], reps[nearest[j]], near[j], lam)
        taken[j] = True
        picks.append(reps[j])
        for i in range(len(reps)):
            if sim[i][j] > near[i]:
                near[i], nearest[i] = sim[i][j], j
    return picks


def _charge(row: dict, like: int, similarity: float, lam: float) -> None:
    row["like"], row["similarity"] = like, similarity
    row["penalty"] = lam * similarity
    row["score"] = row["logp"] - row["penalty"]


def check_exploration(models: Sequence) -> None:
    """Raise ConfigError before any model prefills when exploration by embedding meets a model without its weights
    here (a served model); the methods that explore by embedding call it with their settings' checks."""
    for lm in models:
        if getattr(getattr(lm, "model", None), "get_input_embeddings", None) is None:
            raise ConfigError(NO_WEIGHTS.format(name=getattr(lm, "name", "a model")))


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _label(row: dict) -> str:
    return "⏎ end" if row.get("end") else repr(show(row.get("text", ""), 24))


def selection_rows(trace: "Trace", round_index: int) -> list[dict]:
    """One row per first token an exploring model considered in round `round_index`: model, rank in its top-k, token,
    probability, redundancy penalty, score (log p − penalty), picked and in which order, and why it was picked or
    skipped, in plain words. Empty when no model explored by first tokens in that round (commit, beam)."""
    n = len(trace.rounds)
    if isinstance(round_index, bool) or not isinstance(round_index, int) or not 0 <= round_index < n:
        raise ConfigError(f"round_index={round_index!r} is not a round of this trace: pick 0..{n - 1}")
    out = []
    for step in trace.rounds[round_index].steps:
        sel = step.selection or {}
        toks = sel.get("tokens") or []
        embedding = sel.get("strategy") == "embedding" and (sel.get("lambda") or 0) > 0
        for row in toks:
            like = toks[row["like"]] if isinstance(row.get("like"), int) and 0 <= row["like"] < len(toks) else None
            sim = row.get("similarity")
            if row.get("picked"):
                order = row.get("order") or 0
                if order == 1:
                    why = "picked 1st: the most probable token"
                elif embedding:
                    why = (f"picked {_ordinal(order)}: best log p − penalty of the rest"
                           + (f" (closest pick {_label(like)}, similarity {sim:.2f})" if like and sim is not None
                              else ""))
                else:
                    why = f"picked {_ordinal(order)}: the next most probable new surface form"
            elif row.get("skip") == "surface":
                why = f"skipped: same surface form as {_label(like)}" if like else "skipped: same surface form"
            elif row.get("skip") == "special":
                why = "skipped: a special token (never proposed)"
            elif row.get("skip") == "empty":
                why = "skipped: it adds no text"
            elif row.get("skip") == "redundant":
                why = (f"skipped: too close to {_label(like)} (similarity {sim:.2f}, penalty {row['penalty']:.2f}); "
                       f"its score {row['score']:.2f} lost to the picks" if like and sim is not None
                       else "skipped: its score lost to the picks")
            elif row.get("skip") == "outscored":
                why = (f"skipped: less probable than the picks; its score {row['score']:.2f} (penalty "
                       f"{row['penalty']:.2f}) lost to theirs")
            else:
                why = "not needed: B tokens were picked before it"
            out.append({"model": step.model, "strategy": sel.get("strategy", ""), "rank": row.get("rank", 0) + 1,
                        "token": _label(row), "p": round(row.get("p", 0.0), 4),
                        "penalty": round(row.get("penalty", 0.0), 3), "score": round(row.get("score", 0.0), 3),
                        "picked": bool(row.get("picked")), "order": row.get("order"), "why": why})
    return out
