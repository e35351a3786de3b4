"""One model's view of the text (adafuse/models/session.py): the KV cache follows every commit, shared prompt prefixes,
guesses fed with a catch-up, anchored tokenization, the prompt a session was given; and the bounds on what a model
keeps (a released view, the prefix store's prompts and bytes, stop sets, names that failed to load)."""
import gc
import os
import sys
import threading
import weakref

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import DynamicCache

from adafuse import AdaFuse, DecodeConfig
from adafuse.errors import ModelNotFoundError
from adafuse.models import ModelRegistry, free_unused_memory
from adafuse.models import base as base_module
from adafuse.models import tokenized as session_module
from adafuse.models.idle import IdleViews
from adafuse.models.prefixes import PrefixStore
from adafuse.models.session import LocalSession
from tests.real import RELAXED, TEXTS, gsm8k_prompt, tolerance, views  # noqa: F401  (views: a fixture)
from tests.toy import A_RULES, B_RULES, V, first_round, toy_model, toy_pair


def test_cache_follows_commits_exactly():
    d = AdaFuse(toy_pair(), DecodeConfig(tau=0.5)).start("Q")
    for _ in d:
        for s in d.sessions if not d.done else []:
            assert s.cached_ids[: len(s.ids)] == s.ids == s.encode(d.trace.output)
            assert s.cache.get_seq_length() == len(s.cached_ids)


def test_a_shared_prompt_prefix_is_reused_not_reencoded():
    a, _ = toy_pair()
    head = "Q Paris is nice." * 5
    first = LocalSession(a, head + " Paris")
    second = LocalSession(a, head + " London")
    assert first.prefix_reused == 0 and second.prefix_reused == len(a.tokenizer(head).input_ids)
    fresh = LocalSession(toy_model("a", V, A_RULES), head + " London")  # another model object: no reuse
    assert fresh.prefix_reused == 0
    assert torch.allclose(second.next_logprobs, fresh.next_logprobs)
    assert second.tokens_fed == len(second.ids) - second.prefix_reused


