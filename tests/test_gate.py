"""The learned gate (adafuse/gate.py): per-round weights from the models' features, and checked files."""
import json
from pathlib import Path

import pytest
import torch

from adafuse import DEFAULT_PAIR, AdaFuse, DecodeConfig
from adafuse.gate import FEATURES, Gate, GateError, entropy, gate_weights, load_gate
from adafuse.trace import Trace
from tests.toy import first_round, toy_pair


def write(tmp_path, gate: Gate, name="gate.json"):
    path = tmp_path / name
    gate.save(path)
    return str(path)


def test_a_zero_gate_is_plain_adafuse_and_the_round_records_features(tmp_path):
    path = write(tmp_path, Gate.zeros(["a", "b"]))
    _, plain = first_round(DecodeConfig(tau=0.7, branches=3, max_words=1))
    _, gated = first_round(DecodeConfig(tau=0.7, branches=3, max_words=1, gate=path, normalize="token"))
    assert gated.weights == {"a": 1.0, "b": 1.0}
    assert [c.fused for c in gated.candidates] == pytest.approx([c.fused for c in plain.candidates])
    assert set(gated.features) == {"a", "b"} and all(len(v) == len(FEATURES) for v in gated.features.values())
    a, b = gated.features["a"], gated.features["b"]
    assert a[2] == 1.0 and b[2] == 0.0  # model a was confident (committed), b explored
    assert a[0] == pytest.approx(gated.steps[0].margins[0])


def test_a_gate_leaning_on_one_model_changes_the_winner_and_round_trips(tmp_path):
    g = Gate.zeros(["a", "b"])
    g.b = [0.0, 3.0]  # softmax(0, 3) → b weighs ~20× a
    path = write(tmp_path, g)
    _, equal = first_round(DecodeConfig(tau=0.7, branches=3, max_words=1))
    _, gated = first_round(DecodeConfig(tau=0.7, branches=3, max_words=1, gate=path, normalize="token"))
    wa, wb = gated.weights["a"], gated.weights["b"]
    assert wa + wb == pytest.approx(2.0) and wb / wa == pytest.approx(torch.e ** 3, rel=1e-6)
    for c in gated.candidates:
        if c.fused is not None:
            assert c.fused == pytest.approx((wa * c.nll["a"] + wb * c.nll["b"]) / (wa + wb))
    assert equal.candidates[equal.winner].text == " Paris" and gated.candidates[gated.winner].text == " London"
    d = AdaFuse(toy_pair(), DecodeConfig(tau=0.7, branches=3, max_words=1, gate=path, normalize="token")).start("Q")
    d.step()
    back = Trace.from_dict(json.loads(d.trace.to_json())).rounds[0]
    assert back.weights == d.trace.rounds[0].weights and back.features == d.trace.rounds[0].features


def test_features_decide_weights_per_round(tmp_path):
    """A gate that trusts whichever model is confident: weight follows the 'confident' feature of each model."""
    n, f = 2, len(FEATURES)
    g = Gate.zeros(["a", "b"])
    k = FEATURES.index("confident")
    g.W[0][0 * f + k] = 4.0  # model a's logit grows with a's confidence
    g.W[1][1 * f + k] = 4.0
    w = g.weights({"a": [0.9, 0.1, 1.0, 0.1, 0.0], "b": [0.1, 0.5, 0.0, 0.4, 0.0]})
    assert w["a"] > 1.9 and w["b"] < 0.1
    w = g.weights({"a": [0.1, 0.5, 0.0, 0.4, 0.0], "b": [0.9, 0.1, 1.0, 0.1, 0.0]})
    assert w["b"] > 1.9
    W, b = g.tensors()
    assert gate_weights(W, b, torch.zeros(n * f, dtype=torch.float64)).tolist() == [1.0, 1.0]


