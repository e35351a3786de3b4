"""Many decodes at once (adafuse/models/batching.py, adafuse/many.py): a packed forward gives each request what its own
forward gives (tiny random transformers, sliding windows included), the batcher gathers the decodes in flight, keeps
to its caps and isolates a failing request; many decodes give the traces each gives alone, in order."""
import copy
import threading
import time

import pytest
import torch
from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from adafuse import AdaFuse, ConfigError, DecodeConfig
from adafuse.many import run_many
from adafuse.models import batching, packed
from adafuse.models.batching import Batcher, Request, Rider, packed_forward
from tests.toy import toy_pair


def tiny(kind: str):
    torch.manual_seed(0)
    if kind == "llama":
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
        return LlamaForCausalLM(cfg).eval()
    cfg = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                           layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                           max_position_embeddings=256)
    return Gemma3ForCausalLM(cfg).eval()


def prefilled(model, ids: list[int]) -> DynamicCache:
    cache = DynamicCache()
    if ids:
        with torch.inference_mode():
            model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("attention", ["one", "rows", "loop", "auto"])
@pytest.mark.parametrize("kind", ["llama", "gemma-sliding"])
def test_a_packed_forward_gives_each_request_its_own_forwards_numbers(kind, attention):
    """Requests with their own caches (of different lengths, past the sliding window of 4), single rows or several
    rows, fed one or several tokens, in one packed forward: each gets the log-probs its own forward gives, and its
    cache holds what its own forward would have left — with one attention call per layer over all of them, with a
    call per request (the reference), and with the cheaper of the two chosen per layer."""
    model = tiny(kind)
    alone_model = copy.deepcopy(model)  # transformers' own attention, never switched
    assert batching.use_packed_attention(model)
    cases = [([5, 6, 7], [[8]], None), ([], [[1, 2, 3, 4, 5, 6]], 2), (list(range(10, 19)), [[20, 21], [22, 23],
             [24, 25]], None), (list(range(30, 36)), [[40]], 1)]
    reqs, expected, caches_alone = [], [], []
    for past, rows, keep in cases:
        alone_cache = prefilled(alone_model, past)
        if past:  # the same cached keys for both: expanded to one row per row
            alone_cache.batch_repeat_interleave(len(rows))
        with torch.inference_mode():
            logits = alone_model(input_ids=torch.tensor(rows), past_key_values=alone_cache, use_cache=True).logits
        expected.append(torch.log_softmax(logits.float(), -1)[:, -(keep or len(rows[0])):])
        caches_alone.append(alone_cache)
        cache = prefilled(alone_model, past)
        if past:
            cache.batch_repeat_interleave(len(rows))
        reqs.append(Request(rows, cache, keep))
    calls = []
    hook = model.model.layers[0].self_attn.register_forward_hook(
        lambda _m, _a, kwargs, _o: calls.append(kwargs[packed.RUN].calls), with_kwargs=True)
    with torch.inference_mode():
        outs = packed_forward(model, reqs, attention)
    hook.remove()
    if attention != "auto":  # after the first layer: one call, one per length of what the rows feed, one per request
        assert calls == [{"one": 1, "rows": len({len(r.rows[0]) for r in reqs}), "loop": len(reqs)}[attention]]
    for out, want, r, alone_cache in zip(outs, expected, reqs, caches_alone):
        assert out.shape == want.shape
        assert torch.allclose(out, want, atol=1e-5), (out - want).abs().max()
        assert torch.equal(out.argmax(-1), want.argmax(-1))
        assert r.cache.get_seq_length() == alone_cache.get_seq_length()
        assert torch.allclose(r.cache.layers[0].keys, alone_cache.layers[0].keys, atol=1e-5)
    # the model called directly (no packed forward under way) computes as transformers' own attention does
    x = torch.tensor([[3, 4, 5, 6, 7, 8]])
    with torch.inference_mode():
        assert torch.allclose(model(input_ids=x).logits, alone_model(input_ids=x).logits, atol=1e-5)


