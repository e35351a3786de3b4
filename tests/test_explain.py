"""Explanations (adafuse/explain.py): the decision tree's HTML and the token view, from hand-built traces and toy LMs,
and on the bundled pair once."""
from html.parser import HTMLParser

import pytest

from adafuse import AdaFuse, ConfigError, DecodeConfig
from adafuse.explain import token_view
from app.explain_html import token_view_html, tree_html
from adafuse.trace import Round, Trace
from tests.toy import V, toy_model, toy_pair
from tests.traces import hand_trace

ONE_WORD = DecodeConfig(max_words=1)  # a commits one word a round: " Paris", " is", " nice." (3 rounds, 3 pools)


def original() -> Trace:
    return AdaFuse(toy_pair(), ONE_WORD).generate("Q")


class Nodes(HTMLParser):
    """Collects every element carrying data-node, with its tag and attributes."""

    def __init__(self):
        super().__init__()
        self.nodes = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-node" in a:
            self.nodes.append((tag, a))


def test_tree_nodes_are_buttons_except_the_chosen_path():
    out = tree_html(hand_trace())
    p = Nodes()
    p.feed(out)
    by = {a["data-node"]: (tag, a) for tag, a in p.nodes}
    assert set(by) == {"0:0", "1:0", "1:1", "1:2"}
    for key in ("1:0", "1:2"):
        tag, a = by[key]
        assert tag == "button" and a["type"] == "button" and "af-node" in a["class"]
    for key in ("0:0", "1:1"):
        tag, a = by[key]
        assert tag != "button" and a["aria-current"] == "step" and "chosen" in a["aria-label"]
        assert "af-chosen" in a["class"]
    # details in the visible text (a button's accessible name) or the chosen group's aria-label, not in hover titles
    label = by["1:1"][1]["aria-label"]
    assert "proposed by" in label and "fused" in label and "aria-label" not in out.split('data-node="1:0"')[1][:40]
    assert "title=" not in out
    assert "NLL per token a 0.100 · b 0.500" in out and "fused 0.300" in out and "by a, b" in out


def test_tree_shows_model_nlls_averaged_as_the_fused_score_is():
    from dataclasses import replace
    t = hand_trace()
    multi = replace(t.rounds[1].candidates[0], text=" 1.", nll={"a": 1.053, "b": 2.291}, n_tokens={"a": 3, "b": 3},
                    fused=5.016, words=1)  # per word: 3 tokens' mean NLL × 3 over one word
    t.rounds[1].candidates[0] = multi
    t.settings["normalize"] = "word"
    out = tree_html(t)
    assert "NLL per word a 3.159 · b 6.873" in out and "fused 5.016" in out  # (3.159 + 6.873) / 2 = 5.016


def test_tree_marks_overrides_kinds_and_the_end_in_words_and_escapes():
    out = tree_html(hand_trace())
    assert "★ score winner" in out and "✓ chosen (your pick)" in out  # both the winner and your pick
    assert "af-override" in out and ">override (your pick)<" in out and ">commit<" in out
    assert "2: ⏎ end" in out and "⏎ ends the answer" in out
    assert "&lt;b&gt;sky" in out and "<b>sky" not in out
    assert out.count("<style>") == 1 and tree_html(hand_trace(), style=False).count("<style>") == 0


def test_tree_marks_where_branches_leave_and_stays_scrollable_for_long_decodes():
    main = hand_trace()
    alt = hand_trace()
    alt.output = "a <i>different</i> ending"
    out = tree_html(main, {"alt <1>": (1, 2, alt), "stale": (9, 0, alt)})
    p = Nodes()
    p.feed(out)
    node = dict((a["data-node"], a) for _, a in p.nodes)["1:2"]
    assert "af-branch-point" in node["class"] and "aria-label" not in node  # named by its text: "↪ branch alt <1>"
    assert "↪ branch alt &lt;1&gt;" in out and "a &lt;i&gt;different&lt;/i&gt; ending" in out
    assert "stale" in out and "not in this trace" in out
    r = main.rounds[1]
    long = Trace("Q", ["a", "b"], {}, {}, [Round(i, r.steps, r.candidates, 0, 0, " x", 1, 0.0) for i in range(45)])
    out = tree_html(long)
    assert out.count('class="af-round"') == 45 and "overflow-x:auto" in out and 'data-node="44:2"' in out
    assert "No rounds yet" in tree_html(None)


def test_token_view_matches_the_recorded_scores_margins_and_end_terms():
    tr = original()
    models = list(toy_pair())
    for r in tr.rounds:
        for j, c in enumerate(r.candidates):
            rows = token_view(models, tr, r.index, j, top_k=4)
            assert [row["model"] for row in rows] == ["a", "b"]
            for row, step in zip(rows, r.steps):
                assert row["nll"] == pytest.approx(c.nll[row["model"]], abs=1e-4)
                assert row["n_tokens"] == c.n_tokens[row["model"]] and row["nll_sum"] == pytest.approx(
                    row["nll"] * row["n_tokens"])
                probs = [t["prob"] for t in row["top"]]
                assert len(probs) == 4 and probs == sorted(probs, reverse=True)
                assert row["margin"] == pytest.approx(probs[0] - probs[1], abs=1e-6)
                assert row["margin"] == pytest.approx(step.margins[0], abs=1e-5)
                if c.eos:
                    assert row["tokens"][-1]["part"] == "end"
                    assert row["end_term"] == pytest.approx(c.end_term[row["model"]], abs=1e-5)
                assert "".join(t["text"] for t in row["tokens"]) == c.text


