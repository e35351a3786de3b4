"""An evaluation's examples as data (app/analysis.py): labels from the scores, the filter, the CSV, one example's
rows and panel — from real toy decodes (no Gradio)."""
import csv

import pytest

from adafuse import AdaFuse, DecodeConfig
from adafuse.errors import ConfigError
from app import analysis
from tests.toy import toy_pair


@pytest.fixture(scope="module")
def traces():
    a, b = toy_pair()
    cfg = DecodeConfig(max_new_words=4)
    return {"adafuse": AdaFuse([a, b], cfg).generate("Q").to_dict(),
            "greedy:a": AdaFuse([a], DecodeConfig(max_new_words=4, method="greedy")).generate("Q").to_dict(),
            "greedy:b": AdaFuse([b], DecodeConfig(max_new_words=4, method="greedy")).generate("Q").to_dict()}


def row(traces, line, method, prediction, em, f1=None, task="squad", gold=("9th century",)):
    scores = {"em": em} if f1 is None else {"em": em, "f1": f1}
    return {"task": task, "line": line, "method": method, "question": f"passage …\nquestion {line}?",
            "prediction": prediction, "gold": list(gold), "scores": scores, "seconds": 1.0, "trace": traces[method]}


@pytest.fixture
def rows(traces):
    return [row(traces, 10, "adafuse", "10th century", 0.0, 0.5), row(traces, 10, "greedy:a", "9th century", 1.0, 1.0),
            row(traces, 10, "greedy:b", "century", 0.0, 0.67),
            row(traces, 11, "adafuse", "9th century", 1.0, 1.0), row(traces, 11, "greedy:a", "", 0.0, 0.0),
            row(traces, 11, "greedy:b", "tenth", 0.0, 0.0),
            row(traces, 12, "adafuse", "x", 0.0, 0.0), row(traces, 12, "greedy:a", "y", 0.0, 0.0),
            row(traces, 12, "greedy:b", "z", 0.0, 0.0)]


def test_labels_follow_exact_match_not_a_partial_f1(rows):
    table = {r["line"]: r for r in analysis.example_table(rows)}
    # "10th century" shares "century" with the gold (F1 0.5): still wrong, and a member was right
    assert table[10]["labels"] == analysis.WRONG_BUT_MEMBER
    assert table[10]["adafuse"] == "✗ 10th century" and table[10]["greedy:a"] == "✓ 9th century"
    assert table[10]["adafuse f1"] == 0.5 and table[11]["greedy:a"] == "✗ (empty)"
    assert table[11]["labels"] == f"{analysis.RIGHT_ALONE}; {analysis.EMPTY}"
    assert table[12]["labels"] == analysis.ALL_WRONG
    assert list(table[10]) == ["line", "labels", "gold", "adafuse", "adafuse f1",  # the ensemble first
                               "greedy:a", "greedy:a f1", "greedy:b", "greedy:b f1", "question"]
    assert analysis.column_widths(list(table.values())) == ["56px", "150px", "160px", "170px", "90px", "170px",
                                                            "90px", "170px", "90px", "320px"]


def test_filter_shows_only_the_examples_with_that_label(rows):
    assert [r["line"] for r in analysis.example_table(rows, analysis.WRONG_BUT_MEMBER)] == [10]
    assert [r["line"] for r in analysis.example_table(rows, analysis.EMPTY)] == [11]
    assert len(analysis.example_table(rows, analysis.ALL)) == 3
    with pytest.raises(ConfigError, match="unknown filter"):
        analysis.example_table(rows, "wrong-ish")


def test_translation_and_number_tasks_have_their_own_rule(traces):
    t = [row(traces, 1, "adafuse", "Das Wetter", None, task="flores-en-de"),
         row(traces, 1, "greedy:a", "Wetter", None, task="flores-en-de")]
    t[0]["scores"], t[1]["scores"] = {"bleu": 10.0, "chrf": 48.0}, {"bleu": 30.0, "chrf": 61.0}
    assert analysis.labels({r["method"]: r for r in t}) == [analysis.WRONG_BUT_MEMBER]
    assert "chrF ≥ 50" in analysis.rule("flores-en-de") and "final number" in analysis.rule("gsm8k")


def test_csv_has_every_method_full_question_and_scores(rows, tmp_path):
    path = analysis.write_csv(rows, tmp_path / "x.csv")
    got = list(csv.DictReader(path.open(encoding="utf-8")))
    assert [r["line"] for r in got] == ["10", "11", "12"]
    assert got[0]["question"] == "passage …\nquestion 10?" and got[0]["greedy:a: right"] == "1"
    assert got[0]["adafuse: f1"] == "0.5" and got[0]["labels"] == analysis.WRONG_BUT_MEMBER


def test_one_example_opens_with_its_members_beside_it(rows):
    methods = analysis.example_rows(rows, 10)
    trace, singles, others = analysis.split(methods, "adafuse")
    assert trace.models == ["a", "b"] and set(singles) == {"a", "b"} and others == {}
    assert singles["a"].models == ["a"]
    panel = analysis.example_html(methods, "adafuse", ["round 0: it left a"])
    assert "9th century" in panel and "10th century" in panel and "adafuse (opened)" in panel
    assert "✗ wrong" in panel and "✓ right" in panel and "round 0: it left a" in panel
    assert panel.index("adafuse (opened)") < panel.index("greedy:a")
    with pytest.raises(ConfigError, match="has lines 10, 11, 12"):
        analysis.example_rows(rows, 99)
    with pytest.raises(ConfigError, match="did not run"):
        analysis.split(methods, "mixture")


def test_members_placed_on_a_device_are_named_as_their_traces_name_them(rows):
    for r in rows:  # the Evaluate tab with "Device for all models": greedy:a@cpu, whose trace says "a"
        if r["method"].startswith("greedy:"):
            r["method"] += "@cpu"
    methods = analysis.example_rows(rows, 10)
    trace, singles, _ = analysis.split(methods, "adafuse")
    assert set(singles) == {"a", "b"} and analysis.members(rows) == ["a", "b"]
    assert analysis.right_models(methods) == {"a"}
    found, focus, note = analysis.departures_of(trace, singles, methods)
    assert all(d.model in ("a", "b") for d in found) and (focus is None) == (not found) and bool(note) == (not found)
    solo, _, _ = analysis.split(methods, "greedy:a@cpu")
    assert analysis.departures_of(solo, {}, methods)[2] == "a's own decode: one model alone, nothing was fused"
