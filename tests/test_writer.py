"""The word builder (adafuse/writer.py) on the real bundled tokenizers: words are byte-exact and never end inside a
character."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adafuse.models.session import LocalSession
from adafuse.writer import Word


PIECES = list("abcXYZ019 .,;:!?'-\n") + ["  ", "\n\n", "巴", "黎", "是", "法国", "🙂", "😀", "é", "ß", "ー", "https://x.io/a?b=1"]
TEXTS = st.lists(st.sampled_from(PIECES), min_size=1, max_size=25).map("".join)
RELAXED = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def views(pair):
    return [LocalSession(lm, "Text:") for lm in pair]


@RELAXED
@given(text=TEXTS, cap=st.integers(1, 4))
def test_words_are_byte_exact_and_never_end_inside_a_character(views, text, cap):
    for s in views:
        y = ""
        dummy = torch.zeros(s.lm.vocab_size)
        while len(y) < len(text):
            context = s._full(y)
            tokens = s.lm.tokenizer(text[len(y):], add_special_tokens=False).input_ids
            w = Word(s, context, cap)
            pos = 0
            while pos < len(tokens) and w.offer(tokens[pos], dummy):
                pos += 1
            piece = w.text
            assert "\ufffd" not in piece, (s.name, text, piece)  # no word ends inside a character
            assert piece and text[len(y):].startswith(piece), (s.name, text, y, piece)  # appended as decoded
            y += piece
        assert y == text
