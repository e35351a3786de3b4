"""Plot builders and formatting (app/plots.py) from hand-built traces (no models, no Gradio)."""
import pytest
import plotly.graph_objects as go

from adafuse.trace import Candidate, ModelStep, Round
from app import plots
from tests.traces import empty_trace, two_rounds


def test_margins_figure_has_one_line_per_model_and_the_tau_line():
    fig = plots.margins_figure(two_rounds())
    lines = [t for t in fig.data if t.mode == "lines"]
    assert isinstance(fig, go.Figure) and [t.name for t in lines] == ["a", "b", "τΔ"]
    assert list(lines[1].y) == [0.75, 0.2]
    points = {t.name: t for t in fig.data if t.mode == "markers" and t.showlegend is False}
    assert list(points["b · commit"].y) == [0.75] and points["b · commit"].marker.symbol == "circle"
    assert list(points["b · explore"].y) == [0.2] and points["b · explore"].marker.symbol == "x"
    assert fig.layout.xaxis.title.text == "round" and fig.layout.yaxis.title.text == "Δ"
    assert set(lines[2].y) == {0.7} and min(lines[2].x) == 0 and max(lines[2].x) == 1.5


def test_margins_tau_line_follows_a_change_made_mid_decode_and_marks_it():
    t = two_rounds()
    t.changes.append({"from_round": 1, "settings": {"tau": 0.3, "branches": 2}})
    fig = plots.margins_figure(t)
    tau = next(tr for tr in fig.data if tr.name == "τΔ")
    assert list(zip(tau.x, tau.y)) == [(0, 0.7), (0.5, 0.7), (0.5, 0.3), (1.5, 0.3)]
    marks = [a.text for a in fig.layout.annotations if "from round" in (a.text or "")]
    assert marks == ["from round 1: τΔ → 0.3, B → 2"]
    assert [s.x0 for s in fig.layout.shapes] == [0.5]


def test_margins_legend_shows_each_kind_with_the_symbol_its_points_use():
    fig = plots.margins_figure(two_rounds())
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
    t = two_rounds()
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
    bars = next(d for d in fig.data if d.name == f"NLL per token {long}")
    assert bars.hovertemplate.endswith("<extra></extra>")  # no cut trace-name box beside the hover
    assert all(long in h for h in bars.hovertext)
    assert list(fig.data[0].x)[3] == "3: ⏎ end"  # an empty end candidate reads "⏎ end", not a bare symbol
    assert fig.layout.xaxis.tickfont.size >= 12
    assert "∎" not in "".join(fig.data[0].x)


def test_pool_figure_bars_per_model_fused_markers_and_winner():
    fig = plots.pool_figure(two_rounds(), 1)
    names = [t.name for t in fig.data]
    assert names == ["NLL per token a", "NLL per token b", "fused (mean over models)"]
    assert list(fig.data[2].y) == [0.3, 1.2, 2.0]
    texts = [a.text for a in fig.layout.annotations]
    assert "★ winner" in texts and "✎ your pick" in texts
    winner = next(a for a in fig.layout.annotations if a.text == "★ winner")
    assert winner.x.startswith("0:")
    assert fig.layout.yaxis.title.text.startswith("NLL")
    assert "blue.⏎ ⏎ end" in fig.data[0].x[2]  # newline made visible, the end of the answer labelled
    assert "You picked “ was”; the scores preferred “ is”" in fig.layout.title.text  # the round in words


def test_words_per_round_shares():
    fig = plots.words_per_round_figure(two_rounds())
    assert list(fig.data[0].x) == ["1", "2", "3"] and list(fig.data[0].y) == [50.0, 50.0, 0.0]
    assert fig.layout.title.text == "Words per round (2 rounds)"


def test_words_per_round_title_counts_every_round_and_says_which_added_no_words():
    t = two_rounds()
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
    t = two_rounds()
    t.rounds[0].text = " <b>The"
    out = plots.fused_html(t)
    assert "&lt;b&gt;" in out and "<b>The" not in out
    assert plots.KIND_COLORS["commit"] in out and plots.KIND_COLORS["override"] in out
    assert 'title="round 1' in out


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
    assert plots.empty_answer_note(two_rounds()) == "(empty)"  # an answer that has text (or a round without the end)
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


def test_cost_frame_has_a_row_per_model_and_run_and_says_where_it_ran():
    frame = plots.cost_frame(two_rounds(), {"a": two_rounds()})
    assert list(frame["run"]) == ["ensemble", "ensemble", "alone", "alone"]
    assert "ran" not in frame.columns  # a trace that does not say
    t = two_rounds()
    t.devices, t.workers = {"a": "cpu", "b": "cuda:0"}, "parallel (2 workers; measured side by side 0.67× one after another)"
    frame = plots.cost_frame(t).set_index("model")
    assert frame.loc["b", "device"] == "cuda:0" and frame.loc["a", "ran"].startswith("parallel")


def test_cost_view_counts_speculative_drafts_when_they_were_on():
    assert "accepted tokens" not in plots.cost_frame(two_rounds()).columns  # off: no columns for it
    t = two_rounds()
    t.settings["speculate"] = True
    step = t.rounds[1].steps[0]
    step.draft_tokens, step.accepted_tokens, step.verify_passes = 6, 4, 1
    frame = plots.cost_frame(t).set_index("model")
    assert frame.loc["a", "draft tokens"] == 6 and frame.loc["a", "accepted tokens"] == 4
    assert frame.loc["a", "forwards saved"] == 3 and frame.loc["b", "forwards saved"] == 0


def test_pool_view_draws_nll_per_word_when_the_score_averaged_per_word():
    t = two_rounds()
    t.settings["normalize"] = "word"
    fig = plots.pool_figure(t, 1)
    bars = {b.name: list(b.y) for b in fig.data if b.type == "bar"}
    # " blue.\n" ends the answer: b's 3 tokens of NLL 1.0 over 1 word + the end
    assert bars["NLL per word b"] == pytest.approx([0.5, 0.4, 1.5])
    assert "per word" in fig.layout.yaxis.title.text


def test_hover_tips_say_why_a_round_won_and_a_single_model_is_titled_as_alone():
    from adafuse.trace import Trace
    t = two_rounds()
    r1 = t.rounds[1]
    assert plots.why_won(t, t.rounds[0]) == "the only candidate: every model was confident (Δ ≥ τΔ)"
    assert plots.why_won(t, r1) == "your pick; the scores preferred “ is”"
    r1.chosen, r1.overridden = 0, False
    assert plots.why_won(t, r1) == ("beat runner-up “ was” by 0.900 fused NLL (0.300 vs 1.200; NLL per token "
                                    "a 0.10 vs 2.00, b 0.50 vs 0.40)")
    t.settings["normalize"] = "word"  # the NLLs as the fused score took them: per word, the end counted as a word
    r1.weights = {"a": 1.0, "b": 3.0}
    assert "NLL per word a 0.10 vs 2.00, b 0.50 vs 0.40; weights a 1, b 3" in plots.why_won(t, r1)
    alone = Trace("Q", ["a"], {"method": "greedy"}, {"a": "raw"}, [t.rounds[0]], " The sky")
    assert plots.title(alone) == "a alone (greedy)" and plots.title(t) == "AdaFuse (fused)"
    html_ = plots.fused_html(alone)
    assert "written by a alone" in html_ and "committed by confident models" not in html_
    assert "own next word (one model, greedy)" in html_ and "1 round · 2 words" in html_
    assert "paused: Step › or ▶ Run continues" in plots.fused_html(t, paused=True)
    assert "paused" not in plots.fused_html(t)
