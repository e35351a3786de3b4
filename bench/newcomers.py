"""What a newcomer types: 30 common-knowledge questions of this project's own (not from the task data), asked the two
ways people ask them — as a completion ("Question: …\\nAnswer:", with the "\\n" stop the app proposes for that frame)
and as a chat message (each model's chat template, no stop) — with the library's default settings. For the fused pair
under each NLL unit and for each model alone it prints how many answers hold the answer (an alias inside the answer,
compared as normalized text), how many are empty and how many run on (the decode hit a word or token cap instead of
ending).

    python -m bench.newcomers                          # the bundled pair, every question, both ways (minutes)
    python -m bench.newcomers --limit 5 --ways chat --units token word
    python -m bench.newcomers --out results/bench/newcomers.json
    python -m bench.newcomers --redo-empty results/bench  # stored runs brought to today's defaults (below)

`--redo-empty FOLDER` reads the stored newcomers-<way>.json there and decodes again only the fused answers that came out
empty: a setting that keeps the end of the answer back before the first word (`allow_empty` off) changes no other
decode, since it only leaves a candidate that did not win out of the first round. The stored empty rows stay, labelled
"… end at once allowed)", beside the new ones.

Not a test: the numbers describe the models as much as the code (docs/defaults.md quotes a run).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

# (question, aliases: any one inside the answer counts)
QUESTIONS = [
    ("Who wrote Hamlet?", ["Shakespeare"]),
    ("What is the capital of France?", ["Paris"]),
    ("What is the largest planet in our solar system?", ["Jupiter"]),
    ("Who painted the Mona Lisa?", ["Leonardo", "da Vinci"]),
    ("What is the chemical symbol for gold?", ["Au"]),
    ("How many days are there in a week?", ["seven", "7"]),
    ("What is the capital of Japan?", ["Tokyo"]),
    ("Which planet is known as the Red Planet?", ["Mars"]),
    ("What is the boiling point of water in degrees Celsius?", ["100"]),
    ("Who was the first president of the United States?", ["Washington"]),
    ("What is the longest river in Africa?", ["Nile"]),
    ("What language is spoken in Brazil?", ["Portuguese"]),
    ("What is the freezing point of water in degrees Fahrenheit?", ["32"]),
    ("Who developed the theory of relativity?", ["Einstein"]),
    ("What is the capital of Italy?", ["Rome"]),
    ("How many legs does a spider have?", ["eight", "8"]),
    ("What gas do plants absorb from the air?", ["carbon dioxide", "CO2"]),
    ("What is the smallest prime number?", ["two", "2"]),
    ("Which ocean is the largest?", ["Pacific"]),
    ("Who wrote Pride and Prejudice?", ["Austen"]),
    ("What is the capital of Germany?", ["Berlin"]),
    ("What is the hardest natural substance?", ["diamond"]),
    ("How many continents are there?", ["seven", "7"]),
    ("What currency is used in the United Kingdom?", ["pound", "sterling"]),
    ("Who discovered penicillin?", ["Fleming"]),
    ("What is the square root of 64?", ["eight", "8"]),
    ("In which country are the pyramids of Giza?", ["Egypt"]),
    ("What is the main ingredient of guacamole?", ["avocado"]),
    ("Which animal is known as the king of the jungle?", ["lion"]),
    ("What is the tallest mountain in the world?", ["Everest"]),
]
RUN_ON = ("max_new_words", "max_new_tokens", "context full")
WAYS = ("completion", "chat")


def holds(answer: str, aliases: list[str]) -> bool:
    from adafuse.harness.metrics import normalize_answer
    text = f" {normalize_answer(answer)} "
    return any(f" {normalize_answer(a)} " in text for a in aliases)


def ask(way: str, question: str) -> tuple[str, dict]:
    """The prompt and the settings a newcomer's question gets, one way or the other."""
    if way == "completion":
        return f"Question: {question}\nAnswer:", {"stop": ("\n",)}
    return question, {"mode": "chat"}


