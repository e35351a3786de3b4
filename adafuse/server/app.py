"""The FastAPI app of `adafuse serve`: one fused ensemble as one model behind OpenAI's completions and chat API."""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator, Mapping

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException

from ..decoder import Decoding
from ..ensemble import AdaFuse
from ..errors import AdafuseError, ConfigError, PromptError, ServerError
from ..many import DEFAULT_CONCURRENCY, DEFAULT_DEADLINE_S, MAX_BRANCHES
from ..trace import Trace
from .requests import ChatRequest, CompletionRequest, Job, Limits, chat_job, completion_job
from .responses import ApiError, Chunks, body, new_id, settled
from .slots import DecodeSlots, Overloaded, Run

log = logging.getLogger("adafuse.server")
DISCONNECT_POLL_S = 0.5  # how often a non-streamed request checks that its client is still there


@dataclass(frozen=True)
class ServeSettings:
    # the model name clients send and GET /v1/models lists
    name: str = "adafuse"
    # requests must send `Authorization: Bearer <api_key>` (None: no key needed)
    api_key: str | None = None
    # decodes at once (their forwards shared at the models' batchers); more wait in the queue
    concurrency: int = DEFAULT_CONCURRENCY
    # requests that may wait for a decode slot; past that a request gets 429 with Retry-After
    queue: int = 32
    # gate files a request may pick by name in `adafuse.gate` ("" turns the gate off)
    gates: Mapping[str, str] = field(default_factory=dict)
    # the most tokens a request may ask for (None: the smallest context window of the members)
    max_tokens: int | None = None
    # the most candidates a request may have an uncertain model explore (adafuse.branches)
    max_branches: int = MAX_BRANCHES
    # seconds one decode may run; then it stops before its next round, its answer cut ("length"; None: no limit)
    timeout: float | None = DEFAULT_DEADLINE_S


def error_for(exc: BaseException) -> ApiError:
    """What a client is told about an error of its decode: the library's own message for errors it raises on
    purpose, never a stack trace."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, (ConfigError, PromptError)):
        return ApiError(400, str(exc), param="prompt" if isinstance(exc, PromptError) else None)
    if isinstance(exc, ServerError):
        return ApiError(503, str(exc), type="server_error", code="member_unavailable")
    if isinstance(exc, AdafuseError):
        return ApiError(500, str(exc), type="server_error")
    log.error("decode failed", exc_info=exc)
    return ApiError(500, f"internal error ({type(exc).__name__}); the server's log has the details",
                    type="server_error")


def _data(obj: dict | str) -> dict:
    return {"data": obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, allow_nan=False)}


def build_app(ensemble: AdaFuse, settings: ServeSettings | None = None) -> FastAPI:
    """The server of `ensemble` (its models and its config: the settings every request starts from)."""
    settings = settings or ServeSettings()
    slots = DecodeSlots(settings.concurrency, settings.queue)
    windows = [lm.max_positions for lm in ensemble.models if lm.max_positions]
    window = min(windows) if windows else None  # the smallest context of the members (None: none says)
    limits = Limits(settings.name, len(ensemble.models), dict(settings.gates),
                    max_tokens=settings.max_tokens or window,
                    max_branches=settings.max_branches)
    served = _Served(ensemble, settings, slots, limits, window, int(time.time()))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        slots.close()

    app = FastAPI(title="AdaFuse", summary="A fused ensemble behind OpenAI's API", lifespan=lifespan)
    app.state.slots = slots
    _add_error_handlers(app)
    _add_model_routes(app, served)
    _add_completion_routes(app, served)
    return app


@dataclass(frozen=True, eq=False)
class _Served:
    """What every route of one server shares: the ensemble, the server's settings, its decode slots and the limits
    requests are checked against."""
    ensemble: AdaFuse
    settings: ServeSettings
    slots: DecodeSlots
    limits: Limits
    window: int | None             # the smallest context window of the members, in tokens (None: none says)
    started: int                   # when the server started (Unix seconds): the model card's `created`

    def check_key(self, request: Request) -> None:
        """The routes' dependency: the request sends the server's API key, if it has one."""
        if self.settings.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, key = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.settings.api_key.encode()):
            raise ApiError(401, "invalid or missing API key: send the server's key as `Authorization: Bearer KEY` "
                                "(the openai client's api_key)", code="invalid_api_key")

    def card(self) -> dict:
        """The served model as GET /v1/models lists it."""
        return {"id": self.settings.name, "object": "model", "created": self.started, "owned_by": "adafuse",
                "adafuse": {"members": [lm.name for lm in self.ensemble.models],
                            "settings": self.ensemble.config.to_dict()}}

    def check_fits(self, prompt: str) -> None:
        """A prompt no member's context holds is refused before it waits for a slot. Only a prompt that could be
        that long is tokenized here (a token holds at least one byte of text, one more for a tokenizer's dummy
        prefix): the decode's start tokenizes it again anyway, exactly, in its view."""
        if self.window is None or len(prompt.encode()) + 1 < self.window:
            return
        for lm in self.ensemble.models:
            lm.check_fits(len(lm.tokenize(prompt)))


