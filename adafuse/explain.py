"""Explanations of a trace as plain data: how each model tokenized and scored one candidate, with the same rules
as scoring (its HTML is the app's, app/explain_html.py)."""
from __future__ import annotations

import math
from typing import Sequence

import torch

from .config import LEGACY, DecodeConfig
from .decoder import unique_names
from .errors import ConfigError
from .models import LoadedModel, get_model
from .method_registry import from_spec, legacy
from .report import candidate_label
from .scoring import END_MARK, feed_from, place, read_ids, score_candidates, token_logprob
from .trace import Candidate, Round, Trace, Unscored
from .writer import margin


# ---- how each model tokenized and scored a candidate ----
def token_view(models: Sequence[LoadedModel | str], trace: Trace, round_index: int, candidate: int,
               top_k: int = 5) -> list[dict]:
    """Per model of the trace: candidate `candidate` of round `round_index` tokenized in context exactly as scoring
    did (the committed text replayed round by round through the decoder's own view), each token's text, log-prob and
    part ("context": re-tokenized committed text, "straddle": crosses the word boundary, "candidate", "end": the end
    of the answer), the NLL (sum and mean, with the trace's recorded one), and the top-k next tokens at the word
    start with the margin Δ = p1 − p2. Plain data (str/float/int/bool/list/dict/None)."""
    n = len(trace.rounds)
    if isinstance(round_index, bool) or not isinstance(round_index, int) or not 0 <= round_index < n:
        raise ConfigError(f"round_index={round_index!r} is not a round of this trace: pick 0..{max(n - 1, 0)}")
    r = trace.rounds[round_index]
    if isinstance(candidate, bool) or not isinstance(candidate, int) or not 0 <= candidate < len(r.candidates):
        raise ConfigError(f"candidate={candidate!r} is not a candidate of round {round_index}: "
                          f"pick 0..{len(r.candidates) - 1}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= 100:
        raise ConfigError(f"top_k={top_k!r} is invalid: use a whole number from 1 to 100")
    loaded = [get_model(m) if isinstance(m, str) else m for m in models]
    by_name = dict(zip(unique_names(loaded), loaded))
    missing = [m for m in trace.models if m not in by_name]
    if missing:
        raise ConfigError(f"the trace was decoded by {', '.join(missing)}, which is not among the models given "
                          f"({', '.join(by_name) or 'none'}): load it to see its tokens")
    config = DecodeConfig.from_dict(trace.settings)
    c = r.candidates[candidate]
    return [_model_tokens(by_name[m], m, trace, config, r, candidate, c, top_k) for m in trace.models]


def _model_tokens(lm: LoadedModel, name: str, trace: Trace, config: DecodeConfig, r: Round, ci: int, c: Candidate,
                  top_k: int) -> dict:
    view = lm.open_view(trace.prompt, *config.view_args())
    y = ""
    for prev in trace.rounds[: r.index]:  # commit as the decoder did, so the anchored tokenization is the same
        y += prev.candidates[prev.chosen].text
        view.commit(y)
    n_ids = len(view.ids)
    pl = place(view, c.text, c.eos)  # T_m(c) exactly as scoring places it
    seq, aligned, forwarded = pl.seq, pl.aligned, pl.forwarded(n_ids)
    ctx = feed_from(n_ids, [forwarded])
    # distributions as score_candidates reads them: after y's own tokens the view's next-token log-probs, else a
    # forward of the candidate's tokens after ids[:ctx]
    wanted = [{p - ctx - 1: read_ids(view, seq[p]) for p in forwarded}]
    row = pl.real[ctx:]
    out = view.score_rows(ctx, [row], [False], wanted)[0] if row and wanted[0] else None
    # right after y's tokens: the view's next-token log-probs, exact for the tokens read there (a served model's top-k)
    first_here = aligned and pl.start <= n_ids < len(seq)
    first = view.next_exact(read_ids(view, seq[n_ids])) if first_here else view.next_logprobs
    tokens, values = [], []
    for p in range(pl.start, len(seq)):
        dist = first if p == n_ids and aligned else out[p - ctx - 1]
        tok = seq[p]
        lp = float(token_logprob(view, dist, tok))
        values.append(lp)
        text = "" if tok == END_MARK else view.decode_after(seq[:p], [tok])
        tokens.append({"id": -1 if tok == END_MARK else int(tok), "text": text, "logprob": lp,
                       "prob": math.exp(lp) if math.isfinite(lp) else 0.0,
                       "part": "end" if tok == END_MARK else "candidate"})
    _mark_parts(tokens, c.text, aligned)
    note = ""
    if c.eos and config.stop and values:  # a stop string spelled over several tokens joins the end term (scoring.py)
        sc = score_candidates(view, [(c.text, True)], stops=tuple(config.stop))[0]
        if sc.end_term is not None and sc.n_tokens <= len(values) and \
                abs(sum(values[sc.n_tokens - 1:]) - sc.end_term) > 1e-9:
            joined = tokens[sc.n_tokens - 1:]
            tokens = tokens[: sc.n_tokens - 1] + [{
                "id": -1, "text": "", "logprob": sc.end_term, "prob": math.exp(sc.end_term), "part": "end",
                "joined": [t["text"] for t in joined if t["part"] != "end"]}]
            values = values[: sc.n_tokens - 1] + [sc.end_term]
            note = ("the end term also counts a stop string spelled over several tokens after "
                    + (f"{''.join(tokens[-1]['joined'])!r}" if tokens[-1]["joined"] else "the text"))
    finite = values and all(math.isfinite(v) for v in values)
    step = next((s for s in r.steps if s.model == name), None)
    lp0 = view.next_logprobs
    top = torch.topk(lp0, min(top_k, lp0.numel()))
    top_rows = [{"id": int(t), "text": view.decode_after(view.ids, [t]), "prob": math.exp(v), "end": t in view.end_ids,
                 "in_candidate": bool(tokens) and aligned and tokens[0]["id"] == t}
                for t, v in zip(top.indices.tolist(), top.values.tolist())]
    return {
        "model": name, "round": r.index, "candidate": ci, "label": candidate_label(c.text, c.eos),
        "context_chars": len(y), "tokens": tokens, "straddle": not aligned,
        "end_term": values[-1] if c.eos and values and math.isfinite(values[-1]) else None,
        "n_tokens": len(values), "nll_sum": -sum(values) if finite else None,
        "nll": -sum(values) / len(values) if finite else None,
        "recorded_nll": c.nll.get(name), "recorded_n_tokens": c.n_tokens.get(name),
        "note": note if finite else (Unscored.NO_TOKENS if not values else Unscored.ZERO_PROB),
        "top": top_rows, "margin": margin(lp0),
        "recorded_margin": step.margins[0] if step and step.margins else None,
    }


def _mark_parts(tokens: list[dict], text: str, aligned: bool) -> None:
    """Tokens scored from inside the committed text (a straddling tokenization): the ones wholly inside it are
    "context", the one crossing into the candidate "straddle"."""
    real = [t for t in tokens if t["part"] != "end"]
    if aligned or not real:
        return
    joined = "".join(t["text"] for t in real)
    if not joined.endswith(text):  # the tokens do not decode back exactly (a character split over tokens)
        real[0]["part"] = "straddle"
        return
    inside, pos = len(joined) - len(text), 0  # characters of y the scored tokens cover
    for t in real:
        end = pos + len(t["text"])
        if end <= inside:
            t["part"] = "context"
        elif pos < inside:
            t["part"] = "straddle"
        pos = end


# ---- why an answer is empty ----
def why_empty(trace: Trace, weights: str = "weights") -> str:
    """Why an answer came out empty, from its first round, as one sentence (the app shows it in the answer's place,
    `adafuse serve` in a response's `adafuse.why_empty`): the end of the answer won before the first word, what it
    scored against the best candidate with text, each model's probability of ending there, and (where weights enter
    the score and a model prefers some text to ending) whose weight would change it, `weights` naming where weights
    are set. "" when the answer is not empty or the trace says nothing of why."""
    r = trace.rounds[0] if trace.rounds else None
    end = r.candidates[r.chosen] if r else None
    if end is None or not end.eos or end.text.strip():
        return ""
    if r.overridden:
        return "the end of the answer was picked by hand in round 0"
    who = ", ".join(end.proposers) or "a model"
    if len(r.candidates) == 1:
        return f"{who} proposed to end the answer before its first word, and nothing else was proposed"
    if end.fused is None:
        return f"{who} proposed to end the answer before its first word; the round was not scored"
    texts = [c for c in r.candidates if c.text.strip() and c.fused is not None]  # answers, ending or not
    best = min(texts, key=lambda c: c.fused) if texts else None
    out = f"in round 0 the end of the answer scored {end.fused:.2f}"
    out += (f", no higher than every candidate with text (best \"{candidate_label(best.text, best.eos)}\" at "
            f"{best.fused:.2f})" if best is not None else ", and no candidate with text had a score")
    p_end = {m: math.exp(v) for m, v in end.end_term.items() if v is not None}  # log p(the answer ends here)
    if p_end:
        out += "; the answer ends here with p " + ", ".join(f"{v:.2g} under {m}" for m, v in p_end.items())
    keen = min(p_end, key=p_end.get) if len(p_end) > 1 else None
    prefers_text = keen is not None and any(c.nll.get(keen) is not None and end.nll.get(keen) is not None
                                            and c.nll[keen] < end.nll[keen] for c in texts)
    if r.features:
        out += ". The learned gate set this round's weights"
    elif prefers_text and from_spec(legacy(trace.settings))[0].weighted:
        out += f". Weigh {keen} more ({weights}), or the others less, to hear its answer"
    if trace.settings.get("allow_empty", LEGACY["allow_empty"]) and texts:
        out += (". The end could win before the first word (allow_empty, the paper's pool): without it, it is held "
                "back while a candidate with text is in the round")
    return out
