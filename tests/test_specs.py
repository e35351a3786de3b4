"""Model specs (adafuse/models/specs.py): NAME@DEVICE[,DTYPE] places a model; a bad device or dtype is a typed error."""
import pytest
import torch

from adafuse import ModelLoadError
from adafuse.models import parse_spec


def test_model_specs_place_models_and_reject_bad_devices():
    assert parse_spec("gemma3-270m") == ("gemma3-270m", None, None)
    assert parse_spec("gemma3-270m@cpu,bfloat16") == ("gemma3-270m", "cpu", "bfloat16")
    for bad, msg in (("gemma3-270m@gpu", "not a device"), ("gemma3-270m@cpu,int3", "unknown dtype")):
        with pytest.raises(ModelLoadError, match=msg):
            parse_spec(bad)
    if torch.cuda.device_count() < 8:
        with pytest.raises(ModelLoadError, match="CUDA device"):
            parse_spec("gemma3-270m@cuda:7")
