"""Models served by an inference engine (vLLM, or any server of the OpenAI completions API with vLLM's extensions)."""
from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import ModelLoadError, ServerError
from ..view import Branch
from .base import LoadedModel, end_ids, special_ids, tokenizer_adds_bos
from .gguf import META
from .specs import SERVED_SPEC
from .tokenized import TokenizedView

TOP_K = 20          # next-token log-probs asked for (vLLM's default --max-logprobs)
TIMEOUT = 60.0      # seconds one request may take
RETRIES = 3         # connection errors are retried this many times, with a short pause
MAX_IDS = 128       # vLLM's cap on logprob_token_ids per request
LOOKAHEAD = 8       # greedy tokens generated with each top-k request (a confident span reads them without asking)


class Endpoint:
    """One server: JSON over HTTP with timeouts, retries on connection errors, and typed errors."""

    def __init__(self, url: str, timeout: float = TIMEOUT, retries: int = RETRIES):
        self.url = url.rstrip("/")                       # .../v1
        self.root = re.sub(r"/v1$", "", self.url)        # where /tokenize lives
        self.timeout, self.retries = timeout, retries
        self.pool = ThreadPoolExecutor(16, thread_name_prefix="adafuse-http")

    def call(self, path: str, payload: dict | None = None, base: str | None = None) -> dict:
        url = (base or self.url) + path
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as exc:  # the server answered: a request it cannot serve
                body = exc.read().decode(errors="replace")[:300]
                raise ServerError(f"{url} refused the request ({exc.code}): {body}") from exc
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
                if attempt == self.retries:
                    reason = getattr(exc, "reason", exc)
                    raise ServerError(f"the server at {self.url} does not answer ({reason}): check that it runs and "
                                      "is reachable, or pick another model") from exc
                time.sleep(0.2 * 2 ** attempt)
        raise AssertionError("unreachable")

    def many(self, path: str, payloads: list[dict]) -> list[dict]:
        """Send every payload at once; answers in order (the first error is raised after all returned)."""
        if len(payloads) == 1:
            return [self.call(path, payloads[0])]
        futures = [self.pool.submit(self.call, path, p) for p in payloads]
        out, error = [], None
        for f in futures:
            try:
                out.append(f.result())
            except Exception as exc:  # noqa: BLE001 - re-raised once every request returned
                error = error or exc
                out.append({})
        if error is not None:
            raise error
        return out


