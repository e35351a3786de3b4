"""`adafuse serve` through the official openai client: the app on the toy pair in-process (unit), and a real server
process on the bundled pair (models): completions and chat, streamed and not, errors, concurrency, a client that
leaves mid-stream."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from adafuse import DEFAULT_PAIR, AdaFuse, DecodeConfig
from adafuse.harness.tasks import TASKS
from adafuse.server.app import ServeSettings, build_app
from adafuse.server.responses import settled
from adafuse.server.slots import Run
from adafuse.trace import Trace
from tests.toy import toy_pair

KEY = "test-key"  # the API key of the in-process servers below


# ---- unit: the app on the toy pair, in-process ----

def served(models):
    """The app on `models` (its settings: every request's defaults), its test client, and an openai client on it."""
    ens = AdaFuse(models, DecodeConfig(tau=0.7))
    with TestClient(build_app(ens, ServeSettings(api_key=KEY))) as http:
        http.headers["Authorization"] = f"Bearer {KEY}"
        yield ens, http, openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=http, max_retries=0)


@pytest.fixture
def toy():
    """The toy pair served (no chat template: a chat message reaches it as a User/Assistant transcript)."""
    yield from served(toy_pair())


@pytest.fixture
def chat_toy():
    """The toy pair with a one-turn chat template ("{content}": the message itself), served."""
    yield from served(toy_pair(chat="{content}"))


