"""A model's views that sit unused (a decode paused, cancelled or left behind): past a byte budget they let go of KV."""
from __future__ import annotations

import threading
import time
import weakref

# KV bytes one model's idle views may keep together: past it, the least recently used let go of their caches, each
# rebuilt from its tokens (through the prefix store) if its decode goes on. 256 MiB: one 5,000-word prompt of a 135M
# model (220 MB), a 2k-token prompt of an 8B model; what a closed tab's decode held stays in memory for an hour
# otherwise (gradio keeps its state), one paused decode per visitor.
IDLE_VIEW_BYTES = 2**28
# A view is idle once this many seconds passed since its last call: a decode that is running touches its views every
# round, so only decodes that stopped moving give their memory back.
IDLE_SECONDS = 30.0


class IdleViews:
    """The open views of one local model (`LocalModel.idle`), by weak reference: a view nobody holds any more is
    gone with its memory anyway. `trim` parks the least recently used idle views while together they hold more than
    `max_bytes`; a view in a call right now is never parked."""

    def __init__(self, max_bytes: int = IDLE_VIEW_BYTES, idle_seconds: float = IDLE_SECONDS):
        if max_bytes < 0 or idle_seconds < 0:
            raise ValueError(f"max_bytes={max_bytes}, idle_seconds={idle_seconds}: both must be ≥ 0 (0 parks every "
                             "view as soon as it is idle)")
        self.max_bytes, self.idle_seconds = max_bytes, idle_seconds
        self.views: weakref.WeakSet = weakref.WeakSet()
        self.lock = threading.Lock()

    def add(self, view) -> None:
        with self.lock:
            self.views.add(view)

    def trim(self) -> int:
        """Park idle views, least recently used first, until the idle ones hold at most `max_bytes`; how many."""
        now = time.monotonic()
        with self.lock:
            idle = sorted((v for v in list(self.views) if now - v.last_used >= self.idle_seconds),
                          key=lambda v: v.last_used)
        sized = [(v, v.held_bytes(wait=False)) for v in idle]
        sized = [(v, n) for v, n in sized if n]  # a view in a call (None) is not idle; one holding nothing stays
        total, parked = sum(n for _, n in sized), 0
        for view, size in sized:
            if total <= self.max_bytes:
                break
            if view.park():
                total -= size
                parked += 1
        return parked

    def held_bytes(self) -> int:
        """KV bytes the open views hold now (idle or not, the prefix store's share left out)."""
        with self.lock:
            views = list(self.views)
        return sum(v.held_bytes() for v in views)
