"""End to end on the bundled pair in a real browser (every other browser test runs the same page on the toy models):
a newcomer's first raw prompt, error analysis from an evaluation to the round where the ensemble left a member, and
four visitors decoding at once (fixtures `server` and `page` below, helpers in tests/browser.py)."""
import csv
import json
import re
import time

import pytest
from playwright.sync_api import expect

from tests.browser import (ROOT, SHOTS, browse, fresh, new_page, open_accordion, open_tab, serve, status, type_number,
                           wait_status)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server():
    """The app on the bundled pair (`python app.py`), for this module's tests: four visitors decode at once."""
    yield from serve(["app.py"], "app.log", slots=len(FOUR))


@pytest.fixture(scope="module")
def page(chromium, server):
    yield from browse(chromium, server)


WRONG_BUT_MEMBER = "ensemble wrong, a member right"
LINES = 3  # SQuAD lines the scenario evaluates (line 3: the ensemble wrong where a member is right)


def eval_status(pg) -> str:
    return pg.locator("#af-eval-status").inner_text()


def table_rows(pg):
    return pg.locator("#af-eval-table .virtual-row")


def table_lines(pg) -> list[int]:
    """The line column of the examples table as shown (after sorting or filtering)."""
    rows = table_rows(pg)
    return [int(rows.nth(i).locator("[role=gridcell]").first.inner_text().strip()) for i in range(rows.count())]


def test_scenario_from_an_evaluation_to_the_round_where_the_ensemble_left_a_member(page, tmp_path):
    """Evaluate 3 SQuAD lines → filter "ensemble wrong, a member right" → open the first: the prompt, gold and
    every method's answer are there, the divergence sentence names the round and the candidate, the Pool tab shows
    that round, and Run asks before replacing the opened trace."""
    pg = page
    fresh(pg)
    open_tab(pg, "Evaluate")
    pg.locator("#af-eval-task input").click()
    pg.get_by_role("option", name="squad", exact=True).click()
    type_number(pg.locator('input[aria-label="number input for Examples"]'), LINES)
    pg.locator("#af-eval-run").click()
    expect(pg.locator("#af-eval-status")).to_contain_text(re.compile("examples ×|Error"), timeout=900_000)
    assert f"{LINES} examples × 3 methods on squad" in eval_status(pg), eval_status(pg)
    head = pg.locator("#af-eval-table thead").inner_text()
    for col in ("labels", "gold", "adafuse f1", "greedy:gemma3-270m f1"):
        assert col in head, head
    assert set(table_lines(pg)) <= set(range(1, LINES + 1)) and table_lines(pg)[0] == 1  # rows below scroll into view
    pg.screenshot(path=str(SHOTS / "evaluate-examples.png"), full_page=True)
    with pg.expect_download() as dl:  # every example, every method's answer and scores, as CSV
        pg.locator("#af-eval-csv").click()
    rows = list(csv.DictReader(open(dl.value.path(), encoding="utf-8")))
    assert len(rows) == LINES and "adafuse: f1" in rows[0] and "greedy:gemma3-270m: answer" in rows[0]
    pg.locator("#af-eval-filter input").click()
    pg.get_by_role("option", name=WRONG_BUT_MEMBER, exact=True).click()
    expect(table_rows(pg).filter(has_not_text=WRONG_BUT_MEMBER)).to_have_count(0, timeout=30_000)  # filtered
    shown = table_lines(pg)
    assert shown and len(shown) < LINES, shown
    table_rows(pg).first.locator("[role=gridcell]").nth(2).click()  # pick the first row
    expect(pg.locator("#af-open-line input")).to_have_value(str(shown[0]), timeout=20_000)
    pg.locator("#af-open").click()
    text = wait_status(pg, f"example {shown[0]} / adafuse", 60)
    assert "Round " in text and "the ensemble chose" in text, text  # the divergence sentence
    r = int(text.split("Round ")[1].split(":")[0])
    panel = pg.locator("#af-example").inner_text()
    for needle in ("Gold:", "greedy:gemma3-270m", "greedy:smollm2-135m-instruct", "adafuse (opened)", "✗ wrong",
                   "✓ right"):
        assert needle in panel, panel[:600]
    prompt = pg.locator("#af-prompt textarea").input_value()
    assert prompt.endswith("Answer:\n") and "Question:" in prompt  # the decode's own prompt, restored
    assert pg.locator("#af-pool").is_visible()  # the Pool tab is open at that round
    slider = pg.locator("#af-round input[type=range]")  # shown where the decode has more than one round
    assert slider.input_value() == str(r) if slider.is_visible() else r == 0
    assert f"round {r}" in pg.locator("#af-pool .gtitle").text_content().lower()
    cols = pg.locator("#af-compare").inner_text()
    assert "gemma3-270m alone" in cols and "smollm2-135m-instruct alone" in cols  # the members' own answers
    pg.screenshot(path=str(SHOTS / "divergence-opened.png"), full_page=True)
    div_plot = pg.locator("#af-div-plot")
    pg.get_by_text("Where and why the ensemble leaves each member").click()
    div_plot.locator("svg.main-svg").first.wait_for()
    pg.screenshot(path=str(SHOTS / "divergence-chart.png"), full_page=True)
    pg.locator("#af-step").click()  # an opened trace is not replaced silently
    assert "again to decode the prompt box anew" in wait_status(pg, f"The views show example {shown[0]}", 30)
    assert pg.locator("#af-compare").inner_text() == cols  # nothing replaced yet


