"""Evaluation harness: run methods over a task's JSONL, write one line per example and method, summarize."""
from __future__ import annotations

import csv
import functools
import json
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..config import LEGACY, DecodeConfig
from ..ensemble import AdaFuse
from ..method_registry import canonical, from_spec, own_settings, parse_spec, value
from ..errors import ConfigError
from ..many import check_concurrency, run_many
from ..models import ModelRegistry, default_registry
from .figures import word_shares
from .metrics import corpus_scores
from .tasks import TASKS, Task, data_dir as find_data_dir, read_examples


@dataclass
class MethodRun:
    label: str                      # how it appears in results, e.g. "adafuse[branches=5]" or "greedy:MODEL"
    models: list[str]
    settings: dict = field(default_factory=dict)


def setting_value(key: str, raw, where: str):
    """One decoding setting given as text (or already typed): a DecodeConfig field, weights as numbers separated by
    slashes ("1/4"); `where` names what held it, for the error."""
    if key not in DecodeConfig.__dataclass_fields__ and key not in own_settings():
        raise ConfigError(f"unknown setting {key!r} in {where}")
    if key == "weights":
        try:
            return tuple(float(x) for x in str(raw).split("/"))
        except ValueError:
            raise ConfigError(f"weights in {where}: use numbers separated by slashes, e.g. weights=1/4") from None
    return value(raw) if isinstance(raw, str) else raw


def parse_methods(specs: list[str], models: list[str]) -> list[MethodRun]:
    """Method specs: adafuse, beam, token-union, mixture, fixed-span-N, greedy (each model alone), greedy:MODEL,
    any of them with settings in brackets: adafuse[branches=5,tau=0.5,diversity=false]; weights are separated by
    slashes (adafuse[weights=1/4]). `LABEL=SPEC` names a run: adafuse+gate=adafuse[gate=assets/gates/qa.json]."""
    runs = []
    for spec in specs:
        label, eq, rest = spec.strip().partition("=")
        named = bool(eq) and "[" not in label and re.fullmatch(r"[\w+.:-]+", label) is not None
        if named:
            spec = rest
        head, bracket, args = spec.strip().partition("[")
        name, colon, model = head.partition(":")  # greedy:MODEL: one model alone
        if colon and not model.strip():
            raise ConfigError(f"method={spec!r} is invalid: name the model after the colon, e.g. greedy:MODEL")
        method, pairs = parse_spec(name + bracket + args)
        cls, _ = from_spec(method)
        settings, own = {}, {}
        for key, raw in pairs:
            if key == "method":
                raise ConfigError(f"method in the settings of {spec!r}: the method is the spec's name, e.g. "
                                  "mixture[seed=3]")
            (own if key in own_settings() else settings)[key] = setting_value(key, raw, repr(spec))
        settings = {"method": canonical(method, **own), **settings}  # the method's own in its spec
        if cls.models == (1, 1):  # a single-model method: one run per model
            targets = [model.strip()] if colon else models
            runs += [MethodRun(f"greedy:{t}", [t], settings) for t in targets]
        else:
            runs.append(MethodRun(label if named else spec.strip(), list(models), settings))
    return runs


def done_keys(path: Path) -> set[tuple[int, str]]:
    keys = set()
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                keys.add((row["line"], row["method"]))
            except (ValueError, KeyError):
                continue  # a line cut by an interrupted run: it is redone
    return keys


def set_aside_cut_line(path: Path, warn=print) -> Path | None:
    """A run killed hard (power loss, OOM kill) can leave a half-written last line. Move it to `<file>.cut` (kept,
    appended) and truncate the results file to its last complete line, so a resumed run redoes that example instead
    of appending onto the fragment. Returns the side file when something was set aside."""
    if not path.exists():
        return None
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return None
    keep = data.rfind(b"\n") + 1
    side = path.with_name(path.name + ".cut")
    with side.open("ab") as fh:
        fh.write(data[keep:] + b"\n")
    with path.open("r+b") as fh:
        fh.truncate(keep)
    warn(f"{path.name}: the last line was cut off by an interrupted run; set aside in {side.name}, its example "
         "is redone")
    return side


# the settings that decide what a decode writes (speculation and prompt lookup only save forwards; the stop strings are
# the task's, and a template-less chat member adds its turn ends to those a trace records)
DECIDING = tuple(f for f in DecodeConfig.__dataclass_fields__ if f not in ("speculate", "draft_lookup", "stop"))
POOL_ONLY = ("normalize", "allow_empty")  # how a pool is scored and held: nothing to a method that scores none


