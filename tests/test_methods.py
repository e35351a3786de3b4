"""Methods other than AdaFuse (adafuse/methods.py): token union, the word-level mixture, fixed spans, greedy (against
transformers' own generate on the real pair)."""
import math

import pytest
import torch

from adafuse import AdaFuse, ConfigError, DecodeConfig, greedy
from tests.toy import A_RULES, B_RULES, V, first_round, nll, toy_model, toy_pair


def test_token_union_averages_each_models_probability_of_the_text():
    a = {"Q": {" Paris": 0.7, " London": 0.2}}
    b = {"Q": {" London": 0.5, " Paris": 0.3}}
    _, r = first_round(DecodeConfig.of(method="token-union", union_top_k=2), toy_pair(a=a, b=b))
    c = {x.text: x for x in r.candidates}
    assert set(c) == {" Paris", " London"} and r.steps[0].mode == "token"
    assert c[" Paris"].fused == pytest.approx(nll((0.7 + 0.3) / 2), abs=1e-5)
    assert c[" London"].fused == pytest.approx(nll((0.2 + 0.5) / 2), abs=1e-5)
    assert c[" London"].nll["b"] == pytest.approx(nll(0.5), abs=1e-5)
    assert r.candidates[r.winner].text == " Paris"


def test_mixture_lets_one_seeded_model_write_each_word():
    tr = AdaFuse(toy_pair(), DecodeConfig.of(method="mixture", seed=3, max_new_words=6)).generate("Q")
    for r in tr.rounds:
        writers = [s.model for s in r.steps if s.mode != "idle"]
        assert len(writers) == 1 and r.candidates[r.chosen].proposers == writers
    again = AdaFuse(toy_pair(), DecodeConfig.of(method="mixture", seed=3, max_new_words=6)).generate("Q")
    assert [r.text for r in again.rounds] == [r.text for r in tr.rounds]
    only_a = AdaFuse(toy_pair(), DecodeConfig.of(method="mixture", weights=(1, 0), temperature=0)).generate("Q")
    assert all(r.steps[1].mode == "idle" for r in only_a.rounds) and only_a.output == " Paris is nice."
    with pytest.raises(ConfigError):
        AdaFuse(toy_pair(), DecodeConfig(method="mixture", weights=(1, 0, 1))).generate("Q")


def test_mixture_is_word_level_me_one_model_per_word_no_scoring():
    a, b = toy_pair()
    tr = AdaFuse([a, b], DecodeConfig.of(method="mixture", weights=(1, 0), temperature=0)).generate("Q")
    assert all(len(r.candidates) == 1 and r.candidates[0].nll == {} for r in tr.rounds)
    assert sum(s.forward_passes for r in tr.rounds for s in r.steps if s.model == "b") == 0
    # drawn models catch up lazily: b sees the words a wrote with one forward when it is drawn
    d = AdaFuse(toy_pair(), DecodeConfig.of(method="mixture", seed=1, temperature=0)).start("Q")
    for r in d:
        for m, step in enumerate(r.steps):
            if step.mode != "idle" and not d.done:
                assert d.sessions[m].text == d.trace.output
    counts = [sum(1 for r in d.trace.rounds if r.steps[m].mode != "idle") for m in (0, 1)]
    assert all(counts)
    # sampling is seeded: the same seed gives the same words, temperature > 0
    one = AdaFuse(toy_pair(), DecodeConfig.of(method="mixture", seed=5, temperature=1.0)).generate("Q").output
    assert one == AdaFuse(toy_pair(), DecodeConfig.of(method="mixture", seed=5, temperature=1.0)).generate("Q").output


class _Draws:
    """The mixture's draws in a given order (u < 0.5: model a, at equal weights)."""

    def __init__(self, seq):
        self.seq = list(seq)

    def random(self):
        return self.seq.pop(0) if self.seq else 0.1


@pytest.mark.parametrize("b_after_paris", [{" is": 0.6, " big": 0.3}, {" big": 0.6, " is": 0.3}])
def test_a_mixture_writer_catching_up_feeds_the_last_writers_next_token_with_it(monkeypatch, b_after_paris):
    """a writes " Paris" and its next token says " is"; b, drawn next, catches up on " Paris" and " is" in one
    forward: where b writes " is" too that forward gave its next distribution (one forward saved), where it writes
    " big" the guess is cropped away. The text is the same as without the guess either way."""
    from adafuse.methods import Mixture

    def run(guess: bool):
        if not guess:
            monkeypatch.setattr(Mixture, "guess", lambda self, ctx, m: "")
        models = toy_pair(b=dict(B_RULES, **{" Paris": b_after_paris}))
        d = AdaFuse(models, DecodeConfig.of(method="mixture", temperature=0), parallel=False).start("Q")
        d.method.rng = _Draws([0.1, 0.9, 0.1, 0.9, 0.1, 0.9])
        for _ in d:
            pass
        monkeypatch.undo()
        return d.trace

    plain, guessed = run(False), run(True)
    assert [r.text for r in guessed.rounds] == [r.text for r in plain.rounds]
    assert guessed.output == plain.output
    b_plain, b_guessed = plain.rounds[1].steps[1], guessed.rounds[1].steps[1]
    assert b_guessed.draft_tokens == 1  # a's next token, fed with b's catch-up
    if b_after_paris[" is"] > 0.5:
        assert guessed.rounds[1].text == " is"
        assert (b_guessed.accepted_tokens, b_guessed.forward_passes) == (1, b_plain.forward_passes - 1)
    else:
        assert guessed.rounds[1].text == " big"
        assert (b_guessed.accepted_tokens, b_guessed.forward_passes) == (0, b_plain.forward_passes)
    total = lambda tr: sum(s.forward_passes for r in tr.rounds for s in r.steps)  # noqa: E731
    assert total(guessed) <= total(plain)


