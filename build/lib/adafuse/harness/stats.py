"""What stored traces say per (task, method): seconds per word, empty answers, pool diversity, selection changes and
gate weight shares (where the chosen candidate leaves one model's own proposal: adafuse/divergence.py)."""
from __future__ import annotations

from collections import defaultdict

from ..trace import EXPLORING
from .evaluate import decode_seconds
from .metrics import normalize_answer

Key = tuple[str, str]  # (task, method label) of a results row


def seconds_per_word(rows: list[dict]) -> dict[Key, float]:
    """Decode seconds per output word over all of a (task, method)'s examples."""
    secs: dict[Key, list[float]] = defaultdict(lambda: [0.0, 0])
    for r in rows:
        c = secs[(r["task"], r["method"])]
        c[0] += decode_seconds(r)
        c[1] += sum(x["words"] for x in r["trace"]["rounds"])
    return {k: v[0] / v[1] for k, v in secs.items() if v[1]}


def empty_answers(rows: list[dict]) -> dict[Key, tuple[int, int]]:
    """(empty answers, examples): examples whose decoded output is blank."""
    out: dict[Key, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        c = out[(r["task"], r["method"])]
        c[0] += not r["trace"]["output"].strip()
        c[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


class PoolEmbedder:
    """A candidate text as the mean of one model's input-embedding rows of its tokens (tokenized alone, no special
    tokens); cosine distances between those means. `lm`: a loaded model (name, tokenizer, model with weights)."""

    def __init__(self, lm):
        self.name, self.tokenizer = lm.name, lm.tokenizer
        self.weight = lm.model.get_input_embeddings().weight.detach().float().cpu()  # (V, H)
        self.cache: dict = {}

    def vector(self, text: str):
        text = text.strip()
        if text not in self.cache:
            ids = self.tokenizer(text, add_special_tokens=False).input_ids if text else []
            self.cache[text] = self.weight[ids].mean(0) if ids else None  # (H,)
        return self.cache[text]

    def mean_distance(self, texts: list[str]) -> float | None:
        """Mean pairwise cosine distance of the distinct texts' vectors; None for fewer than two texts with tokens."""
        import torch
        vecs = [v for v in (self.vector(t) for t in dict.fromkeys(texts)) if v is not None]
        if len(vecs) < 2:
            return None
        e = torch.nn.functional.normalize(torch.stack(vecs), dim=-1)  # (N, H)
        cos = e @ e.T  # (N, N)
        iu = torch.triu_indices(len(vecs), len(vecs), 1)
        return float((1.0 - cos[iu[0], iu[1]]).mean())


def pool_diversity(rows: list[dict], embedder: PoolEmbedder | None) -> dict[Key, dict]:
    """Over each (task, method)'s explore rounds (some model explored or ran beam search): mean distinct answers per
    pool (candidate texts after SQuAD normalization; the bare end of the answer counts as the answer ""), mean
    pairwise embedding distance of the pool (rounds with at least two candidates that hold text; None without an
    embedder), and the counts: {"rounds", "answers", "distance_rounds", "distance"}."""
    acc: dict[Key, list] = defaultdict(lambda: [0, 0.0, 0, 0.0])
    for r in rows:
        a = acc[(r["task"], r["method"])]
        for rd in r["trace"]["rounds"]:
            if not any(st["mode"] in EXPLORING for st in rd["steps"]):
                continue
            texts = [c["text"] for c in rd["candidates"]]
            a[0] += 1
            a[1] += len({normalize_answer(t) for t in texts})
            dist = embedder.mean_distance(texts) if embedder else None
            if dist is not None:
                a[2] += 1
                a[3] += dist
    return {k: {"rounds": v[0], "answers": v[1] / v[0] if v[0] else None, "distance_rounds": v[2],
                "distance": v[3] / v[2] if v[2] else None} for k, v in acc.items()}


def changed_picks(rows: list[dict]) -> dict[Key, tuple[int, int]]:
    """(explore steps whose embedding selection picked other tokens than the surface strategy would have from the
    same distribution, explore steps with an embedding selection)."""
    out: dict[Key, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        for rd in r["trace"]["rounds"]:
            for st in rd["steps"]:
                sel = st.get("selection") or {}
                if sel.get("strategy") != "embedding":
                    continue
                toks = sel.get("tokens", [])
                # the surface strategy's picks: the most probable tokens whose texts differ
                reps = [t["token"] for t in toks if t.get("skip") in ("", "redundant", "outscored")]
                picked = {t["token"] for t in toks if t.get("picked")}
                c = out[(r["task"], r["method"])]
                c[0] += picked != set(reps[:len(picked)])
                c[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def weight_shares(rows: list[dict]) -> dict[Key, tuple[dict[str, float], int]]:
    """({model: mean share of the round's weight}, rounds) over the rounds a learned gate weighted (rounds with
    features and weights; runs without a gate have none)."""
    acc: dict[Key, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for rd in r["trace"]["rounds"]:
            if rd.get("features") and rd.get("weights"):
                tot = sum(rd["weights"].values()) or 1.0
                for m, w in rd["weights"].items():
                    acc[(r["task"], r["method"])][m].append(w / tot)
    return {k: ({m: sum(v) / len(v) for m, v in ws.items()}, len(next(iter(ws.values())))) for k, ws in acc.items()}
