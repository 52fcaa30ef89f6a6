"""``offload`` (plans that stream from host memory) and ``padding`` (the cost of each way to
batch variable-length sequences)."""

from __future__ import annotations

import argparse
from typing import Any

from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.lengths import read_lengths, synthetic_lengths
from costmodel.cli.args import (
    FRONT,
    add_inputs,
    add_layout_args,
    add_model_args,
    int_arg,
    to_json,
    values_of,
)
from costmodel.cli.plan import budget_cost
from costmodel.engine.fit import budget_bytes
from costmodel.engine.offload import LINKS, OffloadSpec, evaluate_plan, explain, plan_offload
from costmodel.engine.padding import (
    LONGEST_DRAWN,
    STRATEGIES,
    judged,
    row_coefficients,
    strategy_costs,
    truncated,
)
from costmodel.inputs import BY_KEY, build
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.offload import MAX_BUDGET, PLAN_KEYS, RATES

GB = 1e9

DEFAULT_DEVICE = "h100-sxm"
"""The device ``offload`` plans for where ``--hardware`` is not given (said in its header)."""


def _plan_arg(text: str) -> dict[str, int]:
    """``chunk=16384,seqs_per_round=2,...`` into a dict of integers (no evaluation)."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, _, value = item.partition("=")
        if key not in PLAN_KEYS:
            raise argparse.ArgumentTypeError(
                f"--plan keys are {', '.join(PLAN_KEYS)} (got {key!r})"
            )
        out[key] = int_arg(value)
    missing = [k for k in PLAN_KEYS if k not in out]
    if missing:
        raise argparse.ArgumentTypeError(f"--plan needs {', '.join(missing)}")
    return out


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int_arg(t) for t in text.split(",") if t.strip())


def link_name(args: argparse.Namespace) -> str:
    """``--link``, else the device's own host link (``Hardware.host_link``)."""
    return args.link or get_hardware(args.hardware or DEFAULT_DEVICE).host_link


NVME_GBPS = 6.0
"""The drive's read and write rate where ``--nvme-gbps`` is not given (GB/s)."""


def offload_spec(args: argparse.Namespace) -> OffloadSpec:
    for flag in (
        "link_gbps",
        "device_budget_gb",
        "host_budget_gb",
        "host_memory_gbps",
        "nvme_gbps",
    ):  # checked as given, before they become bytes
        if getattr(args, flag) is not None:
            _check_flag(flag, getattr(args, flag))
    if args.nvme_gbps is not None and args.optimizer_state != "nvme":  # a probe: unsaid
        raise SpecError("nvme_gbps", "nvme_gbps rates the drive --optimizer-state nvme keeps "
                        "the optimizer state on: give --optimizer-state nvme, or no "
                        "--nvme-gbps")  # fmt: skip
    nvme = NVME_GBPS if args.nvme_gbps is None else args.nvme_gbps
    link = args.link_gbps * GB if args.link_gbps is not None else LINKS[link_name(args)][0]
    return OffloadSpec(
        device_budget=args.device_budget_gb * GB, host_budget=args.host_budget_gb * GB,
        link_bw=link, overlap=args.overlap, host_memory_bw=args.host_memory_gbps * GB,
        optimizer_state=args.optimizer_state, nvme_bw=nvme * GB,
        loss_chunk=args.loss_chunk, chunks=args.chunks, seqs_per_round=args.seqs_per_round,
    )  # fmt: skip


def _check_flag(flag: str, value: float) -> None:
    """A rate (GB/s) within ``RATES`` or a budget (GB) within ``MAX_BUDGET``, in the
    flag's own unit, so that the error names the flag and the number given."""
    checks.number(flag, value)
    if flag.endswith("_gbps"):
        least, most = (bound / GB for bound in RATES)
        checks.require(value >= least, flag, lambda: f"{flag} must be >= {least:g} GB/s (a "
                       f"kilobyte a second; got {value:g})")  # fmt: skip
        checks.at_most(flag, value, f"{most:,.0f}", int(most), "GB/s (a petabyte a second, "
                       "over 1,000 times any host link, memory or drive)")  # fmt: skip
    else:
        most = MAX_BUDGET / GB
        checks.at_most(flag, value, f"{most:,.0f}", int(most), "GB (a petabyte)")


