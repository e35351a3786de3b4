"""lm-evaluation-harness model `adafuse`: the fused ensemble behind lm-eval's LM interface (generate_until, and
loglikelihood and loglikelihood_rolling through the ensemble as a scorer, adafuse/scorer.py).

lm_eval 0.4.13 finds models only in its own registry (no entry-point plug-ins), so this module registers `adafuse`
when imported and `python -m adafuse lm-eval ARGS` (= `python -m adafuse.harness.lm_eval_model ARGS`) imports it, then
runs lm-eval's own command line with ARGS:

    python -m adafuse lm-eval run --model adafuse \
        --model_args models=MODEL_A+MODEL_B,tau=0.7,max_words=3,branches=3 \
        --include_path adafuse/harness/lm_eval_tasks --tasks adafuse_triviaqa --limit 20

lm-eval splits --model_args on commas, so the members are joined with "+" (weights with "/", as `adafuse eval`).
`max_length=N` is every member's window when scoring (as lm-eval's `hf` model takes it: rolling windows and the
left-truncation of loglikelihood requests; generate_until's decodes keep each member's own window).

`is_greedy`, the second value of each loglikelihood answer: with one member, every continuation token its argmax (as
`hf`); with several, whether the fused decode of the context writes the continuation — a decode per context, which
acc and acc_norm never use. lm-eval hands a model its requests, not the metrics that will read them, and its
multiple-choice scoring reads the gold answer's is_greedy on every question (for exact_match) whether or not the task
reports exact_match, so a value decoded on first read would still decode every question. What the model sees is the
requests' shape, and `is_greedy=` in model_args decides (`decoded_contexts`): `auto` (default) decodes the contexts of
documents that ask one continuation (a loglikelihood task: lambada's acc is its is_greedy) and not those of documents
that ask several (multiple choice: their is_greedy is False; exact_match needs `is_greedy=true`); `true` decodes
every context, `false` none.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import replace
from pathlib import Path
from typing import Iterator, Sequence

import lm_eval.models  # noqa: F401 (lm-eval's own models: its registry imports them only while it is empty)
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from ..config import DecodeConfig
from .evaluate import setting_value
from ..ensemble import AdaFuse
from ..errors import ConfigError
from ..many import DEFAULT_CONCURRENCY, check_concurrency, run_many
from ..models import DEFAULT_PAIR, LoadedModel, ModelRegistry
from ..scorer import Scorer

NAME = "adafuse"
SEPARATOR = "+"  # between members in models=...: lm-eval splits model_args on commas


def _settings(args: dict) -> dict:
    """model_args (values already typed by lm-eval) as DecodeConfig fields; weights as "1/4" like `adafuse eval`."""
    where = (f"--model_args of --model {NAME} (models=A{SEPARATOR}B, concurrency, device, max_length, is_greedy, "
             "trust_remote_code or a decoding setting: tau, max_words, branches, weights=1/4, gate, method, normalize, "
             "allow_empty, speculate, ...)")
    if "stop" in args:
        raise ConfigError(f"stop in --model_args of --model {NAME}: the stop strings come from the task (its until)")
    return {key: setting_value(key, value, where) for key, value in args.items()}


def _device(device: str | None) -> str | None:
    """lm-eval's --device for every member (MODEL@DEVICE in models= places one). Its run command sends "cuda:0" when
    none is given: on a machine without CUDA that is the library's default (None) instead."""
    import torch
    if device and str(device).startswith("cuda") and not torch.cuda.is_available():
        return None
    return device


def _is_greedy(value) -> bool | str:
    if isinstance(value, bool) or value == "auto":
        return value
    raise ConfigError(f"is_greedy={value!r} in --model_args of --model {NAME}: give auto (decode the documents that "
                      "ask one continuation), true (every context) or false (none)")


def _max_length(value) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"max_length={value!r} in --model_args of --model {NAME}: give a whole number of tokens "
                          "(every member's window when scoring), or leave it out for each member's own")
    return value


