"""A model served by a real vLLM OpenAI server (CPU, started here) fused with a local one."""
import json
import os

import pytest

from adafuse import AdaFuse, DecodeConfig, get_model
from adafuse.errors import ModelLoadError, ServerError
from adafuse.harness import serve
from tests.real import qa_prompt

pytestmark = pytest.mark.served

REQUIRED = os.environ.get("ADAFUSE_REQUIRE_VLLM") == "1"


@pytest.fixture(scope="module")
def server():
    if not serve.available():
        if REQUIRED:
            pytest.fail(f"vLLM is not installed in {serve.vllm_venv()}: run ./dev vllm")
        pytest.skip("vLLM is not installed (./dev vllm)")
    s = serve.start("smollm2-135m-instruct", name="smollm2")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def remote(server):
    return get_model(server.spec)


def test_a_bad_spec_or_name_is_a_typed_error(server):
    with pytest.raises(ModelLoadError, match="serves smollm2"):
        get_model(server.spec.replace("#smollm2", "#nope"))
    with pytest.raises(ServerError, match="does not answer"):
        get_model("vllm:http://127.0.0.1:9/v1#x")


def test_the_served_model_reads_like_the_local_one(remote, pair):
    local = pair[0]
    assert remote.end_ids == local.end_ids and remote.vocab_size == local.vocab_size
    assert remote.info()["device"].startswith("server http://127.0.0.1:")


def _scores(tr, model):
    return [(c.text, c.eos, c.nll.get(model)) for r in tr.rounds for c in r.candidates]


CFG = DecodeConfig(stop=("\n",), max_new_words=12, explore_top_k=20)
PROMPTS = [qa_prompt("nq", i) for i in range(2)] + [qa_prompt("triviaqa", i) for i in range(5, 7)]
ENDS_AT_ONCE = 2  # PROMPTS[2], TriviaQA line 5: the served SmolLM2 proposes to end the answer at once


@pytest.fixture(scope="module")
def decoded(remote, pair):
    """PROMPTS decoded with the member local (4 at once: as alone), then served one at a time: (local, served)."""
    import time
    local = AdaFuse([pair[0], pair[1]], CFG).generate_many(PROMPTS, concurrency=4)
    t0 = time.perf_counter()
    served = [AdaFuse([remote, pair[1]], CFG).generate(p) for p in PROMPTS]
    return local, served, time.perf_counter() - t0


def test_margins_and_nll_agree_with_the_local_model(decoded, remote, pair):
    """Round by round the same margins and NLLs, the end of the answer's too: on TriviaQA line 5 the served SmolLM2
    proposes to end at once, and its end term (every end token and every token starting "\n", 91 here) is asked of
    the server exactly, not summed over the top-20 of its proposal (there only "\n": 3.661 against 3.607)."""
    local = pair[0]
    for a, b in zip(decoded[0], decoded[1]):
        assert a.output == b.output and len(a.rounds) == len(b.rounds)
        for ra, rb in zip(a.rounds, b.rounds):
            for ma, mb in zip(ra.steps[0].margins, rb.steps[0].margins):
                assert abs(ma - mb) < 1e-3
            for ca, cb in zip(ra.candidates, rb.candidates):
                assert (ca.text, ca.eos) == (cb.text, cb.eos)
                va, vb = ca.nll[local.name], cb.nll[remote.name]
                assert (va is None) == (vb is None) and (va is None or abs(va - vb) < 1e-3), (ca.text, va, vb)
    b = decoded[1][ENDS_AT_ONCE]
    assert any(c.eos and c.nll[remote.name] is not None for c in b.rounds[0].candidates)  # the end term, asked
    json.loads(b.to_json())
    cost = b.cost(remote.name)
    assert cost["forward_passes"] > 0 and cost["seconds"] > 0 and cost["cached_tokens"] > 0  # the prefix cache


