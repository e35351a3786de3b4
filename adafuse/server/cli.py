"""`adafuse serve`: load the ensemble once, then serve it over HTTP as one OpenAI-compatible model."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from ..cli import add_decode_args, decode_config, load_models
from ..errors import AdafuseError, ConfigError
from ..many import DEFAULT_CONCURRENCY, DEFAULT_DEADLINE_S, MAX_BRANCHES, check_concurrency
from ..models import BUNDLED, DEFAULT_PAIR

EXTRA = "adafuse serve needs the serve extra: pip install 'adafuse-explorer[serve]' (FastAPI, uvicorn, sse-starlette)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m adafuse serve", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Serve the fused ensemble as one model behind an OpenAI-compatible API: GET /v1/models, "
                    "POST /v1/completions, POST /v1/chat/completions (stream=true: one event per committed round). "
                    "The settings below are every request's defaults; a request changes some through its `adafuse` "
                    "object (tau, max_words, branches, weights, gate, method, speculate, ...).",
        epilog=f"Bundled models (offline): {', '.join(BUNDLED)}. Any Hugging Face id, local folder or .gguf file "
               "also works.")
    p.add_argument("--models", nargs="+", default=list(DEFAULT_PAIR), metavar="MODEL",
                   help="2 to 4 models (one with --method greedy); MODEL@DEVICE[,DTYPE] places one")
    p.add_argument("--name", default="adafuse", help="the model name clients send (GET /v1/models lists it)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--api-key", help="clients must send `Authorization: Bearer KEY` (unset: $ADAFUSE_API_KEY; "
                                     "neither: no key)")
    p.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, metavar="N",
                   help="decodes at once; their forwards are shared (models/batching.py)")
    p.add_argument("--queue", type=int, default=32, metavar="N",
                   help="requests that may wait for a decode; past that: 429 with Retry-After")
    add_decode_args(p, system="chat requests without a system message get this one ('\\n' is a newline)",
                    stop="stop string of requests that send none (repeatable; '\\n' is a newline)",
                    max_new_tokens="stop after this many tokens (a request's max_tokens replaces it)")
    p.add_argument("--max-tokens", type=int, metavar="N",
                   help="the most tokens a request may ask for (max_tokens); more is a 400 (default: the smallest "
                        "context window of the models)")
    p.add_argument("--max-branches", type=int, default=MAX_BRANCHES, metavar="B",
                   help="the most candidates a request may have an uncertain model explore (adafuse.branches)")
    p.add_argument("--timeout", type=float, default=DEFAULT_DEADLINE_S, metavar="SECONDS",
                   help="seconds one decode may run: then it stops before its next round and answers with the words "
                        "so far (finish_reason \"length\", adafuse stop reason \"deadline\"); 0: no limit")
    p.add_argument("--gate-dir", type=Path, metavar="DIR",
                   help="gate files requests may pick by file name without .json (adafuse.gate); --gate's too")
    p.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info",
                   help="uvicorn's log level (info: one line per request)")
    return p


def gates_from(args: argparse.Namespace) -> dict[str, str]:
    """The gate files requests may name: each *.json of --gate-dir by its name without .json, and --gate's."""
    gates: dict[str, str] = {}
    if args.gate_dir is not None:
        if not args.gate_dir.is_dir():
            raise ConfigError(f"--gate-dir {args.gate_dir} is not a folder: give one holding gate files")
        gates = {f.stem: str(f) for f in sorted(args.gate_dir.glob("*.json"))}
    if args.gate:
        gates.setdefault(Path(args.gate).stem, args.gate)
    return gates


def serve_settings(args: argparse.Namespace):
    """The server's own settings from its command line (key, slots, queue, limits, gates), checked."""
    from .app import ServeSettings
    if args.queue < 0:
        raise ConfigError(f"--queue {args.queue} is invalid: give 0 or more")
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port} is invalid: give a port from 1 to 65535")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ConfigError(f"--max-tokens {args.max_tokens} is invalid: give 1 or more")
    if args.max_branches < 1:
        raise ConfigError(f"--max-branches {args.max_branches} is invalid: give 1 or more")
    if not args.timeout >= 0:
        raise ConfigError(f"--timeout {args.timeout} is invalid: give seconds (0: no limit)")
    return ServeSettings(name=args.name, api_key=args.api_key or os.environ.get("ADAFUSE_API_KEY") or None,
                         concurrency=check_concurrency(args.concurrency), queue=args.queue, gates=gates_from(args),
                         max_tokens=args.max_tokens, max_branches=args.max_branches, timeout=args.timeout or None)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import uvicorn

        from .app import build_app
    except ImportError as exc:
        raise AdafuseError(f"{EXTRA} ({exc})") from exc
    from ..ensemble import AdaFuse
    cfg = decode_config(args)  # every request's defaults, checked before any model loads
    settings = serve_settings(args)
    models = load_models(args)  # the server's models, loaded once for every request
    app = build_app(AdaFuse(models, cfg, parallel=args.parallel), settings)
    log = logging.getLogger("adafuse.server")  # the server's own lines (cancelled decodes, failures) beside uvicorn's
    log.setLevel(args.log_level.upper())
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    log.addHandler(handler)
    print(f"serving {args.name!r} ({' + '.join(lm.name for lm in models)}) at http://{args.host}:{args.port}/v1"
          f"{' (API key required)' if settings.api_key else ''}", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
