"""The GPU check: one prepared run on a CUDA box without the Hub, printing the table the README quotes.

    python -m adafuse.harness.gpu_check --prepare bench/gpu     # here: tokenizers + prompts into an ignored folder
    bench/gpu_check.sh                                          # there: checks, then the benchmark table

Two random-weight models of real size (Llama-3.1-8B and Mistral-7B configs) with the bundled pair's real tokenizers
(the vocabulary padded to a multiple of 64), bf16, built on the GPU in seconds. Random weights give near-uniform
next-token distributions: margins are tiny and every round explores at τΔ = 0.7 (the costly case); τΔ = 0 forces
the commit branch. `--tiny` builds 2-layer models of the same vocabularies (checks the script on a CPU).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from ..config import DecodeConfig
from ..decoder import AdaFuse, greedy
from ..loading import DEFAULT_PAIR, LoadedModel, get_model
from ..report import format_table

SHAPES = {  # the paper's pair, as configs (no weights needed)
    "llama-3.1-8b": dict(arch="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                         max_position_embeddings=8192),
    "mistral-7b": dict(arch="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, rope_theta=1000000.0,
                       max_position_embeddings=8192, sliding_window=None),
}
OFFICIAL_S_PER_ROUND = {1: 1.26, 3: 2.04}  # the public implementation on the same random pair (../shared/GPU.md)


def prepare(out: Path, data: Path) -> None:
    """Save the bundled tokenizers and the benchmark prompts where the GPU run finds them (no Hub, no shared/)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in DEFAULT_PAIR:
        get_model(name, device="cpu").tokenizer.save_pretrained(out / name)
    head = (data / "triviaqa" / "prompt.txt").read_text()
    rows = [json.loads(x) for x in (data / "triviaqa" / "dev.jsonl").read_text().splitlines()[:10]]
    prompts = [f"{head}\n\nQuestion: {r['question']}\nAnswer:" for r in rows]
    (out / "prompts.json").write_text(json.dumps(prompts, ensure_ascii=False, indent=1))
    print(f"wrote {out}: tokenizers of {', '.join(DEFAULT_PAIR)} and {len(prompts)} TriviaQA prompts")


def build(shape: str, tokenizer_dir: Path, device: str, tiny: bool, dtype: torch.dtype | None = None) -> LoadedModel:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    spec = dict(SHAPES[shape])
    arch = spec.pop("arch")
    if tiny:
        spec.update(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2)
    vocab = -(-len(tok) // 64) * 64
    cfg_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (MistralConfig, MistralForCausalLM)
    cfg = cfg_cls(vocab_size=vocab, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  tie_word_embeddings=False, **spec)
    name = f"{shape}+{tokenizer_dir.name}" + ("" if dtype is None else f" 2-layer {str(dtype).removeprefix('torch.')}")
    dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = model_cls(cfg).to(dtype)
    lm = LoadedModel.from_objects(name, model, tok, source=f"random {shape}")
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
    p.add_argument("--data", type=Path, default=None, help="benchmark data folder (for --prepare)")
    p.add_argument("--dir", type=Path, default=Path("bench/gpu"), help="folder written by --prepare")
    p.add_argument("--questions", type=int, default=10)
    p.add_argument("--words", type=int, default=24, help="words per answer")
    p.add_argument("--tiny", action="store_true", help="2-layer models (check the script itself, e.g. on CPU)")
    p.add_argument("--out", type=Path, help="write every number as JSON here")
    args = p.parse_args(argv)
    if args.prepare:
        from .tasks import DEFAULT_DATA
        prepare(args.prepare, args.data or DEFAULT_DATA)
        return 0
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    print(f"device: {torch.cuda.get_device_name(0) if device != 'cpu' else 'cpu'}; torch {torch.__version__}",
          flush=True)
    prompts = json.loads((args.dir / "prompts.json").read_text())[: args.questions]
    models = [build("llama-3.1-8b", args.dir / DEFAULT_PAIR[0], device, args.tiny),
              build("mistral-7b", args.dir / DEFAULT_PAIR[1], device, args.tiny)]
    for lm in models:
        print(f"  {lm.describe()}", flush=True)
    problems = check_cache(models, prompts[0])
    if device != "cpu":  # the same CUDA path in fp32, where the cache must match to 1e-4 (2 layers: seconds)
        small = [build(shape, args.dir / name, device, True, torch.float32)
                 for shape, name in (("llama-3.1-8b", DEFAULT_PAIR[0]), ("mistral-7b", DEFAULT_PAIR[1]))]
        problems += check_cache(small, prompts[0])
        del small
    rows, numbers = [], {}
    runs = [(f"{lm.name} greedy", lambda pr, c, lm=lm: greedy(lm, pr, c)) for lm in models]
    for b in (1, 3):
        for tau in (0.7, 0.0):
            for parallel in (True, False):
                name = f"AdaFuse B={b} τΔ={tau} " + ("parallel" if parallel else "sequential")
                runs.append((name, lambda pr, c, b=b, tau=tau, par=parallel:
                             AdaFuse(models, c, branches=b, tau=tau, parallel=par).generate(pr)))
        # speculative proposals (issue 15): the lighter model's span verified by the other in one forward
        runs.append((f"AdaFuse B={b} τΔ=0.7 sequential speculative", lambda pr, c, b=b:
                     AdaFuse(models, c, branches=b, tau=0.7, parallel=False, speculate=True).generate(pr)))
    cfg = DecodeConfig(max_new_words=args.words, max_new_tokens=4 * args.words)
    runs[0][1](prompts[0], cfg)  # warm-up (kernels, allocator)
    for name, fn in runs:
        if device != "cpu":
            torch.cuda.reset_peak_memory_stats()
        words = rounds = 0
        seconds = 0.0
        tokens = {lm.name: 0 for lm in models}
        forwards = 0
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
    per_token = {lm.name: numbers[f"{lm.name} greedy"]["seconds"] / max(1, numbers[f"{lm.name} greedy"]["tokens"][lm.name])
                 for lm in models}
    for name, n in numbers.items():
        per_word = n["seconds"] / max(1, n["words"])
        alone = sum(per_token[m] * t for m, t in n["tokens"].items())
        row = {"run": name, "words": n["words"], "rounds": n["rounds"], "s/word": round(per_word, 3),
               "s/round": round(n["seconds"] / max(1, n["rounds"]), 3),
               "fwd/round": round(n["forwards"] / max(1, n["rounds"]), 1),
               "÷ sum of greedy": round(n["seconds"] / alone, 2) if "AdaFuse" in name and alone else "",
               "official s/round": next((OFFICIAL_S_PER_ROUND[b] for b in (1, 3)
                                         if f"B={b} τΔ=0.7" in name), ""),
               "peak GiB": round(n["peak_gib"], 1) if n["peak_gib"] is not None else ""}
        rows.append(row)
    print(format_table(rows))
    print("'÷ sum of greedy': AdaFuse seconds over what the two models alone take to write the same text (each one's"
          " greedy s/token × the text's tokens in its tokenizer; target ≤ 1.5);"
          " 'official s/round': the public implementation on the same random pair (../shared/GPU.md).")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"numbers": numbers, "rows": rows, "problems": problems}, indent=1))
    for msg in problems:
        print(f"PROBLEM: {msg}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
