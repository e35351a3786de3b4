"""Metrics on hand-written cases, answer extraction, method specs, data errors, summaries, and one real CLI run."""
import importlib.util
import json
import subprocess
import sys

import pytest

from adafuse.errors import ConfigError
from adafuse.harness.evaluate import main_metric_table, parse_methods, summarize
from adafuse.harness.results import _judge, paired_difference
from adafuse.harness.metrics import exact_match, f1, final_number, normalize_answer, number_match
from adafuse.harness.tasks import TASKS, DataError, read_examples
from tests.conftest import ROOT, SHARED


def test_normalized_exact_match_and_f1():
    assert normalize_answer("The  Pacific Ocean.") == "pacific ocean"
    assert exact_match(" George V.", ["George V", "King George"]) == 1.0
    assert exact_match("George", ["George V"]) == 0.0
    assert f1("the big red dog", ["red dog"]) == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert f1("cat", ["red dog"]) == 0.0


def test_final_number_prefers_boxed_then_last_number():
    assert final_number("so 3 + 4 = 7. The answer is \\boxed{1,234}.") == 1234
    assert final_number("12 apples, then 5 more: 17.") == 17
    assert final_number("no digits") is None
    assert number_match("The answer is \\boxed{18}", "9 * 2 = 18\nTherefore, the answer is 18") == 1.0
    assert number_match("The answer is 17", "Therefore, the answer is 18") == 0.0


def test_extraction_cuts_continuations():
    qa, gsm = TASKS["nq"], TASKS["gsm8k"]
    assert qa.extract(" Paris.\n\nQuestion: next?\nAnswer: x") == "Paris."
    assert qa.extract(" Paris Question: more") == "Paris"
    assert gsm.extract("2 + 2 = 4\nThe answer is \\boxed{4}\n\nQuestion: next") == "2 + 2 = 4\nThe answer is \\boxed{4}"
    assert TASKS["flores-de-en"].score("The weather is nice.", "The weather is nice.")["bleu"] > 99


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


def test_bad_data_lines_are_reported_with_their_number(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"question": "q1", "answer": ["a"]}\nnot json\n{"question": "q3"}\n{"question": "q4", "answer": "b"}\n')
    seen = []
    rows = read_examples(path, 10, "skip", seen.append)
    assert [no for no, _ in rows] == [1, 4]
    assert any("line 2" in m for m in seen) and any("line 3" in m for m in seen) and any("fewer than" in m for m in seen)
    with pytest.raises(DataError, match="line 2"):
        read_examples(path, 10, "stop", seen.append)


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


def test_paired_difference_uses_shared_examples_only():
    a = {1: 100.0, 2: 0.0, 3: 100.0, 7: 100.0}
    b = {1: 0.0, 2: 0.0, 3: 100.0, 4: 50.0}
    d = paired_difference(a, b)
    assert (d["n"], d["wins"], d["ties"], d["losses"]) == (3, 1, 2, 0)
    assert d["mean"] == pytest.approx(100 / 3)
    assert 0.0 <= d["low"] <= d["mean"] <= d["high"] <= 100.0
    same = paired_difference({i: float(i % 2) for i in range(40)}, {i: float(i % 2) for i in range(40)})
    assert (same["low"], same["high"], same["ties"]) == (0.0, 0.0, 40)
    assert paired_difference({1: 1.0}, {2: 1.0}) is None
    big = paired_difference({i: 100.0 for i in range(50)}, {i: 0.0 if i < 45 else 100.0 for i in range(50)})
    assert big["low"] > 0  # 45 wins, 5 ties: clearly better


def test_judge_alone_rows_compare_with_the_strong_single_on_the_same_examples():
    """The report's weighting ceiling: AdaFuse judged by the strong model alone vs that model's greedy decode."""
    summary = {("flores-de-en", "greedy:g"): {"chrf": 45.0}, ("flores-de-en", "adafuse+judge"): {"chrf": 40.0},
               ("flores-de-en", "adafuse+judge+word"): {"chrf": 44.0}, ("nq", "greedy:g"): {"em": 10.0}}
    per_ex = {("flores-de-en", "greedy:g"): {1: 50.0, 2: 40.0}, ("flores-de-en", "adafuse+judge"): {1: 45.0, 2: 35.0},
              ("flores-de-en", "adafuse+judge+word"): {1: 50.0, 2: 38.0}}
    obs = []
    out = _judge(per_ex, summary, ["nq", "flores-de-en"], "greedy:g", obs)
    table = "\n".join(out)
    assert "| flores-de-en | 45.0 | 40.0 | -5.0 [-5.0, -5.0] 0/0/2 | 44.0 | -1.0 [-2.0, +0.0] 0/1/1 |" in table
    assert "nq" not in table  # no judge rows there
    assert len(obs) == 1 and "per token -5.00, per word -1.00" in obs[0] and "below it either way" in obs[0]
    summary[("flores-de-en", "adafuse+judge+word")] = {"chrf": 46.0}
    obs.clear()
    _judge(per_ex, summary, ["flores-de-en"], "greedy:g", obs)
    assert "per word +1.00" in obs[0] and "below it either way" not in obs[0]
    assert _judge({}, {("nq", "greedy:g"): {"em": 1.0}}, ["nq"], "greedy:g", obs) == []


