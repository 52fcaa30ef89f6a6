"""Serve the app: ``python -m explorer [any streamlit run option]``.

The same as ``streamlit run app.py``, but the app's pages and the libraries they draw with
(altair, pandas, pyarrow for tables) are imported before the server listens, so the first
page a browser opens runs on imported modules instead of importing them while the user
waits: the first Estimate view in headless Chromium from an empty cache took 3.4 s with
``streamlit run app.py`` and 2.7 s this way (``benchmarks/bench_app.py --cold``, 2 cores,
2026-12-01). Options pass through: ``python -m explorer --server.port 8502``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

APP = Path(__file__).parent.parent / "app.py"


def main() -> None:
    import pyarrow  # noqa: F401  (st.dataframe's serialisation)
    from streamlit.web import cli

    # each page's st.cache_data checks its parameters when it is defined, and before the
    # runtime exists says so in a warning per function (the caches themselves are made
    # on first use, in the runtime): nothing for a user to act on
    quiet = logging.getLogger("streamlit.runtime.caching.cache_data_api")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        import explorer.pages
        import explorer.plan_page
        import explorer.results
        import explorer.serving
        import explorer.workloads  # noqa: F401
    finally:
        quiet.setLevel(level)
    sys.argv = ["streamlit", "run", str(APP), *sys.argv[1:]]
    cli.main()


if __name__ == "__main__":
    main()
