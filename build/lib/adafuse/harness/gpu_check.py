"""The GPU check: one prepared run on a CUDA box without the Hub: checks of the CUDA path, then a benchmark table.

    python -m adafuse.harness.gpu_check --prepare bench/gpu     # here: tokenizers + prompts into an ignored folder
    python -m adafuse.harness.gpu_check --spec SPEC.json        # there: checks, then the benchmark table

Random-weight models of real size, built on the GPU in seconds from the Hugging Face configs in SPEC.json, each with a
real tokenizer saved by --prepare (the vocabulary padded to a multiple of 64), bf16. SPEC.json: {"models": [{"name",
"tokenizer" (a folder name under --dir), "model_type" (a transformers config type), "config": {its fields}}, ...],
optionally "reference": {"column", "s_per_round": {text in a run's name: seconds per round}, "about"}}: a column of
reference timings beside the measured ones.
Random weights give near-uniform next-token distributions: margins are tiny and every round explores at τΔ = 0.7 (the
costly case); τΔ = 0 forces the commit branch. `--tiny` builds 2-layer models of the same vocabularies (checks the
script on a CPU).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from ..config import DecodeConfig
from ..ensemble import AdaFuse, greedy
from ..models import DEFAULT_PAIR, LoadedModel, LocalModel, get_model
from ..errors import ConfigError
from ..report import format_table

PREPARED = 64  # TriviaQA prompts --prepare saves: distinct questions for up to 64 decodes in flight


def prepare(out: Path, data: Path, models: list[str]) -> None:
    """Save the models' tokenizers and the benchmark prompts where the GPU run finds them (no Hub, no shared/)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in models:
        get_model(name, device="cpu").tokenizer.save_pretrained(out / name)
    head = (data / "triviaqa" / "prompt.txt").read_text()
    rows = [json.loads(x) for x in (data / "triviaqa" / "dev.jsonl").read_text().splitlines()[:PREPARED]]
    prompts = [f"{head}\n\nQuestion: {r['question']}\nAnswer:" for r in rows]
    (out / "prompts.json").write_text(json.dumps(prompts, ensure_ascii=False, indent=1))
    print(f"wrote {out}: tokenizers of {', '.join(models)} and {len(prompts)} TriviaQA prompts")


def read_spec(path: Path) -> dict:
    """The models (and optional reference timings) of a GPU check, with what is missing named."""
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--spec {path}: {exc}; pass a JSON file such as experiments/gpu_check.json") from None
    models = spec.get("models") if isinstance(spec, dict) else None
    keys = ("name", "tokenizer", "model_type", "config")
    if not models or not all(isinstance(m, dict) and all(k in m for k in keys) for m in models):
        raise ConfigError(f"--spec {path}: 'models' must list objects with {', '.join(keys)}")
    return spec


