"""Models: the model type, local and served models, the registry of loaded models, and each model's view of a decode."""
from .base import LoadedModel
from .catalog import BUNDLED, DEFAULT_PAIR, PAPER_MODELS
from .local import LocalModel, load_model
from .memory import free_unused_memory
from .registry import ModelRegistry, default_registry, get_model, loaded_models, unload_model
from .served import ServedModel
from .specs import is_served_spec, parse_spec

__all__ = ["LoadedModel", "LocalModel", "ServedModel", "ModelRegistry", "default_registry", "get_model",
           "loaded_models", "unload_model", "load_model", "free_unused_memory", "parse_spec", "is_served_spec", "BUNDLED",
           "DEFAULT_PAIR", "PAPER_MODELS"]