def test_the_one_model_is_listed_and_the_key_is_checked(toy):
    _, http, client = toy
    assert [m.id for m in client.models.list()] == ["adafuse"]
    assert client.models.retrieve("adafuse").model_extra["adafuse"]["members"] == ["a", "b"]
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic test-key"}):
        r = http.get("/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url="http://testserver/v1", api_key="wrong", http_client=http, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model="adafuse", prompt="Q")
    assert http.get("/health", headers={"Authorization": ""}).json()["status"] == "ok"  # no key needed


def test_the_command_lines_key_or_the_environments_is_the_servers(monkeypatch):
    from adafuse.server.cli import build_parser, serve_settings
    monkeypatch.delenv("ADAFUSE_API_KEY", raising=False)
    assert serve_settings(build_parser().parse_args([])).api_key is None  # no key: every client is let in
    assert serve_settings(build_parser().parse_args(["--api-key", "k"])).api_key == "k"
    monkeypatch.setenv("ADAFUSE_API_KEY", "from-env")
    assert serve_settings(build_parser().parse_args([])).api_key == "from-env"


def test_a_completion_is_the_librarys_decode_with_its_usage_logprobs_and_trace(toy):
    ens, _, client = toy
    expected = AdaFuse(ens.models, DecodeConfig(tau=0.7, branches=2)).generate("Q")
    out = client.completions.create(model="adafuse", prompt="Q", logprobs=2, extra_body={"adafuse": {"branches": 2}},
                                    extra_query={"trace": "1"})
    choice = out.choices[0]
    assert choice.text == expected.output and choice.finish_reason == "stop" and out.object == "text_completion"
    rounds = expected.rounds
    assert choice.logprobs.tokens == [r.text for r in rounds]
    assert choice.logprobs.token_logprobs == [None if r.candidates[r.chosen].fused is None else
                                              pytest.approx(-r.candidates[r.chosen].fused) for r in rounds]
    assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
    trace = Trace.from_dict(out.model_extra["adafuse_trace"])
    assert trace.output == expected.output and trace.settings["branches"] == 2
    assert [[c.text for c in r.candidates] for r in trace.rounds] == [[c.text for c in r.candidates] for r in rounds]
    per = out.usage.model_extra["adafuse"]["models"]
    assert set(per) == {"a", "b"} and all(v["forward_passes"] > 0 for v in per.values())
    assert out.usage.prompt_tokens == max(v["prompt_tokens"] for v in per.values())
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    plain = client.completions.create(model="adafuse", prompt="Q")
    assert plain.choices[0].logprobs is None and "adafuse_trace" not in plain.model_extra


def test_a_stream_is_the_completion_in_chunks_then_the_finish_then_the_usage(toy):
    _, _, client = toy
    whole = client.completions.create(model="adafuse", prompt="Q", extra_body={"adafuse": {"max_words": 1}})
    chunks = list(client.completions.create(model="adafuse", prompt="Q", stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"adafuse": {"max_words": 1, "trace": True}}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) > 2 and "".join(texts) == whole.choices[0].text  # one chunk per round, then the finish
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert Trace.from_dict(chunks[-2].model_extra["adafuse_trace"]).output == whole.choices[0].text


def test_chat_decodes_a_user_turn_after_an_optional_system_message(chat_toy):
    ens, _, client = chat_toy
    expected = AdaFuse(ens.models, DecodeConfig(tau=0.7, mode="chat")).generate("Q").output
    out = client.chat.completions.create(model="adafuse", messages=[{"role": "system", "content": "Paris is nice."},
                                                                    {"role": "user", "content": "Q"}],
                                         logprobs=True, top_logprobs=3, extra_query={"trace": "true"})
    assert out.choices[0].message.content == expected.lstrip() and out.choices[0].message.role == "assistant"
    assert out.model_extra["adafuse_trace"]["settings"]["system"] == "Paris is nice."
    assert "".join(e.token for e in out.choices[0].logprobs.content) == expected.lstrip()
    stream = list(client.chat.completions.create(model="adafuse", messages=[{"role": "user", "content": "Q"}],
                                                 stream=True))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == expected.lstrip()
    assert stream[-1].choices[0].finish_reason == "stop"


def test_a_chat_message_does_not_begin_with_the_answers_leading_space(chat_toy):
    """The fused answer begins with the space of a raw-style word boundary (" Paris is nice."): a chat message's
    content drops it, whole, streamed (its first chunk with text) and in its logprobs' tokens; a completion keeps it."""
    ens, _, client = chat_toy
    expected = AdaFuse(ens.models, DecodeConfig(tau=0.7, mode="chat")).generate("Q").output
    assert expected.startswith(" ") and expected.strip()
    messages = [{"role": "user", "content": "Q"}]
    whole = client.chat.completions.create(model="adafuse", messages=messages, logprobs=True, top_logprobs=2)
    assert whole.choices[0].message.content == expected.lstrip()
    first = whole.choices[0].logprobs.content[0]
    assert not first.token[0].isspace() and all(not t.token[:1].isspace() for t in first.top_logprobs)
    for extra in ({}, {"logprobs": True}):
        chunks = [c.choices[0] for c in client.chat.completions.create(
            model="adafuse", messages=messages, stream=True, extra_body={"adafuse": {"max_words": 1}}, **extra)]
        texts = [c.delta.content for c in chunks if c.delta.content]
        assert len(texts) > 1 and not texts[0][0].isspace() and "".join(texts) == expected.lstrip()
        tokens = [e.token for c in chunks if c.logprobs for e in c.logprobs.content]
        assert "".join(tokens) == (expected.lstrip() if extra else "")
    assert client.completions.create(model="adafuse", prompt="Q").choices[0].text.startswith(" ")


def test_chat_continues_a_conversation_of_several_turns(chat_toy):
    """A chat client sends the whole conversation: each member's template renders it, the ensemble writes the next
    assistant message — the library's decode of the last user message after that history."""
    ens, _, client = chat_toy
    turns = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": " Paris is nice."},
             {"role": "user", "content": "Q"}]
    history = (("user", "Q"), ("assistant", " Paris is nice."))
    expected = AdaFuse(ens.models, DecodeConfig(tau=0.7, mode="chat", history=history)).generate("Q")
    assert expected.prompt_modes == {"a": "chat (2 earlier messages)", "b": "chat (2 earlier messages)"}
    out = client.chat.completions.create(model="adafuse", messages=turns, extra_query={"trace": "true"})
    assert out.choices[0].message.content == expected.output.lstrip()
    assert out.model_extra["adafuse_trace"]["settings"]["history"] == [list(t) for t in history]
    assert out.model_extra["adafuse_trace"]["prompt"] == "Q"


SYSTEM, USER, ASSISTANT = ({"role": r, "content": "Q"} for r in ("system", "user", "assistant"))


