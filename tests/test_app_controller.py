"""The app's non-UI logic (app/controller.py): stop parsing, model-count checks, model placement, the loaded-models
table, friendly errors, step mode across settings changes."""
import pytest

import app.controller as controller
from adafuse.errors import ConfigError, ModelLoadError, PromptError
from app.controller import (Explorer, device_choices, friendly, load_examples, loaded_frame, model_specs, unload,
                            validate_models)


def test_model_count_is_checked():
    assert validate_models([" a ", "b"]) == ["a", "b"]
    for bad in ([], ["a"], ["a", "b", "c", "d", "e"], None):
        with pytest.raises(ConfigError):
            validate_models(bad)


def test_examples_cover_the_five_categories_twice():
    cats = [e["category"] for e in load_examples()]
    for c in ("open-domain QA", "reading comprehension", "arithmetic", "translation", "free chat"):
        assert cats.count(c) >= 2


def test_friendly_errors_never_show_a_stack_trace():
    assert friendly(PromptError("the prompt is empty")) == "the prompt is empty"
    assert "ran out of memory" in friendly(RuntimeError("CUDA out of memory. Tried to allocate"))
    assert "still running" in friendly(KeyError("x"))
    with pytest.raises(ConfigError):
        Explorer().open_example(1, "adafuse")


def test_device_for_all_models_goes_only_where_a_name_has_no_placement():
    assert model_specs([" a ", "b@cpu"]) == ["a", "b@cpu"]
    assert model_specs(["a", "b"], "default") == ["a", "b"]
    assert model_specs(["a", "b@cpu,bfloat16"], "cpu") == ["a@cpu", "b@cpu,bfloat16"]
    with pytest.raises(ConfigError):
        model_specs(["a"], "cpu")


