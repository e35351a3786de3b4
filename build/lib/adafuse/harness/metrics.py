"""Task metrics: normalized exact match / F1 (QA), final-number accuracy (GSM8K), BLEU / chrF (translation)."""
from __future__ import annotations

import collections
import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(pred: str, golds: list[str]) -> float:
    p = normalize_answer(pred)
    return float(any(p == normalize_answer(g) for g in golds))


def f1(pred: str, golds: list[str]) -> float:
    def one(g: str) -> float:
        pt, gt = normalize_answer(pred).split(), normalize_answer(g).split()
        common = collections.Counter(pt) & collections.Counter(gt)
        same = sum(common.values())
        if not pt or not gt:
            return float(pt == gt)
        if same == 0:
            return 0.0
        precision, recall = same / len(pt), same / len(gt)
        return 2 * precision * recall / (precision + recall)
    return max((one(g) for g in golds), default=0.0)


def final_number(text: str) -> float | None:
    """The answer number of a worked solution: the last \\boxed{...}, else the last number in the text."""
    boxed = _BOXED.findall(text)
    candidates = _NUMBER.findall(boxed[-1]) if boxed else []
    if not candidates:
        candidates = _NUMBER.findall(text)
    if not candidates:
        return None
    try:
        return float(candidates[-1].replace(",", "").rstrip("."))
    except ValueError:
        return None


def number_match(pred: str, gold: str) -> float:
    p, g = final_number(pred), final_number(gold)
    return float(p is not None and g is not None and abs(p - g) < 1e-6)


def sentence_scores(pred: str, ref: str) -> dict[str, float]:
    import sacrebleu
    return {"bleu": sacrebleu.sentence_bleu(pred, [ref]).score, "chrf": sacrebleu.sentence_chrf(pred, [ref]).score}


def corpus_scores(preds: list[str], refs: list[str]) -> dict[str, float]:
    import sacrebleu
    return {"bleu": sacrebleu.corpus_bleu(preds, [refs]).score, "chrf": sacrebleu.corpus_chrf(preds, [refs]).score}
