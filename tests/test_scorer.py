"""The ensemble as a scorer (adafuse/scorer.py) on toy models with hand-computed log-likelihoods: each model in its own
tokens with the boundary where lm-eval's `hf` model puts it, the fused weighted mean, rolling windows, and the lm-eval
model's loglikelihood / loglikelihood_rolling; then one member against lm-eval's own `hf` model (HFLM) on tiny
random-weight Llamas with tokenizers trained here (no download), the memory rolling scoring keeps, and is_greedy
decoded only when read."""
from __future__ import annotations

import math

import pytest

import copy

from adafuse import AdaFuse, DecodeConfig
from adafuse.errors import ConfigError, PromptError
from adafuse.models import LocalModel
from adafuse.scorer import rolling_windows, split
from tests.toy import toy_model, toy_pair

pytestmark = pytest.mark.unit

# a spells " Paris" as one token; b as " P" + "aris", and reads "Q:" as one token
A = toy_model("a", ["Q", ":", " Paris", " London", " P", "aris"],
              {":": {" Paris": 0.6, " London": 0.3}, " Paris": {"<eos>": 0.9}})
B = toy_model("b", ["Q:", "Q", ":", " P", "aris", " London"],
              {"Q:": {" P": 0.5, " London": 0.4}, " P": {"aris": 0.8}, "aris": {"<eos>": 0.7}})
# c merges the context's last character with the continuation's first: ": P" is one of its tokens
C = toy_model("c", ["Q", ": P", ":", "aris", " Paris"], {":": {"aris": 0.1, " Paris": 0.2}})
L = math.log


def test_each_model_scores_the_continuation_in_its_own_tokens():
    assert split(A, "Q:", " Paris") == ([0, 2, 3], [4])           # <bos> Q : | " Paris"
    assert split(B, "Q:", " Paris") == ([0, 2], [5, 6])           # <bos> "Q:" | " P" "aris"
    paris, london = AdaFuse([A, B]).score("Q:", [" Paris", " London"])
    assert paris.logprob == pytest.approx({"a": L(0.6), "b": L(0.5) + L(0.8)})
    assert paris.tokens == {"a": 1, "b": 2} and paris.bytes == 6
    assert paris.fused == pytest.approx((L(0.6) + L(0.5) + L(0.8)) / 2)
    assert london.logprob == pytest.approx({"a": L(0.3), "b": L(0.4)})
    assert paris.greedy == {"a": True, "b": True} and london.greedy == {"a": False, "b": False}


def test_weights_fuse_the_log_likelihoods_as_they_fuse_a_decodes_scores():
    (paris,) = AdaFuse([A, B], DecodeConfig(weights=(3, 1))).score("Q:", [" Paris"])
    assert paris.fused == pytest.approx((3 * L(0.6) + (L(0.5) + L(0.8))) / 4)


def test_trailing_whitespace_of_the_context_moves_to_the_continuation():
    assert split(A, "Q: ", "Paris") == split(A, "Q:", " Paris")
    (moved,) = AdaFuse([A, B]).score("Q: ", ["Paris"])
    assert moved.logprob == pytest.approx({"a": L(0.6), "b": L(0.5) + L(0.8)})


def test_a_merged_boundary_keeps_the_contexts_tokens_as_lm_evals_hf_model_does():
    """c reads "Q: Paris" as Q, ": P", aris: the context alone is Q, ":" (3 tokens with BOS), so the continuation is
    the whole text's tokens after 3 — "aris" only, scored after "Q:" (hf scores the same tokens)."""
    assert split(C, "Q:", " Paris") == ([0, 2, 4], [5])
    (s,) = AdaFuse([A, C]).score("Q:", [" Paris"])
    assert s.logprob["c"] == pytest.approx(L(0.1)) and s.tokens["c"] == 1


def test_an_empty_context_is_the_models_bos_token():
    assert split(A, "", "Q:") == ([0], [2, 3])  # the continuation's own BOS is the context
    (s,) = AdaFuse([A, B]).score("", ["Q:"])
    assert s.tokens == {"a": 2, "b": 1}


