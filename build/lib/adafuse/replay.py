"""Counterfactual decodes: replay a trace's rounds with the same models, then commit another candidate."""
from __future__ import annotations

from typing import Sequence

from .config import DecodeConfig
from .decoder import Decoding, unique_names
from .errors import ConfigError, ReplayError
from .models import LoadedModel, get_model
from .report import candidate_label
from .trace import Trace


def branch_from(models: Sequence[LoadedModel | str], trace: Trace, round_index: int, candidate: int,
                parallel: bool | None = None, threads: int | None = None) -> Decoding:
    """A counterfactual decode of `trace`'s prompt: rounds 0..round_index-1 are decided again by `models` (the models
    the trace names, in its order) under the trace's settings and mid-decode changes, each committing the candidate
    the original committed (its overrides included); round `round_index` then commits candidate `candidate` of its
    pool. Returns the Decoding ready to continue (`step()` until `done`). Raises ConfigError for indices outside the
    trace and ReplayError when a replayed round does not reproduce the original (other models or versions)."""
    n = len(trace.rounds)
    if not n:
        raise ConfigError("this trace has no rounds to branch from: decode at least one round first")
    if isinstance(round_index, bool) or not isinstance(round_index, int) or not 0 <= round_index < n:
        raise ConfigError(f"round_index={round_index!r} is not a round of this trace: pick 0..{n - 1}")
    pool = trace.rounds[round_index].candidates
    if isinstance(candidate, bool) or not isinstance(candidate, int) or not 0 <= candidate < len(pool):
        raise ConfigError(f"candidate={candidate!r} is not a candidate of round {round_index}: "
                          f"pick 0..{len(pool) - 1}")
    models = [get_model(m) if isinstance(m, str) else m for m in ([models] if isinstance(models, (str, LoadedModel))
                                                                  else models)]
    names = unique_names(models)
    if names != trace.models:
        raise ConfigError(f"this trace was decoded by {', '.join(trace.models)}; got {', '.join(names) or 'none'}: "
                          "pass the trace's models in its order")
    d = Decoding(models, DecodeConfig.from_dict(trace.settings), trace.prompt, parallel, threads)
    changes: dict[int, dict] = {}
    for ch in trace.changes:
        changes.setdefault(ch["from_round"], {}).update(ch["settings"])
    try:
        for i, orig in enumerate(trace.rounds[: round_index + 1]):
            if i in changes:  # settings changed mid-decode, from the round they were changed at
                d.reconfigure(DecodeConfig.from_dict({**d.config.to_dict(), **changes[i]}))
            r = d.propose()
            want = orig.candidates[candidate if i == round_index else orig.chosen]
            labels = [candidate_label(c.text, c.eos) for c in r.candidates]
            match = next((j for j, c in enumerate(r.candidates) if (c.text, c.eos) == (want.text, want.eos)), None)
            why = ""
            if match is None:
                why = f"{candidate_label(want.text, want.eos)!r} is not in its pool {labels}"
            elif i < round_index and not orig.overridden and match != r.winner:
                why = (f"the scores now pick {labels[r.winner]!r}, the original picked "
                       f"{candidate_label(want.text, want.eos)!r}")
            if why:
                raise ReplayError(f"the replay diverged at round {i}: {why}; branch with the models (and versions) "
                                  "that decoded the trace, or decode the prompt again")
            d.commit(match if i == round_index or orig.overridden else None)
            if d.done and i < round_index:
                raise ReplayError(f"the replay diverged at round {i}: it stopped ({d.trace.stop_reason}) where the "
                                  "original went on; branch with the models that decoded the trace")
    except BaseException:
        d.cancel()
        raise
    return d
