"""The app's non-UI logic: stop parsing, model-count checks, disagreement listing, friendly errors."""
import pytest

from adafuse.errors import ConfigError, PromptError
from app.controller import Explorer, disagreements, friendly, load_examples, parse_stops, validate_models


def test_stop_strings_one_per_line_with_escapes():
    assert parse_stops("\\n\\nQuestion:\n\n  \nEND") == ("\n\nQuestion:", "END")
    assert parse_stops("") == ()


def test_model_count_is_checked():
    assert validate_models([" a ", "b"]) == ["a", "b"]
    for bad in ([], ["a"], ["a", "b", "c", "d", "e"], None):
        with pytest.raises(ConfigError):
            validate_models(bad)


def test_examples_cover_the_five_categories_twice():
    cats = [e["category"] for e in load_examples()]
    for c in ("open-domain QA", "reading comprehension", "arithmetic", "translation", "free chat"):
        assert cats.count(c) >= 2


def test_disagreements_both_ways():
    def row(line, method, em):
        return {"task": "nq", "line": line, "method": method, "scores": {"em": em}, "question": "q", "prediction": method,
                "gold": ["g"]}
    rows = [row(1, "adafuse", 0.0), row(1, "greedy:a", 1.0), row(1, "greedy:b", 0.0),
            row(2, "adafuse", 1.0), row(2, "greedy:a", 0.0), row(2, "greedy:b", 1.0),
            row(3, "adafuse", 1.0), row(3, "greedy:a", 1.0), row(3, "greedy:b", 1.0)]
    out = disagreements(rows)
    assert [(d["line"], d["kind"]) for d in out] == [(1, "ensemble wrong, a single model right"),
                                                     (2, "ensemble right, a single model wrong")]


def test_friendly_errors_never_show_a_stack_trace():
    assert friendly(PromptError("the prompt is empty")) == "the prompt is empty"
    assert "ran out of memory" in friendly(RuntimeError("CUDA out of memory. Tried to allocate"))
    assert "still running" in friendly(KeyError("x"))
    with pytest.raises(ConfigError):
        Explorer().open_example(1, "adafuse")
