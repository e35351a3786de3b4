"""Settings changed during a decode: which ones may change, and from which round they count."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    from .config import DecodeConfig

# settings that only steer the rounds still to come (`Decoding.reconfigure`)
LIVE_SETTINGS = ("tau", "max_words", "branches", "diversity", "exploration", "explore_lambda", "max_new_words",
                 "max_new_tokens", "weights", "gate", "speculate", "draft_lookup",
                 "normalize", "allow_empty")


class LiveSettings:
    """The settings a decode decides its rounds with (`config`), and a change made while a round was pending: that
    round keeps its settings, its commit included, and the change counts from the next round on."""

    def __init__(self, config: "DecodeConfig"):
        self.config = config
        self.waiting: "DecodeConfig | None" = None  # changed while a round was pending

    def changes(self, config: "DecodeConfig") -> dict:
        """The live settings `config` changes against the latest ones, by name; a ConfigError when it changes any other
        (models, prompt, mode, stop strings, method: those need a new decode)."""
        old, new = (self.waiting or self.config).to_dict(), config.to_dict()
        fixed = sorted(k for k in new if k not in LIVE_SETTINGS and new[k] != old[k])
        if fixed:
            raise ConfigError(f"{', '.join(fixed)} cannot change during a decode: start a new one")
        return {k: new[k] for k in LIVE_SETTINGS if new[k] != old[k]}

    def change(self, config: "DecodeConfig", pending: bool) -> None:
        """From the next undecided round on: the round after the pending one, if one is `pending`."""
        if pending:
            self.waiting = config
        else:
            self.config = config

    def after_commit(self) -> None:
        """A round was appended: a change that waited for it counts from now on."""
        if self.waiting is not None:
            self.config, self.waiting = self.waiting, None
