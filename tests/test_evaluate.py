"""Metrics on hand-written cases, answer extraction, method specs, data errors, summaries, and one real CLI run."""
import importlib.util
import json
import subprocess
import sys

import pytest

from adafuse.errors import ConfigError
from adafuse.harness.evaluate import main_metric_table, parse_methods, summarize
from adafuse.harness.results import (_gate_start, _judge, _selection_notes, _sweep, paired_difference,
                                     per_task_choice, per_task_rows, static_weighting)
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


def test_static_weighting_reads_the_weights_from_the_run_settings_not_the_label():
    plain = {"tau": 0.7, "max_words": 3, "branches": 3, "diversity": True, "exploration": "surface",
             "method": "adafuse", "gate": "", "weights": [], "normalize": "token"}
    assert static_weighting(plain) == (1.0, "token")
    assert static_weighting({**plain, "weights": [1.0, 9.0], "normalize": "word"}) == (pytest.approx(1 / 9), "word")
    assert static_weighting({**plain, "weights": [0.0, 1.0]}) == (0.0, "token")
    for other in ({"gate": "assets/gates/mt.json"}, {"branches": 1}, {"method": "beam"}, {"exploration": "embedding"},
                  {"weights": [1.0, 2.0, 3.0]}, {"weights": [1.0, 0.0]}):
        assert static_weighting({**plain, **other}) is None


def test_weight_sweep_orders_weightings_and_says_whether_any_meets_the_strong_model(tmp_path):
    """The sweep table: one row per weight ratio (equal → the strong model alone), per token and per word, with the
    paired difference to the strong single; the observation names the best and by how much it misses."""
    plain = {"tau": 0.7, "max_words": 3, "branches": 3, "diversity": True, "exploration": "surface",
             "method": "adafuse", "gate": ""}
    runs = {"adafuse": ([], "token", [20.0, 30.0]), "w9": ([1.0, 9.0], "token", [40.0, 48.0]),
            "w9word": ([1.0, 9.0], "word", [42.0, 44.0]), "judge": ([0.0, 1.0], "token", [38.0, 46.0]),
            "gated": ([1.0, 1.0], "token", [99.0, 99.0])}
    rows, per_ex = [], {("flores-de-en", "greedy:g"): {1: 44.0, 2: 50.0}}
    summary = {("flores-de-en", "greedy:g"): {"chrf": 47.0}}
    for label, (w, norm, scores) in runs.items():
        settings = {**plain, "weights": w, "normalize": norm, **({"gate": "g.json"} if label == "gated" else {})}
        for line, v in zip((1, 2), scores):
            rows.append({"task": "flores-de-en", "method": label, "line": line,
                         "trace": {"models": ["s", "g"], "settings": settings}})
        per_ex[("flores-de-en", label)] = dict(zip((1, 2), scores))
        summary[("flores-de-en", label)] = {"chrf": sum(scores) / 2}
    obs = []
    table = "\n".join(_sweep(rows, per_ex, summary, ["flores-de-en"], "greedy:g", tmp_path, obs))
    body = [ln for ln in table.splitlines() if ln.startswith("| flores-de-en")]
    assert [ln.split(" | ")[1] for ln in body] == ["1 / 1", "1 / 9", "0 / 1"]  # equal weights first, the judge last
    assert "| 1 / 9 | 44.00 (w9) | -3.0 [-4.0, -2.0] 0/0/2 | 43.00 (w9word) | -4.0 [-6.0, -2.0] 0/0/2 |" in table
    assert "99" not in table  # a gated run is not a static weighting
    assert ("flores-de-en: best 1 / 9 per token at 44.00 vs 47.00 — below it by 3.00 (sentence by sentence "
            "-3.0 [-4.0, -2.0] 0/0/2)") in obs[0]
    summary[("flores-de-en", "w9word")] = {"chrf": 47.5}
    obs.clear()
    _sweep(rows, per_ex, summary, ["flores-de-en"], "greedy:g", tmp_path, obs)
    assert "best 1 / 9 per word at 47.50 vs 47.00 — at or above it" in obs[0]
    assert _sweep(rows[:4], per_ex, summary, ["flores-de-en"], "greedy:g", tmp_path, []) == []  # under three weightings


