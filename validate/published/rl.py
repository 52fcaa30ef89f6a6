"""``python -m validate.published.rl [--sigma S ...] [--out DIR]``: predict each published RL
step of ``validate/published/rl_runs.json`` that carries a ``costmodel`` block with
``costmodel rl`` and print, per run, the measured and predicted seconds of generation,
training, scoring (the forward passes that score the rollouts) and weight sync, and the
share of the step spent generating, at each response-length spread ``--sigma`` (the
sources state the mean response length, not its spread: ``costmodel.rl.rollout``). With
``--out``, one JSON line per run and spread (``rl.jsonl``) and each run's phases, measured
and predicted, as stacked bars (``rl.svg``). Torch-free; a few seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from costmodel.rl import RLSpec, rl_step
from validate.published.serving import engine_of

RUNS = Path(__file__).with_name("rl_runs.json")
PHASES = {"generation_s": "rl.generation_s", "train_s": "rl.train_s",
          "ref_logprob_s": "rl.scoring_s", "weight_sync_s": "rl.weight_sync_s",
          "step_s": "rl.step_s"}  # fmt: skip


def spec_of(run: dict[str, Any], sigma: float) -> tuple[str, RLSpec, str]:
    """(model, spec, hardware) of a run's ``costmodel`` block at response spread ``sigma``;
    the rollout engine the release current at the run's date (NeMo-RL v0.3, July 2025:
    vLLM V1 with its scheduling in step, ``serving.engine_of``)."""
    cm = run["costmodel"]
    spec = RLSpec(prompts=run["prompts_per_step"], samples=run["samples_per_prompt"],
                  input=cm["input"], output=round(run["mean_response_len"]), gpus=cm["gpus"],
                  rollout_tp=cm["rollout_tp"], rollout_memory=cm["rollout_memory"],
                  rollout_engine=engine_of({"engine": run["rollout_engine"],
                                            "source": run["date"]}),
                  response_sigma=sigma, max_output=cm["max_total"] - cm["input"],
                  framework=cm["framework"], train_tp=cm["train_tp"], train_pp=cm["train_pp"],
                  train_ep=cm.get("train_ep", 1), pack_tokens=cm["max_total"],
                  sequence_parallel=cm.get("sequence_parallel", False),
                  minibatches=cm["minibatches"])  # fmt: skip
    return cm["model"], spec, cm["hardware"]


def rows(runs: list[dict[str, Any]], sigmas: list[float]) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        for sigma in sigmas:
            model, spec, hw = spec_of(run, sigma)
            pred = rl_step(model, spec, hw)
            row = {"run_id": run["run_id"], "source": run["source"], "sigma": sigma,
                   "measured_share": run["generation_s"] / run["step_s"],
                   "predicted_share": pred["rl.generation_share"]}  # fmt: skip
            for key, name in PHASES.items():
                row[f"measured.{key}"], row[f"predicted.{key}"] = run[key], pred[name]
            row["share_err"] = row["predicted_share"] / row["measured_share"] - 1
            out.append(row)
    return out


def chart(table: list[dict[str, Any]], path: Path) -> None:
    """Each run's phases, measured and predicted at each spread, as stacked bars (an SVG)."""
    import altair as alt

    from validate.report.render import chart_svg

    names = {"generation_s": "generation", "train_s": "training",
             "ref_logprob_s": "scoring", "weight_sync_s": "weight sync"}  # fmt: skip
    data, seen = [], set()
    for r in table:
        run = r["run_id"].removeprefix("nemo_rl_v0.3_")
        for key, phase in names.items():
            if (run, key) not in seen:
                data.append({"run": run, "bar": "measured", "phase": phase,
                             "seconds": r[f"measured.{key}"]})  # fmt: skip
            data.append({"run": run, "bar": f"sigma {r['sigma']:g}", "phase": phase,
                         "seconds": r[f"predicted.{key}"]})  # fmt: skip
            seen.add((run, key))
    bars = (
        alt.Chart(alt.Data(values=data))
        .mark_bar()
        .encode(
            x=alt.X("bar:N", title=None, sort=["measured"]),
            y=alt.Y("seconds:Q", title="seconds per RL step"),
            color=alt.Color("phase:N", sort=list(names.values())),
            column=alt.Column("run:N", title=None),
            tooltip=["run:N", "bar:N", "phase:N", alt.Tooltip("seconds:Q", format=".1f")],
        )
        .properties(width=110, height=260, title="Published RL steps: measured and predicted")
    )
    path.write_text(chart_svg(bars))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validate.published.rl", allow_abbrev=False)
    parser.add_argument("--runs", type=Path, default=RUNS)
    parser.add_argument("--sigma", type=float, nargs="+", default=[0.0, 0.5, 1.0],
                        help="response-length spreads to predict at")  # fmt: skip
    parser.add_argument("--out", type=Path, help="write rl.jsonl and rl.svg there")
    args = parser.parse_args(argv)
    try:
        runs = [r for r in json.loads(args.runs.read_text())["runs"] if r.get("costmodel")]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        print(f"error: --runs {args.runs}: {err}", file=sys.stderr)
        return 2
    table = rows(runs, args.sigma)
    print(f"{'run':38} {'sigma':>5} {'gen s':>13} {'train s':>13} {'score s':>13} "
          f"{'step s':>13} {'gen share':>15}")  # fmt: skip
    for r in table:
        cells = " ".join(
            f"{r[f'measured.{k}']:5.0f} / {r[f'predicted.{k}']:5.1f}"
            for k in ("generation_s", "train_s", "ref_logprob_s", "step_s")
        )
        print(f"{r['run_id'][:38]:38} {r['sigma']:5.2f} {cells} "
              f"{r['measured_share']:6.1%} / {r['predicted_share']:6.1%}")  # fmt: skip
    print("(measured / predicted; share error = predicted / measured share - 1)")
    for sigma in args.sigma:
        errs = [abs(r["share_err"]) for r in table if r["sigma"] == sigma]
        print(f"sigma {sigma:4.2f}: generation share |error| median {statistics.median(errs):.1%}, "
              f"worst {max(errs):.1%} over {len(errs)} runs")  # fmt: skip
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "rl.jsonl", "w") as fh:
            for r in table:
                fh.write(json.dumps(r) + "\n")
        chart(table, args.out / "rl.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
