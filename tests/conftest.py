"""Shared fixtures: the real bundled pair, loaded once per test session."""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
from adafuse.harness.tasks import DEFAULT_DATA as SHARED  # noqa: E402  ($ADAFUSE_DATA or ../shared/data)

assert (SHARED / "nq" / "prompt.txt").exists(), f"benchmark data not found at {SHARED}: set ADAFUSE_DATA"


@pytest.fixture(scope="session")
def pair():
    from transformers.utils import logging
    logging.disable_progress_bar()
    from adafuse import DEFAULT_PAIR, get_model
    return [get_model(n) for n in DEFAULT_PAIR]
