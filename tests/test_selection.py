"""Exploration by meaning (adafuse/selection.py): an unsure model's first tokens picked by probability against
redundancy in embedding space, with the reasons recorded."""
import json
import math
from types import SimpleNamespace

import pytest
import torch

from adafuse import AdaFuse, ConfigError, DecodeConfig, Trace
from adafuse.models import LocalModel
from adafuse.selection import check_exploration, select_first_tokens, selection_rows, token_key
from adafuse.models.session import LocalSession
from adafuse.trace import Round
from tests.toy import ToyLM, ToyTokenizer, toy_model


V = ["Q", " Paris", " paris", " PAR", "Paris", " London", " Rome", " is", " nice", ".", "\n"]


# b is unsure: three spellings of one answer on top, a different answer just below them
B_RULES = {"Q": {" Paris": 0.3, " paris": 0.22, " PAR": 0.21, " London": 0.2, "Paris": 0.02},
           " Paris": {"<eos>": 0.9}, " paris": {"<eos>": 0.9}, " PAR": {"<eos>": 0.9}, " London": {"<eos>": 0.9}}


A_RULES = {"Q": {" Paris": 0.9, " London": 0.05}, " Paris": {"<eos>": 0.9}, " London": {"<eos>": 0.9}}


class EmbeddedToyLM(ToyLM):
    """The toy LM with an input-embedding table: the spellings of Paris point one way, everything else elsewhere."""

    def __init__(self, tok, rules, **kw):
        super().__init__(tok, rules, **kw)
        g = torch.Generator().manual_seed(0)
        w = torch.randn(len(tok), 32, generator=g)
        paris = torch.randn(32, generator=g)
        for k, t in enumerate((" Paris", " paris", " PAR", "Paris")):
            w[tok.index[t]] = paris + 0.05 * k * torch.randn(32, generator=g)
        self.embed = torch.nn.Embedding.from_pretrained(w)

    def get_input_embeddings(self):
        return self.embed


def embedded(name: str, rules: dict) -> LocalModel:
    tok = ToyTokenizer(V)
    return LocalModel.from_objects(name, EmbeddedToyLM(tok, rules), tok)


def models():
    return [embedded("a", A_RULES), embedded("b", B_RULES)]


def explored(cfg: DecodeConfig, ms=None):
    d = AdaFuse(ms or models(), cfg).start("Q")
    r = d.propose()
    step = r.steps[1]
    assert step.mode == "explore"
    return d, r, step, [r.candidates[i].text for i in step.proposals]


def test_surface_keeps_spellings_embedding_finds_the_other_answer():
    _, _, step, texts = explored(DecodeConfig(branches=3))
    assert texts == [" Paris", " paris", " PAR"]  # three spellings of one answer
    _, _, step, texts = explored(DecodeConfig(branches=3, exploration="embedding"))
    assert texts[:2] == [" Paris", " London"]  # the different answer below the spellings is picked second
    assert " London" in texts and len(texts) == 3
    sel = step.selection
    assert sel["strategy"] == "embedding" and sel["lambda"] == 1.0 and sel["bandwidth"] > 0
    picked = [t for t in sel["tokens"] if t["picked"]]
    assert sorted(t["order"] for t in picked) == [1, 2, 3]
    by_text = {t["text"]: t for t in sel["tokens"]}
    assert by_text[" Paris"]["order"] == 1 and by_text[" Paris"]["penalty"] == 0.0
    assert by_text[" London"]["order"] == 2
    # a spelling of a picked token pays almost the whole λ; the other answer little
    assert by_text[" paris"]["similarity"] > 0.9 and by_text[" London"]["similarity"] < 0.7
    for t in sel["tokens"]:
        assert t["score"] == pytest.approx(math.log(t["p"]) - t["penalty"], abs=1e-5)
        assert t["penalty"] == pytest.approx(1.0 * (t["similarity"] or 0.0), abs=1e-9)


