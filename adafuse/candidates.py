"""Proposal strategies: a confident model's greedy span, diverse exploration, beam search, a sampled word."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .selection import select_first_tokens
from .view import ModelView
from .writer import (BOUNDARY, END, FULL, STRADDLE, UTF8_SLACK, Word, best_token, best_tokens, margin, sample_token,
                     token_index)


@dataclass
class Proposal:
    """A span one model proposes, with the tokens and log-probs it generated it with."""
    text: str
    eos: bool
    tokens: list[int]        # generated tokens (the end token last when eos)
    logprobs: list[float]    # log p of each generated token (for the end token: all end tokens together)
    words: int
    clean: bool = True       # False when a token straddled the word boundary (text was cut inside it)


def _from_words(words: list[Word]) -> Proposal:
    last = words[-1]
    return Proposal(text="".join(w.text for w in words), eos=last.eos, tokens=[t for w in words for t in w.tokens],
                    logprobs=[lp for w in words for lp in w.logprobs], words=sum(w.counts for w in words),
                    clean=last.clean)


def greedy_span(s: ModelView, max_words: int, tau: float | None, max_word_tokens: int,
                choose: Callable[[ModelView, torch.Tensor], int] = best_token,
                drafts: Sequence[str] = (), guesses: Sequence[str] = ()) -> tuple[Proposal, list[float]]:
    """Words chosen token by token (greedily by default) while the margin at each word start stays >= tau (tau None:
    always), at most max_words. Tokens are fed on the live state so a winning span costs nothing more to commit.

    `drafts` (texts other models proposed after the same committed text) and `guesses` (other likely continuations,
    e.g. from prompt lookup): verified first in one batched forward; while the chosen tokens follow one, their
    log-probs come from that forward instead of one forward each. The rules below see the same tokens and log-probs
    either way (speculative proposals)."""
    s.rewind()
    lp = s.next_logprobs
    margins = [margin(lp)]
    words: list[Word] = []
    context = list(s.ids)
    t = choose(s, lp)
    if (drafts or guesses) and (tau is None or margins[0] >= tau):
        s.draft(draft_rows(s, drafts, t, max_words * (max_word_tokens + UTF8_SLACK), guesses))
    try:
        while True:
            w = Word(s, context, max_word_tokens)
            while w.offer(t, lp):
                lp = s.extend(t)
                t = choose(s, lp)
            words.append(w)
            context = context + w.tokens
            if w.status in (END, STRADDLE) or sum(x.counts for x in words) >= max_words:
                break
            if w.status == FULL:  # the word's last token is taken: feed it, then choose the next word's first token
                lp = s.extend(t)
                t = choose(s, lp)
            margins.append(margin(lp))
            if tau is not None and margins[-1] < tau:
                break
    finally:
        s.settle()
    return _from_words(words), margins


def draft_rows(s: ModelView, drafts: Sequence[str], first: int, cap: int,
               guesses: Sequence[str] = ()) -> list[list[int]]:
    """The drafts as this model's tokens after its committed ids (tokenized in context as scoring tokenizes them, at
    most `cap` tokens), those starting with the token the model chooses first ahead; none that another row already
    holds. The other models' proposals among them are in the pool, so their verified log-probs also serve as their
    scores (`ModelView.verified`); a guess is kept only where it can save a forward (it starts with that token and runs
    past it). None at all when no row can save a forward."""
    rows: list[tuple[int, ...]] = []
    items = [(t, False) for t in drafts] + [(t, True) for t in guesses]
    for (text, guess), ids in zip(items, s.encode_many([s.text + t for t, _ in items])):
        if ids[: len(s.ids)] != s.ids:  # the draft's first token merges with the committed text
            continue
        row = tuple(ids[len(s.ids):][:cap])
        if guess and (len(row) < 2 or row[0] != first):
            continue
        if row and row not in rows:
            rows.append(row)
    if not any(len(r) >= 2 and r[0] == first for r in rows):
        return []
    rows.sort(key=lambda r: r[0] != first)  # the ones that can save tokens first, should the limits cut the batch
    return [list(r) for r in rows if not any(len(o) > len(r) and o[: len(r)] == r for o in rows)]


def explore(s: ModelView, branches: int, top_k: int, max_word_tokens: int, strategy: str = "surface",
            lam: float = 1.0, record: dict | None = None) -> list[Proposal]:
    """B first tokens chosen by `strategy` (`selection.py`: distinct surface forms, or probability against redundancy
    in the model's embedding space), each extended greedily into one complete word, all branches batched. `record`,
    when given, receives the selection's record (`ModelStep.selection`)."""
    s.rewind()
    lp = s.next_logprobs
    done: list[Word] = []
    rows: list[Word] = []
    chosen, rec = select_first_tokens(s, lp, branches, top_k, strategy, lam)
    if record is not None:
        record.update(rec)
    for t in chosen or [best_token(s, lp)]:
        w = Word(s, list(s.ids), max_word_tokens)
        (rows if w.offer(t, lp) else done).append(w)
    branch = s.branch(len(rows)) if rows else None
    while rows:
        logp = branch.step([w.tokens[-1] for w in rows])  # (N, V)
        keep, ended = [], []
        for i, (w, t) in enumerate(zip(rows, best_tokens(s, logp))):
            if w.offer(t, logp[i]):
                keep.append(i)
                continue
            done.append(w)
            if w.status == BOUNDARY:  # this row's state is exactly the word: a commit can adopt it
                ended.append((i, w.tokens, logp[i]))
        if ended:
            branch.remember(ended)
        if len(keep) < len(rows):
            rows = [rows[i] for i in keep]
            if rows:
                branch.keep(keep)
    return [_from_words([w]) for w in done]


def beam(s: ModelView, width: int, top_k: int, max_word_tokens: int) -> list[Proposal]:
    """Beam search of width B over one word (the paper's ablation without diversity).

    A hypothesis is a partial word with the sum of its tokens' log-probs. At each step it may finish: its word ends
    (log p of every token that starts a new word, together) or the answer ends (every end token together); or grow by
    one of its best tokens. The B best growths stay active. Finished words are kept by text (a duplicate keeps its
    best score and does not count towards B); the search stops when no active hypothesis can beat the B-th finished
    word, and returns the B best distinct words (fewer only if fewer exist)."""
    s.rewind()
    starts_ws = _starts_with_space(s)
    finished: dict[tuple[str, bool], tuple[float, Word]] = {}

    def finish(score: float, w: Word) -> None:
        key = (w.text, w.eos)
        if key not in finished or score > finished[key][0]:
            finished[key] = (score, w)

    def bar() -> float:  # the B-th best finished score
        scores = sorted((sc for sc, _ in finished.values()), reverse=True)
        return scores[width - 1] if len(scores) >= width else float("-inf")

    active: list[tuple[float, Word]] = [(0.0, Word(s, list(s.ids), max_word_tokens))]
    dists = s.next_logprobs.unsqueeze(0)  # (N, V)
    branch = None
    while active:
        grown: list[tuple[float, Word, int]] = []
        for i, (score, w) in enumerate(active):
            lp = dists[i]
            if w.has_text:  # the word may end here: any token that starts a new word
                ended = w.copy()
                ended.status = BOUNDARY
                finish(score + float(torch.logsumexp(lp[starts_ws], dim=0)), ended)
            if s.end_ids:  # the answer may end here: every end token together
                ending = w.copy()
                ending.offer(min(s.end_ids), lp)
                finish(score + ending.logprobs[-1], ending)
            for t in torch.topk(lp, min(top_k, lp.numel())).indices.tolist():
                if t in s.end_ids or t in s.banned_ids:
                    continue
                nxt = w.copy()
                lt = float(lp[t])
                if nxt.offer(t, lp):
                    grown.append((score + lt, nxt, i))
                elif nxt.took:  # a token straddling the boundary, or the word's token cap
                    finish(score + lt, nxt)
                if sum(1 for g in grown if g[2] == i) >= width:
                    break
        grown.sort(key=lambda g: -g[0])
        grown = grown[:width]
        if not grown or grown[0][0] <= bar():
            break
        parents = [g[2] for g in grown]
        if branch is None:
            branch = s.branch(len(grown))
        else:
            branch.keep(parents)
        active = [(sc, w) for sc, w, _ in grown]
        dists = branch.step([w.tokens[-1] for _, w in active])  # (N, V)
    ranked = sorted(finished.values(), key=lambda f: -f[0])[:width]
    return [_from_words([w]) for _, w in ranked]


def _starts_with_space(s: ModelView) -> torch.Tensor:
    """Ids of the tokens whose text starts with whitespace (they begin a new word), built once per view."""
    return token_index(s, "starts_ws", lambda: [t for t, txt in enumerate(s.vocab_texts())
                                                if txt[:1].isspace() and t not in s.banned_ids])


def sample_word(s: ModelView, temperature: float, generator: torch.Generator, max_word_tokens: int) -> Proposal:
    """One word drawn token by token from the model (temperature 0: greedy), on the live state."""
    p, _ = greedy_span(s, 1, None, max_word_tokens, lambda v, lp: sample_token(v, lp, temperature, generator))
    return p
