"""OpenAI response shapes of a fused decode: bodies, stream chunks, usage, logprobs, error objects."""
from __future__ import annotations

import json
import time
import uuid
from typing import Sequence

from ..explain import why_empty
from ..models import LoadedModel
from ..trace import Round, StopReason, Trace

# OpenAI's finish reasons: "stop" (the answer ended) or "length" (a cap cut it)
FINISH = {StopReason.STOP_STRING: "stop", StopReason.EOS: "stop", StopReason.NO_PROGRESS: "stop",
          StopReason.MAX_NEW_WORDS: "length", StopReason.MAX_NEW_TOKENS: "length", StopReason.CONTEXT_FULL: "length", StopReason.DEADLINE: "length"}


class ApiError(Exception):
    """An error a client gets as an OpenAI error object with this HTTP status (never a stack trace)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def new_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


def finish_reason(trace: Trace) -> str | None:
    return FINISH.get(trace.stop_reason) if trace.stop_reason else None


def outcome(trace: Trace) -> dict:
    """The response's `adafuse` object: the decode's own stop reason, and for an empty answer why it is empty (the
    app's explanation: what ended it in round 0, and whose weight to raise)."""
    out = {"stop_reason": trace.stop_reason}
    if not trace.output.strip():
        out["why_empty"] = (why_empty(trace, "adafuse.weights")
                            or f"the decode stopped ({trace.stop_reason}) before its first word")
    return out


def usage(trace: Trace, models: Sequence[LoadedModel]) -> dict:
    """Prompt and completion tokens (the members tokenize differently: the most any member counts, as
    `max_new_tokens` counts), and under "adafuse" each member's own counts, forward passes and tokens fed."""
    per = {}
    for name, lm in zip(trace.models, models):
        cost = trace.cost(name)
        per[name] = {"prompt_tokens": trace.prefill[name]["prompt_tokens"],
                     "completion_tokens": len(lm.tokenize(trace.output)) if trace.output else 0,
                     "forward_passes": cost["forward_passes"], "tokens_fed": cost["tokens_fed"],
                     "seconds": round(cost["seconds"], 3)}
    prompt = max(v["prompt_tokens"] for v in per.values())
    completion = max(v["completion_tokens"] for v in per.values())
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "adafuse": {"models": per, "rounds": len(trace.rounds), "words": trace.words,
                        "seconds": round(trace.seconds, 3)}}


def _logprob(fused: float | None) -> float | None:
    # the fused score is a weighted mean NLL per token (lower is better): its negative reads as a log-probability
    return None if fused is None else -fused


def _ranked(r: Round, top: int) -> list[tuple[str, float | None]]:
    """The round's candidates best first (unscored last), at most `top`."""
    order = sorted(range(len(r.candidates)),
                   key=lambda i: (r.candidates[i].fused is None, r.candidates[i].fused or 0.0, i))
    return [(r.candidates[i].text, _logprob(r.candidates[i].fused)) for i in order[:top]]


def completion_logprobs(rounds: Sequence[Round], top: int, offset: int = 0) -> dict:
    """The completions API's logprobs with one entry per committed round: its text as the "token", the negative fused
    score of the committed candidate, and the `top` best candidates of its pool."""
    tokens, offsets, at = [], [], offset
    for r in rounds:
        tokens.append(r.text)
        offsets.append(at)
        at += len(r.text)
    tops = None
    if top:
        tops = []
        for r in rounds:
            best: dict[str, float | None] = {}
            for text, lp in _ranked(r, top):
                best.setdefault(text, lp)  # a text twice (one ending the answer, one not): the better one
            tops.append(best)
    return {"tokens": tokens, "token_logprobs": [_logprob(r.candidates[r.chosen].fused) for r in rounds],
            "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(rounds: Sequence[Round], top: int, lead: bool = True) -> dict:
    """The chat API's logprobs: one entry per committed round (see `completion_logprobs`). `lead`: the rounds begin
    the message, so, as its content, their texts (and their alternatives) drop the answer's leading whitespace until
    one has more; their tokens then join to the message's content."""
    def entry(text: str, logprob: float | None) -> dict:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    content = []
    for r in rounds:
        cut = str.lstrip if lead else str
        content.append({**entry(cut(r.text), _logprob(r.candidates[r.chosen].fused)),
                        "top_logprobs": [entry(cut(t), lp) for t, lp in _ranked(r, top)]})
        lead = lead and not r.text.strip()
    return {"content": content}


def _logprobs(chat: bool, rounds: Sequence[Round], top: int | None, offset: int = 0, lead: bool = True) -> dict | None:
    if top is None:
        return None
    return chat_logprobs(rounds, top, lead) if chat else completion_logprobs(rounds, top, offset)


def message_text(output: str) -> str:
    """A chat message's content: the fused answer without its leading whitespace (the space a raw-style word
    boundary puts before the first word); a completion's text stays as decoded."""
    return output.lstrip()


def _trace_json(trace: Trace) -> dict:
    return json.loads(trace.to_json())  # strict JSON: unscored values are null, never NaN


def body(rid: str, model: str, chat: bool, trace: Trace, models: Sequence[LoadedModel], top: int | None,
         with_trace: bool) -> dict:
    """A whole (non-streamed) completion or chat completion."""
    choice: dict = {"index": 0, "finish_reason": finish_reason(trace),
                    "logprobs": _logprobs(chat, trace.rounds, top)}
    if chat:
        choice["message"] = {"role": "assistant", "content": message_text(trace.output)}
    else:
        choice["text"] = trace.output
    out = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
           "model": model, "choices": [choice], "usage": usage(trace, models)}
    out["adafuse"] = outcome(trace)
    if with_trace:
        out["adafuse_trace"] = _trace_json(trace)
    return out


