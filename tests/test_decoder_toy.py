"""The algorithm on toy LMs whose right answers are computed by hand here."""
import math

import pytest
import torch

from adafuse import AdaFuse, ConfigError, DecodeConfig, PromptError, Trace
from adafuse.scoring import score_candidates
from adafuse.session import LocalSession as ModelSession
from tests.toy import nll, toy_model

V = ["Q", " Paris", "Paris", " London", ".", " is", " nice", "\n", " big", "ab"]

# a: confident; b: unsure between London and Paris.
A_RULES = {"Q": {" Paris": 0.9, " London": 0.05}, " Paris": {" is": 0.8, " big": 0.05},
           " is": {" nice": 0.9}, " nice": {".": 0.9}, ".": {"<eos>": 0.9}, " London": {" is": 0.5}}
B_RULES = {"Q": {" London": 0.5, " Paris": 0.3, "Paris": 0.15, "\n": 0.04}, " London": {" is": 0.9},
           " Paris": {" is": 0.6, " big": 0.3}, " is": {" nice": 0.5, " big": 0.4}, " nice": {".": 0.99},
           ".": {"<eos>": 0.99}}


def pair(**rules):
    return toy_model("a", V, rules.get("a", A_RULES)), toy_model("b", V, rules.get("b", B_RULES))


def first_round(cfg: DecodeConfig, models=None):
    d = AdaFuse(models or pair(), cfg).start("Q")
    return d, d.propose()


def rest(k):
    """Probability of each unlisted token given the listed mass k (V plus <bos>, <eos>: 12 tokens)."""
    return lambda listed: (1 - k) / (12 - listed)


def test_confident_model_commits_up_to_M_words_and_records_margins():
    _, r = first_round(DecodeConfig(tau=0.7, max_words=2))
    a = r.steps[0]
    assert a.mode == "commit"
    assert a.margins == pytest.approx([0.9 - 0.05, 0.8 - 0.05], abs=1e-6)
    assert r.candidates[a.proposals[0]].text == " Paris is"  # M = 2 caps the span


def test_span_stops_when_margin_drops_below_tau():
    rules = dict(A_RULES, **{" Paris": {" is": 0.5, " big": 0.4}})
    _, r = first_round(DecodeConfig(tau=0.7, max_words=3), pair(a=rules))
    a = r.steps[0]
    assert a.margins == pytest.approx([0.85, 0.1], abs=1e-6)
    assert r.candidates[a.proposals[0]].text == " Paris"


def test_uncertain_model_explores_B_distinct_first_tokens():
    _, r = first_round(DecodeConfig(tau=0.7, branches=3))
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


def test_pool_is_deduplicated_and_scored_by_hand():
    rules_b = dict(B_RULES, **{"Q": {" Paris": 0.5, " London": 0.3, "\n": 0.1}})
    _, r = first_round(DecodeConfig(tau=0.7, max_words=2, branches=2), pair(b=rules_b))
    texts = [c.text for c in r.candidates]
    assert texts == [" Paris is", " Paris", " London"]
    # " Paris is" was proposed by a only; " Paris" by b only; nothing appears twice.
    assert r.candidates[0].proposers == ["a"] and r.candidates[1].proposers == ["b"]
    c = {t: r.candidates[i] for i, t in enumerate(texts)}
    assert c[" Paris is"].nll["a"] == pytest.approx(nll(0.9, 0.8), abs=1e-5)
    assert c[" Paris is"].nll["b"] == pytest.approx(nll(0.5, 0.6), abs=1e-5)
    assert c[" Paris"].nll["a"] == pytest.approx(nll(0.9), abs=1e-5)
    assert c[" London"].nll["b"] == pytest.approx(nll(0.3), abs=1e-5)
    assert c[" Paris is"].n_tokens == {"a": 2, "b": 2}
    for cand in r.candidates:
        assert cand.fused == pytest.approx((cand.nll["a"] + cand.nll["b"]) / 2)
    best = min(range(3), key=lambda i: r.candidates[i].fused)
    assert r.winner == best == 0


