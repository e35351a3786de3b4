"""Plot builders and formatting from hand-built traces (no models, no Gradio)."""
import pytest
import plotly.graph_objects as go

from adafuse.report import format_table, round_rows
from adafuse.trace import Candidate, ModelStep, Round, Trace
from app import plots


def trace() -> Trace:
    r0 = Round(0, [ModelStep("a", "commit", [0.9, 0.8], [0], 3, 4, 0.1), ModelStep("b", "commit", [0.75], [0], 1, 1, 0.1)],
               [Candidate(" The sky", False, ["a", "b"], {}, {}, None, 2)], 0, 0, " The sky", 2, 0.2)
    r1 = Round(1, [ModelStep("a", "commit", [0.95], [0], 1, 1, 0.1), ModelStep("b", "explore", [0.2], [1, 2], 2, 6, 0.3)],
               [Candidate(" is", False, ["a"], {"a": 0.1, "b": 0.5}, {"a": 1, "b": 1}, 0.3, 1),
                Candidate(" was", False, ["b"], {"a": 2.0, "b": 0.4}, {"a": 1, "b": 1}, 1.2, 1),
                Candidate(" blue.\n", True, ["b"], {"a": 3.0, "b": 1.0}, {"a": 2, "b": 3}, 2.0, 1)],
               chosen=1, winner=0, text=" was", words=1, seconds=0.4, overridden=True)
    return Trace("Q", ["a", "b"], {"tau": 0.7, "max_words": 3}, {"a": "raw", "b": "raw"}, [r0, r1], " The sky was",
                 prefill={"a": {"prompt_tokens": 5, "forward_passes": 1, "tokens_fed": 5, "seconds": 0.05}})


def test_margins_figure_has_one_line_per_model_and_the_tau_line():
    fig = plots.margins_figure(trace())
    lines = [t for t in fig.data if t.mode == "lines"]
    assert isinstance(fig, go.Figure) and [t.name for t in lines] == ["a", "b"]
    assert list(lines[1].y) == [0.75, 0.2]
    points = {t.name: t for t in fig.data if t.mode == "markers" and t.showlegend is False}
    assert list(points["b · commit"].y) == [0.75] and points["b · commit"].marker.symbol == "circle"
    assert list(points["b · explore"].y) == [0.2] and points["b · explore"].marker.symbol == "x"
    assert fig.layout.xaxis.title.text == "round" and fig.layout.yaxis.title.text == "Δ"
    assert any(s.y0 == 0.7 for s in fig.layout.shapes)


def test_margins_legend_shows_each_kind_with_the_symbol_its_points_use():
    fig = plots.margins_figure(trace())
    shown = [t for t in fig.data if t.showlegend is not False]
    keys = {t.name: t.marker.symbol for t in shown if "markers" in t.mode}
    assert keys == {"commit": "circle", "explore": "x"}
    for t in fig.data:  # one symbol per trace: a legend key cannot show a different one than the points
        if "markers" in t.mode:
            assert isinstance(t.marker.symbol, str)
            kind = t.name.split(" · ")[-1]
            assert t.marker.symbol == keys[kind]
    assert "✕" not in fig.layout.title.text and "●" not in fig.layout.title.text


def test_pool_hover_names_models_in_full_and_labels_the_end_readably():
    t = trace()
    long = "gemma3-270m-it-a-long-model-name"
    t.models[1] = long
    for r in t.rounds:
        r.steps[1].model = long
        for c in r.candidates:
            for f in (c.nll, c.n_tokens):
                if "b" in f:
                    f[long] = f.pop("b")
    t.rounds[1].candidates.append(Candidate("", True, ["a"], {"a": 1.0, long: 1.5}, {"a": 1, long: 1}, 1.25, 0))
    fig = plots.pool_figure(t, 1)
    assert fig.layout.hoverlabel.namelength == -1
    bars = next(d for d in fig.data if d.name == f"NLL {long}")
    assert bars.hovertemplate.endswith("<extra></extra>")  # no cut trace-name box beside the hover
    assert all(long in h for h in bars.hovertext)
    assert list(fig.data[0].x)[3] == "3: ⏎ end"  # an empty end candidate reads "⏎ end", not a bare symbol
    assert fig.layout.xaxis.tickfont.size >= 12
    assert "∎" not in "".join(fig.data[0].x)


