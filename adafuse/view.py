"""The small interface between the decoder and one model's view of the text `render(prompt) + y`."""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class Branch(ABC):
    """A batch of continuations written side by side after the committed ids (exploration, beam search)."""

    @abstractmethod
    def step(self, tokens: list[int]) -> torch.Tensor:
        """Feed one token per row; returns (N, V) next-token log-probs, one row per continuation."""

    @abstractmethod
    def keep(self, rows: list[int]) -> None:
        """Keep these rows (in this order, repeats allowed) for the next step."""

    @abstractmethod
    def remember(self, rows: list[tuple[int, list[int], torch.Tensor]]) -> None:
        """Each (row, tokens, log-probs after them): that row holds `tokens` after the committed ids; keep its state so
        committing them costs no forward (the rows ended in one step: given together, copied together)."""


class ModelView(ABC):
    """One model's view of a decode. The decoder, the proposers (`candidates.py`), the scorer (`scoring.py`) and the
    methods (`methods.py`) talk to a model only through `ModelView` and `Branch`; `models.session.LocalSession`
    implements them for a local model with a KV cache, `models.served.ServedSession` for a model served by an
    inference engine over HTTP (`LoadedModel.open_view` gives the right one). Attributes every implementation keeps up
    to date:

    name: str                 the model's name in the trace
    text: str                 the committed text y
    ids: list[int]            the tokens of render(prompt) + y
    next_logprobs: Tensor     (V,) float32 log-probs of the token after `ids`
    end_ids: frozenset[int]   tokens that end the answer: EOS, end of turn, and tokens that start a stop string
    banned_ids: frozenset[int]  special tokens that are never proposed
    prompt_tokens, prefix_reused, mode_used: prefill facts for the trace
    whole: bool               every entry of its distributions is the model's (False: a served model's top-k, the
                              rest -inf; a sum over token sets, as the end of the answer, is then asked exactly)
    """
    name: str
    text: str
    ids: list[int]
    next_logprobs: torch.Tensor
    end_ids: frozenset[int]
    banned_ids: frozenset[int]
    whole: bool = True

    def __init__(self):
        # speculative proposals (`draft`): batched forwards that verified drafts, draft tokens verified, and tokens
        # `extend` took from a verified draft instead of a forward of its own
        self.verify_passes = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.scores_from_drafts = 0  # rounds whose scoring forward a verifying forward made unnecessary
        # many decodes at once: forwards shared with other decodes, and the decodes in them (summed over those)
        self.shared_passes = 0
        self.riders = 0
        # choosing an uncertain model's first tokens (selection.py): seconds spent and selections made (the benchmark
        # reads them; the trace stays deterministic)
        self.selection_seconds = 0.0
        self.selections_made = 0
        # token id sets (end, banned, ...) as index tensors on the logits' device, each built once (`writer.token_index`)
        self.token_indexes: dict[str, torch.Tensor] = {}

    # ---- text <-> tokens ----
    @abstractmethod
    def encode(self, y: str) -> list[int]:
        """Token ids of render(prompt) + y, exactly as tokenizing the whole text would give."""

    def encode_many(self, ys: list[str]) -> list[list[int]]:
        """`encode` of each text (a view may tokenize them in one call: a round's candidates, one list)."""
        return [self.encode(y) for y in ys]

    @abstractmethod
    def length(self, y: str) -> int:
        """How many tokens render(prompt) + y is (`len(encode(y))`), read from the rendered prompt and `y` alone, not
        the committed state: a view committing on another thread (catching up in the background) may be measured."""

    @abstractmethod
    def decode_after(self, context: list[int], new: list[int]) -> str:
        """The text tokens `new` add after the tokens `context`, byte for byte (no clean-up)."""

    @abstractmethod
    def vocab_texts(self) -> list[str]:
        """Every token's text as it reads after ordinary text (index = token id)."""

    # ---- forward passes ----
    @abstractmethod
    def extend(self, token: int) -> torch.Tensor:
        """Append one token of this model's own proposal speculatively; returns the next (V,) log-probs."""

    def draft(self, rows: list[list[int]]) -> int:
        """Verify these token rows (drafts written after the committed ids) in one batched forward, so that `extend`
        of a token continuing one of them returns the verified log-probs without a forward of its own; `settle` then
        makes the live state hold what was taken. Returns the positions verified (0: this view does not draft)."""
        return 0

    def verified(self, tokens: list[int]) -> torch.Tensor | None:
        """(len(tokens), V) log-probs a verifying forward (`draft`) of this round computed for these tokens after the
        committed ids (entry j: the distribution after tokens[:j + 1]), keeping their state for a commit; None when
        no draft row starts with them."""
        return None

    def settle(self) -> None:
        """End drafting: the live state holds every token `extend` was given (a draft's computed state adopted)."""

    @abstractmethod
    def rewind(self) -> None:
        """Drop speculative tokens: the state is the committed ids again."""

    @abstractmethod
    def branch(self, rows: int) -> Branch:
        """`rows` continuations after the committed ids, advanced together."""

    @abstractmethod
    def score_rows(self, start: int, rows: list[list[int]], remember: list[bool],
                   wanted: list[dict[int, list[int]]] | None = None) -> list[torch.Tensor]:
        """Feed `rows` after ids[:start] without touching the committed state; per row a (len, V) tensor of
        log-probs (entry j: the distribution after row[:j + 1]). Rows flagged in `remember` may be committed
        next: keep what a commit would compute. `wanted[i]` ({entry: token ids}) says which values the caller
        reads; a view that cannot give whole distributions (a served model) gives those exactly, -inf elsewhere."""

    def token_embeddings(self, ids: list[int]) -> torch.Tensor | None:
        """(len(ids), D) rows of the model's input-embedding matrix for these tokens, on the model's device (one
        gather); None where the weights are not here (a served model): exploration by embedding needs them."""
        return None

    def next_exact(self, tokens: list[int]) -> torch.Tensor:
        """`next_logprobs` with these tokens' values exact (a served model's top-k misses the rest; a local model's
        vector is whole already)."""
        return self.next_logprobs

    @abstractmethod
    def commit(self, y: str, guess: str = "") -> None:
        """Make `y` the committed text; `guess`, text likely to follow it, may be verified on the way (a view that
        does not guess ignores it)."""

    @abstractmethod
    def stats(self) -> tuple[int, int, float, int]:
        """Forward passes (requests), token positions fed (computed), seconds, and prompt tokens a server took from its
        prefix cache, so far."""

    def release(self) -> None:
        """The decode is over: let go of what is kept for later rounds (a KV cache, distributions); the counters and
        the text stay. A view that keeps nothing heavy has nothing to do."""
