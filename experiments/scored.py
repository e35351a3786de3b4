"""The ensemble as a scorer on the shipped scored lm-eval tasks: each model alone and the fused pair on TriviaQA as
4-way multiple choice (acc, acc_norm) and on Flores English sentences (bits per byte), through lm-eval itself.

    python -m experiments.scored run [--limit 100]   # decodes nothing: scores; writes results/scored/<run>.json
    python -m experiments.scored table               # the table of docs and the README, from those files

A single model runs as the `adafuse` lm-eval model with one member (`method=greedy`), which gives lm-eval's `hf`
numbers for that model (tests/test_lm_eval.py); the pair fuses the members' log-likelihoods with equal weights.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from adafuse import DEFAULT_PAIR

OUT = Path(__file__).resolve().parents[1] / "results" / "scored"
TASKS = ("adafuse_triviaqa_mc", "adafuse_flores_en_ppl")
RUNS = {"fused pair": {"models": "+".join(DEFAULT_PAIR)},
        **{f"{name} alone": {"models": name, "method": "greedy"} for name in DEFAULT_PAIR}}


def run(limit: int, out: Path = OUT) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from adafuse.harness.lm_eval_model import AdaFuseLM
    from adafuse.harness.lm_eval_tasks import HERE
    from adafuse.harness.tasks import data_dir, data_source
    out.mkdir(parents=True, exist_ok=True)
    data = data_dir()
    for label, args in RUNS.items():
        t0 = time.perf_counter()
        lm = AdaFuseLM(models=args["models"].split("+"), **{k: v for k, v in args.items() if k != "models"})
        res = simple_evaluate(model=lm, tasks=list(TASKS), task_manager=TaskManager(include_path=str(HERE)),
                              limit=limit, metadata={"data": str(data)})
        row = {"run": label, "model_args": args, "limit": limit, "data": data_source(data),
               "seconds": round(time.perf_counter() - t0, 1),
               "results": {t: {k: v for k, v in res["results"][t].items() if k != "alias"} for t in TASKS},
               "n": {t: res["n-samples"][t]["effective"] for t in TASKS}}
        path = out / f"{label.replace(' ', '_')}.json"
        path.write_text(json.dumps(row, indent=1) + "\n", encoding="utf-8")
        print(f"{label}: {row['results']} ({row['seconds']} s) -> {path}")


def wilson(hits: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson interval of a proportion."""
    p = hits / n
    mid, half = (p + z * z / (2 * n)), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (mid - half) / (1 + z * z / n), (mid + half) / (1 + z * z / n)


def table(out: Path = OUT) -> str:
    """Each run's accuracy (with its 95 % interval) and normalized accuracy on the multiple-choice task, and bits per
    byte on the perplexity task, from the stored results."""
    lines = ["| run | TriviaQA 4-way: acc (95 % interval) | acc_norm | Flores en: bits per byte | lines |",
             "|---|---|---|---|---|"]
    for label in RUNS:
        path = out / f"{label.replace(' ', '_')}.json"
        if not path.exists():
            continue
        row = json.loads(path.read_text(encoding="utf-8"))
        mc, ppl = row["results"][TASKS[0]], row["results"][TASKS[1]]
        n = row["n"][TASKS[0]]
        low, high = wilson(mc["acc,none"] * n, n)
        lines.append(f"| {label} | {mc['acc,none']:.3f} ({low:.3f}–{high:.3f}) | {mc['acc_norm,none']:.3f} | "
                     f"{ppl['bits_per_byte,none']:.3f} | {n} / {row['n'][TASKS[1]]} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("run", "table"))
    p.add_argument("--limit", type=int, default=100, help="lines of each task")
    args = p.parse_args()
    if args.what == "run":
        run(args.limit)
    print(table())


if __name__ == "__main__":
    main()