def test_per_task_weighting_is_chosen_on_training_lines_and_reuses_the_run_with_those_settings(tmp_path):
    """adafuse+per-task: a task with its own token and word searches takes the best weighting of the two (by training
    reward); another task takes its family's choice; its rows are the reported run decoded with exactly that
    weighting, relabelled, and nothing else."""
    gate = tmp_path / "gate"
    gate.mkdir()
    def search(task, norm, grid):
        (gate / f"search-{task}-{norm}.json").write_text(json.dumps(
            {"tasks": [task], "models": ["s", "g"], "offset": 101, "examples": 20, "normalize": norm,
             "grid": [{"weights": w, "reward": r} for w, r in grid], "best": max(grid, key=lambda x: x[1])[0]}))
    search("flores-en-de", "token", [([1.0, 3.0], 0.30), ([0.0, 1.0], 0.31)])
    search("flores-en-de", "word", [([1.0, 3.0], 0.33), ([1.0, 30.0], 0.32)])
    (gate / "normalize-qa.json").write_text(json.dumps({"weights": [1.0, 9.0], "chosen": "token", "token": 0.25,
                                                        "word": 0.2, "examples": 36}))
    assert per_task_choice(tmp_path, "flores-en-de") == {
        "ratio": pytest.approx(1 / 3), "normalize": "word", "weights": [1.0, 3.0], "reward": 0.33, "examples": 20,
        "source": "search-flores-en-de-word.json"}
    assert per_task_choice(tmp_path, "nq")["source"] == "normalize-qa.json"
    assert per_task_choice(tmp_path, "flores-de-en") is None  # no search of its own, no translation family file
    plain = {"tau": 0.7, "max_words": 3, "branches": 3, "diversity": True, "exploration": "surface",
             "method": "adafuse", "gate": ""}
    def run(task, label, w, norm, lines=(1, 2)):
        return [{"task": task, "method": label, "line": i, "prediction": f"{label} {i}",
                 "trace": {"settings": {**plain, "weights": w, "normalize": norm}}} for i in lines]
    rows = (run("flores-en-de", "a", [1.0, 3.0], "token") + run("flores-en-de", "b", [2.0, 6.0], "word", lines=(1,))
            + run("flores-en-de", "c", [2.0, 6.0], "word") + run("nq", "w", [1.0, 9.0], "token")
            + run("nq", "gated", [1.0, 9.0], "token"))
    rows[-1]["trace"]["settings"] = {**rows[-1]["trace"]["settings"], "gate": "g.json"}
    composed, chosen = per_task_rows(rows, tmp_path)
    assert {t: c["run"] for t, c in chosen.items()} == {"flores-en-de": "c", "nq": "w"}  # b misses an example
    assert sorted((r["task"], r["line"], r["method"], r["from"], r["prediction"]) for r in composed) == [
        ("flores-en-de", 1, "adafuse+per-task", "c", "c 1"), ("flores-en-de", 2, "adafuse+per-task", "c", "c 2"),
        ("nq", 1, "adafuse+per-task", "w", "w 1"), ("nq", 2, "adafuse+per-task", "w", "w 2")]
    assert all(r["method"] != "adafuse+per-task" for r in rows)  # the runs themselves are left as they were
    summary = {("flores-en-de", "a"): {"chrf": 30.0}, ("flores-en-de", "c"): {"chrf": 25.0}}
    notes = _selection_notes(rows, summary, tmp_path, chosen, ["flores-en-de", "nq"])
    assert notes == ["- How adafuse+per-task chose on flores-en-de: 4 weightings scored 0.3000–0.3300 on 20 training "
                     "lines; the chosen one (1 / 3 per word, 0.3300; the next 0.3200) ranks 2 of 2 on the reported "
                     "lines (25.00; best 1 / 3 per token at 30.00)."]  # nq chose by its family: no note


def test_a_gate_is_compared_with_the_static_run_it_started_from_on_the_same_examples():
    """assets/gates/mt.json started from weights 1/9 with NLL per word: the run with exactly those settings is the
    gate before training; a run with other weights or the other averaging is not."""
    start = json.loads((ROOT / "assets" / "gates" / "mt.json").read_text())["trained"]
    plain = {"tau": 0.7, "max_words": 3, "branches": 3, "diversity": True, "exploration": "surface",
             "method": "adafuse", "gate": ""}
    def run(label, settings, scores):
        return [{"task": "flores-en-de", "method": label, "line": i, "trace": {"settings": {**plain, **settings}}}
                for i in range(1, len(scores) + 1)], {i: v for i, v in enumerate(scores, 1)}
    runs = {"adafuse+gate": ({"gate": "assets/gates/mt.json", "normalize": "word"}, [30.0, 40.0]),
            "a-token": ({"weights": start["init"], "normalize": "token"}, [10.0, 10.0]),
            "b-start": ({"weights": [2 * w for w in start["init"]], "normalize": start.get("normalize", "token")},
                        [20.0, 44.0]),
            "c-other": ({"weights": [1.0, 1.0], "normalize": start.get("normalize", "token")}, [0.0, 0.0])}
    rows, per_ex, summary = [], {}, {}
    for label, (settings, scores) in runs.items():
        rs, pe = run(label, settings, scores)
        rows += rs
        per_ex[("flores-en-de", label)] = pe
        summary[("flores-en-de", label)] = {"chrf": sum(scores) / len(scores)}
    obs = []
    table = "\n".join(_gate_start(rows, per_ex, summary, ["flores-en-de"], obs))
    assert "| flores-en-de | assets/gates/mt.json |" in table
    assert "| b-start | 32.0 | 35.0 | +3.0 [-4.0, +10.0] 1/0/1 |" in table
    assert "flores-en-de 32.00 → 35.00" in obs[0]
    assert _gate_start(rows[:2], per_ex, summary, ["flores-en-de"], []) == []  # no static run to compare with


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
