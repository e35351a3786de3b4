"""The word builder (adafuse/writer.py) on the real bundled tokenizers: words are byte-exact and never end inside a
character."""
import torch
from hypothesis import given
from hypothesis import strategies as st

from adafuse.writer import Word
from tests.real import RELAXED, TEXTS, views  # noqa: F401  (views: a fixture)


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
