"""``bounds`` and ``solve`` subcommands of ``python -m costmodel``."""

from __future__ import annotations

import argparse
from typing import Any

from costmodel.book.bounds import LABEL, bounds_report
from costmodel.book.fsdp import min_fsdp
from costmodel.catalog.hardware import get_hardware
from costmodel.cli.args import (
    PARALLEL_INPUTS,
    add_headroom,
    add_layout_args,
    add_model_args,
    build_model_only,
    to_json,
    values_of,
)
from costmodel.cli.estimate import format_rows, verdict_rows
from costmodel.cli.solve_text import bounds_rows, max_rows, min_fsdp_rows
from costmodel.engine.estimate import Estimate, estimate
from costmodel.engine.fit import budget_bytes, budget_from, check_headroom
from costmodel.engine.inverse import max_fitting, min_fsdp_fitting
from costmodel.inputs import BY_KEY, build, expert_start, refuse_solved, section_of, solved_verdict
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.parallel import ParallelSpec
from costmodel.units import GB


def _budget(args: argparse.Namespace, device: str | None = None) -> float | None:
    """The budget given in bytes (None: the fit rule's), refused where it exceeds the memory
    of the device the question runs on (``device``: the default one, else --hardware): a
    peak over the device's memory does not fit it, whatever the budget says."""
    budget = budget_from(args.budget_gb, args.budget_gib, args.memory_headroom)
    name = device if args.hardware is None else args.hardware
    if budget is None or name is None:
        return budget
    hw = get_hardware(name)
    if budget > hw.hbm_bytes:
        flag = "budget_gb" if args.budget_gb is not None else "budget_gib"
        given = args.budget_gb if args.budget_gb is not None else args.budget_gib
        unit = "GB" if args.budget_gb is not None else "GiB"
        said = "" if args.hardware is not None else " (the default --hardware)"
        raise SpecError(flag, f"{flag} must be <= {hw.name}'s memory{said}, "
                        f"{hw.hbm_bytes / 1e9:.6g} GB (got {given:g} {unit}): a peak over "
                        "the device's memory does not fit it")  # fmt: skip
    return budget


def _print(result: dict, as_json: bool, rows: list[tuple[str, str]]) -> None:
    """The answer as JSON (every field), or as ``rows`` (the answer first, in words)."""
    if as_json:
        print(to_json(result, indent=2, default=str))
        return
    print(format_rows(rows))


_VARIED = ("batch", "grad_accum", "microbatch", "fsdp", "gpus")


def _layout_only(args: argparse.Namespace) -> ParallelSpec:
    """The degrees as given, unchecked against a batch (bounds solves for the batch); a
    device count must be theirs, and a micro-batch is refused (the batch is the answer)."""
    given = values_of(args)
    par = ParallelSpec(**{i.key: given[i.key] for i in PARALLEL_INPUTS if i.key in given})
    if given.get("microbatch") is not None:
        raise SpecError("microbatch", "bounds solves for the batch: give no microbatch")
    if given.get("gpus") is not None:
        checks.integer("gpus", given["gpus"])
        if given["gpus"] != par.devices:
            raise SpecError("gpus", "dp * fsdp * tp * pp * cp must equal gpus (got "
                            f"{par.devices} and gpus={given['gpus']})")  # fmt: skip
    return par


BOUNDS_HARDWARE = "tpu-v5p"
"""The device ``bounds`` answers for where ``--hardware`` is not given: the book's TPU."""


def _device(args: argparse.Namespace) -> str:
    """``--hardware`` as given (an empty name is refused by the catalog, not defaulted),
    else the book's chip."""
    return BOUNDS_HARDWARE if args.hardware is None else args.hardware


def _cmd_bounds(args: argparse.Namespace) -> int:
    model, train = build_model_only(args)
    layout = _layout_only(args)
    checks.divides("tp", layout.tp, "d_ff", model.d_ff)  # as estimate splits them over tp
    if not model.ffn_only:
        checks.divides("tp", layout.tp, "n_heads", model.n_heads)
    report = bounds_report(
        model,
        layout,
        get_hardware(_device(args)),
        precision=train.precision,
        forward_only=args.forward_only,
        peak_flops=args.peak_flops,
        bandwidth=args.bandwidth,
    )
    unused = _unused_by_the_book(args)
    if args.json:
        hardware = _device(args)
        print(to_json({"hardware": hardware, **report, "notes": unused}, indent=2))
        return 0
    for warning in report.pop("warnings"):
        print(f"warning: {warning}")
    for note in unused:
        print(f"note: {note}")
    said = f"{BOUNDS_HARDWARE} (the default --hardware: the Scaling Book's chip)"
    print(format_rows(bounds_rows(report, said if args.hardware is None else args.hardware)))
    return 0


