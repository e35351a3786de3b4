"""Length-normalized in-context NLL of candidate spans under one model, batched over the cached prefix."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .candidates import Proposal, end_logprob
from .session import ModelSession
from .words import common_prefix

END = -1  # marks "the answer ends here" in a target sequence (scored with all of the model's end tokens)


@dataclass
class Score:
    nll: float       # −mean log p over the candidate's tokens in context
    n_tokens: int    # |T_m(c)|, the end marker included
    straddle: bool   # a token crossed the boundary between y and c: scoring started inside y


def score_candidates(s: ModelSession, cands: list[tuple[str, bool]], own: dict[int, Proposal] | None = None) -> list[Score]:
    """Score every (text, eos) candidate after the committed text of `s`.

    T_m(c) is c tokenized in context: tokenize y + c, keep the tokens after the longest common prefix
    with y's tokens. `own` maps candidate index -> this model's own proposal, whose log-probs are
    reused when its generated tokens are exactly T_m(c). Does not change the session's committed state.
    """
    own = own or {}
    s.rewind()
    n_ids = len(s.ids)
    seqs, starts = [], []
    for text, eos in cands:
        new = s.encode(s.text + text) if text else list(s.ids)
        k = common_prefix(s.ids, new)
        seqs.append(new + ([END] if eos else []))
        starts.append(k)
    logps: list[list[float] | None] = [None] * len(cands)
    for i, p in own.items():
        target = seqs[i][starts[i]:]
        if target and p.clean and starts[i] == n_ids and target[:-1] == p.tokens[:-1] and \
                (target[-1] == p.tokens[-1] or (target[-1] == END and p.eos)):
            logps[i] = list(p.logprobs)
    todo = [i for i in range(len(cands)) if logps[i] is None]
    if todo:
        base = min(starts[i] for i in todo)
        ctx = base if base == n_ids else base - 1  # cached positions we feed on top of
        # Where the candidate may be committed next (no end marker, scored from the end of ids), feed its last
        # token too: one more position gives the KV and next-token distribution a commit would compute.
        full = {i: ctx == n_ids and seqs[i][-1] != END for i in todo}
        rows = {i: seqs[i][ctx:] if full[i] else seqs[i][ctx:-1] for i in todo}
        fed = [i for i in todo if rows[i]]
        out = dict(zip(fed, s.batch_forward(ctx, [rows[i] for i in fed], [full[i] for i in fed])))
        for i in todo:
            # dist[j] = distribution over seqs[i][first + j]
            dists = ([s.next_logprobs] if ctx == base else []) + (list(out[i]) if i in out else [])
            first = ctx if ctx == base else ctx + 1
            vals = []
            for pos in range(starts[i], len(seqs[i])):
                dist, tok = dists[pos - first], seqs[i][pos]
                vals.append(end_logprob(s, dist) if tok == END else float(dist[tok]))
            logps[i] = vals
    return [Score(nll=-sum(v) / len(v) if v else 0.0, n_tokens=len(v), straddle=starts[i] < n_ids)
            for i, v in enumerate(logps)]
