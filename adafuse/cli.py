"""Command line `adafuse` (= `python -m adafuse`): run, eval, gate, bench, serve-model, serve."""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

from .config import NORMALIZATIONS, DecodeConfig, check_weights
from .method_registry import METHODS, method_specs, own_settings
from .methods import BASELINE
from .errors import AdafuseError
from .many import DEFAULT_CONCURRENCY, check_concurrency
from .models import BUNDLED, DEFAULT_PAIR

TRUST_HELP = ("let models whose Hub repository ships its own Python code run it: "
              "only for repositories you trust, the code runs with your permissions")
EPILOG = f"Bundled models (offline): {', '.join(BUNDLED)}. Any Hugging Face id, local folder or .gguf file also works."


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m adafuse", description="AdaFuse: word-level ensemble decoding.",
                                epilog=EPILOG)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="decode one prompt with an ensemble", epilog=EPILOG,
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    run.add_argument("--models", nargs="+", default=list(DEFAULT_PAIR), metavar="MODEL",
                     help="2 to 4 models (one with --method greedy); MODEL@DEVICE[,DTYPE] places one, e.g. "
                          "MODEL@cuda:1, ORG/MODEL@auto,bfloat16")
    src = run.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text ('\\n' is read as a newline)")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this file")
    run.add_argument("--mode", choices=("raw", "chat"), default=DecodeConfig().mode,
                     help="raw prompt for every model, or each model's chat template")
    add_decode_args(run)
    run.add_argument("--compare", action="store_true", help="also run each model alone (greedy)")
    run.add_argument("--json", type=Path, metavar="PATH", help="write the trace as JSON here")
    run.add_argument("--debug", action="store_true", help="show full stack traces on errors")

    sub.add_parser("gate", help="learn per-model weights from answers: gate train / gate search (see "
                   "python -m adafuse gate --help)", add_help=False)
    sub.add_parser("bench", help="benchmark methods on the bundled pair (see python -m adafuse bench --help)",
                   add_help=False)
    sub.add_parser("serve-model", help="serve one model with a vLLM OpenAI server for `vllm:` members (see "
                   "python -m adafuse serve-model --help)", add_help=False)
    sub.add_parser("serve", help="serve the fused ensemble as one OpenAI-compatible model (see "
                   "python -m adafuse serve --help)", add_help=False)
    sub.add_parser("lm-eval", help="lm-evaluation-harness with the `adafuse` model registered (lm_eval's own "
                   "arguments follow: python -m adafuse lm-eval run --model adafuse ...)", add_help=False)

    from .harness.tasks import TASKS
    ev = sub.add_parser("eval", help="evaluate methods on a benchmark task", epilog=EPILOG,
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ev.add_argument("--task", required=True, choices=list(TASKS), help="benchmark task")
    ev.add_argument("--data", type=Path, default=None,
                    help="folder holding nq/, triviaqa/, squad/, gsm8k/, flores/ (default: $ADAFUSE_DATA, else "
                         "../shared/data, else the 20-example sample shipped with the package)")
    ev.add_argument("--limit", type=int, help="first N examples of the file (default 20; with --lines: of that range, "
                                              "default all of it)")
    ev.add_argument("--lines", metavar="FIRST-LAST",
                    help="only these data lines, both ends included: 1-50 are the reported ones, 51-100 the validation "
                         "lines, 101 on training (gate search/train); resumes like any run")
    ev.add_argument("--methods", nargs="+", default=list(BASELINE), metavar="METHOD",
                    help=f"{', '.join(method_specs())} (fixed-span-N: any N; greedy: each model alone, greedy:MODEL "
                         "one); settings in brackets: adafuse[branches=5,tau=0.5,diversity=false], mixture[seed=3]")
    ev.add_argument("--models", nargs="+", default=list(DEFAULT_PAIR), metavar="MODEL", help="ensemble members")
    ev.add_argument("--tau", type=float, help="τ_Δ for every method (default 0.7)")
    ev.add_argument("--max-words", type=int, help="M for every method (default 3)")
    ev.add_argument("--branches", type=int, help="B for every method (default 3)")
    ev.add_argument("--weights", type=float, nargs="+", metavar="W", help="one weight per model for every method")
    ev.add_argument("--max-new-words", type=int, help="override the task's word cap (GSM8K: 200)")
    ev.add_argument("--normalize", choices=NORMALIZATIONS, default=None,
                    help="NLL unit for every method (default per word; the paper's: token)")
    ev.add_argument("--allow-empty", action=argparse.BooleanOptionalAction, default=None,
                    help="let the end of the answer win before its first word, as the paper's pool does (default: off)")
    ev.add_argument("--speculate", action=argparse.BooleanOptionalAction, default=None,
                    help="speculative proposals for every method (default: on, the library's default; the same "
                         "answers, fewer forwards)")
    ev.add_argument("--trust-remote-code", action="store_true", help=TRUST_HELP)
    ev.add_argument("--out", type=Path, default=Path("results"), help="folder for <task>.jsonl, summary.md, summary.csv")
    ev.add_argument("--on-bad-line", choices=("skip", "stop"), default="skip", help="what a bad data line does")
    ev.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, metavar="N",
                    help="decodes in flight at once: their forwards are shared (models/batching.py); rows are written "
                         "in the data's order all the same. On a 2-core CPU examples per minute rose up to 4 in flight "
                         "and stayed level at 8 (python -m adafuse.harness.bench --concurrency 1 2 4 8 16; "
                         "docs/many-decodes.md); a GPU gains further. 1: one at a time")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.add_argument("--debug", action="store_true", help="show full stack traces on errors")
    return p



