"""The app as the README starts it (``python -m explorer``: ``streamlit run app.py`` with
the pages imported first) on a free localhost port, and the headless Chromium that opens
it, for the browser test and benchmark (Debian's ``chromium``, driven by Playwright).

The server's log goes to a file (an unread pipe fills up and blocks the server); the
server is stopped with SIGTERM, then SIGKILL: a loaded machine may take longer than any
fixed wait to shut Streamlit down gracefully.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from validate.distributed.launch import free_port

ROOT = Path(__file__).parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@contextmanager
def app_server(log: Path, start_s: float = 60.0, cache: Path | None = None) -> Iterator[str]:
    """Yield the running app's base URL; its output goes to ``log``; ``cache``: its disk
    cache folder (``COSTMODEL_CACHE``), else the user's."""
    env = {**os.environ, "COSTMODEL_CACHE": str(cache)} if cache else None
    port = free_port()
    cmd = [sys.executable, "-m", "explorer",
           "--server.port", str(port), "--server.address", "127.0.0.1",
           "--server.headless", "true", "--browser.gatherUsageStats", "false"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc, log, start_s)
        yield url
    finally:
        _stop(proc)


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, start_s: float) -> None:
    deadline = time.monotonic() + start_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"streamlit did not start: {log.read_text(errors='replace')[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
