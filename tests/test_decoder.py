"""The round loop (adafuse/decoder.py): pools, winners, the end of the answer, stop strings, overrides, settings
changed mid-decode, what a commit costs; toy LMs with hand-computed answers, then the real bundled pair."""
import json
import math
from dataclasses import replace

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from adafuse import AdaFuse, ConfigError, DecodeConfig, PromptError, Trace
from adafuse.models import LocalModel
from adafuse.models.prompt import TRANSCRIPT, TURN_ENDS
from adafuse.models.session import LocalSession
from tests.real import check_trace, flores_prompt, gsm8k_prompt, models_disagree, qa_prompt, real_decodes, tolerance
from tests.toy import A_RULES, B_RULES, V, ToyLM, ToyTokenizer, first_round, nll, toy_model, toy_pair
from tests.toy_tasks import CHARS as TOY_CHARS, toy_qa_pair


def test_pool_is_deduplicated_and_scored_by_hand():
    rules_b = dict(B_RULES, **{"Q": {" Paris": 0.5, " London": 0.3, "\n": 0.1}})
    _, r = first_round(DecodeConfig(tau=0.7, max_words=2, branches=2), toy_pair(b=rules_b))
    texts = [c.text for c in r.candidates]
    assert texts == [" Paris is", " Paris", " London"]
    # " Paris is" was proposed by a only; " Paris" by b only; nothing appears twice.
    assert r.candidates[0].proposers == ["a"] and r.candidates[1].proposers == ["b"]
    c = {t: r.candidates[i] for i, t in enumerate(texts)}
    assert c[" Paris is"].nll["a"] == pytest.approx(nll(0.9, 0.8), abs=1e-5)
    assert c[" Paris is"].nll["b"] == pytest.approx(nll(0.5, 0.6), abs=1e-5)
    assert c[" Paris"].nll["a"] == pytest.approx(nll(0.9), abs=1e-5)
    assert c[" London"].nll["b"] == pytest.approx(nll(0.3), abs=1e-5)
    assert c[" Paris is"].n_tokens == {"a": 2, "b": 2}
    for cand in r.candidates:
        assert cand.fused == pytest.approx((cand.nll["a"] + cand.nll["b"]) / 2)
    best = min(range(3), key=lambda i: r.candidates[i].fused)
    assert r.winner == best == 0


def test_ties_go_to_the_first_candidate_in_pool_order():
    same = {"Q": {" Paris": 0.45, " London": 0.45}}
    _, r = first_round(DecodeConfig(tau=0.7, branches=2), toy_pair(a=same, b=same))
    assert [c.text for c in r.candidates] == [" Paris", " London"]
    assert r.candidates[0].fused == pytest.approx(r.candidates[1].fused)
    assert r.candidates[0].proposers == ["a", "b"]
    assert r.winner == 0


def test_whole_decode_reproduces_output_and_stops_at_eos():
    tr = AdaFuse(toy_pair(), DecodeConfig(tau=0.7)).generate("Q")
    assert tr.output == "".join(r.text for r in tr.rounds)
    assert tr.stop_reason == "eos"
    assert tr.output.endswith(".") and "<eos>" not in tr.output


def test_stop_string_cuts_the_output():
    rules = dict(A_RULES, **{" is": {"\n": 0.95}, "\n": {" nice": 0.99}})
    tr = AdaFuse(toy_pair(a=rules), DecodeConfig(tau=0.0, stop=("\n",))).generate("Q")
    # "\n" starts the stop string: it is the end of the answer, like an end token, and the trace says which ended it
    assert tr.stop_reason == "stop string" and "\n" not in tr.output and tr.output


def test_model_without_whitespace_still_moves():
    rules = {"": {"ab": 0.99}}
    models = toy_model("a", V, rules), toy_model("b", V, rules)
    tr = AdaFuse(models, DecodeConfig(max_word_tokens=3, max_new_words=4)).generate("Q")
    assert tr.output == "ab" * 12 and tr.stop_reason == "max_new_words"
    assert [r.words for r in tr.rounds] == [3, 1]  # a forced word is 3 tokens; M = 3, then the cap


