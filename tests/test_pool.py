"""The pool of a round (adafuse/pool.py): a pure function from the acting models' proposals to the candidates; and
the speculation's drafts (adafuse/speculation.py), the values a method is handed for a round."""
import copy

import pytest

from adafuse import DecodeConfig
from adafuse.candidates import Proposal
from adafuse.ending import Ending
from adafuse.methods import Proposed
from adafuse.pool import build_pool
from adafuse.speculation import Speculation
from adafuse.trace import StepMode

pytestmark = pytest.mark.unit


def span(text: str, eos: bool = False, words: int = 1) -> Proposal:
    return Proposal(text=text, eos=eos, tokens=[7, 8], logprobs=[-0.1, -0.2], words=words)


def test_the_pool_is_the_union_by_exact_text_and_end_with_the_proposers_in_order_and_changes_no_input():
    names = ["a", "b", "c", "d"]
    proposed = {  # b did not act; " x\nmore" holds the stop string "\n"; d's " y" ended on a token starting one
        0: Proposed([span(" Paris is", words=2)], StepMode.COMMIT, [0.9, 0.8]),
        2: Proposed([span(" London"), span(" Paris"), span(" Paris is", words=2), span(" x\nmore", words=2),
                     span("", eos=True, words=0), span("")], StepMode.EXPLORE, [0.2], {"strategy": "surface"}),
        3: Proposed([span(" Paris"), span(" x", eos=True), span(" y", eos=True)], StepMode.EXPLORE, [0.1]),
    }
    before = copy.deepcopy(proposed)
    asked = []

    def on_stop_token(m, p):
        asked.append((m, p.text))
        return p.text == " y"

    pool = build_pool(names, proposed, "Q", Ending(("\n",), ("<eos>",)), on_stop_token)
    assert proposed == before  # nothing it was given changed
    got = [(c.text, c.eos, c.proposers, c.words) for c in pool.candidates]
    assert got == [(" Paris is", False, ["a", "c"], 2), (" London", False, ["c"], 1), (" Paris", False, ["c", "d"], 1),
                   (" x", True, ["c", "d"], 1), ("", True, ["c"], 0), (" y", True, ["d"], 1)]
    assert all(c.nll == {} and c.fused is None for c in pool.candidates)  # nothing scored
    assert [(s.model, s.mode, s.proposals) for s in pool.steps] == [
        ("a", StepMode.COMMIT, [0]), ("b", StepMode.IDLE, []), ("c", StepMode.EXPLORE, [1, 2, 0, 3, 4]),
        ("d", StepMode.EXPLORE, [2, 3, 5])]
    assert pool.cut == {3, 5}  # the stop string in c's text, d's stop token; c's "" ended on an end token
    assert pool.own[2][3].text == " x\nmore" and pool.own[3][3].text == " x" and pool.own[1] == {}
    assert asked == [(2, ""), (3, " x"), (3, " y")]  # asked only for proposals that ended where no stop was found
    pool.steps[0].margins.append(0.0)
    assert proposed[0].margins == [0.9, 0.8]  # the steps hold their own lists


def test_a_pool_of_nothing_but_empty_text_is_the_end_of_the_answer():
    pool = build_pool(["a"], {0: Proposed([span("")], StepMode.GREEDY, [0.5])}, "Q", Ending(()), lambda m, p: False)
    assert [(c.text, c.eos, c.proposers) for c in pool.candidates] == [("", True, [])] and pool.cut == frozenset()


def test_before_the_answers_first_word_a_proposal_to_end_it_is_held_back_while_another_is_in_the_pool():
    """`allow_empty` off (the default): an end token, and whitespace then a stop string — each ending an answer that
    holds nothing — are left out of the first round's pool beside " Rome", the steps saying so; kept once the answer
    holds a word, when nothing else was proposed, and with `allow_empty`."""
    ending = Ending(("Question:",), ("<eos>",))
    proposed = {0: Proposed([span(" Rome"), span(" <eos>"), span("", eos=True, words=0)], StepMode.EXPLORE, [0.1]),
                1: Proposed([span("\n\nQuestion: x", words=2)], StepMode.COMMIT, [0.9])}

    def pool(output, allow_empty=False, of=proposed):
        return build_pool(["a", "b"], of, output, ending, lambda m, p: False, allow_empty)

    held = pool("")
    assert [(c.text, c.eos) for c in held.candidates] == [(" Rome", False)]
    assert [(s.proposals, s.held_end) for s in held.steps] == [([0], True), ([], True)]
    for kept in (pool(" Rome"), pool("", allow_empty=True)):
        assert [(c.text, c.eos) for c in kept.candidates] == [(" Rome", False), ("", True), ("\n\n", True)]
        assert not any(s.held_end for s in kept.steps)
    alone = pool(" ", of={1: proposed[1]})  # only ends proposed: the answer ends (empty), as before
    assert [(c.text, c.eos) for c in alone.candidates] == [("\n\n", True)] and not alone.steps[1].held_end


def test_drafts_are_the_spans_proposed_before_then_the_leftovers_own_first():
    spec, cfg = Speculation([]), DecodeConfig()
    spec.leftover = {0: " big", 1: " nice"}
    assert spec.start_round([1, 0], cfg, side_by_side=True) == [0, 1]  # no weights to read: by index
    spec.record(0, Proposed([span(" Paris is"), span(" ")], StepMode.COMMIT, [0.9]))
    assert spec.drafts(1, cfg, side_by_side=False) == [" Paris is", " nice", " big"]
    assert spec.drafts(1, cfg, side_by_side=True) == [" nice", " big"]  # side by side, nothing proposed yet
    assert spec.drafts(1, DecodeConfig(speculate=False), side_by_side=False) == []
    assert spec.lookups("Q: a b c. ", "a b", cfg) == [" c. a b"]  # M + 1 words after the last match
    assert spec.lookups("Q: a b c. ", "a b", DecodeConfig(draft_lookup=False)) == []
