"""GGUF files into transformers folders: dequantized weights, a faithful tokenizer and how the file said to use it."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

from ..errors import ModelLoadError

# What a converted folder records beside the weights: the GGUF it came from, whether BOS goes first, whether the
# tokenizer is the one built here (load it as a fast tokenizer).
META = "adafuse.json"
# GGUF's `tokenizer.ggml.model` value for SentencePiece vocabularies (named after the reference implementation).
SENTENCEPIECE = "llama"
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4  # GGUF token types


def gguf_meta(path: Path) -> dict:
    """The tokenizer fields of a GGUF file; "reader_get" reads any other field (a default when absent)."""
    from gguf import GGUFReader
    reader = GGUFReader(str(path))

    def get(key, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    return {"reader_get": get, "model": get("tokenizer.ggml.model"), "add_bos": bool(get("tokenizer.ggml.add_bos_token", False)),
            "eos": get("tokenizer.ggml.eos_token_id"), "bos": get("tokenizer.ggml.bos_token_id")}


def convert_gguf(path: Path, target: Path) -> None:
    """Dequantize a GGUF file once into a transformers folder (weights, tokenizer, META)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
    meta = gguf_meta(path)
    get = meta["reader_get"]
    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        hf_tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:  # transformers raises many kinds here
        raise ModelLoadError(f"could not convert GGUF {path}: {exc}. Use a GGUF of an architecture transformers "
                             "supports (its documentation lists them under GGUF)") from exc
    tokens = [str(t) for t in get("tokenizer.ggml.tokens", [])]
    if meta["model"] == SENTENCEPIECE and tokens:
        tk = build_spm_tokenizer(tokens, list(get("tokenizer.ggml.scores")), list(get("tokenizer.ggml.token_type")),
                                 bos_id=meta["bos"], unk_id=get("tokenizer.ggml.unknown_token_id"),
                                 add_bos=meta["add_bos"], add_space_prefix=bool(get("tokenizer.ggml.add_space_prefix", True)))
        special = {k: tokens[v] for k, v in (("bos_token", meta["bos"]), ("eos_token", meta["eos"]),
                   ("unk_token", get("tokenizer.ggml.unknown_token_id")),
                   ("pad_token", get("tokenizer.ggml.padding_token_id"))) if v is not None}
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, **special)
        template = get("tokenizer.chat_template")
        if template:
            tokenizer.chat_template = str(template)
    else:
        tokenizer = hf_tok
        if meta["eos"] is not None and tokens:
            tokenizer.eos_token = tokens[meta["eos"]]
    # save_pretrained refuses while the GGUF quantizer marker is on the model
    model.hf_quantizer = None
    for obj in (model, model.config):
        if hasattr(obj, "quantization_config"):
            delattr(obj, "quantization_config")
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / META).write_text(json.dumps({"source": str(path), "add_bos": meta["add_bos"],
                                        "fast_tokenizer": meta["model"] == SENTENCEPIECE}))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def build_spm_tokenizer(tokens: list[str], scores: list[float], types: list[int], *, bos_id: int | None,
                        unk_id: int | None, add_bos: bool, add_space_prefix: bool) -> Tokenizer:
    """A faithful fast tokenizer for a SentencePiece GGUF vocabulary.

    transformers turns such vocabularies into a Unigram model, which splits some text into wrong pieces ("▁w", "or",
    "ld" instead of "▁world"). The reference implementation instead merges adjacent pieces greedily, highest piece
    score first; a BPE model whose merges are ordered by the merged piece's score does the same, so that is what we
    build.

    Args: tokens/scores/types: the GGUF `tokenizer.ggml.*` arrays (same length)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for i, (piece, score, kind) in enumerate(zip(tokens, scores, types)):
        if kind != NORMAL or len(piece) < 2:
            continue
        for k in range(1, len(piece)):
            left, right = vocab.get(piece[:k]), vocab.get(piece[k:])
            if left is not None and right is not None and types[left] == NORMAL and types[right] == NORMAL:
                merges.append((-score, i, left, right))
    merges.sort()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(tokens[m[2]], tokens[m[3]]) for m in merges],
                               unk_token=tokens[unk_id] if unk_id is not None else None,
                               fuse_unk=True, byte_fallback=True))
    norm = [normalizers.Replace(" ", "▁")]
    if add_space_prefix:
        norm.insert(0, normalizers.Prepend(" "))
    tok.normalizer = normalizers.Sequence(norm)
    dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        dec.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(dec)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=True)
                    for t, kind in zip(tokens, types) if kind == USER_DEFINED])
    if add_bos and bos_id is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos_id]} $A", pair=f"{tokens[bos_id]} $A $B", special_tokens=[(tokens[bos_id], bos_id)])
    return tok
