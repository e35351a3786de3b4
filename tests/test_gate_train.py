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
    kw = dict(models=[m.name for m in pair], tasks=["nq"], out=out, data=SHARED, offset=101, per_task=3, seed=1,
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
