"""Where and why a fused decode leaves a member (adafuse/divergence.py): hand-built traces with hand-computed
thresholds, the toy pair decoded again with the computed weight, and the counts of the reported Flores rows."""
import copy
import json
import math
import random
from pathlib import Path

import pytest

from adafuse import AdaFuse, DecodeConfig, TraceError, greedy
from adafuse.divergence import (as_trace, departures, divergence, divergences, keep_weight, round_departures,
                                trace_dict, wins)
from adafuse.harness.evaluate import read_rows
from adafuse.trace import Candidate, ModelStep, Round, Trace, Unscored, fused_score, lowest
from adafuse.words import count_words
from experiments.report_weights import departures_table
from tests.toy import toy_pair

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]


# ---- hand-built traces whose fused scores are the decoder's ----
def cand(text, nll, eos=False, n_tokens=None, proposers=(), notes=None, words=None):
    return Candidate(text, eos, list(proposers), dict(nll), n_tokens or dict.fromkeys(nll, 1), None,
                     count_words(text) if words is None else words, notes=notes or {})


def winner(cands):
    return lowest([c.fused for c in cands])


def rnd(index, cands, proposals, chosen=None, weights=None, normalize="token", features=None):
    """A round whose fused scores and winner are the decoder's; `proposals`: per model, its candidate indices."""
    for c in cands:
        c.fused = fused_score(c, weights, normalize) if any(c.nll.values()) else None
    win = winner(cands)
    chosen = win if chosen is None else chosen
    steps = [ModelStep(m, "explore" if len(p) > 1 else "commit", [0.9 if len(p) == 1 else 0.2], list(p))
             for m, p in proposals.items()]
    return Round(index, steps, cands, chosen, win, cands[chosen].text, cands[chosen].words, 0.1,
                 overridden=chosen != win, weights=dict(weights or {}), features=features or {})


def fused_trace(*rounds, models=("a", "b"), **settings):
    return Trace("Q", list(models), {"tau": 0.7, **settings}, dict.fromkeys(models, "raw"), list(rounds),
                 "".join(r.text for r in rounds))


def alone(text, model="b"):
    """`model`'s own decode: one greedy round that wrote `text` and ended."""
    c = Candidate(text, True, [model], {}, {}, None, count_words(text))
    return Trace("Q", [model], {"method": "greedy"}, {model: "raw"},
                 [Round(0, [ModelStep(model, "greedy", [0.9], [0])], [c], 0, 0, text, c.words, 0.1)], text)


def sky(is_a=0.1, is_b=1.0, was_a=2.0, was_b=0.4, weights=None, normalize="token", was_tokens=1, **settings):
    """" The sky" committed, then " is" (a's) against " was" (b's) and the end of the answer (b's)."""
    r0 = rnd(0, [cand(" The sky", {}, proposers="ab")], {"a": [0], "b": [0]})
    r1 = rnd(1, [cand(" is", {"a": is_a, "b": is_b}, proposers="a"),
                 cand(" was", {"a": was_a, "b": was_b}, n_tokens={"a": 1, "b": was_tokens}, proposers="b"),
                 cand("", {"a": 3.0, "b": 1.0}, eos=True, proposers="b")],
             {"a": [0], "b": [1, 2]}, weights=weights, normalize=normalize)
    return fused_trace(r0, r1, normalize=normalize, **settings)


def rescored_winner(r, weights, normalize="token"):
    """The winner of round r re-scored with `weights` by the library's own fused score."""
    return winner([Candidate(**{**c.__dict__, "fused": fused_score(c, weights, normalize)}) for c in r.candidates])


# ---- one decode against the member's own ----
def test_identical_answers_have_no_divergence():
    t = sky()
    assert t.output == " The sky is"
    assert divergence(t, alone(" The sky is"), "b") is None


