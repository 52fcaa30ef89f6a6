"""How ``solve`` answers in text: the answer first, as a sentence with its units, then what
it held fixed, notes, and the Scaling Book's closed form beside the full model's answer.
``--json`` keeps every field; these are the lines a reader sees."""

from __future__ import annotations

from typing import Any

from costmodel.units import fmt_bytes

Rows = list[tuple[str, str]]


def min_fsdp_rows(result: dict[str, Any]) -> Rows:
    """``solve min-fsdp``: the answer (the full model's, or for the state alone the book's),
    what it assumed, and the book's closed form with its parts."""
    answer, full = result["answer"], result.get("full_model")
    rows: Rows = [("answer", _min_fsdp_answer(answer, full, result["book"])
                   + _tight(result, "fsdp", full or {}))]  # fmt: skip
    rows.append(("assumed", answer["assumed"]))
    rows.append(("book", _book(result["book"])))
    return rows


def _rounded(fsdp: int, usable: int | None, exact: float | None = None) -> str:
    """The degree, with the exact root and the power of two at or above it where given."""
    said = [] if exact is None else [f"{exact:,.2f} exact"]
    if usable is not None and usable != fsdp:
        said.append(f"{usable:,} as a power of two, a degree nodes divide")
    return f"fsdp {fsdp:,}" + (f" ({'; '.join(said)})" if said else "")


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def _min_fsdp_answer(answer: dict, full: dict | None, result: dict) -> str:
    if answer["fsdp"] is None:
        why = answer.get("why") or result.get("why", "")
        return why if why.startswith("no fsdp") else f"none fits: {why}"
    degree = _rounded(answer["fsdp"], answer["fsdp_usable"])
    if full is None:
        return (f"{degree}: the smallest degree whose per-device bytes by the Scaling "
                f"Book's closed form, {_gib(result['per_device_bytes'])}, fit the "
                f"{fmt_bytes(result['budget_bytes'])} budget")  # fmt: skip
    micro = full["micro_batch_per_device"]
    return (f"{degree}: the smallest degree whose per-device peak, "
            f"{_gib(full['per_device_bytes'])} (reserved {_gib(full['reserved_bytes'])}), "
            f"fits the {fmt_bytes(full['budget_bytes'])} budget; each device keeps {micro} "
            f"sequence{'s' * (micro != 1)} per micro-batch")  # fmt: skip


def _book(result: dict) -> str:
    """The Scaling Book's answer in one line: its degree and what it adds up."""
    label = result["approximation"]
    if result.get("fsdp") is None:
        return f"{label}: {result.get('why', 'no answer')}"
    degree = _rounded(result["fsdp"], result["fsdp_power_of_two"], result["fsdp_exact"])
    shared = result.get("sharded_activation_fraction")
    share = "" if shared is None else f", {shared:.0%} of them sharded"
    return (f"{degree} by the {label}: {_gib(result['state_bytes'])} of training state "
            f"over fsdp + {_gib(result['activation_bytes'])} of activations{share} = "
            f"{_gib(result['per_device_bytes'])} per device")  # fmt: skip


def max_rows(result: dict[str, Any], field: str) -> Rows:
    """``solve max-batch`` / ``max-seq``: the answer with its budget, or why none fits;
    what it held fixed; where the search stopped or the model's positions end."""
    value = result[field]
    budget = fmt_bytes(result["budget_bytes"])
    if value is None:
        rows: Rows = [("answer", f"none fits {budget} per device: {result['reason']}")]
    elif result.get("bound"):  # the search's bound, not the budget, set it
        rows = [("answer", f"{field} {value:,}: {result['bound']}, whose per-device peak "
                           f"fits {budget} (more may fit)")]  # fmt: skip
    else:
        one_step = ""
        if field == "batch":  # a batch per step of micro-batches: accumulation adds more
            one_step = (
                " at the grad-accum assumed below (each more accumulation step "
                "holds as many sequences again at the same peak)"
            )
        rows = [("answer", f"{field} {value:,}: the largest whose per-device peak fits "
                           f"{budget}{one_step}")]  # fmt: skip
    rows[0] = ("answer", rows[0][1] + _tight(result, field, result))
    rows.append(("assumed", result["assumed"]))
    rows += [("note", result[k]) for k in ("limited_by", "note") if result.get(k)]
    return rows