def test_gate_files_are_checked_before_any_model_prefills(tmp_path):
    models = toy_pair()
    wrong = write(tmp_path, Gate.zeros(["x", "y"]), "wrong.json")
    with pytest.raises(GateError, match="trained for the models x, y"):
        AdaFuse(models, DecodeConfig(gate=wrong)).start("Q")
    assert all(m.model.calls == 0 for m in models)  # nothing was computed
    with pytest.raises(GateError, match="no gate file"):
        AdaFuse(models, DecodeConfig(gate=str(tmp_path / "missing.json"))).start("Q")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "models": ["a", "b"], "features": ["margin"], "W": [], "b": []}')
    with pytest.raises(GateError, match="features"):
        load_gate(bad)
    bad.write_text("not json")
    with pytest.raises(GateError, match="not JSON"):
        load_gate(bad)
    nan = Gate.zeros(["a", "b"]).to_dict()
    nan["W"][0][0] = "nan"
    bad.write_text(json.dumps(nan))
    with pytest.raises(GateError, match="finite"):
        load_gate(bad)


def test_a_gate_trained_per_word_refuses_per_token_scores(tmp_path):
    """A gate's weights are tuned to the NLL averaging it learned with: another one is a typed error before any
    prefill, when a decode starts and when settings change mid-decode."""
    models, names = toy_pair(), ["a", "b"]
    word = write(tmp_path, Gate(names, Gate.zeros(names).W, [0.0, 0.0], trained={"normalize": "word"}), "word.json")
    token = write(tmp_path, Gate.zeros(names), "token.json")
    assert load_gate(word).normalize == "word" and load_gate(token).normalize == "token"
    with pytest.raises(GateError, match="averaged per word, not per token: decode with normalize='word'"):
        AdaFuse(models, DecodeConfig(gate=word, normalize="token")).generate("Q")
    with pytest.raises(GateError, match="averaged per token, not per word"):
        AdaFuse(models, DecodeConfig(gate=token, normalize="word")).start("Q")
    d = AdaFuse(models, DecodeConfig(gate=word, normalize="word", max_new_words=2)).start("Q")
    d.propose()
    with pytest.raises(GateError, match="per word, not per token"):
        d.reconfigure(DecodeConfig(gate=word, normalize="token", max_new_words=2))
    d.commit()
    assert d.trace.rounds[0].weights and d.trace.settings["normalize"] == "word"


def test_entropy_of_a_top_k_distribution():
    lp = torch.log(torch.tensor([0.5, 0.5, 0.0, 0.0]))
    assert entropy(lp) == pytest.approx(torch.log(torch.tensor(2.0)).item())
    assert entropy(torch.full((4,), float("-inf"))) == 0.0


def test_a_model_alone_ignores_the_ensemble_gate(tmp_path):
    """The app's "each model alone" runs share the ensemble's settings: a gate for the pair must not refuse them."""
    path = write(tmp_path, Gate.zeros(["a", "b"]))
    tr = AdaFuse([toy_pair()[0]], DecodeConfig(method="greedy", max_new_words=2, gate=path, normalize="token")).generate("Q")
    assert tr.output and all(not r.features for r in tr.rounds)


def test_shipped_gates_are_for_the_bundled_pair_and_trained_on_held_out_lines():
    shipped = sorted((Path(__file__).resolve().parents[1] / "assets" / "gates").glob("*.json"))
    assert {p.stem for p in shipped} >= {"qa", "mt"}
    for path in shipped:
        g = load_gate(path)
        assert g.models == list(DEFAULT_PAIR) and g.parameters <= 300
        assert g.trained["offset"] > 50 and all(c["line"] >= g.trained["offset"] for c in g.trained["curve"])


def validated_record() -> dict:
    diff = {"diff": -9.1, "low": -20.7, "high": -0.6, "wins": 1, "ties": 20, "losses": 4}
    return {"lines": "51-75", "planned_lines": "51-100", "complete": False, "helps": False,
            "summary": "experimental: −9.1 F1 vs equal weights on 25 unseen SQuAD lines",
            "tasks": {"squad": {"metric": "f1", "n": 25, "gate": 27.6, "equal": 36.7,
                                "best_single": {"model": "b", "score": 30.0}, "vs_equal": diff,
                                "vs_best_single": {**diff, "diff": -2.4, "low": -8.0, "high": 3.0}}}}


