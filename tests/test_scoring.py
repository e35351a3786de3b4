"""Scoring (adafuse/scoring.py): in-context NLL of each candidate under each model, the end of the answer as one
event, impossible scores, weights and per-word averaging, on toy LMs whose numbers are computed by hand."""
import json
import math

import pytest

from adafuse import AdaFuse, ConfigError, DecodeConfig, Trace
from adafuse.scoring import score_candidates
from adafuse.trace import Unscored, fused_score
from adafuse.models.session import LocalSession
from adafuse.trace import Candidate
from tests.toy import B_RULES, V, first_round, nll, toy_model, toy_pair


def test_scoring_does_not_change_the_session():
    a, _ = toy_pair()
    s = LocalSession(a, "Q")
    ids, text, lp = list(s.ids), s.text, s.next_logprobs.clone()
    scores = score_candidates(s, [(" Paris", False), (" Paris is", False), ("", True)])
    assert s.ids == ids and s.text == text and bool((s.next_logprobs == lp).all())
    # "the answer ends" = the end tokens (<eos>; <bos> is special but never ends the answer), unlisted at "Q"
    assert scores[2].nll == pytest.approx(nll((1 - 0.95) / 10), abs=1e-5)


def test_a_stop_string_of_several_tokens_is_the_end_of_the_answer():
    """A stop string spelled over several tokens ("\nQ:" as "\n", "Q", ":") ends the answer with the probability of
    that spelling, pooled with the end tokens into one term; text before a stop that does not start with whitespace
    ("\n" before "Q:") is scored as text, then the stop."""
    vocab = ["Q", "A", ":", "\n", " x", " y", " Q"]
    rules = {"A:": {" x": 0.6, " y": 0.3}, " x": {"\n": 0.9, "<eos>": 0.01}, "\n": {"Q": 0.8}, "\nQ": {":": 0.9}}
    m = toy_model("m", vocab, rules)
    s = LocalSession(m, "A:")
    s.commit(" x")
    plain = score_candidates(s, [("", True)])  # the end tokens alone
    (end,) = score_candidates(s, [("", True)], stops=("\nQ:",))
    assert plain[0].nll == pytest.approx(-math.log(0.01), abs=1e-5)
    assert end.n_tokens == 1 and end.nll == pytest.approx(-math.log(0.01 + 0.9 * 0.8 * 0.9), abs=1e-5)
    assert end.end_term == pytest.approx(math.log(0.01 + 0.9 * 0.8 * 0.9), abs=1e-5)
    # stop "Q:" after "\n": the candidate is "\n" then the end; "Q" merging with a space (" Q") is another spelling
    (nl_end,) = score_candidates(s, [("\n", True)], stops=("Q:",))
    p_nl, p_end = 0.9, 0.8 * 0.9 + (1 - 0.8) / 8  # after "\n": "Q" then ":", or <eos> (an even share of 8)
    assert nl_end.n_tokens == 2 and nl_end.nll == pytest.approx(nll(p_nl, p_end), abs=1e-5)
    # the whole decode stops there, for that reason, and the text before the stop is kept
    other = toy_model("o", vocab, {"A:": {" x": 0.7}, " x": {"\n": 0.8}, "\n": {"Q": 0.9}, "\nQ": {":": 0.9}})
    tr = AdaFuse([m, other], DecodeConfig(tau=0.5, max_words=3, stop=("\nQ:",))).generate("A:")
    assert tr.output == " x" and tr.stop_reason == "stop string"
    tr = AdaFuse([m, other], DecodeConfig(tau=0.5, max_words=3, stop=("Q:",))).generate("A:")
    assert tr.output == " x\n" and tr.stop_reason == "stop string"


def test_a_stop_path_that_starts_with_an_end_token_is_counted_once():
    """With stops "\n" and "\nQ:", the token "\n" ends the answer by itself: the path "\n", "Q", ":" is part of
    that token's probability, not added to it again."""
    vocab = ["Q", "A", ":", "\n", " x", " y"]
    m = toy_model("m", vocab, {"A:": {" x": 0.6}, " x": {"\n": 0.5, "<eos>": 0.1}, "\n": {"Q": 0.8}, "\nQ": {":": 0.9}})
    s = LocalSession(m, "A:", stop=("\n", "\nQ:"))
    s.commit(" x")
    (end,) = score_candidates(s, [("", True)], stops=("\n", "\nQ:"))
    assert end.n_tokens == 1 and end.end_term == pytest.approx(math.log(0.1 + 0.5), abs=1e-5)


