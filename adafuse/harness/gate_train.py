"""Per-model weights learned from answers alone: a static-weight search and the gate's policy-gradient training.

    python -m adafuse gate search --task flores-de-en flores-en-de --grid 1,1 1,3 1,9 --examples 8
    python -m adafuse gate train  --task nq triviaqa squad --steps 300 --init 1,4 --out assets/gates/qa.json

Both read training examples from line `--offset` on (default 101: the reported evaluations use the first 50 lines of
each file, so the two never meet). The reward is the task's metric of the final answer, scaled to [0, 1]: token F1 for
the QA tasks (EM is the reported metric; F1 is the same judgement with partial credit, a denser signal), chrF / 100
for translation, accuracy for GSM8K.

Training (REINFORCE): each step decodes one training example with the current gate; in every round whose pool was
scored with two or more candidates the choice is sampled from softmax(−gated score / temperature) instead of taking
the lowest, and the log-probability of each sampled choice is kept with its gradient. At the end the reward minus a
baseline scales the summed log-probabilities; Adam takes one step. The baseline is self-critical by default: the
reward of the same example decoded greedily with the same gate (decoded only when some sampled choice left the
winner; otherwise the sample is that decode and the step teaches nothing), so only choices that changed the answer
move the gate — a running mean per task instead mostly measures how hard the example was. Greedy at test time. A
checkpoint (`<out>.ckpt`) is written every `--save-every` steps and a rerun with the same arguments resumes from it;
the example order and every sample are seeded.
"""
from __future__ import annotations

import json
import math
import random
import sys
import time
from functools import lru_cache
from pathlib import Path

import torch

from ..config import DecodeConfig
from ..ensemble import AdaFuse
from ..scoring import fused_score
from ..errors import ConfigError
from ..gate import FEATURES, Gate, gate_weights, stack
from ..models import get_model
from .tasks import DEFAULT_DATA, TASKS, Task, read_examples

TRAIN_OFFSET = 101  # first line used for training; docs/results.md reports lines 1..50


def reward(task: Task, output: str, gold) -> float:
    pred = task.extract(output)
    scores = task.score(pred, gold)
    if task.metric == "translation":
        return scores["chrf"] / 100.0
    if task.metric == "number":
        return scores["acc"]
    from .metrics import f1
    return f1(pred, gold if isinstance(gold, list) else [gold])


def training_examples(tasks: list[str], data: Path, offset: int, per_task: int) -> list[tuple[str, int, dict]]:
    out = []
    for name in tasks:
        t = TASKS[name]
        rows = [(no, ex) for no, ex in read_examples(data / t.folder / t.file, None) if no >= offset][:per_task]
        if not rows:
            raise ConfigError(f"{t.file} has no examples from line {offset} on: lower --offset")
        out += [(name, no, ex) for no, ex in rows]
    return out


def task_config(task: Task, **settings) -> DecodeConfig:
    return DecodeConfig(stop=task.stop, max_new_words=task.max_new_words, max_new_tokens=4 * task.max_new_words,
                        **settings)


@lru_cache(maxsize=None)
def _head(path: Path) -> str:
    """A task's few-shot prompt, read once (every training step decodes with it, twice when self-critical)."""
    return path.read_text(encoding="utf-8")


def prompt_of(task: Task, data: Path, ex: dict) -> str:
    return task.prompt(_head(data / task.folder / task.prompt_file), ex["question"])


def decode_rewards(lms, exs: list[tuple[str, int, dict]], data: Path, **settings) -> dict[str, list[float]]:
    """Per task, the reward of each example decoded greedily with these settings (as at test time)."""
    per: dict[str, list[float]] = {}
    for name, _, ex in exs:
        task = TASKS[name]
        tr = AdaFuse(lms, task_config(task, **settings)).generate(prompt_of(task, data, ex))
        per.setdefault(name, []).append(reward(task, tr.output, ex["answer"]))
    return per


def search(models: list[str], tasks: list[str], grid: list[tuple[float, ...]], data: Path, offset: int,
           per_task: int, log=print, normalize: str = "token") -> dict:
    """Mean reward of each static weighting on the training examples; the best one first."""
    lms = [get_model(m) for m in models]
    exs = training_examples(tasks, data, offset, per_task)
    rows = []
    for w in grid:
        t0 = time.perf_counter()
        per = decode_rewards(lms, exs, data, weights=w, normalize=normalize)
        row = {"weights": list(w), "reward": sum(map(sum, per.values())) / len(exs),
               "per_task": {k: sum(v) / len(v) for k, v in per.items()}, "seconds": time.perf_counter() - t0}
        log(f"weights {w}: mean reward {row['reward']:.4f} over {len(exs)} examples ({row['seconds']:.0f}s)")
        rows.append(row)
    best = max(rows, key=lambda r: (r["reward"], -grid.index(tuple(r["weights"]))))
    return {"models": models, "tasks": tasks, "offset": offset, "examples": len(exs), "grid": rows,
            "best": best["weights"], "normalize": normalize}


