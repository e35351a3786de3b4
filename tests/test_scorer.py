"""The ensemble as a scorer (adafuse/scorer.py) on toy models with hand-computed log-likelihoods: each model in its own
tokens with the boundary where lm-eval's `hf` model puts it, the fused weighted mean, rolling windows, and the lm-eval
model's loglikelihood / loglikelihood_rolling."""
from __future__ import annotations

import math

import pytest

from adafuse import AdaFuse, DecodeConfig
from adafuse.errors import PromptError
from adafuse.scorer import rolling_windows, split
from tests.toy import toy_model, toy_pair

pytestmark = pytest.mark.unit

# a spells " Paris" as one token; b as " P" + "aris", and reads "Q:" as one token
A = toy_model("a", ["Q", ":", " Paris", " London", " P", "aris"],
              {":": {" Paris": 0.6, " London": 0.3}, " Paris": {"<eos>": 0.9}})
B = toy_model("b", ["Q:", "Q", ":", " P", "aris", " London"],
              {"Q:": {" P": 0.5, " London": 0.4}, " P": {"aris": 0.8}, "aris": {"<eos>": 0.7}})
# c merges the context's last character with the continuation's first: ": P" is one of its tokens
C = toy_model("c", ["Q", ": P", ":", "aris", " Paris"], {":": {"aris": 0.1, " Paris": 0.2}})
L = math.log


def test_each_model_scores_the_continuation_in_its_own_tokens():
    assert split(A, "Q:", " Paris") == ([0, 2, 3], [4])           # <bos> Q : | " Paris"
    assert split(B, "Q:", " Paris") == ([0, 2], [5, 6])           # <bos> "Q:" | " P" "aris"
    paris, london = AdaFuse([A, B]).score("Q:", [" Paris", " London"])
    assert paris.logprob == pytest.approx({"a": L(0.6), "b": L(0.5) + L(0.8)})
    assert paris.tokens == {"a": 1, "b": 2} and paris.bytes == 6
    assert paris.fused == pytest.approx((L(0.6) + L(0.5) + L(0.8)) / 2)
    assert london.logprob == pytest.approx({"a": L(0.3), "b": L(0.4)})
    assert paris.greedy == {"a": True, "b": True} and london.greedy == {"a": False, "b": False}


def test_weights_fuse_the_log_likelihoods_as_they_fuse_a_decodes_scores():
    (paris,) = AdaFuse([A, B], DecodeConfig(weights=(3, 1))).score("Q:", [" Paris"])
    assert paris.fused == pytest.approx((3 * L(0.6) + (L(0.5) + L(0.8))) / 4)


def test_trailing_whitespace_of_the_context_moves_to_the_continuation():
    assert split(A, "Q: ", "Paris") == split(A, "Q:", " Paris")
    (moved,) = AdaFuse([A, B]).score("Q: ", ["Paris"])
    assert moved.logprob == pytest.approx({"a": L(0.6), "b": L(0.5) + L(0.8)})


def test_a_merged_boundary_keeps_the_contexts_tokens_as_lm_evals_hf_model_does():
    """c reads "Q: Paris" as Q, ": P", aris: the context alone is Q, ":" (3 tokens with BOS), so the continuation is
    the whole text's tokens after 3 — "aris" only, scored after "Q:" (hf scores the same tokens)."""
    assert split(C, "Q:", " Paris") == ([0, 2, 4], [5])
    (s,) = AdaFuse([A, C]).score("Q:", [" Paris"])
    assert s.logprob["c"] == pytest.approx(L(0.1)) and s.tokens["c"] == 1


def test_an_empty_context_is_the_models_bos_token():
    assert split(A, "", "Q:") == ([0], [2, 3])  # the continuation's own BOS is the context
    (s,) = AdaFuse([A, B]).score("", ["Q:"])
    assert s.tokens == {"a": 2, "b": 1}


def test_the_fused_decode_says_which_continuation_is_greedy():
    a, b = toy_pair()
    paris, london = AdaFuse([a, b]).score("Q", [" Paris", " London"], is_greedy=True)
    out = AdaFuse([a, b], max_new_words=1).generate("Q").output
    assert (paris.is_greedy, london.is_greedy) == (out.startswith(" Paris"), out.startswith(" London"))
    assert paris.is_greedy != london.is_greedy


def test_rolling_scores_every_token_from_the_start_in_windows_as_lm_eval_rolls_them():
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    for n in range(1, 12):
        for size in (1, 2, 3, 5, 16):
            tokens = list(range(100, 100 + n))
            ours = rolling_windows(tokens, 7, size)
            theirs = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, 7, size, 1)]
            assert ours == [tuple(w) for w in theirs] or ours == theirs, (n, size)
    a = toy_model("a", ["Q", ":", " Paris", " London"], {":": {" Paris": 0.6}, " Paris": {":": 0.5}})
    text = "Q: Paris: Paris"  # <bos> Q : " Paris" : " Paris"
    whole = AdaFuse([a], method="greedy").score_rolling(text)
    # each token after everything before it (one window): p(<bos>|<bos>), p(Q|<bos>) ... from the toy's tables
    rest = 1 / len(a.tokenizer)  # no rule for the context: every token equally likely
    expected = [rest, rest, rest, 0.6, 0.5, 0.6]
    assert whole.logprob["a"] == pytest.approx(sum(map(L, expected))) and whole.tokens["a"] == 6


