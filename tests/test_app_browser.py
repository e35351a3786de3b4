"""What the page does, in a real browser: the app on the toy models (tests/toy_app.py: the same app.py, registry and
controller, decodes of about a second) in Chromium; fixtures `server` and `page` below, helpers in tests/browser.py. The bundled pair's end-to-end tests are in test_app_e2e.py."""
import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser import (ROOT, SHOTS, TEST_SLOTS, browse, cap_words, fresh, new_page, open_accordion, open_tab,
                           pick_example, serve, status, type_number, upload_trace, wait_status)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server():
    """The app on the toy models (`python -m tests.toy_app`) on a free port, for this module's tests: stopped when
    they end, as is its page (an idle app and page still cost CPU the rest of the suite needs)."""
    yield from serve(["-m", "tests.toy_app"], "toy-app.log")


@pytest.fixture(scope="module")
def page(chromium, server):
    """A Chromium page on the toy app, shared by this module's tests (each starts with `browser.fresh`)."""
    yield from browse(chromium, server)


LONG = 200  # Max new words of a decode a test cancels mid-way: a toy round is ~0.15 s, so it runs for ~15 s


def test_run_mode_renders_every_view_and_exports(page, tmp_path):
    pg = page
    assert pg.locator("#af-cancel").is_disabled()  # nothing runs yet
    pick_example(pg, "QA · tallest mountain", "tallest mountain")
    wait_status(pg, "Max new words set to", 30)  # an example says which settings it changed
    pg.get_by_label("fixed span 2").check()
    pg.locator("#af-device input").click()
    pg.get_by_role("option", name="cpu", exact=True).click()
    pg.locator("#af-run").click()
    text = wait_status(pg, "✓ done")
    assert "stop: " in text and pg.locator("#af-max-tokens").count() == 1  # every cap visible, named
    assert "s in all: loading models " in text and "the comparisons " in text, text  # the clock is what one waited
    assert pg.locator("#af-cancel").is_disabled()  # live only while something can be cancelled
    pg.locator("#af-loaded .virtual-row").first.wait_for()
    rows = pg.locator("#af-loaded .virtual-row").all_inner_texts()
    for name in ("smollm2-135m-instruct", "gemma3-270m"):  # loaded on first use, each on the CPU
        assert any(name in r and "cpu" in r.split() for r in rows), rows
    pg.set_viewport_size({"width": 1280, "height": 1000})  # a laptop: every column of the table in view, no scrolling
    try:
        last, whole = pg.locator("#af-loaded th").last.bounding_box(), pg.locator("#af-loaded").bounding_box()
        assert "load s" in pg.locator("#af-loaded th").last.inner_text()
        assert last["x"] + last["width"] <= whole["x"] + whole["width"] + 1, (last, whole)
    finally:
        pg.set_viewport_size({"width": 1400, "height": 1000})
    assert pg.locator("#af-fused .af-out .af-span").count() > 0
    assert pg.locator("#af-fused .af-out").inner_text().strip()
    pg.screenshot(path=str(SHOTS / "run-output.png"), full_page=True)
    assert pg.locator("#af-compare .af-col").count() == 4  # fused, fixed span 2, each model alone
    assert "fixed span 2" in pg.locator("#af-compare").inner_text()
    for tab, elem in (("Margins", "#af-margins"), ("Pool", "#af-pool"), ("Words/round", "#af-wpr")):
        open_tab(pg, tab)
        pg.locator(f"{elem} svg.main-svg").first.wait_for()
        assert pg.locator(f"{elem} .scatterlayer .trace, {elem} .barlayer .trace").count() > 0
        pg.screenshot(path=str(SHOTS / f"{elem[4:]}.png"), full_page=True)
    open_tab(pg, "Pool")  # the round slider redraws the pool when moved with the keyboard too
    title = pg.locator("#af-pool .gtitle").text_content()
    slider = pg.locator("#af-round input[type=range]")
    slider.focus()
    pg.keyboard.press("ArrowRight" if slider.input_value() == "0" else "ArrowLeft")
    expect(pg.locator("#af-pool .gtitle")).not_to_have_text(title, timeout=20_000)  # redrawn for the new round
    open_tab(pg, "Rounds & cost")
    pg.locator("#af-rounds").wait_for()
    table = pg.locator("#af-rounds").inner_text()
    assert "explore" in table or "commit" in table, table  # the rounds table has rows
    pg.screenshot(path=str(SHOTS / "rounds.png"), full_page=True)
    open_tab(pg, "Export / load trace")
    with pg.expect_download() as dl:
        pg.locator("#af-download").click()
    path = tmp_path / "trace.json"
    dl.value.save_as(path)
    data = json.loads(path.read_text())
    assert data["rounds"] and data["output"]
    pg.locator("#af-reset").click()
    wait_status(pg, "reset", fail_on_error=False)
    upload_trace(pg, str(path))
    wait_status(pg, "loaded a trace", 60)
    shown = pg.locator("#af-fused .af-out").inner_text().replace("⏎", "")
    assert "".join(shown.split()) == "".join(data["output"].split())  # the loaded trace's text, span by span