def _gated_scores(r, names: list[str], W: torch.Tensor, b: torch.Tensor,
                  normalize: str = "token") -> tuple[torch.Tensor, list[int]] | None:
    """The round's candidates' gated scores with their gradient (candidates ranked last excluded), or None when the
    round offers no choice."""
    if not r.features or len(r.candidates) < 2:
        return None
    w = dict(zip(names, gate_weights(W, b, stack(names, r.features))))
    keep, scores = [], []
    for i, c in enumerate(r.candidates):
        score = fused_score(c, w, normalize) if c.fused is not None else None  # the decoder's score, with its gradient
        if score is None:
            continue
        keep.append(i)
        scores.append(score)
    if len(keep) < 2:
        return None
    return torch.stack(scores), keep


def train(models: list[str], tasks: list[str], out: Path, data: Path = DEFAULT_DATA, steps: int = 300,
          offset: int = TRAIN_OFFSET, per_task: int = 200, seed: int = 0, lr: float = 0.05,
          temperature: float = 0.5, save_every: int = 10, progress: bool = True, log=print,
          init: tuple[float, ...] = (), baseline: str = "self-critical", normalize: str = "token") -> Gate:
    lms = [get_model(m) for m in models]
    names = [lm.name for lm in lms]
    exs = training_examples(tasks, data, offset, per_task)
    n, f = len(names), len(FEATURES)
    W = torch.zeros(n, n * f, dtype=torch.float64, requires_grad=True)
    if init and (len(init) != n or not all(w > 0 for w in init)):
        raise ConfigError(f"--init {init}: give {n} positive weights, one per model")
    # start from static weights (b = log w: the gate's weights are then ∝ w whatever the features), else equal
    b = torch.tensor([math.log(w) for w in init] if init else [0.0] * n, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([W, b], lr=lr)
    state = {"step": 0, "baseline": {}, "curve": []}
    ckpt = out.with_name(out.name + ".ckpt")
    args = {"models": names, "tasks": tasks, "offset": offset, "per_task": per_task, "seed": seed, "lr": lr,
            "temperature": temperature, "init": list(init), "baseline": baseline,
            **({"normalize": normalize} if normalize != "token" else {})}
    if baseline not in ("self-critical", "running"):
        raise ConfigError(f"baseline {baseline!r}: use self-critical or running")
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        if saved["args"] != args:
            raise ConfigError(f"{ckpt} was written with other settings ({saved['args']}): delete it to start over")
        with torch.no_grad():
            W.copy_(saved["W"]), b.copy_(saved["b"])
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        log(f"resuming from {ckpt} at step {state['step']}")
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=steps, initial=state["step"], desc="gate", unit="step", file=sys.stderr)
    while state["step"] < steps:
        step = state["step"]
        epoch, k = divmod(step, len(exs))
        order = list(range(len(exs)))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        name, no, ex = exs[order[k]]
        task = TASKS[name]
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        gate = Gate(names, W.detach().tolist(), b.detach().tolist())
        d = AdaFuse(lms, task_config(task, normalize=normalize)).start(prompt_of(task, data, ex))
        d.gate_object = gate
        logps, deviations, choices = [], 0, 0
        while not d.done:
            r = d.propose()
            got = _gated_scores(r, names, W, b, normalize)
            if got is None:
                d.commit()
                continue
            scores, keep = got
            logp = torch.log_softmax(-scores / temperature, 0)
            j = int(torch.multinomial(logp.detach().exp(), 1, generator=gen))
            logps.append(logp[j])
            choices += 1
            deviations += keep[j] != r.winner
            d.commit(keep[j])
        R = reward(task, d.trace.output, ex["answer"])
        if baseline == "running":
            base = state["baseline"].get(name, R)
        elif deviations:  # self-critical: the same example decoded greedily with the same gate
            g = AdaFuse(lms, task_config(task, normalize=normalize)).start(prompt_of(task, data, ex))
            g.gate_object = gate
            while not g.done:
                g.commit()
            base = reward(task, g.trace.output, ex["answer"])
        else:  # every sampled choice was the winner: the sample is the greedy decode
            base = R
        if logps:
            opt.zero_grad()
            loss = -(R - base) * torch.stack(logps).sum()
            loss.backward()
            opt.step()
        state["baseline"][name] = 0.9 * state["baseline"].get(name, R) + 0.1 * R
        state["curve"].append({"step": step, "task": name, "line": no, "reward": R, "baseline": base,
                               "choices": choices, "sampled_off_winner": deviations})
        state["step"] = step + 1
        if bar:
            recent = state["curve"][-20:]
            bar.set_postfix(reward=f"{sum(c['reward'] for c in recent) / len(recent):.3f}")
            bar.update(1)
        if state["step"] % save_every == 0 or state["step"] == steps:
            torch.save({"args": args, "W": W.detach(), "b": b.detach(), "opt": opt.state_dict(), "state": state}, ckpt)
    if bar:
        bar.close()
    gate = Gate(names, W.detach().tolist(), b.detach().tolist(), trained={
        **args, "steps": steps, "examples": len(exs), "reward": "token F1 (QA), chrF/100 (translation), accuracy "
        "(GSM8K) of the final answer", "algorithm": "REINFORCE with a " + (
            "self-critical baseline (the example decoded greedily with the same gate)" if baseline == "self-critical"
            else "per-task running baseline") + ", Adam",
        "curve": state["curve"]})
    out.parent.mkdir(parents=True, exist_ok=True)
    gate.save(out)
    log(f"wrote {out} ({gate.parameters} parameters, {steps} steps over {len(exs)} examples)")
    return gate