def test_the_fused_decode_says_which_continuation_is_greedy():
    a, b = toy_pair()
    paris, london = AdaFuse([a, b]).score("Q", [" Paris", " London"], is_greedy=True)
    out = AdaFuse([a, b], max_new_words=1).generate("Q").output
    assert (paris.is_greedy, london.is_greedy) == (out.startswith(" Paris"), out.startswith(" London"))
    assert paris.is_greedy != london.is_greedy


def test_rolling_scores_every_token_from_the_start_in_windows_as_lm_eval_rolls_them():
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    for n in range(1, 12):
        for size in (1, 2, 3, 5, 16):
            tokens = list(range(100, 100 + n))
            ours = rolling_windows(tokens, 7, size)
            theirs = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, 7, size, 1)]
            assert ours == [tuple(w) for w in theirs] or ours == theirs, (n, size)
    a = toy_model("a", ["Q", ":", " Paris", " London"], {":": {" Paris": 0.6}, " Paris": {":": 0.5}})
    text = "Q: Paris: Paris"  # <bos> Q : " Paris" : " Paris"
    whole = AdaFuse([a], method="greedy").score_rolling(text)
    # each token after everything before it (one window): p(<bos>|<bos>), p(Q|<bos>) ... from the toy's tables
    rest = 1 / len(a.tokenizer)  # no rule for the context: every token equally likely
    expected = [rest, rest, rest, 0.6, 0.5, 0.6]
    assert whole.logprob["a"] == pytest.approx(sum(map(L, expected))) and whole.tokens["a"] == 6


def test_a_text_longer_than_the_window_rolls_over_windows():
    a = toy_model("a", ["Q", ":", " Paris"], {":": {" Paris": 0.6}}, max_positions=3)
    whole = AdaFuse([a], method="greedy").score_rolling("Q: Paris: Paris: Paris")
    assert whole.tokens["a"] == 8  # <bos> and 7 more, every one predicted once


def test_a_continuation_that_does_not_fit_the_window_is_a_typed_error():
    a = toy_model("a", ["Q", ":", " Paris"], {}, max_positions=2)
    with pytest.raises(PromptError, match="score it rolling"):
        AdaFuse([a], method="greedy").score("Q", [": Paris: Paris"])


def test_lm_evals_loglikelihood_requests_get_the_fused_scores():
    from lm_eval.api.instance import Instance
    from adafuse.harness.lm_eval_model import AdaFuseLM
    reqs = [Instance("loglikelihood", {}, ("Q:", c), i) for i, c in enumerate([" Paris", " London"])]
    fused = AdaFuseLM(models=[A, B], concurrency=2).loglikelihood(reqs, disable_tqdm=True)
    assert [f for f, _ in fused] == pytest.approx([(L(0.6) + L(0.5) + L(0.8)) / 2, (L(0.3) + L(0.4)) / 2])
    alone = AdaFuseLM(models=[A], method="greedy").loglikelihood(reqs, disable_tqdm=True)
    assert alone == [(pytest.approx(L(0.6)), True), (pytest.approx(L(0.3)), False)]
    rolled = AdaFuseLM(models=[A], method="greedy").loglikelihood_rolling(
        [Instance("loglikelihood_rolling", {}, ("Q: Paris",), 0)], disable_tqdm=True)
    assert rolled == [pytest.approx(AdaFuse([A], method="greedy").score_rolling("Q: Paris").logprob["a"])]


def test_a_continuation_a_model_merges_into_the_context_entirely_scores_zero_for_that_model():
    """c reads "Q: P" as Q, ": P": after the context's 3 tokens nothing is left to score — the empty sum, 0, and
    greedy, as hf's formula gives (hf itself stops at an assert there; the run goes on here)."""
    (s,) = AdaFuse([A, C]).score("Q:", [" P"])
    assert s.logprob["c"] == 0.0 and s.tokens["c"] == 0 and s.greedy["c"]
    assert s.fused == pytest.approx((s.logprob["a"] + 0.0) / 2)