def run_config(task: Task, base: dict | None, run: MethodRun) -> DecodeConfig:
    """The settings one run decodes a task's examples with: the task's stop strings and caps, `base`, the run's own."""
    settings = {"stop": task.stop, "max_new_words": task.max_new_words,
                "max_new_tokens": task.max_new_tokens, **(base or {}), **run.settings}
    if len(run.models) == 1:  # a model alone: the ensemble's per-model weights do not apply
        settings.pop("weights", None)
        settings.pop("gate", None)
    return DecodeConfig(**settings)


def check_resumed(out: Path, task: Task, base: dict | None, runs: list[MethodRun]) -> None:
    """A resumed run adds to a label's rows only with the settings they were decoded with (ConfigError naming the
    first that differs): rows stored before a default changed (per token, the end allowed at once) are not mixed
    with rows decoded under the new one. `runs`: those with lines left to decode."""
    want = {run.label: run_config(task, base, run) for run in runs}
    if not want or not out.exists():
        return
    seen: set[str] = set()
    for row in read_rows(out):
        label = row.get("method")
        if label not in want or label in seen or "settings" not in row.get("trace", {}):
            continue
        seen.add(label)
        recorded, cfg = row["trace"]["settings"], want[label]
        stored = DecodeConfig.from_dict(recorded)
        for f in DECIDING:  # a setting the rows do not record did not exist yet: it meant its LEGACY value
            if f in POOL_ONLY and (not cfg.method_class.scores or cfg.method_class.models == (1, 1)):
                continue
            if (f in recorded or f in LEGACY) and getattr(stored, f) != getattr(cfg, f):
                raise ConfigError(
                    f"{out} holds rows of {label!r} decoded with {f}={getattr(stored, f)!r}; this run would decode "
                    f"{f}={getattr(cfg, f)!r}: write to another --out, or decode as they were (for rows stored before "
                    "per word and the held-back end: --normalize token --allow-empty)")
        if seen == set(want):
            return


def evaluate(task: Task, runs: list[MethodRun], out_dir: Path, data_dir: Path | None = None, limit: int | None = None,
             base: dict | None = None, on_bad_line: str = "skip", progress: bool = True, warn=None,
             trust_remote_code: bool = False, registry: ModelRegistry | None = None,
             lines: tuple[int, int] | None = None, concurrency: int = 1) -> Path:
    """Run every method on the first `limit` examples (of the data lines `lines`, both ends included, when given);
    results are appended line by line, keyed by data line and method, so a rerun resumes. `trust_remote_code` lets
    models whose repository ships its own Python run it; `registry` holds the models (default: the library's default
    registry). `concurrency`: decodes in flight at once (adafuse/many.py), each row's "seconds" then the wall time of
    its decode while sharing the machine (and "in_flight" says with how many; `decode_seconds` is its share)."""
    check_concurrency(concurrency)
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    data_dir = Path(data_dir or find_data_dir())
    examples = read_examples(data_dir / task.folder / task.file, limit, on_bad_line, warn, lines)
    head = (data_dir / task.folder / task.prompt_file).read_text(encoding="utf-8")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{task.name}.jsonl"
    set_aside_cut_line(out, warn)
    done = done_keys(out)
    todo = [(no, ex, run) for no, ex in examples for run in runs if (no, run.label) not in done]
    check_resumed(out, task, base, list({id(run): run for _, _, run in todo}.values()))
    if not todo:  # every run is already in the file: a resume that has nothing to decode loads no model
        out.touch()
        return out
    registry = registry or default_registry()
    models = {name: registry.get(name, trust_remote_code=trust_remote_code) for run in runs for name in run.models}
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(todo), desc=task.name, unit="run", file=sys.stderr)
    def job(no, ex, run):
        cfg = run_config(task, base, run)
        t0 = time.perf_counter()
        trace = AdaFuse([models[n] for n in run.models], cfg).generate(task.prompt(head, ex["question"]))
        pred = task.extract(trace.output)
        return {"task": task.name, "line": no, "method": run.label, "question": ex["question"], "prediction": pred,
                "gold": ex["answer"], "scores": task.score(pred, ex["answer"]),
                "seconds": time.perf_counter() - t0, **({"in_flight": concurrency} if concurrency > 1 else {}),
                "trace": trace.to_dict()}

    # rows are written in the order of the data lines and methods whatever the concurrency (the decodes in flight
    # finish in any order); an interrupted run loses at most the examples in flight
    with out.open("a", encoding="utf-8") as sink:
        for row in run_many([functools.partial(job, *item) for item in todo], concurrency):
            sink.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
            sink.flush()
            if bar:
                bar.update(1)
    if bar:
        bar.close()
    return out


def load_results(out_dir: Path) -> list[dict]:
    """Every row of OUT/<task>.jsonl (or of <task>.jsonl.gz where there is no unpacked file)."""
    paths = sorted(out_dir.glob("*.jsonl"))
    paths += [p for p in sorted(out_dir.glob("*.jsonl.gz")) if p.with_suffix("") not in paths]
    return [row for path in paths for row in read_rows(path)]


