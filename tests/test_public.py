"""Public mode (app/public.py) and one decode per session: when the app is public, what a visitor may pick and how
much, each refusal naming what the operator can set; the page's handlers and the scripting API refusing before
anything loads or is reached; two quick Run presses starting one decode; each session's own lock. On the toy app's
models (tests/toy_app.py) loaded by the page's own registry."""
from __future__ import annotations

import html
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import app.controller as controller
from adafuse import DEFAULT_PAIR, DecodeConfig
from adafuse.models import ModelRegistry
from adafuse.models.local import cache_root
from app import api, handlers, public
from app.controller import Explorer
from app.public import NotAllowedError, Policy, Visitors
from app.views import STATUS_AT
from tests.test_public_server import listener
from tests.toy import toy_model
from tests.toy_app import CHAT, RULES, VOCAB

pytestmark = pytest.mark.unit

NAMES = list(DEFAULT_PAIR)
HAMLET = "Question: Who wrote the play Hamlet?\nAnswer:"
ROOT = Path(__file__).resolve().parents[1]


def page(max_new_words: int = 40) -> list:
    """The page's settings as Run and Step take them (`views._settings`): names, the sliders, then the weights."""
    return [NAMES, 0.7, 3, 3, True, "surface", 1.0, max_new_words, 80, "raw", "\\n", "", "template default", False,
            "per token (paper)", False, "", 1, 1]


@pytest.fixture
def loads(monkeypatch):
    """The page's registry loads toy models under any name, and lists every name it was asked to load."""
    asked = []

    def load(name, device=None, dtype=None, trust_remote_code=False):
        asked.append(name)
        rules = RULES.get(name, RULES[NAMES[1]])
        return toy_model(Path(name).name, VOCAB, rules, chat=CHAT if name == NAMES[0] else None, embedded=True,
                         max_positions=32_768)
    monkeypatch.setattr(controller, "MODELS", ModelRegistry(loader=load))
    monkeypatch.setattr(public, "VISITORS", Visitors())
    return asked


@pytest.fixture
def public_mode():
    """Configure the app's policy as public (with these fields) for one test; back to the environment's after."""
    yield lambda **kw: public.configure(Policy(public=True, why="a test", **kw))
    public.configure(None)


def real_model_folder(tmp_path: Path) -> Path:
    """A folder holding a model `load_model` loads: the bundled SmolLM2 as converted on this machine, else a tiny
    Llama saved here."""
    found = sorted(p for p in cache_root().glob("SmolLM2-*") if (p / "config.json").is_file())
    if found:
        return found[0]
    from tests.families import tiny
    tiny("llama").save_pretrained(tmp_path / "tiny-llama")
    return tmp_path / "tiny-llama"


@pytest.mark.parametrize("env, host, share, public, why", [
    ({}, "127.0.0.1", False, None, ""), ({}, "localhost", False, None, ""), ({}, "::1", False, None, ""),
    ({"SPACE_ID": "user/space"}, "127.0.0.1", False, None, "SPACE_ID is set"),
    ({}, "127.0.0.1", True, None, "--share"), ({}, "0.0.0.0", False, None, "--host 0.0.0.0"),
    ({}, "my-box.lan", False, None, "--host my-box.lan"), ({}, "127.0.0.1", False, True, "--public"),
    ({"SPACE_ID": "user/space"}, "0.0.0.0", True, False, "")])
def test_public_mode_is_on_where_strangers_can_reach_the_app(env, host, share, public, why):
    rules = Policy.from_env(public, "--public" if public else "", host, share, env=env)
    assert rules.public == bool(why) and rules.why.startswith(why)


def test_the_operators_lists_and_limits_come_from_the_environment():
    env = {"ADAFUSE_MODELS": "a, b\nc,", "ADAFUSE_SERVERS": "http://10.0.0.5:8000/, https://x.org/v1",
           "ADAFUSE_MAX_PROMPT_CHARS": "100", "ADAFUSE_MAX_NEW_WORDS": "20", "ADAFUSE_DECODES_PER_MINUTE": "3"}
    rules = Policy.from_env(True, env=env)
    assert rules.models == ("a", "b", "c") and rules.servers == ("http://10.0.0.5:8000/v1", "https://x.org/v1")
    assert (rules.max_prompt_chars, rules.max_new_words, rules.decodes_per_minute) == (100, 20, 3)
    for name, value in (("ADAFUSE_SERVERS", "ftp://x"), ("ADAFUSE_DECODES_PER_MINUTE", "0"),
                        ("ADAFUSE_MAX_NEW_WORDS", "lots")):
        with pytest.raises(ValueError, match=name):
            Policy.from_env(True, env={name: value})


