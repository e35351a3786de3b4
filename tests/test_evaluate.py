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
    assert runs[3].settings == {"method": "fixed-span", "span_words": 2}
    assert runs[4].settings == {"method": "adafuse", "branches": 5, "diversity": False, "tau": 0.5}
    for bad in ("vote", "adafuse[colour=red]", "fixed-span-x", "adafuse[weights=1/x]", "w=adafuse[colour=red]"):
        with pytest.raises(ConfigError):
            parse_methods([bad], ["a", "b"])
    named = parse_methods(["adafuse+weights=adafuse[weights=1/4]", "adafuse+gate=adafuse[gate=assets/gates/qa.json]"],
                          ["a", "b"])
    assert [(r.label, r.settings) for r in named] == [
        ("adafuse+weights", {"method": "adafuse", "weights": (1.0, 4.0)}),
        ("adafuse+gate", {"method": "adafuse", "gate": "assets/gates/qa.json"})]


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
    assert "unknown method" in err and "Traceback" not in err
