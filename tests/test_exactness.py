"""The rules a review found broken, one test each, on toy LMs whose right answers are computed by hand."""
import json
import math

import pytest

from adafuse import AdaFuse, ConfigError, DecodeConfig
from adafuse.candidates import beam
from adafuse.loading import LoadedModel
from adafuse.session import LocalSession
from tests.test_decoder_toy import B_RULES, V, first_round, pair
from tests.toy import ToyLM, ToyTokenizer, toy_model


def test_a_winning_confident_span_costs_no_forward_at_commit():
    rules_b = dict(B_RULES, **{"Q": {" Paris": 0.5, " London": 0.3, "\n": 0.1}})
    d, r = first_round(DecodeConfig(tau=0.7, max_words=2, branches=2), pair(b=rules_b))
    assert len(r.candidates) >= 2 and r.candidates[r.winner].text == " Paris is"
    assert r.candidates[r.winner].proposers == ["a"]  # a's own greedy span, scored against b's words
    before = [s.forward_passes for s in d.sessions]
    d.commit()
    assert [s.forward_passes for s in d.sessions] == before  # a: its speculative KV; b: its scoring row
    for s in d.sessions:
        assert s.ids == s.encode(" Paris is") and s.cache.get_seq_length() == len(s.ids)


def test_non_end_special_tokens_are_never_proposed_nor_end_the_answer():
    # <bos> is special but not an end token: the most likely token, yet never proposed
    rules = {"Q": {"<bos>": 0.6, " Paris": 0.3}, " Paris": {"<eos>": 0.9}}
    a, b = toy_model("a", V, rules), toy_model("b", V, rules)
    assert a.end_ids == {a.tokenizer.eos_token_id} and a.tokenizer.bos_token_id in a.banned_ids
    tr = AdaFuse([a, b], DecodeConfig(tau=0.0)).generate("Q")
    assert tr.output == " Paris" and tr.stop_reason == "eos"


def test_a_span_holding_another_models_eos_string_is_cut_before_it():
    # b's end token is "</s>"; a writes "</s>" as plain text
    tok_a = ToyTokenizer(V + ["</s>"])
    tok_b = ToyTokenizer(V, eos="</s>")
    rules = {"Q": {" Paris": 0.95}, " Paris": {"</s>": 0.95}, "</s>": {" nice": 0.9}}
    a = LoadedModel.from_objects("a", ToyLM(tok_a, rules), tok_a)
    b = LoadedModel.from_objects("b", ToyLM(tok_b, {"Q": {" Paris": 0.95}, " Paris": {"</s>": 0.5}}), tok_b)
    tr = AdaFuse([a, b], DecodeConfig(tau=0.5, max_words=3)).generate("Q")
    assert "</s>" not in tr.output and tr.output == " Paris" and tr.stop_reason == "eos"
    assert "".join(r.text for r in tr.rounds) == tr.output


def test_a_stop_string_across_rounds_keeps_round_texts_adding_up():
    rules = {"Q": {" Paris": 0.95}, " Paris": {" is": 0.95}, " is": {" nice": 0.95}}
    tr = AdaFuse(pair(a=rules, b=rules), DecodeConfig(tau=0.5, max_words=1, stop=(" Paris is",))).generate("Q")
    assert tr.output == "" and tr.stop_reason == "stop string"
    assert "".join(r.text for r in tr.rounds) == tr.output
    assert tr.rounds[0].cut == len(" Paris")
    tr2 = AdaFuse(pair(a=rules, b=rules), DecodeConfig(tau=0.5, max_words=1, stop=("s is",))).generate("Q")
    assert tr2.output == " Pari" and "".join(r.text for r in tr2.rounds) == tr2.output


def test_one_token_prompt_that_merges_with_the_candidate_decodes():
    vocab = ["a", "b", "ab", " x", "bb"]
    tok = ToyTokenizer(vocab, bos=None)
    ra = {"a": {"b": 0.5, " x": 0.4}, "ab": {" x": 0.9}, " x": {"<eos>": 0.9}}
    rb = {"a": {" x": 0.5, "b": 0.4}, "ab": {" x": 0.9}, " x": {"<eos>": 0.9}}
    a = LoadedModel.from_objects("a", ToyLM(tok, ra), tok)
    b = LoadedModel.from_objects("b", ToyLM(ToyTokenizer(vocab, bos=None), rb), ToyTokenizer(vocab, bos=None))
    d = AdaFuse([a, b], DecodeConfig(tau=0.9, branches=2)).start("a")
    assert [len(s.ids) for s in d.sessions] == [1, 1]
    r = d.propose()
    merged = next(c for c in r.candidates if c.text == "b")  # "a"+"b" tokenizes as the single token "ab"
    # no token of "b" can be scored in context (position 0 has nothing before it): null, with the reason
    assert merged.nll["a"] is None and merged.notes["a"] and merged.straddle["a"]
    assert merged.fused is None or merged.fused == merged.nll["b"]
    for _ in d:
        pass
    json.loads(d.trace.to_json())


