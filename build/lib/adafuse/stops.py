"""Stop strings as people write them (one a line, with escapes) and as proposed from the shape of a raw prompt."""
from __future__ import annotations

import re
from typing import Iterable

from .errors import ConfigError

# what a backslash may start in a stop box, and what it stands for
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
ESCAPES_HELP = r"\n (newline), \t (tab), \r (carriage return) and \\ (a backslash)"
_WRITTEN = {v: "\\" + k for k, v in ESCAPES.items()}

# a field label at the start of a line: "Question:", "Q:", "English:", "Human:", "Let's see:" (a few words, no
# sentence punctuation or brackets, so a passage's "The Normans (Norman:" or "Note, however:" is not one)
_LABEL = re.compile(r"[^\W\d_][\w' /-]{0,30}?[:：](?=\s|$)")
_MAX_LABEL_WORDS = 3


def parse_stops(text: str | None) -> tuple[str, ...]:
    """The stop strings in `text`, one a line (blank lines skipped; a line's own spaces kept), with the escapes
    \\n, \\t, \\r and \\\\ decoded. Any other backslash (an unknown escape such as \\q or \\x41, or a lone one at a line's
    end) is a ConfigError that names it and the escapes there are: it would otherwise never match."""
    stops = []
    for k, line in enumerate((text or "").split("\n"), 1):
        line = line.removesuffix("\r")  # a Windows line end
        if not line.strip():
            continue
        out, i = [], 0
        while i < len(line):
            c = line[i]
            if c == "\\":
                nxt = line[i + 1: i + 2]
                if nxt not in ESCAPES:
                    what = f"an unknown escape \\{nxt}" if nxt else "a lone \\ at its end"
                    raise ConfigError(f"stop strings: line {k} ({line}) has {what}; the escapes are "
                                      f"{ESCAPES_HELP}: write a backslash itself as \\\\")
                out.append(ESCAPES[nxt])
                i += 2
            else:
                out.append(c)
                i += 1
        stops.append("".join(out))
    return tuple(stops)


def format_stops(stops: Iterable[str]) -> str:
    """Stop strings as `parse_stops` reads them: one a line, newline, tab, carriage return and backslash escaped.
    A stop string that no line can hold (empty, or only spaces: a blank line is skipped) is a ConfigError."""
    lines = []
    for s in stops:
        if not isinstance(s, str):
            raise ConfigError(f"stop string {s!r} is not text: give strings")
        line = "".join(_WRITTEN.get(c, c) for c in s)
        if not line.strip():
            raise ConfigError(f"stop string {s!r} cannot be written one a line (a blank line is skipped): use "
                              "a stop string with a visible character")
        lines.append(line)
    return "\n".join(lines)


def propose_stops(prompt: str | None) -> tuple[str, ...]:
    """Stop strings that end the answer a raw prompt asks for, from the prompt's shape; () when none makes sense.

    The prompt's last example runs from its first labelled line ("Question: ...", "Q: ...", "German: ...", after the
    last blank line or the previous answer) to the cue it ends on:
    - a cue label with the answer to follow on its line ("...\\nAnswer:", "...\\nA:", "...\\nEnglish:"): "\\n", as the
      benchmark tasks stop, unless the earlier examples' answers after that cue run over several lines;
    - a cue label and a line break ("Answer:\\n"): "\\n" when every earlier example's answer fills one line;
    - otherwise, and after a cue sentence ("Let's think step by step\\n") or a labelled question alone ("Q: 2+2?"), the
      label that starts the last example after a line break ("\\nQuestion:", "\\nQ:"), and, when every line in between
      is labelled too ("Passage: ...", "Question: ..."), those labels: the model's next example starts with one.
    A prompt without a label gets none: a bare question ("Who wrote Hamlet?") is answered after a line break or two,
    so a line-break stop would end the answer before it starts; nor does a text to be continued."""
    text = (prompt or "").rstrip(" \t")
    if not text.strip():
        return ()
    ends_line = text.endswith("\n")
    lines = text.rstrip("\n").split("\n")
    cue = lines[-1].rstrip()
    if not (cue.endswith((":", "?", "：", "？")) or ends_line):
        return ()
    label = _label(cue)
    bare = label if label == cue else None  # "Answer:" alone: the answer follows it
    previous = [i for i, line in enumerate(lines[:-1]) if (line.startswith(bare) if bare else line.rstrip() == cue)]
    blank = max((i for i, line in enumerate(lines[:-1]) if not line.strip()), default=-1)
    start = max(blank, previous[-1] if previous else -1) + 1
    # the example starts at its first labelled line (past an instruction, or the rest of an answer over lines)
    start = next((i for i in range(start, len(lines) - 1) if _label(lines[i])), start)
    example = lines[start:]
    first = _label(example[0]) if len(example) > 1 or not bare else None
    if not first:
        return ()
    answers = [_answer(lines, i, bare, first) for i in previous] if bare else []
    if answers and all(len(a) == 1 for a in answers) or bare and not answers and not ends_line:
        return ("\n",)  # one-line answers: the line break ends the answer
    middle = [_label(line) for line in example[1:-1]]
    return tuple(dict.fromkeys("\n" + x for x in [first, *(middle if all(middle) else [])] if x != bare))


def _label(line: str) -> str | None:
    """The field label a line starts with ("Question:"), or None."""
    m = _LABEL.match(line)
    return m.group(0) if m and len(m.group(0).split()) <= _MAX_LABEL_WORDS else None


def _answer(lines: list[str], cue_at: int, bare: str | None, first: str | None) -> list[str]:
    """The non-blank lines of an earlier example's answer: the rest of its cue line (a bare cue label) and the lines
    after it, up to a blank line or the next example's label."""
    out = [lines[cue_at][len(bare):].strip()] if bare else []
    for line in lines[cue_at + 1:]:
        if not line.strip() or (first and line.startswith(first)):
            break
        out.append(line)
    return [x for x in out if x.strip()]
