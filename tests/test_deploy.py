"""Where people run it: the Spaces front matter, ZeroGPU, launch flags, the named API, the data sample, gated and
remote-code models, and chat settings (system prompt, Qwen3's thinking switch)."""
import dataclasses
import importlib.metadata as md
import importlib.util
import inspect
import json
import re
import socket

import httpx
import pytest
import transformers
import yaml

import adafuse.loading as loading
from adafuse import BUNDLED, DEFAULT_PAIR, PAPER_MODELS, AdaFuse, DecodeConfig, ModelLoadError, get_model
from adafuse.cli import build_parser, main
from adafuse.harness import tasks
from adafuse.session import LocalSession, has_thinking_switch, render_prompt
from tests.conftest import ROOT

PROMPT = "Question: What is the capital of France?\nAnswer:"


# ---- Hugging Face Spaces ----
def _front_matter() -> tuple[dict, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.match(r"---\n(.*?)\n---\n", text, re.DOTALL)
    assert m, "README.md must start with the Spaces front matter between --- lines"
    return yaml.safe_load(m.group(1)), text[m.end():]


def _pin(package: str) -> str:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return next(line.split("==")[1].strip() for line in lines if line.startswith(f"{package}=="))


def test_spaces_front_matter_matches_the_requirements():
    meta, rest = _front_matter()
    assert meta["sdk"] == "gradio"
    assert str(meta["sdk_version"]) == _pin("gradio") == md.version("gradio")
    assert (ROOT / meta["app_file"]).is_file()
    assert 0 < len(meta["short_description"]) <= 60
    assert meta["pinned"] is False and meta["title"] and meta["emoji"]
    colors = {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
    assert {meta["colorFrom"], meta["colorTo"]} <= colors
    assert set(meta["models"]) == {b["hub"] for b in BUNDLED.values()} | set(PAPER_MODELS)
    assert rest.lstrip().startswith("# AdaFuse Explorer\n")  # the README itself follows unchanged


# ---- ZeroGPU ----
def test_gpu_decorator_is_a_no_op_off_zerogpu():
    assert _pin("spaces") == md.version("spaces")
    assert importlib.util.find_spec("spaces")  # installed, as on a Space
    from app.gpu import ZERO_GPU, gpu

    def f(x):
        return x + 1

    def g(n):
        yield from range(n)

    assert ZERO_GPU is False
    assert gpu(f) is f and gpu(duration=30)(f) is f and gpu(g) is g
    assert inspect.isgeneratorfunction(gpu(duration=5)(g)) and list(gpu(g)(3)) == [0, 1, 2]


# ---- app.py: the demo and the launch flags ----
@pytest.fixture(scope="module")
def app_main():
    """app.py loaded as Spaces does (not as __main__): builds `demo`, launches nothing."""
    spec = importlib.util.spec_from_file_location("adafuse_app_main", ROOT / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_app_builds_the_demo_without_launching(app_main):
    import gradio as gr
    assert isinstance(app_main.demo, gr.Blocks) and not app_main.ZERO_GPU


def test_launch_flags_win_over_the_environment(app_main, monkeypatch):
    for var in ("GRADIO_SERVER_NAME", "PORT", "GRADIO_SERVER_PORT", "ADAFUSE_AUTH"):
        monkeypatch.delenv(var, raising=False)
    a = app_main.parse_args([])
    assert (a.host, a.port, a.share, a.auth) == ("127.0.0.1", 7860, False, None)
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "7000")
    monkeypatch.setenv("ADAFUSE_AUTH", "ann:pw")
    a = app_main.parse_args([])
    assert (a.host, a.port, a.auth) == ("0.0.0.0", 7000, ("ann", "pw"))
    monkeypatch.setenv("PORT", "7100")  # Spaces-style PORT comes before GRADIO_SERVER_PORT
    assert app_main.parse_args([]).port == 7100
    a = app_main.parse_args(["--host", "localhost", "--port", "8080", "--share", "--auth", "bob:a:b"])
    assert (a.host, a.port, a.share, a.auth) == ("localhost", 8080, True, ("bob", "a:b"))


@pytest.mark.parametrize("argv, env, flag", [(["--auth", "bob"], {}, "--auth"), (["--auth", ":pw"], {}, "--auth"),
                                              ([], {"ADAFUSE_AUTH": "nocolon"}, "ADAFUSE_AUTH"),
                                              (["--port", "http"], {}, "--port"), ([], {"PORT": "99999"}, "PORT")])
def test_bad_launch_flags_exit_2_with_a_message(app_main, monkeypatch, capsys, argv, env, flag):
    for var in ("PORT", "GRADIO_SERVER_PORT", "ADAFUSE_AUTH"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as out:
        app_main.parse_args(argv)
    err = capsys.readouterr().err
    assert out.value.code == 2 and flag in err and ("USER:PASS" in err or "port" in err)


# ---- the named API ----
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def api_url():
    import gradio as gr
    from app.api import register
    with gr.Blocks() as demo:
        gr.Markdown("API only")
        register()
    port = _free_port()
    demo.queue().launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
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


# ---- benchmark data: the full sets, else the sample in assets/data ----
def test_sample_data_when_the_full_sets_are_missing(monkeypatch, tmp_path):
    monkeypatch.delenv("ADAFUSE_DATA", raising=False)
    assert tasks.find_data(roots=(tmp_path,)) == tasks.SAMPLE_DATA
    assert tasks.data_source(tasks.SAMPLE_DATA).startswith("sample")
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert tasks.find_data(roots=(tmp_path,)) == tmp_path / "shared" / "data"
    assert tasks.data_source(tmp_path / "shared" / "data").startswith("full")
    size = sum(f.stat().st_size for f in tasks.SAMPLE_DATA.rglob("*") if f.is_file())
    assert size < 1_000_000
    full = tasks.find_data()
    for task in tasks.TASKS.values():
        sample = tasks.read_examples(tasks.SAMPLE_DATA / task.folder / task.file, None)
        assert len(sample) == 20 and (tasks.SAMPLE_DATA / task.folder / task.prompt_file).is_file()
        if full != tasks.SAMPLE_DATA:  # the sample is the head of the full set, line numbers included
            assert sample == tasks.read_examples(full / task.folder / task.file, 20)
            assert (tasks.SAMPLE_DATA / task.folder / task.prompt_file).read_text() == \
                (full / task.folder / task.prompt_file).read_text()


def test_eval_runs_on_the_sample_and_a_missing_adafuse_data_is_a_typed_error(monkeypatch, tmp_path, capsys):
    out = tmp_path / "results"
    assert main(["eval", "--task", "nq", "--data", str(tasks.SAMPLE_DATA), "--limit", "2", "--methods",
                 "greedy:smollm2-135m-instruct", "--out", str(out), "--no-progress"]) == 0
    rows = [json.loads(line) for line in (out / "nq.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rows] == [1, 2] and "data: sample" in capsys.readouterr().err
    missing = tmp_path / "nowhere"
    monkeypatch.setenv("ADAFUSE_DATA", str(missing))
    assert tasks.find_data() == missing  # explicit: never replaced by the sample
    assert main(["eval", "--task", "nq", "--data", str(missing), "--out", str(out)]) == 2
    assert f"ADAFUSE_DATA={missing} is not a folder" in capsys.readouterr().err


# ---- gated and remote-code models ----
def _gated_error(name: str) -> OSError:
    """What transformers raises for a gated repository: huggingface_hub's GatedRepoError wrapped in an OSError."""
    from huggingface_hub.errors import GatedRepoError
    url = f"https://huggingface.co/{name}/resolve/main/config.json"
    response = httpx.Response(403, request=httpx.Request("GET", url))
    try:
        raise GatedRepoError(f"403 Client Error. Cannot access gated repo for url {url}.", response=response)
    except GatedRepoError as exc:
        try:
            raise OSError(f"You are trying to access a gated repo.\nMake sure to have access to it at "
                          f"https://huggingface.co/{name}.\n{exc}") from exc
        except OSError as wrapped:
            return wrapped


def _patch_loader(monkeypatch, error):
    """AutoTokenizer.from_pretrained (the first Hub call of a load) fails like transformers does: not in the local
    cache first, then `error` from the Hub."""
    def from_pretrained(cls, name, **kw):
        if kw.get("local_files_only") and not isinstance(error, ValueError):
            raise OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them "
                          "in the cached files.")
        raise error(name) if callable(error) else error
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", classmethod(from_pretrained))
    monkeypatch.setattr(loading, "_hub_reachable", lambda timeout=3.0: True)


@pytest.mark.parametrize("error", [_gated_error, lambda n: _gated_error(n).__cause__,
                                   lambda n: OSError(f"401 Client Error: Access to model {n} is restricted.")])
def test_a_gated_model_says_how_to_get_access(monkeypatch, error):
    _patch_loader(monkeypatch, error)
    name = "meta-llama/Llama-3.1-8B-Instruct"
    with pytest.raises(ModelLoadError) as err:
        loading.load_model(name, "cpu")
    msg = str(err.value)
    assert "gated" in msg and f"https://huggingface.co/{name}" in msg and "HF_TOKEN" in msg and "hf auth login" in msg


def test_a_remote_code_model_says_how_to_allow_it(monkeypatch):
    name = "internlm/internlm3-8b-instruct"
    _patch_loader(monkeypatch, ValueError(
        f"The repository {name} contains custom code which must be executed to correctly load the model. You can "
        f"inspect the repository content at https://hf.co/{name} .\nPlease pass the argument `trust_remote_code=True` "
        "to allow custom code to be run."))
    with pytest.raises(ModelLoadError) as err:
        loading.load_model(name, "cpu")
    msg = str(err.value)
    assert all(s in msg for s in ("remote code", "trust_remote_code=True", "--trust-remote-code",
                                  '"Trust remote code"', "runs with your permissions"))


def test_trust_remote_code_reaches_get_model_from_the_cli(monkeypatch, tmp_path):
    import adafuse.harness.evaluate as evaluate
    seen = []

    def fake_get_model(name, device=None, dtype=None, trust_remote_code=False):
        seen.append(trust_remote_code)
        raise ModelLoadError("stop here")

    monkeypatch.setattr(loading, "get_model", fake_get_model)
    monkeypatch.setattr(evaluate, "get_model", fake_get_model)
    assert main(["run", "--models", "a/b", "c/d", "--prompt", "hi", "--trust-remote-code"]) == 2
    assert main(["run", "--models", "a/b", "c/d", "--prompt", "hi"]) == 2
    assert main(["eval", "--task", "nq", "--data", str(tasks.SAMPLE_DATA), "--limit", "1", "--models", "a/b", "c/d",
                 "--out", str(tmp_path), "--trust-remote-code"]) == 2
    assert seen == [True, False, True]


# ---- chat mode: system prompt and the thinking switch ----
THINKING_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
                     "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")
NO_SYSTEM_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not "
                      "supported') }}{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>")


@pytest.fixture(scope="module")
def smol():
    return get_model("smollm2-135m-instruct")


def _with_template(lm, template: str):
    """The same model with a copy of its tokenizer that has another chat template."""
    import copy
    tok = copy.deepcopy(lm.tokenizer)
    tok.chat_template = template
    return dataclasses.replace(lm, tokenizer=tok)


def test_chat_system_prompt_comes_before_the_user_message(smol):
    text, mode = render_prompt(smol, "What is 2+2?", "chat", system="Answer with one number.")
    assert mode == "chat (system)"
    assert text.index("<|im_start|>system\nAnswer with one number.") < text.index("<|im_start|>user\nWhat is 2+2?")
    assert "You are a helpful AI assistant" not in text  # it replaces the template's default system message
    assert render_prompt(smol, "What is 2+2?", "chat")[1] == "chat"
    # raw mode (and chat without a template) read the prompt as is, and say what they ignored
    assert render_prompt(smol, "Q", "raw", system="S") == ("Q", "raw (system prompt ignored)")
    assert render_prompt(smol, "Q", "raw", thinking=False) == ("Q", "raw (thinking switch ignored)")
    plain = _with_template(smol, None)
    assert render_prompt(plain, "Q", "chat", system="S") == ("Q", "raw (no chat template; system prompt ignored)")
    assert render_prompt(plain, "Q", "chat") == ("Q", "raw (no chat template)")


def test_a_template_without_a_system_role_gets_it_in_the_user_message(smol):
    lm = _with_template(smol, NO_SYSTEM_TEMPLATE)
    text, mode = render_prompt(lm, "What is 2+2?", "chat", system="Be brief.")
    assert text == "<|user|>Be brief.\n\nWhat is 2+2?\n<|assistant|>" and mode == "chat (system in user message)"


def test_the_thinking_switch_reaches_templates_that_have_it(smol):
    lm = _with_template(smol, THINKING_TEMPLATE)
    assert has_thinking_switch(lm) and not has_thinking_switch(smol)
    on, off, default = (render_prompt(lm, "Hi", "chat", thinking=t) for t in (True, False, None))
    assert off[0].endswith("<think></think>") and not on[0].endswith("</think>") and default[0] == on[0]
    assert (on[1], off[1], default[1]) == ("chat (thinking on)", "chat (thinking off)", "chat")
    # a template without the switch is rendered as without the setting, and the mode says so
    assert render_prompt(smol, "Hi", "chat", thinking=False) == (render_prompt(smol, "Hi", "chat")[0],
                                                                 "chat (no thinking switch)")


def test_a_session_records_the_prompt_it_was_given(smol):
    s = LocalSession(smol, "What is 2+2?", "chat", (), system="Answer with one number.")
    assert s.mode_used == "chat (system)" and "Answer with one number." in s.prefix_text


def test_the_cli_reads_system_and_thinking():
    run = lambda *a: build_parser().parse_args(["run", "--prompt", "hi", *a])  # noqa: E731
    assert (run().system, run().thinking) == ("", None)
    assert run("--thinking").thinking is True and run("--no-thinking").thinking is False
    assert run("--system", "Be brief.").system == "Be brief."


def test_a_decode_traces_the_system_prompt(pair):
    """The decoder passes the system prompt and the thinking switch to each model's view."""
    cfg = DecodeConfig(mode="chat", system="Answer with one word.", max_new_words=2)
    trace = AdaFuse(pair, cfg).generate("What is the capital of France?")
    assert trace.prompt_modes == {"smollm2-135m-instruct": "chat (system)",
                                  "gemma3-270m": "raw (no chat template; system prompt ignored)"}
    assert trace.settings["system"] == "Answer with one word." and trace.settings["thinking"] is None
