"""Re-checking shipped gates on the validation lines (experiments/validate_gates.py) on hand-built rows: the numbers,
the helps rule, the gate file's "validated" record, and the report's table computed from the stored rows."""
import gzip
import json

import pytest

from adafuse.gate import Gate, load_gate
from experiments import validate_gates as vg


def rows_for(task: str, scores: dict[str, list[float]], metric: str, first: int = 51) -> list[dict]:
    return [{"task": task, "method": m, "line": first + i, "scores": {metric: v}}
            for m, vals in scores.items() for i, v in enumerate(vals)]


SQUAD = {"adafuse": [1.0, 0.5, 1.0, 0.0], "greedy:a": [0.0, 0.5, 1.0, 0.0], "greedy:b": [1.0, 1.0, 1.0, 0.0],
         "gate:qa": [0.0, 0.5, 0.5, 0.0]}
NQ = {"adafuse": [0.0, 0.0, 0.0], "greedy:a": [0.0, 0.0, 0.0], "greedy:b": [1.0, 0.0, 0.0],
      "gate:qa": [1.0, 0.0, 0.0]}  # line 54 of nq: only some methods ran
QA = {"key": "gate:qa", "name": "gate qa", "kind": "gate", "label": "gate:qa", "tasks": ["nq", "squad"], "path": "qa.json"}


def test_validation_numbers_compare_with_equal_weights_and_the_better_single_on_common_lines():
    rows = rows_for("squad", SQUAD, "f1") + rows_for("nq", NQ, "em") + [
        {"task": "nq", "method": "gate:qa", "line": 54, "scores": {"em": 1.0}}]
    v = vg.validation_numbers(rows, QA)
    sq, nq = v["tasks"]["squad"], v["tasks"]["nq"]
    assert (sq["metric"], sq["n"], sq["lines"], sq["gate"], sq["equal"]) == ("f1", 4, "51-54", 25.0, 62.5)
    assert sq["best_single"] == {"model": "b", "score": 75.0}
    assert (sq["vs_equal"]["diff"], sq["vs_equal"]["wins"], sq["vs_equal"]["ties"], sq["vs_equal"]["losses"]) == \
        (-37.5, 0, 2, 2)
    assert sq["vs_best_single"]["diff"] == -50.0 and sq["vs_equal"]["low"] <= -37.5 <= sq["vs_equal"]["high"]
    assert (nq["n"], nq["lines"], nq["gate"], nq["equal"]) == (3, "51-53", pytest.approx(33.33), 0.0)  # not line 54
    assert v["pooled"]["n"] == 7 and v["pooled"]["vs_equal"]["diff"] == pytest.approx((-150 + 100) / 7, abs=0.01)
    assert v["helps"] is False and v["lines"] == "51-54" and v["complete"] is False
    assert v["summary"].startswith("experimental: −7.1 points vs equal weights [")
    assert "7 unseen NQ/SQuAD" in v["summary"]
    # the rule: the pooled interval above 0
    better = {"adafuse": [0.5, 0.5, 0.0, 0.5, 0.5], "gate:qa": [1.0, 1.0, 0.5, 1.0, 0.75], "greedy:a": [1.0] * 5,
              "greedy:b": [0.0] * 5}
    good = vg.validation_numbers(rows_for("squad", better, "f1"), {**QA, "tasks": ["squad"]})
    assert good["pooled"]["vs_equal"]["low"] > 0 and good["helps"] is True
    assert good["summary"] == "helps: +45.0 F1 vs equal weights [+35.0, +50.0], −15.0 vs the better single model, on " \
                              "5 unseen SQuAD lines"
    assert vg.validation_numbers(rows_for("squad", {"adafuse": [1.0], "gate:qa": [1.0]}, "f1"), QA) is None