def test_selection_is_deterministic_and_its_cost_is_counted_on_the_view():
    d1, r1, s1, _ = explored(DecodeConfig(branches=3, exploration="embedding"))
    _, r2, s2, _ = explored(DecodeConfig(branches=3, exploration="embedding"))
    assert s1.selection == s2.selection
    view = d1.sessions[1]
    assert view.selections_made == 1 and view.selection_seconds > 0
    assert d1.sessions[0].selections_made == 0  # the confident model committed


def test_b2_the_first_token_stays_top1_and_the_second_is_the_other_answer():
    _, _, _, surface = explored(DecodeConfig(branches=2))
    _, _, _, meaning = explored(DecodeConfig(branches=2, exploration="embedding"))
    assert surface == [" Paris", " paris"]
    assert meaning == [" Paris", " London"]


def test_lambda_zero_is_the_surface_strategy_exactly():
    _, r0, step0, zero = explored(DecodeConfig(branches=3, exploration="embedding", explore_lambda=0))
    _, rs, steps, surface = explored(DecodeConfig(branches=3))
    assert zero == surface
    assert [c.text for c in r0.candidates] == [c.text for c in rs.candidates]
    assert all(t["penalty"] == 0.0 for t in step0.selection["tokens"])
    assert step0.selection["bandwidth"] is None  # no embeddings were needed


def test_a_large_lambda_still_never_picks_two_spellings_of_one_surface():
    # " Paris" and "Paris" strip to the same text: never both picked, whatever λ
    _, _, step, texts = explored(DecodeConfig(branches=5, exploration="embedding", explore_lambda=50))
    assert not {" Paris", "Paris"} <= set(texts)
    skipped = [t for t in step.selection["tokens"] if t["text"] == "Paris"]
    assert skipped and skipped[0]["skip"] == "surface" and not skipped[0]["picked"]


def test_surface_selection_records_why_and_takes_distinct_surfaces_by_probability():
    _, _, step, texts = explored(DecodeConfig(branches=3))
    sel = step.selection
    assert sel["strategy"] == "surface"
    assert [t["text"] for t in sel["tokens"] if t["picked"]] == texts
    assert all(t["penalty"] == 0.0 for t in sel["tokens"])
    d = AdaFuse(models(), DecodeConfig()).start("Q")
    s = d.sessions[1]
    by_probability = [" Paris", " paris", " PAR", " London"]  # "Paris" (0.02) strips to the surface of " Paris"
    for b in (1, 2, 3, 4, 5):
        chosen, _ = select_first_tokens(s, s.next_logprobs, b, 64, "surface")
        texts = [s.lm.tokenizer.tokens[t] for t in chosen]
        assert len(texts) == b and texts[:4] == by_probability[:b] and "Paris" not in texts


def test_special_and_end_tokens_are_handled_like_first_tokens():
    rules = dict(B_RULES, Q={"<eos>": 0.3, "<bos>": 0.25, " paris": 0.2, " London": 0.19, " Paris": 0.01})
    ms = [embedded("a", A_RULES), embedded("b", rules)]
    _, r, step, texts = explored(DecodeConfig(branches=2, exploration="embedding"), ms)
    toks = {t["token"]: t for t in step.selection["tokens"]}
    tok = ms[1].tokenizer
    assert toks[tok.index["<bos>"]]["skip"] == "special" and not toks[tok.index["<bos>"]]["picked"]
    assert toks[tok.index["<eos>"]]["end"] and toks[tok.index["<eos>"]]["order"] == 1  # the end stays the top-1 pick
    assert any(r.candidates[i].eos for i in step.proposals)