def test_a_learned_gate_weighs_the_models_log_likelihoods(tmp_path):
    """A gate leaning on b (bias 3: b weighs e³ times a) fuses with those weights, as it does a decode's scores."""
    from adafuse.gate import Gate
    g = Gate.zeros(["a", "b"])
    g.b = [0.0, 3.0]
    g.save(tmp_path / "gate.json")
    (paris,) = AdaFuse([A, B], DecodeConfig(gate=str(tmp_path / "gate.json"), normalize="token")).score("Q:", [" Paris"])
    wa, wb = paris.weights["a"], paris.weights["b"]
    assert wb / wa == pytest.approx(math.e ** 3, rel=1e-6)
    assert paris.fused == pytest.approx((wa * L(0.6) + wb * (L(0.5) + L(0.8))) / (wa + wb))
    g.W[1][3] = 5.0  # b's weight rises with its own NLL: read per answer, an answer b dislikes would win b over
    g.save(tmp_path / "gate.json")
    both = AdaFuse([A, B], DecodeConfig(gate=str(tmp_path / "gate.json"), normalize="token")).score("Q:", [" Paris", " London"])
    assert both[0].weights == both[1].weights  # one set of weights for every answer of a context


def test_each_continuation_is_truncated_to_the_window_on_its_own_as_hf_does():
    """A window of 5: "Q: Paris" keeps 4 context tokens before its 1, a 2-token continuation only 3."""
    from adafuse.scorer import fitted
    a = toy_model("a", ["Q", ":", " Paris", " P", "aris"], {}, max_positions=5)
    ctx, _ = split(a, "Q:Q:Q:", " Paris")  # <bos> Q : Q : Q :
    assert fitted(a, ctx, [4], " Paris")[0] == ctx[-5:] and fitted(a, ctx, [5, 6], " P aris")[0] == ctx[-4:]
    one, two = AdaFuse([a], method="greedy").score("Q:Q:Q:", [" Paris", " Paris Paris"])
    assert one.tokens["a"] == 1 and two.tokens["a"] == 2


def test_is_greedy_needs_the_whole_word_and_decodes_the_raw_text():
    from tests.toy_tasks import toy_qa_pair
    paris, pari = AdaFuse(list(toy_qa_pair()), mode="chat").score("Answer:", [" Paris", " Pari"], is_greedy=True)
    assert paris.is_greedy and pari.is_greedy is False  # " Pari" begins " Paris" but is not its word


def test_a_context_of_whitespace_only_is_the_models_first_token():
    """A tokenizer that adds no BOS reads "  " as no token (hf asserts there): the context is its EOS, as empty."""
    from adafuse.models import LocalModel
    from tests.toy import ToyLM, ToyTokenizer
    tok = ToyTokenizer(["Q", ":", " ", "Q:"], bos=None)
    lm = LocalModel.from_objects("nobos", ToyLM(tok, {"<eos>": {"Q": 0.5}}), tok)
    assert split(lm, "  ", "Q:") == ([tok.eos_token_id], [tok.index[" "], tok.index[" "], tok.index["Q:"]])
    (s,) = AdaFuse([lm], method="greedy").score("  ", ["Q:"])
    assert s.tokens["nobos"] == 3


# ---- against lm-eval's own `hf` model (HFLM): tiny random-weight Llamas, byte-level BPE tokenizers trained here ----

CORPUS = ["Question: Who wrote Hamlet?\nAnswer: William Shakespeare",
          "The capital of France is Paris, a city of light."]
QUESTION = "Question: Who wrote Hamlet?\nAnswer:"
LONG = " ".join(CORPUS * 6)  # ~150 tokens: several windows of 64


