"""Per-model weights learned from answers alone: a static-weight search and the gate's policy-gradient training.

    python -m adafuse gate search --task flores-de-en flores-en-de --grid 1,1 1,3 1,9 --examples 8
    python -m adafuse gate train  --task nq triviaqa squad --steps 300 --init 1,4 --out assets/gates/qa.json

Both read training examples from line `--offset` on (default 101: the reported evaluations use the first 50 lines of
each file, so the two never meet); lines 51–100 are the validation lines (`--val-lines`), used by nothing else: `search`
scores every weighting there too, beside its training reward, and `train` decodes them greedily with the gate at step 0
(its start) and every `--validate-every` steps and keeps the checkpoint that scored best there (its step and the
validation curve are recorded in the gate file). The training curve alone cannot say whether a gate improved: each of
its steps is a different example, of a different difficulty. The reward is the task's metric of the final answer,
scaled to [0, 1]: token F1 for the QA tasks (EM is the reported metric; F1 is the same judgement with partial credit, a
denser signal), chrF / 100 for translation, accuracy for GSM8K.

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

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from ..config import DecodeConfig
from ..ensemble import AdaFuse
from ..trace import fused_score
from ..errors import ConfigError
from ..gate import FEATURES, Gate, gate_weights, stack
from ..models import DEFAULT_PAIR, get_model
from .tasks import (data_dir, REPORT_LINES, TASKS, TRAIN_OFFSET, VALIDATION_LINES, Task, format_lines, parse_lines,
                    read_examples)


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


def validation_examples(tasks: list[str], data: Path, lines: tuple[int, int],
                        per_task: int) -> list[tuple[str, int, dict]]:
    """The first `per_task` examples of each task within the validation lines."""
    out = []
    for name in tasks:
        t = TASKS[name]
        rows = read_examples(data / t.folder / t.file, per_task, lines=lines, warn=lambda _: None)
        if not rows:
            raise ConfigError(f"{t.file} has no examples in lines {format_lines(lines)}: pass other --val-lines, or "
                              "--val-examples 0 to validate nothing")
        out += [(name, no, ex) for no, ex in rows]
    return out


def _models(models: list) -> list:
    """Names are loaded (the library's default registry); loaded models are used as they are."""
    return [get_model(m) if isinstance(m, str) else m for m in models]


def task_config(task: Task, **settings) -> DecodeConfig:
    return DecodeConfig(stop=task.stop, max_new_words=task.max_new_words, max_new_tokens=4 * task.max_new_words,
                        **settings)


@lru_cache(maxsize=None)
def _head(path: Path) -> str:
    """A task's few-shot prompt, read once (every training step decodes with it, twice when self-critical)."""
    return path.read_text(encoding="utf-8")


def prompt_of(task: Task, data: Path, ex: dict) -> str:
    return task.prompt(_head(data / task.folder / task.prompt_file), ex["question"])


def decode_rewards(lms, exs: list[tuple[str, int, dict]], data: Path, gate_object: Gate | None = None,
                   **settings) -> dict[str, list[float]]:
    """Per task, the reward of each example decoded greedily with these settings (as at test time); `gate_object`:
    decode with this gate instead of the settings' gate file (`gate=PATH`)."""
    per: dict[str, list[float]] = {}
    for name, _, ex in exs:
        task = TASKS[name]
        d = AdaFuse(lms, task_config(task, **settings)).start(prompt_of(task, data, ex))
        d.gate_object = gate_object
        while not d.done:
            d.commit()
        per.setdefault(name, []).append(reward(task, d.trace.output, ex["answer"]))
    return per


def mean_reward(per: dict[str, list[float]]) -> float:
    """Mean over examples (every task gives the same number of examples, or as many as it has)."""
    return sum(map(sum, per.values())) / sum(map(len, per.values()))


def search(models: list, tasks: list[str], grid: list[tuple[float, ...]], data: Path, offset: int,
           per_task: int, log=print, normalize: str = DecodeConfig.normalize,
           val_lines: tuple[int, int] = VALIDATION_LINES, val_per_task: int = 0) -> dict:
    """Mean reward of each static weighting on the training examples, the best of them chosen there; with
    `val_per_task`, each weighting's mean reward on that many validation examples per task beside it (reported,
    never used to choose)."""
    lms = _models(models)
    exs = training_examples(tasks, data, offset, per_task)
    vals = validation_examples(tasks, data, val_lines, val_per_task) if val_per_task else []
    rows = []
    for w in grid:
        t0 = time.perf_counter()
        per = decode_rewards(lms, exs, data, weights=w, normalize=normalize)
        row = {"weights": list(w), "reward": mean_reward(per), "per_task": {k: sum(v) / len(v) for k, v in per.items()}}
        if vals:
            vper = decode_rewards(lms, vals, data, weights=w, normalize=normalize)
            row |= {"validation": mean_reward(vper),
                    "validation_per_task": {k: sum(v) / len(v) for k, v in vper.items()}}
        row["seconds"] = time.perf_counter() - t0
        log(f"weights {w}: mean reward {row['reward']:.4f} over {len(exs)} training examples"
            + (f", {row['validation']:.4f} over {len(vals)} validation examples" if vals else "")
            + f" ({row['seconds']:.0f}s)")
        rows.append(row)
    best = max(rows, key=lambda r: (r["reward"], -grid.index(tuple(r["weights"]))))
    return {"models": [m if isinstance(m, str) else m.name for m in models], "tasks": tasks, "offset": offset,
            "examples": len(exs), "grid": rows, "best": best["weights"], "normalize": normalize,
            **({"validation_lines": format_lines(val_lines), "validation_examples": len(vals)} if vals else {})}


def _gated_scores(r, names: list[str], W: torch.Tensor, b: torch.Tensor,
                  normalize: str = DecodeConfig.normalize) -> tuple[torch.Tensor, list[int]] | None:
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


def train(models: list, tasks: list[str], out: Path, data: Path | None = None, steps: int = 300,
          offset: int = TRAIN_OFFSET, per_task: int = 200, seed: int = 0, lr: float = 0.05,
          temperature: float = 0.5, save_every: int = 10, progress: bool = True, log=print,
          init: tuple[float, ...] = (), baseline: str = "self-critical", normalize: str = DecodeConfig.normalize,
          validate_every: int = 0, val_lines: tuple[int, int] = VALIDATION_LINES, val_per_task: int = 20) -> Gate:
    """REINFORCE the gate for `steps` steps and write it to `out`. With `validate_every`, the gate is decoded greedily
    on `val_per_task` validation examples per task at step 0 and every `validate_every` steps (and the last), and the
    checkpoint with the highest mean reward there is the one written (the earliest on a tie): `trained.validation`
    records the curve and the step kept. Models are names or loaded models."""
    lms = _models(models)
    names = [lm.name for lm in lms]
    data = data or data_dir()
    exs = training_examples(tasks, data, offset, per_task)
    vals = validation_examples(tasks, data, val_lines, val_per_task) if validate_every else []
    n, f = len(names), len(FEATURES)
    W = torch.zeros(n, n * f, dtype=torch.float64, requires_grad=True)
    if init and (len(init) != n or not all(w > 0 for w in init)):
        raise ConfigError(f"--init {init}: give {n} positive weights, one per model")
    if validate_every < 0 or (validate_every and val_per_task < 1):
        raise ConfigError(f"--validate-every {validate_every} with --val-examples {val_per_task}: use 0 to validate "
                          "nothing, or a positive number of steps with 1 or more examples")
    # start from static weights (b = log w: the gate's weights are then ∝ w whatever the features), else equal
    b = torch.tensor([math.log(w) for w in init] if init else [0.0] * n, dtype=torch.float64, requires_grad=True)
    run = _Run(lms, names, data, exs, vals, W, b, torch.optim.Adam([W, b], lr=lr), normalize)
    ckpt = out.with_name(out.name + ".ckpt")
    args = {"models": names, "tasks": tasks, "offset": offset, "per_task": per_task, "seed": seed, "lr": lr,
            "temperature": temperature, "init": list(init), "baseline": baseline,
            **({"normalize": normalize} if normalize != "token" else {}),
            **({"validate_every": validate_every, "val_lines": format_lines(val_lines), "val_per_task": val_per_task}
               if validate_every else {})}
    if baseline not in ("self-critical", "running"):
        raise ConfigError(f"baseline {baseline!r}: use self-critical or running")
    if ckpt.exists():
        _resume(run, ckpt, args, log)
    # the start (step 0), or a resumed run's step if it was not validated before it stopped
    _validate(run, validate_every, steps, log)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=steps, initial=run.state["step"], desc="gate", unit="step", file=sys.stderr)
    while run.state["step"] < steps:
        _reinforce_step(run, seed, temperature, baseline)
        if bar:
            recent = run.state["curve"][-20:]
            bar.set_postfix(reward=f"{sum(c['reward'] for c in recent) / len(recent):.3f}")
            bar.update(1)
        # before the checkpoint, so a resumed run holds every validation up to its step
        _validate(run, validate_every, steps, log)
        if run.state["step"] % save_every == 0 or run.state["step"] == steps:
            torch.save({"args": args, "W": W.detach(), "b": b.detach(), "opt": run.opt.state_dict(),
                        "state": run.state}, ckpt)
    if bar:
        bar.close()
    kept = run.state["best"] if vals else {"step": steps, "W": W.detach().tolist(), "b": b.detach().tolist()}
    gate = Gate(names, kept["W"], kept["b"], trained=_trained(run, args, steps, kept, validate_every, val_lines))
    out.parent.mkdir(parents=True, exist_ok=True)
    gate.save(out)
    log(f"wrote {out} ({gate.parameters} parameters, {steps} steps over {len(exs)} examples"
        + (f"; kept step {kept['step']}, the best on {len(vals)} validation examples)" if vals else ")"))
    return gate


