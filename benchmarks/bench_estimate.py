"""How fast is the cost model? One scalar estimate, and a sweep of 1,000,000 configurations.

Run: ``.venv/bin/python benchmarks/bench_estimate.py [--model cs336-2.7b] [--n 1000000]``.
Targets (issue 2): <= 1 ms per estimate after warm-up, <= 1 s for the sweep, on 2 cores.
Prints medians over repeats; the first (cold) call includes building and lambdifying the
expressions, reported separately. ``--formulas`` times what a notebook does instead (issue
58: ``est.expr(key)`` <= 2 s for every quantity, then ``est.evaluate``), on Llama-3-8B over
tp 4 x pp 2.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from timing import timed

from costmodel import TrainSpec, estimate, get_model, sweep
from costmodel.engine.quantities import compiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="cs336-2.7b")
    parser.add_argument("--n", type=int, default=1_000_000, help="configurations in the sweep")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--formulas", action="store_true", help="time expr() per quantity")
    args = parser.parse_args()
    if args.formulas:
        formulas()
        return

    model, train = get_model(args.model), TrainSpec(batch=4, seq=1024)
    compiled.cache_clear()
    cold = timed(lambda: estimate(model, train), 1)[0]
    warm = timed(lambda: estimate(model, train), 2000)
    n_keys = len(estimate(model, train).values)
    print(
        f"estimate ({args.model}, {n_keys} quantities): cold {cold * 1e3:.0f} ms "
        f"(build + lambdify), warm median {statistics.median(warm) * 1e6:.0f} us, "
        f"p99 {np.percentile(warm, 99) * 1e6:.0f} us"
    )

    rng = np.random.default_rng(0)
    batch = rng.integers(1, 513, args.n)
    seq = 2 ** rng.integers(7, 16, args.n)
    sweep(args.model, batch=batch[:10], seq=seq[:10])  # warm the cache
    times = timed(lambda: sweep(args.model, batch=batch, seq=seq), args.repeats)
    best, med = min(times), statistics.median(times)
    print(
        f"sweep of {args.n:,} configurations x {n_keys} quantities: median {med:.3f} s, "
        f"best {best:.3f} s ({args.n / med:,.0f} configurations/s)"
    )


def formulas() -> None:
    """``expr`` then ``evaluate`` of every quantity of one layout, each timed once (the
    expressions are built on the first, so the first key carries the build)."""
    est = estimate("llama3-8b", hardware="h100-sxm", tp=4, pp=2, batch=8, seq=4096)
    worst: list[tuple[float, float, str]] = []
    for key in est:
        expr_s = timed(lambda key=key: est.expr(key), 1)[0]
        formula = est.expr(key)
        eval_s = timed(lambda formula=formula: est.evaluate(formula), 1)[0]
        worst.append((expr_s, eval_s, key))
        print(f"{key}: expr {expr_s:.3f} s, evaluate {eval_s:.3f} s", flush=True)
    slowest = max(worst)
    print(f"{len(worst)} quantities: slowest expr {slowest[0]:.3f} s ({slowest[2]}), "
          f"slowest evaluate {max(w[1] for w in worst):.3f} s")  # fmt: skip


if __name__ == "__main__":
    main()
