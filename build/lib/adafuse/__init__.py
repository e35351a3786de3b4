"""AdaFuse: adaptive word-level ensemble decoding of causal LMs with different tokenizers."""
from .config import DecodeConfig
from .decoder import Decoding
from .ensemble import AdaFuse, greedy
from .errors import (AdafuseError, CancelledError, ConfigError, ModelLoadError, ModelNotFoundError, PromptError,
                     TraceError)
from .models import BUNDLED, DEFAULT_PAIR, PAPER_MODELS, LoadedModel, get_model, load_model
from .trace import Candidate, ModelStep, Round, Trace

__all__ = ["AdaFuse", "Decoding", "DecodeConfig", "greedy", "Trace", "Round", "Candidate", "ModelStep",
           "LoadedModel", "load_model", "get_model", "BUNDLED", "DEFAULT_PAIR", "PAPER_MODELS", "AdafuseError",
           "ConfigError", "PromptError", "ModelNotFoundError", "ModelLoadError", "TraceError", "CancelledError"]
