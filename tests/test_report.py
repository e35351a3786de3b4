"""Text reports of a trace (adafuse/report.py): the round table and per-model cost."""
from adafuse.report import format_table, round_rows
from tests.traces import two_rounds


def test_round_table_and_cost():
    rows = round_rows(two_rounds())
    assert [r["kind"] for r in rows] == ["commit", "override"]
    assert rows[0]["mode a"] == "commit×2" and rows[1]["pool"] == 3 and rows[1]["chosen"] == " was"
    assert "fused NLL" in format_table(rows)
    assert two_rounds().cost("a") == {"forward_passes": 5, "tokens_fed": 10, "seconds": 0.25, "cached_tokens": 0}
