"""OpenAI requests as the server reads them, and each turned into one decode: its prompt and its settings."""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field

from ..config import DecodeConfig
from ..errors import ConfigError
from ..many import MAX_BRANCHES
from ..method_registry import own_settings
from .responses import ApiError

# Settings a request may change through its `adafuse` object (and any method's own, e.g. span_words: `overrides()`);
# the rest are fixed when the server starts.
OVERRIDES = ("tau", "max_words", "branches", "diversity", "weights", "gate", "method", "speculate", "draft_lookup",
             "normalize", "allow_empty", "max_new_words")
MAX_STOPS = 4  # as OpenAI's API
# settings a request sets through OpenAI's own fields: an error about one names the field
REQUEST_FIELDS = {"stop": "stop", "max_new_tokens": "max_tokens"}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Request(BaseModel):
    # Fields of OpenAI's API that a fused decode has no use for (temperature, top_p, seed, user, ...) are accepted and
    # ignored: the decode is deterministic, so clients that always send them work unchanged. Those with a range in
    # OpenAI's API are held to it (a 400 naming the field, as OpenAI answers), so a typo is not silently ignored.
    model_config = ConfigDict(extra="allow")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = None
    n: int = 1
    adafuse: dict[str, Any] | None = None  # per-request settings (OVERRIDES) and "trace": true


class CompletionRequest(_Request):
    prompt: str | list[str]
    logprobs: int | None = None  # how many alternatives per round (0 to 5), as the completions API counts them
    echo: bool = False
    suffix: str | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None


class ChatRequest(_Request):
    messages: list[Message]
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None


@dataclass(frozen=True)
class Job:
    """One request as a decode: what to decode, with which settings, and what the response carries."""
    prompt: str
    config: DecodeConfig
    chat: bool
    stream: bool = False
    usage_chunk: bool = False        # streamed: a last chunk with the usage (stream_options.include_usage)
    logprobs: int | None = None      # None: no logprobs; else how many of each round's candidates to list
    trace: bool = False              # the response carries the decode's trace (`adafuse_trace`)


@dataclass(frozen=True)
class Limits:
    """What the server lets a request ask for."""
    name: str                                            # the one model a request may name
    members: int                                         # how many models the ensemble has (one weight each)
    gates: Mapping[str, str] = field(default_factory=dict)  # gate files a request may name, by name
    max_tokens: int | None = None                        # the most tokens a request may ask for (--max-tokens)
    max_branches: int = MAX_BRANCHES                     # the most candidates a model may explore (--max-branches)


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def check_model(name: str, limits: Limits) -> None:
    """The one name a request may give a model. A request names no member, path, device or server: the members are
    loaded when the server starts (`--models`), so a Hub id, a folder or a `vllm:` spec here loads and reaches
    nothing."""
    if name != limits.name:
        raise ApiError(404, f"the model {name!r} does not exist: this server serves one model, {limits.name!r} "
                            "(GET /v1/models lists it); its members are the operator's (adafuse serve --models)",
                       param="model", code="model_not_found")


