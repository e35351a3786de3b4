"""Typed errors users can catch: every message says what to do next."""


class AdafuseError(Exception):
    """Base class of every error the library raises on purpose."""


class ConfigError(AdafuseError, ValueError):
    """A decoding setting is out of range or settings do not fit together."""


class PromptError(AdafuseError, ValueError):
    """The prompt is empty or does not fit a model's context window."""


class ModelNotFoundError(AdafuseError, LookupError):
    """A model name is neither bundled, a local path, nor a reachable Hugging Face id."""


class ModelLoadError(AdafuseError, RuntimeError):
    """A model was found but could not be loaded as a causal language model."""


class TraceError(AdafuseError, ValueError):
    """A trace file or dict is not a valid AdaFuse trace."""


class CancelledError(AdafuseError):
    """A decode was stopped by the caller between rounds."""


class ServerError(AdafuseError, RuntimeError):
    """A model served by an inference engine is down, too slow, or lacks a feature the decoder needs."""


class ForwardError(AdafuseError, RuntimeError):
    """A forward this decode shared with others failed, and this decode's cache could not be put back as it was."""


class ReplayError(AdafuseError, RuntimeError):
    """Replaying a trace's rounds did not reproduce them (other models or versions, a nondeterministic device)."""