BOOK_INPUTS = ("precision", "hardware", "gpus", "fsdp", "tp", "mx", "my", "overlap")
"""What the book's bounds read beside the model's shape (the TPU mesh axes and the overlap
rule too): the rest of a layout (pp, cp, the framework, recompute, the batch) has no term
in its closed forms."""


def _unused_by_the_book(args: argparse.Namespace) -> list[str]:
    """One note naming the flags given that the book's bounds do not read (a probe: they
    printed the same answer, unsaid)."""
    given = {k: v for k, v in values_of(args).items() if v is not False}
    unused = [f"--{k.replace('_', '-')} {v}" for k, v in given.items()
              if section_of(k) != "model" and k not in BOOK_INPUTS]  # fmt: skip
    if not unused:
        return []
    return [f"the book's bounds read the model's shape, fsdp, tp, the device and the "
            f"precision alone: {', '.join(unused)} change nothing here (estimate prices "
            "them)"]  # fmt: skip


def _cmd_solve(args: argparse.Namespace) -> int:
    if args.memory_headroom is not None:  # checked even where a budget makes it unused
        check_headroom(args.memory_headroom)
    if args.question == "min-fsdp":
        result = _min_fsdp(args)
        rows = min_fsdp_rows(result)
    else:
        field = "batch" if args.question == "max-batch" else "seq"
        refuse_solved(field, vars(args), lambda key: f"--{key}")
        setup = build(values_of(args), solving=field)
        if setup.parallel is None or setup.hardware is None:
            raise SpecError("hardware", f"{args.question} needs --hardware (and a layout)")
        found = max_fitting(setup.model, setup.train, setup.parallel, setup.hardware, field,
                            _budget(args), args.memory_headroom)  # fmt: skip
        result = dict(found)
        if result[field] is not None:
            train = setup.train.replace(**{field: result[field]})
            at = estimate(setup.model, train, setup.parallel, setup.hardware)
            result["verdict"] = _verdict(at, args)
        rows = max_rows(result, field)
    _print(result, args.json, rows)
    if not args.json and "verdict" in result:
        print(f"\nat that answer:\n{format_rows(verdict_rows(result['verdict']))}")
    return 0


def _verdict(est: Estimate, args: argparse.Namespace) -> dict[str, Any]:
    """The fit rule's verdict at an answer, with the budget the question used."""
    return solved_verdict(est, values_of(args), args.memory_headroom, _budget(args))


def _refuse_dropped(given: dict[str, Any]) -> None:
    """min-fsdp's inputs that its answer would drop, refused in one line naming the flag:
    the degree it finds, and a batch beside one device's tokens (``--batch-tokens``)."""
    for chosen in ("fsdp", "gpus"):  # the answer: a layout given for them would be dropped
        if chosen in given:
            raise SpecError(chosen, f"min-fsdp finds {chosen}: leave --{chosen} out")
    for held in ("batch", "grad_accum", "microbatch"):  # one device's tokens, one micro-batch
        if held in given:
            raise SpecError(held, f"min-fsdp holds one device's tokens (--batch-tokens, default "
                            f"one sequence): leave --{held.replace('_', '-')} out")  # fmt: skip