def test_decodes_starting_together_prefill_their_shared_prefix_once():
    """Two prompts with a long common head opened at the same moment (an evaluation's or a server's first decodes):
    the second waits for the first's prefill and starts from its KV, instead of both computing the head."""
    a, _ = toy_pair()
    head = "Q Paris is nice." * 5
    barrier = threading.Barrier(2)
    views = {}

    def open_view(name, tail):
        barrier.wait(10)
        views[name] = LocalSession(a, head + tail)

    threads = [threading.Thread(target=open_view, args=(n, t)) for n, t in (("x", " Paris"), ("y", " London"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    reused = sorted(v.prefix_reused for v in views.values())
    assert reused == [0, len(a.tokenizer(head).input_ids)]
    assert a.prefixes.prefilling == []  # nothing left claimed
    fresh = LocalSession(toy_model("a", V, A_RULES), head + " London")
    assert torch.allclose(views["y"].next_logprobs, fresh.next_logprobs)


def test_scoring_keeps_the_kv_of_exactly_its_flagged_rows_each_its_own_positions():
    s = LocalSession(toy_model("a", V, A_RULES), "Q")
    ix = s.lm.tokenizer.index
    rows = [[ix[" Paris"], ix[" is"], ix[" big"]], [ix[" London"]], [ix[" Paris"]], [ix[" London"], ix[" is"]],
            [ix[" big"]]]
    out = s.score_rows(len(s.ids), rows, [True, False, True, True, True])
    assert sorted(s.ahead.kept) == sorted(tuple(r) for i, r in enumerate(rows) if i != 1)
    for i, r in enumerate(rows):
        if i == 1:
            continue
        kv, logprobs = s.ahead.adopt(tuple(r))
        (k, v), = kv  # the toy model's cache holds the token ids themselves: (1, 1, len(r), 1)
        assert k.shape == (1, 1, len(r), 1) and k.flatten().long().tolist() == r and torch.equal(v, k)
        assert torch.equal(logprobs, out[i][-1])
    # a commit of a kept row's text adopts it: no forward, the same state as feeding it
    calls = s.lm.model.calls
    s.commit(" Paris is big")
    assert s.lm.model.calls == calls and s.cached_ids == s.ids
    fresh = LocalSession(toy_model("a", V, A_RULES), "Q Paris is big")
    assert s.ids == fresh.ids and torch.allclose(s.next_logprobs, fresh.next_logprobs)


def test_commit_adopts_kv_already_computed_instead_of_feeding_again():
    d, r = first_round(DecodeConfig(tau=0.7, branches=3))
    loser = next(i for i, c in enumerate(r.candidates) if c.proposers == ["b"] and c.text == " London")
    before = [s.forward_passes for s in d.sessions]
    d.commit(loser)  # b explored " London" (kept from its branch); a scored it with its last token fed
    assert [s.forward_passes for s in d.sessions] == before
    for s, rules in zip(d.sessions, (A_RULES, B_RULES)):
        fresh = LocalSession(toy_model("x", V, rules), "Q" + d.trace.output)
        assert s.ids == fresh.ids and torch.allclose(s.next_logprobs, fresh.next_logprobs)


def test_a_guess_fed_with_a_catch_up_is_taken_kept_through_a_rewind_or_cropped():
    a = toy_model("a", V, A_RULES)
    after_is, after_big = LocalSession(a, "Q Paris is").next_logprobs, LocalSession(a, "Q Paris is big").next_logprobs
    s = LocalSession(a, "Q")
    s.commit(" Paris", guess=" is nice")
    assert s.cached_ids[len(s.ids):] == [a.tokenizer.index[" is"], a.tokenizer.index[" nice"]]
    calls = a.model.calls
    s.rewind()  # a proposer starting over keeps the guess where it is
    lp = s.extend(a.tokenizer.index[" is"])
    assert a.model.calls == calls and s.accepted_tokens == 1
    assert torch.equal(lp, after_is)
    s.extend(a.tokenizer.index[" big"])  # off the guess: " nice" is cropped, " big" fed
    assert a.model.calls == calls + 1
    assert s.cached_ids[len(s.ids):] == [a.tokenizer.index[" is"], a.tokenizer.index[" big"]]
    s.commit(" Paris is big")
    assert torch.equal(s.next_logprobs, after_big)
    # a guess not taken at all is dropped when the proposal ends
    s.commit(" Paris is big.", guess=" London")
    s.settle()
    assert s.cached_ids == s.ids and torch.equal(s.end_logprobs, s.next_logprobs)


def test_a_released_view_holds_no_tensors_and_computes_nothing():
    d = AdaFuse(toy_pair(), DecodeConfig(tau=0.5, branches=3, max_words=1)).start("Q")  # three rounds
    d.step()
    assert not d.done
    s = d.sessions[1]
    kv = weakref.ref(s.cache.layers[0].keys)  # the live cache after the commits (the prefix store keeps the prompt's)
    counters = (s.forward_passes, s.tokens_fed, s.ids, s.text)
    s.release()
    gc.collect()
    assert kv() is None and s.cache.get_seq_length() == 0 and not s.ahead.tensors() and not s.ahead.kept
    assert s.next_logprobs is None and s.ahead.verified is None and s.ahead.drafts is None
    assert (s.forward_passes, s.tokens_fed, s.ids, s.text) == counters
    with pytest.raises(AssertionError, match="released"):
        s.commit(d.trace.output + " big")


@pytest.mark.parametrize("end", ["finished", "cancelled", "failed"])
def test_a_decode_that_ends_lets_go_of_its_views_caches_and_keeps_its_trace(end):
    d = AdaFuse(toy_pair(), DecodeConfig(tau=0.5, branches=3, max_words=1)).start("Q")  # three rounds
    d.step()
    kvs = [weakref.ref(s.cache.layers[0].keys) for s in d.sessions]
    if end == "finished":
        for _ in d:
            pass
    elif end == "cancelled":
        d.cancel()
    else:
        d.sessions[0].extend = lambda token: 1 / 0  # the model fails in the next round's proposals
        with pytest.raises(ZeroDivisionError):
            d.step()
    gc.collect()
    assert d.done and all(s.released for s in d.sessions) and all(kv() is None for kv in kvs)
    assert d.trace.rounds and d.trace.output and d.trace.stop_reason
    assert d.trace.rounds[-1].steps[0].forward_passes >= 0  # the ledger read the counters, which stay


def _decode(models, cfg, park_after=None):
    """The toy decode of "Q" to its end; with `park_after`, every view parks after that many rounds (as an idle view
    does when another decode needs room) and the decode goes on from there."""
    d = AdaFuse(models, cfg).start("Q")
    while not d.done:
        d.step()
        if len(d.trace.rounds) == park_after and not d.done:
            assert all(s.park() for s in d.sessions)
            assert all(s.cache.get_seq_length() == 0 and s.held_bytes() == 0 for s in d.sessions)
    return d


@pytest.mark.parametrize("cfg", [DecodeConfig(tau=0.5, branches=3, max_words=1), DecodeConfig(tau=0.0, max_words=1),
                                 DecodeConfig(tau=0.9, max_words=1, speculate=True)])
def test_a_parked_view_rebuilds_its_cache_and_the_decode_goes_on_unchanged(cfg):
    whole = _decode(toy_pair(), cfg)
    parked = _decode(toy_pair(), cfg, park_after=1)
    assert len(whole.trace.rounds) > 1
    assert parked.trace.output == whole.trace.output
    # the rebuilt caches were fed again (on an empty cache the toy models would have answered otherwise)
    assert sum(s.tokens_fed for s in parked.sessions) > sum(s.tokens_fed for s in whole.sessions)
    assert [(r.text, r.chosen, [c.text for c in r.candidates]) for r in parked.trace.rounds] == \
        [(r.text, r.chosen, [c.text for c in r.candidates]) for r in whole.trace.rounds]


def test_idle_views_past_the_budget_park_least_recently_used_first_never_one_in_a_call():
    a = toy_model("a", V, A_RULES)
    a.prefixes = PrefixStore(size=0)  # nothing shared with the store: each view's bytes are its own
    a.idle = IdleViews(max_bytes=10**9, idle_seconds=0)
    opened = [LocalSession(a, "Q" + " Paris is nice." * k) for k in (1, 2, 3)]
    sizes = [v.held_bytes() for v in opened]
    assert all(sizes) and a.idle.held_bytes() == sum(sizes)
    assert a.idle.trim() == 0  # under the budget: nothing parks
    a.idle.max_bytes = sizes[2]
    opened[0].rewind()  # the oldest view is used again: now the middle one is the least recently used
    in_call, done = threading.Event(), threading.Event()

    def call():  # another thread inside a call of the first view
        with opened[0]._lock:
            in_call.set()
            done.wait(5)
    busy = threading.Thread(target=call)
    busy.start()
    in_call.wait(5)
    assert a.idle.trim() == 1  # the middle view parks; the first is in a call; the newest fits the budget alone
    done.set()
    busy.join()
    assert [v.parked for v in opened] == [False, True, False]
    assert opened[1].next_logprobs is not None and opened[1].held_bytes() == 0
    a.idle.idle_seconds = 60  # views used within the last minute are not idle
    assert a.idle.trim() == 0 and not opened[0].parked
    a.idle.idle_seconds, a.idle.max_bytes = 0, 0
    LocalSession(a, "Q")  # a new view of the model makes room first
    assert all(v.parked for v in opened)
    with pytest.raises(ValueError, match="max_bytes=-1"):
        IdleViews(max_bytes=-1)


@RELAXED
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12), size=st.integers(0, 3),
       max_bytes=st.integers(0, 600))
def test_the_prefix_store_keeps_at_most_size_prompts_in_max_bytes(lengths, size, max_bytes):
    store = PrefixStore(size=size, min_tokens=1, max_bytes=max_bytes)
    per_token = 16  # the toy model's cache: one layer, one float64 key and value per position
    for i, n in enumerate(lengths):
        ids = [i] * n  # each prompt its own: no two share a prefix
        cache = DynamicCache()
        x = torch.zeros(1, 1, n, 1, dtype=torch.float64)
        cache.update(x, x, 0)
        store.store(ids, cache)
        assert len(store.entries) <= size and store.held_bytes() <= max_bytes
        assert store.held_bytes() == per_token * sum(len(e[0]) for e in store.entries)
        # the newest prompt is kept whenever it fits alone, and a lookup then starts from it
        fits = size > 0 and per_token * n <= max_bytes
        assert (bool(store.entries) and store.entries[0][0] == ids) == fits
        assert store.lookup(ids + [99])[1] == (n if fits else 0)


def test_a_prompt_larger_than_the_store_is_decoded_without_being_kept():
    a = toy_model("a", V, A_RULES)
    a.prefixes = PrefixStore(max_bytes=16 * 5)  # five positions of the toy cache
    LocalSession(a, "Q Paris")
    assert [len(e[0]) for e in a.prefixes.entries] == [3]  # <bos> Q " Paris"
    long = LocalSession(a, "Q Paris is nice." * 2)
    assert [len(e[0]) for e in a.prefixes.entries] == [3] and long.prefix_reused == 0
    with pytest.raises(ValueError, match="max_bytes=-1"):
        PrefixStore(max_bytes=-1)


def test_stop_sets_kept_by_a_model_are_bounded_and_recomputed_alike(monkeypatch):
    monkeypatch.setattr(base_module, "STOP_SETS_KEPT", 3)
    a = toy_model("a", V, A_RULES)
    first = a.stop_token_ids(("\n",))
    for stop in (".", " is", " big", "ab"):
        a.stop_token_ids(("\n", stop))
    assert len(a._stop_ids) == 3 and ("\n",) not in a._stop_ids
    assert a.stop_token_ids(("\n",)) == first == {a.tokenizer.index["\n"]}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap, read from /proc")
def test_freed_heap_holes_go_back_to_the_system():
    blocks = [torch.ones(16_000) for _ in range(4000)]  # 64 kB each: inside glibc's heap, not mmapped alone
    del blocks[::2]  # every other one freed: 128 MB of holes between blocks still in use
    before = _rss_bytes()
    assert free_unused_memory()
    assert before - _rss_bytes() > 64 * 2**20
    assert all(b[0] == 1 for b in blocks)  # the blocks still in use are untouched


def test_a_model_name_that_fails_to_load_leaves_nothing_in_the_registry():
    def fail(*a, **kw):
        raise ModelNotFoundError("no such model")
    reg = ModelRegistry(loader=fail)
    for i in range(5):
        with pytest.raises(ModelNotFoundError):
            reg.get(f"no-such/model-{i}", device="cpu")
    assert not reg._locks and not reg._models


def test_kv_cache_matches_a_fresh_forward(pair):
    _kv_cache_matches_a_fresh_forward(pair, "The three largest cities of Japan are")


def test_kv_cache_matches_a_fresh_forward_far_past_the_sliding_window(tiny_bundled):
    """A GSM8K prompt of ~1,000 tokens on the bundled architectures with tiny weights (Gemma 3's window cut to 16
    tokens): the cache each view keeps gives a fresh forward's numbers after 8 rounds."""
    _kv_cache_matches_a_fresh_forward(tiny_bundled, gsm8k_prompt(1, shots=2))


def _kv_cache_matches_a_fresh_forward(pair, text: str) -> None:
    d = AdaFuse(pair, DecodeConfig(max_new_words=100, tau=0.6)).start(text)
    for _ in range(8):
        d.step()
    assert not d.done
    for s in d.sessions:
        ids = s.encode(d.trace.output)
        assert s.ids == ids
        with torch.inference_mode():
            fresh = torch.log_softmax(s.lm.model(torch.tensor([ids], device=s.lm.device)).logits[0, -1].float(), -1)
        assert (fresh - s.next_logprobs).abs().max().item() < tolerance(s.lm.dtype), s.lm.name


def test_text_is_appended_byte_for_byte_without_clean_up(pair):
    sm = LocalSession(pair[0], "Say:")
    for text in ("Hello .", "it 's", "a , b ?"):
        ids = sm.lm.tokenizer(text, add_special_tokens=False).input_ids
        assert sm.lm.decode(ids) == text
        head, tail = ids[:1], ids[1:]
        assert sm.lm.decode(head) + sm.decode_after(head, tail) == text




@RELAXED
@given(text=TEXTS, cuts=st.lists(st.integers(1, 8), min_size=1, max_size=12))
def test_tokenizing_from_the_anchor_equals_the_full_tokenization_one_text_or_many(views, text, cuts, monkeypatch):
    monkeypatch.setattr(session_module, "ANCHOR_EVERY", 3)  # move the anchor often
    for s in views:
        s.text, s.anchor_char, s.anchor_tok = "", 0, 0
        s.ids = s._full("")
        y = ""
        for n in cuts + [len(text)]:
            if len(y) >= len(text):
                break
            y = text[: len(y) + n]
            assert s.encode(y) == s._full(y), (s.name, y, s.anchor_char)
            if s.text:  # a round's candidates after the committed text, tokenized in one call
                ahead = [y, y + " the", s.text + text[len(s.text): len(s.text) + 2], text, s.text[:-1]]
                assert s.encode_many(ahead) == [s._full(c) for c in ahead], (s.name, ahead, s.anchor_char)
            s.ids, s.text = s._full(y), y
            s._move_anchor()
        # long texts: the anchor does move
        if len(s.ids) > 40 and len(y.split()) > 6:
            assert s.anchor_tok > 0


@pytest.fixture(scope="module")
def smol(pair):
    return pair[0]  # SmolLM2-135M-Instruct: a chat template with a default system message


def test_a_session_records_the_prompt_it_was_given(smol):
    s = LocalSession(smol, "What is 2+2?", "chat", (), system="Answer with one number.")
    assert s.mode_used == "chat (system)" and "Answer with one number." in s.prefix_text


def test_what_the_word_builder_and_the_selection_keep_of_a_view_are_fields_of_the_view():
    """A view's token-index tensors (`writer.token_index`) and its selection counters are fields every `ModelView`
    declares, not attributes written onto it from outside; the cost ledger reads every counter as a field."""
    from adafuse.costs import COUNTERS, snapshot
    from adafuse.writer import token_index
    d = AdaFuse(toy_pair(), DecodeConfig(tau=0.5, max_words=1)).start("Q")
    s = d.sessions[1]
    assert (s.selections_made, s.selection_seconds) == (0, 0.0) and all(hasattr(s, k) for k in COUNTERS)
    ends = token_index(s, "end_ids")
    assert s.token_indexes["end_ids"] is ends and token_index(s, "end_ids") is ends
    assert sorted(ends.tolist()) == sorted(s.end_ids) and "_index_cache" not in vars(s)
    d.step()  # b is unsure: it explores, and the selection counts on its own fields
    assert s.selections_made == 1 and len(snapshot(s)) == 4 + len(COUNTERS)


def test_decode_after_decodes_the_context_once_for_a_rounds_candidates(monkeypatch):
    """A round's candidates all follow the same context: its anchor text is decoded once, each candidate once, and
    the texts are those of decoding the context with and without the candidate."""
    a, _ = toy_pair()
    view = a.open_view("Q")
    context = view.encode(" Paris is")
    tokens = view.encode(" Paris is nice. big")[len(context):]
    want = [a.decode(context + [t])[len(a.decode(context)):] for t in tokens]  # the toy's tokens never merge
    calls = []
    decode = type(a).decode
    monkeypatch.setattr(type(a), "decode", lambda self, ids: calls.append(list(ids)) or decode(self, ids))
    assert [view.decode_after(context, [t]) for t in tokens] == want == [" nice", ".", " big"]
    assert len(calls) == len(tokens) + 1


def test_a_fast_tokenizers_backend_decodes_as_its_wrapper_does(pair):
    """`LoadedModel.decode` calls the Rust backend directly where the wrapper adds nothing: the same text for every
    token alone and after others, special tokens and odd bytes included, on both bundled tokenizers."""
    import random
    from adafuse.models.base import backend_decoder
    rng = random.Random(0)
    for lm in pair:
        tok = lm.tokenizer
        assert backend_decoder(tok) is not None, type(tok)  # the bundled pair takes the direct path
        n = len(tok)
        rows = [[t] for t in range(0, n, 97)] + [sorted(lm.end_ids) + [5, 6]]
        rows += [[rng.randrange(n) for _ in range(rng.randint(1, 12))] for _ in range(300)]
        rows += [tok("Hello .  it 's  über 東京 🙂\n\n", add_special_tokens=False).input_ids]
        for ids in rows:
            assert lm.decode(ids) == tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False), ids
    # a class with its own decoding, or a tokenizer that is not a fast one: its own `decode` runs
    own = type("Own", (type(pair[0].tokenizer),), {"_decode": lambda self, ids, **kw: "mine"})
    assert backend_decoder(own.__new__(own)) is None and backend_decoder(object()) is None