def bpe_tokenizer(bos: bool):
    """A byte-level BPE tokenizer trained on CORPUS (whole words such as " Paris" and " Par" are tokens): with `bos` it
    adds BOS "<s>" before the text, without it has no BOS and appends EOS "</s>" after it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer, tk.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tk.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tk.post_processor = processors.TemplateProcessing(single="<s> $A" if bos else "$A </s>",
                                                      special_tokens=[("<s>", 0), ("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>" if bos else None, eos_token="</s>")


def tiny_llama(tok, window: int | None = 64, vocab: int | None = None):
    """A 2-layer Llama over `tok`'s vocabulary (or `vocab` output rows), random weights drawn wide (std 0.3: peaked
    distributions, no near ties for argmax to flip on); `window` its max_position_embeddings (None: the config names
    none)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=vocab or len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=window or 64,
                      bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    cfg.max_position_embeddings = window
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return model


def hf_and_ours(tok, model, max_length: int | None = None):
    """lm-eval's HFLM and the adafuse lm-eval model with one member, each on its own copy of the model and tokenizer."""
    from lm_eval.models.huggingface import HFLM
    from adafuse.harness.lm_eval_model import AdaFuseLM
    hf = HFLM(pretrained=copy.deepcopy(model), tokenizer=copy.deepcopy(tok), device="cpu", batch_size=4,
              max_length=max_length)
    lm = LocalModel.from_objects("tiny", copy.deepcopy(model), copy.deepcopy(tok))
    given = {"max_length": max_length} if max_length else {}
    return hf, AdaFuseLM(models=[lm], method="greedy", concurrency=1, **given)


def _requests(pairs, texts):
    from lm_eval.api.instance import Instance
    return ([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)],
            [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)])


def _same_as_hf(hf, ours, pairs, texts) -> None:
    """Request by request, ours gives hf's log-likelihood (within 1e-4) and greedy flag; rolling, hf's sums."""
    choice, rolling = _requests(pairs, texts)
    want, got = hf.loglikelihood(choice, disable_tqdm=True), ours.loglikelihood(choice, disable_tqdm=True)
    for req, (w, wg), (g, gg) in zip(choice, want, got):
        assert g == pytest.approx(w, abs=1e-4) and gg == wg, req.args
    want, got = hf.loglikelihood_rolling(rolling, disable_tqdm=True), ours.loglikelihood_rolling(rolling, True)
    assert got == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("bos", [True, False], ids=["adds-bos", "appends-eos"])
def test_one_member_scores_as_hf_with_text_that_starts_with_the_prefix_tokens_text(bos, monkeypatch):
    """A tokenizer that adds BOS and one that appends EOS (no BOS: EOS is the prefix token): contexts and texts that
    start with the prefix token's text (hf encodes them without special tokens), empty contexts (the continuation
    without special tokens), a context ending in a space, one ending mid-word (a token merging across the boundary),
    one past the window (left-truncated); rolling over several windows. The same again fed 3 positions a forward."""
    tok = bpe_tokenizer(bos)
    mark = "<s>" if bos else "</s>"  # the prefix token's text
    pairs = [(QUESTION, " William Shakespeare"), (QUESTION, " Paris"), (QUESTION + " ", "William"),
             (mark + QUESTION, " William Shakespeare"), ("The capital of France is Par", "is, a city of light."),
             ("", "The capital of France is Paris."), ("", mark + "The capital"), (LONG, " Paris")]
    hf, ours = hf_and_ours(tok, tiny_llama(tok))
    _same_as_hf(hf, ours, pairs, [LONG, mark + CORPUS[1]])
    monkeypatch.setattr("adafuse.scorer.CHUNK_BYTES", 3 * len(tok) * 4)  # 3 positions of one row a forward
    _same_as_hf(hf, ours, pairs, [LONG, mark + CORPUS[1]])


