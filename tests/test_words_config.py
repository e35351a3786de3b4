"""Model-free checks: words, stop strings, settings validation, trace JSON."""
import pytest

from adafuse import ConfigError, DecodeConfig, Trace, TraceError
from adafuse.trace import Candidate, ModelStep, Round
from adafuse.words import common_prefix, count_words, find_stop, split_words, word_end


def test_word_end_keeps_leading_whitespace_and_stops_before_next_space():
    assert word_end(" Paris. Next") == 7
    assert word_end("\n\nStep 1") == 6
    assert word_end("   ") is None and word_end(" Paris") is None


def test_split_and_count_words_reproduce_text():
    text = " The answer\n\nis 42."
    assert "".join(split_words(text)) == text
    assert count_words(text) == 4 and count_words("") == 0 and count_words("\n") == 0


def test_find_stop_earliest_and_from_start():
    assert find_stop("a\n\nQuestion: b\nc", ("\n", "\n\nQuestion:")) == 1
    assert find_stop("abc", ("x",)) is None
    assert find_stop("x..x", ("x",), start=1) == 3


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0


@pytest.mark.parametrize("kw", [dict(tau=1.5), dict(tau=-0.1), dict(tau=float("nan")), dict(max_words=0),
                                dict(branches=0), dict(mode="json"), dict(method="vote"), dict(stop=("",)),
                                dict(max_new_words=0), dict(max_word_tokens=True), dict(system=None),
                                dict(system=["be brief"]), dict(thinking=1), dict(thinking="yes")])
def test_bad_settings_raise_typed_errors_naming_the_argument(kw):
    with pytest.raises(ConfigError) as err:
        DecodeConfig(**kw)
    assert next(iter(kw)) in str(err.value)


def test_config_round_trip_and_single_stop_string():
    cfg = DecodeConfig(stop="\n", tau=0.5)
    assert cfg.stop == ("\n",)
    assert DecodeConfig.from_dict(cfg.to_dict()) == cfg
    chat = DecodeConfig(mode="chat", system="Answer briefly.", thinking=False)
    assert DecodeConfig.from_dict(chat.to_dict()) == chat
    assert DecodeConfig.from_dict({"tau": 0.5}).system == "" and DecodeConfig().thinking is None  # older traces


def test_trace_round_trip(tmp_path):
    r = Round(index=0, steps=[ModelStep("a", "commit", [0.9], [0], 2, 3, 0.1)],
              candidates=[Candidate(" x", False, ["a"], {"a": 0.5}, {"a": 1}, 0.5, 1)],
              chosen=0, winner=0, text=" x", words=1, seconds=0.1)
    t = Trace(prompt="p", models=["a"], settings={}, prompt_modes={"a": "raw"}, rounds=[r], output=" x")
    back = Trace.load(t.save(tmp_path / "t.json"))
    assert back == t and back.rounds[0].kind == "commit"
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(TraceError):
        Trace.load(tmp_path / "bad.json")
    with pytest.raises(TraceError) as err:
        Trace.load(tmp_path / "missing.json")
    assert str(tmp_path) not in str(err.value) and "missing.json" in str(err.value)  # no server paths shown


@pytest.mark.parametrize("path,value,field", [
    (("rounds", 0, "chosen"), 99, "rounds[0].chosen"),
    (("rounds", 0, "steps", 0, "margins"), "high", "rounds[0].steps[0].margins"),
    (("rounds", 0, "steps", 0, "proposals"), [3], "rounds[0].steps[0].proposals"),
    (("rounds", 0, "candidates", 0, "nll"), {"a": "x"}, "rounds[0].candidates[0].nll"),
    (("rounds", 0, "steps"), [], "rounds[0].steps"),
    (("models",), "a", "models"),
    (("rounds", 0, "candidates", 0, "fused"), float("nan"), "NaN"),  # written as the non-JSON constant NaN
    (("rounds", 0, "candidates", 0, "nll"), {"a": float("inf")}, "Infinity"),
    (("output",), " x y", "output"),  # the rounds' texts are " x"
    (("rounds",), [], "output"),
])
def test_an_inconsistent_trace_file_is_refused_with_the_field_named(tmp_path, path, value, field):
    import json
    r = Round(index=0, steps=[ModelStep("a", "commit", [0.9], [0], 2, 3, 0.1)],
              candidates=[Candidate(" x", False, ["a"], {"a": 0.5}, {"a": 1}, 0.5, 1)],
              chosen=0, winner=0, text=" x", words=1, seconds=0.1)
    d = json.loads(Trace(prompt="p", models=["a"], settings={}, prompt_modes={"a": "raw"}, rounds=[r],
                         output=" x").to_json())
    node = d
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    (tmp_path / "t.json").write_text(json.dumps(d))
    with pytest.raises(TraceError, match=field.replace("[", r"\[").replace("]", r"\]")):
        Trace.load(tmp_path / "t.json")


def test_weights_fuse_as_a_weighted_mean_and_are_recorded():
    from adafuse.decoder import fused_score
    from adafuse.trace import Candidate
    c = Candidate(text=" x", eos=False, proposers=["a"], nll={"a": 1.0, "b": 4.0}, n_tokens={"a": 1, "b": 1}, fused=None)
    assert fused_score(c) == 2.5
    assert fused_score(c, {"a": 3.0, "b": 1.0}) == (3 * 1.0 + 4.0) / 4
    assert fused_score(c, {"a": 1.0, "b": 0.0}) == 1.0  # weight 0: shown, not counted
    c0 = Candidate(text=" y", eos=False, proposers=["a"], nll={"a": 1.0, "b": None}, n_tokens={"a": 1, "b": 0},
                   fused=None, notes={"b": "probability 0 under b"})
    assert fused_score(c0) is None and fused_score(c0, {"a": 1.0, "b": 0.0}) == 1.0