def test_ties_go_to_the_first_candidate_in_pool_order():
    same = {"Q": {" Paris": 0.45, " London": 0.45}}
    _, r = first_round(DecodeConfig(tau=0.7, branches=2), pair(a=same, b=same))
    assert [c.text for c in r.candidates] == [" Paris", " London"]
    assert r.candidates[0].fused == pytest.approx(r.candidates[1].fused)
    assert r.candidates[0].proposers == ["a", "b"]
    assert r.winner == 0


def test_whole_decode_reproduces_output_and_stops_at_eos():
    tr = AdaFuse(pair(), DecodeConfig(tau=0.7)).generate("Q")
    assert tr.output == "".join(r.text for r in tr.rounds)
    assert tr.stop_reason == "eos"
    assert tr.output.endswith(".") and "<eos>" not in tr.output


def test_stop_string_cuts_the_output():
    rules = dict(A_RULES, **{" is": {"\n": 0.95}, "\n": {" nice": 0.99}})
    tr = AdaFuse(pair(a=rules), DecodeConfig(tau=0.0, stop=("\n",))).generate("Q")
    # "\n" starts the stop string: it is the end of the answer, like an end token, and the trace says which ended it
    assert tr.stop_reason == "stop string" and "\n" not in tr.output and tr.output


def test_model_without_whitespace_still_moves():
    rules = {"": {"ab": 0.99}}
    models = toy_model("a", V, rules), toy_model("b", V, rules)
    tr = AdaFuse(models, DecodeConfig(max_word_tokens=3, max_new_words=4)).generate("Q")
    assert tr.output == "ab" * 12 and tr.stop_reason == "max_new_words"
    assert [r.words for r in tr.rounds] == [3, 1]  # a forced word is 3 tokens; M = 3, then the cap


def test_decoding_is_deterministic():
    cfg = DecodeConfig(tau=0.5, branches=3)
    one = AdaFuse(pair(), cfg).generate("Q").to_dict()
    two = AdaFuse(pair(), cfg).generate("Q").to_dict()
    for t in (one, two):
        for r in t["rounds"]:
            r["seconds"] = 0
            for s in r["steps"]:
                s["seconds"] = 0
        t["seconds"] = 0
        for p in t["prefill"].values():
            p["seconds"] = 0
    assert one == two
    assert Trace.from_dict(one).to_dict() == one


def test_override_commits_another_candidate_and_marks_the_round():
    d, r = first_round(DecodeConfig(tau=0.7, branches=2))
    other = next(i for i in range(len(r.candidates)) if i != r.winner)
    done = d.commit(other)
    assert done.overridden and done.kind == "override" and done.chosen == other
    assert d.trace.output == r.candidates[other].text
    for s in d.sessions:  # every model now continues from the overridden text
        assert s.ids == s.encode(d.trace.output)
    with pytest.raises(ConfigError):
        d.propose() and d.commit(99)


def test_scoring_does_not_change_the_session():
    a, _ = pair()
    s = ModelSession(a, "Q")
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
    s = ModelSession(m, "A:")
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


def test_cache_follows_commits_exactly():
    d = AdaFuse(pair(), DecodeConfig(tau=0.5)).start("Q")
    for _ in d:
        for s in d.sessions if not d.done else []:
            assert s.cached_ids[: len(s.ids)] == s.ids == s.encode(d.trace.output)
            assert s.cache.get_seq_length() == len(s.cached_ids)


def test_bad_input_is_typed():
    with pytest.raises(PromptError):
        AdaFuse(pair(), DecodeConfig()).generate("   ")
    with pytest.raises(ConfigError):
        AdaFuse([pair()[0]], DecodeConfig())
    with pytest.raises(ConfigError):
        AdaFuse(pair(), DecodeConfig(method="greedy"))
    with pytest.raises(PromptError):
        AdaFuse([toy_model("s", V, {}, max_positions=4), pair()[1]], DecodeConfig()).generate("Q Paris Paris Paris")


def test_a_shared_prompt_prefix_is_reused_not_reencoded():
    a, _ = pair()
    head = "Q Paris is nice." * 5
    first = ModelSession(a, head + " Paris")
    second = ModelSession(a, head + " London")
    assert first.prefix_reused == 0 and second.prefix_reused == len(a.tokenizer(head).input_ids)
    fresh = ModelSession(toy_model("a", V, A_RULES), head + " London")  # another model object: no reuse
    assert fresh.prefix_reused == 0
    assert torch.allclose(second.next_logprobs, fresh.next_logprobs)
    assert second.tokens_fed == len(second.ids) - second.prefix_reused


