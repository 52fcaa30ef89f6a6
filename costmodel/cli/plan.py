"""``plan``: the fastest layouts that fit, with what limits each (``python -m costmodel plan``)."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import replace
from typing import Any

from costmodel.catalog.hardware import get_hardware
from costmodel.cli.args import device_word, flag, negation, to_json, values_of
from costmodel.cli.plan_args import MODEL_KEYS, TRAIN_KEYS, add_plan_arguments, global_batch
from costmodel.cli.plan_compare import Searched, compare_json, compare_text, prices_for, ranked
from costmodel.cli.sizing import (
    deadline_verdict,
    reliability,
    sized_plan,
    sizing_json,
    sizing_text,
    unsized,
)
from costmodel.cli.timeline import timeline_path, write_timeline
from costmodel.engine.caveats import plan_caveats
from costmodel.engine.fit import DEFAULT_HEADROOM, MEMORY_PARTS, rest_at_peak
from costmodel.engine.layouts import batch_choices, device_counts
from costmodel.engine.nearest import stated_layout
from costmodel.engine.plan import (
    RANKED_BY,
    TIE,
    Plan,
    PlanOptions,
    device_tie,
    layout_label,
    nearest_words,
    no_fit_text,
    plan,
)
from costmodel.engine.sizing import train_days
from costmodel.engine.why import difference_text, differences, nearest_fitting
from costmodel.inputs import build
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.units import GIB, fmt_bytes


def budget_cost(
    row: dict[str, Any], gpus: int, budget: float | None, price: float | None
) -> dict[str, float]:
    """Days (and, with a price per device-hour, cost) to train on ``budget`` tokens at the
    row's tokens/s on ``gpus`` devices; nothing without a budget."""
    if budget is None:
        return {}
    days = train_days(budget, row["tokens_per_s"])
    out = {"train_days": days}
    if price is not None:
        out["train_cost"] = days * 24 * gpus * price
    return out


def _table(p: Plan, rows: list[dict[str, Any]], seconds: float, max_gpus: int | None) -> str:
    hw, width = p.hardware, max([58, *(len(layout_label(r)) for r in rows)])
    varied = [k for k in ("gpus", "batch") if len(set(p.columns[k].tolist())) > 1]
    names = "".join(f"{'GPUs' if k == 'gpus' else k:>5} " for k in varied)
    head = [
        f"{p.model.name} on {_count_text(p, max_gpus)} x {hw.name}: batch {_batch_text(p)} x "
        f"seq {p.train.seq}, {p.train.precision}",
        f"{p.enumerated:,} layouts enumerated, {p.valid:,} valid evaluated, "
        f"{int(p.fits.sum()):,} fit "
        f"in {fmt_bytes(p.budget_bytes)} ({p.options.memory_headroom:.0%} of HBM); "
        f"searched in {seconds:.2f} s; ranked by {RANKED_BY[p.options.objective]}, those "
        f"within {TIE:.1%} of each other by {device_tie(p.options.objective)}, then fewer "
        "model-parallel ones",
        "",
        f"{'#':>3}  {names}{'layout':<{width}} {'step':>9} "
        f"{'tok/s/' + device_word(hw):>10} {'MFU':>6} {'peak GiB':>9}  limit"
        + (
            "  (days and cost at goodput 1: no failures or checkpoints)"
            if rows and "train_days" in rows[0]
            else ""
        ),
    ]
    for i, r in enumerate(rows, 1):
        extra = ""
        if "train_days" in r:
            extra = f"  {r['train_days']:,.1f} days"
            if "train_cost" in r:
                extra += f", ${r['train_cost']:,.0f}"
        cells = "".join(f"{r[k]:>5,} " for k in varied)
        head.append(
            f"{i:>3}  {cells}{layout_label(r):<{width}} {r['time_s.step']:>8.3f}s "
            f"{r['tokens_per_s'] / r['gpus']:>10,.0f} {r['mfu']:>6.1%} "
            f"{r['memory_bytes_per_device.peak'] / GIB:>9.1f}  {r['limit']}{extra}"
        )
    return "\n".join(head)