def test_the_gate_file_gets_its_numbers_and_keeps_its_weights(tmp_path):
    g = Gate.zeros(["a", "b"])
    g.b = [0.25, -0.25]
    g.trained = {"tasks": ["nq", "squad"]}
    path = tmp_path / "qa.json"
    g.save(path)
    rows = rows_for("squad", SQUAD, "f1") + rows_for("nq", NQ, "em")
    summary = vg.write_metadata([{**QA, "path": str(path)}], rows, store=tmp_path / "store")
    back = load_gate(path)
    assert (back.W, back.b, back.trained) == (g.W, g.b, g.trained)
    assert back.validated == summary["gate:qa"]["validated"] == vg.validation_numbers(rows, QA)
    assert back.helps is False and back.summary.startswith("experimental")
    assert json.loads((tmp_path / "store" / "summary.json").read_text())["gate:qa"]["path"] == str(path)


def test_the_report_table_is_computed_from_the_stored_rows(tmp_path):
    store = tmp_path / "validation"
    store.mkdir()
    for task, scores, metric in (("squad", SQUAD, "f1"), ("nq", NQ, "em")):
        data = "".join(json.dumps(r) + "\n" for r in rows_for(task, scores, metric))
        (store / f"{task}.jsonl.gz").write_bytes(gzip.compress(data.encode()))
    mt = {"adafuse": [10.0] * 5, "gate:mt": [20.0, 20.0, 20.0, 20.0, 21.0], "greedy:a": [30.0] * 5,
          "greedy:b": [0.0] * 5}
    data = "".join(json.dumps(r) + "\n" for r in rows_for("flores-de-en", mt, "chrf"))
    (store / "flores-de-en.jsonl.gz").write_bytes(gzip.compress(data.encode()))
    helper = {"key": "gate:mt", "name": "gate mt", "kind": "gate", "label": "gate:mt", "tasks": ["flores-de-en"],
              "path": str(tmp_path / "mt.json")}
    static = {"key": "w qa", "name": "weights 1/9", "kind": "static", "label": "greedy:b", "tasks": ["squad"],
              "family": "qa", "report": ["adafuse+weights"]}
    obs = []
    out = "\n".join(vg.validation_section(tmp_path, obs, [{**QA, "path": str(tmp_path / "qa.json")}, helper,
                                                             static]))
    assert "## Validation" in out and "| squad | 51-54 (4) | f1 | 25.0 | 62.5 | 75.0 (b) | -37.5 [" in out
    assert "| **all its tasks** | (7) |" in out and "no: experimental" in out and "**yes**" in out
    assert "| `greedy:b` (qa) | adafuse+weights | squad | 51-54 (4) | f1 | 75.0 |" in out
    assert "the interval above 0 — `" in obs[0] and "mt.json` (but below the better single model: -9.8 [" in obs[0]
    assert "qa.json` (-7.1 [" in obs[0]
    assert "lines decoded so far per task: nq 3, squad 4, flores-de-en 5 of 50" in obs[0] and vg.COMMAND in obs[0]
    assert vg.validation_section(tmp_path / "elsewhere", [], []) == []


def test_subjects_are_the_shipped_gates_and_the_reported_static_weightings():
    subs = {s["key"]: s for s in vg.subjects()}
    gates = [s for s in subs.values() if s["kind"] == "gate"]
    assert {s["label"] for s in gates} >= {"gate:qa", "gate:mt"}
    assert subs["gate:mt"]["spec"] == "gate:mt=adafuse[gate=assets/gates/mt.json,normalize=word]"
    assert subs["gate:qa"]["tasks"] == ["nq", "triviaqa", "squad"]
    static = [s for s in subs.values() if s["kind"] == "static"]
    assert static and all(set(s["tasks"]) <= {"nq", "triviaqa", "squad", "flores-de-en", "flores-en-de"}
                          for s in static)
    assert len({(s["family"], s["spec"]) for s in static}) == len(static)  # one subject per family and settings
    assert all(set(s["tasks"]) <= set(vg.FAMILIES[s["family"]]) for s in static)
    assert any("adafuse+weights" in s["report"] for s in static)