def test_commit_adopts_kv_already_computed_instead_of_feeding_again():
    d, r = first_round(DecodeConfig(tau=0.7, branches=3))
    loser = next(i for i, c in enumerate(r.candidates) if c.proposers == ["b"] and c.text == " London")
    before = [s.forward_passes for s in d.sessions]
    d.commit(loser)  # b explored " London" (kept from its branch); a scored it with its last token fed
    assert [s.forward_passes for s in d.sessions] == before
    for s, rules in zip(d.sessions, (A_RULES, B_RULES)):
        fresh = ModelSession(toy_model("x", V, rules), "Q" + d.trace.output)
        assert s.ids == fresh.ids and torch.allclose(s.next_logprobs, fresh.next_logprobs)


def test_token_union_averages_each_models_probability_of_the_text():
    a = {"Q": {" Paris": 0.7, " London": 0.2}}
    b = {"Q": {" London": 0.5, " Paris": 0.3}}
    _, r = first_round(DecodeConfig(method="token-union", union_top_k=2), pair(a=a, b=b))
    c = {x.text: x for x in r.candidates}
    assert set(c) == {" Paris", " London"} and r.steps[0].mode == "token"
    assert c[" Paris"].fused == pytest.approx(nll((0.7 + 0.3) / 2), abs=1e-5)
    assert c[" London"].fused == pytest.approx(nll((0.2 + 0.5) / 2), abs=1e-5)
    assert c[" London"].nll["b"] == pytest.approx(nll(0.5), abs=1e-5)
    assert r.candidates[r.winner].text == " Paris"


def test_mixture_lets_one_seeded_model_write_each_word():
    tr = AdaFuse(pair(), DecodeConfig(method="mixture", seed=3, max_new_words=6)).generate("Q")
    for r in tr.rounds:
        writers = [s.model for s in r.steps if s.mode != "idle"]
        assert len(writers) == 1 and r.candidates[r.chosen].proposers == writers
    again = AdaFuse(pair(), DecodeConfig(method="mixture", seed=3, max_new_words=6)).generate("Q")
    assert [r.text for r in again.rounds] == [r.text for r in tr.rounds]
    only_a = AdaFuse(pair(), DecodeConfig(method="mixture", weights=(1, 0), temperature=0)).generate("Q")
    assert all(r.steps[1].mode == "idle" for r in only_a.rounds) and only_a.output == " Paris is nice."
    with pytest.raises(ConfigError):
        AdaFuse(pair(), DecodeConfig(method="mixture", weights=(1, 0, 1))).generate("Q")


def test_fixed_span_commits_n_words_from_every_model():
    _, r = first_round(DecodeConfig(method="fixed-span", span_words=2))
    assert [s.mode for s in r.steps] == ["span", "span"]
    assert {c.text for c in r.candidates} == {" Paris is", " London is"}


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
    d = AdaFuse(pair(), DecodeConfig(tau=0.7, branches=3, max_words=1, weights=(1, 20))).start("Q")
    d.step()
    assert Trace.from_dict(d.trace.to_dict()).rounds[0].weights == {"a": 1.0, "b": 20.0}


def test_a_setting_changed_while_a_round_is_pending_applies_from_the_next_round():
    from dataclasses import replace
    cfg = DecodeConfig(tau=0.7, max_words=1, max_new_words=10)
    d = AdaFuse(pair(), cfg).start("Q")
    d.propose()
    assert d.reconfigure(replace(cfg, max_new_words=1)) == {"max_new_words": 1}
    r = d.commit()  # decided and committed under the old cap
    assert r.stop is None and not d.done and d.config.max_new_words == 1
    assert d.trace.changes == [{"from_round": 1, "settings": {"max_new_words": 1}}]
    assert d.commit().stop == "max_new_words"  # the new cap binds from round 1
    with pytest.raises(ConfigError):
        AdaFuse(pair(), cfg).start("Q").reconfigure(replace(cfg, mode="chat"))


