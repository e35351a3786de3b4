"""A real vLLM OpenAI server on this machine, for the tests and `adafuse bench --remote`.

vLLM lives in its own virtual environment (`.venv-vllm/`, made by `./dev test` or `./dev vllm`: it pins its own
torch). `start(model)` serves one model folder on a free port and returns once `/v1/models` answers:

    adafuse serve-model [MODEL]     # prints the spec to pass to --models, Ctrl-C stops
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def vllm_venv() -> Path:
    """vLLM's own virtual environment: $ADAFUSE_VLLM_VENV, else .venv-vllm in the checkout (read when asked)."""
    return Path(os.environ.get("ADAFUSE_VLLM_VENV", ROOT / ".venv-vllm"))


def available() -> bool:
    venv = vllm_venv()
    return (venv / "bin" / "python").exists() and any(
        venv.glob("lib/python*/site-packages/vllm/entrypoints/openai/api_server.py"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_copy(folder: Path) -> Path:
    """The model folder as vLLM can read it: a folder converted from GGUF may say `CodeLlamaTokenizer`, which newer transformers
    map to a tokenizer that turns every space into token 0; the copy names the generic fast tokenizer instead (weights
    are linked, not copied)."""
    out = folder.with_name(folder.name + "-served")
    if (out / "config.json").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in folder.iterdir():
        if f.name == "tokenizer_config.json":
            cfg = json.loads(f.read_text())
            cfg["tokenizer_class"] = "TokenizersBackend"
            (tmp / f.name).write_text(json.dumps(cfg, indent=1))
        elif f.is_file():
            os.link(f, tmp / f.name) if f.stat().st_dev == tmp.stat().st_dev else shutil.copy2(f, tmp / f.name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


class Server:
    """A running `vllm serve` process; `spec` is what `--models` takes."""

    def __init__(self, folder: Path, name: str, port: int, log: Path):
        self.name, self.port, self.log = name, port, log
        self.url = f"http://127.0.0.1:{port}/v1"
        self.spec = f"vllm:{self.url}#{name}"
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
               # the engine in the server's own process: one process fewer to start (measured on this CPU: ready
               # in 32-35 s instead of 42, 41-44 CPU-seconds instead of 52)
               "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
               "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        env.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen(
            [str(vllm_venv() / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
             "--enforce-eager", "--dtype", "float32", "--max-model-len", "2048", "--max-logprobs", "64",
             "--enable-prompt-tokens-details"],
            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait(self, timeout: float = 300.0) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({self.proc.returncode}); its log: {self.log}\n"
                                   + self.log.read_text()[-3000:])
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=2) as r:
                    if json.loads(r.read()).get("data"):
                        return self
            except OSError:
                time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vllm serve did not answer within {timeout:.0f}s; its log: {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start(model: str, name: str | None = None, log: Path | None = None) -> Server:
    """Serve a bundled model (its converted folder) or a model folder with vLLM on a free port."""
    if not available():
        raise RuntimeError(f"vLLM is not installed in {vllm_venv()}: run `./dev vllm` (its own virtual environment)")
    from ..models import get_model
    path = Path(model)
    if not path.is_dir():
        path = Path(get_model(model, device="cpu").folder)
        if not path.is_dir():
            raise RuntimeError(f"{model!r} has no local folder to serve (a Hub model): pass its folder instead")
    folder = served_copy(path)
    log = log or Path(os.environ.get("TMPDIR", "/tmp")) / f"adafuse-vllm-{os.getpid()}.log"
    return Server(folder, name or model.replace("/", "-"), _free_port(), log).wait()


def main(argv=None) -> int:
    import argparse
    from .. import DEFAULT_PAIR
    p = argparse.ArgumentParser(prog="adafuse serve-model",
                                description="Serve one model with vLLM's OpenAI server (CPU) for `vllm:` members.")
    p.add_argument("model", nargs="?", default=DEFAULT_PAIR[0],
                   help="a bundled model name or a model folder (default: the first model of the default pair)")
    p.add_argument("--name", help="the name the server gives the model (default: from MODEL)")
    args = p.parse_args(argv)
    server = start(args.model, args.name)
    print(f"serving: --models {server.spec}   (log: {server.log}; Ctrl-C stops)", flush=True)
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