def add_decode_args(p: argparse.ArgumentParser, **helps: str) -> None:
    """The decoding settings, the models' placement and workers, as `run` and `serve` take them (`helps`: other help
    texts by destination, e.g. system=...); `decode_config` reads them back."""
    d = DecodeConfig()
    say = {"system": "chat mode: a system message before the prompt ('\\n' is a newline)",
           "stop": "stop string (repeatable; '\\n' is a newline)", "max_new_tokens": "stop after this many tokens",
           **helps}
    p.add_argument("--tau", type=float, default=d.tau, help="margin threshold τ_Δ in [0, 1]")
    p.add_argument("--max-words", type=int, default=d.max_words, help="M: most words a confident model commits")
    p.add_argument("--branches", type=int, default=d.branches, help="B: candidates an uncertain model explores")
    p.add_argument("--no-diversity", action="store_true", help="beam search instead of distinct first tokens")
    p.add_argument("--method", default=d.method, metavar="SPEC",
                   help="decoding method, with its own settings in brackets or as the flags below (e.g. fixed-span-2, "
                        "mixture[seed=3]): " + "; ".join(f"{k}: {v.summary}" for k, v in METHODS.items()))
    for name, owners in own_settings().items():  # each method's own settings (adafuse/methods.py)
        f = owners[0][1]
        p.add_argument("--" + name.replace("_", "-"), type=type(f.default), metavar=name.split("_")[-1].upper(),
                       default=argparse.SUPPRESS,
                       help=f"{f.metadata['help']} (--method {', '.join(m for m, _ in owners)}; default {f.default})")
    p.add_argument("--system", default=d.system, metavar="TEXT", help=say["system"])
    p.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=d.thinking,
                   help="chat mode: turn the template's enable_thinking switch on or off; unset: the template's default")
    p.add_argument("--weights", type=float, nargs="+", default=[], metavar="W",
                   help="one weight per model, in --models order: fused score = Σ w·NLL / Σ w (default: equal)")
    p.add_argument("--gate", default="", metavar="PATH",
                   help="a learned gate file (per-round weights; assets/gates/ has ones for the bundled pair: qa.json and "
                        "mt-token.json were trained per token, so decode them with --normalize token)")
    p.add_argument("--normalize", choices=NORMALIZATIONS, default=d.normalize,
                   help="average each candidate's NLL over its tokens (the paper), its words or its UTF-8 bytes")
    p.add_argument("--allow-empty", action=argparse.BooleanOptionalAction, default=d.allow_empty,
                   help="let the end of the answer win before its first word, as the paper's pool does (default: the "
                        "end is held back while another candidate is in the pool)")
    p.add_argument("--speculate", action=argparse.BooleanOptionalAction, default=d.speculate,
                   help="speculative proposals: a confident model first verifies the spans proposed before it this "
                        "round in one forward (same decode, fewer forward passes; on by default)")
    p.add_argument("--no-draft-lookup", action="store_true",
                   help="with --speculate: verify only the models' spans, not what followed the answer's last words "
                        "earlier in the prompt and answer (prompt lookup)")
    p.add_argument("--max-new-words", type=int, default=d.max_new_words, help="stop after this many words")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help=say["max_new_tokens"])
    p.add_argument("--max-word-tokens", type=int, default=d.max_word_tokens, help="a word ends after this many tokens")
    p.add_argument("--stop", action="append", default=[], help=say["stop"])
    p.add_argument("--device", help="cuda, cuda:1, cpu, auto ... for every model without @DEVICE "
                                    "(default: CUDA if present)")
    p.add_argument("--trust-remote-code", action="store_true", help=TRUST_HELP)
    workers = p.add_mutually_exclusive_group()
    workers.add_argument("--parallel", dest="parallel", action="store_true", default=None,
                         help="run the models side by side, one worker each (default when each model has a GPU or "
                              "a server of its own, or when a short probe measures it faster on this machine's CPU)")
    workers.add_argument("--sequential", dest="parallel", action="store_false",
                         help="run the models one after another (default on one shared GPU, and on a CPU where "
                              "the probe measures it faster)")


