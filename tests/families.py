"""Tiny random-weight models of the decoder families people pick, built from configs (no download): the conformance
suite (tests/test_conformance.py) runs the packed forward on each. Weights are drawn wider than the families' own
initialization so that attention is far from uniform and a wrong mask or a dropped softcap shows in the numbers."""
from __future__ import annotations

import torch

VOCAB = 96
WINDOW = 4  # the sliding window of the families that have one: the situations below reach past it

_COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
               tie_word_embeddings=False)
_SLIDING_THEN_FULL = ["sliding_attention", "full_attention"]

# family: (config class name, model class name, settings beyond the common ones)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW,
                                                       max_window_layers=1, layer_types=["full_attention",
                                                                                        "sliding_attention"])),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=8)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=8, sliding_window=WINDOW, query_pre_attn_scalar=8,
                                                          attn_logit_softcapping=2.0, final_logit_softcapping=5.0,
                                                          layer_types=_SLIDING_THEN_FULL)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=8, sliding_window=WINDOW,
                                                              query_pre_attn_scalar=8, layer_types=_SLIDING_THEN_FULL)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=WINDOW)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(head_dim=8, sliding_window=WINDOW, num_local_experts=4,
                                                           num_experts_per_tok=2, layer_types=_SLIDING_THEN_FULL)),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(attention_multiplier=0.5, residual_multiplier=0.7,
                                                             embedding_multiplier=2.0, logits_scaling=1.5)),
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(logit_scale=0.5)),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(sliding_window=WINDOW, layer_types=_SLIDING_THEN_FULL)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(no_rope_layers=[1, 0])),
}


def tiny(family: str, attention: str = "sdpa", seed: int = 0, device: str = "cpu") -> torch.nn.Module:
    """A tiny `family` model with random weights (std 0.3: attention far from uniform), `attention` its transformers
    attention implementation, in eval mode, float32."""
    import transformers
    config_name, model_name, extra = FAMILIES[family]
    cfg = getattr(transformers, config_name)(**{**_COMMON, **extra})
    cfg._attn_implementation = attention
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
            elif "sinks" in name:
                p.normal_(0.0, 1.0)
    return model.to(device)


# the bundled pair's shapes cut down to a few milliseconds a forward (heads of 16, Gemma 3's window 16 tokens)
BUNDLED_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16)


def tiny_bundled_folders(root) -> list:
    """Folders of tiny random-weight models in the bundled pair's architectures (SmolLM2's Llama, Gemma 3 with a
    sliding window of 16 tokens and a sliding then a full layer), each with its bundled model's own tokenizer, chat
    template, generation settings and adafuse.json: what loading the real pair runs (from_pretrained, the CPU kernels,
    two tokenizers, BOS, end tokens, chat templates), at a few milliseconds a forward. For tests of how decodes run,
    not of what the models say. Built in `root` (seeded: the same weights each time)."""
    import json
    import shutil
    from pathlib import Path

    import transformers

    from adafuse import DEFAULT_PAIR
    from adafuse.models.local import bundled_folder
    out = []
    for seed, name in enumerate(DEFAULT_PAIR):
        src, dst = bundled_folder(name), Path(root) / f"tiny-{name}"
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.name not in ("model.safetensors", "config.json", "adafuse.json"):
                shutil.copy(f, dst / f.name)
        own = json.loads((src / "adafuse.json").read_text()) if (src / "adafuse.json").exists() else {}
        (dst / "adafuse.json").write_text(json.dumps({k: v for k, v in own.items() if k != "source"}))
        cfg = transformers.AutoConfig.from_pretrained(src)
        cfg.update(BUNDLED_TINY)
        if getattr(cfg, "sliding_window", None):
            cfg.update(dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"]))
        torch.manual_seed(seed)
        transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(dst)
        out.append(dst)
    return out
