"""``python -m validate.published.serving [--runs FILE] [--out DIR]``: predict every
published serving run (``validate/published/serving_runs.json``) with ``costmodel serve``
and print the error per source (median and worst |predicted / measured − 1|). With
``--out``, one JSON line per run and a predicted-vs-measured chart (``serving.svg``).
Torch-free; a second or two.

A run's batch is what its source states, or for an offline max-throughput run ("max") what
its engine fits: costmodel's ``max_batch`` at the engine's memory share, at most the run's
requests and the engine's batch cap (``costmodel.specs.engines``: the run's engine kind,
:func:`engine_of`).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from costmodel import Hardware, get_hardware, get_model
from costmodel.answers.serve import spec_of
from costmodel.serving import serve
from costmodel.specs.checks import SpecError
from costmodel.specs.engines import engine
from costmodel.specs.serving import MAX_REQUESTS, ServeSpec

RUNS = Path(__file__).with_name("serving_runs.json")
ENGINE_RULES = (
    ("TensorRT-LLM", "trtllm"),
    ("NVIDIA NIM", "trtllm"),
    ("vLLM", "vllm"),
    ("SGLang", "sglang"),
)
"""A run's engine string -> the engine kind (``costmodel.specs.engines``); NIM's LLM
containers run TensorRT-LLM. A vLLM run's generation comes from its stated version
(:func:`engine_of`)."""
VLLM_BY_DATE = (("2024-09", "vllm-0.6"), ("2025-03", "vllm-0.8"), ("2026-02", "vllm"))
"""Where a vLLM run states no version, the generation current at the source's date (in its
name): vLLM 0.6.0 came out in September 2024, V1 became the default in 0.8.0 (March
2025), asynchronous scheduling in 0.14.0 (January 2026; from February on); before either,
``vllm-0.5``. Without a date: the current engine."""
MEMORY_SHARE = {"trtllm": 0.95}
"""The memory share the runs state where it is not the engine's default: TensorRT-LLM's
perf overviews set ``kv_cache_free_gpu_mem_fraction`` 0.95."""
METRICS = {
    "output_tokens_per_s": "throughput.output_tokens_per_s",
    "ttft_s": "time_s.ttft",
    "tpot_s": "time_s.tpot",
    "e2e_s": "time_s.e2e",
}


def engine_of(run: dict[str, Any]) -> str:
    """The engine kind a run is priced with: by its engine string (``ENGINE_RULES``), for
    vLLM by the version it states (< 0.6: ``vllm-0.5``, 0.6-0.7: ``vllm-0.6``, 0.8-0.13:
    ``vllm-0.8``, later ``vllm``: asynchronous scheduling is the default from 0.14.0, its
    release notes) or else by its source's date (``VLLM_BY_DATE``)."""
    kind = next((k for name, k in ENGINE_RULES if run["engine"].startswith(name)), "vllm")
    if kind != "vllm":
        return kind
    version = re.match(r"(\d+)\.(\d+)", str(run.get("engine_version") or ""))
    if version:
        minor = (int(version[1]), int(version[2]))
        for below, kind in (((0, 6), "vllm-0.5"), ((0, 8), "vllm-0.6"), ((0, 14), "vllm-0.8")):
            if minor < below:
                return kind
        return "vllm"
    date = re.search(r"(\d{4}-\d{2})-\d{2}", run["source"])
    if not date:
        return "vllm"
    return next((k for since, k in reversed(VLLM_BY_DATE) if date[1] >= since), "vllm-0.5")


LAYOUT = ("dp", "pp", "ep", "concurrency", "request_rate", "length_spread")
"""Fields a run may state beyond the one-replica static batch (absent: the default)."""
STATISTICS = {"median": "p50", "p50": "p50", "p90": "p90", "p99": "p99"}
"""A latency's statistic as stated -> the simulated workload's percentile (``mean``: the
metric itself)."""


def _spec(run: dict[str, Any], batch: int | None) -> ServeSpec:
    """The run as ``costmodel serve`` states it (``answers.serve.spec_of``, the CLI's and
    the API's rules: a closed loop of ``concurrency`` users or a ``request_rate`` is
    simulated, at most the engine's batch cap in flight where the run states no batch)."""
    kind = engine_of(run)
    values = {"input": run["input"], "output": run["output"], "batch": batch,
              "precision": run["precision"], "kv_dtype": run.get("kv_dtype"), "tp": run["tp"],
              "engine": kind, "memory_utilization": MEMORY_SHARE.get(kind),
              "rope_scaling": run.get("rope_scaling")}  # fmt: skip
    values.update({k: run[k] for k in LAYOUT if run.get(k) is not None})
    simulated = run.get("concurrency") is not None or run.get("request_rate") is not None
    if simulated and run.get("num_requests"):
        values["requests"] = min(int(run["num_requests"]), MAX_REQUESTS)
    return spec_of(values)


def batch_of(run: dict[str, Any]) -> int | None:
    """The batch a run is priced at: the one it states, for an offline max-throughput run
    what its engine fits (memory only: no fitted parameter moves it), or None (the engine's
    cap) for a simulated workload that states none."""
    if run.get("batch") is None:
        return None
    if run["batch"] != "max":
        return int(run["batch"])
    cap = engine(engine_of(run)).max_seqs
    model, hw = get_model(run["model"]), get_hardware(run["hardware"])
    fits = serve(model, _spec(run, 1), hw)["max_batch"]
    return max(1, min(fits, run.get("num_requests") or cap, cap))


