"""Every eval run behind docs/results.md, spread over CPU workers, merged into one results folder.

Called by experiments/run.sh. With the small embedded models most of the time is Python and small matmuls, so one
process per core with one torch thread each finishes about twice the work of one process using every core (measured
on 2 cores: a GSM8K greedy decode took 24.0 s on one thread, 21.9 s on two). Each worker appends to its own folder
OUT.wN (seeded with OUT's results, so finished runs are skipped); the new lines are then merged into OUT/<task>.jsonl.
Jobs are taken roughly longest-first from a shared queue; an interrupted run resumes where it stopped.

    python experiments/run.py --workers 2 --n-qa 50 --n-gsm 20 --n-mt 30
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from adafuse.config import PAPER  # noqa: E402
from adafuse.gate import load_gate  # noqa: E402
from adafuse.harness.evaluate import done_keys, write_summary  # noqa: E402

MAIN = ["adafuse", "greedy", "beam", "fixed-span-1", "fixed-span-2", "fixed-span-3", "token-union", "mixture"]
ABLATIONS = ([f"adafuse[branches={b}]" for b in (1, 2, 4, 5)]
             + [f"adafuse[branches={b},diversity=false]" for b in (2, 4, 5)]   # B=3 without diversity is "beam"
             + [f"adafuse[tau={t}]" for t in (0.3, 0.5, 0.9)])                 # τΔ=0.7 and fixed-span-N are in MAIN
# issue 13: first tokens chosen by meaning (embedding) against by spelling (surface) and beam, B = 2..5, on all three QA
# tasks; B=3 surface is "adafuse" and B=3 beam is "beam" (MAIN); λ=3 at B=3 shows the trade-off's other end
EMBEDDING = ([f"adafuse[exploration=embedding,branches={b}]" for b in (2, 4, 5)] + ["adafuse[exploration=embedding]"]
             + ["adafuse[exploration=embedding,explore_lambda=3]"])
SURFACE_BEAM = ([f"adafuse[branches={b}]" for b in (2, 4, 5)]
                + [f"adafuse[branches={b},diversity=false]" for b in (2, 4, 5)])


# issue 12: per-model weights and a learned gate, per task family (GSM8K, where no method scores above 0 and so no
# reward can teach anything, uses the QA family's): the static weights that `python -m adafuse gate search` found best
# on training examples (results/gate/search-<family>.json) and the gate trained on them (assets/gates/<family>.json)
FAMILY = {"nq": "qa", "triviaqa": "qa", "squad": "qa", "gsm8k": "qa", "flores-de-en": "mt", "flores-en-de": "mt"}
ROOT = Path(__file__).resolve().parents[1]


def weighted(task: str) -> list[str]:
    """The weighted method specs for a task (`adafuse+weights`, `+gate`, `+tuned` where their files exist; `+judge`)."""
    fam, out = FAMILY[task], []
    search = ROOT / "results" / "gate" / f"search-{fam}.json"
    if search.exists():
        best = json.loads(search.read_text())["best"]
        out.append(f"adafuse+weights=adafuse[weights={'/'.join(f'{w:g}' for w in best)}]")
    gate = ROOT / "assets" / "gates" / f"{fam}.json"
    if gate.exists():
        norm = load_gate(gate).normalize  # decoded with the NLL averaging it learned with
        out.append(f"adafuse+gate=adafuse[gate={gate.relative_to(ROOT)}"
                   + (f",normalize={norm}]" if norm != "token" else "]"))
    # the static weights with each candidate's NLL averaged per token or per word, whichever scored better on the
    # family's training examples (results/gate/normalize-<family>.json, from `gate search --normalize token|word`)
    norm = ROOT / "results" / "gate" / f"normalize-{fam}.json"
    if norm.exists():
        res = json.loads(norm.read_text())
        out.append(f"adafuse+tuned=adafuse[weights={'/'.join(f'{x:g}' for x in res['weights'])},"
                   f"normalize={res['chosen']}]")
    # the ceiling of any weighting on translation: Gemma (the default pair's second, the better member there) as the
    # only judge, SmolLM2 still proposing, per token and per word
    if fam == "mt":
        out += ["adafuse+judge=adafuse[weights=0/1]", "adafuse+judge+word=adafuse[weights=0/1,normalize=word]"]
    return out


# issue 12: static weights from equal to Gemma alone, scored on the reported Flores examples themselves. Not a
# selection (adafuse+weights is chosen on training lines): it asks whether any static weight could meet the target.
SWEEP = ([f"adafuse[weights=1/{w}]" for w in (2, 3, 5, 15, 30)]
         + [f"adafuse[weights=1/{w},normalize=word]" for w in (1, 3, 30)])


def jobs(n_qa: int, n_gsm: int, n_mt: int) -> list[tuple[str, int, list[str], list[str]]]:
    """(task, limit, methods, extra args), roughly longest first."""
    gsm = ["--max-new-words", "120"]
    out = [("gsm8k", n_gsm, ["beam"], gsm), ("gsm8k", n_gsm, ["adafuse", "greedy"], gsm),
           ("gsm8k", n_gsm, ["mixture"], gsm), ("gsm8k", n_gsm, ["fixed-span-1", "token-union"], gsm),
           ("gsm8k", n_gsm, ["fixed-span-2", "fixed-span-3"], gsm)]
    for task in ("flores-de-en", "flores-en-de"):
        out += [(task, n_mt, ["beam", "mixture"], []), (task, n_mt, [m for m in MAIN if m not in ("beam", "mixture")], [])]
    out += [(task, n_qa, MAIN, []) for task in ("squad", "nq", "triviaqa")]
    out += [(task, n_qa, ABLATIONS, []) for task in ("nq", "triviaqa")]
    out += [("squad", n_qa, SURFACE_BEAM[3:], []), ("squad", n_qa, SURFACE_BEAM[:3], [])]  # (NQ, TriviaQA: ABLATIONS)
    out += [(task, n_qa, part, []) for task in ("squad", "nq", "triviaqa")
            for part in (EMBEDDING[2:], EMBEDDING[:2])]
    out += [(task, n, [m], gsm if task == "gsm8k" else []) for task, n in
            (("flores-de-en", n_mt), ("flores-en-de", n_mt), ("squad", n_qa), ("nq", n_qa), ("triviaqa", n_qa),
             ("gsm8k", n_gsm)) for m in weighted(task)]
    out += [(task, n_mt, [m], []) for task in ("flores-en-de", "flores-de-en") for m in SWEEP]
    return out


def label(spec: str) -> str:
    """The label a method spec's rows carry: LABEL of `LABEL=SPEC`, else the spec (`adafuse[weights=1/9]`)."""
    eq, br = spec.find("="), spec.find("[")
    return spec[:eq] if eq > 0 and (br < 0 or eq < br) else spec


