"""End to end: ``streamlit run app.py`` on localhost, opened in headless Chromium.

Uses Debian's chromium (``/usr/bin/chromium``, installed by ``.ci/run``) driven by
Playwright. The page is opened with a shared-link query string; the test checks the key
numbers, changes a widget and saves screenshots to ``test-artifacts/`` (or
``$TEST_ARTIFACTS``). Skips with the reason when Chromium or Playwright is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from validate.distributed.launch import free_port

ROOT = Path(__file__).parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS", ROOT / "test-artifacts"))
FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"),
           "--server.port", str(port), "--server.address", "127.0.0.1",
           "--server.headless", "true", "--browser.gatherUsageStats", "false"]  # fmt: skip
    # The server's log goes to a file: an unread pipe fills up and blocks the server.
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"streamlit did not start: {log.read_text(errors='replace')[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL: a loaded machine may take longer than any fixed wait to shut
    Streamlit down gracefully, and how fast it exits is not what this test checks."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _metric(page, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]').filter(has_text=label).first
    return box.locator('[data-testid="stMetricValue"]').inner_text()


def test_app_in_chromium(server):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1100})
        page.goto(f"{server}/?model=gpt2&batch=64&seq=512", timeout=60_000)
        page.get_by_text("What will training this transformer cost?").wait_for(timeout=60_000)
        page.locator('[data-testid="stMetricValue"]').first.wait_for(timeout=60_000)
        page.get_by_text("Fits:").wait_for(timeout=60_000)
        assert _metric(page, "parameters") == "124.44 M"
        assert "of 80 GiB" in page.locator('[data-testid="stMetric"]').nth(1).inner_text()
        page.locator(".vega-embed").first.wait_for(timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "app.png"), full_page=True)
        before = _metric(page, "memory per device (GiB)")
        seq = page.get_by_label("sequence length")  # (the batch is accumulated: micro-batch 1)
        seq.fill("768")
        seq.press("Enter")
        page.wait_for_function(
            "([sel, old]) => document.querySelectorAll(sel)[1]?.innerText !== old",
            arg=['[data-testid="stMetricValue"]', before],
            timeout=30_000,
        )
        assert float(_metric(page, "memory per device (GiB)")) > float(before)
        assert "seq=768" in page.url  # the URL follows the widgets
        page.screenshot(path=str(ARTIFACTS / "app-seq768.png"), full_page=True)
        browser.close()
