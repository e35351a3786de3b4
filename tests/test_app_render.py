"""What the page shows of a decode under way and decided (app/views.py `render`, app/leases.py `run`), on the toy app's
models (tests/toy_app.py) loaded by the page's own registry: the answer's place while the first round is decided,
the round the Pool tab opens on after a Run and after a Step, and the live status counted from the trace the answer is
drawn from."""
import re

import pytest

import app.controller as controller
from adafuse import DEFAULT_PAIR, DecodeConfig
from adafuse.models import ModelRegistry
from app.controller import Explorer
from app.handlers import on_round, on_run
from app.views import STATUS_AT, render
from tests.toy import toy_model
from tests.toy_app import CHAT, RULES, VOCAB

pytestmark = pytest.mark.unit

NAMES = list(DEFAULT_PAIR)
HAMLET = "Question: Who wrote the play Hamlet?\nAnswer:"  # round 0 explores; the last round commits the line end alone
SETTINGS = dict(tau=0.7, max_words=3, branches=3, diversity=True, exploration="surface", lam=1.0, max_new_words=40,
                max_new_tokens=80, mode="raw", stop="\\n", system="", thinking="template default", speculate=False,
                normalize="per token (paper)", allow_empty=False, gate="", weights=(1, 1))
CFG = DecodeConfig(stop=("\n",), max_new_words=40, max_new_tokens=80, speculate=False)
SLIDER, POOL = 8, 3  # where the round slider and the pool figure sit in render()'s tuple


@pytest.fixture(autouse=True)
def toys(monkeypatch):
    """The page's registry loads the toy app's models under the bundled names (no delay, no real weights)."""
    def load(name, device=None, dtype=None, trust_remote_code=False):
        return toy_model(name, VOCAB, RULES[name], chat=CHAT if name == NAMES[0] else None, embedded=True,
                         max_positions=32_768)
    monkeypatch.setattr(controller, "MODELS", ModelRegistry(loader=load))


def page_settings(**kw) -> list:
    s = {**SETTINGS, **kw}
    return [NAMES, *list(s.values())[:-1], *s["weights"]]


def test_while_the_first_round_is_decided_the_answer_says_so_not_empty():
    ex = Explorer()
    ex.begin(NAMES, CFG, HAMLET, resume=False)
    ex.running = True  # a Run between "decoding" and its first round
    fused = render(ex, "… decoding")[0]
    assert "deciding the first round" in fused and "(empty)" not in fused and "0 rounds" not in fused, fused
    ex.running = False  # cancelled before the first round: nothing empty either, and what goes on
    assert "No round decided yet: Step › or ▶ Run starts the first one" in render(ex)[0]


def test_after_a_run_the_pool_opens_on_the_last_round():
    ex = Explorer()
    d = ex.begin(NAMES, CFG, HAMLET, resume=False)
    while not d.done:
        d.step()
    last = len(d.trace.rounds) - 1
    assert last >= 1 and len(d.trace.rounds[last].candidates) == 1  # the latest round had nothing to choose
    out = render(ex, "✓ done")
    assert out[SLIDER]["value"] == last and out[SLIDER]["maximum"] == last
    assert f"round {last} (" in out[POOL].layout.title.text, out[POOL].layout.title.text


def test_after_a_step_the_pool_opens_on_the_pending_round_and_its_slider_reaches_it():
    ex = Explorer()
    d = ex.begin(NAMES, CFG, HAMLET, resume=False)
    d.step()
    pending = d.propose()  # Step: round 1 decided, waiting for a pick
    out = render(ex, "› round 1 decided")
    assert out[SLIDER]["value"] == pending.index == out[SLIDER]["maximum"] and out[SLIDER]["visible"]
    assert f"round {pending.index} (pending" in out[POOL].layout.title.text
    figure, _ = on_round(ex, pending.index)  # the slider moved away and back: the pending round again
    assert "pending" in figure.layout.title.text
    figure, picks = on_round(ex, 0)
    assert "round 0 (explore)" in figure.layout.title.text and len(picks) > 0  # round 0's first tokens, listed


def test_the_live_status_counts_the_rounds_and_words_the_answer_shows():
    """Every update of a Run: the status's "N rounds decided · W words" is the legend's "N rounds · W words"."""
    seen = []
    for out in on_run(None, NAMES, "default", False, HAMLET, False, [], None, *page_settings()):
        said = re.search(r"(\d+) rounds? decided · (\d+) words?", out[1 + STATUS_AT] or "")
        if said:
            legend = re.search(r"(\d+) rounds? · (\d+) words?", out[1])
            assert legend and legend.groups() == said.groups(), (out[1 + STATUS_AT], out[1][-300:])
            seen.append(said.groups())
    assert len(seen) >= 2 and seen[0][0] == "1", seen


def test_rounds_that_stream_in_quickly_redraw_the_answer_and_not_every_chart(monkeypatch):
    """A Run's rounds arriving faster than LIVE_REDRAW_S update the answer and the status each round, the charts and
    tables at most once in that time (the "… decoding" line drew them), and the last update draws every view of the finished decode."""
    import app.handlers as handlers
    import plotly.graph_objects as go
    monkeypatch.setattr(handlers, "LIVE_REDRAW_S", 3600.0)  # every round within the window of the first one
    cfg = page_settings(stop="", max_new_words=12, mode="chat")
    outs = list(on_run(None, NAMES, "default", False, "Give me two short tips for making a good cup of tea.", False,
                       [], None, *cfg))
    rounds = [o for o in outs if re.search(r"rounds? decided", o[1 + STATUS_AT] or "")]
    drawn = [o for o in rounds if isinstance(o[1 + POOL], go.Figure)]
    assert len(rounds) >= 5 and not drawn, (len(rounds), len(drawn))  # all within the window of "… decoding"
    words = [int(re.search(r"(\d+) rounds? · (\d+) words?", o[1]).group(2)) for o in rounds]
    assert words == sorted(words) and len(set(words)) >= 4  # the answer grew on every live update
    last = outs[-1]
    assert "✓ done" in last[1 + STATUS_AT] and isinstance(last[1 + POOL], go.Figure)
    assert f"round {len(rounds) - 1} (" in last[1 + POOL].layout.title.text  # the end draws the finished decode
    monkeypatch.setattr(handlers, "LIVE_REDRAW_S", 0.0)  # a redraw due on every round: each one drawn in full
    outs = list(on_run(None, NAMES, "default", False, "Give me two short tips for making a good cup of tea.", False,
                       [], None, *cfg))
    assert all(isinstance(o[1 + POOL], go.Figure) for o in outs if re.search(r"rounds? decided", o[1 + STATUS_AT] or ""))


def test_a_status_only_update_has_one_entry_per_view_without_drawing_any():
    from app.views import N_OUTPUTS, only_status
    assert len(render(Explorer())) == N_OUTPUTS == len(only_status("x")) and only_status("x")[STATUS_AT] == "x"