def main(argv=None) -> int:
    import argparse
    from ..models import DEFAULT_PAIR
    p = argparse.ArgumentParser(prog="python -m adafuse gate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    for name in ("train", "search"):
        s = sub.add_parser(name)
        s.add_argument("--task", nargs="+", required=True, choices=list(TASKS), metavar="TASK")
        s.add_argument("--models", nargs="+", default=list(DEFAULT_PAIR), metavar="MODEL")
        s.add_argument("--data", type=Path, default=DEFAULT_DATA)
        s.add_argument("--offset", type=int, default=TRAIN_OFFSET, help="first data line used (reports use 1..50)")
        s.add_argument("--examples", type=int, default=200, help="training examples per task")
        s.add_argument("--normalize", choices=("token", "word"), default="token",
                       help="average each candidate's NLL over its tokens (the paper) or its words")
    t = sub.choices["train"]
    t.add_argument("--out", type=Path, required=True, help="the gate file to write (a checkpoint sits beside it)")
    t.add_argument("--steps", type=int, default=300)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--lr", type=float, default=0.05)
    t.add_argument("--temperature", type=float, default=0.5, help="sampling temperature over gated scores")
    t.add_argument("--init", default="", metavar="W1,W2",
                   help="start from these static weights (e.g. the best of `gate search`), else from equal ones")
    t.add_argument("--baseline", choices=("self-critical", "running"), default="self-critical",
                   help="what a sampled answer's reward is compared with: the same example decoded greedily with "
                        "the same gate (only when a sampled choice left the winner), or a running mean per task")
    t.add_argument("--no-progress", action="store_true")
    sub.choices["search"].add_argument("--grid", nargs="+", required=True, metavar="W1,W2",
                                       help="weightings to try, one per model each, e.g. 1,1 1,3 1,9")
    sub.choices["search"].add_argument("--json", type=Path, help="write the table here")
    args = p.parse_args(argv)
    if args.offset <= 50:
        print(f"warning: --offset {args.offset} overlaps the reported examples (lines 1..50)", file=sys.stderr)
    if args.action == "search":
        grid = []
        for g in args.grid:
            try:
                w = tuple(float(x) for x in g.split(","))
            except ValueError:
                raise ConfigError(f"--grid {g!r}: use comma-separated numbers, one per model") from None
            if len(w) != len(args.models) or not all(math.isfinite(x) and x >= 0 for x in w):
                raise ConfigError(f"--grid {g!r}: give {len(args.models)} non-negative numbers")
            grid.append(w)
        res = search(args.models, args.task, grid, args.data, args.offset, args.examples, normalize=args.normalize)
        print(f"best weights: {res['best']}")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(res, indent=1) + "\n")
        return 0
    try:
        init = tuple(float(x) for x in args.init.split(",")) if args.init else ()
    except ValueError:
        raise ConfigError(f"--init {args.init!r}: use comma-separated numbers, one per model") from None
    train(args.models, args.task, args.out, args.data, args.steps, args.offset, args.examples, args.seed, args.lr,
          args.temperature, progress=not args.no_progress, init=init, baseline=args.baseline,
          normalize=args.normalize)
    return 0
