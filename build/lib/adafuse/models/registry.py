"""Loaded models shared by whoever holds the registry: each loaded once, the least recently used unloaded for room."""
from __future__ import annotations

import gc
import json
import os
import threading
import time
from pathlib import Path

import torch

from .base import LoadedModel
from .batching import Runtime
from .local import default_device, default_dtype, load_model
from .memory import free_unused_memory
from .served import load_served
from .specs import is_served_spec, parse_spec


class ModelRegistry:
    """Models by (name, device, dtype, trust_remote_code), each loaded once even under concurrency. When a model does
    not fit (out of memory, or RAM/GPU memory shows it will not), the least recently used other models on its device
    are unloaded first. The registry owns its models and what they hold (their prefix stores, their measurements):
    an app or a command line makes one; library calls without one share `default_registry()`.

    `loader(name, device, dtype, trust_remote_code) -> LoadedModel` loads a model that is not served (default
    `load_model`: an HF id, a folder, a .gguf file or a bundled name); an app under test swaps in its own. `runtime`
    (models/batching.py: the condition the models' batchers wait on, the CPU's turn, the batchers' caps) is what its
    local models share while decodes run; two registries share nothing but the machine."""

    def __init__(self, loader=load_model, runtime: Runtime | None = None):
        self.loader = loader
        self.runtime = runtime or Runtime()
        self._models: dict[tuple, LoadedModel] = {}
        self._locks: dict[tuple, threading.Lock] = {}   # one per key: a model loads once however many ask at once
        self._used: dict[tuple, float] = {}             # last use of each loaded model (least recently used goes first)
        self._guard = threading.Lock()

    def get(self, name: str, device: str | None = None, dtype=None, trust_remote_code: bool = False) -> LoadedModel:
        """The model `name` names, loaded on first use. `name` may carry its placement (`parse_spec`);
        `device`/`dtype` arguments fill in what it does not say. A served spec (`vllm:…`) connects to its server."""
        if is_served_spec(name):  # a model on an inference server: nothing to place here, nothing to make room for
            key, size = (name.strip(), "server", None, False), lambda: None
            load = lambda: load_served(name)  # noqa: E731
        else:
            name, spec_device, spec_dtype = parse_spec(name)
            device = str(spec_device or device or default_device())
            device = "cuda:0" if device == "cuda" else device  # one key per place: cuda is cuda:0
            dtype = spec_dtype or dtype or default_dtype(device)
            key = (name, device, str(dtype).replace("torch.", ""), trust_remote_code)
            # the bytes it will take (None, unknown: load, and make room only if it runs out of memory)
            size = lambda: _estimate_bytes(name, dtype)  # noqa: E731
            load = lambda: self.loader(name, device, dtype, trust_remote_code)  # noqa: E731
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._models:
                try:
                    self._models[key] = self._load(key, size, load)
                except BaseException:
                    with self._guard:  # a name that failed keeps no lock (else every typo a visitor made would)
                        self._locks.pop(key, None)
                    raise
            self._used[key] = time.monotonic()
            return self._models[key]

    def _load(self, key: tuple, size, load) -> LoadedModel:
        """Load a model not loaded yet, making room first when its size is known (`size()` reads its files) and
        again if it runs out of memory."""
        need = size()
        if need is not None:
            self._make_room(key, need)
        try:
            lm = load()
        except torch.OutOfMemoryError:
            if not self._make_room(key, None):
                raise
            lm = load()
        if hasattr(lm, "runtime"):  # a local model: its batcher (made at its first forward) joins this runtime
            lm.runtime = self.runtime
        return lm

    def unload(self, lm: LoadedModel | str) -> bool:
        """Forget a loaded model (by object or name): its memory is freed once no decode in progress holds it."""
        with self._guard:
            keys = [k for k, v in self._models.items()
                    if v is lm or (isinstance(lm, str) and (v.name == lm or k[0] == lm))]
            for k in keys:
                self._models.pop(k, None)
                self._used.pop(k, None)
        if not keys:
            return False
        gc.collect()
        free_unused_memory()
        return True

    def loaded(self) -> list[LoadedModel]:
        """Loaded models, most recently used first."""
        with self._guard:
            return [self._models[k] for k in sorted(self._models, key=lambda k: -self._used.get(k, 0.0))]

    def _make_room(self, key: tuple, need: int | None) -> bool:
        """Unload least recently used models on the same device until `need` bytes fit (None: unload one). True when
        something was unloaded."""
        device = key[1]
        freed = False
        while True:
            free = _free_bytes(device)
            if need is not None and (free is None or free >= need * 1.2):
                return freed
            with self._guard:
                others = sorted((k for k in self._models if k != key and k[1] == device),
                                key=lambda k: self._used.get(k, 0.0))
            if not others:
                return freed
            self.unload(self._models[others[0]])
            freed = True
            if need is None:
                return True


# The registry of library calls that give none: the one object here that holds state (its models and runtime), as
# a process's default logger or random generator does
_DEFAULT = ModelRegistry()


def default_registry() -> ModelRegistry:
    """The registry of library calls that name models without giving one (`get_model`, `AdaFuse(["name", …])`)."""
    return _DEFAULT


def get_model(name: str, device: str | None = None, dtype=None, trust_remote_code: bool = False) -> LoadedModel:
    """`default_registry().get(...)`: each (name, device, dtype) loaded once and shared (see `ModelRegistry.get`)."""
    return _DEFAULT.get(name, device, dtype, trust_remote_code)


def loaded_models() -> list[LoadedModel]:
    """`default_registry().loaded()`: its models, most recently used first."""
    return _DEFAULT.loaded()


def unload_model(lm: LoadedModel | str) -> bool:
    """`default_registry().unload(lm)`: forget a model of the default registry."""
    return _DEFAULT.unload(lm)


def _estimate_bytes(name: str, dtype) -> int | None:
    """Weight bytes a local model folder will take (its safetensors on disk, scaled to the target dtype); None when
    unknown (Hub ids, GGUF files: an out-of-memory error then triggers the eviction)."""
    path = Path(name).expanduser()
    files = list(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        return None
    size = sum(f.stat().st_size for f in files)
    try:
        config = json.loads((path / "config.json").read_text())
        stored = config.get("dtype") or config.get("torch_dtype") or "float32"
    except (OSError, ValueError):
        stored = "float32"
    target = str(dtype or "float32").replace("torch.", "")
    width = {"float32": 4, "bfloat16": 2, "float16": 2}
    return size * width.get(target, 4) // width.get(str(stored), 4)


def _free_bytes(device: str) -> int | None:
    if str(device).startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free
    if str(device) == "cpu" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None
    return None