def test_pool_figure_bars_per_model_fused_markers_and_winner():
    fig = plots.pool_figure(trace(), 1)
    names = [t.name for t in fig.data]
    assert names == ["NLL a", "NLL b", "fused (mean over models)"]
    assert list(fig.data[2].y) == [0.3, 1.2, 2.0]
    texts = [a.text for a in fig.layout.annotations]
    assert "★ winner" in texts and "✎ your pick" in texts
    winner = next(a for a in fig.layout.annotations if a.text == "★ winner")
    assert winner.x.startswith("0:")
    assert fig.layout.yaxis.title.text.startswith("NLL")
    assert "blue.⏎ ⏎ end" in fig.data[0].x[2]  # newline made visible, the end of the answer labelled


def test_words_per_round_shares():
    fig = plots.words_per_round_figure(trace())
    assert list(fig.data[0].x) == ["1", "2", "3"] and list(fig.data[0].y) == [50.0, 50.0, 0.0]
    assert fig.layout.title.text == "Words per round (2 rounds)"


def test_words_per_round_title_counts_every_round_and_says_which_added_no_words():
    t = trace()
    end = Round(2, [ModelStep("a", "commit", [0.9], [0]), ModelStep("b", "commit", [0.8], [0])],
                [Candidate("", True, ["a", "b"], {}, {}, None, 0)], 0, 0, "", 0, 0.1, stop="eos")
    t.rounds.append(end)
    fig = plots.words_per_round_figure(t)
    assert f"({len(t.rounds)} rounds; 1 added no words" in fig.layout.title.text  # as the app's status counts
    assert list(fig.data[0].y) == [50.0, 50.0, 0.0]  # shares still over the rounds that wrote words


def test_empty_views_do_not_crash():
    for fig in (plots.margins_figure(None), plots.pool_figure(None), plots.words_per_round_figure(None),
                plots.cost_figure(None)):
        assert isinstance(fig, go.Figure) and len(fig.data) == 0
    assert "No output yet" in plots.fused_html(None)
    assert plots.rounds_frame(None).empty


def test_fused_html_marks_kinds_and_escapes():
    t = trace()
    t.rounds[0].text = " <b>The"
    out = plots.fused_html(t)
    assert "&lt;b&gt;" in out and "<b>The" not in out
    assert plots.KIND_COLORS["commit"] in out and plots.KIND_COLORS["override"] in out
    assert 'title="round 1' in out


def empty_trace(**round_kw) -> Trace:
    """Issue 14's De→En example: the end of the answer (one event per model) wins round 0 over every word."""
    steps = [ModelStep("smollm2", "explore", [0.02], [0, 1], 2, 6, 0.2), ModelStep("gemma", "explore", [0.23], [2], 2, 6, 0.3)]
    pool = [Candidate("", True, ["smollm2"], {"smollm2": 1.95, "gemma": 3.61}, {"smollm2": 1, "gemma": 1}, 2.78, 0,
                      end_term={"smollm2": -1.95, "gemma": -3.61}),
            Candidate(" The", False, ["smollm2"], {"smollm2": 2.96, "gemma": 3.76}, {"smollm2": 1, "gemma": 1}, 3.36, 1),
            Candidate(" A", False, ["gemma"], {"smollm2": 3.6, "gemma": 2.64}, {"smollm2": 1, "gemma": 1}, 3.12, 1)]
    r0 = Round(0, steps, pool, 0, 0, "", 0, 0.5, stop="end of answer", **round_kw)
    return Trace("Q", ["smollm2", "gemma"], {"tau": 0.7}, {"smollm2": "raw", "gemma": "raw"}, [r0], "",
                 stop_reason="end of answer")


