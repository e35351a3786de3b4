"""Methods own their settings (adafuse/method_registry.py): specs read and written one way, typed errors naming the
field, old traces' settings still load, and every entry point (library, CLI, harness, lm-eval, server, app) reads the
one registry — a method registered here is usable through all of them without another line."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from adafuse import AdaFuse, DecodeConfig
from adafuse.config import PAPER
from adafuse.candidates import greedy_span
from adafuse.errors import ConfigError
from adafuse.method_registry import METHODS, MethodSettings, from_spec, method_specs, register, setting, to_spec
from adafuse.methods import Method, Proposed
from adafuse.trace import StepMode
from tests.toy import toy_pair

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("spec", [*method_specs(), "fixed-span-7", "mixture[seed=3]",
                                  "mixture[seed=3,temperature=0.5]", "token-union[union_top_k=9]"])
def test_a_spec_reads_back_as_itself(spec):
    cls, settings = from_spec(spec)
    assert to_spec(cls, settings) == spec
    assert DecodeConfig(method=spec).method == spec and DecodeConfig(method=spec).method_settings == settings


def test_equal_settings_have_one_spec():
    assert DecodeConfig(method="fixed-span").method == "fixed-span-1"
    assert DecodeConfig(method="mixture[temperature=1.0,seed=0]").method == "mixture"
    assert DecodeConfig(method="mixture[temperature=0.50]") == DecodeConfig.of(method="mixture", temperature=0.5)
    assert DecodeConfig.of(method="fixed-span-2", span_words=4).method == "fixed-span-4"  # a flag beats the spec
    assert DecodeConfig.of(DecodeConfig(method="fixed-span-2", tau=0.3), span_words=3) == \
        DecodeConfig(method="fixed-span-3", tau=0.3)


@pytest.mark.parametrize("spec, message", [
    ("vote", r"method='vote' is invalid: use one of adafuse, greedy, beam, fixed-span-1"),
    ("adafuse-2", r"method='adafuse-2' is invalid"),
    ("fixed-span-0", r"span_words=0 is invalid: use a whole number from 1 to 64"),
    ("mixture[temperature=11]", r"temperature=11 is invalid: use a number from 0.0 to 10.0"),
    ("mixture[seed=1.5]", r"seed=1.5 is invalid: use a whole number"),
    ("mixture[seed]", r"write its settings as name=value"),
    ("adafuse[seed=1]", r"seed=1 is not a setting of method 'adafuse' \(mixture has it\); adafuse has no settings"),
    ("token-union[span_words=2]", r"span_words=2 is not a setting of method 'token-union' \(fixed-span has it\): "
                                  r"its own settings are union_top_k"),
])
def test_a_bad_spec_is_a_typed_error_naming_the_setting(spec, message):
    with pytest.raises(ConfigError, match=message):
        DecodeConfig(method=spec)


def test_a_setting_of_no_method_is_named_with_what_there_is():
    with pytest.raises(ConfigError, match=r"colour='red' is not a setting: use a decoding setting \(tau, .*\) or a "
                                          r"method's own \(span_words, union_top_k, seed, temperature\)"):
        DecodeConfig.of(colour="red")


def test_old_traces_settings_load_with_the_methods_own_folded_into_the_spec():
    """Before methods owned their settings, every trace kept span_words, union_top_k, seed and temperature (at their
    defaults when unused) beside the method's bare name."""
    old = {"method": "fixed-span", "span_words": 2, "union_top_k": 5, "seed": 0, "temperature": 1.0, "tau": 0.5}
    assert DecodeConfig.from_dict(old) == DecodeConfig(method="fixed-span-2", tau=0.5, speculate=False, **PAPER)
    assert DecodeConfig.from_dict({**old, "method": "mixture", "seed": 3}).method == "mixture[seed=3]"
    assert DecodeConfig.from_dict({**old, "method": "adafuse"}).method == "adafuse"
    assert DecodeConfig.from_dict({"tau": 0.5}).method == "adafuse"  # older still: no method recorded
    new = DecodeConfig(method="token-union[union_top_k=3]")
    assert DecodeConfig.from_dict(new.to_dict()) == new
    assert "union_top_k" not in new.to_dict()