class Windowed(AdaFuse):
    """The ensemble whose scorer takes `max_length` as every member's window (lm-eval's max_length model argument;
    None: each member's own)."""

    def __init__(self, models, config: DecodeConfig, max_length: int | None):
        super().__init__(models, config)
        self.max_length = max_length

    def scorer(self) -> Scorer:
        scorer = super().scorer()
        scorer.max_length = self.max_length
        return scorer


@register_model(NAME)
class AdaFuseLM(LM):
    """generate_until through the fused decode: each request's `until` strings are its stop strings, its
    `max_gen_toks` the token cap (as `--max-new-tokens` counts: the most tokens any member writes), a doc's
    `max_new_words` (this project's tasks carry `adafuse eval`'s word cap) the word cap; requests decode `concurrency`
    at a time with their forwards shared (adafuse/many.py)."""

    def __init__(self, models: str | Sequence[LoadedModel | str] | None = None,
                 concurrency: int = DEFAULT_CONCURRENCY, device: str | None = None, trust_remote_code: bool = False,
                 batch_size=None, max_batch_size=None, max_length: int | None = None, is_greedy: bool | str = "auto",
                 **settings):
        """`models`: "A+B" (lm-eval's model_args) or, from Python, a list of names or loaded models; default the
        bundled pair. lm-eval's batch_size / max_batch_size are unused: `concurrency` decodes run at once.
        `max_length`: every member's window when scoring (as `hf` takes it); default each member's own. `is_greedy`:
        which contexts a fused decode says is_greedy for, with several members (auto, true, false: the module's
        docstring)."""
        super().__init__()
        self.max_length, self.is_greedy = _max_length(max_length), _is_greedy(is_greedy)
        if isinstance(models, str):
            models = [n.strip() for n in models.split(SEPARATOR)]
        names = list(models or DEFAULT_PAIR)
        self.config = DecodeConfig.of(**_settings(settings))  # checked before any model loads
        self.config.check_models(len(names))
        self.concurrency = check_concurrency(concurrency)
        device = _device(device)
        registry = ModelRegistry()  # this model's members
        self.models = [registry.get(n, device=device, trust_remote_code=trust_remote_code) if isinstance(n, str) else n
                       for n in names]

    def request_config(self, gen_kwargs: dict, doc: dict | None) -> DecodeConfig:
        """The decode settings of one generate_until request."""
        kw = dict(gen_kwargs or {})
        until = kw.pop("until", None) or ()
        stop = (until,) if isinstance(until, str) else tuple(until)
        cap = int(kw.pop("max_gen_toks", self.config.max_new_tokens))
        words = (doc or {}).get("max_new_words") or min(cap, 100_000)  # no word cap of its own: the tokens decide
        return replace(self.config, stop=stop, max_new_tokens=cap, max_new_words=int(words))

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        jobs = [functools.partial(AdaFuse(self.models, self.request_config(r.args[1], r.doc)).generate, r.args[0])
                for r in requests]
        out = []
        for req, trace in zip(requests, self._run(jobs, "adafuse", disable_tqdm)):
            out.append(trace.output)
            self.cache_hook.add_partial("generate_until", req.args, trace.output)
        return out

    def _run(self, jobs: list, desc: str, disable: bool, sizes: list[int] | None = None) -> Iterator:
        """Each job's result in the jobs' order, `concurrency` jobs at a time (adafuse/many.py), behind one progress bar
        that counts `sizes` (the requests each job answers; default one each) as each result is taken."""
        from tqdm import tqdm
        sizes = sizes or [1] * len(jobs)
        with tqdm(total=sum(sizes), desc=desc, disable=disable) as bar:
            for size, result in zip(sizes, run_many(jobs, self.concurrency)):
                yield result
                bar.update(size)

    def decoded_contexts(self, requests) -> set[str]:
        """The contexts whose fused decode says which continuations are greedy: none with one member (its argmax says)
        or is_greedy=false, all with true; with auto, those of documents asking one continuation (and of requests that
        name no document), not those of documents asking several (multiple choice)."""
        if len(self.models) == 1 or self.is_greedy is False:
            return set()
        asked: dict[tuple, set] = {}
        for r in requests:
            asked.setdefault((r.task_name, r.doc_id), set()).add(r.idx)
        return {r.args[0] for r in requests
                if self.is_greedy is True or r.doc_id is None or len(asked[r.task_name, r.doc_id]) == 1}

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """Each (context, continuation): the fused log-likelihood — the weighted mean of the members' log-probabilities
        of the continuation, each in its own tokens with the boundary where lm-eval's `hf` model puts it
        (adafuse/scorer.py) — and whether it is greedy: with one member, every token its argmax (as `hf`); with
        several, whether the fused decode of the context writes it, for the `decoded_contexts` (False for the others).
        Continuations of one context are scored together, `concurrency` contexts at a time."""
        ensemble = Windowed(self.models, self.config, self.max_length)
        contexts: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            contexts.setdefault(r.args[0], []).append(i)
        several, decoded = len(self.models) > 1, self.decoded_contexts(requests)
        jobs = [functools.partial(ensemble.score, ctx, [requests[i].args[1] for i in idx], ctx in decoded)
                for ctx, idx in contexts.items()]
        out: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        sizes = [len(idx) for idx in contexts.values()]
        for idx, scored in zip(contexts.values(), self._run(jobs, "adafuse loglikelihood", disable_tqdm, sizes)):
            for i, s in zip(idx, scored):
                out[i] = (s.fused, bool(s.is_greedy if several else all(s.greedy.values())))
                self.cache_hook.add_partial("loglikelihood", requests[i].args, out[i])
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each whole text's fused log-likelihood from its start (each member over its own tokens, in windows of its
        context size, or `max_length`, as lm-eval's `hf` model rolls them); lm-eval turns them into word and byte
        perplexity and bits per byte."""
        ensemble = Windowed(self.models, self.config, self.max_length)
        jobs = [functools.partial(ensemble.score_rolling, r.args[0]) for r in requests]
        out = []
        for r, scored in zip(requests, self._run(jobs, "adafuse loglikelihood_rolling", disable_tqdm)):
            out.append(scored.fused)
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, scored.fused)
        return out


def _option(args: list[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` in a command line (the last one), else None."""
    found = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith(name + "="):
            found = a.split("=", 1)[1]
    return found