def _count_text(p: Plan, max_gpus: int | None) -> str:
    """``8``, or for a budget's search ``up to 1,000 (42 counts with a valid layout: 1,
    2, 3, ..., 960)``."""
    counts = sorted({int(g) for g in p.columns["gpus"]})
    if max_gpus is None:
        return f"{p.gpus:,}"
    shown = ", ".join(f"{c:,}" for c in counts[:3]) + f", ..., {counts[-1]:,}"
    text = f"up to {max_gpus:,} ({len(counts)} counts with a valid layout: {shown}"
    if p.skipped:
        text += (f"; {len(p.skipped)} smaller counts not searched: at their FLOP/s ceiling "
                 "they could not reach this table")  # fmt: skip
    return text + ")"


def _batch_text(p: Plan) -> str:
    sizes = sorted({int(b) for b in p.columns["batch"]})
    return f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}..{sizes[-1]} ({len(sizes)} sizes)"


def breakdown(row: dict[str, Any]) -> str:
    """The best layout's memory by component and time by phase (communication by group)."""
    mem = " + ".join(f"{k} {row[f'memory_bytes_per_device.{k}'] / GIB:,.1f}" for k in MEMORY_PARTS
                     if k != "frozen" or row[f"memory_bytes_per_device.{k}"])  # fmt: skip
    steps = ("forward", "backward", "bubble", "optimizer")
    phases = " + ".join(f"{k} {row[f'time_s.{k}']:.3f}" for k in steps)
    groups = [k for k in ("fsdp", "dp", "tp", "pp", "cp", "ep") if row[f"comm_time_s.{k}"] > 0]
    comm = ", ".join(f"{k} {row[f'comm_time_s.{k}']:.3f}" for k in groups) or "none"
    peak = row["memory_bytes_per_device.peak"] / GIB
    rest = rest_at_peak(row) / GIB
    rest_text = (f" + transients {rest:,.1f}" if rest >= 0 else
                 f" - {-rest:,.1f} (the parts are not all alive at once)")  # fmt: skip
    reserved = row["memory_bytes_per_device.reserved"] / GIB
    return "\n".join([
        f"\nbest: {layout_label(row)}",
        f"  memory per device (GiB): {mem}{rest_text} = peak {peak:,.1f}; reserved "
        f"{reserved:,.1f}",
        f"  step (s): {phases} = {row['time_s.step']:.3f} (compute {row['time_s.compute']:.3f})",
        f"  communication per step (s, hidden or exposed): {comm}",
    ])  # fmt: skip


_ROW_FLAGS = ("framework", "dp", "fsdp", "zero", "tp", "sequence_parallel", "pp", "pp_interleave",
              "cp", "ep", "etp", "ep_dispatcher", "ep_overlap", "grad_reduce_fp32",
              "recompute")  # fmt: skip
"""A plan row's columns that ``estimate`` takes as flags (its micro-batch as --microbatch)."""


def estimate_command(row: dict[str, Any], given: dict[str, Any], args: argparse.Namespace) -> str:
    """The ``estimate`` command that reproduces a plan row exactly: the question's model
    and training inputs as given, the cluster, and the row's layout, micro-batch and
    recompute (every flag stated, so no default is taken for it)."""
    argv = ["python", "-m", "costmodel", "estimate"]
    stated = {**given, **{k: row[k] for k in stated_layout(row, _ROW_FLAGS)},
              "microbatch": row["micro_batch"],
              "hardware": row.get("hardware", args.hardware), "gpus": row["gpus"],
              "batch": row["batch"]}  # fmt: skip
    if stated["etp"] == stated["tp"]:
        del stated["etp"]  # the experts split as the dense layers: estimate's default
    if stated["ep_dispatcher"] == "all-to-all":
        del stated["ep_dispatcher"]  # estimate's default
    for key, value in stated.items():
        if isinstance(value, bool):
            argv.append(flag(key) if value else negation(key))
        else:
            argv += [flag(key), str(value)]
    if args.memory_headroom != DEFAULT_HEADROOM:
        argv += ["--memory-headroom", str(args.memory_headroom)]
    return shlex.join(argv)


