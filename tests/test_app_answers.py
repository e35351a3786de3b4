"""The Answers tab's logic (app/answers.py) on the toy pair: which answer each model and the fused pair prefer, the
figure and table, and input that is no choice."""
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
])
def test_input_that_is_no_choice_is_a_typed_error(question, text, error, says):
    with pytest.raises(error, match=says):
        score_answers(list(toy_qa_pair()), DecodeConfig(), question, text)


def test_one_model_alone_scores_the_answers():
    a, _ = toy_qa_pair()
    answers, scored = score_answers([a], DecodeConfig(weights=()), "Answer:", "Paris\nLondon")
    assert "**Fused**: Paris" in answers_summary(answers, scored) and list(scored[0].logprob) == ["a"]