def test_decoding_is_deterministic():
    cfg = DecodeConfig(tau=0.5, branches=3)
    one = AdaFuse(toy_pair(), cfg).generate("Q").to_dict()
    two = AdaFuse(toy_pair(), cfg).generate("Q").to_dict()
    for t in (one, two):
        for r in t["rounds"]:
            r["seconds"] = 0
            for s in r["steps"]:
                s["seconds"] = 0
        t["seconds"] = 0
        for p in t["prefill"].values():
            p["seconds"] = 0
    assert one == two
    assert Trace.from_dict(one).to_dict() == one


def test_override_commits_another_candidate_and_marks_the_round():
    d, r = first_round(DecodeConfig(tau=0.7, branches=2))
    other = next(i for i in range(len(r.candidates)) if i != r.winner)
    done = d.commit(other)
    assert done.overridden and done.kind == "override" and done.chosen == other
    assert d.trace.output == r.candidates[other].text
    for s in d.sessions:  # every model now continues from the overridden text
        assert s.ids == s.encode(d.trace.output)
    with pytest.raises(ConfigError):
        d.propose() and d.commit(99)


def test_bad_input_is_typed():
    with pytest.raises(PromptError):
        AdaFuse(toy_pair(), DecodeConfig()).generate("   ")
    with pytest.raises(ConfigError):
        AdaFuse([toy_pair()[0]], DecodeConfig())
    with pytest.raises(ConfigError):
        AdaFuse(toy_pair(), DecodeConfig(method="greedy"))
    with pytest.raises(PromptError):
        AdaFuse([toy_model("s", V, {}, max_positions=4), toy_pair()[1]], DecodeConfig()).generate("Q Paris Paris Paris")


def test_settings_are_validated_before_any_model_prefills():
    a, b = toy_pair()
    with pytest.raises(ConfigError, match="weights"):
        AdaFuse([a, b], DecodeConfig(method="mixture", weights=(1, 2, 3))).start("Q")
    with pytest.raises(ConfigError, match="union_top_k"):
        AdaFuse([a, b], DecodeConfig.of(method="token-union", union_top_k=999)).start("Q")
    assert a.model.calls == 0 and b.model.calls == 0


@pytest.mark.parametrize("parallel", [False, True])
def test_an_idle_members_smaller_window_ends_the_decode_before_its_catch_up_would_overflow(parallel):
    """Every model's limits are checked each round, moved or idle: a mixture's idle member (b, window 5) counts the
    output in its own tokens as its catch-up will read it (side by side, while it catches up in the background), so
    the decode stops as "context full" when b could not fit another round — though b has not read a word of it."""
    a, b = toy_model("a", V, A_RULES), toy_model("b", V, B_RULES, max_positions=5)
    cfg = DecodeConfig.of(method="mixture", weights=(99, 1), temperature=0, max_words=1, max_word_tokens=1)
    tr = AdaFuse([a, b], cfg, parallel=parallel).generate("Q")
    assert [r.text for r in tr.rounds] == [" Paris", " is"] and tr.stop_reason == "context full"
    assert all(r.steps[1].mode == "idle" for r in tr.rounds)  # b never wrote: <bos> Q Paris is + a word's token = 5
    d = AdaFuse([a, b], cfg).start("Q")
    assert [s.length(" Paris is") for s in d.sessions] == [len(s.encode(" Paris is")) for s in d.sessions] == [4, 4]


def test_a_setting_changed_while_a_round_is_pending_applies_from_the_next_round():
    from dataclasses import replace
    cfg = DecodeConfig(tau=0.7, max_words=1, max_new_words=10)
    d = AdaFuse(toy_pair(), cfg).start("Q")
    d.propose()
    assert d.reconfigure(replace(cfg, max_new_words=1)) == {"max_new_words": 1}
    r = d.commit()  # decided and committed under the old cap
    assert r.stop is None and not d.done and d.config.max_new_words == 1
    assert d.trace.changes == [{"from_round": 1, "settings": {"max_new_words": 1}}]
    assert d.commit().stop == "max_new_words"  # the new cap binds from round 1
    with pytest.raises(ConfigError):
        AdaFuse(toy_pair(), cfg).start("Q").reconfigure(replace(cfg, mode="chat"))


