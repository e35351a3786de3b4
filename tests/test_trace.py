"""Traces (adafuse/trace.py): plain dataclasses that round-trip through JSON and refuse inconsistent files."""
import copy
import gzip
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from adafuse import AdaFuse, DecodeConfig, Trace, TraceError
from adafuse.method_registry import METHODS
from adafuse.trace import Candidate, ModelStep, Round, fused_score
from tests.toy import A_RULES, B_RULES, toy_pair
from tests.traces import empty_trace, hand_trace, two_rounds


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
    (("rounds", 0, "steps", 0, "held_end"), "yes", "rounds[0].steps[0].held_end"),
    (("rounds", 0, "candidates", 0, "nll"), {"a": "x"}, "rounds[0].candidates[0].nll"),
    (("rounds", 0, "steps"), [], "rounds[0].steps"),
    (("models",), "a", "models"),
    (("rounds", 0, "candidates", 0, "fused"), float("nan"), "NaN"),  # written as the non-JSON constant NaN
    (("rounds", 0, "candidates", 0, "nll"), {"a": float("inf")}, "Infinity"),
    (("output",), " x y", "output"),  # the rounds' texts are " x"
    (("rounds",), [], "output"),
])
def test_an_inconsistent_trace_file_is_refused_with_the_field_named(tmp_path, path, value, field):
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


# ---- the numbers add up: a trace the decoder wrote loads; the same trace tampered with is refused ----

def _decode(models, cfg: DecodeConfig, picks: dict[int, int] | None = None, change: dict | None = None) -> dict:
    """A decode of "Q" as plain data: `picks` commits candidate k (or the pool's last) in round i (when it is not the
    winner, an override); `change` applies settings from round 1 on (decided while round 0 was pending)."""
    d = AdaFuse(list(models), cfg).start("Q")
    while not d.done:
        r = d.propose()
        if r.index == 0 and change:
            d.reconfigure(replace(d.config, **change))
        pick = (picks or {}).get(r.index)
        d.commit(None if pick is None else min(pick, len(r.candidates) - 1))
    return json.loads(d.trace.to_json())


@pytest.fixture(scope="module")
def decoded() -> dict:
    """The toy pair with weights, an override in round 0 and per-word NLLs from round 1 on."""
    return _decode(toy_pair(), DecodeConfig(tau=0.95, max_words=1, weights=(3.0, 1.0)), picks={0: 1},
                   change={"normalize": "word", "weights": (1.0, 2.0)})


def _scored(d: dict, overridden: bool = False) -> tuple[int, dict]:
    """The first round (overridden or not) with two scored candidates or more whose fused scores differ."""
    return next((i, r) for i, r in enumerate(d["rounds"]) if r["overridden"] == overridden
                and len({c["fused"] for c in r["candidates"] if c["fused"] is not None}) > 1)


def _refused(d: dict, match: str) -> str:
    with pytest.raises(TraceError, match=match) as err:
        Trace.from_dict(d)
    return str(err.value)


def test_the_fixture_decode_holds_what_the_tampering_needs(decoded):
    assert decoded["changes"] and any(r["overridden"] for r in decoded["rounds"]) and _scored(decoded)
    assert Trace.from_dict(decoded).rounds[0].overridden


@pytest.mark.parametrize("value", [-5.0, 1e300, "x1.01", "swap"])
def test_a_fused_score_that_is_not_the_weighted_mean_of_the_nlls_is_refused(decoded, value):
    d = copy.deepcopy(decoded)
    i, r = _scored(d)
    j = r["winner"]
    c = r["candidates"][j]
    if value == "x1.01":  # 1% off: more than rounding
        c["fused"] *= 1.01
    elif value == "swap":  # the scores of two candidates exchanged: each a real score, of the other candidate
        k = next(k for k, o in enumerate(r["candidates"]) if o["fused"] is not None and o["fused"] != c["fused"])
        c["fused"], r["candidates"][k]["fused"] = r["candidates"][k]["fused"], c["fused"]
    else:
        c["fused"] = value
    msg = _refused(d, rf"rounds\[{i}\]\.candidates\[\d+\]\.fused is .*, but the weighted mean of its NLLs")
    assert "weights a=1, b=2; per word" in msg  # the round's weights and normalization, after the change


def test_the_nlls_and_end_terms_a_model_cannot_give_are_refused(decoded):
    for field, value in (("nll", -5.0), ("nll", 1e300), ("end_term", 5.0), ("end_term", -1e300)):
        d = copy.deepcopy(decoded)
        i, j, c = next((i, j, c) for i, r in enumerate(d["rounds"]) for j, c in enumerate(r["candidates"])
                       if c[field].get("a") is not None)
        c[field]["a"] = value
        if field == "nll":  # the fused score agrees with the tampered NLL: the NLL itself is what is refused
            t = Trace.from_dict(copy.deepcopy(decoded))  # (a loaded trace shares the data's dicts)
            tc = t.rounds[i].candidates[j]
            tc.nll["a"] = value
            c["fused"] = fused_score(tc, t.round_weights(i), t.settings_at(i).get("normalize", "token"))
        _refused(d, rf"rounds\[{i}\]\.candidates\[{j}\]\.{field}\['a'\] is {re.escape(repr(value))}")


def test_a_winner_that_is_not_the_lowest_fused_score_is_refused(decoded):
    d = copy.deepcopy(decoded)
    i, r = _scored(d)
    worse = max((k for k, c in enumerate(r["candidates"]) if c["fused"] is not None),
                key=lambda k: r["candidates"][k]["fused"])
    r["winner"] = r["chosen"] = worse  # (committed, not overridden: the scores would have picked it)
    _refused(d, rf"rounds\[{i}\]\.winner is candidate {worse} \(fused .*\), but candidate \d+ scores lower")


