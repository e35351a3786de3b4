"""Speculative proposals: a confident model takes the tokens of the other models' spans (and of prompt lookup) it
verified in one batched forward; the decode's decisions are the same, only the cost fields differ."""
import pytest

from adafuse import AdaFuse, DecodeConfig
from tests.real import flores_prompt, gsm8k_prompt
from tests.toy import toy_model


COST = ("seconds", "forward_passes", "tokens_fed", "cached_tokens", "draft_tokens", "accepted_tokens",
        "verify_passes", "scores_from_drafts")


V = ["Q", " Paris", " London", ".", " is", " nice", " big", "\n"]
A = {"Q": {" Paris": 0.9}, " Paris": {" is": 0.9}, " is": {" nice": 0.9}, " nice": {".": 0.9}, ".": {"<eos>": 0.9}}


# b agrees on the first words, then wants " big": it takes a's draft up to there and writes on alone
B = {"Q": {" Paris": 0.95}, " Paris": {" is": 0.95}, " is": {" big": 0.9}, " big": {".": 0.9}, ".": {"<eos>": 0.9}}


def decisions(tr) -> dict:
    """A trace without what it cost (and without the speculate setting itself)."""
    d = tr.to_dict()
    for key in ("seconds", "workers"):
        d.pop(key)
    d["settings"].pop("speculate")
    for p in d["prefill"].values():
        p.pop("seconds")
    for r in d["rounds"]:
        r.pop("seconds")
        for s in r["steps"]:
            for key in COST:
                s.pop(key)
    return d


def both_ways(models, prompt, **settings):
    out = []
    for speculate in (False, True):
        for lm in models:
            lm.prefixes.clear()
        out.append(AdaFuse(models, DecodeConfig(speculate=speculate, **settings)).generate(prompt))
    return out


def forwards(tr) -> int:
    return sum(s.forward_passes for r in tr.rounds for s in r.steps)


def test_a_model_takes_the_verified_tokens_of_the_span_before_it_and_decides_the_same():
    plain, spec = both_ways([toy_model("a", V, A), toy_model("b", V, B)], "Q", tau=0.5, max_words=3)
    assert decisions(plain) == decisions(spec)  # bit for bit: every margin, NLL, pool, choice
    b = spec.rounds[0].steps[1]
    # b verified a's " Paris is nice." (4 tokens) in one forward and took " Paris", " is" from it
    assert (b.verify_passes, b.draft_tokens, b.accepted_tokens) == (1, 4, 2)
    assert spec.rounds[0].steps[0].verify_passes == 0  # a went first: nothing to verify
    # 2 tokens taken for 1 verifying forward, and b scores a's span from that forward: no scoring forward of its own
    assert forwards(spec) == forwards(plain) - 2
    assert b.forward_passes == [s for s in plain.rounds[0].steps if s.model == "b"][0].forward_passes - 2
    assert b.scores_from_drafts == 1 and spec.speculation("b")["forwards saved"] == 2
    assert spec.output == plain.output


def test_a_winning_span_taken_from_a_draft_is_committed_without_feeding_it_again():
    plain, spec = both_ways([toy_model("a", V, A), toy_model("b", V, A)], "Q", tau=0.5, max_words=3)
    assert decisions(plain) == decisions(spec)
    r = spec.rounds[0]
    assert r.steps[1].accepted_tokens == 4 and len(r.candidates) == 1  # the same span: nothing to score
    assert forwards(spec) == forwards(plain) - 3


def test_side_by_side_a_model_verifies_only_its_own_span_left_from_the_last_round():
    # a proposes " Paris is nice." (M=3), b only " Paris is" (its margin drops): b's span wins, a's " nice." is left
    b_rules = dict(A, **{" is": {" nice": 0.5, " big": 0.45}})
    out = []
    for speculate in (False, True):
        models = [toy_model("a", V, A), toy_model("b", V, b_rules)]
        out.append(AdaFuse(models, DecodeConfig(tau=0.5, max_words=3, speculate=speculate), parallel=True,
                           threads=1).generate("Q"))
    plain, spec = out
    assert spec.workers.startswith("parallel") and decisions(plain) == decisions(spec)
    assert [s.verify_passes for s in spec.rounds[0].steps] == [0, 0]  # nothing proposed yet when both start
    assert spec.rounds[0].text == " Paris is"  # a's left-over " nice." is its draft in round 1
    assert spec.rounds[1].steps[0].draft_tokens == 2 and spec.rounds[1].steps[0].accepted_tokens == 2


def test_prompt_lookup_gives_the_first_model_a_draft_too():
    # the answer repeats what followed "Q Paris" in the prompt: the model that goes first (no span before it) verifies
    # that continuation in one forward and takes its tokens; with the models' spans as the only drafts it has none
    prompt = "Q Paris is nice.\nQ Paris"
    runs = {}
    for lookup in (False, True):
        models = [toy_model("a", V, A), toy_model("b", V, A)]
        runs[lookup] = AdaFuse(models, DecodeConfig(tau=0.5, max_words=3, speculate=True,
                                                    draft_lookup=lookup)).generate(prompt)
    plain = AdaFuse([toy_model("a", V, A), toy_model("b", V, A)], DecodeConfig(tau=0.5, max_words=3, speculate=False)
                    ).generate(prompt)
    assert plain.output == " is nice."
    first = {k: tr.rounds[0].steps[0] for k, tr in runs.items()}
    assert first[False].verify_passes == 0
    assert first[True].verify_passes == 1 and first[True].accepted_tokens == 3  # " is", " nice", "."
    assert forwards(runs[True]) < forwards(runs[False]) < forwards(plain)
    for tr in runs.values():
        d = decisions(tr)
        d["settings"].pop("draft_lookup")
        p = decisions(plain)
        p["settings"].pop("draft_lookup")
        assert d == p  # bit for bit, as without speculation


@pytest.mark.parametrize("case", ["flores-de-en", "gsm8k"])
def test_the_bundled_pair_decodes_the_same_with_fewer_forward_passes(pair, case):
    if case == "gsm8k":
        plain, spec = both_ways(pair, gsm8k_prompt(2, shots=1), stop=("\n\nQuestion:",), max_new_words=12, branches=2)
    else:
        plain, spec = both_ways(pair, flores_prompt(1), stop=("\n",), max_new_words=12)
    # Same words, pools and choices. A draft's tokens come from a k-token forward whose CPU kernels sum in another
    # order than k one-token forwards (measured ~1e-5 apart), so the floats agree to a tolerance, not bit for bit.
    a, b = decisions(plain), decisions(spec)
    assert a["output"] == b["output"] and len(a["rounds"]) == len(b["rounds"])
    for ra, rb in zip(a["rounds"], b["rounds"]):
        assert [(c["text"], c["eos"], c["proposers"]) for c in ra["candidates"]] == \
               [(c["text"], c["eos"], c["proposers"]) for c in rb["candidates"]]
        assert (ra["chosen"], ra["text"]) == (rb["chosen"], rb["text"])
        for sa, sb in zip(ra["steps"], rb["steps"]):
            assert (sa["mode"], sa["proposals"]) == (sb["mode"], sb["proposals"])
            assert sa["margins"] == pytest.approx(sb["margins"], abs=1e-4)
        for ca, cb in zip(ra["candidates"], rb["candidates"]):
            assert ca["nll"] == pytest.approx(cb["nll"], abs=1e-4)
    accepted = sum(s.accepted_tokens for r in spec.rounds for s in r.steps)
    assert accepted > 0 and forwards(spec) < forwards(plain)
