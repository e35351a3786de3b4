"""Benchmark tasks over ../shared/data (or the sample shipped in the package, harness/sample_data): prompt building,
answer extraction, scoring. Nothing is read at import: `data_dir()` finds the data when asked."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from . import metrics
from ..errors import AdafuseError, ConfigError

ROOT = Path(__file__).resolve().parents[2]  # the checkout, when the package runs from one
# The first 20 examples of each task and its prompt file, shipped with the package (package data) for machines without
# the full sets (a Space, a wheel installed anywhere).
SAMPLE_DATA = Path(__file__).resolve().parent / "sample_data"
SAMPLE_NOTE = ("sample: the first 20 examples per task shipped with the package (the full sets: ../shared/data, or a "
               "folder given by $ADAFUSE_DATA or --data)")


def data_dir(roots: tuple[Path, ...] | None = None) -> Path:
    """The benchmark data, found now: $ADAFUSE_DATA when set (a missing folder is an error when read), else the first
    `shared/data` in `roots` (default, in a checkout: beside it, i.e. ../shared/data, or above it; an installed package:
    none), else the sample shipped with the package."""
    if os.environ.get("ADAFUSE_DATA"):
        return Path(os.environ["ADAFUSE_DATA"])
    if roots is None:  # a checkout looks beside and above itself; an installed package has only its sample
        roots = (ROOT.parent, *ROOT.parent.parents, Path("/work")) if (ROOT / "pyproject.toml").is_file() else ()
    for base in roots:
        if (base / "shared" / "data").is_dir():
            return base / "shared" / "data"
    return SAMPLE_DATA

# How every data file's lines are split, so that nothing is tuned on what it is scored on: the report's evaluations read
# the first lines, validation (gate checkpoints, re-checking a shipped gate) the next ones, training the rest.
REPORT_LINES = (1, 50)
VALIDATION_LINES = (51, 100)
TRAIN_OFFSET = 101


def parse_lines(text: str) -> tuple[int, int]:
    """A range of data-file line numbers, "51-100" (1-based, both ends included) → (51, 100)."""
    lo, sep, hi = str(text).strip().partition("-")
    try:
        first, last = int(lo), int(hi if sep else lo)
    except ValueError:
        first, last = 0, -1
    if first < 1 or last < first:
        raise ConfigError(f"lines {text!r}: give FIRST-LAST with 1 <= FIRST <= LAST, e.g. 51-100 (the validation "
                          "lines)")
    return first, last


def format_lines(lines: tuple[int, int]) -> str:
    """(51, 100) → "51-100", the spelling `parse_lines` reads."""
    return f"{lines[0]}-{lines[1]}"


class DataError(AdafuseError, ValueError):
    """A data file is missing, unreadable or has a bad line."""


def data_source(folder: Path | None = None) -> str:
    """Which data `folder` (default: `data_dir()`) is, for a status line: "sample: ..." (the package's sample),
    "full: FOLDER", or "missing: FOLDER"."""
    folder = Path(folder or data_dir())
    if folder.resolve() == SAMPLE_DATA.resolve():
        return SAMPLE_NOTE
    return f"{'full' if folder.is_dir() else 'missing'}: {folder}"


@dataclass(frozen=True)
class Task:
    name: str
    folder: str
    file: str
    prompt_file: str
    template: str              # appended to the few-shot prompt; {q} is the question
    stop: tuple[str, ...]
    max_new_words: int
    metric: str                # "em" | "em_f1" | "number" | "translation"

    @property
    def max_new_tokens(self) -> int:
        """The token cap of an evaluation: four tokens a word of the word cap."""
        return 4 * self.max_new_words

    def prompt(self, head: str, question: str) -> str:
        return head.rstrip("\n") + self.template.format(q=question)

    def extract(self, output: str) -> str:
        """The answer part of an output: cut at the next question block and similar continuations."""
        text = output
        for marker in ("\n\nQuestion", "\nQuestion:", "Question:", "\n\n"):
            i = text.find(marker)
            if i > 0 or (i == 0 and marker != "\n\n"):
                text = text[:i]
        if self.metric != "number":
            text = text.strip().split("\n")[0]
        return text.strip()

    def score(self, prediction: str, gold) -> dict[str, float]:
        golds = gold if isinstance(gold, list) else [gold]
        if self.metric == "em":
            return {"em": metrics.exact_match(prediction, golds)}
        if self.metric == "em_f1":
            return {"em": metrics.exact_match(prediction, golds), "f1": metrics.f1(prediction, golds)}
        if self.metric == "number":
            return {"acc": metrics.number_match(prediction, golds[0])}
        return metrics.sentence_scores(prediction, golds[0])

    @property
    def main_metric(self) -> str:
        return {"em": "em", "em_f1": "f1", "number": "acc", "translation": "chrf"}[self.metric]


TASKS = {
    "nq": Task("nq", "nq", "dev.jsonl", "prompt.txt", "\n\nQuestion: {q}\nAnswer:", ("\n",), 32, "em"),
    "triviaqa": Task("triviaqa", "triviaqa", "dev.jsonl", "prompt.txt", "\n\nQuestion: {q}\nAnswer:", ("\n",), 32, "em"),
    # the SQuAD prompt file puts question and answer on their own lines; we follow it
    "squad": Task("squad", "squad", "dev1250.jsonl", "prompt.txt", "\n\nQuestion:\n{q}\nAnswer:\n", ("\n",), 32, "em_f1"),
    "gsm8k": Task("gsm8k", "gsm8k", "test300.jsonl", "prompt.txt", "\n\nQuestion: {q}\nLet's think step by step\n",
                  ("\n\nQuestion:",), 200, "number"),
    "flores-de-en": Task("flores-de-en", "flores", "deu2en500.jsonl", "deu2en_prompt.txt", "\n\nGerman: {q}\nEnglish:",
                         ("\n",), 96, "translation"),
    "flores-en-de": Task("flores-en-de", "flores", "en2deu500.jsonl", "en2deu_prompt.txt", "\n\nEnglish: {q}\nGerman:",
                         ("\n",), 96, "translation"),
}


def read_examples(path: Path, limit: int | None, on_bad_line: str = "skip", warn=print,
                  lines: tuple[int, int] | None = None) -> list[tuple[int, dict]]:
    """(line number, example) pairs; bad lines are reported with their number and skipped or stop the run. `lines`
    keeps only that range of line numbers (both ends included; `limit` then counts within it)."""
    try:
        text = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        root, env = path.parent.parent, os.environ.get("ADAFUSE_DATA")
        if env and root == Path(env) and not root.is_dir():
            raise DataError(f"ADAFUSE_DATA={env} is not a folder: point it at one holding nq/, triviaqa/, squad/, "
                            "gsm8k/, flores/, or unset it to read ../shared/data (else the sample shipped "
                            "with the package)") from exc
        raise DataError(f"cannot read {path}: {exc}; pass --data pointing at the folder that holds "
                        f"{path.parent.name}/") from exc
    first, last = lines or (1, None)
    out = []
    for no, line in enumerate(text, 1):
        if no < first or not line.strip():
            continue
        if last is not None and no > last:
            break
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "question" not in row or "answer" not in row:
                raise ValueError("needs the fields 'question' and 'answer'")
        except ValueError as exc:
            msg = f"{path.name} line {no}: {exc}"
            if on_bad_line == "stop":
                raise DataError(msg + " (rerun with --on-bad-line skip to skip such lines)") from exc
            warn(f"skipping {msg}")
            continue
        out.append((no, row))
        if limit is not None and len(out) >= limit:
            break
    sample = f" ({SAMPLE_NOTE})" if path.resolve().is_relative_to(SAMPLE_DATA.resolve()) else ""
    if limit is not None and len(out) < limit:
        where = f" in lines {format_lines(lines)}" if lines else ""
        warn(f"{path.name} holds {len(out)} usable examples{where}, fewer than --limit {limit}: using "
             f"{len(out)}{sample}")
    elif lines and limit is None and len(out) < last - first + 1:
        warn(f"{path.name} holds {len(out)} usable examples in lines {format_lines(lines)}: using {len(out)}{sample}")
    return out