@dataclass
class _Run:
    """One training run: its models and examples, the gate's parameters and their optimizer, and its progress."""
    lms: list
    names: list[str]
    data: Path
    exs: list[tuple[str, int, dict]]   # the training examples: (task, line, example)
    vals: list[tuple[str, int, dict]]  # the validation examples (empty: no validation)
    W: torch.Tensor                    # (n, n * len(FEATURES)): the gate's feature weights
    b: torch.Tensor                    # (n,): its biases
    opt: torch.optim.Optimizer
    normalize: str
    # what a checkpoint holds: the steps taken, the running baselines, the training and validation curves, the best
    state: dict = field(default_factory=lambda: {"step": 0, "baseline": {}, "curve": [], "validation": [],
                                                 "best": None})

    def gate(self) -> Gate:
        """The gate as its parameters are now."""
        return Gate(self.names, self.W.detach().tolist(), self.b.detach().tolist())


def _resume(run: _Run, ckpt: Path, args: dict, log) -> None:
    """Take up a run from its checkpoint, which must have been written with the same settings."""
    saved = torch.load(ckpt, weights_only=False)
    if saved["args"] != args:
        raise ConfigError(f"{ckpt} was written with other settings ({saved['args']}): delete it to start over")
    with torch.no_grad():
        run.W.copy_(saved["W"]), run.b.copy_(saved["b"])
    run.opt.load_state_dict(saved["opt"])
    run.state = saved["state"]
    log(f"resuming from {ckpt} at step {run.state['step']}")