def test_an_old_mixture_trace_decodes_again_as_it_was_decoded():
    old = {**DecodeConfig(method="mixture", max_new_words=6).to_dict(), "method": "mixture", "seed": 3,
           "temperature": 0.0}
    again = AdaFuse(toy_pair(), DecodeConfig.from_dict(old)).generate("Q")
    assert again.output == AdaFuse(toy_pair(), DecodeConfig.of(method="mixture", seed=3, temperature=0.0,
                                                               max_new_words=6)).generate("Q").output
    assert again.settings["method"] == "mixture[seed=3,temperature=0]"


@dataclass(frozen=True)
class FirstSettings(MethodSettings):
    first_words: int = setting(1, 1, 8, "n: the words the first model writes alone")


class FirstAlone(Method):
    """A method made here: only the first model writes, `first_words` words a round."""
    name = "first-alone"
    Settings = FirstSettings
    suffix = "first_words"
    summary = "the first model writes alone"
    label = "first alone {first_words}"
    scores = False

    def acting(self, ctx):
        return [0]

    def propose(self, ctx, m):
        p, margins = greedy_span(ctx.views[m], min(self.settings.first_words, ctx.budget), None,
                                 ctx.config.max_word_tokens)
        return Proposed([p], StepMode.SPAN, margins)


@pytest.fixture
def first_alone():
    register(FirstAlone)
    yield FirstAlone
    del METHODS[FirstAlone.name]


def test_a_method_registered_once_is_known_to_every_door(first_alone):
    from adafuse.cli import build_parser, decode_config
    from adafuse.harness.evaluate import parse_methods
    from adafuse.harness.lm_eval_model import _settings as lm_eval_settings
    from adafuse.server.requests import CompletionRequest, Limits, _settings as request_settings

    assert "first-alone" in method_specs()
    trace = AdaFuse(toy_pair(), method="first-alone-2", max_new_words=4).generate("Q")
    assert trace.settings["method"] == "first-alone-2" and [r.words for r in trace.rounds][:1] == [2]
    # the CLI: --method takes the spec, and the method's own setting is a flag of its own
    args = build_parser().parse_args(["run", "--prompt", "Q", "--method", "first-alone", "--first-words", "3"])
    assert decode_config(args).method == "first-alone-3"
    # the evaluation harness (and the app's Evaluate tab, which reads it)
    assert parse_methods(["first-alone[first_words=2,tau=0.5]"], ["a", "b"])[0].settings == \
        {"method": "first-alone-2", "tau": 0.5}
    # lm-eval's model_args
    assert DecodeConfig.of(**lm_eval_settings({"method": "first-alone", "first_words": 4})).method == "first-alone-4"
    # the server: a request's adafuse object
    req = CompletionRequest(model="m", prompt="Q", adafuse={"method": "first-alone", "first_words": 5})
    assert request_settings(req, DecodeConfig(), Limits(name="m", members=2), None)[0].method == "first-alone-5"


def test_the_server_folds_a_requests_method_setting_into_the_servers_method():
    from adafuse.server.requests import CompletionRequest, Limits, _settings as request_settings
    base = DecodeConfig(method="fixed-span-2")
    req = CompletionRequest(model="m", prompt="Q", adafuse={"span_words": 3})
    assert request_settings(req, base, Limits(name="m", members=2), None)[0].method == "fixed-span-3"


def test_the_registry_alone_holds_every_built_in_method():
    """Importing adafuse.method_registry by itself (not through the package, whose __init__ imports the decoder) gives
    the full registry: the registry lists the built-in methods, no other module has to be imported first."""
    import subprocess
    import sys
    code = ("import importlib.util, sys, types\n"
            "pkg = types.ModuleType('adafuse')\n"
            "pkg.__path__ = list(importlib.util.find_spec('adafuse').submodule_search_locations)\n"
            "sys.modules['adafuse'] = pkg  # the package without its __init__\n"
            "import adafuse.method_registry as registry\n"
            "assert 'adafuse.decoder' not in sys.modules\n"
            "print(','.join(registry.METHODS))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [",".join(METHODS)] and METHODS.keys() >= {"adafuse", "greedy", "mixture"}
