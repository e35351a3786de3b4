"""What stored traces say (adafuse/harness/stats.py), on hand-built result rows with hand-counted answers."""
from types import SimpleNamespace

import pytest
import torch

from adafuse.harness.stats import (PoolEmbedder, changed_picks, empty_answers, pool_diversity, seconds_per_word,
                                   weight_shares)


def row(method="a", task="nq", **trace):
    trace = {"models": ["s", "g"], "output": "x", "rounds": [], **trace}
    return {"task": task, "method": method, "seconds": 1.0, "trace": trace}


def test_seconds_per_word_and_empty_answers():
    rows = [{**row(output=" ", rounds=[{"words": 1}, {"words": 2}]), "seconds": 2.0},
            {**row(output="Paris", rounds=[{"words": 3}]), "seconds": 4.0},
            {**row("b", rounds=[{"words": 0}]), "seconds": 5.0}]
    assert seconds_per_word(rows) == {("nq", "a"): 1.0}  # 6 s over 6 words; b wrote no word: no rate
    assert empty_answers(rows) == {("nq", "a"): (1, 2), ("nq", "b"): (0, 1)}


def test_weight_shares_average_each_gated_round_share():
    gated = [{"features": [0.1], "weights": {"s": 1.0, "g": 3.0}}, {"features": [0.2], "weights": {"s": 1.0, "g": 1.0}},
             {"features": [], "weights": {"s": 1.0, "g": 9.0}}]  # no features: static weights, not the gate's
    shares = weight_shares([row("gate", rounds=gated), row("plain", rounds=[{"weights": {"s": 1.0}}])])
    assert shares == {("nq", "gate"): ({"s": pytest.approx(0.375), "g": pytest.approx(0.625)}, 2)}


def test_changed_picks_compare_the_embedding_picks_with_the_surface_strategys():
    def step(picked, strategy="embedding"):
        skips = {1: "", 2: "outscored", 3: "", 4: "same text"}  # 4 would be a duplicate: never a surface pick
        return {"selection": {"strategy": strategy, "tokens": [
            {"token": t, "skip": skips[t], "picked": t in picked} for t in (1, 2, 3, 4)]}}
    rounds = [{"steps": [step({1, 3}), step({1, 2}), step({1, 3}, "surface"), {"selection": None}]}]
    assert changed_picks([row(rounds=rounds)]) == {("nq", "a"): (1, 2)}


class Distances:
    """A stand-in embedder: 0.1 per distinct text, none for fewer than two."""

    def mean_distance(self, texts):
        return 0.1 * len(set(texts)) if len(set(texts)) > 1 else None


def test_pool_diversity_counts_distinct_answers_and_distances_over_explore_rounds():
    def rnd(mode, texts):
        return {"steps": [{"mode": "commit"}, {"mode": mode}], "candidates": [{"text": t} for t in texts]}
    rounds = [rnd("explore", [" Paris", "paris.", " Rome"]),  # 2 answers after normalization, 3 texts
              rnd("beam", ["", ""]),                          # the end twice: 1 answer, no distance
              rnd("commit", [" x", " y", " z"])]              # nobody explored: not counted
    got = pool_diversity([row(rounds=rounds)], Distances())[("nq", "a")]
    assert got == {"rounds": 2, "answers": 1.5, "distance_rounds": 1, "distance": pytest.approx(0.3)}
    assert pool_diversity([row(rounds=rounds)], None)[("nq", "a")]["distance"] is None


def test_pool_embedder_takes_the_mean_embedding_row_of_a_texts_tokens():
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # tokens a, b, c

    def tokenizer(text, add_special_tokens):
        return SimpleNamespace(input_ids=["abc".index(ch) for ch in text if ch in "abc"])
    lm = SimpleNamespace(name="toy", tokenizer=tokenizer,
                         model=SimpleNamespace(get_input_embeddings=lambda: SimpleNamespace(weight=weight)))
    e = PoolEmbedder(lm)
    assert e.vector(" ab ").tolist() == [0.5, 0.5] and e.vector("") is None
    assert e.mean_distance(["a", "b"]) == pytest.approx(1.0)            # orthogonal rows
    assert e.mean_distance(["a", "b", "ab"]) == pytest.approx((1 + 2 * (1 - 2 ** -0.5)) / 3)
    assert e.mean_distance(["a", " a", ""]) == 0.0   # two spellings of one token; the bare end has no vector
    assert e.mean_distance(["a", "a", ""]) is None   # one distinct text with tokens
