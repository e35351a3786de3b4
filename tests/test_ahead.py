"""What a view holds ahead of its committed ids (adafuse/models/ahead.py): a guess, pending and verified drafts,
kept KV, behind one object; each offered, taken, adopted and dropped by its rule."""
import pytest
import torch
from transformers import DynamicCache

from adafuse.models.ahead import Ahead, Drafts, rows_kv

V = 5


def side_cache(rows: int, positions: int) -> DynamicCache:
    cache = DynamicCache()
    keys = torch.arange(rows * positions, dtype=torch.float32).reshape(rows, 1, positions, 1)  # (N, heads, T, dim)
    cache.update(keys, -keys, 0)
    return cache


def verifier(calls: list):
    """A stand-in for the view's verifying forward: drafts after 3 committed positions, log-probs numbered."""
    def verify(rows):
        calls.append(rows)
        width = max(len(r) for r in rows)
        logprobs = torch.arange(len(rows) * width * V, dtype=torch.float32).reshape(len(rows), width, V)  # (N, T, V)
        return Drafts(rows, logprobs, side_cache(len(rows), 3 + width), 3)
    return verify


def test_pending_drafts_are_verified_once_by_the_first_token_of_their_span_then_taken_row_by_row():
    ahead, calls = Ahead(), []
    ahead.offer_drafts([[1, 2, 3], [1, 4]])
    got = ahead.take(1, verifier(calls))
    assert calls == [[[1, 2, 3], [1, 4]]] and torch.equal(got, ahead.drafts.logprobs[0, 0])
    assert torch.equal(ahead.take(4, verifier(calls)), ahead.drafts.logprobs[1, 1])  # the second row continues
    assert ahead.take(9, verifier(calls)) is None and len(calls) == 1 and ahead.taking
    guess, kv, taken = ahead.settle()
    assert guess is None and taken == [1, 4] and not ahead.taking
    (k, v), = kv  # row 1 holds 6..11 at positions 0..5: its positions 3 and 4, after the 3 committed
    assert k.flatten().tolist() == [9, 10] and torch.equal(v, -k)


def test_drafts_whose_span_starts_otherwise_verify_nothing():
    ahead, calls = Ahead(), []
    ahead.offer_drafts([[1, 2]])
    assert ahead.take(2, verifier(calls)) is None and calls == [] and not ahead.pending
    assert ahead.settle() == (None, [], [])


def test_a_guess_is_taken_while_it_matches_and_rewinding_untakes_it():
    ahead = Ahead()
    logprobs = torch.randn(2, V)
    ahead.offer_guess([7, 8], logprobs)
    assert not ahead.taking
    assert torch.equal(ahead.take(7, verifier([])), logprobs[0]) and ahead.taking
    assert torch.equal(ahead.rewind(), logprobs[-1]) and ahead.guess.taken == 0 and not ahead.taking
    ahead.take(7, verifier([]))
    assert ahead.take(9, verifier([])) is None
    guess, kv, taken = ahead.settle()
    assert guess.taken == 1 and (kv, taken) == ([], []) and ahead.guess is None


def test_drafts_cannot_be_offered_over_a_guess():
    ahead = Ahead()
    ahead.offer_guess([7], torch.zeros(1, V))
    with pytest.raises(AssertionError):
        ahead.offer_drafts([[1, 2]])


def test_kept_kv_is_adopted_by_its_exact_tokens_and_dropped_with_the_rest():
    ahead, cache = Ahead(), side_cache(2, 5)
    kv = rows_kv(cache, [1], 3, 5)
    ahead.offer_kv([4, 5], kv, torch.ones(V))
    assert ahead.adopt((4, 5))[0] is kv and ahead.adopt((4,)) is None
    assert len(ahead.tensors()) == 2
    ahead.drop()
    assert ahead.adopt((4, 5)) is None and ahead.tensors() == []


def test_rewinding_drops_drafts_and_what_was_taken_from_them():
    ahead = Ahead()
    ahead.offer_drafts([[1, 2]])
    ahead.take(1, verifier([]))
    assert ahead.rewind() is None and ahead.drafts is None and not ahead.taking
    assert ahead.settle() == (None, [], [])
    assert ahead.verified is not None  # scoring still reads the verified rows until the next commit


def test_scoring_reads_the_last_verified_rows_by_prefix_until_the_ids_move():
    ahead = Ahead()
    ahead.offer_drafts([[1, 2, 3]])
    ahead.take(1, verifier([]))
    ahead.settle()  # the drafts end, the verified rows stay readable
    v, row, logprobs = ahead.verified_rows(3, [1, 2])
    assert row == 0 and torch.equal(logprobs, v.logprobs[0, :2])
    assert ahead.verified_rows(4, [1, 2]) is None and ahead.verified_rows(3, [2]) is None


def test_several_rows_kv_is_one_copy_per_layer_holding_each_row_in_order():
    cache = side_cache(3, 6)  # rows 0..2 hold 0-5, 6-11, 12-17
    (k, v), = rows_kv(cache, [2, 0], 3, 5)
    assert k.shape == (2, 1, 2, 1) and k.flatten().tolist() == [15, 16, 3, 4] and torch.equal(v, -k)
    cache.layers[0].keys.zero_()
    assert k.flatten().tolist() == [15, 16, 3, 4]  # a copy, not a view of the side cache