def test_a_winning_confident_span_costs_no_forward_at_commit():
    rules_b = dict(B_RULES, **{"Q": {" Paris": 0.5, " London": 0.3, "\n": 0.1}})
    d, r = first_round(DecodeConfig(tau=0.7, max_words=2, branches=2), toy_pair(b=rules_b))
    assert len(r.candidates) >= 2 and r.candidates[r.winner].text == " Paris is"
    assert r.candidates[r.winner].proposers == ["a"]  # a's own greedy span, scored against b's words
    before = [s.forward_passes for s in d.sessions]
    d.commit()
    assert [s.forward_passes for s in d.sessions] == before  # a: its speculative KV; b: its scoring row
    for s in d.sessions:
        assert s.ids == s.encode(" Paris is") and s.cache.get_seq_length() == len(s.ids)


def test_a_span_holding_another_models_eos_string_is_cut_before_it():
    # b's end token is "</s>"; a writes "</s>" as plain text
    tok_a = ToyTokenizer(V + ["</s>"])
    tok_b = ToyTokenizer(V, eos="</s>")
    rules = {"Q": {" Paris": 0.95}, " Paris": {"</s>": 0.95}, "</s>": {" nice": 0.9}}
    a = LocalModel.from_objects("a", ToyLM(tok_a, rules), tok_a)
    b = LocalModel.from_objects("b", ToyLM(tok_b, {"Q": {" Paris": 0.95}, " Paris": {"</s>": 0.5}}), tok_b)
    tr = AdaFuse([a, b], DecodeConfig(tau=0.5, max_words=3)).generate("Q")
    assert "</s>" not in tr.output and tr.output == " Paris" and tr.stop_reason == "eos"
    assert "".join(r.text for r in tr.rounds) == tr.output


def test_a_stop_string_across_rounds_keeps_round_texts_adding_up():
    rules = {"Q": {" Paris": 0.95}, " Paris": {" is": 0.95}, " is": {" nice": 0.95}}
    tr = AdaFuse(toy_pair(a=rules, b=rules), DecodeConfig(tau=0.5, max_words=1, stop=(" Paris is",))).generate("Q")
    assert tr.output == "" and tr.stop_reason == "stop string"
    assert "".join(r.text for r in tr.rounds) == tr.output
    assert tr.rounds[0].cut == len(" Paris")
    tr2 = AdaFuse(toy_pair(a=rules, b=rules), DecodeConfig(tau=0.5, max_words=1, stop=("s is",))).generate("Q")
    assert tr2.output == " Pari" and "".join(r.text for r in tr2.rounds) == tr2.output


def test_one_token_prompt_that_merges_with_the_candidate_decodes():
    vocab = ["a", "b", "ab", " x", "bb"]
    tok = ToyTokenizer(vocab, bos=None)
    ra = {"a": {"b": 0.5, " x": 0.4}, "ab": {" x": 0.9}, " x": {"<eos>": 0.9}}
    rb = {"a": {" x": 0.5, "b": 0.4}, "ab": {" x": 0.9}, " x": {"<eos>": 0.9}}
    a = LocalModel.from_objects("a", ToyLM(tok, ra), tok)
    b = LocalModel.from_objects("b", ToyLM(ToyTokenizer(vocab, bos=None), rb), ToyTokenizer(vocab, bos=None))
    d = AdaFuse([a, b], DecodeConfig(tau=0.9, branches=2)).start("a")
    assert [len(s.ids) for s in d.sessions] == [1, 1]
    r = d.propose()
    merged = next(c for c in r.candidates if c.text == "b")  # "a"+"b" tokenizes as the single token "ab"
    # no token of "b" can be scored in context (position 0 has nothing before it): null, with the reason
    assert merged.nll["a"] is None and merged.notes["a"] and merged.straddle["a"]
    assert merged.fused is None  # unscored under a: no fused score (it ranks last)
    for _ in d:
        pass
    json.loads(d.trace.to_json())