def test_a_batch_waits_for_a_working_decode_and_carries_both():
    """Two decodes working at once: the first request waits for the second (still computing) and one forward
    carries both; a decode that is not working (between Step presses) is never waited for."""
    assert batching.GATHER_SECONDS > 0.02
    model = tiny("llama")
    b = Batcher(model, batching.Runtime(gather_seconds=30.0))  # a loaded machine must not start the batch early
    r1, r2, idle = Rider(), Rider(), Rider()
    served = {}

    both_working = threading.Barrier(2)

    def decode(rider, name, after_first):
        with rider.working():
            both_working.wait(10)  # neither request is sent before both decodes are computing
            while after_first and not b.queue:  # Python work before the forward, until the first one is queued
                time.sleep(0.005)
            served[name] = b.forward([[1, 2]], prefilled(model, [3, 4]))

    for rider in (r1, r2, idle):  # a decode's first forward registers its rider with the model
        with rider.working():
            b.forward([[5]], prefilled(model, [6]))
    b.forwards = 0
    threads = [threading.Thread(target=decode, args=(r1, "a", False)),
               threading.Thread(target=decode, args=(r2, "b", True))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert served["a"].riders == served["b"].riders == 2 and b.peak_requests == 2
    assert served["a"].seconds == pytest.approx(served["b"].seconds)  # same positions: the same share
    assert b.forwards == 1
    # who is waited for: a working rider without a request in; never an idle one
    b.queue = [Request([[1]], prefilled(model, [2]), wake=b.runtime.waiter())]
    b.free_since = time.monotonic()
    assert b._ready()  # r1, r2 and idle are all idle now
    with r2.working():
        assert not b._ready()
        r2.waiting += 1  # its request is in (here or at another model)
        assert b._ready()
    fresh = Rider()  # a decode starting now (no request sent yet): waited for once it says it will come
    with fresh.working():
        assert b._ready()
        b.expect(fresh)
        assert not b._ready()


def test_caps_hold_requests_back_and_a_failing_request_fails_alone():
    model = tiny("llama")
    b = Batcher(model, max_rows=2)
    reqs = [Request([[1]], prefilled(model, [2])) for _ in range(3)]
    b.queue = list(reqs)
    assert b._take() == reqs[:2] and b.queue == reqs[2:]  # back-pressure: the third waits for the next forward
    big = Request([[1]] * 5, prefilled(model, []))
    b.queue = [big]
    assert b._take() == [big]  # larger than the caps: alone
    good, bad = Request([[1, 2]], prefilled(model, [3])), Request([[999]], prefilled(model, [3]))  # 999: no such id
    b._run([good, bad])
    assert good.error is None and good.logprobs.shape == (1, 2, 64)
    assert isinstance(bad.error, IndexError)


def test_run_many_keeps_the_order_and_raises_an_error_at_its_place():
    def job(i):
        def run():
            time.sleep(0.01 * (5 - i))  # the later jobs finish first
            if i == 3:
                raise ValueError("job 3")
            return i
        return run

    assert list(run_many([job(i) for i in range(3)], 4)) == [0, 1, 2]
    got = []
    with pytest.raises(ValueError, match="job 3"):
        for x in run_many([job(i) for i in range(6)], 3):
            got.append(x)
    assert got == [0, 1, 2]
    for bad in (0, 1.5, "8", True):
        with pytest.raises(ConfigError, match="concurrency"):
            list(run_many([job(0)], bad))


def test_many_decodes_give_the_traces_each_gives_alone():
    pair = toy_pair()
    cfg = DecodeConfig(tau=0.5, branches=3)
    prompts = ["Q", "Q Paris", "Q", "Q London is"]
    alone = [AdaFuse(pair, cfg).generate(p) for p in prompts]
    many = AdaFuse(pair, cfg).generate_many(prompts, concurrency=4)
    assert [t.output for t in many] == [t.output for t in alone]
    assert [[(r.text, r.chosen) for r in t.rounds] for t in many] == [[(r.text, r.chosen) for r in t.rounds]
                                                                      for t in alone]
    with pytest.raises(Exception, match="prompt is empty"):
        AdaFuse(pair, cfg).generate_many(["Q", " "], concurrency=2)


def test_auto_attention_runs_the_loop_on_a_cpu_and_single_calls_where_launches_cost_more():
    """`auto`: a call per request on a CPU (measured the fastest there, results/bench/attention_e2e.txt); on an
    accelerator one call over the rows where padding wastes little, else the loop."""
    from adafuse.models.packed import _cheapest, _Segment
    cpu, gpu = torch.device("cpu"), torch.device("cuda")

    def case(*specs):  # (rows, fed tokens, keys) per request
        segs = [_Segment(None, 0, rows, length, keys - length) for rows, length, keys in specs]
        return segs, [(torch.empty(rows, 1, keys, 1), None) for rows, _, keys in specs]
    alike = case((1, 1, 300), (3, 1, 280), (1, 1, 310))
    assert _cheapest(*alike, cpu) == "loop" and _cheapest(*alike, gpu) == "rows"
    assert _cheapest(*case((1, 1, 2000), *[(1, 1, 20)] * 5), gpu) == "loop"  # padding 5.7x, the dense layout 6x
    assert _cheapest(*case((1, 1, 300), (1, 64, 64)), gpu) == "loop"  # no two feed as many tokens


@pytest.mark.parametrize("window", [None, 2])
def test_the_rows_mask_lets_each_row_see_its_own_keys_up_to_its_position(window):
    """`_row_mask` by its definition, cell by cell: requests feeding T = 2 tokens after different pasts, their keys
    padded to the longest (a sliding layer holds fewer), each row's query at past+t seeing its key j (at past+T-L+j)
    when j < L, at or before its position, inside the window."""
    segments = [packed._Segment(None, 0, rows=2, length=2, past=3), packed._Segment(None, 4, rows=1, length=2, past=0),
                packed._Segment(None, 6, rows=3, length=2, past=1)]
    lengths, longest = (5, 2, 3), 5
    mask = packed._row_mask(segments, lengths, longest, window, torch.device("cpu"))
    assert mask.shape == (6, 1, 2, 5) and mask.dtype == torch.bool
    row = 0
    for s, held in zip(segments, lengths):
        for _ in range(s.rows):
            for t in range(2):
                for j in range(longest):
                    q, k = s.past + t, s.past + s.length - held + j
                    want = j < held and k <= q and (window is None or k > q - window)
                    assert bool(mask[row, 0, t, j]) == want, (row, t, j)
            row += 1


def test_the_packed_overhead_benchmark_prints_each_modes_cost_per_layer_and_request(capsys):
    from bench.packed_overhead import main
    threads = torch.get_num_threads()
    with torch.random.fork_rng():  # it seeds its models: the other tests' random numbers stay theirs
        assert main(["--layers", "1", "2", "--requests", "1", "2", "--repeats", "1"]) == 0
    assert torch.get_num_threads() == threads  # it runs on one thread, then gives the process its threads back
    out = capsys.readouterr().out
    assert out.count("engine per layer and request:") == 2 and out.count(" ms\n") == 8


def test_auto_chooses_once_per_forward_and_sliding_window(monkeypatch):
    """Every layer of one window holds as many keys per request: "auto" weighs the requests at the first such layer
    only (a full and a sliding window here: two choices in a forward of three layers), as on a GPU."""
    monkeypatch.setattr(packed, "launches_cost_more", lambda device: True)
    chosen = []
    monkeypatch.setattr(packed, "_cheapest", lambda *a: chosen.append(1) or "loop")
    model = tiny("gemma-sliding")
    assert batching.use_packed_attention(model)
    reqs = [Request([[8]], prefilled(model, [5, 6, 7, 9, 10, 11])), Request([[9]], prefilled(model, [1, 2]))]
    with torch.inference_mode():
        packed_forward(model, reqs, "auto")
    assert len(chosen) == 2


def test_the_engine_benchmark_runs_and_prints_its_columns(capsys):
    """`python -m bench.engine` on two levels with no device time: every column printed, the traces of 2 in flight
    those of one at a time."""
    from bench import engine
    threads = torch.get_num_threads()
    try:
        table = engine.simulate([1, 2], 0.0, 1)
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    for column in ("decodes/s", "forwards/decode", "engine ms/step", "CPU ms/decode", "cores busy", "same traces"):
        assert column in out, column
    assert [r["in flight"] for r in table] == [1, 2] and table[1]["same traces"] == "8/8"
    assert all(r["CPU ms/decode"] > 0 and r["forwards/decode"] > 0 for r in table)
