"""Evaluation (adafuse/harness/evaluate.py): method specs, summaries, and the eval command writing incrementally and
resuming."""
import json

import pytest

from adafuse import DecodeConfig
from adafuse.cli import main
from adafuse.errors import ConfigError
from adafuse.harness.evaluate import main_metric_table, parse_methods, summarize
from tests.real import SHARED


def test_method_specs():
    runs = parse_methods(["adafuse", "greedy", "fixed-span-2", "adafuse[branches=5,diversity=false,tau=0.5]"],
                         ["a", "b"])
    assert [r.label for r in runs] == ["adafuse", "greedy:a", "greedy:b", "fixed-span-2",
                                       "adafuse[branches=5,diversity=false,tau=0.5]"]
    assert runs[3].settings == {"method": "fixed-span-2"}
    assert runs[4].settings == {"method": "adafuse", "branches": 5, "diversity": False, "tau": 0.5}
    for bad in ("vote", "adafuse[colour=red]", "fixed-span-x", "adafuse[weights=1/x]", "w=adafuse[colour=red]",
                "adafuse[method=mixture]"):
        with pytest.raises(ConfigError):
            parse_methods([bad], ["a", "b"])
    named = parse_methods(["adafuse+weights=adafuse[weights=1/4]", "adafuse+gate=adafuse[gate=assets/gates/qa.json]"],
                          ["a", "b"])
    assert [(r.label, r.settings) for r in named] == [
        ("adafuse+weights", {"method": "adafuse", "weights": (1.0, 4.0)}),
        ("adafuse+gate", {"method": "adafuse", "gate": "assets/gates/qa.json"})]


@pytest.mark.parametrize("spec", ["vote", "adafuse-2", "mixture[seed]", "fixed-span-x[tau=0.5]", "adafuse[a=1]b"])
def test_a_bad_method_spec_is_worded_as_the_registry_words_it(spec):
    """The harness reads a spec with the registry's grammar (`parse_spec`), so a spec it refuses is refused with the
    registry's own words (the harness adds only `:MODEL` and decoding settings in the brackets)."""
    with pytest.raises(ConfigError) as registry:
        DecodeConfig(method=spec)
    with pytest.raises(ConfigError) as harness:
        parse_methods([spec], ["a", "b"])
    assert str(harness.value) == str(registry.value)
    with pytest.raises(ConfigError, match=r"name the model after the colon"):
        parse_methods(["greedy:"], ["a", "b"])
    assert [r.label for r in parse_methods(["greedy:b[tau=0.5]"], ["a", "b"])] == ["greedy:b"]


def test_a_method_spec_sets_exploration():
    run = parse_methods(["adafuse[exploration=embedding,branches=2]"], ["x", "y"])[0]
    assert run.settings == {"method": "adafuse", "exploration": "embedding", "branches": 2}
    assert DecodeConfig(**run.settings).exploration == "embedding"


def test_summary_table():
    trace = {"models": ["a"], "prefill": {}, "rounds": [{"words": 1, "steps": [{"model": "a", "forward_passes": 2,
             "tokens_fed": 2, "seconds": 0.1}]}, {"words": 2, "steps": []}]}
    rows = [{"task": "nq", "method": "adafuse", "scores": {"em": 1.0}, "seconds": 2.0, "trace": trace, "prediction": "x",
             "gold": ["x"]},
            {"task": "nq", "method": "adafuse", "scores": {"em": 0.0}, "seconds": 4.0, "trace": trace, "prediction": "y",
             "gold": ["x"]}]
    (s,) = summarize(rows)
    assert s["em"] == 50.0 and s["sec/example"] == 3.0 and s["rounds 1/2/3+ words %"] == "50/50/0"
    assert main_metric_table([s]) == [{"method": "adafuse", "nq": 50.0, "average": 50.0}]
    shared = [{**r, "in_flight": 8, "trace": {**trace, "prefill": {"a": {"seconds": 0.3}}}} for r in rows]
    (s,) = summarize(shared)  # 8 in flight: each decode's own wall time waited on the others; its share is counted
    assert s["sec/example"] == 0.4


