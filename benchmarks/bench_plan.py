"""How fast is the planner? Layout evaluations per second, and one whole search.

Run: ``.venv/bin/python benchmarks/bench_plan.py [--model llama3-70b] [--gpus 1024]``;
``--calculon`` times Calculon's own question (issue 37, item 6) as the CLI searches it;
Calculon itself, side by side (its repository at commit caa4b11, ``pip install -e .
numpy pandas psutil`` in a venv of its own): ``calculon llm-optimal-execution
models/turing-530B.json 5128 2520 float16 systems/a100_80g.json -m -c 2 out.json``.
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
    parser.add_argument("--calculon", action="store_true", help="time Calculon's question "
                        "(Turing-NLG 530B, up to 5,128 A100-80GB, global batch up to 2,520) as "
                        "the CLI searches it (top 10)")  # fmt: skip
    args = parser.parse_args()
    if args.calculon:
        return calculon_question(args.repeats)
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


def calculon_question(repeats: int) -> None:
    """``plan --d-model 20480 --n-layers 105 --n-heads 128 --vocab 51200 --d-ff 81920 --ffn
    gelu --norm layernorm --pos learned --max-positions 2048 --seq 2048 --precision
    fp16-mixed --hardware a100-80gb --max-gpus 5128 --global-batch :2520``: the first search
    in this process, then repeated."""
    from costmodel import get_hardware
    from costmodel.engine.layouts import batch_choices, device_counts
    from costmodel.engine.plan import plan
    from costmodel.inputs import build

    setup = build(dict(d_model=20480, n_layers=105, n_heads=128, vocab=51200, d_ff=81920,
                       ffn="gelu", norm="layernorm", pos="learned", max_positions=2048,
                       seq=2048, precision="fp16-mixed", batch=2520))  # fmt: skip
    hw, counts, batches = get_hardware("a100-80gb"), device_counts(5128, 8), batch_choices(1, 2520)
    search = lambda: plan(setup.model, setup.train, hw, counts, batches=batches, top=10)  # noqa: E731
    first = timed(search, 1)[0]
    again = timed(search, repeats)
    p = search()
    print(f"Turing-NLG 530B, up to 5,128 x a100-80gb, batch up to 2,520 (top 10): "
          f"{len(counts)} counts, {len(p.skipped)} skipped by their FLOP/s ceiling; "
          f"{p.enumerated:,} enumerated, {p.valid:,} valid, {int(p.fits.sum()):,} fit")  # fmt: skip
    print(f"  first {first:.2f} s, then median {statistics.median(again):.2f} s")
    print("  best:", p.summary(1)[1])


if __name__ == "__main__":
    main()
