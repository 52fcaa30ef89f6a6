"""Korthikanti et al. 2022, Table 5: eight iteration times, predicted (``python -m
validate.published.table5``).

Table 5 of "Reducing Activation Recomputation in Large Transformer Models" (arXiv
2205.05198) times one training iteration of four GPT models (22B, 175B, 530B, 1T on 8,
64, 280 and 512 A100s) twice: with full activation recomputation, and with the paper's
selective recomputation and sequence parallelism ("present work"). The full-recomputation
rows are ``validate/published/data/korthikanti_table5.json`` (their ``step_time_s``); the
present-work rows are the same models, GPUs and batches as runs.json's ``korthikanti22-a100-*``
rows, which state the MFU the Megatron-LM README quotes, so their Table 5 times are taken here,
as Calculon's authors read them (calculon-ai/calculon calculon/llm/validation.py @2dd9c5c8,
``seqsel_tab5``: 'seqsel' 1.10, 13.75, 37.83, 71.49 s). Each is predicted from its run's
fields (:func:`validate.published.corpus.case_of`, as ``python -m validate.published``
does) and compared in step time: |predicted / measured - 1|, the figure Calculon reports
for itself (3.65 % mean over these eight; Isaev et al. 2023, Sec. 5). Torch-free.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

from validate.published.compare import predict
from validate.published.corpus import case_of, load_runs

DATA = Path(__file__).resolve().parent / "data"
PRESENT_WORK_S = {
    "korthikanti22-a100-22B": 1.10,
    "korthikanti22-a100-175B": 13.75,
    "korthikanti22-a100-530B": 37.83,
    "korthikanti22-a100-1T": 71.49,
}
"""Table 5's present-work iteration times (s), keyed by the runs.json row of the same
model, GPUs and batch (read in Calculon's ``validation.py`` @2dd9c5c8, ``seqsel_tab5``)."""


@dataclass(frozen=True)
class Row:
    """One of Table 5's iteration times and its prediction (seconds)."""

    run: str
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        """Relative step-time error, predicted / measured - 1."""
        return self.predicted_s / self.measured_s - 1


def rows() -> list[Row]:
    """The eight Table 5 iteration times with their predictions: the four present-work
    rows of runs.json, then the four full-recomputation rows."""
    present = [r for r in load_runs(DATA / "runs.json") if r["id"] in PRESENT_WORK_S]
    full = load_runs(DATA / "korthikanti_table5.json")
    out = []
    for run in present + full:
        case = case_of(run)
        tokens = run["global_batch"] * case.train.seq
        per_gpu = predict(case)["tokens_per_s_per_gpu"]
        measured = PRESENT_WORK_S.get(run["id"]) or run["measured"]["step_time_s"]
        out.append(Row(run["id"], measured, tokens / (per_gpu * run["n_gpus"])))
    return out


def main(argv: list[str] | None = None) -> int:
    """Print each iteration time, predicted and measured, and the mean |error|."""
    argparse.ArgumentParser(prog="python -m validate.published.table5",
                            description=__doc__.split("\n")[0]).parse_args(argv)  # fmt: skip
    table = rows()
    print(f"{'run':42s} {'Table 5 s':>10s} {'predicted s':>12s} {'error':>8s}")
    for row in table:
        print(f"{row.run:42s} {row.measured_s:10.2f} {row.predicted_s:12.2f} {row.error:+8.2%}")
    errors = [abs(row.error) for row in table]
    print(f"mean |error| {statistics.fmean(errors):.2%}, median {statistics.median(errors):.2%},"
          f" worst {max(errors):.2%} over {len(table)} iteration times")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