def _tight(result: dict[str, Any], field: str, found: dict[str, Any]) -> str:
    """The verdict's TIGHT said on the answer's own line: the answer fits its budget, but
    the caching allocator's reserve would be over the device's memory; then the ``field``
    the device does hold (``found[field + "_untight"]``, ``engine.inverse``)."""
    memory = result.get("verdict", {}).get("memory", {})
    if not memory.get("tight"):  # the fit rule's own flag (engine.fit.Fit.tight)
        return ""
    safe = found.get(f"{field}_untight")
    held = (f"; the {'smallest' if field == 'fsdp' else 'largest'} whose reserve the device "
            f"holds: {field} {safe:,}" if safe is not None else
            "; none whose reserve the device holds")  # fmt: skip
    return (
        f"; but TIGHT: reserved {_gib(memory['reserved_bytes'])} is over the device's "
        f"{_gib(memory['capacity_bytes'])} (the verdict below says what that risks){held}"
    )


def bounds_rows(report: dict[str, Any], hardware: str) -> Rows:
    """``bounds``: the critical batch and its regime first, then the layout and the device
    numbers the book uses, the times at B*, and the book's conditions, each with its unit."""
    b_star = report["critical_batch_tokens"]
    said = ("none" if b_star is None else
            f"{b_star:,.0f} tokens a step ({report['critical_batch_tokens_per_device']:,.0f} "
            "per device)")  # fmt: skip
    step = "forward only" if report["forward_only"] else "a full step (forward and backward)"
    times = report["time_s_at_critical_batch"]
    cond = report["conditions"]
    mesh = (f", mesh mx {report['mx']} x my {report['my']}"
            if report["mx"] * report["my"] > 1 else "")  # fmt: skip
    rows = [
        ("answer", f"critical batch B* = {said}: {report['regime']}" if b_star != 0
                   else f"no critical batch: {report['regime']}"),
        ("by", report["approximation"]),
        ("layout", f"{report['model']} on {hardware}: fsdp {report['fsdp']} x tp {report['tp']}"
                   f"{mesh}, overlap {report['overlap']}, {step}"),
        ("device", f"{report['peak_flops'] / 1e12:,.4g} TFLOP/s; fsdp over {report['link']} at "
                   f"{report['bandwidth'] / 1e9:,.4g} GB/s, tp over {report['tp_link']} at "
                   f"{report['tp_bandwidth'] / 1e9:,.4g} GB/s; C/W = "
                   f"{report['ici_intensity']:,.0f} FLOPs per byte"),
    ]  # fmt: skip
    if b_star:
        rows.append(("at B*", f"math {times['math']:.4g} s, fsdp {times['fsdp']:.4g} s, tp "
                              f"{times['tp']:.4g} s: step {times['step']:.4g} s"))  # fmt: skip
    per_rank, tp = cond["fsdp_min_batch_per_device"], report["tp"]
    # the book's B/X: tokens per fsdp rank, each a tp group of tp devices
    where = (f"per fsdp rank (a tp group of {tp}: {per_rank / tp:,.0f} per device)" if tp > 1
             else "per device")  # fmt: skip
    said_cond = (f"fsdp is compute-bound from {per_rank:,.0f} tokens {where}; tp up to "
                 f"degree {cond['tp_max_degree']:,.1f}")  # fmt: skip
    if report["fsdp"] > 1 and report["tp"] > 1 and "mixed_optimal_fsdp" in cond:
        said_cond += (f"; the book's mixed condition (a forward pass, at this layout's two "
                      f"links) puts the best split of these {report['fsdp'] * report['tp']:,} "
                      f"devices at {cond['mixed_min_batch_per_device']:,.0f} tokens per device "
                      f"(fsdp {cond['mixed_optimal_fsdp']:,.1f}): other splits place their "
                      "groups on other links, and a full step adds less tp traffic, so a "
                      "split's own B* (bounds --fsdp X --tp Y) can be lower")  # fmt: skip
    return [*rows, ("conditions", said_cond)]