def test_a_newcomers_raw_prompt_gets_a_stop_string_and_stops_after_the_answer(page):
    """A newcomer types the prompt the box suggests (one worked example, then the question) at every default (the
    library's, per word): the stop string is proposed, the answer is the name, and it stops there."""
    pg = page
    pg.reload()  # a newcomer's page: every setting at its default, nothing left by the tests before
    pg.get_by_text("AdaFuse Explorer").first.wait_for()
    open_accordion(pg, "Model weights in the fused score", "#af-normalize")
    assert pg.get_by_label("per word", exact=True).is_checked()  # the default everywhere (docs/defaults.md)
    box = pg.locator("#af-prompt textarea")
    assert "Who wrote Hamlet?" in box.get_attribute("placeholder")
    box.fill("")
    box.type("Question: What is the capital of Italy?\nAnswer: Rome\n\nQuestion: Who wrote Hamlet?\nAnswer:")
    stop = pg.locator("#af-stop textarea")
    expect(stop).to_have_value("\\n", timeout=20_000)  # the answer goes on the line of "Answer:": it ends with it
    pg.set_viewport_size({"width": 1280, "height": 800})
    try:
        pg.locator("#af-run").click()
        text = wait_status(pg, "✓ done")
        out = pg.locator("#af-fused .af-out").inner_text()
        assert "Shakespeare" in out and "Question" not in out and len(out.split()) <= 8, out
        assert "stop: a stop string" in text, text
        status_y, box_y = (pg.locator(sel).bounding_box()["y"] for sel in ("#af-status", "#af-fused"))
        assert -5 <= status_y < box_y < 600, (status_y, box_y)  # scrolled to the status and the answer
        seconds = text.split("(")[1].split("s wall clock")[0]  # one duration for the run, everywhere
        assert f"· {seconds}s" in pg.locator("#af-fused .af-legend").inner_text()
        assert f"· {seconds}s" in pg.locator("#af-compare .af-col").first.inner_text()
        pg.locator("#af-fused .af-span").first.focus()
        tip = pg.evaluate("() => document.activeElement.dataset.tip || ''")
        assert "beat runner-up “" in tip and "fused NLL" in tip and "NLL per word" in tip, tip  # why it won
        pg.screenshot(path=str(SHOTS / "newcomer-1280x800.png"))
    finally:
        pg.set_viewport_size({"width": 1400, "height": 1000})
    stop.fill("\\q")  # an unknown escape is said, not silently never matched
    pg.locator("#af-run").click()
    assert "\\q" in wait_status(pg, "Error", 60)
    stop.fill("")

FOUR = (("QA · tallest mountain", "tallest"), ("Reading · lighthouse", "lighthouse"),
        ("Translate · German → English", "Ich trinke"), ("QA · author of Hamlet", "Hamlet"))


def _first_round_seconds(pages, timeout_s: float = 300) -> list[float]:
    """Seconds from now until each page's status says its decode's first round has arrived."""
    t0, out = time.time(), [None] * len(pages)
    while None in out:
        assert time.time() - t0 < timeout_s, [status(p) for p in pages]
        for i, p in enumerate(pages):
            if out[i] is None and re.search(r"round \d+ ·|✓ done|alone done", status(p)):
                out[i] = time.time() - t0
        time.sleep(0.05)
    return out


def test_four_visitors_running_at_once_each_get_the_answer_they_get_alone(page):
    """Four visitors press Run together: their decodes share each model's forwards (models/batching.py), and each
    gets exactly the answer the same example gets decoded alone. The seconds to the first round, alone and together,
    are written to artifacts/four-visitors.json (the target: the slowest of the four under 2× a lone visitor's)."""
    pg = page
    alone, first_alone = [], []
    for label, needle in FOUR:
        fresh(pg, label, needle)
        pg.get_by_label("Also run each model alone (greedy)").uncheck()  # the fused answers are compared
        pg.locator("#af-run").click()
        first_alone.append(_first_round_seconds([pg])[0])
        wait_status(pg, "✓ done")
        alone.append(pg.locator("#af-fused .af-out").inner_text())
    pages = [pg] + [new_page(pg.context.browser, 1280, 800) for _ in FOUR[1:]]
    try:
        for p, (label, needle) in zip(pages, FOUR):
            if p is not pg:
                p.set_default_timeout(60_000)
                p.goto(pg.url)
                p.get_by_text("AdaFuse Explorer").first.wait_for()
            fresh(p, label, needle)
            p.get_by_label("Also run each model alone (greedy)").uncheck()
        for p in pages:
            p.locator("#af-run").click()
        together = _first_round_seconds(pages)
        for p in pages:
            wait_status(p, "✓ done", 600)
        assert [p.locator("#af-fused .af-out").inner_text() for p in pages] == alone
        assert not any("waiting for a free decoding slot" in status(p) for p in pages)
        (ROOT / "artifacts" / "four-visitors.json").write_text(json.dumps(
            {"first round alone (s)": first_alone, "first round together (s)": together,
             "slowest together ÷ its own alone": max(t / a for t, a in zip(together, first_alone))}, indent=1))
    finally:
        for p in pages[1:]:
            p.context.close()
        pg.get_by_label("Also run each model alone (greedy)").check()


def test_the_readmes_script_example_gets_the_apps_answer(server):
    """docs/app.md's gradio_client example (`runs: app`), as written but for the app's address."""
    from tests.readme import examples, run_python
    for ex in (e for e in examples() if e.group == "app"):
        run_python(ex, {"http://127.0.0.1:7860/": server if server.endswith("/") else server + "/"})
