"""`adafuse serve` under the public rules: a request names nothing the server would load, read or reach — not a
member (a Hub id, a folder, a `vllm:` spec at a local port), not a gate file, not a device — and each such request is
an OpenAI error saying what the operator sets instead. In-process on the toy pair; every way of loading a model fails
the test if anything tries."""
from __future__ import annotations

import contextlib
import select
import socket
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from adafuse import AdaFuse, DecodeConfig
from adafuse.models import ModelRegistry
from adafuse.server.app import ServeSettings, build_app
from tests.toy import toy_pair

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]
GATE = str(ROOT / "assets" / "gates" / "qa.json")  # a real gate file on this server


@contextlib.contextmanager
def listener():
    """A TCP listener on a free local port: yields (port, whether anything connected to it so far)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1], lambda: bool(select.select([s], [], [], 0)[0])


@pytest.fixture
def http(monkeypatch):
    """The server on the toy pair with one gate offered by name; any model load during a request fails the test."""
    def never(*args, **kwargs):
        pytest.fail(f"a request made the server load or reach a model: {args}")
    for target in ("adafuse.models.served.load_served", "adafuse.models.local.load_model"):
        monkeypatch.setattr(target, never)
    monkeypatch.setattr(ModelRegistry, "get", never)
    ens = AdaFuse(toy_pair(), DecodeConfig(tau=0.7))
    with TestClient(build_app(ens, ServeSettings(gates={"qa": GATE}))) as client:
        yield client


def test_a_request_cannot_name_a_member_even_one_on_a_local_port(http):
    with listener() as (port, heard):
        for model in (f"vllm:http://127.0.0.1:{port}/v1#probe", str(ROOT), "Qwen/Qwen3-8B", "adafuse@cuda:0"):
            r = http.post("/v1/completions", json={"model": model, "prompt": "Q", "max_tokens": 4})
            error = r.json()["error"]
            assert r.status_code == 404 and error["param"] == "model" and "adafuse serve --models" in error["message"]
        assert not heard()


@pytest.mark.parametrize("adafuse, param, says", [
    ({"gate": GATE}, "adafuse.gate", "not a gate of this server"),  # a path is not a gate's name, even a real one
    ({"models": ["gemma3-270m", "/srv/models/x"]}, "adafuse.models", "not a setting a request can change"),
    ({"device": "cuda:0"}, "adafuse.device", "not a setting a request can change"),
    ({"trust_remote_code": True}, "adafuse.trust_remote_code", "not a setting a request can change"),
    ({"method": "greedy:/srv/models/x"}, "adafuse.method", "is invalid"),
    ({"method": f"adafuse[gate={GATE}]"}, "adafuse.gate", "not a setting of method"),
    ({"branches": 1000}, "adafuse.branches", "is invalid")])
def test_what_a_request_sets_is_checked_before_anything_loads(http, adafuse, param, says):
    r = http.post("/v1/chat/completions", json={"model": "adafuse", "messages": [{"role": "user", "content": "Q"}],
                                                "adafuse": adafuse})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param and says in error["message"], error


def test_fields_outside_openais_api_are_ignored_and_the_members_stay_the_servers(http):
    r = http.post("/v1/completions", json={"model": "adafuse", "prompt": "Q", "max_tokens": 4,
                                           "models": ["/srv/models/x"], "base_url": "http://169.254.169.254",
                                           "adafuse": {"trace": True}})
    assert r.status_code == 200, r.json()
    assert r.json()["adafuse_trace"]["models"] == ["a", "b"]
