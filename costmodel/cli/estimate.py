"""``estimate`` and ``presets`` subcommands of ``python -m costmodel``."""

from __future__ import annotations

import argparse
from dataclasses import asdict, fields, replace
from typing import Any

from costmodel.catalog.fitted import fitted_lines
from costmodel.catalog.hardware import HARDWARE, get_hardware
from costmodel.catalog.presets import NOTES, PRESETS, get_model
from costmodel.cli.args import (
    FRONT,
    add_headroom,
    add_inputs,
    add_layout_args,
    add_model_args,
    build_setup,
    to_json,
    values_of,
)
from costmodel.engine.caveats import calibration_line
from costmodel.engine.estimate import UNFIT, Estimate, estimate
from costmodel.engine.fit import PEAK, peak_at, rest_at_peak
from costmodel.engine.verdict import rate_words, verdict
from costmodel.inputs import BY_KEY
from costmodel.specs.checks import SpecError
from costmodel.specs.model import TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.units import GIB, fmt_bytes, fmt_count, plural


def verdict_rows(answer: dict[str, Any]) -> list[tuple[str, str]]:
    """The verdict first: fits or not, then speed and its peak, or the nearest change that
    fits; the layout and every assumption."""
    rows = [("verdict", answer["summary"])]
    if answer["fits"]:
        rows.append(("step", f"{_fmt_seconds(answer['step_s'])}, "
                     f"{answer['tokens_per_s_per_device']:,.0f} tokens/s per device, "
                     f"MFU {answer['mfu']:.1%} of {answer['mfu_peak']}"))  # fmt: skip
        rows.append(("limited by", answer["limited_by"]))
        if "train_days" in answer:
            cost = ""
            if "train_cost" in answer:
                price = answer.get("price_per_device_hour", 0)
                cost = f", ${answer['train_cost']:,.2f} at ${price:,.2f} per device-hour"
            days = _EXTRA["train_days"](answer["train_days"])
            tokens = fmt_count(answer["train_tokens"])
            rows.append(("training", f"{days} for {tokens} tokens{cost}"))
    elif "nearest_fit" in answer:
        rows.append(("nearest fit", _nearest_text(answer["nearest_fit"])))
    rows += [("layout", answer["layout"]), ("assumptions", answer["assumptions"])]
    rows.append(("calibration", answer["calibration"]))
    rows += [("caveat", text) for text in answer.get("caveats", ())]
    return rows + [("note", note) for note in answer.get("notes", ())]


def _nearest_text(near: dict[str, Any] | None) -> str:
    if near is None:
        return ("none at this batch on these devices or up to 8x them, with any layout, "
                "recompute or micro-batch (the planner's search): a shorter sequence, a "
                "smaller model or a device with more memory")  # fmt: skip
    tight = " (TIGHT: over the device's memory)" * near["tight"]
    return (f"{near['change']}: peak {near['peak_bytes'] / GIB:,.1f} GiB, reserved "
            f"{near['reserved_bytes'] / GIB:,.1f} GiB{tight}, step "
            f"{_fmt_seconds(near['step_s'])} ({near['flags']})")  # fmt: skip


_SUMMARY = (
    ("params", "params.total", fmt_count),
    ("trainable", "params.trainable", fmt_count),
    ("flops per step", "flops.step", lambda x: fmt_count(x, "FLOP")),
    ("peak memory", "memory_bytes.peak", fmt_bytes),
    ("memory per device", None, None),
    ("  weights", "memory_bytes_per_device.params", fmt_bytes),
    ("  fp32 master", "memory_bytes_per_device.master", fmt_bytes),
    ("  gradients", "memory_bytes_per_device.grads", fmt_bytes),
    ("  optimizer", "memory_bytes_per_device.optimizer", fmt_bytes),
    ("  activations", "memory_bytes_per_device.activations", fmt_bytes),
    ("  frozen weights", "memory_bytes_per_device.frozen", fmt_bytes),
    ("  buffers", "memory_bytes_per_device.buffers", fmt_bytes),
    (
        "  transients",
        "memory_bytes_per_device.rest_at_peak",
        lambda x: (
            fmt_bytes(x)
            if x >= 0
            else f"minus {fmt_bytes(-x)}: the lines above are not all alive at once"
        ),
    ),
    ("  peak", "memory_bytes_per_device.peak", fmt_bytes),
    ("  peak falls at", "memory_bytes_per_device.peak_at", str),
    ("  reserved", "memory_bytes_per_device.reserved", fmt_bytes),
    ("time per step", None, None),
    ("  compute", "time_s.compute", None),
    ("    of it waiting for the host", "time_s.host_bound", None),  # kernel launches, MoE syncs
    ("  communication", "time_s.comm", None),  # (partly hidden behind compute)
    ("    of it exposed", "time_s.comm_exposed", None),  # the rest runs beside compute
    ("  contention", "time_s.contention", None),  # compute slowed by overlapped traffic
    ("  pipeline bubble", "time_s.bubble", None),
    ("  optimizer", "time_s.optimizer", None),
    ("  step", "time_s.step", None),
    ("tokens/s, all devices", "tokens_per_s", None),
)
"""The compact table: (label, quantity, format); a row whose quantity is absent or 0
(bubble, master copy, ...) is left out, a None quantity heads the rows below it."""


