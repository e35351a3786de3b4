"""Counterfactual branches (adafuse/replay.py): replay the earlier rounds, commit another candidate,
say where a replay diverged; toy LMs for exact checks, the bundled pair once."""
import pytest

from adafuse import AdaFuse, ConfigError, DecodeConfig
from adafuse.errors import ReplayError
from adafuse.replay import branch_from
from adafuse.trace import Round, Trace
from tests.toy import A_RULES, B_RULES, V, toy_model, toy_pair

ONE_WORD = DecodeConfig(max_words=1)  # a commits one word a round: " Paris", " is", " nice." (3 rounds, 3 pools)


def original() -> Trace:
    return AdaFuse(toy_pair(), ONE_WORD).generate("Q")


def committed_before(trace: Trace, round_index: int) -> str:
    """The committed text when round `round_index` was decided: the earlier rounds' chosen candidates' texts."""
    return "".join(r.candidates[r.chosen].text for r in trace.rounds[:round_index])


def finish(d):
    for _ in d:
        pass
    return d.trace


def pool(r: Round) -> list[tuple]:
    return [(c.text, c.eos, c.proposers, c.nll, c.n_tokens, c.fused) for c in r.candidates]


def test_branch_replays_earlier_rounds_then_commits_the_picked_candidate():
    tr = original()
    assert tr.output == " Paris is nice." and len(tr.rounds) == 3
    R = 2
    r = tr.rounds[R]
    C = next(j for j, c in enumerate(r.candidates) if j != r.winner and c.text != r.candidates[r.winner].text)
    d = branch_from(list(toy_pair()), tr, R, C)
    new = d.trace
    assert [x.text for x in new.rounds[:R]] == [x.text for x in tr.rounds[:R]]
    for a, b in zip(new.rounds[:R], tr.rounds[:R]):
        assert pool(a) == pool(b) and a.chosen == b.chosen and not a.overridden
    got = new.rounds[R]
    assert got.overridden and got.chosen != got.winner
    picked, want = got.candidates[got.chosen], r.candidates[C]
    assert (picked.text, picked.eos) == (want.text, want.eos)
    finish(d)
    assert new.output != tr.output and new.output.startswith(committed_before(tr, R) + r.candidates[C].text)


def test_a_branch_is_ready_to_continue_and_aFuse_branch_uses_the_trace_settings():
    tr = original()
    london = next(j for j, c in enumerate(tr.rounds[0].candidates) if c.text == " London")
    d = AdaFuse(toy_pair(), DecodeConfig(max_words=3)).branch(tr, 0, london)  # the trace's max_words=1 decides
    assert not d.done and d.trace.settings == tr.settings
    out = finish(d)
    assert out.output == " London is nice." and out.stop_reason == "eos"
    assert [x.words for x in out.rounds] == [1, 1, 1]


def test_a_branch_keeps_the_original_overrides_and_settings_changes():
    d = AdaFuse(toy_pair(), ONE_WORD).start("Q")
    london = next(j for j, c in enumerate(d.propose().candidates) if c.text == " London")
    d.commit(london)  # the user overrode round 0
    d.reconfigure(DecodeConfig(max_words=2))  # and let a commit two words from round 1 on
    tr = finish(d)
    assert tr.rounds[0].overridden and tr.changes
    r = tr.rounds[1]
    other = next(j for j in range(len(r.candidates)) if j != r.chosen)
    b = branch_from(list(toy_pair()), tr, 1, other)
    assert b.trace.rounds[0].overridden and b.trace.rounds[0].text == " London"
    assert b.trace.changes == tr.changes and b.config.max_words == 2
    assert b.trace.rounds[1].candidates[b.trace.rounds[1].chosen].text == r.candidates[other].text


def test_branch_validates_indices_and_models():
    tr = original()
    models = list(toy_pair())
    for bad in (-1, 3, True, "1"):
        with pytest.raises(ConfigError, match=r"pick 0\.\.2"):
            branch_from(models, tr, bad, 0)
    n = len(tr.rounds[1].candidates)
    for bad in (-1, n, None):
        with pytest.raises(ConfigError, match=rf"not a candidate of round 1: pick 0\.\.{n - 1}"):
            branch_from(models, tr, 1, bad)
    with pytest.raises(ConfigError, match="decoded by a, b"):
        branch_from(models[::-1], tr, 1, 0)
    assert all(m.model.calls == 0 for m in models)  # checked before any model prefills


def test_branch_with_other_models_says_where_the_replay_diverged():
    tr = original()
    b_likes_big = dict(B_RULES, **{" Paris": {" big": 0.95}})
    with pytest.raises(ReplayError, match="diverged at round 1"):
        branch_from([toy_model("a", V, A_RULES), toy_model("b", V, b_likes_big)], tr, 2, 1)


def test_real_pair_branch_replays_and_overrides(pair, hamlet):
    tr, R = hamlet
    r = tr.rounds[R]
    C = next(j for j, c in enumerate(r.candidates) if j != r.winner)
    d = branch_from(pair, tr, R, C)
    new = d.trace
    assert [(x.text, [c.text for c in x.candidates]) for x in new.rounds[:R]] == \
        [(x.text, [c.text for c in x.candidates]) for x in tr.rounds[:R]]
    got = new.rounds[R]
    assert got.overridden and got.candidates[got.chosen].text == r.candidates[C].text
    finish(d)
    assert new.output.startswith(committed_before(tr, R) + new.rounds[R].text) and new.stop_reason
