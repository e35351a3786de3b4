"""The experiment runner (experiments/run.py): worker folders merge without duplicates, redo and --only by label; the
README's table of the scored tasks comes from the stored runs (experiments/scored.py)."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def test_the_readmes_table_of_the_scored_tasks_is_computed_from_the_stored_runs():
    """The README quotes `python -m experiments.scored table` as the stored runs (results/scored/) make it."""
    from experiments.scored import table
    assert table() in (ROOT / "README.md").read_text(encoding="utf-8")
