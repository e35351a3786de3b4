"""Word boundaries, stop strings and token-prefix helpers (pure functions, no models)."""
from __future__ import annotations

import re

_WORD = re.compile(r"\s*\S+")


def word_end(text: str) -> int | None:
    """Index where the first word of `text` ends: the first whitespace after a non-whitespace
    character, or None while the word may still grow."""
    seen = False
    for i, ch in enumerate(text):
        if ch.isspace():
            if seen:
                return i
        else:
            seen = True
    return None


def count_words(text: str) -> int:
    """Number of words (leading whitespace + non-whitespace run) in `text`."""
    return len(_WORD.findall(text))


def split_words(text: str) -> list[str]:
    """Words with their leading whitespace; joining them gives back `text` minus trailing spaces."""
    return _WORD.findall(text)


def word_starts(text: str) -> list[int]:
    """Start index of every word of `text` (a word starts with its leading whitespace)."""
    return [m.start() for m in _WORD.finditer(text)]


def find_stop(text: str, stops: tuple[str, ...], start: int = 0) -> int | None:
    """Earliest index >= start at which a stop string begins in text, or None."""
    best = None
    for s in stops:
        i = text.find(s, max(0, start))
        if i >= 0 and (best is None or i < best):
            best = i
    return best


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def lookup_continuations(context: str, words: int, key_words: int = 3, count: int = 1) -> list[str]:
    """Prompt lookup: what followed the latest earlier occurrences of the context's last `key_words` words (fewer
    when those never occur before, down to 2), `words` words of it each, at most `count` distinct ones, latest first.
    Answers that copy from their question or repeat themselves (arithmetic, names, formats) continue this way often;
    used as drafts a model verifies (speculative proposals), never as proposals."""
    base = max(0, len(context) - 400)
    tail = [base + i for i in word_starts(context[base:])]
    found: list[str] = []
    for k in range(min(key_words, len(tail)), 1, -1):
        key = context[tail[-k]:].lstrip()
        end = len(context) - 1  # the key's own place at the end of the context is not a match
        while len(found) < count:
            at = context.rfind(key, 0, end)
            if at < 0:
                break
            follow = "".join(split_words(context[at + len(key): at + len(key) + 60 * words])[:words])
            if follow.strip() and follow not in found:
                found.append(follow)
            end = at + len(key) - 1
        if found:
            break
    return found
