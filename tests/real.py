"""Helpers for the tests on the real bundled pair: benchmark prompts, the checks every real trace passes, tolerances."""
import json
import os

import pytest

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from adafuse import Trace
from adafuse.models.session import LocalSession
from adafuse.harness.tasks import TASKS, data_dir, read_examples

SHARED = data_dir()  # $ADAFUSE_DATA, ../shared/data, or the package's sample

assert (SHARED / "nq" / "prompt.txt").exists(), f"benchmark data not found at {SHARED}: set ADAFUSE_DATA"


def qa_prompt(task: str, index: int = 0) -> str:
    prompt = (SHARED / task / "prompt.txt").read_text()
    row = json.loads((SHARED / task / "dev.jsonl").read_text().splitlines()[index])
    return f"{prompt}\n\nQuestion: {row['question']}\nAnswer:"


def gsm8k_prompt(index: int = 0, shots: int | None = None) -> str:
    """GSM8K's few-shot prompt (the first `shots` worked examples, all by default) and test question `index`."""
    prompt = (SHARED / "gsm8k" / "prompt.txt").read_text()
    if shots is not None:
        prompt = "\n\nQuestion:".join(prompt.split("\n\nQuestion:")[:shots])
    row = json.loads((SHARED / "gsm8k" / "test300.jsonl").read_text().splitlines()[index])
    return f"{prompt}\n\nQuestion: {row['question']}\nLet's think step by step\n"


def flores_prompt(index: int) -> str:
    task = TASKS["flores-de-en"]
    head = (SHARED / task.folder / task.prompt_file).read_text()
    return task.prompt(head, read_examples(SHARED / task.folder / task.file, index + 1)[index][1]["question"])


def check_trace(tr: Trace) -> None:
    assert tr.output.strip(), "empty output"
    assert tr.output == "".join(r.text for r in tr.rounds)
    assert Trace.from_dict(json.loads(tr.to_json())) == tr
    for r in tr.rounds:
        assert 0 <= r.chosen < len(r.candidates) and len(r.steps) == len(tr.models)
        if len(r.candidates) > 1:
            fused = [c.fused for c in r.candidates]
            assert r.winner == fused.index(min(fused))


def tolerance(dtype: torch.dtype) -> float:
    """Largest log-prob difference two equivalent computations may show in this dtype (bf16 keeps 8 bits)."""
    return 1e-4 if dtype == torch.float32 else 0.1


def models_disagree(tr: Trace) -> bool:
    """Some round where the two models proposed different candidates."""
    return any(set(r.steps[0].proposals) != set(r.steps[1].proposals) for r in tr.rounds)


# Property tests on the real pair: texts built from pieces that stress tokenizers (CJK, emoji, URLs, whitespace runs)
PIECES = list("abcXYZ019 .,;:!?'-\n") + ["  ", "\n\n", "巴", "黎", "是", "法国", "🙂", "😀", "é", "ß", "ー", "https://x.io/a?b=1"]
TEXTS = st.lists(st.sampled_from(PIECES), min_size=1, max_size=25).map("".join)
RELAXED = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# Property tests that decode with the real models: a handful of examples on every run (a toy-pair twin checks the same
# property with many), today's count under the nightly profile: `HYPOTHESIS_PROFILE=nightly ./dev test -m models`.
# (The tokenizer-only properties keep RELAXED's 40 examples: they take under a second.)
NIGHTLY = os.environ.get("HYPOTHESIS_PROFILE") == "nightly"


def real_decodes(nightly: int, ci: int = 3):
    """Hypothesis settings of a property test that decodes on the real pair: `ci` examples, `nightly` at night."""
    return settings(RELAXED, max_examples=nightly if NIGHTLY else ci)


@pytest.fixture(scope="module")
def views(pair):
    """A view of each real model after the prompt "Text:" (import it into a test module to use it)."""
    return [LocalSession(lm, "Text:") for lm in pair]