def test_by_default_a_public_server_offers_the_bundled_pair_and_the_front_matters_models():
    front = yaml.safe_load((ROOT / "README.md").read_text(encoding="utf-8").split("---\n")[1])
    assert set(Policy().models) == set(NAMES) | set(front["models"])


def test_each_refusal_says_what_the_operator_can_set(tmp_path):
    rules = Policy(public=True, servers=("http://10.0.0.5:8000/v1",), max_prompt_chars=50, max_new_words=20)
    for spec in (*NAMES, "Qwen/Qwen3-8B", "vllm:http://10.0.0.5:8000#served", "vllm:http://10.0.0.5:8000/v1/#x"):
        rules.check_model(spec)  # listed, or a model on a listed server
    refused = {str(real_model_folder(tmp_path)): "looks like a path", "~/models/x": "looks like a path",
               "./m.gguf": "looks like a path", "someone/some-model": "add it to ADAFUSE_MODELS",
               "vllm:http://127.0.0.1:9/v1#x": "ADAFUSE_SERVERS", "openai:http://169.254.169.254#x": "ADAFUSE_SERVERS",
               "vllm:http://10.0.0.5:8000@evil.org/v1#x": "ADAFUSE_SERVERS",
               "vllm:http://10.0.0.5:8000/v1#x?tokenizer=/etc": "?tokenizer=",
               f"{NAMES[0]}@cpu": "ADAFUSE_MODELS", "Qwen/Qwen3-8B@cuda:0": "without @cuda:0"}
    for spec, says in refused.items():
        with pytest.raises(NotAllowedError, match=says.replace("?", r"\?")):
            rules.check_model(spec)
    checks = ((rules.check_device, "cuda:0", "--private"), (lambda _: rules.check_unload(), None, "--private"),
              (rules.check_prompt, "x" * 51, "ADAFUSE_MAX_PROMPT_CHARS"), (rules.check_words, 21, "ADAFUSE_MAX_NEW"))
    for check, value, says in checks:
        with pytest.raises(NotAllowedError, match=says):
            check(value)
    private = Policy()  # one's own machine: all of it as before
    for spec in refused:
        private.check_model(spec)
    private.check_device("cuda:0")
    private.check_unload()
    private.check_prompt("x" * 10**5)
    private.check_words(10**4)
    rules.check_device("default")
    rules.check_prompt("x" * 50)
    rules.check_words(20)


def test_decodes_a_minute_are_counted_per_visitor_and_a_refused_try_counts_nothing():
    now = [0.0]
    v = Visitors(clock=lambda: now[0])
    for _ in range(3):
        v.charge("ann", 1, 3)
    with pytest.raises(NotAllowedError, match=r"started 3 decodes in the last minute.*again in 60 s.*PER_MINUTE"):
        v.charge("ann", 1, 3)
    v.charge("bob", 3, 3)  # another visitor has their own
    now[0] = 30.0
    with pytest.raises(NotAllowedError, match="again in 30 s"):
        v.charge("ann", 1, 3)
    with pytest.raises(NotAllowedError, match="4 decodes at once"):
        v.charge("cy", 4, 3)
    now[0] = 60.5  # a minute after: room again, and the refused tries were not counted
    v.charge("ann", 3, 3)


