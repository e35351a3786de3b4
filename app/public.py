"""Public mode: on a server strangers can reach (a Hugging Face Space, a `--share` link, a host beyond loopback) a
visitor picks only what the operator allows — the models of ADAFUSE_MODELS, the inference servers of ADAFUSE_SERVERS —
may not unload a model or move one to another device, and is held to a prompt length, a word cap and a number of
decodes a minute. The page's handlers and the scripting API ask the same `Policy`; a refusal is a typed error
(`NotAllowedError`) that says what the operator can set to allow it. On one's own machine nothing here applies."""
from __future__ import annotations

import ipaddress
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping

from adafuse import BUNDLED, DEFAULT_PAIR, PAPER_MODELS
from adafuse.errors import ConfigError
from adafuse.models import is_served_spec
from adafuse.models.specs import SERVED_SPEC

WINDOWS_PATH = re.compile(r"^[A-Za-z]:[\\/]")
PRIVATE_HINT = "start the app with --private on a machine whose visitors you trust"


class NotAllowedError(ConfigError):
    """A visitor asked a public server for something its operator has not allowed; the message says what the
    operator can set to allow it."""


def default_models() -> tuple[str, ...]:
    """What a public server offers unless ADAFUSE_MODELS says otherwise: the bundled pair by name and the models of
    README's front matter (the bundled models' Hub ids and the paper's models)."""
    return tuple(dict.fromkeys([*DEFAULT_PAIR, *BUNDLED, *(b["hub"] for b in BUNDLED.values()), *PAPER_MODELS]))


def server_url(url: str) -> str:
    """A server's base URL as a served model reaches it (`models/served.py`): no trailing slash, ending in /v1."""
    url = url.strip().rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def loopback(host: str | None) -> bool:
    """`host` (what the app listens on) is reachable from this machine only."""
    h = (host or "").strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:  # a host name, or nothing: reachable from wherever it resolves
        return False


