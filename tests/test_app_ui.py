"""The app's settings widgets (app/views.py, app/layout.py, app/sliders.py): gates pick their NLL averaging, a value
typed into a slider's box becomes the nearest one the slider shows, and the page says so."""
import pytest

from adafuse.errors import ConfigError


def test_picking_a_gate_sets_the_nll_averaging_it_was_trained_with(tmp_path):
    from adafuse.gate import Gate
    from app.views import gate_normalize
    word, token = tmp_path / "word.json", tmp_path / "token.json"
    Gate(["a", "b"], Gate.zeros(["a", "b"]).W, [0.0, 0.0], trained={"normalize": "word"}).save(word)
    Gate.zeros(["a", "b"]).save(token)
    assert gate_normalize(str(word), "per token (paper)") == "per word"
    assert gate_normalize(str(token), "per word") == "per token (paper)"
    assert gate_normalize("", "per word") == "per word"  # no gate: the user's choice stays
    (tmp_path / "bad.json").write_text("not json")
    assert gate_normalize(str(tmp_path / "bad.json"), "per word") == "per word"  # the run reports the bad file


def test_slider_boxes_take_whole_counts_and_some_weight():
    from app.views import _settings
    base = dict(names=["a", "b"], tau=0.7, max_words=3, branches=3, diversity=True, exploration="surface", lam=1.0,
                max_new_words=20, max_new_tokens=80, mode="raw", stop="", system="", thinking="template default",
                speculate=False, normalize="per token (paper)", allow_empty=False, gate="")

    def settings(weights=(1, 1), **kw):
        return _settings(*{**base, **kw}.values(), *weights)

    assert settings(max_words=2.0).max_words == 2 and settings(weights=(1, 3)).weights == (1.0, 3.0)
    # a value typed into a box is what the slider shows of it (the page snaps the box alike, and says so)
    assert settings(branches=3.5).branches == 4 and settings(max_words=12).max_words == 5
    assert settings(tau=1.5).tau == 1 and settings(tau=0.33).tau == 0.35
    assert settings(max_new_tokens=100).max_new_tokens == 96
    with pytest.raises(ConfigError, match=r"B \(candidates .*\) takes whole numbers from 1 to 8: 'x' is not a number"):
        settings(branches="x")
    with pytest.raises(ConfigError, match="weight is 0"):
        settings(weights=(0, 0))
    assert settings(weights=(0, 0), gate="g.json").gate == "g.json"  # a gate replaces the sliders


def test_the_gate_menu_says_what_each_gates_validation_found(tmp_path, monkeypatch):
    """The menu's words about a gate come from its file's "validated" record: a gate that did not beat equal weights
    on unseen lines is marked experimental, with its numbers; a changed file is read again."""
    import json

    from adafuse.gate import Gate
    from app import views as ui
    from tests.test_gate import validated_record
    monkeypatch.setattr(ui, "GATES", tmp_path)
    g = Gate.zeros(["a", "b"])
    g.trained = {"tasks": ["squad"]}
    g.validated = validated_record()
    g.save(tmp_path / "qa.json")
    Gate.zeros(["a", "b"]).save(tmp_path / "plain.json")
    (tmp_path / "broken.json").write_text("not json")
    labels = dict((path, label) for label, path in ui.gate_choices())
    assert set(labels) == {"", str(tmp_path / "qa.json"), str(tmp_path / "plain.json")}  # a broken file is left out
    qa = labels[str(tmp_path / "qa.json")]
    assert qa.startswith("qa (experimental): a + b · trained on squad")
    assert qa.endswith("experimental: −9.1 F1 vs equal weights on 25 unseen SQuAD lines")
    assert labels[str(tmp_path / "plain.json")].endswith("not validated")
    raw = json.loads((tmp_path / "qa.json").read_text())
    raw["validated"].update(helps=True, summary="helps: +4.0 F1 vs equal weights on 50 unseen SQuAD lines")
    (tmp_path / "qa.json").write_text(json.dumps(raw))
    qa = dict((path, label) for label, path in ui.gate_choices())[str(tmp_path / "qa.json")]
    assert qa.startswith("qa: a + b") and qa.endswith("helps: +4.0 F1 vs equal weights on 50 unseen SQuAD lines")


