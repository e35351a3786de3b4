"""AdaFuse Explorer: `python app.py [--host H] [--port P] [--share] [--auth USER:PASS] [--public | --private]` serves
the UI on the embedded default pair (Hugging Face Spaces entry point: `demo` is built on import)."""
import argparse
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the models' worker threads tokenize; no forked pools


def _port(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port: use a number from 1 to 65535 (--port, PORT or "
                                         "GRADIO_SERVER_PORT)")
    return int(value)


def _auth(value: str) -> tuple[str, str]:
    user, colon, password = value.partition(":")
    if not (colon and user and password):
        raise argparse.ArgumentTypeError("write USER:PASS, a user name and a password joined by a colon (--auth or "
                                         "ADAFUSE_AUTH)")
    return user, password


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Launch flags; each defaults to its environment variable, and a flag wins over the environment."""
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python app.py", description="Serve AdaFuse Explorer.")
    p.add_argument("--host", default=env("GRADIO_SERVER_NAME", "127.0.0.1"),
                   help="address to listen on; 0.0.0.0 for every interface (env GRADIO_SERVER_NAME; default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=env("PORT") or env("GRADIO_SERVER_PORT") or "7860",
                   help="port (env PORT, then GRADIO_SERVER_PORT; default 7860)")
    p.add_argument("--share", action="store_true", help="also serve through a temporary public gradio.live link")
    p.add_argument("--auth", type=_auth, default=env("ADAFUSE_AUTH") or None, metavar="USER:PASS",
                   help="ask for this user name and password (env ADAFUSE_AUTH)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--public", dest="public", action="store_const", const=True,
                      help="public mode whatever the host: visitors pick only the operator's models (ADAFUSE_MODELS) "
                           "and servers (ADAFUSE_SERVERS), within per-visitor limits; on by default with SPACE_ID set, "
                           "--share or a host beyond loopback")
    mode.add_argument("--private", dest="public", action="store_const", const=False,
                      help="no public mode even so: every visitor may load any model or path, unload, move models")
    return p.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # before the imports below: a bad flag or --help answers at once

from app.gpu import ZERO_GPU  # noqa: E402  (first: on ZeroGPU, importing `spaces` patches torch)
from app.public import Policy, configure  # noqa: E402
from app.ui import CSS, build_demo, queued  # noqa: E402  (import from app.* at the top: reload mode swaps "app")

if ZERO_GPU:  # ZeroGPU wants the weights placed at startup; model work then runs in GPU leases (app/leases.py)
    from adafuse import DEFAULT_PAIR
    from app.controller import MODELS
    for name in DEFAULT_PAIR:
        MODELS.get(name, device="cuda")

# who may do what: launched here, from the flags (public with --share, a host beyond loopback or SPACE_ID set);
# imported (Spaces' reload mode), from the environment when asked
RULES = configure(Policy.from_env(ARGS.public, "--public" if ARGS.public else "", ARGS.host, ARGS.share)) \
    if __name__ == "__main__" else None
demo = build_demo(RULES)

if __name__ == "__main__":
    queued(demo, default_concurrency_limit=2, max_size=32).launch(
        server_name=ARGS.host, server_port=ARGS.port, share=ARGS.share, auth=ARGS.auth, css=CSS,
        max_file_size="10mb" if RULES.public else None)  # the only upload: a trace to load
