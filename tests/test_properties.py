"""Property-based tests with the real bundled tokenizers: byte-exact words, anchored tokenization, round texts."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adafuse import AdaFuse, DecodeConfig
from adafuse import session as session_module
from adafuse.session import LocalSession
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


@RELAXED
@given(text=TEXTS, cuts=st.lists(st.integers(1, 8), min_size=1, max_size=12))
def test_tokenizing_from_the_anchor_equals_the_full_tokenization(views, text, cuts, monkeypatch):
    monkeypatch.setattr(session_module, "ANCHOR_EVERY", 3)  # move the anchor often
    for s in views:
        s.text, s.anchor_char, s.anchor_tok = "", 0, 0
        s.ids = s._full("")
        y = ""
        for n in cuts + [len(text)]:
            if len(y) >= len(text):
                break
            y = text[: len(y) + n]
            assert s.encode(y) == s._full(y), (s.name, y, s.anchor_char)
            s.ids, s.text = s._full(y), y
            s._move_anchor()
        # long texts: the anchor does move
        if len(s.ids) > 40 and len(y.split()) > 6:
            assert s.anchor_tok > 0


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=TEXTS, tau=st.sampled_from([0.0, 0.5, 1.0]), cap=st.integers(1, 4), mode=st.sampled_from(["raw", "chat"]))
def test_round_texts_add_up_to_the_output(pair, prompt, tau, cap, mode):
    if not prompt.strip():
        return
    tr = AdaFuse(pair, DecodeConfig(tau=tau, max_word_tokens=cap, max_new_words=5, mode=mode,
                                    stop=("\n\n",))).generate(prompt)
    assert "".join(r.text for r in tr.rounds) == tr.output
    assert "\ufffd" not in tr.output
