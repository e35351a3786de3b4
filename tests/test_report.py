"""Text reports of a trace (adafuse/report.py): the round table and per-model cost."""
from adafuse.report import format_table, round_rows
from tests.traces import two_rounds


def test_round_table_and_cost():
    rows = round_rows(two_rounds())
    assert [r["kind"] for r in rows] == ["commit", "override"]
    assert rows[0]["mode a"] == "commit×2" and rows[1]["pool"] == 3 and rows[1]["chosen"] == " was"
    assert "fused NLL" in format_table(rows)
    assert two_rounds().cost("a") == {"forward_passes": 5, "tokens_fed": 10, "seconds": 0.25, "cached_tokens": 0}


def test_each_round_in_plain_words():
    """What each model did and why (its Δ against τΔ), and what chose the text: the unit of the score, a pick by hand,
    a single candidate, an end that won."""
    from dataclasses import replace
    from adafuse.report import round_sentence
    from tests.traces import empty_trace
    t = two_rounds()
    assert round_sentence(t, t.rounds[0]) == ("Both models were sure (Δ 0.90, 0.75 ≥ τΔ 0.70), so each wrote up to 3 "
                                              "words; one candidate, “ The sky”, so nothing was scored.")
    assert round_sentence(t, t.rounds[1]) == ("a was sure (Δ 0.95 ≥ τΔ 0.70), so it wrote up to 3 words; b was unsure "
                                              "(Δ 0.20 < τΔ 0.70), so it offered up to ? first words. You picked "
                                              "“ was”; the scores preferred “ is”.")
    e = empty_trace()
    said = round_sentence(replace(e, settings={"tau": 0.7, "branches": 3, "normalize": "byte"}), e.rounds[0])
    assert said == ("Both models were unsure (Δ 0.02, 0.23 < τΔ 0.70), so each offered up to 3 first words; of 3 "
                    "candidates, their average NLL per byte (lower is likelier) chose “⏎ end” (2.78; runner-up “ A” "
                    "3.12).")
    assert "their weighted average NLL per token" in round_sentence(e, replace(e.rounds[0], weights={"smollm2": 1,
                                                                                                      "gemma": 9}))