def run(models, units, ways, limit: int | None, log=print) -> list[dict]:
    from adafuse import AdaFuse, DecodeConfig, greedy
    rows = []
    for question, aliases in QUESTIONS[:limit]:
        for way in ways:
            prompt, settings = ask(way, question)
            runs = [(f"fused ({u})", lambda u=u: AdaFuse(models, DecodeConfig(**settings, normalize=u)).generate(prompt))
                    for u in units]
            runs += [(f"{m.name} alone", lambda m=m: greedy(m, prompt, DecodeConfig(**settings))) for m in models]
            for label, decode in runs:
                t0 = time.perf_counter()
                trace = decode()
                row = {"question": question, "way": way, "run": label, "answer": trace.output,
                       "holds": holds(trace.output, aliases), "empty": not trace.output.strip(),
                       "run_on": str(trace.stop_reason or "") in RUN_ON, "seconds": round(time.perf_counter() - t0, 2)}
                rows.append(row)
                log(f"{way:10} {label:32} {'✓' if row['holds'] else '·'} {trace.output.strip()[:70]!r}")
    return rows


def redo_empty(folder: Path, models, log=print) -> None:
    """Each stored newcomers-<way>.json in `folder` brought to today's defaults: its fused answers that came out empty
    decoded again, the others carried over; every stored fused answer kept too, under "fused (UNIT, end at once
    allowed)"."""
    from adafuse import AdaFuse, DecodeConfig
    aliases = dict(QUESTIONS)
    for path in sorted(folder.glob("newcomers-*.json")):
        rows, now, before = json.loads(path.read_text(encoding="utf-8"))["rows"], [], []
        for row in rows:
            label = row["run"]
            if not (label.startswith("fused (") and "," not in label):
                now.append(row)
                continue
            unit = label[len("fused ("):-1]
            before.append({**row, "run": f"fused ({unit}, end at once allowed)"})
            if not row["empty"]:
                now.append(row)
                continue
            prompt, settings = ask(row["way"], row["question"])
            t0 = time.perf_counter()
            trace = AdaFuse(models, DecodeConfig(**settings, normalize=unit)).generate(prompt)
            now.append({**row, "answer": trace.output, "holds": holds(trace.output, aliases[row["question"]]),
                        "empty": not trace.output.strip(), "run_on": str(trace.stop_reason or "") in RUN_ON,
                        "seconds": round(time.perf_counter() - t0, 2)})
            log(f"{row['way']:10} {label:32} {'✓' if now[-1]['holds'] else '·'} {trace.output.strip()[:70]!r}")
        out = now + before
        path.write_text(json.dumps({"rows": out, "table": table(out)}, indent=1, ensure_ascii=False) + "\n")


def table(rows: list[dict]) -> str:
    """Per way and run: answers holding the answer, empty, run on, of how many."""
    lines = ["| way | run | holds the answer | empty | run on | of |", "|---|---|---|---|---|---|"]
    for way in dict.fromkeys(r["way"] for r in rows):
        for run_ in dict.fromkeys(r["run"] for r in rows):
            these = [r for r in rows if r["way"] == way and r["run"] == run_]
            if these:
                lines.append(f"| {way} | {run_} | {sum(r['holds'] for r in these)} | {sum(r['empty'] for r in these)} "
                             f"| {sum(r['run_on'] for r in these)} | {len(these)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from adafuse import DEFAULT_PAIR, get_model
    from adafuse.config import NORMALIZATIONS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(DEFAULT_PAIR))
    p.add_argument("--units", nargs="+", choices=NORMALIZATIONS, default=list(NORMALIZATIONS))
    p.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    p.add_argument("--limit", type=int, default=None, help="the first N questions")
    p.add_argument("--out", type=Path, default=None, help="write every answer here (JSON)")
    p.add_argument("--redo-empty", type=Path, default=None, metavar="FOLDER",
                   help="decode again the empty fused answers of the stored runs in FOLDER (see above)")
    args = p.parse_args(argv)
    models = [get_model(m) for m in args.models]
    if args.redo_empty:
        redo_empty(args.redo_empty, models)
        return 0
    rows = run(models, args.units, args.ways, args.limit)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows, "table": table(rows)}, indent=1, ensure_ascii=False) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
