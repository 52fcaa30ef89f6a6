"""How fast is the planner? Layout evaluations per second, and one whole search.

Run: ``.venv/bin/python benchmarks/bench_plan.py [--model llama3-70b] [--gpus 1024]``;
Calculon's own question, side by side with Calculon: ``benchmarks/bench_calculon.py``.
Targets (issue 58): >= 2,000,000 layout evaluations per second with time and memory
(the vectorised path); Llama-3-70B on 1024 GPUs searched in <= 1.5 s from a new process.
Reports the first search in this process (the formulas compute on numbers: nothing is
built or compiled, so a new process pays only its imports) and the search repeated, and
the evaluation rate over the search's valid layouts repeated to ``--n`` rows. A whole
new process, as a user runs it: ``time python -m costmodel plan --model llama3-70b
--hardware h100-sxm --gpus 1024 --seq 8192 --global-batch 1024``.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from timing import timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama3-70b")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--global-batch", type=int, default=2048)
    parser.add_argument("--n", type=int, default=1_000_000, help="layouts in the rate test")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from costmodel import TrainSpec, get_hardware, get_model
    from costmodel.engine.plan import LAYOUT, QUANTITIES, plan
    from costmodel.engine.sweep import sweep

    model, hw = get_model(args.model), get_hardware(args.hardware)
    train = TrainSpec(batch=args.global_batch, seq=args.seq, precision="bf16-mixed")
    search = lambda: plan(model, train, hw, args.gpus)  # noqa: E731
    first = timed(search, 1)[0]
    hot = timed(search, args.repeats)
    p = search()
    print(f"plan {args.model} on {args.gpus} x {args.hardware}: {p.enumerated:,} enumerated, "
          f"{p.valid:,} valid, {int(p.fits.sum()):,} fit, {p.structures} structures")  # fmt: skip
    print(f"  first {first:.2f} s, then median {statistics.median(hot):.3f} s "
          f"(best {min(hot):.3f} s)")  # fmt: skip

    reps = -(-args.n // p.valid)
    fields = {
        k: np.tile(p.columns[k], reps)[: args.n]
        for k in LAYOUT
        if k not in ("micro_batch", "batch", "gpus")
    }  # one batch (below) and count
    run = lambda: sweep(model, hardware=hw, quantities=QUANTITIES, batch=train.batch,  # noqa: E731
                        seq=train.seq, precision=train.precision, **fields)  # fmt: skip
    run()
    times = timed(run, args.repeats)
    med = statistics.median(times)
    print(
        f"sweep of {args.n:,} layouts x {len(QUANTITIES)} quantities (time, memory, MFU): "
        f"median {med:.3f} s, best {min(times):.3f} s ({args.n / med:,.0f} layouts/s)"
    )


if __name__ == "__main__":
    main()
