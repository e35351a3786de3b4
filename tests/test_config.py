"""Decode settings (adafuse/config.py): typed errors that name the argument, and the JSON round trip."""
import pytest

from adafuse import ConfigError, DecodeConfig


@pytest.mark.parametrize("kw", [dict(tau=1.5), dict(tau=-0.1), dict(tau=float("nan")), dict(max_words=0),
                                dict(branches=0), dict(mode="json"), dict(method="vote"), dict(stop=("",)),
                                dict(max_new_words=0), dict(max_word_tokens=True), dict(system=None),
                                dict(system=["be brief"]), dict(thinking=1), dict(thinking="yes")])
def test_bad_settings_raise_typed_errors_naming_the_argument(kw):
    with pytest.raises(ConfigError) as err:
        DecodeConfig(**kw)
    assert next(iter(kw)) in str(err.value)


@pytest.mark.parametrize("kw", [dict(exploration="meaning"), dict(exploration=None), dict(explore_lambda=-0.1),
                                dict(explore_lambda=float("nan")), dict(explore_lambda=float("inf")),
                                dict(explore_lambda=True), dict(explore_lambda="1"), dict(explore_lambda=101)])
def test_invalid_exploration_settings_raise_config_error(kw):
    with pytest.raises(ConfigError):
        DecodeConfig(**kw)


def test_speculate_is_a_typed_setting():
    with pytest.raises(ConfigError, match="speculate"):
        DecodeConfig(speculate="yes")
    with pytest.raises(ConfigError, match="draft_lookup"):
        DecodeConfig(speculate=True, draft_lookup=1)


def test_config_round_trip_and_single_stop_string():
    cfg = DecodeConfig(stop="\n", tau=0.5)
    assert cfg.stop == ("\n",)
    assert DecodeConfig.from_dict(cfg.to_dict()) == cfg
    chat = DecodeConfig(mode="chat", system="Answer briefly.", thinking=False)
    assert DecodeConfig.from_dict(chat.to_dict()) == chat
    assert DecodeConfig.from_dict({"tau": 0.5}).system == "" and DecodeConfig().thinking is None  # older traces
    # speculation is on by default, but a trace from before it existed was decoded without it, and replays so
    assert DecodeConfig().speculate and not DecodeConfig.from_dict({"tau": 0.5}).speculate


def test_exploration_settings_round_trip():
    cfg = DecodeConfig(exploration="embedding", explore_lambda=2)
    assert cfg.explore_lambda == 2.0 and isinstance(cfg.explore_lambda, float)
    assert DecodeConfig.from_dict(cfg.to_dict()) == cfg


def test_a_conversation_history_is_checked_and_round_trips():
    c = DecodeConfig(mode="chat", history=[["user", "Q"], ["assistant", "A"]])
    assert c.history == (("user", "Q"), ("assistant", "A"))
    assert DecodeConfig.from_dict(c.to_dict()) == c
    for bad in ([("assistant", "A")], [("user", "Q")], [("user", "Q"), ("user", "Q")], "user", [("user", 3), ("assistant", "A")]):
        with pytest.raises(ConfigError, match="history=.*taking turns"):
            DecodeConfig(history=bad)
