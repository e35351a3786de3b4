"""ZeroGPU: `gpu` is `spaces.GPU` on a ZeroGPU Space and leaves functions unchanged anywhere else.

Import this module before torch (app.py does): on ZeroGPU, importing `spaces` patches torch's CUDA."""
from __future__ import annotations

from typing import Callable


def _zero_gpu() -> bool:
    try:  # on a ZeroGPU Space (SPACES_ZERO_GPU set) the import patches torch: models go to "cuda" at startup
        import spaces
    except ImportError:
        return False
    return bool(spaces.config.Config.zero_gpu)


ZERO_GPU: bool = _zero_gpu()


def gpu(fn: Callable | None = None, *, duration: int = 120) -> Callable:
    """`@gpu` or `@gpu(duration=S)`: on a ZeroGPU Space each call of `fn` (a function or a generator function) gets a
    GPU for up to `duration` seconds; elsewhere `fn` itself is returned."""
    if fn is None:
        return lambda f: gpu(f, duration=duration)
    if not ZERO_GPU:
        return fn
    import spaces
    return spaces.GPU(fn, duration=duration)
