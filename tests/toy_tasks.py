"""A toy QA task on disk for the toy models: a data folder holding nq/ (few-shot prompt + one question per line) and
a pair of character-level toy models that disagree on the answer, so weights decide which answer wins."""
from __future__ import annotations

import json
import string
from pathlib import Path

from tests.toy import toy_model

CHARS = [c for c in string.printable if c not in "\r\x0b\x0c"]
VOCAB = CHARS + [" Paris", " London"]
PROMPT = "Question: Capital?\nAnswer: Rome"


def toy_qa_pair():
    """Model a prefers " Paris", model b (less sure) " London"; both end the answer with a newline. With equal
    weights a wins; b wins when it weighs some 10× more."""
    end = {"\n": 0.9}
    a = {"Answer:": {" Paris": 0.7, " London": 0.2}, " Paris": end, " London": end}
    b = {"Answer:": {" London": 0.5, " Paris": 0.3}, " Paris": end, " London": end}
    return toy_model("a", VOCAB, a), toy_model("b", VOCAB, b)


def toy_pair_for(texts: list[str]):
    """Character-level toy models whose vocabulary holds every character of `texts` (e.g. a task's real prompts): a
    answers " 42" then ends; b, less sure, would end at once. Their decodes of any such prompt are quick and
    deterministic."""
    vocab = sorted(set("".join(texts)) | set(CHARS)) + [" 42"]
    a = {"": {" 42": 0.6, "<eos>": 0.3}, " 42": {"<eos>": 0.9}}
    b = {"": {"<eos>": 0.5, " 42": 0.4}, " 42": {"<eos>": 0.9}}
    return toy_model("a", vocab, a, max_positions=16_384), toy_model("b", vocab, b, max_positions=16_384)


def toy_data(root: Path, golds: dict[tuple[int, int], str], lines: int = 110) -> Path:
    """root/nq/{prompt.txt, dev.jsonl}: `lines` questions, line numbers in a range (first, last) of `golds` answered
    by its city, the others "Paris". Returns root (the --data folder)."""
    folder = root / "nq"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prompt.txt").write_text(PROMPT)
    rows = []
    for no in range(1, lines + 1):
        gold = next((city for (lo, hi), city in golds.items() if lo <= no <= hi), "Paris")
        rows.append(json.dumps({"question": f"Capital {no}?", "answer": [gold]}))
    (folder / "dev.jsonl").write_text("\n".join(rows) + "\n")
    return root


class ToyRegistry:
    """What `evaluate` asks of a registry: models by name."""

    def __init__(self, *models):
        self.models = {m.name: m for m in models}
        self.asked: list[str] = []

    def get(self, name, **_):
        self.asked.append(name)
        return self.models[name]
