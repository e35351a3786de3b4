"""This project's benchmark tasks as lm-evaluation-harness tasks: the YAML files beside this module and their hooks.

Each YAML is written from `tasks.TASKS` by `task_yaml` (python -m adafuse.harness.lm_eval_tasks rewrites them; a test
checks they agree), so lm-eval runs a task as `python -m adafuse eval` does: the same data lines (read by
`read_examples`, from the same folder: $ADAFUSE_DATA, else ../shared/data, else the sample shipped with the package; lm-eval's
`--metadata '{"data": "DIR"}'` picks another), the same prompt (few-shot prompt file + template), stop strings, word
cap, answer extraction and metrics (`Task.extract`, `Task.score`; corpus BLEU/chrF for Flores). Nothing here imports
lm_eval: the YAMLs reach these functions through `!function`.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..metrics import corpus_scores
from ..tasks import TASKS, data_dir, read_examples
from .scored import SCORED

HERE = Path(__file__).resolve().parent
PREFIX = "adafuse_"  # lm-eval task names: adafuse_nq, adafuse_triviaqa, ..., adafuse_flores_de_en
TAG = "adafuse"      # `--tasks adafuse` runs them all
HOOKS = __name__     # where the YAMLs' !function hooks live


def task_name(name: str) -> str:
    """The lm-eval name of a task of TASKS: "flores-de-en" -> "adafuse_flores_de_en"."""
    return PREFIX + name.replace("-", "_")


def load_docs(adafuse_task: str, data: str | None = None, **_metadata):
    """lm-eval's `custom_dataset`: the task's examples as one "test" split, each doc holding its data line, the prompt
    `adafuse eval` sends, the gold answer (as JSON: a list of aliases or one string) and the task's word cap. `data`
    (lm-eval's --metadata) is the data folder; the other metadata lm-eval passes (version, model args) is unused."""
    import datasets
    t = TASKS[adafuse_task]
    folder = Path(data) if data else data_dir()
    head = (folder / t.folder / t.prompt_file).read_text(encoding="utf-8")
    docs = [{"adafuse_task": adafuse_task, "line": no, "question": ex["question"],
             "prompt": t.prompt(head, ex["question"]), "gold": json.dumps(ex["answer"], ensure_ascii=False),
             "target": ex["answer"][0] if isinstance(ex["answer"], list) else str(ex["answer"]),
             "max_new_words": t.max_new_words}
            for no, ex in read_examples(folder / t.folder / t.file, None)]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def process_results(doc: dict, results: list[str]) -> dict:
    """Score one generation as `adafuse eval` does: extract the answer, then the task's per-example scores (Flores: the
    (prediction, reference) pair, for the corpus BLEU/chrF of `corpus_bleu` / `corpus_chrf`)."""
    t = TASKS[doc["adafuse_task"]]
    pred, gold = t.extract(results[0]), json.loads(doc["gold"])
    if t.metric == "translation":
        ref = gold if isinstance(gold, str) else gold[0]
        return {"bleu": (pred, ref), "chrf": (pred, ref)}
    return t.score(pred, gold)


def _corpus(items: list[tuple[str, str]], metric: str) -> float:
    preds, refs = zip(*items)
    return corpus_scores(list(preds), list(refs))[metric]


def corpus_bleu(items: list[tuple[str, str]]) -> float:
    return _corpus(items, "bleu")


def corpus_chrf(items: list[tuple[str, str]]) -> float:
    return _corpus(items, "chrf")


def _metrics(metric: str) -> list[str]:
    if metric == "translation":
        return [f"  - metric: {m}\n    aggregation: !function {HOOKS}.corpus_{m}\n    higher_is_better: true"
                for m in ("bleu", "chrf")]
    names = {"em": ["em"], "em_f1": ["em", "f1"], "number": ["acc"]}[metric]
    return [f"  - metric: {m}\n    aggregation: mean\n    higher_is_better: true" for m in names]


def task_yaml(name: str) -> str:
    """The lm-eval YAML of TASKS[name]."""
    t = TASKS[name]
    return "\n".join([
        "# Written by `python -m adafuse.harness.lm_eval_tasks` from adafuse/harness/tasks.py: edit TASKS there.",
        f"# `python -m adafuse eval --task {name}` as an lm-eval task: the lines of {t.folder}/{t.file} in the data",
        "# folder ($ADAFUSE_DATA, else ../shared/data, else the package's sample; or --metadata '{\"data\": \"DIR\"}'), the",
        f"# prompt {t.folder}/{t.prompt_file} + the task's template, its stop strings, word cap and metrics.",
        f"task: {task_name(name)}",
        f"tag: {TAG}",
        # custom_dataset reads the JSON lines itself (adafuse's line numbers and bad-line rule): not a Hub dataset
        "dataset_path: json",
        f"custom_dataset: !function {HOOKS}.load_docs",
        "dataset_kwargs:",
        f"  adafuse_task: {name}",
        "test_split: test",
        "output_type: generate_until",
        "doc_to_text: prompt",
        "doc_to_target: target",
        f"process_results: !function {HOOKS}.process_results",
        "generation_kwargs:",
        f"  until: {json.dumps(list(t.stop))}",
        # adafuse eval's token cap; the word cap comes with each doc (max_new_words), which the adafuse model reads
        f"  max_gen_toks: {t.max_new_tokens}",
        "  do_sample: false",
        "  temperature: 0.0",
        "metric_list:",
        *_metrics(t.metric),
        "metadata:",
        "  version: 1.0",
        "",
    ])


def write_yamls(out: Path = HERE) -> list[Path]:
    """One <lm-eval task name>.yaml per task of TASKS in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in TASKS:
        path = out / f"{task_name(name)}.yaml"
        path.write_text(task_yaml(name), encoding="utf-8")
        paths.append(path)
    for name, text in SCORED.items():  # the scored tasks (multiple choice, perplexity): scored.py
        path = out / f"{name}.yaml"
        path.write_text(text(), encoding="utf-8")
        paths.append(path)
    return paths