def _cmd_plan(args: argparse.Namespace) -> int:
    values = {k: v for k, v in values_of(args).items() if k in MODEL_KEYS | set(TRAIN_KEYS)}
    checks.integer("top", args.top)
    setup = build({**values, "batch": 1})  # the batch is the search's (its seq gives tokens)
    low, high = global_batch(args, setup.train.seq)
    setup = replace(setup, train=setup.train.replace(batch=high))
    counts = [args.gpus] if args.gpus is not None else []
    batches = batch_choices(low, high, counts=counts) if low != high else None
    _check_cost_flags(args)
    prices = prices_for(list(args.hardware), args.price_per_hour, args.objective)
    unsized(args)  # after the prices' own count is checked
    if len(set(args.hardware)) < len(args.hardware):
        raise SpecError("hardware", "hardware: name each device kind once")
    kinds = [(name, get_hardware(name)) for name in args.hardware]  # every name checked first
    found = [_search(args, values, setup, kind, price, batches)
             for kind, price in zip(kinds, prices, strict=True)]  # fmt: skip
    if len(found) > 1:
        return _compared(args, found)
    return _one(args, setup, batches, found[0], values)


def _check_cost_flags(args: argparse.Namespace) -> None:
    for name in ("token_budget", "deadline_days"):
        if getattr(args, name) is not None:
            checks.number(name, getattr(args, name))
    for price in args.price_per_hour or ():
        checks.number("price_per_hour", price)
    reliability(args)
    if args.deadline_days is not None and len(args.hardware) > 1:
        raise SpecError("deadline_days", "deadline_days sizes one --hardware: compare the "
                        "kinds without it, then size the best one")  # fmt: skip
    if args.timeline:
        timeline_path(args.timeline)


def _search(args, values, setup, kind: tuple, price: float | None, batches) -> Searched:
    """One device kind's plan (``kind``: its name as given and its profile) and its shown
    rows (days, cost, the estimate command)."""
    name, hw = kind
    options = PlanOptions(
        frameworks=args.frameworks, recompute=args.recompute, micro_batches=args.micro_batches,
        max_tp=args.max_tp, memory_headroom=args.memory_headroom, objective=args.objective,
        dispatchers=args.ep_dispatchers,
    )  # fmt: skip
    counts = args.gpus if args.max_gpus is None else device_counts(args.max_gpus,
                                                                   hw.devices_per_node)  # fmt: skip
    start = time.perf_counter()
    top = None if args.token_budget else args.top  # a sizing reads every count's best
    result = plan(setup.model, setup.train, hw, counts, options, batches, top)
    seconds = time.perf_counter() - start
    rows = [r | budget_cost(r, r["gpus"], args.token_budget, price) | {"hardware": name}
            for r in result.top(args.top)]  # fmt: skip
    for r in rows:
        r["estimate_command"] = estimate_command(r, values, args)
    return Searched(name, price, result, rows, seconds, counts)


def _timeline(args: argparse.Namespace, s: Searched) -> None:
    if args.timeline and len(s.plan.order):
        best = int(s.plan.order[0])
        out = write_timeline(args.timeline, s.plan.model, s.plan.train_spec(best),
                             s.plan.parallel_spec(best), s.plan.hardware)  # fmt: skip
        print(f"wrote the best layout's step timeline to {out}", file=sys.stderr)  # not --json's