def test_a_text_longer_than_the_window_rolls_over_windows():
    a = toy_model("a", ["Q", ":", " Paris"], {":": {" Paris": 0.6}}, max_positions=3)
    whole = AdaFuse([a], method="greedy").score_rolling("Q: Paris: Paris: Paris")
    assert whole.tokens["a"] == 8  # <bos> and 7 more, every one predicted once


def test_a_continuation_that_does_not_fit_the_window_is_a_typed_error():
    a = toy_model("a", ["Q", ":", " Paris"], {}, max_positions=2)
    with pytest.raises(PromptError, match="score it rolling"):
        AdaFuse([a], method="greedy").score("Q", [": Paris: Paris"])


def test_lm_evals_loglikelihood_requests_get_the_fused_scores():
    from lm_eval.api.instance import Instance
    from adafuse.harness.lm_eval_model import AdaFuseLM
    reqs = [Instance("loglikelihood", {}, ("Q:", c), i) for i, c in enumerate([" Paris", " London"])]
    fused = AdaFuseLM(models=[A, B], concurrency=2).loglikelihood(reqs, disable_tqdm=True)
    assert [f for f, _ in fused] == pytest.approx([(L(0.6) + L(0.5) + L(0.8)) / 2, (L(0.3) + L(0.4)) / 2])
    alone = AdaFuseLM(models=[A], method="greedy").loglikelihood(reqs, disable_tqdm=True)
    assert alone == [(pytest.approx(L(0.6)), True), (pytest.approx(L(0.3)), False)]
    rolled = AdaFuseLM(models=[A], method="greedy").loglikelihood_rolling(
        [Instance("loglikelihood_rolling", {}, ("Q: Paris",), 0)], disable_tqdm=True)
    assert rolled == [pytest.approx(AdaFuse([A], method="greedy").score_rolling("Q: Paris").logprob["a"])]


def test_a_continuation_a_model_merges_into_the_context_entirely_is_a_typed_error():
    """c reads "Q: P" as Q, ": P": after the context's 3 tokens nothing is left to score (hf asserts there)."""
    with pytest.raises(PromptError, match="adds no token of its own after the context for c"):
        AdaFuse([A, C]).score("Q:", [" P"])


def test_a_learned_gate_weighs_the_models_log_likelihoods(tmp_path):
    """A gate leaning on b (bias 3: b weighs e³ times a) fuses with those weights, as it does a decode's scores."""
    from adafuse.gate import Gate
    g = Gate.zeros(["a", "b"])
    g.b = [0.0, 3.0]
    g.save(tmp_path / "gate.json")
    (paris,) = AdaFuse([A, B], DecodeConfig(gate=str(tmp_path / "gate.json"))).score("Q:", [" Paris"])
    wa, wb = paris.weights["a"], paris.weights["b"]
    assert wb / wa == pytest.approx(math.e ** 3, rel=1e-6)
    assert paris.fused == pytest.approx((wa * L(0.6) + wb * (L(0.5) + L(0.8))) / (wa + wb))
    g.W[1][3] = 5.0  # b's weight rises with its own NLL: read per answer, an answer b dislikes would win b over
    g.save(tmp_path / "gate.json")
    both = AdaFuse([A, B], DecodeConfig(gate=str(tmp_path / "gate.json"))).score("Q:", [" Paris", " London"])
    assert both[0].weights == both[1].weights  # one set of weights for every answer of a context


def test_each_continuation_is_truncated_to_the_window_on_its_own_as_hf_does():
    """A window of 5: "Q: Paris" keeps 4 context tokens before its 1, a 2-token continuation only 3."""
    from adafuse.scorer import fitted
    a = toy_model("a", ["Q", ":", " Paris", " P", "aris"], {}, max_positions=5)
    ctx, _ = split(a, "Q:Q:Q:", " Paris")  # <bos> Q : Q : Q :
    assert fitted(a, ctx, [4], " Paris")[0] == ctx[-5:] and fitted(a, ctx, [5, 6], " P aris")[0] == ctx[-4:]
    one, two = AdaFuse([a], method="greedy").score("Q:Q:Q:", [" Paris", " Paris Paris"])
    assert one.tokens["a"] == 1 and two.tokens["a"] == 2


def test_is_greedy_needs_the_whole_word_and_decodes_the_raw_text():
    from tests.toy_tasks import toy_qa_pair
    paris, pari = AdaFuse(list(toy_qa_pair()), mode="chat").score("Answer:", [" Paris", " Pari"], is_greedy=True)
    assert paris.is_greedy and pari.is_greedy is False  # " Pari" begins " Paris" but is not its word


def test_a_context_of_whitespace_only_is_the_models_first_token():
    """A tokenizer that adds no BOS reads "  " as no token (hf asserts there): the context is its EOS, as empty."""
    from adafuse.models import LocalModel
    from tests.toy import ToyLM, ToyTokenizer
    tok = ToyTokenizer(["Q", ":", " ", "Q:"], bos=None)
    lm = LocalModel.from_objects("nobos", ToyLM(tok, {"<eos>": {"Q": 0.5}}), tok)
    assert split(lm, "  ", "Q:") == ([tok.eos_token_id], [tok.index[" "], tok.index[" "], tok.index["Q:"]])
    (s,) = AdaFuse([lm], method="greedy").score("  ", ["Q:"])
    assert s.tokens["nobos"] == 3