def step_and_pick_another(pg) -> None:
    """Step to round 0's decision and pick a candidate other than the winner for the next commit."""
    pg.locator("#af-step").click()
    wait_status(pg, "round 0 decided", 200)
    pg.locator("#af-choice input").click()
    options = pg.locator("ul[role=listbox] li")
    options.first.wait_for()
    texts = options.all_inner_texts()
    pick = next((i for i, t in enumerate(texts) if "winner" not in t), None)
    assert pick is not None, f"round 0 has a single candidate: {texts}"
    options.nth(pick).click()


def test_step_mode_with_an_override(page):
    pg = page
    fresh(pg, "Chat · three colours", "primary colors")
    step_and_pick_another(pg)
    pg.locator("#af-step").click()
    wait_status(pg, "your override", 200)
    assert pg.locator('#af-fused .af-span[style*="e3d2fb"]').count() >= 1
    pg.locator("#af-tau input[type=number]").fill("0.3")  # a slider moved mid-decode steers the next rounds
    pg.locator("#af-tau input[type=number]").press("Tab")
    expect(pg.locator("#af-tau input[type=range]")).to_have_value("0.3")
    pg.locator("#af-step").click()
    text = wait_status(pg, "committed round 1", 200)
    assert "τΔ 0.7 → 0.3 from round 2" in text, text
    assert pg.locator('#af-fused .af-span[style*="e3d2fb"]').count() >= 1  # the override is still there
    prompt = pg.locator("#af-prompt textarea")
    prompt.fill(prompt.input_value() + " Answer in French.")
    pg.locator("#af-step").click()
    text = wait_status(pg, "You changed the prompt", 60)
    assert "2 round(s)" in text and pg.locator('#af-fused .af-span[style*="e3d2fb"]').count() >= 1  # nothing lost
    pg.screenshot(path=str(SHOTS / "step-confirm.png"), full_page=True)
    pg.locator("#af-step").click()  # the second press confirms
    wait_status(pg, "started; round 0 decided", 200)
    pg.screenshot(path=str(SHOTS / "step-override.png"), full_page=True)


def test_run_commits_the_step_pick_first_and_a_reset_is_not_undone_by_the_run(page):
    pg = page
    fresh(pg, "Chat · three colours", "primary colors")
    pg.get_by_label("Also run each model alone (greedy)").uncheck()  # not looked at here
    cap_words(pg, 12)
    step_and_pick_another(pg)
    pg.locator("#af-run").click()
    wait_status(pg, "✓ done", 300)
    assert pg.locator('#af-fused .af-span[style*="e3d2fb"]').count() >= 1  # the pick was committed, as an override
    pg.get_by_label("Also run each model alone (greedy)").check()
    fresh(pg, "Chat · tea tips", "cup of tea")
    pg.locator("#af-run").click()
    wait_status(pg, " decided · ", 200)
    pg.locator("#af-reset").click()
    wait_status(pg, "reset", 60)
    time.sleep(2)  # the run ends its round under way meanwhile (a toy round: ~0.15 s): it must not bring it back
    assert "reset" in status(pg) and pg.locator("#af-fused .af-out .af-span").count() == 0, status(pg)


def test_step_is_refused_while_a_run_decodes(page):
    pg = page
    fresh(pg, "Chat · tea tips", "cup of tea")
    cap_words(pg, LONG)
    pg.locator("#af-run").click()
    wait_status(pg, " decided · ", 200)
    pg.locator("#af-step").click()
    pg.locator(".toast-body", has_text="Step is not available while").wait_for(timeout=30_000)
    pg.locator("#af-cancel").click()
    wait_status(pg, "cancelled", 60)


def test_cancel_stops_a_running_decode_between_rounds(page):
    pg = page
    fresh(pg, "Chat · tea tips", "cup of tea")
    cap_words(pg, LONG)
    pg.locator("#af-run").click()
    wait_status(pg, "rounds decided · ", 200)
    pg.locator("#af-cancel").click()
    wait_status(pg, "cancelled", 60)
    spans = pg.locator("#af-fused .af-out .af-span").count()
    time.sleep(1)  # a fixed wait for something that must not happen (a toy round: ~0.15 s): no late words
    assert "cancelled" in status(pg) and "words so far are kept" in status(pg)
    assert pg.locator("#af-fused .af-out .af-span").count() == spans  # nothing more arrives
    assert "paused: Step › or ▶ Run continues from here" in pg.locator("#af-fused").inner_text()