class Chunks:
    """The stream of one request: a chunk per committed round, the last one with the finish reason, the usage chunk
    when asked (`stream_options.include_usage`)."""

    def __init__(self, rid: str, model: str, chat: bool, top: int | None):
        self.rid, self.model, self.chat, self.top = rid, model, chat, top
        self.created = int(time.time())
        self.sent = 0  # characters of the output sent so far
        self.lead = chat  # a chat message's content has not begun: its leading whitespace is dropped (message_text)
        self.lead_rounds = chat  # the same for the rounds' logprobs: no round with more than whitespace sent yet

    def _text(self, text: str) -> str:
        """What is sent of the output's next `text`: all of it, but a chat message's leading whitespace."""
        if self.lead:
            text = message_text(text)
            self.lead = not text
        return text

    def _chunk(self, choices: list[dict], **extra) -> dict:
        return {"id": self.rid, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, **extra}

    def _choice(self, text: str | None, rounds: Sequence[Round], finish: str | None) -> dict:
        choice: dict = {"index": 0, "finish_reason": finish,
                        "logprobs": _logprobs(self.chat, rounds, self.top, self.sent, self.lead_rounds)
                        if rounds else None}
        if self.chat:
            choice["delta"] = {} if text is None else {"content": text}
        else:
            choice["text"] = text or ""
        return choice

    def opening(self) -> dict | None:
        """The chat stream's first chunk names the role; a completion stream has none."""
        if not self.chat:
            return None
        return self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}])

    def round(self, r: Round, output: str, settled: int) -> dict | None:
        """The chunk of a committed round: the output's text from what was sent up to `settled` (what no later round
        can take back); None when that adds nothing and there are no logprobs to send."""
        text = self._text(output[self.sent:settled])
        chunk = self._chunk([self._choice(text, [r], None)]) if text or self.top is not None else None
        self.sent = max(self.sent, settled)  # a chat message's leading whitespace too: dropped, not held
        self.lead_rounds = self.lead_rounds and not r.text.strip()
        return chunk

    def final(self, trace: Trace, with_trace: bool) -> dict:
        """The last chunk: what is left of the output, and why the decode stopped."""
        rest = self._text(trace.output[self.sent:])
        self.sent = len(trace.output)
        extra = {"adafuse": outcome(trace), **({"adafuse_trace": _trace_json(trace)} if with_trace else {})}
        return self._chunk([self._choice(rest if rest or not self.chat else None, [], finish_reason(trace))],
                           **extra)

    def usage(self, trace: Trace, models: Sequence[LoadedModel]) -> dict:
        return self._chunk([], usage=usage(trace, models))


def settled(output: str, enders: Sequence[str]) -> int:
    """How much of `output` no later round can take back. A round trims earlier text only where an end string (a stop
    string or a member's end-token text) began in it, so the longest tail of `output` that begins one waits."""
    hold = 0
    for e in enders:
        for k in range(min(len(e) - 1, len(output)), hold, -1):
            if output.endswith(e[:k]):
                hold = k
                break
    return len(output) - hold
