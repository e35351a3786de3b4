"""Per-browser-session state and the actions behind the buttons (no layout here)."""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from dataclasses import replace

from adafuse import AdaFuse, DecodeConfig, Decoding, Trace, get_model, greedy
from adafuse.errors import AdafuseError, ConfigError
from adafuse.harness.evaluate import parse_methods
from adafuse.loading import loaded_models, parse_spec, unload_model
from adafuse.remote import is_remote_spec

# Methods the page can decode side by side with the main one (label -> settings).
COMPARE_METHODS = {"beam (no diversity)": {"method": "beam"}, "fixed span 1": {"method": "fixed-span", "span_words": 1},
                   "fixed span 2": {"method": "fixed-span", "span_words": 2},
                   "fixed span 3": {"method": "fixed-span", "span_words": 3},
                   "token union (UniTE-style)": {"method": "token-union"}, "mixture (ME)": {"method": "mixture"}}
EVAL_METHODS = ("adafuse", "greedy", "beam", "fixed-span-1", "fixed-span-2", "fixed-span-3", "token-union", "mixture")

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def load_examples() -> list[dict]:
    return json.loads((ASSETS / "examples.json").read_text(encoding="utf-8"))


def parse_stops(text: str) -> tuple[str, ...]:
    """One stop string per line; \\n and \\t written as escapes."""
    return tuple(s.replace("\\n", "\n").replace("\\t", "\t") for s in (text or "").splitlines() if s.strip())


def validate_models(names) -> list[str]:
    names = [n.strip() for n in (names or []) if isinstance(n, str) and n.strip()]
    if not 2 <= len(names) <= 4:
        raise ConfigError(f"pick 2 to 4 base models (you picked {len(names)})")
    return names


def device_choices() -> list[str]:
    """What the "Device for all models" menu offers on this machine."""
    import torch
    n = torch.cuda.device_count()
    return ["default", "cpu", *(f"cuda:{i}" for i in range(n))] + (["auto"] if n else [])


def model_specs(names, device: str | None = None) -> list[str]:
    """`validate_models`, then `@DEVICE` added to each name that does not place itself (`MODEL@cuda:1`); "default"
    or None adds nothing. A bad device or dtype raises ModelLoadError here, before any model loads."""
    out = []
    for n in validate_models(names):
        if device and device != "default" and parse_spec(n)[1] is None and not is_remote_spec(n):
            n = f"{n}@{device}"
        parse_spec(n)
        out.append(n)
    return out


LOADED_COLUMNS = {"model": "model", "device": "device", "dtype": "dtype", "memory_mib": "memory (MiB)",
                  "load_seconds": "load time (s)", "source": "source"}


def loaded_frame(models=None):
    """The loaded models (most recently used first) as a table; `models`: objects with `.info()`."""
    import pandas as pd
    rows = [lm.info() for lm in (loaded_models() if models is None else models)]
    return pd.DataFrame([{LOADED_COLUMNS[k]: r.get(k) for k in LOADED_COLUMNS} for r in rows],
                        columns=list(LOADED_COLUMNS.values()))


def unload(name: str | None) -> str:
    if not name:
        raise ConfigError("pick a loaded model to unload")
    if not unload_model(name):
        return f"{name} is not loaded"
    return f"✓ unloaded {name} (its memory is freed once no decode in progress holds it)"