def test_token_union_reads_a_served_model_as_the_local_one(remote, pair):
    """Token union averages each model's probability of the next token (and of ending): asked exactly of a served
    member, not read off its top-20, so the served member decodes what the local one does."""
    cfg = DecodeConfig.of(stop=("\n",), max_new_words=6, method="token-union")
    prompt = qa_prompt("triviaqa", 5)
    a, b = (AdaFuse([m, pair[1]], cfg).generate(prompt) for m in (pair[0], remote))
    assert a.output == b.output and [r.text for r in a.rounds] == [r.text for r in b.rounds]
    for ra, rb in zip(a.rounds, b.rounds):  # every candidate's probability under the member, however it ranks
        for ca, cb in zip(ra.candidates, rb.candidates):
            assert (ca.text, ca.eos) == (cb.text, cb.eos)
            assert abs(ca.nll[pair[0].name] - cb.nll[remote.name]) < 2e-3, (ra.index, ca.text, ca.nll, cb.nll)


def test_the_eval_harness_runs_a_served_model(server, remote, pair, tmp_path):
    from adafuse.harness.evaluate import evaluate, load_results, parse_methods
    from adafuse.harness.tasks import TASKS
    runs = parse_methods(["adafuse"], [server.spec, "gemma3-270m"])  # the served member alone: the decodes above
    evaluate(TASKS["triviaqa"], runs, tmp_path, limit=1, progress=False)
    (row,) = load_results(tmp_path)
    assert row["method"] == "adafuse" and row["trace"]["output"].strip()
    assert row["trace"]["models"] == [remote.name, "gemma3-270m"]


def _answered_alike(a, b, model: str) -> bool:
    """The server gave both traces the same margins, round by round (within 1e-4)."""
    ma, mb = ([st.margins for r in t.rounds for st in r.steps if st.model == model] for t in (a, b))
    return [len(x) for x in ma] == [len(x) for x in mb] and sum(ma, []) == pytest.approx(sum(mb, []), abs=1e-4)


def test_four_decodes_in_flight_with_a_served_member_give_their_own_traces(decoded, remote, pair):
    """The fused output is identical with the member local and served (4 NQ/TriviaQA prompts, one at a time), and
    many decodes at once with a served member: each decode's requests go out while the others' do (the server
    batches them), and each trace is the one decoded alone, with the same requests per decode.

    vLLM's answers are not batch-invariant: the same context asked while other decodes' requests run can come back
    with other log-probs (measured on this CPU server: a word start's margin 0.0188 alone, 0.0547 with seven other
    prompts in flight, with or without its prefix cache). A decode the server answered differently may then take
    another path (more or fewer requests); the request counts are compared where the server answered the same."""
    import time
    local, alone, one_at_a_time = decoded
    t0 = time.perf_counter()
    many = AdaFuse([remote, pair[1]], CFG).generate_many(PROMPTS, concurrency=4)
    in_flight = time.perf_counter() - t0
    assert [t.output for t in alone] == [t.output for t in local]  # served or local, the same fused output
    assert [t.output for t in many] == [t.output for t in alone]
    same_answers = [i for i, (a, m) in enumerate(zip(alone, many)) if _answered_alike(a, m, remote.name)]
    assert len(same_answers) >= 2, f"the server answered only decodes {same_answers} as it did alone"
    requests = [[t.cost(remote.name)["forward_passes"] for t in (many[i], alone[i])] for i in same_answers]
    assert all(m == a for m, a in requests), requests
    print(f"4 decodes with a served member: one at a time {one_at_a_time:.1f} s, 4 in flight {in_flight:.1f} s; "
          f"served the same answers: {len(same_answers)} of 4")


def test_a_server_killed_mid_decode_is_a_typed_error_and_keeps_the_trace(server, remote, pair):
    d = AdaFuse([remote, pair[1]], DecodeConfig(max_new_words=40, tau=0.0)).start("The history of Rome began")
    d.step()
    d.step()
    kept = list(d.trace.rounds)
    server.stop()  # last test of the module: the server is gone for good
    with pytest.raises(ServerError, match="does not answer") as err:
        while not d.done:
            d.step()
    assert d.trace.rounds == kept[: len(d.trace.rounds)] and len(d.trace.rounds) >= 2
    assert d.trace.output == "".join(r.text for r in d.trace.rounds)
    assert d.done and d.trace.stop_reason.startswith("error: ServerError")
    from app.controller import friendly
    assert server.url in friendly(err.value)  # what the app shows: which server failed
