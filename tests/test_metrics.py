"""Answer metrics (adafuse/harness/metrics.py) on hand-written cases."""
import pytest

from adafuse.harness.metrics import exact_match, f1, final_number, normalize_answer, number_match


def test_normalized_exact_match_and_f1():
    assert normalize_answer("The  Pacific Ocean.") == "pacific ocean"
    assert exact_match(" George V.", ["George V", "King George"]) == 1.0
    assert exact_match("George", ["George V"]) == 0.0
    assert f1("the big red dog", ["red dog"]) == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert f1("cat", ["red dog"]) == 0.0


def test_final_number_prefers_boxed_then_last_number():
    assert final_number("so 3 + 4 = 7. The answer is \\boxed{1,234}.") == 1234
    assert final_number("12 apples, then 5 more: 17.") == 17
    assert final_number("no digits") is None
    assert number_match("The answer is \\boxed{18}", "9 * 2 = 18\nTherefore, the answer is 18") == 1.0
    assert number_match("The answer is 17", "Therefore, the answer is 18") == 0.0
