"""`python -m adafuse serve` started for a test: a free port, the process, its log, and a wait for /health."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def adafuse_serve(args: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """Run `python -m adafuse serve --port P ARGS` (output into `log`) until the block ends; yields its base URL once
    /health answers (a server that exits or does not come up in 300 s fails the test with its log)."""
    port = free_port()
    cmd = [sys.executable, "-m", "adafuse", "serve", "--port", str(port), *args]
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, f"adafuse serve exited {proc.returncode}:\n{log.read_text()}"
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"adafuse serve did not come up:\n{log.read_text()}"
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
