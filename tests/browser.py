"""Helpers of the browser tests: the app started on a free port (on the toy models, `python -m tests.toy_app`, or on
the bundled pair, `python app.py`), driven with Playwright and Debian's Chromium (the fixtures live in conftest.py)."""
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SHOTS = ROOT / "artifacts" / "screenshots"

if not Path(CHROMIUM).exists():
    if os.environ.get("ADAFUSE_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"{CHROMIUM} is missing: apt-get install -y chromium")
    pytest.skip("no Chromium here (CI installs it and sets ADAFUSE_REQUIRE_BROWSER=1)", allow_module_level=True)

# A page's answer comes after rounds on a machine two test workers, a vLLM server and Chromium share: an assertion
# waits as long as an action does (Playwright's 5 s default failed CI once while the visitor's decode ran)
expect.set_options(timeout=30_000)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TEST_SLOTS = 2  # decodes at once on the toy app: two visitors decode together, a third waits in line


def serve(args: list[str], log_name: str, slots: int = TEST_SLOTS):
    """Start the app (`python ARGS`) with `slots` decodes at once; yields its URL, stops it after. Its output goes to
    artifacts/LOG_NAME."""
    port = free_port()
    (ROOT / "artifacts").mkdir(exist_ok=True)
    log = open(ROOT / "artifacts" / log_name, "w")
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False",
                                 "ADAFUSE_DECODE_SLOTS": str(slots)})
    url = f"http://127.0.0.1:{port}/"
    for _ in range(120):
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError:
            time.sleep(1)
    else:
        proc.kill()
        raise RuntimeError(f"the app did not start: see artifacts/{log_name}")
    yield url
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


def launch():
    """Chromium under Playwright (one per test session: Playwright's sync API runs once per thread); yields it."""
    from playwright.sync_api import sync_playwright
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--no-first-run", "--disable-sync", "--disable-quic"])
        yield browser
        browser.close()


# Gradio's pending shimmer, progress bars and transitions repaint the page while a test waits; with no GPU Chromium's
# renderer drew them on the cores the tests share (measured: 59 → 45 s of its CPU over six tests). Motion off, as
# for a visitor who asks for reduced motion; no test checks a movement.
STILL = """addEventListener('DOMContentLoaded', () => { const s = document.createElement('style');
  s.textContent = '*, *::before, *::after { animation: none !important; transition: none !important; }';
  document.head.appendChild(s); });"""

# Every Gradio page (a lone Textbox too) keeps a requestAnimationFrame loop running at 60 frames a second while idle
# (measured: 60 calls a second after a run, from a spring of Gradio's status tracker no longer in the page); with no
# GPU each frame costs Chromium's renderer and GPU process CPU that the tests share. Frames at most 10 a second
# (measured on an idle page: 2.6 → 0.9 CPU-s in 20 s): the same drawing, later by at most 0.1 s.
FRAMES = """(() => { const raf = window.requestAnimationFrame.bind(window), caf = window.cancelAnimationFrame.bind(window);
  const live = new Map(); let next = 1;
  window.requestAnimationFrame = cb => { const id = next++;
    live.set(id, setTimeout(() => live.set(id, -raf(t => { live.delete(id); cb(t); })), 100)); return id; };
  window.cancelAnimationFrame = id => { const v = live.get(id); if (v === undefined) return; live.delete(id);
    v < 0 ? caf(-v) : clearTimeout(v); }; })();"""


def new_page(browser, width: int = 1400, height: int = 1000):
    """A page in a context of its own (its own session cookies), motion off, frames at most 10 a second."""
    context = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True,
                                  reduced_motion="reduce")
    context.add_init_script(STILL)
    context.add_init_script(FRAMES)
    return context.new_page()


def browse(browser, server):
    """A page of `browser` on the app at `server`; yields it, closes it after."""
    pg = new_page(browser)
    context = pg.context
    pg.set_default_timeout(60_000)
    pg.goto(server)
    pg.get_by_text("AdaFuse Explorer").first.wait_for()
    yield pg
    context.close()


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
    box = pg.locator("#af-prompt textarea")
    for _ in range(20):
        pg.get_by_role("button", name=label).click()
        try:
            expect(box).to_have_value(re.compile(re.escape(needle)), timeout=1_000)
            return
        except AssertionError:
            continue
    raise AssertionError(f"example {label!r} did not fill the prompt")


def fresh(pg, label: str | None = None, needle: str = ""):
    """Reset the session, then pick an example."""
    pg.locator("#af-reset").click()
    wait_status(pg, "reset", fail_on_error=False)
    if label:
        pick_example(pg, label, needle)


def open_accordion(pg, title: str, inside: str) -> None:
    """Open a settings accordion unless an earlier test left it open (a click on an open one closes it)."""
    if not pg.locator(inside).is_visible():
        pg.get_by_text(title).click()
    pg.locator(inside).wait_for(state="visible")


def upload_trace(pg, path) -> None:
    """Pick a trace file with the "Load a saved trace" button (a file chooser, as a person would)."""
    with pg.expect_file_chooser() as chooser:
        pg.locator("#af-upload").click()
    chooser.value.set_files(str(path))


def type_number(box, n, shown=None) -> None:
    """Type `n` into a number box until it (or `shown`, e.g. its slider) holds it: an update still in flight (a reset,
    an example's settings) can set it back once, so type again."""
    for attempt in range(3):
        box.fill(str(n))
        box.press("Tab")
        try:
            expect(shown or box).to_have_value(str(n), timeout=5_000)
            return
        except AssertionError:
            if attempt == 2:
                raise


def cap_words(pg, n: int) -> None:
    """Lower Max new words (an example set it) where a test needs no longer answer than `n` words."""
    type_number(pg.locator("#af-max-words input[type=number]"), n, pg.locator("#af-max-words input[type=range]"))


def open_tab(pg, name: str):
    tab = pg.get_by_role("tab", name=name)
    tab.click()
    expect(tab).to_have_attribute("aria-selected", "true")


