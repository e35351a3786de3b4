"""Length-normalized in-context NLL of candidate spans under one model, batched over the cached prefix."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .candidates import Proposal
from .trace import Unscored
from .view import ModelView
from .words import common_prefix
from .writer import end_logprob_rows

END_MARK = -1  # marks "the answer ends here" in a target sequence (scored with all of the model's end tokens)


@dataclass
class Score:
    nll: float | None  # −mean log p over the candidate's tokens in context (None: see `note`)
    n_tokens: int      # |T_m(c)|, the end marker included
    straddle: bool     # a token crossed the boundary between y and c: scoring started inside y
    note: str = ""     # why nll is None: an `Unscored` value ("" when scored)
    end_term: float | None = None  # for a candidate that ends the answer: log p(the answer ends here)


@dataclass
class Placement:
    """Candidate c tokenized in context: T_m(c) is the tokens of y + c after their longest common prefix with y's."""
    seq: list[int]    # the tokens of y + c, END_MARK last when c ends the answer
    start: int        # the first position scored (never 0: no distribution before it)
    aligned: bool     # c's tokens start right after y's own tokens (else one straddles y|c)

    @property
    def real(self) -> list[int]:
        """The tokens without the end marker."""
        return _real(self.seq)

    def forwarded(self, n_ids: int) -> list[int]:
        """The positions whose distribution comes from a forward of the candidate's own tokens: all but the one read
        from `next_logprobs` (position n_ids of an aligned candidate)."""
        return [p for p in range(self.start, len(self.seq)) if p != n_ids or not self.aligned]


def place(s: ModelView, text: str, eos: bool) -> Placement:
    """Where (text, eos) sits after the committed text of `s` (the one rule for scoring and its explanation)."""
    return place_all(s, [(text, eos)])[0]


def place_all(s: ModelView, cands: list[tuple[str, bool]]) -> list[Placement]:
    """`place` of every (text, eos) candidate, their texts tokenized in one call."""
    encoded = iter(s.encode_many([s.text + text for text, _ in cands if text]))
    placed = []
    for text, eos in cands:
        new = next(encoded) if text else list(s.ids)
        lcp = common_prefix(s.ids, new)
        placed.append(Placement(new + ([END_MARK] if eos else []), max(lcp, 1), lcp == len(s.ids)))
    return placed


def feed_from(n_ids: int, forwarded: list[list[int]]) -> int:
    """Where rows of candidate tokens are fed from (a context length): the earliest position any of them needs a
    forward for (each list: a candidate's `Placement.forwarded`), never past the committed ids."""
    return min([n_ids] + [p[0] - 1 for p in forwarded if p])


def read_ids(s: ModelView, token: int) -> list[int]:
    """The token ids a position's log-prob reads (a served model is asked for just these): END_MARK reads every end
    token."""
    return sorted(s.end_ids) if token == END_MARK else [token]


def token_logprob(s: ModelView, dist: torch.Tensor, token: int) -> torch.Tensor:
    """log p of `token` in the (V,) distribution `dist`; for END_MARK every end token together (a 0-dim tensor)."""
    return end_logprob_rows(s, dist) if token == END_MARK else dist[token]


def score_candidates(s: ModelView, cands: list[tuple[str, bool]], own: dict[int, Proposal] | None = None,
                     stops: tuple[str, ...] = ()) -> list[Score]:
    """Score every (text, eos) candidate after the committed text of `s`; `stops`: the decode's stop strings.

    The end of the answer after a candidate's text is one event: every end token together (end tokens and tokens
    whose text starts a stop string, pooled in `end_ids`) or a stop string spelled over several tokens ("\n\nQuestion:"
    as "\n\n", "Question", ":"; "Paris" merged with the space before it into " Paris"). For each stop string the
    candidate's text followed by the stop is scored too, and its path from the first token it changes joins the end
    term: log(p(rest of the text, then an end token) + p(text followed by the stop)), still one term of the mean.

    T_m(c) is c tokenized in context: tokenize y + c, keep the tokens after the longest common prefix
    with y's tokens. `own` maps candidate index -> this model's own proposal, whose log-probs are
    reused when its generated tokens are exactly T_m(c). Reads the committed state only: speculative
    tokens of the model's own span stay where they are, so a winning span still commits for free.
    """
    ends = [i for i, (_, eos) in enumerate(cands) if eos]
    paths = [(i, (cands[i][0] + stop, False)) for i in ends for stop in dict.fromkeys(stops) if stop]
    logps, seqs, starts, aligned = _logprobs(s, list(cands) + [c for _, c in paths], own or {})
    for k, (i, _) in enumerate(paths):
        _join_stop_path(s, logps, seqs, starts, i, len(cands) + k)
    scores = []
    for i in range(len(cands)):
        v = logps[i]
        straddle = not aligned[i]
        end = v[-1] if v and cands[i][1] and math.isfinite(v[-1]) else None
        if not v:
            scores.append(Score(None, 0, straddle, Unscored.NO_TOKENS))
        elif any(math.isinf(x) or math.isnan(x) for x in v):
            scores.append(Score(None, len(v), straddle, Unscored.ZERO_PROB))
        else:
            scores.append(Score(-sum(v) / len(v), len(v), straddle, end_term=end))
    return scores