def test_bad_placements_raise_typed_errors_before_anything_loads(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(controller.MODELS, "get", lambda n, **kw: pytest.fail(f"{n} should not load"))
    assert model_specs(["a", "b"], "cuda:0") == ["a@cuda:0", "b@cuda:0"]
    for names, device, says in ((["a@gpu", "b"], None, "is not a device"), (["a", "b"], "cuda:3", "1 CUDA device"),
                                (["a@cpu,int8", "b"], "cpu", "unknown dtype")):
        with pytest.raises(ModelLoadError, match=says) as err:
            Explorer().load(names, device)
        assert friendly(err.value) == str(err.value)  # shown on the page as it is


def test_device_menu_follows_the_cuda_devices(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert device_choices() == ["default", "cpu"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_choices() == ["default", "cpu", "cuda:0", "cuda:1", "auto"]


def test_load_passes_the_placed_specs_to_get_model(monkeypatch):
    seen = []

    class Fake:
        def __init__(self, spec):
            self.spec = spec

        def describe(self):
            return f"{self.spec} ready"

    monkeypatch.setattr(controller.MODELS, "get", lambda n, trust_remote_code: seen.append((n, trust_remote_code))
                        or Fake(n))
    assert Explorer().load(["a", "b@cpu"], "cpu") == "✓ a@cpu ready\n✓ b@cpu ready"
    assert Explorer(trust_remote_code=True).load(["c", "d"]) == "✓ c ready\n✓ d ready"  # the page's switch
    assert seen == [("a@cpu", False), ("b@cpu", False), ("c", True), ("d", True)]


class FakeLoaded:
    def __init__(self, name, device):
        self.name, self.device = name, device

    def info(self):
        return {"model": self.name, "device": self.device, "dtype": "float32", "memory_mib": 512.0,
                "load_seconds": 1.5, "source": f"/models/{self.name}", "notes": "inner layers as W·xᵀ"}


def test_loaded_models_table(monkeypatch):
    frame = loaded_frame([FakeLoaded("a", "cpu"), FakeLoaded("b", "cuda:0, cuda:1")])
    assert list(frame.columns) == ["model", "device", "dtype", "MiB", "load s"]
    assert frame.to_dict("records")[1] == {"model": "b", "device": "cuda:0, cuda:1", "dtype": "float32",
                                           "MiB": 512.0, "load s": 1.5}
    empty = loaded_frame([])
    assert empty.empty and list(empty.columns) == list(frame.columns)
    monkeypatch.setattr(controller.MODELS, "loaded", lambda: [FakeLoaded("c", "cpu")])
    assert loaded_frame()["model"].tolist() == ["c"]  # the app's registry by default


def test_unload_says_what_it_did(monkeypatch):
    gone = []
    monkeypatch.setattr(controller.MODELS, "unload", lambda n: n == "a" and not gone.append(n))
    assert "unloaded a" in unload("a") and gone == ["a"]
    assert "not loaded" in unload("b")
    with pytest.raises(ConfigError):
        unload(None)


def test_the_status_says_which_cap_stopped_and_who_read_a_chat_prompt_raw():
    from adafuse import Trace
    from app.controller import stop_note
    t = Trace(prompt="p", models=["a", "b"], settings={"mode": "chat"},
              prompt_modes={"a": "chat", "b": "chat (no chat template: a User/Assistant transcript)"},
              stop_reason="max_new_tokens")
    note = stop_note(t)
    assert "Max new tokens" in note and "b has no chat template: read as a User/Assistant transcript" in note
    assert "a has" not in note
    t.settings, t.stop_reason = {"mode": "raw"}, "max_new_words"
    assert stop_note(t) == "stop: reached Max new words"


def test_the_same_model_twice_is_refused_with_a_reason():
    with pytest.raises(ConfigError, match="picked twice"):
        validate_models(["a", "b", "a"])
    assert validate_models(["a@cpu", "a"]) == ["a@cpu", "a"]  # copies placed apart are different members


def test_remote_code_is_refused_where_the_server_does_not_allow_it(monkeypatch):
    """On a public Space a visitor's "Trust remote code" would run any repository's Python on the server: off there
    unless the operator turns it on; on one's own machine on unless turned off."""
    from app.controller import remote_code_allowed
    monkeypatch.delenv("ADAFUSE_ALLOW_REMOTE_CODE", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert remote_code_allowed()
    monkeypatch.setenv("SPACE_ID", "user/space")
    assert not remote_code_allowed()
    ex = Explorer(trust_remote_code=True)
    with pytest.raises(ConfigError, match="ADAFUSE_ALLOW_REMOTE_CODE"):
        ex.load(["smollm2-135m-instruct", "gemma3-270m"])
    assert Explorer(trust_remote_code=False).trusted is False  # untrusting is always fine
    monkeypatch.setenv("ADAFUSE_ALLOW_REMOTE_CODE", "1")
    assert remote_code_allowed() and Explorer(trust_remote_code=True).trusted
    monkeypatch.delenv("SPACE_ID")
    monkeypatch.setenv("ADAFUSE_ALLOW_REMOTE_CODE", "0")
    assert not remote_code_allowed()


def test_a_branch_from_the_candidate_already_chosen_is_refused_before_any_model_loads():
    from adafuse.trace import Candidate, ModelStep, Round, Trace
    r = Round(index=0, steps=[ModelStep("m", "explore", [0.1], [0, 1])], chosen=1, winner=1, text=" y", words=1,
              seconds=0.0, candidates=[Candidate(" x", False, ["m"], {}, {}, None, 1),
                                       Candidate(" y", False, ["m"], {}, {}, None, 1)])
    ex = Explorer(trace=Trace(prompt="p", models=["no-such-model"], settings={}, prompt_modes={}, rounds=[r],
                              output=" y"))
    with pytest.raises(ConfigError, match="round 0 already chose"):
        next(ex.branch(0, 1))


def test_step_mode_keeps_its_rounds_when_settings_change(pair, monkeypatch):
    """Live settings apply from the next round (recorded in the trace); a new prompt, models or mode asks for a
    confirmation (a second press) before anything is dropped."""
    from dataclasses import replace

    from adafuse import DEFAULT_PAIR, DecodeConfig
    from adafuse.models import default_registry
    monkeypatch.setattr(controller, "MODELS", default_registry())  # the pair this session loaded, not a second copy
    names, prompt = list(DEFAULT_PAIR), "The history of Rome began"
    cfg = DecodeConfig(max_new_words=30)
    ex = Explorer()
    assert ex.plan(names, cfg, prompt) == ("new", "")
    d = ex.begin(names, cfg, prompt, resume=True)
    for _ in range(3):
        d.step()
    d.propose()
    faster = replace(cfg, tau=0.3, branches=2)
    assert ex.plan(names, faster, prompt) == ("continue", "τΔ 0.7 → 0.3, B 3 → 2")
    assert ex.begin(names, faster, prompt, resume=True) is d
    assert d.trace.changes == [{"from_round": 4, "settings": {"tau": 0.3, "branches": 2}}]
    assert len(d.trace.rounds) == 3 and d.pending is not None  # nothing thrown away
    assert ex.plan(names, faster, prompt + " Be brief.") == ("confirm", "the prompt")
    assert ex.plan(names, replace(faster, mode="chat"), prompt) == ("confirm", "the prompt mode")
    assert ex.plan(names, replace(faster, mode="chat"), prompt) == ("new", "")  # pressed again: confirmed
    assert ex.request_cancel() is False and not d.done  # nothing runs: the decode waits as it is for the next Step
    ex.running = True
    assert ex.request_cancel() is True and ex.cancel_requested and not d.done  # a Run stops between rounds, kept
    from adafuse import Trace
    again = Trace.from_dict(d.trace.to_dict())  # the change survives export and load
    assert again.changes == d.trace.changes


def test_an_opened_trace_asks_before_a_run_replaces_it_and_a_moved_setting_applies_next_round(tmp_path):
    from dataclasses import replace
    from adafuse import AdaFuse, DecodeConfig
    from tests.toy import toy_pair
    cfg = DecodeConfig(max_new_words=6)
    ex = Explorer()
    ex.load_trace(AdaFuse(list(toy_pair()), cfg).generate("Q").save(tmp_path / "t.json"))
    kind, what = ex.plan(["a", "b"], cfg, "Q")
    assert (kind, what) == ("replace", "the loaded trace (t.json)")
    assert ex.plan(["a", "b"], cfg, "Q") == ("new", "")  # pressed again: confirmed
    d = AdaFuse(list(toy_pair()), cfg).start("Q")
    ex.decoding, ex.trace, ex.key, ex.opened = d, d.trace, (("a", "b"), cfg, "Q"), None
    # moved during a Run: the run applies the live part between two rounds; the prompt mode waits for a new decode
    assert ex.offer_live(replace(cfg, tau=0.3, mode="chat")) == (["the prompt mode"], True)
    assert ex.apply_live(d) == "τΔ 0.7 → 0.3" and ex.live_config is None and ex.key[1].tau == 0.3
    assert d.trace.changes == [{"from_round": 0, "settings": {"tau": 0.3}}]
    assert ex.apply_live(d) == ""
    assert ex.offer_live(replace(cfg, tau=0.3, weights=(1.0, 2.0, 3.0))) == ([], True)  # three weights, two models
    assert ex.apply_live(d).startswith("not applied: weights has 3 values for 2 models")  # said, the run goes on
    with pytest.raises(ConfigError, match="ADAFUSE_DECODE_SLOTS='two'"):
        controller.decode_slots("two")


def test_step_after_a_finished_decode_asks_before_starting_over():
    from adafuse import AdaFuse, DecodeConfig
    from tests.toy import toy_pair
    cfg = DecodeConfig(max_new_words=6)
    d = AdaFuse(list(toy_pair()), cfg).start("Q")
    while not d.done:
        d.step()
    ex = Explorer()
    ex.decoding, ex.trace, ex.key = d, d.trace, (("a", "b"), cfg, "Q")
    assert ex.plan(["a", "b"], cfg, "Q", step=True) == ("finished", "")
    assert ex.plan(["a", "b"], cfg, "Q", step=True) == ("new", "")  # pressed again: confirmed
    ex.confirm_key = None
    assert ex.plan(["a", "b"], cfg, "Q") == ("new", "")  # ▶ Run decodes again at once, as it always did


def test_a_slots_decodes_stop_at_the_servers_deadline(monkeypatch):
    """A visitor's decodes hold a slot at most the server's --timeout default (adafuse.many.DEFAULT_DEADLINE_S):
    then each stops before its next round, keeping its words, its stop reason "deadline" (said as "the time limit")."""
    from adafuse import AdaFuse, DecodeConfig
    from adafuse.many import DEFAULT_DEADLINE_S
    from tests.toy import toy_pair
    ex = Explorer()
    clock = [1000.0]
    monkeypatch.setattr(controller.time, "monotonic", lambda: clock[0])
    ex.hold_slot()
    assert ex.deadline == 1000.0 + DEFAULT_DEADLINE_S
    d = AdaFuse(list(toy_pair()), DecodeConfig(max_words=1, max_new_words=6)).start("Q")
    d.step()
    assert not d.done
    clock[0] += DEFAULT_DEADLINE_S + 1
    trace = ex._finish(d)
    assert trace.stop_reason == "deadline" and len(trace.rounds) == 1 and trace.output
    assert "the time limit" in controller.stop_note(trace)


def test_the_comparisons_run_with_a_gate_set_on_the_page(tmp_path):
    """A gate picked for the fused decode: the comparisons that weigh nothing (token-union refuses a gate) run
    without it, those that weigh keep it."""
    from adafuse import AdaFuse, DecodeConfig
    from adafuse.gate import Gate
    from app.controller import COMPARE_METHODS, compared
    from tests.toy import toy_pair
    path = tmp_path / "gate.json"
    Gate.zeros(["a", "b"]).save(path)
    cfg = DecodeConfig(max_new_words=3, gate=str(path), normalize="token")
    for label in COMPARE_METHODS:
        trace = AdaFuse(list(toy_pair()), compared(cfg, label)).generate("Q")
        assert trace.output is not None
        assert (compared(cfg, label).gate == str(path)) == (compared(cfg, label).method in ("adafuse", "beam") or
                                                            compared(cfg, label).method.startswith("fixed-span"))
