"""Speculative proposals (`DecodeConfig.speculate`): the texts a model verifies in one forward before writing its span."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from .methods import Proposed
from .trace import Round, StepMode
from .words import lookup_continuations

if TYPE_CHECKING:
    from .config import DecodeConfig
    from .models import LoadedModel


class Speculation:
    """What the models of one decode may verify instead of computing token by token: the spans proposed so far this
    round, each model's own span left over from the last round (what it proposed past the committed text) and the
    round's prompt lookup; and the order the models propose in (the lightest first: its span is the others' draft)."""

    def __init__(self, models: Sequence["LoadedModel"]):
        self.models = list(models)
        self.proposed: dict[int, list[str]] = {}  # this round: the texts each model proposed, in the order they acted
        self.leftover: dict[int, str] = {}        # per model: its span past the text the last round committed
        self._lookup: tuple[tuple | None, list[str]] = (None, [])  # the current round's prompt lookup, by its key

    def start_round(self, acting: Iterable[int], config: "DecodeConfig", side_by_side: bool) -> list[int]:
        """A round starts, nothing proposed yet: the acting models in the order they propose (one after another and
        speculating, the lightest first; else by index)."""
        self.proposed = {}
        moving = sorted(acting)
        if config.speculate and not side_by_side:
            moving.sort(key=lambda m: (self._weight_size(m), m))
        return moving

    def drafts(self, m: int, config: "DecodeConfig", side_by_side: bool) -> list[str]:
        """The texts model m verifies before writing its span. One after another, the spans the models before it
        proposed this round; side by side, none of those exist yet. Either way every model's span left over from the
        last round, its own first."""
        if not config.speculate:
            return []
        drafts = [] if side_by_side else [t for o, texts in list(self.proposed.items()) if o != m for t in texts]
        for o in sorted(self.leftover, key=lambda o: o != m):
            if self.leftover[o] not in drafts:
                drafts.append(self.leftover[o])
        return drafts

    def lookups(self, prompt: str, output: str, config: "DecodeConfig") -> list[str]:
        """Prompt lookup (`draft_lookup`): what followed the latest earlier occurrence of the answer's last words in
        the prompt and the answer, as drafts a model verifies only where they start with its own first token (unlike
        the spans, they are not in the pool, so they serve nothing else). The same for every model of a round: looked
        up once."""
        if not (config.speculate and config.draft_lookup):
            return []
        key = (output, config.max_words)
        if self._lookup[0] != key:
            self._lookup = (key, lookup_continuations(prompt + output, config.max_words + 1))
        return self._lookup[1]

    def record(self, m: int, proposed: Proposed) -> None:
        """Model m proposed: its texts are drafts for the models after it this round."""
        self.proposed[m] = [p.text for p in proposed.proposals if p.text.strip()]

    def after_commit(self, r: Round) -> None:
        """Round `r` was committed (`r.text`): each confident model's span past it is its draft for the next round."""
        self.leftover = {m: c.text[len(r.text):] for m, st in enumerate(r.steps)
                         if st.mode in (StepMode.COMMIT, StepMode.SPAN) and st.proposals
                         for c in [r.candidates[st.proposals[0]]]
                         if r.text and len(c.text) > len(r.text) and c.text.startswith(r.text)}

    def _weight_size(self, m: int) -> int:
        """How heavy model m is (bytes of weights, which a local model sums once; a served model 0)."""
        try:
            return int(self.models[m].memory_bytes)
        except (AttributeError, TypeError, StopIteration):
            return 0
