"""The app on toy models: `python -m tests.toy_app` serves app.py as it is (same flags, same environment variables),
with its model registry loading character-level toy LMs under the bundled pair's names. The browser tests of what the
page does run on it: its decodes take about a second, each forward a fixed TOY_FORWARD_SECONDS and each load
TOY_LOAD_SECONDS, so a page can watch rounds arrive, cancel between them and see a model load.

The toys write like the bundled pair, only predictably: a question ("…Answer:") gets a short answer, uncertain first
(the two models prefer different ones: an exploring round with candidates from both), then a line end; a chat prompt
gets sentences that never end before Max new words; a German → English line is where the end of the answer wins
round 0 for one model and not the other (an empty answer, and the app's advice: weigh the other model more).
SmolLM2's toy has a chat template, Gemma's has none (as the bundled ones): it reads a chat as a User/Assistant
transcript."""
from __future__ import annotations

import os
import runpy
import string
import sys
import time
from pathlib import Path

from adafuse import DEFAULT_PAIR
from adafuse.harness.tasks import SAMPLE_DATA
from adafuse.errors import ModelNotFoundError
from tests.toy import toy_model

ROOT = Path(__file__).resolve().parents[1]
FORWARD_SECONDS = float(os.environ.get("TOY_FORWARD_SECONDS", "0.05"))
LOAD_SECONDS = float(os.environ.get("TOY_LOAD_SECONDS", "1.5"))
CHAT = "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"

WORDS = [" Mount", " Everest", " William", " Shakespeare", " Paris", " The", " weather", " is", " nice", " today",
         " Use", " Red", " fresh", " water", " and", " warm", " the", " pot", " cup", " first", " looks", " bright"]


def vocabulary() -> list[str]:
    """Every character the app's examples, the task data and a person's typing use, and the toys' words."""
    chars = set(string.printable) - set("\r\x0b\x0c")
    chars |= {chr(c) for c in range(0xA0, 0x180)} | {chr(c) for c in range(0x2000, 0x2070)}
    for path in [ROOT / "assets" / "examples.json", *sorted(SAMPLE_DATA.rglob("*"))]:
        if path.is_file() and path.suffix in (".json", ".jsonl", ".txt"):
            chars |= set(path.read_text(encoding="utf-8"))
    return sorted(chars) + list(dict.fromkeys(WORDS))


def _chain(*words: str, p: float = 0.9) -> dict:
    """Each word followed by the next with probability p."""
    return {a: {b: p} for a, b in zip(words, words[1:])}


END = {"\n": 0.9}
SENTENCES = {**_chain(" Use", " fresh", " water", " and", " warm", " the"), **_chain(" Red", " looks", " bright"),
             " pot": {".": 0.9}, " cup": {".": 0.9}, "pot.": {" Use": 0.6, " Red": 0.3},
             "cup.": {" Red": 0.6, " Use": 0.3}, " bright": {" and": 0.9}}
ANSWERS = {**_chain(" Mount", " Everest"), **_chain(" William", " Shakespeare"), " Everest": {".": 0.9},
           " Shakespeare": {".": 0.9}, " Paris": {".": 0.9}, "Everest.": END, "Shakespeare.": END, "Paris.": END,
           **_chain(" The", " weather", " is", " nice", " today"), " today": {".": 0.9}, "today.": END}
OTHER = {"": {"<eos>": 0.6, ".": 0.3}}  # any other context: the answer ends
RULES = {
    DEFAULT_PAIR[0]: {**OTHER, **SENTENCES, **ANSWERS, " the": {" pot": 0.55, " cup": 0.4},
                      "Answer:": {" Mount": 0.5, " William": 0.4, " Paris": 0.02}, "English:": {"\n": 0.9},
                      "assistant\n": {" Use": 0.5, " Red": 0.4}},
    DEFAULT_PAIR[1]: {**OTHER, **SENTENCES, **ANSWERS, " the": {" cup": 0.55, " pot": 0.4},
                      "Answer:": {" William": 0.55, " Mount": 0.35, " Paris": 0.02}, "English:": {" The": 0.45, "\n": 0.35},
                      "each.\nAssistant:": {" Red": 0.5, " Use": 0.4},  # a chat: the transcript's turn
                      "tea.\nAssistant:": {" Use": 0.5, " Red": 0.4}},
}


def load_toy(name: str, device=None, dtype=None, trust_remote_code: bool = False):
    """The registry's loader here: the toy under a bundled name, after TOY_LOAD_SECONDS."""
    if name not in RULES:
        raise ModelNotFoundError(f"{name!r}: the toy app knows only {', '.join(RULES)}")
    time.sleep(LOAD_SECONDS)
    chat = CHAT if name == DEFAULT_PAIR[0] else None
    return toy_model(name, VOCAB, RULES[name], chat=chat, embedded=True, delay=FORWARD_SECONDS, max_positions=32_768)


VOCAB = vocabulary()

if __name__ == "__main__":
    from app.controller import MODELS
    MODELS.loader = load_toy
    sys.argv = ["app.py", *sys.argv[1:]]
    runpy.run_path(str(ROOT / "app.py"), run_name="__main__")