def test_the_threshold_is_the_hand_computed_weight_and_rescoring_with_it_keeps_the_members_word():
    t = sky()
    d = divergence(t, alone(" The sky was blue."), "b")
    assert (d.round, d.position, d.words, d.solo) == (1, 8, 2, " was blue.")
    assert (d.chosen, d.chosen_text, d.member, d.member_text, d.first, d.source) == (0, " is", 1, " was", 1,
                                                                                      "solo path")
    assert d.nll == {"a": {"chosen": 0.1, "member": 2.0}, "b": {"chosen": 1.0, "member": 0.4}}
    assert (d.fused_chosen, d.fused_member) == (pytest.approx(0.55), pytest.approx(1.2))
    assert d.margins == {"a": 0.9, "b": 0.2} and d.tau == 0.7
    assert (d.weights, d.weights_from, d.normalize, d.overridden) == ({"a": 1.0, "b": 1.0}, "equal", "token", False)
    # " was" beats " is" when 2.0 + 0.4·x < 0.1 + 1.0·x: x > 19/6 (the end, (3 + x)/(1 + x), never wins)
    assert d.keep_weight == pytest.approx(19 / 6, rel=1e-12) and d.keep_range[1] is None
    assert d.keep_share == pytest.approx(19 / 25) and d.keep_factor == pytest.approx(19 / 6) and d.keep_reason == ""
    r = t.rounds[1]
    assert rescored_winner(r, {"a": 1.0, "b": d.keep_weight * (1 + 1e-9)}) == 1
    assert rescored_winner(r, {"a": 1.0, "b": d.keep_weight * (1 - 1e-9)}) == 0
    assert d.sentence() == ("Round 1: the ensemble chose “ is” (fused 0.55) over b's “ was” (fused 1.20) (NLL per "
                            "token, chosen vs its: a 0.10 vs 2.00, b 1.00 vs 0.40); b's weight above 3.17 (instead of "
                            "1, ×3.2; a 76 % share) would have kept its word.")


def test_per_word_normalization_and_settings_weights_enter_the_threshold():
    # per word, b's " was" of 2 tokens counts 0.4·2 = 0.8: 2.0 + 0.8·x < 0.1 + 1.0·x from x > 9.5
    t = sky(was_tokens=2, normalize="word")
    d = divergence(t, alone(" The sky was"), "b")
    assert d.normalize == "word" and d.nll["b"]["member"] == pytest.approx(0.8)
    assert d.keep_weight == pytest.approx(9.5)
    assert rescored_winner(t.rounds[1], {"b": 9.5 * 1.000001}, "word") == 1
    assert rescored_winner(t.rounds[1], {"b": 9.5 * 0.999999}, "word") == 0
    # weights a=2, b=1 from the settings: 2·2.0 + 0.4·x < 2·0.1 + x from x > 19/3
    t = sky(weights={"a": 2.0, "b": 1.0})
    d = divergence(t, alone(" The sky was"), "b")
    assert (d.weights, d.weights_from) == ({"a": 2.0, "b": 1.0}, "settings")
    assert d.keep_weight == pytest.approx(19 / 3) and d.keep_share == pytest.approx((19 / 3) / (19 / 3 + 2))
    # the same weights read from the settings of a trace that predates per-round weights
    t.rounds[1].weights = {}
    t.settings["weights"] = [2.0, 1.0]
    assert divergence(t, alone(" The sky was"), "b").keep_weight == pytest.approx(19 / 3)
    # a gate's weights: the round's record, with the features the gate saw
    t.rounds[1].weights, t.rounds[1].features = {"a": 2.0, "b": 1.0}, {"a": [0.1], "b": [0.2]}
    assert divergence(t, alone(" The sky was"), "b").weights_from == "gate"


def test_a_member_that_prefers_the_chosen_word_keeps_its_own_at_a_lower_weight_or_not_at_all():
    # b prefers " is" itself (0.1 < 0.9), a prefers " was": " was" wins when 0.5 + 0.9·x < 2.0 + 0.1·x, x < 1.875
    t = sky(is_a=2.0, is_b=0.1, was_a=0.5, was_b=0.9, weights={"a": 1.0, "b": 3.0})
    d = divergence(t, alone(" The sky was"), "b")
    assert d.keep_weight == pytest.approx(1.875) and d.keep_range == (0.0, pytest.approx(1.875))
    assert d.keep_factor == pytest.approx(0.625) and "b's weight below 1.88 (instead of 3, ×0.63" in d.sentence()
    # both models score " is" lower: no weight of b keeps " was"
    t = sky(is_a=0.1, is_b=0.3)
    d = divergence(t, alone(" The sky was"), "b")
    assert d.keep_weight is None and d.keep_range is None
    assert d.keep_reason == "it scores the chosen word lower itself"
    assert d.sentence().endswith("no weight of b would have kept it: it scores the chosen word lower itself.")
    assert all(not wins(t.rounds[1].candidates, 1, {"a": 1.0, "b": 10 ** e}) for e in range(-3, 4))


