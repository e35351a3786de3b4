"""One browser session's lock: its Run flag and the settings a Run takes between rounds change under it, each session
under its own, so no visitor ever waits on another's."""
from __future__ import annotations

import threading


class SessionLock:
    """A `threading.Lock` that a copy of its session does not share: Gradio deep-copies a session's initial state
    and ZeroGPU pickles the session into a lease; each copy gets a lock of its own."""

    def __init__(self):
        self._lock = threading.Lock()

    def __enter__(self):
        return self._lock.__enter__()

    def __exit__(self, *exc):
        return self._lock.__exit__(*exc)

    def __deepcopy__(self, memo) -> "SessionLock":
        return SessionLock()

    def __reduce__(self):
        return SessionLock, ()
