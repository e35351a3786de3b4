"""Stop strings as people write them (one a line, with escapes) and as proposed from the shape of a raw prompt."""
from __future__ import annotations

import re
import unicodedata
from typing import Iterable

from .errors import ConfigError

# what a backslash may start in a stop box, and what it stands for
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
ESCAPES_HELP = r"\n (newline), \t (tab), \r (carriage return) and \\ (a backslash)"
_WRITTEN = {v: "\\" + k for k, v in ESCAPES.items()}

# a field label at the start of a line, in any script: "Question:", "Q:", "English:", "Let's see:", "Antwort:",
# "Réponse :" (a space before the colon, as French writes it, a no-break one too), "答え：" (a full-width colon, the
# answer right after it). A few words, no sentence punctuation or brackets, so a passage's "The Normans (Norman:" or
# "Note, however:" is not one; an ASCII colon ends a label only before a space or the line's end ("http://" does not)
_SPACES = " \u00a0\u202f\u3000"  # a space, no-break spaces, the ideographic space
_LABEL = re.compile(rf"[^\W\d_][\w'/\-{_SPACES}]{{0,30}}?(?::(?=\s|$)|：)")
_COLONS = (":", "：")
_ASKS = ("?", "？", "؟")  # question marks: ASCII, full-width, Arabic
_MAX_LABEL_WORDS = 3
_MAX_LABEL_WIDE = 6  # Chinese or Japanese characters in a label (no spaces between words): "答え", "質問", "アシスタント"


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
    - a question with no label of its own on the line before a cue label ("Who wrote Hamlet?\\nAnswer:", "...ですか？
      \\n答え："): as a labelled question;
    - otherwise, and after a cue sentence ("Let's think step by step\\n") or a labelled question alone ("Q: 2+2?"), the
      label that starts the last example after a line break ("\\nQuestion:", "\\nQ:"), and, when every line in between
      is labelled too ("Passage: ...", "Question: ..."), those labels: the model's next example starts with one.
    A label is a few words at a line's start ending in a colon, in any script: "Antwort:", "Réponse :" (a space before
    the colon), "答え：" (the full-width colon). A prompt without a label gets none: a bare question ("Who wrote
    Hamlet?") is answered after a line break or two, so a line-break stop would end the answer before it starts; nor
    does a text to be continued."""
    text = (prompt or "").rstrip(" \t")
    if not text.strip():
        return ()
    ends_line = text.endswith("\n")
    lines = text.rstrip("\n").split("\n")
    cue = lines[-1].rstrip()
    if not (cue.endswith(_COLONS + _ASKS) or ends_line):
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
    # a question asked on the line before a cue label frames the answer as a labelled one does ("...?\nAnswer:")
    asked = bool(bare) and len(example) > 1 and example[-2].rstrip().endswith(_ASKS)
    if not (first or asked):
        return ()
    answers = [_answer(lines, i, bare, first) for i in previous] if bare else []
    if answers and all(len(a) == 1 for a in answers) or bare and not answers and not ends_line:
        return ("\n",)  # one-line answers: the line break ends the answer
    if not first:
        return ()
    middle = [_label(line) for line in example[1:-1]]
    return tuple(dict.fromkeys("\n" + x for x in [first, *(middle if all(middle) else [])] if x != bare))


def _label(line: str) -> str | None:
    """The field label a line starts with ("Question:", "Réponse :", "答え："), or None. Combining marks (the vowel
    signs of Devanagari, Thai, ...: not word characters to `re`) read as letters."""
    m = _LABEL.match("".join("a" if unicodedata.category(c).startswith("M") else c for c in line[:64]))
    if not m:
        return None
    label = line[:m.end()]
    words = label.rstrip("".join(_COLONS) + _SPACES).split()
    wide = sum(unicodedata.east_asian_width(c) in "WF" for c in label[:-1])
    return label if len(words) <= _MAX_LABEL_WORDS and wide <= _MAX_LABEL_WIDE else None


def _answer(lines: list[str], cue_at: int, bare: str | None, first: str | None) -> list[str]:
    """The non-blank lines of an earlier example's answer: the rest of its cue line (a bare cue label) and the lines
    after it, up to a blank line or the next example's label."""
    out = [lines[cue_at][len(bare):].strip()] if bare else []
    for line in lines[cue_at + 1:]:
        if not line.strip() or (first and line.startswith(first)):
            break
        out.append(line)
    return [x for x in out if x.strip()]


def bare_question(prompt: str | None) -> bool:
    """A question typed as it is asked ("Who wrote Hamlet?"): a line or two, no field label, ending with a question
    mark. Read raw, a base model goes on as if writing a list of questions: it is better asked as a chat message
    (`mode="chat"`) or in a Question/Answer frame (`qa_frame`)."""
    text = (prompt or "").strip()
    lines = [line for line in text.split("\n") if line.strip()]
    return bool(text) and text.endswith(_ASKS) and len(lines) <= 2 and not any(_label(line) for line in lines)


def qa_frame(prompt: str) -> str:
    """A bare question in the Question/Answer frame the benchmark tasks use: "Question: …\\nAnswer:" (its stop
    proposal is "\\n": the answer is the rest of that line)."""
    return f"Question: {' '.join(prompt.split())}\nAnswer:"