def test_a_visitor_is_their_login_their_address_or_their_session(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    req = SimpleNamespace(username=None, headers={"x-forwarded-for": "6.6.6.6"}, client=SimpleNamespace(host="1.2.3.4"),
                          session_hash="s1")
    assert public.visitor(req) == "address 1.2.3.4"  # a header a client can write is not trusted off a Space
    monkeypatch.setenv("SPACE_ID", "user/space")
    assert public.visitor(req) == "address 6.6.6.6"  # a Space's proxy says who it forwards
    assert public.visitor(SimpleNamespace(username="ann", headers={}, client=None)) == "user ann"
    assert public.visitor(SimpleNamespace(username=None, headers={}, client=None, session_hash="s1")) == "session s1"
    assert public.visitor() == "this machine"  # a handler called outside Gradio


def test_a_public_page_refuses_a_real_model_folder_before_it_loads(loads, public_mode, tmp_path):
    folder = str(real_model_folder(tmp_path))
    public_mode()
    out = list(handlers.on_run(None, [folder, NAMES[1]], "default", False, HAMLET, False, [], None, *page()))
    ex, said = out[-1][0], out[-1][1 + STATUS_AT]
    assert "looks like a path" in said and "ADAFUSE_MODELS" in said and not ex.running
    with pytest.raises(NotAllowedError):
        Explorer().load([folder, NAMES[1]])
    assert loads == []  # nothing was loaded, not even the listed model beside it
    public.configure(None)  # one's own machine: the same folder goes to the loader
    Explorer().load([folder, NAMES[1]])
    assert loads == [folder, NAMES[1]]


def test_the_api_refuses_a_served_model_on_a_local_port_and_the_listener_hears_nothing(loads, public_mode):
    public_mode()
    with listener() as (port, heard):
        with pytest.raises(Exception, match="not an inference server of this public app") as err:
            api.decode(HAMLET, f"vllm:http://127.0.0.1:{port}/v1#probe,{NAMES[1]}")
        assert err.value.title == "NotAllowedError" and "ADAFUSE_SERVERS" in str(err.value)
        assert not heard() and loads == []


def test_unload_device_and_limits_are_refused_in_the_page_and_the_api(loads, public_mode):
    public_mode(max_prompt_chars=60, max_new_words=20, decodes_per_minute=2)
    ex = Explorer()
    ex.models(NAMES)  # both loaded, as another visitor left them
    said, *_ = handlers.on_unload(NAMES[0])
    assert "unloading a model is the operator's" in said and len(controller.MODELS.loaded()) == 2
    for dev, prompt, settings, says in (("cuda:0", HAMLET, page(), "device for all models is the operator's"),
                                        ("default", "x" * 61, page(), "has 61 characters"),
                                        ("default", HAMLET, page(21), "Max new words 21")):
        said = html.unescape(list(handlers.on_run(ex, NAMES, dev, False, prompt, False, [], None, *settings))[-1][
            1 + STATUS_AT])
        assert says in said and not ex.running, said
    with pytest.raises(Exception, match="over this public server's limit of 20"):
        api.decode(HAMLET, ",".join(NAMES), max_new_words=21)
    assert "✓ done" in list(handlers.on_run(ex, NAMES, "default", False, HAMLET, False, [], None, *page(20)))[-1][
        1 + STATUS_AT]  # the refusals counted nothing: two decodes a minute, this the first
    api.decode(HAMLET, ",".join(NAMES), max_new_words=5)
    with pytest.raises(Exception, match="started 2 decodes in the last minute"):
        api.decode(HAMLET, ",".join(NAMES), max_new_words=5)
    assert loads == NAMES and len(controller.MODELS.loaded()) == 2


def test_a_word_cap_raised_during_a_run_is_held_to_the_limit(loads, public_mode, monkeypatch):
    public_mode(max_new_words=20)
    ex = Explorer()
    ex.begin(NAMES, DecodeConfig(max_new_words=10), HAMLET, resume=False)
    ex.running = True
    warned = []
    monkeypatch.setattr(handlers.gr, "Warning", warned.append)
    handlers.on_live(ex, *page(max_new_words=50))
    assert "limit of 20" in warned[0] and ex.live_config is None


def test_the_api_decode_stops_at_the_servers_deadline(loads, monkeypatch):
    monkeypatch.setattr(api, "DEADLINE_S", 0.0)
    assert api.decode(HAMLET, ",".join(NAMES), max_new_words=8)["stop_reason"] == "deadline"


def test_two_quick_run_presses_start_one_decode(loads, monkeypatch):
    """The second press arrives while the first is between its check and its decode (held there): it is refused."""
    started, entered, go = [], threading.Event(), threading.Event()
    begin, planned = Explorer.begin, handlers.planned
    monkeypatch.setattr(Explorer, "begin", lambda self, *a, **k: started.append(1) or begin(self, *a, **k))

    def held(*args, **kwargs):
        entered.set()
        go.wait(10)
        return planned(*args, **kwargs)
    monkeypatch.setattr(handlers, "planned", held)
    ex, first = Explorer(), []
    press = threading.Thread(target=lambda: first.extend(
        handlers.on_run(ex, NAMES, "default", False, HAMLET, False, [], None, *page())))
    press.start()
    assert entered.wait(10)
    second = list(handlers.on_run(ex, NAMES, "default", False, HAMLET, False, [], None, *page()))
    go.set()
    press.join(30)
    assert "already running" in second[-1][1 + STATUS_AT] and "✓ done" in first[-1][1 + STATUS_AT]
    assert started == [1] and not ex.running


def test_each_session_has_its_own_lock_and_a_copy_gets_a_new_one(loads):
    import copy
    import pickle
    a, b = Explorer(), Explorer()
    b.begin(NAMES, DecodeConfig(), HAMLET, resume=False)
    done = threading.Event()
    with a.guard:  # one session's settings being taken by its Run: another session's move goes through
        worker = threading.Thread(target=lambda: (b.offer_live(DecodeConfig(tau=0.3)), done.set()))
        worker.start()
        assert done.wait(5), "a session waited on another session's lock"
    worker.join()
    fresh = Explorer()
    for twin in (copy.deepcopy(fresh), pickle.loads(pickle.dumps(fresh))):
        assert twin.guard is not fresh.guard and twin.claim() and not fresh.running