def test_per_word_normalization_keeps_the_likelier_word_over_a_long_one_with_a_certain_tail():
    vocab = ["Q", " Bot", "sch", "after", " Nach", " big"]
    rules = {"Q": {" Nach": 0.4, " Bot": 0.35, " big": 0.1}, " Bot": {"sch": 0.99}, "sch": {"after": 0.99},
             "after": {"<eos>": 0.99}, " Nach": {"<eos>": 0.99}, " big": {"<eos>": 0.99}}
    models = toy_model("a", vocab, rules), toy_model("b", vocab, rules)
    per_token = AdaFuse(models, DecodeConfig(branches=2, max_new_words=1)).start("Q").propose()
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
    with pytest.raises(ConfigError, match="normalize"):
        DecodeConfig(normalize="char")


class _Draws:
    """The mixture's draws in a given order (u < 0.5: model a, at equal weights)."""

    def __init__(self, seq):
        self.seq = list(seq)

    def random(self):
        return self.seq.pop(0) if self.seq else 0.1


@pytest.mark.parametrize("b_after_paris", [{" is": 0.6, " big": 0.3}, {" big": 0.6, " is": 0.3}])
def test_a_mixture_writer_catching_up_feeds_the_last_writers_next_token_with_it(monkeypatch, b_after_paris):
    """a writes " Paris" and its next token says " is"; b, drawn next, catches up on " Paris" and " is" in one
    forward: where b writes " is" too that forward gave its next distribution (one forward saved), where it writes
    " big" the guess is cropped away. The text is the same as without the guess either way."""
    from adafuse.methods import Mixture

    def run(guess: bool):
        if not guess:
            monkeypatch.setattr(Mixture, "guess", lambda self, d, m: "")
        models = pair(b=dict(B_RULES, **{" Paris": b_after_paris}))
        d = AdaFuse(models, DecodeConfig(method="mixture", temperature=0), parallel=False).start("Q")
        d.rng = _Draws([0.1, 0.9, 0.1, 0.9, 0.1, 0.9])
        for _ in d:
            pass
        monkeypatch.undo()
        return d.trace

    plain, guessed = run(False), run(True)
    assert [r.text for r in guessed.rounds] == [r.text for r in plain.rounds]
    assert guessed.output == plain.output
    b_plain, b_guessed = plain.rounds[1].steps[1], guessed.rounds[1].steps[1]
    assert b_guessed.draft_tokens == 1  # a's next token, fed with b's catch-up
    if b_after_paris[" is"] > 0.5:
        assert guessed.rounds[1].text == " is"
        assert (b_guessed.accepted_tokens, b_guessed.forward_passes) == (1, b_plain.forward_passes - 1)
    else:
        assert guessed.rounds[1].text == " big"
        assert (b_guessed.accepted_tokens, b_guessed.forward_passes) == (0, b_plain.forward_passes)
    total = lambda tr: sum(s.forward_passes for r in tr.rounds for s in r.steps)  # noqa: E731
    assert total(guessed) <= total(plain)


def test_a_guess_fed_with_a_catch_up_is_taken_kept_through_a_rewind_or_cropped():
    a = toy_model("a", V, A_RULES)
    after_is, after_big = ModelSession(a, "Q Paris is").next_logprobs, ModelSession(a, "Q Paris is big").next_logprobs
    s = ModelSession(a, "Q")
    s.commit(" Paris", guess=" is nice")
    assert s.cached_ids[len(s.ids):] == [a.tokenizer.index[" is"], a.tokenizer.index[" nice"]]
    calls = a.model.calls
    s.rewind()  # a proposer starting over keeps the guess where it is
    lp = s.extend(a.tokenizer.index[" is"])
    assert a.model.calls == calls and s.accepted_tokens == 1
    assert torch.equal(lp, after_is)
    s.extend(a.tokenizer.index[" big"])  # off the guess: " nice" is cropped, " big" fed
    assert a.model.calls == calls + 1
    assert s.cached_ids[len(s.ids):] == [a.tokenizer.index[" is"], a.tokenizer.index[" big"]]
    s.commit(" Paris is big")
    assert torch.equal(s.next_logprobs, after_big)
    # a guess not taken at all is dropped when the proposal ends
    s.commit(" Paris is big.", guess=" London")
    s.settle()
    assert s.cached_ids == s.ids and torch.equal(s.end_logprobs, s.next_logprobs)