def _validate(run: _Run, every: int, steps: int, log) -> None:
    """At a validation step not yet validated: the gate as it is now, decoded greedily on the validation lines."""
    state, vals = run.state, run.vals
    at = state["step"]
    if not vals or (at % every and at != steps) or any(v["step"] == at for v in state["validation"]):
        return
    gate = run.gate()
    per = decode_rewards(run.lms, vals, run.data, gate_object=gate, normalize=run.normalize)
    per_task_mean = {k: sum(v) / len(v) for k, v in per.items()}
    score = sum(per_task_mean.values()) / len(per_task_mean)  # every task counts the same
    state["validation"].append({"step": at, "reward": score, "per_task": per_task_mean})
    if state["best"] is None or score > state["best"]["reward"]:
        state["best"] = {"step": at, "reward": score, "W": gate.W, "b": gate.b}
    log(f"step {at}: validation reward {score:.4f} over {len(vals)} examples (best: step {state['best']['step']}, "
        f"{state['best']['reward']:.4f})")


def _reinforce_step(run: _Run, seed: int, temperature: float, baseline: str) -> None:
    """One REINFORCE step on the next training example (a seeded order per epoch): a sampled decode, its reward
    against the baseline, one Adam step; recorded in `run.state`."""
    state = run.state
    step = state["step"]
    epoch, k = divmod(step, len(run.exs))
    order = list(range(len(run.exs)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    name, no, ex = run.exs[order[k]]
    task = TASKS[name]
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    gate = run.gate()
    R, logps, choices, deviations = _sampled_decode(run, gate, task, ex, gen, temperature)
    if baseline == "running":
        base = state["baseline"].get(name, R)
    elif deviations:  # self-critical: the same example decoded greedily with the same gate
        base = decode_rewards(run.lms, [(name, no, ex)], run.data, gate_object=gate, normalize=run.normalize)[name][0]
    else:  # every sampled choice was the winner: the sample is the greedy decode
        base = R
    if logps:
        run.opt.zero_grad()
        loss = -(R - base) * torch.stack(logps).sum()
        loss.backward()
        run.opt.step()
    state["baseline"][name] = 0.9 * state["baseline"].get(name, R) + 0.1 * R
    state["curve"].append({"step": step, "task": name, "line": no, "reward": R, "baseline": base,
                           "choices": choices, "sampled_off_winner": deviations})
    state["step"] = step + 1


def _sampled_decode(run: _Run, gate: Gate, task: Task, ex: dict, gen: torch.Generator,
                    temperature: float) -> tuple[float, list[torch.Tensor], int, int]:
    """Decode `ex` with `gate`, each choice among two or more scored candidates sampled from softmax(−gated score /
    temperature): (reward, the sampled choices' log-probabilities with their gradient, choices, choices off the
    winner)."""
    d = AdaFuse(run.lms, task_config(task, normalize=run.normalize)).start(prompt_of(task, run.data, ex))
    d.gate_object = gate
    logps, deviations, choices = [], 0, 0
    while not d.done:
        r = d.propose()
        got = _gated_scores(r, run.names, run.W, run.b, run.normalize)
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
    return reward(task, d.trace.output, ex["answer"]), logps, choices, deviations


def _trained(run: _Run, args: dict, steps: int, kept: dict, validate_every: int, val_lines: tuple[int, int]) -> dict:
    """The gate file's record of how it was trained (`kept`: the checkpoint written)."""
    trained = {**args, "steps": steps, "examples": len(run.exs), "reward": "token F1 (QA), chrF/100 (translation), "
               "accuracy (GSM8K) of the final answer", "algorithm": "REINFORCE with a " + (
                   "self-critical baseline (the example decoded greedily with the same gate)"
                   if args["baseline"] == "self-critical" else "per-task running baseline") + ", Adam",
               "curve": run.state["curve"]}
    if run.vals:
        trained["validation"] = {"lines": format_lines(val_lines), "examples": len(run.vals), "every": validate_every,
                                 "kept_step": kept["step"], "kept_reward": kept["reward"],
                                 "rule": "the checkpoint with the highest mean reward (per task, then over tasks) on "
                                         "the validation examples, decoded greedily; the earliest on a tie",
                                 "curve": run.state["validation"]}
    return trained


def _lines_arg(text: str) -> tuple[int, int]:
    """--val-lines FIRST-LAST, a usage error when malformed."""
    try:
        return parse_lines(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    """The command line of `gate train` and `gate search`."""
    p = argparse.ArgumentParser(prog="python -m adafuse gate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    for name in ("train", "search"):
        s = sub.add_parser(name)
        s.add_argument("--task", nargs="+", required=True, choices=list(TASKS), metavar="TASK")
        s.add_argument("--models", nargs="+", default=list(DEFAULT_PAIR), metavar="MODEL")
        s.add_argument("--data", type=Path, default=None, help="default: tasks.data_dir()")
        s.add_argument("--offset", type=int, default=TRAIN_OFFSET, help="first data line used (reports use 1..50)")
        s.add_argument("--examples", type=int, default=200, help="training examples per task")
        s.add_argument("--normalize", choices=("token", "word"), default=DecodeConfig.normalize,
                       help="average each candidate's NLL over its words (the default, as in decoding) or its tokens "
                            "(the paper)")
        s.add_argument("--val-lines", type=_lines_arg, default=VALIDATION_LINES, metavar="FIRST-LAST",
                       help="the validation lines of each data file (default 51-100: used by neither the report nor "
                            "training)")
        s.add_argument("--val-examples", type=int, default=20,
                       help="validation examples per task (the first of --val-lines); 0: no validation")
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
    t.add_argument("--validate-every", type=int, default=50, metavar="STEPS",
                   help="decode the validation examples with the gate at step 0 and every STEPS steps and keep the "
                        "best checkpoint (0: keep the last step, validate nothing)")
    t.add_argument("--no-progress", action="store_true")
    sub.choices["search"].add_argument("--grid", nargs="+", required=True, metavar="W1,W2",
                                       help="weightings to try, one per model each, e.g. 1,1 1,3 1,9")
    sub.choices["search"].add_argument("--json", type=Path, help="write the table here")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    args.data = args.data or data_dir()  # found now, not at import
    if args.offset <= REPORT_LINES[1]:
        print(f"warning: --offset {args.offset} overlaps the reported examples (lines {format_lines(REPORT_LINES)})",
              file=sys.stderr)
    if args.val_examples < 0:
        raise ConfigError(f"--val-examples {args.val_examples}: use 0 (no validation) or more")
    if args.offset <= args.val_lines[1] and args.val_examples:
        print(f"warning: the training lines (from {args.offset}) overlap the validation lines "
              f"({format_lines(args.val_lines)})", file=sys.stderr)
    if args.action == "search":
        return _search_main(args)
    try:
        init = tuple(float(x) for x in args.init.split(",")) if args.init else ()
    except ValueError:
        raise ConfigError(f"--init {args.init!r}: use comma-separated numbers, one per model") from None
    train(args.models, args.task, args.out, args.data, args.steps, args.offset, args.examples, args.seed, args.lr,
          args.temperature, progress=not args.no_progress, init=init, baseline=args.baseline,
          normalize=args.normalize, validate_every=args.validate_every if args.val_examples else 0,
          val_lines=args.val_lines, val_per_task=args.val_examples)
    return 0


def _search_main(args) -> int:
    """`gate search`: the grid read from --grid, searched, the best weights printed and the table written."""
    grid = []
    for g in args.grid:
        try:
            w = tuple(float(x) for x in g.split(","))
        except ValueError:
            raise ConfigError(f"--grid {g!r}: use comma-separated numbers, one per model") from None
        if len(w) != len(args.models) or not all(math.isfinite(x) and x >= 0 for x in w):
            raise ConfigError(f"--grid {g!r}: give {len(args.models)} non-negative numbers")
        grid.append(w)
    res = search(args.models, args.task, grid, args.data, args.offset, args.examples, normalize=args.normalize,
                 val_lines=args.val_lines, val_per_task=args.val_examples)
    print(f"best weights on the training examples: {res['best']}")
    if args.val_examples:
        for row in res["grid"]:
            print(f"  {row['weights']}: training {row['reward']:.4f}, validation {row['validation']:.4f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0
