"""Per-browser-session state and the actions behind the buttons (no layout here)."""
from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from adafuse import AdaFuse, DecodeConfig, Decoding, Trace
from adafuse.decoder import LIVE_SETTINGS
from adafuse.replay import branch_from
from adafuse.explain import token_view
from adafuse.report import candidate_label
from adafuse.errors import AdafuseError, ConfigError
from adafuse.trace import StopReason, transcript_readers
from adafuse.harness.evaluate import parse_methods
from adafuse.many import DEFAULT_CONCURRENCY, DEFAULT_DEADLINE_S
from adafuse.method_registry import from_spec, method_specs, to_spec
from adafuse.methods import Greedy
from adafuse.models import ModelRegistry, is_served_spec, parse_spec

from . import analysis, public
from .public import remote_code_allowed  # noqa: F401  (the page and tests ask it here)
from .session_lock import SessionLock
from .slots import Slots

# The method registry's runs as the Evaluate tab offers them, and the ensembles the page can decode side by side
# with the main one (label -> settings: every method but AdaFuse itself and one model alone, shown anyway).
EVAL_METHODS = tuple(method_specs())
COMPARE_METHODS = {cls.title(own): {"method": to_spec(cls, own)} for cls, own in map(from_spec, EVAL_METHODS)
                   if cls.models[0] > 1 and cls is not DecodeConfig().method_class}

def decode_slots(value: str) -> int:
    """ADAFUSE_DECODE_SLOTS: how many decodes run at once, a whole number from 1."""
    if not value.strip().isdigit() or int(value) < 1:
        raise ConfigError(f"ADAFUSE_DECODE_SLOTS={value!r} is invalid: set a whole number from 1 (decodes at once "
                          f"on this server), or unset it for {DEFAULT_CONCURRENCY}")
    return int(value)


# The app's models: every visitor's decodes share them (each loaded once; the least recently used unloaded for room)
MODELS = ModelRegistry()


@functools.cache
def slots() -> Slots:
    """The server's decoding slots, made at first use (the environment is read then, not at import):
    ADAFUSE_DECODE_SLOTS decodes at once, default many.DEFAULT_CONCURRENCY (the decodes in flight share each model's
    forwards, models/batching.py); more visitors wait in line for a slot with a measured estimate, up to DECODE_QUEUE
    handlers in Gradio's queue."""
    return Slots(decode_slots(os.environ.get("ADAFUSE_DECODE_SLOTS", str(DEFAULT_CONCURRENCY))))

DECODE_QUEUE = 16
ASSETS = Path(__file__).resolve().parents[1] / "assets"


def load_examples() -> list[dict]:
    return json.loads((ASSETS / "examples.json").read_text(encoding="utf-8"))


def validate_models(names) -> list[str]:
    names = [n.strip() for n in (names or []) if isinstance(n, str) and n.strip()]
    if not 2 <= len(names) <= 4:
        raise ConfigError(f"pick 2 to 4 base models (you picked {len(names)})")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{', '.join(twice)} is picked twice: an ensemble of a model with itself is that model "
                          "alone; pick different models (or place copies apart: MODEL@cpu, MODEL@cuda:0)")
    return names


def device_choices() -> list[str]:
    """What the "Device for all models" menu offers on this machine."""
    import torch
    n = torch.cuda.device_count()
    return ["default", "cpu", *(f"cuda:{i}" for i in range(n))] + (["auto"] if n else [])


def model_specs(names, device: str | None = None) -> list[str]:
    """`validate_models` and the app's policy (`public.Policy`: on a public server only the operator's models, no
    device of the visitor's), then `@DEVICE` added to each name that does not place itself (`MODEL@cuda:1`);
    "default" or None adds nothing. A bad device or dtype raises ModelLoadError here, before any model loads."""
    names, rules = validate_models(names), public.policy()
    for n in names:
        rules.check_model(n)
    rules.check_device(device)
    out = []
    for n in names:
        if device and device != "default" and parse_spec(n)[1] is None and not is_served_spec(n):
            n = f"{n}@{device}"
        parse_spec(n)
        out.append(n)
    return out