def test_where_the_answers_part_single_ended_earlier_or_later_inside_a_span_and_inside_a_word():
    # the member ended after " The sky": its candidate is the bare end of the answer
    d = divergence(sky(), alone(" The sky"), "b")
    assert (d.round, d.member, d.member_text, d.member_eos, d.solo) == (1, 2, "", True, "")
    assert "over b's “⏎ end”" in d.sentence()
    # the ensemble ended first: its last round chose the end, the member's " was" goes on
    t = sky(is_a=3.0, is_b=3.0)
    t.rounds[1].candidates[2].nll = {"a": 0.1, "b": 0.2}
    t = fused_trace(t.rounds[0], rnd(1, t.rounds[1].candidates, {"a": [2], "b": [1, 2]}))
    assert t.output == " The sky" and t.rounds[1].candidates[t.rounds[1].chosen].eos
    d = divergence(t, alone(" The sky was blue."), "b")
    assert (d.round, d.chosen_eos, d.member_text, d.source) == (1, True, " was", "solo path")
    assert d.sentence().startswith("Round 1: the ensemble chose “⏎ end”")
    # inside a span of three words: the member's candidate is the span on its own path
    r0 = rnd(0, [cand(" The sky is", {"a": 0.2, "b": 0.9}, proposers="a"),
                 cand(" The sky was", {"a": 1.5, "b": 0.3}, proposers="b")], {"a": [0], "b": [1]})
    d = divergence(fused_trace(r0), alone(" The sky was blue."), "b")
    assert (d.round, d.member_text, d.keep_weight) == (0, " The sky was", pytest.approx(1.3 / 0.6))
    # " a" against " an": the round that ended the word, not the next one that starts with a space
    r0 = rnd(0, [cand(" a", {"a": 0.2, "b": 0.9}, proposers="a"), cand(" an", {"a": 1.0, "b": 0.3}, proposers="b"),
                 cand(" a", {"a": 0.9, "b": 0.9}, eos=True, proposers="b")], {"a": [0], "b": [1, 2]})
    r1 = rnd(1, [cand(" glimpse", {"a": 0.1, "b": 0.1}, proposers="ab")], {"a": [0], "b": [0]})
    d = divergence(fused_trace(r0, r1), alone(" an insight"), "b")
    assert (d.round, d.member, d.member_text) == (0, 1, " an")


def test_a_member_word_not_in_the_pool_its_first_proposal_instead_or_its_first_proposal_chosen():
    t = sky()
    d = divergence(t, alone(" The sky looks grey.", "c"), "c")  # c is no member: nothing of it in the pool
    assert (d.member, d.first, d.source, d.member_text, d.keep_weight) == (None, None, "not in the pool", " looks",
                                                                          None)
    assert d.sentence() == ("Round 1: the ensemble chose “ is” (fused 0.55); c's own next word “ looks” was not in "
                            "the pool.")
    d = divergence(t, alone(" The sky looks grey."), "b")  # b proposed " was" first, not on its own path
    assert (d.member, d.source) == (1, "first proposal") and "over b's first proposal “ was”" in d.sentence()
    d = divergence(t, alone(" The sky isn't"), "a")  # a's first proposal was chosen, yet alone it wrote " isn't"
    assert (d.member, d.chosen) == (0, 0) and d.keep_reason.startswith("the ensemble took its own first proposal")
    assert d.sentence() == ("Round 1: the ensemble chose “ is” (fused 0.55), a's first proposal too, where alone it "
                            "went on with “ isn't”.")


def test_no_threshold_where_the_round_does_not_fuse_a_weighted_mean_or_a_model_rules_the_word_out():
    t = sky()
    t.rounds[1].candidates[1].fused = 0.9  # e.g. token union: −log of the mean probability
    assert divergence(t, alone(" The sky was"), "b").keep_reason.startswith("this round's fused scores are not")
    t = sky()
    c = t.rounds[1].candidates[1]
    c.nll["a"], c.notes["a"] = None, Unscored.ZERO_PROB
    c.fused = fused_score(c)
    d = divergence(t, alone(" The sky was"), "b")
    assert d.fused_member is None and d.keep_reason == "a counted model gives its word probability 0"


def test_an_overridden_round_says_the_members_word_scored_lowest_already():
    t = sky(is_a=2.0, is_b=2.0)  # " was" wins; a pick by hand committed " is"
    r1 = t.rounds[1]
    assert r1.winner == 1
    r1.chosen, r1.overridden, r1.text, t.output = 0, True, " is", " The sky is"
    d = divergence(t, alone(" The sky was"), "b")
    assert d.overridden and d.keep_weight is None and "overridden by hand" in d.keep_reason


