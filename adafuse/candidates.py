"""Proposal strategies: a confident model's greedy span, diverse exploration, and the beam ablation."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .session import ModelSession
from .words import word_end

CONTINUE, BOUNDARY, STRADDLE, END = "continue", "boundary", "straddle", "end"


@dataclass
class Proposal:
    """A span one model proposes, with the tokens and log-probs it generated it with."""
    text: str
    eos: bool
    tokens: list[int]        # generated tokens (the end token last when eos)
    logprobs: list[float]    # log p of each generated token (for the end token: all end tokens together)
    words: int
    clean: bool = True       # False when a token straddled the word boundary (text was cut inside it)


def margin(logprobs: torch.Tensor) -> float:
    """Δ = p(top1) − p(top2) of a (V,) log-prob vector."""
    top = torch.topk(logprobs, 2).values.exp()
    return float(top[0] - top[1])


def end_logprob(s: ModelSession, logprobs: torch.Tensor) -> float:
    """log p(the answer ends here): all of the model's end tokens together."""
    ids = s.end_index
    return float(torch.logsumexp(logprobs[ids], dim=0)) if ids.numel() else float("-inf")


def classify(s: ModelSession, context: list[int], word: list[int], token: int) -> tuple[str, str]:
    """What `token` does to the word `word` (tokens after `context`): continue it, end it before itself
    (BOUNDARY: the token begins the next word), cut inside itself (STRADDLE), or end the answer (END).
    Returns (status, text of the word including what `token` adds, cut at the boundary)."""
    if token in s.lm.end_ids:
        return END, s.decode_after(context, word)
    before = s.decode_after(context, word) if word else ""
    full = s.decode_after(context, word + [token])
    cut = word_end(full)
    if cut is None:
        return CONTINUE, full
    if cut == len(before) and full.startswith(before):
        return BOUNDARY, before
    return STRADDLE, full[:cut]


def greedy_span(s: ModelSession, max_words: int, tau: float | None, max_word_tokens: int) -> tuple[Proposal, list[float]]:
    """Greedy words while the margin at each word start stays >= tau (tau None: always), at most max_words.
    Tokens are fed on the live cache so a winning span costs nothing more to commit."""
    s.rewind()
    lp = s.next_logprobs
    margins = [margin(lp)]
    tokens: list[int] = []
    logps: list[float] = []
    word: list[int] = []
    text, words = "", 0
    while True:
        t = int(lp.argmax())
        status, piece = classify(s, s.ids + tokens[: len(tokens) - len(word)], word, t)
        if status == END:
            return Proposal(text + piece, True, tokens + [t], logps + [end_logprob(s, lp)], words + bool(word)), margins
        if status == STRADDLE:
            return Proposal(text + piece, False, tokens + [t], logps + [float(lp[t])], words + 1, clean=False), margins
        if status == BOUNDARY:
            text, words, word = text + piece, words + 1, []
            if words >= max_words:
                break
            margins.append(margin(lp))
            if tau is not None and margins[-1] < tau:
                break
        tokens.append(t)
        logps.append(float(lp[t]))
        word.append(t)
        lp = s.extend(t)
        if len(word) >= max_word_tokens:  # forced word end: text without spaces still moves
            text += s.decode_after(s.ids + tokens[: len(tokens) - len(word)], word)
            words, word = words + 1, []
            if words >= max_words:
                break
            margins.append(margin(lp))
            if tau is not None and margins[-1] < tau:
                break
    return Proposal(text, False, tokens, logps, words), margins


def _first_tokens(s: ModelSession, lp: torch.Tensor, count: int, top_k: int, distinct: bool) -> list[int]:
    """The highest-probability first tokens; with `distinct`, the first `count` whose surface forms differ
    (decoded text stripped of whitespace; empty and non-end special tokens skipped)."""
    chosen, seen = [], set()
    special = set(getattr(s.lm.tokenizer, "all_special_ids", []))
    for t in torch.topk(lp, min(top_k, lp.numel())).indices.tolist():
        if t in s.lm.end_ids:
            key = "<end>"
        else:
            if t in special:
                continue
            txt = s.decode_after(s.ids, [t])
            if txt == "":
                continue
            key = txt.strip() or txt
        if distinct and key in seen:
            continue
        seen.add(key)
        chosen.append(t)
        if len(chosen) == count:
            break
    return chosen or [int(lp.argmax())]


