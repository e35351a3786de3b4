"""How much of a step with many decodes in flight is the engine's own work (python -m bench.engine).

    python -m bench.engine [--levels 1 8 32 64 128] [--sleep-ms 5] [--attention auto] [--repeats 1] [--json FILE]

The simulation: two tiny random-weight models built from configs in the bundled pair's architectures (Llama, as
SmolLM2; Gemma 3 with sliding-window layers), both on SmolLM2's tokenizer (from the bundled folder). Every forward of
either model also sleeps a fixed time (default 5 ms) with the GIL released, as a GPU kernel runs while Python waits;
the sleeps of the two models take turns (one device). AdaFuse B=3 decodes of 8 words (the library's defaults
otherwise) go through `run_many` at each level in flight, on max(8, 2 × level) prompts. Printed per level: decodes/s,
× one in flight, forwards per decode (every model's batcher forwards), ms per step (wall time per forward) and the
engine's ms per step (the wall time during which no forward ran, per forward: what the engine costs on top of the
device), the process's CPU time per decode and the cores it kept busy on average, and whether the first 8 traces are
those decoded one at a time. `--attention rows` runs the packed attention as `auto` picks it on a GPU for alike rows
(on this CPU `auto` runs a call per request); `--sleep-ms 0` measures what this CPU's own work allows (the tiny models'
layers and the engine, no device time): the ceiling of any level here.

The bundled pair on this CPU at 1/8/16 in flight is the existing concurrency benchmark:
`python -m adafuse.harness.bench --concurrency 1 8 16 --trivia 32` (AdaFuse B=3; examples per minute, × one, and
whether every trace is the one decoded alone).

Levels of one run are interleaved over `--repeats` (in order, then reversed) and the medians printed; timings on a
machine shared with other jobs are noisy: compare runs made back to back.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import time
from pathlib import Path

import torch

from adafuse import AdaFuse, DecodeConfig
from adafuse.harness.bench_many import first_difference, interleaved
from adafuse.many import run_many
from adafuse.models.batching import Runtime
from adafuse.models.packed import ATTENTION_MODES
from adafuse.models.local import LocalModel, bundled_folder

CONFIG = DecodeConfig(branches=3, max_new_words=8)
SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=1024)
SUBJECTS = ["river", "mountain", "city", "song", "planet", "engine", "garden", "language", "number", "painting",
            "forest", "island", "bridge", "market", "winter", "library"]
ASKS = ["What is the name of the", "Who first described the", "Where is the oldest", "Why do people visit the",
        "How long is the", "When was the", "Which country has the", "What colour is the"]


class Device:
    """The simulated accelerator: a fixed time per forward of any model it is attached to, slept with the GIL released,
    one forward at a time; the intervals its forwards ran in (each model's own compute included)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.turn = threading.Lock()
        self.local = threading.local()
        self.intervals: list[tuple[float, float]] = []

    def attach(self, model: torch.nn.Module) -> None:
        model.register_forward_pre_hook(self._start)
        model.register_forward_hook(self._end)

    def _start(self, module, args):
        self.turn.acquire()
        self.local.t0 = time.perf_counter()
        time.sleep(self.seconds)

    def _end(self, module, args, out):
        self.intervals.append((self.local.t0, time.perf_counter()))
        self.turn.release()

    def busy(self, since: float, until: float) -> float:
        """Seconds between `since` and `until` during which a forward ran."""
        total, end = 0.0, since
        for a, b in sorted(self.intervals):
            a, b = max(a, end), min(b, until)
            if b > a:
                total, end = total + b - a, b
        return total


def tiny_pair(device: Device, attention: str = "auto") -> list[LocalModel]:
    """A tiny Llama and a tiny Gemma 3 (random weights, seeded) on SmolLM2's tokenizer, sharing one runtime as the
    models of one registry do, every forward through `device`."""
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(bundled_folder("smollm2-135m-instruct"))
    configs = [("tiny-llama", transformers.LlamaConfig(vocab_size=len(tok), **SHAPE), transformers.LlamaForCausalLM),
               ("tiny-gemma3", transformers.Gemma3TextConfig(
                   vocab_size=len(tok), head_dim=16, query_pre_attn_scalar=16, sliding_window=16,
                   layer_types=["sliding_attention", "full_attention"], **SHAPE), transformers.Gemma3ForCausalLM)]
    runtime, models = Runtime(attention=attention), []
    for seed, (name, cfg, cls) in enumerate(configs):
        cfg._attn_implementation = "sdpa"
        cfg.eos_token_id, cfg.bos_token_id, cfg.pad_token_id = tok.eos_token_id, tok.bos_token_id, tok.pad_token_id
        torch.manual_seed(seed)
        model = cls(cfg).eval()
        device.attach(model)
        lm = LocalModel.from_objects(name, model, tok)
        lm.runtime = runtime
        models.append(lm)
    return models


def prompts(n: int) -> list[str]:
    return [f"Question: {ASKS[i % len(ASKS)]} {SUBJECTS[(i // len(ASKS)) % len(SUBJECTS)]} number {i}?\nAnswer:"
            for i in range(n)]


def forwards(models) -> int:
    return sum(m.batcher.forwards for m in models)


def sim_level(models, device: Device, level: int, n: int) -> tuple[dict, list]:
    fuser = AdaFuse(models, CONFIG)
    before, t0, c0 = forwards(models), time.perf_counter(), time.process_time()
    traces = list(run_many([lambda p=p: fuser.generate(p) for p in prompts(n)], level))
    t1, cpu = time.perf_counter(), time.process_time() - c0
    fwd = forwards(models) - before
    wall, busy = t1 - t0, device.busy(t0, t1)
    return {"wall_s": wall, "decodes/s": n / wall, "forwards/decode": fwd / n, "ms/step": 1000 * wall / fwd,
            "engine ms/step": 1000 * (wall - busy) / fwd, "forward ms": 1000 * busy / fwd,
            "CPU ms/decode": 1000 * cpu / n, "cores busy": cpu / wall}, traces


def simulate(levels: list[int], sleep_ms: float, repeats: int, attention: str = "auto") -> list[dict]:
    device = Device(sleep_ms / 1000)
    models = tiny_pair(device, attention)
    AdaFuse(models, CONFIG).generate(prompts(1)[0])  # warm-up: the side-by-side probe, allocator, kernels
    runs: dict[int, list[dict]] = {lv: [] for lv in levels}
    traces: dict[int, list] = {}
    for lv in interleaved(levels, repeats):
        row, out = sim_level(models, device, lv, max(8, 2 * lv))
        runs[lv].append(row)
        traces.setdefault(lv, out)
        print(f"  {lv} in flight: {row['wall_s']:.1f} s, {row['decodes/s']:.2f} decodes/s", flush=True)
    base = statistics.median(r["decodes/s"] for r in runs[levels[0]])
    table = []
    for lv in levels:
        med = {k: statistics.median(r[k] for r in runs[lv]) for k in runs[lv][0]}
        ref = traces[levels[0]]
        k = min(len(ref), len(traces[lv]))
        table.append({"in flight": lv, "prompts": max(8, 2 * lv), "decodes/s": round(med["decodes/s"], 2),
                      "× one": round(med["decodes/s"] / base, 2), "forwards/decode": round(med["forwards/decode"], 1),
                      "ms/step": round(med["ms/step"], 2), "engine ms/step": round(med["engine ms/step"], 2),
                      "forward ms": round(med["forward ms"], 2), "CPU ms/decode": round(med["CPU ms/decode"]),
                      "cores busy": round(med["cores busy"], 2),
                      "same traces": f"{sum(not first_difference(a, b) for a, b in zip(ref[:k], traces[lv][:k]))}/{k}",
                      "runs decodes/s": [round(r["decodes/s"], 2) for r in runs[lv]]})
    workers = AdaFuse(models, CONFIG).start(prompts(1)[0]).trace.workers
    print(f"simulation: {sleep_ms} ms per forward, AdaFuse B=3, 8 words, packed attention {attention}; "
          f"workers: {workers}")
    _print(table)
    return table


def _print(rows: list[dict]) -> None:
    from adafuse.report import format_table
    print(format_table([{k: (" / ".join(map(str, v)) if isinstance(v, list) else v) for k, v in r.items()}
                        for r in rows]), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", nargs="+", type=int, default=[1, 8, 32, 64, 128], help="decodes in flight (simulation)")
    p.add_argument("--sleep-ms", type=float, default=5.0, help="the simulated device's time per forward")
    p.add_argument("--attention", choices=ATTENTION_MODES, default="auto",
                   help="the packed attention (auto: as the library picks it on this device)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each level, interleaved; medians printed")
    p.add_argument("--json", type=Path, help="write the tables here")
    args = p.parse_args(argv)
    out = {"commit": _commit(), "date": time.strftime("%Y-%m-%d %H:%M"), "sleep_ms": args.sleep_ms,
           "attention": args.attention, "repeats": args.repeats}
    out["simulation"] = simulate(args.levels, args.sleep_ms, args.repeats, args.attention)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    return 0


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        return ""


if __name__ == "__main__":
    raise SystemExit(main())
