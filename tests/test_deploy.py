"""Where people run it: the Spaces front matter, requirements.txt against pyproject.toml, ZeroGPU, app.py and its
launch flags."""
import importlib.metadata as md
import importlib.util
import inspect
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from adafuse import BUNDLED, PAPER_MODELS

ROOT = Path(__file__).resolve().parents[1]


def _front_matter() -> tuple[dict, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.match(r"---\n(.*?)\n---\n", text, re.DOTALL)
    assert m, "README.md must start with the Spaces front matter between --- lines"
    return yaml.safe_load(m.group(1)), text[m.end():]


def _pin(package: str) -> str:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return next(line.split("==")[1].strip() for line in lines if line.startswith(f"{package}=="))


def _requirements(lines) -> dict[str, str]:
    """{normalized name: version specifier} of requirement lines (comments and blank lines skipped)."""
    out = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", line)
            name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
            assert name not in out or out[name] == m.group(2), f"{name} pinned twice: {out[name]}, {m.group(2)}"
            out[name] = m.group(2)
    return out


def test_requirements_txt_is_the_package_with_its_app_and_eval_extras():
    """Spaces installs requirements.txt, everyone else pyproject.toml: the same packages with the same pins."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    package = _requirements(project["dependencies"] + extras["app"] + extras["eval"])
    spaces = _requirements((ROOT / "requirements.txt").read_text().splitlines())
    assert spaces == package
    assert not set(_requirements(extras["test"])) & set(spaces)  # the test tools stay off the Space
    assert project["scripts"] == {"adafuse": "adafuse.cli:main"}


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


def test_public_and_private_flags_force_public_mode_and_exclude_each_other(app_main, capsys):
    from app.public import Policy
    for argv, public in (([], None), (["--public"], True), (["--private"], False)):
        a = app_main.parse_args(["--host", "0.0.0.0", *argv])
        assert a.public is public
        assert Policy.from_env(a.public, "", a.host, a.share, env={}).public is (public is not False)
    with pytest.raises(SystemExit) as out:
        app_main.parse_args(["--public", "--private"])
    assert out.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