def test_empty_prompt_shows_an_error(page):
    pg = page
    fresh(pg)
    pg.locator("#af-prompt textarea").fill("   ")
    pg.locator("#af-run").click()
    text = wait_status(pg, "Error", 60)
    assert "prompt is empty" in text
    pg.screenshot(path=str(SHOTS / "empty-prompt.png"), full_page=True)


def test_an_empty_answer_says_why_in_its_place(page):
    """Flores De→En, data line 3, with equal weights: the end of the answer wins round 0, and the page says
    so where the answer would be, with the numbers and whose weight to raise."""
    from tests.real import flores_prompt
    pg = page
    fresh(pg, "Translate · German → English", "Wetter")  # raw mode, stop \n
    pg.locator("#af-prompt textarea").fill(flores_prompt(2))
    pg.get_by_label("Also run each model alone (greedy)").uncheck()  # the fused answer is the one looked at
    open_accordion(pg, "Model weights in the fused score", "#af-normalize")
    pg.locator("#af-normalize").get_by_label("per token (paper)").check()  # the paper's averaging
    pg.locator("#af-allow-empty input").check()  # and its pool: the end may win before the first word
    pg.locator("#af-run").click()
    wait_status(pg, "✓ done")
    shown = pg.locator("#af-fused .af-out").inner_text()
    assert "in round 0 the end of the answer scored" in shown and "no higher than every candidate with text" in shown
    assert "under smollm2-135m-instruct" in shown and "Weigh gemma3-270m more (Model weights)" in shown, shown
    pg.screenshot(path=str(SHOTS / "empty-answer.png"), full_page=True)
    pg.locator("#af-normalize").get_by_label("per word").check()
    pg.get_by_label("Also run each model alone (greedy)").check()


def test_decision_tree_branches_and_token_view(page):
    """Clicking a candidate that was not chosen branches a new decode from there, shown beside the original; the
    token view shows how each model tokenized a candidate."""
    pg = page
    fresh(pg, "Chat · three colours", "primary colors")
    pg.get_by_label("Also run each model alone (greedy)").uncheck()
    cap_words(pg, 12)
    pg.locator("#af-run").click()
    assert "gemma3-270m has no chat template: read as a User/Assistant transcript" in wait_status(pg, "✓ done")
    assert "read as a transcript (no chat template): gemma3-270m" in pg.locator("#af-fused .af-legend").inner_text()
    open_tab(pg, "Tree")
    nodes = pg.locator("#af-tree button[data-node]")
    assert nodes.count() > 0, "no round had a candidate that was not chosen"
    r, c = nodes.first.get_attribute("data-node").split(":")
    nodes.first.click()
    text = wait_status(pg, f"✓ branch at round {r}", 300)
    assert "words" in text
    assert pg.locator("#af-tree .af-branch-point").count() == 1
    pg.screenshot(path=str(SHOTS / "tree-branch.png"), full_page=True)
    open_tab(pg, "Fused vs alone")
    cols = pg.locator("#af-compare .af-col").all_inner_texts()
    assert cols[0].startswith("AdaFuse") and cols[-1].startswith(f"branch at round {r}"), cols  # side by side
    open_tab(pg, "Tokens")
    pg.locator("#af-tok-round input").fill(r)
    pg.locator("#af-tok-cand input").fill(c)
    pg.locator("#af-tok-show").click()
    pg.locator("#af-tokens table").first.wait_for()
    view = pg.locator("#af-tokens").inner_text()
    assert "smollm2-135m-instruct" in view and "gemma3-270m" in view and "Δ" in view, view[:500]
    pg.screenshot(path=str(SHOTS / "token-view.png"), full_page=True)
    pg.get_by_label("Also run each model alone (greedy)").check()


AXE = ROOT / ".npm" / "node_modules" / "axe-core" / "axe.min.js"
AUDIT = """async () => {
  const r = await axe.run(document, {runOnly: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']});
  return r.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')
    .map(v => v.id + ' (' + v.impact + '): ' + v.nodes.map(n => n.target.join(' ')).slice(0, 5).join(' | '));
}"""


def test_keyboard_run_and_accessibility_audit(page):
    """Ctrl+Enter runs; Tab reaches each round's details; axe-core finds no serious or critical violation on the
    page with every view filled."""
    pg = page
    fresh(pg, "QA · author of Hamlet", "Hamlet")
    pg.locator("#af-prompt textarea").press("Control+Enter")
    wait_status(pg, "✓ done")
    span = pg.locator("#af-fused .af-span").first
    span.focus()
    tip = pg.evaluate("() => document.activeElement.dataset.tip || ''")
    assert tip.startswith("round 0"), tip
    described = pg.evaluate("() => document.getElementById(document.activeElement.getAttribute('aria-describedby'))"
                            ".textContent")
    assert described == tip
    assert pg.locator("#af-fused .af-legend").inner_text().count("overridden") == 0  # only kinds present
    pg.screenshot(path=str(SHOTS / "keyboard-focus.png"))
    assert AXE.exists(), "axe-core is missing: ./dev test installs it (npm)"
    try:  # earlier tests' notifications (Gradio's toasts) close on their own
        expect(pg.locator(".toast-body")).to_have_count(0, timeout=30_000)
    except AssertionError:
        pass  # one still open is audited with the page
    drawn = {"Fused vs alone": "#af-compare .af-col", "Pool": "#af-pool svg.main-svg", "Tree": "#af-tree",
             "Rounds & cost": "#af-rounds", "Export / load trace": "#af-download"}
    for tab, inside in drawn.items():
        open_tab(pg, tab)
        pg.locator(inside).first.wait_for()  # the tab's content is drawn before it is audited
        pg.add_script_tag(path=str(AXE))
        found = pg.evaluate(AUDIT)
        assert found == [], found


