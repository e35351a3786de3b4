"""One model's view of the text (adafuse/models/session.py): the KV cache follows every commit, shared prompt prefixes,
guesses fed with a catch-up, anchored tokenization, the prompt a session was given."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from adafuse import AdaFuse, DecodeConfig
from adafuse.models import tokenized as session_module
from adafuse.models.session import LocalSession
from tests.real import RELAXED, TEXTS, gsm8k_prompt, tolerance, views  # noqa: F401  (views: a fixture)
from tests.toy import A_RULES, B_RULES, V, first_round, toy_model, toy_pair


def test_cache_follows_commits_exactly():
    d = AdaFuse(toy_pair(), DecodeConfig(tau=0.5)).start("Q")
    for _ in d:
        for s in d.sessions if not d.done else []:
            assert s.cached_ids[: len(s.ids)] == s.ids == s.encode(d.trace.output)
            assert s.cache.get_seq_length() == len(s.cached_ids)


def test_a_shared_prompt_prefix_is_reused_not_reencoded():
    a, _ = toy_pair()
    head = "Q Paris is nice." * 5
    first = LocalSession(a, head + " Paris")
    second = LocalSession(a, head + " London")
    assert first.prefix_reused == 0 and second.prefix_reused == len(a.tokenizer(head).input_ids)
    fresh = LocalSession(toy_model("a", V, A_RULES), head + " London")  # another model object: no reuse
    assert fresh.prefix_reused == 0
    assert torch.allclose(second.next_logprobs, fresh.next_logprobs)
    assert second.tokens_fed == len(second.ids) - second.prefix_reused


def test_commit_adopts_kv_already_computed_instead_of_feeding_again():
    d, r = first_round(DecodeConfig(tau=0.7, branches=3))
    loser = next(i for i, c in enumerate(r.candidates) if c.proposers == ["b"] and c.text == " London")
    before = [s.forward_passes for s in d.sessions]
    d.commit(loser)  # b explored " London" (kept from its branch); a scored it with its last token fed
    assert [s.forward_passes for s in d.sessions] == before
    for s, rules in zip(d.sessions, (A_RULES, B_RULES)):
        fresh = LocalSession(toy_model("x", V, rules), "Q" + d.trace.output)
        assert s.ids == fresh.ids and torch.allclose(s.next_logprobs, fresh.next_logprobs)


def test_a_guess_fed_with_a_catch_up_is_taken_kept_through_a_rewind_or_cropped():
    a = toy_model("a", V, A_RULES)
    after_is, after_big = LocalSession(a, "Q Paris is").next_logprobs, LocalSession(a, "Q Paris is big").next_logprobs
    s = LocalSession(a, "Q")
    s.commit(" Paris", guess=" is nice")
    assert s.cached_ids[len(s.ids):] == [a.tokenizer.index[" is"], a.tokenizer.index[" nice"]]
    calls = a.model.calls
    s.rewind()  # a proposer starting over keeps the guess where it is
    lp = s.extend(a.tokenizer.index[" is"])
    assert a.model.calls == calls and s.accepted_tokens == 1
    assert torch.equal(lp, after_is)
    s.extend(a.tokenizer.index[" big"])  # off the guess: " nice" is cropped, " big" fed
    assert a.model.calls == calls + 1
    assert s.cached_ids[len(s.ids):] == [a.tokenizer.index[" is"], a.tokenizer.index[" big"]]
    s.commit(" Paris is big")
    assert torch.equal(s.next_logprobs, after_big)
    # a guess not taken at all is dropped when the proposal ends
    s.commit(" Paris is big.", guess=" London")
    s.settle()
    assert s.cached_ids == s.ids and torch.equal(s.end_logprobs, s.next_logprobs)


@pytest.mark.parametrize("prompt", ["short", "gsm8k"])
def test_kv_cache_matches_a_fresh_forward(pair, prompt):
    text = gsm8k_prompt(1) if prompt == "gsm8k" else "The three largest cities of Japan are"
    d = AdaFuse(pair, DecodeConfig(max_new_words=100, tau=0.6)).start(text)
    for _ in range(8):
        d.step()
    assert not d.done
    for s in d.sessions:
        ids = s.encode(d.trace.output)
        assert s.ids == ids
        with torch.inference_mode():
            fresh = torch.log_softmax(s.lm.model(torch.tensor([ids], device=s.lm.device)).logits[0, -1].float(), -1)
        assert (fresh - s.next_logprobs).abs().max().item() < tolerance(s.lm.dtype), s.lm.name


def test_text_is_appended_byte_for_byte_without_clean_up(pair):
    sm = LocalSession(pair[0], "Say:")
    for text in ("Hello .", "it 's", "a , b ?"):
        ids = sm.lm.tokenizer(text, add_special_tokens=False).input_ids
        assert sm.lm.decode(ids) == text
        head, tail = ids[:1], ids[1:]
        assert sm.lm.decode(head) + sm.decode_after(head, tail) == text




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


@pytest.fixture(scope="module")
def smol(pair):
    return pair[0]  # SmolLM2-135M-Instruct: a chat template with a default system message


def test_a_session_records_the_prompt_it_was_given(smol):
    s = LocalSession(smol, "What is 2+2?", "chat", (), system="Answer with one number.")
    assert s.mode_used == "chat (system)" and "Answer with one number." in s.prefix_text