@pytest.mark.models  # the eval command decodes with SmolLM2
def test_eval_cli_writes_incrementally_and_resumes(tmp_path, capsys):
    data = tmp_path / "data" / "nq"
    data.mkdir(parents=True)
    (data / "prompt.txt").write_text((SHARED / "nq" / "prompt.txt").read_text())
    (data / "dev.jsonl").write_text("\n".join((SHARED / "nq" / "dev.jsonl").read_text().splitlines()[:2]) + "\nbroken\n")
    args = ["eval", "--task", "nq", "--data", str(tmp_path / "data"), "--limit", "5",
            "--methods", "greedy:smollm2-135m-instruct", "--out", str(tmp_path / "out"), "--no-progress"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "line 3" in err and "fewer than --limit 5" in err
    lines = (tmp_path / "out" / "nq.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["trace"]["rounds"]
    assert (tmp_path / "out" / "summary.md").read_text().count("greedy:smollm2-135m-instruct") >= 1
    assert main(args) == 0 and len((tmp_path / "out" / "nq.jsonl").read_text().splitlines()) == 2
    # killed hard while writing: the last line is cut off; the resumed run sets it aside and redoes its example
    path = tmp_path / "out" / "nq.jsonl"
    whole = path.read_text()
    last = whole.splitlines()[-1]
    path.write_text(whole[: len(whole) - len(last) // 2 - 1])
    capsys.readouterr()
    assert main(args) == 0 and "cut off" in capsys.readouterr().err
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert sorted(r["line"] for r in rows) == [1, 2]
    assert (tmp_path / "out" / "nq.jsonl.cut").read_text().strip() == last[: len(last) - len(last) // 2].strip()
    assert "| nq | greedy:smollm2-135m-instruct | 2 |" in (tmp_path / "out" / "summary.md").read_text()
    assert main(args[:-5] + ["--methods", "vote", "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "method='vote' is invalid: use one of" in err and "Traceback" not in err


@pytest.mark.unit
def test_evaluate_runs_a_line_range_and_resumes_it(tmp_path):
    """`lines`: only those data lines are decoded, each row keyed by its line; a wider range later decodes only the
    lines not done yet, and nothing at all loads models when every line is done."""
    from adafuse.harness.evaluate import evaluate
    from adafuse.harness.tasks import TASKS
    from tests.toy_tasks import ToyRegistry, toy_data, toy_qa_pair
    data = toy_data(tmp_path / "data", {(51, 52): "London"}, lines=60)
    reg = ToyRegistry(*toy_qa_pair())
    runs = parse_methods(["adafuse", "heavy=adafuse[weights=1/9]"], ["a", "b"])
    out = evaluate(TASKS["nq"], runs, tmp_path / "out", data, None, progress=False, registry=reg, lines=(51, 52))
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["line"], r["method"], r["prediction"], r["scores"]["em"]) for r in rows] == [
        (51, "adafuse", "Paris", 0.0), (51, "heavy", "London", 1.0), (52, "adafuse", "Paris", 0.0),
        (52, "heavy", "London", 1.0)]
    evaluate(TASKS["nq"], runs, tmp_path / "out", data, 1, progress=False, registry=reg, lines=(53, 60))
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["line"] for r in rows] == [51, 51, 52, 52, 53, 53]
    assert [r["scores"]["em"] for r in rows[-2:]] == [1.0, 0.0]  # line 53's gold is "Paris": equal weights are right
    reg.asked.clear()
    evaluate(TASKS["nq"], runs, tmp_path / "out", data, None, progress=False, registry=reg, lines=(51, 53))
    assert reg.asked == [] and len(out.read_text().splitlines()) == 6


@pytest.mark.unit
def test_a_resumed_run_refuses_rows_decoded_under_other_settings(tmp_path):
    """Rows stored per token with the end allowed at once (the paper's rules, as results/ holds them) are not added
    to by a run under today's defaults: a typed error names the setting; with the same base (`PAPER`) it resumes, and
    a run naming its unit is a label of its own."""
    from adafuse.config import PAPER
    from adafuse.harness.evaluate import evaluate
    from adafuse.harness.tasks import TASKS
    from tests.toy_tasks import ToyRegistry, toy_data, toy_qa_pair
    data = toy_data(tmp_path / "data", {}, lines=60)
    reg = ToyRegistry(*toy_qa_pair())
    runs = parse_methods(["adafuse"], ["a", "b"])
    out = evaluate(TASKS["nq"], runs, tmp_path / "out", data, None, PAPER, progress=False, registry=reg, lines=(51, 51))
    with pytest.raises(ConfigError, match=r"holds rows of 'adafuse' decoded with normalize='token'; this run would "
                                          r"decode normalize='word'"):
        evaluate(TASKS["nq"], runs, tmp_path / "out", data, None, progress=False, registry=reg, lines=(51, 52))
    evaluate(TASKS["nq"], runs, tmp_path / "out", data, None, PAPER, progress=False, registry=reg, lines=(51, 52))
    reg.asked.clear()  # nothing left to decode: today's defaults refuse nothing, load nothing
    evaluate(TASKS["nq"], runs, tmp_path / "out", data, None, progress=False, registry=reg, lines=(51, 52))
    assert reg.asked == []
    evaluate(TASKS["nq"], parse_methods(["adafuse[normalize=word]"], ["a", "b"]), tmp_path / "out", data, None,
             progress=False, registry=reg, lines=(51, 51))
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["line"], r["method"], r["trace"]["settings"]["normalize"]) for r in rows] == [
        (51, "adafuse", "token"), (52, "adafuse", "token"), (51, "adafuse[normalize=word]", "word")]


@pytest.mark.unit
def test_eval_cli_reads_a_line_range(monkeypatch, tmp_path, capsys):
    """--lines reaches evaluate; a malformed range is a message, not a stack trace; without it --limit is 20."""
    from adafuse.harness import evaluate as ev
    seen = []
    monkeypatch.setattr(ev, "evaluate", lambda *a, **k: seen.append((a[4], k["lines"])) or tmp_path / "nq.jsonl")
    monkeypatch.setattr(ev, "write_summary", lambda out: (out / "summary.md", out / "summary.csv"))
    base = ["eval", "--task", "nq", "--out", str(tmp_path), "--no-progress"]
    assert main([*base, "--lines", "51-100"]) == 0 and main(base) == 0
    assert main([*base, "--lines", "51-60", "--limit", "3"]) == 0
    assert seen == [(None, (51, 100)), (20, None), (3, (51, 60))]
    assert main([*base, "--lines", "60-51"]) == 2
    err = capsys.readouterr().err
    assert "FIRST-LAST" in err and "Traceback" not in err