def _one(args, setup: Any, batches: list[int] | None, s: Searched, values: dict) -> int:
    """One device kind: its ranked layouts, how the next differ from the best, the best's
    breakdown, each row's estimate command, with a token budget the sizing per GPU count;
    where nothing fits, the nearest layout that does."""
    result, rows = s.plan, s.rows
    for r in rows[1:]:
        r["vs_best"] = differences(r, rows[0])
    nearest = None if rows else _nearest(args, s, batches, values)
    _timeline(args, s)
    sized = sized_plan(result, args, s.price) if args.token_budget and len(result.order) else None
    if args.json:
        out = {"model": setup.model.name, "hardware": result.hardware.name,
               **({"gpus": args.gpus} if args.max_gpus is None else
                  {"max_gpus": args.max_gpus, "device_counts": s.counts}),
               "global_batch": list(batches) if batches else setup.train.batch,
               "enumerated": result.enumerated, "valid": result.valid,
               "skipped_counts": list(result.skipped),
               "fitting": int(result.fits.sum()), "budget_bytes": result.budget_bytes,
               "seconds": s.seconds, "top": rows,
               "caveats": plan_caveats(result, batches)}  # fmt: skip
        if not rows:
            out["no_fit"] = no_fit_text(result, nearest is None, flag)
            out["nearest_fit"] = nearest
        met = True
        if sized is not None:
            out["sizing"] = sizing_json(sized, args.deadline_days)
            met = "answer" in out["sizing"]
        print(to_json(out, indent=2))
        return 0 if rows and met else 1
    if not rows:
        print(no_fit_text(result, nearest is None, flag))
        print(_nearest_text(nearest))
        return 1
    said = deadline_verdict(sized, args.deadline_days) if sized is not None else None
    if said is not None:
        print(said)
    _print_rows(result, rows, s.seconds, args.max_gpus, batches)
    if sized is not None:
        print(sizing_text(result, sized, args.token_budget, args.deadline_days))
        return 0 if any(r.meets is not False for r in sized) else 1
    return 0


def _nearest(args, s: Searched, batches: list[int] | None, values: dict) -> dict | None:
    """The nearest layout that fits (``costmodel.engine.why``), with its estimate command."""
    p = s.plan
    row = nearest_fitting(p.model, p.train, p.hardware, s.counts, p.options, batches)
    if row is not None:
        row["hardware"] = s.hardware
        row["estimate_command"] = estimate_command(row, values, args)
    return row


def _nearest_text(row: dict | None) -> str:
    """:func:`nearest_words`, and the estimate command that reproduces the row."""
    return nearest_words(row) + (f"\n  {row['estimate_command']}" if row else "")


def _print_rows(
    result: Plan, rows: list[dict], seconds: float, max_gpus: int | None,
    batches: list[int] | None = None,
) -> None:  # fmt: skip
    print(_table(result, rows, seconds, max_gpus))
    if len(rows) > 1:
        print(
            f"\nhow the next differ from #1 (ties: the layouts within {TIE:.1%} of the "
            f"best not yet ranked rank by {device_tie(result.options.objective)}, then "
            "fewer model-parallel devices, then less memory; a reserve over the device's "
            "memory ranks last):"
        )
        objective = result.options.objective
        print("\n".join(f"{i:>3}  {difference_text(r, rows[0], objective)}"
                        for i, r in enumerate(rows[1:], 2)))  # fmt: skip
    print(breakdown(rows[0]))
    for text in plan_caveats(result, batches):
        print(f"  caveat: {text}")
    print("\neach row as estimate computes it:")
    print("\n".join(f"{i:>3}  {r['estimate_command']}" for i, r in enumerate(rows, 1)))


def _compared(args: argparse.Namespace, found: list[Searched]) -> int:
    """Several device kinds: their best layouts ranked by the objective, then the best
    kind's layouts as for one kind. Exit 1 when no kind has a layout that fits."""
    order = ranked(found, args.objective)
    no_fit = {s.hardware: no_fit_text(s.plan, name=flag) for s in found if s.best is None}
    winner = order[0] if order[0].best is not None else None
    if winner is not None:
        _timeline(args, winner)
    if args.json:
        out = {"model": found[0].plan.model.name, "hardware": list(args.hardware),
               "objective": args.objective, "compared": compare_json(order, args.objective,
                                                                     no_fit),
               "best_hardware": winner.hardware if winner else None,
               "top": winner.rows if winner else []}  # fmt: skip
        print(to_json(out, indent=2))
        return 0 if winner else 1
    print(compare_text(order, args.objective, no_fit))
    if winner is None:
        return 1
    print(f"\nbest: {winner.hardware}; its layouts:\n")
    _print_rows(winner.plan, winner.rows, winner.seconds, args.max_gpus)
    return 0


def add_plan(sub) -> None:
    p = sub.add_parser("plan", help="the fastest layouts that fit a cluster")
    add_plan_arguments(p)
    p.set_defaults(func=_cmd_plan)