@pytest.mark.parametrize("messages, param, says", [
    ([ASSISTANT], "messages.0.role", "messages[0] is an assistant message, but a user message was expected there"),
    ([SYSTEM, ASSISTANT, USER], "messages.1.role",
     "messages[1] is an assistant message, but a user message was expected there"),
    ([USER, USER], "messages.1.role", "messages[1] is a user message, but an assistant message was expected there"),
    ([USER, ASSISTANT], "messages.1.role", "the last message (messages[1]) is the assistant's, but a conversation"),
    ([USER, SYSTEM, USER], "messages.1.role", "messages[1] is a system message, but a system message may only come "
                                              "first"),
    ([USER, {"role": "tool", "content": "Q"}], "messages.1.role",
     "messages[1] is a tool message, but tool messages are unsupported"),
    ([SYSTEM], "messages", "messages hold only a system message, so there is nothing to answer"),
    ([], "messages", "messages are empty, so there is nothing to answer"),
])
def test_a_bad_message_list_is_told_which_message_is_wrong_and_what_a_conversation_is(toy, messages, param, says):
    _, http, _ = toy
    r = http.post("/v1/chat/completions", json={"model": "adafuse", "messages": messages})
    error = r.json()["error"]
    assert r.status_code == 400 and error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"].startswith(says), error["message"]
    assert error["message"].endswith("then user and assistant messages taking turns, ending with the user's (the "
                                     "ensemble writes the next assistant message)")