def test_the_end_of_the_answer_is_one_event_however_it_is_spelled():
    # after "Q" a newline is unlikely (0.1), but once written the few-shot format ("\nQ") is almost sure: averaged
    # over "\n" + "Q" the format continuation would win; as the end event it is scored by the newline alone
    rules = {"Q": {" Paris": 0.3, " London": 0.25, "\n": 0.1}, "\n": {"Q": 0.99}, " Paris": {"<eos>": 0.9},
             " London": {"<eos>": 0.9}}
    d, r = first_round(DecodeConfig(tau=0.9, branches=3, stop=("\n",), allow_empty=True), toy_pair(a=rules, b=rules))
    ends = [c for c in r.candidates if c.eos and c.text == ""]
    assert len(ends) == 1  # proposed as "\n...", pooled with the end tokens: one entry
    end_p = 0.1 + (1 - 0.65) / 9  # "\n" and <eos> (unlisted) together
    assert ends[0].nll["a"] == pytest.approx(-math.log(end_p), abs=1e-5) and ends[0].n_tokens["a"] == 1
    assert ends[0].end_term["a"] == pytest.approx(math.log(end_p), abs=1e-5)
    assert r.candidates[r.winner].text == " Paris"
    # a span that holds a stop string is cut before it and ends the answer
    assert d.ending.head(d.trace.output, " Paris\nQ", False)[:2] == (" Paris", True)


def test_whitespace_and_then_the_end_is_the_end_event():
    """" " + "\n" ends the answer with nothing in it, as "\n" does: one pool entry scored by the end term alone,
    not a two-token candidate whose near-certain second token halves the cost of ending (the empty Flores answers)."""
    rules = {"Q": {" ": 0.3, " Paris": 0.28, " London": 0.27, "\n": 0.05}, " ": {"\n": 0.99},
             " Paris": {"<eos>": 0.9}, " London": {"<eos>": 0.9}}
    vocab = ["Q", " Paris", " London", " ", "\n"]
    d, r = first_round(DecodeConfig(tau=0.9, branches=3, stop=("\n",), allow_empty=True),
                       [toy_model("a", vocab, rules), toy_model("b", vocab, rules)])
    ends = [c for c in r.candidates if c.eos and not c.text.strip()]
    assert [c.text for c in ends] == [""] and ends[0].n_tokens["a"] == 1
    assert r.candidates[r.winner].text == " Paris"  # averaged with its sure newline, " " + end would have won
    assert d.commit().text == " Paris"


def test_an_answer_gets_its_first_word_even_where_ending_at_once_is_likelier():
    """Both models find the line's end after the question likelier than any first word (0.5 against 0.2): the paper's
    pool (`allow_empty`) ends the answer empty at once; by default the end is held back until the answer holds a word,
    each model's step saying so."""
    rules = {"Q": {"\n": 0.5, " Paris": 0.2, " London": 0.15}, " Paris": {"\n": 0.9}, " London": {"\n": 0.9}}
    cfg = DecodeConfig(tau=0.9, branches=3, stop=("\n",), normalize="word")
    paper = AdaFuse(toy_pair(a=rules, b=rules), replace(cfg, allow_empty=True)).generate("Q")
    assert paper.output == "" and paper.rounds[0].candidates[paper.rounds[0].winner].eos
    ours = AdaFuse(toy_pair(a=rules, b=rules), cfg).generate("Q")
    assert ours.output == " Paris" and ours.stop_reason == "stop string" and len(ours.rounds) == 1
    first = ours.rounds[0]  # " Paris" and then the end: one candidate, in; the end alone, out
    assert all(s.held_end for s in first.steps) and not any(c.eos and not c.text for c in first.candidates)
    assert Trace.from_dict(json.loads(ours.to_json())).rounds[0].steps[0].held_end
    from adafuse.report import round_sentence
    assert "; the end of the answer, proposed by both models before its first word, was held back;" in \
        round_sentence(ours, first)


def test_nq_few_shot(pair):
    tr = AdaFuse(pair, DecodeConfig(stop=("\n",), max_new_words=24)).generate(qa_prompt("nq"))
    check_trace(tr)
    assert models_disagree(tr)