def explore(s: ModelSession, branches: int, top_k: int, max_word_tokens: int) -> list[Proposal]:
    """B distinct first tokens, each extended greedily into one complete word, all branches batched."""
    s.rewind()
    lp = s.next_logprobs
    done: list[Proposal] = []
    rows: list[tuple[list[int], list[float]]] = []
    for t in _first_tokens(s, lp, branches, top_k, distinct=True):
        status, piece = classify(s, s.ids, [], t)
        if status == END:
            done.append(Proposal("", True, [t], [end_logprob(s, lp)], 0))
        elif status == STRADDLE:
            done.append(Proposal(piece, False, [t], [float(lp[t])], 1, clean=False))
        else:
            rows.append(([t], [float(lp[t])]))
    cache = s.expanded_cache(len(s.ids), len(rows)) if rows else None
    while rows:
        if len(rows[0][0]) >= max_word_tokens:
            done.extend(Proposal(s.decode_after(s.ids, toks), False, toks, lps, 1) for toks, lps in rows)
            break
        logp = s.run(cache, [[toks[-1]] for toks, _ in rows])[:, -1]  # (N, V)
        keep = []
        for i, (toks, lps) in enumerate(rows):
            t = int(logp[i].argmax())
            status, piece = classify(s, s.ids, toks, t)
            if status == CONTINUE:
                rows[i] = (toks + [t], lps + [float(logp[i, t])])
                keep.append(i)
            elif status == BOUNDARY:
                done.append(Proposal(piece, False, toks, lps, 1))
                s.remember(toks, cache, i, len(s.ids), logp[i])
            elif status == END:
                done.append(Proposal(piece, True, toks + [t], lps + [end_logprob(s, logp[i])], 1))
            else:
                done.append(Proposal(piece, False, toks + [t], lps + [float(logp[i, t])], 1, clean=False))
        if len(keep) < len(rows):
            rows = [rows[i] for i in keep]
            if rows:
                cache.batch_select_indices(torch.tensor(keep, device=s.lm.device))
    return done


def beam(s: ModelSession, width: int, max_word_tokens: int) -> list[Proposal]:
    """The paper's ablation without diversity: beam search of width B over one word."""
    s.rewind()
    lp = s.next_logprobs
    finished: list[tuple[float, Proposal]] = []
    active: list[tuple[float, list[int], list[float]]] = []

    def expand(score, toks, lps, logp_row, out):
        for t in torch.topk(logp_row, width).indices.tolist():
            status, piece = classify(s, s.ids, toks, t)
            lt = float(logp_row[t])
            if status == CONTINUE:
                out.append((score + lt, toks + [t], lps + [lt]))
            elif status == BOUNDARY:
                finished.append((score, Proposal(piece, False, toks, lps, 1)))
            elif status == END:
                e = end_logprob(s, logp_row)
                finished.append((score + e, Proposal(piece, True, toks + [t], lps + [e], int(bool(toks)))))
            else:
                finished.append((score + lt, Proposal(piece, False, toks + [t], lps + [lt], 1, clean=False)))

    expand(0.0, [], [], lp, active)
    active = sorted(active, key=lambda a: -a[0])[:width]
    cache = s.expanded_cache(len(s.ids), len(active)) if active else None
    while active and len(finished) < width:
        if len(active[0][1]) >= max_word_tokens:
            finished.extend((sc, Proposal(s.decode_after(s.ids, toks), False, toks, lps, 1)) for sc, toks, lps in active)
            break
        logp = s.run(cache, [[toks[-1]] for _, toks, _ in active])[:, -1]  # (N, V)
        grown: list[tuple[float, list[int], list[float], int]] = []
        for i, (sc, toks, lps) in enumerate(active):
            out: list = []
            expand(sc, toks, lps, logp[i], out)
            grown.extend((a, b, c, i) for a, b, c in out)
        grown.sort(key=lambda g: -g[0])
        grown = grown[:width]
        if grown:
            cache.batch_select_indices(torch.tensor([g[3] for g in grown], device=s.lm.device))
        active = [(a, b, c) for a, b, c, _ in grown]
    unique: dict[tuple[str, bool], tuple[float, Proposal]] = {}
    for sc, p in sorted(finished, key=lambda f: -f[0]):
        unique.setdefault((p.text, p.eos), (sc, p))
    return [p for _, p in list(unique.values())[:width]]
