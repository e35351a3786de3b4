"""A faithful fast tokenizer for SentencePiece ("llama" model) GGUF files.

transformers turns such vocabularies into a Unigram model, which splits Gemma 3 text into wrong
pieces ("▁w", "or", "ld" instead of "▁world"). llama.cpp instead merges adjacent pieces greedily,
highest piece score first; a BPE model whose merges are ordered by the merged piece's score does
the same, so that is what we build.
"""
from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

NORMAL, CONTROL, USER_DEFINED = 1, 3, 4


def build_spm_tokenizer(tokens: list[str], scores: list[float], types: list[int], *, bos_id: int | None,
                        unk_id: int | None, add_bos: bool, add_space_prefix: bool) -> Tokenizer:
    """Args: tokens/scores/types: the GGUF `tokenizer.ggml.*` arrays (same length)."""
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