def quantity(run: dict[str, Any]) -> str:
    """The estimate's key for the run's metric and its statistic (a latency's percentile
    comes from the simulated workload)."""
    stat = run.get("statistic") or "mean"
    if stat == "mean" or run["metric"] not in ("ttft_s", "tpot_s", "e2e_s"):
        return METRICS[run["metric"]]
    if stat not in STATISTICS:
        raise SpecError("statistic", f"statistic must be mean or one of "
                        f"{', '.join(STATISTICS)} (got {stat!r})")  # fmt: skip
    return f"workload.{run['metric']}.{STATISTICS[stat]}"


def predict(
    run: dict[str, Any],
    tune: Callable[[Hardware], Hardware] | None = None,
    batch: int | None = None,
) -> dict[str, Any]:
    """costmodel's value of the run's metric, and the batch it was taken at; ``tune`` sets
    fitted parameters of the device (``validate.published.loso``), ``batch`` the batch
    :func:`batch_of` gave."""
    model, hw = get_model(run["model"]), get_hardware(run["hardware"])
    hw = tune(hw) if tune is not None else hw
    batch = batch_of(run) if batch is None else batch
    est = serve(model, _spec(run, batch), hw)
    key = quantity(run)
    if key not in est:
        raise SpecError("statistic", f"{run.get('statistic')} {run['metric']} needs a simulated "
                        "workload (concurrency or request_rate)")  # fmt: skip
    return {"predicted": est[key], "batch": batch}


def rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        row = {k: run[k] for k in ("source", "model", "hardware", "tp", "input", "output",
                                   "precision", "metric", "measured")}  # fmt: skip
        try:
            row.update(predict(run))
            row["rel_err"] = row["predicted"] / run["measured"] - 1
        except SpecError as err:
            row.update(predicted=None, rel_err=None, error=str(err))
        out.append(row)
    return out


def table(results: list[dict[str, Any]]) -> str:
    """Per source, per metric its sources state (throughput, TTFT, TPOT, end to end: the
    serving issue's targets) and over all: runs, median and worst |error|."""
    by, metrics = defaultdict(list), defaultdict(list)
    for r in results:
        if r["rel_err"] is not None:
            by[r["source"]].append(abs(r["rel_err"]))
            by["all"].append(abs(r["rel_err"]))
            metrics[f"all: {FAMILIES.get(r['metric'], r['metric'])}"].append(abs(r["rel_err"]))
    lines = [f"{'source':<48} {'n':>3} {'median':>8} {'worst':>8}"]
    ordered = sorted(by.items(), key=lambda kv: (kv[0] == "all", kv[0]))
    for source, errs in [*ordered, *sorted(metrics.items())]:
        lines.append(f"{source:<48} {len(errs):>3} {statistics.median(errs):>8.1%} "
                     f"{max(errs):>8.1%}")  # fmt: skip
    return "\n".join(lines)


FAMILIES = {"output_tokens_per_s": "throughput", "total_tokens_per_s": "throughput",
           "ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "end to end"}  # fmt: skip
"""A run's metric -> the family the table pools it in."""


def chart(results: list[dict[str, Any]], path: Path) -> None:
    """Predicted over measured per run, by metric and source (an SVG)."""
    import altair as alt
    import vl_convert

    data = [{**r, "ratio": r["predicted"] / r["measured"]} for r in results if r["predicted"]]
    points = alt.Chart(alt.Data(values=data)).mark_point(filled=True, size=60).encode(
        x=alt.X("metric:N", title=None),
        y=alt.Y("ratio:Q", scale=alt.Scale(type="log"), title="predicted / measured"),
        color="source:N",
        tooltip=["source:N", "model:N", "hardware:N", "tp:Q", "input:Q", "output:Q",
                 "batch:N", "measured:Q", "predicted:Q"],
    ).properties(width=420, height=300, title="Published serving runs")  # fmt: skip
    path.write_text(vl_convert.vegalite_to_svg(points.to_dict()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m validate.published.serving",
                                description=__doc__.split("\n")[0], allow_abbrev=False)  # fmt: skip
    p.add_argument("--runs", default=str(RUNS), help="a serving corpus JSON")
    p.add_argument("--out", help="folder for results.jsonl and serving.svg")
    args = p.parse_args(argv)
    try:
        runs = json.loads(Path(args.runs).read_text())["runs"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"error: --runs {args.runs}: {err}", file=sys.stderr)
        return 2
    results = rows(runs)
    for r in results:
        shown = f"{r['rel_err']:+.1%}" if r["rel_err"] is not None else f"not stated: {r['error']}"
        print(f"{r['source']} {r['model']} {r['hardware']} tp{r['tp']} {r['input']}/"
              f"{r['output']} {r['metric']}: {shown}", file=sys.stderr)  # fmt: skip
    print(table(results))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with (out / "results.jsonl").open("w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in results)
        chart(results, out / "serving.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