def test_traces_are_strict_json_with_null_and_a_reason_for_impossible_scores():
    a, _ = pair()
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


def test_settings_are_validated_before_any_model_prefills():
    a, b = pair()
    with pytest.raises(ConfigError, match="weights"):
        AdaFuse([a, b], DecodeConfig(method="mixture", weights=(1, 2, 3))).start("Q")
    with pytest.raises(ConfigError, match="union_top_k"):
        AdaFuse([a, b], DecodeConfig(method="token-union", union_top_k=999)).start("Q")
    assert a.model.calls == 0 and b.model.calls == 0


def test_mixture_is_word_level_me_one_model_per_word_no_scoring():
    a, b = pair()
    tr = AdaFuse([a, b], DecodeConfig(method="mixture", weights=(1, 0), temperature=0)).generate("Q")
    assert all(len(r.candidates) == 1 and r.candidates[0].nll == {} for r in tr.rounds)
    assert sum(s.forward_passes for r in tr.rounds for s in r.steps if s.model == "b") == 0
    # drawn models catch up lazily: b sees the words a wrote with one forward when it is drawn
    d = AdaFuse(pair(), DecodeConfig(method="mixture", seed=1, temperature=0)).start("Q")
    for r in d:
        for m, step in enumerate(r.steps):
            if step.mode != "idle" and not d.done:
                assert d.sessions[m].text == d.trace.output
    counts = [sum(1 for r in d.trace.rounds if r.steps[m].mode != "idle") for m in (0, 1)]
    assert all(counts)
    # sampling is seeded: the same seed gives the same words, temperature > 0
    one = AdaFuse(pair(), DecodeConfig(method="mixture", seed=5, temperature=1.0)).generate("Q").output
    assert one == AdaFuse(pair(), DecodeConfig(method="mixture", seed=5, temperature=1.0)).generate("Q").output


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


def test_the_end_of_the_answer_is_one_event_however_it_is_spelled():
    # after "Q" a newline is unlikely (0.1), but once written the few-shot format ("\nQ") is almost sure: averaged
    # over "\n" + "Q" the format continuation would win; as the end event it is scored by the newline alone
    rules = {"Q": {" Paris": 0.3, " London": 0.25, "\n": 0.1}, "\n": {"Q": 0.99}, " Paris": {"<eos>": 0.9},
             " London": {"<eos>": 0.9}}
    d, r = first_round(DecodeConfig(tau=0.9, branches=3, stop=("\n",)), pair(a=rules, b=rules))
    ends = [c for c in r.candidates if c.eos and c.text == ""]
    assert len(ends) == 1  # proposed as "\n...", pooled with the end tokens: one entry
    end_p = 0.1 + (1 - 0.65) / 9  # "\n" and <eos> (unlisted) together
    assert ends[0].nll["a"] == pytest.approx(-math.log(end_p), abs=1e-5) and ends[0].n_tokens["a"] == 1
    assert ends[0].end_term["a"] == pytest.approx(math.log(end_p), abs=1e-5)
    assert r.candidates[r.winner].text == " Paris"
    # a span that holds a stop string is cut before it and ends the answer
    assert d._ending(" Paris\nQ", False) == (" Paris", True)


def test_whitespace_and_then_the_end_is_the_end_event():
    """" " + "\n" ends the answer with nothing in it, as "\n" does: one pool entry scored by the end term alone,
    not a two-token candidate whose near-certain second token halves the cost of ending (the empty Flores answers)."""
    rules = {"Q": {" ": 0.3, " Paris": 0.28, " London": 0.27, "\n": 0.05}, " ": {"\n": 0.99},
             " Paris": {"<eos>": 0.9}, " London": {"<eos>": 0.9}}
    from tests.toy import toy_model
    vocab = ["Q", " Paris", " London", " ", "\n"]
    d, r = first_round(DecodeConfig(tau=0.9, branches=3, stop=("\n",)),
                       [toy_model("a", vocab, rules), toy_model("b", vocab, rules)])
    ends = [c for c in r.candidates if c.eos and not c.text.strip()]
    assert [c.text for c in ends] == [""] and ends[0].n_tokens["a"] == 1
    assert r.candidates[r.winner].text == " Paris"  # averaged with its sure newline, " " + end would have won
    assert d.commit().text == " Paris"