@pytest.mark.parametrize("body, status, param, says", [
    ({"model": "gpt-4", "prompt": "Q"}, 404, "model", "does not exist"),
    ({"model": "adafuse", "prompt": "Q", "adafuse": {"tau": 2}}, 400, "adafuse.tau", "tau=2 is invalid"),
    ({"model": "adafuse", "prompt": "Q", "adafuse": {"method": "best"}}, 400, "adafuse.method", "use one of"),
    ({"model": "adafuse", "prompt": "Q", "adafuse": {"weights": [1.0]}}, 400, "adafuse.weights", "one per model"),
    ({"model": "adafuse", "prompt": "Q", "adafuse": {"mode": "chat"}}, 400, "adafuse.mode", "fixed when the server"),
    ({"model": "adafuse", "prompt": "Q", "adafuse": {"gate": "/etc/passwd"}}, 400, "adafuse.gate", "not a gate"),
    # the range a token cap is told is this server's limit (the toy models' context, 4096), not the library's
    ({"model": "adafuse", "prompt": "Q", "max_tokens": 0}, 400, "max_tokens",
     "max_tokens=0 is invalid: use a whole number from 1 to 4096 (this server's limit"),
    ({"model": "adafuse", "prompt": "Q", "max_tokens": -3}, 400, "max_tokens", "use a whole number from 1 to 4096"),
    ({"model": "adafuse", "prompt": "Q", "n": 2}, 400, "n", "n=1"),
    # lm-eval's local-completions scoring a prompt's own tokens: the --model adafuse path instead
    ({"model": "adafuse", "prompt": "Q Paris", "echo": True, "logprobs": 1, "max_tokens": 1}, 400, "echo",
     "--model adafuse"),
    ({"model": "adafuse", "prompt": "Q", "adafuse": {"method": "fixed-span", "seed": 3}}, 400, "adafuse.seed",
     "not a setting of method 'fixed-span'"),
    ({"model": "adafuse", "prompt": ["Q", "Q"]}, 400, "prompt", "one prompt per request"),
    ({"model": "adafuse", "prompt": [1, 2]}, 400, "prompt", "prompt"),
    ({"model": "adafuse", "prompt": "   "}, 400, "prompt", "empty"),
    ({"model": "adafuse"}, 400, "prompt", "Field required"),
    ({"model": "adafuse", "prompt": "Q", "temperature": 5}, 400, "temperature", "less than or equal to 2"),
    ({"model": "adafuse", "prompt": "Q", "temperature": -1}, 400, "temperature", "greater than or equal to 0"),
    ({"model": "adafuse", "prompt": "Q", "top_p": 7}, 400, "top_p", "less than or equal to 1"),
    ({"model": "adafuse", "prompt": "Q", "top_p": 0}, 400, "top_p", "greater than 0"),
    ({"model": "adafuse", "prompt": "Q", "presence_penalty": 3}, 400, "presence_penalty", "less than or equal to 2"),
    # what one request may cost: the toy models' context (4096) caps max_tokens, --max-branches (8) the branches
    ({"model": "adafuse", "prompt": "Q", "max_tokens": 1_000_000}, 400, "max_tokens",
     "over this server's limit of 4096 tokens: use a whole number from 1 to 4096"),
    ({"model": "adafuse", "prompt": "Q", "adafuse": {"branches": 9}}, 400, "adafuse.branches", "limit of 8"),
    ({"model": "adafuse", "prompt": "Q" * 200_000}, 400, "prompt", "the prompt is 200000 tokens for a"),
])
def test_bad_requests_get_openai_error_objects(toy, body, status, param, says):
    _, http, _ = toy
    r = http.post("/v1/completions", json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"] and set(error) == {"message", "type", "param", "code"}


def test_in_range_sampling_fields_are_accepted_and_a_body_that_is_not_json_is_said_to_be(toy):
    _, http, _ = toy
    ok = http.post("/v1/completions", json={"model": "adafuse", "prompt": "Q", "temperature": 0.7, "top_p": 1,
                                             "frequency_penalty": -2})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"]
    for body in ("1: not json", "{\"model\": \"adafuse\",", ""):
        r = http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
        error = r.json()["error"]
        said = "is empty" if not body else "not valid JSON"
        assert r.status_code == 400 and said in error["message"] and error["param"] is None, error


@pytest.mark.parametrize("content, content_type, says", [
    ('{"model": "adafuse", "prompt": "Q"}', "text/plain", "the request body was sent as text/plain, not as JSON"),
    ("Who wrote Hamlet?", "text/plain; charset=utf-8", "the request body was sent as text/plain, not as JSON"),
    ("model=adafuse", "application/x-www-form-urlencoded",
     "the request body was sent as application/x-www-form-urlencoded, not as JSON"),
    ("[1, 2]", "application/json", "the request body is a JSON array, not an object"),
    ("null", "application/json", "the request body is a JSON null, not an object"),
])
def test_a_body_that_is_not_a_json_object_is_told_to_send_one(toy, content, content_type, says):
    _, http, _ = toy
    for route in ("/v1/completions", "/v1/chat/completions"):
        r = http.post(route, content=content, headers={"Content-Type": content_type})
        error = r.json()["error"]
        assert r.status_code == 400 and error["type"] == "invalid_request_error" and error["param"] is None, error
        assert error["message"] == f"{says}: send a JSON object with Content-Type: application/json"


def test_a_chat_token_cap_is_told_by_the_field_it_came_in(toy):
    _, http, _ = toy
    for field in ("max_tokens", "max_completion_tokens"):
        r = http.post("/v1/chat/completions", json={"model": "adafuse", "messages": [{"role": "user", "content": "Q"}],
                                                    field: 0})
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == field, error
        assert error["message"].startswith(f"{field}=0 is invalid: use a whole number from 1 to 4096")


def test_an_unexpected_failure_is_a_500_error_object_without_its_details(toy, monkeypatch):
    _, http, _ = toy

    def boom(self, prompt):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(AdaFuse, "start", boom)
    r = http.post("/v1/completions", json={"model": "adafuse", "prompt": "Q"})
    assert r.status_code == 500 and "RuntimeError" in r.json()["error"]["message"]
    assert "secret" not in r.text and "Traceback" not in r.text
    r = http.post("/v1/completions/nowhere", json={})
    assert r.status_code == 404 and "error" in r.json()


def test_past_the_slots_and_the_queue_a_request_gets_429_with_retry_after():
    app = build_app(AdaFuse(toy_pair(), DecodeConfig()), ServeSettings(concurrency=1, queue=0))
    release = threading.Event()
    with TestClient(app) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
        hold = Run(lambda: release.wait(30), asyncio.new_event_loop())  # takes the one slot until released
        app.state.slots.submit(hold)
        with pytest.raises(openai.RateLimitError) as caught:
            client.completions.create(model="adafuse", prompt="Q")
        assert int(caught.value.response.headers["Retry-After"]) >= 1
        assert caught.value.body["code"] == "server_busy"
        release.set()
        assert hold.finished.wait(10)
        deadline = time.monotonic() + 10
        while http.get("/health").json()["decodes"]["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.completions.create(model="adafuse", prompt="Q").choices[0].text


class _Loop:
    """Stands in for the event loop a Run reports to: records the events, and cancels the run after its first
    round (a client leaving mid-stream)."""

    def __init__(self):
        self.events, self.run = [], None

    def call_soon_threadsafe(self, put, event):
        self.events.append(event)
        if event[0] == "round":
            self.run.cancel()


def test_a_cancelled_run_stops_before_its_next_round_and_keeps_what_it_decided():
    loop = _Loop()
    run = loop.run = Run(lambda: AdaFuse(toy_pair(), DecodeConfig(max_words=1)).start("Q"), loop)
    run()
    kinds = [k for k, _ in loop.events]
    assert kinds == ["started", "round", "end"]
    trace = loop.events[-1][1]
    assert trace.stop_reason == "cancelled" and len(trace.rounds) == 1
    assert len(AdaFuse(toy_pair(), DecodeConfig(max_words=1)).generate("Q").rounds) > 1  # it had more to do


def test_a_decode_past_the_servers_timeout_stops_before_its_next_round_and_answers_what_it_has():
    ens = AdaFuse(toy_pair(), DecodeConfig(max_words=1))
    with TestClient(build_app(ens, ServeSettings(timeout=1e-9))) as http:
        out = http.post("/v1/completions?trace=1", json={"model": "adafuse", "prompt": "Q"}).json()
    assert out["choices"][0]["finish_reason"] == "length" and out["choices"][0]["text"] == ""
    assert out["adafuse_trace"]["stop_reason"] == "deadline" == out["adafuse"]["stop_reason"]
    assert out["adafuse"]["why_empty"] == "the decode stopped (deadline) before its first word"


def test_an_empty_answer_says_why_in_the_response():
    """The end likelier than " Paris" before the first word: by default the answer gets its word; a request that lets
    the end win there (`allow_empty`, the paper's pool) gets an empty answer, and why."""
    ens = AdaFuse(toy_pair(a={"Q": {"<eos>": 0.9}}, b={"Q": {"<eos>": 0.6, " Paris": 0.3}}), DecodeConfig())
    paper = {"model": "adafuse", "prompt": "Q", "adafuse": {"allow_empty": True}}
    with TestClient(build_app(ens)) as http:
        answered = http.post("/v1/completions", json={"model": "adafuse", "prompt": "Q"}).json()
        whole = http.post("/v1/completions", json=paper).json()
        lines = http.post("/v1/completions", json={**paper, "stream": True}).text
    assert answered["choices"][0]["text"] == " Paris" and "why_empty" not in answered["adafuse"]
    assert whole["choices"][0]["text"] == "" and whole["adafuse"]["stop_reason"] == "eos"
    assert whole["adafuse"]["why_empty"].startswith("in round 0 the end of the answer scored")
    assert "no higher than every candidate with text" in whole["adafuse"]["why_empty"]
    assert "could win before the first word (allow_empty" in whole["adafuse"]["why_empty"]
    last = json.loads(lines.split("data: ")[-2])  # the stream's last chunk says it too
    assert last["adafuse"] == whole["adafuse"] and last["choices"][0]["finish_reason"] == "stop"


def test_text_that_may_begin_a_stop_string_waits_for_the_next_round():
    assert settled("Paris\n", ["\n\nQuestion"]) == 5          # "\n" may begin "\n\nQuestion": held back
    assert settled("Paris\n\nQues", ["\n\nQuestion"]) == 5
    assert settled("Paris", ["\n\nQuestion", "<end_of_turn>"]) == 5
    assert settled("Paris <end", ["<end_of_turn>"]) == 6
    assert settled("Paris", []) == 5 and settled("", ["\n"]) == 0


# ---- models: a real `adafuse serve` process on the bundled pair ----

WORDS = TASKS["triviaqa"].max_new_words  # a word cap sent per request: the session's server has the README's defaults
FEW_SHOT = "Question: What is the capital of Italy?\nAnswer: Rome\n\nQuestion: {}\nAnswer:"
QUESTIONS = ["Who wrote Hamlet?", "What is the capital of France?", "What is the largest planet?",
             "Who painted the Mona Lisa?"]


@pytest.fixture(scope="module")
def client(adafuse_server):
    return openai.OpenAI(base_url=f"{adafuse_server[0]}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.mark.models
def test_real_completions_streamed_and_not_agree(client):
    prompt = FEW_SHOT.format(QUESTIONS[0])
    whole = client.completions.create(model="adafuse", prompt=prompt, stop="\n", logprobs=1)
    text = whole.choices[0].text
    assert text.strip() and "\n" not in text and whole.choices[0].finish_reason in ("stop", "length")
    assert "".join(whole.choices[0].logprobs.tokens) == text
    assert set(whole.usage.model_extra["adafuse"]["models"]) == set(DEFAULT_PAIR)
    chunks = list(client.completions.create(model="adafuse", prompt=prompt, stop="\n", stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


@pytest.mark.models
def test_real_chat_streamed_and_not_agree(client):
    messages = [{"role": "system", "content": "Answer in a few words."},
                {"role": "user", "content": "What is the capital of France?"}]
    short = {"adafuse": {"max_new_words": 8}}  # a few words are enough to compare
    whole = client.chat.completions.create(model="adafuse", messages=messages, extra_query={"trace": "1"},
                                           extra_body=short)
    text = whole.choices[0].message.content
    assert text.strip()
    modes = whole.model_extra["adafuse_trace"]["prompt_modes"].values()  # each member's own template, where it has one
    assert any(m.startswith("chat (system") for m in modes)
    assert all(m.startswith("chat") or "no chat template" in m for m in modes)
    chunks = list(client.chat.completions.create(model="adafuse", messages=messages, stream=True, extra_body=short))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text


@pytest.mark.models
def test_real_chat_continues_a_conversation(client):
    """The whole conversation reaches each member's chat template (SmolLM2's own; Gemma's own or a transcript)."""
    messages = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy?"}]
    out = client.chat.completions.create(model="adafuse", messages=messages, extra_query={"trace": "1"},
                                         extra_body={"adafuse": {"max_new_words": 4}})
    trace = out.model_extra["adafuse_trace"]
    assert trace["prompt"] == "And of Italy?" and len(trace["settings"]["history"]) == 2
    assert trace["prompt_modes"]["smollm2-135m-instruct"] == "chat (2 earlier messages)"
    assert all("earlier messages" in m or "transcript" in m for m in trace["prompt_modes"].values())


@pytest.mark.models
def test_real_errors_are_typed(client):
    with pytest.raises(openai.BadRequestError, match="tau=1.5 is invalid"):
        client.completions.create(model="adafuse", prompt="Question: Hi?\nAnswer:", extra_body={"adafuse": {"tau": 1.5}})
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4o", prompt="Question: Hi?\nAnswer:")


@pytest.mark.models
def test_four_concurrent_requests_each_get_their_own_answer(client, pair):
    prompts = [FEW_SHOT.format(q) for q in QUESTIONS]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda p: client.completions.create(
            model="adafuse", prompt=p, stop="\n", extra_body={"adafuse": {"max_new_words": WORDS}}).choices[0].text,
                             prompts))
    alone = [AdaFuse(pair, DecodeConfig(stop=("\n",), max_new_words=WORDS)).generate(p).output for p in prompts]
    assert outs == alone
    assert len(set(outs)) == len(outs)  # four questions, four answers


@pytest.mark.models
def test_a_client_leaving_mid_stream_cancels_its_decode_and_the_server_carries_on(client, adafuse_server):
    base, log = adafuse_server
    stream = client.completions.create(model="adafuse", prompt="Once upon a time", stream=True,
                                       extra_body={"adafuse": {"max_new_words": 200, "max_words": 1}})
    first = next(iter(stream))
    assert first.choices[0].text
    stream.close()  # the client leaves after the first round of a long decode
    deadline = time.monotonic() + 30
    while "the stream closed early" not in log.read_text() or httpx.get(f"{base}/health").json()["decodes"]["running"]:
        assert time.monotonic() < deadline, f"the decode was not cancelled:\n{log.read_text()[-2000:]}"
        time.sleep(0.2)
    again = client.completions.create(model="adafuse", prompt=FEW_SHOT.format(QUESTIONS[1]), stop="\n")
    assert again.choices[0].text.strip()


@pytest.mark.models
def test_a_client_leaving_a_request_that_is_not_streamed_frees_its_slot(adafuse_server):
    base, log = adafuse_server
    long = {"model": "adafuse", "prompt": "Once upon a time", "stop": [], "adafuse": {"max_new_words": 400}}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up after 2 s and closes its connection
        httpx.post(f"{base}/v1/completions", json=long, timeout=2)
    deadline = time.monotonic() + 30
    while "the client left" not in log.read_text() or httpx.get(f"{base}/health").json()["decodes"]["running"]:
        assert time.monotonic() < deadline, f"the decode went on:\n{log.read_text()[-2000:]}"
        time.sleep(0.2)
