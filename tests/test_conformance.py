"""The packed forward against each family's own forward (adafuse/models/packed.py, families.py): tiny random-weight
models of the decoder families people pick (tests/families.py), with each attention implementation the family has on
a CPU, in every packed mode ("auto" deciding as it does on a GPU), in every situation a decode puts it in — a prefill
past the sliding window, single cached tokens, requests with different pasts feeding different numbers of tokens,
exploration rows, a context past the window. Each request's log-probs equal its own unbatched forward within 1e-4
(float32), its cache holds what its own forward leaves, and the model called directly after the switch computes as
before it. A family the packed forward is not checked on runs its requests one by one, and says so."""
import copy
import os

import pytest
import torch
from transformers import DynamicCache

from adafuse.models import families, packed
from adafuse.models.batching import Batcher, Request
from adafuse.models.packed import packed_forward, use_packed_attention
from tests.families import FAMILIES, VOCAB, WINDOW, tiny

TOLERANCE = 1e-4
# where the models compute: bench/gpu_check.sh runs this file with ADAFUSE_CONFORMANCE_DEVICE=cuda
DEVICE = os.environ.get("ADAFUSE_CONFORMANCE_DEVICE", "cpu")
MODES = ("loop", "rows", "one", "auto")
# the implementations each family has on a CPU (gpt-oss: eager only, its sinks have no SDPA path)
IMPLEMENTATIONS = {f: ("eager",) if f == "gpt_oss" else ("sdpa", "eager") for f in FAMILIES}
CASES = [(f, a) for f in FAMILIES for a in IMPLEMENTATIONS[f]]


def _ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


# (past tokens, rows fed, keep): one decode's forward each
MIXED = [
    ([], [_ids(2 * WINDOW - 1, 1)], None),             # a prefill longer than the window, nothing cached
    (_ids(6, 2), [_ids(1, 3)], None),                  # one cached token after six
    (_ids(5, 4), [_ids(2, 5), _ids(2, 6), _ids(2, 7)], None),  # exploration rows after a shared context
    (_ids(3 * WINDOW - 3, 8), [_ids(2, 9)], 1),        # a context past the window, the last position kept
    (_ids(2, 10), [_ids(3, 11)], 2),                   # three tokens after two
]
# two requests feeding one token and two feeding three, all with 5 keys: the same key lengths in each group (the
# "rows" mask of the first group must not serve the second)
SAME_KEYS = [(_ids(4, 12), [_ids(1, 13)], None), (_ids(4, 14), [_ids(1, 15)], None),
             (_ids(2, 16), [_ids(3, 17)], None), (_ids(2, 18), [_ids(3, 19)], None)]


def _t(ids) -> torch.Tensor:
    return torch.tensor(ids, device=DEVICE)


def _prefilled(model, past: list[int], rows: int) -> DynamicCache:
    cache = DynamicCache()
    if past:
        with torch.inference_mode():
            model(input_ids=_t([past]), past_key_values=cache, use_cache=True)
        if rows > 1:
            cache.batch_repeat_interleave(rows)
    return cache


def _own(reference, cases):
    """Each case through the model's own forward alone: (log-probs of the kept positions, the cache it leaves)."""
    out = []
    for past, rows, keep in cases:
        cache = _prefilled(reference, past, len(rows))
        with torch.inference_mode():
            logits = reference(input_ids=_t(rows), past_key_values=cache, use_cache=True).logits
        out.append((torch.log_softmax(logits.float(), -1)[:, -(keep or len(rows[0])):], cache))
    return out