def _step_parts(v: dict[str, Any]) -> dict[str, float]:
    """The step's parts beside compute, so that the time lines add up to the step:
    ``contention`` (compute slowed by the communication it overlaps) and the exposed
    communication (forward and backward beyond compute and contention)."""
    if "time_s.compute" not in v:
        return {}
    contention = v.get("time_s.contention_forward", 0) + v.get("time_s.contention_backward", 0)
    phases = v["time_s.forward"] + v["time_s.backward"]
    exposed = max(0.0, phases - v["time_s.compute"] - contention)
    return {"time_s.contention": contention, "time_s.comm_exposed": exposed}


def summary_rows(est: Estimate, fits: bool) -> list[tuple[str, str]]:
    """The summary's rows; a layout that does not fit shows its memory and no speed. The
    memory lines add up to the peak (``engine.fit.rest_at_peak``)."""
    v = dict(est.values)
    if PEAK in v:
        v["memory_bytes_per_device.rest_at_peak"] = rest_at_peak(v)
        at = peak_at(v)  # the transients' phase: at the optimizer step, not the activations'
        if at is not None:
            v["memory_bytes_per_device.peak_at"] = at
    v.update(_step_parts(v))
    shown = {k for _, k, _ in _SUMMARY if k and (v.get(k) or (k == "time_s.step" and k in v))}
    if v.get("time_s.comm"):  # what of it the step waits for, 0 included
        shown.add("time_s.comm_exposed")
    if not fits:
        shown -= {k for _, k, _ in _SUMMARY if k and k.startswith(("time_s.", "tokens_"))}
    if v.get("params.trainable") == v.get("params.total"):
        shown.discard("params.trainable")
    if "memory_bytes_per_device.peak" in v:
        shown.discard("memory_bytes.peak")
    rows: list[tuple[str, str]] = []
    for i, (label, key, fmt) in enumerate(_SUMMARY):
        if key is None:  # a heading, kept where a row below it is shown
            below = [k for _, k, _ in _SUMMARY[i + 1 :]]
            below = below[: below.index(None)] if None in below else below
            if shown & set(below):
                rows.append((label, ""))
        elif key in shown:
            fmt = fmt or (_fmt_seconds if key.startswith("time_s.") else _EXTRA[key])
            rows.append((label, fmt(v[key])))
    return rows


def _table(est: Estimate, answer: dict[str, Any] | None = None, *, full: bool = False) -> str:
    """The verdict, then the model, the batch and either a short summary or (``full``)
    every quantity ``estimate`` computes."""
    v = est.values
    rows = [("model", f"{est.model.name}"), ("train", _train_line(est.train, est.parallel))]
    if answer is None:  # no device: what the numbers are of (the verdict says it otherwise)
        rows.append(("assumed", "one device without a layout, costmodel's reference model "
                     "(torch.autocast: fp32 parameters and residual stream); --hardware and "
                     "--gpus for a verdict, a layout and a framework"))  # fmt: skip
    fits = answer is None or answer["fits"]
    rows += [("", "")] + (_full_rows(v) if full else summary_rows(est, fits))
    ratios = ("mfu", "hfu")
    extra = [
        k
        for k in ("tokens_per_s", "tflops_per_device", *ratios, "train_days", "train_cost")
        if k in v and (full or answer is None)
    ]
    if not fits:
        extra = [k for k in extra if k not in UNFIT]
        if full:
            rows += [("", ""), ("mfu, days, cost", "none: the layout does not fit")]
    if extra:
        rows.append(("", ""))
        rows.extend((k, _EXTRA[k](v[k])) for k in extra)
    head = f"{format_rows(verdict_rows(answer))}\n\n" if answer is not None else ""
    tail = "" if full else "\n\n--full prints every quantity, --json all of them as data"
    return head + format_rows(rows) + tail