def decode_config(args: argparse.Namespace, **fields) -> DecodeConfig:
    """The settings `add_decode_args` took (and `fields`), checked against --models before any model loads."""
    from .stops import parse_stops
    own = {k: getattr(args, k) for k in own_settings() if hasattr(args, k)}
    cfg = DecodeConfig.of(tau=args.tau, max_words=args.max_words, branches=args.branches,
                          diversity=not args.no_diversity, method=args.method, max_new_words=args.max_new_words,
                          max_new_tokens=args.max_new_tokens, max_word_tokens=args.max_word_tokens,
                          stop=tuple(x for s in args.stop for x in parse_stops(s)), system=_unescape(args.system),
                          thinking=args.thinking, weights=tuple(args.weights), gate=args.gate,
                          speculate=args.speculate, draft_lookup=not args.no_draft_lookup, normalize=args.normalize,
                          allow_empty=args.allow_empty, **own, **fields)
    cfg.check_models(len(args.models))
    return cfg


def load_models(args: argparse.Namespace) -> list:
    """--models, each loaded (saying so on stderr) on --device, by a registry of this command's own."""
    from .models import ModelRegistry
    models, registry = [], ModelRegistry()
    for name in args.models:
        print(f"loading {name} ...", file=sys.stderr, flush=True)
        models.append(registry.get(name, device=args.device, trust_remote_code=args.trust_remote_code))
        print(f"  {models[-1].describe()}", file=sys.stderr, flush=True)
    return models

def run_eval(args) -> int:
    from .harness.evaluate import evaluate, parse_methods, write_summary
    from .models import ModelRegistry
    from .harness.tasks import TASKS, data_dir, data_source, parse_lines
    if args.limit is not None and args.limit < 1:
        from .errors import ConfigError
        raise ConfigError(f"--limit {args.limit} is invalid: use 1 or more")
    lines = parse_lines(args.lines) if args.lines else None
    limit = args.limit if args.limit is not None or lines else 20
    base = {k: v for k, v in (("tau", args.tau), ("max_words", args.max_words), ("branches", args.branches),
                              ("max_new_words", args.max_new_words), ("speculate", args.speculate),
                              ("normalize", args.normalize), ("allow_empty", args.allow_empty),
                              ("weights", tuple(args.weights) if args.weights else None)) if v is not None}
    check_weights(args.weights, len(args.models))
    DecodeConfig(**base)  # validate before loading anything
    runs = parse_methods(args.methods, args.models)
    check_concurrency(args.concurrency)
    args.data = args.data or data_dir()  # found now, not at import
    print(f"data: {data_source(args.data)}; {args.concurrency} decode(s) in flight", file=sys.stderr)
    t0 = time.perf_counter()
    out = evaluate(TASKS[args.task], runs, args.out, args.data, limit, base, args.on_bad_line,
                   progress=not args.no_progress, trust_remote_code=args.trust_remote_code,
                   registry=ModelRegistry(), lines=lines, concurrency=args.concurrency)  # this command's models
    md, csv_path = write_summary(args.out)
    print(f"\nper-example results: {out}\nsummary: {md}, {csv_path}\nwall clock {time.perf_counter() - t0:.1f} s "
          f"with {args.concurrency} decode(s) in flight" + (" (the summary's sec/example: each decode's share of the "
                                                              "forwards it rode)" if args.concurrency > 1 else ""))
    return 0