def test_traces_rows_and_dicts_give_the_same_answer_and_nothing_is_changed():
    t, s = sky(), alone(" The sky was blue.")
    before = (copy.deepcopy(t.to_dict()), copy.deepcopy(s.to_dict()))
    d = divergence(t, s, "b")
    assert divergence(t.to_dict(), s.to_dict(), "b") == d
    assert divergence({"task": "x", "trace": t.to_dict()}, {"trace": s.to_dict()}, "b") == d
    assert (t.to_dict(), s.to_dict()) == before
    assert json.loads(json.dumps(d.to_dict()))["keep_weight"] == pytest.approx(19 / 6)
    assert trace_dict(t) == t.to_dict() and as_trace({"trace": t}) is t
    with pytest.raises(TraceError, match="expected a trace"):
        divergence(42, s, "b")
    bad = t.to_dict()
    bad["rounds"][1]["chosen"] = 7
    with pytest.raises(TraceError):
        divergence(bad, s, "b")


def test_the_threshold_is_exact_on_random_pools_of_three_models():
    """Random pools, weights and normalizations (unscored and zero-probability entries included): just inside the
    range the member's word wins and just outside it loses; where no weight keeps it, none on a wide grid does."""
    rng = random.Random(7)
    for _ in range(300):
        models = ["a", "b", "c"]
        cands = []
        for j in range(rng.randint(2, 5)):
            nll, notes = {}, {}
            for m in models:
                roll = rng.random()
                nll[m] = None if roll < 0.08 else rng.uniform(0.0, 5.0)
                if nll[m] is None:
                    notes[m] = Unscored.ZERO_PROB if roll < 0.02 else Unscored.NO_TOKENS
            eos = rng.random() < 0.2
            cands.append(cand(f" w{j}", nll, eos=eos, notes=notes, n_tokens={m: rng.randint(1, 4) for m in models},
                              words=rng.randint(0, 3)))
        weights = {m: rng.choice([0.0, 0.5, 1.0, 2.0, 9.0]) for m in models}
        weights["b"] = rng.choice([0.5, 1.0, 3.0])
        norm = rng.choice(["token", "word"])
        for c in cands:
            c.fused = fused_score(c, weights, norm)
        chosen = winner(cands)
        member = rng.choice([i for i in range(len(cands)) if i != chosen])
        kw, span, why = keep_weight(cands, chosen, member, "b", weights, norm)
        if kw is None:
            if "scores" in why or "decide" in why or "probability 0" in why:
                assert not any(wins(cands, member, {**weights, "b": 10 ** (e / 4)}, norm) for e in range(-16, 17))
            continue
        lo, hi = span
        inside, outside = (kw * (1 + 1e-7), kw * (1 - 1e-7)) if kw == lo else (kw * (1 - 1e-7), kw * (1 + 1e-7))
        assert wins(cands, member, {**weights, "b": inside}, norm)
        assert not wins(cands, member, {**weights, "b": outside}, norm)


TOY_B = {"Q": {" London": 0.6, " Paris": 0.1, "Paris": 0.1, "\n": 0.04}, " London": {" is": 0.9},
         " Paris": {" is": 0.3, " big": 0.3}, " is": {" nice": 0.5, " big": 0.4}, " nice": {".": 0.99},
         ".": {"<eos>": 0.99}}


@pytest.mark.parametrize("normalize", ["token", "word"])
def test_decoding_again_with_the_computed_weight_keeps_the_members_word(normalize):
    a, b = toy_pair(b=TOY_B)
    fused = AdaFuse([a, b], DecodeConfig(normalize=normalize)).generate("Q")
    own = greedy(b, "Q")
    d = divergence(fused, own, "b")
    assert (fused.output, own.output) == (" Paris is nice.", " London is nice.")
    assert (d.round, d.member_text, d.source, d.keep_range[1]) == (0, " London", "solo path", None)
    above = AdaFuse([a, b], DecodeConfig(normalize=normalize, weights=(1.0, d.keep_weight * 1.001))).generate("Q")
    below = AdaFuse([a, b], DecodeConfig(normalize=normalize, weights=(1.0, d.keep_weight * 0.999))).generate("Q")
    assert divergence(above, own, "b") is None
    assert divergence(below, own, "b").round == 0 and below.output == fused.output
    assert divergence(fused, greedy(a, "Q"), "a") is None
    rows = [{"task": "t", "method": "adafuse", "line": 1, "trace": fused.to_dict()},
            {"task": "t", "method": "greedy:b", "line": 1, "trace": own.to_dict()}]
    assert divergences(rows, "b") == {("t", "adafuse", 1): d}


# ---- over evaluation rows ----
def row(method, task, rounds, models=("s", "g"), line=1):
    return {"task": task, "method": method, "line": line, "trace": {"models": list(models), "output": "x",
                                                                    "rounds": rounds}}