def _full_rows(v: dict[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    sections = (
        ("params.", fmt_count),
        ("flops.", _fmt_flops),
        ("memory_bytes.", fmt_bytes),
        ("memory_bytes_per_device.", fmt_bytes),
        ("time_s.", _fmt_seconds),
        ("comm_bytes.", fmt_bytes),
        ("comm_time_s.", _fmt_seconds),
    )
    for prefix, fmt in sections:
        keys = [k for k in v if k.startswith(prefix) and "_by_op" not in k]
        if keys:
            if prefix in _FULL_HEADS and any(k.startswith("memory_bytes_per_device.") for k in v):
                rows.append((f"# {prefix}*", _FULL_HEADS[prefix]))
            rows.extend((k, fmt(v[k])) for k in keys)
            rows.append(("", ""))
    return rows[:-1]


_FULL_HEADS = {
    "memory_bytes.": "the whole model on one device as costmodel's reference model runs it "
    "(torch.autocast: fp32 parameters as master, params = the weights' low-precision casts "
    "kept from forward to backward), whatever the framework; this layout's device is "
    "memory_bytes_per_device.*",
    "memory_bytes_per_device.": "one device of this layout under its framework",
}
"""What a ``--full`` section's figures are of, where two sections both read as memory."""


def format_rows(rows: list[tuple[str, str]]) -> str:
    """``key  value`` lines, keys padded to the longest; an empty key is a blank line."""
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {val}" if k else "" for k, val in rows)


def _fmt_seconds(t: float) -> str:
    return f"{t * 1e3:,.3f} ms" if t < 1 else f"{t:,.3f} s"


def _fmt_flops(n: float) -> str:
    return fmt_count(n, "FLOP")


_EXTRA = {
    "tokens_per_s": lambda x: f"{x:,.0f}",
    "tflops_per_device": lambda x: f"{x:,.1f}",
    "mfu": lambda x: f"{x:.1%}",
    "hfu": lambda x: f"{x:.1%}",
    "train_days": lambda x: f"{x:,.2f} days" if x >= 1 else f"{x:.3g} days ({24 * x:.3g} hours)",
    "train_cost": lambda x: f"${x:,.2f} (at --price-per-hour per device-hour)",
}


def _with_unit(key: str, value: float) -> str:
    """A quantity's value with its unit, as its key names it (bytes, seconds, FLOPs)."""
    if "bytes" in key.split(".")[0]:
        return f"{value:,.0f} B = {fmt_bytes(value)}"
    if key.startswith("time_s."):
        return f"{value:.6g} s"
    if key.startswith("flops"):
        return _fmt_flops(value)
    if key in _EXTRA:
        return _EXTRA[key](value)
    return f"{value:,}" if isinstance(value, int) else f"{value:.6g}"


def _train_line(t: TrainSpec, p: ParallelSpec | None = None) -> str:
    """Batch, sequence and how the batch is split: sequences per device per micro-batch,
    data-parallel replicas and accumulation steps."""
    replicas = p.batch_step(1) if p is not None else 1
    ranks = "data-parallel ranks" if p is not None and p.fsdp > 1 else "replicas"
    steps = plural(t.grad_accum, "step")
    split = (f"micro-batch {t.micro_batch // replicas} per device x {replicas} {ranks} x "
             f"{steps}" if replicas > 1 else f"micro-batch {t.micro_batch} x {steps}")  # fmt: skip
    return (
        f"batch {t.batch} x seq {t.seq} ({split}), {t.precision}, "
        f"{t.optimizer}, attention {t.attention}, recompute {t.recompute}"
    )


def _cmd_estimate(args: argparse.Namespace) -> int:
    setup = build_setup(args)
    est = setup.estimate()
    if args.formula is not None:
        if args.json:
            raise SpecError("formula", "--formula prints an expression, --json the values: "
                            "give one of them")  # fmt: skip
        if args.formula not in est.values:
            missing = est.missing(args.formula[:60], "--full lists them all")
            raise SpecError("formula", f"formula: {missing}")
        import sympy as sp

        expr = est.expr(args.formula)
        print(f"{args.formula} =\n{sp.pretty(expr, use_unicode=True)}\n\nLaTeX: {sp.latex(expr)}")
        print(f"\nvalue: {_with_unit(args.formula, est[args.formula])}")
        return 0
    answer = None
    if est.parallel is not None:
        defaulted = set(BY_KEY) - set(values_of(args))
        answer = verdict(est, args.memory_headroom, defaulted=defaulted, notes=setup.notes)
    elif args.memory_headroom is not None:
        raise SpecError("memory_headroom", "memory_headroom needs --hardware (a device)")
    if args.json:  # no MFU for a layout that does not fit; transients: the parts add up
        out = replace(est, headroom=args.memory_headroom).to_dict()
        print(to_json({"verdict": answer, **out} if answer else out, indent=2))
    else:
        notes = [] if answer else [("note", n) for n in setup.notes]  # (the verdict has them)
        print((format_rows(notes) + "\n\n" if notes else "") + _table(est, answer, full=args.full))
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    rows = {name: get_model(name) for name in PRESETS}
    if args.json:
        print(
            to_json({n: {f.name: getattr(m, f.name) for f in fields(m)} for n, m in rows.items()})
        )
        return 0
    width = max(map(len, rows))
    for name, m in rows.items():
        n = estimate(m, TrainSpec())["params.total"]
        window = f" window {m.sliding_window}" if m.sliding_window else ""
        if m.global_every:
            window += f" (1 global in {m.global_every})"
        print(
            f"{name:<{width}} D={m.d_model:<6} L={m.n_layers:<4} H={m.n_heads:<4} "
            f"K={m.n_kv_heads:<4} F={m.d_ff:<6} V={m.vocab:<7} {m.ffn:<7} params {n:,}{window}"
        )
        if name in NOTES:
            print(f"{'':<{width + 1}}{NOTES[name]}")
    return 0


def _cmd_hardware(args: argparse.Namespace) -> int:
    """The catalog's devices, or one: peaks, memory, links and what the numbers rest on."""
    names = [args.name] if args.name else list(HARDWARE)
    rows = {name: get_hardware(name) for name in names}
    if args.json:
        print(to_json({n: asdict(hw) for n, hw in rows.items()}, indent=2))
        return 0
    for name, hw in rows.items():
        bf16 = hw.peak_flops.get("bf16") or hw.peak_flops.get("fp16") or 0
        print(f"{name}: {hw.kind}, {rate_words(bf16)} 16-bit dense, "
              f"{fmt_bytes(hw.hbm_bytes)}, {hw.devices_per_node} per node")  # fmt: skip
        print(f"  calibration: {calibration_line(hw, pointer=False)}")
        if args.name:
            print(f"  fitted and checked: {hw.calibration_text()}")
            for line in fitted_lines(name):
                print(f"  fitted {line}")
            if hw.host_slowdown != 1 and hw.launch_s:
                print(f"  host: {hw.host_slowdown:g}x slower than the fit's x86 host: "
                      f"{hw.launch_s * 1e6:,.3g} µs per kernel launch on this one")  # fmt: skip
            print(f"  source: {hw.source}")
    return 0


def add_estimate_and_presets(sub) -> None:
    est = sub.add_parser("estimate", help="parameters, FLOPs, memory (and time on hardware)")
    add_model_args(est)
    est.add_argument("--json", action="store_true", help="print one JSON object")
    est.add_argument(
        "--formula", metavar="QUANTITY", help="print the expression, e.g. flops.forward"
    )
    est.add_argument("--full", action="store_true",
                     help="print every quantity (parameters, FLOPs, memory, time and "
                     "communication by part), not the summary")  # fmt: skip
    add_layout_args(est)
    add_headroom(est)
    add_inputs(est, "cost (adds train_days and train_cost)",
               (FRONT["token_budget"], FRONT["price_per_hour"]))  # fmt: skip
    est.set_defaults(func=_cmd_estimate)
    pre = sub.add_parser("presets", help="list the preset models")
    pre.add_argument("--json", action="store_true")
    pre.set_defaults(func=_cmd_presets)
    hw = sub.add_parser("hardware", help="list the devices and what each profile rests on")
    hw.add_argument("name", nargs="?", choices=list(HARDWARE), metavar="NAME",
                    help="one device: its calibration summary and sources")  # fmt: skip
    hw.add_argument("--json", action="store_true")
    hw.set_defaults(func=_cmd_hardware)
