"""Where and why a fused decode leaves one member's own decode: the round, the scores, the weight that keeps it."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .errors import TraceError
from .report import candidate_label
from .trace import Candidate, Trace, Unscored, candidate_nll, fused_score, lowest
from .words import split_words

Key = tuple[str, str]  # (task, method label) of an evaluation row
SOLO = "greedy:"       # an evaluation's single-model runs are labelled "greedy:<model>" (adafuse.harness.evaluate)
# why a round's chosen candidate is not the member's first proposal (`round_departures`' "left")
LEFT = ("longer", "own other", "other", "ended")


# ---- the edges: one decode is a `Trace`; evaluation rows stay the plain dicts they are stored as ----
def as_trace(x) -> Trace:
    """A `Trace` from a `Trace`, its dict (checked: a bad one is a TraceError), or an evaluation row holding one."""
    if isinstance(x, Trace):
        return x
    if isinstance(x, dict) and "rounds" in x and "models" in x:
        return Trace.from_dict(x)
    if isinstance(x, dict) and "trace" in x:
        return as_trace(x["trace"])
    raise TraceError(f"expected a trace (a Trace, its dict, or an evaluation row holding one), got "
                     f"{type(x).__name__}; pass the trace of a decode or a row of load_results")


def trace_dict(x) -> dict:
    """A trace as the plain dict evaluation rows store: from a `Trace`, a trace dict, or an evaluation row."""
    if isinstance(x, Trace):
        return x.to_dict()
    if isinstance(x, dict) and "rounds" in x and "models" in x:
        return x
    if isinstance(x, dict) and "trace" in x:
        return trace_dict(x["trace"])
    return as_trace(x).to_dict()  # raises the TraceError that says what to pass


def weights_in_force(trace: Trace, index: int) -> tuple[dict[str, float], str]:
    """(weight per model, where from: "gate", "settings" or "equal") of round `index`'s fused scores."""
    w = trace.round_weights(index)
    if not w:
        return dict.fromkeys(trace.models, 1.0), "equal"
    return w, "gate" if trace.rounds[index].features else "settings"


@dataclass
class Divergence:
    """The first round of a fused decode whose committed text leaves `model`'s own decode of the same prompt. Plain
    values (`to_dict`); NLLs are as they enter the fused score (per token, or per word: `normalize`)."""
    model: str                 # the member whose own decode the fused text left
    round: int                 # index of that round of the fused trace
    position: int              # characters of the answer before the round (the texts agree up to here)
    words: int                 # words of the answer before the round
    solo: str                  # the member's own decode from `position` on ("": it ended there)
    chosen: int                # the candidate the round appended
    chosen_text: str
    chosen_eos: bool
    first: int | None          # the member's first proposal this round (None: it proposed nothing, or is no member)
    member: int | None         # the member's candidate (None: not in the pool)
    member_text: str           # its text; not in the pool: the next word of `solo` ("" with member_eos: the end)
    member_eos: bool
    source: str                # how `member` was found: "solo path", "first proposal" or "not in the pool"
    nll: dict[str, dict[str, float | None]]  # per model of the fused trace: {"chosen": .., "member": ..}
    fused_chosen: float | None
    fused_member: float | None
    margins: dict[str, float | None]  # Δ per model at the round's first word start
    tau: float | None
    weights: dict[str, float]  # per model, its weight in the round's fused scores
    weights_from: str          # "gate", "settings" or "equal"
    normalize: str             # "token" or "word"
    overridden: bool           # the chosen candidate was picked by hand over the scores' winner
    keep_weight: float | None  # the member's weight at the edge of the range that keeps its word (nearest its own)
    keep_range: tuple[float, float | None] | None  # member weights (lo, hi; None: unbounded) at which its word wins
    keep_share: float | None   # keep_weight as a share of the round's total weight
    keep_factor: float | None  # keep_weight ÷ the member's weight in force (None when that is 0)
    keep_reason: str           # why no weight keeps it ("" when one does)

    def to_dict(self) -> dict:
        return asdict(self)

    def sentence(self) -> str:
        """The divergence in one plain sentence: what was chosen over the member's word, each model's NLL of both, and
        the member's weight that would have kept its word (or why none would)."""
        c, w = _quote(self.chosen_text, self.chosen_eos), _quote(self.member_text, self.member_eos)
        out = f"Round {self.round}: the ensemble chose {c}{_fused(self.fused_chosen)}"
        if self.member is None:
            return out + f"; {self.model}'s own next word {w} was not in the pool."
        if self.member == self.chosen:
            ahead = split_words(self.solo)
            return (out + f", {self.model}'s first proposal too, where alone it went on with "
                    f"{_quote(ahead[0] if ahead else '', not ahead)}.")
        whose = "" if self.source == "solo path" else "first proposal "
        out += f" over {self.model}'s {whose}{w}{_fused(self.fused_member)}"
        scored = [f"{m} {_num(v['chosen'])} vs {_num(v['member'])}" for m, v in self.nll.items()
                  if v["chosen"] is not None or v["member"] is not None]
        if scored:
            out += f" (NLL per {self.normalize}, chosen vs its: " + ", ".join(scored) + ")"
        if self.keep_weight is None:
            return out + f"; no weight of {self.model} would have kept it: {self.keep_reason}."
        side = "above" if self.keep_weight == self.keep_range[0] else "below"
        now = "now 0" if self.keep_factor is None else \
            f"instead of {self.weights.get(self.model, 1.0):g}, ×{self.keep_factor:.2g}"
        share = f"; a {100 * self.keep_share:.0f} % share" if self.keep_share is not None else ""
        return out + f"; {self.model}'s weight {side} {self.keep_weight:.3g} ({now}{share}) would have kept its word."


