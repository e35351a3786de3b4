"""Traces (adafuse/trace.py): plain dataclasses that round-trip through JSON and refuse inconsistent files."""
import json

import pytest

from adafuse import Trace, TraceError
from adafuse.trace import Candidate, ModelStep, Round


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