def test_model_list_errors_are_explained(page):
    pg = page
    fresh(pg, "QA · author of Hamlet", "Hamlet")
    box = pg.locator("#af-models input")
    for name in ("meta-llama/Llama-3.1-8B-Instruct", "mistralai/Mistral-7B-Instruct-v0.3", "Qwen/Qwen3-8B"):
        box.fill(name)
        box.press("Enter")
    pg.keyboard.press("Escape")
    pg.locator("#af-run").click()
    text = wait_status(pg, "Error", 60)
    assert "pick 2 to 4 base models (you picked 5)" in text, text
    for left in (4, 3, 2):  # back to the bundled pair
        pg.locator("#af-models .token .token-remove").last.click()
        expect(pg.locator("#af-models .token")).to_have_count(left)


def test_a_bad_trace_file_is_refused_and_the_session_stays(page, tmp_path):
    pg = page
    fresh(pg, "QA · author of Hamlet", "Hamlet")
    pg.locator("#af-run").click()
    wait_status(pg, "✓ done")
    shown = pg.locator("#af-fused .af-out").inner_text()
    open_tab(pg, "Export / load trace")
    with pg.expect_download() as dl:
        pg.locator("#af-download").click()
    data = json.loads(Path(dl.value.path()).read_text())
    data["rounds"][0]["chosen"] = 99
    bad = tmp_path / "broken-trace.json"
    bad.write_text(json.dumps(data))
    upload_trace(pg, str(bad))
    text = wait_status(pg, "Error", 60)
    assert "rounds[0].chosen is 99" in text and "/tmp/" not in text, text
    assert pg.locator("#af-fused .af-out").inner_text() == shown  # the session is as it was
    data["rounds"][0]["chosen"] = data["rounds"][0]["winner"]  # now numbers that do not add up
    r = next(r for r in data["rounds"] if len(r["candidates"]) > 1 and r["candidates"][0]["fused"] is not None)
    r["candidates"][0]["fused"] = 1e300
    bad.write_text(json.dumps(data))
    upload_trace(pg, str(bad))
    text = wait_status(pg, f"rounds[{r['index']}].candidates[0].fused is 1e+300, but the weighted mean", 60,
                       fail_on_error=False)
    assert pg.locator("#af-fused .af-out").inner_text() == shown
    pg.locator("#af-step").click()  # and still works: Step after the finished decode asks first
    wait_status(pg, "This decode has finished", 60, fail_on_error=False)
    pg.locator("#af-step").click()
    wait_status(pg, "round 0 decided", 200, fail_on_error=False)


def test_model_weights_steer_the_fused_score_and_show_in_the_pool(page):
    pg = page
    fresh(pg, "QA · author of Hamlet", "Hamlet")
    open_accordion(pg, "Model weights in the fused score", "#af-weight-1")
    box = pg.locator("#af-weight-1 input[type=number]")
    assert "gemma3-270m" in pg.locator("#af-weight-1").inner_text()  # labelled by its model
    box.fill("3")
    box.press("Tab")
    pg.locator("#af-exploration").get_by_label("embedding").check()  # and exploration diverse in meaning
    expect(pg.locator("#af-weight-1 input[type=range]")).to_have_value("3")
    pg.locator("#af-run").click()
    wait_status(pg, "✓ done")
    open_tab(pg, "Pool")
    slider = pg.locator("#af-round input[type=range]")  # the Pool opens on the last round: back to round 0's choice
    slider.focus()
    pg.keyboard.press("Home")
    expect(pg.locator("#af-pool .gtitle")).to_contain_text("round 0 (explore)", timeout=20_000)
    expect(pg.locator("#af-picks")).to_contain_text("picked 1st", timeout=20_000)
    title = pg.locator("#af-pool .gtitle").text_content()
    legend = pg.locator("#af-pool .legend").text_content()
    assert "gemma3-270m ×3" in legend, (title, legend)
    picks = pg.locator("#af-picks").inner_text()
    assert "embedding" in picks and "picked 1st" in picks, picks[:400]  # why each first token was explored
    pg.screenshot(path=str(SHOTS / "pool-weights-picks.png"), full_page=True)
    box.fill("1")
    box.press("Tab")
    pg.locator("#af-exploration").get_by_label("surface").check()


