"""The word builder (adafuse/writer.py) on the real bundled tokenizers: words are byte-exact and never end inside a
character; the best token of every row of a batch, read in one transfer."""
from types import SimpleNamespace

import torch
from hypothesis import given
from hypothesis import strategies as st

from adafuse.writer import Word, best_token, best_tokens
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


def test_best_tokens_of_rows_are_each_rows_best_token_banned_ones_skipped():
    view = SimpleNamespace(banned_ids={1}, token_indexes={}, next_logprobs=torch.zeros(4))
    logprobs = torch.log_softmax(torch.tensor([[3.0, 1.0, 3.0, 0.0],    # a tie: the first
                                               [0.0, 5.0, 4.0, 1.0],    # best is banned: the next one
                                               [0.0, 0.0, 0.0, 9.0],
                                               [0.0, 6.0, 0.0, 0.5]]), dim=-1)  # (N, V)
    before = logprobs.clone()
    assert best_tokens(view, logprobs) == [0, 2, 3, 3]
    assert [best_token(view, row) for row in logprobs] == [0, 2, 3, 3]
    assert torch.equal(logprobs, before)  # nothing masked in place
    assert best_tokens(view, logprobs[:0]) == []