def test_the_docs_and_the_shipped_gate_files_say_the_same_validated_numbers():
    """docs/weights-and-gates.md quotes each shipped gate's validation summary as the file records it (the app's menu
    shows the same text): after a new validation run, a stale page fails here instead of overselling a gate."""
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "weights-and-gates.md").read_text(encoding="utf-8")
    gates = sorted((root / "assets" / "gates").glob("*.json"))
    assert gates
    for path in gates:
        v = json.loads(path.read_text())["validated"]
        assert f"`assets/gates/{path.name}` — {v['summary']}." in page, path.name
        assert v["summary"].startswith("helps" if v["helps"] else "experimental")


def test_the_default_unit_is_the_one_not_worse_on_the_tasks_that_answers_the_most_newcomers(tmp_path):
    """experiments/validate_normalize.py on hand-built rows: per task and pooled, each unit − per token on the lines
    every unit decoded, the empty and run-on answers of each, the newcomers' answers from bench/newcomers.py's files,
    and the declared rule that picks the default."""
    import json
    from experiments import validate_normalize as vn

    def rows(task, method, scores, outputs, reasons):
        return [{"task": task, "method": method, "line": 51 + i, "scores": {"em": s}, "prediction": o,
                 "trace": {"stop_reason": r}} for i, (s, o, r) in enumerate(zip(scores, outputs, reasons))]
    token = rows("nq", vn.TOKEN, [1.0, 0.0, 0.0], ["a", "b", "1. 2."], ["eos", "eos", "max_new_words"])
    word = rows("nq", vn.WORD, [1.0, 0.0, 1.0, 1.0], ["a", "", "c", "d"], ["eos", "eos", "eos", "eos"])
    byte = rows("nq", vn.BYTE, [0.0, 0.0, 0.0], ["x", "y", "z"], ["eos", "eos", "eos"])
    r = vn.numbers(token + word + byte)
    nq = r["tasks"]["nq"]
    assert (nq["n"], nq["token"], nq["word"]) == (3, {"score": 33.33, "empty": 0, "run_on": 1},
                                                  {"score": 66.67, "empty": 1, "run_on": 0})
    assert nq["minus_token"]["word"]["wins"] == 1 and nq["minus_token"]["byte"]["losses"] == 1
    assert r["pooled"]["broken"]["token"] == {"empty": 0, "run_on": 1}
    newcomer = [{"question": "q", "way": "chat", "run": f"fused ({u})", "answer": "a", "holds": h, "empty": False,
                 "run_on": ro} for u, h, ro in (("token", True, True), ("word", True, False), ("byte", True, False),
                                                ("byte", False, False))]
    (tmp_path / "newcomers-chat.json").write_text(json.dumps({"rows": newcomer}))
    r["newcomers"] = vn.newcomer_numbers(tmp_path)
    assert r["newcomers"]["fused (token)"]["chat"] == {"asked": 1, "holds": 1, "empty": 0, "run_on": 1, "answered": 0}
    r["pooled"]["minus_token"]["word"].update(low=-1.0, high=50.0)  # not worse: eligible
    r["pooled"]["minus_token"]["byte"].update(low=-9.0, high=-1.0)  # worse on the tasks: out, whatever newcomers say
    assert vn.choose(r) == "word"
    r["pooled"]["minus_token"]["word"].update(low=-9.0, high=-1.0)
    assert vn.choose(r) == "token"  # the tasks rule both out
    r["pooled"]["minus_token"]["byte"].update(low=-2.0, high=3.0)
    assert vn.choose(r) == "byte"
    assert "| fused (byte) | chat | 2 | 1 | 0 | 0 | 1 |" in vn.document({**r, "chosen": "byte", "rule": vn.RULE})
    zero = vn.zero_shot_numbers([
        {"task": "nq", "line": 51, "normalize": "token", "output": " The 18 years", "gold": ["18"], "stop_reason": "eos"},
        {"task": "nq", "line": 51, "normalize": "word", "output": "", "gold": ["18"], "stop_reason": "eos"}])
    assert zero["token"]["holds_gold"] == 1 and zero["word"]["empty"] == 1
