"""The CPU kernels (adafuse/models/cpu.py): linear layers as W·xᵀ and grouped attention read in place give
transformers' numbers, and which ones run is recorded once per machine, not timed at every load."""
import torch

from adafuse.models import cpu
from adafuse.models.batching import PACKED


def test_the_cpu_linear_kernels_compute_the_same_linear_map(pair):
    """On CPU float32 the loader may compute linear layers as W·xᵀ (`cpu.CpuHead`, `cpu.CpuInner`): the same weights
    (tied embeddings stay tied), the same outputs as `F.linear` up to summation order, for one row, several rows and
    batched inputs, and the plain path where gradients are wanted. Each kernel is tried on the real layers whichever
    this machine's recorded choice swapped; the notes say what was swapped."""
    import copy
    tried = 0
    for lm in pair:
        head = lm.model.get_output_embeddings()
        if lm.device.type != "cpu" or lm.dtype != torch.float32:
            continue
        assert isinstance(head, torch.nn.Linear) and head.weight is lm.model.get_input_embeddings().weight
        inner = [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
        assert (type(head) is cpu.CpuHead) == any("output layer" in n for n in lm.notes)
        assert all(type(m) is cpu.CpuInner for m in inner) == any("inner layers" in n for n in lm.notes)
        torch.manual_seed(0)
        for layer, kind in [(m, cpu.CpuInner) for m in inner[:3]] + [(head, cpu.CpuHead)]:
            layer = copy.copy(layer)  # the same parameters; the model's own layer keeps its class
            layer.__class__ = kind
            tried += 1
            for shape in ((1, 1, layer.in_features), (1, 3, layer.in_features), (2, 5, layer.in_features)):
                x = torch.randn(*shape)
                with torch.inference_mode():
                    ours = layer(x)
                plain = torch.nn.functional.linear(x, layer.weight, layer.bias)
                assert ours.shape == plain.shape and ours.is_contiguous()
                assert (ours - plain).abs().max().item() < 1e-3, (lm.name, shape)
            x = torch.randn(1, 2, layer.in_features, requires_grad=True)
            assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))  # F.linear itself
    assert tried or all(lm.device.type != "cpu" for lm in pair)


def _tiny_model():
    """A small transformers model with grouped heads and an output layer large enough to be a kernel candidate."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=cpu.HEAD_ROWS, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def test_the_cpu_kernel_choice_is_measured_once_per_machine_and_read_back(tmp_path, monkeypatch):
    """The first load on a machine measures which linear layers run faster as W·xᵀ and records it; later loads read
    the record (no timing), so every load of a model runs the same code. True and False override it; the grouped
    attention is selected for the model alone (transformers' "sdpa" stays its own)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    record = tmp_path / "cpu-kernels.json"
    probed = []
    monkeypatch.setattr(cpu, "probe_linears", lambda head, inner: probed.append(1) or cpu.LinearChoice(True, 4, "1 → 0 ms"))
    first = _tiny_model()
    notes = cpu.use_cpu_kernels(first, record)
    assert probed == [1] and record.exists() and "measured on this CPU" in notes[0]
    monkeypatch.setattr(cpu, "probe_linears", lambda head, inner: cpu.LinearChoice())  # a busier machine now
    again = _tiny_model()
    assert "recorded for this CPU" in cpu.use_cpu_kernels(again, record)[0]
    for model in (first, again):
        assert type(model.lm_head) is cpu.CpuHead and model.model.layers[0].mlp.up_proj.most == 4
        assert model.config._attn_implementation == cpu.GROUPED_SDPA
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        assert torch.equal(first(input_ids=x).logits, again(input_ids=x).logits)
    assert AttentionInterface._global_mapping["sdpa"] is sdpa_attention_forward
    off = _tiny_model()
    assert cpu.use_cpu_kernels(off, record, choice=False) == []
    assert type(off.lm_head) is torch.nn.Linear and off.config._attn_implementation == "sdpa"
    on = _tiny_model()
    cpu.use_cpu_kernels(on, tmp_path / "unused.json", choice=True)
    assert type(on.lm_head) is cpu.CpuHead and type(on.model.layers[0].mlp.up_proj) is cpu.CpuInner
    assert on.model.layers[0].mlp.up_proj.most == cpu.CpuInner.most and not (tmp_path / "unused.json").exists()


def test_grouped_attention_on_cpu_gives_transformers_numbers_bit_for_bit(pair):
    """On CPU the loader lets grouped query heads read their key/value heads in place when a mask is given
    (`cpu.grouped_sdpa`, selected per model): a padded batch over a cached prefix gives exactly the logits of
    transformers' own attention, which copies every key/value head once per query head first."""
    from transformers import DynamicCache
    grouped = [lm for lm in pair if any("key/value head" in n for n in lm.notes)]
    assert grouped or all(lm.device.type != "cpu" for lm in pair)
    for lm in grouped:
        cfg = lm.model.config.get_text_config(decoder=True)
        impl = cfg._attn_implementation  # the packed attention of many decodes at once runs grouped_sdpa inside
        assert impl == cpu.GROUPED_SDPA or (impl == PACKED and cfg._adafuse_inner_attention == cpu.GROUPED_SDPA)
        torch.manual_seed(0)
        prefix = torch.randint(100, 1000, (1, 40), device=lm.device)
        rows = torch.randint(100, 1000, (3, 4), device=lm.device)
        mask = torch.ones(3, 44, dtype=torch.long, device=lm.device)
        mask[1, 40] = 0  # a padded position inside the new ones

        def logits():
            cache = DynamicCache()
            with torch.inference_mode():
                lm.model(input_ids=prefix, past_key_values=cache, use_cache=True)
                cache.batch_repeat_interleave(3)
                return lm.model(input_ids=rows, attention_mask=mask, past_key_values=cache, use_cache=True).logits

        ours = logits()
        lm.model.set_attn_implementation("sdpa")
        try:
            theirs = logits()
        finally:
            lm.model.set_attn_implementation(impl)
        assert torch.equal(ours, theirs), lm.name


def test_grouped_attention_runs_the_grouped_kernel_with_the_callers_scale(monkeypatch):
    """`grouped_sdpa` with a mask on CPU hands SDPA the key/value heads as they are (`enable_gqa`, fewer heads than the
    queries) and the caller's scale, and equals transformers' function; without a mask it is transformers' function."""
    from types import SimpleNamespace
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    _grouped_sdpa = cpu.grouped_sdpa
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.shape[1], k.shape[1], kw.get("enable_gqa", False), kw.get("scale")))
        return real(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    q, k, v = torch.randn(2, 6, 3, 8), torch.randn(2, 2, 10, 8), torch.randn(2, 2, 10, 8)
    mask = torch.ones(2, 1, 3, 10, dtype=torch.bool).tril(7)
    mask[1, :, :, 2] = False
    ours, _ = _grouped_sdpa(module, q, k, v, mask, dropout=0.0, scaling=0.3)
    assert seen == [(6, 2, True, 0.3)]
    theirs, _ = sdpa_attention_forward(module, q, k, v, mask, dropout=0.0, scaling=0.3)
    assert seen[1][:3] == (6, 6, False)  # transformers copied the heads
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, _grouped_sdpa(module, q, k, v, mask, dropout=0.0, scaling=None)[0])
    seen.clear()
    plain, _ = _grouped_sdpa(module, q, k, v, None, dropout=0.0, scaling=0.3)
    assert seen == [(6, 2, True, 0.3)] and plain.shape == ours.shape  # no mask: transformers' own (grouped) call