def _unescape(s: str) -> str:
    return s.replace("\\n", "\n").replace("\\t", "\t")


def run(args) -> int:
    from .ensemble import AdaFuse, greedy
    from .report import cost_rows, format_table, round_rows
    from .errors import PromptError
    if args.prompt_file:
        try:
            prompt = args.prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PromptError(f"cannot read --prompt-file {args.prompt_file}: {exc.strerror or exc}; give a UTF-8 "
                              "text file") from exc
    else:
        prompt = _unescape(args.prompt)
    cfg = decode_config(args, mode=args.mode)  # before loading anything
    if not prompt.strip():
        raise PromptError("the prompt is empty: pass --prompt TEXT or --prompt-file PATH with some text")
    models = load_models(args)
    fuser = AdaFuse(models, cfg, parallel=args.parallel)
    d = fuser.start(prompt)
    for r in d:
        print(f"\r  round {r.index + 1}: {r.words} word(s), {len(d.trace.output.split())} so far", end="",
              file=sys.stderr, flush=True)
    print(file=sys.stderr)
    trace = d.trace
    print(f"=== {cfg.method} ({' + '.join(trace.models)}) ===")
    print(trace.output.strip())
    print(f"\n[{len(trace.rounds)} rounds, {trace.words} words, {trace.seconds:.1f}s, stop: {trace.stop_reason}; "
          f"models: {trace.workers}; "
          f"prompt modes: {', '.join(f'{k}={v}' for k, v in trace.prompt_modes.items())}]\n")
    print(format_table(round_rows(trace)))
    print()
    print(format_table(cost_rows(trace)))
    if args.compare and len(models) > 1:
        for lm in models:
            single = greedy(lm, prompt, cfg)
            c = single.cost(lm.name)
            print(f"\n=== {lm.name} alone (greedy) ===\n{single.output.strip()}\n"
                  f"[{single.words} words, {c['seconds']:.1f}s, {c['forward_passes']} forward passes, "
                  f"{c['tokens_fed']} tokens fed]")
    if args.json:
        trace.save(args.json)
        print(f"\ntrace written to {args.json}")
    return 0


def _explained(exc: Exception, command: str = "") -> str:
    """An error as a user reads it: a package missing from this install says which extra of this package brings it
    (read from the installed package's own requirements)."""
    if not isinstance(exc, ModuleNotFoundError):
        return str(exc)
    from importlib import metadata
    try:
        requires = metadata.requires("adafuse-explorer") or []
    except metadata.PackageNotFoundError:
        requires = []
    top = (exc.name or "").split(".")[0].lower()
    extras = sorted({m.group(1) for r in requires if (m := re.search(r'extra == "([^"]+)"', r))
                     and re.split(r"[\s\[=<>;!~]", r, maxsplit=1)[0].lower().replace("-", "_") == top})
    if not extras:
        return f"the package {exc.name!r} is missing: {exc}"
    extra = command if command in extras else extras[0]  # `adafuse eval`: the eval extra
    return (f"this command needs {exc.name}, which comes with the {' or '.join(extras)} extra: "
            f"pip install 'adafuse-explorer[{extra}]'")


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the models' worker threads tokenize; no forked pools
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["gate"], ["bench"], ["serve-model"], ["serve"], ["lm-eval"]):  # commands with their own parsers
        from importlib import import_module
        module = {"gate": ".harness.gate_train", "bench": ".harness.bench", "serve-model": ".harness.serve",
                  "serve": ".server.cli", "lm-eval": ".harness.lm_eval_model"}[argv[0]]
        try:
            return import_module(module, __package__).main(argv[1:])
        except (AdafuseError, ModuleNotFoundError) as exc:
            print(f"error: {_explained(exc, argv[0])}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    try:
        return run_eval(args) if args.command == "eval" else run(args)
    except (AdafuseError, ModuleNotFoundError) as exc:
        print(f"error: {_explained(exc, args.command)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # never a raw stack trace for a user; --debug shows it
        if args.debug:
            raise
        print(f"unexpected error ({type(exc).__name__}): {exc}\nrerun with --debug for details", file=sys.stderr)
        return 1