def test_the_mixture_draws_as_random_choices_and_a_weight_change_counts_from_the_next_round():
    import random
    from dataclasses import replace
    from adafuse.methods import draw_writer
    for seed in range(10):
        for weights in ((), (1, 1), (0.2, 0.8), (1, 0), (0, 3, 1)):
            n = len(weights) or 2
            ours, theirs = random.Random(seed), random.Random(seed)
            assert [draw_writer(ours.random(), n, weights) for _ in range(40)] == \
                [theirs.choices(range(n), weights=weights or None)[0] for _ in range(40)]
    # a seed whose second draw picks b at equal weights; b is switched off after the first round
    def second_draw(s):
        r = random.Random(s)
        r.random()
        return r.random()
    seed = next(s for s in range(100) if second_draw(s) >= 0.5)
    for parallel in (False, True):
        d = AdaFuse(toy_pair(), DecodeConfig.of(method="mixture", weights=(1, 1), seed=seed, temperature=0),
                    parallel=parallel).start("Q")
        d.commit()
        d.reconfigure(replace(d.config, weights=(1, 0)))
        later = list(d)
        assert later and all(r.steps[1].mode == "idle" for r in later)


def test_fixed_span_commits_n_words_from_every_model():
    _, r = first_round(DecodeConfig.of(method="fixed-span", span_words=2))
    assert [s.mode for s in r.steps] == ["span", "span"]
    assert {c.text for c in r.candidates} == {" Paris is", " London is"}


def test_single_model_greedy_matches_transformers_generate(pair):
    sm = pair[0]
    prompt = "The capital of France is"
    tr = greedy(sm, prompt, DecodeConfig(max_new_words=12))
    ids = sm.tokenizer(prompt, add_special_tokens=False).input_ids
    out = sm.model.generate(torch.tensor([ids], device=sm.device),
                            attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=sm.device),
                           max_new_tokens=40, do_sample=False)
    ref = sm.tokenizer.decode(out[0, len(ids):])
    assert ref.startswith(tr.output) and len(tr.output) > 20
    assert len(tr.rounds) == tr.words and tr.stop_reason in ("eos", "stop string", "max_new_words")


@pytest.mark.parametrize("prompt", ["法国的首都是哪里？", "巴黎🙂是", "Emoji time: 🙂🙂"])
def test_greedy_equals_generate_on_cjk_and_emoji(pair, prompt):
    for lm in pair:
        ids = ([lm.tokenizer.bos_token_id] if lm.add_bos else []) + lm.tokenizer(prompt, add_special_tokens=False).input_ids
        out = lm.model.generate(torch.tensor([ids], device=lm.device),
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=lm.device),
                                max_new_tokens=16, do_sample=False)
        ref = lm.decode(out[0, len(ids):].tolist())
        tr = greedy(lm, prompt, DecodeConfig(max_new_tokens=16, max_new_words=1000))
        assert "\ufffd" not in tr.output
        text = ref.rstrip("\ufffd")  # generate's 16 tokens may end inside a character
        n = min(len(text), len(tr.output))
        assert n > 0 and text[:n] == tr.output[:n], (lm.name, ref, tr.output)


def test_token_union_keeps_a_model_given_twice_as_two_voters():
    """The same model twice: both copies vote under their trace names ("a", "a#2"), so the mean covers two models."""
    a1, a2 = toy_model("a", V, A_RULES), toy_model("a", V, B_RULES)
    tr = AdaFuse([a1, a2], DecodeConfig(method="token-union", max_new_words=2)).generate("Q")
    r = tr.rounds[0]
    assert tr.models == ["a", "a#2"] and [s.model for s in r.steps] == ["a", "a#2"]
    assert all(set(c.nll) == {"a", "a#2"} for c in r.candidates)
    paris = next(c for c in r.candidates if c.text == " Paris")
    assert paris.fused == pytest.approx(-math.log((0.9 + 0.3) / 2))


def test_token_union_refuses_a_gate_and_records_no_weights(tmp_path):
    """Token union averages the models' probabilities equally: a learned gate is a typed error before any model
    prefills (it would be read and never used), and its rounds record the weights they used: none, whatever the
    settings' weights."""
    from adafuse.gate import Gate
    path = tmp_path / "gate.json"
    Gate.zeros(["a", "b"]).save(path)
    a, b = toy_pair()
    with pytest.raises(ConfigError, match=r"gate=.* is invalid with method 'token-union'"):
        AdaFuse([a, b], DecodeConfig(method="token-union", gate=str(path))).start("Q")
    assert a.model.calls == b.model.calls == 0
    tr = AdaFuse([a, b], DecodeConfig(method="token-union", weights=(1, 3), max_new_words=2)).generate("Q")
    assert tr.rounds and all(r.weights == {} for r in tr.rounds)
    _, scored = first_round(DecodeConfig(weights=(1, 3)))
    assert scored.weights == {"a": 1.0, "b": 3.0}
