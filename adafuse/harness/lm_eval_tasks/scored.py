"""Scored lm-eval tasks made from this project's data, for the ensemble as a scorer (loglikelihood and
loglikelihood_rolling) on a machine with no multiple-choice or perplexity data sets: TriviaQA questions as 4-way
multiple choice (`adafuse_triviaqa_mc`: acc, acc_norm) and Flores English sentences as a perplexity task
(`adafuse_flores_en_ppl`: word and byte perplexity, bits per byte). On a machine with network lm-eval's own
(`--tasks arc_easy,hellaswag,wikitext`) run the same way.
"""
from __future__ import annotations

import random
from pathlib import Path

from ..tasks import TASKS, data_dir, read_examples

HOOKS = __name__
CHOICES = 4  # the gold answer and 3 other questions' answers
SEED = 0     # draws each question's distractors and their order (with the question's line number)


def _folder(data: str | None) -> Path:
    return Path(data) if data else data_dir()


def load_choice_docs(adafuse_task: str, data: str | None = None, **_metadata):
    """lm-eval's `custom_dataset`: each question of a QA task with its gold answer (the first alias) among CHOICES - 1
    other questions' gold answers — drawn with SEED and the question's line, never one spelled like an alias of its
    own gold — in a seeded order; `gold` is the gold's index, `prompt` what `adafuse eval` sends."""
    import datasets
    t = TASKS[adafuse_task]
    folder = _folder(data)
    head = (folder / t.folder / t.prompt_file).read_text(encoding="utf-8")
    examples = list(read_examples(folder / t.folder / t.file, None))
    golds = [ex["answer"][0] if isinstance(ex["answer"], list) else str(ex["answer"]) for _, ex in examples]
    docs = []
    for i, (no, ex) in enumerate(examples):
        aliases = {a.strip().lower() for a in (ex["answer"] if isinstance(ex["answer"], list) else [ex["answer"]])}
        rng = random.Random(f"{SEED}:{no}")
        others = sorted({g for g in golds if g.strip().lower() not in aliases})
        choices = [golds[i], *rng.sample(others, CHOICES - 1)]
        rng.shuffle(choices)
        docs.append({"adafuse_task": adafuse_task, "line": no, "question": ex["question"],
                     "prompt": t.prompt(head, ex["question"]), "choices": choices, "gold": choices.index(golds[i])})
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def load_text_docs(adafuse_task: str, data: str | None = None, **_metadata):
    """lm-eval's `custom_dataset`: the source sentences of a translation task as documents to score whole."""
    import datasets
    t = TASKS[adafuse_task]
    docs = [{"adafuse_task": adafuse_task, "line": no, "text": ex["question"]}
            for no, ex in read_examples(_folder(data) / t.folder / t.file, None)]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def _head(name: str, what: str, source: str) -> list[str]:
    t = TASKS[source]
    return [
        "# Written by `python -m adafuse.harness.lm_eval_tasks` from adafuse/harness/lm_eval_tasks/scored.py.",
        f"# {what},",
        f"# from the lines of {t.folder}/{t.file} in the data folder ($ADAFUSE_DATA, else ../shared/data, else the",
        "# package's sample; or --metadata '{\"data\": \"DIR\"}').",
        f"task: {name}",
        "tag: adafuse_scored",
        "dataset_path: json",
    ]


def choice_yaml(name: str, source: str) -> str:
    """A multiple-choice task from QA task `source` (acc, acc_norm: lm-eval's own)."""
    return "\n".join([
        *_head(name, f"`{source}` as {CHOICES}-way multiple choice (the gold answer among other questions' answers)",
               source),
        f"custom_dataset: !function {HOOKS}.load_choice_docs",
        "dataset_kwargs:",
        f"  adafuse_task: {source}",
        "test_split: test",
        "output_type: multiple_choice",
        "doc_to_text: prompt",
        "doc_to_choice: choices",
        "doc_to_target: gold",
        "metric_list:",
        "  - metric: acc",
        "    aggregation: mean",
        "    higher_is_better: true",
        "  - metric: acc_norm",
        "    aggregation: mean",
        "    higher_is_better: true",
        "metadata:",
        "  version: 1.0",
        "",
    ])


def perplexity_yaml(name: str, source: str) -> str:
    """A perplexity task over the source sentences of translation task `source` (lm-eval's rolling metrics)."""
    return "\n".join([
        *_head(name, f"the source sentences of `{source}` scored whole (perplexity)", source),
        f"custom_dataset: !function {HOOKS}.load_text_docs",
        "dataset_kwargs:",
        f"  adafuse_task: {source}",
        "test_split: test",
        "output_type: loglikelihood_rolling",
        'doc_to_text: ""',
        "doc_to_target: text",
        "metric_list:",
        *[f"  - metric: {m}" for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")],  # lm-eval's own
        "metadata:",
        "  version: 1.0",
        "",
    ])


SCORED = {"adafuse_triviaqa_mc": lambda: choice_yaml("adafuse_triviaqa_mc", "triviaqa"),
          "adafuse_flores_en_ppl": lambda: perplexity_yaml("adafuse_flores_en_ppl", "flores-en-de")}

