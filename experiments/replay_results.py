"""Decode stored evaluation rows again and compare with what they recorded: the decoder's outputs must not change.

    python -m experiments.replay_results results --per-method 1 [--tasks nq gsm8k] [--out replay.json]

For each task file `results/<task>.jsonl.gz`, the first `--per-method` rows of every method are decoded again with
the models, settings and prompt their trace names, and compared round by round (chosen candidate text) and by
output. Prints one line per row that differs and a table per task; exits 1 if any row differs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from adafuse import AdaFuse, DecodeConfig, get_model
from adafuse.harness.evaluate import read_rows
from adafuse.report import format_table


def rows_to_check(path: Path, per_method: int) -> list[dict]:
    """The first `per_method` rows of every method in one results file."""
    seen: dict[str, int] = {}
    out = []
    for row in read_rows(path):
        if seen.get(row["method"], 0) < per_method:
            seen[row["method"]] = seen.get(row["method"], 0) + 1
            out.append(row)
    return out


def replay(row: dict) -> tuple[bool, str]:
    """(same, what differs) for one stored row."""
    trace = row["trace"]
    cfg = DecodeConfig.from_dict(trace["settings"])
    models = [get_model(m.split("#")[0]) for m in trace["models"]]
    again = AdaFuse(models, cfg, parallel=False).generate(trace["prompt"])
    stored = [r["candidates"][r["chosen"]]["text"] for r in trace["rounds"]]
    now = [r.candidates[r.chosen].text for r in again.rounds]
    if stored == now and again.output == trace["output"]:
        return True, ""
    at = next((i for i, (a, b) in enumerate(zip(stored, now)) if a != b), min(len(stored), len(now)))
    return False, (f"round {at}: stored {stored[at] if at < len(stored) else '(end)'!r}, "
                   f"now {now[at] if at < len(now) else '(end)'!r}; output {trace['output']!r} -> {again.output!r}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="the folder of <task>.jsonl.gz files")
    p.add_argument("--per-method", type=int, default=1, help="rows decoded again per method and task")
    p.add_argument("--tasks", nargs="*", help="task files to check (default: every one)")
    p.add_argument("--out", type=Path, help="write every row's result here as JSON")
    args = p.parse_args(argv)
    files = sorted(args.results.glob("*.jsonl.gz"))
    if args.tasks:
        files = [f for f in files if f.name.removesuffix(".jsonl.gz") in args.tasks]
    table, record, failed = [], [], 0
    for path in files:
        rows = rows_to_check(path, args.per_method)
        same, t0 = 0, time.perf_counter()
        for row in rows:
            ok, why = replay(row)
            same += ok
            record.append({"task": row["task"], "line": row["line"], "method": row["method"], "same": ok, "why": why})
            if not ok:
                failed += 1
                print(f"DIFFERS {row['task']} line {row['line']} {row['method']}: {why}", flush=True)
        table.append({"task": path.name.removesuffix(".jsonl.gz"), "rows": len(rows), "same": same,
                      "seconds": round(time.perf_counter() - t0, 1)})
    print(format_table(table))
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