def _join_stop_path(s: ModelView, logps, seqs, starts, i: int, a: int) -> None:
    """Fold the path of stop-string candidate `a` (candidate `i`'s text + a stop string) into `i`'s end term.

    From L, the first position where the two tokenizations differ (the end of i's text when the stop's tokens just
    follow it), i's remaining tokens and end marker become one term: log(exp(their sum) + exp(a's path from L)).
    A stop path that starts with a pooled end token after the text (the stop string itself, or another stop string
    that starts with one: "\n" then "Question:" where "\n" is a stop too) is already counted; a path that changes tokens of the
    committed text, or a log-prob missing or infinite, adds nothing."""
    real, alt, va = _real(seqs[i]), seqs[a], logps[a]
    lcp = common_prefix(real, alt)
    if lcp < starts[i] or starts[a] != starts[i] or lcp >= len(alt) or not va or not logps[i]:
        return
    if lcp == len(real) and alt[lcp] in s.end_ids:
        return  # it starts with one of the pooled end tokens: that token's whole probability is counted already
    head, tail = logps[i][: lcp - starts[i]], logps[i][lcp - starts[i]:]
    path = va[lcp - starts[a]:]
    if not tail or not path or not all(math.isfinite(x) for x in path):
        return
    hi, lo = sorted((sum(tail), sum(path)), reverse=True)
    logps[i] = head + [hi + math.log1p(math.exp(lo - hi))]  # log(e^tail + e^path); the path is finite
    seqs[i] = real[:lcp] + [END_MARK]


def _logprobs(s: ModelView, cands: list[tuple[str, bool]], own: dict[int, Proposal]):
    """Per candidate: the log-prob of each of its tokens in context from its first scored position (the end marker
    last: every end token together), its token sequence, that first position, and whether it is aligned with y."""
    n_ids = len(s.ids)
    placed = place_all(s, cands)
    seqs, starts, aligned = [pl.seq for pl in placed], [pl.start for pl in placed], [pl.aligned for pl in placed]
    logps: list[list[float] | None] = [None] * len(cands)
    for i, p in own.items():
        target = seqs[i][starts[i]:]
        # a proposal's end term summed a top-k distribution where the view's distributions are not whole: scored anew
        if target and p.clean and aligned[i] and target[:-1] == p.tokens[:-1] and \
                (target[-1] == p.tokens[-1] or (target[-1] == END_MARK and p.eos and s.whole)):
            logps[i] = list(p.logprobs)
    todo = [i for i in range(len(cands)) if logps[i] is None]
    # a candidate whose tokens a verifying forward of this round already ran (speculative proposals: another model's
    # span, verified by this one before it wrote its own): its distributions, and its KV kept for a commit
    pre = {}
    for i in todo:
        tokens = _real(seqs[i])[n_ids:]
        if aligned[i] and starts[i] == n_ids and tokens:
            dists = s.verified(tokens)
            if dists is not None:
                pre[i] = dists  # (len(tokens), V): entry j is the distribution after tokens[:j + 1]
    batch = [i for i in todo if i not in pre]
    # position p's distribution: `next_logprobs` when p == len(ids) on y's own tokens, else the output of a batch
    # row fed from `ctx`, the earliest position any candidate needs
    batched = {i: placed[i].forwarded(n_ids) for i in batch}
    ctx = feed_from(n_ids, [batched[i] for i in batch])
    # where the candidate may be committed next (no end marker, scored from the end of ids), feed its last token too:
    # one more position gives the KV and next-token distribution a commit would compute
    full = {i: ctx == n_ids and aligned[i] and seqs[i][-1] != END_MARK for i in batch}
    rows = {i: _real(seqs[i])[ctx:] if full[i] or seqs[i][-1] == END_MARK else _real(seqs[i])[ctx:-1] for i in batch}
    fed = [i for i in batch if rows[i]]
    if pre and not fed:  # the verifying forward served every candidate this model had to score
        s.scores_from_drafts += 1
    # per fed row, the entries read below and the tokens read there (a served model is asked for just these)
    wanted = [{p - ctx - 1: read_ids(s, seqs[i][p]) for p in batched[i]} for i in fed]
    out = dict(zip(fed, s.score_rows(ctx, [rows[i] for i in fed], [full[i] for i in fed], wanted)))
    # the tokens read right after the committed ids (asked of a served model in one request)
    first_needed = {t for i in todo for p in range(starts[i], len(seqs[i])) if p == n_ids and aligned[i]
                    for t in read_ids(s, seqs[i][p])}
    first = s.next_exact(sorted(first_needed)) if first_needed else s.next_logprobs
    # every scored position's log-prob as one tensor, read back in one transfer (no host sync per token)
    picked: list[torch.Tensor] = []
    spans = {}
    for i in todo:
        lo = len(picked)
        for p in range(starts[i], len(seqs[i])):
            dist = first if p == n_ids and aligned[i] else pre[i][p - n_ids - 1] if i in pre else out[i][p - ctx - 1]
            tok = seqs[i][p]
            picked.append(token_logprob(s, dist, tok))
        spans[i] = (lo, len(picked))
    values = torch.stack(picked).tolist() if picked else []
    for i in todo:
        logps[i] = values[spans[i][0]: spans[i][1]]
    return logps, seqs, starts, aligned


def _real(seq: list[int]) -> list[int]:
    return seq[:-1] if seq and seq[-1] == END_MARK else seq
