"""The Answers tab's logic (app/answers.py) on the toy pair: which answer each model and the fused pair prefer, the
figure and table, input that is no choice, and what the tab shows before a scoring and after a failed one."""
import math

import pytest

from adafuse import DecodeConfig
from adafuse.errors import ConfigError, PromptError
from app.answers import answers_figure, answers_frame, answers_summary, continuations, score_answers
from tests.toy_tasks import toy_qa_pair

pytestmark = pytest.mark.unit


def test_each_model_and_the_pair_name_the_answer_they_prefer():
    """a: Paris 0.7, London 0.2; b: London 0.5, Paris 0.3 (each then a line end, 0.9): the mean prefers Paris."""
    answers, scored = score_answers(list(toy_qa_pair()), DecodeConfig(), "Answer:", "Paris\nLondon")
    assert [s.logprob["b"] for s in scored] == pytest.approx([math.log(0.3), math.log(0.5)])
    summary = answers_summary(answers, scored)
    assert "**Fused**: Paris" in summary and "**a**: Paris" in summary and "**b**: London" in summary
    assert "b prefers another answer than the fused pair" in summary
    weighted = score_answers(list(toy_qa_pair()), DecodeConfig(weights=(1, 10)), "Answer:", "Paris\nLondon")
    assert "**Fused**: London" in answers_summary(*weighted) and "weighted a 1, b 10" in answers_summary(*weighted)
    assert len(answers_figure(answers, scored).data) == 3
    frame = answers_frame(answers, scored)
    assert list(frame["answer"]) == answers and {"a", "b", "a tokens", "fused per byte"} <= set(frame.columns)


def test_answers_continue_the_question_after_a_space_unless_it_ends_with_one():
    assert continuations("Answer:", ["Paris"]) == [" Paris"]
    assert continuations("Answer: ", ["Paris"]) == ["Paris"]


@pytest.mark.parametrize("question, text, error, says", [
    ("Answer:", "Paris", ConfigError, "1 answers given: write 2 to 5"),
    ("Answer:", "a\nb\nc\nd\ne\nf", ConfigError, "6 answers given"),
    ("Answer:", "Paris\nParis", ConfigError, "given twice"),
    ("  ", "Paris\nLondon", PromptError, "the question is empty"),
    ("Answer:", "\nParis", ConfigError, "1 answers given: .* \\(blank line 1 skipped\\)"),
    ("Answer:", "Paris\n" + "a" * 501, ConfigError, "answer 2 is 501 characters long: answers of up to 500 characters"),
])
def test_input_that_is_no_choice_is_a_typed_error(question, text, error, says):
    with pytest.raises(error, match=says):
        score_answers(list(toy_qa_pair()), DecodeConfig(), question, text)


def test_one_model_alone_scores_the_answers():
    a, _ = toy_qa_pair()
    answers, scored = score_answers([a], DecodeConfig(weights=()), "Answer:", "Paris\nLondon")
    assert "**Fused**: Paris" in answers_summary(answers, scored) and list(scored[0].logprob) == ["a"]


SETTINGS = dict(names=["a", "b"], tau=0.7, max_words=3, branches=3, diversity=True, exploration="surface", lam=1.0,
                max_new_words=8, max_new_tokens=80, mode="raw", stop="", system="", thinking="template default",
                speculate=False, normalize="per token (paper)", allow_empty=False, gate="", w0=1, w1=1)


@pytest.fixture
def on_answers(monkeypatch):
    """The tab's handler, its models the toy pair (what the lease would load), its inputs the page's."""
    from app import handlers
    monkeypatch.setattr(handlers.leases, "answers",
                        lambda ex, names, dev, cfg, q, text: score_answers(list(toy_qa_pair()), cfg, q, text))
    return lambda text, question="Answer:": handlers.on_answers(None, question, text, "default", False,
                                                                *SETTINGS.values())


def test_a_failed_scoring_clears_the_earlier_answers_chart_and_table(on_answers):
    _, said, figure, table = on_answers("Paris\nLondon")
    assert said.startswith("Preferred") and len(figure.data) == 3 and list(table["answer"]) == ["Paris", "London"]
    _, said, figure, table = on_answers("Paris")  # no choice: said, and no chart of other answers under it
    assert said.startswith("⚠️ **Error:** 1 answers given")
    assert len(figure.data) == 0 and "Nothing scored" in figure.layout.annotations[0].text and table.empty


def test_a_blank_line_between_answers_is_said_and_a_trailing_one_is_not(on_answers):
    _, said, _, table = on_answers("Paris\n \nLondon\n\n")
    assert said.endswith("Blank line 2 skipped.") and list(table["answer"]) == ["Paris", "London"]
    assert "Blank" not in on_answers("Paris\nLondon\n\n")[1]


def test_long_answers_are_refused_before_any_model_loads(monkeypatch):
    from app import handlers
    monkeypatch.setattr(handlers.leases, "answers", lambda *a: pytest.fail("a lease for input that is refused"))
    said = handlers.on_answers(None, "Answer:", "Paris\n" + "x" * 5000, "default", False, *SETTINGS.values())[1]
    assert "answer 2 is 5,000 characters long" in said and "shorten it" in said


def test_before_its_first_score_the_tab_says_what_to_do_there():
    from types import SimpleNamespace

    import gradio as gr

    from app import layout
    ui = SimpleNamespace()
    with gr.Blocks(), gr.Tabs():
        layout.answers_tab(ui)
    shown = str(ui.ans_plot.value)
    assert "Score the answers" in shown and "Run or step" not in shown, shown[-300:]