def test_the_round_slider_shows_only_where_there_is_a_round_to_pick():
    """A decode of one round has nothing to pick: the Pool's round slider is hidden rather than a 0..1 range."""
    from adafuse import AdaFuse, DecodeConfig
    from app.controller import Explorer
    from app.views import render
    from tests.toy import toy_pair

    def slider(cfg):
        ex = Explorer()
        ex.trace = AdaFuse(list(toy_pair()), cfg).generate("Q")
        return len(ex.trace.rounds), render(ex)[8]
    one, update = slider(DecodeConfig(max_words=5))
    assert one == 1 and update["visible"] is False
    many, update = slider(DecodeConfig(max_words=1))
    assert many > 1 and update["visible"] is True and update["maximum"] == many - 1


@pytest.mark.parametrize("spec, typed, value, said", [
    ("TAU", 1.5, 1, "τΔ takes values from 0 to 1 in steps of 0.05: 1.5 is set to 1"),
    ("TAU", -0.2, 0, "-0.2 is set to 0"),
    ("TAU", 0.33, 0.35, "0.33 is set to 0.35"),
    ("BRANCHES", 3.5, 4, "B (candidates an uncertain model explores) takes whole numbers from 1 to 8: 3.5 is set to "
                         "4"),
    ("BRANCHES", 0, 1, "0 is set to 1"),
    ("MAX_WORDS", 12, 5, "M (most words a confident model commits) takes whole numbers from 1 to 5: 12 is set to 5"),
    ("MAX_NEW_TOKENS", 100, 96, "Max new tokens takes values from 16 to 2048 in steps of 16: 100 is set to 96"),
    ("MAX_NEW_WORDS", None, 1, "an empty box is set to 1"),
])
def test_a_typed_value_the_slider_cannot_show_is_snapped_and_said(monkeypatch, spec, typed, value, said):
    """When the box loses focus (its release), the page's box and bar get the nearest value the slider shows and a
    message names the range; the decode reads the same value (`Spec.snap`)."""
    from app import sliders
    warned = []
    monkeypatch.setattr(sliders.gr, "Warning", warned.append)
    s = getattr(sliders, spec)
    assert sliders.snap_typed(s)(typed) == value == s.snap(typed)
    assert warned and said in warned[0], warned


def test_a_value_the_slider_shows_is_left_as_it_is(monkeypatch):
    from app import sliders
    monkeypatch.setattr(sliders.gr, "Warning", lambda msg: pytest.fail(f"warned: {msg}"))
    for s, v in ((sliders.TAU, 0.7), (sliders.BRANCHES, 3), (sliders.MAX_NEW_TOKENS, 1024), (sliders.WEIGHT, 2.25)):
        assert s.snap(v) == v and sliders.snap_typed(s)(v) == {"__type__": "update"}


def test_the_settings_sliders_take_typed_values_without_gradios_range_error():
    """Gradio's slider raises "Value 1.5 is greater than maximum value 1." at every keystroke, before any handler:
    the page's settings pass the value on, to be snapped."""
    from app import layout
    from types import SimpleNamespace
    ui = SimpleNamespace()
    layout.settings_controls(ui)
    assert ui.tau.preprocess(1.5) == 1.5 and ui.branches.preprocess(3.5) == 3.5
    assert ui.tau.get_block_name() == "slider"  # Gradio's own slider, with every prop it reads
    assert {k: ui.branches.get_config()[k] for k in ("minimum", "maximum", "step", "elem_id")} == \
        {"minimum": 1, "maximum": 8, "step": 1, "elem_id": "af-b"}


def test_the_apps_queue_looks_for_work_every_20_ms_not_every_millisecond():
    """Gradio's queue polls every 1 ms while idle (an idle toy app: 1.10 CPU-seconds in 15 s; 0.19 with `queued`)."""
    import gradio as gr
    from app.ui import QUEUE_POLL_S, queued
    with gr.Blocks() as demo:
        gr.Markdown("x")
    assert demo.queue()._queue.sleep_when_free < QUEUE_POLL_S  # Gradio's own: what `queued` changes
    q = queued(demo, max_size=3)._queue
    assert q.sleep_when_free == q.progress_update_sleep_when_free == QUEUE_POLL_S and q.max_size == 3


