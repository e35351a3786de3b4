"""Per-token against per-word NLL averaging on the training examples, for one task family: merges two
`python -m adafuse gate search --normalize token|word --grid W` results (same weights, same examples) into
results/gate/normalize-<family>.json, which experiments/run.py reads to add the `adafuse+weights+word` rows.

    python -m adafuse gate search --task flores-de-en flores-en-de --examples 12 --grid 1,9 --normalize token --json t.json
    python -m adafuse gate search --task flores-de-en flores-en-de --examples 12 --grid 1,9 --normalize word --json w.json
    python experiments/normalize.py mt t.json w.json
"""
import json
import sys
from pathlib import Path

family, token_path, word_path = sys.argv[1:4]
token, word = (json.loads(Path(p).read_text()) for p in (token_path, word_path))
assert token["normalize"] == "token" and word["normalize"] == "word", "give the token search first, then the word one"
assert (token["tasks"], token["examples"], token["offset"]) == (word["tasks"], word["examples"], word["offset"])
assert len(token["grid"]) == len(word["grid"]) == 1 and token["grid"][0]["weights"] == word["grid"][0]["weights"]
t, w = token["grid"][0], word["grid"][0]
out = {"tasks": token["tasks"], "models": token["models"], "offset": token["offset"], "examples": token["examples"],
       "weights": t["weights"], "token": t["reward"], "word": w["reward"],
       "per_task": {"token": t["per_task"], "word": w["per_task"]}, "chosen": "word" if w["reward"] > t["reward"] else "token"}
path = Path(__file__).resolve().parents[1] / "results" / "gate" / f"normalize-{family}.json"
path.write_text(json.dumps(out, indent=1) + "\n")
print(f"{path}: per token {t['reward']:.4f}, per word {w['reward']:.4f} -> {out['chosen']}")