def _packed(model, reference, cases, mode):
    reqs = [Request(rows, _prefilled(reference, past, len(rows)), keep) for past, rows, keep in cases]
    with torch.inference_mode():
        return reqs, packed_forward(model, reqs, mode)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: a team of CPU threads per product costs more than the product (and competes with the other
    test worker for the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def as_on_a_gpu(monkeypatch):
    """"auto" decides as it does where a kernel launch costs more than a small call's arithmetic."""
    monkeypatch.setattr(packed, "launches_cost_more", lambda device: True)


def _check(outs, reqs, wanted, label):
    for i, (out, r, (want, cache)) in enumerate(zip(outs, reqs, wanted)):
        assert out.shape == want.shape, (label, i)
        err = (out - want).abs().max().item()
        assert err <= TOLERANCE, f"{label}, request {i}: max difference {err:.2e}"
        assert r.cache.get_seq_length() == cache.get_seq_length()
        for mine, own in zip(r.cache.layers, cache.layers):
            assert torch.allclose(mine.keys, own.keys, atol=TOLERANCE) and torch.allclose(mine.values, own.values,
                                                                                           atol=TOLERANCE)


@pytest.mark.parametrize("family,attention", CASES)
def test_packed_log_probs_are_each_familys_own(family, attention, as_on_a_gpu):
    """Every packed mode ("auto" as on a GPU), each situation, against the model's own forward; then the model called
    directly after the switch, whole and after a cache, as before it."""
    model = tiny(family, attention, device=DEVICE)
    reference = copy.deepcopy(model)  # its own attention, never switched
    assert families.packing_refused(model) is None and use_packed_attention(model)
    for name, cases in (("mixed", MIXED), ("same key lengths", SAME_KEYS)):
        wanted = _own(reference, cases)
        for mode in MODES:
            reqs, outs = _packed(model, reference, cases, mode)
            _check(outs, reqs, wanted, f"{family}/{attention}/{mode}, {name}")
    x = _t([_ids(2 * WINDOW + 1, 20)])
    with torch.inference_mode():
        assert torch.allclose(model(input_ids=x).logits, reference(input_ids=x).logits, atol=TOLERANCE)
        mine, own = DynamicCache(), DynamicCache()
        model(input_ids=x[:, :5], past_key_values=mine, use_cache=True)
        reference(input_ids=x[:, :5], past_key_values=own, use_cache=True)
        assert torch.allclose(model(input_ids=x[:, 5:], past_key_values=mine, use_cache=True).logits,
                              reference(input_ids=x[:, 5:], past_key_values=own, use_cache=True).logits,
                              atol=TOLERANCE)


# ---- the three ways the packed forward once gave numbers that were not the model's (each failed on 8b10e24) ----
def _max_error(model, reference, cases, mode) -> float:
    reqs, outs = _packed(model, reference, cases, mode)
    return max((out - want).abs().max().item() for out, (want, _) in zip(outs, _own(reference, cases)))


def test_the_rows_call_keeps_causality_where_two_groups_have_the_same_key_lengths():
    """Requests feeding one token and requests feeding three, each with 5 keys: the rows mask made for the first group
    was served to the second from a cache keyed by the key lengths alone (4.8e-2 off on a tiny Llama)."""
    model = tiny("llama", device=DEVICE)
    reference = copy.deepcopy(model)
    use_packed_attention(model)
    assert _max_error(model, reference, SAME_KEYS, "rows") <= TOLERANCE


def test_a_prefill_with_eager_attention_is_causal_in_the_loop():
    """Eager attention has no causal rule of its own: a prefill (nothing cached, several tokens) given no mask
    attended both ways (0.30 off on a tiny eager Llama)."""
    model = tiny("llama", "eager", device=DEVICE)
    reference = copy.deepcopy(model)
    use_packed_attention(model)
    assert _max_error(model, reference, [([], [_ids(6, 40)], None)], "loop") <= TOLERANCE


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_an_eager_model_keeps_its_own_attention_function_inside_the_packing(family):
    """Gemma 2's softcapping and gpt-oss's attention sinks live in their own eager functions: Llama's, run in their
    place, dropped them (0.17 and 0.13 off), in packed forwards and in direct calls after the switch alike."""
    model = tiny(family, "eager", device=DEVICE)
    reference = copy.deepcopy(model)
    use_packed_attention(model)
    one_token = [(_ids(5, 41), [_ids(1, 42)], None), (_ids(3, 43), [_ids(1, 44)], None)]
    assert _max_error(model, reference, one_token, "loop") <= TOLERANCE
    x = _t([_ids(6, 45)])
    with torch.inference_mode():
        assert torch.allclose(model(input_ids=x).logits, reference(input_ids=x).logits, atol=TOLERANCE)


def test_auto_on_a_gpu_runs_the_rows_call_on_requests_with_the_same_key_lengths(as_on_a_gpu):
    """The "same key lengths" situation is the one "auto" sends to the rows call on a GPU (the case where its mask
    cache once handed one group's mask to the other)."""
    model = tiny("llama", device=DEVICE)
    reference = copy.deepcopy(model)
    use_packed_attention(model)
    calls = []
    hook = model.model.layers[0].self_attn.register_forward_hook(
        lambda _m, _a, kwargs, _o: calls.append(kwargs[packed.RUN].calls), with_kwargs=True)
    _packed(model, reference, SAME_KEYS, "auto")
    hook.remove()
    assert calls == [2]  # the rows call, once per length fed (1 and 3)


def test_a_long_prompt_after_a_cache_attends_in_chunks_with_the_same_numbers(monkeypatch):
    """A request whose mask would pass MASK_CELLS attends in chunks of queries: no mask larger than the bound is made,
    and the numbers are the model's own (sliding and full layers, eager's additive masks too)."""
    monkeypatch.setattr(packed, "MASK_CELLS", 64)
    for attention in ("sdpa", "eager"):
        model = tiny("gemma3", attention, device=DEVICE)
        reference = copy.deepcopy(model)
        use_packed_attention(model)
        cases = [(_ids(7, 30), [_ids(21, 31)], None)]
        made = []
        real_mask = packed._Segment.mask

        def mask(self, *args, **kwargs):
            m = real_mask(self, *args, **kwargs)
            made.append(0 if m is None else m.numel())
            return m
        monkeypatch.setattr(packed._Segment, "mask", mask)
        reqs, outs = _packed(model, reference, cases, "loop")
        monkeypatch.setattr(packed._Segment, "mask", real_mask)
        _check(outs, reqs, _own(reference, cases), f"gemma3/{attention}, chunked")
        assert made and max(made) <= 64 and len(made) > 2 * 2  # several chunks per layer


def _served_by(model) -> list[torch.Tensor]:
    """Every MIXED case through a Batcher, all queued at once (one forward when the model packs)."""
    reference = copy.deepcopy(model)
    batcher = Batcher(model)
    reqs = [Request(rows, _prefilled(reference, past, len(rows)), keep) for past, rows, keep in MIXED]
    batcher._run(reqs)
    assert all(r.error is None for r in reqs)
    return reqs, _own(reference, MIXED), batcher


def test_a_model_the_packed_forward_is_not_checked_on_runs_each_request_through_its_own_forward():
    """A family outside the checked ones (GPT-NeoX): its attention is left as it is, each request runs alone through
    the model's own forward, and the reason is given. A kernel that takes no per-request masks (FlexAttention, slow
    to compile on a CPU: only the decision is checked here) is left as it is too."""
    import transformers
    cfg = transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, max_position_embeddings=256)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(cfg).eval()
    assert "gpt_neox" in families.packing_refused(model)
    reqs, wanted, batcher = _served_by(model)
    assert not batcher.packed and model.config._attn_implementation == "sdpa"
    _check([r.logprobs for r in reqs], reqs, wanted, "gpt_neox one by one")
    flex = tiny("llama", "flex_attention")
    assert "flex_attention" in families.packing_refused(flex)
    assert not use_packed_attention(flex) and flex.config._attn_implementation == "flex_attention"