def test_max_length_and_the_tokenizers_window_set_the_window_as_hf_does():
    """`max_length=24` (a model argument lm-eval passes; refused before) rolls and truncates as hf's does; a config
    that names no window falls back to the tokenizer's model_max_length (40 here), as hf does (not to 2048)."""
    tok = bpe_tokenizer(True)
    pairs = [(LONG, " Paris"), (QUESTION, " William Shakespeare")]
    _same_as_hf(*hf_and_ours(tok, tiny_llama(tok), max_length=24), pairs, [LONG])
    tok.model_max_length = 40
    hf, ours = hf_and_ours(tok, tiny_llama(tok, window=None))
    assert hf.max_length == 40
    _same_as_hf(hf, ours, pairs, [LONG])
    from adafuse.harness.lm_eval_model import AdaFuseLM
    assert AdaFuseLM.create_from_arg_string("method=greedy,max_length=24", {"models": [A]}).max_length == 24
    for bad in ("0", "-3", "x"):
        with pytest.raises(ConfigError, match="max_length"):
            AdaFuseLM.create_from_arg_string(f"method=greedy,max_length={bad}", {"models": [A]})


def test_a_continuation_merged_wholly_into_the_context_is_scored_by_hfs_formula_not_an_error():
    """" Par" + "is" is one token, " Paris": the continuation "is" has no token of its own after the context. hf stops
    the whole run at an assert there; here that request scores 0 (hf's sum over its continuation tokens, none) and is
    greedy, and every other request of the run gets hf's own numbers."""
    from lm_eval.api.instance import Instance
    tok = bpe_tokenizer(True)
    assert tok.convert_ids_to_tokens(tok("The capital is Paris").input_ids)[-1] == "ĠParis"
    hf, ours = hf_and_ours(tok, tiny_llama(tok))
    merged = Instance("loglikelihood", {}, ("The capital of France is Par", "is"), 0)
    with pytest.raises(AssertionError):
        hf.loglikelihood([merged], disable_tqdm=True)
    others = [Instance("loglikelihood", {}, p, i) for i, p in enumerate([(QUESTION, " Paris"), ("The capital", " of")])]
    got = ours.loglikelihood([merged, *others], disable_tqdm=True)
    assert got[0] == (0.0, True)
    assert [g for g, _ in got[1:]] == pytest.approx([w for w, _ in hf.loglikelihood(others, disable_tqdm=True)],
                                                    abs=1e-4)


def test_rolling_scoring_keeps_a_chunk_of_log_probs_not_a_window_or_a_text(monkeypatch):
    """A window of 512 tokens over a 4096-row output, scored 16 positions a forward (CHUNK_BYTES): the largest
    allocation while scoring a text of two windows (torch's profiler) stays near one chunk's log-probs (before: a
    window's (511, V) block, 32 chunks, and copies of it), the log-probs any forward hands back are 16 positions on a
    text of two windows and on one of four, and the sum is what one forward a window gives."""
    import torch
    tok = bpe_tokenizer(True)
    lm = LocalModel.from_objects("tiny", tiny_llama(tok, window=512, vocab=4096), tok)
    chunk = 16 * lm.vocab_size * 4  # bytes: 16 positions of log-probs
    handed = []
    forward = lm.batcher.forward

    def counted(rows, cache, keep=None):
        req = forward(rows, cache, keep)
        handed.append(req.logprobs.numel() * 4)
        return req
    monkeypatch.setattr(lm.batcher, "forward", counted)
    ensemble = AdaFuse([lm], method="greedy")
    whole = ensemble.score_rolling(LONG * 4).logprob["tiny"]  # the default CHUNK_BYTES holds a window here
    assert len(lm.tokenizer(LONG * 4).input_ids) > 512 and max(handed) > 500 * lm.vocab_size * 4
    monkeypatch.setattr("adafuse.scorer.CHUNK_BYTES", chunk)
    handed.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        two = ensemble.score_rolling(LONG * 4).logprob["tiny"]
    largest = max(e.self_cpu_memory_usage for e in prof.events())
    assert largest <= 2 * chunk and max(handed) == chunk
    handed.clear()
    ensemble.score_rolling(LONG * 8)  # four windows
    assert max(handed) == chunk
    assert two == pytest.approx(whole, abs=1e-3)