# short headers: the table sits in the settings column (a model's source and how it loaded: the Load button says)
LOADED_COLUMNS = {"model": "model", "device": "device", "dtype": "dtype", "memory_mib": "MiB", "load_seconds": "load s"}


def compared(cfg: DecodeConfig, label: str) -> DecodeConfig:
    """The page's settings for the comparison `label` (a method of COMPARE_METHODS): a method that weighs nothing
    (token-union, the mixture) runs without the page's gate, which it would refuse or ignore."""
    method = COMPARE_METHODS[label]["method"]
    weighs = from_spec(method)[0].weighted
    return replace(cfg, method=method, **({} if weighs else {"gate": ""}))


def loaded_frame(models=None):
    """The loaded models (most recently used first) as a table; `models`: objects with `.info()`."""
    import pandas as pd
    rows = [lm.info() for lm in (MODELS.loaded() if models is None else models)]
    return pd.DataFrame([{LOADED_COLUMNS[k]: r.get(k) for k in LOADED_COLUMNS} for r in rows],
                        columns=list(LOADED_COLUMNS.values()))


def unload(name: str | None) -> str:
    public.policy().check_unload()
    if not name:
        raise ConfigError("pick a loaded model to unload")
    if not MODELS.unload(name):
        return f"{name} is not loaded"
    return f"✓ unloaded {name} (its memory is freed once no decode in progress holds it)"


