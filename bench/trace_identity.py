"""Traces of every method, before and after a change that must not change them: record, then compare.

    python bench/trace_identity.py record DIR [--real]     # the toy pair (tests/toy.py); --real: the bundled pair too
    python bench/trace_identity.py compare DIR_A DIR_B [--ignore settings]

`record` decodes every method and a spread of settings (speculation on/off, diversity off, per-word NLL, weights, a
stop string, exploration by meaning, a learned gate, models side by side, settings changed mid-decode, an override)
and writes each trace as JSON into DIR, every timing field ("seconds") removed. `compare` prints identical/different
per file, with the first differing key path, and exits 1 on any difference (or a file missing on one side); a trace's
settings compare as the `DecodeConfig` they load into (the same decode written in an older settings format is equal).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toy.py lives beside the package

from adafuse import AdaFuse, DecodeConfig  # noqa: E402
from adafuse.gate import FEATURES, Gate  # noqa: E402

TIMING = {"seconds"}  # wall times: never the same twice
# a lazy method side by side charges a background catch-up to whichever round it finishes in: its steps' costs vary
UNCOUNTED, COSTS = {"toy-mixture-side-by-side"}, {"forward_passes", "tokens_fed", "draft_tokens", "accepted_tokens"}
TOY_PROMPTS = ["Q", "Q London", "Q Paris is"]
REAL_PROMPTS = ["Question: Who wrote the play Hamlet?\nAnswer:",
                "Question: What is the capital city of Australia?\nAnswer:",
                "Translate into English: Der Hund schläft im Garten.\nEnglish:"]


def toy_gate() -> str:
    """A gate that trusts the confident model and leans on b, at a fixed path (the trace's settings name it)."""
    g = Gate.zeros(["a", "b"])
    g.b = [0.0, 1.0]
    g.trained = {"normalize": DecodeConfig().normalize}  # as trained under the scoring the runs use
    k = FEATURES.index("confident")
    g.W[0][k] = 2.0
    path = Path(tempfile.gettempdir()) / "trace-identity-gate.json"
    g.save(path)
    return str(path)


def toy_runs() -> dict[str, tuple]:
    """name -> (config, models: "pair", "embedded", "a" or "b", parallel, script)."""
    base = DecodeConfig(max_new_words=12, tau=0.6, max_words=2)  # a commits two words, then one; b explores
    plain_runs = {"adafuse": {}, "adafuse-explore": dict(tau=0.5, max_words=1), "beam": dict(method="beam"),
                  "no-diversity": dict(diversity=False), "fixed-span-1": dict(method="fixed-span", span_words=1),
                  "fixed-span-2": dict(method="fixed-span", span_words=2), "token-union": dict(method="token-union"),
                  "mixture": dict(method="mixture", seed=0),
                  "mixture-weighted": dict(method="mixture", seed=2, weights=(1, 3), temperature=0),
                  "no-speculate": dict(speculate=False), "no-lookup": dict(draft_lookup=False),
                  "per-word": dict(normalize="word"), "weights": dict(weights=(3, 1)), "stop": dict(stop=(" nice", "\n")),
                  "score-single": dict(score_single=True), "gate": dict(gate=toy_gate(), tau=0.5)}
    runs = {name: (DecodeConfig.of(base, **kw), "pair", None, None) for name, kw in plain_runs.items()}
    return runs | {
        "defaults": (DecodeConfig(), "pair", None, None), "greedy-a": (replace(base, method="greedy"), "a", None, None),
        "greedy-b": (replace(base, method="greedy"), "b", None, None),
        "embedding": (replace(base, exploration="embedding", tau=0.5), "embedded", None, None),
        "side-by-side": (replace(base, tau=0.5), "pair", True, None),
        "mixture-side-by-side": (DecodeConfig.of(base, method="mixture", seed=1, temperature=0), "pair", True, None),
        "steered": (replace(base, tau=0.5, max_words=1), "pair", None, "steer")}


def real_runs() -> dict[str, tuple]:
    base = DecodeConfig(max_new_words=16, stop=("\n",))
    plain_runs = {"adafuse": {}, "embedding": dict(exploration="embedding"), "mixture": dict(method="mixture", seed=0),
                  "token-union": dict(method="token-union"), "weights": dict(weights=(1, 3)),
                  "per-word": dict(normalize="word"), "fixed-span-2": dict(method="fixed-span", span_words=2)}
    runs = {name: (DecodeConfig.of(base, **kw), "pair", False, None) for name, kw in plain_runs.items()}
    return runs | {m: (replace(base, method="greedy"), m[-1], False, None) for m in ("greedy-a", "greedy-b")}


def decode(models, cfg: DecodeConfig, parallel, script, prompt: str):
    d = AdaFuse(models, cfg, parallel=parallel).start(prompt)
    if script == "steer":  # round 0 overridden where it can be; settings changed while round 1 is pending
        r = d.propose()
        d.commit(next((i for i, c in enumerate(r.candidates) if i != r.winner and not c.eos), r.winner))
        if not d.done:
            d.propose()
            d.reconfigure(replace(d.config, max_words=2, weights=(1, 2)))
    for _ in d:
        pass
    return d.trace


def plain(x, leave=TIMING):
    """The trace's data without timings (`leave`: the keys left out anywhere)."""
    if isinstance(x, dict):
        return {k: plain(v, leave) for k, v in x.items() if k not in leave}
    return [plain(v, leave) for v in x] if isinstance(x, list) else x


def record(out: Path, real: bool) -> None:
    from tests.toy import A_RULES, B_RULES, V, toy_model, toy_pair
    out.mkdir(parents=True, exist_ok=True)
    a, b = toy_pair()
    sets = [("toy", {"pair": [a, b], "a": [a], "b": [b],
                     "embedded": [toy_model("a", V, A_RULES, embedded=True), toy_model("b", V, B_RULES, embedded=True)]},
             toy_runs(), TOY_PROMPTS)]
    if real:
        from adafuse import DEFAULT_PAIR, get_model
        ra, rb = (get_model(n) for n in DEFAULT_PAIR)
        sets.append(("real", {"pair": [ra, rb], "a": [ra], "b": [rb]}, real_runs(), REAL_PROMPTS))
    for tag, models, runs, prompts in sets:
        for name, (cfg, which, parallel, script) in runs.items():
            for i, prompt in enumerate(prompts):
                tr = decode(models[which], cfg, parallel, script, prompt)
                leave = TIMING | (COSTS if f"{tag}-{name}" in UNCOUNTED else set())
                data = json.dumps(plain(tr.to_dict(), leave), indent=1, sort_keys=True)
                (out / f"{tag}-{name}-{i}.json").write_text(data)
                print(f"{tag}-{name}-{i}: {len(tr.rounds)} rounds, {tr.stop_reason}: {tr.output[:60]!r}", flush=True)


def first_difference(a, b, path: str = ""):
    """The key path where `a` and `b` first differ, or None."""
    if isinstance(a, (dict, list)) and type(a) is type(b):
        ma, mb = (dict(enumerate(x)) if isinstance(x, list) else x for x in (a, b))
        for k in sorted(set(ma) | set(mb)):
            where = f"{path}[{k}]" if isinstance(a, list) else f"{path}/{k}"
            if k not in ma or k not in mb:
                return f"{where} (only in {'A' if k in ma else 'B'})"
            if (d := first_difference(ma[k], mb[k], where)) is not None:
                return d
        return None
    return None if a == b and type(a) is type(b) else f"{path}: {a!r} != {b!r}"


def compare(da: Path, db: Path, ignore: list[str]) -> int:
    names = sorted({p.name for p in da.glob("*.json")} | {p.name for p in db.glob("*.json")})
    bad = 0
    for name in names:
        if not ((da / name).exists() and (db / name).exists()):
            diff = f"missing in {da if not (da / name).exists() else db}"
        else:
            a, b = ({k: v for k, v in json.loads((d / name).read_text()).items() if k not in ignore} for d in (da, db))
            for x in (a, b):  # settings as the configs they load into: a format change is not a change of decode
                if "settings" in x:
                    x["settings"] = DecodeConfig.from_dict(x["settings"]).to_dict()
            diff = None if (at := first_difference(a, b)) is None else f"different at {at}"
        print(f"{name}: {diff or 'identical'}")
        bad += diff is not None
    print(f"{len(names) - bad} of {len(names)} files identical")
    return 1 if bad or not names else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    rec, cmp = sub.add_parser("record"), sub.add_parser("compare")
    rec.add_argument("dir", type=Path)
    rec.add_argument("--real", action="store_true", help="also the real bundled pair")
    cmp.add_argument("a", type=Path)
    cmp.add_argument("b", type=Path)
    cmp.add_argument("--ignore", action="append", default=[], help="a top-level trace key to leave out (settings)")
    args = p.parse_args()
    return record(args.dir, args.real) or 0 if args.command == "record" else compare(args.a, args.b, args.ignore)


if __name__ == "__main__":
    sys.exit(main())