def _add_error_handlers(app: FastAPI) -> None:
    """Every error a request meets answered as an OpenAI error object: ours, invalid requests, HTTP's, the rest."""
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        found = exc.errors()
        body = _body_error(found, request.headers.get("content-type", ""))
        if body:
            return JSONResponse(ApiError(400, f"{body}: send a JSON object with Content-Type: application/json").body(),
                                400)
        errors = [(_field(e.get("loc", ())), str(e.get("msg", "invalid"))) for e in found] or [("", "invalid")]
        param = errors[0][0]
        said = list(dict.fromkeys(msg for where, msg in errors if where == param))  # a union's tries, once each
        message = f"{param}: {' or '.join(said)}" if param else " or ".join(said)
        return JSONResponse(ApiError(400, message, param=param or None).body(), 400)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(ApiError(exc.status_code, str(exc.detail)).body(), exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        err = error_for(exc)
        return JSONResponse(err.body(), err.status)


def _add_model_routes(app: FastAPI, served: _Served) -> None:
    """GET /health, /v1/models and /v1/models/{model}."""
    settings = served.settings

    @app.get("/health")
    async def health() -> dict:
        """Up, and the decodes running and waiting (no key needed)."""
        return {"status": "ok", "decodes": served.slots.counts()}

    @app.get("/v1/models", dependencies=[Depends(served.check_key)])
    async def models() -> dict:
        return {"object": "list", "data": [served.card()]}

    @app.get("/v1/models/{model:path}", dependencies=[Depends(served.check_key)])
    async def model(model: str) -> dict:
        if model != settings.name:
            raise ApiError(404, f"the model {model!r} does not exist: this server serves {settings.name!r}",
                           param="model", code="model_not_found")
        return served.card()


def _add_completion_routes(app: FastAPI, served: _Served) -> None:
    """POST /v1/completions and /v1/chat/completions."""
    ensemble, limits = served.ensemble, served.limits

    @app.post("/v1/completions", dependencies=[Depends(served.check_key)])
    async def completions(req: CompletionRequest, request: Request):
        return await _respond(served, completion_job(req, ensemble.config, limits, _trace_query(request)), request)

    @app.post("/v1/chat/completions", dependencies=[Depends(served.check_key)])
    async def chat_completions(req: ChatRequest, request: Request):
        return await _respond(served, chat_job(req, ensemble.config, limits, _trace_query(request)), request)


async def _respond(served: _Served, job: Job, request: Request):
    """Admit the decode, wait for its start (settings a member refuses, a prompt too long: still a 400), then
    answer whole or as a stream. A client that leaves a non-streamed request stops its decode before the next
    round; so does the server's --timeout."""
    ensemble, settings = served.ensemble, served.settings
    try:
        await asyncio.to_thread(served.check_fits, "\n".join([*(text for _, text in job.config.history), job.prompt]))
    except PromptError as exc:
        raise ApiError(400, str(exc), param="prompt" if not job.chat else "messages") from None
    fused = AdaFuse(ensemble.models, job.config, ensemble.parallel, ensemble.threads)
    run = Run(lambda: fused.start(job.prompt), asyncio.get_running_loop(), settings.timeout)
    try:
        served.slots.submit(run)
    except Overloaded as exc:
        raise ApiError(429, f"the server is busy ({settings.concurrency} decodes running, {settings.queue} "
                            f"waiting): retry after {exc.retry_after} s", type="rate_limit_error",
                       code="server_busy", headers={"Retry-After": str(exc.retry_after)}) from None
    handed_over = False
    try:
        kind, value = await run.next()
        if kind == "error":
            raise error_for(value)
        if kind == "cancelled":  # before it started: the server stops
            raise ApiError(503, "the server is stopping: send the request again", type="server_error")
        assert isinstance(value, Decoding)
        rid = new_id(job.chat)
        if job.stream:
            handed_over = True  # the stream owns the run now, and cancels it when the client leaves
            return EventSourceResponse(_stream(served, run, value, job, rid), sep="\n")
        while kind not in ("end", "error"):
            try:
                kind, value = await asyncio.wait_for(run.next(), timeout=DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    log.info("%s: the client left; its decode stops before its next round", rid)
                    return JSONResponse({}, 499)  # nobody reads it; the finally below cancels the decode
                continue
        if kind == "error":
            raise error_for(value)
        assert isinstance(value, Trace)
        return body(rid, settings.name, job.chat, value, ensemble.models, job.logprobs, job.trace)
    finally:
        if not handed_over:
            run.cancel()  # a no-op once finished; else (the client left, the server stops) the decode stops


async def _stream(served: _Served, run: Run, d: Decoding, job: Job, rid: str) -> AsyncIterator[dict]:
    """A streamed answer's server-sent events: the opening chunk, one per round that settled text, the final one
    (and the usage), then [DONE]; an error after the response began as its last event."""
    chunks = Chunks(rid, served.settings.name, job.chat, job.logprobs)
    enders, ended = d.ending.enders, False
    try:
        opening = chunks.opening()
        if opening is not None:
            yield _data(opening)
        while True:
            kind, value = await run.next()
            if kind == "round":
                r, output = value
                chunk = chunks.round(r, output, settled(output, enders))
                if chunk is not None:
                    yield _data(chunk)
            elif kind == "end":
                assert isinstance(value, Trace)
                ended = True
                yield _data(chunks.final(value, job.trace))
                if job.usage_chunk:
                    yield _data(chunks.usage(value, served.ensemble.models))
                break
            else:  # the decode failed after the response began: the error as the stream's last event
                ended = True
                yield _data(error_for(value).body())
                break
        yield _data("[DONE]")
    finally:  # a client that disconnects lands here (the stream is cancelled): its decode stops between rounds
        if not ended:
            log.info("%s: the stream closed early (the client left, or the server stops); its decode stops "
                     "before its next round", rid)
        run.cancel()


def _body_error(errors, content_type: str) -> str:
    """What is wrong with the request body as a whole ("" when it is a JSON object): not JSON (pydantic's loc is
    ("body", the character where it broke)), empty, sent as another type than JSON (FastAPI parses only a JSON
    content type: the rest reaches validation as bytes), or JSON but not an object (an array, a string, null)."""
    for e in errors:
        if e.get("type") == "json_invalid":
            why = (e.get("ctx") or {}).get("error", "invalid JSON")
            return f"the request body is not valid JSON ({why} at character {e.get('loc', ('body', '?'))[-1]})"
        if tuple(e.get("loc", ())) != ("body",):
            continue
        given = e.get("input")
        if e.get("type") == "missing" or given in (b"", ""):
            return "the request body is empty"
        if isinstance(given, (bytes, bytearray)):
            sent = content_type.split(";")[0].strip()
            return f"the request body was sent {f'as {sent}' if sent else 'without a Content-Type'}, not as JSON"
        kind = {list: "array", str: "string", type(None): "null", bool: "boolean"}.get(type(given), "number")
        return f"the request body is a JSON {kind}, not an object"
    return ""


def _field(loc) -> str:
    """The request field a validation error is about, "messages.0.role": without "body" and the type names pydantic
    adds for each member of a union ("str", "list[str]", "TextPart")."""
    kept = [str(x) for x in loc[1:] if isinstance(x, int) or (x.isidentifier() and x.islower()
                                                                and x not in ("str", "int", "float", "bool"))]
    return ".".join(kept)


def _trace_query(request: Request) -> bool:
    return request.query_params.get("trace", "").lower() in ("1", "true", "yes")