def shipped_only(args: list[str]) -> bool:
    """Whether a command line's --tasks are all this project's shipped tasks, from their own folder (--include_path):
    then lm-eval need not index its own thousands of task files first (10 s on this CPU, for tasks it would not use)."""
    from .lm_eval_tasks import HERE
    tasks, include = _option(args, "--tasks"), _option(args, "--include_path")
    if not tasks or not include or Path(include).resolve() != HERE:
        return False
    shipped = {p.stem for p in HERE.glob("*.yaml")}
    return all(t.strip() in shipped for t in tasks.split(","))


def main(argv: list[str] | None = None) -> int:
    """lm-eval's command line with the `adafuse` model registered (this module is imported by now); when it names only
    the shipped tasks, their folder is the only one lm-eval reads."""
    import lm_eval.tasks
    from lm_eval.__main__ import cli_evaluate
    args = sys.argv[1:] if argv is None else argv
    manager = lm_eval.tasks.TaskManager
    if shipped_only(args):
        lm_eval.tasks.TaskManager = functools.partial(manager, include_defaults=False)
    sys.argv = ["lm-eval", *args]
    try:
        cli_evaluate()
    finally:
        lm_eval.tasks.TaskManager = manager
    return 0


if __name__ == "__main__":
    sys.exit(main())
