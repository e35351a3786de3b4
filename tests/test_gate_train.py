"""Training a gate from answer rewards (adafuse/harness/gate_train.py) on the real pair."""
import pytest

from adafuse import AdaFuse, DecodeConfig
from adafuse.gate import load_gate
from adafuse.harness import gate_train
from tests.real import SHARED


def test_gate_training_learns_from_answer_rewards_and_resumes(pair, tmp_path):
    """Two REINFORCE steps on held-out NQ lines with the real pair write a gate; a longer run resumes from the
    checkpoint (same example order and samples), and the gate decodes."""
    out = tmp_path / "qa.json"
    said = []
    kw = dict(models=[m.name for m in pair], tasks=["nq"], out=out, data=SHARED, offset=101, per_task=2, seed=1,
              save_every=1, progress=False, log=said.append)
    gate_train.train(steps=2, **kw)
    g = load_gate(out)
    assert g.models == [m.name for m in pair] and g.trained["offset"] == 101
    assert [c["line"] >= 101 for c in g.trained["curve"]] == [True, True]
    gate_train.train(steps=3, **kw)
    assert any("resuming" in s and "step 2" in s for s in said)
    again = load_gate(out)
    assert [c["line"] for c in again.trained["curve"][:2]] == [c["line"] for c in g.trained["curve"]]
    tr = AdaFuse(pair, DecodeConfig(max_new_words=4, gate=str(out), stop=("\n",))).generate("Question: Who wrote Hamlet?\nAnswer:")
    scored = [r for r in tr.rounds if r.features]
    assert all(set(r.weights) == {m.name for m in pair} for r in scored)
    with pytest.raises(Exception, match="other settings"):
        gate_train.train(steps=4, **{**kw, "seed": 2})


@pytest.mark.unit
def test_training_keeps_the_checkpoint_that_scores_best_on_the_validation_lines(tmp_path):
    """Toy pair, training lines answered "Paris" (model a's answer) and validation lines "London" (model b's). The gate
    starts leaning on b: training moves it towards a, so the validation reward falls from 1 to 0; the file written is
    the start (step 0), and it records the validation curve and the step it kept."""
    import math

    from tests.toy_tasks import toy_data, toy_qa_pair
    data = toy_data(tmp_path / "data", {(51, 100): "London"})
    out, said = tmp_path / "g.json", []
    kw = dict(models=list(toy_qa_pair()), tasks=["nq"], out=out, data=data, per_task=4, seed=0, lr=1.0,
              init=(1.0, 20.0), save_every=2, progress=False, log=said.append, validate_every=3, val_per_task=2)
    g = gate_train.train(steps=6, **kw)
    val = g.trained["validation"]
    assert [v["step"] for v in val["curve"]] == [0, 3, 6] and val["lines"] == "51-100" and val["examples"] == 2
    assert val["curve"][0]["reward"] == 1.0 and val["curve"][-1]["reward"] == 0.0  # training taught it "Paris"
    assert all(c["line"] >= 101 for c in g.trained["curve"]) and len(g.trained["curve"]) == 6
    assert val["kept_step"] == 0 and val["kept_reward"] == 1.0
    assert g.b == pytest.approx([0.0, math.log(20.0)]) and all(v == 0.0 for row in g.W for v in row)
    assert load_gate(out).b == g.b
    # without validation the last step is written: it has moved away from the start
    last = gate_train.train(steps=6, **{**kw, "out": tmp_path / "last.json", "validate_every": 0})
    assert "validation" not in last.trained and last.b != pytest.approx(g.b)
    # a longer run resumes from the checkpoint with its validations, and validates the new last step
    said.clear()
    more = gate_train.train(steps=7, **kw)
    assert any("resuming" in s and "step 6" in s for s in said)
    assert [v["step"] for v in more.trained["validation"]["curve"]] == [0, 3, 6, 7]
    with pytest.raises(Exception, match="other settings"):
        gate_train.train(steps=7, **{**kw, "val_per_task": 1})


@pytest.mark.unit
def test_search_reports_validation_scores_beside_training_ones_and_chooses_on_training(tmp_path):
    from tests.toy_tasks import toy_data, toy_qa_pair
    data = toy_data(tmp_path / "data", {(51, 100): "London"})
    res = gate_train.search(list(toy_qa_pair()), ["nq"], [(1.0, 1.0), (1.0, 9.0)], data, 101, 2, log=lambda _: None,
                            val_per_task=3)
    assert [(r["weights"], r["reward"], r["validation"]) for r in res["grid"]] == [([1.0, 1.0], 1.0, 0.0),
                                                                                     ([1.0, 9.0], 0.0, 1.0)]
    assert res["best"] == [1.0, 1.0] and res["validation_lines"] == "51-100" and res["validation_examples"] == 3
    assert res["models"] == ["a", "b"] and res["grid"][0]["validation_per_task"] == {"nq": 0.0}
    plain = gate_train.search(list(toy_qa_pair()), ["nq"], [(1.0, 1.0)], data, 101, 1, log=lambda _: None)
    assert "validation" not in plain["grid"][0] and "validation_lines" not in plain
