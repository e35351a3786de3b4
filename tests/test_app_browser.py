"""Real browser: start `python app.py` on a free port and drive it with Playwright + Debian's Chromium."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SHOTS = ROOT / "artifacts" / "screenshots"

if not Path(CHROMIUM).exists():
    if os.environ.get("ADAFUSE_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"{CHROMIUM} is missing: apt-get install -y chromium")
    pytest.skip("no Chromium here (CI installs it and sets ADAFUSE_REQUIRE_BROWSER=1)", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    (ROOT / "artifacts").mkdir(exist_ok=True)
    log = open(ROOT / "artifacts" / "app.log", "w")
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False"})
    url = f"http://127.0.0.1:{port}/"
    for _ in range(120):
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError:
            time.sleep(1)
    else:
        proc.kill()
        raise RuntimeError("the app did not start: see artifacts/app.log")
    yield url
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--no-first-run", "--disable-sync", "--disable-quic"])
        pg = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        pg.set_default_timeout(60_000)
        pg.goto(server)
        pg.get_by_text("AdaFuse Explorer").first.wait_for()
        yield pg
        browser.close()


def status(pg) -> str:
    return pg.locator("#af-status").inner_text()


def wait_status(pg, needle: str, timeout_s: float = 400, fail_on_error: bool = True) -> str:
    end = time.time() + timeout_s
    while time.time() < end:
        text = status(pg)
        if needle in text:
            return text
        if fail_on_error and "Error" in text and "Error" not in needle:
            raise AssertionError(f"the page shows an error: {text}")
        time.sleep(0.5)
    raise AssertionError(f"waited for {needle!r}; status is {status(pg)!r}")


def pick_example(pg, label: str, needle: str):
    """Click an example until the prompt box holds it (the page may still be wiring its events)."""
    for _ in range(20):
        pg.get_by_role("button", name=label).click()
        time.sleep(0.5)
        if needle in pg.locator("#af-prompt textarea").input_value():
            return
    raise AssertionError(f"example {label!r} did not fill the prompt")


def fresh(pg, label: str | None = None, needle: str = ""):
    """Reset the session, then pick an example."""
    pg.locator("#af-reset").click()
    wait_status(pg, "reset", fail_on_error=False)
    if label:
        pick_example(pg, label, needle)


def open_tab(pg, name: str):
    pg.get_by_role("tab", name=name).click()
    time.sleep(0.5)


def test_run_mode_renders_every_view_and_exports(page, tmp_path):
    pg = page
    pick_example(pg, "QA · tallest mountain", "tallest mountain")
    pg.get_by_label("fixed span 2").check()
    pg.locator("#af-device input").click()
    pg.get_by_role("option", name="cpu", exact=True).click()
    pg.locator("#af-run").click()
    wait_status(pg, "✓ done")
    assert "stop: " in status(pg) and pg.locator("#af-max-tokens").count() == 1  # every cap visible, named
    pg.locator("#af-loaded .virtual-row").first.wait_for()
    rows = pg.locator("#af-loaded .virtual-row").all_inner_texts()
    for name in ("smollm2-135m-instruct", "gemma3-270m"):  # loaded on first use, each on the CPU
        assert any(name in r and "cpu" in r.split() for r in rows), rows
    assert pg.locator("#af-fused .af-out .af-span").count() > 0
    assert pg.locator("#af-fused .af-out").inner_text().strip()
    pg.screenshot(path=str(SHOTS / "run-output.png"), full_page=True)
    assert pg.locator("#af-compare .af-col").count() == 4  # fused, fixed span 2, each model alone
    assert "fixed span 2" in pg.locator("#af-compare").inner_text()
    for tab, elem in (("Confidence margins", "#af-margins"), ("Candidate pool", "#af-pool"),
                      ("Words per round", "#af-wpr")):
        open_tab(pg, tab)
        pg.locator(f"{elem} svg.main-svg").first.wait_for()
        assert pg.locator(f"{elem} .scatterlayer .trace, {elem} .barlayer .trace").count() > 0
        pg.screenshot(path=str(SHOTS / f"{elem[4:]}.png"), full_page=True)
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
    pg.locator("#af-upload input[type=file]").set_input_files(str(path))
    wait_status(pg, "loaded a trace", 60)
    shown = pg.locator("#af-fused .af-out").inner_text().replace("⏎", "")
    assert "".join(shown.split()) == "".join(data["output"].split())  # the loaded trace's text, span by span


def test_step_mode_with_an_override(page):
    pg = page
    fresh(pg, "Chat · three colours", "primary colors")
    pg.locator("#af-step").click()
    wait_status(pg, "round 0 decided", 200)
    choice = pg.locator("#af-choice")
    choice.locator("input").click()
    options = pg.locator("ul[role=listbox] li")
    options.first.wait_for()
    texts = options.all_inner_texts()
    pick = next((i for i, t in enumerate(texts) if "winner" not in t), None)
    assert pick is not None, f"round 0 has a single candidate: {texts}"
    options.nth(pick).click()
    pg.locator("#af-step").click()
    wait_status(pg, "your override", 200)
    assert pg.locator('#af-fused .af-span[style*="e3d2fb"]').count() >= 1
    pg.locator("#af-step").click()
    wait_status(pg, "committed round 1", 200)
    pg.screenshot(path=str(SHOTS / "step-override.png"), full_page=True)


def test_cancel_stops_a_running_decode_between_rounds(page):
    pg = page
    fresh(pg, "Chat · tea tips", "cup of tea")
    pg.locator("#af-run").click()
    wait_status(pg, "round 2", 200)
    pg.locator("#af-cancel").click()
    wait_status(pg, "cancelled", 60)
    spans = pg.locator("#af-fused .af-out .af-span").count()
    time.sleep(3)
    assert pg.locator("#af-fused .af-out .af-span").count() == spans  # nothing more arrives
    assert "cancelled" in pg.locator("#af-fused").inner_text()


def test_empty_prompt_shows_an_error(page):
    pg = page
    fresh(pg)
    pg.locator("#af-prompt textarea").fill("   ")
    pg.locator("#af-run").click()
    text = wait_status(pg, "Error", 60)
    assert "prompt is empty" in text
    pg.screenshot(path=str(SHOTS / "empty-prompt.png"), full_page=True)


def test_evaluate_tab_lists_results_and_opens_a_trace(page):
    pg = page
    fresh(pg)
    open_tab(pg, "Evaluate")
    pg.locator("#af-eval-run").click()
    end = time.time() + 400
    while "runs on" not in pg.locator("#af-eval-status").inner_text():
        assert time.time() < end and "Error" not in pg.locator("#af-eval-status").inner_text()
        time.sleep(1)
    assert "adafuse" in pg.locator("#af-eval-summary").inner_text()
    pg.screenshot(path=str(SHOTS / "evaluate.png"), full_page=True)
    pg.get_by_role("button", name="Open in the explorer views").click()
    wait_status(pg, "rounds", 60)
    assert pg.locator("#af-fused .af-span").count() > 0
    pg.locator("#af-unload-pick input").click()  # last test: unloading costs the next run a reload
    pg.get_by_role("option", name="gemma3-270m", exact=True).click()
    pg.locator("#af-unload").click()
    pg.locator("#af-load-status", has_text="unloaded gemma3-270m").wait_for()
    end = time.time() + 30
    while "gemma3-270m" in pg.locator("#af-loaded").inner_text():
        assert time.time() < end, "the loaded-models table still lists gemma3-270m"
        time.sleep(0.5)
    assert "smollm2-135m-instruct" in pg.locator("#af-loaded").inner_text()
