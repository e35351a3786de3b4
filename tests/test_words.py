"""Word boundaries, stop strings and prompt lookup (adafuse/words.py): plain text in, positions out."""
import pytest  # noqa: F401

from adafuse.words import common_prefix, count_words, find_stop, lookup_continuations, split_words, word_end


def test_word_end_keeps_leading_whitespace_and_stops_before_next_space():
    assert word_end(" Paris. Next") == 7
    assert word_end("\n\nStep 1") == 6
    assert word_end("   ") is None and word_end(" Paris") is None


def test_split_and_count_words_reproduce_text():
    text = " The answer\n\nis 42."
    assert "".join(split_words(text)) == text
    assert count_words(text) == 4 and count_words("") == 0 and count_words("\n") == 0


def test_find_stop_earliest_and_from_start():
    assert find_stop("a\n\nQuestion: b\nc", ("\n", "\n\nQuestion:")) == 1
    assert find_stop("abc", ("x",)) is None
    assert find_stop("x..x", ("x",), start=1) == 3


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0


def test_lookup_continuations_take_the_latest_earlier_occurrence_of_the_last_words():
    text = "3 hours x 2 chapters = 6 hours total.\n1.5 hours x 4 worksheets = 6 hours. So 2 chapters"
    assert lookup_continuations(text, 3) == [" = 6 hours"]
    assert lookup_continuations("a b c a b d a b", 2, count=2) == [" d a", " c a"]  # latest first, distinct
    assert lookup_continuations("no repeat here", 3) == []