def read_rows(path: Path) -> list[dict]:
    """The rows of one results file (.jsonl, or .jsonl.gz); a line cut off by an interrupted run is skipped."""
    import gzip
    raw = gzip.decompress(path.read_bytes()).decode("utf-8") if path.suffix == ".gz" else path.read_text("utf-8")
    rows = []
    for line in raw.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def decode_seconds(row: dict) -> float:
    """What one results row's decode cost in seconds: decoded alone, its wall time; decoded with others in flight
    (`in_flight`), its models' seconds from its trace — for a local model its share of each packed forward it rode
    (the forward's time split by positions, models/batching.py), for a served one its requests' wall time — since
    its own wall time then mostly waits on the others' work (8 SQuAD decodes in flight: 12.4 s each, 2.0 s of run
    wall clock per example). The share leaves out the decoder's own Python work (alone, forwards are 86–97 % of a
    decode's wall time in the stored results), so compare rows decoded the same way. The run's wall clock is what
    `eval` prints at the end."""
    if row.get("in_flight", 1) <= 1:
        return row["seconds"]
    trace = row["trace"]
    return sum(p.get("seconds", 0.0) for p in trace.get("prefill", {}).values()) + \
        sum(s.get("seconds", 0.0) for r in trace["rounds"] for s in r["steps"])


def summarize(rows: list[dict]) -> list[dict]:
    """One row per (task, method): scores ×100, corpus BLEU/chrF, seconds (`decode_seconds`), forward passes, words
    per round."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["method"])].append(r)
    table = []
    for (task, method), items in sorted(groups.items()):
        out = {"task": task, "method": method, "n": len(items)}
        keys = sorted({k for it in items for k in it["scores"]})
        for k in keys:
            out[k] = round(100 * sum(it["scores"].get(k, 0) for it in items) / len(items), 2) \
                if k not in ("bleu", "chrf") else None
        if TASKS.get(task) and TASKS[task].metric == "translation":
            golds = [it["gold"] if isinstance(it["gold"], str) else it["gold"][0] for it in items]
            out.update({k: round(v, 2) for k, v in corpus_scores([it["prediction"] for it in items], golds).items()})
        out["sec/example"] = round(sum(decode_seconds(it) for it in items) / len(items), 2)
        fwd = [_forward_passes(it["trace"]) for it in items]
        out["fwd/example"] = round(sum(fwd) / len(fwd), 1)
        shares = word_shares([r["words"] for it in items for r in it["trace"]["rounds"]])
        out["rounds 1/2/3+ words %"] = "/".join(f"{x:.0f}" for x in shares)
        table.append(out)
    return table


def _forward_passes(trace: dict) -> int:
    """All models' forward passes in a trace dict, prompt prefill included."""
    return sum(p.get("forward_passes", 0) for p in trace.get("prefill", {}).values()) + \
        sum(s["forward_passes"] for r in trace["rounds"] for s in r["steps"])


def main_metric_table(summary: list[dict]) -> list[dict]:
    """Methods × tasks on each task's main metric, with the average."""
    by_method: dict[str, dict] = defaultdict(dict)
    for row in summary:
        task = TASKS.get(row["task"])
        if task:
            by_method[row["method"]][row["task"]] = row.get(task.main_metric)
    tasks = [t for t in TASKS if any(t in v for v in by_method.values())]
    out = []
    for method, scores in by_method.items():
        row = {"method": method, **{t: scores.get(t) for t in tasks}}
        vals = [v for v in scores.values() if v is not None]
        row["average"] = round(sum(vals) / len(vals), 2) if len(vals) == len(tasks) and vals else None
        out.append(row)
    return out


def write_summary(out_dir: Path) -> tuple[Path, Path]:
    from ..report import format_table
    summary = summarize(load_results(out_dir))
    md, csv_path = out_dir / "summary.md", out_dir / "summary.csv"
    main = main_metric_table(summary)
    md.write_text("## Main metric per task (EM for NQ/TriviaQA, F1 for SQuAD, accuracy for GSM8K, chrF for Flores)\n\n"
                  + markdown_table(main) + "\n\n## All numbers\n\n" + markdown_table(summary) + "\n", encoding="utf-8")
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        cols = sorted({k for r in summary for k in r}, key=lambda k: (k not in ("task", "method", "n"), k))
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(summary)
    print(format_table(main))
    return md, csv_path


def markdown_table(rows: list[dict]) -> str:
    """Rows as a Markdown table: columns in order of first appearance, None as an empty cell."""
    if not rows:
        return "(no results)"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