def build(shape: dict, tokenizer_dir: Path, device: str, tiny: bool, dtype: torch.dtype | None = None) -> LoadedModel:
    """A random-weight model of `shape` (an entry of the spec's "models") with the tokenizer saved in `tokenizer_dir`;
    the same weights on every call (seed 0). `dtype` names a second, 2-layer model (the fp32 check)."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    spec = dict(shape["config"])
    if tiny:
        spec.update(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2)
    vocab = -(-len(tok) // 64) * 64
    cfg = AutoConfig.for_model(shape["model_type"], vocab_size=vocab, bos_token_id=tok.bos_token_id,
                               eos_token_id=tok.eos_token_id, tie_word_embeddings=False, **spec)
    model_cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]
    name = f"{shape['name']}+{tokenizer_dir.name}" + ("" if dtype is None else
                                                      f" 2-layer {str(dtype).removeprefix('torch.')}")
    dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = model_cls(cfg).to(dtype)
    lm = LocalModel.from_objects(name, model, tok, source=f"random {shape['name']}")
    lm.load_seconds = time.perf_counter() - t0
    return lm


def check_cache(models: list[LoadedModel], prompt: str) -> list[str]:
    """Cache reuse on the device matches a fresh forward; returns problems. The tolerance is the model's own: fp32
    must agree within 1e-4; in bf16 two ways of computing the same logits differ by rounding alone, so the decoder's
    cached state may differ from a fresh forward by at most twice what Hugging Face's own incremental forward (the
    prefix, then the last tokens on its cache) differs from the same fresh forward, plus 0.02."""
    problems = []
    d = AdaFuse(models, DecodeConfig(max_new_words=1000, max_new_tokens=10_000, tau=0.0)).start(prompt)
    for _ in range(4):
        d.step()
    if d.done:  # the last round of a finished decode is not fed to the models: nothing to compare
        return [f"the check decode stopped early ({d.trace.stop_reason})"]
    for s in d.sessions:
        ids = s.encode(d.trace.output)
        x = torch.tensor([ids], device=s.lm.device)
        with torch.inference_mode():
            fresh = torch.log_softmax(s.lm.model(x).logits[0, -1].float(), -1)
            cut = max(1, len(ids) - 4)
            past = s.lm.model(x[:, :cut], use_cache=True).past_key_values
            inc = torch.log_softmax(s.lm.model(x[:, cut:], past_key_values=past).logits[0, -1].float(), -1)
        err = (fresh - s.next_logprobs).abs().max().item()
        ref = (fresh - inc).abs().max().item()
        tol = 1e-4 if s.lm.dtype == torch.float32 else 2 * ref + 0.02
        same_top = int(fresh.argmax()) == int(s.next_logprobs.argmax())
        print(f"  cache vs fresh forward, {s.name} ({str(s.lm.dtype).removeprefix('torch.')}): max |Δ log p| = "
              f"{err:.4f}; Hugging Face's own cached forward: {ref:.4f}; tolerance {tol:.4f}; same argmax: {same_top}")
        if err > tol:
            problems.append(f"{s.name}: cache differs from a fresh forward by {err:.4f} (tolerance {tol:.4f})")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m adafuse.harness.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prepare", type=Path, help="write tokenizers and prompts into this folder, then stop")
    p.add_argument("--tokenizers", nargs="+", default=list(DEFAULT_PAIR),
                   help="models whose tokenizers --prepare saves (default: the bundled pair)")
    p.add_argument("--spec", type=Path, help="JSON file naming the models to build (see above); needed to run")
    p.add_argument("--data", type=Path, default=None, help="benchmark data folder (for --prepare)")
    p.add_argument("--dir", type=Path, default=Path("bench/gpu"), help="folder written by --prepare")
    p.add_argument("--questions", type=int, default=10, help="prompts per method in the methods' table (0: no table)")
    p.add_argument("--words", type=int, default=24, help="words per answer")
    p.add_argument("--tiny", action="store_true", help="2-layer models (check the script itself, e.g. on CPU)")
    p.add_argument("--out", type=Path, help="write every number as JSON here")
    p.add_argument("--attention", nargs="*", type=int, metavar="N", default=[],
                   help="first: ms per packed forward of N requests with each attention mode (e.g. 1 8 32)")
    p.add_argument("--concurrency", nargs="+", type=int, metavar="N",
                   help="after the methods' table: AdaFuse B=3 with N decodes in flight at each level (e.g. 1 8 32), "
                        "outputs compared with one at a time")
    p.add_argument("--prompts", type=int, default=None,
                   help=f"prompts of the concurrency part (default: the highest level; distinct up to {PREPARED})")
    args = p.parse_args(argv)
    if args.prepare:
        from .tasks import data_dir
        prepare(args.prepare, args.data or data_dir(), args.tokenizers)
        return 0
    if args.spec is None:
        p.error("--spec FILE is needed to run the check (e.g. experiments/gpu_check.json), or --prepare DIR")
    try:
        spec = read_spec(args.spec)
    except ConfigError as exc:
        p.error(str(exc))
    start = time.perf_counter()

    def part(name: str) -> None:
        print(f"[{time.perf_counter() - start:.0f} s] {name}", flush=True)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    print(f"device: {torch.cuda.get_device_name(0) if device != 'cpu' else 'cpu'}; torch {torch.__version__}",
          flush=True)
    prepared = json.loads((args.dir / "prompts.json").read_text())
    models = [build(shape, args.dir / shape["tokenizer"], device, args.tiny) for shape in spec["models"]]
    for lm in models:
        print(f"  {lm.describe()}", flush=True)
    problems = check_cache(models, prepared[0])
    if device != "cpu":  # the same CUDA path in fp32, where the cache must match to 1e-4 (2 layers: seconds)
        small = [build(shape, args.dir / shape["tokenizer"], device, True, torch.float32) for shape in spec["models"]]
        problems += check_cache(small, prepared[0])
        del small
    out: dict = {"problems": problems}
    if args.attention:
        from .attention_bench import attention_table
        part(f"packed forwards of {' / '.join(map(str, args.attention))} requests, each attention mode")
        out["attention"] = attention_table(models, args.attention, repeats=3, echo=lambda x: print(x, flush=True))
    if args.questions > 0:
        part(f"methods' table: {args.questions} questions, {args.words} words")
        cfg = DecodeConfig(max_new_words=args.words, max_new_tokens=4 * args.words)
        out["rows"], out["numbers"] = methods_table(models, prepared[: args.questions], cfg, spec.get("reference"),
                                                    device)
    differed = 0
    if args.concurrency:
        from ..many import check_concurrency
        from .bench_many import concurrency_bench
        levels = [check_concurrency(n) for n in args.concurrency]
        n = args.prompts or max(levels)
        part(f"many decodes at once: {n} prompts, {args.words} words, B=3, in flight {' / '.join(map(str, levels))}")
        cfg = DecodeConfig(max_new_words=args.words, max_new_tokens=4 * args.words, branches=3)
        work = [("triviaqa", prepared[i % len(prepared)], cfg) for i in range(n)]
        differed = concurrency_bench(models, work, levels, rounds=1)
    part("done")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
    for msg in problems:
        print(f"PROBLEM: {msg}")
    return 1 if problems or differed else 0


def methods_table(models: list[LoadedModel], prompts: list[str], cfg: DecodeConfig, ref: dict | None,
                  device: str) -> tuple[list[dict], dict]:
    """Each model greedy, then AdaFuse B=1 and 3 at τΔ 0.7 and 0, side by side and one after another, and with
    speculation: words, rounds, seconds per word and round, forwards per round, against the models alone; printed."""
    rows, numbers = [], {}
    runs = [(f"{lm.name} greedy", lambda pr, c, lm=lm: greedy(lm, pr, c)) for lm in models]
    for b in (1, 3):
        for tau in (0.7, 0.0):
            for parallel in (True, False):
                name = f"AdaFuse B={b} τΔ={tau} " + ("parallel" if parallel else "sequential")
                runs.append((name, lambda pr, c, b=b, tau=tau, par=parallel:
                             AdaFuse(models, c, branches=b, tau=tau, parallel=par, speculate=False).generate(pr)))
        # speculative proposals: the lighter model's span verified by the other in one forward
        runs.append((f"AdaFuse B={b} τΔ=0.7 sequential speculative", lambda pr, c, b=b:
                     AdaFuse(models, c, branches=b, tau=0.7, parallel=False, speculate=True).generate(pr)))
    runs[0][1](prompts[0], cfg)  # warm-up (kernels, allocator)
    for name, fn in runs:
        if device != "cpu":
            torch.cuda.reset_peak_memory_stats()
        words = rounds = forwards = 0
        seconds = 0.0
        tokens = {lm.name: 0 for lm in models}
        for prompt in prompts:
            tr = fn(prompt, cfg)
            words, rounds = words + tr.words, rounds + len(tr.rounds)
            seconds += sum(r.seconds for r in tr.rounds)
            forwards += sum(s.forward_passes for r in tr.rounds for s in r.steps)
            for lm in models:
                tokens[lm.name] += len(lm.tokenizer(tr.output, add_special_tokens=False).input_ids)
        numbers[name] = {"words": words, "rounds": rounds, "seconds": seconds, "tokens": tokens, "forwards": forwards,
                         "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device != "cpu" else None}
        print(f"  {name}: {words} words, {rounds} rounds, {seconds:.1f}s", file=sys.stderr, flush=True)
    # what each model alone takes to write the same text: its greedy seconds per token × the text's tokens in its
    # tokenizer (random weights make "words" of greedy loops meaningless; tokens are not)
    per_token = {lm.name: numbers[f"{lm.name} greedy"]["seconds"]
                 / max(1, numbers[f"{lm.name} greedy"]["tokens"][lm.name]) for lm in models}
    for name, n in numbers.items():
        per_word = n["seconds"] / max(1, n["words"])
        alone = sum(per_token[m] * t for m, t in n["tokens"].items())
        row = {"run": name, "words": n["words"], "rounds": n["rounds"], "s/word": round(per_word, 3),
               "s/round": round(n["seconds"] / max(1, n["rounds"]), 3),
               "fwd/round": round(n["forwards"] / max(1, n["rounds"]), 1),
               "÷ sum of greedy": round(n["seconds"] / alone, 2) if "AdaFuse" in name and alone else ""}
        if ref:  # the first reference timing whose key is part of the run's name
            row[ref["column"]] = next((v for key, v in ref["s_per_round"].items() if key in name), "")
        row["peak GiB"] = round(n["peak_gib"], 1) if n["peak_gib"] is not None else ""
        rows.append(row)
    print(format_table(rows))
    print("'÷ sum of greedy': AdaFuse seconds over what the models alone take to write the same text (each one's"
          " greedy s/token × the text's tokens in its tokenizer)"
          + (f"; '{ref['column']}': {ref.get('about', 'reference timings')}." if ref else "."), flush=True)
    return rows, numbers


if __name__ == "__main__":
    sys.exit(main())