def test_an_empty_answer_says_why_it_ended_before_its_first_word():
    out = plots.fused_html(empty_trace())
    assert "(empty)" not in out
    assert ("the end of the answer scored 2.78, no higher than every candidate with text (best &quot; A&quot; at 3.12)"
            in out)
    assert "p 0.14 under smollm2, 0.027 under gemma" in out  # exp of each model's end term (one event)
    assert "Weigh gemma more (Model weights), or the others less" in out and "Pool tab" in out
    assert "hand" in plots.fused_html(empty_trace(overridden=True))  # picked in step mode: nothing to explain
    t = empty_trace()
    t.rounds[0].candidates = t.rounds[0].candidates[:1]  # the end was all that was proposed (e.g. the mixture's writer)
    assert "smollm2 proposed to end the answer before its first word, and nothing else" in plots.fused_html(t)
    assert plots.empty_answer_note(trace()) == "(empty)"  # an answer that has text (or a round without the end)
    t = empty_trace()  # a one-word answer that also ends counts as a candidate with text
    t.rounds[0].candidates.append(Candidate(" Yes.", True, ["gemma"], {"smollm2": 3.0, "gemma": 3.0},
                                            {"smollm2": 2, "gemma": 2}, 3.0, 1))
    assert "(best &quot; Yes. ⏎ end&quot; at 3.00)" in plots.fused_html(t)


def test_the_empty_answer_note_advises_weights_only_where_they_could_change_it():
    t = empty_trace()
    for c in t.rounds[0].candidates[1:]:
        c.nll["gemma"] = 4.0  # gemma too prefers ending to every word: no weight makes a word win
    assert "Weigh" not in plots.empty_answer_note(t)
    gated = empty_trace(features={"smollm2": [0.0], "gemma": [0.0]})  # the gate, not the sliders, set the weights
    assert "learned gate set this round's weights" in plots.empty_answer_note(gated)
    assert "Weigh" not in plots.empty_answer_note(gated)
    union = empty_trace()
    union.settings["method"] = "token-union"  # its score ignores weights
    assert "Weigh" not in plots.empty_answer_note(union) and "p 0.14" in plots.empty_answer_note(union)


def test_round_table_and_cost():
    rows = round_rows(trace())
    assert [r["kind"] for r in rows] == ["commit", "override"]
    assert rows[0]["mode a"] == "commit×2" and rows[1]["pool"] == 3 and rows[1]["chosen"] == " was"
    assert "fused NLL" in format_table(rows)
    assert trace().cost("a") == {"forward_passes": 5, "tokens_fed": 10, "seconds": 0.25, "cached_tokens": 0}
    frame = plots.cost_frame(trace(), {"a": trace()})
    assert list(frame["run"]) == ["ensemble", "ensemble", "alone", "alone"]
    assert "ran" not in frame.columns  # a trace that does not say
    t = trace()
    t.devices, t.workers = {"a": "cpu", "b": "cuda:0"}, "parallel (2 workers; measured side by side 0.67× one after another)"
    frame = plots.cost_frame(t).set_index("model")
    assert frame.loc["b", "device"] == "cuda:0" and frame.loc["a", "ran"].startswith("parallel")


def test_cost_view_counts_speculative_drafts_when_they_were_on():
    assert "accepted tokens" not in plots.cost_frame(trace()).columns  # off: no columns for it
    t = trace()
    t.settings["speculate"] = True
    step = t.rounds[1].steps[0]
    step.draft_tokens, step.accepted_tokens, step.verify_passes = 6, 4, 1
    frame = plots.cost_frame(t).set_index("model")
    assert frame.loc["a", "draft tokens"] == 6 and frame.loc["a", "accepted tokens"] == 4
    assert frame.loc["a", "forwards saved"] == 3 and frame.loc["b", "forwards saved"] == 0


def test_pool_view_draws_nll_per_word_when_the_score_averaged_per_word():
    t = trace()
    t.settings["normalize"] = "word"
    fig = plots.pool_figure(t, 1)
    bars = {b.name: list(b.y) for b in fig.data if b.type == "bar"}
    # " blue.\n" ends the answer: b's 3 tokens of NLL 1.0 over 1 word + the end
    assert bars["NLL per word b"] == pytest.approx([0.5, 0.4, 1.5])
    assert "per word" in fig.layout.yaxis.title.text
