"""The 96 GB H100's one fitted parameter, rescanned: its sustained-clock ratio to the SXM5.

The profile ``h100-sxm-96gb`` (torchtitan's 500 W parts) is the SXM5's efficiencies and
attention-kernel rates times one ratio (``costmodel/catalog/data/hardware.json``, its
``source``), fitted on torchtitan's runs (0.72); its prior, the power cap's own ratio
(500/700) x (989.4/912) = 0.7749, is what a fold without those runs predicts with
(``tests/test_power_cap.py``). For each ratio this prints the rms log error and the median
|error| of tokens/s over the published runs on that part (torchtitan's, in
``validate/published/data/runs.json``), predicted as ``python -m validate.published`` does.

Run: ``.venv/bin/python benchmarks/sustained_clock_scan.py [--ratios 0.72,0.7749,...]``
(a few seconds a ratio).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from pathlib import Path

import validate.published.corpus as corpus
from costmodel import get_hardware
from validate.published.compare import rows_for

RUNS = Path(__file__).resolve().parents[1] / "validate/published/data/runs.json"
PART = "h100-sxm-96gb"


def profile_at(ratio: float):
    """The part's profile with every SXM5 rate it scales (matmul, fp8 matmul, attention
    kernels) at ``ratio``."""
    part, sxm = get_hardware(PART), get_hardware("h100-sxm")
    kernels = {name: {k: v * ratio if k in ("forward", "backward") else v for k, v in e.items()}
               for name, e in sxm.attention_kernels.items()}  # fmt: skip
    eff = {**part.efficiency, "matmul": sxm.efficiency["matmul"] * ratio,
           "matmul_fp8": sxm.efficiency["matmul_fp8"] * ratio}  # fmt: skip
    return dataclasses.replace(part, efficiency=eff, attention_kernels=kernels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ratios", default="0.70,0.72,0.74,0.7749,0.80")
    args = parser.parse_args()
    runs = [r for r in json.loads(RUNS.read_text())["runs"]
            if corpus.resolve_device(r["hardware"]) == PART]  # fmt: skip
    catalog = corpus.get_hardware
    print(f"{len(runs)} runs on {PART}\nratio  rms log error  median |error|")
    try:
        for ratio in (float(r) for r in args.ratios.split(",")):
            hw = profile_at(ratio)
            corpus.get_hardware = lambda name, hw=hw: hw if name == PART else catalog(name)
            rows = [row for run in runs for row in rows_for(run)
                    if row["quantity"] == "tokens_per_s_per_gpu"]  # fmt: skip
            logs = [math.log(1 + row["rel_err"]) for row in rows if row.get("rel_err") is not None]
            rms = math.sqrt(statistics.fmean(x * x for x in logs))
            median = statistics.median(abs(math.expm1(x)) for x in logs)
            print(f"{ratio:.3f}  {rms:.4f}         {median:.2%}", flush=True)
    finally:
        corpus.get_hardware = catalog


if __name__ == "__main__":
    main()