def _count_decodes(monkeypatch) -> list[str]:
    """The prompts of every fused decode started from now on."""
    decodes = []
    start = AdaFuse.start
    monkeypatch.setattr(AdaFuse, "start", lambda self, prompt: decodes.append(prompt) or start(self, prompt))
    return decodes


def test_a_multiple_choice_run_with_several_members_decodes_nothing(monkeypatch):
    """The shipped multiple-choice task through lm-eval on a toy pair: acc and acc_norm compare the log-likelihoods,
    so no fused decode runs (before: one per question, for an is_greedy no metric of the task used)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from adafuse.harness.lm_eval_model import AdaFuseLM
    from adafuse.harness.lm_eval_tasks import HERE
    from adafuse.harness.lm_eval_tasks.scored import load_choice_docs
    from adafuse.harness.tasks import SAMPLE_DATA
    from tests.toy_tasks import toy_pair_for
    decodes = _count_decodes(monkeypatch)
    docs = load_choice_docs("triviaqa", str(SAMPLE_DATA))["test"].select(range(2))
    a, b = toy_pair_for([d["prompt"] + " ".join(d["choices"]) for d in docs])
    manager = TaskManager(include_path=str(HERE), include_defaults=False, metadata={"data": str(SAMPLE_DATA)})
    out = simple_evaluate(model=AdaFuseLM(models=[a, b]), tasks=["adafuse_triviaqa_mc"], task_manager=manager,
                          limit=2)
    assert 0 <= out["results"]["adafuse_triviaqa_mc"]["acc,none"] <= 1 and decodes == []


def test_is_greedy_is_decoded_for_documents_asking_one_continuation_or_when_asked(monkeypatch):
    """auto: a document asking one continuation (a loglikelihood task such as lambada, whose acc is is_greedy) gets
    the fused decode's verdict, one decode per context; a document asking several (multiple choice) none, and False.
    is_greedy=true decodes every context, false none."""
    from lm_eval.api.instance import Instance
    from adafuse.harness.lm_eval_model import AdaFuseLM
    a, b = toy_pair()
    one = [("Q", " Paris"), ("Q London", " is")]  # task "lambada": one continuation per document
    choice = [("Q Paris", " is"), ("Q Paris", " big")]  # task "mc": one document, two choices
    reqs = [Instance("loglikelihood", {}, p, 0, metadata=("lambada", i, 1)) for i, p in enumerate(one)]
    reqs += [Instance("loglikelihood", {}, p, i, metadata=("mc", 0, 1)) for i, p in enumerate(choice)]
    want = {(c, x): AdaFuse([a, b]).score(c, [x], is_greedy=True)[0] for c, x in one + choice}
    assert any(s.is_greedy for s in want.values()) and any(s.is_greedy is False for s in want.values())
    decodes = _count_decodes(monkeypatch)
    got = AdaFuseLM(models=[a, b], concurrency=2).loglikelihood(reqs, disable_tqdm=True)
    assert sorted(decodes) == ["Q", "Q London"]
    assert got == [(pytest.approx(want[p].fused), bool(want[p].is_greedy)) for p in one] + \
        [(pytest.approx(want[p].fused), False) for p in choice]
    decodes.clear()
    every = AdaFuseLM(models=[a, b], concurrency=2, is_greedy=True).loglikelihood(reqs, disable_tqdm=True)
    assert sorted(decodes) == ["Q", "Q London", "Q Paris"]
    assert [g for _, g in every] == [bool(want[p].is_greedy) for p in one + choice]
    decodes.clear()
    none = AdaFuseLM(models=[a, b], concurrency=2, is_greedy=False).loglikelihood(reqs, disable_tqdm=True)
    assert decodes == [] and [g for _, g in none] == [False] * 4
    for bad in ("sometimes", 1):
        with pytest.raises(ConfigError, match="is_greedy"):
            AdaFuseLM(models=[a, b], is_greedy=bad)
