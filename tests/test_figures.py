"""Figures of a trace (adafuse/harness/figures.py)."""
import pytest
import torch

from adafuse import AdaFuse, DecodeConfig
from adafuse.gate import Gate
from adafuse.harness.figures import margins_figure, pool_figure
from tests.toy import toy_pair


def write(tmp_path, gate: Gate, name="gate.json"):
    path = tmp_path / name
    gate.save(path)
    return str(path)


def test_the_views_show_the_gate_weights(tmp_path):
    g = Gate.zeros(["a", "b"])
    g.b = [0.0, 1.0]
    tr = AdaFuse(toy_pair(), DecodeConfig(tau=0.7, branches=3, max_words=1, max_new_words=3, normalize="token",
                                      gate=write(tmp_path, g))).generate("Q")
    fig = margins_figure(tr)
    shares = [t for t in fig.data if t.name and t.name.endswith("gate weight share")]
    assert [t.name for t in shares] == ["a · gate weight share", "b · gate weight share"]
    gated = [r for r in tr.rounds if r.features]
    assert list(shares[1].y) == pytest.approx([torch.e / (1 + torch.e)] * len(gated))
    scored = next(r.index for r in gated)
    assert any("gate weighted mean" in (t.name or "") for t in pool_figure(tr, scored).data)