def _quote(text: str, eos: bool) -> str:
    return f"“{candidate_label(text, eos)}”"


def _fused(v: float | None) -> str:
    return f" (fused {v:.2f})" if v is not None else ""


def _num(v: float | None) -> str:
    return f"{v:.2f}" if v is not None else "–"


# ---- one decode against the member's own ----
def divergence(fused, single, model: str) -> Divergence | None:
    """Where the text of `fused` (a decode with `model` among its members) leaves `single` (`model`'s own decode of
    the same prompt: an evaluation row "greedy:<model>", or the app's "each model alone"): the round that wrote the
    first character where the two answers differ, or, where a round's last word is complete and the member's same word
    goes on (" a" against " an"), that round; the last round when the fused answer ends first. None when the two
    answers are the same text. Each argument: a `Trace`, its dict, or an evaluation row."""
    t, solo = as_trace(fused), as_trace(single).output
    out = t.output
    if out == solo or not t.rounds:
        return None
    p = next((i for i, (a, b) in enumerate(zip(out, solo)) if a != b), min(len(out), len(solo)))
    starts, pos = [], 0
    for r in t.rounds:
        starts.append(pos)
        pos += len(r.text)
    k = len(t.rounds) - 1 if p == len(out) else max(i for i, r in enumerate(t.rounds) if r.text and starts[i] <= p)
    if 0 < p < len(solo) and not solo[p].isspace() and not out[p - 1].isspace() and not out[p:p + 1].strip():
        k = max(i for i, r in enumerate(t.rounds) if r.text and starts[i] < p)  # ended a word the member's goes on
    return _explain(t, k, model, solo[starts[k]:], starts[k], sum(r.words for r in t.rounds[:k]))


def _explain(t: Trace, k: int, model: str, rest: str, position: int, words: int) -> Divergence:
    """Round k, where the fused answer leaves the member's own continuation `rest`."""
    r = t.rounds[k]
    cands, chosen = r.candidates, r.chosen
    mine = next((st.proposals for st in r.steps if st.model == model), [])
    # the member's candidate: one on its own path (its whole word first, then its own, then the longest), else its
    # first proposal
    on_path = [i for i, c in enumerate(cands) if i != chosen
               and (c.text == rest if c.eos else c.text != "" and rest.startswith(c.text))]
    whole = {i for i in on_path if rest[len(cands[i].text):][:1].strip() == ""}  # the member's word ends there too
    member = max(on_path, key=lambda i: (i in whole, i in mine, len(cands[i].text)), default=None)
    source = "solo path" if member is not None else "first proposal" if mine else "not in the pool"
    if member is None and mine:
        member = mine[0]
    ahead = split_words(rest)
    text, eos = (cands[member].text, cands[member].eos) if member is not None else (ahead[0] if ahead else "",
                                                                                  not ahead)
    settings = t.settings_at(k)
    weights, origin = weights_in_force(t, k)
    normalize = settings.get("normalize") or "token"
    nll = {m: {"chosen": candidate_nll(cands[chosen], m, normalize),
               "member": candidate_nll(cands[member], m, normalize) if member is not None else None}
           for m in t.models}
    keep, span, reason = keep_weight(cands, chosen, member, model, weights, normalize)
    w0 = weights.get(model, 1.0)  # a model missing from the weights counts 1 (fused_score)
    total = sum(v for m, v in weights.items() if m != model)
    return Divergence(
        model=model, round=k, position=position, words=words, solo=rest, chosen=chosen,
        chosen_text=cands[chosen].text, chosen_eos=cands[chosen].eos, first=mine[0] if mine else None, member=member,
        member_text=text, member_eos=eos, source=source, nll=nll, fused_chosen=cands[chosen].fused,
        fused_member=cands[member].fused if member is not None else None,
        margins={st.model: (st.margins[0] if st.margins else None) for st in r.steps},
        tau=settings.get("tau"), weights=weights, weights_from=origin, normalize=normalize,
        overridden=r.overridden, keep_weight=keep, keep_range=span,
        keep_share=keep / (keep + total) if keep is not None and keep + total > 0 else None,
        keep_factor=keep / w0 if keep is not None and w0 > 0 else None, keep_reason=reason)