def test_a_gate_keeps_its_validation_record_and_its_shape_is_checked(tmp_path):
    """The numbers a menu shows beside a gate come from its file: kept on load and save, their shape checked."""
    g = Gate.zeros(["a", "b"])
    assert g.helps is None and g.summary == "not validated" and "validated" not in g.to_dict()
    g.validated = validated_record()
    path = write(tmp_path, g)
    back = load_gate(path)
    assert back.validated == validated_record() and back.helps is False
    assert back.summary.startswith("experimental: −9.1 F1")
    assert "−9.1" in Path(path).read_text(encoding="utf-8")  # written readable, not \u-escaped
    broken = [("lines", "fifty"), ("helps", "no"), ("summary", ""), ("tasks", {})]
    broken += [("tasks", {"squad": {**validated_record()["tasks"]["squad"], key: value}}) for key, value in
               (("n", 0), ("gate", "27"), ("best_single", {"score": 1.0}), ("metric", None),
                ("vs_equal", {"diff": 1.0, "low": 2.0, "high": 3.0}), ("vs_best_single", {"diff": 1.0}))]
    for key, value in broken:
        raw = {**g.to_dict(), "validated": {**validated_record(), key: value}}
        Path(path).write_text(json.dumps(raw))
        with pytest.raises(GateError, match="malformed validation record"):
            load_gate(path)


def test_shipped_gates_carry_their_validation_on_lines_they_were_not_trained_on():
    """Every shipped gate says how it did on the validation lines of the tasks it was trained for (written by
    experiments/validate_gates.py), and its one-line summary says "helps" only when the record says it does."""
    from adafuse.harness.tasks import TRAIN_OFFSET, VALIDATION_LINES
    for path in sorted((Path(__file__).resolve().parents[1] / "assets" / "gates").glob("*.json")):
        g = load_gate(path)
        v = g.validated
        assert v, f"{path.name} has no validation record: run python -m experiments.validate_gates"
        assert set(v["tasks"]) <= set(g.trained["tasks"])
        first, last = (int(x) for x in v["lines"].split("-"))
        assert VALIDATION_LINES[0] <= first <= last <= VALIDATION_LINES[1] < TRAIN_OFFSET <= g.trained["offset"]
        assert g.summary.startswith("helps:" if g.helps else "experimental:")


def test_the_scorer_takes_its_gate_where_the_decoder_does(tmp_path):
    """One load-and-check (`fusion.checked_gate`): a gate enters where weights do (a method that weighs, two models or
    more), for the decoder and the scorer alike, checked against the models and the averaging the same way; a mixture
    never reads its gate when decoding, and its scorer fuses without it too."""
    from adafuse.fusion import checked_gate
    g = Gate.zeros(["a", "b"])
    g.b = [0.0, 3.0]
    path = write(tmp_path, g)
    pair = list(toy_pair())
    assert AdaFuse(pair, DecodeConfig(gate=path, normalize="token")).scorer().gate is not None
    assert AdaFuse(pair, DecodeConfig(method="mixture", gate=path)).scorer().gate is None
    assert checked_gate(DecodeConfig(method="mixture", gate=path), ["a", "b"]) is None
    (paris,) = AdaFuse(pair, DecodeConfig(method="mixture", gate=path)).score("Q", [" Paris"])
    assert paris.weights == {} and paris.fused == pytest.approx(sum(paris.logprob.values()) / 2)
    word = write(tmp_path, Gate(["a", "b"], Gate.zeros(["a", "b"]).W, [0.0, 0.0], trained={"normalize": "word"}),
                 "word.json")
    for use in (lambda cfg: AdaFuse(pair, cfg).scorer(), lambda cfg: AdaFuse(pair, cfg).start("Q")):
        with pytest.raises(GateError, match="averaged per word, not per token"):
            use(DecodeConfig(gate=word, normalize="token"))