def test_a_model_that_does_not_pack_says_so_in_the_loaded_models_table_and_the_trace():
    from adafuse import AdaFuse, DecodeConfig
    from adafuse.models.local import LocalModel
    tok = _tokenizer()  # a real tokenizer (SmolLM2's), tiny random models
    import transformers
    cfg = transformers.GPTNeoXConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, max_position_embeddings=256)
    torch.manual_seed(0)
    neox = LocalModel.from_objects("tiny-neox", transformers.GPTNeoXForCausalLM(cfg).eval(), tok)
    llama = LocalModel.from_objects("tiny-llama", _tiny_llama(len(tok)), tok)
    note = neox.info()["notes"]
    assert "one by one" in note and "gpt_neox" in note, note
    assert "one by one" not in llama.info()["notes"]
    trace = AdaFuse([neox, llama], DecodeConfig(max_new_words=2)).generate("The cat")
    assert "one by one" in trace.devices["tiny-neox"] and "one by one" not in trace.devices["tiny-llama"]


def _tokenizer():
    from adafuse.models.local import bundled_folder
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(bundled_folder("smollm2-135m-instruct"))
    except Exception as exc:  # noqa: BLE001 - the converted bundled model is not here
        pytest.skip(f"SmolLM2's tokenizer is not converted here: {exc}")