def dcand(text, nll_g=None, tokens_g=1, eos=False):
    return {"text": text, "eos": eos, "nll": {} if nll_g is None else {"g": nll_g}, "n_tokens": {"g": tokens_g}}


def drnd(chosen, proposals, candidates, words=1):
    return {"chosen": chosen, "candidates": candidates, "words": words,
            "steps": [{"model": "s", "proposals": [0]}, {"model": "g", "proposals": proposals}]}


HAND_ROUNDS = [drnd(0, [0, 1], [dcand(" a"), dcand(" b")]),                               # its own first word: kept
               drnd(1, [0, 1], [dcand(" a", 1.0, 1), dcand(" abc", 0.5, 4)], words=2),    # its own longer word
               drnd(1, [0, 2], [dcand(" a", 1.0, 2), dcand(" z", 2.0, 1), dcand(" y")]),  # the other model's word
               drnd(1, [0], [dcand(" a", 1.0), dcand("", eos=True)], words=0),          # the bare end, no NLL of g
               drnd(0, [], [dcand(" a")])]                                               # g proposed nothing


def test_departures_say_why_the_chosen_candidate_is_not_the_models_first_proposal():
    rows = [row("w", "flores-de-en", HAND_ROUNDS), row("w", "flores-de-en", HAND_ROUNDS[:1], models=["s"])]
    assert departures(rows, "g") == {("flores-de-en", "w"): {
        "examples": 1, "rounds": 5, "longer": 1, "own other": 0, "other": 1, "ended": 1,
        "prefers": 1,        # g's averaged NLL: 0.5 < 1.0 for its longer word; 2.0 > 1.0 for the other model's
        "kept by a sum": 1}}  # summed: 0.5·4 = 2 > 1·1 (kept its first word); 2·1 = 2 > 1·2 is False


def test_round_departures_say_where_each_round_is():
    recs = round_departures([row("w", "nq", HAND_ROUNDS, line=3)], "g")
    assert [(r["round"], r["rounds"], r["words"], r["left"]) for r in recs] == [
        (0, 5, 0, None), (1, 5, 1, "longer"), (2, 5, 3, "other"), (3, 5, 4, "ended"), (4, 5, 4, None)]
    assert [(r["prefers"], r["kept by a sum"]) for r in recs] == [(None, None), (True, True), (False, False),
                                                                   (None, None), (None, None)]
    assert {(r["task"], r["method"], r["line"]) for r in recs} == {("nq", "w", 3)}
    assert round_departures([row("w", "nq", HAND_ROUNDS, models=["s"])], "g") == []


@pytest.fixture(scope="module")
def flores_en_de():
    return read_rows(ROOT / "results" / "flores-en-de.jsonl.gz")


def test_the_reported_flores_rows_give_the_reports_counts(flores_en_de):
    """docs/results.md: adafuse+weights leaves gemma3-270m's own first word in 127 (30 %) of 426 rounds."""
    rows = [r for r in flores_en_de if r["method"] == "adafuse+weights"]
    assert departures(rows, "gemma3-270m") == {("flores-en-de", "adafuse+weights"): {
        "examples": 30, "rounds": 426, "longer": 78, "own other": 18, "other": 31, "ended": 0, "prefers": 103,
        "kept by a sum": 63}}
    table = departures_table(rows, ["flores-en-de"], ["adafuse+weights"], "gemma3-270m")
    assert table[0]["left gemma3-270m's word"] == "127 (30 %)"
    recs = round_departures(rows, "gemma3-270m")
    assert len(recs) == 426 and sum(r["left"] is not None for r in recs) == 127


def test_every_threshold_on_the_reported_flores_rows_is_exact(flores_en_de):
    rows = [r for r in flores_en_de if r["method"] in ("adafuse+weights", "adafuse", "greedy:gemma3-270m")]
    found = divergences(rows, "gemma3-270m")
    assert len(found) == 60 and sum(d is not None for d in found.values()) > 30
    checked = 0
    for (task, method, line), d in found.items():
        if d is None or d.keep_weight is None:
            continue
        r = as_trace(next(r for r in rows if (r["method"], r["line"]) == (method, line))).rounds[d.round]
        side = 1 if d.keep_weight == d.keep_range[0] else -1
        assert wins(r.candidates, d.member, {**d.weights, d.model: d.keep_weight * (1 + side * 1e-7)}, d.normalize)
        assert not wins(r.candidates, d.member, {**d.weights, d.model: d.keep_weight * (1 - side * 1e-7)},
                        d.normalize)
        assert math.isfinite(d.keep_share)
        checked += 1
    assert checked >= 20