def test_selection_rows_say_why_each_token_was_picked_or_skipped():
    _, r, _, _ = explored(DecodeConfig(branches=3, exploration="embedding"))
    tr = Trace(prompt="Q", models=["a", "b"], settings={}, prompt_modes={}, rounds=[])
    tr.rounds.append(Round(index=0, steps=r.steps, candidates=r.candidates, chosen=0, winner=0, text="", words=0,
                           seconds=0.0))
    rows = selection_rows(tr, 0)
    assert rows and all(row["model"] == "b" for row in rows)
    whys = {row["token"]: row["why"] for row in rows}
    assert whys["' Paris'"].startswith("picked 1st")
    assert whys["' London'"].startswith("picked 2nd")
    assert "too close to ' Paris'" in whys["' PAR'"] or "too close to ' Paris'" in whys["' paris'"]
    assert {"rank", "p", "penalty", "score", "picked", "order"} <= set(rows[0])
    with pytest.raises(ConfigError):
        selection_rows(tr, 3)


def test_the_trace_is_strict_json_and_reloads():
    tr = AdaFuse(models(), DecodeConfig(branches=3, exploration="embedding", max_new_words=4)).generate("Q")
    text = tr.to_json()
    assert "NaN" not in text and "Infinity" not in text
    back = Trace.from_dict(json.loads(text))
    sels = [s.selection for r in back.rounds for s in r.steps if s.mode == "explore"]
    assert sels and all(sel["tokens"] for sel in sels)
    assert back.settings["exploration"] == "embedding" and back.settings["explore_lambda"] == 1.0
    old = json.loads(text)  # a trace written before the field existed still loads
    for r in old["rounds"]:
        for s in r["steps"]:
            s.pop("selection")
    assert Trace.from_dict(old).rounds[0].steps[1].selection == {}
    bad = json.loads(text)
    bad["rounds"][0]["steps"][1]["selection"]["tokens"][0]["p"] = "high"
    with pytest.raises(Exception, match="selection"):
        Trace.from_dict(bad)


def test_a_model_without_weights_here_is_refused_before_any_round():
    plain = [toy_model("a", V, A_RULES), toy_model("b", V, B_RULES)]  # no input embeddings, like a served model
    with pytest.raises(ConfigError, match="served model explores by surface form"):
        AdaFuse(plain, DecodeConfig(exploration="embedding")).start("Q")
    AdaFuse(plain, DecodeConfig()).start("Q").propose()  # surface needs no weights
    with pytest.raises(ConfigError, match="needs the model's weights"):
        check_exploration([SimpleNamespace(name="m@server", model=None)])


def test_real_pair_decodes_with_embedding_exploration(pair):
    prompt = "Question: who wrote the novel moby dick?\nAnswer:"
    cfg = DecodeConfig(exploration="embedding", stop=("\n",), max_new_words=8, tau=0.95)
    tr = AdaFuse(pair, cfg).generate(prompt)
    steps = [s for r in tr.rounds for s in r.steps if s.mode == "explore"]
    assert steps, "tau=0.95 makes the models explore"
    for s in steps:
        sel = s.selection
        assert sel["strategy"] == "embedding" and sel["tokens"]
        picked = [t["token"] for t in sel["tokens"] if t["picked"]]
        assert len(picked) == len(set(picked)) == cfg.branches  # B distinct first tokens
        assert sorted(t["order"] for t in sel["tokens"] if t["picked"]) == list(range(1, cfg.branches + 1))
        assert 0 < len(s.proposals) <= len(picked)  # a candidate per pick; picks that spell the same word are one
    Trace.from_dict(json.loads(tr.to_json()))
    # surface selection on the real distributions: the B most probable tokens of distinct surface forms
    s = LocalSession(pair[1], prompt)
    lp = s.next_logprobs
    for b in (2, 3, 5):
        chosen = select_first_tokens(s, lp, b, 64)[0]
        keys = [token_key(s, t)[0] for t in chosen]
        assert len(chosen) == b and None not in keys and len(set(keys)) == b
        assert lp[chosen].tolist() == sorted(lp[chosen].tolist(), reverse=True)
        for t in torch.topk(lp, 64).indices.tolist():  # every likelier token left out is a picked surface or unusable
            if lp[t] <= lp[chosen[-1]]:
                break
            assert t in chosen or token_key(s, t)[0] in keys or token_key(s, t)[0] is None, s.lm.decode([t])
