"""Pick between gate files for one task family on training examples: each gate decodes (greedily, as at test time,
with the NLL averaging it was trained with) the first N training lines of every task of the family; the higher mean
reward wins. Writes results/gate/select-<family>.json, which docs/results.md reports.

    python experiments/gate_select.py mt assets/gates/mt.json /tmp/mt-word.json --per-task 12
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from adafuse.gate import load_gate  # noqa: E402
from adafuse.harness.gate_train import TRAIN_OFFSET, decode_rewards, training_examples  # noqa: E402
from adafuse.harness.tasks import data_dir  # noqa: E402
from adafuse.models import get_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("family")
    ap.add_argument("gates", nargs="+", type=Path)
    ap.add_argument("--per-task", type=int, default=12)
    args = ap.parse_args()
    gates = [load_gate(g) for g in args.gates]
    tasks = gates[0].trained.get("tasks", [])
    assert all(g.trained.get("tasks") == tasks and g.models == gates[0].models for g in gates), "same tasks and models"
    lms = [get_model(m) for m in gates[0].models]
    exs = training_examples(tasks, data_dir(), TRAIN_OFFSET, args.per_task)
    rows = []
    for path, g in zip(args.gates, gates):
        t0 = time.perf_counter()
        per = decode_rewards(lms, exs, data_dir(), gate=str(path), normalize=g.normalize)
        per_task = {k: sum(v) / len(v) for k, v in per.items()}
        rows.append({"gate": str(path), "normalize": g.normalize, "steps": len(g.trained.get("curve", [])),
                     "per_task": per_task, "reward": sum(per_task.values()) / len(per_task),
                     "seconds": round(time.perf_counter() - t0)})
        print(rows[-1], flush=True)
    best = max(rows, key=lambda r: r["reward"])
    out = {"family": args.family, "tasks": tasks, "models": gates[0].models, "offset": TRAIN_OFFSET,
           "per_task_examples": args.per_task, "rows": rows, "chosen": best["gate"], "chosen_normalize": best["normalize"]}
    path = Path(__file__).resolve().parents[1] / "results" / "gate" / f"select-{args.family}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{path}: chose {best['gate']} ({best['normalize']})")


if __name__ == "__main__":
    main()
