"""The pool of a round: the union of the acting models' proposals by exact (text, end of the answer)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from .candidates import Proposal
from .ending import Ending
from .methods import Proposed
from .trace import Candidate, ModelStep, StepMode
from .words import count_words


@dataclass
class Pool:
    """A round's candidates (unscored) and what each model did."""
    steps: list[ModelStep]           # per model, in the decode's model order (idle: did not act)
    candidates: list[Candidate]      # in pool order: the proposers' order, each proposer's proposals in its order
    own: list[dict[int, Proposal]]   # per model: its own proposal of each candidate it proposed (its tokens score it)
    cut: frozenset[int]              # candidates a stop string ended (found in the text, or a token starting one)


def build_pool(names: Sequence[str], proposed: Mapping[int, Proposed], output: str, ending: Ending,
               on_stop_token: Callable[[int, Proposal], bool], allow_empty: bool = True) -> Pool:
    """The pool of the models that proposed (`proposed`, by model index; the others idle) after the text `output`:
    each proposal is cut at the end of the answer (`ending`), proposals with the same (text, end) are one candidate
    whoever proposed them, in the order the models and their proposals come. `on_stop_token(m, p)`: whether model m's
    proposal p ended on a token that starts a stop string. Not `allow_empty`: while `output` holds no word, a proposal
    that ends the answer with nothing before it is left out when a proposal with text is in (its step's `held_end`).
    Its inputs are not changed; nothing is scored."""
    heads = {(m, k): ending.head(output, p.text, p.eos) for m, mine in proposed.items()
             for k, p in enumerate(mine.proposals)}
    hold = not allow_empty and not output.strip() and any(h.strip() for h, _, _ in heads.values())
    keys: dict[tuple[str, bool], int] = {}
    cut: set[int] = set()
    words: list[int] = []
    proposers: list[list[str]] = []
    own: list[dict[int, Proposal]] = [{} for _ in names]
    steps = []
    for m, name in enumerate(names):
        mine = proposed.get(m)
        if mine is None:
            steps.append(ModelStep(model=name, mode=StepMode.IDLE, margins=[], proposals=[]))
            continue
        indices: list[int] = []
        held = False
        for k, p in enumerate(mine.proposals):
            head, eos, at_stop = heads[m, k]
            if eos and hold and not head.strip():
                held = True
                continue
            if head == "" and not eos:
                continue
            if (head, eos) not in keys:
                keys[head, eos] = len(keys)
                proposers.append([])
                words.append(p.words if head == p.text else count_words(head))
            i = keys[head, eos]
            if eos and (at_stop or on_stop_token(m, p)):
                cut.add(i)
            if name not in proposers[i]:
                proposers[i].append(name)
            own[m].setdefault(i, p)
            if i not in indices:
                indices.append(i)
        steps.append(ModelStep(model=name, mode=mine.mode, margins=list(mine.margins), proposals=indices,
                               selection=dict(mine.selection), held_end=held))
    texts = list(keys)
    if not texts:  # nothing but empty text: cannot move
        texts, proposers, words = [("", True)], [[]], [0]
    candidates = [Candidate(text=t, eos=e, proposers=proposers[i], nll={}, n_tokens={}, fused=None, words=words[i])
                  for i, (t, e) in enumerate(texts)]
    return Pool(steps, candidates, own, frozenset(cut))
