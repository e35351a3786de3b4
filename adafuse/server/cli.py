"""`adafuse serve`: load the ensemble once, then serve it over HTTP as one OpenAI-compatible model."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from ..config import DecodeConfig
from ..errors import AdafuseError, ConfigError
from ..many import DEFAULT_CONCURRENCY, check_concurrency
from ..methods import METHODS
from ..models import BUNDLED, DEFAULT_PAIR
from ..stops import parse_stops

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
    d = DecodeConfig()
    p.add_argument("--tau", type=float, default=d.tau, help="margin threshold τ_Δ in [0, 1]")
    p.add_argument("--max-words", type=int, default=d.max_words, help="M: most words a confident model commits")
    p.add_argument("--branches", type=int, default=d.branches, help="B: candidates an uncertain model explores")
    p.add_argument("--no-diversity", action="store_true", help="beam search instead of distinct first tokens")
    p.add_argument("--method", choices=METHODS, default=d.method, help="decoding method")
    p.add_argument("--span-words", type=int, default=d.span_words, help="n for --method fixed-span")
    p.add_argument("--system", default=d.system, metavar="TEXT",
                   help="chat requests without a system message get this one ('\\n' is a newline)")
    p.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=d.thinking,
                   help="chat requests: the template's enable_thinking switch; unset: the template's default")
    p.add_argument("--weights", type=float, nargs="+", default=[], metavar="W",
                   help="one weight per model, in --models order: fused score = Σ w·NLL / Σ w (default: equal)")
    p.add_argument("--gate", default="", metavar="PATH", help="a learned gate file (per-round weights)")
    p.add_argument("--gate-dir", type=Path, metavar="DIR",
                   help="gate files requests may pick by file name without .json (adafuse.gate); --gate's too")
    p.add_argument("--normalize", choices=("token", "word"), default=d.normalize,
                   help="average each candidate's NLL over its tokens (the paper) or over its words")
    p.add_argument("--speculate", action="store_true", help="speculative proposals (same decode, fewer forwards)")
    p.add_argument("--no-draft-lookup", action="store_true", help="with --speculate: no prompt lookup drafts")
    p.add_argument("--max-new-words", type=int, default=d.max_new_words, help="stop after this many words")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens,
                   help="stop after this many tokens (a request's max_tokens replaces it)")
    p.add_argument("--max-word-tokens", type=int, default=d.max_word_tokens, help="a word ends after this many tokens")
    p.add_argument("--stop", action="append", default=[],
                   help="stop string of requests that send none (repeatable; '\\n' is a newline)")
    p.add_argument("--device", help="cuda, cuda:1, cpu, auto ... for every model without @DEVICE")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let models whose Hub repository ships its own Python code run it (only ones you trust)")
    workers = p.add_mutually_exclusive_group()
    workers.add_argument("--parallel", dest="parallel", action="store_true", default=None,
                         help="each decode runs its models side by side, one worker each")
    workers.add_argument("--sequential", dest="parallel", action="store_false",
                         help="each decode runs its models one after another")
    p.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info",
                   help="uvicorn's log level (info: one line per request)")
    return p


def config_from(args: argparse.Namespace) -> DecodeConfig:
    """The settings every request starts from, checked before any model loads."""
    cfg = DecodeConfig(tau=args.tau, max_words=args.max_words, branches=args.branches, diversity=not args.no_diversity,
                       method=args.method, span_words=args.span_words, max_new_words=args.max_new_words,
                       max_new_tokens=args.max_new_tokens, max_word_tokens=args.max_word_tokens,
                       stop=tuple(x for s in args.stop for x in parse_stops(s)),
                       system=args.system.replace("\\n", "\n").replace("\\t", "\t"), thinking=args.thinking,
                       weights=tuple(args.weights), gate=args.gate, speculate=args.speculate,
                       draft_lookup=not args.no_draft_lookup, normalize=args.normalize)
    METHODS[cfg.method].check_count(cfg.method, len(args.models))
    if cfg.weights and len(cfg.weights) != len(args.models):
        raise ConfigError(f"--weights has {len(cfg.weights)} values for {len(args.models)} models: give one per model")
    return cfg


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import uvicorn

        from .app import ServeSettings, build_app
    except ImportError as exc:
        raise AdafuseError(f"{EXTRA} ({exc})") from exc
    from ..ensemble import AdaFuse
    from ..models import ModelRegistry
    cfg = config_from(args)
    if args.queue < 0:
        raise ConfigError(f"--queue {args.queue} is invalid: give 0 or more")
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port} is invalid: give a port from 1 to 65535")
    settings = ServeSettings(name=args.name, api_key=args.api_key or os.environ.get("ADAFUSE_API_KEY") or None,
                             concurrency=check_concurrency(args.concurrency), queue=args.queue, gates=gates_from(args))
    models, registry = [], ModelRegistry()  # the server's models, loaded once for every request
    for name in args.models:
        print(f"loading {name} ...", file=sys.stderr, flush=True)
        models.append(registry.get(name, device=args.device, trust_remote_code=args.trust_remote_code))
        print(f"  {models[-1].describe()}", file=sys.stderr, flush=True)
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