@dataclass
class Explorer:
    """What one browser session is looking at."""
    decoding: Decoding | None = None
    trace: Trace | None = None
    singles: dict[str, Trace] = field(default_factory=dict)
    others: dict[str, Trace] = field(default_factory=dict)   # other methods (and branches) on the same prompt
    branches: dict[str, tuple[int, int, Trace]] = field(default_factory=dict)  # label -> (round, candidate, trace)
    key: tuple | None = None           # (models, config, prompt) of the decode in progress
    eval_rows: list[dict] = field(default_factory=list)     # the last evaluation batch
    opened: str | None = None          # the trace on view came from a file or an evaluation (its label), not a decode
    panel: str = ""                    # HTML about the opened evaluation example (its question, answers, divergences)
    live_config: DecodeConfig | None = None  # settings moved during a Run: the run applies them from its next round
    export_dir: str | None = None
    running: bool = False              # a Run is in flight (Step is refused, Cancel asks it to stop)
    cancel_requested: bool = False     # Cancel pressed: the run stops after the round (or single decode) under way
    confirm_key: tuple | None = None   # a change that would discard the decode in progress, awaiting a second press
    trust_remote_code: bool = False    # the page's "Trust remote code" switch: models whose repo ships Python may run it
    replaced_by: "Explorer | None" = None  # Reset made a fresh session: a run still ending here must show that one
    deadline: float | None = None      # time.monotonic() by which the decodes holding a slot stop (`hold_slot`)
    guard: SessionLock = field(default_factory=SessionLock, repr=False, compare=False)  # this session's own

    @property
    def pending(self):
        return self.decoding.pending if self.decoding is not None and not self.decoding.done else None

    @property
    def trusted(self) -> bool:
        """The "Trust remote code" switch, if this server lets visitors turn it on (`remote_code_allowed`)."""
        if self.trust_remote_code and not remote_code_allowed():
            raise ConfigError("this server does not run code shipped in model repositories (ADAFUSE_ALLOW_REMOTE_CODE"
                              " is off, the default on a public Space): untick Trust remote code, or pick a model "
                              "that needs none")
        return self.trust_remote_code

    def _get(self, name: str):
        public.policy().check_model(name)  # also the names a loaded trace gives (its tokens, a branch)
        return MODELS.get(name, trust_remote_code=self.trusted)

    def claim(self) -> bool:
        """A press that decodes (Run, Step, Branch) takes the session, or finds it taken (False): the test and the
        take are one step, so two quick presses start one decode."""
        with self.guard:
            if self.running:
                return False
            self.running, self.cancel_requested = True, False
            return True

    def models(self, names, device: str | None = None) -> list:
        """The page's models, loaded (or as loaded already) on `device`."""
        return [self._get(n) for n in model_specs(names, device)]

    def plan(self, names, cfg: DecodeConfig, prompt: str, device: str | None = None,
             step: bool = False) -> tuple[str, str]:
        """What a Run or Step would do with these inputs: ("continue", changed live settings), ("new", ""), or
        ("confirm", what changed) when it would throw away an unfinished decode, ("finished", "") when a Step
        (`step`) would start the finished decode over; a second press confirms."""
        names = model_specs(names, device)
        key = (tuple(names), cfg, prompt)
        d = self.decoding
        if self.opened and self.trace is not None and key != self.confirm_key:
            self.confirm_key = key
            return "replace", self.opened
        if step and d is not None and d.done and d.trace.rounds and key != self.confirm_key:
            self.confirm_key = key
            return "finished", ""
        if d is None or d.done or not d.trace.rounds and d.pending is None or key == self.confirm_key:
            return "new", ""
        old_names, old_cfg, old_prompt = self.key
        what = [label for label, same in (("the models", tuple(names) == old_names), ("the prompt", prompt == old_prompt))
                if not same]
        old, new = old_cfg.to_dict(), cfg.to_dict()
        what += [_SETTING_NAMES.get(k, k) for k in new if k not in LIVE_SETTINGS and new[k] != old[k]]
        if what:
            self.confirm_key = key
            return "confirm", " and ".join(what)
        live = [f"{_SETTING_NAMES.get(k, k)} {old[k]} → {new[k]}" for k in LIVE_SETTINGS if new[k] != old[k]]
        self.confirm_key = None
        return "continue", ", ".join(live)

    def request_cancel(self) -> bool:
        """Cancel: a running Run stops after the round under way (True: it renders the end itself). The decode is
        kept as it is, unfinished: Step or Run continues from its words (Reset or a new prompt starts over)."""
        if self.running:  # the run's own thread stops between rounds: never under a phase in progress
            self.cancel_requested = True
            return True
        return False

    def load(self, names, device: str | None = None) -> str:
        return "\n".join(f"✓ {lm.describe()}" for *_, lm, _ in self.load_each(names, device) if lm is not None)

    def load_each(self, names, device: str | None = None):
        """Load the models one by one, for a cold start that shows which model it is on: yields (position from 1,
        count, spec, None, 0.0) before each model and (…, the model, seconds it took) after it (a model already
        loaded comes back at once)."""
        specs = model_specs(names, device)
        for i, n in enumerate(specs, 1):
            yield i, len(specs), n, None, 0.0
            t0 = time.perf_counter()
            lm = self._get(n)
            yield i, len(specs), n, lm, time.perf_counter() - t0

    def begin(self, names, cfg: DecodeConfig, prompt: str, resume: bool, device: str | None = None) -> Decoding:
        """Continue the decode in progress when only live settings changed (they apply from its next round), else
        start a new one. Callers that must not discard unfinished work ask `plan` first."""
        names = model_specs(names, device)
        key = (tuple(names), cfg, prompt)
        d = self.decoding
        if resume and d is not None and not d.done and self.key is not None and key[0] == self.key[0] \
                and prompt == self.key[2]:
            try:
                d.reconfigure(cfg)
                self.key, self.confirm_key = key, None
                return d
            except ConfigError:
                pass  # a setting that needs a new decode
        models = [self._get(n) for n in names]
        self.decoding = AdaFuse(models, cfg).start(prompt)
        self.trace, self.singles, self.others, self.key, self.confirm_key = self.decoding.trace, {}, {}, key, None
        self.branches, self.opened, self.live_config, self.panel = {}, None, None, ""
        return self.decoding

    def offer_live(self, cfg: DecodeConfig) -> tuple[list[str], bool]:
        """Settings moved while a Run decodes: the live ones (LIVE_SETTINGS) wait in `live_config` for the run to
        apply them from its next round; the others cannot change mid-decode. Returns (the names of those that cannot,
        whether a live change waits now)."""
        base = self.key[1]
        old, new = base.to_dict(), cfg.to_dict()
        fixed = [_SETTING_NAMES.get(k, k) for k in new if k not in LIVE_SETTINGS and new[k] != old[k]]
        live = replace(base, **{k: getattr(cfg, k) for k in LIVE_SETTINGS})
        with self.guard:
            self.live_config = live if live != base else None
            return fixed, self.live_config is not None

    def apply_live(self, d: Decoding) -> str:
        """Between two rounds of a Run: apply the settings moved meanwhile (`live_config`) from the next round;
        what changed, in words ("" when nothing did; a setting this decode cannot take says why instead)."""
        with self.guard:
            cfg, self.live_config = self.live_config, None
        if cfg is None or d.done:
            return ""
        old = self.key[1].to_dict()
        try:
            changed = d.reconfigure(cfg)
        except ConfigError as exc:
            return f"not applied: {exc}"
        self.key = (self.key[0], cfg, self.key[2])
        return ", ".join(f"{_SETTING_NAMES.get(k, k)} {old[k]} → {v}" for k, v in changed.items())

    def hold_slot(self, seconds: float = DEFAULT_DEADLINE_S) -> None:
        """This visitor took a decoding slot: its decodes may hold it `seconds` (the server's --timeout default), then
        each stops before its next round (`past_deadline`)."""
        self.deadline = time.monotonic() + seconds

    def past_deadline(self, d: Decoding) -> bool:
        """The slot's time is up: `d` stops here, keeping what it decided, its stop reason "deadline"."""
        if self.deadline is None or time.monotonic() <= self.deadline:
            return False
        d.cancel(StopReason.DEADLINE)
        return True

    def _finish(self, d: Decoding) -> Trace | None:
        """Run `d` to its end (or the slot's deadline) unless Cancel is pressed (then None)."""
        while not d.done and not self.past_deadline(d):
            if self.cancel_requested:
                d.cancel()
                return None
            d.step()
        return d.trace

    def decode(self, names, cfg: DecodeConfig, prompt: str, seconds: float = DEFAULT_DEADLINE_S) -> Trace:
        """A whole decode of the scripting API (`/decode`): the models as the page gets them, stopped before its next
        round once `seconds` have passed (its stop reason "deadline"), as the page's decodes and `adafuse serve`'s."""
        self.hold_slot(seconds)
        return self._finish(AdaFuse(self.models(names), cfg).start(prompt))

    def run_others(self, names, cfg: DecodeConfig, prompt: str, labels, device: str | None = None):
        models = self.models(names, device)
        for label in labels or []:
            trace = self._finish(AdaFuse(models, compared(cfg, label)).start(prompt))
            if trace is None:
                return
            self.others[label] = trace
            yield label

    def run_singles(self, names, cfg: DecodeConfig, prompt: str, device: str | None = None):
        for n in model_specs(names, device):
            lm = self._get(n)
            label = lm.name if lm.name not in self.singles else n  # the model's name; its spec when it repeats
            trace = self._finish(AdaFuse([lm], replace(cfg, method=Greedy.name, weights=())).start(prompt))
            if trace is None:
                return
            self.singles[label] = trace
            yield label

    def _trace_models(self) -> list:
        """The models of the trace on view: this session's specs when it decoded it, else the names it records."""
        t = self.trace
        if t is None:
            raise ConfigError("nothing to look into yet: Run or Step a decode, or load a trace")
        names = list(self.key[0]) if self.key and self.decoding is not None and self.decoding.trace is t \
            else list(t.models)
        return [self._get(n) for n in names]

    def branch(self, round_index, candidate):
        """A counterfactual decode of the trace on view: the same rounds up to `round_index`, then `candidate` of
        that round's pool, then on to the end. Yields (label, decoding) after each round; the branch joins
        `others` (side by side with the original) and `branches` (marked in the tree)."""
        r, c = _index(round_index, "round"), _index(candidate, "candidate")
        trace = self.trace
        if trace is not None and 0 <= r < len(trace.rounds) and c == trace.rounds[r].chosen:
            raise ConfigError(f"candidate {c} is what round {r} already chose: a branch from it is the decode on view; "
                              "pick another candidate of that round")
        models = self._trace_models()
        d = branch_from(models, trace, r, c)
        picked = trace.rounds[r].candidates[c]
        label = f"branch at round {r}: {candidate_label(picked.text, picked.eos)}"
        self.branches[label] = (r, c, d.trace)
        self.others[label] = d.trace
        yield label, d
        while not d.done and not self.past_deadline(d):
            if self.cancel_requested:
                d.cancel()
                break
            d.step()
            yield label, d

    def tokens(self, round_index, candidate) -> list[dict]:
        """How each model tokenized and scored a candidate of the trace on view (`adafuse.explain.token_view`)."""
        r, c = _index(round_index, "round"), _index(candidate, "candidate")
        return token_view(self._trace_models(), self.trace, r, c)

    def load_trace(self, path: str) -> Trace:
        trace = Trace.load(path)
        self.decoding, self.trace, self.singles, self.others, self.key = None, trace, {}, {}, None
        self.branches, self.opened, self.panel = {}, f"the loaded trace ({Path(path).name})", ""
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
        with tempfile.TemporaryDirectory(prefix="adafuse-eval-") as out:  # the rows are kept; the files are not
            evaluate(TASKS[task_name], runs, Path(out), limit=int(limit), base=base, progress=True,
                     trust_remote_code=self.trusted, registry=MODELS)  # the models the rest of the page uses
            self.eval_rows = load_results(Path(out))
        return self.eval_rows

    def open_example(self, line: int, method: str) -> dict[str, dict]:
        """Put an evaluated example on view: `method`'s trace, each single model's own decode beside it and the
        other methods' answers; returns its rows ({method: row})."""
        methods = analysis.example_rows(self.eval_rows, line)
        trace, singles, others = analysis.split(methods, method)
        self.decoding, self.trace, self.singles, self.others, self.key = None, trace, singles, others, None
        self.branches, self.opened = {}, f"example {line} / {method} of the evaluation"
        return methods

    def export_examples(self, rows: list[dict] | None = None) -> str | None:
        """The evaluation's per-example table as CSV, where the download button serves it from."""
        if not (rows or self.eval_rows):
            return None
        return str(analysis.write_csv(rows or self.eval_rows, Path(self._export_dir()) / "adafuse-examples.csv"))

    def _export_dir(self) -> str:
        if self.export_dir is None:
            self.export_dir = tempfile.mkdtemp(prefix="adafuse-")
        return self.export_dir

    def export(self) -> str | None:
        """Write the current trace where the download button serves it from (one folder per session)."""
        if self.trace is None:
            return None
        out = Path(self._export_dir()) / "adafuse-trace.json"
        self.trace.save(out)
        return str(out)


