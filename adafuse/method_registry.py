"""The decoding methods by name, each with its own frozen settings, and the specs that name a method with them.

A method class (adafuse/methods.py) has a `name` and a `Settings` frozen dataclass of its own settings
(`MethodSettings`: every field ranged and checked, the error naming it). The registry holds the built-in methods from
the start (`methods.BUILT_IN`) and any method added with `@register`. A spec is how a user names a method with
settings, in every entry point (the CLI, the evaluation harness, lm-eval's model_args, the server, the app,
`DecodeConfig.method`):

    "adafuse"   "fixed-span-2"   "mixture[seed=3,temperature=0.5]"   "token-union[union_top_k=10]"

`name-N` sets the method's `suffix` setting (fixed-span's span_words); brackets set any of its settings
(`parse_spec` reads that grammar for every entry point). `to_spec` writes the shortest spec back (settings at their
defaults left out), so equal settings have one spec.
"""
from __future__ import annotations

import re
from dataclasses import Field, fields
from typing import Any, Mapping

from .errors import ConfigError
from .methods import BUILT_IN, MethodSettings, setting

__all__ = ["METHODS", "MethodSettings", "canonical", "from_spec", "legacy", "method_class", "method_specs",
           "own_settings", "parse_spec", "register", "setting", "setting_names", "to_spec", "value"]

METHODS: dict[str, type] = {}  # name -> method class, in the order they registered
_SPEC = re.compile(r"^(?P<name>[a-z][a-z\-]*?)(?:-(?P<n>\d+))?(?:\[(?P<args>[^\]]*)\])?$")


def register(cls: type) -> type:
    """Class decorator: add a method to the registry under its `name` (once)."""
    if cls.name in METHODS:
        raise ValueError(f"method {cls.name!r} is registered twice")
    METHODS[cls.name] = cls
    return cls


for _built_in in BUILT_IN:
    register(_built_in)


def method_class(name: str) -> type:
    """The method registered as `name` (ConfigError naming the registered ones)."""
    if name not in METHODS:
        raise ConfigError(f"method={name!r} is invalid: use one of {', '.join(method_specs())}")
    return METHODS[name]


def setting_names() -> dict[str, list[str]]:
    """Every method's own setting -> the methods that have it."""
    return {name: [m for m, _ in owners] for name, owners in own_settings().items()}


def own_settings() -> dict[str, list[tuple[str, Field]]]:
    """Every method's own setting -> (method name, its field) for each method that has it."""
    out: dict[str, list[tuple[str, Field]]] = {}
    for name, cls in METHODS.items():
        for f in fields(cls.Settings):
            out.setdefault(f.name, []).append((name, f))
    return out


def value(raw: str):
    """A setting written as text: true/false (on/off, yes/no), a whole number, a number, else the text."""
    low = raw.strip().lower()
    if low in ("true", "on", "yes"):
        return True
    if low in ("false", "off", "no"):
        return False
    try:
        return int(low)
    except ValueError:
        try:
            return float(low)
        except ValueError:
            return raw.strip()


def parse_spec(spec: str) -> tuple[str, list[tuple[str, str]]]:
    """A spec's parts as written: the method (its name with any "-N": "fixed-span-2") and the settings in its brackets
    as (name, text) pairs, in order. ConfigError for text that is no spec or a setting without "=value"."""
    m = _SPEC.match(spec.strip()) if isinstance(spec, str) else None
    if m is None:
        raise ConfigError(f"method={spec!r} is invalid: use one of {', '.join(method_specs())}, optionally with its "
                          "settings in brackets, e.g. mixture[seed=3]")
    pairs = []
    for part in filter(None, (m.group("args") or "").split(",")):
        key, eq, raw = part.partition("=")
        if not eq:
            raise ConfigError(f"method={spec!r} is invalid: write its settings as name=value, e.g. "
                              f"{m.group('name')}[...=1]")
        pairs.append((key.strip(), raw))
    return spec.strip().partition("[")[0], pairs


def from_spec(spec: str, **given: Any) -> tuple[type, MethodSettings]:
    """The method class and its settings a spec names; `given` (a method's own settings by name, e.g. from a CLI flag
    or a request) override the spec's. ConfigError for an unknown method or a setting it does not have."""
    head, pairs = parse_spec(spec)
    name, _, n = head.rpartition("-")
    if not (n.isdigit() and getattr(METHODS.get(name), "suffix", None)):
        name, n = head, ""  # "adafuse-2": no such method, named as written
    cls = method_class(name)
    values: dict[str, Any] = {cls.suffix: int(n)} if n else {}
    values.update((key, value(raw)) for key, raw in pairs)
    values.update(given)
    own = {f.name for f in fields(cls.Settings)}
    for key, v in values.items():
        if key not in own:
            has = setting_names().get(key)
            raise ConfigError(f"{key}={v!r} is not a setting of method {cls.name!r}"
                              + (f" ({', '.join(has)} {'has' if len(has) == 1 else 'have'} it)" if has else "")
                              + (f": its own settings are {', '.join(sorted(own))}" if own
                                 else f"; {cls.name} has no settings of its own"))
    return cls, cls.Settings(**values)


def to_spec(cls: type, settings: MethodSettings) -> str:
    """The shortest spec of a method with these settings (`from_spec` reads it back)."""
    default = cls.Settings()
    changed = {f.name: getattr(settings, f.name) for f in fields(settings)
               if getattr(settings, f.name) != getattr(default, f.name) or f.name == cls.suffix}
    head = cls.name
    if cls.suffix:
        head += f"-{changed.pop(cls.suffix)}"
    args = ",".join(f"{k}={_text(v)}" for k, v in changed.items())
    return f"{head}[{args}]" if args else head


def _text(v) -> str:
    return repr(v) if isinstance(v, float) and v != int(v) else str(int(v) if isinstance(v, float) else v)


def canonical(spec: str, **given: Any) -> str:
    """A spec (with `given` settings) written the one way `to_spec` writes it."""
    return to_spec(*from_spec(spec, **given))


def legacy(settings: Mapping[str, Any]) -> str:
    """The method spec of a trace's or result row's settings, old or new: before methods owned their settings, a
    trace named the bare method and kept span_words, union_top_k, seed and temperature beside the others (every
    method's, at their defaults when unused); the method's own ones are folded into its spec, the rest dropped."""
    cls, _ = from_spec(settings.get("method", "adafuse"))
    own = {f.name for f in fields(cls.Settings)}
    return canonical(settings.get("method", "adafuse"), **{k: v for k, v in settings.items() if k in own})


def method_specs() -> list[str]:
    """Every method as the evaluation harness and the app name their runs (a method with a `suffix` setting by its
    `specs`, e.g. fixed-span-1 .. fixed-span-3)."""
    return [spec for name, cls in METHODS.items() for spec in (cls.specs or (name,))]