def test_a_learned_gate_weighs_each_round_and_the_views_show_it(page):
    pg = page
    fresh(pg, "QA · author of Hamlet", "Hamlet")
    open_accordion(pg, "Model weights in the fused score", "#af-gate")
    pg.locator("#af-gate input").click()
    pg.get_by_role("option", name=re.compile(r"^qa[ :]")).click()
    expect(pg.locator("#af-gate input")).to_have_value(re.compile(r"^qa[ :]"))
    # the page takes the gate's NLL averaging (a round trip to the server) before a Run may use the gate
    expect(pg.locator("#af-normalize").get_by_label("per token (paper)")).to_be_checked()
    pg.locator("#af-run").click()
    wait_status(pg, "✓ done")
    open_tab(pg, "Margins")
    legend = pg.locator("#af-margins .legend").text_content()
    assert "gemma3-270m · gate weight share" in legend, legend
    open_tab(pg, "Pool")
    pool = pg.locator("#af-pool .legend").text_content()
    assert "gate weighted mean" in pool or "one candidate only" in pg.locator("#af-pool").text_content(), pool
    pg.screenshot(path=str(SHOTS / "gate-margins.png"), full_page=True)
    pg.locator("#af-gate input").click()
    pg.get_by_role("option", name=re.compile(r"^none")).click()


def test_speculative_proposals_are_on_and_show_their_drafts_in_the_cost_view(page):
    pg = page
    pg.reload()  # every setting at its default (an opened example restores its own, speculation off included)
    pg.get_by_text("AdaFuse Explorer").first.wait_for()
    fresh(pg, "QA · author of Hamlet", "Hamlet")
    assert pg.locator("#af-speculate input").is_checked()  # the default (docs/performance.md: measured never slower)
    pg.locator("#af-run").click()
    wait_status(pg, "✓ done")
    open_tab(pg, "Rounds & cost")
    table = pg.locator("#af-cost-table").inner_text()
    assert "accepted tokens" in table and "forwards saved" in table, table


def test_narrow_screen_puts_the_prompt_first_and_nothing_overflows(page, tmp_path):
    from adafuse.trace import Candidate, ModelStep, Round, Trace
    long = "🙂" * 120 + " https://example.org/" + "a" * 300 + " " + "巴黎是法国的首都" * 30
    cand = Candidate(text=long, eos=True, proposers=["m1"], nll={}, n_tokens={}, fused=None, words=3)
    trace = Trace(prompt="p", models=["m1", "m2"], settings={}, prompt_modes={"m1": "raw", "m2": "raw"},
                  rounds=[Round(index=0, steps=[ModelStep(model="m1", mode="commit", margins=[0.9], proposals=[0]),
                                                ModelStep(model="m2", mode="commit", margins=[0.8], proposals=[0])],
                                candidates=[cand], chosen=0, winner=0, text=long, words=3, seconds=0.1)],
                  output=long, stop_reason="eos")
    path = trace.save(tmp_path / "long.json")
    narrow = pg = new_page(page.context.browser, 420, 900)
    try:
        pg.set_default_timeout(60_000)
        pg.goto(page.url)
        pg.get_by_text("AdaFuse Explorer").first.wait_for()
        assert pg.locator("#af-prompt").bounding_box()["y"] < pg.locator("#af-settings").bounding_box()["y"]
        open_tab(pg, "Export / load trace")
        upload_trace(pg, str(path))
        wait_status(pg, "loaded a trace", 60)
        assert pg.locator("#af-cancel").is_disabled()  # a loaded trace: nothing to cancel
        open_tab(pg, "Fused vs alone")
        for sel in ("#af-fused .af-out", "#af-compare .af-col"):
            box = pg.locator(sel).first
            box.wait_for()
            wide = box.evaluate("e => [e.scrollWidth, e.clientWidth]")
            assert wide[0] <= wide[1] + 1, (sel, wide)
        assert pg.evaluate("() => document.documentElement.scrollWidth") <= 421
        pg.screenshot(path=str(SHOTS / "narrow-420.png"), full_page=True)
    finally:
        narrow.context.close()


def test_the_running_app_serves_named_api_endpoints(server):
    """A script drives a decode through the app itself with gradio_client (docs/app.md's example)."""
    from gradio_client import Client
    client = Client(server, verbose=False)
    out = client.predict("Question: What is the capital of France?\nAnswer:", "smollm2-135m-instruct,gemma3-270m",
                         stop="\\n", max_new_words=8, api_name="/decode")
    assert out["output"].strip() and out["trace"]["rounds"] and out["stop_reason"]
    assert "gemma3-270m" in client.predict(api_name="/models")["bundled"]


