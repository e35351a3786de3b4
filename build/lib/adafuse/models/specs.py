"""Model specs as users write them: `MODEL[@DEVICE[,DTYPE]]` for a local model, `vllm:URL#NAME` for a served one."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ..errors import ModelLoadError, ModelNotFoundError
from .catalog import BUNDLED

SERVED_SPEC = re.compile(r"^(vllm|openai):(?P<url>https?://[^#?\s]+?)/?(?:#(?P<name>[^?]*))?"
                         r"(?:\?tokenizer=(?P<tok>.+))?$")
_DEVICE = re.compile(r"^(cpu|auto|mps|cuda(:\d+)?)$")
_DTYPES = ("float32", "bfloat16", "float16")
# What an empty or unknown name is told to give instead.
KINDS = f"a bundled name ({', '.join(BUNDLED)}), a Hugging Face id or a local path"


def is_served_spec(name) -> bool:
    """`name` names a model on an inference server (`vllm:…` or `openai:…`)."""
    return isinstance(name, str) and name.strip().startswith(("vllm:", "openai:"))


def parse_spec(spec: str) -> tuple[str, str | None, str | None]:
    """`MODEL[@DEVICE[,DTYPE]]` -> (model, device, dtype): `MODEL@cuda:1`, `ORG/NAME@auto,bfloat16` (auto: spread over
    every GPU), `MODEL@cpu`. Without `@` the defaults apply; a served model's spec is returned whole (its server
    places it)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelNotFoundError(f"empty model name: give {KINDS}")
    spec = spec.strip()
    name, at, place = spec.rpartition("@")
    if not at or not name or Path(spec).exists() or is_served_spec(spec):
        return spec, None, None
    device, _, dtype = place.partition(",")
    device, dtype = device.strip().lower(), dtype.strip().lower() or None
    if not _DEVICE.match(device):
        raise ModelLoadError(f"{spec!r}: {device!r} is not a device; write MODEL@cpu, MODEL@cuda:1 or MODEL@auto")
    if dtype is not None and dtype not in _DTYPES:
        raise ModelLoadError(f"{spec!r}: unknown dtype {dtype!r}; use one of {', '.join(_DTYPES)}")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"{spec!r}: this machine has no MPS device; use cpu")
    if device.startswith("cuda") or device == "auto":
        n = torch.cuda.device_count()
        index = int(device.split(":")[1]) if ":" in device else 0
        if n == 0 or index >= n:
            raise ModelLoadError(f"{spec!r}: this machine has {n} CUDA device(s); use "
                                 + (f"cuda:0…cuda:{n - 1}" if n else "cpu"))
    return name.strip(), device, dtype