@dataclass
class Explorer:
    """What one browser session is looking at."""
    decoding: Decoding | None = None
    trace: Trace | None = None
    singles: dict[str, Trace] = field(default_factory=dict)
    others: dict[str, Trace] = field(default_factory=dict)   # other methods on the same prompt
    key: tuple | None = None           # (models, config, prompt) of the decode in progress
    eval_rows: list[dict] = field(default_factory=list)     # the last evaluation batch
    export_dir: str | None = None

    @property
    def pending(self):
        return self.decoding.pending if self.decoding is not None and not self.decoding.done else None

    def load(self, names, device: str | None = None) -> str:
        lines = []
        for n in model_specs(names, device):
            lm = get_model(n)
            lines.append(f"✓ {lm.describe()}")
        return "\n".join(lines)

    def begin(self, names, cfg: DecodeConfig, prompt: str, resume: bool, device: str | None = None) -> Decoding:
        """Continue the decode in progress when it has the same settings, else start a new one."""
        names = model_specs(names, device)
        key = (tuple(names), cfg, prompt)
        if resume and self.decoding is not None and not self.decoding.done and key == self.key:
            return self.decoding
        models = [get_model(n) for n in names]
        self.decoding = AdaFuse(models, cfg).start(prompt)
        self.trace, self.singles, self.others, self.key = self.decoding.trace, {}, {}, key
        return self.decoding

    def run_others(self, names, cfg: DecodeConfig, prompt: str, labels, device: str | None = None):
        models = [get_model(n) for n in model_specs(names, device)]
        for label in labels or []:
            self.others[label] = AdaFuse(models, replace(cfg, **COMPARE_METHODS[label])).generate(prompt)
            yield label

    def run_singles(self, names, cfg: DecodeConfig, prompt: str, device: str | None = None):
        for n in model_specs(names, device):
            lm = get_model(n)
            label = lm.name if lm.name not in self.singles else n  # the model's name; its spec when it repeats
            self.singles[label] = greedy(lm, prompt, cfg)
            yield label

    def load_trace(self, path: str) -> Trace:
        trace = Trace.load(path)
        self.decoding, self.trace, self.singles, self.others, self.key = None, trace, {}, {}, None
        return trace

    def evaluate(self, task_name: str, limit: int, methods, names, base: dict, device: str | None = None) -> list[dict]:
        """Run a task batch (progress through tqdm) and keep its rows for browsing."""
        from adafuse.harness.evaluate import evaluate, load_results
        from adafuse.harness.tasks import TASKS
        if task_name not in TASKS:
            raise ConfigError(f"unknown task {task_name!r}: pick one of {', '.join(TASKS)}")
        if not methods:
            raise ConfigError("pick at least one method to evaluate")
        runs = parse_methods(list(methods), model_specs(names, device))
        out = Path(tempfile.mkdtemp(prefix="adafuse-eval-"))
        evaluate(TASKS[task_name], runs, out, limit=int(limit), base=base, progress=True)
        self.eval_rows = load_results(out)
        return self.eval_rows

    def open_example(self, line: int, method: str) -> Trace:
        row = next((r for r in self.eval_rows if r["line"] == line and r["method"] == method), None)
        if row is None:
            raise ConfigError(f"no result for example {line} / {method}: run an evaluation first")
        self.decoding, self.trace, self.singles, self.others, self.key = None, Trace.from_dict(row["trace"]), {}, {}, None
        return self.trace

    def export(self) -> str | None:
        """Write the current trace where the download button serves it from (one folder per session)."""
        if self.trace is None:
            return None
        if self.export_dir is None:
            self.export_dir = tempfile.mkdtemp(prefix="adafuse-")
        out = Path(self.export_dir) / "adafuse-trace.json"
        self.trace.save(out)
        return str(out)


STOPS = {"max_new_words": "reached Max new words", "max_new_tokens": "reached Max new tokens (raise it to go on)",
         "eos": "the answer ended", "stop string": "a stop string", "context full": "a model's context window is full",
         "no progress": "no model could add text", "cancelled": "cancelled"}


def stop_note(trace: Trace) -> str:
    """Why the decode stopped, in words, and which model read a chat prompt raw (it has no chat template)."""
    reason = trace.stop_reason or ""
    note = f"stop: {STOPS.get(reason, reason)}"
    raw = [m for m, mode in trace.prompt_modes.items() if mode.startswith("raw (")]
    if raw and trace.settings.get("mode") == "chat":
        note += f" · {', '.join(raw)} {'has' if len(raw) == 1 else 'have'} no chat template: read the prompt raw"
    return note


def _correct(row: dict) -> bool:
    from adafuse.harness.tasks import TASKS
    task = TASKS[row["task"]]
    value = row["scores"].get(task.main_metric, 0.0)
    return value >= (50.0 if task.metric == "translation" else 0.5)


def disagreements(rows: list[dict]) -> list[dict]:
    """Examples where the ensemble and a single model disagree on correctness, both ways."""
    by_line: dict[int, dict[str, dict]] = {}
    for r in rows:
        by_line.setdefault(r["line"], {})[r["method"]] = r
    out = []
    for line, methods in sorted(by_line.items()):
        ens = methods.get("adafuse")
        singles = {m: r for m, r in methods.items() if m.startswith("greedy:")}
        if ens is None or not singles:
            continue
        right = [m for m, r in singles.items() if _correct(r)]
        wrong = [m for m, r in singles.items() if not _correct(r)]
        if not _correct(ens) and right:
            kind = "ensemble wrong, a single model right"
        elif _correct(ens) and wrong:
            kind = "ensemble right, a single model wrong"
        else:
            continue
        out.append({"line": line, "kind": kind, "question": ens["question"][-120:],
                    "adafuse": ens["prediction"], **{m: r["prediction"] for m, r in singles.items()},
                    "gold": ens["gold"] if isinstance(ens["gold"], str) else " | ".join(ens["gold"][:3])})
    return out


def friendly(exc: BaseException) -> str:
    """A message for the page: typed errors as they are, anything else without a stack trace."""
    if isinstance(exc, AdafuseError):
        return str(exc)
    name = type(exc).__name__
    if "OutOfMemory" in name or "out of memory" in str(exc).lower():
        return "the device ran out of memory: pick smaller models, fewer branches (B) or a shorter prompt"
    return f"something went wrong ({name}: {str(exc)[:200]}); the app is still running — try again or Reset"