def test_the_bare_question_hint_follows_every_change_of_the_prompt_and_runs_in_order_with_the_frame():
    """Typing a bare question and clicking the frame at once: a hint decision read from the text before the click
    landed after the frame's and left the hint up under a framed prompt (a CI run). The hint is one handler on every
    change of the prompt or mode (the frame's own change included, always_last), and the prompt's handlers run one
    at a time in the order sent."""
    from app import teach
    from app.handlers import on_prompt
    from app.ui import build_demo
    demo = build_demo()
    by_id = {b._id: b for b in demo.blocks.values()}
    deps = demo.config["dependencies"]
    fns = demo.fns

    def of(fn):
        return [(d, fns[d["id"]]) for d in deps if fns[d["id"]].fn is fn]

    (hint, _), = of(teach.on_bare)
    triggers = {(getattr(by_id.get(t), "label", None), e) for t, e in hint["targets"]}
    assert {("Prompt", "change"), ("Prompt mode", "change")} <= triggers and hint["trigger_mode"] == "always_last"
    ordered = [f for _, f in of(teach.on_bare) + of(teach.on_frame) + of(teach.on_chat) + of(on_prompt)
               if f.concurrency_id == "prompt"]
    # the hint, the frame, chat, and on_prompt on every change of the prompt or mode (and at load)
    assert len(ordered) == 4 and all(f.concurrency_limit == 1 for f in ordered)


def test_a_proposal_from_an_earlier_text_that_lands_late_does_not_take_the_runs_stop_string():
    """A CI run: the box emptied, a question pasted, Run at once. The emptying's proposal (none, read from "") landed
    after Run had proposed "\\n" for the pasted text, and the decode read the box: no stop string. Run decides the stop
    strings once, the decode reads that decision, and a late proposal is still the page's, never the user's own."""
    from app.handlers import on_press, on_prompt
    from app.ui import build_demo
    from app.views import USER
    asked, offered = "Question: Who wrote Hamlet?\nAnswer:", ("",)
    shown, offered = on_prompt("Question: What is 2+2?\nAnswer:", "raw", "", offered)  # at load
    assert shown == "\\n"
    box, offered, decided = on_press(asked, "raw", shown, offered)  # Run, before the emptying's proposal is back
    assert box == decided == "\\n"
    late, offered = on_prompt("", "raw", shown, offered)  # the emptying's, read from "" before the paste
    assert late == ""
    assert on_press(asked, "raw", late, offered)[2] == "\\n"  # a press that reads the late box still proposes
    assert on_prompt(asked, "raw", late, offered)[0] == "\\n"  # as does the paste's own proposal, last
    # the box as the user left it is kept: typed (even empty), or set by an example and never proposed
    assert on_press(asked, "raw", "", USER)[2] == ""
    assert on_press(asked, "raw", "", offered, True)[1:] == (USER, "")  # emptied by deleting: the user's from now on
    assert on_press(asked, "raw", "\\n\\nQuestion:", offered)[2] == "\\n\\nQuestion:"
    assert on_press(asked, "chat", "\\n", offered)[2] == ""  # chat mode: no proposal
    demo = build_demo()
    deps = [(d, demo.fns[d["id"]].fn) for d in demo.config["dependencies"]]
    stop_box, = [i for i, b in demo.blocks.items() if getattr(b, "elem_id", None) == "af-stop"]
    decisions = {d["outputs"][2] for d, fn in deps if fn is on_press}
    decodes = [d for d, fn in deps if getattr(fn, "__name__", "") in ("on_run", "on_step")]
    assert len(decisions) == 1 and len(decodes) == 2
    assert all(stop_box not in d["inputs"] and decisions <= set(d["inputs"]) for d in decodes)
    # every handler that may propose reads whether the page saw the user edit the box (deleting or pasting into it
    # sends Gradio no input event), from the page's script, as its last input
    from app.style import STOP_EDITED
    proposing = [d for d, fn in deps if fn in (on_press, on_prompt)]
    assert len(proposing) == 3 and all(d["js"] == STOP_EDITED for d in proposing)  # the prompt, Run, Step
    targets = {(getattr(demo.blocks.get(t), "label", None), e) for d in proposing for t, e in d["targets"]}
    assert {("Prompt", "change"), ("Prompt mode", "change")} <= targets  # a paste changes the prompt, not "input"s it