def test_gsm8k_prompt(pair):
    tr = AdaFuse(pair, DecodeConfig(stop=("\n\nQuestion:",), max_new_words=8)).generate(gsm8k_prompt(shots=1))
    check_trace(tr)
    assert models_disagree(tr)
    assert tr.prefill["gemma3-270m"]["prompt_tokens"] > 512  # past Gemma 3's sliding window


def test_chat_prompt_uses_templates_and_falls_back(pair):
    """Gemma-270M has no chat template: it reads a User/Assistant transcript, and the fused answer ends where its
    turn ends (the next "User:" or "Assistant:" line, stop strings the decode adds) or where SmolLM2's does (its end
    of turn)."""
    tr = AdaFuse(pair, DecodeConfig(mode="chat", max_new_words=40)).generate("What is the capital of France?")
    check_trace(tr)
    assert tr.prompt_modes == {"smollm2-135m-instruct": "chat", "gemma3-270m": TRANSCRIPT}
    assert tr.settings["stop"] == list(TURN_ENDS)
    assert "User:" not in tr.output and "Assistant:" not in tr.output, tr.output


def test_a_decode_traces_the_system_prompt(pair):
    """The decoder passes the system prompt and the thinking switch to each model's view."""
    cfg = DecodeConfig(mode="chat", system="Answer with one word.", max_new_words=2)
    trace = AdaFuse(pair, cfg).generate("What is the capital of France?")
    assert trace.prompt_modes == {"smollm2-135m-instruct": "chat (system)", "gemma3-270m": TRANSCRIPT}
    assert trace.settings["system"] == "Answer with one word." and trace.settings["thinking"] is None


@pytest.mark.parametrize("prompt", ["a", "?", "Hi", "🙂"])
def test_short_prompts_decode(pair, prompt):
    """One- or two-character prompts decode (the answers run without spaces: "-be-the-best-…", so 4 tokens a word)."""
    tr = AdaFuse(pair, DecodeConfig(max_new_words=2, tau=0.9, max_word_tokens=4)).generate(prompt)
    assert tr.output == "".join(r.text for r in tr.rounds)
    json.loads(tr.to_json())


PIECES = list("abcXYZ019 .,;:!?'-\n") + ["  ", "\n\n", "巴", "黎", "是", "法国", "🙂", "😀", "é", "ß", "ー", "https://x.io/a?b=1"]
TEXTS = st.lists(st.sampled_from(PIECES), min_size=1, max_size=25).map("".join)


@settings(max_examples=40, deadline=None)
@given(prompt=st.text(alphabet=TOY_CHARS, min_size=1, max_size=20), tau=st.sampled_from([0.0, 0.5, 1.0]),
       cap=st.integers(1, 4), words=st.integers(1, 6))
def test_round_texts_add_up_to_the_output_on_the_toy_pair(prompt, tau, cap, words):
    """The property below on the character-level toy pair, with many examples (the real-pair twin runs a few)."""
    assume(prompt.strip())  # a blank prompt is a PromptError (test_bad_input_is_typed)
    tr = AdaFuse(toy_qa_pair(), DecodeConfig(tau=tau, max_word_tokens=cap, max_new_words=words,
                                             stop=("\n\n",))).generate(prompt)
    assert "".join(r.text for r in tr.rounds) == tr.output and tr.words <= words


@real_decodes(nightly=6)
@given(prompt=TEXTS, tau=st.sampled_from([0.0, 0.5, 1.0]), cap=st.integers(1, 4), mode=st.sampled_from(["raw", "chat"]))
def test_round_texts_add_up_to_the_output(pair, prompt, tau, cap, mode):
    if not prompt.strip():
        return
    tr = AdaFuse(pair, DecodeConfig(tau=tau, max_word_tokens=cap, max_new_words=5, mode=mode,
                                    stop=("\n\n",))).generate(prompt)
    assert "".join(r.text for r in tr.rounds) == tr.output
    assert "\ufffd" not in tr.output