def _cmd_offload(args: argparse.Namespace) -> int:
    values = {k: v for k, v in values_of(args).items() if BY_KEY[k].section != "cluster"}
    setup = build(values)
    hw = get_hardware(args.hardware or DEFAULT_DEVICE)
    spec = offload_spec(args)
    if args.plan is not None:
        configs = [evaluate_plan(setup.model, setup.train, hw, spec, args.plan)]
    else:
        configs = plan_offload(setup.model, setup.train, hw, spec, top=args.top)
    if args.json:
        print(to_json([c.to_dict() for c in configs], indent=2))
        return 0
    head = configs[0]
    broken = [k.removesuffix("_ok") for k, ok in head.fits.items() if not ok]
    title = "the plan given" if args.plan else "fastest plan"
    link = (f"{args.link_gbps:g} GB/s" if args.link_gbps is not None else args.link
            or f"{hw.host_link} (the device's; --link)")  # fmt: skip
    said = " (the default --hardware)" * (args.hardware is None)
    print(f"{setup.model.name} on one {hw.name}{said}, its host over {link} (overlap "
          f"{args.overlap:g}): batch {setup.train.batch} x seq {setup.train.seq}, "
          f"{setup.train.precision}")  # fmt: skip
    print(title + (f" (does NOT fit the {' and '.join(broken)} budget)" if broken else ""))
    print("\n".join("  " + line for line in explain(head, spec)))
    if spec.device_budget > budget_bytes(hw):
        print(f"  note: {_over_rule(hw, spec)}")
    if len(configs) > 1:
        print(
            f"\n{'step s':>8} {'tok/s':>8} {'chunk':>6} {'seq/rd':>6} {'rounds':>6} "
            f"{'P pin':>5} {'G pin':>5} {'dev u':>5} {'full':>5} {'attn':>5} {'ctx':>5}"
        )
        for c in configs:
            d, h = c.decisions, c.host_units
            print(f"{c.time_s['step']:>8.2f} {c.tokens_per_s:>8,.0f} {d['chunk']:>6} "
                  f"{d['seqs_per_round']:>6} {d['rounds']:>6} {d['pinned_params']:>5} "
                  f"{d['pinned_grads']:>5} {d['device_units']:>5} {h['full']:>5} "
                  f"{h['attn']:>5} {h['ctx']:>5}")  # fmt: skip
    return 0


def _over_rule(hw: Hardware, spec: OffloadSpec) -> str:
    """Why a device budget over the fit rule's (0.9 of the memory) is a risk."""
    return (
        f"the device budget, {spec.device_budget / GB:,.2f} GB, is over the fit rule's "
        f"{budget_bytes(hw) / GB:,.2f} GB (0.9 of {hw.name}'s memory, what estimate "
        "allows): it leaves no room for the CUDA context and the allocator's reserve"
    )


def add_offload(sub) -> None:
    p = sub.add_parser("offload", help="fastest plans that stream weights, gradients and "
                       "activations from host memory (one device)")  # fmt: skip
    add_model_args(p)
    p.add_argument("--hardware", help=f"{FRONT['hardware'].help} (default {DEFAULT_DEVICE})")
    g = p.add_argument_group("budgets and links")
    g.add_argument("--device-budget-gb", type=float, required=True, help="device memory (1e9 B)")
    g.add_argument("--host-budget-gb", type=float, required=True, help="host memory (1e9 B)")
    g.add_argument("--link", choices=tuple(LINKS), default=None,
                   help="; ".join(f"{k}: {v[1]}" for k, v in LINKS.items()))  # fmt: skip
    g.add_argument("--link-gbps", type=float, help="achieved GB/s per direction (overrides --link)")
    g.add_argument("--overlap", type=float, default=1.0, help="compute/transfer overlap, 0..1")
    g.add_argument("--host-memory-gbps", type=float, default=100.0,
                   help="host DRAM GB/s the CPU optimizer reaches")  # fmt: skip
    g.add_argument("--optimizer-state", choices=("host", "nvme"), default="host")
    g.add_argument("--nvme-gbps", type=float, default=None,
                   help="with --optimizer-state nvme (default 6)")  # fmt: skip
    g.add_argument("--loss-chunk", type=int_arg, default=1024, help="tokens per head/loss chunk")
    s = p.add_argument_group("search")
    s.add_argument("--chunks", type=_int_list, default=(), help="chunk sizes, e.g. 4096,8192")
    s.add_argument("--seqs-per-round", type=_int_list, default=(), help="e.g. 1,2,4")
    s.add_argument("--top", type=int_arg, default=10, help="plans to list")
    example = ",".join(f"{k}=N" for k in PLAN_KEYS)
    s.add_argument("--plan", type=_plan_arg, help=f"evaluate one plan instead: {example}")
    p.add_argument("--json", action="store_true", help="print the plans as JSON")
    p.set_defaults(func=_cmd_offload)


def _lengths(args: argparse.Namespace) -> Any:
    if (args.lengths is None) == (args.distribution is None):
        raise SpecError("lengths", "give either --lengths FILE or --distribution NAME:k=v,...")
    if args.lengths is not None:
        return read_lengths(args.lengths)
    # the documents as drawn (up to 2^24 tokens): a row cuts them, and says so, as for a file
    return synthetic_lengths(args.distribution, args.samples, LONGEST_DRAWN, args.seed)