def test_the_answers_tab_shows_which_answer_each_model_and_the_pair_prefer(page):
    """The toys after "Answer:": SmolLM2's prefers " Mount", Gemma's " William"; the fused mean prefers William."""
    pg = page
    fresh(pg)
    open_tab(pg, "Answers")
    pg.locator("#af-ans-score").click()
    expect(pg.locator("#af-ans-status")).to_contain_text(re.compile("Preferred|Error"), timeout=120_000)
    text = pg.locator("#af-ans-status").inner_text()
    assert "Fused: William Shakespeare" in text and "smollm2-135m-instruct: Mount Everest" in text, text
    assert "gemma3-270m: William Shakespeare" in text and "smollm2-135m-instruct prefers another answer" in text
    pg.locator("#af-ans-plot .barlayer .trace").first.wait_for()
    assert pg.locator("#af-ans-plot .barlayer .trace").count() == 3  # each model's chart and the fused one
    assert "Charles Dickens" in pg.locator("#af-ans-table").inner_text()
    pg.screenshot(path=str(SHOTS / "answers.png"), full_page=True)
    pg.locator("#af-ans-choices textarea").fill("Paris")  # one answer is no choice: said, and the earlier chart goes
    pg.locator("#af-ans-score").click()
    expect(pg.locator("#af-ans-status")).to_contain_text("write 2 to 5", timeout=30_000)
    expect(pg.locator("#af-ans-plot .barlayer .trace")).to_have_count(0)
    assert "Nothing scored" in pg.locator("#af-ans-plot").text_content()
    assert "Charles Dickens" not in pg.locator("#af-ans-table").inner_text()
    pg.locator("#af-ans-choices textarea").fill("William Shakespeare\nCharles Dickens\nMount Everest")


def test_evaluate_tab_lists_results_and_opens_a_trace(page):
    pg = page
    fresh(pg)
    open_tab(pg, "Evaluate")
    type_number(pg.locator('input[aria-label="number input for Examples"]'), 1)  # one is enough to list and open
    pg.locator("#af-eval-run").click()
    expect(pg.locator("#af-eval-status")).to_contain_text(re.compile("examples ×|Error"), timeout=400_000)
    assert "Error" not in pg.locator("#af-eval-status").inner_text()
    assert "adafuse" in pg.locator("#af-eval-summary").inner_text()
    pg.screenshot(path=str(SHOTS / "evaluate.png"), full_page=True)
    pg.get_by_role("button", name="Open in the explorer views").click()
    wait_status(pg, "📂 example 1 / adafuse", 60)
    assert pg.locator("#af-fused .af-span").count() > 0
    pg.locator("#af-unload-pick input").click()  # last test: unloading costs the next run a reload
    pg.get_by_role("option", name="gemma3-270m", exact=True).click()
    pg.locator("#af-unload").click()
    pg.locator("#af-load-status", has_text="unloaded gemma3-270m").wait_for()
    expect(pg.locator("#af-loaded")).not_to_contain_text("gemma3-270m", timeout=30_000)
    assert "smollm2-135m-instruct" in pg.locator("#af-loaded").inner_text()


def test_keyboard_focus_is_visible_on_sliders_checkboxes_and_radios(page):
    pg = page
    fresh(pg)
    for sel in ("#af-tau input[type=range]", "#af-speculate input", "#af-exploration input", "#af-run"):
        pg.locator(sel).first.focus()
        pg.keyboard.press("Shift+Tab")
        pg.keyboard.press("Tab")  # a keyboard focus (focus-visible), as a keyboard user gets it
        style = pg.evaluate("""() => { const e = document.activeElement;
            const own = getComputedStyle(e), label = e.closest('label') ? getComputedStyle(e.closest('label')) : null;
            return [own.outlineStyle, own.outlineWidth, label ? label.outlineStyle : 'none']; }""")
        assert "solid" in (style[0], style[2]), (sel, style)


def test_a_setting_moved_during_a_run_applies_from_the_next_round_and_cancel_keeps_the_words(page):
    pg = page
    fresh(pg, "Chat · tea tips", "cup of tea")
    pg.get_by_label("Also run each model alone (greedy)").uncheck()
    cap_words(pg, LONG)
    pg.locator("#af-run").click()
    wait_status(pg, " decided · ", 200)
    tau = pg.locator("#af-tau input[type=number]")
    tau.fill("0.3")
    tau.press("Tab")
    text = wait_status(pg, "τΔ 0.7 → 0.3 from round", 200)
    pg.locator("#af-cancel").click()  # at once: a loaded machine draws the chart slower than the toy decodes
    text = wait_status(pg, "cancelled after round", 120)
    open_tab(pg, "Margins")
    pg.locator("#af-margins svg.main-svg").first.wait_for()
    assert "from round" in pg.locator("#af-margins").text_content()  # the change marked on the chart
    kept = int(text.split("cancelled after round ")[1].split(":")[0])
    assert "Step › or ▶ Run continues" in text
    pg.locator("#af-step").click()
    text = wait_status(pg, "decided", 200)
    assert f"round {kept} decided" in text, text  # on from the kept words, not round 0
    tau.fill("0.7")
    tau.press("Tab")
    pg.get_by_label("Also run each model alone (greedy)").check()