def drop(out: Path, methods: set[str], tasks: set[str]) -> None:
    """Remove the rows of `methods` from OUT/<task>.jsonl for `tasks`, so they are decoded again with the current code;
    also from the worker folders OUT.wN, whose rows the merge would otherwise bring back."""
    folders = [out] + sorted(out.parent.glob(f"{out.name}.w*"))
    for path in sorted(p for f in folders for p in f.glob("*.jsonl")):
        if path.stem not in tasks:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        kept = [ln for ln in lines if not _redone(_method(ln), methods)]
        path.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
        print(f"{path}: {len(lines) - len(kept)} rows of {', '.join(sorted(methods))} dropped to be redone")


def _redone(label: str | None, methods: set[str]) -> bool:
    """`greedy` stands for every `greedy:MODEL` row."""
    return label is not None and (label in methods or label.split(":")[0] in methods)


def _method(line: str) -> str | None:
    try:
        return json.loads(line)["method"]
    except (ValueError, KeyError, TypeError):
        return None


def worker(idx: int, todo: "queue.Queue", out: Path, log: Path, threads: int) -> None:
    folder = out.parent / f"{out.name}.w{idx}"
    folder.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    while True:
        try:
            task, limit, methods, extra = todo.get_nowait()
        except queue.Empty:
            return
        mine = folder / f"{task}.jsonl"
        if not mine.exists() and (out / f"{task}.jsonl").exists():
            shutil.copyfile(out / f"{task}.jsonl", mine)
        cmd = [sys.executable, "-m", "adafuse", "eval", "--task", task, "--limit", str(limit), "--out", str(folder),
               "--no-progress", "--methods", *methods, *extra,
               # as the stored results were decoded: one at a time (wall seconds per decode), without speculation
               # (the algorithm's own forwards), with the paper's unit and pool (PAPER): rows added stay comparable
               "--concurrency", "1", "--no-speculate", "--normalize", PAPER["normalize"],
               "--allow-empty" if PAPER["allow_empty"] else "--no-allow-empty"]
        t0 = time.time()
        with log.open("a") as fh:
            fh.write(f"[w{idx} {time.strftime('%H:%M:%S')}] start {task} {' '.join(methods)}\n")
        rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        with log.open("a") as fh:
            fh.write(f"[w{idx} {time.strftime('%H:%M:%S')}] done {task} {' '.join(methods)} rc={rc.returncode} "
                     f"in {time.time() - t0:.0f}s\n")
            if rc.returncode:
                fh.write(rc.stderr[-2000:] + "\n")