def test_a_de_en_answer_that_ends_at_once_is_one_event_scored_by_the_end_alone(pair):
    """Flores De→En, data line 3: the end of the answer is one candidate whose NLL under each model is
    -log Σ p(end tokens and tokens that start the stop) at the start of the answer, nothing after it (not
    `"\\n\\nGerman:"` scored over the format it continues into). As the paper pools it (`allow_empty`)."""
    prompt, stop = flores_prompt(2), ("\n",)
    tr = AdaFuse(pair, DecodeConfig(stop=stop, max_new_words=3, allow_empty=True)).generate(prompt)
    pool = tr.rounds[0].candidates
    assert all("\n" not in c.text for c in pool)  # no text past the stop is scored
    ends = [c for c in pool if c.eos]
    assert len(ends) == 1 and ends[0].text == ""  # one entry however each model spells the end (here no first word
    # that also ends the answer was proposed)
    for lm in pair:
        s = LocalSession(lm, prompt, stop=stop)
        assert len(s.end_ids) > 1  # the end tokens and the newline-starting ones, pooled
        expected = -torch.logsumexp(s.next_logprobs[sorted(s.end_ids)], dim=0).item()
        assert ends[0].n_tokens[lm.name] == 1
        assert ends[0].nll[lm.name] == pytest.approx(expected, abs=tolerance(lm.dtype))
        assert ends[0].end_term[lm.name] == pytest.approx(-expected, abs=tolerance(lm.dtype))
    # With equal weights the end wins on the end event alone (SmolLM2 gives ending ~14 %, Gemma ~3 %; docs/results.md
    # counts these empties, and the app says why); with the strong model weighted more it is answered.
    assert tr.rounds[0].candidates[tr.rounds[0].chosen] is ends[0] and tr.output == ""
    weighted = AdaFuse(pair, DecodeConfig(stop=stop, max_new_words=3, weights=(1, 9))).generate(prompt)
    check_trace(weighted)
    assert weighted.output.startswith(" Some")


def test_the_newcomers_raw_question_per_token_and_per_word(hamlet, pair):
    """Why per word is the default (docs/weights-and-gates.md, "NLL per word"; measured over many such questions in
    docs/defaults.md): on the bundled pair the bare prompt "Question: Who wrote Hamlet?\\nAnswer:" answers a numbered
    list per token — the paper's rule lets " 1." (an unsure " 1", a sure ".") beat " Shakespeare" — and " Shakespeare",
    then stops at the newline, per word (the default)."""
    by_token, _ = hamlet
    first = by_token.rounds[0]
    scores = {c.text: c.fused for c in first.candidates}
    assert first.candidates[first.winner].text == " 1." and scores[" 1."] < scores[" Shakespeare"], scores
    assert not by_token.output.strip().startswith("Shakespeare") and " 2." in by_token.output
    by_word = AdaFuse(pair, DecodeConfig(stop=("\n",), max_new_words=12)).generate(
        "Question: Who wrote Hamlet?\nAnswer:")
    check_trace(by_word)
    assert "Shakespeare" in by_word.output and len(by_word.output.split()) <= 3, by_word.output
    assert by_word.stop_reason in ("stop string", "eos"), by_word.stop_reason


def test_every_built_in_raw_example_answers_and_stops(pair):
    """The app's raw examples (assets/examples.json) at the library's defaults with the settings each example sets (its
    stop strings, its word cap): every one answers (not empty) and ends at its stop string or the model's end, not at
    the cap. The examples sharing settings decode together (many decodes at once: the same traces as alone)."""
    from adafuse.stops import parse_stops
    from app.controller import load_examples
    groups: dict[tuple, list[dict]] = {}
    for e in load_examples():
        if e["mode"] == "raw":
            groups.setdefault((e["stop"], int(e["max_words"])), []).append(e)
    assert sum(len(g) for g in groups.values()) == 8
    for (stop, words), examples in groups.items():
        traces = AdaFuse(pair, DecodeConfig(stop=parse_stops(stop), max_new_words=words)).generate_many(
            [e["prompt"] for e in examples], concurrency=len(examples))
        for e, t in zip(examples, traces):
            assert t.output.strip() and t.stop_reason in ("stop string", "eos"), (e["label"], t.output,
                                                                                   t.stop_reason)
