"""The command line (adafuse/cli.py): bad input is a message and exit code 2, never a stack trace; flags reach the
decoder and the loader; eval runs on the bundled sample."""
import json
import os
import subprocess
import sys

import pytest

import adafuse.models as models
from adafuse import ModelLoadError
from adafuse.cli import build_parser, main
from adafuse.harness import tasks


@pytest.mark.parametrize("args", [["--prompt", "  "], ["--prompt", "hi", "--tau", "3"],
                                  ["--models", "nope", "gemma3-270m", "--prompt", "hi"],
                                  ["--models", "gemma3-270m", "--prompt", "hi"], ["--prompt-file", "/no/such/file.txt"],
                                  ["--models", "gemma3-270m@gpu", "smollm2-135m-instruct", "--prompt", "hi"]])
def test_cli_reports_bad_input_without_a_stack_trace(args, capsys):
    assert main(["run", *args]) == 2  # an unexpected exception would be 1, or raise here
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err, err


@pytest.mark.parametrize("args", [["--prompt", "hi", "--method", "fixed-span-0"],
                                  ["--prompt", "hi", "--method", "adafuse", "--seed", "3"],
                                  ["--prompt", "hi", "--method", "vote"]])
def test_a_bad_method_spec_or_setting_is_a_message(args, capsys):
    assert main(["run", *args]) == 2
    assert "error:" in capsys.readouterr().err


def test_a_package_missing_from_the_install_names_the_extra_that_brings_it(monkeypatch, capsys):
    """A wheel installed without extras: `adafuse eval` needs plotly, sacrebleu, tqdm (the eval extra)."""
    import adafuse.cli as cli

    def missing(args):
        raise ModuleNotFoundError("No module named 'plotly'", name="plotly")
    monkeypatch.setattr(cli, "run_eval", missing)
    assert main(["eval", "--task", "triviaqa"]) == 2
    assert "pip install 'adafuse-explorer[eval]'" in capsys.readouterr().err


def test_python_m_adafuse_says_what_is_wrong_with_a_missing_model_offline():
    """The entry point in its own process, offline (huggingface_hub reads HF_HUB_OFFLINE when imported)."""
    args = ["--models", "someone/missing-model", "gemma3-270m", "--prompt", "hi"]
    out = subprocess.run([sys.executable, "-m", "adafuse", "run", *args], capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert out.returncode == 2 and "error:" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "someone/missing-model" in out.stderr


def test_the_cli_reads_system_and_thinking():
    run = lambda *a: build_parser().parse_args(["run", "--prompt", "hi", *a])  # noqa: E731
    assert (run().system, run().thinking) == ("", None)
    assert run("--thinking").thinking is True and run("--no-thinking").thinking is False
    assert run("--system", "Be brief.").system == "Be brief."


def test_allow_empty_reaches_the_decode_from_the_command_line():
    from adafuse.cli import decode_config
    run = lambda *a: build_parser().parse_args(["run", "--prompt", "hi", *a])  # noqa: E731
    assert decode_config(run()).allow_empty is False and decode_config(run("--allow-empty")).allow_empty is True


def test_trust_remote_code_reaches_get_model_from_the_cli(monkeypatch, tmp_path):
    seen = []

    def fake_get(registry, name, device=None, dtype=None, trust_remote_code=False):
        seen.append(trust_remote_code)
        raise ModelLoadError("stop here")

    monkeypatch.setattr(models.ModelRegistry, "get", fake_get)  # the command's own registry
    assert main(["run", "--models", "a/b", "c/d", "--prompt", "hi", "--trust-remote-code"]) == 2
    assert main(["run", "--models", "a/b", "c/d", "--prompt", "hi"]) == 2
    assert main(["eval", "--task", "nq", "--data", str(tasks.SAMPLE_DATA), "--limit", "1", "--models", "a/b", "c/d",
                 "--out", str(tmp_path), "--trust-remote-code"]) == 2
    assert seen == [True, False, True]


@pytest.mark.models  # decodes with SmolLM2
def test_eval_runs_on_the_sample_and_a_missing_adafuse_data_is_a_typed_error(monkeypatch, tmp_path, capsys):
    out = tmp_path / "results"
    assert main(["eval", "--task", "nq", "--data", str(tasks.SAMPLE_DATA), "--limit", "2", "--methods",
                 "greedy:smollm2-135m-instruct", "--out", str(out), "--no-progress"]) == 0
    rows = [json.loads(line) for line in (out / "nq.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rows] == [1, 2] and "data: sample" in capsys.readouterr().err
    missing = tmp_path / "nowhere"
    monkeypatch.setenv("ADAFUSE_DATA", str(missing))
    assert tasks.data_dir() == missing  # explicit: never replaced by the sample
    assert main(["eval", "--task", "nq", "--data", str(missing), "--out", str(out)]) == 2
    assert f"ADAFUSE_DATA={missing} is not a folder" in capsys.readouterr().err
