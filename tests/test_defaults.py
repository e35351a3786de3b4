"""One set of defaults (issue 41): the library's `DecodeConfig`, the command line (`adafuse run`), `adafuse serve`,
lm-eval's model_args and the app's page start from the same decode settings."""
import pytest

from adafuse import DecodeConfig

SHARED = ("tau", "max_words", "branches", "diversity", "exploration", "normalize", "allow_empty", "speculate",
          "draft_lookup", "method", "weights", "gate", "mode")


def _shared(cfg: DecodeConfig) -> dict:
    return {k: getattr(cfg, k) for k in SHARED}


@pytest.mark.unit
def test_every_door_starts_from_the_librarys_decode_settings(monkeypatch):
    from adafuse.cli import build_parser, decode_config
    from adafuse.harness import lm_eval_model
    from adafuse.server.cli import build_parser as serve_parser
    library = _shared(DecodeConfig())
    assert library["normalize"] == "word" and library["allow_empty"] is False  # measured: docs/defaults.md
    run = build_parser().parse_args(["run", "--prompt", "Q"])
    assert _shared(decode_config(run)) == library
    assert _shared(decode_config(serve_parser().parse_args([]))) == library
    monkeypatch.setattr(lm_eval_model, "ModelRegistry", lambda: type("R", (), {"get": lambda *a, **k: None})())
    assert _shared(lm_eval_model.AdaFuseLM(models="a+b").config) == library


@pytest.mark.unit
def test_the_apps_page_starts_from_the_librarys_decode_settings():
    from app.ui import build_demo
    from app.views import NORMALIZE
    demo = build_demo()
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    d = DecodeConfig()
    page = {"tau": by_id["af-tau"].value, "max_words": by_id["af-m"].value,
            "branches": by_id["af-b"].value, "diversity": by_id["af-diversity"].value,
            "exploration": by_id["af-exploration"].value, "normalize": NORMALIZE[by_id["af-normalize"].value],
            "speculate": by_id["af-speculate"].value, "allow_empty": by_id["af-allow-empty"].value}
    assert page == {k: getattr(d, k) for k in page}