# ---- the weight that keeps the member's word ----
def wins(cands: list[Candidate], index: int, weights: dict[str, float], normalize: str = "token") -> bool:
    """Whether candidate `index` is the round's winner under `weights`: the lowest fused score (`fused_score`),
    unscored ones last, a tie to the earlier candidate, as the decoder picks."""
    return lowest([fused_score(c, weights, normalize) for c in cands]) == index


def _fraction(c: Candidate, model: str, weights: dict[str, float], normalize: str):
    """c's fused score as (n0 + n1·x) / (d0 + d1·x) in `model`'s weight x > 0: (n0, n1, d0, d1); None when no such
    x gives it a score (a counted model gives it probability 0, or no model scored it)."""
    n0 = n1 = d0 = d1 = 0.0
    for m in c.nll:
        w = weights.get(m, 1.0)
        if m != model and w <= 0:
            continue  # shown, not counted (fused_score)
        v = candidate_nll(c, m, normalize)
        if v is None:
            if c.notes.get(m) == Unscored.ZERO_PROB:
                return None
        elif m == model:
            n1, d1 = v, 1.0
        else:
            n0, d0 = n0 + w * v, d0 + w
    return (n0, n1, d0, d1) if d0 + d1 > 0 else None


def _crossings(p, c) -> list[float]:
    """Weights x > 0 at which fractions p and c are equal: the roots of (n0c + n1c·x)(d0p + d1p·x) −
    (n0p + n1p·x)(d0c + d1c·x), of degree ≤ 2 (the denominators are positive: its sign says which is lower)."""
    a = np.polymul([c[1], c[0]], [p[3], p[2]])
    b = np.polymul([p[1], p[0]], [c[3], c[2]])
    poly = np.trim_zeros(np.polysub(a, b), "f")
    if len(poly) < 2:
        return []
    return [float(r.real) for r in np.roots(poly) if abs(r.imag) <= 1e-12 * max(1.0, abs(r.real)) and r.real > 0]


def keep_weight(cands: list[Candidate], chosen: int, member: int | None, model: str, weights: dict[str, float],
                normalize: str = "token") -> tuple[float | None, tuple[float, float | None] | None, str]:
    """The member's weight nearest its own (`weights[model]`; every other weight as it was) at which candidate `member`
    would have scored lowest in the pool: (that weight, the range of weights around it where the member's word wins,
    ""), or (None, None, why no weight does). Exact for `fused_score`: each rival's score crosses the member's
    candidate's at the roots of one polynomial; between crossings the winner is checked with `wins`."""
    if member is None:
        return None, None, "its word was not in the pool"
    if member == chosen:
        return None, None, "the ensemble took its own first proposal here; its own decode went on otherwise"
    if model not in cands[member].nll:
        return None, None, f"{model} did not score this round's pool"
    recorded = [fused_score(c, weights, normalize) for c in cands]
    if any((f is None) != (c.fused is None) or f is not None and not math.isclose(f, c.fused, rel_tol=1e-6,
                                                                                   abs_tol=1e-9)
           for f, c in zip(recorded, cands)):
        return None, None, "this round's fused scores are not a weighted mean of NLLs (the method fuses otherwise)"
    fracs = [_fraction(c, model, weights, normalize) for c in cands]
    if fracs[member] is None:
        return None, None, "a counted model gives its word probability 0"
    cuts = sorted({x for i, f in enumerate(fracs) if i != member and f is not None
                   for x in _crossings(fracs[member], f)})
    edges = [0.0] + cuts + [None]
    ranges: list[list] = []  # the member's word wins in these (lo, hi) ranges of its weight, adjacent ones joined
    for lo, hi in zip(edges, edges[1:]):
        x = (lo + hi) / 2 if hi is not None else (2 * lo if lo > 0 else 1.0)
        if wins(cands, member, {**weights, model: x}, normalize):
            if ranges and ranges[-1][1] == lo:
                ranges[-1][1] = hi
            else:
                ranges.append([lo, hi])
    if not ranges:
        own = [candidate_nll(c, model, normalize) for c in cands]
        better = [i for i, v in enumerate(own) if i != member and None not in (v, own[member]) and v < own[member]]
        if better:
            return None, None, ("it scores the chosen word lower itself" if chosen in better else
                                f"it scores {_quote(cands[better[0]].text, cands[better[0]].eos)} lower itself")
        return None, None, "the other models' scores decide at every weight"
    w0 = weights.get(model, 1.0)
    if any(lo < w0 and (hi is None or w0 < hi) for lo, hi in ranges):
        return None, None, "its word scored lowest already: the round was overridden by hand"

    def change(r):  # how far (as a ratio) the member's weight moves to enter range r: up to lo, or down to hi
        edge = r[0] if r[0] >= w0 else r[1]
        return abs(math.log(edge / w0)) if w0 > 0 and edge > 0 else edge
    lo, hi = min(ranges, key=change)
    return (lo if lo >= w0 else hi), (lo, hi), ""


