"""The model type shared by local and served models: its name, tokenizer facts and how it opens a view of a decode."""
from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ..errors import PromptError

# Stop-string sets whose token sets a model keeps (`stop_token_ids`; each a scan of the vocabulary to recompute): a
# bound, since each visitor's prompt may bring its own stop strings.
STOP_SETS_KEPT = 64
_NOT_LOOKED_UP = False  # `LoadedModel._decoder` before its first use (None: it has none; a singleton survives copies)


def backend_decoder(tokenizer) -> object | None:
    """The `tokenizers` object a transformers fast tokenizer decodes with, when its class keeps the library's own
    `decode` and `_decode` (which, with no special tokens skipped and no clean-up, return the backend's decode as it
    is); else None (a slow or custom tokenizer: its own `decode` runs)."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: the wrapper it has
        return None
    cls = type(tokenizer)
    if not isinstance(tokenizer, TokenizersBackend) or cls.decode is not TokenizersBackend.decode or \
            cls._decode is not TokenizersBackend._decode:
        return None
    return getattr(tokenizer, "_tokenizer", None)


@dataclass(eq=False, kw_only=True)
class LoadedModel(ABC):
    """A ready-to-decode model (weights here or on a server), its tokenizer and the facts the decoder needs about
    them. Compared by identity: two loads of one checkpoint are two models."""
    name: str
    tokenizer: object
    add_bos: bool                     # prepend BOS to the rendered prompt
    end_ids: frozenset[int]           # tokens that end the answer: EOS ids and the chat template's end of turn
    max_positions: int | None         # context window, if the config says
    load_seconds: float = 0.0
    source: str = ""
    notes: list[str] = field(default_factory=list)  # how it was loaded (a conversion, the CPU kernels chosen)
    banned_ids: frozenset[int] = frozenset()  # other special tokens: never proposed
    # One thread at a time in the tokenizer: a fast tokenizer may refuse concurrent calls ("Already borrowed"), and a
    # model serves several decodes at once (the app's users, a mixture's catch-ups in the background).
    tokenizer_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _texts: list[str] | None = field(default=None, init=False, repr=False)  # vocab_texts(), computed once
    _stop_ids: dict[tuple[str, ...], frozenset[int]] = field(default_factory=dict, init=False, repr=False)
    _stop_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)  # evicting from it
    _decoder: object = field(default=_NOT_LOOKED_UP, init=False, repr=False)  # `decode`'s backend (None: none)

    # ---- where it computes ----
    @property
    @abstractmethod
    def device(self):
        """Where its input ids and log-prob vectors live here (a torch.device)."""

    @property
    @abstractmethod
    def devices(self) -> list[str]:
        """Every place computing part of the model (devices, or a server)."""

    @property
    def forwards(self) -> str:
        """How its forwards run, where it matters to its numbers ("" : as usual)."""
        return ""

    def placement(self) -> str:
        """Where it computes, as a trace records it: its devices, and how its forwards run where that is unusual."""
        return ", ".join(self.devices) + (f" ({self.forwards})" if self.forwards else "")

    @property
    @abstractmethod
    def dtype(self):
        """The weights' dtype (a torch.dtype), or "served"."""

    @property
    @abstractmethod
    def memory_bytes(self) -> int:
        """Bytes of weights and buffers held here."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Rows of the model's output: the length of every log-prob vector."""

    @abstractmethod
    def open_view(self, prompt: str, mode: str = "raw", stop: tuple[str, ...] = (), system: str = "",
                  thinking: bool | None = None, history: tuple = ()):
        """This model's `ModelView` of one decode of `prompt` (rendered in `mode`: "raw" or "chat"; in chat mode after
        the conversation `history`, `DecodeConfig.history`)."""

    def expect(self, rider) -> None:
        """A decode (its `Rider`, models/batching.py) starts using this model: models that gather many decodes'
        forwards wait for its first one too. Others ignore it."""

    # ---- tokenizer facts ----
    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def tokenize(self, text: str, offsets: bool = False):
        """Token ids of `text` without special tokens; with `offsets`, the encoding with its offset_mapping."""
        with self.tokenizer_lock:
            if offsets:
                return self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            return self.tokenizer(text, add_special_tokens=False).input_ids

    def tokenize_many(self, texts: list[str]) -> list[list[int]]:
        """`tokenize` of each text, in one call of the tokenizer (the same ids: a fast tokenizer encodes one text as
        a batch of one)."""
        if not texts:
            return []
        with self.tokenizer_lock:
            return self.tokenizer(list(texts), add_special_tokens=False).input_ids

    def check_fits(self, prompt_tokens: int) -> None:
        """Raise PromptError when a prompt of this many tokens leaves no room in the context window."""
        if self.max_positions and prompt_tokens >= self.max_positions:
            raise PromptError(f"the prompt is {prompt_tokens} tokens for {self.name}, whose context holds "
                              f"{self.max_positions}: shorten it (fewer few-shot examples)")

    def decode(self, ids: list[int]) -> str:
        """Token ids to text byte for byte: special tokens kept, no clean-up of spaces before punctuation. A fast
        tokenizer's Rust backend decodes directly where the Python wrapper adds nothing for these arguments
        (`backend_decoder`; a decode calls this for every token its exploration writes)."""
        if self._decoder is _NOT_LOOKED_UP:
            self._decoder = backend_decoder(self.tokenizer)
        with self.tokenizer_lock:
            if self._decoder is not None:
                return self._decoder.decode(ids, skip_special_tokens=False)
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
        with the end tokens they are the one event "the answer ends here". Computed once per stop set (the last
        STOP_SETS_KEPT sets are kept)."""
        stops = tuple(sorted(set(stops)))
        if not stops:
            return frozenset()
        ids = self._stop_ids.get(stops)
        if ids is None:
            ids = frozenset(t for t, txt in enumerate(self.vocab_texts()) if txt.startswith(stops)
                            and t not in self.banned_ids)
            with self._stop_lock:
                self._stop_ids[stops] = ids
                while len(self._stop_ids) > STOP_SETS_KEPT:  # the oldest set goes first
                    del self._stop_ids[next(iter(self._stop_ids))]
        return ids

    def end_strings(self) -> list[str]:
        """The text of each end token (a span containing one, written as text by another model, is cut there)."""
        return sorted({self.decode([i]) for i in self.end_ids} - {""})

    # ---- facts for people ----
    def describe(self) -> str:
        return (f"{self.name} on {', '.join(self.devices)} ({str(self.dtype).replace('torch.', '')}, "
                f"{self.memory_bytes / 2**20:,.0f} MiB), loaded in {self.load_seconds:.1f}s")

    def info(self) -> dict:
        """Plain facts for tables: name, device, dtype, memory, load time, source, notes (how it was loaded)."""
        return {"model": self.name, "device": ", ".join(self.devices), "dtype": str(self.dtype).replace("torch.", ""),
                "memory_mib": round(self.memory_bytes / 2**20, 1), "load_seconds": round(self.load_seconds, 1),
                "source": self.source, "notes": "; ".join([*self.notes, self.forwards] if self.forwards else self.notes)}


def tokenizer_adds_bos(tokenizer) -> bool:
    """The tokenizer puts its BOS token first when it encodes text."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer("").input_ids
    return bool(ids) and ids[0] == bos


# added tokens that read as text even when not marked special: runs of whitespace and HTML-like tags (<table>,
# <think>); any other added token is a control marker (a GGUF's user-defined <start_of_image> or [multimodal])
_TEXT_LIKE = re.compile(r"\s+|</?[A-Za-z][A-Za-z0-9]*>")


def special_ids(tokenizer, vocab: int) -> set[int]:
    """Every special token of the tokenizer inside a vocabulary of `vocab` rows: those marked special, and added tokens
    that are control markers although not marked (a GGUF's user-defined tokens such as <start_of_image>, which a raw
    prompt can otherwise make the model repeat)."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        content = getattr(tok, "content", "")
        if getattr(tok, "special", False) or (content and not _TEXT_LIKE.fullmatch(content)):
            ids.add(i)
    return {i for i in ids if i is not None and 0 <= i < vocab}


_END_OF_TURN = re.compile(r"end|eot", re.IGNORECASE)


def end_ids(eos, tokenizer, vocab: int) -> set[int]:
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