def _index(value, what: str) -> int:
    """A round or candidate number typed in the page: a whole number ≥ 0."""
    if value is None or isinstance(value, bool) or not float(value).is_integer() or value < 0:
        raise ConfigError(f"the {what} must be a whole number from 0 (got {value!r})")
    return int(value)


_SETTING_NAMES = {"tau": "τΔ", "max_words": "M", "branches": "B", "diversity": "diverse exploration",
                  "max_new_words": "Max new words", "max_new_tokens": "Max new tokens", "mode": "the prompt mode",
                  "stop": "the stop strings", "method": "the method", "system": "the system prompt",
                  "thinking": "the thinking switch", "exploration": "exploration", "explore_lambda": "λ",
                  "weights": "the weights", "gate": "the gate"}

STOPS = {"max_new_words": "reached Max new words", "max_new_tokens": "reached Max new tokens (raise it to go on)",
         "eos": "the answer ended", "stop string": "a stop string", "context full": "a model's context window is full",
         "no progress": "no model could add text", "cancelled": "cancelled", "deadline": "the time limit"}


def stop_note(trace: Trace) -> str:
    """Why the decode stopped, in words, and which model read a chat prompt as a plain transcript (it has no chat
    template)."""
    reason = trace.stop_reason or ""
    note = f"stop: {STOPS.get(reason, reason)}"
    plain = transcript_readers(trace)
    if plain:
        note += (f" · {', '.join(plain)} {'has' if len(plain) == 1 else 'have'} no chat template: read as a "
                 "User/Assistant transcript")
    return note


def friendly(exc: BaseException) -> str:
    """A message for the page: typed errors as they are, anything else without a stack trace."""
    if isinstance(exc, AdafuseError):
        return str(exc)
    name = type(exc).__name__
    if "OutOfMemory" in name or "out of memory" in str(exc).lower():
        return "the device ran out of memory: pick smaller models, fewer branches (B) or a shorter prompt"
    return f"something went wrong ({name}: {str(exc)[:200]}); the app is still running — try again or Reset"