def _settings(req: _Request, base: DecodeConfig, limits: Limits, max_tokens: int | None,
              cap_field: str = "max_tokens") -> tuple[DecodeConfig, bool]:
    """The request's decode settings (the server's, with the request's stop strings, token cap — sent as
    `cap_field` — and `adafuse` overrides) and whether it asks for the trace."""
    ext = dict(req.adafuse or {})
    want_trace = ext.pop("trace", False)
    if not isinstance(want_trace, bool):
        raise bad(f"adafuse.trace={want_trace!r} is invalid: use true or false", "adafuse.trace")
    allowed = (*OVERRIDES, *own_settings())
    unknown = sorted(set(ext) - set(allowed))
    if unknown:
        raise bad(f"adafuse.{unknown[0]} is not a setting a request can change: use {', '.join(allowed)} "
                  "(the others are fixed when the server starts)", f"adafuse.{unknown[0]}")
    if "gate" in ext:
        gate = ext["gate"]
        if gate not in ("", *limits.gates):
            named = (f"one of {', '.join(repr(g) for g in limits.gates)}" if limits.gates else
                     "start the server with --gate or --gate-dir to offer some")
            raise bad(f"adafuse.gate={gate!r} is not a gate of this server: use \"\" (no gate) or {named}",
                      "adafuse.gate")
        ext["gate"] = limits.gates.get(gate, "")
    changes: dict[str, Any] = dict(ext)
    if "weights" in changes and not isinstance(changes["weights"], list):
        raise bad(f"adafuse.weights={changes['weights']!r} is invalid: give a list of numbers, one per model",
                  "adafuse.weights")
    if req.stop is not None:
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop)
        if len(stops) > MAX_STOPS:
            raise bad(f"stop has {len(stops)} strings: give at most {MAX_STOPS}", "stop")
        changes["stop"] = tuple(stops)
    if max_tokens is not None:
        check_max_tokens(max_tokens, limits, cap_field)
        changes["max_new_tokens"] = max_tokens
    try:
        config = DecodeConfig.of(base, **changes)
        config.check_models(limits.members)
    except (ConfigError, TypeError, ValueError) as exc:
        # the library's messages start with the setting: "tau=2 is invalid: ...", "weights has 3 values ..."
        m = re.match(r"(\w+)(?:=| has )", str(exc))
        param = REQUEST_FIELDS.get(m.group(1), f"adafuse.{m.group(1)}") if m else None
        message = str(exc) if not m or m.group(1) not in REQUEST_FIELDS else \
            REQUEST_FIELDS[m.group(1)] + str(exc)[len(m.group(1)):]
        raise bad(message, param) from exc
    if config.branches > limits.max_branches:
        raise bad(f"adafuse.branches={config.branches} is over this server's limit of {limits.max_branches} "
                  "(adafuse serve --max-branches): ask for fewer", "adafuse.branches")
    return config, want_trace


def check_max_tokens(value: int, limits: Limits, name: str = "max_tokens") -> None:
    """A request's token cap within the range this server takes: 1 to its limit (--max-tokens, by default the
    smallest context window of the members). Without a limit the library's own range holds (DecodeConfig says it)."""
    high = limits.max_tokens
    if high is None or 1 <= value <= high:
        return
    what = f"over this server's limit of {high} tokens" if value > high else "invalid"
    raise bad(f"{name}={value} is {what}: use a whole number from 1 to {high} (this server's limit: adafuse serve "
              "--max-tokens, by default the smallest context window of the members)", name)


def _common(req: _Request, limits: Limits) -> None:
    check_model(req.model, limits)
    if req.n != 1:
        raise bad(f"n={req.n} is unsupported: the fused decode is deterministic, so ask for n=1 (send the request "
                  "again for another answer with other adafuse settings)", "n")
    if req.stream_options is not None and not req.stream:
        raise bad("stream_options needs stream=true", "stream_options")


def completion_job(req: CompletionRequest, base: DecodeConfig, limits: Limits, trace_query: bool = False) -> Job:
    """A /v1/completions request as a decode of its prompt as is (raw mode)."""
    _common(req, limits)
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    if len(prompts) != 1:
        raise bad(f"prompt holds {len(prompts)} prompts: send one prompt per request (requests run concurrently)",
                  "prompt")
    if req.echo:
        raise bad("echo=true is unsupported: the members tokenize the prompt each their own way, so the ensemble has no "
                  "per-token log-probabilities of it to echo (what lm-eval's local-completions asks for loglikelihood). "
                  "Score text with lm-eval's `--model adafuse` (python -m adafuse lm-eval run --model adafuse "
                  "--model_args models=A+B ...) or AdaFuse.score in Python", "echo", code="scoring_unsupported")
    if req.suffix:
        raise bad("suffix is unsupported: the ensemble decodes left to right only", "suffix")
    if req.logprobs is not None and not 0 <= req.logprobs <= 5:
        raise bad(f"logprobs={req.logprobs} is invalid: use 0 to 5 (the candidates listed per round)", "logprobs")
    if not prompts[0].strip():
        raise bad("the prompt is empty: send some text", "prompt")
    config, want_trace = _settings(req, replace(base, mode="raw"), limits, req.max_tokens)
    return Job(prompts[0], config, chat=False, stream=req.stream,
               usage_chunk=bool(req.stream_options and req.stream_options.include_usage),
               logprobs=req.logprobs, trace=want_trace or trace_query)


