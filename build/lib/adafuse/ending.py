"""Where the answer ends in text: the one stop cut (stop strings and end-token strings) every round goes through."""
from __future__ import annotations

from .words import find_stop


class Ending:
    """The texts that end the answer wherever they appear: the decode's stop strings, then every model's end-token
    strings (`end_strings`). A stop may begin in text committed earlier and be completed by a new span."""

    def __init__(self, stops: tuple[str, ...], end_strings: tuple[str, ...] = ()):
        self.stops = tuple(stops)
        self.enders = self.stops + tuple(sorted(set(end_strings)))
        self._longest = max((len(x) for x in self.enders), default=0)

    def cut(self, old: str, text: str) -> int | None:
        """Index in `old + text` where the first ender that `text` completes begins (it may begin inside `old`, never
        before the last characters an ender could span), or None."""
        if not self.enders:
            return None
        return find_stop(old + text, self.enders, len(old) - self._longest + 1)

    def stop_string_at(self, text: str, at: int) -> bool:
        """Whether one of the stop strings (not only an end-token string) begins at index `at` of `text`."""
        return any(text.startswith(x, at) for x in self.stops)

    def head(self, old: str, text: str, eos: bool) -> tuple[str, bool, bool]:
        """A span after `old` holding a stop string or an end-token string is cut before it and ends the answer:
        (text before it, ends the answer, a stop string made the cut). Text past the end is never scored."""
        cut = self.cut(old, text)
        at = []
        if cut is None or cut < len(old):  # a stop begun in committed text: commit cuts the rounds it began in
            head = text
        else:
            head, eos = text[: cut - len(old)], True
            at = [x for x in self.stops if (old + text).startswith(x, cut)]  # the stop strings found there
        # whitespace before a stop string that does not begin with whitespace ("\n\n" before "Question") is part of
        # how the answer ends: scored as that text and then the stop (scoring.py); else whitespace and then the end
        # is the answer ending here, one event
        if eos and not head.strip() and not any(not x[0].isspace() for x in at):
            head = ""
        return head, eos, bool(at)