def _min_fsdp(args: argparse.Namespace) -> dict[str, Any]:
    """The full model's answer (on --hardware, else the book's chip, at the user's budget),
    and the Scaling Book's closed form beside it."""
    _refuse_dropped(values_of(args))
    model, train = build_model_only(args)
    tokens = train.seq if args.batch_tokens is None else args.batch_tokens
    book_only = args.hardware is None and tokens == 0  # no device: the state alone
    budget = _budget(args, None if book_only else BOUNDS_HARDWARE)
    if budget is None and args.hardware is None:
        raise SpecError("budget", "min-fsdp needs --hardware or --budget-gb / --budget-gib")
    if budget is None:  # the fit rule's: headroom x the device's memory
        budget = budget_bytes(get_hardware(args.hardware), args.memory_headroom)
    framework = values_of(args).get("framework", BY_KEY["framework"].default)
    held = train.seq if tokens == 0 and not book_only else tokens  # the answer's (0: a sequence)
    try:
        result = min_fsdp(model, train, budget, held, args.sharded_activation_fraction,
                          framework)  # fmt: skip
    except SpecError as err:  # the book has no answer; the full model may
        if err.field != "budget":
            raise
        result = {"approximation": LABEL, "framework": framework, "fsdp": None,
                  "why": err.message}  # fmt: skip
    if book_only:  # the book's own question: the state alone
        assumed = (f"the training state alone (--batch-tokens 0), budget {budget / GB:,.4g} "
                   f"GB, framework {framework}, {train.precision}")  # fmt: skip
        book = {"fsdp": result["fsdp"], "fsdp_usable": result.get("fsdp_power_of_two"),
                "from": "the Scaling Book approximation (a step's tokens or --hardware: the "
                "full model)"}  # fmt: skip
        return {"answer": {**book, "assumed": assumed}, "book": result}
    device = _device(args)  # the budget is the user's either way
    # the same question to the full model: one device's tokens, fsdp varied
    given = {k: v for k, v in values_of(args).items() if k not in _VARIED}
    start = expert_start(given)  # a group the experts' split allows, searched from 1
    per_device = max(1, held // train.seq)  # held at once: one micro-batch of them
    replicas = given.get("dp", 1) * start.get("fsdp", 1)  # the batch spans dp x fsdp devices
    setup = build({**given, **start, "hardware": device, "batch": per_device * replicas,
                   "microbatch": per_device})  # fmt: skip
    assert setup.parallel is not None and setup.hardware is not None
    full = min_fsdp_fitting(setup.model, setup.train, setup.parallel, setup.hardware, budget)
    out: dict[str, Any] = {"book": result, "full_model": full}
    if full["fsdp"] is not None:
        par = setup.parallel.replace(fsdp=full["fsdp"])
        batch = par.batch_step(setup.train.grad_accum) * full["micro_batch_per_device"]
        at = estimate(setup.model, setup.train.replace(batch=batch), par, setup.hardware)
        out["verdict"] = _verdict(at, args)
    answer = {"fsdp": full["fsdp"], "fsdp_usable": full["fsdp_usable"],
              "from": f"the full model (per-device peak on {device}; the Scaling Book's below)",
              **({"why": full["why"]} if "why" in full else {})}  # fmt: skip
    sequences = full["micro_batch_per_device"]  # one device's, whatever group it starts from
    rounded = "" if tokens == held else f"; --batch-tokens {tokens:,} rounded up to one " \
        "sequence, in the book's line too"  # fmt: skip
    per = f"{held:,} tokens per device ({sequences} x seq {train.seq}{rounded})"
    on = " (the default --hardware: the Scaling Book's chip)" * (args.hardware is None)
    assumed = (f"{per}, budget {budget / GB:,.4g} GB, framework {framework}, "
               f"{train.precision}, recompute {train.recompute}, on {device}{on}")  # fmt: skip
    return {"answer": {**answer, "assumed": assumed}, **out}


def add_bounds_and_solve(sub: Any) -> None:
    bnd = sub.add_parser(
        "bounds", help="batch at which training is compute-bound (Scaling Book ch. 5)"
    )
    add_model_args(bnd)
    add_layout_args(bnd)
    bnd.add_argument("--forward-only", action="store_true")
    bnd.add_argument("--peak-flops", type=float, help="override C (FLOP/s)")
    bnd.add_argument("--bandwidth", type=float, help="override W per axis (bytes/s)")
    bnd.add_argument("--json", action="store_true")
    bnd.set_defaults(func=_cmd_bounds)

    sol = sub.add_parser("solve", help="inverse questions")
    sol.add_argument("question", choices=("min-fsdp", "max-batch", "max-seq"))
    add_model_args(sol)
    add_layout_args(sol)
    sol.add_argument("--budget-gb", type=float, help="memory budget in GB (1e9 bytes)")
    sol.add_argument("--budget-gib", type=float, help="memory budget in GiB (2^30 bytes)")
    add_headroom(sol)
    sol.add_argument(
        "--batch-tokens",
        type=int,
        help="min-fsdp: tokens one device processes (default: one sequence)",
    )
    sol.add_argument("--sharded-activation-fraction", type=float, default=0.5)
    sol.add_argument("--json", action="store_true")
    sol.set_defaults(func=_cmd_solve)
