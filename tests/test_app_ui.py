"""The app's settings widgets (app/ui.py): gates pick their NLL averaging, slider boxes take whole counts."""
import pytest

from adafuse.errors import ConfigError


def test_picking_a_gate_sets_the_nll_averaging_it_was_trained_with(tmp_path):
    from adafuse.gate import Gate
    from app.ui import gate_normalize
    word, token = tmp_path / "word.json", tmp_path / "token.json"
    Gate(["a", "b"], Gate.zeros(["a", "b"]).W, [0.0, 0.0], trained={"normalize": "word"}).save(word)
    Gate.zeros(["a", "b"]).save(token)
    assert gate_normalize(str(word), "per token (paper)") == "per word"
    assert gate_normalize(str(token), "per word") == "per token (paper)"
    assert gate_normalize("", "per word") == "per word"  # no gate: the user's choice stays
    (tmp_path / "bad.json").write_text("not json")
    assert gate_normalize(str(tmp_path / "bad.json"), "per word") == "per word"  # the run reports the bad file


def test_slider_boxes_take_whole_counts_and_some_weight():
    from app.ui import _settings
    base = dict(names=["a", "b"], tau=0.7, max_words=3, branches=3, diversity=True, exploration="surface", lam=1.0,
                max_new_words=20, max_new_tokens=80, mode="raw", stop="", system="", thinking="template default",
                speculate=False, normalize="per token (paper)", gate="")

    def settings(weights=(1, 1), **kw):
        return _settings(*{**base, **kw}.values(), *weights)

    assert settings(max_words=2.0).max_words == 2 and settings(weights=(1, 3)).weights == (1.0, 3.0)
    for key, value, named in (("max_words", 2.5, "M"), ("branches", "x", "B"), ("max_new_words", None, "Max new words")):
        with pytest.raises(ConfigError, match=f"{named}.*whole number"):
            settings(**{key: value})
    with pytest.raises(ConfigError, match="weight is 0"):
        settings(weights=(0, 0))
    assert settings(weights=(0, 0), gate="g.json").gate == "g.json"  # a gate replaces the sliders
