"""Per-browser-session state and the actions behind the buttons (no layout here)."""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from adafuse import AdaFuse, DecodeConfig, Decoding, Trace, get_model, greedy
from adafuse.errors import AdafuseError, ConfigError

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
    key: tuple | None = None           # (models, config, prompt) of the decode in progress

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
        self.trace, self.singles, self.key = self.decoding.trace, {}, key
        return self.decoding

    def run_singles(self, names, cfg: DecodeConfig, prompt: str):
        for n in validate_models(names):
            self.singles[n] = greedy(get_model(n), prompt, cfg)
            yield n

    def load_trace(self, path: str) -> Trace:
        trace = Trace.load(path)
        self.decoding, self.trace, self.singles, self.key = None, trace, {}, None
        return trace

    def export(self) -> str | None:
        if self.trace is None:
            return None
        out = Path(tempfile.mkdtemp(prefix="adafuse-")) / f"adafuse-trace-{len(self.trace.rounds)}rounds.json"
        self.trace.save(out)
        return str(out)


def friendly(exc: BaseException) -> str:
    """A message for the page: typed errors as they are, anything else without a stack trace."""
    if isinstance(exc, AdafuseError):
        return str(exc)
    name = type(exc).__name__
    if "OutOfMemory" in name or "out of memory" in str(exc).lower():
        return "the device ran out of memory: pick smaller models, fewer branches (B) or a shorter prompt"
    return f"something went wrong ({name}: {str(exc)[:200]}); the app is still running — try again or Reset"