def test_a_cold_run_says_which_model_it_is_loading(page):
    pg = page
    fresh(pg, "QA · author of Hamlet", "Hamlet")
    pg.locator("#af-unload-pick input").click()
    pg.get_by_role("option", name="gemma3-270m", exact=True).click()
    pg.locator("#af-unload").click()
    pg.locator("#af-load-status", has_text="unloaded gemma3-270m").wait_for()
    pg.locator("#af-run").click()
    seen = wait_status(pg, "loading model 2 of 2: gemma3-270m", 120)
    assert "gemma3-270m" in seen
    wait_status(pg, "✓ done")


def test_only_the_public_api_is_listed(server):
    info = json.loads(urllib.request.urlopen(server + "gradio_api/info", timeout=30).read())
    assert sorted(info["named_endpoints"]) == ["/decode", "/models"], sorted(info["named_endpoints"])
    assert not info.get("unnamed_endpoints"), list(info["unnamed_endpoints"])[:5]


def test_a_visitor_past_the_slots_waits_in_line_with_a_measured_estimate(page):
    """TEST_SLOTS decodes run at once (ADAFUSE_DECODE_SLOTS); one more visitor is told their place in line and an
    estimate measured from the decodes the server ran, then gets their own answer."""
    pg = page
    fresh(pg, "QA · author of Hamlet", "Hamlet")
    pg.locator("#af-run").click()  # one decode measured before the others queue
    wait_status(pg, "✓ done")
    others = [new_page(pg.context.browser, 1280, 800) for _ in range(TEST_SLOTS)]
    try:
        for other in others:
            other.set_default_timeout(60_000)
            other.goto(pg.url)
            other.get_by_text("AdaFuse Explorer").first.wait_for()
            fresh(other, "Chat · tea tips", "cup of tea")
            other.get_by_label("Also run each model alone (greedy)").uncheck()  # the fused decodes hold the slots
            cap_words(other, LONG)  # until cancelled: a loaded machine may press the last Run seconds after the first
        for other in others:  # each holds its slot before the next presses: the server takes presses in any order
            other.locator("#af-run").click()
            wait_status(other, "decided", 120)
        pg.locator("#af-run").click()
        seen = wait_status(pg, "waiting for a free decoding slot", 120)
        assert "decode(s) ahead, about" in seen and "measured from the last" in seen, seen
        for other in others:
            other.locator("#af-cancel").click()
        for other in others:
            expect(other.locator("#af-status")).to_contain_text(re.compile("cancelled after round|✓ done"))
        wait_status(pg, "✓ done", 600)
        assert pg.locator("#af-fused .af-out").inner_text() != others[0].locator("#af-fused .af-out").inner_text()
    finally:
        for other in others:
            other.context.close()


def test_a_pasted_prompt_gets_its_stop_string_before_the_run_starts(page):
    """A prompt pasted (one input event) and run at once decodes with the stop string proposed from it, as a typed one
    does: Run takes the proposal first."""
    pg = page
    pg.reload()  # a newcomer's page: the stop box untouched
    pg.get_by_text("AdaFuse Explorer").first.wait_for()
    pg.context.grant_permissions(["clipboard-read", "clipboard-write"])
    pg.evaluate("t => navigator.clipboard.writeText(t)", "Question: Who wrote Hamlet?\nAnswer:")
    box = pg.locator("#af-prompt textarea")
    box.fill("")
    box.focus()
    pg.keyboard.press("Control+V")
    pg.locator("#af-run").click()  # at once: no time for the proposal to arrive first on its own
    text = wait_status(pg, "✓ done")
    assert "stop: a stop string" in text, text
    assert pg.locator("#af-stop textarea").input_value() == "\\n"
    assert pg.locator("#af-fused .af-out").inner_text().strip().endswith("Shakespeare.")



def test_a_paste_proposes_at_once_and_a_stop_box_emptied_by_deleting_stays_empty(page):
    """A paste (no Gradio input event) gets its proposal without a Run; the user deletes it (no input event either)
    and runs at once: the decode has no stop string, and the box stays as the user left it."""
    pg = page
    pg.reload()
    pg.get_by_text("AdaFuse Explorer").first.wait_for()
    pg.context.grant_permissions(["clipboard-read", "clipboard-write"])
    pg.evaluate("t => navigator.clipboard.writeText(t)", "Question: Who wrote Hamlet?\nAnswer:")
    box, stop = pg.locator("#af-prompt textarea"), pg.locator("#af-stop textarea")
    box.fill("")
    box.focus()
    pg.keyboard.press("Control+V")
    expect(stop).to_have_value("\\n", timeout=20_000)
    stop.focus()
    pg.keyboard.press("Control+A")
    pg.keyboard.press("Delete")
    pg.locator("#af-run").click()
    text = wait_status(pg, "✓ done")
    assert "stop: a stop string" not in text, text
    assert stop.input_value() == ""

