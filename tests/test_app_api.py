"""The app's named API (app/api.py), served by a running Gradio app and called with gradio_client."""
import re
import socket

import pytest

from adafuse import DEFAULT_PAIR, PAPER_MODELS


pytestmark = pytest.mark.models  # the endpoint decodes with the real pair

PROMPT = "Question: What is the capital of France?\nAnswer:"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def api_url(pair):
    import gradio as gr
    from adafuse.models import default_registry
    from app import api, controller
    from app.ui import queued
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(controller, "MODELS", default_registry())  # the pair this session loaded, not a second copy
        with gr.Blocks() as demo:
            gr.Markdown("API only")
            api.register()
        port = _free_port()
        queued(demo).launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
        yield f"http://127.0.0.1:{port}/"
        demo.close()


def test_decode_endpoint_answers_a_script(api_url):
    from gradio_client import Client
    client = Client(api_url, verbose=False)
    r = client.predict(PROMPT, "smollm2-135m-instruct,gemma3-270m", 0.7, 3, 3, 8, "raw", "\\n", api_name="/decode")
    assert r["output"].strip() and r["rounds"] == len(r["trace"]["rounds"]) > 0
    assert r["words"] <= 8 and r["stop_reason"] and "\n" not in r["output"]
    assert r["trace"]["models"] == list(DEFAULT_PAIR) and r["trace"]["settings"]["stop"] == ["\n"]
    listed = client.predict(api_name="/models")
    assert listed["default_pair"] == list(DEFAULT_PAIR) and set(PAPER_MODELS) <= set(listed["paper"])


@pytest.mark.parametrize("args, message", [(("no-such-model,gemma3-270m",), "unknown model 'no-such-model'"),
                                           (("gemma3-270m",), "an ensemble needs 2 to 4"),
                                           (("smollm2-135m-instruct,gemma3-270m", 1.5), "tau=1.5 is invalid"),
                                           (("smollm2-135m-instruct,gemma3-270m", 0.7, 3, 3, 8, "json"), "mode=")])
def test_decode_endpoint_errors_reach_the_client(api_url, args, message, capsys):
    from gradio_client import Client
    from gradio_client.exceptions import AppError
    with pytest.raises(AppError, match=re.escape(message)):
        Client(api_url, verbose=False).predict(PROMPT, *args, api_name="/decode")
    with pytest.raises(AppError, match="prompt is empty"):
        Client(api_url, verbose=False).predict("  ", api_name="/decode")
    # a caller's mistake is answered, not logged on the server as a crash
    assert "Traceback" not in capsys.readouterr().err