def test_a_chosen_candidate_other_than_the_winner_needs_a_recorded_override(decoded):
    d = copy.deepcopy(decoded)
    d["rounds"][0]["overridden"] = False  # round 0 committed another candidate than the winner
    _refused(d, r"rounds\[0\]\.chosen is candidate 1 and the winner 0, but overridden is False")
    d = copy.deepcopy(decoded)
    i, r = _scored(d)
    r["overridden"] = True  # an override recorded where the winner was committed
    _refused(d, rf"rounds\[{i}\]\.chosen .* but overridden is True")


@pytest.mark.parametrize("where,value,match", [
    (("rounds", "scored", "weights"), {"a": 1.0, "b": 1.0}, r"\.fused is"),  # weights the scores did not use
    (("rounds", "scored", "weights"), {"a": -1.0, "b": 2.0}, r"\.weights must map .* non-negative"),
    (("settings", "weights"), [1.0], r"settings\.weights is \[1\.0\]: give one non-negative number per model"),
    (("changes", 0, "settings", "weights"), [1.0, "x"], r"changes\[0\]\.settings\.weights"),
    (("changes", 0, "settings", "normalize"), "token", r"\.fused is .* per token"),  # the change of normalization undone
    (("rounds", 0, "steps", 0, "margins"), [7.0], r"rounds\[0\]\.steps\[0\]\.margins are \[7\.0\]"),
    (("rounds", 0, "steps", 0, "forward_passes"), -3, r"forward_passes must be a number, never negative"),
    (("rounds", 0, "candidates", 0, "n_tokens"), {"a": 1.5, "b": 1}, r"n_tokens must give"),
    (("rounds", 0, "candidates", 0, "words"), "two", r"candidates\[0\]\.words is 'two'"),
])
def test_settings_weights_and_counts_that_do_not_fit_are_refused(decoded, where, value, match):
    d = copy.deepcopy(decoded)
    node = d
    for key in where[:-1]:
        node = _scored(d)[1] if key == "scored" else node[key]
    node[where[-1]] = value
    _refused(d, match)


def test_every_method_writes_traces_that_load():
    """Each method of the registry, with its picks of other candidates, settings changed mid-decode, weights, per-word
    NLLs and stop strings: the traces the project writes pass the checks."""
    pair, overrides = toy_pair(), 0
    for name, method in METHODS.items():
        models = pair[:1] if method.models == (1, 1) else pair
        for kw in ({}, {"weights": (3.0, 1.0)}, {"normalize": "word", "stop": ("\n",)}, {"score_single": True}):
            if len(models) == 1:
                kw = {k: v for k, v in kw.items() if k != "weights"}
            cfg = DecodeConfig(method=name, tau=0.95, max_words=1, **kw)
            change = {"weights": (1.0, 4.0)} if len(models) > 1 else {"tau": 0.5}
            for d in (_decode(models, cfg), _decode(models, cfg, picks={0: 1, 2: 0}, change=change)):
                back = Trace.from_dict(d)
                assert back.to_dict() == d
                overrides += sum(r.overridden for r in back.rounds)
    assert overrides  # the picks did leave the winner somewhere


def test_a_stop_strings_path_may_give_a_negative_nll_and_it_loads():
    """An end term adds the paths of stop strings that overlap ("\nQ" and "\nQ.", neither starting with an end
    token), so log p(end) may pass 0 and an NLL dip below 0: the bound allows log(1 + stop strings). A path that
    starts with a pooled end token ("\n" a stop itself) is counted once: no NLL below 0."""
    rules = {" nice": {"\n": 0.98}, "\n": {"Q": 0.99}, "\nQ": {".": 0.99}}
    pair = toy_pair(a={**A_RULES, **rules}, b={**B_RULES, **rules})
    once = _decode(pair, DecodeConfig(stop=("\n", "\nQ"), score_single=True))
    assert min(v for r in once["rounds"] for c in r["candidates"] for v in c["nll"].values() if v is not None) >= 0
    d = _decode(pair, DecodeConfig(stop=("\nQ", "\nQ."), score_single=True))
    assert min(v for r in d["rounds"] for c in r["candidates"] for v in c["nll"].values() if v is not None) < 0
    Trace.from_dict(d)
    d["settings"]["stop"] = []  # without stop strings the same numbers are impossible
    _refused(d, r"\.(nll\['a'\]|end_term\['\w'\]) is")


def test_a_token_union_score_is_checked_as_the_log_of_the_mean_probability():
    d = _decode(toy_pair(), DecodeConfig(method="token-union"))
    Trace.from_dict(d)
    i, r = _scored(d)
    for value in (r["candidates"][r["winner"]]["fused"] - 0.01, -1e300):
        r["candidates"][r["winner"]]["fused"] = value
        _refused(d, rf"rounds\[{i}\]\.candidates\[\d+\]\.fused is .*, but −log of its models' mean probability")


def test_the_hand_built_traces_of_the_other_tests_load():
    for t in (two_rounds(), hand_trace(), empty_trace()):
        assert Trace.from_dict(json.loads(t.to_json())) == t


RESULTS = sorted(Path(__file__).resolve().parents[1].glob("results/**/*.jsonl.gz"))


@pytest.mark.skipif(not RESULTS, reason="no results/ in this checkout")
@pytest.mark.parametrize("path", RESULTS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_the_first_trace_of_every_method_in_the_results_loads(path):
    seen = set()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            method = re.search(r'"method": "([^"]+)"', line)
            if method and method.group(1) not in seen:
                seen.add(method.group(1))
                trace = json.loads(line)["trace"]
                if trace:
                    Trace.from_dict(trace)
    assert seen
