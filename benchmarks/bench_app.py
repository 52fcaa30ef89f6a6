"""Time per interaction of the explorer page, as the page itself reports it.

    .venv/bin/python benchmarks/bench_app.py

Runs ``app.py`` headless (``streamlit.testing.v1.AppTest``), changes one widget at a time
and reads the page's "computed in N ms" caption (the script's own time, without the
browser). The first run builds and compiles the expressions; later runs hit the caches.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).parent.parent / "app.py")
CHANGES = [("batch", 64), ("gpus", 8), ("seq", 2048), ("batch", 128), ("fsdp", 4),
           ("seq", 4096), ("gpus", 16), ("batch", 256), ("precision", "fp32"),
           ("hardware", "a100-80gb"), ("recompute", "full"), ("attention", "naive"),
           ("model", "llama3-8b")]  # fmt: skip


def _ms(at: AppTest) -> float:
    captions = [c.value for c in at.caption if c.value.startswith("computed in")]
    if not captions:
        raise SystemExit(f"the page shows an error: {[e.value for e in at.error]}")
    caption = captions[0]
    return float(caption.split()[2])


def main() -> None:
    at = AppTest.from_file(APP, default_timeout=300).run()
    print(f"first run (cold caches): {_ms(at):.0f} ms")
    times = []
    for key, value in CHANGES:
        widget = at.selectbox(key=key) if isinstance(value, str) else at.number_input(key=key)
        widget.set_value(value).run()
        assert not at.exception
        times.append(_ms(at))
        print(f"  {key}={value}: {times[-1]:.0f} ms")
    print(f"interactions: median {statistics.median(times):.0f} ms, max {max(times):.0f} ms")


if __name__ == "__main__":
    main()