def _cmd_padding(args: argparse.Namespace) -> int:
    checks.integer("seed", args.seed, minimum=0)
    setup = build(values_of(args))
    lengths = _lengths(args)
    rows = strategy_costs(lengths, setup.train.seq, setup.train.batch, row_coefficients(setup),
                          seed=args.seed)  # fmt: skip
    budget = setup.token_budget
    if budget is not None:  # a budget needs hardware, hence a layout
        for row in rows.values():
            row.update(budget_cost(row, setup.parallel.devices, budget, setup.price_per_hour))
    cut = truncated(lengths, setup.train.seq)
    fit = judged(rows, setup)  # no speed, days or cost of a layout that cannot run
    if args.json:
        verdict = None if fit is None else {"fits": fit.fits, "summary": fit.sentence()}
        print(to_json({"documents": len(lengths), "truncated": cut, "verdict": verdict,
                       "strategies": rows}, indent=2))  # fmt: skip
        return 0
    if fit is not None:
        way = (
            ""
            if fit.fits
            else (
                ": no speed or days for it (python -m costmodel estimate "
                "with the same flags names the nearest layout that fits)"
            )
        )
        print(f"verdict: {fit.sentence()}{way}")
    said = " (default; --seq)" if "seq" not in values_of(args) else ""
    print(f"{len(lengths):,} documents, mean {lengths.mean():,.1f} tokens, rows of "
          f"{setup.train.seq:,}{said}, batch {setup.train.batch}")  # fmt: skip
    capped = int((lengths >= LONGEST_DRAWN).sum()) if args.distribution else 0
    if capped:
        print(f"note: {capped:,} drawn documents reached {LONGEST_DRAWN:,} tokens, the longest "
              "drawn, and are held at it (the mean above is of the held lengths)")  # fmt: skip
    if cut["documents"]:
        share = cut["documents"] / len(lengths)
        print(f"note: {cut['documents']:,} documents ({share:.1%}) are longer than a row: each "
              f"is cut at {setup.train.seq:,} tokens, dropping {cut['tokens_fraction']:.1%} of "
              "the tokens (a longer --seq keeps them)")  # fmt: skip
    most = max(r["rows"] for r in rows.values())
    if most < setup.train.batch:
        print(f"note: {most:,} rows at most, fewer than the batch of {setup.train.batch:,}: each "
              "strategy is priced on its own rows, less than one step")  # fmt: skip
    if any(r["seconds"] and r.get("tokens_per_s") is not None for r in rows.values()):
        devices = setup.parallel.devices
        print(f"tokens/s: the documents' own tokens (no padding) a second, over the {devices:,} "
              f"device{'s' * (devices > 1)} of the layout")  # fmt: skip
    priced = any(r.get("train_cost") is not None for r in rows.values())
    print(f"{'strategy':<16}{'rows':>10}{'pad tokens':>12}{'wasted FLOPs':>14}{'tokens/s':>12}"
          + ("  days" if budget else "") + ("  cost" if priced else ""))  # fmt: skip
    for name, r in rows.items():
        tps = _shown(r.get("tokens_per_s") if r["seconds"] else None, "{:>12,.0f}", 12)
        days = "  " + _shown(r.get("train_days"), "{:,.2f}") if "train_days" in r else ""
        cost = "  " + _shown(r.get("train_cost"), "${:,.0f}") if priced else ""
        print(f"{name:<16}{r['rows']:>10,}{r['pad_fraction']:>12.1%}"
              f"{r['wasted_flops_fraction']:>14.1%}{tps}{days}{cost}")  # fmt: skip
    return 0


def _shown(value: float | None, form: str, width: int = 0) -> str:
    """``value`` in ``form``, or a dash where there is none (right-aligned to ``width``)."""
    return form.format(value) if value is not None else "-".rjust(width)


def add_padding(sub) -> None:
    p = sub.add_parser("padding", help="wasted tokens, FLOPs and time of padding vs packing")
    add_model_args(p)
    add_layout_args(p)
    add_inputs(p, "cost", (FRONT["token_budget"], FRONT["price_per_hour"]))
    d = p.add_argument_group("lengths (--seq is the row length, --batch the rows per step)")
    d.add_argument("--lengths", metavar="FILE", help=".npy, or text: lengths or 'length count'")
    d.add_argument("--distribution", help="e.g. lognormal:median=721,sigma=0.85, "
                   "uniform:low=1,high=4096, exponential:mean=900, fixed:length=512")  # fmt: skip
    d.add_argument("--samples", type=int_arg, default=100_000, help="documents drawn")
    d.add_argument("--seed", type=int_arg, default=0, help="shuffling and sampling seed")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_padding)


__all__ = ["STRATEGIES", "add_offload", "add_padding", "offload_spec"]
