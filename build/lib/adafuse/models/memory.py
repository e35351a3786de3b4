"""Memory freed by a decode but still held by allocators, handed back to the system: glibc's heap, PyTorch's CUDA cache."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

import torch


@functools.cache
def _malloc_trim():
    """glibc's `malloc_trim`, or None (another C library: musl, macOS, Windows)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def free_unused_memory() -> bool:
    """Hand memory that no tensor uses any more back to the system. On the CPU, glibc keeps the pages of freed blocks
    inside its heaps (a KV cache grows by one new block per token, so a long prompt's cache leaves GBs of free holes
    between blocks still in use) until `malloc_trim` returns them; on CUDA, PyTorch keeps freed blocks cached. Cheap
    enough after each decode (tens of ms at a few GB of heap). True where the C library could trim."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