def test_token_view_shows_the_token_that_straddles_the_word_boundary():
    vocab = V + [" Paris is"]  # " Paris" + " is" re-tokenize as one token reaching back into the committed text
    rules = {"Q": {" Paris": 0.9}, " Paris": {" is": 0.5, " big": 0.4}, " is": {" nice": 0.9}, " nice": {"<eos>": 0.9}}
    a, b = toy_model("a", vocab, rules), toy_model("b", vocab, rules)
    tr = AdaFuse([a, b], DecodeConfig(max_words=1, tau=0.7)).generate("Q")
    r = tr.rounds[1]
    j = next(k for k, c in enumerate(r.candidates) if c.text == " is")
    assert r.candidates[j].straddle["a"]
    rows = token_view([a, b], tr, 1, j)
    for row in rows:
        assert row["straddle"] and [(t["text"], t["part"]) for t in row["tokens"]] == [(" Paris is", "straddle")]
        assert row["nll"] == pytest.approx(r.candidates[j].nll[row["model"]], abs=1e-4)
    assert "straddles the word boundary" in token_view_html(rows)


def test_token_view_needs_the_traces_models_and_valid_indices():
    tr = original()
    a, b = toy_pair()
    with pytest.raises(ConfigError, match="decoded by b"):
        token_view([a], tr, 0, 0)
    with pytest.raises(ConfigError, match=r"pick 0\.\.2"):
        token_view([a, b], tr, 5, 0)
    with pytest.raises(ConfigError, match="not a candidate of round 0"):
        token_view([a, b], tr, 0, 9)


def test_token_view_html_has_headers_visible_whitespace_and_escapes():
    row = {"model": "m<1>", "round": 2, "candidate": 1, "label": " <x>", "tokens": [
        {"id": 5, "text": " <x>\n", "logprob": -0.5, "prob": 0.61, "part": "candidate"},
        {"id": -1, "text": "", "logprob": -0.1, "prob": 0.9, "part": "end"}],
        "straddle": False, "end_term": -0.1, "n_tokens": 2, "nll_sum": 0.6, "nll": 0.3, "recorded_nll": 0.3,
        "recorded_n_tokens": 2, "note": "", "top": [{"id": 5, "text": " a", "prob": 0.7, "end": False,
                                                    "in_candidate": True}],
        "margin": 0.6, "recorded_margin": 0.6}
    out = token_view_html([row])
    assert '<th scope="col">token</th>' in out and "<caption>" in out and "m&lt;1&gt;" in out
    assert "·</span>&lt;x&gt;" in out and "⏎</span>" in out and "⏎ end" in out and "<x>" not in out
    assert "Δ = p1 − p2 = 0.6000" in out


def test_token_view_counts_a_stop_string_of_several_tokens_in_the_end_term():
    vocab = ["Q", "A", ":", "\n", " x", " y", " Q"]
    rules = {"A:": {" x": 0.6, " y": 0.3}, " x": {"\n": 0.9, "<eos>": 0.01}, "\n": {"Q": 0.8}, "\nQ": {":": 0.9}}
    models = [toy_model("m", vocab, rules), toy_model("o", vocab, {"A:": {" x": 0.7}, " x": {"\n": 0.8},
                                                                   "\n": {"Q": 0.9}, "\nQ": {":": 0.9}})]
    tr = AdaFuse(models, DecodeConfig(tau=0.5, max_words=3, stop=("\nQ:",), score_single=True)).generate("A:")
    ends = [(r, j, c) for r in tr.rounds for j, c in enumerate(r.candidates) if c.eos]
    assert ends
    for r, j, c in ends:
        for row in token_view(models, tr, r.index, j):
            assert row["end_term"] == pytest.approx(c.end_term[row["model"]], abs=1e-6)
            assert row["nll"] == pytest.approx(c.nll[row["model"]], abs=1e-6)
            assert row["n_tokens"] == c.n_tokens[row["model"]]
            assert "stop string spelled over several tokens" in row["note"]


def test_real_pair_token_view_matches_the_trace(pair, hamlet):
    tr, R = hamlet
    r = tr.rounds[R]
    for j, c in enumerate(r.candidates):
        rows = token_view(pair, tr, R, j)
        for row in rows:
            assert row["nll"] == pytest.approx(c.nll[row["model"]], abs=1e-4)
            assert row["n_tokens"] == c.n_tokens[row["model"]]
            probs = [t["prob"] for t in row["top"]]
            assert probs == sorted(probs, reverse=True)
            assert row["margin"] == pytest.approx(probs[0] - probs[1], abs=1e-6)
    assert token_view_html(rows).count("<table") == 2 * len(rows)
