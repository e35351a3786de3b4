"""The divergence views (app/divergence_view.py): the where-and-why figure over evaluation rows, with the counts of
the reported Flores rows, and one divergence as escaped HTML."""
from pathlib import Path

import pytest

from adafuse.divergence import departures, divergence
from adafuse.harness.evaluate import read_rows
from app.divergence_view import LEFT_NAMES, divergence_figure, divergence_html
from tests.test_divergence import HAND_ROUNDS, alone, row, sky

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]


def bars(fig):
    """{(method label, cause name): (count, rounds, % of rounds)} of the figure's left panel."""
    return {(y, t.name): (*cd, x) for t in fig.data if t.type == "bar" for y, x, cd in zip(t.y, t.x, t.customdata)}


def test_the_figure_shows_why_per_method_and_where_per_round_from_the_departures():
    rows = [row("w<1>", "nq", HAND_ROUNDS, line=1), row("w<1>", "nq", HAND_ROUNDS[:2], line=2),
            row("v", "nq", HAND_ROUNDS[:1], line=1), row("greedy:g", "nq", HAND_ROUNDS[:1], models=["g"])]
    fig = divergence_figure(rows, "g")
    got = bars(fig)
    w = "w&lt;1&gt;"  # a method's name as plotly shows it, tags escaped
    assert got[(w, LEFT_NAMES["longer"])] == (2, 7, pytest.approx(200 / 7))  # round 1 of both answers
    assert got[(w, LEFT_NAMES["other"])][:2] == (1, 7) and got[("v", LEFT_NAMES["other"])][:2] == (0, 1)
    counts = departures(rows[:3], "g")
    assert {k: v[0] for k, v in got.items() if k[1] == LEFT_NAMES["ended"]} == {
        (w, LEFT_NAMES["ended"]): counts[("nq", "w<1>")]["ended"], ("v", LEFT_NAMES["ended"]): 0}
    assert not any(k[0] == "greedy:g" for k in got)  # the member alone never leaves itself
    where = {t.name: t for t in fig.data if t.type == "scatter"}
    # rounds 0 and 1 are reached by both answers of w<1>, later ones by one (under max(2, 10 % of 2)): left out
    assert list(where[w].x) == [0, 1] and list(where[w].y) == [0.0, 100.0]
    assert [list(c) for c in where[w].customdata] == [[0, 2], [2, 2]]
    hovers = [h for t in fig.data for h in t.hovertext]
    assert not any("<1>" in h for h in hovers) and sum(h.startswith(w + ":") for h in hovers) == 4 + 2
    assert "g's own word" in fig.layout.title.text and fig.layout.barmode == "stack"
    assert fig.layout.xaxis2.dtick == 1 and fig.layout.xaxis2.tick0 == 0  # one tick per round, never "0 0 1 1"


def test_the_figure_over_two_tasks_labels_each_method_with_its_task_and_is_empty_without_the_member():
    rows = [row("w", "nq", HAND_ROUNDS), row("w", "squad", HAND_ROUNDS)]
    assert {k[0] for k in bars(divergence_figure(rows, "g"))} == {"w · nq", "w · squad"}
    empty = divergence_figure(rows, "nobody")
    assert not empty.data and "nobody among several models" in empty.layout.annotations[0].text


def test_the_figure_over_the_reported_flores_rows_says_127_of_426_for_adafuse_weights():
    rows = [r for r in read_rows(ROOT / "results" / "flores-en-de.jsonl.gz")
            if r["method"] in ("adafuse+weights", "adafuse", "greedy:gemma3-270m")]
    got = bars(divergence_figure(rows, "gemma3-270m"))
    mine = {cause: v for (label, cause), v in got.items() if label == "adafuse+weights"}
    assert sum(v[0] for v in mine.values()) == 127 and {v[1] for v in mine.values()} == {426}
    assert sum(v[2] for v in mine.values()) == pytest.approx(100 * 127 / 426)
    assert mine[LEFT_NAMES["longer"]][0] == 78 and mine[LEFT_NAMES["other"]][0] == 31


def test_one_divergence_as_html_is_escaped_and_names_every_models_scores():
    t = sky()
    t.rounds[1].candidates[1].text = " <was>"
    d = divergence(t, alone(" The sky <was> blue"), "b")
    out = divergence_html(d)
    assert "<was>" not in out and "&lt;was&gt;" in out and "Round 1: the ensemble chose" in out
    assert out.count("<tr>") == 3 and "<td>a</td><td>0.10</td><td>2.00</td><td>0.900</td><td>1</td>" in out
    assert "NLL per token of “ is”" in out and "Δ (τΔ 0.7)" in out and "weight (equal)" in out
    assert "word for word" in divergence_html(None)
    lone = divergence_html(divergence(sky(), alone(" The sky looks", "c"), "c"))
    assert "<table" not in lone and "was not in the pool" in lone