def merge(out: Path) -> None:
    """Append to OUT/<task>.jsonl every worker line whose (example, method) it does not hold yet."""
    for folder in sorted(out.parent.glob(f"{out.name}.w*")):
        for path in sorted(folder.glob("*.jsonl")):
            target = out / path.name
            seen = done_keys(target)
            added = 0
            with target.open("a", encoding="utf-8") as sink:
                for line in path.read_text(encoding="utf-8").splitlines():
                    try:
                        row = json.loads(line)
                        key = (row["line"], row["method"])
                    except (ValueError, KeyError, TypeError):
                        continue  # a line cut by an interrupted run
                    if key not in seen:
                        seen.add(key)
                        sink.write(line + "\n")
                        added += 1
            print(f"{path} -> {target}: {added} new lines")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--n-qa", type=int, default=50,
                    help="NQ, TriviaQA, SQuAD examples (ablations: NQ, TriviaQA; exploration strategies: all three)")
    ap.add_argument("--n-gsm", type=int, default=20, help="GSM8K problems")
    ap.add_argument("--n-mt", type=int, default=30, help="Flores sentences per direction")
    ap.add_argument("--out", type=Path, default=Path("results"))
    ap.add_argument("--merge-only", action="store_true", help="only merge the worker folders into --out")
    ap.add_argument("--redo", nargs="+", default=[], metavar="METHOD",
                    help="decode these method labels again (their old rows are dropped) and run only them")
    ap.add_argument("--only", nargs="+", default=[], metavar="METHOD", help="run only these methods (resuming)")
    ap.add_argument("--tasks", nargs="+", default=["nq", "triviaqa", "squad", "gsm8k", "flores-de-en", "flores-en-de"],
                    help="only these tasks")
    args = ap.parse_args()
    if args.redo:
        drop(args.out, set(args.redo), set(args.tasks))
    if not args.merge_only:
        todo: queue.Queue = queue.Queue()
        for task, limit, methods, extra in jobs(args.n_qa, args.n_gsm, args.n_mt):
            chosen = set(args.redo) | set(args.only)
            methods = [m for m in methods if not chosen or label(m) in chosen]
            if methods and task in args.tasks:
                todo.put((task, limit, methods, extra))
        args.out.mkdir(parents=True, exist_ok=True)
        log = args.out / "parallel.log"
        per_worker = int(os.environ.get("THREADS") or max(1, (os.cpu_count() or 1) // args.workers))
        print(f"{todo.qsize()} jobs on {args.workers} workers ({per_worker} torch threads each); log: {log}")
        threads = [threading.Thread(target=worker, args=(i, todo, args.out, log, per_worker))
                   for i in range(args.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    merge(args.out)
    write_summary(args.out)


if __name__ == "__main__":
    main()
