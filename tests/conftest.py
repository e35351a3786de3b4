"""Shared fixtures (the real bundled pair, loaded once per session) and the test tiers.

Every test is in exactly one tier (pyproject.toml registers them):
  unit     toy models and hand-built traces: no real model, browser or server (`./dev test -m unit`, under a minute)
  models   the real bundled pair (SmolLM2-135M-Instruct + Gemma-3-270M) or another real model
  browser  the app in Chromium: on the toy models (tests/test_app_browser.py), on the real pair (test_app_e2e.py)
  served   a model served by vLLM (tests/test_served.py)
A module's `pytestmark` or a test's own mark names its tier; otherwise a test that asks for a fixture holding a real
model (`pair`, directly or through another fixture) is in `models`, and every other test is in `unit`. A unit test
that loads real weights anyway fails with a message saying to mark it.
"""
import contextlib
import os

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

TIERS = ("unit", "models", "browser", "served")
# fixtures that hold a real model (loaded through from_pretrained); fixtures built on them count through the closure
REAL_MODEL_FIXTURES = {"pair", "tiny_bundled"}


def tier(item: pytest.Item) -> str:
    """The test's one tier (collection has checked there is exactly one)."""
    return next(m.name for m in item.iter_markers() if m.name in TIERS)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by these marks
def pytest_collection_modifyitems(config, items):
    problems = []
    for item in items:
        named = {m.name for m in item.iter_markers() if m.name in TIERS}
        real = REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
        if not named:
            item.add_marker("models" if real else "unit")
        elif len(named) > 1:
            problems.append(f"{item.nodeid}: marked {', '.join(sorted(named))}; a test has exactly one tier")
        elif named == {"unit"} and real:
            problems.append(f"{item.nodeid}: marked unit but uses {', '.join(sorted(real))} (a real model)")
    if problems:
        raise pytest.UsageError("test tiers:\n  " + "\n  ".join(problems))
    for item in items:  # whole files to a worker (`./dev test` runs --dist loadgroup), files sharing a server together
        item.add_marker(pytest.mark.xdist_group(SAME_WORKER.get(item.path.name, item.path.name)))
    items.sort(key=slow_first)  # stable: every file keeps its tests' order


# the slowest files first (as measured by a full run on 2 cores, 2026-12-05): `./dev test` hands whole files to its 2
# workers in collection order (--dist loadgroup, a group per file but SAME_WORKER's), so the long ones start at once and the short ones fill in around them
SLOW_FIRST = ("test_app_browser.py", "test_served.py", "test_app_e2e.py", "test_lm_eval.py", "test_readme.py",
              "test_decoder.py", "test_parallel.py", "test_speculation.py", "test_faults.py", "test_session.py",
              "test_public_browser.py")


# files whose session fixture starts a server process: on one worker, it starts once (`adafuse serve` on the pair: ~20 s)
SAME_WORKER = {"test_lm_eval.py": "adafuse_server", "test_openai_server.py": "adafuse_server",
               "test_readme.py": "adafuse_server"}


def slow_first(item: pytest.Item) -> int:
    """A test's place in the run: the files of SLOW_FIRST in that order, then the rest as collected."""
    name = item.path.name
    return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)


@contextlib.contextmanager
def no_real_weights(nodeid: str):
    """Loading any transformers model fails: a unit test runs on toy models only."""
    from transformers import PreTrainedModel
    real = PreTrainedModel.__dict__["from_pretrained"]

    def refuse(cls, *args, **kwargs):
        raise AssertionError(f"{nodeid} loads a real model ({cls.__name__}): mark it @pytest.mark.models, or use "
                             "the toy models of tests/toy.py")

    PreTrainedModel.from_pretrained = classmethod(refuse)
    try:
        yield
    finally:
        PreTrainedModel.from_pretrained = real


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around setup, call and teardown (module fixtures included) of every unit test."""
    if tier(item) != "unit":
        return (yield)
    with no_real_weights(item.nodeid):
        return (yield)


@pytest.fixture(scope="session")
def pair():
    from transformers.utils import logging
    logging.disable_progress_bar()
    from adafuse import DEFAULT_PAIR, get_model
    return [get_model(n) for n in DEFAULT_PAIR]


@pytest.fixture(scope="session")
def tiny_bundled(tmp_path_factory):
    """The bundled pair's architectures, tokenizers and settings with tiny random weights, saved as folders and loaded
    by path as a user's models are (tests/families.py `tiny_bundled_folders`): for tests of how decodes run (side by
    side, ...), at a few milliseconds a forward."""
    from adafuse import get_model
    from tests.families import tiny_bundled_folders
    return [get_model(str(f)) for f in tiny_bundled_folders(tmp_path_factory.mktemp("tiny-bundled"))]


@pytest.fixture(scope="session")
def hamlet(pair):
    """A short decode on the real pair and a later round with more than one candidate (to branch from, to explain):
    per token, where the bare question runs into a list (per word, the default, answers in one round)."""
    from adafuse import AdaFuse, DecodeConfig
    tr = AdaFuse(pair, DecodeConfig(stop=("\n",), max_new_words=12, normalize="token")).generate(
        "Question: Who wrote Hamlet?\nAnswer:")
    return tr, next(r.index for r in tr.rounds if r.index > 0 and len(r.candidates) > 1)


@pytest.fixture(scope="session")
def chromium():
    """Chromium under Playwright, one for the session's browser tests (tests/browser.py)."""
    from tests.browser import launch
    yield from launch()


@pytest.fixture(scope="session")
def adafuse_server(tmp_path_factory):
    """`python -m adafuse serve` on the bundled pair as README.md starts it (no key, every decode setting at its
    default; 4 decodes at once), started once for the session's command-line tests: README's server examples, the
    openai client's and lm-eval's `local-completions` (each request sends the settings it needs). Yields (base URL,
    its log file)."""
    from tests.serving import adafuse_serve
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with adafuse_serve(["--concurrency", "4"], log, {"HF_HUB_OFFLINE": "1"}) as base:
        yield base, log
