"""Proposals (adafuse/candidates.py): a confident model's span, an unsure model's distinct first tokens or a real
beam, and the tokens never proposed, on toy LMs."""
import math

import pytest

from adafuse import AdaFuse, DecodeConfig
from adafuse.candidates import beam
from adafuse.models.session import LocalSession
from tests.toy import A_RULES, V, first_round, toy_model, toy_pair


def test_confident_model_commits_up_to_M_words_and_records_margins():
    _, r = first_round(DecodeConfig(tau=0.7, max_words=2))
    a = r.steps[0]
    assert a.mode == "commit"
    assert a.margins == pytest.approx([0.9 - 0.05, 0.8 - 0.05], abs=1e-6)
    assert r.candidates[a.proposals[0]].text == " Paris is"  # M = 2 caps the span


def test_span_stops_when_margin_drops_below_tau():
    rules = dict(A_RULES, **{" Paris": {" is": 0.5, " big": 0.4}})
    _, r = first_round(DecodeConfig(tau=0.7, max_words=3), toy_pair(a=rules))
    a = r.steps[0]
    assert a.margins == pytest.approx([0.85, 0.1], abs=1e-6)
    assert r.candidates[a.proposals[0]].text == " Paris"


def test_uncertain_model_explores_B_distinct_first_tokens():
    _, r = first_round(DecodeConfig(tau=0.7, branches=3, allow_empty=True))  # the end proposed at once, kept
    b = r.steps[1]
    assert b.mode == "explore" and b.margins == pytest.approx([0.2], abs=1e-6)
    texts = [r.candidates[i].text for i in b.proposals]
    # "Paris" has the same surface as " Paris" once whitespace is stripped: skipped for "\n", which the model ends
    # after (<eos>): whitespace and then the end is the end event ("")
    assert texts == [" London", " Paris", ""] and r.candidates[b.proposals[2]].eos


def test_beam_ablation_keeps_near_duplicates():
    _, r = first_round(DecodeConfig(tau=0.7, branches=3, diversity=False))
    b = r.steps[1]
    assert b.mode == "beam"
    assert {r.candidates[i].text for i in b.proposals} == {" London", " Paris", "Paris"}


def test_non_end_special_tokens_are_never_proposed_nor_end_the_answer():
    # <bos> is special but not an end token: the most likely token, yet never proposed
    rules = {"Q": {"<bos>": 0.6, " Paris": 0.3}, " Paris": {"<eos>": 0.9}}
    a, b = toy_model("a", V, rules), toy_model("b", V, rules)
    assert a.end_ids == {a.tokenizer.eos_token_id} and a.tokenizer.bos_token_id in a.banned_ids
    tr = AdaFuse([a, b], DecodeConfig(tau=0.0)).generate("Q")
    assert tr.output == " Paris" and tr.stop_reason == "eos"


BEAM_V = ["Q", "ab", " Paris", " London", " is", ".", "\n", " x"]


# after "Q": "ab" (0.5) or " Paris" (0.4); "ab" may go on as "abab" (0.3) or end (a space token follows: 0.6)
BEAM_RULES = {"Q": {"ab": 0.5, " Paris": 0.4}, "ab": {" is": 0.6, "ab": 0.3}, "abab": {" is": 0.2, "ab": 0.7},
              " Paris": {" is": 0.9}}


def _probs(rules_key: str, listed: dict) -> dict:
    """Toy probabilities after a context: listed tokens, the rest spread over the other 10 - len(listed) tokens."""
    rest = (1 - sum(listed.values())) / (10 - len(listed))
    tokens = ["<bos>", "<eos>"] + BEAM_V
    return {t: listed.get(t, rest) for t in tokens}


def _word_end(listed: dict) -> float:
    p = _probs("", listed)
    return sum(v for t, v in p.items() if t[:1].isspace())


def test_beam_is_a_real_width_b_beam_over_one_word():
    lm = toy_model("m", BEAM_V, BEAM_RULES)
    s = LocalSession(lm, "Q")
    got = beam(s, 3, 64, 8)
    texts = [p.text for p in got]
    score = {"ab": math.log(0.5 * _word_end(BEAM_RULES["ab"])),
             "abab": math.log(0.5 * 0.3 * _word_end(BEAM_RULES["abab"])),
             " Paris": math.log(0.4 * _word_end(BEAM_RULES[" Paris"]))}
    assert score["ab"] > score["abab"]  # p("ab" + word end) > p("abab" + word end)
    expected = sorted(score, key=lambda t: -score[t])
    assert texts == expected and len(set(texts)) == 3
    assert got[texts.index("ab")].tokens == [lm.tokenizer.index["ab"]]
    # B larger than the number of distinct words that exist in a tiny vocabulary still gives distinct words
    more = [(p.text, p.eos) for p in beam(s, 6, 64, 3)]
    assert len(more) == len(set(more)) == 6


def test_beam_method_uses_the_beam_when_unsure():
    _, r = first_round(DecodeConfig(tau=0.7, branches=3, diversity=False))
    texts = [r.candidates[i].text for i in r.steps[1].proposals]
    assert r.steps[1].mode == "beam" and len(texts) == len(set(texts)) == 3