def _tiny_llama(vocab: int):
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(1)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_the_checked_families_are_the_catalogs():
    """Every family the catalog lets pack is checked above (gemma3_text is Gemma 3's text-only model type)."""
    from adafuse.models.catalog import PACKED_EXACT_FAMILIES
    assert PACKED_EXACT_FAMILIES - {"gemma3_text"} == set(FAMILIES)


@pytest.mark.models  # loads from folders through from_pretrained, as a user's model is (tiny weights)
@pytest.mark.parametrize("mode", ["loop", "rows", "one"])
def test_families_loaded_from_folders_decode_six_at_a_time_as_each_does_alone(tmp_path, mode):
    """As a user picks them: tiny Gemma 2 and gpt-oss models (softcapping, sinks) saved as folders with
    SmolLM2's tokenizer, loaded by path; six AdaFuse decodes at once give the traces each gives alone, in every
    packed mode."""
    from adafuse import AdaFuse, DecodeConfig
    from adafuse.models.local import load_model
    tok = _tokenizer()
    folders = []
    for family in ("gemma2", "gpt_oss"):
        model = _with_vocab(family, len(tok))
        folder = tmp_path / family
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        folders.append(str(folder))
    models = [load_model(f, "cpu", cpu_kernels=False) for f in folders]
    for lm in models:
        assert not lm.forwards  # packs (gpt-oss with its eager attention, Gemma 2 with what loading picked)
        lm.runtime.attention = mode
    cfg = DecodeConfig(branches=2, max_new_words=4, max_word_tokens=3)
    prompts = ["The cat", "Question: Who wrote Hamlet?\nAnswer:", "1, 2, 3,", "Paris is", "Hello", "A B C"]
    fuser = AdaFuse(models, cfg)
    alone = [fuser.generate(p) for p in prompts]
    many = fuser.generate_many(prompts, concurrency=6)
    assert [[(r.text, r.chosen) for r in t.rounds] for t in many] == [[(r.text, r.chosen) for r in t.rounds]
                                                                      for t in alone]
    assert max(lm.batcher.peak_requests for lm in models) > 1  # the decodes did share forwards
    # and the numbers are each model's own: the switched model against a fresh load of its folder
    from transformers import AutoModelForCausalLM
    for lm, folder in zip(models, folders):
        own = AutoModelForCausalLM.from_pretrained(folder).eval()
        ids = torch.tensor([tok(prompts[1] + many[1].output).input_ids])
        with torch.inference_mode():
            assert torch.allclose(lm.model(input_ids=ids).logits, own(input_ids=ids).logits, atol=TOLERANCE)


def _with_vocab(family: str, vocab: int):
    import tests.families as fam
    config_name, model_name, extra = fam.FAMILIES[family]
    import transformers
    cfg = getattr(transformers, config_name)(**{**fam._COMMON, **extra, "vocab_size": vocab})
    cfg._attn_implementation = "eager"
    torch.manual_seed(3)
    model = getattr(transformers, model_name)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return model