def test_traces_are_strict_json_with_null_and_a_reason_for_impossible_scores():
    a, _ = toy_pair()
    b = toy_model("b", V, B_RULES)
    b.end_ids = frozenset()  # b cannot end the answer: "the answer ends" has probability 0 under b
    rules = {"Q": {"<eos>": 0.5, " Paris": 0.4}}
    d = AdaFuse([toy_model("a", V, rules), b], DecodeConfig(tau=0.9, branches=2)).start("Q")
    r = d.propose()
    end = next(c for c in r.candidates if c.eos)
    assert end.nll["b"] is None and "probability 0" in end.notes["b"] and end.fused is None
    assert r.candidates[r.winner].eos is False  # an impossible candidate ranks last
    text = d.trace.to_json()
    d.commit()
    json.loads(d.trace.to_json(), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert "Infinity" not in text


def test_weights_fuse_as_a_weighted_mean_and_are_recorded():
    c = Candidate(text=" x", eos=False, proposers=["a"], nll={"a": 1.0, "b": 4.0}, n_tokens={"a": 1, "b": 1}, fused=None)
    assert fused_score(c) == 2.5
    assert fused_score(c, {"a": 3.0, "b": 1.0}) == (3 * 1.0 + 4.0) / 4
    assert fused_score(c, {"a": 1.0, "b": 0.0}) == 1.0  # weight 0: shown, not counted
    c0 = Candidate(text=" y", eos=False, proposers=["a"], nll={"a": 1.0, "b": None}, n_tokens={"a": 1, "b": 0},
                   fused=None, notes={"b": Unscored.ZERO_PROB})
    assert fused_score(c0) is None and fused_score(c0, {"a": 1.0, "b": 0.0}) == 1.0


def test_static_weights_decide_the_pool_and_are_recorded():
    """Σ w·NLL / Σ w: weighting the unsure model heavily lets its candidate win; the round records the weights,
    and the trace round-trips through JSON."""
    _, equal = first_round(DecodeConfig(tau=0.7, branches=3, max_words=1))
    _, heavy = first_round(DecodeConfig(tau=0.7, branches=3, max_words=1, weights=(1, 20)))
    assert equal.weights == {} and heavy.weights == {"a": 1.0, "b": 20.0}
    for c in heavy.candidates:
        if c.fused is not None:
            assert c.fused == pytest.approx((c.nll["a"] + 20 * c.nll["b"]) / 21)
    assert equal.candidates[equal.winner].text == " Paris" and heavy.candidates[heavy.winner].text == " London"
    d = AdaFuse(toy_pair(), DecodeConfig(tau=0.7, branches=3, max_words=1, weights=(1, 20))).start("Q")
    d.step()
    assert Trace.from_dict(d.trace.to_dict()).rounds[0].weights == {"a": 1.0, "b": 20.0}


def test_per_word_normalization_keeps_the_likelier_word_over_a_long_one_with_a_certain_tail():
    vocab = ["Q", " Bot", "sch", "after", " Nach", " big"]
    rules = {"Q": {" Nach": 0.4, " Bot": 0.35, " big": 0.1}, " Bot": {"sch": 0.99}, "sch": {"after": 0.99},
             "after": {"<eos>": 0.99}, " Nach": {"<eos>": 0.99}, " big": {"<eos>": 0.99}}
    models = toy_model("a", vocab, rules), toy_model("b", vocab, rules)
    per_token = AdaFuse(models, DecodeConfig(branches=2, max_new_words=1, normalize="token")).start("Q").propose()
    per_word = AdaFuse(models, DecodeConfig(branches=2, max_new_words=1, normalize="word")).start("Q").propose()
    texts = [c.text for c in per_token.candidates]
    assert [c.text for c in per_word.candidates] == texts  # the pool is the same both ways
    long = texts.index(" Botschafter")
    short = texts.index(" Nach")
    # per token the long word's near-certain tail dilutes its unlikely first token; per word (the end counting as
    # one) its whole NLL counts: 4 tokens over 2 units, against the short word's 2 tokens over 2
    assert per_token.candidates[long].fused == pytest.approx(nll(0.35, 0.99, 0.99, 0.99), abs=1e-5)
    assert per_token.winner == long
    assert per_word.candidates[long].fused == pytest.approx(4 * nll(0.35, 0.99, 0.99, 0.99) / 2, abs=1e-5)
    assert per_word.candidates[short].fused == pytest.approx(nll(0.4, 0.99), abs=1e-5)
    assert per_word.winner == short
    # per byte: the whole NLL over the text's UTF-8 bytes, the end counting as one (the same count for every model)
    per_byte = AdaFuse(models, DecodeConfig(branches=2, max_new_words=1, normalize="byte")).start("Q").propose()
    assert per_byte.candidates[long].fused == pytest.approx(4 * nll(0.35, 0.99, 0.99, 0.99) / 13, abs=1e-5)
    assert per_byte.candidates[short].fused == pytest.approx(2 * nll(0.4, 0.99) / 6, abs=1e-5)
    assert per_byte.winner == long
    decoded = AdaFuse(models, DecodeConfig(branches=2, max_new_words=2, normalize="byte")).generate("Q")
    assert Trace.from_dict(decoded.to_dict()).settings["normalize"] == "byte"  # its fused scores check per byte
    with pytest.raises(ConfigError, match="normalize"):
        DecodeConfig(normalize="char")