def test_experiment_workers_merge_without_duplicates(tmp_path):
    spec = importlib.util.spec_from_file_location("experiments_run", ROOT / "experiments" / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    out = tmp_path / "results"
    out.mkdir()
    row = lambda line, method: json.dumps({"task": "nq", "line": line, "method": method})  # noqa: E731
    (out / "nq.jsonl").write_text(row(1, "adafuse") + "\n")
    for w, lines in enumerate([[row(1, "adafuse"), row(2, "adafuse")], [row(2, "adafuse"), row(2, "beam"), '{"cut']]):
        (tmp_path / f"results.w{w}").mkdir()
        (tmp_path / f"results.w{w}" / "nq.jsonl").write_text("\n".join(lines) + "\n")
    run.merge(out)
    keys = [(r["line"], r["method"]) for r in map(json.loads, (out / "nq.jsonl").read_text().splitlines())]
    assert keys == [(1, "adafuse"), (2, "adafuse"), (2, "beam")]
    # a redo drops the method's rows everywhere, worker folders included: the merge must not bring old ones back
    run.drop(out, {"beam"}, {"nq"})
    run.merge(out)
    keys = [(r["line"], r["method"]) for r in map(json.loads, (out / "nq.jsonl").read_text().splitlines())]
    assert keys == [(1, "adafuse"), (2, "adafuse")]
    # redo and --only name methods by the label their rows carry
    assert run.label("adafuse+gate=adafuse[gate=g.json,normalize=word]") == "adafuse+gate"
    assert run.label("adafuse[weights=1/9]") == "adafuse[weights=1/9]" and run.label("beam") == "beam"
    assert "adafuse+gate" in {run.label(m) for _, _, ms, _ in run.jobs(1, 1, 1) for m in ms}


def test_eval_cli_writes_incrementally_and_resumes(tmp_path):
    data = tmp_path / "data" / "nq"
    data.mkdir(parents=True)
    (data / "prompt.txt").write_text((SHARED / "nq" / "prompt.txt").read_text())
    (data / "dev.jsonl").write_text("\n".join((SHARED / "nq" / "dev.jsonl").read_text().splitlines()[:2]) + "\nbroken\n")
    cmd = [sys.executable, "-m", "adafuse", "eval", "--task", "nq", "--data", str(tmp_path / "data"), "--limit", "5",
           "--methods", "greedy:smollm2-135m-instruct", "--out", str(tmp_path / "out"), "--no-progress"]
    first = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "line 3" in first.stderr and "fewer than --limit 5" in first.stderr
    lines = (tmp_path / "out" / "nq.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["trace"]["rounds"]
    assert (tmp_path / "out" / "summary.md").read_text().count("greedy:smollm2-135m-instruct") >= 1
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 0 and len((tmp_path / "out" / "nq.jsonl").read_text().splitlines()) == 2
    # killed hard while writing: the last line is cut off; the resumed run sets it aside and redoes its example
    path = tmp_path / "out" / "nq.jsonl"
    whole = path.read_text()
    last = whole.splitlines()[-1]
    path.write_text(whole[: len(whole) - len(last) // 2 - 1])
    resumed = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert resumed.returncode == 0 and "cut off" in resumed.stderr
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert sorted(r["line"] for r in rows) == [1, 2]
    assert (tmp_path / "out" / "nq.jsonl.cut").read_text().strip() == last[: len(last) - len(last) // 2].strip()
    assert "| nq | greedy:smollm2-135m-instruct | 2 |" in (tmp_path / "out" / "summary.md").read_text()
    bad = subprocess.run(cmd[:-3] + ["--methods", "vote", "--out", str(tmp_path / "o2")], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "unknown method" in bad.stderr and "Traceback" not in bad.stderr