def test_the_rounds_table_keeps_every_column_in_view_at_1400_px(page):
    pg = page
    fresh(pg, "QA · author of Hamlet", "Hamlet")
    pg.locator("#af-run").click()
    wait_status(pg, "✓ done")
    open_tab(pg, "Rounds & cost")
    heads = pg.locator("#af-rounds th")
    expect(heads.last).to_contain_text("s")
    table = pg.locator("#af-rounds").bounding_box()
    names = heads.all_inner_texts()
    assert any("fused NLL" in n for n in names) and any("smollm2-135m-instruct" in n for n in names), names
    for i in range(heads.count()):
        box = heads.nth(i).bounding_box()
        assert box["x"] + box["width"] <= table["x"] + table["width"] + 1, (names[i], box, table)
    pg.locator("#af-rounds").screenshot(path=str(SHOTS / "rounds-1400.png"))


def test_a_typed_value_a_slider_cannot_show_is_snapped_visibly(page):
    """B = 3.5 becomes 4 in the box and on the bar, τΔ = 1.5 becomes 1, each said with the slider's range, and no
    error pops up while typing."""
    pg = page
    fresh(pg)
    for slider, typed, shown, says in (("#af-b", "3.5", "4", "whole numbers from 1 to 8: 3.5 is set to 4"),
                                       ("#af-tau", "1.5", "1", "values from 0 to 1 in steps of 0.05: 1.5 is set to 1")):
        box = pg.locator(f"{slider} input[type=number]")
        box.fill(typed)
        box.press("Tab")
        pg.locator(".toast-body", has_text=says).first.wait_for(timeout=20_000)
        expect(box).to_have_value(shown)
        expect(pg.locator(f"{slider} input[type=range]")).to_have_value(shown)
    assert pg.locator(".toast-body", has_text="maximum value").count() == 0  # Gradio's own range error: not raised
    for slider, value in (("#af-b", "3"), ("#af-tau", "0.7")):  # as the other tests expect them
        pg.locator(f"{slider} input[type=number]").fill(value)
        pg.locator(f"{slider} input[type=number]").press("Tab")
        expect(pg.locator(f"{slider} input[type=range]")).to_have_value(value)


def test_the_page_teaches_a_round_and_a_bare_question_gets_a_better_way_in_one_click(page):
    """Beside the settings: what a round, Δ, τΔ, M, B, NLL and the fused score are, and what each slider's extremes
    do. A bare question typed raw shows the hint; one click frames it (the "\\n" stop proposed with it), the other
    switches to chat mode; the Pool tab says the round in words."""
    pg = page
    pg.reload()
    pg.get_by_text("AdaFuse Explorer").first.wait_for()
    how = pg.locator("#af-how-text").inner_text()
    for term in ("A round", "Δ", "τΔ", "M", "B", "NLL", "fused score", "per token", "Speculative proposals", "λ"):
        assert term in how, term
    assert "1: never sure" in pg.locator("#af-tau").inner_text() and "5: up to five" in pg.locator("#af-m").inner_text()
    hint, box = pg.locator("#af-bare"), pg.locator("#af-prompt textarea")
    assert not hint.is_visible()
    box.fill("")
    box.type("Who wrote Hamlet?")
    expect(hint).to_be_visible(timeout=20_000)
    pg.locator("#af-bare-frame").click()
    expect(box).to_have_value("Question: Who wrote Hamlet?\nAnswer:", timeout=20_000)
    expect(pg.locator("#af-stop textarea")).to_have_value("\\n", timeout=20_000)
    expect(hint).to_be_hidden()
    box.fill("")
    box.type("Who painted the Mona Lisa?")
    expect(hint).to_be_visible(timeout=20_000)
    pg.locator("#af-bare-chat").click()
    expect(pg.get_by_label("chat", exact=True)).to_be_checked(timeout=20_000)
    expect(hint).to_be_hidden()
    assert pg.locator("#af-stop textarea").input_value() == ""  # chat mode: no line-break stop
    pg.get_by_label("raw", exact=True).check()
    pg.locator("#af-run").click()
    wait_status(pg, "✓ done")
    open_tab(pg, "Pool")
    expect(pg.locator("#af-pool .gtitle")).to_contain_text("round", timeout=20_000)
    said = pg.locator("#af-pool .gtitle").text_content()
    assert "τΔ" in said and ("chose" in said or "nothing was scored" in said), said
    pg.screenshot(path=str(SHOTS / "teach.png"), full_page=True)
