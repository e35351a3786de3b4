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

    def load(self, names) -> str:
        lines = []
        for n in validate_models(names):
            lm = get_model(n)
            lines.append(f"✓ {lm.describe()}")
        return "\n".join(lines)

    def begin(self, names, cfg: DecodeConfig, prompt: str, resume: bool) -> Decoding:
        """Continue the decode in progress when it has the same settings, else start a new one."""
        names = validate_models(names)
        key = (tuple(names), cfg, prompt)
        if resume and self.decoding is not None and not self.decoding.done and key == self.key:
            return self.decoding
        models = [get_model(n) for n in names]
        self.decoding = AdaFuse(models, cfg).start(prompt)
        self.trace, self.singles, self.others, self.key = self.decoding.trace, {}, {}, key
        return self.decoding

    def run_others(self, names, cfg: DecodeConfig, prompt: str, labels):
        models = [get_model(n) for n in validate_models(names)]
        for label in labels or []:
            self.others[label] = AdaFuse(models, replace(cfg, **COMPARE_METHODS[label])).generate(prompt)
            yield label

    def run_singles(self, names, cfg: DecodeConfig, prompt: str):
        for n in validate_models(names):
            self.singles[n] = greedy(get_model(n), prompt, cfg)
            yield n

    def load_trace(self, path: str) -> Trace:
        trace = Trace.load(path)
        self.decoding, self.trace, self.singles, self.others, self.key = None, trace, {}, {}, None
        return trace

    def evaluate(self, task_name: str, limit: int, methods, names, base: dict) -> list[dict]:
        """Run a task batch (progress through tqdm) and keep its rows for browsing."""
        from adafuse.harness.evaluate import evaluate, load_results
        from adafuse.harness.tasks import TASKS
        if task_name not in TASKS:
            raise ConfigError(f"unknown task {task_name!r}: pick one of {', '.join(TASKS)}")
        if not methods:
            raise ConfigError("pick at least one method to evaluate")
        runs = parse_methods(list(methods), validate_models(names))
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
