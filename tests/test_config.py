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


def test_weights_that_do_not_match_the_models_are_refused_in_one_wording_everywhere(capsys):
    """One check (`check_weights`, via `DecodeConfig.check_models`) for the library before any model loads, the CLI,
    lm-eval's model and the server (which names the request's field)."""
    from adafuse import AdaFuse
    from adafuse.cli import build_parser, decode_config, main
    from adafuse.harness.lm_eval_model import AdaFuseLM
    from adafuse.server.requests import CompletionRequest, Limits, _settings
    from adafuse.server.responses import ApiError
    from tests.toy import toy_pair

    said = "weights has 3 values for 2 models: give one per model"
    cfg = DecodeConfig(weights=(1, 2, 3))
    pair = list(toy_pair())
    refusals = []
    for attempt in (lambda: cfg.check_models(2), lambda: AdaFuse(pair, cfg),
                    lambda: decode_config(build_parser().parse_args(["run", "--prompt", "Q", "--models", "a", "b",
                                                                     "--weights", "1", "2", "3"])),
                    lambda: AdaFuseLM(models=pair, weights="1/2/3")):
        with pytest.raises(ConfigError) as err:
            attempt()
        refusals.append(str(err.value))
    assert refusals == [said] * 4
    assert main(["eval", "--task", "nq", "--models", "a", "b", "--weights", "1", "2", "3"]) == 2
    assert capsys.readouterr().err.strip().endswith(said)
    with pytest.raises(ApiError) as err:
        _settings(CompletionRequest(model="m", prompt="Q", adafuse={"weights": [1, 2, 3]}), DecodeConfig(),
                  Limits(name="m", members=2), None)
    assert (err.value.message, err.value.param) == (said, "adafuse.weights")