@dataclass(eq=False, kw_only=True)
class ServedModel(LoadedModel):
    """A model on a server: the tokenizer here, the weights there.

    A spec `vllm:http://HOST:PORT/v1#SERVED-NAME` (the name may be left out when the server serves one model) loads a
    `ServedModel`: the tokenizer runs here (loaded from the folder or Hub id the server reports as the model's `root`,
    or `vllm:URL#NAME?tokenizer=PATH`), checked against the server's `/tokenize` on load; every forward pass is a
    `/v1/completions` request that sends token ids and reads log-probs keyed by token id:

    - the next-token distribution after some ids: `logprobs=k` (the server's top-k, k ≤ 20 unless it runs with
      `--max-logprobs`); every other token reads as log-prob -inf (never proposed; margins need the top 2 only). Each
      such request generates `LOOKAHEAD` greedy tokens with their top-k: a confident span or an explored branch that
      follows them (the usual case) reads its next distributions from that answer instead of asking again;
    - the log-prob of given tokens there (`logprob_token_ids`): a candidate's next token, or the model's end tokens for
      a candidate that ends the answer — exact, whatever their rank;
    - the requests of one call (every branch, every scored position) go out at once; the server batches them and its
      prefix cache holds the shared prompt.

    `ServedSession` is the `ModelView` of such a model: the decoder, the trace and the views do not know the difference.
    """
    endpoint: Endpoint = field(repr=False)
    served: str                       # the server's name for it
    url: str                          # .../v1
    vocab: int                        # rows of its output
    top_k: int = TOP_K
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # guards the views' counters

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # where log-prob vectors live here

    @property
    def devices(self) -> list[str]:
        return [f"server {self.url}"]

    @property
    def dtype(self) -> str:
        return "served"

    @property
    def memory_bytes(self) -> int:
        return 0

    @property
    def vocab_size(self) -> int:
        return self.vocab

    def describe(self) -> str:
        return f"{self.name} served at {self.url} (model {self.served!r}), connected in {self.load_seconds:.1f}s"

    def open_view(self, prompt: str, mode: str = "raw", stop: tuple[str, ...] = (), system: str = "",
                  thinking: bool | None = None, history: tuple = ()) -> "ServedSession":
        return ServedSession(self, prompt, mode, stop, system, thinking, history)

    def ask(self, contexts: list[list[int]], wanted: list[list[int] | None], view: "ServedSession | None" = None,
            ahead: int = 1) -> list[torch.Tensor]:
        """For each context, a (V,) log-prob vector after it: the server's top-k (`wanted` None) or exactly the
        log-probs of the `wanted` tokens; every other entry -inf. A top-k request generates `ahead` greedy tokens:
        the distributions along that continuation are kept in `view.fetched`, so following it costs no request; the
        requests are charged to `view`."""
        payloads, owner = [], []
        for k, (ctx, want) in enumerate(zip(contexts, wanted)):
            base = {"model": self.served, "prompt": ctx, "max_tokens": 1, "temperature": 0.0,
                    "return_tokens_as_token_ids": True}
            if want is None:
                payloads.append({**base, "logprobs": self.top_k, "max_tokens": ahead})
                owner.append(k)
            for lo in range(0, len(want or []), MAX_IDS):  # the server takes at most MAX_IDS ids a request
                chunk = list(want[lo: lo + MAX_IDS])
                payloads.append({**base, "logprobs": len(chunk), "logprob_token_ids": chunk})
                owner.append(k)
        t0 = time.perf_counter()
        answers = self.endpoint.many("/completions", payloads)
        out = [torch.full((self.vocab,), float("-inf")) for _ in contexts]
        fed = cached = 0
        for k, p, a in zip(owner, payloads, answers):
            choice = a["choices"][0]
            tops = (choice.get("logprobs") or {}).get("top_logprobs") or [{}]
            vecs = [out[k]] + [torch.full((self.vocab,), float("-inf")) for _ in tops[1:]]
            for vec, top in zip(vecs, tops):
                for key, value in (top or {}).items():
                    vec[int(key.split(":", 1)[1])] = max(float(value), -1e30)
            if view is not None and len(vecs) > 1:  # the greedy continuation: vecs[j] follows ctx + generated[:j]
                generated = choice.get("token_ids") or [int(t.split(":", 1)[1]) for t in choice["logprobs"]["tokens"]]
                ctx = list(p["prompt"])
                for j in range(1, len(vecs)):
                    ctx.append(generated[j - 1])
                    view.fetched[tuple(ctx)] = vecs[j]
            usage = a.get("usage") or {}
            fed += usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
            cached += ((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        if view is not None:
            with self.lock:
                view.forward_passes += len(payloads)
                view.tokens_fed += fed - cached
                view.cached += cached
                view.seconds += time.perf_counter() - t0
        return out


def load_served(spec: str) -> ServedModel:
    """Connect to a served model (see the module doc for the spec); checks the tokenizer and the features used."""
    from transformers import AutoTokenizer
    m = SERVED_SPEC.match(spec.strip())
    if not m:
        raise ModelLoadError(f"{spec!r} is not a served-model spec: write vllm:http://HOST:PORT/v1#SERVED-NAME")
    t0 = time.perf_counter()
    url = m["url"] if m["url"].endswith("/v1") else m["url"] + "/v1"
    ep = Endpoint(url)
    models = ep.call("/models").get("data", [])
    names = [x.get("id") for x in models]
    served = m["name"] or (names[0] if len(names) == 1 else None)
    if served not in names:
        raise ModelLoadError(f"{url} serves {', '.join(map(str, names)) or 'no model'}; name one after '#': "
                             f"vllm:{url}#{names[0] if names else 'NAME'}")
    info = next(x for x in models if x.get("id") == served)
    source = m["tok"] or info.get("root") or served
    folder = Path(str(source))
    # a folder this library converted (a bundled GGUF) says how its tokenizer loads and whether BOS goes first
    meta = json.loads((folder / META).read_text()) if (folder / META).exists() else {}
    try:
        if meta.get("fast_tokenizer"):
            from transformers import PreTrainedTokenizerFast
            tok = PreTrainedTokenizerFast.from_pretrained(folder)
        else:
            tok = AutoTokenizer.from_pretrained(source, local_files_only=folder.exists())
    except Exception as exc:  # noqa: BLE001 - many kinds
        raise ModelLoadError(f"cannot load the tokenizer of {served!r} from {source!r} ({str(exc).splitlines()[0]}): "
                             f"give one with vllm:{url}#{served}?tokenizer=PATH") from exc
    probe = "Hello world: 123 — ünïcödé 🙂\n  end."
    theirs = ep.call("/tokenize", {"model": served, "prompt": probe, "add_special_tokens": False}, base=ep.root)
    ours = tok(probe, add_special_tokens=False).input_ids
    if theirs.get("tokens") != ours:
        raise ModelLoadError(f"the tokenizer loaded from {source!r} does not match the server's for {served!r} "
                             f"({ours[:8]}… vs {theirs.get('tokens', [])[:8]}…): give the right one with ?tokenizer=PATH")
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").exists() else {}
    config = config.get("text_config", config)
    vocab = config.get("vocab_size") or max(len(tok), max(tok.get_vocab().values()) + 1)  # the model's output size
    eos = json.loads((folder / "generation_config.json").read_text()).get("eos_token_id") \
        if (folder / "generation_config.json").exists() else config.get("eos_token_id")
    end = frozenset(end_ids(eos, tok, vocab))
    add_bos = meta["add_bos"] if "add_bos" in meta else tokenizer_adds_bos(tok)
    lm = ServedModel(name=f"{served}@server", tokenizer=tok, add_bos=add_bos, end_ids=end,
                     max_positions=info.get("max_model_len"), source=f"{url}#{served}",
                     banned_ids=frozenset(special_ids(tok, vocab) - end), endpoint=ep, served=served, url=url,
                     vocab=vocab)
    # the features the decoder uses, asked once: top-k by id and log-probs of chosen tokens
    try:
        lm.ask([[ours[0]]], [None])
        lm.ask([[ours[0]]], [sorted(end)[:1] or [ours[0]]])
    except ServerError as exc:
        raise ModelLoadError(f"{url}#{served} lacks a feature the decoder needs ({exc}): serve it with vLLM ≥ 0.11 "
                             f"and --max-logprobs ≥ {TOP_K}") from exc
    lm.load_seconds = time.perf_counter() - t0
    return lm


class ServedBranch(Branch):
    def __init__(self, s: "ServedSession", rows: int):
        self.s, self.rows = s, [[] for _ in range(rows)]

    def step(self, tokens: list[int]) -> torch.Tensor:
        for row, t in zip(self.rows, tokens):
            row.append(t)
        return torch.stack(self.s.after([self.s.ids + r for r in self.rows]))

    def keep(self, rows: list[int]) -> None:
        self.rows = [list(self.rows[i]) for i in rows]

    def remember(self, rows: list[tuple[int, list[int], torch.Tensor]]) -> None:
        for _, tokens, logprobs in rows:
            self.s.adoptable[tuple(tokens)] = logprobs


class ServedSession(TokenizedView):
    """A served model's view: the committed ids here, every distribution asked of the server (see the module doc).
    `next_logprobs` and `end_logprobs` hold the server's top-k (the rest -inf)."""
    whole = False

    def __init__(self, lm: ServedModel, prompt: str, mode: str = "raw", stop: tuple[str, ...] = (), system: str = "",
                 thinking: bool | None = None, history: tuple = ()):
        super().__init__(lm, prompt, mode, stop, system, thinking, history)
        self.cached = 0  # prompt tokens the server reported from its prefix cache
        self.spec: list[int] = []
        self.fetched: dict[tuple[int, ...], torch.Tensor] = {}  # distributions along greedy continuations fetched
        self.next_logprobs = self.end_logprobs = self.after([self.ids])[0]
        self.prefix_reused = self.cached  # prompt tokens the server's prefix cache already held
        self.adoptable: dict[tuple[int, ...], torch.Tensor] = {}

    def after(self, contexts: list[list[int]]) -> list[torch.Tensor]:
        """Top-k after each context: from a greedy continuation already fetched, else asked (with a look-ahead)."""
        out: list[torch.Tensor | None] = [self.fetched.get(tuple(c)) for c in contexts]
        todo = [i for i, v in enumerate(out) if v is None]
        if todo:
            for i, v in zip(todo, self.lm.ask([contexts[i] for i in todo], [None] * len(todo), self, LOOKAHEAD)):
                out[i] = v
        return out

    # ---- forward passes (requests) ----
    def extend(self, token: int) -> torch.Tensor:
        self.spec.append(token)
        self.end_logprobs = self.after([self.ids + self.spec])[0]
        return self.end_logprobs

    def rewind(self) -> None:
        self.spec, self.end_logprobs = [], self.next_logprobs

    def branch(self, rows: int) -> ServedBranch:
        return ServedBranch(self, rows)

    def score_rows(self, start: int, rows: list[list[int]], remember: list[bool],
                   wanted: list[dict[int, list[int]]] | None = None) -> list[torch.Tensor]:
        """Exactly the wanted log-probs (every entry when `wanted` is None: top-k), plus the top-k after rows that
        may be committed next; one request per entry, all at once."""
        contexts, asks, where = [], [], []
        for i, r in enumerate(rows):
            entries = wanted[i] if wanted is not None else {j: None for j in range(len(r))}
            for j, ids in sorted(entries.items()):
                contexts.append(self.ids[:start] + r[: j + 1]), asks.append(ids), where.append((i, j))
            if remember[i] and (wanted is None or len(r) - 1 not in entries or entries[len(r) - 1] is not None):
                contexts.append(self.ids[:start] + r), asks.append(None), where.append((i, len(r) - 1))
        vecs = self.lm.ask(contexts, asks, self) if contexts else []
        out = [torch.full((len(r), self.lm.vocab), float("-inf")) for r in rows]
        for (i, j), v in zip(where, vecs):
            out[i][j] = torch.maximum(out[i][j], v)
        for i, r in enumerate(rows):
            if remember[i] and start == len(self.ids):
                self.adoptable[tuple(r)] = out[i][-1]
        return out

    def next_exact(self, tokens: list[int]) -> torch.Tensor:
        missing = [t for t in tokens if self.next_logprobs[t] == float("-inf")]
        if not missing:
            return self.next_logprobs
        return torch.maximum(self.next_logprobs, self.lm.ask([self.ids], [missing], self)[0])

    def commit(self, y: str, guess: str = "") -> None:
        new = self.encode(y)
        tail = tuple(new[len(self.ids):]) if new[: len(self.ids)] == self.ids else None
        if self.spec and new == self.ids + self.spec:
            self.next_logprobs = self.end_logprobs
        elif tail in self.adoptable:
            self.next_logprobs = self.adoptable[tail]
        else:
            self.next_logprobs = self.after([new])[0]
        self.end_logprobs = self.next_logprobs
        n = len(new)  # continuations of the new text stay useful; the rest is dropped
        self.fetched = {k: v for k, v in self.fetched.items() if len(k) > n and k[:n] == tuple(new)}
        self.ids, self.text, self.spec, self.adoptable = new, y, [], {}
        self._move_anchor()

    def stats(self) -> tuple[int, int, float, int]:
        return self.forward_passes, self.tokens_fed, self.seconds, self.cached

    def release(self) -> None:
        """The decode is over: let go of the distributions kept for later rounds (each a vocabulary-wide vector)."""
        self.fetched, self.adoptable, self.spec = {}, {}, []
        self.next_logprobs = self.end_logprobs = None