def _whole(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{name}={value!r} is invalid: set a whole number from 1, or unset it for {default}")
    return int(value)


def _listed(env: Mapping[str, str], name: str) -> tuple[str, ...] | None:
    """A list the operator set (comma- or line-separated), None when unset."""
    if name not in env:
        return None
    return tuple(dict.fromkeys(x.strip() for x in env[name].replace("\n", ",").split(",") if x.strip()))


@dataclass(frozen=True)
class Policy:
    """What this app lets its visitors do. Private (the default): anything, as on one's own machine."""
    # strangers can reach this server: the lists and limits below hold
    public: bool = False
    # why it is public, in words ("SPACE_ID is set", "--share", "--host 0.0.0.0", "--public")
    why: str = ""
    # model specs a visitor may pick, exactly as written (ADAFUSE_MODELS)
    models: tuple[str, ...] = field(default_factory=default_models)
    # base URLs of inference servers whose models a visitor may pick as vllm:URL#NAME (ADAFUSE_SERVERS)
    servers: tuple[str, ...] = ()
    # the longest prompt (or question) a visitor may send, in characters (ADAFUSE_MAX_PROMPT_CHARS)
    max_prompt_chars: int = 6000
    # the most words one decode may write (ADAFUSE_MAX_NEW_WORDS)
    max_new_words: int = 100
    # decodes a visitor may start in any minute; an evaluation counts one per example (ADAFUSE_DECODES_PER_MINUTE)
    decodes_per_minute: int = 10

    @classmethod
    def from_env(cls, public: bool | None = None, why: str = "", host: str | None = None, share: bool = False,
                 env: Mapping[str, str] | None = None) -> "Policy":
        """The policy of an app launched on `host` (`share`: with a gradio.live link), `public` forced on or off
        (None: decided here), its lists and limits from the environment. Public when SPACE_ID is set or the app
        is reachable beyond this machine."""
        env = os.environ if env is None else env
        host = env.get("GRADIO_SERVER_NAME", "127.0.0.1") if host is None else host
        if public is None:
            reasons = [("SPACE_ID is set (a Hugging Face Space)", bool(env.get("SPACE_ID"))), ("--share", share),
                       (f"--host {host}", not loopback(host))]
            why = next((w for w, on in reasons if on), "")
            public = bool(why)
        servers = tuple(dict.fromkeys(server_url(u) for u in _listed(env, "ADAFUSE_SERVERS") or ()))
        for url in servers:
            if not SERVED_SPEC.match(f"vllm:{url}"):
                raise ConfigError(f"ADAFUSE_SERVERS holds {url!r}, not a server's base URL: write "
                                  "http://HOST:PORT/v1, several separated by commas")
        models = _listed(env, "ADAFUSE_MODELS")
        return cls(public=public, why=why, models=default_models() if models is None else models, servers=servers,
                   max_prompt_chars=_whole(env, "ADAFUSE_MAX_PROMPT_CHARS", cls.max_prompt_chars),
                   max_new_words=_whole(env, "ADAFUSE_MAX_NEW_WORDS", cls.max_new_words),
                   decodes_per_minute=_whole(env, "ADAFUSE_DECODES_PER_MINUTE", cls.decodes_per_minute))

    def check_model(self, spec: str) -> None:
        """A model a visitor named: in public mode one of the operator's list, or a model on one of its servers;
        no local path, no placement of the visitor's own, nothing the server would read or reach otherwise. Checked
        from the text alone, before anything is looked up (no file is even tested for existence)."""
        if not self.public or not isinstance(spec, str) or spec.strip() in self.models:
            return
        spec = spec.strip()
        listed = f"pick one of {', '.join(self.models)}" if self.models else "this server lists no models"
        if is_served_spec(spec):
            m = SERVED_SPEC.match(spec)
            if m is None or server_url(m["url"]) not in self.servers:
                url = server_url(m["url"]) if m else spec
                raise NotAllowedError(f"{url} is not an inference server of this public app: {listed}, or ask "
                                      "the operator to add the server's base URL to ADAFUSE_SERVERS")
            if m["tok"] is not None:
                raise NotAllowedError("?tokenizer= would read a tokenizer from a path on this public server: leave "
                                      "it out (the server says where its tokenizer is), or ask the operator to add "
                                      "the whole spec to ADAFUSE_MODELS")
            return
        name, at, place = spec.rpartition("@")
        if at and name.strip() in self.models:
            raise NotAllowedError(f"where {name.strip()} runs is the operator's on this public server: pick it "
                                  f"without @{place.strip()}, or ask the operator to add {spec!r} to ADAFUSE_MODELS")
        if spec.startswith(("/", "~", ".", "\\")) or spec.lower().endswith(".gguf") or WINDOWS_PATH.match(spec):
            raise NotAllowedError(f"{spec!r} looks like a path: this public server loads no files a visitor names "
                                  f"({listed}); the operator can add it to ADAFUSE_MODELS")
        raise NotAllowedError(f"{spec!r} is not one of this public server's models: {listed}, or ask the operator "
                              "to add it to ADAFUSE_MODELS")

    def check_device(self, device: str | None) -> None:
        """The "Device for all models" menu: the operator's on a public server (it would move every visitor's)."""
        if self.public and device not in (None, "", "default"):
            raise NotAllowedError(f"the device for all models is the operator's on this public server (other "
                                  f"visitors' models run there): leave it at default, or {PRIVATE_HINT}")

    def check_unload(self) -> None:
        if self.public:
            raise NotAllowedError(f"unloading a model is the operator's on this public server (other visitors may be "
                                  f"decoding with it): {PRIVATE_HINT} to allow it")

    def check_prompt(self, text: str | None, what: str = "the prompt") -> None:
        n = len(text or "")
        if self.public and n > self.max_prompt_chars:
            raise NotAllowedError(f"{what} has {n:,} characters: this public server takes up to "
                                  f"{self.max_prompt_chars:,} (the operator sets ADAFUSE_MAX_PROMPT_CHARS)")

    def check_words(self, words: int | None) -> None:
        if self.public and words is not None and words > self.max_new_words:
            raise NotAllowedError(f"Max new words {words} is over this public server's limit of "
                                  f"{self.max_new_words} a decode: ask for fewer (the operator sets "
                                  "ADAFUSE_MAX_NEW_WORDS)")

    def summary(self) -> str:
        """What a visitor of this public server may do, for the page."""
        servers = f"; models on {', '.join(self.servers)} as vllm:URL#NAME" if self.servers else ""
        return (f"**Public server** ({self.why or 'public mode'}): models from the operator's list{servers}; "
                f"prompts up to {self.max_prompt_chars:,} characters, up to {self.max_new_words} words a decode, "
                f"{self.decodes_per_minute} decodes a minute per visitor. Models load on first use.")


class Visitors:
    """The decodes each visitor started in the last `window` seconds, to hold them to a number a minute."""

    def __init__(self, window: float = 60.0, clock=time.monotonic):
        self.window, self.clock = window, clock
        self._lock = threading.Lock()
        self._started: dict[str, deque[float]] = {}

    def charge(self, who: str, n: int, per_minute: int) -> None:
        """Count `n` decodes for `who` now, or refuse them all (NotAllowedError) when they would pass `per_minute`
        within the window; a refused try counts nothing."""
        with self._lock:
            now = self.clock()
            for key in [k for k, q in self._started.items() if not q or q[-1] <= now - self.window]:
                del self._started[key]  # visitors idle for a window are forgotten
            started = self._started.setdefault(who, deque())
            while started and started[0] <= now - self.window:
                started.popleft()
            if n > per_minute:
                raise NotAllowedError(f"this asks for {n} decodes at once (an evaluation counts one per example): "
                                      f"this public server allows {per_minute} a minute per visitor; ask for fewer "
                                      "(the operator sets ADAFUSE_DECODES_PER_MINUTE)")
            if len(started) + n > per_minute:
                wait = started[len(started) + n - per_minute - 1] + self.window - now
                raise NotAllowedError(f"you started {len(started)} decodes in the last minute: this public server "
                                      f"allows {per_minute} a minute per visitor; try again in {max(1, round(wait))} s "
                                      "(the operator sets ADAFUSE_DECODES_PER_MINUTE)")
            started.extend([now] * n)


def visitor(request=None) -> str:
    """Who is asking, for the per-visitor limits: the login name (--auth), else the address the request came from (on
    a Space the first X-Forwarded-For address: the Space's proxy stands between), else the browser session. `request`:
    Gradio's, by default the one of the event being handled (Gradio keeps it while a handler runs); none (a script
    calling the handlers, a test) is this machine."""
    if request is None:
        from gradio.context import LocalContext
        request = LocalContext.request.get(None)
    if request is None:
        return "this machine"
    if getattr(request, "username", None):
        return f"user {request.username}"
    headers = getattr(request, "headers", None) or {}
    forwarded = (headers.get("x-forwarded-for") or "").split(",")[0].strip() if os.environ.get("SPACE_ID") else ""
    client = getattr(request, "client", None)
    address = forwarded or getattr(client, "host", None)
    return f"address {address}" if address else f"session {getattr(request, 'session_hash', None)}"


def remote_code_allowed() -> bool:
    """Whether visitors may tick "Trust remote code" (which runs a model repository's Python on this server):
    ADAFUSE_ALLOW_REMOTE_CODE=1/0; unset, yes on one's own machine and no on a public server (a Hugging Face Space,
    SPACE_ID set, or any other), where anyone who opens the page could otherwise run any repository's code there."""
    flag = os.environ.get("ADAFUSE_ALLOW_REMOTE_CODE", "").strip().lower()
    if flag:
        return flag in ("1", "true", "yes", "on")
    return not (os.environ.get("SPACE_ID") or policy().public)


_configured: Policy | None = None
VISITORS = Visitors()  # every visitor's recent decodes, for the app's one policy


def configure(rules: Policy | None) -> Policy:
    """Make `rules` the app's policy (app.py does at launch, before the page is built); None goes back to reading it
    from the environment when asked."""
    global _configured
    _configured = rules
    return policy()


def policy() -> Policy:
    """The app's policy: the one `configure` set, else the environment's now (public on a Space)."""
    return _configured if _configured is not None else Policy.from_env()


def admit(prompt: str | None = None, words: int | None = None, decodes: int = 1, what: str = "the prompt") -> None:
    """Before a visitor's decode waits for a slot: in public mode its prompt and word cap within the limits, then
    `decodes` counted against the visitor's decodes a minute (0: a press that continues a decode counted already)."""
    rules = policy()
    if not rules.public:
        return
    rules.check_prompt(prompt, what)
    rules.check_words(words)
    if decodes:
        VISITORS.charge(visitor(), decodes, rules.decodes_per_minute)


def fit_page(ui, rules: Policy) -> None:
    """The page of a public server, before it is first drawn: the model picker offers the operator's list, the device
    menu and Unload are shown but the operator's, and the models panel says what a visitor may do here."""
    if not rules.public:
        return
    ui.models.choices = [(m, m) for m in rules.models]
    ui.models.label = "Base models (2–4 of this server's list)"
    ui.models.info = ("This public server loads the models its operator listed" +
                      (" and models on its servers: vllm:URL#NAME." if rules.servers else "."))
    ui.device.interactive = False
    ui.device.info = "Set by the operator on this public server."
    ui.unload_pick.interactive = ui.unload_btn.interactive = False
    ui.load_status.value = rules.summary()