def _text(m: Message, at: int) -> str:
    if isinstance(m.content, str) or m.content is None:
        return m.content or ""
    if any(p.type != "text" for p in m.content):
        raise bad("only text content parts are supported: the members read text", f"messages.{at}.content")
    return "".join(p.text or "" for p in m.content)


def chat_prompt(messages: list[Message]) -> tuple[str, str | None, tuple[tuple[str, str], ...]]:
    """The last user message, the system message (None: the server's) and the conversation before the last user
    message of a chat request. Each member renders them with its own chat template (chat mode): the ensemble writes
    the next assistant message."""
    system = None
    rest = list(enumerate(messages))
    if rest and rest[0][1].role in ("system", "developer"):
        system = _text(rest[0][1], 0)
        rest = rest[1:]
    _check_turns(rest, had_system=system is not None)
    at, user = rest[-1]
    text = _text(user, at)
    if not text.strip():
        raise bad("the last user message is empty: send some text", f"messages.{at}.content")
    return text, system, tuple((m.role, _text(m, i)) for i, m in rest[:-1])


_A = {"user": "a user", "assistant": "an assistant"}
TURNS = ("send an optional system message, then user and assistant messages taking turns, ending with the user's "
         "(the ensemble writes the next assistant message)")


def _check_turns(turns: list[tuple[int, Message]], had_system: bool) -> None:
    """The messages after the optional system message take turns, user first and last; else a 400 that says which
    message is wrong and why, and what a conversation looks like."""
    for k, (i, m) in enumerate(turns):
        want = ("user", "assistant")[k % 2]
        if m.role == want:
            continue
        if m.role in ("system", "developer"):
            why = f"a {m.role} message may only come first"
        elif m.role in ("tool", "function"):
            why = f"{m.role} messages are unsupported (this server calls no tools)"
        else:
            why = f"{_A[want]} message was expected there"
        raise bad(f"messages[{i}] is {_A.get(m.role, 'a ' + m.role)} message, but {why}: {TURNS}",
                  f"messages.{i}.role")
    if not turns:
        what = "hold only a system message" if had_system else "are empty"
        raise bad(f"messages {what}, so there is nothing to answer: {TURNS}", "messages")
    if turns[-1][1].role != "user":
        i = turns[-1][0]
        raise bad(f"the last message (messages[{i}]) is the assistant's, but a conversation sent for a reply ends "
                  f"with the user's: {TURNS}", f"messages.{i}.role")


def chat_job(req: ChatRequest, base: DecodeConfig, limits: Limits, trace_query: bool = False) -> Job:
    """A /v1/chat/completions request as a decode in chat mode (each member's own chat template)."""
    _common(req, limits)
    prompt, system, history = chat_prompt(req.messages)
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= 20:
        raise bad(f"top_logprobs={req.top_logprobs} is invalid: use 0 to 20", "top_logprobs")
    if req.top_logprobs is not None and not req.logprobs:
        raise bad("top_logprobs needs logprobs=true", "top_logprobs")
    chat_base = replace(base, mode="chat", system=base.system if system is None else system, history=history)
    cap_field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    config, want_trace = _settings(req, chat_base, limits, getattr(req, cap_field), cap_field)
    return Job(prompt, config, chat=True, stream=req.stream,
               usage_chunk=bool(req.stream_options and req.stream_options.include_usage),
               logprobs=(req.top_logprobs or 0) if req.logprobs else None, trace=want_trace or trace_query)
