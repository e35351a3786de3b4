"""Methods compared on the same examples (adafuse/harness/compare.py): per-example scores, the paired bootstrap."""
import pytest

from adafuse.harness.compare import (format_difference, main_score, mean_or_none, paired_difference,
                                     per_example_scores)


def test_per_example_scores_put_every_task_on_a_0_to_100_scale():
    rows = [{"task": "nq", "method": "a", "line": 1, "scores": {"em": 1.0}},
            {"task": "nq", "method": "a", "line": 2, "scores": {}},  # no main metric: scored 0
            {"task": "flores-de-en", "method": "a", "line": 1, "scores": {"chrf": 45.5, "bleu": 20.0}},
            {"task": "not-a-task", "method": "a", "line": 1, "scores": {"em": 1.0}}]
    assert per_example_scores(rows) == {("nq", "a"): {1: 100.0, 2: 0.0}, ("flores-de-en", "a"): {1: 45.5}}


def test_paired_difference_uses_shared_examples_only():
    a = {1: 100.0, 2: 0.0, 3: 100.0, 7: 100.0}
    b = {1: 0.0, 2: 0.0, 3: 100.0, 4: 50.0}
    d = paired_difference(a, b)
    assert (d["n"], d["wins"], d["ties"], d["losses"]) == (3, 1, 2, 0)
    assert d["mean"] == pytest.approx(100 / 3)
    assert 0.0 <= d["low"] <= d["mean"] <= d["high"] <= 100.0
    same = paired_difference({i: float(i % 2) for i in range(40)}, {i: float(i % 2) for i in range(40)})
    assert (same["low"], same["high"], same["ties"]) == (0.0, 0.0, 40)
    assert paired_difference({1: 1.0}, {2: 1.0}) is None
    big = paired_difference({i: 100.0 for i in range(50)}, {i: 0.0 if i < 45 else 100.0 for i in range(50)})
    assert big["low"] > 0  # 45 wins, 5 ties: clearly better
    assert paired_difference(a, b) == d  # seeded: the same interval every time


def test_a_difference_in_one_cell_and_summary_lookups():
    d = {"mean": 1.5, "low": -0.84, "high": 3.96, "wins": 7, "ties": 30, "losses": 3}
    assert format_difference(d) == "+1.5 [-0.8, +4.0] 7/30/3"
    summary = {("nq", "a"): {"em": 40.0, "f1": 55.0}, ("flores-de-en", "a"): {"chrf": 30.0, "bleu": 9.0}}
    assert main_score(summary, "nq", "a") == 40.0 and main_score(summary, "flores-de-en", "a") == 30.0
    assert main_score(summary, "nq", "b") is None
    assert mean_or_none([1.0, None, 2.0]) == 1.5 and mean_or_none([None]) is None and mean_or_none([]) is None