# ---- over evaluation rows ----
def round_departures(rows: list[dict], model: str) -> list[dict]:
    """One record per round of every evaluation row whose trace has `model`: where the round is ("task", "method",
    "line", "round", "rounds" of the answer, "words" before it) and why its chosen candidate is not `model`'s first
    proposal (its greedy span, or its most likely word when it explores): "left" is "longer" (`model` proposed the
    chosen word itself and it is more of its tokens), "own other" (another of its own words), "other" (another
    model's), "ended" (the bare end of the answer), or None (kept, or it proposed nothing); "prefers" (`model`'s own
    averaged NLL is lower for the chosen candidate) and "kept by a sum" (a summed NLL of `model` would have kept its
    first proposal), None where it kept its word or an NLL is missing."""
    out = []
    for r in rows:
        t = trace_dict(r)
        if model not in t["models"]:
            continue
        words = 0
        for k, rd in enumerate(t["rounds"]):
            st = next((s for s in rd["steps"] if s["model"] == model), None)
            rec = {"task": r.get("task"), "method": r.get("method"), "line": r.get("line"), "round": k,
                   "rounds": len(t["rounds"]), "words": words, "left": None, "prefers": None, "kept by a sum": None}
            words += rd.get("words", 0)
            if st is None:
                continue
            out.append(rec)
            if not st["proposals"] or rd["chosen"] == st["proposals"][0]:
                continue
            chosen, first = rd["candidates"][rd["chosen"]], rd["candidates"][st["proposals"][0]]
            if chosen["eos"] and not chosen["text"].strip():
                rec["left"] = "ended"
            elif rd["chosen"] in st["proposals"]:
                longer = (chosen["n_tokens"].get(model) or 0) > (first["n_tokens"].get(model) or 0)
                rec["left"] = "longer" if longer else "own other"
            else:
                rec["left"] = "other"
            cn, fn = chosen["nll"].get(model), first["nll"].get(model)
            if cn is not None and fn is not None:
                rec["prefers"] = cn < fn
                rec["kept by a sum"] = cn * chosen["n_tokens"][model] > fn * first["n_tokens"][model]
    return out


def departures(rows: list[dict], model: str) -> dict[Key, dict[str, int]]:
    """How often, and why, the chosen candidate is not `model`'s first proposal, per (task, method) over the rows whose
    trace has `model` (`round_departures` summed): {"examples", "rounds", "longer", "own other", "other", "ended",
    "prefers", "kept by a sum"}."""
    out: dict[Key, dict[str, int]] = {}
    for r in rows:
        if model in trace_dict(r)["models"]:
            out.setdefault((r["task"], r["method"]), dict.fromkeys(("examples", "rounds", *LEFT, "prefers",
                                                                    "kept by a sum"), 0))["examples"] += 1
    for rec in round_departures(rows, model):
        c = out[(rec["task"], rec["method"])]
        c["rounds"] += 1
        if rec["left"]:
            c[rec["left"]] += 1
            c["prefers"] += bool(rec["prefers"])
            c["kept by a sum"] += bool(rec["kept by a sum"])
    return out


def divergences(rows: list[dict], model: str) -> dict[tuple[str, str, int], Divergence | None]:
    """Per (task, method, line) of every row with `model` among several models, its `divergence` from the same
    line's "greedy:<model>" row (rows without one are left out)."""
    solo = {(r["task"], r["line"]): r for r in rows if is_solo(r, model)}
    return {(r["task"], r["method"], r["line"]): divergence(r, solo[(r["task"], r["line"])], model) for r in rows
            if (r["task"], r["line"]) in solo and len(trace_dict(r)["models"]) > 1 and model in trace_dict(r)["models"]}


def is_solo(row: dict, model: str | None = None) -> bool:
    """An evaluation row of one model alone ("greedy:<spec>": the spec may carry a placement, `MODEL@cpu`; its
    trace names the model), and of `model` when given."""
    models = trace_dict(row)["models"]
    return row["method"].startswith(SOLO) and len(models) == 1 and (model is None or models[0] == model)
